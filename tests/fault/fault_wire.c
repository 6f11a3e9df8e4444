/* fault_wire.c - ferry frames from the outside: a raw-socket client that
 * speaks (or abuses) the wire protocol with the codecs of src/wire, and a
 * proxy that understands frames well enough to corrupt one payload byte in
 * flight, the fault that checksum mode exists to catch. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/engine.h"
#include "fault.h"

/* ---- whole-buffer socket I/O ------------------------------------------------------ */

/* Receives exactly len bytes: 0, 1 on a clean end of stream, -1 on error. */
static int recv_full(int fd, void *buf, size_t len) {
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return n == 0 ? 1 : -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Sends all len bytes: 0 or -1. */
static int send_full(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* ---- raw client ----------------------------------------------------------------- */

static int split_target(const char *target, char *host, size_t host_size, char *port,
                        size_t port_size) {
  const char *colon = strrchr(target, ':');
  if (!colon || (size_t)(colon - target) >= host_size)
    return -1;
  memcpy(host, target, (size_t)(colon - target));
  host[colon - target] = 0;
  snprintf(port, port_size, "%s", colon + 1);
  return 0;
}

static int connect_to(const char *target, unsigned timeout_ms) {
  char host[128], port[16];
  if (split_target(target, host, sizeof host, port, sizeof port) != 0)
    return -1;
  struct addrinfo hints = {0}, *ai;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, port, &hints, &ai) != 0)
    return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct timeval tv = {timeout_ms / 1000, (suseconds_t)(timeout_ms % 1000) * 1000};
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  return fd;
}

int fault_raw_connect(fault_raw *r, const char *target, unsigned timeout_ms) {
  memset(r, 0, sizeof *r);
  r->fd = connect_to(target, timeout_ms);
  r->next_id = 1;
  return r->fd >= 0 ? 0 : -1;
}

void fault_raw_close(fault_raw *r) {
  if (r->fd >= 0)
    close(r->fd);
  r->fd = -1;
}

int fault_raw_send(fault_raw *r, const void *buf, size_t len) { return send_full(r->fd, buf, len); }

int fault_raw_send_frame(fault_raw *r, const ferry_frame_header *h, const void *body) {
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  ferry_wire_header_encode(raw, h);
  if (fault_raw_send(r, raw, sizeof raw) != 0)
    return -1;
  return body && h->body_len ? fault_raw_send(r, body, (size_t)h->body_len) : 0;
}

int fault_raw_recv(fault_raw *r, void *buf, size_t len) { return recv_full(r->fd, buf, len); }

ferry_status fault_raw_recv_header(fault_raw *r, ferry_frame_header *h, int *eof) {
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  int rc = fault_raw_recv(r, raw, sizeof raw);
  if (eof)
    *eof = rc == 1;
  if (rc != 0)
    return FERRY_ESOCKET;
  return ferry_wire_header_decode(raw, h);
}

/* Reads a refusal's reason text (for the test log) and returns its status. */
static ferry_status take_refusal(fault_raw *r, const ferry_frame_header *h) {
  char reason[FERRY_WIRE_MAX_REASON + 1];
  size_t len = (size_t)h->body_len < FERRY_WIRE_MAX_REASON ? (size_t)h->body_len : 0;
  if (fault_raw_recv(r, reason, len) != 0)
    return FERRY_ESOCKET;
  reason[len] = 0;
  if (getenv("FERRY_FAULT_VERBOSE"))
    fprintf(stderr, "fault: refused (%d): %s\n", (int)h->status, reason);
  return (ferry_status)h->status;
}

/* Receives the reply to the request with id: FERRY_EPROTO unless it is a
 * `type` frame answering that id, the peer's status (its reason read) if it
 * refused, else FERRY_OK with the reply's header in *h. */
static ferry_status recv_reply(fault_raw *r, uint8_t type, uint64_t id, ferry_frame_header *h) {
  ferry_status st = fault_raw_recv_header(r, h, NULL);
  if (st)
    return st;
  if (h->type != type || h->id != id)
    return FERRY_EPROTO;
  return h->status ? take_refusal(r, h) : FERRY_OK;
}

