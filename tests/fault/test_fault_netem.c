/* test_fault_netem.c - delay and loss from the kernel's own emulator, tc
 * netem, on a veth link: the same transfers as test_fault_link's userspace
 * emulator, against the real qdisc where the kernel has one.
 *
 * Hosts: a (initiator, the test process) and b (a small `ferry serve`).
 * A file of its own so that a kernel without CONFIG_NET_SCH_NETEM shows
 * exactly this test as skipped (with the reason), not the link tests that
 * do run. Needs network namespaces (root). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "fault.h"

#define PORT 15210

typedef struct env {
  fault_net *net;
  int link;
  fault_proc target;
  char skip_why[512];
} env;

static env E;

static int setup(void **state) {
  if (fault_net_open_isolated(2, &E.net, E.skip_why, sizeof E.skip_why) != 0)
    return -1;
  if (!E.net)
    return 0; /* skipped: E.skip_why says why */
  E.link = fault_net_link(E.net, 0, 1, FAULT_LINK_VETH);
  if (E.link < 0 || fault_serve_start(&E.target, E.net, 1, fault_link_addr(E.net, E.link, 1), PORT,
                                      "64M", NULL, 0) != 0)
    return -1;
  return 0;
}

static int teardown(void **state) {
  if (E.net) {
    fault_proc_term(&E.target);
    fault_net_destroy(E.net);
  }
  return 0;
}

static void test_loss_and_delay_netem(void **state) {
  fault_skip_without_net(E.net, E.skip_why);
  int rc = fault_link_impair(E.net, E.link, 50, 5.0, 0);
  if (rc == FAULT_UNSUPPORTED) {
    printf("SKIP: tc netem is not available in this kernel (CONFIG_NET_SCH_NETEM); the same "
           "faults run through the userspace emulator in test_fault_link\n");
    skip();
  }
  assert_int_equal(rc, 0);
  fault_watchdog(150, "5% loss + 50 ms delay (netem)");
  ferry_status st = fault_transfer_mix(E.net, 0, fault_link_addr(E.net, E.link, 0), &E.target,
                                       "5% loss, 50 ms delay (tc netem)");
  if (st)
    fail_msg("netem transfers: %s (details above)", ferry_strerror(st));
  fault_link_impair(E.net, E.link, 0, 0, 0);
  fault_watchdog(0, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss_and_delay_netem),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
