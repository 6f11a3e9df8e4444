/* test_multitransport.c - a peer reachable over two transports keeps both:
 * fabric (tcp;ofi_rxm provider) carries the data, tcp stands by. When
 * fabric's connections are cut, the chunks lost with them move to tcp and
 * the transfers complete; after fabric's back-off it carries again. Both
 * engines live in this process, pinned to 127.0.0.1; every transfer is
 * verified byte for byte and which transport carried it comes from
 * ferry_stats (bytes per peer and transport, and per rail); the log lines
 * that say so are watched through a log handler. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"
#include "rig.h"

#define MiB (1024ull * 1024ull)
#define BIG (16 * MiB)

/* connections: 2 for an initiator, so tcp's channels fill its pool while
 * tcp carries and fabric, back, must take them over (the pool's limit
 * counts every transport's channels). */
static ferry_engine *two_transport_engine(unsigned connections) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.tcp_connections = connections;
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = FERRY_TRANSPORT_FABRIC | FERRY_TRANSPORT_TCP; /* not shm: same host */
  cfg.fabric_provider = "tcp;ofi_rxm";
  cfg.timeout_ms = 60000;
  return test_engine_create(&cfg);
}

/* Log lines seen (any thread), each also shown on stderr. */
static const char *const watched[] = {"using fabric; standby tcp; shm: not enabled here",
                                      "data goes over tcp", "rail 0 (fabric) is up again"};
enum { USING, FAILOVER, BACK };
static unsigned seen[3];

static void watch_log(const ferry_log_record *rec, void *arg) {
  fprintf(stderr, "%s\n", rec->line);
  for (int i = 0; i < 3; i++)
    if (strstr(rec->message, watched[i]))
      __atomic_fetch_add(&seen[i], 1, __ATOMIC_RELAXED);
}

static unsigned lines(int which) { return __atomic_load_n(&seen[which], __ATOMIC_RELAXED); }

static int watch_start(void **state) {
  memset(seen, 0, sizeof seen);
  ferry_log_set_handler(watch_log, NULL);
  return 0;
}

static int watch_stop(void **state) {
  ferry_log_set_handler(NULL, NULL);
  return 0;
}

static unsigned carrier(test_rig *r) {
  unsigned transport = 0;
  assert_int_equal(ferry_peer_transport(r->initiator, r->name, &transport), FERRY_OK);
  return transport;
}

/* The peer's rails are fabric's and tcp's, in that order. */
static void rails_of(test_rig *r, uint64_t bytes[2], int up[2]) {
  char names[2][80];
  assert_int_equal(test_rig_rail_bytes(r, bytes, up, names, 2), 2);
  assert_string_equal(names[0], "fabric");
  assert_string_equal(names[1], "tcp");
}

/* With both usable, fabric carries every byte and tcp none; the log says
 * once which transports the peer has and why shm is not one. */
static void fabric_carries_tcp_stands_by(void **state) {
  test_rig r;
  test_rig_start(&r, two_transport_engine(4), two_transport_engine(2), BIG);
  test_rig_round_trip(&r);
  test_rig_round_trip(&r);
  assert_int_equal(lines(USING), 1);
  assert_int_equal(carrier(&r), FERRY_TRANSPORT_FABRIC);
  assert_int_equal(test_rig_transport_bytes(&r, "fabric"), 4 * BIG);
  assert_int_equal(test_rig_transport_bytes(&r, "tcp"), 0);
  uint64_t bytes[2];
  int up[2];
  rails_of(&r, bytes, up);
  assert_true(bytes[0] == 4 * BIG && bytes[1] == 0 && up[0] && up[1]);
  test_rig_stop(&r);
}

/* Shuts down every connected socket of this process that is not the
 * target's RPC port's (tcp's data and control connections go there): the
 * connections of fabric's provider, both ends, as a dead link would. Its
 * listener stays, so fabric can come back. Returns how many. */
