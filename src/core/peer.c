/* peer.c - the initiator's view of each target: lazy handshake, region
 * table cache, transport choice, the pool of data channels and the control
 * connection (region tables, notifications, pings).
 *
 * Recovery rule: a connection that fails is closed and never reused; the
 * failure also retires the peer's other pooled channels, and an idle one
 * that the peer closed is noticed before use. So the call after a peer
 * restart connects afresh instead of failing on a stale socket.
 *
 * Rails: a peer keeps every transport that can reach it, each with its
 * rails (several NICs, or its one), in order of preference. Checkouts take
 * turns over the rails of the best transport with a rail in use; the
 * others stand by (rail_choice.h). A failure retires only its rail's
 * channels, and a rail whose link failed is out of use for
 * FERRY_RAIL_BACKOFF_NS while the others, of the same transport or else of
 * the next one, carry its work (batch.c moves its lost chunks again). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "batch.h"
#include "core/transport.h"
#include "memory/region_cache.h"
#include "peer.h"

/* ---- finding peers ------------------------------------------------------------ */

static ferry_peer *peer_new(ferry_engine *e, const char *target) {
  ferry_peer *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->engine = e;
  p->control_fd = -1;
  snprintf(p->target, sizeof p->target, "%s", target);
  snprintf(p->address, sizeof p->address, "%s", target);
  pthread_mutex_init(&p->lock, NULL);
  pthread_mutex_init(&p->control_lock, NULL);
  ferry_cond_init(&p->cond);
  return p;
}

static ferry_status check_target_name(ferry_engine *e, const char *target) {
  if (!target || !*target || strlen(target) >= sizeof((ferry_peer *)0)->target)
    return ferry_fail(FERRY_EINVAL, "target name is empty or too long");
  if (e->metadata)
    return FERRY_OK; /* any segment name: the service resolves it */
  char host[FERRY_HOST_MAX];
  uint16_t port;
  ferry_status st = ferry_net_parse_target(target, host, &port);
  if (st) {
    char detail[FERRY_ERROR_MAX];
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
    return ferry_fail(st, "%s, and no metadata service is configured to look it up as a name",
                      detail);
  }
  return FERRY_OK;
}

static ferry_peer *find_peer(ferry_engine *e, const char *target) {
  ferry_peer *p = e->peers;
  while (p && strcmp(p->target, target) != 0)
    p = p->next;
  return p;
}

ferry_status ferry_peer_get(ferry_engine *e, const char *target, ferry_peer **out) {
  pthread_mutex_lock(&e->peers_lock);
  ferry_peer *p = target ? find_peer(e, target) : NULL;
  pthread_mutex_unlock(&e->peers_lock);
  if (p) { /* known targets were checked when first seen */
    *out = p;
    return FERRY_OK;
  }
  ferry_status st = check_target_name(e, target);
  if (st)
    return st;
  pthread_mutex_lock(&e->peers_lock);
  if ((p = find_peer(e, target)) == NULL && (p = peer_new(e, target)) != NULL) {
    p->next = e->peers;
    e->peers = p;
  }
  pthread_mutex_unlock(&e->peers_lock);
  if (!p)
    return ferry_fail(FERRY_ENOMEM, "no memory for peer %s", target);
  *out = p;
  return FERRY_OK;
}

/* Where the target listens: its own name, or what the metadata service says
 * (looked up at every connect, since a restarted peer may move). */
static ferry_status resolve_address(ferry_peer *p, char host[FERRY_HOST_MAX], uint16_t *port) {
  ferry_status st;
  if (p->engine->metadata) {
    st = ferry_segment_lookup(p->engine->metadata, p->target, host, FERRY_HOST_MAX, port);
    if (st != FERRY_ENOTFOUND)
      return st;
    if (ferry_net_parse_target(p->target, host, port) != FERRY_OK) {
      char store[256]; /* never a password in a message */
      ferry_metadata_redact(p->engine->cfg.metadata_url, store, sizeof store);
      return ferry_fail(FERRY_ENOTFOUND, "segment \"%s\" is not in the metadata service %s",
                        p->target, store);
    }
    return FERRY_OK;
  }
  return ferry_net_parse_target(p->target, host, port);
}

/* ---- handshake --------------------------------------------------------------- */

/* The HELLO and HELLO_REPLY bodies as sent: the transcript the proofs and
 * the session keys are bound to. */
typedef struct handshake_bytes {
  uint8_t hello[FERRY_WIRE_HELLO_MAX];
  uint8_t reply[FERRY_WIRE_HELLO_REPLY_MAX];
  size_t hello_len, reply_len;
  uint8_t nonce[FERRY_WIRE_NONCE_SIZE]; /* the HELLO's: the connection's id */
} handshake_bytes;

static ferry_status send_hello(ferry_peer *p, ferry_sock *s, ferry_conn_kind kind,
                               handshake_bytes *hb) {
  ferry_hello hello;
  memset(&hello, 0, sizeof hello);
  hello.version_min = FERRY_WIRE_VERSION_MIN;
  hello.version_max = FERRY_WIRE_VERSION_MAX;
  hello.conn_kind = (uint8_t)kind;
  hello.engine_id = p->engine->instance_id;
  ferry_auth_nonce(hello.nonce);
  memcpy(hb->nonce, hello.nonce, sizeof hb->nonce);
  snprintf(hello.name, sizeof hello.name, "%.*s", FERRY_WIRE_MAX_NAME, p->engine->name);
  ferry_frame_header h = {.type = FERRY_FRAME_HELLO};
  h.body_len = hb->hello_len = ferry_wire_hello_encode(hb->hello, &hello);
  return ferry_sock_send_frame(s, &h, hb->hello, "send HELLO");
}

static ferry_status receive_hello_reply(ferry_sock *s, handshake_bytes *hb,
                                        ferry_hello_reply *reply) {
  ferry_frame_header h;
  ferry_status st = ferry_sock_recv_header(s, &h, "handshake");
  if (st)
    return st;
  if (h.type != FERRY_FRAME_HELLO_REPLY)
    return ferry_fail(FERRY_EHANDSHAKE, "handshake with %s: answered with frame type %u", s->peer,
                      h.type);
  if (h.status)
    return ferry_sock_read_refusal(s, &h, "handshake");
  hb->reply_len = (size_t)h.body_len;
  st = ferry_sock_recv(s, hb->reply, hb->reply_len, "handshake");
  if (!st)
    st = ferry_wire_hello_reply_decode(hb->reply, hb->reply_len, reply);
  if (st)
    return ferry_fail(FERRY_EHANDSHAKE, "handshake with %s: %s", s->peer, ferry_last_error());
  if (reply->version < FERRY_WIRE_VERSION_MIN || reply->version > FERRY_WIRE_VERSION_MAX)
    return ferry_fail(FERRY_EVERSION,
                      "incompatible protocol: peer %s chose version %u (it speaks %u..%u), this "
                      "engine speaks %u..%u",
                      s->peer, reply->version, reply->version_min, reply->version_max,
                      FERRY_WIRE_VERSION_MIN, FERRY_WIRE_VERSION_MAX);
  return FERRY_OK;
}

