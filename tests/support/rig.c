/* rig.c - see rig.h. */
#include "rig.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "harness.h"

void test_rig_start(test_rig *r, ferry_engine *target, ferry_engine *initiator, size_t size) {
  memset(r, 0, sizeof *r);
  assert_true(target && initiator);
  r->target = target;
  r->initiator = initiator;
  r->size = size;
  r->memory = test_buffer(target, size);
  r->out = test_buffer(initiator, size);
  r->in = test_buffer(initiator, size);
  assert_true(r->memory && r->out && r->in);
  snprintf(r->name, sizeof r->name, "127.0.0.1:%u", ferry_engine_port(target));
}

void test_rig_stop(test_rig *r) {
  ferry_engine_destroy(r->initiator);
  ferry_engine_destroy(r->target);
  free(r->memory);
  free(r->out);
  free(r->in);
}

ferry_status test_rig_write(test_rig *r, uint64_t seed) {
  test_fill_random(r->out, r->size, seed);
  return ferry_transfer_sync(r->initiator, r->name, FERRY_OP_WRITE, r->out,
                             (uint64_t)(uintptr_t)r->memory, r->size);
}

void test_rig_round_trip(test_rig *r) {
  r->rounds++;
  if (test_rig_write(r, r->rounds))
    fail_msg("WRITE of round %llu: %s", (unsigned long long)r->rounds, ferry_last_error());
  assert_memory_equal(r->memory, r->out, r->size);
  if (ferry_transfer_sync(r->initiator, r->name, FERRY_OP_READ, r->in,
                          (uint64_t)(uintptr_t)r->memory, r->size))
    fail_msg("READ of round %llu: %s", (unsigned long long)r->rounds, ferry_last_error());
  assert_memory_equal(r->in, r->out, r->size);
}

size_t test_rig_rail_bytes(test_rig *r, uint64_t bytes[], int up[], char names[][80], size_t max) {
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(r->initiator, &s), FERRY_OK);
  size_t n = 0;
  for (size_t i = 0; i < s->rail_count && n < max; i++, n++) {
    assert_string_equal(s->rails[i].peer, r->name);
    bytes[n] = s->rails[i].bytes[FERRY_OP_READ] + s->rails[i].bytes[FERRY_OP_WRITE];
    if (up)
      up[n] = s->rails[i].up;
    if (names)
      snprintf(names[n], 80, "%s", s->rails[i].rail);
  }
  ferry_stats_free(s);
  return n;
}

void test_rig_rail_failures(test_rig *r, uint64_t failures[], size_t max) {
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(r->initiator, &s), FERRY_OK);
  for (size_t i = 0; i < max; i++)
    failures[i] = i < s->rail_count ? s->rails[i].failures : 0;
  ferry_stats_free(s);
}

uint64_t test_rig_transport_bytes(test_rig *r, const char *transport) {
  ferry_stats *s;
  assert_int_equal(ferry_stats_snapshot(r->initiator, &s), FERRY_OK);
  uint64_t bytes = 0;
  for (size_t i = 0; i < s->link_count; i++)
    if (!strcmp(s->links[i].peer, r->name) && !strcmp(s->links[i].transport, transport))
      bytes += s->links[i].bytes[FERRY_OP_READ] + s->links[i].bytes[FERRY_OP_WRITE];
  ferry_stats_free(s);
  return bytes;
}

int test_rig_cut_sockets(uint32_t ipv4) {
  int cut = 0;
  for (int fd = 3; fd < 4096; fd++) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) == 0 && a.sin_family == AF_INET &&
        a.sin_addr.s_addr == htonl(ipv4) && shutdown(fd, SHUT_RDWR) == 0)
      cut++;
  }
  return cut;
}
