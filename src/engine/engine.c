/* engine.c - the composition root: ferry_engine_create starts the
 * subsystems in order (pools, registry, the transports' services, server,
 * workers, exporters, the metadata record), shutdown and destroy stop and
 * free them in reverse. Nothing below calls into this file: what the
 * subsystems need of a running engine is in core (gate.c, notify.c,
 * transport_hooks.c, registration.c). */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "core/batch.h"
#include "core/config.h"
#include "core/peer.h"
#include "core/plan.h"
#include "core/pool.h"
#include "core/transport.h"
#include "observe/observe.h"

/* ---- creation -------------------------------------------------------------- */

static int is_wildcard(const char *host) {
  return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 || strcmp(host, "*") == 0;
}

/* First non-loopback IPv4 address that is up, so peers on other hosts can
 * reach this engine when nothing was configured. */
static char *guess_advertise_host(void) {
  struct ifaddrs *list;
  char buf[INET_ADDRSTRLEN] = "127.0.0.1";
  if (getifaddrs(&list) == 0) {
    for (struct ifaddrs *i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK) ||
          !(i->ifa_flags & IFF_UP))
        continue;
      inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, buf, sizeof buf);
      break;
    }
    freeifaddrs(list);
  }
  return strdup(buf);
}

static ferry_status copy_config(ferry_engine *e, const ferry_config *cfg) {
  ferry_status st = ferry_config_adopt(&e->cfg, cfg);
  if (st)
    return st;
  const char *env_bind = getenv("MC_TCP_BIND_ADDRESS");
  if (env_bind && !*env_bind)
    env_bind = NULL;
  const char *bind = cfg->bind_host ? cfg->bind_host : env_bind ? env_bind : "0.0.0.0";
  e->bind_host = strdup(bind);
  if (cfg->advertise_host)
    e->advertise_host = strdup(cfg->advertise_host);
  else if (env_bind)
    e->advertise_host = strdup(env_bind);
  else if (!is_wildcard(bind))
    e->advertise_host = strdup(bind);
  else
    e->advertise_host = guess_advertise_host();
  e->secret = cfg->secret && *cfg->secret ? strdup(cfg->secret) : NULL;
  e->segment_name = cfg->segment_name ? strdup(cfg->segment_name) : NULL;
  const char *rails = e->cfg.rail_hosts; /* the caller's or the environment's */
  e->rail_hosts = rails ? strdup(rails) : NULL;
  e->cfg.rail_hosts = e->rail_hosts;
  if (!e->bind_host || !e->advertise_host || (cfg->secret && *cfg->secret && !e->secret) ||
      (rails && !e->rail_hosts))
    return ferry_fail(FERRY_ENOMEM, "no memory for the engine configuration");
  return FERRY_OK;
}

static ferry_status choose_transports(ferry_engine *e) {
  unsigned wanted = e->cfg.transports ? e->cfg.transports : FERRY_TRANSPORT_ALL;
  for (size_t i = 0; ferry_transports[i]; i++)
    if (wanted & ferry_transports[i]->id)
      e->transports |= ferry_transports[i]->id;
  if (!e->transports)
    return ferry_fail(FERRY_ETRANSPORT, "none of the requested transports (0x%x) is built in",
                      wanted);
  return FERRY_OK;
}

/* Starts the service of every transport in use. */
static ferry_status services_start(ferry_engine *e) {
  ferry_status st = FERRY_OK;
  for (size_t i = 0; ferry_transports[i] && !st; i++) {
    const ferry_transport *t = ferry_transports[i];
    if ((e->transports & t->id) && t->service_start)
      st = t->service_start(e);
  }
  return st;
}

static void services_stop(ferry_engine *e) {
  for (size_t i = 0; ferry_transports[i]; i++)
    if (ferry_transports[i]->service_stop)
      ferry_transports[i]->service_stop(e);
}

/* " tcp shm": the transports in use, for the log. */
static void transport_names(const ferry_engine *e, char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; ferry_transports[i] && used < size; i++)
    if (e->transports & ferry_transports[i]->id)
      used += (size_t)snprintf(out + used, size - used, " %s", ferry_transports[i]->name);
}

static ferry_status publish_segment(ferry_engine *e) {
  if (!e->cfg.metadata_url)
    return FERRY_OK;
  ferry_metadata_options opt = {.ttl_ms = e->cfg.metadata_ttl_ms,
                                .connect_timeout_ms = e->cfg.connect_timeout_ms};
  if (!opt.ttl_ms)
    opt.ttl_ms = FERRY_METADATA_TTL_DEFAULT_MS;
  ferry_status st = ferry_metadata_open_with(e->cfg.metadata_url, &opt, &e->metadata);
  if (st)
    return st;
  if (e->segment_name)
    snprintf(e->name, sizeof e->name, "%s", e->segment_name);
  st = ferry_segment_publish(e->metadata, e->name, e->advertise_host, e->port, NULL, 0);
  if (st) { /* nothing was published: destroy must not wait on the store again */
    ferry_metadata_close(e->metadata);
    e->metadata = NULL;
  }
  return st;
}

