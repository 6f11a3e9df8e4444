/* batch.h - a batch of transfer entries to one target, cut into chunks that
 * drivers (the calling thread and worker threads, each holding one channel)
 * claim and move in parallel. A chunk is one data frame: a slice of a large
 * entry, or many small entries coalesced, all of one op. */
#ifndef FERRY_BATCH_H
#define FERRY_BATCH_H

#include <sys/uio.h>

#include "core/chunker.h"
#include "core/engine.h"

/* Drivers (the submitting thread, workers) use engine and peer; they all
 * run inside the engine's call gate, so both outlive them. Status, wait and
 * free may come after the engine is gone: they use only the batch's own
 * fields (address, budget_ms), never engine or peer. */
/* A chunk lost with its rail's link, waiting for a channel on another. */
typedef struct ferry_retry {
  struct ferry_retry *next;
  unsigned avoid_rail;
  ferry_chunk chunk;
} ferry_retry;

struct ferry_channel;

struct ferry_batch {
  ferry_engine *engine;
  ferry_peer *peer;
  char address[FERRY_HOST_MAX + 8]; /* the target, for messages */
  uint32_t budget_ms;               /* deadline_ns - submit time, for messages */
  ferry_entry *entries;
  size_t count;
  uint64_t total_bytes;
  uint64_t deadline_ns;
  uint64_t peer_instance; /* incarnation of the target the batch was checked against */
  const struct ferry_transport *transport; /* the peer's, when the batch was made */
  ferry_notification notify;
  int has_notify;
  int async; /* from ferry_batch_submit: a failure is counted when it ends */

  pthread_mutex_t lock;
  pthread_cond_t cond;
  ferry_chunker cursor; /* what is left to claim */
  ferry_retry *retries; /* claimed first; still counted in outstanding */
  unsigned outstanding; /* claimed chunks not yet completed */
  int finishing;        /* the notification is being sent: state waits for its outcome */
  ferry_batch_state state;
  ferry_status error;
  char detail[512];
  int refs;
};

/* Fills chunk with the next unclaimed work; 0 when none is left (or the
 * batch failed). */
int ferry_batch_claim(ferry_batch *batch, size_t slice_size, ferry_chunk *chunk);
/* The same for a channel on one rail: it also takes chunks lost on another
 * rail (ferry_batch_settle), never one lost on its own. */
int ferry_batch_claim_on(ferry_batch *batch, const struct ferry_channel *channel, size_t slice_size,
                         ferry_chunk *chunk);
/* Completes a claimed chunk; on error the batch fails with the current
 * thread's error detail and no more chunks are handed out. */
void ferry_batch_complete(ferry_batch *batch, ferry_status status);
/* Completes a chunk a channel moved, as complete does, except that a chunk
 * lost because its rail's link failed (FERRY_ESOCKET) is handed out once
 * more to a channel on another rail when the peer has one up (WRITE and
 * READ of a chunk are idempotent); counts the chunk on its rail. */
void ferry_batch_settle(ferry_batch *batch, struct ferry_channel *channel, const ferry_chunk *chunk,
                        ferry_status status);
/* Fails the batch (first error wins) with the calling thread's detail. */
void ferry_batch_fail(ferry_batch *batch, ferry_status status);
int ferry_batch_has_work(ferry_batch *batch);
void ferry_batch_release(ferry_batch *batch);

/* workers.c: threads that drive batches handed to them. */
ferry_status ferry_workers_start(ferry_engine *engine, unsigned count);
void ferry_workers_stop(ferry_engine *engine);
/* Asks `drivers` workers to help drive the batch (each takes a reference). */
void ferry_workers_post(ferry_engine *engine, ferry_batch *batch, unsigned drivers);
/* Drives a batch with one channel at a time until it has no work left. */
void ferry_batch_drive(ferry_batch *batch);

#endif
