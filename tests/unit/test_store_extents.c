/* test_store_extents.c - a segment's free space (store/extents.h): taking
 * an exact range out of it (store_extents_take: a new HA leader restores
 * the replicas its journal names) and giving it back, a free or take that
 * gets no memory for a new extent (malloc wrapped), and a randomized
 * differential run of allocations, frees and takes against two plain
 * models written here: the sorted array of free extents with a best-fit
 * scan that extents.c used to be (which offset, how long a merged extent,
 * how many extents), and a bitmap of the granules in use (no allocation
 * overlaps a live one; the free bytes and the maximal free runs the
 * extents must match). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "store/extents.h"

#define G STORE_GRANULE

/* The linker sends every malloc here (tests/CMakeLists.txt: --wrap=malloc);
 * failing_mallocs makes the next ones fail. */
void *__real_malloc(size_t size);
void *__wrap_malloc(size_t size);
static int failing_mallocs;

void *__wrap_malloc(size_t size) {
  if (failing_mallocs > 0) {
    failing_mallocs--;
    return NULL;
  }
  return __real_malloc(size);
}

/* The i-th free extent in offset order, through the API's walk. */
static store_extent nth(const store_extents *x, size_t i) {
  store_extent e = {0, 0};
  uint64_t from = 0;
  for (size_t k = 0; k <= i; k++) {
    assert_int_equal(store_extents_next(x, from, &e), 0);
    from = e.offset + e.length;
  }
  return e;
}

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
  store_extent e = nth(&x, 0);
  assert_int_equal(e.offset, 16 * G);
  assert_int_equal(e.length, 83 * G);
  assert_int_equal(store_extents_next(&x, 16 * G + 1, &e), -1);
  assert_int_equal(x.free_bytes, 83 * G);
  assert_int_equal(store_extents_largest(&x), 83 * G);
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

/* Without memory for a new extent, a free loses its space and a take of a
 * middle range is refused: neither hands anything out twice. */
static void without_memory_space_is_lost_never_given_twice(void **state) {
  (void)state;
  store_extents x;
  uint64_t a, b, c, d;
  assert_int_equal(store_extents_init(&x, 100 * G), 0);
  assert_int_equal(store_extents_alloc(&x, 10 * G, &a), 0);
  assert_int_equal(store_extents_alloc(&x, 10 * G, &b), 0);
  assert_int_equal(store_extents_alloc(&x, 10 * G, &c), 0);
  failing_mallocs = 1;
  assert_int_equal(store_extents_free(&x, b, 10 * G), 0); /* between two live ones: lost */
  assert_int_equal(failing_mallocs, 0);
  assert_int_equal(x.free_bytes, 70 * G);
  assert_int_equal(x.count, 1);
  assert_int_equal(store_extents_alloc(&x, 10 * G, &d), 0);
  assert_int_equal(d, 30 * G); /* not b */
  failing_mallocs = 1;
  assert_int_equal(store_extents_take(&x, 50 * G, G), -1); /* a hole in the middle */
  assert_int_equal(x.free_bytes, 60 * G);
  assert_int_equal(x.count, 1);
  assert_int_equal(store_extents_take(&x, 50 * G, G), 0); /* with memory: granted */
  assert_int_equal(x.count, 2);
  /* A free that merges needs no memory: d joins [40, 50) granules. */
  failing_mallocs = 1;
  assert_int_equal(store_extents_free(&x, d, 10 * G), 20 * G);
  assert_int_equal(failing_mallocs, 1);
  failing_mallocs = 0;
  store_extents_destroy(&x);
}

/* ---- the models ------------------------------------------------------------------------- */

#define SEGMENT                                                                                    \
  (64ull << 20) /* about 600 live objects of the sizes below: holes, and a full pool */
#define GRANULES (SEGMENT / G)
#define OPS 100000
#define MAX_LIVE 8192

/* The sorted-array free list with a best-fit scan, written plainly. */
typedef struct ref_list {
  store_extent e[GRANULES / 2 + 1];
  size_t n;
  uint64_t free_bytes;
} ref_list;

