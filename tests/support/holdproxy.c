/* holdproxy.c - see holdproxy.h. Two threads per connection: one copies
 * the initiator's bytes as they come (or parks them in a blackhole, or
 * paces them on a slow link), the other cuts the target's stream into
 * frames (header + body_len bytes) and parks a held frame's header until
 * release. */
#include "holdproxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "wire/wire.h"

#define PROXY_MAX_CONNS 64

typedef struct proxy_conn {
  hold_proxy *proxy;
  int client, server;
  pthread_t up, down;
  int parked;    /* a blackhole parked a piece of it */
  int down_done; /* nothing more goes to the initiator */
} proxy_conn;

struct hold_proxy {
  int listen_fd;
  uint16_t target_port;
  char target[32];
  pthread_t acceptor;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int hold_type; /* -1: none */
  int blackhole;
  size_t piece;    /* slow link: bytes per step (0: as they come) */
  unsigned gap_ms; /* and the pause after each */
  unsigned held;
  int stopping;
  proxy_conn conns[PROXY_MAX_CONNS];
  unsigned count;
};

static int send_all(int fd, const void *buf, size_t len) {
  for (size_t done = 0; done < len;) {
    ssize_t n = send(fd, (const char *)buf + done, len - done, MSG_NOSIGNAL);
    if (n <= 0)
      return -1;
    done += (size_t)n;
  }
  return 0;
}

static int recv_all(int fd, void *buf, size_t len) {
  for (size_t done = 0; done < len;) {
    ssize_t n = recv(fd, (char *)buf + done, len - done, 0);
    if (n <= 0)
      return -1;
    done += (size_t)n;
  }
  return 0;
}

/* Copies len bytes from one socket to the other. */
static int forward(int from, int to, uint64_t len) {
  char buf[64 * 1024];
  while (len) {
    size_t want = len < sizeof buf ? (size_t)len : sizeof buf;
    ssize_t n = recv(from, buf, want, 0);
    if (n <= 0 || send_all(to, buf, (size_t)n) < 0)
      return -1;
    len -= (uint64_t)n;
  }
  return 0;
}

/* Waits, with the lock, while the proxy is a blackhole. Nonzero when it
 * stopped meanwhile: what waited is dropped, as by a link that died. */
static int blackhole_wait_locked(hold_proxy *p) {
  while (p->blackhole && !p->stopping)
    pthread_cond_wait(&p->cond, &p->lock);
  return p->stopping;
}

/* A piece read from the initiator waits out a blackhole. */
static int park_piece(proxy_conn *c) {
  hold_proxy *p = c->proxy;
  pthread_mutex_lock(&p->lock);
  if (p->blackhole && !p->stopping) {
    c->parked = 1;
    pthread_cond_broadcast(&p->cond);
  }
  int dropped = blackhole_wait_locked(p);
  pthread_mutex_unlock(&p->lock);
  return dropped;
}

/* The pause of a slow link after each piece (pacing, not ordering). */
static void pace(const hold_proxy *p) {
  struct timespec gap = {p->gap_ms / 1000, (long)(p->gap_ms % 1000) * 1000000L};
  if (p->gap_ms)
    nanosleep(&gap, NULL);
}

static void *up_main(void *arg) {
  proxy_conn *c = arg;
  char buf[64 * 1024];
  size_t want = c->proxy->piece && c->proxy->piece < sizeof buf ? c->proxy->piece : sizeof buf;
  ssize_t n;
  while ((n = recv(c->client, buf, want, 0)) > 0 && !park_piece(c) &&
         send_all(c->server, buf, (size_t)n) == 0)
    pace(c->proxy);
  shutdown(c->server, SHUT_WR);
  return NULL;
}

/* Parks a frame of the held type until release (or stop), and any frame
 * while the proxy is a blackhole. Nonzero when the proxy stopped
 * meanwhile: the frame is dropped, never delivered, as by a link that
 * died with it. */
static int maybe_hold(hold_proxy *p, uint8_t type) {
  pthread_mutex_lock(&p->lock);
  int dropped = 0;
  if (p->hold_type == type && !p->stopping) {
    p->held++;
    pthread_cond_broadcast(&p->cond);
    while (p->hold_type == type && !p->stopping)
      pthread_cond_wait(&p->cond, &p->lock);
    p->held--;
    dropped = p->stopping;
  }
  dropped = dropped || blackhole_wait_locked(p);
  pthread_mutex_unlock(&p->lock);
  return dropped;
}

static void down_done(proxy_conn *c) {
  pthread_mutex_lock(&c->proxy->lock);
  c->down_done = 1;
  pthread_cond_broadcast(&c->proxy->cond);
  pthread_mutex_unlock(&c->proxy->lock);
}

static void *down_main(void *arg) {
  proxy_conn *c = arg;
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  ferry_frame_header h;
  while (recv_all(c->server, raw, sizeof raw) == 0 && ferry_wire_header_decode(raw, &h) == 0) {
    if (maybe_hold(c->proxy, h.type) || send_all(c->client, raw, sizeof raw) < 0 ||
        forward(c->server, c->client, h.body_len) < 0)
      break;
  }
  shutdown(c->client, SHUT_WR);
  down_done(c);
  return NULL;
}

