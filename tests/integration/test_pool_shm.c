/* test_pool_shm.c - the message handoff over shm: LANDED notices posted
 * to the link's ring in shared memory and credits coming back the same
 * way (shm.c, shm_service.c), between engines of this process and a
 * sender in another (this program started again: child.h). The hostile cases post forged entries by
 * hand as a same-host process could (a raw shm link that claims the sender's identity, as the
 * service verifies it: an engine id read back from the caller's memory). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "base/clock.h"
#include "child.h"
#include "core/engine.h"
#include "core/peer.h"
#include "ferry.h"
#include "harness.h"
#include "holdproxy.h"
#include "rawclient.h"
#include "transport/shm.h"
#include "wire/wire.h"

#define KiB 1024u
#define MiB (1024u * 1024u)

/* connect_timeout_ms 0: the default. As a receiver, one sender may take
 * a whole pool (pool_sender_bytes): these cases are about room, not shares. */
static ferry_engine *engine_with(uint16_t port, uint32_t connect_timeout_ms) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.port = port;
  if (connect_timeout_ms)
    cfg.connect_timeout_ms = connect_timeout_ms;
  cfg.transports = FERRY_TRANSPORT_TCP | FERRY_TRANSPORT_SHM;
  cfg.pool_sender_bytes = SIZE_MAX;
  ferry_engine *e = NULL;
  if (ferry_engine_create(&cfg, &e))
    return NULL;
  return e;
}

static ferry_engine *engine_on(uint16_t port) { return engine_with(port, 0); }

typedef struct pair {
  ferry_engine *rx, *tx;
  ferry_pool *pool;
  uint8_t *out;
} pair;

/* tx_connect_ms: the sender's connect_timeout_ms (0: the default). */
static pair *pair_with(size_t pool_size, uint32_t tx_connect_ms) {
  pair *p = calloc(1, sizeof *p);
  p->rx = engine_on(0);
  p->tx = engine_with(0, tx_connect_ms);
  assert_non_null(p->rx);
  assert_non_null(p->tx);
  assert_int_equal(ferry_pool_create(p->rx, "emb", NULL, pool_size, &p->pool), FERRY_OK);
  assert_int_equal(ferry_memory_alloc(p->tx, 4 * MiB, (void **)&p->out), FERRY_OK);
  test_fill_random(p->out, 4 * MiB, 21);
  return p;
}

static pair *pair_new(size_t pool_size) { return pair_with(pool_size, 0); }

static void pair_free(pair *p) {
  if (p->tx)
    ferry_engine_destroy(p->tx);
  if (p->rx)
    ferry_engine_destroy(p->rx);
  free(p);
}

static ferry_status send_tag(pair *p, const char *tag, size_t offset, size_t len, int64_t timeout) {
  return ferry_send(p->tx, ferry_engine_name(p->rx), "emb", tag, strlen(tag), p->out + offset, len,
                    timeout, 0);
}

static void expect(pair *p, const char *tag, size_t offset, size_t len) {
  ferry_message m;
  if (ferry_recv(p->rx, p->pool, tag, strlen(tag), 10000, &m))
    fail_msg("recv %s: %s", tag, ferry_last_error());
  assert_int_equal(m.length, len);
  assert_memory_equal(m.addr, p->out + offset, len);
  assert_int_equal(ferry_pool_release(p->rx, p->pool, m.slot), FERRY_OK);
}

static void expect_nothing(pair *p) {
  ferry_message m;
  assert_int_equal(ferry_recv(p->rx, p->pool, NULL, 0, 0, &m), FERRY_ETIMEDOUT);
}

/* The receiver's pool counters: messages landed, and of them posted. */
typedef struct landed {
  uint64_t all, inband;
} landed;

static landed landed_at(ferry_engine *e) {
  ferry_stats *st = NULL;
  assert_int_equal(ferry_stats_snapshot(e, &st), FERRY_OK);
  landed l = {st->pool_messages_landed, st->pool_landed_inband};
  ferry_stats_free(st);
  return l;
}

static void require_shm(pair *p) {
  unsigned used = 0;
  assert_int_equal(ferry_peer_transport(p->tx, ferry_engine_name(p->rx), &used), FERRY_OK);
  if (used != FERRY_TRANSPORT_SHM)
    skip(); /* no CMA here (ptrace scope): shm is not used at all */
}

