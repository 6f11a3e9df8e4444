/* slots.h - the bookkeeping of one receive pool's slots, as plain data
 * structures (pool.c holds the policy: states, quotas, expiry, locking):
 *
 *   extents:  where each slot lies, a treap by offset whose nodes know the
 *             largest free gap under them, so a first fit, an insert, a
 *             removal and "which slot holds this byte" each follow one
 *             path from the root (expected O(log n)), however many slots
 *             are held;
 *   table:    a chained hash by a 64-bit key (slot ids, sender engine ids);
 *   coverage: the byte ranges written into a slot under its grant, merged,
 *             so a message is delivered only once every byte of it was
 *             written (not just as many bytes as it has);
 *   links:    intrusive doubly linked lists (grants by age, messages in
 *             landing order, ...).
 *
 * Nothing here allocates a node: callers embed ferry_extent, ferry_hnode
 * and ferry_link in their own structs (FERRY_CONTAINER gets it back). */
#ifndef FERRY_SLOTS_H
#define FERRY_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#define FERRY_CONTAINER(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))
#define FERRY_NO_FIT UINT64_MAX

/* ---- extents ------------------------------------------------------------------------------- */

typedef struct ferry_extent {
  uint64_t offset, length; /* set by the caller before insert */
  struct ferry_extent *left, *right;
  uint64_t prio;
  uint64_t first, last, gap; /* of its subtree: first offset, last end, largest gap inside */
} ferry_extent;

typedef struct ferry_extents {
  ferry_extent *root;
  uint64_t size; /* the range [0, size) the extents live in */
  uint64_t rand; /* priorities: random, so no order of inserts unbalances the tree */
} ferry_extents;

void ferry_extents_init(ferry_extents *x, uint64_t size, uint64_t seed);
/* The lowest offset where length bytes fit between (or after) the
 * extents, FERRY_NO_FIT when nowhere. */
uint64_t ferry_extents_fit(const ferry_extents *x, uint64_t length);
/* Adds e (offset and length set, overlapping none). */
void ferry_extents_insert(ferry_extents *x, ferry_extent *e);
void ferry_extents_remove(ferry_extents *x, ferry_extent *e);
/* The extent holding byte offset, or NULL. */
ferry_extent *ferry_extents_at(const ferry_extents *x, uint64_t offset);

/* ---- table ----------------------------------------------------------------------------------- */

typedef struct ferry_hnode {
  struct ferry_hnode *next;
  uint64_t key;
} ferry_hnode;

typedef struct ferry_table {
  ferry_hnode **buckets;
  size_t mask, count; /* buckets - 1 (0: none yet), nodes */
} ferry_table;

ferry_hnode *ferry_table_find(const ferry_table *t, uint64_t key);
/* Adds n (its key set); -1 only when there is no memory for a first
 * bucket array (a failed growth keeps the old one, with longer chains). */
int ferry_table_add(ferry_table *t, ferry_hnode *n);
void ferry_table_remove(ferry_table *t, ferry_hnode *n);
/* Calls fn on every node (it may free it), then frees the buckets. */
void ferry_table_clear(ferry_table *t, void (*fn)(ferry_hnode *n));

/* ---- coverage -------------------------------------------------------------------------------- */

typedef struct ferry_span {
  uint64_t from, to;
} ferry_span;

/* Sorted, disjoint, non-adjacent spans. */
typedef struct ferry_coverage {
  ferry_span *spans;
  uint32_t count, cap;
} ferry_coverage;

/* Adds [from, to); -1 when that would leave more than most separate spans,
 * or no memory (the coverage is then unchanged). */
int ferry_coverage_add(ferry_coverage *c, uint64_t from, uint64_t to, uint32_t most);
/* The first gap in [0, length): its start, and its end in *gap_end;
 * length when [0, length) is covered. */
uint64_t ferry_coverage_gap(const ferry_coverage *c, uint64_t length, uint64_t *gap_end);
void ferry_coverage_free(ferry_coverage *c);

/* ---- links ----------------------------------------------------------------------------------- */

/* A list is a head link (init'ed) whose next is the first element; a node
 * that is in no list points at itself. */
typedef struct ferry_link {
  struct ferry_link *prev, *next;
} ferry_link;

static inline void ferry_link_init(ferry_link *l) { l->prev = l->next = l; }
static inline int ferry_link_alone(const ferry_link *l) { return l->next == l; }
static inline void ferry_link_append(ferry_link *head, ferry_link *l) {
  l->prev = head->prev;
  l->next = head;
  head->prev->next = l;
  head->prev = l;
}
static inline void ferry_link_remove(ferry_link *l) {
  l->prev->next = l->next;
  l->next->prev = l->prev;
  ferry_link_init(l);
}

#endif
