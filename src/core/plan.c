/* plan.c - prepared transfer plans (ferry.h, ferry_plan_*): a local and a
 * remote descriptor list checked once, then transferred by index pairs.
 *
 * Each descriptor keeps the start of the region holding it, so a transfer
 * turns its pairs into batch entries with no range search: a bounds check
 * per index, a length compare, and a merge with the previous entry when
 * both sides continue it inside the same region (a merged entry is still
 * inside one region on each side, which the target's check and every
 * transport's per-region keys need). The entries are one array, handed to
 * the batch as they are (ferry_batch_checked).
 *
 * What a plan was checked against can change: the local regions it holds
 * (the engine's list of plans lets an unregister release them: one flag,
 * read per transfer) and the target's incarnation (the plan remembers the
 * instance its remote starts were found in; a transfer that meets another
 * one finds them again in the new table first). Plans of all engines share
 * one lock for their lists: it is taken only to make, free, release or
 * detach a plan, never by a transfer. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/sync.h"
#include "core/batch.h"
#include "core/peer.h"
#include "core/plan.h"

typedef struct plan_desc {
  uint64_t addr;
  uint64_t length;
  uint64_t base; /* start of the region holding it */
} plan_desc;

struct ferry_plan {
  ferry_engine *engine; /* NULL once detached (plans_lock) */
  ferry_peer *peer;
  struct ferry_plan *next; /* in engine->plans (plans_lock) */
  plan_desc *local, *remote;
  size_t local_count, remote_count;
  ferry_region *held; /* the local regions, sorted by addr, each once */
  size_t held_count;
  int released;                 /* a held region was unregistered (atomic) */
  ferry_region released_region; /* which one, written before released is set */
  pthread_mutex_t lock;         /* instance and the remote bases */
  uint64_t instance;            /* the target incarnation the remote bases are from */
  char address[FERRY_HOST_MAX + 8];
};

static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;

#define REGION_FMT "[0x%" PRIx64 ", +%" PRIu64 ")"

/* ---- making a plan ------------------------------------------------------------------ */

static ferry_status copy_descs(const ferry_region *from, size_t count, const char *side,
                               plan_desc **out) {
  plan_desc *d = malloc(count * sizeof *d);
  if (!d)
    return ferry_fail(FERRY_ENOMEM, "no memory for a plan of %zu %s descriptors", count, side);
  for (size_t i = 0; i < count; i++) {
    if (!from[i].length || from[i].length > UINT64_MAX - from[i].addr) {
      free(d);
      return ferry_fail(FERRY_EINVAL, "plan: %s descriptor %zu " REGION_FMT " is empty or wraps",
                        side, i, from[i].addr, from[i].length);
    }
    d[i] = (plan_desc){from[i].addr, from[i].length, 0};
  }
  *out = d;
  return FERRY_OK;
}

/* The remote descriptors as entries, for the peer's table calls. */
static ferry_entry *remote_entries(const ferry_plan *p) {
  ferry_entry *en = malloc(p->remote_count * sizeof *en);
  for (size_t i = 0; en && i < p->remote_count; i++)
    en[i] = (ferry_entry){FERRY_OP_READ, NULL, p->remote[i].addr, (size_t)p->remote[i].length};
  return en;
}

/* Finds each remote descriptor's region in the target's table (fetching
 * what the cache lacks). Plan lock held, or the plan not shared yet. */
static ferry_status locate_remote(ferry_plan *p, uint64_t deadline_ns) {
  ferry_entry *en = remote_entries(p);
  uint64_t *bases = malloc(p->remote_count * sizeof *bases);
  ferry_status st = en && bases ? ferry_peer_locate_remote(p->peer, en, p->remote_count,
                                                           deadline_ns, bases, "remote descriptor")
                                : ferry_fail(FERRY_ENOMEM,
                                             "no memory to check a plan's %zu "
                                             "remote descriptors",
                                             p->remote_count);
  for (size_t i = 0; !st && i < p->remote_count; i++)
    p->remote[i].base = bases[i];
  free(en);
  free(bases);
  return st;
}

