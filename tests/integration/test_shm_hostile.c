/* test_shm_hostile.c - the shm service against same-host processes that do
 * not follow its protocol: another user, a peer that reopens the region
 * table or resizes a buffer it mapped, one that scribbles on its slots or
 * never says HELLO, and a flood of connections. Each test drives the
 * service with the raw client of tests/support/shmclient.c, as such a
 * process would, and checks that honest initiators keep working. The
 * other processes (another user's, an honest initiator) are this program
 * started again in a role (child.h). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "child.h"
#include "ferry.h"
#include "harness.h"
#include "shmclient.h"

#define MiB (1024ull * 1024ull)
#define NOBODY 65534

/* An engine in this process whose shm service the test attacks; path gets
 * its socket name (the one that is new in /proc/net/unix). */
static ferry_engine *target_with(uint32_t timeout_ms, uint32_t connect_timeout_ms, char *path,
                                 size_t size) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.timeout_ms = timeout_ms;
  cfg.connect_timeout_ms = connect_timeout_ms;
  char before[SHMC_NAMES_MAX][SHMC_NAME_MAX];
  int n = shmc_names(getpid(), before, SHMC_NAMES_MAX);
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  assert_int_equal(shmc_find(getpid(), before, n, path, size), 0);
  return e;
}

static unsigned transport_to(ferry_engine *e, const char *target) {
  unsigned transport = 0;
  assert_int_equal(ferry_peer_transport(e, target, &transport), FERRY_OK);
  return transport;
}

/* ---- another user -------------------------------------------------------------------- */

static int become_nobody(void) {
  return setresgid(NOBODY, NOBODY, NOBODY) == 0 && setresuid(NOBODY, NOBODY, NOBODY) == 0;
}

/* Role "refused-nobody" TARGET SOCKET: as nobody, the raw client is
 * refused before it sees anything, 600 times (each refusal costs the
 * target nothing it keeps), and an engine falls back to TCP with a log
 * line saying why (its stderr goes to stdout, the pipe the parent reads).
 * Exit code: which check failed. */
static int refused_nobody(int argc, char **argv) {
  if (argc != 2 || dup2(STDOUT_FILENO, STDERR_FILENO) < 0)
    return 9;
  const char *target = argv[0], *path = argv[1];
  if (!become_nobody())
    return 10;
  for (int i = 0; i < 600; i++) {
    shmc c;
    int rc = shmc_connect(&c, path);
    int refused = rc == FERRY_EAUTH && c.greeting.engine_id == 0 && shmc_attach(&c) != 0;
    shmc_close(&c);
    if (!refused)
      return 11;
  }
  /* This engine would use a root target (allowed here), but root's refuses it. */
  const uint32_t root = 0;
  ferry_config cfg;
  test_config(&cfg);
  cfg.shm_allowed_uids = &root;
  cfg.shm_allowed_uid_count = 1;
  cfg.connect_timeout_ms = TEST_SETUP_MS; /* a first contact */
  ferry_engine *e = NULL;
  unsigned transport = 0;
  if (ferry_engine_create(&cfg, &e) != FERRY_OK ||
      ferry_peer_transport(e, target, &transport) != FERRY_OK)
    return 13;
  ferry_engine_destroy(e);
  return transport == FERRY_TRANSPORT_TCP ? 0 : 14;
}

static void other_user_is_refused(void **state) {
  if (geteuid() != 0) {
    print_message("not root: cannot act as another user\n");
    skip();
  }
  test_target t;
  assert_int_equal(test_target_start(&t, 0, 4 * MiB, NULL), 0);
  char path[128];
  assert_int_equal(shmc_find(t.pid, NULL, 0, path, sizeof path), 0);
  int err;
  const char *args[] = {t.target, path, NULL};
  pid_t pid = test_child_start("refused-nobody", args, NULL, &err);
  assert_true(pid > 0);
  char log[8192];
  size_t got = 0;
  ssize_t n;
  while (got < sizeof log - 1 && (n = read(err, log + got, sizeof log - 1 - got)) > 0)
    got += (size_t)n;
  log[got] = '\0';
  close(err);
  int status = -1;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  print_message("as uid %d:\n%s", NOBODY, log);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_non_null(strstr(log, "refused this process (uid 65534)"));
  assert_non_null(strstr(log, "using TCP"));
  test_target_stop(&t);
}

