/* region_cache.c - see region_cache.h. Both steps are linear in the cache
 * and the reply (plus a sort of the misses when they come unsorted). */
#include "memory/region_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "memory/registry.h"

static uint64_t end_of(const ferry_region *r) { return r->addr + r->length; }

static int compare_addr(const void *a, const void *b) {
  const ferry_region *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Sorts (unless already sorted) and joins overlapping or adjacent ranges. */
static size_t join_ranges(ferry_region *r, size_t n) {
  size_t sorted = 1;
  while (sorted < n && r[sorted - 1].addr <= r[sorted].addr)
    sorted++;
  if (sorted < n)
    qsort(r, n, sizeof *r, compare_addr);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (k > 0 && r[i].addr <= end_of(&r[k - 1])) {
      if (end_of(&r[i]) > end_of(&r[k - 1]))
        r[k - 1].length = end_of(&r[i]) - r[k - 1].addr;
    } else {
      r[k++] = r[i];
    }
  }
  return k;
}

/* Joins runs of neighbours into covering spans until at most `limit`. */
static size_t cap_ranges(ferry_region *r, size_t n, size_t limit) {
  if (n <= limit)
    return n;
  size_t per = (n + limit - 1) / limit, k = 0;
  for (size_t i = 0; i < n; i += per) {
    size_t last = i + per - 1 < n ? i + per - 1 : n - 1;
    r[k].addr = r[i].addr;
    r[k].length = end_of(&r[last]) - r[i].addr;
    k++;
  }
  return k;
}

ferry_status ferry_region_cache_misses(const ferry_region_table *cache, const ferry_entry *entries,
                                       size_t count, ferry_region **spans, size_t *n) {
  *spans = NULL;
  *n = 0;
  size_t misses = 0;
  for (size_t i = 0; i < count; i++)
    misses += ferry_regions_search(cache->regions, cache->count, entries[i].remote,
                                   entries[i].length) < 0;
  if (misses == 0)
    return FERRY_OK;
  ferry_region *r = malloc(misses * sizeof *r);
  if (!r)
    return ferry_fail(FERRY_ENOMEM, "no memory for the ranges of %zu remote entries", misses);
  size_t k = 0;
  for (size_t i = 0; i < count; i++) {
    const ferry_entry *en = &entries[i];
    if (ferry_regions_search(cache->regions, cache->count, en->remote, en->length) >= 0)
      continue;
    /* No registered region reaches past UINT64_MAX - 1: ask for what fits. */
    uint64_t room = UINT64_MAX - en->remote;
    if (room > 0)
      r[k++] = (ferry_region){en->remote, en->length < room ? en->length : room};
  }
  *n = cap_ranges(r, join_ranges(r, k), FERRY_WIRE_MAX_REGION_RANGES);
  *spans = r;
  return FERRY_OK;
}

static int same_sections(const ferry_region_table *a, const ferry_region_table *b) {
  if (a->key_sections != b->key_sections)
    return 0;
  for (unsigned i = 0; i < a->key_sections; i++)
    if (a->keys[i].transport != b->keys[i].transport || a->keys[i].size != b->keys[i].size)
      return 0;
  return 1;
}

/* The merged table under construction, with room for every region. */
typedef struct merge {
  ferry_region_table out;
  const ferry_region_table *cache, *reply;
} merge;

static void emit(merge *m, const ferry_region_table *from, size_t i) {
  ferry_region_table *o = &m->out;
  for (unsigned k = 0; k < o->key_sections; k++)
    memcpy(o->keys[k].data + o->count * o->keys[k].size,
           from->keys[k].data + i * from->keys[k].size, o->keys[k].size);
  o->regions[o->count++] = from->regions[i];
}

static ferry_status merge_alloc(merge *m, size_t room) {
  ferry_region_table *o = &m->out;
  memset(o, 0, sizeof *o);
  o->key_sections = m->reply->key_sections;
  o->regions = malloc((room ? room : 1) * sizeof *o->regions);
  int ok = o->regions != NULL;
  for (unsigned k = 0; k < o->key_sections; k++) {
    o->keys[k] = m->reply->keys[k];
    o->keys[k].data = malloc((room ? room : 1) * o->keys[k].size);
    ok = ok && o->keys[k].data;
  }
  if (!ok) {
    ferry_region_table_free(o);
    return ferry_fail(FERRY_ENOMEM, "no memory to cache %zu remote regions", room);
  }
  return FERRY_OK;
}

/* Nonzero when c (cached) overlaps a span; *s advances over spans that end
 * before it (c comes in address order). No spans: the whole space. */
static int in_spans(const ferry_region *c, const ferry_region *spans, size_t n, size_t *s) {
  if (n == 0)
    return 1;
  while (*s < n && end_of(&spans[*s]) <= c->addr)
    (*s)++;
  return *s < n && spans[*s].addr < end_of(c);
}

static void merge_walk(merge *m, const ferry_region *spans, size_t nspans) {
  const ferry_region_table *c = m->cache, *r = m->reply;
  size_t j = 0, s = 0;
  for (size_t i = 0; i < c->count; i++) {
    const ferry_region *old = &c->regions[i];
    while (j < r->count && r->regions[j].addr < old->addr)
      emit(m, r, j++);
    int stale = in_spans(old, spans, nspans, &s) ||
                (j < r->count && end_of(old) > r->regions[j].addr) ||
                (j > 0 && end_of(&r->regions[j - 1]) > old->addr);
    if (!stale)
      emit(m, c, i);
  }
  while (j < r->count)
    emit(m, r, j++);
}

ferry_status ferry_region_cache_merge(ferry_region_table *cache, ferry_region_table *reply,
                                      const ferry_region *spans, size_t nspans) {
  if (nspans == 0 || !same_sections(cache, reply) || cache->count == 0) {
    ferry_region_table_free(cache);
    *cache = *reply; /* the reply is all there is to know */
    memset(reply, 0, sizeof *reply);
    return FERRY_OK;
  }
  merge m = {.cache = cache, .reply = reply};
  ferry_status st = merge_alloc(&m, cache->count + reply->count);
  if (st)
    return st;
  merge_walk(&m, spans, nspans);
  ferry_region_table_free(cache);
  ferry_region_table_free(reply);
  *cache = m.out;
  return FERRY_OK;
}
