/* test_lifetime.c - the engine's lifetime against calls on other threads
 * (destroy and shutdown while calls are blocked or running), peer state
 * that follows a restarted target, a batch whose notification outlives its
 * deadline, and a worker pool that shrinks back after a stall.
 *
 * Interleavings are driven, not slept into: a raw listener that reads the
 * HELLO and never answers shows a call is blocked in its handshake, and a
 * proxy holding back the target's acks (holdproxy.h) shows a transfer or a
 * notification is in flight. Each test proves the racing call is inside the
 * engine before it destroys it. Run under ASan and TSan (label threaded). */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"
#include "holdproxy.h"
#include "wire/wire.h"

#define MiB (1024ull * 1024ull)
#define WRITERS 8
/* Far longer than any test: a call that returns promptly was woken. */
#define LONG_MS 60000
/* How long a woken call may take to come back on a busy machine. */
#define PROMPT_S 10.0

static ferry_engine *engine_with(unsigned transports, uint32_t timeout_ms, uint32_t connect_ms) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = transports;
  cfg.timeout_ms = timeout_ms;
  cfg.connect_timeout_ms = connect_ms;
  ferry_engine *e = NULL;
  if (ferry_engine_create(&cfg, &e) != FERRY_OK)
    fail_msg("engine create: %s", ferry_last_error());
  return e;
}

/* ---- a call on its own thread --------------------------------------------------------------- */

typedef enum { CALL_WRITE, CALL_PROBE, CALL_NOTIFY, CALL_WAIT, CALL_WRITE_LOOP } call_kind;

typedef struct call {
  call_kind kind;
  ferry_engine *engine;
  char target[64];
  void *local;
  uint64_t remote;
  size_t length;
  ferry_batch *batch;
  pthread_t thread;
  ferry_status result;
  unsigned done; /* CALL_WRITE_LOOP: transfers completed (atomic) */
} call;

static ferry_status run_once(call *c) {
  switch (c->kind) {
  case CALL_WRITE:
  case CALL_WRITE_LOOP:
    return ferry_transfer_sync(c->engine, c->target, FERRY_OP_WRITE, c->local, c->remote,
                               c->length);
  case CALL_PROBE: return ferry_probe(c->engine, c->target);
  case CALL_NOTIFY: return ferry_notify_send(c->engine, c->target, "lifetime", "x", 1);
  case CALL_WAIT: return ferry_batch_wait(c->batch, -1);
  }
  return FERRY_EINVAL;
}

static void *call_main(void *arg) {
  call *c = arg;
  ferry_status st;
  do {
    st = run_once(c);
    if (!st)
      __atomic_add_fetch(&c->done, 1, __ATOMIC_SEQ_CST);
  } while (c->kind == CALL_WRITE_LOOP && st == FERRY_OK);
  c->result = st;
  return NULL;
}

static void call_start(call *c) {
  assert_int_equal(pthread_create(&c->thread, NULL, call_main, c), 0);
}

/* Joins a call that must have returned within PROMPT_S. */
static ferry_status call_join(call *c) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)PROMPT_S;
  if (pthread_timedjoin_np(c->thread, NULL, &until) != 0)
    fail_msg("a call racing with destroy did not return within %.0f s", PROMPT_S);
  return c->result;
}

/* ---- a listener that never answers ----------------------------------------------------------- */

static int silent_listener(char *target, size_t size) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof a;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_true(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 16) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  snprintf(target, size, "127.0.0.1:%u", ntohs(a.sin_port));
  return fd;
}

/* Accepts one connection and reads the first bytes of its HELLO: from then
 * on the caller is blocked waiting for a HELLO_REPLY that never comes. */
static int accept_hello(int listen_fd) {
  struct pollfd p = {listen_fd, POLLIN, 0};
  assert_int_equal(poll(&p, 1, LONG_MS), 1);
  int fd = accept(listen_fd, NULL, NULL);
  assert_true(fd >= 0);
  char byte;
  struct pollfd q = {fd, POLLIN, 0};
  assert_int_equal(poll(&q, 1, LONG_MS), 1);
  assert_int_equal(recv(fd, &byte, 1, 0), 1);
  return fd;
}

static double destroy_timed(ferry_engine *e) {
  double t0 = test_now_s();
  ferry_engine_destroy(e);
  return test_now_s() - t0;
}

/* ---- destroy during handshakes ------------------------------------------------------------------
 */