/* Connects to the target if needed and checks the remote descriptors
 * against its table, recording the incarnation they were found in. */
static ferry_status check_remote(ferry_plan *p) {
  uint64_t deadline = ferry_engine_deadline(p->engine, 0);
  ferry_entry *en = remote_entries(p);
  if (!en)
    return ferry_fail(FERRY_ENOMEM, "no memory to check a plan's %zu remote descriptors",
                      p->remote_count);
  const struct ferry_transport *transport;
  ferry_status st =
      ferry_peer_ensure_for(p->peer, en, p->remote_count, deadline, &transport, &p->instance);
  free(en);
  return st ? st : locate_remote(p, deadline);
}

static int compare_addr(const void *a, const void *b) {
  const ferry_region *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Finds each local descriptor's region and lists them (plans_lock held, so
 * that no unregister can slip between the check and the plan's listing). */
static ferry_status hold_local_locked(ferry_plan *p) {
  p->held = malloc(p->local_count * sizeof *p->held);
  if (!p->held)
    return ferry_fail(FERRY_ENOMEM, "no memory for a plan's %zu local descriptors", p->local_count);
  for (size_t i = 0; i < p->local_count; i++) {
    plan_desc *d = &p->local[i];
    ferry_region r;
    if (!ferry_registry_find(p->engine->registry, d->addr, &r) ||
        d->length > r.length - (d->addr - r.addr))
      return ferry_fail(FERRY_ENOTREG,
                        "plan to %s: local descriptor %zu " REGION_FMT
                        " is not inside a region registered on this engine",
                        p->address, i, d->addr, d->length);
    d->base = r.addr;
    p->held[i] = r;
  }
  qsort(p->held, p->local_count, sizeof *p->held, compare_addr);
  size_t n = 0;
  for (size_t i = 0; i < p->local_count; i++)
    if (!n || p->held[n - 1].addr != p->held[i].addr)
      p->held[n++] = p->held[i];
  p->held_count = n;
  return FERRY_OK;
}

static ferry_status hold_and_list(ferry_plan *p) {
  pthread_mutex_lock(&plans_lock);
  ferry_status st = hold_local_locked(p);
  if (!st) {
    p->next = p->engine->plans;
    p->engine->plans = p;
  }
  pthread_mutex_unlock(&plans_lock);
  return st;
}

static void plan_destroy(ferry_plan *p) {
  free(p->local);
  free(p->remote);
  free(p->held);
  pthread_mutex_destroy(&p->lock);
  free(p);
}

static ferry_status plan_create(ferry_engine *e, const char *target, const ferry_region *local,
                                size_t local_count, const ferry_region *remote, size_t remote_count,
                                ferry_plan **out) {
  if (!e || !local || !remote || !local_count || !remote_count || !out)
    return ferry_fail(FERRY_EINVAL,
                      "plan to %s: null engine, descriptors or out, or an empty descriptor list",
                      target ? target : "(null)");
  ferry_peer *peer;
  ferry_status st = ferry_peer_get(e, target, &peer);
  if (st)
    return st;
  ferry_plan *p = calloc(1, sizeof *p);
  if (!p)
    return ferry_fail(FERRY_ENOMEM, "no memory for a plan to %s", target);
  pthread_mutex_init(&p->lock, NULL);
  p->engine = e;
  p->peer = peer;
  p->local_count = local_count;
  p->remote_count = remote_count;
  snprintf(p->address, sizeof p->address, "%s", peer->address);
  st = copy_descs(local, local_count, "local", &p->local);
  if (!st)
    st = copy_descs(remote, remote_count, "remote", &p->remote);
  if (!st)
    st = check_remote(p);
  if (!st)
    st = hold_and_list(p);
  if (st) {
    plan_destroy(p);
    return st;
  }
  *out = p;
  return FERRY_OK;
}

/* ---- what a plan was checked against ---------------------------------------------------- */

static const ferry_region *find_held(const ferry_plan *p, uint64_t addr) {
  ferry_region key = {addr, 0};
  return bsearch(&key, p->held, p->held_count, sizeof key, compare_addr);
}

void ferry_plans_release(ferry_engine *e, const ferry_region *removed, size_t count) {
  pthread_mutex_lock(&plans_lock);
  for (ferry_plan *p = e->plans; p; p = p->next) {
    for (size_t i = 0; i < count && !__atomic_load_n(&p->released, __ATOMIC_RELAXED); i++) {
      const ferry_region *held = find_held(p, removed[i].addr);
      if (held && held->length == removed[i].length) {
        p->released_region = *held;
        __atomic_store_n(&p->released, 1, __ATOMIC_RELEASE);
      }
    }
  }
  pthread_mutex_unlock(&plans_lock);
}

void ferry_plans_detach(ferry_engine *e) {
  pthread_mutex_lock(&plans_lock);
  for (ferry_plan *p = e->plans; p; p = p->next) {
    p->engine = NULL;
    p->peer = NULL;
  }
  e->plans = NULL;
  pthread_mutex_unlock(&plans_lock);
}

static ferry_status check_local(const ferry_plan *p) {
  if (!__atomic_load_n(&p->released, __ATOMIC_ACQUIRE))
    return FERRY_OK;
  const ferry_region *r = &p->released_region;
  return ferry_fail(FERRY_ENOTREG,
                    "plan to %s: its local region " REGION_FMT
                    " was unregistered after the plan was made (make a new plan)",
                    p->address, r->addr, r->length);
}

/* A transfer that meets another incarnation of the target than the remote
 * bases are from finds them again in its table (plan lock held). */
static ferry_status follow_instance(ferry_plan *p, uint64_t instance, uint64_t deadline_ns) {
  if (instance == p->instance)
    return FERRY_OK;
  ferry_status st = locate_remote(p, deadline_ns);
  if (st) {
    char cause[FERRY_ERROR_MAX];
    snprintf(cause, sizeof cause, "%s", ferry_last_error());
    return ferry_fail(st, "plan to %s: the target restarted, its table checked again: %s",
                      p->address, cause);
  }
  p->instance = instance;
  return FERRY_OK;
}

/* ---- transfers -------------------------------------------------------------------------- */

static ferry_status bad_pair(const ferry_plan *p, size_t i, int64_t li, int64_t ri) {
  if ((uint64_t)li >= p->local_count || (uint64_t)ri >= p->remote_count)
    return ferry_fail(FERRY_EINVAL,
                      "plan to %s: pair %zu names local descriptor %" PRId64 " and remote "
                      "descriptor %" PRId64 ", but the plan has %zu local and %zu remote",
                      p->address, i, li, ri, p->local_count, p->remote_count);
  return ferry_fail(FERRY_EINVAL,
                    "plan to %s: pair %zu joins local descriptor %" PRId64 " of %" PRIu64
                    " bytes with remote descriptor %" PRId64 " of %" PRIu64 " bytes",
                    p->address, i, li, p->local[li].length, ri, p->remote[ri].length);
}

/* The pairs as batch entries, merged where both sides continue the previous
 * entry inside its regions (plan lock held: the remote bases). */
static ferry_status build_entries(const ferry_plan *p, ferry_op op, const int64_t *local_idx,
                                  const int64_t *remote_idx, size_t n, int merge, ferry_entry **out,
                                  size_t *count, uint64_t *total) {
  ferry_entry *en = malloc(n * sizeof *en);
  if (!en)
    return ferry_fail(FERRY_ENOMEM, "no memory for a transfer of %zu pairs", n);
  size_t k = 0;
  uint64_t bytes = 0, local_base = 0, remote_base = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t li = (uint64_t)local_idx[i], ri = (uint64_t)remote_idx[i];
    if (li >= p->local_count || ri >= p->remote_count ||
        p->local[li].length != p->remote[ri].length) {
      free(en);
      return bad_pair(p, i, local_idx[i], remote_idx[i]);
    }
    const plan_desc *l = &p->local[li], *r = &p->remote[ri];
    bytes += l->length;
    ferry_entry *last = &en[k - (k > 0)];
    if (merge && k && l->base == local_base && r->base == remote_base &&
        (uint64_t)(uintptr_t)last->local + last->length == l->addr &&
        last->remote + last->length == r->addr) {
      last->length += (size_t)l->length;
      continue;
    }
    en[k++] = (ferry_entry){op, (void *)(uintptr_t)l->addr, r->addr, (size_t)l->length};
    local_base = l->base;
    remote_base = r->base;
  }
  *out = en;
  *count = k;
  *total = bytes;
  return FERRY_OK;
}

