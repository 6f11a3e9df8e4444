/* client.c - a store client (ferry_store_*, ferry.h): its connection to the
 * master (handshake, REGISTER of its segment, a PING thread that keeps it
 * alive, a new connection at the next request once it is lost: the master
 * may have restarted), the requests on it, and the single-key calls, which
 * are batches of one (batch.c) or go through the registered staging buffer
 * when the caller's memory is not registered. */
#include "store/client.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "net/auth.h"
#include "store/cxl.h"
#include "store/ha.h"
#include "store/handshake.h"
#include "store/offload.h"

#define DEFAULT_STAGING (16u << 20)

void ferry_store_config_init_size(ferry_store_config *cfg, size_t size) {
  memset(cfg, 0, size);
  if (size >= sizeof cfg->size)
    cfg->size = size;
}

const char *ferry_store_segment(const ferry_store *store) {
  return ferry_engine_name(store->engine);
}

uint64_t ferry_store_owner_disk_reads(const ferry_store *store) {
  return __atomic_load_n(&store->owner_disk_reads, __ATOMIC_RELAXED);
}

/* ---- the master connection ------------------------------------------------------------------ */

/* Under s->lock, as everything about the connection. */
static void lose_connection(ferry_store *s, const char *cause) {
  snprintf(s->lost, sizeof s->lost, "%s", cause);
  close(s->fd);
  s->fd = -1;
}

/* One request and its reply on the live connection. A failure on the
 * socket (or a reply out of step) loses the connection. */
static ferry_status exchange(ferry_store *s, store_writer *w, uint32_t count, ferry_frame_header *h,
                             uint8_t **body, const char *step) {
  *body = NULL;
  if (w->failed) { /* nothing sent: the connection stays */
    store_writer_free(w);
    return ferry_fail(FERRY_ENOMEM, "%s: out of memory building the request", step);
  }
  ferry_sock_set_deadline(&s->sock, ferry_now_ns() + s->timeout_ms * 1000000ull);
  ferry_status st = store_send(&s->sock, FERRY_FRAME_STORE, count, 0, w, step);
  if (!st)
    st = store_recv(&s->sock, h, body, step);
  if (!st && (h->type != FERRY_FRAME_STORE_REPLY || (!h->status && h->count != count)))
    st = ferry_fail(FERRY_EPROTO, "%s: store master %s answered %u entries for %u", step, s->master,
                    h->count, count);
  if (st) {
    free(*body);
    *body = NULL;
    lose_connection(s, ferry_last_error());
    return ferry_fail(st, "lost the connection to store master %s: %s; the next call reconnects",
                      s->master, s->lost);
  }
  return FERRY_OK;
}

/* What a master of store protocol 3 or older answers a REGISTER with the
 * fields it does not know (its version check comes after the parse). */
#define OLD_MASTERS_REFUSAL "malformed REGISTER"

static ferry_status register_segment(ferry_store *s) {
  store_writer w = {0};
  const char *name = ferry_engine_name(s->engine);
  store_put_u8(&w, STORE_REGISTER);
  store_put_u16(&w, STORE_PROTOCOL_VERSION);
  store_put_u64(&w, (uint64_t)(uintptr_t)s->segment);
  store_put_u64(&w, s->segment_size);
  store_put_str(&w, name, strnlen(name, STORE_NAME_MAX));
  store_put_u64(&w, s->segment_nonce);
  ferry_frame_header h;
  uint8_t *body;
  ferry_status st = exchange(s, &w, 0, &h, &body, "store REGISTER");
  if (st)
    return st;
  store_reader r = {body, (size_t)h.body_len, 0};
  if (h.status == FERRY_EPROTO && h.body_len == strlen(OLD_MASTERS_REFUSAL) &&
      !memcmp(body, OLD_MASTERS_REFUSAL, h.body_len))
    st = ferry_fail(FERRY_EVERSION,
                    "store REGISTER refused by store master %s: it speaks an older store protocol "
                    "than this client's %d (it cannot read the REGISTER: \"%s\"); run the same "
                    "ferry on the master and its clients",
                    s->master, STORE_PROTOCOL_VERSION, OLD_MASTERS_REFUSAL);
  else if (h.status)
    st = ferry_fail((ferry_status)h.status, "store REGISTER refused by store master %s: %.*s%s",
                    s->master, (int)h.body_len, (const char *)body,
                    h.status == FERRY_EBUSY && s->conn
                        ? " (by this client's previous connection, until the master sees it "
                          "end: at most client_ttl)"
                        : "");
  uint32_t lease_ms = store_get_u32(&r), ping_ms = store_get_u32(&r);
  const char *dir;
  size_t dir_len;
  store_get_str(&r, &dir, &dir_len, STORE_DIR_MAX - 1);
  if (!st && !r.bad)
    snprintf(s->fs_dir, sizeof s->fs_dir, "%.*s", (int)dir_len, dir);
  const char *pool;
  size_t pool_len;
  store_get_str(&r, &pool, &pool_len, STORE_NAME_MAX);
  uint64_t pool_base = store_get_u64(&r), pool_size = store_get_u64(&r);
  if (!st && (r.bad || r.left || ping_ms == 0))
    st = ferry_fail(FERRY_EPROTO, "store master %s sent a malformed REGISTER reply", s->master);
  if (!st)
    st = store_cxl_adopt(s, pool, pool_len, pool_base, pool_size);
  free(body);
  if (st)
    return st;
  s->lease_ms = lease_ms;
  __atomic_store_n(&s->ping_ms, ping_ms, __ATOMIC_RELAXED);
  return FERRY_OK;
}

