/* ha.c - the store master's high availability (ha.h): a thread that
 * campaigns for the leader key while this master stands by and keeps the
 * lease alive while it leads, moving the master's fence (master.h) to what
 * etcd granted. A leader that loses the lease stops serving at once (the
 * fence) and starts over as a standby with an empty master on the same
 * port: its map belonged to a term that is over. */
#include "store/ha.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "metadata/election.h"
#include "metadata/metadata.h"
#include "store/map.h"

/* A standby watches the leader key (etcd watch) and campaigns when it
 * changes; at most STANDBY_WATCH_MS apart it reads the key anyway (a
 * watch's end bounds how long stopping a standby waits). While watching
 * fails (etcd down), it reads every STANDBY_POLL_MS instead. */
#define STANDBY_WATCH_MS 1000
#define STANDBY_POLL_MS 200

struct store_ha {
  store_master_config cfg; /* the port fixed once the first master listens */
  store_master *master;
  ferry_election *election;
  char address[300];
  char key[300];
  char prefix[300];       /* mooncake-store/<cluster>/: the journal's keys under it */
  uint64_t orphans_until; /* when the restored segments nobody adopted go (0: none) */
  uint64_t orphan_next;   /* the last orphan id drawn */
  int journal_failing;    /* the journal's last write failed (logged once) */
  uint32_t ttl_s;
  uint64_t margin_ns; /* the fence ends this much before etcd's lease may */
  int leading;
  int reported; /* the role last logged: 1 standby, 2 etcd unreachable (the thread's) */
  int watching; /* the standby's last watch worked (the thread's) */
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int stopping, started;
};

/* mooncake-store/<cluster>/<leaf>: the cluster from the flag, else
 * MC_STORE_CLUSTER_ID, else Mooncake's default. */
static void cluster_key(const char *cluster, const char *leaf, char *key, size_t size) {
  if (!cluster || !*cluster)
    cluster = getenv("MC_STORE_CLUSTER_ID");
  snprintf(key, size, "mooncake-store/%s/%s", cluster && *cluster ? cluster : "mooncake_cluster",
           leaf);
}

static void leader_key(const char *cluster, char *key, size_t size) {
  cluster_key(cluster, "master_view", key, size);
}

/* ---- the journal: the leader's map in etcd ----------------------------------------------------
 */

/* prefix + kind + hex(name): a key or a segment name may hold any byte. */
static char *journal_key(store_ha *h, const char *kind, const char *name, size_t len) {
  size_t n = strlen(h->prefix) + strlen(kind);
  char *key = malloc(n + 2 * len + 1);
  if (!key)
    return NULL;
  n = (size_t)sprintf(key, "%s%s", h->prefix, kind);
  for (size_t i = 0; i < len; i++)
    n += (size_t)sprintf(key + n, "%02x", (uint8_t)name[i]);
  return key;
}

/* Decodes hex in place; its length, or -1 when not hex. */
static long unhex(char *text) {
  size_t len = strlen(text), n = 0;
  if (len % 2)
    return -1;
  for (size_t i = 0; i < len; i += 2) {
    unsigned v;
    if (sscanf(text + i, "%2x", &v) != 1)
      return -1;
    text[n++] = (char)v;
  }
  text[n] = '\0';
  return (long)n;
}

_Static_assert(STORE_JOURNAL_BATCH <= FERRY_ELECTION_TXN_MAX, "a journal batch is one transaction");

/* n records of one kind (NULL: the key's record goes) in one transaction. */
static int journal_write(store_ha *h, const char *kind, size_t n, const char *const *names,
                         const size_t *lens, const char *const *records) {
  char *keys[FERRY_ELECTION_TXN_MAX];
  size_t made = 0;
  while (made < n && made < FERRY_ELECTION_TXN_MAX &&
         (keys[made] = journal_key(h, kind, names[made], lens[made])))
    made++;
  ferry_status st =
      made == n ? ferry_election_write_many(h->election, n, (const char *const *)keys, records)
                : ferry_fail(FERRY_ENOMEM, "store master: out of memory");
  while (made)
    free(keys[--made]);
  int failing = st != FERRY_OK;
  if (failing && !__atomic_exchange_n(&h->journal_failing, 1, __ATOMIC_RELAXED))
    FERRY_WARN("store master %s: cannot journal to etcd: %s (commits and new segments are "
               "refused meanwhile)",
               h->address, ferry_last_error());
  else if (!failing)
    __atomic_store_n(&h->journal_failing, 0, __ATOMIC_RELAXED);
  return failing ? -1 : 0;
}

