/* staging.c - the staging pipeline (staging.h): slices of a frame's ranges
 * go through a ring of bounce buffers, each slot's copy started early and
 * waited for only when its buffer is needed. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "memory/staging.h"

#define STAGE_COPIERS 4 /* devices one connection keeps a copier for */

/* One slice of a range, as it sits in a slot of the ring. */
typedef struct stage_slice {
  ferry_copier *copier;
  uint64_t addr;
  size_t len;
  int copying; /* a copy was started and not waited for */
} stage_slice;

struct ferry_stager {
  ferry_copier *copiers[STAGE_COPIERS]; /* oldest first */
  stage_slice ring[FERRY_STAGE_SLOTS];  /* the call under way's slices */
  ferry_status drained;                 /* the first copy drain saw fail */
};

/* Walks the ranges a slice at a time. */
typedef struct stage_cursor {
  const ferry_stage_range *ranges;
  unsigned count, at;
  size_t offset;
} stage_cursor;

ferry_stager *ferry_stager_create(void) { return calloc(1, sizeof(ferry_stager)); }

void ferry_stager_destroy(ferry_stager *s) {
  if (!s)
    return;
  for (unsigned i = 0; i < STAGE_COPIERS; i++)
    if (s->copiers[i])
      s->copiers[i]->kind->copier_close(s->copiers[i]);
  free(s);
}

int ferry_stage_plan(ferry_registry *registry, const struct iovec *iov, unsigned count, int staging,
                     ferry_stage_range *out) {
  int stage = 0;
  for (unsigned i = 0; i < count; i++) {
    uint64_t addr = (uint64_t)(uintptr_t)iov[i].iov_base;
    out[i] = (ferry_stage_range){.addr = addr, .len = iov[i].iov_len};
    if (!ferry_registry_where(registry, addr, iov[i].iov_len ? iov[i].iov_len : 1, &out[i].where) &&
        ferry_kind_identify(addr, iov[i].iov_len ? iov[i].iov_len : 1, &out[i].where) != FERRY_OK)
      out[i].where = (ferry_where){.kind = FERRY_KIND_HOST, .cpu_access = 1, .device = -1};
    stage |= ferry_kind_must_stage(&out[i].where, staging);
  }
  return stage;
}

static void drain(ferry_stager *s);

/* The copier for where's kind and device, opened on first use; when every
 * place is taken the oldest is closed, after the copies under way ended. */
static ferry_status copier_for(ferry_stager *s, const ferry_where *where, ferry_copier **out) {
  const ferry_memory_kind *kind = ferry_kind_get(where->kind);
  int device = where->cpu_access && kind->id == FERRY_KIND_HOST ? -1 : where->device;
  for (unsigned i = 0; i < STAGE_COPIERS && s->copiers[i]; i++)
    if (s->copiers[i]->kind == kind && s->copiers[i]->device == device) {
      *out = s->copiers[i];
      return FERRY_OK;
    }
  if (s->copiers[STAGE_COPIERS - 1]) {
    drain(s);
    s->copiers[0]->kind->copier_close(s->copiers[0]);
    memmove(&s->copiers[0], &s->copiers[1], (STAGE_COPIERS - 1) * sizeof *s->copiers);
    s->copiers[STAGE_COPIERS - 1] = NULL;
  }
  unsigned free_at = 0;
  while (s->copiers[free_at])
    free_at++;
  ferry_status st = kind->copier_open(device, FERRY_STAGE_SLOTS, FERRY_STAGE_SLOT, out);
  if (!st)
    s->copiers[free_at] = *out;
  return st;
}

/* The next slice: 1 with *slice set (its copier included), 0 at the end,
 * -1 when no copier could be opened (*st says why). */