/* A master that answers with a new instance id restarted: without HA its
 * map lived in its memory only. */
static void log_rejoin(ferry_store *s, uint64_t master_id) {
  const char *name = ferry_engine_name(s->engine);
  char segment[64] = "without a segment";
  if (s->segment_size)
    snprintf(segment, sizeof segment, "with its segment of %zu bytes, empty", s->segment_size);
  if (s->ha_url && s->master_id && master_id != s->master_id)
    FERRY_WARN("store: followed the store's leader to %s (found at %s): %s rejoined it with its "
               "segment; the objects committed before the failover stay (the leaders' journal in "
               "etcd), puts that were in flight were dropped",
               s->leader, s->ha_url, name);
  else if (s->master_id && master_id != s->master_id)
    FERRY_WARN("store: master %s restarted (a new instance): the objects stored before are gone "
               "(without HA the master keeps them in its memory only); %s rejoined it %s",
               s->master, name, segment);
  else if (s->master_id)
    FERRY_INFO("store: %s reconnected to master %s (the same instance): the objects with a replica "
               "in its segment went with its previous connection",
               name, s->master);
}

/* A fresh connection (connect, handshake with the secret proven again,
 * REGISTER of this client's segment: empty to the master), or the fd
 * stays -1. Bounded by timeout_ms. */
static ferry_status join_master(ferry_store *s) {
  char host[FERRY_HOST_MAX];
  uint16_t port;
  ferry_status st = FERRY_OK;
  const char *target = s->master;
  if (s->ha_url) { /* HA: the leader may have moved since */
    st = store_ha_find_leader(s->ha_url, s->leader, sizeof s->leader);
    target = s->leader;
  }
  if (!st)
    st = ferry_net_parse_target(target, host, &port);
  uint64_t deadline = ferry_now_ns() + s->timeout_ms * 1000000ull;
  if (!st)
    st = ferry_net_connect(host, port, deadline, &s->fd);
  if (st)
    return st;
  ferry_sock_init(&s->sock, s->fd, target);
  ferry_sock_readahead(&s->sock, s->readahead, sizeof s->readahead);
  ferry_sock_set_deadline(&s->sock, deadline);
  store_identity self = {ferry_random_u64(), ferry_engine_name(s->engine), s->secret};
  uint64_t master_id = 0;
  st = store_handshake_connect(&s->sock, &s->session, &self, &master_id);
  if (!st)
    st = register_segment(s);
  if (st) {
    if (s->fd >= 0)
      close(s->fd);
    s->fd = -1;
    return st;
  }
  log_rejoin(s, master_id);
  s->master_id = master_id;
  s->conn++;
  return FERRY_OK;
}

/* Under s->lock: the connection a request goes on (want: see
 * store_request_on). One the master closed is replaced before the request
 * goes out. */
