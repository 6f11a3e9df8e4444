/* batch.c - batches: validation at submit, the claim cursor that cuts
 * entries into chunks, completion, waiting, and the public transfer calls.
 *
 * A batch is finished when its cursor is at the end and no claimed chunk is
 * outstanding; only then is its notification sent and its state final, so
 * "done" always means every byte is where it should be. A chunk lost with
 * its rail's link stays outstanding on the retry list until a channel on
 * another rail moves it (once): another rail of the same transport, or
 * one of a standby transport (peer.c).
 *
 * A file's batch (file.c) is the same batch with no peer: its chunks are
 * moved by preadv/pwritev on the workers instead of a peer's channels. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "batch.h"
#include "core/transport.h"
#include "peer.h"

/* ---- creation ------------------------------------------------------------------ */

static ferry_status check_entries(ferry_engine *e, const ferry_entry *entries, size_t count,
                                  uint64_t *total) {
  *total = 0;
  for (size_t i = 0; i < count; i++) {
    const ferry_entry *en = &entries[i];
    if ((en->op != FERRY_OP_READ && en->op != FERRY_OP_WRITE) || !en->local || !en->length)
      return ferry_fail(FERRY_EINVAL, "entry %zu: op %d, local %p, length %zu is not a transfer", i,
                        (int)en->op, en->local, en->length);
    ferry_status st = ferry_memory_check_local(e, en->local, en->length);
    if (st)
      return ferry_fail(st, "entry %zu: %s", i, ferry_last_error());
    *total += en->length;
  }
  return FERRY_OK;
}

static ferry_status copy_notification(ferry_batch *b, const ferry_notification *n) {
  if (!n)
    return FERRY_OK;
  if (!n->name || !*n->name || strlen(n->name) > FERRY_WIRE_MAX_NAME ||
      n->length > FERRY_WIRE_MAX_NOTIFY_DATA || (n->length && !n->data))
    return ferry_fail(FERRY_EINVAL,
                      "batch notification needs a name of 1..%d bytes and data of "
                      "at most %u bytes",
                      FERRY_WIRE_MAX_NAME, FERRY_WIRE_MAX_NOTIFY_DATA);
  b->notify.name = strdup(n->name);
  b->notify.data = malloc(n->length + 1);
  if (!b->notify.name || !b->notify.data)
    return ferry_fail(FERRY_ENOMEM, "no memory for a batch notification");
  if (n->length)
    memcpy(b->notify.data, n->data, n->length);
  b->notify.data[n->length] = 0;
  b->notify.length = n->length;
  b->has_notify = 1;
  return FERRY_OK;
}

static void drop_retries(ferry_batch *b) {
  while (b->retries) {
    ferry_retry *r = b->retries;
    b->retries = r->next;
    b->outstanding--;
    free(r);
  }
}

static void batch_destroy(ferry_batch *b) {
  drop_retries(b);
  if (b->file)
    ferry_file_release(b->file);
  free(b->entries);
  free(b->notify.name);
  free(b->notify.data);
  pthread_mutex_destroy(&b->lock);
  pthread_cond_destroy(&b->cond);
  free(b);
}

/* A batch over entries (malloc'd: the batch takes them, also on failure)
 * to peer (NULL for a file's), named `address` in messages, with its
 * deadline and a copy of the notification. */
static ferry_status batch_new(ferry_engine *e, ferry_peer *peer, const char *address,
                              ferry_entry *entries, size_t count, uint64_t total,
                              const ferry_notification *notify, ferry_batch **out) {
  ferry_batch *b = calloc(1, sizeof *b);
  if (!b) {
    free(entries);
    return ferry_fail(FERRY_ENOMEM, "no memory for a batch of %zu entries", count);
  }
  b->entries = entries;
  b->engine = e;
  b->count = count;
  ferry_chunker_init(&b->cursor, b->entries, count);
  b->refs = 1;
  pthread_mutex_init(&b->lock, NULL);
  ferry_cond_init(&b->cond);
  b->peer = peer;
  snprintf(b->address, sizeof b->address, "%s", address);
  b->total_bytes = total;
  uint64_t now = ferry_now_ns();
  b->deadline_ns = ferry_engine_deadline(e, total);
  b->budget_ms = (uint32_t)((b->deadline_ns - now) / 1000000ull);
  ferry_status st = copy_notification(b, notify);
  if (st) {
    batch_destroy(b);
    return st;
  }
  *out = b;
  return FERRY_OK;
}

