/* test_store_preferred.c - where a PUT_START's preferred segments put its
 * replicas (Mooncake's preferred_segments, store/protocol.h): in order, one
 * replica in each that has room, a name no segment has passed over, one
 * named twice used once, the rest in the roomiest. The map is driven as the
 * master's connections drive it, without a network. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "store/map.h"
#include "store/protocol.h"
#include "store_serve.h"

#define SIZE (40 * 1024)

/* Segments "a" (1 MiB), "b" (2 MiB, the roomiest) and "c" (64 KiB: one
 * value of SIZE fills it). */
static store_map *map_new(void) {
  store_eviction eviction = {0.95, 0.05, 1000, 60000, 0};
  store_map *m = store_map_create(1000, 30000, &eviction);
  assert_non_null(m);
  static const char *names[] = {"a", "b", "c"};
  static const uint64_t sizes[] = {1 << 20, 2 << 20, 64 << 10};
  for (uint64_t c = 0; c < 3; c++) {
    store_writer w, reply;
    test_store_register(&w, (c + 1) << 40, sizes[c], names[c], c + 1);
    test_store_serve(m, c + 1, &w, 0, &reply);
    store_writer_free(&reply);
  }
  return m;
}

/* A PUT_START of key (replicas, the preferred names): where its replicas
 * went, as the segments' names in order ("ab"). */
static const char *put(store_map *m, const char *key, uint8_t replicas, const char *const *pref,
                       uint8_t n) {
  static char out[16];
  store_writer w = {0}, reply;
  store_put_u8(&w, STORE_PUT_START);
  store_put_u8(&w, replicas);
  store_put_u8(&w, n);
  for (uint8_t i = 0; i < n; i++)
    store_put_str(&w, pref[i], strlen(pref[i]));
  store_put_u8(&w, FERRY_STORE_PIN_NONE);
  store_put_u8(&w, FERRY_STORE_SOFT_PIN_PRESERVE);
  store_put_u8(&w, 0);
  store_put_u64(&w, 0);
  store_put_str(&w, key, strlen(key));
  store_put_u64(&w, SIZE);
  store_reader r = test_store_serve(m, 9, &w, 1, &reply);
  assert_int_equal((int32_t)store_get_u32(&r), FERRY_OK);
  store_replica_ref refs[STORE_REPLICAS_MAX];
  unsigned count;
  assert_int_equal(store_get_replicas(&r, refs, &count, "map"), FERRY_OK);
  for (unsigned i = 0; i < count; i++)
    out[i] = refs[i].segment[0];
  out[count] = '\0';
  store_writer_free(&reply);
  return out;
}

static void preferred_segments_in_order(void **state) {
  (void)state;
  store_map *m = map_new();
  const char *ca[] = {"c", "a"}, *twice[] = {"a", "a"}, *unknown[] = {"zz", "a"};
  const char *none[] = {""};
  assert_string_equal(put(m, "k1", 2, ca, 2), "ca");      /* not the roomiest, b */
  assert_string_equal(put(m, "k2", 2, twice, 2), "ab");   /* a once, then the roomiest */
  assert_string_equal(put(m, "k3", 2, unknown, 2), "ab"); /* zz passed over */
  assert_string_equal(put(m, "k4", 1, ca, 2), "a");       /* c is full: the next */
  assert_string_equal(put(m, "k5", 1, none, 1), "b");     /* no name: the roomiest */
  store_map_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(preferred_segments_in_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
