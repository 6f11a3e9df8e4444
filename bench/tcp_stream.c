/* tcp_stream.c - plain-socket bulk baseline for bench/run: one TCP stream
 * that sends a buffer of BLOCK bytes over and over into a receive buffer of
 * the same size, so that its memory footprint matches a ferry transfer of
 * that block size (iperf3 cannot go past 1 MiB buffers, which stay in
 * cache). The server answers EOF with the bytes it received and the CPU
 * time it used; the client prints one JSON line.
 *
 *   tcp_stream server [HOST [PORT]] BLOCK   prints "ready port=N"
 *   tcp_stream client HOST PORT BLOCK [SECONDS]
 */
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"

static void die(const char *what) {
  fprintf(stderr, "tcp_stream: %s: %s\n", what, strerror(errno));
  exit(1);
}

static uint64_t cpu_ns(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
         ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

/* A buffer with every page faulted in, so first touches are not timed. */
static char *buffer(size_t n) {
  char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    die("mmap");
  memset(p, 0x3c, n);
  return p;
}

static int run_server(const char *host, const char *port, size_t block) {
  char *buf = buffer(block);
  int fd = accept_one("tcp_stream", host, port);
  uint64_t cpu0 = cpu_ns(), total = 0;
  size_t at = 0;
  for (;;) {
    ssize_t r = recv(fd, buf + at, block - at, MSG_WAITALL);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    total += (uint64_t)r;
    at = (at + (size_t)r) % block;
  }
  uint64_t answer[2] = {total, cpu_ns() - cpu0};
  if (send(fd, answer, sizeof answer, MSG_NOSIGNAL) != (ssize_t)sizeof answer)
    die("send result");
  close(fd);
  return 0;
}

static int run_client(const char *host, const char *port, size_t block, double seconds) {
  char *buf = buffer(block);
  struct addrinfo *ai = resolve("tcp_stream", host, port, 0);
  int fd = socket(ai->ai_family, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0)
    die("connect");
  freeaddrinfo(ai);
  uint64_t cpu0 = cpu_ns(), start = now_ns(), end = start + (uint64_t)(seconds * 1e9);
  while (now_ns() < end) {
    size_t at = 0;
    while (at < block) {
      ssize_t w = send(fd, buf + at, block - at, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0)
        die("send");
      at += (size_t)w;
    }
  }
  shutdown(fd, SHUT_WR);
  uint64_t answer[2];
  size_t got = 0;
  while (got < sizeof answer) {
    ssize_t r = recv(fd, (char *)answer + got, sizeof answer - got, 0);
    if (r <= 0)
      die("receive result");
    got += (size_t)r;
  }
  double secs = (double)(now_ns() - start) / 1e9;
  double cpu = (double)(cpu_ns() - cpu0 + answer[1]) / 1e9;
  close(fd);
  printf("{\"block\":%zu,\"bytes\":%llu,\"seconds\":%.4f,\"gbps\":%.4f,\"cpu_s_per_gb\":%.4f}\n",
         block, (unsigned long long)answer[0], secs, (double)answer[0] / secs / 1e9,
         answer[0] ? cpu / ((double)answer[0] / 1e9) : 0.0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "server") == 0) {
    const char *host = argc > 4 ? argv[2] : "127.0.0.1";
    const char *port = argc > 4 ? argv[3] : "0";
    size_t block = parse_size(argv[argc - 1]);
    if (block > 0)
      return run_server(host, port, block);
  } else if (argc >= 5 && strcmp(argv[1], "client") == 0) {
    size_t block = parse_size(argv[4]);
    double seconds = argc > 5 ? atof(argv[5]) : 2.0;
    if (block > 0 && seconds > 0)
      return run_client(argv[2], argv[3], block, seconds);
  }
  fprintf(stderr, "usage: tcp_stream server [HOST PORT] BLOCK\n"
                  "       tcp_stream client HOST PORT BLOCK [SECONDS]\n");
  return 2;
}
