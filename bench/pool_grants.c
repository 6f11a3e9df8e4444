/* pool_grants.c - what a receive pool's slot costs its receiver while
 * many slots are held: HELD one-byte grants (64-byte slots) are taken and
 * left (by HELD/512 senders, 512 each, within the default per-sender
 * bounds), then for BUDGET_S seconds one more sender runs whole message
 * lives: a grant, a posted LANDED, ferry_recv and ferry_pool_release. It
 * calls the pool code directly (ferry_pools_serve, as the server and the
 * shm service do), so it measures the bookkeeping under the engine's
 * pools lock, not the network. Grants would expire during a long run:
 * run it with FERRY_POOL_GRANT_TIMEOUT_MS=86400000. Also the heap bytes
 * per held grant. One JSON line per HELD on stdout.
 *
 *   pool_grants HELD...
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/base/clock.h"
#include "../src/core/pool.h"
#include "ferry.h"

#define BUDGET_S 2
#define PER_SENDER 512
#define HELD_PEER_BASE 0x1000

static void check(ferry_status st, const char *what) {
  if (st) {
    fprintf(stderr, "pool_grants: %s: %s\n", what, ferry_last_error());
    exit(1);
  }
}

static size_t heap_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

static ferry_status serve(ferry_engine *e, uint64_t peer, const ferry_pool_req *r, int how,
                          ferry_pool_grant *g) {
  uint8_t body[FERRY_WIRE_POOL_MAX], reply[FERRY_WIRE_POOL_REPLY_SIZE];
  size_t len = ferry_wire_pool_encode(body, r);
  ferry_status st = ferry_pools_serve(e, peer, "bench", body, len, how, reply);
  if (!st)
    ferry_wire_grant_decode(reply, g);
  return st;
}

static void run(size_t held) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = FERRY_TRANSPORT_TCP;
  ferry_engine *e;
  check(ferry_engine_create(&cfg, &e), "engine");
  ferry_pool *pool;
  check(ferry_pool_create(e, "bench", NULL, (held + 1024) * 64 * 2, &pool), "pool");
  ferry_pool_req grant = {.op = FERRY_POOL_GRANT, .length = 1, .pool = "bench", .pool_len = 5};
  ferry_pool_grant g;
  size_t heap0 = heap_bytes();
  uint64_t t0 = ferry_now_ns();
  for (size_t i = 0; i < held; i++)
    check(serve(e, HELD_PEER_BASE + i / PER_SENDER, &grant, FERRY_NOTICE_CONTROL, &g), "hold");
  uint64_t t1 = ferry_now_ns();
  size_t heap1 = heap_bytes();
  ferry_pool_req landed = {.op = FERRY_POOL_LANDED,
                           .length = 1,
                           .pool = "bench",
                           .pool_len = 5,
                           .tag = "t",
                           .tag_len = 1};
  uint64_t lives = 0, stop = ferry_now_ns() + BUDGET_S * 1000000000ull;
  while (lives % 256 || ferry_now_ns() < stop) {
    check(serve(e, 1, &grant, FERRY_NOTICE_CONTROL, &g), "grant");
    landed.grant = g.id;
    check(serve(e, 1, &landed, FERRY_NOTICE_POSTED, &g), "landed");
    ferry_message m;
    check(ferry_recv(e, pool, NULL, 0, 0, &m), "recv");
    check(ferry_pool_release(e, pool, m.slot), "release");
    lives++;
  }
  uint64_t t2 = ferry_now_ns();
  printf("{\"held\": %zu, \"hold_us\": %.3f, \"lives_per_s\": %.0f, \"bytes_per_held\": %.1f}\n",
         held, held ? (double)(t1 - t0) / 1e3 / (double)held : 0.0,
         (double)lives / ((double)(t2 - t1) / 1e9),
         held && heap1 > heap0 ? (double)(heap1 - heap0) / (double)held : 0.0);
  fflush(stdout);
  ferry_engine_destroy(e);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: pool_grants HELD...\n");
    return 2;
  }
  for (int i = 1; i < argc; i++)
    run(strtoul(argv[i], NULL, 10));
  return 0;
}
