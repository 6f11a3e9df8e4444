/* map_offload.c - the master's side of client-owned SSD offload
 * (--enable_offload; offload.c is the client's): its tasks, the offloading
 * client's requests (OFFLOAD_POLL, OFFLOAD_DONE) and a GET's loads back,
 * on the map's state (map_internal.h). Apart from map.c, which holds the
 * table, eviction and the other requests, as offload is a mode of its own.
 *
 * A segment whose client polls for tasks is an offloading one; an object
 * with a replica there gets a copy in that client's (its owner's) files,
 * asked by an OFFLOAD task after its commit or when eviction chooses it.
 * Once written (OFF_LOCAL), eviction frees its memory and keeps it, the
 * owner's segment in rep[0]; a GET of it takes space in that segment,
 * queues a LOAD and waits on `changed` (the lock let go) until the owner
 * filled it, then answers that replica. The owner's death drops its
 * copies with its segment; an object that leaves the map has its owner
 * delete the file (a DELETE task). Tasks queue per segment, by key: each
 * is checked against the object when handed out. A loaded-back object is
 * *staged* (OFF_STAGED, on the staged list, in load order): its memory
 * goes back once its get's lease ends, unless promotion
 * (--promotion_on_hit) admits it into the LRU lists for good: from the
 * Nth get that found it on disk only, counted in a count-min sketch by
 * key hash, as Mooncake's. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "store/map_internal.h"

void store_map_set_offload(store_map *m, const store_offload_config *cfg) {
  m->offload = 1;
  m->offload_on_evict = cfg->on_evict;
  m->off_cfg = *cfg;
  if (!m->off_cfg.queue_limit)
    m->off_cfg.queue_limit = 50000; /* Mooncake's default */
  uint32_t at = m->off_cfg.promotion_at;
  m->off_cfg.promotion_at = at < 1 ? 2 : at > 255 ? 255 : at; /* 0: Mooncake's default */
}

void store_map_stop_waits(store_map *m) {
  pthread_mutex_lock(&m->lock);
  m->stopping = 1;
  pthread_cond_broadcast(&m->changed);
  pthread_mutex_unlock(&m->lock);
}

/* ---- offload's tasks (--enable_offload) ----------------------------------------------------- */

/* Queues a task for s's client and wakes its poll; -1 past the queue limit
 * (--offloading_queue_limit) or
 * without memory (the task is not done: an offload is skipped, a load
 * fails, a file stays behind). */
static int queue_task(store_map *m, segment *s, uint8_t kind, const char *key, size_t len) {
  if (s->task_count >= m->off_cfg.queue_limit)
    return -1;
  task *t = malloc(sizeof *t + len);
  if (!t)
    return -1;
  t->next = NULL;
  t->kind = kind;
  t->key_len = (uint16_t)len;
  memcpy(t->key, key, len);
  if (!s->tasks_tail)
    s->tasks_tail = &s->tasks;
  *s->tasks_tail = t;
  s->tasks_tail = &t->next;
  s->task_count++;
  pthread_cond_broadcast(&m->changed);
  return 0;
}

/* The replica of o that an offloading client owns (its disk copy's owner):
 * the first in a segment whose client polls; -1 when none. */
int map_offload_replica(const object *o) {
  for (unsigned i = 0; i < o->replicas; i++)
    if (o->rep[i].seg->offload)
      return (int)i;
  return -1;
}

/* The segment of the client holding o's disk copy, or NULL. */
segment *map_disk_owner(const object *o) {
  if (!(o->off & OFF_LOCAL))
    return NULL;
  if (!o->replicas)
    return o->rep[0].seg;
  int i = map_offload_replica(o);
  return i < 0 ? NULL : o->rep[i].seg;
}

static int replica_in(const object *o, const segment *s) {
  for (unsigned i = 0; i < o->replicas; i++)
    if (o->rep[i].seg == s)
      return (int)i;
  return -1;
}

/* Asks o's owner to write its file, once. */
void map_queue_offload(store_map *m, object *o) {
  int i = map_offload_replica(o);
  if (i < 0 || o->off & (OFF_LOCAL | OFF_QUEUED | OFF_WRITING))
    return;
  if (queue_task(m, o->rep[i].seg, STORE_TASK_OFFLOAD, key_of(o), o->key_len) == 0)
    o->off |= OFF_QUEUED;
}

