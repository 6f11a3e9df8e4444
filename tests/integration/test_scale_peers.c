/* test_scale_peers.c - the target's threads do not grow with peers or
 * connections: 64 initiator processes (each its own engine) write into one
 * target with every byte verified while the target stays within its worker
 * bound; hundreds of idle connections cost no thread; peers stalled
 * mid-frame do not hold up a healthy one (the pool grows past the stuck
 * workers, up to its cap); an initiator closes its connections to a
 * target it stopped calling once they are idle past its limit.
 *
 * Thread counts come from /proc/self/task, taken at moments the test
 * drives (every peer connected and idle, or every stalled frame inside the
 * target), never sampled against a clock. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "core/engine.h"
#include "core/peer.h"
#include "ferry.h"
#include "harness.h"
#include "net/net.h"
#include "rawclient.h"

#define KiB 1024ull
#define PEERS 64
#define PEER_BYTES (256 * KiB) /* each initiator's share of the target's buffer */
#define BLOCK (64 * KiB)
#define SERVER_THREADS 2
#define THREAD_CAP (4 * SERVER_THREADS) /* ferry.h: up to 4 times server_threads */
#define IDLE_CONNS 200
#define STALLED 4

/* Entries of a /proc/self directory ("task" or "fd"); with prefix, only fd
 * links whose target starts with it. */
static int count_entries(const char *dir, const char *prefix) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/%s", dir);
  DIR *d = opendir(path);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *de; (de = readdir(d)) != NULL;) {
    if (de->d_name[0] == '.')
      continue;
    char link[400], to[64] = "";
    snprintf(link, sizeof link, "%s/%s", path, de->d_name);
    if (prefix && readlink(link, to, sizeof to - 1) < 0)
      continue;
    n += !prefix || strncmp(to, prefix, strlen(prefix)) == 0;
  }
  closedir(d);
  return n;
}

static int threads_now(void) { return count_entries("task", NULL); }

static ferry_engine *tcp_engine(unsigned server_threads, uint32_t timeout_ms) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_TCP; /* same host: shm would bypass the server */
  cfg.server_threads = server_threads;
  cfg.timeout_ms = timeout_ms;
  cfg.connect_timeout_ms = TEST_SETUP_MS; /* 64 handshakes at once on a busy machine */
  return test_engine_create(&cfg);
}

/* ---- 64 initiator processes -------------------------------------------- */

typedef struct go {
  char target[64];
  uint64_t remote; /* this child's share of the target's buffer */
} go;

/* A child: writes its share in blocks, reads it back and compares, reports
 * one byte ('+' or '-'), then keeps its connections until the parent closes
 * its pipe. Returns the exit status. */
static int initiator_child(int index, int go_fd, int report_fd) {
  go g;
  if (read(go_fd, &g, sizeof g) != sizeof g)
    return 2;
  ferry_engine *e = tcp_engine(0, TEST_SETUP_MS);
  uint8_t *out = test_buffer(e, PEER_BYTES), *in = test_buffer(e, PEER_BYTES);
  test_fill_random(out, PEER_BYTES, 1000 + (uint64_t)index);
  ferry_status st = FERRY_OK;
  for (size_t off = 0; off < PEER_BYTES && !st; off += BLOCK)
    st = ferry_transfer_sync(e, g.target, FERRY_OP_WRITE, out + off, g.remote + off, BLOCK);
  if (!st)
    st = ferry_transfer_sync(e, g.target, FERRY_OP_READ, in, g.remote, PEER_BYTES);
  if (st)
    fprintf(stderr, "initiator %d: %s\n", index, ferry_last_error());
  int ok = !st && memcmp(out, in, PEER_BYTES) == 0;
  char verdict = ok ? '+' : '-';
  if (write(report_fd, &verdict, 1) != 1)
    ok = 0;
  char drain;
  while (read(go_fd, &drain, 1) > 0) {
  } /* the parent closed its end: done */
  ferry_engine_destroy(e);
  return ok ? 0 : 1;
}

/* Forked before the target engine exists, so each child starts from a
 * process with one thread and builds its own engine (checked: a fork after
 * threads exist may copy a lock another thread held). */
