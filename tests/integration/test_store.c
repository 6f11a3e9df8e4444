/* test_store.c - the store (docs/store.md, RELIABILITY.md 22) end to end: a
 * master process (`ferry store-master`), a client in this process and one
 * in a child process of its own (started afresh with exec: it is killed
 * or stopped by some cases), every byte of every value checked.
 *
 * What happens between a put's start and its end is driven with a raw
 * client speaking the store protocol by hand (protocol.h), which stops
 * where the case needs it: no sleeps. Where the master must notice
 * something (a client's death), the case waits for it with a generous
 * bound, asserting what it then sees. The cases of a master restart run
 * the master in this process (master.h), stopped and started again on the
 * same port, and hold a put inside its WRITE with a stopped client
 * process holding the replica. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "base/clock.h"
#include "base/error.h"
#include "child.h"
#include "ferry.h"
#include "harness.h"
#include "net/auth.h"
#include "store/disk.h"
#include "store/handshake.h"
#include "store/master.h"
#include "store/protocol.h"
#include "store_op.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define SEGMENT (8 * MiB)

/* ---- processes and clients ------------------------------------------------------------------ */

typedef struct master_proc {
  pid_t pid;
  char addr[64];
} master_proc;

/* `ferry store-master --port=0 [flags...]` (argv: the tool's), its address
 * from its ready line. */
static void master_start_argv(master_proc *m, const char *const *argv) {
  char line[256];
  m->pid = test_tool_start(argv, line, sizeof line);
  if (m->pid <= 0 || sscanf(line, "ready master=%63s", m->addr) != 1)
    fail_msg("store-master did not start (line \"%s\")", m->pid > 0 ? line : "");
}

static void master_start(master_proc *m, const char *flag1, const char *flag2) {
  const char *argv[] = {test_tool_path(), "store-master", "--port=0", flag1, flag2, NULL};
  master_start_argv(m, argv);
}

/* SIGTERM: the master stops cleanly (under ASan, with its leak check) and
 * exits 0. */
static void master_stop(master_proc *m) { test_stop_expect_clean_exit(m->pid, "store-master"); }

static ferry_engine *engine_over(unsigned transports) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = transports;
  ferry_engine *e = NULL;
  return ferry_engine_create(&cfg, &e) == FERRY_OK ? e : NULL;
}

static ferry_engine *engine_on_loopback(void) { return engine_over(0); }

static ferry_status store_on(ferry_engine *e, const char *master, size_t segment,
                             const char *secret, ferry_store **out) {
  ferry_store_config cfg;
  ferry_store_config_init(&cfg);
  cfg.master = master;
  cfg.segment_size = segment;
  cfg.local_buffer_size = 1 * MiB;
  cfg.secret = secret;
  return ferry_store_open(e, &cfg, out);
}

/* A client of our own: an engine and its store. */
typedef struct local_client {
  ferry_engine *engine;
  ferry_store *store;
} local_client;

static void local_open_over(local_client *c, const char *master, size_t segment,
                            unsigned transports) {
  c->engine = engine_over(transports);
  assert_non_null(c->engine);
  if (store_on(c->engine, master, segment, NULL, &c->store) != FERRY_OK)
    fail_msg("ferry_store_open: %s", ferry_last_error());
}

static void local_open(local_client *c, const char *master, size_t segment) {
  local_open_over(c, master, segment, 0);
}

static void local_close(local_client *c) {
  ferry_store_close(c->store);
  ferry_engine_destroy(c->engine);
}

/* Most cases: a master process and a client of our own. */
typedef struct rig {
  master_proc m;
  local_client a;
} rig;

static void rig_open(rig *r, const char *flag, size_t segment) {
  master_start(&r->m, flag, NULL);
  local_open(&r->a, r->m.addr, segment);
}

static void rig_close(rig *r) {
  local_close(&r->a);
  master_stop(&r->m);
}

/* Puts key until the master no longer answers EBUSY (it must first see a
 * writer's put revoked), TEST_SETUP_MS at most; returns the last status. */
static ferry_status put_once_free(ferry_store *s, const char *key, void *buf, size_t len) {
  ferry_status st;
  double until = test_now_s() + TEST_SETUP_MS / 1000.0;
  while ((st = ferry_store_put_from(s, key, buf, len, NULL)) == FERRY_EBUSY && test_now_s() < until)
    usleep(10000);
  return st;
}

/* The bytes of a value: a function of its seed and position. */
static uint8_t pattern(unsigned seed, size_t i) {
  return (uint8_t)(seed * 131u + i * 7u + (i >> 9) * 13u + 1u);
}

static void fill(uint8_t *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = pattern(seed, i);
}

/* The first byte that differs, or -1. */
static long mismatch(const uint8_t *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern(seed, i))
      return (long)i;
  return -1;
}

/* Reads key into buf (len bytes, cleared first) and checks every byte. */
static void expect_bytes(ferry_store *s, const char *key, uint8_t *buf, size_t len, unsigned seed) {
  memset(buf, 0, len);
  if (ferry_store_get_into(s, key, buf, len, NULL) != FERRY_OK)
    fail_msg("get %s: %s", key, ferry_last_error());
  assert_int_equal(mismatch(buf, len, seed), -1);
}

/* ferry_store_get of key (into a copy of its own): len bytes, each checked. */
static void expect_copy(ferry_store *s, const char *key, size_t len, unsigned seed) {
  void *copy;
  size_t got;
  if (ferry_store_get(s, key, &copy, &got) != FERRY_OK)
    fail_msg("get %s: %s", key, ferry_last_error());
  assert_int_equal(got, len);
  assert_int_equal(mismatch(copy, got, seed), -1);
  free(copy);
}

/* A replicate filled as ferry.h says: init, then the fields. */
static ferry_store_replicate replicate(unsigned replicas, const char *preferred, int pin) {
  ferry_store_replicate rep;
  ferry_store_replicate_init(&rep);
  rep.replicas = replicas;
  rep.preferred_segment = preferred;
  rep.pin = pin;
  return rep;
}

/* ---- the child client ----------------------------------------------------------------------- */

/* Role "client" MASTER: a client with a segment that prints "ready
 * SEGMENT", then serves lines from stdin until it ends:
 *   put KEY SIZE SEED PREFERRED   (PREFERRED "-": any segment)
 *   get KEY SIZE SEED             (every byte checked)
 * answering "ok" or "err STATUS DETAIL" per line. */
static int answer(ferry_status st, const char *what) {
  if (st == FERRY_OK)
    printf("ok\n");
  else
    printf("err %d %s: %s\n", st, what, ferry_last_error());
  return fflush(stdout);
}

static int client_role(int argc, char **argv) {
  ferry_engine *e = argc == 1 ? engine_on_loopback() : NULL;
  ferry_store *s;
  uint8_t *buf;
  if (!e || store_on(e, argv[0], SEGMENT, NULL, &s) != FERRY_OK ||
      ferry_memory_alloc(e, 4 * MiB, (void **)&buf) != FERRY_OK)
    return 2;
  printf("ready %s\n", ferry_store_segment(s));
  fflush(stdout);
  char line[512], key[256], pref[256];
  size_t size;
  unsigned seed;
  while (fgets(line, sizeof line, stdin)) {
    if (sscanf(line, "put %255s %zu %u %255s", key, &size, &seed, pref) == 4) {
      ferry_store_replicate rep =
          replicate(1, strcmp(pref, "-") ? pref : NULL, FERRY_STORE_PIN_NONE);
      fill(buf, size, seed);
      answer(ferry_store_put_from(s, key, buf, size, &rep), "put");
    } else if (sscanf(line, "get %255s %zu %u", key, &size, &seed) == 3) {
      size_t got = 0;
      memset(buf, 0, size);
      ferry_status st = ferry_store_get_into(s, key, buf, 4 * MiB, &got);
      if (!st && (got != size || mismatch(buf, size, seed) >= 0))
        st = ferry_fail(FERRY_ECHECKSUM, "%s: the bytes read differ", key);
      answer(st, "get");
    }
  }
  ferry_store_close(s);
  ferry_engine_destroy(e);
  return 0;
}

typedef struct child_client {
  pid_t pid;
  int to, from;
  char segment[128];
} child_client;

static void child_open(child_client *c, const char *master) {
  const char *args[] = {master, NULL};
  c->pid = test_child_start("client", args, &c->to, &c->from);
  assert_true(c->pid > 0);
  char line[256];
  if (test_read_line(c->from, line, sizeof line, TEST_SETUP_MS) != 0 ||
      sscanf(line, "ready %127s", c->segment) != 1)
    fail_msg("the child client did not start");
}

/* Sends one command line and returns its answer line. */
static void child_say(child_client *c, char *answer_line, size_t size, const char *fmt, ...) {
  char cmd[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  assert_int_equal(write(c->to, cmd, (size_t)n), n);
  if (test_read_line(c->from, answer_line, size, TEST_SETUP_MS) != 0)
    fail_msg("the child client did not answer \"%s\"", cmd);
}

static void child_expect_ok(child_client *c, const char *fmt, ...) {
  char cmd[512], line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  child_say(c, line, sizeof line, "%s", cmd);
  if (strcmp(line, "ok") != 0)
    fail_msg("child: %s-> %s", cmd, line);
}

static void child_close(child_client *c) {
  close(c->to);
  int status = -1;
  assert_int_equal(test_wait_exit(c->pid, TEST_SETUP_MS, &status), 0);
  close(c->from);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Stopped for sure, not just signalled. */
static void child_stop(child_client *c) {
  int status;
  kill(c->pid, SIGSTOP);
  assert_int_equal(waitpid(c->pid, &status, WUNTRACED), c->pid);
  assert_true(WIFSTOPPED(status));
}

static void child_kill(child_client *c) {
  test_kill_and_reap(c->pid, TEST_SETUP_MS);
  close(c->to);
  close(c->from);
}

/* ---- a raw client, by hand ------------------------------------------------------------------ */

typedef struct raw_client {
  int fd;
  ferry_sock sock;
  ferry_session session;
} raw_client;

static store_reader raw_request(raw_client *r, store_writer *w, uint32_t count, uint8_t **body) {
  ferry_frame_header h;
  assert_int_equal(store_send(&r->sock, FERRY_FRAME_STORE, count, 0, w, "raw request"), FERRY_OK);
  assert_int_equal(store_recv(&r->sock, &h, body, "raw reply"), FERRY_OK);
  if (h.status)
    fail_msg("raw request refused: %.*s", (int)h.body_len, (const char *)*body);
  return (store_reader){*body, (size_t)h.body_len, 0};
}

/* Connects and says HELLO (and nothing else yet). */
static void raw_connect(raw_client *r, const char *master) {
  char host[FERRY_HOST_MAX];
  uint16_t port;
  assert_int_equal(ferry_net_parse_target(master, host, &port), FERRY_OK);
  assert_int_equal(
      ferry_net_connect(host, port, ferry_now_ns() + TEST_SETUP_MS * 1000000ull, &r->fd), FERRY_OK);
  ferry_sock_init(&r->sock, r->fd, master);
  store_identity self = {ferry_random_u64(), "raw", NULL};
  uint64_t master_id;
  assert_int_equal(store_handshake_connect(&r->sock, &r->session, &self, &master_id), FERRY_OK);
}

/* A REGISTER without a segment, speaking store protocol `version`. */
static void raw_register(store_writer *w, uint16_t version) {
  store_put_u8(w, STORE_REGISTER);
  store_put_u16(w, version);
  store_put_u64(w, 0);
  store_put_u64(w, 0);
  store_put_str(w, "", 0);
  store_put_u64(w, 0); /* nonce: no segment */
}

/* Connects and registers without a segment. */
static void raw_open(raw_client *r, const char *master) {
  raw_connect(r, master);
  store_writer w = {0};
  raw_register(&w, STORE_PROTOCOL_VERSION);
  uint8_t *body;
  raw_request(r, &w, 0, &body);
  free(body);
}

/* PUT_START (or UPSERT_START: op) of one key in segment `where`; returns
 * the replica's address. */
static uint64_t raw_start(raw_client *r, uint8_t op, const char *key, uint64_t size,
                          const char *where) {
  store_writer w = {0};
  store_put_u8(&w, op);
  store_put_u8(&w, 1);
  store_put_u8(&w, 1); /* one preferred segment */
  store_put_str(&w, where, strlen(where));
  store_put_u8(&w, FERRY_STORE_PIN_NONE);
  store_put_u8(&w, FERRY_STORE_SOFT_PIN_PRESERVE);
  store_put_u8(&w, 0); /* no soft pin TTL */
  store_put_u64(&w, 0);
  store_put_str(&w, key, strlen(key));
  store_put_u64(&w, size);
  uint8_t *body;
  store_reader rd = raw_request(r, &w, 1, &body);
  assert_int_equal((int32_t)store_get_u32(&rd), FERRY_OK);
  store_replica_ref reps[STORE_REPLICAS_MAX];
  unsigned n;
  assert_int_equal(store_get_replicas(&rd, reps, &n, "master"), FERRY_OK);
  assert_int_equal(n, 1);
  assert_int_equal(reps[0].segment_len, strlen(where));
  free(body);
  return reps[0].addr;
}

static uint64_t raw_put_start(raw_client *r, const char *key, uint64_t size, const char *where) {
  return raw_start(r, STORE_PUT_START, key, size, where);
}

/* GET of one key (a lease on it): its first replica's address (0: none);
 * *replicas gets their number, *on_disk the on-disk byte. *replied: when
 * the master's reply came. */
static uint64_t raw_get(raw_client *r, const char *key, unsigned *replicas, uint64_t *replied,
                        uint8_t *on_disk) {
  store_writer w = {0};
  store_put_u8(&w, STORE_GET);
  store_put_str(&w, key, strlen(key));
  uint8_t *body;
  store_reader rd = raw_request(r, &w, 1, &body);
  if (replied)
    *replied = ferry_now_ns();
  assert_int_equal((int32_t)store_get_u32(&rd), FERRY_OK);
  store_get_u64(&rd);
  store_replica_ref reps[STORE_REPLICAS_MAX];
  unsigned n;
  assert_int_equal(store_get_replicas(&rd, reps, &n, "master"), FERRY_OK);
  uint8_t disk = store_get_u8(&rd);
  assert_false(rd.bad || rd.left);
  free(body);
  if (replicas)
    *replicas = n;
  if (on_disk)
    *on_disk = disk;
  return n ? reps[0].addr : 0;
}

static void raw_put_end(raw_client *r, const char *key) {
  store_writer w = {0};
  store_put_u8(&w, STORE_PUT_END);
  store_put_str(&w, key, strlen(key));
  store_put_u32(&w, 0);
  store_put_u8(&w, 0); /* no file written */
  uint8_t *body;
  store_reader rd = raw_request(r, &w, 1, &body);
  assert_int_equal((int32_t)store_get_u32(&rd), FERRY_OK);
  free(body);
}

/* ---- cases ---------------------------------------------------------------------------------- */

/* Keys as SGLang HiCache names them, sizes of KV pages and more. */
static const size_t sizes[] = {4 * KiB, 64 * KiB, 1 * MiB + 3, 100, 256 * KiB};
#define VALUES (sizeof sizes / sizeof *sizes)

static void key_of(char *key, size_t size, const char *prefix, size_t i) {
  snprintf(key, size, "%s_%016llx_0_%s", prefix, (unsigned long long)i * 0x9e3779b97f4a7c15ull,
           i % 2 ? "v" : "k");
}

static void values_move_between_two_clients(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, SEGMENT);
  local_client a = t.a;
  child_client b;
  child_open(&b, t.m.addr);

  /* a -> b's segment, as one batch; b reads each back. */
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(a.engine, 4 * MiB, (void **)&buf), FERRY_OK);
  ferry_store_item items[VALUES];
  char keys[VALUES][96];
  size_t at = 0;
  for (size_t i = 0; i < VALUES; i++) {
    key_of(keys[i], sizeof keys[i], "ab", i);
    fill(buf + at, sizes[i], (unsigned)i);
    items[i] = (ferry_store_item){keys[i], buf + at, sizes[i], FERRY_EINVAL};
    at += sizes[i];
  }
  ferry_store_replicate in_b = replicate(1, b.segment, FERRY_STORE_PIN_NONE);
  if (ferry_store_put_from_batch(a.store, items, VALUES, &in_b) != FERRY_OK)
    fail_msg("batch put: %s", ferry_last_error());
  for (size_t i = 0; i < VALUES; i++) {
    assert_int_equal(items[i].status, FERRY_OK);
    child_expect_ok(&b, "get %s %zu %zu\n", keys[i], sizes[i], i);
  }

  /* b -> a's segment; a reads them as a batch, and one by one. */
  for (size_t i = 0; i < VALUES; i++) {
    key_of(keys[i], sizeof keys[i], "ba", i);
    child_expect_ok(&b, "put %s %zu %zu %s\n", keys[i], sizes[i], i + 100,
                    ferry_store_segment(a.store));
  }
  memset(buf, 0, 4 * MiB);
  at = 0;
  for (size_t i = 0; i < VALUES; i++) {
    items[i] = (ferry_store_item){keys[i], buf + at, sizes[i], FERRY_EINVAL};
    at += sizes[i];
  }
  if (ferry_store_get_into_batch(a.store, items, VALUES) != FERRY_OK)
    fail_msg("batch get: %s", ferry_last_error());
  at = 0;
  for (size_t i = 0; i < VALUES; i++) {
    assert_int_equal(items[i].status, FERRY_OK);
    assert_int_equal(items[i].length, sizes[i]);
    assert_int_equal(mismatch(buf + at, sizes[i], (unsigned)(i + 100)), -1);
    at += sizes[i];
    uint64_t size;
    expect_copy(a.store, keys[i], sizes[i], (unsigned)(i + 100));
    assert_int_equal(ferry_store_exists(a.store, keys[i]), FERRY_OK);
    assert_int_equal(ferry_store_size(a.store, keys[i], &size), FERRY_OK);
    assert_int_equal(size, sizes[i]);
  }
  /* A put of a stored key keeps the first value. */
  fill(buf, 100, 77);
  assert_int_equal(ferry_store_put_from(a.store, keys[3], buf, 100, NULL), FERRY_OK);
  child_expect_ok(&b, "get %s %zu %u\n", keys[3], (size_t)100, 103u);
  assert_int_equal(ferry_store_exists(a.store, "never_put"), FERRY_ENOTFOUND);

  child_close(&b);
  ferry_memory_free(a.engine, buf);
  rig_close(&t);
}

