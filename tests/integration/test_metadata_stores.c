/* test_metadata_stores.c - the redis and etcd metadata backends against real
 * servers (Debian's redis-server and etcd), started by the test on loopback
 * ports it picks and killed at the end even on failure (support/stores.c).
 *
 * Each case runs once per store: the key round trip and refused values; two
 * processes exchanging data through a segment name; a target killed with
 * SIGKILL and restarted under the same name 20 times; the keys of a killed
 * engine expiring within the ttl; the store killed mid-run and restarted
 * empty. Then redis passwords (right, wrong, missing) and a 3-member etcd
 * cluster with one member killed. A store not installed skips its cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "harness.h"
#include "metadata/metadata.h"
#include "stores.h"

/* The lease of every engine here: a refresh may come up to two thirds of it
 * late, and on a loaded machine (these tests run niced next to builds, and
 * under TSan) a refresh thread was seen starved for more than 0.67 s. */
#define TTL_MS 3000
#define TTL_ARG "3000"
/* The killed engine's lease, short to keep the test short: etcd's minimum. */
#define EXPIRY_TTL_MS 2000
#define EXPIRY_TTL_ARG "2000"
#define RESTARTS 20
#define BUF (64 * 1024)
#define SLACK_S 10.0 /* generous: the machine may be busy */

typedef struct fixture {
  int etcd;
  test_store store;
} fixture;

static fixture the_store; /* the store of the group running now */

static int store_setup(int etcd) {
  memset(&the_store, 0, sizeof the_store);
  the_store.etcd = etcd;
  if (!test_store_available(etcd))
    return 0; /* the cases skip */
  return etcd ? test_etcd_start(&the_store.store, 1) : test_redis_start(&the_store.store, NULL);
}

static int redis_setup(void **state) { return store_setup(0); }
static int etcd_setup(void **state) { return store_setup(1); }

static int store_teardown(void **state) {
  test_store_stop(&the_store.store);
  return 0;
}

/* A store a single case starts for itself, stopped by its teardown even
 * when the case fails. */
static test_store own;

static int own_teardown(void **state) {
  test_store_stop(&own);
  return 0;
}

static fixture *need_store(void **state) {
  if (!the_store.store.pid[0])
    skip();
  return &the_store;
}

static ferry_engine *store_engine(const char *url, const char *segment) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.metadata_url = url;
  cfg.segment_name = segment;
  cfg.metadata_ttl_ms = TTL_MS;
  cfg.connect_timeout_ms = 2000;
  ferry_engine *e = NULL;
  ferry_status st = ferry_engine_create(&cfg, &e);
  if (st != FERRY_OK)
    print_error("engine on %s: %s\n", url, ferry_last_error());
  assert_int_equal(st, FERRY_OK);
  return e;
}

static int start_named(test_target *t, const char *url, const char *segment, const char *ttl) {
  const char *extra[] = {"--metadata", url, "--segment", segment, "--metadata-ttl", ttl, NULL};
  return test_target_start(t, 0, BUF, extra);
}

/* Whether key is in the store now. */
static int key_present(const char *url, const char *key) {
  ferry_metadata *md = NULL;
  assert_int_equal(ferry_metadata_open(url, &md), FERRY_OK);
  char *v = NULL;
  ferry_status st = ferry_metadata_get(md, key, &v);
  free(v);
  ferry_metadata_close(md);
  return st == FERRY_OK;
}

/* Seconds until key's presence equals want (polling the store), at most
 * limit_s; -1 when it never did. */
static double wait_key(const char *url, const char *key, int want, double limit_s) {
  double start = test_now_s();
  while (test_now_s() - start < limit_s) {
    if (key_present(url, key) == want)
      return test_now_s() - start;
    usleep(20000); /* the store expires keys on its own clock: nothing to wait on */
  }
  return -1;
}

/* ---- cases, once per store ------------------------------------------------- */

