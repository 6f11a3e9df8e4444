/* test_registry.c - unit tests of the registered-region table.
 *
 * The registry is the gate every network access passes, so these tests pin
 * down its edges (duplicates, each kind of overlap, first and last byte,
 * wrap-around), the all-or-nothing batch, holes left by removals, the
 * one-pass batch removal, range queries, lookup speed at 50,000 regions and
 * that concurrent readers survive a writer (the TSan build runs this too). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry.h"
#include "memory/registry.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif

/* splitmix64: small, deterministic, good enough to shuffle and probe. */
static uint64_t rng_next(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int setup(void **state) {
  *state = ferry_registry_create();
  return *state == NULL ? -1 : 0;
}

static int teardown(void **state) {
  ferry_registry_destroy(*state);
  return 0;
}

/* The table must be exactly `expected` (sorted). */
static void assert_table(ferry_registry *reg, const ferry_region *expected, size_t count) {
  ferry_region *snap = NULL;
  size_t n = ferry_registry_snapshot(reg, &snap);
  assert_int_equal(n, count);
  assert_int_equal(ferry_registry_count(reg), count);
  if (count > 0)
    assert_memory_equal(snap, expected, count * sizeof *snap);
  else
    assert_null(snap);
  free(snap);
}

static void test_duplicate_is_harmless(void **state) {
  ferry_registry *reg = *state;
  assert_int_equal(ferry_registry_add(reg, 0x1000, 4096), FERRY_OK);
  uint64_t gen = ferry_registry_generation(reg);
  assert_int_equal(ferry_registry_add(reg, 0x1000, 4096), FERRY_OK);
  assert_int_equal(ferry_registry_generation(reg), gen); /* nothing changed */
  ferry_region only = {0x1000, 4096};
  assert_table(reg, &only, 1);
}

static void test_overlap_refused(void **state) {
  ferry_registry *reg = *state;
  ferry_region base = {0x10000, 0x1000};
  assert_int_equal(ferry_registry_add(reg, base.addr, base.length), FERRY_OK);
  uint64_t gen = ferry_registry_generation(reg);
  const ferry_region bad[] = {
      {0xF800, 0x1000},  /* overlaps on the left */
      {0x10800, 0x1000}, /* overlaps on the right */
      {0xF000, 0x3000},  /* contains it */
      {0x10100, 0x100},  /* is contained */
      {0x10000, 0x800},  /* same start, shorter */
      {0x10000, 0x2000}, /* same start, longer */
      {0xFFFF, 2},       /* one byte on each side of the start */
      {0x10FFF, 1},      /* its last byte */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(ferry_registry_add(reg, bad[i].addr, bad[i].length), FERRY_EOVERLAP);
    assert_non_null(strstr(ferry_last_error(), "overlaps registered region [0x10000, +4096)"));
    assert_table(reg, &base, 1);
    assert_int_equal(ferry_registry_generation(reg), gen);
  }
  /* Touching is not overlapping. */
  assert_int_equal(ferry_registry_add(reg, 0xF000, 0x1000), FERRY_OK);
  assert_int_equal(ferry_registry_add(reg, 0x11000, 0x1000), FERRY_OK);
  assert_int_equal(ferry_registry_count(reg), 3);
}

static void test_overlap_detail(void **state) {
  ferry_registry *reg = *state;
  assert_int_equal(ferry_registry_add(reg, 0x1800, 8192), FERRY_OK);
  assert_int_equal(ferry_registry_add(reg, 0x1000, 4096), FERRY_EOVERLAP);
  assert_string_equal(ferry_last_error(),
                      "register [0x1000, +4096) overlaps registered region [0x1800, +8192)");
}

static void test_invalid_ranges(void **state) {
  ferry_registry *reg = *state;
  assert_int_equal(ferry_registry_add(reg, 0x1000, 0), FERRY_EINVAL);
  assert_int_equal(ferry_registry_add(reg, UINT64_MAX - 10, 100), FERRY_EINVAL);
  assert_int_equal(ferry_registry_add(reg, UINT64_MAX, 1), FERRY_EINVAL); /* end would be 2^64 */
  assert_int_equal(ferry_registry_count(reg), 0);
  /* The very top of the address space works, exclusive end UINT64_MAX. */
  assert_int_equal(ferry_registry_add(reg, UINT64_MAX - 100, 100), FERRY_OK);
  assert_true(ferry_registry_contains(reg, UINT64_MAX - 1, 1));
  assert_true(ferry_registry_contains(reg, UINT64_MAX - 100, 100));
  assert_false(ferry_registry_contains(reg, UINT64_MAX - 1, 2));
  assert_false(ferry_registry_contains(reg, UINT64_MAX, 1));
  assert_false(ferry_registry_contains(reg, UINT64_MAX - 50, UINT64_MAX)); /* would wrap */
}

static void test_add_many_all_or_nothing(void **state) {
  ferry_registry *reg = *state;
  assert_int_equal(ferry_registry_add(reg, 0x100000, 0x1000), FERRY_OK);
  ferry_region existing = {0x100000, 0x1000};
  uint64_t gen = ferry_registry_generation(reg);

  ferry_region batch[11];
  for (int i = 0; i < 10; i++)
    batch[i] = (ferry_region){0x200000 + (uint64_t)i * 0x2000, 0x1000};
  batch[10] = (ferry_region){0x100800, 0x1000}; /* overlaps the registered one */
  assert_int_equal(ferry_registry_add_many(reg, batch, 11), FERRY_EOVERLAP);
  assert_non_null(strstr(ferry_last_error(), "[0x100800, +4096)"));
  assert_table(reg, &existing, 1);
  assert_int_equal(ferry_registry_generation(reg), gen);

  batch[10] = (ferry_region){0x200800, 0x10}; /* overlaps another batch entry */
  assert_int_equal(ferry_registry_add_many(reg, batch, 11), FERRY_EOVERLAP);
  assert_table(reg, &existing, 1);

  batch[10] = (ferry_region){0x900000, 0}; /* invalid */
  assert_int_equal(ferry_registry_add_many(reg, batch, 11), FERRY_EINVAL);
  assert_table(reg, &existing, 1);
  assert_int_equal(ferry_registry_generation(reg), gen);

  /* Repeats inside the batch and of registered regions are fine. */
  batch[10] = existing;
  batch[9] = batch[3];
  assert_int_equal(ferry_registry_add_many(reg, batch, 11), FERRY_OK);
  assert_int_equal(ferry_registry_count(reg), 10); /* existing + 9 distinct new */
  assert_int_equal(ferry_registry_generation(reg), gen + 1);
  for (int i = 0; i < 9; i++)
    assert_true(ferry_registry_contains(reg, batch[i].addr, batch[i].length));

  /* A batch that adds nothing changes nothing. */
  gen = ferry_registry_generation(reg);
  assert_int_equal(ferry_registry_add_many(reg, batch, 11), FERRY_OK);
  assert_int_equal(ferry_registry_generation(reg), gen);
  assert_int_equal(ferry_registry_add_many(reg, NULL, 0), FERRY_OK);
}

static void test_remove(void **state) {
  ferry_registry *reg = *state;
  assert_int_equal(ferry_registry_remove(reg, 0x1000), FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "0x1000"));
  assert_int_equal(ferry_registry_add(reg, 0x1000, 0x1000), FERRY_OK);
  assert_int_equal(ferry_registry_add(reg, 0x3000, 0x1000), FERRY_OK);
  assert_int_equal(ferry_registry_remove(reg, 0x1800), FERRY_ENOTREG); /* inside, not start */
  assert_non_null(strstr(ferry_last_error(), "0x1800"));
  assert_int_equal(ferry_registry_count(reg), 2);
  uint64_t gen = ferry_registry_generation(reg);
  assert_int_equal(ferry_registry_remove(reg, 0x1000), FERRY_OK);
  assert_int_equal(ferry_registry_generation(reg), gen + 1);
  assert_false(ferry_registry_contains(reg, 0x1000, 1));
  assert_true(ferry_registry_contains(reg, 0x3000, 1));
  assert_int_equal(ferry_registry_remove(reg, 0x1000), FERRY_ENOTREG);
  assert_int_equal(ferry_registry_remove(reg, 0x3000), FERRY_OK);
  assert_table(reg, NULL, 0);
}

