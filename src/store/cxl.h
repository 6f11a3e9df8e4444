/* cxl.h - a store client's mapping of the master's CXL pool (cxl.c,
 * --enable_cxl): the device it maps, the pool the master names at
 * REGISTER, and the place of an address of the pool in the mapping. */
#ifndef FERRY_STORE_CXL_H
#define FERRY_STORE_CXL_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "store/client.h"

/* Maps size bytes of path (a DAX device or a file at least that long)
 * into s; FERRY_EINVAL naming the path and the cause. */
ferry_status store_cxl_map(ferry_store *s, const char *path, size_t size);
void store_cxl_unmap(ferry_store *s);
/* The pool a REGISTER reply named (len 0: none): the first one is kept;
 * a later one must be the same. FERRY_EINVAL when this client and the
 * master disagree (a pool but no mapping, a mapping but no pool, a pool
 * larger than the mapping). */
ferry_status store_cxl_adopt(ferry_store *s, const char *name, size_t len, uint64_t base,
                             uint64_t size);
/* Whether segment (len bytes) is the pool. */
int store_cxl_holds(const ferry_store *s, const char *segment, size_t len);
/* Where length bytes at the pool's address addr are in the mapping; NULL
 * (FERRY_EPROTO set) for a range outside the pool. */
void *store_cxl_at(ferry_store *s, uint64_t addr, size_t length);

#endif
