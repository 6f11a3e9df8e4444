/* wire.h - ferry's wire protocol: frame layout, codecs and their checks.
 *
 * Every frame is a 32-byte header followed by body_len bytes of body. All
 * integers are little-endian. Everything decoded from the network goes
 * through a function here that checks lengths and limits first; a frame
 * that fails these checks makes the receiver close the connection.
 *
 * Header: magic u32 | type u8 | flags u8 | reserved u16 (0) | count u32 |
 *         status i32 | body_len u64 | id u64
 *
 * Conversation on a connection (initiator "c", target "s"):
 *   c: HELLO          s: HELLO_REPLY (status != 0: refused, body = reason)
 *   c: AUTH (if HELLO_REPLY asked for it)   s: AUTH_REPLY (its proof, facts)
 *   then any number of requests, each answered in order:
 *   REGIONS_REQ (the ranges it needs) -> REGIONS_REPLY (the regions there),
 *   WRITE -> WRITE_ACK, READ -> READ_REPLY,
 *   NOTIFY -> NOTIFY_ACK, PING -> PONG, POOL -> POOL_REPLY (bodies in pool.c;
 *   a target older than pools closes the connection on POOL, which the
 *   sender reports as a target without pools).
 * A store master (src/store) speaks the same handshake on its own port,
 * then STORE -> STORE_REPLY (bodies in store/protocol.h).
 * A reply with status != 0 carries the target's reason as its body (text).
 *
 * With a shared secret the target's facts (engine id, transports, boot id,
 * pid, transport descriptors) travel in AUTH_REPLY, after the initiator proved the
 * secret, not in HELLO_REPLY. Every frame after AUTH_REPLY is sealed
 * (ferry_sock, auth.c): a 16-byte tag follows the header and the frame's
 * head (ferry_wire_split), and another follows its payload, if any. body_len
 * never counts tags. */
#ifndef FERRY_WIRE_H
#define FERRY_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#define FERRY_WIRE_MAGIC 0x59525246u /* "FRRY" */
/* 2: proofs over the handshake transcript, facts after AUTH, sealed frames.
 * 3: the facts carry a list of transport descriptors, not an shm path.
 * 4: region tables carry per-transport keys. */
#define FERRY_WIRE_VERSION_MIN 4
#define FERRY_WIRE_VERSION_MAX 5 /* 5: CUT */
#define FERRY_WIRE_HEADER_SIZE 32
#define FERRY_WIRE_SEGMENT_SIZE 16                /* u64 addr, u64 length */
#define FERRY_WIRE_MAX_SEGMENTS 1024              /* per data frame (IOV_MAX) */
#define FERRY_WIRE_MAX_PAYLOAD (64ull << 20)      /* per data frame */
#define FERRY_WIRE_MAX_CONTROL_BODY (32ull << 20) /* region tables etc. */
#define FERRY_WIRE_MAX_REASON 1024                /* error text in replies */
#define FERRY_WIRE_MAX_NAME 256                   /* notification name */
#define FERRY_WIRE_MAX_NOTIFY_DATA (4u << 20)     /* notification payload */
#define FERRY_WIRE_NONCE_SIZE 16
#define FERRY_WIRE_PROOF_SIZE 32 /* HMAC-SHA256 */
#define FERRY_WIRE_BOOT_ID_SIZE 16
#define FERRY_WIRE_MAX_DESCRIPTORS 4      /* transports a target describes */
#define FERRY_WIRE_MAX_DESCRIPTOR 512     /* bytes of one transport's descriptor */
#define FERRY_WIRE_MAX_KEY 64             /* bytes of one region's key for one transport */
#define FERRY_WIRE_MAX_REGION_RANGES 1024 /* address ranges one REGIONS_REQ asks for */
#define FERRY_WIRE_POOL_FIXED 28
#define FERRY_WIRE_POOL_MAX (FERRY_WIRE_POOL_FIXED + 2 * FERRY_WIRE_MAX_NAME)
#define FERRY_WIRE_POOL_REPLY_SIZE 32 /* a grant */

