/* test_device_memory.c - device memory (CUDA) on every transport, without
 * a GPU: through the test double of the CUDA driver (support/fake_cuda,
 * loaded as libcuda.so.1 from LD_LIBRARY_PATH), whose device memory the
 * CPU cannot touch (a touch crashes, a system call gets EFAULT) and whose
 * asynchronous copies land only when their event is waited for. It tests
 * ferry's logic around device memory, not the GPU path (tests/gpu does).
 *
 *  - tcp: WRITE and READ between device memory on both ends (and mixed
 *    with host memory in one batch) move through the staging pipeline,
 *    every byte intact at sizes around the bounce buffers' slot size, and
 *    staged_bytes counts them; no CUDA context is left current.
 *  - FERRY_STAGING=never: the initiator refuses its own device memory,
 *    the target refuses a request for its own, both with FERRY_EFAULT
 *    naming the memory, and the connection serves the next request.
 *  - fabric stages local device memory through bounce buffers registered
 *    with its provider (neither provider here registers CUDA memory: each
 *    engine says once why), 1 B to past the slot, many entries mixed with
 *    host memory, plans too; FERRY_STAGING=always stages host memory
 *    there too, never refuses device memory. Device memory at a fabric
 *    target is left unregistered with the provider (a key of zeros): the
 *    initiator refuses such a batch before anything is sent, or, with tcp
 *    usable beside fabric, moves it over tcp.
 *  - shm carries device memory: device to device, host to device and back
 *    (the peer's memfd buffers and its CMA-reached memory), the target's
 *    unregister waiting for a copy in flight into its device memory; and,
 *    with the target in a child process (device_target), through imports
 *    of its allocations: one open per allocation, regions at offsets in
 *    it, 1 B to 8 MiB, a re-registered allocation never written through
 *    the stale import; a VMM allocation imported from its POSIX fd (both
 *    ways, once, closed with the link, unregister a fence), and one the
 *    driver will not export refused naming why.
 *
 * Both engines live in this process, on 127.0.0.1, but for the child's. */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "child.h"
#include "cuda_double.h"
#include "ferry.h"
#include "harness.h"
#include "pagestall.h"
#include "rig.h"

#define KiB 1024ull
#define SLOT (256 * KiB) /* the staging pipeline's slot (memory/staging.h) */
#define DEVICE_BYTES (2 * 1024 * KiB)
#define HOST_BYTES (1024 * KiB)

/* ---- engines and their memory ----------------------------------------------------- */

static ferry_engine *engine_with(unsigned transports, int staging, const char *provider) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = transports;
  cfg.staging = staging;
  cfg.fabric_provider = provider;
  cfg.timeout_ms = TEST_SETUP_MS;
  return test_engine_create(&cfg);
}

/* A rig (host buffers of HOST_BYTES each) plus a device buffer registered
 * on each engine as "cuda:0". */
typedef struct device_rig {
  test_rig r;
  uint8_t *remote; /* the target's device buffer */
  uint8_t *local;  /* the initiator's */
} device_rig;

/* Engines with these transports (fabric over provider) and staging modes. */
static void device_rig_start(device_rig *d, unsigned transports, const char *provider,
                             int target_staging, int initiator_staging) {
  cuda_double_need();
  ferry_engine *target = engine_with(transports, target_staging, provider);
  ferry_engine *initiator = engine_with(transports, initiator_staging, provider);
  test_rig_start(&d->r, target, initiator, HOST_BYTES);
  d->remote = cuda_double_alloc(DEVICE_BYTES);
  d->local = cuda_double_alloc(DEVICE_BYTES);
  assert_int_equal(ferry_memory_register_at(target, d->remote, DEVICE_BYTES, "cuda:0"), FERRY_OK);
  assert_int_equal(ferry_memory_register_at(initiator, d->local, DEVICE_BYTES, "cuda"), FERRY_OK);
}

static void device_rig_stop(device_rig *d) {
  test_rig_stop(&d->r); /* the engines first: nothing touches the memory after */
  cuda_double_free(d->remote);
  cuda_double_free(d->local);
}

static uint64_t remote_of(const device_rig *d, size_t offset) {
  return (uint64_t)(uintptr_t)d->remote + offset;
}

static void staged_bytes(ferry_engine *e, uint64_t out[2]) {
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(e, &s), FERRY_OK);
  memcpy(out, s->staged_bytes, sizeof s->staged_bytes);
  ferry_stats_free(s);
}

static void assert_detail_has(const char *part) {
  if (!strstr(ferry_last_error(), part))
    fail_msg("detail \"%s\" lacks \"%s\"", ferry_last_error(), part);
}

/* WRITE size bytes from the initiator's device memory at offset into the
 * target's at offset + 7, READ them back into the initiator's device
 * memory at offset + size, and compare. */
static void device_round_trip(device_rig *d, size_t offset, size_t size, uint64_t seed) {
  uint8_t *want = malloc(size), *got = malloc(size);
  assert_non_null(want);
  assert_non_null(got);
  test_fill_random(want, size, seed);
  cuda_double_put(d->local + offset, want, size);
  ferry_engine *e = d->r.initiator;
  if (ferry_transfer_sync(e, d->r.name, FERRY_OP_WRITE, d->local + offset, remote_of(d, offset + 7),
                          size) ||
      ferry_transfer_sync(e, d->r.name, FERRY_OP_READ, d->local + offset + size,
                          remote_of(d, offset + 7), size))
    fail_msg("%zu bytes: %s", size, ferry_last_error());
  cuda_double_get(got, d->local + offset + size, size);
  assert_memory_equal(got, want, size);
  cuda_double_get(got, d->remote + offset + 7, size);
  assert_memory_equal(got, want, size);
  free(want);
  free(got);
}

