/* ferry.h - the whole public C API of libferry.
 *
 * ferry moves bytes between processes by one-sided WRITE and READ of memory
 * that the peer has registered. Peers are named "host:port" (IPv6:
 * "[addr]:port") and found by a direct handshake, or by a segment name looked
 * up in a metadata service. Everything outside this header is private.
 *
 * Conventions: functions return a ferry_status (0 = FERRY_OK, negative =
 * error). On error, ferry_last_error() returns a message for the calling
 * thread naming the step, the peer and the cause. Handles are opaque. */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0
#define FERRY_VERSION_STRING "0.1.0"

/* Error codes. Stable numbers: bindings and logs may rely on them. */
typedef enum ferry_status {
  FERRY_OK = 0,
  FERRY_EINVAL = -1,       /* invalid argument */
  FERRY_ENOTREG = -2,      /* address not registered (local or remote) */
  FERRY_EOVERLAP = -3,     /* region overlaps a different registered region */
  FERRY_ENOMEM = -4,       /* out of memory */
  FERRY_ESOCKET = -5,      /* socket or connection error (refused, reset, lost) */
  FERRY_EDNS = -6,         /* host name could not be resolved */
  FERRY_EHANDSHAKE = -7,   /* peer rejected the handshake or answered nonsense */
  FERRY_EVERSION = -8,     /* incompatible wire-protocol version */
  FERRY_EAUTH = -9,        /* shared-secret proof failed */
  FERRY_ETIMEDOUT = -10,   /* deadline passed */
  FERRY_EPROTO = -11,      /* malformed frame from the network */
  FERRY_EMETADATA = -12,   /* metadata service failed or key missing */
  FERRY_EJSON = -13,       /* malformed JSON */
  FERRY_ENOTIMPL = -14,    /* not implemented / unsupported here */
  FERRY_EBUSY = -15,       /* resource busy */
  FERRY_ECHECKSUM = -16,   /* end-to-end checksum mismatch */
  FERRY_ETRANSPORT = -17,  /* no transport usable between the two peers */
  FERRY_ECLOSED = -18,     /* engine is shutting down */
  FERRY_ENOTFOUND = -19,   /* unknown segment, peer or handle */
  FERRY_EREMOTE = -20,     /* the target failed while serving the request */
  FERRY_EINPROGRESS = -21, /* batch still pending when the wait ended */
  FERRY_EFAULT = -22,      /* memory this process cannot read and write (unmapped, PROT_NONE) */
  FERRY_ECANCELED = -23,   /* the caller cancelled the batch (ferry_batch_cancel) */
  FERRY_EIO = -24,         /* a file's read or write failed, or a READ met its end */
} ferry_status;

/* Static description of a code and where docs/errors.md explains it (its
 * causes, the fix, the log line that goes with it), e.g. "address not
 * registered (docs/errors.md#ferry_enotreg)". */
const char *ferry_strerror(ferry_status status);
/* Detail of the last error on this thread, e.g.
 * "connect to 10.0.0.2:15023 failed: Connection refused". Never NULL. */
const char *ferry_last_error(void);
/* The negative number Mooncake's Transfer Engine uses for the same cause. */
int ferry_status_to_mooncake(ferry_status status);

const char *ferry_version(void);

/* ---- Logging ---------------------------------------------------------- */
typedef enum ferry_log_level {
  FERRY_LOG_DEBUG = 0,
  FERRY_LOG_INFO = 1,
  FERRY_LOG_WARN = 2,
  FERRY_LOG_ERROR = 3,
  FERRY_LOG_OFF = 4,
} ferry_log_level;

/* Process-wide level; the initial one comes from FERRY_LOG (default info). */
void ferry_log_set_level(ferry_log_level level);
ferry_log_level ferry_log_get_level(void);

/* One log line. Lines go to stderr, one write(2) each, as `line` plus a
 * newline: "2026-12-01T08:34:12.123Z WARN ferry[pid:tid] engine: message"
 * (UTC, milliseconds; engine "-" for a line about no engine). Every
 * ferry_status a line names is explained in docs/errors.md. */
typedef struct ferry_log_record {
  ferry_log_level level;
  uint64_t time_ns;   /* CLOCK_REALTIME, nanoseconds since the epoch */
  long thread;        /* kernel thread id (gettid) of the emitting thread */
  const char *engine; /* name of the engine the line is about; "" if none */
  const char *message;
  const char *line; /* the whole formatted line, without a newline */
} ferry_log_record;
/* Receives each line at or above the level instead of stderr, on the thread
 * that emits it (any thread, including libferry's own), so it must be
 * thread-safe and must not call ferry_log_set_handler. The record and its
 * strings are valid only during the call. NULL restores stderr. On return
 * no thread is still inside the previous handler, so arg may be freed. */
typedef void (*ferry_log_handler)(const ferry_log_record *record, void *arg);
void ferry_log_set_handler(ferry_log_handler handler, void *arg);

/* ---- Transports -------------------------------------------------------- */
enum {
  FERRY_TRANSPORT_TCP = 1u << 0,
  FERRY_TRANSPORT_SHM = 1u << 1,
  FERRY_TRANSPORT_FABRIC = 1u << 2,
  FERRY_TRANSPORT_ALL = 0x7u,
};
/* "tcp", "shm", "fabric"; "none" for an unknown bit. */
const char *ferry_transport_name(unsigned transport);
/* Parses a comma-separated list of names ("tcp,shm") into bits; 0 on error. */
unsigned ferry_transport_parse(const char *names);

/* ---- Engine ------------------------------------------------------------ */
typedef struct ferry_engine ferry_engine;

#define FERRY_SPIN_US_MAX 10000 /* a longer spin is a busy loop, not a wait */

/* ABI rule. Within one major version (the soname libferry.so.MAJOR), a
 * program keeps working with a newer libferry without recompiling:
 * functions and enum values are only added; struct ferry_config only grows,
 * at its end; its first field is the caller's sizeof, so the library reads
 * no more than the caller has and gives fields added later their defaults.
 * Always fill a config with ferry_config_init, never by hand. Removing or
 * changing anything else bumps the major version. */
