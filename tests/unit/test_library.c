/* test_library.c - a feature's library loaded at first use (base/library.h):
 * a library that is not there and one without a symbol each fail with the
 * feature, the soname, the cause and the package; a failed load leaves no
 * pointer in the table; a load is tried once per process. The real
 * libraries missing, end to end: tests/python/test_wheel.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "base/library.h"
#include "ferry.h"

static void assert_detail_has(const char *part) {
  if (!strstr(ferry_last_error(), part))
    fail_msg("detail \"%s\" lacks \"%s\"", ferry_last_error(), part);
}

typedef struct text_api {
  size_t (*length)(const char *s);
  int (*missing)(void);
} text_api;

static const ferry_library_symbol both[] = {
    FERRY_LIBRARY_SYMBOL(text_api, length, "strlen", NULL),
    FERRY_LIBRARY_SYMBOL(text_api, missing, "ferry_no_such_function", NULL),
};
static const ferry_library_symbol length_only[] = {
    FERRY_LIBRARY_SYMBOL(text_api, length, "strlen", NULL),
};

static void absent_library_names_feature_and_package(void **state) {
  (void)state;
  static text_api api;
  static ferry_library lib = FERRY_LIBRARY("libferry-absent.so.7", "libferry-absent7",
                                           "the test feature", length_only, api);
  assert_int_equal(ferry_library_load(&lib), FERRY_ENOTIMPL);
  assert_detail_has("the test feature: not available without libferry-absent.so.7, which cannot "
                    "be loaded on this host (dlopen: libferry-absent.so.7: cannot open shared "
                    "object file");
  assert_detail_has("). Fix: apt-get install libferry-absent7");
  assert_null(api.length);
}

static void missing_symbol_leaves_no_pointer(void **state) {
  (void)state;
  static text_api api;
  static ferry_library lib = FERRY_LIBRARY("libc.so.6", NULL, "the test feature", both, api);
  assert_int_equal(ferry_library_load(&lib), FERRY_ENOTIMPL);
  assert_detail_has("the test feature: not available without libc.so.6, which cannot be loaded "
                    "on this host (it has no ferry_no_such_function: another version)");
  assert_null(strstr(ferry_last_error(), "Fix:")); /* no package to name */
  assert_null(api.length);                         /* found first, then dropped */
  assert_null(api.missing);
}

static void loaded_library_fills_its_table_once(void **state) {
  (void)state;
  static text_api api;
  static ferry_library lib =
      FERRY_LIBRARY("libc.so.6", "libc6", "the test feature", length_only, api);
  assert_int_equal(ferry_library_load(&lib), FERRY_OK);
  assert_non_null(api.length);
  assert_int_equal(api.length("ferry"), 5);
  size_t (*first)(const char *) = api.length;
  api.length = NULL; /* a second load would fill it again */
  assert_int_equal(ferry_library_load(&lib), FERRY_OK);
  assert_null(api.length);
  api.length = first;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(absent_library_names_feature_and_package),
      cmocka_unit_test(missing_symbol_leaves_no_pointer),
      cmocka_unit_test(loaded_library_fills_its_table_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
