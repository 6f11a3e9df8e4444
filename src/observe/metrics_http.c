/* metrics_http.c - GET /metrics for Prometheus, served by one thread of the
 * engine (config metrics_port, FERRY_METRICS_PORT).
 *
 * The thread multiplexes its clients with poll(): each one reads its
 * request head, then is sent its answer, without blocking, so a client
 * that sends nothing or stops reading delays nobody else. Each has
 * METRICS_CLIENT_MS to be done, and at most METRICS_CLIENTS_MAX are open
 * (past that the oldest is dropped for the newcomer), so a scrape is
 * answered as soon as its request is in, whatever other clients do.
 * Shutdown (the stop pipe) ends the thread at once. A port that cannot be
 * bound (taken by another process) leaves the engine running without it.
 * Written here rather than linking libmicrohttpd into libferry: 200 lines
 * against a dependency every program that embeds ferry would load. Bound
 * to 127.0.0.1 unless told otherwise. */
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
#include "core/engine.h"
#include "observe.h"

#define METRICS_CLIENT_MS 2000
#define METRICS_CLIENTS_MAX 32
#define METRICS_REQUEST_MAX 4096

/* One client: reading its request head until out is set, then sending out. */
typedef struct metrics_client {
  int fd;
  uint64_t deadline_ns;
  size_t len; /* of the request head read so far */
  char request[METRICS_REQUEST_MAX];
  char *out; /* the whole answer, once the request is in */
  size_t out_len, sent;
} metrics_client;

struct ferry_metrics_http {
  ferry_engine *engine;
  int fd;
  int stop[2]; /* a pipe: a byte in it ends the thread */
  uint16_t port;
  pthread_t thread;
  metrics_client *clients[METRICS_CLIENTS_MAX];
  unsigned count;
};

static int is_metrics_get(const char *req) {
  static const char prefix[] = "GET /metrics";
  if (strncmp(req, prefix, sizeof prefix - 1))
    return 0;
  char next = req[sizeof prefix - 1];
  return next == ' ' || next == '?';
}

/* The whole HTTP answer, malloc'd; NULL when out of memory. */
static char *answer(const char *status, const char *body, size_t *len) {
  static const char head[] =
      "HTTP/1.1 %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
      "Content-Length: %zu\r\nConnection: close\r\n\r\n%s";
  size_t body_len = strlen(body);
  size_t size = sizeof head + strlen(status) + 24 + body_len;
  char *out = malloc(size);
  int n = out ? snprintf(out, size, head, status, body_len, body) : -1;
  *len = n > 0 ? (size_t)n : 0;
  return out;
}

static char *answer_request(struct ferry_metrics_http *m, const char *req, size_t *len) {
  if (!is_metrics_get(req))
    return answer("404 Not Found", "only GET /metrics is served here\n", len);
  ferry_stats *s = NULL;
  char *text = NULL, *out;
  if (ferry_stats_snapshot(m->engine, &s) || ferry_stats_prometheus(s, &text))
    out = answer("503 Service Unavailable", ferry_last_error(), len);
  else
    out = answer("200 OK", text, len);
  free(text);
  ferry_stats_free(s);
  return out;
}

static void drop_client(struct ferry_metrics_http *m, unsigned i) {
  metrics_client *c = m->clients[i];
  close(c->fd);
  free(c->out);
  free(c);
  m->clients[i] = m->clients[--m->count];
}

/* Reads what the client sent; once its head is in, its answer is ready to
 * send. 0 to keep it, -1 to drop it (gone, or a head too long). */