ferry_status fault_raw_handshake(fault_raw *r, const char *secret) {
  ferry_hello hello;
  memset(&hello, 0, sizeof hello);
  hello.version_min = FERRY_WIRE_VERSION_MIN;
  hello.version_max = FERRY_WIRE_VERSION_MAX;
  hello.conn_kind = FERRY_CONN_DATA;
  hello.engine_id = ferry_random_u64();
  ferry_auth_nonce(hello.nonce);
  snprintf(hello.name, sizeof hello.name, "fault-raw-client");
  uint8_t sent[FERRY_WIRE_HELLO_MAX], body[FERRY_WIRE_AUTH_REPLY_MAX];
  ferry_frame_header h = {.type = FERRY_FRAME_HELLO};
  size_t sent_len = h.body_len = ferry_wire_hello_encode(sent, &hello);
  if (fault_raw_send_frame(r, &h, sent) != 0)
    return FERRY_ESOCKET;
  /* Handshake frames carry id 0, and so do their replies. */
  ferry_status st = recv_reply(r, FERRY_FRAME_HELLO_REPLY, 0, &h);
  if (st)
    return st;
  if (fault_raw_recv(r, body, (size_t)h.body_len) != 0)
    return FERRY_ESOCKET;
  st = ferry_wire_hello_reply_decode(body, (size_t)h.body_len, &r->info);
  if (st || !r->info.auth_required || !secret)
    return st;
  /* The proof covers the transcript (wire version 2). Later frames would
   * have to be sealed: this client sends none that must be accepted. */
  uint8_t th[FERRY_WIRE_PROOF_SIZE], proof[FERRY_WIRE_PROOF_SIZE];
  ferry_auth_transcript(sent, sent_len, body, (size_t)h.body_len, th);
  ferry_auth_bound_proof(secret, FERRY_AUTH_INITIATOR, th, NULL, 0, proof);
  ferry_frame_header ah = {.type = FERRY_FRAME_AUTH, .body_len = sizeof proof};
  if (fault_raw_send_frame(r, &ah, proof) != 0)
    return FERRY_ESOCKET;
  st = recv_reply(r, FERRY_FRAME_AUTH_REPLY, 0, &h);
  if (st)
    return st;
  /* the target's proof of the secret and its facts */
  return fault_raw_recv(r, body, (size_t)h.body_len) == 0 ? FERRY_OK : FERRY_ESOCKET;
}

