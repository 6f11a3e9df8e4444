/* bench_common.h - the few helpers the small baseline programs of bench/
 * share: size parsing ("4K", "16M"), address resolution and latency
 * samples, plus the engine's own clock (ferry_now_ns). Header-only, since
 * bench/run compiles each program alone. */
#ifndef FERRY_BENCH_COMMON_H
#define FERRY_BENCH_COMMON_H

#include <ctype.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../src/base/clock.h"

static inline size_t parse_size(const char *s) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  switch (toupper((unsigned char)*end)) {
  case 'K': v <<= 10; break;
  case 'M': v <<= 20; break;
  case 'G': v <<= 30; break;
  default: break;
  }
  return (size_t)v;
}

/* getaddrinfo for a TCP socket; exits with a message naming prog on failure. */
static inline struct addrinfo *resolve(const char *prog, const char *host, const char *port,
                                       int passive) {
  struct addrinfo hints = {0}, *ai;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  int rc = getaddrinfo(host, port, &hints, &ai);
  if (rc != 0) {
    fprintf(stderr, "%s: resolve %s: %s\n", prog, host, gai_strerror(rc));
    exit(1);
  }
  return ai;
}

/* TCP_NODELAY, as ferry sets it: small messages leave at once. */
static inline void set_nodelay(const char *prog, int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) {
    perror(prog);
    exit(1);
  }
}

/* Listens on host:port, prints "ready port=N" (the port really bound, for
 * port 0) and returns the one connection a client makes, with TCP_NODELAY.
 * Exits on failure. */
static inline int accept_one(const char *prog, const char *host, const char *port) {
  struct addrinfo *ai = resolve(prog, host, port, 1);
  int lfd = socket(ai->ai_family, SOCK_STREAM, 0), one = 1;
  if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      bind(lfd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(lfd, 1) < 0) {
    perror(prog);
    exit(1);
  }
  freeaddrinfo(ai);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  getsockname(lfd, (struct sockaddr *)&ss, &len);
  printf("ready port=%u\n",
         ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                        : ((struct sockaddr_in *)&ss)->sin_port));
  fflush(stdout);
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) {
    perror(prog);
    exit(1);
  }
  close(lfd);
  set_nodelay(prog, fd);
  return fd;
}

/* Connects to host:port and returns the socket, with TCP_NODELAY. Exits on
 * failure. */
static inline int connect_one(const char *prog, const char *host, const char *port) {
  struct addrinfo *ai = resolve(prog, host, port, 0);
  int fd = socket(ai->ai_family, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
    perror(prog);
    exit(1);
  }
  freeaddrinfo(ai);
  set_nodelay(prog, fd);
  return fd;
}

/* Per-operation latencies, sorted at the end for percentiles. */
typedef struct samples {
  uint64_t *ns;
  size_t n, cap;
} samples;

static inline void samples_add(samples *s, uint64_t ns) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 1 << 16;
    uint64_t *grown = realloc(s->ns, s->cap * sizeof *grown);
    if (!grown) {
      perror("realloc");
      exit(1);
    }
    s->ns = grown;
  }
  s->ns[s->n++] = ns;
}

static inline int samples_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static inline void samples_sort(samples *s) { qsort(s->ns, s->n, sizeof *s->ns, samples_cmp); }

/* Percentile p (0..1) of sorted samples, in microseconds; 0 when empty. */
static inline double samples_pct_us(const samples *s, double p) {
  if (!s->n)
    return 0;
  size_t rank = (size_t)(p * (double)s->n + 0.999999);
  rank = rank < 1 ? 1 : rank > s->n ? s->n : rank;
  return (double)s->ns[rank - 1] / 1e3;
}

static inline double samples_mean_us(const samples *s) {
  double sum = 0;
  for (size_t i = 0; i < s->n; i++)
    sum += (double)s->ns[i];
  return s->n ? sum / (double)s->n / 1e3 : 0;
}

#endif
