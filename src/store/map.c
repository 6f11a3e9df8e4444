/* map.c - the store master's state and its requests (map.h). Objects are
 * in a chained hash table by key; each replica points at its segment and
 * holds an extent of that segment's free list. A pending object (a put
 * between PUT_START and PUT_END) belongs to its writer and is invisible to
 * everyone; a GET's lease keeps an object from being removed. */
#include "store/map.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "store/extents.h"

typedef struct segment {
  struct segment *next;
  uint64_t client;
  char name[STORE_NAME_MAX + 1];
  uint64_t base, size;
  store_extents space;
} segment;

typedef struct replica {
  segment *seg;
  uint64_t offset;
} replica;

typedef struct object {
  struct object *next; /* hash chain */
  uint64_t hash;
  uint64_t size;
  uint64_t writer;         /* nonzero: pending, written by this client */
  uint64_t lease_until_ns; /* a GET's lease; 0: none */
  uint8_t replicas;
  replica rep[STORE_REPLICAS_MAX];
  size_t key_len;
  char key[]; /* not NUL-terminated */
} object;

struct store_map {
  pthread_mutex_t lock;
  uint64_t lease_ns;
  uint32_t lease_ms, ping_ms;
  segment *segments;
  object **buckets;
  size_t bucket_count, objects;
};

store_map *store_map_create(uint32_t lease_ttl_ms, uint32_t client_ttl_ms) {
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
  m->lease_ms = lease_ttl_ms;
  m->lease_ns = lease_ttl_ms * 1000000ull;
  m->ping_ms = client_ttl_ms / 3 ? client_ttl_ms / 3 : 1;
  return m;
}

static void free_object(object *o) {
  for (unsigned i = 0; i < o->replicas; i++)
    store_extents_free(&o->rep[i].seg->space, o->rep[i].offset, o->size);
  free(o);
}

void store_map_destroy(store_map *m) {
  for (size_t b = 0; b < m->bucket_count; b++)
    for (object *o = m->buckets[b], *next; o; o = next) {
      next = o->next;
      free(o);
    }
  for (segment *s = m->segments, *next; s; s = next) {
    next = s->next;
    store_extents_destroy(&s->space);
    free(s);
  }
  pthread_mutex_destroy(&m->lock);
  free(m->buckets);
  free(m);
}

/* ---- the table ------------------------------------------------------------------------------ */

static uint64_t hash_key(const char *key, size_t len) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < len; i++)
    h = (h ^ (uint8_t)key[i]) * 1099511628211ull;
  return h;
}

static object **slot_of(store_map *m, const char *key, size_t len) {
  uint64_t h = hash_key(key, len);
  object **at = &m->buckets[h & (m->bucket_count - 1)];
  while (*at && !((*at)->hash == h && (*at)->key_len == len && !memcmp((*at)->key, key, len)))
    at = &(*at)->next;
  return at;
}

