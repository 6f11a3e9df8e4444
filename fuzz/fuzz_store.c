/* fuzz_store.c - the store master's requests (store/protocol.h, served by
 * store/map.c): a session of STORE bodies from up to three clients against
 * one map, as the master's client threads hand them over after REGISTER.
 * Input: records of u8 client (1 + low two bits mod 3) | u8 count | u16
 * body length | body. As the master's client thread does: a client's
 * first request must be REGISTER and only its first, and a request
 * refused with FERRY_EPROTO ends the connection (store_map_drop_client);
 * the next record of that client is a new connection.
 * Checked: every reply of an accepted request decodes as its op's entries
 * (protocol.h), exactly, with replica addresses inside a segment the
 * client registered; the map is freed with whatever the session left in
 * it (the leak check sees a lost object). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "store/map.h"
#include "store/protocol.h"

/* Where each client's segment lies (REGISTER's base and size). */
typedef struct seg {
  uint64_t base, size;
} seg;

static void check_replicas(store_reader *r, const seg *segs) {
  store_replica_ref reps[STORE_REPLICAS_MAX];
  unsigned n;
  FUZZ_CHECK(store_get_replicas(r, reps, &n, "fuzz") == FERRY_OK);
  for (unsigned i = 0; i < n; i++) {
    int inside = 0;
    for (int c = 1; c <= 3; c++)
      inside |= segs[c].size && reps[i].addr >= segs[c].base &&
                reps[i].addr - segs[c].base < segs[c].size;
    FUZZ_CHECK(inside);
  }
}

/* The reply's count entries of op, decoded to the last byte. */
static void check_reply(uint8_t op, const store_writer *w, uint32_t count, const seg *segs) {
  store_reader r = {w->buf, w->len, 0};
  if (op == STORE_REGISTER) {
    store_get_u32(&r);
    FUZZ_CHECK(store_get_u32(&r) > 0);
  } else if (op == STORE_REMOVE_ALL) {
    store_get_u64(&r);
  }
  for (uint32_t i = 0; i < count; i++) {
    ferry_status st = (ferry_status)(int32_t)store_get_u32(&r);
    if (op == STORE_PUT_START || op == STORE_UPSERT_START) {
      const char *why;
      size_t len;
      if (st)
        store_get_str(&r, &why, &len, STORE_REASON_MAX);
      else
        check_replicas(&r, segs);
    } else if (op == STORE_GET || op == STORE_QUERY) {
      store_get_u64(&r);
      if (op == STORE_GET)
        check_replicas(&r, segs);
    }
  }
  FUZZ_CHECK(!r.bad && r.left == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  store_eviction eviction = {0.95, 0.05, 1000};
  store_map *m = store_map_create(5000, 10000, &eviction);
  FUZZ_CHECK(m != NULL);
  seg segs[4] = {{0, 0}};
  int registered[4] = {0};
  while (size >= 4) {
    uint64_t client = 1 + data[0] % 3;
    uint32_t count = data[1];
    size_t len = (size_t)data[2] | (size_t)data[3] << 8;
    data += 4;
    size -= 4;
    len = len < size ? len : size;
    store_reader r = {data, len, 0};
    uint8_t op = store_get_u8(&r);
    store_reader fields = r;
    store_writer reply = {0};
    char why[FERRY_WIRE_MAX_REASON];
    ferry_status st = FERRY_EPROTO;
    if ((op == STORE_REGISTER) != registered[client])
      st = store_map_serve(m, client, op, &r, count, &reply, why, sizeof why);
    if (st == FERRY_OK && op == STORE_REGISTER) { /* version, then its segment */
      store_get_u16(&fields);
      segs[client].base = store_get_u64(&fields);
      segs[client].size = store_get_u64(&fields);
      registered[client] = 1;
    }
    if (st == FERRY_OK && !reply.failed)
      check_reply(op, &reply, count, segs);
    store_writer_free(&reply);
    if (st == FERRY_EPROTO) {
      store_map_drop_client(m, client);
      segs[client] = (seg){0, 0};
      registered[client] = 0;
    }
    data += len;
    size -= len;
  }
  store_map_destroy(m);
  return 0;
}
