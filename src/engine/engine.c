/* engine.c - the composition root: ferry_engine_create starts the
 * subsystems in order (pools, registry, the transports' services, server,
 * workers, exporters, the metadata record), shutdown and destroy stop and
 * free them in reverse; and the public memory calls (registration with the
 * registry and every transport, allocations), which the layers below reach
 * only through ferry.h. Nothing below calls into this file: what the
 * subsystems need of a running engine is in core (gate.c, notify.c,
 * transport_hooks.c). */

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

static void free_allocations(ferry_engine *e) {
  while (e->allocations) {
    ferry_allocation *a = e->allocations;
    e->allocations = a->next;
    munmap(a->addr, a->length);
    close(a->fd);
    free(a);
  }
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
  free_allocations(e);
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
  pthread_mutex_destroy(&e->gate_lock);
  pthread_mutex_destroy(&e->shutdown_lock);
  pthread_cond_destroy(&e->gate_cond);
  pthread_mutex_destroy(&e->publish_lock);
  pthread_mutex_destroy(&e->register_lock);
  free(e);
}

uint16_t ferry_engine_port(const ferry_engine *e) { return e ? e->port : 0; }
const char *ferry_engine_name(const ferry_engine *e) { return e ? e->name : ""; }

/* ---- memory ------------------------------------------------------------------ */

/* Keeps the ram descriptor in the metadata service in step with the
 * registry. Snapshot and publish go together under one lock, so publishes
 * land in the order of their snapshots and the last one always holds every
 * change made before it: concurrent registrations cannot leave a stale
 * table behind. A caller that waited while another published a snapshot
 * taken after its own change skips its publish, so a burst of concurrent
 * calls costs one; the descriptor is the whole table, so each publish is
 * still O(regions) (register in batches at scale). */
static void republish_regions(ferry_engine *e) {
  if (!e->metadata)
    return;
  ferry_region *regions = NULL;
  pthread_mutex_lock(&e->publish_lock);
  uint64_t generation = ferry_registry_generation(e->registry);
  if (generation != e->published_generation) {
    size_t count = ferry_registry_snapshot(e->registry, &regions);
    if (ferry_segment_publish_regions(e->metadata, e->name, e->port, regions, count))
      FERRY_WARN("could not publish regions of %s: %s", e->name, ferry_last_error());
    else
      e->published_generation = generation;
  }
  pthread_mutex_unlock(&e->publish_lock);
  free(regions);
}

/* ---- the transports' part of registration -------------------------------------- */

static const ferry_transport *registering(const ferry_engine *e, size_t i) {
  const ferry_transport *t = ferry_transports[i];
  return (e->transports & t->id) && t->region_register ? t : NULL;
}

static int transports_register_regions(const ferry_engine *e) {
  for (size_t i = 0; ferry_transports[i]; i++)
    if (registering(e, i))
      return 1;
  return 0;
}

/* The transports before index `upto` forget `regions`. */
static void transports_deregister(ferry_engine *e, const ferry_region *regions, size_t count,
                                  size_t upto) {
  for (size_t i = 0; i < upto && ferry_transports[i]; i++) {
    const ferry_transport *t = registering(e, i);
    if (t && t->region_deregister)
      t->region_deregister(e, regions, count);
  }
}

static ferry_status transports_register(ferry_engine *e, const ferry_region *regions,
                                        size_t count) {
  for (size_t i = 0; ferry_transports[i]; i++) {
    const ferry_transport *t = registering(e, i);
    ferry_status st = t ? t->region_register(e, regions, count) : FERRY_OK;
    if (st) {
      transports_deregister(e, regions, count, i);
      return st;
    }
  }
  return FERRY_OK;
}

/* Copies into fresh the regions not registered yet: an identical region
 * already registered stays as it is, with its transports' registrations. */
static size_t fresh_regions(ferry_engine *e, const ferry_region *regions, size_t count,
                            ferry_region *fresh) {
  size_t n = 0;
  for (size_t i = 0; i < count; i++) {
    ferry_region known;
    if (!ferry_registry_find(e->registry, regions[i].addr, &known) ||
        known.addr != regions[i].addr || known.length != regions[i].length)
      fresh[n++] = regions[i];
  }
  return n;
}

