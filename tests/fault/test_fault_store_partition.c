/* test_fault_store_partition.c - one store client cut off the network
 * (docs/store.md, RELIABILITY.md 22 "Partition"): a store master and two
 * clients in network namespaces of their own, joined by veth links, and
 * client b's links cut while it holds replicas, and while a put and a get
 * of its are in the middle of their transfers.
 *
 * Hosts: m (the master, in this process, bound to its address on the m-b
 * link), a and b (a client each, in this process: an engine and a store
 * whose threads live in the client's namespace). Links: m-a (never cut),
 * m-b and a-b (b's control and data paths; cut together to partition b).
 * a reaches the master through the route over m-a that fault_net_link
 * adds; the clients' data moves over a-b. m-b and a-b go through the
 * userspace link emulator, which cuts them by dropping every packet: as
 * in a real partition, nothing tells either side (a veth set down would
 * take its routes with it and fail every send at once).
 *
 * The transfers are made to be in flight when b is cut, not timed: the
 * a-b link goes first, so the WRITE and the READ cannot finish, and the
 * test waits until b's engine has both in flight before cutting m-b (the
 * master had answered their PUT_START and GET). Waiting for the master to
 * drop b is bounded and asserts what it sees. Needs network namespaces
 * (root, `ip`); skipped with the reason where they are unavailable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "fault.h"
#include "harness.h"
#include "store/master.h"
#include "store_op.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define SEGMENT (8 * MiB)
#define CLIENT_TTL_MS 3000 /* the master drops a client silent this long */
#define TIMEOUT_MS 1500    /* each client's transfers and requests to the master */
#define DROP_BOUND_S 30.0  /* generous: the master must notice within CLIENT_TTL_MS */

enum { HOST_M, HOST_A, HOST_B };

typedef struct client {
  int host;
  ferry_engine *engine;
  ferry_store *store;
  uint8_t *buf; /* 2 MiB registered */
} client;

typedef struct env {
  fault_net *net;
  int link_ma, link_mb, link_ab;
  store_master *master;
  char master_addr[64];
  client a, b;
  char skip_why[512];
} env;

static env E;

static void enter(int host) { assert_int_equal(fault_net_enter(E.net, host), 0); }

/* A client in host, its engine on its a-b address (where the other client
 * reaches its segment), its requests to the master bounded by TIMEOUT_MS. */
static int client_open(client *c, int host) {
  c->host = host;
  if (fault_net_enter(E.net, host) != 0)
    return -1;
  const char *bind = fault_link_addr(E.net, E.link_ab, host == HOST_A ? 0 : 1);
  c->engine = fault_engine(bind, TIMEOUT_MS, TIMEOUT_MS, 0);
  if (!c->engine)
    return -1;
  ferry_store_config cfg;
  ferry_store_config_init(&cfg);
  cfg.master = E.master_addr;
  cfg.segment_size = SEGMENT;
  cfg.local_buffer_size = 1 * MiB;
  cfg.timeout_ms = TIMEOUT_MS;
  if (ferry_store_open(c->engine, &cfg, &c->store) != FERRY_OK) {
    fprintf(stderr, "store client in host %d: %s\n", host, ferry_last_error());
    return -1;
  }
  return ferry_memory_alloc(c->engine, 2 * MiB, (void **)&c->buf) == FERRY_OK ? 0 : -1;
}

static void client_close(client *c) {
  if (!c->engine)
    return;
  fault_net_enter(E.net, c->host); /* a reconnect at close starts here */
  if (c->buf)
    ferry_memory_free(c->engine, c->buf);
  ferry_store_close(c->store);
  ferry_engine_destroy(c->engine);
  memset(c, 0, sizeof *c);
}

static int setup(void **state) {
  *state = &E;
  if (fault_net_open_isolated(3, &E.net, E.skip_why, sizeof E.skip_why) != 0)
    return -1;
  if (!E.net)
    return 0; /* skipped: E.skip_why says why */
  E.link_ma = fault_net_link(E.net, HOST_M, HOST_A, FAULT_LINK_VETH);
  E.link_mb = fault_net_link(E.net, HOST_M, HOST_B, FAULT_LINK_EMU);
  E.link_ab = fault_net_link(E.net, HOST_A, HOST_B, FAULT_LINK_EMU);
  if (E.link_ma < 0 || E.link_mb < 0 || E.link_ab < 0 || fault_net_enter(E.net, HOST_M) != 0)
    return -1;
  store_master_config cfg = {.host = fault_link_addr(E.net, E.link_mb, 0),
                             .client_ttl_ms = CLIENT_TTL_MS};
  if (store_master_start(&cfg, &E.master) != FERRY_OK) {
    fprintf(stderr, "store master: %s\n", ferry_last_error());
    return -1;
  }
  snprintf(E.master_addr, sizeof E.master_addr, "%s:%u", cfg.host, store_master_port(E.master));
  int rc = client_open(&E.a, HOST_A) || client_open(&E.b, HOST_B) ? -1 : 0;
  fault_net_leave(E.net);
  return rc;
}

