/* etcd.c - the etcd metadata backend, through the JSON gateway that etcd
 * 3.4 serves at /v3/ (Debian 12's etcd-server is 3.4.23), with libcurl.
 * Debian ships no C gRPC client for etcd, and the gateway needs nothing
 * beyond the libcurl and jansson ferry already links.
 *
 * Keys and values travel base64-encoded, as the gateway wants. Leased keys
 * hang on one lease per store handle (granted at the first leased put, kept
 * alive by the lease keeper's refresh; when etcd lost it, a new one is
 * granted and the keys put again). etcd rounds a ttl up to whole seconds and
 * to its own minimum (2 s with the default election timeout).
 *
 * "etcd://h1:p1,h2:p2" lists cluster members: a request goes to the member
 * that answered last and, when that one cannot be reached or answers 5xx,
 * to the next, so one member down costs one refused connection. */
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend.h"
#include "base/error.h"
#include "etcd.h"
#include "httpc.h"

#define MAX_ENDPOINTS 16

typedef struct etcd_store {
  char url[512];
  char *endpoints[MAX_ENDPOINTS]; /* "http://host:port" */
  int count;
  int current; /* the member that answered last (atomic) */
  ferry_httpc *pool;
  pthread_mutex_t lease_lock; /* guards lease_id */
  long long lease_id;         /* 0: none granted (or etcd lost it) */
} etcd_store;

/* ---- base64 (OpenSSL's, already linked for the handshake) ---------------- */

static char *b64_encode(const char *in) {
  size_t n = strlen(in);
  char *out = malloc(4 * ((n + 2) / 3) + 1);
  if (out)
    EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)in, (int)n);
  return out;
}

/* NULL when in is not base64 (or no memory). */
static char *b64_decode(const char *in) {
  size_t n = strlen(in);
  if (n % 4)
    return NULL;
  char *out = malloc(n / 4 * 3 + 1);
  int len = out ? EVP_DecodeBlock((unsigned char *)out, (const unsigned char *)in, (int)n) : -1;
  if (len < 0) {
    free(out);
    return NULL;
  }
  for (size_t i = n; i > 0 && in[i - 1] == '='; i--)
    len--; /* DecodeBlock counts the padding as zero bytes */
  out[len] = '\0';
  return out;
}

/* ---- requests ------------------------------------------------------------ */

/* The gateway's error message ({"error": ..., "message": ...}), or "". */
static const char *gateway_message(const json_t *reply) {
  const char *m = json_string_value(json_object_get(reply, "message"));
  if (!m)
    m = json_string_value(json_object_get(reply, "error"));
  return m ? m : "";
}

/* One attempt at one member: FERRY_OK with *out, or the detail. *retry says
 * whether another member might do better. */
static ferry_status call_member(etcd_store *s, int i, const char *path, const char *body,
                                json_t **out, int *retry) {
  char url[512];
  snprintf(url, sizeof url, "%s/v3/%s", s->endpoints[i], path);
  ferry_http_reply r = {0};
  CURLcode rc = ferry_httpc_perform(s->pool, "POST", url, body, "application/json", &r);
  json_t *reply = rc == CURLE_OK && r.data ? json_loads(r.data, 0, NULL) : NULL;
  free(r.data);
  ferry_status st = FERRY_OK;
  *retry = 0;
  if (rc != CURLE_OK) {
    *retry = 1;
    st = ferry_fail(FERRY_EMETADATA, "metadata %s (%s): %s", s->url, url, ferry_httpc_strerror(rc));
  } else if (r.code >= 500) {
    *retry = 1;
    st = ferry_fail(FERRY_EMETADATA, "metadata %s (%s): HTTP %ld %s", s->url, url, r.code,
                    gateway_message(reply));
  } else if (r.code != 200 || !json_is_object(reply)) {
    const char *m = gateway_message(reply);
    st = ferry_fail(strstr(m, "lease not found") ? FERRY_ENOTFOUND : FERRY_EMETADATA,
                    "metadata %s (%s): HTTP %ld %s", s->url, url, r.code,
                    reply ? m : "(not a JSON object)");
  }
  if (st != FERRY_OK) {
    json_decref(reply);
    return st;
  }
  *out = reply;
  return FERRY_OK;
}

