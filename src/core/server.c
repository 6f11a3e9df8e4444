/* server.c - the target side: accepts connections on the RPC port and
 * serves each one in its own thread with blocking I/O (an idle connection
 * costs a sleeping thread, no CPU).
 *
 * Every WRITE and READ is checked against the registry before memory is
 * touched; a refused request is answered with a reason and the connection
 * stays in sync (a refused WRITE's payload is read and dropped). A frame that
 * fails the wire checks closes that connection only. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "engine.h"
#include "error.h"
#include "log.h"
#include "sync.h"

typedef struct server_conn {
  ferry_engine *engine;
  int fd;
  pthread_t thread;
  int finished;
  uint64_t serving_gen; /* registry generation a WRITE/READ was checked at; 0 = none */
  struct server_conn *next;
  char peer[FERRY_HOST_MAX + 8];
  ferry_sock sock;
  ferry_session session; /* with a secret: seals every frame after AUTH */
  uint8_t table[FERRY_WIRE_MAX_SEGMENTS * FERRY_WIRE_SEGMENT_SIZE];
  ferry_region segs[FERRY_WIRE_MAX_SEGMENTS];
  struct iovec iov[FERRY_WIRE_MAX_SEGMENTS + 2];
  uint8_t readahead[FERRY_READAHEAD];
} server_conn;

struct ferry_server {
  int listen_fd;
  int wake[2]; /* a byte here stops the accept loop */
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t quiet; /* a connection finished touching registered memory */
  int waiters;
  server_conn *conns;
};

static ferry_status reply(server_conn *c, uint8_t type, uint64_t id, ferry_status status,
                          const char *reason) {
  ferry_frame_header h = {.type = type, .status = status, .id = id};
  if (status && reason)
    h.body_len = strnlen(reason, FERRY_WIRE_MAX_REASON - 1);
  return ferry_sock_send_frame(&c->sock, &h, status ? reason : NULL, "send reply");
}

/* ---- handshake ---------------------------------------------------------- */

static ferry_status refuse(server_conn *c, uint8_t type, ferry_status status, const char *why) {
  FERRY_WARN("refused connection from %s: %s", c->peer, why);
  reply(c, type, 0, status, why);
  return status;
}

/* The facts (ids, boot id, pid, shm path) go into HELLO_REPLY only when
 * no secret is set; otherwise into AUTH_REPLY, to a peer that proved it. */
static void fill_hello_reply(ferry_engine *e, ferry_hello_reply *r, uint16_t version) {
  memset(r, 0, sizeof *r);
  r->version = version;
  r->version_min = FERRY_WIRE_VERSION_MIN;
  r->version_max = FERRY_WIRE_VERSION_MAX;
  r->auth_required = e->secret != NULL;
  ferry_auth_nonce(r->nonce);
  r->engine_id = e->instance_id;
  r->transports = e->transports;
  memcpy(r->boot_id, e->boot_id, sizeof r->boot_id);
  r->pid = (uint32_t)getpid();
  snprintf(r->shm_path, sizeof r->shm_path, "%s", e->shm_path);
}

/* AUTH: the initiator's proof over the transcript th. AUTH_REPLY: ours,
 * over th and the facts it carries; then the session seals every frame. */
static ferry_status check_proof(server_conn *c, const uint8_t th[FERRY_WIRE_PROOF_SIZE],
                                const ferry_hello_reply *r) {
  const char *secret = c->engine->secret;
  ferry_frame_header h;
  uint8_t body[FERRY_WIRE_AUTH_REPLY_MAX];
  ferry_status st = ferry_sock_recv_header(&c->sock, &h, "receive AUTH");
  if (st)
    return st;
  if (h.type != FERRY_FRAME_AUTH)
    return refuse(c, FERRY_FRAME_AUTH_REPLY, FERRY_EAUTH, "shared secret required, no proof sent");
  st = ferry_sock_recv(&c->sock, body, FERRY_WIRE_PROOF_SIZE, "receive AUTH");
  if (st)
    return st;
  if (!ferry_auth_bound_check(secret, FERRY_AUTH_INITIATOR, th, NULL, 0, body))
    return refuse(c, FERRY_FRAME_AUTH_REPLY, FERRY_EAUTH,
                  "wrong shared secret, or the handshake was altered on the way");
  size_t facts = ferry_wire_facts_encode(body + FERRY_WIRE_PROOF_SIZE, r);
  ferry_auth_bound_proof(secret, FERRY_AUTH_TARGET, th, body + FERRY_WIRE_PROOF_SIZE, facts, body);
  ferry_frame_header ok = {.type = FERRY_FRAME_AUTH_REPLY,
                           .body_len = FERRY_WIRE_PROOF_SIZE + facts};
  st = ferry_sock_send_frame(&c->sock, &ok, body, "send AUTH_REPLY");
  if (!st) {
    ferry_session_start(&c->session, secret, FERRY_AUTH_TARGET, th);
    ferry_sock_auth(&c->sock, &c->session);
  }
  return st;
}

