/* test_slots.c - a receive pool's slot bookkeeping (core/slots.h) against
 * plain models: the treap's first fit and address lookup against a bitmap
 * of the pool through thousands of random carves and frees, its depth
 * staying logarithmic when slots come in address order; the coverage
 * spans against a byte map, with the bound on separate spans; the hash
 * through growth and removals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "pool/slots.h"

#define UNITS 4096 /* the model pool, in units of one byte */
#define MAX_SLOTS 1024

typedef struct model {
  ferry_extents x;
  ferry_extent *slots[MAX_SLOTS];
  size_t count;
  uint8_t used[UNITS];
} model;

static uint64_t model_fit(const model *m, uint64_t length) {
  for (uint64_t at = 0; at + length <= UNITS; at++) {
    uint64_t run = 0;
    while (run < length && !m->used[at + run])
      run++;
    if (run == length)
      return at;
    at += run;
  }
  return FERRY_NO_FIT;
}

static void model_mark(model *m, const ferry_extent *e, uint8_t v) {
  memset(m->used + e->offset, v, e->length);
}

static void carve_one(model *m, uint64_t length) {
  uint64_t at = ferry_extents_fit(&m->x, length);
  assert_int_equal(at, model_fit(m, length));
  if (at == FERRY_NO_FIT || m->count == MAX_SLOTS)
    return;
  ferry_extent *e = calloc(1, sizeof *e);
  e->offset = at;
  e->length = length;
  ferry_extents_insert(&m->x, e);
  model_mark(m, e, 1);
  m->slots[m->count++] = e;
}

static void free_one(model *m, size_t i) {
  ferry_extent *e = m->slots[i];
  ferry_extents_remove(&m->x, e);
  model_mark(m, e, 0);
  free(e);
  m->slots[i] = m->slots[--m->count];
}

static void check_lookups(const model *m) {
  for (uint64_t at = 0; at < UNITS; at += 7) {
    ferry_extent *e = ferry_extents_at(&m->x, at);
    assert_int_equal(e != NULL, m->used[at]);
    if (e)
      assert_true(e->offset <= at && at < e->offset + e->length);
  }
}

static void first_fit_matches_a_bitmap(void **state) {
  model *m = calloc(1, sizeof *m);
  ferry_extents_init(&m->x, UNITS, 42);
  srand(7);
  for (int step = 0; step < 20000; step++) {
    if (m->count && rand() % 100 < 45)
      free_one(m, (size_t)rand() % m->count);
    else
      carve_one(m, 1 + (uint64_t)(rand() % 64) * (rand() % 4 ? 1 : 8));
    if (step % 512 == 0)
      check_lookups(m);
  }
  while (m->count)
    free_one(m, m->count - 1);
  assert_null(m->x.root);
  assert_int_equal(ferry_extents_fit(&m->x, UNITS), 0);
  assert_int_equal(ferry_extents_fit(&m->x, UNITS + 1), FERRY_NO_FIT);
  free(m);
}

static unsigned depth(const ferry_extent *t) {
  if (!t)
    return 0;
  unsigned l = depth(t->left), r = depth(t->right);
  return 1 + (l > r ? l : r);
}

/* Slots carved in address order (what first fit does in an empty pool)
 * would make a plain search tree a list; the random priorities keep it
 * shallow, so a lookup among 100,000 slots takes a few dozen steps. */
static void depth_stays_logarithmic(void **state) {
  enum { N = 100000 };
  ferry_extents x;
  ferry_extents_init(&x, (uint64_t)N * 64, 99);
  ferry_extent *all = calloc(N, sizeof *all);
  for (size_t i = 0; i < N; i++) {
    all[i].length = 64;
    all[i].offset = ferry_extents_fit(&x, 64);
    assert_int_equal(all[i].offset, i * 64);
    ferry_extents_insert(&x, &all[i]);
  }
  assert_int_equal(ferry_extents_fit(&x, 64), FERRY_NO_FIT);
  assert_true(depth(x.root) < 60);
  ferry_extents_remove(&x, &all[N / 2]);
  assert_int_equal(ferry_extents_fit(&x, 64), (uint64_t)(N / 2) * 64);
  assert_int_equal(ferry_extents_fit(&x, 65), FERRY_NO_FIT);
  assert_true(ferry_extents_at(&x, (uint64_t)(N / 2) * 64) == NULL);
  assert_true(ferry_extents_at(&x, 64 * 7 + 3) == &all[7]);
  free(all);
}

