/* peer.h - what an engine knows about a target: where it is, its handshake
 * facts, a cached copy of its region table, the transports that can reach
 * it and their rails (rail_choice.h), a pool of data channels and one
 * control connection. Peers are
 * cached by target name for the engine's lifetime; a broken connection is
 * dropped and the next call reconnects. */
#ifndef FERRY_PEER_H
#define FERRY_PEER_H

#include "core/engine.h"
#include "core/rail_choice.h"

struct ferry_channel;
struct ferry_transport;

/* A socket in a handshake, listed on its peer so that shutdown can wake
 * the thread blocked on it (lives on that thread's stack). */
typedef struct ferry_handshake {
  int fd;
  struct ferry_handshake *next;
} ferry_handshake;

/* How long a failed rail stays out of use before a channel tries it again
 * (a new handshake with a restarted target resets it at once). */
#define FERRY_RAIL_BACKOFF_NS (3000 * 1000000ull)

struct ferry_peer {
  ferry_engine *engine;
  struct ferry_peer *next;
  char target[FERRY_HOST_MAX + 8];  /* as the caller names it */
  char address[FERRY_HOST_MAX + 8]; /* same, for messages (never rewritten) */

  pthread_mutex_t lock; /* everything below */
  pthread_cond_t cond;  /* a channel was returned */
  int known;            /* info below is valid */
  ferry_hello_reply info;
  const struct ferry_transport *transport; /* the preferred one of those usable */
  /* The part of its region table fetched so far, with every transport's
   * keys (region_cache.h). */
  ferry_region_table table;
  unsigned generation; /* bumped on failure: retire old channels */
  struct ferry_channel *idle;
  struct ferry_channel *all;
  unsigned open_channels;
  uint64_t replied_ns; /* last reply on a data channel that stayed in step */
  ferry_peer_rail rails[FERRY_RAILS_MAX];
  unsigned rail_count; /* 0 or 1: one transport with one rail, no failover */
  unsigned next_rail;  /* round robin of checkouts */
  ferry_handshake *handshakes;
  ferry_peer_stats stats; /* atomics: outside the lock */

  pthread_mutex_t control_lock; /* one request at a time on control */
  int control_fd;               /* set and closed under both locks */
  uint64_t control_used_ns;     /* when its last request ended (control_lock) */
  uint64_t control_instance;
  int control_hangup;            /* the target closed it, and no connection replaced it yet */
  ferry_session control_session; /* seals control frames (a secret is set) */
};

/* How long a reply proves a peer and its connections alive, so back-to-back
 * calls skip the liveness polls (one system call each). A restart takes far
 * longer than this; a link lost within it fails the call that meets it, and
 * the next call reconnects. */
#define FERRY_PEER_TRUST_NS (1000 * 1000ull)

/* Finds or creates the peer for a target (no I/O). */
ferry_status ferry_peer_get(ferry_engine *engine, const char *target, ferry_peer **out);
void ferry_peers_destroy(ferry_engine *engine);
/* Handshakes over the control connection if this peer is not known yet (or
 * its connection was lost; a ping) and finds the transports that can reach
 * it (their rails: rail_choice.h); *transport and *instance get the
 * preferred one and the target incarnation it was found for. */
ferry_status ferry_peer_ensure(ferry_peer *peer, uint64_t deadline_ns,
                               const struct ferry_transport **transport, uint64_t *instance);
/* ferry_peer_ensure for a batch: the first exchange with the target (the
 * handshake) fetches the regions holding the entries' remote ranges that
 * the cache lacks (REGIONS_REQ with their ranges), never the whole table;
 * without entries, or when the cache has them all, it is a ping. */
ferry_status ferry_peer_ensure_for(ferry_peer *peer, const ferry_entry *entries, size_t count,
                                   uint64_t deadline_ns, const struct ferry_transport **transport,
                                   uint64_t *instance);
