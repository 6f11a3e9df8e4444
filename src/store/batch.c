/* batch.c - the store's batch calls (ferry.h): one request to the master
 * for the keys of a slice (at most STORE_BATCH_MAX), then every transfer
 * of the slice in flight together, one ferry batch per segment. A replica
 * in this client's own segment is copied in memory (after checking that
 * the master's address lies inside the segment). A put or upsert ends
 * with PUT_END (commit, or free on failure); a get moves to an object's
 * next replica when a READ fails. Each item gets its status; the first
 * failure in item order is the call's, with its detail. With the master's
 * SSD tier (disk.h) a put also writes each value's file before its end
 * (the buffers concatenated), and a get reads the file of an object with
 * no replica in memory left.
 *
 * Every call works on multi-buffer items (a key's value is its buffers
 * concatenated; each buffer moves straight to or from its place in the
 * replica); the single-buffer forms and ranges are items of one buffer.
 * Every buffer is checked to be registered on the store's engine before
 * the master is asked: the copy into or out of this client's own segment
 * needs that as much as a transfer does. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "store/client.h"
#include "store/cxl.h"

typedef ferry_store_multi_item item;

/* The outcome of a batch call: the first failing item and its detail. */
typedef struct outcome {
  size_t first; /* index of the first failed item; SIZE_MAX: none */
  ferry_status status;
  char detail[FERRY_ERROR_MAX];
  size_t base; /* the caller's index of items[0] of the slice at work */
} outcome;

static void item_failed(outcome *o, item *items, size_t i, ferry_status st) {
  items[i].status = st;
  if (o->base + i < o->first) {
    o->first = o->base + i;
    o->status = st;
    snprintf(o->detail, sizeof o->detail, "%s", ferry_last_error());
  }
}

/* A slice the master never answered: every item of it fails with st. */
static void slice_failed(outcome *o, item *items, size_t n, ferry_status st) {
  for (size_t i = 0; i < n; i++)
    if (items[i].status == FERRY_OK)
      item_failed(o, items, i, st);
}

static ferry_status finish(const outcome *o) {
  return o->first == SIZE_MAX ? FERRY_OK : ferry_fail(o->status, "%s", o->detail);
}

/* An item's buffers: each one registered on the store's engine (only
 * memory registered for this client is read or written, by a transfer or
 * by the copy into its own segment alike); their total in its length. */
static ferry_status check_buffers(ferry_store *s, item *it, size_t i, const char *call) {
  if (!it->buffers || !it->count)
    return ferry_fail(FERRY_EINVAL, "%s: item %zu (\"%s\") has no buffers", call, i, it->key);
  size_t total = 0;
  for (size_t j = 0; j < it->count; j++) {
    const ferry_store_buffer *b = &it->buffers[j];
    if (!b->buf || !b->length)
      return ferry_fail(FERRY_EINVAL,
                        "%s: item %zu (\"%s\") has no buffer or length 0 (buffer %zu)", call, i,
                        it->key, j);
    if (b->length > SIZE_MAX - total)
      return ferry_fail(FERRY_EINVAL, "%s: item %zu (\"%s\"): its buffers add up past SIZE_MAX",
                        call, i, it->key);
    /* A CXL pool's client copies every value itself: no transfer, no peer
     * reads its buffers, which need no registration then. */
    ferry_status st = s->cxl ? FERRY_OK : ferry_memory_check(s->engine, b->buf, b->length);
    if (st)
      return ferry_fail(st, "%s \"%s\": %s", call, it->key, ferry_last_error());
    total += b->length;
  }
  it->length = total;
  return FERRY_OK;
}

static ferry_status check_items(ferry_store *s, item *items, size_t count, int need_buf,
                                const char *call) {
  for (size_t i = 0; i < count; i++) {
    ferry_status st = store_check_key(items[i].key, call);
    if (!st && need_buf)
      st = check_buffers(s, &items[i], i, call);
    if (st)
      return st;
    items[i].status = FERRY_OK;
  }
  return FERRY_OK;
}

/* count items of one buffer each, zeroed (status FERRY_OK), in one
 * allocation with their buffers (free the items); NULL without memory. */
static item *one_buffer_items(size_t count) {
  item *m = calloc(count ? count : 1, sizeof *m + sizeof(ferry_store_buffer));
  if (!m)
    return NULL;
  ferry_store_buffer *buffers = (ferry_store_buffer *)(m + count);
  for (size_t i = 0; i < count; i++) {
    m[i].buffers = &buffers[i];
    m[i].count = 1;
  }
  return m;
}

/* ---- transfers ------------------------------------------------------------------------------ */

/* One transfer between an item's buffers and a replica. */
typedef struct move {
  size_t item;
  const char *segment; /* points into a reply body */
  size_t segment_len;
  uint64_t remote;
  ferry_status status;
  int group; /* its ferry batch, for the failure's detail */
} move;

/* The bytes of buffer j of it that the value covers, the buffer starting
 * at byte off of the value (a get's value may be shorter than its buffers). */
static size_t part_length(const item *it, size_t j, uint64_t off) {
  uint64_t left = it->length - off;
  return it->buffers[j].length < left ? it->buffers[j].length : (size_t)left;
}

