/* pool_send.c - what the message handoff costs: ferry_send into a receive
 * pool, with a receiver thread doing ferry_recv + ferry_pool_release, next
 * to plain synchronous WRITEs of the same size between the same two engines
 * in the same run. Prints one JSON line per mode.
 *
 *   pool_send SIZE SECONDS SENDERS [tcp|shm]
 *
 * Built alone against libferry: cc -O2 -Iinclude bench/pool_send.c -Lbuild -lferry */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "ferry.h"

#define MAX_SAMPLES (1u << 20)

typedef struct run {
  ferry_engine *rx, *tx;
  ferry_pool *pool;
  uint64_t remote; /* WRITE mode: a registered buffer at rx */
  size_t size;
  uint64_t until_ns;
  int send_mode;
  uint64_t *start_ns; /* per message, by sequence number */
  uint64_t *lat_ns;
  unsigned long next, received, done;
  pthread_mutex_t lock;
} run;

static ferry_engine *engine(unsigned transports) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = transports;
  ferry_engine *e;
  if (ferry_engine_create(&cfg, &e)) {
    fprintf(stderr, "pool_send: %s\n", ferry_last_error());
    exit(1);
  }
  return e;
}

static unsigned long claim(run *r) {
  pthread_mutex_lock(&r->lock);
  unsigned long seq = r->next < MAX_SAMPLES ? r->next++ : MAX_SAMPLES;
  pthread_mutex_unlock(&r->lock);
  return seq;
}

static void *sender(void *arg) {
  run *r = arg;
  void *buf;
  if (ferry_memory_alloc(r->tx, r->size, &buf))
    return NULL;
  memset(buf, 7, r->size);
  while (ferry_now_ns() < r->until_ns) {
    unsigned long seq = claim(r);
    if (seq == MAX_SAMPLES)
      break;
    uint64_t t0 = ferry_now_ns();
    r->start_ns[seq] = t0;
    ferry_status st = r->send_mode ? ferry_send(r->tx, ferry_engine_name(r->rx), "bench", &seq,
                                                sizeof seq, buf, r->size, -1, 0)
                                   : ferry_transfer_sync(r->tx, ferry_engine_name(r->rx),
                                                         FERRY_OP_WRITE, buf, r->remote, r->size);
    if (st) {
      fprintf(stderr, "pool_send: %s\n", ferry_last_error());
      exit(1);
    }
    if (!r->send_mode)
      r->lat_ns[seq] = ferry_now_ns() - t0;
  }
  __atomic_add_fetch(&r->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* The receiver: takes every message, notes when recv returned, releases. */
static void *receiver(void *arg) {
  run *r = arg;
  ferry_message m;
  for (;;) {
    ferry_status st = ferry_recv(r->rx, r->pool, NULL, 0, 200, &m);
    if (st == FERRY_ETIMEDOUT && __atomic_load_n(&r->done, __ATOMIC_SEQ_CST))
      break;
    if (st)
      continue;
    unsigned long seq;
    memcpy(&seq, m.tag, sizeof seq);
    r->lat_ns[seq] = ferry_now_ns() - r->start_ns[seq];
    r->received++;
    ferry_pool_release(r->rx, r->pool, m.slot);
  }
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void one_mode(run *r, int send_mode, unsigned senders, double seconds, const char *tname) {
  r->send_mode = send_mode;
  r->next = r->received = r->done = 0;
  r->until_ns = ferry_now_ns() + (uint64_t)(seconds * 1e9);
  pthread_t rt, st[64];
  if (send_mode)
    pthread_create(&rt, NULL, receiver, r);
  uint64_t t0 = ferry_now_ns();
  for (unsigned i = 0; i < senders; i++)
    pthread_create(&st[i], NULL, sender, r);
  for (unsigned i = 0; i < senders; i++)
    pthread_join(st[i], NULL);
  double elapsed = (ferry_now_ns() - t0) / 1e9;
  if (send_mode)
    pthread_join(rt, NULL);
  unsigned long n = r->next;
  qsort(r->lat_ns, n, sizeof *r->lat_ns, cmp_u64);
  printf("{\"mode\":\"%s\",\"transport\":\"%s\",\"size\":%zu,\"senders\":%u,\"messages\":%lu,"
         "\"msgs_per_s\":%.0f,\"MBps\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
         send_mode ? "send" : "write", tname, r->size, senders, n, n / elapsed,
         n * (double)r->size / elapsed / 1e6, r->lat_ns[n / 2] / 1e3,
         r->lat_ns[n * 99 / 100] / 1e3);
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: pool_send SIZE SECONDS SENDERS [tcp|shm]\n");
    return 2;
  }
  run r = {.size = parse_size(argv[1])};
  double seconds = atof(argv[2]);
  unsigned senders = (unsigned)atoi(argv[3]);
  const char *tname = argc > 4 ? argv[4] : "tcp";
  unsigned t = ferry_transport_parse(tname);
  if (!r.size || senders < 1 || senders > 64 || !t) {
    fprintf(stderr, "pool_send: bad size, senders (1..64) or transport\n");
    return 2;
  }
  ferry_log_set_level(FERRY_LOG_WARN);
  r.rx = engine(t);
  r.tx = engine(t);
  pthread_mutex_init(&r.lock, NULL);
  r.start_ns = calloc(MAX_SAMPLES, sizeof *r.start_ns);
  r.lat_ns = calloc(MAX_SAMPLES, sizeof *r.lat_ns);
  void *dst;
  /* Room for every sender's message and its pre-grant. */
  if (ferry_pool_create(r.rx, "bench", NULL, 4 * senders * r.size, &r.pool) ||
      ferry_memory_alloc(r.rx, senders * r.size, &dst)) {
    fprintf(stderr, "pool_send: %s\n", ferry_last_error());
    return 1;
  }
  r.remote = (uint64_t)(uintptr_t)dst;
  one_mode(&r, 0, senders, seconds, tname);
  one_mode(&r, 1, senders, seconds, tname);
  ferry_engine_destroy(r.tx);
  ferry_engine_destroy(r.rx);
  return 0;
}
