/* pool.c - receive pools: a receiver's named memory that senders fill
 * through slots it grants them, and the messages that land there.
 *
 * A send is a grant (a slot of the pool, reserved for one sender), then the
 * data WRITE into it (the engine's own path, over a transport whose WRITEs
 * into a pool are bounded by grants: see "Transports" below) with a LANDED
 * notice as the batch's after-landed message (batch.h): on tcp it rides on
 * the last WRITE frame, elsewhere it follows on the control connection
 * once every byte was acknowledged. The message is queued for ferry_recv
 * only when its notice came and every byte of it was written under the
 * grant with none still moving: the target records the spans every WRITE
 * into a slot landed (tcp), holds an in-band notice whose other frames are
 * still on their way (PENDING), refuses a notice whose message has bytes
 * no WRITE covered (they would deliver what an earlier message left there),
 * and refuses WRITEs into a slot that landed. The reply to LANDED carries
 * a pre-grant for the sender's next message of the same size while the
 * pool has room for it and one more, so a steady sender pays the WRITE and
 * its ack only.
 *
 * A transport may post the notice on its own path instead (post_after,
 * transport.h: shm's ring in shared memory) once every byte is in place;
 * the target serves it here like any LANDED (FERRY_NOTICE_POSTED: only a
 * slot granted to that sender, at most its length) and hands the reply's
 * pre-grant back as a credit the sender collects (take_credits) before
 * its next send. Such a sender keeps several of them (credits_most) per
 * pool, since a credit comes back only when the receiver got round to the
 * notice: a steady send then takes a credit, copies and posts, with no
 * round trip at all. A notice only asks for its own replacement, so the
 * credits going round grow by the control grants a sender makes when it
 * holds none; once as many as it keeps are asked for, a sender holding
 * none sleeps until they come instead (credit_wait). The transport also names the epoch its credits
 * are valid in; cached ones of another epoch (the target took the sender's slots back, or the link
 * that carried them ended) are only given back. An shm sender copies into the pool itself, so its
 * bytes are never seen landing: its messages (posted, or noticed on the control connection while
 * it holds a link, ferry_pools_peer_copies) are delivered without the coverage check. shm serves
 * only the same user, who can write that memory anyway.
 *
 * Bounds per sender (a sender is the engine id its handshake claims): in
 * each pool it holds at most pool_sender_bytes (default half the pool) and
 * pool_sender_slots grants not landed yet, so one sender that takes its
 * share and stalls leaves the rest to the others; and a grant no WRITE
 * or LANDED touched for pool_grant_timeout_ms expires. Expired grants go
 * back lazily, when a grant request finds no room (or, waiting for room,
 * when the oldest one is due): their senders' credits are voided first
 * (the transports' peer_gone), then the slots are freed; a WRITE or LANDED
 * into an expired grant is refused from the moment it expired.
 *
 * Slots are reclaimed when the receiver releases them, and, for slots not
 * landed yet, when every connection of their sender ended (the sender died
 * or left): no WRITE of it can arrive any more, and a slot whose notice did
 * not come is never delivered. Every connection counts, a transport's own
 * links too (ferry_pools_peer_joined/left): a steady shm sender posts its
 * notices on its link while its control connections idle out, and its
 * slots must outlive those. A sender trusts a pre-grant for
 * PREGRANT_FRESH_NS only, far below a receiver's idle_timeout_ms, so it
 * never writes into a slot voided by its connections idling out.
 *
 * Lookups (slots.h): slots by id in a hash, by offset in a treap that also
 * finds the first gap that fits, each sender's grants on a list of its
 * own, landed messages on a list in landing order and on their tag's
 * bucket; a slot's tag and sender name are allocated to their size at
 * LANDED. No operation walks every slot of a pool.
 *
 * Transports: a WRITE into a pool must be checked against the writer's
 * grants by the target, and only tcp's target sees each one (server.c
 * calls ferry_pools_check_writes); shm serves the same user only. The
 * fabric transport's one-sided WRITEs pass no such check, so a pool is
 * registered with it for remote READ only (FERRY_REGISTER_POOL) and the
 * WRITEs of a send go over tcp or shm (batch.c pins them to a transport
 * with pool_writes_bounded). */
#include "core/pool.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/sync.h"
#include "core/batch.h"
#include "core/peer.h"
#include "core/transport.h"
#include "pool/slots.h"

#define SLOT_ALIGN 64
#define PREGRANT_FRESH_NS (5000ull * 1000 * 1000)
#define GRANT_WAIT_TURN_MS 20u
#define PREGRANTS_PER_POOL 1 /* cached per target pool; more would idle the receiver's room */
/* The same with credits: they come back later than a reply, so a sender
 * needs enough to cover the receiver's lag (one wake of its service per
 * batch of notices): up to CREDIT_BYTES of them, 4 to 32 credits. Many
 * small ones let a sender run ahead; large ones would only queue whole
 * messages behind the receiver. The receiver's room rule (serve_landed)
 * still bounds them by the pool's room for that size. */
#define CREDITS_MIN 4
#define CREDITS_MAX 32
#define CREDIT_BYTES (4ull << 20)
#define CREDITS_PER_TAKE CREDITS_MAX
#define TAG_BUCKETS 64  /* landed messages by tag, per pool */
#define EXPIRED_KEPT 64 /* ids of expired grants a pool remembers, to say so to a late LANDED */
#define EXPIRE_PEERS 16 /* senders whose credits one sweep of expired grants voids */
#define WRITTEN_SPANS                                                                              \
  256 /* separate spans a slot's WRITEs may leave (an honest sender's are few) */

/* PENDING: its LANDED notice came in-band with one of several WRITE frames
 * (tcp) while the others still moved; queued once all its bytes landed. */
typedef enum slot_state { SLOT_GRANTED, SLOT_PENDING, SLOT_QUEUED, SLOT_TAKEN } slot_state;

typedef struct slot {
  ferry_extent where; /* offset and length in the pool */
  ferry_hnode by_id;  /* key: the slot id */
  uint64_t peer;
  slot_state state;
  unsigned writers;       /* WRITEs into it still moving bytes (tcp) */
  int inband;             /* its LANDED notice came without a control round trip */
  int spans_lost;         /* its WRITEs left more than WRITTEN_SPANS spans: it never completes */
  uint64_t active_ns;     /* granted, or a WRITE or LANDED into it: its expiry counts from there */
  uint64_t landed, seq;   /* message length, order of landing */
  ferry_coverage written; /* granted: the spans its WRITEs landed (tcp) */
  uint8_t *meta;          /* from LANDED: the tag, then the sender's name with its NUL */
  size_t tag_len;
  /* Granted: by_age in the pool's idle grants (out while writers), by_owner
   * in its sender's grants. Queued: by_age in the pool's messages, by_owner
   * in its tag's bucket. */
  ferry_link by_age, by_owner;
} slot;

/* A sender's grants in one pool (those not landed yet). */
typedef struct pool_sender {
  ferry_hnode by_peer; /* key: its engine id */
  uint64_t bytes;
  unsigned slots;
  ferry_link grants;
} pool_sender;

struct ferry_pool {
  ferry_engine *engine;
  char name[FERRY_WIRE_MAX_NAME + 1];
  uint8_t *base;
  size_t length, used;
  int allocated; /* base came from ferry_memory_alloc */
  ferry_extents extents;
  ferry_table ids, senders;
  ferry_link idle;     /* granted slots no WRITE moves into, least recently active first */
  ferry_link messages; /* queued, in landing order */
  ferry_link tags[TAG_BUCKETS];
  uint64_t tag_seed;
  uint64_t granted; /* bytes of slots granted and not landed */
  uint64_t expired[EXPIRED_KEPT];
  unsigned expired_next;
  size_t queued; /* slots in SLOT_QUEUED */
  int efd;       /* readable while queued > 0 */
  int dead;      /* destroy began */
  unsigned users;
  pthread_cond_t cond; /* a message landed, room was freed, or the pool is dying */
  int landed_unseen;   /* a message landed since receivers were last woken */
  struct ferry_pool *next;
};

/* A pre-grant held by this engine as a sender. */
typedef struct pregrant {
  ferry_pool_grant grant;
  uint64_t got_ns;
  uint64_t epoch; /* the transport's credit epoch it came under (0: none) */
  int given_up;   /* a failed send's slot: only to be given back */
} pregrant;

/* The pre-grants held for one target pool, oldest first: found once per
 * send (no name compared per pre-grant, no allocation per credit), kept
 * until the engine goes. */
typedef struct route {
  char target[FERRY_HOST_MAX + 8];
  char pool[FERRY_WIRE_MAX_NAME + 1];
  pregrant *held;
  size_t count, cap;
  /* Credits its posted notices asked for and not collected yet: an
   * estimate (the target may grant fewer), reset when a wait for them
   * brings none. */
  unsigned asked;
  struct route *next;
} route;

