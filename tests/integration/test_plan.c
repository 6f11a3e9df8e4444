/* test_plan.c - prepared transfer plans (ferry.h, ferry_plan_*): two
 * engines in this process, a target with two adjacent registered regions
 * and an initiator with two, over tcp and over shm. Every transfer is
 * checked byte for byte in the target's memory; merging is seen in the
 * links' ops counters (and over tcp in the frames the target served); bad
 * index pairs, an unregistered local region and a restarted target are
 * each refused before a byte moves. */
#include <pthread.h>
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

#define BLOCK 4096
#define BLOCKS 256                      /* per region */
#define REGION ((size_t)BLOCKS * BLOCK) /* each of the target's two regions */

/* The target's two regions are adjacent halves of one allocation, so a
 * pair that crosses from the first into the second is contiguous in
 * address but must not merge (the target checks each segment against one
 * region). The initiator has out and in, each one region. */
typedef struct plan_rig {
  unsigned transports; /* the initiator's */
  ferry_engine *target, *initiator;
  uint16_t port;
  uint8_t *memory; /* 2 * REGION, two regions */
  uint8_t *out, *in;
  char name[64];
  ferry_plan *plan; /* local: out's blocks then in's; remote: the target's blocks */
} plan_rig;

static ferry_engine *engine_on(uint16_t port, unsigned transports) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.port = port;
  cfg.transports = transports;
  cfg.timeout_ms = cfg.connect_timeout_ms = TEST_SETUP_MS;
  ferry_engine *e = NULL;
  if (ferry_engine_create(&cfg, &e))
    fail_msg("engine create: %s", ferry_last_error());
  return e;
}

/* The target's regions: both halves, or only the first. */
static void register_target(plan_rig *r, int halves) {
  for (int h = 0; h < halves; h++)
    assert_int_equal(ferry_memory_register(r->target, r->memory + h * REGION, REGION), FERRY_OK);
}

static ferry_plan *make_plan(plan_rig *r) {
  enum { N = 2 * BLOCKS };
  ferry_region *local = malloc(2 * N * sizeof *local), *remote = malloc(N * sizeof *remote);
  for (size_t i = 0; i < N; i++) {
    local[i] = (ferry_region){(uint64_t)(uintptr_t)(r->out + i * BLOCK), BLOCK};
    local[N + i] = (ferry_region){(uint64_t)(uintptr_t)(r->in + i * BLOCK), BLOCK};
    remote[i] = (ferry_region){(uint64_t)(uintptr_t)(r->memory + i * BLOCK), BLOCK};
  }
  ferry_plan *plan = NULL;
  if (ferry_plan_create(r->initiator, r->name, local, 2 * N, remote, N, &plan))
    fail_msg("plan create: %s", ferry_last_error());
  assert_int_equal(ferry_plan_local_count(plan), 2 * N);
  assert_int_equal(ferry_plan_remote_count(plan), N);
  free(local);
  free(remote);
  return plan;
}

static void rig_stop(plan_rig *r) {
  ferry_plan_free(r->plan);
  ferry_engine_destroy(r->initiator);
  ferry_engine_destroy(r->target);
  free(r->memory);
  free(r->out);
  free(r->in);
}

static void rig_start(plan_rig *r, unsigned transports) {
  memset(r, 0, sizeof *r);
  r->transports = transports;
  r->target = engine_on(0, 0);
  r->port = ferry_engine_port(r->target);
  r->initiator = engine_on(0, transports);
  r->memory = calloc(2, REGION);
  r->out = test_buffer(r->initiator, 2 * REGION);
  r->in = test_buffer(r->initiator, 2 * REGION);
  assert_true(r->memory && r->out && r->in);
  register_target(r, 2);
  snprintf(r->name, sizeof r->name, "127.0.0.1:%u", r->port);
  r->plan = make_plan(r);
  unsigned used = 0;
  assert_int_equal(ferry_peer_transport(r->initiator, r->name, &used), FERRY_OK);
  if (transports == FERRY_TRANSPORT_SHM && used != FERRY_TRANSPORT_SHM) {
    print_message("no shm service between two engines here (peer uses %s)\n",
                  ferry_transport_name(used));
    rig_stop(r);
    skip();
  }
  assert_int_equal(used, transports);
}