/* The first entry whose local memory the CPU cannot touch (device memory,
 * memory/kind.h), *where saying where it lives; -1 when none. One relaxed
 * load when no such memory is registered. */
static long device_entry(ferry_engine *e, const ferry_entry *entries, size_t count,
                         ferry_where *where) {
  if (!ferry_registry_device_regions(e->registry))
    return -1;
  for (size_t i = 0; i < count; i++)
    if (ferry_registry_where(e->registry, (uint64_t)(uintptr_t)entries[i].local, entries[i].length,
                             where) &&
        !where->cpu_access)
      return (long)i;
  return -1;
}

/* A batch with local device memory goes only over a transport that can
 * carry it (carries_device_memory: tcp and fabric, staged or, on an
 * FI_HMEM provider, fabric directly; shm, copied directly; under
 * FERRY_STAGING=never only shm): the peer's, or another usable toward it;
 * else it is refused here, before any transport could touch the memory
 * with the CPU. */
static ferry_status place_device_memory(ferry_batch *b) {
  ferry_where where;
  long i = device_entry(b->engine, b->entries, b->count, &where);
  if (i < 0)
    return FERRY_OK;
  const ferry_entry *en = &b->entries[i];
  char place[64];
  ferry_where_format(&where, place, sizeof place);
  int never = b->engine->cfg.staging == FERRY_STAGING_NEVER;
  b->needs |= FERRY_NEEDS_DEVICE_MEMORY | (never ? FERRY_NEEDS_DIRECT_DEVICE : 0);
  if (ferry_peer_transport_for(b->peer, b->needs, &b->transport))
    return FERRY_OK;
  if (never)
    return ferry_fail(FERRY_EFAULT,
                      "transfer to %s: local buffer %p (+%zu bytes) is %s memory, which no "
                      "transport can carry under FERRY_STAGING=never (tcp and fabric stage it "
                      "under auto or always; shm copies it directly, toward a peer on this host)",
                      b->address, en->local, en->length, place);
  return ferry_fail(FERRY_EFAULT,
                    "local buffer %p (+%zu bytes) is %s memory, which the %s transport cannot "
                    "carry yet (tcp stages it; enable tcp toward %s)",
                    en->local, en->length, place, b->transport->name, b->address);
}

/* A batch reaching a remote range its transport's target left
 * unregistered (a key of zeros in its table: device memory its fabric
 * provider cannot reach, transport.h) goes only over a transport without
 * keys (tcp: the target stages it), or is refused here, before any byte
 * moves: one-sided RMA would fail at the target, mid-batch. */
static ferry_status place_unkeyed_remote(ferry_batch *b) {
  if (!b->transport->region_key_size)
    return FERRY_OK;
  long i = ferry_peer_unkeyed_remote(b->peer, b->transport->id, b->entries, b->count);
  if (i < 0)
    return FERRY_OK;
  const ferry_transport *keyed = b->transport;
  b->needs |= FERRY_NEEDS_UNKEYED;
  if (ferry_peer_transport_for(b->peer, b->needs, &b->transport))
    return FERRY_OK;
  const ferry_entry *en = &b->entries[i];
  return ferry_fail(FERRY_EFAULT,
                    "entry %ld to %s: remote address 0x%llx (+%zu bytes) is memory the target "
                    "did not register with its %s transport (device memory, which its provider "
                    "cannot reach: no FI_HMEM there), so one-sided RMA cannot reach it (tcp "
                    "stages it; enable tcp toward %s)",
                    i, b->address, (unsigned long long)en->remote, en->length, keyed->name,
                    b->address);
}