/* The connections one sender holds to this engine: the server's control
 * connections and a transport's own links (shm's carry its notices). */
typedef struct sender_conns {
  uint64_t peer;
  unsigned count;
  int copies; /* one of them writes into pools unseen (ferry_pools_peer_copies) */
} sender_conns;

struct ferry_pools {
  pthread_mutex_t lock; /* everything here and in every pool */
  ferry_pool *list;
  sender_conns *senders; /* those with count > 0 */
  size_t nsenders, senders_cap;
  int count; /* pools alive, read without the lock by the WRITE check */
  uint64_t next_id, next_seq;
  route *routes;
  uint64_t landed, inband; /* messages landed; of them, noticed in-band */
  uint64_t waiting;        /* grant requests waiting for room */
};

ferry_status ferry_pools_init(ferry_engine *e) {
  e->pools = calloc(1, sizeof *e->pools);
  if (!e->pools)
    return ferry_fail(FERRY_ENOMEM, "no memory for the pool table");
  pthread_mutex_init(&e->pools->lock, NULL);
  /* Random, so a slot id of another incarnation never names one of ours. */
  e->pools->next_id = ferry_random_u64() >> 1 | 1;
  return FERRY_OK;
}

static void set_ready(ferry_pool *p, int ready);

void ferry_pools_wake(ferry_engine *e) {
  if (!e->pools)
    return;
  pthread_mutex_lock(&e->pools->lock);
  for (ferry_pool *p = e->pools->list; p; p = p->next) {
    pthread_cond_broadcast(&p->cond);
    set_ready(p, 1); /* and its fd's pollers */
  }
  pthread_mutex_unlock(&e->pools->lock);
}

static void free_slot(ferry_hnode *n) {
  slot *s = FERRY_CONTAINER(n, slot, by_id);
  ferry_coverage_free(&s->written);
  free(s->meta);
  free(s);
}

static void free_sender(ferry_hnode *n) { free(FERRY_CONTAINER(n, pool_sender, by_peer)); }

/* A sender's record in p goes with its last grant there. */
static void sender_forget_if_idle(ferry_pool *p, pool_sender *ps) {
  if (ps->slots)
    return;
  ferry_table_remove(&p->senders, &ps->by_peer);
  free_sender(&ps->by_peer);
}

static void free_pool(ferry_pool *p) {
  ferry_table_clear(&p->ids, free_slot);
  ferry_table_clear(&p->senders, free_sender);
  close(p->efd);
  pthread_cond_destroy(&p->cond);
  free(p);
}

void ferry_pools_destroy(ferry_engine *e) {
  ferry_pools *ps = e->pools;
  if (!ps)
    return;
  while (ps->list) {
    ferry_pool *p = ps->list;
    ps->list = p->next;
    free_pool(p); /* its memory goes with the engine's allocations and registry */
  }
  while (ps->routes) {
    route *r = ps->routes;
    ps->routes = r->next;
    free(r->held);
    free(r);
  }
  free(ps->senders);
  pthread_mutex_destroy(&ps->lock);
  free(ps);
  e->pools = NULL;
}

/* ---- the receiver's slots (pools lock held) --------------------------------- */

static ferry_pool *find_pool(ferry_pools *ps, const char *name, size_t len) {
  for (ferry_pool *p = ps->list; p; p = p->next)
    if (!p->dead && strlen(p->name) == len && !memcmp(p->name, name, len))
      return p;
  return NULL;
}

static slot *find_slot(ferry_pool *p, uint64_t id) {
  ferry_hnode *n = ferry_table_find(&p->ids, id);
  return n ? FERRY_CONTAINER(n, slot, by_id) : NULL;
}

/* The slot holding pool offset `at`, or NULL. */
static slot *slot_at(ferry_pool *p, uint64_t at) {
  ferry_extent *x = ferry_extents_at(&p->extents, at);
  return x ? FERRY_CONTAINER(x, slot, where) : NULL;
}

static pool_sender *sender_in(ferry_pool *p, uint64_t peer) {
  ferry_hnode *n = ferry_table_find(&p->senders, peer);
  return n ? FERRY_CONTAINER(n, pool_sender, by_peer) : NULL;
}

static int granted(const slot *s) { return s->state == SLOT_GRANTED || s->state == SLOT_PENDING; }

static uint64_t grant_bound_ns(const ferry_engine *e) {
  return (uint64_t)e->cfg.pool_grant_timeout_ms * 1000000ull;
}

/* A grant nothing touched for pool_grant_timeout_ms: void from then on.
 * now may be older than the last touch (read before the lock, or before
 * it was let go meanwhile): such a grant is fresh. */
static int expired(const ferry_engine *e, const slot *s, uint64_t now) {
  return granted(s) && !s->writers && now > s->active_ns && now - s->active_ns >= grant_bound_ns(e);
}

/* The bytes one sender may hold granted in p: pool_sender_bytes, or half
 * the pool (at least one slot). */
static uint64_t sender_bytes_most(const ferry_engine *e, const ferry_pool *p) {
  uint64_t most = e->cfg.pool_sender_bytes ? e->cfg.pool_sender_bytes : p->length / 2;
  most = most < p->length ? most : p->length;
  return most > SLOT_ALIGN ? most : SLOT_ALIGN;
}

static uint64_t slot_size(uint64_t length) {
  return (length + SLOT_ALIGN - 1) & ~(uint64_t)(SLOT_ALIGN - 1);
}

/* The sender's record in p, made on its first grant; NULL: no memory. */
static pool_sender *sender_add(ferry_pool *p, uint64_t peer) {
  pool_sender *ps = calloc(1, sizeof *ps);
  if (!ps)
    return NULL;
  ps->by_peer.key = peer;
  ferry_link_init(&ps->grants);
  if (ferry_table_add(&p->senders, &ps->by_peer)) {
    free(ps);
    return NULL;
  }
  return ps;
}

/* First fit: a new slot of length bytes for peer; NULL when no gap fits,
 * or (*over_quota set) when peer holds its share of p already. */
static slot *carve(ferry_engine *e, ferry_pool *p, uint64_t peer, uint64_t length,
                   int *over_quota) {
  uint64_t need = slot_size(length);
  pool_sender *ps = sender_in(p, peer);
  *over_quota = (ps ? ps->bytes : 0) + need > sender_bytes_most(e, p) ||
                (ps && ps->slots >= e->cfg.pool_sender_slots);
  uint64_t at = *over_quota ? FERRY_NO_FIT : ferry_extents_fit(&p->extents, need);
  slot *s = at == FERRY_NO_FIT ? NULL : calloc(1, sizeof *s);
  if (s && !ps && !(ps = sender_add(p, peer))) {
    free(s);
    return NULL;
  }
  if (!s)
    return NULL;
  s->by_id.key = e->pools->next_id++;
  if (ferry_table_add(&p->ids, &s->by_id)) {
    sender_forget_if_idle(p, ps);
    free(s);
    return NULL;
  }
  s->where.offset = at;
  s->where.length = need;
  ferry_extents_insert(&p->extents, &s->where);
  s->peer = peer;
  s->state = SLOT_GRANTED;
  s->active_ns = ferry_now_ns();
  ferry_link_append(&p->idle, &s->by_age);
  ferry_link_append(&ps->grants, &s->by_owner);
  ps->bytes += need;
  ps->slots++;
  p->used += need;
  p->granted += need;
  return s;
}

/* s is no longer a grant (its message landed, or it goes back): its
 * sender's share shrinks. */
static void end_grant(ferry_pool *p, slot *s) {
  pool_sender *ps = sender_in(p, s->peer);
  ferry_link_remove(&s->by_age);
  ferry_link_remove(&s->by_owner);
  ferry_coverage_free(&s->written);
  p->granted -= s->where.length;
  if (ps) {
    ps->bytes -= s->where.length;
    ps->slots--;
    sender_forget_if_idle(p, ps);
  }
}

/* A granted or taken slot goes back to the pool's room. */
static void drop_slot(ferry_pool *p, slot *gone) {
  if (granted(gone))
    end_grant(p, gone);
  ferry_extents_remove(&p->extents, &gone->where);
  ferry_table_remove(&p->ids, &gone->by_id);
  p->used -= gone->where.length;
  free_slot(&gone->by_id);
  pthread_cond_broadcast(&p->cond);
}

/* Something happened in s (a WRITE began or ended, LANDED came): its
 * expiry starts over, at the young end of the idle grants. */
static void touch(ferry_pool *p, slot *s) {
  s->active_ns = ferry_now_ns();
  ferry_link_remove(&s->by_age);
  if (!s->writers)
    ferry_link_append(&p->idle, &s->by_age);
}

/* A name into a field of size bytes (cut to fit): once per message each
 * way, so no snprintf. */
static void copy_name(char *to, size_t size, const char *name) {
  size_t n = strnlen(name, size - 1);
  memcpy(to, name, n);
  to[n] = 0;
}