static ferry_status handshake(server_conn *c) {
  ferry_frame_header h;
  uint8_t body[FERRY_WIRE_HELLO_MAX];
  ferry_hello hello;
  ferry_sock_set_deadline(&c->sock,
                          ferry_now_ns() + c->engine->cfg.connect_timeout_ms * 1000000ull);
  ferry_status st = ferry_sock_recv_header(&c->sock, &h, "receive HELLO");
  if (st)
    return st;
  if (h.type != FERRY_FRAME_HELLO)
    return ferry_fail(FERRY_EPROTO, "connection from %s began with frame type %u, not HELLO",
                      c->peer, h.type);
  st = ferry_sock_recv(&c->sock, body, h.body_len, "receive HELLO");
  if (!st)
    st = ferry_wire_hello_decode(body, h.body_len, &hello);
  if (st)
    return st;
  if (hello.version_max < FERRY_WIRE_VERSION_MIN || hello.version_min > FERRY_WIRE_VERSION_MAX) {
    char why[FERRY_WIRE_MAX_REASON];
    snprintf(why, sizeof why,
             "incompatible protocol: peer %s speaks versions %u..%u, this engine speaks %u..%u",
             hello.name, hello.version_min, hello.version_max, FERRY_WIRE_VERSION_MIN,
             FERRY_WIRE_VERSION_MAX);
    return refuse(c, FERRY_FRAME_HELLO_REPLY, FERRY_EVERSION, why);
  }
  uint16_t version =
      hello.version_max < FERRY_WIRE_VERSION_MAX ? hello.version_max : FERRY_WIRE_VERSION_MAX;
  ferry_hello_reply r;
  fill_hello_reply(c->engine, &r, version);
  uint8_t out[FERRY_WIRE_HELLO_REPLY_MAX];
  ferry_frame_header rh = {.type = FERRY_FRAME_HELLO_REPLY};
  rh.body_len = ferry_wire_hello_reply_encode(out, &r);
  st = ferry_sock_send_frame(&c->sock, &rh, out, "send HELLO_REPLY");
  if (!st && c->engine->secret) {
    uint8_t th[FERRY_WIRE_PROOF_SIZE];
    ferry_auth_transcript(body, h.body_len, out, rh.body_len, th);
    st = check_proof(c, th, &r);
  }
  if (!st)
    FERRY_DEBUG("accepted %s connection from %s (%s)",
                hello.conn_kind == FERRY_CONN_DATA ? "data" : "control", c->peer, hello.name);
  ferry_sock_set_deadline(&c->sock, 0);
  return st;
}

/* ---- requests ------------------------------------------------------------ */

/* Checks every segment against the registry; on a miss, reason names it. */
static ferry_status validate_segments(server_conn *c, uint32_t count, char *reason, size_t size) {
  for (uint32_t i = 0; i < count; i++) {
    if (!ferry_registry_contains(c->engine->registry, c->segs[i].addr, c->segs[i].length)) {
      snprintf(reason, size, "remote address 0x%llx (+%llu bytes) is not registered at %s",
               (unsigned long long)c->segs[i].addr, (unsigned long long)c->segs[i].length,
               c->engine->name);
      return FERRY_ENOTREG;
    }
  }
  return FERRY_OK;
}

static ferry_status receive_segments(server_conn *c, const ferry_frame_header *h, uint64_t *total) {
  size_t table_len = (size_t)h->count * FERRY_WIRE_SEGMENT_SIZE;
  ferry_status st = ferry_sock_recv(&c->sock, c->table, table_len, "receive segment table");
  if (st)
    return st;
  return ferry_wire_segments_decode(c->table, h->count, c->segs, total);
}

static int segments_iov(server_conn *c, uint32_t count) {
  for (uint32_t i = 0; i < count; i++) {
    c->iov[i].iov_base = (void *)(uintptr_t)c->segs[i].addr;
    c->iov[i].iov_len = (size_t)c->segs[i].length;
  }
  return (int)count;
}

