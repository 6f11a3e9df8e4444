/* registration.c - the public memory calls: registration of regions with
 * the registry and every transport that keys them (all or nothing, CPU
 * access checked first), the republished region table, and ferry's own
 * allocations (memfd mappings a same-host peer can map too). Pools
 * register their memory here too, with FERRY_REGISTER_POOL. */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "core/engine.h"
#include "core/plan.h"
#include "core/transport.h"

void ferry_memory_free_all(ferry_engine *e) {
  while (e->allocations) {
    ferry_allocation *a = e->allocations;
    e->allocations = a->next;
    munmap(a->addr, a->length);
    close(a->fd);
    free(a);
  }
}

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

static ferry_status registered_already(const ferry_region *pool) {
  return ferry_fail(FERRY_EINVAL,
                    "pool memory 0x%llx (+%llu bytes) is registered already: a pool registers "
                    "its memory itself",
                    (unsigned long long)pool->addr, (unsigned long long)pool->length);
}

/* Copies into fresh the regions not registered yet of one sort: memory
 * the CPU may touch, or (device) memory it cannot. An identical region
 * already registered stays as it is, with its transports' registrations. */
static size_t fresh_regions(ferry_engine *e, const ferry_region *regions, const ferry_where *wheres,
                            size_t count, int device, ferry_region *fresh) {
  size_t n = 0;
  for (size_t i = 0; i < count; i++) {
    ferry_region known;
    if ((wheres[i].cpu_access == 0) == device &&
        (!ferry_registry_find(e->registry, regions[i].addr, &known) ||
         known.addr != regions[i].addr || known.length != regions[i].length))
      fresh[n++] = regions[i];
  }
  return n;
}

/* The fresh regions, host memory then device memory (flagged
 * FERRY_REGISTER_DEVICE: a transport that cannot reach it leaves it
 * unregistered, its key zeros, transport.h); all or nothing. *n: how many
 * of each went to the transports (fresh holds count: host, then device). */
static ferry_status register_fresh(ferry_engine *e, const ferry_region *regions,
                                   const ferry_where *wheres, size_t count, unsigned flags,
                                   ferry_region *fresh, size_t n[2]) {
  n[0] = fresh_regions(e, regions, wheres, count, 0, fresh);
  n[1] = fresh_regions(e, regions, wheres, count, 1, fresh + n[0]);
  if ((flags & FERRY_REGISTER_POOL) && n[0] + n[1] != count)
    return registered_already(regions);
  ferry_status st = transports_register(e, fresh, n[0], flags);
  if (!st && n[1] &&
      (st = transports_register(e, fresh + n[0], n[1], flags | FERRY_REGISTER_DEVICE)) != FERRY_OK)
    transports_deregister(e, fresh, n[0], SIZE_MAX);
  return st;
}

static ferry_status registry_add(ferry_engine *e, const ferry_region *regions,
                                 const ferry_where *wheres, size_t count) {
  return ferry_registry_add_placed(e->registry, regions, wheres, count);
}

/* Transports first, then the registry, so that a peer that sees a region
 * also gets its keys; undone from the transports if the registry refuses.
 * A pool's region must be new: one registered before keeps what its
 * transports gave it (fabric: remote WRITE). */
static ferry_status register_with_transports(ferry_engine *e, const ferry_region *regions,
                                             const ferry_where *wheres, size_t count,
                                             unsigned flags) {
  ferry_region *fresh = malloc((count ? count : 1) * sizeof *fresh);
  if (!fresh)
    return ferry_fail(FERRY_ENOMEM, "no memory to register %zu regions", count);
  pthread_mutex_lock(&e->register_lock);
  size_t n[2];
  ferry_status st = register_fresh(e, regions, wheres, count, flags, fresh, n);
  if (!st && (st = registry_add(e, regions, wheres, count)) != FERRY_OK)
    transports_deregister(e, fresh, n[0] + n[1], SIZE_MAX);
  pthread_mutex_unlock(&e->register_lock);
  free(fresh);
  return st;
}

/* ---- memory kinds ---------------------------------------------------------------- */

/* Asks the drivers what each region is (memory/kind.h) and checks the
 * location the caller gave for it, if any: a malformed location fails
 * before any driver is asked. */
static ferry_status identify_regions(const ferry_region *regions, const char *const *locations,
                                     size_t count, ferry_where *wheres) {
  ferry_location *parsed = locations ? malloc(count * sizeof *parsed) : NULL;
  if (locations && !parsed)
    return ferry_fail(FERRY_ENOMEM, "no memory for the locations of %zu regions", count);
  ferry_status st = FERRY_OK;
  for (size_t i = 0; locations && i < count && !st; i++)
    st = ferry_location_parse(locations[i], &parsed[i]);
  for (size_t i = 0; i < count && !st; i++) {
    st = ferry_kind_identify(regions[i].addr, regions[i].length, &wheres[i]);
    if (!st && locations)
      st = ferry_location_check(locations[i], &parsed[i], &wheres[i], regions[i].addr,
                                regions[i].length);
  }
  free(parsed);
  return st;
}

/* The regions the CPU may touch must be host memory this process can read
 * and write (ferry_host_memory_check, which names the range at fault);
 * device memory was vouched for by its driver. */
