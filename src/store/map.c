/* map.c - the store master's state and its requests (map.h): the table,
 * the LRU lists and eviction, leases, pins, puts, gets, removals, GC,
 * segments, a client's leaving and the HA journal and restore (the types
 * are in map_internal.h; client-owned offload is map_offload.c's).
 *
 * Objects are in a chained hash table by key; each replica points at its
 * segment and holds an extent of that segment's free list. A pending
 * object (a put between PUT_START and PUT_END) belongs to its writer and
 * is invisible to everyone; a GET's lease keeps an object from being
 * removed or evicted.
 *
 * Upsert: a key has at most two objects in the table, its committed one
 * and one pending (a put of a new key, or an upsert's new value, written
 * into space of its own while GETs still find the committed one). The
 * upsert's PUT_END swaps them: the new one commits, the old one leaves the
 * table at once; a GET's lease still running on it keeps its space on the
 * retired list until the lease ends (the reader's READ may not have run
 * yet), then the next PUT_START frees it.
 *
 * Eviction: committed objects are threaded on two lists, oldest first:
 * the plain ones in the order of their last use (commit or GET), and the
 * soft-pinned ones in the order their pins end (a pin's deadline is fixed
 * at the commit, as Mooncake's: a GET does not move it). An eviction round
 * walks both lists from their oldest end at once, as a merge: the older
 * head by last use goes, a soft one whose pin still holds only once no
 * plain one is left (so soft ones whose pins ended go in deadline order,
 * each in its LRU turn against the plain ones). Leased objects are passed
 * over (and counted, for the "nothing left to evict" message). Each step
 * is O(1) plus the leased objects it passes; a commit places a soft one by
 * its deadline from the newest end, O(1) when its TTL is the usual one.
 *
 * The SSD tier (--root_fs_dir, disk.h): an object whose writer reported
 * its file complete is `on_disk`. Eviction then frees its replicas but
 * keeps it, disk-only: on neither list (nothing of it to evict), got from
 * its file, gone when removed or when its file proves missing or damaged.
 * The master deletes the file of every object that leaves the map (and
 * of a revoked put, whose writer may have written it).
 *
 * Client-owned offload (--enable_offload) is map_offload.c's: its tasks,
 * its clients' requests and a GET's loads back; eviction here asks it for
 * a copy first, and an object that leaves has its owner delete the file.
 *
 * GC (--enable_gc): each GET queues its keys' removal at a deadline; as
 * the delay is one for all, the queue is in deadline order and a sweep at
 * each request takes its due head. An entry names the key and the GET's
 * time: the object goes only if nothing used it since (no later GET, no
 * new value committed), so a removal never takes a value nobody read. */
#include "store/map.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/sync.h"
#include "store/disk.h"
#include "store/extents.h"
#include "store/map_internal.h"

store_map *store_map_create(uint32_t lease_ttl_ms, uint32_t client_ttl_ms,
                            const store_eviction *eviction) {
  store_map *m = calloc(1, sizeof *m);
  if (!m)
    return NULL;
  m->bucket_count = 1024;
  m->buckets = calloc(m->bucket_count, sizeof *m->buckets);
  if (!m->buckets) {
    free(m);
    return NULL;
  }
  pthread_mutex_init(&m->lock, NULL);
  ferry_cond_init(&m->changed);
  m->lease_ms = lease_ttl_ms;
  m->lease_ns = lease_ttl_ms * 1000000ull;
  m->ping_ms = client_ttl_ms / 3 ? client_ttl_ms / 3 : 1;
  m->high_watermark = eviction->high_watermark;
  m->eviction_ratio = eviction->ratio;
  m->soft_pin_ns = eviction->soft_pin_ttl_ms * 1000000ull;
  m->max_soft_pin_ms = eviction->max_soft_pin_ttl_ms;
  m->keep_soft_pinned = eviction->keep_soft_pinned;
  return m;
}

int store_map_set_disk(store_map *m, const char *dir) {
  free(m->fs_dir);
  m->fs_dir = dir && *dir ? strdup(dir) : NULL;
  return dir && *dir && !m->fs_dir ? -1 : 0;
}

static segment *mount(store_map *m, uint64_t client, const char *name, size_t name_len,
                      uint64_t base, uint64_t length, uint64_t nonce);

int store_map_set_pool(store_map *m, const char *name, uint64_t size) {
  m->pool = mount(m, 0, name, strlen(name), STORE_POOL_BASE, size, 0); /* client 0: nobody's */
  return m->pool ? 0 : -1;
}

/* ---- the journal (HA) ----------------------------------------------------------------------- */

void store_map_set_journal(store_map *m, const store_journal *journal) {
  pthread_mutex_lock(&m->lock);
  m->journal = journal ? *journal : (store_journal){0};
  pthread_mutex_unlock(&m->lock);
}

/* o's record (malloc'd; NULL: no memory): "SIZE PIN ON_DISK N", then
 * " OFFSET HEX(SEGMENT NAME)" per replica (a name may hold any byte but
 * NUL), then " disk=HEX(SEGMENT NAME)" when the client of that segment
 * holds its file (--enable_offload): a new leader keeps that copy, and a
 * disk-only object with it. */
static char *record_of(const object *o) {
  size_t cap = 64 + (o->replicas + 1) * (24 + 2 * STORE_NAME_MAX);
  char *rec = malloc(cap);
  if (!rec)
    return NULL;
  size_t n = (size_t)snprintf(rec, cap, "%llu %u %u %u", (unsigned long long)o->size, o->pin,
                              o->on_disk, o->replicas);
  for (unsigned i = 0; i < o->replicas; i++) {
    n += (size_t)snprintf(rec + n, cap - n, " %llu ", (unsigned long long)o->rep[i].offset);
    for (const char *c = o->rep[i].seg->name; *c; c++)
      n += (size_t)snprintf(rec + n, cap - n, "%02x", (uint8_t)*c);
  }
  const segment *owner = map_disk_owner(o);
  if (owner)
    n += (size_t)snprintf(rec + n, cap - n, " disk=");
  for (const char *c = owner ? owner->name : ""; *c; c++)
    n += (size_t)snprintf(rec + n, cap - n, "%02x", (uint8_t)*c);
  return rec;
}

/* n objects' records (gone: NULL records, they left), in one write of the
 * journal. 0 when journaled or off. */
static int journal_batch(store_map *m, object *const *os, size_t n, int gone) {
  if (!m->journal.objects || n == 0)
    return 0;
  const char *keys[STORE_JOURNAL_BATCH] = {0};
  size_t lens[STORE_JOURNAL_BATCH] = {0};
  char *recs[STORE_JOURNAL_BATCH] = {0};
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    keys[i] = key_of(os[i]);
    lens[i] = os[i]->key_len;
    if (!gone && !(recs[i] = record_of(os[i])))
      rc = -1;
  }
  if (rc == 0)
    rc = m->journal.objects(m->journal.ctx, n, keys, lens, (const char *const *)recs);
  for (size_t i = 0; i < n; i++)
    free(recs[i]);
  return rc;
}

int map_journal_object(store_map *m, object *o) { return journal_batch(m, &o, 1, 0); }

/* A committed object left the map: its record goes (a pending one has none). */
static void journal_gone(store_map *m, object *o) {
  if (!o->writer)
    journal_batch(m, &o, 1, 1);
}

static void destroy_segment(segment *s) {
  for (task *t = s->tasks, *next; t; t = next) {
    next = t->next;
    free(t);
  }
  store_extents_destroy(&s->space);
  free(s);
}

/* Gives the replicas' space back (a load's too); returns the largest free
 * extent that made (what a put waiting for room needs). */
uint64_t map_free_replicas(object *o) {
  uint64_t largest = 0;
  if (o->off & OFF_LOADING && !o->replicas)
    largest = store_extents_free(&o->rep[0].seg->space, o->rep[0].offset, o->size);
  o->off &= (uint8_t)~OFF_LOADING;
  for (unsigned i = 0; i < o->replicas; i++) {
    uint64_t extent = store_extents_free(&o->rep[i].seg->space, o->rep[i].offset, o->size);
    largest = extent > largest ? extent : largest;
  }
  o->replicas = 0;
  return largest;
}

void store_map_destroy(store_map *m) {
  for (size_t b = 0; b < m->bucket_count; b++)
    for (object *o = m->buckets[b], *next; o; o = next) {
      next = o->next;
      free(o);
    }
  for (object *o = m->retired, *next; o; o = next) {
    next = o->next;
    free(o);
  }
  for (gc_entry *e = m->gc_head, *next; e; e = next) {
    next = e->next;
    free(e);
  }
  for (segment *s = m->segments, *next; s; s = next) {
    next = s->next;
    destroy_segment(s);
  }
  pthread_cond_destroy(&m->changed);
  pthread_mutex_destroy(&m->lock);
  free(m->fs_dir);
  free(m->buckets);
  free(m);
}

