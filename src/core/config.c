/* config.c - defaults for ferry_config, the environment variables users of
 * Mooncake already set (MC_TCP_BIND_ADDRESS, MC_TRANSFER_TIMEOUT,
 * MC_FORCE_TCP) plus ferry's own (FERRY_LOG, FERRY_TRANSPORTS,
 * FERRY_CHECKSUM, FERRY_SECRET, FERRY_SPIN_US, and the serving limits
 * FERRY_MAX_CONNECTIONS, FERRY_MAX_CONNECTIONS_PER_PEER, FERRY_IDLE_TIMEOUT_MS,
 * FERRY_NOTIFY_PEER_BYTES, FERRY_SERVER_THREADS, FERRY_METADATA_TTL_MS, the receive pools'
 * FERRY_POOL_SENDER_BYTES, FERRY_POOL_SENDER_SLOTS and FERRY_POOL_GRANT_TIMEOUT_MS, the metrics
 * endpoint's FERRY_METRICS_PORT and FERRY_METRICS_HOST, Mooncake's MC_TE_METRIC and
 * MC_TE_METRIC_INTERVAL_SECONDS, the rails' FERRY_RAIL_HOSTS), and their
 * validation.
 *
 * ferry_config_init cannot report anything, so it applies only the values
 * it understands; ferry_engine_create then parses every variable again with
 * the same parsers and refuses a bad one, so a typo in the environment is an
 * error naming the variable, never a silently ignored setting. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "engine.h"
#include "metadata/metadata.h"
#include "net/rails.h"

#define TIMEOUT_S_MAX (UINT32_MAX / 1000u) /* timeout_ms is 32 bits */
#define COUNT_MAX 1024u                    /* connections or workers: more is a typo, not a plan */
#define SLICE_MIN 4096u
/* Defaults a documented zero also stands for. */
#define WORKER_IDLE_MS 10000u
#define MAX_CONNECTIONS 1024u
#define MAX_CONNECTIONS_PER_PEER 64u
#define IDLE_TIMEOUT_MS 600000u
#define NOTIFY_PEER_BYTES ((size_t)64 << 20)
#define STALL_MS 5000u        /* a silent tcp link is dropped after this long (ferry.h) */
#define LIMIT_MAX (1ul << 20) /* connections: more is a typo */
#define METRICS_LOG_S 5u      /* MC_TE_METRIC=1 without an interval */
#define METRICS_LOG_S_MAX 86400u
#define POOL_SENDER_SLOTS 1024u
#define POOL_GRANT_TIMEOUT_MS 30000u
#define POOL_GRANT_TIMEOUT_MIN 1000u /* below it an honest sender's grant may expire in flight */
#define POOL_GRANT_TIMEOUT_MAX 86400000u /* a day */
#define FILE_QUEUE_DEPTH 16u
#define FILE_QUEUE_DEPTH_MAX 256u /* the worker pool's bound (workers.c) */

/* The fields every caller has had since ferry_config carried its size. */
#define CONFIG_MIN_SIZE (offsetof(ferry_config, spin_us) + sizeof(unsigned))

/* ---- value parsers (each returns 0 or -1) ------------------------------ */

int ferry_parse_bool(const char *text, int *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
    if (strcasecmp(text, yes[i]) == 0)
      return *out = 1, 0;
    if (strcasecmp(text, no[i]) == 0)
      return *out = 0, 0;
  }
  return -1;
}

/* A decimal number in [min, max], nothing else (no sign, blanks or unit). */
static int parse_ulong(const char *text, unsigned long min, unsigned long max, unsigned long *out) {
  if (!isdigit((unsigned char)text[0]))
    return -1;
  char *end;
  errno = 0;
  unsigned long v = strtoul(text, &end, 10);
  if (errno || *end || v < min || v > max)
    return -1;
  *out = v;
  return 0;
}