static ferry_status registry_add(ferry_engine *e, const ferry_region *regions, size_t count) {
  return count == 1 ? ferry_registry_add(e->registry, regions[0].addr, regions[0].length)
                    : ferry_registry_add_many(e->registry, regions, count);
}

/* Transports first, then the registry, so that a peer that sees a region
 * also gets its keys; undone from the transports if the registry refuses. */
static ferry_status register_with_transports(ferry_engine *e, const ferry_region *regions,
                                             size_t count) {
  ferry_region *fresh = malloc((count ? count : 1) * sizeof *fresh);
  if (!fresh)
    return ferry_fail(FERRY_ENOMEM, "no memory to register %zu regions", count);
  pthread_mutex_lock(&e->register_lock);
  size_t n = fresh_regions(e, regions, count, fresh);
  ferry_status st = transports_register(e, fresh, n);
  if (!st && (st = registry_add(e, regions, count)) != FERRY_OK)
    transports_deregister(e, fresh, n, SIZE_MAX);
  pthread_mutex_unlock(&e->register_lock);
  free(fresh);
  return st;
}

/* Every region is host memory this process can read and write, or it is
 * refused before a transport or a peer sees it. Memory kinds (the gpu
 * issue) will decide here which regions are CUDA memory instead. */
static ferry_status register_regions(ferry_engine *e, const ferry_region *regions, size_t count) {
  ferry_status st = ferry_host_memory_check(e->host_memory, regions, count);
  if (st)
    return st;
  st = transports_register_regions(e) ? register_with_transports(e, regions, count)
                                      : registry_add(e, regions, count);
  if (!st)
    republish_regions(e);
  return st;
}

/* ---- registration -------------------------------------------------------------- */

static ferry_status memory_register(ferry_engine *e, void *addr, size_t length) {
  if (!e || !addr || !length)
    return ferry_fail(FERRY_EINVAL, "register %p (+%zu bytes): null engine, address or length",
                      addr, length);
  ferry_region region = {(uint64_t)(uintptr_t)addr, length};
  return register_regions(e, &region, 1);
}

/* Once unregister returns, no peer touches the regions any more; only then
 * do the transports drop their registrations. */
static void after_unregister(ferry_engine *e, ferry_region *removed, size_t count) {
  ferry_engine_fence(e, removed, count);
  transports_deregister(e, removed, count, SIZE_MAX);
  republish_regions(e);
}

/* Unregistrations hold the register lock while transports register regions
 * of their own: a racing registration of the same range must not keep a
 * region whose transport registration is being dropped. */
static int unregister_begin(ferry_engine *e) {
  int locked = transports_register_regions(e);
  if (locked)
    pthread_mutex_lock(&e->register_lock);
  return locked;
}

static void unregister_end(ferry_engine *e, int locked) {
  if (locked)
    pthread_mutex_unlock(&e->register_lock);
}

static ferry_status memory_unregister(ferry_engine *e, void *addr) {
  if (!e)
    return ferry_fail(FERRY_EINVAL, "unregister: null engine");
  ferry_region removed;
  int locked = unregister_begin(e);
  ferry_status st = ferry_registry_take(e->registry, (uint64_t)(uintptr_t)addr, &removed);
  if (!st)
    after_unregister(e, &removed, 1);
  unregister_end(e, locked);
  return st;
}

static ferry_status memory_register_batch(ferry_engine *e, void *const *addrs,
                                          const size_t *lengths, size_t count) {
  if (!e || (count && (!addrs || !lengths)))
    return ferry_fail(FERRY_EINVAL, "register batch: null engine or arrays");
  ferry_region *regions = malloc((count ? count : 1) * sizeof *regions);
  if (!regions)
    return ferry_fail(FERRY_ENOMEM, "no memory to register %zu regions", count);
  for (size_t i = 0; i < count; i++) {
    regions[i].addr = (uint64_t)(uintptr_t)addrs[i];
    regions[i].length = lengths[i];
  }
  ferry_status st = register_regions(e, regions, count);
  free(regions);
  return st;
}

