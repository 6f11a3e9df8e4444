/* test_fault_checksum.c - checksum mode end to end: with cfg.checksum (or
 * FERRY_CHECKSUM=1) every WRITE and READ_REPLY frame carries a crc32c of
 * its payload, checked by the receiver; a mismatch is FERRY_ECHECKSUM.
 *
 * Hosts: a (the test process: engines, a raw client and a frame-aware proxy
 * that flips one payload byte in flight), b (a `ferry serve` target). The
 * proxy stands in for a corrupting NIC, switch or memory error on the path;
 * TCP's own 16-bit checksum would not see a flip made above it. Without
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

#define PORT 15500
#define LEN (3 << 20) /* several 1 MiB frames */

typedef struct env {
  fault_net *net;
  int link;
  fault_proc target;
  fault_proxy *proxy;
} env;

static env E;

static int setup(void **state) {
  E.net = fault_net_open(2);
  if (!E.net)
    return -1;
  E.link = fault_net_link(E.net, 0, 1, FAULT_LINK_VETH);
  if (E.link < 0 || fault_serve_start(&E.target, E.net, 1, fault_link_addr(E.net, E.link, 1),
                                      fault_port(E.net, PORT), "64M", NULL, 0))
    return -1;
  /* The proxy's threads and sockets live in host a, like the engines. */
  if (fault_net_enter(E.net, 0) != 0)
    return -1;
  E.proxy = fault_proxy_start(fault_link_addr(E.net, E.link, 0), E.target.target);
  return E.proxy ? 0 : -1;
}

static int teardown(void **state) {
  fault_proxy_stop(E.proxy);
  fault_net_leave(E.net);
  int status = fault_proc_term(&E.target);
  fault_net_destroy(E.net);
  return status == 0 ? 0 : -1;
}

/* The raw protocol: a WRITE whose crc does not match is refused with
 * FERRY_ECHECKSUM and the connection stays usable; a checksummed READ
 * reply carries the right crc. */
static void test_raw_wrong_crc(void **state) {
  fault_raw r;
  assert_int_equal(fault_raw_connect(&r, E.target.target, 5000), 0);
  assert_int_equal(fault_raw_handshake(&r, NULL), FERRY_OK);
  uint8_t data[65536], back[65536];
  fault_pattern(data, sizeof data, 1);
  assert_int_equal(fault_raw_write(&r, E.target.addr, data, sizeof data, 1), FERRY_OK);
  assert_int_equal(fault_raw_write(&r, E.target.addr, data, sizeof data, 2), FERRY_ECHECKSUM);
  assert_int_equal(fault_raw_write(&r, E.target.addr, data, sizeof data, 1), FERRY_OK);
  assert_int_equal(fault_raw_read(&r, E.target.addr, back, sizeof back, 1), FERRY_OK);
  assert_memory_equal(data, back, sizeof data);
  fault_raw_close(&r);
  assert_true(fault_proc_log_has(&E.target, "checksum mismatch on WRITE"));
}

static ferry_engine *engine(int checksum) {
  return fault_engine(fault_link_addr(E.net, E.link, 0), 5000, 2000, checksum);
}

static void test_clean_transfers_verify(void **state) {
  unsigned frames0, sums0, frames1, sums1;
  fault_proxy_data_frames(E.proxy, &frames0, &sums0);
  ferry_engine *eng = engine(1);
  uint8_t *local = fault_buffer(eng, 2 * LEN);
  const size_t sizes[] = {1, 3, 4096, 100000, LEN};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
    assert_int_equal(fault_roundtrip(eng, fault_proxy_target(E.proxy), local,
                                     E.target.addr + (8 << 20), sizes[i], 10 + i),
                     FERRY_OK);
  /* Many small entries coalesced into one frame are covered by one crc. */
  ferry_entry entries[256];
  fault_pattern(local, 256 * 64, 7);
  for (int i = 0; i < 256; i++)
    entries[i] =
        (ferry_entry){FERRY_OP_WRITE, local + i * 64, E.target.addr + (16 << 20) + i * 128, 64};
  assert_int_equal(ferry_transfer_sync_batch(eng, fault_proxy_target(E.proxy), entries, 256, NULL),
                   FERRY_OK);
  for (int i = 0; i < 256; i++)
    entries[i] = (ferry_entry){FERRY_OP_READ, local + LEN + i * 64,
                               E.target.addr + (16 << 20) + i * 128, 64};
  assert_int_equal(ferry_transfer_sync_batch(eng, fault_proxy_target(E.proxy), entries, 256, NULL),
                   FERRY_OK);
  assert_memory_equal(local, local + LEN, 256 * 64);
  fault_buffer_free(eng, local);
  ferry_engine_destroy(eng);
  fault_proxy_data_frames(E.proxy, &frames1, &sums1);
  printf("checksum mode: %u data frames through the proxy, %u carried a crc32c\n",
         frames1 - frames0, sums1 - sums0);
  assert_true(frames1 - frames0 >= 10);
  assert_int_equal(frames1 - frames0, sums1 - sums0);
}

