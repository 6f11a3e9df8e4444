/* lease.c - keeps an engine's published keys alive in the store, so that a
 * killed engine's segment disappears within the ttl while a live one's stays.
 *
 * Every leased put is recorded here (key -> last value) and written with the
 * ttl. A thread wakes every ttl/3: it asks the backend to extend the lease
 * (etcd keep-alive), and writes every recorded key again where the backend
 * has no such thing (redis, http), where the store lost the keys (restarted
 * empty, lease expired while it was down), or after a write failed. So
 * publishing resumes by itself when a store comes back, within one period.
 *
 * One mutex serialises writes, deletes and refreshes: a key deleted by
 * unpublish is forgotten before the store delete, and can never be written
 * back by a refresh running at the same time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"

typedef struct leased_key {
  struct leased_key *next;
  char *key;
  char *value;
} leased_key;

struct ferry_lease {
  ferry_metadata *md;
  uint32_t ttl_ms;
  pthread_mutex_t lock; /* guards everything below and every store write */
  pthread_cond_t wake;
  leased_key *keys;
  int stale;   /* a write failed: put everything again at the next tick */
  int failing; /* the last refresh failed (logged once, not every tick) */
  int stopping;
  pthread_t thread;
};

static leased_key *find_key(ferry_lease *l, const char *key) {
  leased_key *k = l->keys;
  while (k && strcmp(k->key, key) != 0)
    k = k->next;
  return k;
}

static ferry_status put_one(ferry_lease *l, const leased_key *k) {
  return l->md->ops->put(l->md->state, k->key, k->value, l->ttl_ms);
}

/* Writes every key again (all of them, even after a failure); returns the
 * first failure. Called with the lock held. */
static ferry_status put_all(ferry_lease *l) {
  ferry_status first = FERRY_OK;
  char detail[FERRY_ERROR_MAX] = "";
  for (leased_key *k = l->keys; k; k = k->next) {
    ferry_status st = put_one(l, k);
    if (st != FERRY_OK && first == FERRY_OK) {
      first = st;
      snprintf(detail, sizeof detail, "%s", ferry_last_error());
    }
  }
  if (first != FERRY_OK)
    ferry_error_set_detail(detail);
  return first;
}

/* One refresh period's work; called with the lock held. */
static void refresh(ferry_lease *l) {
  if (!l->keys)
    return;
  const ferry_metadata_ops *ops = l->md->ops;
  ferry_status st = ops->refresh ? ops->refresh(l->md->state, l->ttl_ms) : FERRY_ENOTFOUND;
  /* Lost keys, or a write that failed earlier: everything again. */
  if (st == FERRY_ENOTFOUND || (st == FERRY_OK && l->stale))
    st = put_all(l);
  l->stale = st != FERRY_OK;
  if (st != FERRY_OK && !l->failing)
    FERRY_WARN("metadata lease refresh failed (will retry every %u ms): %s", l->ttl_ms / 3,
               ferry_last_error());
  else if (st == FERRY_OK && l->failing)
    FERRY_INFO("metadata lease refresh works again; keys re-published");
  l->failing = st != FERRY_OK;
}

static void *lease_main(void *arg) {
  ferry_lease *l = arg;
  uint64_t period_ns = (uint64_t)(l->ttl_ms / 3 ? l->ttl_ms / 3 : 1) * 1000000ull;
  pthread_mutex_lock(&l->lock);
  while (!l->stopping) {
    uint64_t at = ferry_now_ns() + period_ns;
    struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull),
                          .tv_nsec = (long)(at % 1000000000ull)};
    while (!l->stopping && pthread_cond_timedwait(&l->wake, &l->lock, &ts) != ETIMEDOUT)
      ;
    if (!l->stopping)
      refresh(l);
  }
  pthread_mutex_unlock(&l->lock);
  return NULL;
}

ferry_status ferry_lease_start(ferry_metadata *md, uint32_t ttl_ms, ferry_lease **out) {
  ferry_lease *l = calloc(1, sizeof *l);
  if (!l)
    return ferry_fail(FERRY_ENOMEM, "metadata lease: out of memory");
  l->md = md;
  l->ttl_ms = ttl_ms;
  pthread_mutex_init(&l->lock, NULL);
  ferry_cond_init(&l->wake);
  int rc = pthread_create(&l->thread, NULL, lease_main, l);
  if (rc != 0) {
    pthread_cond_destroy(&l->wake);
    pthread_mutex_destroy(&l->lock);
    free(l);
    return ferry_fail_errno(FERRY_ENOMEM, rc, "metadata lease: cannot start its thread");
  }
  *out = l;
  return FERRY_OK;
}

void ferry_lease_stop(ferry_lease *l) {
  if (!l)
    return;
  pthread_mutex_lock(&l->lock);
  l->stopping = 1;
  pthread_cond_signal(&l->wake);
  pthread_mutex_unlock(&l->lock);
  pthread_join(l->thread, NULL);
  while (l->keys) {
    leased_key *k = l->keys;
    l->keys = k->next;
    free(k->key);
    free(k->value);
    free(k);
  }
  pthread_cond_destroy(&l->wake);
  pthread_mutex_destroy(&l->lock);
  free(l);
}

/* Records key = value (replacing an older value); called with the lock. */
static leased_key *record(ferry_lease *l, const char *key, const char *value) {
  leased_key *k = find_key(l, key);
  char *copy = strdup(value);
  if (!copy)
    return NULL;
  if (k) {
    free(k->value);
    k->value = copy;
    return k;
  }
  if (!(k = calloc(1, sizeof *k)) || !(k->key = strdup(key))) {
    free(k);
    free(copy);
    return NULL;
  }
  k->value = copy;
  k->next = l->keys;
  l->keys = k;
  return k;
}

ferry_status ferry_lease_put(ferry_lease *l, const char *key, const char *value) {
  pthread_mutex_lock(&l->lock);
  leased_key *k = record(l, key, value);
  ferry_status st =
      k ? put_one(l, k) : ferry_fail(FERRY_ENOMEM, "metadata PUT %s: out of memory", key);
  /* Kept even when the write failed: the refresh puts it once the store is back. */
  if (st != FERRY_OK)
    l->stale = 1;
  pthread_mutex_unlock(&l->lock);
  return st;
}

ferry_status ferry_lease_del(ferry_lease *l, const char *key) {
  pthread_mutex_lock(&l->lock);
  for (leased_key **p = &l->keys; *p; p = &(*p)->next)
    if (strcmp((*p)->key, key) == 0) {
      leased_key *k = *p;
      *p = k->next;
      free(k->key);
      free(k->value);
      free(k);
      break;
    }
  ferry_status st = l->md->ops->del(l->md->state, key);
  pthread_mutex_unlock(&l->lock);
  return st;
}
