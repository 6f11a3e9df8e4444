/* election.c - the leader election of election.h on etcd's JSON gateway
 * (etcd.c's requests). The leader key hangs on a lease of the leader's: a
 * leader that dies stops refreshing it and etcd deletes the key a ttl after
 * the last refresh. A candidate writes the key in a transaction whose
 * condition is that the key does not exist (create revision 0), so two
 * candidates racing for a free key cannot both win. */
#include "metadata/election.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "base/clock.h"
#include "base/error.h"
#include "etcd.h"

struct ferry_election {
  const ferry_metadata_ops *ops;
  void *etcd;
  char *key;
  uint32_t ttl_s;
  long long lease; /* 0: not leading (atomic: the journal's writers read it) */
  long long seen;  /* etcd's revision at the last read of the key (the campaigning thread's) */
};

ferry_status ferry_election_open(const char *endpoints, const char *key, uint32_t ttl_s,
                                 ferry_election **out) {
  ferry_election *e = calloc(1, sizeof *e);
  char *url = NULL;
  if (!e || asprintf(&url, "etcd://%s", endpoints) < 0 || !(e->key = strdup(key))) {
    if (e)
      free(e->key);
    free(e);
    return ferry_fail(FERRY_ENOMEM, "leader election: out of memory");
  }
  for (char *p = url; *p; p++)
    if (*p == ';')
      *p = ',';
  e->ttl_s = ttl_s ? ttl_s : 5;
  ferry_metadata_options opt = {.connect_timeout_ms = 1000};
  ferry_status st = ferry_metadata_etcd_open(url, &opt, &e->ops, &e->etcd);
  free(url);
  if (st) {
    free(e->key);
    free(e);
    return st;
  }
  *out = e;
  return FERRY_OK;
}

/* The value of the first kv in a range reply (malloc'd); NULL when none. */
static char *first_value(const json_t *range, long long *lease) {
  json_t *kv = json_array_get(json_object_get(range, "kvs"), 0);
  if (!kv)
    return NULL;
  if (lease)
    *lease = ferry_etcd_int64(kv, "lease");
  const char *v = json_string_value(json_object_get(kv, "value"));
  char *value = v ? ferry_etcd_b64_decode(v) : strdup("");
  return value ? value : strdup("(not base64)");
}

/* The key's holder: FERRY_OK with *value (NULL: absent) and *lease. */
static ferry_status read_key(ferry_election *e, char **value, long long *lease) {
  json_t *reply = NULL;
  ferry_status st =
      ferry_etcd_call(e->etcd, "kv/range", ferry_etcd_key_request(e->key, NULL, 0), &reply);
  *value = st ? NULL : first_value(reply, lease);
  if (!st)
    e->seen = ferry_etcd_int64(json_object_get(reply, "header"), "revision");
  json_decref(reply);
  return st;
}

static void revoke(ferry_election *e, long long lease) {
  char id[24];
  snprintf(id, sizeof id, "%lld", lease);
  json_t *reply = NULL;
  ferry_etcd_call(e->etcd, "kv/lease/revoke", json_pack("{s:s}", "ID", id), &reply);
  json_decref(reply);
}

/* {"compare": [create_revision(key) == 0], "success": [put key=value
 * under lease], "failure": [range key]}. */
static json_t *put_if_absent(const char *key, const char *value, long long lease) {
  json_t *cmp = ferry_etcd_key_request(key, NULL, 0);
  json_t *put = ferry_etcd_key_request(key, value, lease);
  json_t *get = ferry_etcd_key_request(key, NULL, 0);
  if (!cmp || !put || !get || json_object_set_new(cmp, "target", json_string("CREATE")) ||
      json_object_set_new(cmp, "result", json_string("EQUAL")) ||
      json_object_set_new(cmp, "create_revision", json_string("0"))) {
    json_decref(cmp);
    json_decref(put);
    json_decref(get);
    return NULL;
  }
  return json_pack("{s:[o],s:[{s:o}],s:[{s:o}]}", "compare", cmp, "success", "request_put", put,
                   "failure", "request_range", get);
}

ferry_status ferry_election_campaign(ferry_election *e, const char *value, char **holder,
                                     uint64_t *until_ns) {
  char *current = NULL;
  ferry_status st = read_key(e, &current, NULL);
  if (!st && current) {
    if (holder)
      *holder = current;
    else
      free(current);
    return FERRY_EBUSY;
  }
  if (st)
    return st;
  uint64_t sent = ferry_now_ns();
  json_t *reply = NULL;
  st = ferry_etcd_call(e->etcd, "lease/grant", json_pack("{s:I}", "TTL", (json_int_t)e->ttl_s),
                       &reply);
  long long lease = st ? 0 : ferry_etcd_int64(reply, "ID");
  long long ttl = st ? 0 : ferry_etcd_int64(reply, "TTL");
  json_decref(reply);
  if (!st && (!lease || ttl <= 0))
    st = ferry_fail(FERRY_EMETADATA, "leader election: etcd granted no lease for %s", e->key);
  if (st)
    return st;
  reply = NULL;
  st = ferry_etcd_call(e->etcd, "kv/txn", put_if_absent(e->key, value, lease), &reply);
  int won = !st && json_is_true(json_object_get(reply, "succeeded"));
  if (!st && !won && holder) {
    json_t *first = json_array_get(json_object_get(reply, "responses"), 0);
    *holder = first_value(json_object_get(first, "response_range"), NULL);
  }
  json_decref(reply);
  if (!won) {
    revoke(e, lease);
    return st ? st : FERRY_EBUSY;
  }
  __atomic_store_n(&e->lease, lease, __ATOMIC_RELEASE);
  *until_ns = sent + (uint64_t)ttl * 1000000000ull;
  return FERRY_OK;
}

