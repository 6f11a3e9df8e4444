/* cuda_double.c - see cuda_double.h. */
#include "cuda_double.h"

#include <dlfcn.h>
#include <stdio.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"

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
  int (*MemHostAlloc)(void **, size_t, unsigned);
  int (*MemFreeHost)(void *);
  int (*HtoD)(devptr, const void *, size_t);
  int (*DtoH)(void *, devptr, size_t);
  int (*HtoDAsync)(devptr, const void *, size_t, void *);
  int (*DtoHAsync)(void *, devptr, size_t, void *);
  int (*StreamCreate)(void **, unsigned);
  int (*StreamDestroy)(void *);
  int (*EventCreate)(void **, unsigned);
  int (*EventRecord)(void *, void *);
  int (*EventQuery)(void *);
  int (*EventSynchronize)(void *);
  int (*EventDestroy)(void *);
  void (*Hold)(devptr, int);
  void (*HeldWait)(void);
  int (*MemAllocVmm)(devptr *, size_t);
  int (*MemAllocAt)(devptr *, size_t);
  unsigned (*IpcOpens)(void);
  unsigned (*IpcImports)(void);
  int (*MemAllocVmmNoExport)(devptr *, size_t);
  unsigned (*VmmOpens)(void);
  unsigned (*VmmImports)(void);
  unsigned (*VmmMaps)(void);
  void *ctx;
} cu;

static int load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib || !dlsym(lib, "fake_cuda_hold"))
    return 0;
  const struct {
    void *field;
    const char *name;
  } names[] = {
      {&cu.Init, "cuInit"},
      {&cu.DeviceGet, "cuDeviceGet"},
      {&cu.PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
      {&cu.CtxPush, "cuCtxPushCurrent_v2"},
      {&cu.CtxPop, "cuCtxPopCurrent_v2"},
      {&cu.CtxGetCurrent, "cuCtxGetCurrent"},
      {&cu.MemAlloc, "cuMemAlloc_v2"},
      {&cu.MemFree, "cuMemFree_v2"},
      {&cu.MemHostAlloc, "cuMemHostAlloc"},
      {&cu.MemFreeHost, "cuMemFreeHost"},
      {&cu.HtoD, "cuMemcpyHtoD_v2"},
      {&cu.DtoH, "cuMemcpyDtoH_v2"},
      {&cu.HtoDAsync, "cuMemcpyHtoDAsync_v2"},
      {&cu.DtoHAsync, "cuMemcpyDtoHAsync_v2"},
      {&cu.StreamCreate, "cuStreamCreate"},
      {&cu.StreamDestroy, "cuStreamDestroy_v2"},
      {&cu.EventCreate, "cuEventCreate"},
      {&cu.EventRecord, "cuEventRecord"},
      {&cu.EventQuery, "cuEventQuery"},
      {&cu.EventSynchronize, "cuEventSynchronize"},
      {&cu.EventDestroy, "cuEventDestroy_v2"},
      {&cu.Hold, "fake_cuda_hold"},
      {&cu.HeldWait, "fake_cuda_held_wait"},
      {&cu.MemAllocVmm, "fakeMemAllocVmm"},
      {&cu.MemAllocAt, "fakeMemAllocAt"},
      {&cu.IpcOpens, "fakeIpcOpens"},
      {&cu.IpcImports, "fakeIpcImports"},
      {&cu.MemAllocVmmNoExport, "fakeMemAllocVmmNoExport"},
      {&cu.VmmOpens, "fakeVmmOpens"},
      {&cu.VmmImports, "fakeVmmImports"},
      {&cu.VmmMaps, "fakeVmmMaps"},
  };
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (!(*(void **)names[i].field = dlsym(lib, names[i].name)))
      return 0;
  int device;
  return !cu.Init(0) && !cu.DeviceGet(&device, 0) && !cu.PrimaryCtxRetain(&cu.ctx, device);
}

int cuda_double_load(void) {
  static int loaded = -1;
  if (loaded < 0)
    loaded = load();
  return loaded;
}

void cuda_double_need(void) {
  char why[256] = "";
  if (!cuda_double_load() || !ferry_memory_cuda_available(why, sizeof why)) {
    print_message("no fake CUDA driver: LD_LIBRARY_PATH must name build/tests/fake_cuda (%s)\n",
                  why);
    skip();
  }
}

/* A driver call made in the test's context: enter pushes it, leave pops
 * it again (whether or not the push worked) and returns the first error of
 * the push, the call and the pop (0: none). */
static int enter(void) { return cu.CtxPush(cu.ctx); }

static int leave(int rc) {
  int popped = cu.CtxPop(NULL);
  return rc ? rc : popped;
}

