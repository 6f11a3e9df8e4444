/* test_fault_hostile.c - peers that do not play by the protocol: garbage,
 * truncated frames, huge length fields, addresses outside registered
 * memory, wrong or replayed secrets, silent connections, random frames.
 *
 * Hosts: a (the test process: raw-socket attackers and an honest engine),
 * b (two `ferry serve` targets, one without and one with a shared secret).
 * Promises checked: every abuse is refused (error reply or closed
 * connection) and logged by the target; no byte of registered memory
 * changes unless a WRITE was accepted; the honest peer, transferring in a
 * thread the whole time, never sees a failure; both targets still exit
 * cleanly at the end. Without namespaces the same runs on 127.0.0.1. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/engine.h"
#include "fault.h"

#define SECRET "correct horse battery staple"
#define PORT_OPEN 15400
#define PORT_SECRET 15401
#define GUARD (1 << 20) /* bytes at the start of each target the attacks aim at */

typedef struct env {
  fault_net *net;
  int link;
  fault_proc open, locked;     /* no secret / with SECRET */
  ferry_engine *honest;        /* talks to the open target */
  ferry_engine *honest_secret; /* knows the secret: talks to the locked one */
  uint8_t *guard_copy;         /* what the first GUARD bytes of each target must hold */
  uint8_t *buf;
  pthread_t thread;
  int stop;
  int honest_ops, honest_failures;
  char honest_error[256];
} env;

static env E;

/* Authentication is mutual, so an engine holding the secret refuses the
 * open target: each target has its own honest engine. */
static ferry_engine *engine_for(const fault_proc *t) {
  return t == &E.locked ? E.honest_secret : E.honest;
}

static void *honest_loop(void *arg) {
  uint8_t *local = E.buf + 4 * GUARD;
  for (uint64_t seed = 500; !__atomic_load_n(&E.stop, __ATOMIC_ACQUIRE); seed++) {
    const fault_proc *t = seed % 2 ? &E.open : &E.locked;
    ferry_status st = fault_roundtrip(engine_for(t), t->target, local,
                                      t->addr + 8 * GUARD + (seed % 8) * 65536, 65536, seed);
    if (st != FERRY_OK && E.honest_failures++ == 0)
      snprintf(E.honest_error, sizeof E.honest_error, "%s: %s", ferry_strerror(st),
               ferry_last_error());
    E.honest_ops++;
    fault_sleep_ms(1);
  }
  return NULL;
}

static int setup(void **state) {
  E.net = fault_net_open(2);
  if (!E.net)
    return -1;
  E.link = fault_net_link(E.net, 0, 1, FAULT_LINK_VETH);
  const char *addr_b = fault_link_addr(E.net, E.link, 1);
  static const char *const secret_args[] = {"--secret", SECRET, NULL};
  if (E.link < 0 ||
      fault_serve_start(&E.open, E.net, 1, addr_b, fault_port(E.net, PORT_OPEN), "64M", NULL, 0) ||
      fault_serve_start(&E.locked, E.net, 1, addr_b, fault_port(E.net, PORT_SECRET), "64M",
                        secret_args, 0))
    return -1;
  if (fault_net_enter(E.net, 0) != 0)
    return -1;
  E.honest = fault_engine(fault_link_addr(E.net, E.link, 0), 5000, 2000, 0);
  setenv("FERRY_SECRET", SECRET, 1);
  E.honest_secret = fault_engine(fault_link_addr(E.net, E.link, 0), 5000, 2000, 0);
  unsetenv("FERRY_SECRET");
  E.buf = E.honest && E.honest_secret ? fault_buffer(E.honest, 6 * GUARD) : NULL;
  if (!E.buf || ferry_memory_register(E.honest_secret, E.buf, 6 * GUARD) != FERRY_OK)
    return -1;
  E.guard_copy = E.buf;
  fault_pattern(E.guard_copy, GUARD, 4242);
  if (ferry_transfer_sync(E.honest, E.open.target, FERRY_OP_WRITE, E.guard_copy, E.open.addr,
                          GUARD) ||
      ferry_transfer_sync(E.honest_secret, E.locked.target, FERRY_OP_WRITE, E.guard_copy,
                          E.locked.addr, GUARD)) {
    fprintf(stderr, "honest setup write failed: %s\n", ferry_last_error());
    return -1;
  }
  pthread_create(&E.thread, NULL, honest_loop, NULL);
  *state = &E;
  return 0;
}