/* ---- tcp: staged ------------------------------------------------------------------- */

/* Device memory on both ends at sizes around the slot size: intact, and
 * every byte counted as staged on both sides. */
static void tcp_device_both_ends(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_TCP, NULL, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  const size_t sizes[] = {1, SLOT - 1, SLOT, SLOT + 1, 3 * SLOT + 7, DEVICE_BYTES / 2 - 8};
  uint64_t moved = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    device_round_trip(&d, 0, sizes[i], i + 1);
    moved += sizes[i];
  }
  uint64_t initiator[2], target[2];
  staged_bytes(d.r.initiator, initiator);
  staged_bytes(d.r.target, target);
  assert_int_equal(initiator[FERRY_OP_WRITE], moved);
  assert_int_equal(initiator[FERRY_OP_READ], moved);
  assert_int_equal(target[FERRY_OP_WRITE], moved);
  assert_int_equal(target[FERRY_OP_READ], moved);
  cuda_double_no_context();
  device_rig_stop(&d);
}

/* Batches of many small entries, local device and host memory mixed. */
enum { N = 200, PIECE = 4099 };

/* Entry i's local memory: device or host, where it is written from (the
 * lower half of the device buffer, out) or read back into (the upper
 * half, in). */
static uint8_t *mixed_local(device_rig *d, size_t i, int device, int back) {
  size_t at = i * PIECE;
  if (device)
    return d->local + (back ? DEVICE_BYTES / 2 : 0) + at;
  return (back ? d->r.in : d->r.out) + at;
}

/* seed's N * PIECE bytes, put at the start of the initiator's device
 * buffer and of out. */
static uint8_t *mixed_fill(device_rig *d, uint64_t seed) {
  uint8_t *want = malloc(N * PIECE);
  assert_non_null(want);
  test_fill_random(want, N * PIECE, seed);
  cuda_double_put(d->local, want, N * PIECE);
  memcpy(d->r.out, want, N * PIECE);
  return want;
}

/* Asserts the entries read back (on the device where device(i)) hold
 * want, and frees it. */
static void mixed_check(device_rig *d, uint8_t *want, int (*device)(size_t i)) {
  uint8_t *got = malloc(N * PIECE);
  assert_non_null(got);
  for (size_t i = 0; i < N; i++) {
    const uint8_t *back = mixed_local(d, i, device(i), 1);
    if (device(i))
      cuda_double_get(got + i * PIECE, back, PIECE);
    else
      memcpy(got + i * PIECE, back, PIECE);
  }
  assert_memory_equal(got, want, N * PIECE);
  free(want);
  free(got);
}

static int alternating(size_t i) { return i % 2; }

static int runs_of_three(size_t i) { return (i / 3) % 2; } /* chunks of one kind and mixed ones */

/* One batch of many entries, device and host memory alternating on both
 * ends, each range through its own kind's copier (tcp) or copies (shm);
 * then read back. mapped: the target's host memory is a ferry_memory_alloc
 * buffer (shm maps it), else malloc'd (shm reaches it with CMA). */
static void many_entries_mixed(unsigned transports, int mapped) {
  device_rig d;
  device_rig_start(&d, transports, NULL, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  static ferry_entry write[N], read[N];
  uint8_t *want = mixed_fill(&d, 42);
  void *allocated = NULL;
  if (mapped)
    assert_int_equal(ferry_memory_alloc(d.r.target, HOST_BYTES, &allocated), FERRY_OK);
  uint64_t remote_host = (uint64_t)(uintptr_t)(mapped ? allocated : d.r.memory);
  for (size_t i = 0; i < N; i++) {
    size_t at = i * PIECE;
    int device_here = alternating(i), device_there = i % 3 != 0;
    uint64_t remote = device_there ? remote_of(&d, at + 1) : remote_host + at + 1;
    write[i] = (ferry_entry){FERRY_OP_WRITE, mixed_local(&d, i, device_here, 0), remote, PIECE};
    read[i] = (ferry_entry){FERRY_OP_READ, mixed_local(&d, i, device_here, 1), remote, PIECE};
  }
  if (ferry_transfer_sync_batch(d.r.initiator, d.r.name, write, N, NULL) ||
      ferry_transfer_sync_batch(d.r.initiator, d.r.name, read, N, NULL))
    fail_msg("%s", ferry_last_error());
  mixed_check(&d, want, alternating);
  cuda_double_no_context();
  device_rig_stop(&d);
}

static void tcp_many_entries_mixed(void **state) { many_entries_mixed(FERRY_TRANSPORT_TCP, 0); }

/* FERRY_STAGING=never on the initiator: its device memory is refused
 * before anything is sent; a host transfer still works. */
static void never_refused_on(unsigned transports, const char *provider) {
  device_rig d;
  device_rig_start(&d, transports, provider, FERRY_STAGING_AUTO, FERRY_STAGING_NEVER);
  for (int op = FERRY_OP_READ; op <= FERRY_OP_WRITE; op++) {
    assert_int_equal(ferry_transfer_sync(d.r.initiator, d.r.name, (ferry_op)op, d.local + 16,
                                         (uint64_t)(uintptr_t)d.r.memory, 4096),
                     FERRY_EFAULT);
    assert_detail_has("is cuda:0 memory, which no transport can carry under FERRY_STAGING=never");
  }
  test_rig_round_trip(&d.r);
  device_rig_stop(&d);
}

static void never_refused_at_initiator(void **state) {
  never_refused_on(FERRY_TRANSPORT_TCP, NULL);
}

/* fabric stages device memory too: not under never. */
static void fabric_never_refused_at_initiator(void **state) {
  never_refused_on(FERRY_TRANSPORT_FABRIC, "tcp;ofi_rxm");
}

/* FERRY_STAGING=never on the target: a request for its device memory is
 * refused there (the checksum mode included, which would read it), the
 * connection stays in step for the next request. */
static void never_refused_at_target(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_TCP, NULL, FERRY_STAGING_NEVER, FERRY_STAGING_AUTO);
  for (int op = FERRY_OP_READ; op <= FERRY_OP_WRITE; op++) {
    assert_int_equal(ferry_transfer_sync(d.r.initiator, d.r.name, (ferry_op)op, d.r.out,
                                         remote_of(&d, 64), 3 * SLOT),
                     FERRY_EFAULT);
    assert_detail_has("is cuda:0 memory, which it moves only through staging");
    test_rig_round_trip(&d.r);
  }
  device_rig_stop(&d);
}

