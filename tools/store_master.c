/* store_master.c - `ferry store-master`, also run as `mooncake_master`: the
 * store's master (src/store/master.h) in a process of its own until SIGINT
 * or SIGTERM. It takes Mooncake's flag spelling (--flag=value or --flag
 * value) for what it implements and refuses, by name, every other flag
 * Mooncake's master has, rather than run without what was asked. It prints
 * one line "ready master=HOST:PORT" once it listens. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "store/master.h"

/* Mooncake's flags this master does not implement yet (issue 33). */
static const char *const not_yet[] = {
    "enable_ha",
    "ha_backend_type",
    "ha_backend_connstring",
    "etcd_endpoints",
    "enable_offload",
    "allow_evict_soft_pinned_objects",
    "enable_metric_reporting",
    "metrics_port",
    "enable_gc",
    "memory_allocator",
    "enable_http_metadata_server",
    "http_metadata_server_port",
    "http_metadata_server_host",
};

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
          "  --default_kv_soft_pin_ttl=MS  a soft pin lasts this long past the object's last\n"
          "                           put or get (default 1800000: 30 min)\n"
          "  --root_fs_dir=DIR        the SSD tier: each put also writes its value to a file in\n"
          "                           DIR/CLUSTER_ID, and an evicted object stays there, read\n"
          "                           back on a get (DIR: the same path on every client's host)\n"
          "  --cluster_id=ID          the directory in DIR (default mooncake_cluster)\n"
          "A put that does not fit evicts until it does. The shared secret clients must\n"
          "prove comes from FERRY_SECRET.\n"
          "Prints \"ready master=HOST:PORT\" once it listens. Not implemented yet, and refused\n"
          "by name: HA (--enable_ha ...), the client-owned SSD offload (--enable_offload),\n"
          "metrics.\n");
}

/* "--name=value" or "--name value": *name and *value (NULL when absent). */
static int split_flag(int argc, char **argv, int *i, char *name, size_t size, const char **value) {
  const char *arg = argv[*i];
  if (strncmp(arg, "--", 2) != 0)
    return -1;
  arg += 2;
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  if (len == 0 || len >= size)
    return -1;
  memcpy(name, arg, len);
  name[len] = '\0';
  *value = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
  return 0;
}

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
  if (!strcmp(name, "root_fs_dir")) { /* "": none, Mooncake's default */
    cfg->root_fs_dir = value && *value ? value : NULL;
    return value ? 0 : -1;
  }
  if (!strcmp(name, "cluster_id")) {
    cfg->cluster_id = value;
    return value && *value ? 0 : -1;
  }
  for (size_t i = 0; i < sizeof not_yet / sizeof *not_yet; i++)
    if (!strcmp(name, not_yet[i])) {
      fprintf(stderr,
              "store-master: --%s is not implemented by ferry's master yet (issue 33); refusing "
              "to run without it\n",
              name);
      return -1;
    }
  fprintf(stderr, "store-master: unknown option --%s (see --help)\n", name);
  return -1;
}

int ferry_cmd_store_master(int argc, char **argv) {
  store_master_config cfg = {.port = 50051};
  for (int i = 1; i < argc; i++) {
    char name[64];
    const char *value;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (split_flag(argc, argv, &i, name, sizeof name, &value) != 0) {
      fprintf(stderr, "store-master: unexpected argument \"%s\" (see --help)\n", argv[i]);
      return 2;
    }
    if (parse_flag(&cfg, name, value) != 0)
      return 2;
  }
  cfg.secret = getenv("FERRY_SECRET");
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, NULL); /* before the master's threads start */
  store_master *m;
  if (store_master_start(&cfg, &m) != FERRY_OK) {
    fprintf(stderr, "store-master: %s\n", ferry_last_error());
    return 1;
  }
  printf("ready master=%s:%u\n", cfg.host ? cfg.host : "127.0.0.1", store_master_port(m));
  fflush(stdout);
  int sig;
  while (sigwait(&stop, &sig) != 0) {
  }
  store_master_stop(m);
  return 0;
}