/* The same through a proxy in front of rx (target), which goes with p. */
static void require_shm_through(pair *p, hold_proxy *proxy, const char *target) {
  unsigned used = 0;
  assert_int_equal(ferry_peer_transport(p->tx, target, &used), FERRY_OK);
  if (used != FERRY_TRANSPORT_SHM) {
    hold_proxy_stop(proxy);
    pair_free(p);
    skip();
  }
}

/* A first message, received: the pair uses shm (or the test is skipped). */
static void warm_up(pair *p) {
  assert_int_equal(send_tag(p, "warm", 0, 64 * KiB, -1), FERRY_OK);
  require_shm(p);
  expect(p, "warm", 0, 64 * KiB);
}

/* Every notice rides the ring: none is served from a control frame. */
static void notices_ride_the_ring(void **state) {
  (void)state;
  pair *p = pair_new(1 * MiB);
  warm_up(p);
  for (unsigned i = 0; i < 64; i++) {
    char tag[16];
    snprintf(tag, sizeof tag, "m%u", i);
    assert_int_equal(send_tag(p, tag, i * KiB, 64 * KiB, -1), FERRY_OK);
    expect(p, tag, i * KiB, 64 * KiB);
  }
  landed l = landed_at(p->rx);
  assert_int_equal(l.all, 65);
  assert_int_equal(l.inband, 65); /* posted: no control frame of their own */
  pair_free(p);
}

/* No control round trip per message in steady state: once the sender
 * holds two credits (a batch of two asks two grants, each notice brings
 * one back), the control connection (through a proxy) holds back every
 * POOL_REPLY, and 64 more sends go through without one. */
static void steady_sends_cross_no_socket(void **state) {
  (void)state;
  pair *p = pair_new(1 * MiB);
  hold_proxy *proxy = hold_proxy_start(ferry_engine_port(p->rx));
  assert_non_null(proxy);
  const char *target = hold_proxy_target(proxy);
  ferry_send_item items[2] = {{"a", 1, p->out, 64 * KiB, 0}, {"b", 1, p->out + KiB, 64 * KiB, 0}};
  assert_int_equal(ferry_send_batch(p->tx, target, "emb", items, 2, -1, 0), FERRY_OK);
  require_shm_through(p, proxy, target);
  expect(p, "a", 0, 64 * KiB);
  expect(p, "b", KiB, 64 * KiB);
  hold_proxy_hold(proxy, FERRY_FRAME_POOL_REPLY);
  for (unsigned i = 0; i < 64; i++) {
    char tag[16];
    snprintf(tag, sizeof tag, "s%u", i);
    if (ferry_send(p->tx, target, "emb", tag, strlen(tag), p->out + i * KiB, 64 * KiB, -1, 0))
      fail_msg("send %u: %s", i, ferry_last_error());
    expect(p, tag, i * KiB, 64 * KiB);
  }
  assert_int_equal(hold_proxy_wait_held(proxy, 1, 0), -1); /* no POOL frame was sent */
  hold_proxy_release(proxy);
  ferry_engine_destroy(p->tx);
  p->tx = NULL;
  hold_proxy_stop(proxy);
  pair_free(p);
}

/* A sender thread's one send of 1 MiB, to be waited for. */
typedef struct sending {
  pair *p;
  const char *target, *tag;
  pid_t tid;
  ferry_status st;
  int done;
} sending;

static void *send_thread(void *arg) {
  sending *s = arg;
  __atomic_store_n(&s->tid, gettid(), __ATOMIC_RELEASE);
  s->st = ferry_send(s->p->tx, s->target, "emb", s->tag, strlen(s->tag), s->p->out, MiB, -1, 0);
  __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* The thread's state in /proc ('S': asleep), 0 when unreadable. */
static char thread_state(pid_t tid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f)
    fclose(f);
  buf[n] = '\0';
  const char *close_paren = strrchr(buf, ')');
  return close_paren && close_paren[1] == ' ' ? close_paren[2] : 0;
}

/* Polls cond for up to 20 s (a state to reach, not a performance bound). */
static int wait_for(int (*cond)(sending *), sending *s) {
  for (int i = 0; i < 20000; i++) {
    if (cond(s))
      return 1;
    usleep(1000);
  }
  return 0;
}

static int asleep(sending *s) {
  pid_t tid = __atomic_load_n(&s->tid, __ATOMIC_ACQUIRE);
  return tid && thread_state(tid) == 'S';
}

