/* engine.h - the engine's private state, shared by the files of src/core
 * and the layers above. One engine per process is typical: it serves its
 * registered memory to peers (server.c) and initiates transfers to them
 * (peer.c, batch.c, workers.c, transports). engine/engine.c creates and
 * destroys it; what its subsystems call on it while it runs is in core
 * (gate.c, notify.c, transport_hooks.c), never in engine/engine.c. */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H

#include <pthread.h>
#include <stdint.h>

#include "core/counters.h"
#include "ferry.h"
#include "memory/host_memory.h"
#include "memory/registry.h"
#include "metadata/metadata.h"
#include "net/auth.h"
#include "net/net.h"
#include "net/rails.h"
#include "wire/wire.h"

/* Received notifications wait here until drained. Each sending peer may
 * hold cfg.notify_peer_bytes of memory in the queue, all peers together
 * this many times that; past either a sender gets FERRY_EBUSY instead of
 * growing the process without bound. */
#define FERRY_NOTIFY_PEERS_FULL 4
/* Bytes per data frame. With 4 connections of one frame each, 2 MiB are in
 * flight: far above a datacenter link's bandwidth-delay product, and small
 * enough that the receiver copies bytes the sender's copy left in the CPU
 * cache (1 MiB frames, 4 deep, ran 35-45% slower at 16-64 MiB, BENCHMARKS.md). */
#define FERRY_DEFAULT_SLICE (512u << 10)

typedef struct ferry_peer ferry_peer;
typedef struct ferry_server ferry_server;
typedef struct ferry_workers ferry_workers;
typedef struct ferry_shm_service ferry_shm_service;

/* Memory from ferry_memory_alloc: a memfd mapping, so a same-host peer can
 * map it too. */
typedef struct ferry_allocation {
  void *addr;
  size_t length;
  int fd;
  struct ferry_allocation *next;
} ferry_allocation;

struct ferry_engine {
  ferry_config cfg; /* strings below are owned copies */
  char *advertise_host;
  char *bind_host;
  char *secret;
  char *segment_name;
  char name[FERRY_HOST_MAX + 8]; /* what peers pass as target */
  uint16_t port;
  uint64_t instance_id; /* random per engine: peers notice restarts */
  uint8_t boot_id[FERRY_WIRE_BOOT_ID_SIZE];
  unsigned transports; /* allowed and available here */

  ferry_registry *registry;
  ferry_host_memory *host_memory; /* what this process's CPU may touch (host_memory.h) */
  ferry_server *server;
  ferry_workers *workers;
  ferry_metadata *metadata;               /* NULL in peer-to-peer mode */
  ferry_shm_service *shm;                 /* same-host service, NULL when shm is off */
  char shm_path[FERRY_WIRE_MAX_NAME + 1]; /* its UNIX socket, advertised in HELLO_REPLY */
  /* Rails (rails.h): listeners the tcp service opened; the server accepts
   * on them as on the RPC port. Set before the server starts, closed after
   * it stopped. */
  char *rail_hosts;
  unsigned rail_count;
  int rail_fds[FERRY_RAILS_MAX];
  char rail_names[FERRY_RAILS_MAX][FERRY_RAIL_NAME_MAX]; /* as advertised */
  struct ferry_fabric *fabric; /* the libfabric transport's, NULL when off */

  pthread_mutex_t peers_lock;
  ferry_peer *peers;
  uint64_t peers_swept_ns; /* last sweep of idle connections (peer.c; atomic) */

  struct ferry_plan *plans; /* this engine's plans (plan.c, under its lock) */

  pthread_mutex_t files_lock;
  struct ferry_file *files; /* registered files (file.c) */

  pthread_mutex_t notify_lock;
  ferry_notification *notifications;
  size_t notify_count, notify_cap;
  size_t notify_bytes;                      /* memory queued, all peers */
  struct ferry_notify_share *notify_shares; /* memory queued, per peer */
  size_t notify_share_count, notify_share_cap;

  pthread_mutex_t publish_lock;  /* one snapshot+publish of the region table at a time */
  uint64_t published_generation; /* registry generation the last publish was taken after */
  /* Serializes (un)registrations while a transport registers regions of its
   * own (region_register), so its registrations match the registry's. */
  pthread_mutex_t register_lock;

  pthread_mutex_t alloc_lock;
  ferry_allocation *allocations;

  struct ferry_pools *pools; /* receive pools and pre-grants (pool.c) */

  /* Stream-ordered transfers (stream.c): created by the first one. */
  pthread_mutex_t streams_lock;
  struct ferry_streams *streams;

  int closing;

  ferry_engine_stats stats;
  struct ferry_metrics_http *metrics_http; /* NULL unless metrics_port is set */
  struct ferry_metrics_log *metrics_log;   /* NULL unless metrics_log_s is set */

  /* Public calls inside the engine right now (ferry_engine_enter/leave);
   * destroy waits under gate_lock until none is left. */
  unsigned calls;
  pthread_mutex_t gate_lock;
  pthread_cond_t gate_cond;
  pthread_mutex_t shutdown_lock; /* one shutdown at a time */
  int shut_down;                 /* threads stopped, peers freed */
};