/* POSTs req (consumed) to /v3/<path> on the first member that answers. */
static ferry_status call(etcd_store *s, const char *path, json_t *req, json_t **out) {
  char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
  json_decref(req);
  if (!body)
    return ferry_fail(FERRY_ENOMEM, "metadata %s %s: out of memory", s->url, path);
  int first = __atomic_load_n(&s->current, __ATOMIC_RELAXED);
  ferry_status st = FERRY_EMETADATA;
  for (int k = 0; k < s->count; k++) {
    int i = (first + k) % s->count, retry;
    st = call_member(s, i, path, body, out, &retry);
    if (st == FERRY_OK)
      __atomic_store_n(&s->current, i, __ATOMIC_RELAXED);
    if (!retry)
      break;
  }
  free(body);
  return st;
}

/* {"key": base64(key)} plus value/lease when given. */
static json_t *key_request(const char *key, const char *value, long long lease) {
  char *k = b64_encode(key), *v = value ? b64_encode(value) : NULL;
  json_t *req = k && (v || !value) ? json_object() : NULL;
  if (req && json_object_set_new(req, "key", json_string(k)))
    json_decref(req), req = NULL;
  if (req && v && json_object_set_new(req, "value", json_string(v)))
    json_decref(req), req = NULL;
  char id[24];
  snprintf(id, sizeof id, "%lld", lease);
  if (req && lease && json_object_set_new(req, "lease", json_string(id)))
    json_decref(req), req = NULL;
  free(k);
  free(v);
  return req;
}

/* An int64 the gateway sends as a string ("123"); 0 when absent. */
static long long int64_field(const json_t *obj, const char *name) {
  const json_t *v = json_object_get(obj, name);
  if (json_is_string(v))
    return strtoll(json_string_value(v), NULL, 10);
  return json_is_integer(v) ? json_integer_value(v) : 0;
}

/* ---- leases -------------------------------------------------------------- */

/* The lease to put under, granting one if there is none; lease_lock held. */
static ferry_status ensure_lease(etcd_store *s, uint32_t ttl_ms) {
  if (s->lease_id)
    return FERRY_OK;
  json_t *req = json_pack("{s:I}", "TTL", (json_int_t)((ttl_ms + 999) / 1000));
  json_t *reply = NULL;
  ferry_status st = call(s, "lease/grant", req, &reply);
  if (st != FERRY_OK)
    return st;
  s->lease_id = int64_field(reply, "ID");
  json_decref(reply);
  if (!s->lease_id)
    return ferry_fail(FERRY_EMETADATA, "metadata %s: lease grant answered no lease ID", s->url);
  return FERRY_OK;
}

static ferry_status etcd_refresh(void *state, uint32_t ttl_ms) {
  etcd_store *s = state;
  pthread_mutex_lock(&s->lease_lock);
  ferry_status st = FERRY_ENOTFOUND;
  json_t *reply = NULL;
  if (s->lease_id) {
    char id[24];
    snprintf(id, sizeof id, "%lld", s->lease_id);
    st = call(s, "lease/keepalive", json_pack("{s:s}", "ID", id), &reply);
  }
  /* A lease etcd no longer has comes back with no TTL. */
  if (st == FERRY_OK && int64_field(json_object_get(reply, "result"), "TTL") <= 0)
    st = FERRY_ENOTFOUND;
  if (st == FERRY_ENOTFOUND)
    s->lease_id = 0;
  pthread_mutex_unlock(&s->lease_lock);
  json_decref(reply);
  return st;
}

/* ---- key operations ------------------------------------------------------ */

