/* test_memory_access.c - memory this process's CPU cannot touch: registration
 * refuses it (PROT_NONE, as a CUDA device pointer is to the CPU; a hole; a
 * read-only mapping) with FERRY_EFAULT and the likely cause, without
 * touching the pages of a large region; and a peer's WRITE or READ into
 * registered memory that was protected since fails with FERRY_EFAULT
 * naming the region, while the target keeps serving on the same
 * connection (tcp, with and without secret and checksum, and shm). The
 * target is an engine in this process, so it surviving is this test going
 * on. RELIABILITY.md 4 ("Memory the CPU cannot touch"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"
#include "memory/host_memory.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)
#define REGION (4 * MiB)

static ferry_engine *engine_on(unsigned transports, const char *secret, int checksum) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = transports;
  cfg.fabric_provider = "tcp;ofi_rxm";
  cfg.secret = secret;
  cfg.checksum = checksum;
  cfg.tcp_connections = 1; /* one data connection: "the same connection" is that one */
  return test_engine_create(&cfg);
}

static uint8_t *map(size_t size, int prot, int flags) {
  void *p = mmap(NULL, size, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
  assert_true(p != MAP_FAILED);
  return p;
}

static void assert_detail_has(const char *part) {
  if (!strstr(ferry_last_error(), part))
    fail_msg("detail \"%s\" lacks \"%s\"", ferry_last_error(), part);
}

static uint64_t registered_regions(ferry_engine *e) {
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(e, &s), FERRY_OK);
  uint64_t n = s->registered_regions;
  ferry_stats_free(s);
  return n;
}

/* ---- registration --------------------------------------------------------------------- */

/* What SGLang passes for a CUDA tensor (data_ptr()) is PROT_NONE to the CPU
 * when no driver maps it: refused before any transport registers it (this
 * engine has fabric too), alone or inside a batch; read-only memory too. */
static void registration_refuses_memory_the_cpu_cannot_touch(void **state) {
  (void)state;
  ferry_engine *e = engine_on(FERRY_TRANSPORT_ALL, NULL, 0);
  uint8_t *none = map(16 * MiB, PROT_NONE, 0), *good = map(MiB, PROT_READ | PROT_WRITE, 0);
  char region[64];
  snprintf(region, sizeof region, "register [%p, +%llu)", (void *)none, 16 * MiB);

  assert_int_equal(ferry_memory_register(e, none, 16 * MiB), FERRY_EFAULT);
  assert_detail_has(region);
  assert_detail_has(
      "not mapped for the CPU: GPU memory, and the CUDA driver (if found) did not claim it");
  assert_detail_has("---p");

  void *addrs[2] = {good, none};
  size_t lens[2] = {MiB, 16 * MiB};
  assert_int_equal(ferry_memory_register_batch(e, addrs, lens, 2), FERRY_EFAULT);
  assert_detail_has(region);
  assert_int_equal(registered_regions(e), 0); /* all or nothing */

  assert_int_equal(mprotect(none, 16 * MiB, PROT_READ), 0);
  assert_int_equal(ferry_memory_register(e, none, 16 * MiB), FERRY_EFAULT);
  assert_detail_has("must be writable");
  assert_detail_has("r--p");

  /* The refusal is about the memory: once usable, it registers. */
  assert_int_equal(mprotect(none, 16 * MiB, PROT_READ | PROT_WRITE), 0);
  assert_int_equal(ferry_memory_register_batch(e, addrs, lens, 2), FERRY_OK);
  assert_int_equal(registered_regions(e), 2);
  ferry_engine_destroy(e);
  munmap(none, 16 * MiB);
  munmap(good, MiB);
}

/* A range running over a hole (a freed buffer, a wrong length): pages 1
 * and 3 of four are unmapped. */
/* ferry_memory_register_at: host memory at "cpu:0", "*", "" or NULL
 * registers as before; "cuda:0" is refused (no driver here, or the driver
 * says host memory), naming the location; a malformed one is FERRY_EINVAL
 * naming it; a batch is all or nothing. */
