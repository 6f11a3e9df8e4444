/* store_master.c - `ferry store-master`, also run as `mooncake_master`: the
 * store's master (src/store/master.h) in a process of its own until SIGINT
 * or SIGTERM. It takes Mooncake's flag spelling (--flag=value or --flag
 * value) for what it implements and refuses, by name, every other flag
 * Mooncake's master has, rather than run without what was asked. It prints
 * one line "ready master=HOST:PORT" once it listens; with --enable_ha (an
 * election on etcd, src/store/ha.h) " leader" or " standby" follows. With
 * --enable_http_metadata_server it also serves the http metadata store
 * (metadata_server.c's, as Mooncake's master embeds one) and prints "ready
 * metadata-server url=..." before that line. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "cli.h"
#include "commands.h"
#include "store/ha.h"
#include "store/master.h"
#include "store/metrics.h"
#include "store_metrics.h"

#define REPORT_S 10 /* --enable_metric_reporting: a line at most this often */

#define GC_AFTER_GET_MS 1000 /* --enable_gc: Mooncake's delay from a get to the removal */

static void usage(FILE *out) {
  fprintf(out,
          "usage: ferry store-master [options]   (also run as mooncake_master)\n"
          "  --port=N                 port to listen on (default 50051; 0: any free one)\n"
          "  --rpc_address=HOST       address to listen on (default 127.0.0.1)\n"
          "  --default_kv_lease_ttl=MS  lease a get holds on an object (default 5000)\n"
          "  --client_ttl=S           seconds of silence that drop a client (default 10)\n"
          "  --client_ttl_ms=MS       the same in milliseconds\n"
          "  --max_clients=N          connections open at once, each with a thread (default 1024)\n"
          "  --eviction_high_watermark_ratio=R  evict least recently used objects once this\n"
          "                           share of the pool is in use (0 < R <= 1, default 0.95)\n"
          "  --eviction_ratio=R       ... until R less than that is (0 < R <= 1, default 0.05)\n"
          "  --default_kv_soft_pin_ttl=MS  a soft pin lasts this long past the object's commit\n"
          "                           when its put names no TTL (default 1800000: 30 min)\n"
          "  --max_kv_soft_pin_ttl=MS  a put asking a longer soft pin is refused (default\n"
          "                           86400000: 24 h)\n"
          "  --allow_evict_soft_pinned_objects[=false]  with false a soft pin keeps its\n"
          "                           object until its deadline: a put that finds nothing\n"
          "                           else to evict fails (default true: they go last)\n"
          "  --enable_gc[=false]      remove an object a get read 1 s later, or once that\n"
          "                           get's lease ended when later (default false)\n"
          "  --memory_allocator=offset  the allocator (default offset): ferry's is best fit\n"
          "                           over coalesced extents, offset's behaviour; cachelib's\n"
          "                           slab classes are not here and refused\n"
          "  --root_fs_dir=DIR        the SSD tier: each put also writes its value to a file in\n"
          "                           DIR/CLUSTER_ID, and an evicted object stays there, read\n"
          "                           back on a get (DIR: the same path on every client's host)\n"
          "  --cluster_id=ID          the directory in DIR (default mooncake_cluster); with HA\n"
          "                           also the etcd key mooncake-store/ID/master_view\n"
          "  --enable_offload[=true]  client-owned SSD offload: clients with an offload\n"
          "                           directory (MOONCAKE_OFFLOAD_FILE_STORAGE_PATH) copy the\n"
          "                           objects in their segments to files there; an evicted\n"
          "                           object stays, loaded back by its owner on a get\n"
          "                           (--root_fs_dir beside it is not written)\n"
          "  --offload_on_evict[=true]  copy an object only once eviction chooses it (its\n"
          "                           memory goes once the file is written; default false:\n"
          "                           after each put)\n"
          "  --offloading_queue_limit=N  tasks waiting per offloading client (1..100000000,\n"
          "                           default 50000); past it an object is not offloaded\n"
          "  --offload_cap_ratio=R    with --offload_on_evict and --offload_force_evict: an\n"
          "                           eviction round queues at most N*R offloads (0..1,\n"
          "                           default 0.5)\n"
          "  --offload_force_evict[=true]  with --offload_on_evict: past that cap or with the\n"
          "                           owner's queue full, evict without a disk copy (default\n"
          "                           false: the object stays in memory)\n"
          "  --promotion_on_hit[=true]  a key on disk only stays in memory once a get loaded\n"
          "                           it back (default false: only for that get's lease)\n"
          "  --promotion_admission_threshold=N  ... from the Nth such get (1..255, default 2)\n"
          "  --enable_cxl[=true]      every value goes to one CXL memory device that each\n"
          "                           client maps itself (setup with protocol \"cxl\",\n"
          "                           MC_CXL_DEV_PATH, MC_CXL_DEV_SIZE); clients contribute no\n"
          "                           segment; not with --enable_ha, --enable_offload or\n"
          "                           --root_fs_dir\n"
          "  --cxl_path=PATH          the device, naming the pool (default /dev/dax0.0)\n"
          "  --cxl_size=BYTES         the pool's bytes (default 8 GiB); clients map at least\n"
          "                           as many\n"
          "  --enable_ha              elect a leader among masters through etcd: the leader\n"
          "                           serves, the others stand by and take over when it goes\n"
          "  --ha_backend_type=etcd   the election's store (etcd only)\n"
          "  --ha_backend_connstring=HOST:PORT[;HOST:PORT...]  its members (also\n"
          "                           --etcd_endpoints); clients name etcd://HOST:PORT\n"
          "  --ha_lease_ttl=S         the leader's etcd lease, in seconds (default 5)\n"
          "  --metrics_port=N         serve GET /metrics (Prometheus text, Mooncake's metric\n"
          "                           names) and /metrics/summary on the --rpc_address host\n"
          "                           (default: none; Mooncake's master always takes 9003)\n"
          "  --enable_metric_reporting[=false]  log the summary line every 10 s while the\n"
          "                           counts change (default true, as Mooncake)\n"
          "  --max_threads=N, --rpc_thread_num=N  accepted: each client has a thread of its\n"
          "                           own here (--max_clients caps them)\n"
          "  --enable_http_metadata_server  also serve the http metadata store (ferry\n"
          "                           metadata-server's) at http://HOST:PORT/metadata\n"
          "  --http_metadata_server_port=N  its port (default 8080)\n"
          "  --http_metadata_server_host=HOST  its address (default 127.0.0.1)\n"
          "A put that does not fit evicts until it does. The shared secret clients must\n"
          "prove comes from FERRY_SECRET. With HA the leader journals its map in etcd: a\n"
          "new leader keeps every committed object.\n"
          "Prints \"ready master=HOST:PORT\" once it listens (with HA, then \" leader\" or\n"
          "\" standby\").\n");
}