/* Operations submitted to the rig's target (links' ops) and tcp frames it
 * served, for op. */
static void counts(plan_rig *r, ferry_op op, uint64_t *ops, uint64_t *frames) {
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(r->initiator, &s), FERRY_OK);
  *ops = 0;
  for (size_t i = 0; i < s->link_count; i++)
    if (!strcmp(s->links[i].peer, r->name))
      *ops += s->links[i].ops[op];
  ferry_stats_free(s);
  assert_int_equal(ferry_stats_snapshot(r->target, &s), FERRY_OK);
  *frames = s->served_requests[op];
  ferry_stats_free(s);
}

/* A permutation of 0..n-1 (n a power of two): i * odd mod n. */
static int64_t scatter(size_t i, size_t n) { return (int64_t)((i * 2654435761u) % n); }

/* ---- correctness ------------------------------------------------------------------------- */

/* WRITE every out block to a scattered target block (crossing both
 * regions), with a notification; READ them back into in by other pairs. */
static void scattered_round_trip(unsigned transports) {
  enum { N = 2 * BLOCKS };
  plan_rig r;
  rig_start(&r, transports);
  test_fill_random(r.out, 2 * REGION, 11);
  int64_t li[N], ri[N];
  for (size_t i = 0; i < N; i++) {
    li[i] = (int64_t)i;
    ri[i] = scatter(i, N);
  }
  ferry_notification note = {"plan-done", "req-7", 5};
  if (ferry_plan_transfer_sync(r.initiator, r.plan, FERRY_OP_WRITE, li, ri, N, &note, 0))
    fail_msg("plan WRITE: %s", ferry_last_error());
  for (size_t i = 0; i < N; i++)
    assert_memory_equal(r.memory + (size_t)ri[i] * BLOCK, r.out + i * BLOCK, BLOCK);
  ferry_notification *got;
  size_t count;
  assert_int_equal(ferry_notify_drain(r.target, &got, &count), FERRY_OK);
  assert_int_equal(count, 1);
  assert_string_equal(got[0].name, "plan-done");
  assert_memory_equal(got[0].data, "req-7", 5);
  ferry_notify_free(got, count);
  /* READ back by an async submit: in's block i <- the target block out's i went to. */
  for (size_t i = 0; i < N; i++)
    li[i] = N + (int64_t)i;
  ferry_batch *b;
  if (ferry_plan_submit(r.initiator, r.plan, FERRY_OP_READ, li, ri, N, NULL, 0, &b))
    fail_msg("plan READ: %s", ferry_last_error());
  assert_int_equal(ferry_batch_wait(b, -1), FERRY_OK);
  ferry_batch_free(b);
  assert_memory_equal(r.in, r.out, 2 * REGION);
  rig_stop(&r);
}

static void scattered_round_trip_tcp(void **state) { scattered_round_trip(FERRY_TRANSPORT_TCP); }
static void scattered_round_trip_shm(void **state) { scattered_round_trip(FERRY_TRANSPORT_SHM); }

/* ---- merging --------------------------------------------------------------------------------- */

/* 8192 descriptors of 64 B on each side, contiguous on both, the remote
 * ones straddling the boundary of the target's two regions: pairs (i, i)
 * merge into one operation per region (2), never across the boundary (the
 * target would refuse a segment spanning two regions), where
 * FERRY_PLAN_NO_MERGE submits 8192. Over tcp the two merged operations
 * share one frame; unmerged they need one frame per FERRY_CHUNK_MAX_SEGMENTS
 * segments. The bytes land either way. */