/* AUTH with our proof over the transcript; AUTH_REPLY brings the target's,
 * over the transcript and its facts, which only then go into reply. */
static ferry_status prove_secret(ferry_peer *p, ferry_sock *s, const handshake_bytes *hb,
                                 ferry_hello_reply *reply, ferry_session *session) {
  const char *secret = p->engine->secret;
  if (!secret)
    return ferry_fail(FERRY_EAUTH, "peer %s requires a shared secret and none is configured",
                      s->peer);
  uint8_t th[FERRY_WIRE_PROOF_SIZE];
  ferry_auth_transcript(hb->hello, hb->hello_len, hb->reply, hb->reply_len, th);
  return ferry_auth_prove(s, secret, th, "peer", reply, session);
}

static void unlink_channel(ferry_peer *p, struct ferry_channel *ch);

/* Drops what was derived from the target's previous incarnation: its table,
 * the transport chosen for it (the new one may offer others) and its
 * channels, closed by their transport now if idle, at checkin if busy. */
/* Drops the cached region table and its keys (lock held). */
static void forget_regions_locked(ferry_peer *p) { ferry_region_table_free(&p->table); }

static void retire_instance_locked(ferry_peer *p) {
  forget_regions_locked(p);
  p->transport = NULL;
  __atomic_store_n(&p->rail_count, 0, __ATOMIC_RELAXED); /* the new incarnation lists its own */
  p->generation++;
  p->replied_ns = 0;
  while (p->idle) {
    ferry_channel *ch = p->idle;
    p->idle = ch->next_idle;
    unlink_channel(p, ch);
    ch->transport->channel_close(ch);
  }
}

/* Records the target's facts; a new instance id means it restarted. */
static void note_instance(ferry_peer *p, const ferry_hello_reply *reply) {
  pthread_mutex_lock(&p->lock);
  if (p->known && p->info.engine_id != reply->engine_id) {
    FERRY_INFO("peer %s restarted (new instance); dropping its cached state", p->address);
    retire_instance_locked(p);
  }
  p->info = *reply;
  p->known = 1;
  pthread_mutex_unlock(&p->lock);
}

/* Lists a handshake's socket for shutdown to wake; 0 (and not listed) when
 * the engine is already closing. Checked under the lock shutdown takes, so
 * a socket is either listed before its pass or refused. */
static int handshake_begin(ferry_peer *p, ferry_handshake *h) {
  pthread_mutex_lock(&p->lock);
  int open = !ferry_engine_closing(p->engine);
  if (open) {
    h->next = p->handshakes;
    p->handshakes = h;
  }
  pthread_mutex_unlock(&p->lock);
  return open;
}

static void handshake_end(ferry_peer *p, ferry_handshake *h) {
  pthread_mutex_lock(&p->lock);
  ferry_handshake **pp = &p->handshakes;
  while (*pp != h)
    pp = &(*pp)->next;
  *pp = h->next;
  pthread_mutex_unlock(&p->lock);
}

static ferry_status closed_error(ferry_peer *p, const char *step) {
  return ferry_fail(FERRY_ECLOSED, "%s with %s abandoned: the engine is shutting down", step,
                    p->address);
}

ferry_status ferry_peer_connect(ferry_peer *p, ferry_conn_kind kind, uint64_t deadline_ns, int *fd,
                                ferry_hello_reply *reply, ferry_session *session) {
  return ferry_peer_connect_at(p, NULL, kind, deadline_ns, fd, reply, session);
}

ferry_status ferry_peer_connect_at(ferry_peer *p, const char *rail, ferry_conn_kind kind,
                                   uint64_t deadline_ns, int *fd, ferry_hello_reply *reply,
                                   ferry_session *session) {
  char host[FERRY_HOST_MAX];
  uint16_t port;
  ferry_status st =
      rail ? ferry_net_parse_target(rail, host, &port) : resolve_address(p, host, &port);
  if (st)
    return st;
  uint64_t connect_deadline =
      ferry_now_ns() + (uint64_t)p->engine->cfg.connect_timeout_ms * 1000000ull;
  if (connect_deadline > deadline_ns)
    connect_deadline = deadline_ns;
  st = ferry_net_connect(host, port, connect_deadline, fd);
  if (st)
    return st;
  ferry_handshake pending = {*fd, NULL};
  if (!handshake_begin(p, &pending)) {
    close(*fd);
    *fd = -1;
    return closed_error(p, "handshake");
  }
  ferry_sock s;
  handshake_bytes hb;
  memset(session, 0, sizeof *session);
  ferry_sock_init(&s, *fd, p->address);
  ferry_sock_set_deadline(&s, connect_deadline);
  st = send_hello(p, &s, kind, &hb);
  if (!st)
    st = receive_hello_reply(&s, &hb, reply);
  if (!st && reply->auth_required)
    st = prove_secret(p, &s, &hb, reply, session);
  else if (!st && p->engine->secret)
    st = ferry_fail(FERRY_EAUTH,
                    "peer %s does not ask for the shared secret; refusing an "
                    "unauthenticated target",
                    p->address);
  handshake_end(p, &pending);
  if (st) {
    close(*fd);
    *fd = -1;
    return st;
  }
  memcpy(session->id, hb.nonce, sizeof session->id);
  note_instance(p, reply);
  return FERRY_OK;
}

/* ---- control requests --------------------------------------------------------- */

typedef ferry_status (*reply_reader)(ferry_peer *p, ferry_sock *s, const ferry_frame_header *h,
                                     void *ctx);

/* Both with the control lock held. */
static void control_close(ferry_peer *p) {
  pthread_mutex_lock(&p->lock);
  if (p->control_fd >= 0)
    close(p->control_fd);
  p->control_fd = -1;
  pthread_mutex_unlock(&p->lock);
}

static ferry_status control_adopt(ferry_peer *p, int fd, uint64_t instance) {
  pthread_mutex_lock(&p->lock);
  int open = !ferry_engine_closing(p->engine);
  if (open) {
    p->control_fd = fd;
    p->control_instance = instance;
  }
  pthread_mutex_unlock(&p->lock);
  if (open)
    return FERRY_OK;
  close(fd);
  return closed_error(p, "control request");
}

