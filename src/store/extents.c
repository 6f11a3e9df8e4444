/* extents.c - best-fit allocation inside one segment (extents.h). Each free
 * extent is one node in two AVL trees: by offset, where a free finds both
 * neighbours to merge with and a take finds the extent that holds its
 * range, and by (length, offset), where an allocation finds the smallest
 * extent that fits, the lowest offset among equals. A change of length
 * moves the node in the size tree only: extents are disjoint, so growing or
 * shrinking one never changes its place among the offsets. Every call is
 * O(log n) in the free extents; a segment holding millions of objects freed
 * in any order (a client's death) costs the master no more per object than
 * an empty one. */
#include "store/extents.h"

#include <stdlib.h>
#include <string.h>

enum { BY_OFFSET, BY_LENGTH, TREES };

struct store_extent_node {
  uint64_t offset, length;
  store_extent_node *kid[TREES][2]; /* [tree][0: before, 1: after] */
  int height[TREES];
};

/* ---- the AVL trees: one implementation, the tree named by t ------------------------------ */

static int before(int t, const store_extent_node *a, const store_extent_node *b) {
  if (t == BY_OFFSET || a->length == b->length)
    return a->offset < b->offset;
  return a->length < b->length;
}

static int height(int t, const store_extent_node *n) { return n ? n->height[t] : 0; }

static void measure(int t, store_extent_node *n) {
  int l = height(t, n->kid[t][0]), r = height(t, n->kid[t][1]);
  n->height[t] = 1 + (l > r ? l : r);
}

/* Lifts n's child on side over n; returns the child. */
static store_extent_node *rotate(int t, store_extent_node *n, int side) {
  store_extent_node *k = n->kid[t][side];
  n->kid[t][side] = k->kid[t][!side];
  k->kid[t][!side] = n;
  measure(t, n);
  measure(t, k);
  return k;
}

/* Restores the AVL bound at n after one insert or removal below it. */
static store_extent_node *balance(int t, store_extent_node *n) {
  measure(t, n);
  int skew = height(t, n->kid[t][1]) - height(t, n->kid[t][0]);
  if (skew < -1 || skew > 1) {
    int side = skew > 0; /* the taller side */
    store_extent_node *k = n->kid[t][side];
    if (height(t, k->kid[t][!side]) > height(t, k->kid[t][side]))
      n->kid[t][side] = rotate(t, k, !side); /* the zig-zag case: straighten it first */
    n = rotate(t, n, side);
  }
  return n;
}

static store_extent_node *insert(int t, store_extent_node *root, store_extent_node *n) {
  if (!root) {
    n->kid[t][0] = n->kid[t][1] = NULL;
    n->height[t] = 1;
    return n;
  }
  int side = before(t, root, n);
  root->kid[t][side] = insert(t, root->kid[t][side], n);
  return balance(t, root);
}

/* Unlinks the leftmost node under root into *min. */
static store_extent_node *remove_min(int t, store_extent_node *root, store_extent_node **min) {
  if (!root->kid[t][0]) {
    *min = root;
    return root->kid[t][1];
  }
  root->kid[t][0] = remove_min(t, root->kid[t][0], min);
  return balance(t, root);
}

/* Unlinks n, which is in the tree with the key it had when inserted. */
static store_extent_node *unlink_node(int t, store_extent_node *root, store_extent_node *n) {
  if (root != n) {
    int side = before(t, root, n);
    root->kid[t][side] = unlink_node(t, root->kid[t][side], n);
    return balance(t, root);
  }
  if (!n->kid[t][0] || !n->kid[t][1])
    return n->kid[t][!n->kid[t][0]];
  store_extent_node *next;
  store_extent_node *right = remove_min(t, n->kid[t][1], &next);
  next->kid[t][0] = n->kid[t][0];
  next->kid[t][1] = right;
  return balance(t, next);
}

/* ---- the free list on those trees --------------------------------------------------------- */

static void add(store_extents *x, store_extent_node *n) {
  x->by_offset = insert(BY_OFFSET, x->by_offset, n);
  x->by_length = insert(BY_LENGTH, x->by_length, n);
  x->count++;
}

static void drop(store_extents *x, store_extent_node *n) {
  x->by_offset = unlink_node(BY_OFFSET, x->by_offset, n);
  x->by_length = unlink_node(BY_LENGTH, x->by_length, n);
  x->count--;
  free(n);
}

/* Gives n a new offset and length: its place by offset holds (the caller
 * keeps it between its neighbours), its place by size moves. */
static void reshape(store_extents *x, store_extent_node *n, uint64_t offset, uint64_t length) {
  x->by_length = unlink_node(BY_LENGTH, x->by_length, n);
  n->offset = offset;
  n->length = length;
  x->by_length = insert(BY_LENGTH, x->by_length, n);
}

