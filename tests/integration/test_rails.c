/* test_rails.c - a target served on several rails (ferry_config.rail_hosts)
 * and an initiator that uses them all: a large transfer striped over two
 * loopback addresses (127.0.0.1 and 127.0.0.2; Linux routes all of 127/8
 * on lo), a rail whose link dies mid-transfer (it goes through a
 * holdproxy that holds the rail's acknowledgements, then is stopped) while
 * the other rail carries on, a rail whose link goes silent (a blackhole
 * proxy) dropped after the stall bound while a slow one is kept, and every
 * rail dead. Both engines live in this process; every transfer is verified
 * byte for byte. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"
#include "holdproxy.h"
#include "rig.h"
#include "wire/wire.h"

#define MiB (1024ull * 1024ull)
#define BIG (16 * MiB) /* 32 chunks of the default 512 KiB slice */
#define HOLD_MS 20000  /* generous: the machine may be busy */

#define TIMEOUT_MS 60000 /* the engines' base timeout: a long batch deadline */
#define STALL_MS 1000    /* the initiator's stall bound where a test sets one */

/* stall_ms 0: the default bound. */
static ferry_engine *engine_on_rails(const char *rails, uint32_t stall_ms) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_TCP; /* shm would take a same-host peer */
  cfg.rail_hosts = rails;
  cfg.timeout_ms = TIMEOUT_MS;
  cfg.stall_ms = stall_ms;
  return test_engine_create(&cfg);
}

static void rig_start_stall(test_rig *r, const char *rails, uint32_t stall_ms) {
  test_rig_start(r, engine_on_rails(rails, 0), engine_on_rails(NULL, stall_ms), BIG);
}

static void rig_start(test_rig *r, const char *rails) { rig_start_stall(r, rails, 0); }

