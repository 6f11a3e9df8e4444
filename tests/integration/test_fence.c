/* test_fence.c - unregister is a fence, and a target bounds what a peer can
 * make it hold: raw peers (tests/support/rawclient.c) stall mid-frame at
 * points the test chooses, so every interleaving is driven, not timed. The
 * target is an engine in this process, so the test sees its memory. */
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
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
#include "metadata/metadata.h"
#include "pagestall.h"
#include "rawclient.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
/* Documented bound of an unregister (RELIABILITY.md section 7) is the time
 * its threads take to leave a system call; this is generous for a busy
 * machine and far below the transfer timeout the old code waited for. */
#define UNREGISTER_BOUND_S 1.0

static ferry_engine *target_engine(uint32_t timeout_ms, uint32_t idle_ms) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.timeout_ms = timeout_ms;
  cfg.idle_timeout_ms = idle_ms;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  return e;
}

static int raw_peer(ferry_engine *e) {
  int fd = raw_connect(ferry_engine_port(e));
  assert_true(fd >= 0);
  assert_int_equal(raw_hello(fd, FERRY_WIRE_VERSION_MIN, FERRY_WIRE_VERSION_MAX, NULL, 0), 0);
  return fd;
}

/* Waits (10 s at most) until the target's connection thread has stored
 * byte `want` at p: it is then inside the WRITE, past the registry check. */
static void wait_for_byte(const volatile uint8_t *p, uint8_t want) {
  double until = test_now_s() + 10;
  while (*p != want && test_now_s() < until)
    sched_yield();
  assert_int_equal(*p, want);
}

static double timed_unregister(ferry_engine *e, void *addr) {
  double t0 = test_now_s();
  assert_int_equal(ferry_memory_unregister(e, addr), FERRY_OK);
  double took = test_now_s() - t0;
  print_message("unregister returned after %.3f ms\n", took * 1e3);
  assert_true(took < UNREGISTER_BOUND_S);
  return took;
}

/* (a) A raw peer sends a 64 KiB WRITE's header, table and first byte, then
 * stalls. Unregister returns at once; the owner reuses the buffer; the
 * peer's remaining 65,535 bytes must not land. A second stalled WRITE into
 * another region is not disturbed and completes. */
static void unregister_fences_a_stalled_write(void **state) {
  enum { SIZE = 64 * KiB };
  ferry_engine *e = target_engine(5000, 0);
  uint8_t *buf = test_buffer(e, SIZE), *other = test_buffer(e, SIZE);
  uint8_t *payload = malloc(SIZE), *pattern = malloc(SIZE);
  memset(buf, 0, SIZE);
  memset(other, 0, SIZE);
  memset(payload, 0xab, SIZE);
  memset(pattern, 0x5c, SIZE);
  int fd = raw_peer(e), fd2 = raw_peer(e);
  assert_int_equal(raw_write_begin(fd, (uint64_t)(uintptr_t)buf, payload, SIZE, 1), 0);
  assert_int_equal(raw_write_begin(fd2, (uint64_t)(uintptr_t)other, payload, SIZE, 1), 0);
  wait_for_byte(buf, 0xab);
  wait_for_byte(other, 0xab);

  timed_unregister(e, buf);
  memcpy(buf, pattern, SIZE);          /* the owner reuses the memory at once */
  raw_send(fd, payload + 1, SIZE - 1); /* may fail: the target reset it */
  char reason[FERRY_WIRE_MAX_REASON + 1] = "";
  int st = raw_reply(fd, reason, sizeof reason); /* the reason, or the reset */
  print_message("stalled WRITE ended with %d: %s\n", st, reason);
  assert_int_not_equal(st, 0);
  assert_memory_equal(buf, pattern, SIZE);

  /* the other region's WRITE was left alone */
  assert_int_equal(raw_send(fd2, payload + 1, SIZE - 1), 0);
  assert_int_equal(raw_reply(fd2, NULL, 0), 0);
  assert_memory_equal(other, payload, SIZE);
  close(fd);
  close(fd2);
  ferry_engine_destroy(e);
  free(buf);
  free(other);
  free(payload);
  free(pattern);
}