/* Buffer by buffer, as far as the value goes. */
#define FOR_EACH_PART(it, j, off)                                                                  \
  for (size_t j = 0, off = 0; j < (it)->count && off < (it)->length;                               \
       off += part_length((it), j, off), j++)

/* The entries of a move into out (NULL: only counted): one per buffer. */
static size_t move_entries(const item *it, ferry_op op, uint64_t remote, ferry_entry *out) {
  size_t n = 0;
  FOR_EACH_PART(it, j, off) {
    if (out)
      out[n] = (ferry_entry){op, it->buffers[j].buf, remote + off, part_length(it, j, off)};
    n++;
  }
  return n;
}

/* Where a replica's bytes are when this process holds them: in its own
 * segment, or in the CXL pool's mapping (cxl.h); *mem NULL when elsewhere. */
static ferry_status local_place(ferry_store *s, const move *m, size_t length, char **mem) {
  *mem = NULL;
  if (store_cxl_holds(s, m->segment, m->segment_len))
    return (*mem = store_cxl_at(s, m->remote, length)) ? FERRY_OK : FERRY_EPROTO;
  const char *own = ferry_store_segment(s);
  if (!s->segment || strlen(own) != m->segment_len || memcmp(own, m->segment, m->segment_len))
    return FERRY_OK;
  uint64_t base = (uint64_t)(uintptr_t)s->segment, at = m->remote;
  if (at < base || at - base > s->segment_size || length > s->segment_size - (at - base))
    return ferry_fail(FERRY_EPROTO,
                      "store master %s placed %zu bytes at 0x%llx, outside this client's segment",
                      s->master, length, (unsigned long long)at);
  *mem = (char *)(uintptr_t)at;
  return FERRY_OK;
}

/* A copy, for a replica this process holds (local_place). */
static void move_locally(ferry_op op, const item *it, char *mem) {
  FOR_EACH_PART(it, j, off) {
    void *buf = it->buffers[j].buf;
    memcpy(op == FERRY_OP_WRITE ? mem + off : buf, op == FERRY_OP_WRITE ? buf : mem + off,
           part_length(it, j, off));
  }
}

static int same_segment(const move *a, const move *b) {
  return a->segment_len == b->segment_len && !memcmp(a->segment, b->segment, a->segment_len);
}

/* Marks the moves of mv[first]'s segment not yet grouped as group `group`;
 * returns where its members start (first). */
static size_t mark_group(move *mv, size_t n, size_t first, int group) {
  for (size_t i = first; i < n; i++)
    if (mv[i].group < 0 && same_segment(&mv[i], &mv[first]))
      mv[i].group = group;
  return first;
}

/* Starts group g (its members from mv[first] on) as one ferry batch: submitted
 * to the workers (*batch), or run to its end on this thread (here; *batch
 * stays NULL), which then copies too instead of waiting for them. */
static ferry_status start_group(ferry_store *s, ferry_op op, const item *items, move *mv, size_t n,
                                size_t first, int here, ferry_batch **batch) {
  int g = mv[first].group;
  size_t members = 0;
  for (size_t i = first; i < n; i++)
    if (mv[i].group == g)
      members += move_entries(&items[mv[i].item], op, mv[i].remote, NULL);
  ferry_entry *entries = malloc(members * sizeof *entries);
  if (!entries)
    return ferry_fail(FERRY_ENOMEM, "store: no memory for a batch");
  char target[STORE_NAME_MAX + 1];
  snprintf(target, sizeof target, "%.*s", (int)mv[first].segment_len, mv[first].segment);
  size_t k = 0;
  for (size_t i = first; i < n; i++)
    if (mv[i].group == g)
      k += move_entries(&items[mv[i].item], op, mv[i].remote, entries + k);
  ferry_status st = here ? ferry_transfer_sync_batch(s->engine, target, entries, k, NULL)
                         : ferry_batch_submit(s->engine, target, entries, k, NULL, batch);
  free(entries);
  return st;
}

/* Group g's status: its members get it, details[g] its error. */
static void group_done(move *mv, size_t n, int g, ferry_status st,
                       char (*details)[FERRY_ERROR_MAX]) {
  if (st)
    snprintf(details[g], FERRY_ERROR_MAX, "%s", ferry_last_error());
  for (size_t j = 0; j < n; j++)
    if (mv[j].group == g && mv[j].status == FERRY_OK)
      mv[j].status = st;
}

/* Runs every move; each gets its status. details[g] keeps group g's error.
 * One ferry batch per segment; every one but the last is submitted to the
 * workers, and the last runs on this thread meanwhile (a store call would
 * otherwise sleep while its bytes move). A replica in this client's own
 * segment or in the CXL pool is copied here, a group of its own. */