static ferry_status check_cpu_memory(ferry_engine *e, const ferry_region *regions,
                                     const ferry_where *wheres, size_t count) {
  size_t cpu = 0;
  for (size_t i = 0; i < count; i++)
    cpu += wheres[i].cpu_access;
  if (cpu == count)
    return ferry_host_memory_check(e->host_memory, regions, count);
  ferry_region *reachable = malloc((cpu ? cpu : 1) * sizeof *reachable);
  if (!reachable)
    return ferry_fail(FERRY_ENOMEM, "no memory to check %zu regions", count);
  for (size_t i = 0, k = 0; i < count; i++)
    if (wheres[i].cpu_access)
      reachable[k++] = regions[i];
  ferry_status st = ferry_host_memory_check(e->host_memory, reachable, cpu);
  free(reachable);
  return st;
}

/* Every region's kind is decided here, and memory the CPU may touch must
 * be host memory this process can read and write: anything else is
 * refused before a transport or a peer sees it. */
static ferry_status register_regions(ferry_engine *e, const ferry_region *regions,
                                     const char *const *locations, size_t count, unsigned flags) {
  ferry_where *wheres = malloc((count ? count : 1) * sizeof *wheres);
  if (!wheres)
    return ferry_fail(FERRY_ENOMEM, "no memory to register %zu regions", count);
  ferry_status st = identify_regions(regions, locations, count, wheres);
  if (!st)
    st = check_cpu_memory(e, regions, wheres, count);
  if (!st)
    st = transports_register_regions(e) || (flags & FERRY_REGISTER_POOL)
             ? register_with_transports(e, regions, wheres, count, flags)
             : registry_add(e, regions, wheres, count);
  free(wheres);
  if (!st)
    republish_regions(e);
  return st;
}

/* ---- registration -------------------------------------------------------------- */

static ferry_status register_one(ferry_engine *e, void *addr, size_t length, const char *location,
                                 unsigned flags) {
  if (!e || !addr || !length)
    return ferry_fail(FERRY_EINVAL, "register %p (+%zu bytes): null engine, address or length",
                      addr, length);
  ferry_region region = {(uint64_t)(uintptr_t)addr, length};
  return register_regions(e, &region, location ? &location : NULL, 1, flags);
}

/* Once unregister returns, no peer touches the regions any more and the
 * plans holding them are released; only then do the transports drop their
 * registrations. */
static void after_unregister(ferry_engine *e, ferry_region *removed, size_t count) {
  ferry_plans_release(e, removed, count);
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
                                          const size_t *lengths, const char *const *locations,
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
  ferry_status st = register_regions(e, regions, locations, count, 0);
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
  ferry_status st = register_one(e, a->addr, length, NULL, flags);
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
  return *addr ? register_one(e, *addr, length, NULL, FERRY_REGISTER_POOL)
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

/* ---- the public calls above, inside the gate ------------------------------------- */

ferry_status ferry_memory_register(ferry_engine *e, void *addr, size_t length) {
  FERRY_GATED(e, register_one(e, addr, length, NULL, 0));
}

ferry_status ferry_memory_register_at(ferry_engine *e, void *addr, size_t length,
                                      const char *location) {
  FERRY_GATED(e, register_one(e, addr, length, location, 0));
}

ferry_status ferry_memory_unregister(ferry_engine *e, void *addr) {
  FERRY_GATED(e, memory_unregister(e, addr));
}

ferry_status ferry_memory_register_batch(ferry_engine *e, void *const *addrs, const size_t *lengths,
                                         size_t count) {
  FERRY_GATED(e, memory_register_batch(e, addrs, lengths, NULL, count));
}

ferry_status ferry_memory_register_batch_at(ferry_engine *e, void *const *addrs,
                                            const size_t *lengths, const char *const *locations,
                                            size_t count) {
  FERRY_GATED(e, memory_register_batch(e, addrs, lengths, locations, count));
}

int ferry_memory_cuda_available(char *why, size_t size) {
  return ferry_kind_cuda.available(why, size);
}

ferry_status ferry_memory_unregister_batch(ferry_engine *e, void *const *addrs, size_t count) {
  FERRY_GATED(e, memory_unregister_batch(e, addrs, count));
}

ferry_status ferry_memory_check_local(ferry_engine *e, const void *addr, size_t length) {
  if (!e || !addr || !length)
    return ferry_fail(FERRY_EINVAL, "ferry_memory_check: engine %p, address %p, length %zu",
                      (void *)e, addr, length);
  if (!ferry_registry_contains(e->registry, (uint64_t)(uintptr_t)addr, length))
    return ferry_fail(FERRY_ENOTREG,
                      "local address %p (+%zu bytes) is not registered on this engine", addr,
                      length);
  return FERRY_OK;
}

ferry_status ferry_memory_check(ferry_engine *e, const void *addr, size_t length) {
  FERRY_GATED(e, ferry_memory_check_local(e, addr, length));
}

ferry_status ferry_memory_alloc(ferry_engine *e, size_t length, void **out) {
  FERRY_GATED(e, memory_alloc(e, length, out));
}

ferry_status ferry_memory_free(ferry_engine *e, void *addr) {
  FERRY_GATED(e, memory_free(e, addr));
}