/* ---- the LRU lists -------------------------------------------------------------------------- */

/* The list o is on: NULL for a pending, hard-pinned or disk-only object. */
lru *map_list_of(store_map *m, const object *o) {
  if (o->off & OFF_STAGED)
    return &m->staged;
  if (o->writer || o->pin == FERRY_STORE_PIN_HARD || !o->replicas)
    return NULL;
  return o->pin == FERRY_STORE_PIN_SOFT ? &m->soft : &m->plain;
}

static void lru_remove(lru *l, object *o) {
  *(o->older ? &o->older->newer : &l->oldest) = o->newer;
  *(o->newer ? &o->newer->older : &l->newest) = o->older;
  o->older = o->newer = NULL;
}

static void lru_append(lru *l, object *o) {
  o->older = l->newest;
  o->newer = NULL;
  *(l->newest ? &l->newest->newer : &l->oldest) = o;
  l->newest = o;
}

/* Puts o on the soft list by its deadline, searching from the newest end. */
static void soft_insert(lru *l, object *o) {
  object *after = l->newest;
  while (after && after->pin_until_ns > o->pin_until_ns)
    after = after->older;
  o->older = after;
  o->newer = after ? after->newer : l->oldest;
  *(o->newer ? &o->newer->older : &l->newest) = o;
  *(after ? &after->newer : &l->oldest) = o;
}

/* A committed object was got: it is now the most recently used (a soft
 * one keeps its place: its list is in deadline order). */
static void touch(store_map *m, object *o, uint64_t now) {
  lru *l = map_list_of(m, o);
  o->used_ns = now;
  if (l == &m->plain || l == &m->staged) { /* (a staged one: its lease, just renewed) */
    lru_remove(l, o);
    lru_append(l, o);
  }
}

/* Puts a committed object on its list (or counts it hard-pinned). */
void map_enlist(store_map *m, object *o) {
  lru *l = map_list_of(m, o);
  if (l == &m->soft) {
    soft_insert(l, o);
    m->soft_count++;
  } else if (l)
    lru_append(l, o);
  else if (o->replicas)
    m->hard_pinned++;
}

/* now + ns, saturating. */
static uint64_t deadline_after(uint64_t now, uint64_t ns) {
  return ns > UINT64_MAX - now ? UINT64_MAX : now + ns;
}

/* o's pin once it commits: its soft pin action against the value it
 * replaces (old, or NULL). PRESERVE keeps old's soft pin and deadline
 * while it holds; ENABLE pins for the TTL o asked (pin_until_ns while
 * pending); DISABLE or a TTL of 0 pins nothing. A hard pin stays. */
static void settle_pin(object *o, const object *old, uint64_t now) {
  uint64_t ttl = o->pin_until_ns;
  o->pin_until_ns = 0;
  if (o->pin == FERRY_STORE_PIN_HARD)
    return;
  o->pin = FERRY_STORE_PIN_NONE;
  if (o->soft_action == FERRY_STORE_SOFT_PIN_ENABLE && ttl) {
    o->pin = FERRY_STORE_PIN_SOFT;
    o->pin_until_ns = deadline_after(now, ttl);
  } else if (o->soft_action == FERRY_STORE_SOFT_PIN_PRESERVE && old &&
             old->pin == FERRY_STORE_PIN_SOFT && old->pin_until_ns > now) {
    o->pin = FERRY_STORE_PIN_SOFT;
    o->pin_until_ns = old->pin_until_ns;
  }
}

/* A pending object commits: visible, and on its list as the most recent. */
static void commit(store_map *m, object *o, uint64_t now) {
  o->writer = 0;
  o->used_ns = now;
  m->pending--;
  map_enlist(m, o);
  if (m->offload && !m->offload_on_evict)
    map_queue_offload(m, o);
}

/* ---- the table ------------------------------------------------------------------------------ */

/* One step: a word of the key into the state. */
static uint64_t hash_word(uint64_t h, uint64_t word) {
  h = (h ^ word) * 0xff51afd7ed558ccdull;
  return h ^ (h >> 32);
}

/* Eight bytes a step, not one: keys run long (SGLang's name a prefix, a
 * hash and a rank), and a put hashes each of them twice or three times.
 * The last mix (MurmurHash3's finalizer) spreads every byte into the low
 * bits that pick a bucket. */
uint64_t map_hash_key(const char *key, size_t len) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ len, word;
  size_t i = 0;
  for (; i + sizeof word <= len; i += sizeof word) {
    memcpy(&word, key + i, sizeof word);
    h = hash_word(h, word);
  }
  if (i < len) {
    word = 0;
    memcpy(&word, key + i, len - i);
    h = hash_word(h, word);
  }
  h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

static int selected(const object *o, uint64_t which) {
  return which == PENDING ? o->writer != 0 : o->writer == which;
}

/* The slot holding key's object that `which` selects (NULL: none), and the
 * key's committed object in *committed (NULL: none), in one walk of its
 * chain: a put's start and end ask for both. */
static object **find_with_committed(store_map *m, const char *key, size_t len, uint64_t which,
                                    object **committed) {
  uint64_t h = map_hash_key(key, len);
  object **found = NULL;
  *committed = NULL;
  for (object **at = bucket_of(m, h); *at && !(found && *committed); at = &(*at)->next)
    if ((*at)->hash == h && (*at)->key_len == len && !memcmp(key_of(*at), key, len)) {
      if (!found && selected(*at, which))
        found = at;
      if (!*committed && selected(*at, COMMITTED))
        *committed = *at;
    }
  return found;
}

/* Warms the chains of a request's keys (count entries, each a key then
 * tail bytes) before they are served. A batch's keys come after its bytes
 * moved (megabytes through the caches), so the table is cold, and each key
 * would wait for its bucket and then for the object at its head, one miss
 * after the other: asking for every bucket, then every head, overlaps them
 * (PUT_START, PUT_END and GET of 1024 keys after 64 MiB moved: 40-50% less
 * time in the master). A malformed entry ends it: the request fails later. */
static void prefetch_chains(store_map *m, const store_reader *r, uint32_t count, size_t tail) {
  for (int heads = 0; heads < 2; heads++) {
    store_reader at = *r;
    for (uint32_t i = 0; i < count; i++) {
      const char *key;
      size_t len;
      store_get_str(&at, &key, &len, STORE_KEY_MAX);
      if (at.bad || at.left < tail)
        return;
      at.p += tail;
      at.left -= tail;
      object **bucket = bucket_of(m, map_hash_key(key, len));
      if (!heads)
        __builtin_prefetch(bucket);
      else if (*bucket)
        __builtin_prefetch(*bucket);
    }
  }
}

/* The slot holding key's object that `which` selects, or NULL. */
object **map_find(store_map *m, const char *key, size_t len, uint64_t which) {
  object *committed;
  return find_with_committed(m, key, len, which, &committed);
}

/* Doubles the table past one object per bucket; stays as it is without memory. */
void map_grow(store_map *m) {
  if (m->objects < m->bucket_count)
    return;
  size_t count = m->bucket_count * 2;
  object **buckets = calloc(count, sizeof *buckets);
  if (!buckets)
    return;
  for (size_t b = 0; b < m->bucket_count; b++)
    for (object *o = m->buckets[b], *next; o; o = next) {
      next = o->next;
      o->next = buckets[o->hash & (count - 1)];
      buckets[o->hash & (count - 1)] = o;
    }
  free(m->buckets);
  m->buckets = buckets;
  m->bucket_count = count;
}

/* Takes o off its list, or out of the count of those on none. */
void map_unlist(store_map *m, object *o) {
  lru *l = map_list_of(m, o);
  if (l) {
    lru_remove(l, o);
    m->soft_count -= l == &m->soft;
  } else if (o->writer)
    m->pending--;
  else if (o->replicas) /* hard-pinned; a disk-only one is counted nowhere */
    m->hard_pinned--;
}

/* o keeps only its file: off its list, its replicas gone (their space
 * given back when give_back, else their segment is going). */
static uint64_t to_disk_only(store_map *m, object *o, int give_back) {
  map_unlist(m, o);
  uint64_t largest = 0;
  if (give_back)
    largest = map_free_replicas(o);
  o->replicas = 0;
  map_journal_object(m, o);
  return largest;
}

/* Takes *at out of the table and off its list (its journal record stays:
 * an upsert's retire leaves the new value's there). */
static object *detach(store_map *m, object **at) {
  object *o = *at;
  map_unlist(m, o);
  *at = o->next;
  m->objects--;
  return o;
}

/* Gives o's replicas' space back and frees it; returns free_replicas'
 * largest extent. */
static uint64_t free_object(object *o) {
  uint64_t largest = map_free_replicas(o);
  free(o);
  return largest;
}

/* Removes *at from the table and its list, deletes its file (a pending
 * put's too: its writer may have written it) and frees it; returns
 * free_object's largest extent. */
