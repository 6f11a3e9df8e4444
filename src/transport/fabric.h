/* fabric.h - private to the libfabric (RDMA-class) transport of issue 12:
 * the provider probe `ferry doctor` reports with (fabric_probe.c), the
 * engine-wide service every engine runs when the transport is on
 * (fabric_service.c: provider choice, a domain per device, the target's
 * endpoints and progress threads, memory registrations and their keys) and the
 * descriptor the target publishes in its handshake facts; the key checks
 * libfabric fails, logged (fabric_log.c), and the receives that drop the
 * messages peers send to the target's endpoints (fabric_sink.c); libfabric
 * itself, loaded at first use (fabric_library.c). The initiator's channels
 * are in fabric.c. */
#ifndef FERRY_FABRIC_H
#define FERRY_FABRIC_H

#include <pthread.h>
#include <rdma/fabric.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/engine.h"

/* The libfabric entry points ferry calls (fabric_library.c fills them). */
typedef struct ferry_fabric_api {
  __typeof__(fi_getinfo) *getinfo;
  __typeof__(fi_dupinfo) *dupinfo;
  __typeof__(fi_freeinfo) *freeinfo;
  __typeof__(fi_fabric) *fabric;
  __typeof__(fi_open) *open;
  __typeof__(fi_strerror) *strerror;
} ferry_fabric_api;
extern ferry_fabric_api ferry_fi;

/* Loads libfabric once; 1 when ferry_fi is filled, else 0 with why (the
 * library, the feature and the package to install). Before any other call
 * of this header, except from a path that already loaded it. */
int ferry_fabric_library_load(char *why, size_t size);

/* The providers ferry drives, RDMA hardware first: InfiniBand/RoCE, AWS
 * EFA, then the tcp and shm providers that run the same RMA path without
 * an RDMA device. NULL-terminated. */
extern const char *const ferry_fabric_providers[];

/* Asks libfabric for one-sided RMA on a reliable-datagram endpoint of
 * `provider`. Returns 1 with its domains (devices or interfaces), progress
 * model and memory-registration modes in out, or 0 with why not (libfabric's
 * own words: "No data available" when no device exists). */
int ferry_fabric_probe(const char *provider, char *out, size_t size);

/* The entries of a fabric_device list ("mlx5_0,mlx5_9") that no domain of
 * provider (NULL: verbs;ofi_rxm or efa, as automatic choice) is named, in
 * missing ("mlx5_9"), with the domains that exist in have ("mlx5_0").
 * Returns how many are missing. */
int ferry_fabric_missing_devices(const char *provider, const char *list, char *missing,
                                 size_t missing_size, char *have, size_t have_size);

/* fi_getinfo hints for RMA on an RDM endpoint of provider, with delivery
 * completion, every MR mode ferry honours (basic: FI_MR_BASIC, which needs
 * API 1.4, the strict verbs/efa set) and thread safety; NULL: no memory or
 * no libfabric (loads it). */
struct fi_info *ferry_fabric_hints(const char *provider, int basic);
#define FERRY_FABRIC_API(basic) ((basic) ? FI_VERSION(1, 4) : FI_VERSION(1, 17))
/* A provider over the host's IP stack (tcp, net): pinned to the engine's
 * host; its fabric name is its subnet, which says nothing of reachability. */
int ferry_fabric_is_host_ip(const struct fi_info *info);
/* Appends each domain name of the list once ("eth0, lo"). */
void ferry_fabric_domains(const struct fi_info *info, char *out, size_t size);

#define FERRY_FABRIC_NAME_MAX 64  /* provider, fabric and domain names */
#define FERRY_FABRIC_ADDR_MAX 256 /* an fi_getname blob */
#define FERRY_FABRIC_KEY_SIZE 8   /* per region and domain in the table: the u64 key */
/* Devices (fabric_device entries), each its own domain: a key each per
 * region, within what the region table carries. */
#define FERRY_FABRIC_DOMAINS_MAX (FERRY_WIRE_MAX_KEY / FERRY_FABRIC_KEY_SIZE)

/* What a target publishes (describe) and an initiator decodes as untrusted
 * input (ferry_fabric_descriptor_decode). */
