/* plan_bench.c - what prepared transfer plans (ferry_plan_*) cost against
 * batches of entries, two engines in this process on 127.0.0.1. One JSON
 * line per run.
 *
 *   plan_bench rate N [REPS]
 *     Submit rate: N pairs of 64 B descriptors to scattered remote slots (no
 *     pair merges), ferry_plan_submit against ferry_batch_submit of the same
 *     N entries, and the same N pairs contiguous (merged into one
 *     operation); only the submit call is timed (the batch is waited for
 *     outside the clock), the fastest of REPS (a few ms of CPU work, which a
 *     shared machine's preemption only lengthens), interleaved. Over tcp.
 *
 *   plan_bench vllm tcp|shm [REPS]
 *     vLLM-shaped READ: 32 layers x 2 (K, V) regions of 256 blocks of 16 KiB
 *     on each side (256 MiB), every block read by prepared indices (block b
 *     of region r from block perm(b) of the target's region r), against
 *     ferry_transfer_sync_batch of the same entries built beforehand; median
 *     GB/s of REPS, interleaved.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/base/clock.h"
#define BENCH_PROG "plan_bench"
#include "bench_engine.h"
#include "ferry.h"

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double least(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_double);
  return v[0];
}

static void *registered(ferry_engine *e, size_t bytes) {
  void *p = malloc(bytes);
  if (!p)
    fprintf(stderr, "plan_bench: no memory for %zu bytes\n", bytes), exit(1);
  memset(p, 1, bytes);
  check(ferry_memory_register(e, p, bytes), "register");
  return p;
}

/* Seconds the submit call took; the batch is then waited for, untimed. */
static double timed_wait(uint64_t t0, ferry_batch *b) {
  double s = (double)(ferry_now_ns() - t0) / 1e9;
  check(ferry_batch_wait(b, -1), "wait");
  ferry_batch_free(b);
  return s;
}

static int rate(size_t n, int reps) {
  enum { DESC = 64 };
  ferry_engine *target = engine_with(FERRY_TRANSPORT_TCP), *e = engine_with(FERRY_TRANSPORT_TCP);
  char name[64];
  snprintf(name, sizeof name, "127.0.0.1:%u", ferry_engine_port(target));
  char *local = registered(e, n * DESC), *remote = registered(target, n * DESC);
  ferry_region *ld = malloc(n * sizeof *ld), *rd = malloc(n * sizeof *rd);
  int64_t *li = malloc(n * sizeof *li), *ri = malloc(n * sizeof *ri);
  ferry_entry *entries = malloc(n * sizeof *entries);
  for (size_t i = 0; i < n; i++) {
    size_t slot = (i * 2654435761u) % n; /* a prime: a permutation of 0..n-1 */
    ld[i] = (ferry_region){(uint64_t)(uintptr_t)(local + i * DESC), DESC};
    rd[i] = (ferry_region){(uint64_t)(uintptr_t)(remote + i * DESC), DESC};
    li[i] = (int64_t)i;
    ri[i] = (int64_t)slot;
  }
  for (size_t i = 0; i < n; i++)
    entries[i] = (ferry_entry){FERRY_OP_WRITE, local + i * DESC, rd[ri[i]].addr, DESC};
  ferry_plan *plan;
  check(ferry_plan_create(e, name, ld, n, rd, n, &plan), "plan");
  double *tp = malloc((size_t)reps * sizeof *tp), *tm = malloc((size_t)reps * sizeof *tm),
         *te = malloc((size_t)reps * sizeof *te);
  for (int r = 0; r < reps; r++) {
    ferry_batch *b;
    uint64_t t0 = ferry_now_ns();
    check(ferry_plan_submit(e, plan, FERRY_OP_WRITE, li, ri, n, NULL, 0, &b), "plan submit");
    tp[r] = timed_wait(t0, b);
    t0 = ferry_now_ns();
    check(ferry_plan_submit(e, plan, FERRY_OP_WRITE, li, li, n, NULL, 0, &b), "merged submit");
    tm[r] = timed_wait(t0, b);
    t0 = ferry_now_ns();
    check(ferry_batch_submit(e, name, entries, n, NULL, &b), "entries submit");
    te[r] = timed_wait(t0, b);
  }
  /* The fastest of the reps: a submit of a few ms on a shared machine is
   * often preempted, and what is measured here is CPU work, not waiting. */
  printf("{\"pairs\": %zu, \"plan_submit_per_s\": %.0f, \"merged_submit_per_s\": %.0f, "
         "\"entries_submit_per_s\": %.0f}\n",
         n, (double)n / least(tp, reps), (double)n / least(tm, reps), (double)n / least(te, reps));
  ferry_plan_free(plan);
  ferry_engine_destroy(e);
  ferry_engine_destroy(target);
  free(local), free(remote), free(ld), free(rd), free(li), free(ri), free(entries);
  free(tp), free(tm), free(te);
  return 0;
}