/* The last extent that starts before offset in *prev, the first at or
 * after it in *next (either NULL). */
static void around(const store_extents *x, uint64_t offset, store_extent_node **prev,
                   store_extent_node **next) {
  *prev = *next = NULL;
  for (store_extent_node *n = x->by_offset; n;) {
    if (n->offset < offset)
      *prev = n, n = n->kid[BY_OFFSET][1];
    else
      *next = n, n = n->kid[BY_OFFSET][0];
  }
}

static store_extent_node *new_node(uint64_t offset, uint64_t length) {
  store_extent_node *n = malloc(sizeof *n);
  if (n)
    n->offset = offset, n->length = length;
  return n;
}

int store_extents_init(store_extents *x, uint64_t size) {
  memset(x, 0, sizeof *x);
  size -= size % STORE_GRANULE;
  if (size == 0)
    return 0;
  store_extent_node *n = new_node(0, size);
  if (!n)
    return -1;
  add(x, n);
  x->free_bytes = size;
  return 0;
}

/* Post-order over the offset tree: O(n), recursion as deep as the tree. */
static void free_tree(store_extent_node *n) {
  if (!n)
    return;
  free_tree(n->kid[BY_OFFSET][0]);
  free_tree(n->kid[BY_OFFSET][1]);
  free(n);
}

void store_extents_destroy(store_extents *x) {
  free_tree(x->by_offset);
  memset(x, 0, sizeof *x);
}

uint64_t store_extents_round(uint64_t length) {
  return (length + STORE_GRANULE - 1) / STORE_GRANULE * STORE_GRANULE;
}

int store_extents_alloc(store_extents *x, uint64_t length, uint64_t *offset) {
  uint64_t need = store_extents_round(length ? length : 1);
  store_extent_node *best = NULL; /* the least (length, offset) with length >= need */
  for (store_extent_node *n = x->by_length; n;) {
    if (n->length >= need)
      best = n, n = n->kid[BY_LENGTH][0];
    else
      n = n->kid[BY_LENGTH][1];
  }
  if (!best)
    return -1;
  *offset = best->offset;
  if (best->length == need)
    drop(x, best);
  else
    reshape(x, best, best->offset + need, best->length - need);
  x->free_bytes -= need;
  return 0;
}

uint64_t store_extents_free(store_extents *x, uint64_t offset, uint64_t length) {
  uint64_t len = store_extents_round(length ? length : 1);
  store_extent_node *prev, *next;
  around(x, offset, &prev, &next);
  int joins_prev = prev && prev->offset + prev->length == offset;
  int joins_next = next && offset + len == next->offset;
  if (joins_prev && joins_next) {
    uint64_t merged = prev->length + len + next->length;
    drop(x, next);
    reshape(x, prev, prev->offset, merged);
  } else if (joins_prev) {
    reshape(x, prev, prev->offset, prev->length + len);
  } else if (joins_next) {
    reshape(x, next, offset, next->length + len);
    prev = next;
  } else {
    if (!(prev = new_node(offset, len)))
      return 0; /* the space is lost, never handed out twice */
    add(x, prev);
  }
  x->free_bytes += len;
  return prev->length;
}

int store_extents_take(store_extents *x, uint64_t offset, uint64_t length) {
  uint64_t need = store_extents_round(length ? length : 1);
  if (offset % STORE_GRANULE || offset + need < offset)
    return -1;
  store_extent_node *e, *next;
  around(x, offset, &e, &next);
  if (next && next->offset == offset)
    e = next;
  if (!e || offset + need > e->offset + e->length)
    return -1;
  uint64_t end = e->offset + e->length;
  if (offset > e->offset && offset + need < end) { /* a hole in the middle: one extent more */
    store_extent_node *after = new_node(offset + need, end - offset - need);
    if (!after)
      return -1;
    reshape(x, e, e->offset, offset - e->offset);
    add(x, after);
  } else if (offset > e->offset) {
    reshape(x, e, e->offset, e->length - need);
  } else if (offset + need < end) {
    reshape(x, e, e->offset + need, e->length - need);
  } else {
    drop(x, e);
  }
  x->free_bytes -= need;
  return 0;
}

uint64_t store_extents_largest(const store_extents *x) {
  store_extent_node *n = x->by_length;
  while (n && n->kid[BY_LENGTH][1])
    n = n->kid[BY_LENGTH][1];
  return n ? n->length : 0;
}

int store_extents_next(const store_extents *x, uint64_t offset, store_extent *extent) {
  store_extent_node *prev, *next;
  around(x, offset, &prev, &next);
  if (!next)
    return -1;
  *extent = (store_extent){next->offset, next->length};
  return 0;
}
