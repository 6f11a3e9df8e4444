/* test_host_memory.c - unit tests of the check that this process's CPU can
 * read and write a range (host_memory.c), over both of its sources: the
 * PROCMAP_QUERY ioctl (Linux 6.11; skipped where the kernel lacks it) and
 * the text of /proc/self/maps. Each layout (usable, PROT_NONE, a hole,
 * read-only, a range over two mappings, unsorted and overlapping batches)
 * must give the same answer, with the exact range at fault, from both. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "ferry.h"
#include "memory/host_memory.h"

static size_t page;

static uint8_t *map(size_t pages, int prot) {
  void *p = mmap(NULL, pages * page, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(p != MAP_FAILED);
  return p;
}

static ferry_region range(const uint8_t *p, size_t pages) {
  return (ferry_region){(uint64_t)(uintptr_t)p, pages * page};
}

/* The problem find reports among `ranges`, asserting it finds one. */
static ferry_host_problem problem(ferry_host_memory *hm, const ferry_region *ranges, size_t count,
                                  int need_write) {
  ferry_host_problem p;
  assert_int_equal(ferry_host_memory_find(hm, ranges, count, need_write, 0, &p), 1);
  return p;
}

static void assert_problem(ferry_host_problem p, const uint8_t *start, const uint8_t *end,
                           const char *perms) {
  assert_int_equal(p.start, (uint64_t)(uintptr_t)start);
  assert_int_equal(p.end, (uint64_t)(uintptr_t)end);
  assert_string_equal(p.perms, perms);
}

/* Pages: 0-1 rw, 2 none, 3 unmapped, 4 read-only, 5 rw, 6 rw in a mapping
 * of its own (MADV_DONTFORK splits it off), so a range over 5-6 spans two. */
static void layouts(ferry_host_memory *hm) {
  uint8_t *m = map(7, PROT_READ | PROT_WRITE);
  assert_int_equal(mprotect(m + 2 * page, page, PROT_NONE), 0);
  assert_int_equal(munmap(m + 3 * page, page), 0);
  assert_int_equal(mprotect(m + 4 * page, page, PROT_READ), 0);
  assert_int_equal(madvise(m + 6 * page, page, MADV_DONTFORK), 0);
  ferry_host_problem p;

  ferry_region usable[2] = {range(m, 2), range(m + 5 * page, 2)};
  assert_int_equal(ferry_host_memory_find(hm, usable, 2, 1, 0, &p), 0);
  assert_int_equal(ferry_host_memory_check(hm, usable, 2), FERRY_OK);

  ferry_region over_none = range(m + page, 2);
  assert_problem(problem(hm, &over_none, 1, 0), m + 2 * page, m + 3 * page, "---p");
  assert_int_equal(ferry_host_memory_check(hm, &over_none, 1), FERRY_EFAULT);
  assert_non_null(strstr(ferry_last_error(), "not mapped for the CPU: GPU memory, and the CUDA driver"));

  ferry_region over_hole = range(m + 3 * page, 1);
  assert_problem(problem(hm, &over_hole, 1, 0), m + 3 * page, m + 4 * page, "");

  ferry_region read_only = range(m + 4 * page, 1);
  assert_int_equal(ferry_host_memory_find(hm, &read_only, 1, 0, 0, &p), 0);
  assert_problem(problem(hm, &read_only, 1, 1), m + 4 * page, m + 5 * page, "r--p");

  /* Unsorted, overlapping, the bad one last in address order but not in
   * the list: the first range at fault in address order is reported. */
  ferry_region batch[4] = {range(m + 5 * page, 2), range(m, 1), range(m, 2), range(m + page, 3)};
  assert_problem(problem(hm, batch, 4, 1), m + 2 * page, m + 3 * page, "---p");
  ferry_region tail[2] = {range(m + 5 * page, 2), range(m + 4 * page, 2)};
  assert_problem(problem(hm, tail, 2, 1), m + 4 * page, m + 5 * page, "r--p");

  char text[160];
  ferry_host_problem none = {0x1000, 0x3000, "---p"}, hole = {0x1000, 0x2000, ""};
  ferry_host_problem_describe(&none, text, sizeof text);
  assert_string_equal(text, "[0x1000, 0x3000) is mapped without read or write access (---p)");
  ferry_host_problem_describe(&hole, text, sizeof text);
  assert_string_equal(text, "[0x1000, 0x2000) is not mapped at all");

  munmap(m, 3 * page);
  munmap(m + 4 * page, 3 * page);
}

static void query_source(void **state) {
  (void)state;
  ferry_host_memory *hm = ferry_host_memory_open(1);
  assert_non_null(hm);
  if (!ferry_host_memory_has_query(hm)) {
    ferry_host_memory_close(hm);
    print_message("this kernel has no PROCMAP_QUERY (Linux 6.11)\n");
    skip();
  }
  layouts(hm);
  ferry_host_memory_close(hm);
}

/* The text: the same answers; and no answer where only a cheap one is
 * asked for (a READ's own check on such a kernel). */
static void text_source(void **state) {
  (void)state;
  ferry_host_memory *hm = ferry_host_memory_open(0);
  assert_non_null(hm);
  assert_false(ferry_host_memory_has_query(hm));
  layouts(hm);
  uint8_t *m = map(1, PROT_NONE);
  ferry_region r = range(m, 1);
  ferry_host_problem p;
  assert_int_equal(ferry_host_memory_find(hm, &r, 1, 0, 1, &p), -1);
  munmap(m, page);
  ferry_host_memory_close(hm);
}

int main(void) {
  page = (size_t)sysconf(_SC_PAGESIZE);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(query_source),
      cmocka_unit_test(text_source),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