/* The flags that take their value only after '=' (ferry_cli_gflag). */
static const char *const booleans[] = {"enable_ha",
                                       "enable_cxl",
                                       "enable_metric_reporting",
                                       "enable_offload",
                                       "offload_on_evict",
                                       "enable_http_metadata_server",
                                       "allow_evict_soft_pinned_objects",
                                       "enable_gc",
                                       "offload_force_evict",
                                       "promotion_on_hit",
                                       NULL};

static int parse_positive(const char *flag, const char *value, unsigned long scale, uint32_t *out) {
  unsigned long v;
  if (!value || ferry_cli_parse_count(value, 1, 0xffffffffu / scale, &v) != 0) {
    fprintf(stderr, "store-master: --%s needs a positive whole number, not \"%s\"\n", flag,
            value ? value : "");
    return -1;
  }
  *out = (uint32_t)(v * scale);
  return 0;
}

/* A share of the pool: a number in (0, 1]. */
static int parse_ratio(const char *flag, const char *value, double *out) {
  char *end = NULL;
  double v = value ? strtod(value, &end) : NAN;
  if (!value || !*value || *end || !(v > 0 && v <= 1)) {
    fprintf(stderr, "store-master: --%s needs a number in (0, 1], not \"%s\"\n", flag,
            value ? value : "");
    return -1;
  }
  *out = v;
  return 0;
}

/* What the master tells about itself (Mooncake's flags). */
typedef struct report_flags {
  int metrics_port; /* -1: no endpoint */
  int reporting;    /* the periodic summary line */
} report_flags;

