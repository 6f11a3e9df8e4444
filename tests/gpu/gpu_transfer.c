/* gpu_transfer.c - ferry moving CUDA device memory between two processes on
 * one GPU, over the tcp transport (staged through pinned bounce buffers),
 * with every byte verified; and, with --bench, staged device<->device
 * against host<->host throughput in the same run (issue 30).
 *
 * Only ferry.h and the CUDA driver, loaded at run time like ferry loads it
 * (dlopen("libcuda.so.1")), so this builds without a CUDA toolkit and with
 * no test framework (the GPU machine has no cmocka). With no CUDA device it
 * prints "SKIP: no CUDA device (...)" and exits 77, which ctest and
 * tests/gpu/run-on-device.sh report as skipped.
 *
 * The peer is this program again (--target), started before any thread or
 * CUDA context exists here, driven by lines on its stdin and answering on
 * its stdout, so the initiator can have it fill, check, unregister and die
 * at chosen steps. Usage: gpu_transfer [--bench] | gpu_transfer --target
 * BYTES. FERRY_GPU_TEST_TRANSPORT=shm runs it all over the shm transport
 * (CUDA IPC between the two processes) instead of tcp.
 *
 * FERRY_GPU_TEST_FABRIC=PROVIDER (both processes): the engines run the
 * fabric transport on that provider with tcp beside it, and only the
 * round trips run: local device memory to and from the target's host
 * memory goes over fabric (registered with the provider where it offers
 * FI_HMEM and takes CUDA memory, else staged through registered bounce
 * buffers: the target's log says which), device memory at the target over
 * tcp unless its provider registered it (RELIABILITY.md 20). */
#include <dlfcn.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

#define SKIP_CODE 77
#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
#define GIB (1024 * MIB)
#define SLACK (64 * KIB) /* room for the odd offsets around the largest size */

extern char **environ;

/* ---- the CUDA driver, the few calls a test needs --------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static struct {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemGetInfo)(size_t *, size_t *);
  CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*CtxSynchronize)(void);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*GetErrorString)(CUresult, const char **);
} cu;

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "gpu_transfer[%d]: FAIL: ", (int)getpid());
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}

static void cuda_check(CUresult r, const char *call) {
  const char *text = "unknown";
  if (r == 0)
    return;
  if (cu.GetErrorString)
    cu.GetErrorString(r, &text);
  die("%s: CUDA error %d (%s)", call, r, text);
}

static void *cuda_symbol(void *lib, const char *name) {
  void *sym = dlsym(lib, name);
  if (!sym)
    die("libcuda.so.1 lacks %s", name);
  return sym;
}

/* Loads the driver and makes device 0's primary context current on this
 * (the only CUDA-using) thread. */