typedef enum ferry_frame_type {
  FERRY_FRAME_HELLO = 1,
  FERRY_FRAME_HELLO_REPLY = 2,
  FERRY_FRAME_AUTH = 3,
  FERRY_FRAME_AUTH_REPLY = 4,
  FERRY_FRAME_REGIONS_REQ = 5,
  FERRY_FRAME_REGIONS_REPLY = 6,
  FERRY_FRAME_WRITE = 7,
  FERRY_FRAME_WRITE_ACK = 8,
  FERRY_FRAME_READ = 9,
  FERRY_FRAME_READ_REPLY = 10,
  FERRY_FRAME_NOTIFY = 11,
  FERRY_FRAME_NOTIFY_ACK = 12,
  FERRY_FRAME_PING = 13,
  FERRY_FRAME_PONG = 14,
  FERRY_FRAME_POOL = 15,       /* receive pools: a grant request or a landed notice (pool.c) */
  FERRY_FRAME_POOL_REPLY = 16, /* its answer: a grant, or none */
  /* v5: an initiator asks the target to stop serving one of its data
   * connections (named by its HELLO nonce) before its WRITEs move elsewhere */
  FERRY_FRAME_CUT = 17,
  FERRY_FRAME_CUT_REPLY = 18, /* once that connection touches no memory */
  /* The store's requests and replies, on a store master's own port only
   * (src/store/protocol.h holds their bodies); an engine refuses them. */
  FERRY_FRAME_STORE = 19,
  FERRY_FRAME_STORE_REPLY = 20,
  FERRY_FRAME_LAST = FERRY_FRAME_STORE_REPLY, /* a new type goes above and moves this */
} ferry_frame_type;

/* flags */
/* WRITE: payload followed by its crc32c (u32). READ: asks for a checksummed
 * reply. READ_REPLY: payload followed by its crc32c. */
#define FERRY_FRAME_FLAG_CHECKSUM 0x1
/* WRITE: the payload is followed by an after-landed message (a POOL body,
 * FERRY_WIRE_POOL_FIXED..FERRY_WIRE_POOL_MAX bytes, before the crc, which
 * covers it too), served by the target once the payload landed and before
 * it acks. WRITE_ACK (status 0): its POOL_REPLY body follows. */
#define FERRY_FRAME_FLAG_AFTER 0x2

typedef struct ferry_frame_header {
  uint8_t type;
  uint8_t flags;
  uint32_t count; /* segments in WRITE/READ, ranges in REGIONS_REQ, regions in REGIONS_REPLY */
  int32_t status; /* replies: ferry_status of the request */
  uint64_t body_len;
  uint64_t id; /* request id, echoed by the reply */
} ferry_frame_header;

void ferry_wire_header_encode(uint8_t out[FERRY_WIRE_HEADER_SIZE], const ferry_frame_header *h);
/* Checks magic, reserved bits, known type, and the per-type limits of
 * body_len and count (see wire.c). FERRY_EPROTO with detail on failure. */
ferry_status ferry_wire_header_decode(const uint8_t in[FERRY_WIRE_HEADER_SIZE],
                                      ferry_frame_header *h);

/* Segment tables of WRITE and READ frames: count * (u64 addr, u64 length). */
void ferry_wire_segments_encode(uint8_t *out, const ferry_region *segs, uint32_t count);
/* Decodes and checks: every length > 0, no wrap-around, total <= the max
 * payload. *total gets the sum of lengths. */
ferry_status ferry_wire_segments_decode(const uint8_t *in, uint32_t count, ferry_region *segs,
                                        uint64_t *total);

typedef enum ferry_conn_kind { FERRY_CONN_CONTROL = 1, FERRY_CONN_DATA = 2 } ferry_conn_kind;

typedef struct ferry_hello {
  uint16_t version_min, version_max;
  uint8_t conn_kind;  /* ferry_conn_kind */
  uint64_t engine_id; /* initiator's random instance id */
  uint8_t nonce[FERRY_WIRE_NONCE_SIZE];
  char name[FERRY_WIRE_MAX_NAME + 1]; /* initiator's own name, for logs */
} ferry_hello;

