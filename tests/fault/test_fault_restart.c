/* test_fault_restart.c - a target killed in the middle of batches and started
 * again on the same address, over and over.
 *
 * Host a (the test process, moved into its namespace) runs the initiator;
 * host b runs `ferry serve`, joined by a veth pair. Each round submits a few
 * batches of WRITEs and READs, SIGKILLs the target while they are in flight
 * (every other round it is stopped first and one more batch submitted, which
 * therefore is provably in flight at the kill however busy the machine is),
 * checks that every call ends with a clear error well before its timeout,
 * at the reset (or succeeded before the kill), checks that a call made while the target is
 * down fails fast, restarts the target on the same port, and checks that the
 * very next call reconnects and moves bytes that read back intact (crc32c).
 *
 * Two layouts: the restarted target's buffer at a new address (address-space
 * randomization on), and at the same address (a target with a fixed memory
 * layout), where only the instance id tells the incarnations apart.
 * FERRY_FAULT_ROUNDS overrides the round count (default 100 and 30). Without
 * namespaces the same runs on 127.0.0.1. */
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

#define TARGET_PORT 15100
/* The deadline of the calls the kill must end. Only a call that waited it
 * out takes that long; noticing the kill took up to 2 s over fabric beside
 * builds (load 7), so the deadline is well past that. */
#define TIMEOUT_MS 5000
#define BATCHES 3 /* submitted to the running target; one more to the stopped one */
#define ENTRIES 8
#define ENTRY_SIZE (256 * 1024)
#define LOCAL_SIZE ((BATCHES + 1) * ENTRIES * ENTRY_SIZE + 2 * ENTRY_SIZE)

typedef struct env {
  fault_net *net;
  const char *addr_a, *addr_b;
} env;

static int rounds(int fallback) {
  const char *v = getenv("FERRY_FAULT_ROUNDS");
  return v && atoi(v) > 0 ? atoi(v) : fallback;
}

static int setup(void **state) {
  static env e;
  e.net = fault_net_open(2);
  if (!e.net)
    return -1;
  int link = fault_net_link(e.net, 0, 1, FAULT_LINK_VETH);
  if (link < 0)
    return -1;
  e.addr_a = fault_link_addr(e.net, link, 0);
  e.addr_b = fault_link_addr(e.net, link, 1);
  *state = &e;
  return 0;
}

static int teardown(void **state) {
  env *e = *state; /* NULL when the group setup failed */
  if (e)
    fault_net_destroy(e->net);
  return 0;
}

typedef struct stats {
  int failed_in_flight, succeeded_before_kill, restarts, verified;
  double worst_fail_s;
} stats;

static ferry_batch *submit(ferry_engine *eng, const fault_proc *target, uint8_t *local, int b,
                           int round) {
  ferry_entry entries[ENTRIES];
  for (int i = 0; i < ENTRIES; i++) {
    size_t slot = (size_t)(b * ENTRIES + i);
    entries[i] =
        (ferry_entry){(b + i) % 2 ? FERRY_OP_READ : FERRY_OP_WRITE, local + slot * ENTRY_SIZE,
                      target->addr + slot * ENTRY_SIZE, ENTRY_SIZE};
  }
  ferry_batch *batch;
  ferry_status st = ferry_batch_submit(eng, target->target, entries, ENTRIES, NULL, &batch);
  if (st != FERRY_OK)
    fail_msg("round %d: submit failed: %s: %s", round, ferry_strerror(st), ferry_last_error());
  return batch;
}