/* (b) A raw peer asks for a 64 MiB READ and does not read its socket. After
 * unregister returns, the owner writes a new pattern; when the peer then
 * reads everything it can, every byte is the old pattern (bytes copied into
 * socket buffers before the unregister may arrive), none the new one. */
static void unregister_fences_a_stalled_read(void **state) {
  enum { SIZE = 64 * MiB };
  ferry_engine *e = target_engine(5000, 0);
  uint8_t *buf = test_buffer(e, SIZE), *got = malloc(SIZE);
  for (size_t i = 0; i < SIZE; i++)
    buf[i] = (uint8_t)(i * 7 + 1);
  int fd = raw_peer(e);
  assert_int_equal(raw_read_begin(fd, (uint64_t)(uintptr_t)buf, SIZE), 0);
  struct pollfd p = {fd, POLLIN, 0};
  assert_int_equal(poll(&p, 1, 10000), 1); /* the target is sending */

  timed_unregister(e, buf);
  for (size_t i = 0; i < SIZE; i++)
    buf[i] = (uint8_t) ~(i * 7 + 1);
  uint8_t header[FERRY_WIRE_HEADER_SIZE];
  assert_int_equal(recv(fd, header, sizeof header, MSG_WAITALL), (ssize_t)sizeof header);
  size_t n = 0;
  for (ssize_t r; n < SIZE && (r = recv(fd, got + n, SIZE - n, 0)) > 0;)
    n += (size_t)r;
  print_message("READ cut after %zu of %u bytes\n", n, (unsigned)SIZE);
  assert_true(n < SIZE);
  for (size_t i = 0; i < n; i++)
    if (got[i] != (uint8_t)(i * 7 + 1))
      fail_msg("byte %zu of the READ came from after the unregister", i);
  close(fd);
  ferry_engine_destroy(e);
  free(buf);
  free(got);
}

/* (d) A peer that stalls mid-frame is cut off by the frame deadline (here
 * the target's 300 ms transfer timeout); the target keeps serving others. */
static void peer_stalled_mid_frame_is_cut_off(void **state) {
  ferry_engine *e = target_engine(300, 0);
  uint8_t *buf = test_buffer(e, 64 * KiB), data[64] = {0};
  int fd = raw_peer(e);
  assert_int_equal(raw_write_begin(fd, (uint64_t)(uintptr_t)buf, data, 64 * KiB, 1), 0);
  double t0 = test_now_s();
  assert_true(raw_closed_by_peer(fd, 10000));
  print_message("stalled peer cut off after %.2f s\n", test_now_s() - t0);
  int ok = raw_peer(e);
  assert_int_equal(raw_write(ok, (uint64_t)(uintptr_t)buf, data, sizeof data, NULL, 0), 0);
  close(ok);
  close(fd);
  ferry_engine_destroy(e);
  free(buf);
}

/* A connection with no request past idle_timeout_ms is dropped; an
 * initiator whose pooled connections were dropped simply reconnects. */
static void idle_connections_are_dropped_and_calls_reconnect(void **state) {
  ferry_engine *t = target_engine(5000, 300), *i = test_engine(NULL);
  uint8_t *dst = test_buffer(t, MiB), *src = test_buffer(i, MiB), *back = test_buffer(i, MiB);
  uint64_t remote = (uint64_t)(uintptr_t)dst;
  test_round_trip(i, ferry_engine_name(t), src, back, remote, MiB, 1);
  /* A witness connected after the initiator's last request: once it is
   * dropped, the initiator's idle connections were dropped before it. */
  int witness = raw_peer(t);
  double t0 = test_now_s();
  assert_true(raw_closed_by_peer(witness, 10000));
  print_message("idle connection dropped after %.2f s\n", test_now_s() - t0);
  test_round_trip(i, ferry_engine_name(t), src, back, remote, MiB, 2);
  close(witness);
  ferry_engine_destroy(i);
  ferry_engine_destroy(t);
  free(dst);
  free(src);
  free(back);
}

