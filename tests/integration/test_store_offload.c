/* test_store_offload.c - client-owned SSD offload (docs/store.md
 * "Client-owned SSD offload", RELIABILITY.md 22): a master process with
 * --enable_offload, an owner in a child process of its own (a 1 MiB
 * segment and an offload directory; killed or stopped by some cases) and a
 * reader in this process with no segment, so every value lives in the
 * owner's segment. Values are 600 KiB: two do not fit, so a put or a load
 * of one evicts the other. Every byte read is checked. Where the owner's
 * thread must act (write a file), the case waits for its effect with a
 * bound, never a sleep. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <poll.h>
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
#include "net/net.h"
#include "store/disk.h"
#include "store/handshake.h"
#include "store/master.h"
#include "store/protocol.h"
#include "stores.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define OWNER_SEGMENT (1 * MiB)
#define VALUE (600 * KiB)

static uint8_t pattern(unsigned seed, size_t i) { return (uint8_t)(i * 131u + seed * 7u + 1u); }

static void fill(uint8_t *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = pattern(seed, i);
}

static long mismatch(const uint8_t *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern(seed, i))
      return (long)i;
  return -1;
}

static ferry_engine *engine_on_loopback(void) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  ferry_engine *e = NULL;
  return ferry_engine_create(&cfg, &e) == FERRY_OK ? e : NULL;
}

static ferry_status open_capped(ferry_engine *e, const char *master, size_t segment,
                                const char *offload_dir, size_t capacity, ferry_store **out) {
  ferry_store_config cfg;
  ferry_store_config_init(&cfg);
  cfg.master = master;
  cfg.segment_size = segment;
  cfg.local_buffer_size = 1 * MiB;
  cfg.offload_dir = offload_dir;
  cfg.offload_max_bytes = capacity;
  return ferry_store_open(e, &cfg, out);
}

static ferry_status open_store(ferry_engine *e, const char *master, size_t segment,
                               const char *offload_dir, ferry_store **out) {
  return open_capped(e, master, segment, offload_dir, 0, out);
}

/* ---- the owner: a child process ---------------------------------------------------------------
 */

static int answer(ferry_status st) {
  if (st == FERRY_OK)
    printf("ok\n");
  else
    printf("err %d %s\n", st, ferry_last_error());
  return fflush(stdout);
}

/* argv: master, offload directory[, its capacity in bytes]. Lines "put KEY SIZE SEED" (into its own
 * segment: the reader has none), answered "ok" or "err N MESSAGE". */
static int owner_role(int argc, char **argv) {
  ferry_engine *e = argc == 2 || argc == 3 ? engine_on_loopback() : NULL;
  ferry_store *s;
  uint8_t *buf;
  size_t capacity = argc == 3 ? strtoull(argv[2], NULL, 10) : 0;
  if (!e || open_capped(e, argv[0], OWNER_SEGMENT, argv[1], capacity, &s) != FERRY_OK ||
      ferry_memory_alloc(e, 1 * MiB, (void **)&buf) != FERRY_OK) {
    fprintf(stderr, "owner: %s\n", ferry_last_error());
    return 2;
  }
  printf("ready %s\n", ferry_store_segment(s));
  fflush(stdout);
  char line[512], key[256];
  size_t size;
  unsigned seed;
  while (fgets(line, sizeof line, stdin))
    if (sscanf(line, "put %255s %zu %u", key, &size, &seed) == 3) {
      fill(buf, size, seed);
      answer(ferry_store_put_from(s, key, buf, size, NULL));
    }
  ferry_store_close(s);
  ferry_engine_destroy(e);
  return 0;
}

/* ---- a case's rig ------------------------------------------------------------------------------
 */

typedef struct rig {
  char tmp[64];
  char dir[96];  /* the owner's offload directory */
  char etcd[64]; /* HA: the etcd ("127.0.0.1:PORT") the masters elect a leader through; "" */
  pid_t master;
  char addr[64];
  char target[80]; /* the clients' master: addr, or etcd://HOST:PORT with HA */
  pid_t owner;
  int to, from;
  char segment[128];
  ferry_engine *engine; /* the reader's */
  ferry_store *reader;
  uint8_t *buf; /* registered, 1 MiB */
} rig;

