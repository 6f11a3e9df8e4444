/* host_memory.h - whether this process's CPU can read and write a range of
 * memory, asked of the kernel (its list of mappings) without touching the
 * memory. Registration refuses memory that fails it; a READ checks its
 * ranges again before its reply goes out (server.c).
 *
 * Memory kinds (kind.h): registration decides a region's kind first; the
 * regions the CPU may touch (host memory, CUDA pinned or managed memory)
 * then pass ferry_host_memory_check, device memory does not reach it. */
#ifndef FERRY_HOST_MEMORY_H
#define FERRY_HOST_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

typedef struct ferry_host_memory ferry_host_memory;

/* The first range found that the CPU cannot use as asked. */
typedef struct ferry_host_problem {
  uint64_t start, end; /* [start, end) */
  char perms[5];       /* its mapping's permissions as /proc shows them ("---p"); "" if unmapped */
} ferry_host_problem;

/* use_query: ask with the PROCMAP_QUERY ioctl where the kernel has it
 * (Linux 6.11); 0 reads /proc/self/maps's text every time (tests compare
 * the two). NULL only when out of memory. */
ferry_host_memory *ferry_host_memory_open(int use_query);
/* use_query for the engines created from now on: 1 unless a test sets 0
 * to walk the path of kernels without PROCMAP_QUERY. */
extern int ferry_host_memory_query;
void ferry_host_memory_close(ferry_host_memory *hm);
/* Whether checks cost one ioctl per mapping (else one pass over the text). */
int ferry_host_memory_has_query(const ferry_host_memory *hm);

/* Registration's test: FERRY_OK when every byte of the regions (any order)
 * is mapped readable and writable in this process; else FERRY_EFAULT with a
 * detail naming the region, the range at fault and its likely cause ("not
 * mapped for the CPU: GPU memory ...", "not mapped at all"). Costs one
 * query per covering mapping, or one pass over /proc/self/maps; never
 * touches or faults in a page. Where /proc cannot be read it says so once
 * in the log and lets the memory through. */
ferry_status ferry_host_memory_check(ferry_host_memory *hm, const ferry_region *regions,
                                     size_t count);

/* The first range at fault among `ranges` (any order): 1 with *p set, 0
 * when every byte is mapped readable (need_write: and writable), -1 when
 * it cannot tell: /proc unreadable, or cheap_only on a kernel without
 * PROCMAP_QUERY. cheap_only asks for the ioctl alone, one per mapping,
 * cheap enough for every READ (server.c); the text costs one pass over
 * every mapping of the process, for error paths. */
int ferry_host_memory_find(ferry_host_memory *hm, const ferry_region *ranges, size_t count,
                           int need_write, int cheap_only, ferry_host_problem *p);

/* "[0x1000, 0x2000) is not mapped at all" or "[0x1000, 0x2000) is mapped
 * without read or write access (---p)". */
void ferry_host_problem_describe(const ferry_host_problem *p, char *out, size_t size);

#endif
