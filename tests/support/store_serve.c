/* store_serve.c - see store_serve.h. */
#include "store_serve.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

store_reader test_store_serve(store_map *m, uint64_t client, store_writer *req, uint32_t count,
                              store_writer *reply) {
  store_reader r = {req->buf, req->len, 0};
  uint8_t op = store_get_u8(&r);
  char why[FERRY_WIRE_MAX_REASON] = "";
  *reply = (store_writer){0};
  ferry_status st = store_map_serve(m, client, op, &r, count, reply, why, sizeof why);
  if (st != FERRY_OK)
    fail_msg("store op %u refused: %s (%s)", op, ferry_strerror(st), why);
  assert_false(reply->failed);
  store_writer_free(req);
  return (store_reader){reply->buf, reply->len, 0};
}

void test_store_put_start(store_writer *w, uint8_t replicas, const char *preferred) {
  *w = (store_writer){0};
  store_put_u8(w, STORE_PUT_START);
  store_put_u8(w, replicas);
  store_put_u8(w, *preferred != '\0');
  if (*preferred)
    store_put_str(w, preferred, strlen(preferred));
  store_put_u8(w, FERRY_STORE_PIN_NONE);
  store_put_u8(w, FERRY_STORE_SOFT_PIN_PRESERVE);
  store_put_u8(w, 0); /* no TTL given */
  store_put_u64(w, 0);
}

void test_store_register(store_writer *w, uint64_t base, uint64_t size, const char *name,
                         uint64_t nonce) {
  *w = (store_writer){0};
  store_put_u8(w, STORE_REGISTER);
  store_put_u16(w, STORE_PROTOCOL_VERSION);
  store_put_u64(w, base);
  store_put_u64(w, size);
  store_put_str(w, name, strlen(name));
  store_put_u64(w, nonce);
}

/* An OFFLOAD_POLL's or OFFLOAD_DONE's head. */
static void offload_head(store_writer *w, uint8_t op, const char *segment, uint64_t nonce) {
  *w = (store_writer){0};
  store_put_u8(w, op);
  store_put_str(w, segment, strlen(segment));
  store_put_u64(w, nonce);
}

uint32_t test_store_offload_round(store_map *m, uint64_t client, const char *segment,
                                  uint64_t nonce, uint32_t max, char *kinds, size_t cap) {
  store_writer w, reply, done;
  offload_head(&w, STORE_OFFLOAD_POLL, segment, nonce);
  store_put_u32(&w, 0); /* no wait */
  store_put_u32(&w, max);
  store_reader r = test_store_serve(m, client, &w, 0, &reply);
  uint32_t n = store_get_u32(&r), written = 0;
  assert_true(n < cap);
  offload_head(&done, STORE_OFFLOAD_DONE, segment, nonce);
  for (uint32_t i = 0; i < n; i++) {
    uint8_t task = store_get_u8(&r);
    const char *key;
    size_t len;
    store_get_str(&r, &key, &len, STORE_KEY_MAX);
    store_get_u64(&r);
    store_get_u64(&r);
    kinds[i] = task == STORE_TASK_OFFLOAD ? 'O' : task == STORE_TASK_LOAD ? 'L' : 'D';
    if (task == STORE_TASK_OFFLOAD) {
      store_put_u8(&done, task);
      store_put_str(&done, key, len);
      store_put_u32(&done, 0);
      written++;
    }
  }
  kinds[n] = '\0';
  assert_false(r.bad || r.left);
  store_writer_free(&reply);
  if (!written) {
    store_writer_free(&done);
    return n;
  }
  r = test_store_serve(m, client, &done, written, &reply);
  for (uint32_t i = 0; i < written; i++)
    assert_int_equal((int32_t)store_get_u32(&r), FERRY_OK);
  store_writer_free(&reply);
  return n;
}
