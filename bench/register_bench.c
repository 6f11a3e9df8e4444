/* register_bench.c - what registering many regions costs: N one-page
 * regions registered one call each, then unregistered one call each (each
 * unregister is a fence on every transport), and the same N through the
 * batch calls. The registration hook of a new transport (fabric: fi_mr_reg
 * per region) lands on these paths; bench/run shows them at 10,000 and
 * 100,000 regions. One JSON line on stdout.
 *
 *   register_bench N
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "../src/core/clock.h"
#include "ferry.h"

static void check(ferry_status st, const char *what) {
  if (st) {
    fprintf(stderr, "register_bench: %s: %s\n", what, ferry_last_error());
    exit(1);
  }
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
  /* Pages two apart, so no two regions are adjacent. */
  size_t page = 4096;
  char *mem = mmap(NULL, 2 * n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void **addrs = malloc(n * sizeof *addrs);
  size_t *lens = malloc(n * sizeof *lens);
  if (mem == MAP_FAILED || !addrs || !lens)
    return fprintf(stderr, "register_bench: no memory\n"), 1;
  for (size_t i = 0; i < n; i++)
    addrs[i] = mem + 2 * i * page, lens[i] = page;

  uint64_t t0 = ferry_now_ns();
  for (size_t i = 0; i < n; i++)
    check(ferry_memory_register(e, addrs[i], page), "register");
  uint64_t t1 = ferry_now_ns();
  for (size_t i = 0; i < n; i++)
    check(ferry_memory_unregister(e, addrs[i]), "unregister");
  uint64_t t2 = ferry_now_ns();
  check(ferry_memory_register_batch(e, addrs, lens, n), "register batch");
  uint64_t t3 = ferry_now_ns();
  check(ferry_memory_unregister_batch(e, addrs, n), "unregister batch");
  uint64_t t4 = ferry_now_ns();

  printf("{\"regions\": %zu, \"register_us\": %.3f, \"unregister_us\": %.3f, "
         "\"batch_register_ms\": %.3f, \"batch_unregister_ms\": %.3f}\n",
         n, (double)(t1 - t0) / 1e3 / (double)n, (double)(t2 - t1) / 1e3 / (double)n,
         (double)(t3 - t2) / 1e6, (double)(t4 - t3) / 1e6);
  ferry_engine_destroy(e);
  free(addrs);
  free(lens);
  munmap(mem, 2 * n * page);
  return 0;
}
