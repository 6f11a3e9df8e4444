/* map.h - the store master's state: key -> object (size, pending or
 * committed, lease, pin, replicas; beside a committed one, an upsert's
 * new value while it is written), the segments clients contribute with
 * their free space, and the least-recently-used order that eviction takes
 * objects in. One lock over all of it; each request is decoded and
 * answered under it (protocol.h gives the bodies). Clients are named by
 * the id the master gave their connection. */
#ifndef FERRY_STORE_MAP_H
#define FERRY_STORE_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "store/protocol.h"

typedef struct store_map store_map;

/* When the master evicts (Mooncake's flags; docs/store.md): once the bytes
 * in use pass high_watermark of all segments' bytes, least-recently-used
 * objects go until at most (high_watermark - ratio) are in use; a put that
 * does not fit evicts until it does. A soft pin keeps an object out of
 * both until nothing unpinned is left, until its commit plus its TTL: the
 * put's own (at most max_soft_pin_ttl_ms) or soft_pin_ttl_ms. With
 * keep_soft_pinned (Mooncake's --allow_evict_soft_pinned_objects=false) a
 * soft pin keeps its object until its deadline even then: a put that finds
 * nothing else to evict fails. */
typedef struct store_eviction {
  double high_watermark, ratio; /* shares of the pool, in (0, 1] */
  uint32_t soft_pin_ttl_ms, max_soft_pin_ttl_ms;
  int keep_soft_pinned; /* 0: soft-pinned objects go last (Mooncake's default) */
} store_eviction;

/* lease_ttl_ms: a GET's lease; client_ttl_ms: the silence that drops a
 * client (its PING interval is a third of it). */
store_map *store_map_create(uint32_t lease_ttl_ms, uint32_t client_ttl_ms,
                            const store_eviction *eviction);
void store_map_destroy(store_map *m);

/* The SSD tier's directory (disk.h; NULL: none): told to clients at
 * REGISTER; evicted objects whose file is complete stay, disk-only. Set
 * before the first request. -1 without memory. */
int store_map_set_disk(store_map *m, const char *dir);

/* --enable_cxl (docs/store.md "CXL"): every value goes to one pool of size
 * bytes named name, a device each client maps itself (no client owns it,
 * none contributes a segment), at addresses from STORE_POOL_BASE; one
 * replica each, whatever a put asks. Told to clients at REGISTER. Set
 * before the first request. -1 without memory. */
#define STORE_POOL_BASE 0x100000000ull /* never 0: an address 0 means "no memory" */
int store_map_set_pool(store_map *m, const char *name, uint64_t size);

/* --enable_offload (docs/store.md "Client-owned SSD offload"): objects
 * with a replica in the segment of a client that polls for tasks get a
 * copy on that client's disk, after each commit, or (on_evict) only when
 * eviction chooses them. Mooncake's flags of the same names. */
typedef struct store_offload_config {
  int on_evict;
  uint32_t queue_limit; /* tasks waiting per segment (offloading_queue_limit; 0: 50000) */
  double cap_ratio;     /* with force_evict: offloads one eviction round queues, over queue_limit */
  int force_evict;      /* on_evict: past the cap or a full queue, evict without a copy */
  int promotion_on_hit; /* a get's load back keeps the object in memory ... */
  uint32_t promotion_at; /* ... from its Nth get while on disk only (1..255; 0: 2) */
} store_offload_config;
/* Set before the first request. */
void store_map_set_offload(store_map *m, const store_offload_config *cfg);
/* Ends every wait in a request (an offload poll, a get waiting for a load)
 * now and from now on: the master is stopping. */
void store_map_stop_waits(store_map *m);
/* Mooncake's --enable_gc (its masters before August 2025): an object a GET
 * read is removed after_get_ms later, or once that GET's lease ended when
 * that is later (a reader keeps its bytes for its lease, as without GC).
 * A later GET, or a new value of the key, puts the removal off: it goes
 * with that GET's own deadline, or not at all for a value nobody got. The
 * removals are made at the next request (any client's, PINGs included) or
 * stats call past the deadline. 0: off. Set before the first request. */
void store_map_set_gc(store_map *m, uint32_t after_get_ms);

/* What the master counts, for its metrics (metrics.h): per operation,
 * each key of a request (each request for the keyless ones: REGISTER,
 * PING, REMOVE_ALL, and any request refused whole) and those that failed
 * (a GET of a missing key fails, an exists of one does not). A PUT_END
 * that reports a failed write counts as a revoke. */