static int teardown(void **state) {
  (void)state;
  if (E.net) {
    client_close(&E.a);
    client_close(&E.b);
    if (E.master)
      store_master_stop(E.master);
    fault_net_destroy(E.net);
  }
  return 0;
}

/* ---- values --------------------------------------------------------------------------------- */

static ferry_store_replicate placed(unsigned replicas, const client *first) {
  ferry_store_replicate rep;
  ferry_store_replicate_init(&rep);
  rep.replicas = replicas;
  rep.preferred_segment = ferry_store_segment(first->store);
  return rep;
}

/* c puts len bytes of pattern seed under key, the first replica in where's segment. */
static void put(client *c, const char *key, size_t len, uint64_t seed, unsigned replicas,
                const client *where) {
  enter(c->host);
  fault_pattern(c->buf, len, seed);
  ferry_store_replicate rep = placed(replicas, where);
  if (ferry_store_put_from(c->store, key, c->buf, len, &rep) != FERRY_OK)
    fail_msg("put %s from host %d: %s", key, c->host, ferry_last_error());
}

/* c reads key and checks every byte against pattern seed. */
static void expect_stored(client *c, const char *key, size_t len, uint64_t seed) {
  enter(c->host);
  memset(c->buf, 0, 2 * len);
  size_t got = 0;
  if (ferry_store_get_into(c->store, key, c->buf, len, &got) != FERRY_OK)
    fail_msg("get %s in host %d: %s", key, c->host, ferry_last_error());
  assert_int_equal(got, len);
  fault_pattern(c->buf + len, len, seed);
  if (memcmp(c->buf, c->buf + len, len) != 0)
    fail_msg("get %s in host %d: the bytes differ from what was put", key, c->host);
}

/* Drops every packet on a link (cut), or none (healed). */
static void cut(int link, int on) {
  assert_int_equal(fault_link_impair(E.net, link, 0, on ? 100.0 : 0, 0), 0);
}

static void cut_b(int on) {
  cut(E.link_ab, on);
  cut(E.link_mb, on);
}

/* Waits until the master has dropped b: a's exists of key (whose only
 * replica was in b's segment) answers FERRY_ENOTFOUND. */
static void wait_b_dropped(const char *key) {
  enter(HOST_A);
  double until = fault_now() + DROP_BOUND_S;
  ferry_status st;
  while ((st = ferry_store_exists(E.a.store, key)) == FERRY_OK && fault_now() < until)
    fault_sleep_ms(50);
  if (st != FERRY_ENOTFOUND)
    fail_msg("the master still has %s from the partitioned client after %.0f s (%d: %s)", key,
             DROP_BOUND_S, (int)st, st ? ferry_last_error() : "exists");
}

/* After the links are back, b's next call reconnects and works, and its
 * segment is mounted again: a's put into it lands and b reads it. */
static void expect_b_rejoins(const char *key, uint64_t seed) {
  put(&E.b, key, 64 * KiB, seed, 1, &E.a);
  expect_stored(&E.a, key, 64 * KiB, seed);
  char mine[64];
  snprintf(mine, sizeof mine, "%s_in_b", key);
  put(&E.a, mine, 64 * KiB, seed + 1, 1, &E.b);
  expect_stored(&E.b, mine, 64 * KiB, seed + 1);
}

/* ---- cases ---------------------------------------------------------------------------------- */

/* Every case: skipped without namespaces, bounded in time, and started with
 * b's links healed, whatever the previous case left. */
static void begin_case(const char *name) {
  fault_skip_without_net(E.net, E.skip_why);
  fault_watchdog(120, name);
  cut_b(0);
}

/* b holds the only replica of one object and the first of another when it
 * is cut off. a's get of the first fails with an error naming the key; its
 * get of the second reads a's own replica. b's own calls fail naming the
 * master. b's silence past client_ttl makes the master drop its segment:
 * the first object is gone, the second keeps a's replica. Healed, b
 * rejoins and its next call works. */
