/* harness.c - see harness.h. */
#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "core/engine.h"

double test_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *test_tool_path(void) {
  const char *tool = getenv("FERRY_TOOL");
  return tool && *tool ? tool : "./ferry";
}

int test_read_line(int fd, char *line, size_t size, int timeout_ms) {
  size_t used = 0;
  double deadline = test_now_s() + timeout_ms / 1000.0;
  while (used + 1 < size) {
    int left = (int)((deadline - test_now_s()) * 1000);
    struct pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0)
      return -1;
    ssize_t n = read(fd, line + used, 1);
    if (n <= 0)
      return -1;
    if (line[used] == '\n')
      break;
    used++;
  }
  line[used] = 0;
  return 0;
}

static int parse_ready(test_target *t, const char *line) {
  char target[64];
  unsigned long long addr, size;
  if (sscanf(line, "ready target=%63s addr=%llx size=%llu", target, &addr, &size) != 3)
    return -1;
  snprintf(t->target, sizeof t->target, "%s", target);
  const char *colon = strrchr(target, ':');
  t->port = colon ? (uint16_t)atoi(colon + 1) : 0;
  t->addr = addr;
  t->size = size;
  return 0;
}

pid_t test_tool_start(const char *const *argv, char *line, size_t size) {
  int fds[2];
  if (pipe(fds) < 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a crashed test */
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  int rc = pid > 0 ? test_read_line(fds[0], line, size, TEST_SETUP_MS) : -1;
  close(fds[0]);
  if (rc != 0 && pid > 0)
    test_kill_and_reap(pid, TEST_SETUP_MS);
  return rc == 0 ? pid : -1;
}

int test_target_start(test_target *t, uint16_t port, uint64_t size, const char *const *extra) {
  char port_s[16], size_s[32];
  snprintf(port_s, sizeof port_s, "%u", port);
  snprintf(size_s, sizeof size_s, "%llu", (unsigned long long)size);
  const char *argv[32] = {test_tool_path(), "serve", "--host", "127.0.0.1",
                          "--port",         port_s,  "--size", size_s};
  int argc = 8;
  for (int i = 0; extra && extra[i] && argc < 31; i++)
    argv[argc++] = extra[i];
  argv[argc] = NULL;
  memset(t, 0, sizeof *t);
  char line[512];
  t->pid = test_tool_start(argv, line, sizeof line);
  if (t->pid <= 0)
    return -1;
  int rc = parse_ready(t, line);
  if (rc != 0)
    test_target_kill(t);
  return rc;
}

int test_target_restart(test_target *t, uint16_t port, uint64_t size) {
  int started = -1;
  for (int attempt = 0; attempt < 50 && started != 0; attempt++) {
    started = test_target_start(t, port, size, NULL);
    if (started != 0)
      usleep(100 * 1000); /* the port may linger for a moment */
  }
  return started;
}

int test_wait_exit(pid_t pid, int timeout_ms, int *status) {
  for (int waited = 0; waited <= timeout_ms; waited += 5) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid)
      return 0;
    if (r < 0)
      return -1;
    struct timespec ts = {0, 5 * 1000000};
    nanosleep(&ts, NULL);
  }
  return -2;
}

void test_kill_and_reap(pid_t pid, int timeout_ms) {
  /* SIGKILL alone: it ends a stopped process too, where a SIGCONT sent
   * first would let a paused target run (and answer) for a moment. */
  kill(pid, SIGKILL);
  int status;
  test_wait_exit(pid, timeout_ms, &status);
}

void test_stop_expect_clean_exit(pid_t pid, const char *what) {
  int status = -1;
  kill(pid, SIGTERM);
  assert_int_equal(test_wait_exit(pid, TEST_SETUP_MS, &status), 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("%s exited with status 0x%x", what, status);
}

int test_target_stop(test_target *t) {
  if (t->pid <= 0)
    return -1;
  kill(t->pid, SIGTERM);
  int status;
  int rc = test_wait_exit(t->pid, TEST_SETUP_MS, &status);
  if (rc == -2) {
    kill(t->pid, SIGKILL);
    rc = test_wait_exit(t->pid, 5000, &status);
  }
  t->pid = 0;
  return rc == 0 ? status : rc;
}

void test_target_kill(test_target *t) {
  if (t->pid <= 0)
    return;
  test_kill_and_reap(t->pid, 5000);
  t->pid = 0;
}

void test_engine_set_timeouts(ferry_engine *e, uint32_t timeout_ms, uint32_t connect_timeout_ms) {
  if (timeout_ms)
    e->cfg.timeout_ms = timeout_ms;
  if (connect_timeout_ms)
    e->cfg.connect_timeout_ms = connect_timeout_ms;
}

uint64_t test_await_in_flight(ferry_engine *e, uint64_t n, int timeout_ms) {
  double until = test_now_s() + timeout_ms / 1000.0;
  for (;;) {
    ferry_stats *stats;
    assert_int_equal(ferry_stats_snapshot(e, &stats), FERRY_OK);
    uint64_t now = stats->batches_in_flight;
    ferry_stats_free(stats);
    if (now >= n || test_now_s() > until)
      return now;
    usleep(1000);
  }
}

void test_config(ferry_config *cfg) {
  ferry_config_init(cfg);
  cfg->bind_host = cfg->advertise_host = "127.0.0.1";
}

ferry_engine *test_engine_create(const ferry_config *cfg) {
  ferry_engine *e = NULL;
  if (ferry_engine_create(cfg, &e) != FERRY_OK)
    fail_msg("engine create failed: %s", ferry_last_error());
  return e;
}

ferry_engine *test_engine(const char *secret) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.secret = secret;
  cfg.timeout_ms = TEST_SETUP_MS; /* a test whose point is a timeout makes its own engine */
  ferry_engine *e = NULL;
  if (ferry_engine_create(&cfg, &e) != FERRY_OK) {
    fprintf(stderr, "engine create failed: %s\n", ferry_last_error());
    return NULL;
  }
  return e;
}

ferry_engine *test_engine_tcp(void) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_TCP;
  cfg.timeout_ms = TEST_SETUP_MS;
  return test_engine_create(&cfg);
}

void *test_buffer(ferry_engine *e, size_t size) {
  void *buf = malloc(size);
  if (buf && ferry_memory_register(e, buf, size) != FERRY_OK) {
    free(buf);
    return NULL;
  }
  return buf;
}

void test_round_trip(ferry_engine *e, const char *target, uint8_t *out, uint8_t *in,
                     uint64_t remote, size_t size, uint64_t seed) {
  test_fill_random(out, size, seed);
  assert_int_equal(ferry_transfer_sync(e, target, FERRY_OP_WRITE, out, remote, size), FERRY_OK);
  assert_int_equal(ferry_transfer_sync(e, target, FERRY_OP_READ, in, remote, size), FERRY_OK);
  assert_memory_equal(out, in, size);
}

void test_fill_random(void *buf, size_t size, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  uint8_t *p = buf;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(p + i, &x, 8);
  }
  for (; i < size; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = (uint8_t)x;
  }
}
