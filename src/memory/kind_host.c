/* kind_host.c - host memory as a memory kind: what no device driver
 * claims. Registration checks it with ferry_host_memory_check (the CPU
 * must be able to read and write it). Its copier is for the staging
 * pipeline's own sake (FERRY_STAGING=always): plain bounce buffers and a
 * copy done inline, so the pipeline that device memory takes is exercised
 * on host memory too. The copy is the kernel's (process_vm_readv/writev on
 * this process, as net.c's read-ahead): a region unmapped since it was
 * registered fails it with FERRY_EFAULT instead of crashing the process. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/error.h"
#include "memory/kind.h"

static int host_available(char *why, size_t size) {
  (void)why;
  (void)size;
  return 1;
}

static ferry_status host_identify(uint64_t addr, uint64_t length, ferry_where *where) {
  (void)addr;
  (void)length;
  *where = (ferry_where){.kind = FERRY_KIND_HOST, .cpu_access = 1, .device = -1};
  return FERRY_OK;
}

static void host_copier_close(ferry_copier *c) {
  for (unsigned i = 0; i < c->slots; i++)
    free(c->bounce[i]);
  free(c);
}

static ferry_status host_copier_open(int device, unsigned slots, size_t slot_size,
                                     ferry_copier **out) {
  ferry_copier *c = calloc(1, sizeof *c);
  if (!c)
    return ferry_fail(FERRY_ENOMEM, "no memory for a host copier");
  *c = (ferry_copier){.kind = &ferry_kind_host, .device = device, .slot_size = slot_size};
  for (; c->slots < slots; c->slots++)
    if (!(c->bounce[c->slots] = malloc(slot_size))) {
      host_copier_close(c);
      return ferry_fail(FERRY_ENOMEM, "no memory for %u bounce buffers of %zu bytes", slots,
                        slot_size);
    }
  *out = c;
  return FERRY_OK;
}

/* One copy by the kernel, or by memcpy where a seccomp filter refuses
 * process_vm_* (then guarded by the registration check alone, as net.c's
 * read-ahead is). Returns 0, or the errno of a failed copy. */
static int copy_by_kernel(void *dst, const void *src, size_t len, int to_host) {
  struct iovec memory = {(void *)(to_host ? src : dst), len},
               bounce = {to_host ? dst : (void *)src, len};
  while (bounce.iov_len) {
    ssize_t n = to_host ? process_vm_readv(getpid(), &bounce, 1, &memory, 1, 0)
                        : process_vm_writev(getpid(), &bounce, 1, &memory, 1, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno != EFAULT) {
      memcpy((uint8_t *)dst + (len - bounce.iov_len), (const uint8_t *)src + (len - bounce.iov_len),
             bounce.iov_len);
      return 0;
    }
    if (n <= 0)
      return EFAULT;
    bounce.iov_base = (uint8_t *)bounce.iov_base + n, bounce.iov_len -= (size_t)n;
    memory.iov_base = (uint8_t *)memory.iov_base + n, memory.iov_len -= (size_t)n;
  }
  return 0;
}

static ferry_status host_copy_start(ferry_copier *c, unsigned slot, uint64_t addr, size_t len,
                                    int to_host) {
  void *memory = (void *)(uintptr_t)addr;
  int err = to_host ? copy_by_kernel(c->bounce[slot], memory, len, 1)
                    : copy_by_kernel(memory, c->bounce[slot], len, 0);
  if (!err)
    return FERRY_OK;
  return ferry_fail_errno(FERRY_EFAULT, err, "copy of %zu bytes %s host memory at 0x%llx failed",
                          len, to_host ? "from" : "into", (unsigned long long)addr);
}

static ferry_status host_copy_wait(ferry_copier *c, unsigned slot) {
  (void)c;
  (void)slot;
  return FERRY_OK; /* copied inline */
}

const ferry_memory_kind ferry_kind_host = {
    .name = "cpu",
    .id = FERRY_KIND_HOST,
    .available = host_available,
    .identify = host_identify,
    .copier_open = host_copier_open,
    .copy_start = host_copy_start,
    .copy_wait = host_copy_wait,
    .copier_close = host_copier_close,
    .export_handle = NULL,
};