int fault_raw_closed_by_peer(fault_raw *r, unsigned timeout_ms) {
  double deadline = fault_now() + timeout_ms / 1000.0;
  char scratch[4096];
  for (;;) {
    int left = (int)((deadline - fault_now()) * 1000);
    struct pollfd p = {r->fd, POLLIN | POLLRDHUP, 0};
    /* Looks at least once: a connection already closed counts even when
     * no time is left. */
    if (poll(&p, 1, left > 0 ? left : 0) <= 0) {
      if (left <= 0)
        return 0;
      continue;
    }
    ssize_t n = recv(r->fd, scratch, sizeof scratch, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      return 1;
    if (left <= 0)
      return 0;
  }
}

ferry_status fault_raw_write(fault_raw *r, uint64_t remote, const void *data, size_t len, int crc) {
  ferry_frame_header h = {.type = FERRY_FRAME_WRITE,
                          .flags = crc ? FERRY_FRAME_FLAG_CHECKSUM : 0,
                          .count = 1,
                          .id = r->next_id++,
                          .body_len = FERRY_WIRE_SEGMENT_SIZE + len + (crc ? 4 : 0)};
  uint8_t table[FERRY_WIRE_SEGMENT_SIZE];
  ferry_region seg = {remote, len};
  ferry_wire_segments_encode(table, &seg, 1);
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  ferry_wire_header_encode(raw, &h);
  uint32_t sum = ferry_crc32c(0, data, len) ^ (crc == 2 ? 0x5a5a5a5au : 0);
  uint8_t trailer[4] = {(uint8_t)sum, (uint8_t)(sum >> 8), (uint8_t)(sum >> 16),
                        (uint8_t)(sum >> 24)};
  if (fault_raw_send(r, raw, sizeof raw) || fault_raw_send(r, table, sizeof table) ||
      fault_raw_send(r, data, len) || (crc && fault_raw_send(r, trailer, 4)))
    return FERRY_ESOCKET;
  ferry_frame_header ack;
  return recv_reply(r, FERRY_FRAME_WRITE_ACK, h.id, &ack);
}

ferry_status fault_raw_read(fault_raw *r, uint64_t remote, void *data, size_t len, int checksum) {
  ferry_frame_header h = {.type = FERRY_FRAME_READ,
                          .flags = checksum ? FERRY_FRAME_FLAG_CHECKSUM : 0,
                          .count = 1,
                          .id = r->next_id++,
                          .body_len = FERRY_WIRE_SEGMENT_SIZE};
  uint8_t table[FERRY_WIRE_SEGMENT_SIZE];
  ferry_region seg = {remote, len};
  ferry_wire_segments_encode(table, &seg, 1);
  if (fault_raw_send_frame(r, &h, table) != 0)
    return FERRY_ESOCKET;
  ferry_frame_header rep;
  ferry_status st = recv_reply(r, FERRY_FRAME_READ_REPLY, h.id, &rep);
  if (st)
    return st;
  if (rep.body_len != len + (checksum ? 4 : 0) || fault_raw_recv(r, data, len) != 0)
    return FERRY_EPROTO;
  if (!checksum)
    return FERRY_OK;
  uint8_t t[4];
  if (fault_raw_recv(r, t, 4) != 0)
    return FERRY_ESOCKET;
  uint32_t sum = (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
  return sum == ferry_crc32c(0, data, len) ? FERRY_OK : FERRY_ECHECKSUM;
}

/* ---- corrupting proxy ------------------------------------------------------------------ */

#define PROXY_MAX_CONNS 64

typedef struct proxy_pump {
  struct fault_proxy *proxy;
  int from, to;
  int upstream; /* 1: from the target (replies), 0: to the target (requests) */
  pthread_t thread;
} proxy_pump;

struct fault_proxy {
  int listen_fd;
  char target[80];
  char upstream[80];
  pthread_t accept_thread;
  pthread_mutex_t lock;
  int stopping;
  proxy_pump pumps[2 * PROXY_MAX_CONNS];
  int npumps;
  int armed_write, armed_read; /* frames left to corrupt */
  unsigned corrupted;
  unsigned data_frames, checksummed;
};

static int take_armed(int *counter) {
  int v = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
  while (v > 0)
    if (__atomic_compare_exchange_n(counter, &v, v - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return 1;
  return 0;
}

/* Forwards len bytes, flipping the byte at offset flip (if < len). */
static int forward(int from, int to, uint64_t len, uint64_t flip) {
  uint8_t buf[65536];
  uint64_t pos = 0;
  while (pos < len) {
    size_t chunk = len - pos < sizeof buf ? (size_t)(len - pos) : sizeof buf;
    if (recv_full(from, buf, chunk) != 0)
      return -1;
    if (flip >= pos && flip < pos + chunk)
      buf[flip - pos] ^= 0x01;
    if (send_full(to, buf, chunk) != 0)
      return -1;
    pos += chunk;
  }
  return 0;
}

/* Copies everything until EOF or an error, frames or not. */
static void pass_raw(int from, int to) {
  uint8_t buf[65536];
  for (;;) {
    ssize_t n = recv(from, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0 || send_full(to, buf, (size_t)n) != 0)
      return;
  }
}

static void *pump_loop(void *arg) {
  proxy_pump *pp = arg;
  struct fault_proxy *px = pp->proxy;
  for (;;) {
    uint8_t raw[FERRY_WIRE_HEADER_SIZE];
    if (recv_full(pp->from, raw, sizeof raw) != 0)
      break;
    ferry_frame_header h;
    if (ferry_wire_header_decode(raw, &h) != FERRY_OK) {
      /* Not ours to judge: pass it on and leave the rest raw. */
      if (send_full(pp->to, raw, sizeof raw) == 0)
        pass_raw(pp->from, pp->to);
      break;
    }
    uint64_t flip = UINT64_MAX;
    uint64_t trailer = (h.flags & FERRY_FRAME_FLAG_CHECKSUM) ? 4 : 0;
    if (h.status == 0 && ((!pp->upstream && h.type == FERRY_FRAME_WRITE) ||
                          (pp->upstream && h.type == FERRY_FRAME_READ_REPLY))) {
      __atomic_add_fetch(&px->data_frames, 1, __ATOMIC_RELAXED);
      if (trailer)
        __atomic_add_fetch(&px->checksummed, 1, __ATOMIC_RELAXED);
    }
    if (!pp->upstream && h.type == FERRY_FRAME_WRITE && h.status == 0) {
      uint64_t table = (uint64_t)h.count * FERRY_WIRE_SEGMENT_SIZE;
      if (h.body_len > table + trailer && take_armed(&px->armed_write))
        flip = table;
    } else if (pp->upstream && h.type == FERRY_FRAME_READ_REPLY && h.status == 0) {
      if (h.body_len > trailer && take_armed(&px->armed_read))
        flip = 0;
    }
    if (flip != UINT64_MAX)
      __atomic_add_fetch(&px->corrupted, 1, __ATOMIC_RELAXED);
    if (send_full(pp->to, raw, sizeof raw) != 0 || forward(pp->from, pp->to, h.body_len, flip))
      break;
  }
  shutdown(pp->to, SHUT_WR);
  shutdown(pp->from, SHUT_RD);
  return NULL;
}

static void *accept_loop(void *arg) {
  struct fault_proxy *px = arg;
  for (;;) {
    int c = accept4(px->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    int u = connect_to(px->upstream, 30000);
    struct timeval none = {0, 0};
    if (u >= 0) {
      setsockopt(u, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
      setsockopt(u, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
    }
    pthread_mutex_lock(&px->lock);
    if (u < 0 || px->stopping || px->npumps + 2 > 2 * PROXY_MAX_CONNS) {
      pthread_mutex_unlock(&px->lock);
      close(c);
      if (u >= 0)
        close(u);
      continue;
    }
    proxy_pump *down = &px->pumps[px->npumps++];
    proxy_pump *up = &px->pumps[px->npumps++];
    *down = (proxy_pump){px, c, u, 0, 0};
    *up = (proxy_pump){px, u, c, 1, 0};
    pthread_create(&down->thread, NULL, pump_loop, down);
    pthread_create(&up->thread, NULL, pump_loop, up);
    pthread_mutex_unlock(&px->lock);
  }
  return NULL;
}

fault_proxy *fault_proxy_start(const char *bind_addr, const char *upstream) {
  fault_proxy *px = calloc(1, sizeof *px);
  if (!px)
    return NULL;
  pthread_mutex_init(&px->lock, NULL);
  snprintf(px->upstream, sizeof px->upstream, "%s", upstream);
  px->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, bind_addr, &a.sin_addr);
  socklen_t len = sizeof a;
  if (px->listen_fd < 0 || bind(px->listen_fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      listen(px->listen_fd, 64) < 0 ||
      getsockname(px->listen_fd, (struct sockaddr *)&a, &len) < 0) {
    if (px->listen_fd >= 0)
      close(px->listen_fd);
    free(px);
    return NULL;
  }
  snprintf(px->target, sizeof px->target, "%s:%u", bind_addr, ntohs(a.sin_port));
  pthread_create(&px->accept_thread, NULL, accept_loop, px);
  return px;
}

const char *fault_proxy_target(const fault_proxy *px) { return px->target; }

void fault_proxy_corrupt(fault_proxy *px, uint8_t frame_type, unsigned n) {
  if (frame_type == FERRY_FRAME_WRITE)
    __atomic_store_n(&px->armed_write, (int)n, __ATOMIC_RELEASE);
  else
    __atomic_store_n(&px->armed_read, (int)n, __ATOMIC_RELEASE);
}

unsigned fault_proxy_corrupted(const fault_proxy *px) {
  return __atomic_load_n(&px->corrupted, __ATOMIC_RELAXED);
}

void fault_proxy_data_frames(const fault_proxy *px, unsigned *frames, unsigned *checksummed) {
  *frames = __atomic_load_n(&px->data_frames, __ATOMIC_RELAXED);
  *checksummed = __atomic_load_n(&px->checksummed, __ATOMIC_RELAXED);
}

void fault_proxy_stop(fault_proxy *px) {
  if (!px)
    return;
  pthread_mutex_lock(&px->lock);
  px->stopping = 1;
  pthread_mutex_unlock(&px->lock);
  shutdown(px->listen_fd, SHUT_RDWR);
  pthread_join(px->accept_thread, NULL);
  close(px->listen_fd);
  for (int i = 0; i < px->npumps; i++)
    shutdown(px->pumps[i].from, SHUT_RDWR);
  for (int i = 0; i < px->npumps; i++)
    pthread_join(px->pumps[i].thread, NULL);
  for (int i = 0; i < px->npumps; i += 2) {
    close(px->pumps[i].from);
    close(px->pumps[i].to);
  }
  pthread_mutex_destroy(&px->lock);
  free(px);
}