/* ferry_store_put_batch from memory no engine registered (a batch larger
 * than the 1 MiB staging buffer too), then ferry_store_get_ranges: byte
 * ranges of values in the other client's segment (READ) and in this
 * client's own (copied in memory), every byte checked; a range past the
 * value's end, an absent key, a destination not registered or running past
 * its region fail per range, the bytes next to them untouched. */
static void ranges_and_batches_of_any_memory(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, SEGMENT);
  local_client a = t.a;
  child_client b;
  child_open(&b, t.m.addr);

  enum { N = 3 };
  const size_t lens[N] = {100, 640 * KiB, 700 * KiB}; /* 1.3 MiB: past the staging buffer */
  const char *keys[N] = {"pb_small", "pb_mid", "pb_large"};
  uint8_t *plain[N];
  ferry_store_item items[N];
  for (int i = 0; i < N; i++) {
    assert_non_null(plain[i] = malloc(lens[i]));
    fill(plain[i], lens[i], 200u + i);
    items[i] = (ferry_store_item){keys[i], plain[i], lens[i], FERRY_EINVAL};
  }
  ferry_store_replicate in_b = replicate(1, b.segment, FERRY_STORE_PIN_NONE);
  if (ferry_store_put_batch(a.store, items, N, &in_b) != FERRY_OK)
    fail_msg("put_batch: %s", ferry_last_error());
  for (int i = 0; i < N; i++) {
    assert_int_equal(items[i].status, FERRY_OK);
    child_expect_ok(&b, "get %s %zu %u\n", keys[i], lens[i], 200u + i);
  }
  ferry_store_replicate in_a = replicate(1, ferry_store_segment(a.store), FERRY_STORE_PIN_NONE);
  ferry_store_item own = {"own", plain[1], lens[1], FERRY_EINVAL};
  assert_int_equal(ferry_store_put_batch(a.store, &own, 1, &in_a), FERRY_OK);

  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(a.engine, 64 * KiB, (void **)&buf), FERRY_OK);
  memset(buf, '_', 64 * KiB);
  ferry_store_range rg[] = {
      {"pb_mid", buf, 1000, 5000, FERRY_EINVAL},                 /* b's segment */
      {"own", buf + 8 * KiB, 600 * KiB, 40 * KiB, FERRY_EINVAL}, /* a's own */
      {"pb_small", buf + 60 * KiB, 0, 100, FERRY_EINVAL},        /* the whole value */
  };
  if (ferry_store_get_ranges(a.store, rg, 3) != FERRY_OK)
    fail_msg("get_ranges: %s", ferry_last_error());
  for (int i = 0; i < 3; i++)
    assert_int_equal(rg[i].status, FERRY_OK);
  for (size_t i = 0; i < 5000; i++)
    assert_int_equal(buf[i], pattern(201, 1000 + i));
  for (size_t i = 0; i < 40 * KiB; i++)
    assert_int_equal(buf[8 * KiB + i], pattern(201, 600 * KiB + i));
  assert_int_equal(mismatch(buf + 60 * KiB, 100, 200), -1);
  assert_int_equal(buf[5000], '_');

  uint8_t *unregistered = malloc(64);
  memset(buf, '_', 64 * KiB);
  ferry_store_range bad[] = {
      {"own", buf, 640 * KiB - 10, 11, FERRY_OK},                 /* one byte past the value */
      {"absent", buf, 0, 10, FERRY_OK},                           /* no such key */
      {"own", unregistered, 0, 64, FERRY_OK},                     /* not registered */
      {"own", buf + 64 * KiB - 8, 0, 16, FERRY_OK},               /* past the region, a's own */
      {"pb_mid", buf + 64 * KiB - 8, 0, 16, FERRY_OK},            /* past the region, b's */
      {"pb_large", buf + 32 * KiB, 700 * KiB - 16, 16, FERRY_OK}, /* fine, among them */
  };
  assert_int_equal(ferry_store_get_ranges(a.store, bad, 6), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "pass the value's end"));
  const ferry_status want[] = {FERRY_EINVAL,  FERRY_ENOTFOUND, FERRY_ENOTREG,
                               FERRY_ENOTREG, FERRY_ENOTREG,   FERRY_OK};
  for (int i = 0; i < 6; i++)
    assert_int_equal(bad[i].status, want[i]);
  for (size_t i = 0; i < 16; i++)
    assert_int_equal(buf[32 * KiB + i], pattern(202, 700 * KiB - 16 + i));
  for (size_t i = 0; i < 64 * KiB; i++)
    if (i < 32 * KiB || i >= 32 * KiB + 16)
      assert_int_equal(buf[i], '_');
  assert_int_equal(ferry_memory_check(a.engine, buf, 64 * KiB), FERRY_OK);
  assert_int_equal(ferry_memory_check(a.engine, buf + 1, 64 * KiB), FERRY_ENOTREG);
  assert_int_equal(ferry_memory_check(a.engine, unregistered, 64), FERRY_ENOTREG);

  free(unregistered);
  for (int i = 0; i < N; i++)
    free(plain[i]);
  child_close(&b);
  ferry_memory_free(a.engine, buf);
  rig_close(&t);
}

/* A batch larger than one request (4096 keys) is cut into slices; the
 * error a failed batch returns names its first failed item in the
 * caller's order, not the first of whichever slice failed last. */
static void a_large_batch_names_its_first_failure(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, SEGMENT);
  local_client a = t.a;
  enum { N = 4096 + 8, WIDTH = 8 };
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(a.engine, N * WIDTH, (void **)&buf), FERRY_OK);
  char(*keys)[24] = calloc(N, sizeof *keys);
  ferry_store_item *items = calloc(N, sizeof *items);
  assert_non_null(keys);
  assert_non_null(items);
  for (size_t i = 0; i < N; i++) {
    snprintf(keys[i], sizeof keys[i], "large_%zu", i);
    items[i] = (ferry_store_item){keys[i], buf + i * WIDTH, WIDTH, FERRY_EINVAL};
  }
  ferry_store_replicate own = replicate(1, ferry_store_segment(a.store), FERRY_STORE_PIN_NONE);
  if (ferry_store_put_from_batch(a.store, items, N, &own) != FERRY_OK)
    fail_msg("put_from_batch: %s", ferry_last_error());
  /* item 5 of the first slice and item 1 of the second are absent */
  snprintf(keys[5], sizeof keys[5], "absent_first");
  snprintf(keys[4096 + 1], sizeof keys[0], "absent_later");
  assert_int_equal(ferry_store_get_into_batch(a.store, items, N), FERRY_ENOTFOUND);
  assert_non_null(strstr(ferry_last_error(), "absent_first"));
  assert_null(strstr(ferry_last_error(), "absent_later"));
  for (size_t i = 0; i < N; i++)
    assert_int_equal(items[i].status, i == 5 || i == 4096 + 1 ? FERRY_ENOTFOUND : FERRY_OK);
  free(items);
  free(keys);
  ferry_memory_free(a.engine, buf);
  rig_close(&t);
}

/* Between PUT_START and PUT_END the key is invisible; after the writer's
 * connection ends without PUT_END it never appears, and its space and key
 * are free again. */
static void a_put_is_invisible_until_committed(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, SEGMENT);
  local_client a = t.a;
  const char *seg = ferry_store_segment(a.store);

  raw_client r;
  raw_open(&r, t.m.addr);
  raw_put_start(&r, "pending_k", 64 * KiB, seg);
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(a.engine, 64 * KiB, (void **)&buf), FERRY_OK);
  assert_int_equal(ferry_store_exists(a.store, "pending_k"), FERRY_ENOTFOUND);
  assert_int_equal(ferry_store_get_into(a.store, "pending_k", buf, 64 * KiB, NULL),
                   FERRY_ENOTFOUND);
  /* Nobody else may put it meanwhile. */
  assert_int_equal(ferry_store_put_from(a.store, "pending_k", buf, 64 * KiB, NULL), FERRY_EBUSY);
  raw_put_end(&r, "pending_k");
  assert_int_equal(ferry_store_exists(a.store, "pending_k"), FERRY_OK);

  /* A writer that dies between start and end: never visible; the key
   * becomes free once the master saw the connection end. */
  raw_put_start(&r, "orphan_k", 64 * KiB, seg);
  close(r.fd);
  assert_int_equal(ferry_store_exists(a.store, "orphan_k"), FERRY_ENOTFOUND);
  fill(buf, 64 * KiB, 9);
  assert_int_equal(put_once_free(a.store, "orphan_k", buf, 64 * KiB), FERRY_OK);
  expect_bytes(a.store, "orphan_k", buf, 64 * KiB, 9);

  ferry_memory_free(a.engine, buf);
  rig_close(&t);
}

/* A killed client's segment leaves the store with the objects that lived
 * only there: a get of them fails, saying the key is not in the store. */
static void a_dead_clients_replicas_are_gone(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, SEGMENT);
  local_client a = t.a;
  child_client b;
  child_open(&b, t.m.addr);
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(a.engine, 1 * MiB, (void **)&buf), FERRY_OK);
  fill(buf, 1 * MiB, 5);
  ferry_store_replicate in_b = replicate(1, b.segment, FERRY_STORE_PIN_NONE),
                        in_a = replicate(1, ferry_store_segment(a.store), FERRY_STORE_PIN_NONE);
  assert_int_equal(ferry_store_put_from(a.store, "in_b", buf, 1 * MiB, &in_b), FERRY_OK);
  assert_int_equal(ferry_store_put_from(a.store, "in_a", buf, 1 * MiB, &in_a), FERRY_OK);
  child_expect_ok(&b, "get in_b %zu 5\n", (size_t)(1 * MiB));

  child_kill(&b);
  ferry_status st = FERRY_OK;
  double until = test_now_s() + TEST_SETUP_MS / 1000.0;
  while ((st = ferry_store_get_into(a.store, "in_b", buf, 1 * MiB, NULL)) != FERRY_ENOTFOUND &&
         test_now_s() < until)
    usleep(10000); /* before the master saw it go, the READ from b fails */
  assert_int_equal(st, FERRY_ENOTFOUND);
  assert_non_null(strstr(ferry_last_error(), "not in the store"));
  assert_int_equal(ferry_store_exists(a.store, "in_b"), FERRY_ENOTFOUND);
  expect_bytes(a.store, "in_a", buf, 1 * MiB, 5);

  ferry_memory_free(a.engine, buf);
  rig_close(&t);
}

/* From a snapshot of e's counters: with op < 0 the calls that ended in
 * FERRY_ETIMEDOUT, else the transfers of op over all links. */
static uint64_t counted(ferry_engine *e, int op) {
  ferry_stats *stats;
  assert_int_equal(ferry_stats_snapshot(e, &stats), FERRY_OK);
  uint64_t n = op < 0 ? stats->errors[-FERRY_ETIMEDOUT] : 0;
  for (size_t i = 0; op >= 0 && i < stats->link_count; i++)
    n += stats->links[i].ops[op];
  ferry_stats_free(stats);
  return n;
}

static uint64_t timeouts_of(ferry_engine *e) { return counted(e, -1); }

/* One get of key into buf (size bytes of seed) that must succeed, and the
 * timeouts it met (a stopped holder's READ ends in one). */
static uint64_t timeouts_of_get(local_client *a, const char *key, uint8_t *buf, size_t size,
                                unsigned seed) {
  uint64_t before = timeouts_of(a->engine);
  memset(buf, 0, size);
  if (ferry_store_get_into(a->store, key, buf, size, NULL) != FERRY_OK)
    fail_msg("get %s with a holder stopped: %s", key, ferry_last_error());
  assert_int_equal(mismatch(buf, size, seed), -1);
  return timeouts_of(a->engine) - before;
}

/* Two replicas, one in a stopped client: the get's READ there fails (by
 * its timeout: over tcp, which a stopped process does not serve, unlike
 * shm's copies) and the other replica serves. The next gets read the
 * stopped client's replicas last (suspects.h: a timeout per get otherwise),
 * but still read them where they are the last replica; a read there that
 * succeeds puts its replicas first again. */
