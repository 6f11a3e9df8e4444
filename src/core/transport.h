/* transport.h - the one interface every data transport implements. Core
 * owns it and calls transports only through it; the transports
 * (src/transport/, a layer above core) implement it.
 *
 * The control plane (handshake, region tables, notifications, probes) always
 * runs over the engine's RPC connection; a transport only moves the bytes of
 * batches over its own channels. A channel belongs to one peer and is used
 * by one thread at a time (checked out of the peer's pool).
 *
 * Adding a transport: one file in src/transport/ defining a
 * ferry_transport, listed in transport/transports.c, with a
 * FERRY_TRANSPORT_* bit in ferry.h and its name in wire/names.c. Core
 * calls it only through this table and never by name:
 *   target side:  service_start/stop (its listener or progress thread),
 *                 describe (what initiators need to reach it: a socket
 *                 path, a provider address; carried in the handshake facts
 *                 as one opaque descriptor, wire.h), fence (unregister);
 *   initiator:    usable (decides from the peer's facts and descriptor,
 *                 saying why not), slice_size, channel_* (moves chunks).
 *   per region:   region_register/_deregister (an RDMA memory registration
 *                 per region), region_key_size/region_keys (what an
 *                 initiator needs to reach a region besides its address,
 *                 carried per transport in the region table, wire.h; the
 *                 initiator reads it with ferry_peer_region_key, peer.h).
 *
 * Rails (optional: NULL means the peer has one rail, reached with
 * channel_open): `rails` lists the rails toward a peer from its facts (an
 * address, a device; tcp: the host:port its descriptor lists; fabric:
 * the rail endpoints its descriptor lists) and
 * rail_open opens a channel on one of them. Core spreads a peer's channels
 * over its rails (channel->rail), stripes a batch's chunks across them,
 * and takes a rail whose link failed out of use for a while. A transport
 * with rails claims with ferry_batch_claim_on and reports each chunk with
 * ferry_batch_settle (batch.h) instead of ferry_batch_complete, so that a
 * chunk lost to a link failure (FERRY_ESOCKET) is moved again on another
 * rail instead of failing the batch. The change for rails was additive:
 * these two hooks, channel->rail, and those two batch calls.
 *
 * Several transports per peer: a peer keeps every transport that is usable
 * toward it, in ferry_transports order, each contributing its rails (or
 * its one rail) to the peer's rail list (core/rail_choice.h). The first
 * with a rail in use carries all the data; the others are standby rails,
 * never striped with it (a batch would end at the slower one's pace). A
 * chunk the carrier settles with FERRY_ESOCKET moves to the next rail up,
 * which may be another transport's: so a chunk's size is the slice of the
 * transport that claimed it, and every transport must move a chunk of any
 * other's slice (at most FERRY_WIRE_MAX_PAYLOAD bytes). A transport that
 * completes with ferry_batch_complete (shm) fails the batch on a lost
 * chunk, but its connect failures still fall over. Nothing in the table
 * changed for this: a transport just reports link failures as ESOCKET.
 *
 * A transport may also carry a batch's after-landed message without a
 * control round trip of its own, in one of two ways: in-band with its data
 * (carries_after: tcp, whose target checks every WRITE), or on a path of
 * its own to the target once every byte of the batch is in place
 * (post_after: shm's notice ring). A transport that posts may hand back
 * the replies' grants as credits (take_credits), which pool.c caches for
 * the next sends: a steady sender then crosses no socket at all.
 *
 * What a channel may use of core (and nothing else of batch or peer):
 * ferry_batch_claim / ferry_batch_complete / ferry_batch_fail (batch.h),
 * or their rail forms above,
 * with ferry_stats_moved next to each complete; b->deadline_ns; the peer's
 * address, lock-protected info (its descriptor) and engine;
 * ferry_peer_region_key, and ferry_peer_refresh_regions when a one-sided
 * transport must learn whether the target still holds a range;
 * ferry_peer_control_hangup and ferry_peer_ping when its channels cannot
 * see a dead target themselves (fabric: rxm reconnects instead of failing
 * the operations; the control connection's reset tells). Core has
 * already checked every remote range against the cached table
 * (ferry_peer_check_remote) before a channel sees a chunk.
 *
 * The shape of an asynchronous (completion-queue) transport, as fabric.c
 * is: drive claims several chunks, posts their operations with a bounded
 * number in flight, and completes a chunk (ferry_batch_complete) only when
 * all of its operations completed, which for a WRITE must mean "in the
 * target's memory" (promise 1 of RELIABILITY.md): a notification attached
 * to the batch is sent by core after the last completion. Chunks may
 * complete in any order. drive returns only with nothing of its own in
 * flight, or with the channel marked broken (close then cancels the rest).
 * The target side needs no thread per connection: a progress thread that
 * sleeps on the provider's fd (or polls with backoff) serves every peer.
 *
 * The next transport (GPU memory): register/deregister its memory in
 * region_register (pinning, an IPC or dma-buf handle, or fi_mr_regattr
 * with FI_HMEM), publish per-region keys or handles through region_keys
 * (up to FERRY_WIRE_MAX_KEY bytes), describe its endpoint in describe,
 * and decide in usable, from the descriptor alone and treating it as
 * untrusted, whether this engine can reach the peer (same node, same
 * fabric). Core needs no change for it. */
