/* test_region_cache.c - unit tests of the initiator's partial region cache:
 * which ranges a batch asks for (only what the cache lacks, joined, capped
 * at what one REGIONS_REQ carries) and how a reply is merged (the truth
 * within the asked spans and wherever its regions reach, keys kept in step
 * with their regions, the rest of the cache untouched). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "memory/region_cache.h"

/* A table of n regions whose 1-byte keys (transport shm) are key[i]. */
static ferry_region_table table_of(const ferry_region *r, size_t n, const uint8_t *key) {
  ferry_region_table t;
  memset(&t, 0, sizeof t);
  t.count = n;
  t.regions = malloc((n ? n : 1) * sizeof *r);
  t.key_sections = 1;
  t.keys[0] = (ferry_region_keys){FERRY_TRANSPORT_SHM, 1, malloc(n ? n : 1)};
  if (n) {
    memcpy(t.regions, r, n * sizeof *r);
    memcpy(t.keys[0].data, key, n);
  }
  return t;
}

static void assert_cache(const ferry_region_table *t, const ferry_region *want, const uint8_t *key,
                         size_t n) {
  assert_int_equal(t->count, n);
  assert_memory_equal(t->regions, want, n * sizeof *want);
  assert_memory_equal(t->keys[0].data, key, n);
}

static void test_merge_replaces_within_spans(void **state) {
  (void)state;
  const ferry_region old[] = {{0x1000, 0x1000}, {0x3000, 0x1000}, {0x8000, 0x100}};
  ferry_region_table cache = table_of(old, 3, (const uint8_t *)"ABC");
  /* The target re-registered 0x3000 larger; the reply covers the span. */
  const ferry_region fresh[] = {{0x2800, 0x2000}}, span[] = {{0x3000, 0x10}};
  ferry_region_table reply = table_of(fresh, 1, (const uint8_t *)"b");
  assert_int_equal(ferry_region_cache_merge(&cache, &reply, span, 1), FERRY_OK);
  const ferry_region want[] = {{0x1000, 0x1000}, {0x2800, 0x2000}, {0x8000, 0x100}};
  assert_cache(&cache, want, (const uint8_t *)"AbC", 3);
  assert_int_equal(reply.count, 0);

  /* Unregistered at the target: an empty reply for its span drops it. */
  ferry_region_table none = table_of(NULL, 0, NULL);
  const ferry_region gone[] = {{0x8000, 0x1}};
  assert_int_equal(ferry_region_cache_merge(&cache, &none, gone, 1), FERRY_OK);
  assert_cache(&cache, want, (const uint8_t *)"Ab", 2);
  ferry_region_table_free(&none);
  ferry_region_table_free(&cache);
}

/* A replied region reaching past the span replaces what it overlaps. */
static void test_merge_reply_reaches_outside(void **state) {
  (void)state;
  const ferry_region old[] = {{0x1000, 0x1000}, {0x5000, 0x1000}};
  ferry_region_table cache = table_of(old, 2, (const uint8_t *)"AB");
  const ferry_region fresh[] = {{0x1800, 0x4000}}, span[] = {{0x2100, 0x1}};
  ferry_region_table reply = table_of(fresh, 1, (const uint8_t *)"x");
  assert_int_equal(ferry_region_cache_merge(&cache, &reply, span, 1), FERRY_OK);
  assert_cache(&cache, fresh, (const uint8_t *)"x", 1);
  ferry_region_table_free(&cache);
}

/* Different key sections (or no spans: the whole table) restart the cache. */
static void test_merge_restarts(void **state) {
  (void)state;
  const ferry_region old[] = {{0x1000, 0x1000}}, fresh[] = {{0x9000, 0x10}};
  ferry_region_table cache = table_of(old, 1, (const uint8_t *)"A");
  ferry_region_table reply = table_of(fresh, 1, (const uint8_t *)"z");
  reply.keys[0].transport = FERRY_TRANSPORT_FABRIC;
  const ferry_region span[] = {{0x9000, 0x1}};
  assert_int_equal(ferry_region_cache_merge(&cache, &reply, span, 1), FERRY_OK);
  assert_cache(&cache, fresh, (const uint8_t *)"z", 1);
  assert_int_equal(cache.keys[0].transport, FERRY_TRANSPORT_FABRIC);
  ferry_region_table whole = table_of(old, 1, (const uint8_t *)"A");
  assert_int_equal(ferry_region_cache_merge(&cache, &whole, NULL, 0), FERRY_OK);
  assert_cache(&cache, old, (const uint8_t *)"A", 1);
  ferry_region_table_free(&cache);
}

static void test_misses(void **state) {
  (void)state;
  const ferry_region have[] = {{0x1000, 0x1000}};
  ferry_region_table cache = table_of(have, 1, (const uint8_t *)"A");
  ferry_entry e[] = {{FERRY_OP_WRITE, (void *)1, 0x1800, 0x10}, /* cached */
                     {FERRY_OP_WRITE, (void *)1, 0x6000, 0x10},
                     {FERRY_OP_WRITE, (void *)1, 0x3000, 0x10},
                     {FERRY_OP_WRITE, (void *)1, 0x3010, 0x10},   /* joins the one before */
                     {FERRY_OP_WRITE, (void *)1, 0x1ff0, 0x20},   /* runs past the cached one */
                     {FERRY_OP_WRITE, (void *)1, UINT64_MAX, 1}}; /* nothing can hold it */
  ferry_region *spans;
  size_t n;
  assert_int_equal(ferry_region_cache_misses(&cache, e, 6, &spans, &n), FERRY_OK);
  const ferry_region want[] = {{0x1ff0, 0x20}, {0x3000, 0x20}, {0x6000, 0x10}};
  assert_int_equal(n, 3);
  assert_memory_equal(spans, want, sizeof want);
  free(spans);
  assert_int_equal(ferry_region_cache_misses(&cache, e, 1, &spans, &n), FERRY_OK);
  assert_int_equal(n, 0);
  assert_null(spans);

  /* More separate ranges than one REGIONS_REQ carries: covering spans. */
  enum { MANY = 3 * FERRY_WIRE_MAX_REGION_RANGES };
  ferry_entry *many = calloc(MANY, sizeof *many);
  for (size_t i = 0; i < MANY; i++)
    many[MANY - 1 - i] = (ferry_entry){FERRY_OP_WRITE, (void *)1, 0x100000 + i * 0x100, 0x10};
  assert_int_equal(ferry_region_cache_misses(&cache, many, MANY, &spans, &n), FERRY_OK);
  assert_true(n <= FERRY_WIRE_MAX_REGION_RANGES);
  for (size_t i = 0; i < MANY; i++) { /* every entry inside one span, spans in order */
    size_t k = 0;
    while (k < n && spans[k].addr + spans[k].length <= many[i].remote)
      k++;
    assert_true(k < n && spans[k].addr <= many[i].remote);
  }
  for (size_t k = 1; k < n; k++)
    assert_true(spans[k].addr >= spans[k - 1].addr + spans[k - 1].length);
  free(spans);
  free(many);
  ferry_region_table_free(&cache);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_merge_replaces_within_spans),
      cmocka_unit_test(test_merge_reply_reaches_outside),
      cmocka_unit_test(test_merge_restarts),
      cmocka_unit_test(test_misses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
