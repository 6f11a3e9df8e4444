/* registry.c - the engine's table of registered memory regions.
 *
 * Every WRITE/READ arriving from the network is checked against this table
 * before a byte of local memory is touched, so lookups must be cheap and
 * safe to run from many threads at once: the table is a sorted array of
 * disjoint regions (binary search) behind a reader/writer lock. A batch
 * register is one merge; removing leaves a hole (no memmove), and holes go
 * in one pass once they outnumber the regions, so unregistering n regions,
 * one call each or in one batch, stays O(n log n) at a million regions. A
 * single register still pays a memmove of the tail (appending is free). */
/* pthread_rwlock_t and glibc's writer-preferring kind; the build usually
 * defines it already. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "memory/registry.h"

#include "base/sync.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

typedef struct registry_where {
  uint64_t addr; /* the region's start */
  ferry_where where;
} registry_where;

struct ferry_registry {
  pthread_rwlock_t lock;
  /* Sorted by addr, addrs unique. An entry of length 0 is a hole: a removed
   * region, kept so that removing costs no memmove. Live regions are
   * pairwise disjoint, and every live region before a hole ends at or
   * before the hole's addr, so a search that lands on a hole finds nothing
   * (ferry_regions_search needs no change). */
  ferry_region *regions;
  size_t used;  /* entries in regions, holes included */
  size_t count; /* live regions */
  size_t capacity;
  uint64_t generation; /* starts at 1 so a cache zeroed at 0 is always stale */
  /* Where the regions that are not plain host memory live (kind.h),
   * sorted by their start; a region absent here is host memory. Few in
   * practice (a KV cache: one per tensor), so an insert's memmove is cheap. */
  registry_where *wheres;
  size_t where_count, where_capacity;
  /* Of those, regions the CPU cannot touch (device memory): read without
   * the lock, so that a batch pays nothing for them when there are none. */
  size_t device_regions;
};

/* Holes are squeezed out once they outnumber the live regions (and are
 * more than this many): removal is O(log n) amortized. */
#define REGISTRY_MIN_HOLES 64

/* "[0x1000, +4096)": how every region is named in error details. */
#define REGION_FMT "[0x%" PRIx64 ", +%" PRIu64 ")"

/* Region end, exclusive. Callers validated that it does not wrap. */
static uint64_t region_end(const ferry_region *r) { return r->addr + r->length; }

static int regions_identical(const ferry_region *a, const ferry_region *b) {
  return a->addr == b->addr && a->length == b->length;
}

/* Assumes a->addr <= b->addr, which is how sorted neighbours come. */
static int regions_overlap_sorted(const ferry_region *a, const ferry_region *b) {
  return region_end(a) > b->addr;
}

static ferry_status check_region(uint64_t addr, uint64_t length) {
  if (length == 0)
    return ferry_fail(FERRY_EINVAL, "register 0x%" PRIx64 ": length is 0", addr);
  if (length > UINT64_MAX - addr)
    return ferry_fail(FERRY_EINVAL, "register " REGION_FMT ": range wraps around the address space",
                      addr, length);
  return FERRY_OK;
}

static ferry_status overlap_error(const ferry_region *new_region, const ferry_region *old) {
  return ferry_fail(FERRY_EOVERLAP,
                    "register " REGION_FMT " overlaps registered region " REGION_FMT,
                    new_region->addr, new_region->length, old->addr, old->length);
}

