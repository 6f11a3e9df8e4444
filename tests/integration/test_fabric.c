/* test_fabric.c - the libfabric transport's own behaviour, two engines in
 * this process: the provider choice (automatic fallback with one line, a
 * named provider or device that cannot start), the descriptor decoded as
 * untrusted input, done-means-landed for WRITEs (the target's memory holds
 * the bytes the moment the call returns), the key of a region registered
 * or unregistered after connect, and no CPU while idle. The two-process
 * suite over fabric is test_transfer, run as test_transfer_fabric_*. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "base/clock.h"
#include "descriptor.h"
#include "ferry.h"
#include "harness.h"
#include "transport/fabric.h"

#define KiB 1024u

/* An engine on fabric alone with provider (NULL: automatic) and lanes (0:
 * the default); *st gets the create status. */
static ferry_engine *fabric_engine(const char *provider, const char *device, unsigned lanes,
                                   ferry_status *st) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_FABRIC;
  cfg.fabric_provider = provider;
  cfg.fabric_device = device;
  cfg.fabric_lanes = lanes;
  cfg.timeout_ms = cfg.connect_timeout_ms = TEST_SETUP_MS; /* no case here is about time */
  ferry_engine *e = NULL;
  *st = ferry_engine_create(&cfg, &e);
  return e;
}

static ferry_engine *lanes_engine(const char *provider, unsigned lanes) {
  ferry_status st;
  ferry_engine *e = fabric_engine(provider, NULL, lanes, &st);
  if (st)
    fail_msg("engine on %s: %s", provider, ferry_last_error());
  return e;
}

static ferry_engine *must_engine(const char *provider) { return lanes_engine(provider, 0); }

struct captured {
  pthread_mutex_t lock;
  int fallback_lines;
  char line[512];
};

static void capture(const ferry_log_record *r, void *arg) {
  struct captured *c = arg;
  pthread_mutex_lock(&c->lock);
  if (strstr(r->message, "fabric transport off")) {
    c->fallback_lines++;
    snprintf(c->line, sizeof c->line, "%s", r->message);
  }
  pthread_mutex_unlock(&c->lock);
}

/* No RDMA device here: the engine starts on its other transports and one
 * INFO line says why, naming what fi_getinfo was asked. */
static void automatic_choice_falls_back_with_one_line(void **state) {
  char probe[256];
  if (ferry_fabric_probe("verbs;ofi_rxm", probe, sizeof probe))
    skip(); /* a host with an RDMA device uses it: nothing falls back */
  struct captured c = {.lock = PTHREAD_MUTEX_INITIALIZER};
  ferry_log_set_handler(capture, &c);
  ferry_config cfg;
  test_config(&cfg);
  cfg.fabric_provider = NULL;
  cfg.log_level = FERRY_LOG_INFO; /* the line is at INFO */
  cfg.log_level_set = 1;
  ferry_engine *e = NULL;
  ferry_status st = ferry_engine_create(&cfg, &e);
  ferry_log_set_handler(NULL, NULL);
  assert_int_equal(st, FERRY_OK);
  print_message("%s\n", c.line);
  assert_int_equal(c.fallback_lines, 1);
  assert_non_null(strstr(c.line, "no RDMA device"));
  assert_non_null(strstr(c.line, "fi_getinfo(verbs;ofi_rxm)"));
  assert_non_null(strstr(strstr(c.line, "; using "), "tcp"));
  ferry_engine_destroy(e);
  /* fabric alone, automatic, no device: nothing left to run on */
  e = fabric_engine(NULL, NULL, 0, &st);
  assert_int_equal(st, FERRY_ETRANSPORT);
  assert_non_null(strstr(ferry_last_error(), "no RDMA device"));
}

static void named_provider_that_cannot_start_is_an_error(void **state) {
  ferry_status st;
  assert_null(fabric_engine("no-such-provider", NULL, 0, &st));
  assert_int_equal(st, FERRY_ETRANSPORT);
  print_message("%s\n", ferry_last_error());
  assert_non_null(strstr(ferry_last_error(), "no-such-provider"));
  assert_non_null(strstr(ferry_last_error(), "fi_getinfo"));
  /* an unknown device names the ones that exist */
  assert_null(fabric_engine("tcp;ofi_rxm", "mlx5_9", 0, &st));
  assert_int_equal(st, FERRY_ETRANSPORT);
  print_message("%s\n", ferry_last_error());
  assert_non_null(strstr(ferry_last_error(), "\"mlx5_9\" not found"));
  assert_non_null(strstr(ferry_last_error(), "lo"));
}

