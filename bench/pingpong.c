/* pingpong.c - TCP round-trip baseline for bench/run: the client sends a
 * small message, the server echoes it back, and the client records every
 * round trip. The server serves one connection and exits, like `iperf3 -1`.
 *
 *   pingpong server [HOST [PORT]]     prints "ready port=N", echoes until EOF
 *   pingpong client HOST PORT [SIZE [SECONDS]]
 *                                     prints one JSON line with p50/p99 in us
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"

#define MAX_MSG 65536
#define WARMUP_ROUNDS 1000

static void die(const char *what) {
  fprintf(stderr, "pingpong: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, char *p, size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int run_server(const char *host, const char *port) {
  int fd = accept_one("pingpong", host, port);
  static char buf[MAX_MSG];
  for (;;) {
    ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    if (write_all(fd, buf, (size_t)r) != 0)
      break;
  }
  close(fd);
  return 0;
}

static int run_client(const char *host, const char *port, size_t size, double seconds) {
  int fd = connect_one("pingpong", host, port);
  static char msg[MAX_MSG], back[MAX_MSG];
  memset(msg, 0x5a, size);
  samples rtt = {0};
  for (int i = 0; i < WARMUP_ROUNDS; i++)
    if (write_all(fd, msg, size) || read_all(fd, back, size))
      die("warm-up round trip");
  uint64_t start = ferry_now_ns(), end = start + (uint64_t)(seconds * 1e9), t = start;
  while (t < end) {
    uint64_t t0 = ferry_now_ns();
    if (write_all(fd, msg, size) || read_all(fd, back, size))
      die("round trip");
    t = ferry_now_ns();
    samples_add(&rtt, t - t0);
  }
  close(fd);
  samples_sort(&rtt);
  printf("{\"size\":%zu,\"count\":%zu,\"p50_us\":%.2f,\"p99_us\":%.2f,\"mean_us\":%.2f}\n", size,
         rtt.n, samples_pct_us(&rtt, 0.50), samples_pct_us(&rtt, 0.99), samples_mean_us(&rtt));
  free(rtt.ns);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "server") == 0)
    return run_server(argc > 2 ? argv[2] : "127.0.0.1", argc > 3 ? argv[3] : "0");
  if (argc >= 4 && strcmp(argv[1], "client") == 0) {
    long size = argc > 4 ? atol(argv[4]) : 64;
    double seconds = argc > 5 ? atof(argv[5]) : 2.0;
    if (size < 1 || size > MAX_MSG || !(seconds > 0)) {
      fprintf(stderr, "pingpong: size must be 1..%d and seconds > 0\n", MAX_MSG);
      return 2;
    }
    return run_client(argv[2], argv[3], (size_t)size, seconds);
  }
  fprintf(stderr, "usage: pingpong server [HOST [PORT]]\n"
                  "       pingpong client HOST PORT [SIZE [SECONDS]]\n");
  return 2;
}