static void registration_checks_the_location(void **state) {
  ferry_engine *e = engine_on(FERRY_TRANSPORT_TCP, NULL, 0);
  uint8_t *buf = map(4 * 4096, PROT_READ | PROT_WRITE, 0);
  const char *host[] = {"cpu:0", "*", "", NULL};
  for (size_t i = 0; i < sizeof host / sizeof *host; i++) {
    assert_int_equal(ferry_memory_register_at(e, buf, 4096, host[i]), FERRY_OK);
    assert_int_equal(ferry_memory_unregister(e, buf), FERRY_OK);
  }
  ferry_status st = ferry_memory_register_at(e, buf, 4096, "cuda:0");
  assert_true(st == FERRY_ENOTIMPL || st == FERRY_EINVAL);
  assert_detail_has("at location \"cuda:0\"");
  if (st == FERRY_ENOTIMPL)
    assert_detail_has("no CUDA driver was found (");
  assert_int_equal(ferry_memory_register_at(e, buf, 4096, "gpu0"), FERRY_EINVAL);
  assert_detail_has("location \"gpu0\" is not valid");
  void *addrs[] = {buf, buf + 4096, buf + 2 * 4096};
  size_t lengths[] = {4096, 4096, 4096};
  const char *mixed[] = {"cpu:0", "*", "cuda:0"};
  assert_int_not_equal(ferry_memory_register_batch_at(e, addrs, lengths, mixed, 3), FERRY_OK);
  assert_int_equal(registered_regions(e), 0);
  const char *fine[] = {"cpu:0", "*", NULL};
  assert_int_equal(ferry_memory_register_batch_at(e, addrs, lengths, fine, 3), FERRY_OK);
  assert_int_equal(registered_regions(e), 3);
  assert_int_equal(ferry_memory_unregister_batch(e, addrs, 3), FERRY_OK);
  ferry_engine_destroy(e);
  munmap(buf, 4 * 4096);
}

static void registration_refuses_a_range_with_a_hole(void **state) {
  (void)state;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  ferry_engine *e = engine_on(FERRY_TRANSPORT_TCP, NULL, 0);
  uint8_t *mem = map(4 * page, PROT_READ | PROT_WRITE, 0);
  assert_int_equal(munmap(mem + page, page), 0);
  assert_int_equal(munmap(mem + 3 * page, page), 0);
  char hole[80];
  snprintf(hole, sizeof hole, "[%p, %p) is not mapped at all", (void *)(mem + page),
           (void *)(mem + 2 * page));
  assert_int_equal(ferry_memory_register(e, mem, 3 * page), FERRY_EFAULT);
  assert_detail_has(hole);
  assert_detail_has("check the address and length, or it was freed");
  snprintf(hole, sizeof hole, "[%p, %p) is not mapped at all", (void *)(mem + 3 * page),
           (void *)(mem + 4 * page));
  assert_int_equal(ferry_memory_register(e, mem + 2 * page, 2 * page), FERRY_EFAULT);
  assert_detail_has(hole);
  assert_int_equal(ferry_memory_register(e, mem, page), FERRY_OK);
  assert_int_equal(ferry_memory_register(e, mem + 2 * page, page), FERRY_OK);
  ferry_engine_destroy(e);
  munmap(mem, page);
  munmap(mem + 2 * page, page);
}

static uint64_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, resident = 0;
  assert_non_null(f);
  assert_int_equal(fscanf(f, "%llu %llu", &size, &resident), 2);
  fclose(f);
  return resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Pages of [p, p+size) mapped in (mincore: a read fault maps the zero
 * page, which RSS does not count but this does). */
static size_t resident_pages(uint8_t *p, size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = size / page, n = 0;
  unsigned char *vec = malloc(pages);
  assert_non_null(vec);
  assert_int_equal(mincore(p, size, vec), 0);
  for (size_t i = 0; i < pages; i++)
    n += vec[i] & 1;
  free(vec);
  return n;
}

/* The check costs per mapping: 1 GiB reserved with MAP_NORESERVE registers
 * without a page of it faulted in, alone and as 16,384 regions in one
 * batch. */