static void cuda_open(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CUdevice dev;
  CUcontext ctx;
  if (!lib)
    die("dlopen(libcuda.so.1): %s", dlerror());
  *(void **)&cu.Init = cuda_symbol(lib, "cuInit");
  *(void **)&cu.DeviceGet = cuda_symbol(lib, "cuDeviceGet");
  *(void **)&cu.PrimaryCtxRetain = cuda_symbol(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&cu.CtxPushCurrent = cuda_symbol(lib, "cuCtxPushCurrent_v2");
  *(void **)&cu.MemAlloc = cuda_symbol(lib, "cuMemAlloc_v2");
  *(void **)&cu.MemFree = cuda_symbol(lib, "cuMemFree_v2");
  *(void **)&cu.MemGetInfo = cuda_symbol(lib, "cuMemGetInfo_v2");
  *(void **)&cu.MemcpyDtoD = cuda_symbol(lib, "cuMemcpyDtoD_v2");
  *(void **)&cu.CtxSynchronize = cuda_symbol(lib, "cuCtxSynchronize");
  *(void **)&cu.MemcpyHtoD = cuda_symbol(lib, "cuMemcpyHtoD_v2");
  *(void **)&cu.MemcpyDtoH = cuda_symbol(lib, "cuMemcpyDtoH_v2");
  *(void **)&cu.GetErrorString = cuda_symbol(lib, "cuGetErrorString");
  cuda_check(cu.Init(0), "cuInit");
  cuda_check(cu.DeviceGet(&dev, 0), "cuDeviceGet(0)");
  cuda_check(cu.PrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  cuda_check(cu.CtxPushCurrent(ctx), "cuCtxPushCurrent");
}

/* ---- buffers: host memory, or device memory with a host shadow -------- */
typedef struct buffer {
  int device;      /* 1: CUDA device memory (dptr), 0: host memory */
  uint8_t *shadow; /* host memory itself, or the device bytes' host copy */
  CUdeviceptr dptr;
  size_t len;
  const char *location;
} buffer;

static void buffer_open(buffer *b, int device, size_t len) {
  memset(b, 0, sizeof *b);
  b->device = device;
  b->len = len;
  b->location = device ? "cuda:0" : "cpu:0";
  b->shadow = malloc(len);
  if (!b->shadow)
    die("malloc(%zu) failed", len);
  memset(b->shadow, 0, len);
  if (device) {
    cuda_check(cu.MemAlloc(&b->dptr, len), "cuMemAlloc");
    cuda_check(cu.MemcpyHtoD(b->dptr, b->shadow, len), "cuMemcpyHtoD");
  }
}

static void buffer_close(buffer *b) {
  if (b->device)
    cuda_check(cu.MemFree(b->dptr), "cuMemFree");
  free(b->shadow);
  memset(b, 0, sizeof *b);
}

static void *buffer_addr(const buffer *b) {
  return b->device ? (void *)(uintptr_t)b->dptr : (void *)b->shadow;
}

static uint8_t pattern(size_t i, unsigned seed) {
  return (uint8_t)((i * 131u + seed * 7919u) ^ (i >> 11) ^ seed);
}

static void buffer_fill(buffer *b, size_t off, size_t len, unsigned seed) {
  for (size_t i = 0; i < len; i++)
    b->shadow[off + i] = pattern(i, seed);
  if (b->device)
    cuda_check(cu.MemcpyHtoD(b->dptr + off, b->shadow + off, len), "cuMemcpyHtoD");
}

/* Reads the memory itself back (device: into the shadow). */
static void buffer_load(buffer *b, size_t off, size_t len) {
  if (b->device)
    cuda_check(cu.MemcpyDtoH(b->shadow + off, b->dptr + off, len), "cuMemcpyDtoH");
}

/* The first byte in [off, off+len) that is not pattern(seed); -1: none. */
static long long buffer_check(buffer *b, size_t off, size_t len, unsigned seed) {
  buffer_load(b, off, len);
  for (size_t i = 0; i < len; i++)
    if (b->shadow[off + i] != pattern(i, seed))
      return (long long)i;
  return -1;
}

/* tcp (staged through bounce buffers), or shm where
 * FERRY_GPU_TEST_TRANSPORT says so (imports of the peer's allocation). */
static int over_shm(void) {
  const char *t = getenv("FERRY_GPU_TEST_TRANSPORT");
  return t && !strcmp(t, "shm");
}

static ferry_engine *engine_start(void) {
  ferry_config cfg;
  ferry_engine *e;
  ferry_config_init(&cfg);
  cfg.bind_host = "127.0.0.1";
  cfg.advertise_host = "127.0.0.1";
  cfg.transports = over_shm() ? FERRY_TRANSPORT_SHM : FERRY_TRANSPORT_TCP;
  const char *fabric = getenv("FERRY_GPU_TEST_FABRIC");
  if (fabric && *fabric) {
    cfg.transports |= FERRY_TRANSPORT_FABRIC;
    cfg.fabric_provider = fabric;
  }
  if (ferry_engine_create(&cfg, &e) != FERRY_OK)
    die("ferry_engine_create: %s", ferry_last_error());
  return e;
}

static void register_buffer(ferry_engine *e, buffer *b) {
  if (ferry_memory_register_at(e, buffer_addr(b), b->len, b->location) != FERRY_OK)
    die("register %s: %s", b->location, ferry_last_error());
}

/* ---- the target: a host and a device region, driven by stdin lines ---- */
static int target_main(size_t len) {
  buffer bufs[2], snapshot;
  char line[256], kind;
  ferry_engine *e;
  cuda_open();
  e = engine_start();
  buffer_open(&bufs[0], 0, len);
  buffer_open(&bufs[1], 1, len);
  register_buffer(e, &bufs[0]);
  register_buffer(e, &bufs[1]);
  memset(&snapshot, 0, sizeof snapshot);
  printf("ready %s %p %p\n", ferry_engine_name(e), buffer_addr(&bufs[0]), buffer_addr(&bufs[1]));
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    size_t off = 0, n = 0;
    unsigned seed = 0;
    char cmd[16];
    if (sscanf(line, "%15s %c %zu %zu %u", cmd, &kind, &off, &n, &seed) < 2)
      break;
    buffer *b = &bufs[kind == 'd'];
    long long bad = -1;
    if (!strcmp(cmd, "fill")) {
      buffer_fill(b, off, n, seed);
    } else if (!strcmp(cmd, "check")) {
      bad = buffer_check(b, off, n, seed);
    } else if (!strcmp(cmd, "unregister")) {
      /* The fence: once this returns, no byte may land; the snapshot taken
       * right after is what "same" compares with later. */
      if (ferry_memory_unregister(e, buffer_addr(b)) != FERRY_OK)
        die("unregister: %s", ferry_last_error());
      buffer_load(b, 0, b->len);
      snapshot.shadow = realloc(snapshot.shadow, b->len);
      memcpy(snapshot.shadow, b->shadow, b->len);
    } else if (!strcmp(cmd, "same")) {
      buffer_load(b, 0, b->len);
      for (size_t i = 0; i < b->len && bad < 0; i++)
        if (b->shadow[i] != snapshot.shadow[i])
          bad = (long long)i;
    } else if (!strcmp(cmd, "register")) {
      register_buffer(e, b);
    } else {
      break;
    }
    printf(bad < 0 ? "ok\n" : "bad %lld\n", bad);
    fflush(stdout);
  }
  ferry_engine_destroy(e);
  buffer_close(&bufs[0]);
  buffer_close(&bufs[1]);
  free(snapshot.shadow);
  return 0;
}

/* ---- the initiator's side of a target process ------------------------- */
typedef struct peer {
  pid_t pid;
  FILE *in, *out; /* its stdin, its stdout */
  char name[128];
  uint64_t host_addr, dev_addr;
} peer;

/* How this program starts itself as a target: /proc/self/exe, or, where
 * run through a loader of its own (FERRY_GPU_LOADER: an ld.so, with
 * FERRY_GPU_LIBRARY_PATH, as run-on-device.sh does on an older glibc),
 * through that loader again; argv0 is then this program's path. */
static const char *argv0;

static void peer_start(peer *p, size_t len) {
  int to[2], from[2];
  char size[32], self[4096];
  const char *loader = getenv("FERRY_GPU_LOADER");
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  char *direct[] = {self, "--target", size, NULL};
  char *loaded[] = {(char *)loader,
                    "--library-path",
                    getenv("FERRY_GPU_LIBRARY_PATH"),
                    (char *)argv0,
                    "--target",
                    size,
                    NULL};
  char **argv = loader && *loader ? loaded : direct;
  posix_spawn_file_actions_t fa;
  char line[512];
  void *h, *d;
  if (n <= 0 || pipe(to) || pipe(from))
    die("readlink/pipe failed");
  self[n] = '\0';
  snprintf(size, sizeof size, "%zu", len);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  posix_spawn_file_actions_addclose(&fa, to[1]);
  posix_spawn_file_actions_addclose(&fa, from[0]);
  if (posix_spawn(&p->pid, argv[0], &fa, NULL, argv, environ))
    die("posix_spawn %s failed", argv[0]);
  posix_spawn_file_actions_destroy(&fa);
  close(to[0]);
  close(from[1]);
  p->in = fdopen(to[1], "w");
  p->out = fdopen(from[0], "r");
  if (!fgets(line, sizeof line, p->out) || sscanf(line, "ready %127s %p %p", p->name, &h, &d) != 3)
    die("target %d did not start (its stderr says why)", (int)p->pid);
  p->host_addr = (uint64_t)(uintptr_t)h;
  p->dev_addr = (uint64_t)(uintptr_t)d;
}

/* Sends one command; returns its answer's first byte offset that was
 * wrong, or -1 for "ok". */
static long long peer_ask(peer *p, const char *fmt, ...) {
  char line[128];
  long long bad = -1;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->in, fmt, ap);
  va_end(ap);
  fputc('\n', p->in);
  fflush(p->in);
  if (!fgets(line, sizeof line, p->out))
    die("target %d ended without answering", (int)p->pid);
  if (strncmp(line, "ok", 2) && sscanf(line, "bad %lld", &bad) != 1)
    die("target answered %s", line);
  return bad;
}

