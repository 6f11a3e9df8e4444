/* test_memory_kind.c - memory kinds without a GPU: Mooncake's location
 * strings (what parses, what is refused and how it is named), their check
 * against what the drivers said of a region (a contradiction names both),
 * the registry's record of where each region lives, and host memory being
 * what no driver claims. The CUDA driver itself: tests/gpu. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "memory/kind.h"
#include "memory/registry.h"

static void assert_detail_has(const char *part) {
  if (!strstr(ferry_last_error(), part))
    fail_msg("detail \"%s\" lacks \"%s\"", ferry_last_error(), part);
}

static void locations_parse(void **state) {
  ferry_location loc;
  const char *any[] = {NULL, "", "*"};
  for (size_t i = 0; i < sizeof any / sizeof *any; i++) {
    assert_int_equal(ferry_location_parse(any[i], &loc), FERRY_OK);
    assert_null(loc.kind);
  }
  assert_int_equal(ferry_location_parse("cpu:0", &loc), FERRY_OK);
  assert_ptr_equal(loc.kind, &ferry_kind_host);
  assert_int_equal(loc.device, -1); /* a NUMA node to Mooncake: any host memory */
  assert_int_equal(ferry_location_parse("cpu", &loc), FERRY_OK);
  assert_ptr_equal(loc.kind, &ferry_kind_host);
  assert_int_equal(ferry_location_parse("cuda:1", &loc), FERRY_OK);
  assert_ptr_equal(loc.kind, &ferry_kind_cuda);
  assert_int_equal(loc.device, 1);
  assert_int_equal(ferry_location_parse("cuda", &loc), FERRY_OK);
  assert_int_equal(loc.device, -1);
  assert_int_equal(ferry_location_parse("cuda:32767", &loc), FERRY_OK);
  const char *bad[] = {"gpu:0",       "cuda:", "cuda:-1", "cuda:x",   "cuda:32768", "cuda:1x",
                       "cuda:000001", ":0",    "CPU:0",   "cuda:0:1", " cuda:0"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    if (ferry_location_parse(bad[i], &loc) != FERRY_EINVAL)
      fail_msg("location \"%s\" was accepted", bad[i]);
    char named[64];
    snprintf(named, sizeof named, "location \"%s\" is not valid", bad[i]);
    assert_detail_has(named);
    assert_detail_has("\"cuda:N\"");
  }
}

static const ferry_where host = {.kind = FERRY_KIND_HOST, .cpu_access = 1, .device = -1};
static const ferry_where device1 = {
    .kind = FERRY_KIND_CUDA, .device = 1, .base = 0x1000, .size = 1 << 20};
static const ferry_where pinned0 = {.kind = FERRY_KIND_CUDA, .cpu_access = 1, .device = 0};

static ferry_status check(const char *text, const ferry_where *where) {
  ferry_location loc;
  assert_int_equal(ferry_location_parse(text, &loc), FERRY_OK);
  return ferry_location_check(text, &loc, where, 0x1000, 4096);
}

static void locations_are_checked_against_the_driver(void **state) {
  assert_int_equal(check("*", &host), FERRY_OK);
  assert_int_equal(check("*", &device1), FERRY_OK);
  assert_int_equal(check("cpu:0", &host), FERRY_OK);
  assert_int_equal(check("cpu:3", &pinned0), FERRY_OK); /* pinned: host memory to the CPU */
  assert_int_equal(check("cpu:0", &device1), FERRY_EINVAL);
  assert_detail_has("location \"cpu:0\": the memory is cuda:1 according to its driver");
  char why[256];
  if (ferry_kind_cuda.available(why, sizeof why)) {
    assert_int_equal(check("cuda:1", &device1), FERRY_OK);
    assert_int_equal(check("cuda", &device1), FERRY_OK);
    assert_int_equal(check("cuda:0", &device1), FERRY_EINVAL);
    assert_detail_has("location \"cuda:0\": the memory is cuda:1");
    assert_int_equal(check("cuda:0", &host), FERRY_EINVAL);
    assert_detail_has("the memory is cpu according to every memory driver ferry loaded");
  } else {
    /* No driver: "cuda..." says so, and how ferry looked for one. */
    assert_int_equal(check("cuda:0", &host), FERRY_ENOTIMPL);
    assert_detail_has("location \"cuda:0\": no CUDA driver was found (");
    assert_detail_has(why);
    assert_true(strstr(why, "libcuda.so.1") != NULL);
  }
}