static void test_contains_edges(void **state) {
  ferry_registry *reg = *state;
  assert_int_equal(ferry_registry_add(reg, 0x1000, 0x1000), FERRY_OK);
  assert_int_equal(ferry_registry_add(reg, 0x2000, 0x1000), FERRY_OK); /* adjacent */
  assert_true(ferry_registry_contains(reg, 0x1000, 1));                /* first byte */
  assert_true(ferry_registry_contains(reg, 0x1FFF, 1));                /* last byte */
  assert_true(ferry_registry_contains(reg, 0x1000, 0x1000));           /* all of it */
  assert_false(ferry_registry_contains(reg, 0xFFF, 1));                /* one byte before */
  assert_false(ferry_registry_contains(reg, 0x3000, 1));               /* one byte past */
  assert_false(ferry_registry_contains(reg, 0x2FFF, 2));               /* runs one byte past */
  assert_false(ferry_registry_contains(reg, 0x1000, 0x1001));
  assert_false(ferry_registry_contains(reg, 0x1FFF, 2)); /* spans two regions */
  assert_false(ferry_registry_contains(reg, 0x1000, 0)); /* empty is never "inside" */

  ferry_region r;
  assert_true(ferry_registry_find(reg, 0x1FFF, &r));
  assert_int_equal(r.addr, 0x1000);
  assert_true(ferry_registry_find(reg, 0x2000, &r));
  assert_int_equal(r.addr, 0x2000);
  assert_int_equal(r.length, 0x1000);
  assert_false(ferry_registry_find(reg, 0x3000, &r));
  assert_false(ferry_registry_find(reg, 0, &r));
}

