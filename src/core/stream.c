/* stream.c - stream-ordered transfers (ferry_batch_submit_on_stream): a
 * batch placed between two points of an application's CUDA stream. The
 * caller's thread checks the batch (as ferry_batch_submit does) and opens
 * a fence on the stream (memory/kind.h: an event recorded after the work
 * queued before; a wait queued for the work after). One thread per engine,
 * never the caller's, waits for each fence's event in submission order and
 * then hands the batch to the workers; the batch's final state (done means
 * landed, or failed) releases the fence, so a failed transfer never leaves
 * the stream waiting. The caller learns the outcome from the batch handle;
 * without one, a failure is logged. */
#include <pthread.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/log.h"
#include "core/batch.h"
#include "memory/kind.h"

typedef struct ferry_streams ferry_streams;

typedef struct stream_op {
  struct stream_op *next;
  ferry_batch *batch; /* the thread's reference */
  ferry_stream_fence *fence;
} stream_op;

struct ferry_streams {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  stream_op *head, *tail;
  int stopping;
  pthread_t thread;
};

void ferry_stream_batch_final(ferry_batch *b) {
  if (b->state != FERRY_BATCH_DONE && b->unwatched)
    FERRY_ERROR("stream-ordered transfer on %s to %s failed: %s", ferry_stream_fence_name(b->fence),
                b->address, b->detail);
  ferry_stream_fence_release(b->fence);
  b->fence = NULL;
}

/* The work queued before the batch completed (or failed): start it. */
static void start(ferry_engine *e, stream_op *op, int stopping) {
  ferry_batch *b = op->batch;
  ferry_status st = ferry_stream_fence_wait(op->fence);
  if (!st && (stopping || ferry_engine_closing(e)))
    st = ferry_fail(FERRY_ECLOSED,
                    "engine shut down before the stream-ordered transfer to %s "
                    "started",
                    b->address);
  if (st) {
    ferry_batch_fail(b, st);
  } else {
    ferry_batch_start_clock(b);
    ferry_batch_post(b);
  }
  ferry_batch_release(b);
  free(op);
}

static void *stream_thread(void *arg) {
  ferry_engine *e = arg;
  ferry_streams *s = e->streams;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->head && !s->stopping)
      pthread_cond_wait(&s->cond, &s->lock);
    stream_op *op = s->head;
    if (!op)
      break;
    s->head = op->next;
    if (!s->head)
      s->tail = NULL;
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->lock);
    start(e, op, stopping);
    pthread_mutex_lock(&s->lock);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* The engine's stream thread, started by the first stream-ordered batch. */
static ferry_status streams_get(ferry_engine *e, ferry_streams **out) {
  pthread_mutex_lock(&e->streams_lock);
  ferry_status st = FERRY_OK;
  if (!e->streams) {
    ferry_streams *s = calloc(1, sizeof *s);
    if (s) {
      pthread_mutex_init(&s->lock, NULL);
      pthread_cond_init(&s->cond, NULL);
      e->streams = s;
      if (pthread_create(&s->thread, NULL, stream_thread, e)) {
        e->streams = NULL;
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->cond);
        free(s);
        s = NULL;
      }
    }
    if (!s)
      st = ferry_fail(FERRY_ENOMEM, "cannot start the stream-ordered transfers' thread");
  }
  *out = e->streams;
  pthread_mutex_unlock(&e->streams_lock);
  return st;
}

static ferry_status submit_on_stream(ferry_engine *e, const char *target,
                                     const ferry_entry *entries, size_t count,
                                     const ferry_notification *notify, void *stream,
                                     ferry_batch **out) {
  ferry_streams *s;
  ferry_batch *b;
  stream_op *op = malloc(sizeof *op);
  if (!op)
    return ferry_fail(FERRY_ENOMEM, "no memory for a stream-ordered transfer");
  ferry_status st = streams_get(e, &s);
  if (!st)
    st = ferry_batch_prepare(e, target, entries, count, notify, &b);
  if (st) {
    free(op);
    return st;
  }
  ferry_batch_hold_clock(b); /* its budget counts from its start */
  if ((st = ferry_stream_fence_open(stream, &op->fence)) != FERRY_OK) {
    ferry_batch_fail(b, st); /* final, counted, never queued: nothing waits */
    ferry_batch_release(b);
    free(op);
    return st;
  }
  b->fence = op->fence; /* nothing else sees b yet */
  b->unwatched = out == NULL;
  if (out) {
    ferry_batch_retain(b);
    *out = b;
  }
  op->batch = b;
  op->next = NULL;
  pthread_mutex_lock(&s->lock);
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  return FERRY_OK;
}

ferry_status ferry_batch_submit_on_stream(ferry_engine *e, const char *target,
                                          const ferry_entry *entries, size_t count,
                                          const ferry_notification *notify, void *cuda_stream,
                                          ferry_batch **out) {
  FERRY_GATED(e, submit_on_stream(e, target, entries, count, notify, cuda_stream, out));
}

void ferry_streams_stop(ferry_engine *e) {
  ferry_streams *s = e->streams;
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  s->stopping = 1;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL); /* it drains the queue first */
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s);
  e->streams = NULL;
}