/* ---- fabric: staged through host buffers -------------------------------------------------- */

/* Neither provider here registers CUDA memory: tcp;ofi_rxm lacks FI_HMEM,
 * and Debian's shm offers FI_HMEM (asked for, since a CUDA driver loads)
 * but refuses fi_mr_regattr(FI_HMEM_CUDA) (built without CUDA). */
struct staged_lines {
  pthread_mutex_t lock;
  int lines;
  char engines[4][64];
  char line[512];
};

static void count_staged_line(const ferry_log_record *r, void *arg) {
  struct staged_lines *c = arg;
  pthread_mutex_lock(&c->lock);
  if (strstr(r->message, "device memory is staged through host buffers")) {
    if (c->lines < 4)
      snprintf(c->engines[c->lines], sizeof c->engines[0], "%s", r->engine);
    c->lines++;
    snprintf(c->line, sizeof c->line, "%s", r->message);
  }
  pthread_mutex_unlock(&c->lock);
}

/* Local device memory to and from the target's host memory over fabric
 * alone, at sizes around the bounce slot: every byte intact at the target
 * and back in device memory, all of it counted as staged and as fabric's,
 * no context left current; each engine said once why it stages. */
static void staged_on(const char *provider, const char *why) {
  struct staged_lines lines = {.lock = PTHREAD_MUTEX_INITIALIZER};
  ferry_log_set_handler(count_staged_line, &lines);
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_FABRIC, provider, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  const size_t sizes[] = {1, SLOT - 1, SLOT, SLOT + 1, 3 * SLOT + 7, HOST_BYTES - 64};
  uint8_t *want = malloc(HOST_BYTES), *got = malloc(HOST_BYTES);
  assert_non_null(want);
  assert_non_null(got);
  uint64_t moved = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t n = sizes[i];
    test_fill_random(want, n, 100 + i);
    cuda_double_put(d.local + 3, want, n);
    uint64_t remote = (uint64_t)(uintptr_t)d.r.memory + 11;
    if (ferry_transfer_sync(d.r.initiator, d.r.name, FERRY_OP_WRITE, d.local + 3, remote, n))
      fail_msg("WRITE of %zu bytes: %s", n, ferry_last_error());
    assert_memory_equal(d.r.memory + 11, want, n); /* landed when the call returned */
    if (ferry_transfer_sync(d.r.initiator, d.r.name, FERRY_OP_READ, d.local + HOST_BYTES + 5,
                            remote, n))
      fail_msg("READ of %zu bytes: %s", n, ferry_last_error());
    cuda_double_get(got, d.local + HOST_BYTES + 5, n);
    assert_memory_equal(got, want, n);
    moved += n;
  }
  uint64_t staged[2];
  staged_bytes(d.r.initiator, staged);
  assert_int_equal(staged[FERRY_OP_WRITE], moved);
  assert_int_equal(staged[FERRY_OP_READ], moved);
  assert_int_equal(test_rig_transport_bytes(&d.r, "fabric"), 2 * moved);
  cuda_double_no_context();
  /* A plan with device memory goes the same way. */
  ferry_region local = {(uint64_t)(uintptr_t)d.local, SLOT};
  ferry_region remote = {(uint64_t)(uintptr_t)d.r.memory, SLOT};
  ferry_plan *plan;
  assert_int_equal(ferry_plan_create(d.r.initiator, d.r.name, &local, 1, &remote, 1, &plan),
                   FERRY_OK);
  int64_t zero = 0;
  assert_int_equal(
      ferry_plan_transfer_sync(d.r.initiator, plan, FERRY_OP_WRITE, &zero, &zero, 1, NULL, 0),
      FERRY_OK);
  ferry_plan_free(plan);
  test_rig_round_trip(&d.r); /* host memory: unstaged, as before */
  device_rig_stop(&d);
  ferry_log_set_handler(NULL, NULL);
  print_message("%d lines: %s\n", lines.lines, lines.line);
  assert_int_equal(lines.lines, 2); /* once per engine, however many transfers */
  assert_string_not_equal(lines.engines[0], lines.engines[1]);
  if (!strstr(lines.line, why))
    fail_msg("line \"%s\" lacks \"%s\"", lines.line, why);
  free(want);
  free(got);
}

static void fabric_tcp_stages_device(void **state) {
  staged_on("tcp;ofi_rxm", "fabric provider tcp;ofi_rxm lacks FI_HMEM");
}

static void fabric_shm_stages_device(void **state) {
  staged_on("shm", "fabric provider shm cannot register CUDA memory");
}

/* One batch of many entries, local device and host memory alternating,
 * into the target's host memory over fabric alone: chunks with device
 * memory go through the pipeline, those without straight from their
 * registration; then read back into both kinds. */