/* o leaves the store or its disk copy is dropped: its owner deletes the file. */
void map_queue_delete(store_map *m, object *o) {
  segment *owner = map_disk_owner(o);
  if (owner)
    queue_task(m, owner, STORE_TASK_DELETE, key_of(o), o->key_len);
  o->off &= (uint8_t)~OFF_LOCAL;
}

/* o keeps only its copy on its owner's disk: its memory is given back,
 * rep[0] remembers the owner's segment. */
uint64_t map_to_owner_disk_only(store_map *m, object *o) {
  segment *owner = map_disk_owner(o);
  map_unlist(m, o);
  uint64_t largest = map_free_replicas(o);
  o->rep[0] = (replica){owner, 0};
  o->off &= (uint8_t)~OFF_EVICT;
  map_journal_object(m, o);
  return largest;
}

/* ---- loads back for a get ------------------------------------------------------------------- */

/* Staged objects whose gets' leases ended are on their owner's disk only
 * again (their memory given back). The whole list: its order is the
 * loads', not quite their leases' (a load's holds until its get answers);
 * it holds only what gets read from disk within a lease. */
void map_unstage_ended(store_map *m, uint64_t now) {
  for (object *o = m->staged.oldest, *next; o; o = next) {
    next = o->newer;
    if (o->lease_until_ns <= now) {
      map_to_owner_disk_only(m, o);
      o->off &= (uint8_t)~OFF_STAGED;
    }
  }
}

/* Space for o in its owner's segment, evicting least-recently-used objects
 * with a replica there while none is free, and a LOAD task for the owner:
 * 1. 2: not yet: objects eviction chose are written to disk first
 * (--offload_on_evict; their memory goes then), or leases hold them (then
 * *retry_at: when the first ends). 0: no room, or the owner's queue is
 * full. */
static int start_load(store_map *m, object *o, uint64_t now, uint64_t *retry_at) {
  segment *owner = o->rep[0].seg;
  eviction_round r = {.now = now, .for_what = "load(s) from an owner's disk (--enable_offload)"};
  uint64_t offset;
  object *victim = NULL;
  int placed;
  while (!(placed = store_extents_alloc(&owner->space, o->size, &offset) == 0)) {
    while ((victim = map_next_victim(m, &r)) && replica_in(victim, owner) < 0)
      ;
    if (!victim)
      break;
    map_evict(m, &r, victim, FOR_PUTS);
  }
  r.puts = r.objects[FOR_PUTS] > 0;
  map_log_round(&r);
  if (r.lease_ends && r.lease_ends < *retry_at)
    *retry_at = r.lease_ends;
  if (!placed)
    return r.offloading[FOR_PUTS] || r.writing || r.lease_ends ? 2 : 0;
  if (queue_task(m, owner, STORE_TASK_LOAD, key_of(o), o->key_len) != 0) {
    store_extents_free(&owner->space, offset, o->size);
    return 0;
  }
  o->rep[0].offset = offset;
  o->off |= OFF_LOADING;
  o->lease_until_ns = now + m->lease_ns; /* its space is not reused under the owner's write */
  return 1;
}

/* A GET of objects that are on their owner's disk only: each is loaded back
 * into its owner's segment (the owner reads its file into it) while this
 * request waits, at most a PING interval (an owner that does not poll
 * within it is stalled: a third of the silence that drops it); the reply then names that memory as
 * any replica. The lock is let go while waiting. Returns the wait's deadline. */
uint64_t map_load_back(store_map *m, const store_reader *keys, uint32_t count) {
  uint64_t deadline = ferry_now_ns() + m->ping_ms * 1000000ull;
  for (;;) {
    store_reader r = *keys;
    int waiting = 0;
    uint64_t now = ferry_now_ns(), wake = deadline;
    map_unstage_ended(m, now); /* their memory may be what a load needs */
    for (uint32_t i = 0; i < count && !r.bad; i++) {
      const char *key;
      size_t len;
      store_get_str(&r, &key, &len, STORE_KEY_MAX);
      object **at = r.bad ? NULL : map_find(m, key, len, COMMITTED);
      if (at && (*at)->off & OFF_LOADING)
        waiting = 1;
      else if (at && !(*at)->replicas && (*at)->off & OFF_LOCAL && now < deadline)
        waiting |= start_load(m, *at, now, &wake) != 0;
    }
    if (!waiting || now >= deadline || m->stopping)
      return m->stopping ? 0 : deadline;
    struct timespec at = ferry_timespec(wake);
    pthread_cond_timedwait(&m->changed, &m->lock, &at);
  }
}