static int parse_report_flag(report_flags *rep, const char *name, const char *value) {
  unsigned long v;
  if (!strcmp(name, "enable_metric_reporting"))
    return ferry_cli_gflag_bool("store-master", name, value, &rep->reporting);
  if (!strcmp(name, "metrics_port")) {
    if (!value || ferry_cli_parse_count(value, 0, 65535, &v) != 0) {
      fprintf(stderr, "store-master: --metrics_port needs a port 0..65535, not \"%s\"\n",
              value ? value : "");
      return -1;
    }
    rep->metrics_port = (int)v;
    return 0;
  }
  if (!strcmp(name, "max_threads") || !strcmp(name, "rpc_thread_num")) {
    if (!value || ferry_cli_parse_count(value, 0, 1u << 20, &v) != 0) {
      fprintf(stderr, "store-master: --%s needs a whole number, not \"%s\"\n", name,
              value ? value : "");
      return -1;
    }
    fprintf(stderr,
            "store-master: --%s=%lu changes nothing here: each client is served on a thread of "
            "its own (--max_clients caps them)\n",
            name, v);
    return 0;
  }
  return 1; /* not a report flag */
}

/* --enable_ha's flags (Mooncake's names). */
typedef struct ha_flags {
  int enable;
  const char *connstring;
  uint32_t ttl_s;
} ha_flags;

static int parse_ha_flag(ha_flags *ha, const char *name, const char *value) {
  if (!strcmp(name, "enable_ha")) {
    ha->enable = !value || !strcmp(value, "true") || !strcmp(value, "1");
    return !value || ha->enable || !strcmp(value, "false") || !strcmp(value, "0") ? 0 : -1;
  }
  if (!strcmp(name, "ha_backend_type")) {
    if (value && !strcmp(value, "etcd"))
      return 0;
    fprintf(stderr, "store-master: --ha_backend_type=%s: ferry's master elects through etcd only\n",
            value ? value : "");
    return -1;
  }
  if (!strcmp(name, "ha_backend_connstring") || !strcmp(name, "etcd_endpoints")) {
    if (value && *value && (!ha->connstring || !strcmp(name, "ha_backend_connstring")))
      ha->connstring = value; /* Mooncake: etcd_endpoints is the fallback */
    return value ? 0 : -1;
  }
  if (!strcmp(name, "ha_lease_ttl"))
    return parse_positive(name, value, 1, &ha->ttl_s);
  return 1; /* not an HA flag */
}

/* A gflags boolean: absent value (the bare flag), true/1 or false/0. */
/* --enable_http_metadata_server's flags (Mooncake's names; the host is
 * 127.0.0.1 by default, not Mooncake's 0.0.0.0: the store has no
 * authentication, so serving other hosts is asked for by name). */
typedef struct md_flags {
  int enable;
  unsigned long port;
  const char *host;
} md_flags;

static int parse_md_flag(md_flags *md, const char *name, const char *value) {
  if (!strcmp(name, "enable_http_metadata_server"))
    return ferry_cli_gflag_bool("store-master", name, value, &md->enable);
  if (!strcmp(name, "http_metadata_server_port")) {
    if (value && ferry_cli_parse_count(value, 0, 65535, &md->port) == 0)
      return 0;
    fprintf(stderr, "store-master: --%s needs a port 0..65535, not \"%s\"\n", name,
            value ? value : "");
    return -1;
  }
  if (!strcmp(name, "http_metadata_server_host")) {
    md->host = value;
    return value && *value ? 0 : -1;
  }
  return 1; /* not one of these */
}

/* --memory_allocator: Mooncake's two names. Ours (src/store/extents.c) is
 * offset's kind: any size at any granule, best fit, freed neighbours
 * coalesced, the largest free extent known exactly. cachelib's slabs of
 * size classes place and fail otherwise: refused, not run as another. */
static int parse_allocator(const char *value) {
  if (value && !strcmp(value, "offset")) {
    fprintf(stderr, "store-master: --memory_allocator=offset: ferry's one allocator (best fit over "
                    "coalesced free extents, src/store/extents.c) is of offset's kind\n");
    return 0;
  }
  if (value && !strcmp(value, "cachelib"))
    fprintf(stderr, "store-master: --memory_allocator=cachelib: ferry's master has one allocator, "
                    "best fit over coalesced free extents (Mooncake's offset); cachelib's slab "
                    "size classes are not implemented: run with --memory_allocator=offset\n");
  else
    fprintf(stderr,
            "store-master: --memory_allocator needs offset (or Mooncake's cachelib, not "
            "here), not \"%s\"\n",
            value ? value : "");
  return -1;
}