static int next_slice(ferry_stager *s, stage_cursor *c, stage_slice *slice, ferry_status *st) {
  while (c->at < c->count && c->offset == c->ranges[c->at].len) {
    c->at++;
    c->offset = 0;
  }
  if (c->at == c->count)
    return 0;
  const ferry_stage_range *r = &c->ranges[c->at];
  size_t len = r->len - c->offset < FERRY_STAGE_SLOT ? r->len - c->offset : FERRY_STAGE_SLOT;
  *slice = (stage_slice){.addr = r->addr + c->offset, .len = len};
  c->offset += len;
  return (*st = copier_for(s, &r->where, &slice->copier)) == FERRY_OK ? 1 : -1;
}

/* Waits for a slot's copy, if one is under way. */
static ferry_status slice_wait(stage_slice *slice, unsigned slot) {
  if (!slice->copying)
    return FERRY_OK;
  slice->copying = 0;
  return slice->copier->kind->copy_wait(slice->copier, slot);
}

/* Ends every copy still under way: their buffers and memory are left alone
 * from here on. The first that failed is kept in s->drained. */
static void drain(ferry_stager *s) {
  for (unsigned i = 0; i < FERRY_STAGE_SLOTS; i++) {
    ferry_status st = slice_wait(&s->ring[i], i);
    if (st && !s->drained)
      s->drained = st;
  }
}

/* A call's fresh ring. */
static stage_slice *ring_reset(ferry_stager *s) {
  memset(s->ring, 0, sizeof s->ring);
  s->drained = FERRY_OK;
  return s->ring;
}

ferry_status ferry_stage_out(ferry_stager *s, const ferry_stage_range *ranges, unsigned count,
                             ferry_stage_move move, void *arg) {
  stage_slice *ring = ring_reset(s);
  stage_cursor cursor = {ranges, count, 0, 0};
  ferry_status st = FERRY_OK;
  uint64_t started = 0, sent = 0;
  int more = 1;
  while (!st) {
    /* Keep every free slot copying ahead of the network. */
    while (more && started - sent < FERRY_STAGE_SLOTS) {
      stage_slice *slice = &ring[started % FERRY_STAGE_SLOTS];
      more = next_slice(s, &cursor, slice, &st);
      if (more <= 0)
        break;
      st = slice->copier->kind->copy_start(slice->copier, started % FERRY_STAGE_SLOTS, slice->addr,
                                           slice->len, 1);
      if (st)
        break;
      slice->copying = 1;
      started++;
    }
    if (st || sent == started)
      break;
    unsigned slot = sent % FERRY_STAGE_SLOTS;
    stage_slice *slice = &ring[slot];
    st = slice_wait(slice, slot);
    if (!st)
      st = move(arg, slice->copier->bounce[slot], slice->len);
    sent++;
  }
  drain(s);
  return st ? st : s->drained;
}

ferry_status ferry_stage_in(ferry_stager *s, const ferry_stage_range *ranges, unsigned count,
                            ferry_stage_move move, void *arg, ferry_status *copy_status) {
  stage_slice *ring = ring_reset(s);
  stage_cursor cursor = {ranges, count, 0, 0};
  ferry_status st = FERRY_OK;
  *copy_status = FERRY_OK;
  stage_slice next;
  for (uint64_t k = 0; !st; k++) {
    int more = next_slice(s, &cursor, &next, &st);
    if (more <= 0)
      break;
    unsigned slot = k % FERRY_STAGE_SLOTS;
    /* The slot's buffer is free once the copy out of it ended. */
    ferry_status copied = slice_wait(&ring[slot], slot);
    if (copied && !*copy_status)
      *copy_status = copied;
    ring[slot] = next;
    st = move(arg, next.copier->bounce[slot], next.len);
    if (st || *copy_status)
      continue;
    *copy_status = next.copier->kind->copy_start(next.copier, slot, next.addr, next.len, 0);
    ring[slot].copying = !*copy_status;
  }
  drain(s);
  if (!*copy_status)
    *copy_status = s->drained;
  return st;
}