static ferry_status connection_for(ferry_store *s, uint64_t want, const char *step) {
  if (s->fd >= 0 && !ferry_net_idle_alive(s->fd))
    lose_connection(s, "the master closed it");
  if (want && (s->fd < 0 || s->conn != want))
    return ferry_fail(FERRY_ESOCKET,
                      "%s: the connection to store master %s that this put started on is gone "
                      "(%s): the master dropped the put, nothing is committed",
                      step, s->master, s->lost);
  if (s->fd >= 0)
    return FERRY_OK;
  ferry_status st = join_master(s);
  if (st) {
    snprintf(s->lost, sizeof s->lost, "%s", ferry_last_error());
    return ferry_fail(st, "%s: cannot reach store master %s: %s; the next call tries again", step,
                      s->master, s->lost);
  }
  return FERRY_OK;
}

ferry_status store_request_on(ferry_store *s, uint64_t *conn, store_writer *w, uint32_t count,
                              ferry_frame_header *h, uint8_t **body, const char *step) {
  *body = NULL;
  pthread_mutex_lock(&s->lock);
  ferry_status st = connection_for(s, conn ? *conn : 0, step);
  if (st)
    store_writer_free(w);
  else
    st = exchange(s, w, count, h, body, step);
  if (!st && conn)
    *conn = s->conn;
  if (!st && h->status == FERRY_EPROTO) /* the master closes it after saying why */
    lose_connection(s, "the master refused a malformed request");
  pthread_mutex_unlock(&s->lock);
  if (!st && h->status) {
    st = ferry_fail((ferry_status)h->status, "%s refused by store master %s: %.*s", step, s->master,
                    (int)h->body_len, (const char *)*body);
    free(*body);
    *body = NULL;
  }
  return st;
}

ferry_status store_request(ferry_store *s, store_writer *w, uint32_t count, ferry_frame_header *h,
                           uint8_t **body, const char *step) {
  return store_request_on(s, NULL, w, count, h, body, step);
}

int store_fs_dir(ferry_store *s, char dir[STORE_DIR_MAX]) {
  pthread_mutex_lock(&s->lock);
  memcpy(dir, s->fs_dir, STORE_DIR_MAX);
  pthread_mutex_unlock(&s->lock);
  return dir[0] != '\0';
}

static ferry_status simple_request(ferry_store *s, uint8_t op, const char *step) {
  store_writer w = {0};
  store_put_u8(&w, op);
  ferry_frame_header h;
  uint8_t *body;
  ferry_status st = store_request(s, &w, 0, &h, &body, step);
  free(body);
  return st;
}

/* PINGs keep the client alive; like any call, a PING reconnects a lost
 * connection (so an idle client's segment rejoins a restarted master). A
 * master that stays down is reported once, not at every PING. */
static void *pinger_main(void *arg) {
  ferry_store *s = arg;
  int failing = 0;
  pthread_mutex_lock(&s->ping_lock);
  while (!s->closing) {
    uint32_t ping_ms = __atomic_load_n(&s->ping_ms, __ATOMIC_RELAXED);
    struct timespec at = ferry_timespec(ferry_now_ns() + ping_ms * 1000000ull);
    pthread_cond_timedwait(&s->ping_cond, &s->ping_lock, &at);
    if (s->closing)
      break;
    pthread_mutex_unlock(&s->ping_lock);
    ferry_status st = simple_request(s, STORE_PING, "store PING");
    if (st && !failing)
      FERRY_WARN("%s", ferry_last_error());
    failing = st != FERRY_OK;
    pthread_mutex_lock(&s->ping_lock);
  }
  pthread_mutex_unlock(&s->ping_lock);
  return NULL;
}

/* The first form of ferry_store_config, the smallest size accepted. */
#define CONFIG_MIN_SIZE (offsetof(ferry_store_config, timeout_ms) + sizeof(uint32_t))

/* The caller's config as this libferry's struct (the ABI rule of
 * ferry_config): the fields an older caller lacks keep their defaults. */
static ferry_status adopt_config(const ferry_store_config *in, ferry_store_config *out) {
  ferry_store_config_init(out);
  if (!in)
    return ferry_fail(FERRY_EINVAL, "ferry_store_open: no config (fill one with "
                                    "ferry_store_config_init)");
  if (in->size < CONFIG_MIN_SIZE || in->size > sizeof *out)
    return ferry_fail(FERRY_EINVAL,
                      "ferry_store_open: ferry_store_config.size = %zu is not valid: expected "
                      "%zu to %zu (fill it with ferry_store_config_init; a larger size means a "
                      "ferry.h newer than this libferry)",
                      in->size, (size_t)CONFIG_MIN_SIZE, sizeof *out);
  memcpy(out, in, in->size);
  out->size = sizeof *out;
  if (!out->master || !*out->master)
    return ferry_fail(FERRY_EINVAL, "ferry_store_open: no master address (host:port)");
  if (strlen(out->master) >= FERRY_HOST_MAX)
    return ferry_fail(FERRY_EINVAL, "ferry_store_open: master address of %zu bytes is too long",
                      strlen(out->master));
  return FERRY_OK;
}