/* The library's defaults, before the environment. */
static void defaults(ferry_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->size = sizeof *cfg;
  cfg->tcp_connections = 4;
  cfg->workers = 4;
  cfg->timeout_ms = 30000;
  cfg->timeout_ns_per_mb = 1000000; /* 1 ns per byte, as Mooncake allows */
  cfg->connect_timeout_ms = 5000;
  cfg->slice_size = FERRY_DEFAULT_SLICE;
  cfg->log_level = ferry_log_get_level();
  cfg->worker_idle_ms = WORKER_IDLE_MS;
  cfg->max_connections = MAX_CONNECTIONS;
  cfg->max_connections_per_peer = MAX_CONNECTIONS_PER_PEER;
  cfg->idle_timeout_ms = IDLE_TIMEOUT_MS;
  cfg->notify_peer_bytes = NOTIFY_PEER_BYTES;
  cfg->metadata_ttl_ms = FERRY_METADATA_TTL_DEFAULT_MS;
  cfg->metrics_port = -1;
  cfg->stall_ms = STALL_MS;
  cfg->pool_sender_slots = POOL_SENDER_SLOTS;
  cfg->pool_grant_timeout_ms = POOL_GRANT_TIMEOUT_MS;
  cfg->file_queue_depth = FILE_QUEUE_DEPTH;
}

/* ---- environment ------------------------------------------------------- */

/* Applies one variable's value to cfg; returns FERRY_EINVAL naming the
 * variable, the value and what is accepted when it cannot. */
typedef ferry_status (*env_apply)(const char *name, const char *value, ferry_config *cfg);

static ferry_status bad_env(const char *name, const char *value, const char *accepted) {
  return ferry_fail(FERRY_EINVAL, "environment %s=\"%s\" is not valid: expected %s", name, value,
                    accepted);
}

static ferry_status apply_timeout(const char *name, const char *value, ferry_config *cfg) {
  unsigned long s;
  if (parse_ulong(value, 1, TIMEOUT_S_MAX, &s))
    return bad_env(name, value, "whole seconds, 1 to 4294967");
  cfg->timeout_ms = (uint32_t)(s * 1000);
  return FERRY_OK;
}

static ferry_status apply_spin(const char *name, const char *value, ferry_config *cfg) {
  unsigned long us;
  if (parse_ulong(value, 0, FERRY_SPIN_US_MAX, &us))
    return bad_env(name, value, "microseconds, 0 to 10000");
  cfg->spin_us = (unsigned)us;
  return FERRY_OK;
}

static ferry_status apply_checksum(const char *name, const char *value, ferry_config *cfg) {
  if (ferry_parse_bool(value, &cfg->checksum))
    return bad_env(name, value, FERRY_BOOL_SPELLINGS);
  return FERRY_OK;
}

/* The FERRY_STAGING_* modes by name, in their numeric order. */
static const char *const staging_names[] = {"auto", "always", "never"};

static ferry_status apply_staging(const char *name, const char *value, ferry_config *cfg) {
  for (int i = 0; i < (int)(sizeof staging_names / sizeof *staging_names); i++)
    if (strcasecmp(value, staging_names[i]) == 0) {
      cfg->staging = i;
      return FERRY_OK;
    }
  return bad_env(name, value, "auto, always or never");
}

static ferry_status apply_force_tcp(const char *name, const char *value, ferry_config *cfg) {
  int on;
  if (ferry_parse_bool(value, &on))
    return bad_env(name, value, FERRY_BOOL_SPELLINGS);
  if (on)
    cfg->transports = FERRY_TRANSPORT_TCP;
  return FERRY_OK;
}

static ferry_status apply_transports(const char *name, const char *value, ferry_config *cfg) {
  unsigned bits = ferry_transport_parse(value);
  if (!bits)
    return bad_env(name, value, "a comma-separated list of tcp, shm, fabric or all");
  cfg->transports = bits;
  return FERRY_OK;
}

static ferry_status apply_log(const char *name, const char *value, ferry_config *cfg) {
  if (ferry_log_level_parse(value, &cfg->log_level))
    return bad_env(name, value, "debug, info, warn, error or off");
  return FERRY_OK;
}

/* A serving limit: a whole number from min to max. */
static ferry_status limit_env(const char *name, const char *value, unsigned long min,
                              unsigned long max, unsigned long *out) {
  if (parse_ulong(value, min, max, out)) {
    char accepted[64];
    snprintf(accepted, sizeof accepted, "a whole number, %lu to %lu", min, max);
    return bad_env(name, value, accepted);
  }
  return FERRY_OK;
}