static void run_moves(ferry_store *s, ferry_op op, const item *items, move *mv, size_t n,
                      char (*details)[FERRY_ERROR_MAX]) {
  if (!n)
    return;
  ferry_batch **batches = calloc(n, sizeof *batches);
  if (!batches) {
    ferry_fail(FERRY_ENOMEM, "store: no memory for batches");
    for (size_t i = 0; i < n; i++)
      mv[i] = (move){mv[i].item, mv[i].segment, mv[i].segment_len, mv[i].remote, FERRY_ENOMEM, 0};
    snprintf(details[0], FERRY_ERROR_MAX, "%s", ferry_last_error());
    return;
  }
  int groups = 0;
  for (size_t i = 0; i < n; i++) {
    mv[i].group = -1;
    mv[i].status = FERRY_OK;
  }
  size_t last = n; /* the first member of the remote group seen last: run here, at the end */
  for (size_t i = 0; i < n; i++) {
    if (mv[i].group >= 0)
      continue;
    char *mem;
    ferry_status st = local_place(s, &mv[i], items[mv[i].item].length, &mem);
    if (st || mem) {
      mv[i].group = groups++; /* a group of one: group_done would scan every move */
      mv[i].status = st;
      if (st)
        snprintf(details[mv[i].group], FERRY_ERROR_MAX, "%s", ferry_last_error());
      else
        move_locally(op, &items[mv[i].item], mem);
      continue;
    }
    if (last < n) {
      int g = mv[last].group;
      group_done(mv, n, g, start_group(s, op, items, mv, n, last, 0, &batches[g]), details);
    }
    last = mark_group(mv, n, i, groups++);
  }
  if (last < n)
    group_done(mv, n, mv[last].group, start_group(s, op, items, mv, n, last, 1, NULL), details);
  for (int g = 0; g < groups; g++) {
    if (!batches[g])
      continue;
    group_done(mv, n, g, ferry_batch_wait(batches[g], -1), details);
    ferry_batch_free(batches[g]);
  }
  free(batches);
}

/* ---- put and upsert ------------------------------------------------------------------------- */

void ferry_store_replicate_init_size(ferry_store_replicate *rep, size_t size) {
  memset(rep, 0, size);
  if (size >= sizeof rep->size)
    rep->size = size;
}

/* The first form of ferry_store_replicate, the smallest size accepted. */
#define REPLICATE_MIN_SIZE (offsetof(ferry_store_replicate, pin) + sizeof(int))

/* The caller's replicate (NULL: the defaults) as this libferry's struct:
 * the fields an older caller lacks keep their defaults. */
static ferry_status adopt_replicate(const ferry_store_replicate *in, ferry_store_replicate *out,
                                    const char *call) {
  ferry_store_replicate_init(out);
  if (!in)
    return FERRY_OK;
  if (in->size < REPLICATE_MIN_SIZE || in->size > sizeof *out)
    return ferry_fail(FERRY_EINVAL,
                      "%s: ferry_store_replicate.size = %zu is not valid: expected %zu to %zu "
                      "(fill it with ferry_store_replicate_init; a larger size means a ferry.h "
                      "newer than this libferry)",
                      call, in->size, (size_t)REPLICATE_MIN_SIZE, sizeof *out);
  memcpy(out, in, in->size);
  out->size = sizeof *out;
  if (out->replicas > STORE_REPLICAS_MAX)
    return ferry_fail(FERRY_EINVAL, "%s: %u replicas asked, at most %d", call, out->replicas,
                      STORE_REPLICAS_MAX);
  if (out->pin < FERRY_STORE_PIN_NONE || out->pin > FERRY_STORE_PIN_HARD)
    return ferry_fail(FERRY_EINVAL, "%s: pin %d is not a FERRY_STORE_PIN_*", call, out->pin);
  if (out->soft_pin_action < FERRY_STORE_SOFT_PIN_PRESERVE ||
      out->soft_pin_action > FERRY_STORE_SOFT_PIN_DISABLE)
    return ferry_fail(FERRY_EINVAL, "%s: soft_pin_action %d is not a FERRY_STORE_SOFT_PIN_*", call,
                      out->soft_pin_action);
  if (out->preferred_count > STORE_PREFERRED_MAX - 1 ||
      (out->preferred_count && !out->preferred_segments))
    return ferry_fail(FERRY_EINVAL, "%s: %zu preferred_segments (at most %d, and not NULL)", call,
                      out->preferred_count, STORE_PREFERRED_MAX - 1);
  for (size_t i = 0; i < out->preferred_count; i++)
    if (!out->preferred_segments[i])
      return ferry_fail(FERRY_EINVAL, "%s: preferred_segments[%zu] is NULL", call, i);
  return FERRY_OK;
}

/* PUT_START or UPSERT_START (op) of the items. */
static void put_start_request(store_writer *w, uint8_t op, const item *items, size_t count,
                              const ferry_store_replicate *rep) {
  int first = rep->preferred_segment && *rep->preferred_segment;
  store_put_u8(w, op);
  store_put_u8(w, (uint8_t)(rep->replicas ? rep->replicas : 1));
  store_put_u8(w, (uint8_t)(first + rep->preferred_count));
  if (first)
    store_put_str(w, rep->preferred_segment, strnlen(rep->preferred_segment, STORE_NAME_MAX));
  for (size_t i = 0; i < rep->preferred_count; i++)
    store_put_str(w, rep->preferred_segments[i],
                  strnlen(rep->preferred_segments[i], STORE_NAME_MAX));
  store_put_u8(w, (uint8_t)rep->pin);
  store_put_u8(w, (uint8_t)rep->soft_pin_action);
  store_put_u8(w, rep->soft_pin_ttl_set != 0);
  store_put_u64(w, rep->soft_pin_ttl_ms);
  for (size_t i = 0; i < count; i++) {
    store_put_str(w, items[i].key, strlen(items[i].key));
    store_put_u64(w, items[i].length);
  }
}

