/* test_store_cxl.c - a master's CXL pool (--enable_cxl, docs/store.md
 * "CXL"): every value lives in one device that each client maps itself, a
 * file here. A value put by this process is read by a client in another
 * process and found in the file where the master placed it; clients and
 * masters that disagree about the pool are refused at open with the
 * reason; a full pool evicts. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"
#include "store/map.h"
#include "store/master.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define POOL (16 * MiB)

typedef struct rig {
  char device[64]; /* the pool's file */
  pid_t master;
  char addr[64];
} rig;

/* A file of size bytes standing in for the device. */
static void device_create(rig *r, size_t size) {
  snprintf(r->device, sizeof r->device, "/tmp/ferry-cxl-XXXXXX");
  int fd = mkstemp(r->device);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)size), 0);
  close(fd);
}

/* A master with --enable_cxl over the rig's device and pool_size bytes
 * (flag: one more, or NULL). */
static void rig_start(rig *r, const char *pool_size, const char *flag) {
  char path_flag[96], size_flag[48];
  snprintf(path_flag, sizeof path_flag, "--cxl_path=%s", r->device);
  snprintf(size_flag, sizeof size_flag, "--cxl_size=%s", pool_size);
  const char *argv[] = {test_tool_path(), "store-master", "--port=0", "--enable_cxl",
                        path_flag,        size_flag,      flag,       NULL};
  char line[256];
  r->master = test_tool_start(argv, line, sizeof line);
  if (r->master <= 0 || sscanf(line, "ready master=%63s", r->addr) != 1)
    fail_msg("store-master did not start (line \"%s\")", r->master > 0 ? line : "");
}

static void rig_stop(rig *r) {
  test_stop_expect_clean_exit(r->master, "store-master");
  unlink(r->device);
}

static ferry_engine *engine_new(void) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = FERRY_TRANSPORT_TCP;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  return e;
}

/* A client mapping device (NULL: none) of map_size bytes, with segment. */
static ferry_status open_client(ferry_engine *e, const char *master, const char *device,
                                size_t map_size, size_t segment, ferry_store **out) {
  ferry_store_config cfg;
  ferry_store_config_init(&cfg);
  cfg.master = master;
  cfg.segment_size = segment;
  cfg.cxl_path = device;
  cfg.cxl_size = map_size;
  return ferry_store_open(e, &cfg, out);
}

/* Whether p holds the n bytes test_fill_random(seed) gives: -1, or the
 * first byte that differs. */
static long mismatch(const uint8_t *p, size_t n, unsigned seed) {
  uint8_t *want = malloc(n);
  test_fill_random(want, n, seed);
  long at = -1;
  for (size_t i = 0; i < n && at < 0; i++)
    if (p[i] != want[i])
      at = (long)i;
  free(want);
  return at;
}

static const size_t sizes[] = {100, 4 * KiB, 64 * KiB + 3, 1 * MiB};
#define VALUES (sizeof sizes / sizeof sizes[0])

/* The reader, in a process of its own: once the parent writes a byte to
 * go, gets every value into memory it never registered and checks its
 * bytes. Its exit status: 0, or 1 with the reason on stderr. */
static void reader_main(const char *master, const char *device, int go) {
  char c;
  if (read(go, &c, 1) != 1)
    _exit(1);
  ferry_engine *e = engine_new();
  ferry_store *s;
  if (open_client(e, master, device, POOL, 0, &s) != FERRY_OK) {
    fprintf(stderr, "reader: open: %s\n", ferry_last_error());
    _exit(1);
  }
  int bad = 0;
  for (size_t i = 0; i < VALUES && !bad; i++) {
    char key[32];
    snprintf(key, sizeof key, "cxl-%zu", i);
    uint8_t *buf = malloc(sizes[i]);
    size_t got = 0;
    ferry_status st = ferry_store_get_into(s, key, buf, sizes[i], &got);
    long at = st ? -1 : mismatch(buf, got, (unsigned)i);
    if (st || got != sizes[i] || at >= 0) {
      fprintf(stderr, "reader: %s: %s, %zu bytes, first wrong byte %ld\n", key,
              st ? ferry_last_error() : "read", got, at);
      bad = 1;
    }
    free(buf);
  }
  ferry_store_close(s);
  ferry_engine_destroy(e);
  _exit(bad);
}

/* Puts from this process (one replica asked for twice: one copy in the
 * pool serves all), reads from another, and the bytes are in the device
 * at the address the master gave. Red when values take a ferry transfer
 * (there is no peer named after the pool) or land elsewhere. */
