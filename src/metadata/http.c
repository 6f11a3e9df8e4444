/* http.c - the http metadata backend: GET|PUT|DELETE <url>?key=<escaped key>
 * with libcurl, the protocol of Mooncake's http metadata server.
 *
 * Thread safety: a curl easy handle may be used by one thread at a time, so
 * the store keeps a small mutex-protected pool of idle handles. A call takes
 * one (or makes one), uses it alone, and puts it back; keeping handles alive
 * lets curl reuse the TCP connection to the server between calls. Timeouts
 * are short and bounded because an engine calls this on its control path. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "core/error.h"

#define POOL_MAX 8
#define CONNECT_TIMEOUT_MS 2000L
#define TOTAL_TIMEOUT_MS 5000L
/* A reply bigger than this is not a segment descriptor; refuse to buffer it. */
#define MAX_REPLY (256u << 20)

typedef struct http_store {
  char *url;
  pthread_mutex_t lock; /* guards idle[] and nidle */
  CURL *idle[POOL_MAX];
  int nidle;
} http_store;

/* A growing buffer for the reply body. */
typedef struct reply {
  char *data;
  size_t len, cap;
  int too_big;
} reply;

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;

/* curl_global_init is not thread-safe in older libcurl: run it exactly once. */
static void global_init(void) { global_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static CURL *take_handle(http_store *s) {
  CURL *c = NULL;
  pthread_mutex_lock(&s->lock);
  if (s->nidle > 0)
    c = s->idle[--s->nidle];
  pthread_mutex_unlock(&s->lock);
  if (c) {
    curl_easy_reset(c); /* drops options, keeps the live connection */
    return c;
  }
  return curl_easy_init();
}

static void give_handle(http_store *s, CURL *c) {
  pthread_mutex_lock(&s->lock);
  if (s->nidle < POOL_MAX) {
    s->idle[s->nidle++] = c;
    c = NULL;
  }
  pthread_mutex_unlock(&s->lock);
  if (c)
    curl_easy_cleanup(c);
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata) {
  reply *r = userdata;
  size_t n = size * nmemb;
  if (r->len + n + 1 > MAX_REPLY) {
    r->too_big = 1;
    return 0; /* makes curl abort with CURLE_WRITE_ERROR */
  }
  if (r->len + n + 1 > r->cap) {
    size_t cap = r->cap ? r->cap : 4096;
    while (cap < r->len + n + 1)
      cap *= 2;
    char *grown = realloc(r->data, cap);
    if (!grown)
      return 0;
    r->data = grown;
    r->cap = cap;
  }
  memcpy(r->data + r->len, ptr, n);
  r->len += n;
  r->data[r->len] = '\0';
  return n;
}

/* "<url>?key=<escaped>" or "<url>&key=<escaped>" when url has a query. */
static char *request_url(http_store *s, CURL *c, const char *key) {
  char *escaped = curl_easy_escape(c, key, 0);
  if (!escaped)
    return NULL;
  char sep = strchr(s->url, '?') ? '&' : '?';
  size_t n = strlen(s->url) + strlen(escaped) + 6;
  char *full = malloc(n);
  if (full)
    snprintf(full, n, "%s%ckey=%s", s->url, sep, escaped);
  curl_free(escaped);
  return full;
}

static void set_common_options(CURL *c, const char *url, reply *r) {
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* no SIGALRM in a threaded process */
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_TIMEOUT_MS);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, TOTAL_TIMEOUT_MS);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
}

/* Maps the outcome of one request to a status, setting the detail. */
static ferry_status outcome(const char *method, const char *url, const char *key, CURLcode rc,
                            long http, const reply *r) {
  if (rc != CURLE_OK) {
    if (r->too_big)
      return ferry_fail(FERRY_EMETADATA, "metadata %s %s failed: reply larger than %u MiB", method,
                        url, MAX_REPLY >> 20);
    return ferry_fail(FERRY_EMETADATA, "metadata %s %s failed: %s", method, url,
                      curl_easy_strerror(rc));
  }
  if (http >= 200 && http < 300)
    return FERRY_OK;
  if (http == 404 && strcmp(method, "PUT") != 0)
    return ferry_fail(FERRY_ENOTFOUND, "metadata key \"%s\" not found (%s %s: HTTP 404)", key,
                      method, url);
  return ferry_fail(FERRY_EMETADATA, "metadata %s %s: HTTP %ld", method, url, http);
}

/* Performs one request. body != NULL makes it carry that body (PUT). */
static ferry_status perform(http_store *s, const char *method, const char *key, const char *body,
                            reply *r) {
  CURL *c = take_handle(s);
  if (!c)
    return ferry_fail(FERRY_ENOMEM, "metadata %s %s: cannot create a curl handle", method, s->url);
  char *url = request_url(s, c, key);
  if (!url) {
    curl_easy_cleanup(c);
    return ferry_fail(FERRY_ENOMEM, "metadata %s %s: out of memory", method, s->url);
  }
  set_common_options(c, url, r);

  struct curl_slist *headers = NULL;
  if (strcmp(method, "GET") == 0) {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  }
  if (body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    headers = curl_slist_append(headers, "Content-Type: application/json");
    /* Without this curl waits up to 1 s for "100 Continue" on large bodies. */
    headers = curl_slist_append(headers, "Expect:");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  }

  CURLcode rc = curl_easy_perform(c);
  long http = 0;
  if (rc == CURLE_OK)
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
  ferry_status st = outcome(method, url, key, rc, http, r);

  curl_slist_free_all(headers);
  free(url);
  give_handle(s, c);
  return st;
}

static ferry_status http_put(void *state, const char *key, const char *value) {
  reply r = {0};
  ferry_status st = perform(state, "PUT", key, value, &r);
  free(r.data);
  return st;
}

static ferry_status http_get(void *state, const char *key, char **value) {
  reply r = {0};
  ferry_status st = perform(state, "GET", key, NULL, &r);
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
  reply r = {0};
  ferry_status st = perform(state, "DELETE", key, NULL, &r);
  free(r.data);
  return st;
}

static void http_close(void *state) {
  http_store *s = state;
  for (int i = 0; i < s->nidle; i++)
    curl_easy_cleanup(s->idle[i]);
  pthread_mutex_destroy(&s->lock);
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

ferry_status ferry_metadata_http_open(const char *url, const ferry_metadata_ops **ops,
                                      void **state) {
  pthread_once(&global_once, global_init);
  if (global_rc != CURLE_OK)
    return ferry_fail(FERRY_EMETADATA, "metadata store \"%s\": curl_global_init failed: %s", url,
                      curl_easy_strerror(global_rc));
  const char *host = strstr(url, "://") + 3;
  if (!*host || *host == '/' || *host == '?')
    return ferry_fail(FERRY_EINVAL, "metadata store \"%s\": no host in URL", url);

  http_store *s = calloc(1, sizeof *s);
  if (!s || !(s->url = strdup(url))) {
    free(s);
    return ferry_fail(FERRY_ENOMEM, "metadata store \"%s\": out of memory", url);
  }
  pthread_mutex_init(&s->lock, NULL);
  *ops = &http_ops;
  *state = s;
  return FERRY_OK;
}