static int journal_objects(void *ctx, size_t n, const char *const *keys, const size_t *lens,
                           const char *const *records) {
  return journal_write(ctx, "objects/", n, keys, lens, records);
}

static int journal_segment(void *ctx, const char *name, const char *record) {
  size_t len = strlen(name);
  return journal_write(ctx, "segments/", 1, &name, &len, &record);
}

typedef struct restoring {
  store_ha *h;
  store_map *map;
  const char *kind;
  size_t done, skipped;
} restoring;

static void restore_one(void *ctx, const char *key, const char *value) {
  restoring *r = ctx;
  char *name = strdup(key + strlen(r->h->prefix) + strlen(r->kind));
  long len = name ? unhex(name) : -1;
  int rc = -1;
  if (len > 0 && !strcmp(r->kind, "segments/"))
    rc = store_map_restore_segment(r->map, STORE_ORPHAN | ++r->h->orphan_next, name, value);
  else if (len > 0)
    rc = store_map_restore_object(r->map, name, (size_t)len, value);
  free(name);
  if (rc == 0) {
    r->done++;
    return;
  }
  r->skipped++; /* a record that no longer fits anything: forget it */
  FERRY_WARN("store master %s: journal record %s (\"%s\") does not fit the map; dropped it",
             r->h->address, key, value);
  ferry_election_write(r->h->election, key, NULL);
}

/* A new leader, before its fence opens: the segments and objects the
 * previous leaders journaled, then its own journal on. -1 when etcd could
 * not be read (then it must not serve: resign). */
static int restore(store_ha *h) {
  store_map *map = store_master_map(h->master);
  restoring segs = {h, map, "segments/", 0, 0}, objs = {h, map, "objects/", 0, 0};
  char prefix[320];
  snprintf(prefix, sizeof prefix, "%ssegments/", h->prefix);
  ferry_status st = ferry_election_scan(h->election, prefix, restore_one, &segs);
  snprintf(prefix, sizeof prefix, "%sobjects/", h->prefix);
  if (!st)
    st = ferry_election_scan(h->election, prefix, restore_one, &objs);
  if (st) {
    FERRY_WARN("store master %s: cannot read the journal: %s; resigning", h->address,
               ferry_last_error());
    return -1;
  }
  store_journal journal = {h, journal_objects, journal_segment};
  store_map_set_journal(map, &journal);
  uint32_t client_ttl_ms = h->cfg.client_ttl_ms ? h->cfg.client_ttl_ms : 10000;
  h->orphans_until = segs.done ? ferry_now_ns() + client_ttl_ms * 1000000ull : 0;
  FERRY_INFO("store master %s: restored %zu segment(s) and %zu object(s) from the journal (%zu "
             "record(s) dropped); segments not registered again within %u ms go",
             h->address, segs.done, objs.done, segs.skipped + objs.skipped, client_ttl_ms);
  return 0;
}

static void fence_at(store_ha *h, uint64_t until_ns) {
  store_master_serve_until(h->master, until_ns > h->margin_ns ? until_ns - h->margin_ns : 0);
}