static void a_value_put_here_is_read_by_another_process(void **state) {
  (void)state;
  rig r;
  device_create(&r, POOL);
  rig_start(&r, "16M", NULL);
  int go[2];
  assert_int_equal(pipe(go), 0);
  pid_t reader = fork();
  assert_true(reader >= 0);
  if (reader == 0) {
    close(go[1]);
    reader_main(r.addr, r.device, go[0]);
  }
  close(go[0]);
  ferry_engine *e = engine_new();
  ferry_store *s;
  if (open_client(e, r.addr, r.device, POOL, 0, &s) != FERRY_OK)
    fail_msg("open: %s", ferry_last_error());
  ferry_store_replicate two;
  ferry_store_replicate_init(&two);
  two.replicas = 2;
  int fd = open(r.device, O_RDONLY);
  assert_true(fd >= 0);
  for (size_t i = 0; i < VALUES; i++) {
    char key[32];
    snprintf(key, sizeof key, "cxl-%zu", i);
    uint8_t *buf = malloc(sizes[i]), *seen = malloc(sizes[i]);
    test_fill_random(buf, sizes[i], i);
    if (ferry_store_put_from(s, key, buf, sizes[i], &two) != FERRY_OK)
      fail_msg("put_from %s: %s", key, ferry_last_error());
    ferry_store_replica_list where = {key, 0, 0, 0, NULL};
    assert_int_equal(ferry_store_replicas_batch(s, &where, 1), FERRY_OK);
    assert_int_equal(where.count, 1);
    assert_true(where.replicas[0].address >= STORE_POOL_BASE);
    assert_int_equal(
        pread(fd, seen, sizes[i], (off_t)(where.replicas[0].address - STORE_POOL_BASE)),
        (ssize_t)sizes[i]);
    assert_int_equal(mismatch(seen, sizes[i], (unsigned)i), -1);
    ferry_store_replica_lists_free(&where, 1);
    free(buf);
    free(seen);
  }
  close(fd);
  assert_int_equal(write(go[1], "g", 1), 1);
  close(go[1]);
  int status = 0;
  assert_int_equal(waitpid(reader, &status, 0), reader);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  ferry_store_close(s);
  ferry_engine_destroy(e);
  rig_stop(&r);
}

/* open's refusal of st, its detail naming what. */
static void expect_refused(ferry_engine *e, const char *master, const char *device, size_t map_size,
                           size_t segment, ferry_status st, const char *what) {
  ferry_store *s = NULL;
  assert_int_equal(open_client(e, master, device, map_size, segment, &s), st);
  if (!strstr(ferry_last_error(), what))
    fail_msg("expected \"%s\" in: %s", what, ferry_last_error());
  assert_null(s);
}

/* A client and a master that disagree about the pool are refused at
 * open, each with why: no mapping of a pool, a mapping without a pool,
 * a mapping smaller than the pool, a file shorter than its mapping, a
 * segment beside the pool (the client's check and the master's). */
static void clients_that_disagree_with_the_master_are_refused(void **state) {
  (void)state;
  rig r;
  device_create(&r, POOL);
  rig_start(&r, "16M", NULL);
  ferry_engine *e = engine_new();
  expect_refused(e, r.addr, NULL, 0, 0, FERRY_EINVAL, "must map that device");
  expect_refused(e, r.addr, NULL, 0, 1 * MiB, FERRY_EINVAL, "contributes no segment");
  expect_refused(e, r.addr, r.device, POOL, 1 * MiB, FERRY_EINVAL, "contributes no segment");
  expect_refused(e, r.addr, r.device, POOL / 2, 0, FERRY_EINVAL, "map at least");
  expect_refused(e, r.addr, r.device, 2 * POOL, 0, FERRY_EINVAL, "holds 16777216 bytes");
  expect_refused(e, r.addr, r.device, 0, 0, FERRY_EINVAL, "without cxl_size");
  expect_refused(e, r.addr, "/nonexistent/cxl", POOL, 0, FERRY_EINVAL, "cannot open");
  rig_stop(&r);
  /* A master without the flag. */
  const char *argv[] = {test_tool_path(), "store-master", "--port=0", NULL};
  char line[256], addr[64];
  pid_t plain = test_tool_start(argv, line, sizeof line);
  assert_true(plain > 0 && sscanf(line, "ready master=%63s", addr) == 1);
  device_create(&r, POOL);
  expect_refused(e, addr, r.device, POOL, 0, FERRY_EINVAL, "without --enable_cxl");
  unlink(r.device);
  test_stop_expect_clean_exit(plain, "store-master");
  ferry_engine_destroy(e);
}

/* The tiers that write values to disk need an owner the pool's values do
 * not have: refused by name. */