typedef struct ferry_fabric_descriptor {
  int virt_addr;    /* remote addresses are the target's virtual ones, else offsets */
  int domain_rails; /* rail r is the target's domain r: its key is the r-th in the table */
  char provider[FERRY_FABRIC_NAME_MAX + 1];
  char fabric[FERRY_FABRIC_NAME_MAX + 1];
  char domain[FERRY_FABRIC_NAME_MAX + 1];
  uint8_t addr[FERRY_FABRIC_ADDR_MAX]; /* fi_getname of its endpoint */
  size_t addr_len;
  unsigned rail_count; /* rail endpoints or domains (fabric.c's top comment); 0: none */
  uint8_t rail_addr[FERRY_RAILS_MAX][FERRY_FABRIC_ADDR_MAX];
  size_t rail_addr_len[FERRY_RAILS_MAX];
  unsigned lane_count; /* lanes besides the main endpoint (addr); 0: none */
  uint8_t lane_addr[FERRY_FABRIC_LANES_MAX - 1][FERRY_FABRIC_ADDR_MAX];
  size_t lane_addr_len[FERRY_FABRIC_LANES_MAX - 1];
} ferry_fabric_descriptor;

/* Wake words (shm, fabric_service.c's top comment): a shared page of one
 * word per lane, named after the target's address. */
#define FERRY_FABRIC_WAKE_PATH_MAX (FERRY_FABRIC_ADDR_MAX + 32)
#define FERRY_FABRIC_WAKE_SIZE 4096u
#define FERRY_FABRIC_WAKE_STRIDE 16u /* words: a cache line per lane */
#define FERRY_FABRIC_SLEEPING 1u
/* The wake page of a target with descriptor d: 1 with its path, 0 when its
 * provider has none (not shm, or an address of another form). */
int ferry_fabric_wake_path(const ferry_fabric_descriptor *d, char *out, size_t size);
/* Maps the wake page at path (create: a new one, for the target); NULL
 * with errno set when it cannot. */
uint32_t *ferry_fabric_wake_map(const char *path, int create);
void ferry_fabric_wake_unmap(uint32_t *words);
/* An initiator waiting on the lane: wakes its progress thread if it sleeps
 * on word. */
void ferry_fabric_nudge(uint32_t *word);

/* One memory registration, in a table sorted by address: one MR per
 * domain (mr[0] NULL: removed). */
typedef struct ferry_fabric_mr {
  uint64_t addr, length;
  int pool;   /* a receive pool: open to remote READ only (FERRY_REGISTER_POOL) */
  int device; /* CUDA device memory on this ordinal (FI_HMEM_CUDA); -1: host memory */
  struct fid_mr *mr[FERRY_FABRIC_DOMAINS_MAX];
} ferry_fabric_mr;

/* A domain: one device (an RDMA NIC; on IP providers an interface, or
 * the whole host for the engine's own address) and its target AV. */
typedef struct ferry_fabric_domain {
  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_av *av; /* the target endpoints'; stays empty */
  unsigned lane;     /* its first lane in ferry_fabric.lanes */
} ferry_fabric_domain;

/* What peers did that the target refused (fabric_log.c): remote
 * operations with a key, access or range no registration has, as
 * libfabric's log tells; messages its sinks dropped. Atomics. */
typedef struct ferry_fabric_refusals {
  uint64_t count;
  uint64_t line_ns;       /* when the last WARN line was written; 0: never */
  uint64_t count_at_line; /* count then */
} ferry_fabric_refusals;

/* A target endpoint's receives that drop messages (fabric_sink.c). */
#define FERRY_FABRIC_SINK_RECVS 32 /* of each kind: messages, tagged */
#define FERRY_FABRIC_SINK_BYTES 64 /* a message's bytes kept, the rest truncated */
typedef struct ferry_fabric_sink {
  struct ferry_fabric *fabric;
  struct fid_ep *ep; /* NULL: no sink */
  struct fid_mr *mr;
  uint8_t posted[2 * FERRY_FABRIC_SINK_RECVS];
  uint8_t buf[2 * FERRY_FABRIC_SINK_RECVS][FERRY_FABRIC_SINK_BYTES];
} ferry_fabric_sink;