/* The granules in use, and what they imply. */
typedef struct usage {
  uint64_t bits[GRANULES / 64];
  size_t runs; /* maximal runs of free granules */
  uint64_t free_bytes;
} usage;

typedef struct model {
  ref_list ref;
  usage use;
  store_extent live[MAX_LIVE]; /* allocated or taken, as passed: freed in random order */
  size_t nlive;
  uint64_t rng;
} model;

static uint64_t rnd(model *m) { /* xorshift64: a fixed sequence per seed */
  m->rng ^= m->rng << 13;
  m->rng ^= m->rng >> 7;
  m->rng ^= m->rng << 17;
  return m->rng;
}

static void ref_remove(ref_list *r, size_t i) {
  memmove(&r->e[i], &r->e[i + 1], (r->n - i - 1) * sizeof r->e[0]);
  r->n--;
}

static void ref_insert(ref_list *r, size_t i, store_extent e) {
  memmove(&r->e[i + 1], &r->e[i], (r->n - i) * sizeof r->e[0]);
  r->e[i] = e;
  r->n++;
}

/* Carves [offset, offset + need) out of extent i, which holds it. */
static void ref_carve(ref_list *r, size_t i, uint64_t offset, uint64_t need) {
  store_extent e = r->e[i];
  ref_remove(r, i);
  if (offset + need < e.offset + e.length)
    ref_insert(r, i, (store_extent){offset + need, e.offset + e.length - offset - need});
  if (offset > e.offset)
    ref_insert(r, i, (store_extent){e.offset, offset - e.offset});
  r->free_bytes -= need;
}

static int ref_alloc(ref_list *r, uint64_t need, uint64_t *offset) {
  size_t best = r->n;
  for (size_t i = 0; i < r->n; i++)
    if (r->e[i].length >= need && (best == r->n || r->e[i].length < r->e[best].length))
      best = i;
  if (best == r->n)
    return -1;
  *offset = r->e[best].offset;
  ref_carve(r, best, *offset, need);
  return 0;
}

static int ref_take(ref_list *r, uint64_t offset, uint64_t need) {
  if (offset % G)
    return -1;
  for (size_t i = 0; i < r->n; i++)
    if (r->e[i].offset <= offset && offset + need <= r->e[i].offset + r->e[i].length) {
      ref_carve(r, i, offset, need);
      return 0;
    }
  return -1;
}

static uint64_t ref_free(ref_list *r, uint64_t offset, uint64_t len) {
  size_t i = 0;
  while (i < r->n && r->e[i].offset < offset)
    i++;
  ref_insert(r, i, (store_extent){offset, len});
  r->free_bytes += len;
  if (i + 1 < r->n && offset + len == r->e[i + 1].offset) {
    r->e[i].length += r->e[i + 1].length;
    ref_remove(r, i + 1);
  }
  if (i > 0 && r->e[i - 1].offset + r->e[i - 1].length == offset) {
    r->e[i - 1].length += r->e[i].length;
    ref_remove(r, i);
    i--;
  }
  return r->e[i].length;
}

static uint64_t ref_largest(const ref_list *r) {
  uint64_t largest = 0;
  for (size_t i = 0; i < r->n; i++)
    if (r->e[i].length > largest)
      largest = r->e[i].length;
  return largest;
}

static int used(const usage *u, uint64_t g) { return (int)(u->bits[g / 64] >> (g % 64) & 1); }

/* Whether any granule of [a, b) is in use: a word at a time. */
static int any_used(const usage *u, uint64_t a, uint64_t b) {
  for (uint64_t g = a; g < b;) {
    uint64_t span = 64 - g % 64 < b - g ? 64 - g % 64 : b - g;
    uint64_t mask = (span == 64 ? ~0ull : (1ull << span) - 1) << (g % 64);
    if (u->bits[g / 64] & mask)
      return 1;
    g += span;
  }
  return 0;
}

/* Marks [offset, offset + len) in use (set) or free, keeping the count of
 * maximal free runs: a range freed between two free neighbours joins two
 * runs into one, one taken from inside a run may split it. */
