/* test_fault_pause.c - a target frozen with SIGSTOP: its kernel still
 * accepts connections and buffers bytes, but nothing answers.
 *
 * Hosts: a (initiator, the test process), b (the target that gets paused),
 * c (a second target that must not notice), each joined to a by veth.
 * Promises checked: calls to the paused target end with FERRY_ETIMEDOUT
 * near the configured timeout (config timeout_ms; not early, not late), on
 * live channels, new connections, probes and notifications alike; calls to
 * the other target keep succeeding at normal latency, synchronous and
 * asynchronous ones; after SIGCONT the next call works. Without namespaces
 * the same runs on 127.0.0.1.
 *
 * What is asserted does not depend on how busy the machine is: the pause is
 * complete before any call to b (waitpid reports the stop), a timeout is
 * never early (exact) and late only by generous slack, and "not held up by
 * the paused target" is shown by order, not by a time limit: the healthy
 * target's batch completes while the batches to b are all still pending
 * (they can only end by their deadline). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fault.h"
#include "harness.h"

#define TIMEOUT_MS 1500
#define CONNECT_MS 1000
#define PORT_B 15300
#define PORT_C 15301
#define SLACK_S 1.0 /* scheduling slack past a deadline */

typedef struct env {
  fault_net *net;
  int link_b, link_c;
  fault_proc b, c;
} env;

static env E;

static int setup(void **state) {
  E.net = fault_net_open(3);
  if (!E.net)
    return -1;
  E.link_b = fault_net_link(E.net, 0, 1, FAULT_LINK_VETH);
  E.link_c = fault_net_link(E.net, 0, 2, FAULT_LINK_VETH);
  uint16_t pb = fault_port(E.net, PORT_B), pc = fault_port(E.net, PORT_C);
  if (E.link_b < 0 || E.link_c < 0 ||
      fault_serve_start(&E.b, E.net, 1, fault_link_addr(E.net, E.link_b, 1), pb, "64M", NULL, 0) ||
      fault_serve_start(&E.c, E.net, 2, fault_link_addr(E.net, E.link_c, 1), pc, "64M", NULL, 0))
    return -1;
  *state = &E;
  return 0;
}

static int teardown(void **state) {
  fault_proc_term(&E.b);
  fault_proc_term(&E.c);
  fault_net_destroy(E.net);
  return 0;
}

/* An engine on a's side of b's link whose first contacts get
 * TEST_SETUP_MS; the cases shorten its bounds for the calls they time. */
static ferry_engine *patient_engine(void) {
  return fault_engine(fault_link_addr(E.net, E.link_b, 0), TEST_SETUP_MS, TEST_SETUP_MS, 0);
}

/* Round trips to the healthy target in a loop, until told to stop. */
typedef struct bystander {
  ferry_engine *eng;
  uint8_t *local;
  int stop;
  int ops, failures;
  double worst_s;
  char first_error[256];
  pthread_t thread;
} bystander;

static void *bystander_loop(void *arg) {
  bystander *by = arg;
  for (uint64_t seed = 1000; !__atomic_load_n(&by->stop, __ATOMIC_ACQUIRE); seed++) {
    double t0 = fault_now();
    ferry_status st = fault_roundtrip(by->eng, E.c.target, by->local,
                                      E.c.addr + (seed % 64) * 65536, 65536, seed);
    double took = fault_now() - t0;
    if (took > by->worst_s)
      by->worst_s = took;
    if (st != FERRY_OK && by->failures++ == 0)
      snprintf(by->first_error, sizeof by->first_error, "%s: %s", ferry_strerror(st),
               ferry_last_error());
    by->ops++;
    fault_sleep_ms(2);
  }
  return NULL;
}

static void expect_timeout(ferry_status st, double took, const char *what, double limit_s) {
  printf("  %-44s -> %s after %.2f s\n", what, ferry_strerror(st), took);
  if (st != FERRY_ETIMEDOUT)
    fail_msg("%s on the paused target: %s (%s), expected a timeout", what, ferry_strerror(st),
             ferry_last_error());
  if (took > limit_s + SLACK_S)
    fail_msg("%s on the paused target: timed out after %.2f s, deadline %.2f s", what, took,
             limit_s);
}