static void test_search_table(void **state) {
  (void)state;
  const ferry_region t[] = {{10, 10}, {30, 5}, {100, UINT64_MAX - 100}};
  assert_int_equal(ferry_regions_search(NULL, 0, 10, 1), -1);
  assert_int_equal(ferry_regions_search(t, 3, 9, 1), -1);
  assert_int_equal(ferry_regions_search(t, 3, 10, 10), 0);
  assert_int_equal(ferry_regions_search(t, 3, 10, 0), -1);
  assert_int_equal(ferry_regions_search(t, 3, 20, 1), -1);
  assert_int_equal(ferry_regions_search(t, 3, 34, 1), 1);
  assert_int_equal(ferry_regions_search(t, 3, 34, 2), -1);
  assert_int_equal(ferry_regions_search(t, 3, UINT64_MAX - 1, 1), 2);
  assert_int_equal(ferry_regions_search(t, 3, UINT64_MAX - 1, 2), -1);
  assert_int_equal(ferry_regions_search(t, 3, 200, UINT64_MAX), -1); /* no overflow */
  assert_int_equal(ferry_regions_search(t, 3, UINT64_MAX, 1), -1);
}

/* Removed regions leave holes in the table; registering over them must
 * drop the holes inside the new region, or a lookup past the first hole
 * would land on it and miss. */