/* ferry doctor's device check: every fabric_device entry that names no
 * domain of the provider (whole names only: "l" is not "lo"), with the
 * domains that exist. */
static void missing_devices_are_named(void **state) {
  char missing[256], have[256];
  int n = ferry_fabric_missing_devices("tcp;ofi_rxm", "lo,mlx5_9,l,eth9", missing, sizeof missing,
                                       have, sizeof have);
  assert_int_equal(n, 3);
  assert_string_equal(missing, "mlx5_9, l, eth9");
  assert_non_null(strstr(have, "lo"));
  assert_int_equal(
      ferry_fabric_missing_devices("tcp;ofi_rxm", "lo", missing, sizeof missing, have, sizeof have),
      0);
  assert_string_equal(missing, "");
}

/* Every truncation and a flipped byte of a real descriptor: decoded without
 * reading past the end, and refused unless still well formed. One lane: no
 * lanes list (that one is test_fabric_lanes). */
static void descriptor_is_checked_as_untrusted_input(void **state) {
  ferry_engine *e = lanes_engine("tcp;ofi_rxm", 1);
  uint8_t real[FERRY_WIRE_MAX_DESCRIPTOR];
  size_t len = ferry_fabric_describe(e, real, sizeof real);
  assert_true(len > 20);
  ferry_fabric_descriptor d;
  char why[160];
  assert_int_equal(ferry_fabric_descriptor_decode(real, len, &d, why, sizeof why), 1);
  assert_string_equal(d.provider, "tcp;ofi_rxm");
  test_descriptor_cuts(real, len, NULL, 0);
  test_descriptor_refused(real, len, len, 2, 200, "malformed"); /* a name past the end */
  ferry_engine_destroy(e);
}

/* A WRITE is done when its bytes are in the target's memory: checked the
 * moment each call returns, without asking the target anything. With local
 * completion (bytes handed to a socket) the check sees old bytes. */
static void write_is_done_when_landed(void **state) {
  ferry_engine *a = must_engine("tcp;ofi_rxm"), *b = must_engine("tcp;ofi_rxm");
  size_t size = 256 * KiB;
  uint8_t *dst = test_buffer(a, size), *src = test_buffer(b, size);
  unsigned transport = 0;
  assert_int_equal(ferry_peer_transport(b, ferry_engine_name(a), &transport), FERRY_OK);
  assert_int_equal(transport, FERRY_TRANSPORT_FABRIC);
  for (int round = 0; round < 200; round++) {
    memset(src, round + 1, size);
    assert_int_equal(ferry_transfer_sync(b, ferry_engine_name(a), FERRY_OP_WRITE, src,
                                         (uint64_t)(uintptr_t)dst, size),
                     FERRY_OK);
    if (dst[size - 1] != (uint8_t)(round + 1) || memcmp(dst, src, size) != 0)
      fail_msg("round %d: the WRITE returned before its bytes landed", round);
  }
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  free(dst);
  free(src);
}

/* A region registered after the first contact gets a key the initiator
 * fetches on its miss; one unregistered since is refused (the target no
 * longer holds the key) with the endpoint still usable. Both providers: shm
 * drops such an operation silently, the stall check catches it. */
static void late_regions_and_stale_keys(const char *provider) {
  ferry_engine *a = must_engine(provider), *b = must_engine(provider);
  uint8_t *first = test_buffer(a, 4 * KiB), *src = test_buffer(b, 64 * KiB);
  const char *target = ferry_engine_name(a);
  assert_int_equal(
      ferry_transfer_sync(b, target, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)first, 4 * KiB),
      FERRY_OK);
  uint8_t *later = test_buffer(a, 64 * KiB);
  test_fill_random(src, 64 * KiB, 9);
  assert_int_equal(
      ferry_transfer_sync(b, target, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)later, 64 * KiB),
      FERRY_OK);
  assert_memory_equal(src, later, 64 * KiB);
  assert_int_equal(ferry_memory_unregister(a, later), FERRY_OK);
  ferry_status st =
      ferry_transfer_sync(b, target, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)later, 64 * KiB);
  print_message("%s: %s\n", provider, ferry_last_error());
  assert_int_equal(st, FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "not registered"));
  test_round_trip(b, target, src, src + 32 * KiB, (uint64_t)(uintptr_t)first, 4 * KiB, 10);
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  free(first);
  free(later);
  free(src);
}

static void late_regions_and_stale_keys_tcp(void **state) {
  late_regions_and_stale_keys("tcp;ofi_rxm");
}