/* The honest peer saw no failure, memory outside accepted WRITEs is
 * untouched, and both targets still exit cleanly. */
static int teardown(void **state) {
  if (!*state) { /* the group setup failed: only clean up */
    fault_proc_term(&E.open);
    fault_proc_term(&E.locked);
    fault_net_destroy(E.net);
    return 0;
  }
  int bad = 0;
  __atomic_store_n(&E.stop, 1, __ATOMIC_RELEASE);
  pthread_join(E.thread, NULL);
  printf("honest peer during the attacks: %d round trips, %d failures%s%s\n", E.honest_ops,
         E.honest_failures, E.honest_failures ? ", first: " : "", E.honest_error);
  bad |= E.honest_failures != 0 || E.honest_ops < 10;
  const fault_proc *targets[] = {&E.open, &E.locked};
  for (int i = 0; i < 2; i++) {
    uint8_t *back = E.buf + GUARD;
    if (ferry_transfer_sync(engine_for(targets[i]), targets[i]->target, FERRY_OP_READ, back,
                            targets[i]->addr, GUARD) != FERRY_OK ||
        memcmp(back, E.guard_copy, GUARD) != 0) {
      fprintf(stderr, "target %s: guarded memory changed or unreadable\n", targets[i]->target);
      bad = 1;
    }
  }
  ferry_engine_destroy(E.honest_secret);
  fault_buffer_free(E.honest, E.buf);
  ferry_engine_destroy(E.honest);
  fault_net_leave(E.net);
  for (int i = 0; i < 2; i++) {
    int status = fault_proc_term((fault_proc *)targets[i]);
    if (status != 0) {
      fprintf(stderr, "target %d exited with status %d\n", i, status);
      bad = 1;
    }
  }
  fault_net_destroy(E.net);
  return bad ? -1 : 0;
}

static void raw_connect(fault_raw *r, const fault_proc *t) {
  assert_int_equal(fault_raw_connect(r, t->target, 5000), 0);
}

/* Sends bytes on a fresh connection; the target must close it. */
static void expect_closed_after(const fault_proc *t, const void *bytes, size_t len, int handshake,
                                const char *what) {
  fault_raw r;
  raw_connect(&r, t);
  if (handshake)
    assert_int_equal(fault_raw_handshake(&r, SECRET), FERRY_OK);
  fault_raw_send(&r, bytes, len);
  if (!fault_raw_closed_by_peer(&r, 3000))
    fail_msg("%s: the target kept the connection open", what);
  fault_raw_close(&r);
}

static void encode(uint8_t out[FERRY_WIRE_HEADER_SIZE], uint8_t type, uint32_t count,
                   uint64_t body_len) {
  ferry_frame_header h = {.type = type, .count = count, .body_len = body_len, .id = 1};
  ferry_wire_header_encode(out, &h);
}

static void test_garbage_and_foreign_protocols(void **state) {
  uint8_t junk[4096];
  fault_pattern(junk, sizeof junk, 1);
  expect_closed_after(&E.open, junk, sizeof junk, 0, "random bytes");
  const char http[] =
      "GET / HTTP/1.1\r\nHost: example\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n";
  expect_closed_after(&E.open, http, sizeof http - 1, 0, "an HTTP request");
  expect_closed_after(&E.locked, http, sizeof http - 1, 0, "an HTTP request (secret target)");
  uint8_t h[FERRY_WIRE_HEADER_SIZE];
  encode(h, FERRY_FRAME_WRITE, 1, 16 + 8);
  expect_closed_after(&E.open, h, sizeof h, 0, "a WRITE before HELLO");
  assert_true(fault_proc_log_has(&E.open, "bad magic"));
  assert_true(fault_proc_log_has(&E.open, "not HELLO"));
}

