/* cuda_double.h - the test double of the CUDA driver (support/fake_cuda,
 * loaded as libcuda.so.1 through LD_LIBRARY_PATH) as a test holds device
 * memory with it: its entry points looked up with dlsym, each call made in
 * the device's primary context pushed and popped again, so the test's own
 * thread keeps no context current (tests check ferry leaves none). Tests
 * of device memory use it (test_device_memory, test_stream_order,
 * test_device_pool); the try_ calls, without cmocka, serve a child process
 * outside any test case. */
#ifndef FERRY_TEST_CUDA_DOUBLE_H
#define FERRY_TEST_CUDA_DOUBLE_H

#include <stddef.h>
#include <stdint.h>

#define CUDA_DOUBLE_NOT_READY 600 /* CUDA_ERROR_NOT_READY */

/* Loads the fake driver once; 1 if it is there (no cmocka). */
int cuda_double_load(void);
/* Skips the test (cmocka skip()) without the fake driver. */
void cuda_double_need(void);

/* How try_alloc allocates: cuMemAlloc; fakeMemAllocVmm (memory standing
 * for a VMM allocation, exportable as a POSIX fd); fakeMemAllocVmmNoExport
 * (one that is not); fakeMemAllocAt (at *device, as freed before). */
typedef enum {
  CUDA_DOUBLE_PLAIN,
  CUDA_DOUBLE_VMM,
  CUDA_DOUBLE_VMM_NOEXPORT,
  CUDA_DOUBLE_AT
} cuda_double_kind;
/* Without cmocka: 0 or the CUDA error. */
int cuda_double_try_alloc(uint8_t **device, size_t size, cuda_double_kind kind);
int cuda_double_try_free(uint8_t *device);
int cuda_double_try_put(uint8_t *device, const void *host, size_t size);
int cuda_double_try_get(void *host, const uint8_t *device, size_t size);

/* These fail the running test on a CUDA error. */
uint8_t *cuda_double_alloc(size_t size);
void cuda_double_free(uint8_t *device);
void *cuda_double_pinned(size_t size);
void cuda_double_free_pinned(void *host);
void cuda_double_put(uint8_t *device, const void *host, size_t size);
void cuda_double_get(void *host, const uint8_t *device, size_t size);
void *cuda_double_stream(void);
void cuda_double_stream_destroy(void *stream);
/* Queues a copy on stream (to_device: host -> device). */
void cuda_double_copy_async(uint8_t *device, void *host, size_t size, int to_device, void *stream);
/* A new event recorded on stream; query: its cuEventQuery (runs what it
 * can without blocking); wait: cuEventSynchronize, then destroys it. */
void *cuda_double_record(void *stream);
int cuda_double_query(void *event);
void cuda_double_wait(void *event);
/* fake_cuda_hold / fake_cuda_held_wait (fake_cuda.c). */
void cuda_double_hold(const uint8_t *device, int on);
void cuda_double_held_wait(void);
/* Asserts no CUDA context is current on this thread. */
void cuda_double_no_context(void);
/* fakeIpcOpens / fakeIpcImports: how many imports were opened, how many
 * are still open (fake_cuda.c). */
unsigned cuda_double_ipc_opens(void);
unsigned cuda_double_ipc_imports(void);
/* fakeVmmOpens: imported VMM handles opened so far; imports: imported
 * handles not released plus mappings of them not unmapped (0: all
 * closed). */
unsigned cuda_double_vmm_opens(void);
unsigned cuda_double_vmm_imports(void);

#endif