typedef struct ferry_config {
  /* sizeof(ferry_config) as the caller was compiled: set by
   * ferry_config_init; ferry_engine_create refuses a size it cannot have. */
  size_t size;
  /* Address peers should use to reach this engine. NULL: MC_TCP_BIND_ADDRESS,
   * else bind_host when it is not a wildcard, else this host's first
   * non-loopback address. */
  const char *advertise_host;
  /* Address to listen on. NULL: MC_TCP_BIND_ADDRESS, else "0.0.0.0". An
   * engine that listens beyond loopback with no secret logs a WARN naming
   * FERRY_SECRET, once, when it is created. */
  const char *bind_host;
  uint16_t port;               /* RPC port; 0 picks a free one */
  unsigned transports;         /* FERRY_TRANSPORT_* bits allowed; 0 = all */
  unsigned tcp_connections;    /* data connections per peer, 1 to 1024 (default 4) */
  unsigned workers;            /* threads driving async batches, 1 to 1024 (default 4) */
  uint32_t timeout_ms;         /* base transfer timeout (0 = default 30000,
                                  MC_TRANSFER_TIMEOUT seconds overrides) */
  uint32_t timeout_ns_per_mb;  /* extra time per MiB moved (default 1 ms) */
  uint32_t connect_timeout_ms; /* connect + handshake bound (0 = default 5000) */
  size_t slice_size;           /* max bytes per data frame: 4096 to 64 MiB,
                                  0 = default 512 KiB */
  ferry_log_level log_level;   /* applied process-wide when set explicitly */
  int log_level_set;           /* nonzero: log_level above is meant */
  /* Shared secret peers must prove (FERRY_SECRET); NULL = none. With one,
   * both sides prove it over the whole handshake, the target reveals its
   * identity only afterwards, and every later frame on every connection is
   * authenticated (not encrypted) and refused if forged, altered, replayed
   * or reordered; a peer without it gets FERRY_EAUTH (RELIABILITY.md). */
  const char *secret;
  /* Metadata service: "http://host:port/path", "redis://[user[:password]@]
   * host:port[/db]", "etcd://host:port[,host:port...]" or a bare "host:port"
   * (etcd); NULL = peer-to-peer only. A store that cannot be reached makes
   * create fail with FERRY_EMETADATA naming it, within connect_timeout_ms
   * when nothing answers (plus 3 s when it accepts but does not answer). */
  const char *metadata_url;
  /* Segment name published in the metadata service; NULL = "host:port". */
  const char *segment_name;
  int checksum; /* nonzero: every data frame carries a crc32c */
  /* Microseconds a data-socket receive polls (yielding the CPU between
   * tries) before it sleeps (FERRY_SPIN_US, default 0: sleep at once; more
   * than FERRY_SPIN_US_MAX is refused). Trades CPU during traffic for latency where
   * waking a sleeping thread on another CPU is slow (VMs); an idle engine
   * still uses no CPU. */
  unsigned spin_us;
  /* Milliseconds a worker thread beyond `workers` may sit idle before it
   * exits (default 10000): the pool grows while peers stall its threads and
   * shrinks back to `workers` when the stall is over. */
  unsigned worker_idle_ms;
  /* Limits of the serving side. A peer is an initiator engine, told apart
   * by the engine id its handshake claims. 0 in any field: the default. */
  unsigned max_connections;          /* accepted connections open at once
                                        (FERRY_MAX_CONNECTIONS, default 1024);
                                        past it a new one is closed at once */
  unsigned max_connections_per_peer; /* per peer (FERRY_MAX_CONNECTIONS_PER_PEER,
                                        default 64; an initiator opens
                                        tcp_connections + 1); past it the
                                        handshake is refused with FERRY_EBUSY */
  uint32_t idle_timeout_ms;          /* a connection with no request for this
                                        long is closed, by the target and by
                                        the initiator (FERRY_IDLE_TIMEOUT_MS,
                                        default 600000); initiators reconnect */
  /* Memory one peer's undrained notifications may hold: payload, name,
   * queue slot and allocator overhead (FERRY_NOTIFY_PEER_BYTES, default
   * 64 MiB); all peers together 4 times that. Past it ferry_notify_send
   * fails with FERRY_EBUSY until the target drains. */
  size_t notify_peer_bytes;
  /* Users whose processes this engine's shm service serves besides its own
   * (by uid, as the kernel reports the connecting process: SO_PEERCRED).
   * Any other same-host process is refused at connect and reaches this
   * engine over TCP instead (with the shared secret, when one is set).
   * Likewise this engine uses shm only with targets running as its own or
   * a listed uid. Default none: only this engine's own effective uid. The
   * array is copied by ferry_engine_create. */
  const uint32_t *shm_allowed_uids;
  size_t shm_allowed_uid_count;
  /* Lease on the keys this engine publishes in the metadata service
   * (FERRY_METADATA_TTL_MS, default 5000; 0 = the default). They are
   * refreshed every third of it, so a killed engine's segment disappears
   * within it, and re-published when the store comes back empty. Keep it
   * well above the longest stall of the process: a refresh may be late by
   * two thirds of it. etcd rounds it up to whole seconds, at least 2. */
  uint32_t metadata_ttl_ms;
  /* Prometheus text exposition of ferry_stats_snapshot on
   * http://metrics_host:metrics_port/metrics (FERRY_METRICS_PORT,
   * FERRY_METRICS_HOST). -1 (the default): not served; 0: a free port
   * (ferry_engine_metrics_port says which). metrics_host NULL: 127.0.0.1.
   * A port already taken (several processes given one FERRY_METRICS_PORT)
   * is logged at WARN and the engine runs without the endpoint
   * (ferry_engine_metrics_port is then 0); give each process its own, or 0
   * and read the port from the INFO line.
   * Anyone who reaches the port reads the names of the peers and what moved
   * between them: keep it on loopback unless the network is trusted. */
  int metrics_port;
  const char *metrics_host;
  /* Seconds between one-line throughput summaries in the log at INFO; 0
   * (the default): none. MC_TE_METRIC=1 sets 5, and then
   * MC_TE_METRIC_INTERVAL_SECONDS (1 to 86400) another interval. */
  unsigned metrics_log_s;
  /* Rails: extra addresses (NICs) this engine serves data on, comma
   * separated (FERRY_RAIL_HOSTS; default NULL: none). Each entry is a
   * literal IP address, optionally with :PORT ([V6]:PORT; default any free
   * port), and optionally =ADDR:PORT, the address initiators are told
   * instead (a proxy or NAT in front of that rail). The engine listens on
   * each, pinned to that address (never a wildcard), and advertises them to
   * initiators, which then spread their data connections over the rails:
   * large batches are striped across them, small ones take turns, and a
   * rail whose link fails is dropped for a few seconds while the others
   * carry on (RELIABILITY.md, 17). The RPC port stays the control
   * path. The fabric transport on an IP provider (tcp;ofi_rxm, net) opens
   * an endpoint pinned to each of these addresses too (the port is the
   * tcp listener's only; RELIABILITY.md, 16). At most 8; a name, a wildcard or a malformed entry is
   * FERRY_EINVAL at create, naming the entry. */
  const char *rail_hosts;
  /* Server workers that serve requests from peers (FERRY_SERVER_THREADS,
   * 1 to 1024; default 0: the number of CPUs, at least 2; started as
   * needed). Connections waiting for their next request cost no thread:
   * the workers wait on all of them in one epoll set. While workers are
   * stuck in frames of stalled peers (more than 100 ms in one frame) the
   * pool grows by one per stuck worker, up to 4 times this, and the extra
   * threads exit after worker_idle_ms idle. */
  unsigned server_threads;
  /* The libfabric transport (FERRY_TRANSPORT_FABRIC, RELIABILITY.md).
   * fabric_provider: a provider as fi_info names it ("verbs;ofi_rxm", "efa",
   * "tcp;ofi_rxm", "net", "shm"; FERRY_FABRIC_PROVIDER). NULL: automatic,
   * verbs;ofi_rxm then efa where fi_getinfo finds an RDMA device; with none
   * the transport is off, one INFO line says why, and peers use tcp/shm.
   * A provider named here that cannot start fails ferry_engine_create with
   * FERRY_ETRANSPORT naming it and libfabric's reason. IP providers (tcp,
   * net) bind to bind_host, or advertise_host when that is a wildcard.
   * fabric_device: the domain (NIC, e.g. "mlx5_0") to use
   * (FERRY_FABRIC_DEVICE); NULL: the provider's first. One that does not
   * exist fails create, naming those that do. A comma list
   * ("mlx5_0,mlx5_1", at most 8, each once) opens a domain per device,
   * each a rail, with every region registered in each (FERRY_EINVAL for a
   * repeated or empty entry). On IP providers a device is an interface,
   * pinned to its own address.
   * fabric_mr_basic: nonzero asks the provider for FI_MR_BASIC
   * (FERRY_FABRIC_MR_BASIC): virtual addresses and provider keys, the
   * strict registration mode verbs and efa need, here to test that path. */
  const char *fabric_provider;
  const char *fabric_device;
  int fabric_mr_basic;
  /* Target lanes of the fabric transport (FERRY_FABRIC_LANES, 1 to
   * FERRY_FABRIC_LANES_MAX; default 0: the number of CPUs, at least 2, at
   * most FERRY_FABRIC_LANES_MAX, where the provider has a wait fd, else 1):
   * endpoints of the target, each with its own completion queue and
   * progress thread, over which initiators spread their channels. On
   * software providers (tcp;ofi_rxm, net) the target's progress thread
   * copies the bytes, so one lane bounds a target to one CPU; polling
   * providers (shm, efa) default to one, as polling threads take the CPUs
   * from each other. A provider with FI_MR_ENDPOINT serves on one. */
  unsigned fabric_lanes;
  /* The stall bound of a tcp data connection, in ms (FERRY_STALL_MS;
   * default 0: 5000). A connection whose chunk in flight moves no byte and
   * gets no byte acknowledged for this long, while another rail or
   * transport of the peer is usable, is taken for a silent link (a pulled
   * cable, an interface set down): it is cut at the target and its chunks
   * move to another rail, long before the batch's deadline. Progress, not
   * completion, resets it, so a large chunk on a slow link does not trip it.
   * A peer with one rail and no standby waits for the deadline as before;
   * a bound at or above timeout_ms never trips. */
  uint32_t stall_ms;
  /* Receive pools, as a receiver: what one sender (an engine id, as its
   * handshake claims it) may hold in each pool in grants not landed yet,
   * so a sender that takes its share and stalls leaves the rest to the
   * others. pool_sender_bytes (FERRY_POOL_SENDER_BYTES; default 0: half of
   * each pool): also the largest message a pool takes from one sender (a
   * larger one fails with FERRY_EINVAL naming the limit); more than the
   * pool counts as the pool. pool_sender_slots (FERRY_POOL_SENDER_SLOTS,
   * 1 to 1048576; default 0: 1024). Past them a grant request waits like
   * one for a full pool, then FERRY_EBUSY naming the limit.
   * pool_grant_timeout_ms (FERRY_POOL_GRANT_TIMEOUT_MS, 1000 to 86400000;
   * default 0: 30000): a grant that no WRITE or LANDED touched for this
   * long expires; its slot goes back to the pool and a late WRITE or
   * LANDED for it is refused (RELIABILITY.md, 15). Below 5000 a steady
   * sender's pre-grants may expire between its messages (each then costs
   * a fresh grant, one round trip). */
  size_t pool_sender_bytes;
  unsigned pool_sender_slots;
  uint32_t pool_grant_timeout_ms;
  /* Staging (FERRY_STAGING=auto|always|never; a FERRY_STAGING_* value):
   * the tcp transport, and fabric where its provider cannot register CUDA
   * memory (no FI_HMEM), move memory they cannot touch (CUDA device
   * memory) through pinned host bounce buffers, the copy of one slice
   * overlapping the network transfer of the one before. AUTO (the default)
   * stages only such memory; ALWAYS stages host memory too, on tcp and
   * fabric (it tests the pipeline and costs a copy); NEVER stages nothing
   * (device memory then fails with FERRY_EFAULT on tcp and fabric; shm,
   * which copies it directly, still carries it). */
  int staging;
  /* FILE memory (ferry_file_*): operations one file batch keeps in flight
   * at once, each a preadv or pwritev on a worker thread
   * (FERRY_FILE_QUEUE_DEPTH, 1 to 256; default 0: 16). */
  unsigned file_queue_depth;
} ferry_config;
#define FERRY_STAGING_AUTO 0
#define FERRY_STAGING_ALWAYS 1
#define FERRY_STAGING_NEVER 2
#define FERRY_FABRIC_LANES_MAX 8

