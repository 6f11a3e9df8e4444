/* tcp_stream.c - plain-socket baselines for bench/run with ferry's memory
 * footprint: BLOCK bytes are sent from a buffer of BLOCK bytes into a
 * receive buffer of the same size, in pieces of at most 1 MiB (ferry's
 * slice, and iperf3's -l 1M). iperf3 reuses one 1 MiB buffer, which stays in
 * the CPU cache; these keep a large block's working set as large as ferry's.
 *
 *   stream: the client sends block after block and never waits, the bound
 *           for pipelined transfers (async batches, large blocks);
 *   ack:    after each block the server answers 8 bytes and the client waits
 *           for them, the bound for one synchronous call per block;
 *   spin:   ack, but both ends poll with MSG_DONTWAIT instead of sleeping in
 *           recv: no wake-up ever goes through an idle CPU. What a
 *           synchronous call could reach by burning a CPU per end.
 *
 * At EOF the server answers with the bytes it received and the CPU time it
 * used; the client prints one JSON line (with latency percentiles per block
 * in ack mode).
 *
 *   tcp_stream server HOST PORT BLOCK MODE      prints "ready port=N"
 *   tcp_stream client HOST PORT BLOCK SECONDS MODE
 * MODE: stream, ack or spin.
 */
#include <errno.h>
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

#define PIECE (1u << 20)

enum mode { MODE_STREAM, MODE_ACK, MODE_SPIN };
static const char *const MODE_NAMES[] = {"stream", "ack", "spin"};
static int recv_flags = MSG_WAITALL; /* MSG_DONTWAIT in spin mode */

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

/* Receives len bytes (a block, an ack, the result) piece by piece; 0 at
 * EOF or on an error, else len. */
static size_t receive_block(int fd, char *buf, size_t len) {
  size_t at = 0;
  while (at < len) {
    size_t want = len - at < PIECE ? len - at : PIECE;
    ssize_t r = recv(fd, buf + at, want, recv_flags);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (r <= 0)
      return 0;
    at += (size_t)r;
  }
  return at;
}

static void send_all(int fd, const char *buf, size_t len, const char *what) {
  size_t at = 0;
  while (at < len) {
    size_t want = len - at < PIECE ? len - at : PIECE;
    ssize_t w = send(fd, buf + at, want, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      die(what);
    at += (size_t)w;
  }
}

static void receive_all(int fd, void *buf, size_t len, const char *what) {
  if (receive_block(fd, buf, len) == 0)
    die(what);
}

static int run_server(const char *host, const char *port, size_t block, enum mode mode) {
  char *buf = buffer(block);
  int fd = accept_one("tcp_stream", host, port);
  uint64_t cpu0 = cpu_ns(), total = 0, reply = 0;
  size_t got;
  while ((got = receive_block(fd, buf, block)) != 0) {
    total += got;
    if (mode != MODE_STREAM)
      send_all(fd, (const char *)&reply, sizeof reply, "send ack");
  }
  uint64_t answer[2] = {total, cpu_ns() - cpu0};
  send_all(fd, (const char *)answer, sizeof answer, "send result");
  close(fd);
  return 0;
}

static int run_client(const char *host, const char *port, size_t block, double seconds,
                      enum mode mode) {
  char *buf = buffer(block);
  int fd = connect_one("tcp_stream", host, port);
  samples lat = {0};
  uint64_t cpu0 = cpu_ns(), start = ferry_now_ns(), end = start + (uint64_t)(seconds * 1e9),
           t = start;
  while (t < end) {
    uint64_t t0 = t, reply;
    send_all(fd, buf, block, "send");
    if (mode != MODE_STREAM)
      receive_all(fd, &reply, sizeof reply, "receive ack");
    t = ferry_now_ns();
    samples_add(&lat, t - t0);
  }
  shutdown(fd, SHUT_WR);
  recv_flags = MSG_WAITALL; /* the server may take a while to answer */
  uint64_t answer[2];
  receive_all(fd, answer, sizeof answer, "receive result");
  double secs = (double)(ferry_now_ns() - start) / 1e9;
  double cpu = (double)(cpu_ns() - cpu0 + answer[1]) / 1e9;
  close(fd);
  samples_sort(&lat);
  printf("{\"block\":%zu,\"mode\":\"%s\",\"bytes\":%llu,\"seconds\":%.4f,\"gbps\":%.4f,"
         "\"cpu_s_per_gb\":%.4f,\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
         block, MODE_NAMES[mode], (unsigned long long)answer[0], secs,
         (double)answer[0] / secs / 1e9, answer[0] ? cpu / ((double)answer[0] / 1e9) : 0.0,
         mode == MODE_STREAM ? 0.0 : samples_pct_us(&lat, 0.50),
         mode == MODE_STREAM ? 0.0 : samples_pct_us(&lat, 0.99));
  free(lat.ns);
  return 0;
}

/* A mode's number, or -1. */
static int parse_mode(const char *name) {
  for (int m = MODE_STREAM; m <= MODE_SPIN; m++)
    if (strcmp(name, MODE_NAMES[m]) == 0)
      return m;
  return -1;
}

static int set_mode(const char *name) {
  int mode = parse_mode(name);
  if (mode == MODE_SPIN)
    recv_flags = MSG_DONTWAIT;
  return mode;
}

int main(int argc, char **argv) {
  if (argc == 6 && strcmp(argv[1], "server") == 0) {
    size_t block = parse_size(argv[4]);
    int mode = set_mode(argv[5]);
    if (block > 0 && mode >= 0)
      return run_server(argv[2], argv[3], block, (enum mode)mode);
  } else if (argc == 7 && strcmp(argv[1], "client") == 0) {
    size_t block = parse_size(argv[4]);
    double seconds = atof(argv[5]);
    int mode = set_mode(argv[6]);
    if (block > 0 && seconds > 0 && mode >= 0)
      return run_client(argv[2], argv[3], block, seconds, (enum mode)mode);
  }
  fprintf(stderr, "usage: tcp_stream server HOST PORT BLOCK stream|ack|spin\n"
                  "       tcp_stream client HOST PORT BLOCK SECONDS stream|ack|spin\n");
  return 2;
}