/* One more get of o, loaded back from its owner's disk for it: counted,
 * and with --promotion_on_hit, the Nth such get (Mooncake's admission
 * threshold) keeps it in memory: off the staged list onto its LRU list. */
void map_promote(store_map *m, object *o) {
  uint8_t least = 255;
  for (unsigned row = 0; row < SKETCH_ROWS; row++) {
    uint8_t *slot = &m->sketch[row][(o->hash >> (16 * row)) % SKETCH_WIDTH];
    *slot += *slot < 255;
    least = *slot < least ? *slot : least;
  }
  if (++m->sketch_adds >= SKETCH_AGE) {
    m->sketch_adds = 0;
    for (unsigned row = 0; row < SKETCH_ROWS; row++)
      for (unsigned i = 0; i < SKETCH_WIDTH; i++)
        m->sketch[row][i] >>= 1;
  }
  int admitted = m->off_cfg.promotion_on_hit && least >= m->off_cfg.promotion_at;
  count_op(m, STORE_COUNT_PROMOTION, admitted ? FERRY_OK : FERRY_EBUSY);
  if (!admitted)
    return;
  map_unlist(m, o);
  o->off &= (uint8_t)~OFF_STAGED;
  map_enlist(m, o);
}

/* ---- the offloading client's requests ------------------------------------------------------- */

/* The segment an OFFLOAD_* request names, when its nonce is the one the
 * segment's REGISTER gave (the same client process: its offload
 * connection is another connection); NULL with why otherwise. */
static segment *owned_segment(store_map *m, store_reader *r, ferry_status *st, char *why,
                              size_t size) {
  const char *name;
  size_t len;
  store_get_str(r, &name, &len, STORE_NAME_MAX);
  uint64_t nonce = store_get_u64(r);
  if (r->bad)
    return snprintf(why, size, "malformed offload request"), *st = FERRY_EPROTO, NULL;
  if (!m->offload)
    return snprintf(why, size,
                    "this master runs without --enable_offload: start it with the flag to "
                    "offload to the clients' disks"),
           *st = FERRY_EINVAL, NULL;
  segment *s = map_find_segment(m, name, len);
  if (!s)
    return snprintf(why, size,
                    "segment %.*s is not mounted (its client registers it first; after a "
                    "master restart, at its next call)",
                    (int)len, name),
           *st = FERRY_ENOTFOUND, NULL;
  if (!nonce || s->nonce != nonce)
    return snprintf(why, size,
                    "segment %.*s: the nonce does not match its REGISTER: not that segment's "
                    "client",
                    (int)len, name),
           *st = FERRY_EAUTH, NULL;
  return s;
}

/* One task handed out (its entry written), or dropped when its object went
 * or changed. An offload's object is not evicted nor removed until the
 * owner reports it (an upsert that replaces it meanwhile keeps its space a
 * lease longer: retire()). */
static int hand_out(store_map *m, segment *s, task *t, uint64_t now, store_writer *w) {
  object **at = map_find(m, t->key, t->key_len, COMMITTED), *o = at ? *at : NULL;
  uint64_t addr = 0, size = 0;
  int i = o ? replica_in(o, s) : -1;
  if (t->kind == STORE_TASK_OFFLOAD) {
    if (!o || !(o->off & OFF_QUEUED) || i < 0)
      return 0;
    o->off = (uint8_t)((o->off & ~OFF_QUEUED) | OFF_WRITING);
    addr = s->base + o->rep[i].offset;
    size = o->size;
  } else if (t->kind == STORE_TASK_LOAD) {
    if (!o || !(o->off & OFF_LOADING) || o->replicas || o->rep[0].seg != s)
      return 0;
    addr = s->base + o->rep[0].offset;
    size = o->size;
  } else {
    count_op(m, STORE_COUNT_OFFLOAD_DELETE, FERRY_OK);
  }
  store_put_u8(w, t->kind);
  store_put_str(w, t->key, t->key_len);
  store_put_u64(w, addr);
  store_put_u64(w, size);
  return 1;
}

