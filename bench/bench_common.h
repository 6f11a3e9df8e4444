/* bench_common.h - the few helpers the small baseline programs of bench/
 * share: a monotonic clock, size parsing ("4K", "16M") and address
 * resolution. Header-only, since bench/run compiles each program alone. */
#ifndef FERRY_BENCH_COMMON_H
#define FERRY_BENCH_COMMON_H

#include <ctype.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

/* Listens on host:port, prints "ready port=N" (the port really bound, for
 * port 0) and returns the one connection a client makes. Exits on failure. */
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
  return fd;
}

#endif