/* A lane of the target: an endpoint with its own CQ and progress thread
 * (fabric_service.c's top comment). Lane 0 is the main endpoint. */
typedef struct ferry_fabric_lane {
  struct ferry_fabric *fabric;
  ferry_fabric_domain *dom; /* the domain its endpoint is in */
  struct fid_ep *ep;
  struct fid_cq *cq;
  struct fid_cntr *cntr; /* remote RMA events: activity, where the CQ has no fd */
  int cq_fd;             /* the CQ's wait fd, -1 where the provider has none */
  int wake_fd;           /* eventfd: stop, quiesce */
  pthread_t thread;
  int running;
  uint64_t quiesce_seen; /* under the fabric's quiesce_lock */
  uint64_t rounds;       /* progress rounds (wake-ups) so far: a busy lane counts many */
  uint32_t *sleep_word;  /* shm: its wake word; NULL: sleeps are capped instead */
  uint64_t woken;        /* sleeps on the wake word that a flip of it ended */
  ferry_fabric_sink sink;
} ferry_fabric_lane;

typedef struct ferry_fabric {
  ferry_engine *engine;
  struct fi_info *info; /* domains[0]'s: the provider's facts, the same in each */
  ferry_fabric_domain domains[FERRY_FABRIC_DOMAINS_MAX];
  unsigned domain_count;
  /* Domain 0's lanes first, then one per further domain. */
  ferry_fabric_lane lanes[FERRY_FABRIC_LANES_MAX + FERRY_FABRIC_DOMAINS_MAX - 1];
  unsigned lane_count;
  unsigned next_lane; /* initiator: the lane the next channel aims at (atomic) */
  unsigned cpus;      /* online when the service started: lanes, and a batch's channels */
  struct fid_ep *rail_eps[FERRY_RAILS_MAX]; /* one per rail host, on lane 0's CQ */
  ferry_fabric_sink rail_sinks[FERRY_RAILS_MAX];
  int stop;
  /* Deregistration waits until every progress thread began a new round: a
   * copy into a registration (software providers copy in the target's
   * progress call) that was under way when it was closed has then ended. */
  pthread_mutex_t quiesce_lock;
  pthread_cond_t quiesce_cond;
  uint64_t quiesce_asked;
  uint32_t *wake_words; /* shm: the lanes' wake words, shared with initiators */
  char wake_path[FERRY_FABRIC_WAKE_PATH_MAX];
  int virt_addr, prov_key, mr_endpoint;
  ferry_fabric_descriptor self; /* what describe publishes */

  pthread_rwlock_t mr_lock; /* the table; writers are serialized by the engine too */
  ferry_fabric_mr *mrs;
  size_t mr_count, mr_cap;
  /* Where the provider takes ferry's keys (no PROV_KEY): 64 random bits
   * from the kernel (getrandom), 0 when it has none; tests put their own. */
  uint64_t (*draw_key)(void);
  ferry_fabric_refusals refusals; /* remote operations, by key, access or range */
  ferry_fabric_refusals messages; /* messages the sinks dropped */
  /* Device memory (memory/kind.h): registered with the provider where it
   * has FI_HMEM (asked for on hosts with a CUDA driver) and takes CUDA
   * memory; atomic, cleared for good by the first registration it refuses.
   * Else staged through host bounce buffers (fabric.c), no_hmem saying why
   * (written before hmem is cleared), logged once (staging_said). */
  int hmem;
  int staging_said;
  char no_hmem[192];
  uint64_t aborts;  /* accepted connections aborted by deregistrations (fabric_sockets.c) */
  uint64_t reposts; /* initiator: operations moved again after a target's abort (fabric.c) */
} ferry_fabric;

ferry_status ferry_fabric_service_start(ferry_engine *engine);
void ferry_fabric_service_stop(ferry_engine *engine);
size_t ferry_fabric_describe(ferry_engine *engine, uint8_t *out, size_t size);
/* 1 when in holds a well-formed descriptor, else 0 with why. */
int ferry_fabric_descriptor_decode(const uint8_t *in, size_t len, ferry_fabric_descriptor *d,
                                   char *why, size_t why_size);

