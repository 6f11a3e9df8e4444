/* replicas.c - ferry_store_replicas_batch (ferry.h): where the master
 * says each key's object is, one REPLICAS request per slice of keys
 * (protocol.h). Each item's replicas come back in one allocation: the
 * array, then the locations' strings, so that one free() gives it back. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "store/client.h"

/* One decoded replica before the copy (location points into the body). */
typedef struct seen {
  uint8_t kind;
  const char *location;
  size_t location_len;
  uint64_t address;
} seen;

/* The n replicas of seen[] into it->replicas (one malloc). */
static ferry_status keep(ferry_store_replica_list *it, const seen *sn, unsigned n) {
  size_t bytes = n * sizeof(ferry_store_replica);
  for (unsigned i = 0; i < n; i++)
    bytes += sn[i].location_len + 1;
  ferry_store_replica *reps = n ? malloc(bytes) : NULL;
  if (n && !reps)
    return ferry_fail(FERRY_ENOMEM, "store replicas \"%s\": out of memory", it->key);
  char *text = (char *)(reps + n);
  for (unsigned i = 0; i < n; i++) {
    memcpy(text, sn[i].location, sn[i].location_len);
    text[sn[i].location_len] = '\0';
    reps[i] = (ferry_store_replica){sn[i].kind, text, sn[i].address};
    text += sn[i].location_len + 1;
  }
  it->replicas = reps;
  it->count = n;
  return FERRY_OK;
}

/* One reply entry into it; FERRY_EPROTO naming the master when malformed. */
static ferry_status read_entry(ferry_store *s, store_reader *r, ferry_store_replica_list *it) {
  /* A memory replica per STORE_REPLICAS_MAX, the file, the offload copy. */
  seen sn[STORE_REPLICAS_MAX + 2];
  it->status = (ferry_status)(int32_t)store_get_u32(r);
  it->size = store_get_u64(r);
  unsigned n = store_get_u8(r);
  if (!r->bad && it->status != FERRY_OK && it->status != FERRY_ENOTFOUND)
    return ferry_fail(FERRY_EPROTO, "store master %s: REPLICAS entry of \"%s\": status %d",
                      s->master, it->key, it->status);
  if (n > STORE_REPLICAS_MAX + 2 || (it->status != FERRY_OK && n))
    return ferry_fail(FERRY_EPROTO, "store master %s: REPLICAS entry of \"%s\" lists %u replicas",
                      s->master, it->key, n);
  for (unsigned i = 0; i < n && !r->bad; i++) {
    sn[i].kind = store_get_u8(r);
    store_get_str(r, &sn[i].location, &sn[i].location_len, STORE_LOCATION_MAX);
    sn[i].address = store_get_u64(r);
    if (!r->bad && sn[i].location_len == 0) /* every place has a name */
      r->bad = 1;
    if (!r->bad &&
        (sn[i].kind < FERRY_STORE_REPLICA_MEMORY || sn[i].kind > FERRY_STORE_REPLICA_LOCAL_DISK))
      return ferry_fail(FERRY_EPROTO, "store master %s: REPLICAS entry of \"%s\": replica kind %u",
                        s->master, it->key, sn[i].kind);
  }
  if (r->bad)
    return ferry_fail(FERRY_EPROTO, "store master %s: malformed REPLICAS reply", s->master);
  return keep(it, sn, n);
}

static ferry_status replicas_slice(ferry_store *s, ferry_store_replica_list *items, size_t count) {
  store_writer w = {0};
  store_put_u8(&w, STORE_REPLICAS);
  for (size_t i = 0; i < count; i++)
    store_put_str(&w, items[i].key, strlen(items[i].key));
  ferry_frame_header h;
  uint8_t *body;
  ferry_status st = store_request(s, &w, (uint32_t)count, &h, &body, "store REPLICAS");
  if (st)
    return st;
  store_reader r = {body, (size_t)h.body_len, 0};
  for (size_t i = 0; i < count && !st; i++)
    st = read_entry(s, &r, &items[i]);
  if (!st && r.left)
    st = ferry_fail(FERRY_EPROTO, "store master %s: REPLICAS reply too long", s->master);
  free(body);
  return st;
}

ferry_status ferry_store_replicas_batch(ferry_store *s, ferry_store_replica_list *items,
                                        size_t count) {
  ferry_status st = FERRY_OK;
  for (size_t i = 0; i < count; i++) {
    items[i].status = FERRY_ENOTFOUND;
    items[i].size = 0;
    items[i].count = 0;
    items[i].replicas = NULL;
    if (!st)
      st = store_check_key(items[i].key, "ferry_store_replicas_batch");
  }
  for (size_t at = 0; !st && at < count; at += STORE_BATCH_MAX)
    st = replicas_slice(s, items + at, count - at < STORE_BATCH_MAX ? count - at : STORE_BATCH_MAX);
  if (st) {
    ferry_store_replica_lists_free(items, count); /* earlier slices' answers too */
    for (size_t i = 0; i < count; i++)
      items[i].status = st;
  }
  return st;
}

void ferry_store_replica_lists_free(ferry_store_replica_list *items, size_t count) {
  for (size_t i = 0; items && i < count; i++) {
    free(items[i].replicas);
    items[i].replicas = NULL;
    items[i].count = 0;
  }
}