/* Fills cfg with defaults, including those taken from the environment
 * (see ferry_engine_create for the variables), and cfg->size. A value it
 * cannot parse is left at its default here and refused by
 * ferry_engine_create. Call it as ferry_config_init(&cfg). */
void ferry_config_init_size(ferry_config *cfg, size_t size);
#define ferry_config_init(cfg) ferry_config_init_size((cfg), sizeof *(cfg))

/* Starts an engine (cfg NULL: the defaults). Every field is checked, and so
 * is every environment variable that is set and not empty, whatever cfg
 * holds: MC_TCP_BIND_ADDRESS (host), MC_TRANSFER_TIMEOUT (seconds, 1 to
 * 4294967), MC_FORCE_TCP and FERRY_CHECKSUM (booleans: 1/0, true/false,
 * yes/no, on/off, any case), FERRY_TRANSPORTS (tcp, shm, fabric, all, comma
 * separated), FERRY_LOG (debug, info, warn, error, off), FERRY_SPIN_US (0 to
 * FERRY_SPIN_US_MAX), FERRY_SECRET, and the serving limits FERRY_MAX_CONNECTIONS,
 * FERRY_MAX_CONNECTIONS_PER_PEER, FERRY_IDLE_TIMEOUT_MS, FERRY_NOTIFY_PEER_BYTES
 * (positive whole numbers), FERRY_METRICS_PORT (0 to 65535), FERRY_METRICS_HOST
 * (host), MC_TE_METRIC (boolean), MC_TE_METRIC_INTERVAL_SECONDS (1 to
 * 86400), FERRY_FABRIC_PROVIDER, FERRY_FABRIC_DEVICE (names) and
 * FERRY_FABRIC_MR_BASIC (boolean), FERRY_FABRIC_LANES (1 to 8), FERRY_STALL_MS (ms, positive),
 * FERRY_POOL_SENDER_BYTES and FERRY_POOL_SENDER_SLOTS (positive whole numbers),
 * FERRY_POOL_GRANT_TIMEOUT_MS (1000 to 86400000), FERRY_FILE_QUEUE_DEPTH (1 to 256). A bad one
 * fails with FERRY_EINVAL and a message naming the setting, the value and what is accepted. A
 * started engine logs "engine NAME listening on HOST:PORT (transports: ...)" at INFO. */
ferry_status ferry_engine_create(const ferry_config *cfg, ferry_engine **out);
/* Threads. Every call on an engine may be made from any thread, and calls
 * may run concurrently with each other, including ferry_engine_shutdown and
 * ferry_engine_destroy. A call in progress when shutdown begins, or begun
 * while it runs, returns promptly: FERRY_ECLOSED (the detail names what it
 * was doing), or the error that ended it first. Blocked sockets are shut
 * down and waits are woken; what cannot be woken (a TCP connect, a
 * metadata-service request, a same-host service request) ends by its own
 * deadline (connect_timeout_ms, timeout_ms).
 *
 * Stops the engine: waits until no call is inside it (see above), closes
 * the listening socket and every connection, stops every thread and fails
 * the batches no thread will drive (FERRY_ECLOSED). The handle stays valid:
 * later calls return FERRY_ECLOSED at once. Idempotent; concurrent callers
 * all return once it is done. */
void ferry_engine_shutdown(ferry_engine *engine);
/* ferry_engine_shutdown, then frees the engine. A call that starts after
 * destroy returned uses freed memory: that is the caller's bug. A binding
 * that cannot rule it out calls shutdown first and destroy once its own
 * callers are gone. Batch handles outlive their engine (see ferry_batch). */
void ferry_engine_destroy(ferry_engine *engine);
/* The RPC port actually bound. */
uint16_t ferry_engine_port(const ferry_engine *engine);
/* The name peers pass as target: "host:port", or the segment name. */
const char *ferry_engine_name(const ferry_engine *engine);

/* ---- Memory ------------------------------------------------------------ */
/* Registering an identical region twice is harmless; a region overlapping a
 * different one fails with FERRY_EOVERLAP. Memory this process cannot read
 * and write (not mapped, PROT_NONE such as a CUDA device pointer, read-only)
 * fails with FERRY_EFAULT naming the range and the likely cause; the check
 * looks at the covering mappings, never at the pages. Registered memory
 * must stay mapped read-write until it is unregistered (RELIABILITY.md 4). */
ferry_status ferry_memory_register(ferry_engine *engine, void *addr, size_t length);
/* Unregistering is a fence: on return (also of _batch and ferry_memory_free)
 * no peer reads or writes the region again over any transport, and the
 * memory may be reused or freed. A peer's WRITE or READ still moving bytes
 * of it is cut off (its connection closed; its call fails). Never waits for
 * a peer: only for local threads to leave a system call (microseconds). */
ferry_status ferry_memory_unregister(ferry_engine *engine, void *addr);
ferry_status ferry_memory_register_batch(ferry_engine *engine, void *const *addrs,
                                         const size_t *lengths, size_t count);
ferry_status ferry_memory_unregister_batch(ferry_engine *engine, void *const *addrs, size_t count);
/* ferry_memory_register with the place the caller says the memory is, as
 * Mooncake spells it: "cpu:0" (host memory; the number is not checked),
 * "cuda:1" (memory of CUDA device 1: device, pinned or managed), "cuda"
 * (any CUDA device), or "*", "" or NULL (wherever the drivers say). ferry
 * always asks the CUDA driver (libcuda.so.1, loaded at run time) itself;
 * the location is checked against its answer: a contradiction fails with
 * FERRY_EINVAL naming both, "cuda..." where no CUDA driver or device was
 * found with FERRY_ENOTIMPL saying how ferry looked, a malformed string
 * with FERRY_EINVAL naming it. Device memory is moved by staging over tcp
 * (ferry_config.staging), and over fabric (registered with an FI_HMEM
 * provider, else staged); shm refuses it for now. */
ferry_status ferry_memory_register_at(ferry_engine *engine, void *addr, size_t length,
                                      const char *location);
/* The batch form: locations[i] for addrs[i] (locations NULL: all "*"). */
ferry_status ferry_memory_register_batch_at(ferry_engine *engine, void *const *addrs,
                                            const size_t *lengths, const char *const *locations,
                                            size_t count);
/* Nonzero when the CUDA driver loaded and found a device; else 0 and, when
 * why is not NULL, how ferry looked ("dlopen(\"libcuda.so.1\") failed: ..."). */
int ferry_memory_cuda_available(char *why, size_t size);
/* FERRY_OK when [addr, addr + length) lies inside one region registered on
 * engine (what a batch's local side must be); else FERRY_ENOTREG with the
 * detail a transfer from it gets ("local address 0x.. (+N bytes) is not
 * registered on this engine"). For callers that copy in memory instead of
 * submitting a transfer and must refuse the same ranges. */
ferry_status ferry_memory_check(ferry_engine *engine, const void *addr, size_t length);
/* Allocates a registered buffer from shareable memory, zero-filled. */
ferry_status ferry_memory_alloc(ferry_engine *engine, size_t length, void **out);
ferry_status ferry_memory_free(ferry_engine *engine, void *addr);

typedef struct ferry_region {
  uint64_t addr;
  uint64_t length;
} ferry_region;

/* Regions the peer has registered, as last fetched (refreshed by this call).
 * *out is malloc'd; release with free(). */
ferry_status ferry_peer_regions(ferry_engine *engine, const char *target, ferry_region **out,
                                size_t *count);
/* Transport that carries data to this peer now (FERRY_TRANSPORT_* bit):
 * the preferred of those usable toward it, or a standby one while the
 * preferred is out of use after a link failure (RELIABILITY.md 17);
 * connects if needed. */
ferry_status ferry_peer_transport(ferry_engine *engine, const char *target, unsigned *transport);

/* ---- Transfers --------------------------------------------------------- */
typedef enum ferry_op {
  FERRY_OP_READ = 0, /* remote -> local */
  FERRY_OP_WRITE = 1 /* local -> remote */
} ferry_op;

typedef struct ferry_entry {
  ferry_op op;
  void *local;     /* inside a region registered on this engine */
  uint64_t remote; /* absolute address inside a region registered at the target */
  size_t length;   /* > 0 */
} ferry_entry;

