/* extents.h - the free space of one segment: best-fit free extents,
 * coalesced on free, in 64-byte granules, indexed by offset and by size so
 * every call is O(log n) in the free extents (docs/store.md says why best
 * fit and what each call costs). */
#ifndef FERRY_STORE_EXTENTS_H
#define FERRY_STORE_EXTENTS_H

#include <stddef.h>
#include <stdint.h>

#define STORE_GRANULE 64

typedef struct store_extent {
  uint64_t offset, length;
} store_extent;

/* One free extent, a node of both trees (extents.c). */
typedef struct store_extent_node store_extent_node;

typedef struct store_extents {
  /* The same nodes in two AVL trees: by offset (neighbours, containment)
   * and by (length, offset) (best fit). Extents are disjoint and never
   * adjacent. Read count and free_bytes; the trees are extents.c's. */
  store_extent_node *by_offset, *by_length;
  size_t count; /* free extents */
  uint64_t free_bytes;
} store_extents;

/* All of [0, size) free (rounded down to granules); -1 without memory. */
int store_extents_init(store_extents *x, uint64_t size);
void store_extents_destroy(store_extents *x);
/* The granule-rounded length an allocation of length takes. */
uint64_t store_extents_round(uint64_t length);
/* Takes the smallest free extent that fits length (rounded); its offset in
 * *offset. -1 when none fits. */
int store_extents_alloc(store_extents *x, uint64_t length, uint64_t *offset);
/* Gives [offset, offset + length) back (length as passed to alloc), merged
 * with free neighbours. Returns the length of the free extent it is now
 * part of (what an allocation waiting for room needs to know); 0 without
 * memory for a new extent (the space is then lost, never handed out
 * twice). */
uint64_t store_extents_free(store_extents *x, uint64_t offset, uint64_t length);
/* Takes exactly [offset, offset + length) (length rounded), which must lie
 * inside one free extent: a new leader restores the replicas its journal
 * names (HA, ha.c). -1 when it does not, or without memory. */
int store_extents_take(store_extents *x, uint64_t offset, uint64_t length);
/* The largest free extent, for the "pool full" message. */
uint64_t store_extents_largest(const store_extents *x);
/* The first free extent that starts at or after offset, in *extent; -1
 * when none. Walks the free list in offset order (tests, diagnostics). */
int store_extents_next(const store_extents *x, uint64_t offset, store_extent *extent);

#endif
