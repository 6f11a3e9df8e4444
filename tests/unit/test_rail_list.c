/* test_rail_list.c - the rail list parser (net/rails.c): what a rail entry may
 * be, and that anything that would not pin a listener to one literal
 * address is refused naming the entry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "base/error.h"
#include "net/rails.h"

static void entries_parse(void **state) {
  ferry_rail_spec s[FERRY_RAILS_MAX];
  unsigned n;
  assert_int_equal(ferry_rails_parse("127.0.0.1,127.0.0.2:7001,[::1]:7002,::1,"
                                     "127.0.0.3:9001=127.0.0.1:9000",
                                     s, &n),
                   FERRY_OK);
  assert_int_equal(n, 5);
  assert_string_equal(s[0].host, "127.0.0.1");
  assert_int_equal(s[0].port, 0);
  assert_string_equal(s[0].advertise, "");
  assert_string_equal(s[1].host, "127.0.0.2");
  assert_int_equal(s[1].port, 7001);
  assert_string_equal(s[2].host, "::1");
  assert_int_equal(s[2].port, 7002);
  assert_string_equal(s[3].host, "::1");
  assert_int_equal(s[3].port, 0);
  assert_string_equal(s[4].host, "127.0.0.3");
  assert_string_equal(s[4].advertise, "127.0.0.1:9000");
  assert_int_equal(ferry_rails_parse(NULL, s, &n), FERRY_OK);
  assert_int_equal(n, 0);
  assert_int_equal(ferry_rails_parse("", NULL, &n), FERRY_OK);
  assert_int_equal(n, 0);
}

static void bad_entries_named(void **state) {
  const char *bad[] = {"localhost",
                       "0.0.0.0",
                       "::",
                       "127.0.0.1,",
                       ",127.0.0.1",
                       "127.0.0.1:70000",
                       "127.0.0.1=::1",
                       "127.0.0.1=a:1",
                       "[::1]",
                       "127.0.0.1:x",
                       "127.0.0.1=0.0.0.0:5"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    unsigned n;
    if (ferry_rails_parse(bad[i], NULL, &n) != FERRY_EINVAL)
      fail_msg("rail list \"%s\" was accepted", bad[i]);
    assert_non_null(strstr(ferry_last_error(), "rail"));
  }
  unsigned n;
  assert_int_equal(ferry_rails_parse("127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5,"
                                     "127.0.0.6,127.0.0.7,127.0.0.8,127.0.0.9",
                                     NULL, &n),
                   FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "more than 8"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(entries_parse),
      cmocka_unit_test(bad_entries_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
