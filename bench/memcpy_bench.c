/* memcpy_bench.c - single-thread memcpy baseline for bench/run: copies one
 * buffer of each given size into another, over and over for a fixed time,
 * and prints one JSON line per size with the rate in GB/s (1e9 bytes/s).
 *
 *   memcpy_bench [-t SECONDS] SIZE...   sizes take K/M/G suffixes (powers of 2)
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_common.h"

static void *map(size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("memcpy_bench: mmap");
    exit(1);
  }
  memset(p, 0x11, n); /* fault every page in before timing */
  return p;
}

/* Copies for about `seconds`; checks the clock only every `per_check`
 * copies so that small sizes measure memcpy, not clock_gettime. */
static void measure(size_t size, double seconds) {
  char *src = map(size), *dst = map(size);
  size_t per_check = size >= (1 << 20) ? 1 : (1 << 20) / size;
  uint64_t copies = 0, start = ferry_now_ns(), end = start + (uint64_t)(seconds * 1e9), t = start;
  while (t < end) {
    for (size_t i = 0; i < per_check; i++) {
      memcpy(dst, src, size);
      __asm__ volatile("" : : "r"(dst), "r"(src) : "memory"); /* keep every copy */
    }
    copies += per_check;
    t = ferry_now_ns();
  }
  double secs = (double)(t - start) / 1e9;
  double bytes = (double)copies * (double)size;
  printf("{\"block\":%zu,\"copies\":%llu,\"seconds\":%.4f,\"gbps\":%.4f}\n", size,
         (unsigned long long)copies, secs, bytes / secs / 1e9);
  fflush(stdout);
  munmap(src, size);
  munmap(dst, size);
}

int main(int argc, char **argv) {
  int i = 1;
  double seconds = 1.0;
  if (argc > 2 && strcmp(argv[1], "-t") == 0) {
    seconds = atof(argv[2]);
    i = 3;
  }
  if (i >= argc || !(seconds > 0)) {
    fprintf(stderr, "usage: memcpy_bench [-t SECONDS] SIZE...\n");
    return 2;
  }
  for (; i < argc; i++) {
    size_t size = parse_size(argv[i]);
    if (size == 0) {
      fprintf(stderr, "memcpy_bench: bad size '%s'\n", argv[i]);
      return 2;
    }
    measure(size, seconds);
  }
  return 0;
}