static void a_get_moves_to_the_next_replica(void **state) {
  (void)state;
  master_proc m;
  master_start(&m, NULL, NULL);
  local_client a;
  local_open_over(&a, m.addr, SEGMENT, FERRY_TRANSPORT_TCP);
  child_client b;
  child_open(&b, m.addr);
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(a.engine, 256 * KiB, (void **)&buf), FERRY_OK);
  fill(buf, 256 * KiB, 11);
  ferry_store_replicate two =
      replicate(2, b.segment, FERRY_STORE_PIN_NONE); /* b's first, then a's */
  assert_int_equal(ferry_store_put_from(a.store, "twice", buf, 256 * KiB, &two), FERRY_OK);
  ferry_store_replicate only_b = replicate(1, b.segment, FERRY_STORE_PIN_NONE);
  fill(buf, 64 * KiB, 12);
  assert_int_equal(ferry_store_put_from(a.store, "in_b", buf, 64 * KiB, &only_b), FERRY_OK);
  child_expect_ok(&b, "get twice %zu 11\n", (size_t)(256 * KiB));
  assert_int_equal(timeouts_of_get(&a, "twice", buf, 256 * KiB, 11), 0);

  child_stop(&b);
  test_engine_set_timeouts(a.engine, 1000, 1000);
  assert_int_equal(timeouts_of_get(&a, "twice", buf, 256 * KiB, 11), 1); /* b's tried first */
  assert_int_equal(timeouts_of_get(&a, "twice", buf, 256 * KiB, 11), 0); /* now last */
  uint64_t timeouts = timeouts_of(a.engine);
  assert_int_equal(ferry_store_get_into(a.store, "in_b", buf, 64 * KiB, NULL), FERRY_ETIMEDOUT);
  assert_int_equal(timeouts_of(a.engine), timeouts + 1); /* its only replica: still read */

  kill(b.pid, SIGCONT);
  assert_int_equal(timeouts_of_get(&a, "in_b", buf, 64 * KiB, 12), 0); /* b answers again */
  child_stop(&b);
  assert_int_equal(timeouts_of_get(&a, "twice", buf, 256 * KiB, 11), 1); /* b's first again */
  test_engine_set_timeouts(a.engine, TEST_SETUP_MS, TEST_SETUP_MS);

  kill(b.pid, SIGCONT);
  child_close(&b);
  ferry_memory_free(a.engine, buf);
  local_close(&a);
  master_stop(&m);
}

static void remove_and_leases(void **state) {
  (void)state;
  rig t;
  rig_open(&t, "--default_kv_lease_ttl=600000", SEGMENT);
  local_client a = t.a;
  uint8_t data[1000];
  fill(data, sizeof data, 3);
  assert_int_equal(ferry_store_put(a.store, "unread", data, sizeof data, NULL), FERRY_OK);
  assert_int_equal(ferry_store_put(a.store, "read", data, sizeof data, NULL), FERRY_OK);
  void *copy;
  size_t len;
  assert_int_equal(ferry_store_get(a.store, "read", &copy, &len), FERRY_OK);
  free(copy);
  /* The get's lease holds "read"; nothing holds "unread". */
  assert_int_equal(ferry_store_remove(a.store, "read"), FERRY_EBUSY);
  assert_non_null(strstr(ferry_last_error(), "lease"));
  assert_int_equal(ferry_store_remove(a.store, "unread"), FERRY_OK);
  assert_int_equal(ferry_store_exists(a.store, "unread"), FERRY_ENOTFOUND);
  assert_int_equal(ferry_store_remove(a.store, "unread"), FERRY_ENOTFOUND);
  uint64_t removed = 99;
  assert_int_equal(ferry_store_remove_all(a.store, &removed), FERRY_OK);
  assert_int_equal(removed, 0); /* "read" is leased */
  assert_int_equal(ferry_store_exists(a.store, "read"), FERRY_OK);
  rig_close(&t);
}

/* ---- eviction ------------------------------------------------------------------------------ */

/* The eviction cases: a 1 MiB segment of sixteen 64 KiB slots. */
#define SLOT (64 * KiB)
#define SLOTS 16

/* A master with two flags (NULL: none) and a client of ours with a 1 MiB
 * segment; returns a registered buffer of 2 MiB (a value larger than the
 * pool fits in it). */
static uint8_t *slots_open(rig *t, const char *flag1, const char *flag2) {
  uint8_t *buf;
  master_start(&t->m, flag1, flag2);
  local_open(&t->a, t->m.addr, SLOTS * SLOT);
  assert_int_equal(ferry_memory_alloc(t->a.engine, 2 * SLOTS * SLOT, (void **)&buf), FERRY_OK);
  return buf;
}

static void slots_close(rig *t, uint8_t *buf) {
  ferry_memory_free(t->a.engine, buf);
  rig_close(t);
}

/* Puts key: SLOT bytes of pattern seed from buf (registered), pinned as
 * asked. */
static ferry_status put_slot(ferry_store *s, const char *key, uint8_t *buf, unsigned seed,
                             int pin) {
  ferry_store_replicate rep = replicate(1, NULL, pin);
  fill(buf, SLOT, seed);
  return ferry_store_put_from(s, key, buf, SLOT, &rep);
}

static void put_slots(ferry_store *s, const char *prefix, int from, int to, uint8_t *buf, int pin) {
  char key[32];
  for (int i = from; i < to; i++) {
    snprintf(key, sizeof key, "%s%02d", prefix, i);
    if (put_slot(s, key, buf, (unsigned)i, pin) != FERRY_OK)
      fail_msg("put %s: %s", key, ferry_last_error());
  }
}

/* Every byte of key_NN, for NN in [from, to). */
static void expect_slots(ferry_store *s, const char *prefix, int from, int to, uint8_t *buf) {
  char key[32];
  for (int i = from; i < to; i++) {
    snprintf(key, sizeof key, "%s%02d", prefix, i);
    expect_bytes(s, key, buf, SLOT, (unsigned)i);
  }
}

/* key_NN stored, for NN in [from, to): asked without a get, which would
 * lease them. */
static void expect_stored(ferry_store *s, const char *prefix, int from, int to) {
  char key[32];
  for (int i = from; i < to; i++) {
    snprintf(key, sizeof key, "%s%02d", prefix, i);
    if (ferry_store_exists(s, key) != FERRY_OK)
      fail_msg("%s is gone: %s", key, ferry_last_error());
  }
}

static void expect_gone(ferry_store *s, const char *key) {
  if (ferry_store_exists(s, key) != FERRY_ENOTFOUND)
    fail_msg("%s was not evicted", key);
}

/* The master stamps a lease or a soft pin of ttl_ms before it replies: once
 * ttl_ms passed after the reply (the same monotonic clock), it is over. */
static void let_lapse(uint64_t replied_ns, unsigned ttl_ms) {
  while (ferry_now_ns() <= replied_ns + ttl_ms * 1000000ull)
    usleep(200);
}

/* Past the high watermark (0.95 by default) least-recently-used objects go
 * until eviction_ratio (0.05) is free below it: the 16th slot (100%) evicts
 * two (down to 87.5% <= 90%), the two put longest ago and not got since. */
static void the_lru_goes_past_the_high_watermark(void **state) {
  (void)state;
  rig t;
  uint8_t *buf = slots_open(&t, "--default_kv_lease_ttl=1", NULL);
  put_slots(t.a.store, "slot", 0, 14, buf, FERRY_STORE_PIN_NONE);
  expect_slots(t.a.store, "slot", 0, 2, buf); /* got: now the most recently used */
  let_lapse(ferry_now_ns(), 1);               /* their leases do not hold them */
  put_slots(t.a.store, "slot", 14, 15, buf, FERRY_STORE_PIN_NONE); /* 93.75%: none goes */
  expect_stored(t.a.store, "slot", 0, 15);
  put_slots(t.a.store, "slot", 15, 16, buf, FERRY_STORE_PIN_NONE);
  expect_gone(t.a.store, "slot02");
  expect_gone(t.a.store, "slot03");
  expect_slots(t.a.store, "slot", 0, 2, buf);
  expect_slots(t.a.store, "slot", 4, 16, buf);
  slots_close(&t, buf);
}

/* With the watermark at 1 (never passed), a put no segment has room for
 * evicts the least recently used objects until it fits: two neighbours
 * for a value of two slots. A value larger than any segment evicts
 * nothing. */
static void a_put_into_a_full_pool_evicts_to_fit(void **state) {
  (void)state;
  rig t;
  uint8_t *buf = slots_open(&t, "--eviction_high_watermark_ratio=1", NULL);
  put_slots(t.a.store, "slot", 0, SLOTS, buf, FERRY_STORE_PIN_NONE);
  assert_int_equal(ferry_store_put_from(t.a.store, "too_big", buf, 1 * MiB + 1, NULL),
                   FERRY_ENOMEM);
  assert_non_null(strstr(ferry_last_error(), "larger than the store holds"));
  expect_stored(t.a.store, "slot", 0, SLOTS); /* nothing went for it */
  fill(buf, 2 * SLOT, 99);
  if (ferry_store_put_from(t.a.store, "wide", buf, 2 * SLOT, NULL) != FERRY_OK)
    fail_msg("put into a full pool: %s", ferry_last_error());
  expect_gone(t.a.store, "slot00");
  expect_gone(t.a.store, "slot01");
  expect_bytes(t.a.store, "wide", buf, 2 * SLOT, 99);
  expect_slots(t.a.store, "slot", 2, SLOTS, buf);
  slots_close(&t, buf);
}

/* The three objects eviction may never take, each older than the plain
 * one that goes instead: a put in progress, a hard-pinned object and one
 * under a get's lease. */
static void leased_pending_and_hard_pinned_are_never_evicted(void **state) {
  (void)state;
  rig t;
  uint8_t *buf =
      slots_open(&t, "--default_kv_lease_ttl=600000", "--eviction_high_watermark_ratio=1");
  raw_client r;
  raw_open(&r, t.m.addr);
  uint64_t pending = raw_put_start(&r, "pending", SLOT, ferry_store_segment(t.a.store));
  put_slots(t.a.store, "hard", 1, 2, buf, FERRY_STORE_PIN_HARD);
  put_slots(t.a.store, "leased", 2, 3, buf, FERRY_STORE_PIN_NONE);
  expect_slots(t.a.store, "leased", 2, 3, buf);                      /* its lease: 10 min */
  put_slots(t.a.store, "slot", 3, SLOTS, buf, FERRY_STORE_PIN_NONE); /* full */
  put_slots(t.a.store, "new", 0, 1, buf, FERRY_STORE_PIN_NONE);
  expect_gone(t.a.store, "slot03");
  expect_slots(t.a.store, "hard", 1, 2, buf);
  expect_slots(t.a.store, "leased", 2, 3, buf);
  expect_slots(t.a.store, "slot", 4, SLOTS, buf);
  /* The pending put's space is still its own: written now, it commits. */
  fill((uint8_t *)(uintptr_t)pending, SLOT, 0);
  raw_put_end(&r, "pending");
  expect_bytes(t.a.store, "pending", buf, SLOT, 0);
  close(r.fd);
  slots_close(&t, buf);
}

/* Soft-pinned objects go only when nothing unpinned can (here: every
 * unpinned one is leased), the least recently used first; with nothing
 * left to evict a put fails, saying what holds the pool. */
static void soft_pins_go_last_then_the_pool_refuses(void **state) {
  (void)state;
  rig t;
  uint8_t *buf =
      slots_open(&t, "--default_kv_lease_ttl=600000", "--eviction_high_watermark_ratio=1");
  put_slots(t.a.store, "soft", 0, 2, buf, FERRY_STORE_PIN_SOFT);
  put_slots(t.a.store, "slot", 2, SLOTS, buf, FERRY_STORE_PIN_NONE); /* full */
  put_slots(t.a.store, "new", 0, 1, buf, FERRY_STORE_PIN_NONE);
  expect_gone(t.a.store, "slot02");
  expect_stored(t.a.store, "soft", 0, 2);
  expect_slots(t.a.store, "slot", 3, SLOTS, buf); /* every unpinned one leased now */
  expect_slots(t.a.store, "new", 0, 1, buf);
  put_slots(t.a.store, "new", 1, 2, buf, FERRY_STORE_PIN_NONE);
  expect_gone(t.a.store, "soft00");
  expect_stored(t.a.store, "soft", 1, 2);
  expect_slots(t.a.store, "new", 1, 2, buf);
  put_slots(t.a.store, "new", 2, 3, buf, FERRY_STORE_PIN_NONE);
  expect_gone(t.a.store, "soft01");
  expect_slots(t.a.store, "new", 2, 3, buf);
  /* All 16 leased: nothing can go. */
  assert_int_equal(put_slot(t.a.store, "refused", buf, 0, FERRY_STORE_PIN_NONE), FERRY_ENOMEM);
  const char *why = ferry_last_error();
  if (!strstr(why, "\"refused\"") || !strstr(why, "nothing left to evict") ||
      !strstr(why, "16 object(s) under a get's lease, 0 hard-pinned, 0 put(s) pending"))
    fail_msg("the refusal does not say why: %s", why);
  expect_slots(t.a.store, "slot", 3, SLOTS, buf);
  expect_slots(t.a.store, "new", 0, 3, buf);
  slots_close(&t, buf);
}

/* A soft pin lasts default_kv_soft_pin_ttl past the commit; after that
 * the object is evicted in its turn: before a newer unpinned one. */
static void an_ended_soft_pin_is_evicted_in_its_turn(void **state) {
  (void)state;
  rig t;
  uint8_t *buf = slots_open(&t, "--default_kv_soft_pin_ttl=1", "--eviction_high_watermark_ratio=1");
  put_slots(t.a.store, "soft", 0, 1, buf, FERRY_STORE_PIN_SOFT);
  let_lapse(ferry_now_ns(), 1);
  put_slots(t.a.store, "slot", 1, SLOTS, buf, FERRY_STORE_PIN_NONE); /* full */
  put_slots(t.a.store, "new", 0, 1, buf, FERRY_STORE_PIN_NONE);
  expect_gone(t.a.store, "soft00");
  expect_slots(t.a.store, "slot", 1, SLOTS, buf);
  slots_close(&t, buf);
}

/* A soft pin with a TTL of its own: SLOT bytes of seed under key. */
static ferry_status put_soft(ferry_store *s, const char *key, uint8_t *buf, unsigned seed,
                             int action, int ttl_set, uint64_t ttl_ms, int upsert) {
  ferry_store_replicate rep = replicate(1, NULL, FERRY_STORE_PIN_NONE);
  rep.soft_pin_action = action;
  rep.soft_pin_ttl_set = ttl_set;
  rep.soft_pin_ttl_ms = ttl_ms;
  fill(buf, SLOT, seed);
  return upsert ? ferry_store_upsert_from(s, key, buf, SLOT, &rep)
                : ferry_store_put_from(s, key, buf, SLOT, &rep);
}

/* A put's own soft pin TTL holds from its commit (a get does not extend
 * it; an upsert with PRESERVE keeps it, one with DISABLE ends it) and,
 * once over, the object goes in its LRU turn; a longer one still holds. */
static void a_soft_pin_ttl_holds_until_its_deadline(void **state) {
  (void)state;
  rig t;
  uint8_t *buf = slots_open(&t, "--default_kv_lease_ttl=1", "--eviction_high_watermark_ratio=1");
  const unsigned ttl_ms = 3000;
  assert_int_equal(put_soft(t.a.store, "short", buf, 1, FERRY_STORE_SOFT_PIN_ENABLE, 1, ttl_ms, 0),
                   FERRY_OK);
  uint64_t pinned_ns = ferry_now_ns();
  assert_int_equal(put_soft(t.a.store, "long", buf, 2, FERRY_STORE_SOFT_PIN_ENABLE, 1, 600000, 0),
                   FERRY_OK);
  assert_int_equal(put_soft(t.a.store, "off", buf, 3, FERRY_STORE_SOFT_PIN_ENABLE, 1, 600000, 0),
                   FERRY_OK);
  /* PRESERVE keeps short's pin and deadline; DISABLE unpins off. */
  assert_int_equal(put_soft(t.a.store, "short", buf, 1, FERRY_STORE_SOFT_PIN_PRESERVE, 0, 0, 1),
                   FERRY_OK);
  assert_int_equal(put_soft(t.a.store, "off", buf, 3, FERRY_STORE_SOFT_PIN_DISABLE, 0, 0, 1),
                   FERRY_OK);
  put_slots(t.a.store, "slot", 3, SLOTS, buf, FERRY_STORE_PIN_NONE); /* full */
  put_slots(t.a.store, "new", 0, 1, buf, FERRY_STORE_PIN_NONE);
  expect_gone(t.a.store, "off"); /* unpinned, and the least recently used */
  put_slots(t.a.store, "new", 1, 2, buf, FERRY_STORE_PIN_NONE);
  expect_gone(t.a.store, "slot03");
  if (ferry_store_exists(t.a.store, "short") != FERRY_OK)
    fail_msg("short went while its pin held (%u ms)", ttl_ms);
  let_lapse(pinned_ns, ttl_ms);
  /* short's pin ended: it goes before slot04, used after it. */
  put_slots(t.a.store, "new", 2, 3, buf, FERRY_STORE_PIN_NONE);
  expect_gone(t.a.store, "short");
  expect_slots(t.a.store, "slot", 4, SLOTS, buf);
  if (ferry_store_exists(t.a.store, "long") != FERRY_OK)
    fail_msg("long went while its pin held");
  slots_close(&t, buf);
}