static void adjacent_pairs_merge(unsigned transports) {
  enum { N = 8192, SMALL = 64 };
  plan_rig r;
  rig_start(&r, transports);
  uint8_t *span = r.memory + REGION - N / 2 * SMALL;
  ferry_region *local = malloc(N * sizeof *local), *remote = malloc(N * sizeof *remote);
  int64_t *idx = malloc(N * sizeof *idx);
  for (size_t i = 0; i < N; i++) {
    local[i] = (ferry_region){(uint64_t)(uintptr_t)(r.out + i * SMALL), SMALL};
    remote[i] = (ferry_region){(uint64_t)(uintptr_t)(span + i * SMALL), SMALL};
    idx[i] = (int64_t)i;
  }
  ferry_plan *plan;
  assert_int_equal(ferry_plan_create(r.initiator, r.name, local, N, remote, N, &plan), FERRY_OK);
  uint64_t ops0, frames0, ops1, frames1, ops2, frames2;
  counts(&r, FERRY_OP_WRITE, &ops0, &frames0);
  test_fill_random(r.out, N * SMALL, 21);
  if (ferry_plan_transfer_sync(r.initiator, plan, FERRY_OP_WRITE, idx, idx, N, NULL, 0))
    fail_msg("merged WRITE: %s", ferry_last_error());
  assert_memory_equal(span, r.out, N * SMALL);
  counts(&r, FERRY_OP_WRITE, &ops1, &frames1);
  test_fill_random(r.out, N * SMALL, 22);
  if (ferry_plan_transfer_sync(r.initiator, plan, FERRY_OP_WRITE, idx, idx, N, NULL,
                               FERRY_PLAN_NO_MERGE))
    fail_msg("unmerged WRITE: %s", ferry_last_error());
  assert_memory_equal(span, r.out, N * SMALL);
  counts(&r, FERRY_OP_WRITE, &ops2, &frames2);
  print_message("%s: merged %llu ops / %llu frames, unmerged %llu ops / %llu frames\n",
                ferry_transport_name(transports), (unsigned long long)(ops1 - ops0),
                (unsigned long long)(frames1 - frames0), (unsigned long long)(ops2 - ops1),
                (unsigned long long)(frames2 - frames1));
  assert_int_equal(ops1 - ops0, 2);
  assert_int_equal(ops2 - ops1, N);
  if (transports == FERRY_TRANSPORT_TCP) {
    assert_int_equal(frames1 - frames0, 1);
    assert_true(frames2 - frames1 >= 8);
  }
  ferry_plan_free(plan);
  free(local);
  free(remote);
  free(idx);
  rig_stop(&r);
}

static void adjacent_pairs_merge_tcp(void **state) { adjacent_pairs_merge(FERRY_TRANSPORT_TCP); }
static void adjacent_pairs_merge_shm(void **state) { adjacent_pairs_merge(FERRY_TRANSPORT_SHM); }

/* ---- bad index pairs ----------------------------------------------------------------------- */

/* A transfer with one bad pair at its end fails with FERRY_EINVAL naming
 * it, and sends nothing: no op counted, no byte in the target changed. */
static void bad_pair_refused(plan_rig *r, int64_t bad_local, int64_t bad_remote,
                             const char *expect) {
  enum { N = 64 };
  int64_t li[N], ri[N];
  for (size_t i = 0; i < N; i++)
    li[i] = ri[i] = (int64_t)i;
  li[N - 1] = bad_local;
  ri[N - 1] = bad_remote;
  uint64_t ops0, frames0, ops1, frames1;
  counts(r, FERRY_OP_WRITE, &ops0, &frames0);
  memset(r->memory, 0x5A, 2 * REGION);
  memset(r->out, 0xA5, 2 * REGION);
  ferry_status st = ferry_plan_transfer_sync(r->initiator, r->plan, FERRY_OP_WRITE, li, ri, N, NULL,
                                             FERRY_PLAN_NO_MERGE);
  print_message("(%lld, %lld): %s\n", (long long)bad_local, (long long)bad_remote,
                ferry_last_error());
  assert_int_equal(st, FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), expect));
  counts(r, FERRY_OP_WRITE, &ops1, &frames1);
  assert_int_equal(ops1, ops0);
  assert_int_equal(frames1, frames0);
  for (size_t i = 0; i < 2 * REGION; i++)
    if (r->memory[i] != 0x5A)
      fail_msg("byte %zu of the target changed", i);
}

