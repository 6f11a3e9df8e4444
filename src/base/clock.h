/* clock.h - monotonic time in nanoseconds, the unit of every deadline. */
#ifndef FERRY_CLOCK_H
#define FERRY_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t ferry_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Milliseconds left until deadline (0 when passed), for poll(). */
static inline int ferry_ms_left(uint64_t deadline_ns) {
  uint64_t now = ferry_now_ns();
  if (now >= deadline_ns)
    return 0;
  uint64_t ms = (deadline_ns - now + 999999) / 1000000;
  return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

/* An absolute CLOCK_MONOTONIC timespec, for pthread_cond_timedwait on a
 * condition variable created with CLOCK_MONOTONIC. */
static inline struct timespec ferry_timespec(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  return ts;
}

#endif