/* What Mooncake refuses (INVALID_PARAMS): a TTL without ENABLE, one above
 * max_kv_soft_pin_ttl, with_soft_pin with DISABLE; nothing is stored. */
static void soft_pin_requests_mooncake_refuses(void **state) {
  (void)state;
  rig t;
  uint8_t *buf = slots_open(&t, "--max_kv_soft_pin_ttl=1000", "--default_kv_soft_pin_ttl=1000");
  static const struct {
    int action, ttl_set;
    uint64_t ttl_ms;
    const char *says;
  } bad[] = {
      {FERRY_STORE_SOFT_PIN_PRESERVE, 1, 10, "only ENABLE takes a TTL"},
      {FERRY_STORE_SOFT_PIN_DISABLE, 1, 10, "soft_pin_action DISABLE"},
      {FERRY_STORE_SOFT_PIN_ENABLE, 1, 1001, "above the master's max_kv_soft_pin_ttl 1000"},
      {7, 0, 0, "soft_pin_action 7 is not"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    for (int upsert = 0; upsert < 2; upsert++) {
      assert_int_equal(
          put_soft(t.a.store, "k", buf, 1, bad[i].action, bad[i].ttl_set, bad[i].ttl_ms, upsert),
          FERRY_EINVAL);
      if (!strstr(ferry_last_error(), bad[i].says))
        fail_msg("case %zu: %s", i, ferry_last_error());
      expect_gone(t.a.store, "k");
    }
  ferry_store_replicate rep = replicate(1, NULL, FERRY_STORE_PIN_SOFT);
  rep.soft_pin_action = FERRY_STORE_SOFT_PIN_DISABLE;
  assert_int_equal(ferry_store_put_from(t.a.store, "k", buf, SLOT, &rep), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "with_soft_pin"));
  /* The limit itself and 0 (an ordinary object) are fine. */
  assert_int_equal(put_soft(t.a.store, "k", buf, 1, FERRY_STORE_SOFT_PIN_ENABLE, 1, 1000, 0),
                   FERRY_OK);
  assert_int_equal(put_soft(t.a.store, "z", buf, 1, FERRY_STORE_SOFT_PIN_ENABLE, 1, 0, 0),
                   FERRY_OK);
  slots_close(&t, buf);
}

/* --allow_evict_soft_pinned_objects=false: a soft pin keeps its object
 * until its deadline even when nothing else can go (then the put fails,
 * naming them); one whose pin ended goes in its turn, plain ones as ever. */
static void soft_pins_stay_when_not_allowed_to_go(void **state) {
  (void)state;
  rig t;
  uint8_t *buf = slots_open(&t, "--allow_evict_soft_pinned_objects=false",
                            "--eviction_high_watermark_ratio=1");
  assert_int_equal(put_soft(t.a.store, "brief", buf, 0, FERRY_STORE_SOFT_PIN_ENABLE, 1, 1, 0),
                   FERRY_OK); /* pinned for 1 ms */
  uint64_t pinned_ns = ferry_now_ns();
  put_slots(t.a.store, "soft", 1, SLOTS - 1, buf, FERRY_STORE_PIN_SOFT);     /* 30 min */
  put_slots(t.a.store, "slot", SLOTS - 1, SLOTS, buf, FERRY_STORE_PIN_NONE); /* full */
  let_lapse(pinned_ns, 1);
  put_slots(t.a.store, "new", 0, 1, buf, FERRY_STORE_PIN_HARD);
  expect_gone(t.a.store, "brief"); /* its pin ended: the least recently used */
  put_slots(t.a.store, "new", 1, 2, buf, FERRY_STORE_PIN_HARD);
  expect_gone(t.a.store, "slot15"); /* the plain one, though newer than the soft ones */
  assert_int_equal(put_slot(t.a.store, "refused", buf, 0, FERRY_STORE_PIN_NONE), FERRY_ENOMEM);
  const char *why = ferry_last_error();
  if (!strstr(why, "nothing left to evict") ||
      !strstr(why, "2 hard-pinned, 14 soft-pinned (--allow_evict_soft_pinned_objects=false)"))
    fail_msg("the refusal does not say why: %s", why);
  expect_slots(t.a.store, "soft", 1, SLOTS - 1, buf);
  expect_slots(t.a.store, "new", 0, 2, buf);
  slots_close(&t, buf);
}

/* --enable_gc: an object a get read goes 1 s later, or when that get's
 * lease ends if later (1.5 s here); one nobody read stays, and so does a
 * new value of a key read before (the old get's removal is not its). */
static void enable_gc_removes_what_a_get_read(void **state) {
  (void)state;
  const unsigned lease_ms = 1500;
  rig t;
  uint8_t *buf = slots_open(&t, "--enable_gc", "--default_kv_lease_ttl=1500");
  put_slots(t.a.store, "read", 0, 1, buf, FERRY_STORE_PIN_NONE);
  put_slots(t.a.store, "unread", 1, 2, buf, FERRY_STORE_PIN_NONE);
  put_slots(t.a.store, "again", 2, 3, buf, FERRY_STORE_PIN_NONE);
  uint64_t before_ns = ferry_now_ns();
  expect_slots(t.a.store, "read", 0, 1, buf);
  expect_slots(t.a.store, "again", 2, 3, buf);
  uint64_t got_ns = ferry_now_ns(); /* after the master stamped both gets */
  ferry_status early = ferry_store_exists(t.a.store, "read00");
  if (ferry_now_ns() < before_ns + lease_ms * 1000000ull) /* answered before it was due */
    assert_int_equal(early, FERRY_OK);
  fill(buf, SLOT, 7);
  assert_int_equal(ferry_store_upsert_from(t.a.store, "again02", buf, SLOT, NULL), FERRY_OK);
  let_lapse(got_ns, lease_ms);
  expect_gone(t.a.store, "read00");
  expect_stored(t.a.store, "unread", 1, 2);
  expect_bytes(t.a.store, "again02", buf, SLOT, 7);
  slots_close(&t, buf);
}

/* Hard-pinned quarters fill the pool for good: a put is refused, naming
 * them; freed neighbours make one extent again. */
static void a_full_pool_refuses_puts(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, 1 * MiB);
  local_client a = t.a;
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(a.engine, 2 * MiB, (void **)&buf), FERRY_OK);
  assert_int_equal(ferry_store_put_from(a.store, "too_big", buf, 1 * MiB + 1, NULL), FERRY_ENOMEM);
  assert_non_null(strstr(ferry_last_error(), "too_big"));
  assert_non_null(strstr(ferry_last_error(), "larger than the store holds"));
  char key[32];
  ferry_store_replicate hard = replicate(1, NULL, FERRY_STORE_PIN_HARD);
  for (int i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "quarter_%d", i);
    assert_int_equal(ferry_store_put_from(a.store, key, buf, 256 * KiB, &hard), FERRY_OK);
  }
  assert_int_equal(ferry_store_put_from(a.store, "one_more", buf, 1, NULL), FERRY_ENOMEM);
  assert_non_null(strstr(ferry_last_error(), "store is full"));
  assert_non_null(strstr(ferry_last_error(), "4 hard-pinned"));
  /* Two freed neighbours make one extent again: half a MiB fits. */
  assert_int_equal(ferry_store_remove(a.store, "quarter_1"), FERRY_OK);
  assert_int_equal(ferry_store_remove(a.store, "quarter_2"), FERRY_OK);
  fill(buf, 512 * KiB, 21);
  assert_int_equal(ferry_store_put_from(a.store, "half", buf, 512 * KiB, &hard), FERRY_OK);
  expect_bytes(a.store, "half", buf, 512 * KiB, 21);
  ferry_memory_free(a.engine, buf);
  rig_close(&t);
}

/* A client that stops talking (its connection still open) is dropped after
 * client_ttl with its pending put; a client that PINGs stays. */
static void a_silent_client_is_dropped(void **state) {
  (void)state;
  rig t;
  rig_open(&t, "--client_ttl_ms=2000", SEGMENT);
  local_client a = t.a;
  raw_client r;
  raw_open(&r, t.m.addr);
  raw_put_start(&r, "held", 4 * KiB, ferry_store_segment(a.store));
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(a.engine, 4 * KiB, (void **)&buf), FERRY_OK);
  assert_int_equal(ferry_store_put_from(a.store, "held", buf, 4 * KiB, NULL), FERRY_EBUSY);
  double start = test_now_s();
  assert_int_equal(put_once_free(a.store, "held", buf, 4 * KiB), FERRY_OK);
  assert_true(test_now_s() - start >= 1.0); /* not before its silence could have lasted the ttl */
  /* a kept PINGing through it: still a member, its segment still used. */
  assert_int_equal(ferry_store_exists(a.store, "held"), FERRY_OK);
  close(r.fd);
  ferry_memory_free(a.engine, buf);
  rig_close(&t);
}

static void the_masters_secret_is_required(void **state) {
  (void)state;
  setenv("FERRY_SECRET", "store-secret", 1);
  master_proc m;
  master_start(&m, NULL, NULL);
  unsetenv("FERRY_SECRET");
  ferry_engine *e = engine_on_loopback();
  assert_non_null(e);
  ferry_store *s = NULL;
  assert_int_equal(store_on(e, m.addr, 0, NULL, &s), FERRY_EAUTH);
  assert_non_null(strstr(ferry_last_error(), "requires a shared secret"));
  assert_int_equal(store_on(e, m.addr, 0, "wrong", &s), FERRY_EAUTH);
  assert_int_equal(store_on(e, m.addr, 1 * MiB, "store-secret", &s), FERRY_OK);
  uint8_t data[64] = {1, 2, 3};
  assert_int_equal(ferry_store_put(s, "sealed", data, sizeof data, NULL), FERRY_OK);
  assert_int_equal(ferry_store_exists(s, "sealed"), FERRY_OK);
  ferry_store_close(s);
  ferry_engine_destroy(e);
  master_stop(&m);
}

/* Sends one STORE frame of raw body bytes and says whether the master
 * still answers on the connection afterwards (a PING). */
static int raw_survives(raw_client *r, uint32_t count, const void *body, size_t len) {
  store_writer w = {0};
  store_put_raw(&w, body, len);
  if (store_send(&r->sock, FERRY_FRAME_STORE, count, 0, &w, "hostile frame") != FERRY_OK)
    return 0;
  ferry_frame_header h;
  uint8_t *reply = NULL;
  ferry_status st = store_recv(&r->sock, &h, &reply, "hostile reply");
  free(reply);
  if (st != FERRY_OK)
    return 0;
  uint8_t ping = STORE_PING;
  w = (store_writer){0};
  store_put_raw(&w, &ping, 1);
  st = store_send(&r->sock, FERRY_FRAME_STORE, 0, 0, &w, "ping");
  if (st == FERRY_OK)
    st = store_recv(&r->sock, &h, &reply, "pong");
  free(reply);
  return st == FERRY_OK;
}

/* Malformed requests end the sender's connection (its reason sent first)
 * and nothing else: another client's object and segment stay; a client
 * cannot end another's put or mount a segment under a name in use. */
static void a_hostile_client_hurts_only_itself(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, SEGMENT);
  local_client a = t.a;
  uint8_t data[512];
  fill(data, sizeof data, 4);
  assert_int_equal(ferry_store_put(a.store, "kept", data, sizeof data, NULL), FERRY_OK);
  raw_client r;
  const uint8_t unknown_op[] = {99};
  const uint8_t truncated_put[] = {STORE_PUT_START, 1, 0, 0, 0, 5, 0, 'a', 'b'};
  const uint8_t bad_pin[] = {STORE_PUT_START, 1, 0, FERRY_STORE_PIN_HARD + 1, 1, 0, 'k'};
  const uint8_t lying_length[] = {STORE_GET, 0xff, 0xff, 'k'};
  const uint8_t trailing[] = {STORE_PING, 0};
  /* REPLICAS: a key longer than its body, one key for two entries, a byte
   * after the last key, a key over STORE_KEY_MAX, more entries than a
   * frame may hold. */
  const uint8_t replicas_lying[] = {STORE_REPLICAS, 0xff, 0xff, 'k'};
  const uint8_t replicas_one[] = {STORE_REPLICAS, 1, 0, 'k'};
  const uint8_t replicas_trailing[] = {STORE_REPLICAS, 1, 0, 'k', 0};
  static uint8_t replicas_long[3 + STORE_KEY_MAX + 1] = {STORE_REPLICAS, (STORE_KEY_MAX + 1) & 0xff,
                                                         (STORE_KEY_MAX + 1) >> 8};
  const struct {
    const uint8_t *body;
    size_t len;
    uint32_t count;
  } frames[] = {{unknown_op, 1, 0},
                {truncated_put, sizeof truncated_put, 1},
                {bad_pin, sizeof bad_pin, 1},
                {lying_length, 4, 1},
                {trailing, 2, 0},
                {lying_length, 1, 1 << 20},
                {replicas_lying, sizeof replicas_lying, 1},
                {replicas_one, sizeof replicas_one, 2},
                {replicas_trailing, sizeof replicas_trailing, 1},
                {replicas_long, sizeof replicas_long, 1},
                {replicas_one, sizeof replicas_one, STORE_BATCH_MAX + 1},
                {replicas_one, 1, UINT32_MAX}};
  for (size_t i = 0; i < sizeof frames / sizeof *frames; i++) {
    raw_open(&r, t.m.addr);
    assert_false(raw_survives(&r, frames[i].count, frames[i].body, frames[i].len));
    close(r.fd);
  }
  /* Clients of the store protocols before this one: 4's REGISTER is this
   * one's (it has no REPLICAS), 3's had no nonce. Each is refused by
   * version, not as malformed, and its connection kept. */
  raw_connect(&r, t.m.addr);
  ferry_frame_header h;
  uint8_t *refusal;
  for (uint16_t version = 3; version < STORE_PROTOCOL_VERSION; version++) {
    store_writer old = {0};
    store_put_u8(&old, STORE_REGISTER);
    store_put_u16(&old, version);
    store_put_u64(&old, 0x100000000ull);
    store_put_u64(&old, 1 * MiB);
    store_put_str(&old, "old", 3);
    if (version >= 4)
      store_put_u64(&old, 1);
    assert_int_equal(store_send(&r.sock, FERRY_FRAME_STORE, 0, 0, &old, "old REGISTER"), FERRY_OK);
    assert_int_equal(store_recv(&r.sock, &h, &refusal, "refusal"), FERRY_OK);
    assert_int_equal(h.status, FERRY_EVERSION);
    char why[64];
    snprintf(why, sizeof why, "store protocol version %u; this master speaks %d", version,
             STORE_PROTOCOL_VERSION);
    assert_int_equal(h.body_len, strlen(why));
    assert_memory_equal(refusal, why, h.body_len);
    free(refusal);
  }
  /* A segment name holding a NUL byte (replies would name it "", which
   * every client refuses): refused, the connection kept. */
  store_writer nul = {0};
  store_put_u8(&nul, STORE_REGISTER);
  store_put_u16(&nul, STORE_PROTOCOL_VERSION);
  store_put_u64(&nul, 0x100000000ull);
  store_put_u64(&nul, 1 * MiB);
  store_put_str(&nul, "\0ab", 3);
  store_put_u64(&nul, 1);
  assert_int_equal(store_send(&r.sock, FERRY_FRAME_STORE, 0, 0, &nul, "NUL REGISTER"), FERRY_OK);
  assert_int_equal(store_recv(&r.sock, &h, &refusal, "refusal"), FERRY_OK);
  assert_int_equal(h.status, FERRY_EINVAL);
  free(refusal);
  close(r.fd);
  /* A put of a's is not the raw client's to end; a's segment name is taken. */
  raw_open(&r, t.m.addr);
  raw_put_start(&r, "theirs", 64, ferry_store_segment(a.store));
  /* A size no segment holds (its rounding would wrap around) is refused. */
  store_writer huge = {0};
  store_put_u8(&huge, STORE_PUT_START);
  store_put_u8(&huge, 1);
  store_put_u8(&huge, 0); /* no preferred segment */
  store_put_u8(&huge, FERRY_STORE_PIN_HARD);
  store_put_u8(&huge, FERRY_STORE_SOFT_PIN_PRESERVE);
  store_put_u8(&huge, 0);
  store_put_u64(&huge, 0);
  store_put_str(&huge, "huge", 4);
  store_put_u64(&huge, UINT64_MAX);
  uint8_t *body;
  store_reader rd = raw_request(&r, &huge, 1, &body);
  assert_int_equal((int32_t)store_get_u32(&rd), FERRY_ENOMEM);
  free(body);
  store_writer w = {0};
  store_put_u8(&w, STORE_PUT_END);
  store_put_str(&w, "kept", 4);
  store_put_u32(&w, 1); /* "failed": would free it */
  store_put_u8(&w, 0);
  rd = raw_request(&r, &w, 1, &body);
  assert_int_equal((int32_t)store_get_u32(&rd), FERRY_ENOTFOUND);
  free(body);
  close(r.fd);
  assert_int_equal(ferry_store_exists(a.store, "kept"), FERRY_OK);
  /* A second store on a's engine (its name): refused, a keeps its segment. */
  ferry_store *twin;
  assert_int_equal(store_on(a.engine, t.m.addr, 1 * MiB, NULL, &twin), FERRY_EBUSY);
  assert_non_null(strstr(ferry_last_error(), "mounted already"));
  expect_copy(a.store, "kept", sizeof data, 4);
  rig_close(&t);
}

