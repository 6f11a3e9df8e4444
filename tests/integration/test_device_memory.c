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
 *  - shm and fabric cannot carry device memory yet: a batch with local
 *    device memory is refused before any transport sees it (FERRY_EFAULT
 *    naming the buffer, "cuda:0" and the transport), plans included; with
 *    tcp usable beside them, the batch goes over tcp instead.
 *  - device memory at the target, over shm or fabric: the peer's region
 *    table does not say where a region lives, so only the target's side
 *    can refuse: it does, and neither side crashes (fabric's initiator did,
 *    on libfabric 1.17 shm's error completion that names no operation).
 *
 * Both engines live in this process, on 127.0.0.1. */
#include <dlfcn.h>
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
#include "rig.h"

#define KiB 1024ull
#define SLOT (256 * KiB) /* the staging pipeline's slot (memory/staging.h) */
#define DEVICE_BYTES (2 * 1024 * KiB)
#define HOST_BYTES (1024 * KiB)

/* ---- the driver, as CUDA code holds device memory --------------------------------- */

typedef unsigned long long devptr;
static struct {
  int (*Init)(unsigned);
  int (*DeviceGet)(int *, int);
  int (*PrimaryCtxRetain)(void **, int);
  int (*CtxPush)(void *);
  int (*CtxPop)(void **);
  int (*CtxGetCurrent)(void **);
  int (*MemAlloc)(devptr *, size_t);
  int (*MemFree)(devptr);
  int (*HtoD)(devptr, const void *, size_t);
  int (*DtoH)(void *, devptr, size_t);
  void *ctx;
} cu;

static int load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib || !dlsym(lib, "cuMemAlloc_v2"))
    return 0;
  *(void **)&cu.Init = dlsym(lib, "cuInit");
  *(void **)&cu.DeviceGet = dlsym(lib, "cuDeviceGet");
  *(void **)&cu.PrimaryCtxRetain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&cu.CtxPush = dlsym(lib, "cuCtxPushCurrent_v2");
  *(void **)&cu.CtxPop = dlsym(lib, "cuCtxPopCurrent_v2");
  *(void **)&cu.CtxGetCurrent = dlsym(lib, "cuCtxGetCurrent");
  *(void **)&cu.MemAlloc = dlsym(lib, "cuMemAlloc_v2");
  *(void **)&cu.MemFree = dlsym(lib, "cuMemFree_v2");
  *(void **)&cu.HtoD = dlsym(lib, "cuMemcpyHtoD_v2");
  *(void **)&cu.DtoH = dlsym(lib, "cuMemcpyDtoH_v2");
  int device;
  return !cu.Init(0) && !cu.DeviceGet(&device, 0) && !cu.PrimaryCtxRetain(&cu.ctx, device);
}

/* Skips the test (shown as skipped) without the fake driver. */
static void need_driver(void) {
  static int loaded = -1;
  if (loaded < 0)
    loaded = load_driver();
  char why[256] = "";
  if (!loaded || !ferry_memory_cuda_available(why, sizeof why)) {
    print_message("no fake CUDA driver: LD_LIBRARY_PATH must name build/tests/fake_cuda (%s)\n",
                  why);
    skip();
  }
}

static uint8_t *device_alloc(size_t size) {
  devptr p = 0;
  assert_int_equal(cu.CtxPush(cu.ctx), 0);
  assert_int_equal(cu.MemAlloc(&p, size), 0);
  assert_int_equal(cu.CtxPop(NULL), 0);
  return (uint8_t *)(uintptr_t)p;
}

static void device_free(uint8_t *p) {
  assert_int_equal(cu.CtxPush(cu.ctx), 0);
  assert_int_equal(cu.MemFree((devptr)(uintptr_t)p), 0);
  assert_int_equal(cu.CtxPop(NULL), 0);
}