/* OFFLOAD_POLL: the tasks of the caller's segment, waiting for one at most
 * wait_ms (at most 1 s: a stopping master joins this thread). */
ferry_status map_serve_poll(store_map *m, store_reader *r, store_writer *reply, char *why,
                            size_t size) {
  ferry_status st = FERRY_OK;
  store_reader named = *r;
  segment *s = owned_segment(m, r, &st, why, size);
  uint32_t wait_ms = store_get_u32(r), max = store_get_u32(r);
  if (!s)
    return st;
  if (r->bad)
    return snprintf(why, size, "malformed OFFLOAD_POLL"), FERRY_EPROTO;
  if (!s->offload) {
    s->offload = 1;
    map_journal_segment(m, s); /* not journaled: a new leader learns it at the client's next poll */
  }
  uint64_t deadline = ferry_now_ns() + (wait_ms < 1000 ? wait_ms : 1000) * 1000000ull;
  while (!s->tasks && ferry_now_ns() < deadline && !m->stopping) {
    struct timespec at = ferry_timespec(deadline);
    pthread_cond_timedwait(&m->changed, &m->lock, &at);
    store_reader again = named;
    if (!(s = owned_segment(m, &again, &st, why, size))) {
      store_put_u32(reply, 0); /* it left meanwhile (its client is closing): no task */
      return FERRY_OK;
    }
  }
  size_t count_at = reply->len;
  store_put_u32(reply, 0);
  uint32_t n = 0;
  uint64_t now = ferry_now_ns();
  while (n < max && n < STORE_BATCH_MAX && s->tasks) {
    task *t = s->tasks;
    if (!(s->tasks = t->next))
      s->tasks_tail = &s->tasks;
    s->task_count--;
    n += (uint32_t)hand_out(m, s, t, now, reply);
    free(t);
  }
  if (!reply->failed)
    for (int b = 0; b < 4; b++)
      reply->buf[count_at + (size_t)b] = (uint8_t)(n >> (8 * b));
  return FERRY_OK;
}

/* One OFFLOAD_DONE entry: the owner wrote (or failed to write) an object's
 * file, or loaded it back into its segment. FERRY_OK when the master keeps
 * the file; anything else tells the owner to delete it. */
static ferry_status done_one(store_map *m, segment *s, uint8_t kind, const char *key, size_t len,
                             int32_t outcome, uint64_t now) {
  object **at = map_find(m, key, len, COMMITTED), *o = at ? *at : NULL;
  pthread_cond_broadcast(&m->changed); /* a GET may wait for this (map_load_back) */
  if (kind == STORE_TASK_OFFLOAD && o && o->off & OFF_WRITING && replica_in(o, s) >= 0) {
    int evict_now = o->off & OFF_EVICT;
    o->off &= (uint8_t) ~(OFF_WRITING | OFF_EVICT);
    if (outcome != 0)
      return FERRY_EIO;
    o->off |= OFF_LOCAL;
    if (evict_now && o->lease_until_ns <= now && map_list_of(m, o)) { /* --offload_on_evict */
      m->evicted_keys++;
      m->evicted_bytes += footprint(o);
      map_to_owner_disk_only(m, o);
    } else {
      map_journal_object(m, o); /* HA: the copy outlives this leader (restored with its object) */
    }
    return FERRY_OK;
  }
  if (kind == STORE_TASK_LOAD && o && o->off & OFF_LOADING && !o->replicas && o->rep[0].seg == s) {
    if (outcome != 0) { /* its file is missing or damaged: the object goes */
      o->off &= (uint8_t)~OFF_LOCAL;
      map_unlink_object(m, at);
      return FERRY_EIO;
    }
    o->off = (uint8_t)((o->off & ~OFF_LOADING) | OFF_STAGED); /* map_promote() may admit it */
    o->replicas = 1;
    o->used_ns = now;
    /* Held until the gets waiting for it wake and answer it (each then
     * sets the usual lease, from its answer): at most a PING interval,
     * their wait's bound. A second waiter woken after the first answer's
     * lease ended finds it on disk only again and loads it again. */
    uint64_t ping_ns = m->ping_ms * 1000000ull;
    o->lease_until_ns = now + (ping_ns > m->lease_ns ? ping_ns : m->lease_ns);
    map_enlist(m, o);
    map_journal_object(m, o);
    return FERRY_OK;
  }
  if (kind == STORE_TASK_DROP && o && map_disk_owner(o) == s) { /* the owner's directory is full */
    if (o->off & (OFF_LOADING | OFF_STAGED))
      return FERRY_EBUSY;          /* a get has it loaded: its memory is the file's, for now */
    o->off &= (uint8_t)~OFF_LOCAL; /* its owner deletes the file: no DELETE task */
    if (o->replicas)
      map_journal_object(m, o);
    else
      map_unlink_object(m, at);
    return FERRY_OK;
  }
  return kind == STORE_TASK_DELETE ? FERRY_OK : FERRY_ENOTFOUND;
}

