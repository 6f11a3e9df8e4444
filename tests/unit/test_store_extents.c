/* test_store_extents.c - taking an exact range out of a segment's free list
 * (store_extents_take: a new HA leader restores the replicas its journal
 * names), and giving it back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "store/extents.h"

#define G STORE_GRANULE

static void a_range_is_taken_from_the_middle_the_ends_or_whole(void **state) {
  (void)state;
  store_extents x;
  assert_int_equal(store_extents_init(&x, 100 * G), 0);
  assert_int_equal(store_extents_take(&x, 10 * G, 5 * G), 0); /* a hole: two extents */
  assert_int_equal(x.count, 2);
  assert_int_equal(x.free_bytes, 95 * G);
  assert_int_equal(store_extents_take(&x, 0, 10 * G), 0); /* the whole first one */
  assert_int_equal(x.count, 1);
  assert_int_equal(store_extents_take(&x, 15 * G, G - 1), 0); /* its start (rounded up) */
  assert_int_equal(store_extents_take(&x, 99 * G, G), 0);     /* its end */
  assert_int_equal(x.count, 1);
  assert_int_equal(x.free[0].offset, 16 * G);
  assert_int_equal(x.free[0].length, 83 * G);
  assert_int_equal(x.free_bytes, 83 * G);
  store_extents_destroy(&x);
}

static void a_range_not_wholly_free_is_refused(void **state) {
  (void)state;
  store_extents x;
  assert_int_equal(store_extents_init(&x, 100 * G), 0);
  assert_int_equal(store_extents_take(&x, 10 * G, 10 * G), 0);
  assert_int_equal(store_extents_take(&x, 10 * G, G), -1);      /* taken already */
  assert_int_equal(store_extents_take(&x, 5 * G, 10 * G), -1);  /* runs into the taken one */
  assert_int_equal(store_extents_take(&x, 95 * G, 10 * G), -1); /* past the end */
  assert_int_equal(store_extents_take(&x, 30 * G + 1, G), -1);  /* not on a granule */
  assert_int_equal(store_extents_take(&x, UINT64_MAX - G + 1, G), -1);
  assert_int_equal(x.free_bytes, 90 * G);
  /* Given back, it merges: one extent again, and an allocation can have it. */
  assert_int_equal(store_extents_free(&x, 10 * G, 10 * G), 100 * G);
  assert_int_equal(x.count, 1);
  store_extents_destroy(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_range_is_taken_from_the_middle_the_ends_or_whole),
      cmocka_unit_test(a_range_not_wholly_free_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
