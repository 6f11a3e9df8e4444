/* kind_cuda.c - CUDA memory as a memory kind, through the CUDA driver
 * loaded at run time (dlopen("libcuda.so.1")), so one build runs with and
 * without a GPU and needs no CUDA toolkit. Without the driver (or with no
 * device) this kind claims nothing and every region is host memory.
 *
 * Contexts: ferry works in the primary context of the device the memory
 * belongs to (as the driver reports it), never another device's: each call
 * pushes it and pops it again, so no thread of ferry's is left with a
 * context current, and an application thread's own stays as it was. A
 * primary context, once retained, stays retained for the process: releasing
 * it could destroy it under the application. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/library.h"
#include "base/log.h"
#include "base/sync.h"
#include "memory/cuda_driver.h"
#include "memory/kind.h"

#define CUDA_LIBRARY "libcuda.so.1"
#define CUDA_MAX_DEVICES 64

static ferry_cuda_api cu;
static int cuda_loaded;
static char cuda_missing[448]; /* why not, when not loaded */
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext contexts[CUDA_MAX_DEVICES]; /* retained primary contexts */

#define SYMBOL(field, name) FERRY_LIBRARY_SYMBOL(ferry_cuda_api, field, name, NULL)
static const ferry_library_symbol symbols[] = {
    SYMBOL(Init, "cuInit"),
    SYMBOL(DeviceGetCount, "cuDeviceGetCount"),
    SYMBOL(DeviceGet, "cuDeviceGet"),
    SYMBOL(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    SYMBOL(CtxPushCurrent, "cuCtxPushCurrent_v2"),
    SYMBOL(CtxPopCurrent, "cuCtxPopCurrent_v2"),
    SYMBOL(PointerGetAttributes, "cuPointerGetAttributes"),
    SYMBOL(MemGetAddressRange, "cuMemGetAddressRange_v2"),
    SYMBOL(MemHostAlloc, "cuMemHostAlloc"),
    SYMBOL(MemFreeHost, "cuMemFreeHost"),
    SYMBOL(StreamCreate, "cuStreamCreate"),
    SYMBOL(StreamDestroy, "cuStreamDestroy_v2"),
    SYMBOL(EventCreate, "cuEventCreate"),
    SYMBOL(EventRecord, "cuEventRecord"),
    SYMBOL(EventSynchronize, "cuEventSynchronize"),
    SYMBOL(EventDestroy, "cuEventDestroy_v2"),
    SYMBOL(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    SYMBOL(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    SYMBOL(IpcGetMemHandle, "cuIpcGetMemHandle"),
    SYMBOL(GetErrorName, "cuGetErrorName"),
    SYMBOL(GetErrorString, "cuGetErrorString"),
    SYMBOL(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
    SYMBOL(IpcCloseMemHandle, "cuIpcCloseMemHandle"),
    SYMBOL(MemcpyAsync, "cuMemcpyAsync"),
    SYMBOL(MemRetainAllocationHandle, "cuMemRetainAllocationHandle"),
    SYMBOL(MemRelease, "cuMemRelease"),
    SYMBOL(StreamGetCtx, "cuStreamGetCtx"),
    SYMBOL(CtxGetCurrent, "cuCtxGetCurrent"),
    SYMBOL(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
    SYMBOL(StreamWaitValue32, "cuStreamWaitValue32_v2"),
    SYMBOL(LaunchHostFunc, "cuLaunchHostFunc"),
    SYMBOL(CtxGetDevice, "cuCtxGetDevice"),
    SYMBOL(MemExportToShareableHandle, "cuMemExportToShareableHandle"),
    SYMBOL(MemImportFromShareableHandle, "cuMemImportFromShareableHandle"),
    SYMBOL(MemAddressReserve, "cuMemAddressReserve"),
    SYMBOL(MemAddressFree, "cuMemAddressFree"),
    SYMBOL(MemMap, "cuMemMap"),
    SYMBOL(MemUnmap, "cuMemUnmap"),
    SYMBOL(MemSetAccess, "cuMemSetAccess"),
};

/* "CUDA_ERROR_INVALID_VALUE (invalid argument)" */
static const char *cuda_error(CUresult r, char *out, size_t size) {
  const char *name = NULL, *text = NULL;
  if (cu.GetErrorName)
    cu.GetErrorName(r, &name);
  if (cu.GetErrorString)
    cu.GetErrorString(r, &text);
  snprintf(out, size, "%s (%s)", name ? name : "CUDA error", text ? text : "no description");
  return out;
}

static ferry_status cuda_fail(CUresult r, const char *call, int device) {
  char text[160];
  cuda_error(r, text, sizeof text);
  if (device >= 0)
    return ferry_fail(FERRY_EFAULT, "%s on cuda:%d failed: %s", call, device, text);
  return ferry_fail(FERRY_EFAULT, "%s failed: %s", call, text);
}

static ferry_library cuda_library = FERRY_LIBRARY(CUDA_LIBRARY, NULL, "GPU memory", symbols, cu);

static void cuda_load(void) {
  if (ferry_library_load(&cuda_library) != FERRY_OK) {
    snprintf(cuda_missing, sizeof cuda_missing, "%s: %s", CUDA_LIBRARY, cuda_library.missing);
    return;
  }
  int count = 0;
  CUresult r = cu.Init(0);
  if (r == CUDA_SUCCESS)
    r = cu.DeviceGetCount(&count);
  if (r != CUDA_SUCCESS || count == 0) {
    char text[160];
    snprintf(cuda_missing, sizeof cuda_missing, "%s loaded, but cuInit found no CUDA device: %s",
             CUDA_LIBRARY, r ? cuda_error(r, text, sizeof text) : "0 devices");
    return;
  }
  FERRY_INFO("CUDA driver loaded (%s): %d device%s", CUDA_LIBRARY, count, count == 1 ? "" : "s");
  cuda_loaded = 1;
}

static int cuda_available(char *why, size_t size) {
  pthread_once(&cuda_once, cuda_load);
  if (!cuda_loaded && why)
    snprintf(why, size, "%s", cuda_missing);
  return cuda_loaded;
}

/* Makes device's primary context current on this thread (retained once
 * per process); cuda_leave restores the thread's own. */
static ferry_status cuda_enter(int device) {
  if (device < 0 || device >= CUDA_MAX_DEVICES)
    return ferry_fail(FERRY_EINVAL, "cuda:%d is beyond the %d devices ferry handles", device,
                      CUDA_MAX_DEVICES);
  pthread_mutex_lock(&contexts_lock);
  CUresult r = CUDA_SUCCESS;
  CUdevice dev;
  if (!contexts[device] && (r = cu.DeviceGet(&dev, device)) == CUDA_SUCCESS)
    r = cu.DevicePrimaryCtxRetain(&contexts[device], dev);
  CUcontext ctx = contexts[device];
  pthread_mutex_unlock(&contexts_lock);
  if (r != CUDA_SUCCESS)
    return cuda_fail(r, "cuDevicePrimaryCtxRetain", device);
  r = cu.CtxPushCurrent(ctx);
  return r == CUDA_SUCCESS ? FERRY_OK : cuda_fail(r, "cuCtxPushCurrent", device);
}

static void cuda_leave(void) {
  CUcontext popped;
  cu.CtxPopCurrent(&popped);
}

/* ---- identification ---------------------------------------------------------- */

/* Device memory (not managed) must lie inside one allocation: its range
 * and IPC handle are per allocation. */
static ferry_status allocation_of(uint64_t addr, uint64_t length, ferry_where *where) {
  ferry_status st = cuda_enter(where->device);
  if (st)
    return st;
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = cu.MemGetAddressRange(&base, &size, (CUdeviceptr)addr);
  cuda_leave();
  if (r != CUDA_SUCCESS)
    return cuda_fail(r, "cuMemGetAddressRange", where->device);
  if (addr + length > base + size)
    return ferry_fail(FERRY_EINVAL,
                      "register 0x%llx (+%llu bytes) on cuda:%d: it runs past the end of its CUDA "
                      "allocation [0x%llx, +%zu)",
                      (unsigned long long)addr, (unsigned long long)length, where->device,
                      (unsigned long long)base, size);
  where->base = base;
  where->size = size;
  return FERRY_OK;
}

static ferry_status cuda_identify(uint64_t addr, uint64_t length, ferry_where *where) {
  unsigned memory_type = 0, managed = 0; /* the driver writes a bool into managed */
  int ordinal = -1;
  int attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                      CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void *data[] = {&memory_type, &ordinal, &managed};
  CUresult r = cu.PointerGetAttributes(3, attributes, data, (CUdeviceptr)addr);
  /* Memory the driver never saw (null attributes; or no UVA context
   * knows it): host memory, whose own check still refuses what the CPU
   * cannot touch. */
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_CONTEXT ||
      (r == CUDA_SUCCESS && memory_type == 0))
    return FERRY_ENOTFOUND;
  if (r != CUDA_SUCCESS)
    return cuda_fail(r, "cuPointerGetAttributes", -1);
  *where = (ferry_where){.kind = FERRY_KIND_CUDA,
                         .cpu_access = memory_type == CU_MEMORYTYPE_HOST || managed,
                         .device = (int16_t)ordinal};
  if (where->cpu_access)
    return FERRY_OK; /* pinned or managed: the CPU reaches it like host memory */
  return allocation_of(addr, length, where);
}

/* ---- copies ---------------------------------------------------------------------- */

typedef struct cuda_copier {
  ferry_copier head;
  CUstream stream;
  CUevent done[FERRY_COPIER_MAX_SLOTS];
} cuda_copier;

static void cuda_copier_close(ferry_copier *c) {
  cuda_copier *cc = (cuda_copier *)c;
  if (cuda_enter(c->device) == FERRY_OK) {
    if (cc->stream)
      cu.StreamDestroy(cc->stream);
    for (unsigned i = 0; i < FERRY_COPIER_MAX_SLOTS; i++) {
      if (cc->done[i])
        cu.EventDestroy(cc->done[i]);
      if (c->bounce[i])
        cu.MemFreeHost(c->bounce[i]);
    }
    cuda_leave();
  }
  free(cc);
}

static CUresult copier_resources(cuda_copier *cc, unsigned slots, size_t slot_size,
                                 const char **call) {
  CUresult r;
  *call = "cuStreamCreate";
  if ((r = cu.StreamCreate(&cc->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
    return r;
  for (; cc->head.slots < slots; cc->head.slots++) {
    void *bounce = NULL;
    *call = "cuMemHostAlloc";
    if (slot_size && /* none: a copier for copy_direct only */
        (r = cu.MemHostAlloc(&bounce, slot_size, CU_MEMHOSTALLOC_PORTABLE)) != CUDA_SUCCESS)
      return r;
    cc->head.bounce[cc->head.slots] = bounce;
    *call = "cuEventCreate";
    if ((r = cu.EventCreate(&cc->done[cc->head.slots], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
      return r;
  }
  return CUDA_SUCCESS;
}

static ferry_status cuda_copier_open(int device, unsigned slots, size_t slot_size,
                                     ferry_copier **out) {
  cuda_copier *cc = calloc(1, sizeof *cc);
  if (!cc)
    return ferry_fail(FERRY_ENOMEM, "no memory for a CUDA copier");
  cc->head = (ferry_copier){.kind = &ferry_kind_cuda, .device = device, .slot_size = slot_size};
  ferry_status st = cuda_enter(device);
  if (st) {
    free(cc);
    return st;
  }
  const char *call;
  CUresult r = copier_resources(cc, slots, slot_size, &call);
  cuda_leave();
  if (r != CUDA_SUCCESS) {
    st = cuda_fail(r, call, device);
    cuda_copier_close(&cc->head);
    return st;
  }
  *out = &cc->head;
  return FERRY_OK;
}

/* After call queued a copy on the copier's stream (its result r, in the
 * device's context): records slot's event behind it, leaves the context;
 * the first failure, naming its call. */
static ferry_status cuda_copy_queued(cuda_copier *cc, unsigned slot, CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) {
    call = "cuEventRecord";
    r = cu.EventRecord(cc->done[slot], cc->stream);
  }
  cuda_leave();
  return r == CUDA_SUCCESS ? FERRY_OK : cuda_fail(r, call, cc->head.device);
}

static ferry_status cuda_copy_start(ferry_copier *c, unsigned slot, uint64_t addr, size_t len,
                                    int to_host) {
  cuda_copier *cc = (cuda_copier *)c;
  ferry_status st = cuda_enter(c->device);
  if (st)
    return st;
  CUresult r = to_host ? cu.MemcpyDtoHAsync(c->bounce[slot], (CUdeviceptr)addr, len, cc->stream)
                       : cu.MemcpyHtoDAsync((CUdeviceptr)addr, c->bounce[slot], len, cc->stream);
  return cuda_copy_queued(cc, slot, r, to_host ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync");
}

/* Done means the copy completed (its event), not that it was queued. */
static ferry_status cuda_copy_wait(ferry_copier *c, unsigned slot) {
  ferry_status st = cuda_enter(c->device);
  if (st)
    return st;
  CUresult r = cu.EventSynchronize(((cuda_copier *)c)->done[slot]);
  cuda_leave();
  return r == CUDA_SUCCESS ? FERRY_OK : cuda_fail(r, "cuEventSynchronize", c->device);
}

/* One copy between any two of: this process's device memory, an imported
 * allocation, host memory (unified addressing tells the driver which), on
 * the copier's own stream; its event says when it landed. */
static ferry_status cuda_copy_direct(ferry_copier *c, unsigned slot, uint64_t dst, uint64_t src,
                                     size_t len) {
  cuda_copier *cc = (cuda_copier *)c;
  ferry_status st = cuda_enter(c->device);
  if (st)
    return st;
  CUresult r = cu.MemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, len, cc->stream);
  return cuda_copy_queued(cc, slot, r, "cuMemcpyAsync");
}

/* A VMM allocation (cuMemCreate + cuMemMap: PyTorch's expandable
 * segments) has no CUDA IPC handle; only for those does the driver hand
 * out an allocation handle, exported as a POSIX fd instead. */
typedef struct cuda_vmm_handle {
  uint64_t magic; /* CUDA_VMM_MAGIC: tells it from an IPC handle */
  uint64_t size;  /* of the allocation, mapped whole */
} cuda_vmm_handle;
#define CUDA_VMM_MAGIC 0x66657272792d766dull

/* The POSIX fd of the VMM allocation at where->base, or FERRY_ENOTIMPL
 * with the driver's answer when it was not made exportable that way.
 * Context current. */
static ferry_status vmm_export(const ferry_where *where, CUmemGenericAllocationHandle h, void *out,
                               size_t *len, int *fd) {
  int shared = -1;
  CUresult r =
      cu.MemExportToShareableHandle(&shared, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  cu.MemRelease(h);
  if (r != CUDA_SUCCESS) {
    char text[160];
    return ferry_fail(FERRY_ENOTIMPL,
                      "cuda:%d allocation 0x%llx (+%llu bytes) is a CUDA VMM allocation "
                      "(cuMemCreate, as PyTorch's expandable segments make) that the driver does "
                      "not export as a POSIX fd (cuMemExportToShareableHandle: %s): only tcp "
                      "(staged) carries it",
                      where->device, (unsigned long long)where->base,
                      (unsigned long long)where->size, cuda_error(r, text, sizeof text));
  }
  cuda_vmm_handle vh = {CUDA_VMM_MAGIC, where->size};
  memcpy(out, &vh, sizeof vh);
  *len = sizeof vh;
  *fd = shared;
  return FERRY_OK;
}

/* A CUDA IPC handle of the region's allocation (device memory only), or,
 * for a VMM allocation, its POSIX fd (*fd) and size. */
static ferry_status cuda_export(const ferry_where *where, void *out, size_t *len, int *fd) {
  *fd = -1;
  if (where->cpu_access || !where->base)
    return ferry_fail(FERRY_ENOTIMPL, "cuda:%d: only device memory has an IPC handle",
                      where->device);
  if (*len < sizeof(CUipcMemHandle))
    return ferry_fail(FERRY_EINVAL, "an IPC handle needs %zu bytes", sizeof(CUipcMemHandle));
  ferry_status st = cuda_enter(where->device);
  if (st)
    return st;
  CUmemGenericAllocationHandle h;
  if (cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)where->base) == CUDA_SUCCESS) {
    st = vmm_export(where, h, out, len, fd);
    cuda_leave();
    return st;
  }
  CUipcMemHandle handle;
  CUresult r = cu.IpcGetMemHandle(&handle, (CUdeviceptr)where->base);
  cuda_leave();
  if (r != CUDA_SUCCESS)
    return cuda_fail(r, "cuIpcGetMemHandle", where->device);
  memcpy(out, &handle, sizeof handle);
  *len = sizeof handle;
  return FERRY_OK;
}

/* The VMM imports open now: import_close needs their size and handle. */
typedef struct cuda_vmm_import {
  uint64_t addr, size;
  CUmemGenericAllocationHandle handle;
} cuda_vmm_import;
static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static cuda_vmm_import *vmm_imports;
static size_t vmm_count, vmm_cap;

static int vmm_track(const cuda_vmm_import *im) {
  pthread_mutex_lock(&vmm_lock);
  if (vmm_count == vmm_cap) {
    size_t cap = vmm_cap ? vmm_cap * 2 : 4;
    cuda_vmm_import *grown = realloc(vmm_imports, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&vmm_lock);
      return -1;
    }
    vmm_imports = grown;
    vmm_cap = cap;
  }
  vmm_imports[vmm_count++] = *im;
  pthread_mutex_unlock(&vmm_lock);
  return 0;
}

/* Takes the import at addr off the list; 0: not a VMM import. */
static int vmm_untrack(uint64_t addr, cuda_vmm_import *out) {
  int found = 0;
  pthread_mutex_lock(&vmm_lock);
  for (size_t i = 0; i < vmm_count && !found; i++)
    if (vmm_imports[i].addr == addr) {
      *out = vmm_imports[i];
      vmm_imports[i] = vmm_imports[--vmm_count];
      found = 1;
    }
  pthread_mutex_unlock(&vmm_lock);
  return found;
}

/* Undoes what vmm_import did, as far as it got (context current). */
static void vmm_unmap(const cuda_vmm_import *im, int mapped) {
  if (mapped)
    cu.MemUnmap((CUdeviceptr)im->addr, im->size);
  if (im->addr)
    cu.MemAddressFree((CUdeviceptr)im->addr, im->size);
  if (im->handle)
    cu.MemRelease(im->handle);
}

/* Maps a peer's VMM allocation (its fd) read-write for device; the fd
 * stays the caller's (the driver keeps its own reference). Context
 * current. */
static ferry_status vmm_import(int device, const cuda_vmm_handle *vh, int fd, uint64_t *addr) {
  cuda_vmm_import im = {0, vh->size, 0};
  const char *call = "cuMemImportFromShareableHandle";
  CUresult r = cu.MemImportFromShareableHandle(&im.handle, (void *)(uintptr_t)fd,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUdeviceptr p = 0;
  if (r == CUDA_SUCCESS && (r = cu.MemAddressReserve(&p, im.size, 0, 0, 0)) != CUDA_SUCCESS)
    call = "cuMemAddressReserve";
  im.addr = p;
  if (r == CUDA_SUCCESS && (r = cu.MemMap(p, im.size, 0, im.handle, 0)) != CUDA_SUCCESS)
    call = "cuMemMap";
  int mapped = r == CUDA_SUCCESS;
  CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device},
                            CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  if (r == CUDA_SUCCESS && (r = cu.MemSetAccess(p, im.size, &access, 1)) != CUDA_SUCCESS)
    call = "cuMemSetAccess";
  if (r == CUDA_SUCCESS && vmm_track(&im) != 0) {
    vmm_unmap(&im, mapped);
    return ferry_fail(FERRY_ENOMEM, "cuda:%d: no memory to track a VMM import", device);
  }
  if (r != CUDA_SUCCESS) {
    vmm_unmap(&im, mapped);
    return cuda_fail(r, call, device);
  }
  *addr = p;
  return FERRY_OK;
}

/* Opens a peer's IPC handle in device's primary context (peer access
 * enabled lazily, should the allocation live on another device), or maps
 * its VMM allocation (fd). The driver refuses an IPC handle of this very
 * process: the caller uses the address itself then. */
static ferry_status cuda_import_open(int device, const void *handle, size_t len, int fd,
                                     uint64_t *addr) {
  cuda_vmm_handle vh;
  int vmm = len == sizeof vh;
  if (vmm)
    memcpy(&vh, handle, sizeof vh);
  if (vmm && (vh.magic != CUDA_VMM_MAGIC || fd < 0 || !vh.size))
    return ferry_fail(FERRY_EPROTO, "a CUDA VMM export needs its magic, size and fd");
  if (!vmm && len != sizeof(CUipcMemHandle))
    return ferry_fail(FERRY_EPROTO, "a CUDA IPC handle has %zu bytes, not %zu",
                      sizeof(CUipcMemHandle), len);
  ferry_status st = cuda_enter(device);
  if (st)
    return st;
  if (vmm) {
    st = vmm_import(device, &vh, fd, addr);
    cuda_leave();
    return st;
  }
  CUipcMemHandle h;
  memcpy(&h, handle, sizeof h);
  CUdeviceptr p = 0;
  CUresult r = cu.IpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  cuda_leave();
  if (r != CUDA_SUCCESS)
    return cuda_fail(r, "cuIpcOpenMemHandle", device);
  *addr = p;
  return FERRY_OK;
}

static void cuda_import_close(int device, uint64_t addr) {
  if (cuda_enter(device) != FERRY_OK)
    return;
  cuda_vmm_import im;
  int vmm = vmm_untrack(addr, &im);
  CUresult r = CUDA_SUCCESS;
  if (vmm)
    vmm_unmap(&im, 1);
  else
    r = cu.IpcCloseMemHandle((CUdeviceptr)addr);
  cuda_leave();
  if (r != CUDA_SUCCESS) {
    char text[160];
    FERRY_WARN("cuIpcCloseMemHandle on cuda:%d of 0x%llx failed: %s", device,
               (unsigned long long)addr, cuda_error(r, text, sizeof text));
  }
}

const ferry_memory_kind ferry_kind_cuda = {
    .name = "cuda",
    .id = FERRY_KIND_CUDA,
    .available = cuda_available,
    .identify = cuda_identify,
    .copier_open = cuda_copier_open,
    .copy_start = cuda_copy_start,
    .copy_wait = cuda_copy_wait,
    .copier_close = cuda_copier_close,
    .export_handle = cuda_export,
    .import_open = cuda_import_open,
    .import_close = cuda_import_close,
    .copy_direct = cuda_copy_direct,
};

/* ---- stream order ---------------------------------------------------------------- */
/* A fence orders a transfer on an application's stream (kind.h). The
 * stream waits, where it can, with cuStreamWaitValue32 on a word of one
 * pinned, device-mapped page: the GPU polls the word and no host thread is
 * involved. Each fence takes a word and a value one above the word's last
 * one; the release writes the value, and the word is free again at once
 * (the driver compares with wraparound: a later, larger value never
 * releases an earlier wait, and the written value releases it for good).
 * Where the driver lacks stream memory operations (CUDA_ERROR_NOT_SUPPORTED)
 * or every word is taken, the stream runs a host function that blocks until
 * the release instead: that stalls one of the driver's callback threads, so
 * it is the fallback, not the rule. */

#define FENCE_WORDS 1024

struct ferry_stream_fence {
  CUcontext ctx;
  CUstream stream;
  CUevent before; /* recorded at open, on the stream */
  int device;
  int word; /* -1: the host function waits */
  unsigned value;
  int released;  /* under lock */
  unsigned refs; /* under lock */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  char name[64];
};

static pthread_mutex_t fences_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned *fence_words; /* pinned, device-mapped; NULL until first used */
static unsigned short fence_free[FENCE_WORDS];
static unsigned fence_free_count;
static int fence_memops = 1; /* 0 once the driver said it lacks them */

/* A free word (-1: none, or no stream memory operations). Lock held;
 * the stream's context current. */
static int word_take_locked(void) {
  if (!fence_memops)
    return -1;
  if (!fence_words) {
    void *page = NULL;
    if (cu.MemHostAlloc(&page, FENCE_WORDS * sizeof *fence_words,
                        CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) != CUDA_SUCCESS)
      return -1; /* the host function serves instead */
    memset(page, 0, FENCE_WORDS * sizeof *fence_words);
    fence_words = page;
    for (unsigned i = 0; i < FENCE_WORDS; i++)
      fence_free[i] = (unsigned short)(FENCE_WORDS - 1 - i);
    fence_free_count = FENCE_WORDS;
  }
  return fence_free_count ? fence_free[--fence_free_count] : -1;
}

static void word_give(int word) {
  pthread_mutex_lock(&fences_lock);
  fence_free[fence_free_count++] = (unsigned short)word;
  pthread_mutex_unlock(&fences_lock);
}

static void fence_put(ferry_stream_fence *f) {
  if (ferry_unref_last(&f->lock, &f->cond, &f->refs))
    free(f);
}

/* Runs on the driver's callback thread: the stream goes on at release. */
static void fence_host_wait(void *arg) {
  ferry_stream_fence *f = arg;
  pthread_mutex_lock(&f->lock);
  while (!f->released)
    pthread_cond_wait(&f->cond, &f->lock);
  pthread_mutex_unlock(&f->lock);
  fence_put(f);
}

/* Queues the stream's wait for the release (the context current). */
static ferry_status fence_queue_wait(ferry_stream_fence *f) {
  pthread_mutex_lock(&fences_lock);
  f->word = word_take_locked();
  if (f->word >= 0)
    f->value = __atomic_load_n(&fence_words[f->word], __ATOMIC_RELAXED) + 1;
  pthread_mutex_unlock(&fences_lock);
  if (f->word >= 0) {
    CUdeviceptr at = 0;
    CUresult r = cu.MemHostGetDevicePointer(&at, &fence_words[f->word], 0);
    if (r == CUDA_SUCCESS)
      r = cu.StreamWaitValue32(f->stream, at, f->value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_SUCCESS)
      return FERRY_OK;
    word_give(f->word);
    f->word = -1;
    if (r != CUDA_ERROR_NOT_SUPPORTED)
      return cuda_fail(r, "cuStreamWaitValue32", f->device);
    if (__atomic_exchange_n(&fence_memops, 0, __ATOMIC_RELAXED))
      FERRY_INFO("cuda:%d: the driver has no stream memory operations; stream-ordered "
                 "transfers hold the stream with a host function instead",
                 f->device);
  }
  f->refs++; /* the host function's */
  CUresult r = cu.LaunchHostFunc(f->stream, fence_host_wait, f);
  if (r == CUDA_SUCCESS)
    return FERRY_OK;
  f->refs--;
  return cuda_fail(r, "cuLaunchHostFunc", f->device);
}

/* The stream's context, and its device, made current. */
static ferry_status fence_enter(ferry_stream_fence *f) {
  CUresult r = f->stream ? cu.StreamGetCtx(f->stream, &f->ctx) : cu.CtxGetCurrent(&f->ctx);
  if (r != CUDA_SUCCESS)
    return cuda_fail(r, "cuStreamGetCtx", -1);
  if (!f->ctx)
    return ferry_fail(FERRY_EINVAL, "stream-ordered transfer on the default stream (0): no CUDA "
                                    "context is current on this thread; pass the stream");
  if ((r = cu.CtxPushCurrent(f->ctx)) != CUDA_SUCCESS)
    return cuda_fail(r, "cuCtxPushCurrent", -1);
  CUdevice device = -1;
  cu.CtxGetDevice(&device);
  f->device = device;
  snprintf(f->name, sizeof f->name, "cuda:%d stream %p", f->device, (void *)f->stream);
  return FERRY_OK;
}

ferry_status ferry_stream_fence_open(void *stream, ferry_stream_fence **out) {
  if (!cuda_available(NULL, 0))
    return ferry_fail(FERRY_ENOTIMPL, "stream-ordered transfer: no CUDA driver (%s)", cuda_missing);
  ferry_stream_fence *f = calloc(1, sizeof *f);
  if (!f)
    return ferry_fail(FERRY_ENOMEM, "no memory for a stream fence");
  f->stream = stream;
  f->refs = 1;
  f->word = -1;
  pthread_mutex_init(&f->lock, NULL);
  pthread_cond_init(&f->cond, NULL);
  ferry_status st = fence_enter(f);
  if (st) {
    fence_put(f);
    return st;
  }
  const char *call = "cuEventCreate";
  CUresult r = cu.EventCreate(&f->before, CU_EVENT_DISABLE_TIMING);
  if (r == CUDA_SUCCESS &&
      (call = "cuEventRecord", r = cu.EventRecord(f->before, stream)) == CUDA_SUCCESS)
    st = fence_queue_wait(f);
  else
    st = cuda_fail(r, call, f->device);
  if (st && f->before)
    cu.EventDestroy(f->before);
  cuda_leave();
  if (st) {
    fence_put(f);
    return st;
  }
  f->refs++; /* the waiter's: a release may come first (a cancelled batch) */
  *out = f;
  return FERRY_OK;
}

ferry_status ferry_stream_fence_wait(ferry_stream_fence *f) {
  CUresult r = cu.CtxPushCurrent(f->ctx);
  if (r != CUDA_SUCCESS) {
    fence_put(f);
    return cuda_fail(r, "cuCtxPushCurrent", f->device);
  }
  r = cu.EventSynchronize(f->before);
  cu.EventDestroy(f->before);
  cuda_leave();
  int device = f->device;
  fence_put(f);
  if (r != CUDA_SUCCESS)
    return cuda_fail(r, "cuEventSynchronize (the work queued before the transfer)", device);
  return FERRY_OK;
}

void ferry_stream_fence_release(ferry_stream_fence *f) {
  if (f->word >= 0) {
    __atomic_store_n(&fence_words[f->word], f->value, __ATOMIC_RELEASE);
    word_give(f->word); /* the value written releases that wait for good */
  }
  pthread_mutex_lock(&f->lock);
  f->released = 1;
  pthread_cond_broadcast(&f->cond);
  pthread_mutex_unlock(&f->lock);
  fence_put(f);
}

const char *ferry_stream_fence_name(const ferry_stream_fence *f) { return f->name; }
