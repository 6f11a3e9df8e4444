/* httpc.h - the libcurl plumbing shared by the http and etcd backends: a
 * pool of easy handles (so connections to the store are reused) and one
 * bounded request with a size-capped reply body. */
#ifndef FERRY_METADATA_HTTPC_H
#define FERRY_METADATA_HTTPC_H

#include <curl/curl.h>
#include <stddef.h>

#include "ferry.h"

typedef struct ferry_httpc ferry_httpc;

typedef struct ferry_http_reply ferry_http_reply;
struct ferry_http_reply {
  char *data; /* NUL-terminated body, malloc'd; NULL when empty */
  size_t len, cap;
  int too_big;
  long code; /* HTTP status, 0 when no answer came */
  /* In: bounds this request instead of the pool's total_ms (0: the pool's). */
  long timeout_ms;
  /* In, for a streamed reply (an etcd watch): called after each piece with
   * the body so far; nonzero ends the request there, with `stopped` set
   * (curl's result is then CURLE_WRITE_ERROR). */
  int (*enough)(const struct ferry_http_reply *r, void *arg);
  void *enough_arg;
  int stopped;
};

/* Loads libcurl and runs curl_global_init, once; FERRY_OK, FERRY_ENOTIMPL
 * (no libcurl here) or FERRY_EMETADATA naming url. Before any call below. */
ferry_status ferry_httpc_global_init(const char *url);
/* connect_ms bounds connecting, total_ms the whole request. NULL: no memory. */
ferry_httpc *ferry_httpc_create(long connect_ms, long total_ms);
void ferry_httpc_destroy(ferry_httpc *h);
/* One request. body != NULL sends it (content_type names it). The reply is
 * filled even on failure; the caller frees r->data. */
CURLcode ferry_httpc_perform(ferry_httpc *h, const char *method, const char *url, const char *body,
                             const char *content_type, ferry_http_reply *r);
/* curl_easy_strerror. */
const char *ferry_httpc_strerror(CURLcode rc);
/* text URL-escaped, malloc'd; NULL: no memory. */
char *ferry_httpc_escape(const char *text);
/* The largest reply body accepted, in MiB (for messages). */
unsigned ferry_httpc_max_reply_mib(void);

#endif