static void test_keys(void **state) {
  fixture *f = need_store(state);
  ferry_metadata *md = NULL;
  assert_int_equal(ferry_metadata_open(f->store.url, &md), FERRY_OK);
  char *v = NULL;
  assert_int_equal(ferry_metadata_put(md, "ferry-test/k", "{\"a\": \"\xc3\xa9\"}"), FERRY_OK);
  assert_int_equal(ferry_metadata_get(md, "ferry-test/k", &v), FERRY_OK);
  assert_string_equal(v, "{\"a\": \"\xc3\xa9\"}");
  free(v);
  assert_int_equal(ferry_metadata_delete(md, "ferry-test/k"), FERRY_OK);
  assert_int_equal(ferry_metadata_get(md, "ferry-test/k", &v), FERRY_ENOTFOUND);
  assert_int_equal(ferry_metadata_delete(md, "ferry-test/k"), FERRY_ENOTFOUND);

  /* Foreign or malformed values under our keys are refused, never trusted. */
  char host[64];
  uint16_t port;
  ferry_region *regions = NULL;
  size_t count;
  assert_int_equal(ferry_metadata_put(md, "mooncake/rpc_meta/bad", "not json"), FERRY_OK);
  assert_int_equal(ferry_segment_lookup(md, "bad", host, sizeof host, &port), FERRY_EJSON);
  assert_non_null(strstr(ferry_last_error(), "mooncake/rpc_meta/bad"));
  assert_int_equal(ferry_metadata_put(md, "mooncake/rpc_meta/bad", "{\"rpc_port\": 99999}"),
                   FERRY_OK);
  assert_int_equal(ferry_segment_lookup(md, "bad", host, sizeof host, &port), FERRY_EJSON);
  assert_int_equal(ferry_metadata_put(md, "mooncake/ram/bad", "[1,2]"), FERRY_OK);
  assert_int_equal(ferry_segment_lookup_regions(md, "bad", &regions, &count), FERRY_EJSON);
  ferry_segment_unpublish(md, "bad");
  ferry_metadata_close(md);
}

static void test_exchange(void **state) {
  fixture *f = need_store(state);
  test_target t;
  assert_int_equal(start_named(&t, f->store.url, "exchange-target", TTL_ARG), 0);
  assert_string_equal(t.target, "exchange-target");
  ferry_engine *e = store_engine(f->store.url, "exchange-initiator");
  uint8_t *out = test_buffer(e, BUF), *in = test_buffer(e, BUF);
  test_round_trip(e, "exchange-target", out, in, t.addr, BUF, 1);
  ferry_engine_destroy(e);
  free(out);
  free(in);
  assert_int_equal(test_target_stop(&t), 0);
}

/* SIGKILL leaves the keys behind; each new instance (a new port) overwrites
 * them, and the initiator's next call reaches it. */
static void test_restart_same_name(void **state) {
  fixture *f = need_store(state);
  ferry_engine *e = store_engine(f->store.url, "restart-initiator");
  uint8_t *out = test_buffer(e, BUF), *in = test_buffer(e, BUF);
  uint16_t last_port = 0;
  for (int i = 0; i < RESTARTS; i++) {
    test_target t;
    assert_int_equal(start_named(&t, f->store.url, "restart-target", TTL_ARG), 0);
    test_round_trip(e, "restart-target", out, in, t.addr, BUF, (uint64_t)i + 100);
    char host[64];
    uint16_t port = 0;
    ferry_metadata *md = NULL;
    assert_int_equal(ferry_metadata_open(f->store.url, &md), FERRY_OK);
    assert_int_equal(ferry_segment_lookup(md, "restart-target", host, sizeof host, &port),
                     FERRY_OK);
    ferry_metadata_close(md);
    assert_int_not_equal(port, last_port); /* the new instance's descriptor */
    last_port = port;
    test_target_kill(&t);
  }
  ferry_engine_destroy(e);
  free(out);
  free(in);
}

/* A rolling restart: the new instance starts before the old one shuts down,
 * and the old one's unpublish does not take the name from it (etcd: never
 * removed; redis has no owner to compare, the next refresh puts it back). */
static void test_rolling_restart(void **state) {
  fixture *f = need_store(state);
  ferry_engine *old = store_engine(f->store.url, "rolling");
  ferry_engine *fresh = store_engine(f->store.url, "rolling");
  ferry_engine_destroy(old);
  if (f->etcd)
    assert_true(key_present(f->store.url, "mooncake/rpc_meta/rolling"));
  assert_true(wait_key(f->store.url, "mooncake/rpc_meta/rolling", 1, TTL_MS / 1000.0 + SLACK_S) >=
              0);
  ferry_metadata *md = NULL;
  char host[64];
  uint16_t port = 0;
  assert_int_equal(ferry_metadata_open(f->store.url, &md), FERRY_OK);
  assert_int_equal(ferry_segment_lookup(md, "rolling", host, sizeof host, &port), FERRY_OK);
  assert_int_equal(port, ferry_engine_port(fresh));
  ferry_metadata_close(md);
  ferry_engine_destroy(fresh);
  assert_false(key_present(f->store.url, "mooncake/rpc_meta/rolling"));
}