/* A data connection as an initiator engine opens it: engine id and the
 * HELLO nonce that names it; the control connection of the same engine. */
static int named_peer(ferry_engine *e, uint64_t engine_id, uint8_t nonce_byte) {
  uint8_t nonce[FERRY_WIRE_NONCE_SIZE];
  memset(nonce, nonce_byte, sizeof nonce);
  int fd = raw_connect(ferry_engine_port(e));
  assert_true(fd >= 0);
  assert_int_equal(raw_hello_named(fd, engine_id, nonce), 0);
  return fd;
}

static int cut(int control, uint8_t nonce_byte) {
  uint8_t nonce[FERRY_WIRE_NONCE_SIZE];
  memset(nonce, nonce_byte, sizeof nonce);
  return raw_cut(control, nonce);
}

/* CUT is how an initiator whose data connection broke with a WRITE in
 * flight makes sure no byte of it lands after it wrote again elsewhere
 * (tcp.c, RELIABILITY 5). A WRITE stalls after its first byte; once CUT
 * answered, the newer bytes are in place and the rest of the stalled
 * WRITE, sent after, never lands; the connection is closed. */
static void cut_stops_a_write_in_flight(void **state) {
  enum { SIZE = 64 * KiB };
  ferry_engine *e = target_engine(5000, 0);
  uint8_t *buf = test_buffer(e, SIZE), *payload = malloc(SIZE), *newer = malloc(SIZE);
  memset(buf, 0, SIZE);
  memset(payload, 0xab, SIZE);
  memset(newer, 0x5c, SIZE);
  int data = named_peer(e, 77, 0x11), control = named_peer(e, 77, 0x22);
  assert_int_equal(raw_write_begin(data, (uint64_t)(uintptr_t)buf, payload, SIZE, 1), 0);
  wait_for_byte(buf, 0xab);
  assert_int_equal(cut(control, 0x11), 0);
  memcpy(buf, newer, SIZE);              /* the WRITE sent again elsewhere landed */
  raw_send(data, payload + 1, SIZE - 1); /* may fail: the target closed it */
  assert_true(raw_closed_by_peer(data, 10000));
  assert_memory_equal(buf, newer, SIZE);
  close(data);
  close(control);
  ferry_engine_destroy(e);
  free(buf);
  free(payload);
  free(newer);
}

/* A connection cut while idle serves nothing more: a whole WRITE sent on it
 * afterwards does not land. A CUT names only the asking engine's own
 * connections: another engine's CUT of the same nonce changes nothing. */
static void cut_connection_serves_nothing_more(void **state) {
  enum { SIZE = 4 * KiB };
  ferry_engine *e = target_engine(5000, 0);
  uint8_t *buf = test_buffer(e, SIZE), *payload = malloc(SIZE);
  memset(buf, 0, SIZE);
  memset(payload, 0xcd, SIZE);
  int data = named_peer(e, 77, 0x11), control = named_peer(e, 77, 0x22);
  int stranger = named_peer(e, 78, 0x33);
  assert_int_equal(cut(stranger, 0x11), 0);
  assert_int_equal(raw_write(data, (uint64_t)(uintptr_t)buf, payload, SIZE, NULL, 0), 0);
  assert_memory_equal(buf, payload, SIZE); /* still served */
  memset(buf, 0, SIZE);
  assert_int_equal(cut(control, 0x11), 0);
  assert_int_not_equal(raw_write(data, (uint64_t)(uintptr_t)buf, payload, SIZE, NULL, 0), 0);
  for (size_t i = 0; i < SIZE; i++)
    assert_int_equal(buf[i], 0);
  assert_int_equal(cut(control, 0x44), 0); /* no such connection: nothing to wait for */
  close(data);
  close(control);
  close(stranger);
  ferry_engine_destroy(e);
  free(buf);
  free(payload);
}