/* A master (`ferry store-master --enable_offload` and flag, evicting only
 * for what does not fit) on port ("0": any), with --enable_ha when the rig
 * has an etcd (a lease of 2 s, etcd's minimum: a killed leader's key goes
 * soon). Its pid; where it listens into addr, and with HA its role
 * ("leader" or "standby") into role. */
static pid_t start_master(const rig *r, const char *flag, const char *port, char addr[64],
                          char role[16]) {
  char port_flag[32], etcd_flag[96];
  snprintf(port_flag, sizeof port_flag, "--port=%s", port);
  snprintf(etcd_flag, sizeof etcd_flag, "--ha_backend_connstring=%s", r->etcd);
  const char *argv[] = {test_tool_path(),
                        "store-master",
                        port_flag,
                        "--enable_offload",
                        "--eviction_high_watermark_ratio=1",
                        "--default_kv_lease_ttl=1",
                        "--client_ttl_ms=1500", /* a get waits 500 ms for a stalled owner */
                        flag,
                        r->etcd[0] ? "--enable_ha" : NULL, /* without HA, the list ends here */
                        "--ha_backend_type=etcd",
                        etcd_flag,
                        "--ha_lease_ttl=2",
                        NULL};
  char line[256];
  pid_t pid = test_tool_start(argv, line, sizeof line);
  role[0] = '\0';
  if (pid <= 0 || sscanf(line, "ready master=%63s %15s", addr, role) < 1)
    fail_msg("store-master did not start (line \"%s\")", pid > 0 ? line : "");
  return pid;
}

/* The rig's master on port ("0": any; r->addr gets where it listens). */
static void rig_start_master(rig *r, const char *flag, const char *port) {
  char role[16];
  r->master = start_master(r, flag, port, r->addr, role);
  if (r->etcd[0] && strcmp(role, "leader") != 0)
    fail_msg("store-master %s started as \"%s\", not the leader", r->addr, role);
}

/* An owner process on the rig's directory (a capacity in bytes, or NULL). */
static void rig_start_owner(rig *r, const char *capacity) {
  char line[256];
  const char *args[] = {r->target, r->dir, capacity, NULL};
  r->owner = test_child_start("owner", args, &r->to, &r->from);
  assert_true(r->owner > 0);
  if (test_read_line(r->from, line, sizeof line, TEST_SETUP_MS) != 0 ||
      sscanf(line, "ready %127s", r->segment) != 1)
    fail_msg("the owner did not start");
}

/* The master, the owner and the reader; with etcd ("127.0.0.1:PORT", or
 * NULL) the master leads an HA cluster and the clients find it there. */
static void rig_open_on(rig *r, const char *etcd, const char *flag, const char *capacity) {
  memset(r, 0, sizeof *r);
  snprintf(r->etcd, sizeof r->etcd, "%s", etcd ? etcd : "");
  snprintf(r->tmp, sizeof r->tmp, "/tmp/ferry-offload-XXXXXX");
  assert_non_null(mkdtemp(r->tmp));
  snprintf(r->dir, sizeof r->dir, "%s/ssd", r->tmp);
  assert_int_equal(mkdir(r->dir, 0755), 0);
  rig_start_master(r, flag, "0");
  snprintf(r->target, sizeof r->target, "%s%s", etcd ? "etcd://" : "", etcd ? etcd : r->addr);
  rig_start_owner(r, capacity);
  r->engine = engine_on_loopback();
  assert_non_null(r->engine);
  if (open_store(r->engine, r->target, 0, NULL, &r->reader) != FERRY_OK)
    fail_msg("reader: %s", ferry_last_error());
  assert_int_equal(ferry_memory_alloc(r->engine, 1 * MiB, (void **)&r->buf), FERRY_OK);
}

static void rig_open_capped(rig *r, const char *flag, const char *capacity) {
  rig_open_on(r, NULL, flag, capacity);
}