/* Mooncake's eviction and GC flags beyond the watermarks. */
static int parse_keep_flag(store_master_config *cfg, const char *name, const char *value) {
  int on;
  if (!strcmp(name, "allow_evict_soft_pinned_objects")) {
    if (ferry_cli_gflag_bool("store-master", name, value, &on) != 0)
      return -1;
    cfg->keep_soft_pinned = !on;
    return 0;
  }
  if (!strcmp(name, "enable_gc")) {
    if (ferry_cli_gflag_bool("store-master", name, value, &on) != 0)
      return -1;
    cfg->gc_after_get_ms = on ? GC_AFTER_GET_MS : 0;
    return 0;
  }
  if (!strcmp(name, "memory_allocator"))
    return parse_allocator(value);
  return 1; /* not one of these */
}

/* A number in [min, max] (Mooncake's validators' bounds). */
static int parse_between(const char *flag, const char *value, double min, double max, double *out) {
  char *end = NULL;
  double v = value ? strtod(value, &end) : NAN;
  if (!value || !*value || *end || !(v >= min && v <= max)) {
    fprintf(stderr, "store-master: --%s needs a number in [%g, %g], not \"%s\"\n", flag, min, max,
            value ? value : "");
    return -1;
  }
  *out = v;
  return 0;
}

/* Client-owned offload's flags besides --enable_offload (map.h); 1: not
 * one of these. */
static int parse_offload_flag(store_offload_config *o, const char *name, const char *value) {
  unsigned long v;
  if (!strcmp(name, "offload_on_evict"))
    return ferry_cli_gflag_bool("store-master", name, value, &o->on_evict);
  if (!strcmp(name, "offload_force_evict"))
    return ferry_cli_gflag_bool("store-master", name, value, &o->force_evict);
  if (!strcmp(name, "promotion_on_hit"))
    return ferry_cli_gflag_bool("store-master", name, value, &o->promotion_on_hit);
  if (!strcmp(name, "offload_cap_ratio"))
    return parse_between(name, value, 0, 1, &o->cap_ratio);
  int limit = !strcmp(name, "offloading_queue_limit");
  if (!limit && strcmp(name, "promotion_admission_threshold"))
    return 1;
  unsigned long max = limit ? 100000000ul : 255ul;
  if (!value || ferry_cli_parse_count(value, 1, max, &v) != 0) {
    fprintf(stderr, "store-master: --%s needs a whole number in 1..%lu, not \"%s\"\n", name, max,
            value ? value : "");
    return -1;
  }
  *(limit ? &o->queue_limit : &o->promotion_at) = (uint32_t)v;
  return 0;
}

/* --enable_cxl and its pool's flags; 1: not one of these. */
static int parse_cxl_flag(store_master_config *cfg, const char *name, const char *value) {
  if (!strcmp(name, "enable_cxl"))
    return ferry_cli_gflag_bool("store-master", name, value, &cfg->enable_cxl);
  if (!strcmp(name, "cxl_path")) {
    cfg->cxl_path = value;
    return value && *value ? 0 : -1;
  }
  if (strcmp(name, "cxl_size"))
    return 1;
  size_t size;
  if (!value || ferry_cli_parse_size(value, &size) != 0 || size == 0) {
    fprintf(stderr, "store-master: --cxl_size needs %s, not \"%s\"\n", FERRY_CLI_SIZE_SYNTAX,
            value ? value : "");
    return -1;
  }
  cfg->cxl_size = size;
  return 0;
}

