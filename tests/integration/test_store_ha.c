/* test_store_ha.c - the store master's high availability (docs/store.md
 * "High availability", RELIABILITY.md 22): masters started with
 * --enable_ha elect a leader through a real etcd on loopback (Debian's
 * etcd; the cases skip when it is missing), a client given
 * etcd://HOST:PORT follows the leader across a kill -9, a standby serves
 * nobody, and a leader stalled past its lease serves nothing when it wakes.
 *
 * Each case runs its masters under a cluster id of its own (their leader
 * key), so a killed leader's key, left to expire, touches no other case.
 * Where the case waits for the election (a lease to run out), it polls the
 * leader key with a generous bound and asserts what it then sees. */
#include <poll.h>
#include <signal.h>
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
#include "base/error.h"
#include "ferry.h"
#include "harness.h"
#include "metadata/metadata.h"
#include "net/auth.h"
#include "net/net.h"
#include "store/client.h"
#include "store/handshake.h"
#include "store/protocol.h"
#include "stores.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define VALUE (16 * KiB)
#define LEASE_S "2"       /* the leaders' etcd lease: etcd's own minimum */
#define FAILOVER_MS 30000 /* generous: a lease of 2 s runs out well before */

static test_store etcd;
static int have_etcd;
static char etcd_members[64]; /* "127.0.0.1:PORT" */
static char client_url[80];   /* "etcd://127.0.0.1:PORT" */

static int etcd_setup(void **state) {
  (void)state;
  if (!test_store_available(1))
    return 0;
  if (test_etcd_start(&etcd, 1) != 0)
    return -1;
  have_etcd = 1;
  snprintf(etcd_members, sizeof etcd_members, "127.0.0.1:%u", etcd.port[0]);
  snprintf(client_url, sizeof client_url, "etcd://%s", etcd_members);
  return 0;
}

static int etcd_teardown(void **state) {
  (void)state;
  if (have_etcd)
    test_store_stop(&etcd);
  return 0;
}

/* ---- masters and the leader key ------------------------------------------------------------- */

typedef struct master_proc {
  pid_t pid;
  char addr[64];
  char role[16]; /* "leader" or "standby", from its ready line */
} master_proc;

/* The cluster (the leader key mooncake-store/ID/master_view) of this case,
 * for its masters and its clients (MC_STORE_CLUSTER_ID). */
static void use_cluster(const char *id) {
  if (!have_etcd)
    skip();
  setenv("MC_STORE_CLUSTER_ID", id, 1);
}

static void master_start_with(master_proc *m, const char *expect_role, const char *lease) {
  char connstring[96], cluster[96], ttl[48];
  snprintf(ttl, sizeof ttl, "--ha_lease_ttl=%s", lease);
  snprintf(connstring, sizeof connstring, "--ha_backend_connstring=%s", etcd_members);
  snprintf(cluster, sizeof cluster, "--cluster_id=%s", getenv("MC_STORE_CLUSTER_ID"));
  const char *argv[] = {test_tool_path(),
                        "store-master",
                        "--port=0",
                        "--enable_ha",
                        "--ha_backend_type=etcd",
                        connstring,
                        ttl,
                        cluster,
                        NULL};
  char line[256];
  m->pid = test_tool_start(argv, line, sizeof line);
  if (m->pid <= 0 || sscanf(line, "ready master=%63s %15s", m->addr, m->role) != 2)
    fail_msg("store-master --enable_ha did not start (line \"%s\")", m->pid > 0 ? line : "");
  if (strcmp(m->role, expect_role) != 0)
    fail_msg("store-master %s started as %s, not %s", m->addr, m->role, expect_role);
}

static void master_start(master_proc *m, const char *expect_role) {
  master_start_with(m, expect_role, LEASE_S);
}

/* SIGTERM: it resigns and exits 0 (under ASan, after its leak check). */
static void master_stop(master_proc *m) { test_stop_expect_clean_exit(m->pid, "store-master"); }

/* The address the leader key names ("" when none leads). */
static void leader_now(char *addr, size_t size) {
  char key[160];
  snprintf(key, sizeof key, "mooncake-store/%s/master_view", getenv("MC_STORE_CLUSTER_ID"));
  ferry_metadata *md = NULL;
  char *value = NULL;
  addr[0] = '\0';
  if (ferry_metadata_open(client_url, &md) == FERRY_OK && ferry_metadata_get(md, key, &value) == 0)
    snprintf(addr, size, "%s", value);
  free(value);
  ferry_metadata_close(md);
}

