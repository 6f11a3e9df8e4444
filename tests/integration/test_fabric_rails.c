/* test_fabric_rails.c - the fabric transport on two rails: a target with
 * rail_hosts 127.0.0.1,127.0.0.2 opens a fabric endpoint pinned to each
 * (tcp;ofi_rxm provider, one domain on lo) and an initiator spreads its
 * channels over them (peer.c's rails), so a large transfer is striped over
 * both. Both engines live in this process; every transfer is verified byte
 * for byte and the bytes per rail come from ferry_stats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"

#define MiB (1024ull * 1024ull)
#define BIG (16 * MiB)

static ferry_engine *fabric_engine(const char *rails) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = FERRY_TRANSPORT_FABRIC;
  cfg.fabric_provider = "tcp;ofi_rxm";
  cfg.rail_hosts = rails;
  cfg.timeout_ms = 60000;
  ferry_engine *e = NULL;
  if (ferry_engine_create(&cfg, &e) != FERRY_OK)
    fail_msg("fabric engine on rails %s: %s", rails ? rails : "(none)", ferry_last_error());
  return e;
}

/* The bytes moved on each rail toward target, in rail order. */
static size_t rail_bytes(ferry_engine *initiator, const char *target, uint64_t bytes[],
                         size_t max) {
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(initiator, &s), FERRY_OK);
  size_t n = 0;
  for (size_t i = 0; i < s->rail_count && n < max; i++, n++) {
    assert_string_equal(s->rails[i].peer, target);
    /* each rail's endpoint is pinned to its own address */
    assert_true(!strncmp(s->rails[i].rail, i ? "127.0.0.2:" : "127.0.0.1:", 10));
    bytes[n] = s->rails[i].bytes[FERRY_OP_READ] + s->rails[i].bytes[FERRY_OP_WRITE];
  }
  ferry_stats_free(s);
  return n;
}

/* Both rails carry a striped 16 MiB WRITE and READ; every byte lands and
 * reads back, and the rails' counts add up to what moved. */
static void striped_over_two_fabric_rails(void **state) {
  ferry_engine *target = fabric_engine("127.0.0.1,127.0.0.2"), *initiator = fabric_engine(NULL);
  uint8_t *memory = test_buffer(target, BIG), *out = test_buffer(initiator, BIG),
          *in = test_buffer(initiator, BIG);
  assert_true(memory && out && in);
  char name[64];
  snprintf(name, sizeof name, "127.0.0.1:%u", ferry_engine_port(target));
  unsigned transport = 0;
  /* One driver may take a whole batch before the others start (a busy
   * machine): repeat until both rails carried some, a bounded number of
   * times. */
  uint64_t bytes[4] = {0, 0}, rounds = 0;
  while (rounds < 20 && !(bytes[0] && bytes[1])) {
    rounds++;
    test_fill_random(out, BIG, rounds);
    assert_int_equal(
        ferry_transfer_sync(initiator, name, FERRY_OP_WRITE, out, (uint64_t)(uintptr_t)memory, BIG),
        FERRY_OK);
    assert_memory_equal(memory, out, BIG);
    assert_int_equal(
        ferry_transfer_sync(initiator, name, FERRY_OP_READ, in, (uint64_t)(uintptr_t)memory, BIG),
        FERRY_OK);
    assert_memory_equal(in, out, BIG);
    assert_int_equal(ferry_peer_transport(initiator, name, &transport), FERRY_OK);
    assert_int_equal(transport, FERRY_TRANSPORT_FABRIC);
    assert_int_equal(rail_bytes(initiator, name, bytes, 4), 2);
  }
  print_message("after %llu rounds: fabric rail 127.0.0.1: %llu bytes, 127.0.0.2: %llu bytes\n",
                (unsigned long long)rounds, (unsigned long long)bytes[0],
                (unsigned long long)bytes[1]);
  assert_true(bytes[0] > 0 && bytes[1] > 0);
  assert_int_equal(bytes[0] + bytes[1], 2 * rounds * BIG);
  ferry_engine_destroy(initiator);
  ferry_engine_destroy(target);
  free(memory);
  free(out);
  free(in);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(striped_over_two_fabric_rails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
