/* test_rail_choice.c - which rail a checkout takes (core/rail_choice.c),
 * without a network: the rails of the preferred transport take turns, the
 * next transport's stand by until every rail of the better one is out of
 * use, a transport whose back-off ended carries again, and whether a lost
 * chunk has another rail to go to. Transports are
 * stand-ins: only their addresses are compared. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "core/rail_choice.h"

static const int fast_one, slow_one; /* two transports, by address */
#define FAST ((const struct ferry_transport *)&fast_one)
#define SLOW ((const struct ferry_transport *)&slow_one)

/* fabric-like FAST on two rails, then tcp-like SLOW on one. */
static void three_rails(ferry_peer_rail rails[3]) {
  memset(rails, 0, 3 * sizeof *rails);
  rails[0].transport = rails[1].transport = FAST;
  rails[2].transport = SLOW;
}

static int pick(const ferry_peer_rail *rails, unsigned *next, uint64_t now) {
  return ferry_rails_pick(rails, 3, next, now, 0);
}

static void preferred_rails_take_turns(void **state) {
  ferry_peer_rail rails[3];
  three_rails(rails);
  unsigned next = 0;
  for (int i = 0; i < 6; i++) /* never the standby while FAST is up */
    assert_int_equal(pick(rails, &next, 100), i % 2);
  assert_ptr_equal(ferry_rails_carrier(rails, 3, 100, 0), FAST);
  assert_int_equal(ferry_rails_of(rails, 3, FAST), 2);
  assert_int_equal(ferry_rails_of(rails, 3, SLOW), 1);
}

static void a_failed_rail_leaves_its_siblings(void **state) {
  ferry_peer_rail rails[3];
  three_rails(rails);
  rails[0].down_until_ns = 500;
  unsigned next = 0;
  for (int i = 0; i < 4; i++)
    assert_int_equal(pick(rails, &next, 100), 1);
}

static void standby_carries_then_preferred_comes_back(void **state) {
  ferry_peer_rail rails[3];
  three_rails(rails);
  rails[0].down_until_ns = 500;
  rails[1].down_until_ns = 700;
  unsigned next = 0;
  assert_ptr_equal(ferry_rails_carrier(rails, 3, 100, 0), SLOW);
  for (int i = 0; i < 3; i++)
    assert_int_equal(pick(rails, &next, 100), 2);
  /* rail 0's back-off ended: FAST is tried again, on that rail only */
  assert_ptr_equal(ferry_rails_carrier(rails, 3, 600, 0), FAST);
  for (int i = 0; i < 3; i++)
    assert_int_equal(pick(rails, &next, 600), 0);
  assert_int_equal(pick(rails, &next, 700), 1); /* both again, in turn */
  assert_int_equal(pick(rails, &next, 700), 0);
}

static void every_rail_out_of_use(void **state) {
  ferry_peer_rail rails[3];
  three_rails(rails);
  for (int r = 0; r < 3; r++)
    rails[r].down_until_ns = 500;
  unsigned next = 1;
  assert_null(ferry_rails_carrier(rails, 3, 100, 0));
  assert_int_equal(pick(rails, &next, 100), -1);
  assert_int_equal(next, 1);
  assert_int_equal(pick(rails, &next, 500), 1); /* down until 500: usable at 500 */
}

/* Where a chunk lost on a rail could go (the stall bound asks): any other
 * usable rail, of its own transport or a standby. */
static void somewhere_else_to_go(void **state) {
  ferry_peer_rail rails[3];
  three_rails(rails);
  assert_true(ferry_rails_other_usable(rails, 3, 0, 100, 0));
  rails[1].down_until_ns = 500;
  assert_true(ferry_rails_other_usable(rails, 3, 0, 100, 0)); /* the standby */
  rails[2].down_until_ns = 500;
  assert_false(ferry_rails_other_usable(rails, 3, 0, 100, 0));
  assert_true(ferry_rails_other_usable(rails, 3, 1, 100, 0));  /* rail 0 */
  assert_true(ferry_rails_other_usable(rails, 3, 0, 500, 0));  /* back-offs ended */
  assert_false(ferry_rails_other_usable(rails, 1, 0, 100, 0)); /* one rail: nowhere */
}

/* A pool message's batch leaves out the rails of a transport whose target
 * cannot check its WRITEs: the standby carries it while the preferred one
 * is up, and a chunk it loses has nowhere else to go. */
static void excluded_rails_count_as_out_of_use(void **state) {
  ferry_peer_rail rails[3];
  three_rails(rails);
  unsigned next = 0, fast = 1u << 0 | 1u << 1;
  assert_ptr_equal(ferry_rails_carrier(rails, 3, 100, fast), SLOW);
  for (int i = 0; i < 3; i++)
    assert_int_equal(ferry_rails_pick(rails, 3, &next, 100, fast), 2);
  assert_false(ferry_rails_other_usable(rails, 3, 2, 100, fast));
  assert_true(ferry_rails_other_usable(rails, 3, 2, 100, 0));
  rails[2].down_until_ns = 500;
  assert_null(ferry_rails_carrier(rails, 3, 100, fast));
  assert_int_equal(ferry_rails_pick(rails, 3, &next, 100, fast), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(preferred_rails_take_turns),
      cmocka_unit_test(a_failed_rail_leaves_its_siblings),
      cmocka_unit_test(standby_carries_then_preferred_comes_back),
      cmocka_unit_test(every_rail_out_of_use),
      cmocka_unit_test(somewhere_else_to_go),
      cmocka_unit_test(excluded_rails_count_as_out_of_use),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