/* What one transport of the target tells initiators about itself (shm: its
 * service's socket path), opaque here: that transport's usable hook
 * decodes and checks it as untrusted input. */
typedef struct ferry_wire_descriptor {
  uint32_t transport; /* one FERRY_TRANSPORT_* bit */
  uint16_t len;
  uint8_t data[FERRY_WIRE_MAX_DESCRIPTOR];
} ferry_wire_descriptor;

/* HELLO_REPLY is the negotiation (version .. nonce) followed by the facts
 * (engine_id .. descriptors), unless auth_required: then the facts come in
 * AUTH_REPLY, after the target's proof, and are zero here. */
typedef struct ferry_hello_reply {
  uint16_t version;                  /* chosen */
  uint16_t version_min, version_max; /* target's range */
  uint8_t auth_required;
  uint8_t nonce[FERRY_WIRE_NONCE_SIZE];
  uint64_t engine_id;                       /* target's random instance id */
  uint32_t transports;                      /* FERRY_TRANSPORT_* it serves */
  uint8_t boot_id[FERRY_WIRE_BOOT_ID_SIZE]; /* same host <=> same boot id */
  uint32_t pid;
  uint8_t descriptor_count; /* distinct transports, each at most once */
  ferry_wire_descriptor descriptors[FERRY_WIRE_MAX_DESCRIPTORS];
} ferry_hello_reply;

/* The descriptor the target gave for `transport`, or NULL. */
const ferry_wire_descriptor *ferry_wire_descriptor_find(const ferry_hello_reply *reply,
                                                        unsigned transport);

/* Encoders return the number of bytes written into out (sized by the
 * *_max_size constants), decoders check body_len exactly. */
#define FERRY_WIRE_HELLO_MAX (2 + 2 + 1 + 8 + FERRY_WIRE_NONCE_SIZE + 2 + FERRY_WIRE_MAX_NAME)
#define FERRY_WIRE_NEGOTIATION_SIZE (2 + 2 + 2 + 1 + FERRY_WIRE_NONCE_SIZE)
#define FERRY_WIRE_FACTS_MAX                                                                       \
  (8 + 4 + FERRY_WIRE_BOOT_ID_SIZE + 4 + 1 +                                                       \
   FERRY_WIRE_MAX_DESCRIPTORS * (4 + 2 + FERRY_WIRE_MAX_DESCRIPTOR))
#define FERRY_WIRE_HELLO_REPLY_MAX (FERRY_WIRE_NEGOTIATION_SIZE + FERRY_WIRE_FACTS_MAX)
#define FERRY_WIRE_AUTH_REPLY_MAX (FERRY_WIRE_PROOF_SIZE + FERRY_WIRE_FACTS_MAX)
size_t ferry_wire_hello_encode(uint8_t *out, const ferry_hello *hello);
ferry_status ferry_wire_hello_decode(const uint8_t *in, size_t len, ferry_hello *hello);
size_t ferry_wire_hello_reply_encode(uint8_t *out, const ferry_hello_reply *reply);
ferry_status ferry_wire_hello_reply_decode(const uint8_t *in, size_t len, ferry_hello_reply *reply);
/* The facts alone (the part of AUTH_REPLY after the proof). */
size_t ferry_wire_facts_encode(uint8_t *out, const ferry_hello_reply *reply);
ferry_status ferry_wire_facts_decode(const uint8_t *in, size_t len, ferry_hello_reply *reply);

/* Where a sealed frame's tags go: *head bytes of body after the header
 * (segment table, control body or reason), then *payload bytes (WRITE and
 * READ_REPLY data with its crc). The header must have passed decode. */
void ferry_wire_split(const ferry_frame_header *h, uint64_t *head, uint64_t *payload);

/* What one transport needs, besides the address, to reach each region of a
 * table (an RDMA memory key): `size` bytes per region, in table order. */
typedef struct ferry_region_keys {
  uint32_t transport; /* one FERRY_TRANSPORT_* bit */
  uint16_t size;      /* 1..FERRY_WIRE_MAX_KEY */
  uint8_t *data;      /* count * size bytes */
} ferry_region_keys;