static void bad_indices_send_nothing(void **state) {
  plan_rig r;
  rig_start(&r, FERRY_TRANSPORT_TCP);
  size_t nl = 4 * BLOCKS, nr = 2 * BLOCKS;
  bad_pair_refused(&r, (int64_t)nl, 0, "pair 63 names local descriptor 1024");
  bad_pair_refused(&r, 0, (int64_t)nr, "remote descriptor 512");
  bad_pair_refused(&r, -1, 0, "local descriptor -1");
  bad_pair_refused(&r, 0, INT64_MIN, "remote descriptor -9223372036854775808");
  /* a pair of different lengths: a plan with one short remote descriptor */
  ferry_region local = {(uint64_t)(uintptr_t)r.out, BLOCK};
  ferry_region remote[2] = {{(uint64_t)(uintptr_t)r.memory, BLOCK},
                            {(uint64_t)(uintptr_t)r.memory + BLOCK, 100}};
  ferry_plan *odd;
  assert_int_equal(ferry_plan_create(r.initiator, r.name, &local, 1, remote, 2, &odd), FERRY_OK);
  int64_t zero = 0, one = 1;
  assert_int_equal(
      ferry_plan_transfer_sync(r.initiator, odd, FERRY_OP_WRITE, &zero, &one, 1, NULL, 0),
      FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "of 4096 bytes with remote descriptor 1 of 100"));
  /* no pairs, a bad op, and a plan of another engine */
  assert_int_equal(
      ferry_plan_transfer_sync(r.initiator, odd, FERRY_OP_WRITE, &zero, &zero, 0, NULL, 0),
      FERRY_EINVAL);
  assert_int_equal(
      ferry_plan_transfer_sync(r.initiator, odd, (ferry_op)7, &zero, &zero, 1, NULL, 0),
      FERRY_EINVAL);
  assert_int_equal(
      ferry_plan_transfer_sync(r.target, odd, FERRY_OP_WRITE, &zero, &zero, 1, NULL, 0),
      FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "belongs to another engine"));
  ferry_plan_free(odd);
  rig_stop(&r);
}

/* Descriptors outside registered memory are refused when the plan is made. */
static void unregistered_descriptors_refused(void **state) {
  plan_rig r;
  rig_start(&r, FERRY_TRANSPORT_TCP);
  uint8_t stray[64];
  ferry_region good_l = {(uint64_t)(uintptr_t)r.out, BLOCK};
  ferry_region good_r = {(uint64_t)(uintptr_t)r.memory, BLOCK};
  ferry_region bad_l[2] = {good_l, {(uint64_t)(uintptr_t)stray, sizeof stray}};
  /* runs past the end of the target's second region */
  ferry_region bad_r[2] = {good_r, {(uint64_t)(uintptr_t)r.memory + 2 * REGION - 8, 16}};
  ferry_plan *p = NULL;
  assert_int_equal(ferry_plan_create(r.initiator, r.name, bad_l, 2, &good_r, 1, &p), FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "local descriptor 1"));
  assert_int_equal(ferry_plan_create(r.initiator, r.name, &good_l, 1, bad_r, 2, &p), FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "of remote descriptor 1 is not registered"));
  ferry_region empty = {(uint64_t)(uintptr_t)r.out, 0};
  assert_int_equal(ferry_plan_create(r.initiator, r.name, &empty, 1, &good_r, 1, &p), FERRY_EINVAL);
  assert_null(p);
  rig_stop(&r);
}

/* ---- what a plan holds ------------------------------------------------------------------- */

/* Unregistering a local region the plan uses fails its later transfers,
 * naming the region, even after the same range is registered again;
 * nothing is sent. A new plan works. */
