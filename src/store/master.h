/* master.h - the store master (docs/store.md): key -> object, segments and
 * their free space, leases and the liveness of its clients, served on its
 * own port over ferry's wire (protocol.h). It moves no data. Run by
 * `ferry store-master` / `mooncake_master` (tools/store_master.c) and by
 * the tests in their own process. */
#ifndef FERRY_STORE_MASTER_H
#define FERRY_STORE_MASTER_H

#include <stdint.h>

#include "ferry.h"
#include "store/map.h"

typedef struct store_master_config {
  const char *host;       /* NULL: 127.0.0.1 */
  uint16_t port;          /* 0: any free port */
  uint32_t lease_ttl_ms;  /* a GET's lease (0: 5000, Mooncake's default_kv_lease_ttl) */
  uint32_t client_ttl_ms; /* silence that drops a client (0: 10000) */
  const char *secret;     /* shared secret clients must prove (NULL: none) */
  uint32_t max_clients;   /* connections open at once, each with its thread (0: 1024) */
  /* Eviction (map.h), Mooncake's flags; 0 takes Mooncake's default. */
  double eviction_high_watermark_ratio; /* 0: 0.95 */
  double eviction_ratio;                /* 0: 0.05 */
  uint32_t soft_pin_ttl_ms;             /* default_kv_soft_pin_ttl (0: 30 min) */
  uint32_t max_soft_pin_ttl_ms;         /* max_kv_soft_pin_ttl (0: 24 h) */
  int keep_soft_pinned;                 /* allow_evict_soft_pinned_objects=false */
  uint32_t gc_after_get_ms;             /* enable_gc: 1000, Mooncake's (0: off; map.h) */
  /* The SSD tier (disk.h), Mooncake's flags: files in <root_fs_dir>/<cluster_id>. */
  const char *root_fs_dir; /* NULL: none (evicted objects are dropped) */
  const char *cluster_id;  /* NULL: "mooncake_cluster" */
  /* Client-owned SSD offload (map.h, Mooncake's --enable_offload and
   * its other flags); not with root_fs_dir. */
  int enable_offload;
  store_offload_config offload;
  /* --enable_cxl (map.h's pool): every value in one shared device each
   * client maps (cxl_path names it; cxl_size: 0 takes 8 GiB, Mooncake's);
   * not with enable_offload, root_fs_dir or HA. */
  int enable_cxl;
  const char *cxl_path; /* NULL: /dev/dax0.0 */
  uint64_t cxl_size;
  /* HA (ha.h): the master starts fenced, serving nothing, and serves only
   * until the time store_master_serve_until last set. */
  int fenced;
} store_master_config;

typedef struct store_master store_master;

/* Listens and serves on threads of its own until stopped. FERRY_ESOCKET
 * naming the address when it cannot listen; FERRY_EINVAL naming the flag,
 * the path and the cause when root_fs_dir cannot be used, or enable_cxl
 * is given with enable_offload or root_fs_dir. */
ferry_status store_master_start(const store_master_config *cfg, store_master **out);
uint16_t store_master_port(const store_master *m);
/* A fenced master serves requests (and takes clients) only before until_ns
 * (monotonic; 0: none): past it, a request is refused with FERRY_EBUSY and
 * its connection ends, and a new client is refused before its handshake.
 * The election (ha.c) moves it on at each renewal of its lease. */
void store_master_serve_until(store_master *m, uint64_t until_ns);
/* Its map, for HA's journal and restore (ha.c). */
struct store_map *store_master_map(store_master *m);
/* Its counts for the metrics (map.h), with the clients connected now. */
struct store_map_stats;
void store_master_stats(store_master *m, struct store_map_stats *out);
/* Closes every connection, joins every thread, frees everything. */
void store_master_stop(store_master *m);

#endif