static void test_killed_engine_expires(void **state) {
  fixture *f = need_store(state);
  test_target t;
  assert_int_equal(start_named(&t, f->store.url, "expiring", EXPIRY_TTL_ARG), 0);
  assert_true(key_present(f->store.url, "mooncake/rpc_meta/expiring"));
  test_target_kill(&t);
  double ttl_s = EXPIRY_TTL_MS / 1000.0;
  double gone = wait_key(f->store.url, "mooncake/rpc_meta/expiring", 0, ttl_s + SLACK_S);
  print_message("%s: killed engine's key gone after %.2f s (ttl %.1f s)\n",
                f->etcd ? "etcd" : "redis", gone, ttl_s);
  assert_true(gone >= 0);
  /* The two keys were last put one after the other: the second may outlive
   * the first by that round trip. */
  assert_true(wait_key(f->store.url, "mooncake/ram/expiring", 0, SLACK_S) >= 0);
}

/* The store dies under two engines: the known peer stays reachable, a new
 * lookup fails at once, and a store restarted empty gets the keys back
 * within one refresh, without touching the engines. */
static void test_store_outage(void **state) {
  fixture *f = need_store(state);
  ferry_engine *a = store_engine(f->store.url, "outage-a");
  ferry_engine *b = store_engine(f->store.url, "outage-b");
  uint8_t *target = test_buffer(a, BUF);
  uint8_t *out = test_buffer(b, BUF), *in = test_buffer(b, BUF);
  test_round_trip(b, "outage-a", out, in, (uint64_t)(uintptr_t)target, BUF, 7);
  ferry_metadata *md = NULL;
  char host[64];
  uint16_t port;
  assert_int_equal(ferry_metadata_open(f->store.url, &md), FERRY_OK);
  assert_int_equal(ferry_segment_lookup(md, "outage-a", host, sizeof host, &port), FERRY_OK);

  test_store_kill(&f->store, 0);
  /* A lookup of a segment seen before answers its last address. */
  assert_int_equal(ferry_segment_lookup(md, "outage-a", host, sizeof host, &port), FERRY_OK);
  assert_int_equal(port, ferry_engine_port(a));
  assert_int_equal(ferry_segment_lookup(md, "outage-b", host, sizeof host, &port), FERRY_EMETADATA);
  ferry_metadata_close(md);
  test_round_trip(b, "outage-a", out, in, (uint64_t)(uintptr_t)target, BUF, 8);
  double t0 = test_now_s();
  assert_int_equal(ferry_transfer_sync(b, "never-seen", FERRY_OP_WRITE, out, 0, 16),
                   FERRY_EMETADATA);
  assert_true(test_now_s() - t0 < SLACK_S);

  assert_int_equal(test_store_restart(&f->store, 0, 1), 0);
  double back = wait_key(f->store.url, "mooncake/rpc_meta/outage-a", 1, TTL_MS / 1000.0 + SLACK_S);
  print_message("keys re-published %.2f s after the store came back empty\n", back);
  assert_true(back >= 0);
  /* Each engine refreshes on its own clock: b's keys come within a period too. */
  assert_true(wait_key(f->store.url, "mooncake/ram/outage-b", 1, TTL_MS / 1000.0 + SLACK_S) >= 0);
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  assert_false(key_present(f->store.url, "mooncake/rpc_meta/outage-a")); /* unpublished */
  free(target);
  free(out);
  free(in);
}

/* 1 when segment name's published buffers are exactly [addr, addr+BUF). */
static int regions_are(const char *url, const char *name, uint64_t addr) {
  ferry_metadata *md = NULL;
  if (ferry_metadata_open(url, &md) != FERRY_OK)
    return 0;
  ferry_region *r = NULL;
  size_t n = 0;
  int same = ferry_segment_lookup_regions(md, name, &r, &n) == FERRY_OK && n == 1 &&
             r[0].addr == addr && r[0].length == BUF;
  free(r);
  ferry_metadata_close(md);
  return same;
}

/* A write that fails while the store is down (a registration's new
 * descriptor) lands once it is back, even where the lease survived (etcd
 * restarted with its data: only the keep-alive would be needed). */
