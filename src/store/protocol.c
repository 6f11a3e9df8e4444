/* protocol.c - the STORE body codec (protocol.h): a growing writer, a
 * reader that fails on any field past the end, and whole frames over a
 * ferry_sock (sealed there when the handshake set up a session). */
#include "store/protocol.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/net.h"

/* ---- writer --------------------------------------------------------------------------------- */

static uint8_t *reserve(store_writer *w, size_t n) {
  if (w->failed)
    return NULL;
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n)
      cap *= 2;
    uint8_t *grown = realloc(w->buf, cap);
    if (!grown) {
      w->failed = 1;
      return NULL;
    }
    w->buf = grown;
    w->cap = cap;
  }
  uint8_t *at = w->buf + w->len;
  w->len += n;
  return at;
}

static void put_le(store_writer *w, uint64_t v, size_t n) {
  uint8_t *at = reserve(w, n);
  for (size_t i = 0; at && i < n; i++)
    at[i] = (uint8_t)(v >> (8 * i));
}

void store_put_u8(store_writer *w, uint8_t v) { put_le(w, v, 1); }
void store_put_u16(store_writer *w, uint16_t v) { put_le(w, v, 2); }
void store_put_u32(store_writer *w, uint32_t v) { put_le(w, v, 4); }
void store_put_u64(store_writer *w, uint64_t v) { put_le(w, v, 8); }

void store_put_raw(store_writer *w, const void *data, size_t len) {
  uint8_t *at = reserve(w, len);
  if (at && len)
    memcpy(at, data, len);
}

void store_put_str(store_writer *w, const char *s, size_t len) {
  store_put_u16(w, (uint16_t)len);
  store_put_raw(w, s, len);
}

void store_writer_free(store_writer *w) {
  free(w->buf);
  memset(w, 0, sizeof *w);
}

/* ---- reader --------------------------------------------------------------------------------- */

static const uint8_t *take(store_reader *r, size_t n) {
  if (r->bad || r->left < n) {
    r->bad = 1;
    return NULL;
  }
  const uint8_t *at = r->p;
  r->p += n;
  r->left -= n;
  return at;
}

static uint64_t get_le(store_reader *r, size_t n) {
  const uint8_t *at = take(r, n);
  uint64_t v = 0;
  for (size_t i = 0; at && i < n; i++)
    v |= (uint64_t)at[i] << (8 * i);
  return v;
}

uint8_t store_get_u8(store_reader *r) { return (uint8_t)get_le(r, 1); }
uint16_t store_get_u16(store_reader *r) { return (uint16_t)get_le(r, 2); }
uint32_t store_get_u32(store_reader *r) { return (uint32_t)get_le(r, 4); }
uint64_t store_get_u64(store_reader *r) { return get_le(r, 8); }

void store_get_str(store_reader *r, const char **s, size_t *len, size_t max) {
  *len = store_get_u16(r);
  if (*len > max)
    r->bad = 1;
  *s = (const char *)take(r, r->bad ? 0 : *len);
  if (r->bad)
    *len = 0;
}

ferry_status store_get_replicas(store_reader *r, store_replica_ref *out, unsigned *count,
                                const char *peer) {
  *count = store_get_u8(r);
  if (*count > STORE_REPLICAS_MAX)
    return ferry_fail(FERRY_EPROTO, "store master %s listed %u replicas of one object (at most %d)",
                      peer, *count, STORE_REPLICAS_MAX);
  for (unsigned i = 0; i < *count; i++) {
    store_get_str(r, &out[i].segment, &out[i].segment_len, STORE_NAME_MAX);
    out[i].addr = store_get_u64(r);
    if (!r->bad && out[i].segment_len == 0)
      r->bad = 1;
  }
  return r->bad ? ferry_fail(FERRY_EPROTO, "store master %s sent a truncated replica list", peer)
                : FERRY_OK;
}

/* ---- frames --------------------------------------------------------------------------------- */

ferry_status store_send(ferry_sock *s, uint8_t type, uint32_t count, int32_t status,
                        store_writer *w, const char *step) {
  ferry_status st = FERRY_OK;
  if (w->failed)
    st = ferry_fail(FERRY_ENOMEM, "%s to %s: out of memory building the frame", step, s->peer);
  else if (w->len > FERRY_WIRE_MAX_CONTROL_BODY)
    st = ferry_fail(FERRY_EINVAL, "%s to %s: %zu bytes, more than a frame holds (%llu)", step,
                    s->peer, w->len, (unsigned long long)FERRY_WIRE_MAX_CONTROL_BODY);
  if (st == FERRY_OK) {
    ferry_frame_header h = {.type = type, .count = count, .status = status, .body_len = w->len};
    st = ferry_sock_send_frame(s, &h, w->buf, step);
  }
  store_writer_free(w);
  return st;
}

ferry_status store_recv(ferry_sock *s, ferry_frame_header *h, uint8_t **body, const char *step) {
  *body = NULL;
  ferry_status st = ferry_sock_recv_header(s, h, step);
  if (st != FERRY_OK)
    return st;
  if (h->type != FERRY_FRAME_STORE && h->type != FERRY_FRAME_STORE_REPLY)
    return ferry_fail(FERRY_EPROTO, "%s: %s sent frame type %u, not a store frame", step, s->peer,
                      h->type);
  *body = malloc(h->body_len ? (size_t)h->body_len : 1); /* the codec bounded it (32 MiB) */
  if (!*body)
    return ferry_fail(FERRY_ENOMEM, "%s: no memory for a %llu-byte frame from %s", step,
                      (unsigned long long)h->body_len, s->peer);
  st = h->body_len ? ferry_sock_recv(s, *body, (size_t)h->body_len, step) : FERRY_OK;
  if (st != FERRY_OK) {
    free(*body);
    *body = NULL;
  }
  return st;
}
