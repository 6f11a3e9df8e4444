/* metadata_server.c - `ferry metadata-server`: a small in-memory key/value
 * store speaking the http metadata protocol of Mooncake's Transfer Engine.
 *
 *   GET    <any path>?key=K         200 + value, or 404
 *   PUT    <any path>?key=K[&ttl=MS] stores the request body; with ttl the
 *                                   key is dropped unless put again within
 *                                   MS milliseconds. 413: larger than
 *                                   --max-value; 507: the store is full
 *                                   (--max-keys, --max-bytes)
 *   DELETE <any path>?key=K         200, or 404
 *   no key parameter, bad ttl       400
 *
 * Engines started with metadata_url=http://HOST:PORT/metadata publish their
 * segment descriptors here (leased: they put them again every ttl/3) and
 * look up their peers, so a test or a small cluster needs no etcd or redis.
 *
 * Any client may be hostile (there is no authentication: bind it where
 * only the cluster reaches it): the store's keys and bytes are capped,
 * bodies being received count against the cap, and every refusal is
 * logged (the first at WARN, later ones at DEBUG until a PUT is stored).
 * With --state FILE every change of content is appended to FILE and synced
 * before the reply (metadata_log.c), by a thread of its own: the map's
 * lock is never held across a disk write, so a GET, or a lease refresh
 * (a PUT that changes nothing but the expiry, which is not written),
 * never waits for one; FILE is compacted in the background and read at
 * start, so a restart loses nothing, and a leased key read back gets a
 * full ttl again, time for its engine to refresh it. libmicrohttpd serves
 * clients from a thread pool; the map is one mutex-protected hash table.
 * Once bound it prints one line, "ready metadata-server url=...", and then
 * serves until SIGINT or SIGTERM, when it exits 0. */
#include <errno.h>
#include <getopt.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "cli.h"
#include "commands.h"
#include "metadata_log.h"

#define PROG "ferry metadata-server"
#define DEFAULT_MAX_VALUE ((size_t)64 << 20)
#define DEFAULT_MAX_KEYS 1000000ul
#define DEFAULT_MAX_BYTES ((size_t)1 << 30)
#define POOL_THREADS 4
#define IDLE_TIMEOUT_S 60
#define MAX_TTL_MS (24u * 3600 * 1000) /* a longer lease is a mistake */
#define SWEEP_NS (500 * 1000 * 1000L)  /* how often expired keys are dropped */

/* ---- the key/value map --------------------------------------------------- */

typedef struct entry {
  struct entry *next;
  char *key;
  md_value *value;
  uint32_t ttl_ms;     /* 0: never expires */
  uint64_t expires_ns; /* monotonic; meaningful when ttl_ms != 0 */
} entry;

/* What a key costs the store: its bytes, its value's, and its entry. */
#define KEY_COST(klen, vlen) ((klen) + 1 + (vlen) + sizeof(entry) + sizeof(md_value))

typedef struct kv_map {
  pthread_mutex_t lock; /* guards everything below but the atomics */
  entry **buckets;
  size_t nbuckets, count;
  size_t bytes;     /* KEY_COST of every key (atomic stores: read unlocked) */
  size_t receiving; /* atomic: bytes of PUT bodies being received */
  size_t max_keys, max_bytes, max_value;
  int refusing; /* atomic: a refusal was logged at WARN since the last PUT stored */
  md_log *log;  /* NULL: nothing is persisted */
} kv_map;

static uint64_t hash_key(const char *key) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++)
    h = (h ^ *p) * 1099511628211ull;
  return h;
}

static entry **find_slot(kv_map *m, const char *key) {
  entry **slot = &m->buckets[hash_key(key) % m->nbuckets];
  while (*slot && strcmp((*slot)->key, key) != 0)
    slot = &(*slot)->next;
  return slot;
}

