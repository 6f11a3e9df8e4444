/* engine.c - engine lifetime, memory registration and the notification
 * queue: the parts of the public API that are not about moving bytes. */

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "batch.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "peer.h"
#include "transport/shm.h"
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
  e->cfg = *cfg;
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
  if (!e->bind_host || !e->advertise_host || (cfg->secret && *cfg->secret && !e->secret))
    return ferry_fail(FERRY_ENOMEM, "no memory for the engine configuration");
  if (!e->cfg.tcp_connections)
    e->cfg.tcp_connections = 1;
  if (!e->cfg.workers)
    e->cfg.workers = 1;
  if (e->cfg.slice_size < 4096 || e->cfg.slice_size > FERRY_WIRE_MAX_PAYLOAD)
    e->cfg.slice_size = FERRY_DEFAULT_SLICE;
  if (e->cfg.spin_us > FERRY_SPIN_US_MAX)
    e->cfg.spin_us = FERRY_SPIN_US_MAX;
  if (!e->cfg.connect_timeout_ms)
    e->cfg.connect_timeout_ms = 5000;
  if (!e->cfg.timeout_ms)
    e->cfg.timeout_ms = 30000;
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
  ferry_net_format_target(e->name, sizeof e->name, e->advertise_host, e->port);
  /* Before the server: its HELLO_REPLY advertises e->shm_path. */
  st = e->transports & FERRY_TRANSPORT_SHM ? ferry_shm_service_start(e) : FERRY_OK;
  if (!st)
    st = ferry_server_start(e, fd);
  if (st) {
    close(fd);
    return st;
  }
  st = ferry_workers_start(e, e->cfg.workers);
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
  ferry_status st = engine_start(e, cfg);
  if (st) {
    char detail[FERRY_ERROR_MAX];
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
    ferry_engine_destroy(e);
    return ferry_fail(st, "engine start failed: %s", detail);
  }
  FERRY_INFO("engine %s listening on %s:%u (transports:%s%s%s)", e->name, e->bind_host, e->port,
             e->transports & FERRY_TRANSPORT_TCP ? " tcp" : "",
             e->transports & FERRY_TRANSPORT_SHM ? " shm" : "",
             e->transports & FERRY_TRANSPORT_FABRIC ? " fabric" : "");
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

void ferry_engine_destroy(ferry_engine *e) {
  if (!e)
    return;
  __atomic_store_n(&e->closing, 1, __ATOMIC_RELEASE);
  if (e->metadata) {
    ferry_segment_unpublish(e->metadata, e->name);
    ferry_metadata_close(e->metadata);
  }
  ferry_server_stop(e);
  ferry_shm_service_stop(e);
  ferry_peers_shutdown(e);
  ferry_workers_stop(e);
  ferry_peers_destroy(e);
  ferry_notify_free(e->notifications, e->notify_count);
  free_allocations(e);
  ferry_registry_destroy(e->registry);
  free(e->bind_host);
  free(e->advertise_host);
  free(e->secret);
  free(e->segment_name);
  pthread_mutex_destroy(&e->peers_lock);
  pthread_mutex_destroy(&e->notify_lock);
  pthread_mutex_destroy(&e->alloc_lock);
  free(e);
}

uint16_t ferry_engine_port(const ferry_engine *e) { return e ? e->port : 0; }
const char *ferry_engine_name(const ferry_engine *e) { return e ? e->name : ""; }

/* ---- memory ------------------------------------------------------------------ */

/* Keeps the ram descriptor in the metadata service in step with the registry. */
static void republish_regions(ferry_engine *e) {
  if (!e->metadata)
    return;
  ferry_region *regions = NULL;
  size_t count = ferry_registry_snapshot(e->registry, &regions);
  if (ferry_segment_publish_regions(e->metadata, e->name, e->port, regions, count))
    FERRY_WARN("could not publish regions of %s: %s", e->name, ferry_last_error());
  free(regions);
}

ferry_status ferry_memory_register(ferry_engine *e, void *addr, size_t length) {
  if (!e || !addr || !length)
    return ferry_fail(FERRY_EINVAL, "register %p (+%zu bytes): null engine, address or length",
                      addr, length);
  ferry_status st = ferry_registry_add(e->registry, (uint64_t)(uintptr_t)addr, length);
  if (!st)
    republish_regions(e);
  return st;
}

/* Once unregister returns, no peer touches the region any more: same-host
 * mappings are revoked and TCP requests already checked are waited for. */
static void after_unregister(ferry_engine *e) {
  ferry_shm_revoke(e);
  ferry_server_quiesce(e);
  republish_regions(e);
}

