/* notify.c - the notification queue: the server pushes what peers send
 * (ferry_engine_push_notification, bounded per sending peer and in all),
 * the application drains it (ferry_notify_drain). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine.h"

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

ferry_status ferry_notify_drain(ferry_engine *e, ferry_notification **out, size_t *count) {
  FERRY_GATED(e, notify_drain(e, out, count));
}