/* A batch handle belongs to the caller until ferry_batch_free, even past
 * the engine's shutdown or destroy: every batch is final (DONE, FAILED or
 * TIMEDOUT) once shutdown returns, and status, wait and free on it stay
 * safe afterwards, touching only the batch. Status and wait may be called
 * from several threads at once; free only once, after the others return. */
typedef struct ferry_batch ferry_batch;

typedef enum ferry_batch_state {
  FERRY_BATCH_PENDING = 0,
  FERRY_BATCH_DONE = 1,
  FERRY_BATCH_FAILED = 2,
  FERRY_BATCH_TIMEDOUT = 3,
} ferry_batch_state;

/* A short message delivered to the target after a batch's data landed, or
 * sent on its own with ferry_notify_send. */
typedef struct ferry_notification {
  char *name;
  char *data; /* NUL-terminated for convenience; may hold binary bytes */
  size_t length;
} ferry_notification;

/* Starts a batch of entries to one target. notify may be NULL. The copy of
 * entries is taken; the memory they point to must stay valid until done. */
ferry_status ferry_batch_submit(ferry_engine *engine, const char *target,
                                const ferry_entry *entries, size_t count,
                                const ferry_notification *notify, ferry_batch **out);
/* Current state; on FAILED/TIMEDOUT *error (if non-NULL) gets the cause and
 * the calling thread's last error gets the detail. */
ferry_batch_state ferry_batch_status(ferry_batch *batch, ferry_status *error);
/* Waits up to timeout_ms (-1: until the batch's own deadline, or until its
 * notification's send ends if that is later). Returns FERRY_OK, the batch's
 * error, or FERRY_EINPROGRESS if still pending. A batch whose notification
 * is being sent stays PENDING, past its deadline if need be (the send is
 * bounded by connect_timeout_ms), and is DONE once the target acknowledged
 * it: a batch never reads TIMEDOUT after its notification was delivered. */
ferry_status ferry_batch_wait(ferry_batch *batch, int64_t timeout_ms);
/* Cancels a pending batch: no part of it that has not started will start,
 * and its notification is not sent. Parts already in flight end as they
 * would have (by the batch's deadline); the batch then reads FAILED with
 * FERRY_ECANCELED. What they wrote may have landed: the target's ranges
 * are undefined, as after any failed WRITE. Returns at once: FERRY_OK, or
 * FERRY_EBUSY for a batch that already ended or whose data all landed (its
 * notification being sent), which ends as it would have. Wait or free then
 * waits for the parts in flight. Safe beside status and wait calls. */
ferry_status ferry_batch_cancel(ferry_batch *batch);
/* Frees a batch; a pending one is waited for first (bounded by its deadline). */
void ferry_batch_free(ferry_batch *batch);

/* ferry_batch_submit ordered on a CUDA stream (cuda_stream: a CUstream, as
 * torch.cuda.Stream.cuda_stream gives it; NULL: the legacy default stream
 * of the calling thread's current context). The transfer starts only once
 * the work queued on that stream before the call completed, and work
 * queued on it after the call waits until the transfer ended: done means
 * landed (a READ into device memory: the copy into it completed). The call
 * returns at once, after the checks ferry_batch_submit makes (their errors
 * are returned, and nothing is queued on the stream): an event is recorded
 * on the stream, and the stream is made to wait with cuStreamWaitValue32
 * on a word of pinned memory that ferry writes when the batch ends (where
 * the driver lacks stream memory operations: a host function that blocks
 * until then, cuLaunchHostFunc, which holds one of the driver's callback
 * threads). One ferry thread per engine, never the caller's, waits for the
 * events in submission order and starts the batches; the batch's deadline
 * counts from its start. A failed batch releases the stream too: the work
 * after it runs on whatever the memory holds; *out (a ferry_batch as
 * ferry_batch_submit's) says the outcome, and with out NULL a failure is
 * logged (error level) with its detail. No CUDA context is left current
 * on the calling thread. FERRY_ENOTIMPL without a CUDA driver. Shutdown
 * fails batches whose stream work had not completed yet, once it has. */
ferry_status ferry_batch_submit_on_stream(ferry_engine *engine, const char *target,
                                          const ferry_entry *entries, size_t count,
                                          const ferry_notification *notify, void *cuda_stream,
                                          ferry_batch **out);

/* Synchronous helpers: submit, wait, free. */
ferry_status ferry_transfer_sync(ferry_engine *engine, const char *target, ferry_op op, void *local,
                                 uint64_t remote, size_t length);
ferry_status ferry_transfer_sync_batch(ferry_engine *engine, const char *target,
                                       const ferry_entry *entries, size_t count,
                                       const ferry_notification *notify);

/* ---- Plans: descriptor lists prepared once, transferred by index ---------
 * A plan is a list of local descriptors (ranges of this engine's registered
 * memory) and a list of remote descriptors (ranges a target registered),
 * checked once when the plan is made: the local ones against the registry,
 * the remote ones against the target's table, fetched as a batch fetches
 * it. A transfer then names pairs by index, local_idx[i] <-> remote_idx[i],
 * whose two descriptors must have the same length, and moves them with one
 * op (and an optional notification, delivered after the data as a batch's
 * is). Submitting costs per pair two bounds checks and a few compares: no
 * range search, no allocation (one array for the whole transfer). Pairs
 * adjacent in both memories, each side inside one region, are merged into
 * one operation unless FERRY_PLAN_NO_MERGE (NIXL's skip_desc_merge): the
 * links' ops counters (ferry_stats) count the operations after merging.
 *
 * A plan holds the local regions its descriptors lie in: once one of them
 * is unregistered (ferry_memory_unregister, _batch, ferry_memory_free) every
 * later transfer of the plan fails with FERRY_ENOTREG naming the region,
 * even if the range is registered again (make a new plan then); a transfer
 * already under way ends as a batch does. A target that unregisters a remote
 * range refuses the transfers that touch it (FERRY_ENOTREG, its fence for
 * those in flight: RELIABILITY.md 7). A target that restarted (a new
 * instance) makes the plan's next transfer check its remote descriptors
 * against the new incarnation's table first: it goes on if they are all
 * registered there, else fails with FERRY_ENOTREG naming the first one
 * that is not (the next transfer checks again). RELIABILITY.md 18. */
typedef struct ferry_plan ferry_plan;

#define FERRY_PLAN_NO_MERGE 0x1u /* one operation per pair, even for adjacent ones */

/* Makes a plan toward target: local[0..local_count) inside regions
 * registered here, remote[0..remote_count) inside regions the target
 * registered (connects and fetches those regions if needed). Both lists
 * are copied; neither may be empty, nor a descriptor of length 0.
 * FERRY_ENOTREG names the first descriptor that is not registered. */
ferry_status ferry_plan_create(ferry_engine *engine, const char *target, const ferry_region *local,
                               size_t local_count, const ferry_region *remote, size_t remote_count,
                               ferry_plan **out);
/* Starts a transfer of count pairs (count > 0) as a batch (ferry_batch_*
 * as for ferry_batch_submit): every index is checked first, and a bad one
 * (out of range, or a pair of different lengths) fails with FERRY_EINVAL
 * naming the pair, with nothing sent. The index arrays and notify are not
 * kept; the memory the descriptors name must stay valid until done. */
ferry_status ferry_plan_submit(ferry_engine *engine, ferry_plan *plan, ferry_op op,
                               const int64_t *local_idx, const int64_t *remote_idx, size_t count,
                               const ferry_notification *notify, unsigned flags, ferry_batch **out);
/* The same, synchronous (as ferry_transfer_sync_batch). */
ferry_status ferry_plan_transfer_sync(ferry_engine *engine, ferry_plan *plan, ferry_op op,
                                      const int64_t *local_idx, const int64_t *remote_idx,
                                      size_t count, const ferry_notification *notify,
                                      unsigned flags);
/* Descriptors in each list. */
size_t ferry_plan_local_count(const ferry_plan *plan);
size_t ferry_plan_remote_count(const ferry_plan *plan);
/* Frees a plan; its batches in flight are not affected. Valid also after its
 * engine was shut down or destroyed (the plan is detached from it then);
 * not while another thread is inside a call on the plan. Plans may be used
 * by several threads at once otherwise. */
void ferry_plan_free(ferry_plan *plan);

/* ---- Files: FILE memory (storage segments) -------------------------------
 * A registered file (a descriptor of a regular file or a block device) is
 * the far side of a batch whose near side is this engine's registered
 * memory: an entry's `remote` is a byte offset in the file, READ moves
 * file -> memory and WRITE memory -> file (NIXL's POSIX backend: KV blocks
 * offloaded to local NVMe). The file is this process's own: no peer is
 * involved and nothing is published.
 *
 * Each operation is one preadv or pwritev on a worker thread,
 * ferry_config.file_queue_depth of them in flight per batch. An entry of
 * up to 16 MiB is one operation, a larger one is cut into 16 MiB ones;
 * entries below 256 KiB that follow each other in the list with the same
 * op are gathered into operations of up to 256 KiB (one system call per
 * run that is contiguous in the file). Where the file system takes it,
 * an operation whose offset, length and memory are aligned to its block
 * goes through an O_DIRECT descriptor (no page cache); any other one,
 * and an aligned one O_DIRECT refuses, through a buffered one: alignment
 * never fails an operation. Completion, state, wait, cancel and free are
 * ferry_batch's (deadline: timeout_ms plus timeout_ns_per_mb, as for a
 * network batch; an operation in a system call is not interrupted).
 * DONE means every byte was read into memory, or handed to the kernel by
 * pwritev (in the page cache, or on the device's write path for O_DIRECT):
 * with FERRY_FILE_SYNC, DONE comes only after fdatasync, so the bytes
 * are on stable storage. RELIABILITY.md 23. */
