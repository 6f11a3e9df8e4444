/* test_chunker.c - slicing of large entries and coalescing of small ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "core/chunker.h"

static ferry_chunk chunk;

static ferry_entry entry(ferry_op op, uintptr_t local, uint64_t remote, size_t len) {
  ferry_entry e = {op, (void *)local, remote, len};
  return e;
}

static void large_entry_is_sliced(void **state) {
  ferry_entry e = entry(FERRY_OP_WRITE, 0x10000, 0x900000, 10u << 20);
  ferry_chunker c;
  ferry_chunker_init(&c, &e, 1);
  uint64_t seen = 0;
  int chunks = 0;
  while (ferry_chunker_next(&c, 1 << 20, &chunk)) {
    assert_int_equal(chunk.count, 1);
    assert_int_equal(chunk.bytes, 1 << 20);
    assert_ptr_equal(chunk.local[0].iov_base, (char *)(uintptr_t)0x10000 + seen);
    assert_int_equal(chunk.remote[0].addr, 0x900000 + seen);
    seen += chunk.bytes;
    chunks++;
  }
  assert_int_equal(chunks, 10);
  assert_int_equal(seen, 10u << 20);
  assert_true(ferry_chunker_done(&c));
}

static void small_entries_are_coalesced(void **state) {
  enum { N = 100000 };
  ferry_entry *entries = malloc(N * sizeof *entries);
  for (size_t i = 0; i < N; i++)
    entries[i] = entry(FERRY_OP_WRITE, 0x1000 + i * 4096, 0x800000 + i * 2048 * 3, 2048);
  ferry_chunker c;
  ferry_chunker_init(&c, entries, N);
  size_t segments = 0, frames = 0;
  while (ferry_chunker_next(&c, 1 << 20, &chunk)) {
    assert_true(chunk.count <= FERRY_CHUNK_MAX_SEGMENTS);
    assert_true(chunk.bytes <= 1 << 20);
    for (uint32_t i = 0; i < chunk.count; i++) {
      assert_int_equal(chunk.remote[i].addr, entries[segments + i].remote);
      assert_int_equal(chunk.local[i].iov_len, 2048);
    }
    segments += chunk.count;
    frames++;
  }
  assert_int_equal(segments, N);
  /* 512 entries of 2 KiB fill a 1 MiB frame: ~196 frames, not 100,000. */
  assert_int_equal(frames, (N + 511) / 512);
  free(entries);
}

static void segment_limit_caps_a_frame(void **state) {
  enum { N = 3000 };
  ferry_entry *entries = malloc(N * sizeof *entries);
  for (size_t i = 0; i < N; i++)
    entries[i] = entry(FERRY_OP_READ, 0x1000 + i * 64, 0x2000 + i * 64, 1);
  ferry_chunker c;
  ferry_chunker_init(&c, entries, N);
  assert_true(ferry_chunker_next(&c, 1 << 20, &chunk));
  assert_int_equal(chunk.count, FERRY_CHUNK_MAX_SEGMENTS);
  assert_int_equal(chunk.op, FERRY_OP_READ);
  free(entries);
}

static void ops_never_mix_in_a_frame(void **state) {
  ferry_entry e[4] = {
      entry(FERRY_OP_WRITE, 0x1000, 0x9000, 10), entry(FERRY_OP_WRITE, 0x2000, 0xa000, 10),
      entry(FERRY_OP_READ, 0x3000, 0xb000, 10), entry(FERRY_OP_WRITE, 0x4000, 0xc000, 10)};
  ferry_chunker c;
  ferry_chunker_init(&c, e, 4);
  assert_true(ferry_chunker_next(&c, 1 << 20, &chunk));
  assert_int_equal(chunk.count, 2);
  assert_int_equal(chunk.op, FERRY_OP_WRITE);
  assert_true(ferry_chunker_next(&c, 1 << 20, &chunk));
  assert_int_equal(chunk.count, 1);
  assert_int_equal(chunk.op, FERRY_OP_READ);
  assert_true(ferry_chunker_next(&c, 1 << 20, &chunk));
  assert_int_equal(chunk.op, FERRY_OP_WRITE);
  assert_false(ferry_chunker_next(&c, 1 << 20, &chunk));
}

static void slice_boundary_splits_an_entry_mid_frame(void **state) {
  ferry_entry e[2] = {entry(FERRY_OP_WRITE, 0x1000, 0x9000, 600),
                      entry(FERRY_OP_WRITE, 0x5000, 0xf000, 600)};
  ferry_chunker c;
  ferry_chunker_init(&c, e, 2);
  assert_true(ferry_chunker_next(&c, 1000, &chunk));
  assert_int_equal(chunk.count, 2);
  assert_int_equal(chunk.bytes, 1000);
  assert_int_equal(chunk.remote[1].length, 400);
  assert_true(ferry_chunker_next(&c, 1000, &chunk));
  assert_int_equal(chunk.count, 1);
  assert_int_equal(chunk.remote[0].addr, 0xf000 + 400);
  assert_int_equal(chunk.bytes, 200);
  assert_false(ferry_chunker_next(&c, 1000, &chunk));
}

static void stop_hands_out_nothing_more(void **state) {
  ferry_entry e = entry(FERRY_OP_WRITE, 0x1000, 0x9000, 1 << 20);
  ferry_chunker c;
  ferry_chunker_init(&c, &e, 1);
  assert_true(ferry_chunker_next(&c, 4096, &chunk));
  ferry_chunker_stop(&c);
  assert_false(ferry_chunker_next(&c, 4096, &chunk));
  assert_true(ferry_chunker_done(&c));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(large_entry_is_sliced),
      cmocka_unit_test(small_entries_are_coalesced),
      cmocka_unit_test(segment_limit_caps_a_frame),
      cmocka_unit_test(ops_never_mix_in_a_frame),
      cmocka_unit_test(slice_boundary_splits_an_entry_mid_frame),
      cmocka_unit_test(stop_hands_out_nothing_more),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
