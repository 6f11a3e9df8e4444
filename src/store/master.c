/* master.c - the store master's server (master.h): a listener thread that
 * accepts clients (max_clients at once: each costs a thread) and drops the
 * silent ones, and a thread per client that
 * runs its handshake and answers its requests in order from the map
 * (map.c). A client is alive while its connection is: when the connection
 * ends, or nothing arrived on it for client_ttl, its thread ends and the
 * map drops its segment, the replicas there and its pending puts. */
#include "store/master.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "net/auth.h"
#include "net/net.h"
#include "store/disk.h"
#include "store/handshake.h"
#include "store/map.h"
#include "store/protocol.h"

#define HANDSHAKE_MS 5000
#define MAX_CLIENTS 1024
#define REFUSAL_MS 100 /* a refusal fits any fresh socket's send buffer: never waits long */

typedef struct client {
  struct client *next;
  store_master *master;
  uint64_t id;
  int fd;
  ferry_sock sock;
  ferry_session session;
  uint8_t readahead[4096]; /* a small request in one receive, its header and body together */
  char peer[FERRY_HOST_MAX + 8];
  char name[FERRY_WIRE_MAX_NAME + 1];
  pthread_t thread;
  uint64_t last_seen_ns; /* atomic */
  int finished;          /* atomic: its thread is done, join it */
  int expired;           /* atomic: cut off for silence */
} client;

struct store_master {
  int listen_fd;
  uint16_t port;
  int wake[2]; /* the listener's stop pipe */
  pthread_t listener;
  pthread_mutex_t lock; /* clients */
  client *clients;
  uint32_t client_count; /* in clients, finished or not */
  uint32_t max_clients;
  uint64_t next_id;
  store_map *map;
  uint64_t client_ttl_ns;
  uint64_t instance_id;
  char *secret;
  int fenced;              /* HA: serves only before serve_until_ns */
  uint64_t serve_until_ns; /* atomic */
};

#define NOT_LEADER "this master is not the leader (HA): the next call finds the leader"

/* An unfenced master always serves; a fenced one while its lease holds. */
static int serving(store_master *m) {
  return !m->fenced || ferry_now_ns() < __atomic_load_n(&m->serve_until_ns, __ATOMIC_ACQUIRE);
}

/* ---- one client ----------------------------------------------------------------------------- */

static ferry_status refusal(client *c, ferry_status st, const char *why) {
  store_writer w = {0};
  store_put_raw(&w, why, strnlen(why, FERRY_WIRE_MAX_REASON));
  return store_send(&c->sock, FERRY_FRAME_STORE_REPLY, 0, st, &w, "send a store refusal");
}

/* One request: FERRY_OK to go on; anything else ends the connection. */
static ferry_status serve_request(client *c, int *registered) {
  ferry_frame_header h;
  uint8_t *body;
  ferry_sock_set_deadline(&c->sock, 0);
  ferry_status st = store_recv(&c->sock, &h, &body, "receive a store request");
  if (st != FERRY_OK)
    return st;
  __atomic_store_n(&c->last_seen_ns, ferry_now_ns(), __ATOMIC_RELAXED);
  store_reader r = {body, (size_t)h.body_len, 0};
  uint8_t op = store_get_u8(&r);
  store_writer reply = {0};
  char why[FERRY_WIRE_MAX_REASON] = "";
  if (!serving(c->master)) { /* the lease may be another's by now: serve nothing */
    free(body);
    refusal(c, FERRY_EBUSY, NOT_LEADER);
    return ferry_fail(FERRY_EBUSY, NOT_LEADER);
  }
  if (h.type != FERRY_FRAME_STORE || (op == STORE_REGISTER) == *registered) {
    st = FERRY_EPROTO;
    snprintf(why, sizeof why, "%s",
             *registered ? "second REGISTER" : "first request is not REGISTER");
  } else {
    st = store_map_serve(c->master->map, c->id, op, &r, h.count, &reply, why, sizeof why);
  }
  free(body);
  /* A reply never waits longer on a client than its silence may last. */
  ferry_sock_set_deadline(&c->sock, ferry_now_ns() + c->master->client_ttl_ns);
  if (st != FERRY_OK) {
    store_writer_free(&reply);
    FERRY_WARN("store client %s (%s): %s refused: %s", c->name, c->peer,
               op == STORE_REGISTER ? "REGISTER" : "request", why);
    ferry_status sent = refusal(c, st, why);
    return st == FERRY_EPROTO || sent != FERRY_OK ? ferry_fail(st, "%s", why) : FERRY_OK;
  }
  if (op == STORE_REGISTER)
    *registered = 1;
  return store_send(&c->sock, FERRY_FRAME_STORE_REPLY, h.count, 0, &reply, "send a store reply");
}

