/* segment.c - segment descriptors in the metadata store, in Mooncake's keys
 * and JSON layout, so ferry and Mooncake peers can read each other's:
 *
 *   mooncake/rpc_meta/<name> = {"ip_or_host_name": host, "rpc_port": port}
 *   mooncake/ram/<name>      = {"name": name, "protocol": "tcp", "tcp_data_port": port,
 *                               "buffers": [{"name": "cpu:0", "addr": A, "length": L}]}
 *
 * 64-bit addresses in JSON: jansson's integers are long long. A value up to
 * INT64_MAX is written as itself (as Mooncake writes it). A larger one is
 * written as its two's-complement negative and read back by the inverse cast,
 * so every uint64 round-trips between ferry peers. Mooncake would write such a
 * value unsigned, which jansson refuses ("too big integer" -> FERRY_EJSON);
 * user-space addresses stay far below 2^63, so neither side makes them. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "base/error.h"

#define RPC_PREFIX "mooncake/rpc_meta/"
#define RAM_PREFIX "mooncake/ram/"
#define KEY_MAX 1024

/* ---- uint64 <-> json_int_t (see the top comment) ------------------------ */

static json_t *json_u64(uint64_t v) {
  if (v <= (uint64_t)INT64_MAX)
    return json_integer((json_int_t)v);
  /* v - 2^64 without an implementation-defined conversion: ~v <= INT64_MAX. */
  return json_integer(-(json_int_t)(~v) - 1);
}

static uint64_t u64_of_json(const json_t *j) {
  return (uint64_t)json_integer_value(j); /* signed -> unsigned is modulo 2^64 */
}

/* ---- keys ---------------------------------------------------------------- */

static ferry_status make_key(char *key, const char *prefix, const char *name) {
  if (!name || !*name)
    return ferry_fail(FERRY_EINVAL, "segment: empty segment name");
  int n = snprintf(key, KEY_MAX, "%s%s", prefix, name);
  if (n < 0 || n >= KEY_MAX)
    return ferry_fail(FERRY_EINVAL, "segment \"%.64s...\": name too long for a metadata key", name);
  return FERRY_OK;
}

/* Gets a key, turning "missing" into a detail that names the segment. */
static ferry_status get_key(ferry_metadata *md, const char *key, const char *name, char **value) {
  ferry_status st = ferry_metadata_get(md, key, value);
  if (st == FERRY_ENOTFOUND)
    return ferry_fail(FERRY_ENOTFOUND, "segment \"%s\" not found in the metadata store (key %s)",
                      name, key);
  return st;
}

/* Encodes obj compactly and stores it under key; takes ownership of obj. */
static ferry_status put_json(ferry_metadata *md, const char *key, json_t *obj) {
  char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
  json_decref(obj);
  if (!text)
    return ferry_fail(FERRY_EINVAL, "metadata key %s: cannot encode JSON (names must be UTF-8)",
                      key);
  ferry_status st = ferry_metadata_put(md, key, text);
  free(text);
  return st;
}

/* Parses text as a JSON object; the detail names the key. */
static ferry_status parse_object(const char *key, const char *text, json_t **out) {
  json_error_t err;
  json_t *root = json_loads(text, 0, &err);
  if (!root)
    return ferry_fail(FERRY_EJSON, "metadata key %s: malformed JSON: %s (line %d, column %d)", key,
                      err.text, err.line, err.column);
  if (!json_is_object(root)) {
    json_decref(root);
    return ferry_fail(FERRY_EJSON, "metadata key %s: expected a JSON object", key);
  }
  *out = root;
  return FERRY_OK;
}

/* Gets key (get_key) and parses its value as a JSON object (parse_object). */
static ferry_status get_object(ferry_metadata *md, const char *key, const char *name,
                               json_t **out) {
  char *text = NULL;
  ferry_status st = get_key(md, key, name, &text);
  if (st != FERRY_OK)
    return st;
  st = parse_object(key, text, out);
  free(text);
  return st;
}

static ferry_status bad_field(const char *key, const char *field, const char *want) {
  return ferry_fail(FERRY_EJSON, "metadata key %s: field \"%s\" missing or not %s", key, field,
                    want);
}

/* ---- publish ------------------------------------------------------------- */

static json_t *buffer_json(const ferry_region *r) {
  json_t *b = json_object();
  if (!b)
    return NULL;
  /* Mooncake names a host buffer by its location; ferry only has host memory. */
  if (json_object_set_new(b, "name", json_string("cpu:0")) ||
      json_object_set_new(b, "addr", json_u64(r->addr)) ||
      json_object_set_new(b, "length", json_u64(r->length))) {
    json_decref(b);
    return NULL;
  }
  return b;
}

