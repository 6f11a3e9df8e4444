/* workers.c - a pool of threads that drive batches: all of an async batch,
 * and the extra channels of a large sync one. Idle workers sleep on a
 * condition variable; nothing polls. A driver blocks for as long as its
 * peer takes (up to the batch deadline), so when every worker is busy the
 * pool grows, up to FERRY_WORKERS_MAX: a stalled peer must not hold up
 * batches to healthy ones. */
#include <stdlib.h>

#include "batch.h"
#include "error.h"
#include "log.h"

typedef struct ticket {
  ferry_batch *batch;
  struct ticket *next;
} ticket;

#define FERRY_WORKERS_MAX 256

struct ferry_workers {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  ticket *head, *tail;
  int stopping;
  unsigned count;  /* threads started */
  unsigned idle;   /* of which waiting for a ticket */
  unsigned queued; /* tickets not yet taken */
  pthread_t threads[FERRY_WORKERS_MAX];
};

static ticket *next_ticket(ferry_workers *w) {
  pthread_mutex_lock(&w->lock);
  w->idle++;
  while (!w->head && !w->stopping)
    pthread_cond_wait(&w->cond, &w->lock);
  w->idle--;
  ticket *t = w->head;
  if (t && !w->stopping) {
    w->head = t->next;
    w->queued--;
    if (!w->head)
      w->tail = NULL;
  } else {
    t = NULL;
  }
  pthread_mutex_unlock(&w->lock);
  return t;
}

static void *worker_main(void *arg) {
  ferry_workers *w = arg;
  ticket *t;
  while ((t = next_ticket(w)) != NULL) {
    ferry_batch_drive(t->batch);
    ferry_batch_release(t->batch);
    free(t);
  }
  return NULL;
}

ferry_status ferry_workers_start(ferry_engine *e, unsigned count) {
  ferry_workers *w = calloc(1, sizeof *w);
  if (!w)
    return ferry_fail(FERRY_ENOMEM, "no memory for %u workers", count);
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->cond, NULL);
  e->workers = w;
  if (count > FERRY_WORKERS_MAX)
    count = FERRY_WORKERS_MAX;
  for (; w->count < count; w->count++)
    if (pthread_create(&w->threads[w->count], NULL, worker_main, w) != 0)
      return ferry_fail(FERRY_ENOMEM, "cannot start worker thread %u", w->count);
  return FERRY_OK;
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
    if (w->queued > w->idle && w->count < FERRY_WORKERS_MAX &&
        pthread_create(&w->threads[w->count], NULL, worker_main, w) == 0)
      w->count++;
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
  pthread_mutex_unlock(&w->lock);
  for (unsigned i = 0; i < w->count; i++)
    pthread_join(w->threads[i], NULL);
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
  free(w);
  e->workers = NULL;
}