static void mark(usage *u, uint64_t offset, uint64_t len, int set) {
  uint64_t a = offset / G, b = (offset + len) / G;
  int left = a > 0 && !used(u, a - 1), right = b < GRANULES && !used(u, b);
  for (uint64_t g = a; g < b; g++)
    u->bits[g / 64] ^= 1ull << (g % 64);
  if (set) {
    u->runs = u->runs + (size_t)left + (size_t)right - 1;
    u->free_bytes -= len;
  } else {
    u->runs = u->runs + 1 - (size_t)left - (size_t)right;
    u->free_bytes += len;
  }
}

/* ---- the differential run ------------------------------------------------------------------- */

/* Mixed sizes, 0 B to 1 MiB: HiCache's 4 KiB pages and 1 MiB values, tiny
 * and odd lengths (rounded to granules), and a log-uniform spread. */
static uint64_t a_length(model *m) {
  uint64_t k = rnd(m) % 10;
  if (k < 4)
    return 4096;
  if (k < 5)
    return 1 << 20;
  if (k < 6)
    return rnd(m) % 200;
  uint64_t base = 64ull << (rnd(m) % 14);
  return base + rnd(m) % base;
}

/* A range to take: half the time one inside a free extent (it must be
 * granted), else anywhere, on a granule or not (mostly refused). */
static void a_take(model *m, uint64_t *offset, uint64_t *length) {
  if (m->ref.n && rnd(m) % 2) {
    store_extent e = m->ref.e[rnd(m) % m->ref.n];
    uint64_t granules = e.length / G, skip = rnd(m) % granules;
    *offset = e.offset + skip * G;
    *length = (1 + rnd(m) % (granules - skip)) * G - rnd(m) % G;
  } else {
    *offset = rnd(m) % SEGMENT;
    if (rnd(m) % 3)
      *offset -= *offset % G;
    *length = a_length(m);
  }
}

static void live_add(model *m, uint64_t offset, uint64_t length) {
  assert_true(m->nlive < MAX_LIVE);
  m->live[m->nlive++] = (store_extent){offset, length};
}

/* Both models say the same of x after each operation. */
static void check_state(const store_extents *x, const model *m, int op) {
  if (x->free_bytes != m->use.free_bytes || x->free_bytes != m->ref.free_bytes)
    fail_msg("op %d: free_bytes %llu, granules free %llu, reference %llu", op,
             (unsigned long long)x->free_bytes, (unsigned long long)m->use.free_bytes,
             (unsigned long long)m->ref.free_bytes);
  if (x->count != m->use.runs || x->count != m->ref.n)
    fail_msg("op %d: %zu extents, %zu maximal free runs, reference %zu", op, x->count, m->use.runs,
             m->ref.n);
  if (store_extents_largest(x) != ref_largest(&m->ref))
    fail_msg("op %d: largest %llu, reference %llu", op,
             (unsigned long long)store_extents_largest(x),
             (unsigned long long)ref_largest(&m->ref));
}

/* Every extent, in order, as the reference has it (every so many ops: the
 * walk costs O(n log n)). */
static void check_walk(const store_extents *x, const model *m, int op) {
  store_extent e;
  uint64_t from = 0;
  for (size_t i = 0; i < m->ref.n; i++) {
    if (store_extents_next(x, from, &e) != 0 || e.offset != m->ref.e[i].offset ||
        e.length != m->ref.e[i].length)
      fail_msg("op %d: extent %zu is not [%llu, +%llu)", op, i,
               (unsigned long long)m->ref.e[i].offset, (unsigned long long)m->ref.e[i].length);
    from = e.offset + e.length;
  }
  if (store_extents_next(x, from, &e) != -1)
    fail_msg("op %d: an extent past the reference's last", op);
}