/* Reads PUT_START's reply into moves (*n of them); items the master
 * refused fail here. started[i]: item i has replicas to commit. */
static ferry_status read_placements(ferry_store *s, store_reader *r, item *items, size_t count,
                                    move *mv, size_t *n, char *started, outcome *o) {
  *n = 0;
  for (size_t i = 0; i < count; i++) {
    ferry_status st = (ferry_status)(int32_t)store_get_u32(r);
    store_replica_ref reps[STORE_REPLICAS_MAX];
    unsigned k = 0;
    const char *why = NULL;
    size_t why_len = 0;
    ferry_status bad = st ? FERRY_OK : store_get_replicas(r, reps, &k, s->master);
    if (st) /* a refusal says why */
      store_get_str(r, &why, &why_len, STORE_REASON_MAX);
    if (bad || r->bad)
      return bad ? bad : ferry_fail(FERRY_EPROTO, "store master %s: malformed reason", s->master);
    started[i] = st == FERRY_OK && k > 0;
    if (st && why_len)
      item_failed(o, items, i,
                  ferry_fail(st, "put \"%s\" (%zu bytes): %.*s (master %s)", items[i].key,
                             items[i].length, (int)why_len, why, s->master));
    else if (st)
      item_failed(o, items, i, store_entry_fail(s, st, items[i].key, items[i].length, "put"));
    for (unsigned j = 0; started[i] && j < k; j++)
      mv[(*n)++] = (move){i, reps[j].segment, reps[j].segment_len, reps[j].addr, FERRY_OK, -1};
  }
  return r->left ? ferry_fail(FERRY_EPROTO, "store master %s: PUT_START reply too long", s->master)
                 : FERRY_OK;
}

/* With the SSD tier, the file of each started item whose replicas were
 * all written, from the caller's buffer (on_disk[i] once written). A file
 * that cannot be written leaves the put in memory only, with a warning:
 * the store is a cache. */
static void write_files(ferry_store *s, item *items, size_t count, const char *started,
                        char *on_disk) {
  char dir[STORE_DIR_MAX];
  if (!store_fs_dir(s, dir))
    return;
  size_t failed = 0;
  char first[FERRY_ERROR_MAX] = "";
  for (size_t i = 0; i < count; i++) {
    if (!started[i] || items[i].status != FERRY_OK)
      continue;
    on_disk[i] = store_disk_write(dir, items[i].key, items[i].buffers, items[i].count,
                                  items[i].length) == FERRY_OK;
    if (!on_disk[i] && !failed++)
      snprintf(first, sizeof first, "%s", ferry_last_error());
  }
  if (failed)
    FERRY_WARN("%s; %zu put(s) of this batch stay in memory only (evicted, they are gone)", first,
               failed);
}

/* PUT_END for the started items: each commits unless one of its moves
 * failed. It goes on conn, the connection of their PUT_START, or nowhere:
 * another master, or this one after the connection ended (the end dropped
 * the puts), may hold a put of the same key by this client, unwritten.
 * on_disk[i]: item i's file was written (the SSD tier). */
static ferry_status put_end(ferry_store *s, uint64_t conn, item *items, size_t count,
                            const char *started, const char *on_disk, outcome *o) {
  store_writer w = {0};
  uint32_t entries = 0;
  store_put_u8(&w, STORE_PUT_END);
  for (size_t i = 0; i < count; i++)
    if (started[i]) {
      store_put_str(&w, items[i].key, strlen(items[i].key));
      store_put_u32(&w, (uint32_t)items[i].status);
      store_put_u8(&w, (uint8_t)on_disk[i]);
      entries++;
    }
  if (!entries) {
    store_writer_free(&w);
    return FERRY_OK;
  }
  ferry_frame_header h;
  uint8_t *body;
  ferry_status st = store_request_on(s, &conn, &w, entries, &h, &body, "store PUT_END");
  if (st)
    return st;
  store_reader r = {body, (size_t)h.body_len, 0};
  for (size_t i = 0; i < count; i++) {
    if (!started[i])
      continue;
    ferry_status end = (ferry_status)(int32_t)store_get_u32(&r);
    if (end == FERRY_EMETADATA && items[i].status == FERRY_OK) /* HA: etcd did not take it */
      item_failed(o, items, i,
                  ferry_fail(end,
                             "put \"%s\": store master %s could not journal its commit to etcd "
                             "(HA); nothing is committed",
                             items[i].key, s->master));
    else if (end && items[i].status == FERRY_OK) /* revoked meanwhile: a replica's segment left */
      item_failed(o, items, i,
                  ferry_fail(end,
                             "put \"%s\": revoked by store master %s before its end (a "
                             "segment holding a replica left the store)",
                             items[i].key, s->master));
  }
  free(body);
  return r.bad || r.left
             ? ferry_fail(FERRY_EPROTO, "store master %s: malformed PUT_END reply", s->master)
             : FERRY_OK;
}