/* Doubles the bucket array when the load passes 1; on ENOMEM just stays. */
static void maybe_grow(kv_map *m) {
  if (m->count < m->nbuckets)
    return;
  size_t n = m->nbuckets * 2;
  entry **fresh = calloc(n, sizeof *fresh);
  if (!fresh)
    return;
  for (size_t i = 0; i < m->nbuckets; i++)
    for (entry *e = m->buckets[i], *next; e; e = next) {
      next = e->next;
      entry **head = &fresh[hash_key(e->key) % n];
      e->next = *head;
      *head = e;
    }
  free(m->buckets);
  m->buckets = fresh;
  m->nbuckets = n;
}

static void free_entry(entry *e) {
  free(e->key);
  md_value_unref(e->value);
  free(e);
}

static void map_free(kv_map *m) {
  for (size_t i = 0; i < m->nbuckets; i++)
    for (entry *e = m->buckets[i], *next; e; e = next) {
      next = e->next;
      free_entry(e);
    }
  free(m->buckets);
  pthread_mutex_destroy(&m->lock);
}

static int expired(const entry *e, uint64_t now) { return e->ttl_ms && now >= e->expires_ns; }

static void count_bytes(kv_map *m, size_t bytes) {
  __atomic_store_n(&m->bytes, bytes, __ATOMIC_RELAXED);
}

/* Unlinks and frees *slot; with logged, the deletion goes to the state
 * file too (not waited for). Called with the lock. */
static void drop(kv_map *m, entry **slot, int logged) {
  entry *e = *slot;
  *slot = e->next;
  m->count--;
  count_bytes(m, m->bytes - KEY_COST(strlen(e->key), e->value->len));
  if (logged && m->log && md_log_append(m->log, '-', e->key, NULL, 0, NULL) != 0)
    FERRY_WARN("metadata-server: out of memory: the deletion of %s is not in the state file",
               e->key);
  free_entry(e);
}

/* Stores value (the reference passes) under key; *changed: more than the
 * expiry changed. Called with the lock. 0, or -1 when out of memory. */
static int store(kv_map *m, const char *key, md_value *value, uint32_t ttl_ms, int *changed) {
  entry **slot = find_slot(m, key);
  entry *e = *slot;
  size_t klen = strlen(key);
  *changed = 1;
  if (e) {
    md_value *old = e->value;
    *changed = old->len != value->len || memcmp(old->data, value->data, value->len) != 0 ||
               e->ttl_ms != ttl_ms;
    count_bytes(m, m->bytes - old->len + value->len);
    md_value_unref(old);
  } else if ((e = calloc(1, sizeof *e)) && (e->key = strdup(key))) {
    *slot = e;
    m->count++;
    count_bytes(m, m->bytes + KEY_COST(klen, value->len));
    maybe_grow(m);
  } else {
    free(e);
    md_value_unref(value);
    return -1;
  }
  e->value = value;
  e->ttl_ms = ttl_ms;
  e->expires_ns = ferry_now_ns() + (uint64_t)ttl_ms * 1000000ull;
  return 0;
}

static int map_init(kv_map *m) {
  m->nbuckets = 64;
  m->buckets = calloc(m->nbuckets, sizeof *m->buckets);
  pthread_mutex_init(&m->lock, NULL);
  return m->buckets ? 0 : -1;
}

/* ---- the state file's side ------------------------------------------------ */

/* One change read back from the state file (limits do not apply: what was
 * stored stays stored). */
static int replay(void *arg, char op, const char *key, md_value *value, uint32_t ttl_ms) {
  kv_map *m = arg;
  int changed;
  if (op == '+')
    return store(m, key, value, ttl_ms, &changed);
  entry **slot = find_slot(m, key);
  if (*slot)
    drop(m, slot, 0);
  return 0;
}

/* The live keys, for a compaction of the state file. */
static ssize_t snapshot(void *arg, md_log *log, md_item **items) {
  kv_map *m = arg;
  pthread_mutex_lock(&m->lock);
  md_log_mark(log);
  ssize_t n = 0;
  uint64_t now = ferry_now_ns();
  md_item *out = malloc((m->count ? m->count : 1) * sizeof *out);
  for (size_t i = 0; out && i < m->nbuckets; i++)
    for (entry *e = m->buckets[i]; out && e; e = e->next) {
      if (expired(e, now))
        continue;
      out[n] = (md_item){strdup(e->key), md_value_ref(e->value), e->ttl_ms};
      if (!out[n++].key) {
        while (n-- > 0) {
          free(out[n].key);
          md_value_unref(out[n].value);
        }
        free(out);
        out = NULL;
      }
    }
  pthread_mutex_unlock(&m->lock);
  *items = out;
  return out ? n : -1;
}

