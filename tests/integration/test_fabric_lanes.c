/* test_fabric_lanes.c - the fabric transport's target lanes (an endpoint,
 * CQ and progress thread each, fabric_service.c): both engines in this
 * process on tcp;ofi_rxm. Several initiator channels are spread over the
 * lanes, so that every lane's thread serves traffic, and the transfers stay
 * byte-for-byte right; the lanes' addresses travel in the descriptor, which
 * is decoded as untrusted input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "descriptor.h"
#include "ferry.h"
#include "harness.h"
#include "transport/fabric.h"

#define MiB (1024u * 1024u)
#define BIG (16 * MiB) /* two chunks of 16 x 512 KiB: two channels at once */

static ferry_engine *lane_engine(unsigned lanes) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_FABRIC;
  cfg.fabric_provider = "tcp;ofi_rxm";
  cfg.fabric_lanes = lanes;
  cfg.timeout_ms = 60000;
  return test_engine_create(&cfg);
}

static uint64_t lane_rounds(ferry_engine *e, unsigned lane) {
  return __atomic_load_n(&e->fabric->lanes[lane].rounds, __ATOMIC_RELAXED);
}

/* A 2-lane target: the initiator's channels go to both lanes, and each
 * lane's progress thread wakes for the traffic (an unused lane wakes only
 * for deregistrations and stop). Large WRITEs and READs verified. */
static void channels_are_spread_over_the_lanes(void **state) {
  ferry_engine *target = lane_engine(2), *initiator = lane_engine(1);
  assert_int_equal(target->fabric->lane_count, 2);
  assert_int_equal(target->fabric->self.lane_count, 1);
  uint8_t *memory = test_buffer(target, BIG), *out = test_buffer(initiator, 2 * BIG);
  const char *name = ferry_engine_name(target);
  uint64_t before[2] = {lane_rounds(target, 0), lane_rounds(target, 1)};
  for (int round = 0; round < 8; round++)
    test_round_trip(initiator, name, out, out + BIG, (uint64_t)(uintptr_t)memory, BIG,
                    (uint64_t)round + 1);
  uint64_t used[2] = {lane_rounds(target, 0) - before[0], lane_rounds(target, 1) - before[1]};
  print_message("lane 0: %llu rounds, lane 1: %llu rounds\n", (unsigned long long)used[0],
                (unsigned long long)used[1]);
  assert_true(used[0] >= 16 && used[1] >= 16); /* far more than a few wake-ups each */
  ferry_engine_destroy(initiator);
  ferry_engine_destroy(target);
  free(memory);
  free(out);
}

/* One lane: the descriptor is the lane-less form of before lanes. */
static void one_lane_publishes_no_lanes(void **state) {
  ferry_engine *e = lane_engine(1);
  uint8_t real[FERRY_WIRE_MAX_DESCRIPTOR];
  size_t len = ferry_fabric_describe(e, real, sizeof real);
  ferry_fabric_descriptor d;
  char why[160];
  assert_int_equal(ferry_fabric_descriptor_decode(real, len, &d, why, sizeof why), 1);
  assert_int_equal(d.lane_count, 0);
  assert_int_equal(d.rail_count, 0);
  assert_int_equal(len, 2 + 3 + strlen(d.provider) + strlen(d.fabric) + strlen(d.domain) + 2 +
                            d.addr_len);
  ferry_engine_destroy(e);
}

/* A 3-lane target's descriptor (main | rails: none | lanes: 2) as
 * untrusted input: it decodes with two lanes; a cut decodes only where the
 * lane-less forms end; a lane count of 0 or past the maximum, a lane address
 * running past the end and bytes after the last lane are refused. */
static void laned_descriptor_is_checked(void **state) {
  ferry_engine *e = lane_engine(3);
  uint8_t real[FERRY_WIRE_MAX_DESCRIPTOR + 1];
  size_t len = ferry_fabric_describe(e, real, FERRY_WIRE_MAX_DESCRIPTOR);
  ferry_fabric_descriptor d;
  char why[160];
  assert_int_equal(ferry_fabric_descriptor_decode(real, len, &d, why, sizeof why), 1);
  assert_int_equal(d.lane_count, 2);
  assert_int_equal(d.rail_count, 0);
  size_t addr_len = d.lane_addr_len[0]; /* sockaddr_in */
  assert_int_equal(d.lane_addr_len[1], addr_len);
  assert_memory_not_equal(d.lane_addr[0], d.addr, addr_len); /* a port of its own */
  size_t plain = len - 2 - 2 * (2 + addr_len);               /* before the empty rails list */
  test_descriptor_cuts(real, len, (const size_t[]){plain, plain + 1}, 2);
  test_descriptor_refused(real, len, len, plain + 1, 0, "lanes");
  test_descriptor_refused(real, len, len, plain + 1, FERRY_FABRIC_LANES_MAX, "lanes");
  test_descriptor_refused(real, len, len, len - addr_len - 1, 0xff, "lane 1"); /* past the end */
  test_descriptor_refused(real, len, len + 1, len, 0, "past its lanes");
  ferry_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(channels_are_spread_over_the_lanes),
      cmocka_unit_test(one_lane_publishes_no_lanes),
      cmocka_unit_test(laned_descriptor_is_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
