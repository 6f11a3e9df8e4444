/* sync_stall.c - an LD_PRELOAD shim for tests, loaded into a child process
 * only (it is not part of ferry_test_support): while the file
 * $FERRY_SYNC_STALL_DIR/armed exists, each fsync and fdatasync first
 * creates $FERRY_SYNC_STALL_DIR/entered, then blocks until the test writes
 * a byte into the FIFO $FERRY_SYNC_STALL_DIR/gate. A test so holds the
 * process provably inside a disk sync, with no timing. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void stall_if_armed(void) {
  const char *dir = getenv("FERRY_SYNC_STALL_DIR");
  char path[4096];
  if (!dir || snprintf(path, sizeof path, "%s/armed", dir) >= (int)sizeof path ||
      access(path, F_OK) != 0)
    return;
  snprintf(path, sizeof path, "%s/entered", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0)
    close(fd);
  snprintf(path, sizeof path, "%s/gate", dir);
  fd = open(path, O_RDONLY | O_CLOEXEC); /* blocks until the test opens it to write */
  char byte;
  if (fd >= 0) {
    ssize_t unused = read(fd, &byte, 1);
    (void)unused;
    close(fd);
  }
}

int fsync(int fd) {
  stall_if_armed();
  int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  return real(fd);
}

int fdatasync(int fd) {
  stall_if_armed();
  int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  return real(fd);
}
