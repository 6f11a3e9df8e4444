/* cuda_driver.h - the few CUDA driver API types, constants and entry
 * points ferry uses, declared from the public driver API documentation so
 * that the build needs no CUDA toolkit: kind_cuda.c loads libcuda.so.1 at
 * run time and looks each one up by name. Only kind_cuda.c includes it. */
#ifndef FERRY_CUDA_DRIVER_H
#define FERRY_CUDA_DRIVER_H

#include <stddef.h>

typedef int CUresult; /* CUDA_SUCCESS or a CUDA_ERROR_* */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_CONTEXT 201

#define CU_IPC_HANDLE_SIZE 64
typedef struct CUipcMemHandle {
  char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;

/* CUpointer_attribute */
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9

/* CUmemorytype */
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEMORYTYPE_ARRAY 3
#define CU_MEMORYTYPE_UNIFIED 4

#define CU_STREAM_NON_BLOCKING 1
#define CU_EVENT_DISABLE_TIMING 2
#define CU_MEMHOSTALLOC_PORTABLE 1
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1

typedef unsigned long long CUmemGenericAllocationHandle;

/* VMM sharing: CUmemAllocationHandleType, CUmemLocationType,
 * CUmemAccess_flags and CUmemAccessDesc. */
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
typedef struct CUmemLocation {
  int type;
  int id;
} CUmemLocation;
typedef struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;
} CUmemAccessDesc;

/* The entry points, each looked up under the name given in kind_cuda.c
 * (the _v2 names where the API has them). */
typedef struct ferry_cuda_api {
  CUresult (*Init)(unsigned flags);
  CUresult (*DeviceGetCount)(int *count);
  CUresult (*DeviceGet)(CUdevice *device, int ordinal);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice device);
  CUresult (*CtxPushCurrent)(CUcontext ctx);
  CUresult (*CtxPopCurrent)(CUcontext *ctx);
  CUresult (*PointerGetAttributes)(unsigned count, int *attributes, void **data, CUdeviceptr ptr);
  CUresult (*MemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
  CUresult (*MemHostAlloc)(void **p, size_t size, unsigned flags);
  CUresult (*MemFreeHost)(void *p);
  CUresult (*StreamCreate)(CUstream *stream, unsigned flags);
  CUresult (*StreamDestroy)(CUstream stream);
  CUresult (*EventCreate)(CUevent *event, unsigned flags);
  CUresult (*EventRecord)(CUevent event, CUstream stream);
  CUresult (*EventSynchronize)(CUevent event);
  CUresult (*EventDestroy)(CUevent event);
  CUresult (*MemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
  CUresult (*IpcGetMemHandle)(CUipcMemHandle *handle, CUdeviceptr ptr);
  CUresult (*GetErrorName)(CUresult error, const char **name);
  CUresult (*GetErrorString)(CUresult error, const char **text);
  CUresult (*IpcOpenMemHandle)(CUdeviceptr *ptr, CUipcMemHandle handle, unsigned flags);
  CUresult (*IpcCloseMemHandle)(CUdeviceptr ptr);
  CUresult (*MemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
  CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *handle, void *addr);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle handle);
  /* Stream-ordered transfers (kind_cuda.c's fences). */
  CUresult (*StreamGetCtx)(CUstream stream, CUcontext *ctx);
  CUresult (*CtxGetCurrent)(CUcontext *ctx);
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr *dptr, void *p, unsigned flags);
  CUresult (*StreamWaitValue32)(CUstream stream, CUdeviceptr addr, unsigned value, unsigned flags);
  CUresult (*LaunchHostFunc)(CUstream stream, void (*fn)(void *), void *data);
  CUresult (*CtxGetDevice)(CUdevice *device);
  /* VMM allocations shared with a same-host peer (a POSIX fd). */
  CUresult (*MemExportToShareableHandle)(void *shareable, CUmemGenericAllocationHandle handle,
                                         int type, unsigned long long flags);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *handle, void *os_handle,
                                           int type);
  CUresult (*MemAddressReserve)(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                unsigned long long flags);
  CUresult (*MemAddressFree)(CUdeviceptr ptr, size_t size);
  CUresult (*MemMap)(CUdeviceptr ptr, size_t size, size_t offset,
                     CUmemGenericAllocationHandle handle, unsigned long long flags);
  CUresult (*MemUnmap)(CUdeviceptr ptr, size_t size);
  CUresult (*MemSetAccess)(CUdeviceptr ptr, size_t size, const struct CUmemAccessDesc *desc,
                           size_t count);
} ferry_cuda_api;

/* Stream-ordered transfers. */
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CU_MEMHOSTALLOC_DEVICEMAP 2
#define CU_STREAM_WAIT_VALUE_GEQ 0

#endif