/* The locks and tables ferry_store_close tears down. */
static void init_sync(ferry_store *s) {
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->staging_lock, NULL);
  pthread_mutex_init(&s->ping_lock, NULL);
  ferry_cond_init(&s->ping_cond);
  store_suspects_init(&s->suspects);
}

ferry_status ferry_store_open(ferry_engine *engine, const ferry_store_config *cfg,
                              ferry_store **out) {
  ferry_store_config adopted;
  ferry_status st = adopt_config(cfg, &adopted);
  cfg = &adopted;
  if (st || !engine || !out)
    return st ? st : ferry_fail(FERRY_EINVAL, "ferry_store_open: engine and out are required");
  ferry_store *s = calloc(1, sizeof *s);
  if (!s)
    return ferry_fail(FERRY_ENOMEM, "ferry_store_open: out of memory");
  s->engine = engine;
  s->fd = -1;
  snprintf(s->master, sizeof s->master, "%s", cfg->master);
  if (!strncasecmp(cfg->master, STORE_HA_SCHEME, strlen(STORE_HA_SCHEME)) &&
      !(s->ha_url = strdup(cfg->master)))
    st = ferry_fail(FERRY_ENOMEM, "ferry_store_open: out of memory");
  s->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 10000;
  s->segment_size = cfg->segment_size;
  /* A CXL client copies straight between the caller and the pool: no staging. */
  s->staging_size = cfg->cxl_path            ? 0
                    : cfg->local_buffer_size ? cfg->local_buffer_size
                                             : DEFAULT_STAGING;
  init_sync(s);
  const char *secret = cfg->secret ? cfg->secret : getenv("FERRY_SECRET");
  if (!st && secret && *secret && !(s->secret = strdup(secret)))
    st = ferry_fail(FERRY_ENOMEM, "ferry_store_open: out of memory");
  if (!st && s->segment_size)
    st = ferry_memory_alloc(engine, s->segment_size, &s->segment);
  /* Names this segment's memory (not its address: a client restarted on
   * the same name may get the same one) for as long as it lives. */
  while (!st && s->segment_size && !s->segment_nonce)
    s->segment_nonce = ferry_random_u64();
  if (!st && s->staging_size)
    st = ferry_memory_alloc(engine, s->staging_size, &s->staging);
  if (!st && cfg->cxl_path)
    st = store_cxl_map(s, cfg->cxl_path, cfg->cxl_size);
  if (!st) {
    pthread_mutex_lock(&s->lock); /* no other thread yet; the connection's rule */
    st = join_master(s);
    pthread_mutex_unlock(&s->lock);
  }
  if (!st)
    s->pinger_started = pthread_create(&s->pinger, NULL, pinger_main, s) == 0;
  if (!st && !s->pinger_started)
    st = ferry_fail(FERRY_ENOMEM, "ferry_store_open: cannot start the PING thread");
  if (!st && cfg->offload_dir)
    st = store_offload_start(s, cfg->offload_dir, cfg->offload_max_bytes, &s->offload);
  if (st) {
    char detail[FERRY_ERROR_MAX];
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
    ferry_store_close(s);
    return ferry_fail(st, "%s", detail);
  }
  if (s->cxl)
    FERRY_INFO("store: %s joined master %s, its values in the CXL pool %s (%s mapped here, %zu "
               "bytes)",
               ferry_engine_name(engine), s->master, s->pool, cfg->cxl_path, s->cxl_size);
  else
    FERRY_INFO("store: %s joined master %s with a segment of %zu bytes", ferry_engine_name(engine),
               s->master, s->segment_size);
  *out = s;
  return FERRY_OK;
}

