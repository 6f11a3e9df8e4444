/* engine.c - engine lifetime, memory registration and the notification
 * queue: the parts of the public API that are not about moving bytes. */

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

#include "batch.h"
#include "clock.h"
#include "config.h"
#include "error.h"
#include "log.h"
#include "peer.h"
#include "pool.h"
#include "sync.h"
#include "transport/transport.h"

uint64_t ferry_engine_deadline(const ferry_engine *e, uint64_t bytes) {
  uint64_t extra = (bytes >> 20) * (uint64_t)e->cfg.timeout_ns_per_mb;
  return ferry_now_ns() + (uint64_t)e->cfg.timeout_ms * 1000000ull + extra;
}

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

void ferry_engine_describe(ferry_engine *e, ferry_hello_reply *r) {
  r->descriptor_count = 0;
  for (size_t i = 0; ferry_transports[i] && r->descriptor_count < FERRY_WIRE_MAX_DESCRIPTORS; i++) {
    const ferry_transport *t = ferry_transports[i];
    if (!(e->transports & t->id) || !t->describe)
      continue;
    ferry_wire_descriptor *d = &r->descriptors[r->descriptor_count];
    d->len = (uint16_t)t->describe(e, d->data, sizeof d->data);
    d->transport = t->id;
    if (d->len)
      r->descriptor_count++;
  }
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
  if (!e->registry)
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

/* ---- the call gate and shutdown ------------------------------------------------- */

/* Calls nested in a call of the same thread (ferry_memory_free unregisters)
 * are never refused: the outer call already holds its place in the gate. */
static __thread unsigned gate_depth;

ferry_status ferry_engine_enter(ferry_engine *e) {
  __atomic_add_fetch(&e->calls, 1, __ATOMIC_SEQ_CST);
  if (gate_depth++ == 0)
    ferry_log_set_engine(e->name); /* lines of this call name the engine */
  if (gate_depth > 1 || !ferry_engine_closing(e))
    return FERRY_OK;
  ferry_engine_leave(e, FERRY_OK);
  return ferry_fail(FERRY_ECLOSED, "engine %s is shutting down", e->name);
}

ferry_status ferry_engine_leave(ferry_engine *e, ferry_status st) {
  if (--gate_depth == 0) {
    ferry_log_set_engine(NULL);
    if (st)
      ferry_stats_error(e, st);
  }
  if (!ferry_engine_closing(e)) {
    __atomic_sub_fetch(&e->calls, 1, __ATOMIC_SEQ_CST);
    return st; /* a shutdown starting now sees the count drop at its next look */
  }
  if (st && st != FERRY_ECLOSED && st != FERRY_EINVAL) {
    char detail[FERRY_ERROR_MAX];
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
    st = ferry_fail(FERRY_ECLOSED, "engine %s shut down during the call (%s)", e->name, detail);
  }
  /* Under the lock, so shutdown cannot free the engine before we are out. */
  pthread_mutex_lock(&e->gate_lock);
  if (__atomic_sub_fetch(&e->calls, 1, __ATOMIC_SEQ_CST) == 0)
    pthread_cond_broadcast(&e->gate_cond);
  pthread_mutex_unlock(&e->gate_lock);
  return st;
}

/* How often shutdown repeats its wake-up pass while calls remain: a call
 * may open a socket after a pass and block on it. */
#define FERRY_DRAIN_PASS_NS (20 * 1000 * 1000ull)

/* Wakes every call blocked on a peer (sockets shut down, waits broadcast)
 * and returns once no call is inside the engine. */
static void drain_calls(ferry_engine *e) {
  pthread_mutex_lock(&e->gate_lock);
  while (__atomic_load_n(&e->calls, __ATOMIC_SEQ_CST)) {
    pthread_mutex_unlock(&e->gate_lock);
    ferry_peers_shutdown(e);
    pthread_mutex_lock(&e->gate_lock);
    if (__atomic_load_n(&e->calls, __ATOMIC_SEQ_CST)) {
      struct timespec until = ferry_timespec(ferry_now_ns() + FERRY_DRAIN_PASS_NS);
      pthread_cond_timedwait(&e->gate_cond, &e->gate_lock, &until);
    }
  }
  pthread_mutex_unlock(&e->gate_lock);
}

void ferry_engine_shutdown(ferry_engine *e) {
  if (!e)
    return;
  pthread_mutex_lock(&e->shutdown_lock); /* a second caller waits for the first */
  const char *outer = ferry_log_set_engine(e->name);
  if (!e->shut_down) {
    __atomic_store_n(&e->closing, 1, __ATOMIC_SEQ_CST);
    ferry_pools_wake(e);
    drain_calls(e);
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

static ferry_status transports_register(ferry_engine *e, const ferry_region *regions, size_t count,
                                        unsigned flags) {
  for (size_t i = 0; ferry_transports[i]; i++) {
    const ferry_transport *t = registering(e, i);
    ferry_status st = t ? t->region_register(e, regions, count, flags) : FERRY_OK;
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

static ferry_status registered_already(const ferry_region *pool) {
  return ferry_fail(FERRY_EINVAL,
                    "pool memory 0x%llx (+%llu bytes) is registered already: a pool registers "
                    "its memory itself",
                    (unsigned long long)pool->addr, (unsigned long long)pool->length);
}

/* Transports first, then the registry, so that a peer that sees a region
 * also gets its keys; undone from the transports if the registry refuses.
 * A pool's region must be new: one registered before keeps what its
 * transports gave it (fabric: remote WRITE). */
static ferry_status register_with_transports(ferry_engine *e, const ferry_region *regions,
                                             size_t count, unsigned flags) {
  ferry_region *fresh = malloc((count ? count : 1) * sizeof *fresh);
  if (!fresh)
    return ferry_fail(FERRY_ENOMEM, "no memory to register %zu regions", count);
  pthread_mutex_lock(&e->register_lock);
  size_t n = fresh_regions(e, regions, count, fresh);
  ferry_status st = (flags & FERRY_REGISTER_POOL) && n != count
                        ? registered_already(regions)
                        : transports_register(e, fresh, n, flags);
  if (!st && (st = registry_add(e, regions, count)) != FERRY_OK)
    transports_deregister(e, fresh, n, SIZE_MAX);
  pthread_mutex_unlock(&e->register_lock);
  free(fresh);
  return st;
}

static ferry_status register_regions(ferry_engine *e, const ferry_region *regions, size_t count,
                                     unsigned flags) {
  ferry_status st = transports_register_regions(e) || (flags & FERRY_REGISTER_POOL)
                        ? register_with_transports(e, regions, count, flags)
                        : registry_add(e, regions, count);
  if (!st)
    republish_regions(e);
  return st;
}

ferry_status ferry_engine_region_keys(ferry_engine *e, const ferry_region *regions, size_t count,
                                      ferry_region_keys keys[FERRY_WIRE_MAX_DESCRIPTORS],
                                      unsigned *sections) {
  *sections = 0;
  for (size_t i = 0; ferry_transports[i] && *sections < FERRY_WIRE_MAX_DESCRIPTORS; i++) {
    const ferry_transport *t = ferry_transports[i];
    size_t size = (e->transports & t->id) && t->region_key_size ? t->region_key_size(e) : 0;
    if (!size || size > FERRY_WIRE_MAX_KEY || !t->region_keys)
      continue;
    ferry_region_keys *k = &keys[*sections];
    k->data = calloc(count ? count : 1, size);
    if (!k->data)
      return ferry_fail(FERRY_ENOMEM, "no memory for %s keys of %zu regions", t->name, count);
    k->transport = t->id;
    k->size = (uint16_t)size;
    t->region_keys(e, regions, count, k->data);
    (*sections)++;
  }
  return FERRY_OK;
}

/* ---- registration -------------------------------------------------------------- */

static ferry_status register_one(ferry_engine *e, void *addr, size_t length, unsigned flags) {
  if (!e || !addr || !length)
    return ferry_fail(FERRY_EINVAL, "register %p (+%zu bytes): null engine, address or length",
                      addr, length);
  ferry_region region = {(uint64_t)(uintptr_t)addr, length};
  return register_regions(e, &region, 1, flags);
}

static ferry_status memory_register(ferry_engine *e, void *addr, size_t length) {
  return register_one(e, addr, length, 0);
}

void ferry_engine_fence(ferry_engine *e, ferry_region *removed, size_t count) {
  for (size_t i = 0; ferry_transports[i]; i++)
    if ((e->transports & ferry_transports[i]->id) && ferry_transports[i]->fence)
      ferry_transports[i]->fence(e, removed, count);
  ferry_server_fence(e, removed, count);
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
  ferry_status st = register_regions(e, regions, count, 0);
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

static ferry_status alloc_registered(ferry_engine *e, size_t length, unsigned flags, void **out) {
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
  ferry_status st = register_one(e, a->addr, length, flags);
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

static ferry_status memory_alloc(ferry_engine *e, size_t length, void **out) {
  return alloc_registered(e, length, 0, out);
}

ferry_status ferry_engine_pool_memory(ferry_engine *e, size_t length, void **addr) {
  return *addr ? register_one(e, *addr, length, FERRY_REGISTER_POOL)
               : alloc_registered(e, length, FERRY_REGISTER_POOL, addr);
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

/* ---- notifications ------------------------------------------------------------- */

static char *copy_bytes(const void *data, size_t len) {
  char *s = malloc(len + 1);
  if (s) {
    if (len)
      memcpy(s, data, len);
    s[len] = 0;
  }
  return s;
}

/* One sending peer's memory in the queue. */
struct ferry_notify_share {
  uint64_t peer;
  size_t bytes;
};

/* What malloc really takes for n bytes (glibc: an 8-byte header, 16-byte
 * granularity, 32 bytes at least). */
static size_t chunk_size(size_t n) {
  size_t size = (n + 8 + 15) & ~(size_t)15;
  return size < 32 ? 32 : size;
}

/* The memory a queued notification holds: both copies and its queue slot,
 * counted twice because the queue grows by doubling. */
static size_t notification_cost(size_t name_len, size_t len) {
  return chunk_size(name_len + 1) + chunk_size(len + 1) + 2 * sizeof(ferry_notification);
}

/* The peer's share of the queue, added if new. Caller holds notify_lock. */
static struct ferry_notify_share *notify_share(ferry_engine *e, uint64_t peer) {
  for (size_t i = 0; i < e->notify_share_count; i++)
    if (e->notify_shares[i].peer == peer)
      return &e->notify_shares[i];
  if (e->notify_share_count == e->notify_share_cap) {
    size_t cap = e->notify_share_cap ? e->notify_share_cap * 2 : 8;
    struct ferry_notify_share *grown = realloc(e->notify_shares, cap * sizeof *grown);
    if (!grown)
      return NULL;
    e->notify_shares = grown;
    e->notify_share_cap = cap;
  }
  struct ferry_notify_share *share = &e->notify_shares[e->notify_share_count++];
  *share = (struct ferry_notify_share){peer, 0};
  return share;
}

/* Room for one more notification of `cost` from the peer; sets the error
 * naming the queue, the peer and the limit when there is none. Caller
 * holds notify_lock. */
static ferry_status notify_room(ferry_engine *e, uint64_t peer, const char *peer_name, size_t cost,
                                struct ferry_notify_share **share) {
  size_t limit = e->cfg.notify_peer_bytes, total = limit * FERRY_NOTIFY_PEERS_FULL;
  if (e->notify_count == e->notify_cap) {
    size_t cap = e->notify_cap ? e->notify_cap * 2 : 64;
    ferry_notification *grown = realloc(e->notifications, cap * sizeof *grown);
    if (!grown)
      return ferry_fail(FERRY_ENOMEM, "no memory for a notification");
    e->notifications = grown;
    e->notify_cap = cap;
  }
  *share = notify_share(e, peer);
  if (!*share)
    return ferry_fail(FERRY_ENOMEM, "no memory for a notification");
  /* Nobody drains: refuse rather than let peers grow this process. */
  if ((*share)->bytes + cost > limit)
    return ferry_fail(FERRY_EBUSY,
                      "notification queue of %s is full for peer %s: %zu bytes not drained, "
                      "the limit per peer is %zu (notify_peer_bytes)",
                      e->name, peer_name, (*share)->bytes, limit);
  if (e->notify_bytes + cost > total)
    return ferry_fail(FERRY_EBUSY,
                      "notification queue of %s is full: %zu bytes not drained from all peers, "
                      "the limit is %zu (%d x notify_peer_bytes); refused from peer %s",
                      e->name, e->notify_bytes, total, FERRY_NOTIFY_PEERS_FULL, peer_name);
  return FERRY_OK;
}

ferry_status ferry_engine_push_notification(ferry_engine *e, uint64_t peer, const char *peer_name,
                                            const char *name, size_t name_len, const void *data,
                                            size_t len) {
  size_t cost = notification_cost(name_len, len);
  struct ferry_notify_share *share = NULL;
  pthread_mutex_lock(&e->notify_lock);
  ferry_status st = notify_room(e, peer, peer_name, cost, &share);
  ferry_notification n = {NULL, NULL, len};
  if (!st) {
    n.name = copy_bytes(name, name_len);
    n.data = copy_bytes(data, len);
    if (!n.name || !n.data)
      st = ferry_fail(FERRY_ENOMEM, "no memory for a notification");
  }
  if (st) {
    pthread_mutex_unlock(&e->notify_lock);
    free(n.name);
    free(n.data);
    return st;
  }
  e->notifications[e->notify_count++] = n;
  e->notify_bytes += cost;
  share->bytes += cost;
  pthread_mutex_unlock(&e->notify_lock);
  return FERRY_OK;
}

static ferry_status notify_drain(ferry_engine *e, ferry_notification **out, size_t *count) {
  if (!e || !out || !count)
    return ferry_fail(FERRY_EINVAL, "notify drain: null argument");
  pthread_mutex_lock(&e->notify_lock);
  *out = e->notifications;
  *count = e->notify_count;
  e->notifications = NULL;
  e->notify_count = e->notify_cap = 0;
  e->notify_bytes = 0;
  e->notify_share_count = 0;
  pthread_mutex_unlock(&e->notify_lock);
  return FERRY_OK;
}

void ferry_notify_free(ferry_notification *list, size_t count) {
  for (size_t i = 0; i < count; i++) {
    free(list[i].name);
    free(list[i].data);
  }
  free(list);
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

ferry_status ferry_notify_drain(ferry_engine *e, ferry_notification **out, size_t *count) {
  FERRY_GATED(e, notify_drain(e, out, count));
}
