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

/* The bound of a step that is not a test's point: a process's start, a
 * first contact (handshake, a fabric endpoint), a warm-up. Generous: on a
 * busy machine a sanitizer build's fabric engine takes tens of seconds to
 * start. Only what a test is about gets a short bound. */
#define TEST_SETUP_MS 60000

/* Starts `$FERRY_TOOL serve --host 127.0.0.1 --port PORT --size SIZE [extra...]`
 * and waits (TEST_SETUP_MS at most) for its ready line. extra is
 * NULL-terminated. */
int test_target_start(test_target *t, uint16_t port, uint64_t size, const char *const *extra);
/* test_target_start on a port (with no extra arguments) that its previous
 * process may still hold for a moment: retries for about 5 s. */
int test_target_restart(test_target *t, uint16_t port, uint64_t size);
/* SIGTERM, then SIGKILL after TEST_SETUP_MS; returns the exit status. */
int test_target_stop(test_target *t);
void test_target_kill(test_target *t); /* SIGKILL, reaped */

/* ---- process plumbing, shared with the fault tests ---- */

/* Starts argv (argv[0] a path; NULL-terminated) with its stdout on a pipe
 * and reads its first line into line, waiting TEST_SETUP_MS at most. The
 * child is killed if this process dies. Its pid, or -1 (killed and reaped
 * when it printed no line). */
pid_t test_tool_start(const char *const *argv, char *line, size_t size);
/* The ferry tool to run: $FERRY_TOOL, or ./ferry when that is unset or empty. */
const char *test_tool_path(void);
/* Reads one line from fd into line (without the newline), waiting at most
 * timeout_ms for all of it. 0, or -1 on timeout, error or end of file. */
int test_read_line(int fd, char *line, size_t size, int timeout_ms);
/* Waits at most timeout_ms for pid to exit and reaps it: 0 with *status
 * set, -1 if waitpid fails, -2 on timeout. */
int test_wait_exit(pid_t pid, int timeout_ms, int *status);
/* SIGKILL (which also ends a stopped process, without letting it run
 * first), then reaps it, waiting at most timeout_ms. */
void test_kill_and_reap(pid_t pid, int timeout_ms);
/* SIGTERM, then fails the running test (cmocka) unless the process, named
 * what, exits with status 0 within TEST_SETUP_MS (under ASan: after its
 * leak check). */
void test_stop_expect_clean_exit(pid_t pid, const char *what);
/* Monotonic seconds. */
double test_now_s(void);

/* Sets an engine's config timeout_ms and connect_timeout_ms between its
 * calls (none may run meanwhile; 0 keeps a value). A call reads them when it
 * starts, so this is the per-call deadline ferry.h does not offer: a test
 * gives a first contact TEST_SETUP_MS and the short bound only to the calls
 * whose timing it is about. */
void test_engine_set_timeouts(ferry_engine *e, uint32_t timeout_ms, uint32_t connect_timeout_ms);

/* Polls e's stats (asserting the snapshot works) until n of its batches are
 * in flight or timeout_ms passed; returns the last count, below n on
 * timeout. For a test that acts while transfers are on the wire instead of
 * timing them. */
uint64_t test_await_in_flight(ferry_engine *e, uint64_t n, int timeout_ms);

/* ferry_config_init, then bind and advertise 127.0.0.1 (never the
 * machine's own address). */
void test_config(ferry_config *cfg);
/* ferry_engine_create, or fails the running test (cmocka) with the cause. */
ferry_engine *test_engine_create(const ferry_config *cfg);
/* An engine on 127.0.0.1, port 0, with optional secret (NULL); its
 * transfer timeout is TEST_SETUP_MS. */
ferry_engine *test_engine(const char *secret);
/* An engine on 127.0.0.1 with the tcp transport alone (device memory
 * staged, no shm shortcut between engines of one process), transfer
 * timeout TEST_SETUP_MS; fails the running test (cmocka) if none. */
ferry_engine *test_engine_tcp(void);
/* malloc'd buffer registered on the engine. */
void *test_buffer(ferry_engine *e, size_t size);
void test_fill_random(void *buf, size_t size, uint64_t seed);
/* Fills out with test_fill_random(seed), WRITEs it to remote on target,
 * READs it back into in and asserts (cmocka) that both calls succeed and
 * the bytes match. */
void test_round_trip(ferry_engine *e, const char *target, uint8_t *out, uint8_t *in,
                     uint64_t remote, size_t size, uint64_t seed);

#endif
