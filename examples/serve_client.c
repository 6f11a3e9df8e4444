/* serve_client.c - the first program most users write: a client of a
 * running `ferry serve`. It asks the target which memory it registered,
 * WRITEs 1 MiB into the start of it, READs it back and compares.
 *
 *   ferry serve --port 7000 &      # prints: ready target=127.0.0.1:7000 addr=0x... size=...
 *   cc serve_client.c $(pkg-config --cflags --libs ferry) -o serve_client
 *   ./serve_client 127.0.0.1:7000
 *
 * With ferry installed under a private prefix, add
 * -Wl,-rpath,"$(pkg-config --variable=libdir ferry)" so the program finds
 * libferry.so.0 without LD_LIBRARY_PATH. */
#include <ferry.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE (1u << 20)

static int check(ferry_status st, const char *what, const char *target) {
  if (st != FERRY_OK)
    fprintf(stderr, "serve_client: %s %s: %s: %s\n", what, target, ferry_strerror(st),
            ferry_last_error());
  return st != FERRY_OK;
}

/* The first region the target registered: `ferry serve` registers one. */
static int first_region(ferry_engine *engine, const char *target, ferry_region *region) {
  ferry_region *regions = NULL;
  size_t count = 0;
  if (check(ferry_peer_regions(engine, target, &regions, &count), "ask the regions of", target))
    return 1;
  int none = count == 0 || regions[0].length < SIZE;
  if (none)
    fprintf(stderr, "serve_client: %s registered no region of 1 MiB or more\n", target);
  else
    *region = regions[0];
  free(regions);
  return none;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: serve_client HOST:PORT   (the target= of `ferry serve`)\n");
    return 2;
  }
  const char *target = argv[1];
  ferry_config cfg;
  ferry_config_init(&cfg); /* defaults, and the environment (FERRY_SECRET, ...) */
  /* This engine only initiates: no peer needs to reach its own port. */
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.log_level = FERRY_LOG_WARN;
  cfg.log_level_set = 1;

  ferry_engine *engine = NULL;
  ferry_region region = {0, 0};
  char *out = NULL, *back = NULL;
  int failed = check(ferry_engine_create(&cfg, &engine), "create an engine for", target);
  /* Memory this side sends from or reads into is registered too. */
  failed = failed || check(ferry_memory_alloc(engine, SIZE, (void **)&out), "allocate", "out");
  failed = failed || check(ferry_memory_alloc(engine, SIZE, (void **)&back), "allocate", "back");
  failed = failed || first_region(engine, target, &region);
  if (!failed) {
    for (size_t i = 0; i < SIZE; i++)
      out[i] = (char)(i * 13 + 1);
    failed = check(ferry_transfer_sync(engine, target, FERRY_OP_WRITE, out, region.addr, SIZE),
                   "write to", target);
    failed =
        failed || check(ferry_transfer_sync(engine, target, FERRY_OP_READ, back, region.addr, SIZE),
                        "read from", target);
  }
  if (!failed && memcmp(out, back, SIZE) != 0) {
    fprintf(stderr, "serve_client: the bytes read back from %s differ\n", target);
    failed = 1;
  }
  if (!failed)
    printf("serve_client: 1 MiB written to %s at 0x%llx and read back, verified\n", target,
           (unsigned long long)region.addr);
  if (engine) {
    ferry_memory_free(engine, out); /* NULL is fine */
    ferry_memory_free(engine, back);
  }
  ferry_engine_destroy(engine);
  return failed;
}
