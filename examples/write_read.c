/* write_read.c - the smallest ferry program: a target engine registers a
 * buffer, an initiator WRITEs bytes into it and READs them back.
 *
 * Both engines live in this one process so the example runs alone; in a
 * deployment they are two processes (or hosts), and the initiator learns
 * the target's name and buffer address out of band (or from a metadata
 * service: see metadata_segment.c).
 *
 *   cc write_read.c $(pkg-config --cflags --libs ferry) -o write_read */
#include <ferry.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE (1u << 20)

static int check(ferry_status st, const char *what) {
  if (st != FERRY_OK)
    fprintf(stderr, "write_read: %s: %s: %s\n", what, ferry_strerror(st), ferry_last_error());
  return st != FERRY_OK;
}

int main(void) {
  ferry_config cfg;
  ferry_config_init(&cfg); /* defaults, and the environment (FERRY_*, MC_*) */
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.log_level = FERRY_LOG_WARN;
  cfg.log_level_set = 1;

  ferry_engine *target = NULL, *initiator = NULL;
  char *landing = calloc(1, SIZE), *out = malloc(SIZE), *back = calloc(1, SIZE);
  int failed = !landing || !out || !back;
  failed = failed || check(ferry_engine_create(&cfg, &target), "create the target");
  failed = failed || check(ferry_engine_create(&cfg, &initiator), "create the initiator");
  /* Peers may only touch registered memory, on either side. */
  failed = failed || check(ferry_memory_register(target, landing, SIZE), "register landing");
  failed = failed || check(ferry_memory_register(initiator, out, SIZE), "register out");
  failed = failed || check(ferry_memory_register(initiator, back, SIZE), "register back");
  if (!failed) {
    for (size_t i = 0; i < SIZE; i++)
      out[i] = (char)(i * 7);
    const char *name = ferry_engine_name(target); /* "127.0.0.1:PORT" */
    uint64_t remote = (uint64_t)(uintptr_t)landing;
    /* Returns once the target has acknowledged that the bytes are there. */
    failed =
        check(ferry_transfer_sync(initiator, name, FERRY_OP_WRITE, out, remote, SIZE), "write");
    failed = failed ||
             check(ferry_transfer_sync(initiator, name, FERRY_OP_READ, back, remote, SIZE), "read");
  }
  if (!failed && (memcmp(landing, out, SIZE) || memcmp(back, out, SIZE))) {
    fprintf(stderr, "write_read: the bytes differ\n");
    failed = 1;
  }
  if (!failed)
    printf("write_read: 1 MiB written and read back, verified\n");
  ferry_engine_destroy(initiator); /* NULL is fine */
  ferry_engine_destroy(target);
  free(landing);
  free(out);
  free(back);
  return failed;
}