static int finished(sending *s) { return __atomic_load_n(&s->done, __ATOMIC_ACQUIRE); }

static void *recv_thread(void *arg) {
  sending *s = arg;
  __atomic_store_n(&s->tid, gettid(), __ATOMIC_RELEASE);
  ferry_message m;
  s->st = ferry_recv(s->p->rx, s->p->pool, s->tag, strlen(s->tag), 60000, &m);
  if (!s->st)
    s->st = ferry_pool_release(s->p->rx, s->p->pool, m.slot);
  __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* A receiver asleep in ferry_recv wakes when a posted notice lands
 * (ferry_pools_landed_wake after the service's batch), not at the end of
 * its recv's 60 s: the test waits 20 s at most. */
static void a_posted_message_wakes_its_receiver(void **state) {
  (void)state;
  pair *p = pair_new(1 * MiB);
  warm_up(p);
  sending r = {.p = p, .tag = "late"};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, recv_thread, &r), 0);
  int slept = wait_for(asleep, &r);
  ferry_status sent = send_tag(p, "late", 0, 64 * KiB, -1);
  int woke = wait_for(finished, &r);
  pthread_join(t, NULL);
  assert_true(slept);
  assert_int_equal(sent, FERRY_OK);
  assert_true(woke);
  assert_int_equal(r.st, FERRY_OK);
  assert_int_equal(landed_at(p->rx).inband, 2); /* both posted */
  pair_free(p);
}

static void send_mib(pair *p, const char *target, const char *tag) {
  if (ferry_send(p->tx, target, "emb", tag, strlen(tag), p->out, MiB, -1, 0))
    fail_msg("send %s: %s", tag, ferry_last_error());
}

/* A sender with no credit left while enough of its notices asking for
 * one are not served yet sleeps until the receiver's service serves them
 * (the credit eventfd), instead of asking the control connection. At
 * 1 MiB a sender keeps 4 credits: a batch of 4 puts 4 into the round,
 * then, with the service held, b0..b3 use them and c finds none. Every
 * POOL_REPLY is held (a control grant cannot complete), the thread
 * sending c is seen asleep, the service goes on, and c goes through on a
 * credit b0..b3 bring. The sender's connect timeout (which bounds that
 * sleep) is far longer than the wait for c here, so only the wake ends
 * the sleep in time. */
static void a_sender_without_credits_sleeps_until_they_come(void **state) {
  (void)state;
  pair *p = pair_with(16 * MiB, 40 * 1000);
  hold_proxy *proxy = hold_proxy_start(ferry_engine_port(p->rx));
  assert_non_null(proxy);
  const char *target = hold_proxy_target(proxy);
  send_mib(p, target, "warm"); /* the connections are all up before credits count */
  expect(p, "warm", 0, MiB);
  ferry_send_item items[4] = {{"a0", 2, p->out, MiB, 0},
                              {"a1", 2, p->out, MiB, 0},
                              {"a2", 2, p->out, MiB, 0},
                              {"a3", 2, p->out, MiB, 0}};
  assert_int_equal(ferry_send_batch(p->tx, target, "emb", items, 4, -1, 0), FERRY_OK);
  require_shm_through(p, proxy, target);
  for (unsigned i = 0; i < 4; i++)
    expect(p, items[i].tag, 0, MiB);
  hold_proxy_hold(proxy, FERRY_FRAME_POOL_REPLY);
  ferry_shm_service_hold(p->rx, 1);
  const char *b[] = {"b0", "b1", "b2", "b3"};
  for (unsigned i = 0; i < 4; i++)
    send_mib(p, target, b[i]);
  sending s = {.p = p, .target = target, .tag = "c"};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, send_thread, &s), 0);
  int slept = wait_for(asleep, &s);
  ferry_shm_service_hold(p->rx, 0);
  int done = wait_for(finished, &s);
  if (!slept || !done || s.st)
    hold_proxy_release(proxy); /* so the thread can end */
  pthread_join(t, NULL);
  assert_true(slept);
  assert_true(done);
  if (s.st)
    fail_msg("send c: %s", ferry_last_error());
  assert_int_equal(hold_proxy_wait_held(proxy, 1, 0), -1); /* no POOL frame was sent */
  for (unsigned i = 0; i < 4; i++)
    expect(p, b[i], 0, MiB);
  expect(p, "c", 0, MiB);
  hold_proxy_release(proxy);
  ferry_engine_destroy(p->tx);
  p->tx = NULL;
  hold_proxy_stop(proxy);
  pair_free(p);
}

