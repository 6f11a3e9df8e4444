/* protocol.h - the bodies of STORE and STORE_REPLY frames (wire.h) between a
 * store client and its master, and the checked codec both sides build them
 * with. All integers little-endian; a string is u16 length | bytes.
 *
 * STORE body:  u8 op | op's fields | header.count entries
 * REPLY body:  header.count entries (header.status != 0: the reason text)
 *
 *   op          fields                          entry                reply entry
 *   REGISTER    u16 version, u64 base, u64 size,
 *               str segment name, u64 nonce     (none)               u32 lease ms | u32 ping ms |
 *                                                                    str files' dir ("": none) |
 *                                                                    str CXL pool ("": none) |
 *                                                                    u64 its base | u64 size
 *   PING        -                               (none)               (none)
 *   PUT_START   u8 replicas, u8 n, n * str      str key | u64 size   i32 status | replicas, or
 *               preferred (n <= 9), u8 pin                           (status != 0) str reason
 *               (FERRY_STORE_PIN_*),
 *               u8 soft pin action, u8 TTL given,
 *               u64 soft pin TTL ms
 *   UPSERT_START  as PUT_START                                       as PUT_START
 *   PUT_END     -                               str key | i32 outcome i32 status
 *                                               | u8 file written
 *   GET         -                               str key              i32 status | u64 size |
 *                                                                    replicas | u8 flags
 *   QUERY       -                               str key              i32 status | u64 size
 *   REMOVE      -                               str key              i32 status
 *   REMOVE_ALL  -                               (none)               u64 removed
 *   DROP_FILE   -                               str key              i32 status
 *   OFFLOAD_POLL str segment, u64 nonce,        (none)               u32 n | n * (u8 task |
 *               u32 wait ms, u32 max tasks                           str key | u64 addr | u64 size)
 *   OFFLOAD_DONE str segment, u64 nonce         u8 task | str key    i32 status (not OK: the
 *                                               | i32 outcome        client deletes the file;
 *                                                                    DROP: see below)
 *   REPLICAS    -                               str key              i32 status | u64 size |
 *                                                                    u8 n | n * (u8 kind |
 *                                                                    str location | u64 addr)
 *   CLEAR       str segment ("": all)           str key              i32 status
 *   replicas:   u8 n | n * (str segment | u64 addr)
 *
 * A PUT_START entry with status 0 and no replicas: the key is stored
 * already, nothing to write. A soft pin the master refuses (a TTL without
 * ENABLE, one above its maximum) refuses the whole request (FERRY_EINVAL).
 * UPSERT_START always places a new value (a stored key's too: its PUT_END
 * replaces the old one); PUT_END ends both.
 * REGISTER's nonce: random, chosen by the client for its segment's memory
 * at open and kept across its reconnects (0: no segment); after an HA
 * failover the new leader gives a restored segment back only to a REGISTER
 * of its name, address, size and nonce. The version is read first: a
 * REGISTER of another version is refused with FERRY_EVERSION whatever
 * follows it.
 * REPLICAS: where a committed object is (ferry_store_replicas_batch),
 * touching nothing (no lease, no LRU use); kind FERRY_STORE_REPLICA_*:
 * MEMORY (its segment and address), DISK (the --root_fs_dir file's path,
 * addr 0), LOCAL_DISK (the offload copy's owner: its segment, addr 0). A
 * missing or pending key: FERRY_ENOTFOUND, size 0, no replicas.
 * CLEAR (Mooncake's batch_replica_clear): a committed object no lease
 * holds loses its replicas in the segment named, with the offload copy its
 * client keeps, and goes when nothing is left; "" clears all of them (a
 * REMOVE). Status FERRY_ENOTFOUND: absent, pending, or nothing in that
 * segment; FERRY_EBUSY: a get's lease, or an offload or load under way.
 * A GET entry's flags: STORE_GET_ON_DISK, the object has a complete file
 * (with no replicas: it is in its file only, disk.h); STORE_GET_LOADED, its
 * replica is a copy loaded back from its owner's offload disk for gets. DROP_FILE: the caller found
 * the key's file missing or damaged. OFFLOAD_*: --enable_offload (docs/store.md "Client-owned SSD
 * offload"), sent on a client's second connection, naming its segment and
 * the segment's nonce. A GET of an object on its owner's disk only waits
 * while the owner loads it back into its segment, then answers that
 * replica (FERRY_ETIMEDOUT past a lease). Everything decoded comes from the network: the reader
 * fails (and stays failed) on any field past the body's end. */
#ifndef FERRY_STORE_PROTOCOL_H
#define FERRY_STORE_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "wire/wire.h"