#ifndef FERRY_TRANSPORT_H
#define FERRY_TRANSPORT_H

#include "core/batch.h"
#include "core/peer.h"

typedef struct ferry_transport ferry_transport;

/* A grant for this engine's next message into a target's pool, handed back
 * on a transport's own path (take_credits) instead of a POOL_REPLY. */
typedef struct ferry_credit {
  char pool[FERRY_WIRE_MAX_NAME];
  ferry_pool_grant grant;
  uint64_t issued_ns; /* ferry_now_ns() when the target granted it */
} ferry_credit;

/* take_credits' wait: none, briefly, or until the posted messages are served. */
enum { FERRY_CREDITS_NOW, FERRY_CREDITS_BRIEFLY, FERRY_CREDITS_COMING };

/* Common head of every transport's channel struct. */
typedef struct ferry_channel {
  const ferry_transport *transport;
  ferry_peer *peer;
  uint64_t peer_instance;   /* the target incarnation this channel talks to */
  unsigned generation;      /* peer generation when opened; older ones are retired */
  int broken;               /* set by drive on a failure that desynchronized it */
  uint64_t replied_ns;      /* when a reply last arrived: recent proof the link works */
  unsigned rail;            /* index in the transport's rails list (0 without rails) */
  unsigned rail_generation; /* that rail's generation when opened (peer.c) */
  uint64_t idle_since_ns;   /* when it was last checked in */
  struct ferry_channel *next_idle;
  struct ferry_channel *next_all;
} ferry_channel;

/* ferry_transport.carries_device_memory */
#define FERRY_DEVICE_STAGED 1
#define FERRY_DEVICE_DIRECT 2

struct ferry_transport {
  const char *name;
  unsigned id; /* FERRY_TRANSPORT_* bit */
  /* Nonzero when this transport can reach the peer described by its hello
   * reply; otherwise why gets the reason, for the log. */
  int (*usable)(ferry_engine *engine, const ferry_hello_reply *peer_info, char *why,
                size_t why_size);
  /* Bytes per chunk for this batch: decides how many channels drive it. */
  size_t (*slice_size)(const ferry_batch *batch);
  ferry_status (*channel_open)(ferry_peer *peer, uint64_t deadline_ns, ferry_channel **out);
  /* Claims chunks of the batch and moves them until none are left. A failed
   * chunk is reported to the batch; the return value is the first error. */
  ferry_status (*channel_drive)(ferry_channel *channel, ferry_batch *batch);
  /* Nonzero when channel_drive carries a batch's after-landed message
   * (batch.h) in-band: it claims with ferry_batch_claim_after, and for the
   * chunk that gets the message the target serves it after the chunk
   * landed and before its acknowledgement, which brings the reply; the
   * driver stores it and sets carried before completing the chunk. Only a
   * transport whose target checks every WRITE (pool.c counts them into
   * their slots) may carry it, and only on a channel of the batch's own
   * transport (not a standby's, batch.c). Zero: the batch sends the message on the
   * control connection after the data (one more round trip). */
  int carries_after;
  /* Nonzero when a WRITE over this transport into a receive pool reaches
   * only the writer's own live grant: its target checks each one (tcp:
   * ferry_pools_check_writes), or serves only the same user, who can write
   * that memory anyway (shm). A pool message's WRITEs go only over such a
   * transport (ferry_peer_pool_transport), and a transport without it
   * registers pools for remote READ only (FERRY_REGISTER_POOL). */
  int pool_writes_bounded;
  /* Nonzero when a batch's local buffers may be memory the CPU cannot
   * touch (device memory, memory/kind.h): FERRY_DEVICE_STAGED (tcp; fabric
   * where its provider cannot register it, else directly with FI_HMEM)
   * moves it through the staging pipeline (staging.h), so not under
   * FERRY_STAGING=never; FERRY_DEVICE_DIRECT (shm) by the device's own
   * copies, under any staging mode. Zero: core never hands it such a
   * batch, nor a chunk of one to move again on its rails (batch.c). */
  int carries_device_memory;
  /* Optional (NULL: none). Posts a batch's after-landed message to the
   * target incarnation `instance` on the transport's own path, called by
   * the batch once every chunk completed (all bytes in the target's
   * memory) instead of the control round trip; nonzero when posted. The
   * target serves it on its own time, through pool.c's checks like any
   * LANDED, and its reply's grant, if any, comes back as a credit. Zero
   * (no such path to that incarnation now, or it is full): the batch
   * sends it on the control connection. */
  int (*post_after)(ferry_peer *peer, uint64_t instance, const ferry_after *after);
  /* Optional. Moves up to max credits the target incarnation `instance`
   * handed this engine on the transport's own path into out; returns how
   * many. The grants are the target's, as trusted as a POOL_REPLY. wait
   * (the caller holds none) while the target still has posted messages
   * of ours to serve, whose replies may bring some: FERRY_CREDITS_BRIEFLY,
   * far below a control round trip (the caller asks the control
   * connection next, which adds a credit to those going round), or
   * FERRY_CREDITS_COMING, asleep until they are served (bounded by the
   * connect timeout): enough of ours go round already.
   * *epoch (0: none) names the credits valid now: the caller stops using
   * those it cached under another epoch, since the target may have taken
   * their slots back (peer_gone below) or the link carrying them ended. */
  size_t (*take_credits)(ferry_peer *peer, uint64_t instance, ferry_credit *out, size_t max,
                         int wait, uint64_t *epoch);
  /* Nonzero when an idle channel can take a batch. A transport whose check
   * costs a system call may skip it for a channel that got a reply within
   * FERRY_PEER_TRUST_NS (tcp does; shm's link check stays). */
  int (*channel_alive)(ferry_channel *channel);
  void (*channel_shutdown)(ferry_channel *channel); /* wakes a blocked driver */
  void (*channel_close)(ferry_channel *channel);

