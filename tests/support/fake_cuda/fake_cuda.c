/* fake_cuda.c - a TEST DOUBLE of the CUDA driver (libcuda.so.1), for the
 * tests only: built as build/tests/fake_cuda/libcuda.so.1 and found by
 * ferry's dlopen through LD_LIBRARY_PATH. Never shipped or installed, and
 * no verification of the GPU path (tests/gpu is): it lets the CPU-only
 * suite check ferry's own logic around device memory.
 *
 * It implements exactly the entry points src/memory/kind_cuda.c resolves,
 * plus what a test needs to hold "device memory" as CUDA code would
 * (cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2, synchronous cuMemcpyHtoD_v2/DtoH_v2,
 * cuCtxGetCurrent), called through dlsym. One device, cuda:0.
 *
 * Device memory is a memfd mapped twice: the address handed out is a
 * PROT_NONE mapping, so a CPU touch crashes exactly as a real device
 * pointer would (and a system call given it fails with EFAULT); the fake
 * copies through a second, private read-write mapping of the same memfd.
 *
 * Asynchronous copies really are asynchronous: cuMemcpy*Async only queue
 * on their stream, and the queue runs when an event recorded after them
 * is synchronized (or the stream destroyed). So a caller that reads a
 * bounce buffer before its copy's event, or reuses one whose copy is still
 * queued, sees wrong bytes, as it would on a GPU.
 *
 * IPC across processes: an allocation keeps its memfd open, and its IPC
 * handle names the exporting pid, that descriptor and its inode; another
 * process reopens it through /proc/<pid>/fd (the same user's, as ferry's
 * shm service admits) and maps it as it maps its own device memory
 * (PROT_NONE for the caller, a private read-write view for copies). As
 * the real driver, it refuses a handle of the calling process itself and a
 * handle whose allocation is gone (the inode differs). Tests count the
 * opens (fakeIpcOpens) and the imports still open (fakeIpcImports).
 * fakeMemAllocVmm makes device memory that stands for a VMM allocation
 * (cuMemRetainAllocationHandle succeeds on it, cuIpcGetMemHandle not).
 *
 * Any entry point used wrongly (no context current where one is needed, a
 * context popped that was never pushed, a copy that leaves its device
 * allocation or its pinned host buffer, an unknown attribute, a handle
 * that was never created) prints what and aborts: a test must not pass on
 * a call the real driver would refuse or misread. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_context *CUcontext;
typedef struct fake_stream *CUstream;
typedef struct fake_event *CUevent;
typedef struct {
  char reserved[64];
} CUipcMemHandle;

/* Values from the public driver API documentation. */
enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NOT_FOUND = 500,
};
enum { ATTR_MEMORY_TYPE = 2, ATTR_IS_MANAGED = 8, ATTR_DEVICE_ORDINAL = 9 };
enum { MEMORYTYPE_HOST = 1, MEMORYTYPE_DEVICE = 2 };

#define FAKE_DEVICES 1
#define FAKE_MAX_ALLOCATIONS 256
#define FAKE_MAX_QUEUED 64

struct fake_context {
  int device;
};

/* A queued asynchronous copy, or an event's mark (event set). */
typedef struct fake_op {
  void *dst;
  const void *src;
  size_t bytes;
  CUevent event;
} fake_op;

struct fake_stream {
  fake_op ops[FAKE_MAX_QUEUED];
  unsigned count;
};

struct fake_event {
  CUstream stream; /* where it was last recorded; NULL: none pending */
};

typedef struct fake_allocation {
  uint8_t *addr;    /* what the caller holds: PROT_NONE for device memory */
  uint8_t *private; /* the fake's own read-write view (device memory) */
  size_t size;
  int device;   /* 1: device memory; 0: pinned host memory */
  int fd;       /* device memory: its memfd, named by its IPC handle */
  int imported; /* opened from another process's IPC handle */
  int vmm;      /* stands for a VMM allocation */
} fake_allocation;

/* What an IPC handle holds here: who exported which memfd. */
typedef struct fake_ipc {
  uint64_t magic;
  int64_t pid, fd;
  uint64_t ino, size;
} fake_ipc;
#define FAKE_IPC_MAGIC 0x4650494b45435544ull

static unsigned ipc_opens, ipc_imports; /* under lock */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static fake_allocation allocations[FAKE_MAX_ALLOCATIONS];
static struct fake_context contexts[FAKE_DEVICES];
static int initialized;
static __thread CUcontext stack[16]; /* this thread's current contexts */
static __thread unsigned depth;