/* The limits that are plain positive numbers of one field each. */
static const struct limit_var {
  const char *name;
  size_t offset, size; /* of the field in ferry_config */
  unsigned long max;
} limit_vars[] = {
    {"FERRY_MAX_CONNECTIONS", offsetof(ferry_config, max_connections), sizeof(unsigned), LIMIT_MAX},
    {"FERRY_MAX_CONNECTIONS_PER_PEER", offsetof(ferry_config, max_connections_per_peer),
     sizeof(unsigned), LIMIT_MAX},
    {"FERRY_IDLE_TIMEOUT_MS", offsetof(ferry_config, idle_timeout_ms), sizeof(uint32_t),
     UINT32_MAX},
    {"FERRY_NOTIFY_PEER_BYTES", offsetof(ferry_config, notify_peer_bytes), sizeof(size_t),
     ULONG_MAX >> 2},
    {"FERRY_METADATA_TTL_MS", offsetof(ferry_config, metadata_ttl_ms), sizeof(uint32_t),
     UINT32_MAX},
    {"FERRY_SERVER_THREADS", offsetof(ferry_config, server_threads), sizeof(unsigned), COUNT_MAX},
    {"FERRY_FABRIC_LANES", offsetof(ferry_config, fabric_lanes), sizeof(unsigned),
     FERRY_FABRIC_LANES_MAX},
    {"FERRY_STALL_MS", offsetof(ferry_config, stall_ms), sizeof(uint32_t), UINT32_MAX},
    {"FERRY_POOL_SENDER_BYTES", offsetof(ferry_config, pool_sender_bytes), sizeof(size_t),
     ULONG_MAX >> 2},
    {"FERRY_POOL_SENDER_SLOTS", offsetof(ferry_config, pool_sender_slots), sizeof(unsigned),
     LIMIT_MAX},
    {"FERRY_FILE_QUEUE_DEPTH", offsetof(ferry_config, file_queue_depth), sizeof(unsigned),
     FILE_QUEUE_DEPTH_MAX},
};

static ferry_status apply_limit(const char *name, const char *value, ferry_config *cfg) {
  const struct limit_var *v = limit_vars;
  while (strcmp(v->name, name) != 0)
    v++; /* every caller is listed: env_vars names only these */
  unsigned long n = 0; /* set when st is FERRY_OK; -O3 cannot tell */
  ferry_status st = limit_env(name, value, 1, v->max, &n);
  if (st)
    return st;
  uint8_t *field = (uint8_t *)cfg + v->offset;
  if (v->size == sizeof(uint32_t)) {
    uint32_t narrow = (uint32_t)n;
    memcpy(field, &narrow, sizeof narrow);
  } else {
    size_t wide = (size_t)n;
    memcpy(field, &wide, sizeof wide);
  }
  return FERRY_OK;
}

static ferry_status apply_grant_timeout(const char *name, const char *value, ferry_config *cfg) {
  unsigned long n = 0;
  ferry_status st = limit_env(name, value, POOL_GRANT_TIMEOUT_MIN, POOL_GRANT_TIMEOUT_MAX, &n);
  if (!st)
    cfg->pool_grant_timeout_ms = (uint32_t)n;
  return st;
}

static ferry_status apply_secret(const char *name, const char *value, ferry_config *cfg) {
  cfg->secret = value;
  return FERRY_OK;
}

static ferry_status apply_metrics_port(const char *name, const char *value, ferry_config *cfg) {
  unsigned long n;
  if (parse_ulong(value, 0, 65535, &n))
    return bad_env(name, value, "a port, 0 (any free one) to 65535");
  cfg->metrics_port = (int)n;
  return FERRY_OK;
}

/* engine/engine.c reads it (it is both addresses); here it is only checked. */
static ferry_status check_bind(const char *name, const char *value, ferry_config *cfg) {
  if (strlen(value) >= FERRY_HOST_MAX || strpbrk(value, " \t\n/"))
    return bad_env(name, value, "a host name or IP address");
  return FERRY_OK;
}

static ferry_status apply_metrics_host(const char *name, const char *value, ferry_config *cfg) {
  ferry_status st = check_bind(name, value, cfg);
  if (!st)
    cfg->metrics_host = value;
  return st;
}

/* The rail parser's message (it names the bad entry), under `what`. */
static ferry_status rail_error(const char *what, ferry_status st) {
  char detail[FERRY_ERROR_MAX];
  snprintf(detail, sizeof detail, "%s", ferry_last_error());
  return ferry_fail(st, "%s: %s", what, detail);
}

static ferry_status apply_rail_hosts(const char *name, const char *value, ferry_config *cfg) {
  unsigned count;
  ferry_status st = ferry_rails_parse(value, NULL, &count);
  if (st)
    return rail_error(name, st);
  cfg->rail_hosts = value;
  return FERRY_OK;
}

