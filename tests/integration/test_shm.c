/* test_shm.c - the same-host transport: two processes on one host (a
 * `ferry serve` target and this test), or two engines in this process where
 * the test must drive the target's registrations. Every transfer is checked
 * byte for byte, and shm writes are also read back over TCP by a second
 * engine, so the bytes are known to be in the target's own memory. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "child.h"
#include "ferry.h"
#include "harness.h"
#include "pagestall.h"

#define MiB (1024ull * 1024ull)
/* ThreadSanitizer checks every byte a copy touches against its shadow, so
 * its build moves less: the sizes still span one byte to many slices, the
 * round trips and their checks stay (as in test_transfer.c). */
#ifdef __SANITIZE_THREAD__
#define TARGET_SIZE (64 * MiB)
#define MAX_TRANSFER (16 * MiB)
#else
#define TARGET_SIZE (512 * MiB)
#define MAX_TRANSFER (256 * MiB)
#endif

static ferry_engine *engine_with(unsigned transports, const char *secret) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = transports;
  cfg.secret = secret;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  return e;
}

static unsigned transport_to(ferry_engine *e, const char *target) {
  unsigned transport = 0;
  assert_int_equal(ferry_peer_transport(e, target, &transport), FERRY_OK);
  return transport;
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* 1 B .. MAX_TRANSFER, uniform in log scale so every order of magnitude shows up. */
static size_t random_size(uint64_t *rng) {
  unsigned bits = (unsigned)(rng_next(rng) % 28); /* [2^bits, 2^(bits+1)) */
  size_t size = ((size_t)1 << bits) + (size_t)(rng_next(rng) % ((uint64_t)1 << bits));
  return size > MAX_TRANSFER ? MAX_TRANSFER : size;
}

/* ---- round trips against a `ferry serve` process -------------------------------------- */

typedef struct round_trip_ctx {
  ferry_engine *shm, *tcp;
  const test_target *t;
  uint8_t *out, *in, *check;
} round_trip_ctx;

/* WRITE over shm, READ back over shm and over TCP; all three must agree. */
static void round_trip(round_trip_ctx *c, uint64_t offset, size_t size, uint64_t seed) {
  uint64_t remote = c->t->addr + offset;
  test_fill_random(c->out, size, seed);
  memset(c->in, 0xA5, size);
  memset(c->check, 0x5A, size);
  assert_int_equal(ferry_transfer_sync(c->shm, c->t->target, FERRY_OP_WRITE, c->out, remote, size),
                   FERRY_OK);
  assert_int_equal(ferry_transfer_sync(c->shm, c->t->target, FERRY_OP_READ, c->in, remote, size),
                   FERRY_OK);
  assert_int_equal(ferry_transfer_sync(c->tcp, c->t->target, FERRY_OP_READ, c->check, remote, size),
                   FERRY_OK);
  assert_memory_equal(c->out, c->in, size);
  assert_memory_equal(c->out, c->check, size);
}

static void random_round_trips(const char *const *serve_args, const char *kind) {
  test_target t;
  assert_int_equal(test_target_start(&t, 0, TARGET_SIZE, serve_args), 0);
  round_trip_ctx c = {
      engine_with(0, NULL), engine_with(FERRY_TRANSPORT_TCP, NULL), &t, NULL, NULL, NULL};
  c.out = test_buffer(c.shm, MAX_TRANSFER);
  c.in = test_buffer(c.shm, MAX_TRANSFER);
  c.check = test_buffer(c.tcp, MAX_TRANSFER);
  assert_non_null(c.out);
  assert_non_null(c.in);
  assert_non_null(c.check);
  assert_int_equal(transport_to(c.shm, t.target), FERRY_TRANSPORT_SHM);
  assert_int_equal(transport_to(c.tcp, t.target), FERRY_TRANSPORT_TCP);
  uint64_t rng = 0x5eed0000u + (uint64_t)kind[0], bytes = 0;
  double t0 = test_now_s();
  round_trip(&c, 0, 1, 1);
  round_trip(&c, TARGET_SIZE - MAX_TRANSFER, MAX_TRANSFER, 2);
  for (int i = 0; i < 16; i++) {
    size_t size = random_size(&rng);
    uint64_t offset = rng_next(&rng) % (TARGET_SIZE - size + 1);
    round_trip(&c, offset, size, 100 + (uint64_t)i);
    bytes += size;
  }
  print_message("%s: 18 round trips (%.0f MiB random) verified in %.2f s\n", kind,
                (double)bytes / MiB, test_now_s() - t0);
  ferry_engine_destroy(c.shm);
  ferry_engine_destroy(c.tcp);
  free(c.out);
  free(c.in);
  free(c.check);
  test_target_stop(&t);
}

static void random_sizes_ferry_allocated(void **state) {
  random_round_trips(NULL, "mapped (ferry_memory_alloc)");
}

static void random_sizes_user_allocated(void **state) {
  const char *args[] = {"--malloc", NULL};
  random_round_trips(args, "cma (malloc)");
}

/* ---- choice of transport ------------------------------------------------------------- */

static void shm_is_chosen_on_the_same_host(void **state) {
  test_target t;
  const char *args[] = {"--secret", "s3cret", NULL};
  assert_int_equal(test_target_start(&t, 0, 4 * MiB, args), 0);
  ferry_engine *e = engine_with(0, "s3cret");
  uint8_t *buf = test_buffer(e, MiB), *back = test_buffer(e, MiB);
  assert_int_equal(transport_to(e, t.target), FERRY_TRANSPORT_SHM);
  test_round_trip(e, t.target, buf, back, t.addr, MiB, 7);
  ferry_engine_destroy(e);
  free(buf);
  free(back);
  test_target_stop(&t);
}

static void tcp_can_be_forced(void **state) {
  test_target t, tcp_only;
  const char *args[] = {"--protocol", "tcp", NULL};
  assert_int_equal(test_target_start(&t, 0, 4 * MiB, NULL), 0);
  assert_int_equal(test_target_start(&tcp_only, 0, 4 * MiB, args), 0);
  ferry_engine *by_config = engine_with(FERRY_TRANSPORT_TCP, NULL);
  assert_int_equal(transport_to(by_config, t.target), FERRY_TRANSPORT_TCP);
  setenv("FERRY_TRANSPORTS", "tcp", 1);
  ferry_engine *by_env = test_engine(NULL);
  unsetenv("FERRY_TRANSPORTS");
  assert_int_equal(transport_to(by_env, t.target), FERRY_TRANSPORT_TCP);
  ferry_engine *any = engine_with(0, NULL);
  assert_int_equal(transport_to(any, tcp_only.target), FERRY_TRANSPORT_TCP);
  ferry_engine *shm_only = engine_with(FERRY_TRANSPORT_SHM, NULL);
  assert_int_equal(transport_to(shm_only, t.target), FERRY_TRANSPORT_SHM);
  unsigned transport;
  assert_int_equal(ferry_peer_transport(shm_only, tcp_only.target, &transport), FERRY_ETRANSPORT);
  print_message("shm-only engine to a tcp-only target: %s\n", ferry_last_error());
  ferry_engine_destroy(by_config);
  ferry_engine_destroy(by_env);
  ferry_engine_destroy(any);
  ferry_engine_destroy(shm_only);
  test_target_stop(&t);
  test_target_stop(&tcp_only);
}

/* A user that may not ptrace the target cannot use CMA: that peer falls
 * back to TCP. Runs as root only: role "nobody-initiator" TARGET ADDR (hex),
 * this program started again (child.h), drops to nobody. */
static int nobody_initiator(int argc, char **argv) {
  if (argc != 2)
    return 9;
  const char *target = argv[0];
  uint64_t addr = strtoull(argv[1], NULL, 16);
  if (setgid(65534) != 0 || setuid(65534) != 0)
    return 10;
  ferry_engine *e = test_engine(NULL);
  uint8_t *buf = e ? test_buffer(e, MiB) : NULL;
  unsigned transport = 0;
  if (!buf || ferry_peer_transport(e, target, &transport) != FERRY_OK)
    return 11;
  if (transport != FERRY_TRANSPORT_TCP)
    return 12;
  test_fill_random(buf, MiB, 9);
  if (ferry_transfer_sync(e, target, FERRY_OP_WRITE, buf, addr, MiB) != FERRY_OK)
    return 13;
  ferry_engine_destroy(e);
  free(buf);
  return 0;
}

static void cma_refused_falls_back_to_tcp(void **state) {
  if (geteuid() != 0) {
    print_message("not root: cannot run an initiator as another user\n");
    skip();
  }
  test_target t;
  assert_int_equal(test_target_start(&t, 0, 4 * MiB, NULL), 0);
  char addr[32];
  snprintf(addr, sizeof addr, "%llx", (unsigned long long)t.addr);
  const char *args[] = {t.target, addr, NULL};
  pid_t pid = test_child_start("nobody-initiator", args, NULL, NULL);
  assert_true(pid > 0);
  int status = -1;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  /* and the bytes really landed: read them back as root, over shm */
  ferry_engine *e = test_engine(NULL);
  uint8_t *want = malloc(MiB), *back = test_buffer(e, MiB);
  test_fill_random(want, MiB, 9);
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_READ, back, t.addr, MiB), FERRY_OK);
  assert_memory_equal(want, back, MiB);
  ferry_engine_destroy(e);
  free(want);
  free(back);
  test_target_stop(&t);
}