/* Role "attaching-nobody" SOCKET: attaches to the service as nobody. */
static int attaching_nobody(int argc, char **argv) {
  shmc c;
  return argc != 1                   ? 9
         : !become_nobody()          ? 10
         : shmc_connect(&c, argv[0]) ? 11
         : shmc_attach(&c)           ? 12
                                     : 0;
}

/* A uid the target lists in shm_allowed_uids is served. */
static void allowed_user_is_served(void **state) {
  if (geteuid() != 0) {
    print_message("not root: cannot act as another user\n");
    skip();
  }
  char path[128], before[SHMC_NAMES_MAX][SHMC_NAME_MAX];
  int n = shmc_names(getpid(), before, SHMC_NAMES_MAX);
  const uint32_t allowed[] = {12345, NOBODY};
  ferry_config cfg;
  test_config(&cfg);
  cfg.shm_allowed_uids = allowed;
  cfg.shm_allowed_uid_count = 2;
  ferry_engine *target = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &target), FERRY_OK);
  assert_int_equal(shmc_find(getpid(), before, n, path, sizeof path), 0);
  const char *args[] = {path, NULL};
  pid_t pid = test_child_start("attaching-nobody", args, NULL, NULL);
  assert_true(pid > 0);
  int status = -1;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  ferry_engine_destroy(target);
}

/* Role "nobody-target": a target run by nobody. Writes "NAME ADDR" of a
 * 1 MiB buffer on stdout, then serves until stdin ends or says so. */
static int nobody_target(int argc, char **argv) {
  char line[128], byte;
  void *buf = NULL;
  /* It would serve root: only the initiator's own rule can keep it off shm. */
  const uint32_t root = 0;
  ferry_config cfg;
  test_config(&cfg);
  cfg.shm_allowed_uids = &root;
  cfg.shm_allowed_uid_count = 1;
  ferry_engine *e = NULL;
  if (argc != 0 || !become_nobody() || ferry_engine_create(&cfg, &e) != FERRY_OK ||
      ferry_memory_alloc(e, MiB, &buf) != FERRY_OK)
    return 10;
  int n = snprintf(line, sizeof line, "%s %llx\n", ferry_engine_name(e),
                   (unsigned long long)(uintptr_t)buf);
  if (write(STDOUT_FILENO, line, (size_t)n) != n || read(STDIN_FILENO, &byte, 1) < 0)
    return 11;
  ferry_engine_destroy(e);
  return 0;
}

/* The other way round: a root initiator does not hand its data over shm to
 * a target run by another user (root could, with CMA), but uses TCP. */
static void target_of_another_user_is_not_used(void **state) {
  if (geteuid() != 0) {
    print_message("not root: cannot act as another user\n");
    skip();
  }
  int info, done;
  pid_t pid = test_child_start("nobody-target", NULL, &done, &info);
  assert_true(pid > 0);
  char line[128], target[80];
  unsigned long long addr = 0;
  assert_int_equal(test_read_line(info, line, sizeof line, TEST_SETUP_MS), 0);
  assert_int_equal(sscanf(line, "%79s %llx", target, &addr), 2);
  ferry_engine *e = test_engine(NULL);
  uint8_t *buf = test_buffer(e, MiB), *back = test_buffer(e, MiB);
  assert_int_equal(transport_to(e, target), FERRY_TRANSPORT_TCP);
  test_round_trip(e, target, buf, back, addr, MiB, 5);
  ferry_engine_destroy(e);
  assert_int_equal(write(done, "d", 1), 1);
  int status = -1;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  close(info);
  close(done);
  free(buf);
  free(back);
}

/* ---- the table and the buffers cannot be changed by a peer ---------------------------- */