static ferry_status control_once(ferry_peer *p, const ferry_frame_header *req, const void *body,
                                 uint8_t reply_type, reply_reader read, void *ctx,
                                 uint64_t deadline_ns, int *reused) {
  *reused = p->control_fd >= 0;
  if (p->control_fd >= 0 && !ferry_net_idle_alive(p->control_fd)) {
    control_close(p);
    p->control_hangup = 1;
    *reused = 0;
  }
  if (p->control_fd < 0) {
    ferry_hello_reply reply;
    int fd;
    ferry_status st =
        ferry_peer_connect(p, FERRY_CONN_CONTROL, deadline_ns, &fd, &reply, &p->control_session);
    if (!st)
      st = control_adopt(p, fd, reply.engine_id);
    if (st)
      return st;
    p->control_hangup = 0;
    ferry_stats_control_opened(p);
  }
  ferry_sock s;
  ferry_sock_init(&s, p->control_fd, p->address);
  ferry_sock_auth(&s, &p->control_session);
  ferry_sock_set_deadline(&s, deadline_ns);
  ferry_frame_header h;
  ferry_status st = ferry_sock_send_frame(&s, req, body, "send request");
  if (!st)
    st = ferry_sock_recv_header(&s, &h, "receive reply");
  if (!st && h.type != reply_type)
    st = ferry_fail(FERRY_EPROTO, "reply from %s has frame type %u, expected %u", p->address,
                    h.type, reply_type);
  if (!st)
    st = h.status ? ferry_sock_read_refusal(&s, &h, "request") : read(p, &s, &h, ctx);
  if (st == FERRY_ESOCKET || st == FERRY_ETIMEDOUT || st == FERRY_EPROTO)
    control_close(p);
  if (st == FERRY_ESOCKET) /* closed or reset by the target, not timed out here */
    p->control_hangup = 1;
  p->control_used_ns = ferry_now_ns();
  return st;
}

/* One request on the control connection. A cached connection that turns out
 * dead is replaced once: the peer may have restarted since it was opened. */
static ferry_status control_call(ferry_peer *p, const ferry_frame_header *req, const void *body,
                                 uint8_t reply_type, reply_reader read, void *ctx,
                                 uint64_t deadline_ns) {
  pthread_mutex_lock(&p->control_lock);
  int reused;
  ferry_status st = control_once(p, req, body, reply_type, read, ctx, deadline_ns, &reused);
  if (st == FERRY_ESOCKET && reused)
    st = control_once(p, req, body, reply_type, read, ctx, deadline_ns, &reused);
  pthread_mutex_unlock(&p->control_lock);
  return st;
}

static ferry_status read_nothing(ferry_peer *p, ferry_sock *s, const ferry_frame_header *h,
                                 void *ctx) {
  return FERRY_OK;
}

/* What a REGIONS_REQ asked for: the reply is merged over these spans. */
typedef struct region_ask {
  const ferry_region *spans;
  size_t count; /* 0: the whole table */
} region_ask;

static ferry_status read_regions(ferry_peer *p, ferry_sock *s, const ferry_frame_header *h,
                                 void *ctx) {
  const region_ask *ask = ctx;
  uint8_t *body = malloc(h->body_len ? h->body_len : 1);
  if (!body)
    return ferry_fail(FERRY_ENOMEM, "no memory for the region table of %s", p->address);
  ferry_region_table table;
  ferry_status st = ferry_sock_recv(s, body, h->body_len, "receive region table");
  if (!st)
    st = ferry_wire_regions_decode(body, h->body_len, h->count, &table);
  free(body);
  if (st)
    return st;
  pthread_mutex_lock(&p->lock);
  st = ferry_region_cache_merge(&p->table, &table, ask->spans, ask->count);
  pthread_mutex_unlock(&p->lock);
  ferry_region_table_free(&table);
  return st;
}

/* Asks for the regions overlapping spans (none: the whole table). */
static ferry_status refresh_regions(ferry_peer *p, const ferry_region *spans, size_t count,
                                    uint64_t deadline_ns) {
  region_ask ask = {spans, count};
  size_t len = count * FERRY_WIRE_SEGMENT_SIZE;
  uint8_t *body = malloc(len ? len : 1);
  if (!body)
    return ferry_fail(FERRY_ENOMEM, "no memory for a REGIONS_REQ of %zu ranges", count);
  ferry_wire_ranges_encode(body, spans, (uint32_t)count);
  ferry_frame_header req = {
      .type = FERRY_FRAME_REGIONS_REQ, .count = (uint32_t)count, .body_len = len};
  ferry_status st =
      control_call(p, &req, body, FERRY_FRAME_REGIONS_REPLY, read_regions, &ask, deadline_ns);
  free(body);
  return st;
}

/* Fetches the regions holding the entries' remote ranges that the cache
 * lacks; *asked is 0 when it had them all (nothing was sent). */
static ferry_status fetch_missing(ferry_peer *p, const ferry_entry *entries, size_t count,
                                  uint64_t deadline_ns, int *asked) {
  ferry_region *spans;
  size_t n;
  pthread_mutex_lock(&p->lock);
  ferry_status st = ferry_region_cache_misses(&p->table, entries, count, &spans, &n);
  pthread_mutex_unlock(&p->lock);
  *asked = n > 0;
  if (!st && n > 0)
    st = refresh_regions(p, spans, n, deadline_ns);
  free(spans);
  return st;
}

ferry_status ferry_peer_refresh_regions(ferry_peer *p, const ferry_region *spans, size_t count,
                                        uint64_t deadline_ns) {
  return refresh_regions(p, spans, count, deadline_ns);
}

ferry_status ferry_peer_ping(ferry_peer *p, uint64_t deadline_ns) {
  ferry_frame_header req = {.type = FERRY_FRAME_PING};
  return control_call(p, &req, NULL, FERRY_FRAME_PONG, read_nothing, NULL, deadline_ns);
}

ferry_status ferry_peer_notify(ferry_peer *p, const char *name, const void *data, size_t len,
                               uint64_t deadline_ns) {
  size_t name_len = name ? strlen(name) : 0;
  if (!name_len || name_len > FERRY_WIRE_MAX_NAME || len > FERRY_WIRE_MAX_NOTIFY_DATA)
    return ferry_fail(FERRY_EINVAL, "notification name must be 1..%d bytes and data at most %u",
                      FERRY_WIRE_MAX_NAME, FERRY_WIRE_MAX_NOTIFY_DATA);
  size_t size = ferry_wire_notify_size(name_len, len);
  uint8_t *body = malloc(size);
  if (!body)
    return ferry_fail(FERRY_ENOMEM, "no memory for a notification");
  ferry_wire_notify_encode(body, name, data, len);
  ferry_frame_header req = {.type = FERRY_FRAME_NOTIFY, .body_len = size};
  ferry_status st =
      control_call(p, &req, body, FERRY_FRAME_NOTIFY_ACK, read_nothing, NULL, deadline_ns);
  free(body);
  return st;
}