/* jansson's *_set_new and *_append_new take ownership of the value even when
 * they fail, so only the containers built so far need releasing here. */
static json_t *ram_json(const char *name, uint16_t port, const ferry_region *regions,
                        size_t count) {
  json_t *ram = json_object();
  if (!ram || json_object_set_new(ram, "name", json_string(name)) ||
      json_object_set_new(ram, "protocol", json_string("tcp")) ||
      json_object_set_new(ram, "tcp_data_port", json_integer(port))) {
    json_decref(ram);
    return NULL;
  }
  json_t *buffers = json_array();
  for (size_t i = 0; buffers && i < count; i++)
    if (json_array_append_new(buffers, buffer_json(&regions[i]))) {
      json_decref(buffers);
      buffers = NULL;
    }
  if (!buffers || json_object_set_new(ram, "buffers", buffers)) {
    json_decref(ram);
    return NULL;
  }
  return ram;
}

ferry_status ferry_segment_publish_regions(ferry_metadata *md, const char *name, uint16_t port,
                                           const ferry_region *regions, size_t count) {
  char key[KEY_MAX];
  ferry_status st = make_key(key, RAM_PREFIX, name);
  if (st != FERRY_OK)
    return st;
  if (count && !regions)
    return ferry_fail(FERRY_EINVAL, "segment \"%s\": regions is NULL", name);
  return put_json(md, key, ram_json(name, port, regions, count));
}

ferry_status ferry_segment_publish(ferry_metadata *md, const char *name, const char *host,
                                   uint16_t port, const ferry_region *regions, size_t count) {
  char key[KEY_MAX];
  ferry_status st = make_key(key, RPC_PREFIX, name);
  if (st != FERRY_OK)
    return st;
  if (!host || !*host)
    return ferry_fail(FERRY_EINVAL, "segment \"%s\": empty host", name);
  /* The ram key first: once a peer can find us it can also see our buffers. */
  st = ferry_segment_publish_regions(md, name, port, regions, count);
  if (st != FERRY_OK)
    return st;
  json_t *rpc = json_object();
  if (rpc && (json_object_set_new(rpc, "ip_or_host_name", json_string(host)) ||
              json_object_set_new(rpc, "rpc_port", json_integer(port)))) {
    json_decref(rpc);
    rpc = NULL;
  }
  return put_json(md, key, rpc);
}

ferry_status ferry_segment_unpublish(ferry_metadata *md, const char *name) {
  char rpc_key[KEY_MAX], ram_key[KEY_MAX];
  ferry_status st = make_key(rpc_key, RPC_PREFIX, name);
  if (st == FERRY_OK)
    st = make_key(ram_key, RAM_PREFIX, name);
  if (st != FERRY_OK)
    return st;
  /* rpc_meta first so peers stop finding us; an absent key is already done.
   * Both deletes are tried; the first real failure is reported. */
  ferry_status a = ferry_metadata_delete(md, rpc_key);
  char detail[FERRY_ERROR_MAX];
  snprintf(detail, sizeof detail, "%s", ferry_last_error());
  ferry_status b = ferry_metadata_delete(md, ram_key);
  if (a != FERRY_OK && a != FERRY_ENOTFOUND) {
    ferry_error_set_detail(detail);
    return a;
  }
  return b == FERRY_ENOTFOUND ? FERRY_OK : b;
}

/* ---- last known addresses ------------------------------------------------ */

/* Where each segment looked up through this handle was last seen, so that a
 * store outage does not cut off peers already known (see metadata.h). Only
 * read when the store cannot answer; a lookup that succeeds refreshes it. */
struct ferry_seg_cache {
  struct ferry_seg_cache *next;
  char *name;
  char host[256];
  uint16_t port;
};

static ferry_seg_cache *cache_find(ferry_metadata *md, const char *name) {
  ferry_seg_cache *c = md->cache;
  while (c && strcmp(c->name, name) != 0)
    c = c->next;
  return c;
}

static void cache_store(ferry_metadata *md, const char *name, const char *host, uint16_t port) {
  if (strlen(host) >= sizeof md->cache->host)
    return;
  pthread_mutex_lock(&md->cache_lock);
  ferry_seg_cache *c = cache_find(md, name);
  if (!c && (c = calloc(1, sizeof *c)) != NULL) {
    if ((c->name = strdup(name)) != NULL) {
      c->next = md->cache;
      md->cache = c;
    } else {
      free(c);
      c = NULL;
    }
  }
  if (c) {
    snprintf(c->host, sizeof c->host, "%s", host);
    c->port = port;
  }
  pthread_mutex_unlock(&md->cache_lock);
}