/* A REPORT of the client of s: it holds key's file, of a value of size
 * bytes. A segment that polled this master already has its copies known
 * here (a report after its connection came back): nothing to take. Else
 * (a restarted master, a new process of the owner) a key the map does not
 * have becomes a disk-only object of that owner, loaded back as any; one
 * it has (a put since) is newer than the file, which goes. */
static ferry_status adopt_file(store_map *m, segment *s, const char *key, size_t len,
                               uint64_t size) {
  object **at = map_find(m, key, len, COMMITTED);
  if (s->offload)
    return FERRY_OK;
  if (at || map_find(m, key, len, PENDING))
    return at && map_disk_owner(*at) == s ? FERRY_OK : FERRY_EBUSY;
  if (!len || !size)
    return FERRY_EINVAL;
  object *o = calloc(1, sizeof *o + sizeof(replica) + len);
  if (!o)
    return FERRY_ENOMEM;
  o->hash = map_hash_key(key, len);
  o->size = size;
  o->room = 1;
  o->key_len = (uint16_t)len;
  memcpy(key_of(o), key, len);
  o->off = OFF_LOCAL;
  o->rep[0] = (replica){s, 0};
  o->used_ns = ferry_now_ns();
  object **bucket = bucket_of(m, o->hash);
  o->next = *bucket;
  *bucket = o;
  m->objects++;
  map_grow(m);
  map_journal_object(m, o);
  return FERRY_OK;
}

ferry_status map_serve_done(store_map *m, store_reader *r, uint32_t count, store_writer *reply,
                            char *why, size_t size) {
  ferry_status st = FERRY_OK;
  segment *s = owned_segment(m, r, &st, why, size);
  if (!s)
    return st;
  uint64_t now = ferry_now_ns();
  for (uint32_t i = 0; i < count; i++) {
    uint8_t kind = store_get_u8(r);
    const char *key;
    size_t len;
    store_get_str(r, &key, &len, STORE_KEY_MAX);
    int32_t outcome = (int32_t)store_get_u32(r);
    uint64_t bytes = kind == STORE_TASK_REPORT ? store_get_u64(r) : 0;
    if (r->bad)
      return snprintf(why, size, "malformed OFFLOAD_DONE entry %u", i), FERRY_EPROTO;
    ferry_status done = kind == STORE_TASK_REPORT ? adopt_file(m, s, key, len, bytes)
                                                  : done_one(m, s, kind, key, len, outcome, now);
    if (kind == STORE_TASK_REPORT)
      count_op(m, STORE_COUNT_OFFLOAD_REPORT, done);
    if (kind == STORE_TASK_OFFLOAD || kind == STORE_TASK_LOAD || kind == STORE_TASK_DROP)
      count_op(m,
               kind == STORE_TASK_OFFLOAD ? STORE_COUNT_OFFLOAD_WRITE
               : kind == STORE_TASK_LOAD  ? STORE_COUNT_OFFLOAD_LOAD
                                          : STORE_COUNT_OFFLOAD_DROP,
               outcome ? FERRY_EIO : done);
    store_put_u32(reply, (uint32_t)done);
  }
  return FERRY_OK;
}