uint64_t map_unlink_object(store_map *m, object **at) {
  journal_gone(m, *at);
  object *o = detach(m, at);
  if (m->fs_dir && (o->on_disk || o->writer))
    store_disk_remove(m->fs_dir, key_of(o), o->key_len);
  map_queue_delete(m, o);
  return free_object(o);
}

/* An upsert committed over *at: it leaves the table (GETs find the new
 * value); its space is freed now, or once the last GET's lease on it ended. */
static void retire(store_map *m, object **at, uint64_t now) {
  object *o = detach(m, at);
  if (o->off & OFF_WRITING && o->lease_until_ns < now + m->lease_ns)
    o->lease_until_ns = now + m->lease_ns; /* its owner still reads it */
  o->on_disk = 0; /* the key's file, if any, is the new value's (UPSERT_START dropped its own) */
  map_queue_delete(m, o); /* before the new value's offload: the owner does its tasks in order */
  if (o->lease_until_ns <= now) {
    free_object(o);
    return;
  }
  o->next = m->retired;
  m->retired = o;
  m->retired_count++;
}

/* Frees the retired objects whose leases ended. O(retired): those replaced
 * within a lease of a GET of them. */
static void reap_retired(store_map *m, uint64_t now) {
  for (object **at = &m->retired; *at;) {
    object *o = *at;
    if (o->lease_until_ns > now) {
      at = &o->next;
      continue;
    }
    *at = o->next;
    m->retired_count--;
    free_object(o);
  }
}

/* ---- GC (--enable_gc) ----------------------------------------------------------------------- */

void store_map_set_gc(store_map *m, uint32_t after_get_ms) { m->gc_ns = after_get_ms * 1000000ull; }

/* A GET at now read o: its removal is queued, at the later of the delay
 * and the lease that GET holds. Without memory it is not queued (the
 * object stays, as Mooncake's when its queue is full). */
static void gc_queue(store_map *m, const object *o, uint64_t now) {
  gc_entry *e = malloc(sizeof *e + o->key_len);
  if (!e) {
    FERRY_WARN("store master: --enable_gc: out of memory; \"%.*s\" stays", (int)o->key_len,
               key_of((object *)o));
    return;
  }
  e->next = NULL;
  e->got_ns = now;
  e->due_ns = deadline_after(now, m->gc_ns > m->lease_ns ? m->gc_ns : m->lease_ns);
  e->key_len = o->key_len;
  memcpy(e->key, key_of((object *)o), o->key_len);
  *(m->gc_tail ? &m->gc_tail->next : &m->gc_head) = e;
  m->gc_tail = e;
}

static ferry_status remove_one(store_map *m, object **at);

/* Removes the objects whose GC deadline passed and that nobody used since
 * the GET that queued them. Under m->lock; O(1) when none is due. */
static void gc_sweep(store_map *m, uint64_t now) {
  size_t removed = 0;
  while (m->gc_head && m->gc_head->due_ns <= now) {
    gc_entry *e = m->gc_head;
    if (!(m->gc_head = e->next))
      m->gc_tail = NULL;
    object **at = map_find(m, e->key, e->key_len, COMMITTED);
    if (at && (*at)->used_ns <= e->got_ns && remove_one(m, at) == FERRY_OK)
      removed++;
    free(e);
  }
  if (removed)
    FERRY_DEBUG("store master: --enable_gc removed %zu object(s) read a while ago", removed);
}

/* DROP_FILE: a client found key's file missing or damaged. The object
 * forgets it, and goes when it has no replica in memory either. */
static ferry_status drop_file(store_map *m, object **at) {
  if (!at || !(*at)->on_disk)
    return FERRY_ENOTFOUND;
  if (!(*at)->replicas)
    map_unlink_object(m, at);
  else if (m->fs_dir) {
    store_disk_remove(m->fs_dir, key_of(*at), (*at)->key_len);
    (*at)->on_disk = 0;
    map_journal_object(m, *at);
  }
  return FERRY_OK;
}

/* ---- eviction ------------------------------------------------------------------------------- */

/* Moves *cursor past the objects a lease holds. */
static object *unleased(eviction_round *r, object **cursor) {
  while (*cursor && ((*cursor)->lease_until_ns > r->now || (*cursor)->off & OFF_WRITING)) {
    *((*cursor)->off & OFF_WRITING ? &r->writing : &r->leased) += 1;
    if ((*cursor)->lease_until_ns > r->now &&
        (!r->lease_ends || (*cursor)->lease_until_ns < r->lease_ends))
      r->lease_ends = (*cursor)->lease_until_ns;
    *cursor = (*cursor)->newer;
  }
  return *cursor;
}

/* The object to evict next, or NULL when nothing is left: the least
 * recently used of the plain ones and the soft-pinned ones whose pin
 * ended; a soft-pinned one still pinned only when no plain one is left,
 * and never with keep_soft_pinned (the soft list is in deadline order:
 * once its head is pinned, so is the rest). */
object *map_next_victim(store_map *m, eviction_round *r) {
  if (!r->started) {
    r->plain = m->plain.oldest;
    r->soft = m->soft.oldest;
    r->started = 1;
  }
  object *plain = unleased(r, &r->plain), *soft = unleased(r, &r->soft);
  int pinned = soft && soft->pin_until_ns > r->now;
  if (pinned && m->keep_soft_pinned)
    soft = NULL;
  object *victim = !soft || (plain && (pinned || plain->used_ns <= soft->used_ns)) ? plain : soft;
  if (victim)
    *(victim == plain ? &r->plain : &r->soft) = victim->newer;
  else if (!r->staged_seen++ && m->staged.oldest) /* loaded back for gets: leased, never chosen */
    for (object *o = m->staged.oldest; o; o = o->newer) { /* (map_unstage_ended ran: all leased) */
      r->leased++;
      if (!r->lease_ends || o->lease_until_ns < r->lease_ends)
        r->lease_ends = o->lease_until_ns;
    }
  return victim;
}

/* Evicts o (one with a complete file stays, disk-only); returns the
 * largest free extent that made. */
uint64_t map_evict(store_map *m, eviction_round *r, object *o, int why) {
  if (m->offload_on_evict && !(o->off & OFF_LOCAL) && map_offload_replica(o) >= 0) {
    /* Mooncake's cap: a round queues at most queue_limit * cap_ratio
     * offloads; past it --offload_force_evict evicts without a copy. */
    const store_offload_config *c = &m->off_cfg;
    int was_queued = o->off & OFF_QUEUED;
    if (was_queued || !c->force_evict || (double)r->queued < (double)c->queue_limit * c->cap_ratio)
      map_queue_offload(m, o); /* its memory goes once its owner wrote the file */
    if (o->off & OFF_QUEUED) {
      r->queued += !was_queued;
      o->off |= OFF_EVICT;
      r->offloading[why]++;
      return 0;
    }
    if (!c->force_evict) { /* no room in its owner's queue: it stays, as Mooncake's */
      r->queue_full++;
      return 0;
    }
    r->forced[why]++;
  }
  r->objects[why]++;
  r->bytes[why] += footprint(o);
  m->evicted_keys++;
  m->evicted_bytes += footprint(o);
  if (!map_disk_owner(o))
    o->off &= (uint8_t)~OFF_LOCAL; /* (its owner's segment would be among its replicas) */
  r->on_disk[why] += o->on_disk || o->off & OFF_LOCAL;
  if (o->off & OFF_LOCAL)
    return map_to_owner_disk_only(m, o);
  if (o->on_disk)
    return to_disk_only(m, o, 1);
  return map_unlink_object(
      m, map_find(m, key_of(o), o->key_len, COMMITTED)); /* victims are committed */
}

static uint64_t capacity_of(const segment *s) { return s->size - s->size % STORE_GRANULE; }

/* Past the high watermark, evicts least-recently-used objects until at
 * most (high watermark - eviction ratio) of the pool is in use, or nothing
 * evictable is left. */
static void evict_past_watermark(store_map *m, eviction_round *r) {
  uint64_t total = 0, free_bytes = 0;
  for (segment *s = m->segments; s; s = s->next) {
    total += capacity_of(s);
    free_bytes += s->space.free_bytes;
  }
  uint64_t used = total - free_bytes;
  if ((double)used <= m->high_watermark * (double)total)
    return;
  double target = (m->high_watermark - m->eviction_ratio) * (double)total;
  r->total = total;
  r->used_before = used;
  object *o;
  while ((double)used > target && (o = map_next_victim(m, r))) {
    used -= footprint(o);
    map_evict(m, r, o, PAST_WATERMARK);
  }
  r->used_after = used;
}

