/* backend.h - the private seam between metadata.c and one store backend.
 *
 * A backend is one file (http.c today; redis.c or etcd.c later) exposing an
 * open function that fills a vtable and an opaque state pointer. metadata.c
 * picks the backend from the URL scheme and forwards the raw key operations,
 * so adding a store never touches the segment code or the public API. */
#ifndef FERRY_METADATA_BACKEND_H
#define FERRY_METADATA_BACKEND_H

#include "metadata.h"

/* Every operation sets the thread's error detail on failure (ferry_fail).
 * get and del return FERRY_ENOTFOUND for a missing key. get's *value is
 * malloc'd and NUL-terminated. All must be safe to call from many threads
 * on one state at once. */
typedef struct ferry_metadata_ops {
  const char *scheme; /* "http", for messages */
  ferry_status (*put)(void *state, const char *key, const char *value);
  ferry_status (*get)(void *state, const char *key, char **value);
  ferry_status (*del)(void *state, const char *key);
  void (*close)(void *state);
} ferry_metadata_ops;

struct ferry_metadata {
  const ferry_metadata_ops *ops;
  void *state;
};

/* http.c: url is "http://host:port/path" (https:// also works). */
ferry_status ferry_metadata_http_open(const char *url, const ferry_metadata_ops **ops,
                                      void **state);

#endif
