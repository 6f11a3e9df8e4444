/* harness.h - helpers shared by the integration tests: starting a target
 * process (`ferry serve`) and reading its ready line, stopping it, and
 * making engines pinned to loopback. */
#ifndef FERRY_TEST_HARNESS_H
#define FERRY_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry.h"

typedef struct test_target {
  pid_t pid;
  char target[64]; /* "127.0.0.1:PORT" */
  uint16_t port;
  uint64_t addr; /* its registered buffer */
  uint64_t size;
} test_target;

/* Starts `$FERRY_TOOL serve --host 127.0.0.1 --port PORT --size SIZE [extra...]`
 * and waits (10 s at most) for its ready line. extra is NULL-terminated. */
int test_target_start(test_target *t, uint16_t port, uint64_t size, const char *const *extra);
/* SIGTERM, then SIGKILL after 5 s; returns the exit status. */
int test_target_stop(test_target *t);
void test_target_kill(test_target *t); /* SIGKILL, reaped */

/* An engine on 127.0.0.1, port 0, with optional secret (NULL). */
ferry_engine *test_engine(const char *secret);
/* malloc'd buffer registered on the engine. */
void *test_buffer(ferry_engine *e, size_t size);
void test_fill_random(void *buf, size_t size, uint64_t seed);

#endif