/* Polls the leader key until it names addr (the standby took over). */
static void wait_for_leader(const char *addr) {
  char now[64] = "";
  for (double end = test_now_s() + FAILOVER_MS / 1000.0; test_now_s() < end; poll(NULL, 0, 50)) {
    leader_now(now, sizeof now);
    if (!strcmp(now, addr))
      return;
  }
  fail_msg("after %d ms the leader key names \"%s\", not the standby %s", FAILOVER_MS, now, addr);
}

/* ---- clients -------------------------------------------------------------------------------- */

typedef struct client {
  ferry_engine *engine;
  ferry_store *store;
} client;

static ferry_status client_open(client *c, const char *master) {
  ferry_config cfg;
  test_config(&cfg);
  c->engine = test_engine_create(&cfg);
  ferry_store_config sc;
  ferry_store_config_init(&sc);
  sc.master = master;
  sc.segment_size = 8 * MiB;
  sc.local_buffer_size = 1 * MiB;
  sc.timeout_ms = 5000;
  c->store = NULL;
  return ferry_store_open(c->engine, &sc, &c->store);
}

static void client_close(client *c) {
  ferry_store_close(c->store);
  ferry_engine_destroy(c->engine);
}

static void value_of(int i, uint8_t *buf) { test_fill_random(buf, VALUE, 0x4a00 + (uint64_t)i); }

static void key_of(int i, char *key, size_t size) { snprintf(key, size, "ha-key-%d", i); }

/* Reads key i (through the client's staging buffer) and checks every byte. */
static void check_value(ferry_store *s, int i) {
  char key[32];
  key_of(i, key, sizeof key);
  static uint8_t want[VALUE];
  void *got = NULL;
  size_t len = 0;
  value_of(i, want);
  if (ferry_store_get(s, key, &got, &len) != FERRY_OK)
    fail_msg("get %s: %s", key, ferry_last_error());
  assert_int_equal(len, VALUE);
  assert_memory_equal(got, want, VALUE);
  free(got);
}

static ferry_status put_value(ferry_store *s, int i) {
  char key[32];
  key_of(i, key, sizeof key);
  static uint8_t buf[VALUE];
  value_of(i, buf);
  return ferry_store_put(s, key, buf, VALUE, NULL);
}

/* A leader, a standby and a client that follows the leader (etcd://). */
static void leader_standby_client(const char *cluster, master_proc *a, master_proc *b, client *c) {
  use_cluster(cluster);
  master_start(a, "leader");
  master_start(b, "standby");
  if (client_open(c, client_url) != FERRY_OK)
    fail_msg("ferry_store_open(%s): %s", client_url, ferry_last_error());
}

/* ---- cases ---------------------------------------------------------------------------------- */

/* A client putting and getting in a loop; the leader is killed (-9) in the
 * middle. Calls fail while no master leads (each says why), the client
 * finds the new leader by itself, and every later call succeeds. Nothing
 * committed is lost: the new leader restores the map from the journal in
 * etcd, so every key put before the kill reads back byte-exact. */
static void a_client_follows_a_failover_mid_workload(void **state) {
  (void)state;
  master_proc a, b;
  client c;
  leader_standby_client("ha-failover", &a, &b, &c);
  enum { BEFORE = 20, AFTER = 40 };
  for (int i = 0; i < BEFORE; i++) {
    if (put_value(c.store, i) != FERRY_OK)
      fail_msg("put %d at the first leader: %s", i, ferry_last_error());
    check_value(c.store, i);
  }
  test_kill_and_reap(a.pid, TEST_SETUP_MS);
  double killed = test_now_s(), back = 0;
  int failed = 0;
  for (int i = BEFORE; i < BEFORE + AFTER; i++) {
    ferry_status st;
    while ((st = put_value(c.store, i)) != FERRY_OK) { /* retried only until a leader serves */
      failed++;
      if (test_now_s() > killed + FAILOVER_MS / 1000.0)
        fail_msg("no put succeeded %d ms after the leader's kill: %s", FAILOVER_MS,
                 ferry_last_error());
      poll(NULL, 0, 20);
    }
    if (!back)
      back = test_now_s();
    check_value(c.store, i);
  }
  print_message("failover: the first put succeeded %.2f s after the leader's kill (%d calls "
                "failed meanwhile)\n",
                back - killed, failed);
  assert_true(failed > 0); /* the kill happened mid-workload, and was noticed */
  char leader[64];
  leader_now(leader, sizeof leader);
  assert_string_equal(leader, b.addr);
  for (int i = BEFORE; i < BEFORE + AFTER; i++)
    check_value(c.store, i);
  for (int i = 0; i < BEFORE; i++) /* committed at the dead leader: kept */
    check_value(c.store, i);
  client_close(&c);
  master_stop(&b);
}

