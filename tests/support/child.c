/* child.c - test roles run in processes of their own (see child.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "child.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define CHILD_FLAG "--ferry-test-child"
#define MAX_ARGS 32

void test_child_main(int argc, char **argv, const test_child_role *roles, size_t count) {
  if (argc < 3 || strcmp(argv[1], CHILD_FLAG) != 0)
    return;
  for (size_t i = 0; i < count; i++)
    if (strcmp(roles[i].name, argv[2]) == 0)
      exit(roles[i].run(argc - 3, argv + 3));
  fprintf(stderr, "%s: no test child role named %s\n", argv[0], argv[2]);
  exit(127);
}

static void close_fd(int fd) {
  if (fd >= 0)
    close(fd);
}

pid_t test_child_start(const char *role, const char *const *args, int *to_child, int *from_child) {
  static char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0)
    return -1;
  self[len] = 0;
  const char *argv[MAX_ARGS + 1] = {self, CHILD_FLAG, role};
  int argc = 3;
  for (int i = 0; args && args[i]; i++) {
    if (argc == MAX_ARGS)
      return -1;
    argv[argc++] = args[i];
  }
  argv[argc] = NULL;
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if ((to_child && pipe2(in, O_CLOEXEC) < 0) || (from_child && pipe2(out, O_CLOEXEC) < 0)) {
    close_fd(in[0]);
    close_fd(in[1]);
    return -1;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    /* Between fork and exec: async-signal-safe calls only. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(126);
    if ((in[0] >= 0 && dup2(in[0], STDIN_FILENO) < 0) ||
        (out[1] >= 0 && dup2(out[1], STDOUT_FILENO) < 0))
      _exit(125);
    execv(self, (char *const *)argv);
    _exit(127);
  }
  close_fd(in[0]);
  close_fd(out[1]);
  if (pid < 0) {
    close_fd(in[1]);
    close_fd(out[0]);
    return -1;
  }
  if (to_child)
    *to_child = in[1];
  if (from_child)
    *from_child = out[0];
  return pid;
}