static void peer_stop(peer *p) {
  int status;
  fclose(p->in);
  fclose(p->out);
  waitpid(p->pid, &status, 0);
}

/* ---- cases ------------------------------------------------------------ */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct rig {
  ferry_engine *e;
  buffer local[2]; /* host, device */
  peer target;
} rig;

static uint64_t remote_addr(const rig *r, int device) {
  return device ? r->target.dev_addr : r->target.host_addr;
}

static int failures;

static void report(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  fflush(stdout);
  failures += !ok;
}

/* One WRITE then one READ of len bytes between local memory of one kind
 * and remote memory of another, at odd offsets, every byte checked. */
static void case_roundtrip(rig *r, int local_dev, int remote_dev, size_t len, unsigned seed) {
  const char *names[2] = {"host", "cuda:0"};
  buffer *l = &r->local[local_dev];
  size_t loff = 7, roff = 4099;
  char k = remote_dev ? 'd' : 'h';
  double t0 = now_s();
  buffer_fill(l, loff, len, seed);
  ferry_status s =
      ferry_transfer_sync(r->e, r->target.name, FERRY_OP_WRITE, (uint8_t *)buffer_addr(l) + loff,
                          remote_addr(r, remote_dev) + roff, len);
  long long bad =
      s == FERRY_OK ? peer_ask(&r->target, "check %c %zu %zu %u", k, roff, len, seed) : -2;
  report(s == FERRY_OK && bad < 0, "WRITE %s -> %s %zu B%s%s (bad byte %lld, %.2f s)",
         names[local_dev], names[remote_dev], len, s ? ": " : "", s ? ferry_last_error() : "", bad,
         now_s() - t0);
  peer_ask(&r->target, "fill %c %zu %zu %u", k, roff, len, seed + 1);
  t0 = now_s();
  s = ferry_transfer_sync(r->e, r->target.name, FERRY_OP_READ, (uint8_t *)buffer_addr(l) + loff,
                          remote_addr(r, remote_dev) + roff, len);
  bad = s == FERRY_OK ? buffer_check(l, loff, len, seed + 1) : -2;
  report(s == FERRY_OK && bad < 0, "READ %s <- %s %zu B%s%s (bad byte %lld, %.2f s)",
         names[local_dev], names[remote_dev], len, s ? ": " : "", s ? ferry_last_error() : "", bad,
         now_s() - t0);
}