/* ---- CUTs that meet each other ------------------------------------------- */

enum { CUT_PAGE = 4096 };

/* A connection of engine 77 named nonce_byte whose WRITE of one page at
 * dst is stuck in the target, in the copy (a page that stalls): it stays
 * inside its frame, cut or not, until the test releases the page. */
static int stuck_writer(ferry_engine *e, page_stall *p, uint8_t *dst, uint8_t nonce_byte) {
  static uint8_t payload[CUT_PAGE];
  memset(payload, 0xee, sizeof payload);
  int fd = named_peer(e, 77, nonce_byte);
  assert_int_equal(raw_write_begin(fd, (uint64_t)(uintptr_t)dst, payload, CUT_PAGE, CUT_PAGE), 0);
  assert_int_equal(page_stall_wait(p, 10000), 0);
  return fd;
}

/* Sends a CUT of the connection named nonce_byte; its answer is not read. */
static int cut_begin(int fd, uint8_t nonce_byte) {
  uint8_t nonce[FERRY_WIRE_NONCE_SIZE];
  memset(nonce, nonce_byte, sizeof nonce);
  return raw_cut_begin(fd, nonce);
}

/* The target answered on fd, or closed it, within timeout_ms. */
static int answered_or_closed(int fd, int timeout_ms) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1;
}

static void *destroy_engine(void *e) {
  ferry_engine_destroy(e);
  return NULL;
}

/* Destroy, whatever peers still do, returns by its bound (RELIABILITY 9:
 * 20 ms past the last woken call); bound_s is far above that and far
 * below the deadlines nothing wakes, which these tests make long. */
static void destroy_within(ferry_engine *e, double bound_s) {
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, destroy_engine, e), 0);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)bound_s;
  int rc = pthread_timedjoin_np(thread, NULL, &until);
  if (rc != 0)
    fail_msg("ferry_engine_destroy did not return within %.0f s", bound_s);
}

static ferry_engine *cut_target(uint32_t timeout_ms, page_stall *p, size_t pages) {
  if (page_stall_create(p, pages * CUT_PAGE, 0, 0) != 0) {
    print_message("no userfaultfd here: cannot hold a WRITE inside its frame\n");
    skip();
  }
  ferry_engine *e = target_engine(timeout_ms, 0);
  assert_int_equal(ferry_memory_register(e, p->base, p->size), FERRY_OK);
  return e;
}

/* An honest peer is still served: a WRITE lands and is acknowledged. */
static void still_serves(ferry_engine *e) {
  uint8_t *buf = test_buffer(e, CUT_PAGE), data[CUT_PAGE];
  memset(data, 0x42, sizeof data);
  int fd = raw_peer(e);
  assert_int_equal(raw_write(fd, (uint64_t)(uintptr_t)buf, data, sizeof data, NULL, 0), 0);
  assert_memory_equal(buf, data, sizeof data);
  close(fd);
  assert_int_equal(ferry_memory_unregister(e, buf), FERRY_OK);
  free(buf);
}

/* A CUT never waits for a connection that is itself waiting in a CUT: A's
 * CUT waits for S, whose WRITE is stuck in the target; B's CUT of A is
 * answered at once, while S is still stuck (A touches no memory, and,
 * cut, ends). Before, B's CUT waited for A's, which waited for S. */
static void a_cut_never_waits_for_another_cut(void **state) {
  page_stall p;
  ferry_engine *e = cut_target(30000, &p, 1);
  int a = named_peer(e, 77, 0x11), b = named_peer(e, 77, 0x22);
  int s = stuck_writer(e, &p, p.base, 0x55);
  assert_int_equal(cut_begin(a, 0x55), 0);
  assert_true(raw_closed_by_peer(s, 10000)); /* A's CUT cut S: A now waits */
  int answer = cut(b, 0x11);                 /* 10 s at most (the raw client's bound) */
  print_message("B's CUT of A, while A's CUT waits for a stuck WRITE: %d\n", answer);
  assert_int_equal(answer, 0);
  assert_true(raw_closed_by_peer(a, 10000)); /* A, cut, ended */
  assert_int_equal(page_stall_release(&p, 0), 0);
  still_serves(e);
  destroy_within(e, 10);
  close(a);
  close(b);
  close(s);
  page_stall_destroy(&p);
}