static ferry_status plan_transfer(ferry_engine *e, ferry_plan *p, ferry_op op,
                                  const int64_t *local_idx, const int64_t *remote_idx, size_t n,
                                  const ferry_notification *notify, unsigned flags,
                                  ferry_batch **out) {
  uint64_t start = ferry_now_ns();
  if (!e || !p || !local_idx || !remote_idx || !n || (op != FERRY_OP_READ && op != FERRY_OP_WRITE))
    return ferry_fail(FERRY_EINVAL,
                      "plan transfer: null engine, plan or index array, no pairs, "
                      "or op %d is neither READ nor WRITE",
                      (int)op);
  if (p->engine != e)
    return ferry_fail(FERRY_EINVAL, "plan to %s belongs to another engine", p->address);
  ferry_status st = check_local(p);
  if (st)
    return st;
  const struct ferry_transport *transport;
  uint64_t instance;
  st = ferry_peer_ensure(p->peer, ferry_engine_deadline(e, 0), &transport, &instance);
  if (st)
    return st;
  ferry_entry *entries = NULL;
  size_t count = 0;
  uint64_t total = 0;
  pthread_mutex_lock(&p->lock);
  st = follow_instance(p, instance, ferry_engine_deadline(e, 0));
  if (!st)
    st = build_entries(p, op, local_idx, remote_idx, n, !(flags & FERRY_PLAN_NO_MERGE), &entries,
                       &count, &total);
  pthread_mutex_unlock(&p->lock);
  ferry_batch *b;
  if (!st)
    st = ferry_batch_checked(e, p->peer, entries, count, total, notify, transport, instance, &b);
  if (st)
    return st;
  if (!out)
    return ferry_batch_run_here(b, start);
  ferry_batch_post(b);
  *out = b;
  return FERRY_OK;
}