static void test_register_over_holes(void **state) {
  ferry_registry *reg = *state;
  for (uint64_t i = 0; i < 8; i++)
    assert_int_equal(ferry_registry_add(reg, 0x10000 + i * 0x1000, 0x800), FERRY_OK);
  for (uint64_t i = 2; i < 6; i++)
    assert_int_equal(ferry_registry_remove(reg, 0x10000 + i * 0x1000), FERRY_OK);
  assert_false(ferry_registry_contains(reg, 0x12000, 1));
  assert_int_equal(ferry_registry_add(reg, 0x12400, 0x2800), FERRY_OK); /* over 3 holes */
  assert_true(ferry_registry_contains(reg, 0x14100, 0x100));
  assert_true(ferry_registry_contains(reg, 0x12400, 0x2800));
  assert_int_equal(ferry_registry_add(reg, 0x11400, 0x800), FERRY_EOVERLAP); /* live neighbours */
  assert_int_equal(ferry_registry_add(reg, 0x14b00, 0x800), FERRY_EOVERLAP);
  assert_int_equal(ferry_registry_add(reg, 0x15000, 0x800), FERRY_OK);  /* the last hole */
  assert_int_equal(ferry_registry_add(reg, 0x12400, 0x2800), FERRY_OK); /* identical again */
  const ferry_region want[] = {{0x10000, 0x800}, {0x11000, 0x800}, {0x12400, 0x2800},
                               {0x15000, 0x800}, {0x16000, 0x800}, {0x17000, 0x800}};
  assert_table(reg, want, 6);
  ferry_region r;
  assert_true(ferry_registry_find(reg, 0x14bff, &r));
  assert_int_equal(r.addr, 0x12400);
}

/* One pass removes many; a missing address fails the call after the rest
 * went, naming it. Holes past the squeeze threshold leave the table right. */
static void test_take_many(void **state) {
  ferry_registry *reg = *state;
  enum { N = 1000 };
  ferry_region all[N], take[N / 2 + 1];
  for (uint64_t i = 0; i < N; i++)
    all[i] = (ferry_region){0x100000 + i * 0x2000, 0x1000};
  assert_int_equal(ferry_registry_add_many(reg, all, N), FERRY_OK);
  size_t n = 0;
  for (uint64_t i = 0; i < N; i += 2)
    take[n++].addr = all[i].addr;
  take[n++].addr = 0x42; /* not registered */
  size_t taken;
  assert_int_equal(ferry_registry_take_many(reg, take, n, &taken), FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "0x42"));
  assert_int_equal(taken, N / 2);
  assert_int_equal(take[1].addr, all[2].addr);
  assert_int_equal(take[1].length, 0x1000);
  assert_int_equal(ferry_registry_count(reg), N / 2);
  for (uint64_t i = 0; i < N; i++)
    assert_int_equal(ferry_registry_contains(reg, all[i].addr + 1, 1), (int)(i % 2));
  ferry_region odd[N / 2];
  for (uint64_t i = 0; i < N / 2; i++)
    odd[i] = all[2 * i + 1];
  assert_table(reg, odd, N / 2);
  assert_int_equal(ferry_registry_take_many(reg, odd, N / 2, &taken), FERRY_OK);
  assert_int_equal(taken, N / 2);
  assert_table(reg, NULL, 0);
  assert_int_equal(ferry_registry_add_many(reg, all, N), FERRY_OK);
  assert_int_equal(ferry_registry_count(reg), N);
}

/* Regions overlapping the asked ranges, each once, holes skipped; no
 * ranges: the whole table. */