/* Two connections A and B of one engine, each CUTting the other, must not
 * wait for each other for good. The interleaving is driven: decoys S1
 * (named like B) and S2 (named like A) are stuck in WRITEs, so each CUT
 * first finds its decoy and waits for it; once both decoys are released,
 * A's CUT finds B inside its own CUT, and B's finds A. Before, both waited
 * forever (no bound, no stop check): neither was answered, a fresh peer's
 * HELLO went unanswered, and destroy never returned. Now each is answered
 * or cut, the target serves others, and destroy returns at once. */
static void connections_cutting_each_other_do_not_deadlock(void **state) {
  page_stall p;
  ferry_engine *e = cut_target(30000, &p, 2);
  int a = named_peer(e, 77, 0x11), b = named_peer(e, 77, 0x22);
  int s1 = stuck_writer(e, &p, p.base, 0x22);
  int s2 = stuck_writer(e, &p, p.base + CUT_PAGE, 0x11);
  assert_int_equal(cut_begin(a, 0x22), 0);
  assert_true(raw_closed_by_peer(s1, 10000)); /* A's CUT is in: it cut S1 (and B) */
  cut_begin(b, 0x11);                         /* may fail: B may be cut already */
  struct pollfd either[2] = {{s2, POLLIN, 0}, {b, POLLIN, 0}};
  assert_true(poll(either, 2, 10000) > 0); /* B's CUT is in, or B was cut first */
  assert_int_equal(page_stall_release(&p, 0), 0);
  int answered_a = answered_or_closed(a, 10000), answered_b = answered_or_closed(b, 10000);
  print_message("A answered or closed: %d, B: %d\n", answered_a, answered_b);
  assert_true(answered_a && answered_b);
  still_serves(e);
  destroy_within(e, 10);
  close(a);
  close(b);
  close(s1);
  close(s2);
  page_stall_destroy(&p);
}

/* A CUT's wait is bounded by the target's timeout_ms: the connection it
 * names is stuck inside its frame for good (a page that stalls), and the
 * CUT is refused with FERRY_ETIMEDOUT after 300 ms, the asking connection
 * still usable. Before, it waited as long as the stall. */
static void a_cut_waits_at_most_timeout_ms(void **state) {
  page_stall p;
  ferry_engine *e = cut_target(300, &p, 1);
  int a = named_peer(e, 77, 0x11);
  int s = stuck_writer(e, &p, p.base, 0x55);
  char reason[FERRY_WIRE_MAX_REASON + 1] = "";
  double t0 = test_now_s();
  assert_int_equal(cut_begin(a, 0x55), 0);
  int answer = raw_cut_reply(a, reason, sizeof reason);
  print_message("CUT of a stuck connection: %d after %.2f s: %s\n", answer, test_now_s() - t0,
                reason);
  assert_int_equal(answer, FERRY_ETIMEDOUT);
  assert_non_null(strstr(reason, "timeout_ms"));
  assert_int_equal(page_stall_release(&p, 0), 0);
  assert_true(raw_closed_by_peer(s, 10000));
  assert_int_equal(cut(a, 0x66), 0); /* A still serves (no such connection: answered at once) */
  destroy_within(e, 10);
  close(a);
  close(s);
  page_stall_destroy(&p);
}

/* Notifications count their real memory against a per-peer share: one-byte
 * notifications are refused long before their payload bytes reach the
 * limit, and a second peer is not refused because the first is. */
