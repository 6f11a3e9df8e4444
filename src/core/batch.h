/* batch.h - a batch of transfer entries to one target, cut into chunks that
 * drivers (the calling thread and worker threads, each holding one channel)
 * claim and move in parallel. A chunk is one data frame: a slice of a large
 * entry, or many small entries coalesced, all of one op. */
#ifndef FERRY_BATCH_H
#define FERRY_BATCH_H

#include <sys/uio.h>

#include "core/chunker.h"
#include "core/engine.h"

/* An after-landed message: a POOL body (wire.h) about the batch's data,
 * e.g. pool.c's LANDED notice. A transport that carries it (carries_after,
 * transport.h) sends it in-band with the batch's last claimed chunk, so it
 * costs no round trip of its own; the target serves it after that chunk
 * landed, and pool.c holds the message until the batch's other chunks
 * landed too (it counts every WRITE into a slot). A transport that posts
 * (post_after) gets it once all the data is in place and the target serves
 * it later (posted; reply stays zero: grants come back as credits). With
 * any other transport the batch sends it on the control connection once
 * all the data is acknowledged, like a notification. Carried in-band or on
 * the control connection, reply gets the POOL_REPLY body. Owned by the
 * caller of ferry_batch_run. */
typedef struct ferry_after {
  uint8_t body[FERRY_WIRE_POOL_MAX];
  size_t len;
  uint8_t reply[FERRY_WIRE_POOL_REPLY_SIZE];
  int carried; /* set by the transport once the target served it in-band */
  int posted;  /* the transport posted it (post_after) */
} ferry_after;

/* Drivers (the submitting thread, workers) use engine and peer; they all
 * run inside the engine's call gate, so both outlive them. Status, wait and
 * free may come after the engine is gone: they use only the batch's own
 * fields (address, budget_ms), never engine or peer, and the file a file's
 * batch holds a reference on (file.c), which outlives its registration. */
/* A chunk lost with its rail's link, waiting for a channel on another. */
typedef struct ferry_retry {
  struct ferry_retry *next;
  unsigned avoid_rail; /* the rail it was lost on, or UINT_MAX: none (batch.c) */
  ferry_chunk chunk;
} ferry_retry;

struct ferry_channel;

/* ferry_batch.needs */
#define FERRY_NEEDS_POOL_WRITES 1u   /* pool_writes_bounded (transport.h) */
#define FERRY_NEEDS_DEVICE_MEMORY 2u /* carries_device_memory (transport.h) */
#define FERRY_NEEDS_DIRECT_DEVICE 4u /* carries_device_memory == FERRY_DEVICE_DIRECT */
/* region_key_size NULL: a remote range the batch's keyed transport cannot reach */
#define FERRY_NEEDS_UNKEYED 8u

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
  ferry_after *after; /* ferry_batch_run only: NULL otherwise */
  /* What the transports carrying it must be able to do (FERRY_NEEDS_*):
   * a pool message (it has an after-landed message) goes only over those
   * whose target checks WRITEs against the sender's grants, a batch with
   * local device memory only over those that carry it, one reaching a
   * remote range its transport's target left unregistered (a key of zeros:
   * device memory its fabric provider cannot reach) only over one without
   * keys (tcp); checkout and a
   * chunk moved again keep to their rails (ferry_peer_transport_for). */
  unsigned needs;
  int async; /* from ferry_batch_submit: a failure is counted when it ends */
  /* A file's batch (file.c; peer and transport are NULL): drivers move its
   * chunks with preadv/pwritev, chunks of at most file_slice bytes; with
   * file_sync the file is synced once they all moved, before DONE. The
   * batch holds a reference on the file. */
  struct ferry_file *file;
  size_t file_slice;
  int file_sync;
  /* A stream-ordered batch (stream.c): the fence released when the state
   * is final; unwatched: nobody holds the handle, so a failure is logged. */
  struct ferry_stream_fence *fence;
  int unwatched;

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
 * rail (ferry_batch_settle), never one lost on its own. after: as for
 * ferry_batch_claim_after (may be NULL). */
int ferry_batch_claim_on(ferry_batch *batch, const struct ferry_channel *channel, size_t slice_size,
                         ferry_chunk *chunk, ferry_after **after);
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
/* ferry_batch_claim for a transport that carries after-landed messages:
 * *after gets the batch's for the chunk that is the last one claimed
 * (NULL for the others), to be sent with it. */