void map_log_round(const eviction_round *r) {
  char kept[2][192] = {"", ""};
  for (int why = 0; why < 2; why++) {
    int n = 0;
    if (r->on_disk[why])
      n = snprintf(kept[why], sizeof kept[why], "; %zu stay on disk", r->on_disk[why]);
    if (r->forced[why])
      n += snprintf(kept[why] + n, sizeof kept[why] - (size_t)n,
                    "; %zu without a disk copy (--offload_force_evict)", r->forced[why]);
    if (r->offloading[why])
      snprintf(kept[why] + n, sizeof kept[why] - (size_t)n,
               "; %zu more chosen, kept until their owner writes them to disk", r->offloading[why]);
    if (r->offloading[why] && !r->objects[why])
      FERRY_INFO("store master: %zu object(s) chosen for eviction are offloaded first "
                 "(--offload_on_evict)",
                 r->offloading[why]);
  }
  if (r->objects[FOR_PUTS])
    FERRY_INFO("store master: evicted %zu least recently used object(s) (%llu bytes) for %zu %s%s",
               r->objects[FOR_PUTS], (unsigned long long)r->bytes[FOR_PUTS], r->puts,
               r->for_what ? r->for_what : "put(s) that did not fit", kept[FOR_PUTS]);
  if (r->objects[PAST_WATERMARK])
    FERRY_INFO(
        "store master: evicted %zu least recently used object(s) (%llu bytes): %.1f%% of the "
        "pool's %llu bytes were in use, past the high watermark; now %.1f%%%s",
        r->objects[PAST_WATERMARK], (unsigned long long)r->bytes[PAST_WATERMARK],
        100.0 * (double)r->used_before / (double)r->total, (unsigned long long)r->total,
        100.0 * (double)r->used_after / (double)r->total, kept[PAST_WATERMARK]);
}

/* ---- segments ------------------------------------------------------------------------------- */

segment *map_find_segment(store_map *m, const char *name, size_t len) {
  for (segment *s = m->segments; s; s = s->next)
    if (strlen(s->name) == len && !memcmp(s->name, name, len))
      return s;
  return NULL;
}

static segment *mount(store_map *m, uint64_t client, const char *name, size_t name_len,
                      uint64_t base, uint64_t length, uint64_t nonce) {
  segment *s = calloc(1, sizeof *s);
  if (!s || store_extents_init(&s->space, length) != 0) {
    free(s);
    return NULL;
  }
  s->client = client;
  memcpy(s->name, name, name_len);
  s->base = base;
  s->size = length;
  s->nonce = nonce;
  s->next = m->segments;
  m->segments = s;
  return s;
}

/* s's record, "BASE SIZE NONCE OFFLOAD" (OFFLOAD 1: its client polled for
 * offload tasks, so a new leader offloads what is put there before the
 * client polls it); NULL record: it left. */
int map_journal_segment(store_map *m, segment *s) {
  if (!m->journal.segment)
    return 0;
  char rec[80];
  snprintf(rec, sizeof rec, "%llu %llu %llu %d", (unsigned long long)s->base,
           (unsigned long long)s->size, (unsigned long long)s->nonce, s->offload);
  return m->journal.segment(m->journal.ctx, s->name, rec);
}

/* Whether a REGISTER of (base, length, nonce) is the memory of a segment
 * the journal restored. A record of a master older than the nonce (0)
 * is matched by address and length alone. */
static int adopts(const segment *s, uint64_t base, uint64_t length, uint64_t nonce) {
  return s->base == base && s->size == length && (!s->nonce || s->nonce == nonce);
}

static size_t drop_client(store_map *m, uint64_t client);

static ferry_status serve_register(store_map *m, uint64_t client, store_reader *r,
                                   store_writer *reply, char *why, size_t size) {
  /* The version first: another version's fields may differ. */
  uint16_t version = store_get_u16(r);
  if (!r->bad && version != STORE_PROTOCOL_VERSION)
    return snprintf(why, size, "store protocol version %u; this master speaks %d", version,
                    STORE_PROTOCOL_VERSION),
           FERRY_EVERSION;
  uint64_t base = store_get_u64(r), length = store_get_u64(r);
  const char *name;
  size_t name_len;
  store_get_str(r, &name, &name_len, STORE_NAME_MAX);
  uint64_t nonce = store_get_u64(r);
  if (r->bad || r->left)
    return snprintf(why, size, "malformed REGISTER"), FERRY_EPROTO;
  if (length > 0 && m->pool)
    return snprintf(why, size,
                    "this master places every value in its CXL pool %s (--enable_cxl): a client "
                    "contributes no segment (setup with protocol \"cxl\", or start the master "
                    "without --enable_cxl)",
                    m->pool->name),
           FERRY_EINVAL;
  if (length > 0) {
    if (name_len == 0 || memchr(name, '\0', name_len) || base + length < base)
      return snprintf(why, size,
                      "segment of %llu bytes at 0x%llx has no name, a NUL in its name, or wraps "
                      "around",
                      (unsigned long long)length, (unsigned long long)base),
             FERRY_EINVAL;
    segment *s = map_find_segment(m, name, name_len);
    if (s && s->client & STORE_ORPHAN && !adopts(s, base, length, nonce)) {
      /* HA: a client of the same name whose memory is not the one the
       * journal named (restarted, the same address maybe): what lived
       * there is gone with the old process, not in this memory. */
      size_t dropped = drop_client(m, s->client);
      FERRY_WARN("store master: segment %.*s registered again by other memory than the journal "
                 "named (not the same client process): dropped it and %zu object(s) with "
                 "replicas there",
                 (int)name_len, name, dropped);
      s = NULL;
    }
    if (s && s->client & STORE_ORPHAN)
      s->client = client; /* HA: the segment the journal named, back with its objects */
    else if (s)
      return snprintf(why, size, "segment %.*s is mounted already, by another client",
                      (int)name_len, name),
             FERRY_EBUSY;
    else if (!(s = mount(m, client, name, name_len, base, length, nonce)))
      return snprintf(why, size, "master out of memory"), FERRY_ENOMEM;
    else if (map_journal_segment(m, s) != 0) {
      m->segments = s->next;
      store_extents_destroy(&s->space);
      free(s);
      return snprintf(why, size,
                      "cannot journal segment %.*s (HA): its objects would not "
                      "outlive this master",
                      (int)name_len, name),
             FERRY_EMETADATA;
    }
  }
  store_put_u32(reply, m->lease_ms);
  store_put_u32(reply, m->ping_ms);
  store_put_str(reply, m->fs_dir ? m->fs_dir : "", m->fs_dir ? strlen(m->fs_dir) : 0);
  store_put_str(reply, m->pool ? m->pool->name : "", m->pool ? strlen(m->pool->name) : 0);
  store_put_u64(reply, m->pool ? m->pool->base : 0);
  store_put_u64(reply, m->pool ? m->pool->size : 0);
  return FERRY_OK;
}

/* The live segment with the most free bytes that is not in used[0..n). */
static segment *roomiest(store_map *m, const replica *used, unsigned n, uint64_t need) {
  segment *best = NULL;
  for (segment *s = m->segments; s; s = s->next) {
    int taken = 0;
    for (unsigned i = 0; i < n; i++)
      taken |= used[i].seg == s;
    if (!taken && s->space.free_bytes >= need &&
        (!best || s->space.free_bytes > best->space.free_bytes))
      best = s;
  }
  return best;
}

static int holds(const object *o, const segment *s) {
  for (unsigned i = 0; i < o->replicas; i++)
    if (o->rep[i].seg == s)
      return 1;
  return 0;
}

/* Places `want` replicas of size bytes, each in its own segment: the
 * preferred ones first, in order (one where it has room), then the
 * roomiest. All or none. */
static int place(store_map *m, object *o, unsigned want, segment *const *preferred,
                 unsigned preferred_count) {
  uint64_t need = store_extents_round(o->size);
  segment *tried[64];
  unsigned tried_count = 0, next = 0;
  while (o->replicas < want) {
    while (next < preferred_count && (!preferred[next] || holds(o, preferred[next])))
      next++;
    segment *s =
        next < preferred_count ? preferred[next++] : roomiest(m, o->rep, o->replicas, need);
    for (unsigned i = 0; s && i < tried_count; i++)
      if (tried[i] == s)
        s = NULL;
    if (!s)
      break;
    uint64_t offset;
    if (store_extents_alloc(&s->space, o->size, &offset) == 0)
      o->rep[o->replicas++] = (replica){s, offset};
    else if (tried_count < 64)
      tried[tried_count++] = s; /* fragmented: has the bytes, not one extent of them */
    else
      break;
  }
  if (o->replicas == want)
    return 0;
  for (unsigned i = 0; i < o->replicas; i++)
    store_extents_free(&o->rep[i].seg->space, o->rep[i].offset, o->size);
  o->replicas = 0;
  return -1;
}

static void put_replicas(store_writer *w, const object *o) {
  store_put_u8(w, o->replicas);
  for (unsigned i = 0; i < o->replicas; i++) {
    store_put_str(w, o->rep[i].seg->name, strlen(o->rep[i].seg->name));
    store_put_u64(w, o->rep[i].seg->base + o->rep[i].offset);
  }
}