/* The call gate. Every public call on an engine runs between enter (which
 * refuses with FERRY_ECLOSED once destroy began) and leave, which returns
 * st, turned into FERRY_ECLOSED (detail kept) when destroy cut the call
 * short. Two atomic operations: no lock on the data path. */
ferry_status ferry_engine_enter(ferry_engine *engine);
ferry_status ferry_engine_leave(ferry_engine *engine, ferry_status st);
/* The body of a public call: returns call run inside the gate. A null
 * engine goes straight to call, which refuses it. */
#define FERRY_GATED(e, call)                                                                       \
  do {                                                                                             \
    if (!(e))                                                                                      \
      return (call);                                                                               \
    ferry_status gate_st_ = ferry_engine_enter(e);                                                 \
    return gate_st_ ? gate_st_ : ferry_engine_leave(e, (call));                                    \
  } while (0)
static inline int ferry_engine_closing(const ferry_engine *engine) {
  return __atomic_load_n(&engine->closing, __ATOMIC_SEQ_CST);
}

/* Shutdown's side of the gate: wakes every call blocked on a peer (sockets
 * shut down, waits broadcast) and returns once no call is inside the
 * engine. */
void ferry_engine_drain_calls(ferry_engine *engine);

/* Deadline for moving `bytes`: base timeout plus a per-MiB allowance. */
uint64_t ferry_engine_deadline(const ferry_engine *engine, uint64_t bytes);

/* server.c: accepts connections and serves frames against the registry. */
/* Serves listen_fd (the RPC port: the server closes it at stop) and the
 * tcp rails' listeners (rail_fds: their transport closes them). */
ferry_status ferry_server_start(ferry_engine *engine, int listen_fd);
void ferry_server_stop(ferry_engine *engine);
/* The tcp part of ferry_engine_fence: cancels every connection serving a
 * WRITE or READ that touches `removed` (sorted here, in place) and waits
 * until their workers have left that memory. */
void ferry_server_fence(ferry_engine *engine, ferry_region *removed, size_t count);

/* The unregister fence (transport_hooks.c), for every transport. Called once
 * `removed` has left the registry, so no new request can be checked against
 * it; on return no transport reads or writes a byte of it again, for any
 * peer. A request checked before the removal and still moving bytes of it
 * is ended (its connection shut down) and its initiator gets an error; one
 * that does not touch `removed` is not disturbed. Never waits for a peer,
 * only for local threads to leave the memory (the time of a system call).
 * A transport that serves registered memory joins here through its fence
 * hook (transport.h; shm: revocation; RDMA: deregister a region only after
 * its last operation completed or its endpoint was shut down), then the
 * server (tcp). `removed` is reordered. */
void ferry_engine_fence(ferry_engine *engine, ferry_region *removed, size_t count);

/* region_register's flags (transport.h). FERRY_REGISTER_POOL: the regions
 * are receive pools, whose WRITEs must be checked against the writer's
 * grants (pool.c): a transport that cannot check them registers the
 * regions for remote READ only. */
#define FERRY_REGISTER_POOL 0x1u
/* region_register's flag for memory the CPU cannot touch (device memory,
 * memory/kind.h): registration.c hands it to the transports apart. */
#define FERRY_REGISTER_DEVICE 0x2u
/* A receive pool's memory: *addr (length bytes) registered, or with *addr
 * NULL new memory as from ferry_memory_alloc, both with
 * FERRY_REGISTER_POOL. Memory already registered is refused (FERRY_EINVAL):
 * a pool owns its registration. Undone with ferry_memory_unregister or
 * ferry_memory_free. */
ferry_status ferry_engine_pool_memory(ferry_engine *engine, size_t length, void **addr);
/* file.c: unregisters every file still registered (destroy; no call is
 * inside the engine any more). */
void ferry_files_close_all(ferry_engine *engine);
/* registration.c: ferry_memory_check inside the gate (a batch's check of
 * its local buffers: one message for both). */
ferry_status ferry_memory_check_local(ferry_engine *engine, const void *addr, size_t length);
/* registration.c: unmaps every allocation still held (destroy). */
void ferry_memory_free_all(ferry_engine *engine);
/* The key sections of a region table: one per transport in use that keys
 * its regions (region_keys hooks), keys[i].data malloc'd (free them).
 * *sections gets their number. */
ferry_status ferry_engine_region_keys(ferry_engine *engine, const ferry_region *regions,
                                      size_t count,
                                      ferry_region_keys keys[FERRY_WIRE_MAX_DESCRIPTORS],
                                      unsigned *sections);

/* The descriptors of the transports in use (their describe hooks) into
 * the facts of a HELLO_REPLY or AUTH_REPLY. */
void ferry_engine_describe(ferry_engine *engine, ferry_hello_reply *reply);

/* notify queue (notify.c), fed by the server. peer is the sending engine's
 * id (its share of the queue), peer_name its name for messages. */
ferry_status ferry_engine_push_notification(ferry_engine *engine, uint64_t peer,
                                            const char *peer_name, const char *name,
                                            size_t name_len, const void *data, size_t len);

#endif