static int connect_target(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
    return fd;
  if (fd >= 0)
    close(fd);
  return -1;
}

static void *accept_main(void *arg) {
  hold_proxy *p = arg;
  for (;;) {
    int client = accept(p->listen_fd, NULL, NULL);
    if (client < 0)
      return NULL; /* stop shut the listener down */
    int server = connect_target(p->target_port);
    pthread_mutex_lock(&p->lock);
    if (server < 0 || p->stopping || p->count == PROXY_MAX_CONNS) {
      pthread_mutex_unlock(&p->lock);
      close(client);
      if (server >= 0)
        close(server);
      continue;
    }
    proxy_conn *c = &p->conns[p->count++];
    *c = (proxy_conn){.proxy = p, .client = client, .server = server};
    pthread_create(&c->up, NULL, up_main, c);
    pthread_create(&c->down, NULL, down_main, c);
    pthread_mutex_unlock(&p->lock);
  }
}

static hold_proxy *start(uint16_t port, uint16_t target_port, size_t piece, unsigned gap_ms) {
  hold_proxy *p = calloc(1, sizeof *p);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  socklen_t len = sizeof a;
  int one = 1, rcvbuf = (int)piece;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  p->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (p->listen_fd >= 0) /* a port of an earlier proxy, its closed connections in TIME_WAIT */
    setsockopt(p->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (p->listen_fd >= 0 && piece) /* before listen: accepted sockets inherit it */
    setsockopt(p->listen_fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      listen(p->listen_fd, 64) < 0 || getsockname(p->listen_fd, (struct sockaddr *)&a, &len) < 0) {
    if (p->listen_fd >= 0)
      close(p->listen_fd);
    free(p);
    return NULL;
  }
  p->target_port = target_port;
  p->hold_type = -1;
  p->piece = piece;
  p->gap_ms = gap_ms;
  snprintf(p->target, sizeof p->target, "127.0.0.1:%u", ntohs(a.sin_port));
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  pthread_create(&p->acceptor, NULL, accept_main, p);
  return p;
}

hold_proxy *hold_proxy_start(uint16_t target_port) { return start(0, target_port, 0, 0); }

hold_proxy *hold_proxy_start_on(uint16_t port, uint16_t target_port) {
  return start(port, target_port, 0, 0);
}

hold_proxy *hold_proxy_start_slow(uint16_t target_port, size_t piece, unsigned gap_ms) {
  return start(0, target_port, piece, gap_ms);
}

const char *hold_proxy_target(const hold_proxy *p) { return p->target; }

void hold_proxy_hold(hold_proxy *p, uint8_t frame_type) {
  pthread_mutex_lock(&p->lock);
  p->hold_type = frame_type;
  pthread_mutex_unlock(&p->lock);
}

void hold_proxy_blackhole(hold_proxy *p) {
  pthread_mutex_lock(&p->lock);
  p->blackhole = 1;
  pthread_mutex_unlock(&p->lock);
}

static struct timespec time_after(int timeout_ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  return until;
}

/* With the lock: connections with a parked piece still open toward their
 * initiator. */
static unsigned undrained_locked(const hold_proxy *p) {
  unsigned n = 0;
  for (unsigned i = 0; i < p->count; i++)
    n += p->conns[i].parked && !p->conns[i].down_done;
  return n;
}

int hold_proxy_wait_drained(hold_proxy *p, int timeout_ms) {
  struct timespec until = time_after(timeout_ms);
  int rc = 0;
  pthread_mutex_lock(&p->lock);
  while (undrained_locked(p) && rc == 0)
    rc = pthread_cond_timedwait(&p->cond, &p->lock, &until);
  int ok = !undrained_locked(p);
  pthread_mutex_unlock(&p->lock);
  return ok ? 0 : -1;
}

int hold_proxy_wait_held(hold_proxy *p, unsigned count, int timeout_ms) {
  struct timespec until = time_after(timeout_ms);
  int rc = 0;
  pthread_mutex_lock(&p->lock);
  while (p->held < count && rc == 0)
    rc = pthread_cond_timedwait(&p->cond, &p->lock, &until);
  int ok = p->held >= count;
  pthread_mutex_unlock(&p->lock);
  return ok ? 0 : -1;
}

void hold_proxy_release(hold_proxy *p) {
  pthread_mutex_lock(&p->lock);
  p->hold_type = -1;
  p->blackhole = 0;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
}

void hold_proxy_stop(hold_proxy *p) {
  pthread_mutex_lock(&p->lock);
  p->stopping = 1;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  shutdown(p->listen_fd, SHUT_RDWR);
  pthread_join(p->acceptor, NULL);
  for (unsigned i = 0; i < p->count; i++) {
    shutdown(p->conns[i].client, SHUT_RDWR);
    shutdown(p->conns[i].server, SHUT_RDWR);
    pthread_join(p->conns[i].up, NULL);
    pthread_join(p->conns[i].down, NULL);
    close(p->conns[i].client);
    close(p->conns[i].server);
  }
  close(p->listen_fd);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->cond);
  free(p);
}
