/* extents.c - best-fit allocation inside one segment (extents.h). The free
 * list is an array sorted by offset: a free finds its place by binary
 * search and merges with both neighbours, so freed space always comes back
 * as whole extents. */
#include "store/extents.h"

#include <stdlib.h>
#include <string.h>

int store_extents_init(store_extents *x, uint64_t size) {
  memset(x, 0, sizeof *x);
  size -= size % STORE_GRANULE;
  if (size == 0)
    return 0;
  x->free = malloc(sizeof *x->free * 4);
  if (!x->free)
    return -1;
  x->cap = 4;
  x->free[0] = (store_extent){0, size};
  x->count = 1;
  x->free_bytes = size;
  return 0;
}

void store_extents_destroy(store_extents *x) {
  free(x->free);
  memset(x, 0, sizeof *x);
}

uint64_t store_extents_round(uint64_t length) {
  return (length + STORE_GRANULE - 1) / STORE_GRANULE * STORE_GRANULE;
}

static void remove_at(store_extents *x, size_t i) {
  memmove(&x->free[i], &x->free[i + 1], (x->count - i - 1) * sizeof *x->free);
  x->count--;
}

int store_extents_alloc(store_extents *x, uint64_t length, uint64_t *offset) {
  uint64_t need = store_extents_round(length ? length : 1);
  size_t best = x->count;
  for (size_t i = 0; i < x->count; i++)
    if (x->free[i].length >= need && (best == x->count || x->free[i].length < x->free[best].length))
      best = i;
  if (best == x->count)
    return -1;
  store_extent *e = &x->free[best];
  *offset = e->offset;
  e->offset += need;
  e->length -= need;
  if (e->length == 0)
    remove_at(x, best);
  x->free_bytes -= need;
  return 0;
}

/* The index of the first extent at or after offset. */
static size_t position(const store_extents *x, uint64_t offset) {
  size_t lo = 0, hi = x->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (x->free[mid].offset < offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

uint64_t store_extents_free(store_extents *x, uint64_t offset, uint64_t length) {
  uint64_t len = store_extents_round(length ? length : 1);
  size_t i = position(x, offset);
  int joins_prev = i > 0 && x->free[i - 1].offset + x->free[i - 1].length == offset;
  int joins_next = i < x->count && offset + len == x->free[i].offset;
  x->free_bytes += len;
  if (joins_prev && joins_next) {
    x->free[i - 1].length += len + x->free[i].length;
    remove_at(x, i);
    return x->free[i - 1].length;
  }
  if (joins_prev)
    return x->free[i - 1].length += len;
  if (joins_next) {
    x->free[i].offset = offset;
    return x->free[i].length += len;
  }
  if (x->count == x->cap) {
    size_t cap = x->cap ? x->cap * 2 : 4;
    store_extent *grown = realloc(x->free, cap * sizeof *grown);
    if (!grown) {
      x->free_bytes -= len;
      return 0;
    }
    x->free = grown;
    x->cap = cap;
  }
  memmove(&x->free[i + 1], &x->free[i], (x->count - i) * sizeof *x->free);
  x->free[i] = (store_extent){offset, len};
  x->count++;
  return len;
}

int store_extents_take(store_extents *x, uint64_t offset, uint64_t length) {
  uint64_t need = store_extents_round(length ? length : 1);
  size_t i = position(x, offset + 1); /* past the extent that may hold offset */
  if (i == 0 || offset % STORE_GRANULE || offset + need < offset)
    return -1;
  store_extent *e = &x->free[i - 1];
  uint64_t end = e->offset + e->length;
  if (offset < e->offset || offset + need > end)
    return -1;
  if (offset > e->offset && offset + need < end) { /* a hole in the middle: one extent more */
    if (x->count == x->cap) {
      store_extent *grown = realloc(x->free, x->cap * 2 * sizeof *grown);
      if (!grown)
        return -1;
      x->free = grown;
      x->cap *= 2;
      e = &x->free[i - 1];
    }
    memmove(&x->free[i + 1], &x->free[i], (x->count - i) * sizeof *x->free);
    x->count++;
    x->free[i] = (store_extent){offset + need, end - offset - need};
    e->length = offset - e->offset;
  } else if (offset > e->offset) {
    e->length -= need;
  } else if (offset + need < end) {
    e->offset += need;
    e->length -= need;
  } else {
    remove_at(x, i - 1);
  }
  x->free_bytes -= need;
  return 0;
}

uint64_t store_extents_largest(const store_extents *x) {
  uint64_t largest = 0;
  for (size_t i = 0; i < x->count; i++)
    if (x->free[i].length > largest)
      largest = x->free[i].length;
  return largest;
}