typedef struct ferry_file ferry_file;

#define FERRY_FILE_BUFFERED 0x1u /* register: never O_DIRECT, every operation buffered */
#define FERRY_FILE_SYNC 0x1u     /* submit: fdatasync after the last WRITE, before DONE */

/* Registers fd, which stays the caller's: ferry duplicates it (the caller
 * may close its own once this returns) and, unless FERRY_FILE_BUFFERED,
 * reopens the file with O_DIRECT through /proc/self/fd. FERRY_EINVAL
 * naming fd and its path: not an open descriptor, O_PATH, not a regular
 * file or block device, opened O_APPEND for writing (pwritev would append
 * instead of writing at the offset). Whether O_DIRECT is used, and why
 * not, is logged (INFO when it was wanted and cannot be had, else DEBUG)
 * and answered by ferry_file_direct. A file may be registered more than once (handles of
 * their own). */
ferry_status ferry_file_register(ferry_engine *engine, int fd, unsigned flags, ferry_file **out);
/* A fence, as ferry_memory_unregister: on return no operation reads or
 * writes the file through ferry again and its descriptors are closed.
 * Operations in a system call are waited for (the time of one preadv or
 * pwritev); batches over the file that still have work fail with
 * FERRY_ENOTREG naming it. Their handles stay valid (ferry_batch_*).
 * FERRY_ENOTFOUND for a handle this engine does not hold (unregistered
 * already). The handle is freed: do not use it again. */
ferry_status ferry_file_unregister(ferry_engine *engine, ferry_file *file);
/* Nonzero when aligned operations go through O_DIRECT; else 0 and, when
 * why is not NULL, the reason ("open with O_DIRECT failed: Invalid
 * argument", "buffered I/O was asked for"). align (may be NULL) gets the
 * alignment of offset and length O_DIRECT needs. */
int ferry_file_direct(const ferry_file *file, size_t *align, char *why, size_t size);
/* The path of the file as /proc/self/fd showed it at registration. */
const char *ferry_file_path(const ferry_file *file);
/* Starts a batch between registered memory (each entry's local, checked
 * as for ferry_batch_submit: FERRY_ENOTREG) and file (each entry's remote
 * is an offset). FERRY_EINVAL, before any byte moves, naming the entry:
 * a WRITE to a file opened read-only, a READ of one opened write-only, a
 * range past 2^63. FERRY_EFAULT for local device memory (the CPU cannot
 * touch it). The batch fails with FERRY_EIO naming the file, the range and
 * errno when a system call fails, and when a READ meets the end of the
 * file (never short data). flags: FERRY_FILE_SYNC. */
ferry_status ferry_file_submit(ferry_engine *engine, ferry_file *file, const ferry_entry *entries,
                               size_t count, unsigned flags, ferry_batch **out);
/* The same, synchronous: the calling thread does operations too. */
ferry_status ferry_file_transfer_sync(ferry_engine *engine, ferry_file *file,
                                      const ferry_entry *entries, size_t count, unsigned flags);

/* ---- Peers and notifications -------------------------------------------- */
/* FERRY_OK if the peer answers a ping within the connect timeout. */
ferry_status ferry_probe(ferry_engine *engine, const char *target);
ferry_status ferry_notify_send(ferry_engine *engine, const char *target, const char *name,
                               const void *data, size_t length);
/* Moves every received notification to *out (malloc'd array, may be NULL when
 * *count is 0). Release with ferry_notify_free. */
ferry_status ferry_notify_drain(ferry_engine *engine, ferry_notification **out, size_t *count);
void ferry_notify_free(ferry_notification *list, size_t count);

/* ---- Statistics --------------------------------------------------------- */
/* Counters count from the engine's creation; gauges say how things are at
 * the snapshot. Keeping them costs the data path one relaxed atomic add per
 * data frame and per submitted batch: no lock, no system call. */
#define FERRY_STATS_CODES 32           /* slots of errors[]: errors[-status] */
#define FERRY_STATS_LATENCY_BUCKETS 20 /* latency_le[] and latency_buckets[] */

/* What moved between this engine and one peer over one transport. */
typedef struct ferry_stats_link {
  const char *peer;            /* the target, as callers name it */
  const char *transport;       /* the transport's name: "tcp", "shm", ... */
  uint64_t bytes[2];           /* by ferry_op: bytes moved and acknowledged */
  uint64_t ops[2];             /* by ferry_op: transfer entries submitted */
  uint64_t connections_opened; /* data connections opened (reopens too) */
} ferry_stats_link;

/* One rail of a peer reached over several: its rail_hosts, or the
 * transports usable toward it (one rail each unless railed). */
typedef struct ferry_stats_rail {
  const char *peer; /* the target, as callers name it */
  /* the rail's address, as the target advertises it; with several
   * transports, the transport's name ("fabric", "tcp 127.0.0.2:7000") */
  const char *rail;
  uint64_t bytes[2]; /* by ferry_op: bytes moved and acknowledged on it */
  uint64_t failures; /* times its link failed and it was taken out of use */
  int up;            /* 0 from a failure until a connection over it works again (one is tried
                      * once its back-off ended) */
} ferry_stats_rail;

/* Grows only at its end (the library allocates it). */
typedef struct ferry_stats {
  /* errors[-status]: errors returned by the engine's calls, plus async
   * batches that ended FAILED or TIMEDOUT after their submit succeeded. */
  uint64_t errors[FERRY_STATS_CODES];
  uint64_t batches_in_flight;          /* submitted, not final yet (gauge) */
  uint64_t registered_bytes;           /* gauge */
  uint64_t registered_regions;         /* gauge */
  uint64_t notifications_queued;       /* received, not drained (gauge) */
  uint64_t control_connections_opened; /* all peers */
  /* As a target, over tcp (by ferry_op of the peer's request: WRITE is
   * bytes written into this engine): requests served and their bytes,
   * counted before the initiator's call can return (a WRITE once its bytes
   * are in memory, a READ as its reply starts). A
   * same-host peer's shm transfers copy memory directly and are counted
   * only on its side. All peers together: a target's peers are not bounded
   * by this engine. */
  uint64_t served_bytes[2];
  uint64_t served_requests[2];
  /* Latency of ferry_transfer_sync and ferry_transfer_sync_batch calls
   * that reached a peer, submit to return: latency_buckets[i] counts calls
   * in (latency_le[i-1], latency_le[i]] seconds (not cumulative); the last
   * bound is infinity. */
  double latency_le[FERRY_STATS_LATENCY_BUCKETS];
  uint64_t latency_buckets[FERRY_STATS_LATENCY_BUCKETS];
  double latency_sum_seconds;
  uint64_t latency_count;
  /* One per peer and transport that moved or opened anything. Every peer
   * this engine ever called stays listed (peers are cached for the engine's
   * life), so their number is the number of distinct targets used. */
  ferry_stats_link *links;
  size_t link_count;
  /* One per rail of every peer with several rails (the target's
   * rail_hosts, or several usable transports), in rail order per peer:
   * the preferred transport's first. */
  ferry_stats_rail *rails;
  size_t rail_count;
  /* Receive pools, as a receiver (all its pools): messages landed (their
   * LANDED notice served), how many of those came without a control frame
   * of their own (on the data's own WRITE frame: tcp; or posted in shared
   * memory after the copy: shm), and grant requests waiting
   * for room in a full pool right now (gauge). */
  uint64_t pool_messages_landed;
  uint64_t pool_landed_inband;
  uint64_t pool_senders_waiting;
  /* Bytes of slots granted to senders whose message has not landed yet,
   * pre-grants included (gauge, all pools): a send in flight holds its
   * slot here until it lands, until its sender's connections are all
   * gone and the slot goes back to the pool, or until a grant request
   * takes it back after it expired (pool_grant_timeout_ms). */
  uint64_t pool_bytes_granted;
  /* As a target, what it sees of each transport, indexed by the bit's
   * position (0 tcp, 1 shm, 2 fabric): peers' connections that passed
   * their handshake, tcp data connections and shm links. shm and fabric
   * transfers are one-sided (the initiator copies, or its NIC does): their
   * bytes are counted only by the initiator, and a fabric initiator opens
   * nothing the target sees, so [2] stays 0. */
  uint64_t connections_accepted[8];
  /* Bytes this engine moved through the staging pipeline's bounce buffers
   * (ferry_config.staging), as initiator and as target, by ferry_op of
   * the transfer: memory the transport could not touch, or any memory
   * under FERRY_STAGING=always. */
  uint64_t staged_bytes[2];
} ferry_stats;