static uint64_t staged_total(ferry_engine *e) {
  ferry_stats *st;
  if (ferry_stats_snapshot(e, &st) != FERRY_OK)
    die("ferry_stats_snapshot: %s", ferry_last_error());
  uint64_t staged = st->staged_bytes[FERRY_OP_WRITE] + st->staged_bytes[FERRY_OP_READ];
  ferry_stats_free(st);
  return staged;
}

/* Device bytes went through the staging pipeline (the stats say so). */
static void case_staged(rig *r) {
  uint64_t staged = staged_total(r->e);
  report(staged > 0, "device bytes moved through the staging pipeline (%" PRIu64 " B staged)",
         staged);
}

/* Submits a WRITE of len device bytes and returns once its first bytes
 * went through this engine's bounce buffers: the transfer is under way
 * (over shm, nothing is staged: it returns once submitted). */
static ferry_batch *write_under_way(rig *r, const char *target, uint64_t remote, size_t len) {
  ferry_entry entry = {FERRY_OP_WRITE, buffer_addr(&r->local[1]), remote, len};
  ferry_batch *batch;
  uint64_t before = staged_total(r->e);
  if (ferry_batch_submit(r->e, target, &entry, 1, NULL, &batch) != FERRY_OK)
    die("ferry_batch_submit: %s", ferry_last_error());
  while (!over_shm() && staged_total(r->e) == before &&
         ferry_batch_status(batch, NULL) == FERRY_BATCH_PENDING)
    usleep(200);
  return batch;
}