ferry_status ferry_peer_cut(ferry_peer *p, const uint8_t id[FERRY_WIRE_NONCE_SIZE],
                            uint64_t deadline_ns) {
  ferry_frame_header req = {.type = FERRY_FRAME_CUT, .body_len = FERRY_WIRE_NONCE_SIZE};
  return control_call(p, &req, id, FERRY_FRAME_CUT_REPLY, read_nothing, NULL, deadline_ns);
}

static ferry_status read_grant(ferry_peer *p, ferry_sock *s, const ferry_frame_header *h,
                               void *ctx) {
  return ferry_sock_recv(s, ctx, FERRY_WIRE_POOL_REPLY_SIZE, "receive POOL_REPLY");
}

ferry_status ferry_peer_pool(ferry_peer *p, const void *body, size_t len,
                             uint8_t reply[FERRY_WIRE_POOL_REPLY_SIZE], uint64_t deadline_ns) {
  ferry_frame_header req = {.type = FERRY_FRAME_POOL, .body_len = len};
  return control_call(p, &req, body, FERRY_FRAME_POOL_REPLY, read_grant, reply, deadline_ns);
}

/* ---- transport choice and region checks -------------------------------------------- */

/* Every transport both sides offer that can reach the peer, best first
 * (at most FERRY_RAILS_MAX), logging once which it has and why the others
 * could not. Runs without the peer lock: a transport's check may talk to
 * the peer. */
static ferry_status choose_transports(ferry_peer *p, const ferry_hello_reply *info,
                                      const ferry_transport **chosen, unsigned *count) {
  char used_names[128] = "", reasons[512] = "";
  size_t used = 0, why_used = 0;
  *count = 0;
  for (size_t i = 0; ferry_transports[i]; i++) {
    const ferry_transport *t = ferry_transports[i];
    char why[160] = "";
    if (!(p->engine->transports & t->id))
      snprintf(why, sizeof why, "not enabled here");
    else if (!(info->transports & t->id))
      snprintf(why, sizeof why, "not offered by the peer");
    else if (*count < FERRY_RAILS_MAX && t->usable(p->engine, info, why, sizeof why)) {
      chosen[(*count)++] = t;
      used += (size_t)snprintf(used_names + used, sizeof used_names - used, "%s%s",
                               used ? (*count == 2 ? "; standby " : ", ") : "", t->name);
      used = used < sizeof used_names ? used : sizeof used_names - 1;
      continue;
    }
    why_used += (size_t)snprintf(reasons + why_used, sizeof reasons - why_used, "%s%s: %s",
                                 why_used ? ", " : "", t->name, why);
    why_used = why_used < sizeof reasons ? why_used : sizeof reasons - 1;
  }
  if (!*count)
    return ferry_fail(FERRY_ETRANSPORT, "no transport usable with %s (%s)", p->address, reasons);
  FERRY_INFO("peer %s: using %s%s%s", p->address, used_names, why_used ? "; " : "", reasons);
  return FERRY_OK;
}

/* Appends transport t's rails toward this incarnation (its one rail when
 * it lists none), all up; a rail listed under the same name as before
 * keeps its counters. Labels name the transport when several serve. */
static unsigned add_rails_locked(ferry_peer *p, const ferry_transport *t, unsigned at,
                                 int several) {
  char names[FERRY_RAILS_MAX][FERRY_RAIL_NAME_MAX];
  unsigned n = t->rails && t->rail_open ? t->rails(&p->info, names, FERRY_RAILS_MAX - at) : 0;
  if (!n)
    names[n++][0] = 0;
  for (unsigned i = 0; i < n; i++) {
    ferry_peer_rail *r = &p->rails[at + i];
    if (r->transport != t || strcmp(r->name, names[i]) != 0) {
      memset(r, 0, sizeof *r);
      r->transport = t;
      memcpy(r->name, names[i], sizeof r->name); /* NUL-terminated within it */
    }
    char label[sizeof r->label]; /* apart from *p: gcc sees name and label as one object */
    if (!*r->name)
      snprintf(label, sizeof label, "%s", t->name);
    else
      snprintf(label, sizeof label, "%s%s%s", several ? t->name : "", several ? " " : "", r->name);
    memcpy(r->label, label, sizeof label);
    r->generation++;
    r->down_until_ns = 0;
  }
  return n;
}

/* The rails of every usable transport, best first. */
static void adopt_rails_locked(ferry_peer *p, const ferry_transport **chosen, unsigned count) {
  unsigned n = 0;
  for (unsigned i = 0; i < count && n < FERRY_RAILS_MAX; i++)
    n += add_rails_locked(p, chosen[i], n, count > 1);
  __atomic_store_n(&p->rail_count, n, __ATOMIC_RELAXED); /* rail_moved reads it unlocked */
  char list[256] = "";
  for (unsigned r = 0, used = 0; n > 1 && r < n && used < sizeof list; r++)
    used += (unsigned)snprintf(list + used, sizeof list - used, "%s%s", r ? ", " : "",
                               p->rails[r].label);
  if (n > 1)
    FERRY_INFO("peer %s: %u rails (%s)", p->address, n, list);
}

/* A control connection the target closed means it may have restarted, and a
 * restarted target can register the very same addresses: then the cached
 * table still matches and only a new handshake reveals the new instance. A
 * connection busy with another request is alive. */
static int control_lost(ferry_peer *p) {
  if (pthread_mutex_trylock(&p->control_lock) != 0)
    return 0;
  int lost = p->control_fd < 0 || !ferry_net_idle_alive(p->control_fd);
  pthread_mutex_unlock(&p->control_lock);
  return lost;
}

int ferry_peer_control_hangup(ferry_peer *p) {
  if (pthread_mutex_trylock(&p->control_lock) != 0)
    return 0;
  int hung = p->control_fd >= 0 ? !ferry_net_idle_alive(p->control_fd) : p->control_hangup;
  pthread_mutex_unlock(&p->control_lock);
  return hung;
}