static void table_cannot_be_made_writable(void **state) {
  char path[128];
  ferry_engine *target = target_with(30000, 5000, path, sizeof path);
  shmc c;
  assert_int_equal(shmc_connect(&c, path), 0);
  assert_int_equal(shmc_attach(&c), 0);
  char proc[64];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", c.table_fd);
  int rw = open(proc, O_RDWR | O_CLOEXEC);
  int fds[] = {c.table_fd, rw};
  for (int i = 0; i < 2; i++) {
    if (fds[i] < 0)
      continue; /* reopening was refused: fine */
    void *w = mmap(NULL, SHM_TABLE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
    int mapped = w != MAP_FAILED;
    if (mapped)
      munmap(w, SHM_TABLE_BYTES);
    uint64_t junk = 1;
    ssize_t wrote = pwrite(fds[i], &junk, sizeof junk, 0);
    int shrunk = ftruncate(fds[i], 0) == 0;
    int punched = fallocate(fds[i], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0;
    print_message("table fd %d (%s): writable mapping %s, pwrite %zd, ftruncate %s, punch %s\n",
                  fds[i], i ? "reopened O_RDWR" : "as received", mapped ? "MADE" : "refused", wrote,
                  shrunk ? "DONE" : "refused", punched ? "DONE" : "refused");
    assert_false(mapped);
    assert_true(wrote < 0);
    assert_false(shrunk);
    assert_false(punched);
  }
  assert_int_not_equal(mprotect((void *)c.table, 4096, PROT_READ | PROT_WRITE), 0);
  if (rw >= 0)
    close(rw);
  shmc_close(&c);
  ferry_engine_destroy(target);
}

/* Role "honest-initiator" TARGET ADDR: maps the target's buffer with a
 * WRITE over shm at ADDR (hex) + 3 MiB, says 'r' on stdout, and once stdin
 * says go, transfers there again and checks the bytes. Exit code: which
 * step failed. */
static int honest_initiator(int argc, char **argv) {
  if (argc != 2)
    return 19;
  const char *target = argv[0];
  uint64_t at = strtoull(argv[1], NULL, 16) + 3 * MiB;
  ferry_engine *e = test_engine(NULL);
  uint8_t *buf = e ? test_buffer(e, MiB) : NULL, *back = e ? test_buffer(e, MiB) : NULL;
  char byte = 0;
  unsigned transport = 0;
  if (!buf || !back || ferry_peer_transport(e, target, &transport) ||
      transport != FERRY_TRANSPORT_SHM ||
      ferry_transfer_sync(e, target, FERRY_OP_WRITE, buf, at, MiB))
    return 20;
  if (write(STDOUT_FILENO, "r", 1) != 1 || read(STDIN_FILENO, &byte, 1) != 1)
    return 21;
  test_fill_random(buf, MiB, 3);
  if (ferry_transfer_sync(e, target, FERRY_OP_WRITE, buf, at, MiB) ||
      ferry_transfer_sync(e, target, FERRY_OP_READ, back, at, MiB) || memcmp(buf, back, MiB) != 0)
    return 22;
  ferry_engine_destroy(e);
  free(buf);
  free(back);
  return 0;
}

/* The honest initiator maps the target's buffer, then a peer tries to
 * resize that memfd; the honest one then transfers again. It runs in a
 * process of its own so that a SIGBUS shows as a failure, not a crash of
 * the test. */
static void buffer_cannot_be_resized(void **state) {
  test_target t;
  assert_int_equal(test_target_start(&t, 0, 4 * MiB, NULL), 0);
  char path[128];
  assert_int_equal(shmc_find(t.pid, NULL, 0, path, sizeof path), 0);
  char addr[32];
  snprintf(addr, sizeof addr, "%llx", (unsigned long long)t.addr);
  const char *args[] = {t.target, addr, NULL};
  int go, ready;
  pid_t pid = test_child_start("honest-initiator", args, &go, &ready);
  assert_true(pid > 0);
  char byte = 0;
  assert_int_equal(read(ready, &byte, 1), 1);
  shmc c;
  shm_table_entry en;
  int fd = -1;
  assert_int_equal(shmc_connect(&c, path), 0);
  assert_int_equal(shmc_attach(&c), 0);
  assert_true(shmc_entry(&c, t.addr, &en));
  assert_int_not_equal(en.ino, 0);
  assert_int_equal(shmc_map(&c, en.ino, en.addr, en.length, &fd), 0);
  int shrunk = ftruncate(fd, 0) == 0, grown = ftruncate(fd, 8 * MiB) == 0;
  int resealed = fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0;
  print_message("peer on the buffer memfd: shrink %s, grow %s, new seal %s\n",
                shrunk ? "DONE" : "refused", grown ? "DONE" : "refused",
                resealed ? "ADDED" : "refused");
  assert_int_equal(write(go, "g", 1), 1);
  int status = -1;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status))
    print_message("the honest initiator died of signal %d\n", WTERMSIG(status));
  assert_false(shrunk);
  assert_false(grown);
  assert_false(resealed);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  close(fd);
  shmc_close(&c);
  close(go);
  close(ready);
  test_target_stop(&t);
}

