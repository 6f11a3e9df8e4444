/* etcd.h - what etcd.c lends to election.c (the store master's leader
 * election): one JSON-gateway request on an etcd handle that
 * ferry_metadata_etcd_open made, with its member failover, and the request
 * pieces in the gateway's encoding. */
#ifndef FERRY_METADATA_ETCD_H
#define FERRY_METADATA_ETCD_H

#include <jansson.h>

#include "ferry.h"

/* POSTs req (consumed) to /v3/<path>; *out the reply object. */
ferry_status ferry_etcd_call(void *state, const char *path, json_t *req, json_t **out);
/* Watches key from revision after + 1 (on the member that answered last):
 * FERRY_OK once it changed (put, delete, or the watch cancelled),
 * FERRY_ETIMEDOUT when nothing changed within wait_ms, else
 * FERRY_EMETADATA naming the member. */
ferry_status ferry_etcd_watch(void *state, const char *key, long long after, long wait_ms);
/* {"key": base64(key)}, plus "value" and "lease" when given (NULL, 0: none). */
json_t *ferry_etcd_key_request(const char *key, const char *value, long long lease);
/* An int64 field the gateway sends as a string; 0 when absent. */
long long ferry_etcd_int64(const json_t *obj, const char *name);
/* A base64 value decoded, malloc'd and NUL-terminated; NULL when not base64. */
char *ferry_etcd_b64_decode(const char *in);

#endif