static void fabric_many_entries_mixed(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_FABRIC, "tcp;ofi_rxm", FERRY_STAGING_AUTO,
                   FERRY_STAGING_AUTO);
  static ferry_entry write[N], read[N];
  uint8_t *want = mixed_fill(&d, 43);
  for (size_t i = 0; i < N; i++) {
    uint64_t remote = (uint64_t)(uintptr_t)d.r.memory + i * PIECE + 1;
    write[i] =
        (ferry_entry){FERRY_OP_WRITE, mixed_local(&d, i, runs_of_three(i), 0), remote, PIECE};
    read[i] = (ferry_entry){FERRY_OP_READ, mixed_local(&d, i, runs_of_three(i), 1), remote, PIECE};
  }
  if (ferry_transfer_sync_batch(d.r.initiator, d.r.name, write, N, NULL))
    fail_msg("%s", ferry_last_error());
  assert_memory_equal(d.r.memory + 1, want, N * PIECE);
  if (ferry_transfer_sync_batch(d.r.initiator, d.r.name, read, N, NULL))
    fail_msg("%s", ferry_last_error());
  mixed_check(&d, want, runs_of_three);
  assert_int_equal(test_rig_transport_bytes(&d.r, "fabric"), 2 * N * PIECE);
  cuda_double_no_context();
  device_rig_stop(&d);
}

/* FERRY_STAGING=always: host memory through fabric's staged path too,
 * intact, every byte counted as staged. */
static void fabric_always_stages_host(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_FABRIC, "tcp;ofi_rxm", FERRY_STAGING_AUTO,
                   FERRY_STAGING_ALWAYS);
  test_rig_round_trip(&d.r);
  uint64_t staged[2];
  staged_bytes(d.r.initiator, staged);
  assert_int_equal(staged[FERRY_OP_WRITE], HOST_BYTES);
  assert_int_equal(staged[FERRY_OP_READ], HOST_BYTES);
  assert_int_equal(test_rig_transport_bytes(&d.r, "fabric"), 2 * HOST_BYTES);
  device_rig_stop(&d);
}

/* Device memory at the target, over fabric alone: the target left it
 * unregistered with its provider (its key in the table is zeros), so the
 * initiator refuses the batch before anything is sent, with FERRY_EFAULT
 * naming the range, the peer and why; host memory here or device memory
 * here alike. Both engines serve the next transfer. */
static void remote_device_refused_on(const char *provider) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_FABRIC, provider, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  test_rig_round_trip(&d.r);
  uint64_t before = test_rig_transport_bytes(&d.r, "fabric");
  uint8_t *locals[] = {d.r.out, d.local};
  for (int op = FERRY_OP_READ; op <= FERRY_OP_WRITE; op++)
    for (int l = 0; l < 2; l++) {
      ferry_entry entries[2] = {
          {(ferry_op)op, d.r.in, (uint64_t)(uintptr_t)d.r.memory, SLOT}, /* fine alone */
          {(ferry_op)op, locals[l], remote_of(&d, 64), 2 * SLOT}};
      assert_int_equal(ferry_transfer_sync_batch(d.r.initiator, d.r.name, entries, 2, NULL),
                       FERRY_EFAULT);
      char range[160];
      snprintf(range, sizeof range, "entry 1 to %s: remote address 0x%llx (+%llu bytes)", d.r.name,
               (unsigned long long)remote_of(&d, 64), 2 * SLOT);
      assert_detail_has(range);
      assert_detail_has("did not register with its fabric transport");
      assert_detail_has("enable tcp toward");
    }
  assert_int_equal(test_rig_transport_bytes(&d.r, "fabric"), before); /* nothing was sent */
  test_rig_round_trip(&d.r);
  device_rig_stop(&d);
}

static void fabric_tcp_remote_device(void **state) { remote_device_refused_on("tcp;ofi_rxm"); }
static void fabric_shm_remote_device(void **state) { remote_device_refused_on("shm"); }

/* ---- fabric: moved over tcp beside it ------------------------------------------------- */

/* With tcp usable beside the preferred transport, device memory goes
 * over tcp (staged), host memory still over the preferred one. */
static void moved_over_tcp_beside(unsigned other, const char *provider, const char *name) {
  device_rig d;
  unsigned transports = other | FERRY_TRANSPORT_TCP;
  device_rig_start(&d, transports, provider, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  test_rig_round_trip(&d.r);
  uint64_t host_bytes = 2 * HOST_BYTES;
  assert_int_equal(test_rig_transport_bytes(&d.r, name), host_bytes);
  device_round_trip(&d, 0, 3 * SLOT + 5, 7);
  assert_int_equal(test_rig_transport_bytes(&d.r, "tcp"), 2 * (3 * SLOT + 5));
  assert_int_equal(test_rig_transport_bytes(&d.r, name), host_bytes);
  test_rig_round_trip(&d.r);
  assert_int_equal(test_rig_transport_bytes(&d.r, name), 2 * host_bytes);
  cuda_double_no_context();
  device_rig_stop(&d);
}

/* fabric with tcp beside: device memory at the target goes over tcp
 * (staged at both ends), host memory over fabric. */
static void fabric_with_tcp_stages_over_tcp(void **state) {
  moved_over_tcp_beside(FERRY_TRANSPORT_FABRIC, "tcp;ofi_rxm", "fabric");
}

static void fabric_shm_with_tcp_stages_over_tcp(void **state) {
  moved_over_tcp_beside(FERRY_TRANSPORT_FABRIC, "shm", "fabric");
}

/* ---- shm: device memory, target in this process ------------------------------------- */

/* Device memory on both ends over shm (the target's device addresses are
 * this process's own: no import), 1 B to 1 MiB at odd offsets, every byte
 * counted on shm and none staged; no context left current. */
static void shm_device_both_ends(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_SHM, NULL, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  const size_t sizes[] = {1, 4095, 64 * KiB + 3, SLOT + 1, DEVICE_BYTES / 2 - 8};
  uint64_t moved = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    device_round_trip(&d, i * 3, sizes[i], i + 11);
    moved += sizes[i];
  }
  assert_int_equal(test_rig_transport_bytes(&d.r, "shm"), 2 * moved);
  uint64_t staged[2];
  staged_bytes(d.r.initiator, staged);
  assert_int_equal(staged[FERRY_OP_WRITE] + staged[FERRY_OP_READ], 0);
  cuda_double_no_context();
  device_rig_stop(&d);
}

