/* sniff.c - what listens on a HOST:PORT, for `ferry probe` and `ferry
 * doctor --target`: a ferry engine, or another service (an HTTP server such
 * as a metadata store, a TLS server, one that closes, one that stays
 * silent). Without it a probe of the wrong port ends in a handshake
 * timeout seconds later, naming nothing.
 *
 * It sends a genuine HELLO, as an engine's first connection would, and
 * reads the first bytes that come back: a ferry engine answers at once,
 * and sees nothing else. A port that closes or stays silent instead is
 * asked again, on fresh connections, in the first words of HTTP and of TLS,
 * which those servers answer (an HTTP server waits for the end of a
 * request line, so a HELLO alone leaves it silent). A ferry engine too
 * slow to answer within ANSWER_MS would see those and close them. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"
#include "wire/wire.h"

#define CONNECT_MS 3000
#define ANSWER_MS 1000 /* a ferry engine answers a HELLO within microseconds */

/* "host:port" or "[v6]:port" -> host and port; -1 if it is not that form
 * (a segment name: nothing to sniff). */
static int split_target(const char *target, char *host, size_t size, const char **port) {
  const char *colon = strrchr(target, ':');
  if (!colon || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1))
    return -1;
  const char *start = target;
  size_t len = (size_t)(colon - target);
  if (len >= 2 && target[0] == '[' && colon[-1] == ']')
    start++, len -= 2;
  if (len == 0 || len >= size)
    return -1;
  memcpy(host, start, len);
  host[len] = '\0';
  *port = colon + 1;
  return 0;
}

/* A connected stream socket, or -1 (the caller's probe then reports why). */
static int connect_to(const char *target) {
  char host[256];
  const char *port;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
  if (split_target(target, host, sizeof host, &port) != 0 || getaddrinfo(host, port, &hints, &ai))
    return -1;
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int rc = fd < 0 ? -1 : connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (rc != 0 && fd >= 0 && errno == EINPROGRESS) {
    struct pollfd p = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    rc = poll(&p, 1, CONNECT_MS) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) && !err
             ? 0
             : -1;
  }
  if (rc != 0 && fd >= 0)
    close(fd), fd = -1;
  return fd;
}

typedef struct ferry_hello_frame {
  uint8_t bytes[FERRY_WIRE_HEADER_SIZE + FERRY_WIRE_HELLO_MAX];
  size_t len;
} ferry_hello_frame;

/* A HELLO as an engine's control connection sends it. */
static int hello_frame(ferry_hello_frame *f) {
  ferry_hello hello;
  memset(&hello, 0, sizeof hello);
  hello.version_min = FERRY_WIRE_VERSION_MIN;
  hello.version_max = FERRY_WIRE_VERSION_MAX;
  hello.conn_kind = FERRY_CONN_CONTROL;
  if (getrandom(hello.nonce, sizeof hello.nonce, 0) != sizeof hello.nonce ||
      getrandom(&hello.engine_id, sizeof hello.engine_id, 0) != sizeof hello.engine_id)
    return -1;
  snprintf(hello.name, sizeof hello.name, "ferry-probe");
  ferry_frame_header h = {.type = FERRY_FRAME_HELLO};
  h.body_len = ferry_wire_hello_encode(f->bytes + FERRY_WIRE_HEADER_SIZE, &hello);
  ferry_wire_header_encode(f->bytes, &h);
  f->len = FERRY_WIRE_HEADER_SIZE + h.body_len;
  return 0;
}

/* Reads what arrives within ms (up to size bytes); its length, 0 on EOF,
 * -1 on silence or an error. */
static ssize_t read_some(int fd, uint8_t *buf, size_t size, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, ms) != 1)
    return -1;
  ssize_t n = recv(fd, buf, size, 0);
  return n < 0 && errno == ECONNRESET ? 0 : n;
}

