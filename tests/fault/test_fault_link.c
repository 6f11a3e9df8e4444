/* test_fault_link.c - links that fail under a transfer: cut for 5 s in the
 * middle of 1 GiB, or impaired with delay, loss and reordering.
 *
 * Hosts: a (initiator, the test process), b (a `ferry serve` with 1 GiB,
 * veth link that gets cut), c (a small target behind the userspace link
 * emulator). The same faults through tc netem: test_fault_netem.c. Every
 * transfer is checked end to end with crc32c of the bytes sent against the
 * bytes read back.
 *
 * The cut must land while the 1 GiB transfer is in flight however busy the
 * machine is, so the test makes it so instead of timing it: the target is
 * stopped before the batch is submitted (it cannot finish), the link is cut
 * once host b's kernel has received bytes of the batch (it is on the wire),
 * and only then does the target continue, into the outage.
 *
 * Promises checked: a call never hangs (it ends by its deadline: base
 * timeout + per-MiB allowance), never reports success with wrong data, and
 * the next call after a failure works; with loss and delay transfers still
 * complete and verify. Needs network namespaces (root); skipped with the
 * reason where they are unavailable. */
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

#define BIG (1ull << 30)
#define CHUNK (64ull << 20)
#define SMALL_PORT 15200
#define BIG_PORT 15201
#define OUTAGE_MS 5000
#define SLACK_S 3.0 /* scheduling slack on a deadline: generous, time is not the point */

typedef struct env {
  fault_net *net;
  int cut_link, emu_link;
  fault_proc big, small_emu;
  char skip_why[512];
} env;

static env E;

static int setup(void **state) {
  *state = &E;
  if (fault_net_open_isolated(3, &E.net, E.skip_why, sizeof E.skip_why) != 0)
    return -1;
  if (!E.net)
    return 0; /* skipped: E.skip_why says why */
  E.cut_link = fault_net_link(E.net, 0, 1, FAULT_LINK_VETH);
  E.emu_link = fault_net_link(E.net, 0, 2, FAULT_LINK_EMU);
  if (E.cut_link < 0 || E.emu_link < 0)
    return -1;
  if (fault_serve_start(&E.big, E.net, 1, fault_link_addr(E.net, E.cut_link, 1), BIG_PORT, "1G",
                        NULL, 0) != 0 ||
      fault_serve_start(&E.small_emu, E.net, 2, fault_link_addr(E.net, E.emu_link, 1), SMALL_PORT,
                        "64M", NULL, 0) != 0)
    return -1;
  return 0;
}

static int teardown(void **state) {
  if (E.net) {
    fault_proc_term(&E.big);
    fault_proc_term(&E.small_emu);
    fault_net_destroy(E.net);
  }
  return 0;
}

/* crc32c of remote [addr, addr + len), read back CHUNK bytes at a time. */
static ferry_status remote_crc(ferry_engine *eng, const char *target, uint8_t *scratch,
                               uint64_t addr, uint64_t len, uint32_t *crc) {
  *crc = 0;
  for (uint64_t off = 0; off < len; off += CHUNK) {
    size_t n = (size_t)(len - off < CHUNK ? len - off : CHUNK);
    ferry_status st = ferry_transfer_sync(eng, target, FERRY_OP_READ, scratch, addr + off, n);
    if (st)
      return st;
    *crc = ferry_crc32c(*crc, scratch, n);
  }
  return FERRY_OK;
}

typedef struct outcome {
  ferry_status status;
  double took_s;      /* submit to end */
  double limit_s;     /* the batch's own deadline */
  int pending_at_cut; /* the cut really hit a transfer in flight */
  uint64_t rx_at_cut; /* bytes of it host b had received by then */
} outcome;

static uint64_t big_target_rx(void) {
  uint64_t rx = 0;
  assert_int_equal(fault_link_rx_bytes(E.net, E.cut_link, 1, &rx), 0);
  return rx;
}

/* One 1 GiB batch (16 entries of 64 MiB) with the link cut for OUTAGE_MS
 * while it is in flight (see the top of the file): the cut comes once host
 * b has received min_rx bytes since the submit. Returns how it ended. */