  /* The target side, engine-wide; each may be NULL. service_start runs for
   * a transport in engine->transports before the server accepts (a
   * HELLO_REPLY may advertise what it set up); a transport that cannot
   * serve warns and drops its bit from engine->transports, failing only
   * when it was the only one. service_stop runs at shutdown for every
   * built-in transport, after the server stopped: it must be a no-op when
   * start never ran or failed. fence is this transport's part of
   * ferry_engine_fence (engine.h), same contract: on return it never
   * touches `removed` again. */
  ferry_status (*service_start)(ferry_engine *engine);
  /* This transport's descriptor for the handshake facts (wire.h): at most
   * `size` bytes into out, its length returned; 0 for none. */
  size_t (*describe)(ferry_engine *engine, uint8_t *out, size_t size);
  void (*service_stop)(ferry_engine *engine);
  void (*fence)(ferry_engine *engine, ferry_region *removed, size_t count);
  /* Target side: the pools are about to take back peer's slots (all its
   * connections ended: a transport whose own links carry a sender's
   * notices counts them too, ferry_pools_peer_joined/left in pool.h);
   * what the transport handed it for them (credits) must stop working
   * first. */
  void (*peer_gone)(ferry_engine *engine, uint64_t peer);

  /* Per region, target side (each may be NULL). region_register runs for
   * the regions a call registers that are not registered yet, before the
   * registry shows them to peers, so a peer never sees a region without its
   * key. All or nothing: on failure none of `regions` stays registered with
   * this transport. Registrations are serialized by the engine. A range may
   * come twice in one call: the second is a no-op. flags: FERRY_REGISTER_POOL
   * (engine.h): receive pools, which a transport without
   * pool_writes_bounded opens to remote READ only; FERRY_REGISTER_DEVICE:
   * memory the CPU cannot touch (device memory), which a transport that
   * cannot reach it leaves unregistered (FERRY_OK), so that its key in the
   * region table is zeros. */
  ferry_status (*region_register)(ferry_engine *engine, const ferry_region *regions, size_t count,
                                  unsigned flags);
  /* Runs after ferry_engine_fence for the regions removed: nothing touches
   * them any more (RDMA: close the memory registration only now). Ignores a
   * region it does not hold. */
  void (*region_deregister)(ferry_engine *engine, const ferry_region *regions, size_t count);
  /* Bytes of this transport's key per region in the region table, fixed for
   * the engine's life: 1..FERRY_WIRE_MAX_KEY, or 0 for none (tcp, shm). */
  size_t (*region_key_size)(ferry_engine *engine);
  /* The key of each region (sorted, as in the table) into out, key size
   * bytes each; zeros for a region it does not hold (unregistered
   * meanwhile: an initiator's access to it fails at the target; device
   * memory it could not register: an initiator's core routes a batch
   * reaching it to a transport without keys, or refuses it, batch.c). A
   * registration's key is never all zeros. */
  void (*region_keys)(ferry_engine *engine, const ferry_region *regions, size_t count,
                      uint8_t *out);

  /* Rails toward the peer described by peer_info, at most max names into
   * names; 0 (or a NULL hook) means one rail, opened with channel_open. */
  unsigned (*rails)(const ferry_hello_reply *peer_info, char names[][FERRY_RAIL_NAME_MAX],
                    unsigned max);
  /* channel_open on one rail, named as `rails` listed it. */
  ferry_status (*rail_open)(ferry_peer *peer, const char *rail, uint64_t deadline_ns,
                            ferry_channel **out);
};

extern const ferry_transport ferry_transport_tcp;
extern const ferry_transport ferry_transport_fabric;

/* Transports in order of preference. */
extern const ferry_transport *const ferry_transports[];

#endif