ferry_status ferry_memory_unregister(ferry_engine *e, void *addr) {
  if (!e)
    return ferry_fail(FERRY_EINVAL, "unregister: null engine");
  ferry_status st = ferry_registry_remove(e->registry, (uint64_t)(uintptr_t)addr);
  if (!st)
    after_unregister(e);
  return st;
}

ferry_status ferry_memory_register_batch(ferry_engine *e, void *const *addrs, const size_t *lengths,
                                         size_t count) {
  if (!e || (count && (!addrs || !lengths)))
    return ferry_fail(FERRY_EINVAL, "register batch: null engine or arrays");
  ferry_region *regions = malloc((count ? count : 1) * sizeof *regions);
  if (!regions)
    return ferry_fail(FERRY_ENOMEM, "no memory to register %zu regions", count);
  for (size_t i = 0; i < count; i++) {
    regions[i].addr = (uint64_t)(uintptr_t)addrs[i];
    regions[i].length = lengths[i];
  }
  ferry_status st = ferry_registry_add_many(e->registry, regions, count);
  free(regions);
  if (!st)
    republish_regions(e);
  return st;
}

ferry_status ferry_memory_unregister_batch(ferry_engine *e, void *const *addrs, size_t count) {
  if (!e || (count && !addrs))
    return ferry_fail(FERRY_EINVAL, "unregister batch: null engine or array");
  ferry_status first = FERRY_OK;
  char detail[FERRY_ERROR_MAX] = "";
  for (size_t i = 0; i < count; i++) {
    ferry_status st = ferry_registry_remove(e->registry, (uint64_t)(uintptr_t)addrs[i]);
    if (st && !first) {
      first = st;
      snprintf(detail, sizeof detail, "%s", ferry_last_error());
    }
  }
  after_unregister(e);
  if (first)
    ferry_error_set_detail(detail);
  return first;
}

ferry_status ferry_memory_alloc(ferry_engine *e, size_t length, void **out) {
  if (!e || !length || !out)
    return ferry_fail(FERRY_EINVAL, "alloc of %zu bytes: null engine/out or zero length", length);
  ferry_allocation *a = calloc(1, sizeof *a);
  if (!a)
    return ferry_fail(FERRY_ENOMEM, "no memory to allocate %zu bytes", length);
  a->fd = memfd_create("ferry-buffer", MFD_CLOEXEC);
  if (a->fd < 0 || ftruncate(a->fd, (off_t)length) < 0) {
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
  ferry_status st = ferry_memory_register(e, a->addr, length);
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

ferry_status ferry_memory_free(ferry_engine *e, void *addr) {
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

ferry_status ferry_engine_push_notification(ferry_engine *e, const char *name, size_t name_len,
                                            const void *data, size_t len) {
  ferry_notification n = {copy_bytes(name, name_len), copy_bytes(data, len), len};
  if (!n.name || !n.data) {
    free(n.name);
    free(n.data);
    return ferry_fail(FERRY_ENOMEM, "no memory for a notification");
  }
  pthread_mutex_lock(&e->notify_lock);
  if (e->notify_bytes + name_len + len > FERRY_NOTIFY_QUEUE_MAX) {
    /* Nobody drains: refuse rather than let a peer grow this process. */
    size_t queued = e->notify_bytes;
    pthread_mutex_unlock(&e->notify_lock);
    free(n.name);
    free(n.data);
    return ferry_fail(FERRY_EBUSY, "notification queue of %s is full (%zu bytes not drained)",
                      e->name, queued);
  }
  if (e->notify_count == e->notify_cap) {
    size_t cap = e->notify_cap ? e->notify_cap * 2 : 64;
    ferry_notification *grown = realloc(e->notifications, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&e->notify_lock);
      free(n.name);
      free(n.data);
      return ferry_fail(FERRY_ENOMEM, "no memory for a notification");
    }
    e->notifications = grown;
    e->notify_cap = cap;
  }
  e->notifications[e->notify_count++] = n;
  e->notify_bytes += name_len + len;
  pthread_mutex_unlock(&e->notify_lock);
  return FERRY_OK;
}

ferry_status ferry_notify_drain(ferry_engine *e, ferry_notification **out, size_t *count) {
  if (!e || !out || !count)
    return ferry_fail(FERRY_EINVAL, "notify drain: null argument");
  pthread_mutex_lock(&e->notify_lock);
  *out = e->notifications;
  *count = e->notify_count;
  e->notifications = NULL;
  e->notify_count = e->notify_cap = 0;
  e->notify_bytes = 0;
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