ferry_status store_open_connection(ferry_store *s, ferry_store **out) {
  ferry_store *c = calloc(1, sizeof *c);
  if (!c)
    return ferry_fail(FERRY_ENOMEM, "ferry_store_open: out of memory");
  c->engine = s->engine;
  c->fd = -1;
  memcpy(c->master, s->master, sizeof c->master);
  c->timeout_ms = s->timeout_ms;
  init_sync(c);
  ferry_status st = FERRY_OK;
  if ((s->ha_url && !(c->ha_url = strdup(s->ha_url))) ||
      (s->secret && !(c->secret = strdup(s->secret))))
    st = ferry_fail(FERRY_ENOMEM, "ferry_store_open: out of memory");
  if (!st) {
    pthread_mutex_lock(&c->lock);
    st = join_master(c);
    pthread_mutex_unlock(&c->lock);
  }
  if (!st && !(c->pinger_started = pthread_create(&c->pinger, NULL, pinger_main, c) == 0))
    st = ferry_fail(FERRY_ENOMEM, "ferry_store_open: cannot start the PING thread");
  if (st) {
    ferry_store_close(c);
    return st;
  }
  *out = c;
  return FERRY_OK;
}

void ferry_store_close(ferry_store *s) {
  if (!s)
    return;
  store_offload_stop(s->offload); /* first: it reads and writes the segment */
  pthread_mutex_lock(&s->ping_lock);
  s->closing = 1;
  pthread_cond_signal(&s->ping_cond);
  pthread_mutex_unlock(&s->ping_lock);
  if (s->pinger_started)
    pthread_join(s->pinger, NULL);
  if (s->fd >= 0)
    close(s->fd); /* the master drops the segment before anyone is told to use it again */
  if (s->segment)
    ferry_memory_free(s->engine, s->segment);
  if (s->staging)
    ferry_memory_free(s->engine, s->staging);
  store_cxl_unmap(s);
  pthread_cond_destroy(&s->ping_cond);
  pthread_mutex_destroy(&s->ping_lock);
  pthread_mutex_destroy(&s->staging_lock);
  pthread_mutex_destroy(&s->lock);
  store_suspects_destroy(&s->suspects);
  free(s->secret);
  free(s->ha_url);
  free(s);
}

/* ---- messages ------------------------------------------------------------------------------- */

ferry_status store_check_key(const char *key, const char *call) {
  size_t len = key ? strnlen(key, STORE_KEY_MAX + 1) : 0;
  if (len == 0 || len > STORE_KEY_MAX)
    return ferry_fail(FERRY_EINVAL, "%s: a key is 1 to %d bytes, not %s", call, STORE_KEY_MAX,
                      key ? (len ? "longer" : "empty") : "NULL");
  return FERRY_OK;
}

ferry_status store_entry_fail(ferry_store *s, ferry_status st, const char *key, uint64_t size,
                              const char *what) {
  switch (st) {
  case FERRY_ENOTFOUND:
    return ferry_fail(st, "%s \"%s\": the key is not in the store (master %s)", what, key,
                      s->master);
  case FERRY_ENOMEM:
    return ferry_fail(
        st,
        "%s \"%s\" (%llu bytes): the store is full: no segment has a free extent "
        "that large, or fewer segments have room than replicas were asked (master %s)",
        what, key, (unsigned long long)size, s->master);
  case FERRY_ETIMEDOUT:
    return ferry_fail(st,
                      "%s \"%s\": its only copy is on the disk of the client that offloaded it, "
                      "which did not load it back within a PING interval (master %s; that "
                      "client is stalled or busy)",
                      what, key, s->master);
  case FERRY_EBUSY:
    return ferry_fail(
        st,
        "%s \"%s\": busy at master %s (a put or upsert of it in progress, or a get's lease "
        "holds it)",
        what, key, s->master);
  default:
    return ferry_fail(st, "%s \"%s\": refused by store master %s (%s)", what, key, s->master,
                      ferry_strerror(st));
  }
}

/* ---- single keys ---------------------------------------------------------------------------- */

ferry_status ferry_store_put_from(ferry_store *s, const char *key, void *buf, size_t length,
                                  const ferry_store_replicate *replicate) {
  ferry_store_item item = {key, buf, length, FERRY_OK};
  return ferry_store_put_from_batch(s, &item, 1, replicate);
}

ferry_status ferry_store_upsert_from(ferry_store *s, const char *key, void *buf, size_t length,
                                     const ferry_store_replicate *replicate) {
  ferry_store_item item = {key, buf, length, FERRY_OK};
  return ferry_store_upsert_from_batch(s, &item, 1, replicate);
}