/* A batch's commits are journaled in one etcd transaction per 128 keys (not
 * one write per key): 200 keys put in one call, then the leader is killed;
 * the new leader restored every one (two transactions, the second partly
 * full), and each reads back byte-exact. */
static void a_batch_commit_outlives_its_leader(void **state) {
  (void)state;
  master_proc a, b;
  client c;
  leader_standby_client("ha-batch", &a, &b, &c);
  enum { KEYS = 200 };
  static uint8_t values[KEYS][VALUE];
  static char keys[KEYS][32];
  ferry_store_item items[KEYS];
  for (int i = 0; i < KEYS; i++) {
    key_of(i, keys[i], sizeof keys[i]);
    value_of(i, values[i]);
    items[i] = (ferry_store_item){.key = keys[i], .buf = values[i], .length = VALUE};
  }
  if (ferry_store_put_batch(c.store, items, KEYS, NULL) != FERRY_OK)
    fail_msg("put of %d keys: %s", KEYS, ferry_last_error());
  test_kill_and_reap(a.pid, TEST_SETUP_MS);
  wait_for_leader(b.addr);
  double end = test_now_s() + FAILOVER_MS / 1000.0;
  ferry_status st;
  while ((st = ferry_store_exists(c.store, keys[0])) != FERRY_OK && st != FERRY_ENOTFOUND &&
         test_now_s() < end)
    poll(NULL, 0, 20); /* the calls that fail on the dead leader's connection, then reconnect */
  for (int i = 0; i < KEYS; i++)
    check_value(c.store, i);
  client_close(&c);
  master_stop(&b);
}

/* An upsert committed at a leader outlives it: its commit replaced the
 * key's record in the journal (the old value's record is not erased with
 * the old value), so after the leader's kill the new leader serves the new
 * value, its size too. */
static void an_upsert_outlives_its_leader(void **state) {
  (void)state;
  master_proc a, b;
  client c;
  leader_standby_client("ha-upsert", &a, &b, &c);
  assert_int_equal(put_value(c.store, 0), FERRY_OK);
  static uint8_t fresh[VALUE / 2];
  test_fill_random(fresh, sizeof fresh, 0x5b00);
  if (ferry_store_upsert(c.store, "ha-key-0", fresh, sizeof fresh, NULL) != FERRY_OK)
    fail_msg("upsert: %s", ferry_last_error());
  test_kill_and_reap(a.pid, TEST_SETUP_MS);
  wait_for_leader(b.addr);
  void *got = NULL;
  size_t len = 0;
  ferry_status st;
  double end = test_now_s() + FAILOVER_MS / 1000.0;
  /* Retried while the client finds the new leader; not past an answer. */
  while ((st = ferry_store_get(c.store, "ha-key-0", &got, &len)) != FERRY_OK &&
         st != FERRY_ENOTFOUND && test_now_s() < end)
    poll(NULL, 0, 20);
  if (st != FERRY_OK)
    fail_msg("get after the failover: %s", ferry_last_error());
  assert_int_equal(len, sizeof fresh);
  assert_memory_equal(got, fresh, sizeof fresh);
  free(got);
  client_close(&c);
  master_stop(&b);
}

/* A standby serves nobody: a client that names it directly is refused at
 * its handshake, saying it is not the leader; the leader takes it. */
static void a_standby_serves_nobody(void **state) {
  (void)state;
  use_cluster("ha-standby");
  master_proc a, b;
  master_start(&a, "leader");
  master_start(&b, "standby");
  client c;
  assert_int_equal(client_open(&c, b.addr), FERRY_EBUSY);
  if (!strstr(ferry_last_error(), "not the leader"))
    fail_msg("refusal without its reason: %s", ferry_last_error());
  ferry_engine_destroy(c.engine);
  if (client_open(&c, a.addr) != FERRY_OK)
    fail_msg("ferry_store_open(%s): %s", a.addr, ferry_last_error());
  assert_int_equal(put_value(c.store, 1), FERRY_OK);
  check_value(c.store, 1);
  client_close(&c);
  master_stop(&b);
  master_stop(&a);
}