/* Everything that can be refused before a byte moves is refused here, with
 * the reason: arguments, local and remote registration, reachability.
 * pool_writes: the batch carries a pool message (ferry_batch_run/start
 * with an after-landed message), so only a transport that checks its
 * WRITEs against the sender's grant may carry it. */
static ferry_status batch_create(ferry_engine *e, const char *target, const ferry_entry *entries,
                                 size_t count, const ferry_notification *notify, int pool_writes,
                                 ferry_batch **out) {
  if (!e || !entries || !count || !out)
    return ferry_fail(FERRY_EINVAL, "submit to %s: null engine, entries or out, or zero entries",
                      target ? target : "(null)");
  uint64_t total;
  ferry_peer *peer;
  ferry_status st = check_entries(e, entries, count, &total);
  if (!st)
    st = ferry_peer_get(e, target, &peer);
  if (st)
    return st;
  ferry_entry *copy = malloc(count * sizeof *copy);
  if (!copy)
    return ferry_fail(FERRY_ENOMEM, "no memory for a batch of %zu entries", count);
  memcpy(copy, entries, count * sizeof *copy);
  ferry_batch *b;
  if ((st = batch_new(e, peer, peer->address, copy, count, total, notify, &b)) != FERRY_OK)
    return st;
  b->needs = pool_writes ? FERRY_NEEDS_POOL_WRITES : 0;
  st =
      ferry_peer_ensure_for(peer, entries, count, b->deadline_ns, &b->transport, &b->peer_instance);
  if (!st && pool_writes)
    st = ferry_peer_pool_transport(peer, &b->transport);
  if (!st)
    st = place_device_memory(b);
  if (!st)
    st = ferry_peer_check_remote(peer, entries, count, b->deadline_ns);
  if (!st)
    st = place_unkeyed_remote(b);
  if (st) {
    batch_destroy(b);
    return st;
  }
  ferry_stats_submitted(peer, b->transport, entries, count);
  *out = b;
  return FERRY_OK;
}

ferry_status ferry_batch_checked(ferry_engine *e, ferry_peer *peer, ferry_entry *entries,
                                 size_t count, uint64_t total, const ferry_notification *notify,
                                 const ferry_transport *transport, uint64_t instance,
                                 ferry_batch **out) {
  ferry_batch *b;
  ferry_status st = batch_new(e, peer, peer->address, entries, count, total, notify, &b);
  if (st)
    return st;
  b->transport = transport;
  b->peer_instance = instance;
  if ((st = place_device_memory(b)) != FERRY_OK || (st = place_unkeyed_remote(b)) != FERRY_OK) {
    batch_destroy(b);
    return st;
  }
  ferry_stats_submitted(peer, b->transport, entries, count);
  *out = b;
  return FERRY_OK;
}

ferry_status ferry_batch_local(ferry_engine *e, const char *name, const ferry_entry *entries,
                               size_t count, ferry_batch **out) {
  uint64_t total;
  ferry_status st = check_entries(e, entries, count, &total);
  if (st)
    return st;
  ferry_where where;
  long i = device_entry(e, entries, count, &where);
  if (i >= 0) {
    char place[64];
    ferry_where_format(&where, place, sizeof place);
    return ferry_fail(FERRY_EFAULT,
                      "entry %ld to %s: local buffer %p (+%zu bytes) is %s memory, which the "
                      "CPU cannot read or write",
                      i, name, entries[i].local, entries[i].length, place);
  }
  ferry_entry *copy = malloc(count * sizeof *copy);
  if (!copy)
    return ferry_fail(FERRY_ENOMEM, "no memory for a batch of %zu entries", count);
  memcpy(copy, entries, count * sizeof *copy);
  if ((st = batch_new(e, NULL, name, copy, count, total, NULL, out)) != FERRY_OK)
    return st;
  ferry_stats_batch_started(e);
  return FERRY_OK;
}