/* First index whose region starts at or after addr (count if none). */
static size_t lower_bound(const ferry_region *sorted, size_t count, uint64_t addr) {
  size_t lo = 0, hi = count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (sorted[mid].addr < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

long ferry_regions_search(const ferry_region *sorted, size_t count, uint64_t addr,
                          uint64_t length) {
  if (length == 0 || sorted == NULL)
    return -1;
  /* The candidate is the last region starting at or before addr. */
  size_t lo = 0, hi = count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (sorted[mid].addr <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0)
    return -1;
  const ferry_region *r = &sorted[lo - 1];
  /* Offsets instead of end addresses, so nothing here can overflow. */
  uint64_t offset = addr - r->addr;
  if (offset >= r->length || length > r->length - offset)
    return -1;
  return (long)(lo - 1);
}

ferry_registry *ferry_registry_create(void) {
  ferry_registry *registry = calloc(1, sizeof *registry);
  if (registry == NULL)
    return NULL;
  if (ferry_rwlock_init(&registry->lock) != 0) {
    free(registry);
    return NULL;
  }
  registry->generation = 1;
  return registry;
}

void ferry_registry_destroy(ferry_registry *registry) {
  if (registry == NULL)
    return;
  pthread_rwlock_destroy(&registry->lock);
  free(registry->regions);
  free(registry->wheres);
  free(registry);
}

/* Makes room for `need` entries; caller holds the write lock. */
static ferry_status reserve(ferry_registry *registry, size_t need) {
  if (need <= registry->capacity)
    return FERRY_OK;
  size_t capacity = registry->capacity ? registry->capacity : 16;
  while (capacity < need)
    capacity *= 2;
  ferry_region *grown = realloc(registry->regions, capacity * sizeof *grown);
  if (grown == NULL)
    return ferry_fail(FERRY_ENOMEM, "register: cannot grow the region table to %zu entries",
                      capacity);
  registry->regions = grown;
  registry->capacity = capacity;
  return FERRY_OK;
}

static int is_hole(const ferry_region *r) { return r->length == 0; }

/* ---- where the regions live ---------------------------------------------------- */

static int is_host(const ferry_where *w) { return w->kind == FERRY_KIND_HOST && w->device < 0; }

/* Index of the first entry starting at or after addr. */
static size_t where_bound(const ferry_registry *registry, uint64_t addr) {
  size_t lo = 0, hi = registry->where_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (registry->wheres[mid].addr < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Room for `more` entries, before the table changes: the add stays all
 * or nothing. Caller holds the write lock. */
static ferry_status reserve_wheres(ferry_registry *registry, const ferry_where *wheres,
                                   size_t count) {
  size_t more = 0;
  for (size_t i = 0; wheres && i < count; i++)
    more += !is_host(&wheres[i]);
  size_t need = registry->where_count + more;
  if (need <= registry->where_capacity)
    return FERRY_OK;
  size_t capacity = registry->where_capacity ? 2 * registry->where_capacity : 16;
  while (capacity < need)
    capacity *= 2;
  registry_where *grown = realloc(registry->wheres, capacity * sizeof *grown);
  if (grown == NULL)
    return ferry_fail(FERRY_ENOMEM, "register: no memory for the kinds of %zu regions", need);
  registry->wheres = grown;
  registry->where_capacity = capacity;
  return FERRY_OK;
}

/* Counts a device region in (+1) or out (-1); others count nothing. */
static void count_device_locked(ferry_registry *registry, const ferry_where *where, int sign) {
  if (!where->cpu_access)
    __atomic_store_n(&registry->device_regions, registry->device_regions + (size_t)(long)sign,
                     __ATOMIC_RELAXED);
}

/* Records where the region starting at addr lives (room reserved). */
static void note_where_locked(ferry_registry *registry, uint64_t addr, const ferry_where *where) {
  if (is_host(where))
    return;
  size_t at = where_bound(registry, addr);
  registry_where *w = registry->wheres;
  if (at == registry->where_count || w[at].addr != addr) {
    memmove(&w[at + 1], &w[at], (registry->where_count - at) * sizeof *w);
    registry->where_count++;
  } else {
    count_device_locked(registry, &w[at].where, -1); /* the same region again */
  }
  w[at] = (registry_where){addr, *where};
  count_device_locked(registry, where, 1);
}

static void forget_where_locked(ferry_registry *registry, uint64_t addr) {
  size_t at = where_bound(registry, addr);
  registry_where *w = registry->wheres;
  if (at == registry->where_count || w[at].addr != addr)
    return;
  count_device_locked(registry, &w[at].where, -1);
  memmove(&w[at], &w[at + 1], (registry->where_count - at - 1) * sizeof *w);
  registry->where_count--;
}

/* Inserts one validated region; caller holds the write lock. Holes inside
 * the new region go (the search rule needs it); the first of them is
 * reused, so the shift is by one minus the holes dropped. */
static ferry_status insert_locked(ferry_registry *registry, const ferry_region *region) {
  ferry_region *r = registry->regions;
  size_t used = registry->used;
  size_t at = lower_bound(r, used, region->addr);
  /* A hole before `at` means every live region before it ends earlier. */
  if (at > 0 && !is_hole(&r[at - 1]) && regions_overlap_sorted(&r[at - 1], region))
    return overlap_error(region, &r[at - 1]);
  size_t holes = 0;
  while (at + holes < used && is_hole(&r[at + holes]) && r[at + holes].addr < region_end(region))
    holes++;
  if (at + holes < used) {
    const ferry_region *next = &r[at + holes];
    if (regions_identical(next, region))
      return FERRY_OK; /* registering the same buffer twice is harmless */
    if (regions_overlap_sorted(region, next))
      return overlap_error(region, next);
  }
  if (holes == 0) {
    ferry_status st = reserve(registry, used + 1);
    if (st != FERRY_OK)
      return st;
    r = registry->regions;
  }
  memmove(&r[at + 1], &r[at + holes], (used - at - holes) * sizeof *r);
  r[at] = *region;
  registry->used = used + 1 - holes;
  registry->count++;
  registry->generation++;
  return FERRY_OK;
}

ferry_status ferry_registry_add(ferry_registry *registry, uint64_t addr, uint64_t length) {
  ferry_region region = {addr, length};
  return ferry_registry_add_placed(registry, &region, NULL, 1);
}

static int compare_regions(const void *a, const void *b) {
  const ferry_region *x = a, *y = b;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  if (x->length != y->length)
    return x->length < y->length ? -1 : 1;
  return 0;
}

/* Sorts a copy of the batch and drops identical repeats; fails if two
 * different entries of the batch overlap. *out is malloc'd. */
static ferry_status prepare_batch(const ferry_region *regions, size_t count, ferry_region **out,
                                  size_t *out_count) {
  for (size_t i = 0; i < count; i++) {
    ferry_status st = check_region(regions[i].addr, regions[i].length);
    if (st != FERRY_OK)
      return st;
  }
  if (count > SIZE_MAX / sizeof(ferry_region))
    return ferry_fail(FERRY_ENOMEM, "register: batch of %zu regions is too large", count);
  ferry_region *sorted = malloc(count * sizeof *sorted);
  if (sorted == NULL)
    return ferry_fail(FERRY_ENOMEM, "register: cannot copy a batch of %zu regions", count);
  memcpy(sorted, regions, count * sizeof *sorted);
  size_t ordered = 1;
  while (ordered < count && compare_regions(&sorted[ordered - 1], &sorted[ordered]) <= 0)
    ordered++;
  if (ordered < count) /* a pool carved in address order needs no sort */
    qsort(sorted, count, sizeof *sorted, compare_regions);
  size_t kept = 0;
  for (size_t i = 0; i < count; i++) {
    if (kept > 0 && regions_identical(&sorted[kept - 1], &sorted[i]))
      continue;
    /* Sorted by start: any overlap in the batch shows up between neighbours. */
    if (kept > 0 && regions_overlap_sorted(&sorted[kept - 1], &sorted[i])) {
      ferry_status st = ferry_fail(
          FERRY_EOVERLAP, "register " REGION_FMT " overlaps " REGION_FMT " in the same batch",
          sorted[i].addr, sorted[i].length, sorted[kept - 1].addr, sorted[kept - 1].length);
      free(sorted);
      return st;
    }
    sorted[kept++] = sorted[i];
  }
  *out = sorted;
  *out_count = kept;
  return FERRY_OK;
}

/* Merges the sorted batch into a new table, refusing any overlap between a
 * batch entry and a registered one. Caller holds the write lock; the live
 * table is only replaced once the whole merge succeeded. */
static ferry_status merge_locked(ferry_registry *registry, const ferry_region *batch, size_t n) {
  const ferry_region *table = registry->regions;
  size_t m = registry->used;
  size_t capacity = registry->count + n;
  ferry_region *merged = malloc(capacity * sizeof *merged);
  if (merged == NULL)
    return ferry_fail(FERRY_ENOMEM, "register: cannot grow the region table to %zu entries",
                      capacity);
  size_t i = 0, j = 0, k = 0, added = 0;
  while (i < m || j < n) {
    /* On ties the registered entry goes first, so an identical batch entry
     * always arrives right after it and is skipped below. */
    int from_batch = i == m || (j < n && compare_regions(&batch[j], &table[i]) < 0);
    const ferry_region *next = from_batch ? &batch[j++] : &table[i++];
    if (is_hole(next))
      continue; /* the merge squeezes the holes out */
    if (k > 0 && regions_identical(&merged[k - 1], next))
      continue; /* already registered: harmless */
    if (k > 0 && regions_overlap_sorted(&merged[k - 1], next)) {
      const ferry_region *prev = &merged[k - 1];
      ferry_status st = from_batch ? overlap_error(next, prev) : overlap_error(prev, next);
      free(merged);
      return st;
    }
    merged[k++] = *next;
    added += from_batch;
  }
  if (added == 0) {
    free(merged); /* every entry was already registered */
    return FERRY_OK;
  }
  free(registry->regions);
  registry->regions = merged;
  registry->used = registry->count = k;
  registry->capacity = capacity;
  registry->generation++;
  return FERRY_OK;
}

ferry_status ferry_registry_add_many(ferry_registry *registry, const ferry_region *regions,
                                     size_t count) {
  return ferry_registry_add_placed(registry, regions, NULL, count);
}

/* One region: inserted in place; a batch: merged into a new table. */
static ferry_status add_locked(ferry_registry *registry, const ferry_region *regions,
                               const ferry_region *batch, size_t n) {
  return batch ? merge_locked(registry, batch, n) : insert_locked(registry, regions);
}

ferry_status ferry_registry_add_placed(ferry_registry *registry, const ferry_region *regions,
                                       const ferry_where *wheres, size_t count) {
  if (registry == NULL || (regions == NULL && count > 0))
    return ferry_fail(FERRY_EINVAL, "register: no registry or no regions");
  if (count == 0)
    return FERRY_OK;
  ferry_region *batch = NULL;
  size_t n = 0;
  ferry_status st = count == 1 ? check_region(regions[0].addr, regions[0].length)
                               : prepare_batch(regions, count, &batch, &n);
  if (st != FERRY_OK)
    return st;
  pthread_rwlock_wrlock(&registry->lock);
  st = reserve_wheres(registry, wheres, count);
  if (st == FERRY_OK)
    st = add_locked(registry, regions, batch, n);
  for (size_t i = 0; st == FERRY_OK && wheres && i < count; i++)
    note_where_locked(registry, regions[i].addr, &wheres[i]);
  pthread_rwlock_unlock(&registry->lock);
  free(batch);
  return st;
}

/* Drops every hole in one pass once they outnumber the live regions. */
static void squeeze_locked(ferry_registry *registry) {
  size_t holes = registry->used - registry->count;
  if (holes < REGISTRY_MIN_HOLES || holes <= registry->count)
    return;
  size_t k = 0;
  for (size_t i = 0; i < registry->used; i++)
    if (!is_hole(&registry->regions[i]))
      registry->regions[k++] = registry->regions[i];
  registry->used = k;
}

/* Turns the region starting at addr into a hole; caller holds the write
 * lock and squeezes afterwards. */
static ferry_status take_locked(ferry_registry *registry, uint64_t addr, ferry_region *out) {
  ferry_region *r = registry->regions;
  size_t at = lower_bound(r, registry->used, addr);
  if (at == registry->used || r[at].addr != addr || is_hole(&r[at]))
    return ferry_fail(FERRY_ENOTREG,
                      "unregister 0x%" PRIx64 ": not the start of a registered region", addr);
  if (out != NULL)
    *out = r[at];
  forget_where_locked(registry, addr);
  r[at].length = 0;
  registry->count--;
  registry->generation++;
  return FERRY_OK;
}

ferry_status ferry_registry_remove(ferry_registry *registry, uint64_t addr) {
  return ferry_registry_take(registry, addr, NULL);
}

ferry_status ferry_registry_take(ferry_registry *registry, uint64_t addr, ferry_region *out) {
  if (registry == NULL)
    return ferry_fail(FERRY_EINVAL, "unregister: no registry");
  pthread_rwlock_wrlock(&registry->lock);
  ferry_status st = take_locked(registry, addr, out);
  squeeze_locked(registry);
  pthread_rwlock_unlock(&registry->lock);
  return st;
}

ferry_status ferry_registry_take_many(ferry_registry *registry, ferry_region *regions, size_t count,
                                      size_t *taken) {
  *taken = 0;
  if (registry == NULL || (regions == NULL && count > 0))
    return ferry_fail(FERRY_EINVAL, "unregister batch: no registry or no regions");
  ferry_status first = FERRY_OK;
  char detail[FERRY_ERROR_MAX] = "";
  size_t n = 0;
  pthread_rwlock_wrlock(&registry->lock);
  for (size_t i = 0; i < count; i++) {
    ferry_status st = take_locked(registry, regions[i].addr, &regions[n]);
    n += st == FERRY_OK;
    if (st != FERRY_OK && first == FERRY_OK) {
      first = st;
      snprintf(detail, sizeof detail, "%s", ferry_last_error());
    }
  }
  squeeze_locked(registry);
  pthread_rwlock_unlock(&registry->lock);
  *taken = n;
  if (first != FERRY_OK)
    ferry_error_set_detail(detail);
  return first;
}

int ferry_registry_contains(ferry_registry *registry, uint64_t addr, uint64_t length) {
  if (registry == NULL)
    return 0;
  pthread_rwlock_rdlock(&registry->lock);
  long at = ferry_regions_search(registry->regions, registry->used, addr, length);
  pthread_rwlock_unlock(&registry->lock);
  return at >= 0;
}

int ferry_registry_find(ferry_registry *registry, uint64_t addr, ferry_region *out) {
  if (registry == NULL)
    return 0;
  pthread_rwlock_rdlock(&registry->lock);
  long at = ferry_regions_search(registry->regions, registry->used, addr, 1);
  if (at >= 0 && out != NULL)
    *out = registry->regions[at];
  pthread_rwlock_unlock(&registry->lock);
  return at >= 0;
}

int ferry_registry_where(ferry_registry *registry, uint64_t addr, uint64_t length,
                         ferry_where *out) {
  if (registry == NULL)
    return 0;
  pthread_rwlock_rdlock(&registry->lock);
  long at = ferry_regions_search(registry->regions, registry->used, addr, length);
  if (at >= 0) {
    uint64_t start = registry->regions[at].addr;
    size_t w = where_bound(registry, start);
    if (w < registry->where_count && registry->wheres[w].addr == start)
      *out = registry->wheres[w].where;
    else
      *out = (ferry_where){.kind = FERRY_KIND_HOST, .cpu_access = 1, .device = -1};
  }
  pthread_rwlock_unlock(&registry->lock);
  return at >= 0;
}

size_t ferry_registry_device_regions(ferry_registry *registry) {
  return registry ? __atomic_load_n(&registry->device_regions, __ATOMIC_RELAXED) : 0;
}

/* Appends r to a growing copy; 0 when out of memory. */
static int append(ferry_region **out, size_t *n, size_t *capacity, const ferry_region *r) {
  if (*n == *capacity) {
    size_t grown = *capacity ? 2 * *capacity : 64;
    ferry_region *p = realloc(*out, grown * sizeof *p);
    if (p == NULL)
      return 0;
    *out = p;
    *capacity = grown;
  }
  (*out)[(*n)++] = *r;
  return 1;
}

/* Live regions overlapping any of the sorted, disjoint ranges (each
 * region once), or every region when there are none. Read lock held. */
static ferry_status collect_locked(ferry_registry *registry, const ferry_region *ranges,
                                   size_t nranges, ferry_region **out, size_t *n) {
  const ferry_region *r = registry->regions;
  size_t capacity = 0, i = 0;
  for (size_t k = 0; k == 0 || k < nranges; k++) {
    uint64_t lo = nranges ? ranges[k].addr : 0;
    uint64_t hi = nranges ? ranges[k].addr + ranges[k].length : UINT64_MAX;
    /* From the last entry starting at or before lo: it may reach into it. */
    size_t from = lower_bound(r, registry->used, lo);
    if (from > 0 && (from == registry->used || r[from].addr > lo))
      from--;
    if (from > i) /* entries before i ended before the previous range did */
      i = from;
    for (; i < registry->used && r[i].addr < hi; i++) {
      if (is_hole(&r[i]) || region_end(&r[i]) <= lo)
        continue;
      if (*n > 0 && (*out)[*n - 1].addr == r[i].addr)
        continue; /* already in, through the previous range */
      if (!append(out, n, &capacity, &r[i]))
        return ferry_fail(FERRY_ENOMEM, "copy of %zu regions: out of memory", *n + 1);
    }
  }
  return FERRY_OK;
}

ferry_status ferry_registry_overlapping(ferry_registry *registry, const ferry_region *ranges,
                                        size_t nranges, ferry_region **out, size_t *count) {
  *out = NULL;
  *count = 0;
  if (registry == NULL)
    return FERRY_OK;
  pthread_rwlock_rdlock(&registry->lock);
  ferry_status st = collect_locked(registry, ranges, nranges, out, count);
  pthread_rwlock_unlock(&registry->lock);
  if (st != FERRY_OK) {
    free(*out);
    *out = NULL;
    *count = 0;
  }
  return st;
}

size_t ferry_registry_snapshot(ferry_registry *registry, ferry_region **out) {
  size_t count = 0;
  ferry_registry_overlapping(registry, NULL, 0, out, &count);
  return count;
}

size_t ferry_registry_count(ferry_registry *registry) {
  if (registry == NULL)
    return 0;
  pthread_rwlock_rdlock(&registry->lock);
  size_t count = registry->count;
  pthread_rwlock_unlock(&registry->lock);
  return count;
}

uint64_t ferry_registry_generation(ferry_registry *registry) {
  if (registry == NULL)
    return 0;
  pthread_rwlock_rdlock(&registry->lock);
  uint64_t generation = registry->generation;
  pthread_rwlock_unlock(&registry->lock);
  return generation;
}
