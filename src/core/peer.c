/* peer.c - the initiator's view of each target: lazy handshake, region
 * table cache, transport choice, the pool of data channels and the control
 * connection (region tables, notifications, pings).
 *
 * Recovery rule: a connection that fails is closed and never reused; the
 * failure also retires the peer's other pooled channels, and an idle one
 * that the peer closed is noticed before use. So the call after a peer
 * restart connects afresh instead of failing on a stale socket. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "batch.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "peer.h"
#include "sync.h"
#include "transport/transport.h"

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
  uint8_t th[FERRY_WIRE_PROOF_SIZE], body[FERRY_WIRE_AUTH_REPLY_MAX];
  ferry_auth_transcript(hb->hello, hb->hello_len, hb->reply, hb->reply_len, th);
  ferry_auth_bound_proof(secret, FERRY_AUTH_INITIATOR, th, NULL, 0, body);
  ferry_frame_header h = {.type = FERRY_FRAME_AUTH, .body_len = FERRY_WIRE_PROOF_SIZE};
  ferry_status st = ferry_sock_send_frame(s, &h, body, "send AUTH");
  if (!st)
    st = ferry_sock_recv_header(s, &h, "authenticate");
  if (st)
    return st;
  if (h.type != FERRY_FRAME_AUTH_REPLY)
    return ferry_fail(FERRY_EHANDSHAKE, "authenticate with %s: answered with frame type %u",
                      s->peer, h.type);
  if (h.status)
    return ferry_sock_read_refusal(s, &h, "authenticate");
  size_t facts = (size_t)h.body_len - FERRY_WIRE_PROOF_SIZE; /* decode checked the range */
  st = ferry_sock_recv(s, body, (size_t)h.body_len, "authenticate");
  if (st)
    return st;
  if (!ferry_auth_bound_check(secret, FERRY_AUTH_TARGET, th, body + FERRY_WIRE_PROOF_SIZE, facts,
                              body))
    return ferry_fail(FERRY_EAUTH, "peer %s could not prove it knows the shared secret", s->peer);
  st = ferry_wire_facts_decode(body + FERRY_WIRE_PROOF_SIZE, facts, reply);
  if (st)
    return ferry_fail(FERRY_EHANDSHAKE, "authenticate with %s: %s", s->peer, ferry_last_error());
  ferry_session_start(session, secret, FERRY_AUTH_INITIATOR, th);
  return FERRY_OK;
}

static void unlink_channel(ferry_peer *p, struct ferry_channel *ch);

/* Drops what was derived from the target's previous incarnation: its table,
 * the transport chosen for it (the new one may offer others) and its
 * channels, closed by their transport now if idle, at checkin if busy. */
/* Drops the cached region table and its keys (lock held). */
static void forget_regions_locked(ferry_peer *p) {
  ferry_region_table old = {
      .regions = p->regions, .count = p->region_count, .key_sections = p->key_sections};
  memcpy(old.keys, p->keys, sizeof old.keys);
  ferry_region_table_free(&old);
  p->regions = NULL;
  p->region_count = 0;
  p->key_sections = 0;
}