/* How many channels are worth driving this batch in parallel. */
static unsigned wanted_drivers(const ferry_batch *b) {
  size_t slice = b->transport->slice_size(b);
  uint64_t chunks = (b->total_bytes + slice - 1) / slice;
  uint64_t by_count = (b->count + FERRY_CHUNK_MAX_SEGMENTS - 1) / FERRY_CHUNK_MAX_SEGMENTS;
  if (by_count > chunks)
    chunks = by_count;
  unsigned limit = b->engine->cfg.tcp_connections;
  return chunks < limit ? (unsigned)chunks : limit;
}

/* ---- claiming and completing ------------------------------------------------------ */

/* Drivers waiting for one of the peer's channels look again (a file's
 * batch has none: its drivers never wait). */
static void wake_drivers(ferry_batch *b) {
  if (b->peer)
    ferry_peer_wake(b->peer);
}

int ferry_batch_has_work(ferry_batch *b) {
  pthread_mutex_lock(&b->lock);
  int work = !ferry_chunker_done(&b->cursor) || b->retries;
  pthread_mutex_unlock(&b->lock);
  return work;
}

ferry_status ferry_batch_error(ferry_batch *b) {
  pthread_mutex_lock(&b->lock);
  ferry_status st = b->error;
  pthread_mutex_unlock(&b->lock);
  return st;
}

static void copy_chunk(ferry_chunk *to, const ferry_chunk *from) {
  to->op = from->op;
  to->count = from->count;
  to->bytes = from->bytes;
  to->retried = from->retried;
  memcpy(to->local, from->local, from->count * sizeof *from->local);
  memcpy(to->remote, from->remote, from->count * sizeof *from->remote);
}

#define ANY_RAIL UINT_MAX /* the avoid_rail of a lost chunk that every rail may take */

/* With the lock: a lost chunk this rail may take, off the list. */
static int take_retry_locked(ferry_batch *b, unsigned rail, ferry_chunk *c) {
  for (ferry_retry **pp = &b->retries; *pp; pp = &(*pp)->next) {
    ferry_retry *r = *pp;
    if (r->avoid_rail == rail)
      continue;
    *pp = r->next;
    copy_chunk(c, &r->chunk);
    free(r);
    return 1;
  }
  return 0;
}

/* A lost chunk moved to another rail never carries the after-landed
 * message: if it is still unsent, the batch sends it on the control
 * connection once everything landed; so does one whose chunks may have
 * gone over another transport (a standby, peer.c), since the target
 * counts a message's WRITEs only on the batch's own transport. */
static int claim(ferry_batch *b, const ferry_channel *ch, size_t slice_size, ferry_chunk *c,
                 ferry_after **after) {
  int carries =
      b->transport && b->transport->carries_after && (!ch || ch->transport == b->transport);
  pthread_mutex_lock(&b->lock);
  int retried = ch && take_retry_locked(b, ch->rail, c);
  int claimed = retried;
  if (!claimed) {
    claimed = ferry_chunker_next(&b->cursor, slice_size, c);
    b->outstanding += (unsigned)claimed;
  }
  int exhausted = ferry_chunker_done(&b->cursor) && !b->retries;
  int last = claimed && !retried && exhausted && b->after && carries;
  if (after)
    *after = last ? b->after : NULL;
  pthread_mutex_unlock(&b->lock);
  if (exhausted)
    wake_drivers(b); /* threads waiting for a channel can stop */
  return claimed;
}

int ferry_batch_claim(ferry_batch *b, size_t slice_size, ferry_chunk *c) {
  return claim(b, NULL, slice_size, c, NULL);
}

int ferry_batch_claim_after(ferry_batch *b, size_t slice_size, ferry_chunk *c,
                            ferry_after **after) {
  return claim(b, NULL, slice_size, c, after);
}

int ferry_batch_claim_on(ferry_batch *b, const ferry_channel *ch, size_t slice_size, ferry_chunk *c,
                         ferry_after **after) {
  return claim(b, ch, slice_size, c, after);
}

static void record_error(ferry_batch *b, ferry_status status) {
  drop_retries(b); /* they were outstanding: nobody moves them now */
  if (b->error)
    return;
  b->error = status;
  if (status == FERRY_ETIMEDOUT) /* say which budget ran out, not just the step */
    snprintf(b->detail, sizeof b->detail,
             "batch of %zu entries (%llu bytes) to %s passed its deadline: %s", b->count,
             (unsigned long long)b->total_bytes, b->address, ferry_last_error());
  else
    snprintf(b->detail, sizeof b->detail, "%s", ferry_last_error());
  ferry_chunker_stop(&b->cursor);
}