/* Doubles the table past one object per bucket; stays as it is without memory. */
static void grow(store_map *m) {
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

static void unlink_object(store_map *m, object **at) {
  object *o = *at;
  *at = o->next;
  m->objects--;
  free_object(o);
}

/* ---- segments ------------------------------------------------------------------------------- */

static segment *find_segment(store_map *m, const char *name, size_t len) {
  for (segment *s = m->segments; s; s = s->next)
    if (strlen(s->name) == len && !memcmp(s->name, name, len))
      return s;
  return NULL;
}

static ferry_status serve_register(store_map *m, uint64_t client, store_reader *r,
                                   store_writer *reply, char *why, size_t size) {
  uint16_t version = store_get_u16(r);
  uint64_t base = store_get_u64(r), length = store_get_u64(r);
  const char *name;
  size_t name_len;
  store_get_str(r, &name, &name_len, STORE_NAME_MAX);
  if (r->bad || r->left)
    return snprintf(why, size, "malformed REGISTER"), FERRY_EPROTO;
  if (version != STORE_PROTOCOL_VERSION)
    return snprintf(why, size, "store protocol version %u; this master speaks %d", version,
                    STORE_PROTOCOL_VERSION),
           FERRY_EVERSION;
  if (length > 0) {
    if (name_len == 0 || base + length < base)
      return snprintf(why, size, "segment of %llu bytes at 0x%llx has no name or wraps around",
                      (unsigned long long)length, (unsigned long long)base),
             FERRY_EINVAL;
    if (find_segment(m, name, name_len))
      return snprintf(why, size, "segment %.*s is mounted already, by another client",
                      (int)name_len, name),
             FERRY_EBUSY;
    segment *s = calloc(1, sizeof *s);
    if (!s || store_extents_init(&s->space, length) != 0) {
      free(s);
      return snprintf(why, size, "master out of memory"), FERRY_ENOMEM;
    }
    s->client = client;
    memcpy(s->name, name, name_len);
    s->base = base;
    s->size = length;
    s->next = m->segments;
    m->segments = s;
  }
  store_put_u32(reply, m->lease_ms);
  store_put_u32(reply, m->ping_ms);
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

/* Places `want` replicas of size bytes, each in its own segment: the
 * preferred one first, then the roomiest. All or none. */
static int place(store_map *m, object *o, unsigned want, segment *preferred) {
  uint64_t need = store_extents_round(o->size);
  segment *tried[64];
  unsigned tried_count = 0;
  while (o->replicas < want) {
    segment *s = preferred ? preferred : roomiest(m, o->rep, o->replicas, need);
    preferred = NULL;
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

static ferry_status start_one(store_map *m, uint64_t client, const char *key, size_t len,
                              uint64_t size, unsigned want, segment *preferred, object **out) {
  if (len == 0 || size == 0)
    return FERRY_EINVAL;
  object **at = slot_of(m, key, len);
  if (*at)
    return (*at)->writer ? FERRY_EBUSY : FERRY_OK; /* stored already: nothing to write */
  object *o = calloc(1, sizeof *o + len);
  if (!o)
    return FERRY_ENOMEM;
  o->hash = hash_key(key, len);
  o->size = size;
  o->writer = client;
  o->key_len = len;
  memcpy(o->key, key, len);
  if (place(m, o, want, preferred) != 0) {
    free(o);
    return FERRY_ENOMEM;
  }
  *at = o;
  m->objects++;
  *out = o;
  return FERRY_OK;
}

static ferry_status serve_put_start(store_map *m, uint64_t client, store_reader *r, uint32_t count,
                                    store_writer *reply, char *why, size_t size) {
  unsigned want = store_get_u8(r);
  const char *pref;
  size_t pref_len;
  store_get_str(r, &pref, &pref_len, STORE_NAME_MAX);
  if (r->bad || want == 0 || want > STORE_REPLICAS_MAX)
    return snprintf(why, size, "malformed PUT_START (replicas %u)", want), FERRY_EPROTO;
  segment *preferred = pref_len ? find_segment(m, pref, pref_len) : NULL;
  for (uint32_t i = 0; i < count; i++) {
    const char *key;
    size_t len;
    store_get_str(r, &key, &len, STORE_KEY_MAX);
    uint64_t bytes = store_get_u64(r);
    if (r->bad)
      return snprintf(why, size, "malformed PUT_START entry %u", i), FERRY_EPROTO;
    object *o = NULL;
    ferry_status st = start_one(m, client, key, len, bytes, want, preferred, &o);
    store_put_u32(reply, (uint32_t)st);
    if (o)
      put_replicas(reply, o);
    else
      store_put_u8(reply, 0);
  }
  grow(m);
  return FERRY_OK;
}

/* PUT_END: outcome 0 commits the writer's pending object, else frees it. */
static ferry_status end_one(store_map *m, uint64_t client, const char *key, size_t len,
                            int32_t outcome) {
  object **at = slot_of(m, key, len);
  if (!*at || (*at)->writer != client)
    return FERRY_ENOTFOUND; /* revoked: its segment left, or never started here */
  if (outcome == 0)
    (*at)->writer = 0;
  else
    unlink_object(m, at);
  return FERRY_OK;
}

/* The committed object of key, or NULL (pending ones are invisible). */
static object **committed(store_map *m, const char *key, size_t len) {
  object **at = slot_of(m, key, len);
  return *at && !(*at)->writer ? at : NULL;
}

static ferry_status remove_one(store_map *m, object **at) {
  if (!at)
    return FERRY_ENOTFOUND;
  if ((*at)->lease_until_ns > ferry_now_ns())
    return FERRY_EBUSY;
  unlink_object(m, at);
  return FERRY_OK;
}

/* Entries of one key each (PUT_END, GET, QUERY, REMOVE). */
static ferry_status serve_keys(store_map *m, uint64_t client, uint8_t op, store_reader *r,
                               uint32_t count, store_writer *reply, char *why, size_t size) {
  for (uint32_t i = 0; i < count; i++) {
    const char *key;
    size_t len;
    store_get_str(r, &key, &len, STORE_KEY_MAX);
    int32_t outcome = op == STORE_PUT_END ? (int32_t)store_get_u32(r) : 0;
    if (r->bad)
      return snprintf(why, size, "malformed entry %u", i), FERRY_EPROTO;
    if (op == STORE_PUT_END) {
      store_put_u32(reply, (uint32_t)end_one(m, client, key, len, outcome));
      continue;
    }
    object **at = committed(m, key, len);
    if (op == STORE_REMOVE) {
      store_put_u32(reply, (uint32_t)remove_one(m, at));
      continue;
    }
    store_put_u32(reply, (uint32_t)(at ? FERRY_OK : FERRY_ENOTFOUND));
    store_put_u64(reply, at ? (*at)->size : 0);
    if (op != STORE_GET)
      continue;
    if (at)
      (*at)->lease_until_ns = ferry_now_ns() + m->lease_ns;
    if (at)
      put_replicas(reply, *at);
    else
      store_put_u8(reply, 0);
  }
  return FERRY_OK;
}

static void serve_remove_all(store_map *m, store_writer *reply) {
  uint64_t removed = 0, now = ferry_now_ns();
  for (size_t b = 0; b < m->bucket_count; b++)
    for (object **at = &m->buckets[b]; *at;) {
      if (!(*at)->writer && (*at)->lease_until_ns <= now) {
        unlink_object(m, at);
        removed++;
      } else {
        at = &(*at)->next;
      }
    }
  store_put_u64(reply, removed);
}

ferry_status store_map_serve(store_map *m, uint64_t client, uint8_t op, store_reader *r,
                             uint32_t count, store_writer *reply, char *why, size_t why_size) {
  int keyless = op == STORE_REGISTER || op == STORE_PING || op == STORE_REMOVE_ALL;
  if (op < STORE_REGISTER || op > STORE_REMOVE_ALL)
    return snprintf(why, why_size, "unknown store operation %u", op), FERRY_EPROTO;
  if ((keyless && count) || count > STORE_BATCH_MAX)
    return snprintf(why, why_size, "operation %u with %u entries", op, count), FERRY_EPROTO;
  ferry_status st = FERRY_OK;
  pthread_mutex_lock(&m->lock);
  if (op == STORE_REGISTER)
    st = serve_register(m, client, r, reply, why, why_size);
  else if (op == STORE_PUT_START)
    st = serve_put_start(m, client, r, count, reply, why, why_size);
  else if (op == STORE_REMOVE_ALL)
    serve_remove_all(m, reply);
  else if (op != STORE_PING)
    st = serve_keys(m, client, op, r, count, reply, why, why_size);
  pthread_mutex_unlock(&m->lock);
  if (st == FERRY_OK && r->left)
    return snprintf(why, why_size, "%zu bytes trail operation %u", r->left, op), FERRY_EPROTO;
  return st;
}

/* ---- a client leaves ------------------------------------------------------------------------ */

/* Drops the replicas that lived in a segment of client's (without giving
 * their space back: the segment goes too). Nonzero when o has none left
 * or is the client's own pending put. */
static int loses_client(object *o, uint64_t client) {
  if (o->writer == client)
    return 1;
  unsigned kept = 0;
  for (unsigned i = 0; i < o->replicas; i++)
    if (o->rep[i].seg->client != client)
      o->rep[kept++] = o->rep[i];
  int lost = kept < o->replicas;
  o->replicas = (uint8_t)kept;
  return kept == 0 || (lost && o->writer); /* a pending put missing a replica is revoked */
}

size_t store_map_drop_client(store_map *m, uint64_t client) {
  size_t dropped = 0;
  pthread_mutex_lock(&m->lock);
  for (size_t b = 0; b < m->bucket_count; b++)
    for (object **at = &m->buckets[b]; *at;) {
      if (loses_client(*at, client)) {
        unlink_object(m, at);
        dropped++;
      } else {
        at = &(*at)->next;
      }
    }
  for (segment **at = &m->segments; *at;) {
    segment *s = *at;
    if (s->client == client) {
      *at = s->next;
      store_extents_destroy(&s->space);
      free(s);
    } else {
      at = &s->next;
    }
  }
  pthread_mutex_unlock(&m->lock);
  return dropped;
}