static void large_reservation_registers_without_touching_it(void **state) {
  (void)state;
  ferry_engine *e = engine_on(FERRY_TRANSPORT_TCP, NULL, 0);
  uint8_t *big = map(GiB, PROT_READ | PROT_WRITE, MAP_NORESERVE);
  uint64_t before = rss_bytes();
  assert_int_equal(ferry_memory_register(e, big, GiB), FERRY_OK);
  assert_int_equal(ferry_memory_unregister(e, big), FERRY_OK);
  enum { PIECES = 16384 };
  void **addrs = malloc(PIECES * sizeof *addrs);
  size_t *lens = malloc(PIECES * sizeof *lens);
  assert_non_null(addrs);
  assert_non_null(lens);
  for (size_t i = 0; i < PIECES; i++)
    addrs[i] = big + i * (GiB / PIECES), lens[i] = GiB / PIECES;
  assert_int_equal(ferry_memory_register_batch(e, addrs, lens, PIECES), FERRY_OK);
  uint64_t after = rss_bytes();
  size_t touched = resident_pages(big, GiB);
  print_message("1 GiB registered: RSS %+lld KiB, %zu pages of it mapped in\n",
                (long long)(after - before) / 1024, touched);
  assert_int_equal(touched, 0);
  assert_true(after < before + 64 * MiB); /* the engine's own allocations, not the 1 GiB */
  ferry_engine_destroy(e);
  free(addrs);
  free(lens);
  munmap(big, GiB);
}

/* ---- transfers into memory protected since it was registered ----------------------- */

static uint64_t connections_opened(ferry_engine *e, const char *target) {
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(e, &s), FERRY_OK);
  uint64_t n = 0;
  for (size_t i = 0; i < s->link_count; i++)
    if (!strcmp(s->links[i].peer, target))
      n += s->links[i].connections_opened;
  ferry_stats_free(s);
  return n;
}

typedef struct pair {
  ferry_engine *target, *initiator;
  uint8_t *memory; /* the target's region, REGION bytes */
  uint8_t *out, *in;
  char region[64]; /* how a refusal names it */
} pair;

static void pair_start(pair *p, unsigned transports, const char *secret, int checksum) {
  p->target = engine_on(transports, secret, checksum);
  p->initiator = engine_on(transports, secret, checksum);
  p->memory = map(REGION, PROT_READ | PROT_WRITE, 0);
  assert_int_equal(ferry_memory_register(p->target, p->memory, REGION), FERRY_OK);
  p->out = test_buffer(p->initiator, 2 * MiB);
  p->in = test_buffer(p->initiator, 2 * MiB);
  assert_non_null(p->out);
  assert_non_null(p->in);
  snprintf(p->region, sizeof p->region, "region %p (+%llu bytes)", (void *)p->memory, REGION);
}

static void pair_stop(pair *p) {
  ferry_engine_destroy(p->initiator);
  ferry_engine_destroy(p->target);
  munmap(p->memory, REGION);
  free(p->out);
  free(p->in);
}

static ferry_status move(pair *p, ferry_op op, size_t offset, size_t size) {
  uint8_t *local = op == FERRY_OP_WRITE ? p->out : p->in;
  return ferry_transfer_sync(p->initiator, ferry_engine_name(p->target), op, local,
                             (uint64_t)(uintptr_t)(p->memory + offset), size);
}

static void round_trip(pair *p, size_t offset, size_t size, uint64_t seed) {
  test_round_trip(p->initiator, ferry_engine_name(p->target), p->out, p->in,
                  (uint64_t)(uintptr_t)(p->memory + offset), size, seed);
}

/* The middle MiB of the region loses all access after registration: every
 * WRITE and READ touching it fails with FERRY_EFAULT naming the region
 * (small ones, which a tcp target takes from its read-ahead, and ones
 * running into it from good memory), and the next transfers work over the
 * connections already open. */