static void misuse(const char *call, const char *what) {
  fprintf(stderr, "fake_cuda: %s used wrongly: %s\n", call, what);
  abort();
}

static void need_init(const char *call) {
  if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
    misuse(call, "called before cuInit");
}

static void need_context(const char *call) {
  need_init(call);
  if (!depth)
    misuse(call, "no CUDA context is current on this thread");
}

/* The allocation holding [p, p+bytes) (device: 1 for device memory), or
 * NULL. Lock held. */
static fake_allocation *holding(const void *p, size_t bytes, int device) {
  const uint8_t *at = p;
  for (unsigned i = 0; i < FAKE_MAX_ALLOCATIONS; i++) {
    fake_allocation *a = &allocations[i];
    if (a->addr && a->device == device && at >= a->addr && at < a->addr + a->size)
      return bytes <= (size_t)(a->addr + a->size - at) ? a : NULL;
  }
  return NULL;
}

static fake_allocation *free_slot(void) {
  for (unsigned i = 0; i < FAKE_MAX_ALLOCATIONS; i++)
    if (!allocations[i].addr)
      return &allocations[i];
  return NULL;
}

/* ---- the library, contexts, devices ----------------------------------------------- */

CUresult cuInit(unsigned flags) {
  if (flags)
    misuse("cuInit", "flags must be 0");
  __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
  need_init("cuDeviceGetCount");
  *count = FAKE_DEVICES;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  need_init("cuDeviceGet");
  if (ordinal < 0 || ordinal >= FAKE_DEVICES)
    return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
  need_init("cuDevicePrimaryCtxRetain");
  if (device < 0 || device >= FAKE_DEVICES)
    misuse("cuDevicePrimaryCtxRetain", "not a device from cuDeviceGet");
  contexts[device].device = device;
  *ctx = &contexts[device];
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  need_init("cuCtxPushCurrent_v2");
  if (ctx < &contexts[0] || ctx >= &contexts[FAKE_DEVICES])
    misuse("cuCtxPushCurrent_v2", "not a context from cuDevicePrimaryCtxRetain");
  if (depth == sizeof stack / sizeof *stack)
    misuse("cuCtxPushCurrent_v2", "contexts pushed and never popped");
  stack[depth++] = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
  need_context("cuCtxPopCurrent_v2");
  CUcontext top = stack[--depth];
  if (ctx)
    *ctx = top;
  return CUDA_SUCCESS;
}

/* For tests: the context current on this thread (NULL: none). */
CUresult cuCtxGetCurrent(CUcontext *ctx) {
  need_init("cuCtxGetCurrent");
  *ctx = depth ? stack[depth - 1] : NULL;
  return CUDA_SUCCESS;
}

/* ---- what memory is ------------------------------------------------------------------ */

CUresult cuPointerGetAttributes(unsigned count, int *attributes, void **data, CUdeviceptr ptr) {
  need_init("cuPointerGetAttributes");
  pthread_mutex_lock(&lock);
  const void *p = (const void *)(uintptr_t)ptr;
  int device = holding(p, 1, 1) != NULL;
  int known = device || holding(p, 1, 0) != NULL;
  pthread_mutex_unlock(&lock);
  if (!known)
    return CUDA_ERROR_INVALID_VALUE; /* a host pointer the driver never saw */
  for (unsigned i = 0; i < count; i++) {
    switch (attributes[i]) {
    case ATTR_MEMORY_TYPE:
      *(unsigned *)data[i] = device ? MEMORYTYPE_DEVICE : MEMORYTYPE_HOST;
      break;
    case ATTR_DEVICE_ORDINAL: *(int *)data[i] = 0; break;
    case ATTR_IS_MANAGED:
      *(unsigned char *)data[i] = 0; /* a bool, as the driver writes it */
      break;
    default: misuse("cuPointerGetAttributes", "an attribute this fake does not know");
    }
  }
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  need_context("cuMemGetAddressRange_v2");
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding((const void *)(uintptr_t)ptr, 1, 1);
  if (a) {
    *base = (CUdeviceptr)(uintptr_t)a->addr;
    *size = a->size;
  }
  pthread_mutex_unlock(&lock);
  return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr ptr) {
  need_context("cuIpcGetMemHandle");
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding((const void *)(uintptr_t)ptr, 1, 1);
  int base = a && a->addr == (uint8_t *)(uintptr_t)ptr && !a->vmm && !a->imported;
  struct stat st;
  fake_ipc ipc = {0};
  if (base && fstat(a->fd, &st) == 0)
    ipc = (fake_ipc){FAKE_IPC_MAGIC, getpid(), a->fd, (uint64_t)st.st_ino, a->size};
  pthread_mutex_unlock(&lock);
  if (!ipc.magic)
    return CUDA_ERROR_INVALID_VALUE; /* handles are per allocation, named by its base */
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &ipc, sizeof ipc);
  return CUDA_SUCCESS;
}

