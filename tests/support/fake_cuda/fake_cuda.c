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
 * (cuMemRetainAllocationHandle succeeds on it, cuIpcGetMemHandle not):
 * cuMemExportToShareableHandle gives a POSIX fd for it (a duplicate of its
 * memfd), which another process imports (cuMemImportFromShareableHandle:
 * a handle holding its own duplicate), maps into an address range it
 * reserved (cuMemAddressReserve, cuMemMap: PROT_NONE for the caller and a
 * private read-write view, as IPC imports) and must make accessible
 * (cuMemSetAccess) before any copy touches it. fakeMemAllocVmmNoExport
 * stands for a VMM allocation made without a POSIX-fd handle type: its
 * export is CUDA_ERROR_NOT_SUPPORTED. Tests count the imported handles
 * opened (fakeVmmOpens), those not released yet (fakeVmmImports) and the
 * mappings of them still there (fakeVmmMaps).
 *
 * Streams keep their order as a GPU's do: the thread that waits runs the
 * queue in order, one runner per stream at a time, through what else is
 * queued there: cuStreamWaitValue32_v2 (polls its word until the value is
 * reached, as the GPU does; FAKE_CUDA_NO_STREAM_MEMOPS=1 in the
 * environment makes it CUDA_ERROR_NOT_SUPPORTED, as on a driver without
 * stream memory operations) and cuLaunchHostFunc (calls the function).
 * cuEventQuery runs what it can without blocking (it stops at a wait whose
 * value is not there, or at a host function) and says whether the event
 * was reached. For tests, fake_cuda_hold(ptr, 1) holds every copy into the
 * allocation holding ptr (it blocks where it runs) until
 * fake_cuda_hold(ptr, 0); fake_cuda_held_wait() returns once a copy is
 * blocked so: a test can hold a transfer in the middle, deterministically.
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
#include <time.h>
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
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_NOT_SUPPORTED = 801,
};
enum { ATTR_MEMORY_TYPE = 2, ATTR_IS_MANAGED = 8, ATTR_DEVICE_ORDINAL = 9 };
enum { MEMORYTYPE_HOST = 1, MEMORYTYPE_DEVICE = 2 };

#define FAKE_DEVICES 1
#define FAKE_MAX_ALLOCATIONS 256
#define FAKE_MAX_QUEUED 64

struct fake_context {
  int device;
};

/* What a stream has queued. */
typedef enum { OP_COPY, OP_MARK, OP_WAIT_VALUE, OP_HOST_FN } fake_op_kind;
typedef struct fake_op {
  fake_op_kind kind;
  void *dst; /* OP_COPY */
  const void *src;
  size_t bytes;
  struct fake_allocation *into; /* OP_COPY into device memory: may be held */
  CUevent event;                /* OP_MARK */
  const unsigned *word;         /* OP_WAIT_VALUE */
  unsigned value;
  void (*fn)(void *); /* OP_HOST_FN */
  void *data;
} fake_op;

struct fake_stream {
  fake_op ops[FAKE_MAX_QUEUED];
  unsigned count;
  int running; /* a thread runs its queue (under lock) */
  CUcontext ctx;
};

struct fake_event {
  CUstream stream; /* where it was last recorded; NULL: none pending */
  int destroyed;   /* cuEventDestroy_v2 while pending: freed when its mark runs */
};

typedef struct fake_allocation {
  uint8_t *addr;    /* what the caller holds: PROT_NONE for device memory */
  uint8_t *private; /* the fake's own read-write view (device memory) */
  size_t size;
  int device;   /* 1: device memory; 0: pinned host memory */
  int fd;       /* device memory: its memfd, named by its IPC handle */
  int imported; /* 1: opened from another process's IPC handle; 2: an
                   imported VMM handle mapped by cuMemMap */
  int vmm;      /* stands for a VMM allocation: 1 exportable as a POSIX fd,
                   2 not (fakeMemAllocVmmNoExport) */
  int access;   /* imported VMM mapping: cuMemSetAccess made it read-write */
  int mapped;   /* pinned with CU_MEMHOSTALLOC_DEVICEMAP */
  int held;     /* fake_cuda_hold: copies into it wait */
} fake_allocation;

/* What an IPC handle holds here: who exported which memfd. */
typedef struct fake_ipc {
  uint64_t magic;
  int64_t pid, fd;
  uint64_t ino, size;
} fake_ipc;
#define FAKE_IPC_MAGIC 0x4650494b45435544ull