/* ---- map operations ------------------------------------------------------ */

enum { PUT_STORED, PUT_NO_MEMORY, PUT_NOT_WRITTEN, PUT_TOO_MANY_KEYS, PUT_FULL, PUT_RECEIVING };

/* Why a PUT of klen + len bytes cannot be stored, or PUT_STORED. A value
 * that only shrinks is always let in. Called with the lock. */
static int over_limits(const kv_map *m, const entry *e, size_t klen, size_t len) {
  size_t cost = e ? len : KEY_COST(klen, len), freed = e ? e->value->len : 0;
  if (!e && m->count >= m->max_keys)
    return PUT_TOO_MANY_KEYS;
  if (cost > freed && m->bytes - freed + cost > m->max_bytes)
    return PUT_FULL;
  return PUT_STORED;
}

/* Takes the reference to value; ttl_ms 0: kept until deleted. PUT_*; a
 * change of content is in the state file before this returns. */
static int map_put(kv_map *m, const char *key, md_value *value, uint32_t ttl_ms) {
  md_record *written = NULL;
  int changed = 0;
  pthread_mutex_lock(&m->lock);
  int rc = over_limits(m, *find_slot(m, key), strlen(key), value->len);
  if (rc != PUT_STORED)
    md_value_unref(value);
  else if (store(m, key, value, ttl_ms, &changed) != 0)
    rc = PUT_NO_MEMORY;
  /* A refresh that only moves the expiry is not worth a disk write. */
  else if (changed && m->log && md_log_append(m->log, '+', key, value, ttl_ms, &written) != 0)
    rc = PUT_NOT_WRITTEN;
  pthread_mutex_unlock(&m->lock);
  if (written && (errno = md_log_wait(m->log, written)) != 0)
    rc = PUT_NOT_WRITTEN;
  return rc;
}

/* A reference to the value (the entry may change once the lock drops).
 * Returns 1 found, 0 missing (or expired). */
static int map_get(kv_map *m, const char *key, md_value **value) {
  pthread_mutex_lock(&m->lock);
  entry **slot = find_slot(m, key);
  if (*slot && expired(*slot, ferry_now_ns()))
    drop(m, slot, 1);
  *value = *slot ? md_value_ref((*slot)->value) : NULL;
  pthread_mutex_unlock(&m->lock);
  return *value != NULL;
}

/* 1 deleted, 0 missing, -2 deleted but the state file could not be written. */
static int map_delete(kv_map *m, const char *key) {
  md_record *written = NULL;
  pthread_mutex_lock(&m->lock);
  entry **slot = find_slot(m, key);
  int rc = 0;
  if (*slot) {
    rc = !expired(*slot, ferry_now_ns());
    if (m->log && md_log_append(m->log, '-', key, NULL, 0, &written) != 0)
      rc = -2;
    drop(m, slot, 0);
  }
  pthread_mutex_unlock(&m->lock);
  if (written && (errno = md_log_wait(m->log, written)) != 0)
    rc = -2;
  return rc;
}

/* Drops every expired key, so dead engines' keys do not pile up. */
static void map_sweep(kv_map *m) {
  pthread_mutex_lock(&m->lock);
  uint64_t now = ferry_now_ns();
  size_t before = m->count;
  for (size_t i = 0; i < m->nbuckets; i++)
    for (entry **slot = &m->buckets[i]; *slot;)
      if (expired(*slot, now))
        drop(m, slot, 1);
      else
        slot = &(*slot)->next;
  if (m->count != before)
    FERRY_DEBUG("metadata-server: %zu keys expired", before - m->count);
  pthread_mutex_unlock(&m->lock);
}