/* A snapshot of the engine's statistics; release with ferry_stats_free.
 * Takes the locks of the peer list and the notification queue for a
 * moment, and that of each peer with rails (for their names and state). FERRY_ECLOSED once shutdown
 * began. */
ferry_status ferry_stats_snapshot(ferry_engine *engine, ferry_stats **out);
void ferry_stats_free(ferry_stats *stats);
/* The snapshot in Prometheus' text exposition format (version 0.0.4), as
 * served on /metrics: ferry_bytes_total{op,peer,transport},
 * ferry_operations_total{op,peer,transport},
 * ferry_connections_opened_total{peer,transport},
 * ferry_control_connections_opened_total, with rails ferry_rail_bytes_total{op,peer,rail},
 * ferry_rail_failures_total{peer,rail} and ferry_rail_up{peer,rail},
 * ferry_served_bytes_total{op,transport},
 * ferry_served_requests_total{op,transport},
 * ferry_connections_accepted_total{transport}, ferry_errors_total{code},
 * ferry_batches_in_flight, ferry_registered_bytes, ferry_registered_regions,
 * ferry_notifications_queued, ferry_pool_senders_waiting,
 * ferry_pool_bytes_granted, ferry_pool_messages_landed_total{notice} and the histogram
 * ferry_sync_transfer_duration_seconds. *text is malloc'd: free() it. */
ferry_status ferry_stats_prometheus(const ferry_stats *stats, char **text);
/* The port /metrics is served on (config metrics_port), 0 when it is not. */
uint16_t ferry_engine_metrics_port(const ferry_engine *engine);

/* ---- Receive pools: message handoff --------------------------------------
 * A receiver registers a pool under a name; a sender moves bytes into a
 * slot of it with ferry_send and the receiver gets them with ferry_recv,
 * read in place, then gives the slot back with ferry_pool_release. The
 * receiver grants each sender its slot (and, as the slot's message lands, a
 * pre-grant for the next one of the same size), so a steady sender pays the
 * data WRITE and its ack: over tcp the "landed" notice rides on the
 * message's last WRITE frame (the receiver holds the message until its
 * other frames landed too); over shm it is posted in shared memory.
 * What a sender can do to a pool, per transport (RELIABILITY.md, 15):
 *  - tcp: the receiver checks every WRITE into the pool against the grants
 *    it gave that sender (not expired, not landed yet), and delivers a
 *    message only once every byte of it was written under its grant (a
 *    notice for bytes never written is refused: the receiver never sees
 *    what an earlier message left in the slot);
 *  - fabric: its one-sided WRITEs pass no such check, so a pool is
 *    registered with it for remote READ only and takes no fabric WRITE
 *    from anyone; a send's WRITEs go over tcp or shm instead, also where
 *    fabric carries everything else (engines that share only fabric cannot
 *    send: FERRY_ETRANSPORT);
 *  - shm: serves the same user only, who can write that memory anyway: the
 *    sender maps the pool and copies itself, unchecked, and its notices
 *    are taken without the check that every byte was written.
 * One sender (an engine id as its handshake claims it; proven only with a
 * shared secret) holds at most ferry_config.pool_sender_bytes and
 * pool_sender_slots of a pool's grants not landed yet (default half the
 * pool, and 1024), so one that takes its share and stalls leaves the rest
 * to others; a grant nothing touched for pool_grant_timeout_ms (default
 * 30 s) expires and its slot goes back.
 * ferry_stats counts landed messages (pool_messages_landed, pool_landed_inband) and waiting
 * senders. A message is delivered only after every byte of it was acknowledged, and a sender whose
 * every connection is gone loses the slots it was writing: they go back to the pool and nothing is
 * delivered from them. The pool is registered memory: a peer may READ it like any other region.
 * Slot and pre-grant traffic uses the POOL frame (wire.h) on the control connection, so a target
 * without pools fails a send with FERRY_EPROTO or a lost connection. Guarantees and their tests:
 * RELIABILITY.md, promise 15. */
typedef struct ferry_pool ferry_pool;

#define FERRY_TAG_MAX 256 /* bytes of a message tag (any bytes, at least one) */

/* A received message. Its bytes are addr[0..length) inside the pool, valid
 * until ferry_pool_release(slot) or ferry_pool_destroy. */
typedef struct ferry_message {
  uint64_t slot;
  void *addr;
  size_t length;
  uint8_t tag[FERRY_TAG_MAX];
  size_t tag_len;
  char sender[FERRY_TAG_MAX + 1]; /* the sending engine's name, as its handshake gave it */
} ferry_message;

/* Creates pool `name` (1..255 bytes, unique on this engine) over length
 * bytes at addr, which it registers (and unregisters at destroy); addr NULL:
 * ferry allocates the memory. Memory already registered is refused with
 * FERRY_EINVAL: a pool registers its memory itself (fabric: READ only). */
ferry_status ferry_pool_create(ferry_engine *engine, const char *name, void *addr, size_t length,
                               ferry_pool **out);
/* Wakes its waiting ferry_recv calls (FERRY_ECLOSED), voids every grant and
 * frees the pool; senders get FERRY_ENOTFOUND. Messages received and not
 * released are gone with it. */
ferry_status ferry_pool_destroy(ferry_engine *engine, ferry_pool *pool);
/* Waits up to timeout_ms (-1: without bound, 0: just look) for a message
 * whose tag is tag[0..tag_len) (tag NULL: any), the earliest landed first.
 * The wait sleeps in the kernel. FERRY_ETIMEDOUT names the tag and pool. */
ferry_status ferry_recv(ferry_engine *engine, ferry_pool *pool, const void *tag, size_t tag_len,
                        int64_t timeout_ms, ferry_message *out);
/* Gives a received slot back: its space can be granted again. */
ferry_status ferry_pool_release(ferry_engine *engine, ferry_pool *pool, uint64_t slot);
/* Puts a received message (not released) back: it waits in the pool again,
 * in its place in landing order, as if ferry_recv had not taken it; its
 * bytes are untouched. For a receiver that took a message it cannot hand
 * on (an event loop's wait cancelled after the take). FERRY_ENOTFOUND when
 * slot is not a received message. */
ferry_status ferry_pool_requeue(ferry_engine *engine, ferry_pool *pool, uint64_t slot);
/* A file descriptor that polls readable while at least one message waits
 * in the pool (for an event loop; read nothing from it). Owned by the pool.
 * Every message that lands (or is requeued) signals it anew, even while
 * others wait, so an edge-triggered epoll (EPOLLET) sees each arrival and a
 * waiter for one tag is not blind behind a backlog of others. It also
 * becomes readable when the pool is destroyed or the engine shuts down
 * (ferry_recv then fails with FERRY_ECLOSED); a poller that must see the
 * destroy polls a dup() of it. */
int ferry_pool_fd(const ferry_pool *pool);

#define FERRY_SEND_NOWAIT 0x1 /* pool full: FERRY_EBUSY at once instead of waiting */

/* Moves local[0..length) (registered here) into a slot of the target's
 * pool and delivers it under tag, over tcp or shm (never fabric: see the
 * pools' comment above). A full pool, or one where this sender holds its
 * share of grants already, is waited on for up to
 * timeout_ms (-1: the engine's timeout_ms) unless FERRY_SEND_NOWAIT: then
 * FERRY_EBUSY. A message larger than one sender may hold in the pool
 * (the receiver's pool_sender_bytes) fails with FERRY_EINVAL naming it.
 * A WRITE that meets a restarted receiver's dead connection is retried once
 * with a fresh slot (nothing was delivered). A message larger than the pool fails with
 * FERRY_EINVAL, an unknown pool with FERRY_ENOTFOUND. On FERRY_OK the
 * receiver has the message; on an error it does not, except when the
 * connection broke after the data landed (FERRY_ESOCKET, FERRY_ETIMEDOUT),
 * which leaves it unknown: such a send is retried only when the receiver
 * restarted meanwhile. */
ferry_status ferry_send(ferry_engine *engine, const char *target, const char *pool, const void *tag,
                        size_t tag_len, void *local, size_t length, int64_t timeout_ms,
                        unsigned flags);
/* One message of a batch of sends. */
typedef struct ferry_send_item {
  const void *tag;
  size_t tag_len;
  void *local;
  size_t length;
  ferry_status status; /* filled in by ferry_send_batch */
} ferry_send_item;
/* Sends items to one target's pool, all WRITEs in flight together (each
 * message's slot is granted first); each item gets its own status, and
 * the messages land in any order. Returns the first failure in item order
 * (FERRY_OK when all were delivered). */
ferry_status ferry_send_batch(ferry_engine *engine, const char *target, const char *pool,
                              ferry_send_item *items, size_t count, int64_t timeout_ms,
                              unsigned flags);