static void grant_of(ferry_engine *e, ferry_pool *p, const slot *s, ferry_pool_grant *g) {
  *g = (ferry_pool_grant){e->instance_id, s->by_id.key,
                          (uint64_t)(uintptr_t)p->base + s->where.offset, s->where.length};
}

/* The eventfd is readable while messages wait, and each landing (or
 * requeue) adds a count even when it already was: an edge-triggered
 * poller (EPOLLET) sees every arrival, not only the first of a backlog of
 * other tags. Shutdown and destroy add one too, and from then on it stays
 * readable, so a poller wakes to FERRY_ECLOSED. Not ready: the count goes
 * (no message waits). */
static void set_ready(ferry_pool *p, int ready) {
  if (!ready && (p->dead || ferry_engine_closing(p->engine)))
    return;
  uint64_t v = 1;
  ssize_t n = ready ? write(p->efd, &v, sizeof v) : read(p->efd, &v, sizeof v);
  (void)n; /* nonblocking: a count already there, or none to take, is the state we want */
}

/* FNV-1a from a per-pool random basis: a peer cannot aim its tags at one bucket. */
static ferry_link *tag_bucket(ferry_pool *p, const void *tag, size_t len) {
  uint64_t h = p->tag_seed;
  for (size_t i = 0; i < len; i++)
    h = (h ^ ((const uint8_t *)tag)[i]) * 0x100000001b3ull;
  return &p->tags[(h >> 32) % TAG_BUCKETS];
}

/* ---- expiry ------------------------------------------------------------------------- */

static void void_credits(ferry_engine *e, uint64_t peer) {
  for (size_t i = 0; ferry_transports[i]; i++)
    if ((e->transports & ferry_transports[i]->id) && ferry_transports[i]->peer_gone)
      ferry_transports[i]->peer_gone(e, peer);
}

static int listed(const uint64_t *peers, size_t n, uint64_t peer) {
  for (size_t i = 0; i < n; i++)
    if (peers[i] == peer)
      return 1;
  return 0;
}

static slot *oldest_idle(ferry_pool *p) {
  return ferry_link_alone(&p->idle) ? NULL : FERRY_CONTAINER(p->idle.next, slot, by_age);
}

/* When p's oldest idle grant expires (UINT64_MAX: it has none). */
static uint64_t next_expiry(const ferry_engine *e, ferry_pool *p) {
  slot *s = oldest_idle(p);
  return s ? s->active_ns + grant_bound_ns(e) : UINT64_MAX;
}

static int was_expired(const ferry_pool *p, uint64_t id) {
  for (unsigned i = 0; i < EXPIRED_KEPT; i++)
    if (p->expired[i] == id)
      return 1;
  return 0;
}

/* Takes p's expired grants back, oldest first: their senders' credits stop
 * working first (peer_gone, without the lock, which is released meanwhile:
 * the caller pins p with users), then the slots go. Nonzero when some did. */
static int expire_grants(ferry_engine *e, ferry_pool *p) {
  uint64_t peers[EXPIRE_PEERS], now = ferry_now_ns();
  size_t n = 0;
  for (ferry_link *l = p->idle.next; l != &p->idle && n < EXPIRE_PEERS; l = l->next) {
    slot *s = FERRY_CONTAINER(l, slot, by_age);
    if (!expired(e, s, now))
      break;
    if (!listed(peers, n, s->peer))
      peers[n++] = s->peer;
  }
  if (!n)
    return 0;
  pthread_mutex_unlock(&e->pools->lock);
  for (size_t i = 0; i < n; i++)
    void_credits(e, peers[i]);
  pthread_mutex_lock(&e->pools->lock);
  int dropped = 0;
  for (slot *s; (s = oldest_idle(p)) != NULL && expired(e, s, now) && listed(peers, n, s->peer);) {
    p->expired[p->expired_next++ % EXPIRED_KEPT] = s->by_id.key;
    drop_slot(p, s);
    dropped = 1;
  }
  return dropped;
}

/* ---- serving POOL frames ------------------------------------------------------ */

static ferry_status no_room(ferry_engine *e, ferry_pool *p, const ferry_pool_req *r, uint64_t peer,
                            const char *peer_name, int over_quota, uint32_t wait_ms) {
  pool_sender *ps = sender_in(p, peer);
  if (!over_quota || !ps)
    return ferry_fail(FERRY_EBUSY,
                      "pool '%s' of %s is full: %llu bytes asked, %zu of %zu in use, waited %u ms",
                      p->name, e->name, (unsigned long long)r->length, p->used, p->length, wait_ms);
  return ferry_fail(FERRY_EBUSY,
                    "pool '%s' of %s: %s holds %llu bytes in %u grants not landed, and one sender "
                    "may hold at most %llu bytes (pool_sender_bytes) and %u grants "
                    "(pool_sender_slots) of it; %llu bytes asked, waited %u ms",
                    p->name, e->name, peer_name, (unsigned long long)ps->bytes, ps->slots,
                    (unsigned long long)sender_bytes_most(e, p), e->cfg.pool_sender_slots,
                    (unsigned long long)r->length, wait_ms);
}

static ferry_status wait_room(ferry_engine *e, ferry_pool *p, const ferry_pool_req *r,
                              uint64_t peer, const char *peer_name, slot **out) {
  uint32_t wait_ms = r->wait_ms < e->cfg.timeout_ms ? r->wait_ms : e->cfg.timeout_ms;
  uint64_t deadline = ferry_now_ns() + wait_ms * 1000000ull;
  p->users++;
  e->pools->waiting++;
  ferry_status st = FERRY_OK;
  for (int over_quota = 0;;) {
    if (p->dead || ferry_engine_closing(e)) {
      st = ferry_fail(FERRY_ECLOSED, "pool '%s' of %s was destroyed while a sender waited for room",
                      p->name, e->name);
      break;
    }
    if ((*out = carve(e, p, peer, r->length, &over_quota)) != NULL)
      break;
    if (expire_grants(e, p))
      continue;
    if (ferry_now_ns() >= deadline) {
      st = no_room(e, p, r, peer, peer_name, over_quota, wait_ms);
      break;
    }
    uint64_t expiry = next_expiry(e, p);
    struct timespec until = ferry_timespec(expiry < deadline ? expiry : deadline);
    pthread_cond_timedwait(&p->cond, &e->pools->lock, &until);
  }
  e->pools->waiting--;
  if (--p->users == 0 && p->dead)
    pthread_cond_broadcast(&p->cond);
  return st;
}

static ferry_status serve_grant(ferry_engine *e, ferry_pool *p, const ferry_pool_req *r,
                                uint64_t peer, const char *peer_name, ferry_pool_grant *g) {
  /* Given back: only a slot no message of which landed or still moves. */
  slot *stale = r->grant ? find_slot(p, r->grant) : NULL;
  if (stale && stale->peer == peer && !stale->writers && granted(stale))
    drop_slot(p, stale);
  if (!r->length || r->length > p->length)
    return ferry_fail(FERRY_EINVAL,
                      "a message of %llu bytes does not fit pool '%s' of %s (%zu bytes)",
                      (unsigned long long)r->length, p->name, e->name, p->length);
  if (slot_size(r->length) > sender_bytes_most(e, p))
    return ferry_fail(FERRY_EINVAL,
                      "a message of %llu bytes is more than one sender may hold in pool '%s' of "
                      "%s (%llu bytes: pool_sender_bytes, by default half the pool)",
                      (unsigned long long)r->length, p->name, e->name,
                      (unsigned long long)sender_bytes_most(e, p));
  slot *s;
  ferry_status st = wait_room(e, p, r, peer, peer_name, &s);
  if (!st)
    grant_of(e, p, s, g);
  return st;
}

/* The message in s is final: queued for ferry_recv. */
static void queue_slot(ferry_pools *ps, ferry_pool *p, slot *s) {
  end_grant(p, s);
  s->state = SLOT_QUEUED;
  s->seq = ps->next_seq++;
  ferry_link_append(&p->messages, &s->by_age);
  ferry_link_append(tag_bucket(p, s->meta, s->tag_len), &s->by_owner);
  ps->landed++;
  ps->inband += s->inband != 0;
  p->queued++;
  set_ready(p, 1);
  p->landed_unseen = 1; /* wake_receivers */
}

/* Wakes the receivers of the pools where messages landed. Once per batch
 * of posted notices (ferry_pools_landed_wake), else per call: a receiver
 * woken per message of a batch costs a wake and a switch each time, and
 * on two cores it shares one with the thread serving the batch. */
static void wake_receivers(ferry_pools *ps) {
  for (ferry_pool *p = ps->list; p; p = p->next)
    if (p->landed_unseen) {
      p->landed_unseen = 0;
      pthread_cond_broadcast(&p->cond);
    }
}

static int sender_copies(ferry_pools *ps, uint64_t peer);

/* Every byte of s's first length bytes was written under its grant. */
static int covered(const slot *s, uint64_t length) {
  uint64_t end;
  return !s->spans_lost && ferry_coverage_gap(&s->written, length, &end) == length;
}