static void unregister_releases_plan(void **state) {
  enum { N = 16 };
  plan_rig r;
  rig_start(&r, FERRY_TRANSPORT_TCP);
  int64_t idx[N];
  for (size_t i = 0; i < N; i++)
    idx[i] = (int64_t)i;
  assert_int_equal(
      ferry_plan_transfer_sync(r.initiator, r.plan, FERRY_OP_WRITE, idx, idx, N, NULL, 0),
      FERRY_OK);
  assert_int_equal(ferry_memory_unregister(r.initiator, r.out), FERRY_OK);
  memset(r.memory, 0x5A, 2 * REGION);
  memset(r.out, 0xA5, 2 * REGION);
  for (int again = 0; again < 2; again++) {
    ferry_status st =
        ferry_plan_transfer_sync(r.initiator, r.plan, FERRY_OP_WRITE, idx, idx, N, NULL, 0);
    print_message("after unregister%s: %s\n", again ? " and register again" : "",
                  ferry_last_error());
    assert_int_equal(st, FERRY_ENOTREG);
    assert_non_null(strstr(ferry_last_error(), "was unregistered after the plan was made"));
    assert_int_equal(r.memory[0], 0x5A);
    assert_int_equal(ferry_memory_register(r.initiator, r.out, 2 * REGION), FERRY_OK);
  }
  /* a plan over the in buffer alone was not released */
  ferry_region local = {(uint64_t)(uintptr_t)r.in, BLOCK};
  ferry_region remote = {(uint64_t)(uintptr_t)r.memory, BLOCK};
  ferry_plan *fresh;
  assert_int_equal(ferry_plan_create(r.initiator, r.name, &local, 1, &remote, 1, &fresh), FERRY_OK);
  assert_int_equal(ferry_memory_unregister(r.initiator, r.out), FERRY_OK);
  int64_t zero = 0;
  assert_int_equal(
      ferry_plan_transfer_sync(r.initiator, fresh, FERRY_OP_READ, &zero, &zero, 1, NULL, 0),
      FERRY_OK);
  assert_int_equal(r.in[0], 0x5A);
  ferry_plan_free(fresh);
  rig_stop(&r);
}

/* The target unregisters a region the plan's remote descriptors use: the
 * transfers touching it fail with FERRY_ENOTREG (the target's check), the
 * others go on. */
static void remote_unregister_refused(unsigned transports) {
  enum { N = 4 };
  plan_rig r;
  rig_start(&r, transports);
  assert_int_equal(ferry_memory_unregister(r.target, r.memory + REGION), FERRY_OK);
  int64_t li[N] = {0, 1, 2, 3}, first[N] = {0, 1, 2, 3},
          second[N] = {BLOCKS, BLOCKS + 1, BLOCKS + 2, BLOCKS + 3};
  test_fill_random(r.out, 4 * BLOCK, 31);
  ferry_status st =
      ferry_plan_transfer_sync(r.initiator, r.plan, FERRY_OP_WRITE, li, second, N, NULL, 0);
  print_message("%s: %s\n", ferry_transport_name(transports), ferry_last_error());
  assert_int_equal(st, FERRY_ENOTREG);
  assert_int_equal(
      ferry_plan_transfer_sync(r.initiator, r.plan, FERRY_OP_WRITE, li, first, N, NULL, 0),
      FERRY_OK);
  assert_memory_equal(r.memory, r.out, 4 * BLOCK);
  rig_stop(&r);
}

static void remote_unregister_refused_tcp(void **state) {
  remote_unregister_refused(FERRY_TRANSPORT_TCP);
}
static void remote_unregister_refused_shm(void **state) {
  remote_unregister_refused(FERRY_TRANSPORT_SHM);
}

/* The target restarts on its port. With the same regions the plan's next
 * transfer goes on (its descriptors found in the new table); with only the
 * first region registered, a transfer touching both regions fails naming
 * the restart and moves nothing, not even into the first region; once the
 * second is registered again it goes on. */
static void restart_target(plan_rig *r, int halves) {
  ferry_engine_destroy(r->target);
  r->target = NULL;
  for (int tries = 0; !r->target && tries < 50; tries++) {
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.bind_host = cfg.advertise_host = "127.0.0.1";
    cfg.port = r->port;
    cfg.timeout_ms = cfg.connect_timeout_ms = TEST_SETUP_MS;
    if (ferry_engine_create(&cfg, &r->target))
      r->target = NULL;
  }
  assert_non_null(r->target);
  register_target(r, halves);
}

