/* httpc.c - libcurl requests for the metadata backends (see httpc.h).
 *
 * Thread safety: a curl easy handle may be used by one thread at a time, so
 * the pool keeps a few idle handles under a mutex. A request takes one (or
 * makes one), uses it alone and puts it back; keeping handles alive lets
 * curl reuse the TCP connection to the store between calls.
 *
 * libcurl is loaded by the first ferry_httpc_global_init (base/library.h),
 * so a host without it keeps every feature but these two stores. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/library.h"
#include "httpc.h"

#define POOL_MAX 8
/* A reply bigger than this is not a segment descriptor; refuse to buffer it. */
#define MAX_REPLY (256u << 20)

struct ferry_httpc {
  pthread_mutex_t lock; /* guards idle[] and nidle */
  CURL *idle[POOL_MAX];
  int nidle;
  long connect_ms, total_ms;
};

/* The libcurl calls ferry makes, typed by curl's own header. */
static struct {
  __typeof__(curl_global_init) *global_init;
  __typeof__(curl_easy_init) *easy_init;
  __typeof__(curl_easy_cleanup) *easy_cleanup;
  __typeof__(curl_easy_reset) *easy_reset;
  __typeof__(curl_easy_setopt) *easy_setopt;
  __typeof__(curl_easy_perform) *easy_perform;
  __typeof__(curl_easy_getinfo) *easy_getinfo;
  __typeof__(curl_easy_strerror) *easy_strerror;
  __typeof__(curl_easy_escape) *easy_escape;
  __typeof__(curl_free) *free;
  __typeof__(curl_slist_append) *slist_append;
  __typeof__(curl_slist_free_all) *slist_free_all;
} curl;

#define SYMBOL(name) FERRY_LIBRARY_SYMBOL(__typeof__(curl), name, "curl_" #name, NULL)
static const ferry_library_symbol curl_symbols[] = {
    SYMBOL(global_init), SYMBOL(easy_init),    SYMBOL(easy_cleanup), SYMBOL(easy_reset),
    SYMBOL(easy_setopt), SYMBOL(easy_perform), SYMBOL(easy_getinfo), SYMBOL(easy_strerror),
    SYMBOL(easy_escape), SYMBOL(free),         SYMBOL(slist_append), SYMBOL(slist_free_all),
};

static ferry_library curl_library =
    FERRY_LIBRARY("libcurl.so.4", "libcurl4",
                  "the http and etcd metadata stores (http://, etcd:// URLs)", curl_symbols, curl);

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;

/* curl_global_init is not thread-safe in older libcurl: run it exactly once. */
static void global_init(void) { global_rc = curl.global_init(CURL_GLOBAL_DEFAULT); }

ferry_status ferry_httpc_global_init(const char *url) {
  ferry_status st = ferry_library_load(&curl_library);
  if (st != FERRY_OK)
    return st;
  pthread_once(&global_once, global_init);
  if (global_rc != CURLE_OK)
    return ferry_fail(FERRY_EMETADATA, "metadata store \"%s\": curl_global_init failed: %s", url,
                      curl.easy_strerror(global_rc));
  return FERRY_OK;
}

const char *ferry_httpc_strerror(CURLcode rc) { return curl.easy_strerror(rc); }

char *ferry_httpc_escape(const char *text) {
  char *escaped = curl.easy_escape(NULL, text, 0);
  char *copy = escaped ? strdup(escaped) : NULL;
  curl.free(escaped);
  return copy;
}

unsigned ferry_httpc_max_reply_mib(void) { return MAX_REPLY >> 20; }

ferry_httpc *ferry_httpc_create(long connect_ms, long total_ms) {
  ferry_httpc *h = calloc(1, sizeof *h);
  if (!h)
    return NULL;
  pthread_mutex_init(&h->lock, NULL);
  h->connect_ms = connect_ms;
  h->total_ms = total_ms;
  return h;
}

void ferry_httpc_destroy(ferry_httpc *h) {
  if (!h)
    return;
  for (int i = 0; i < h->nidle; i++)
    curl.easy_cleanup(h->idle[i]);
  pthread_mutex_destroy(&h->lock);
  free(h);
}

static CURL *take_handle(ferry_httpc *h) {
  CURL *c = NULL;
  pthread_mutex_lock(&h->lock);
  if (h->nidle > 0)
    c = h->idle[--h->nidle];
  pthread_mutex_unlock(&h->lock);
  if (c) {
    curl.easy_reset(c); /* drops options, keeps the live connection */
    return c;
  }
  return curl.easy_init();
}

static void give_handle(ferry_httpc *h, CURL *c) {
  pthread_mutex_lock(&h->lock);
  if (h->nidle < POOL_MAX) {
    h->idle[h->nidle++] = c;
    c = NULL;
  }
  pthread_mutex_unlock(&h->lock);
  if (c)
    curl.easy_cleanup(c);
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata) {
  ferry_http_reply *r = userdata;
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
  if (r->enough && r->enough(r, r->enough_arg)) {
    r->stopped = 1;
    return 0;
  }
  return n;
}

CURLcode ferry_httpc_perform(ferry_httpc *h, const char *method, const char *url, const char *body,
                             const char *content_type, ferry_http_reply *r) {
  CURL *c = take_handle(h);
  if (!c)
    return CURLE_OUT_OF_MEMORY;
  curl.easy_setopt(c, CURLOPT_URL, url);
  curl.easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* no SIGALRM in a threaded process */
  curl.easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, h->connect_ms);
  curl.easy_setopt(c, CURLOPT_TIMEOUT_MS, r->timeout_ms ? r->timeout_ms : h->total_ms);
  curl.easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl.easy_setopt(c, CURLOPT_WRITEDATA, r);
  if (strcmp(method, "GET") == 0)
    curl.easy_setopt(c, CURLOPT_HTTPGET, 1L);
  else
    curl.easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);

  struct curl_slist *headers = NULL;
  if (body) {
    char type[128];
    snprintf(type, sizeof type, "Content-Type: %s", content_type);
    curl.easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl.easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    headers = curl.slist_append(headers, type);
    /* Without this curl waits up to 1 s for "100 Continue" on large bodies. */
    headers = curl.slist_append(headers, "Expect:");
    curl.easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  }
  CURLcode rc = curl.easy_perform(c);
  r->code = 0;
  if (rc == CURLE_OK)
    curl.easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->code);
  curl.slist_free_all(headers);
  give_handle(h, c);
  return rc;
}