static void coverage_matches_a_byte_map(void **state) {
  srand(11);
  for (int round = 0; round < 200; round++) {
    ferry_coverage c = {NULL, 0, 0};
    uint8_t map[512] = {0};
    for (int i = 0; i < 40; i++) {
      uint64_t from = (uint64_t)(rand() % 512), len = 1 + (uint64_t)(rand() % 48);
      uint64_t to = from + len > 512 ? 512 : from + len;
      assert_int_equal(ferry_coverage_add(&c, from, to, 1000), 0);
      memset(map + from, 1, to - from);
      for (uint32_t k = 1; k < c.count; k++) /* sorted, disjoint, not touching */
        assert_true(c.spans[k - 1].to < c.spans[k].from);
      uint64_t length = 1 + (uint64_t)(rand() % 512), end;
      uint64_t gap = ferry_coverage_gap(&c, length, &end), want = 0;
      while (want < length && map[want])
        want++;
      assert_int_equal(gap, want);
      uint64_t want_end = want;
      while (want_end < length && !map[want_end])
        want_end++;
      assert_int_equal(end, want < length ? want_end : length);
    }
    ferry_coverage_free(&c);
  }
}

/* Writes that leave more than `most` separate spans are refused; ones
 * that join spans always go in. */
static void coverage_bounds_its_spans(void **state) {
  ferry_coverage c = {NULL, 0, 0};
  for (uint64_t i = 0; i < 4; i++)
    assert_int_equal(ferry_coverage_add(&c, i * 10, i * 10 + 5, 4), 0);
  assert_int_equal(ferry_coverage_add(&c, 100, 101, 4), -1);
  assert_int_equal(c.count, 4);
  assert_int_equal(ferry_coverage_add(&c, 5, 10, 4), 0); /* joins two */
  assert_int_equal(c.count, 3);
  assert_int_equal(ferry_coverage_add(&c, 0, 40, 4), 0);
  assert_int_equal(c.count, 1);
  uint64_t end;
  assert_int_equal(ferry_coverage_gap(&c, 40, &end), 40);
  assert_int_equal(ferry_coverage_gap(&c, 41, &end), 40);
  assert_int_equal(end, 41);
  ferry_coverage_free(&c);
}

typedef struct keyed {
  ferry_hnode node;
  int alive;
} keyed;

static int cleared;

static void count_cleared(ferry_hnode *n) {
  (void)n;
  cleared++;
}

static void table_finds_what_it_holds(void **state) {
  enum { N = 5000 };
  ferry_table t = {NULL, 0, 0};
  keyed *k = calloc(N, sizeof *k);
  for (size_t i = 0; i < N; i++) {
    k[i].node.key = 0x1000 + i * 3; /* sequential-ish, as slot ids are */
    assert_int_equal(ferry_table_add(&t, &k[i].node), 0);
    k[i].alive = 1;
  }
  for (size_t i = 0; i < N; i += 2) {
    ferry_table_remove(&t, &k[i].node);
    k[i].alive = 0;
  }
  for (size_t i = 0; i < N; i++)
    assert_true(ferry_table_find(&t, k[i].node.key) == (k[i].alive ? &k[i].node : NULL));
  assert_null(ferry_table_find(&t, 7));
  assert_int_equal(t.count, N / 2);
  cleared = 0;
  ferry_table_clear(&t, count_cleared);
  assert_int_equal(cleared, N / 2);
  assert_null(ferry_table_find(&t, k[1].node.key));
  free(k);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(first_fit_matches_a_bitmap),  cmocka_unit_test(depth_stays_logarithmic),
      cmocka_unit_test(coverage_matches_a_byte_map), cmocka_unit_test(coverage_bounds_its_spans),
      cmocka_unit_test(table_finds_what_it_holds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
