/* test_scale_regions.c - a target with 1,000,000 regions reached by a new
 * peer, and a 1,000,000-entry batch verified byte for byte. The first
 * contact must fetch only the regions the batch needs (the initiator's
 * cache is looked at directly), regions registered after it must be found
 * by the one refetch a miss makes, an address between regions and a region
 * unregistered since must be refused. The target is an engine in this
 * process, so the test sees its memory. */
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

#include "core/peer.h"
#include "ferry.h"
#include "harness.h"

#define PAGE 4096
#define MANY 1000000

/* Time is not what this file is about: a million-region table is
 * fetched within connect_timeout_ms, seconds under a sanitizer. */
static ferry_engine *tcp_engine(void) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_TCP;
  cfg.timeout_ms = cfg.connect_timeout_ms = TEST_SETUP_MS;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  return e;
}

static void target_name(ferry_engine *t, char name[64]) {
  snprintf(name, 64, "127.0.0.1:%u", ferry_engine_port(t));
}

/* Region i of the target is page 2i of mem: a gap page follows each. */
static uint8_t *page_of(uint8_t *mem, size_t i) { return mem + 2 * i * PAGE; }

static size_t cached_regions(ferry_engine *e, const char *target) {
  ferry_peer *p;
  assert_int_equal(ferry_peer_get(e, target, &p), FERRY_OK);
  pthread_mutex_lock(&p->lock);
  size_t n = p->table.count;
  pthread_mutex_unlock(&p->lock);
  return n;
}

static void write_page(ferry_engine *e, const char *target, uint8_t *local, uint8_t *remote,
                       uint64_t seed) {
  test_fill_random(local, PAGE, seed);
  assert_int_equal(
      ferry_transfer_sync(e, target, FERRY_OP_WRITE, local, (uint64_t)(uintptr_t)remote, PAGE),
      FERRY_OK);
  assert_memory_equal(local, remote, PAGE);
}

static void million_regions(void **state) {
  (void)state;
  size_t span = 2ull * (MANY + 4) * PAGE; /* reserved, touched only where written */
  uint8_t *mem =
      mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  assert_true(mem != MAP_FAILED);
  void **addrs = malloc(MANY * sizeof *addrs);
  size_t *lens = malloc(MANY * sizeof *lens);
  assert_non_null(addrs);
  assert_non_null(lens);
  for (size_t i = 0; i < MANY; i++)
    addrs[i] = page_of(mem, i), lens[i] = PAGE;
  ferry_engine *t = tcp_engine(), *e = tcp_engine();
  assert_int_equal(ferry_memory_register_batch(t, addrs, lens, MANY), FERRY_OK);
  char target[64];
  target_name(t, target);
  uint8_t *local = test_buffer(e, PAGE);

  /* First contact: one region fetched, not a million. */
  write_page(e, target, local, page_of(mem, 777777), 1);
  size_t cached = cached_regions(e, target);
  print_message("after the first WRITE the peer caches %zu of %d regions\n", cached, MANY);
  assert_true(cached >= 1 && cached < 16);
  write_page(e, target, local, page_of(mem, 3), 2);

  /* Registered after first contact: the miss refetches once. */
  uint8_t *late = page_of(mem, MANY + 1);
  assert_int_equal(ferry_memory_register(t, late, PAGE), FERRY_OK);
  write_page(e, target, local, late, 3);

  /* Between two regions: refused before anything is sent, memory intact. */
  uint8_t *gap = page_of(mem, 500) + PAGE;
  assert_int_equal(
      ferry_transfer_sync(e, target, FERRY_OP_WRITE, local, (uint64_t)(uintptr_t)gap, PAGE),
      FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "not registered"));
  assert_int_equal(gap[0], 0);

  /* Unregistered since this peer cached it: the target refuses it. */
  assert_int_equal(ferry_memory_unregister(t, page_of(mem, 3)), FERRY_OK);
  assert_int_not_equal(ferry_transfer_sync(e, target, FERRY_OP_WRITE, local,
                                           (uint64_t)(uintptr_t)page_of(mem, 3), PAGE),
                       FERRY_OK);

  /* The whole table is still there for who asks for it. */
  ferry_region *all;
  size_t n;
  assert_int_equal(ferry_peer_regions(e, target, &all, &n), FERRY_OK);
  assert_int_equal(n, MANY); /* one late region in, one out */
  assert_int_equal(all[0].addr, (uint64_t)(uintptr_t)page_of(mem, 0));
  free(all);

  ferry_engine_destroy(e);
  ferry_engine_destroy(t);
  free(local);
  free(addrs);
  free(lens);
  munmap(mem, span);
}

/* 1,000,000 entries of 64 bytes into random slots of 4,096 regions with
 * gaps between them: more missing ranges than one REGIONS_REQ carries, so
 * the request is capped into covering spans. */
static void million_entry_batch(void **state) {
  (void)state;
  enum { ENTRY = 64, REGIONS = 4096, PER = MANY / REGIONS + 1, REGION = PER * ENTRY };
  size_t stride = REGION + PAGE, bytes = (size_t)MANY * ENTRY;
  ferry_engine *t = tcp_engine(), *e = tcp_engine();
  uint8_t *remote = calloc(REGIONS, stride), *local = test_buffer(e, bytes);
  assert_non_null(remote);
  for (size_t r = 0; r < REGIONS; r++)
    assert_int_equal(ferry_memory_register(t, remote + r * stride, REGION), FERRY_OK);
  test_fill_random(local, bytes, 42);
  size_t *slot = malloc(MANY * sizeof *slot);
  ferry_entry *entries = malloc(MANY * sizeof *entries);
  assert_non_null(slot);
  assert_non_null(entries);
  for (size_t i = 0; i < MANY; i++)
    slot[i] = i;
  uint64_t rng = 99;
  for (size_t i = MANY - 1; i > 0; i--) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    size_t j = (size_t)(rng >> 33) % (i + 1), x = slot[i];
    slot[i] = slot[j], slot[j] = x;
  }
  for (size_t i = 0; i < MANY; i++) {
    uint8_t *at = remote + (slot[i] / PER) * stride + (slot[i] % PER) * ENTRY;
    entries[i] = (ferry_entry){FERRY_OP_WRITE, local + i * ENTRY, (uint64_t)(uintptr_t)at, ENTRY};
  }
  char target[64];
  target_name(t, target);
  assert_int_equal(ferry_transfer_sync_batch(e, target, entries, MANY, NULL), FERRY_OK);
  size_t wrong = 0;
  for (size_t i = 0; i < MANY; i++)
    wrong += memcmp((void *)(uintptr_t)entries[i].remote, entries[i].local, ENTRY) != 0;
  assert_int_equal(wrong, 0);
  ferry_engine_destroy(e);
  ferry_engine_destroy(t);
  free(local);
  free(remote);
  free(slot);
  free(entries);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(million_regions),
      cmocka_unit_test(million_entry_batch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