/* One campaign round: logs a change of role. */
static void campaign(store_ha *h) {
  int *reported = &h->reported;
  char *holder = NULL;
  uint64_t until = 0;
  ferry_status st = ferry_election_campaign(h->election, h->address, &holder, &until);
  if (st == FERRY_OK && restore(h) != 0) {
    ferry_election_resign(h->election);
    st = FERRY_EMETADATA;
  }
  if (st == FERRY_OK) {
    fence_at(h, until);
    h->leading = 1;
    FERRY_INFO("store master %s: leads (etcd key %s, lease %u s)", h->address, h->key, h->ttl_s);
  } else if (st == FERRY_EBUSY && *reported != 1) {
    FERRY_INFO("store master %s: standby; the leader is %s", h->address, holder ? holder : "?");
    *reported = 1;
  } else if (st != FERRY_EBUSY && *reported != 2) {
    FERRY_WARN("store master %s: standby, cannot campaign: %s", h->address, ferry_last_error());
    *reported = 2;
  }
  free(holder);
}

/* The lease is gone: serve nothing from now, and stand by again with an
 * empty master (clients rejoin the next leader). */
static void demote(store_ha *h) {
  store_master_serve_until(h->master, 0);
  store_map_set_journal(store_master_map(h->master), NULL); /* its drops are not the next term's */
  h->leading = 0;
  h->orphans_until = 0;
  FERRY_WARN("store master %s: lost the lead (%s): stopped serving; standing by", h->address,
             ferry_last_error());
  pthread_mutex_lock(&h->lock); /* store_ha_stats reads h->master */
  store_master_stop(h->master);
  h->master = NULL;
  ferry_status st = store_master_start(&h->cfg, &h->master);
  pthread_mutex_unlock(&h->lock);
  if (st)
    FERRY_ERROR("store master %s: cannot listen again as a standby: %s", h->address,
                ferry_last_error());
}

void store_ha_stats(store_ha *h, store_map_stats *out) {
  pthread_mutex_lock(&h->lock);
  if (h->master)
    store_master_stats(h->master, out);
  else
    memset(out, 0, sizeof *out);
  pthread_mutex_unlock(&h->lock);
}

/* The leader's round: renews the lease (moving the fence), drops the
 * restored segments nobody adopted once their time is up, or demotes. */
static void keep_lead(store_ha *h, int *unreachable) {
  uint64_t until = 0;
  ferry_status st = ferry_election_keep(h->election, &until);
  if (st == FERRY_ENOTFOUND) {
    demote(h);
    h->reported = 0;
  } else if (st != FERRY_OK && !*unreachable) {
    FERRY_WARN("store master %s: cannot renew the lead's lease: %s (serving until it ends)",
               h->address, ferry_last_error());
  }
  *unreachable = st != FERRY_OK && st != FERRY_ENOTFOUND;
  if (st != FERRY_OK)
    return;
  fence_at(h, until);
  if (h->orphans_until && ferry_now_ns() > h->orphans_until) {
    h->orphans_until = 0;
    size_t gone = store_map_drop_orphans(store_master_map(h->master));
    FERRY_INFO("store master %s: dropped the restored segments no client registered again, and "
               "%zu object(s) with them",
               h->address, gone);
  }
}

/* Waits ms or until stopped; 1 when stopping. h->lock held. */
static int pause_ms(store_ha *h, uint64_t ms) {
  struct timespec at = ferry_timespec(ferry_now_ns() + ms * 1000000ull);
  while (!h->stopping && pthread_cond_timedwait(&h->wake, &h->lock, &at) == 0) {
  }
  return h->stopping;
}

static void *ha_main(void *arg) {
  store_ha *h = arg;
  int unreachable = 0;
  pthread_mutex_lock(&h->lock);
  while (!pause_ms(h, h->leading                 ? h->ttl_s * 1000ull / 3
                      : h->master && h->watching ? 0
                                                 : STANDBY_POLL_MS)) {
    pthread_mutex_unlock(&h->lock);
    if (!h->master)
      ; /* could not listen again: nothing to lead with */
    else if (!h->leading) {
      ferry_status st = ferry_election_watch(h->election, STANDBY_WATCH_MS);
      h->watching = st == FERRY_OK || st == FERRY_ETIMEDOUT;
      campaign(h);
    } else {
      keep_lead(h, &unreachable);
    }
    pthread_mutex_lock(&h->lock);
  }
  pthread_mutex_unlock(&h->lock);
  return NULL;
}