/* A decoded region table: sorted, disjoint regions and at most one key
 * section per transport. */
typedef struct ferry_region_table {
  ferry_region *regions;
  size_t count;
  unsigned key_sections;
  ferry_region_keys keys[FERRY_WIRE_MAX_DESCRIPTORS];
} ferry_region_table;

/* REGIONS_REPLY body: count * (u64 addr, u64 length), then u8 sections,
 * then per section u32 transport | u16 size | count * size key bytes. The
 * decoder checks sorted and disjoint regions, distinct known-bit sections,
 * sizes, and that nothing trails; *out owns what it decoded (free it with
 * ferry_region_table_free; on failure it is empty). */
size_t ferry_wire_regions_size(uint32_t count, const ferry_region_keys *keys, unsigned sections);
size_t ferry_wire_regions_encode(uint8_t *out, const ferry_region *regions, uint32_t count,
                                 const ferry_region_keys *keys, unsigned sections);
ferry_status ferry_wire_regions_decode(const uint8_t *in, size_t len, uint32_t count,
                                       ferry_region_table *out);
void ferry_region_table_free(ferry_region_table *table);

/* REGIONS_REQ body: count * (u64 addr, u64 length), the address ranges the
 * initiator needs (at most FERRY_WIRE_MAX_REGION_RANGES, sorted, disjoint,
 * none empty or wrapping); the reply holds the regions overlapping them.
 * count 0 (no body) asks for the whole table. The decoder checks it all
 * into out (room for count). */
void ferry_wire_ranges_encode(uint8_t *out, const ferry_region *ranges, uint32_t count);
ferry_status ferry_wire_ranges_decode(const uint8_t *in, size_t len, uint32_t count,
                                      ferry_region *out);

/* NOTIFY body: u16 name_len | name | data. Decoded name/data point into in. */
size_t ferry_wire_notify_size(size_t name_len, size_t data_len);
size_t ferry_wire_notify_encode(uint8_t *out, const char *name, const void *data, size_t data_len);
ferry_status ferry_wire_notify_decode(const uint8_t *in, size_t len, const char **name,
                                      size_t *name_len, const uint8_t **data, size_t *data_len);

/* POOL body: u8 op | u8 flags | u16 pool_len | u16 tag_len | u16 0 |
 * u32 wait_ms | u64 grant | u64 length | pool | tag. GRANT asks for length
 * bytes, waiting up to wait_ms for room, and gives back `grant` (0: none),
 * a pre-grant the sender no longer trusts. LANDED says `grant` holds a
 * message of length bytes under tag; with FERRY_POOL_NEXT it asks for a
 * pre-grant of the same size in the reply. Decoded names point into in. */
enum { FERRY_POOL_GRANT = 1, FERRY_POOL_LANDED = 2 };
#define FERRY_POOL_NEXT 0x1
typedef struct ferry_pool_req {
  uint8_t op, flags;
  uint32_t wait_ms;
  uint64_t grant, length;
  const char *pool, *tag;
  size_t pool_len, tag_len;
} ferry_pool_req;
size_t ferry_wire_pool_encode(uint8_t *out, const ferry_pool_req *r);
ferry_status ferry_wire_pool_decode(const uint8_t *in, size_t len, ferry_pool_req *r);
/* POOL_REPLY body: u64 instance | u64 grant (0: none) | u64 addr | u64 length. */
typedef struct ferry_pool_grant {
  uint64_t instance, id, addr, length;
} ferry_pool_grant;
void ferry_wire_grant_encode(uint8_t out[FERRY_WIRE_POOL_REPLY_SIZE], const ferry_pool_grant *g);
void ferry_wire_grant_decode(const uint8_t in[FERRY_WIRE_POOL_REPLY_SIZE], ferry_pool_grant *g);

/* crc32c (Castagnoli), for checksum mode; crc is the running value (start 0). */
uint32_t ferry_crc32c(uint32_t crc, const void *data, size_t len);

#endif