/* Host and device memory mixed on both ends in one batch, the target's
 * host memory mapped (one copy) or reached with CMA (through a bounce). */
static void shm_many_entries_mapped(void **state) { many_entries_mixed(FERRY_TRANSPORT_SHM, 1); }
static void shm_many_entries_cma(void **state) { many_entries_mixed(FERRY_TRANSPORT_SHM, 0); }

/* Host memory here, device memory at the target: WRITE and READ land. */
static void shm_remote_device(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_SHM, NULL, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  test_fill_random(d.r.out, 2 * SLOT, 5);
  if (ferry_transfer_sync(d.r.initiator, d.r.name, FERRY_OP_WRITE, d.r.out, remote_of(&d, 64),
                          2 * SLOT) ||
      ferry_transfer_sync(d.r.initiator, d.r.name, FERRY_OP_READ, d.r.in, remote_of(&d, 64),
                          2 * SLOT))
    fail_msg("%s", ferry_last_error());
  assert_memory_equal(d.r.in, d.r.out, 2 * SLOT);
  uint8_t *got = malloc(2 * SLOT);
  cuda_double_get(got, d.remote + 64, 2 * SLOT);
  assert_memory_equal(got, d.r.out, 2 * SLOT);
  free(got);
  cuda_double_no_context();
  device_rig_stop(&d);
}

/* FERRY_STAGING=never on both: shm stages nothing, so it still carries
 * device memory (tcp beside it would not). */
static void shm_device_under_staging_never(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_SHM | FERRY_TRANSPORT_TCP, NULL, FERRY_STAGING_NEVER,
                   FERRY_STAGING_NEVER);
  device_round_trip(&d, 5, SLOT + 9, 21);
  assert_int_equal(test_rig_transport_bytes(&d.r, "shm"), 2 * (SLOT + 9));
  device_rig_stop(&d);
}

/* With tcp beside shm, device memory now stays on shm too. */
static void shm_with_tcp_keeps_shm(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_SHM | FERRY_TRANSPORT_TCP, NULL, FERRY_STAGING_AUTO,
                   FERRY_STAGING_AUTO);
  device_round_trip(&d, 0, 3 * SLOT + 5, 7);
  assert_int_equal(test_rig_transport_bytes(&d.r, "shm"), 2 * (3 * SLOT + 5));
  assert_int_equal(test_rig_transport_bytes(&d.r, "tcp"), 0);
  device_rig_stop(&d);
}

typedef struct unregister_call {
  ferry_engine *engine;
  void *addr;
} unregister_call;

static void unregister_call_run(void *arg) {
  unregister_call *u = arg;
  ferry_memory_unregister(u->engine, u->addr);
}

/* A WRITE into the target's device memory held in flight (its source's
 * second half stalls the copy): the target's unregister does not return
 * until the copy ended, and the bytes landed whole. */
static void shm_unregister_waits_for_device_copy(void **state) {
  cuda_double_need();
  page_stall src;
  if (page_stall_create(&src, DEVICE_BYTES, DEVICE_BYTES / 2, 0x77) != 0) {
    print_message("no userfaultfd here: cannot hold a copy in flight\n");
    skip();
  }
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_SHM, NULL, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  assert_int_equal(ferry_memory_register(d.r.initiator, src.base, src.size), FERRY_OK);
  ferry_entry entry = {FERRY_OP_WRITE, src.base, remote_of(&d, 0), src.size};
  ferry_batch *b;
  assert_int_equal(ferry_batch_submit(d.r.initiator, d.r.name, &entry, 1, NULL, &b), FERRY_OK);
  assert_int_equal(page_stall_wait(&src, 10000), 0); /* the device copy runs, and is stuck */
  unregister_call u = {d.r.target, d.remote};
  int early = page_stall_returns_early(&src, 0x77, unregister_call_run, &u);
  assert_int_not_equal(early, -1);
  ferry_status st = ferry_batch_wait(b, -1);
  ferry_batch_free(b);
  print_message("unregister returned %s the stalled device copy ended; batch: %s\n",
                early ? "BEFORE" : "after", st ? ferry_last_error() : "completed");
  assert_false(early);
  assert_int_equal(st, FERRY_OK);
  uint8_t *got = malloc(src.size);
  cuda_double_get(got, d.remote, src.size);
  assert_memory_equal(got, src.base, src.size);
  free(got);
  device_rig_stop(&d);
  page_stall_destroy(&src);
}

/* ---- shm: device memory, target in a child process (imports) ---------------------------- */

#define CHILD_ALLOC (20 * 1024 * KiB) /* the child's device allocation */
#define R1_AT (4 * KiB)               /* its two regions inside it */
#define R2_AT (9 * 1024 * KiB)
#define R_LEN (8 * 1024 * KiB + 64)
#define VMM_BYTES (8 * 1024 * KiB)
#define NOEXPORT_BYTES (64 * KiB)