static ferry_status put_slice(ferry_store *s, uint8_t op, item *items, size_t count,
                              const ferry_store_replicate *rep, outcome *o) {
  store_writer w = {0};
  put_start_request(&w, op, items, count, rep);
  ferry_frame_header h;
  uint8_t *body;
  uint64_t conn = 0;
  ferry_status st =
      store_request_on(s, &conn, &w, (uint32_t)count, &h, &body,
                       op == STORE_UPSERT_START ? "store UPSERT_START" : "store PUT_START");
  if (st)
    return st;
  unsigned per = rep->replicas ? rep->replicas : 1;
  move *mv = malloc(count * per * sizeof *mv);
  char *started = calloc(count, 2), *on_disk = started ? started + count : NULL;
  char(*details)[FERRY_ERROR_MAX] = malloc(count * per * sizeof *details);
  size_t n = 0;
  store_reader r = {body, (size_t)h.body_len, 0};
  st = mv && started && details ? read_placements(s, &r, items, count, mv, &n, started, o)
                                : ferry_fail(FERRY_ENOMEM, "store put: out of memory");
  if (!st) {
    run_moves(s, FERRY_OP_WRITE, items, mv, n, details);
    for (size_t j = 0; j < n; j++)
      if (mv[j].status && items[mv[j].item].status == FERRY_OK) {
        ferry_fail(mv[j].status, "put \"%s\": %s", items[mv[j].item].key, details[mv[j].group]);
        item_failed(o, items, mv[j].item, mv[j].status);
      }
    write_files(s, items, count, started, on_disk);
    st = put_end(s, conn, items, count, started, on_disk, o);
  }
  free(details);
  free(started);
  free(mv);
  free(body);
  return st;
}

/* A put (op PUT_START) or an upsert (UPSERT_START) of the items. */
static ferry_status write_items(ferry_store *s, uint8_t op, item *items, size_t count,
                                const ferry_store_replicate *replicate, const char *call) {
  ferry_store_replicate rep;
  ferry_status st = check_items(s, items, count, 1, call);
  if (!st)
    st = adopt_replicate(replicate, &rep, call);
  if (st)
    return st;
  outcome o = {SIZE_MAX, FERRY_OK, "", 0};
  for (size_t at = 0; at < count; at += STORE_BATCH_MAX) {
    size_t n = count - at < STORE_BATCH_MAX ? count - at : STORE_BATCH_MAX;
    o.base = at;
    st = put_slice(s, op, items + at, n, &rep, &o);
    if (st)
      slice_failed(&o, items + at, n, st);
  }
  return finish(&o);
}

/* ---- get ------------------------------------------------------------------------------------ */

/* A request whose entries are the items' keys alone (GET, QUERY). */
static ferry_status keys_request(ferry_store *s, uint8_t op, const item *items, size_t count,
                                 ferry_frame_header *h, uint8_t **body, const char *step) {
  store_writer w = {0};
  store_put_u8(&w, op);
  for (size_t i = 0; i < count; i++)
    store_put_str(&w, items[i].key, strlen(items[i].key));
  return store_request(s, &w, (uint32_t)count, h, body, step);
}

/* What the master said of one key of a GET. */
typedef struct placement {
  uint64_t size;
  unsigned count, next; /* replicas, and the next one to try */
  store_replica_ref reps[STORE_REPLICAS_MAX];
  uint8_t on_disk;   /* the object has a complete file (the SSD tier) */
  uint8_t from_file; /* read it from there: no replica, or every one failed */
} placement;

/* One GET reply entry into *p; its status in *st. A malformed reply is
 * the call's failure (FERRY_EPROTO naming the master). */
static ferry_status read_get_entry(ferry_store *s, store_reader *r, placement *p,
                                   ferry_status *st) {
  *st = (ferry_status)(int32_t)store_get_u32(r);
  p->size = store_get_u64(r);
  p->next = 0;
  ferry_status bad = store_get_replicas(r, p->reps, &p->count, s->master);
  if (bad)
    return bad;
  uint8_t flags = store_get_u8(r);
  p->on_disk = (flags & STORE_GET_ON_DISK) != 0;
  p->from_file = p->on_disk && p->count == 0;
  if (r->bad)
    return ferry_fail(FERRY_EPROTO, "store master %s sent a truncated GET reply", s->master);
  if (*st == FERRY_OK && flags & STORE_GET_LOADED && p->count)
    __atomic_add_fetch(&s->owner_disk_reads, 1, __ATOMIC_RELAXED);
  return FERRY_OK;
}

/* Each item's length becomes its value's size, also when the value does
 * not fit its buffers (the caller may read again with room for it). */
static ferry_status read_gets(ferry_store *s, store_reader *r, item *items, size_t count,
                              placement *pl, outcome *o) {
  for (size_t i = 0; i < count; i++) {
    ferry_status st;
    ferry_status bad = read_get_entry(s, r, &pl[i], &st);
    if (bad)
      return bad;
    if (!st && pl[i].size > items[i].length)
      st = ferry_fail(FERRY_EINVAL, "get \"%s\": the value is %llu bytes, the buffer%s %zu",
                      items[i].key, (unsigned long long)pl[i].size,
                      items[i].count > 1 ? "s hold" : " holds", items[i].length);
    else if (st)
      st = store_entry_fail(s, st, items[i].key, 0, "get");
    if (st == FERRY_OK || st == FERRY_EINVAL)
      items[i].length = (size_t)pl[i].size;
    if (st)
      item_failed(o, items, i, st);
  }
  return r->left ? ferry_fail(FERRY_EPROTO, "store master %s: GET reply too long", s->master)
                 : FERRY_OK;
}