static ferry_status not_granted(ferry_engine *e, ferry_pool *p, const ferry_pool_req *r,
                                const char *peer_name, int late) {
  if (late)
    return ferry_fail(FERRY_ENOTFOUND,
                      "pool '%s' of %s: the grant of slot %llu to %s expired: no WRITE or LANDED "
                      "into it for %u ms (pool_grant_timeout_ms)",
                      p->name, e->name, (unsigned long long)r->grant, peer_name,
                      e->cfg.pool_grant_timeout_ms);
  return ferry_fail(FERRY_ENOTFOUND,
                    "pool '%s' of %s: slot %llu is not granted to %s for %llu bytes "
                    "(reclaimed, or never given)",
                    p->name, e->name, (unsigned long long)r->grant, peer_name,
                    (unsigned long long)r->length);
}

static ferry_status not_written(ferry_engine *e, ferry_pool *p, const ferry_pool_req *r,
                                const slot *s, const char *peer_name) {
  uint64_t end, gap = ferry_coverage_gap(&s->written, r->length, &end);
  if (s->spans_lost)
    return ferry_fail(FERRY_EINVAL,
                      "pool '%s' of %s: LANDED for slot %llu from %s refused: its WRITEs were "
                      "scattered into more than %d separate spans",
                      p->name, e->name, (unsigned long long)r->grant, peer_name, WRITTEN_SPANS);
  return ferry_fail(FERRY_EINVAL,
                    "pool '%s' of %s: LANDED for slot %llu from %s refused: bytes %llu to %llu "
                    "of its %llu-byte message were never written under this grant",
                    p->name, e->name, (unsigned long long)r->grant, peer_name,
                    (unsigned long long)gap, (unsigned long long)end,
                    (unsigned long long)r->length);
}

/* Tag and sender name, to their size. */
static int keep_meta(slot *s, const ferry_pool_req *r, const char *peer_name) {
  size_t name_len = strnlen(peer_name, FERRY_TAG_MAX);
  uint8_t *meta = malloc(r->tag_len + name_len + 1);
  if (!meta)
    return -1;
  memcpy(meta, r->tag, r->tag_len);
  memcpy(meta + r->tag_len, peer_name, name_len);
  meta[r->tag_len + name_len] = 0;
  free(s->meta);
  s->meta = meta;
  s->tag_len = r->tag_len;
  return 0;
}

/* LANDED: the message is final once every byte of it was written under
 * the grant and no WRITE into the slot still moves bytes. On the control
 * connection the sender had every WRITE acked first, so one still in
 * flight is refused, and so is a message with bytes no WRITE covered
 * (unless its sender copies unseen: shm); in-band, the other frames of the
 * message may still be moving: then the slot waits (PENDING) until its
 * bytes all landed, and takes no bytes past the message's end. */
static ferry_status serve_landed(ferry_engine *e, ferry_pool *p, const ferry_pool_req *r,
                                 uint64_t peer, const char *peer_name, int inband,
                                 ferry_pool_grant *g) {
  slot *s = find_slot(p, r->grant);
  /* A sender that copies unseen (shm) may have copied into an expired
   * grant that is still there: its credits are voided before it goes. */
  int unseen = inband == FERRY_NOTICE_POSTED ||
               (inband == FERRY_NOTICE_CONTROL && sender_copies(e->pools, peer));
  int late = s && s->peer == peer && !unseen && expired(e, s, ferry_now_ns());
  if (!s || s->peer != peer || s->state != SLOT_GRANTED || !r->length ||
      r->length > s->where.length || late)
    return not_granted(e, p, r, peer_name, s ? late : was_expired(p, r->grant));
  int held = inband == FERRY_NOTICE_INBAND; /* its other frames may still be moving */
  int complete = !s->writers && (unseen || covered(s, r->length));
  if (!complete && !held && s->writers)
    return ferry_fail(FERRY_EBUSY,
                      "pool '%s' of %s: LANDED for slot %llu from %s while %u WRITE(s) into it "
                      "are still in flight",
                      p->name, e->name, (unsigned long long)r->grant, peer_name, s->writers);
  if (!complete && !held)
    return not_written(e, p, r, s, peer_name);
  if (keep_meta(s, r, peer_name))
    return ferry_fail(FERRY_ENOMEM, "pool '%s' of %s: no memory for the tag of slot %llu", p->name,
                      e->name, (unsigned long long)r->grant);
  s->landed = r->length;
  s->inband = inband != FERRY_NOTICE_CONTROL;
  if (complete) {
    queue_slot(e->pools, p, s);
  } else {
    s->state = SLOT_PENDING;
    touch(p, s);
  }
  /* Room for the next message and one more: a pre-grant never fills the pool. */
  int over_quota;
  if ((r->flags & FERRY_POOL_NEXT) && p->length - p->used >= 2 * slot_size(r->length)) {
    slot *next = carve(e, p, peer, r->length, &over_quota);
    if (next)
      grant_of(e, p, next, g);
  }
  return FERRY_OK;
}

ferry_status ferry_pools_serve(ferry_engine *e, uint64_t peer, const char *peer_name,
                               const uint8_t *body, size_t len, int inband,
                               uint8_t reply[FERRY_WIRE_POOL_REPLY_SIZE]) {
  ferry_pool_req r;
  ferry_status st = ferry_wire_pool_decode(body, len, &r);
  if (st)
    return st;
  ferry_pool_grant g = {e->instance_id, 0, 0, 0};
  pthread_mutex_lock(&e->pools->lock);
  ferry_pool *p = find_pool(e->pools, r.pool, r.pool_len);
  if (!p)
    st = ferry_fail(FERRY_ENOTFOUND, "no pool '%.*s' at %s", (int)r.pool_len, r.pool, e->name);
  else if (r.op == FERRY_POOL_GRANT && inband == FERRY_NOTICE_POSTED)
    st = ferry_fail(FERRY_EPROTO, "pool '%s' of %s: %s posted a grant request", p->name, e->name,
                    peer_name);
  else if (r.op == FERRY_POOL_GRANT)
    st = serve_grant(e, p, &r, peer, peer_name, &g);
  else
    st = serve_landed(e, p, &r, peer, peer_name, inband, &g);
  if (inband != FERRY_NOTICE_POSTED)
    wake_receivers(e->pools);
  pthread_mutex_unlock(&e->pools->lock);
  ferry_wire_grant_encode(reply, &g);
  return st;
}

void ferry_pools_stats(ferry_engine *e, ferry_stats *out) {
  pthread_mutex_lock(&e->pools->lock);
  out->pool_messages_landed = e->pools->landed;
  out->pool_landed_inband = e->pools->inband;
  out->pool_senders_waiting = e->pools->waiting;
  for (ferry_pool *p = e->pools->list; p; p = p->next)
    out->pool_bytes_granted += p->granted;
  pthread_mutex_unlock(&e->pools->lock);
}

/* The pool holding any byte of [addr, addr+len), or NULL. */
static ferry_pool *pool_touched(ferry_pools *ps, uint64_t addr, uint64_t len) {
  for (ferry_pool *p = ps->list; p; p = p->next) {
    uint64_t base = (uint64_t)(uintptr_t)p->base;
    if (addr + len > base && addr < base + p->length)
      return p;
  }
  return NULL;
}

/* The slot of p that holds all of [addr, addr+len) for peer, or NULL. */
static slot *peer_slot(ferry_pool *p, uint64_t peer, uint64_t addr, uint64_t len) {
  uint64_t at = addr - (uint64_t)(uintptr_t)p->base; /* wraps past any slot when addr < base */
  slot *s = slot_at(p, at);
  return s && s->peer == peer && at + len <= s->where.offset + s->where.length ? s : NULL;
}

/* The slot of p that peer may write [addr, addr+len) into: granted to it,
 * not expired and not landed, or PENDING and inside its message; or NULL. */
static slot *slot_for_write(ferry_engine *e, ferry_pool *p, uint64_t peer, uint64_t addr,
                            uint64_t len, uint64_t now) {
  slot *s = p->dead ? NULL : peer_slot(p, peer, addr, len);
  if (!s || expired(e, s, now))
    return NULL;
  uint64_t end = addr + len - ((uint64_t)(uintptr_t)p->base + s->where.offset);
  return s->state == SLOT_GRANTED || (s->state == SLOT_PENDING && end <= s->landed) ? s : NULL;
}

/* Counts a checked WRITE out of its slots; one that landed whole covers
 * its span of them, which may complete a PENDING message. */