/* ---- the public calls ------------------------------------------------------------------- */

ferry_status ferry_plan_create(ferry_engine *e, const char *target, const ferry_region *local,
                               size_t local_count, const ferry_region *remote, size_t remote_count,
                               ferry_plan **out) {
  FERRY_GATED(e, plan_create(e, target, local, local_count, remote, remote_count, out));
}

ferry_status ferry_plan_submit(ferry_engine *e, ferry_plan *p, ferry_op op,
                               const int64_t *local_idx, const int64_t *remote_idx, size_t count,
                               const ferry_notification *notify, unsigned flags,
                               ferry_batch **out) {
  if (!out)
    return ferry_fail(FERRY_EINVAL, "plan submit: null out");
  FERRY_GATED(e, plan_transfer(e, p, op, local_idx, remote_idx, count, notify, flags, out));
}

ferry_status ferry_plan_transfer_sync(ferry_engine *e, ferry_plan *p, ferry_op op,
                                      const int64_t *local_idx, const int64_t *remote_idx,
                                      size_t count, const ferry_notification *notify,
                                      unsigned flags) {
  FERRY_GATED(e, plan_transfer(e, p, op, local_idx, remote_idx, count, notify, flags, NULL));
}

size_t ferry_plan_local_count(const ferry_plan *p) { return p ? p->local_count : 0; }

size_t ferry_plan_remote_count(const ferry_plan *p) { return p ? p->remote_count : 0; }

void ferry_plan_free(ferry_plan *p) {
  if (!p)
    return;
  pthread_mutex_lock(&plans_lock);
  if (p->engine) {
    ferry_plan **pp = &p->engine->plans;
    while (*pp != p)
      pp = &(*pp)->next;
    *pp = p->next;
  }
  pthread_mutex_unlock(&plans_lock);
  plan_destroy(p);
}