/* A failure that shutdown caused (sockets shut down under the drivers) is
 * reported as FERRY_ECLOSED, keeping the step in the detail. Drivers only:
 * they run while the engine exists. */
static ferry_status closed_cause(ferry_batch *b, ferry_status status) {
  if (!status || status == FERRY_ECLOSED || !ferry_engine_closing(b->engine))
    return status;
  char detail[FERRY_ERROR_MAX];
  snprintf(detail, sizeof detail, "%s", ferry_last_error());
  return ferry_fail(FERRY_ECLOSED, "engine shut down during the batch to %s (%s)", b->address,
                    detail);
}

/* The notification may finish after the batch's deadline: the data landed
 * in time, and a TIMEDOUT batch whose notification then arrives would be
 * retried and notified twice. Its own bound is a control round trip. */
static uint64_t notify_deadline(const ferry_batch *b) {
  uint64_t own = ferry_now_ns() + (uint64_t)b->engine->cfg.connect_timeout_ms * 1000000ull;
  return own > b->deadline_ns ? own : b->deadline_ns;
}

/* The control messages that follow the data: the notification, and the
 * after-landed message unless the transport carried it in-band or posts
 * it on its own path. A file's batch has one follower of its own: the
 * fdatasync FERRY_FILE_SYNC asks for. */
static ferry_status send_followers(ferry_batch *b, uint64_t deadline) {
  if (b->file_sync)
    return ferry_file_sync_batch(b);
  ferry_status st = FERRY_OK;
  if (b->has_notify)
    st = ferry_peer_notify(b->peer, b->notify.name, b->notify.data, b->notify.length, deadline);
  if (!st && b->after && !b->after->carried) {
    const ferry_transport *t = b->transport;
    b->after->posted = t->post_after && t->post_after(b->peer, b->peer_instance, b->after);
    if (!b->after->posted)
      st = ferry_peer_pool(b->peer, b->after->body, b->after->len, b->after->reply, deadline);
  }
  return st;
}

/* Called with the lock held when nothing is outstanding: makes the state
 * final, sending the followers first if the data all landed. While they
 * are sent the batch stays PENDING (nothing expires it), so the state a
 * caller reads is their outcome: DONE when the target acknowledged. */
static void finish_locked(ferry_batch *b) {
  if (b->state != FERRY_BATCH_PENDING || b->finishing || b->outstanding ||
      !ferry_chunker_done(&b->cursor))
    return;
  if (!b->error && (b->has_notify || (b->after && !b->after->carried) || b->file_sync)) {
    b->finishing = 1;
    uint64_t deadline = notify_deadline(b);
    pthread_mutex_unlock(&b->lock);
    ferry_status st = send_followers(b, deadline);
    pthread_mutex_lock(&b->lock);
    b->finishing = 0;
    if (st)
      record_error(b, closed_cause(b, st));
  }
  /* Before the state is final: shutdown returns only once every batch is,
   * so the engine is still there. */
  ferry_stats_finished(b->engine, b->async ? b->error : FERRY_OK);
  b->state = !b->error                     ? FERRY_BATCH_DONE
             : b->error == FERRY_ETIMEDOUT ? FERRY_BATCH_TIMEDOUT
                                           : FERRY_BATCH_FAILED;
  if (b->fence)
    ferry_stream_batch_final(b);
  pthread_cond_broadcast(&b->cond);
}

void ferry_batch_complete(ferry_batch *b, ferry_status status) {
  status = closed_cause(b, status);
  pthread_mutex_lock(&b->lock);
  if (status)
    record_error(b, status);
  b->outstanding--;
  finish_locked(b);
  pthread_mutex_unlock(&b->lock);
}