static outcome big_transfer_with_outage(ferry_engine *eng, uint32_t timeout_ms, ferry_op op,
                                        uint8_t *local, uint64_t min_rx) {
  ferry_entry entries[BIG / CHUNK];
  for (size_t i = 0; i < BIG / CHUNK; i++)
    entries[i] = (ferry_entry){op, local + i * CHUNK, E.big.addr + i * CHUNK, CHUNK};
  outcome o = {0};
  o.limit_s = timeout_ms / 1000.0 + (double)(BIG >> 20) * 1e-3; /* + 1 ms per MiB */
  assert_int_equal(fault_proc_pause(&E.big), 0);
  uint64_t rx0 = big_target_rx();
  double t0 = fault_now();
  ferry_batch *b;
  ferry_status st = ferry_batch_submit(eng, E.big.target, entries, BIG / CHUNK, NULL, &b);
  if (st)
    fail_msg("submit: %s: %s", ferry_strerror(st), ferry_last_error());
  /* Bytes on the wire: a wait on what the test controls, bounded only in
   * case the engine never sends (which fails below). */
  while ((o.rx_at_cut = big_target_rx() - rx0) < min_rx && fault_now() - t0 < 10.0)
    fault_sleep_ms(1);
  o.pending_at_cut = ferry_batch_status(b, NULL) == FERRY_BATCH_PENDING;
  assert_int_equal(fault_link_set_up(E.net, E.cut_link, 0), 0);
  double cut_at = fault_now();
  fault_proc_resume(&E.big);
  /* Waiting through the outage: a batch that gives up must do so by its
   * deadline even while the link is still down. */
  st = ferry_batch_wait(b, OUTAGE_MS);
  o.took_s = fault_now() - t0;
  double rest = OUTAGE_MS / 1000.0 - (fault_now() - cut_at);
  if (rest > 0)
    fault_sleep_ms((unsigned)(rest * 1000));
  assert_int_equal(fault_link_set_up(E.net, E.cut_link, 1), 0);
  if (st == FERRY_EINPROGRESS) {
    double left = o.limit_s - (fault_now() - t0);
    st = ferry_batch_wait(b, (int64_t)((left > 0 ? left : 0) * 1000) + 5000);
    o.took_s = fault_now() - t0;
  }
  if (st == FERRY_EINPROGRESS)
    fail_msg("1 GiB %s still pending %.1f s after submit (deadline %.1f s): hung",
             op == FERRY_OP_WRITE ? "WRITE" : "READ", o.took_s, o.limit_s);
  if (st != FERRY_OK)
    printf("  ended with %s after %.2f s: %s\n", ferry_strerror(st), o.took_s, ferry_last_error());
  ferry_batch_free(b);
  o.status = st;
  return o;
}

static void print_outcome(const char *what, const outcome *o) {
  printf("%s: %s after %.2f s (deadline %.2f s; in flight at the cut: %s, %llu bytes of it "
         "received by the target's host)\n",
         what, o->status ? ferry_strerror(o->status) : "completed", o->took_s, o->limit_s,
         o->pending_at_cut ? "yes" : "no", (unsigned long long)o->rx_at_cut);
}

/* Opens every data channel (4 x 64 MiB takes all four) while the target
 * answers, so that the transfers under test start on live channels. */
static void open_channels(ferry_engine *eng, uint8_t *local) {
  assert_int_equal(
      ferry_transfer_sync(eng, E.big.target, FERRY_OP_WRITE, local, E.big.addr, 4 * CHUNK),
      FERRY_OK);
}

/* Link down 5 s with a generous timeout: the batch survives the outage
 * (TCP retransmits) or fails by its deadline; either way the bytes that
 * are reported as moved are exactly right. */
static void test_link_down_during_1gib(void **state) {
  fault_skip_without_net(E.net, E.skip_why);
  fault_watchdog(200, "link down during 1 GiB");
  assert_int_equal(fault_net_enter(E.net, 0), 0);
  ferry_engine *eng = fault_engine(fault_link_addr(E.net, E.cut_link, 0), 20000, 3000, 0);
  assert_non_null(eng);
  uint8_t *local = fault_buffer(eng, BIG);
  uint8_t *scratch = fault_buffer(eng, CHUNK);
  assert_non_null(local);
  assert_non_null(scratch);
  fault_pattern(local, BIG, 77);
  uint32_t sent = ferry_crc32c(0, local, BIG);
  open_channels(eng, local);

  /* WRITE under an outage: the cut once 64 KiB of payload arrived. */
  outcome o = big_transfer_with_outage(eng, 20000, FERRY_OP_WRITE, local, 64 << 10);
  print_outcome("1 GiB WRITE, link down 5 s", &o);
  assert_true(o.pending_at_cut);
  assert_true(o.rx_at_cut >= 64 << 10);
  assert_true(o.took_s <= o.limit_s + SLACK_S);
  if (o.status != FERRY_OK) {
    assert_true(o.status == FERRY_ETIMEDOUT || o.status == FERRY_ESOCKET);
    ferry_status st =
        ferry_transfer_sync(eng, E.big.target, FERRY_OP_WRITE, local, E.big.addr, BIG);
    if (st)
      fail_msg("retry after the link returned: %s: %s", ferry_strerror(st), ferry_last_error());
  }
  uint32_t got;
  assert_int_equal(remote_crc(eng, E.big.target, scratch, E.big.addr, BIG, &got), FERRY_OK);
  assert_int_equal(got, sent);

  /* READ under an outage: local gets the target's bytes or the call fails.
   * The cut once the target's host has the first request. */
  memset(local, 0, BIG);
  o = big_transfer_with_outage(eng, 20000, FERRY_OP_READ, local, 1);
  print_outcome("1 GiB READ, link down 5 s", &o);
  assert_true(o.pending_at_cut);
  assert_true(o.rx_at_cut >= 1);
  assert_true(o.took_s <= o.limit_s + SLACK_S);
  if (o.status == FERRY_OK)
    assert_int_equal(ferry_crc32c(0, local, BIG), sent);
  else
    assert_true(o.status == FERRY_ETIMEDOUT || o.status == FERRY_ESOCKET);

  fault_buffer_free(eng, scratch);
  fault_buffer_free(eng, local);
  ferry_engine_destroy(eng);
  fault_net_leave(E.net);
  fault_watchdog(0, NULL);
}

