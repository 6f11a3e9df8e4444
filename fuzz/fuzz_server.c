/* fuzz_server.c - a real target engine fed by the fuzzer: each input is
 * what one peer sends on one TCP connection to the engine's RPC port on
 * 127.0.0.1 (handshake, then any frames), followed by end of stream. The
 * first byte picks the engine: without a secret (so inputs reach WRITE,
 * READ, NOTIFY and REGIONS handling) or with one (the AUTH path). Both
 * register one buffer at FUZZ_SERVER_BUF. The harness reads every reply
 * while it sends, and requires the engine to close the connection once the
 * input ends: a thread that keeps it open would be a hang.
 *
 * The engine's own accept loop and threads serve the connection, exactly
 * as in production; a socketpair could not be handed to it without a new
 * private entry point (see RELIABILITY.md, fuzzing). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"
#include "fuzz.h"

static ferry_engine *engines[2];

static void start(void) {
  ferry_log_set_level(FERRY_LOG_OFF);
  void *buf = mmap((void *)(uintptr_t)FUZZ_SERVER_BUF, FUZZ_SERVER_BUF_SIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  FUZZ_CHECK(buf == (void *)(uintptr_t)FUZZ_SERVER_BUF);
  for (int i = 0; i < 2; i++) {
    ferry_config cfg;
    fuzz_loopback_config(&cfg);
    cfg.connect_timeout_ms = 2000;
    cfg.secret = i ? FUZZ_SERVER_SECRET : NULL;
    FUZZ_CHECK(ferry_engine_create(&cfg, &engines[i]) == FERRY_OK);
    FUZZ_CHECK(ferry_memory_register(engines[i], buf, FUZZ_SERVER_BUF_SIZE) == FERRY_OK);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!engines[0])
    start();
  if (size < 1)
    return 0;
  ferry_engine *e = engines[data[0] & 1];
  data++;
  size--;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  FUZZ_CHECK(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ferry_engine_port(e))};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS)
    FUZZ_CHECK(!"connect to the engine");
  size_t sent = 0;
  int wrote_eof = 0, eof = 0;
  double deadline = now_s() + 10;
  char sink[65536];
  while (!eof) {
    if (sent == size && !wrote_eof) {
      shutdown(fd, SHUT_WR);
      wrote_eof = 1;
    }
    struct pollfd p = {fd, POLLIN | (wrote_eof ? 0 : POLLOUT), 0};
    int left = (int)((deadline - now_s()) * 1000);
    if (left <= 0) {
      fprintf(stderr, "fuzz_server: the engine kept the connection open 10 s after the input "
                      "ended\n");
      abort();
    }
    if (poll(&p, 1, left) <= 0)
      continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = recv(fd, sink, sizeof sink, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
        eof = 1;
    }
    if (!wrote_eof && (p.revents & POLLOUT)) {
      ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0)
        sent += (size_t)n;
      else if (n < 0 && errno != EAGAIN && errno != EINTR)
        sent = size; /* the engine closed on us: fine, stop sending */
    }
  }
  close(fd);
  ferry_notification *list;
  size_t count;
  if (ferry_notify_drain(e, &list, &count) == FERRY_OK)
    ferry_notify_free(list, count);
  return 0;
}