/* The target unregisters its device region while a 1 GiB WRITE into it is
 * in flight: the WRITE may finish first or fail, but no byte lands after
 * unregister returned (the target compares its memory with a snapshot it
 * took then, once the WRITE is over), and the target serves on. */
static void case_unregister_during_write(rig *r, size_t len) {
  buffer_fill(&r->local[1], 0, len, 77);
  ferry_batch *batch = write_under_way(r, r->target.name, r->target.dev_addr, len);
  peer_ask(&r->target, "unregister d");
  ferry_status s = ferry_batch_wait(batch, -1);
  char why[256];
  snprintf(why, sizeof why, "%s", s ? ferry_last_error() : "finished before unregister");
  ferry_batch_free(batch);
  long long bad = peer_ask(&r->target, "same d");
  report(bad < 0,
         "unregister during a %zu B WRITE into cuda:0: nothing landed after it "
         "(transfer: %s; first changed byte %lld)",
         len, why, bad);
  peer_ask(&r->target, "register d");
}

/* A target killed during a device WRITE of len bytes: the transfer fails
 * (within its deadline, not hanging), and the engine still moves device
 * memory to the other target afterwards. */
static void case_killed_peer(rig *r, size_t len) {
  peer victim;
  peer_start(&victim, len);
  /* Connected first, so the kill lands in the data, not the handshake. */
  if (ferry_transfer_sync(r->e, victim.name, FERRY_OP_WRITE, buffer_addr(&r->local[1]),
                          victim.dev_addr, 1) != FERRY_OK)
    die("first WRITE to the victim: %s", ferry_last_error());
  double t0 = now_s();
  ferry_batch *batch = write_under_way(r, victim.name, victim.dev_addr, len);
  kill(victim.pid, SIGKILL);
  ferry_status s = ferry_batch_wait(batch, -1);
  /* Over shm nothing says the copy is under way: it may end before the
   * kill; what counts there is that the call ends and the engine goes on. */
  report(s != FERRY_OK || over_shm(), "WRITE to a target killed mid-transfer %s: %s (%.2f s)",
         over_shm() ? "ends" : "fails", s ? ferry_last_error() : "it succeeded", now_s() - t0);
  ferry_batch_free(batch);
  peer_stop(&victim);
  case_roundtrip(r, 1, 1, MIB, 91);
}

