/* http.c - the http metadata backend: GET|PUT|DELETE <url>?key=<escaped key>
 * with libcurl, the protocol of Mooncake's http metadata server.
 *
 * A leased PUT adds "&ttl=<ms>": `ferry metadata-server` then drops the key
 * unless it is put again within that time; Mooncake's server ignores the
 * parameter and keeps the key, so either server works. Refreshing is putting
 * again (no refresh op). Timeouts are bounded because an engine calls this
 * on its control path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "base/error.h"
#include "httpc.h"

typedef struct http_store {
  char *url;
  ferry_httpc *pool;
} http_store;

/* "<url>?key=<escaped>[&ttl=MS]", '&' first when url already has a query. */
static char *request_url(http_store *s, const char *key, uint32_t ttl_ms) {
  char *escaped = ferry_httpc_escape(key);
  if (!escaped)
    return NULL;
  char sep = strchr(s->url, '?') ? '&' : '?';
  size_t n = strlen(s->url) + strlen(escaped) + 32;
  char *full = malloc(n);
  if (full && ttl_ms)
    snprintf(full, n, "%s%ckey=%s&ttl=%u", s->url, sep, escaped, ttl_ms);
  else if (full)
    snprintf(full, n, "%s%ckey=%s", s->url, sep, escaped);
  free(escaped);
  return full;
}

/* Maps the outcome of one request to a status, setting the detail. */
static ferry_status outcome(const char *method, const char *url, const char *key, CURLcode rc,
                            const ferry_http_reply *r) {
  if (rc != CURLE_OK) {
    if (r->too_big)
      return ferry_fail(FERRY_EMETADATA, "metadata %s %s failed: reply larger than %u MiB", method,
                        url, ferry_httpc_max_reply_mib());
    return ferry_fail(FERRY_EMETADATA, "metadata %s %s failed: %s", method, url,
                      ferry_httpc_strerror(rc));
  }
  if (r->code >= 200 && r->code < 300)
    return FERRY_OK;
  if (r->code == 404 && strcmp(method, "PUT") != 0)
    return ferry_fail(FERRY_ENOTFOUND, "metadata key \"%s\" not found (%s %s: HTTP 404)", key,
                      method, url);
  return ferry_fail(FERRY_EMETADATA, "metadata %s %s: HTTP %ld", method, url, r->code);
}

/* Performs one request. body != NULL makes it carry that body (PUT). */
static ferry_status perform(http_store *s, const char *method, const char *key, const char *body,
                            uint32_t ttl_ms, ferry_http_reply *r) {
  char *url = request_url(s, key, ttl_ms);
  if (!url)
    return ferry_fail(FERRY_ENOMEM, "metadata %s %s: out of memory", method, s->url);
  CURLcode rc = ferry_httpc_perform(s->pool, method, url, body, "application/json", r);
  ferry_status st = outcome(method, url, key, rc, r);
  free(url);
  return st;
}

static ferry_status http_put(void *state, const char *key, const char *value, uint32_t ttl_ms) {
  ferry_http_reply r = {0};
  ferry_status st = perform(state, "PUT", key, value, ttl_ms, &r);
  free(r.data);
  return st;
}

static ferry_status http_get(void *state, const char *key, char **value) {
  ferry_http_reply r = {0};
  ferry_status st = perform(state, "GET", key, NULL, 0, &r);
  if (st != FERRY_OK) {
    free(r.data);
    return st;
  }
  if (!r.data && !(r.data = calloc(1, 1))) /* an empty 200 is an empty value */
    return ferry_fail(FERRY_ENOMEM, "metadata GET %s: out of memory", key);
  *value = r.data;
  return FERRY_OK;
}

static ferry_status http_del(void *state, const char *key) {
  ferry_http_reply r = {0};
  ferry_status st = perform(state, "DELETE", key, NULL, 0, &r);
  free(r.data);
  return st;
}

static void http_close(void *state) {
  http_store *s = state;
  ferry_httpc_destroy(s->pool);
  free(s->url);
  free(s);
}

static const ferry_metadata_ops http_ops = {
    .scheme = "http",
    .put = http_put,
    .get = http_get,
    .del = http_del,
    .close = http_close,
};

ferry_status ferry_metadata_http_open(const char *url, const ferry_metadata_options *opt,
                                      const ferry_metadata_ops **ops, void **state) {
  ferry_status st = ferry_httpc_global_init(url);
  if (st != FERRY_OK)
    return st;
  const char *host = strstr(url, "://") + 3;
  if (!*host || *host == '/' || *host == '?')
    return ferry_fail(FERRY_EINVAL, "metadata store \"%s\": no host in URL", url);

  http_store *s = calloc(1, sizeof *s);
  if (!s || !(s->url = strdup(url)) ||
      !(s->pool = ferry_httpc_create(opt->connect_timeout_ms,
                                     opt->connect_timeout_ms + FERRY_METADATA_ANSWER_MS))) {
    if (s)
      free(s->url);
    free(s);
    return ferry_fail(FERRY_ENOMEM, "metadata store \"%s\": out of memory", url);
  }
  *ops = &http_ops;
  *state = s;
  return FERRY_OK;
}
