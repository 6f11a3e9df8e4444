/* vram.c - CUDA device memory for the tools (vram.h): the few driver entry
 * points an allocation needs, looked up in libcuda.so.1 at run time. The
 * driver stays loaded and the device's primary context current on the
 * calling thread, as an application's would. */
#include "vram.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#define FILL_CHUNK ((size_t)1 << 20) /* host bytes copied per fill call */

static struct {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(int *, int);
  CUresult (*PrimaryCtxRetain)(void **, int);
  CUresult (*CtxPushCurrent)(void *);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*GetErrorString)(CUresult, const char **);
} cu;

static int load(char *why, size_t size) {
  if (cu.MemAlloc)
    return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf(why, size, "dlopen(\"libcuda.so.1\") failed: %s", dlerror());
    return -1;
  }
  static const char *const names[] = {
      "cuInit",        "cuDeviceGet",  "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent_v2",
      "cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoD_v2",          "cuGetErrorString"};
  void **slots = (void **)&cu;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if ((slots[i] = dlsym(lib, names[i])) == NULL) {
      snprintf(why, size, "libcuda.so.1 has no %s", names[i]);
      memset(&cu, 0, sizeof cu);
      return -1;
    }
  return 0;
}

/* 0, or -1 with why naming the call and the driver's words. */
static int check(CUresult rc, const char *call, char *why, size_t size) {
  if (rc == 0)
    return 0;
  const char *text = NULL;
  cu.GetErrorString(rc, &text);
  snprintf(why, size, "%s failed: %s (CUresult %d)", call, text ? text : "unknown error", rc);
  return -1;
}

static int fill_device(CUdeviceptr dst, size_t size, int fill, char *why, size_t why_size) {
  size_t chunk = size < FILL_CHUNK ? size : FILL_CHUNK;
  unsigned char *host = malloc(chunk);
  if (host == NULL) {
    snprintf(why, why_size, "out of memory for a %zu-byte fill buffer", chunk);
    return -1;
  }
  memset(host, fill, chunk);
  int rc = 0;
  for (size_t at = 0; at < size && rc == 0; at += chunk)
    rc = check(cu.MemcpyHtoD(dst + at, host, size - at < chunk ? size - at : chunk),
               "cuMemcpyHtoD_v2", why, why_size);
  free(host);
  return rc;
}

int ferry_vram_alloc(int gpu, size_t size, int fill, void **out, char *why, size_t why_size) {
  int device;
  void *ctx;
  CUdeviceptr ptr = 0;
  if (load(why, why_size) != 0 || check(cu.Init(0), "cuInit", why, why_size) != 0 ||
      check(cu.DeviceGet(&device, gpu), "cuDeviceGet", why, why_size) != 0 ||
      check(cu.PrimaryCtxRetain(&ctx, device), "cuDevicePrimaryCtxRetain", why, why_size) != 0 ||
      check(cu.CtxPushCurrent(ctx), "cuCtxPushCurrent_v2", why, why_size) != 0 ||
      check(cu.MemAlloc(&ptr, size), "cuMemAlloc_v2", why, why_size) != 0)
    return -1;
  if (fill >= 0 && fill_device(ptr, size, fill, why, why_size) != 0) {
    cu.MemFree(ptr);
    return -1;
  }
  *out = (void *)(uintptr_t)ptr;
  return 0;
}

void ferry_vram_free(void *ptr) {
  if (ptr != NULL && cu.MemFree)
    cu.MemFree((CUdeviceptr)(uintptr_t)ptr);
}