/* Opens a store on e once the master has a place for it (a client that
 * left must first be seen gone), TEST_SETUP_MS at most. */
static ferry_status open_once_free(ferry_engine *e, const char *master, ferry_store **out) {
  ferry_status st;
  double until = test_now_s() + TEST_SETUP_MS / 1000.0;
  while ((st = store_on(e, master, 0, NULL, out)) == FERRY_EBUSY && test_now_s() < until)
    usleep(10000);
  return st;
}

/* Each connection costs the master a thread: past --max_clients it refuses
 * the next with EBUSY and the reason, counting connections that never said
 * HELLO; the clients it has keep working, and a place freed is taken. */
static void the_master_caps_its_clients(void **state) {
  (void)state;
  master_proc m;
  master_start(&m, "--max_clients=3", NULL);
  local_client a;
  local_open(&a, m.addr, 1 * MiB);
  char host[FERRY_HOST_MAX];
  uint16_t port;
  assert_int_equal(ferry_net_parse_target(m.addr, host, &port), FERRY_OK);
  int silent[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(
        ferry_net_connect(host, port, ferry_now_ns() + TEST_SETUP_MS * 1000000ull, &silent[i]),
        FERRY_OK);
  ferry_engine *e = engine_on_loopback();
  assert_non_null(e);
  ferry_store *s;
  assert_int_equal(store_on(e, m.addr, 0, NULL, &s), FERRY_EBUSY);
  assert_non_null(strstr(ferry_last_error(), "the limit (--max_clients)"));
  uint8_t data[256];
  fill(data, sizeof data, 7);
  assert_int_equal(ferry_store_put(a.store, "capped", data, sizeof data, NULL), FERRY_OK);
  close(silent[0]);
  assert_int_equal(open_once_free(e, m.addr, &s), FERRY_OK);
  assert_int_equal(ferry_store_exists(s, "capped"), FERRY_OK);
  ferry_store_close(s);
  ferry_engine_destroy(e);
  close(silent[1]);
  local_close(&a);
  master_stop(&m);
}

static void bad_arguments_are_refused(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, 1 * MiB);
  local_client a = t.a;
  uint8_t unregistered[16];
  char long_key[STORE_KEY_MAX + 2];
  memset(long_key, 'k', sizeof long_key - 1);
  long_key[sizeof long_key - 1] = 0;
  assert_int_equal(ferry_store_put(a.store, long_key, unregistered, 16, NULL), FERRY_EINVAL);
  assert_int_equal(ferry_store_put(a.store, "", unregistered, 16, NULL), FERRY_EINVAL);
  ferry_store_replicate nine = replicate(9, NULL, FERRY_STORE_PIN_NONE);
  assert_int_equal(ferry_store_put(a.store, "nine", unregistered, 16, &nine), FERRY_EINVAL);
  ferry_store_replicate two = replicate(2, NULL, FERRY_STORE_PIN_NONE); /* one segment only */
  assert_int_equal(ferry_store_put(a.store, "two", unregistered, 16, &two), FERRY_ENOMEM);
  ferry_store_replicate bad_pin = replicate(1, NULL, FERRY_STORE_PIN_HARD + 1);
  assert_int_equal(ferry_store_put(a.store, "bad_pin", unregistered, 16, &bad_pin), FERRY_EINVAL);
  rig_close(&t);
  /* Nothing listens there any more. */
  ferry_engine *e = engine_on_loopback();
  ferry_store *s;
  assert_int_equal(store_on(e, t.m.addr, 0, NULL, &s), FERRY_ESOCKET);
  /* The config carries its caller's sizeof, as ferry_config does: one
   * from a newer ferry.h (larger), or not filled by the init, is refused
   * naming the size, before the master is tried. */
  ferry_store_config cfg;
  ferry_store_config_init(&cfg);
  cfg.master = t.m.addr;
  cfg.size = sizeof cfg + 8;
  assert_int_equal(ferry_store_open(e, &cfg, &s), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "ferry_store_config.size"));
  cfg.size = 3;
  assert_int_equal(ferry_store_open(e, &cfg, &s), FERRY_EINVAL);
  assert_int_equal(ferry_store_open(e, NULL, &s), FERRY_EINVAL);
  /* the first form's size (an older ferry.h) is read: the master is tried */
  cfg.size = offsetof(ferry_store_config, timeout_ms) + sizeof(uint32_t);
  assert_int_equal(ferry_store_open(e, &cfg, &s), FERRY_ESOCKET);
  ferry_engine_destroy(e);
}

/* ferry_store_replicate carries its caller's sizeof (ferry.h): one not
 * filled by ferry_store_replicate_init, or from a ferry.h newer than the
 * library (larger), is refused naming the size; the library's own size is
 * read whole (its replica count reaches the master). */
static void the_replicate_struct_carries_its_size(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, 1 * MiB);
  uint8_t data[64];
  fill(data, sizeof data, 12);
  ferry_store_replicate zeroed = {0};
  assert_int_equal(ferry_store_put(t.a.store, "zeroed", data, sizeof data, &zeroed), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "ferry_store_replicate.size = 0 is not valid"));
  struct {
    ferry_store_replicate rep;
    uint64_t field_of_a_newer_ferry_h;
  } newer;
  ferry_store_replicate_init_size(&newer.rep, sizeof newer);
  assert_int_equal(newer.rep.size, sizeof newer);
  assert_int_equal(ferry_store_put(t.a.store, "newer", data, sizeof data, &newer.rep),
                   FERRY_EINVAL);
  char size[64];
  snprintf(size, sizeof size, "ferry_store_replicate.size = %zu is not valid", sizeof newer);
  if (!strstr(ferry_last_error(), size) || !strstr(ferry_last_error(), "newer"))
    fail_msg("a larger replicate: %s", ferry_last_error());
  assert_int_equal(ferry_store_exists(t.a.store, "newer"), FERRY_ENOTFOUND);
  ferry_store_replicate two = replicate(2, NULL, FERRY_STORE_PIN_NONE); /* one segment only */
  assert_int_equal(ferry_store_put(t.a.store, "two", data, sizeof data, &two), FERRY_ENOMEM);
  ferry_store_replicate one = replicate(1, NULL, FERRY_STORE_PIN_HARD);
  assert_int_equal(ferry_store_put(t.a.store, "one", data, sizeof data, &one), FERRY_OK);
  expect_copy(t.a.store, "one", sizeof data, 12);
  rig_close(&t);
}

/* ---- the caller's buffers are registered memory --------------------------------------------- */

/* A replica in the caller's own segment is copied in memory, not sent: the
 * copy checks, as a transfer does, that the caller's buffer is registered
 * on the store's engine (put_from, get_into and their batches), with the
 * same code and message as toward another client's segment. */
static void own_segment_copies_need_registered_buffers(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, 1 * MiB);
  local_client b;
  local_open(&b, t.m.addr, 1 * MiB);
  const char *own = ferry_store_segment(t.a.store);
  ferry_store_replicate in_a = replicate(1, own, FERRY_STORE_PIN_NONE),
                        in_b = replicate(1, ferry_store_segment(b.store), FERRY_STORE_PIN_NONE);
  uint8_t *loose = calloc(1, 64 * KiB), *buf;
  assert_non_null(loose);
  assert_int_equal(ferry_memory_alloc(t.a.engine, 64 * KiB, (void **)&buf), FERRY_OK);
  fill(loose, 64 * KiB, 31);
  char suffix[128];
  snprintf(suffix, sizeof suffix, "local address %p (+%llu bytes) is not registered on this engine",
           (void *)loose, 64 * KiB);

  assert_int_equal(ferry_store_put_from(t.a.store, "mine", loose, 64 * KiB, &in_a), FERRY_ENOTREG);
  char local_detail[FERRY_ERROR_MAX];
  snprintf(local_detail, sizeof local_detail, "%s", ferry_last_error());
  if (!strstr(local_detail, "ferry_store_put_from \"mine\"") || !strstr(local_detail, suffix))
    fail_msg("an unregistered buffer into the own segment: %s", local_detail);
  assert_int_equal(ferry_store_exists(t.a.store, "mine"), FERRY_ENOTFOUND);
  /* Toward b's segment: the same code and message. */
  assert_int_equal(ferry_store_put_from(t.a.store, "mine", loose, 64 * KiB, &in_b), FERRY_ENOTREG);
  assert_string_equal(ferry_last_error(), local_detail);
  ferry_store_item batch[2] = {{"first", buf, 64 * KiB, FERRY_OK},
                               {"second", loose, 64 * KiB, FERRY_OK}};
  assert_int_equal(ferry_store_put_from_batch(t.a.store, batch, 2, &in_a), FERRY_ENOTREG);
  assert_int_equal(ferry_store_exists(t.a.store, "first"), FERRY_ENOTFOUND); /* nothing asked */

  /* get_into from the own segment into loose memory: refused, untouched. */
  fill(buf, 64 * KiB, 32);
  assert_int_equal(ferry_store_put_from(t.a.store, "mine", buf, 64 * KiB, &in_a), FERRY_OK);
  assert_int_equal(ferry_store_get_into(t.a.store, "mine", loose, 64 * KiB, NULL), FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), suffix));
  assert_int_equal(mismatch(loose, 64 * KiB, 31), -1);
  batch[0] = (ferry_store_item){"mine", loose, 64 * KiB, FERRY_OK};
  assert_int_equal(ferry_store_get_into_batch(t.a.store, batch, 1), FERRY_ENOTREG);
  assert_int_equal(mismatch(loose, 64 * KiB, 31), -1);
  expect_bytes(t.a.store, "mine", buf, 64 * KiB, 32);

  free(loose);
  ferry_memory_free(t.a.engine, buf);
  local_close(&b);
  rig_close(&t);
}

/* ---- upsert --------------------------------------------------------------------------------- */

static ferry_status upsert_slot(ferry_store *s, const char *key, uint8_t *buf, size_t len,
                                unsigned seed, const ferry_store_replicate *rep) {
  fill(buf, len, seed);
  return ferry_store_upsert_from(s, key, buf, len, rep);
}

/* An upsert replaces a stored value (another size, other replicas) or
 * stores a new key; while its new value is being written a get reads the
 * old one whole, then the new one whole; a writer that dies before its end
 * leaves the old value; a second put or upsert meanwhile is refused. */
static void an_upsert_replaces_a_value_whole(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, SEGMENT);
  local_client b;
  local_open(&b, t.m.addr, SEGMENT);
  const char *seg = ferry_store_segment(t.a.store);
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(t.a.engine, 512 * KiB, (void **)&buf), FERRY_OK);
  fill(buf, 64 * KiB, 1);
  assert_int_equal(ferry_store_put_from(t.a.store, "k", buf, 64 * KiB, NULL), FERRY_OK);
  assert_int_equal(upsert_slot(t.a.store, "k", buf, 256 * KiB, 2, NULL), FERRY_OK);
  expect_copy(t.a.store, "k", 256 * KiB, 2);
  uint8_t data[300];
  fill(data, sizeof data, 3);
  assert_int_equal(ferry_store_upsert(t.a.store, "fresh", data, sizeof data, NULL), FERRY_OK);
  expect_copy(b.store, "fresh", sizeof data, 3);
  /* Two replicas now, one in each segment; a put keeps the value. */
  ferry_store_replicate two = replicate(2, NULL, FERRY_STORE_PIN_NONE);
  assert_int_equal(upsert_slot(t.a.store, "k", buf, 100 * KiB, 4, &two), FERRY_OK);
  raw_client r;
  raw_open(&r, t.m.addr);
  unsigned replicas = 0;
  raw_get(&r, "k", &replicas, NULL, NULL);
  assert_int_equal(replicas, 2);
  fill(buf, 100 * KiB, 5);
  assert_int_equal(ferry_store_put_from(t.a.store, "k", buf, 100 * KiB, NULL), FERRY_OK);
  expect_copy(b.store, "k", 100 * KiB, 4);

  /* An upsert in progress (by hand): half its bytes written, gets read the
   * old value whole; puts and upserts of the key wait; at its end the new
   * value is read whole. */
  uint8_t *fresh = (uint8_t *)(uintptr_t)raw_start(&r, STORE_UPSERT_START, "k", 128 * KiB, seg);
  fill(buf, 128 * KiB, 6);
  memcpy(fresh, buf, 64 * KiB);
  expect_copy(b.store, "k", 100 * KiB, 4);
  assert_int_equal(upsert_slot(t.a.store, "k", buf, 64 * KiB, 7, NULL), FERRY_EBUSY);
  assert_non_null(strstr(ferry_last_error(), "a put or upsert of it is in progress"));
  fill(buf, 128 * KiB, 6);
  memcpy(fresh + 64 * KiB, buf + 64 * KiB, 64 * KiB);
  raw_put_end(&r, "k");
  expect_copy(b.store, "k", 128 * KiB, 6);

  /* The writer dies between its start and end: the old value stays. */
  raw_start(&r, STORE_UPSERT_START, "k", 32 * KiB, seg);
  close(r.fd);
  expect_copy(b.store, "k", 128 * KiB, 6);
  ferry_status st;
  double until = test_now_s() + TEST_SETUP_MS / 1000.0;
  while ((st = upsert_slot(t.a.store, "k", buf, 32 * KiB, 8, NULL)) == FERRY_EBUSY &&
         test_now_s() < until)
    usleep(10000); /* until the master saw the writer go */
  assert_int_equal(st, FERRY_OK);
  expect_copy(b.store, "k", 32 * KiB, 8);

  ferry_memory_free(t.a.engine, buf);
  local_close(&b);
  rig_close(&t);
}

