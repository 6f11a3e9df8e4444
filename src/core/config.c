/* config.c - defaults for ferry_config, and the environment variables users
 * of Mooncake already set (MC_TCP_BIND_ADDRESS, MC_TRANSFER_TIMEOUT,
 * MC_FORCE_TCP) plus ferry's own (FERRY_LOG, FERRY_TRANSPORTS,
 * FERRY_CHECKSUM, FERRY_SECRET, FERRY_SPIN_US, FERRY_METADATA_TTL_MS). */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "ferry.h"

static long env_long(const char *name, long fallback) {
  const char *v = getenv(name);
  if (!v || !*v)
    return fallback;
  char *end;
  long n = strtol(v, &end, 10);
  return *end ? fallback : n;
}

void ferry_config_init(ferry_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->tcp_connections = 4;
  cfg->workers = 4;
  cfg->timeout_ms = 30000;
  long seconds = env_long("MC_TRANSFER_TIMEOUT", 0);
  if (seconds > 0)
    cfg->timeout_ms = (uint32_t)(seconds * 1000);
  cfg->timeout_ns_per_mb = 1000000; /* 1 ns per byte, as Mooncake allows */
  cfg->connect_timeout_ms = 5000;
  cfg->slice_size = FERRY_DEFAULT_SLICE;
  cfg->log_level = ferry_log_get_level();
  cfg->secret = getenv("FERRY_SECRET");
  cfg->checksum = env_long("FERRY_CHECKSUM", 0) != 0;
  long spin = env_long("FERRY_SPIN_US", 0);
  /* Clamped as ferry_engine_create clamps a value set in code. */
  cfg->spin_us = spin <= 0 ? 0 : spin > FERRY_SPIN_US_MAX ? FERRY_SPIN_US_MAX : (unsigned)spin;
  const char *transports = getenv("FERRY_TRANSPORTS");
  if (transports)
    cfg->transports = ferry_transport_parse(transports);
  if (env_long("MC_FORCE_TCP", 0))
    cfg->transports = FERRY_TRANSPORT_TCP;
  long ttl = env_long("FERRY_METADATA_TTL_MS", 0);
  cfg->metadata_ttl_ms =
      ttl > 0 && ttl <= UINT32_MAX ? (uint32_t)ttl : FERRY_METADATA_TTL_DEFAULT_MS;
}

static const struct {
  const char *name;
  unsigned bit;
} transport_names[] = {
    {"tcp", FERRY_TRANSPORT_TCP}, {"shm", FERRY_TRANSPORT_SHM}, {"fabric", FERRY_TRANSPORT_FABRIC}};

const char *ferry_transport_name(unsigned transport) {
  for (size_t i = 0; i < sizeof transport_names / sizeof *transport_names; i++)
    if (transport_names[i].bit == transport)
      return transport_names[i].name;
  return "none";
}

unsigned ferry_transport_parse(const char *names) {
  unsigned bits = 0;
  const char *p = names;
  while (p && *p) {
    size_t len = strcspn(p, ",");
    int found = len == 3 && strncmp(p, "all", 3) == 0;
    if (found)
      bits |= FERRY_TRANSPORT_ALL;
    for (size_t i = 0; !found && i < sizeof transport_names / sizeof *transport_names; i++) {
      if (strlen(transport_names[i].name) == len && strncmp(p, transport_names[i].name, len) == 0) {
        bits |= transport_names[i].bit;
        found = 1;
      }
    }
    if (!found)
      return 0;
    p += len;
    if (*p == ',')
      p++;
  }
  return bits;
}

const char *ferry_version(void) { return FERRY_VERSION_STRING; }