/* FERRY_OK when every remote range is inside the cached table; on a miss
 * fetches the regions at the missing ranges once, then checks again. Sets the error detail naming
 * the first bad range. */
ferry_status ferry_peer_check_remote(ferry_peer *peer, const ferry_entry *entries, size_t count,
                                     uint64_t deadline_ns);
/* ferry_peer_check_remote that also gives each entry's region start (as
 * cached) in bases[i]: entries of one region may be merged (plan.c). The
 * error names an entry as `what` ("entry", "remote descriptor") and index. */
ferry_status ferry_peer_locate_remote(ferry_peer *peer, const ferry_entry *entries, size_t count,
                                      uint64_t deadline_ns, uint64_t *bases, const char *what);
/* For a transport's channel: copies the key `transport` published for the
 * cached remote region holding [addr, addr+length) into out (at most size
 * bytes) and sets *base to that region's start. Returns the key's length,
 * 0 when the cache has no such region or no key of that transport. */
size_t ferry_peer_region_key(ferry_peer *peer, unsigned transport, uint64_t addr, uint64_t length,
                             uint8_t *out, size_t size, uint64_t *base);
/* A socket that completed HELLO (+ AUTH) as conn kind. reply gets the
 * target's facts (from AUTH_REPLY when it asked for the secret), session
 * the keys its frames are sealed with from now on (off without a secret):
 * give it to every ferry_sock on fd (ferry_sock_auth). Notices a restarted
 * target (new instance id): then everything derived from the old
 * incarnation is dropped (region table, transport choice, idle channels,
 * through their transport's close; busy ones retire when checked in) and
 * the next ensure negotiates afresh. */
ferry_status ferry_peer_connect(ferry_peer *peer, ferry_conn_kind kind, uint64_t deadline_ns,
                                int *fd, ferry_hello_reply *reply, ferry_session *session);
/* The same to one of its rails ("host:port"); rail NULL: its RPC port. */
ferry_status ferry_peer_connect_at(ferry_peer *peer, const char *rail, ferry_conn_kind kind,
                                   uint64_t deadline_ns, int *fd, ferry_hello_reply *reply,
                                   ferry_session *session);
/* What ferry_peer_rail_failed leaves a lost chunk. */
typedef enum ferry_rails_left {
  FERRY_RAILS_NONE,     /* one rail (or closing): the chunk fails with its link */
  FERRY_RAILS_OTHER,    /* another rail is up and can take it */
  FERRY_RAILS_ALL_DOWN, /* this was the last rail up: every one is out of use */
} ferry_rails_left;
/* A chunk of batch on channel's rail failed because the link did (already
 * in the error detail): takes the rail out of use (one WARN) and says where
 * the chunk may go (a rail the batch may use); with several rails and none
 * left up, the error detail becomes every rail's cause. */
ferry_rails_left ferry_peer_rail_failed(ferry_peer *peer, const ferry_batch *batch,
                                        struct ferry_channel *channel);
/* The first entry whose remote range lies in a cached region of the peer
 * that `transport` (a FERRY_TRANSPORT_* bit) published a key of zeros for:
 * the target did not register it with that transport (device memory its
 * provider cannot reach, transport.h); -1 when none (or no such key
 * section). One lock and one search per entry. */
long ferry_peer_unkeyed_remote(ferry_peer *peer, unsigned transport, const ferry_entry *entries,
                               size_t count);
/* Whether transport t can do what a batch needs (FERRY_NEEDS_*, batch.h). */
int ferry_transport_meets(const struct ferry_transport *t, unsigned needs);
/* For a batch with needs (FERRY_NEEDS_*, batch.h): nonzero when *out (in:
 * the transport ferry_peer_ensure_for chose) became the one to carry it,
 * the first usable one toward the peer that meets them; checkout then uses
 * only such rails. Zero when none does (*out unchanged, for the message). */
