/* metrics_http.c - GET /metrics for Prometheus, served by one thread of the
 * engine (config metrics_port, FERRY_METRICS_PORT).
 *
 * A scrape is one short request, so one thread answers one connection at a
 * time; a client that sends nothing, or stops reading, is dropped after
 * METRICS_CLIENT_MS, so it delays other scrapes by at most that, and
 * shutdown (the stop pipe) ends any wait at once. A port that cannot be
 * bound (taken by another process) leaves the engine running without it. Written here rather than
 * linking libmicrohttpd into libferry: 150 lines against a dependency every program that embeds
 * ferry would load. Bound to 127.0.0.1 unless told otherwise. */
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
#define METRICS_REQUEST_MAX 4096

struct ferry_metrics_http {
  ferry_engine *engine;
  int fd;
  int stop[2]; /* a pipe: a byte in it ends the thread */
  uint16_t port;
  pthread_t thread;
};

/* Polls fd for events and the stop pipe; 1 when fd is ready, 0 on stop or
 * timeout. */
static int wait_ready(struct ferry_metrics_http *m, int fd, short events, int timeout_ms) {
  struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = m->stop[0], .events = POLLIN}};
  int n;
  do
    n = poll(p, 2, timeout_ms);
  while (n < 0 && errno == EINTR);
  return n > 0 && !p[1].revents && p[0].revents;
}

/* Reads the request head; 0 once it is complete, -1 otherwise. */
static int read_request(struct ferry_metrics_http *m, int fd, char *buf, size_t size) {
  uint64_t deadline = ferry_now_ns() + METRICS_CLIENT_MS * 1000000ull;
  size_t len = 0;
  while (len < size - 1) {
    if (!wait_ready(m, fd, POLLIN, ferry_ms_left(deadline)))
      return -1;
    ssize_t n = recv(fd, buf + len, size - 1 - len, MSG_DONTWAIT);
    if (n <= 0)
      return -1;
    len += (size_t)n;
    buf[len] = 0;
    if (strstr(buf, "\r\n\r\n") || strstr(buf, "\n\n"))
      return 0;
  }
  return -1;
}

/* Sends until done, the deadline or stop: a client that stops reading
 * holds the thread no longer than one that sends nothing. */
static void send_all(struct ferry_metrics_http *m, int fd, const char *data, size_t len,
                     uint64_t deadline) {
  while (len) {
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR) &&
        wait_ready(m, fd, POLLOUT, ferry_ms_left(deadline)))
      continue;
    if (n <= 0)
      return; /* the client went away, stopped reading, or we are stopping: its loss */
    data += n;
    len -= (size_t)n;
  }
}

static void respond(struct ferry_metrics_http *m, int fd, const char *status, const char *body) {
  uint64_t deadline = ferry_now_ns() + METRICS_CLIENT_MS * 1000000ull;
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   status, strlen(body));
  send_all(m, fd, head, (size_t)n, deadline);
  send_all(m, fd, body, strlen(body), deadline);
}

static int is_metrics_get(const char *req) {
  static const char prefix[] = "GET /metrics";
  if (strncmp(req, prefix, sizeof prefix - 1))
    return 0;
  char next = req[sizeof prefix - 1];
  return next == ' ' || next == '?';
}

static void serve_client(struct ferry_metrics_http *m, int fd) {
  char req[METRICS_REQUEST_MAX];
  if (read_request(m, fd, req, sizeof req))
    return;
  if (!is_metrics_get(req)) {
    respond(m, fd, "404 Not Found", "only GET /metrics is served here\n");
    return;
  }
  ferry_stats *s = NULL;
  char *text = NULL;
  if (ferry_stats_snapshot(m->engine, &s) || ferry_stats_prometheus(s, &text))
    respond(m, fd, "503 Service Unavailable", ferry_last_error());
  else
    respond(m, fd, "200 OK", text);
  free(text);
  ferry_stats_free(s);
}

static void *metrics_thread(void *arg) {
  struct ferry_metrics_http *m = arg;
  while (wait_ready(m, m->fd, POLLIN, -1)) {
    int fd = accept4(m->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      continue; /* the client gave up before we took it, or fds ran out: next one */
    serve_client(m, fd);
    close(fd);
  }
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