/* ---- refusals and failures ------------------------------------------------------------- */

static void out_of_region_is_refused(void **state) {
  test_target t;
  assert_int_equal(test_target_start(&t, 0, 4 * MiB, NULL), 0);
  ferry_engine *e = engine_with(0, NULL);
  uint8_t *buf = test_buffer(e, MiB);
  assert_int_equal(transport_to(e, t.target), FERRY_TRANSPORT_SHM);
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr + 4 * MiB - 10, 20),
                   FERRY_ENOTREG);
  print_message("%s\n", ferry_last_error());
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_READ, buf, t.addr - 4096, 4096),
                   FERRY_ENOTREG);
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, 0x1000, 16),
                   FERRY_ENOTREG);
  /* the peer stays usable */
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, MiB), FERRY_OK);
  ferry_engine_destroy(e);
  free(buf);
  test_target_stop(&t);
}

static void peer_exit_while_mapped(void **state) {
  test_target t;
  assert_int_equal(test_target_start(&t, 0, 64 * MiB, NULL), 0);
  ferry_engine *e = engine_with(0, NULL);
  uint8_t *buf = test_buffer(e, 64 * MiB);
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, 64 * MiB),
                   FERRY_OK);
  assert_int_equal(transport_to(e, t.target), FERRY_TRANSPORT_SHM);
  test_target_kill(&t);
  for (int i = 0; i < 3; i++) {
    ferry_status st = ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, 64 * MiB);
    print_message("call %d after the peer exited: %s: %s\n", i, ferry_strerror(st),
                  ferry_last_error());
    assert_int_equal(st, FERRY_ESOCKET);
    assert_non_null(strstr(ferry_last_error(), "127.0.0.1"));
  }
  ferry_engine_destroy(e);
  free(buf);
}

