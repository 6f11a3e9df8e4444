/* extents.h - the free space of one segment: a best-fit list of free
 * extents sorted by offset, coalesced on free, in 64-byte granules
 * (docs/store.md says why best fit, and what replaces the scan later). */
#ifndef FERRY_STORE_EXTENTS_H
#define FERRY_STORE_EXTENTS_H

#include <stddef.h>
#include <stdint.h>

#define STORE_GRANULE 64

typedef struct store_extent {
  uint64_t offset, length;
} store_extent;

typedef struct store_extents {
  store_extent *free; /* sorted by offset, disjoint, never adjacent */
  size_t count, cap;
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

#endif
