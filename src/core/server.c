/* server.c - the target side: a bounded pool of server workers waits in
 * one epoll set holding the listening sockets and every idle connection
 * (one-shot); the worker the kernel wakes for a readable connection serves
 * one whole frame (or the handshake) with blocking I/O under the frame's
 * deadline, then puts the connection back. Threads do not grow with peers
 * or connections: an idle connection costs about 1 KiB and no thread. A
 * timer thread closes idle connections and grows the pool past stuck
 * workers.
 *
 * Every WRITE and READ is checked against the registry before memory is
 * touched; a refused request is answered with a reason and the connection
 * stays in sync (a refused WRITE's payload is read and dropped). A frame that
 * fails the wire checks closes that connection only.
 *
 * Each connection publishes the segments of the WRITE or READ it is serving
 * before checking them, so an unregister can find and interrupt every
 * request still moving bytes of a removed range (ferry_server_fence); a
 * connection waiting in epoll touches no memory. Every frame has a
 * deadline once readable, a connection idle past idle_timeout_ms
 * (connect_timeout_ms before its handshake) is closed, and connections are
 * capped per peer and in total.
 *
 * A peer that stalls mid-frame holds its worker until the frame deadline.
 * So that stalled peers cannot hold up everyone, the timer adds a worker
 * for each one stuck in a frame longer than SERVER_STUCK_MS, up to
 * SERVER_THREADS_FACTOR * server_threads, and the extra threads exit after
 * worker_idle_ms without work. */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "counters.h"
#include "engine.h"
#include "memory/staging.h"
#include "pool.h"

#define SERVER_STUCK_MS 100     /* a worker this long in one frame counts as stuck */
#define SERVER_THREADS_FACTOR 4 /* hard cap: this many times server_threads */

/* What an epoll event points to: a listening socket or a connection. */
enum { WATCH_LISTENER, WATCH_CONN };

/* Where a connection is: waiting in epoll, or being served by the one
 * worker that took its event (and owns it until it puts it back). */
enum { CONN_WAITING, CONN_BUSY };

/* A worker's per-frame buffers, lent to the connection it is serving. The
 * read-ahead goes back only when it holds no byte (see serve_ready). */
typedef struct server_buffers {
  uint8_t table[FERRY_WIRE_MAX_SEGMENTS * FERRY_WIRE_SEGMENT_SIZE];
  ferry_region segs[FERRY_WIRE_MAX_SEGMENTS];
  struct iovec iov[FERRY_WIRE_MAX_SEGMENTS + 2];
  uint8_t readahead[FERRY_READAHEAD];
  /* Staging (memory/staging.h): where each segment lives, and the
   * worker's bounce buffers, opened when a frame first needs them. */
  ferry_stage_range ranges[FERRY_WIRE_MAX_SEGMENTS];
  ferry_stager *stager;
} server_buffers;

typedef struct server_listener {
  int kind; /* WATCH_LISTENER */
  int fd;
  int owned; /* the RPC port's, closed with the server; others are their owner's */
} server_listener;

typedef struct server_conn {
  int kind; /* WATCH_CONN */
  ferry_engine *engine;
  int fd;
  int finished;
  /* Guarded by the server lock: where it is (CONN_*), since when (the
   * start of its wait or of its frame), and whether its handshake is done. */
  int state;
  uint64_t since_ns;
  int greeted;
  int expired; /* idle past its limit: shut down by the timer */
  /* Guarded by lock, read by fences: how many of segs[] the current WRITE or
   * READ (serving_type) may touch, 0 = none; cancelled, set by a fence that
   * removed one of them (also sock.cancel), and which region that was. */
  pthread_mutex_t lock;
  uint32_t serving;
  uint8_t serving_type;
  int cancelled;
  ferry_region fenced;
  /* The initiator engine, from its HELLO (guarded by the server lock):
   * connections per peer and notification shares are counted by it. */
  int identified;
  uint64_t peer_id;
  char peer_name[FERRY_WIRE_MAX_NAME + 1];
  uint8_t id[FERRY_WIRE_NONCE_SIZE]; /* its HELLO's nonce, which a CUT names */
  int cut;                           /* its initiator cut it (CUT): it ends without serving more */
  int cutting; /* (server lock) its worker waits in a CUT of its own: no CUT waits for it */
  struct server_conn *next;
  char peer[FERRY_HOST_MAX + 8];
  ferry_sock sock;
  ferry_session session; /* with a secret: seals every frame after AUTH */
  /* The serving worker's buffers (server_buffers), set while it is busy. */
  uint8_t *table;
  ferry_region *segs;
  struct iovec *iov;
  server_buffers *buffers;
} server_conn;

#define SERVER_LISTENERS_MAX 8

