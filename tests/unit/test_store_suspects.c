/* test_store_suspects.c - the segments a store client's reads failed to
 * reach (store/suspects.h): which failures make a suspect, the replica
 * order they give (suspects last, each group in its order), a success
 * clearing one, and a full table forgetting the suspect that expires
 * first. How a get uses them, against a stopped holder, is
 * tests/integration/test_store.c's a_get_moves_to_the_next_replica. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "store/suspects.h"

static void note(store_suspects *t, const char *segment, ferry_status st) {
  store_suspects_note(t, segment, strlen(segment), st, "the test's failure");
}

static int has(store_suspects *t, const char *segment) {
  return store_suspects_has(t, segment, strlen(segment));
}

static store_replica_ref ref(const char *segment, uint64_t addr) {
  return (store_replica_ref){segment, strlen(segment), addr};
}

static void only_unreachable_holders_become_suspects(void **state) {
  (void)state;
  store_suspects t;
  store_suspects_init(&t);
  note(&t, "h:1", FERRY_ENOTREG); /* the holder answered: its memory is gone */
  note(&t, "h:2", FERRY_EREMOTE);
  note(&t, "h:3", FERRY_OK);
  assert_false(has(&t, "h:1") || has(&t, "h:2") || has(&t, "h:3"));
  assert_int_equal(t.count, 0);
  ferry_status unreachable[] = {FERRY_ESOCKET, FERRY_ETIMEDOUT, FERRY_EHANDSHAKE, FERRY_EDNS};
  for (size_t i = 0; i < sizeof unreachable / sizeof *unreachable; i++) {
    char name[16];
    snprintf(name, sizeof name, "u:%zu", i);
    note(&t, name, unreachable[i]);
    assert_true(has(&t, name));
  }
  assert_false(has(&t, "u:")); /* a prefix is another segment */
  note(&t, "u:1", FERRY_OK);
  assert_false(has(&t, "u:1"));
  assert_true(has(&t, "u:0") && has(&t, "u:2"));
  store_suspects_destroy(&t);
}

static void suspects_go_last_in_their_order(void **state) {
  (void)state;
  store_suspects t;
  store_suspects_init(&t);
  store_replica_ref reps[] = {ref("a", 1), ref("b", 2), ref("c", 3), ref("d", 4), ref("e", 5)};
  assert_int_equal(store_suspects_order(&t, reps, 5), 0); /* no suspects: untouched */
  note(&t, "a", FERRY_ETIMEDOUT);
  note(&t, "c", FERRY_ESOCKET);
  assert_int_equal(store_suspects_order(&t, reps, 5), 2);
  uint64_t order[] = {2, 4, 5, 1, 3};
  for (int i = 0; i < 5; i++)
    assert_int_equal(reps[i].addr, order[i]);
  store_replica_ref all[] = {ref("c", 7), ref("a", 8)};
  assert_int_equal(store_suspects_order(&t, all, 2), 2); /* every one suspect: as it was */
  assert_int_equal(all[0].addr, 7);
  assert_int_equal(all[1].addr, 8);
  store_suspects_destroy(&t);
}

static void a_full_table_forgets_the_first_to_expire(void **state) {
  (void)state;
  store_suspects t;
  store_suspects_init(&t);
  char name[STORE_SUSPECTS_MAX + 1][16];
  for (int i = 0; i <= STORE_SUSPECTS_MAX; i++) {
    snprintf(name[i], sizeof name[i], "s:%d", i);
    note(&t, name[i], FERRY_ESOCKET);
  }
  assert_int_equal(t.count, STORE_SUSPECTS_MAX);
  assert_false(has(&t, name[0]));
  for (int i = 1; i <= STORE_SUSPECTS_MAX; i++)
    assert_true(has(&t, name[i]));
  store_suspects_destroy(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(only_unreachable_holders_become_suspects),
      cmocka_unit_test(suspects_go_last_in_their_order),
      cmocka_unit_test(a_full_table_forgets_the_first_to_expire),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