int ferry_peer_transport_for(ferry_peer *peer, unsigned needs, const struct ferry_transport **out);
/* ferry_peer_transport_for a pool message's batch: FERRY_ETRANSPORT naming
 * the transport when none that reaches the peer checks WRITEs into a pool
 * against the writer's grants (pool_writes_bounded, transport.h). */
ferry_status ferry_peer_pool_transport(ferry_peer *peer, const struct ferry_transport **out);
/* Nonzero when another rail (of this transport or a standby one) is usable
 * now, so chunks lost on channel's rail could move there: a transport then
 * gives up a silent link after the engine's stall bound (stall_ms) instead
 * of waiting for the batch's deadline. */
int ferry_peer_can_fail_over(ferry_peer *peer, struct ferry_channel *channel);
/* Counts a chunk that moved on channel's rail. */
void ferry_peer_rail_moved(ferry_peer *peer, struct ferry_channel *channel, ferry_op op,
                           uint64_t bytes);
/* Takes a channel for a batch (opening one if below the limit, else
 * waiting); FERRY_ENOTFOUND when the batch has no work left to claim. With
 * several rails the checkouts take turns over the rails that are up; a
 * rail that cannot be connected is taken out of use and another is tried;
 * when every rail failed the error names each one's cause. */
ferry_status ferry_peer_checkout(ferry_peer *peer, ferry_batch *batch, struct ferry_channel **out);
void ferry_peer_checkin(ferry_peer *peer, struct ferry_channel *channel);
/* Wakes threads waiting in checkout (a batch ran out of work). */
void ferry_peer_wake(ferry_peer *peer);
/* Engine shutdown: wakes every thread blocked on a peer (shuts down the
 * sockets of channels, control connections and handshakes; broadcasts).
 * Safe to repeat while calls remain. */
void ferry_peers_shutdown(ferry_engine *engine);

/* Fetches the peer's regions overlapping spans again (sorted, disjoint,
 * non-empty; none: the whole table): for a transport whose operation
 * failed or stalled in a way that may mean the target unregistered memory
 * (a one-sided transport cannot tell otherwise). */
ferry_status ferry_peer_refresh_regions(ferry_peer *peer, const ferry_region *spans, size_t count,
                                        uint64_t deadline_ns);
ferry_status ferry_peer_ping(ferry_peer *peer, uint64_t deadline_ns);
/* Nonzero when the target closed the peer's control connection (a killed
 * target's kernel does so at once; a live one after its idle limit) and
 * no new one replaced it yet, without waiting; 0 while another thread
 * uses it. A transport whose channels cannot see a dead target asks this,
 * then ferry_peer_ping tells a dead target (connecting again fails) from
 * an idle close (it succeeds) or a restart (a new instance id in the
 * peer's info). A connection this engine closed (a request timed out: a
 * cut link) does not count. */
int ferry_peer_control_hangup(ferry_peer *peer);
ferry_status ferry_peer_notify(ferry_peer *peer, const char *name, const void *data, size_t len,
                               uint64_t deadline_ns);
/* Asks the target, on the control connection, to stop serving our data
 * connection with session id `id` (ferry_session.id): on FERRY_OK no WRITE
 * that came over it touches the target's memory any more, nor ever will,
 * even from bytes still in flight on it. For a transport whose connection
 * broke with WRITEs unacknowledged, before they are sent again elsewhere
 * (needs wire version 5; ferry_peer_connect_at's reply says). */
ferry_status ferry_peer_cut(ferry_peer *peer, const uint8_t id[FERRY_WIRE_NONCE_SIZE],
                            uint64_t deadline_ns);
/* A POOL request (pool.c) on the control connection; reply gets the
 * POOL_REPLY body. */
ferry_status ferry_peer_pool(ferry_peer *peer, const void *body, size_t len,
                             uint8_t reply[FERRY_WIRE_POOL_REPLY_SIZE], uint64_t deadline_ns);

#endif