static void notification_shares_count_real_memory_per_peer(void **state) {
  enum { SHARE = 256 * KiB };
  ferry_config cfg;
  test_config(&cfg);
  cfg.notify_peer_bytes = SHARE;
  ferry_engine *t = NULL, *a = test_engine(NULL), *b = test_engine(NULL);
  assert_int_equal(ferry_engine_create(&cfg, &t), FERRY_OK);
  const char *target = ferry_engine_name(t);
  ferry_status st;
  size_t sent = 0;
  while ((st = ferry_notify_send(a, target, "n", "x", 1)) == FERRY_OK && sent < SHARE)
    sent++;
  print_message("%zu one-byte notifications accepted: %s\n", sent, ferry_last_error());
  assert_int_equal(st, FERRY_EBUSY);
  assert_non_null(strstr(ferry_last_error(), "notification queue"));
  assert_non_null(strstr(ferry_last_error(), ferry_engine_name(a)));
  assert_non_null(strstr(ferry_last_error(), "262144"));
  /* at least 64 bytes of real memory each, not the 2 of their payload */
  assert_true(sent > 0 && sent <= SHARE / 64);
  assert_int_equal(ferry_notify_send(b, target, "n", "y", 1), FERRY_OK);
  ferry_notification *list;
  size_t count;
  assert_int_equal(ferry_notify_drain(t, &list, &count), FERRY_OK);
  assert_int_equal(count, sent + 1);
  ferry_notify_free(list, count);
  assert_int_equal(ferry_notify_send(a, target, "n", "x", 1), FERRY_OK); /* drained: room again */
  ferry_engine_destroy(a);
  ferry_engine_destroy(b);
  ferry_engine_destroy(t);
}

/* Past max_connections_per_peer a peer's handshake is refused with
 * FERRY_EBUSY naming the limit; other peers still connect. Past
 * max_connections a new connection is closed at once. */
static void connections_are_capped_per_peer_and_in_total(void **state) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.max_connections_per_peer = 2;
  cfg.max_connections = 4;
  ferry_engine *t = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &t), FERRY_OK);
  int fds[5];
  char reason[FERRY_WIRE_MAX_REASON + 1] = "";
  for (int i = 0; i < 3; i++) {
    fds[i] = raw_connect(ferry_engine_port(t));
    assert_true(fds[i] >= 0);
    int st = raw_hello_as(fds[i], 42, reason, sizeof reason);
    assert_int_equal(st, i < 2 ? 0 : FERRY_EBUSY);
  }
  print_message("third connection of one peer: %s\n", reason);
  assert_non_null(strstr(reason, "max_connections_per_peer"));
  assert_true(raw_closed_by_peer(fds[2], 10000));
  close(fds[2]);
  fds[2] = raw_connect(ferry_engine_port(t)); /* another peer */
  assert_int_equal(raw_hello_as(fds[2], 43, NULL, 0), 0);
  fds[3] = raw_connect(ferry_engine_port(t));
  assert_int_equal(raw_hello_as(fds[3], 44, NULL, 0), 0);
  fds[4] = raw_connect(ferry_engine_port(t)); /* the fifth: over the total */
  assert_true(fds[4] >= 0);
  assert_true(raw_closed_by_peer(fds[4], 10000));
  for (int i = 0; i < 5; i++)
    close(fds[i]);
  ferry_engine_destroy(t);
}

static pid_t metadata_server = -1;

static int stop_metadata_server(void **state) {
  if (metadata_server > 0)
    test_kill_and_reap(metadata_server, 5000);
  metadata_server = -1;
  return 0;
}

/* Starts `ferry metadata-server` on 127.0.0.1 (stopped by the teardown
 * even when the test fails); its URL goes to url. */
static pid_t start_metadata_server(char *url, size_t size) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    execl(test_tool_path(), test_tool_path(), "metadata-server", "--host", "127.0.0.1", "--port",
          "0", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char line[512];
  assert_int_equal(test_read_line(fds[0], line, sizeof line, TEST_SETUP_MS), 0);
  close(fds[0]);
  const char *at = strstr(line, "url=");
  assert_non_null(at);
  snprintf(url, size, "%s", at + 4);
  return pid;
}