/* A target restarted on the same port is reached again, over shm, with a
 * new link (the first call may report the restart). */
static void peer_restart_reconnects(void **state) {
  test_target t;
  assert_int_equal(test_target_start(&t, 0, 16 * MiB, NULL), 0);
  uint16_t port = t.port;
  ferry_engine *e = engine_with(0, NULL);
  uint8_t *buf = test_buffer(e, MiB), *back = test_buffer(e, MiB);
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, MiB), FERRY_OK);
  test_target_kill(&t);
  assert_int_equal(test_target_restart(&t, port, 16 * MiB), 0);
  test_fill_random(buf, MiB, 61);
  ferry_status st = ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, MiB);
  if (st != FERRY_OK) {
    print_message("first call after the restart: %s\n", ferry_last_error());
    assert_int_equal(st, FERRY_ESOCKET);
    st = ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, MiB);
  }
  assert_int_equal(st, FERRY_OK);
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_READ, back, t.addr, MiB), FERRY_OK);
  assert_memory_equal(buf, back, MiB);
  assert_int_equal(transport_to(e, t.target), FERRY_TRANSPORT_SHM);
  ferry_engine_destroy(e);
  free(buf);
  free(back);
  test_target_stop(&t);
}

/* ---- two engines in this process: the test drives the target ------------------------------- */