enum { LAYERS = 32, KV = 2, REGIONS = LAYERS * KV, VBLOCKS = 256, VBLOCK = 16 << 10 };
#define REGION_BYTES ((size_t)VBLOCKS * VBLOCK)

/* Each side's KV cache: one registered region per layer and K/V, and one
 * descriptor per (region, block), indexed region * VBLOCKS + block. */
static ferry_region *kv_cache(ferry_engine *e, char **regions) {
  ferry_region *d = malloc(REGIONS * VBLOCKS * sizeof *d);
  for (size_t r = 0; r < REGIONS; r++) {
    regions[r] = registered(e, REGION_BYTES);
    for (size_t b = 0; b < VBLOCKS; b++)
      d[r * VBLOCKS + b] = (ferry_region){(uint64_t)(uintptr_t)(regions[r] + b * VBLOCK), VBLOCK};
  }
  return d;
}

static int vllm(const char *protocol, int reps) {
  unsigned t = !strcmp(protocol, "shm") ? FERRY_TRANSPORT_SHM : FERRY_TRANSPORT_TCP;
  ferry_engine *target = engine_with(0), *e = engine_with(t);
  char name[64];
  snprintf(name, sizeof name, "127.0.0.1:%u", ferry_engine_port(target));
  char *mine[REGIONS], *theirs[REGIONS];
  ferry_region *ld = kv_cache(e, mine), *rd = kv_cache(target, theirs);
  enum { N = REGIONS * VBLOCKS };
  int64_t *li = malloc(N * sizeof *li), *ri = malloc(N * sizeof *ri);
  ferry_entry *entries = malloc(N * sizeof *entries);
  for (size_t i = 0; i < N; i++) {
    size_t r = i / VBLOCKS, b = i % VBLOCKS, from = r * VBLOCKS + (b * 37) % VBLOCKS;
    li[i] = (int64_t)i;
    ri[i] = (int64_t)from;
    entries[i] = (ferry_entry){FERRY_OP_READ, (void *)(uintptr_t)ld[i].addr, rd[from].addr, VBLOCK};
  }
  ferry_plan *plan;
  check(ferry_plan_create(e, name, ld, N, rd, N, &plan), "plan");
  unsigned used = 0;
  check(ferry_peer_transport(e, name, &used), "peer transport");
  if (used != t)
    fprintf(stderr, "plan_bench: %s unavailable here\n", protocol), exit(1);
  double *tp = malloc((size_t)reps * sizeof *tp), *te = malloc((size_t)reps * sizeof *te);
  double bytes = (double)N * VBLOCK;
  for (int r = 0; r < reps; r++) {
    uint64_t t0 = ferry_now_ns();
    check(ferry_plan_transfer_sync(e, plan, FERRY_OP_READ, li, ri, N, NULL, 0), "plan READ");
    tp[r] = bytes / ((double)(ferry_now_ns() - t0));
    t0 = ferry_now_ns();
    check(ferry_transfer_sync_batch(e, name, entries, N, NULL), "batch READ");
    te[r] = bytes / ((double)(ferry_now_ns() - t0));
  }
  printf("{\"protocol\": \"%s\", \"bytes\": %.0f, \"plan_gbps\": %.3f, \"batch_gbps\": %.3f}\n",
         protocol, bytes, median(tp, reps), median(te, reps));
  ferry_plan_free(plan);
  ferry_engine_destroy(e);
  ferry_engine_destroy(target);
  for (size_t r = 0; r < REGIONS; r++)
    free(mine[r]), free(theirs[r]);
  free(ld), free(rd), free(li), free(ri), free(entries), free(tp), free(te);
  return 0;
}

int main(int argc, char **argv) {
  int reps = argc > 3 ? atoi(argv[3]) : 5;
  if (argc >= 3 && !strcmp(argv[1], "rate") && reps > 0)
    return rate((size_t)strtoull(argv[2], NULL, 10), reps);
  if (argc >= 3 && !strcmp(argv[1], "vllm") && reps > 0 &&
      (!strcmp(argv[2], "tcp") || !strcmp(argv[2], "shm")))
    return vllm(argv[2], reps);
  fprintf(stderr, "usage: plan_bench rate N [REPS] | plan_bench vllm tcp|shm [REPS]\n");
  return 2;
}
