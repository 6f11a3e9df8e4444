/* register_bench.c - what registering many regions costs: N one-page
 * regions registered one call each, then unregistered one call each (each
 * unregister is a fence on every transport), and the same N through the
 * batch calls, plus the target's memory per registered region (heap growth
 * over the one-call-each registers). The registration hook of a new transport
 * (fabric: fi_mr_reg per region) lands on these paths; bench/run shows them
 * in the register and scale sections. The one-call-each unregister stops
 * after UNREGISTER_BUDGET_S seconds (the rest go in the batch call), so an
 * O(n) unregister cannot make the run quadratic; "unregistered" says how
 * many it reached. One JSON line on stdout.
 *
 *   register_bench N
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "../src/base/clock.h"
#include "ferry.h"

#define UNREGISTER_BUDGET_S 10

static void check(ferry_status st, const char *what) {
  if (st) {
    fprintf(stderr, "register_bench: %s: %s\n", what, ferry_last_error());
    exit(1);
  }
}

static size_t heap_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

int main(int argc, char **argv) {
  size_t n = argc == 2 ? strtoul(argv[1], NULL, 10) : 0;
  if (!n) {
    fprintf(stderr, "usage: register_bench N\n");
    return 2;
  }
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.port = 0;
  ferry_engine *e;
  check(ferry_engine_create(&cfg, &e), "engine");
  /* Pages two apart, so no two regions are adjacent; never touched. */
  size_t page = 4096;
  char *mem = mmap(NULL, 2 * n * page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void **addrs = malloc(n * sizeof *addrs);
  size_t *lens = malloc(n * sizeof *lens);
  if (mem == MAP_FAILED || !addrs || !lens)
    return fprintf(stderr, "register_bench: no memory\n"), 1;
  for (size_t i = 0; i < n; i++)
    addrs[i] = mem + 2 * i * page, lens[i] = page;

  size_t heap0 = heap_bytes();
  uint64_t t0 = ferry_now_ns();
  for (size_t i = 0; i < n; i++)
    check(ferry_memory_register(e, addrs[i], page), "register");
  size_t heap1 = heap_bytes();
  uint64_t t1 = ferry_now_ns(), stop = t1 + UNREGISTER_BUDGET_S * 1000000000ull;
  size_t done = 0;
  while (done < n && (done % 1024 || ferry_now_ns() < stop))
    check(ferry_memory_unregister(e, addrs[done++]), "unregister");
  uint64_t t2 = ferry_now_ns();
  if (done < n)
    check(ferry_memory_unregister_batch(e, addrs + done, n - done), "unregister the rest");
  uint64_t t3 = ferry_now_ns();
  check(ferry_memory_register_batch(e, addrs, lens, n), "register batch");
  uint64_t t4 = ferry_now_ns();
  check(ferry_memory_unregister_batch(e, addrs, n), "unregister batch");
  uint64_t t5 = ferry_now_ns();

  printf("{\"regions\": %zu, \"register_us\": %.3f, \"unregister_us\": %.3f, "
         "\"unregistered\": %zu, \"batch_register_ms\": %.3f, \"batch_unregister_ms\": %.3f, "
         "\"bytes_per_region\": %.1f}\n",
         n, (double)(t1 - t0) / 1e3 / (double)n, (double)(t2 - t1) / 1e3 / (double)done, done,
         (double)(t4 - t3) / 1e6, (double)(t5 - t4) / 1e6,
         heap1 > heap0 ? (double)(heap1 - heap0) / (double)n : 0.0);
  ferry_engine_destroy(e);
  free(addrs);
  free(lens);
  munmap(mem, 2 * n * page);
  return 0;
}