typedef struct local_pair {
  ferry_engine *target, *initiator;
  char name[80];
  uint8_t *remote; /* registered on target */
  uint8_t *local;  /* registered on initiator */
  size_t size;
  int allocated; /* remote came from ferry_memory_alloc */
} local_pair;

static void pair_open(local_pair *p, size_t size, int allocated) {
  memset(p, 0, sizeof *p);
  p->target = test_engine(NULL);
  p->initiator = test_engine(NULL);
  snprintf(p->name, sizeof p->name, "%s", ferry_engine_name(p->target));
  p->size = size;
  p->allocated = allocated;
  if (allocated) {
    assert_int_equal(ferry_memory_alloc(p->target, size, (void **)&p->remote), FERRY_OK);
  } else {
    p->remote = test_buffer(p->target, size);
    memset(p->remote, 0, size);
  }
  p->local = test_buffer(p->initiator, size);
  assert_non_null(p->remote);
  assert_non_null(p->local);
  assert_int_equal(transport_to(p->initiator, p->name), FERRY_TRANSPORT_SHM);
}

static void pair_close(local_pair *p) {
  ferry_engine_destroy(p->initiator);
  if (p->allocated)
    ferry_memory_free(p->target, p->remote);
  ferry_engine_destroy(p->target);
  if (!p->allocated)
    free(p->remote);
  free(p->local);
}

static ferry_status pair_write(local_pair *p, size_t size) {
  return ferry_transfer_sync(p->initiator, p->name, FERRY_OP_WRITE, p->local,
                             (uint64_t)(uintptr_t)p->remote, size);
}

static void unregister_revokes(int allocated) {
  local_pair p;
  pair_open(&p, 8 * MiB, allocated);
  test_fill_random(p.local, p.size, 21);
  assert_int_equal(pair_write(&p, p.size), FERRY_OK);
  assert_memory_equal(p.local, p.remote, p.size);
  assert_int_equal(ferry_memory_unregister(p.target, p.remote), FERRY_OK);
  test_fill_random(p.local, p.size, 22);
  /* The initiator's cached table still lists the region; the shm check must refuse. */
  assert_int_equal(pair_write(&p, p.size), FERRY_ENOTREG);
  print_message("after unregister: %s\n", ferry_last_error());
  test_fill_random(p.local, p.size, 21);
  assert_memory_equal(p.local, p.remote, p.size); /* untouched */
  /* registered again: reachable again */
  assert_int_equal(ferry_memory_register(p.target, p.remote, p.size), FERRY_OK);
  test_fill_random(p.local, p.size, 23);
  assert_int_equal(pair_write(&p, p.size), FERRY_OK);
  assert_memory_equal(p.local, p.remote, p.size);
  pair_close(&p);
}

static void unregister_revokes_mapped_memory(void **state) { unregister_revokes(1); }
static void unregister_revokes_cma_memory(void **state) { unregister_revokes(0); }

static void freed_buffer_is_refused(void **state) {
  local_pair p;
  pair_open(&p, 4 * MiB, 1);
  assert_int_equal(pair_write(&p, p.size), FERRY_OK);
  assert_int_equal(ferry_memory_free(p.target, p.remote), FERRY_OK);
  assert_int_equal(pair_write(&p, p.size), FERRY_ENOTREG);
  /* a new buffer (possibly at the same address) is a different memfd */
  assert_int_equal(ferry_memory_alloc(p.target, p.size, (void **)&p.remote), FERRY_OK);
  test_fill_random(p.local, p.size, 31);
  assert_int_equal(pair_write(&p, p.size), FERRY_OK);
  assert_memory_equal(p.local, p.remote, p.size);
  pair_close(&p);
}