enum {
  STORE_COUNT_REVOKE = STORE_UPSERT_START + 1,
  STORE_COUNT_OFFLOAD_POLL,   /* OFFLOAD_POLL requests */
  STORE_COUNT_OFFLOAD_WRITE,  /* offloads reported (failed: not written, or not kept) */
  STORE_COUNT_OFFLOAD_LOAD,   /* loads back reported (failed: the file was not read back) */
  STORE_COUNT_OFFLOAD_DELETE, /* DELETE tasks handed out */
  STORE_COUNT_OFFLOAD_DROP,   /* an owner's DROP of a copy for room (failed: refused) */
  STORE_COUNT_OFFLOAD_REPORT, /* files an owner reported at (re)join (failed: not taken) */
  STORE_COUNT_PROMOTION,      /* gets of a key on disk only (failed: not promoted) */
  STORE_COUNT_CLEAR,          /* CLEAR entries (failed: absent, nothing there, or busy) */
  STORE_COUNT_SLOTS
};
typedef struct store_op_count {
  uint64_t requests, failures;
} store_op_count;

typedef struct store_map_stats {
  uint64_t keys;                         /* objects in the map, committed or being put */
  uint64_t segments;                     /* mounted */
  uint64_t capacity_bytes;               /* of the mounted segments */
  uint64_t allocated_bytes;              /* of those, held by replicas */
  uint64_t evicted_keys, evicted_bytes;  /* since start */
  uint64_t clients;                      /* connected (filled by store_master_stats) */
  uint64_t serving;                      /* 1; 0 for an HA standby (filled by store_master_stats) */
  store_op_count ops[STORE_COUNT_SLOTS]; /* by STORE_* operation, and the revokes */
} store_map_stats;

/* A consistent snapshot of the counts (one lock hold, O(segments)). */
void store_map_stats_get(store_map *m, store_map_stats *out);

/* The journal (HA, ha.c; docs/store.md "High availability"): told every
 * change a new leader must not lose, under the map's lock, before the
 * request is answered. objects: n keys' records (NULL: the object left),
 * all or none (HA: one etcd transaction; n at most STORE_JOURNAL_BATCH);
 * segment: a mounted segment's record (NULL: it left). A record is one
 * line that store_map_restore_* read back. Each returns 0, or -1 when the
 * change is not journaled: a commit or a REGISTER is then refused (the
 * put fails, nothing is committed); a removal goes on (its record stays
 * behind, and a new leader restores an object that was removed). A
 * PUT_END of many keys journals its commits STORE_JOURNAL_BATCH at a time. */
#define STORE_JOURNAL_BATCH 128 /* etcd's --max-txn-ops by default */
typedef struct store_journal {
  void *ctx;
  int (*objects)(void *ctx, size_t n, const char *const *keys, const size_t *lens,
                 const char *const *records);
  int (*segment)(void *ctx, const char *name, const char *record);
} store_journal;
/* NULL turns it off (before a master that lost the lead drops everything). */
void store_map_set_journal(store_map *m, const store_journal *journal);
/* A new leader, before it serves: a journaled segment, mounted as an
 * orphan (owned by `orphan`, an id no connection has: ha.c draws them
 * from STORE_ORPHAN) until a client registers the same name, address and
 * length and adopts it; then a journaled object, its replicas taking their
 * exact extents. -1 for a record that does not parse or does not fit
 * (logged by the caller, skipped). */
#define STORE_ORPHAN (1ull << 63)
int store_map_restore_segment(store_map *m, uint64_t orphan, const char *name, const char *record);
int store_map_restore_object(store_map *m, const char *key, size_t len, const char *record);
/* Drops the orphans nobody adopted (as dead clients: their objects go,
 * their records too); how many objects went. */
size_t store_map_drop_orphans(store_map *m);
/* Answers one request of `client` (REGISTER included: it mounts the
 * segment the body names). The reply's entries go to reply; a request the
 * master refuses whole returns its status with the reason in why (the
 * connection stays up for FERRY_EVERSION, FERRY_EINVAL and FERRY_EBUSY; a
 * malformed body, FERRY_EPROTO, ends it). */
ferry_status store_map_serve(store_map *m, uint64_t client, uint8_t op, store_reader *r,
                             uint32_t count, store_writer *reply, char *why, size_t why_size);

/* A client left (its connection ended, or it fell silent): its segment and
 * every replica in it, and its pending puts, are gone. Returns how many
 * objects were dropped with it. */
size_t store_map_drop_client(store_map *m, uint64_t client);

#endif
