/* test_store_clear.c - the master's CLEAR (Mooncake's batch_replica_clear,
 * store/protocol.h): all of a key's replicas, or one segment's, given back
 * once no lease holds them, with the offload copy that segment's client
 * keeps; an object with nothing left goes, one with its --root_fs_dir file
 * stays. Each case reads where the object is after (REPLICAS) and how much
 * of the segments is allocated. The map is driven as the master's
 * connections drive it, without a network. */
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

#define SIZE 4096
#define SEGMENT_BYTES (1ull << 20)

/* Client c (1, 2) mounts segment "a" or "b". */
static void mount(store_map *m, uint64_t c) {
  store_writer w, reply;
  test_store_register(&w, c << 40, SEGMENT_BYTES, c == 1 ? "a" : "b", c);
  test_store_serve(m, c, &w, 0, &reply);
  store_writer_free(&reply);
}

/* Client 1's offload round for segment "a": its tasks' kinds. */
static void poll_a(store_map *m, char *kinds, size_t cap) {
  test_store_offload_round(m, 1, "a", 1, 16, kinds, cap);
}

/* Commits key with replicas in "a" then "b" (replicas: 1 or 2), its file
 * written when file. */
static void put(store_map *m, const char *key, uint8_t replicas, int file) {
  store_writer w, reply;
  test_store_put_start(&w, replicas, "a");
  store_put_str(&w, key, strlen(key));
  store_put_u64(&w, SIZE);
  store_reader r = test_store_serve(m, 3, &w, 1, &reply);
  assert_int_equal((int32_t)store_get_u32(&r), FERRY_OK);
  store_writer_free(&reply);
  w = (store_writer){0};
  store_put_u8(&w, STORE_PUT_END);
  store_put_str(&w, key, strlen(key));
  store_put_u32(&w, 0);
  store_put_u8(&w, (uint8_t)file);
  test_store_serve(m, 3, &w, 1, &reply);
  store_writer_free(&reply);
}

/* One CLEAR entry's status. */
static ferry_status clear(store_map *m, const char *segment, const char *key) {
  store_writer w = {0}, reply;
  store_put_u8(&w, STORE_CLEAR);
  store_put_str(&w, segment, strlen(segment));
  store_put_str(&w, key, strlen(key));
  store_reader r = test_store_serve(m, 3, &w, 1, &reply);
  ferry_status st = (ferry_status)(int32_t)store_get_u32(&r);
  assert_false(r.bad || r.left);
  store_writer_free(&reply);
  return st;
}

/* Where key is, as REPLICAS says: "Ma Mb D La" (memory in a and b, its
 * --root_fs_dir file, the offload copy a's client keeps); "-" when absent. */
static const char *places(store_map *m, const char *key) {
  static char out[64];
  store_writer w = {0}, reply;
  store_put_u8(&w, STORE_REPLICAS);
  store_put_str(&w, key, strlen(key));
  store_reader r = test_store_serve(m, 3, &w, 1, &reply);
  ferry_status st = (ferry_status)(int32_t)store_get_u32(&r);
  store_get_u64(&r);
  uint8_t n = store_get_u8(&r);
  size_t at = 0;
  out[0] = '\0';
  for (uint8_t i = 0; i < n; i++) {
    uint8_t kind = store_get_u8(&r);
    const char *where;
    size_t len;
    store_get_str(&r, &where, &len, STORE_LOCATION_MAX);
    store_get_u64(&r);
    at += (size_t)snprintf(out + at, sizeof out - at, "%s%s%.*s", at ? " " : "",
                           kind == FERRY_STORE_REPLICA_MEMORY ? "M"
                           : kind == FERRY_STORE_REPLICA_DISK ? "D"
                                                              : "L",
                           kind == FERRY_STORE_REPLICA_DISK ? 0 : (int)len, where);
  }
  assert_false(r.bad || r.left);
  store_writer_free(&reply);
  return st == FERRY_ENOTFOUND ? "-" : out;
}

static uint64_t allocated(store_map *m) {
  store_map_stats stats;
  store_map_stats_get(m, &stats);
  return stats.allocated_bytes;
}

static store_map *map_new(uint64_t lease_ms) {
  store_eviction eviction = {0.95, 0.05, 1000, 60000, 0};
  store_map *m = store_map_create(lease_ms, 30000, &eviction);
  assert_non_null(m);
  mount(m, 1);
  mount(m, 2);
  return m;
}

