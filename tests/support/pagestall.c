/* pagestall.c - see pagestall.h. */
#include "pagestall.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int page_stall_create(page_stall *p, size_t size, size_t at, uint8_t fill) {
  memset(p, 0, sizeof *p);
  p->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
  if (p->uffd < 0)
    return -1;
  struct uffdio_api api = {.api = UFFD_API};
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ioctl(p->uffd, UFFDIO_API, &api) < 0 || base == MAP_FAILED) {
    if (base != MAP_FAILED)
      munmap(base, size);
    close(p->uffd);
    return -1;
  }
  p->base = base;
  p->size = size;
  p->at = at;
  memset(p->base, fill, at);
  struct uffdio_register reg = {.range = {(uintptr_t)(p->base + at), size - at},
                                .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(p->uffd, UFFDIO_REGISTER, &reg) < 0) {
    page_stall_destroy(p);
    return -1;
  }
  return 0;
}

int page_stall_wait(page_stall *p, int timeout_ms) {
  struct pollfd pfd = {p->uffd, POLLIN, 0};
  struct uffd_msg msg;
  if (poll(&pfd, 1, timeout_ms) != 1 || read(p->uffd, &msg, sizeof msg) != (ssize_t)sizeof msg)
    return -1;
  return msg.event == UFFD_EVENT_PAGEFAULT ? 0 : -1;
}

int page_stall_release(page_stall *p, uint8_t fill) {
  size_t n = p->size - p->at;
  uint8_t *src = malloc(n);
  if (!src)
    return -1;
  memset(src, fill, n);
  struct uffdio_copy copy = {.dst = (uintptr_t)(p->base + p->at), .src = (uintptr_t)src, .len = n};
  int rc = ioctl(p->uffd, UFFDIO_COPY, &copy);
  free(src);
  return rc < 0 ? -1 : 0;
}

void page_stall_destroy(page_stall *p) {
  if (p->base)
    munmap(p->base, p->size);
  if (p->uffd >= 0)
    close(p->uffd);
  memset(p, 0, sizeof *p);
  p->uffd = -1;
}

typedef struct stalled_call {
  void (*fn)(void *);
  void *arg;
  int returned;
} stalled_call;

static void *stalled_call_run(void *arg) {
  stalled_call *c = arg;
  c->fn(c->arg);
  __atomic_store_n(&c->returned, 1, __ATOMIC_RELEASE);
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int page_stall_returns_early(page_stall *p, uint8_t fill, void (*fn)(void *), void *arg) {
  stalled_call c = {fn, arg, 0};
  pthread_t thread;
  if (pthread_create(&thread, NULL, stalled_call_run, &c) != 0)
    return -1;
  double t0 = now_s();
  while (!__atomic_load_n(&c.returned, __ATOMIC_ACQUIRE) && now_s() - t0 < 0.2)
    sched_yield();
  int early = __atomic_load_n(&c.returned, __ATOMIC_ACQUIRE);
  int released = page_stall_release(p, fill);
  pthread_join(thread, NULL);
  return released ? -1 : early;
}