/* A fresh key for one registration in a domain that takes ferry's keys
 * (f->prov_key 0): random, within the provider's mr_key_size, never 0, so
 * a peer that was not given it cannot guess it (RELIABILITY.md 16). 0
 * (errno set) when the kernel has no random bits for it. */
uint64_t ferry_fabric_new_key(const ferry_fabric *f);
ferry_status ferry_fabric_region_register(ferry_engine *engine, const ferry_region *regions,
                                          size_t count, unsigned flags);
void ferry_fabric_region_deregister(ferry_engine *engine, const ferry_region *regions,
                                    size_t count);
size_t ferry_fabric_region_key_size(ferry_engine *engine);
void ferry_fabric_region_keys(ferry_engine *engine, const ferry_region *regions, size_t count,
                              uint8_t *out);
/* Logs once per engine that device memory moves through host bounce
 * buffers here, and why (f->no_hmem); nothing while the provider has
 * FI_HMEM. */
void ferry_fabric_say_staged(ferry_fabric *f);
/* The local descriptor (fi_mr_desc) in domain dom of the registration
 * holding [addr, addr+length); 0 when this engine registered no such
 * memory. */
int ferry_fabric_local_desc(ferry_fabric *fabric, unsigned dom, const void *addr, size_t length,
                            void **desc);

/* Sockets under the IP providers (fabric_sockets.c). The sockaddr in an
 * IP provider's endpoint name: its length, 0 if it holds none. */
socklen_t ferry_fabric_ip_endpoint(const uint8_t *addr, size_t len, struct sockaddr_storage *out);
int ferry_fabric_same_endpoint(const struct sockaddr_storage *a, const struct sockaddr_storage *b);
/* Calls fn for each socket descriptor of the process; -1 (errno set) when
 * /proc/self/fd cannot be listed. */
int ferry_fabric_each_socket(void (*fn)(int fd, void *arg), void *arg);
/* Aborts every connection the target's endpoints accepted (a reset, its
 * received bytes dropped); how many, or -1 when the sockets cannot be
 * listed. */
int ferry_fabric_abort_accepted(ferry_fabric *f);

/* libfabric's log while a fabric service runs (fabric_log.c): the key
 * checks it fails become ferry WARN lines. Process-wide, counted: each
 * service start holds it, each stop releases it. */
void ferry_fabric_log_hold(void);
void ferry_fabric_log_release(void);
/* The calling thread makes f's target progress calls: the refusals it
 * meets are f's (NULL: none). */
void ferry_fabric_log_serving(struct ferry_fabric *f);
/* Counts one refusal in r: 1 when the caller is to write its WARN line
 * now (the first at once, then one per 10 s at most), with since saying
 * how many the line stands for. */
int ferry_fabric_refusal_count(ferry_fabric_refusals *r, char *since, size_t size);

/* Receives that drop messages (fabric_sink.c): open on a target endpoint
 * once enabled (none where the provider takes no receives there), refill
 * each progress round, close after the endpoint. took: 1 when context was
 * one of s's receives (the message counted, logged and dropped). */
void ferry_fabric_sink_open(struct ferry_fabric *f, ferry_fabric_domain *dom, struct fid_ep *ep,
                            ferry_fabric_sink *s);
void ferry_fabric_sink_refill(ferry_fabric_sink *s);
int ferry_fabric_sink_took(ferry_fabric_sink *s, void *context, int err);
void ferry_fabric_sink_close(ferry_fabric_sink *s);

/* A CQ that sleeps on an fd (*fd) where the provider has one, else a
 * polled one (*fd = -1). 0 or a negative libfabric error. */
int ferry_fabric_cq_open(struct fid_domain *domain, struct fid_cq **cq, int *fd);

/* Waiting without a wait fd: yields for a while, then sleeps longer and
 * longer (capped), so an idle poller costs ~0 CPU; a write to wake_fd
 * (-1: none) ends a sleep early. *idle counts the empty rounds; reset it
 * on activity. */
void ferry_fabric_backoff(unsigned *idle, int wake_fd);
/* Empties an eventfd that woke a poll. */
void ferry_fabric_consume(int wake_fd);

#endif