static uint32_t segments_crc(server_conn *c, uint32_t count) {
  uint32_t crc = 0;
  for (uint32_t i = 0; i < count; i++)
    crc = ferry_crc32c(crc, (const void *)(uintptr_t)c->segs[i].addr, (size_t)c->segs[i].length);
  return crc;
}

static ferry_status serve_write(server_conn *c, const ferry_frame_header *h) {
  uint64_t total;
  ferry_status st = receive_segments(c, h, &total);
  if (st)
    return st;
  int checksum = h->flags & FERRY_FRAME_FLAG_CHECKSUM;
  uint64_t expected =
      h->body_len - (uint64_t)h->count * FERRY_WIRE_SEGMENT_SIZE - (checksum ? 4 : 0);
  if (total != expected)
    return ferry_fail(FERRY_EPROTO, "WRITE from %s: segments sum to %llu bytes, frame carries %llu",
                      c->peer, (unsigned long long)total, (unsigned long long)expected);
  char reason[FERRY_WIRE_MAX_REASON];
  ferry_status verdict = validate_segments(c, h->count, reason, sizeof reason);
  if (verdict) {
    FERRY_WARN("refused WRITE from %s: %s", c->peer, reason);
    st = ferry_sock_discard(&c->sock, total + (checksum ? 4 : 0), "drop refused WRITE payload");
    return st ? st : reply(c, FERRY_FRAME_WRITE_ACK, h->id, verdict, reason);
  }
  uint32_t sent_crc = 0;
  int n = segments_iov(c, h->count);
  if (checksum) {
    c->iov[n].iov_base = &sent_crc;
    c->iov[n++].iov_len = sizeof sent_crc;
  }
  st = ferry_sock_recvv(&c->sock, c->iov, n, "receive WRITE payload");
  if (st)
    return st;
  if (checksum && le32toh(sent_crc) != segments_crc(c, h->count)) {
    snprintf(reason, sizeof reason, "checksum mismatch on WRITE of %llu bytes at %s",
             (unsigned long long)total, c->engine->name);
    FERRY_ERROR("%s (from %s)", reason, c->peer);
    return reply(c, FERRY_FRAME_WRITE_ACK, h->id, FERRY_ECHECKSUM, reason);
  }
  /* Acknowledged only now: every byte of the frame is in memory. */
  return reply(c, FERRY_FRAME_WRITE_ACK, h->id, FERRY_OK, NULL);
}

static ferry_status serve_read(server_conn *c, const ferry_frame_header *h) {
  uint64_t total;
  ferry_status st = receive_segments(c, h, &total);
  if (st)
    return st;
  char reason[FERRY_WIRE_MAX_REASON];
  ferry_status verdict = validate_segments(c, h->count, reason, sizeof reason);
  if (verdict) {
    FERRY_WARN("refused READ from %s: %s", c->peer, reason);
    return reply(c, FERRY_FRAME_READ_REPLY, h->id, verdict, reason);
  }
  int checksum = h->flags & FERRY_FRAME_FLAG_CHECKSUM;
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  uint32_t crc = checksum ? htole32(segments_crc(c, h->count)) : 0;
  ferry_frame_header rh = {.type = FERRY_FRAME_READ_REPLY,
                           .flags = (uint8_t)checksum,
                           .id = h->id,
                           .body_len = total + (checksum ? 4 : 0)};
  ferry_wire_header_encode(raw, &rh);
  c->iov[0].iov_base = raw;
  c->iov[0].iov_len = sizeof raw;
  int n = 1;
  for (uint32_t i = 0; i < h->count; i++, n++) {
    c->iov[n].iov_base = (void *)(uintptr_t)c->segs[i].addr;
    c->iov[n].iov_len = (size_t)c->segs[i].length;
  }
  if (checksum) {
    c->iov[n].iov_base = &crc;
    c->iov[n++].iov_len = sizeof crc;
  }
  return ferry_sock_sendv(&c->sock, c->iov, n, "send READ data");
}

static ferry_status serve_notify(server_conn *c, const ferry_frame_header *h) {
  uint8_t *body = malloc(h->body_len);
  if (!body)
    return ferry_fail(FERRY_ENOMEM, "no memory for a %llu-byte notification",
                      (unsigned long long)h->body_len);
  const char *name;
  const uint8_t *data;
  size_t name_len, data_len;
  ferry_status st = ferry_sock_recv(&c->sock, body, h->body_len, "receive NOTIFY");
  if (!st)
    st = ferry_wire_notify_decode(body, h->body_len, &name, &name_len, &data, &data_len);
  if (!st)
    st = ferry_engine_push_notification(c->engine, name, name_len, data, data_len);
  free(body);
  if (st == FERRY_EPROTO || st == FERRY_ESOCKET || st == FERRY_ETIMEDOUT)
    return st;
  return reply(c, FERRY_FRAME_NOTIFY_ACK, h->id, st, st ? ferry_last_error() : NULL);
}