static ferry_status apply_te_metric(const char *name, const char *value, ferry_config *cfg) {
  int on;
  if (ferry_parse_bool(value, &on))
    return bad_env(name, value, FERRY_BOOL_SPELLINGS);
  cfg->metrics_log_s = on ? METRICS_LOG_S : 0;
  return FERRY_OK;
}

/* Mooncake's meaning: the interval of MC_TE_METRIC's lines, nothing alone. */
static ferry_status apply_te_interval(const char *name, const char *value, ferry_config *cfg) {
  unsigned long n = 0;
  ferry_status st = limit_env(name, value, 1, METRICS_LOG_S_MAX, &n);
  if (!st && cfg->metrics_log_s)
    cfg->metrics_log_s = (unsigned)n;
  return st;
}

/* A libfabric provider or domain name: what fi_info prints, no blanks. */
static ferry_status check_fabric_name(const char *name, const char *value) {
  if (strlen(value) > 64 || strpbrk(value, " \t\n/"))
    return bad_env(name, value, "a libfabric name of at most 64 characters (fi_info -l)");
  return FERRY_OK;
}

static ferry_status apply_fabric_provider(const char *name, const char *value, ferry_config *cfg) {
  ferry_status st = check_fabric_name(name, value);
  if (!st)
    cfg->fabric_provider = value;
  return st;
}

static ferry_status apply_fabric_device(const char *name, const char *value, ferry_config *cfg) {
  ferry_status st = check_fabric_name(name, value);
  if (!st)
    cfg->fabric_device = value;
  return st;
}

static ferry_status apply_fabric_basic(const char *name, const char *value, ferry_config *cfg) {
  if (ferry_parse_bool(value, &cfg->fabric_mr_basic))
    return bad_env(name, value, FERRY_BOOL_SPELLINGS);
  return FERRY_OK;
}

/* In order of precedence: MC_FORCE_TCP, applied after FERRY_TRANSPORTS,
 * wins over it. */
static const struct env_var {
  const char *name;
  env_apply apply;
} env_vars[] = {
    {"MC_TCP_BIND_ADDRESS", check_bind},
    {"MC_TRANSFER_TIMEOUT", apply_timeout},
    {"FERRY_TRANSPORTS", apply_transports},
    {"MC_FORCE_TCP", apply_force_tcp},
    {"FERRY_CHECKSUM", apply_checksum},
    {"FERRY_STAGING", apply_staging},
    {"FERRY_SPIN_US", apply_spin},
    {"FERRY_LOG", apply_log},
    {"FERRY_SECRET", apply_secret},
    {"FERRY_MAX_CONNECTIONS", apply_limit},
    {"FERRY_MAX_CONNECTIONS_PER_PEER", apply_limit},
    {"FERRY_IDLE_TIMEOUT_MS", apply_limit},
    {"FERRY_NOTIFY_PEER_BYTES", apply_limit},
    {"FERRY_METADATA_TTL_MS", apply_limit},
    {"FERRY_SERVER_THREADS", apply_limit},
    {"FERRY_FABRIC_LANES", apply_limit},
    {"FERRY_STALL_MS", apply_limit},
    {"FERRY_POOL_SENDER_BYTES", apply_limit},
    {"FERRY_POOL_SENDER_SLOTS", apply_limit},
    {"FERRY_FILE_QUEUE_DEPTH", apply_limit},
    {"FERRY_POOL_GRANT_TIMEOUT_MS", apply_grant_timeout},
    {"FERRY_METRICS_PORT", apply_metrics_port},
    {"FERRY_METRICS_HOST", apply_metrics_host},
    {"MC_TE_METRIC", apply_te_metric},
    {"MC_TE_METRIC_INTERVAL_SECONDS", apply_te_interval},
    {"FERRY_RAIL_HOSTS", apply_rail_hosts},
    {"FERRY_FABRIC_PROVIDER", apply_fabric_provider},
    {"FERRY_FABRIC_DEVICE", apply_fabric_device},
    {"FERRY_FABRIC_MR_BASIC", apply_fabric_basic},
};

/* Applies every variable that is set (an empty value counts as unset).
 * With stop_on_error, returns the first bad one; else skips bad ones. */
static ferry_status apply_env(ferry_config *cfg, int stop_on_error) {
  for (size_t i = 0; i < sizeof env_vars / sizeof *env_vars; i++) {
    const char *value = getenv(env_vars[i].name);
    if (!value || !*value)
      continue;
    ferry_status st = env_vars[i].apply(env_vars[i].name, value, cfg);
    if (st && stop_on_error)
      return st;
  }
  return FERRY_OK;
}

