/* bench_send.c - `ferry bench --op send`: what the message handoff costs.
 * Two engines in this process on loopback (a receiver with a pool, and a
 * sender): first THREADS threads make plain synchronous WRITEs of BLOCK
 * bytes into a registered buffer of the receiver as large as the pool,
 * each into the next BLOCK of it (as a sender that was told a slot per
 * message would; with fixed_write all into its first BLOCK, which stays in
 * the cache and so measures a hot memcpy, not what a message costs on
 * top of its WRITE), then the same threads
 * ferry_send messages of BLOCK bytes into the pool while a receiver thread
 * takes each with ferry_recv and releases it, for the same time each. Prints
 * both: messages per second, and latency p50/p99 (a WRITE: call to return;
 * a send: send start to the return of the recv that got it). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "cli.h"
#include "commands.h"

#define PROG "ferry bench --op send"
#define MAX_SAMPLES (1u << 20)
#define BENCH_POOL_MIN (64u << 20)

typedef struct run {
  ferry_engine *rx, *tx;
  ferry_pool *pool;
  uint64_t remote; /* WRITE mode: a registered buffer at rx, spots BLOCKs long */
  size_t spots;
  size_t size;
  uint64_t until_ns;
  int send_mode;
  uint64_t *start_ns; /* per message, by sequence number */
  uint64_t *lat_ns;
  unsigned long next, done;
  int failed;
  pthread_mutex_t lock;
} run;

typedef struct figures {
  double msgs_per_s, p50_us, p99_us;
} figures;

static unsigned long claim(run *r) {
  pthread_mutex_lock(&r->lock);
  unsigned long seq = r->next < MAX_SAMPLES ? r->next++ : MAX_SAMPLES;
  pthread_mutex_unlock(&r->lock);
  return seq;
}

static ferry_status one_message(run *r, void *buf, unsigned long seq) {
  if (r->send_mode)
    return ferry_send(r->tx, ferry_engine_name(r->rx), "bench", &seq, sizeof seq, buf, r->size, -1,
                      0);
  return ferry_transfer_sync(r->tx, ferry_engine_name(r->rx), FERRY_OP_WRITE, buf,
                             r->remote + (seq % r->spots) * r->size, r->size);
}