/* ---- a raw link that posts by hand --------------------------------------------------- */

typedef struct raw_link {
  int fd, efd;
  shm_post *post;
} raw_link;

/* Connects to rx's service as tx would (tx's engine id, where tx's
 * memory holds it), so the service hands over a post page. */
static void raw_attach(raw_link *r, ferry_engine *rx, ferry_engine *tx) {
  struct sockaddr_un sa;
  unsigned len;
  assert_int_equal(shm_sockaddr(rx->shm_path, &sa, &len), 0);
  r->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  assert_int_equal(connect(r->fd, (struct sockaddr *)&sa, len), 0);
  shm_msg m;
  assert_int_equal(shm_msg_recv(r->fd, &m, SHM_GREETING, NULL, NULL, 0), 0);
  shm_msg_init(&m, SHM_HELLO);
  m.engine_id = tx->instance_id;
  m.probe_addr = (uint64_t)(uintptr_t)&tx->instance_id;
  snprintf(m.name, sizeof m.name, "forger");
  assert_int_equal(shm_msg_send(r->fd, &m, NULL, 0, 0), 0);
  int fds[SHM_MAX_FDS], nfds = 0;
  assert_int_equal(shm_msg_recv(r->fd, &m, SHM_ATTACH, fds, &nfds, 0), 0);
  assert_int_equal(nfds, 5);
  r->post = mmap(NULL, sizeof(shm_post), PROT_READ | PROT_WRITE, MAP_SHARED, fds[2], 0);
  assert_true(r->post != MAP_FAILED);
  r->efd = fds[3];
  close(fds[4]);
  close(fds[0]);
  close(fds[1]);
  close(fds[2]);
}

static void raw_close(raw_link *r) {
  munmap(r->post, sizeof(shm_post));
  close(r->efd);
  close(r->fd);
}

/* Puts an entry at the ring's next index (seq as given) and publishes it. */
static void raw_post(raw_link *r, uint64_t seq, const void *body, uint64_t len) {
  uint64_t head = r->post->head;
  shm_notice *n = &r->post->notices[head % SHM_NOTICES];
  memcpy(n->body, body, len < sizeof n->body ? len : sizeof n->body);
  n->len = len;
  __atomic_store_n(&n->seq, seq, __ATOMIC_RELEASE);
  __atomic_store_n(&r->post->head, head + 1, __ATOMIC_SEQ_CST);
}

static void raw_kick(raw_link *r) {
  uint64_t one = 1;
  assert_int_equal(write(r->efd, &one, sizeof one), sizeof one);
}

/* Waits (bounded) until the service consumed every entry posted. */
static void raw_drained(raw_link *r) {
  for (int i = 0; i < 10000; i++) {
    if (__atomic_load_n(&r->post->tail, __ATOMIC_ACQUIRE) == r->post->head)
      return;
    usleep(1000);
  }
  fail_msg("the service did not drain the ring in 10 s");
}

static size_t landed_body(uint8_t *out, uint64_t grant, uint64_t length, const char *tag,
                          unsigned op) {
  ferry_pool_req r = {.op = op,
                      .grant = grant,
                      .length = length,
                      .pool = "emb",
                      .pool_len = 3,
                      .tag = tag,
                      .tag_len = strlen(tag)};
  return ferry_wire_pool_encode(out, &r);
}

/* A grant of length bytes in target's pool "emb" for engine e, asked by
 * hand on its control connection: its id (its address with want_addr), 0
 * on failure. */
static uint64_t grant_by_hand(ferry_engine *e, const char *target, uint64_t length, int want_addr) {
  uint8_t req[FERRY_WIRE_POOL_MAX], reply[FERRY_WIRE_POOL_REPLY_SIZE];
  ferry_pool_req r = {
      .op = FERRY_POOL_GRANT, .length = length, .wait_ms = 20000, .pool = "emb", .pool_len = 3};
  size_t n = ferry_wire_pool_encode(req, &r);
  ferry_peer *peer;
  ferry_pool_grant g = {0, 0, 0, 0};
  if (!ferry_peer_get(e, target, &peer) &&
      !ferry_peer_pool(peer, req, n, reply, ferry_now_ns() + 30000000000ull))
    ferry_wire_grant_decode(reply, &g);
  return want_addr ? g.addr : g.id;
}