/* A free port on 127.0.0.1 for a rail to listen on behind a proxy. */
static uint16_t free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_true(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

/* A rail entry that listens on a free port and is advertised as a proxy in
 * front of it: "127.0.0.1:PORT=127.0.0.1:PROXY". */
static hold_proxy *proxied_rail(char *entry, size_t size) {
  uint16_t port = free_port();
  hold_proxy *proxy = hold_proxy_start(port);
  assert_non_null(proxy);
  snprintf(entry, size, "127.0.0.1:%u=%s", port, hold_proxy_target(proxy));
  return proxy;
}

/* Both rails carry a striped transfer; every byte lands and reads back. */
static void striped_over_two_addresses(void **state) {
  test_rig r;
  rig_start(&r, "127.0.0.1,127.0.0.2");
  /* One driver may claim a whole batch before the others start (a busy
   * machine): repeat until both rails carried some, a bounded number of
   * times. */
  uint64_t bytes[4] = {0, 0};
  while (r.rounds < 20 && !(bytes[0] && bytes[1])) {
    test_rig_round_trip(&r);
    assert_int_equal(test_rig_rail_bytes(&r, bytes, NULL, NULL, 4), 2);
  }
  print_message("after %llu rounds: rail 127.0.0.1: %llu bytes, rail 127.0.0.2: %llu bytes\n",
                (unsigned long long)r.rounds, (unsigned long long)bytes[0],
                (unsigned long long)bytes[1]);
  assert_true(bytes[0] > 0 && bytes[1] > 0);
  assert_int_equal(bytes[0] + bytes[1], 2 * r.rounds * BIG);
  test_rig_stop(&r);
}

/* Small batches take turns over the rails: each synchronous call checks out
 * one channel, on the next rail in turn. */
static void small_batches_take_turns(void **state) {
  test_rig r;
  rig_start(&r, "127.0.0.1,127.0.0.2");
  enum { CALLS = 8, SMALL = 4096 };
  for (int i = 0; i < CALLS; i++) {
    test_fill_random(r.out + i * SMALL, SMALL, 1000 + (uint64_t)i);
    assert_int_equal(ferry_transfer_sync(r.initiator, r.name, FERRY_OP_WRITE, r.out + i * SMALL,
                                         (uint64_t)(uintptr_t)(r.memory + i * SMALL), SMALL),
                     FERRY_OK);
  }
  assert_memory_equal(r.memory, r.out, CALLS * SMALL);
  uint64_t bytes[2];
  assert_int_equal(test_rig_rail_bytes(&r, bytes, NULL, NULL, 2), 2);
  assert_int_equal(bytes[0], CALLS / 2 * SMALL);
  assert_int_equal(bytes[1], CALLS / 2 * SMALL);
  test_rig_stop(&r);
}

typedef struct writer {
  test_rig *rig;
  ferry_status status;
  char why[512]; /* the error detail is per thread */
  pthread_t thread;
} writer;

static void *write_main(void *arg) {
  writer *w = arg;
  w->status = test_rig_write(w->rig, 42);
  snprintf(w->why, sizeof w->why, "%s", w->status ? ferry_last_error() : "");
  return NULL;
}

/* The target's word that an initiator asked it to cut a data connection,
 * and the initiator's WARN that a rail went silent (its message, once). */
static int cuts_asked;
static char stall_warning[1024];
static pthread_mutex_t warning_lock = PTHREAD_MUTEX_INITIALIZER;
static void count_cuts(const ferry_log_record *rec, void *arg) {
  if (strstr(rec->message, "asked to cut one of its data connections"))
    __atomic_add_fetch(&cuts_asked, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&warning_lock);
  if (rec->level == FERRY_LOG_WARN && strstr(rec->message, "no progress for") && !*stall_warning)
    snprintf(stall_warning, sizeof stall_warning, "%s", rec->message);
  pthread_mutex_unlock(&warning_lock);
}

/* Both rails go through proxies that hold their WRITE acknowledgements:
 * the driver on rail 0 waits for its first one, so other drivers take the
 * next chunks, on rail 1 too. Once both hold one (chunks provably in flight
 * on each) rail 1's proxy is stopped: its connections close and new ones
 * are refused. Released, the transfer completes over rail 0, as do the
 * next ones, and rail 1 shows down. */
static void rail_dies_mid_transfer(void **state) {
  char a[96], b[96], rails[200];
  hold_proxy *pa = proxied_rail(a, sizeof a), *pb = proxied_rail(b, sizeof b);
  snprintf(rails, sizeof rails, "%s,%s", a, b);
  test_rig r;
  /* A held acknowledgement is a silent link too: no stall bound here (one
   * at the engine's timeout never trips), only the death of rail 1. */
  rig_start_stall(&r, rails, TIMEOUT_MS);
  assert_int_equal(test_rig_write(&r, 7), FERRY_OK);
  uint64_t before[2];
  assert_int_equal(test_rig_rail_bytes(&r, before, NULL, NULL, 2), 2);

  ferry_log_level level = ferry_log_get_level();
  ferry_log_set_level(FERRY_LOG_DEBUG);
  ferry_log_set_handler(count_cuts, NULL);
  hold_proxy_hold(pa, FERRY_FRAME_WRITE_ACK);
  hold_proxy_hold(pb, FERRY_FRAME_WRITE_ACK);
  writer w = {.rig = &r};
  assert_int_equal(pthread_create(&w.thread, NULL, write_main, &w), 0);
  assert_int_equal(hold_proxy_wait_held(pa, 1, HOLD_MS), 0);
  assert_int_equal(hold_proxy_wait_held(pb, 1, HOLD_MS), 0);
  hold_proxy_stop(pb); /* rail 1's link dies with chunks in flight on it */
  hold_proxy_release(pa);
  pthread_join(w.thread, NULL);
  ferry_log_set_handler(NULL, NULL);
  ferry_log_set_level(level);
  if (w.status)
    fail_msg("transfer with a rail dying under it: %s", w.why);
  /* rail 1's unacknowledged WRITEs moved only after the target cut their
   * connection, so none of their bytes can land over the next WRITEs */
  assert_true(__atomic_load_n(&cuts_asked, __ATOMIC_RELAXED) >= 1);
  assert_memory_equal(r.memory, r.out, BIG);
  uint64_t mid[2];
  assert_int_equal(test_rig_rail_bytes(&r, mid, NULL, NULL, 2), 2);
  assert_int_equal(mid[0] + mid[1], before[0] + before[1] + BIG);

  for (uint64_t seed = 100; seed < 103; seed++) {
    assert_int_equal(test_rig_write(&r, seed), FERRY_OK);
    assert_memory_equal(r.memory, r.out, BIG);
  }
  uint64_t after[2];
  int up[2];
  assert_int_equal(test_rig_rail_bytes(&r, after, up, NULL, 2), 2);
  print_message("rail 0: %llu, %llu, %llu bytes; rail 1: %llu, %llu, %llu bytes\n",
                (unsigned long long)before[0], (unsigned long long)mid[0],
                (unsigned long long)after[0], (unsigned long long)before[1],
                (unsigned long long)mid[1], (unsigned long long)after[1]);
  assert_true(up[0]);
  assert_false(up[1]);
  assert_int_equal(after[0], mid[0] + 3 * BIG); /* the later ones all went over rail 0 */
  assert_int_equal(after[1], mid[1]);
  char *text, line[160];
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(r.initiator, &s), FERRY_OK);
  assert_int_equal(ferry_stats_prometheus(s, &text), FERRY_OK);
  snprintf(line, sizeof line, "ferry_rail_up{peer=\"%s\",rail=\"%s\"} 0\n", r.name,
           s->rails[1].rail);
  assert_non_null(strstr(text, line));
  /* At least once: each of rail 1's channels with a chunk in flight may
   * report the failure before the rail is marked down. */
  snprintf(line, sizeof line, "ferry_rail_failures_total{peer=\"%s\",rail=\"%s\"} ", r.name,
           s->rails[1].rail);
  const char *failures = strstr(text, line);
  assert_non_null(failures);
  assert_true(strtoull(failures + strlen(line), NULL, 10) >= 1);
  free(text);
  ferry_stats_free(s);
  hold_proxy_stop(pa);
  test_rig_stop(&r);
}

