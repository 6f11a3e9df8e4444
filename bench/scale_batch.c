/* scale_batch.c - what a batch's size costs: N entries of SIZE bytes from a
 * contiguous local buffer to random (permuted) slots of a remote buffer,
 * against one bulk WRITE of the same bytes in the same run (interleaved
 * over REPS), both synchronous over loopback tcp. Also the initiator's
 * memory growth per entry while an asynchronous batch of the same entries
 * is in flight: the larger of main-arena heap and resident set growth, the
 * most seen while polling every millisecond (the caller's entry array is
 * not counted; what the target in this same process allocates meanwhile
 * is, which is little). Above 1 GiB the local and
 * remote buffers are one mapping, to fit the machine. One JSON line.
 *
 *   scale_batch N SIZE [REPS]
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../src/base/clock.h"
#define BENCH_PROG "scale_batch"
#include "bench_engine.h"
#include "ferry.h"

static char *buffer(size_t bytes) {
  char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    fprintf(stderr, "scale_batch: cannot map %zu bytes\n", bytes), exit(1);
  memset(p, 1, bytes);
  return p;
}

/* Heap (main arena) plus resident memory: the batch's own copy is made by
 * the submitting thread, the transports' buffers may be in other arenas. */
static size_t memory_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  size_t pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f && fscanf(f, "%zu %zu", &pages, &resident) != 2)
    resident = 0;
  if (f)
    fclose(f);
  size_t heap = m.uordblks + m.hblkhd, rss = resident * (size_t)sysconf(_SC_PAGESIZE);
  return heap > rss ? heap : rss;
}

/* Largest memory growth over base while the batch runs. */
static size_t in_flight_growth(ferry_engine *e, const char *target, const ferry_entry *entries,
                               size_t n, size_t base) {
  ferry_batch *b;
  check(ferry_batch_submit(e, target, entries, n, NULL, &b), "submit");
  size_t most = 0;
  while (ferry_batch_wait(b, 1) == FERRY_EINPROGRESS) {
    size_t now = memory_bytes();
    if (now > base && now - base > most)
      most = now - base;
  }
  check(ferry_batch_wait(b, -1), "async batch");
  ferry_batch_free(b);
  return most;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, compare_double);
  return v[n / 2];
}

int main(int argc, char **argv) {
  size_t n = argc >= 3 ? strtoul(argv[1], NULL, 10) : 0;
  size_t size = argc >= 3 ? strtoul(argv[2], NULL, 10) : 0;
  size_t reps = argc >= 4 ? strtoul(argv[3], NULL, 10) : 3;
  if (!n || !size || !reps || reps > 64) {
    fprintf(stderr, "usage: scale_batch N SIZE [REPS <= 64]\n");
    return 2;
  }
  size_t bytes = n * size;
  int shared = bytes > (1ull << 30);
  ferry_engine *t = engine_new(), *e = engine_new();
  char *remote = buffer(bytes), *local = shared ? remote : buffer(bytes);
  check(ferry_memory_register(t, remote, bytes), "register remote");
  check(ferry_memory_register(e, local, bytes), "register local");
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%u", ferry_engine_port(t));

  size_t *slot = malloc(n * sizeof *slot);
  ferry_entry *entries = malloc(n * sizeof *entries);
  if (!slot || !entries)
    return fprintf(stderr, "scale_batch: no memory\n"), 1;
  for (size_t i = 0; i < n; i++)
    slot[i] = i;
  srand(7);
  for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
    size_t j = ((size_t)rand() * ((size_t)RAND_MAX + 1) + (size_t)rand()) % (i + 1);
    size_t x = slot[i];
    slot[i] = slot[j], slot[j] = x;
  }
  for (size_t i = 0; i < n; i++)
    entries[i] = (ferry_entry){FERRY_OP_WRITE, local + i * size,
                               (uint64_t)(uintptr_t)(remote + slot[i] * size), size};
  ferry_entry bulk = {FERRY_OP_WRITE, local, (uint64_t)(uintptr_t)remote, bytes};

  double batch_s[64], bulk_s[64];
  for (size_t r = 0; r < reps; r++) {
    uint64_t t0 = ferry_now_ns();
    check(ferry_transfer_sync_batch(e, target, &bulk, 1, NULL), "bulk WRITE");
    uint64_t t1 = ferry_now_ns();
    check(ferry_transfer_sync_batch(e, target, entries, n, NULL), "batch");
    uint64_t t2 = ferry_now_ns();
    bulk_s[r] = (double)(t1 - t0) / 1e9, batch_s[r] = (double)(t2 - t1) / 1e9;
  }
  size_t growth = in_flight_growth(e, target, entries, n, memory_bytes());
  double batch = median(batch_s, reps), whole = median(bulk_s, reps);
  printf("{\"entries\": %zu, \"size\": %zu, \"entries_per_s\": %.0f, \"batch_gbps\": %.3f, "
         "\"bulk_gbps\": %.3f, \"ratio\": %.3f, \"inflight_bytes_per_entry\": %.1f, "
         "\"shared_buffer\": %d}\n",
         n, size, (double)n / batch, (double)bytes / batch / 1e9, (double)bytes / whole / 1e9,
         whole / batch, (double)growth / (double)n, shared);
  ferry_engine_destroy(e);
  ferry_engine_destroy(t);
  munmap(remote, bytes);
  if (!shared)
    munmap(local, bytes);
  free(slot);
  free(entries);
  return 0;
}