static void test_paused_target_times_out(void **state) {
  fault_watchdog(120, "paused target");
  assert_int_equal(fault_net_enter(E.net, 0), 0);
  ferry_engine *eng = patient_engine();
  assert_non_null(eng);
  uint8_t *local = fault_buffer(eng, 16 << 20);
  uint8_t *by_local = fault_buffer(eng, 1 << 20);
  assert_int_equal(fault_roundtrip(eng, E.b.target, local, E.b.addr, 1 << 20, 1), FERRY_OK);
  assert_int_equal(fault_roundtrip(eng, E.c.target, local, E.c.addr, 1 << 20, 2), FERRY_OK);
  test_engine_set_timeouts(eng, TIMEOUT_MS, CONNECT_MS);

  bystander by = {.eng = eng, .local = by_local};
  pthread_create(&by.thread, NULL, bystander_loop, &by);
  fault_sleep_ms(100);
  assert_int_equal(fault_proc_pause(&E.b), 0);
  printf("target b paused (timeout_ms %d, connect_timeout_ms %d):\n", TIMEOUT_MS, CONNECT_MS);
  /* A call ends between the connect timeout (a new connection's handshake
   * goes unanswered) and the transfer timeout (a live channel stops
   * answering), plus the per-MiB allowance and some slack. */
  const double earliest = CONNECT_MS / 1000.0 - 0.05, latest = TIMEOUT_MS / 1000.0 + 0.016;

  /* Async batches to the paused target, submitted while the engine still
   * believes it healthy, then one to the healthy target: it must not wait
   * for a worker behind them. */
  enum { STUCK = 6 };
  ferry_batch *stuck[STUCK];
  fault_pattern(local, 16 << 20, 3);
  double t0 = fault_now();
  for (int i = 0; i < STUCK; i++) {
    ferry_entry en = {FERRY_OP_WRITE, local + (size_t)i * (2 << 20),
                      E.b.addr + (uint64_t)i * (2 << 20), 2 << 20};
    ferry_status st = ferry_batch_submit(eng, E.b.target, &en, 1, NULL, &stuck[i]);
    if (st != FERRY_OK)
      fail_msg("async submit %d to the paused target: %s: %s", i, ferry_strerror(st),
               ferry_last_error());
  }
  fault_sleep_ms(50);
  ferry_entry en = {FERRY_OP_WRITE, by_local + (512 << 10), E.c.addr + (8 << 20), 65536};
  fault_pattern(by_local + (512 << 10), 65536, 4); /* past the bystander's 128 KiB */
  ferry_batch *healthy;
  double h0 = fault_now();
  assert_int_equal(ferry_batch_submit(eng, E.c.target, &en, 1, NULL, &healthy), FERRY_OK);
  ferry_status healthy_st = ferry_batch_wait(healthy, 10000);
  double healthy_took = fault_now() - h0;
  ferry_batch_free(healthy);
  int still_stuck = 0; /* batches to b still pending when the healthy one was done */
  for (int i = 0; i < STUCK; i++)
    still_stuck += ferry_batch_status(stuck[i], NULL) == FERRY_BATCH_PENDING;
  printf("  async 64 KiB WRITE to the healthy target behind %d async batches to the paused one: "
         "%s after %.3f s, with %d of them still pending\n",
         STUCK, ferry_strerror(healthy_st), healthy_took, still_stuck);
  for (int i = 0; i < STUCK; i++) {
    ferry_status st = ferry_batch_wait(stuck[i], 10000);
    double took = fault_now() - t0;
    if (st == FERRY_EINPROGRESS)
      fail_msg("async batch %d to the paused target still pending after %.1f s", i, took);
    ferry_batch_free(stuck[i]);
    char what[64];
    snprintf(what, sizeof what, "async 2 MiB WRITE %d", i);
    expect_timeout(st, took, what, latest + 0.05);
  }

  /* Synchronous calls of every kind. */
  t0 = fault_now();
  ferry_status st = ferry_transfer_sync(eng, E.b.target, FERRY_OP_WRITE, local, E.b.addr, 16 << 20);
  double took = fault_now() - t0;
  expect_timeout(st, took, "16 MiB WRITE", latest);
  assert_true(took >= earliest); /* not given up early */

  t0 = fault_now();
  st = ferry_transfer_sync(eng, E.b.target, FERRY_OP_READ, local, E.b.addr, 65536);
  took = fault_now() - t0;
  expect_timeout(st, took, "64 KiB READ", latest);
  assert_true(took >= earliest);

  t0 = fault_now();
  st = ferry_probe(eng, E.b.target);
  expect_timeout(st, fault_now() - t0, "probe", CONNECT_MS / 1000.0);

  t0 = fault_now();
  st = ferry_notify_send(eng, E.b.target, "paused", "x", 1);
  expect_timeout(st, fault_now() - t0, "notification", latest);

  __atomic_store_n(&by.stop, 1, __ATOMIC_RELEASE);
  pthread_join(by.thread, NULL);
  printf("healthy target c during the pause: %d round trips, %d failures, slowest %.3f s%s%s\n",
         by.ops, by.failures, by.worst_s, by.failures ? ", first: " : "", by.first_error);

  fault_proc_resume(&E.b);
  test_engine_set_timeouts(eng, TEST_SETUP_MS, TEST_SETUP_MS); /* draining first: not the point */
  /* A region the timed-out writes did not touch: their bytes may still be
   * landing (see RELIABILITY.md, "failed writes"). */
  assert_int_equal(fault_roundtrip(eng, E.b.target, local, E.b.addr + (32 << 20), 1 << 20, 5),
                   FERRY_OK);
  fault_buffer_free(eng, by_local);
  fault_buffer_free(eng, local);
  ferry_engine_destroy(eng);
  fault_net_leave(E.net);
  fault_watchdog(0, NULL);

  assert_int_equal(by.failures, 0);
  assert_true(by.ops > 10);
  /* A round trip that waited for the paused target would take its timeout
   * (1.5 s); the usual is milliseconds. */
  if (by.worst_s >= TIMEOUT_MS / 1000.0)
    fail_msg("a round trip to the healthy target took %.2f s while the other was paused",
             by.worst_s);
  assert_int_equal(healthy_st, FERRY_OK);
  if (still_stuck != STUCK)
    fail_msg("an async batch to a healthy target completed only after %d of %d batches to a "
             "paused one had ended, %.2f s after its submit (worker pool head-of-line blocking)",
             STUCK - still_stuck, STUCK, healthy_took);
}