struct ferry_server {
  ferry_engine *engine;
  int epoll_fd; /* listeners, idle connections (one-shot) and wake_fd */
  int wake_fd;  /* eventfd, readable once stopping */
  pthread_t timer;
  int timer_started;
  pthread_mutex_t lock;
  pthread_cond_t quiet;  /* a cancelled connection stopped touching registered memory */
  pthread_cond_t tick;   /* an earlier sweep is due, or stopping */
  pthread_cond_t exited; /* a worker left */
  server_listener listeners[SERVER_LISTENERS_MAX];
  unsigned listener_count;
  server_conn *conns;
  unsigned count;    /* in conns */
  uint64_t sweep_ns; /* when the timer next looks for idle and stuck connections */
  int stopping;
  /* The worker pool: floor threads are kept, up to cap while some are
   * stuck; idle = waiting in epoll. Exited threads are joined one by the
   * next (as in workers.c). */
  unsigned floor, cap, threads, idle;
  pthread_t last_exited;
  int have_exited;
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

/* The facts (ids, boot id, pid, transport descriptors) go into HELLO_REPLY only when
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
  ferry_engine_describe(e, r);
}

/* AUTH: the initiator's proof over the transcript th. AUTH_REPLY: ours,
 * over th and the facts it carries; then the session seals every frame. */
static ferry_status check_proof(server_conn *c, const uint8_t th[FERRY_WIRE_PROOF_SIZE],
                                const ferry_hello_reply *r) {
  ferry_status st = ferry_auth_accept(&c->sock, c->engine->secret, th, r, &c->session);
  if (!st)
    ferry_sock_auth(&c->sock, &c->session);
  return st;
}

/* Counts c against its peer's share of connections, refusing it past
 * max_connections_per_peer. The peer is the engine id its HELLO claims. */
static ferry_status admit_peer(server_conn *c, const ferry_hello *hello) {
  ferry_server *s = c->engine->server;
  unsigned limit = c->engine->cfg.max_connections_per_peer, open = 0;
  pthread_mutex_lock(&s->lock);
  for (server_conn *o = s->conns; o; o = o->next)
    open += o->identified && o->peer_id == hello->engine_id &&
            !__atomic_load_n(&o->finished, __ATOMIC_ACQUIRE);
  if (open < limit) {
    c->identified = 1;
    c->peer_id = hello->engine_id;
    memcpy(c->id, hello->nonce, sizeof c->id);
    snprintf(c->peer_name, sizeof c->peer_name, "%s", hello->name);
  }
  pthread_mutex_unlock(&s->lock);
  if (open < limit) {
    ferry_pools_peer_joined(c->engine, c->peer_id);
    return FERRY_OK;
  }
  char why[FERRY_WIRE_MAX_REASON];
  snprintf(why, sizeof why,
           "peer %s already has %u connections to %s, the limit (max_connections_per_peer)",
           hello->name, open, c->engine->name);
  return refuse(c, FERRY_FRAME_HELLO_REPLY, FERRY_EBUSY, why);
}

/* The HELLO's name serves only logs and messages, and its sender has
 * proved nothing yet: escaped as it comes in (a newline in it would forge
 * a log line), cut to fit. */
static void escape_name(ferry_hello *hello) {
  char raw[sizeof hello->name];
  memcpy(raw, hello->name, sizeof raw);
  ferry_log_escape(hello->name, sizeof hello->name, raw, strnlen(raw, sizeof raw));
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
  escape_name(&hello);
  if (hello.version_max < FERRY_WIRE_VERSION_MIN || hello.version_min > FERRY_WIRE_VERSION_MAX) {
    char why[FERRY_WIRE_MAX_REASON];
    snprintf(why, sizeof why,
             "incompatible protocol: peer %s speaks versions %u..%u, this engine speaks %u..%u",
             hello.name, hello.version_min, hello.version_max, FERRY_WIRE_VERSION_MIN,
             FERRY_WIRE_VERSION_MAX);
    return refuse(c, FERRY_FRAME_HELLO_REPLY, FERRY_EVERSION, why);
  }
  st = admit_peer(c, &hello);
  if (st)
    return st;
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
  if (!st && hello.conn_kind == FERRY_CONN_DATA)
    ferry_stats_accepted(c->engine, FERRY_TRANSPORT_TCP);
  if (!st)
    FERRY_DEBUG("accepted %s connection from %s (%s)",
                hello.conn_kind == FERRY_CONN_DATA ? "data" : "control", c->peer, hello.name);
  return st;
}

/* ---- requests ------------------------------------------------------------ */

/* Checks every segment against the registry; on a miss, reason names it. */
static ferry_status validate_segments(server_conn *c, const ferry_frame_header *h, char *reason,
                                      size_t size) {
  for (uint32_t i = 0; i < h->count; i++) {
    if (!ferry_registry_contains(c->engine->registry, c->segs[i].addr, c->segs[i].length)) {
      snprintf(reason, size, "remote address 0x%llx (+%llu bytes) is not registered at %s",
               (unsigned long long)c->segs[i].addr, (unsigned long long)c->segs[i].length,
               c->engine->name);
      return FERRY_ENOTREG;
    }
  }
  /* A receive pool takes WRITEs only into the slots it granted the peer,
   * until they landed; from here the WRITE counts as in flight in them. */
  if (h->type == FERRY_FRAME_WRITE &&
      ferry_pools_check_writes(c->engine, c->peer_id, c->segs, h->count, reason, size))
    return FERRY_ENOTREG;
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

/* Whether the request's memory is out of this process's reach (READ: to
 * read, WRITE: to write): 1 with a reason naming the region, the range at
 * fault and the likely cause. cheap_only: the one-ioctl-per-mapping check
 * (-1, unknown, on kernels without PROCMAP_QUERY); else any, for errors. */
static int memory_problem(server_conn *c, const ferry_frame_header *h, int cheap_only, char *reason,
                          size_t size) {
  ferry_host_problem p;
  int write = h->type == FERRY_FRAME_WRITE;
  if (ferry_host_memory_find(c->engine->host_memory, c->segs, h->count, write, cheap_only, &p) != 1)
    return 0;
  char what[160];
  ferry_host_problem_describe(&p, what, sizeof what);
  ferry_region r = {p.start, 0};
  ferry_registry_find(c->engine->registry, p.start, &r);
  snprintf(reason, size,
           "region 0x%llx (+%llu bytes) at %s: %s; the process that registered it unmapped or "
           "protected it since",
           (unsigned long long)r.addr, (unsigned long long)r.length, c->engine->name, what);
  return 1;
}

/* A WRITE whose payload met memory this process cannot write after
 * `placed` bytes: the rest of the frame is dropped, so the connection
 * stays in sync for the next request. */
static ferry_status drop_after_fault(server_conn *c, const ferry_frame_header *h, uint64_t placed,
                                     ferry_status *verdict, char *reason, size_t size) {
  if (!memory_problem(c, h, 0, reason, size)) /* protected back meanwhile */
    snprintf(reason, size, "part of the WRITE's memory at %s could not be written",
             c->engine->name);
  FERRY_WARN("refused WRITE from %s: %s", c->peer, reason);
  *verdict = FERRY_EFAULT;
  uint64_t frame = h->body_len - (uint64_t)h->count * FERRY_WIRE_SEGMENT_SIZE;
  return ferry_sock_discard(&c->sock, frame - placed, "drop the rest of a refused WRITE");
}

/* ---- staging (memory/staging.h) ------------------------------------------ */

/* The first range of a planned request (ferry_stage_plan) that the CPU
 * cannot touch, or -1. */
static long device_range(const server_conn *c, const ferry_frame_header *h) {
  for (uint32_t i = 0; i < h->count; i++)
    if (!c->buffers->ranges[i].where.cpu_access)
      return (long)i;
  return -1;
}

/* A request for device memory that will not be staged (FERRY_STAGING=never
 * here) is refused before the memory is touched: a socket call given it
 * fails, and a checksum would read it with the CPU. */
static int unstaged_device(const server_conn *c, const ferry_frame_header *h, char *reason,
                           size_t size) {
  long i = device_range(c, h);
  if (i < 0)
    return 0;
  char place[64];
  ferry_where_format(&c->buffers->ranges[i].where, place, sizeof place);
  snprintf(reason, size,
           "0x%llx (+%llu bytes) at %s is %s memory, which it moves only through staging "
           "(FERRY_STAGING=never there)",
           (unsigned long long)c->segs[i].addr, (unsigned long long)c->segs[i].length,
           c->engine->name, place);
  return 1;
}

/* Whether the request's memory moves through the staging pipeline (its
 * ranges then in c->buffers->ranges, the worker's stager opened). */
static int staged(server_conn *c, const ferry_frame_header *h) {
  server_buffers *b = c->buffers;
  segments_iov(c, h->count);
  if (!ferry_stage_plan(c->engine->registry, c->iov, h->count, c->engine->cfg.staging, b->ranges))
    return 0;
  if (!b->stager && !(b->stager = ferry_stager_create()))
    FERRY_WARN("no memory for a staging pipeline: %s's request from %s moves unstaged",
               c->engine->name, c->peer);
  return b->stager != NULL;
}

/* A staged WRITE's payload: into bounce buffers, copied into place, every
 * copy ended before this returns. A failed copy is the ack's verdict. */
static ferry_status receive_staged(server_conn *c, const ferry_frame_header *h, uint64_t total,
                                   uint8_t *after, size_t after_len, ferry_status *verdict,
                                   char *reason, size_t size) {
  int checksum = h->flags & FERRY_FRAME_FLAG_CHECKSUM;
  ferry_sock_crc io = {&c->sock, checksum, 0, "receive WRITE payload (staged)"};
  ferry_status copied;
  ferry_sock_recv_stream(&c->sock, 1);
  ferry_status st = ferry_stage_in(c->buffers->stager, c->buffers->ranges, h->count,
                                   ferry_sock_crc_recv, &io, &copied);
  uint32_t sent_crc = 0;
  struct iovec tail[2];
  int n = 0;
  if (after_len)
    tail[n++] = (struct iovec){after, after_len};
  if (checksum)
    tail[n++] = (struct iovec){&sent_crc, sizeof sent_crc};
  if (!st && n)
    st = ferry_sock_recvv(&c->sock, tail, n, "receive WRITE payload");
  ferry_sock_recv_stream(&c->sock, 0);
  if (st)
    return st;
  if (copied) {
    snprintf(reason, size, "WRITE of %llu bytes at %s: %s", (unsigned long long)total,
             c->engine->name, ferry_last_error());
    FERRY_WARN("refused WRITE from %s: %s", c->peer, reason);
    *verdict = copied;
  } else if (checksum && le32toh(sent_crc) != ferry_crc32c(io.crc, after, after_len)) {
    snprintf(reason, size, "checksum mismatch on WRITE of %llu bytes at %s",
             (unsigned long long)total, c->engine->name);
    FERRY_ERROR("%s (from %s)", reason, c->peer);
    *verdict = FERRY_ECHECKSUM;
  } else {
    ferry_stats_staged(c->engine, FERRY_OP_WRITE, total);
  }
  return FERRY_OK;
}

/* Receives a checked WRITE's payload into place; a crc mismatch or memory
 * this process cannot write is a verdict for the ack, not a connection
 * error. */
static ferry_status receive_payload(server_conn *c, const ferry_frame_header *h, int stage,
                                    uint64_t total, uint8_t *after, size_t after_len,
                                    ferry_status *verdict, char *reason, size_t size) {
  if (stage)
    return receive_staged(c, h, total, after, after_len, verdict, reason, size);
  int checksum = h->flags & FERRY_FRAME_FLAG_CHECKSUM;
  uint32_t sent_crc = 0;
  int n = segments_iov(c, h->count);
  if (after_len)
    c->iov[n++] = (struct iovec){after, after_len};
  if (checksum) {
    c->iov[n].iov_base = &sent_crc;
    c->iov[n++].iov_len = sizeof sent_crc;
  }
  uint64_t placed;
  ferry_status st =
      ferry_sock_recvv_registered(&c->sock, c->iov, n, &placed, "receive WRITE payload");
  if (st == FERRY_EFAULT)
    return drop_after_fault(c, h, placed, verdict, reason, size);
  if (!st && checksum &&
      le32toh(sent_crc) != ferry_crc32c(segments_crc(c, h->count), after, after_len)) {
    snprintf(reason, size, "checksum mismatch on WRITE of %llu bytes at %s",
             (unsigned long long)total, c->engine->name);
    FERRY_ERROR("%s (from %s)", reason, c->peer);
    *verdict = FERRY_ECHECKSUM;
  }
  return st;
}

/* A staged READ's data: copied out of the memory into bounce buffers and
 * sent, the crc (if asked) running along. A failed copy cuts the reply
 * short: the connection ends. */
static ferry_status send_staged(server_conn *c, const ferry_frame_header *h, uint64_t total) {
  int checksum = h->flags & FERRY_FRAME_FLAG_CHECKSUM;
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  ferry_frame_header rh = {.type = FERRY_FRAME_READ_REPLY,
                           .flags = (uint8_t)checksum,
                           .id = h->id,
                           .body_len = total + (checksum ? 4 : 0)};
  ferry_wire_header_encode(raw, &rh);
  /* Counted before the initiator can see the reply. */
  ferry_stats_served(c->engine, FERRY_OP_READ, total, 0);
  ferry_stats_staged(c->engine, FERRY_OP_READ, total);
  ferry_sock_set_deadline(&c->sock, ferry_engine_deadline(c->engine, total));
  struct iovec head = {raw, sizeof raw};
  ferry_sock_crc io = {&c->sock, checksum, 0, "send READ data (staged)"};
  ferry_status st = ferry_sock_send_open(&c->sock, &head, 1, "send READ data");
  if (!st)
    st =
        ferry_stage_out(c->buffers->stager, c->buffers->ranges, h->count, ferry_sock_crc_send, &io);
  uint32_t crc = htole32(io.crc);
  if (!st && checksum)
    st = ferry_sock_send_piece(&c->sock, &crc, sizeof crc, "send READ data");
  st = ferry_sock_send_close(&c->sock, st, "send READ data");
  if (st && st != FERRY_ESOCKET && st != FERRY_ETIMEDOUT && st != FERRY_ECLOSED)
    st = ferry_fail(st, "READ from %s cut short, closing the connection: %s", c->peer,
                    ferry_last_error());
  return st;
}

/* Sends a checked READ's data straight from registered memory. */
static ferry_status send_data(server_conn *c, const ferry_frame_header *h, int stage,
                              uint64_t total) {
  if (stage)
    return send_staged(c, h, total);
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
  ferry_stats_served(c->engine, FERRY_OP_READ, total, 0); /* before the initiator can see it */
  for (uint32_t i = 0; i < h->count; i++, n++) {
    c->iov[n].iov_base = (void *)(uintptr_t)c->segs[i].addr;
    c->iov[n].iov_len = (size_t)c->segs[i].length;
  }
  if (checksum) {
    c->iov[n].iov_base = &crc;
    c->iov[n++].iov_len = sizeof crc;
  }
  ferry_sock_set_deadline(&c->sock, ferry_engine_deadline(c->engine, total));
  ferry_status st = ferry_sock_sendv(&c->sock, c->iov, n, "send READ data");
  char reason[FERRY_WIRE_MAX_REASON];
  if (st == FERRY_EFAULT && memory_problem(c, h, 0, reason, sizeof reason))
    st = ferry_fail(FERRY_EFAULT, "READ from %s cut short, closing the connection: %s", c->peer,
                    reason);
  return st;
}

/* A request whose segments are not all registered: answered, and a WRITE's
 * payload read and dropped so the connection stays in sync. */
static ferry_status refuse_request(server_conn *c, const ferry_frame_header *h, uint64_t total,
                                   ferry_status verdict, const char *reason) {
  int write = h->type == FERRY_FRAME_WRITE;
  FERRY_WARN("refused %s from %s: %s", write ? "WRITE" : "READ", c->peer, reason);
  if (!write)
    return reply(c, FERRY_FRAME_READ_REPLY, h->id, verdict, reason);
  uint64_t payload = total + (h->flags & FERRY_FRAME_FLAG_CHECKSUM ? 4 : 0);
  ferry_status st = ferry_sock_discard(&c->sock, payload, "drop refused WRITE payload");
  return st ? st : reply(c, FERRY_FRAME_WRITE_ACK, h->id, verdict, reason);
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
    st = ferry_engine_push_notification(c->engine, c->peer_id, c->peer_name, name, name_len, data,
                                        data_len);
  free(body);
  if (st == FERRY_EPROTO || st == FERRY_ESOCKET || st == FERRY_ETIMEDOUT)
    return st;
  return reply(c, FERRY_FRAME_NOTIFY_ACK, h->id, st, st ? ferry_last_error() : NULL);
}

/* Serves a POOL body (pool.c) and answers it with a frame of type: a
 * POOL_REPLY, or the ack of the WRITE that carried it (flags). */
static ferry_status answer_pool(server_conn *c, uint8_t type, uint8_t flags, uint64_t id,
                                const uint8_t *body, size_t len) {
  uint8_t grant[FERRY_WIRE_POOL_REPLY_SIZE];
  ferry_status st = ferry_pools_serve(c->engine, c->peer_id, c->peer_name, body, len,
                                      type == FERRY_FRAME_WRITE_ACK, grant);
  if (st == FERRY_EPROTO || st == FERRY_ESOCKET || st == FERRY_ETIMEDOUT)
    return st;
  if (st)
    return reply(c, type, id, st, ferry_last_error());
  ferry_frame_header ok = {.type = type, .flags = flags, .id = id, .body_len = sizeof grant};
  return ferry_sock_send_frame(&c->sock, &ok, grant, "send pool reply");
}

/* Receive pools (pool.c): a grant request or a landed notice. */
static ferry_status serve_pool(server_conn *c, const ferry_frame_header *h) {
  uint8_t body[FERRY_WIRE_POOL_MAX];
  ferry_status st = ferry_sock_recv(&c->sock, body, h->body_len, "receive POOL");
  return st ? st : answer_pool(c, FERRY_FRAME_POOL_REPLY, 0, h->id, body, h->body_len);
}

/* The ranges a REGIONS_REQ asks for (none: the whole table). A body that
 * fails its checks ends the connection, as any malformed frame does. */
static ferry_status receive_ranges(server_conn *c, const ferry_frame_header *h,
                                   ferry_region **ranges) {
  *ranges = NULL;
  if (h->count == 0)
    return FERRY_OK;
  uint8_t *body = malloc(h->body_len);
  *ranges = malloc(h->count * sizeof **ranges);
  ferry_status st = body && *ranges
                        ? ferry_sock_recv(&c->sock, body, h->body_len, "receive REGIONS_REQ")
                        : ferry_fail(FERRY_ENOMEM, "no memory for a REGIONS_REQ from %s", c->peer);
  if (!st && (st = ferry_wire_ranges_decode(body, h->body_len, h->count, *ranges)) != FERRY_OK)
    st = ferry_fail(FERRY_EPROTO, "REGIONS_REQ from %s: %s", c->peer, ferry_last_error());
  free(body);
  return st;
}

/* The regions overlapping the asked ranges, with every transport's keys,
 * so a first contact costs what the initiator needs, not the whole table. */
static ferry_status serve_regions(server_conn *c, const ferry_frame_header *h) {
  ferry_region *ranges, *regions = NULL;
  size_t count = 0;
  ferry_status st = receive_ranges(c, h, &ranges);
  if (st) {
    free(ranges);
    return st;
  }
  st = ferry_registry_overlapping(c->engine->registry, ranges, h->count, &regions, &count);
  free(ranges);
  ferry_region_keys keys[FERRY_WIRE_MAX_DESCRIPTORS];
  unsigned sections = 0;
  uint8_t *body = NULL;
  if (!st)
    st = ferry_engine_region_keys(c->engine, regions, count, keys, &sections);
  size_t len = ferry_wire_regions_size((uint32_t)count, keys, sections);
  if (!st && len > FERRY_WIRE_MAX_CONTROL_BODY)
    st = ferry_fail(FERRY_ENOMEM,
                    "%s: %zu regions (%zu bytes) exceed one region table's %llu bytes; ask for "
                    "fewer address ranges",
                    c->engine->name, count, len, FERRY_WIRE_MAX_CONTROL_BODY);
  if (!st && !(body = malloc(len)))
    st = ferry_fail(FERRY_ENOMEM, "no memory for a region table of %zu bytes", len);
  if (!st) {
    ferry_wire_regions_encode(body, regions, (uint32_t)count, keys, sections);
    ferry_frame_header rh = {
        .type = FERRY_FRAME_REGIONS_REPLY, .count = (uint32_t)count, .id = h->id, .body_len = len};
    st = ferry_sock_send_frame(&c->sock, &rh, body, "send REGIONS_REPLY");
  } else {
    st = reply(c, FERRY_FRAME_REGIONS_REPLY, h->id, st, ferry_last_error());
  }
  for (unsigned i = 0; i < sections; i++)
    free(keys[i].data);
  free(body);
  free(regions);
  return st;
}

/* Makes segs[0..count) visible to fences; before the registry check, so a
 * check that saw a region is always seen by the fence that removes it. */
static void publish(server_conn *c, const ferry_frame_header *h) {
  pthread_mutex_lock(&c->lock);
  c->serving = h->count;
  c->serving_type = h->type;
  pthread_mutex_unlock(&c->lock);
}

/* Ends the publication; nonzero (and *fenced set) when a fence cancelled
 * the request. A fence waiting for this connection is woken. */
static int unpublish(server_conn *c, ferry_region *fenced) {
  pthread_mutex_lock(&c->lock);
  c->serving = 0;
  int cancelled = c->cancelled;
  *fenced = c->fenced;
  pthread_mutex_unlock(&c->lock);
  if (cancelled) {
    ferry_server *s = c->engine->server;
    pthread_mutex_lock(&s->lock);
    pthread_cond_broadcast(&s->quiet);
    pthread_mutex_unlock(&s->lock);
  }
  return cancelled;
}

/* A request a fence cut off: the connection ends (the rest of the frame
 * cannot be trusted to arrive or be read), after telling a WRITE's
 * initiator why if it still listens. */
static ferry_status end_fenced(server_conn *c, const ferry_frame_header *h,
                               const ferry_region *fenced) {
  char reason[FERRY_WIRE_MAX_REASON];
  int write = h->type == FERRY_FRAME_WRITE;
  if (__atomic_load_n(&c->cut, __ATOMIC_ACQUIRE)) /* nobody listens for a reply */
    return ferry_fail(FERRY_ECLOSED, "connection from %s (%s) cut by its initiator mid-%s", c->peer,
                      c->peer_name, write ? "WRITE" : "READ");
  snprintf(reason, sizeof reason,
           "region 0x%llx (+%llu bytes) unregistered at %s while the %s from %s was in flight",
           (unsigned long long)fenced->addr, (unsigned long long)fenced->length, c->engine->name,
           write ? "WRITE" : "READ", c->peer);
  FERRY_WARN("%s: closing the connection", reason);
  c->sock.cancel = NULL; /* the reply touches no registered memory */
  if (write)
    reply(c, FERRY_FRAME_WRITE_ACK, h->id, FERRY_ENOTREG, reason);
  return ferry_fail(FERRY_ENOTREG, "%s", reason);
}

/* Serves a WRITE or READ: segments published, checked against the
 * registry, then memory moved; the publication covers exactly the time
 * registered memory may be touched. */
static ferry_status serve_memory(server_conn *c, const ferry_frame_header *h) {
  uint64_t total;
  ferry_status st = receive_segments(c, h, &total);
  if (st)
    return st;
  int write = h->type == FERRY_FRAME_WRITE;
  /* An after-landed message (pool.c's LANDED) rides past the payload:
   * served once every byte landed, its reply on the ack. */
  uint8_t after[FERRY_WIRE_POOL_MAX];
  uint64_t after_len = 0;
  if (write) {
    uint64_t carried = h->body_len - (uint64_t)h->count * FERRY_WIRE_SEGMENT_SIZE -
                       (h->flags & FERRY_FRAME_FLAG_CHECKSUM ? 4 : 0);
    after_len = h->flags & FERRY_FRAME_FLAG_AFTER ? carried - total : 0;
    if (total > carried || total + after_len != carried || after_len > sizeof after ||
        (after_len && after_len < FERRY_WIRE_POOL_FIXED))
      return ferry_fail(FERRY_EPROTO,
                        "WRITE from %s: segments sum to %llu bytes, frame carries %llu%s", c->peer,
                        (unsigned long long)total, (unsigned long long)carried,
                        after_len ? " with an after-landed message" : "");
  }
  char reason[FERRY_WIRE_MAX_REASON];
  publish(c, h);
  ferry_status verdict = validate_segments(c, h, reason, sizeof reason);
  /* A READ's data must be readable before its reply promises it: a send
   * that faults after the header cannot be answered (send_data then ends
   * the connection). Unchecked on kernels without PROCMAP_QUERY (6.11). */
  int stage = !verdict && staged(c, h);
  if (!verdict && !stage && unstaged_device(c, h, reason, sizeof reason))
    verdict = FERRY_EFAULT;
  if (!verdict && !write && (!stage || device_range(c, h) < 0) &&
      memory_problem(c, h, 1, reason, sizeof reason))
    verdict = FERRY_EFAULT;
  ferry_region fenced;
  if (verdict) {
    unpublish(c, &fenced); /* nothing was touched: a fence has nothing to wait for */
    return refuse_request(c, h, total + after_len, verdict, reason);
  }
  st = write ? receive_payload(c, h, stage, total, after, (size_t)after_len, &verdict, reason,
                               sizeof reason)
             : send_data(c, h, stage, total);
  if (write)
    ferry_pools_writes_done(c->engine, c->peer_id, c->segs, h->count, !st && !verdict);
  if (unpublish(c, &fenced))
    return end_fenced(c, h, &fenced);
  if (write)
    ferry_stats_served(c->engine, FERRY_OP_WRITE, total, st || verdict);
  if (st || !write)
    return st;
  /* Acknowledged only now: every byte of the frame is in memory. */
  if (after_len && !verdict)
    return answer_pool(c, FERRY_FRAME_WRITE_ACK, FERRY_FRAME_FLAG_AFTER, h->id, after,
                       (size_t)after_len);
  return reply(c, FERRY_FRAME_WRITE_ACK, h->id, verdict, verdict ? reason : NULL);
}

/* o is one of by's requester's other connections, the one named id. */
static int named_by(const server_conn *o, const server_conn *by, const uint8_t *id) {
  return o != by && o->identified && o->peer_id == by->peer_id && !memcmp(o->id, id, sizeof o->id);
}

/* Cuts every connection of c's requester named id (a hostile one may give
 * several the same nonce): each one's worker leaves the system call it is
 * in and serves nothing more. Server lock held. Returns how many. */
static unsigned cut_named(ferry_server *s, const server_conn *c, const uint8_t *id) {
  unsigned cut = 0;
  for (server_conn *o = s->conns; o; o = o->next) {
    if (!named_by(o, c, id))
      continue;
    pthread_mutex_lock(&o->lock);
    __atomic_store_n(&o->cut, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&o->cancelled, 1, __ATOMIC_RELEASE);
    shutdown(o->fd, SHUT_RDWR);
    pthread_mutex_unlock(&o->lock);
    cut++;
  }
  return cut;
}

/* A connection c's CUT of id still waits for: cut and inside a frame. One
 * waiting in a CUT of its own is not waited for: it touches no memory and,
 * cut, ends without serving more, so two CUTs never wait for each other.
 * Server lock held. */
static int cut_still_in_frame(ferry_server *s, const server_conn *c, const uint8_t *id) {
  for (server_conn *o = s->conns; o; o = o->next)
    if (named_by(o, c, id) && __atomic_load_n(&o->cut, __ATOMIC_ACQUIRE) && o->state == CONN_BUSY &&
        !o->cutting)
      return 1;
  return 0;
}

/* Why c's CUT stops waiting before the connections it cut left their
 * frames: the server stops, c itself was cut, or timeout_ms passed. Server
 * lock held. */
static ferry_status cut_wait_over(ferry_server *s, server_conn *c, uint64_t deadline_ns) {
  if (s->stopping)
    return ferry_fail(FERRY_ECLOSED, "CUT from %s (%s): the server is stopping", c->peer,
                      c->peer_name);
  if (__atomic_load_n(&c->cut, __ATOMIC_ACQUIRE))
    return ferry_fail(FERRY_ECLOSED, "connection from %s (%s) cut by its initiator during its CUT",
                      c->peer, c->peer_name);
  if (ferry_now_ns() >= deadline_ns)
    return ferry_fail(FERRY_ETIMEDOUT,
                      "CUT from %s (%s): the connection it names is still in a frame after %u ms "
                      "(timeout_ms) at %s; its bytes may still land",
                      c->peer, c->peer_name, c->engine->cfg.timeout_ms, c->engine->name);
  return FERRY_OK;
}

/* CUT: the requester's data connection named by its HELLO nonce stops,
 * like one a fence cancelled: its worker leaves the system call it is in
 * and serves nothing more, so bytes still on their way over it never land.
 * Answered once it is out of its frame; within timeout_ms, else refused
 * with FERRY_ETIMEDOUT (the initiator then counts it unconfirmed), and
 * never past the server's stop. Only the requester's own connections can
 * be named (peer_id: authenticated with a secret). */
static ferry_status serve_cut(server_conn *c, const ferry_frame_header *h) {
  uint8_t id[FERRY_WIRE_NONCE_SIZE];
  ferry_status st = ferry_sock_recv(&c->sock, id, sizeof id, "receive CUT");
  if (st)
    return st;
  ferry_server *s = c->engine->server;
  uint64_t deadline_ns = ferry_engine_deadline(c->engine, 0);
  struct timespec until = ferry_timespec(deadline_ns);
  pthread_mutex_lock(&s->lock);
  unsigned cut = cut_named(s, c, id);
  c->cutting = 1;
  /* A CUT waiting for c waits no more; one just cut that waits in a CUT of
   * its own ends. */
  pthread_cond_broadcast(&s->quiet);
  while (cut_still_in_frame(s, c, id) && !(st = cut_wait_over(s, c, deadline_ns)))
    pthread_cond_timedwait(&s->quiet, &s->lock, &until);
  c->cutting = 0;
  pthread_mutex_unlock(&s->lock);
  FERRY_DEBUG("%s asked to cut one of its data connections: %s", c->peer_name,
              cut ? "cut" : "already closed");
  ferry_sock_set_deadline(&c->sock, ferry_engine_deadline(c->engine, 0)); /* the wait used it up */
  if (st == FERRY_ETIMEDOUT) {
    FERRY_WARN("%s", ferry_last_error());
    return reply(c, FERRY_FRAME_CUT_REPLY, h->id, st, ferry_last_error());
  }
  return st ? st : reply(c, FERRY_FRAME_CUT_REPLY, h->id, FERRY_OK, NULL);
}

static ferry_status serve_frame(server_conn *c, const ferry_frame_header *h) {
  switch (h->type) {
  case FERRY_FRAME_WRITE:
  case FERRY_FRAME_READ: return serve_memory(c, h);
  case FERRY_FRAME_NOTIFY: return serve_notify(c, h);
  case FERRY_FRAME_POOL: return serve_pool(c, h);
  case FERRY_FRAME_REGIONS_REQ: return serve_regions(c, h);
  case FERRY_FRAME_PING: return reply(c, FERRY_FRAME_PONG, h->id, FERRY_OK, NULL);
  case FERRY_FRAME_CUT: return serve_cut(c, h);
  default: return ferry_fail(FERRY_EPROTO, "unexpected frame type %u from %s", h->type, c->peer);
  }
}

/* The next request of a connection epoll found readable: its header must
 * arrive within timeout_ms (the time it waited idle was spent in epoll);
 * once in, the rest of the frame must follow by the deadline of a transfer
 * of its size, so a peer that stalls mid-frame is cut off. */
static ferry_status next_request(server_conn *c, ferry_frame_header *h) {
  if (__atomic_load_n(&c->cut, __ATOMIC_ACQUIRE)) /* not even a frame already read ahead */
    return ferry_fail(FERRY_ECLOSED, "connection from %s (%s) cut by its initiator", c->peer,
                      c->peer_name);
  ferry_sock_set_deadline(&c->sock, ferry_engine_deadline(c->engine, 0));
  ferry_status st = ferry_sock_recv_header(&c->sock, h, "receive request");
  if (st == FERRY_OK && h->status != 0)
    st = ferry_fail(FERRY_EPROTO, "request from %s carries status %d", c->peer, h->status);
  ferry_sock_set_deadline(&c->sock, ferry_engine_deadline(c->engine, h->body_len));
  return st;
}

/* Marks c finished; its peer holds one connection fewer (pool.c: its
 * receive-pool slots go back with the last). */
static void connection_ended(server_conn *c) {
  __atomic_store_n(&c->finished, 1, __ATOMIC_RELEASE);
  if (c->identified)
    ferry_pools_peer_left(c->engine, c->peer_id);
}

static void free_connection(server_conn *c) {
  close(c->fd);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* The end of a connection, by the worker that owns it: peer accounting,
 * then out of epoll and the list, and closed. The peer sees it closed only
 * then, so a connection it opens next finds the slot free. */
static void end_connection(server_conn *c) {
  ferry_server *s = c->engine->server;
  connection_ended(c);
  pthread_mutex_lock(&s->lock);
  epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
  server_conn **pp = &s->conns;
  while (*pp != c)
    pp = &(*pp)->next;
  *pp = c->next;
  s->count--;
  pthread_cond_broadcast(&s->quiet); /* a CUT may wait for it */
  pthread_mutex_unlock(&s->lock);
  shutdown(c->fd, SHUT_RDWR);
  free_connection(c);
}

static void log_end(server_conn *c, ferry_status st) {
  if (st == FERRY_EPROTO || st == FERRY_ETIMEDOUT || st == FERRY_EFAULT)
    FERRY_WARN("closing connection: %s", ferry_last_error());
  else if (st != FERRY_ESOCKET || !strstr(ferry_last_error(), "closed by peer"))
    FERRY_DEBUG("connection from %s ended: %s", c->peer, ferry_last_error());
}

/* Asks the timer for a sweep by at_ns when that is earlier than planned.
 * Server lock held. */
static void sweep_by(ferry_server *s, uint64_t at_ns) {
  if (s->sweep_ns && s->sweep_ns <= at_ns)
    return;
  s->sweep_ns = at_ns;
  pthread_cond_signal(&s->tick);
}

/* How long c may wait for its next request before it is closed. */
static uint64_t idle_limit_ns(const server_conn *c) {
  const ferry_config *cfg = &c->engine->cfg;
  return (uint64_t)(c->greeted ? cfg->idle_timeout_ms : cfg->connect_timeout_ms) * 1000000ull;
}

/* Puts c in the epoll set (op ADD or MOD), one-shot, to wait for its next
 * request. Server lock held, so the timer cannot expire it half-way. */
static int arm_connection(ferry_server *s, server_conn *c, int op) {
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = c};
  c->state = CONN_WAITING;
  c->since_ns = ferry_now_ns();
  sweep_by(s, c->since_ns + idle_limit_ns(c));
  return epoll_ctl(s->epoll_fd, op, c->fd, &ev);
}

/* c starts a frame (or its handshake) on this worker. Server lock held. */
static void mark_busy(ferry_server *s, server_conn *c) {
  c->state = CONN_BUSY;
  c->since_ns = ferry_now_ns();
  sweep_by(s, c->since_ns + SERVER_STUCK_MS * 1000000ull);
}

/* Lends (b) or takes back (NULL) a worker's buffers. */
static void lend_buffers(server_conn *c, server_buffers *b) {
  c->table = b ? b->table : NULL;
  c->segs = b ? b->segs : NULL;
  c->iov = b ? b->iov : NULL;
  c->buffers = b;
  ferry_sock_readahead(&c->sock, b ? b->readahead : NULL, b ? sizeof b->readahead : 0);
}

static ferry_status serve_request(server_conn *c) {
  ferry_frame_header h;
  ferry_status st = next_request(c, &h);
  return st ? st : serve_frame(c, &h);
}

/* An idle connection the timer shut down: closed here, by its owner. */
static void end_expired(server_conn *c) {
  if (c->greeted)
    /* Normal for a pooled connection: its initiator reconnects. */
    FERRY_INFO("closing connection from %s (%s): no request for %u ms (idle_timeout_ms)", c->peer,
               c->peer_name, c->engine->cfg.idle_timeout_ms);
  else
    FERRY_WARN("closing connection from %s: no HELLO within %u ms (connect_timeout_ms)", c->peer,
               c->engine->cfg.connect_timeout_ms);
  end_connection(c);
}

/* Serves what made c readable: its handshake or one frame, and every
 * further frame whose bytes the read-ahead already holds (they would be
 * lost with the buffer). Then c waits in epoll again, or ends. */
static void serve_ready(ferry_server *s, server_conn *c, server_buffers *b) {
  lend_buffers(c, b);
  ferry_status st;
  if (c->greeted) {
    st = serve_request(c);
  } else {
    st = handshake(c);
    c->greeted = !st;
  }
  while (!st && ferry_sock_buffered(&c->sock)) {
    pthread_mutex_lock(&s->lock);
    mark_busy(s, c);
    pthread_mutex_unlock(&s->lock);
    st = serve_request(c);
  }
  lend_buffers(c, NULL);
  if (!st) {
    pthread_mutex_lock(&s->lock);
    if (arm_connection(s, c, EPOLL_CTL_MOD) < 0)
      st = ferry_fail_errno(FERRY_ESOCKET, errno, "watch the connection from %s", c->peer);
    if (__atomic_load_n(&c->cut, __ATOMIC_ACQUIRE))
      pthread_cond_broadcast(&s->quiet); /* its CUT waits for it to leave the frame */
    pthread_mutex_unlock(&s->lock);
  }
  if (st) {
    log_end(c, st);
    end_connection(c);
  }
}

/* ---- accepting ----------------------------------------------------------- */

static server_conn *new_connection(ferry_engine *e, int fd) {
  server_conn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->kind = WATCH_CONN;
  c->engine = e;
  c->fd = fd;
  pthread_mutex_init(&c->lock, NULL);
  snprintf(c->peer_name, sizeof c->peer_name, "before HELLO");
  ferry_net_tune(fd);
  ferry_net_describe_peer(fd, c->peer, sizeof c->peer);
  ferry_sock_init(&c->sock, fd, c->peer);
  c->sock.spin_ns = e->cfg.spin_us * 1000ull;
  c->sock.cancel = &c->cancelled;
  return c;
}

/* A new connection waits in epoll for its HELLO, within the caps. */
static void start_connection(ferry_server *s, int fd) {
  ferry_engine *e = s->engine;
  server_conn *c = new_connection(e, fd);
  if (!c) {
    FERRY_ERROR("no memory for a new connection; closing it");
    close(fd);
    return;
  }
  pthread_mutex_lock(&s->lock);
  const char *refused = NULL;
  if (s->count >= e->cfg.max_connections)
    refused = "connections open, the limit (max_connections)";
  else if (arm_connection(s, c, EPOLL_CTL_ADD) < 0)
    refused = "connections open, and epoll cannot watch another";
  if (refused) {
    unsigned open = s->count;
    pthread_mutex_unlock(&s->lock);
    FERRY_WARN("refused connection from %s: %u %s", c->peer, open, refused);
    free_connection(c);
    return;
  }
  c->next = s->conns;
  s->conns = c;
  s->count++;
  pthread_mutex_unlock(&s->lock);
}

static void accept_one(ferry_server *s, int listen_fd) {
  int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd >= 0)
    start_connection(s, fd);
  else if (errno == EMFILE || errno == ENFILE)
    poll(NULL, 0, 100); /* out of descriptors: back off instead of spinning */
}

/* ---- the worker pool ----------------------------------------------------- */

static void *worker_main(void *arg);

/* With the lock held: one more worker, if under cap. */
static void add_worker(ferry_server *s) {
  pthread_t thread;
  if (s->threads < s->cap && pthread_create(&thread, NULL, worker_main, s) == 0)
    s->threads++;
}

/* Called with the lock held by a worker about to return; unlocks. */
static void leave_pool(ferry_server *s) {
  pthread_t before = s->last_exited;
  int join = s->have_exited;
  s->last_exited = pthread_self();
  s->have_exited = 1;
  s->threads--;
  pthread_cond_broadcast(&s->exited);
  pthread_mutex_unlock(&s->lock);
  if (join)
    pthread_join(before, NULL);
}

/* What epoll handed this worker. Server lock held, dropped while serving.
 * The last idle worker below the floor starts another, so one is always
 * waiting in epoll while the pool can grow. */
static void dispatch(ferry_server *s, const struct epoll_event *ev, server_buffers *b) {
  int kind = ev->data.ptr ? *(const int *)ev->data.ptr : -1;
  if (kind < 0)
    return; /* the stop eventfd: stays readable, wakes every worker */
  if (s->idle == 0 && s->threads < s->floor)
    add_worker(s);
  server_conn *c = ev->data.ptr;
  if (kind == WATCH_CONN)
    mark_busy(s, c);
  pthread_mutex_unlock(&s->lock);
  if (kind == WATCH_LISTENER)
    accept_one(s, ((server_listener *)ev->data.ptr)->fd);
  else if (c->expired)
    end_expired(c);
  else
    serve_ready(s, c, b);
  pthread_mutex_lock(&s->lock);
}

/* Waits in epoll for a readable connection or listener and serves it;
 * exits when stopping, or idle past worker_idle_ms with more than the
 * floor running. */
static void *worker_main(void *arg) {
  ferry_server *s = arg;
  ferry_log_set_engine(s->engine->name);
  server_buffers *b = malloc(sizeof *b);
  if (!b)
    FERRY_ERROR("no memory for a server worker's buffers; the worker exits");
  else
    b->stager = NULL;
  pthread_mutex_lock(&s->lock);
  while (b && !s->stopping) {
    /* Only a worker beyond the floor needs to notice it is idle: the
     * others sleep without a timeout, so an idle engine never wakes. */
    int timeout = s->threads > s->floor ? (int)s->engine->cfg.worker_idle_ms : -1;
    s->idle++;
    pthread_mutex_unlock(&s->lock);
    struct epoll_event ev;
    int n = epoll_wait(s->epoll_fd, &ev, 1, timeout);
    pthread_mutex_lock(&s->lock);
    s->idle--;
    if (s->stopping || (n == 0 && s->threads > s->floor))
      break;
    if (n == 1)
      dispatch(s, &ev, b);
  }
  if (b)
    ferry_stager_destroy(b->stager);
  free(b);
  leave_pool(s);
  return NULL;
}

/* ---- the timer ----------------------------------------------------------- */

/* Shuts down connections idle past their limit (the worker that gets their
 * wake-up closes them) and adds a worker for each one stuck in a frame
 * longer than SERVER_STUCK_MS, up to cap. Plans the next sweep. Server
 * lock held. */
static void sweep(ferry_server *s) {
  uint64_t now = ferry_now_ns(), next = 0, stuck_ns = SERVER_STUCK_MS * 1000000ull;
  unsigned stuck = 0;
  for (server_conn *c = s->conns; c; c = c->next) {
    uint64_t due = c->since_ns + (c->state == CONN_BUSY ? stuck_ns : idle_limit_ns(c));
    if (c->expired)
      continue;
    if (due > now) {
      next = !next || due < next ? due : next;
    } else if (c->state == CONN_BUSY) {
      stuck++;
    } else {
      c->expired = 1;
      shutdown(c->fd, SHUT_RDWR);
    }
  }
  while (stuck && s->threads < s->floor + stuck && s->threads < s->cap)
    add_worker(s);
  s->sweep_ns = next;
}

static void *timer_main(void *arg) {
  ferry_server *s = arg;
  ferry_log_set_engine(s->engine->name);
  pthread_mutex_lock(&s->lock);
  while (!s->stopping) {
    if (!s->sweep_ns) {
      pthread_cond_wait(&s->tick, &s->lock);
    } else if (s->sweep_ns > ferry_now_ns()) {
      struct timespec until = ferry_timespec(s->sweep_ns);
      pthread_cond_timedwait(&s->tick, &s->lock, &until);
    } else {
      sweep(s);
    }
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* ---- start and stop ------------------------------------------------------- */

static ferry_status add_listener(ferry_engine *e, int listen_fd, int owned) {
  ferry_server *s = e->server;
  pthread_mutex_lock(&s->lock);
  unsigned i = s->listener_count;
  ferry_status st = FERRY_OK;
  if (i == SERVER_LISTENERS_MAX) {
    st = ferry_fail(FERRY_EINVAL, "%s already listens on %u sockets, the most it serves", e->name,
                    i);
  } else {
    s->listeners[i] = (server_listener){WATCH_LISTENER, listen_fd, owned};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->listeners[i]};
    fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
    if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev) < 0)
      st = ferry_fail_errno(FERRY_ESOCKET, errno, "watch listening socket %d of %s", listen_fd,
                            e->name);
    else
      s->listener_count++;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

static void server_free(ferry_server *s) {
  for (unsigned i = 0; i < s->listener_count; i++)
    if (s->listeners[i].owned)
      close(s->listeners[i].fd);
  if (s->epoll_fd >= 0)
    close(s->epoll_fd);
  if (s->wake_fd >= 0)
    close(s->wake_fd);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->quiet);
  pthread_cond_destroy(&s->tick);
  pthread_cond_destroy(&s->exited);
  free(s);
}

/* The timer and the first worker; more workers start as connections come. */
static ferry_status start_threads(ferry_server *s) {
  if (pthread_create(&s->timer, NULL, timer_main, s) != 0)
    return ferry_fail(FERRY_ENOMEM, "cannot start the server's timer thread");
  s->timer_started = 1;
  pthread_mutex_lock(&s->lock);
  add_worker(s);
  unsigned started = s->threads;
  pthread_mutex_unlock(&s->lock);
  return started ? FERRY_OK : ferry_fail(FERRY_ENOMEM, "cannot start a server worker");
}

ferry_status ferry_server_start(ferry_engine *e, int listen_fd) {
  ferry_server *s = calloc(1, sizeof *s);
  if (!s)
    return ferry_fail(FERRY_ENOMEM, "no memory for the server");
  s->engine = e;
  s->floor = e->cfg.server_threads ? e->cfg.server_threads : 2;
  s->cap = s->floor * SERVER_THREADS_FACTOR;
  pthread_mutex_init(&s->lock, NULL);
  ferry_cond_init(&s->quiet);
  ferry_cond_init(&s->tick);
  pthread_cond_init(&s->exited, NULL);
  s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  struct epoll_event wake = {.events = EPOLLIN, .data.ptr = NULL};
  ferry_status st = FERRY_OK;
  if (s->epoll_fd < 0 || s->wake_fd < 0 ||
      epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->wake_fd, &wake) < 0)
    st = ferry_fail_errno(FERRY_ESOCKET, errno, "epoll for the server of %s", e->name);
  e->server = s;
  if (!st)
    st = add_listener(e, listen_fd, 1);
  for (unsigned i = 0; i < e->rail_count && !st; i++)
    st = add_listener(e, e->rail_fds[i], 0);
  if (!st)
    st = start_threads(s);
  if (st) {
    s->listener_count = 0; /* the caller still owns listen_fd */
    ferry_server_stop(e);
  }
  return st;
}