/* Tells the suspects (suspects.h) how each segment's reads went: once per
 * group, which run_moves numbers in the order of their first moves, as its
 * members share one segment and one status. */
static void note_segments(ferry_store *s, const move *mv, size_t n,
                          char (*details)[FERRY_ERROR_MAX]) {
  int next = 0;
  for (size_t j = 0; j < n; j++)
    if (mv[j].group == next) {
      store_suspects_note(&s->suspects, mv[j].segment, mv[j].segment_len, mv[j].status,
                          details[next]);
      next++;
    }
}

/* Rounds of READs: each item from its next replica, until it succeeded or
 * has none left; replicas on segments that failed to answer lately go
 * last (suspects.h). */
static void read_replicas(ferry_store *s, item *items, size_t count, placement *pl, move *mv,
                          char (*details)[FERRY_ERROR_MAX], outcome *o) {
  for (;;) {
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
      if (items[i].status == FERRY_OK && pl[i].next < pl[i].count) {
        store_suspects_order(&s->suspects, pl[i].reps + pl[i].next, pl[i].count - pl[i].next);
        store_replica_ref *rp = &pl[i].reps[pl[i].next++];
        mv[n++] = (move){i, rp->segment, rp->segment_len, rp->addr, FERRY_OK, -1};
      }
    if (!n)
      return;
    run_moves(s, FERRY_OP_READ, items, mv, n, details);
    note_segments(s, mv, n, details);
    for (size_t j = 0; j < n; j++) {
      placement *p = &pl[mv[j].item];
      if (mv[j].status == FERRY_OK)
        p->next = p->count; /* done */
      else if (p->next == p->count && p->on_disk)
        p->from_file = 1;
      else if (p->next == p->count) {
        ferry_fail(mv[j].status, "get \"%s\": every replica failed; the last: %s",
                   items[mv[j].item].key, details[mv[j].group]);
        item_failed(o, items, mv[j].item, mv[j].status);
      }
    }
  }
}

/* Tells the master the files of keys[0..n) are missing or damaged: it
 * forgets them (and the objects that had nothing else). */
static void drop_files(ferry_store *s, const char **keys, size_t n) {
  store_writer w = {0};
  store_put_u8(&w, STORE_DROP_FILE);
  for (size_t i = 0; i < n; i++)
    store_put_str(&w, keys[i], strlen(keys[i]));
  ferry_frame_header h;
  uint8_t *body;
  if (store_request(s, &w, (uint32_t)n, &h, &body, "store DROP_FILE") != FERRY_OK)
    FERRY_WARN("%s", ferry_last_error()); /* the next reader finds the file bad again */
  else
    free(body);
}

/* One object from its file: into the item's buffers, or for a range (rg)
 * the whole file into a buffer of its own (its crc32c covers the whole
 * value) and the range copied out. */
static ferry_status read_file(const char *dir, item *it, const ferry_store_range *rg, uint64_t size,
                              int *bad) {
  if (!rg)
    return store_disk_read(dir, it->key, it->buffers, it->count, (size_t)size, bad);
  ferry_store_buffer whole = {malloc(size ? (size_t)size : 1), (size_t)size};
  if (!whole.buf)
    return ferry_fail(FERRY_ENOMEM, "get_into_ranges \"%s\": no memory for %llu bytes", it->key,
                      (unsigned long long)size);
  ferry_status st = store_disk_read(dir, it->key, &whole, 1, whole.length, bad);
  if (!st)
    memcpy(rg->buf, (char *)whole.buf + rg->offset, rg->length);
  free(whole.buf);
  return st;
}

/* Reads the items that are in their file only (or whose replicas all
 * failed) from the SSD tier's directory: whole values, or with rg the
 * ranges it names. Files found damaged are dropped in one request. */
static void read_files(ferry_store *s, item *items, const ferry_store_range *rg, size_t count,
                       placement *pl, outcome *o) {
  char dir[STORE_DIR_MAX];
  const char **bad_keys = NULL;
  size_t bad_count = 0;
  int have_dir = -1;
  for (size_t i = 0; i < count; i++) {
    if (items[i].status != FERRY_OK || !pl[i].from_file)
      continue;
    if (have_dir < 0)
      have_dir = store_fs_dir(s, dir);
    int bad = 0;
    ferry_status st =
        have_dir ? read_file(dir, &items[i], rg ? &rg[i] : NULL, pl[i].size, &bad)
                 : ferry_fail(FERRY_ENOTFOUND,
                              "get \"%s\": the object is on disk only, and store master %s names "
                              "no directory for its files now",
                              items[i].key, s->master);
    if (st)
      item_failed(o, items, i, st);
    if (bad && (bad_keys || (bad_keys = malloc(count * sizeof *bad_keys))))
      bad_keys[bad_count++] = items[i].key;
  }
  if (bad_count)
    drop_files(s, bad_keys, bad_count);
  free(bad_keys);
}

/* ---- ranges --------------------------------------------------------------------------------- */

/* A GET reply read for ranges: an object of the right size gets its
 * replicas' addresses moved to the range's offset. */