typedef unsigned long long CUmemGenericAllocationHandle;

/* Succeeds only for VMM allocations, as the driver's does. */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
  need_init("cuMemRetainAllocationHandle");
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding(addr, 1, 1);
  int vmm = a && a->vmm;
  pthread_mutex_unlock(&lock);
  if (!vmm)
    return CUDA_ERROR_INVALID_VALUE;
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)a->addr;
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  need_init("cuMemRelease");
  if (!handle)
    misuse("cuMemRelease", "no handle");
  return CUDA_SUCCESS;
}

/* ---- allocation ------------------------------------------------------------------------ */

static CUresult release_any(const char *call, const void *p, int device, int imported);

/* Device memory over the memfd fd (taken): a PROT_NONE mapping for the
 * caller, a read-write one for the fake. */
static CUresult device_map(int fd, size_t bytes, int imported, int vmm, CUdeviceptr *out) {
  void *at = (void *)(uintptr_t)*out; /* NULL, or where the caller wants it */
  void *device = mmap(at, bytes, PROT_NONE, MAP_SHARED | (at ? MAP_FIXED_NOREPLACE : 0), fd, 0);
  void *private = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  pthread_mutex_lock(&lock);
  fake_allocation *a = device != MAP_FAILED && private != MAP_FAILED ? free_slot() : NULL;
  if (a)
    *a = (fake_allocation){device, private, bytes, 1, fd, imported, vmm};
  pthread_mutex_unlock(&lock);
  if (!a) {
    if (device != MAP_FAILED)
      munmap(device, bytes);
    if (private != MAP_FAILED)
      munmap(private, bytes);
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *out = (CUdeviceptr)(uintptr_t)device;
  return CUDA_SUCCESS;
}

/* *out: 0, or the address the allocation must have. */
static CUresult device_alloc(const char *call, CUdeviceptr *out, size_t bytes, int vmm) {
  need_context(call);
  if (!bytes)
    return CUDA_ERROR_INVALID_VALUE;
  int fd = memfd_create("fake-cuda-device", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0) {
    if (fd >= 0)
      close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return device_map(fd, bytes, 0, vmm, out);
}

/* For tests: device memory, a PROT_NONE mapping of a memfd whose
 * read-write mapping only the fake holds. */
CUresult cuMemAlloc_v2(CUdeviceptr *out, size_t bytes) {
  *out = 0;
  return device_alloc("cuMemAlloc_v2", out, bytes, 0);
}

/* For tests: device memory at the address *at, as a caching allocator or
 * the driver may hand out an address again once it was freed. */
CUresult fakeMemAllocAt(CUdeviceptr *at, size_t bytes) {
  return device_alloc("fakeMemAllocAt", at, bytes, 0);
}

/* For tests: device memory standing for a VMM allocation. */
CUresult fakeMemAllocVmm(CUdeviceptr *out, size_t bytes) {
  *out = 0;
  return device_alloc("fakeMemAllocVmm", out, bytes, 1);
}

/* Reopens the exporter's memfd, checking it is still that allocation. */
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *out, CUipcMemHandle handle, unsigned flags) {
  need_context("cuIpcOpenMemHandle_v2");
  if (flags != 1)
    misuse("cuIpcOpenMemHandle_v2", "flags must be CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS");
  fake_ipc ipc;
  memcpy(&ipc, handle.reserved, sizeof ipc);
  if (ipc.magic != FAKE_IPC_MAGIC)
    misuse("cuIpcOpenMemHandle_v2", "not a handle from cuIpcGetMemHandle");
  if (ipc.pid == getpid())
    return CUDA_ERROR_INVALID_CONTEXT; /* the driver refuses its own process's handles */
  char path[64];
  snprintf(path, sizeof path, "/proc/%lld/fd/%lld", (long long)ipc.pid, (long long)ipc.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_ino != ipc.ino ||
      (uint64_t)st.st_size < ipc.size) {
    if (fd >= 0)
      close(fd);
    return CUDA_ERROR_INVALID_VALUE; /* the allocation is gone */
  }
  *out = 0;
  CUresult r = device_map(fd, ipc.size, 1, 0, out);
  pthread_mutex_lock(&lock);
  ipc_opens += r == CUDA_SUCCESS;
  ipc_imports += r == CUDA_SUCCESS;
  pthread_mutex_unlock(&lock);
  return r;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
  need_context("cuIpcCloseMemHandle");
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding((const void *)(uintptr_t)ptr, 1, 1);
  if (!a || !a->imported || a->addr != (uint8_t *)(uintptr_t)ptr)
    misuse("cuIpcCloseMemHandle", "not an address from cuIpcOpenMemHandle");
  ipc_imports--;
  pthread_mutex_unlock(&lock);
  return release_any("cuIpcCloseMemHandle", (const void *)(uintptr_t)ptr, 1, 1);
}

/* For tests: IPC handles opened so far, and imports still open. */
unsigned fakeIpcOpens(void) {
  pthread_mutex_lock(&lock);
  unsigned n = ipc_opens;
  pthread_mutex_unlock(&lock);
  return n;
}

unsigned fakeIpcImports(void) {
  pthread_mutex_lock(&lock);
  unsigned n = ipc_imports;
  pthread_mutex_unlock(&lock);
  return n;
}

static CUresult release_any(const char *call, const void *p, int device, int imported) {
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding(p, 1, device);
  if (!a || a->addr != p || a->imported != imported)
    misuse(call, "not the start of an allocation of this kind");
  fake_allocation gone = *a;
  memset(a, 0, sizeof *a);
  pthread_mutex_unlock(&lock);
  munmap(gone.addr, gone.size);
  if (gone.private)
    munmap(gone.private, gone.size);
  if (gone.device)
    close(gone.fd);
  return CUDA_SUCCESS;
}

static CUresult release(const char *call, const void *p, int device) {
  return release_any(call, p, device, 0);
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
  need_context("cuMemFree_v2");
  return release("cuMemFree_v2", (const void *)(uintptr_t)ptr, 1);
}

CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned flags) {
  need_context("cuMemHostAlloc");
  (void)flags;
  void *host = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (host == MAP_FAILED)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  fake_allocation *a = free_slot();
  if (a)
    *a = (fake_allocation){.addr = host, .size = bytes, .fd = -1};
  pthread_mutex_unlock(&lock);
  if (!a) {
    munmap(host, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = host;
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
  need_context("cuMemFreeHost");
  return release("cuMemFreeHost", p, 0);
}

/* ---- copies, streams, events ------------------------------------------------------------ */

/* The fake's read-write view of [ptr, ptr+bytes) of device memory. */
static uint8_t *device_view(const char *call, CUdeviceptr ptr, size_t bytes) {
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding((const void *)(uintptr_t)ptr, bytes, 1);
  uint8_t *view = a ? a->private + ((uint8_t *)(uintptr_t)ptr - a->addr) : NULL;
  pthread_mutex_unlock(&lock);
  if (!view)
    misuse(call, "the device range is not inside one cuMemAlloc allocation");
  return view;
}

static void check_pinned(const char *call, const void *host, size_t bytes) {
  pthread_mutex_lock(&lock);
  int pinned = holding(host, bytes, 0) != NULL;
  pthread_mutex_unlock(&lock);
  if (!pinned)
    misuse(call, "the host range is not inside one cuMemHostAlloc buffer");
}

static void check_stream(const char *call, CUstream stream) {
  if (!stream)
    misuse(call, "ferry must copy on its own stream, not the legacy default one");
}

static void enqueue(const char *call, CUstream stream, fake_op op) {
  pthread_mutex_lock(&lock);
  if (stream->count == FAKE_MAX_QUEUED)
    misuse(call, "too much work queued without a synchronization");
  stream->ops[stream->count++] = op;
  pthread_mutex_unlock(&lock);
}

/* Runs the stream's queue up to and including `upto`'s mark (NULL: all). */
static void run_stream(CUstream stream, CUevent upto) {
  pthread_mutex_lock(&lock);
  unsigned done = 0, end = stream->count;
  for (unsigned i = 0; upto && i < stream->count; i++)
    if (stream->ops[i].event == upto) {
      end = i + 1;
      break;
    }
  for (; done < end; done++) {
    fake_op *op = &stream->ops[done];
    if (op->event)
      op->event->stream = NULL;
    else
      memcpy(op->dst, op->src, op->bytes);
  }
  memmove(stream->ops, stream->ops + end, (stream->count - end) * sizeof *stream->ops);
  stream->count -= end;
  pthread_mutex_unlock(&lock);
}

CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
  need_context("cuStreamCreate");
  (void)flags;
  *stream = calloc(1, sizeof **stream);
  return *stream ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuStreamDestroy_v2(CUstream stream) {
  need_context("cuStreamDestroy_v2");
  check_stream("cuStreamDestroy_v2", stream);
  run_stream(stream, NULL); /* the driver finishes queued work first */
  free(stream);
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *event, unsigned flags) {
  need_context("cuEventCreate");
  (void)flags;
  *event = calloc(1, sizeof **event);
  return *event ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
  need_context("cuEventRecord");
  check_stream("cuEventRecord", stream);
  if (!event)
    misuse("cuEventRecord", "no event");
  if (event->stream)
    run_stream(event->stream, event); /* re-recorded: its last mark is moot */
  event->stream = stream;
  enqueue("cuEventRecord", stream, (fake_op){.event = event});
  return CUDA_SUCCESS;
}

/* Waits for the event's last mark: runs its stream's queue up to it. */
static void event_wait(const char *call, CUevent event) {
  need_context(call);
  if (!event)
    misuse(call, "no event");
  if (event->stream)
    run_stream(event->stream, event);
}

CUresult cuEventSynchronize(CUevent event) {
  event_wait("cuEventSynchronize", event);
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent event) {
  event_wait("cuEventDestroy_v2", event);
  free(event);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  need_context("cuMemcpyDtoHAsync_v2");
  check_stream("cuMemcpyDtoHAsync_v2", stream);
  check_pinned("cuMemcpyDtoHAsync_v2", dst, bytes);
  const uint8_t *from = device_view("cuMemcpyDtoHAsync_v2", src, bytes);
  enqueue("cuMemcpyDtoHAsync_v2", stream, (fake_op){dst, from, bytes, NULL});
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
  need_context("cuMemcpyHtoDAsync_v2");
  check_stream("cuMemcpyHtoDAsync_v2", stream);
  check_pinned("cuMemcpyHtoDAsync_v2", src, bytes);
  uint8_t *to = device_view("cuMemcpyHtoDAsync_v2", dst, bytes);
  enqueue("cuMemcpyHtoDAsync_v2", stream, (fake_op){to, src, bytes, NULL});
  return CUDA_SUCCESS;
}

/* The fake's view of p for a unified copy: device memory (its own or
 * imported) through its private mapping, anything else as host memory. */
static uint8_t *unified_view(const char *call, CUdeviceptr p, size_t bytes) {
  pthread_mutex_lock(&lock);
  int device = holding((const void *)(uintptr_t)p, 1, 1) != NULL;
  pthread_mutex_unlock(&lock);
  return device ? device_view(call, p, bytes) : (uint8_t *)(uintptr_t)p;
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  need_context("cuMemcpyAsync");
  check_stream("cuMemcpyAsync", stream);
  uint8_t *to = unified_view("cuMemcpyAsync", dst, bytes);
  const uint8_t *from = unified_view("cuMemcpyAsync", src, bytes);
  enqueue("cuMemcpyAsync", stream, (fake_op){to, from, bytes, NULL});
  return CUDA_SUCCESS;
}

/* For tests: synchronous copies from and to any host memory. */
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
  need_context("cuMemcpyHtoD_v2");
  memcpy(device_view("cuMemcpyHtoD_v2", dst, bytes), src, bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
  need_context("cuMemcpyDtoH_v2");
  memcpy(dst, device_view("cuMemcpyDtoH_v2", src, bytes), bytes);
  return CUDA_SUCCESS;
}

/* For tests: a 1 GiB device with all of it free (its memory is memfds,
 * whose pages exist only once touched). */
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  need_context("cuMemGetInfo_v2");
  *free_bytes = *total_bytes = (size_t)1 << 30;
  return CUDA_SUCCESS;
}

/* ---- errors ---------------------------------------------------------------------------- */

static const struct {
  CUresult code;
  const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
};

/* The error's name (text 0) or description (text 1). */
static CUresult describe(CUresult error, const char **out, int text) {
  for (unsigned i = 0; i < sizeof errors / sizeof *errors; i++)
    if (errors[i].code == error) {
      *out = text ? errors[i].text : errors[i].name;
      return CUDA_SUCCESS;
    }
  *out = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **name) { return describe(error, name, 0); }

CUresult cuGetErrorString(CUresult error, const char **text) { return describe(error, text, 1); }