static void test_write_during_outage(void **state) {
  fixture *f = need_store(state);
  ferry_engine *e = store_engine(f->store.url, "late-regions");
  test_store_kill(&f->store, 0);
  uint8_t *buf = test_buffer(e, BUF); /* its publish fails: the store is down */
  assert_int_equal(test_store_restart(&f->store, 0, 0), 0);
  double start = test_now_s();
  while (!regions_are(f->store.url, "late-regions", (uint64_t)(uintptr_t)buf) &&
         test_now_s() - start < TTL_MS / 1000.0 + SLACK_S)
    usleep(20000); /* the refresh runs on its own clock */
  assert_true(regions_are(f->store.url, "late-regions", (uint64_t)(uintptr_t)buf));
  ferry_engine_destroy(e);
  free(buf);
}

static void test_unreachable_at_create(void **state) {
  fixture *f = &the_store;
  char url[64];
  snprintf(url, sizeof url, "%s127.0.0.1:%u", f->etcd ? "etcd://" : "redis://", test_free_port());
  ferry_config cfg;
  test_config(&cfg);
  cfg.metadata_url = url;
  cfg.connect_timeout_ms = 1000;
  ferry_engine *e = NULL;
  double t0 = test_now_s();
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_EMETADATA);
  assert_true(test_now_s() - t0 < SLACK_S);
  assert_non_null(strstr(ferry_last_error(), url + strlen(f->etcd ? "etcd://" : "redis://")));
  assert_null(e);
}

/* `ferry doctor --metadata URL`: exit status and the verdict line. */
static int run_doctor(const char *url, char *out, size_t size) {
  char cmd[1024];
  /* Pinned to loopback: doctor's default engine would bind every address. */
  snprintf(cmd, sizeof cmd, "MC_TCP_BIND_ADDRESS=127.0.0.1 '%s' doctor --metadata '%s' 2>&1",
           test_tool_path(), url);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, size - 1, p);
  out[n] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The verdict line doctor prints for url ("OK    URL ..." or "FAIL  URL ..."). */
static int has_verdict(const char *out, const char *verdict, const char *url) {
  char want[600];
  snprintf(want, sizeof want, "%-5s %s", verdict, url);
  return strstr(out, want) != NULL;
}

static void test_doctor(void **state) {
  fixture *f = need_store(state);
  char out[16384];
  run_doctor(f->store.url, out, sizeof out); /* its status also counts the transport checks */
  assert_true(has_verdict(out, "OK", f->store.url));
  assert_non_null(strstr(out, "put/get/delete round trip"));
  char url[128];
  snprintf(url, sizeof url, "%s127.0.0.1:%u", f->etcd ? "etcd://" : "redis://", test_free_port());
  assert_int_not_equal(run_doctor(url, out, sizeof out), 0);
  assert_true(has_verdict(out, "FAIL", url));
}

/* ---- redis only ------------------------------------------------------------ */

/* GETs the redis server has served so far (INFO commandstats). */
static long redis_gets(uint16_t port) {
  redisContext *c = redisConnect("127.0.0.1", port);
  assert_true(c && !c->err);
  redisReply *r = redisCommand(c, "INFO commandstats");
  assert_true(r && r->type == REDIS_REPLY_STRING);
  const char *at = strstr(r->str, "cmdstat_get:calls=");
  long n = at ? strtol(at + strlen("cmdstat_get:calls="), NULL, 10) : 0;
  freeReplyObject(r);
  redisFree(c);
  return n;
}

/* Once a peer is known, transfers to it ask the store nothing. */
static void test_cached_lookup_costs_no_round_trip(void **state) {
  fixture *f = need_store(state); /* redis: counted with its own statistics */
  ferry_engine *a = store_engine(f->store.url, "cached-a");
  ferry_engine *b = store_engine(f->store.url, "cached-b");
  uint8_t *target = test_buffer(a, BUF), *out = test_buffer(b, BUF), *in = test_buffer(b, BUF);
  test_round_trip(b, "cached-a", out, in, (uint64_t)(uintptr_t)target, BUF, 11);
  long before = redis_gets(f->store.port[0]);
  for (int i = 0; i < 200; i++)
    assert_int_equal(
        ferry_transfer_sync(b, "cached-a", FERRY_OP_WRITE, out, (uint64_t)(uintptr_t)target, 4096),
        FERRY_OK);
  assert_int_equal(redis_gets(f->store.port[0]), before);
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  free(target);
  free(out);
  free(in);
}