static ferry_status etcd_put(void *state, const char *key, const char *value, uint32_t ttl_ms) {
  etcd_store *s = state;
  pthread_mutex_lock(&s->lease_lock);
  ferry_status st = FERRY_OK;
  for (int attempt = 0; attempt < 2; attempt++) {
    if (ttl_ms && (st = ensure_lease(s, ttl_ms)) != FERRY_OK)
      break;
    json_t *reply = NULL;
    st = call(s, "kv/put", key_request(key, value, ttl_ms ? s->lease_id : 0), &reply);
    json_decref(reply);
    if (st != FERRY_ENOTFOUND)
      break;
    s->lease_id = 0; /* etcd dropped our lease: grant a new one, once */
  }
  pthread_mutex_unlock(&s->lease_lock);
  return st == FERRY_ENOTFOUND ? FERRY_EMETADATA : st;
}

static ferry_status etcd_get(void *state, const char *key, char **value) {
  etcd_store *s = state;
  json_t *reply = NULL;
  ferry_status st = call(s, "kv/range", key_request(key, NULL, 0), &reply);
  if (st != FERRY_OK)
    return st;
  json_t *kv = json_array_get(json_object_get(reply, "kvs"), 0);
  const json_t *v = json_object_get(kv, "value");
  if (!kv)
    st = ferry_fail(FERRY_ENOTFOUND, "metadata key \"%s\" not found (%s)", key, s->url);
  else if (!v) /* etcd leaves an empty value out */
    st = (*value = calloc(1, 1)) ? FERRY_OK
                                 : ferry_fail(FERRY_ENOMEM, "metadata GET %s: out of memory", key);
  else if (!json_is_string(v) || !(*value = b64_decode(json_string_value(v))))
    st = ferry_fail(FERRY_EJSON, "metadata key \"%s\" at %s: value is not base64", key, s->url);
  json_decref(reply);
  return st;
}

/* {"compare": [key's lease == lease], "success": [delete key]}. */
static json_t *delete_if_ours(const char *key, long long lease) {
  json_t *del = key_request(key, NULL, 0);
  json_t *cmp = key_request(key, NULL, lease);
  if (cmp && json_object_set_new(cmp, "target", json_string("LEASE")))
    json_decref(cmp), cmp = NULL;
  if (!del || !cmp) {
    json_decref(del);
    json_decref(cmp);
    return NULL;
  }
  return json_pack("{s:[o],s:[{s:o}]}", "compare", cmp, "success", "requestDeleteRange", del);
}

/* A handle with a lease deletes a key only while it still hangs on that
 * lease: an engine that restarted under the same segment name has moved the
 * keys to its own lease, and the old one's shutdown must not remove them. */
static ferry_status etcd_del(void *state, const char *key) {
  etcd_store *s = state;
  pthread_mutex_lock(&s->lease_lock);
  long long lease = s->lease_id;
  pthread_mutex_unlock(&s->lease_lock);
  json_t *reply = NULL, *deleted = NULL;
  ferry_status st;
  if (lease) {
    st = call(s, "kv/txn", delete_if_ours(key, lease), &reply);
    json_t *first = json_array_get(json_object_get(reply, "responses"), 0);
    deleted = json_object_get(first, "response_delete_range");
  } else {
    st = call(s, "kv/deleterange", key_request(key, NULL, 0), &reply);
    deleted = reply;
  }
  if (st == FERRY_OK && int64_field(deleted, "deleted") == 0)
    st = ferry_fail(FERRY_ENOTFOUND, "metadata key \"%s\" not found%s (%s)", key,
                    lease ? " under this engine's lease" : "", s->url);
  json_decref(reply);
  return st;
}

static void etcd_close(void *state) {
  etcd_store *s = state;
  for (int i = 0; i < s->count; i++)
    free(s->endpoints[i]);
  ferry_httpc_destroy(s->pool);
  pthread_mutex_destroy(&s->lease_lock);
  free(s);
}

static const ferry_metadata_ops etcd_ops = {
    .scheme = "etcd",
    .put = etcd_put,
    .get = etcd_get,
    .del = etcd_del,
    .refresh = etcd_refresh,
    .close = etcd_close,
};

