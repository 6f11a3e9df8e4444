/* test_fabric_domains.c - the fabric transport on several devices, each
 * its own domain (the shape verbs and efa rails need: a NIC per domain).
 * Here the tcp provider's domains are network interfaces: in a network
 * namespace of its own (made at start, gone when the process exits), the
 * test adds two veth interfaces with private addresses, 10.77.0.1 and
 * 10.77.1.1, and both engines name them in fabric_device. Every region is
 * then registered in both domains with a key each (all or nothing), a
 * 16 MiB transfer is
 * striped over both devices' rails and verified byte for byte, and cutting
 * one device's connections leaves the other carrying on. Skipped where no
 * namespace can be made (not root). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fi_domain.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"
#include "rig.h"
#include "transport/fabric.h"

#define MiB (1024ull * 1024ull)
#define BIG (16 * MiB)
#define DEVICES "fda0,fda1"
#define DEVICE_1 0x0a4d0101u /* 10.77.1.1, fda1's address */

static int in_namespace; /* main made the namespace and its two devices */

static int make_namespace(void) {
  if (unshare(CLONE_NEWNET) != 0)
    return 0;
  return system("ip link set lo up && "
                "ip link add fda0 type veth peer name fdb0 && "
                "ip link add fda1 type veth peer name fdb1 && "
                "ip addr add 10.77.0.1/24 dev fda0 && ip addr add 10.77.1.1/24 dev fda1 && "
                "for l in fda0 fdb0 fda1 fdb1; do ip link set $l up || exit 1; done") == 0;
}

/* Control on loopback; the fabric on the devices' own addresses. basic:
 * FI_MR_BASIC (provider keys, virtual addresses: what verbs and efa
 * need), else the provider takes ferry's keys. */
static ferry_status basic_engine(const char *devices, int basic, ferry_engine **e) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_FABRIC;
  cfg.fabric_provider = "tcp;ofi_rxm";
  cfg.fabric_device = devices;
  cfg.fabric_mr_basic = basic;
  cfg.timeout_ms = 60000;
  *e = NULL;
  return ferry_engine_create(&cfg, e);
}

static ferry_status device_engine(const char *devices, ferry_engine **e) {
  return basic_engine(devices, 0, e);
}

static ferry_engine *two_device_basic_engine(int basic) {
  ferry_engine *e;
  if (basic_engine(DEVICES, basic, &e) != FERRY_OK)
    fail_msg("fabric engine on %s: %s", DEVICES, ferry_last_error());
  return e;
}

static ferry_engine *two_device_engine(void) { return two_device_basic_engine(0); }

/* Each device is a domain, every region is registered in both and
 * publishes a key per domain, each its own MR's; one device keeps the
 * table's one key per region. */
static void a_key_per_device(void **state) {
  if (!in_namespace)
    skip();
  ferry_engine *e = two_device_engine(), *one = NULL;
  assert_int_equal(e->fabric->domain_count, 2);
  assert_int_equal(ferry_fabric_region_key_size(e), 2 * FERRY_FABRIC_KEY_SIZE);
  uint8_t *memory = test_buffer(e, MiB);
  ferry_region r = {(uint64_t)(uintptr_t)memory, MiB};
  uint8_t keys[2 * FERRY_FABRIC_KEY_SIZE];
  ferry_fabric_region_keys(e, &r, 1, keys);
  uint64_t key[2];
  memcpy(&key[0], keys, 8); /* little endian, as region_keys writes them */
  memcpy(&key[1], keys + 8, 8);
  print_message("region keys: domain fda0 %llu, fda1 %llu\n", (unsigned long long)key[0],
                (unsigned long long)key[1]);
  assert_true(key[0] != key[1]);
  assert_int_equal(key[0], fi_mr_key(e->fabric->mrs[0].mr[0]));
  assert_int_equal(key[1], fi_mr_key(e->fabric->mrs[0].mr[1]));
  assert_int_equal(device_engine("fda1", &one), FERRY_OK);
  assert_int_equal(ferry_fabric_region_key_size(one), FERRY_FABRIC_KEY_SIZE);
  assert_int_equal(one->fabric->self.rail_count, 0);
  ferry_engine_destroy(one);
  ferry_engine_destroy(e);
  free(memory);
}

/* Keys drawn in order from here on (the registrations' are random). */
static uint64_t next_drawn_key;
static uint64_t draw_in_order(void) { return next_drawn_key++; }