/* ---- Store: a key-value pool over engines (docs/store.md) ----------------
 * Mooncake Store's model: clients contribute segments of registered memory,
 * a master (`ferry store-master`, `mooncake_master`) knows which key lives
 * where and allocates space for new values, and the bytes move by WRITE
 * and READ directly between a caller's buffer and the segment holding a
 * replica, never through the master. The client speaks to its master over
 * ferry's wire (the engine's handshake; with a secret, proven both ways and
 * every frame sealed). What is promised, with its tests: RELIABILITY.md 22.
 *  - A put is visible (to get, exists, size) only once every byte of every
 *    replica was written and the master committed it; a put that failed, or
 *    whose client died before its end, never becomes visible.
 *  - A get holds a lease on the object (the master's default_kv_lease_ttl,
 *    5 s by default): remove refuses a leased object with FERRY_EBUSY.
 *  - A client whose connection to the master ends, or that sent nothing for
 *    the master's client_ttl (10 s by default; clients PING every third of
 *    it), is dropped: its segment, every replica in it and its puts in
 *    progress. An object left with no replica is gone: a get of it fails
 *    with FERRY_ENOTFOUND. A get whose READ fails tries the next replica.
 *  - A full pool evicts: past the master's eviction_high_watermark_ratio
 *    (0.95 of the pool in use by default) least-recently-used objects
 *    (committed or got longest ago) go until eviction_ratio (0.05) is free
 *    below it, and a put no segment has room for evicts until it fits.
 *    Never evicted: a put in progress, an object under a get's lease, a
 *    hard-pinned one; soft-pinned ones go only when nothing else can. When
 *    nothing can go, the put fails with FERRY_ENOMEM naming the key, the
 *    size and what holds the pool.
 *  - With the master's SSD tier (--root_fs_dir), a put (and an upsert)
 *    also writes the value to a file (several buffers: their
 *    concatenation; the directory must be the same path on every
 *    client's host), and an evicted object stays, read back from its file
 *    and checked: a missing file fails the get with FERRY_ENOTFOUND, a
 *    damaged or foreign one with FERRY_ECHECKSUM, each naming the key and
 *    the path, and the key leaves the store.
 *  - An upsert replaces a key's value: the new one is written into space
 *    of its own and becomes visible whole, at once; a get sees the old
 *    value or the new one, never a mix. The old value's space is freed
 *    when the new one commits, or once the last get's lease on it ended:
 *    a get that started before keeps reading the old bytes. With the SSD
 *    tier, a value on disk only is absent while an upsert of it runs.
 * A put of a key stored already succeeds and keeps the first value (keys
 * of KV caches name their content); upsert to replace it. Keys are 1 to
 * 1024 bytes. Calls may be made from several threads; requests to the
 * master take turns on its one connection, transfers run in parallel. */
typedef struct ferry_store ferry_store;

/* A store client's settings. It grows as ferry_config does (the ABI rule
 * above): fill it with ferry_store_config_init, then set what differs.
 * ferry_store_open refuses a size larger than this libferry's struct (a
 * newer ferry.h) or smaller than its first form with FERRY_EINVAL naming
 * it; a smaller one of an older ferry.h gives the fields it lacks their
 * defaults. */
typedef struct ferry_store_config {
  size_t size;              /* sizeof, set by ferry_store_config_init */
  const char *master;       /* the master's "host:port" (required), or with HA
                               (masters run with --enable_ha) "etcd://HOST:PORT[;HOST:PORT...]":
                               the leader is read from etcd at each (re)connect */
  size_t segment_size;      /* bytes this client contributes to the pool (0: none) */
  size_t local_buffer_size; /* registered staging for put/get of memory that is not
                               registered (0: 16 MiB); a larger value takes a
                               temporary buffer */
  const char *secret;       /* shared secret of the master (NULL: FERRY_SECRET) */
  uint32_t timeout_ms;      /* bound of each request to the master (0: 10000) */
  const char *offload_dir;  /* client-owned SSD offload (the master runs with --enable_offload;
                               Mooncake's MOONCAKE_OFFLOAD_FILE_STORAGE_PATH): the objects in
                               this client's segment get a copy in a file here, and a get of
                               one left on this disk only is loaded back by this client
                               (docs/store.md). NULL: none; needs segment_size > 0 */
  size_t offload_max_bytes; /* the bytes offload_dir's files may hold (0: no limit; Mooncake's
                               MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES): past it the oldest go,
                               and an object left with no copy in memory leaves the store */
  const char *cxl_path;     /* a master run with --enable_cxl keeps every value in one CXL
                               memory device: this client maps it from here (a DAX device or a
                               file; Mooncake's MC_CXL_DEV_PATH) and copies values in and out
                               of that mapping, so the zero-copy calls' buffers need no
                               registration. NULL: none (then ferry_store_open fails against
                               such a master, FERRY_EINVAL); with it, segment_size must be 0 */
  size_t cxl_size;          /* the bytes of cxl_path mapped (MC_CXL_DEV_SIZE; required with
                               it): at least the master's --cxl_size */
} ferry_store_config;
void ferry_store_config_init_size(ferry_store_config *cfg, size_t size);
#define ferry_store_config_init(cfg) ferry_store_config_init_size((cfg), sizeof *(cfg))

/* Connects to the master, allocates and registers the segment on engine
 * (ferry_memory_alloc) and mounts it under the engine's name. The engine
 * must outlive the store. FERRY_ESOCKET / FERRY_ETIMEDOUT naming the master
 * when it does not answer, FERRY_EAUTH on a secret mismatch, FERRY_EVERSION
 * for a master of another store protocol, FERRY_EBUSY from a standby master
 * (HA: not the leader); with "etcd://", FERRY_ENOTFOUND when no master leads
 * and FERRY_EMETADATA when etcd cannot be read. */
ferry_status ferry_store_open(ferry_engine *engine, const ferry_store_config *cfg,
                              ferry_store **out);
/* Closes the connection (the master drops the segment and the objects that
 * lived only there) and frees the segment and staging. NULL is ignored. */
void ferry_store_close(ferry_store *store);
/* The name other clients reach this one's segment by: its engine's name. */
const char *ferry_store_segment(const ferry_store *store);
/* How many of this client's gets were answered with a copy its object's
 * owner loaded back from its offload disk (--enable_offload: the object
 * was on that disk only; a get within that copy's lease counts too, a get
 * once promotion kept it in memory does not). Mooncake's
 * get_offload_rpc_read_count. */
uint64_t ferry_store_owner_disk_reads(const ferry_store *store);

/* Where a put's replicas go, and whether eviction may take the object.
 * NULL: one replica, anywhere, no pin. It grows as ferry_config does (the
 * ABI rule above): fields are only added at its end, its first is the
 * caller's sizeof. Fill it with ferry_store_replicate_init (every field
 * its default, zero), then set what differs. A call refuses a size larger
 * than this libferry's struct (a newer ferry.h) or smaller than its first
 * form with FERRY_EINVAL naming it; a smaller one of an older ferry.h
 * gives the fields it lacks their defaults. */
typedef struct ferry_store_replicate {
  size_t size;                   /* sizeof, set by ferry_store_replicate_init */
  unsigned replicas;             /* 1 to 8, each in a different segment (0: 1) */
  const char *preferred_segment; /* the first replica's segment, if it has room; NULL: any */
  int pin;                       /* FERRY_STORE_PIN_*: how eviction treats the object */
  int soft_pin_action;           /* FERRY_STORE_SOFT_PIN_*: the soft pin's change (0: PRESERVE) */
  int soft_pin_ttl_set;          /* nonzero: soft_pin_ttl_ms is given (ENABLE only) */
  uint64_t soft_pin_ttl_ms;      /* ENABLE's pin lasts this long from the commit */
  /* Mooncake's preferred_segments: more segments tried in order after
   * preferred_segment, each for one replica while it has room (at most
   * 8; an unknown name is passed over); the rest go to the roomiest. */
  const char *const *preferred_segments;
  size_t preferred_count;
} ferry_store_replicate;
void ferry_store_replicate_init_size(ferry_store_replicate *replicate, size_t size);
#define ferry_store_replicate_init(rep) ferry_store_replicate_init_size((rep), sizeof *(rep))
/* NONE: evicted in least-recently-used order. SOFT (Mooncake's
 * with_soft_pin): as soft_pin_action ENABLE with the master's default TTL.
 * HARD (with_hard_pin): never evicted; remove it to free it. */
#define FERRY_STORE_PIN_NONE 0
#define FERRY_STORE_PIN_SOFT 1
#define FERRY_STORE_PIN_HARD 2
/* soft_pin_action (Mooncake's SoftPinAction), applied when the put or
 * upsert commits. A soft-pinned object is evicted only when nothing
 * unpinned can be, until its deadline: the commit plus its TTL (gets do
 * not extend it); then in least-recently-used turn. PRESERVE: an upsert
 * keeps the old value's pin and deadline (a new key: no soft pin).
 * ENABLE: pinned for soft_pin_ttl_ms (not set: the master's
 * default_kv_soft_pin_ttl, 30 min; 0: not pinned; more than its
 * max_kv_soft_pin_ttl, 24 h: refused). DISABLE: not pinned. A TTL set
 * with PRESERVE or DISABLE, or SOFT with DISABLE, is refused with
 * FERRY_EINVAL. */