/* ---- objects -------------------------------------------------------------------------------- */

/* What a PUT_START asks for each of its keys. */
typedef struct put_ask {
  uint64_t client;
  int upsert; /* a stored key gets a new value (else: nothing to write) */
  unsigned replicas;
  uint8_t pin, soft_action; /* FERRY_STORE_PIN_* (NONE or HARD), FERRY_STORE_SOFT_PIN_* */
  uint64_t soft_ttl_ns;     /* ENABLE's */
  segment *preferred[STORE_PREFERRED_MAX]; /* NULL: a name no segment has */
  unsigned preferred_count;
} put_ask;

/* Places o's replicas, evicting least-recently-used objects while they do
 * not fit: after each eviction that freed an extent large enough, place()
 * tries again. FERRY_ENOMEM with why when no segment could ever hold them
 * (then nothing is evicted) or nothing evictable is left. */
static ferry_status make_room(store_map *m, const put_ask *ask, eviction_round *r, object *o,
                              char *why, size_t why_size) {
  uint64_t largest = 0;
  unsigned large = 0;
  for (segment *s = m->segments; s; s = s->next) {
    large += capacity_of(s) >= o->size; /* then its rounded size fits too, without overflow */
    largest = capacity_of(s) > largest ? capacity_of(s) : largest;
  }
  if (large < ask->replicas)
    return snprintf(why, why_size,
                    "larger than the store holds: %u replica(s) asked, %u segment(s) of %llu "
                    "bytes or more (the largest holds %llu)",
                    ask->replicas, large, (unsigned long long)o->size, (unsigned long long)largest),
           FERRY_ENOMEM;
  uint64_t need = store_extents_round(o->size);
  size_t evicted = 0;
  uint64_t extent = need;
  while (extent >= need && place(m, o, ask->replicas, ask->preferred, ask->preferred_count) != 0) {
    object *victim = NULL;
    for (extent = 0; extent < need && (victim = map_next_victim(m, r)) != NULL; evicted++)
      extent = map_evict(m, r, victim, FOR_PUTS);
  }
  r->puts += evicted > 0;
  if (extent < need) {
    char soft[96] = "", writing[192] = ""; /* soft: only where the flag keeps them */
    if (m->keep_soft_pinned)
      snprintf(soft, sizeof soft, ", %zu soft-pinned (--allow_evict_soft_pinned_objects=false)",
               m->soft_count);
    int n = 0;
    if (r->writing || r->offloading[FOR_PUTS])
      n = snprintf(writing, sizeof writing, ", %zu being written to their owner's disk first",
                   r->writing + r->offloading[FOR_PUTS]);
    if (r->queue_full)
      snprintf(writing + n, sizeof writing - (size_t)n,
               ", %zu whose owner's task queue is full (--offloading_queue_limit)", r->queue_full);
    return snprintf(why, why_size,
                    "the store is full: no %u segment(s) with a free extent of %llu bytes, and "
                    "nothing left to evict (%zu evicted for it; left: %zu object(s) under a "
                    "get's lease, %zu hard-pinned%s, %zu put(s) pending, %zu replaced value(s) "
                    "under a get's lease%s)",
                    ask->replicas, (unsigned long long)need, evicted, r->leased, m->hard_pinned,
                    soft, m->pending, m->retired_count, writing),
           FERRY_ENOMEM;
  }
  return FERRY_OK;
}

static ferry_status start_one(store_map *m, const put_ask *ask, eviction_round *r, const char *key,
                              size_t len, uint64_t size, object **out, char *why, size_t why_size) {
  if (len == 0 || size == 0)
    return FERRY_EINVAL;
  object *committed;
  object **pending = find_with_committed(m, key, len, PENDING, &committed);
  if (!ask->upsert && committed)
    return FERRY_OK; /* stored already: nothing to write */
  if (pending)
    return snprintf(why, why_size, "a put or upsert of it is in progress"), FERRY_EBUSY;
  object *o = calloc(1, sizeof *o + ask->replicas * sizeof(replica) + len);
  if (!o)
    return snprintf(why, why_size, "master out of memory"), FERRY_ENOMEM;
  o->hash = map_hash_key(key, len);
  o->size = size;
  o->writer = ask->client;
  o->pin = ask->pin;
  o->soft_action = ask->soft_action;
  o->pin_until_ns = ask->soft_ttl_ns; /* the deadline once it commits */
  o->room = (uint8_t)ask->replicas;
  o->key_len = (uint16_t)len;
  memcpy(key_of(o), key, len);
  ferry_status st = make_room(m, ask, r, o, why, why_size);
  if (st != FERRY_OK) {
    free(o);
    return st;
  }
  /* An upsert's writer will write the key's file anew (one file per key):
   * the committed value gives its file up now, and goes if it had nothing
   * else. A reader never finds the new value's file under the old size. */
  object **old = ask->upsert ? map_find(m, key, len, COMMITTED) : NULL;
  if (old && (*old)->on_disk)
    drop_file(m, old);
  object **bucket = bucket_of(m, o->hash); /* after make_room: evictions change chains */
  o->next = *bucket;
  *bucket = o;
  m->objects++;
  m->pending++;
  *out = o;
  return FERRY_OK;
}

/* The soft pin a put asks (Mooncake's checks): with_soft_pin (pin SOFT)
 * is ENABLE; only ENABLE takes a TTL, at most max_kv_soft_pin_ttl; none
 * given: default_kv_soft_pin_ttl. */
static ferry_status resolve_soft_pin(store_map *m, put_ask *ask, uint8_t ttl_set, uint64_t ttl_ms,
                                     char *why, size_t size) {
  static const char *const names[] = {"PRESERVE", "ENABLE", "DISABLE"};
  if (ask->pin == FERRY_STORE_PIN_SOFT) {
    if (ask->soft_action == FERRY_STORE_SOFT_PIN_DISABLE)
      return snprintf(why, size, "a soft pin (with_soft_pin) asked with soft_pin_action DISABLE"),
             FERRY_EINVAL;
    ask->pin = FERRY_STORE_PIN_NONE;
    ask->soft_action = FERRY_STORE_SOFT_PIN_ENABLE;
  }
  if (ask->soft_action != FERRY_STORE_SOFT_PIN_ENABLE) {
    if (ttl_set)
      return snprintf(why, size,
                      "soft_pin_ttl_ms %llu given with soft_pin_action %s: only ENABLE takes a TTL",
                      (unsigned long long)ttl_ms, names[ask->soft_action]),
             FERRY_EINVAL;
    return FERRY_OK;
  }
  if (!ttl_set)
    ttl_ms = m->soft_pin_ns / 1000000; /* Mooncake checks the default against the limit too */
  if (ttl_ms > m->max_soft_pin_ms)
    return snprintf(why, size,
                    "soft_pin_ttl_ms %llu is above the master's max_kv_soft_pin_ttl %llu",
                    (unsigned long long)ttl_ms, (unsigned long long)m->max_soft_pin_ms),
           FERRY_EINVAL;
  ask->soft_ttl_ns = ttl_ms * 1000000ull;
  return FERRY_OK;
}

static ferry_status serve_put_start(store_map *m, uint64_t client, int upsert, store_reader *r,
                                    uint32_t count, eviction_round *evictions, store_writer *reply,
                                    char *why, size_t size) {
  ferry_status st;
  put_ask ask = {client, upsert, store_get_u8(r), 0, 0, 0, {NULL}, 0};
  ask.preferred_count = store_get_u8(r);
  for (unsigned i = 0; i < ask.preferred_count && i < STORE_PREFERRED_MAX; i++) {
    const char *pref;
    size_t pref_len;
    store_get_str(r, &pref, &pref_len, STORE_NAME_MAX);
    ask.preferred[i] = map_find_segment(m, pref, pref_len);
  }
  ask.pin = store_get_u8(r);
  ask.soft_action = store_get_u8(r);
  uint8_t ttl_set = store_get_u8(r);
  uint64_t ttl_ms = store_get_u64(r);
  if (r->bad || ask.replicas == 0 || ask.replicas > STORE_REPLICAS_MAX ||
      ask.preferred_count > STORE_PREFERRED_MAX || ask.pin > FERRY_STORE_PIN_HARD ||
      ask.soft_action > FERRY_STORE_SOFT_PIN_DISABLE || ttl_set > 1)
    return snprintf(why, size,
                    "malformed PUT_START (replicas %u, %u preferred, pin %u, soft pin action %u)",
                    ask.replicas, ask.preferred_count, ask.pin, ask.soft_action),
           FERRY_EPROTO;
  st = resolve_soft_pin(m, &ask, ttl_set, ttl_ms, why, size);
  if (st != FERRY_OK)
    return st;
  if (m->pool) /* one copy in shared memory serves every client */
    ask.replicas = 1, ask.preferred[0] = m->pool, ask.preferred_count = 1;
  evictions->now = ferry_now_ns();
  reap_retired(m, evictions->now);
  char refused[STORE_REASON_MAX]; /* not cleared per key: only a refusal writes it */
  prefetch_chains(m, r, count, sizeof(uint64_t)); /* an entry: key, size */
  for (uint32_t i = 0; i < count; i++) {
    const char *key;
    size_t len;
    store_get_str(r, &key, &len, STORE_KEY_MAX);
    uint64_t bytes = store_get_u64(r);
    if (r->bad)
      return snprintf(why, size, "malformed PUT_START entry %u", i), FERRY_EPROTO;
    object *o = NULL;
    refused[0] = '\0';
    st = start_one(m, &ask, evictions, key, len, bytes, &o, refused, sizeof refused);
    count_op(m, upsert ? STORE_UPSERT_START : STORE_PUT_START, st);
    store_put_u32(reply, (uint32_t)st);
    if (st != FERRY_OK)
      store_put_str(reply, refused, strlen(refused));
    else if (o)
      put_replicas(reply, o);
    else
      store_put_u8(reply, 0);
  }
  evict_past_watermark(m, evictions);
  map_grow(m);
  return FERRY_OK;
}