/* Rail 1's link goes silent (its proxy a blackhole: nothing forwarded,
 * nothing acknowledged once the buffers are full, nothing closed) with the
 * transfers' deadline a minute away. The chunk caught on it makes no
 * progress for the stall bound, so its connection is cut at the target and
 * the chunk moves to rail 0: each transfer completes, verified, long before
 * its deadline, and rail 1 shows down. Once newer data is written, the
 * silent link delivers all it held: none of it lands. Polls a bounded
 * number of transfers, since under load rail 0's channels may take every
 * chunk of one before rail 1's get one. */
static void silent_rail_is_dropped(void **state) {
  char b[96], rails[200];
  hold_proxy *pb = proxied_rail(b, sizeof b);
  snprintf(rails, sizeof rails, "127.0.0.1,%s", b);
  test_rig r;
  rig_start_stall(&r, rails, STALL_MS);
  assert_int_equal(test_rig_write(&r, 1), FERRY_OK);
  ferry_log_level level = ferry_log_get_level();
  ferry_log_set_level(FERRY_LOG_DEBUG);
  __atomic_store_n(&cuts_asked, 0, __ATOMIC_RELAXED);
  ferry_log_set_handler(count_cuts, NULL);
  hold_proxy_blackhole(pb);
  uint64_t bytes[2];
  int up[2] = {1, 1};
  double slowest = 0;
  for (uint64_t seed = 2; seed < 22 && up[1]; seed++) {
    double start = test_now_s();
    if (test_rig_write(&r, seed))
      fail_msg("write with rail 1 silent: %s", ferry_last_error());
    double took = test_now_s() - start;
    slowest = took > slowest ? took : slowest;
    assert_memory_equal(r.memory, r.out, BIG);
    assert_int_equal(test_rig_rail_bytes(&r, bytes, up, NULL, 2), 2);
  }
  ferry_log_set_handler(NULL, NULL);
  ferry_log_set_level(level);
  print_message("slowest write: %.3f s (stall bound %u ms, deadline %u s)\n", slowest, STALL_MS,
                TIMEOUT_MS / 1000);
  assert_false(up[1]);
  assert_true(__atomic_load_n(&cuts_asked, __ATOMIC_RELAXED) >= 1);
  char rail[64], peer[80];
  snprintf(rail, sizeof rail, "rail 1 (%s)", hold_proxy_target(pb));
  snprintf(peer, sizeof peer, "peer %s:", r.name);
  print_message("%s\n", stall_warning);
  assert_non_null(strstr(stall_warning, peer));
  assert_non_null(strstr(stall_warning, rail));
  assert_non_null(strstr(stall_warning, "no progress for 1000 ms"));
  assert_true(slowest < TIMEOUT_MS / 2000.0);         /* well before the deadline */
  assert_int_equal(test_rig_write(&r, 99), FERRY_OK); /* newer data, over rail 0 */
  assert_memory_equal(r.memory, r.out, BIG);
  hold_proxy_release(pb); /* the silent link delivers the old frames it held */
  assert_int_equal(hold_proxy_wait_drained(pb, HOLD_MS), 0);
  assert_memory_equal(r.memory, r.out, BIG);
  hold_proxy_stop(pb);
  test_rig_stop(&r);
}