const char *ferry_env_name(size_t i) {
  return i < sizeof env_vars / sizeof *env_vars ? env_vars[i].name : NULL;
}

ferry_status ferry_env_check(const char *name) {
  const char *value = getenv(name);
  ferry_config scratch;
  defaults(&scratch);
  for (size_t i = 0; i < sizeof env_vars / sizeof *env_vars; i++)
    if (strcmp(env_vars[i].name, name) == 0)
      return value && *value ? env_vars[i].apply(name, value, &scratch) : FERRY_OK;
  return ferry_fail(FERRY_ENOTFOUND, "%s is not a variable ferry reads", name);
}

/* ---- ferry_config ------------------------------------------------------ */

void ferry_config_init_size(ferry_config *cfg, size_t size) {
  ferry_config full;
  defaults(&full);
  apply_env(&full, 0);
  /* A caller compiled against an older ferry.h has a shorter struct: fill
   * only what it has, and say how much that was. */
  memcpy(cfg, &full, size < sizeof full ? size : sizeof full);
  if (size >= sizeof cfg->size)
    cfg->size = size;
}

static ferry_status bad_field(const char *field, unsigned long long value, const char *accepted) {
  return ferry_fail(FERRY_EINVAL, "ferry_config.%s = %llu is not valid: expected %s", field, value,
                    accepted);
}

static ferry_status check_host(const char *field, const char *host) {
  if (host && (!*host || strlen(host) >= FERRY_HOST_MAX))
    return ferry_fail(FERRY_EINVAL,
                      "ferry_config.%s (\"%.64s\") is not valid: expected a host name or IP "
                      "address of 1 to %d characters, or NULL",
                      field, host, FERRY_HOST_MAX - 1);
  return FERRY_OK;
}

/* One server worker per CPU, at least 2 (one may be stuck on a slow peer). */
static unsigned default_server_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 2 ? 2 : n > (long)COUNT_MAX ? COUNT_MAX : (unsigned)n;
}

/* The receive pools' bounds (pool_sender_bytes 0 stays: half of each pool). */
static ferry_status check_pool_fields(ferry_config *cfg) {
  if (cfg->pool_sender_slots > LIMIT_MAX)
    return bad_field("pool_sender_slots", cfg->pool_sender_slots, "1 to 1048576, or 0 for 1024");
  if (cfg->pool_grant_timeout_ms && (cfg->pool_grant_timeout_ms < POOL_GRANT_TIMEOUT_MIN ||
                                     cfg->pool_grant_timeout_ms > POOL_GRANT_TIMEOUT_MAX))
    return bad_field("pool_grant_timeout_ms", cfg->pool_grant_timeout_ms,
                     "1000 to 86400000 ms, or 0 for 30000");
  if (!cfg->pool_sender_slots)
    cfg->pool_sender_slots = POOL_SENDER_SLOTS;
  if (!cfg->pool_grant_timeout_ms)
    cfg->pool_grant_timeout_ms = POOL_GRANT_TIMEOUT_MS;
  return FERRY_OK;
}

/* Range checks of the fields; zero timeouts and slice size mean "default"
 * (documented in ferry.h) and are resolved here. */
