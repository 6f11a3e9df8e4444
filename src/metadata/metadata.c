/* metadata.c - opens a metadata store by URL and forwards raw key operations
 * to its backend, through the lease keeper when keys are leased.
 *
 * The URL forms are Mooncake's: "http://host:port/path", "redis://host:port",
 * "etcd://host:port[,...]" and a bare "host:port" (etcd), so a Mooncake
 * command line works unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend.h"
#include "base/error.h"

#define DEFAULT_CONNECT_TIMEOUT_MS 2000

typedef ferry_status (*open_fn)(const char *url, const ferry_metadata_options *opt,
                                const ferry_metadata_ops **ops, void **state);

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

static ferry_status pick_backend(const char *url, open_fn *fn) {
  if (has_prefix(url, "http://") || has_prefix(url, "https://"))
    *fn = ferry_metadata_http_open;
  else if (has_prefix(url, "redis://"))
    *fn = ferry_metadata_redis_open;
  else if (has_prefix(url, "etcd://") || looks_like_bare_endpoint(url))
    *fn = ferry_metadata_etcd_open;
  else if (has_prefix(url, "rediss://"))
    return ferry_fail(FERRY_ENOTIMPL, "metadata store \"%s\": redis over TLS is not supported",
                      url);
  else if (strcasecmp(url, "P2PHANDSHAKE") == 0)
    return ferry_fail(FERRY_EINVAL,
                      "metadata store \"%s\": P2PHANDSHAKE means no store, nothing to open", url);
  else
    return ferry_fail(FERRY_EINVAL,
                      "metadata store \"%s\": unknown URL form (expected http://host:port/path, "
                      "redis://host:port, etcd://host:port or host:port)",
                      url);
  return FERRY_OK;
}

void ferry_metadata_redact(const char *url, char *out, size_t size) {
  const char *auth = strstr(url, "://");
  auth = auth ? auth + 3 : url;
  const char *at = strchr(auth, '@');
  const char *slash = strchr(auth, '/');
  if (slash && at && slash < at)
    at = NULL; /* an '@' in the path is no user name */
  const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
  if (!colon) {
    snprintf(out, size, "%s", url);
    return;
  }
  snprintf(out, size, "%.*s***%s", (int)(colon + 1 - url), url, at);
}

ferry_status ferry_metadata_open_with(const char *url, const ferry_metadata_options *opt,
                                      ferry_metadata **out) {
  if (!out)
    return ferry_fail(FERRY_EINVAL, "metadata open: out is NULL");
  *out = NULL;
  if (!url || !*url)
    return ferry_fail(FERRY_EINVAL, "metadata open: empty store URL");
  open_fn fn = NULL;
  ferry_status st = pick_backend(url, &fn);
  if (st != FERRY_OK)
    return st;
  ferry_metadata_options o = opt ? *opt : (ferry_metadata_options){0};
  if (!o.connect_timeout_ms)
    o.connect_timeout_ms = DEFAULT_CONNECT_TIMEOUT_MS;

  ferry_metadata *md = calloc(1, sizeof *md);
  if (!md)
    return ferry_fail(FERRY_ENOMEM, "metadata open: out of memory");
  pthread_mutex_init(&md->cache_lock, NULL);
  st = fn(url, &o, &md->ops, &md->state);
  if (st == FERRY_OK && o.ttl_ms)
    st = ferry_lease_start(md, o.ttl_ms, &md->lease);
  if (st != FERRY_OK) {
    ferry_metadata_close(md);
    return st;
  }
  *out = md;
  return FERRY_OK;
}

ferry_status ferry_metadata_open(const char *url, ferry_metadata **out) {
  return ferry_metadata_open_with(url, NULL, out);
}

void ferry_metadata_close(ferry_metadata *md) {
  if (!md)
    return;
  ferry_lease_stop(md->lease); /* before the backend it uses goes */
  if (md->ops)
    md->ops->close(md->state);
  ferry_segment_cache_free(md);
  pthread_mutex_destroy(&md->cache_lock);
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
  if (md->lease)
    return ferry_lease_put(md->lease, key, value);
  return md->ops->put(md->state, key, value, 0);
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
  if (md->lease)
    return ferry_lease_del(md->lease, key);
  return md->ops->del(md->state, key);
}