ferry_status ferry_peer_ensure_for(ferry_peer *p, const ferry_entry *entries, size_t count,
                                   uint64_t deadline_ns, const ferry_transport **transport,
                                   uint64_t *instance) {
  pthread_mutex_lock(&p->lock);
  int ready = p->known && p->transport;
  int proven = ferry_now_ns() - p->replied_ns < FERRY_PEER_TRUST_NS;
  *transport = p->transport;
  *instance = p->info.engine_id;
  pthread_mutex_unlock(&p->lock);
  if (ready && (proven || !control_lost(p)))
    return FERRY_OK;
  /* The first exchange doubles as the handshake: the regions the batch
   * needs if the cache lacks any, else a ping. */
  int asked;
  ferry_status st = fetch_missing(p, entries, count, deadline_ns, &asked);
  if (!st && !asked)
    st = ferry_peer_ping(p, deadline_ns);
  if (st)
    return st;
  pthread_mutex_lock(&p->lock);
  const ferry_transport *chosen[FERRY_RAILS_MAX] = {p->transport};
  unsigned usable = 1;
  ferry_hello_reply info = p->info;
  pthread_mutex_unlock(&p->lock);
  if (!chosen[0] && (st = choose_transports(p, &info, chosen, &usable)) != FERRY_OK)
    return st;
  pthread_mutex_lock(&p->lock);
  /* Keep one choice per incarnation: a racing thread may have chosen first,
   * or the target restarted meanwhile (then this batch fails at checkout). */
  if (!p->transport && p->info.engine_id == info.engine_id) {
    p->transport = chosen[0];
    adopt_rails_locked(p, chosen, usable);
  }
  pthread_mutex_unlock(&p->lock);
  *transport = chosen[0];
  *instance = info.engine_id;
  return FERRY_OK;
}

ferry_status ferry_peer_ensure(ferry_peer *p, uint64_t deadline_ns,
                               const ferry_transport **transport, uint64_t *instance) {
  return ferry_peer_ensure_for(p, NULL, 0, deadline_ns, transport, instance);
}

/* The first entry whose remote range no cached region holds, or -1; with
 * bases, each entry's region start goes there. */
static long first_unknown_remote(ferry_peer *p, const ferry_entry *entries, size_t count,
                                 uint64_t *bases) {
  long bad = -1;
  pthread_mutex_lock(&p->lock);
  for (size_t i = 0; i < count && bad < 0; i++) {
    long at = ferry_regions_search(p->table.regions, p->table.count, entries[i].remote,
                                   entries[i].length);
    if (at < 0)
      bad = (long)i;
    else if (bases)
      bases[i] = p->table.regions[at].addr;
  }
  pthread_mutex_unlock(&p->lock);
  return bad;
}

ferry_status ferry_peer_locate_remote(ferry_peer *p, const ferry_entry *entries, size_t count,
                                      uint64_t deadline_ns, uint64_t *bases, const char *what) {
  long bad = first_unknown_remote(p, entries, count, bases);
  if (bad < 0)
    return FERRY_OK;
  /* The target may have registered them since we fetched: ask once. */
  int asked;
  ferry_status st = fetch_missing(p, entries, count, deadline_ns, &asked);
  if (st)
    return st;
  bad = first_unknown_remote(p, entries, count, bases);
  if (bad < 0)
    return FERRY_OK;
  return ferry_fail(
      FERRY_ENOTREG, "remote address 0x%llx (+%zu bytes) of %s %ld is not registered at %s",
      (unsigned long long)entries[bad].remote, entries[bad].length, what, bad, p->address);
}

ferry_status ferry_peer_check_remote(ferry_peer *p, const ferry_entry *entries, size_t count,
                                     uint64_t deadline_ns) {
  return ferry_peer_locate_remote(p, entries, count, deadline_ns, NULL, "entry");
}

size_t ferry_peer_region_key(ferry_peer *p, unsigned transport, uint64_t addr, uint64_t length,
                             uint8_t *out, size_t size, uint64_t *base) {
  size_t len = 0;
  pthread_mutex_lock(&p->lock);
  long i = ferry_regions_search(p->table.regions, p->table.count, addr, length);
  for (unsigned k = 0; i >= 0 && k < p->table.key_sections; k++) {
    const ferry_region_keys *keys = &p->table.keys[k];
    if (keys->transport != transport || keys->size > size)
      continue;
    len = keys->size;
    memcpy(out, keys->data + (size_t)i * len, len);
    *base = p->table.regions[i].addr;
  }
  pthread_mutex_unlock(&p->lock);
  return len;
}

/* Whether the key bytes are all zeros: the target did not register that
 * region with the transport (transport.h, region_keys). */
static int zero_key(const uint8_t *key, size_t size) {
  for (size_t b = 0; b < size; b++)
    if (key[b])
      return 0;
  return 1;
}

long ferry_peer_unkeyed_remote(ferry_peer *p, unsigned transport, const ferry_entry *entries,
                               size_t count) {
  long found = -1;
  pthread_mutex_lock(&p->lock);
  const ferry_region_keys *keys = NULL;
  for (unsigned k = 0; k < p->table.key_sections; k++)
    if (p->table.keys[k].transport == transport)
      keys = &p->table.keys[k];
  for (size_t e = 0; keys && e < count && found < 0; e++) {
    long i = ferry_regions_search(p->table.regions, p->table.count, entries[e].remote,
                                  entries[e].length);
    if (i >= 0 && zero_key(keys->data + (size_t)i * keys->size, keys->size))
      found = (long)e;
  }
  pthread_mutex_unlock(&p->lock);
  return found;
}

/* ---- channel pool --------------------------------------------------------------------- */

static void unlink_channel(ferry_peer *p, ferry_channel *ch) {
  ferry_channel **pp = &p->all;
  while (*pp && *pp != ch)
    pp = &(*pp)->next_all;
  if (*pp)
    *pp = ch->next_all;
  p->open_channels--;
}

/* Not retired: same peer generation and, with rails, same rail generation. */
static int channel_current(const ferry_peer *p, const ferry_channel *ch) {
  return ch->generation == p->generation &&
         (p->rail_count < 2 || ch->rail_generation == p->rails[ch->rail].generation);
}

/* A rail a channel may use now: up, or down past its back-off (a retry). */
static int rail_usable(const ferry_peer *p, unsigned r, uint64_t now) {
  return ferry_rail_usable(&p->rails[r], now);
}

/* The transport that carries data now (the preferred one unless all its
 * rails are out of use); with the lock. */
static const ferry_transport *carrier_locked(const ferry_peer *p, unsigned excluded) {
  const ferry_transport *t =
      p->rail_count < 2 ? NULL
                        : ferry_rails_carrier(p->rails, p->rail_count, ferry_now_ns(), excluded);
  return t ? t : p->transport;
}

int ferry_transport_meets(const ferry_transport *t, unsigned needs) {
  return (!(needs & FERRY_NEEDS_POOL_WRITES) || t->pool_writes_bounded) &&
         (!(needs & FERRY_NEEDS_DEVICE_MEMORY) || t->carries_device_memory) &&
         (!(needs & FERRY_NEEDS_DIRECT_DEVICE) || t->carries_device_memory == FERRY_DEVICE_DIRECT) &&
         (!(needs & FERRY_NEEDS_UNKEYED) || !t->region_key_size);
}

/* The rails a batch with these needs (batch.h) may not use (rail_choice.h):
 * those of a transport that cannot do what it needs. */
static unsigned excluded_rails(const ferry_peer *p, unsigned needs) {
  unsigned excluded = 0;
  for (unsigned r = 0; needs && r < p->rail_count; r++)
    if (!ferry_transport_meets(p->rails[r].transport, needs))
      excluded |= 1u << r;
  return excluded;
}

