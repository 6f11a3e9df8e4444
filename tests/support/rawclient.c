/* rawclient.c - see rawclient.h. */
#include "rawclient.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int raw_connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  struct timeval tv = {10, 0}; /* a test never waits forever */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

int raw_send(int fd, const void *data, size_t len) {
  return send(fd, data, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

int raw_recv(int fd, void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
    if (n <= 0)
      return -1;
    got += (size_t)n;
  }
  return 0;
}

static int send_frame(int fd, const ferry_frame_header *h, const void *body) {
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  ferry_wire_header_encode(raw, h);
  if (raw_send(fd, raw, sizeof raw) < 0)
    return -1;
  return h->body_len ? raw_send(fd, body, h->body_len) : 0;
}

/* Reads a reply header; a refusal's reason goes to reason. */
static int recv_reply(int fd, ferry_frame_header *h, char *reason, size_t size) {
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  if (raw_recv(fd, raw, sizeof raw) < 0 || ferry_wire_header_decode(raw, h) != FERRY_OK)
    return 1;
  if (h->status) {
    char text[FERRY_WIRE_MAX_REASON + 1];
    if (raw_recv(fd, text, h->body_len) < 0)
      return 1;
    text[h->body_len] = 0;
    if (reason)
      snprintf(reason, size, "%s", text);
  }
  return h->status;
}

static int hello_with(int fd, const ferry_hello *with, char *reason, size_t reason_size) {
  ferry_hello hello = *with;
  if (!*hello.name)
    snprintf(hello.name, sizeof hello.name, "raw-test-client");
  uint8_t body[FERRY_WIRE_HELLO_MAX];
  ferry_frame_header h = {.type = FERRY_FRAME_HELLO};
  h.body_len = ferry_wire_hello_encode(body, &hello);
  if (send_frame(fd, &h, body) < 0)
    return 1;
  int st = recv_reply(fd, &h, reason, reason_size);
  if (st)
    return st;
  uint8_t reply[FERRY_WIRE_HELLO_REPLY_MAX];
  return raw_recv(fd, reply, h.body_len) < 0 ? 1 : 0;
}

int raw_hello(int fd, uint16_t vmin, uint16_t vmax, char *reason, size_t reason_size) {
  ferry_hello hello = {.version_min = vmin, .version_max = vmax, .conn_kind = FERRY_CONN_DATA};
  return hello_with(fd, &hello, reason, reason_size);
}

int raw_hello_called(int fd, const char *name, uint16_t vmin, uint16_t vmax, char *reason,
                     size_t reason_size) {
  ferry_hello hello = {.version_min = vmin, .version_max = vmax, .conn_kind = FERRY_CONN_DATA};
  snprintf(hello.name, sizeof hello.name, "%s", name);
  return hello_with(fd, &hello, reason, reason_size);
}

int raw_hello_as(int fd, uint64_t engine_id, char *reason, size_t reason_size) {
  ferry_hello hello = {.version_min = FERRY_WIRE_VERSION_MIN,
                       .version_max = FERRY_WIRE_VERSION_MAX,
                       .conn_kind = FERRY_CONN_DATA,
                       .engine_id = engine_id};
  return hello_with(fd, &hello, reason, reason_size);
}

int raw_hello_named(int fd, uint64_t engine_id, const uint8_t nonce[FERRY_WIRE_NONCE_SIZE]) {
  ferry_hello hello = {.version_min = FERRY_WIRE_VERSION_MIN,
                       .version_max = FERRY_WIRE_VERSION_MAX,
                       .conn_kind = FERRY_CONN_DATA,
                       .engine_id = engine_id};
  memcpy(hello.nonce, nonce, FERRY_WIRE_NONCE_SIZE);
  return hello_with(fd, &hello, NULL, 0);
}

int raw_cut_begin(int fd, const uint8_t nonce[FERRY_WIRE_NONCE_SIZE]) {
  ferry_frame_header h = {.type = FERRY_FRAME_CUT, .id = 9, .body_len = FERRY_WIRE_NONCE_SIZE};
  return send_frame(fd, &h, nonce);
}

int raw_cut(int fd, const uint8_t nonce[FERRY_WIRE_NONCE_SIZE]) {
  return raw_cut_begin(fd, nonce) < 0 ? 1 : raw_cut_reply(fd, NULL, 0);
}

int raw_cut_reply(int fd, char *reason, size_t reason_size) {
  ferry_frame_header h;
  int st = recv_reply(fd, &h, reason, reason_size);
  return st ? st : h.type != FERRY_FRAME_CUT_REPLY || h.id != 9;
}

int raw_reply(int fd, char *reason, size_t reason_size) {
  ferry_frame_header h;
  return recv_reply(fd, &h, reason, reason_size);
}

int raw_write_begin(int fd, uint64_t remote, const void *data, size_t len, size_t sent) {
  ferry_region seg = {remote, len};
  uint8_t table[FERRY_WIRE_SEGMENT_SIZE];
  ferry_wire_segments_encode(table, &seg, 1);
  ferry_frame_header h = {.type = FERRY_FRAME_WRITE, .count = 1, .id = 7, .body_len = 16 + len};
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  ferry_wire_header_encode(raw, &h);
  if (raw_send(fd, raw, sizeof raw) < 0 || raw_send(fd, table, sizeof table) < 0)
    return -1;
  return sent ? raw_send(fd, data, sent) : 0;
}

int raw_read_begin(int fd, uint64_t remote, size_t len) {
  ferry_region seg = {remote, len};
  uint8_t table[FERRY_WIRE_SEGMENT_SIZE];
  ferry_wire_segments_encode(table, &seg, 1);
  ferry_frame_header h = {.type = FERRY_FRAME_READ, .count = 1, .id = 8, .body_len = 16};
  return send_frame(fd, &h, table);
}

int raw_write(int fd, uint64_t remote, const void *data, size_t len, char *reason,
              size_t reason_size) {
  if (raw_write_begin(fd, remote, data, len, len) < 0)
    return 1;
  return raw_reply(fd, reason, reason_size);
}

int raw_read(int fd, uint64_t remote, void *out, size_t len) {
  ferry_frame_header h;
  if (raw_read_begin(fd, remote, len) < 0)
    return 1;
  int st = recv_reply(fd, &h, NULL, 0);
  if (st)
    return st;
  return h.body_len == len && raw_recv(fd, out, len) == 0 ? 0 : 1;
}

int raw_closed_by_peer(int fd, int timeout_ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0)
    return 0;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) == 0 || (p.revents & (POLLHUP | POLLERR));
}