static void destroy_during_handshake(void **state) {
  char target[64];
  int lfd = silent_listener(target, sizeof target);
  ferry_engine *e = engine_with(FERRY_TRANSPORT_TCP, LONG_MS, LONG_MS);
  void *buf = test_buffer(e, 4096);
  call c = {.kind = CALL_WRITE, .engine = e, .local = buf, .remote = 0x10000, .length = 4096};
  snprintf(c.target, sizeof c.target, "%s", target);
  call_start(&c);
  int peer = accept_hello(lfd);
  double took = destroy_timed(e);
  ferry_status st = call_join(&c);
  assert_int_equal(st, FERRY_ECLOSED);
  assert_true(took < PROMPT_S);
  close(peer);
  close(lfd);
  free(buf);
}

static void destroy_during_probe_and_notify(void **state) {
  char probe_target[64], notify_target[64];
  int probe_fd = silent_listener(probe_target, sizeof probe_target);
  int notify_fd = silent_listener(notify_target, sizeof notify_target);
  ferry_engine *e = engine_with(FERRY_TRANSPORT_TCP, LONG_MS, LONG_MS);
  call probe = {.kind = CALL_PROBE, .engine = e}, notify = {.kind = CALL_NOTIFY, .engine = e};
  snprintf(probe.target, sizeof probe.target, "%s", probe_target);
  snprintf(notify.target, sizeof notify.target, "%s", notify_target);
  call_start(&probe);
  call_start(&notify);
  int a = accept_hello(probe_fd), b = accept_hello(notify_fd);
  assert_true(destroy_timed(e) < PROMPT_S);
  assert_int_equal(call_join(&probe), FERRY_ECLOSED);
  assert_int_equal(call_join(&notify), FERRY_ECLOSED);
  close(a);
  close(b);
  close(probe_fd);
  close(notify_fd);
}

/* A listener whose accept queue is full: the kernel drops further SYNs, so
 * a connect to it hangs until the caller's connect timeout. */
static int full_listener(char *target, size_t size, int fillers[2]) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof a;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_true(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 0) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  for (int i = 0; i < 2; i++) {
    fillers[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(fillers[i], (struct sockaddr *)&a, sizeof a);
  }
  struct pollfd first = {.fd = fillers[0], .events = POLLOUT}; /* it took the queue's one place */
  assert_int_equal(poll(&first, 1, (int)(PROMPT_S * 1000)), 1);
  snprintf(target, size, "127.0.0.1:%u", ntohs(a.sin_port));
  return fd;
}

/* How many sockets of this host are in SYN_SENT towards port. */
static int syn_sent_to(uint16_t port) {
  FILE *f = fopen("/proc/net/tcp", "r");
  assert_non_null(f);
  char line[256];
  unsigned rport, state;
  int count = 0;
  while (fgets(line, sizeof line, f))
    count +=
        sscanf(line, "%*d: %*x:%*x %*x:%x %x", &rport, &state) == 2 && rport == port && state == 2;
  fclose(f);
  return count;
}

/* A call destroy cannot wake (a connect in progress) ends by its own
 * deadline, and destroy waits for it before freeing anything. */
static void destroy_waits_for_a_call_it_cannot_wake(void **state) {
  char target[64];
  int fillers[2];
  int lfd = full_listener(target, sizeof target, fillers);
  ferry_engine *e = engine_with(FERRY_TRANSPORT_TCP, LONG_MS, 1000);
  call c = {.kind = CALL_PROBE, .engine = e};
  snprintf(c.target, sizeof c.target, "%s", target);
  /* The filler the full queue refused stays in SYN_SENT too: the probe's
   * connect is the one beyond those already there. */
  uint16_t port = (uint16_t)atoi(strrchr(target, ':') + 1);
  int fillers_waiting = syn_sent_to(port);
  call_start(&c);
  for (double t0 = test_now_s(); syn_sent_to(port) <= fillers_waiting;)
    if (test_now_s() - t0 > PROMPT_S)
      fail_msg("the probe never started connecting");
    else
      usleep(1000);
  ferry_engine_destroy(e);
  /* The probe's connect ended inside the engine before destroy returned:
   * its SYN_SENT socket is gone. (The call thread's flag is set only after
   * the call returned, which destroy need not wait for: on a busy machine
   * that thread can be preempted in between.) */
  assert_true(syn_sent_to(port) <= fillers_waiting);
  assert_int_equal(call_join(&c), FERRY_ECLOSED);
  close(fillers[0]);
  close(fillers[1]);
  close(lfd);
}