static void *sender(void *arg) {
  run *r = arg;
  void *buf;
  if (ferry_memory_alloc(r->tx, r->size, &buf) != FERRY_OK) {
    ferry_cli_report(PROG, "allocate the message", FERRY_ENOMEM);
    __atomic_store_n(&r->failed, 1, __ATOMIC_SEQ_CST);
  }
  while (!__atomic_load_n(&r->failed, __ATOMIC_SEQ_CST) && ferry_now_ns() < r->until_ns) {
    unsigned long seq = claim(r);
    if (seq == MAX_SAMPLES)
      break;
    uint64_t t0 = ferry_now_ns();
    r->start_ns[seq] = t0;
    ferry_status st = one_message(r, buf, seq);
    if (st != FERRY_OK) {
      ferry_cli_report(PROG, r->send_mode ? "send" : "write", st);
      __atomic_store_n(&r->failed, 1, __ATOMIC_SEQ_CST);
      break;
    }
    if (!r->send_mode)
      r->lat_ns[seq] = ferry_now_ns() - t0;
  }
  __atomic_add_fetch(&r->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* Takes every message, notes when recv returned, releases it. */
static void *receiver(void *arg) {
  run *r = arg;
  ferry_message m;
  for (;;) {
    ferry_status st = ferry_recv(r->rx, r->pool, NULL, 0, 200, &m);
    if (st == FERRY_ETIMEDOUT && __atomic_load_n(&r->done, __ATOMIC_SEQ_CST))
      break;
    if (st != FERRY_OK)
      continue;
    unsigned long seq;
    memcpy(&seq, m.tag, sizeof seq);
    r->lat_ns[seq] = ferry_now_ns() - r->start_ns[seq];
    ferry_pool_release(r->rx, r->pool, m.slot);
  }
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static figures one_mode(run *r, int send_mode, unsigned senders, double seconds) {
  r->send_mode = send_mode;
  r->next = r->done = 0;
  r->until_ns = ferry_now_ns() + (uint64_t)(seconds * 1e9);
  pthread_t rt, st[1024];
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
  figures f = {0, 0, 0};
  if (!n)
    return f;
  qsort(r->lat_ns, n, sizeof *r->lat_ns, cmp_u64);
  f.msgs_per_s = n / elapsed;
  f.p50_us = r->lat_ns[n / 2] / 1e3;
  f.p99_us = r->lat_ns[n * 99 / 100] / 1e3;
  return f;
}

static void print(const run *r, unsigned senders, const char *protocol, figures w, figures s,
                  int json) {
  double ratio = w.msgs_per_s > 0 ? s.msgs_per_s / w.msgs_per_s : 0;
  if (json) {
    printf("{\"op\":\"send\",\"protocol\":\"%s\",\"block\":%zu,\"threads\":%u,"
           "\"write_msgs_per_s\":%.0f,\"write_p50_us\":%.1f,\"write_p99_us\":%.1f,"
           "\"send_msgs_per_s\":%.0f,\"send_p50_us\":%.1f,\"send_p99_us\":%.1f,"
           "\"ratio\":%.3f}\n",
           protocol, r->size, senders, w.msgs_per_s, w.p50_us, w.p99_us, s.msgs_per_s, s.p50_us,
           s.p99_us, ratio);
    return;
  }
  printf("%s, %zu-byte messages, %u sender(s):\n"
         "  sync WRITE  %10.0f msg/s  p50 %8.1f us  p99 %8.1f us\n"
         "  send/recv   %10.0f msg/s  p50 %8.1f us  p99 %8.1f us  (%.2fx the WRITEs)\n",
         protocol, r->size, senders, w.msgs_per_s, w.p50_us, w.p99_us, s.msgs_per_s, s.p50_us,
         s.p99_us, ratio);
}

static ferry_status setup(run *r, const ferry_cli_engine_opts *opts, unsigned senders,
                          int fixed_write) {
  ferry_status st = ferry_cli_engine_create(PROG, opts, &r->rx);
  if (st == FERRY_OK)
    st = ferry_cli_engine_create(PROG, opts, &r->tx);
  if (st != FERRY_OK)
    return st;
  void *dst;
  /* Room for every sender's message and its pre-grant, twice, and at
   * least BENCH_POOL_MIN: a pool of a few small messages would measure
   * how often a sender runs out of credits, not what a handoff costs
   * (a receiver sizes its pool for many requests, not for four). */
  size_t room = 4 * senders * r->size;
  if (room < BENCH_POOL_MIN)
    room = BENCH_POOL_MIN;
  r->spots = fixed_write ? 1 : room / r->size;
  st = ferry_pool_create(r->rx, "bench", NULL, room, &r->pool);
  if (st == FERRY_OK)
    st = ferry_memory_alloc(r->rx, r->spots * r->size, &dst);
  if (st != FERRY_OK)
    ferry_cli_report(PROG, "create the pool", st);
  else
    r->remote = (uint64_t)(uintptr_t)dst;
  return st;
}

int ferry_bench_send(const ferry_cli_engine_opts *opts, size_t block, unsigned senders,
                     double seconds, int fixed_write, int json) {
  if (senders > 1024) {
    fprintf(stderr, "%s: at most 1024 threads\n", PROG);
    return 2;
  }
  run r = {.size = block};
  pthread_mutex_init(&r.lock, NULL);
  r.start_ns = calloc(MAX_SAMPLES, sizeof *r.start_ns);
  r.lat_ns = calloc(MAX_SAMPLES, sizeof *r.lat_ns);
  int rc = 1;
  if (r.start_ns && r.lat_ns && setup(&r, opts, senders, fixed_write) == FERRY_OK) {
    figures w = one_mode(&r, 0, senders, seconds);
    figures s = r.failed ? w : one_mode(&r, 1, senders, seconds);
    char protocol[64];
    unsigned used = 0;
    ferry_peer_transport(r.tx, ferry_engine_name(r.rx), &used);
    ferry_cli_protocol_names(used, protocol, sizeof protocol);
    if (!r.failed)
      print(&r, senders, protocol, w, s, json);
    rc = r.failed;
  }
  if (r.tx)
    ferry_engine_destroy(r.tx);
  if (r.rx)
    ferry_engine_destroy(r.rx);
  free(r.start_ns);
  free(r.lat_ns);
  pthread_mutex_destroy(&r.lock);
  return rc;
}