/* ---- HTTP handling ------------------------------------------------------- */

/* Per-request state, kept across the access-handler calls of one request. */
typedef struct request {
  md_value *body;
  size_t cap;
  size_t sent;     /* by the client, kept or not */
  size_t reserved; /* counted in the map's receiving */
  int refused;     /* PUT_STORED, or why not: PUT_*, REQUEST_TOO_LARGE */
} request;

enum { REQUEST_TOO_LARGE = 100 };

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *text) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
  if (!r)
    return MHD_NO;
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

/* The value's bytes, copied with no lock held. */
static enum MHD_Result reply_value(struct MHD_Connection *conn, md_value *value) {
  char *copy = malloc(value->len ? value->len : 1);
  if (copy)
    memcpy(copy, value->data, value->len);
  size_t len = value->len;
  md_value_unref(value);
  struct MHD_Response *r =
      copy ? MHD_create_response_from_buffer(len, copy, MHD_RESPMEM_MUST_FREE) : NULL;
  if (!r) {
    free(copy);
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  }
  enum MHD_Result rc = MHD_queue_response(conn, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return rc;
}

/* Logs a refused PUT: at WARN the first since a PUT was stored, so that a
 * client hammering a full store cannot flood the log. */
static void log_refusal(kv_map *m, const char *key, size_t len, const char *why) {
  if (!__atomic_exchange_n(&m->refusing, 1, __ATOMIC_RELAXED))
    FERRY_WARN("metadata-server: refused PUT %s (%zu bytes): %s (later refusals at debug level "
               "until a PUT is stored)",
               key, len, why);
  else
    FERRY_DEBUG("metadata-server: refused PUT %s (%zu bytes): %s", key, len, why);
}

/* The answer to a refused PUT, logged. */
static enum MHD_Result refuse_put(kv_map *m, struct MHD_Connection *conn, const char *key,
                                  size_t len, int why) {
  char text[160];
  unsigned status = MHD_HTTP_INSUFFICIENT_STORAGE;
  if (why == REQUEST_TOO_LARGE) {
    status = MHD_HTTP_CONTENT_TOO_LARGE;
    snprintf(text, sizeof text, "value larger than %zu bytes (--max-value)", m->max_value);
  } else if (why == PUT_TOO_MANY_KEYS) {
    snprintf(text, sizeof text, "the store holds %zu keys, the most (--max-keys)", m->max_keys);
  } else if (why == PUT_FULL) {
    snprintf(text, sizeof text, "the store is full: it holds %zu bytes of %zu (--max-bytes)",
             __atomic_load_n(&m->bytes, __ATOMIC_RELAXED), m->max_bytes);
  } else {
    snprintf(text, sizeof text, "PUT bodies being received take %zu bytes, the most (--max-bytes)",
             m->max_bytes);
  }
  log_refusal(m, key, len, text);
  strcat(text, "\n");
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_COPY);
  if (!r)
    return MHD_NO;
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

/* Room for size more bytes of a body being received: within --max-value,
 * and, with all the others being received, within --max-bytes (so bodies
 * and the store together hold at most twice that). */
static int reserve(kv_map *m, request *req, size_t size) {
  if (size > m->max_value - req->body->len)
    return REQUEST_TOO_LARGE;
  req->reserved += size;
  if (__atomic_add_fetch(&m->receiving, size, __ATOMIC_RELAXED) > m->max_bytes)
    return PUT_RECEIVING;
  return PUT_STORED;
}

static void unreserve(kv_map *m, request *req) {
  __atomic_sub_fetch(&m->receiving, req->reserved, __ATOMIC_RELAXED);
  req->reserved = 0;
}

/* Appends one chunk of a PUT body; past a limit, drops the rest. */
static void append_body(kv_map *m, request *req, const char *data, size_t size) {
  req->sent += size;
  if (req->refused || (req->refused = reserve(m, req, size)) != PUT_STORED)
    return;
  if (req->body->len + size > req->cap) {
    size_t cap = req->cap ? req->cap : 4096;
    while (cap < req->body->len + size)
      cap *= 2;
    md_value *grown = realloc(req->body, sizeof *grown + cap);
    if (!grown) {
      req->refused = PUT_NO_MEMORY;
      return;
    }
    req->body = grown;
    req->cap = cap;
  }
  memcpy(req->body->data + req->body->len, data, size);
  req->body->len += size;
}

/* The declared Content-Length (0 when none): one over the cap is refused
 * before the body comes. */
static size_t declared_length(struct MHD_Connection *conn) {
  const char *cl =
      MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  return cl ? (size_t)strtoull(cl, NULL, 10) : 0;
}

/* The ttl parameter: 0 when absent, 1..MAX_TTL_MS, else -1. */
static long ttl_param(struct MHD_Connection *conn) {
  const char *t = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "ttl");
  if (!t)
    return 0;
  char *end;
  errno = 0;
  long ms = strtol(t, &end, 10);
  return errno || end == t || *end || ms < 1 || ms > (long)MAX_TTL_MS ? -1 : ms;
}