/* ---- destroy while transfers are in flight ------------------------------------------------------
 */

typedef struct fixture {
  ferry_engine *target;
  void *region;
  hold_proxy *proxies[WRITERS];
} fixture;

/* An in-process target with WRITERS slices of 8 MiB, reached through one
 * proxy per writer, so each writer is its own peer and its own proxy
 * shows when that writer is inside its transfer. */
static void fixture_start(fixture *f, uint8_t hold) {
  f->target = engine_with(FERRY_TRANSPORT_TCP, LONG_MS, LONG_MS);
  assert_int_equal(ferry_memory_alloc(f->target, WRITERS * 8 * MiB, &f->region), FERRY_OK);
  for (int i = 0; i < WRITERS; i++) {
    f->proxies[i] = hold_proxy_start(ferry_engine_port(f->target));
    assert_non_null(f->proxies[i]);
    hold_proxy_hold(f->proxies[i], hold);
  }
}

static void fixture_stop(fixture *f) {
  for (int i = 0; i < WRITERS; i++)
    hold_proxy_stop(f->proxies[i]);
  ferry_engine_destroy(f->target);
}

static void writer_init(call *c, call_kind kind, ferry_engine *e, const char *target, void *local,
                        uint64_t remote) {
  *c = (call){.kind = kind, .engine = e, .local = local, .remote = remote, .length = 8 * MiB};
  snprintf(c->target, sizeof c->target, "%s", target);
}

static void destroy_while_writers_in_flight(void **state) {
  fixture f;
  fixture_start(&f, FERRY_FRAME_WRITE_ACK);
  ferry_engine *e = engine_with(FERRY_TRANSPORT_TCP, LONG_MS, LONG_MS);
  uint8_t *src = test_buffer(e, WRITERS * 8 * MiB);
  call w[WRITERS];
  for (int i = 0; i < WRITERS; i++) {
    writer_init(&w[i], CALL_WRITE, e, hold_proxy_target(f.proxies[i]), src + i * 8 * MiB,
                (uint64_t)(uintptr_t)f.region + i * 8 * MiB);
    call_start(&w[i]);
  }
  for (int i = 0; i < WRITERS; i++) /* every writer has a WRITE waiting for its ack */
    assert_int_equal(hold_proxy_wait_held(f.proxies[i], 1, LONG_MS), 0);
  assert_true(destroy_timed(e) < PROMPT_S);
  for (int i = 0; i < WRITERS; i++)
    assert_int_equal(call_join(&w[i]), FERRY_ECLOSED);
  free(src);
  fixture_stop(&f);
}

/* Writers keep writing (bytes moving, nothing held) until shutdown ends
 * them; the handle stays valid, so a writer's next call is legal and must
 * be refused at once. */
static void shutdown_while_writers_run(void **state) {
  fixture f;
  fixture_start(&f, 0);
  ferry_engine *e = engine_with(FERRY_TRANSPORT_TCP, LONG_MS, LONG_MS);
  uint8_t *src = test_buffer(e, WRITERS * 8 * MiB);
  call w[WRITERS];
  for (int i = 0; i < WRITERS; i++) {
    writer_init(&w[i], CALL_WRITE_LOOP, e, hold_proxy_target(f.proxies[i]), src + i * 8 * MiB,
                (uint64_t)(uintptr_t)f.region + i * 8 * MiB);
    call_start(&w[i]);
  }
  for (int i = 0; i < WRITERS; i++) /* all of them under way */
    for (double t0 = test_now_s(); !__atomic_load_n(&w[i].done, __ATOMIC_SEQ_CST);)
      if (test_now_s() - t0 > LONG_MS / 1000)
        fail_msg("writer %d never completed a transfer", i);
      else
        usleep(1000);
  double t0 = test_now_s();
  ferry_engine_shutdown(e);
  assert_true(test_now_s() - t0 < PROMPT_S);
  for (int i = 0; i < WRITERS; i++)
    assert_int_equal(call_join(&w[i]), FERRY_ECLOSED);
  assert_int_equal(ferry_transfer_sync(e, w[0].target, FERRY_OP_WRITE, src, w[0].remote, 4096),
                   FERRY_ECLOSED);
  ferry_engine_destroy(e);
  free(src);
  fixture_stop(&f);
}

/* Threads wait on async batches in flight; destroy fails them, and the
 * handles stay usable after the engine is gone. */