/* No split brain: a leader stopped (SIGSTOP) past its lease wakes to find
 * the standby leading. Its client, still connected to it, must not be
 * served by it any more, whichever comes first when it wakes: its fence
 * (the lease it last saw has ended) or its keep-alive (lease lost). Nor
 * may it touch the journal: its client's leaving drops that client's
 * segment from its map, and the journal writes that would erase the
 * segment and its objects are refused (they are made on the condition
 * that the writer still holds the lead). So when the new leader dies in
 * turn and the old one, a standby again, takes over, it restores them:
 * the object put before the stall still reads back. */
static void a_stalled_leader_serves_nothing_when_it_wakes(void **state) {
  (void)state;
  use_cluster("ha-stalled");
  master_proc a, b;
  master_start(&a, "leader");
  master_start(&b, "standby");
  client c;
  if (client_open(&c, a.addr) != FERRY_OK) /* directly: this client does not follow */
    fail_msg("ferry_store_open(%s): %s", a.addr, ferry_last_error());
  assert_int_equal(put_value(c.store, 1), FERRY_OK);
  kill(a.pid, SIGSTOP);
  wait_for_leader(b.addr);
  kill(a.pid, SIGCONT);
  ferry_status st = put_value(c.store, 2);
  if (st == FERRY_OK)
    fail_msg("the old leader %s served a put after the standby %s took over", a.addr, b.addr);
  print_message("the old leader refused: %s\n", ferry_last_error());
  client y; /* follows the leader */
  if (client_open(&y, client_url) != FERRY_OK)
    fail_msg("ferry_store_open(%s): %s", client_url, ferry_last_error());
  check_value(y.store, 1);
  test_kill_and_reap(b.pid, TEST_SETUP_MS);
  wait_for_leader(a.addr);
  char key[32];
  key_of(1, key, sizeof key);
  double end = test_now_s() + FAILOVER_MS / 1000.0;
  while (ferry_store_exists(y.store, key) != FERRY_OK && test_now_s() < end)
    poll(NULL, 0, 20); /* the calls that fail on B's dead connection, then reconnect */
  check_value(y.store, 1);
  client_close(&y);
  client_close(&c);
  master_stop(&a);
}

/* A leader stopped (SIGTERM) revokes its lease: the standby leads within
 * its poll, long before the lease (60 s here) would have run out. */
static void a_leader_that_stops_hands_over_at_once(void **state) {
  (void)state;
  use_cluster("ha-resign");
  master_proc a, b;
  master_start_with(&a, "leader", "60");
  master_start_with(&b, "standby", "60");
  double stopped = test_now_s();
  master_stop(&a);
  char now[64] = "";
  for (double end = stopped + 20; test_now_s() < end && strcmp(now, b.addr); poll(NULL, 0, 50))
    leader_now(now, sizeof now);
  if (strcmp(now, b.addr) != 0)
    fail_msg("20 s after the leader stopped the key names \"%s\", not the standby %s", now, b.addr);
  print_message("handover after SIGTERM: %.2f s (lease 60 s)\n", test_now_s() - stopped);
  client c;
  if (client_open(&c, client_url) != FERRY_OK)
    fail_msg("ferry_store_open(%s): %s", client_url, ferry_last_error());
  assert_int_equal(put_value(c.store, 3), FERRY_OK);
  check_value(c.store, 3);
  client_close(&c);
  master_stop(&b);
}

/* REGISTER of a segment by hand, as a restarted client sends it: name,
 * address and size of the segment, and the nonce of its memory. The
 * connection stays open (the master keeps the segment while it does);
 * returns its socket, or fails the case when refused. */