static void target_restart(unsigned transports) {
  enum { N = 2 * BLOCKS };
  plan_rig r;
  rig_start(&r, transports);
  int64_t li[N], ri[N];
  for (size_t i = 0; i < N; i++) {
    li[i] = (int64_t)i;
    ri[i] = scatter(i, N);
  }
  restart_target(&r, 2);
  test_fill_random(r.out, 2 * REGION, 41);
  if (ferry_plan_transfer_sync(r.initiator, r.plan, FERRY_OP_WRITE, li, ri, N, NULL, 0))
    fail_msg("WRITE after a restart: %s", ferry_last_error());
  for (size_t i = 0; i < N; i++)
    assert_memory_equal(r.memory + (size_t)ri[i] * BLOCK, r.out + i * BLOCK, BLOCK);
  restart_target(&r, 1);
  memset(r.memory, 0x5A, 2 * REGION);
  ferry_status st =
      ferry_plan_transfer_sync(r.initiator, r.plan, FERRY_OP_WRITE, li, li, N, NULL, 0);
  print_message("%s, restarted with one region: %s\n", ferry_transport_name(transports),
                ferry_last_error());
  assert_int_equal(st, FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "the target restarted"));
  for (size_t i = 0; i < 2 * REGION; i++)
    if (r.memory[i] != 0x5A)
      fail_msg("byte %zu of the restarted target changed", i);
  assert_int_equal(ferry_memory_register(r.target, r.memory + REGION, REGION), FERRY_OK);
  if (ferry_plan_transfer_sync(r.initiator, r.plan, FERRY_OP_WRITE, li, li, N, NULL, 0))
    fail_msg("WRITE once registered again: %s", ferry_last_error());
  assert_memory_equal(r.memory, r.out, 2 * REGION);
  rig_stop(&r);
}

static void target_restart_tcp(void **state) { target_restart(FERRY_TRANSPORT_TCP); }
static void target_restart_shm(void **state) { target_restart(FERRY_TRANSPORT_SHM); }

/* ---- threads, shutdown ----------------------------------------------------------------------- */

typedef struct sharer {
  plan_rig *r;
  int half; /* which half of the target's blocks this thread writes */
  int failures;
} sharer;

static void *share_plan(void *arg) {
  enum { N = BLOCKS };
  sharer *s = arg;
  int64_t li[N], ri[N];
  for (size_t i = 0; i < N; i++) {
    li[i] = (int64_t)(s->half * N + i);
    ri[i] = (int64_t)(s->half * N) + scatter(i, N);
  }
  for (int round = 0; round < 20; round++) {
    ferry_batch *b;
    if (ferry_plan_submit(s->r->initiator, s->r->plan, FERRY_OP_WRITE, li, ri, N, NULL, 0, &b) ||
        ferry_batch_wait(b, -1))
      s->failures++;
    else
      ferry_batch_free(b);
  }
  return NULL;
}

/* Two threads transfer through one plan at once; the plan is then freed
 * after its engine was destroyed (it was detached at shutdown). */
static void threads_share_a_plan(void **state) {
  plan_rig r;
  rig_start(&r, FERRY_TRANSPORT_TCP);
  test_fill_random(r.out, 2 * REGION, 51);
  sharer s[2] = {{&r, 0, 0}, {&r, 1, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&t[i], NULL, share_plan, &s[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  assert_int_equal(s[0].failures + s[1].failures, 0);
  for (size_t i = 0; i < 2 * BLOCKS; i++) {
    size_t half = i / BLOCKS, target_block = half * BLOCKS + (size_t)scatter(i % BLOCKS, BLOCKS);
    assert_memory_equal(r.memory + target_block * BLOCK, r.out + i * BLOCK, BLOCK);
  }
  ferry_plan *plan = r.plan;
  r.plan = NULL;
  ferry_engine_destroy(r.initiator);
  ferry_plan_free(plan); /* detached: touches no engine */
  ferry_engine_destroy(r.target);
  free(r.memory);
  free(r.out);
  free(r.in);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(scattered_round_trip_tcp),
      cmocka_unit_test(scattered_round_trip_shm),
      cmocka_unit_test(adjacent_pairs_merge_tcp),
      cmocka_unit_test(adjacent_pairs_merge_shm),
      cmocka_unit_test(bad_indices_send_nothing),
      cmocka_unit_test(unregistered_descriptors_refused),
      cmocka_unit_test(unregister_releases_plan),
      cmocka_unit_test(remote_unregister_refused_tcp),
      cmocka_unit_test(remote_unregister_refused_shm),
      cmocka_unit_test(target_restart_tcp),
      cmocka_unit_test(target_restart_shm),
      cmocka_unit_test(threads_share_a_plan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