#define FERRY_STORE_SOFT_PIN_PRESERVE 0
#define FERRY_STORE_SOFT_PIN_ENABLE 1
#define FERRY_STORE_SOFT_PIN_DISABLE 2

/* Copies data[0..length) (any memory) into the store under key. */
ferry_status ferry_store_put(ferry_store *store, const char *key, const void *data, size_t length,
                             const ferry_store_replicate *replicate);
/* The value of key in *data (malloc'd: free() it) and *length.
 * FERRY_ENOTFOUND when the store has no such key (or it is not committed). */
ferry_status ferry_store_get(ferry_store *store, const char *key, void **data, size_t *length);
/* Zero-copy forms: buf must be registered on the store's engine (else
 * FERRY_ENOTREG, before the master is asked; also when the replica is in
 * this client's own segment, which is copied in memory); the value moves
 * between it and the replicas with no copy on either side. */
ferry_status ferry_store_put_from(ferry_store *store, const char *key, void *buf, size_t length,
                                  const ferry_store_replicate *replicate);
/* Put, but a key stored already gets the new value (and the new replicas,
 * pin and placement replicate asks). The new value is visible once every
 * byte of it is written; until then get reads the old one. FERRY_EBUSY
 * while a put or upsert of the key is in progress. */
ferry_status ferry_store_upsert(ferry_store *store, const char *key, const void *data,
                                size_t length, const ferry_store_replicate *replicate);
ferry_status ferry_store_upsert_from(ferry_store *store, const char *key, void *buf, size_t length,
                                     const ferry_store_replicate *replicate);
/* Reads key's value into buf (capacity bytes; a larger value fails with
 * FERRY_EINVAL naming both sizes); *length gets its size, also when it did
 * not fit. */
ferry_status ferry_store_get_into(ferry_store *store, const char *key, void *buf, size_t capacity,
                                  size_t *length);
/* FERRY_OK when key is stored (committed), FERRY_ENOTFOUND when it is not. */
ferry_status ferry_store_exists(ferry_store *store, const char *key);
ferry_status ferry_store_size(ferry_store *store, const char *key, uint64_t *size);
/* FERRY_ENOTFOUND when absent, FERRY_EBUSY while a get's lease holds it. */
ferry_status ferry_store_remove(ferry_store *store, const char *key);
/* Removes every committed object no lease holds; *removed (may be NULL). */
ferry_status ferry_store_remove_all(ferry_store *store, uint64_t *removed);

/* One key of a batch; buf registered on the store's engine. */
typedef struct ferry_store_item {
  const char *key;
  void *buf;
  size_t length;       /* put: bytes; get: capacity in, the value's size out;
                          exists: the value's size out */
  ferry_status status; /* filled in per item */
} ferry_store_item;
/* The batch forms: one request to the master for all keys (larger batches
 * are cut into requests of 4096), every transfer in flight together. Each
 * item gets its status; the call returns the first failure in item order
 * (FERRY_OK when every item succeeded), with its detail. exists_batch
 * fails only when the master cannot answer: FERRY_ENOTFOUND per item is
 * its answer, not a failure. */
ferry_status ferry_store_put_from_batch(ferry_store *store, ferry_store_item *items, size_t count,
                                        const ferry_store_replicate *replicate);
ferry_status ferry_store_upsert_from_batch(ferry_store *store, ferry_store_item *items,
                                           size_t count, const ferry_store_replicate *replicate);
ferry_status ferry_store_get_into_batch(ferry_store *store, ferry_store_item *items, size_t count);
ferry_status ferry_store_exists_batch(ferry_store *store, ferry_store_item *items, size_t count);
/* Where a stored object is (Mooncake's get_replica_desc): its replicas
 * in memory, its file in the master's --root_fs_dir, and the copy on its
 * owner's disk (--enable_offload), as the master knows them now. */
typedef enum ferry_store_replica_kind {
  FERRY_STORE_REPLICA_MEMORY = 1,     /* location: its segment; address: there */
  FERRY_STORE_REPLICA_DISK = 2,       /* location: the file's path (--root_fs_dir); address 0 */
  FERRY_STORE_REPLICA_LOCAL_DISK = 3, /* location: the owner's segment (its client holds the
                                         file in its offload directory); address 0 */
} ferry_store_replica_kind;
typedef struct ferry_store_replica {
  int kind;             /* ferry_store_replica_kind */
  const char *location; /* NUL-terminated; freed with the item's replicas */
  uint64_t address;
} ferry_store_replica;
typedef struct ferry_store_replica_list {
  const char *key;
  ferry_status status;           /* out: FERRY_OK, FERRY_ENOTFOUND (absent, or a put pending) */
  uint64_t size;                 /* out: the value's bytes (0 when absent) */
  size_t count;                  /* out: replicas[0..count) */
  ferry_store_replica *replicas; /* out: malloc'd (NULL when count is 0) */
} ferry_store_replica_list;
/* One REPLICAS request per 4096 keys; it reads nothing and changes
 * nothing (no lease, no eviction order). Like exists_batch it fails only
 * when the master cannot answer (then no item has replicas); the caller
 * frees each answer with ferry_store_replica_lists_free, whatever it
 * returned. A key of a malformed length fails the call (FERRY_EINVAL). */
ferry_status ferry_store_replicas_batch(ferry_store *store, ferry_store_replica_list *items,
                                        size_t count);
void ferry_store_replica_lists_free(ferry_store_replica_list *items, size_t count);
/* Mooncake's batch_replica_clear: each key's replicas in the segment named
 * (segment NULL or "": all of them, which removes the object) are given
 * back, with the copy that segment's client keeps on its offload disk; an
 * object with nothing left goes (one with its --root_fs_dir file stays).
 * Each item's status (buf and length are not used): FERRY_OK cleared;
 * FERRY_ENOTFOUND absent, a put pending, or nothing in that segment;
 * FERRY_EBUSY a get's lease, or an offload or load of it under way. Like
 * exists_batch it fails only when the master cannot answer. Any client may
 * clear any key, as any may remove it (Mooncake clears only the keys the
 * caller put). */
ferry_status ferry_store_clear_batch(ferry_store *store, ferry_store_item *items, size_t count,
                                     const char *segment);
/* Copies each items[i].buf[0..length) (any memory, read only) into the
 * store under items[i].key: the values go through the staging buffer
 * (local_buffer_size; a larger total takes a temporary registered buffer),
 * then as ferry_store_put_from_batch. */
ferry_status ferry_store_put_batch(ferry_store *store, ferry_store_item *items, size_t count,
                                   const ferry_store_replicate *replicate);

/* One byte range of a stored value, read into buf (registered on the
 * store's engine: the whole [buf, buf+length) inside one region). */
typedef struct ferry_store_range {
  const char *key;
  void *buf;           /* destination */
  uint64_t offset;     /* of the first byte in the value */
  size_t length;       /* bytes (>0); offset+length must not pass the value's end */
  ferry_status status; /* filled in per range */
} ferry_store_range;
/* Reads every range as ferry_store_get_into_batch reads values: one GET to
 * the master per 4096 ranges (a key named by several ranges is looked up
 * once per range), every READ in flight together, straight from a replica
 * into buf (a disk-only object: from its file). Per range: FERRY_ENOTFOUND
 * (no such key), FERRY_EINVAL (the range passes the value's end),
 * FERRY_ENOTREG (buf's range is not registered); returns the first failure
 * in range order with its detail. */
ferry_status ferry_store_get_ranges(ferry_store *store, ferry_store_range *ranges, size_t count);

/* Several buffers for one key (Mooncake's _multi_buffers: a KV block as
 * one buffer per layer): the value is their concatenation, in order. Each
 * buffer moves straight between its own memory and its place in the
 * replica (one WRITE or READ per buffer, all of a batch in flight
 * together); nothing is staged. Every buffer registered on the store's
 * engine, length > 0. */
typedef struct ferry_store_buffer {
  void *buf;
  size_t length;
} ferry_store_buffer;
typedef struct ferry_store_multi_item {
  const char *key;
  ferry_store_buffer *buffers;
  size_t count;        /* buffers */
  size_t length;       /* out: the value's size (put: the buffers' total) */
  ferry_status status; /* filled in per item */
} ferry_store_multi_item;
/* As ferry_store_put_from_batch. */
ferry_status ferry_store_put_from_multi_buffers(ferry_store *store, ferry_store_multi_item *items,
                                                size_t count,
                                                const ferry_store_replicate *replicate);
/* As ferry_store_get_into_batch: the value fills the buffers in order; a
 * value larger than their total fails its item with FERRY_EINVAL naming
 * both sizes (length gets the value's size), a smaller one leaves the
 * rest of them untouched. */
ferry_status ferry_store_get_into_multi_buffers(ferry_store *store, ferry_store_multi_item *items,
                                                size_t count);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_H */