static ferry_status serve_regions(server_conn *c, const ferry_frame_header *h) {
  ferry_region *regions = NULL;
  size_t count = ferry_registry_snapshot(c->engine->registry, &regions);
  size_t len = count * FERRY_WIRE_SEGMENT_SIZE;
  uint8_t *body = malloc(len ? len : 1);
  if (!body) {
    free(regions);
    return reply(c, FERRY_FRAME_REGIONS_REPLY, h->id, FERRY_ENOMEM, "out of memory");
  }
  ferry_wire_regions_encode(body, regions, (uint32_t)count);
  ferry_frame_header rh = {
      .type = FERRY_FRAME_REGIONS_REPLY, .count = (uint32_t)count, .id = h->id, .body_len = len};
  ferry_status st = ferry_sock_send_frame(&c->sock, &rh, body, "send REGIONS_REPLY");
  free(body);
  free(regions);
  return st;
}

/* Serves a WRITE or READ while advertising the registry generation it was
 * checked against, so an unregister can wait for it (ferry_server_quiesce).
 * The generation is published before the check: a check that saw the
 * region is always waited for. */
static ferry_status serve_memory(server_conn *c, const ferry_frame_header *h) {
  ferry_server *s = c->engine->server;
  __atomic_store_n(&c->serving_gen, ferry_registry_generation(c->engine->registry),
                   __ATOMIC_SEQ_CST);
  ferry_status st = h->type == FERRY_FRAME_WRITE ? serve_write(c, h) : serve_read(c, h);
  __atomic_store_n(&c->serving_gen, 0, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&s->waiters, __ATOMIC_SEQ_CST)) {
    pthread_mutex_lock(&s->lock);
    pthread_cond_broadcast(&s->quiet);
    pthread_mutex_unlock(&s->lock);
  }
  return st;
}

static ferry_status serve_frame(server_conn *c, const ferry_frame_header *h) {
  switch (h->type) {
  case FERRY_FRAME_WRITE:
  case FERRY_FRAME_READ: return serve_memory(c, h);
  case FERRY_FRAME_NOTIFY: return serve_notify(c, h);
  case FERRY_FRAME_REGIONS_REQ: return serve_regions(c, h);
  case FERRY_FRAME_PING: return reply(c, FERRY_FRAME_PONG, h->id, FERRY_OK, NULL);
  default: return ferry_fail(FERRY_EPROTO, "unexpected frame type %u from %s", h->type, c->peer);
  }
}

static void *serve_connection(void *arg) {
  server_conn *c = arg;
  ferry_status st = handshake(c);
  while (st == FERRY_OK) {
    ferry_frame_header h;
    st = ferry_sock_recv_header(&c->sock, &h, "receive request");
    if (st == FERRY_OK && h.status != 0)
      st = ferry_fail(FERRY_EPROTO, "request from %s carries status %d", c->peer, h.status);
    if (st == FERRY_OK)
      st = serve_frame(c, &h);
  }
  if (st == FERRY_EPROTO)
    FERRY_WARN("closing connection: %s", ferry_last_error());
  else if (st != FERRY_ESOCKET || !strstr(ferry_last_error(), "closed by peer"))
    FERRY_DEBUG("connection from %s ended: %s", c->peer, ferry_last_error());
  shutdown(c->fd, SHUT_RDWR);
  __atomic_store_n(&c->finished, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* ---- accept loop ----------------------------------------------------------- */

static void describe_peer(int fd, char *out, size_t size) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char host[FERRY_HOST_MAX] = "?";
  uint16_t port = 0;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      port = ntohs(a->sin6_port);
    } else {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      port = ntohs(a->sin_port);
    }
  }
  ferry_net_format_target(out, size, host, port);
}

/* Joins connection threads that have ended, so a long-lived engine does not
 * accumulate them. Called with the server lock held. */
static void reap_finished(ferry_server *s) {
  server_conn **pp = &s->conns;
  while (*pp) {
    server_conn *c = *pp;
    if (__atomic_load_n(&c->finished, __ATOMIC_ACQUIRE)) {
      *pp = c->next;
      pthread_join(c->thread, NULL);
      close(c->fd);
      free(c);
    } else {
      pp = &c->next;
    }
  }
}

