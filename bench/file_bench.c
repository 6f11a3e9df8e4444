/* file_bench.c - sequential READ or WRITE of a file through FILE memory
 * (ferry_file_*), the figure bench/run's file section sets beside fio's on
 * the same file, block size and queue depth. One JSON line.
 *
 *   file_bench PATH read|write BLOCK DEPTH FILE_BYTES SECONDS [buffered]
 *
 * One engine with file_queue_depth = DEPTH; one batch per pass over the
 * file: FILE_BYTES / BLOCK entries of BLOCK bytes at offsets 0, BLOCK, ...
 * (each one operation, DEPTH in flight), their memory a ring of DEPTH
 * registered page-aligned blocks. Passes repeat until SECONDS passed (at
 * least one); GB/s = bytes moved / time. PATH is opened O_RDWR (created
 * when missing); a READ needs FILE_BYTES in it (bench/run writes it first).
 * O_DIRECT is used where the file system takes it, unless "buffered". */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/base/clock.h"
#define BENCH_PROG "file_bench"
#include "bench_common.h"
#include "bench_engine.h"
#include "ferry.h"

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr,
            "usage: file_bench PATH read|write BLOCK DEPTH FILE_BYTES SECONDS [buffered]\n");
    return 2;
  }
  const char *path = argv[1];
  ferry_op op = strcmp(argv[2], "write") == 0 ? FERRY_OP_WRITE : FERRY_OP_READ;
  size_t block = parse_size(argv[3]), bytes = parse_size(argv[5]);
  unsigned depth = (unsigned)atoi(argv[4]);
  double seconds = atof(argv[6]);
  int buffered = argc > 7 && strcmp(argv[7], "buffered") == 0;
  if (!block || !depth || bytes < block) {
    fprintf(stderr, "file_bench: BLOCK, DEPTH and FILE_BYTES >= BLOCK must be positive\n");
    return 2;
  }
  size_t count = bytes / block;

  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = FERRY_TRANSPORT_TCP;
  cfg.workers = depth; /* threads ready before the clock starts */
  cfg.file_queue_depth = depth;
  ferry_engine *e;
  check(ferry_engine_create(&cfg, &e), "engine");

  int fd = open(path, O_RDWR | O_CREAT, 0600);
  if (fd < 0) {
    perror("file_bench: open");
    return 1;
  }
  ferry_file *f;
  check(ferry_file_register(e, fd, buffered ? FERRY_FILE_BUFFERED : 0, &f), "register file");
  char why[160];
  size_t align = 0;
  int direct = ferry_file_direct(f, &align, why, sizeof why);

  uint8_t *ring = NULL;
  if (posix_memalign((void **)&ring, 4096, (size_t)depth * block) != 0) {
    fprintf(stderr, "file_bench: no memory for %u x %zu bytes\n", depth, block);
    return 1;
  }
  memset(ring, 0x5a, (size_t)depth * block);
  check(ferry_memory_register(e, ring, (size_t)depth * block), "register memory");
  ferry_entry *entries = calloc(count, sizeof *entries);
  for (size_t i = 0; i < count; i++)
    entries[i] = (ferry_entry){op, ring + (i % depth) * block, (uint64_t)i * block, block};

  uint64_t moved = 0, t0 = ferry_now_ns();
  unsigned passes = 0;
  do {
    ferry_batch *b;
    check(ferry_file_submit(e, f, entries, count, 0, &b), "submit");
    check(ferry_batch_wait(b, -1), "pass");
    ferry_batch_free(b);
    moved += (uint64_t)count * block;
    passes++;
  } while ((double)(ferry_now_ns() - t0) / 1e9 < seconds);
  double s = (double)(ferry_now_ns() - t0) / 1e9;

  printf("{\"op\": \"%s\", \"block\": %zu, \"depth\": %u, \"file_bytes\": %zu, \"passes\": %u, "
         "\"bytes\": %llu, \"seconds\": %.4f, \"gbps\": %.4f, \"direct\": %s, \"align\": %zu, "
         "\"why\": \"%s\"}\n",
         op == FERRY_OP_WRITE ? "write" : "read", block, depth, count * block, passes,
         (unsigned long long)moved, s, (double)moved / s / 1e9, direct ? "true" : "false", align,
         why);
  check(ferry_file_unregister(e, f), "unregister file");
  check(ferry_memory_unregister(e, ring), "unregister memory");
  ferry_engine_destroy(e);
  free(entries);
  free(ring);
  close(fd);
  return 0;
}