static enum MHD_Result state_error(struct MHD_Connection *conn) {
  FERRY_WARN("metadata-server: a change was refused: the state file cannot be written: %s",
             strerror(errno));
  return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot write the state file\n");
}

static enum MHD_Result finish_put(kv_map *m, struct MHD_Connection *conn, const char *key,
                                  request *req) {
  size_t len = req->sent;
  unreserve(m, req); /* from here the map counts it */
  if (req->refused == PUT_NO_MEMORY)
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  if (req->refused)
    return refuse_put(m, conn, key, len, req->refused);
  long ttl = ttl_param(conn);
  if (ttl < 0)
    return reply(conn, MHD_HTTP_BAD_REQUEST, "ttl must be milliseconds in 1..86400000\n");
  md_value *value = req->body;
  req->body = NULL; /* the map owns it now */
  int rc = map_put(m, key, value, (uint32_t)ttl);
  if (rc == PUT_TOO_MANY_KEYS || rc == PUT_FULL)
    return refuse_put(m, conn, key, len, rc);
  if (rc == PUT_NOT_WRITTEN)
    return state_error(conn);
  if (rc != PUT_STORED)
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  __atomic_store_n(&m->refusing, 0, __ATOMIC_RELAXED);
  FERRY_DEBUG("metadata-server: PUT %s (%zu bytes)", key, len);
  return reply(conn, MHD_HTTP_OK, "ok\n");
}

static enum MHD_Result handle_put(kv_map *m, struct MHD_Connection *conn, const char *key,
                                  const char *data, size_t *data_size, void **con_cls) {
  request *req = *con_cls;
  if (!req) { /* first call: headers only */
    size_t declared = declared_length(conn);
    if (declared > m->max_value)
      return refuse_put(m, conn, key, declared, REQUEST_TOO_LARGE);
    if (!(req = calloc(1, sizeof *req)) || !(req->body = md_value_alloc(0))) {
      free(req);
      return MHD_NO;
    }
    *con_cls = req;
    return MHD_YES;
  }
  if (*data_size) {
    append_body(m, req, data, *data_size);
    *data_size = 0;
    return MHD_YES;
  }
  return finish_put(m, conn, key, req);
}

static enum MHD_Result handle_get(kv_map *m, struct MHD_Connection *conn, const char *key) {
  md_value *value;
  if (!map_get(m, key, &value))
    return reply(conn, MHD_HTTP_NOT_FOUND, "not found\n");
  return reply_value(conn, value);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **con_cls) {
  kv_map *m = cls;
  const char *key = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "key");
  int is_put = strcmp(method, MHD_HTTP_METHOD_PUT) == 0;
  /* A body on anything but PUT is read and ignored before replying. */
  if (!is_put && *data_size) {
    *data_size = 0;
    return MHD_YES;
  }
  if (!key || !*key)
    return reply(conn, MHD_HTTP_BAD_REQUEST, "missing ?key= parameter\n");
  if (is_put)
    return handle_put(m, conn, key, data, data_size, con_cls);
  if (strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0)
    return handle_get(m, conn, key);
  if (strcmp(method, MHD_HTTP_METHOD_DELETE) == 0) {
    FERRY_DEBUG("metadata-server: DELETE %s", key);
    int rc = map_delete(m, key);
    if (rc == -2)
      return state_error(conn);
    return rc ? reply(conn, MHD_HTTP_OK, "ok\n") : reply(conn, MHD_HTTP_NOT_FOUND, "not found\n");
  }
  return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "use GET, PUT or DELETE\n");
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  request *req = *con_cls;
  if (req) {
    unreserve(cls, req);
    md_value_unref(req->body);
    free(req);
    *con_cls = NULL;
  }
}