/* A device that refuses a registration: the key it is about to be asked
 * for (the provider takes ferry's keys here; the test draws them) is taken
 * in its domain already. The call fails naming the device, the region is
 * registered on none (the other domain's MR closed, no keys), and once the
 * key is free the same call succeeds. */
static void registration_is_all_or_nothing(void **state) {
  if (!in_namespace)
    skip();
  ferry_engine *e = two_device_engine();
  ferry_fabric *f = e->fabric;
  uint8_t *memory = malloc(MiB), *other = malloc(4096);
  struct fid_mr *squatter = NULL, *probe = NULL;
  uint64_t key = next_drawn_key = 0x1000; /* domain 0 gets key, fda1 key + 1: taken */
  f->draw_key = draw_in_order;
  assert_int_equal(
      fi_mr_reg(f->domains[1].domain, other, 4096, FI_REMOTE_WRITE, 0, key + 1, 0, &squatter, NULL),
      0);
  assert_int_not_equal(ferry_memory_register(e, memory, MiB), FERRY_OK);
  print_message("%s\n", ferry_last_error());
  assert_non_null(strstr(ferry_last_error(), "on device fda1"));
  assert_int_equal(f->mr_count, 0);
  ferry_region r = {(uint64_t)(uintptr_t)memory, MiB};
  uint8_t keys[2 * FERRY_FABRIC_KEY_SIZE], zeros[sizeof keys] = {0};
  ferry_fabric_region_keys(e, &r, 1, keys);
  assert_memory_equal(keys, zeros, sizeof keys);
  /* domain 0's MR was closed: its key is free again */
  assert_int_equal(
      fi_mr_reg(f->domains[0].domain, other, 4096, FI_REMOTE_WRITE, 0, key, 0, &probe, NULL), 0);
  fi_close(&probe->fid);
  fi_close(&squatter->fid);
  next_drawn_key = key;
  assert_int_equal(ferry_memory_register(e, memory, MiB), FERRY_OK);
  assert_int_equal(f->mr_count, 1);
  assert_int_equal(ferry_memory_unregister(e, memory), FERRY_OK);
  assert_int_equal(f->mr_count, 0);
  ferry_engine_destroy(e);
  free(memory);
  free(other);
}

/* The descriptor lists each domain's endpoint as a rail, flagged as
 * domains; that flag without two rails is refused. */
static void devices_are_rails_in_the_descriptor(void **state) {
  if (!in_namespace)
    skip();
  ferry_engine *e = two_device_engine();
  uint8_t real[FERRY_WIRE_MAX_DESCRIPTOR];
  size_t len = ferry_fabric_describe(e, real, sizeof real);
  ferry_fabric_descriptor d;
  char why[160];
  assert_int_equal(ferry_fabric_descriptor_decode(real, len, &d, why, sizeof why), 1);
  assert_int_equal(d.domain_rails, 1);
  assert_int_equal(d.rail_count, 2);
  struct sockaddr_in a[2];
  for (int i = 0; i < 2; i++)
    memcpy(&a[i], d.rail_addr[i], sizeof a[i]);
  assert_int_equal(ntohl(a[0].sin_addr.s_addr), 0x0a4d0001u); /* pinned to each device */
  assert_int_equal(ntohl(a[1].sin_addr.s_addr), DEVICE_1);
  size_t plain = len - 1 - 2 * (2 + d.rail_addr_len[0]); /* without the rails list */
  assert_int_equal(ferry_fabric_descriptor_decode(real, plain, &d, why, sizeof why), 0);
  assert_non_null(strstr(why, "device rails"));
  ferry_engine_destroy(e);
}

/* Names that are no device, repeated or empty: create fails naming the
 * devices that exist. */
static void unknown_device_names_the_devices(void **state) {
  if (!in_namespace)
    skip();
  ferry_engine *e;
  assert_int_equal(device_engine("fda0,nosuch9", &e), FERRY_ETRANSPORT);
  print_message("%s\n", ferry_last_error());
  assert_non_null(strstr(ferry_last_error(), "\"nosuch9\" not found"));
  assert_non_null(strstr(ferry_last_error(), "fda1"));
  assert_int_equal(device_engine("fda0,fda0", &e), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "twice"));
  assert_int_equal(device_engine("fda0,", &e), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "empty"));
}