static void device_put(uint8_t *dev, const void *host, size_t size) {
  assert_int_equal(cu.CtxPush(cu.ctx), 0);
  assert_int_equal(cu.HtoD((devptr)(uintptr_t)dev, host, size), 0);
  assert_int_equal(cu.CtxPop(NULL), 0);
}

static void device_get(void *host, const uint8_t *dev, size_t size) {
  assert_int_equal(cu.CtxPush(cu.ctx), 0);
  assert_int_equal(cu.DtoH(host, (devptr)(uintptr_t)dev, size), 0);
  assert_int_equal(cu.CtxPop(NULL), 0);
}

/* ferry leaves no context current on the application's thread. */
static void assert_no_context(void) {
  void *current = (void *)1;
  assert_int_equal(cu.CtxGetCurrent(&current), 0);
  assert_null(current);
}

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
  need_driver();
  ferry_engine *target = engine_with(transports, target_staging, provider);
  ferry_engine *initiator = engine_with(transports, initiator_staging, provider);
  test_rig_start(&d->r, target, initiator, HOST_BYTES);
  d->remote = device_alloc(DEVICE_BYTES);
  d->local = device_alloc(DEVICE_BYTES);
  assert_int_equal(ferry_memory_register_at(target, d->remote, DEVICE_BYTES, "cuda:0"), FERRY_OK);
  assert_int_equal(ferry_memory_register_at(initiator, d->local, DEVICE_BYTES, "cuda"), FERRY_OK);
}

static void device_rig_stop(device_rig *d) {
  test_rig_stop(&d->r); /* the engines first: nothing touches the memory after */
  device_free(d->remote);
  device_free(d->local);
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
  device_put(d->local + offset, want, size);
  ferry_engine *e = d->r.initiator;
  if (ferry_transfer_sync(e, d->r.name, FERRY_OP_WRITE, d->local + offset, remote_of(d, offset + 7),
                          size) ||
      ferry_transfer_sync(e, d->r.name, FERRY_OP_READ, d->local + offset + size,
                          remote_of(d, offset + 7), size))
    fail_msg("%zu bytes: %s", size, ferry_last_error());
  device_get(got, d->local + offset + size, size);
  assert_memory_equal(got, want, size);
  device_get(got, d->remote + offset + 7, size);
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
  assert_no_context();
  device_rig_stop(&d);
}

/* One batch of many entries, device and host memory alternating on both
 * ends, each range through its own kind's copier; then read back. */
static void tcp_many_entries_mixed(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_TCP, NULL, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  enum { N = 200, PIECE = 4099 };
  static ferry_entry write[N], read[N];
  uint8_t *want = malloc(N * PIECE), *got = malloc(N * PIECE);
  assert_non_null(want);
  assert_non_null(got);
  test_fill_random(want, N * PIECE, 42);
  device_put(d.local, want, N * PIECE);
  memcpy(d.r.out, want, N * PIECE);
  uint64_t remote_host = (uint64_t)(uintptr_t)d.r.memory;
  for (size_t i = 0; i < N; i++) {
    size_t at = i * PIECE;
    int device_here = i % 2, device_there = i % 3 != 0;
    uint8_t *local = device_here ? d.local + at : d.r.out + at;
    uint64_t remote = device_there ? remote_of(&d, at + 1) : remote_host + at + 1;
    write[i] = (ferry_entry){FERRY_OP_WRITE, local, remote, PIECE};
    read[i] = (ferry_entry){
        FERRY_OP_READ, device_here ? d.local + DEVICE_BYTES / 2 + at : d.r.in + at, remote, PIECE};
  }
  if (ferry_transfer_sync_batch(d.r.initiator, d.r.name, write, N, NULL) ||
      ferry_transfer_sync_batch(d.r.initiator, d.r.name, read, N, NULL))
    fail_msg("%s", ferry_last_error());
  for (size_t i = 0; i < N; i++) {
    if (i % 2)
      device_get(got + i * PIECE, d.local + DEVICE_BYTES / 2 + i * PIECE, PIECE);
    else
      memcpy(got + i * PIECE, d.r.in + i * PIECE, PIECE);
  }
  assert_memory_equal(got, want, N * PIECE);
  assert_no_context();
  free(want);
  free(got);
  device_rig_stop(&d);
}

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

