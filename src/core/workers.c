/* workers.c - a small pool of threads that drive batches: all of an async
 * batch, and the extra channels of a large sync one. Idle workers sleep on
 * a condition variable; nothing polls. */
#include <stdlib.h>

#include "batch.h"
#include "error.h"
#include "log.h"

typedef struct ticket {
  ferry_batch *batch;
  struct ticket *next;
} ticket;

struct ferry_workers {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  ticket *head, *tail;
  int stopping;
  unsigned count;
  pthread_t threads[];
};

static ticket *next_ticket(ferry_workers *w) {
  pthread_mutex_lock(&w->lock);
  while (!w->head && !w->stopping)
    pthread_cond_wait(&w->cond, &w->lock);
  ticket *t = w->head;
  if (t && !w->stopping) {
    w->head = t->next;
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
  ferry_workers *w = calloc(1, sizeof *w + count * sizeof(pthread_t));
  if (!w)
    return ferry_fail(FERRY_ENOMEM, "no memory for %u workers", count);
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->cond, NULL);
  e->workers = w;
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