static int parse_flag(store_master_config *cfg, const char *name, const char *value) {
  unsigned long port;
  if (!strcmp(name, "port") || !strcmp(name, "rpc_port")) {
    if (!value || ferry_cli_parse_count(value, 0, 65535, &port) != 0) {
      fprintf(stderr, "store-master: --%s needs a port 0..65535, not \"%s\"\n", name,
              value ? value : "");
      return -1;
    }
    cfg->port = (uint16_t)port;
    return 0;
  }
  if (!strcmp(name, "rpc_address") || !strcmp(name, "host")) {
    cfg->host = value;
    return value && *value ? 0 : -1;
  }
  if (!strcmp(name, "default_kv_lease_ttl"))
    return parse_positive(name, value, 1, &cfg->lease_ttl_ms);
  if (!strcmp(name, "client_ttl"))
    return parse_positive(name, value, 1000, &cfg->client_ttl_ms);
  if (!strcmp(name, "client_ttl_ms"))
    return parse_positive(name, value, 1, &cfg->client_ttl_ms);
  if (!strcmp(name, "max_clients"))
    return parse_positive(name, value, 1, &cfg->max_clients);
  if (!strcmp(name, "eviction_high_watermark_ratio"))
    return parse_ratio(name, value, &cfg->eviction_high_watermark_ratio);
  if (!strcmp(name, "eviction_ratio"))
    return parse_ratio(name, value, &cfg->eviction_ratio);
  if (!strcmp(name, "default_kv_soft_pin_ttl"))
    return parse_positive(name, value, 1, &cfg->soft_pin_ttl_ms);
  if (!strcmp(name, "max_kv_soft_pin_ttl"))
    return parse_positive(name, value, 1, &cfg->max_soft_pin_ttl_ms);
  if (!strcmp(name, "root_fs_dir")) { /* "": none, Mooncake's default */
    cfg->root_fs_dir = value && *value ? value : NULL;
    return value ? 0 : -1;
  }
  if (!strcmp(name, "enable_offload"))
    return ferry_cli_gflag_bool("store-master", name, value, &cfg->enable_offload);
  int rc = parse_offload_flag(&cfg->offload, name, value);
  if (rc <= 0)
    return rc;
  rc = parse_cxl_flag(cfg, name, value);
  if (rc <= 0)
    return rc;
  if (!strcmp(name, "cluster_id")) {
    cfg->cluster_id = value;
    return value && *value ? 0 : -1;
  }
  int kept = parse_keep_flag(cfg, name, value);
  if (kept <= 0)
    return kept;
  fprintf(stderr, "store-master: unknown option --%s (see --help)\n", name);
  return -1;
}

/* The master the tool runs (a plain one, or the one HA runs now) and the
 * metadata store beside it. */
typedef struct running {
  store_master *master;
  store_ha *ha;
  ferry_md_server *md;
} running;

static void running_stats(void *arg, store_map_stats *out) {
  running *r = arg;
  if (r->ha)
    store_ha_stats(r->ha, out);
  else
    store_master_stats(r->master, out);
}

/* Whether the work counted moved between two snapshots (not who is
 * connected: an idle master says nothing). */
static int moved(const store_map_stats *a, const store_map_stats *b) {
  return a->keys != b->keys || a->allocated_bytes != b->allocated_bytes ||
         a->evicted_keys != b->evicted_keys || memcmp(a->ops, b->ops, sizeof a->ops);
}

/* With reporting, the summary line when the counts moved since *last. */
static void report(running *r, store_map_stats *last) {
  store_map_stats now;
  running_stats(r, &now);
  if (!moved(&now, last))
    return;
  char line[512];
  store_metrics_summary(&now, line, sizeof line);
  FERRY_INFO("store master: %s", line);
  *last = now;
}

/* Waits for SIGINT or SIGTERM (blocked in every thread: the main one takes
 * it); meanwhile sweeps the metadata store's expiries every half second
 * and, with reporting, logs the summary every REPORT_S seconds while the
 * counts move. Wakes only for what it has to do. */
static void wait_for_stop(running *r, const sigset_t *stop, int reporting) {
  store_map_stats last = {0};
  const struct timespec sweep = {0, 500 * 1000 * 1000L}, period = {REPORT_S, 0};
  uint64_t next_report = ferry_now_ns() + REPORT_S * 1000000000ull;
  for (;;) {
    int sig = r->md       ? sigtimedwait(stop, NULL, &sweep)
              : reporting ? sigtimedwait(stop, NULL, &period)
                          : sigwaitinfo(stop, NULL);
    if (sig == SIGINT || sig == SIGTERM)
      return;
    if (r->md)
      ferry_md_server_sweep(r->md);
    if (reporting && ferry_now_ns() >= next_report) {
      report(r, &last);
      next_report = ferry_now_ns() + REPORT_S * 1000000000ull;
    }
  }
}

static void running_stop(running *r, store_metrics_server *metrics) {
  store_metrics_stop(metrics);
  store_ha_stop(r->ha);
  store_master_stop(r->master);
  if (r->md)
    ferry_md_server_stop(r->md);
}