typedef struct unregister_call {
  ferry_engine *e;
  local_pair *p;
  uint8_t *snapshot; /* the region as it was when unregister returned */
} unregister_call;

static void unregister_then_snapshot(void *arg) {
  unregister_call *u = arg;
  assert_int_equal(ferry_memory_unregister(u->e, u->p->remote), FERRY_OK);
  memcpy(u->snapshot, u->p->remote, u->p->size);
}

/* Unregistering while a WRITE is provably half done: the initiator's
 * source buffer stalls the copy at its second half (userfaultfd), after
 * the chunk passed its check. Unregister must not return while that copy
 * can still write; it returns once the copy ends, and nothing changes the
 * region after it returned. */
static void in_flight_write_and_unregister(int allocated) {
  page_stall src;
  if (page_stall_create(&src, 2 * MiB, MiB, 0x77) != 0) {
    print_message("no userfaultfd here: cannot hold a copy in flight\n");
    skip();
  }
  local_pair p;
  pair_open(&p, 2 * MiB, allocated);
  assert_int_equal(ferry_memory_register(p.initiator, src.base, src.size), FERRY_OK);
  ferry_entry entry = {FERRY_OP_WRITE, src.base, (uint64_t)(uintptr_t)p.remote, p.size};
  ferry_batch *b;
  assert_int_equal(ferry_batch_submit(p.initiator, p.name, &entry, 1, NULL, &b), FERRY_OK);
  assert_int_equal(page_stall_wait(&src, 10000), 0); /* the copy is under way, and stuck */
  unregister_call u = {p.target, &p, malloc(p.size)};
  int early = page_stall_returns_early(&src, 0x77, unregister_then_snapshot, &u);
  assert_int_not_equal(early, -1);
  ferry_status st = ferry_batch_wait(b, -1);
  ferry_batch_free(b);
  print_message("unregister returned %s the stalled copy ended; batch: %s\n",
                early ? "BEFORE" : "after", st ? ferry_last_error() : "completed");
  assert_false(early);
  assert_true(st == FERRY_OK || st == FERRY_ENOTREG);
  assert_memory_equal(u.snapshot, p.remote, p.size); /* nothing landed after it returned */
  free(u.snapshot);
  assert_int_equal(ferry_memory_register(p.target, p.remote, p.size), FERRY_OK);
  pair_close(&p);
  page_stall_destroy(&src);
}

static void in_flight_mapped(void **state) { in_flight_write_and_unregister(1); }
static void in_flight_cma(void **state) { in_flight_write_and_unregister(0); }

static void notification_after_data(void **state) {
  local_pair p;
  pair_open(&p, 16 * MiB, 1);
  test_fill_random(p.local, p.size, 41);
  ferry_entry entry = {FERRY_OP_WRITE, p.local, (uint64_t)(uintptr_t)p.remote, p.size};
  ferry_notification n = {"kv-ready", "layer 7", 7};
  assert_int_equal(ferry_transfer_sync_batch(p.initiator, p.name, &entry, 1, &n), FERRY_OK);
  ferry_notification *list;
  size_t count;
  assert_int_equal(ferry_notify_drain(p.target, &list, &count), FERRY_OK);
  assert_int_equal(count, 1);
  assert_string_equal(list[0].name, "kv-ready");
  assert_string_equal(list[0].data, "layer 7");
  ferry_notify_free(list, count);
  assert_memory_equal(p.local, p.remote, p.size);
  pair_close(&p);
}

