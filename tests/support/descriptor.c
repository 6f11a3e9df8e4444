/* descriptor.c - truncations and altered bytes of a fabric descriptor
 * (descriptor.h). */
#include "descriptor.h"

#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "transport/fabric.h"

/* A heap copy of exactly n bytes (at least one, for malloc): the first
 * min(n, len) from real, zeros after. */
static uint8_t *exact_copy(const uint8_t *real, size_t len, size_t n) {
  uint8_t *copy = calloc(1, n ? n : 1);
  assert_non_null(copy);
  memcpy(copy, real, n < len ? n : len);
  return copy;
}

static int listed(size_t n, const size_t *ok, size_t ok_count) {
  for (size_t i = 0; i < ok_count; i++)
    if (ok[i] == n)
      return 1;
  return 0;
}

void test_descriptor_cuts(const uint8_t *real, size_t len, const size_t *ok, size_t ok_count) {
  ferry_fabric_descriptor d;
  char why[160];
  for (size_t n = 0; n < len; n++) {
    uint8_t *cut = exact_copy(real, len, n);
    int decoded = ferry_fabric_descriptor_decode(cut, n, &d, why, sizeof why);
    free(cut);
    if (decoded != listed(n, ok, ok_count))
      fail_msg("a cut to %zu of %zu bytes %s", n, len, decoded ? "decoded" : "was refused");
    if (decoded) {
      assert_int_equal(d.rail_count, 0);
      assert_int_equal(d.lane_count, 0);
    }
  }
}

void test_descriptor_refused(const uint8_t *real, size_t len, size_t decode_len, size_t at,
                             uint8_t value, const char *needle) {
  ferry_fabric_descriptor d;
  char why[160] = "";
  assert_true(at < decode_len);
  uint8_t *bad = exact_copy(real, len, decode_len);
  bad[at] = value;
  int decoded = ferry_fabric_descriptor_decode(bad, decode_len, &d, why, sizeof why);
  free(bad);
  assert_int_equal(decoded, 0);
  if (!strstr(why, needle))
    fail_msg("byte %zu = %u refused with \"%s\", not naming \"%s\"", at, value, why, needle);
}