void ferry_server_stop(ferry_engine *e) {
  ferry_server *s = e->server;
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  s->stopping = 1;
  pthread_cond_signal(&s->tick);
  pthread_cond_broadcast(&s->quiet); /* ends every CUT's wait */
  uint64_t one = 1;
  ssize_t unused = write(s->wake_fd, &one, sizeof one); /* wakes the workers in epoll */
  (void)unused;
  /* Wakes every worker blocked in a frame, then waits for all of them;
   * the lock is dropped while waiting (a worker takes it to wake a fence
   * or to end its connection). */
  for (server_conn *c = s->conns; c; c = c->next)
    shutdown(c->fd, SHUT_RDWR);
  while (s->threads)
    pthread_cond_wait(&s->exited, &s->lock);
  server_conn *list = s->conns;
  s->conns = NULL;
  s->count = 0;
  pthread_mutex_unlock(&s->lock);
  if (s->timer_started)
    pthread_join(s->timer, NULL);
  if (s->have_exited)
    pthread_join(s->last_exited, NULL);
  while (list) {
    server_conn *c = list;
    list = c->next;
    free_connection(c);
  }
  server_free(s);
  e->server = NULL;
}

/* ---- the unregister fence ---------------------------------------------- */

static int compare_addr(const void *a, const void *b) {
  const ferry_region *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The removed region (sorted, disjoint) that seg overlaps, or NULL. */
static const ferry_region *overlapping(const ferry_region *seg, const ferry_region *sorted,
                                       size_t count) {
  size_t lo = 0, hi = count; /* first region starting at or after seg's end */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (sorted[mid].addr < seg->addr + seg->length)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0 || sorted[lo - 1].addr + sorted[lo - 1].length <= seg->addr)
    return NULL;
  return &sorted[lo - 1];
}