static int child_register(ferry_engine *e, uint8_t *base) {
  return ferry_memory_register_at(e, base + R1_AT, R_LEN, "cuda:0") ||
         ferry_memory_register_at(e, base + R2_AT, R_LEN, "cuda:0");
}

/* One command from the parent: put/check ADDR LEN SEED (device memory or
 * the child's host buffer), unreg ADDR (answered once unregister returned),
 * or rereg (free, allocate at the same address, register the regions
 * again). */
static int child_command(ferry_engine *e, char *line, uint8_t **a, uint8_t *host) {
  unsigned long long addr = 0, len = 0, seed = 0;
  char verb[16] = "";
  sscanf(line, "%15s %llx %llu %llu", verb, &addr, &len, &seed);
  uint8_t *p = (uint8_t *)(uintptr_t)addr;
  int on_host = p >= host && p < host + HOST_BYTES;
  if (!strcmp(verb, "unreg"))
    return ferry_memory_unregister(e, p) ? -1 : 0;
  if (!strcmp(verb, "rereg")) {
    if (ferry_memory_unregister(e, *a + R1_AT) || ferry_memory_unregister(e, *a + R2_AT) ||
        cuda_double_try_free(*a) || cuda_double_try_alloc(a, CHILD_ALLOC, CUDA_DOUBLE_AT) ||
        child_register(e, *a))
      return -1;
    printf("%llx\n", (unsigned long long)(uintptr_t)*a);
    return 1;
  }
  uint8_t *want = malloc(len), *got = malloc(len);
  int bad = !want || !got;
  if (!bad)
    test_fill_random(want, len, seed);
  if (!bad && !strcmp(verb, "put")) {
    if (on_host)
      memcpy(p, want, len);
    else
      bad = cuda_double_try_put(p, want, len) != 0;
  } else if (!bad && !strcmp(verb, "check")) {
    if (on_host)
      memcpy(got, p, len);
    else
      bad = cuda_double_try_get(got, p, len) != 0;
    bad = bad || memcmp(got, want, len) != 0;
  } else {
    bad = 1;
  }
  free(want);
  free(got);
  return bad ? -1 : 0;
}

/* The child: an shm-only engine with a device allocation holding two
 * registered regions, a VMM allocation (registered whole), one the driver
 * will not export and a host buffer; says "PORT ALLOC HOST VMM NOEXPORT"
 * and serves commands (a line each, answered "ok",
 * "bad" or, for rereg, the new allocation) until its stdin closes. */
static int device_target(int argc, char **argv) {
  (void)argc, (void)argv;
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!cuda_double_load())
    return 2;
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_SHM;
  cfg.timeout_ms = TEST_SETUP_MS;
  ferry_engine *e = NULL;
  uint8_t *a = NULL, *vmm = NULL, *noexport = NULL;
  void *host = NULL;
  if (ferry_engine_create(&cfg, &e) || cuda_double_try_alloc(&a, CHILD_ALLOC, CUDA_DOUBLE_PLAIN) ||
      cuda_double_try_alloc(&vmm, VMM_BYTES, CUDA_DOUBLE_VMM) ||
      cuda_double_try_alloc(&noexport, NOEXPORT_BYTES, CUDA_DOUBLE_VMM_NOEXPORT) ||
      child_register(e, a) || ferry_memory_register_at(e, vmm, VMM_BYTES, "cuda:0") ||
      ferry_memory_register_at(e, noexport, NOEXPORT_BYTES, "cuda:0") ||
      ferry_memory_alloc(e, HOST_BYTES, &host))
    return 3;
  printf("%u %llx %llx %llx %llx\n", ferry_engine_port(e), (unsigned long long)(uintptr_t)a,
         (unsigned long long)(uintptr_t)host, (unsigned long long)(uintptr_t)vmm,
         (unsigned long long)(uintptr_t)noexport);
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    int rc = child_command(e, line, &a, host);
    if (rc <= 0)
      printf("%s\n", rc ? "bad" : "ok");
  }
  ferry_engine_destroy(e);
  return 0;
}

typedef struct child_target {
  pid_t pid;
  int to, from;
  char name[64];
  uint64_t alloc, host, vmm, noexport;
  ferry_engine *initiator;
  uint8_t *local;    /* device memory here, DEVICE_BYTES * 5 */
  uint8_t *out, *in; /* host memory here */
} child_target;

#define LOCAL_BYTES (10 * 1024 * KiB)

static void child_start(child_target *c) {
  cuda_double_need();
  memset(c, 0, sizeof *c);
  c->pid = test_child_start("device-target", NULL, &c->to, &c->from);
  assert_true(c->pid > 0);
  char line[256];
  unsigned port = 0;
  if (test_read_line(c->from, line, sizeof line, TEST_SETUP_MS) != 0 ||
      sscanf(line, "%u %" SCNx64 " %" SCNx64 " %" SCNx64 " %" SCNx64, &port, &c->alloc, &c->host,
             &c->vmm, &c->noexport) != 5)
    fail_msg("the child target did not start");
  snprintf(c->name, sizeof c->name, "127.0.0.1:%u", port);
  c->initiator = engine_with(FERRY_TRANSPORT_SHM, FERRY_STAGING_AUTO, NULL);
  c->local = cuda_double_alloc(LOCAL_BYTES);
  c->out = malloc(LOCAL_BYTES);
  c->in = malloc(LOCAL_BYTES);
  assert_true(c->out && c->in);
  assert_int_equal(ferry_memory_register_at(c->initiator, c->local, LOCAL_BYTES, "cuda:0"),
                   FERRY_OK);
  assert_int_equal(ferry_memory_register(c->initiator, c->out, LOCAL_BYTES), FERRY_OK);
  assert_int_equal(ferry_memory_register(c->initiator, c->in, LOCAL_BYTES), FERRY_OK);
}

