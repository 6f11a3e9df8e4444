/* counters.c - counting events where they happen (counters.h): the data
 * path's part of the statistics. Reading them out (ferry_stats_snapshot)
 * and the exporters are observe/'s. */
#include "counters.h"

#include <math.h>

#include "chunker.h"
#include "engine.h"
#include "peer.h"
#include "transport.h"

#define ADD(counter, n) __atomic_add_fetch(&(counter), (n), __ATOMIC_RELAXED)

/* Upper bounds of the latency buckets in seconds, from the 10 us of a small
 * same-host call to the seconds of a large one; the last is +Inf. */
const double ferry_stats_latency_le[FERRY_STATS_LATENCY_BUCKETS] = {
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
    25e-3, 50e-3, 0.1,   0.25,   0.5,    1,      2.5,  5,      10,   INFINITY};

static ferry_link_counters *link_of(ferry_peer *p, const ferry_transport *t) {
  return &p->stats.link[__builtin_ctz(t->id) % FERRY_STATS_TRANSPORTS];
}

void ferry_stats_error(ferry_engine *e, ferry_status st) {
  if (st < 0 && -st < FERRY_STATS_CODES)
    ADD(e->stats.errors[-st], 1);
}

void ferry_stats_submitted(ferry_peer *p, const ferry_transport *t, const ferry_entry *entries,
                           size_t count) {
  uint64_t n[2] = {0, 0};
  for (size_t i = 0; i < count; i++)
    n[entries[i].op == FERRY_OP_WRITE]++;
  ferry_link_counters *c = link_of(p, t);
  for (int op = 0; op < 2; op++)
    if (n[op])
      ADD(c->ops[op], n[op]);
  ADD(p->engine->stats.batches_in_flight, 1);
}

void ferry_stats_batch_started(ferry_engine *e) { ADD(e->stats.batches_in_flight, 1); }

void ferry_stats_finished(ferry_engine *e, ferry_status st) {
  ADD(e->stats.batches_in_flight, (uint64_t)-1);
  ferry_stats_error(e, st);
}

void ferry_stats_moved(ferry_peer *p, const ferry_transport *t, const ferry_chunk *c,
                       ferry_status st) {
  if (!st)
    ADD(link_of(p, t)->bytes[c->op == FERRY_OP_WRITE], c->bytes);
}

void ferry_stats_channel_opened(ferry_peer *p, const ferry_transport *t) {
  ADD(link_of(p, t)->connections_opened, 1);
}

void ferry_stats_control_opened(ferry_peer *p) { ADD(p->stats.control_opened, 1); }

void ferry_stats_sync_latency(ferry_engine *e, uint64_t ns) {
  double s = (double)ns / 1e9;
  size_t i = 0;
  while (s > ferry_stats_latency_le[i])
    i++; /* the last bound is infinite */
  ADD(e->stats.latency[i], 1);
  ADD(e->stats.latency_sum_ns, ns);
  ADD(e->stats.latency_count, 1);
}

void ferry_stats_accepted(ferry_engine *e, unsigned transport) {
  ADD(e->stats.accepted[(unsigned)__builtin_ctz(transport) % FERRY_STATS_TRANSPORTS], 1);
}

void ferry_stats_served(ferry_engine *e, ferry_op op, uint64_t bytes, int failed) {
  if (failed)
    return;
  ADD(e->stats.served_bytes[op == FERRY_OP_WRITE], bytes);
  ADD(e->stats.served_requests[op == FERRY_OP_WRITE], 1);
}

void ferry_stats_staged(ferry_engine *e, ferry_op op, uint64_t bytes) {
  ADD(e->stats.staged_bytes[op == FERRY_OP_WRITE], bytes);
}
