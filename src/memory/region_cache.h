/* region_cache.h - an initiator's partial copy of a target's region table.
 *
 * First contact no longer fetches the whole table: the initiator asks for
 * the address ranges a batch needs (REGIONS_REQ) and merges the regions the
 * target returns, with their keys, into a sorted cache. The target checks
 * every WRITE/READ against its own registry regardless, so the cache only
 * has to be right about what it holds, not complete. */
#ifndef FERRY_REGION_CACHE_H
#define FERRY_REGION_CACHE_H

#include "ferry.h"
#include "wire/wire.h"

/* The sorted, disjoint address ranges of the entries whose remote range
 * the cache does not hold, adjacent ones joined, at most
 * FERRY_WIRE_MAX_REGION_RANGES (more are joined into covering spans, which
 * may fetch regions between them too). *spans malloc'd, *n 0 when the
 * cache holds them all. */
ferry_status ferry_region_cache_misses(const ferry_region_table *cache, const ferry_entry *entries,
                                       size_t count, ferry_region **spans, size_t *n);
/* Merges reply, the target's regions overlapping `spans` (none: its whole
 * table), into cache: within the spans and wherever a replied region
 * reaches the reply is the truth (stale cached regions there go), the rest
 * of the cache stays. Key sections must match the cache's, else the cache
 * restarts from the reply. Takes reply's memory (reply is left empty);
 * on failure the cache is unchanged. */
ferry_status ferry_region_cache_merge(ferry_region_table *cache, ferry_region_table *reply,
                                      const ferry_region *spans, size_t nspans);

#endif