static void map_of_unregistered_buffer_is_refused(void **state) {
  char path[128];
  ferry_engine *target = target_with(30000, 5000, path, sizeof path);
  uint8_t *buf;
  assert_int_equal(ferry_memory_alloc(target, 4 * MiB, (void **)&buf), FERRY_OK);
  shmc c;
  shm_table_entry en;
  int fd = -1;
  assert_int_equal(shmc_connect(&c, path), 0);
  assert_int_equal(shmc_attach(&c), 0);
  assert_true(shmc_entry(&c, (uint64_t)(uintptr_t)buf, &en));
  assert_int_equal(shmc_map(&c, en.ino, en.addr, en.length, &fd), 0);
  close(fd);
  assert_int_equal(ferry_memory_unregister(target, buf), FERRY_OK);
  /* the same request, now for memory the target does not offer */
  assert_int_equal(shmc_map(&c, en.ino, en.addr, en.length, &fd), FERRY_ENOTREG);
  assert_int_equal(fd, -1);
  /* a registered part of it is served again, only while it is registered */
  assert_int_equal(ferry_memory_register(target, buf, MiB), FERRY_OK);
  assert_int_equal(shmc_map(&c, en.ino, en.addr, 2 * MiB, &fd), FERRY_ENOTREG);
  assert_int_equal(shmc_map(&c, en.ino, en.addr, MiB, &fd), 0);
  close(fd);
  shmc_close(&c);
  assert_int_equal(ferry_memory_free(target, buf), FERRY_OK);
  ferry_engine_destroy(target);
}

/* ---- slots: the service reads them, a peer cannot make it wait on them ----------------- */

typedef struct unregister_call {
  ferry_engine *e;
  void *addr;
  ferry_status st;
  int done;
  double seconds;
} unregister_call;

static void *unregister_main(void *arg) {
  unregister_call *u = arg;
  double t0 = test_now_s();
  u->st = ferry_memory_unregister(u->e, u->addr);
  u->seconds = test_now_s() - t0;
  __atomic_store_n(&u->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Waits (10 s at most) until the table's seq moves past seq. */
static int table_moved(const shmc *c, uint64_t seq) {
  double t0 = test_now_s();
  while (__atomic_load_n(&c->table->seq, __ATOMIC_ACQUIRE) == seq && test_now_s() - t0 < 10)
    ;
  return __atomic_load_n(&c->table->seq, __ATOMIC_ACQUIRE) != seq;
}

/* A raw peer sits in a slot with the current table version, as a copy
 * that checked it does. Unregister waits for it, and while it waits the
 * service still greets and attaches another peer; once the slot clears,
 * unregister returns. */
static void service_answers_during_a_revocation(void **state) {
  char path[128];
  ferry_engine *target = target_with(30000, 5000, path, sizeof path);
  void *buf = test_buffer(target, MiB);
  shmc copier, other;
  assert_int_equal(shmc_connect(&copier, path), 0);
  assert_int_equal(shmc_attach(&copier), 0);
  uint64_t seq = copier.table->seq;
  __atomic_store_n(&copier.slots[7], seq, __ATOMIC_SEQ_CST);
  unregister_call u = {target, buf, FERRY_OK, 0, 0};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, unregister_main, &u), 0);
  assert_true(table_moved(&copier, seq)); /* the revocation has begun */
  assert_int_equal(shmc_connect(&other, path), 0);
  assert_int_equal(shmc_attach(&other), 0);
  int waited = !__atomic_load_n(&u.done, __ATOMIC_ACQUIRE);
  __atomic_store_n(&copier.slots[7], 0, __ATOMIC_SEQ_CST); /* the copy ends */
  pthread_join(thread, NULL);
  print_message("unregister waited for the copy: %s; returned after %.3f s\n",
                waited ? "yes" : "NO", u.seconds);
  assert_true(waited);
  assert_int_equal(u.st, FERRY_OK);
  assert_false(shmc_closed_by_peer(&copier, 0)); /* an honest copier is not cut off */
  shmc_close(&copier);
  shmc_close(&other);
  ferry_engine_destroy(target);
  free(buf);
}

/* A raw peer fills its slots with an old version and never clears them:
 * unregister returns after the bound (timeout_ms), the peer's link is
 * closed, a second unregister does not wait for it, and an honest
 * initiator still gets shm. */
