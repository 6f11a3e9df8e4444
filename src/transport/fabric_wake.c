/* fabric_wake.c - wake words: how a polling target (the shm provider,
 * which has no wait fd) sleeps without a cap while idle and yet serves an
 * operation at once.
 *
 * shm reaches only this host, so the target shares one page with its
 * initiators: a file in /dev/shm named after its endpoint address (which
 * every initiator has from the descriptor), one word per lane. An idle lane
 * stores FERRY_FABRIC_SLEEPING in its word, progresses once more, and
 * sleeps on the word (futex). An initiator that waits for completions from
 * that lane checks the word on each round of its wait (ferry_fabric_nudge)
 * and, finding it asleep, flips the word and wakes it. Both sides order
 * the store before their next look (seq_cst), so either the lane sees the
 * initiator's operation before sleeping or the initiator sees the lane
 * asleep: a wake-up is not lost. The file carries no data and is named
 * "PID:...:wake" like shm's own regions, so the suite's cleanup of a dead
 * process's regions takes it too. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "transport/fabric.h"

#define SHM_PREFIX "fi_shm://"

int ferry_fabric_wake_path(const ferry_fabric_descriptor *d, char *out, size_t size) {
  size_t n = strnlen((const char *)d->addr, d->addr_len), skip = strlen(SHM_PREFIX);
  if (strcmp(d->provider, "shm") != 0 || n <= skip || memcmp(d->addr, SHM_PREFIX, skip) != 0)
    return 0;
  for (size_t i = skip; i < n; i++) { /* a file name: letters, digits, ':', '_' */
    char c = (char)d->addr[i];
    int ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
             c == ':' || c == '_';
    if (!ok)
      return 0;
  }
  return snprintf(out, size, "/dev/shm/%.*s:wake", (int)(n - skip), (const char *)d->addr + skip) <
         (int)size;
}

/* /dev/shm is writable by every user: an initiator maps only a regular
 * file of its own user (the target's is 0600) that is large enough, never
 * through a link, so no other user can make it fault (by truncating it) or
 * point its wake-ups into some other file. */
static int ours(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
         st.st_size >= FERRY_FABRIC_WAKE_SIZE;
}

uint32_t *ferry_fabric_wake_map(const char *path, int create) {
  int fd = open(
      path, create ? O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC : O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return NULL;
  void *p = MAP_FAILED;
  errno = EPERM;
  if (create ? ftruncate(fd, FERRY_FABRIC_WAKE_SIZE) == 0 : ours(fd))
    p = mmap(NULL, FERRY_FABRIC_WAKE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int saved = errno;
  close(fd);
  if (p == MAP_FAILED && create)
    unlink(path);
  errno = saved;
  return p == MAP_FAILED ? NULL : p;
}

void ferry_fabric_wake_unmap(uint32_t *words) {
  if (words)
    munmap(words, FERRY_FABRIC_WAKE_SIZE);
}

void ferry_fabric_nudge(uint32_t *word) {
  uint32_t sleeping = FERRY_FABRIC_SLEEPING;
  /* A read-modify-write, a full barrier (and one ThreadSanitizer models, as
   * it does not a fence): the operations posted before are seen first. */
  if (__atomic_fetch_add(word, 0, __ATOMIC_SEQ_CST) == sleeping &&
      __atomic_compare_exchange_n(word, &sleeping, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
    syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
}