static void count_out(ferry_pools *ps, uint64_t peer, const ferry_region *segs, uint32_t n,
                      int landed) {
  for (uint32_t i = 0; i < n; i++) {
    uint64_t addr = segs[i].addr, len = segs[i].length;
    ferry_pool *p = pool_touched(ps, addr, len);
    slot *s = p ? peer_slot(p, peer, addr, len) : NULL;
    if (!s || !s->writers)
      continue;
    uint64_t from = addr - ((uint64_t)(uintptr_t)p->base + s->where.offset);
    s->writers--;
    if (landed && ferry_coverage_add(&s->written, from, from + len, WRITTEN_SPANS))
      s->spans_lost = 1;
    touch(p, s);
    if (s->state == SLOT_PENDING && !s->writers && covered(s, s->landed))
      queue_slot(ps, p, s);
  }
}

/* Checks each segment and counts it in its slot as it goes; a refused
 * one counts the earlier ones out again. */
ferry_status ferry_pools_check_writes(ferry_engine *e, uint64_t peer, const ferry_region *segs,
                                      uint32_t count, char *reason, size_t size) {
  if (!__atomic_load_n(&e->pools->count, __ATOMIC_ACQUIRE))
    return FERRY_OK;
  ferry_status st = FERRY_OK;
  uint64_t now = ferry_now_ns();
  pthread_mutex_lock(&e->pools->lock);
  for (uint32_t i = 0; i < count && !st; i++) {
    uint64_t addr = segs[i].addr, len = segs[i].length;
    ferry_pool *p = pool_touched(e->pools, addr, len);
    slot *s = p ? slot_for_write(e, p, peer, addr, len, now) : NULL;
    if (s) {
      s->writers++;
      touch(p, s);
    }
    if (!p || s)
      continue;
    st = FERRY_ENOTREG;
    snprintf(reason, size,
             "remote address 0x%llx (+%llu bytes) is in pool '%s' of %s outside every slot "
             "granted to this sender and not landed yet (a grant expires after %u ms without a "
             "WRITE or LANDED)",
             (unsigned long long)addr, (unsigned long long)len, p->name, e->name,
             e->cfg.pool_grant_timeout_ms);
    count_out(e->pools, peer, segs, i, 0);
    wake_receivers(e->pools); /* counting out may have completed a PENDING message */
  }
  pthread_mutex_unlock(&e->pools->lock);
  return st;
}

void ferry_pools_writes_done(ferry_engine *e, uint64_t peer, const ferry_region *segs,
                             uint32_t count, int landed) {
  if (!__atomic_load_n(&e->pools->count, __ATOMIC_ACQUIRE))
    return;
  pthread_mutex_lock(&e->pools->lock);
  count_out(e->pools, peer, segs, count, landed);
  wake_receivers(e->pools);
  pthread_mutex_unlock(&e->pools->lock);
}

void ferry_pools_landed_wake(ferry_engine *e) {
  pthread_mutex_lock(&e->pools->lock);
  wake_receivers(e->pools);
  pthread_mutex_unlock(&e->pools->lock);
}

static sender_conns *sender_find(ferry_pools *ps, uint64_t peer) {
  for (size_t i = 0; i < ps->nsenders; i++)
    if (ps->senders[i].peer == peer)
      return &ps->senders[i];
  return NULL;
}

static int sender_copies(ferry_pools *ps, uint64_t peer) {
  sender_conns *s = sender_find(ps, peer);
  return s && s->copies;
}

void ferry_pools_peer_joined(ferry_engine *e, uint64_t peer) {
  ferry_pools *ps = e->pools;
  pthread_mutex_lock(&ps->lock);
  sender_conns *s = sender_find(ps, peer);
  if (!s && ps->nsenders == ps->senders_cap) {
    size_t cap = ps->senders_cap ? 2 * ps->senders_cap : 16;
    sender_conns *grown = realloc(ps->senders, cap * sizeof *grown);
    if (grown)
      ps->senders = grown, ps->senders_cap = cap;
  }
  if (!s && ps->nsenders < ps->senders_cap) /* else uncounted: its first end reclaims */
    s = &ps->senders[ps->nsenders++], *s = (sender_conns){peer, 0, 0};
  if (s)
    s->count++;
  pthread_mutex_unlock(&ps->lock);
}

void ferry_pools_peer_copies(ferry_engine *e, uint64_t peer) {
  pthread_mutex_lock(&e->pools->lock);
  sender_conns *s = sender_find(e->pools, peer);
  if (s)
    s->copies = 1;
  pthread_mutex_unlock(&e->pools->lock);
}

/* One connection of peer fewer; nonzero when it held none any more. */
static int sender_left(ferry_pools *ps, uint64_t peer) {
  pthread_mutex_lock(&ps->lock);
  sender_conns *s = sender_find(ps, peer);
  int none = !s || !--s->count;
  if (s && none)
    *s = ps->senders[--ps->nsenders];
  pthread_mutex_unlock(&ps->lock);
  return none;
}

void ferry_pools_peer_left(ferry_engine *e, uint64_t peer) {
  if (!sender_left(e->pools, peer))
    return;
  void_credits(e, peer); /* their credits stop working first */
  pthread_mutex_lock(&e->pools->lock);
  /* A connection that came meanwhile may already hold fresh grants: they stay. */
  ferry_pool *first = sender_find(e->pools, peer) ? NULL : e->pools->list;
  for (ferry_pool *p = first; p; p = p->next) {
    pool_sender *ps = sender_in(p, peer);
    for (unsigned left = ps ? ps->slots : 0; left; left--) /* the last drop frees ps */
      drop_slot(p, FERRY_CONTAINER(ps->grants.next, slot, by_owner));
  }
  pthread_mutex_unlock(&e->pools->lock);
}

/* ---- the receiver's calls ------------------------------------------------------ */

static ferry_pool *pool_new(ferry_engine *e, const char *name, size_t length) {
  ferry_pool *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->efd < 0) {
    free(p);
    return NULL;
  }
  ferry_cond_init(&p->cond);
  p->engine = e;
  p->length = length;
  snprintf(p->name, sizeof p->name, "%s", name);
  ferry_extents_init(&p->extents, length, ferry_random_u64());
  ferry_link_init(&p->idle);
  ferry_link_init(&p->messages);
  for (size_t i = 0; i < TAG_BUCKETS; i++)
    ferry_link_init(&p->tags[i]);
  p->tag_seed = ferry_random_u64();
  return p;
}

static ferry_status pool_create(ferry_engine *e, const char *name, void *addr, size_t length,
                                ferry_pool **out) {
  size_t name_len = name ? strlen(name) : 0;
  if (!e || !out || !name_len || name_len > FERRY_WIRE_MAX_NAME - 1 || !length)
    return ferry_fail(FERRY_EINVAL, "pool create: needs a name of 1..%d bytes, a length and out",
                      FERRY_WIRE_MAX_NAME - 1);
  ferry_pool *p = pool_new(e, name, length);
  if (!p)
    return ferry_fail_errno(FERRY_ENOMEM, errno, "no memory for pool '%s'", name);
  p->allocated = !addr;
  ferry_status st = ferry_engine_pool_memory(e, length, &addr);
  if (st) {
    free_pool(p);
    return st;
  }
  p->base = addr;
  pthread_mutex_lock(&e->pools->lock);
  if (find_pool(e->pools, name, name_len)) {
    pthread_mutex_unlock(&e->pools->lock);
    p->allocated ? ferry_memory_free(e, addr) : ferry_memory_unregister(e, addr);
    free_pool(p);
    return ferry_fail(FERRY_EINVAL, "pool '%s' already exists at %s", name, e->name);
  }
  p->next = e->pools->list;
  e->pools->list = p;
  __atomic_add_fetch(&e->pools->count, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&e->pools->lock);
  *out = p;
  return FERRY_OK;
}

static ferry_status pool_destroy(ferry_engine *e, ferry_pool *p) {
  if (!e || !p)
    return ferry_fail(FERRY_EINVAL, "pool destroy: null engine or pool");
  pthread_mutex_lock(&e->pools->lock);
  p->dead = 1; /* from here every WRITE into it is refused and no grant is given */
  pthread_cond_broadcast(&p->cond);
  set_ready(p, 1); /* a poller holding a dup of the fd learns it */
  while (p->users)
    pthread_cond_wait(&p->cond, &e->pools->lock);
  pthread_mutex_unlock(&e->pools->lock);
  /* The unregister fence: no WRITE checked before dead was set still moves bytes. */
  p->allocated ? ferry_memory_free(e, p->base) : ferry_memory_unregister(e, p->base);
  pthread_mutex_lock(&e->pools->lock);
  for (ferry_pool **pp = &e->pools->list; *pp; pp = &(*pp)->next) {
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  }
  __atomic_sub_fetch(&e->pools->count, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&e->pools->lock);
  free_pool(p);
  return FERRY_OK;
}

/* The earliest landed message with tag (NULL: any), or NULL. */
static slot *earliest(ferry_pool *p, const void *tag, size_t tag_len) {
  if (!tag)
    return ferry_link_alone(&p->messages) ? NULL : FERRY_CONTAINER(p->messages.next, slot, by_age);
  ferry_link *bucket = tag_bucket(p, tag, tag_len);
  for (ferry_link *l = bucket->next; l != bucket; l = l->next) {
    slot *s = FERRY_CONTAINER(l, slot, by_owner);
    if (s->tag_len == tag_len && !memcmp(s->meta, tag, tag_len))
      return s;
  }
  return NULL;
}

