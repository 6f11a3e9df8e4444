/* shm.h - private to the same-host transport: the layout both processes
 * share, the messages of its UNIX-socket service, and the engine hooks.
 *
 * The target's service (shm_service.c) and the initiator's transport
 * (shm.c) talk over one SOCK_SEQPACKET connection per link: every message
 * is one shm_msg, optionally carrying file descriptors (SCM_RIGHTS). Both
 * ends are on one host and run the same library, so fields are native. */
#ifndef FERRY_SHM_H
#define FERRY_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/transport.h"

#define SHM_MAGIC 0x4d485346u /* "FSHM" */
/* 2: refusals in GREETING, MAP names the region; 3: the post page; 4: its
 * reclaim count; 5: the credit eventfd; 6: device regions in the table,
 * EXPORT */
#define SHM_VERSION 6
#define SHM_TABLE_CAPACITY (1u << 20) /* regions the shared table can list */
#define SHM_SLOTS 256                 /* copying channels per link */
#define SHM_MAX_FDS 5
/* Connections the service keeps at once (one descriptor each); later ones
 * are refused with FERRY_EBUSY until some close. */
#define SHM_CONNS_MAX 256

/* The target's region table, shared read-only with every initiator (the
 * memfd is sealed with F_SEAL_FUTURE_WRITE, so only the target's own
 * mapping of it can change it). seq is
 * a seqlock: odd while the table is rewritten, bumped by 2 per version.
 * Entries are sorted by addr and disjoint. ino != 0: the region lies in a
 * ferry_memory_alloc buffer (a memfd with that inode) that initiators map;
 * ino == 0: plain memory, reached with process_vm_writev/readv.
 *
 * place != 0: device memory (SHM_PLACE: its memory kind and device), which
 * the CPU cannot touch; ino is then the id of its allocation (not an
 * inode): the service numbers each device allocation holding registered
 * regions, and gives it a new number once none of its regions stays
 * registered, so an initiator's import of an older number is never used
 * for memory registered since. The initiator asks EXPORT for the
 * allocation's handle (memory/kind.h: export_handle) and imports it once
 * per id. */
typedef struct shm_table_entry {
  uint64_t addr, length, ino, place;
} shm_table_entry;

#define SHM_PLACE(kind, device) ((uint64_t)(kind) << 32 | (uint32_t)(device))
#define SHM_PLACE_KIND(place) ((unsigned)((place) >> 32))
#define SHM_PLACE_DEVICE(place) ((int)(uint32_t)(place))

typedef struct shm_table {
  uint64_t seq;
  uint64_t count;
  uint64_t truncated; /* nonzero: more regions registered than fit */
  uint64_t reserved[5];
  shm_table_entry entries[];
} shm_table;

#define SHM_TABLE_BYTES (sizeof(shm_table) + (size_t)SHM_TABLE_CAPACITY * sizeof(shm_table_entry))
/* One page of slots per link, read-write for both sides: a copying
 * channel's slot holds the table seq it checked against, 0 when idle. The
 * target only reads it, as untrusted input, and bounds every wait on it. */
#define SHM_SLOTS_BYTES ((size_t)SHM_SLOTS * sizeof(uint64_t))

/* The post page of a link (read-write for both sides, sealed against
 * resizing): after-landed messages (pool.c's LANDED notices) from the
 * initiator to the target, and the replies' grants (credits for the
 * initiator's next messages) back, so that a steady send crosses no
 * socket. Single producer, single consumer each way, indices counting up
 * forever; an entry is valid when its seq is its index + 1, written last.
 * The target reads the notices as untrusted input (indices, lengths, the
 * body: pool.c validates each as any LANDED), and the initiator bounds
 * what it reads of the credits. The initiator writes the link's eventfd
 * only when `sleeping` is set: no syscall per message while the target's
 * service is busy draining.
 *
 * `reclaims` counts the times the target took back the sender's slots
 * while this link lived (its control connections all ended: pool.c's
 * peer_gone), bumped before the slots go; each credit carries the count
 * it was granted under, and the initiator uses only credits of the
 * current count: one granted before a reclaim may name a slot that is
 * now another sender's.
 *
 * A sender that holds no credit while notices of its own are not served
 * yet sleeps on the link's second eventfd (the credit eventfd) instead of
 * asking the control connection: it counts itself in `awaiting`, then
 * looks at credits_given and tail again; the service writes that
 * eventfd after serving notices while `awaiting` is nonzero. Both sides
 * touch `awaiting` with a read-modify-write, the sender before it loads
 * tail and credits_given, the service after it stores them: of two
 * read-modify-writes of one word, the later reads what the earlier
 * published, so one of them sees the other (no fence needed).
 *
 * `closed`: the service is dropping the link (a hang-up, a cut, a
 * protocol error). It stores SHM_CLOSING, serves the ring once more, then
 * stores SHM_DRAINED, and only then counts the link out of the sender's
 * connections (its slots may then go). A sender loads `closed` after
 * publishing head (both sequentially consistent), so either the last
 * drain sees its notice, or it sees the link closing, waits for
 * SHM_DRAINED, and reads tail to learn whether its notice was served; one
 * that was not goes on the control connection instead, and is never
 * served late. */
#define SHM_NOTICES 64
#define SHM_CREDITS 64
#define SHM_CLOSING 1
#define SHM_DRAINED 2

