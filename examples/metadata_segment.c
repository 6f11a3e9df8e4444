/* metadata_segment.c - peers found by name through a metadata service
 * instead of by "host:port": the target publishes itself as segment
 * "example-target" (with its registered regions), the initiator looks it
 * up by that name. Mooncake's key layout, so Mooncake tools can read it.
 *
 *   ferry metadata-server --port 0        # prints its url=...
 *   cc metadata_segment.c $(pkg-config --cflags --libs ferry) -o metadata_segment
 *   ./metadata_segment http://127.0.0.1:PORT/metadata */
#include <ferry.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE (64u << 10)

static int check(ferry_status st, const char *what) {
  if (st != FERRY_OK)
    fprintf(stderr, "metadata_segment: %s: %s: %s\n", what, ferry_strerror(st), ferry_last_error());
  return st != FERRY_OK;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s METADATA_URL\n", argv[0]);
    return 2;
  }
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.metadata_url = argv[1];
  cfg.log_level = FERRY_LOG_WARN;
  cfg.log_level_set = 1;

  ferry_engine *target = NULL, *initiator = NULL;
  void *dst = NULL, *src = NULL;
  cfg.segment_name = "example-target";
  int failed = check(ferry_engine_create(&cfg, &target), "create the target");
  cfg.segment_name = "example-initiator";
  failed = failed || check(ferry_engine_create(&cfg, &initiator), "create the initiator") ||
           check(ferry_memory_alloc(target, SIZE, &dst), "alloc on the target") ||
           check(ferry_memory_alloc(initiator, SIZE, &src), "alloc on the initiator");
  /* The initiator needs only the name: the regions come from the service. */
  ferry_region *regions = NULL;
  size_t count = 0;
  failed = failed || check(ferry_peer_regions(initiator, "example-target", &regions, &count),
                           "look up example-target's regions");
  if (!failed && count != 1) {
    fprintf(stderr, "metadata_segment: expected 1 region, got %zu\n", count);
    failed = 1;
  }
  if (!failed) {
    memset(src, 0x5a, SIZE);
    failed = check(ferry_transfer_sync(initiator, "example-target", FERRY_OP_WRITE, src,
                                       regions[0].addr, SIZE),
                   "write to example-target");
  }
  if (!failed && memcmp(dst, src, SIZE) != 0) {
    fprintf(stderr, "metadata_segment: the bytes differ\n");
    failed = 1;
  }
  if (!failed)
    printf("metadata_segment: found example-target by name, 64 KiB written, verified\n");
  free(regions);
  ferry_engine_destroy(initiator); /* unpublishes its segment */
  ferry_engine_destroy(target);
  return failed;
}
