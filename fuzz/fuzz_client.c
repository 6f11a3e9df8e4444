/* fuzz_client.c - a hostile target, from the initiator's side: the engine
 * under test dials a fake target on 127.0.0.1 whose every answer comes from
 * the fuzz input, and runs one public call against it. Input: one byte
 * picking the call (regions, READ, WRITE, notify, probe), then for each
 * connection the engine opens, in order, "u16 length | bytes" that the fake
 * target sends after reading the HELLO, before closing its side. The call
 * must end (error or success) without crashing or hanging; a READ that
 * reports success must have filled the buffer from a well-formed reply. A
 * fresh engine per input, so no cached peer state leaks across inputs. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ferry.h"
#include "fuzz.h"

#define MAX_CONNS 6

static int listen_fd = -1;
static uint16_t listen_port;

typedef struct script {
  const uint8_t *part[MAX_CONNS];
  size_t len[MAX_CONNS];
  int wake[2];
  int accepted[MAX_CONNS];
  int naccepted;
} script;

static void start(void) {
  ferry_log_set_level(FERRY_LOG_OFF);
  listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  FUZZ_CHECK(bind(listen_fd, (struct sockaddr *)&a, sizeof a) == 0);
  FUZZ_CHECK(listen(listen_fd, 16) == 0);
  getsockname(listen_fd, (struct sockaddr *)&a, &len);
  listen_port = ntohs(a.sin_port);
}

static void send_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0)
      return;
    p += w;
    n -= (size_t)w;
  }
}

/* Accepts the engine's connections one by one and answers each from the
 * script until the main thread says the call is over. */
static void *fake_target(void *arg) {
  script *s = arg;
  for (;;) {
    struct pollfd p[2] = {{listen_fd, POLLIN, 0}, {s->wake[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR)
      break;
    if (p[1].revents)
      break;
    if (!(p[0].revents & POLLIN))
      continue;
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      continue;
    if (s->naccepted >= MAX_CONNS) {
      close(fd);
      continue;
    }
    int i = s->naccepted;
    s->accepted[s->naccepted++] = fd;
    /* Take the HELLO (bounded wait), then answer from the script. */
    uint8_t hello[32 + 512];
    struct pollfd r = {fd, POLLIN, 0};
    if (poll(&r, 1, 200) > 0 && recv(fd, hello, sizeof hello, 0) < 0)
      continue;
    if (s->part[i])
      send_all(fd, s->part[i], s->len[i]);
    shutdown(fd, SHUT_WR);
  }
  return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (listen_fd < 0)
    start();
  if (size < 1)
    return 0;
  int op = data[0] % 5;
  script s;
  memset(&s, 0, sizeof s);
  size_t pos = 1;
  for (int i = 0; i < MAX_CONNS && pos + 2 <= size; i++) {
    size_t n = (size_t)(data[pos] | data[pos + 1] << 8);
    pos += 2;
    if (n > size - pos)
      n = size - pos;
    s.part[i] = data + pos;
    s.len[i] = n;
    pos += n;
  }
  FUZZ_CHECK(pipe2(s.wake, O_CLOEXEC) == 0);
  pthread_t thread;
  pthread_create(&thread, NULL, fake_target, &s);

  ferry_config cfg;
  fuzz_loopback_config(&cfg);
  cfg.tcp_connections = 2;
  cfg.timeout_ms = 3000;
  cfg.connect_timeout_ms = 3000;
  cfg.checksum = (data[0] / 5) & 1;
  ferry_engine *e;
  FUZZ_CHECK(ferry_engine_create(&cfg, &e) == FERRY_OK);
  static uint8_t local[FUZZ_CLIENT_LEN];
  FUZZ_CHECK(ferry_memory_register(e, local, sizeof local) == FERRY_OK);
  char target[32];
  snprintf(target, sizeof target, "127.0.0.1:%u", listen_port);
  ferry_region *regions = NULL;
  size_t count = 0;
  ferry_status st;
  switch (op) {
  case 0:
    st = ferry_peer_regions(e, target, &regions, &count);
    if (st == FERRY_OK)
      for (size_t i = 1; i < count; i++)
        FUZZ_CHECK(regions[i].addr >= regions[i - 1].addr + regions[i - 1].length);
    free(regions);
    break;
  case 1:
    st = ferry_transfer_sync(e, target, FERRY_OP_READ, local, FUZZ_CLIENT_REMOTE, sizeof local);
    break;
  case 2:
    st = ferry_transfer_sync(e, target, FERRY_OP_WRITE, local, FUZZ_CLIENT_REMOTE, sizeof local);
    break;
  case 3: st = ferry_notify_send(e, target, "fuzz", "data", 4); break;
  default: st = ferry_probe(e, target); break;
  }
  FUZZ_CHECK(st <= 0 && st != FERRY_EINPROGRESS);
  if (st != FERRY_OK)
    FUZZ_CHECK(ferry_last_error()[0] != 0);
  ferry_engine_destroy(e);
  ssize_t unused = write(s.wake[1], "x", 1);
  (void)unused;
  pthread_join(thread, NULL);
  for (int i = 0; i < s.naccepted; i++)
    close(s.accepted[i]);
  close(s.wake[0]);
  close(s.wake[1]);
  return 0;
}