static void test_overlapping(void **state) {
  ferry_registry *reg = *state;
  const ferry_region t[] = {{0x1000, 0x1000}, {0x3000, 0x3000}, {0x8000, 0x100}, {0x9000, 0x100}};
  assert_int_equal(ferry_registry_add_many(reg, t, 4), FERRY_OK);
  assert_int_equal(ferry_registry_remove(reg, 0x8000), FERRY_OK);
  const ferry_region ask[] = {{0x1800, 0x1}, {0x2000, 0x1800}, {0x5000, 0x10}, {0x7000, 0x1400}};
  ferry_region *got;
  size_t n;
  assert_int_equal(ferry_registry_overlapping(reg, ask, 4, &got, &n), FERRY_OK);
  assert_int_equal(n, 2); /* 0x3000 once though two ranges reach it; 0x8000 gone */
  assert_int_equal(got[0].addr, 0x1000);
  assert_int_equal(got[1].addr, 0x3000);
  free(got);
  const ferry_region far[] = {{0x9100, 0x1000}, {0x20000, 0x10}};
  assert_int_equal(ferry_registry_overlapping(reg, far, 2, &got, &n), FERRY_OK);
  assert_int_equal(n, 0);
  assert_null(got);
  const ferry_region last[] = {{0x90ff, 0x1}};
  assert_int_equal(ferry_registry_overlapping(reg, last, 1, &got, &n), FERRY_OK);
  assert_int_equal(n, 1);
  assert_int_equal(got[0].addr, 0x9000);
  free(got);
  assert_int_equal(ferry_registry_overlapping(reg, NULL, 0, &got, &n), FERRY_OK);
  assert_int_equal(n, 3);
  free(got);
}

/* ---- Scale -------------------------------------------------------------- */

#define SCALE_REGIONS 50000
#define SCALE_LOOKUPS 1000000
#define SCALE_BASE 0x7f0000000000ull
#define SCALE_STRIDE 8192ull

/* Region i lives at base + i*stride with a length in [1024, 8191], so every
 * region is followed by a gap and the right answer is plain arithmetic. */
static uint64_t scale_length(uint64_t i) { return 1024 + (i * 2654435761ull) % 7168; }

static int scale_expected(uint64_t addr, uint64_t length) {
  uint64_t off = addr - SCALE_BASE;
  uint64_t i = off / SCALE_STRIDE, in = off % SCALE_STRIDE;
  if (i >= SCALE_REGIONS)
    return 0;
  uint64_t len = scale_length(i);
  return in < len && length <= len - in;
}