static void child_stop(child_target *c) {
  ferry_engine_destroy(c->initiator);
  close(c->to); /* the child destroys its engine and exits */
  int status = -1;
  assert_int_equal(test_wait_exit(c->pid, TEST_SETUP_MS, &status), 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("the device target exited with status 0x%x", status);
  close(c->from);
  cuda_double_free(c->local);
  free(c->out);
  free(c->in);
}

/* A command to the child; its answer in reply. */
static void child_ask(child_target *c, char *reply, size_t size, const char *fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  line[n++] = '\n';
  assert_int_equal(write(c->to, line, (size_t)n), n);
  if (test_read_line(c->from, reply, size, TEST_SETUP_MS) != 0)
    fail_msg("the child target did not answer \"%.*s\"", n - 1, line);
}

/* The child's bytes at addr are those of seed. */
static void child_check(child_target *c, uint64_t addr, size_t len, uint64_t seed) {
  char reply[64];
  child_ask(c, reply, sizeof reply, "check %" PRIx64 " %zu %" PRIu64, addr, len, seed);
  if (strcmp(reply, "ok"))
    fail_msg("the child's %zu bytes at 0x%" PRIx64 " are not what was written", len, addr);
}

static void child_put(child_target *c, uint64_t addr, size_t len, uint64_t seed) {
  char reply[64];
  child_ask(c, reply, sizeof reply, "put %" PRIx64 " %zu %" PRIu64, addr, len, seed);
  assert_string_equal(reply, "ok");
}

static void transfer(child_target *c, ferry_op op, void *local, uint64_t remote, size_t len) {
  if (ferry_transfer_sync(c->initiator, c->name, op, local, remote, len))
    fail_msg("%s of %zu bytes: %s", op == FERRY_OP_WRITE ? "WRITE" : "READ", len,
             ferry_last_error());
}

/* WRITE local (device or host) memory filled from seed into the child at
 * remote, and READ what the child put at remote2 back: both intact. */
static void child_both_ways(child_target *c, uint8_t *local, int local_device, uint64_t remote,
                            uint64_t remote2, size_t len, uint64_t seed) {
  uint8_t *want = malloc(len), *got = malloc(len);
  assert_true(want && got);
  test_fill_random(want, len, seed);
  if (local_device)
    cuda_double_put(local, want, len);
  else
    memcpy(local, want, len);
  transfer(c, FERRY_OP_WRITE, local, remote, len);
  child_check(c, remote, len, seed);
  child_put(c, remote2, len, seed + 1000);
  transfer(c, FERRY_OP_READ, local, remote2, len);
  test_fill_random(want, len, seed + 1000);
  if (local_device)
    cuda_double_get(got, local, len);
  else
    memcpy(got, local, len);
  assert_memory_equal(got, want, len);
  free(want);
  free(got);
}

/* Device to device both ways, 1 B to 8 MiB at offsets inside both regions
 * of one allocation; host here to device there and back; device here to
 * the child's mapped host buffer and back. One import for it all. */
static void shm_import_both_ways(void **state) {
  child_target c;
  child_start(&c);
  unsigned opens = cuda_double_ipc_opens();
  const size_t sizes[] = {1, 4097, 1024 * KiB + 3, 8 * 1024 * KiB};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    uint64_t r1 = c.alloc + R1_AT + 13 + i, r2 = c.alloc + R2_AT + 5 * i;
    child_both_ways(&c, c.local + 7 * i, 1, r1, r2, sizes[i], 100 + i);
    child_both_ways(&c, c.out + i, 0, r2, r1, sizes[i], 200 + i);
  }
  child_both_ways(&c, c.local + 3, 1, c.host + 11, c.host + 4096, 64 * KiB + 1, 300);
  assert_int_equal(cuda_double_ipc_opens() - opens, 1); /* one allocation: one open */
  assert_int_equal(cuda_double_ipc_imports(), 1);
  cuda_double_no_context();
  child_stop(&c);
  assert_int_equal(cuda_double_ipc_imports(), 0); /* closed with the link */
}

/* The child frees its allocation and registers new memory at the same
 * address (as a caching allocator may): a WRITE lands in the new memory,
 * never through the old import, which is closed. */
static void shm_import_after_reregister(void **state) {
  child_target c;
  child_start(&c);
  unsigned opens = cuda_double_ipc_opens();
  child_both_ways(&c, c.local, 1, c.alloc + R1_AT, c.alloc + R2_AT, 64 * KiB, 1);
  char reply[64];
  child_ask(&c, reply, sizeof reply, "rereg");
  uint64_t fresh = strtoull(reply, NULL, 16);
  assert_true(fresh != 0);
  assert_true(fresh == c.alloc);
  child_both_ways(&c, c.local, 1, c.alloc + R1_AT, c.alloc + R2_AT, 64 * KiB, 2);
  assert_int_equal(cuda_double_ipc_opens() - opens, 2);
  assert_int_equal(cuda_double_ipc_imports(), 1); /* the stale one closed */
  child_stop(&c);
}

/* A WRITE through the import of the child's region (a plain allocation's,
 * or its VMM allocation's) held in flight (its source's second half
 * stalls the device copy): the child's unregister of the region does not
 * return (no answer) until the copy ended; then it does. */