int ferry_peer_transport_for(ferry_peer *p, unsigned needs, const ferry_transport **out) {
  pthread_mutex_lock(&p->lock);
  unsigned excluded = excluded_rails(p, needs);
  const ferry_transport *t =
      p->rail_count < 2 ? *out
                        : ferry_rails_carrier(p->rails, p->rail_count, ferry_now_ns(), excluded);
  for (unsigned r = 0; !t && r < p->rail_count; r++) /* all out of use: checkout tries them */
    t = excluded & 1u << r ? NULL : p->rails[r].transport;
  pthread_mutex_unlock(&p->lock);
  if (t && ferry_transport_meets(t, needs)) {
    *out = t;
    return 1;
  }
  return 0;
}

ferry_status ferry_peer_pool_transport(ferry_peer *p, const ferry_transport **out) {
  if (ferry_peer_transport_for(p, FERRY_NEEDS_POOL_WRITES, out))
    return FERRY_OK;
  return ferry_fail(FERRY_ETRANSPORT,
                    "send to a pool of %s: no transport between the two engines checks WRITEs "
                    "into a pool against the sender's grants (%s does not: its WRITEs are "
                    "one-sided); enable tcp or shm on both",
                    p->address, (*out)->name);
}

/* An idle channel on `rail` (-1: on any usable rail of the carrier, none
 * of those excluded); closes the retired and dead ones it meets. */
static ferry_channel *take_idle(ferry_peer *p, int rail, unsigned excluded) {
  uint64_t now = ferry_now_ns();
  const ferry_transport *carrier = carrier_locked(p, excluded);
  for (ferry_channel **pp = &p->idle; *pp;) {
    ferry_channel *ch = *pp;
    int wanted = p->rail_count < 2 ||
                 (rail >= 0 ? ch->rail == (unsigned)rail
                            : rail_usable(p, ch->rail, now) && !(excluded & 1u << ch->rail) &&
                                  ch->transport == carrier);
    if (channel_current(p, ch) && !wanted) {
      pp = &ch->next_idle;
      continue;
    }
    *pp = ch->next_idle;
    if (channel_current(p, ch) && ch->transport->channel_alive(ch))
      return ch;
    unlink_channel(p, ch);
    ch->transport->channel_close(ch);
  }
  return NULL;
}

/* The rail of the next checkout (rail_choice.h); -1 when every rail is
 * out of use. */
static int pick_rail_locked(ferry_peer *p, unsigned excluded) {
  if (p->rail_count < 2)
    return 0;
  return ferry_rails_pick(p->rails, p->rail_count, &p->next_rail, ferry_now_ns(), excluded);
}

/* Takes rail r out of use with the error detail as its cause. */
static void rail_down_locked(ferry_peer *p, unsigned r) {
  ferry_peer_rail *rail = &p->rails[r];
  int was_up = rail->down_until_ns == 0;
  rail->generation++;
  rail->down_until_ns = ferry_now_ns() + FERRY_RAIL_BACKOFF_NS;
  snprintf(rail->cause, sizeof rail->cause, "%s", ferry_last_error());
  __atomic_fetch_add(&rail->failures, 1, __ATOMIC_RELAXED);
  if (!was_up)
    return;
  unsigned up = 0;
  for (unsigned i = 0; i < p->rail_count; i++)
    up += p->rails[i].down_until_ns == 0;
  const ferry_transport *carrier = ferry_rails_carrier(p->rails, p->rail_count, ferry_now_ns(), 0);
  FERRY_WARN("peer %s: rail %u (%s) is down: %s; %u of %u rails left%s%s, it is tried again in "
             "%llu s",
             p->address, r, rail->label, rail->cause, up, p->rail_count,
             carrier && carrier != rail->transport ? ", data goes over " : "",
             carrier && carrier != rail->transport ? carrier->name : "",
             (unsigned long long)(FERRY_RAIL_BACKOFF_NS / 1000000000ull));
}

/* The error when every rail failed: each one's cause. */
static ferry_status rails_all_down(ferry_peer *p, ferry_status st) {
  char msg[FERRY_ERROR_MAX];
  size_t used = (size_t)snprintf(msg, sizeof msg, "every rail to %s failed:", p->address);
  for (unsigned r = 0; r < p->rail_count && used < sizeof msg; r++)
    used += (size_t)snprintf(msg + used, sizeof msg - used, "%s rail %u (%s): %s", r ? ";" : "", r,
                             p->rails[r].label, p->rails[r].cause);
  return ferry_fail(st ? st : FERRY_ESOCKET, "%s", msg);
}

static int link_failure(ferry_status st) { return st == FERRY_ESOCKET || st == FERRY_ETIMEDOUT; }

ferry_rails_left ferry_peer_rail_failed(ferry_peer *p, const ferry_batch *b, ferry_channel *ch) {
  pthread_mutex_lock(&p->lock);
  ferry_rails_left left = FERRY_RAILS_NONE;
  unsigned excluded = excluded_rails(p, b->needs);
  if (p->rail_count >= 2 && !ferry_engine_closing(p->engine)) {
    if (ch->rail_generation == p->rails[ch->rail].generation) /* first to see it */
      rail_down_locked(p, ch->rail);
    /* A batch left one rail (the others excluded) is as on a peer with one. */
    if (p->rail_count - (unsigned)__builtin_popcount(excluded) >= 2)
      left = ferry_rails_other_usable(p->rails, p->rail_count, ch->rail, ferry_now_ns(), excluded)
                 ? FERRY_RAILS_OTHER
                 : FERRY_RAILS_ALL_DOWN;
    if (left == FERRY_RAILS_ALL_DOWN)
      rails_all_down(p, FERRY_ESOCKET); /* the detail the batch fails with */
  }
  pthread_mutex_unlock(&p->lock);
  return left;
}

int ferry_peer_can_fail_over(ferry_peer *p, ferry_channel *ch) {
  if (__atomic_load_n(&p->rail_count, __ATOMIC_RELAXED) < 2)
    return 0; /* the common peer: no lock taken per drive */
  pthread_mutex_lock(&p->lock);
  int other = p->rail_count >= 2 && !ferry_engine_closing(p->engine) &&
              ferry_rails_other_usable(p->rails, p->rail_count, ch->rail, ferry_now_ns(), 0);
  pthread_mutex_unlock(&p->lock);
  return other;
}

void ferry_peer_rail_moved(ferry_peer *p, ferry_channel *ch, ferry_op op, uint64_t bytes) {
  unsigned n = __atomic_load_n(&p->rail_count, __ATOMIC_RELAXED);
  if (n >= 2 && ch->rail < n)
    __atomic_fetch_add(&p->rails[ch->rail].bytes[op == FERRY_OP_WRITE], bytes, __ATOMIC_RELAXED);
}

