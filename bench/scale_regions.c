/* scale_regions.c - what a new peer's first contact costs when the target
 * holds many regions: a target engine registers N 4 KiB regions (8 KiB
 * apart, one batch call), then REPS fresh initiator engines each create,
 * register a 4 KiB buffer and WRITE it once into a random region. Reports
 * p50/p99 of engine create -> first completed WRITE ("cold") and of the
 * first call alone ("first"; the target page is faulted in beforehand, as a
 * live KV pool's would be), and the bytes both directions carried on the
 * connections to the target for one such first call (from `ss -ti`, read
 * while the connections are open). Loopback and tcp only. One JSON line.
 *
 *   scale_regions N [REPS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../src/base/clock.h"
#define BENCH_PROG "scale_regions"
#include "bench_engine.h"
#include "ferry.h"

#define PAGE 4096

/* A target holding n regions inside one reserved, untouched mapping. */
static char *target_regions(ferry_engine *t, size_t n) {
  char *mem = mmap(NULL, 2 * n * PAGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void **addrs = malloc(n * sizeof *addrs);
  size_t *lens = malloc(n * sizeof *lens);
  if (mem == MAP_FAILED || !addrs || !lens)
    fprintf(stderr, "scale_regions: no memory\n"), exit(1);
  for (size_t i = 0; i < n; i++)
    addrs[i] = mem + 2 * i * PAGE, lens[i] = PAGE;
  check(ferry_memory_register_batch(t, addrs, lens, n), "register the target's regions");
  free(addrs);
  free(lens);
  return mem;
}

/* Bytes sent both ways on the established connections to port. */
static unsigned long long wire_bytes(uint16_t port) {
  char cmd[128], line[4096];
  snprintf(cmd, sizeof cmd, "ss -tinH state established '( sport = :%u )'", port);
  FILE *f = popen(cmd, "r");
  unsigned long long total = 0;
  while (f && fgets(line, sizeof line, f)) {
    const char *keys[] = {"bytes_sent:", "bytes_received:"};
    for (int k = 0; k < 2; k++) {
      const char *at = strstr(line, keys[k]);
      if (at)
        total += strtoull(at + strlen(keys[k]), NULL, 10);
    }
  }
  if (f)
    pclose(f);
  return total;
}

static int compare_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double pct_us(uint64_t *v, size_t n, double p) {
  qsort(v, n, sizeof *v, compare_u64);
  size_t i = (size_t)(p * (double)(n - 1) + 0.5);
  return (double)v[i] / 1e3;
}

int main(int argc, char **argv) {
  size_t n = argc >= 2 ? strtoul(argv[1], NULL, 10) : 0;
  size_t reps = argc >= 3 ? strtoul(argv[2], NULL, 10) : 100;
  if (!n || !reps) {
    fprintf(stderr, "usage: scale_regions N [REPS]\n");
    return 2;
  }
  ferry_engine *t = engine_new();
  char *mem = target_regions(t, n);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%u", ferry_engine_port(t));
  static char local[PAGE];
  memset(local, 0x5a, sizeof local);
  uint64_t *cold = calloc(reps, sizeof *cold), *first = calloc(reps, sizeof *first);
  unsigned long long bytes = 0;
  srand(42);
  for (size_t r = 0; r <= reps; r++) {
    char *page = mem + 2 * ((size_t)rand() % n) * PAGE;
    *(volatile char *)page = 0; /* fault it in (a huge page, maybe) before the clock runs */
    uint64_t remote = (uint64_t)(uintptr_t)page;
    uint64_t t0 = ferry_now_ns();
    ferry_engine *e = engine_new();
    check(ferry_memory_register(e, local, sizeof local), "register the local buffer");
    uint64_t t1 = ferry_now_ns();
    check(ferry_transfer_sync(e, target, FERRY_OP_WRITE, local, remote, sizeof local), "WRITE");
    uint64_t t2 = ferry_now_ns();
    if (r == reps) /* one untimed extra round, for the byte count */
      bytes = wire_bytes(ferry_engine_port(t));
    else
      cold[r] = t2 - t0, first[r] = t2 - t1;
    ferry_engine_destroy(e);
  }
  printf("{\"regions\": %zu, \"reps\": %zu, \"cold_p50_us\": %.1f, \"cold_p99_us\": %.1f, "
         "\"first_p50_us\": %.1f, \"first_p99_us\": %.1f, \"first_bytes\": %llu}\n",
         n, reps, pct_us(cold, reps, 0.5), pct_us(cold, reps, 0.99), pct_us(first, reps, 0.5),
         pct_us(first, reps, 0.99), bytes);
  ferry_engine_destroy(t);
  munmap(mem, 2 * n * PAGE);
  free(cold);
  free(first);
  return 0;
}