/* One corrupted frame in a multi-frame transfer, each direction. */
static void corrupt_once(ferry_engine *eng, uint8_t frame_type, ferry_status *st_out,
                         int *data_wrong) {
  uint8_t *local = fault_buffer(eng, 2 * LEN);
  fault_pattern(local, LEN, 99);
  uint64_t remote = E.target.addr + (24 << 20);
  const char *via = fault_proxy_target(E.proxy);
  unsigned before = fault_proxy_corrupted(E.proxy);
  ferry_status st;
  if (frame_type == FERRY_FRAME_WRITE) {
    fault_proxy_corrupt(E.proxy, FERRY_FRAME_WRITE, 1);
    st = ferry_transfer_sync(eng, via, FERRY_OP_WRITE, local, remote, LEN);
    /* What is in target memory now, read without corruption. */
    assert_int_equal(ferry_transfer_sync(eng, via, FERRY_OP_READ, local + LEN, remote, LEN),
                     FERRY_OK);
  } else {
    assert_int_equal(ferry_transfer_sync(eng, via, FERRY_OP_WRITE, local, remote, LEN), FERRY_OK);
    fault_proxy_corrupt(E.proxy, FERRY_FRAME_READ_REPLY, 1);
    st = ferry_transfer_sync(eng, via, FERRY_OP_READ, local + LEN, remote, LEN);
  }
  assert_int_equal(fault_proxy_corrupted(E.proxy), before + 1);
  *st_out = st;
  *data_wrong = memcmp(local, local + LEN, LEN) != 0;
  if (st == FERRY_ECHECKSUM) /* the error names what failed */
    assert_non_null(strstr(ferry_last_error(), "checksum mismatch"));
  /* The next call is clean again and verifies. */
  fault_proxy_corrupt(E.proxy, frame_type, 0);
  assert_int_equal(fault_roundtrip(eng, via, local, remote, LEN, 100), FERRY_OK);
  fault_buffer_free(eng, local);
}

static void test_corruption_detected(void **state) {
  ferry_engine *eng = engine(1);
  ferry_status st;
  int wrong;
  corrupt_once(eng, FERRY_FRAME_WRITE, &st, &wrong);
  printf("checksum on, WRITE frame corrupted in flight: %s\n", ferry_strerror(st));
  assert_int_equal(st, FERRY_ECHECKSUM);
  corrupt_once(eng, FERRY_FRAME_READ_REPLY, &st, &wrong);
  printf("checksum on, READ reply corrupted in flight: %s\n", ferry_strerror(st));
  assert_int_equal(st, FERRY_ECHECKSUM);
  ferry_engine_destroy(eng);
}

static void test_corruption_detected_env(void **state) {
  setenv("FERRY_CHECKSUM", "1", 1);
  ferry_config cfg;
  ferry_config_init(&cfg);
  unsetenv("FERRY_CHECKSUM");
  assert_true(cfg.checksum);
  cfg.bind_host = cfg.advertise_host = fault_link_addr(E.net, E.link, 0);
  cfg.transports = FERRY_TRANSPORT_TCP;
  ferry_engine *eng;
  assert_int_equal(ferry_engine_create(&cfg, &eng), FERRY_OK);
  ferry_status st;
  int wrong;
  corrupt_once(eng, FERRY_FRAME_WRITE, &st, &wrong);
  assert_int_equal(st, FERRY_ECHECKSUM);
  ferry_engine_destroy(eng);
}

/* For contrast (reported, not asserted): without checksum mode the same
 * flip goes unnoticed by ferry. */
static void test_without_checksum_mode(void **state) {
  ferry_engine *eng = engine(0);
  ferry_status st;
  int wrong;
  corrupt_once(eng, FERRY_FRAME_WRITE, &st, &wrong);
  printf("checksum off, WRITE frame corrupted in flight: call %s, data %s\n",
         st ? ferry_strerror(st) : "succeeded", wrong ? "WRONG" : "right");
  corrupt_once(eng, FERRY_FRAME_READ_REPLY, &st, &wrong);
  printf("checksum off, READ reply corrupted in flight: call %s, data %s\n",
         st ? ferry_strerror(st) : "succeeded", wrong ? "WRONG" : "right");
  ferry_engine_destroy(eng);
}

int main(void) {
  fault_watchdog(120, "checksum mode");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_raw_wrong_crc),         cmocka_unit_test(test_clean_transfers_verify),
      cmocka_unit_test(test_corruption_detected),   cmocka_unit_test(test_corruption_detected_env),
      cmocka_unit_test(test_without_checksum_mode),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