static void destroy_while_threads_wait_on_batches(void **state) {
  fixture f;
  fixture_start(&f, FERRY_FRAME_WRITE_ACK);
  ferry_engine *e = engine_with(FERRY_TRANSPORT_TCP, LONG_MS, LONG_MS);
  uint8_t *src = test_buffer(e, WRITERS * 8 * MiB);
  call waiters[WRITERS];
  for (int i = 0; i < WRITERS; i++) {
    ferry_entry en = {FERRY_OP_WRITE, src + i * 8 * MiB,
                      (uint64_t)(uintptr_t)f.region + i * 8 * MiB, 8 * MiB};
    ferry_batch *b;
    assert_int_equal(ferry_batch_submit(e, hold_proxy_target(f.proxies[i]), &en, 1, NULL, &b),
                     FERRY_OK);
    waiters[i] = (call){.kind = CALL_WAIT, .batch = b};
    call_start(&waiters[i]);
  }
  for (int i = 0; i < WRITERS; i++)
    assert_int_equal(hold_proxy_wait_held(f.proxies[i], 1, LONG_MS), 0);
  assert_true(destroy_timed(e) < PROMPT_S);
  for (int i = 0; i < WRITERS; i++) {
    assert_int_equal(call_join(&waiters[i]), FERRY_ECLOSED);
    ferry_status cause = FERRY_OK;
    assert_int_equal(ferry_batch_status(waiters[i].batch, &cause), FERRY_BATCH_FAILED);
    assert_int_equal(cause, FERRY_ECLOSED);
    assert_int_equal(ferry_batch_wait(waiters[i].batch, 0), FERRY_ECLOSED);
    ferry_batch_free(waiters[i].batch);
  }
  free(src);
  fixture_stop(&f);
}

/* ---- a notification that outlives its batch's deadline
 * ---------------------------------------------- */

static void batch_pending_while_notification_in_flight(void **state) {
  fixture f;
  fixture_start(&f, 0);
  const uint32_t budget_ms = 2000; /* ample for one 4 KiB WRITE on a busy machine */
  ferry_engine *e = engine_with(FERRY_TRANSPORT_TCP, budget_ms, LONG_MS);
  const char *target = hold_proxy_target(f.proxies[0]);
  uint8_t *src = test_buffer(e, 4096);
  uint64_t remote = (uint64_t)(uintptr_t)f.region;
  /* Connect first, so the batch's budget is spent on its own data only. */
  assert_int_equal(ferry_transfer_sync(e, target, FERRY_OP_WRITE, src, remote, 4096), FERRY_OK);
  hold_proxy_hold(f.proxies[0], FERRY_FRAME_NOTIFY_ACK);
  ferry_entry en = {FERRY_OP_WRITE, src, remote, 4096};
  ferry_notification n = {"done", "payload", 7};
  double submitted = test_now_s();
  ferry_batch *b;
  assert_int_equal(ferry_batch_submit(e, target, &en, 1, &n, &b), FERRY_OK);
  /* Data landed and the target queued the notification; its ack waits. */
  assert_int_equal(hold_proxy_wait_held(f.proxies[0], 1, LONG_MS), 0);
  while (test_now_s() - submitted < budget_ms / 1000.0 + 0.5) /* past the batch deadline */
    usleep(10 * 1000);
  ferry_status cause = FERRY_OK;
  assert_int_equal(ferry_batch_status(b, &cause), FERRY_BATCH_PENDING);
  assert_int_equal(ferry_batch_wait(b, 0), FERRY_EINPROGRESS);
  hold_proxy_release(f.proxies[0]);
  assert_int_equal(ferry_batch_wait(b, -1), FERRY_OK);
  assert_int_equal(ferry_batch_status(b, &cause), FERRY_BATCH_DONE);
  ferry_batch_free(b);
  ferry_notification *got;
  size_t count;
  assert_int_equal(ferry_notify_drain(f.target, &got, &count), FERRY_OK);
  assert_int_equal(count, 1);
  assert_string_equal(got[0].name, "done");
  ferry_notify_free(got, count);
  ferry_engine_destroy(e);
  free(src);
  fixture_stop(&f);
}

/* ---- the worker pool shrinks back ---------------------------------------------------------------
 */

static int thread_count(void) {
  DIR *d = opendir("/proc/self/task");
  assert_non_null(d);
  int n = 0;
  for (struct dirent *de; (de = readdir(d)) != NULL;)
    n += de->d_name[0] != '.';
  closedir(d);
  return n;
}