static void import_unregister_waits(int vmm) {
  cuda_double_need();
  page_stall src;
  if (page_stall_create(&src, 2 * 1024 * KiB, 1024 * KiB, 0x5a) != 0) {
    print_message("no userfaultfd here: cannot hold a copy in flight\n");
    skip();
  }
  child_target c;
  child_start(&c);
  assert_int_equal(ferry_memory_register(c.initiator, src.base, src.size), FERRY_OK);
  uint64_t region = vmm ? c.vmm : c.alloc + R1_AT;
  ferry_entry entry = {FERRY_OP_WRITE, src.base, region, src.size};
  ferry_batch *b;
  assert_int_equal(ferry_batch_submit(c.initiator, c.name, &entry, 1, NULL, &b), FERRY_OK);
  assert_int_equal(page_stall_wait(&src, 10000), 0); /* the device copy runs, and is stuck */
  char line[64];
  int n = snprintf(line, sizeof line, "unreg %" PRIx64 "\n", region);
  assert_int_equal(write(c.to, line, (size_t)n), n);
  /* A fence cannot answer now; give a broken one time to show it. */
  int early = test_read_line(c.from, line, sizeof line, 200) == 0;
  assert_int_equal(page_stall_release(&src, 0x5a), 0);
  if (!early && test_read_line(c.from, line, sizeof line, TEST_SETUP_MS) != 0)
    fail_msg("the child's unregister did not return after the copy ended");
  ferry_status st = ferry_batch_wait(b, -1);
  ferry_batch_free(b);
  print_message("the child's unregister returned %s the stalled copy ended; batch: %s\n",
                early ? "BEFORE" : "after", st ? ferry_last_error() : "completed");
  assert_false(early);
  assert_string_equal(line, "ok");
  assert_int_equal(st, FERRY_OK);
  child_stop(&c);
  page_stall_destroy(&src);
}

static void shm_import_unregister_waits(void **state) { import_unregister_waits(0); }

static void shm_import_vmm_unregister_waits(void **state) { import_unregister_waits(1); }

/* A VMM allocation travels as a POSIX fd: device to device and host here
 * to it, both ways, 1 B to 4 MiB at offsets; one import for it all (an
 * imported handle and its mapping), closed with the link. */
static void shm_import_vmm_both_ways(void **state) {
  child_target c;
  child_start(&c);
  unsigned opens = cuda_double_vmm_opens(), ipc = cuda_double_ipc_opens();
  const size_t sizes[] = {1, 4097, 1024 * KiB + 3, 4 * 1024 * KiB - 64};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    uint64_t r1 = c.vmm + 13 + i, r2 = c.vmm + 4 * 1024 * KiB + 5 * i;
    child_both_ways(&c, c.local + 7 * i, 1, r1, r2, sizes[i], 400 + i);
    child_both_ways(&c, c.out + i, 0, r2, r1, sizes[i], 500 + i);
  }
  assert_int_equal(cuda_double_vmm_opens() - opens, 1); /* one allocation: one import */
  assert_int_equal(cuda_double_vmm_imports(), 2);       /* its handle and its mapping */
  assert_int_equal(cuda_double_ipc_opens() - ipc, 0);   /* no IPC handle for it */
  cuda_double_no_context();
  child_stop(&c);
  assert_int_equal(cuda_double_vmm_imports(), 0); /* unmapped and released with the link */
}

/* A VMM allocation the driver will not export as a POSIX fd: refused,
 * with the driver's answer; the link goes on. */
static void shm_import_vmm_refused(void **state) {
  child_target c;
  child_start(&c);
  assert_int_equal(
      ferry_transfer_sync(c.initiator, c.name, FERRY_OP_WRITE, c.local, c.noexport + 64, 4096),
      FERRY_ENOTIMPL);
  assert_detail_has("is a CUDA VMM allocation");
  assert_detail_has("CUDA_ERROR_NOT_SUPPORTED");
  child_both_ways(&c, c.local, 1, c.alloc + R1_AT, c.alloc + R2_AT, 4096, 3); /* the link works */
  child_stop(&c);
}

int main(int argc, char **argv) {
  static const test_child_role roles[] = {{"device-target", device_target}};
  test_child_main(argc, argv, roles, sizeof roles / sizeof *roles);
  const char *filter = getenv("FERRY_TEST_FILTER"); /* one case, by name (a glob) */
  if (filter && *filter)
    cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(tcp_device_both_ends),
      cmocka_unit_test(tcp_many_entries_mixed),
      cmocka_unit_test(never_refused_at_initiator),
      cmocka_unit_test(never_refused_at_target),
      cmocka_unit_test(shm_device_both_ends),
      cmocka_unit_test(shm_many_entries_mapped),
      cmocka_unit_test(shm_many_entries_cma),
      cmocka_unit_test(shm_with_tcp_keeps_shm),
      cmocka_unit_test(shm_device_under_staging_never),
      cmocka_unit_test(shm_unregister_waits_for_device_copy),
      cmocka_unit_test(shm_import_both_ways),
      cmocka_unit_test(shm_import_after_reregister),
      cmocka_unit_test(shm_import_unregister_waits),
      cmocka_unit_test(shm_import_vmm_both_ways),
      cmocka_unit_test(shm_import_vmm_unregister_waits),
      cmocka_unit_test(shm_import_vmm_refused),
      cmocka_unit_test(shm_remote_device),
      cmocka_unit_test(fabric_tcp_stages_device),
      cmocka_unit_test(fabric_shm_stages_device),
      cmocka_unit_test(fabric_many_entries_mixed),
      cmocka_unit_test(fabric_always_stages_host),
      cmocka_unit_test(fabric_never_refused_at_initiator),
      cmocka_unit_test(fabric_with_tcp_stages_over_tcp),
      cmocka_unit_test(fabric_shm_with_tcp_stages_over_tcp),
      cmocka_unit_test(fabric_tcp_remote_device),
      cmocka_unit_test(fabric_shm_remote_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