/* libmicrohttpd's own messages, as log lines (one line each, escaped). */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
  char text[512];
  vsnprintf(text, sizeof text, fmt, ap);
  text[strcspn(text, "\n")] = '\0';
  FERRY_WARN("metadata-server: %s", text);
}

/* ---- command line and lifetime ------------------------------------------- */

typedef struct options {
  const char *host;
  unsigned port;
  const char *state; /* --state FILE, or NULL */
  size_t max_value, max_keys, max_bytes;
} options;

static void usage(FILE *f) {
  fprintf(f, "usage: ferry metadata-server [--host ADDR] [--port N] [--state FILE]\n"
             "                             [--max-value SIZE] [--max-keys N] [--max-bytes SIZE]\n"
             "  In-memory http metadata store (GET|PUT|DELETE ?key=K, PUT &ttl=MS).\n"
             "  --host ADDR       address to listen on (default 127.0.0.1)\n"
             "  --port N          port to listen on, 0 picks a free one (default 8080)\n"
             "  --state FILE      keep the keys in FILE too, so a restart loses nothing\n"
             "  --max-value SIZE  largest value a PUT may store, else 413 (default 64M)\n"
             "  --max-keys N      most keys stored, else 507 (default 1000000)\n"
             "  --max-bytes SIZE  most bytes stored and being received, keys and values\n"
             "                    with about 64 bytes of bookkeeping each, else 507\n"
             "                    (default 1G)\n"
             "Prints one line \"ready metadata-server url=http://HOST:PORT/metadata\"\n"
             "and serves until SIGINT or SIGTERM.\n");
}

/* Returns 0 to run, 1 for --help, 2 on a usage error (serve.c's convention). */
static int parse_options(int argc, char **argv, options *opt) {
  static const struct option longopts[] = {
      {"host", required_argument, NULL, 'H'},     {"port", required_argument, NULL, 'p'},
      {"state", required_argument, NULL, 's'},    {"max-value", required_argument, NULL, 'v'},
      {"max-keys", required_argument, NULL, 'k'}, {"max-bytes", required_argument, NULL, 'b'},
      {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0}};
  *opt = (options){.host = "127.0.0.1",
                   .port = 8080,
                   .max_value = DEFAULT_MAX_VALUE,
                   .max_keys = DEFAULT_MAX_KEYS,
                   .max_bytes = DEFAULT_MAX_BYTES};
  unsigned long n;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'H': opt->host = optarg; break;
    case 's': opt->state = optarg; break;
    case 'h': return 1;
    case 'p':
      if (ferry_cli_parse_count(optarg, 0, 65535, &n) != 0)
        return ferry_cli_bad_value(PROG, "port", optarg);
      opt->port = (unsigned)n;
      break;
    case 'v':
      if (ferry_cli_parse_size(optarg, &opt->max_value) != 0)
        return ferry_cli_bad_value(PROG, "max-value", optarg);
      break;
    case 'b':
      if (ferry_cli_parse_size(optarg, &opt->max_bytes) != 0)
        return ferry_cli_bad_value(PROG, "max-bytes", optarg);
      break;
    case 'k':
      if (ferry_cli_parse_count(optarg, 1, UINT32_MAX, &n) != 0)
        return ferry_cli_bad_value(PROG, "max-keys", optarg);
      opt->max_keys = n;
      break;
    default: return 2;
    }
  }
  return ferry_cli_no_operands(PROG, argc, argv);
}