static void unclaimed_memory_is_host_memory(void **state) {
  static char buffer[4096];
  ferry_where w;
  assert_int_equal(ferry_kind_identify((uint64_t)(uintptr_t)buffer, sizeof buffer, &w), FERRY_OK);
  assert_int_equal(w.kind, FERRY_KIND_HOST);
  assert_int_equal(w.cpu_access, 1);
  assert_int_equal(w.device, -1);
  assert_int_equal(ferry_kind_must_stage(&w, FERRY_STAGING_AUTO), 0);
  assert_int_equal(ferry_kind_must_stage(&w, FERRY_STAGING_ALWAYS), 1);
  assert_int_equal(ferry_kind_must_stage(&device1, FERRY_STAGING_AUTO), 1);
  assert_int_equal(ferry_kind_must_stage(&device1, FERRY_STAGING_NEVER), 0);
  assert_int_equal(ferry_kind_must_stage(&pinned0, FERRY_STAGING_AUTO), 0);
}

static void registry_keeps_where_regions_live(void **state) {
  ferry_registry *r = ferry_registry_create();
  ferry_region regions[] = {{0x10000, 0x1000}, {0x20000, 0x1000}, {0x30000, 0x1000}};
  ferry_where wheres[] = {host, device1, pinned0};
  assert_int_equal(ferry_registry_add_placed(r, regions, wheres, 3), FERRY_OK);
  ferry_where w;
  assert_true(ferry_registry_where(r, 0x20010, 16, &w));
  assert_int_equal(w.kind, FERRY_KIND_CUDA);
  assert_int_equal(w.device, 1);
  assert_int_equal(w.cpu_access, 0);
  assert_true(ferry_registry_where(r, 0x10000, 0x1000, &w));
  assert_int_equal(w.kind, FERRY_KIND_HOST);
  assert_true(ferry_registry_where(r, 0x30000, 1, &w));
  assert_int_equal(w.cpu_access, 1);
  assert_false(ferry_registry_where(r, 0x20ff0, 0x20, &w)); /* runs past the region */
  /* Unregistered and registered again as host memory: the kind goes too. */
  assert_int_equal(ferry_registry_remove(r, 0x20000), FERRY_OK);
  assert_false(ferry_registry_where(r, 0x20000, 1, &w));
  assert_int_equal(ferry_registry_add(r, 0x20000, 0x1000), FERRY_OK);
  assert_true(ferry_registry_where(r, 0x20000, 1, &w));
  assert_int_equal(w.kind, FERRY_KIND_HOST);
  /* A batch refused whole leaves no kind behind. */
  ferry_region clash[] = {{0x40000, 0x1000}, {0x30800, 0x1000}};
  ferry_where two[] = {device1, device1};
  assert_int_equal(ferry_registry_add_placed(r, clash, two, 2), FERRY_EOVERLAP);
  assert_false(ferry_registry_where(r, 0x40000, 1, &w));
  assert_int_equal(ferry_registry_add(r, 0x40000, 0x1000), FERRY_OK);
  assert_true(ferry_registry_where(r, 0x40000, 1, &w));
  assert_int_equal(w.kind, FERRY_KIND_HOST);
  ferry_registry_destroy(r);
}

/* The count a batch reads to skip looking for device memory: device
 * regions only (not pinned), each once however often registered. */
static void registry_counts_device_regions(void **state) {
  ferry_registry *r = ferry_registry_create();
  assert_int_equal(ferry_registry_device_regions(r), 0);
  ferry_region regions[] = {{0x10000, 0x1000}, {0x20000, 0x1000}, {0x30000, 0x1000}};
  ferry_where wheres[] = {host, device1, pinned0};
  assert_int_equal(ferry_registry_add_placed(r, regions, wheres, 3), FERRY_OK);
  assert_int_equal(ferry_registry_device_regions(r), 1);
  assert_int_equal(ferry_registry_add_placed(r, &regions[1], &device1, 1), FERRY_OK); /* again */
  assert_int_equal(ferry_registry_device_regions(r), 1);
  ferry_region clash[] = {{0x40000, 0x1000}, {0x30800, 0x1000}};
  ferry_where two[] = {device1, device1};
  assert_int_equal(ferry_registry_add_placed(r, clash, two, 2), FERRY_EOVERLAP);
  assert_int_equal(ferry_registry_device_regions(r), 1);
  assert_int_equal(ferry_registry_add_placed(r, clash, two, 1), FERRY_OK);
  assert_int_equal(ferry_registry_device_regions(r), 2);
  ferry_region gone[] = {{0x20000, 0}, {0x30000, 0}, {0x40000, 0}};
  size_t taken;
  assert_int_equal(ferry_registry_take_many(r, gone, 3, &taken), FERRY_OK);
  assert_int_equal(ferry_registry_device_regions(r), 0);
  ferry_registry_destroy(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(locations_parse),
      cmocka_unit_test(locations_are_checked_against_the_driver),
      cmocka_unit_test(unclaimed_memory_is_host_memory),
      cmocka_unit_test(registry_keeps_where_regions_live),
      cmocka_unit_test(registry_counts_device_regions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