/* Channels open on rail r that are not retired. */
static unsigned channels_on(const ferry_peer *p, unsigned r) {
  unsigned n = 0;
  for (const ferry_channel *ch = p->all; ch; ch = ch->next_all)
    n += ch->rail == r && channel_current(p, ch);
  return n;
}

/* The pool is full and `rail` has no idle channel: closes an idle channel
 * of another transport (a standby that carried while rail's was out of
 * use), or, when rail has less than its share of the pool, one of a rail
 * of the same transport with more, so a rail that came back (or was never
 * used) gets its channels. */
static int make_room_locked(ferry_peer *p, unsigned rail) {
  if (p->rail_count < 2)
    return 0;
  const ferry_transport *t = p->rails[rail].transport;
  unsigned share = p->engine->cfg.tcp_connections / ferry_rails_of(p->rails, p->rail_count, t);
  share = share ? share : 1;
  int below = channels_on(p, rail) < share;
  for (ferry_channel **pp = &p->idle; *pp; pp = &(*pp)->next_idle) {
    ferry_channel *ch = *pp;
    if (ch->transport != t || (below && ch->rail != rail && channels_on(p, ch->rail) > share)) {
      *pp = ch->next_idle;
      unlink_channel(p, ch);
      ch->transport->channel_close(ch);
      return 1;
    }
  }
  return 0;
}

/* Opens a channel on rail r (with the lock, released meanwhile): with its
 * transport's rail_open when the transport listed it, else channel_open. */
static ferry_status open_on_rail(ferry_peer *p, ferry_batch *b, int r, ferry_channel **out) {
  int railed = p->rail_count >= 2;
  const ferry_transport *t = railed ? p->rails[r].transport : b->transport;
  char name[FERRY_RAIL_NAME_MAX] = "";
  if (railed)
    snprintf(name, sizeof name, "%s", p->rails[r].name);
  unsigned rail_generation = railed ? p->rails[r].generation : 0;
  p->open_channels++;
  pthread_mutex_unlock(&p->lock);
  ferry_channel *ch = NULL;
  ferry_status st =
      *name ? t->rail_open(p, name, b->deadline_ns, &ch) : t->channel_open(p, b->deadline_ns, &ch);
  pthread_mutex_lock(&p->lock);
  if (!st) {
    ch->rail = (unsigned)r;
    ch->rail_generation = rail_generation;
  }
  if (!st && ferry_engine_closing(p->engine)) {
    ch->transport->channel_close(ch); /* shutdown's pass may have missed it */
    st = closed_error(p, "transfer");
  }
  if (st) {
    p->open_channels--;
    pthread_cond_broadcast(&p->cond);
    return st;
  }
  ferry_stats_channel_opened(p, t);
  if (railed && p->rails[r].down_until_ns && rail_generation == p->rails[r].generation) {
    FERRY_INFO("peer %s: rail %u (%s) is up again", p->address, r, p->rails[r].label);
    p->rails[r].down_until_ns = 0;
  }
  ch->generation = p->generation;
  ch->next_all = p->all;
  p->all = ch;
  *out = ch;
  return FERRY_OK;
}

/* ---- idle connections ------------------------------------------------------------------ */

/* Connections unused past this engine's idle_timeout_ms are closed: a
 * target closes its end at its own idle limit, and an initiator keeping
 * its end would hold the socket half-closed until its next call to that
 * target, which may never come. Swept at most once a second (or once an
 * idle limit, if shorter) from any checkout, so an engine that makes no
 * calls never wakes for it. */
#define FERRY_PEER_SWEEP_NS (1000 * 1000000ull)

static void close_idle_channels_locked(ferry_peer *p, uint64_t before_ns) {
  for (ferry_channel **pp = &p->idle; *pp;) {
    ferry_channel *ch = *pp;
    if (ch->idle_since_ns >= before_ns) {
      pp = &ch->next_idle;
      continue;
    }
    *pp = ch->next_idle;
    unlink_channel(p, ch);
    ch->transport->channel_close(ch);
  }
}

/* A control connection busy with a request is in use, not idle. */
static void close_idle_control(ferry_peer *p, uint64_t before_ns) {
  if (pthread_mutex_trylock(&p->control_lock) != 0)
    return;
  if (p->control_fd >= 0 && p->control_used_ns < before_ns)
    control_close(p);
  pthread_mutex_unlock(&p->control_lock);
}

static void sweep_idle_connections(ferry_engine *e) {
  uint64_t now = ferry_now_ns(), last = __atomic_load_n(&e->peers_swept_ns, __ATOMIC_RELAXED);
  uint64_t limit_ns = (uint64_t)e->cfg.idle_timeout_ms * 1000000ull;
  uint64_t every_ns = limit_ns < FERRY_PEER_SWEEP_NS ? limit_ns : FERRY_PEER_SWEEP_NS;
  if (now - last < every_ns || now < limit_ns ||
      !__atomic_compare_exchange_n(&e->peers_swept_ns, &last, now, 0, __ATOMIC_RELAXED,
                                   __ATOMIC_RELAXED))
    return; /* recently swept, or another thread sweeps now */
  pthread_mutex_lock(&e->peers_lock);
  for (ferry_peer *p = e->peers; p; p = p->next) {
    pthread_mutex_lock(&p->lock);
    close_idle_channels_locked(p, now - limit_ns);
    pthread_mutex_unlock(&p->lock);
    close_idle_control(p, now - limit_ns);
  }
  pthread_mutex_unlock(&e->peers_lock);
}

/* With every rail out of use, the first one this checkout has not tried:
 * a call after an outage of every rail (or transport) tries them again at
 * once instead of failing until a back-off ends (promise 3: the next call
 * works). -1 when it tried them all (tried: those, and those the batch
 * may not use). */
static int untried_rail(const ferry_peer *p, unsigned tried) {
  for (unsigned r = 0; r < p->rail_count; r++)
    if (!(tried & 1u << r))
      return (int)r;
  return -1;
}