/* Link down 5 s with a 2 s timeout: the call must fail by its deadline (not
 * hang until the link returns), and once the link is back the next call
 * works and its bytes stay put. */
static void test_link_down_short_timeout(void **state) {
  fault_skip_without_net(E.net, E.skip_why);
  fault_watchdog(120, "link down, short timeout");
  assert_int_equal(fault_net_enter(E.net, 0), 0);
  ferry_engine *eng =
      fault_engine(fault_link_addr(E.net, E.cut_link, 0), TEST_SETUP_MS, TEST_SETUP_MS, 0);
  assert_non_null(eng);
  uint8_t *local = fault_buffer(eng, BIG);
  uint8_t *scratch = fault_buffer(eng, CHUNK);
  assert_non_null(local);
  fault_pattern(local, BIG, 91);
  open_channels(eng, local);
  test_engine_set_timeouts(eng, 2000, 1000); /* for the calls the outage must end */

  outcome o = big_transfer_with_outage(eng, 2000, FERRY_OP_WRITE, local, 64 << 10);
  print_outcome("1 GiB WRITE, 2 s timeout, link down 5 s", &o);
  assert_true(o.pending_at_cut);
  assert_true(o.rx_at_cut >= 64 << 10);
  assert_int_equal(o.status, FERRY_ETIMEDOUT);
  assert_true(o.took_s <= o.limit_s + SLACK_S);
  /* With the link down at the start of a call: it fails by its deadline. */
  ferry_batch *b;
  ferry_entry en = {FERRY_OP_WRITE, local, E.big.addr, CHUNK};
  assert_int_equal(fault_link_set_up(E.net, E.cut_link, 0), 0);
  double t0 = fault_now();
  ferry_status st = ferry_batch_submit(eng, E.big.target, &en, 1, NULL, &b);
  if (st == FERRY_OK) {
    st = ferry_batch_wait(b, 10000);
    ferry_batch_free(b);
  }
  double took = fault_now() - t0;
  assert_int_equal(fault_link_set_up(E.net, E.cut_link, 1), 0);
  printf("64 MiB WRITE with the link down: %s after %.2f s\n", ferry_strerror(st), took);
  assert_int_not_equal(st, FERRY_OK);
  assert_int_not_equal(st, FERRY_EINPROGRESS);
  assert_true(took <= 2.0 + 0.064 + SLACK_S);

  /* Link back: the next call works, and what it wrote is what stays. */
  test_engine_set_timeouts(eng, TEST_SETUP_MS, TEST_SETUP_MS);
  fault_pattern(scratch, CHUNK, 92);
  uint32_t want = ferry_crc32c(0, scratch, CHUNK);
  st = ferry_transfer_sync(eng, E.big.target, FERRY_OP_WRITE, scratch, E.big.addr, CHUNK);
  if (st)
    fail_msg("first call after the link returned: %s: %s", ferry_strerror(st), ferry_last_error());
  memset(scratch, 0, CHUNK);
  assert_int_equal(
      ferry_transfer_sync(eng, E.big.target, FERRY_OP_READ, scratch, E.big.addr, CHUNK), FERRY_OK);
  assert_int_equal(ferry_crc32c(0, scratch, CHUNK), want);
  fault_buffer_free(eng, scratch);
  fault_buffer_free(eng, local);
  ferry_engine_destroy(eng);
  fault_net_leave(E.net);
  fault_watchdog(0, NULL);
}

/* A WRITE that timed out while the link was down still sits in the
 * initiator's socket buffer. Once the link is back, TCP may deliver it
 * (retransmission backoff: seconds later), after a later WRITE to the same
 * range already succeeded. The promise: it must not. */
