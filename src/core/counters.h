/* counters.h - the engine's counters and the latency histogram (counters.c),
 * read out by ferry_stats_snapshot and the exporters (observe/).
 *
 * Every event is one relaxed atomic add on a counter the event's thread
 * finds without a lookup (its peer's, its engine's): the data path gains no
 * lock and no system call. Gauges that are cheap to read where they live
 * (registered memory, queued notifications) are read at snapshot time
 * instead of being kept in step. */
#ifndef FERRY_COUNTERS_H
#define FERRY_COUNTERS_H

#include <stdint.h>

#include "ferry.h"

struct ferry_peer;
struct ferry_chunk;
struct ferry_transport;

/* Slots per peer, one per transport, indexed by the transport's id bit. */
#define FERRY_STATS_TRANSPORTS 8

typedef struct ferry_link_counters {
  uint64_t bytes[2]; /* by ferry_op: moved and acknowledged */
  uint64_t ops[2];   /* by ferry_op: entries submitted */
  uint64_t connections_opened;
} ferry_link_counters;

/* Lives in struct ferry_peer. */
typedef struct ferry_peer_stats {
  ferry_link_counters link[FERRY_STATS_TRANSPORTS];
  uint64_t control_opened;
} ferry_peer_stats;

/* Lives in struct ferry_engine. */
typedef struct ferry_engine_stats {
  uint64_t errors[FERRY_STATS_CODES];
  uint64_t batches_in_flight;
  uint64_t latency[FERRY_STATS_LATENCY_BUCKETS]; /* not cumulative */
  uint64_t latency_sum_ns;
  uint64_t latency_count;
  uint64_t served_bytes[2], served_requests[2];
  uint64_t accepted[FERRY_STATS_TRANSPORTS]; /* as a target, by transport slot */
  uint64_t staged_bytes[2];
} ferry_engine_stats;

/* Upper bounds of the latency buckets in seconds; the last is +Inf. */
extern const double ferry_stats_latency_le[FERRY_STATS_LATENCY_BUCKETS];

/* One call per event, from the thread that saw it. */
void ferry_stats_error(ferry_engine *engine, ferry_status status);
void ferry_stats_submitted(struct ferry_peer *peer, const struct ferry_transport *transport,
                           const ferry_entry *entries, size_t count);
/* A batch to no peer (a file's, file.c) was submitted. */
void ferry_stats_batch_started(ferry_engine *engine);
/* A batch became final; st is counted as an error unless FERRY_OK. */
void ferry_stats_finished(ferry_engine *engine, ferry_status st);
/* A chunk a transport completed: counted when st is FERRY_OK. */
void ferry_stats_moved(struct ferry_peer *peer, const struct ferry_transport *transport,
                       const struct ferry_chunk *chunk, ferry_status st);
void ferry_stats_channel_opened(struct ferry_peer *peer, const struct ferry_transport *transport);
void ferry_stats_control_opened(struct ferry_peer *peer);
void ferry_stats_sync_latency(ferry_engine *engine, uint64_t ns);
/* A WRITE request the server stored or a READ it starts answering;
 * counted unless failed. */
void ferry_stats_served(ferry_engine *engine, ferry_op op, uint64_t bytes, int failed);
/* As a target: a peer's connection over transport (a FERRY_TRANSPORT_*
 * bit) passed its handshake: a tcp data connection, an shm link. */
void ferry_stats_accepted(ferry_engine *engine, unsigned transport);
/* Bytes of a transfer (op) moved through the staging pipeline. */
void ferry_stats_staged(ferry_engine *engine, ferry_op op, uint64_t bytes);

#endif