static unsigned ipc_opens, ipc_imports;           /* under lock */
static unsigned vmm_opens, vmm_imports, vmm_maps; /* under lock */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER; /* runners, holds */
static unsigned held_waiting;                              /* copies blocked by a hold */
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
  if (handle & 1) { /* an imported one: its own duplicate of the memfd */
    close((int)(handle >> 1));
    pthread_mutex_lock(&lock);
    vmm_imports--;
    pthread_mutex_unlock(&lock);
  }
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
    *a = (fake_allocation){.addr = device,
                           .private = private,
                           .size = bytes,
                           .device = 1,
                           .fd = fd,
                           .imported = imported,
                           .vmm = vmm};
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

/* For tests: a VMM allocation made without a POSIX-fd handle type. */
CUresult fakeMemAllocVmmNoExport(CUdeviceptr *out, size_t bytes) {
  *out = 0;
  return device_alloc("fakeMemAllocVmmNoExport", out, bytes, 2);
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

/* ---- VMM sharing (POSIX fd) ------------------------------------------------------------ */
/* A handle of cuMemRetainAllocationHandle is the allocation's address
 * (even); one of cuMemImportFromShareableHandle is (fd << 1) | 1, fd its
 * own duplicate of the exporter's memfd, closed by cuMemRelease. */
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
typedef struct {
  struct {
    int type, id;
  } location;
  int flags;
} fake_access_desc;

static int imported_fd(const char *call, CUmemGenericAllocationHandle handle) {
  if (!(handle & 1))
    misuse(call, "not a handle from cuMemImportFromShareableHandle");
  return (int)(handle >> 1);
}

CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                      int type, unsigned long long flags) {
  need_init("cuMemExportToShareableHandle");
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags || (handle & 1))
    misuse("cuMemExportToShareableHandle", "only a retained handle, as a POSIX fd, no flags");
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding((const void *)(uintptr_t)handle, 1, 1);
  int vmm = a && a->addr == (uint8_t *)(uintptr_t)handle ? a->vmm : 0;
  int fd = vmm == 1 ? fcntl(a->fd, F_DUPFD_CLOEXEC, 0) : -1;
  pthread_mutex_unlock(&lock);
  if (!vmm)
    misuse("cuMemExportToShareableHandle", "not a VMM allocation's handle");
  if (vmm == 2)
    return CUDA_ERROR_NOT_SUPPORTED; /* made without a POSIX-fd handle type */
  if (fd < 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *(int *)shareable = fd;
  return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                        int type) {
  need_init("cuMemImportFromShareableHandle");
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    misuse("cuMemImportFromShareableHandle", "only POSIX fds");
  int fd = fcntl((int)(intptr_t)os_handle, F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  vmm_opens++;
  vmm_imports++;
  pthread_mutex_unlock(&lock);
  *handle = ((CUmemGenericAllocationHandle)fd << 1) | 1;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  need_init("cuMemAddressReserve");
  if (alignment || addr || flags || !size)
    misuse("cuMemAddressReserve", "only a size");
  void *at = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (at == MAP_FAILED)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = (CUdeviceptr)(uintptr_t)at;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  need_init("cuMemAddressFree");
  pthread_mutex_lock(&lock);
  int mapped = holding((const void *)(uintptr_t)ptr, 1, 1) != NULL;
  pthread_mutex_unlock(&lock);
  if (mapped)
    misuse("cuMemAddressFree", "the range is still mapped");
  munmap((void *)(uintptr_t)ptr, size);
  return CUDA_SUCCESS;
}

/* Maps the whole imported allocation over the reserved range. */
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  need_context("cuMemMap");
  struct stat st;
  int fd = imported_fd("cuMemMap", handle);
  if (offset || flags || fstat(fd, &st) != 0 || (uint64_t)st.st_size != size)
    misuse("cuMemMap", "the whole allocation, no offset or flags");
  int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (mine < 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  munmap((void *)(uintptr_t)ptr, size); /* the reservation; device_map maps there */
  CUdeviceptr at = ptr;
  CUresult r = device_map(mine, size, 2, 0, &at);
  pthread_mutex_lock(&lock);
  vmm_maps += r == CUDA_SUCCESS;
  pthread_mutex_unlock(&lock);
  return r;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const fake_access_desc *desc, size_t count) {
  need_init("cuMemSetAccess");
  if (count != 1 || desc->location.type != 1 || desc->location.id != 0 || desc->flags != 3)
    misuse("cuMemSetAccess", "one read-write grant for device 0");
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding((const void *)(uintptr_t)ptr, size, 1);
  int ok = a && a->imported == 2 && a->addr == (uint8_t *)(uintptr_t)ptr && a->size == size;
  if (ok)
    a->access = 1;
  pthread_mutex_unlock(&lock);
  if (!ok)
    misuse("cuMemSetAccess", "not a whole mapping of cuMemMap");
  return CUDA_SUCCESS;
}

/* Unmaps and keeps the range reserved, as the driver does. */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  need_init("cuMemUnmap");
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding((const void *)(uintptr_t)ptr, 1, 1);
  int ok = a && a->imported == 2 && a->size == size;
  vmm_maps -= ok;
  pthread_mutex_unlock(&lock);
  if (!ok)
    misuse("cuMemUnmap", "not a whole mapping of cuMemMap");
  release_any("cuMemUnmap", (const void *)(uintptr_t)ptr, 1, 2);
  void *at = mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (at != (void *)(uintptr_t)ptr)
    misuse("cuMemUnmap", "the reservation was taken meanwhile");
  return CUDA_SUCCESS;
}