static void the_pool_refuses_the_disk_tiers(void **state) {
  (void)state;
  store_master_config cfg = {0};
  cfg.enable_cxl = 1;
  cfg.cxl_size = POOL;
  cfg.enable_offload = 1;
  store_master *m = NULL;
  assert_int_equal(store_master_start(&cfg, &m), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "--enable_offload"));
  cfg.enable_offload = 0;
  cfg.root_fs_dir = "/tmp";
  assert_int_equal(store_master_start(&cfg, &m), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "--root_fs_dir"));
}

/* A pool of 4 MiB holds two 1.5 MiB values: a third evicts the least
 * recently used, and every value left reads back whole. */
static void a_full_pool_evicts_the_least_recently_used(void **state) {
  (void)state;
  rig r;
  device_create(&r, 4 * MiB);
  rig_start(&r, "4M", "--eviction_high_watermark_ratio=1");
  ferry_engine *e = engine_new();
  ferry_store *s;
  if (open_client(e, r.addr, r.device, 4 * MiB, 0, &s) != FERRY_OK)
    fail_msg("open: %s", ferry_last_error());
  size_t len = 3 * MiB / 2;
  uint8_t *buf = malloc(len);
  for (unsigned i = 0; i < 3; i++) {
    char key[16];
    snprintf(key, sizeof key, "big-%u", i);
    test_fill_random(buf, len, i);
    if (ferry_store_put_from(s, key, buf, len, NULL) != FERRY_OK)
      fail_msg("put %s: %s", key, ferry_last_error());
  }
  assert_int_equal(ferry_store_exists(s, "big-0"), FERRY_ENOTFOUND);
  for (unsigned i = 1; i < 3; i++) {
    char key[16];
    snprintf(key, sizeof key, "big-%u", i);
    size_t got = 0;
    memset(buf, 0, len);
    assert_int_equal(ferry_store_get_into(s, key, buf, len, &got), FERRY_OK);
    assert_int_equal(got, len);
    assert_int_equal(mismatch(buf, len, i), -1);
  }
  free(buf);
  ferry_store_close(s);
  ferry_engine_destroy(e);
  rig_stop(&r);
}

/* A CXL client copies between the caller's memory and the pool: it
 * registers nothing, not even the staging buffer it is offered (red when
 * local_buffer_size is allocated), and a batch of unregistered values
 * reads back whole. */
static void a_client_registers_no_staging(void **state) {
  (void)state;
  rig r;
  device_create(&r, POOL);
  rig_start(&r, "16M", NULL);
  ferry_engine *e = engine_new();
  ferry_store_config cfg;
  ferry_store_config_init(&cfg);
  cfg.master = r.addr;
  cfg.cxl_path = r.device;
  cfg.cxl_size = POOL;
  cfg.local_buffer_size = 8 * MiB;
  ferry_store *s;
  if (ferry_store_open(e, &cfg, &s) != FERRY_OK)
    fail_msg("open: %s", ferry_last_error());
  ferry_region *regions = NULL;
  size_t count = 99;
  assert_int_equal(ferry_peer_regions(e, ferry_engine_name(e), &regions, &count), FERRY_OK);
  assert_int_equal(count, 0);
  free(regions);
  uint8_t *values[2], *back[2];
  ferry_store_item items[2] = {{.key = "batch-0"}, {.key = "batch-1"}};
  for (unsigned i = 0; i < 2; i++) {
    values[i] = malloc(sizes[i]);
    back[i] = calloc(1, sizes[i]);
    test_fill_random(values[i], sizes[i], 40 + i);
    items[i].buf = values[i];
    items[i].length = sizes[i];
  }
  if (ferry_store_put_batch(s, items, 2, NULL) != FERRY_OK)
    fail_msg("put_batch: %s", ferry_last_error());
  for (unsigned i = 0; i < 2; i++)
    items[i].buf = back[i];
  assert_int_equal(ferry_store_get_into_batch(s, items, 2), FERRY_OK);
  for (unsigned i = 0; i < 2; i++) {
    assert_int_equal(items[i].status, FERRY_OK);
    assert_int_equal(items[i].length, sizes[i]);
    assert_int_equal(mismatch(back[i], sizes[i], 40 + i), -1);
    free(values[i]);
    free(back[i]);
  }
  ferry_store_close(s);
  ferry_engine_destroy(e);
  rig_stop(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_value_put_here_is_read_by_another_process),
      cmocka_unit_test(clients_that_disagree_with_the_master_are_refused),
      cmocka_unit_test(the_pool_refuses_the_disk_tiers),
      cmocka_unit_test(a_full_pool_evicts_the_least_recently_used),
      cmocka_unit_test(a_client_registers_no_staging),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