/* Queues a chunk lost on ch's rail for a channel on another rail; 0 when
 * it cannot be (moved again once already, one rail only, the batch
 * failed). Where ch's rail was the last one up, every rail lost its link at
 * once: the mark of a target that cut all its connections (fabric's IP
 * providers do when it unregisters memory, fabric_sockets.c), not of one
 * dead NIC. The chunk then takes a fresh connection on any rail, and so may
 * those queued to avoid a rail (their other one is down too). A target
 * really unreachable fails it there: each rail's connect fails, and the
 * batch gets every rail's cause. */
static int retry_elsewhere(ferry_batch *b, ferry_channel *ch, const ferry_chunk *c) {
  if (ferry_batch_error(b))
    return 0; /* failed already: the chunk moves nowhere, nor does its end say its rail died */
  ferry_rails_left left = ferry_peer_rail_failed(b->peer, b, ch); /* marks it down */
  if (c->retried || left == FERRY_RAILS_NONE)
    return 0;
  ferry_retry *r = malloc(sizeof *r);
  if (!r)
    return 0;
  copy_chunk(&r->chunk, c);
  r->chunk.retried = 1;
  r->avoid_rail = left == FERRY_RAILS_OTHER ? ch->rail : ANY_RAIL;
  pthread_mutex_lock(&b->lock);
  int queued = !b->error && b->state == FERRY_BATCH_PENDING;
  if (queued) {
    for (ferry_retry *q = b->retries; q && left == FERRY_RAILS_ALL_DOWN; q = q->next)
      q->avoid_rail = ANY_RAIL;
    r->next = b->retries;
    b->retries = r;
  }
  pthread_mutex_unlock(&b->lock);
  if (!queued)
    free(r);
  else
    FERRY_DEBUG("chunk of %llu bytes to %s moves again on %s rail", (unsigned long long)c->bytes,
                b->address, left == FERRY_RAILS_OTHER ? "another" : "a fresh connection of any");
  return queued;
}

void ferry_batch_settle(ferry_batch *b, ferry_channel *ch, const ferry_chunk *c,
                        ferry_status status) {
  if (status == FERRY_ESOCKET && retry_elsewhere(b, ch, c)) {
    ferry_peer_wake(b->peer); /* a driver waiting for a channel can take it */
    return;
  }
  if (!status)
    ferry_peer_rail_moved(b->peer, ch, c->op, c->bytes);
  ferry_batch_complete(b, status);
}

void ferry_batch_fail(ferry_batch *b, ferry_status status) {
  status = closed_cause(b, status);
  pthread_mutex_lock(&b->lock);
  record_error(b, status);
  finish_locked(b);
  pthread_mutex_unlock(&b->lock);
  wake_drivers(b);
}

void ferry_batch_release(ferry_batch *b) {
  pthread_mutex_lock(&b->lock);
  int last = --b->refs == 0;
  pthread_mutex_unlock(&b->lock);
  if (last)
    batch_destroy(b);
}

/* ---- driving ---------------------------------------------------------------------- */

void ferry_batch_drive(ferry_batch *b) {
  if (b->file) {
    ferry_file_drive(b);
    return;
  }
  ferry_peer *p = b->peer;
  for (;;) {
    ferry_channel *ch;
    ferry_status st = ferry_peer_checkout(p, b, &ch);
    if (st == FERRY_ENOTFOUND)
      return; /* nothing left to claim */
    if (st) {
      ferry_batch_fail(b, st);
      return;
    }
    if (ch->peer_instance != b->peer_instance) {
      /* Never let a batch checked against one incarnation land in another. */
      st = ferry_fail(FERRY_ESOCKET, "peer %s restarted during the batch", p->address);
      ferry_peer_checkin(p, ch);
      ferry_batch_fail(b, st);
      return;
    }
    st = ch->transport->channel_drive(ch, b);
    ferry_peer_checkin(p, ch);
    if (st && !ferry_batch_has_work(b))
      return; /* else chunks lost with a rail wait for a channel on another */
  }
}

/* ---- waiting ------------------------------------------------------------------------ */

/* Past its deadline a batch stops handing out work; chunks in flight end by
 * the same deadline (their sockets carry it), then the state is final. */