/* For tests: imported VMM handles opened so far, those not released, and
 * the mappings of them still there. */
unsigned fakeVmmOpens(void) {
  pthread_mutex_lock(&lock);
  unsigned n = vmm_opens;
  pthread_mutex_unlock(&lock);
  return n;
}

unsigned fakeVmmImports(void) {
  pthread_mutex_lock(&lock);
  unsigned n = vmm_imports;
  pthread_mutex_unlock(&lock);
  return n;
}

unsigned fakeVmmMaps(void) {
  pthread_mutex_lock(&lock);
  unsigned n = vmm_maps;
  pthread_mutex_unlock(&lock);
  return n;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
  need_context("cuMemFree_v2");
  return release("cuMemFree_v2", (const void *)(uintptr_t)ptr, 1);
}

CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned flags) {
  need_context("cuMemHostAlloc");
  void *host = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (host == MAP_FAILED)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  fake_allocation *a = free_slot();
  if (a)
    *a = (fake_allocation){.addr = host, .size = bytes, .fd = -1, .mapped = (flags & 2) != 0};
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
  int denied = a && a->imported == 2 && !a->access;
  pthread_mutex_unlock(&lock);
  if (!view)
    misuse(call, "the device range is not inside one cuMemAlloc allocation");
  if (denied)
    misuse(call, "an imported VMM mapping that cuMemSetAccess did not make accessible");
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

/* Runs one op with the lock dropped; 0 when it would block and blocking
 * is 0 (left queued). */
static int run_op(fake_op *op, int blocking) {
  switch (op->kind) {
  case OP_COPY:
    while (op->into && op->into->held) {
      held_waiting++;
      pthread_cond_broadcast(&progress);
      pthread_cond_wait(&progress, &lock);
      held_waiting--;
    }
    memcpy(op->dst, op->src, op->bytes);
    return 1;
  case OP_MARK:
    if (op->event->destroyed)
      free(op->event);
    else
      op->event->stream = NULL;
    return 1;
  case OP_WAIT_VALUE:
    /* The GPU polls the word; so does the fake (the driver's behaviour,
     * not a test ordering events by time). */
    while ((int)(__atomic_load_n(op->word, __ATOMIC_ACQUIRE) - op->value) < 0) {
      if (!blocking)
        return 0;
      pthread_mutex_unlock(&lock);
      struct timespec poll = {0, 20000};
      nanosleep(&poll, NULL);
      pthread_mutex_lock(&lock);
    }
    return 1;
  case OP_HOST_FN:
    if (!blocking)
      return 0; /* it may block: a query cannot know */
    pthread_mutex_unlock(&lock);
    op->fn(op->data);
    pthread_mutex_lock(&lock);
    return 1;
  }
  return 1;
}

/* Runs the stream's queue in order up to and including `upto`'s mark
 * (NULL: all). Returns 1 once there; 0 when blocking is 0 and it stopped
 * at an op that would block (or another thread runs the stream). */
static int run_stream(CUstream stream, CUevent upto, int blocking) {
  pthread_mutex_lock(&lock);
  for (;;) {
    if (upto && upto->stream != stream)
      break; /* its mark ran */
    if (!upto && !stream->count && !stream->running)
      break;
    if (stream->running) {
      if (!blocking) {
        pthread_mutex_unlock(&lock);
        return 0;
      }
      pthread_cond_wait(&progress, &lock);
      continue;
    }
    stream->running = 1;
    fake_op op = stream->ops[0];
    int ran = run_op(&op, blocking);
    if (ran) {
      memmove(stream->ops, stream->ops + 1, (stream->count - 1) * sizeof *stream->ops);
      stream->count--;
    }
    stream->running = 0;
    pthread_cond_broadcast(&progress);
    if (!ran) {
      pthread_mutex_unlock(&lock);
      return 0;
    }
  }
  pthread_mutex_unlock(&lock);
  return 1;
}

/* For tests: hold (on 1) or let go (0) copies into the allocation
 * holding ptr. */
void fake_cuda_hold(CUdeviceptr ptr, int on) {
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding((const void *)(uintptr_t)ptr, 1, 1);
  if (!a)
    misuse("fake_cuda_hold", "not device memory");
  a->held = on;
  pthread_cond_broadcast(&progress);
  pthread_mutex_unlock(&lock);
}

/* For tests: returns once a copy is blocked by a hold. */
void fake_cuda_held_wait(void) {
  pthread_mutex_lock(&lock);
  while (!held_waiting)
    pthread_cond_wait(&progress, &lock);
  pthread_mutex_unlock(&lock);
}

/* Where the event's mark is queued (NULL: none pending). */
static CUstream event_stream(CUevent event) {
  pthread_mutex_lock(&lock);
  CUstream stream = event->stream;
  pthread_mutex_unlock(&lock);
  return stream;
}

CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
  need_context("cuStreamCreate");
  (void)flags;
  *stream = calloc(1, sizeof **stream);
  if (*stream)
    (*stream)->ctx = stack[depth - 1];
  return *stream ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuStreamDestroy_v2(CUstream stream) {
  need_context("cuStreamDestroy_v2");
  check_stream("cuStreamDestroy_v2", stream);
  run_stream(stream, NULL, 1); /* the driver finishes queued work first */
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
  CUstream last = event_stream(event);
  if (last)
    run_stream(last, event, 1); /* re-recorded: its last mark is moot */
  pthread_mutex_lock(&lock);
  event->stream = stream;
  pthread_mutex_unlock(&lock);
  enqueue("cuEventRecord", stream, (fake_op){.kind = OP_MARK, .event = event});
  return CUDA_SUCCESS;
}

/* Waits for the event's last mark: runs its stream's queue up to it. */
static void event_wait(const char *call, CUevent event) {
  need_context(call);
  if (!event)
    misuse(call, "no event");
  CUstream stream = event_stream(event);
  if (stream)
    run_stream(stream, event, 1);
}

CUresult cuEventSynchronize(CUevent event) {
  event_wait("cuEventSynchronize", event);
  return CUDA_SUCCESS;
}

/* As the driver: returns at once; a pending event is freed once reached
 * (destroying it waits for nothing). */
CUresult cuEventDestroy_v2(CUevent event) {
  need_context("cuEventDestroy_v2");
  if (!event)
    misuse("cuEventDestroy_v2", "no event");
  pthread_mutex_lock(&lock);
  int pending = event->stream != NULL;
  if (pending)
    event->destroyed = 1;
  pthread_mutex_unlock(&lock);
  if (!pending)
    free(event);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  need_context("cuMemcpyDtoHAsync_v2");
  check_stream("cuMemcpyDtoHAsync_v2", stream);
  check_pinned("cuMemcpyDtoHAsync_v2", dst, bytes);
  const uint8_t *from = device_view("cuMemcpyDtoHAsync_v2", src, bytes);
  enqueue("cuMemcpyDtoHAsync_v2", stream,
          (fake_op){.kind = OP_COPY, .dst = dst, .src = from, .bytes = bytes});
  return CUDA_SUCCESS;
}

/* Queues a copy to dst (seen as to); when dst is device memory the copy
 * lands only while the test does not hold it (fake_cuda_hold). */
static void enqueue_copy_to(const char *call, CUstream stream, CUdeviceptr dst, uint8_t *to,
                            const void *from, size_t bytes) {
  pthread_mutex_lock(&lock);
  fake_allocation *into = holding((const void *)(uintptr_t)dst, bytes, 1);
  pthread_mutex_unlock(&lock);
  enqueue(call, stream,
          (fake_op){.kind = OP_COPY, .dst = to, .src = from, .bytes = bytes, .into = into});
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
  need_context("cuMemcpyHtoDAsync_v2");
  check_stream("cuMemcpyHtoDAsync_v2", stream);
  check_pinned("cuMemcpyHtoDAsync_v2", src, bytes);
  uint8_t *to = device_view("cuMemcpyHtoDAsync_v2", dst, bytes);
  enqueue_copy_to("cuMemcpyHtoDAsync_v2", stream, dst, to, src, bytes);
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
  enqueue_copy_to("cuMemcpyAsync", stream, dst, to, from, bytes);
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

/* For tests: a device-to-device copy (the bench's one-process baseline),
 * done at once; cuCtxSynchronize then has nothing to wait for. */
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  need_context("cuMemcpyDtoD_v2");
  memmove(device_view("cuMemcpyDtoD_v2", dst, bytes), device_view("cuMemcpyDtoD_v2", src, bytes),
          bytes);
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  need_context("cuCtxSynchronize");
  return CUDA_SUCCESS;
}

/* For tests: a 1 GiB device with all of it free (its memory is memfds,
 * whose pages exist only once touched). */
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  need_context("cuMemGetInfo_v2");
  *free_bytes = *total_bytes = (size_t)1 << 30;
  return CUDA_SUCCESS;
}