/* Both rails are slow links (16 KiB every 50 ms): a 512 KiB chunk takes
 * longer than the stall bound, but each piece is progress, so no rail is
 * dropped and the transfer completes on them. */
static void slow_rail_is_kept(void **state) {
  enum { PIECE = 16384, GAP_MS = 50, SIZE = 1 << 20 };
  uint16_t port_a = free_port(), port_b = free_port();
  hold_proxy *pa = hold_proxy_start_slow(port_a, PIECE, GAP_MS);
  hold_proxy *pb = hold_proxy_start_slow(port_b, PIECE, GAP_MS);
  assert_true(pa && pb);
  char rails[200];
  snprintf(rails, sizeof rails, "127.0.0.1:%u=%s,127.0.0.1:%u=%s", port_a, hold_proxy_target(pa),
           port_b, hold_proxy_target(pb));
  test_rig r;
  rig_start_stall(&r, rails, STALL_MS);
  test_fill_random(r.out, SIZE, 5);
  double start = test_now_s();
  ferry_status st = ferry_transfer_sync(r.initiator, r.name, FERRY_OP_WRITE, r.out,
                                        (uint64_t)(uintptr_t)r.memory, SIZE);
  double took = test_now_s() - start;
  if (st)
    fail_msg("write over slow rails: %s", ferry_last_error());
  assert_memory_equal(r.memory, r.out, SIZE);
  uint64_t bytes[2];
  int up[2];
  assert_int_equal(test_rig_rail_bytes(&r, bytes, up, NULL, 2), 2);
  print_message("took %.3f s (stall bound %u ms); rail 0: %llu bytes, rail 1: %llu bytes\n", took,
                STALL_MS, (unsigned long long)bytes[0], (unsigned long long)bytes[1]);
  assert_true(took > STALL_MS / 1000.0); /* a chunk did outlast the bound */
  assert_true(up[0] && up[1]);
  assert_int_equal(bytes[0] + bytes[1], SIZE);
  hold_proxy_stop(pa);
  hold_proxy_stop(pb);
  test_rig_stop(&r);
}

/* A rail that failed is tried again after its back-off: once its proxy is
 * back on the same port, transfers use it again. Polls for that state with
 * small verified transfers, a bounded number of times. */
static void rail_comes_back(void **state) {
  char entry[96], rails[160];
  uint16_t rail_port = free_port();
  hold_proxy *proxy = hold_proxy_start(rail_port);
  assert_non_null(proxy);
  uint16_t proxy_port = (uint16_t)atoi(strrchr(hold_proxy_target(proxy), ':') + 1);
  snprintf(entry, sizeof entry, "127.0.0.1:%u=%s", rail_port, hold_proxy_target(proxy));
  snprintf(rails, sizeof rails, "127.0.0.2,%s", entry);
  test_rig r;
  rig_start(&r, rails);
  assert_int_equal(test_rig_write(&r, 1), FERRY_OK);
  hold_proxy_stop(proxy);
  uint64_t down[2], now[2];
  int up[2] = {1, 1};
  /* Under load rail 0's channels may claim every chunk of a batch before
   * rail 1's get one, so rail 1 is seen down only once a chunk tried it. */
  for (int i = 0; i < 50 && up[1]; i++) {
    if (test_rig_write(&r, 2 + (uint64_t)i))
      fail_msg("write after rail 1 died: %s", ferry_last_error()); /* over rail 0 */
    assert_memory_equal(r.memory, r.out, BIG);
    assert_int_equal(test_rig_rail_bytes(&r, down, up, NULL, 2), 2);
  }
  assert_false(up[1]);
  proxy = hold_proxy_start_on(proxy_port, rail_port);
  assert_non_null(proxy);
  now[1] = down[1];
  for (int i = 0; i < 6000 && now[1] == down[1]; i++) { /* the back-off is 3 s */
    usleep(10000);
    test_fill_random(r.out, 4096, (uint64_t)i);
    assert_int_equal(ferry_transfer_sync(r.initiator, r.name, FERRY_OP_WRITE, r.out,
                                         (uint64_t)(uintptr_t)r.memory, 4096),
                     FERRY_OK);
    assert_memory_equal(r.memory, r.out, 4096);
    test_rig_rail_bytes(&r, now, up, NULL, 2);
  }
  assert_true(now[1] > down[1]);
  assert_true(up[1]);
  hold_proxy_stop(proxy);
  test_rig_stop(&r);
}