static ferry_status check_fields(ferry_config *cfg) {
  ferry_status st = check_host("bind_host", cfg->bind_host);
  if (!st)
    st = check_host("advertise_host", cfg->advertise_host);
  if (!st)
    st = check_host("metrics_host", cfg->metrics_host);
  unsigned rails;
  if (!st && (st = ferry_rails_parse(cfg->rail_hosts, NULL, &rails)) != FERRY_OK)
    return rail_error("ferry_config.rail_hosts", st);
  if (st)
    return st;
  if (cfg->metrics_port < -1 || cfg->metrics_port > 65535)
    return ferry_fail(FERRY_EINVAL,
                      "ferry_config.metrics_port = %d is not valid: expected -1 (off), 0 (any "
                      "free port) or a port up to 65535",
                      cfg->metrics_port);
  if (cfg->metrics_log_s > METRICS_LOG_S_MAX)
    return bad_field("metrics_log_s", cfg->metrics_log_s, "0 (off) to 86400 seconds");
  if (cfg->transports & ~(unsigned)FERRY_TRANSPORT_ALL)
    return bad_field("transports", cfg->transports, "FERRY_TRANSPORT_* bits, or 0 for all");
  if (cfg->tcp_connections < 1 || cfg->tcp_connections > COUNT_MAX)
    return bad_field("tcp_connections", cfg->tcp_connections, "1 to 1024");
  if (cfg->workers < 1 || cfg->workers > COUNT_MAX)
    return bad_field("workers", cfg->workers, "1 to 1024");
  if (cfg->slice_size && (cfg->slice_size < SLICE_MIN || cfg->slice_size > FERRY_WIRE_MAX_PAYLOAD))
    return bad_field("slice_size", cfg->slice_size, "4096 to 67108864 bytes, or 0 for 512 KiB");
  if (cfg->staging < FERRY_STAGING_AUTO || cfg->staging > FERRY_STAGING_NEVER)
    return bad_field("staging", (unsigned long long)cfg->staging,
                     "FERRY_STAGING_AUTO, FERRY_STAGING_ALWAYS or FERRY_STAGING_NEVER");
  if (cfg->spin_us > FERRY_SPIN_US_MAX)
    return bad_field("spin_us", cfg->spin_us, "0 to 10000 microseconds");
  if (cfg->shm_allowed_uid_count && !cfg->shm_allowed_uids)
    return bad_field("shm_allowed_uid_count", cfg->shm_allowed_uid_count,
                     "0 when shm_allowed_uids is NULL");
  if (cfg->log_level_set && (cfg->log_level < FERRY_LOG_DEBUG || cfg->log_level > FERRY_LOG_OFF))
    return bad_field("log_level", (unsigned long long)cfg->log_level, "a FERRY_LOG_* level");
  if (!cfg->slice_size)
    cfg->slice_size = FERRY_DEFAULT_SLICE;
  if (!cfg->timeout_ms)
    cfg->timeout_ms = 30000;
  if (!cfg->connect_timeout_ms)
    cfg->connect_timeout_ms = 5000;
  if (!cfg->worker_idle_ms)
    cfg->worker_idle_ms = WORKER_IDLE_MS;
  if (!cfg->max_connections)
    cfg->max_connections = MAX_CONNECTIONS;
  if (!cfg->max_connections_per_peer)
    cfg->max_connections_per_peer = MAX_CONNECTIONS_PER_PEER;
  if (!cfg->idle_timeout_ms)
    cfg->idle_timeout_ms = IDLE_TIMEOUT_MS;
  if (!cfg->notify_peer_bytes)
    cfg->notify_peer_bytes = NOTIFY_PEER_BYTES;
  if (!cfg->metadata_ttl_ms)
    cfg->metadata_ttl_ms = FERRY_METADATA_TTL_DEFAULT_MS;
  if (!cfg->stall_ms)
    cfg->stall_ms = STALL_MS;
  if (cfg->server_threads > COUNT_MAX)
    return bad_field("server_threads", cfg->server_threads, "1 to 1024, or 0 for the CPU count");
  if (!cfg->server_threads)
    cfg->server_threads = default_server_threads();
  if (cfg->file_queue_depth > FILE_QUEUE_DEPTH_MAX)
    return bad_field("file_queue_depth", cfg->file_queue_depth, "1 to 256, or 0 for 16");
  if (!cfg->file_queue_depth)
    cfg->file_queue_depth = FILE_QUEUE_DEPTH;
  if (cfg->fabric_lanes > FERRY_FABRIC_LANES_MAX) /* 0: resolved by the fabric transport */
    return bad_field("fabric_lanes", cfg->fabric_lanes, "1 to 8, or 0 for the CPU count");
  return check_pool_fields(cfg);
}

ferry_status ferry_config_adopt(ferry_config *dst, const ferry_config *src) {
  if (src->size < CONFIG_MIN_SIZE || src->size > sizeof *dst)
    return ferry_fail(FERRY_EINVAL,
                      "ferry_config.size = %zu is not valid: expected %zu to %zu (call "
                      "ferry_config_init first; a larger size means a ferry.h newer than this "
                      "libferry %s)",
                      src->size, CONFIG_MIN_SIZE, sizeof *dst, FERRY_VERSION_STRING);
  /* Fields newer than the caller's header keep their defaults. */
  defaults(dst);
  ferry_status st = apply_env(dst, 1);
  if (st)
    return st;
  memcpy(dst, src, src->size);
  dst->size = sizeof *dst;
  return check_fields(dst);
}

const char *ferry_version(void) { return FERRY_VERSION_STRING; }