static ferry_status engine_start(ferry_engine *e, const ferry_config *cfg) {
  ferry_status st = copy_config(e, cfg);
  if (!st)
    st = choose_transports(e);
  if (st)
    return st;
  if (cfg->log_level_set)
    ferry_log_set_level(cfg->log_level);
  e->instance_id = ferry_random_u64();
  ferry_read_boot_id(e->boot_id);
  e->registry = ferry_registry_create();
  e->host_memory = ferry_host_memory_open(ferry_host_memory_query);
  if (!e->registry || !e->host_memory)
    return ferry_fail(FERRY_ENOMEM, "no memory for the region registry");
  int fd;
  st = ferry_net_listen(e->bind_host, cfg->port, &fd, &e->port);
  if (st)
    return st;
  if (!e->secret && !ferry_net_loopback_only(fd))
    FERRY_WARN("engine listens on %s:%u, beyond loopback, with no shared secret: any host that "
               "reaches it can read and write its registered memory; set FERRY_SECRET",
               e->bind_host, e->port);
  ferry_net_format_target(e->name, sizeof e->name, e->advertise_host, e->port);
  /* Before the server: its HELLO_REPLY advertises what they set up. */
  st = services_start(e);
  if (!st)
    st = ferry_server_start(e, fd);
  if (st) {
    close(fd);
    return st;
  }
  st = ferry_workers_start(e, e->cfg.workers);
  if (!st)
    st = ferry_metrics_http_start(e);
  if (!st)
    st = ferry_metrics_log_start(e);
  if (!st)
    st = publish_segment(e);
  return st;
}

ferry_status ferry_engine_create(const ferry_config *cfg, ferry_engine **out) {
  ferry_config defaults;
  if (!out)
    return ferry_fail(FERRY_EINVAL, "ferry_engine_create: out is NULL");
  if (!cfg) {
    ferry_config_init(&defaults);
    cfg = &defaults;
  }
  ferry_engine *e = calloc(1, sizeof *e);
  if (!e)
    return ferry_fail(FERRY_ENOMEM, "no memory for an engine");
  pthread_mutex_init(&e->peers_lock, NULL);
  pthread_mutex_init(&e->notify_lock, NULL);
  pthread_mutex_init(&e->alloc_lock, NULL);
  pthread_mutex_init(&e->files_lock, NULL);
  pthread_mutex_init(&e->streams_lock, NULL);
  pthread_mutex_init(&e->gate_lock, NULL);
  pthread_mutex_init(&e->shutdown_lock, NULL);
  ferry_cond_init(&e->gate_cond);
  pthread_mutex_init(&e->publish_lock, NULL);
  pthread_mutex_init(&e->register_lock, NULL);
  const char *outer = ferry_log_set_engine(e->name); /* filled in once bound */
  ferry_status st = ferry_pools_init(e);
  if (!st)
    st = engine_start(e, cfg);
  if (st) {
    char detail[FERRY_ERROR_MAX];
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
    ferry_engine_destroy(e);
    ferry_log_set_engine(outer);
    return ferry_fail(st, "engine start failed: %s", detail);
  }
  char names[64];
  transport_names(e, names, sizeof names);
  FERRY_INFO("engine %s listening on %s:%u (transports:%s)", e->name, e->bind_host, e->port, names);
  ferry_log_set_engine(outer);
  *out = e;
  return FERRY_OK;
}

/* ---- shutdown ------------------------------------------------------------------ */

void ferry_engine_shutdown(ferry_engine *e) {
  if (!e)
    return;
  pthread_mutex_lock(&e->shutdown_lock); /* a second caller waits for the first */
  const char *outer = ferry_log_set_engine(e->name);
  if (!e->shut_down) {
    __atomic_store_n(&e->closing, 1, __ATOMIC_SEQ_CST);
    ferry_pools_wake(e);
    ferry_engine_drain_calls(e);
    ferry_streams_stop(e); /* before the workers: it hands them batches */
    ferry_metrics_log_stop(e);
    ferry_metrics_http_stop(e);
    if (e->metadata) {
      ferry_segment_unpublish(e->metadata, e->name);
      ferry_metadata_close(e->metadata);
      e->metadata = NULL;
    }
    ferry_server_stop(e);
    services_stop(e);
    ferry_workers_stop(e); /* fails batches still queued */
    ferry_plans_detach(e); /* before the peers they point to go */
    ferry_peers_destroy(e);
    e->shut_down = 1;
  }
  ferry_log_set_engine(outer);
  pthread_mutex_unlock(&e->shutdown_lock);
}

void ferry_engine_destroy(ferry_engine *e) {
  if (!e)
    return;
  ferry_engine_shutdown(e);
  ferry_pools_destroy(e);
  ferry_notify_free(e->notifications, e->notify_count);
  free(e->notify_shares);
  ferry_files_close_all(e);
  ferry_memory_free_all(e);
  ferry_registry_destroy(e->registry);
  ferry_host_memory_close(e->host_memory);
  free(e->bind_host);
  free(e->rail_hosts);
  free(e->advertise_host);
  free(e->secret);
  free(e->segment_name);
  pthread_mutex_destroy(&e->peers_lock);
  pthread_mutex_destroy(&e->notify_lock);
  pthread_mutex_destroy(&e->alloc_lock);
  pthread_mutex_destroy(&e->files_lock);
  pthread_mutex_destroy(&e->streams_lock);
  pthread_mutex_destroy(&e->gate_lock);
  pthread_mutex_destroy(&e->shutdown_lock);
  pthread_cond_destroy(&e->gate_cond);
  pthread_mutex_destroy(&e->publish_lock);
  pthread_mutex_destroy(&e->register_lock);
  free(e);
}

uint16_t ferry_engine_port(const ferry_engine *e) { return e ? e->port : 0; }
const char *ferry_engine_name(const ferry_engine *e) { return e ? e->name : ""; }