/* Cancels c if the request it is serving touches a removed region, and
 * wakes its thread: a WRITE's receive stops (its socket can still answer
 * why), a READ's send fails. Called with the server lock held. */
static void cancel_if_touching(server_conn *c, const ferry_region *sorted, size_t count) {
  pthread_mutex_lock(&c->lock);
  for (uint32_t i = 0; i < c->serving && !c->cancelled; i++) {
    const ferry_region *r = overlapping(&c->segs[i], sorted, count);
    if (r) {
      c->fenced = *r;
      __atomic_store_n(&c->cancelled, 1, __ATOMIC_RELEASE);
      shutdown(c->fd, c->serving_type == FERRY_FRAME_WRITE ? SHUT_RD : SHUT_RDWR);
    }
  }
  pthread_mutex_unlock(&c->lock);
}

/* A cancelled connection still inside its request. Server lock held. */
static int cancelled_busy(ferry_server *s) {
  int busy = 0;
  for (server_conn *c = s->conns; c && !busy; c = c->next) {
    pthread_mutex_lock(&c->lock);
    busy = c->cancelled && c->serving;
    pthread_mutex_unlock(&c->lock);
  }
  return busy;
}

void ferry_server_fence(ferry_engine *e, ferry_region *removed, size_t count) {
  ferry_server *s = e->server;
  if (!s || !count)
    return;
  qsort(removed, count, sizeof *removed, compare_addr);
  pthread_mutex_lock(&s->lock);
  for (server_conn *c = s->conns; c; c = c->next)
    cancel_if_touching(c, removed, count);
  /* No peer is waited for: the cancelled threads only have to return from
   * the system call they were in. */
  while (cancelled_busy(s))
    pthread_cond_wait(&s->quiet, &s->lock);
  pthread_mutex_unlock(&s->lock);
}