#define STORE_PROTOCOL_VERSION                                                                     \
  7 /* 2: PUT_START's pin and refusal reasons; 3: the SSD tier, UPSERT_START,                      \
       soft pin actions and TTLs; 4: REGISTER's segment nonce;                                     \
       5: REPLICAS, OFFLOAD_DONE's REPORT; 6: REGISTER's CXL pool; 7: CLEAR,                       \
       PUT_START's preferred segments */
#define STORE_KEY_MAX 1024   /* bytes of a key */
#define STORE_BATCH_MAX 4096 /* entries of one frame; a client cuts larger batches */
#define STORE_REPLICAS_MAX 8 /* replicas of one object */
#define STORE_NAME_MAX FERRY_WIRE_MAX_NAME
#define STORE_LOCATION_MAX 2048 /* bytes of a REPLICAS location (a segment or a file's path) */
#define STORE_REASON_MAX 512    /* bytes of a refused PUT_START entry's reason */
#define STORE_PREFERRED_MAX 9   /* preferred segments of a PUT_START: the first and 8 more */

typedef enum store_op {
  STORE_REGISTER = 1,
  STORE_PING = 2,
  STORE_PUT_START = 3,
  STORE_PUT_END = 4,
  STORE_GET = 5,
  STORE_QUERY = 6,
  STORE_REMOVE = 7,
  STORE_REMOVE_ALL = 8,
  STORE_DROP_FILE = 9,
  STORE_UPSERT_START = 10,
  STORE_OFFLOAD_POLL = 11, /* --enable_offload: an offloading client's tasks (offload.c) */
  STORE_OFFLOAD_DONE = 12, /* ... and what became of them */
  STORE_REPLICAS = 13,     /* where keys' objects are (ferry_store_replicas_batch) */
  STORE_CLEAR = 14,        /* keys' replicas, all or one segment's (ferry_store_clear_batch) */
  STORE_OP_LAST = STORE_CLEAR,
} store_op;

/* A GET entry's flags (after its replicas). */
enum { STORE_GET_ON_DISK = 1, STORE_GET_LOADED = 2 };

/* An offloading client's tasks (OFFLOAD_POLL's reply). */
enum { STORE_TASK_OFFLOAD = 1, STORE_TASK_LOAD = 2, STORE_TASK_DELETE = 3 };
/* In OFFLOAD_DONE only: the client drops its copy of an object to make
 * room in its directory (its capacity); the master forgets it first
 * (FERRY_OK, or FERRY_ENOTFOUND: not a copy it knew), FERRY_EBUSY while
 * a get has it loaded back (the file stays). */
#define STORE_TASK_DROP 4
/* In OFFLOAD_DONE only, its outcome followed by a u64 value size: a file
 * the client holds, told when it (re)joins a master (a restarted one, or
 * this client's new process): FERRY_OK when the master keeps it (as a
 * disk-only object, or one it knew), anything else: delete it. */
#define STORE_TASK_REPORT 5

/* A growing body (malloc'd); `failed` once an allocation failed. */
typedef struct store_writer {
  uint8_t *buf;
  size_t len, cap;
  int failed;
} store_writer;

void store_put_u8(store_writer *w, uint8_t v);
void store_put_u16(store_writer *w, uint16_t v);
void store_put_u32(store_writer *w, uint32_t v);
void store_put_u64(store_writer *w, uint64_t v);
void store_put_str(store_writer *w, const char *s, size_t len);
void store_put_raw(store_writer *w, const void *data, size_t len); /* no length before it */
void store_writer_free(store_writer *w);

/* A body being decoded; `bad` once a field ran past its end. */
typedef struct store_reader {
  const uint8_t *p;
  size_t left;
  int bad;
} store_reader;

uint8_t store_get_u8(store_reader *r);
uint16_t store_get_u16(store_reader *r);
uint32_t store_get_u32(store_reader *r);
uint64_t store_get_u64(store_reader *r);
/* A string of at most max bytes (longer: bad); *s points into the body. */
void store_get_str(store_reader *r, const char **s, size_t *len, size_t max);

/* One replica as a reply lists it (segment points into the body). */
typedef struct store_replica_ref {
  const char *segment;
  size_t segment_len;
  uint64_t addr;
} store_replica_ref;
/* Replicas of a reply entry: FERRY_EPROTO naming `peer` when malformed. */
ferry_status store_get_replicas(store_reader *r, store_replica_ref *out, unsigned *count,
                                const char *peer);

/* Sends one frame of `type` (the header's count and status as given) with
 * w's body; w is consumed. */
struct ferry_sock;
ferry_status store_send(struct ferry_sock *s, uint8_t type, uint32_t count, int32_t status,
                        store_writer *w, const char *step);
/* Receives one frame's header and body (malloc'd into *body). */
ferry_status store_recv(struct ferry_sock *s, ferry_frame_header *h, uint8_t **body,
                        const char *step);

#endif