static void *client_main(void *arg) {
  client *c = arg;
  store_master *m = c->master;
  store_identity self = {m->instance_id, "store-master", m->secret};
  ferry_sock_set_deadline(&c->sock, ferry_now_ns() + HANDSHAKE_MS * 1000000ull);
  ferry_status st = store_handshake_accept(&c->sock, &c->session, &self, c->name, sizeof c->name);
  int registered = 0;
  while (st == FERRY_OK)
    st = serve_request(c, &registered);
  size_t dropped = store_map_drop_client(m->map, c->id);
  if (__atomic_load_n(&c->expired, __ATOMIC_ACQUIRE))
    FERRY_WARN("store client %s (%s) sent nothing for %llu ms (client_ttl): dropped it and %zu "
               "objects with replicas in its segment",
               c->name, c->peer, (unsigned long long)(m->client_ttl_ns / 1000000), dropped);
  else if (registered)
    FERRY_INFO("store client %s (%s) left (%s): dropped %zu objects with replicas in its segment",
               c->name, c->peer, ferry_last_error(), dropped);
  shutdown(c->fd, SHUT_RDWR);
  __atomic_store_n(&c->finished, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* ---- the listener --------------------------------------------------------------------------- */

/* Past max_clients (or at a fenced master past its lease), the connection
 * gets a HELLO_REPLY refusing it with
 * FERRY_EBUSY and the reason, from the listener (no thread for it), and is
 * closed: its client reads why. */
static void refuse_client(int fd, const char *peer, const char *why) {
  FERRY_WARN("store master: refused client %s: %s", peer, why);
  ferry_sock sock;
  ferry_sock_init(&sock, fd, peer);
  ferry_sock_set_deadline(&sock, ferry_now_ns() + REFUSAL_MS * 1000000ull);
  ferry_frame_header h = {.type = FERRY_FRAME_HELLO_REPLY, .status = FERRY_EBUSY};
  h.body_len = strlen(why);
  ferry_sock_send_frame(&sock, &h, why, "send a store refusal");
  close(fd);
}

static void accept_client(store_master *m) {
  int fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE)
      poll(NULL, 0, 100); /* out of descriptors: back off instead of spinning */
    return;
  }
  ferry_net_tune(fd);
  char peer[FERRY_HOST_MAX + 8];
  ferry_net_describe_peer(fd, peer, sizeof peer);
  pthread_mutex_lock(&m->lock);
  int full = m->client_count >= m->max_clients;
  pthread_mutex_unlock(&m->lock);
  char why[FERRY_WIRE_MAX_REASON];
  snprintf(why, sizeof why, "%u clients connected, the limit (--max_clients)", m->max_clients);
  if (full || !serving(m)) {
    refuse_client(fd, peer, full ? why : NOT_LEADER);
    return;
  }
  client *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return;
  }
  snprintf(c->peer, sizeof c->peer, "%s", peer);
  snprintf(c->name, sizeof c->name, "(before HELLO)");
  c->master = m;
  c->fd = fd;
  ferry_sock_init(&c->sock, fd, c->peer);
  ferry_sock_readahead(&c->sock, c->readahead, sizeof c->readahead);
  c->last_seen_ns = ferry_now_ns();
  pthread_mutex_lock(&m->lock);
  c->id = ++m->next_id;
  if (pthread_create(&c->thread, NULL, client_main, c) != 0) {
    pthread_mutex_unlock(&m->lock);
    close(fd);
    free(c);
    return;
  }
  c->next = m->clients;
  m->clients = c;
  m->client_count++;
  pthread_mutex_unlock(&m->lock);
}

/* Joins the finished clients' threads and cuts off the silent ones (their
 * threads then end as for a lost connection). */
static void sweep_clients(store_master *m) {
  uint64_t now = ferry_now_ns();
  pthread_mutex_lock(&m->lock);
  for (client **at = &m->clients; *at;) {
    client *c = *at;
    if (__atomic_load_n(&c->finished, __ATOMIC_ACQUIRE)) {
      *at = c->next;
      m->client_count--;
      pthread_join(c->thread, NULL);
      close(c->fd);
      free(c);
      continue;
    }
    uint64_t seen = __atomic_load_n(&c->last_seen_ns, __ATOMIC_RELAXED);
    if (now > seen + m->client_ttl_ns && !__atomic_exchange_n(&c->expired, 1, __ATOMIC_ACQ_REL))
      shutdown(c->fd, SHUT_RDWR);
    at = &c->next;
  }
  pthread_mutex_unlock(&m->lock);
}