static int cut_fabric_connections(uint16_t rpc_port) {
  int cut = 0;
  for (int fd = 3; fd < 4096; fd++) {
    struct sockaddr_in me, peer;
    socklen_t len = sizeof me, plen = sizeof peer;
    int listening = 0;
    socklen_t ilen = sizeof listening;
    if (getsockname(fd, (struct sockaddr *)&me, &len) != 0 || me.sin_family != AF_INET ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ilen) != 0 || listening ||
        getpeername(fd, (struct sockaddr *)&peer, &plen) != 0)
      continue;
    if (ntohs(me.sin_port) != rpc_port && ntohs(peer.sin_port) != rpc_port &&
        shutdown(fd, SHUT_RDWR) == 0) {
      print_message("cut fd %d: port %u to port %u\n", fd, ntohs(me.sin_port),
                    ntohs(peer.sin_port));
      cut++;
    }
  }
  return cut;
}

/* Fabric's connections are cut: the next round trips complete, verified,
 * over tcp (the chunks lost on fabric moved), fabric is taken out of use,
 * and once its back-off passed it carries again, tcp nothing more. */
static void fabric_cut_tcp_carries_then_fabric_back(void **state) {
  test_rig r;
  test_rig_start(&r, two_transport_engine(4), two_transport_engine(2), BIG);
  test_rig_round_trip(&r);
  uint64_t fabric_before = test_rig_transport_bytes(&r, "fabric");
  int cut = cut_fabric_connections(ferry_engine_port(r.target));
  print_message("cut %d fabric sockets\n", cut);
  assert_true(cut >= 1);
  for (int i = 0; i < 3; i++)
    test_rig_round_trip(&r);
  uint64_t tcp_after = test_rig_transport_bytes(&r, "tcp");
  uint64_t fabric_after = test_rig_transport_bytes(&r, "fabric");
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(r.initiator, &s), FERRY_OK);
  assert_int_equal(s->rail_count, 2);
  uint64_t failures = s->rails[0].failures;
  ferry_stats_free(s);
  print_message("after the cut: fabric +%llu bytes, tcp %llu bytes, fabric failed %llu times\n",
                (unsigned long long)(fabric_after - fabric_before), (unsigned long long)tcp_after,
                (unsigned long long)failures);
  assert_true(tcp_after > 0 && failures >= 1 && lines(FAILOVER) >= 1);
  assert_int_equal(fabric_after + tcp_after, 2 * r.rounds * BIG);

  /* Back after the back-off (3 s): small verified WRITEs, polled a bounded
   * number of times, until fabric carries bytes again. */
  uint64_t fabric_now = fabric_after;
  for (int i = 0; i < 6000 && (fabric_now == fabric_after || carrier(&r) != FERRY_TRANSPORT_FABRIC);
       i++) {
    usleep(10000);
    test_fill_random(r.out, 4096, (uint64_t)i);
    assert_int_equal(ferry_transfer_sync(r.initiator, r.name, FERRY_OP_WRITE, r.out,
                                         (uint64_t)(uintptr_t)r.memory, 4096),
                     FERRY_OK);
    assert_memory_equal(r.memory, r.out, 4096);
    fabric_now = test_rig_transport_bytes(&r, "fabric");
  }
  assert_true(fabric_now > fabric_after);
  uint64_t tcp_back = test_rig_transport_bytes(&r, "tcp");
  test_rig_round_trip(&r);
  assert_int_equal(test_rig_transport_bytes(&r, "tcp"), tcp_back); /* fabric carried it all */
  uint64_t bytes[2];
  int up[2];
  rails_of(&r, bytes, up);
  assert_true(up[0] && up[1] && lines(BACK) >= 1);
  test_rig_stop(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(fabric_carries_tcp_stands_by, watch_start, watch_stop),
      cmocka_unit_test_setup_teardown(fabric_cut_tcp_carries_then_fabric_back, watch_start,
                                      watch_stop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