static void worker_pool_shrinks_when_idle(void **state) {
  test_target t;
  const char *const extra[] = {"--protocol", "tcp", NULL};
  assert_int_equal(test_target_start(&t, 0, 16 * MiB, extra), 0);
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = FERRY_TRANSPORT_TCP;
  cfg.workers = 1;
  cfg.tcp_connections = WRITERS;
  cfg.worker_idle_ms = 100;
  ferry_engine *e;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  int base = thread_count();
  hold_proxy *proxy = hold_proxy_start(t.port);
  hold_proxy_hold(proxy, FERRY_FRAME_WRITE_ACK);
  uint8_t *src = test_buffer(e, WRITERS * 4096);
  ferry_batch *b[WRITERS];
  for (int i = 0; i < WRITERS; i++) {
    ferry_entry en = {FERRY_OP_WRITE, src + i * 4096, t.addr + i * 4096, 4096};
    assert_int_equal(ferry_batch_submit(e, hold_proxy_target(proxy), &en, 1, NULL, &b[i]),
                     FERRY_OK);
  }
  /* Eight WRITEs wait for their acks: eight workers are blocked, seven of
   * them beyond the floor of one. */
  assert_int_equal(hold_proxy_wait_held(proxy, WRITERS, LONG_MS), 0);
  hold_proxy_release(proxy);
  for (int i = 0; i < WRITERS; i++) {
    assert_int_equal(ferry_batch_wait(b[i], -1), FERRY_OK);
    ferry_batch_free(b[i]);
  }
  hold_proxy_stop(proxy); /* its own threads gone: what is left is the engine's */
  double t0 = test_now_s();
  while (thread_count() > base && test_now_s() - t0 < PROMPT_S * 3)
    usleep(10 * 1000);
  assert_int_equal(thread_count(), base);
  ferry_engine_destroy(e);
  free(src);
  test_target_stop(&t);
}

/* ---- peer state follows a restarted target ------------------------------------------------------
 */

static void restart_as(test_target *t, uint16_t port, const char *protocol) {
  const char *const extra[] = {"--protocol", protocol, NULL};
  int started = -1;
  for (int attempt = 0; attempt < 50 && started != 0; attempt++)
    if ((started = test_target_start(t, port, 16 * MiB, extra)) != 0)
      usleep(100 * 1000); /* the old process's port may linger for a moment */
  assert_int_equal(started, 0);
}

static unsigned write_and_report(ferry_engine *e, test_target *t, void *buf) {
  ferry_status st = ferry_transfer_sync(e, t->target, FERRY_OP_WRITE, buf, t->addr, 4096);
  if (st)
    fail_msg("write after the target restarted: %s", ferry_last_error());
  unsigned transport = 0;
  assert_int_equal(ferry_peer_transport(e, t->target, &transport), FERRY_OK);
  return transport;
}

static void peer_transport_follows_restart(void **state) {
  test_target t;
  restart_as(&t, 0, "all");
  uint16_t port = t.port;
  ferry_engine *e = test_engine(NULL);
  void *buf = test_buffer(e, 4096);
  unsigned first = write_and_report(e, &t, buf);
  if (first != FERRY_TRANSPORT_SHM) {
    test_target_stop(&t);
    ferry_engine_destroy(e);
    free(buf);
    skip(); /* shm unusable on this host: nothing to switch from */
  }
  test_target_stop(&t);
  restart_as(&t, port, "tcp");
  assert_int_equal(write_and_report(e, &t, buf), FERRY_TRANSPORT_TCP);
  test_target_stop(&t);
  restart_as(&t, port, "all");
  assert_int_equal(write_and_report(e, &t, buf), FERRY_TRANSPORT_SHM);
  test_target_stop(&t);
  ferry_engine_destroy(e);
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(destroy_during_handshake),
      cmocka_unit_test(destroy_during_probe_and_notify),
      cmocka_unit_test(destroy_waits_for_a_call_it_cannot_wake),
      cmocka_unit_test(destroy_while_writers_in_flight),
      cmocka_unit_test(shutdown_while_writers_run),
      cmocka_unit_test(destroy_while_threads_wait_on_batches),
      cmocka_unit_test(batch_pending_while_notification_in_flight),
      cmocka_unit_test(worker_pool_shrinks_when_idle),
      cmocka_unit_test(peer_transport_follows_restart),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