static void refused_then_served(pair *p) {
  const char *target = ferry_engine_name(p->target);
  round_trip(p, 0, MiB, 1);
  uint64_t opened = connections_opened(p->initiator, target);
  assert_int_equal(mprotect(p->memory + MiB, MiB, PROT_NONE), 0);
  static const struct {
    size_t offset, size;
  } cases[] = {{MiB, 4 * KiB}, {MiB + 12345, 100}, {MiB - 128 * KiB, 256 * KiB}, {MiB / 2, MiB}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    for (int op = FERRY_OP_READ; op <= FERRY_OP_WRITE; op++) {
      ferry_status st = move(p, (ferry_op)op, cases[i].offset, cases[i].size);
      if (st != FERRY_EFAULT)
        fail_msg("%s of %zu bytes at +%zu: %d (%s)", op == FERRY_OP_WRITE ? "WRITE" : "READ",
                 cases[i].size, cases[i].offset, st, ferry_last_error());
      assert_detail_has(p->region);
      assert_detail_has("unmapped or protected");
    }
    round_trip(p, 2 * MiB, 64 * KiB, 10 + i); /* served in between, on the same connections */
  }
  round_trip(p, 0, MiB, 2);
  round_trip(p, 2 * MiB, 2 * MiB, 3);
  assert_int_equal(connections_opened(p->initiator, target), opened);
  assert_int_equal(mprotect(p->memory + MiB, MiB, PROT_READ | PROT_WRITE), 0);
  round_trip(p, MiB / 2, MiB, 4);
}

static void protected_since_registration_tcp(void **state) {
  (void)state;
  pair p;
  pair_start(&p, FERRY_TRANSPORT_TCP, NULL, 0);
  refused_then_served(&p);
  pair_stop(&p);
}

/* Sealed frames and crc32c: the tag and the crc are computed over memory
 * the kernel just wrote (WRITE) or that was checked readable (READ). */
static void protected_since_registration_tcp_sealed_checksum(void **state) {
  (void)state;
  pair p;
  pair_start(&p, FERRY_TRANSPORT_TCP, "memory-access", 1);
  refused_then_served(&p);
  pair_stop(&p);
}

/* shm: the initiator's process_vm_writev/readv meets the target's page. */
static void protected_since_registration_shm(void **state) {
  (void)state;
  pair p;
  pair_start(&p, FERRY_TRANSPORT_SHM, NULL, 0);
  unsigned transport = 0;
  round_trip(&p, 0, 4 * KiB, 0);
  assert_int_equal(ferry_peer_transport(p.initiator, ferry_engine_name(p.target), &transport),
                   FERRY_OK);
  assert_int_equal(transport, FERRY_TRANSPORT_SHM);
  refused_then_served(&p);
  pair_stop(&p);
}

/* A kernel without PROCMAP_QUERY (before 6.11): a READ is not checked
 * before its reply; its send meets EFAULT after the header, so the target
 * ends that connection (the READ fails, the next call reconnects). WRITEs
 * are refused as anywhere. The target survives either way. */
static void protected_since_registration_tcp_without_query(void **state) {
  (void)state;
  ferry_host_memory_query = 0;
  pair p;
  pair_start(&p, FERRY_TRANSPORT_TCP, NULL, 0);
  ferry_host_memory_query = 1;
  round_trip(&p, 0, MiB, 1);
  assert_int_equal(mprotect(p.memory + MiB, MiB, PROT_NONE), 0);
  assert_int_equal(move(&p, FERRY_OP_WRITE, MiB, 4 * KiB), FERRY_EFAULT);
  assert_detail_has(p.region);
  assert_int_not_equal(move(&p, FERRY_OP_READ, MiB, 4 * KiB), FERRY_OK);
  round_trip(&p, 0, MiB, 2);
  pair_stop(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(registration_refuses_memory_the_cpu_cannot_touch),
      cmocka_unit_test(registration_refuses_a_range_with_a_hole),
      cmocka_unit_test(registration_checks_the_location),
      cmocka_unit_test(large_reservation_registers_without_touching_it),
      cmocka_unit_test(protected_since_registration_tcp),
      cmocka_unit_test(protected_since_registration_tcp_sealed_checksum),
      cmocka_unit_test(protected_since_registration_shm),
      cmocka_unit_test(protected_since_registration_tcp_without_query),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