static void expire_locked(ferry_batch *b) {
  if (b->state != FERRY_BATCH_PENDING || b->finishing || ferry_now_ns() < b->deadline_ns ||
      b->error)
    return;
  ferry_fail(FERRY_ETIMEDOUT, "not finished within its %u ms", b->budget_ms);
  record_error(b, FERRY_ETIMEDOUT);
  finish_locked(b);
}

static ferry_status result_locked(ferry_batch *b) {
  if (b->state == FERRY_BATCH_PENDING)
    return FERRY_EINPROGRESS;
  if (b->state != FERRY_BATCH_DONE)
    ferry_error_set_detail(b->detail);
  return b->error;
}

ferry_batch_state ferry_batch_status(ferry_batch *b, ferry_status *error) {
  if (!b)
    return FERRY_BATCH_FAILED;
  pthread_mutex_lock(&b->lock);
  expire_locked(b);
  ferry_status st = result_locked(b);
  ferry_batch_state state = b->state;
  pthread_mutex_unlock(&b->lock);
  if (error)
    *error = st == FERRY_EINPROGRESS ? FERRY_OK : st;
  return state;
}

ferry_status ferry_batch_wait(ferry_batch *b, int64_t timeout_ms) {
  if (!b)
    return ferry_fail(FERRY_EINVAL, "wait: null batch");
  uint64_t until = timeout_ms < 0 ? UINT64_MAX : ferry_now_ns() + (uint64_t)timeout_ms * 1000000ull;
  pthread_mutex_lock(&b->lock);
  while (b->state == FERRY_BATCH_PENDING) {
    uint64_t wake = b->deadline_ns < until ? b->deadline_ns : until;
    if (b->error || b->outstanding || b->finishing)
      wake = until; /* draining: in-flight chunks and the notification end by their own deadline */
    if (wake != UINT64_MAX) {
      struct timespec ts = ferry_timespec(wake);
      pthread_cond_timedwait(&b->cond, &b->lock, &ts);
    } else {
      pthread_cond_wait(&b->cond, &b->lock);
    }
    expire_locked(b);
    if (ferry_now_ns() >= until)
      break;
  }
  ferry_status st = result_locked(b);
  pthread_mutex_unlock(&b->lock);
  if (st == FERRY_EINPROGRESS)
    ferry_fail(FERRY_EINPROGRESS, "batch to %s still in progress", b->address);
  return st;
}

ferry_status ferry_batch_cancel(ferry_batch *b) {
  if (!b)
    return ferry_fail(FERRY_EINVAL, "cancel: null batch");
  pthread_mutex_lock(&b->lock);
  int pending = b->state == FERRY_BATCH_PENDING, finishing = b->finishing;
  int cancel = pending && !finishing && !b->error;
  if (cancel) {
    ferry_fail(FERRY_ECANCELED, "batch of %zu entries (%llu bytes) to %s cancelled by the caller",
               b->count, (unsigned long long)b->total_bytes, b->address);
    record_error(b, FERRY_ECANCELED); /* stops the cursor: nothing more is claimed */
    finish_locked(b);                 /* final now if nothing was in flight */
  }
  pthread_mutex_unlock(&b->lock);
  if (!cancel)
    return ferry_fail(FERRY_EBUSY, "cancel: the batch to %s %s", b->address,
                      !pending    ? "has already ended"
                      : finishing ? (b->file ? "has moved all its data (the file is being synced)"
                                             : "has landed all its data (its notification is "
                                               "being sent)")
                                  : "is already failing");
  wake_drivers(b); /* drivers waiting for a channel see there is nothing left */
  return FERRY_OK;
}

void ferry_batch_free(ferry_batch *b) {
  if (!b)
    return;
  ferry_batch_wait(b, -1);
  ferry_batch_release(b);
}

/* ---- public entry points ------------------------------------------------------------------ */

ferry_status ferry_batch_prepare(ferry_engine *e, const char *target, const ferry_entry *entries,
                                 size_t count, const ferry_notification *notify,
                                 ferry_batch **out) {
  return batch_create(e, target, entries, count, notify, 0, out);
}