static void late_regions_and_stale_keys_shm(void **state) { late_regions_and_stale_keys("shm"); }

static long process_ticks(void) {
  FILE *f = fopen("/proc/self/stat", "r");
  char buf[1024];
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f)
    fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  long utime = 0, stime = 0;
  if (!p ||
      sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &utime, &stime) != 2)
    return -1;
  return utime + stime;
}

/* Every lane of e sleeps on its wake word (fabric_wake.c). */
static int lanes_asleep(ferry_engine *e) {
  const ferry_fabric *f = e->fabric;
  for (unsigned i = 0; i < f->lane_count; i++)
    if (!f->lanes[i].sleep_word ||
        __atomic_load_n(f->lanes[i].sleep_word, __ATOMIC_SEQ_CST) != FERRY_FABRIC_SLEEPING)
      return 0;
  return 1;
}

/* Lane wake-ups, or (woken) sleeps on the wake word a flip of it ended. */
static uint64_t lane_sum(ferry_engine *e, int woken) {
  uint64_t n = 0;
  for (unsigned i = 0; i < e->fabric->lane_count; i++)
    n += __atomic_load_n(woken ? &e->fabric->lanes[i].woken : &e->fabric->lanes[i].rounds,
                         __ATOMIC_RELAXED);
  return n;
}

/* shm has no wait fd: an idle lane sleeps on its wake word, which the
 * first initiator waiting on it flips. So two idle engines after traffic
 * cost no CPU and their lanes do not wake (a capped poll wakes ~50 times
 * a second per lane; the wake word's safety cap once a second), and the
 * next transfer's initiator wakes the target (its latency printed). */
static void idle_polled_engines_use_no_cpu(void **state) {
  ferry_engine *a = lanes_engine("shm", 2), *b = lanes_engine("shm", 2); /* 1 by default */
  size_t big = 16 * KiB * KiB; /* two chunks: two channels, one per lane */
  uint8_t *dst = test_buffer(a, big), *src = test_buffer(b, big);
  test_round_trip(b, ferry_engine_name(a), src, src + 32 * KiB, (uint64_t)(uintptr_t)dst, 32 * KiB,
                  11);
  for (int i = 0; i < 6000 && !(lanes_asleep(a) && lanes_asleep(b)); i++)
    usleep(10 * 1000); /* a poll with a 60 s bound: the backoff's length on a busy host */
  assert_true(lanes_asleep(a) && lanes_asleep(b));
  long before = process_ticks();
  uint64_t woke = lane_sum(a, 0) + lane_sum(b, 0);
  sleep(2);
  long used = process_ticks() - before;
  woke = lane_sum(a, 0) + lane_sum(b, 0) - woke;
  print_message("two idle shm-provider engines used %ld ticks and %llu lane wake-ups in 2 s\n",
                used, (unsigned long long)woke);
  assert_true(before >= 0 && used <= 3);
  /* each lane at most the safety cap's 2 (+1) */
  assert_true(woke <= 3 * (a->fabric->lane_count + b->fabric->lane_count));
  uint64_t t0 = ferry_now_ns(), flips = lane_sum(a, 1);
  assert_int_equal(ferry_transfer_sync(b, ferry_engine_name(a), FERRY_OP_WRITE, src,
                                       (uint64_t)(uintptr_t)dst, 4 * KiB),
                   FERRY_OK);
  print_message("first 4 KiB WRITE after idle: %.0f us\n", (ferry_now_ns() - t0) / 1e3);
  assert_true(lane_sum(a, 1) > flips); /* the initiator woke the target, not the cap */
  /* and a batch on both lanes (lane 1 likely still asleep) */
  test_fill_random(src, big, 12);
  assert_int_equal(ferry_transfer_sync(b, ferry_engine_name(a), FERRY_OP_WRITE, src,
                                       (uint64_t)(uintptr_t)dst, big),
                   FERRY_OK);
  assert_memory_equal(src, dst, big);
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  free(dst);
  free(src);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(automatic_choice_falls_back_with_one_line),
      cmocka_unit_test(named_provider_that_cannot_start_is_an_error),
      cmocka_unit_test(missing_devices_are_named),
      cmocka_unit_test(descriptor_is_checked_as_untrusted_input),
      cmocka_unit_test(write_is_done_when_landed),
      cmocka_unit_test(late_regions_and_stale_keys_tcp),
      cmocka_unit_test(late_regions_and_stale_keys_shm),
      cmocka_unit_test(idle_polled_engines_use_no_cpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