static void take(ferry_pool *p, slot *s, ferry_message *out) {
  s->state = SLOT_TAKEN;
  ferry_link_remove(&s->by_age);
  ferry_link_remove(&s->by_owner);
  if (--p->queued == 0)
    set_ready(p, 0);
  out->slot = s->by_id.key;
  out->addr = p->base + s->where.offset;
  out->length = (size_t)s->landed;
  memcpy(out->tag, s->meta, s->tag_len);
  out->tag_len = s->tag_len;
  copy_name(out->sender, sizeof out->sender, (const char *)s->meta + s->tag_len);
}

static ferry_status no_message(ferry_engine *e, ferry_pool *p, const void *tag, size_t tag_len,
                               int64_t timeout_ms) {
  if (p->dead || ferry_engine_closing(e))
    return ferry_fail(FERRY_ECLOSED, "recv on pool '%s' of %s: the pool is being destroyed",
                      p->name, e->name);
  if (!tag)
    return ferry_fail(FERRY_ETIMEDOUT, "recv on pool '%s' of %s: no message within %lld ms",
                      p->name, e->name, (long long)timeout_ms);
  return ferry_fail(FERRY_ETIMEDOUT,
                    "recv on pool '%s' of %s: no message tagged '%.*s' within %lld ms", p->name,
                    e->name, (int)tag_len, (const char *)tag, (long long)timeout_ms);
}

static ferry_status recv_message(ferry_engine *e, ferry_pool *p, const void *tag, size_t tag_len,
                                 int64_t timeout_ms, ferry_message *out) {
  if (!e || !p || !out || (tag && (!tag_len || tag_len > FERRY_TAG_MAX)))
    return ferry_fail(FERRY_EINVAL,
                      "recv: needs an engine, a pool, out, and a tag of 1..%d bytes or NULL",
                      FERRY_TAG_MAX);
  uint64_t deadline = ferry_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
  ferry_status st = FERRY_OK;
  pthread_mutex_lock(&e->pools->lock);
  p->users++;
  slot *s;
  while (!(s = earliest(p, tag, tag_len))) {
    if (p->dead || ferry_engine_closing(e) || timeout_ms == 0 ||
        (timeout_ms > 0 && ferry_now_ns() >= deadline)) {
      st = no_message(e, p, tag, tag_len, timeout_ms);
      break;
    }
    struct timespec until = ferry_timespec(deadline);
    if (timeout_ms < 0)
      pthread_cond_wait(&p->cond, &e->pools->lock);
    else
      pthread_cond_timedwait(&p->cond, &e->pools->lock, &until);
  }
  if (s)
    take(p, s, out);
  if (--p->users == 0 && p->dead)
    pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&e->pools->lock);
  return st;
}

/* l (a slot's by_age or by_owner link, off its list) back into head's
 * list before the first message that landed after it: a requeued message
 * is normally the earliest, so the walk is short. */
static void relink_in_landing_order(ferry_link *head, ferry_link *l, size_t member, uint64_t seq) {
  ferry_link *at = head->next;
  while (at != head && ((const slot *)(void *)((char *)at - member))->seq < seq)
    at = at->next;
  l->prev = at->prev;
  l->next = at;
  at->prev->next = l;
  at->prev = l;
}

/* A received slot leaves the receiver: released (its space can be granted
 * again), or requeued (ferry_pool_requeue: it waits again under its
 * landing order, seq kept, for receivers and the fd's pollers alike). */
static ferry_status hand_back(ferry_engine *e, ferry_pool *p, uint64_t id, int requeue) {
  const char *call = requeue ? "requeue" : "release";
  if (!e || !p)
    return ferry_fail(FERRY_EINVAL, "pool %s: null engine or pool", call);
  pthread_mutex_lock(&e->pools->lock);
  slot *s = find_slot(p, id);
  int taken = s && s->state == SLOT_TAKEN;
  if (taken && requeue) {
    s->state = SLOT_QUEUED;
    relink_in_landing_order(&p->messages, &s->by_age, offsetof(slot, by_age), s->seq);
    relink_in_landing_order(tag_bucket(p, s->meta, s->tag_len), &s->by_owner,
                            offsetof(slot, by_owner), s->seq);
    p->queued++;
    set_ready(p, 1);
    pthread_cond_broadcast(&p->cond);
  } else if (taken) {
    drop_slot(p, s);
  }
  pthread_mutex_unlock(&e->pools->lock);
  return taken ? FERRY_OK
               : ferry_fail(FERRY_ENOTFOUND, "pool '%s' of %s: slot %llu is not a received message",
                            p->name, e->name, (unsigned long long)id);
}

/* ---- the sender ------------------------------------------------------------------ */

/* The pre-grants of target's pool, made on first use; NULL: no memory. */
static route *route_locked(ferry_pools *ps, const char *target, const char *pool) {
  route *r = ps->routes;
  while (r && (strcmp(r->target, target) || strcmp(r->pool, pool)))
    r = r->next;
  if (!r && (r = calloc(1, sizeof *r))) {
    snprintf(r->target, sizeof r->target, "%s", target);
    snprintf(r->pool, sizeof r->pool, "%s", pool);
    r->next = ps->routes;
    ps->routes = r;
  }
  return r;
}

static route *route_of(ferry_pools *ps, const char *target, const char *pool) {
  pthread_mutex_lock(&ps->lock);
  route *r = route_locked(ps, target, pool);
  pthread_mutex_unlock(&ps->lock);
  return r;
}

static unsigned held_locked(const route *r) {
  unsigned n = 0;
  for (size_t i = 0; i < r->count; i++)
    n += !r->held[i].given_up;
  return n;
}

static int pregrant_fits(const pregrant *g, size_t length, uint64_t instance, uint64_t now) {
  return g->grant.instance == instance && !g->given_up && now - g->got_ns < PREGRANT_FRESH_NS &&
         g->grant.length >= length;
}

/* A fresh pre-grant of at least length bytes from this target incarnation,
 * taken out of the cache: the newest, whose slot the receiver freed last
 * (its memory the warmest). One that does not fit (too small, or older
 * than PREGRANT_FRESH_NS) goes to *stale, to be given back by the grant
 * request (0: none), so pre-grants of other sizes do not hold the pool's
 * room; other incarnations' entries are void and dropped. *left: the
 * pre-grants still held after it. */
static int take_pregrant(ferry_pools *ps, route *r, size_t length, uint64_t instance,
                         ferry_pool_grant *out, uint64_t *stale, unsigned *left) {
  uint64_t now = ferry_now_ns();
  size_t kept = 0, take = SIZE_MAX;
  *stale = 0;
  pthread_mutex_lock(&ps->lock);
  for (size_t i = r->count; i-- > 0 && take == SIZE_MAX;)
    if (pregrant_fits(&r->held[i], length, instance, now))
      take = i;
  for (size_t i = 0; i < r->count; i++) {
    pregrant *g = &r->held[i];
    int ours = g->grant.instance == instance;
    if (i == take)
      *out = g->grant;
    else if (ours && !*stale && !pregrant_fits(g, length, instance, now))
      *stale = g->grant.id;
    else if (ours)
      r->held[kept++] = *g;
  }
  r->count = kept;
  *left = held_locked(r);
  pthread_mutex_unlock(&ps->lock);
  return take != SIZE_MAX;
}

/* Caches a pre-grant for the next send to r's pool, granted at got_ns;
 * given_up: a slot only to be given back by the next grant request. */
static void keep_grant_locked(route *r, const ferry_pool_grant *grant, int given_up,
                              uint64_t got_ns, uint64_t epoch) {
  if (r->count == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : CREDITS_MAX;
    pregrant *held = realloc(r->held, cap * sizeof *held);
    if (held)
      r->held = held, r->cap = cap;
  }
  if (r->count < r->cap) /* else the slot idles until this engine's connections end */
    r->held[r->count++] =
        (pregrant){.grant = *grant, .got_ns = got_ns, .epoch = epoch, .given_up = given_up};
}

static void keep_pregrant(ferry_pools *ps, route *r, const ferry_pool_grant *grant, int given_up,
                          uint64_t epoch) {
  uint64_t now = ferry_now_ns();
  pthread_mutex_lock(&ps->lock);
  keep_grant_locked(r, grant, given_up, now, epoch);
  pthread_mutex_unlock(&ps->lock);
}

/* The transport's credits moved to another epoch: pre-grants of this
 * target cached under an earlier one may name slots the target took back
 * (or gave to another sender); they are only to be given back. */