/* A get's lease on a value an upsert replaced keeps its space: the reader
 * that got the old replica reads the old bytes until the lease ends, even
 * when the pool is full and a put must evict; once the lease ended, the
 * next put takes that space without evicting anything. One 1 MiB segment
 * of sixteen 64 KiB slots, the watermark at 1 (eviction only for a put
 * that does not fit). */
static void an_upsert_keeps_the_old_bytes_under_a_lease(unsigned lease_ms) {
  rig t;
  char lease[64];
  snprintf(lease, sizeof lease, "--default_kv_lease_ttl=%u", lease_ms);
  uint8_t *buf = slots_open(&t, lease, "--eviction_high_watermark_ratio=1");
  put_slots(t.a.store, "k", 0, 1, buf, FERRY_STORE_PIN_NONE); /* k00: slot 0 */
  put_slots(t.a.store, "fill", 1, SLOTS - 1, buf, FERRY_STORE_PIN_NONE);
  raw_client r;
  raw_open(&r, t.m.addr);
  uint64_t replied;
  const uint8_t *old = (const uint8_t *)(uintptr_t)raw_get(&r, "k00", NULL, &replied, NULL);
  assert_int_equal(upsert_slot(t.a.store, "k00", buf, SLOT, 50, NULL), FERRY_OK); /* slot 15 */
  expect_bytes(t.a.store, "k00", buf, SLOT, 50);
  if (lease_ms > 60000) {
    /* The pool is full but for the old value's slot, which its lease holds. */
    put_slots(t.a.store, "extra", 7, 8, buf, FERRY_STORE_PIN_NONE);
    assert_int_equal(mismatch(old, SLOT, 0), -1);
    expect_gone(t.a.store, "fill01");
  } else {
    let_lapse(replied, lease_ms);
    put_slots(t.a.store, "extra", 7, 8, buf, FERRY_STORE_PIN_NONE);
    expect_stored(t.a.store, "fill", 1, SLOTS - 1); /* it took the old value's slot */
    assert_true(mismatch(old, SLOT, 0) >= 0);
  }
  expect_slots(t.a.store, "extra", 7, 8, buf);
  close(r.fd);
  slots_close(&t, buf);
}

static void a_leased_old_value_outlives_its_upsert(void **state) {
  (void)state;
  an_upsert_keeps_the_old_bytes_under_a_lease(600000);
}

static void an_old_values_space_returns_when_its_lease_ends(void **state) {
  (void)state;
  an_upsert_keeps_the_old_bytes_under_a_lease(500);
}

/* ---- several buffers per key ---------------------------------------------------------------- */

#define LAYERS 4
#define KEYS 3
static const size_t layer_sizes[LAYERS] = {4 * KiB, 60 * KiB, 100, 32 * KiB + 5};

/* Buffers for KEYS keys of LAYERS layers, laid out layer-major (as a KV
 * pool holds them: layer l of every key, then layer l + 1) in mem; seed
 * k * LAYERS + l fills layer l of key k when seeded. */
static size_t layout(uint8_t *mem, ferry_store_buffer (*bufs)[LAYERS], int seeded) {
  size_t at = 0;
  for (size_t l = 0; l < LAYERS; l++)
    for (size_t k = 0; k < KEYS; k++) {
      bufs[k][l] = (ferry_store_buffer){mem + at, layer_sizes[l]};
      if (seeded)
        fill(mem + at, layer_sizes[l], (unsigned)(k * LAYERS + l));
      else
        memset(mem + at, 0, layer_sizes[l]);
      at += layer_sizes[l];
    }
  return at;
}

/* Transfer entries e submitted (op), toward every peer. */
static uint64_t ops_of(ferry_engine *e, ferry_op op) { return counted(e, (int)op); }

/* One key, several buffers (one per layer): the value is their
 * concatenation, each buffer written into and read from its place in the
 * replica by a transfer of its own (no staging: one entry per buffer),
 * every byte checked, to another client's segment and to the own one. A
 * get whose buffers hold less than the value fails that key alone; an
 * unregistered buffer is refused before anything is stored. */
static void several_buffers_make_one_value(void **state) {
  (void)state;
  rig t;
  rig_open(&t, NULL, SEGMENT);
  local_client b;
  local_open(&b, t.m.addr, 0); /* no segment: its values go to a's */
  uint8_t *mem, *into;
  assert_int_equal(ferry_memory_alloc(b.engine, 1 * MiB, (void **)&mem), FERRY_OK);
  assert_int_equal(ferry_memory_alloc(t.a.engine, 1 * MiB, (void **)&into), FERRY_OK);
  ferry_store_buffer bufs[KEYS][LAYERS], outs[KEYS][LAYERS];
  ferry_store_multi_item items[KEYS];
  char keys[KEYS][32];
  size_t value = 0;
  for (size_t l = 0; l < LAYERS; l++)
    value += layer_sizes[l];
  layout(mem, bufs, 1);
  for (size_t k = 0; k < KEYS; k++) {
    snprintf(keys[k], sizeof keys[k], "block_%zu", k);
    items[k] = (ferry_store_multi_item){keys[k], bufs[k], LAYERS, 0, FERRY_EINVAL};
  }
  uint64_t writes = ops_of(b.engine, FERRY_OP_WRITE);
  if (ferry_store_put_from_multi_buffers(b.store, items, KEYS, NULL) != FERRY_OK)
    fail_msg("put from several buffers: %s", ferry_last_error());
  assert_int_equal(ops_of(b.engine, FERRY_OP_WRITE) - writes, KEYS * LAYERS);
  for (size_t k = 0; k < KEYS; k++) {
    assert_int_equal(items[k].status, FERRY_OK);
    assert_int_equal(items[k].length, value);
  }

  /* Read back by a (the replica in its own segment) into scattered buffers,
   * and by b (a transfer per buffer); and as one buffer: the concatenation. */
  for (int reader = 0; reader < 2; reader++) {
    ferry_store *s = reader ? b.store : t.a.store;
    uint8_t *dst = reader ? mem + 512 * KiB : into;
    layout(dst, outs, 0);
    for (size_t k = 0; k < KEYS; k++)
      items[k] = (ferry_store_multi_item){keys[k], outs[k], LAYERS, 0, FERRY_EINVAL};
    uint64_t reads = ops_of(b.engine, FERRY_OP_READ);
    if (ferry_store_get_into_multi_buffers(s, items, KEYS) != FERRY_OK)
      fail_msg("get into several buffers: %s", ferry_last_error());
    if (reader)
      assert_int_equal(ops_of(b.engine, FERRY_OP_READ) - reads, KEYS * LAYERS);
    for (size_t k = 0; k < KEYS; k++) {
      assert_int_equal(items[k].status, FERRY_OK);
      assert_int_equal(items[k].length, value);
      for (size_t l = 0; l < LAYERS; l++)
        assert_int_equal(mismatch(outs[k][l].buf, layer_sizes[l], (unsigned)(k * LAYERS + l)), -1);
    }
  }
  size_t got;
  assert_int_equal(ferry_store_get_into(t.a.store, keys[1], into, 1 * MiB, &got), FERRY_OK);
  assert_int_equal(got, value);
  for (size_t l = 0, at = 0; l < LAYERS; at += layer_sizes[l], l++)
    assert_int_equal(mismatch(into + at, layer_sizes[l], (unsigned)(LAYERS + l)), -1);

  /* Buffers that hold less than the value: that key fails, naming both
   * sizes; the others are read. */
  layout(into, outs, 0);
  for (size_t k = 0; k < KEYS; k++)
    items[k] = (ferry_store_multi_item){keys[k], outs[k], LAYERS, 0, FERRY_OK};
  items[1].count = LAYERS - 1;
  assert_int_equal(ferry_store_get_into_multi_buffers(t.a.store, items, KEYS), FERRY_EINVAL);
  char why[128];
  snprintf(why, sizeof why, "get \"block_1\": the value is %zu bytes, the buffers hold %zu", value,
           value - layer_sizes[LAYERS - 1]);
  if (!strstr(ferry_last_error(), why))
    fail_msg("a get into buffers too small: %s", ferry_last_error());
  assert_int_equal(items[0].status, FERRY_OK);
  assert_int_equal(items[1].status, FERRY_EINVAL);
  assert_int_equal(items[1].length, value);
  assert_int_equal(items[2].status, FERRY_OK);
  assert_int_equal(mismatch(outs[2][3].buf, layer_sizes[3], 2 * LAYERS + 3), -1);
  assert_true(mismatch(outs[1][0].buf, layer_sizes[0], LAYERS) >= 0); /* not read */

  /* One buffer of one key not registered: refused, nothing stored. */
  uint8_t loose[100];
  layout(mem, bufs, 1);
  bufs[2][2] = (ferry_store_buffer){loose, sizeof loose};
  for (size_t k = 0; k < KEYS; k++) {
    snprintf(keys[k], sizeof keys[k], "other_%zu", k);
    items[k] = (ferry_store_multi_item){keys[k], bufs[k], LAYERS, 0, FERRY_OK};
  }
  assert_int_equal(ferry_store_put_from_multi_buffers(b.store, items, KEYS, NULL), FERRY_ENOTREG);
  if (!strstr(ferry_last_error(), "ferry_store_put_from_multi_buffers \"other_2\"") ||
      !strstr(ferry_last_error(), "is not registered on this engine"))
    fail_msg("an unregistered buffer: %s", ferry_last_error());
  assert_int_equal(ferry_store_exists(b.store, "other_0"), FERRY_ENOTFOUND);

  ferry_memory_free(t.a.engine, into);
  ferry_memory_free(b.engine, mem);
  local_close(&b);
  rig_close(&t);
}

/* ---- the master restarts -------------------------------------------------------------------- */

/* A master in this process, so that a case can stop it and start the next
 * one on the same port: the first start takes any free port. */
typedef struct master_here {
  store_master_config cfg;
  store_master *m;
  char addr[64];
} master_here;

static void here_start(master_here *h) {
  if (store_master_start(&h->cfg, &h->m) != FERRY_OK)
    fail_msg("store master on port %u: %s", h->cfg.port, ferry_last_error());
  h->cfg.port = store_master_port(h->m);
  snprintf(h->addr, sizeof h->addr, "127.0.0.1:%u", h->cfg.port);
}

static void here_restart(master_here *h) {
  store_master_stop(h->m);
  here_start(h);
}

/* WARN lines saying that the master at arg (its address) restarted. */
static int restart_warnings;

static void count_restart_warnings(const ferry_log_record *r, void *arg) {
  if (r->level == FERRY_LOG_WARN && strstr(r->message, (const char *)arg) &&
      strstr(r->message, "restarted") && strstr(r->message, "objects stored before are gone"))
    __atomic_add_fetch(&restart_warnings, 1, __ATOMIC_RELAXED);
  fprintf(stderr, "%s\n", r->line);
}

/* The next call after the master restarted on the same port reconnects
 * (proving the secret again when one is set), registers the client's
 * segment again, empty, and works; the old objects are gone, and one WARN
 * line says so. */
static void rejoin_a_restarted_master(const char *secret) {
  master_here h = {.cfg = {.secret = secret}};
  here_start(&h);
  ferry_engine *e = engine_on_loopback();
  assert_non_null(e);
  ferry_store *s;
  if (store_on(e, h.addr, SEGMENT, secret, &s) != FERRY_OK)
    fail_msg("ferry_store_open: %s", ferry_last_error());
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(e, 64 * KiB, (void **)&buf), FERRY_OK);
  fill(buf, 64 * KiB, 1);
  assert_int_equal(ferry_store_put_from(s, "before", buf, 64 * KiB, NULL), FERRY_OK);
  expect_bytes(s, "before", buf, 64 * KiB, 1);

  __atomic_store_n(&restart_warnings, 0, __ATOMIC_RELAXED);
  ferry_log_set_handler(count_restart_warnings, h.addr);
  here_restart(&h);
  /* This client's segment is the only one: the put shows it is back. */
  fill(buf, 64 * KiB, 2);
  if (ferry_store_put_from(s, "after", buf, 64 * KiB, NULL) != FERRY_OK)
    fail_msg("the first call after the restart: %s", ferry_last_error());
  expect_bytes(s, "after", buf, 64 * KiB, 2);
  assert_int_equal(ferry_store_exists(s, "before"), FERRY_ENOTFOUND);
  ferry_log_set_handler(NULL, NULL);
  assert_int_equal(__atomic_load_n(&restart_warnings, __ATOMIC_RELAXED), 1);

  ferry_memory_free(e, buf);
  ferry_store_close(s);
  ferry_engine_destroy(e);
  store_master_stop(h.m);
}

static void a_client_rejoins_a_restarted_master(void **state) {
  (void)state;
  rejoin_a_restarted_master(NULL);
}

static void a_client_rejoins_a_restarted_master_with_its_secret(void **state) {
  (void)state;
  rejoin_a_restarted_master("store-secret");
}

/* While no master listens, each call fails at once naming the master; the
 * first call after it is back reconnects. */
static void a_call_without_a_master_fails_and_the_next_reconnects(void **state) {
  (void)state;
  master_here h = {0};
  here_start(&h);
  local_client a;
  local_open(&a, h.addr, SEGMENT);
  uint8_t data[1000];
  fill(data, sizeof data, 6);
  assert_int_equal(ferry_store_put(a.store, "kept", data, sizeof data, NULL), FERRY_OK);

  store_master_stop(h.m);
  assert_int_equal(ferry_store_exists(a.store, "kept"), FERRY_ESOCKET);
  assert_non_null(strstr(ferry_last_error(), h.addr));
  assert_int_equal(ferry_store_put(a.store, "new", data, sizeof data, NULL), FERRY_ESOCKET);
  if (!strstr(ferry_last_error(), "cannot reach store master") ||
      !strstr(ferry_last_error(), h.addr))
    fail_msg("a call while the master is down: %s", ferry_last_error());

  here_start(&h);
  assert_int_equal(ferry_store_exists(a.store, "kept"), FERRY_ENOTFOUND);
  fill(data, sizeof data, 7);
  assert_int_equal(ferry_store_put(a.store, "new", data, sizeof data, NULL), FERRY_OK);
  expect_copy(a.store, "new", sizeof data, 7);
  local_close(&a);
  store_master_stop(h.m);
}

/* Waits (TEST_SETUP_MS at most) until e has n batches in flight. */
static void wait_in_flight(ferry_engine *e, uint64_t n) {
  uint64_t now = test_await_in_flight(e, n, TEST_SETUP_MS);
  if (now < n)
    fail_msg("%llu batches in flight, not %llu", (unsigned long long)now, (unsigned long long)n);
}

/* A put whose WRITE is in flight while the master restarts fails at its
 * end and commits nothing: its PUT_END does not go to the new master,
 * where this client meanwhile started a put of the same key whose bytes
 * are not written yet (it would commit that one, unwritten). */