static void check(int rc, const char *what) {
  if (rc)
    fail_msg("%s: CUDA error %d", what, rc);
}

/* One driver call in the test's context; fails the test on an error. */
#define IN_CONTEXT(call)                                                                           \
  do {                                                                                             \
    int entered_ = enter();                                                                        \
    check(leave(entered_ ? entered_ : (call)), #call);                                             \
  } while (0)

int cuda_double_try_alloc(uint8_t **device, size_t size, cuda_double_kind kind) {
  devptr p = kind == CUDA_DOUBLE_AT ? (devptr)(uintptr_t)*device : 0;
  int rc = enter();
  rc = leave(rc                                 ? rc
             : kind == CUDA_DOUBLE_VMM          ? cu.MemAllocVmm(&p, size)
             : kind == CUDA_DOUBLE_VMM_NOEXPORT ? cu.MemAllocVmmNoExport(&p, size)
             : kind == CUDA_DOUBLE_AT           ? cu.MemAllocAt(&p, size)
                                                : cu.MemAlloc(&p, size));
  *device = (uint8_t *)(uintptr_t)p;
  return rc;
}

int cuda_double_try_free(uint8_t *device) {
  int rc = enter();
  return leave(rc ? rc : cu.MemFree((devptr)(uintptr_t)device));
}

int cuda_double_try_put(uint8_t *device, const void *host, size_t size) {
  int rc = enter();
  return leave(rc ? rc : cu.HtoD((devptr)(uintptr_t)device, host, size));
}

int cuda_double_try_get(void *host, const uint8_t *device, size_t size) {
  int rc = enter();
  return leave(rc ? rc : cu.DtoH(host, (devptr)(uintptr_t)device, size));
}

uint8_t *cuda_double_alloc(size_t size) {
  uint8_t *p = NULL;
  check(cuda_double_try_alloc(&p, size, CUDA_DOUBLE_PLAIN), "cuMemAlloc");
  return p;
}

void cuda_double_free(uint8_t *device) { check(cuda_double_try_free(device), "cuMemFree"); }

void cuda_double_put(uint8_t *device, const void *host, size_t size) {
  check(cuda_double_try_put(device, host, size), "cuMemcpyHtoD");
}

void cuda_double_get(void *host, const uint8_t *device, size_t size) {
  check(cuda_double_try_get(host, device, size), "cuMemcpyDtoH");
}

void *cuda_double_pinned(size_t size) {
  void *p = NULL;
  IN_CONTEXT(cu.MemHostAlloc(&p, size, 0));
  return p;
}

void cuda_double_free_pinned(void *host) { IN_CONTEXT(cu.MemFreeHost(host)); }

void *cuda_double_stream(void) {
  void *s = NULL;
  IN_CONTEXT(cu.StreamCreate(&s, 1));
  return s;
}

void cuda_double_stream_destroy(void *stream) { IN_CONTEXT(cu.StreamDestroy(stream)); }

void cuda_double_copy_async(uint8_t *device, void *host, size_t size, int to_device, void *stream) {
  devptr d = (devptr)(uintptr_t)device;
  if (to_device)
    IN_CONTEXT(cu.HtoDAsync(d, host, size, stream));
  else
    IN_CONTEXT(cu.DtoHAsync(host, d, size, stream));
}

void *cuda_double_record(void *stream) {
  void *event = NULL;
  IN_CONTEXT(cu.EventCreate(&event, 2));
  IN_CONTEXT(cu.EventRecord(event, stream));
  return event;
}

int cuda_double_query(void *event) {
  assert_int_equal(cu.CtxPush(cu.ctx), 0);
  int r = cu.EventQuery(event);
  assert_int_equal(cu.CtxPop(NULL), 0);
  return r;
}

void cuda_double_wait(void *event) {
  IN_CONTEXT(cu.EventSynchronize(event));
  IN_CONTEXT(cu.EventDestroy(event));
}

void cuda_double_hold(const uint8_t *device, int on) { cu.Hold((devptr)(uintptr_t)device, on); }

void cuda_double_held_wait(void) { cu.HeldWait(); }

void cuda_double_no_context(void) {
  void *current = (void *)1;
  assert_int_equal(cu.CtxGetCurrent(&current), 0);
  assert_null(current);
}

unsigned cuda_double_ipc_opens(void) { return cu.IpcOpens(); }

unsigned cuda_double_ipc_imports(void) { return cu.IpcImports(); }

unsigned cuda_double_vmm_opens(void) { return cu.VmmOpens(); }

unsigned cuda_double_vmm_imports(void) { return cu.VmmImports() + cu.VmmMaps(); }