ferry_status store_ha_start(const store_master_config *cfg, const char *connstring, uint32_t ttl_s,
                            store_ha **out, int *leading) {
  if (!connstring || !*connstring)
    return ferry_fail(FERRY_EINVAL, "store master: --enable_ha needs --ha_backend_connstring="
                                    "HOST:PORT[;HOST:PORT...] (etcd)");
  store_ha *h = calloc(1, sizeof *h);
  if (!h)
    return ferry_fail(FERRY_ENOMEM, "store master: out of memory");
  h->cfg = *cfg;
  h->cfg.fenced = 1;
  h->ttl_s = ttl_s ? ttl_s : STORE_HA_TTL_S;
  h->margin_ns = h->ttl_s * 100000000ull; /* a tenth of the lease */
  leader_key(cfg->cluster_id, h->key, sizeof h->key);
  cluster_key(cfg->cluster_id, "", h->prefix, sizeof h->prefix);
  pthread_mutex_init(&h->lock, NULL);
  ferry_cond_init(&h->wake);
  ferry_status st = store_master_start(&h->cfg, &h->master);
  if (!st) {
    h->cfg.port = store_master_port(h->master); /* a standby again listens where it did */
    snprintf(h->address, sizeof h->address, "%s:%u", cfg->host ? cfg->host : "127.0.0.1",
             h->cfg.port);
    st = ferry_election_open(connstring, h->key, h->ttl_s, &h->election);
  }
  if (!st)
    campaign(h);
  if (!st && h->reported == 2)
    st = ferry_fail(FERRY_EMETADATA, "store master: --ha_backend_connstring=%s: %s", connstring,
                    ferry_last_error());
  *leading = h->leading; /* before the thread may change it */
  if (!st)
    h->started = pthread_create(&h->thread, NULL, ha_main, h) == 0;
  if (!st && !h->started)
    st = ferry_fail(FERRY_ENOMEM, "store master: cannot start the election's thread");
  if (st) {
    char detail[FERRY_ERROR_MAX];
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
    store_ha_stop(h);
    return ferry_fail(st, "%s", detail);
  }
  *out = h;
  return FERRY_OK;
}

const char *store_ha_address(const store_ha *h) { return h->address; }

void store_ha_stop(store_ha *h) {
  if (!h)
    return;
  pthread_mutex_lock(&h->lock);
  h->stopping = 1;
  pthread_cond_signal(&h->wake);
  pthread_mutex_unlock(&h->lock);
  if (h->started)
    pthread_join(h->thread, NULL);
  if (h->master) {
    store_master_serve_until(h->master, 0); /* serve nothing once the key may be another's */
    store_map_set_journal(store_master_map(h->master), NULL); /* the next leader restores it */
  }
  if (h->election && h->leading)
    ferry_election_resign(h->election);
  ferry_election_close(h->election);
  store_master_stop(h->master);
  pthread_cond_destroy(&h->wake);
  pthread_mutex_destroy(&h->lock);
  free(h);
}

ferry_status store_ha_find_leader(const char *url, char *addr, size_t size) {
  char *copy = strdup(url), *value = NULL, key[300];
  if (!copy)
    return ferry_fail(FERRY_ENOMEM, "store: out of memory");
  for (char *p = copy; *p; p++)
    if (*p == ';')
      *p = ',';
  leader_key(NULL, key, sizeof key);
  ferry_metadata *md = NULL;
  ferry_metadata_options opt = {.connect_timeout_ms = 1000};
  ferry_status st = ferry_metadata_open_with(copy, &opt, &md);
  if (!st)
    st = ferry_metadata_get(md, key, &value);
  ferry_metadata_close(md);
  free(copy);
  if (st == FERRY_ENOTFOUND)
    return ferry_fail(st, "no store master leads now (etcd key %s absent at %s)", key, url);
  if (st)
    return ferry_fail(st, "cannot read the store's leader from %s: %s", url, ferry_last_error());
  snprintf(addr, size, "%s", value);
  free(value);
  return FERRY_OK;
}
