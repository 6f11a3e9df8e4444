/* test_store_replicas.c - the master's REPLICAS answer (store/map.h) at its
 * largest: a frame's 4096 keys of the longest length, each with 8 memory
 * replicas in segments of the longest names, its file in a --root_fs_dir
 * of the longest path and its owner's offload copy. The reply must fit a
 * frame and list every place, and a request of more keys than a frame
 * holds is refused. The map is driven as the master's connections drive
 * it, without a network. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "store/disk.h"
#include "store/map.h"
#include "store/protocol.h"
#include "store_serve.h"

#define SEGMENTS STORE_REPLICAS_MAX
#define KEYS STORE_BATCH_MAX
#define SEGMENT_BYTES (1ull << 30)

static char names[SEGMENTS][STORE_NAME_MAX + 1];
static char dir[STORE_DIR_MAX];

static void key_at(char key[STORE_KEY_MAX + 1], unsigned i) {
  memset(key, 'k', STORE_KEY_MAX);
  key[STORE_KEY_MAX] = '\0';
  snprintf(key, 16, "%08u", i);
  key[8] = 'k'; /* snprintf's NUL: the key stays STORE_KEY_MAX bytes */
}

static void keyed(store_writer *w, uint8_t op) {
  *w = (store_writer){0};
  store_put_u8(w, op);
}

static void put_keys(store_map *m) {
  store_writer w, reply;
  test_store_put_start(&w, SEGMENTS, "");
  char key[STORE_KEY_MAX + 1];
  for (unsigned i = 0; i < KEYS; i++) {
    key_at(key, i);
    store_put_str(&w, key, STORE_KEY_MAX);
    store_put_u64(&w, 1);
  }
  store_reader r = test_store_serve(m, 1, &w, KEYS, &reply);
  for (unsigned i = 0; i < KEYS; i++) {
    assert_int_equal((int32_t)store_get_u32(&r), FERRY_OK);
    store_replica_ref refs[STORE_REPLICAS_MAX];
    unsigned n;
    assert_int_equal(store_get_replicas(&r, refs, &n, "map"), FERRY_OK);
    assert_int_equal(n, SEGMENTS);
  }
  store_writer_free(&reply);
  keyed(&w, STORE_PUT_END);
  for (unsigned i = 0; i < KEYS; i++) {
    key_at(key, i);
    store_put_str(&w, key, STORE_KEY_MAX);
    store_put_u32(&w, 0);
    store_put_u8(&w, 1); /* its --root_fs_dir file written */
  }
  test_store_serve(m, 1, &w, KEYS, &reply);
  store_writer_free(&reply);
}

/* The owner of segment 0 polls, is given every key's offload, and says
 * each file is written. */
static void offload_keys(store_map *m) {
  char *kinds = malloc(KEYS + 1);
  assert_int_equal(test_store_offload_round(m, 1, names[0], 1, KEYS, kinds, KEYS + 1), KEYS);
  assert_int_equal(strspn(kinds, "O"), KEYS);
  free(kinds);
}