void ferry_batch_hold_clock(ferry_batch *b) {
  pthread_mutex_lock(&b->lock);
  b->deadline_ns = UINT64_MAX;
  pthread_mutex_unlock(&b->lock);
}

void ferry_batch_start_clock(ferry_batch *b) {
  uint64_t now = ferry_now_ns(), deadline = ferry_engine_deadline(b->engine, b->total_bytes);
  pthread_mutex_lock(&b->lock);
  b->deadline_ns = deadline;
  b->budget_ms = (uint32_t)((deadline - now) / 1000000ull);
  pthread_cond_broadcast(&b->cond); /* waiters wake at the deadline now */
  pthread_mutex_unlock(&b->lock);
}

void ferry_batch_retain(ferry_batch *b) {
  pthread_mutex_lock(&b->lock);
  b->refs++;
  pthread_mutex_unlock(&b->lock);
}

void ferry_batch_post(ferry_batch *b) {
  b->async = 1;
  ferry_workers_post(b->engine, b, wanted_drivers(b));
}

ferry_status ferry_batch_run_here(ferry_batch *b, uint64_t start_ns) {
  ferry_engine *e = b->engine;
  /* The caller drives one channel itself: a small transfer then costs no
   * thread hand-off at all. Workers take the other channels. */
  unsigned drivers = wanted_drivers(b);
  if (drivers > 1)
    ferry_workers_post(e, b, drivers - 1);
  ferry_batch_drive(b);
  ferry_status st = ferry_batch_wait(b, -1);
  ferry_batch_release(b);
  ferry_stats_sync_latency(e, ferry_now_ns() - start_ns);
  return st;
}

static ferry_status batch_submit(ferry_engine *e, const char *target, const ferry_entry *entries,
                                 size_t count, const ferry_notification *notify,
                                 ferry_batch **out) {
  ferry_status st = batch_create(e, target, entries, count, notify, 0, out);
  if (!st)
    ferry_batch_post(*out);
  return st;
}

static ferry_status transfer_sync_batch(ferry_engine *e, const char *target,
                                        const ferry_entry *entries, size_t count,
                                        const ferry_notification *notify, ferry_after *after) {
  ferry_batch *b;
  uint64_t start = ferry_now_ns();
  ferry_status st = batch_create(e, target, entries, count, notify, after != NULL, &b);
  if (st)
    return st;
  b->after = after;
  return ferry_batch_run_here(b, start);
}

ferry_status ferry_batch_submit(ferry_engine *e, const char *target, const ferry_entry *entries,
                                size_t count, const ferry_notification *notify, ferry_batch **out) {
  FERRY_GATED(e, batch_submit(e, target, entries, count, notify, out));
}

ferry_status ferry_transfer_sync_batch(ferry_engine *e, const char *target,
                                       const ferry_entry *entries, size_t count,
                                       const ferry_notification *notify) {
  FERRY_GATED(e, transfer_sync_batch(e, target, entries, count, notify, NULL));
}

ferry_status ferry_batch_start(ferry_engine *e, const char *target, const ferry_entry *entries,
                               size_t count, ferry_after *after, ferry_batch **out) {
  ferry_status st = batch_create(e, target, entries, count, NULL, 1, out);
  if (st)
    return st;
  after->carried = after->posted = 0;
  (*out)->after = after;
  ferry_workers_post(e, *out, wanted_drivers(*out));
  return FERRY_OK;
}

ferry_status ferry_batch_run(ferry_engine *e, const char *target, const ferry_entry *entries,
                             size_t count, ferry_after *after) {
  if (after)
    after->carried = after->posted = 0;
  return transfer_sync_batch(e, target, entries, count, NULL, after);
}

ferry_status ferry_transfer_sync(ferry_engine *e, const char *target, ferry_op op, void *local,
                                 uint64_t remote, size_t length) {
  ferry_entry entry = {op, local, remote, length};
  return ferry_transfer_sync_batch(e, target, &entry, 1, NULL);
}
