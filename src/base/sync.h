/* sync.h - how ferry's locks and condition variables are set up, in one
 * place so every one of them behaves the same. */
#ifndef FERRY_SYNC_H
#define FERRY_SYNC_H

#include <pthread.h>
#include <time.h>

/* A condition variable whose timed waits use CLOCK_MONOTONIC, so a clock
 * step never stretches or cuts a deadline. */
static inline void ferry_cond_init(pthread_cond_t *cond) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(cond, &attr);
  pthread_condattr_destroy(&attr);
}

/* A reader/writer lock that prefers writers: lookups on the data path are
 * many and short, and must not starve the rare register/unregister. */
static inline int ferry_rwlock_init(pthread_rwlock_t *lock) {
  pthread_rwlockattr_t attr;
  if (pthread_rwlockattr_init(&attr) != 0)
    return -1;
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  int rc = pthread_rwlock_init(lock, &attr);
  pthread_rwlockattr_destroy(&attr);
  return rc;
}

/* Drops one reference of an object whose lock guards refs. On the last
 * (no thread can reach the object any more) destroys lock and cond and
 * returns 1: the caller frees the object. */
static inline int ferry_unref_last(pthread_mutex_t *lock, pthread_cond_t *cond, unsigned *refs) {
  pthread_mutex_lock(lock);
  int last = --*refs == 0;
  pthread_mutex_unlock(lock);
  if (last) {
    pthread_mutex_destroy(lock);
    pthread_cond_destroy(cond);
  }
  return last;
}

#endif
