/* suspects.c - the segments whose reads failed on the link lately
 * (suspects.h): a small table under a lock, looked at only while it holds
 * one, so a healthy pool's gets pay one atomic load. Full, it forgets the
 * suspect that expires first. */
#include "store/suspects.h"

#include <string.h>

#include "base/clock.h"
#include "base/log.h"

void store_suspects_init(store_suspects *t) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->lock, NULL);
}

void store_suspects_destroy(store_suspects *t) { pthread_mutex_destroy(&t->lock); }

/* The failures that say a holder cannot be reached from here. */
static int unreachable(ferry_status st) {
  return st == FERRY_ESOCKET || st == FERRY_ETIMEDOUT || st == FERRY_EHANDSHAKE || st == FERRY_EDNS;
}

/* With the lock: segment's entry, or -1. */
static int find_locked(const store_suspects *t, const char *segment, size_t len) {
  for (unsigned i = 0; i < t->count; i++)
    if (strlen(t->entry[i].segment) == len && !memcmp(t->entry[i].segment, segment, len))
      return (int)i;
  return -1;
}

/* With the lock: a free entry, the first to expire when none is. */
static unsigned slot_locked(store_suspects *t) {
  if (t->count < STORE_SUSPECTS_MAX)
    return __atomic_fetch_add(&t->count, 1, __ATOMIC_RELEASE);
  unsigned first = 0;
  for (unsigned i = 1; i < STORE_SUSPECTS_MAX; i++)
    if (t->entry[i].until_ns < t->entry[first].until_ns)
      first = i;
  return first;
}

static void forget_locked(store_suspects *t, unsigned i) {
  t->entry[i] = t->entry[t->count - 1];
  __atomic_store_n(&t->count, t->count - 1, __ATOMIC_RELEASE);
}

void store_suspects_note(store_suspects *t, const char *segment, size_t len, ferry_status st,
                         const char *detail) {
  int fails = unreachable(st);
  if (!fails && (st || !__atomic_load_n(&t->count, __ATOMIC_ACQUIRE)))
    return;
  if (len > STORE_NAME_MAX)
    return; /* never in a reply: store_get_replicas bounds names */
  pthread_mutex_lock(&t->lock);
  uint64_t now = ferry_now_ns();
  int i = find_locked(t, segment, len);
  int was = i >= 0 && t->entry[i].until_ns > now;
  if (fails) {
    if (i < 0) {
      i = (int)slot_locked(t);
      memcpy(t->entry[i].segment, segment, len);
      t->entry[i].segment[len] = '\0';
    }
    t->entry[i].until_ns = now + STORE_SUSPECT_MS * 1000000ull;
  } else if (i >= 0) {
    forget_locked(t, (unsigned)i);
  }
  pthread_mutex_unlock(&t->lock);
  if (fails && !was)
    FERRY_WARN("store: a read from segment %.*s failed: %s; its replicas are read after the "
               "others for %d s",
               (int)len, segment, detail, STORE_SUSPECT_MS / 1000);
  else if (!fails && was)
    FERRY_INFO("store: segment %.*s serves reads again", (int)len, segment);
}

int store_suspects_has(store_suspects *t, const char *segment, size_t len) {
  if (!__atomic_load_n(&t->count, __ATOMIC_ACQUIRE))
    return 0;
  pthread_mutex_lock(&t->lock);
  int i = find_locked(t, segment, len);
  int has = i >= 0 && t->entry[i].until_ns > ferry_now_ns();
  if (i >= 0 && !has)
    forget_locked(t, (unsigned)i); /* expired: an empty table is skipped again */
  pthread_mutex_unlock(&t->lock);
  return has;
}

unsigned store_suspects_order(store_suspects *t, store_replica_ref *reps, unsigned count) {
  if (count < 2 || !__atomic_load_n(&t->count, __ATOMIC_ACQUIRE))
    return 0;
  store_replica_ref later[STORE_REPLICAS_MAX];
  unsigned kept = 0, moved = 0;
  for (unsigned i = 0; i < count; i++) {
    if (store_suspects_has(t, reps[i].segment, reps[i].segment_len))
      later[moved++] = reps[i];
    else
      reps[kept++] = reps[i];
  }
  memcpy(reps + kept, later, moved * sizeof *later);
  return moved;
}