/* A PUT_END's commits, journaled STORE_JOURNAL_BATCH at a time (HA: one
 * etcd transaction each, not one per key). Until then each object's writer
 * carries ENDING, so map_find() by its writer no longer sees it (as once it is
 * committed: the same key twice in one PUT_END ends it once). */
#define ENDING (1ull << 62)

typedef struct ending {
  object *o[STORE_JOURNAL_BATCH];
  int32_t *status[STORE_JOURNAL_BATCH];  /* each one's reply entry */
  uint8_t replaces[STORE_JOURNAL_BATCH]; /* the key has a committed value, retired at the commit */
  size_t n;
} ending;

/* Journals the collected commits in one write, then commits them all, or
 * (not journaled: a new leader would not know them) frees them all, each
 * answered FERRY_EMETADATA (an upsert's old value stays, and its record). */
static void commit_ending(store_map *m, ending *e, uint64_t client) {
  int journaled = journal_batch(m, e->o, e->n, 0) == 0;
  uint64_t now = ferry_now_ns();
  for (size_t i = 0; i < e->n; i++) {
    object *o = e->o[i];
    o->writer = client;
    if (!journaled) {
      map_unlink_object(m, map_find(m, key_of(o), o->key_len, client));
      *e->status[i] = FERRY_EMETADATA;
      continue;
    }
    /* Retired before the commit: map_find() must tell them apart; its record is o's now.
     * Looked up only when end_one saw one (a walk per key was a fifth of a PUT_END):
     * under the lock, nothing else commits or removes the key meanwhile. */
    object **old = e->replaces[i] ? map_find(m, key_of(o), o->key_len, COMMITTED) : NULL;
    if (old)
      retire(m, old, now);
    commit(m, o, now);
  }
  e->n = 0;
}

/* One PUT_END entry: outcome 0 readies the writer's pending object for
 * its commit (an upsert's replaces the committed one; on_disk: its writer
 * wrote its file), else frees it. */
static void end_one(store_map *m, uint64_t client, const char *key, size_t len, int32_t outcome,
                    uint8_t on_disk, uint64_t now, ending *e, int32_t *status) {
  object *old;
  object **at = find_with_committed(m, key, len, client, &old);
  *status = at ? FERRY_OK : FERRY_ENOTFOUND; /* revoked: its segment left, or never started here */
  if (!at || outcome != 0) {
    if (at)
      map_unlink_object(m, at);
    return;
  }
  object *o = *at;
  o->on_disk = m->fs_dir && on_disk;
  settle_pin(o, old, now); /* still pending: on no list yet */
  o->writer |= ENDING;
  e->o[e->n] = o;
  e->replaces[e->n] = old != NULL;
  e->status[e->n++] = status;
  if (e->n == STORE_JOURNAL_BATCH)
    commit_ending(m, e, client);
}

static ferry_status serve_put_end(store_map *m, uint64_t client, store_reader *r, uint32_t count,
                                  store_writer *reply, char *why, size_t size) {
  int32_t *status = calloc(count ? count : 1, sizeof *status);
  uint8_t *revoked = calloc(count ? count : 1, 1); /* for the metrics: a failed write's end */
  ending *e = malloc(sizeof *e);
  if (!status || !revoked || !e) {
    free(status);
    free(revoked);
    free(e);
    return snprintf(why, size, "master out of memory"), FERRY_ENOMEM;
  }
  e->n = 0;
  uint64_t now = ferry_now_ns();
  prefetch_chains(m, r, count, sizeof(uint32_t) + 1); /* key, outcome, on_disk */
  uint32_t i;
  for (i = 0; i < count; i++) {
    const char *key;
    size_t len;
    store_get_str(r, &key, &len, STORE_KEY_MAX);
    int32_t outcome = (int32_t)store_get_u32(r);
    uint8_t on_disk = store_get_u8(r);
    if (r->bad)
      break;
    revoked[i] = outcome != 0;
    end_one(m, client, key, len, outcome, on_disk, now, e, &status[i]);
  }
  commit_ending(m, e, client); /* the entries before a malformed one too */
  for (uint32_t j = 0; j < i; j++)
    count_op(m, revoked[j] ? STORE_COUNT_REVOKE : STORE_PUT_END, status[j]);
  for (uint32_t j = 0; j < i && !r->bad; j++)
    store_put_u32(reply, (uint32_t)status[j]);
  free(revoked);
  free(status);
  free(e);
  if (r->bad)
    return snprintf(why, size, "malformed entry %u", i), FERRY_EPROTO;
  return FERRY_OK;
}

static ferry_status remove_one(store_map *m, object **at) {
  if (!at)
    return FERRY_ENOTFOUND;
  if ((*at)->lease_until_ns > ferry_now_ns() || (*at)->off & (OFF_WRITING | OFF_LOADING))
    return FERRY_EBUSY;
  map_unlink_object(m, at);
  return FERRY_OK;
}

/* The next entry of a request of keys: where its committed object is (NULL:
 * none; pending ones are invisible), or FERRY_EPROTO when malformed. */
static ferry_status committed_entry(store_map *m, store_reader *r, object ***at) {
  const char *key;
  size_t len;
  store_get_str(r, &key, &len, STORE_KEY_MAX);
  if (r->bad)
    return FERRY_EPROTO;
  *at = map_find(m, key, len, COMMITTED);
  return FERRY_OK;
}

/* Entries of one key each (GET, QUERY, REMOVE, DROP_FILE; PUT_END: serve_put_end). */
static ferry_status serve_keys(store_map *m, uint64_t client, uint8_t op, store_reader *r,
                               uint32_t count, store_writer *reply, char *why, size_t size) {
  if (op == STORE_PUT_END)
    return serve_put_end(m, client, r, count, reply, why, size);
  uint64_t load_deadline = UINT64_MAX;
  if (op == STORE_GET && m->offload)
    load_deadline = map_load_back(m, r, count);
  uint64_t now = ferry_now_ns(); /* the request's: a clock read per key was a tenth of a get */
  prefetch_chains(m, r, count, 0);
  for (uint32_t i = 0; i < count; i++) {
    object **at;
    if (committed_entry(m, r, &at) != FERRY_OK)
      return snprintf(why, size, "malformed entry %u", i), FERRY_EPROTO;
    if (op == STORE_REMOVE || op == STORE_DROP_FILE) {
      ferry_status st = op == STORE_REMOVE ? remove_one(m, at) : drop_file(m, at);
      count_op(m, op, st);
      store_put_u32(reply, (uint32_t)st);
      continue;
    }
    /* On its owner's disk and not loaded back: still loading (past the
     * lease), or no room in the owner's segment. */
    ferry_status st = !at ? FERRY_ENOTFOUND : FERRY_OK;
    if (at && op == STORE_GET && !(*at)->replicas && (*at)->off & (OFF_LOCAL | OFF_LOADING))
      st = (*at)->off & OFF_LOADING ? FERRY_ETIMEDOUT : FERRY_ENOMEM;
    if (st == FERRY_ENOMEM && now >= load_deadline)
      st = FERRY_ETIMEDOUT; /* waited for victims being written out, in vain */
    if (st && st != FERRY_ENOTFOUND)
      at = NULL;
    count_op(m, op, at || op == STORE_QUERY ? FERRY_OK : FERRY_ENOTFOUND); /* exists: an answer */
    store_put_u32(reply, (uint32_t)st);
    store_put_u64(reply, at ? (*at)->size : 0);
    if (op != STORE_GET)
      continue;
    if (at) {
      (*at)->lease_until_ns = now + m->lease_ns;
      touch(m, *at, now);
      if (m->gc_ns)
        gc_queue(m, *at, now);
      uint8_t flags = (uint8_t)(((*at)->on_disk ? STORE_GET_ON_DISK : 0) |
                                ((*at)->off & OFF_STAGED ? STORE_GET_LOADED : 0));
      if ((*at)->off & OFF_STAGED)
        map_promote(m, *at);
      put_replicas(reply, *at);
      store_put_u8(reply, flags);
    } else {
      store_put_u8(reply, 0);
      store_put_u8(reply, 0);
    }
  }
  return FERRY_OK;
}