/* What a timed-out WRITE leaves behind: its bytes were handed to TCP, so a
 * paused target that resumes may still apply them, possibly after a later
 * WRITE to the same range succeeded. Measured and reported here; the
 * promise (RELIABILITY.md) is only that a failed WRITE leaves the range
 * undefined until a later WRITE succeeds after the target has drained. */
static void test_paused_write_lands_late(void **state) {
  fault_watchdog(60, "late landing of timed-out writes");
  assert_int_equal(fault_net_enter(E.net, 0), 0);
  ferry_engine *eng = patient_engine();
  assert_non_null(eng);
  size_t len = 16 << 20;
  uint8_t *old = fault_buffer(eng, len);
  uint8_t *fresh = fault_buffer(eng, 2 * len);
  assert_int_equal(fault_roundtrip(eng, E.b.target, fresh, E.b.addr, len, 1), FERRY_OK);
  fault_pattern(old, len, 11);
  assert_int_equal(fault_proc_pause(&E.b), 0);
  test_engine_set_timeouts(eng, TIMEOUT_MS, CONNECT_MS);
  ferry_status st = ferry_transfer_sync(eng, E.b.target, FERRY_OP_WRITE, old, E.b.addr, len);
  assert_int_equal(st, FERRY_ETIMEDOUT);
  fault_proc_resume(&E.b);
  test_engine_set_timeouts(eng, TEST_SETUP_MS, TEST_SETUP_MS);
  st = fault_roundtrip(eng, E.b.target, fresh, E.b.addr, len, 12);
  assert_int_equal(st, FERRY_OK);
  fault_sleep_ms(1000);
  assert_int_equal(ferry_transfer_sync(eng, E.b.target, FERRY_OP_READ, fresh + len, E.b.addr, len),
                   FERRY_OK);
  size_t stale = 0;
  for (size_t i = 0; i < len; i++)
    stale += fresh[len + i] != fresh[i];
  printf("after resume: %zu of %zu bytes of the later, successful WRITE were overwritten by the "
         "timed-out one\n",
         stale, len);
  fault_buffer_free(eng, fresh);
  fault_buffer_free(eng, old);
  ferry_engine_destroy(eng);
  fault_net_leave(E.net);
  fault_watchdog(0, NULL);
}

int main(void) {
  struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paused_target_times_out),
      cmocka_unit_test(test_paused_write_lands_late),
  };
  return fault_run_tests(tests, setup, teardown);
}