ferry_status ferry_store_get_into(ferry_store *s, const char *key, void *buf, size_t capacity,
                                  size_t *length) {
  ferry_store_item item = {key, buf, capacity, FERRY_OK};
  ferry_status st = ferry_store_get_into_batch(s, &item, 1);
  if (length && (st == FERRY_OK || st == FERRY_EINVAL)) /* the value's size, fitting or not */
    *length = item.length;
  return st;
}

ferry_status ferry_store_size(ferry_store *s, const char *key, uint64_t *size) {
  ferry_store_item item = {key, NULL, 0, FERRY_OK};
  ferry_status st = ferry_store_exists_batch(s, &item, 1);
  if (!st && item.status)
    st = store_entry_fail(s, item.status, key, 0, "size of");
  if (!st && size)
    *size = item.length;
  return st;
}

ferry_status ferry_store_exists(ferry_store *s, const char *key) {
  return ferry_store_size(s, key, NULL);
}

/* Memory the engine may not have registered goes through the staging
 * buffer, or a registered buffer of its own when larger. */
static ferry_status take_staging(ferry_store *s, size_t length, void **buf) {
  if (length <= s->staging_size) {
    pthread_mutex_lock(&s->staging_lock);
    *buf = s->staging;
    return FERRY_OK;
  }
  return ferry_memory_alloc(s->engine, length, buf);
}

static void give_staging(ferry_store *s, void *buf) {
  if (buf == s->staging)
    pthread_mutex_unlock(&s->staging_lock);
  else
    ferry_memory_free(s->engine, buf);
}

/* put and upsert of memory that may not be registered: through staging. */
static ferry_status put_staged(ferry_store *s, const char *key, const void *data, size_t length,
                               const ferry_store_replicate *replicate, int upsert) {
  const char *call = upsert ? "ferry_store_upsert" : "ferry_store_put";
  void *buf;
  if (!data || !length)
    return ferry_fail(FERRY_EINVAL, "%s: no bytes to store under \"%s\"", call,
                      key ? key : "(NULL)");
  if (s->cxl) /* copied into the pool from where it is: staging would be a second copy */
    return upsert ? ferry_store_upsert_from(s, key, (void *)data, length, replicate)
                  : ferry_store_put_from(s, key, (void *)data, length, replicate);
  ferry_status st = take_staging(s, length, &buf);
  if (st)
    return st;
  memcpy(buf, data, length);
  st = upsert ? ferry_store_upsert_from(s, key, buf, length, replicate)
              : ferry_store_put_from(s, key, buf, length, replicate);
  give_staging(s, buf);
  return st;
}

ferry_status ferry_store_put(ferry_store *s, const char *key, const void *data, size_t length,
                             const ferry_store_replicate *replicate) {
  return put_staged(s, key, data, length, replicate, 0);
}

ferry_status ferry_store_upsert(ferry_store *s, const char *key, const void *data, size_t length,
                                const ferry_store_replicate *replicate) {
  return put_staged(s, key, data, length, replicate, 1);
}

/* ferry_store_put for many values: all of them staged together (one
 * buffer, each value at a 64-byte boundary), then one batch put. */
ferry_status ferry_store_put_batch(ferry_store *s, ferry_store_item *items, size_t count,
                                   const ferry_store_replicate *replicate) {
  size_t total = 0;
  for (size_t i = 0; i < count; i++) {
    if (!items[i].buf || !items[i].length)
      return ferry_fail(FERRY_EINVAL, "ferry_store_put_batch: item %zu (\"%s\") has no bytes", i,
                        items[i].key ? items[i].key : "(NULL)");
    total += (items[i].length + 63) & ~(size_t)63;
  }
  if (!count)
    return FERRY_OK;
  if (s->cxl) /* copied into the pool from where they are, as put_staged does */
    return ferry_store_put_from_batch(s, items, count, replicate);
  ferry_store_item *staged = malloc(count * sizeof *staged);
  void *buf = NULL;
  ferry_status st = staged ? take_staging(s, total, &buf)
                           : ferry_fail(FERRY_ENOMEM, "ferry_store_put_batch: out of memory");
  if (st) {
    free(staged);
    return st;
  }
  size_t at = 0;
  for (size_t i = 0; i < count; i++) {
    staged[i] = items[i];
    staged[i].buf = (char *)buf + at;
    staged[i].status = FERRY_OK;
    memcpy(staged[i].buf, items[i].buf, items[i].length);
    at += (items[i].length + 63) & ~(size_t)63;
  }
  st = ferry_store_put_from_batch(s, staged, count, replicate);
  give_staging(s, buf);
  for (size_t i = 0; i < count; i++)
    items[i].status = staged[i].status;
  free(staged);
  return st;
}