/* "h:p,h2:p2" -> endpoints[] "http://h:p". */
static ferry_status parse_endpoints(etcd_store *s, const char *list) {
  for (const char *p = list; *p;) {
    size_t n = strcspn(p, ",");
    if (n == 0 || memchr(p, '/', n) || s->count == MAX_ENDPOINTS)
      return ferry_fail(FERRY_EINVAL,
                        "metadata store \"%s\": expected etcd://host:port[,host:port...] (at most "
                        "%d members)",
                        s->url, MAX_ENDPOINTS);
    if (asprintf(&s->endpoints[s->count], "http://%.*s", (int)n, p) < 0)
      return ferry_fail(FERRY_ENOMEM, "metadata store %s: out of memory", s->url);
    s->count++;
    p += n + (p[n] == ',');
  }
  if (!s->count)
    return ferry_fail(FERRY_EINVAL, "metadata store \"%s\": no etcd endpoint", s->url);
  return FERRY_OK;
}

ferry_status ferry_metadata_etcd_open(const char *url, const ferry_metadata_options *opt,
                                      const ferry_metadata_ops **ops, void **state) {
  ferry_status st = ferry_httpc_global_init(url);
  if (st != FERRY_OK)
    return st;
  etcd_store *s = calloc(1, sizeof *s);
  if (!s)
    return ferry_fail(FERRY_ENOMEM, "metadata store: out of memory");
  pthread_mutex_init(&s->lease_lock, NULL);
  snprintf(s->url, sizeof s->url, "%s", url);
  const char *list = strncasecmp(url, "etcd://", 7) == 0 ? url + 7 : url;
  st = parse_endpoints(s, list);
  if (st == FERRY_OK &&
      !(s->pool = ferry_httpc_create(opt->connect_timeout_ms,
                                     opt->connect_timeout_ms + FERRY_METADATA_ANSWER_MS)))
    st = ferry_fail(FERRY_ENOMEM, "metadata store %s: out of memory", url);
  if (st != FERRY_OK) {
    etcd_close(s);
    return st;
  }
  *ops = &etcd_ops;
  *state = s;
  return FERRY_OK;
}

/* ---- for election.c (etcd.h) --------------------------------------------- */

ferry_status ferry_etcd_call(void *state, const char *path, json_t *req, json_t **out) {
  return call(state, path, req, out);
}

/* A watch's reply so far tells of a change of the key: an event, or the
 * watch cancelled (its start compacted away: the caller reads again). */
static int watch_saw_change(const ferry_http_reply *r, void *arg) {
  (void)arg;
  return strstr(r->data, "\"events\"") || strstr(r->data, "\"canceled\"");
}

ferry_status ferry_etcd_watch(void *state, const char *key, long long after, long wait_ms) {
  etcd_store *s = state;
  json_t *req = key_request(key, NULL, 0);
  char rev[24];
  snprintf(rev, sizeof rev, "%lld", after + 1);
  char *body = NULL;
  if (req && !json_object_set_new(req, "start_revision", json_string(rev))) {
    json_t *watch = json_pack("{s:O}", "create_request", req);
    body = watch ? json_dumps(watch, JSON_COMPACT) : NULL;
    json_decref(watch);
  }
  json_decref(req);
  if (!body)
    return ferry_fail(FERRY_ENOMEM, "metadata %s watch: out of memory", s->url);
  char url[512];
  snprintf(url, sizeof url, "%s/v3/watch",
           s->endpoints[__atomic_load_n(&s->current, __ATOMIC_RELAXED)]);
  ferry_http_reply r = {.timeout_ms = wait_ms, .enough = watch_saw_change};
  CURLcode rc = ferry_httpc_perform(s->pool, "POST", url, body, "application/json", &r);
  free(body);
  free(r.data);
  if (r.stopped)
    return FERRY_OK;
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return ferry_fail(FERRY_ETIMEDOUT, "metadata %s (%s): no change of the key in %ld ms", s->url,
                      url, wait_ms);
  return ferry_fail(FERRY_EMETADATA, "metadata %s (%s): %s", s->url, url,
                    rc == CURLE_OK ? "the watch ended" : ferry_httpc_strerror(rc));
}

json_t *ferry_etcd_key_request(const char *key, const char *value, long long lease) {
  return key_request(key, value, lease);
}

long long ferry_etcd_int64(const json_t *obj, const char *name) { return int64_field(obj, name); }

char *ferry_etcd_b64_decode(const char *in) { return b64_decode(in); }
