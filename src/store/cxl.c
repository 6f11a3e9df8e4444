/* cxl.c - a store client's side of --enable_cxl (docs/store.md "CXL"): the
 * master keeps every value in one CXL memory device that each client on
 * the host maps itself, so a put or get is one copy between the caller's
 * buffer and that mapping, with no transfer and no peer. The master names
 * the pool at REGISTER; its addresses start at STORE_POOL_BASE. */
#include "store/cxl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "store/map.h"

ferry_status store_cxl_map(ferry_store *s, const char *path, size_t size) {
  if (!size)
    return ferry_fail(FERRY_EINVAL,
                      "ferry_store_open: cxl_path %s without cxl_size (Mooncake's "
                      "MC_CXL_DEV_SIZE): the bytes to map",
                      path);
  if (s->segment_size)
    return ferry_fail(FERRY_EINVAL,
                      "ferry_store_open: cxl_path with a segment of %zu bytes: a client of a CXL "
                      "pool contributes no segment (the pool is every client's)",
                      s->segment_size);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    return ferry_fail(FERRY_EINVAL, "ferry_store_open: cannot open the CXL device %s: %s", path,
                      strerror(e));
  }
  /* A file shorter than the mapping would kill the process (SIGBUS) at the
   * first copy past its end; a DAX device has no size to check here. */
  if (S_ISREG(st.st_mode) && (uint64_t)st.st_size < size) {
    close(fd);
    return ferry_fail(FERRY_EINVAL,
                      "ferry_store_open: the CXL device %s holds %llu bytes, fewer than the %zu "
                      "to map (cxl_size, MC_CXL_DEV_SIZE)",
                      path, (unsigned long long)st.st_size, size);
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return ferry_fail(FERRY_EINVAL,
                      "ferry_store_open: cannot map %zu bytes of the CXL device %s: %s", size, path,
                      strerror(e));
  s->cxl = p;
  s->cxl_size = size;
  return FERRY_OK;
}

void store_cxl_unmap(ferry_store *s) {
  if (s->cxl)
    munmap(s->cxl, s->cxl_size);
  s->cxl = NULL;
}

ferry_status store_cxl_adopt(ferry_store *s, const char *name, size_t len, uint64_t base,
                             uint64_t size) {
  int first = s->conn == 0;
  if (!first && (strlen(s->pool) != len || memcmp(s->pool, name, len) || s->pool_base != base ||
                 s->pool_size != size))
    return ferry_fail(FERRY_EINVAL,
                      "store master %s now has %s%.*s (%llu bytes); this client joined one with "
                      "%s%s: open the store again",
                      s->master, len ? "the CXL pool " : "no CXL pool", (int)len, name,
                      (unsigned long long)size, s->pool[0] ? "the CXL pool " : "no CXL pool",
                      s->pool);
  if (len && !s->cxl)
    return ferry_fail(FERRY_EINVAL,
                      "store master %s keeps every value in its CXL pool %.*s (--enable_cxl): "
                      "this client must map that device (setup with protocol \"cxl\", "
                      "MC_CXL_DEV_PATH and MC_CXL_DEV_SIZE; ferry_store_config.cxl_path)",
                      s->master, (int)len, name);
  if (!len && s->cxl)
    return ferry_fail(FERRY_EINVAL,
                      "this client mapped a CXL device (protocol \"cxl\", cxl_path) but store "
                      "master %s runs without --enable_cxl: start it with the flag, or set up "
                      "with another protocol",
                      s->master);
  if (len && (base != STORE_POOL_BASE || size > s->cxl_size))
    return ferry_fail(FERRY_EINVAL,
                      "store master %s's CXL pool %.*s is %llu bytes; this client mapped %zu "
                      "(MC_CXL_DEV_SIZE, cxl_size): map at least the master's --cxl_size",
                      s->master, (int)len, name, (unsigned long long)size, s->cxl_size);
  if (first) {
    memcpy(s->pool, name, len);
    s->pool[len] = '\0';
    s->pool_base = base;
    s->pool_size = size;
  }
  return FERRY_OK;
}

int store_cxl_holds(const ferry_store *s, const char *segment, size_t len) {
  return s->pool[0] && strlen(s->pool) == len && !memcmp(s->pool, segment, len);
}

void *store_cxl_at(ferry_store *s, uint64_t addr, size_t length) {
  if (addr < s->pool_base || addr - s->pool_base > s->pool_size ||
      length > s->pool_size - (addr - s->pool_base)) {
    ferry_fail(FERRY_EPROTO,
               "store master %s placed %zu bytes at 0x%llx, outside its CXL pool %s (0x%llx, "
               "%llu bytes)",
               s->master, length, (unsigned long long)addr, s->pool,
               (unsigned long long)s->pool_base, (unsigned long long)s->pool_size);
    return NULL;
  }
  return (char *)s->cxl + (addr - s->pool_base);
}
