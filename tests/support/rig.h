/* rig.h - two engines in this process, a target and an initiator, with a
 * registered buffer on the target and two (out, in) on the initiator, for
 * tests of how data is spread over rails and transports (test_rails,
 * test_fabric_rails, test_multitransport); and the per-rail and
 * per-transport byte counts those tests read from ferry_stats. */
#ifndef FERRY_TEST_RIG_H
#define FERRY_TEST_RIG_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

typedef struct test_rig {
  ferry_engine *target, *initiator;
  uint8_t *memory;   /* the target's registered buffer */
  uint8_t *out, *in; /* the initiator's */
  size_t size;       /* of each buffer */
  char name[64];     /* the target as initiators name it */
  uint64_t rounds;   /* test_rig_round_trip calls */
} test_rig;

/* Takes both engines (asserting they exist) and registers the buffers. */
void test_rig_start(test_rig *r, ferry_engine *target, ferry_engine *initiator, size_t size);
void test_rig_stop(test_rig *r);
/* A WRITE of the whole out buffer (filled from seed) to memory. */
ferry_status test_rig_write(test_rig *r, uint64_t seed);
/* A verified WRITE and READ back of the whole buffer (asserts). */
void test_rig_round_trip(test_rig *r);

/* The bytes moved on each rail toward the rig's target, in rail order, and
 * whether each is up (up and names may be NULL; names get the rails' labels,
 * valid until the next call). Returns how many rails. */
size_t test_rig_rail_bytes(test_rig *r, uint64_t bytes[], int up[], char names[][80], size_t max);
/* Times each rail toward the rig's target failed and was taken out of use
 * (0 past the last rail). */
void test_rig_rail_failures(test_rig *r, uint64_t failures[], size_t max);
/* The bytes moved toward the rig's target over one transport ("tcp", ...). */
uint64_t test_rig_transport_bytes(test_rig *r, const char *transport);

/* Shuts down every socket of this process bound to ipv4 (host order), as
 * a dead link would: its listeners and connections. Returns how many. */
int test_rig_cut_sockets(uint32_t ipv4);

#endif