static void *listener_main(void *arg) {
  store_master *m = arg;
  int tick_ms = (int)(m->client_ttl_ns / 4000000);
  for (;;) {
    struct pollfd fds[2] = {{m->listen_fd, POLLIN, 0}, {m->wake[0], POLLIN, 0}};
    int n = poll(fds, 2, tick_ms > 0 ? tick_ms : 1);
    if (n < 0 && errno != EINTR)
      break;
    if (fds[1].revents)
      break;
    sweep_clients(m); /* first: a client that just left frees its place */
    if (fds[0].revents & POLLIN)
      accept_client(m);
  }
  return NULL;
}

/* ---- start and stop ------------------------------------------------------------------------- */

/* The SSD tier's directory, checked before anything listens. */
static ferry_status use_disk(store_map *map, const store_master_config *cfg) {
  char dir[STORE_DIR_MAX];
  ferry_status st = store_disk_prepare(
      cfg->root_fs_dir, cfg->cluster_id ? cfg->cluster_id : "mooncake_cluster", dir, sizeof dir);
  if (!st && store_map_set_disk(map, dir) != 0)
    st = ferry_fail(FERRY_ENOMEM, "store master: out of memory");
  if (!st)
    FERRY_INFO("store master: evicted objects stay on disk in %s (--root_fs_dir)", dir);
  return st;
}

/* --enable_cxl's pool. The tiers that write values elsewhere would need
 * an owner for its bytes, which no client is. */
static ferry_status use_pool(store_map *map, const store_master_config *cfg) {
  const char *path = cfg->cxl_path && *cfg->cxl_path ? cfg->cxl_path : "/dev/dax0.0";
  uint64_t size = cfg->cxl_size ? cfg->cxl_size : 8ull << 30;
  char name[STORE_NAME_MAX + 1];
  if (cfg->enable_offload || cfg->root_fs_dir)
    return ferry_fail(FERRY_EINVAL,
                      "store master: --enable_cxl with %s: not supported (the "
                      "CXL pool's values have no owner to write them to disk)",
                      cfg->enable_offload ? "--enable_offload" : "--root_fs_dir");
  if ((size_t)snprintf(name, sizeof name, "cxl:%s", path) >= sizeof name)
    return ferry_fail(FERRY_EINVAL, "store master: --cxl_path of %zu bytes is too long",
                      strlen(path));
  if (store_map_set_pool(map, name, size) != 0)
    return ferry_fail(FERRY_ENOMEM, "store master: out of memory");
  FERRY_INFO("store master: every value goes to the CXL pool %s, %llu bytes, which clients map "
             "themselves (--enable_cxl, --cxl_path, --cxl_size)",
             name, (unsigned long long)size);
  return FERRY_OK;
}