static void test_no_late_landing_after_timeout(void **state) {
  fault_skip_without_net(E.net, E.skip_why);
  fault_watchdog(60, "late landing after a timeout");
  assert_int_equal(fault_net_enter(E.net, 0), 0);
  /* Only the doomed WRITE has a short bound. Connecting may cost a lost
   * SYN right after the link returns (1 s): over fabric the first call
   * after it needs a new control connection (the one in use when the link
   * went down timed out). */
  ferry_engine *eng =
      fault_engine(fault_link_addr(E.net, E.cut_link, 0), TEST_SETUP_MS, TEST_SETUP_MS, 0);
  assert_non_null(eng);
  size_t len = 512 << 10;
  uint8_t *old = fault_buffer(eng, len);
  uint8_t *fresh = fault_buffer(eng, 2 * len);
  uint64_t where = E.big.addr + (256ull << 20);
  /* A live channel first, so the doomed WRITE goes out on it. */
  assert_int_equal(fault_roundtrip(eng, E.big.target, fresh, where, 4096, 1), FERRY_OK);
  assert_int_equal(fault_link_set_up(E.net, E.cut_link, 0), 0);
  fault_pattern(old, len, 21);
  test_engine_set_timeouts(eng, 1500, 3000);
  ferry_status st = ferry_transfer_sync(eng, E.big.target, FERRY_OP_WRITE, old, where, len);
  printf("WRITE with the link down: %s (%s)\n", ferry_strerror(st), ferry_last_error());
  assert_int_not_equal(st, FERRY_OK);
  test_engine_set_timeouts(eng, TEST_SETUP_MS, TEST_SETUP_MS);
  assert_int_equal(fault_link_set_up(E.net, E.cut_link, 1), 0);
  double t0 = fault_now();
  st = fault_roundtrip(eng, E.big.target, fresh, where, len, 22);
  if (st)
    fail_msg("first call after the link returned: %s: %s", ferry_strerror(st), ferry_last_error());
  /* Past the next retransmissions of the abandoned socket. */
  size_t stale = 0;
  double seen_at = 0;
  while (fault_now() - t0 < 8.0 && !stale) {
    fault_sleep_ms(250);
    assert_int_equal(ferry_transfer_sync(eng, E.big.target, FERRY_OP_READ, fresh + len, where, len),
                     FERRY_OK);
    for (size_t i = 0; i < len; i++)
      stale += fresh[len + i] != fresh[i];
    seen_at = fault_now() - t0;
  }
  fault_buffer_free(eng, fresh);
  fault_buffer_free(eng, old);
  ferry_engine_destroy(eng);
  fault_net_leave(E.net);
  fault_watchdog(0, NULL);
  if (stale)
    fail_msg("%zu of %zu bytes written by a successful WRITE were overwritten %.1f s later by an "
             "earlier WRITE that had failed (its bytes were still queued in TCP)",
             stale, len, seen_at);
}

static void test_loss_and_delay_emulated(void **state) {
  fault_skip_without_net(E.net, E.skip_why);
  fault_watchdog(150, "5% loss + 50 ms delay (emulator)");
  assert_int_equal(fault_link_impair(E.net, E.emu_link, 50, 5.0, 0), 0);
  assert_int_equal(fault_transfer_mix(E.net, 0, fault_link_addr(E.net, E.emu_link, 0), &E.small_emu,
                                      "5% loss, 50 ms delay each way (userspace emulator)"),
                   FERRY_OK);
  assert_int_equal(fault_link_impair(E.net, E.emu_link, 20, 1.0, 10.0), 0);
  assert_int_equal(fault_transfer_mix(E.net, 0, fault_link_addr(E.net, E.emu_link, 0), &E.small_emu,
                                      "1% loss, 20 ms delay, 10% reordered (userspace emulator)"),
                   FERRY_OK);
  uint64_t forwarded, dropped;
  fault_link_counters(E.net, E.emu_link, &forwarded, &dropped);
  printf("emulator: %llu packets forwarded, %llu dropped\n", (unsigned long long)forwarded,
         (unsigned long long)dropped);
  assert_true(dropped > 0);
  fault_link_impair(E.net, E.emu_link, 0, 0, 0);
  fault_watchdog(0, NULL);
}

int main(void) {
  struct CMUnitTest tests[] = {
      cmocka_unit_test(test_link_down_during_1gib),
      cmocka_unit_test(test_link_down_short_timeout),
      cmocka_unit_test(test_no_late_landing_after_timeout),
      cmocka_unit_test(test_loss_and_delay_emulated),
  };
  return fault_run_tests(tests, setup, teardown);
}