/* A proxied rail's proxy ("127.0.0.1:RAIL=127.0.0.1:PROXY") started again
 * on its port. */
static hold_proxy *restart_proxy(const char *entry) {
  unsigned rail_port, proxy_port;
  assert_int_equal(sscanf(entry, "127.0.0.1:%u=127.0.0.1:%u", &rail_port, &proxy_port), 2);
  hold_proxy *proxy = hold_proxy_start_on((uint16_t)proxy_port, (uint16_t)rail_port);
  assert_non_null(proxy);
  return proxy;
}

/* Both rails dead while the RPC port still answers: the batch fails, and
 * the error names each rail and its cause. Once they are back, the next
 * call works at once: with every rail out of use a checkout tries them
 * all again rather than wait out their back-off. */
static void every_rail_dead(void **state) {
  char a[96], b[96], rails[200];
  hold_proxy *pa = proxied_rail(a, sizeof a), *pb = proxied_rail(b, sizeof b);
  snprintf(rails, sizeof rails, "%s,%s", a, b);
  char name_a[32], name_b[32];
  snprintf(name_a, sizeof name_a, "%s", hold_proxy_target(pa));
  snprintf(name_b, sizeof name_b, "%s", hold_proxy_target(pb));
  test_rig r;
  rig_start(&r, rails);
  assert_int_equal(test_rig_write(&r, 9), FERRY_OK);
  hold_proxy_stop(pa);
  hold_proxy_stop(pb);
  ferry_status st = test_rig_write(&r, 10);
  const char *why = ferry_last_error();
  print_message("%s\n", why);
  assert_int_equal(st, FERRY_ESOCKET);
  assert_non_null(strstr(why, "every rail"));
  assert_non_null(strstr(why, name_a));
  assert_non_null(strstr(why, name_b));
  pa = restart_proxy(a);
  pb = restart_proxy(b);
  if (test_rig_write(&r, 11))
    fail_msg("write once both rails are back: %s", ferry_last_error());
  assert_memory_equal(r.memory, r.out, BIG);
  hold_proxy_stop(pa);
  hold_proxy_stop(pb);
  test_rig_stop(&r);
}

/* A rail must be a literal, pinned address; create refuses anything else,
 * naming the entry (every case of the parser: tests/unit/test_rail_list.c). */
static void bad_rail_lists_refused(void **state) {
  const char *bad[] = {"localhost", "127.0.0.1,::", "127.0.0.1:7000=name:1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.bind_host = "127.0.0.1";
    cfg.rail_hosts = bad[i];
    ferry_engine *e = NULL;
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_EINVAL);
    assert_null(e);
    assert_non_null(strstr(ferry_last_error(), "rail"));
  }
  setenv("FERRY_RAIL_HOSTS", "127.0.0.1,example.com", 1);
  ferry_config cfg;
  ferry_config_init(&cfg);
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "FERRY_RAIL_HOSTS"));
  assert_non_null(strstr(ferry_last_error(), "example.com"));
  unsetenv("FERRY_RAIL_HOSTS");
}

/* FERRY_STALL_MS is a positive number of ms; anything else fails create
 * naming it (0 would be "the default" only in the field). */
static void bad_stall_bound_refused(void **state) {
  const char *bad[] = {"0", "abc", "-5", "4294967296"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("FERRY_STALL_MS", bad[i], 1);
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.bind_host = "127.0.0.1";
    ferry_engine *e = NULL;
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_EINVAL);
    assert_null(e);
    assert_non_null(strstr(ferry_last_error(), "FERRY_STALL_MS"));
  }
  unsetenv("FERRY_STALL_MS");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(striped_over_two_addresses),
      cmocka_unit_test(small_batches_take_turns),
      cmocka_unit_test(rail_dies_mid_transfer),
      cmocka_unit_test(silent_rail_is_dropped),
      cmocka_unit_test(slow_rail_is_kept),
      cmocka_unit_test(rail_comes_back),
      cmocka_unit_test(every_rail_dead),
      cmocka_unit_test(bad_rail_lists_refused),
      cmocka_unit_test(bad_stall_bound_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