int ferry_batch_claim_after(ferry_batch *batch, size_t slice_size, ferry_chunk *chunk,
                            ferry_after **after);
int ferry_batch_has_work(ferry_batch *batch);
/* The error a chunk failed the batch with, FERRY_OK while none did: chunks
 * still in flight then cannot change the outcome. */
ferry_status ferry_batch_error(ferry_batch *batch);
void ferry_batch_release(ferry_batch *batch);

/* A synchronous batch (as ferry_transfer_sync_batch) whose target serves
 * after once the data landed; DONE only when it did. */
ferry_status ferry_batch_run(ferry_engine *engine, const char *target, const ferry_entry *entries,
                             size_t count, ferry_after *after);

/* The same, asynchronous: workers drive it; the caller waits with
 * ferry_batch_wait, then ferry_batch_release, and keeps after until then. */
ferry_status ferry_batch_start(ferry_engine *engine, const char *target, const ferry_entry *entries,
                               size_t count, ferry_after *after, ferry_batch **out);

/* For a caller that checked the entries itself (plan.c): a batch over
 * entries (malloc'd; taken, also on failure) whose local ranges it knows
 * registered and whose remote ranges it checked against the table of the
 * target incarnation `instance`, reached over transport (from
 * ferry_peer_ensure). Not started yet: ferry_batch_post or _run_here. */
ferry_status ferry_batch_checked(ferry_engine *engine, ferry_peer *peer, ferry_entry *entries,
                                 size_t count, uint64_t total, const ferry_notification *notify,
                                 const struct ferry_transport *transport, uint64_t instance,
                                 ferry_batch **out);
/* Hands a new batch to the workers (ferry_batch_submit's way); the caller
 * owns the handle. */
void ferry_batch_post(ferry_batch *batch);
/* Drives a new batch from the calling thread with workers' help, waits for
 * it and releases it (ferry_transfer_sync_batch's way); start_ns: when the
 * call began, for the latency histogram. */
ferry_status ferry_batch_run_here(ferry_batch *batch, uint64_t start_ns);

/* A new batch (checked as ferry_batch_submit checks it), not started. */
ferry_status ferry_batch_prepare(ferry_engine *engine, const char *target,
                                 const ferry_entry *entries, size_t count,
                                 const ferry_notification *notify, ferry_batch **out);
/* Holds the batch's clock: no deadline until ferry_batch_start_clock,
 * which gives it its budget from now (stream.c: it starts only once the
 * stream's earlier work completed). */
void ferry_batch_hold_clock(ferry_batch *batch);
void ferry_batch_start_clock(ferry_batch *batch);
/* Another reference to the batch (ferry_batch_release drops it). */
void ferry_batch_retain(ferry_batch *batch);
/* stream.c: a stream-ordered batch's state became final (lock held). */
void ferry_stream_batch_final(ferry_batch *batch);

/* A batch over entries whose local ranges are checked here (registered,
 * host memory) toward no peer: named `name` in messages, not started, its
 * drivers set by the caller (file.c). */
ferry_status ferry_batch_local(ferry_engine *engine, const char *name, const ferry_entry *entries,
                               size_t count, ferry_batch **out);

/* file.c: what a file's batch does instead of a peer's channels. */
void ferry_file_drive(ferry_batch *batch); /* claims and moves chunks until none is left */
ferry_status ferry_file_sync_batch(ferry_batch *batch); /* fdatasync, its file_sync follower */
void ferry_file_release(struct ferry_file *file);       /* drops the batch's reference */

/* workers.c: threads that drive batches handed to them. */
ferry_status ferry_workers_start(ferry_engine *engine, unsigned count);
void ferry_workers_stop(ferry_engine *engine);
/* stream.c: the thread that starts stream-ordered batches. Stop lets it
 * finish: batches still queued fail (FERRY_ECLOSED) once their stream's
 * earlier work completed, which releases their streams. */
void ferry_streams_stop(ferry_engine *engine);
/* Asks `drivers` workers to help drive the batch (each takes a reference). */
void ferry_workers_post(ferry_engine *engine, ferry_batch *batch, unsigned drivers);
/* Drives a batch with one channel at a time until it has no work left. */
void ferry_batch_drive(ferry_batch *batch);

#endif