static void rig_open(rig *r, const char *flag) { rig_open_capped(r, flag, NULL); }

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)st;
  (void)type;
  (void)ftw;
  return remove(path);
}

static void rig_close(rig *r) {
  if (r->owner > 0) {
    close(r->to);
    int status = -1;
    assert_int_equal(test_wait_exit(r->owner, TEST_SETUP_MS, &status), 0);
    close(r->from);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ferry_memory_free(r->engine, r->buf);
  ferry_store_close(r->reader);
  ferry_engine_destroy(r->engine);
  test_stop_expect_clean_exit(r->master, "store-master");
  nftw(r->tmp, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static void owner_kill(rig *r) {
  test_kill_and_reap(r->owner, TEST_SETUP_MS);
  close(r->to);
  close(r->from);
  r->owner = -1;
}

/* The owner's answer to one put. */
static void owner_put(rig *r, const char *key, unsigned seed, char *line, size_t size) {
  char cmd[128];
  int n = snprintf(cmd, sizeof cmd, "put %s %llu %u\n", key, (unsigned long long)VALUE, seed);
  assert_int_equal(write(r->to, cmd, (size_t)n), n);
  if (test_read_line(r->from, line, size, TEST_SETUP_MS) != 0)
    fail_msg("the owner did not answer %s", cmd);
}

static void owner_put_ok(rig *r, const char *key, unsigned seed) {
  char line[1024];
  owner_put(r, key, seed, line, sizeof line);
  if (strcmp(line, "ok") != 0)
    fail_msg("owner: put %s -> %s", key, line);
}

/* A put that needs the room of an object being written to disk may be
 * refused meanwhile ("the store is full ... being written to their owner's
 * disk first"), or of one a get loaded back, until the get's lease (1 ms)
 * ended; the next one fits once it is. TEST_SETUP_MS at most. */
static void owner_put_room(rig *r, const char *key, unsigned seed) {
  char line[1024];
  double until = test_now_s() + TEST_SETUP_MS / 1000.0;
  for (owner_put(r, key, seed, line, sizeof line); strcmp(line, "ok");
       owner_put(r, key, seed, line, sizeof line))
    if ((!strstr(line, "being written to their owner's disk first") &&
         !strstr(line, "left: 1 object(s) under a get's lease")) ||
        test_now_s() > until)
      fail_msg("owner: put %s -> %s", key, line);
}

static int file_exists(const rig *r, const char *key) {
  char path[STORE_DISK_PATH_MAX];
  assert_int_equal(store_disk_path(r->dir, key, strlen(key), path), 0);
  return access(path, F_OK) == 0;
}

/* Waits (TEST_SETUP_MS at most) until key's file is there, or gone. */
static void await_file(const rig *r, const char *key, int there) {
  double until = test_now_s() + TEST_SETUP_MS / 1000.0;
  while (file_exists(r, key) != there)
    if (test_now_s() > until)
      fail_msg("the file of %s is %s after %d ms", key, there ? "not there" : "still there",
               TEST_SETUP_MS);
}

static int files_in(const char *dir) {
  DIR *dp = opendir(dir);
  assert_non_null(dp);
  int n = 0;
  for (struct dirent *e; (e = readdir(dp)) != NULL;)
    n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(dp);
  return n;
}

/* The reader's get of key: status, every byte checked when it succeeds. */
static ferry_status reader_get(rig *r, const char *key, unsigned seed) {
  size_t got = 0;
  memset(r->buf, 0, VALUE);
  ferry_status st = ferry_store_get_into(r->reader, key, r->buf, 1 * MiB, &got);
  if (st == FERRY_OK) {
    assert_int_equal(got, VALUE);
    long at = mismatch(r->buf, VALUE, seed);
    if (at >= 0)
      fail_msg("get %s: byte %ld differs", key, at);
  }
  return st;
}

static void reader_get_ok(rig *r, const char *key, unsigned seed) {
  if (reader_get(r, key, seed) != FERRY_OK)
    fail_msg("get %s: %s", key, ferry_last_error());
}

/* The reader's get of key until it succeeds (TEST_SETUP_MS at most: the
 * clients find a restarted master, or a new leader, at their next call or
 * PING). */
static void reader_get_eventually(rig *r, const char *key, unsigned seed) {
  double until = test_now_s() + TEST_SETUP_MS / 1000.0;
  while (reader_get(r, key, seed) != FERRY_OK)
    if (test_now_s() > until)
      fail_msg("get %s after the master's restart or failover: %s", key, ferry_last_error());
}

/* ---- cases -------------------------------------------------------------------------------------
 */

/* Eager: every put gets its file; an evicted object stays in the store and
 * every get form reads its exact bytes, loaded back by its owner; a remove
 * deletes its file; a get answered with a loaded copy is counted
 * (ferry_store_owner_disk_reads, Mooncake's get_offload_rpc_read_count).
 * Red without the LOCAL_DISK replica kept at eviction (the key is gone),
 * without the load (the get times out), and when the master flags no load
 * (the count stays 0). */
static void eager_offload_keeps_evicted_objects(void **state) {
  (void)state;
  rig r;
  rig_open(&r, "--offload_on_evict=false");
  owner_put_ok(&r, "k1", 1);
  await_file(&r, "k1", 1);
  owner_put_room(&r, "k2", 2); /* k1 does not fit beside it: evicted, kept on disk */
  await_file(&r, "k2", 1);
  assert_int_equal(ferry_store_exists(r.reader, "k1"), FERRY_OK);
  assert_int_equal(ferry_store_owner_disk_reads(r.reader), 0);
  reader_get_ok(&r, "k1", 1); /* loaded back, k2 evicted to its file for it */
  assert_int_equal(ferry_store_owner_disk_reads(r.reader), 1); /* counted */
  reader_get_ok(&r, "k2", 2);
  reader_get_ok(&r, "k1", 1);
  void *copy = NULL; /* the staged form too */
  size_t len = 0;
  assert_int_equal(ferry_store_get(r.reader, "k2", &copy, &len), FERRY_OK);
  assert_int_equal(len, VALUE);
  assert_int_equal(mismatch(copy, len, 2), -1);
  free(copy);
  assert_int_equal(ferry_store_remove(r.reader, "k2"), FERRY_OK);
  await_file(&r, "k2", 0);
  assert_int_equal(ferry_store_exists(r.reader, "k2"), FERRY_ENOTFOUND);
  uint64_t removed = 0;
  assert_int_equal(ferry_store_remove_all(r.reader, &removed), FERRY_OK);
  assert_int_equal(removed, 1);
  await_file(&r, "k1", 0);
  assert_int_equal(files_in(r.dir), 0);
  rig_close(&r);
}

/* --offload_on_evict: nothing is written until eviction chooses an object;
 * then its memory goes once its file is written. A put that needs the room
 * meanwhile may be refused (the store is full), the next one fits; a get
 * that needs room waits for it. Whether k2 was written is asked only once
 * the owner deleted k1's file: a task queued after any for k2 (an owner
 * does its tasks in order). Red when commits queue offloads. */
static void offload_on_evict_writes_only_what_eviction_chooses(void **state) {
  (void)state;
  rig r;
  rig_open(&r, "--offload_on_evict");
  owner_put_ok(&r, "k1", 1);
  owner_put_room(&r, "k2", 2); /* k1 chosen: written, then its memory goes */
  assert_true(file_exists(&r, "k1"));
  assert_int_equal(ferry_store_remove(r.reader, "k1"), FERRY_OK);
  await_file(&r, "k1", 0);
  assert_false(file_exists(&r, "k2")); /* nothing chose k2 */
  owner_put_room(&r, "k3", 3);         /* k2 chosen now */
  assert_true(file_exists(&r, "k2"));
  reader_get_ok(&r, "k2", 2); /* waits while k3 is written out for the room */
  assert_true(file_exists(&r, "k3"));
  reader_get_ok(&r, "k3", 3);
  rig_close(&r);
}

/* The owner's death takes its disk copies: a get then says "not found" at
 * once; a stalled owner fails the get within the wait, naming why. Red
 * without the drop of the owner's LOCAL_DISK copies (the get times out, or
 * worse). */
static void an_owners_death_drops_its_disk_copies(void **state) {
  (void)state;
  rig r;
  rig_open(&r, "--offload_on_evict=false");
  owner_put_ok(&r, "k1", 1);
  await_file(&r, "k1", 1);
  owner_put_room(&r, "k2", 2);
  await_file(&r, "k2", 1);
  assert_int_equal(ferry_store_exists(r.reader, "k1"), FERRY_OK); /* on disk only */
  kill(r.owner, SIGSTOP);
  int status;
  assert_int_equal(waitpid(r.owner, &status, WUNTRACED), r.owner);
  double t0 = test_now_s();
  assert_int_equal(reader_get(&r, "k1", 1), FERRY_ETIMEDOUT);
  assert_non_null(strstr(ferry_last_error(), "did not load it back"));
  assert_true(test_now_s() - t0 < 2.0); /* the wait: a PING interval, 500 ms */
  owner_kill(&r);
  t0 = test_now_s();
  assert_int_equal(reader_get(&r, "k1", 1), FERRY_ENOTFOUND);
  assert_int_equal(reader_get(&r, "k2", 2), FERRY_ENOTFOUND);
  assert_true(test_now_s() - t0 < 2.0);
  rig_close(&r);
}

/* OFFLOAD_POLL on a connection of its own, as a peer that knows the
 * segment's name but not its nonce: refused, no task handed out. Red
 * without the nonce check (the poll is served). */
static void a_peer_without_the_segments_nonce_gets_no_tasks(void **state) {
  (void)state;
  rig r;
  rig_open(&r, "--offload_on_evict=false");
  owner_put_ok(&r, "k1", 1);
  await_file(&r, "k1", 1);
  char host[FERRY_HOST_MAX];
  uint16_t port;
  int fd;
  assert_int_equal(ferry_net_parse_target(r.addr, host, &port), FERRY_OK);
  assert_int_equal(ferry_net_connect(host, port, ferry_now_ns() + TEST_SETUP_MS * 1000000ull, &fd),
                   FERRY_OK);
  ferry_sock sock;
  ferry_session session;
  ferry_sock_init(&sock, fd, r.addr);
  store_identity self = {ferry_random_u64(), "raw", NULL};
  uint64_t master_id;
  assert_int_equal(store_handshake_connect(&sock, &session, &self, &master_id), FERRY_OK);
  store_writer w = {0};
  store_put_u8(&w, STORE_REGISTER);
  store_put_u16(&w, STORE_PROTOCOL_VERSION);
  store_put_u64(&w, 0);
  store_put_u64(&w, 0);
  store_put_str(&w, "", 0);
  store_put_u64(&w, 0);
  ferry_frame_header h;
  uint8_t *body;
  assert_int_equal(store_send(&sock, FERRY_FRAME_STORE, 0, 0, &w, "raw"), FERRY_OK);
  assert_int_equal(store_recv(&sock, &h, &body, "raw"), FERRY_OK);
  assert_int_equal(h.status, 0);
  free(body);
  for (uint64_t nonce = 0; nonce < 2; nonce++) { /* none, and a guess */
    store_writer p = {0};
    store_put_u8(&p, STORE_OFFLOAD_POLL);
    store_put_str(&p, r.segment, strlen(r.segment));
    store_put_u64(&p, nonce ? ferry_random_u64() : 0);
    store_put_u32(&p, 0);
    store_put_u32(&p, 64);
    assert_int_equal(store_send(&sock, FERRY_FRAME_STORE, 0, 0, &p, "raw"), FERRY_OK);
    assert_int_equal(store_recv(&sock, &h, &body, "raw"), FERRY_OK);
    if (h.status != FERRY_EAUTH)
      fail_msg("a poll with a wrong nonce answered %d (%.*s)", h.status, (int)h.body_len,
               (const char *)body);
    assert_non_null(memmem(body, h.body_len, "nonce", 5));
    free(body);
  }
  close(fd);
  reader_get_ok(&r, "k1", 1); /* the owner served throughout */
  rig_close(&r);
}

/* Behind the shared secret (FERRY_SECRET for the master, the owner and the
 * reader): the owner's second connection proves it too and an evicted
 * object reads back; a peer without the secret cannot even say HELLO to
 * the master, so it reaches no task. Red when the offload connection does
 * not carry the secret (the owner fails to open). */
static void offload_works_behind_the_secret(void **state) {
  (void)state;
  setenv("FERRY_SECRET", "offload-secret", 1);
  rig r;
  rig_open(&r, "--offload_on_evict=false");
  owner_put_ok(&r, "k1", 1);
  await_file(&r, "k1", 1);
  owner_put_room(&r, "k2", 2);
  reader_get_ok(&r, "k1", 1);
  char host[FERRY_HOST_MAX];
  uint16_t port;
  int fd;
  assert_int_equal(ferry_net_parse_target(r.addr, host, &port), FERRY_OK);
  assert_int_equal(ferry_net_connect(host, port, ferry_now_ns() + TEST_SETUP_MS * 1000000ull, &fd),
                   FERRY_OK);
  ferry_sock sock;
  ferry_session session;
  ferry_sock_init(&sock, fd, r.addr);
  store_identity none = {ferry_random_u64(), "raw", NULL};
  uint64_t master_id;
  assert_int_not_equal(store_handshake_connect(&sock, &session, &none, &master_id), FERRY_OK);
  close(fd);
  rig_close(&r);
  unsetenv("FERRY_SECRET");
}

/* An offload directory that cannot be used fails open, naming the path and
 * the cause; so does offloading against a master without the flag. Red
 * without the checks. */
static void unusable_offload_setups_are_refused(void **state) {
  (void)state;
  char tmp[64] = "/tmp/ferry-offload-XXXXXX", file[96];
  assert_non_null(mkdtemp(tmp));
  snprintf(file, sizeof file, "%s/a-file", tmp);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  store_master_config mc = {.enable_offload = 1};
  store_master *m;
  assert_int_equal(store_master_start(&mc, &m), FERRY_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", store_master_port(m));
  ferry_engine *e = engine_on_loopback();
  ferry_store *s = NULL;
  assert_int_equal(open_store(e, addr, OWNER_SEGMENT, "/nonexistent/ssd", &s), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "/nonexistent/ssd cannot be resolved"));
  assert_non_null(strstr(ferry_last_error(), "No such file or directory"));
  assert_int_equal(open_store(e, addr, OWNER_SEGMENT, file, &s), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "is not a directory"));
  if (geteuid() != 0) { /* root writes anywhere */
    assert_int_equal(chmod(tmp, 0555), 0);
    assert_int_equal(open_store(e, addr, OWNER_SEGMENT, tmp, &s), FERRY_EINVAL);
    assert_non_null(strstr(ferry_last_error(), "is not writable"));
    chmod(tmp, 0755);
  }
  assert_int_equal(open_store(e, addr, 0, tmp, &s), FERRY_EINVAL); /* nothing to offload */
  assert_non_null(strstr(ferry_last_error(), "without a segment"));
  store_master_stop(m);
  store_master_config plain = {0};
  assert_int_equal(store_master_start(&plain, &m), FERRY_OK);
  snprintf(addr, sizeof addr, "127.0.0.1:%u", store_master_port(m));
  assert_int_equal(open_store(e, addr, OWNER_SEGMENT, tmp, &s), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "without --enable_offload"));
  store_master_stop(m);
  ferry_engine_destroy(e);
  remove(file);
  rmdir(tmp);
}

/* Mooncake's run_tests.sh starts its master with --root_fs_dir beside
 * --enable_offload: the master starts, the owners' disks are the SSD
 * tier, and the directory gets nothing (no second tier of files whose
 * puts would write each value twice). Red when the pair is refused, and
 * when the master also takes the directory as its own tier. */
static void root_fs_dir_beside_offload_stays_unwritten(void **state) {
  (void)state;
  char fs[64] = "/tmp/ferry-fsdir-XXXXXX", flag[96];
  assert_non_null(mkdtemp(fs));
  snprintf(flag, sizeof flag, "--root_fs_dir=%s", fs);
  rig r;
  rig_open(&r, flag);
  owner_put_ok(&r, "k1", 1);
  await_file(&r, "k1", 1);
  reader_get_ok(&r, "k1", 1);
  assert_int_equal(files_in(fs), 0);
  rig_close(&r);
  assert_int_equal(rmdir(fs), 0);
}

/* MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES: a directory that holds one
 * file. k2's offload drops k1's file, the oldest, first telling the master:
 * k1, on disk only, leaves the store. Red without the capacity (k1's file
 * stays). */
static void a_full_offload_directory_drops_its_oldest_files(void **state) {
  (void)state;
  rig r;
  char capacity[32];
  snprintf(capacity, sizeof capacity, "%zu", store_disk_file_size(2, VALUE) * 3 / 2);
  rig_open_capped(&r, "--offload_on_evict=false", capacity);
  owner_put_ok(&r, "k1", 1);
  await_file(&r, "k1", 1);
  owner_put_room(&r, "k2", 2); /* k1 evicted to its file, which k2's must replace */
  await_file(&r, "k1", 0);
  await_file(&r, "k2", 1);
  assert_int_equal(ferry_store_exists(r.reader, "k1"), FERRY_ENOTFOUND);
  assert_int_equal(files_in(r.dir), 1);
  reader_get_ok(&r, "k2", 2);
  rig_close(&r);
}

/* A master killed and restarted on its port mid-workload: the owner tells
 * the new one the files it holds when it rejoins, and every offloaded
 * object reads back byte-exact from the reader (a client of its own, with
 * no segment: loaded back by the owner); a put after the restart is
 * offloaded as before. A new owner process on the same directory tells
 * the files its dead predecessor left at open: they read back too. Red
 * without the report (the owner's files unknown: "not in the store" until
 * the bound). */
static void a_restarted_master_takes_the_owners_files_back(void **state) {
  (void)state;
  rig r;
  rig_open(&r, "--offload_on_evict=false");
  owner_put_ok(&r, "k1", 1);
  await_file(&r, "k1", 1);
  owner_put_room(&r, "k2", 2); /* k1 on disk only, k2 in memory and on disk */
  await_file(&r, "k2", 1);
  char port[16];
  const char *colon = strrchr(r.addr, ':');
  assert_non_null(colon);
  snprintf(port, sizeof port, "%s", colon + 1);
  test_kill_and_reap(r.master, TEST_SETUP_MS);
  rig_start_master(&r, "--offload_on_evict=false", port);
  reader_get_eventually(&r, "k1", 1);
  reader_get_ok(&r, "k2", 2);
  reader_get_ok(&r, "k1", 1);
  owner_put_room(&r, "k3", 3); /* offloaded as before */
  await_file(&r, "k3", 1);
  reader_get_ok(&r, "k3", 3);
  reader_get_ok(&r, "k2", 2);
  assert_int_equal(ferry_store_remove(r.reader, "k1"), FERRY_OK); /* the new master deletes it */
  await_file(&r, "k1", 0);
  /* The owner's death drops its copies; a new process of it on the same
   * directory tells them at open, and they read back. */
  owner_kill(&r);
  double until = test_now_s() + TEST_SETUP_MS / 1000.0; /* once the master saw it go */
  while (ferry_store_exists(r.reader, "k2") != FERRY_ENOTFOUND)
    if (test_now_s() > until)
      fail_msg("k2 is still in the store after its owner died");
  rig_start_owner(&r, NULL);
  reader_get_ok(&r, "k2", 2);
  reader_get_ok(&r, "k3", 3);
  rig_close(&r);
}

/* HA (docs/store.md "Client-owned SSD offload", HA): two masters with
 * --enable_offload elect a leader through etcd; the owner and the reader
 * follow it (etcd://). k2 and k3 are on the owner's disk only, k4 in
 * memory with its file, k1 removed; the leader is killed (-9) and the
 * owner's next put fails until the standby leads, then succeeds there,
 * evicting k4 to its file. Every object then reads back byte-exact through
 * the new leader, twice around: each get has the owner load a value into
 * its 1 MiB segment, evicting the one read before it, so each must keep its
 * disk copy across the failover; k1 stays removed. Red when the new leader
 * forgets the disk copies (k2 "not in the store"), and when it forgets that
 * the owner offloads (k5, put before the owner polled it, is lost). */
static void offloaded_objects_outlive_their_leader(void **state) {
  (void)state;
  if (!test_store_available(1))
    skip();
  test_store etcd;
  assert_int_equal(test_etcd_start(&etcd, 1), 0);
  char members[64], standby_addr[64], role[16];
  snprintf(members, sizeof members, "127.0.0.1:%u", etcd.port[0]);
  rig r;
  rig_open_on(&r, members, "--offload_on_evict=false", NULL);
  pid_t standby = start_master(&r, "--offload_on_evict=false", "0", standby_addr, role);
  assert_string_equal(role, "standby");
  owner_put_ok(&r, "k1", 1);
  await_file(&r, "k1", 1);
  for (unsigned k = 2; k <= 4; k++) { /* each evicts the one before to its file */
    char key[8];
    snprintf(key, sizeof key, "k%u", k);
    owner_put_room(&r, key, k);
    await_file(&r, key, 1);
  }
  /* k4's file is written; the master knows it once the owner reported it,
   * before the owner's next poll, which hands out k1's DELETE. */
  assert_int_equal(ferry_store_remove(r.reader, "k1"), FERRY_OK);
  await_file(&r, "k1", 0);
  test_kill_and_reap(r.master, TEST_SETUP_MS);
  r.master = standby;
  char line[1024];
  int failed = 0;
  double killed = test_now_s();
  for (owner_put(&r, "k5", 5, line, sizeof line); strcmp(line, "ok");
       owner_put(&r, "k5", 5, line, sizeof line)) { /* retried only until a leader serves */
    failed++;
    if (test_now_s() > killed + TEST_SETUP_MS / 1000.0)
      fail_msg("no put succeeded %d ms after the leader's kill: %s", TEST_SETUP_MS, line);
    poll(NULL, 0, 20);
  }
  print_message("failover: the owner's put succeeded at the new leader %.2f s after the kill "
                "(%d puts failed meanwhile)\n",
                test_now_s() - killed, failed);
  assert_true(failed > 0); /* the kill happened mid-workload, and was noticed */
  await_file(&r, "k5", 1); /* offloaded by the new leader: evicted from here on, it stays */
  for (int round = 0; round < 2; round++)
    for (unsigned k = 2; k <= 5; k++) {
      char key[8];
      snprintf(key, sizeof key, "k%u", k);
      reader_get_ok(&r, key, k);
    }
  assert_int_equal(reader_get(&r, "k1", 1), FERRY_ENOTFOUND);
  rig_close(&r);
  test_store_stop(&etcd);
}

int main(int argc, char **argv) {
  const test_child_role roles[] = {{"owner", owner_role}};
  test_child_main(argc, argv, roles, sizeof roles / sizeof *roles);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(eager_offload_keeps_evicted_objects),
      cmocka_unit_test(offload_on_evict_writes_only_what_eviction_chooses),
      cmocka_unit_test(a_restarted_master_takes_the_owners_files_back),
      cmocka_unit_test(offloaded_objects_outlive_their_leader),
      cmocka_unit_test(an_owners_death_drops_its_disk_copies),
      cmocka_unit_test(a_peer_without_the_segments_nonce_gets_no_tasks),
      cmocka_unit_test(offload_works_behind_the_secret),
      cmocka_unit_test(unusable_offload_setups_are_refused),
      cmocka_unit_test(root_fs_dir_beside_offload_stays_unwritten),
      cmocka_unit_test(a_full_offload_directory_drops_its_oldest_files),
  };
  const char *only = getenv("FERRY_TEST_FILTER");
  if (only && *only)
    cmocka_set_test_filter(only);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