/* Serves until SIGINT or SIGTERM, with the http metadata store and the
 * metrics endpoint beside it when asked. */
static int serve(const store_master_config *cfg, const ha_flags *ha, const md_flags *mdf,
                 const report_flags *rep, const sigset_t *stop) {
  running r = {0};
  int leading = 0;
  if (mdf->enable && !(r.md = ferry_md_server_start(mdf->host, (unsigned)mdf->port))) {
    fprintf(stderr, "store-master: --enable_http_metadata_server: cannot serve it on %s:%lu\n",
            mdf->host, mdf->port);
    return 1;
  }
  ferry_status st = ha->enable ? store_ha_start(cfg, ha->connstring, ha->ttl_s, &r.ha, &leading)
                               : store_master_start(cfg, &r.master);
  if (st != FERRY_OK) {
    fprintf(stderr, "store-master: %s\n", ferry_last_error());
    running_stop(&r, NULL);
    return 1;
  }
  const char *host = cfg->host ? cfg->host : "127.0.0.1";
  store_metrics_server *metrics = NULL;
  if (rep->metrics_port >= 0 &&
      !(metrics = store_metrics_start(host, (unsigned)rep->metrics_port, running_stats, &r))) {
    running_stop(&r, NULL);
    return 1;
  }
  if (metrics)
    fprintf(stderr, "store-master: metrics on http://%s:%u/metrics\n", host,
            store_metrics_port(metrics));
  if (r.md) /* before the ready line: a client may start at once */
    printf("ready metadata-server url=http://%s:%u/metadata\n", mdf->host,
           ferry_md_server_port(r.md));
  if (r.ha)
    printf("ready master=%s %s\n", store_ha_address(r.ha), leading ? "leader" : "standby");
  else
    printf("ready master=%s:%u\n", host, store_master_port(r.master));
  fflush(stdout);
  wait_for_stop(&r, stop, rep->reporting);
  running_stop(&r, metrics);
  return 0;
}

int ferry_cmd_store_master(int argc, char **argv) {
  store_master_config cfg = {.port = 50051, .offload = {.cap_ratio = 0.5, .promotion_at = 2}};
  ha_flags ha = {0};
  report_flags rep = {-1, 1};
  md_flags md = {.port = 8080, .host = "127.0.0.1"};
  for (int i = 1; i < argc; i++) {
    char name[64];
    const char *value;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (ferry_cli_gflag(argc, argv, &i, booleans, name, sizeof name, &value) != 0) {
      fprintf(stderr, "store-master: unexpected argument \"%s\" (see --help)\n", argv[i]);
      return 2;
    }
    int not_ha = parse_ha_flag(&ha, name, value);
    int not_md = not_ha > 0 ? parse_md_flag(&md, name, value) : 0;
    int not_report = not_md > 0 ? parse_report_flag(&rep, name, value) : 0;
    if (not_ha < 0 || not_md < 0 || not_report < 0 ||
        (not_report > 0 && parse_flag(&cfg, name, value) != 0))
      return 2;
  }
  if (ha.enable && cfg.enable_cxl) {
    fprintf(stderr, "store-master: --enable_cxl with --enable_ha: not supported (a new leader "
                    "would not know what the CXL pool holds)\n");
    return 2;
  }
  if (ha.enable && !ha.connstring) {
    fprintf(stderr, "store-master: --enable_ha needs --ha_backend_connstring=HOST:PORT (etcd)\n");
    return 2;
  }
  uint32_t soft = cfg.soft_pin_ttl_ms ? cfg.soft_pin_ttl_ms : 30 * 60 * 1000;
  uint32_t soft_max = cfg.max_soft_pin_ttl_ms ? cfg.max_soft_pin_ttl_ms : 24 * 60 * 60 * 1000;
  if (soft > soft_max) { /* Mooncake's master refuses it too */
    fprintf(stderr,
            "store-master: --default_kv_soft_pin_ttl=%u is above --max_kv_soft_pin_ttl=%u\n", soft,
            soft_max);
    return 2;
  }
  cfg.secret = getenv("FERRY_SECRET");
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, NULL); /* before the master's threads start */
  return serve(&cfg, &ha, &md, &rep, &stop);
}