/* ---- bench: staged device<->device against host<->host ----------------- */
static double bench_gbps(rig *r, int dev, ferry_op op, size_t len, double secs) {
  unsigned n = 0;
  double t0 = now_s(), t;
  do {
    if (ferry_transfer_sync(r->e, r->target.name, op, buffer_addr(&r->local[dev]),
                            remote_addr(r, dev), len) != FERRY_OK)
      die("bench transfer: %s", ferry_last_error());
    n++;
    t = now_s() - t0;
  } while (t < secs || n < 3);
  return (double)n * len / t / 1e9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* GB/s of a device-to-device copy of len bytes in this process (the
 * baseline of the shm IPC rows: issue 30 asks >= 0.9x of it). */
static double dtod_gbps(rig *r, size_t len, double secs) {
  CUdeviceptr dst;
  cuda_check(cu.MemAlloc(&dst, len), "cuMemAlloc (DtoD baseline)");
  CUdeviceptr src = (CUdeviceptr)(uintptr_t)buffer_addr(&r->local[1]);
  unsigned n = 0;
  double t0 = now_s(), t;
  do {
    cuda_check(cu.MemcpyDtoD(dst, src, len), "cuMemcpyDtoD");
    cuda_check(cu.CtxSynchronize(), "cuCtxSynchronize");
    n++;
    t = now_s() - t0;
  } while (t < secs || n < 3);
  cuda_check(cu.MemFree(dst), "cuMemFree (DtoD baseline)");
  return (double)n * len / t / 1e9;
}

static double median_of(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return v[n / 2];
}

/* Over tcp: staged device<->device against host<->host, 1 and 64 MiB.
 * Over shm: IPC device<->device against a device-to-device copy in one
 * process, 64 KiB to 64 MiB. Medians of REPS runs, interleaved run by run. */
static void bench_rows(rig *r) {
  enum { REPS = 5 };
  int shm = over_shm();
  size_t tcp_sizes[] = {MIB, 64 * MIB}, shm_sizes[] = {64 * KIB, 16 * MIB, 64 * MIB};
  size_t *sizes = shm ? shm_sizes : tcp_sizes, count = shm ? 3 : 2;
  double secs = shm ? 0.5 : 1.0; /* each figure's run: the rows fit run-on-device.sh's step */
  for (int op = 1; op >= 0; op--) {
    for (size_t i = 0; i < count; i++) {
      double dev[REPS], base[REPS];
      for (int rep = 0; rep < REPS; rep++) {
        base[rep] =
            shm ? dtod_gbps(r, sizes[i], secs) : bench_gbps(r, 0, (ferry_op)op, sizes[i], secs);
        dev[rep] = bench_gbps(r, 1, (ferry_op)op, sizes[i], secs);
      }
      double d = median_of(dev, REPS), b = median_of(base, REPS), ratio = d / b;
      if (shm)
        printf("BENCH shm %s %6zu KiB: cuda:0->cuda:0 (IPC, two processes) %.2f GB/s, "
               "cuMemcpyDtoD in one process %.2f GB/s, ratio %.2fx (issue 30 asks >= 0.9x at "
               ">= 16 MiB: %s)\n",
               op ? "WRITE" : "READ ", sizes[i] / KIB, d, b, ratio,
               sizes[i] < 16 * MIB ? "not asked"
               : ratio >= 0.9      ? "met"
                                   : "missed");
      else
        printf("BENCH tcp %s %3zu MiB: cuda:0->cuda:0 (staged) %.2f GB/s, host->host %.2f GB/s, "
               "ratio %.2fx (issue 30 asks >= 0.8x: %s)\n",
               op ? "WRITE" : "READ ", sizes[i] / MIB, d, b, ratio,
               ratio >= 0.8 ? "met" : "missed");
      fflush(stdout);
    }
  }
}

/* Registering a KV cache: 1,000 tensors inside 10 allocations (as a
 * caching allocator's blocks hold a server's per-layer tensors), 80 GB in
 * all, or 80% of the device's free memory where it has less. */
static void bench_register(rig *r) {
  enum { BLOCKS = 10, PER_BLOCK = 100 };
  size_t free_bytes = 0, total_bytes = 0;
  cuda_check(cu.MemGetInfo(&free_bytes, &total_bytes), "cuMemGetInfo");
  size_t want = (size_t)80e9, can = free_bytes / 10 * 8;
  size_t block = (want < can ? want : can) / BLOCKS / PER_BLOCK / 4096 * 4096 * PER_BLOCK;
  size_t tensor = block / PER_BLOCK;
  CUdeviceptr base[BLOCKS];
  for (int b = 0; b < BLOCKS; b++)
    cuda_check(cu.MemAlloc(&base[b], block), "cuMemAlloc (register bench)");
  double t0 = now_s();
  for (int b = 0; b < BLOCKS; b++)
    for (int i = 0; i < PER_BLOCK; i++)
      if (ferry_memory_register_at(r->e, (void *)(uintptr_t)(base[b] + i * tensor), tensor,
                                   "cuda:0") != FERRY_OK)
        die("register bench: %s", ferry_last_error());
  double took = now_s() - t0;
  for (int b = 0; b < BLOCKS; b++)
    for (int i = 0; i < PER_BLOCK; i++)
      if (ferry_memory_unregister(r->e, (void *)(uintptr_t)(base[b] + i * tensor)) != FERRY_OK)
        die("unregister (register bench): %s", ferry_last_error());
  for (int b = 0; b < BLOCKS; b++)
    cuda_check(cu.MemFree(base[b]), "cuMemFree (register bench)");
  double gb = (double)block * BLOCKS / 1e9;
  printf("BENCH register %d cuda:0 tensors in %d allocations, %.1f GB: %.3f s "
         "(issue 30 asks < 1 s for 80 GB: %s%s)\n",
         BLOCKS * PER_BLOCK, BLOCKS, gb, took, took < 1.0 ? "met" : "missed",
         gb < 79.9 ? ", at the size this device could hold" : "");
  fflush(stdout);
}

int main(int argc, char **argv) {
  char why[256];
  int bench = argc > 1 && !strcmp(argv[1], "--bench");
  argv0 = argv[0];
  if (argc > 2 && !strcmp(argv[1], "--target"))
    return target_main(strtoull(argv[2], NULL, 10));
  /* Asked through ferry, as an application would; nothing of CUDA's is
   * touched here before the targets exist except this probe. */
  if (!ferry_memory_cuda_available(why, sizeof why)) {
    printf("SKIP: no CUDA device (%s)\n", why);
    return SKIP_CODE;
  }
  /* FERRY_GPU_TEST_MAX_BYTES: a smaller largest size (a quick run). */
  const char *max = getenv("FERRY_GPU_TEST_MAX_BYTES");
  size_t largest = bench ? 64 * MIB : max && *max ? strtoull(max, NULL, 10) : GIB;
  size_t region = largest + SLACK;
  rig r;
  peer_start(&r.target, region);
  cuda_open();
  r.e = engine_start();
  buffer_open(&r.local[0], 0, region);
  buffer_open(&r.local[1], 1, region);
  register_buffer(r.e, &r.local[0]);
  register_buffer(r.e, &r.local[1]);
  if (bench) {
    bench_rows(&r);
    bench_register(&r);
  } else {
    size_t sizes[] = {1, 4097, MIB + 3, 64 * MIB, GIB};
    unsigned seed = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && sizes[i] <= largest; i++) {
      case_roundtrip(&r, 1, 1, sizes[i], seed += 2);
      case_roundtrip(&r, 0, 1, sizes[i], seed += 2);
      case_roundtrip(&r, 1, 0, sizes[i], seed += 2);
    }
    const char *fabric = getenv("FERRY_GPU_TEST_FABRIC");
    if (!fabric || !*fabric) { /* fabric: the round trips above only */
      if (!over_shm())
        case_staged(&r);
      case_unregister_during_write(&r, largest);
      case_killed_peer(&r, largest);
    }
  }
  peer_stop(&r.target);
  ferry_engine_destroy(r.e);
  buffer_close(&r.local[0]);
  buffer_close(&r.local[1]);
  printf("%s: %d failure(s)\n", bench ? "gpu_transfer --bench" : "gpu_transfer", failures);
  return failures ? 1 : 0;
}