static ferry_status read_range_gets(ferry_store *s, store_reader *r, item *items,
                                    const ferry_store_range *rg, size_t count, placement *pl,
                                    outcome *o) {
  for (size_t i = 0; i < count; i++) {
    ferry_status st;
    ferry_status bad = read_get_entry(s, r, &pl[i], &st);
    if (bad)
      return bad;
    if (items[i].status != FERRY_OK) /* refused before the request */
      continue;
    if (!st && (rg[i].offset > pl[i].size || rg[i].length > pl[i].size - rg[i].offset))
      st = ferry_fail(FERRY_EINVAL,
                      "get_into_ranges \"%s\": bytes %llu..%llu pass the value's end (%llu bytes)",
                      rg[i].key, (unsigned long long)rg[i].offset,
                      (unsigned long long)(rg[i].offset + rg[i].length),
                      (unsigned long long)pl[i].size);
    else if (st)
      st = store_entry_fail(s, st, rg[i].key, 0, "get");
    if (st) {
      item_failed(o, items, i, st);
      continue;
    }
    for (unsigned j = 0; j < pl[i].count; j++)
      pl[i].reps[j].addr += rg[i].offset;
  }
  return r->left ? ferry_fail(FERRY_EPROTO, "store master %s: GET reply too long", s->master)
                 : FERRY_OK;
}

/* ---- gets, of whole values or of ranges ----------------------------------------------------- */

/* One GET request for count items and the reads it answers: whole values
 * into the items' buffers, or, with rg, the ranges rg[0..count) names. */
static ferry_status get_slice(ferry_store *s, item *items, const ferry_store_range *rg,
                              size_t count, outcome *o) {
  ferry_frame_header h;
  uint8_t *body;
  ferry_status st = keys_request(s, STORE_GET, items, count, &h, &body, "store GET");
  if (st)
    return st;
  placement *pl = malloc(count * sizeof *pl);
  move *mv = malloc(count * sizeof *mv);
  char(*details)[FERRY_ERROR_MAX] = malloc(count * sizeof *details);
  store_reader r = {body, (size_t)h.body_len, 0};
  if (!pl || !mv || !details)
    st = ferry_fail(FERRY_ENOMEM, "store %s: out of memory", rg ? "get_into_ranges" : "get");
  else
    st = rg ? read_range_gets(s, &r, items, rg, count, pl, o)
            : read_gets(s, &r, items, count, pl, o);
  if (!st) {
    read_replicas(s, items, count, pl, mv, details, o);
    read_files(s, items, rg, count, pl, o);
  }
  free(details);
  free(mv);
  free(pl);
  free(body);
  return st;
}

static ferry_status read_items(ferry_store *s, item *items, size_t count, const char *call) {
  ferry_status st = check_items(s, items, count, 1, call);
  if (st)
    return st;
  outcome o = {SIZE_MAX, FERRY_OK, "", 0};
  for (size_t at = 0; at < count; at += STORE_BATCH_MAX) {
    size_t n = count - at < STORE_BATCH_MAX ? count - at : STORE_BATCH_MAX;
    o.base = at;
    st = get_slice(s, items + at, NULL, n, &o);
    if (st)
      slice_failed(&o, items + at, n, st);
  }
  return finish(&o);
}

ferry_status ferry_store_get_ranges(ferry_store *s, ferry_store_range *rg, size_t count) {
  item *items = one_buffer_items(count);
  if (!items)
    return ferry_fail(FERRY_ENOMEM, "ferry_store_get_ranges: out of memory");
  outcome o = {SIZE_MAX, FERRY_OK, "", 0};
  ferry_status st = FERRY_OK;
  for (size_t i = 0; i < count && !st; i++) {
    items[i].key = rg[i].key;
    items[i].buffers[0] = (ferry_store_buffer){rg[i].buf, rg[i].length};
    st = store_check_key(rg[i].key, "ferry_store_get_ranges");
  }
  /* The destination must be registered, as a READ's would: also for a
   * range read from this client's own segment, copied in memory. */
  for (size_t i = 0; i < count && !st; i++) {
    ferry_status bad = check_buffers(s, &items[i], i, "get_into_ranges");
    if (bad)
      item_failed(&o, items, i, bad);
  }
  for (size_t at = 0; !st && at < count; at += STORE_BATCH_MAX) {
    size_t n = count - at < STORE_BATCH_MAX ? count - at : STORE_BATCH_MAX;
    o.base = at;
    ferry_status sl = get_slice(s, items + at, rg + at, n, &o);
    if (sl)
      slice_failed(&o, items + at, n, sl);
  }
  for (size_t i = 0; i < count; i++)
    rg[i].status = st ? FERRY_OK : items[i].status;
  free(items);
  return st ? st : finish(&o);
}

/* ---- exists --------------------------------------------------------------------------------- */

static ferry_status query_slice(ferry_store *s, item *items, size_t count) {
  ferry_frame_header h;
  uint8_t *body;
  ferry_status st = keys_request(s, STORE_QUERY, items, count, &h, &body, "store QUERY");
  if (st)
    return st;
  store_reader r = {body, (size_t)h.body_len, 0};
  for (size_t i = 0; i < count; i++) {
    items[i].status = (ferry_status)(int32_t)store_get_u32(&r);
    items[i].length = (size_t)store_get_u64(&r);
  }
  free(body);
  return r.bad || r.left
             ? ferry_fail(FERRY_EPROTO, "store master %s: malformed QUERY reply", s->master)
             : FERRY_OK;
}