static void start_connection(ferry_engine *e, int fd) {
  ferry_server *s = e->server;
  server_conn *c = calloc(1, sizeof *c);
  if (!c) {
    FERRY_ERROR("no memory for a new connection; closing it");
    close(fd);
    return;
  }
  c->engine = e;
  c->fd = fd;
  ferry_net_tune(fd);
  describe_peer(fd, c->peer, sizeof c->peer);
  ferry_sock_init(&c->sock, fd, c->peer);
  ferry_sock_readahead(&c->sock, c->readahead, sizeof c->readahead);
  c->sock.spin_ns = e->cfg.spin_us * 1000ull;
  pthread_mutex_lock(&s->lock);
  reap_finished(s);
  if (pthread_create(&c->thread, NULL, serve_connection, c) != 0) {
    pthread_mutex_unlock(&s->lock);
    FERRY_ERROR("cannot start a thread for %s; closing it", c->peer);
    close(fd);
    free(c);
    return;
  }
  c->next = s->conns;
  s->conns = c;
  pthread_mutex_unlock(&s->lock);
}

static void *accept_loop(void *arg) {
  ferry_engine *e = arg;
  ferry_server *s = e->server;
  struct pollfd fds[2] = {{s->listen_fd, POLLIN, 0}, {s->wake[0], POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0 && errno != EINTR)
      break;
    if (fds[1].revents)
      break;
    if (!(fds[0].revents & POLLIN))
      continue;
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0)
      start_connection(e, fd);
    else if (errno == EMFILE || errno == ENFILE)
      poll(NULL, 0, 100); /* out of descriptors: back off instead of spinning */
  }
  return NULL;
}

ferry_status ferry_server_start(ferry_engine *e, int listen_fd) {
  ferry_server *s = calloc(1, sizeof *s);
  if (!s)
    return ferry_fail(FERRY_ENOMEM, "no memory for the server");
  s->listen_fd = listen_fd;
  if (pipe2(s->wake, O_CLOEXEC) < 0) {
    free(s);
    return ferry_fail_errno(FERRY_ESOCKET, errno, "pipe for the server");
  }
  pthread_mutex_init(&s->lock, NULL);
  ferry_cond_init(&s->quiet);
  e->server = s;
  if (pthread_create(&s->thread, NULL, accept_loop, e) != 0) {
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
    e->server = NULL;
    return ferry_fail(FERRY_ENOMEM, "cannot start the accept thread");
  }
  return FERRY_OK;
}

void ferry_server_stop(ferry_engine *e) {
  ferry_server *s = e->server;
  if (!s)
    return;
  ssize_t unused = write(s->wake[1], "x", 1);
  (void)unused;
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&s->lock);
  for (server_conn *c = s->conns; c; c = c->next)
    shutdown(c->fd, SHUT_RDWR); /* wakes the blocked recv of each connection */
  while (s->conns) {
    server_conn *c = s->conns;
    s->conns = c->next;
    pthread_join(c->thread, NULL);
    close(c->fd);
    free(c);
  }
  pthread_mutex_unlock(&s->lock);
  close(s->listen_fd);
  close(s->wake[0]);
  close(s->wake[1]);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->quiet);
  free(s);
  e->server = NULL;
}

/* A connection still moving bytes of a request checked before the registry
 * reached `generation`. Called with the server lock held. */
static int busy_before(ferry_server *s, uint64_t generation) {
  for (server_conn *c = s->conns; c; c = c->next) {
    uint64_t g = __atomic_load_n(&c->serving_gen, __ATOMIC_SEQ_CST);
    if (g && g < generation)
      return 1;
  }
  return 0;
}

void ferry_server_quiesce(ferry_engine *e) {
  ferry_server *s = e->server;
  if (!s)
    return;
  uint64_t generation = ferry_registry_generation(e->registry);
  uint64_t deadline = ferry_now_ns() + (uint64_t)e->cfg.timeout_ms * 1000000ull;
  pthread_mutex_lock(&s->lock);
  __atomic_add_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
  int timed_out = 0;
  while (busy_before(s, generation) && !timed_out) {
    struct timespec until = ferry_timespec(deadline);
    timed_out = pthread_cond_timedwait(&s->quiet, &s->lock, &until) == ETIMEDOUT;
  }
  __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&s->lock);
  if (timed_out)
    FERRY_WARN("unregister: a peer's transfer into the old region was still running after %u ms",
               e->cfg.timeout_ms);
}