static int do_alloc(store_extents *x, model *m, int op) {
  uint64_t length = a_length(m), need = store_extents_round(length ? length : 1);
  uint64_t got = 0, want = 0;
  int rc = store_extents_alloc(x, length, &got);
  if (rc == 0 && any_used(&m->use, got / G, (got + need) / G))
    fail_msg("op %d: [%llu, +%llu) overlaps a live allocation", op, (unsigned long long)got,
             (unsigned long long)need);
  int want_rc = ref_alloc(&m->ref, need, &want);
  if (rc != want_rc || (rc == 0 && got != want))
    fail_msg("op %d: alloc %llu: rc %d at %llu, best fit rc %d at %llu", op,
             (unsigned long long)length, rc, (unsigned long long)got, want_rc,
             (unsigned long long)want);
  if (rc == 0) {
    mark(&m->use, got, need, 1);
    live_add(m, got, length);
  }
  return rc;
}

static void do_free(store_extents *x, model *m, int op) {
  size_t i = rnd(m) % m->nlive;
  store_extent a = m->live[i];
  m->live[i] = m->live[--m->nlive];
  uint64_t len = store_extents_round(a.length ? a.length : 1);
  uint64_t merged = store_extents_free(x, a.offset, a.length);
  mark(&m->use, a.offset, len, 0);
  uint64_t want = ref_free(&m->ref, a.offset, len);
  if (merged != want)
    fail_msg("op %d: free [%llu, +%llu) is now part of %llu bytes, reference %llu", op,
             (unsigned long long)a.offset, (unsigned long long)len, (unsigned long long)merged,
             (unsigned long long)want);
}

static int do_take(store_extents *x, model *m, int op) {
  uint64_t offset, length;
  a_take(m, &offset, &length);
  uint64_t need = store_extents_round(length ? length : 1);
  int rc = store_extents_take(x, offset, length);
  if (rc == 0 && any_used(&m->use, offset / G, (offset + need) / G))
    fail_msg("op %d: take [%llu, +%llu) overlaps a live allocation", op, (unsigned long long)offset,
             (unsigned long long)need);
  int want = ref_take(&m->ref, offset, need);
  if (rc != want)
    fail_msg("op %d: take [%llu, +%llu): %d, reference %d", op, (unsigned long long)offset,
             (unsigned long long)need, rc, want);
  if (rc == 0) {
    mark(&m->use, offset, need, 1);
    live_add(m, offset, length);
  }
  return rc;
}

static void allocs_frees_and_takes_match_best_fit_and_coalesce(void **state) {
  (void)state;
  static model m; /* about 8 MB: not on the stack */
  memset(&m, 0, sizeof m);
  m.rng = 0x9e3779b97f4a7c15ull;
  m.ref.e[0] = (store_extent){0, SEGMENT};
  m.ref.n = 1;
  m.ref.free_bytes = m.use.free_bytes = SEGMENT;
  m.use.runs = 1;
  store_extents x;
  assert_int_equal(store_extents_init(&x, SEGMENT), 0);
  int refused = 0, taken = 0;
  size_t most = 0;
  for (int op = 0; op < OPS; op++) {
    uint64_t k = rnd(&m) % 100;
    if (k < 52 || m.nlive == 0)
      refused += do_alloc(&x, &m, op) != 0;
    else if (k < 95)
      do_free(&x, &m, op);
    else
      taken += do_take(&x, &m, op) == 0;
    check_state(&x, &m, op);
    if (op % 512 == 0)
      check_walk(&x, &m, op);
    most = x.count > most ? x.count : most;
  }
  /* The run met what it is for: a full pool, granted takes, many holes. */
  assert_true(refused > 100);
  assert_true(taken > 100);
  assert_true(most > 100);
  while (m.nlive)
    do_free(&x, &m, OPS);
  check_state(&x, &m, OPS);
  check_walk(&x, &m, OPS);
  assert_int_equal(x.count, 1);
  assert_int_equal(x.free_bytes, SEGMENT);
  store_extents_destroy(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_range_is_taken_from_the_middle_the_ends_or_whole),
      cmocka_unit_test(a_range_not_wholly_free_is_refused),
      cmocka_unit_test(without_memory_space_is_lost_never_given_twice),
      cmocka_unit_test(allocs_frees_and_takes_match_best_fit_and_coalesce),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