static int client_read(struct ferry_metrics_http *m, metrics_client *c) {
  ssize_t n = recv(c->fd, c->request + c->len, sizeof c->request - 1 - c->len, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return 0;
  if (n <= 0)
    return -1;
  c->len += (size_t)n;
  c->request[c->len] = 0;
  if (strstr(c->request, "\r\n\r\n") || strstr(c->request, "\n\n")) {
    c->out = answer_request(m, c->request, &c->out_len);
    return c->out ? 0 : -1;
  }
  return c->len < sizeof c->request - 1 ? 0 : -1;
}

/* Sends what the socket takes; 1 once all is sent, 0 for more, -1 on error. */
static int client_write(metrics_client *c) {
  ssize_t n = send(c->fd, c->out + c->sent, c->out_len - c->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return 0;
  if (n <= 0)
    return -1;
  c->sent += (size_t)n;
  return c->sent == c->out_len;
}

/* Takes every pending connection; when all slots are taken, the client
 * that has been there longest makes room. */
static void accept_clients(struct ferry_metrics_http *m) {
  int fd;
  while ((fd = accept4(m->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
    metrics_client *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    if (m->count == METRICS_CLIENTS_MAX) {
      unsigned oldest = 0;
      for (unsigned i = 1; i < m->count; i++)
        if (m->clients[i]->deadline_ns < m->clients[oldest]->deadline_ns)
          oldest = i;
      FERRY_DEBUG("metrics endpoint: %u clients open, the most; dropping the oldest", m->count);
      drop_client(m, oldest);
    }
    c->fd = fd;
    c->deadline_ns = ferry_now_ns() + METRICS_CLIENT_MS * 1000000ull;
    m->clients[m->count++] = c;
  }
}

/* Moves client i on by what poll saw (revents); drops it when done, gone,
 * or past its time. */
static void serve_client(struct ferry_metrics_http *m, unsigned i, short revents, uint64_t now) {
  metrics_client *c = m->clients[i];
  int rc = 0;
  if (revents & (POLLERR | POLLHUP | POLLNVAL))
    rc = -1;
  else if (revents & POLLIN && !c->out)
    rc = client_read(m, c);
  if (!rc && c->out) /* at once: the socket takes a small answer whole */
    rc = client_write(c);
  if (rc || now >= c->deadline_ns)
    drop_client(m, i);
}

/* Polls the stop pipe, the listening socket and every client; ms until
 * the earliest client deadline, or -1 with none. */
static int poll_timeout(const struct ferry_metrics_http *m) {
  uint64_t first = 0;
  for (unsigned i = 0; i < m->count; i++)
    if (!first || m->clients[i]->deadline_ns < first)
      first = m->clients[i]->deadline_ns;
  return first ? ferry_ms_left(first) : -1;
}

static void *metrics_thread(void *arg) {
  struct ferry_metrics_http *m = arg;
  struct pollfd p[METRICS_CLIENTS_MAX + 2];
  for (;;) {
    p[0] = (struct pollfd){.fd = m->stop[0], .events = POLLIN};
    p[1] = (struct pollfd){.fd = m->fd, .events = POLLIN};
    unsigned n = m->count;
    for (unsigned i = 0; i < n; i++)
      p[i + 2] =
          (struct pollfd){.fd = m->clients[i]->fd, .events = m->clients[i]->out ? POLLOUT : POLLIN};
    if (poll(p, n + 2, poll_timeout(m)) < 0 && errno != EINTR)
      break;
    if (p[0].revents)
      break;
    uint64_t now = ferry_now_ns();
    for (unsigned i = n; i-- > 0;) /* from the end: a drop moves the last into i */
      serve_client(m, i, p[i + 2].revents, now);
    if (p[1].revents & POLLIN)
      accept_clients(m);
  }
  while (m->count)
    drop_client(m, m->count - 1);
  return NULL;
}

static void metrics_free(struct ferry_metrics_http *m) {
  if (m->fd >= 0)
    close(m->fd);
  close(m->stop[0]);
  close(m->stop[1]);
  free(m);
}

ferry_status ferry_metrics_http_start(ferry_engine *e) {
  if (e->cfg.metrics_port < 0)
    return FERRY_OK;
  struct ferry_metrics_http *m = calloc(1, sizeof *m);
  if (!m)
    return ferry_fail(FERRY_ENOMEM, "no memory for the metrics endpoint");
  m->engine = e;
  m->fd = -1;
  if (pipe2(m->stop, O_CLOEXEC) < 0) {
    free(m);
    return ferry_fail_errno(FERRY_ENOMEM, errno, "metrics endpoint: no pipe");
  }
  const char *host = e->cfg.metrics_host ? e->cfg.metrics_host : "127.0.0.1";
  ferry_status st = ferry_net_listen(host, (uint16_t)e->cfg.metrics_port, &m->fd, &m->port);
  if (!st && fcntl(m->fd, F_SETFL, O_NONBLOCK) < 0) /* accept never waits for a gone client */
    st = ferry_fail_errno(FERRY_ESOCKET, errno, "metrics endpoint: fcntl");
  if (!st && pthread_create(&m->thread, NULL, metrics_thread, m) != 0)
    st = ferry_fail(FERRY_ENOMEM, "metrics endpoint: cannot start its thread");
  if (st) {
    /* Several processes of one server given the same FERRY_METRICS_PORT
     * must not lose their engines over it: said loudly, then without. */
    FERRY_WARN("engine %s runs without its metrics endpoint on %s port %d: %s", e->name, host,
               e->cfg.metrics_port, ferry_last_error());
    metrics_free(m);
    return FERRY_OK;
  }
  e->metrics_http = m;
  if (!ferry_net_loopback_only(m->fd))
    FERRY_WARN("engine %s serves metrics on %s port %u, beyond loopback: whoever reaches it reads "
               "the names of its peers and what moved between them",
               e->name, host, m->port);
  FERRY_INFO("engine %s serves metrics on http://%s:%u/metrics", e->name, host, m->port);
  return FERRY_OK;
}

void ferry_metrics_http_stop(ferry_engine *e) {
  struct ferry_metrics_http *m = e->metrics_http;
  if (!m)
    return;
  ssize_t unused = write(m->stop[1], "x", 1);
  (void)unused;
  pthread_join(m->thread, NULL);
  metrics_free(m);
  e->metrics_http = NULL;
}

uint16_t ferry_engine_metrics_port(const ferry_engine *e) {
  return e && e->metrics_http ? e->metrics_http->port : 0;
}