static void a_cut_off_holder_loses_its_replicas(void **state) {
  (void)state;
  begin_case("a_cut_off_holder_loses_its_replicas");
  put(&E.b, "only_b", 256 * KiB, 1, 1, &E.b);
  put(&E.b, "b_then_a", 256 * KiB, 2, 2, &E.b);
  expect_stored(&E.a, "only_b", 256 * KiB, 1);
  expect_stored(&E.a, "b_then_a", 256 * KiB, 2);

  cut_b(1);
  enter(HOST_A);
  size_t got;
  ferry_status st = ferry_store_get_into(E.a.store, "only_b", E.a.buf, 256 * KiB, &got);
  if (st == FERRY_OK || !strstr(ferry_last_error(), "only_b"))
    fail_msg("a's get of a value only the cut-off client holds: %d (%s)", (int)st,
             st ? ferry_last_error() : "read");
  printf("a's get of only_b while b is cut off: %s\n", ferry_last_error());
  expect_stored(&E.a, "b_then_a", 256 * KiB, 2); /* from a's own replica */

  enter(HOST_B);
  st = ferry_store_exists(E.b.store, "b_then_a");
  if (st == FERRY_OK || !strstr(ferry_last_error(), E.master_addr))
    fail_msg("b's call while cut off: %d (%s)", (int)st, st ? ferry_last_error() : "exists");
  printf("b's call while cut off: %s\n", ferry_last_error());

  wait_b_dropped("only_b");
  expect_stored(&E.a, "b_then_a", 256 * KiB, 2);

  cut_b(0);
  expect_b_rejoins("healed_1", 3);
  enter(HOST_B);
  assert_int_equal(ferry_store_exists(E.b.store, "only_b"), FERRY_ENOTFOUND);
  expect_stored(&E.b, "b_then_a", 256 * KiB, 2);
  fault_watchdog(0, NULL);
}

/* b is cut off while its put's WRITE and its get's READ (both toward a's
 * segment) are in flight: both fail with an error; the put never becomes
 * visible (a sees no such key, and once the master dropped b the key is
 * free: a's own put of it stores a's bytes); healed, b's next call works
 * and b reads a's value of the key. */
static void a_put_and_a_get_cut_midway(void **state) {
  (void)state;
  begin_case("a_put_and_a_get_cut_midway");
  put(&E.a, "in_a", 1 * MiB, 10, 1, &E.a);
  put(&E.b, "marker_b", 4 * KiB, 11, 1, &E.b); /* shows when the master dropped b */
  expect_stored(&E.b, "in_a", 1 * MiB, 10);

  cut(E.link_ab, 1);
  enter(HOST_B); /* the threads' reconnects, if any, start in b's namespace */
  test_store_op p = {.store = E.b.store,
                     .put = 1,
                     .key = "mid_put",
                     .buf = E.b.buf,
                     .len = 1 * MiB,
                     .rep = placed(1, &E.a)};
  test_store_op g = {.store = E.b.store, .key = "in_a", .buf = E.b.buf + 1 * MiB, .len = 1 * MiB};
  fault_pattern(p.buf, p.len, 12);
  test_store_op_start(&p);
  test_store_op_start(&g);
  uint64_t n = test_await_in_flight(E.b.engine, 2, 10000);
  cut(E.link_mb, 1); /* b is cut off */
  test_store_op_join(&p);
  test_store_op_join(&g);
  if (n < 2)
    fail_msg("the put's WRITE and the get's READ were not both in flight (%llu; put: %s; get: %s)",
             (unsigned long long)n, p.detail, g.detail);
  if (p.status == FERRY_OK || g.status == FERRY_OK)
    fail_msg("b's put (%d: %s) or get (%d: %s) across the cut succeeded", (int)p.status, p.detail,
             (int)g.status, g.detail);
  printf("b's put cut midway: %s\nb's get cut midway: %s\n", p.detail, g.detail);
  assert_non_null(strstr(p.detail, "mid_put"));
  assert_non_null(strstr(g.detail, "in_a"));

  enter(HOST_A);
  assert_int_equal(ferry_store_exists(E.a.store, "mid_put"), FERRY_ENOTFOUND);
  wait_b_dropped("marker_b");
  put(&E.a, "mid_put", 1 * MiB, 13, 1, &E.a); /* the key is free: b's put was revoked */
  expect_stored(&E.a, "mid_put", 1 * MiB, 13);

  cut_b(0);
  expect_b_rejoins("healed_2", 14);
  expect_stored(&E.b, "mid_put", 1 * MiB, 13);
  expect_stored(&E.b, "in_a", 1 * MiB, 10);
  fault_watchdog(0, NULL);
}

int main(void) {
  struct CMUnitTest tests[] = {
      cmocka_unit_test(a_cut_off_holder_loses_its_replicas),
      cmocka_unit_test(a_put_and_a_get_cut_midway),
  };
  return fault_run_tests(tests, setup, teardown);
}