/* ---- shm: refused, or moved over tcp ---------------------------------------------------- */

/* A batch and a plan with local device memory toward a peer reached only
 * by `transport`: refused with its name, before the memory is touched. */
static void refused_on(unsigned transports, const char *provider, const char *name) {
  device_rig d;
  device_rig_start(&d, transports, provider, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  test_rig_round_trip(&d.r); /* host memory: the transport works */
  char expected[160];
  snprintf(expected, sizeof expected, "is cuda:0 memory, which the %s transport cannot carry yet",
           name);
  for (int op = FERRY_OP_READ; op <= FERRY_OP_WRITE; op++) {
    assert_int_equal(ferry_transfer_sync(d.r.initiator, d.r.name, (ferry_op)op, d.local + SLOT,
                                         (uint64_t)(uintptr_t)d.r.memory, 2 * SLOT),
                     FERRY_EFAULT);
    assert_detail_has(expected);
    char buffer[64];
    snprintf(buffer, sizeof buffer, "local buffer %p (+%llu bytes)", (void *)(d.local + SLOT),
             2 * SLOT);
    assert_detail_has(buffer);
  }
  ferry_region local = {(uint64_t)(uintptr_t)d.local, SLOT};
  ferry_region remote = {(uint64_t)(uintptr_t)d.r.memory, SLOT};
  ferry_plan *plan;
  assert_int_equal(ferry_plan_create(d.r.initiator, d.r.name, &local, 1, &remote, 1, &plan),
                   FERRY_OK);
  int64_t zero = 0;
  assert_int_equal(
      ferry_plan_transfer_sync(d.r.initiator, plan, FERRY_OP_WRITE, &zero, &zero, 1, NULL, 0),
      FERRY_EFAULT);
  assert_detail_has(expected);
  ferry_plan_free(plan);
  test_rig_round_trip(&d.r);
  device_rig_stop(&d);
}

static void shm_refuses_device(void **state) { refused_on(FERRY_TRANSPORT_SHM, NULL, "shm"); }

/* Host memory here, device memory at the target, over shm: the peer's
 * region table does not say where a region lives, so the initiator cannot
 * refuse it beforehand; the target's side refuses it (the kernel's EFAULT
 * to process_vm_*), nothing crashes on either side, and both engines
 * serve the next transfer. */
static void shm_remote_device(void **state) {
  device_rig d;
  device_rig_start(&d, FERRY_TRANSPORT_SHM, NULL, FERRY_STAGING_AUTO, FERRY_STAGING_AUTO);
  test_rig_round_trip(&d.r);
  for (int op = FERRY_OP_READ; op <= FERRY_OP_WRITE; op++) {
    ferry_status st = ferry_transfer_sync(d.r.initiator, d.r.name, (ferry_op)op, d.r.out,
                                          remote_of(&d, 64), 2 * SLOT);
    print_message("%s: %s\n", op == FERRY_OP_READ ? "READ" : "WRITE", ferry_last_error());
    assert_int_not_equal(st, FERRY_OK);
  }
  test_rig_round_trip(&d.r);
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
    device_put(d.local + 3, want, n);
    uint64_t remote = (uint64_t)(uintptr_t)d.r.memory + 11;
    if (ferry_transfer_sync(d.r.initiator, d.r.name, FERRY_OP_WRITE, d.local + 3, remote, n))
      fail_msg("WRITE of %zu bytes: %s", n, ferry_last_error());
    assert_memory_equal(d.r.memory + 11, want, n); /* landed when the call returned */
    if (ferry_transfer_sync(d.r.initiator, d.r.name, FERRY_OP_READ, d.local + HOST_BYTES + 5,
                            remote, n))
      fail_msg("READ of %zu bytes: %s", n, ferry_last_error());
    device_get(got, d.local + HOST_BYTES + 5, n);
    assert_memory_equal(got, want, n);
    moved += n;
  }
  uint64_t staged[2];
  staged_bytes(d.r.initiator, staged);
  assert_int_equal(staged[FERRY_OP_WRITE], moved);
  assert_int_equal(staged[FERRY_OP_READ], moved);
  assert_int_equal(test_rig_transport_bytes(&d.r, "fabric"), 2 * moved);
  assert_no_context();
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
  enum { N = 200, PIECE = 4099 };
  static ferry_entry write[N], read[N];
  uint8_t *want = malloc(N * PIECE), *got = malloc(N * PIECE);
  assert_non_null(want);
  assert_non_null(got);
  test_fill_random(want, N * PIECE, 43);
  device_put(d.local, want, N * PIECE);
  memcpy(d.r.out, want, N * PIECE);
  uint64_t remote_host = (uint64_t)(uintptr_t)d.r.memory;
  for (size_t i = 0; i < N; i++) {
    size_t at = i * PIECE;
    int device_here = (i / 3) % 2; /* runs of three: chunks of one kind and mixed ones */
    uint8_t *local = device_here ? d.local + at : d.r.out + at;
    write[i] = (ferry_entry){FERRY_OP_WRITE, local, remote_host + at + 1, PIECE};
    read[i] =
        (ferry_entry){FERRY_OP_READ, device_here ? d.local + DEVICE_BYTES / 2 + at : d.r.in + at,
                      remote_host + at + 1, PIECE};
  }
  if (ferry_transfer_sync_batch(d.r.initiator, d.r.name, write, N, NULL))
    fail_msg("%s", ferry_last_error());
  assert_memory_equal(d.r.memory + 1, want, N * PIECE);
  if (ferry_transfer_sync_batch(d.r.initiator, d.r.name, read, N, NULL))
    fail_msg("%s", ferry_last_error());
  for (size_t i = 0; i < N; i++) {
    if ((i / 3) % 2)
      device_get(got + i * PIECE, d.local + DEVICE_BYTES / 2 + i * PIECE, PIECE);
    else
      memcpy(got + i * PIECE, d.r.in + i * PIECE, PIECE);
  }
  assert_memory_equal(got, want, N * PIECE);
  assert_int_equal(test_rig_transport_bytes(&d.r, "fabric"), 2 * N * PIECE);
  assert_no_context();
  free(want);
  free(got);
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
  assert_no_context();
  device_rig_stop(&d);
}

static void shm_with_tcp_stages_over_tcp(void **state) {
  moved_over_tcp_beside(FERRY_TRANSPORT_SHM, NULL, "shm");
}

/* fabric with tcp beside: device memory at the target goes over tcp
 * (staged at both ends), host memory over fabric. */
static void fabric_with_tcp_stages_over_tcp(void **state) {
  moved_over_tcp_beside(FERRY_TRANSPORT_FABRIC, "tcp;ofi_rxm", "fabric");
}

static void fabric_shm_with_tcp_stages_over_tcp(void **state) {
  moved_over_tcp_beside(FERRY_TRANSPORT_FABRIC, "shm", "fabric");
}

int main(void) {
  const char *filter = getenv("FERRY_TEST_FILTER"); /* one case, by name (a glob) */
  if (filter && *filter)
    cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(tcp_device_both_ends),
      cmocka_unit_test(tcp_many_entries_mixed),
      cmocka_unit_test(never_refused_at_initiator),
      cmocka_unit_test(never_refused_at_target),
      cmocka_unit_test(shm_refuses_device),
      cmocka_unit_test(shm_with_tcp_stages_over_tcp),
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