static pid_t fork_initiator(int index, int *go_fd, int report_fd) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  assert_int_equal(threads_now(), 1);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[1]);
    _exit(initiator_child(index, p[0], report_fd));
  }
  close(p[0]);
  *go_fd = p[1];
  return pid;
}

/* Waits (120 s at most, a busy machine) for one report byte per child. */
static int collect_reports(int fd, int want) {
  int good = 0;
  for (int got = 0; got < want; got++) {
    struct pollfd p = {fd, POLLIN, 0};
    char verdict;
    if (poll(&p, 1, 120000) != 1 || read(fd, &verdict, 1) != 1)
      fail_msg("only %d of %d initiators reported", got, want);
    good += verdict == '+';
  }
  return good;
}

static void sixty_four_initiator_processes_into_one_target(void **state) {
  (void)state;
  int report[2], go_fds[PEERS];
  pid_t pids[PEERS];
  assert_int_equal(pipe(report), 0);
  for (int i = 0; i < PEERS; i++)
    pids[i] = fork_initiator(i, &go_fds[i], report[1]);
  close(report[1]);

  ferry_engine *t = tcp_engine(SERVER_THREADS, 30000);
  uint8_t *buf = test_buffer(t, PEERS * PEER_BYTES);
  memset(buf, 0, PEERS * PEER_BYTES);
  int before = threads_now();
  for (int i = 0; i < PEERS; i++) {
    go g = {.remote = (uint64_t)(uintptr_t)(buf + i * PEER_BYTES)};
    snprintf(g.target, sizeof g.target, "%s", ferry_engine_name(t));
    assert_int_equal(write(go_fds[i], &g, sizeof g), sizeof g);
  }
  assert_int_equal(collect_reports(report[0], PEERS), PEERS);

  /* Every initiator is done and holds its pooled connections open, idle. */
  int threads = threads_now(), sockets = count_entries("fd", "socket:");
  print_message("target: %d threads before the peers, %d with %d peers connected; %d sockets\n",
                before, threads, PEERS, sockets);
  assert_true(sockets >= PEERS);
  assert_true(threads - before <= THREAD_CAP);

  for (int i = 0; i < PEERS; i++) {
    uint8_t want[PEER_BYTES];
    test_fill_random(want, PEER_BYTES, 1000 + (uint64_t)i);
    assert_memory_equal(buf + i * PEER_BYTES, want, PEER_BYTES);
    close(go_fds[i]);
  }
  for (int i = 0; i < PEERS; i++) {
    int status;
    assert_int_equal(test_wait_exit(pids[i], 60000, &status), 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  close(report[0]);
  ferry_engine_destroy(t);
  free(buf);
}

/* ---- idle connections -------------------------------------------------- */

/* Hundreds of connections past their handshake, waiting for a request,
 * hold no thread; the target still serves. */
static void idle_connections_cost_no_threads(void **state) {
  (void)state;
  ferry_engine *t = tcp_engine(SERVER_THREADS, 30000);
  int before = threads_now(), fds[IDLE_CONNS];
  for (int i = 0; i < IDLE_CONNS; i++) {
    fds[i] = raw_connect(ferry_engine_port(t));
    assert_true(fds[i] >= 0);
    assert_int_equal(raw_hello_as(fds[i], 0x5ca1e000ull + (uint64_t)i, NULL, 0), 0);
  }
  int threads = threads_now();
  print_message("target: %d threads before, %d with %d idle connections\n", before, threads,
                IDLE_CONNS);
  assert_true(threads - before <= THREAD_CAP);
  uint8_t *dst = test_buffer(t, BLOCK), data[BLOCK], back[BLOCK];
  test_fill_random(data, BLOCK, 7);
  assert_int_equal(raw_write(fds[0], (uint64_t)(uintptr_t)dst, data, BLOCK, NULL, 0), 0);
  assert_int_equal(raw_read(fds[IDLE_CONNS - 1], (uint64_t)(uintptr_t)dst, back, BLOCK), 0);
  assert_memory_equal(back, data, BLOCK);
  for (int i = 0; i < IDLE_CONNS; i++)
    close(fds[i]);
  ferry_engine_destroy(t);
  free(dst);
}

/* ---- stalled peers ------------------------------------------------------- */

/* More peers stalled mid-WRITE than server_threads, each holding a worker
 * until its 60 s frame deadline: a healthy initiator is still served
 * (within its own 20 s timeout), because the pool grows past the stuck
 * workers; the threads stay within the cap. */
static void stalled_peers_do_not_hold_up_a_healthy_one(void **state) {
  (void)state;
  ferry_engine *t = tcp_engine(SERVER_THREADS, 60000), *i = tcp_engine(0, 20000);
  uint8_t *dst = test_buffer(t, 2 * BLOCK), *src = test_buffer(i, BLOCK);
  uint8_t *back = test_buffer(i, BLOCK), junk[BLOCK] = {0};
  int before = threads_now(), fds[STALLED];
  for (int k = 0; k < STALLED; k++) {
    fds[k] = raw_connect(ferry_engine_port(t));
    assert_true(fds[k] >= 0);
    assert_int_equal(raw_hello_as(fds[k], 0x57a11000ull + (uint64_t)k, NULL, 0), 0);
    assert_int_equal(raw_write_begin(fds[k], (uint64_t)(uintptr_t)(dst + BLOCK), junk, BLOCK, 1),
                     0);
  }
  double t0 = test_now_s();
  test_round_trip(i, ferry_engine_name(t), src, back, (uint64_t)(uintptr_t)dst, BLOCK, 3);
  int threads = threads_now();
  print_message("healthy peer served %.2f s after %d peers stalled; target threads %d -> %d\n",
                test_now_s() - t0, STALLED, before, threads);
  assert_true(threads - before <= THREAD_CAP + 8); /* + the initiator engine's own */
  for (int k = 0; k < STALLED; k++)
    close(fds[k]);
  ferry_engine_destroy(i);
  ferry_engine_destroy(t);
  free(dst);
  free(src);
  free(back);
}

/* ---- an initiator's idle connections ------------------------------------ */

static void write_block(ferry_engine *from, ferry_engine *to, uint8_t *src, uint8_t *dst) {
  ferry_entry e = {FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, BLOCK};
  if (ferry_transfer_sync_batch(from, ferry_engine_name(to), &e, 1, NULL) != FERRY_OK)
    fail_msg("write to %s: %s", ferry_engine_name(to), ferry_last_error());
}

/* Its connections to target a, left idle past the initiator's limit, are
 * closed by the next call to another target, not kept half-open until a
 * call to a that may never come. */
static void idle_connections_to_a_quiet_target_are_closed(void **state) {
  (void)state;
  ferry_engine *a = tcp_engine(SERVER_THREADS, 30000), *b = tcp_engine(SERVER_THREADS, 30000);
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_TCP;
  cfg.idle_timeout_ms = 100;
  ferry_engine *i = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &i), FERRY_OK);
  uint8_t *src = test_buffer(i, BLOCK), *dst_a = test_buffer(a, BLOCK),
          *dst_b = test_buffer(b, BLOCK);
  write_block(i, a, src, dst_a);
  write_block(i, b, src, dst_b);
  ferry_peer *to_a;
  assert_int_equal(ferry_peer_get(i, ferry_engine_name(a), &to_a), FERRY_OK);
  assert_true(to_a->open_channels > 0 && to_a->control_fd >= 0);
  poll(NULL, 0, 250); /* past the 100 ms idle limit: what is tested is that limit */
  write_block(i, b, src, dst_b);
  pthread_mutex_lock(&to_a->lock);
  unsigned open = to_a->open_channels;
  int control = to_a->control_fd;
  pthread_mutex_unlock(&to_a->lock);
  assert_int_equal(open, 0);
  assert_int_equal(control, -1);
  write_block(i, a, src, dst_a); /* and a is reached again on the next call */
  ferry_engine_destroy(i);
  ferry_engine_destroy(a);
  ferry_engine_destroy(b);
  free(src);
  free(dst_a);
  free(dst_b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sixty_four_initiator_processes_into_one_target),
      cmocka_unit_test(idle_connections_cost_no_threads),
      cmocka_unit_test(stalled_peers_do_not_hold_up_a_healthy_one),
      cmocka_unit_test(idle_connections_to_a_quiet_target_are_closed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