static void void_pregrants_locked(ferry_pools *ps, const char *target, uint64_t epoch) {
  for (route *r = ps->routes; r; r = r->next) {
    if (strcmp(r->target, target))
      continue;
    for (size_t i = 0; i < r->count; i++)
      if (r->held[i].epoch != epoch)
        r->held[i].given_up = 1;
  }
}

/* Pre-grants cached for sends to r's pool. */
static unsigned pregrants_held(ferry_pools *ps, const route *r) {
  pthread_mutex_lock(&ps->lock);
  unsigned n = held_locked(r);
  pthread_mutex_unlock(&ps->lock);
  return n;
}

/* Credits a sender keeps per pool for messages of length bytes. */
static unsigned credits_most(size_t length) {
  uint64_t n = CREDIT_BYTES / length;
  return n < CREDITS_MIN ? CREDITS_MIN : n > CREDITS_MAX ? CREDITS_MAX : (unsigned)n;
}

/* How a sender holding no credit for r's pool waits for those its posted
 * notices asked for: asleep until they come while as many go round as it
 * keeps (most); otherwise briefly, and the control grant that follows
 * puts one more into the round (a notice only asks to be replaced). */
static int credit_wait(ferry_pools *ps, const route *r, unsigned most) {
  pthread_mutex_lock(&ps->lock);
  unsigned asked = r->asked, held = held_locked(r);
  pthread_mutex_unlock(&ps->lock);
  return held            ? FERRY_CREDITS_NOW
         : asked >= most ? FERRY_CREDITS_COMING
         : asked         ? FERRY_CREDITS_BRIEFLY
                         : FERRY_CREDITS_NOW;
}

/* A credit came for r's pool, or (none) a wait for them found none. */
static void credits_answered_locked(route *r, int none) {
  r->asked = none || !r->asked ? 0 : r->asked - 1;
}

/* A posted notice asked for a credit for r's pool. */
static void asked_more(ferry_pools *ps, route *r) {
  pthread_mutex_lock(&ps->lock);
  r->asked++;
  pthread_mutex_unlock(&ps->lock);
}

/* Caches the credits the target's transport handed back (the grants of
 * posted LANDED notices), fresh from when the target granted them; with
 * none held for r's pool, the transport may wait for those coming
 * (credit_wait). A credit for another pool of the target goes to its
 * route. */
static uint64_t collect_credits(ferry_engine *e, route *r, size_t length, const ferry_transport *t,
                                ferry_peer *peer, uint64_t instance) {
  ferry_credit got[CREDITS_PER_TAKE];
  uint64_t epoch = 0;
  if (!t->take_credits)
    return 0;
  int wait = credit_wait(e->pools, r, credits_most(length));
  size_t n = t->take_credits(peer, instance, got, CREDITS_PER_TAKE, wait, &epoch);
  /* One critical section for them all: every sender thread, the receiver
   * and the serving threads share the lock. */
  pthread_mutex_lock(&e->pools->lock);
  void_pregrants_locked(e->pools, r->target, epoch); /* epoch 0: their link is gone */
  if (wait && !n)
    credits_answered_locked(r, 1);
  for (size_t i = 0; i < n; i++) {
    route *to = strcmp(got[i].pool, r->pool) ? route_locked(e->pools, r->target, got[i].pool) : r;
    if (!to)
      continue;
    keep_grant_locked(to, &got[i].grant, 0, got[i].issued_ns, epoch);
    credits_answered_locked(to, 0);
  }
  pthread_mutex_unlock(&e->pools->lock);
  return epoch;
}

static ferry_status pool_call(ferry_peer *peer, const ferry_pool_req *r, uint64_t deadline,
                              ferry_pool_grant *g) {
  uint8_t body[FERRY_WIRE_POOL_MAX], reply[FERRY_WIRE_POOL_REPLY_SIZE];
  size_t len = ferry_wire_pool_encode(body, r);
  ferry_status st = ferry_peer_pool(peer, body, len, reply, deadline);
  if (!st)
    ferry_wire_grant_decode(reply, g);
  return st;
}

typedef struct send_args {
  ferry_engine *e;
  const char *target, *pool;
  const void *tag;
  size_t tag_len;
  void *local;
  size_t length;
  uint32_t wait_ms;
} send_args;

/* A grant, waiting for room up to wait_ms in turns of GRANT_WAIT_TURN_MS:
 * the receiver holds each request while the pool is full, and the control
 * connection it holds is the one this engine's other sends to that target
 * need for their LANDED notices (which may be what frees the room). */
static ferry_status request_grant(const send_args *a, ferry_peer *peer, uint64_t stale,
                                  ferry_pool_grant *g) {
  uint64_t start = ferry_now_ns(), until = start + a->wait_ms * 1000000ull;
  ferry_pool_req r = {.op = FERRY_POOL_GRANT,
                      .grant = stale,
                      .length = a->length,
                      .pool = a->pool,
                      .pool_len = strlen(a->pool)};
  for (;;) {
    uint64_t now = ferry_now_ns(), left_ms = now < until ? (until - now) / 1000000 : 0;
    r.wait_ms = left_ms < GRANT_WAIT_TURN_MS ? (uint32_t)left_ms : GRANT_WAIT_TURN_MS;
    uint64_t deadline = now + (r.wait_ms + (uint64_t)a->e->cfg.connect_timeout_ms) * 1000000ull;
    ferry_status st = pool_call(peer, &r, deadline, g);
    if (st == FERRY_EBUSY && ferry_now_ns() >= until && a->wait_ms > GRANT_WAIT_TURN_MS) {
      char detail[FERRY_ERROR_MAX];
      snprintf(detail, sizeof detail, "%s", ferry_last_error());
      return ferry_fail(FERRY_EBUSY, "%s (the send waited %u ms in all)", detail, a->wait_ms);
    }
    if (st != FERRY_EBUSY || ferry_now_ns() >= until)
      return st;
    r.grant = 0; /* given back by the first turn */
  }
}

/* One message on its way: its grant and the WRITE batch carrying its
 * LANDED notice as the after-landed message (batch.h): a transport that
 * carries it in-band costs one round trip for both, one that posts it
 * none; the others send it on the control connection once the data is
 * acknowledged. */
typedef struct outgoing {
  const send_args *a;
  ferry_peer *peer;
  uint64_t deadline; /* for the control calls of the send */
  route *route;      /* the pre-grants of a->target's a->pool */
  ferry_pool_grant grant;
  uint64_t epoch; /* the transport's credit epoch when it was prepared */
  int cached;     /* the grant was a pre-grant */
  int asks;       /* its LANDED notice asks for a pre-grant */
  int restarted;  /* the grant came from a newer incarnation than the one checked */
  ferry_entry entry;
  ferry_after after;
  ferry_batch *batch; /* sent asynchronously (ferry_send_batch) */
} outgoing;

/* The grant (a cached pre-grant when use_cache) and the LANDED notice. */
static ferry_status prepare(outgoing *o, const send_args *a, int use_cache) {
  ferry_engine *e = a->e;
  const struct ferry_transport *transport;
  uint64_t instance, stale = 0;
  *o = (outgoing){.a = a, .deadline = ferry_now_ns() + e->cfg.connect_timeout_ms * 1000000ull};
  ferry_status st = ferry_peer_get(e, a->target, &o->peer);
  if (!st)
    st = ferry_peer_ensure(o->peer, o->deadline, &transport, &instance);
  if (st)
    return st;
  if (!(o->route = route_of(e->pools, a->target, a->pool)))
    return ferry_fail(FERRY_ENOMEM, "send to pool '%s' of %s: no memory for its pre-grants",
                      a->pool, a->target);
  if (use_cache)
    o->epoch = collect_credits(e, o->route, a->length, transport, o->peer, instance);
  unsigned held = 0;
  o->cached =
      use_cache && take_pregrant(e->pools, o->route, a->length, instance, &o->grant, &stale, &held);
  if (!o->cached)
    st = request_grant(a, o->peer, stale, &o->grant);
  else if (stale) /* no grant request to carry it back this time: the next one will */
    keep_pregrant(e->pools, o->route, &(ferry_pool_grant){instance, stale, 0, 0}, 1, o->epoch);
  if (!st && o->grant.instance != instance) {
    /* The grant is the new incarnation's: given back by the next request. */
    keep_pregrant(e->pools, o->route, &o->grant, 1, o->epoch);
    o->restarted = 1;
    st = ferry_fail(FERRY_ESOCKET, "send to pool '%s' of %s: the target restarted during the send",
                    a->pool, a->target);
  }
  if (st)
    return st;
  unsigned most = transport->take_credits ? credits_most(a->length) : PREGRANTS_PER_POOL;
  o->asks = (o->cached ? held : pregrants_held(e->pools, o->route)) < most;
  ferry_pool_req r = {.op = FERRY_POOL_LANDED,
                      .flags = o->asks ? FERRY_POOL_NEXT : 0,
                      .grant = o->grant.id,
                      .length = a->length,
                      .pool = a->pool,
                      .pool_len = strlen(a->pool),
                      .tag = a->tag,
                      .tag_len = a->tag_len};
  o->after.len = ferry_wire_pool_encode(o->after.body, &r);
  o->entry = (ferry_entry){FERRY_OP_WRITE, a->local, o->grant.addr, a->length};
  return FERRY_OK;
}