/* One REPLICAS entry: o's replicas in memory, its --root_fs_dir file,
 * its owner's offload copy (protocol.h). */
#define PLACE_BYTES(name_max) (1 + 2 + (name_max) + 8)
_Static_assert(STORE_BATCH_MAX *(4 + 8 + 1 + STORE_REPLICAS_MAX * PLACE_BYTES(STORE_NAME_MAX) +
                                 PLACE_BYTES(STORE_DISK_PATH_MAX) + PLACE_BYTES(STORE_NAME_MAX)) <=
                   FERRY_WIRE_MAX_CONTROL_BODY,
               "a REPLICAS reply of a whole frame's keys, each at its most places, fits a frame");
_Static_assert(STORE_NAME_MAX <= STORE_LOCATION_MAX && STORE_DISK_PATH_MAX <= STORE_LOCATION_MAX,
               "a client reads every location the master may send");
static void put_locations(store_map *m, store_writer *w, const object *o) {
  char path[STORE_DISK_PATH_MAX];
  int file = o->on_disk && m->fs_dir &&
             store_disk_path(m->fs_dir, key_of((object *)o), o->key_len, path) == 0;
  const segment *owner = map_disk_owner(o);
  store_put_u8(w, (uint8_t)(o->replicas + file + (owner != NULL)));
  for (unsigned i = 0; i < o->replicas; i++) {
    store_put_u8(w, FERRY_STORE_REPLICA_MEMORY);
    store_put_str(w, o->rep[i].seg->name, strlen(o->rep[i].seg->name));
    store_put_u64(w, o->rep[i].seg->base + o->rep[i].offset);
  }
  if (file) {
    store_put_u8(w, FERRY_STORE_REPLICA_DISK);
    store_put_str(w, path, strlen(path));
    store_put_u64(w, 0);
  }
  if (owner) {
    store_put_u8(w, FERRY_STORE_REPLICA_LOCAL_DISK);
    store_put_str(w, owner->name, strlen(owner->name));
    store_put_u64(w, 0);
  }
}

/* REPLICAS: a look, not a use (no lease, no LRU touch, no GC queue).
 * Counted as GETs, as Mooncake's Query is its GetReplicaList. */
static ferry_status serve_replicas(store_map *m, store_reader *r, uint32_t count,
                                   store_writer *reply, char *why, size_t size) {
  prefetch_chains(m, r, count, 0);
  for (uint32_t i = 0; i < count; i++) {
    object **at;
    if (committed_entry(m, r, &at) != FERRY_OK)
      return snprintf(why, size, "malformed entry %u", i), FERRY_EPROTO;
    count_op(m, STORE_GET, at ? FERRY_OK : FERRY_ENOTFOUND);
    store_put_u32(reply, (uint32_t)(at ? FERRY_OK : FERRY_ENOTFOUND));
    store_put_u64(reply, at ? (*at)->size : 0);
    if (at)
      put_locations(m, reply, *at);
    else
      store_put_u8(reply, 0);
  }
  return FERRY_OK;
}

/* ---- CLEAR ---------------------------------------------------------------------------------- */

/* Gives back o's replicas in segment `target`, and drops the offload copy
 * when target's client keeps it; o keeps its other replicas, or its
 * --root_fs_dir file alone. Nonzero when nothing would be left: the caller
 * unlinks o (which deletes the copy too). */
static int clear_segment(store_map *m, object *o, const segment *target) {
  segment *owner = map_disk_owner(o);
  int copy_here = owner == target;
  unsigned kept = 0;
  for (unsigned i = 0; i < o->replicas; i++)
    kept += o->rep[i].seg != target;
  if (!kept && !o->on_disk && (!owner || copy_here))
    return 1;
  if (copy_here)
    map_queue_delete(m, o);
  if (!kept) {
    to_disk_only(m, o, 1);
    return 0;
  }
  kept = 0;
  for (unsigned i = 0; i < o->replicas; i++)
    if (o->rep[i].seg == target)
      store_extents_free(&o->rep[i].seg->space, o->rep[i].offset, o->size);
    else
      o->rep[kept++] = o->rep[i];
  o->replicas = (uint8_t)kept;
  map_journal_object(m, o);
  if (m->offload && !m->offload_on_evict)
    map_queue_offload(m, o); /* its copy went with the segment: the next owner writes one */
  return 0;
}

/* One CLEAR entry: all of *at's replicas (all set: a REMOVE), or those in
 * segment `target` (NULL: a name no segment has, so nothing there). */
static ferry_status clear_one(store_map *m, object **at, int all, const segment *target) {
  if (!at || all)
    return remove_one(m, at);
  object *o = *at;
  int there = target && (map_disk_owner(o) == target || holds(o, target));
  if (!there)
    return FERRY_ENOTFOUND;
  if (o->lease_until_ns > ferry_now_ns() || o->off & ~OFF_LOCAL)
    return FERRY_EBUSY; /* a get's lease, or an offload, load or staging under way */
  if (clear_segment(m, o, target))
    map_unlink_object(m, at);
  return FERRY_OK;
}

static ferry_status serve_clear(store_map *m, store_reader *r, uint32_t count, store_writer *reply,
                                char *why, size_t size) {
  const char *name;
  size_t len;
  store_get_str(r, &name, &len, STORE_NAME_MAX);
  if (r->bad)
    return snprintf(why, size, "malformed CLEAR segment"), FERRY_EPROTO;
  const segment *target = len ? map_find_segment(m, name, len) : NULL;
  prefetch_chains(m, r, count, 0);
  for (uint32_t i = 0; i < count; i++) {
    object **at;
    if (committed_entry(m, r, &at) != FERRY_OK)
      return snprintf(why, size, "malformed entry %u", i), FERRY_EPROTO;
    ferry_status st = clear_one(m, at, len == 0, target);
    count_op(m, STORE_COUNT_CLEAR, st);
    store_put_u32(reply, (uint32_t)st);
  }
  return FERRY_OK;
}

static void serve_remove_all(store_map *m, store_writer *reply) {
  uint64_t removed = 0, now = ferry_now_ns();
  for (size_t b = 0; b < m->bucket_count; b++)
    for (object **at = &m->buckets[b]; *at;) {
      if (!(*at)->writer && (*at)->lease_until_ns <= now &&
          !((*at)->off & (OFF_WRITING | OFF_LOADING))) {
        map_unlink_object(m, at);
        removed++;
      } else {
        at = &(*at)->next;
      }
    }
  store_put_u64(reply, removed);
}

ferry_status store_map_serve(store_map *m, uint64_t client, uint8_t op, store_reader *r,
                             uint32_t count, store_writer *reply, char *why, size_t why_size) {
  int keyless = op == STORE_REGISTER || op == STORE_PING || op == STORE_REMOVE_ALL ||
                op == STORE_OFFLOAD_POLL;
  if (op < STORE_REGISTER || op > STORE_OP_LAST)
    return snprintf(why, why_size, "unknown store operation %u", op), FERRY_EPROTO;
  if ((keyless && count) || count > STORE_BATCH_MAX)
    return snprintf(why, why_size, "operation %u with %u entries", op, count), FERRY_EPROTO;
  ferry_status st = FERRY_OK;
  eviction_round evictions = {0};
  pthread_mutex_lock(&m->lock);
  gc_sweep(m, ferry_now_ns());
  map_unstage_ended(m, ferry_now_ns());
  if (op == STORE_REGISTER)
    st = serve_register(m, client, r, reply, why, why_size);
  else if (op == STORE_PUT_START || op == STORE_UPSERT_START)
    st = serve_put_start(m, client, op == STORE_UPSERT_START, r, count, &evictions, reply, why,
                         why_size);
  else if (op == STORE_REMOVE_ALL)
    serve_remove_all(m, reply);
  else if (op == STORE_OFFLOAD_POLL)
    count_op(m, STORE_COUNT_OFFLOAD_POLL, st = map_serve_poll(m, r, reply, why, why_size));
  else if (op == STORE_OFFLOAD_DONE)
    st = map_serve_done(m, r, count, reply, why, why_size);
  else if (op == STORE_REPLICAS)
    st = serve_replicas(m, r, count, reply, why, why_size);
  else if (op == STORE_CLEAR)
    st = serve_clear(m, r, count, reply, why, why_size);
  else if (op != STORE_PING)
    st = serve_keys(m, client, op, r, count, reply, why, why_size);
  if ((keyless || st) && op <= STORE_UPSERT_START) /* keyed ones per item; offload's not */
    count_op(m, op, st);
  pthread_mutex_unlock(&m->lock);
  map_log_round(&evictions);
  if (st == FERRY_OK && r->left)
    return snprintf(why, why_size, "%zu bytes trail operation %u", r->left, op), FERRY_EPROTO;
  return st;
}

