/* metadata.c - opens a metadata store by URL and forwards raw key operations
 * to its backend.
 *
 * The URL forms are Mooncake's: "http://host:port/path", "redis://host:port",
 * "etcd://host:port[,...]" and a bare "host:port" (etcd). Only http is built
 * today; the others fail with FERRY_ENOTIMPL naming the scheme, so a user who
 * copies a Mooncake command line learns exactly what to change. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend.h"
#include "core/error.h"

#define UNSUPPORTED_HINT "is not supported yet (use http:// or P2PHANDSHAKE)"

static int has_prefix(const char *s, const char *prefix) {
  return strncasecmp(s, prefix, strlen(prefix)) == 0;
}

/* "host:port", "[v6]:port" or a comma list of them: what Mooncake reads as
 * etcd endpoints. Recognised by a digits-only tail after the last ':' of the
 * first endpoint. */
static int looks_like_bare_endpoint(const char *url) {
  if (strstr(url, "://"))
    return 0;
  size_t first = strcspn(url, ",");
  const char *colon = NULL;
  for (const char *p = url; p < url + first; p++)
    if (*p == ':')
      colon = p;
  if (!colon || colon == url || colon + 1 == url + first)
    return 0;
  for (const char *p = colon + 1; p < url + first; p++)
    if (*p < '0' || *p > '9')
      return 0;
  return 1;
}

static ferry_status reject_url(const char *url) {
  if (has_prefix(url, "redis://") || has_prefix(url, "rediss://"))
    return ferry_fail(FERRY_ENOTIMPL, "metadata store \"%s\": scheme redis " UNSUPPORTED_HINT, url);
  if (has_prefix(url, "etcd://"))
    return ferry_fail(FERRY_ENOTIMPL, "metadata store \"%s\": scheme etcd " UNSUPPORTED_HINT, url);
  if (looks_like_bare_endpoint(url))
    return ferry_fail(FERRY_ENOTIMPL,
                      "metadata store \"%s\": scheme etcd (bare host:port) " UNSUPPORTED_HINT, url);
  if (strcasecmp(url, "P2PHANDSHAKE") == 0)
    return ferry_fail(FERRY_EINVAL,
                      "metadata store \"%s\": P2PHANDSHAKE means no store, nothing to open", url);
  return ferry_fail(FERRY_EINVAL,
                    "metadata store \"%s\": unknown URL form (expected http://host:port/path)",
                    url);
}

ferry_status ferry_metadata_open(const char *url, ferry_metadata **out) {
  if (!out)
    return ferry_fail(FERRY_EINVAL, "metadata open: out is NULL");
  *out = NULL;
  if (!url || !*url)
    return ferry_fail(FERRY_EINVAL, "metadata open: empty store URL");
  if (!has_prefix(url, "http://") && !has_prefix(url, "https://"))
    return reject_url(url);

  ferry_metadata *md = calloc(1, sizeof *md);
  if (!md)
    return ferry_fail(FERRY_ENOMEM, "metadata open \"%s\": out of memory", url);
  ferry_status st = ferry_metadata_http_open(url, &md->ops, &md->state);
  if (st != FERRY_OK) {
    free(md);
    return st;
  }
  *out = md;
  return FERRY_OK;
}

void ferry_metadata_close(ferry_metadata *md) {
  if (!md)
    return;
  md->ops->close(md->state);
  free(md);
}

/* Shared argument checks, so every backend can assume non-NULL inputs. */
static ferry_status check_args(ferry_metadata *md, const char *key, const char *op) {
  if (!md)
    return ferry_fail(FERRY_EINVAL, "metadata %s: store handle is NULL", op);
  if (!key || !*key)
    return ferry_fail(FERRY_EINVAL, "metadata %s: empty key", op);
  return FERRY_OK;
}

ferry_status ferry_metadata_put(ferry_metadata *md, const char *key, const char *value) {
  ferry_status st = check_args(md, key, "PUT");
  if (st != FERRY_OK)
    return st;
  if (!value)
    return ferry_fail(FERRY_EINVAL, "metadata PUT %s: value is NULL", key);
  return md->ops->put(md->state, key, value);
}

ferry_status ferry_metadata_get(ferry_metadata *md, const char *key, char **value) {
  if (value)
    *value = NULL;
  ferry_status st = check_args(md, key, "GET");
  if (st != FERRY_OK)
    return st;
  if (!value)
    return ferry_fail(FERRY_EINVAL, "metadata GET %s: value pointer is NULL", key);
  return md->ops->get(md->state, key, value);
}

ferry_status ferry_metadata_delete(ferry_metadata *md, const char *key) {
  ferry_status st = check_args(md, key, "DELETE");
  if (st != FERRY_OK)
    return st;
  return md->ops->del(md->state, key);
}