typedef struct shm_notice {
  uint64_t seq;
  uint64_t len; /* bytes of body, at most FERRY_WIRE_POOL_MAX */
  uint8_t body[FERRY_WIRE_POOL_MAX];
} shm_notice;

typedef struct shm_credit {
  uint64_t seq;
  uint64_t issued_ns; /* CLOCK_MONOTONIC, shared by the host: its freshness */
  uint64_t reclaims;  /* the page's reclaims when it was granted */
  uint8_t grant[FERRY_WIRE_POOL_REPLY_SIZE];
  char pool[FERRY_WIRE_MAX_NAME]; /* NUL-terminated */
} shm_credit;

typedef struct shm_post {
  uint64_t head; /* notices published: the initiator writes it */
  uint64_t credits_taken;
  uint64_t awaiting; /* the initiator's threads asleep on the credit eventfd */
  uint64_t pad0[5];
  uint64_t tail; /* notices consumed: the target writes the rest of this line */
  uint64_t sleeping;
  uint64_t credits_given;
  uint64_t reclaims;
  uint64_t closed; /* SHM_CLOSING, then SHM_DRAINED, as the service drops the link */
  uint64_t pad1[3];
  shm_notice notices[SHM_NOTICES];
  shm_credit credits[SHM_CREDITS];
} shm_post;

typedef enum shm_msg_type {
  SHM_GREETING = 1, /* service -> initiator on connect: engine_id, probe_addr, nonce;
                       or only a nonzero status: refused (another user, too many) */
  SHM_HELLO = 2,    /* initiator: nonce, proof (when the target has a secret); engine_id,
                       probe_addr (where its memory holds engine_id) and name: who posts
                       the link's notices */
  SHM_ATTACH = 3,   /* service: status; fds = table (read-only), slots, and, when it
                       verified who posts, the post page, its eventfd (wakes the
                       service) and the credit eventfd (wakes the initiator) */
  SHM_SYNC = 4,     /* initiator: bring the table up to date with the registry */
  SHM_SYNCED = 5,   /* service: seq */
  SHM_MAP = 6,      /* initiator: ino of an allocation, addr/length: the region it wants */
  SHM_MAPPED = 7,   /* service: status, ino, addr, length; fd = the memfd */
  SHM_EXPORT = 8,   /* initiator: ino (an allocation id), addr/length: the device region
                       it wants */
  SHM_EXPORTED = 9, /* service: status (and name: why not), ino, place, addr/length: the
                       allocation (the region's offset in it: its addr - addr), handle;
                       fd = a VMM allocation's POSIX fd (none for a CUDA IPC handle) */
} shm_msg_type;

#define SHM_HANDLE_MAX 64 /* bytes of an exported allocation's handle */

typedef struct shm_msg {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  int32_t status;
  uint32_t auth_required;
  uint64_t engine_id;
  uint64_t probe_addr; /* GREETING: target address holding engine_id, for a CMA probe */
  uint64_t ino, addr, length;
  uint64_t seq;
  uint8_t nonce[FERRY_WIRE_NONCE_SIZE];
  uint8_t proof[FERRY_WIRE_PROOF_SIZE];
  char name[FERRY_WIRE_MAX_NAME + 1]; /* HELLO: the initiator engine's name */
  uint64_t place;                     /* EXPORTED: SHM_PLACE */
  uint32_t handle_len;
  uint8_t handle[SHM_HANDLE_MAX]; /* EXPORTED */
} shm_msg;

/* Fills the fixed fields of a message of `type`. */
void shm_msg_init(shm_msg *m, shm_msg_type type);
/* Sends one message with up to SHM_MAX_FDS descriptors; 0 or -errno. */
int shm_msg_send(int fd, const shm_msg *m, const int *fds, int nfds, int flags);
/* Receives one message of the expected type; descriptors received go to
 * fds (closed on any failure). 0, -errno, or -EPROTO for a bad message. */
int shm_msg_recv(int fd, shm_msg *m, shm_msg_type type, int *fds, int *nfds, int flags);

/* "@name" is an abstract-namespace socket, anything else a path. */
int shm_sockaddr(const char *path, void *addr, unsigned *len);

extern const ferry_transport ferry_transport_shm;

/* The service hooks of ferry_transport_shm (transport.h). start: the
 * service (fills e->shm, e->shm_path). revoke, its fence: rewrite the table
 * and return once no initiator copy that checked the old table runs,
 * cutting off the links still copying after timeout_ms. */
ferry_status ferry_shm_service_start(ferry_engine *engine);
void ferry_shm_service_stop(ferry_engine *engine);
void ferry_shm_revoke(ferry_engine *engine, ferry_region *removed, size_t count);
/* The pools take back peer's slots: its links' credits granted so far are
 * void (the post page's reclaims). */
void ferry_shm_peer_gone(ferry_engine *engine, uint64_t peer);
/* Test seam: parks the service thread (hold, returns once it is parked)
 * or lets it go on (!hold), so a test can keep notices unserved. */
void ferry_shm_service_hold(ferry_engine *engine, int hold);
/* Test seam: the service shuts every link down, as it does one whose copy
 * outlasted an unregister (its initiator sees the hang-up). */
void ferry_shm_service_cut_links(ferry_engine *engine);
/* Whether processes of this uid are served, and served by: the engine's
 * own uid or one in cfg.shm_allowed_uids. */
int ferry_shm_uid_allowed(const ferry_engine *engine, uid_t uid);

#endif