static int raw_register(const char *master, const char *name, uint64_t base, uint64_t size,
                        uint64_t nonce) {
  char host[FERRY_HOST_MAX];
  uint16_t port;
  int fd;
  assert_int_equal(ferry_net_parse_target(master, host, &port), FERRY_OK);
  assert_int_equal(ferry_net_connect(host, port, ferry_now_ns() + TEST_SETUP_MS * 1000000ull, &fd),
                   FERRY_OK);
  ferry_sock sock;
  ferry_session session;
  ferry_sock_init(&sock, fd, master);
  store_identity self = {ferry_random_u64(), "raw", NULL};
  uint64_t master_id;
  assert_int_equal(store_handshake_connect(&sock, &session, &self, &master_id), FERRY_OK);
  store_writer w = {0};
  store_put_u8(&w, STORE_REGISTER);
  store_put_u16(&w, STORE_PROTOCOL_VERSION);
  store_put_u64(&w, base);
  store_put_u64(&w, size);
  store_put_str(&w, name, strlen(name));
  store_put_u64(&w, nonce);
  ferry_frame_header h;
  uint8_t *body;
  assert_int_equal(store_send(&sock, FERRY_FRAME_STORE, 0, 0, &w, "REGISTER"), FERRY_OK);
  assert_int_equal(store_recv(&sock, &h, &body, "REGISTER reply"), FERRY_OK);
  if (h.status)
    fail_msg("REGISTER of %s refused: %.*s", name, (int)h.body_len, (const char *)body);
  free(body);
  return fd;
}

/* After a failover the new leader restores a client's segment from the
 * journal and keeps it for that client to register again. A process that
 * registers the same name, address and size (a client restarted on the
 * same port, whose allocator gave the same address) but whose memory is
 * another (its nonce differs) must not get the segment: the objects the
 * journal placed there are not in its memory. They are dropped, and it
 * mounts an empty segment. The client that put them talks to the first
 * leader directly, so it does not follow the failover by itself. */
static void a_restarted_client_does_not_adopt_a_segment_not_its_memory(void **state) {
  (void)state;
  use_cluster("ha-nonce");
  master_proc a, b;
  master_start(&a, "leader");
  master_start(&b, "standby");
  client c, y;
  if (client_open(&c, a.addr) != FERRY_OK)
    fail_msg("ferry_store_open(%s): %s", a.addr, ferry_last_error());
  assert_int_equal(put_value(c.store, 1), FERRY_OK); /* the only segment: c's */
  test_kill_and_reap(a.pid, TEST_SETUP_MS);
  wait_for_leader(b.addr);
  if (client_open(&y, client_url) != FERRY_OK) /* a segment of its own: put here below */
    fail_msg("ferry_store_open(%s): %s", client_url, ferry_last_error());
  char key[32];
  key_of(1, key, sizeof key);
  assert_int_equal(ferry_store_exists(y.store, key), FERRY_OK); /* restored, kept for c */

  uint64_t nonce = c.store->segment_nonce;
  int fd = raw_register(b.addr, ferry_store_segment(c.store), (uint64_t)(uintptr_t)c.store->segment,
                        c.store->segment_size, nonce + 1);
  ferry_status st = ferry_store_exists(y.store, key);
  if (st != FERRY_ENOTFOUND)
    fail_msg("%s is still stored (%d) after another memory registered its segment", key, (int)st);
  /* Mounted anew, empty: a put placed there works (its bytes land in c's
   * memory, at the address the raw REGISTER named). */
  ferry_store_replicate there;
  ferry_store_replicate_init(&there);
  there.preferred_segment = ferry_store_segment(c.store);
  static uint8_t buf[VALUE];
  value_of(3, buf);
  key_of(3, key, sizeof key);
  assert_int_equal(ferry_store_put(y.store, key, buf, VALUE, &there), FERRY_OK);
  check_value(y.store, 3);
  close(fd);
  client_close(&c);
  client_close(&y);
  master_stop(&b);
}

/* etcd's count of key reads so far (etcd_mvcc_range_total on its
 * /metrics), by a plain HTTP/1.0 GET. */