static void a_put_across_a_restart_commits_nothing(void **state) {
  (void)state;
  master_here h = {0};
  here_start(&h);
  local_client a;
  local_open_over(&a, h.addr, SEGMENT, FERRY_TRANSPORT_TCP); /* a stopped process serves no tcp */
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(a.engine, 128 * KiB, (void **)&buf), FERRY_OK);
  child_client b, c;
  child_open(&b, h.addr);
  fill(buf, 64 * KiB, 3);
  ferry_store_replicate in_b = replicate(1, b.segment, FERRY_STORE_PIN_NONE);
  assert_int_equal(ferry_store_put_from(a.store, "warm_b", buf, 64 * KiB, &in_b), FERRY_OK);
  child_stop(&b);
  test_store_op old = {.store = a.store,
                       .put = 1,
                       .key = "across",
                       .buf = buf,
                       .len = 64 * KiB,
                       .rep = replicate(1, b.segment, FERRY_STORE_PIN_NONE)};
  test_store_op_start(&old);
  wait_in_flight(a.engine, 1); /* PUT_START done; its WRITE waits on b */

  here_restart(&h);
  child_open(&c, h.addr);
  fill(buf + 64 * KiB, 64 * KiB, 4);
  ferry_store_replicate in_c = replicate(1, c.segment, FERRY_STORE_PIN_NONE);
  assert_int_equal(ferry_store_put_from(a.store, "warm_c", buf + 64 * KiB, 64 * KiB, &in_c),
                   FERRY_OK);
  child_stop(&c);
  test_store_op new = {.store = a.store,
                       .put = 1,
                       .key = "across",
                       .buf = buf + 64 * KiB,
                       .len = 64 * KiB,
                       .rep = replicate(1, c.segment, FERRY_STORE_PIN_NONE)};
  test_store_op_start(&new);
  wait_in_flight(a.engine, 2); /* the new master's put of "across" waits on c */

  kill(b.pid, SIGCONT);
  test_store_op_join(&old);
  assert_int_equal(old.status, FERRY_ESOCKET);
  if (!strstr(old.detail, h.addr) || !strstr(old.detail, "nothing is committed"))
    fail_msg("the put across the restart: %s", old.detail);
  assert_int_equal(ferry_store_exists(a.store, "across"), FERRY_ENOTFOUND); /* still unwritten */

  kill(c.pid, SIGCONT);
  test_store_op_join(&new);
  if (new.status != FERRY_OK)
    fail_msg("the put on the new master: %s", new.detail);
  expect_bytes(a.store, "across", buf, 64 * KiB, 4);
  child_close(&b);
  child_close(&c);
  ferry_memory_free(a.engine, buf);
  local_close(&a);
  store_master_stop(h.m);
}

/* An idle client's PING thread rejoins a restarted master: its segment
 * takes another client's puts again with no call of its own. Under TSan
 * the PING thread's reconnect meets this thread's calls on the client. */
static void an_idle_client_rejoins_by_its_ping_thread(void **state) {
  (void)state;
  master_here h = {.cfg = {.client_ttl_ms = 3000}}; /* a PING a second */
  here_start(&h);
  local_client idle, busy;
  local_open(&idle, h.addr, SEGMENT);
  local_open(&busy, h.addr, 0); /* no segment: its puts go to idle's */
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(busy.engine, 4 * KiB, (void **)&buf), FERRY_OK);
  fill(buf, 4 * KiB, 8);
  assert_int_equal(ferry_store_put_from(busy.store, "first", buf, 4 * KiB, NULL), FERRY_OK);

  __atomic_store_n(&restart_warnings, 0, __ATOMIC_RELAXED);
  ferry_log_set_handler(count_restart_warnings, h.addr);
  here_restart(&h);
  /* FERRY_ENOMEM (no segment) until idle's PING thread registered it. */
  ferry_status st;
  double until = test_now_s() + TEST_SETUP_MS / 1000.0;
  while ((st = ferry_store_put_from(busy.store, "second", buf, 4 * KiB, NULL)) != FERRY_OK &&
         test_now_s() < until)
    usleep(10000);
  if (st != FERRY_OK)
    fail_msg("a put into the idle client's segment: %s", ferry_last_error());
  /* After idle's own lock: its PING thread logged under it. (Into memory
   * registered on idle's engine: the copy out of its own segment needs it.) */
  uint8_t *back;
  assert_int_equal(ferry_memory_alloc(idle.engine, 4 * KiB, (void **)&back), FERRY_OK);
  expect_bytes(idle.store, "second", back, 4 * KiB, 8);
  ferry_memory_free(idle.engine, back);
  ferry_log_set_handler(NULL, NULL);
  /* One line per client. */
  assert_int_equal(__atomic_load_n(&restart_warnings, __ATOMIC_RELAXED), 2);
  assert_int_equal(ferry_store_exists(idle.store, "first"), FERRY_ENOTFOUND);
  ferry_memory_free(busy.engine, buf);
  local_close(&busy);
  local_close(&idle);
  store_master_stop(h.m);
}

/* ---- the SSD tier --------------------------------------------------------------------------- */

/* outer/root: the --root_fs_dir of a case; outer holds nothing else, so a
 * file a key would put outside the directory shows there. */
typedef struct tier {
  char outer[64];
  char root[96];
  char dir[128]; /* root/mooncake_cluster: where the files are */
  char flag[128];
  rig t;
  uint8_t *buf; /* registered, 2 MiB */
} tier;

static void tier_dirs(tier *d) {
  snprintf(d->outer, sizeof d->outer, "/tmp/ferry-ssd-XXXXXX");
  assert_non_null(mkdtemp(d->outer));
  snprintf(d->root, sizeof d->root, "%s/root", d->outer);
  assert_int_equal(mkdir(d->root, 0755), 0);
  snprintf(d->dir, sizeof d->dir, "%s/mooncake_cluster", d->root);
  snprintf(d->flag, sizeof d->flag, "--root_fs_dir=%s", d->root);
}

/* A master with the tier, a 1 MiB pool (SLOTS slots) that evicts only for
 * puts that do not fit, leases of 1 ms; a client of ours. */
static void tier_open(tier *d) {
  tier_dirs(d);
  const char *argv[] = {test_tool_path(),
                        "store-master",
                        "--port=0",
                        d->flag,
                        "--eviction_high_watermark_ratio=1",
                        "--default_kv_lease_ttl=1",
                        NULL};
  master_start_argv(&d->t.m, argv);
  local_open(&d->t.a, d->t.m.addr, SLOTS * SLOT);
  assert_int_equal(ferry_memory_alloc(d->t.a.engine, 2 * SLOTS * SLOT, (void **)&d->buf), FERRY_OK);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)st;
  (void)type;
  (void)ftw;
  return remove(path);
}