ferry_status ferry_election_watch(ferry_election *e, uint32_t wait_ms) {
  if (!e->seen)
    return ferry_fail(FERRY_EINVAL, "leader election: %s not read yet", e->key);
  return ferry_etcd_watch(e->etcd, e->key, e->seen, wait_ms);
}

ferry_status ferry_election_keep(ferry_election *e, uint64_t *until_ns) {
  long long lease = __atomic_load_n(&e->lease, __ATOMIC_ACQUIRE);
  if (!lease)
    return ferry_fail(FERRY_ENOTFOUND, "leader election: %s is not held", e->key);
  char id[24];
  snprintf(id, sizeof id, "%lld", lease);
  uint64_t sent = ferry_now_ns();
  json_t *reply = NULL;
  ferry_status st =
      ferry_etcd_call(e->etcd, "lease/keepalive", json_pack("{s:s}", "ID", id), &reply);
  long long ttl = st ? 0 : ferry_etcd_int64(json_object_get(reply, "result"), "TTL");
  json_decref(reply);
  if (st == FERRY_ENOTFOUND || (!st && ttl <= 0))
    st = ferry_fail(FERRY_ENOTFOUND, "leader election: etcd lost the lease of %s", e->key);
  char *value = NULL;
  long long holder = 0;
  if (!st)
    st = read_key(e, &value, &holder);
  if (!st && (!value || holder != lease))
    st = ferry_fail(FERRY_ENOTFOUND, "leader election: %s was %s", e->key,
                    value ? "taken over by another lease" : "deleted");
  free(value);
  if (st == FERRY_ENOTFOUND)
    __atomic_store_n(&e->lease, 0, __ATOMIC_RELEASE);
  else if (!st)
    *until_ns = sent + (uint64_t)ttl * 1000000000ull;
  return st;
}

ferry_status ferry_election_write(ferry_election *e, const char *key, const char *value) {
  return ferry_election_write_many(e, 1, &key, &value);
}

/* {"request_put": key=value} or {"request_delete_range": key}; NULL: no memory. */
static json_t *write_op(const char *key, const char *value) {
  json_t *req = ferry_etcd_key_request(key, value, 0);
  json_t *op = req ? json_object() : NULL;
  if (op && !json_object_set_new(op, value ? "request_put" : "request_delete_range", req))
    return op;
  json_decref(op);
  json_decref(req);
  return NULL;
}

ferry_status ferry_election_write_many(ferry_election *e, size_t n, const char *const *keys,
                                       const char *const *values) {
  long long lease = __atomic_load_n(&e->lease, __ATOMIC_ACQUIRE);
  if (!lease)
    return ferry_fail(FERRY_ENOTFOUND, "leader election: %s is not held", e->key);
  json_t *cmp = ferry_etcd_key_request(e->key, NULL, lease);
  json_t *ops = json_array();
  int bad = !cmp || !ops || json_object_set_new(cmp, "target", json_string("LEASE")) ||
            json_object_set_new(cmp, "result", json_string("EQUAL"));
  for (size_t i = 0; i < n && !bad; i++)
    bad = json_array_append_new(ops, write_op(keys[i], values[i])) != 0;
  if (bad) {
    json_decref(cmp);
    json_decref(ops);
    return ferry_fail(FERRY_ENOMEM, "leader election: out of memory");
  }
  json_t *reply = NULL;
  ferry_status st = ferry_etcd_call(
      e->etcd, "kv/txn", json_pack("{s:[o],s:o}", "compare", cmp, "success", ops), &reply);
  if (!st && !json_is_true(json_object_get(reply, "succeeded")))
    st = ferry_fail(FERRY_ENOTFOUND, "leader election: not writing %s%s: %s is no longer ours",
                    keys[0], n > 1 ? " and the rest of its batch" : "", e->key);
  json_decref(reply);
  return st;
}

ferry_status ferry_election_scan(ferry_election *e, const char *prefix,
                                 void (*each)(void *ctx, const char *key, const char *value),
                                 void *ctx) {
  char *end = strdup(prefix);
  if (!end || !*end) {
    free(end);
    return ferry_fail(FERRY_ENOMEM, "leader election: out of memory");
  }
  end[strlen(end) - 1]++; /* the first key past every one under prefix */
  json_t *req = ferry_etcd_key_request(prefix, NULL, 0);
  json_t *range_end = ferry_etcd_key_request(end, NULL, 0);
  free(end);
  if (!req || !range_end || json_object_set(req, "range_end", json_object_get(range_end, "key"))) {
    json_decref(req);
    json_decref(range_end);
    return ferry_fail(FERRY_ENOMEM, "leader election: out of memory");
  }
  json_decref(range_end);
  json_t *reply = NULL;
  ferry_status st = ferry_etcd_call(e->etcd, "kv/range", req, &reply);
  size_t i;
  json_t *kv;
  json_array_foreach(st ? NULL : json_object_get(reply, "kvs"), i, kv) {
    const char *k = json_string_value(json_object_get(kv, "key"));
    const char *v = json_string_value(json_object_get(kv, "value"));
    char *key = k ? ferry_etcd_b64_decode(k) : NULL, *value = v ? ferry_etcd_b64_decode(v) : NULL;
    if (key && value)
      each(ctx, key, value);
    free(key);
    free(value);
  }
  json_decref(reply);
  return st;
}

void ferry_election_resign(ferry_election *e) {
  long long lease = __atomic_exchange_n(&e->lease, 0, __ATOMIC_ACQ_REL);
  if (lease)
    revoke(e, lease);
}

void ferry_election_close(ferry_election *e) {
  if (!e)
    return;
  e->ops->close(e->etcd);
  free(e->key);
  free(e);
}