enum { REGISTRARS = 8, PER_REGISTRAR = 32, PAGE = 4096, ROUNDS = 40 };

struct registrar {
  ferry_engine *engine;
  uint8_t *base;
};

/* Registers its pages one by one, then unregisters every other one: many
 * publishes racing those of the other registrars. */
static void *register_pages(void *arg) {
  struct registrar *r = arg;
  for (int i = 0; i < PER_REGISTRAR; i++)
    assert_int_equal(ferry_memory_register(r->engine, r->base + i * PAGE, PAGE), FERRY_OK);
  for (int i = 0; i < PER_REGISTRAR; i += 2)
    assert_int_equal(ferry_memory_unregister(r->engine, r->base + i * PAGE), FERRY_OK);
  return NULL;
}

/* However registrations interleave, the table left in the metadata service
 * is the registry's final one, not an older snapshot published last. */
static void concurrent_registrations_publish_the_latest_table(void **state) {
  char url[256];
  metadata_server = start_metadata_server(url, sizeof url);
  ferry_config cfg;
  test_config(&cfg);
  cfg.metadata_url = url;
  cfg.segment_name = "fence-publish";
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  ferry_metadata *md = NULL;
  assert_int_equal(ferry_metadata_open(url, &md), FERRY_OK);
  uint8_t *pages = aligned_alloc(PAGE, (size_t)REGISTRARS * PER_REGISTRAR * PAGE);
  for (int round = 0; round < ROUNDS; round++) {
    struct registrar r[REGISTRARS];
    pthread_t threads[REGISTRARS];
    for (int t = 0; t < REGISTRARS; t++) {
      r[t] = (struct registrar){e, pages + (size_t)t * PER_REGISTRAR * PAGE};
      assert_int_equal(pthread_create(&threads[t], NULL, register_pages, &r[t]), 0);
    }
    for (int t = 0; t < REGISTRARS; t++)
      pthread_join(threads[t], NULL);
    ferry_region *published = NULL;
    size_t count = 0;
    assert_int_equal(ferry_segment_lookup_regions(md, "fence-publish", &published, &count),
                     FERRY_OK);
    assert_int_equal(count, REGISTRARS * PER_REGISTRAR / 2);
    for (size_t i = 0; i < count; i++)
      assert_int_equal(published[i].addr, (uint64_t)(uintptr_t)(pages + (2 * i + 1) * PAGE));
    free(published);
    void *odd[REGISTRARS * PER_REGISTRAR / 2];
    for (size_t i = 0; i < count; i++)
      odd[i] = pages + (2 * i + 1) * PAGE;
    assert_int_equal(ferry_memory_unregister_batch(e, odd, count), FERRY_OK);
  }
  ferry_metadata_close(md);
  ferry_engine_destroy(e);
  free(pages);
}

int main(void) {
  setenv("FERRY_TRANSPORTS", "tcp", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(unregister_fences_a_stalled_write),
      cmocka_unit_test(unregister_fences_a_stalled_read),
      cmocka_unit_test(peer_stalled_mid_frame_is_cut_off),
      cmocka_unit_test(idle_connections_are_dropped_and_calls_reconnect),
      cmocka_unit_test(cut_stops_a_write_in_flight),
      cmocka_unit_test(cut_connection_serves_nothing_more),
      cmocka_unit_test(a_cut_never_waits_for_another_cut),
      cmocka_unit_test(connections_cutting_each_other_do_not_deadlock),
      cmocka_unit_test(a_cut_waits_at_most_timeout_ms),
      cmocka_unit_test(notification_shares_count_real_memory_per_peer),
      cmocka_unit_test(connections_are_capped_per_peer_and_in_total),
      cmocka_unit_test_teardown(concurrent_registrations_publish_the_latest_table,
                                stop_metadata_server),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
