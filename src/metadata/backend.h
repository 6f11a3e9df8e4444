/* backend.h - the private seam between metadata.c and one store backend.
 *
 * A backend is one file (http.c, redis.c, etcd.c) exposing an open function
 * that fills a vtable and an opaque state pointer. metadata.c picks the
 * backend from the URL scheme and forwards the raw key operations, so adding
 * a store never touches the segment code or the public API. */
#ifndef FERRY_METADATA_BACKEND_H
#define FERRY_METADATA_BACKEND_H

#include <pthread.h>

#include "metadata.h"

/* Beyond connecting, how long one store request may take to be answered. */
#define FERRY_METADATA_ANSWER_MS 3000

/* Every operation sets the thread's error detail on failure (ferry_fail).
 * get and del return FERRY_ENOTFOUND for a missing key. get's *value is
 * malloc'd and NUL-terminated. All must be safe to call from many threads
 * on one state at once. */
typedef struct ferry_metadata_ops {
  const char *scheme; /* "http", for messages */
  /* ttl_ms > 0: the key disappears unless put again (or refreshed) within
   * ttl_ms; 0: it stays until deleted. */
  ferry_status (*put)(void *state, const char *key, const char *value, uint32_t ttl_ms);
  ferry_status (*get)(void *state, const char *key, char **value);
  ferry_status (*del)(void *state, const char *key);
  /* Extends the life of every key put with a ttl without rewriting them.
   * FERRY_ENOTFOUND: the store lost them (restarted empty, lease expired),
   * put them again. NULL when refreshing is just putting again. */
  ferry_status (*refresh)(void *state, uint32_t ttl_ms);
  void (*close)(void *state);
} ferry_metadata_ops;

typedef struct ferry_lease ferry_lease;         /* lease.c */
typedef struct ferry_seg_cache ferry_seg_cache; /* segment.c */

struct ferry_metadata {
  const ferry_metadata_ops *ops;
  void *state;
  ferry_lease *lease; /* NULL: published keys never expire */
  pthread_mutex_t cache_lock;
  ferry_seg_cache *cache; /* last address seen per segment (segment.c) */
};

/* One per backend file. opt is filled (timeouts nonzero). */
ferry_status ferry_metadata_http_open(const char *url, const ferry_metadata_options *opt,
                                      const ferry_metadata_ops **ops, void **state);
ferry_status ferry_metadata_redis_open(const char *url, const ferry_metadata_options *opt,
                                       const ferry_metadata_ops **ops, void **state);
ferry_status ferry_metadata_etcd_open(const char *url, const ferry_metadata_options *opt,
                                      const ferry_metadata_ops **ops, void **state);

/* lease.c: keeps this store's leased keys alive. put records key=value and
 * writes it with the ttl; del forgets it and deletes it; a thread refreshes
 * every ttl/3 and puts everything again when the store lost it or a write
 * failed. Writes and refreshes are serialised, so a deleted key is never
 * written back. */
ferry_status ferry_lease_start(ferry_metadata *md, uint32_t ttl_ms, ferry_lease **out);
void ferry_lease_stop(ferry_lease *lease);
ferry_status ferry_lease_put(ferry_lease *lease, const char *key, const char *value);
ferry_status ferry_lease_del(ferry_lease *lease, const char *key);

/* segment.c: frees the address cache. */
void ferry_segment_cache_free(ferry_metadata *md);

#endif
