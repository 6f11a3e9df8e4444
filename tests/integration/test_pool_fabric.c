/* test_pool_fabric.c - receive pools beside the fabric transport
 * (libfabric's tcp;ofi_rxm provider, two engines in this process). Its
 * WRITEs are one-sided: the target never sees them, so it cannot check
 * them against the sender's grant. A pool is therefore registered with
 * fabric for remote READ only, and a send's WRITEs go over tcp (or shm)
 * even where fabric carries everything else:
 *   - a fabric WRITE into a pool with the key the region table gives for
 *     it (what any peer that learnt the table can send, granted or not)
 *     is refused by the provider and leaves the pool as it was, while a
 *     READ of it works;
 *   - ferry_send between engines that have only fabric fails with
 *     FERRY_ETRANSPORT, saying why;
 *   - memory registered before cannot become a pool (its registration
 *     would keep remote WRITE);
 *   - with tcp beside it, a send lands (over tcp, its notice in-band) and
 *     no byte of it crosses fabric, while a plain WRITE still does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"

#define KiB 1024u
#define MiB (1024u * 1024u)
#define PROVIDER "tcp;ofi_rxm"

static ferry_engine *engine_on(unsigned transports) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = transports;
  cfg.fabric_provider = PROVIDER;
  ferry_engine *e = NULL;
  if (ferry_engine_create(&cfg, &e))
    fail_msg("engine on %s: %s", PROVIDER, ferry_last_error());
  return e;
}

/* Bytes tx moved to rx by op over transport (by its stats). */
static uint64_t moved(ferry_engine *tx, const char *transport, ferry_op op) {
  ferry_stats *st = NULL;
  assert_int_equal(ferry_stats_snapshot(tx, &st), FERRY_OK);
  uint64_t n = 0;
  for (size_t i = 0; i < st->link_count; i++)
    if (!strcmp(st->links[i].transport, transport))
      n += st->links[i].bytes[op];
  ferry_stats_free(st);
  return n;
}

static void fabric_writes_cannot_reach_a_pool(void **state) {
  ferry_engine *rx = engine_on(FERRY_TRANSPORT_FABRIC), *tx = engine_on(FERRY_TRANSPORT_FABRIC);
  uint8_t *pool_mem =
      mmap(NULL, 1 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(pool_mem != MAP_FAILED);
  memset(pool_mem, 0xab, 1 * MiB);
  ferry_pool *pool;
  assert_int_equal(ferry_pool_create(rx, "emb", pool_mem, 1 * MiB, &pool), FERRY_OK);
  uint8_t *local;
  assert_int_equal(ferry_memory_alloc(tx, 64 * KiB, (void **)&local), FERRY_OK);
  memset(local, 0x11, 64 * KiB);
  const char *target = ferry_engine_name(rx);
  uint64_t remote = (uint64_t)(uintptr_t)pool_mem + 4096;
  /* No grant, no check: the provider refuses it. */
  ferry_status st = ferry_transfer_sync(tx, target, FERRY_OP_WRITE, local, remote, 4096);
  if (st == FERRY_OK)
    fail_msg("a fabric WRITE into the pool went through");
  for (size_t i = 0; i < 1 * MiB; i++)
    if (pool_mem[i] != 0xab)
      fail_msg("pool byte %zu changed to 0x%02x", i, pool_mem[i]);
  /* Reading it works, as for any registered memory. */
  assert_int_equal(ferry_transfer_sync(tx, target, FERRY_OP_READ, local, remote, 4096), FERRY_OK);
  for (size_t i = 0; i < 4096; i++)
    assert_int_equal(local[i], 0xab);
  /* And a send has no transport that checks its WRITEs. */
  assert_int_equal(ferry_send(tx, target, "emb", "t", 1, local, 4096, -1, 0), FERRY_ETRANSPORT);
  assert_non_null(strstr(ferry_last_error(), "enable tcp or shm"));
  ferry_message m;
  assert_int_equal(ferry_recv(rx, pool, NULL, 0, 0, &m), FERRY_ETIMEDOUT);
  ferry_engine_destroy(tx);
  ferry_engine_destroy(rx);
  munmap(pool_mem, 1 * MiB);
}

/* Memory registered before (with remote WRITE on fabric) cannot become a
 * pool: its registration would stay as it was. */
static void a_pool_takes_no_memory_registered_before(void **state) {
  ferry_engine *rx = engine_on(FERRY_TRANSPORT_FABRIC);
  uint8_t *mem = mmap(NULL, 1 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(mem != MAP_FAILED);
  assert_int_equal(ferry_memory_register(rx, mem, 1 * MiB), FERRY_OK);
  ferry_pool *pool = NULL;
  assert_int_equal(ferry_pool_create(rx, "emb", mem, 1 * MiB, &pool), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "registered already"));
  assert_int_equal(ferry_memory_unregister(rx, mem), FERRY_OK); /* still the caller's */
  assert_int_equal(ferry_pool_create(rx, "emb", mem, 1 * MiB, &pool), FERRY_OK);
  ferry_engine_destroy(rx);
  munmap(mem, 1 * MiB);
}

static void sends_go_over_tcp_beside_fabric(void **state) {
  unsigned both = FERRY_TRANSPORT_FABRIC | FERRY_TRANSPORT_TCP;
  ferry_engine *rx = engine_on(both), *tx = engine_on(both);
  ferry_pool *pool;
  assert_int_equal(ferry_pool_create(rx, "emb", NULL, 4 * MiB, &pool), FERRY_OK);
  uint8_t *local, *plain;
  assert_int_equal(ferry_memory_alloc(tx, 1 * MiB, (void **)&local), FERRY_OK);
  assert_int_equal(ferry_memory_alloc(rx, 64 * KiB, (void **)&plain), FERRY_OK);
  test_fill_random(local, 1 * MiB, 31);
  const char *target = ferry_engine_name(rx);
  /* Fabric carries: a plain WRITE crosses it. */
  assert_int_equal(
      ferry_transfer_sync(tx, target, FERRY_OP_WRITE, local, (uint64_t)(uintptr_t)plain, 64 * KiB),
      FERRY_OK);
  assert_int_equal(moved(tx, "fabric", FERRY_OP_WRITE), 64 * KiB);
  for (int i = 0; i < 3; i++) {
    if (ferry_send(tx, target, "emb", "m", 1, local, 1 * MiB, -1, 0))
      fail_msg("send %d: %s", i, ferry_last_error());
    ferry_message m;
    assert_int_equal(ferry_recv(rx, pool, "m", 1, 5000, &m), FERRY_OK);
    assert_int_equal(m.length, 1 * MiB);
    assert_memory_equal(m.addr, local, 1 * MiB);
    assert_int_equal(ferry_pool_release(rx, pool, m.slot), FERRY_OK);
  }
  assert_int_equal(moved(tx, "fabric", FERRY_OP_WRITE), 64 * KiB);
  assert_int_equal(moved(tx, "tcp", FERRY_OP_WRITE), 3 * MiB);
  ferry_stats *st = NULL;
  assert_int_equal(ferry_stats_snapshot(rx, &st), FERRY_OK);
  assert_int_equal(st->pool_landed_inband, 3); /* tcp carried each notice on its WRITE */
  ferry_stats_free(st);
  ferry_engine_destroy(tx);
  ferry_engine_destroy(rx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fabric_writes_cannot_reach_a_pool),
      cmocka_unit_test(a_pool_takes_no_memory_registered_before),
      cmocka_unit_test(sends_go_over_tcp_beside_fabric),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
