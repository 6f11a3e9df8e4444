/* registry.h - the set of memory regions an engine has registered.
 *
 * A sorted array of disjoint [addr, addr+length) ranges: lookups are a binary
 * search (O(log n) over a million regions), a batch register one merge,
 * unregister O(log n) amortized (it leaves a hole, squeezed out later), a
 * single register a memmove of the tail. Every access from the network is
 * checked here before memory is touched. */
#ifndef FERRY_REGISTRY_H
#define FERRY_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "memory/kind.h"

typedef struct ferry_registry ferry_registry;

ferry_registry *ferry_registry_create(void);
void ferry_registry_destroy(ferry_registry *registry);

/* Adds [addr, addr+length). An identical region already present: FERRY_OK.
 * Overlap with a different region: FERRY_EOVERLAP. length 0 or wrap-around:
 * FERRY_EINVAL. Sets the error detail on failure. */
ferry_status ferry_registry_add(ferry_registry *registry, uint64_t addr, uint64_t length);
/* All or nothing: on any failure no region of the batch stays added. */
ferry_status ferry_registry_add_many(ferry_registry *registry, const ferry_region *regions,
                                     size_t count);
/* ferry_registry_add (count 1) or _add_many that also records where each
 * region lives (wheres[i] for regions[i]; NULL: all host memory), under
 * the same lock: no request sees a region before its kind. */
ferry_status ferry_registry_add_placed(ferry_registry *registry, const ferry_region *regions,
                                       const ferry_where *wheres, size_t count);
/* Nonzero when [addr, addr+length) lies inside one registered region;
 * *out then says where that region lives. */
int ferry_registry_where(ferry_registry *registry, uint64_t addr, uint64_t length,
                         ferry_where *out);
/* How many registered regions the CPU cannot touch (device memory; not
 * pinned or managed memory). One relaxed load, no lock: 0 lets a caller
 * skip looking for device memory; a region registered meanwhile is seen
 * by the next call. */
size_t ferry_registry_device_regions(ferry_registry *registry);
/* Removes the region starting at addr; FERRY_ENOTREG if there is none. */
ferry_status ferry_registry_remove(ferry_registry *registry, uint64_t addr);
/* ferry_registry_remove that also hands back the region removed (out may be
 * NULL), so an unregister knows which range to fence. */
ferry_status ferry_registry_take(ferry_registry *registry, uint64_t addr, ferry_region *out);
/* Removes many regions under one lock, with at most one pass over the
 * table: on entry regions[i].addr names each region to remove; on return
 * regions[0..*taken) are the regions removed. An address that starts no
 * region is skipped; the first such failure is returned (FERRY_ENOTREG,
 * with its detail) after the others were removed. */
ferry_status ferry_registry_take_many(ferry_registry *registry, ferry_region *regions, size_t count,
                                      size_t *taken);
/* Nonzero when [addr, addr+length) lies inside one registered region. */
int ferry_registry_contains(ferry_registry *registry, uint64_t addr, uint64_t length);
/* The region holding addr, if any. */
int ferry_registry_find(ferry_registry *registry, uint64_t addr, ferry_region *out);
/* Sorted copy of the regions overlapping any of `ranges` (sorted and
 * disjoint; none: every region), each once. *out is malloc'd (NULL when
 * empty); FERRY_ENOMEM with detail. O(log n) per range plus the copy. */
ferry_status ferry_registry_overlapping(ferry_registry *registry, const ferry_region *ranges,
                                        size_t nranges, ferry_region **out, size_t *count);
/* Sorted copy of every region (malloc'd, NULL when empty). */
size_t ferry_registry_snapshot(ferry_registry *registry, ferry_region **out);
size_t ferry_registry_count(ferry_registry *registry);
/* Bumped on every change, so cached copies know they are stale. */
uint64_t ferry_registry_generation(ferry_registry *registry);

/* Binary search in a sorted, disjoint table (no locking): the region index
 * containing [addr, addr+length), or -1. */
long ferry_regions_search(const ferry_region *sorted, size_t count, uint64_t addr, uint64_t length);

#endif