/* A broken connection leaves unknown whether the target served LANDED:
 * only a target that restarted since the grant surely has no message.
 * The send's own error is what the caller sees, whatever the check met. */
static int target_restarted(const outgoing *o) {
  const struct ferry_transport *transport;
  uint64_t now_instance;
  char detail[FERRY_ERROR_MAX];
  snprintf(detail, sizeof detail, "%s", ferry_last_error());
  int restarted = !ferry_peer_ensure(o->peer, o->deadline, &transport, &now_instance) &&
                  now_instance != o->grant.instance;
  ferry_error_set_detail(detail);
  return restarted;
}

/* The outcome of the WRITE: the pre-grant its ack brought is kept; a
 * failed one's grant is not reused (LANDED may have been served with it)
 * but given back by the next grant request, which the receiver honours
 * only for a slot whose message did not land. *retry says
 * whether nothing was delivered and a try with a fresh grant may succeed:
 * a pre-grant the target voided, or a target that restarted. */
static ferry_status landed(const outgoing *o, ferry_status st, int *retry) {
  *retry =
      st && ((st == FERRY_ENOTREG && o->cached) || (st == FERRY_ESOCKET && target_restarted(o)));
  ferry_pool_grant pre;
  if (st && o->grant.id)
    keep_pregrant(o->a->e->pools, o->route, &o->grant, 1, o->epoch);
  if (!st && o->after.posted && o->asks)
    asked_more(o->a->e->pools, o->route);
  if (!st) {
    ferry_wire_grant_decode(o->after.reply, &pre);
    if (pre.id)
      keep_pregrant(o->a->e->pools, o->route, &pre, 0, o->epoch);
  }
  return st;
}

static ferry_status send_try(const send_args *a, int use_cache, int *retry) {
  outgoing o;
  *retry = 0;
  ferry_status st = prepare(&o, a, use_cache);
  if (st)
    *retry = o.restarted; /* nothing was written: the new incarnation may take it */
  else
    st = landed(&o, ferry_batch_run(a->e, a->target, &o.entry, 1, &o.after), retry);
  return st;
}

static ferry_status send_one(const send_args *a) {
  int retry;
  ferry_status st = send_try(a, 1, &retry);
  return retry ? send_try(a, 0, &retry) : st;
}

static ferry_status check_send(ferry_engine *e, const char *target, const char *pool,
                               const void *tag, size_t tag_len, const void *local, size_t length) {
  size_t pool_len = pool ? strlen(pool) : 0;
  if (!e || !target || !local || !length)
    return ferry_fail(FERRY_EINVAL, "send: needs an engine, a target and local bytes");
  if (!pool_len || pool_len >= FERRY_WIRE_MAX_NAME || !tag || !tag_len || tag_len > FERRY_TAG_MAX)
    return ferry_fail(FERRY_EINVAL, "send to %s: pool name of 1..%d bytes and tag of 1..%d bytes",
                      target, FERRY_WIRE_MAX_NAME - 1, FERRY_TAG_MAX);
  return FERRY_OK;
}

static send_args args_for(ferry_engine *e, const char *target, const char *pool, int64_t timeout_ms,
                          unsigned flags) {
  uint32_t wait = timeout_ms < 0            ? e->cfg.timeout_ms
                  : timeout_ms > UINT32_MAX ? UINT32_MAX
                                            : (uint32_t)timeout_ms;
  return (send_args){
      .e = e, .target = target, .pool = pool, .wait_ms = flags & FERRY_SEND_NOWAIT ? 0 : wait};
}

static ferry_status send_message(ferry_engine *e, const char *target, const char *pool,
                                 const void *tag, size_t tag_len, void *local, size_t length,
                                 int64_t timeout_ms, unsigned flags) {
  ferry_status st = check_send(e, target, pool, tag, tag_len, local, length);
  if (st)
    return st;
  send_args a = args_for(e, target, pool, timeout_ms, flags);
  a.tag = tag, a.tag_len = tag_len, a.local = local, a.length = length;
  return send_one(&a);
}

static void note_failure(ferry_status st, size_t i, ferry_status *first, char *detail,
                         size_t size) {
  if (st && !*first) {
    *first = st;
    snprintf(detail, size, "message %zu: %s", i, ferry_last_error());
  }
}

static void start_sends(ferry_engine *e, const char *target, ferry_send_item *items, outgoing *out,
                        size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    if (!items[i].status)
      items[i].status =
          ferry_batch_start(e, target, &out[i].entry, 1, &out[i].after, &out[i].batch);
}

/* Grants first (most ride on pre-grants or cost a grant round trip each)
 * without waiting for room; the WRITEs go in flight together
 * (ferry_batch_start, driven by the workers) once all are granted, or as
 * soon as one message must wait for room, which only a landed and
 * released message can free. Each is waited for in turn, and one that may
 * be retried goes again alone with a fresh grant. */
static ferry_status send_batch(ferry_engine *e, const char *target, const char *pool,
                               ferry_send_item *items, size_t count, int64_t timeout_ms,
                               unsigned flags) {
  if (!items && count)
    return ferry_fail(FERRY_EINVAL, "send batch: null items");
  send_args *args = calloc(count ? count : 1, sizeof *args);
  outgoing *out = calloc(count ? count : 1, sizeof *out);
  if (!args || !out) {
    free(args);
    free(out);
    return ferry_fail(FERRY_ENOMEM, "no memory for a batch of %zu sends", count);
  }
  ferry_status first = FERRY_OK;
  char detail[FERRY_ERROR_MAX] = "";
  size_t started = 0;
  for (size_t i = 0; i < count; i++) {
    ferry_send_item *it = &items[i];
    args[i] = args_for(e, target, pool, timeout_ms, flags | FERRY_SEND_NOWAIT);
    args[i].tag = it->tag, args[i].tag_len = it->tag_len;
    args[i].local = it->local, args[i].length = it->length;
    it->status = check_send(e, target, pool, it->tag, it->tag_len, it->local, it->length);
    if (!it->status)
      it->status = prepare(&out[i], &args[i], 1);
    args[i].wait_ms = args_for(e, target, pool, timeout_ms, flags).wait_ms;
    if (it->status == FERRY_EBUSY && args[i].wait_ms) {
      start_sends(e, target, items, out, started, i);
      started = i;
      it->status = prepare(&out[i], &args[i], 1);
    }
  }
  start_sends(e, target, items, out, started, count);
  for (size_t i = 0; i < count; i++) {
    int retry = 0;
    if (out[i].batch) {
      ferry_status st = ferry_batch_wait(out[i].batch, -1);
      ferry_batch_release(out[i].batch);
      items[i].status = landed(&out[i], st, &retry);
    }
    if (retry)
      items[i].status = send_try(&args[i], 0, &retry);
    note_failure(items[i].status, i, &first, detail, sizeof detail);
  }
  free(args);
  free(out);
  if (first)
    ferry_error_set_detail(detail);
  return first;
}

/* ---- public calls ---------------------------------------------------------------- */

ferry_status ferry_pool_create(ferry_engine *e, const char *name, void *addr, size_t length,
                               ferry_pool **out) {
  FERRY_GATED(e, pool_create(e, name, addr, length, out));
}

ferry_status ferry_pool_destroy(ferry_engine *e, ferry_pool *pool) {
  FERRY_GATED(e, pool_destroy(e, pool));
}

ferry_status ferry_recv(ferry_engine *e, ferry_pool *pool, const void *tag, size_t tag_len,
                        int64_t timeout_ms, ferry_message *out) {
  FERRY_GATED(e, recv_message(e, pool, tag, tag_len, timeout_ms, out));
}

ferry_status ferry_pool_release(ferry_engine *e, ferry_pool *pool, uint64_t slot) {
  FERRY_GATED(e, hand_back(e, pool, slot, 0));
}

ferry_status ferry_pool_requeue(ferry_engine *e, ferry_pool *pool, uint64_t slot) {
  FERRY_GATED(e, hand_back(e, pool, slot, 1));
}

int ferry_pool_fd(const ferry_pool *pool) { return pool ? pool->efd : -1; }

ferry_status ferry_send(ferry_engine *e, const char *target, const char *pool, const void *tag,
                        size_t tag_len, void *local, size_t length, int64_t timeout_ms,
                        unsigned flags) {
  FERRY_GATED(e, send_message(e, target, pool, tag, tag_len, local, length, timeout_ms, flags));
}

ferry_status ferry_send_batch(ferry_engine *e, const char *target, const char *pool,
                              ferry_send_item *items, size_t count, int64_t timeout_ms,
                              unsigned flags) {
  FERRY_GATED(e, send_batch(e, target, pool, items, count, timeout_ms, flags));
}