/* READ from many small scattered entries in one batch (coalesced chunks). */
static void scattered_batch(void **state) {
  local_pair p;
  pair_open(&p, 16 * MiB, 1);
  test_fill_random(p.remote, p.size, 51);
  enum { N = 4000 };
  ferry_entry *entries = calloc(N, sizeof *entries);
  uint64_t rng = 99;
  for (size_t i = 0; i < N; i++) {
    size_t len = 1 + rng_next(&rng) % 4096;
    uint64_t off = (uint64_t)i * 4096;
    entries[i] =
        (ferry_entry){FERRY_OP_READ, p.local + off, (uint64_t)(uintptr_t)p.remote + off, len};
  }
  memset(p.local, 0, p.size);
  assert_int_equal(ferry_transfer_sync_batch(p.initiator, p.name, entries, N, NULL), FERRY_OK);
  for (size_t i = 0; i < N; i++)
    assert_memory_equal(entries[i].local, p.remote + (uint64_t)i * 4096, entries[i].length);
  free(entries);
  pair_close(&p);
}

/* Lines of /proc/self/maps mapping the file that holds addr (its inode). */
static int mappings_of_file_at(const void *addr) {
  FILE *f = fopen("/proc/self/maps", "r");
  assert_non_null(f);
  char line[512];
  unsigned long long lo, hi, ino, want = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%llx-%llx %*s %*s %*s %llu", &lo, &hi, &ino) == 3 && (uintptr_t)addr >= lo &&
        (uintptr_t)addr < hi)
      want = ino;
  assert_true(want != 0);
  rewind(f);
  int n = 0;
  while (fgets(line, sizeof line, f))
    n += sscanf(line, "%llx-%llx %*s %*s %*s %llu", &lo, &hi, &ino) == 3 && ino == want;
  fclose(f);
  return n;
}

/* A first batch cut into chunks opens channels on several workers at once;
 * they must share one link, so the target's buffer is mapped here once
 * (each mapping faults every page in again: two links made a store's puts
 * three times slower). Fresh pairs, as the race is at first contact. */
static void parallel_channels_share_one_mapping(void **state) {
  (void)state;
  enum { TRIALS = 8, N = 64, PIECE = 256 * 1024 };
  for (int trial = 0; trial < TRIALS; trial++) {
    local_pair p;
    pair_open(&p, (size_t)N * PIECE, 1);
    test_fill_random(p.local, p.size, 60 + (uint64_t)trial);
    ferry_entry entries[N];
    for (size_t i = 0; i < N; i++)
      entries[i] = (ferry_entry){FERRY_OP_WRITE, p.local + i * PIECE,
                                 (uint64_t)(uintptr_t)p.remote + i * PIECE, PIECE};
    assert_int_equal(ferry_transfer_sync_batch(p.initiator, p.name, entries, N, NULL), FERRY_OK);
    assert_memory_equal(p.local, p.remote, p.size);
    /* the target's own mapping and the initiator's one */
    assert_int_equal(mappings_of_file_at(p.remote), 2);
    pair_close(&p);
  }
}

int main(int argc, char **argv) {
  const test_child_role roles[] = {{"nobody-initiator", nobody_initiator}};
  test_child_main(argc, argv, roles, sizeof roles / sizeof *roles);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(shm_is_chosen_on_the_same_host),
      cmocka_unit_test(tcp_can_be_forced),
      cmocka_unit_test(cma_refused_falls_back_to_tcp),
      cmocka_unit_test(out_of_region_is_refused),
      cmocka_unit_test(peer_exit_while_mapped),
      cmocka_unit_test(peer_restart_reconnects),
      cmocka_unit_test(unregister_revokes_mapped_memory),
      cmocka_unit_test(unregister_revokes_cma_memory),
      cmocka_unit_test(freed_buffer_is_refused),
      cmocka_unit_test(in_flight_mapped),
      cmocka_unit_test(in_flight_cma),
      cmocka_unit_test(notification_after_data),
      cmocka_unit_test(scattered_batch),
      cmocka_unit_test(parallel_channels_share_one_mapping),
      cmocka_unit_test(random_sizes_ferry_allocated),
      cmocka_unit_test(random_sizes_user_allocated),
  };
  return cmocka_run_group_tests_name("shm transport", tests, NULL, NULL);
}
