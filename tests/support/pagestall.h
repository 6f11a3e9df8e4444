/* pagestall.h - memory whose first touch blocks the touching thread until
 * the test lets it go (userfaultfd): a barrier inside a copy, so a test can
 * hold a transfer provably in flight, with no sleep deciding the order. */
#ifndef FERRY_TEST_PAGESTALL_H
#define FERRY_TEST_PAGESTALL_H

#include <stddef.h>
#include <stdint.h>

typedef struct page_stall {
  int uffd;
  uint8_t *base;   /* size bytes, anonymous */
  size_t size, at; /* [at, size) stalls whoever touches it first */
} page_stall;

/* Maps size bytes: [0, at) filled with fill, [at, size) left missing (both
 * page multiples). 0, or -1 when userfaultfd is not available here. */
int page_stall_create(page_stall *p, size_t size, size_t at, uint8_t fill);
/* Waits at most timeout_ms until a thread touched the missing part and is
 * blocked there: 0, or -1. */
int page_stall_wait(page_stall *p, int timeout_ms);
/* Fills the missing part with fill, which lets the blocked thread go on. */
int page_stall_release(page_stall *p, uint8_t fill);
void page_stall_destroy(page_stall *p);
/* Whether a call fences the stalled copy: runs fn(arg) on a thread, gives
 * it 0.2 s to return (a fence cannot; a broken one shows it), then
 * releases the stall with fill and joins the thread. 1: fn returned before
 * the release, 0: after it, -1: no thread or no release. */
int page_stall_returns_early(page_stall *p, uint8_t fill, void (*fn)(void *), void *arg);

#endif