static void kill_restart_rounds(env *e, int fixed_layout, int count, stats *s) {
  fault_proc target;
  uint16_t port = fault_port(e->net, TARGET_PORT);
  assert_int_equal(
      fault_serve_start(&target, e->net, 1, e->addr_b, port, "32M", NULL, fixed_layout), 0);
  assert_int_equal(fault_net_enter(e->net, 0), 0);
  /* TIMEOUT_MS is for the calls the kill must end; a first contact (each
   * round's reconnect included: fabric endpoints take seconds on a busy
   * machine) is not what is timed. */
  ferry_engine *eng = fault_engine(e->addr_a, TEST_SETUP_MS, TEST_SETUP_MS, 0);
  assert_non_null(eng);
  uint8_t *local = fault_buffer(eng, LOCAL_SIZE);
  assert_non_null(local);
  uint8_t *scratch = local + (BATCHES + 1) * ENTRIES * ENTRY_SIZE;
  assert_int_equal(fault_roundtrip(eng, target.target, scratch, target.addr, ENTRY_SIZE, 1), 0);
  uint64_t seed = 2;
  for (int round = 0; round < count; round++) {
    /* Batches in flight: half WRITE, half READ, spread over the buffer. */
    test_engine_set_timeouts(eng, TIMEOUT_MS, 1000);
    ferry_batch *batches[BATCHES + 1] = {0};
    int nbatches = BATCHES;
    for (int b = 0; b < BATCHES; b++)
      batches[b] = submit(eng, &target, local, b, round);
    fault_sleep_ms((unsigned)(round % 3)); /* 0..2 ms: catch them at different points */
    int stopped = round % 2;
    if (stopped) { /* nothing answers the last batch: it must fail */
      assert_int_equal(fault_proc_pause(&target), 0);
      batches[nbatches] = submit(eng, &target, local, nbatches, round);
      nbatches++;
    }
    double killed_at = fault_now();
    fault_proc_kill(&target);
    for (int b = 0; b < nbatches; b++) {
      ferry_status st = ferry_batch_wait(batches[b], TIMEOUT_MS + 3000);
      double took = fault_now() - killed_at;
      if (st == FERRY_EINPROGRESS)
        fail_msg("round %d: a batch to the killed target still pending %.1f s later", round, took);
      if (st == FERRY_OK && stopped && b == nbatches - 1)
        fail_msg("round %d: a batch submitted to a stopped target succeeded", round);
      if (st == FERRY_OK) {
        s->succeeded_before_kill++;
      } else {
        s->failed_in_flight++;
        if (took > s->worst_fail_s)
          s->worst_fail_s = took;
        const char *why = ferry_last_error();
        if (st != FERRY_ESOCKET && st != FERRY_ETIMEDOUT)
          fail_msg("round %d: in-flight call failed with %s (%s), expected a socket error or a "
                   "timeout",
                   round, ferry_strerror(st), why);
        assert_true(strlen(why) > 10);
        /* The kill resets the target's connections at once: a call in
         * flight ends then, not at its deadline, which comes at least
         * TIMEOUT_MS less the few ms before the kill (tcp takes
         * milliseconds, fabric up to 2 s on a busy machine; 85% of the
         * deadline is the bound). */
        if (took >= TIMEOUT_MS * 0.85 / 1000.0)
          fail_msg("round %d: a call in flight failed %.3f s after the kill (%s): it waited for "
                   "its deadline instead of noticing the dead target",
                   round, took, why);
      }
      ferry_batch_free(batches[b]);
    }
    /* Down: a call fails fast, it does not wait for a timeout. */
    if (round % 10 == 0) {
      double t0 = fault_now();
      ferry_status st =
          ferry_transfer_sync(eng, target.target, FERRY_OP_WRITE, scratch, target.addr, 4096);
      assert_int_not_equal(st, FERRY_OK);
      assert_true(fault_now() - t0 < (TIMEOUT_MS + 1500) / 1000.0);
    }
    assert_int_equal(fault_serve_restart(&target), 0);
    s->restarts++;
    test_engine_set_timeouts(eng, TEST_SETUP_MS, TEST_SETUP_MS);
    /* The very next call reconnects and moves intact bytes. */
    ferry_status st = fault_roundtrip(eng, target.target, scratch, target.addr + (seed % 16) * 4096,
                                      ENTRY_SIZE, seed);
    if (st != FERRY_OK)
      fail_msg("round %d: first call after the restart failed: %s: %s", round, ferry_strerror(st),
               ferry_last_error());
    s->verified++;
    seed++;
  }
  fault_buffer_free(eng, local);
  ferry_engine_destroy(eng);
  fault_net_leave(e->net);
  assert_int_equal(fault_proc_term(&target), 0);
}

static void test_restart_new_layout(void **state) {
  int count = rounds(100);
  fault_watchdog(240, "kill/restart rounds, new layout");
  stats s = {0};
  kill_restart_rounds(*state, 0, count, &s);
  fault_watchdog(0, NULL);
  printf("restarts survived: %d (calls failed in flight: %d, finished before the kill: %d, "
         "slowest failure %.3f s, verified round trips: %d)\n",
         s.restarts, s.failed_in_flight, s.succeeded_before_kill, s.worst_fail_s, s.verified);
  assert_int_equal(s.restarts, count);
  /* The kill really landed mid-batch: at least in every other round. */
  assert_true(s.failed_in_flight >= count / 2);
}

static void test_restart_same_layout(void **state) {
  int count = rounds(30);
  fault_watchdog(180, "kill/restart rounds, same layout");
  stats s = {0};
  kill_restart_rounds(*state, 1, count, &s);
  fault_watchdog(0, NULL);
  printf("restarts survived (same addresses): %d (failed in flight: %d, verified: %d)\n",
         s.restarts, s.failed_in_flight, s.verified);
  assert_int_equal(s.restarts, count);
}

int main(void) {
  struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restart_new_layout),
      cmocka_unit_test(test_restart_same_layout),
  };
  return fault_run_tests(tests, setup, teardown);
}
