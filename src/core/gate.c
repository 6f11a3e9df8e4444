/* gate.c - what every subsystem asks of a running engine: the call gate
 * that each public call passes (ferry_engine_enter/leave, FERRY_GATED) and
 * that shutdown closes and drains, and the deadline of an operation. It
 * lives in core, next to the state it guards (engine.h), so that no file
 * of core calls up into the composition root (engine/engine.c). */
#include <pthread.h>
#include <stdio.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "engine.h"
#include "peer.h"

uint64_t ferry_engine_deadline(const ferry_engine *e, uint64_t bytes) {
  uint64_t extra = (bytes >> 20) * (uint64_t)e->cfg.timeout_ns_per_mb;
  return ferry_now_ns() + (uint64_t)e->cfg.timeout_ms * 1000000ull + extra;
}

/* Calls nested in a call of the same thread (ferry_memory_free unregisters)
 * are never refused: the outer call already holds its place in the gate. */
static __thread unsigned gate_depth;

ferry_status ferry_engine_enter(ferry_engine *e) {
  __atomic_add_fetch(&e->calls, 1, __ATOMIC_SEQ_CST);
  if (gate_depth++ == 0)
    ferry_log_set_engine(e->name); /* lines of this call name the engine */
  if (gate_depth > 1 || !ferry_engine_closing(e))
    return FERRY_OK;
  ferry_engine_leave(e, FERRY_OK);
  return ferry_fail(FERRY_ECLOSED, "engine %s is shutting down", e->name);
}

ferry_status ferry_engine_leave(ferry_engine *e, ferry_status st) {
  if (--gate_depth == 0) {
    ferry_log_set_engine(NULL);
    if (st)
      ferry_stats_error(e, st);
  }
  if (!ferry_engine_closing(e)) {
    __atomic_sub_fetch(&e->calls, 1, __ATOMIC_SEQ_CST);
    return st; /* a shutdown starting now sees the count drop at its next look */
  }
  if (st && st != FERRY_ECLOSED && st != FERRY_EINVAL) {
    char detail[FERRY_ERROR_MAX];
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
    st = ferry_fail(FERRY_ECLOSED, "engine %s shut down during the call (%s)", e->name, detail);
  }
  /* Under the lock, so shutdown cannot free the engine before we are out. */
  pthread_mutex_lock(&e->gate_lock);
  if (__atomic_sub_fetch(&e->calls, 1, __ATOMIC_SEQ_CST) == 0)
    pthread_cond_broadcast(&e->gate_cond);
  pthread_mutex_unlock(&e->gate_lock);
  return st;
}

/* How often shutdown repeats its wake-up pass while calls remain: a call
 * may open a socket after a pass and block on it. */
#define FERRY_DRAIN_PASS_NS (20 * 1000 * 1000ull)

void ferry_engine_drain_calls(ferry_engine *e) {
  pthread_mutex_lock(&e->gate_lock);
  while (__atomic_load_n(&e->calls, __ATOMIC_SEQ_CST)) {
    pthread_mutex_unlock(&e->gate_lock);
    ferry_peers_shutdown(e);
    pthread_mutex_lock(&e->gate_lock);
    if (__atomic_load_n(&e->calls, __ATOMIC_SEQ_CST)) {
      struct timespec until = ferry_timespec(ferry_now_ns() + FERRY_DRAIN_PASS_NS);
      pthread_cond_timedwait(&e->gate_cond, &e->gate_lock, &until);
    }
  }
  pthread_mutex_unlock(&e->gate_lock);
}