static double etcd_reads(void) {
  int fd;
  assert_int_equal(ferry_net_connect("127.0.0.1", etcd.port[0],
                                     ferry_now_ns() + TEST_SETUP_MS * 1000000ull, &fd),
                   FERRY_OK);
  const char get[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  assert_int_equal(write(fd, get, sizeof get - 1), (ssize_t)(sizeof get - 1));
  static char page[4 << 20];
  size_t len = 0;
  ssize_t n;
  while (len < sizeof page - 1 && (n = read(fd, page + len, sizeof page - 1 - len)) > 0)
    len += (size_t)n;
  close(fd);
  page[len] = '\0';
  const char *at = strstr(page, "\netcd_mvcc_range_total ");
  if (!at)
    fail_msg("etcd's /metrics has no etcd_mvcc_range_total");
  return strtod(at + strlen("\netcd_mvcc_range_total "), NULL);
}

/* A standby watches the leader key (an etcd watch) rather than reading it
 * every 200 ms: over 3 s with a leader and a standby idle, etcd serves
 * the leader's reads after its renewals (every third of its 2 s lease)
 * and the standby's one read per watch that ends without a change (1 s),
 * about 8; a standby reading every 200 ms alone makes 15. When the leader
 * stops, the standby still leads at once. */
static void a_standby_watches_the_leader_key(void **state) {
  (void)state;
  use_cluster("ha-watch");
  master_proc a, b;
  master_start(&a, "leader");
  master_start(&b, "standby");
  double before = etcd_reads(), from = test_now_s();
  poll(NULL, 0, 3000); /* a window to count reads in, not an ordering */
  double reads = etcd_reads() - before - 1, took = test_now_s() - from;
  print_message("etcd reads in %.1f s with a leader and a standby: %.0f\n", took, reads);
  if (reads > 12 * took / 3)
    fail_msg("%.0f reads of etcd in %.1f s: the standby polls", reads, took);
  double stopped = test_now_s();
  master_stop(&a);
  wait_for_leader(b.addr);
  print_message("handover after SIGTERM with a watching standby: %.3f s\n", test_now_s() - stopped);
  master_stop(&b);
}

/* A client given etcd://... with no master leading, or an etcd that does
 * not answer, fails at open naming why. */
static void an_etcd_url_without_a_leader_is_refused(void **state) {
  (void)state;
  use_cluster("ha-nobody");
  client c;
  assert_int_equal(client_open(&c, client_url), FERRY_ENOTFOUND);
  if (!strstr(ferry_last_error(), "no store master leads now"))
    fail_msg("without its reason: %s", ferry_last_error());
  ferry_engine_destroy(c.engine);
  char dead[64];
  snprintf(dead, sizeof dead, "etcd://127.0.0.1:%u", test_free_port());
  assert_int_equal(client_open(&c, dead), FERRY_EMETADATA);
  if (!strstr(ferry_last_error(), "cannot read the store's leader from"))
    fail_msg("without its reason: %s", ferry_last_error());
  ferry_engine_destroy(c.engine);
}

/* A commit the journal did not take is refused: with etcd killed, a put
 * whose PUT_END cannot be journaled fails (FERRY_EMETADATA) and commits
 * nothing, so no failover can lose an object the client was told is
 * stored. Once etcd is back (same data), the leader renews its lease and
 * serves again: the put goes through. */
static void a_commit_etcd_did_not_take_is_refused(void **state) {
  (void)state;
  use_cluster("ha-journal");
  master_proc a;
  master_start(&a, "leader");
  client c;
  if (client_open(&c, client_url) != FERRY_OK)
    fail_msg("ferry_store_open(%s): %s", client_url, ferry_last_error());
  test_store_kill(&etcd, 0); /* its lease still holds for a moment: the leader serves */
  ferry_status st = put_value(c.store, 1);
  print_message("put with etcd down: %s\n", ferry_last_error());
  assert_int_not_equal(st, FERRY_OK);
  assert_int_equal(test_store_restart(&etcd, 0, 0), 0);
  double end = test_now_s() + FAILOVER_MS / 1000.0;
  while ((st = put_value(c.store, 2)) != FERRY_OK && test_now_s() < end)
    poll(NULL, 0, 20); /* until the leader renewed its lease */
  assert_int_equal(st, FERRY_OK);
  char key[32];
  key_of(1, key, sizeof key);
  assert_int_equal(ferry_store_exists(c.store, key), FERRY_ENOTFOUND);
  check_value(c.store, 2);
  client_close(&c);
  master_stop(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_client_follows_a_failover_mid_workload),
      cmocka_unit_test(an_upsert_outlives_its_leader),
      cmocka_unit_test(a_batch_commit_outlives_its_leader),
      cmocka_unit_test(a_standby_serves_nobody),
      cmocka_unit_test(a_stalled_leader_serves_nothing_when_it_wakes),
      cmocka_unit_test(a_leader_that_stops_hands_over_at_once),
      cmocka_unit_test(a_standby_watches_the_leader_key),
      cmocka_unit_test(an_etcd_url_without_a_leader_is_refused),
      cmocka_unit_test(a_commit_etcd_did_not_take_is_refused),
      cmocka_unit_test(a_restarted_client_does_not_adopt_a_segment_not_its_memory),
  };
  const char *only = getenv("FERRY_TEST_FILTER");
  if (only && *only)
    cmocka_set_test_filter(only);
  return cmocka_run_group_tests(tests, etcd_setup, etcd_teardown);
}