ferry_status ferry_peer_checkout(ferry_peer *p, ferry_batch *b, ferry_channel **out) {
  ferry_status st = FERRY_OK, lost = FERRY_OK; /* lost: why the last rail tried failed */
  unsigned tried = 0;                          /* rails this checkout failed to connect */
  sweep_idle_connections(p->engine);
  pthread_mutex_lock(&p->lock);
  for (;;) {
    if (ferry_engine_closing(p->engine)) {
      st = closed_error(p, "transfer");
      break;
    }
    if (p->info.engine_id != b->peer_instance) {
      /* Never let a batch checked against one incarnation land in another. */
      st = ferry_fail(FERRY_ESOCKET, "peer %s restarted during the batch", p->address);
      break;
    }
    if (!ferry_batch_has_work(b)) {
      st = FERRY_ENOTFOUND;
      break;
    }
    unsigned excluded = excluded_rails(p, b->needs);
    int rail = pick_rail_locked(p, excluded);
    if (rail < 0)
      rail = untried_rail(p, tried | excluded);
    if (rail < 0) {
      st = rails_all_down(p, lost);
      break;
    }
    if ((*out = take_idle(p, rail, excluded)) != NULL)
      break;
    if (p->open_channels < p->engine->cfg.tcp_connections || make_room_locked(p, (unsigned)rail)) {
      st = open_on_rail(p, b, rail, out);
      if (st && p->rail_count >= 2 && link_failure(st) && ferry_now_ns() < b->deadline_ns &&
          p->info.engine_id == b->peer_instance) {
        rail_down_locked(p, (unsigned)rail); /* try the next rail */
        tried |= 1u << rail;
        lost = st;
        st = FERRY_OK;
        continue;
      }
      break;
    }
    if ((*out = take_idle(p, -1, excluded)) != NULL)
      break;
    struct timespec until = ferry_timespec(b->deadline_ns);
    if (pthread_cond_timedwait(&p->cond, &p->lock, &until) == ETIMEDOUT) {
      st = ferry_fail(FERRY_ETIMEDOUT, "no free connection to %s before the batch deadline",
                      p->address);
      break;
    }
  }
  pthread_mutex_unlock(&p->lock);
  return st;
}

void ferry_peer_checkin(ferry_peer *p, ferry_channel *ch) {
  pthread_mutex_lock(&p->lock);
  if (ch->broken) {
    /* Its siblings may be just as dead (peer restart); with rails, those
     * of its rail (the others have links of their own). */
    if (p->rail_count >= 2)
      p->rails[ch->rail].generation += ch->rail_generation == p->rails[ch->rail].generation;
    else
      p->generation++;
    p->replied_ns = 0;
  } else if (ch->replied_ns > p->replied_ns) {
    p->replied_ns = ch->replied_ns;
  }
  if (ch->broken || !channel_current(p, ch) || ferry_engine_closing(p->engine)) {
    unlink_channel(p, ch);
    ch->transport->channel_close(ch);
  } else {
    ch->idle_since_ns = ferry_now_ns();
    ch->next_idle = p->idle;
    p->idle = ch;
  }
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
}

void ferry_peer_wake(ferry_peer *p) {
  pthread_mutex_lock(&p->lock);
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
}

void ferry_peers_shutdown(ferry_engine *e) {
  pthread_mutex_lock(&e->peers_lock);
  for (ferry_peer *p = e->peers; p; p = p->next) {
    pthread_mutex_lock(&p->lock);
    for (ferry_channel *ch = p->all; ch; ch = ch->next_all)
      ch->transport->channel_shutdown(ch);
    for (ferry_handshake *h = p->handshakes; h; h = h->next)
      shutdown(h->fd, SHUT_RDWR);
    if (p->control_fd >= 0)
      shutdown(p->control_fd, SHUT_RDWR);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
  }
  pthread_mutex_unlock(&e->peers_lock);
}

void ferry_peers_destroy(ferry_engine *e) {
  while (e->peers) {
    ferry_peer *p = e->peers;
    e->peers = p->next;
    while (p->all) {
      ferry_channel *ch = p->all;
      p->all = ch->next_all;
      ch->transport->channel_close(ch);
    }
    if (p->control_fd >= 0)
      close(p->control_fd);
    forget_regions_locked(p);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->control_lock);
    pthread_cond_destroy(&p->cond);
    free(p);
  }
}

/* ---- public peer calls --------------------------------------------------------------- */

static uint64_t connect_deadline(ferry_engine *e) {
  return ferry_now_ns() + (uint64_t)e->cfg.connect_timeout_ms * 1000000ull;
}

static ferry_status probe(ferry_engine *e, const char *target) {
  if (!e)
    return ferry_fail(FERRY_EINVAL, "probe: null engine");
  ferry_peer *p;
  ferry_status st = ferry_peer_get(e, target, &p);
  return st ? st : ferry_peer_ping(p, connect_deadline(e));
}

static ferry_status notify_send(ferry_engine *e, const char *target, const char *name,
                                const void *data, size_t length) {
  if (!e || (length && !data))
    return ferry_fail(FERRY_EINVAL, "notify: null engine or data");
  ferry_peer *p;
  ferry_status st = ferry_peer_get(e, target, &p);
  return st ? st : ferry_peer_notify(p, name, data, length, ferry_engine_deadline(e, length));
}

static ferry_status peer_regions(ferry_engine *e, const char *target, ferry_region **out,
                                 size_t *count) {
  if (!e || !out || !count)
    return ferry_fail(FERRY_EINVAL, "peer regions: null argument");
  ferry_peer *p;
  ferry_status st = ferry_peer_get(e, target, &p);
  if (!st)
    st = refresh_regions(p, NULL, 0, connect_deadline(e));
  if (st)
    return st;
  pthread_mutex_lock(&p->lock);
  *count = p->table.count;
  *out = malloc((p->table.count ? p->table.count : 1) * sizeof **out);
  if (*out && p->table.count)
    memcpy(*out, p->table.regions, p->table.count * sizeof **out);
  pthread_mutex_unlock(&p->lock);
  return *out ? FERRY_OK : ferry_fail(FERRY_ENOMEM, "no memory for a region table");
}

static ferry_status peer_transport(ferry_engine *e, const char *target, unsigned *transport) {
  if (!e || !transport)
    return ferry_fail(FERRY_EINVAL, "peer transport: null argument");
  ferry_peer *p;
  const ferry_transport *chosen;
  uint64_t instance;
  ferry_status st = ferry_peer_get(e, target, &p);
  if (!st)
    st = ferry_peer_ensure(p, connect_deadline(e), &chosen, &instance);
  if (!st) {
    pthread_mutex_lock(&p->lock);
    *transport = (p->transport ? carrier_locked(p, 0) : chosen)->id;
    pthread_mutex_unlock(&p->lock);
  }
  return st;
}

ferry_status ferry_probe(ferry_engine *e, const char *target) { FERRY_GATED(e, probe(e, target)); }

ferry_status ferry_notify_send(ferry_engine *e, const char *target, const char *name,
                               const void *data, size_t length) {
  FERRY_GATED(e, notify_send(e, target, name, data, length));
}

ferry_status ferry_peer_regions(ferry_engine *e, const char *target, ferry_region **out,
                                size_t *count) {
  FERRY_GATED(e, peer_regions(e, target, out, count));
}

ferry_status ferry_peer_transport(ferry_engine *e, const char *target, unsigned *transport) {
  FERRY_GATED(e, peer_transport(e, target, transport));
}