static void tier_close(tier *d) {
  if (d->buf)
    slots_close(&d->t, d->buf);
  nftw(d->outer, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* The names in dir but . and ..: fails on one that is not `only` (NULL:
 * a 32-hex-digit hash and ".kv"); returns how many. */
static int names_in(const char *dir, const char *only) {
  DIR *dp = opendir(dir);
  if (!dp)
    fail_msg("opendir %s: %s", dir, strerror(errno));
  int n = 0;
  for (struct dirent *e; (e = readdir(dp)) != NULL;) {
    const char *name = e->d_name;
    if (!strcmp(name, ".") || !strcmp(name, ".."))
      continue;
    int ok = only ? !strcmp(name, only)
                  : strlen(name) == 35 && strspn(name, "0123456789abcdef") == 32 &&
                        !strcmp(name + 32, ".kv");
    if (!ok)
      fail_msg("%s holds \"%s\"", dir, name);
    n++;
  }
  closedir(dp);
  return n;
}

static void file_of(const tier *d, const char *key, char path[STORE_DISK_PATH_MAX]) {
  assert_int_equal(store_disk_path(d->dir, key, strlen(key), path), 0);
}

static int file_exists(const tier *d, const char *key) {
  char path[STORE_DISK_PATH_MAX];
  file_of(d, key, path);
  return access(path, F_OK) == 0;
}

/* Puts slot00..slot31 into the 16-slot pool: slot00..15 are evicted on
 * the way, their files kept. */
static void tier_fill(tier *d) {
  put_slots(d->t.a.store, "slot", 0, 2 * SLOTS, d->buf, FERRY_STORE_PIN_NONE);
  assert_int_equal(names_in(d->dir, NULL), 2 * SLOTS);
}

/* ferry_store_replicas_batch: an object in memory and in its file, one
 * in its file only (the path the client computes), an absent key, a put
 * still pending (invisible, as for get), an empty key refusing the call. */
static void replicas_name_memory_and_files(void **state) {
  (void)state;
  tier d = {0};
  tier_open(&d);
  ferry_store *s = d.t.a.store;
  tier_fill(&d);
  raw_client r;
  raw_open(&r, d.t.m.addr);
  raw_put_start(&r, "pending_k", SLOT, ferry_store_segment(s)); /* evicts slot16 */
  ferry_store_replica_list q[] = {
      {.key = "slot20"}, {.key = "slot00"}, {.key = "absent"}, {.key = "pending_k"}};
  if (ferry_store_replicas_batch(s, q, 4) != FERRY_OK)
    fail_msg("replicas: %s", ferry_last_error());
  char path[STORE_DISK_PATH_MAX];
  assert_int_equal(q[0].status, FERRY_OK);
  assert_int_equal(q[0].size, SLOT);
  assert_int_equal(q[0].count, 2);
  assert_int_equal(q[0].replicas[0].kind, FERRY_STORE_REPLICA_MEMORY);
  assert_string_equal(q[0].replicas[0].location, ferry_store_segment(s));
  assert_int_not_equal(q[0].replicas[0].address, 0);
  file_of(&d, "slot20", path);
  assert_int_equal(q[0].replicas[1].kind, FERRY_STORE_REPLICA_DISK);
  assert_string_equal(q[0].replicas[1].location, path);
  assert_int_equal(q[1].status, FERRY_OK);
  assert_int_equal(q[1].count, 1);
  file_of(&d, "slot00", path);
  assert_int_equal(q[1].replicas[0].kind, FERRY_STORE_REPLICA_DISK);
  assert_string_equal(q[1].replicas[0].location, path);
  assert_int_equal(q[1].replicas[0].address, 0);
  for (int i = 2; i < 4; i++) {
    assert_int_equal(q[i].status, FERRY_ENOTFOUND);
    assert_int_equal(q[i].size, 0);
    assert_int_equal(q[i].count, 0);
    assert_null(q[i].replicas);
  }
  ferry_store_replica_lists_free(q, 4);
  assert_null(q[0].replicas);
  raw_put_end(&r, "pending_k");
  assert_int_equal(ferry_store_replicas_batch(s, &q[3], 1), FERRY_OK);
  assert_int_equal(q[3].status, FERRY_OK);
  assert_int_equal(q[3].count, 1); /* in memory; no file: the raw writer wrote none */
  ferry_store_replica_lists_free(&q[3], 1);
  close(r.fd);
  ferry_store_replica_list bad[] = {{.key = "slot20"}, {.key = ""}};
  assert_int_equal(ferry_store_replicas_batch(s, bad, 2), FERRY_EINVAL);
  assert_null(bad[0].replicas);
  tier_close(&d);
}

/* Objects evicted from memory stay in their files and every call reads
 * them back byte-exact: exists, size, get_into, get, a batch of both
 * kinds; remove and remove_all delete the files. */
static void evicted_objects_are_read_back_from_their_files(void **state) {
  (void)state;
  tier d = {0};
  tier_open(&d);
  ferry_store *s = d.t.a.store;
  tier_fill(&d);
  uint64_t size = 0;
  assert_int_equal(ferry_store_size(s, "slot00", &size), FERRY_OK); /* on disk only */
  assert_int_equal(size, SLOT);
  /* Remove (before any get leases them): a disk-only object, one in memory. */
  assert_int_equal(ferry_store_remove(s, "slot03"), FERRY_OK);
  assert_int_equal(ferry_store_remove(s, "slot20"), FERRY_OK);
  assert_false(file_exists(&d, "slot03"));
  assert_false(file_exists(&d, "slot20"));
  assert_int_equal(ferry_store_exists(s, "slot03"), FERRY_ENOTFOUND);
  assert_int_equal(names_in(d.dir, NULL), 2 * SLOTS - 2);
  expect_slots(s, "slot", 0, 3, d.buf);
  expect_slots(s, "slot", 4, 20, d.buf);
  expect_slots(s, "slot", 21, 2 * SLOTS, d.buf);
  expect_copy(s, "slot07", SLOT, 7);
  /* One batch: two from files, one from memory. */
  const unsigned seeds[] = {1, 31, 9};
  ferry_store_item items[] = {{"slot01", d.buf, SLOT, FERRY_OK},
                              {"slot31", d.buf + SLOT, SLOT, FERRY_OK},
                              {"slot09", d.buf + 2 * SLOT, SLOT, FERRY_OK}};
  memset(d.buf, 0, 3 * SLOT);
  if (ferry_store_get_into_batch(s, items, 3) != FERRY_OK)
    fail_msg("batch get: %s", ferry_last_error());
  for (int i = 0; i < 3; i++) {
    assert_int_equal(items[i].length, SLOT);
    assert_int_equal(mismatch(d.buf + i * SLOT, SLOT, seeds[i]), -1);
  }
  /* A put of a disk-only key: stored already, the first value kept. */
  assert_int_equal(put_slot(s, "slot02", d.buf, 99, FERRY_STORE_PIN_NONE), FERRY_OK);
  expect_bytes(s, "slot02", d.buf, SLOT, 2);
  /* remove_all: every object no lease holds (1 ms) goes, with its file. */
  uint64_t removed = 0;
  assert_int_equal(ferry_store_remove_all(s, &removed), FERRY_OK);
  assert_true(removed >= 1);
  assert_int_equal(names_in(d.dir, NULL), 2 * SLOTS - 2 - (int)removed);
  tier_close(&d);
}

/* The size of key's file (-1: none). */
static long file_size(const tier *d, const char *key) {
  char path[STORE_DISK_PATH_MAX];
  struct stat st;
  file_of(d, key, path);
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* A value of several buffers (4 parts of SLOT) at buf's slots 0..3, and
 * the same parts as in the store's order, for a get into them. */
static void four_parts(uint8_t *buf, ferry_store_buffer parts[4]) {
  const size_t lengths[4] = {100, 1000, SLOT / 2, SLOT / 2 - 1100};
  for (int j = 0; j < 4; j++)
    parts[j] = (ferry_store_buffer){buf + (size_t)j * SLOT, lengths[j]};
}

/* The SSD tier with several buffers per key and upserts: a multi-buffer
 * put writes its file as the buffers' concatenation and, once evicted,
 * reads back from it into several buffers or one; an upsert rewrites the
 * key's file, so the evicted new value reads back, and an upsert of a
 * value on disk only replaces it too. */
static void multi_buffer_values_and_upserts_in_files(void **state) {
  (void)state;
  tier d = {0};
  tier_open(&d);
  ferry_store *s = d.t.a.store;
  uint8_t *want = malloc(SLOT);
  assert_non_null(want);
  fill(want, SLOT, 41);
  ferry_store_buffer parts[4];
  four_parts(d.buf, parts);
  for (size_t j = 0, at = 0; j < 4; at += parts[j].length, j++)
    memcpy(parts[j].buf, want + at, parts[j].length);
  ferry_store_multi_item multi = {"multi", parts, 4, 0, FERRY_OK};
  if (ferry_store_put_from_multi_buffers(s, &multi, 1, NULL) != FERRY_OK)
    fail_msg("multi-buffer put: %s", ferry_last_error());
  assert_int_equal(file_size(&d, "multi"), 24 + 5 + SLOT);
  assert_int_equal(put_slot(s, "up", d.buf, 42, FERRY_STORE_PIN_NONE), FERRY_OK);
  assert_int_equal(upsert_slot(s, "up", d.buf, SLOT / 2, 43, NULL), FERRY_OK);
  assert_int_equal(file_size(&d, "up"), 24 + 2 + SLOT / 2);
  put_slots(s, "slot", 0, 2 * SLOTS, d.buf, FERRY_STORE_PIN_NONE); /* evicts both */
  assert_int_equal(names_in(d.dir, NULL), 2 * SLOTS + 2);          /* their files stay */

  memset(d.buf, 0, 4 * SLOT);
  ferry_store_multi_item back = {"multi", parts, 4, 0, FERRY_OK};
  if (ferry_store_get_into_multi_buffers(s, &back, 1) != FERRY_OK)
    fail_msg("multi-buffer get: %s", ferry_last_error());
  assert_int_equal(back.length, SLOT);
  for (size_t j = 0, at = 0; j < 4; at += parts[j].length, j++)
    assert_memory_equal(parts[j].buf, want + at, parts[j].length);
  expect_bytes(s, "multi", d.buf, SLOT, 41);
  expect_bytes(s, "up", d.buf, SLOT / 2, 43);
  raw_client r;
  raw_open(&r, d.t.m.addr);
  unsigned replicas = 1;
  uint8_t on_disk = 0;
  raw_get(&r, "multi", &replicas, NULL, &on_disk); /* both were read from their files */
  assert_true(replicas == 0 && on_disk);
  raw_get(&r, "up", &replicas, NULL, &on_disk);
  assert_true(replicas == 0 && on_disk);

  /* While an upsert of a value on disk only runs (a raw client's, the new
   * file written by hand), a get finds the key absent: the old value gave
   * its file up at UPSERT_START, so no reader meets the new file under the
   * old value's size. */
  raw_start(&r, STORE_UPSERT_START, "up", SLOT, ferry_store_segment(s));
  fill(d.buf, SLOT, 46);
  ferry_store_buffer whole = {d.buf, SLOT};
  assert_int_equal(store_disk_write(d.dir, "up", &whole, 1, SLOT), FERRY_OK);
  ferry_status st = ferry_store_get_into(s, "up", d.buf + SLOT, SLOT, NULL);
  if (st != FERRY_ENOTFOUND)
    fail_msg("get during the upsert: %d (%s), not FERRY_ENOTFOUND", st, ferry_last_error());
  raw_put_end(&r, "up");
  close(r.fd);

  /* A client's upsert of a value on disk only rewrites its file. */
  assert_int_equal(upsert_slot(s, "multi", d.buf, SLOT / 4, 44, NULL), FERRY_OK);
  assert_int_equal(file_size(&d, "multi"), 24 + 5 + SLOT / 4);
  expect_bytes(s, "multi", d.buf, SLOT / 4, 44);
  free(want);
  tier_close(&d);
}

/* Overwrites len bytes of path at offset with 0x5a. */
static void scribble(const char *path, off_t offset, size_t len) {
  int fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  uint8_t junk[64];
  memset(junk, 0x5a, sizeof junk);
  assert_int_equal(pwrite(fd, junk, len, offset), (ssize_t)len);
  close(fd);
}

/* A get of key fails with want, naming the key and its file and saying
 * `says`; then the key is gone from the store, its file too. */
static void expect_refused_file(tier *d, const char *key, ferry_status want, const char *says) {
  char path[STORE_DISK_PATH_MAX];
  file_of(d, key, path);
  ferry_status st = ferry_store_get_into(d->t.a.store, key, d->buf, SLOT, NULL);
  if (st != want)
    fail_msg("get %s: %d (%s), not %d", key, st, ferry_last_error(), want);
  const char *err = ferry_last_error();
  if (!strstr(err, key) || !strstr(err, strrchr(path, '/') + 1) || !strstr(err, says))
    fail_msg("get %s: the error names no key or file, or not \"%s\": %s", key, says, err);
  assert_int_equal(ferry_store_exists(d->t.a.store, key), FERRY_ENOTFOUND);
  assert_false(file_exists(d, key));
}

/* A disk-only object whose file was damaged, cut short, replaced by
 * another key's or deleted is refused with the key and the path, and
 * dropped; an object still in memory is read from there. */
/* ferry_store_get_ranges of a disk-only object (read from its file) and
 * of one in memory, in one call, each byte checked. */
static void ranges_of_an_evicted_object_come_from_its_file(void **state) {
  (void)state;
  tier d = {0};
  tier_open(&d);
  tier_fill(&d);
  memset(d.buf, 0, 2 * SLOT);
  ferry_store_range rg[] = {{"slot00", d.buf, SLOT - 300, 300, FERRY_EINVAL}, /* on disk only */
                            {"slot31", d.buf + SLOT, 5, 1000, FERRY_EINVAL}};
  if (ferry_store_get_ranges(d.t.a.store, rg, 2) != FERRY_OK)
    fail_msg("get_ranges: %s", ferry_last_error());
  for (size_t i = 0; i < 300; i++)
    assert_int_equal(d.buf[i], pattern(0, SLOT - 300 + i));
  for (size_t i = 0; i < 1000; i++)
    assert_int_equal(d.buf[SLOT + i], pattern(31, 5 + i));
  assert_int_equal(d.buf[300], 0);
  tier_close(&d);
}

static void a_damaged_or_missing_file_is_refused(void **state) {
  (void)state;
  tier d = {0};
  tier_open(&d);
  tier_fill(&d);
  char path[STORE_DISK_PATH_MAX], other[STORE_DISK_PATH_MAX];
  file_of(&d, "slot00", path);
  scribble(path, 24 + 6 + 1000, 1); /* a byte of the value */
  expect_refused_file(&d, "slot00", FERRY_ECHECKSUM, "checksum");
  file_of(&d, "slot01", path);
  assert_int_equal(truncate(path, 100), 0);
  expect_refused_file(&d, "slot01", FERRY_ECHECKSUM, "length");
  file_of(&d, "slot04", other);
  file_of(&d, "slot05", path);
  assert_int_equal(rename(other, path), 0); /* slot04's bytes under slot05's name */
  expect_refused_file(&d, "slot05", FERRY_ECHECKSUM, "another key");
  file_of(&d, "slot06", path);
  scribble(path, 0, 8); /* the magic */
  expect_refused_file(&d, "slot06", FERRY_ECHECKSUM, "no ferry header");
  file_of(&d, "slot02", path);
  assert_int_equal(unlink(path), 0);
  expect_refused_file(&d, "slot02", FERRY_ENOTFOUND, "No such file");
  /* In memory still: its file is not read. */
  file_of(&d, "slot31", path);
  scribble(path, 24 + 6, 64);
  expect_bytes(d.t.a.store, "slot31", d.buf, SLOT, 31);
  expect_slots(d.t.a.store, "slot", 7, 2 * SLOTS, d.buf);
  tier_close(&d);
}

/* Keys that look like paths name files by their hash, inside the
 * directory: nothing appears outside it, and they read back. */
static void a_key_with_dot_dots_stays_inside_the_directory(void **state) {
  (void)state;
  tier d = {0};
  tier_open(&d);
  static const char *const keys[] = {"../x", "../../x", "/tmp/x", "a/../../../b", "..", "."};
  for (unsigned i = 0; i < 6; i++)
    if (put_slot(d.t.a.store, keys[i], d.buf, 40 + i, FERRY_STORE_PIN_NONE) != FERRY_OK)
      fail_msg("put %s: %s", keys[i], ferry_last_error());
  put_slots(d.t.a.store, "slot", 0, SLOTS, d.buf, FERRY_STORE_PIN_NONE); /* evicts them */
  assert_int_equal(names_in(d.outer, "root"), 1);
  assert_int_equal(names_in(d.root, "mooncake_cluster"), 1);
  assert_int_equal(names_in(d.dir, NULL), 6 + SLOTS);
  for (unsigned i = 0; i < 6; i++)
    expect_bytes(d.t.a.store, keys[i], d.buf, SLOT, 40 + i);
  tier_close(&d);
}

/* An object whose one replica is in a stopped client is read from its
 * file once the READ there timed out; when that client is killed and the
 * master dropped its segment, the object (hard-pinned, so on no LRU list)
 * stays, disk-only, and reads back. */
static void an_object_outlives_its_segment_in_its_file(void **state) {
  (void)state;
  tier d = {0};
  tier_dirs(&d);
  master_start(&d.t.m, d.flag, NULL);
  local_open_over(&d.t.a, d.t.m.addr, SEGMENT, FERRY_TRANSPORT_TCP);
  ferry_store *s = d.t.a.store;
  assert_int_equal(ferry_memory_alloc(d.t.a.engine, 2 * SLOTS * SLOT, (void **)&d.buf), FERRY_OK);
  child_client b;
  child_open(&b, d.t.m.addr);
  ferry_store_replicate in_b = replicate(1, b.segment, FERRY_STORE_PIN_HARD);
  fill(d.buf, SLOT, 21);
  assert_int_equal(ferry_store_put_from(s, "in_b", d.buf, SLOT, &in_b), FERRY_OK);
  child_expect_ok(&b, "get in_b %zu 21\n", (size_t)SLOT); /* its replica is b's */

  child_stop(&b);
  test_engine_set_timeouts(d.t.a.engine, 1000, 1000);
  uint64_t timeouts = timeouts_of(d.t.a.engine);
  expect_bytes(s, "in_b", d.buf, SLOT, 21);
  assert_int_equal(timeouts_of(d.t.a.engine), timeouts + 1); /* b's replica was tried first */
  test_engine_set_timeouts(d.t.a.engine, TEST_SETUP_MS, TEST_SETUP_MS);

  child_kill(&b);
  raw_client r;
  raw_open(&r, d.t.m.addr);
  uint8_t on_disk = 0;
  unsigned replicas = 1;
  double until = test_now_s() + TEST_SETUP_MS / 1000.0;
  while (raw_get(&r, "in_b", &replicas, NULL, &on_disk), replicas != 0 && test_now_s() < until)
    usleep(10000); /* until the master saw b go */
  assert_int_equal(replicas, 0);
  assert_int_equal(on_disk, 1);
  close(r.fd);
  expect_bytes(s, "in_b", d.buf, SLOT, 21);
  tier_close(&d);
}

/* The master refuses, at start, a --root_fs_dir it cannot use, naming the
 * flag, the path and the cause. */
static void the_master_refuses_a_bad_root_fs_dir(void **state) {
  (void)state;
  tier d = {0};
  tier_dirs(&d);
  char missing[160], file[160];
  snprintf(missing, sizeof missing, "%s/missing", d.outer);
  snprintf(file, sizeof file, "%s/file", d.outer);
  int fd = open(file, O_WRONLY | O_CREAT, 0644);
  assert_true(fd >= 0);
  close(fd);
  struct {
    const char *root, *cluster, *cause;
  } bad[] = {{missing, NULL, "No such file"},
             {file, NULL, "not a directory"},
             {d.root, "a/b", "--cluster_id=a/b"},
             {d.root, "..", "--cluster_id=.."}};
  for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
    master_here h = {.cfg = {.root_fs_dir = bad[i].root, .cluster_id = bad[i].cluster}};
    assert_int_equal(store_master_start(&h.cfg, &h.m), FERRY_EINVAL);
    const char *err = ferry_last_error();
    if (!strstr(err, bad[i].cause) || (!bad[i].cluster && !strstr(err, bad[i].root)) ||
        (!bad[i].cluster && !strstr(err, "--root_fs_dir")))
      fail_msg("refusal of %s: %s", bad[i].root, err);
  }
  if (geteuid() != 0) { /* root writes anywhere */
    assert_int_equal(chmod(d.root, 0555), 0);
    master_here h = {.cfg = {.root_fs_dir = d.root}};
    assert_int_equal(store_master_start(&h.cfg, &h.m), FERRY_EINVAL);
    assert_non_null(strstr(ferry_last_error(), "Permission denied"));
    chmod(d.root, 0755);
  }
  assert_int_equal(names_in(d.root, NULL), 0); /* nothing made for a refused cluster id */
  tier_close(&d);
}

int main(int argc, char **argv) {
  const test_child_role roles[] = {{"client", client_role}};
  test_child_main(argc, argv, roles, sizeof roles / sizeof *roles);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(values_move_between_two_clients),
      cmocka_unit_test(ranges_and_batches_of_any_memory),
      cmocka_unit_test(a_large_batch_names_its_first_failure),
      cmocka_unit_test(a_put_is_invisible_until_committed),
      cmocka_unit_test(a_dead_clients_replicas_are_gone),
      cmocka_unit_test(a_get_moves_to_the_next_replica),
      cmocka_unit_test(remove_and_leases),
      cmocka_unit_test(a_full_pool_refuses_puts),
      cmocka_unit_test(the_lru_goes_past_the_high_watermark),
      cmocka_unit_test(a_put_into_a_full_pool_evicts_to_fit),
      cmocka_unit_test(leased_pending_and_hard_pinned_are_never_evicted),
      cmocka_unit_test(soft_pins_go_last_then_the_pool_refuses),
      cmocka_unit_test(an_ended_soft_pin_is_evicted_in_its_turn),
      cmocka_unit_test(a_soft_pin_ttl_holds_until_its_deadline),
      cmocka_unit_test(soft_pin_requests_mooncake_refuses),
      cmocka_unit_test(soft_pins_stay_when_not_allowed_to_go),
      cmocka_unit_test(enable_gc_removes_what_a_get_read),
      cmocka_unit_test(a_silent_client_is_dropped),
      cmocka_unit_test(the_masters_secret_is_required),
      cmocka_unit_test(a_hostile_client_hurts_only_itself),
      cmocka_unit_test(the_master_caps_its_clients),
      cmocka_unit_test(bad_arguments_are_refused),
      cmocka_unit_test(the_replicate_struct_carries_its_size),
      cmocka_unit_test(own_segment_copies_need_registered_buffers),
      cmocka_unit_test(an_upsert_replaces_a_value_whole),
      cmocka_unit_test(a_leased_old_value_outlives_its_upsert),
      cmocka_unit_test(an_old_values_space_returns_when_its_lease_ends),
      cmocka_unit_test(several_buffers_make_one_value),
      cmocka_unit_test(a_client_rejoins_a_restarted_master),
      cmocka_unit_test(a_client_rejoins_a_restarted_master_with_its_secret),
      cmocka_unit_test(a_call_without_a_master_fails_and_the_next_reconnects),
      cmocka_unit_test(a_put_across_a_restart_commits_nothing),
      cmocka_unit_test(an_idle_client_rejoins_by_its_ping_thread),
      cmocka_unit_test(evicted_objects_are_read_back_from_their_files),
      cmocka_unit_test(replicas_name_memory_and_files),
      cmocka_unit_test(multi_buffer_values_and_upserts_in_files),
      cmocka_unit_test(ranges_of_an_evicted_object_come_from_its_file),
      cmocka_unit_test(a_damaged_or_missing_file_is_refused),
      cmocka_unit_test(a_key_with_dot_dots_stays_inside_the_directory),
      cmocka_unit_test(an_object_outlives_its_segment_in_its_file),
      cmocka_unit_test(the_master_refuses_a_bad_root_fs_dir),
  };
  const char *only = getenv("FERRY_TEST_FILTER"); /* e.g. "*lease*" */
  if (only && *only)
    cmocka_set_test_filter(only);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