/* ---- stream order ------------------------------------------------------------------------ */

CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx) {
  need_init("cuStreamGetCtx");
  if (!stream) { /* the legacy default stream: the current context's */
    *ctx = depth ? stack[depth - 1] : NULL;
    return depth ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  }
  *ctx = stream->ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  need_context("cuCtxGetDevice");
  *device = stack[depth - 1]->device;
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *out, void *p, unsigned flags) {
  need_context("cuMemHostGetDevicePointer_v2");
  if (flags)
    misuse("cuMemHostGetDevicePointer_v2", "flags must be 0");
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding(p, 1, 0);
  int mapped = a && a->mapped;
  pthread_mutex_unlock(&lock);
  if (!mapped)
    return CUDA_ERROR_INVALID_VALUE; /* not from cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP) */
  *out = (CUdeviceptr)(uintptr_t)p;  /* unified addressing: the same address */
  return CUDA_SUCCESS;
}

CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, unsigned value, unsigned flags) {
  need_context("cuStreamWaitValue32_v2");
  check_stream("cuStreamWaitValue32_v2", stream);
  const char *off = getenv("FAKE_CUDA_NO_STREAM_MEMOPS");
  if (off && *off == '1')
    return CUDA_ERROR_NOT_SUPPORTED;
  if (flags != 0)
    misuse("cuStreamWaitValue32_v2", "only CU_STREAM_WAIT_VALUE_GEQ is faked");
  const unsigned *word = (const unsigned *)(uintptr_t)addr;
  pthread_mutex_lock(&lock);
  fake_allocation *a = holding(word, sizeof *word, 0);
  int mapped = a && a->mapped;
  pthread_mutex_unlock(&lock);
  if (!mapped || addr % 4)
    misuse("cuStreamWaitValue32_v2", "the word is not aligned device-mapped pinned memory");
  enqueue("cuStreamWaitValue32_v2", stream,
          (fake_op){.kind = OP_WAIT_VALUE, .word = word, .value = value});
  return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(CUstream stream, void (*fn)(void *), void *data) {
  need_context("cuLaunchHostFunc");
  check_stream("cuLaunchHostFunc", stream);
  if (!fn)
    misuse("cuLaunchHostFunc", "no function");
  enqueue("cuLaunchHostFunc", stream, (fake_op){.kind = OP_HOST_FN, .fn = fn, .data = data});
  return CUDA_SUCCESS;
}

/* Runs what it can without blocking. */
CUresult cuEventQuery(CUevent event) {
  need_context("cuEventQuery");
  CUstream stream = event_stream(event);
  if (!stream)
    return CUDA_SUCCESS;
  return run_stream(stream, event, 0) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
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
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
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