void store_map_stats_get(store_map *m, store_map_stats *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&m->lock);
  gc_sweep(m, ferry_now_ns());
  out->keys = m->objects;
  for (segment *s = m->segments; s; s = s->next) {
    out->segments++;
    out->capacity_bytes += capacity_of(s);
    out->allocated_bytes += capacity_of(s) - s->space.free_bytes;
  }
  out->evicted_keys = m->evicted_keys;
  out->evicted_bytes = m->evicted_bytes;
  memcpy(out->ops, m->ops, sizeof out->ops);
  pthread_mutex_unlock(&m->lock);
}

/* ---- a client leaves ------------------------------------------------------------------------ */

/* Drops the replicas that lived in a segment of client's (without giving
 * their space back: the segment goes too). Nonzero when o goes: it is the
 * client's own pending put, a pending put that lost a replica, or it has
 * no replica left and no file. One left with its file only stays. */
/* Drops o's replicas in client's segments (their space is not given
 * back: the segments go too); returns how many are left. */
static unsigned keep_off(object *o, uint64_t client) {
  unsigned kept = 0;
  for (unsigned i = 0; i < o->replicas; i++)
    if (o->rep[i].seg->client != client)
      o->rep[kept++] = o->rep[i];
  o->replicas = (uint8_t)kept;
  return kept;
}

static int loses_client(store_map *m, object *o, uint64_t client) {
  if (o->writer == client)
    return 1;
  segment *owner = o->off & OFF_LOADING ? o->rep[0].seg : map_disk_owner(o);
  if (owner && owner->client == client) { /* its disk copy goes with its owner */
    if (o->off & OFF_LOADING || (!o->replicas && !o->on_disk))
      return 1;
    o->off &= (uint8_t)~OFF_LOCAL;
    if (!o->replicas)
      return 0; /* --root_fs_dir's file keeps it */
  }
  unsigned kept = 0;
  for (unsigned i = 0; i < o->replicas; i++)
    kept += o->rep[i].seg->client != client;
  if (kept == o->replicas)
    return 0;
  if (o->writer || (kept == 0 && !o->on_disk))
    return 1; /* (unlink_object frees its extents in the leaving segment too: harmless) */
  if (kept == 0) {
    to_disk_only(m, o, 0);
    return 0;
  }
  keep_off(o, client);
  if (!o->writer)
    map_journal_object(m, o);
  return 0;
}

size_t store_map_drop_client(store_map *m, uint64_t client) {
  pthread_mutex_lock(&m->lock);
  size_t dropped = drop_client(m, client);
  pthread_mutex_unlock(&m->lock);
  return dropped;
}

/* Under m->lock. */
static size_t drop_client(store_map *m, uint64_t client) {
  size_t dropped = 0;
  for (size_t b = 0; b < m->bucket_count; b++)
    for (object **at = &m->buckets[b]; *at;) {
      if (loses_client(m, *at, client)) {
        map_unlink_object(m, at);
        dropped++;
      } else {
        at = &(*at)->next;
      }
    }
  for (object **at = &m->retired; *at;) {
    object *o = *at;
    if (keep_off(o, client) == 0) { /* retired: on no list, no record, no file */
      *at = o->next;
      m->retired_count--;
      free_object(o);
    } else {
      at = &o->next;
    }
  }
  for (segment **at = &m->segments; *at;) {
    segment *s = *at;
    if (s->client == client) {
      *at = s->next;
      if (m->journal.segment)
        m->journal.segment(m->journal.ctx, s->name, NULL);
      destroy_segment(s);
    } else {
      at = &s->next;
    }
  }
  pthread_cond_broadcast(&m->changed); /* a reader waiting for a load of its disk wakes */
  return dropped;
}

/* ---- a new leader's restore (HA) ------------------------------------------------------------ */

int store_map_restore_segment(store_map *m, uint64_t orphan, const char *name, const char *record) {
  unsigned long long base, size, nonce = 0; /* no nonce: a record of an older master */
  int offload = 0;                          /* (nor this) */
  size_t len = strlen(name);
  if (sscanf(record, "%llu %llu %llu %d", &base, &size, &nonce, &offload) < 2 || !len ||
      len > STORE_NAME_MAX)
    return -1;
  pthread_mutex_lock(&m->lock);
  segment *s =
      map_find_segment(m, name, len) ? NULL : mount(m, orphan, name, len, base, size, nonce);
  if (s)
    s->offload = offload == 1 && m->offload;
  pthread_mutex_unlock(&m->lock);
  return s ? 0 : -1;
}

/* The segment a record names at p (HEXNAME), into *out (NULL: not
 * mounted); what follows the name. */
static const char *restore_segment_name(store_map *m, const char *p, segment **out) {
  char name[STORE_NAME_MAX + 1];
  size_t n = 0;
  /* Two hex digits at a time, never past them (sscanf would skip the
   * blank before " disk=" and read its "d"). */
  for (; n < STORE_NAME_MAX && isxdigit((unsigned char)p[0]) && isxdigit((unsigned char)p[1]);
       p += 2)
    sscanf(p, "%2hhx", (unsigned char *)&name[n++]);
  name[n] = '\0';
  *out = map_find_segment(m, name, n);
  return p;
}

/* One " OFFSET HEXNAME" of a record: its segment and offset; NULL when bad. */
static const char *restore_replica(store_map *m, const char *p, replica *out) {
  unsigned long long offset;
  int used = 0;
  if (sscanf(p, " %llu %n", &offset, &used) != 1)
    return NULL;
  p = restore_segment_name(m, p + used, &out->seg);
  out->offset = offset;
  return out->seg ? p : NULL;
}

int store_map_restore_object(store_map *m, const char *key, size_t len, const char *record) {
  unsigned long long size;
  unsigned pin, on_disk, count;
  int used = 0;
  if (sscanf(record, "%llu %u %u %u%n", &size, &pin, &on_disk, &count, &used) != 4 || !size ||
      pin > FERRY_STORE_PIN_HARD || count > STORE_REPLICAS_MAX || !len || len > STORE_KEY_MAX)
    return -1;
  const char *disk = strstr(record + used, " disk="); /* its owner's copy (--enable_offload) */
  unsigned room = count ? count : disk != NULL;       /* a disk-only one keeps its owner there */
  object *o = calloc(1, sizeof *o + room * sizeof(replica) + len);
  if (!o)
    return -1;
  o->hash = map_hash_key(key, len);
  o->size = size;
  o->pin = (uint8_t)pin;
  o->on_disk = on_disk && m->fs_dir;
  o->room = (uint8_t)room;
  o->key_len = (uint16_t)len;
  memcpy(key_of(o), key, len);
  pthread_mutex_lock(&m->lock);
  const char *p = record + used;
  int rc = map_find(m, key, len, COMMITTED) ? -1 : 0;
  for (unsigned i = 0; !rc && i < count; i++) {
    replica rp;
    p = restore_replica(m, p, &rp);
    if (!p || store_extents_take(&rp.seg->space, rp.offset, o->size) != 0)
      rc = -1;
    else
      o->rep[o->replicas++] = rp;
  }
  segment *owner = NULL;
  if (!rc && disk && m->offload)
    restore_segment_name(m, disk + strlen(" disk="), &owner);
  if (owner && !o->replicas) /* on its owner's disk only */
    o->rep[0] = (replica){owner, 0};
  o->off = owner ? OFF_LOCAL : 0;
  if (owner && o->replicas && map_disk_owner(o) != owner) /* the owner is its offloading replica */
    o->off = 0;
  if (!rc && !o->replicas && !o->on_disk && !(o->off & OFF_LOCAL))
    rc = -1;
  if (rc) {
    map_free_replicas(o);
    free(o);
  } else {
    object **bucket = bucket_of(m, o->hash);
    o->next = *bucket;
    *bucket = o;
    m->objects++;
    o->used_ns = ferry_now_ns();
    if (o->pin == FERRY_STORE_PIN_SOFT) /* the record keeps the pin, not its deadline */
      o->pin_until_ns = deadline_after(o->used_ns, m->soft_pin_ns);
    map_enlist(m, o);
    map_grow(m);
  }
  pthread_mutex_unlock(&m->lock);
  return rc;
}

size_t store_map_drop_orphans(store_map *m) {
  size_t dropped = 0;
  for (;;) {
    uint64_t orphan = 0;
    pthread_mutex_lock(&m->lock);
    for (segment *s = m->segments; s && !orphan; s = s->next)
      if (s->client & STORE_ORPHAN)
        orphan = s->client;
    pthread_mutex_unlock(&m->lock);
    if (!orphan)
      return dropped;
    dropped += store_map_drop_client(m, orphan);
  }
}