static void test_lookup_at_scale(void **state) {
  ferry_registry *reg = *state;
  uint64_t seed = 0x5eed0001;
  uint64_t *order = malloc(SCALE_REGIONS * sizeof *order);
  ferry_region *batch = malloc(SCALE_REGIONS * sizeof *batch);
  assert_non_null(order);
  assert_non_null(batch);
  for (uint64_t i = 0; i < SCALE_REGIONS; i++)
    order[i] = i;
  for (uint64_t i = SCALE_REGIONS - 1; i > 0; i--) {
    uint64_t j = rng_next(&seed) % (i + 1), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  /* Part one by one (the memmove path), the rest in random-order batches
   * (the merge path). */
  size_t single = 2000, k = 0;
  for (; k < single; k++)
    assert_int_equal(
        ferry_registry_add(reg, SCALE_BASE + order[k] * SCALE_STRIDE, scale_length(order[k])),
        FERRY_OK);
  while (k < SCALE_REGIONS) {
    size_t n = 0;
    for (; n < 4096 && k < SCALE_REGIONS; n++, k++)
      batch[n] = (ferry_region){SCALE_BASE + order[k] * SCALE_STRIDE, scale_length(order[k])};
    assert_int_equal(ferry_registry_add_many(reg, batch, n), FERRY_OK);
  }
  assert_int_equal(ferry_registry_count(reg), SCALE_REGIONS);

  ferry_region *snap = NULL;
  assert_int_equal(ferry_registry_snapshot(reg, &snap), SCALE_REGIONS);
  for (uint64_t i = 0; i < SCALE_REGIONS; i++) {
    assert_int_equal(snap[i].addr, SCALE_BASE + i * SCALE_STRIDE);
    assert_int_equal(snap[i].length, scale_length(i));
  }
  free(snap);

  /* Probes cover a little before and after the table too. */
  uint64_t span = (SCALE_REGIONS + 2) * SCALE_STRIDE;
  uint64_t wrong = 0, hits = 0;
  double start = now_seconds();
  for (int i = 0; i < SCALE_LOOKUPS; i++) {
    uint64_t r = rng_next(&seed);
    uint64_t addr = SCALE_BASE - SCALE_STRIDE + r % span;
    uint64_t length = 1 + (r >> 40) % 4096;
    int got = ferry_registry_contains(reg, addr, length);
    int want = addr >= SCALE_BASE && scale_expected(addr, length);
    wrong += got != want;
    hits += got;
  }
  double elapsed = now_seconds() - start;
  printf("  %d lookups over %d regions: %.3f s (%" PRIu64 " inside)\n", SCALE_LOOKUPS,
         SCALE_REGIONS, elapsed, hits);
  assert_int_equal(wrong, 0);
  assert_true(hits > SCALE_LOOKUPS / 10 && hits < SCALE_LOOKUPS); /* probes hit both ways */
#ifndef SANITIZED
  assert_true(elapsed < 1.0);
#endif
  free(order);
  free(batch);
}

static void test_snapshot_sorted(void **state) {
  ferry_registry *reg = *state;
  ferry_region *snap = (ferry_region *)1;
  assert_int_equal(ferry_registry_snapshot(reg, &snap), 0);
  assert_null(snap);
  uint64_t seed = 42;
  for (int i = 0; i < 2000; i++) {
    uint64_t addr = (rng_next(&seed) % 100000) * 64;
    ferry_status st = ferry_registry_add(reg, addr, 1 + rng_next(&seed) % 256);
    assert_true(st == FERRY_OK || st == FERRY_EOVERLAP);
  }
  size_t n = ferry_registry_snapshot(reg, &snap);
  assert_true(n > 100);
  for (size_t i = 1; i < n; i++)
    assert_true(snap[i - 1].addr + snap[i - 1].length <= snap[i].addr);
  free(snap);
}

static void test_generation(void **state) {
  ferry_registry *reg = *state;
  uint64_t g = ferry_registry_generation(reg);
  assert_int_equal(ferry_registry_add(reg, 0x1000, 16), FERRY_OK);
  assert_int_equal(ferry_registry_generation(reg), ++g);
  assert_int_equal(ferry_registry_add(reg, 0x1000, 16), FERRY_OK); /* no change */
  assert_int_equal(ferry_registry_add(reg, 0x1008, 16), FERRY_EOVERLAP);
  assert_int_equal(ferry_registry_remove(reg, 0x9000), FERRY_ENOTREG);
  assert_int_equal(ferry_registry_generation(reg), g);
  ferry_region two[] = {{0x3000, 16}, {0x2000, 16}};
  assert_int_equal(ferry_registry_add_many(reg, two, 2), FERRY_OK);
  assert_int_equal(ferry_registry_generation(reg), ++g);
  assert_int_equal(ferry_registry_remove(reg, 0x2000), FERRY_OK);
  assert_int_equal(ferry_registry_generation(reg), ++g);
}

/* ---- Concurrency -------------------------------------------------------- */

#define CONC_STABLE 512
#define CONC_READERS 4
#define CONC_ROUNDS 20000
#define CONC_SECONDS 0.5 /* bound on a busy 2-core box; TSan makes rounds slow */

/* Even slots stay registered throughout; the writer toggles odd slots. */
static uint64_t slot_addr(uint64_t i) { return 0x40000000ull + i * 0x1000; }

struct conc {
  ferry_registry *reg;
  atomic_int writer_done;
  atomic_ulong lookups;
  atomic_ulong failures;
};

/* Looks up regions that must always be there until the writer finishes. */
static void *reader_main(void *arg) {
  struct conc *c = arg;
  uint64_t seed = (uint64_t)(uintptr_t)&seed; /* differs per thread */
  unsigned long done = 0, failures = 0;
  while (!atomic_load(&c->writer_done)) {
    uint64_t slot = 2 * (rng_next(&seed) % CONC_STABLE);
    uint64_t off = rng_next(&seed) % 0x800;
    ferry_region r;
    failures += !ferry_registry_contains(c->reg, slot_addr(slot) + off, 0x800);
    failures +=
        !ferry_registry_find(c->reg, slot_addr(slot) + off, &r) || r.addr != slot_addr(slot);
    (void)ferry_registry_contains(c->reg, slot_addr(slot + 1), 1); /* racing slot: any answer */
    if ((++done & 1023) == 0) {
      ferry_region *snap = NULL;
      failures += ferry_registry_snapshot(c->reg, &snap) < CONC_STABLE;
      free(snap);
      (void)ferry_registry_generation(c->reg);
      (void)ferry_registry_count(c->reg);
    }
  }
  atomic_fetch_add(&c->lookups, done);
  atomic_fetch_add(&c->failures, failures);
  return NULL;
}

/* Adds and removes odd slots, and tries batches that must be refused.
 * Returns the number of rounds done. */
static int writer_rounds(ferry_registry *reg) {
  uint64_t seed = 99;
  double deadline = now_seconds() + CONC_SECONDS;
  int round = 0;
  for (; round < CONC_ROUNDS && (round % 64 != 0 || now_seconds() < deadline); round++) {
    uint64_t slot = 2 * (rng_next(&seed) % CONC_STABLE) + 1;
    if (round % 3 == 0) {
      /* the second entry lies inside a stable slot: the batch must fail whole */
      ferry_region batch[2] = {{slot_addr(slot), 0x1000}, {slot_addr(slot - 1) + 0x10, 0x10}};
      assert_int_equal(ferry_registry_add_many(reg, batch, 2), FERRY_EOVERLAP);
    }
    assert_int_equal(ferry_registry_add(reg, slot_addr(slot), 0x1000), FERRY_OK);
    assert_int_equal(ferry_registry_remove(reg, slot_addr(slot)), FERRY_OK);
  }
  return round;
}

static void test_concurrent_readers(void **state) {
  struct conc c = {.reg = *state};
  atomic_init(&c.writer_done, 0);
  atomic_init(&c.lookups, 0);
  atomic_init(&c.failures, 0);
  for (uint64_t i = 0; i < CONC_STABLE; i++)
    assert_int_equal(ferry_registry_add(c.reg, slot_addr(2 * i), 0x1000), FERRY_OK);
  pthread_t readers[CONC_READERS];
  for (int i = 0; i < CONC_READERS; i++)
    assert_int_equal(pthread_create(&readers[i], NULL, reader_main, &c), 0);
  double start = now_seconds();
  int rounds = writer_rounds(c.reg);
  atomic_store(&c.writer_done, 1);
  for (int i = 0; i < CONC_READERS; i++)
    pthread_join(readers[i], NULL);
  printf("  %d writer rounds against %lu reader lookups: %.3f s\n", rounds, atomic_load(&c.lookups),
         now_seconds() - start);
  assert_int_equal(atomic_load(&c.failures), 0);
  assert_int_equal(ferry_registry_count(c.reg), CONC_STABLE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_duplicate_is_harmless, setup, teardown),
      cmocka_unit_test_setup_teardown(test_overlap_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_overlap_detail, setup, teardown),
      cmocka_unit_test_setup_teardown(test_invalid_ranges, setup, teardown),
      cmocka_unit_test_setup_teardown(test_add_many_all_or_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
      cmocka_unit_test_setup_teardown(test_contains_edges, setup, teardown),
      cmocka_unit_test_setup_teardown(test_register_over_holes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_take_many, setup, teardown),
      cmocka_unit_test_setup_teardown(test_overlapping, setup, teardown),
      cmocka_unit_test(test_search_table),
      cmocka_unit_test_setup_teardown(test_lookup_at_scale, setup, teardown),
      cmocka_unit_test_setup_teardown(test_snapshot_sorted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_generation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concurrent_readers, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