static void retire_instance_locked(ferry_peer *p) {
  forget_regions_locked(p);
  p->transport = NULL;
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
  char host[FERRY_HOST_MAX];
  uint16_t port;
  ferry_status st = resolve_address(p, host, &port);
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

static ferry_status read_regions(ferry_peer *p, ferry_sock *s, const ferry_frame_header *h,
                                 void *ctx) {
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
  forget_regions_locked(p);
  p->regions = table.regions;
  p->region_count = table.count;
  p->key_sections = table.key_sections;
  memcpy(p->keys, table.keys, sizeof p->keys);
  pthread_mutex_unlock(&p->lock);
  return FERRY_OK;
}

static ferry_status refresh_regions(ferry_peer *p, uint64_t deadline_ns) {
  ferry_frame_header req = {.type = FERRY_FRAME_REGIONS_REQ};
  return control_call(p, &req, NULL, FERRY_FRAME_REGIONS_REPLY, read_regions, NULL, deadline_ns);
}

ferry_status ferry_peer_refresh_regions(ferry_peer *p, uint64_t deadline_ns) {
  return refresh_regions(p, deadline_ns);
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

/* Picks the first transport both sides offer that can reach the peer, and
 * logs why the better ones could not. Runs without the peer lock: a
 * transport's check may talk to the peer. */
static ferry_status choose_transport(ferry_peer *p, const ferry_hello_reply *info,
                                     const ferry_transport **chosen) {
  char reasons[512] = "";
  size_t used = 0;
  for (size_t i = 0; ferry_transports[i]; i++) {
    const ferry_transport *t = ferry_transports[i];
    char why[160] = "";
    if (!(p->engine->transports & t->id))
      snprintf(why, sizeof why, "not enabled here");
    else if (!(info->transports & t->id))
      snprintf(why, sizeof why, "not offered by the peer");
    else if (t->usable(p->engine, info, why, sizeof why)) {
      *chosen = t;
      FERRY_INFO("peer %s: using %s%s%s", p->address, t->name, used ? "; " : "", reasons);
      return FERRY_OK;
    }
    used += (size_t)snprintf(reasons + used, sizeof reasons - used, "%s%s: %s", used ? ", " : "",
                             t->name, why);
    if (used >= sizeof reasons)
      used = sizeof reasons - 1;
  }
  return ferry_fail(FERRY_ETRANSPORT, "no transport usable with %s (%s)", p->address, reasons);
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

ferry_status ferry_peer_ensure(ferry_peer *p, uint64_t deadline_ns,
                               const ferry_transport **transport, uint64_t *instance) {
  pthread_mutex_lock(&p->lock);
  int ready = p->known && p->transport && p->regions;
  int proven = ferry_now_ns() - p->replied_ns < FERRY_PEER_TRUST_NS;
  *transport = p->transport;
  *instance = p->info.engine_id;
  pthread_mutex_unlock(&p->lock);
  if (ready && (proven || !control_lost(p)))
    return FERRY_OK;
  ferry_status st = refresh_regions(p, deadline_ns);
  if (st)
    return st;
  pthread_mutex_lock(&p->lock);
  const ferry_transport *chosen = p->transport;
  ferry_hello_reply info = p->info;
  pthread_mutex_unlock(&p->lock);
  if (!chosen && (st = choose_transport(p, &info, &chosen)) != FERRY_OK)
    return st;
  pthread_mutex_lock(&p->lock);
  /* Keep one choice per incarnation: a racing thread may have chosen first,
   * or the target restarted meanwhile (then this batch fails at checkout). */
  if (!p->transport && p->info.engine_id == info.engine_id)
    p->transport = chosen;
  pthread_mutex_unlock(&p->lock);
  *transport = chosen;
  *instance = info.engine_id;
  return FERRY_OK;
}

static long first_unknown_remote(ferry_peer *p, const ferry_entry *entries, size_t count) {
  long bad = -1;
  pthread_mutex_lock(&p->lock);
  for (size_t i = 0; i < count && bad < 0; i++)
    if (ferry_regions_search(p->regions, p->region_count, entries[i].remote, entries[i].length) < 0)
      bad = (long)i;
  pthread_mutex_unlock(&p->lock);
  return bad;
}

ferry_status ferry_peer_check_remote(ferry_peer *p, const ferry_entry *entries, size_t count,
                                     uint64_t deadline_ns) {
  long bad = first_unknown_remote(p, entries, count);
  if (bad < 0)
    return FERRY_OK;
  /* The target may have registered more memory since we fetched its table. */
  ferry_status st = refresh_regions(p, deadline_ns);
  if (st)
    return st;
  bad = first_unknown_remote(p, entries, count);
  if (bad < 0)
    return FERRY_OK;
  return ferry_fail(FERRY_ENOTREG,
                    "remote address 0x%llx (+%zu bytes) of entry %ld is not registered at %s",
                    (unsigned long long)entries[bad].remote, entries[bad].length, bad, p->address);
}

size_t ferry_peer_region_key(ferry_peer *p, unsigned transport, uint64_t addr, uint64_t length,
                             uint8_t *out, size_t size, uint64_t *base) {
  size_t len = 0;
  pthread_mutex_lock(&p->lock);
  long i = ferry_regions_search(p->regions, p->region_count, addr, length);
  for (unsigned k = 0; i >= 0 && k < p->key_sections; k++) {
    const ferry_region_keys *keys = &p->keys[k];
    if (keys->transport != transport || keys->size > size)
      continue;
    len = keys->size;
    memcpy(out, keys->data + (size_t)i * len, len);
    *base = p->regions[i].addr;
  }
  pthread_mutex_unlock(&p->lock);
  return len;
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

static ferry_channel *take_idle(ferry_peer *p) {
  while (p->idle) {
    ferry_channel *ch = p->idle;
    p->idle = ch->next_idle;
    if (ch->generation == p->generation && ch->transport->channel_alive(ch))
      return ch;
    unlink_channel(p, ch);
    ch->transport->channel_close(ch);
  }
  return NULL;
}

static ferry_status open_channel(ferry_peer *p, ferry_batch *b, ferry_channel **out) {
  p->open_channels++;
  pthread_mutex_unlock(&p->lock);
  ferry_channel *ch = NULL;
  ferry_status st = b->transport->channel_open(p, b->deadline_ns, &ch);
  pthread_mutex_lock(&p->lock);
  if (!st && ferry_engine_closing(p->engine)) {
    ch->transport->channel_close(ch); /* shutdown's pass may have missed it */
    st = closed_error(p, "transfer");
  }
  if (st) {
    p->open_channels--;
    pthread_cond_broadcast(&p->cond);
    return st;
  }
  ferry_stats_channel_opened(p, b->transport);
  ch->generation = p->generation;
  ch->next_all = p->all;
  p->all = ch;
  *out = ch;
  return FERRY_OK;
}

ferry_status ferry_peer_checkout(ferry_peer *p, ferry_batch *b, ferry_channel **out) {
  ferry_status st = FERRY_OK;
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
    if ((*out = take_idle(p)) != NULL)
      break;
    if (p->open_channels < p->engine->cfg.tcp_connections) {
      st = open_channel(p, b, out);
      break;
    }
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
    p->generation++; /* its siblings may be just as dead (peer restart) */
    p->replied_ns = 0;
  } else if (ch->replied_ns > p->replied_ns) {
    p->replied_ns = ch->replied_ns;
  }
  if (ch->broken || ch->generation != p->generation || ferry_engine_closing(p->engine)) {
    unlink_channel(p, ch);
    ch->transport->channel_close(ch);
  } else {
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
    st = refresh_regions(p, connect_deadline(e));
  if (st)
    return st;
  pthread_mutex_lock(&p->lock);
  *count = p->region_count;
  *out = malloc((p->region_count ? p->region_count : 1) * sizeof **out);
  if (*out && p->region_count)
    memcpy(*out, p->regions, p->region_count * sizeof **out);
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
  if (!st)
    *transport = chosen->id;
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
