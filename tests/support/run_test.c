/* run_test.c - runs one test program for ctest so that its skips show as
 * skips. cmocka's skip() still exits 0, so without this a skipped test reads
 * "Passed" in ctest. The program's stdout and stderr are passed through;
 * when it exits 0 having printed cmocka's "[  SKIPPED ]" line, this exits
 * TEST_SKIP_CODE, which ctest's SKIP_RETURN_CODE reports as "Not Run
 * (Skipped)", after one line per skipped test with the reason the test
 * printed ("ferry_run_test: skipped NAME: REASON"; `make test` lists them).
 * A failure always wins over a skip: any other exit status is kept, and a
 * program killed by a signal makes this die of the same signal, so ctest
 * names it. A program may also exit TEST_SKIP_CODE itself.
 *
 * ctest's timeout kill reaches the program through PR_SET_PDEATHSIG; SIGTERM,
 * SIGINT, SIGHUP and SIGQUIT are forwarded, so the fault harness still removes
 * its namespaces. Usage: ferry_run_test PROGRAM [ARGS...] */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TEST_SKIP_CODE /* set by tests/CMakeLists.txt, which gives it to ctest too */
#error "TEST_SKIP_CODE must be defined"
#endif

#define SKIPPED "[  SKIPPED ] " /* cmocka: one such stdout line per skipped test */
#define RUN "[ RUN      ] "
#define MAX_REPORTS 16

/* One of the program's output streams, relayed as it comes and cut into
 * lines (at most sizeof line - 1 bytes of each) for the skip scan. */
typedef struct stream {
  int fd; /* -1 once it ended */
  int to; /* STDOUT_FILENO or STDERR_FILENO */
  char line[512];
  size_t len;
} stream;

typedef struct skips {
  int seen;      /* a SKIPPED line on either stream */
  char why[512]; /* the test's last stdout line since its RUN line: its reason */
  int reports;
  char report[MAX_REPORTS][1100];
} skips;

static volatile pid_t child;

static void forward(int sig) {
  if (child > 0)
    kill(child, sig);
}

static int starts(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void on_line(skips *k, const stream *s, const char *line) {
  if (starts(line, SKIPPED)) {
    k->seen = 1;
    if (s->to == STDOUT_FILENO && k->reports < MAX_REPORTS)
      snprintf(k->report[k->reports++], sizeof k->report[0], "%s: %s", line + strlen(SKIPPED),
               k->why[0] ? k->why : "(the test printed no reason)");
  } else if (s->to == STDOUT_FILENO && starts(line, RUN)) {
    k->why[0] = 0;
  } else if (s->to == STDOUT_FILENO && line[0] && line[0] != '[') {
    snprintf(k->why, sizeof k->why, "%s", line);
  }
}

static void write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; /* nobody reads our output: keep running the test regardless */
    buf += n;
    len -= (size_t)n;
  }
}

/* Reads what is there; 0 at end of file or on error (the stream is done). */
static int pump(stream *s, skips *k) {
  char buf[65536];
  ssize_t n = read(s->fd, buf, sizeof buf);
  if (n < 0 && errno == EINTR)
    return 1;
  if (n <= 0)
    return 0;
  write_all(s->to, buf, (size_t)n);
  for (ssize_t i = 0; i < n; i++) {
    if (buf[i] == '\n') {
      s->line[s->len] = 0;
      on_line(k, s, s->line);
      s->len = 0;
    } else if (s->len < sizeof s->line - 1) {
      s->line[s->len++] = buf[i];
    }
  }
  return 1;
}

/* Relays both streams until the program exited and they are drained.
 * Waiting for end of file alone is not enough: a process it started (a
 * target it forgot to stop) may hold a pipe open, so the exit is watched
 * with a pidfd, and after it only what is already buffered is read. */
static void relay(stream *out, stream *err, pid_t pid, skips *k) {
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  int exited = 0;
  while (out->fd >= 0 || err->fd >= 0) {
    struct pollfd p[3] = {
        {out->fd, POLLIN, 0}, {err->fd, POLLIN, 0}, {exited ? -1 : pidfd, POLLIN, 0}};
    int ready = poll(p, 3, exited ? 0 : -1);
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready <= 0)
      break; /* drained after the exit */
    exited |= (p[2].revents & POLLIN) != 0;
    stream *s[2] = {out, err};
    for (int i = 0; i < 2; i++)
      if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) && !pump(s[i], k)) {
        close(s[i]->fd);
        s[i]->fd = -1;
      }
  }
  if (pidfd >= 0)
    close(pidfd);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
    perror("ferry_run_test: pipe");
    return 2;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    perror("ferry_run_test: fork");
    return 2;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(126);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execv(argv[1], argv + 1);
    fprintf(stderr, "ferry_run_test: cannot run %s: %s\n", argv[1], strerror(errno));
    _exit(127);
  }
  child = pid;
  close(out[1]);
  close(err[1]);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward;
  int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++)
    sigaction(forwarded[i], &sa, NULL);

  stream so = {.fd = out[0], .to = STDOUT_FILENO}, se = {.fd = err[0], .to = STDERR_FILENO};
  static skips k;
  relay(&so, &se, pid, &k);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      perror("ferry_run_test: waitpid");
      return 2;
    }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    raise(sig);
    return 128 + sig;
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 2;
  if (code != 0 || !k.seen)
    return code;
  for (int i = 0; i < k.reports; i++)
    printf("ferry_run_test: skipped %s\n", k.report[i]);
  printf("ferry_run_test: %s exited 0 with skipped tests: reported to ctest as skipped\n", argv[1]);
  return TEST_SKIP_CODE;
}