static void one_segment_or_all(void **state) {
  (void)state;
  store_map *m = map_new(0);
  put(m, "two", 2, 0);
  put(m, "one", 1, 0);
  assert_int_equal(allocated(m), 3 * SIZE);
  assert_string_equal(places(m, "two"), "Ma Mb");
  assert_int_equal(clear(m, "a", "two"), FERRY_OK);
  assert_string_equal(places(m, "two"), "Mb");
  assert_int_equal(allocated(m), 2 * SIZE);
  assert_int_equal(clear(m, "a", "two"), FERRY_ENOTFOUND); /* nothing there now */
  assert_int_equal(clear(m, "c", "one"), FERRY_ENOTFOUND); /* no such segment */
  assert_int_equal(clear(m, "b", "two"), FERRY_OK);        /* its last replica: it goes */
  assert_string_equal(places(m, "two"), "-");
  assert_int_equal(clear(m, "", "one"), FERRY_OK); /* all of them */
  assert_string_equal(places(m, "one"), "-");
  assert_int_equal(clear(m, "", "one"), FERRY_ENOTFOUND);
  assert_int_equal(allocated(m), 0);
  store_map_destroy(m);
}

/* A get's lease keeps both forms off, whatever is asked. */
static void a_lease_holds_the_replicas(void **state) {
  (void)state;
  store_map *m = map_new(60000);
  put(m, "k", 2, 0);
  store_writer w = {0}, reply;
  store_put_u8(&w, STORE_GET);
  store_put_str(&w, "k", 1);
  test_store_serve(m, 3, &w, 1, &reply);
  store_writer_free(&reply);
  assert_int_equal(clear(m, "a", "k"), FERRY_EBUSY);
  assert_int_equal(clear(m, "", "k"), FERRY_EBUSY);
  assert_string_equal(places(m, "k"), "Ma Mb");
  assert_int_equal(allocated(m), 2 * SIZE);
  store_map_destroy(m);
}

/* With --root_fs_dir the file outlives the last replica. */
static void the_file_stays(void **state) {
  (void)state;
  store_map *m = map_new(0);
  assert_int_equal(store_map_set_disk(m, "/nonexistent-ferry-test-dir"), 0);
  put(m, "f", 1, 1);
  assert_int_equal(clear(m, "a", "f"), FERRY_OK);
  assert_string_equal(places(m, "f"), "D");
  assert_int_equal(allocated(m), 0);
  assert_int_equal(clear(m, "a", "f"), FERRY_ENOTFOUND);
  assert_int_equal(clear(m, "", "f"), FERRY_OK);
  assert_string_equal(places(m, "f"), "-");
  store_map_destroy(m);
}

/* a's client keeps the offload copies: clearing a takes the copy along (a
 * DELETE for its client), clearing b leaves it; with a copy queued but not
 * written the object is busy. */
static void the_offload_copy_goes_with_its_segment(void **state) {
  (void)state;
  store_map *m = map_new(0);
  store_offload_config offload = {0};
  store_map_set_offload(m, &offload);
  char kinds[32];
  poll_a(m, kinds, sizeof kinds);
  put(m, "x", 2, 0);
  put(m, "y", 2, 0);
  assert_int_equal(clear(m, "b", "x"), FERRY_EBUSY); /* its offload is queued */
  poll_a(m, kinds, sizeof kinds);
  assert_string_equal(kinds, "OO");
  assert_string_equal(places(m, "x"), "Ma Mb La");
  assert_int_equal(clear(m, "b", "x"), FERRY_OK);
  assert_string_equal(places(m, "x"), "Ma La");
  assert_int_equal(clear(m, "a", "y"), FERRY_OK);
  assert_string_equal(places(m, "y"), "Mb");
  poll_a(m, kinds, sizeof kinds);
  assert_string_equal(kinds, "D");
  assert_int_equal(clear(m, "a", "x"), FERRY_OK); /* its last replica and the copy: it goes */
  assert_string_equal(places(m, "x"), "-");
  poll_a(m, kinds, sizeof kinds);
  assert_string_equal(kinds, "D");
  store_map_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_segment_or_all),
      cmocka_unit_test(a_lease_holds_the_replicas),
      cmocka_unit_test(the_file_stays),
      cmocka_unit_test(the_offload_copy_goes_with_its_segment),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