static void a_whole_frame_of_keys_at_every_place_fits_a_frame(void **state) {
  (void)state;
  store_eviction eviction = {0.95, 0.05, 1000, 60000, 0};
  store_map *m = store_map_create(1000, 30000, &eviction);
  assert_non_null(m);
  memset(dir, 'd', sizeof dir - 1);
  dir[0] = '/';
  assert_int_equal(store_map_set_disk(m, dir), 0);
  store_offload_config offload = {0};
  store_map_set_offload(m, &offload);
  for (unsigned c = 0; c < SEGMENTS; c++) {
    memset(names[c], 'a' + (int)c, STORE_NAME_MAX);
    store_writer w, reply;
    test_store_register(&w, (c + 1ull) << 40, SEGMENT_BYTES, names[c], c + 1);
    test_store_serve(m, c + 1, &w, 0, &reply);
    store_writer_free(&reply);
  }
  /* Segment 0's client offloads: each commit queues a copy for it. */
  store_writer w, reply;
  keyed(&w, STORE_OFFLOAD_POLL);
  store_put_str(&w, names[0], STORE_NAME_MAX);
  store_put_u64(&w, 1);
  store_put_u32(&w, 0);
  store_put_u32(&w, 0);
  test_store_serve(m, 1, &w, 0, &reply);
  store_writer_free(&reply);
  put_keys(m);
  offload_keys(m);

  keyed(&w, STORE_REPLICAS);
  char key[STORE_KEY_MAX + 1], path[STORE_DISK_PATH_MAX];
  for (unsigned i = 0; i < KEYS; i++) {
    key_at(key, i);
    store_put_str(&w, key, STORE_KEY_MAX);
  }
  store_reader r = test_store_serve(m, 1, &w, KEYS, &reply);
  size_t path_len = strlen(dir) + 1 + 32 + 3; /* DIR/<32 hex>.kv */
  size_t place = 1 + 2 + 8, entry = 4 + 8 + 1 + SEGMENTS * (place + STORE_NAME_MAX) +
                                    (place + path_len) + (place + STORE_NAME_MAX);
  assert_int_equal(reply.len, KEYS * entry);
  assert_true(reply.len <= FERRY_WIRE_MAX_CONTROL_BODY);
  for (unsigned i = 0; i < KEYS; i++) {
    assert_int_equal((int32_t)store_get_u32(&r), FERRY_OK);
    assert_int_equal(store_get_u64(&r), 1);
    assert_int_equal(store_get_u8(&r), SEGMENTS + 2);
    unsigned seen = 0;
    for (unsigned j = 0; j < SEGMENTS + 2; j++) {
      uint8_t kind = store_get_u8(&r);
      const char *at;
      size_t len;
      store_get_str(&r, &at, &len, STORE_LOCATION_MAX);
      uint64_t addr = store_get_u64(&r);
      assert_false(r.bad);
      if (j < SEGMENTS) {
        assert_int_equal(kind, FERRY_STORE_REPLICA_MEMORY);
        assert_int_equal(len, STORE_NAME_MAX);
        unsigned c = (unsigned)(at[0] - 'a');
        assert_true(c < SEGMENTS && !(seen & 1u << c));
        seen |= 1u << c;
        assert_true(addr >= (c + 1ull) << 40 && addr < ((c + 1ull) << 40) + SEGMENT_BYTES);
      } else if (j == SEGMENTS) {
        key_at(key, i);
        assert_int_equal(store_disk_path(dir, key, STORE_KEY_MAX, path), 0);
        assert_int_equal(kind, FERRY_STORE_REPLICA_DISK);
        assert_int_equal(len, strlen(path));
        assert_memory_equal(at, path, len);
      } else {
        assert_int_equal(kind, FERRY_STORE_REPLICA_LOCAL_DISK);
        assert_int_equal(len, STORE_NAME_MAX);
        assert_memory_equal(at, names[0], len);
      }
    }
  }
  assert_false(r.bad || r.left);
  store_writer_free(&reply);

  /* One entry more than a frame holds: refused, nothing answered. */
  keyed(&w, STORE_REPLICAS);
  store_put_str(&w, "k", 1);
  store_reader req = {w.buf, w.len, 0};
  store_get_u8(&req);
  char why[FERRY_WIRE_MAX_REASON] = "";
  reply = (store_writer){0};
  assert_int_equal(store_map_serve(m, 1, STORE_REPLICAS, &req, KEYS + 1, &reply, why, sizeof why),
                   FERRY_EPROTO);
  assert_string_equal(why, "operation 13 with 4097 entries");
  assert_int_equal(reply.len, 0);
  store_writer_free(&w);
  store_writer_free(&reply);
  store_map_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_whole_frame_of_keys_at_every_place_fits_a_frame),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
