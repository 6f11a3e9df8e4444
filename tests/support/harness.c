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

static const char *tool_path(void) {
  const char *tool = getenv("FERRY_TOOL");
  return tool ? tool : "./ferry";
}

static int read_line(int fd, char *line, size_t size, int timeout_ms) {
  size_t used = 0;
  while (used + 1 < size) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0)
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

int test_target_start(test_target *t, uint16_t port, uint64_t size, const char *const *extra) {
  int fds[2];
  if (pipe(fds) < 0)
    return -1;
  char port_s[16], size_s[32];
  snprintf(port_s, sizeof port_s, "%u", port);
  snprintf(size_s, sizeof size_s, "%llu", (unsigned long long)size);
  const char *argv[32] = {tool_path(), "serve", "--host", "127.0.0.1",
                          "--port",    port_s,  "--size", size_s};
  int argc = 8;
  for (int i = 0; extra && extra[i] && argc < 31; i++)
    argv[argc++] = extra[i];
  argv[argc] = NULL;
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
  memset(t, 0, sizeof *t);
  t->pid = pid;
  char line[512];
  int rc = pid > 0 ? read_line(fds[0], line, sizeof line, 10000) : -1;
  close(fds[0]);
  if (rc == 0)
    rc = parse_ready(t, line);
  if (rc != 0 && pid > 0)
    test_target_kill(t);
  return rc;
}

static int wait_exit(pid_t pid, int timeout_ms) {
  for (int waited = 0; waited <= timeout_ms; waited += 10) {
    int status;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid)
      return status;
    if (r < 0)
      return -1;
    struct timespec ts = {0, 10 * 1000000};
    nanosleep(&ts, NULL);
  }
  return -2;
}

int test_target_stop(test_target *t) {
  if (t->pid <= 0)
    return -1;
  kill(t->pid, SIGTERM);
  int status = wait_exit(t->pid, 5000);
  if (status == -2) {
    kill(t->pid, SIGKILL);
    status = wait_exit(t->pid, 5000);
  }
  t->pid = 0;
  return status;
}

void test_target_kill(test_target *t) {
  if (t->pid <= 0)
    return;
  kill(t->pid, SIGCONT);
  kill(t->pid, SIGKILL);
  wait_exit(t->pid, 5000);
  t->pid = 0;
}

ferry_engine *test_engine(const char *secret) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = "127.0.0.1";
  cfg.advertise_host = "127.0.0.1";
  cfg.secret = secret;
  ferry_engine *e = NULL;
  if (ferry_engine_create(&cfg, &e) != FERRY_OK) {
    fprintf(stderr, "engine create failed: %s\n", ferry_last_error());
    return NULL;
  }
  return e;
}

void *test_buffer(ferry_engine *e, size_t size) {
  void *buf = malloc(size);
  if (buf && ferry_memory_register(e, buf, size) != FERRY_OK) {
    free(buf);
    return NULL;
  }
  return buf;
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