static void scribbled_slots_are_cut_off(void **state) {
  char path[128];
  const uint32_t bound_ms = 1000;
  ferry_engine *target = target_with(bound_ms, 5000, path, sizeof path);
  void *a = test_buffer(target, MiB), *b = test_buffer(target, MiB);
  shmc bad;
  assert_int_equal(shmc_connect(&bad, path), 0);
  assert_int_equal(shmc_attach(&bad), 0);
  for (unsigned i = 0; i < SHM_SLOTS; i++)
    bad.slots[i] = 2; /* older than any version unregister will publish */
  double t0 = test_now_s();
  assert_int_equal(ferry_memory_unregister(target, a), FERRY_OK);
  double first = test_now_s() - t0;
  int cut = shmc_closed_by_peer(&bad, 10000);
  t0 = test_now_s();
  assert_int_equal(ferry_memory_unregister(target, b), FERRY_OK);
  double second = test_now_s() - t0;
  print_message("bound %u ms: first unregister %.3f s, peer cut off: %s, second %.3f s\n", bound_ms,
                first, cut ? "yes" : "NO", second);
  assert_true(cut);
  assert_true(first < 20.0); /* bounded: about bound_ms; generous for a busy machine */
  ferry_engine *honest = test_engine(NULL);
  void *local = test_buffer(honest, MiB);
  assert_int_equal(ferry_memory_register(target, a, MiB), FERRY_OK);
  assert_int_equal(transport_to(honest, ferry_engine_name(target)), FERRY_TRANSPORT_SHM);
  assert_int_equal(ferry_transfer_sync(honest, ferry_engine_name(target), FERRY_OP_WRITE, local,
                                       (uint64_t)(uintptr_t)a, MiB),
                   FERRY_OK);
  ferry_engine_destroy(honest);
  shmc_close(&bad);
  ferry_engine_destroy(target);
  free(local);
  free(a);
  free(b);
}

/* ---- connections: a cap, and a deadline for HELLO --------------------------------------- */

static void idle_connections_are_capped_and_dropped(void **state) {
  struct rlimit lim;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &lim), 0);
  if (lim.rlim_cur < SHM_CONNS_MAX + 128) {
    print_message("descriptor limit %llu: too low to open %d connections\n",
                  (unsigned long long)lim.rlim_cur, SHM_CONNS_MAX);
    skip();
  }
  char path[128];
  const uint32_t hello_ms = 3000; /* long enough to open them all on a busy machine */
  ferry_engine *target = target_with(30000, hello_ms, path, sizeof path);
  void *buf = test_buffer(target, MiB);
  static shmc idle[SHM_CONNS_MAX];
  for (int i = 0; i < SHM_CONNS_MAX; i++)
    assert_int_equal(shmc_connect(&idle[i], path), 0);
  shmc extra;
  assert_int_equal(shmc_connect(&extra, path), FERRY_EBUSY);
  assert_true(shmc_closed_by_peer(&extra, 10000));
  shmc_close(&extra);
  /* an engine refused the same way falls back to TCP */
  ferry_engine *honest = test_engine(NULL);
  assert_int_equal(transport_to(honest, ferry_engine_name(target)), FERRY_TRANSPORT_TCP);
  ferry_engine_destroy(honest);
  /* none said HELLO: all are dropped after the deadline */
  int dropped = 0;
  for (int i = 0; i < SHM_CONNS_MAX; i++) {
    dropped += shmc_closed_by_peer(&idle[i], 10000);
    shmc_close(&idle[i]);
  }
  print_message("%d of %d idle connections dropped after the %u ms HELLO deadline\n", dropped,
                SHM_CONNS_MAX, hello_ms);
  assert_int_equal(dropped, SHM_CONNS_MAX);
  shmc c;
  assert_int_equal(shmc_connect(&c, path), 0);
  assert_int_equal(shmc_attach(&c), 0);
  shmc_close(&c);
  ferry_engine_destroy(target);
  free(buf);
}

int main(int argc, char **argv) {
  const test_child_role roles[] = {{"refused-nobody", refused_nobody},
                                   {"attaching-nobody", attaching_nobody},
                                   {"nobody-target", nobody_target},
                                   {"honest-initiator", honest_initiator}};
  test_child_main(argc, argv, roles, sizeof roles / sizeof *roles);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(other_user_is_refused),
      cmocka_unit_test(allowed_user_is_served),
      cmocka_unit_test(target_of_another_user_is_not_used),
      cmocka_unit_test(table_cannot_be_made_writable),
      cmocka_unit_test(buffer_cannot_be_resized),
      cmocka_unit_test(map_of_unregistered_buffer_is_refused),
      cmocka_unit_test(service_answers_during_a_revocation),
      cmocka_unit_test(scribbled_slots_are_cut_off),
      cmocka_unit_test(idle_connections_are_capped_and_dropped),
  };
  return cmocka_run_group_tests_name("shm service against hostile peers", tests, NULL, NULL);
}