/* The bytes per rail (rail r: device r) toward the rig's target. */
static size_t device_bytes(test_rig *r, uint64_t bytes[2], int up[2]) {
  char names[FERRY_RAILS_MAX][80];
  size_t n = test_rig_rail_bytes(r, bytes, up, names, 2);
  for (size_t i = 0; i < n; i++)
    assert_true(!strncmp(names[i], i ? "10.77.1.1:" : "10.77.0.1:", 10));
  return n;
}

/* Verified 16 MiB round trips until both devices carried bytes. */
static void stripe(test_rig *r, uint64_t bytes[2]) {
  bytes[0] = bytes[1] = 0;
  while (r->rounds < 20 && !(bytes[0] && bytes[1])) {
    test_rig_round_trip(r);
    unsigned transport = 0;
    assert_int_equal(ferry_peer_transport(r->initiator, r->name, &transport), FERRY_OK);
    assert_int_equal(transport, FERRY_TRANSPORT_FABRIC);
    assert_int_equal(device_bytes(r, bytes, NULL), 2);
  }
  print_message("after %llu rounds: fda0 %llu bytes, fda1 %llu bytes\n",
                (unsigned long long)r->rounds, (unsigned long long)bytes[0],
                (unsigned long long)bytes[1]);
  assert_true(bytes[0] > 0 && bytes[1] > 0);
}

static void stripe_on(int basic) {
  if (!in_namespace)
    skip();
  test_rig r;
  test_rig_start(&r, two_device_basic_engine(basic), two_device_basic_engine(basic), BIG);
  assert_int_equal(r.target->fabric->prov_key, basic);
  assert_int_equal(r.target->fabric->virt_addr, basic);
  uint64_t bytes[2];
  stripe(&r, bytes);
  assert_int_equal(bytes[0] + bytes[1], 2 * r.rounds * BIG);
  test_rig_stop(&r);
}

static void striped_over_two_devices(void **state) { stripe_on(0); }

/* The same with provider keys and virtual addresses, the registration
 * path of verbs and efa: each domain numbers its keys itself (here both
 * from 1), so only the domain a key is used in tells them apart. */
static void striped_with_provider_keys(void **state) { stripe_on(1); }

/* fda1's connections die: its chunks move to fda0, every transfer still
 * completes verified, and fda1's rail was taken out of use (counted as a
 * failure: it is tried again after 3 s, which three round trips under
 * TSan outlast, so whether it is down now is not the test's to say). */
static void one_device_cut(void **state) {
  if (!in_namespace)
    skip();
  test_rig r;
  test_rig_start(&r, two_device_engine(), two_device_engine(), BIG);
  uint64_t before[2], after[2];
  stripe(&r, before);
  /* fda1's: the target's listener and connections, the initiator's
   * connections from its own fda1 domain */
  int cut = test_rig_cut_sockets(DEVICE_1);
  print_message("cut %d sockets on 10.77.1.1\n", cut);
  assert_true(cut >= 2); /* the listener and at least one connection */
  for (int i = 0; i < 3; i++)
    test_rig_round_trip(&r);
  int up[2];
  uint64_t failures[2];
  assert_int_equal(device_bytes(&r, after, up), 2);
  test_rig_rail_failures(&r, failures, 2);
  print_message("after the cut: fda0 +%llu bytes, fda1 +%llu bytes, up %d %d, failures %llu %llu\n",
                (unsigned long long)(after[0] - before[0]),
                (unsigned long long)(after[1] - before[1]), up[0], up[1],
                (unsigned long long)failures[0], (unsigned long long)failures[1]);
  assert_true(after[0] > before[0] && up[0] && !failures[0] && failures[1]);
  test_rig_stop(&r);
}

int main(void) {
  in_namespace = make_namespace(); /* before any thread: unshare needs one */
  if (!in_namespace)
    fprintf(stderr, "test_fabric_domains: no network namespace with two veth devices here "
                    "(needs root and ip): skipping\n");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_key_per_device),
      cmocka_unit_test(registration_is_all_or_nothing),
      cmocka_unit_test(devices_are_rails_in_the_descriptor),
      cmocka_unit_test(unknown_device_names_the_devices),
      cmocka_unit_test(striped_over_two_devices),
      cmocka_unit_test(striped_with_provider_keys),
      cmocka_unit_test(one_device_cut),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