static void test_redis_password(void **state) {
  if (!test_store_available(0))
    skip();
  assert_int_equal(test_redis_start(&own, "s3cret"), 0);
  char url[256];
  ferry_metadata *md = NULL;
  snprintf(url, sizeof url, "redis://127.0.0.1:%u", own.port[0]);
  /* Without a password it connects; its first command is refused. */
  assert_int_equal(ferry_metadata_open(url, &md), FERRY_OK);
  char *v = NULL;
  assert_int_equal(ferry_metadata_get(md, "k", &v), FERRY_EAUTH);
  assert_non_null(strstr(ferry_last_error(), "requires authentication"));
  ferry_metadata_close(md);

  snprintf(url, sizeof url, "redis://:pw-guess@127.0.0.1:%u", own.port[0]);
  assert_int_equal(ferry_metadata_open(url, &md), FERRY_EAUTH);
  assert_non_null(strstr(ferry_last_error(), "refused the credentials"));
  assert_null(strstr(ferry_last_error(), "pw-guess")); /* the password is masked */

  setenv("MC_REDIS_PASSWORD", "s3cret", 1);
  snprintf(url, sizeof url, "redis://127.0.0.1:%u/2", own.port[0]);
  assert_int_equal(ferry_metadata_open(url, &md), FERRY_OK);
  unsetenv("MC_REDIS_PASSWORD");
  assert_int_equal(ferry_metadata_put(md, "k", "v"), FERRY_OK);
  ferry_metadata_close(md);
  assert_int_equal(ferry_metadata_open(own.url, &md), FERRY_OK); /* db 0: not there */
  assert_int_equal(ferry_metadata_get(md, "k", &v), FERRY_ENOTFOUND);
  ferry_metadata_close(md);
}

/* ---- etcd only ------------------------------------------------------------- */

static void test_etcd_cluster_member_down(void **state) {
  if (!test_store_available(1))
    skip();
  assert_int_equal(test_etcd_start(&own, 3), 0);
  ferry_engine *a = store_engine(own.url, "cluster-a");
  ferry_engine *b = store_engine(own.url, "cluster-b");
  uint8_t *target = test_buffer(a, BUF);
  uint8_t *out = test_buffer(b, BUF), *in = test_buffer(b, BUF);
  test_store_kill(&own, 0);                   /* the first member listed, the one asked first */
  assert_int_equal(test_store_wait(&own), 0); /* it may have been the leader */
  ferry_metadata *md = NULL;
  assert_int_equal(ferry_metadata_open(own.url, &md), FERRY_OK);
  assert_int_equal(ferry_metadata_put(md, "ferry-test/k", "v"), FERRY_OK);
  char *v = NULL;
  assert_int_equal(ferry_metadata_get(md, "ferry-test/k", &v), FERRY_OK);
  free(v);
  ferry_metadata_close(md);
  /* A first contact after the failure, and the lease keep-alive goes on. */
  test_round_trip(b, "cluster-a", out, in, (uint64_t)(uintptr_t)target, BUF, 9);
  usleep(3 * 1000 * 1000); /* longer than the 2 s lease: only refreshes keep it */
  assert_true(key_present(own.url, "mooncake/rpc_meta/cluster-a"));
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  free(target);
  free(out);
  free(in);
}

#define STORE_CASES                                                                                \
  cmocka_unit_test(test_keys), cmocka_unit_test(test_exchange),                                    \
      cmocka_unit_test(test_restart_same_name), cmocka_unit_test(test_rolling_restart),            \
      cmocka_unit_test(test_killed_engine_expires), cmocka_unit_test(test_store_outage),           \
      cmocka_unit_test(test_write_during_outage), cmocka_unit_test(test_unreachable_at_create),    \
      cmocka_unit_test(test_doctor)

int main(void) {
  const struct CMUnitTest redis_tests[] = {
      STORE_CASES, cmocka_unit_test(test_cached_lookup_costs_no_round_trip),
      cmocka_unit_test_teardown(test_redis_password, own_teardown)};
  const struct CMUnitTest etcd_tests[] = {
      STORE_CASES, cmocka_unit_test_teardown(test_etcd_cluster_member_down, own_teardown)};
  int failed = cmocka_run_group_tests_name("redis", redis_tests, redis_setup, store_teardown);
  failed += cmocka_run_group_tests_name("etcd", etcd_tests, etcd_setup, store_teardown);
  return failed;
}