static void test_truncated_frames(void **state) {
  uint8_t h[FERRY_WIRE_HEADER_SIZE];
  /* Half a header, then close; a HELLO cut short; a WRITE cut short. */
  for (int i = 0; i < 3; i++) {
    fault_raw r;
    raw_connect(&r, &E.open);
    if (i == 0) {
      encode(h, FERRY_FRAME_HELLO, 0, 40);
      fault_raw_send(&r, h, 16);
    } else if (i == 1) {
      encode(h, FERRY_FRAME_HELLO, 0, 40);
      fault_raw_send(&r, h, sizeof h);
      fault_raw_send(&r, "\x01\x00\x01\x00", 4);
    } else {
      assert_int_equal(fault_raw_handshake(&r, NULL), FERRY_OK);
      /* Into the scratch area past the guard: a cut WRITE may leave part
       * of its payload, but is never acknowledged. */
      ferry_frame_header wh = {
          .type = FERRY_FRAME_WRITE, .count = 1, .id = 9, .body_len = 16 + 65536};
      uint8_t table[16];
      ferry_region seg = {E.open.addr + 2 * GUARD, 65536};
      ferry_wire_segments_encode(table, &seg, 1);
      fault_raw_send_frame(&r, &wh, NULL);
      fault_raw_send(&r, table, sizeof table);
      fault_raw_send(&r, E.guard_copy, 1000);
    }
    fault_raw_close(&r);
  }
  /* A truncated frame followed by silence: the target must not wait forever
   * in the handshake (connect timeout), checked in test_silent_peers. */
}