ferry_status store_master_start(const store_master_config *cfg, store_master **out) {
  store_master *m = calloc(1, sizeof *m);
  if (!m)
    return ferry_fail(FERRY_ENOMEM, "store master: out of memory");
  const char *host = cfg->host ? cfg->host : "127.0.0.1";
  uint32_t client_ttl_ms = cfg->client_ttl_ms ? cfg->client_ttl_ms : 10000;
  m->client_ttl_ns = client_ttl_ms * 1000000ull;
  m->max_clients = cfg->max_clients ? cfg->max_clients : MAX_CLIENTS;
  m->instance_id = ferry_random_u64();
  m->fenced = cfg->fenced;
  m->listen_fd = m->wake[0] = m->wake[1] = -1;
  store_eviction eviction = {
      cfg->eviction_high_watermark_ratio > 0 ? cfg->eviction_high_watermark_ratio : 0.95,
      cfg->eviction_ratio > 0 ? cfg->eviction_ratio : 0.05,
      cfg->soft_pin_ttl_ms ? cfg->soft_pin_ttl_ms : 30 * 60 * 1000,
      cfg->max_soft_pin_ttl_ms ? cfg->max_soft_pin_ttl_ms : 24 * 60 * 60 * 1000,
      cfg->keep_soft_pinned};
  m->map = store_map_create(cfg->lease_ttl_ms ? cfg->lease_ttl_ms : 5000, client_ttl_ms, &eviction);
  if (m->map)
    store_map_set_gc(m->map, cfg->gc_after_get_ms);
  m->secret = cfg->secret && *cfg->secret ? strdup(cfg->secret) : NULL;
  ferry_status st = FERRY_OK;
  if (!m->map || (cfg->secret && *cfg->secret && !m->secret) || pipe2(m->wake, O_CLOEXEC) != 0)
    st = ferry_fail(FERRY_ENOMEM, "store master: out of memory or descriptors");
  if (!st && cfg->enable_cxl)
    st = use_pool(m->map, cfg);
  /* Mooncake's own scripts pass both: its master names the directory so
   * that its clients start their file storage, which enable_ssd_offload
   * does here. The two tiers do not mix: the clients' disks win. */
  if (!st && cfg->root_fs_dir && cfg->enable_offload)
    FERRY_WARN("store master: --root_fs_dir=%s with --enable_offload: the SSD tier is the "
               "clients' offload directories; nothing is written to %s (its files would be a "
               "second tier that does not mix with theirs)",
               cfg->root_fs_dir, cfg->root_fs_dir);
  else if (!st && cfg->root_fs_dir)
    st = use_disk(m->map, cfg);
  if (!st && cfg->enable_offload) {
    const store_offload_config *o = &cfg->offload;
    store_map_set_offload(m->map, o);
    FERRY_INFO("store master: clients with an offload directory keep copies on their disks "
               "(--enable_offload, %s; --offloading_queue_limit=%u tasks per client)",
               o->on_evict ? "when eviction chooses an object" : "after each put",
               o->queue_limit ? o->queue_limit : 50000u);
    if (o->on_evict && o->force_evict)
      FERRY_INFO("store master: an eviction round queues at most %.0f offloads "
                 "(--offload_cap_ratio=%g); past that, or with the queue full, it evicts "
                 "without a copy (--offload_force_evict)",
                 (double)(o->queue_limit ? o->queue_limit : 50000u) * o->cap_ratio, o->cap_ratio);
    else if (o->force_evict)
      FERRY_INFO("store master: --offload_force_evict changes nothing without "
                 "--offload_on_evict (as Mooncake's)");
    if (o->promotion_on_hit)
      FERRY_INFO("store master: a key on disk only stays in memory from its get number %u "
                 "that loads it back (--promotion_on_hit, --promotion_admission_threshold)",
                 o->promotion_at);
    else
      FERRY_INFO("store master: a get of a key on disk only loads it into its owner's segment "
                 "for that get's lease, then it is on disk only again (--promotion_on_hit=false)");
  }
  if (!st)
    st = ferry_net_listen(host, cfg->port, &m->listen_fd, &m->port);
  pthread_mutex_init(&m->lock, NULL);
  if (!st && pthread_create(&m->listener, NULL, listener_main, m) != 0)
    st = ferry_fail(FERRY_ENOMEM, "store master: cannot start its thread");
  if (st) {
    if (m->listen_fd >= 0)
      close(m->listen_fd);
    m->listen_fd = -1;
    store_master_stop(m);
    return st;
  }
  *out = m;
  return FERRY_OK;
}

uint16_t store_master_port(const store_master *m) { return m->port; }

store_map *store_master_map(store_master *m) { return m->map; }

void store_master_stats(store_master *m, store_map_stats *out) {
  store_map_stats_get(m->map, out);
  out->serving = (uint64_t)serving(m);
  pthread_mutex_lock(&m->lock);
  for (client *c = m->clients; c; c = c->next)
    out->clients += !__atomic_load_n(&c->finished, __ATOMIC_ACQUIRE);
  pthread_mutex_unlock(&m->lock);
}

void store_master_serve_until(store_master *m, uint64_t until_ns) {
  __atomic_store_n(&m->serve_until_ns, until_ns, __ATOMIC_RELEASE);
}

void store_master_stop(store_master *m) {
  if (!m)
    return;
  if (m->listen_fd >= 0) {
    ssize_t woken = write(m->wake[1], "x", 1); /* an empty pipe of ours takes it */
    (void)woken;
    pthread_join(m->listener, NULL);
    close(m->listen_fd);
  }
  pthread_mutex_lock(&m->lock);
  for (client *c = m->clients; c; c = c->next)
    shutdown(c->fd, SHUT_RDWR);
  pthread_mutex_unlock(&m->lock);
  if (m->map)
    store_map_stop_waits(m->map); /* offload's polls and gets waiting for a load */
  for (client *c = m->clients, *next; c; c = next) {
    next = c->next;
    pthread_join(c->thread, NULL);
    close(c->fd);
    free(c);
  }
  if (m->wake[0] >= 0) {
    close(m->wake[0]);
    close(m->wake[1]);
  }
  if (m->map)
    store_map_destroy(m->map);
  pthread_mutex_destroy(&m->lock);
  free(m->secret);
  free(m);
}
