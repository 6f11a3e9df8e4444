/* slots.c - a receive pool's slot bookkeeping (slots.h): the treap of
 * extents with free-gap summaries, the chained hash, the coverage spans.
 *
 * The treap keeps extents ordered by offset and heap-ordered by random
 * priorities, so its depth stays logarithmic whatever order slots come and
 * go in (a peer cannot choose them). Each node sums up its subtree (first
 * offset, last end, largest gap between two of its extents); a first fit
 * then descends only into a subtree that has a gap large enough, leftmost
 * first, and never visits the others. */
#include "pool/slots.h"

#include <stdlib.h>
#include <string.h>

/* ---- extents ------------------------------------------------------------------------------- */

static uint64_t end_of(const ferry_extent *e) { return e->offset + e->length; }
static uint64_t max_of(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* xorshift64*: cheap, and seeded at random per pool. */
static uint64_t next_rand(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545f4914f6cdd1dull;
}

static void summarize(ferry_extent *t) {
  t->first = t->left ? t->left->first : t->offset;
  t->last = t->right ? t->right->last : end_of(t);
  uint64_t gap = 0;
  if (t->left)
    gap = max_of(t->left->gap, t->offset - t->left->last);
  if (t->right)
    gap = max_of(gap, max_of(t->right->gap, t->right->first - end_of(t)));
  t->gap = gap;
}

/* t's extents before offset into *lo, the others into *hi. */
static void split(ferry_extent *t, uint64_t offset, ferry_extent **lo, ferry_extent **hi) {
  if (!t) {
    *lo = *hi = NULL;
    return;
  }
  if (t->offset < offset) {
    split(t->right, offset, &t->right, hi);
    *lo = t;
  } else {
    split(t->left, offset, lo, &t->left);
    *hi = t;
  }
  summarize(t);
}

/* Every extent of a lies before every extent of b. */
static ferry_extent *merge(ferry_extent *a, ferry_extent *b) {
  if (!a || !b)
    return a ? a : b;
  if (a->prio > b->prio) {
    a->right = merge(a->right, b);
    summarize(a);
    return a;
  }
  b->left = merge(a, b->left);
  summarize(b);
  return b;
}

void ferry_extents_init(ferry_extents *x, uint64_t size, uint64_t seed) {
  x->root = NULL;
  x->size = size;
  x->rand = seed ? seed : 0x9e3779b97f4a7c15ull;
}

/* A gap of need bytes in t's subtree, whose extents follow `from` (the end
 * of what precedes them): only a subtree that has one is entered. */
static uint64_t fit_in(const ferry_extent *t, uint64_t from, uint64_t need) {
  while (t && (t->first - from >= need || t->gap >= need)) {
    const ferry_extent *l = t->left;
    if (l && (l->first - from >= need || l->gap >= need)) {
      t = l;
      continue;
    }
    uint64_t before = l ? l->last : from;
    if (t->offset - before >= need)
      return before;
    from = end_of(t);
    t = t->right;
  }
  return FERRY_NO_FIT;
}

uint64_t ferry_extents_fit(const ferry_extents *x, uint64_t length) {
  uint64_t at = fit_in(x->root, 0, length);
  if (at != FERRY_NO_FIT)
    return at;
  uint64_t tail = x->root ? x->root->last : 0;
  return x->size - tail >= length ? tail : FERRY_NO_FIT;
}

void ferry_extents_insert(ferry_extents *x, ferry_extent *e) {
  ferry_extent *lo, *hi;
  e->left = e->right = NULL;
  e->prio = next_rand(&x->rand);
  summarize(e);
  split(x->root, e->offset, &lo, &hi);
  x->root = merge(merge(lo, e), hi);
}

void ferry_extents_remove(ferry_extents *x, ferry_extent *e) {
  ferry_extent *lo, *mid, *hi;
  split(x->root, e->offset, &lo, &mid);
  split(mid, e->offset + 1, &mid, &hi); /* mid is e alone: offsets are unique */
  x->root = merge(lo, hi);
  e->left = e->right = NULL;
}

ferry_extent *ferry_extents_at(const ferry_extents *x, uint64_t offset) {
  ferry_extent *t = x->root;
  while (t && (offset < t->offset || offset >= end_of(t)))
    t = offset < t->offset ? t->left : t->right;
  return t;
}

/* ---- table ----------------------------------------------------------------------------------- */

/* Fibonacci hashing: ids and engine ids may be sequential. */
static size_t bucket_of(uint64_t key, size_t mask) {
  return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & mask;
}

ferry_hnode *ferry_table_find(const ferry_table *t, uint64_t key) {
  if (!t->buckets)
    return NULL;
  ferry_hnode *n = t->buckets[bucket_of(key, t->mask)];
  while (n && n->key != key)
    n = n->next;
  return n;
}

static void grow(ferry_table *t) {
  size_t size = t->buckets ? 2 * (t->mask + 1) : 16;
  ferry_hnode **fresh = calloc(size, sizeof *fresh);
  if (!fresh)
    return;
  for (size_t i = 0; t->buckets && i <= t->mask; i++) {
    while (t->buckets[i]) {
      ferry_hnode *n = t->buckets[i];
      t->buckets[i] = n->next;
      size_t b = bucket_of(n->key, size - 1);
      n->next = fresh[b];
      fresh[b] = n;
    }
  }
  free(t->buckets);
  t->buckets = fresh;
  t->mask = size - 1;
}

int ferry_table_add(ferry_table *t, ferry_hnode *n) {
  if (!t->buckets || t->count > t->mask)
    grow(t);
  if (!t->buckets)
    return -1;
  size_t b = bucket_of(n->key, t->mask);
  n->next = t->buckets[b];
  t->buckets[b] = n;
  t->count++;
  return 0;
}

void ferry_table_remove(ferry_table *t, ferry_hnode *n) {
  for (ferry_hnode **pp = t->buckets ? &t->buckets[bucket_of(n->key, t->mask)] : NULL; pp && *pp;
       pp = &(*pp)->next) {
    if (*pp == n) {
      *pp = n->next;
      t->count--;
      return;
    }
  }
}

void ferry_table_clear(ferry_table *t, void (*fn)(ferry_hnode *n)) {
  for (size_t i = 0; t->buckets && i <= t->mask; i++) {
    while (t->buckets[i]) {
      ferry_hnode *n = t->buckets[i];
      t->buckets[i] = n->next;
      fn(n);
    }
  }
  free(t->buckets);
  *t = (ferry_table){NULL, 0, 0};
}

/* ---- coverage -------------------------------------------------------------------------------- */

/* The first span that ends at or after from (spans touching [from, ...) merge). */
static uint32_t first_reaching(const ferry_coverage *c, uint64_t from) {
  uint32_t lo = 0, hi = c->count;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (c->spans[mid].to < from)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

int ferry_coverage_add(ferry_coverage *c, uint64_t from, uint64_t to, uint32_t most) {
  if (from >= to)
    return 0;
  uint32_t i = first_reaching(c, from), j = i;
  while (j < c->count && c->spans[j].from <= to) /* every span it touches: [i, j) */
    j++;
  if (j > i) { /* merged into spans[i] */
    c->spans[i].from = c->spans[i].from < from ? c->spans[i].from : from;
    c->spans[i].to = c->spans[j - 1].to > to ? c->spans[j - 1].to : to;
    memmove(&c->spans[i + 1], &c->spans[j], (c->count - j) * sizeof *c->spans);
    c->count -= j - i - 1;
    return 0;
  }
  if (c->count >= most)
    return -1;
  if (c->count == c->cap) {
    uint32_t cap = c->cap ? 2 * c->cap : 2;
    ferry_span *grown = realloc(c->spans, cap * sizeof *grown);
    if (!grown)
      return -1;
    c->spans = grown;
    c->cap = cap;
  }
  memmove(&c->spans[i + 1], &c->spans[i], (c->count - i) * sizeof *c->spans);
  c->spans[i] = (ferry_span){from, to};
  c->count++;
  return 0;
}

uint64_t ferry_coverage_gap(const ferry_coverage *c, uint64_t length, uint64_t *gap_end) {
  uint64_t at = c->count && c->spans[0].from == 0 ? c->spans[0].to : 0;
  if (at >= length)
    return *gap_end = length;
  *gap_end = c->count > (at > 0) ? c->spans[at > 0].from : length;
  if (*gap_end > length)
    *gap_end = length;
  return at;
}

void ferry_coverage_free(ferry_coverage *c) {
  free(c->spans);
  *c = (ferry_coverage){NULL, 0, 0};
}