/* The first line of a text answer, quoted, or its first bytes in hex. */
static void describe_bytes(const uint8_t *buf, size_t n, char *out, size_t size) {
  size_t line = 0;
  while (line < n && line < 60 && buf[line] >= 0x20 && buf[line] < 0x7f)
    line++;
  if (line >= 4) {
    snprintf(out, size, "\"%.*s\"", (int)line, (const char *)buf);
    return;
  }
  size_t used = (size_t)snprintf(out, size, "%zu bytes:", n);
  for (size_t i = 0; i < n && i < 8 && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, " %02x", buf[i]);
}

static int classify(const uint8_t *buf, size_t n, char *what, size_t size) {
  char shown[128];
  uint32_t magic = n >= 4 ? (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 |
                                (uint32_t)buf[3] << 24
                          : 0;
  if (magic == FERRY_WIRE_MAGIC)
    return 1;
  describe_bytes(buf, n, shown, sizeof shown);
  if (n >= 5 && memcmp(buf, "HTTP/", 5) == 0)
    snprintf(what, size, "an HTTP server answered (%s), not a ferry engine", shown);
  else if (n >= 2 && (buf[0] == 0x15 || buf[0] == 0x16) && buf[1] == 0x03)
    snprintf(what, size, "a TLS server answered (a TLS %s record), not a ferry engine",
             buf[0] == 0x15 ? "alert" : "handshake");
  else if (n >= 4 && memcmp(buf, "SSH-", 4) == 0)
    snprintf(what, size, "an SSH server answered (%s), not a ferry engine", shown);
  else
    snprintf(what, size, "something that is not a ferry engine answered (%s)", shown);
  return 0;
}

/* Sends request on a fresh connection; what comes back within ANSWER_MS
 * (up to size bytes): its length, 0 on EOF, -1 on silence, -2 when no
 * connection. */
static ssize_t ask(const char *target, const void *request, size_t len, uint8_t *buf, size_t size) {
  int fd = connect_to(target);
  if (fd < 0)
    return -2;
  ssize_t n = send(fd, request, len, MSG_NOSIGNAL) == (ssize_t)len
                  ? read_some(fd, buf, size, ANSWER_MS)
                  : 0;
  close(fd);
  return n;
}

/* A TLS 1.2 ClientHello offering one cipher suite: any TLS server answers
 * it with a handshake or an alert record. */
static const uint8_t tls_client_hello[] = {
    0x16, 0x03, 0x01, 0x00, 0x2d,       /* record: handshake, 45 bytes */
    0x01, 0x00, 0x00, 0x29, 0x03, 0x03, /* ClientHello, 41 bytes, TLS 1.2 */
    1,    2,    3,    4,    5,    6,    7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
    17,   18,   19,   20,   21,   22,   23, 24, 25, 26, 27, 28, 29, 30, 31, 32, /* random */
    0x00,                                                                       /* no session id */
    0x00, 0x02, 0x00, 0x2f, /* TLS_RSA_WITH_AES_128_CBC_SHA */
    0x01, 0x00};            /* null compression */

int ferry_cli_sniff(const char *target, char *what, size_t size) {
  uint8_t buf[64];
  ferry_hello_frame hello;
  if (hello_frame(&hello) != 0)
    return -1;
  ssize_t n = ask(target, hello.bytes, hello.len, buf, sizeof buf);
  if (n == -2)
    return -1;
  if (n > 0)
    return classify(buf, (size_t)n, what, size);
  /* Closed or silent: not a ferry engine, which answers a HELLO at once.
   * Other services answer their own first words. */
  static const char http_request[] = "GET / HTTP/1.0\r\n\r\n";
  ssize_t m = ask(target, http_request, sizeof http_request - 1, buf, sizeof buf);
  if (m <= 0)
    m = ask(target, tls_client_hello, sizeof tls_client_hello, buf, sizeof buf);
  if (m > 0)
    return classify(buf, (size_t)m, what, size);
  if (n == 0)
    snprintf(what, size,
             "it closed the connection on ferry's HELLO without an answer, and "
             "answered neither HTTP nor TLS: not a ferry engine");
  else
    snprintf(what, size,
             "it accepted the connection but answered nothing in %d s, and "
             "neither HTTP nor TLS: not a ferry engine, which answers at once",
             ANSWER_MS / 1000);
  return 0;
}