static ferry_status memory_unregister_batch(ferry_engine *e, void *const *addrs, size_t count) {
  if (!e || (count && !addrs))
    return ferry_fail(FERRY_EINVAL, "unregister batch: null engine or array");
  ferry_region *removed = malloc((count ? count : 1) * sizeof *removed);
  if (!removed)
    return ferry_fail(FERRY_ENOMEM, "no memory to unregister %zu regions", count);
  for (size_t i = 0; i < count; i++)
    removed[i].addr = (uint64_t)(uintptr_t)addrs[i];
  size_t n;
  int locked = unregister_begin(e);
  ferry_status st = ferry_registry_take_many(e->registry, removed, count, &n);
  char detail[FERRY_ERROR_MAX] = "";
  if (st)
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
  after_unregister(e, removed, n);
  unregister_end(e, locked);
  free(removed);
  if (st)
    ferry_error_set_detail(detail);
  return st;
}

static ferry_status memory_alloc(ferry_engine *e, size_t length, void **out) {
  if (!e || !length || !out)
    return ferry_fail(FERRY_EINVAL, "alloc of %zu bytes: null engine/out or zero length", length);
  ferry_allocation *a = calloc(1, sizeof *a);
  if (!a)
    return ferry_fail(FERRY_ENOMEM, "no memory to allocate %zu bytes", length);
  /* Sealed at its size: a same-host peer that maps it may not shrink it
   * (an honest peer's mapping would then fault) nor change the seals. */
  a->fd = memfd_create("ferry-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (a->fd < 0 || ftruncate(a->fd, (off_t)length) < 0 ||
      fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
    int err = errno;
    if (a->fd >= 0)
      close(a->fd);
    free(a);
    return ferry_fail_errno(FERRY_ENOMEM, err, "shareable allocation of %zu bytes failed", length);
  }
  a->addr = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
  if (a->addr == MAP_FAILED) {
    int err = errno;
    close(a->fd);
    free(a);
    return ferry_fail_errno(FERRY_ENOMEM, err, "mapping %zu bytes failed", length);
  }
  a->length = length;
  ferry_status st = memory_register(e, a->addr, length);
  if (st) {
    munmap(a->addr, length);
    close(a->fd);
    free(a);
    return st;
  }
  pthread_mutex_lock(&e->alloc_lock);
  a->next = e->allocations;
  e->allocations = a;
  pthread_mutex_unlock(&e->alloc_lock);
  *out = a->addr;
  return FERRY_OK;
}

static ferry_status memory_free(ferry_engine *e, void *addr) {
  if (!e)
    return ferry_fail(FERRY_EINVAL, "free: null engine");
  pthread_mutex_lock(&e->alloc_lock);
  ferry_allocation **pp = &e->allocations;
  while (*pp && (*pp)->addr != addr)
    pp = &(*pp)->next;
  ferry_allocation *a = *pp;
  if (a)
    *pp = a->next;
  pthread_mutex_unlock(&e->alloc_lock);
  if (!a)
    return ferry_fail(FERRY_ENOTFOUND, "free %p: not a buffer allocated by this engine", addr);
  ferry_memory_unregister(e, addr);
  munmap(a->addr, a->length);
  close(a->fd);
  free(a);
  return FERRY_OK;
}

/* ---- the public calls above, inside the gate ------------------------------------- */

ferry_status ferry_memory_register(ferry_engine *e, void *addr, size_t length) {
  FERRY_GATED(e, memory_register(e, addr, length));
}

ferry_status ferry_memory_unregister(ferry_engine *e, void *addr) {
  FERRY_GATED(e, memory_unregister(e, addr));
}

ferry_status ferry_memory_register_batch(ferry_engine *e, void *const *addrs, const size_t *lengths,
                                         size_t count) {
  FERRY_GATED(e, memory_register_batch(e, addrs, lengths, count));
}

ferry_status ferry_memory_unregister_batch(ferry_engine *e, void *const *addrs, size_t count) {
  FERRY_GATED(e, memory_unregister_batch(e, addrs, count));
}

ferry_status ferry_memory_alloc(ferry_engine *e, size_t length, void **out) {
  FERRY_GATED(e, memory_alloc(e, length, out));
}

ferry_status ferry_memory_free(ferry_engine *e, void *addr) {
  FERRY_GATED(e, memory_free(e, addr));
}