/* get_staged for a CXL pool's client: straight from the pool into the
 * malloc'd copy (its buffers need no registration). */
static ferry_status get_unstaged(ferry_store *s, const char *key, uint64_t *size, void **data,
                                 size_t *length) {
  void *copy = malloc(*size ? (size_t)*size : 1);
  if (!copy)
    return ferry_fail(FERRY_ENOMEM, "ferry_store_get \"%s\": no memory for %llu bytes", key,
                      (unsigned long long)*size);
  size_t got = 0;
  ferry_status st = ferry_store_get_into(s, key, copy, *size, &got);
  if (st == FERRY_EINVAL && got > *size)
    *size = got; /* an upsert made it larger since the size was asked */
  if (st) {
    free(copy);
    return st;
  }
  *data = copy;
  *length = got;
  return FERRY_OK;
}

/* Reads key (size bytes, or more: *size grows) through staging into a
 * malloc'd copy. */
static ferry_status get_staged(ferry_store *s, const char *key, uint64_t *size, void **data,
                               size_t *length) {
  void *buf = NULL, *copy = NULL;
  ferry_status st =
      s->cxl ? get_unstaged(s, key, size, data, length) : take_staging(s, *size, &buf);
  if (st || s->cxl)
    return st;
  size_t got = 0;
  st = ferry_store_get_into(s, key, buf, *size, &got);
  if (st == FERRY_EINVAL && got > *size)
    *size = got; /* an upsert made it larger since the size was asked */
  else if (!st && !(copy = malloc(got ? got : 1)))
    st = ferry_fail(FERRY_ENOMEM, "ferry_store_get \"%s\": no memory for %zu bytes", key, got);
  if (copy) {
    memcpy(copy, buf, got);
    *data = copy;
    *length = got;
  }
  give_staging(s, buf);
  return st;
}

ferry_status ferry_store_get(ferry_store *s, const char *key, void **data, size_t *length) {
  uint64_t size, asked;
  ferry_status st = ferry_store_size(s, key, &size);
  /* Upserts that keep making it larger: a few tries, then their error. */
  for (int tries = 0; !st; tries++) {
    asked = size;
    st = get_staged(s, key, &size, data, length);
    if (!(st == FERRY_EINVAL && size > asked && tries < 3))
      break;
    st = FERRY_OK;
  }
  return st;
}

ferry_status ferry_store_remove(ferry_store *s, const char *key) {
  ferry_status st = store_check_key(key, "ferry_store_remove");
  if (st)
    return st;
  store_writer w = {0};
  store_put_u8(&w, STORE_REMOVE);
  store_put_str(&w, key, strlen(key));
  ferry_frame_header h;
  uint8_t *body;
  st = store_request(s, &w, 1, &h, &body, "store REMOVE");
  if (st)
    return st;
  store_reader r = {body, (size_t)h.body_len, 0};
  ferry_status entry = (ferry_status)(int32_t)store_get_u32(&r);
  free(body);
  if (r.bad || r.left)
    return ferry_fail(FERRY_EPROTO, "store master %s sent a malformed REMOVE reply", s->master);
  return entry ? store_entry_fail(s, entry, key, 0, "remove") : FERRY_OK;
}

ferry_status ferry_store_remove_all(ferry_store *s, uint64_t *removed) {
  store_writer w = {0};
  store_put_u8(&w, STORE_REMOVE_ALL);
  ferry_frame_header h;
  uint8_t *body;
  ferry_status st = store_request(s, &w, 0, &h, &body, "store REMOVE_ALL");
  if (st)
    return st;
  store_reader r = {body, (size_t)h.body_len, 0};
  uint64_t count = store_get_u64(&r);
  free(body);
  if (r.bad || r.left)
    return ferry_fail(FERRY_EPROTO, "store master %s sent a malformed REMOVE_ALL reply", s->master);
  if (removed)
    *removed = count;
  return FERRY_OK;
}
