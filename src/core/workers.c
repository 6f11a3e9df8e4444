/* workers.c - a pool of threads that drive batches: all of an async batch,
 * and the extra channels of a large sync one. Idle workers sleep on a
 * condition variable; nothing polls. A driver blocks for as long as its
 * peer takes (up to the batch deadline), so when every worker is busy the
 * pool grows, up to FERRY_WORKERS_MAX: a stalled peer must not hold up
 * batches to healthy ones. Once the stall is over the extra threads are
 * not kept: a worker idle for cfg.worker_idle_ms exits while more than
 * cfg.workers remain.
 *
 * A worker drives a batch inside the engine's call gate, like a public
 * call, so shutdown wakes it and waits for it. Threads are joinable: each
 * exiting one joins the one that exited before it, and stop joins the
 * last, so none is left unjoined and no list of threads is kept. */
#include <errno.h>
#include <stdlib.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "batch.h"

typedef struct ticket {
  ferry_batch *batch;
  struct ticket *next;
} ticket;

#define FERRY_WORKERS_MAX 256

struct ferry_workers {
  ferry_engine *engine;
  pthread_mutex_t lock;
  pthread_cond_t cond;   /* a ticket was queued, or stop */
  pthread_cond_t exited; /* count dropped */
  ticket *head, *tail;
  int stopping;
  unsigned floor;        /* threads kept however idle */
  unsigned count;        /* threads running */
  unsigned idle;         /* of which waiting for a ticket */
  unsigned queued;       /* tickets not yet taken */
  pthread_t last_exited; /* not joined yet */
  int have_exited;
};

/* Called with the lock held by a thread about to return; unlocks. */
static void leave_pool(ferry_workers *w) {
  pthread_t before = w->last_exited;
  int join = w->have_exited;
  w->last_exited = pthread_self();
  w->have_exited = 1;
  w->count--;
  pthread_cond_broadcast(&w->exited);
  pthread_mutex_unlock(&w->lock);
  if (join)
    pthread_join(before, NULL);
}

/* The next ticket, or NULL (with the lock still held) when this thread
 * should exit: stopping, or idle past the limit with more than the floor. */
static ticket *next_ticket(ferry_workers *w) {
  uint64_t idle_ns = (uint64_t)w->engine->cfg.worker_idle_ms * 1000000ull;
  struct timespec until = ferry_timespec(ferry_now_ns() + idle_ns);
  w->idle++;
  while (!w->head && !w->stopping) {
    if (pthread_cond_timedwait(&w->cond, &w->lock, &until) != ETIMEDOUT || w->head)
      continue;
    if (w->count > w->floor)
      break;
    until = ferry_timespec(ferry_now_ns() + idle_ns);
  }
  w->idle--;
  ticket *t = w->stopping ? NULL : w->head;
  if (t) {
    w->head = t->next;
    w->queued--;
    if (!w->head)
      w->tail = NULL;
  }
  return t;
}

static void drive_ticket(ferry_workers *w, ticket *t) {
  ferry_status st = ferry_engine_enter(w->engine);
  if (st) {
    ferry_batch_fail(t->batch, st);
  } else {
    ferry_batch_drive(t->batch);
    ferry_engine_leave(w->engine, FERRY_OK);
  }
  ferry_batch_release(t->batch);
  free(t);
}

static void *worker_main(void *arg) {
  ferry_workers *w = arg;
  ferry_log_set_engine(w->engine->name);
  pthread_mutex_lock(&w->lock);
  ticket *t;
  while ((t = next_ticket(w)) != NULL) {
    pthread_mutex_unlock(&w->lock);
    drive_ticket(w, t);
    pthread_mutex_lock(&w->lock);
  }
  leave_pool(w);
  return NULL;
}

/* With the lock held. */
static int add_thread(ferry_workers *w) {
  pthread_t thread;
  if (pthread_create(&thread, NULL, worker_main, w) != 0)
    return 0;
  w->count++;
  return 1;
}

ferry_status ferry_workers_start(ferry_engine *e, unsigned count) {
  ferry_workers *w = calloc(1, sizeof *w);
  if (!w)
    return ferry_fail(FERRY_ENOMEM, "no memory for %u workers", count);
  pthread_mutex_init(&w->lock, NULL);
  ferry_cond_init(&w->cond);
  pthread_cond_init(&w->exited, NULL);
  w->engine = e;
  w->floor = count > FERRY_WORKERS_MAX ? FERRY_WORKERS_MAX : count;
  e->workers = w;
  pthread_mutex_lock(&w->lock);
  int ok = 1;
  while (ok && w->count < w->floor)
    ok = add_thread(w);
  pthread_mutex_unlock(&w->lock);
  return ok ? FERRY_OK : ferry_fail(FERRY_ENOMEM, "cannot start worker thread %u", w->count);
}

void ferry_workers_post(ferry_engine *e, ferry_batch *b, unsigned drivers) {
  ferry_workers *w = e->workers;
  for (unsigned i = 0; i < drivers; i++) {
    ticket *t = malloc(sizeof *t);
    if (!t) {
      if (i == 0) /* nobody would drive it: fail instead of hanging */
        ferry_batch_fail(b, ferry_fail(FERRY_ENOMEM, "no memory to schedule a batch"));
      return;
    }
    pthread_mutex_lock(&b->lock);
    b->refs++;
    pthread_mutex_unlock(&b->lock);
    t->batch = b;
    t->next = NULL;
    pthread_mutex_lock(&w->lock);
    if (w->tail)
      w->tail->next = t;
    else
      w->head = t;
    w->tail = t;
    w->queued++;
    /* Every worker busy (blocked on some peer): one more, so this batch
     * does not wait behind them. */
    if (w->queued > w->idle && w->count < FERRY_WORKERS_MAX)
      add_thread(w);
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
  }
}

void ferry_workers_stop(ferry_engine *e) {
  ferry_workers *w = e->workers;
  if (!w)
    return;
  pthread_mutex_lock(&w->lock);
  w->stopping = 1;
  pthread_cond_broadcast(&w->cond);
  while (w->count)
    pthread_cond_wait(&w->exited, &w->lock);
  pthread_mutex_unlock(&w->lock);
  if (w->have_exited)
    pthread_join(w->last_exited, NULL);
  /* Batches nobody will drive now fail instead of waiting forever. */
  while (w->head) {
    ticket *t = w->head;
    w->head = t->next;
    ferry_batch_fail(t->batch, ferry_fail(FERRY_ECLOSED, "engine shut down before the batch ran"));
    ferry_batch_release(t->batch);
    free(t);
  }
  pthread_mutex_destroy(&w->lock);
  pthread_cond_destroy(&w->cond);
  pthread_cond_destroy(&w->exited);
  free(w);
  e->workers = NULL;
}