/* Forged entries of every kind are refused one by one; the ring goes on
 * and a real send afterwards is delivered, alone. The forger speaks as
 * tx: its notices may name tx's slots, and no other's. */
static void forged_ring_entries_are_refused(void **state) {
  (void)state;
  pair *p = pair_new(1 * MiB);
  assert_int_equal(send_tag(p, "first", 0, 64 * KiB, -1), FERRY_OK);
  require_shm(p);
  expect(p, "first", 0, 64 * KiB);
  ferry_engine *other = engine_on(0);
  assert_non_null(other);
  uint64_t theirs = grant_by_hand(other, ferry_engine_name(p->rx), 64 * KiB, 0);
  uint64_t ours = grant_by_hand(p->tx, ferry_engine_name(p->rx), 64 * KiB, 0);
  assert_true(theirs && ours);
  raw_link r;
  raw_attach(&r, p->rx, p->tx);
  uint8_t body[FERRY_WIRE_POOL_MAX];
  uint8_t junk[FERRY_WIRE_POOL_MAX];
  memset(junk, 0xa5, sizeof junk);
  raw_post(&r, 1, body, landed_body(body, theirs, 64 * KiB, "theirs", FERRY_POOL_LANDED));
  raw_post(&r, 2, body, landed_body(body, ours, 64 * KiB + 64, "too-long", FERRY_POOL_LANDED));
  raw_post(&r, 9, body, landed_body(body, ours, 64 * KiB, "torn", FERRY_POOL_LANDED));
  raw_post(&r, 4, junk, FERRY_WIRE_POOL_MAX + 1); /* longer than a POOL body */
  raw_post(&r, 5, junk, 64);                      /* not a POOL body */
  raw_post(&r, 6, body, landed_body(body, 0, 64 * KiB, "grant", FERRY_POOL_GRANT));
  raw_kick(&r);
  raw_drained(&r);
  assert_int_equal(landed_at(p->rx).all, 1);
  assert_int_equal(__atomic_load_n(&r.post->credits_given, __ATOMIC_ACQUIRE), 0);
  expect_nothing(p);
  assert_int_equal(send_tag(p, "after", 64 * KiB, 64 * KiB, -1), FERRY_OK);
  expect(p, "after", 64 * KiB, 64 * KiB);
  expect_nothing(p);
  /* Impossible indices cut the link off; the real sender goes on. */
  __atomic_store_n(&r.post->head, r.post->head + 1000, __ATOMIC_SEQ_CST);
  raw_kick(&r);
  struct pollfd pfd = {r.fd, POLLRDHUP, 0};
  assert_int_equal(poll(&pfd, 1, 10000), 1);
  assert_int_equal(send_tag(p, "last", 0, 64 * KiB, -1), FERRY_OK);
  expect(p, "last", 0, 64 * KiB);
  raw_close(&r);
  ferry_engine_destroy(other);
  pair_free(p);
}

/* ---- a sender that dies after its data, before its notice ---------------------------- */

/* Role "dying-sender" TARGET: an engine that sends "done" into the pool
 * once normally (so it holds credits and a live link), then copies a
 * message's data into the slot of a credit and stops without posting,
 * saying 'w' on stdout; the parent kills it. */
static int dying_sender(int argc, char **argv) {
  if (argc != 1)
    return 1;
  const char *target = argv[0];
  ferry_engine *e = engine_on(0);
  void *buf;
  if (!e || ferry_memory_alloc(e, 1 * MiB, &buf))
    return 2;
  memset(buf, 0x5a, 1 * MiB);
  if (ferry_send(e, target, "emb", "done", 4, buf, 256 * KiB, -1, 0))
    return 3;
  /* A grant of its own, by hand, written into and never noticed. */
  uint64_t addr = grant_by_hand(e, target, 1 * MiB, 1);
  if (!addr)
    return 4;
  if (ferry_transfer_sync(e, target, FERRY_OP_WRITE, buf, addr, 1 * MiB))
    return 5;
  char c = 'w';
  if (write(STDOUT_FILENO, &c, 1) != 1)
    return 6;
  pause();
  return 0;
}

