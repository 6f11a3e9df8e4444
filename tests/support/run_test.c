/* run_test.c - runs one test program for ctest so that its skips show as
 * skips. cmocka's skip() still exits 0, so without this a skipped test reads
 * "Passed" in ctest. The program's output (stdout and stderr, merged) is
 * passed through; when it exits 0 having printed cmocka's "[  SKIPPED ]"
 * line, this exits TEST_SKIP_CODE, which ctest's SKIP_RETURN_CODE reports as
 * "Not Run (Skipped)". A failure always wins over a skip: any other exit
 * status is kept, and a program killed by a signal makes this die of the same
 * signal, so ctest names it. A program may also exit TEST_SKIP_CODE itself.
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
#include <stdint.h>
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

static const char skipped_prefix[] = "[  SKIPPED ]";

static volatile pid_t child;

static void forward(int sig) {
  if (child > 0)
    kill(child, sig);
}

/* Finds skipped_prefix at the start of a line, across read boundaries. */
typedef struct scanner {
  size_t matched; /* bytes of the prefix matched on this line; SIZE_MAX: no match */
  int found;
} scanner;

static void scan(scanner *s, const char *buf, size_t len) {
  for (size_t i = 0; i < len; i++) {
    if (buf[i] == '\n') {
      s->matched = 0;
    } else if (s->matched != SIZE_MAX) {
      if (buf[i] != skipped_prefix[s->matched]) {
        s->matched = SIZE_MAX;
      } else if (++s->matched == sizeof skipped_prefix - 1) {
        s->found = 1;
        s->matched = SIZE_MAX;
      }
    }
  }
}

static void write_all(const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(STDOUT_FILENO, buf, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; /* nobody reads our output: keep running the test regardless */
    buf += n;
    len -= (size_t)n;
  }
}

/* Copies what the program writes until it exits. Waiting for end of file
 * alone is not enough: a process it started (a target it forgot to stop)
 * may hold the pipe open, so the program's exit is watched with a pidfd and
 * the pipe drained without blocking once it happened. */
static void relay(int out, pid_t pid, scanner *s) {
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  int exited = 0;
  char buf[65536];
  for (;;) {
    if (!exited) {
      struct pollfd p[2] = {{out, POLLIN, 0}, {pidfd, POLLIN, 0}};
      if (poll(p, pidfd >= 0 ? 2 : 1, -1) < 0) {
        if (errno == EINTR)
          continue;
        break;
      }
      if (pidfd >= 0 && (p[1].revents & POLLIN)) {
        exited = 1;
        fcntl(out, F_SETFL, fcntl(out, F_GETFL) | O_NONBLOCK);
      }
    }
    ssize_t n = read(out, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break; /* end of file, or drained after the exit */
    write_all(buf, (size_t)n);
    scan(s, buf, (size_t)n);
  }
  if (pidfd >= 0)
    close(pidfd);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) {
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
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execv(argv[1], argv + 1);
    fprintf(stderr, "ferry_run_test: cannot run %s: %s\n", argv[1], strerror(errno));
    _exit(127);
  }
  child = pid;
  close(fds[1]);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward;
  int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++)
    sigaction(forwarded[i], &sa, NULL);

  scanner s = {0, 0};
  relay(fds[0], pid, &s);
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
  if (code == 0 && s.found) {
    printf("ferry_run_test: %s exited 0 but skipped tests (listed above, with the reason): "
           "reported to ctest as skipped\n",
           argv[1]);
    return TEST_SKIP_CODE;
  }
  return code;
}