/* 1 when name was seen before (host and port filled), else 0. */
static int cache_load(ferry_metadata *md, const char *name, char *host, size_t host_size,
                      uint16_t *port) {
  pthread_mutex_lock(&md->cache_lock);
  ferry_seg_cache *c = cache_find(md, name);
  int found = c && strlen(c->host) < host_size;
  if (found) {
    snprintf(host, host_size, "%s", c->host);
    *port = c->port;
  }
  pthread_mutex_unlock(&md->cache_lock);
  return found;
}

void ferry_segment_cache_free(ferry_metadata *md) {
  while (md->cache) {
    ferry_seg_cache *c = md->cache;
    md->cache = c->next;
    free(c->name);
    free(c);
  }
}

/* ---- lookup -------------------------------------------------------------- */

ferry_status ferry_segment_lookup(ferry_metadata *md, const char *name, char *host,
                                  size_t host_size, uint16_t *port) {
  char key[KEY_MAX];
  ferry_status st = make_key(key, RPC_PREFIX, name);
  if (st != FERRY_OK)
    return st;
  if (!host || !host_size || !port)
    return ferry_fail(FERRY_EINVAL, "segment \"%s\" lookup: NULL output", name);

  json_t *root = NULL;
  if ((st = get_object(md, key, name, &root)) != FERRY_OK) {
    if (st == FERRY_EMETADATA && cache_load(md, name, host, host_size, port))
      return FERRY_OK; /* the store is down: the last address we saw */
    return st;
  }

  json_t *h = json_object_get(root, "ip_or_host_name");
  json_t *p = json_object_get(root, "rpc_port");
  if (!json_is_string(h) || !*json_string_value(h))
    st = bad_field(key, "ip_or_host_name", "a non-empty string");
  else if (!json_is_integer(p) || json_integer_value(p) < 1 || json_integer_value(p) > 65535)
    st = bad_field(key, "rpc_port", "an integer in 1..65535");
  else if (strlen(json_string_value(h)) >= host_size) /* a cut name is a wrong host */
    st = ferry_fail(FERRY_EINVAL, "segment \"%s\": host \"%s\" longer than %zu bytes", name,
                    json_string_value(h), host_size - 1);
  else {
    snprintf(host, host_size, "%s", json_string_value(h));
    *port = (uint16_t)json_integer_value(p);
    cache_store(md, name, host, *port);
  }
  json_decref(root);
  return st;
}

static int by_addr(const void *a, const void *b) {
  uint64_t x = ((const ferry_region *)a)->addr, y = ((const ferry_region *)b)->addr;
  return (x > y) - (x < y);
}

/* Fills out[] from the "buffers" array; the detail names the bad entry. */
static ferry_status read_buffers(const char *key, json_t *buffers, ferry_region *out) {
  size_t i;
  json_t *b;
  json_array_foreach(buffers, i, b) {
    json_t *addr = json_object_get(b, "addr");
    json_t *len = json_object_get(b, "length");
    if (!json_is_integer(addr) || !json_is_integer(len))
      return ferry_fail(FERRY_EJSON,
                        "metadata key %s: buffers[%zu] lacks integer \"addr\" and \"length\"", key,
                        i);
    out[i].addr = u64_of_json(addr);
    out[i].length = u64_of_json(len);
  }
  return FERRY_OK;
}

ferry_status ferry_segment_lookup_regions(ferry_metadata *md, const char *name,
                                          ferry_region **regions, size_t *count) {
  char key[KEY_MAX];
  ferry_status st = make_key(key, RAM_PREFIX, name);
  if (st != FERRY_OK)
    return st;
  if (!regions || !count)
    return ferry_fail(FERRY_EINVAL, "segment \"%s\" regions: NULL output", name);
  *regions = NULL;
  *count = 0;

  json_t *root = NULL;
  if ((st = get_object(md, key, name, &root)) != FERRY_OK)
    return st;

  json_t *buffers = json_object_get(root, "buffers");
  size_t n = json_array_size(buffers);
  ferry_region *list = NULL;
  if (!json_is_array(buffers))
    st = bad_field(key, "buffers", "an array");
  else if (n && !(list = calloc(n, sizeof *list)))
    st = ferry_fail(FERRY_ENOMEM, "metadata key %s: out of memory for %zu buffers", key, n);
  else
    st = read_buffers(key, buffers, list);
  json_decref(root);
  if (st != FERRY_OK) {
    free(list);
    return st;
  }
  if (n > 1)
    qsort(list, n, sizeof *list, by_addr);
  *regions = list;
  *count = n;
  return FERRY_OK;
}