static void sender_killed_before_its_notice(void **state) {
  (void)state;
  ferry_engine *rx = engine_on(0);
  assert_non_null(rx);
  ferry_pool *pool;
  /* Room for the killed one's message behind "done" and its credit, nothing more. */
  assert_int_equal(ferry_pool_create(rx, "emb", NULL, 1 * MiB + 512 * KiB, &pool), FERRY_OK);
  const char *args[] = {ferry_engine_name(rx), NULL};
  int ready;
  pid_t child = test_child_start("dying-sender", args, NULL, &ready);
  assert_true(child > 0);
  ferry_message m; /* the sender's start and first contact: not the point */
  assert_int_equal(ferry_recv(rx, pool, "done", 4, TEST_SETUP_MS, &m), FERRY_OK);
  int shm = landed_at(rx).inband == 1;
  assert_int_equal(ferry_pool_release(rx, pool, m.slot), FERRY_OK);
  char c = 0;
  ssize_t got = read(ready, &c, 1);
  kill(child, SIGKILL);
  int status;
  assert_int_equal(waitpid(child, &status, 0), child);
  if (got != 1)
    fail_msg("the child failed before it wrote: exit %d",
             WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  close(ready);
  if (!shm) {
    ferry_engine_destroy(rx);
    skip();
  }
  /* Its slot comes back (this send waits for it) and never shows up. */
  pair p = {.rx = rx, .pool = pool};
  p.tx = engine_on(0);
  assert_non_null(p.tx);
  assert_int_equal(ferry_memory_alloc(p.tx, 4 * MiB, (void **)&p.out), FERRY_OK);
  test_fill_random(p.out, 4 * MiB, 22);
  if (send_tag(&p, "next", 0, 1 * MiB, 20000))
    fail_msg("send after the kill: %s", ferry_last_error());
  expect(&p, "next", 0, 1 * MiB);
  expect_nothing(&p);
  ferry_engine_destroy(p.tx);
  ferry_engine_destroy(rx);
}

/* ---- a receiver that restarts ----------------------------------------------------------- */

/* The sender holds credits of the old instance (the pool had room for
 * them); after the restart its next send reaches the new one. */
static void restarted_receiver_voids_credits(void **state) {
  (void)state;
  pair *p = pair_new(4 * MiB);
  for (int i = 0; i < 8; i++) {
    assert_int_equal(send_tag(p, "old", 0, 256 * KiB, -1), FERRY_OK);
    require_shm(p);
    expect(p, "old", 0, 256 * KiB);
  }
  uint16_t port = ferry_engine_port(p->rx);
  ferry_engine_destroy(p->rx);
  p->rx = NULL;
  for (int i = 0; i < 100 && !p->rx; i++) /* the port is free once the old listener closed */
    if (!(p->rx = engine_on(port)))
      usleep(50 * 1000);
  assert_non_null(p->rx);
  /* Its pool elsewhere than the old one: an old credit would miss it. */
  void *filler;
  assert_int_equal(ferry_memory_alloc(p->rx, 8 * MiB, &filler), FERRY_OK);
  assert_int_equal(ferry_pool_create(p->rx, "emb", NULL, 4 * MiB, &p->pool), FERRY_OK);
  if (send_tag(p, "new", 0, 256 * KiB, -1))
    fail_msg("send after the restart: %s", ferry_last_error());
  expect(p, "new", 0, 256 * KiB);
  assert_int_equal(landed_at(p->rx).inband, 1);
  pair_free(p);
}

/* A send after a restart that no cached grant fits (the sender holds
 * credits of a smaller size): its grant comes from the new incarnation
 * (the control connection reconnects), so it is tried again there
 * instead of failing. */
static void send_after_a_restart_without_a_fitting_credit(void **state) {
  (void)state;
  pair *p = pair_new(4 * MiB);
  uint16_t port = ferry_engine_port(p->rx);
  for (int i = 0; i < 8; i++) {
    assert_int_equal(send_tag(p, "small", 0, 256 * KiB, -1), FERRY_OK);
    expect(p, "small", 0, 256 * KiB);
  }
  ferry_engine_destroy(p->rx);
  p->rx = NULL;
  for (int i = 0; i < 100 && !p->rx; i++)
    if (!(p->rx = engine_on(port)))
      usleep(50 * 1000);
  assert_non_null(p->rx);
  assert_int_equal(ferry_pool_create(p->rx, "emb", NULL, 4 * MiB, &p->pool), FERRY_OK);
  if (send_tag(p, "large", 0, 1 * MiB, -1))
    fail_msg("send after the restart: %s", ferry_last_error());
  expect(p, "large", 0, 1 * MiB);
  pair_free(p);
}

/* A second sender's send of the whole pool, not waiting for room: it
 * fits only while nobody else holds a slot of it. */
static ferry_status whole_pool_send(pair *p, ferry_engine *other, void *buf) {
  return ferry_send(other, ferry_engine_name(p->rx), "emb", "all", 3, buf, 1 * MiB, 0,
                    FERRY_SEND_NOWAIT);
}

/* A pair whose receiver drops connections idle for idle_ms (its pool:
 * pool_size bytes). */
static pair *pair_idling_out(size_t pool_size, uint32_t idle_ms) {
  pair *p = calloc(1, sizeof *p);
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_TCP | FERRY_TRANSPORT_SHM;
  cfg.idle_timeout_ms = idle_ms;
  cfg.pool_sender_bytes = SIZE_MAX; /* whole_pool_send */
  assert_int_equal(ferry_engine_create(&cfg, &p->rx), FERRY_OK);
  assert_int_equal(ferry_pool_create(p->rx, "emb", NULL, pool_size, &p->pool), FERRY_OK);
  p->tx = engine_on(0);
  assert_non_null(p->tx);
  assert_int_equal(ferry_memory_alloc(p->tx, 4 * MiB, (void **)&p->out), FERRY_OK);
  test_fill_random(p->out, 4 * MiB, 21);
  return p;
}

/* Waits until rx dropped the control connections tx left idle: a
 * witness connected after tx's last request is dropped after them. */
static void wait_for_idle_out(pair *p) {
  int witness = raw_connect(ferry_engine_port(p->rx));
  assert_true(witness >= 0);
  assert_int_equal(raw_hello(witness, FERRY_WIRE_VERSION_MIN, FERRY_WIRE_VERSION_MAX, NULL, 0), 0);
  assert_true(raw_closed_by_peer(witness, 20000));
  close(witness);
}

static uint64_t bytes_granted(ferry_engine *e) {
  ferry_stats *st = NULL;
  assert_int_equal(ferry_stats_snapshot(e, &st), FERRY_OK);
  uint64_t n = st->pool_bytes_granted;
  ferry_stats_free(st);
  return n;
}

/* A steady shm sender crosses no control connection, so the receiver
 * idles its control connections out while it sends; its link still
 * carries its notices, and counts as one of its connections: its slots
 * stay. Here its notice is posted (the service held, so it is not served
 * yet) before the idle-out, and served after: it must land. Taking the
 * slots back when the control connections went lost that message, with
 * the send reported done. */
static void steady_sender_outlives_idle_outs(void **state) {
  (void)state;
  pair *p = pair_idling_out(1 * MiB, 500);
  warm_up(p);
  ferry_shm_service_hold(p->rx, 1);
  assert_int_equal(send_tag(p, "held", KiB, 64 * KiB, -1), FERRY_OK);
  wait_for_idle_out(p);
  assert_true(bytes_granted(p->rx) >= 64 * KiB); /* its slot is still granted */
  ferry_shm_service_hold(p->rx, 0);
  expect(p, "held", KiB, 64 * KiB);
  for (unsigned i = 0; i < 16; i++) { /* and it goes on sending */
    char tag[16];
    snprintf(tag, sizeof tag, "s%u", i);
    if (send_tag(p, tag, i * KiB, 64 * KiB, -1))
      fail_msg("send %s: %s", tag, ferry_last_error());
    expect(p, tag, i * KiB, 64 * KiB);
  }
  pair_free(p);
}

/* A link the receiver's service drops (here: cut while the service is
 * held) still has a notice of the sender's in its ring: the service
 * serves its ring once more before it lets the link go, so the message
 * lands. Dropped unserved, it was lost, with the send reported done. */
static void notice_posted_before_a_cut_is_served(void **state) {
  (void)state;
  pair *p = pair_new(1 * MiB);
  warm_up(p);
  ferry_shm_service_hold(p->rx, 1);
  assert_int_equal(send_tag(p, "held", KiB, 64 * KiB, -1), FERRY_OK);
  assert_int_equal(landed_at(p->rx).all, 1); /* posted, not served yet */
  ferry_shm_service_cut_links(p->rx);
  ferry_shm_service_hold(p->rx, 0);
  expect(p, "held", KiB, 64 * KiB);
  if (send_tag(p, "after", 0, 64 * KiB, -1)) /* on a new link, or the control connection */
    fail_msg("send after the cut: %s", ferry_last_error());
  expect(p, "after", 0, 64 * KiB);
  pair_free(p);
}

/* The receiver takes back a sender's slots when every connection of it
 * ends while the sender lives on (here: the receiver idles its control
 * connections out soon, and its service cuts the link); credits granted
 * before must stop working, or the next send copies into a slot that is
 * no longer its own and its notice is refused: a message the send
 * reported sent, lost. The post page's reclaim count and the link's
 * hang-up void them; the send then asks for a grant and lands. */
static void reclaimed_slots_void_credits(void **state) {
  (void)state;
  pair *p = pair_idling_out(1 * MiB, 1500);
  ferry_engine *other = engine_on(0);
  assert_non_null(other);
  uint8_t *big;
  ferry_message m;
  assert_int_equal(ferry_memory_alloc(other, 1 * MiB, (void **)&big), FERRY_OK);
  /* A batch of four into emb brings four credits. Messages into aux come
   * after them in the ring: once one was received they are there, and the
   * next send (to aux) caches them. One more send into emb then uses one
   * and leaves the credit its notice brings in the ring: tx holds emb
   * credits both cached and not taken yet. */
  ferry_pool *aux;
  assert_int_equal(ferry_pool_create(p->rx, "aux", NULL, 1 * MiB, &aux), FERRY_OK);
  ferry_send_item items[4] = {{"a", 1, p->out, 64 * KiB, 0},
                              {"a", 1, p->out, 64 * KiB, 0},
                              {"a", 1, p->out, 64 * KiB, 0},
                              {"a", 1, p->out, 64 * KiB, 0}};
  assert_int_equal(ferry_send_batch(p->tx, ferry_engine_name(p->rx), "emb", items, 4, -1, 0),
                   FERRY_OK);
  require_shm(p);
  for (unsigned i = 0; i < 4; i++)
    expect(p, "a", 0, 64 * KiB);
  for (unsigned i = 0; i < 2; i++) {
    assert_int_equal(
        ferry_send(p->tx, ferry_engine_name(p->rx), "aux", "x", 1, p->out, 4 * KiB, -1, 0),
        FERRY_OK);
    assert_int_equal(ferry_recv(p->rx, aux, "x", 1, 10000, &m), FERRY_OK);
    assert_int_equal(ferry_pool_release(p->rx, aux, m.slot), FERRY_OK);
  }
  assert_int_equal(send_tag(p, "c", 0, 64 * KiB, -1), FERRY_OK);
  expect(p, "c", 0, 64 * KiB);
  assert_int_equal(whole_pool_send(p, other, big), FERRY_EBUSY); /* tx holds credits */
  ferry_shm_service_cut_links(p->rx);
  ferry_status st = FERRY_EBUSY;
  for (int i = 0; i < 1000 && st == FERRY_EBUSY; i++)
    if ((st = whole_pool_send(p, other, big)) == FERRY_EBUSY)
      usleep(10 * 1000); /* polls for the reclaim, which runs on rx's server thread */
  assert_int_equal(st, FERRY_OK);
  assert_int_equal(ferry_recv(p->rx, p->pool, "all", 3, 10000, &m), FERRY_OK);
  assert_int_equal(ferry_pool_release(p->rx, p->pool, m.slot), FERRY_OK);
  if (send_tag(p, "after", KiB, 64 * KiB, -1))
    fail_msg("send after the reclaim: %s", ferry_last_error());
  expect(p, "after", KiB, 64 * KiB);
  ferry_engine_destroy(other);
  pair_free(p);
}

int main(int argc, char **argv) {
  const test_child_role roles[] = {{"dying-sender", dying_sender}};
  test_child_main(argc, argv, roles, sizeof roles / sizeof *roles);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sender_killed_before_its_notice),
      cmocka_unit_test(notices_ride_the_ring),
      cmocka_unit_test(steady_sends_cross_no_socket),
      cmocka_unit_test(a_sender_without_credits_sleeps_until_they_come),
      cmocka_unit_test(a_posted_message_wakes_its_receiver),
      cmocka_unit_test(forged_ring_entries_are_refused),
      cmocka_unit_test(restarted_receiver_voids_credits),
      cmocka_unit_test(send_after_a_restart_without_a_fitting_credit),
      cmocka_unit_test(reclaimed_slots_void_credits),
      cmocka_unit_test(steady_sender_outlives_idle_outs),
      cmocka_unit_test(notice_posted_before_a_cut_is_served),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