static void test_huge_length_fields(void **state) {
  struct {
    uint8_t type;
    uint32_t count;
    uint64_t body_len;
    int after_handshake;
    const char *what;
  } cases[] = {
      {FERRY_FRAME_HELLO, 0, 1ull << 40, 0, "HELLO of 1 TiB"},
      {FERRY_FRAME_HELLO, 0, UINT64_MAX, 0, "HELLO of 2^64-1 bytes"},
      {FERRY_FRAME_WRITE, 1, 1ull << 63, 1, "WRITE of 2^63 bytes"},
      {FERRY_FRAME_WRITE, 0xffffffffu, 1ull << 20, 1, "WRITE with 2^32-1 segments"},
      {FERRY_FRAME_READ, 100000, 1600000, 1, "READ with 100000 segments"},
      {FERRY_FRAME_NOTIFY, 0, 64ull << 20, 1, "NOTIFY of 64 MiB"},
      {FERRY_FRAME_REGIONS_REQ, 0, 1ull << 30, 1, "REGIONS_REQ with a 1 GiB body"},
      {FERRY_FRAME_PING, 7, 0, 1, "PING with a count"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    uint8_t h[FERRY_WIRE_HEADER_SIZE];
    encode(h, cases[i].type, cases[i].count, cases[i].body_len);
    expect_closed_after(&E.open, h, sizeof h, cases[i].after_handshake, cases[i].what);
  }
  /* A READ whose one segment asks for more than a frame may carry. */
  fault_raw r;
  raw_connect(&r, &E.open);
  assert_int_equal(fault_raw_handshake(&r, NULL), FERRY_OK);
  uint8_t buf[16];
  assert_int_not_equal(fault_raw_read(&r, E.open.addr, buf, (size_t)1 << 40, 0), FERRY_OK);
  assert_true(fault_raw_closed_by_peer(&r, 3000));
  fault_raw_close(&r);
  assert_true(fault_proc_log_has(&E.open, "exceeds"));
}

static void test_out_of_region_addresses(void **state) {
  fault_raw r;
  raw_connect(&r, &E.open);
  assert_int_equal(fault_raw_handshake(&r, NULL), FERRY_OK);
  uint8_t data[8192], back[8192];
  memset(data, 0x5a, sizeof data);
  uint64_t base = E.open.addr, end = E.open.addr + E.open.size;
  struct {
    uint64_t addr;
    size_t len;
    const char *what;
  } cases[] = {
      {0x1000, 4096, "a low address"},
      {base - 4096, 4096, "just below the region"},
      {base - 100, 200, "straddling the region start"},
      {end - 100, 200, "straddling the region end"},
      {end, 4096, "just past the region"},
      {(uint64_t)(uintptr_t)&data, 4096, "the attacker's own stack address"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ferry_status st = fault_raw_write(&r, cases[i].addr, data, cases[i].len, 0);
    if (st != FERRY_ENOTREG)
      fail_msg("WRITE to %s: %s, expected ENOTREG", cases[i].what, ferry_strerror(st));
    st = fault_raw_read(&r, cases[i].addr, back, cases[i].len, 0);
    if (st != FERRY_ENOTREG)
      fail_msg("READ of %s: %s, expected ENOTREG", cases[i].what, ferry_strerror(st));
  }
  /* The connection stayed in step: a legal WRITE and READ on it work. */
  assert_int_equal(fault_raw_write(&r, base + 3 * GUARD, data, sizeof data, 1), FERRY_OK);
  assert_int_equal(fault_raw_read(&r, base + 3 * GUARD, back, sizeof back, 1), FERRY_OK);
  assert_memory_equal(data, back, sizeof data);
  fault_raw_close(&r);
  /* Wrap-around is malformed, not merely unregistered: connection closed. */
  raw_connect(&r, &E.open);
  assert_int_equal(fault_raw_handshake(&r, NULL), FERRY_OK);
  assert_int_not_equal(fault_raw_write(&r, UINT64_MAX - 10, data, 100, 0), FERRY_OK);
  assert_true(fault_raw_closed_by_peer(&r, 3000));
  fault_raw_close(&r);
  assert_true(fault_proc_log_has(&E.open, "is not registered"));
}

static void test_wrong_secret(void **state) {
  fault_raw r;
  /* Wrong secret. */
  raw_connect(&r, &E.locked);
  assert_int_equal(fault_raw_handshake(&r, "not the secret"), FERRY_EAUTH);
  assert_true(fault_raw_closed_by_peer(&r, 3000));
  fault_raw_close(&r);
  /* No proof at all: straight to a WRITE after HELLO. */
  raw_connect(&r, &E.locked);
  assert_int_equal(fault_raw_handshake(&r, NULL), FERRY_OK);
  assert_true(r.info.auth_required);
  uint8_t data[4096] = {1};
  assert_int_not_equal(fault_raw_write(&r, E.locked.addr, data, sizeof data, 0), FERRY_OK);
  assert_true(fault_raw_closed_by_peer(&r, 3000));
  fault_raw_close(&r);
  /* An engine with the wrong secret, and one with none. */
  setenv("FERRY_SECRET", "guess", 1);
  ferry_engine *wrong = fault_engine(fault_link_addr(E.net, E.link, 0), 3000, 2000, 0);
  unsetenv("FERRY_SECRET");
  ferry_engine *none = fault_engine(fault_link_addr(E.net, E.link, 0), 3000, 2000, 0);
  assert_non_null(wrong);
  assert_non_null(none);
  uint8_t *lb = fault_buffer(wrong, 4096), *nb = fault_buffer(none, 4096);
  ferry_status st =
      ferry_transfer_sync(wrong, E.locked.target, FERRY_OP_WRITE, lb, E.locked.addr, 4096);
  printf("engine with a wrong secret: %s: %s\n", ferry_strerror(st), ferry_last_error());
  assert_int_equal(st, FERRY_EAUTH);
  st = ferry_transfer_sync(none, E.locked.target, FERRY_OP_READ, nb, E.locked.addr, 4096);
  printf("engine without a secret: %s: %s\n", ferry_strerror(st), ferry_last_error());
  assert_int_equal(st, FERRY_EAUTH);
  assert_int_equal(ferry_probe(wrong, E.locked.target), FERRY_EAUTH);
  fault_buffer_free(wrong, lb);
  fault_buffer_free(none, nb);
  ferry_engine_destroy(wrong);
  ferry_engine_destroy(none);
  assert_true(fault_proc_log_has(&E.locked, "wrong shared secret"));
  assert_true(fault_proc_log_has(&E.locked, "no proof sent"));
}

/* A proof is bound to the transcript: replaying one on a new connection fails. */
static void test_replayed_proof(void **state) {
  fault_raw r;
  raw_connect(&r, &E.locked);
  ferry_hello hello;
  memset(&hello, 0, sizeof hello);
  hello.version_min = hello.version_max = FERRY_WIRE_VERSION_MIN;
  hello.conn_kind = FERRY_CONN_DATA;
  snprintf(hello.name, sizeof hello.name, "replayer");
  memset(hello.nonce, 7, sizeof hello.nonce); /* the same client nonce both times */
  uint8_t sent[FERRY_WIRE_HELLO_MAX], body[FERRY_WIRE_HELLO_REPLY_MAX],
      proof[FERRY_WIRE_PROOF_SIZE] = {0};
  for (int round = 0; round < 2; round++) {
    if (round == 1)
      raw_connect(&r, &E.locked);
    ferry_frame_header h = {.type = FERRY_FRAME_HELLO};
    size_t sent_len = h.body_len = ferry_wire_hello_encode(sent, &hello);
    assert_int_equal(fault_raw_send_frame(&r, &h, sent), 0);
    assert_int_equal(fault_raw_recv_header(&r, &h, NULL), FERRY_OK);
    assert_int_equal(fault_raw_recv(&r, body, (size_t)h.body_len), 0);
    ferry_hello_reply reply;
    assert_int_equal(ferry_wire_hello_reply_decode(body, (size_t)h.body_len, &reply), FERRY_OK);
    if (round == 0) {
      /* Recorded from an honest session (computed here with the secret). */
      uint8_t th[FERRY_WIRE_PROOF_SIZE];
      ferry_auth_transcript(sent, sent_len, body, (size_t)h.body_len, th);
      ferry_auth_bound_proof(SECRET, FERRY_AUTH_INITIATOR, th, NULL, 0, proof);
    }
    ferry_frame_header ah = {.type = FERRY_FRAME_AUTH, .body_len = sizeof proof};
    assert_int_equal(fault_raw_send_frame(&r, &ah, proof), 0);
    assert_int_equal(fault_raw_recv_header(&r, &h, NULL), FERRY_OK);
    assert_int_equal(h.type, FERRY_FRAME_AUTH_REPLY);
    if (round == 0)
      assert_int_equal(h.status, FERRY_OK);
    else
      assert_int_equal(h.status, FERRY_EAUTH);
    fault_raw_close(&r);
  }
}

/* Connections that say nothing, or stop after HELLO: they cost the target
 * a thread each but must not stop it from serving the honest peer, and the
 * ones still in the handshake are dropped after the connect timeout. */
static void test_silent_peers(void **state) {
  enum { SILENT = 64 };
  fault_raw quiet[SILENT];
  for (int i = 0; i < SILENT; i++)
    raw_connect(&quiet[i], i % 2 ? &E.open : &E.locked);
  fault_raw idle;
  raw_connect(&idle, &E.open);
  assert_int_equal(fault_raw_handshake(&idle, NULL), FERRY_OK);
  /* The honest thread keeps going meanwhile; the default connect timeout
   * of the targets is 5 s, counted from when each connection's thread
   * starts, which a busy machine spreads out: one generous deadline for
   * all of them, not a short wait for each. */
  int closed = 0;
  double t0 = fault_now(), deadline = t0 + 20.0;
  for (int i = 0; i < SILENT; i++) {
    double left = deadline - fault_now();
    closed += fault_raw_closed_by_peer(&quiet[i], left > 0 ? (unsigned)(left * 1000) : 0);
  }
  printf("silent connections dropped by the targets: %d of %d after %.1f s\n", closed, SILENT,
         fault_now() - t0);
  assert_int_equal(closed, SILENT);
  /* After a completed handshake an idle connection is legitimate. */
  assert_false(fault_raw_closed_by_peer(&idle, 200));
  assert_int_equal(fault_raw_write(&idle, E.open.addr + 3 * GUARD, "ok", 2, 1), FERRY_OK);
  for (int i = 0; i < SILENT; i++)
    fault_raw_close(&quiet[i]);
  fault_raw_close(&idle);
}

/* Frames with a valid magic and random everything else, on handshaken
 * connections, aimed at the scratch area: whatever is refused is refused
 * cleanly, whatever is accepted lands inside registered memory. */
static void test_random_frames(void **state) {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  uint8_t body[4096];
  int rounds = 400, closed = 0, answered = 0;
  for (int i = 0; i < rounds; i++) {
    fault_raw r;
    raw_connect(&r, &E.open);
    assert_int_equal(fault_raw_handshake(&r, NULL), FERRY_OK);
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ferry_frame_header h = {.type = (uint8_t)(1 + x % 14),
                            .flags = (uint8_t)((x >> 8) % 3 == 0),
                            .count = (uint32_t)((x >> 12) % 4),
                            .body_len = (x >> 20) % sizeof body,
                            .id = x};
    fault_pattern(body, sizeof body, x);
    /* Three times in four, a frame whose lengths agree, so it gets past the
     * header checks: a WRITE or READ into the scratch area (or across the
     * end of the buffer), or a NOTIFY with random name and data. */
    int mode = (int)((x >> 40) % 4);
    if (mode == 1 || mode == 2) {
      h.type = mode == 1 ? FERRY_FRAME_WRITE : FERRY_FRAME_READ;
      h.count = 1 + (uint32_t)((x >> 44) % 3);
      uint64_t payload = 0;
      for (uint32_t s = 0; s < h.count; s++) {
        ferry_region seg = {E.open.addr + 3 * GUARD + ((x >> (s + 3)) % 4096),
                            1 + (x >> (s + 7)) % 512};
        if ((x >> 50) % 5 == 0)
          seg.addr = E.open.addr + E.open.size - 10;
        ferry_wire_segments_encode(body + 16 * s, &seg, 1);
        payload += seg.length;
      }
      h.body_len = 16 * h.count + (mode == 1 ? payload + (h.flags ? 4 : 0) : 0);
      if (mode == 2)
        h.flags = (uint8_t)((x >> 9) % 2);
    } else if (mode == 3) {
      h.type = FERRY_FRAME_NOTIFY;
      h.flags = 0;
      h.count = 0;
      uint16_t name_len = (uint16_t)((x >> 24) % 300);
      body[0] = (uint8_t)name_len;
      body[1] = (uint8_t)(name_len >> 8);
      h.body_len = 2 + name_len + (x >> 33) % 1000;
    }
    fault_raw_send_frame(&r, &h, body);
    shutdown(r.fd, SHUT_WR);
    ferry_frame_header rh;
    int eof = 0;
    if (fault_raw_recv_header(&r, &rh, &eof) == FERRY_OK)
      answered++;
    closed += fault_raw_closed_by_peer(&r, 3000);
    fault_raw_close(&r);
  }
  printf("random frames: %d sent, %d answered, %d connections closed by the target\n", rounds,
         answered, closed);
  assert_int_equal(closed, rounds);
}

int main(void) {
  fault_watchdog(240, "hostile peers");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_garbage_and_foreign_protocols),
      cmocka_unit_test(test_truncated_frames),
      cmocka_unit_test(test_huge_length_fields),
      cmocka_unit_test(test_out_of_region_addresses),
      cmocka_unit_test(test_wrong_secret),
      cmocka_unit_test(test_replayed_proof),
      cmocka_unit_test(test_silent_peers),
      cmocka_unit_test(test_random_frames),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