static struct MHD_Daemon *start_daemon(const options *opt, kv_map *map) {
  struct sockaddr_storage ss;
  if (ferry_cli_resolve(PROG, opt->host, opt->port, &ss) != 0)
    return NULL;
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  if (ss.ss_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, (uint16_t)opt->port, NULL, NULL, on_request, map, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
      NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE,
      (unsigned)POOL_THREADS, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, map, MHD_OPTION_END);
  if (!d)
    fprintf(stderr, PROG ": cannot listen on %s:%u (in use or not local?)\n", opt->host, opt->port);
  return d;
}

/* ---- a running server (also embedded in store-master) ------------------- */

struct ferry_md_server {
  kv_map map;
  struct MHD_Daemon *daemon;
  unsigned port; /* bound */
};

/* Starts serving opt (its map loaded from opt->state); NULL after saying why
 * on stderr. Block the stop signals first: MHD's threads inherit the mask. */
static ferry_md_server *md_start(const options *opt) {
  signal(SIGPIPE, SIG_IGN); /* a client that hangs up must not kill us */
  ferry_md_server *s = calloc(1, sizeof *s);
  if (!s || (s->map = (kv_map){.max_value = opt->max_value,
                               .max_keys = opt->max_keys,
                               .max_bytes = opt->max_bytes},
             map_init(&s->map) != 0)) {
    fprintf(stderr, PROG ": out of memory\n");
    free(s);
    return NULL;
  }
  if (opt->state && !(s->map.log = md_log_open(opt->state, replay, snapshot, &s->map))) {
    map_free(&s->map);
    free(s);
    return NULL;
  }
  if (!(s->daemon = start_daemon(opt, &s->map))) {
    if (s->map.log)
      md_log_close(s->map.log);
    map_free(&s->map);
    free(s);
    return NULL;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = info ? info->port : opt->port;
  return s;
}

ferry_md_server *ferry_md_server_start(const char *host, unsigned port) {
  options opt = {.host = host,
                 .port = port,
                 .max_value = DEFAULT_MAX_VALUE,
                 .max_keys = DEFAULT_MAX_KEYS,
                 .max_bytes = DEFAULT_MAX_BYTES};
  return md_start(&opt);
}

unsigned ferry_md_server_port(const ferry_md_server *s) { return s->port; }

void ferry_md_server_sweep(ferry_md_server *s) { map_sweep(&s->map); }

size_t ferry_md_server_stop(ferry_md_server *s) {
  MHD_stop_daemon(s->daemon); /* joins the pool threads: no request is left */
  if (s->map.log)
    md_log_close(s->map.log); /* writes what the sweep queued */
  size_t keys = s->map.count;
  map_free(&s->map);
  free(s);
  return keys;
}

int ferry_cmd_metadata_server(int argc, char **argv) {
  options opt;
  int rc = parse_options(argc, argv, &opt);
  if (rc != 0)
    return ferry_cli_usage_exit(rc, usage);

  /* Before MHD and the state file start their threads, so that they inherit the mask. */
  sigset_t stop;
  ferry_cli_block_stop_signals(&stop);
  ferry_md_server *s = md_start(&opt);
  if (!s)
    return 1;
  int v6 = strchr(opt.host, ':') != NULL; /* a literal IPv6 address needs brackets */
  printf("ready metadata-server url=http://%s%s%s:%u/metadata\n", v6 ? "[" : "", opt.host,
         v6 ? "]" : "", s->port);
  fflush(stdout);

  /* Expired keys are dropped between signals. */
  const struct timespec sweep = {0, SWEEP_NS};
  int sig;
  while ((sig = sigtimedwait(&stop, NULL, &sweep)) <= 0)
    ferry_md_server_sweep(s);
  size_t keys = ferry_md_server_stop(s);
  FERRY_INFO("metadata-server: signal %d, stopped (%zu keys dropped)", sig, keys);
  return 0;
}