static ferry_status query_items(ferry_store *s, item *items, size_t count, const char *call) {
  ferry_status st = check_items(s, items, count, 0, call);
  for (size_t at = 0; !st && at < count; at += STORE_BATCH_MAX)
    st = query_slice(s, items + at, count - at < STORE_BATCH_MAX ? count - at : STORE_BATCH_MAX);
  return st;
}

/* ---- clear ---------------------------------------------------------------------------------- */

static ferry_status clear_slice(ferry_store *s, ferry_store_item *items, size_t count,
                                const char *segment) {
  store_writer w = {0};
  store_put_u8(&w, STORE_CLEAR);
  store_put_str(&w, segment, strlen(segment));
  for (size_t i = 0; i < count; i++)
    store_put_str(&w, items[i].key, strlen(items[i].key));
  ferry_frame_header h;
  uint8_t *body;
  ferry_status st = store_request(s, &w, (uint32_t)count, &h, &body, "store CLEAR");
  if (st)
    return st;
  store_reader r = {body, (size_t)h.body_len, 0};
  for (size_t i = 0; i < count; i++)
    items[i].status = (ferry_status)(int32_t)store_get_u32(&r);
  free(body);
  return r.bad || r.left
             ? ferry_fail(FERRY_EPROTO, "store master %s: malformed CLEAR reply", s->master)
             : FERRY_OK;
}

ferry_status ferry_store_clear_batch(ferry_store *s, ferry_store_item *items, size_t count,
                                     const char *segment) {
  segment = segment ? segment : "";
  if (strlen(segment) > STORE_NAME_MAX)
    return ferry_fail(FERRY_EINVAL,
                      "ferry_store_clear_batch: a segment name of %zu bytes (at most %d)",
                      strlen(segment), STORE_NAME_MAX);
  for (size_t i = 0; i < count; i++) {
    ferry_status st = store_check_key(items[i].key, "ferry_store_clear_batch");
    if (st)
      return st;
  }
  ferry_status st = FERRY_OK;
  for (size_t at = 0; !st && at < count; at += STORE_BATCH_MAX)
    st = clear_slice(s, items + at, count - at < STORE_BATCH_MAX ? count - at : STORE_BATCH_MAX,
                     segment);
  return st;
}

/* ---- the public calls ----------------------------------------------------------------------- */

/* The single-buffer items as items of one buffer each (one allocation:
 * the items, then their buffers); NULL without memory. */
static item *as_multi(const ferry_store_item *items, size_t count) {
  item *m = one_buffer_items(count);
  for (size_t i = 0; m && i < count; i++) {
    m[i].key = items[i].key;
    m[i].buffers[0] = (ferry_store_buffer){items[i].buf, items[i].length};
    m[i].length = items[i].length;
  }
  return m;
}

/* Each item's status and length back from m (freed); returns st. */
static ferry_status from_multi(ferry_store_item *items, item *m, size_t count, ferry_status st) {
  for (size_t i = 0; i < count; i++) {
    items[i].status = m[i].status;
    items[i].length = m[i].length;
  }
  free(m);
  return st;
}

enum { PUT = STORE_PUT_START, UPSERT = STORE_UPSERT_START, GET, EXISTS };

/* A single-buffer call (what: PUT, UPSERT, GET or EXISTS) on its items. */
static ferry_status single_buffers(ferry_store *s, int what, ferry_store_item *items, size_t count,
                                   const ferry_store_replicate *rep, const char *call) {
  item *m = as_multi(items, count);
  if (!m)
    return ferry_fail(FERRY_ENOMEM, "%s: out of memory for %zu items", call, count);
  ferry_status st = what == GET      ? read_items(s, m, count, call)
                    : what == EXISTS ? query_items(s, m, count, call)
                                     : write_items(s, (uint8_t)what, m, count, rep, call);
  return from_multi(items, m, count, st);
}

ferry_status ferry_store_put_from_batch(ferry_store *s, ferry_store_item *items, size_t count,
                                        const ferry_store_replicate *replicate) {
  return single_buffers(s, PUT, items, count, replicate, "ferry_store_put_from");
}

ferry_status ferry_store_upsert_from_batch(ferry_store *s, ferry_store_item *items, size_t count,
                                           const ferry_store_replicate *replicate) {
  return single_buffers(s, UPSERT, items, count, replicate, "ferry_store_upsert_from");
}

ferry_status ferry_store_get_into_batch(ferry_store *s, ferry_store_item *items, size_t count) {
  return single_buffers(s, GET, items, count, NULL, "ferry_store_get_into");
}

ferry_status ferry_store_exists_batch(ferry_store *s, ferry_store_item *items, size_t count) {
  return single_buffers(s, EXISTS, items, count, NULL, "ferry_store_exists");
}

ferry_status ferry_store_put_from_multi_buffers(ferry_store *s, ferry_store_multi_item *items,
                                                size_t count,
                                                const ferry_store_replicate *replicate) {
  return write_items(s, STORE_PUT_START, items, count, replicate,
                     "ferry_store_put_from_multi_buffers");
}

ferry_status ferry_store_get_into_multi_buffers(ferry_store *s, ferry_store_multi_item *items,
                                                size_t count) {
  return read_items(s, items, count, "ferry_store_get_into_multi_buffers");
}
