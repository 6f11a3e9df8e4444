/* fuzz_store.c - the store master's map (store/map.h) fed STORE request
 * bodies from four clients, as the master's connections would pass them
 * on: each client's first request must be REGISTER and only its first (the
 * rule master.c enforces before the map sees a body). An input is a
 * sequence of records:
 *
 *   u8 control (bits 0-1: client; bit 7: that client leaves instead) |
 *   u8 count (the frame header's entry count) | u16 body length | body
 *
 * As the master's client thread does, a request refused with FERRY_EPROTO
 * ends that client's connection (store_map_drop_client).
 *
 * Besides memory errors, the target checks what a hostile client must
 * never obtain: every replica the master hands out (PUT_START,
 * UPSERT_START, GET, REPLICAS) lies inside a segment some client mounted,
 * whole, and a REPLICAS file lies in the scratch directory; a
 * stored object has a replica or its file (the SSD tier is on, in a
 * scratch directory no client writes to); the reply to a request it
 * accepted was built without an allocation failure and decodes as its
 * op's entries (protocol.h), to the last byte. The map is freed with
 * whatever the session left in it (the leak check sees a lost object). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "store/disk.h"
#include "store/map.h"
#include "store/protocol.h"

#define CLIENTS 4

typedef struct mounted {
  char name[STORE_NAME_MAX + 1];
  uint64_t base, size;
  int registered;
} mounted;

static mounted clients[CLIENTS];

static const mounted *segment_named(const char *name, size_t len) {
  for (int c = 0; c < CLIENTS; c++)
    if (clients[c].registered && clients[c].size && strlen(clients[c].name) == len &&
        !memcmp(clients[c].name, name, len))
      return &clients[c];
  return NULL;
}

/* Every replica of an object of `size` bytes lies inside a mounted
 * segment; returns how many there are. */
static unsigned check_replicas(store_reader *reply, uint64_t size) {
  store_replica_ref refs[STORE_REPLICAS_MAX];
  unsigned n = 0;
  FUZZ_CHECK(store_get_replicas(reply, refs, &n, "fuzz") == FERRY_OK);
  for (unsigned i = 0; i < n; i++) {
    const mounted *s = segment_named(refs[i].segment, refs[i].segment_len);
    FUZZ_CHECK(s != NULL);
    FUZZ_CHECK(refs[i].addr >= s->base && refs[i].addr - s->base <= s->size &&
               size <= s->size - (refs[i].addr - s->base));
  }
  return n;
}

/* One REPLICAS reply entry: a stored object has a place (as for GET),
 * memory replicas inside mounted segments, a file in the scratch
 * directory, an owner that is mounted; none for a key not found. */
static void check_places(store_reader *reply, const char *fs_dir) {
  int32_t status = (int32_t)store_get_u32(reply);
  uint64_t size = store_get_u64(reply);
  unsigned n = store_get_u8(reply);
  FUZZ_CHECK(status == FERRY_OK ? n > 0 : status == FERRY_ENOTFOUND && !size && !n);
  FUZZ_CHECK(n <= STORE_REPLICAS_MAX + 2);
  for (unsigned i = 0; i < n && !reply->bad; i++) {
    uint8_t kind = store_get_u8(reply);
    const char *at;
    size_t len;
    store_get_str(reply, &at, &len, STORE_LOCATION_MAX);
    uint64_t addr = store_get_u64(reply);
    FUZZ_CHECK(!reply->bad);
    if (kind == FERRY_STORE_REPLICA_DISK) {
      FUZZ_CHECK(len > strlen(fs_dir) && !memcmp(at, fs_dir, strlen(fs_dir)) && !addr);
      continue;
    }
    FUZZ_CHECK(kind == FERRY_STORE_REPLICA_MEMORY || kind == FERRY_STORE_REPLICA_LOCAL_DISK);
    const mounted *s = segment_named(at, len);
    FUZZ_CHECK(s != NULL);
    if (kind == FERRY_STORE_REPLICA_MEMORY)
      FUZZ_CHECK(addr >= s->base && addr - s->base <= s->size &&
                 size <= s->size - (addr - s->base));
    else
      FUZZ_CHECK(addr == 0);
  }
}

/* Walks the reply of an accepted request beside the request: every op's
 * entries decode exactly; PUT_START's, UPSERT_START's, GET's and
 * REPLICAS' replicas are checked. */
static void check_reply(uint8_t op, store_reader req, uint32_t count, const store_writer *w,
                        const char *fs_dir) {
  store_reader reply = {w->buf, w->len, 0};
  const char *s;
  size_t len;
  int starts = op == STORE_PUT_START || op == STORE_UPSERT_START;
  if (starts) {
    store_get_u8(&req);
    for (uint8_t n = store_get_u8(&req); n; n--) /* the preferred segments */
      store_get_str(&req, &s, &len, STORE_NAME_MAX);
    store_get_u8(&req);  /* pin */
    store_get_u8(&req);  /* soft pin action */
    store_get_u8(&req);  /* TTL given */
    store_get_u64(&req); /* soft pin TTL */
  } else if (op == STORE_REGISTER) {
    store_get_u32(&reply);
    FUZZ_CHECK(store_get_u32(&reply) > 0); /* the ping interval */
    store_get_str(&reply, &s, &len, STORE_DIR_MAX);
    store_get_str(&reply, &s, &len, STORE_NAME_MAX); /* the CXL pool: none here */
    FUZZ_CHECK(len == 0);
    FUZZ_CHECK(store_get_u64(&reply) == 0 && store_get_u64(&reply) == 0);
  } else if (op == STORE_REMOVE_ALL) {
    store_get_u64(&reply);
  } else if (op == STORE_CLEAR) {
    store_get_str(&req, &s, &len, STORE_NAME_MAX); /* the segment */
  }
  for (uint32_t i = 0; i < count; i++) {
    store_get_str(&req, &s, &len, STORE_KEY_MAX);
    uint64_t size = starts ? store_get_u64(&req) : 0;
    if (op == STORE_PUT_END) { /* its outcome and "file written" */
      store_get_u32(&req);
      store_get_u8(&req);
    }
    if (op == STORE_REPLICAS) {
      check_places(&reply, fs_dir);
      FUZZ_CHECK(!reply.bad && !req.bad);
      continue;
    }
    int32_t status = (int32_t)store_get_u32(&reply);
    if (op == STORE_GET || op == STORE_QUERY)
      size = store_get_u64(&reply);
    if (starts && status != FERRY_OK) {
      store_get_str(&reply, &s, &len, STORE_REASON_MAX);
    } else if (starts || op == STORE_GET) {
      unsigned replicas = check_replicas(&reply, size);
      if (op == STORE_GET) {
        uint8_t flags = store_get_u8(&reply), on_disk = flags & STORE_GET_ON_DISK;
        FUZZ_CHECK(status == FERRY_OK ? replicas > 0 || on_disk : !replicas && !flags);
        FUZZ_CHECK(!(flags & STORE_GET_LOADED) || replicas > 0);
        FUZZ_CHECK(!(flags & ~(STORE_GET_ON_DISK | STORE_GET_LOADED)));
      }
    }
    FUZZ_CHECK(!reply.bad && !req.bad);
  }
  FUZZ_CHECK(!reply.bad && reply.left == 0);
}

/* Remembers the segment an accepted REGISTER mounted. */
static void note_register(mounted *c, store_reader req) {
  store_get_u16(&req);
  c->base = store_get_u64(&req);
  c->size = store_get_u64(&req);
  const char *name;
  size_t len;
  store_get_str(&req, &name, &len, STORE_NAME_MAX);
  memcpy(c->name, name, len);
  c->name[len] = '\0';
  c->registered = 1;
}

static void leave(store_map *m, int c) {
  store_map_drop_client(m, (uint64_t)c + 1);
  memset(&clients[c], 0, sizeof clients[c]);
}

/* The SSD tier's directory: made once, empty (no client writes files). */
static char dir[] = "/tmp/ferry-fuzz-store-XXXXXX";

static void remove_scratch_dir(void) { rmdir(dir); }

static const char *scratch_dir(void) {
  static const char *made;
  if (!made) {
    made = mkdtemp(dir);
    FUZZ_CHECK(made != NULL);
    atexit(remove_scratch_dir);
  }
  return made;
}

static void serve(store_map *m, int c, uint32_t count, const uint8_t *body, size_t len) {
  store_reader r = {body, len, 0};
  uint8_t op = store_get_u8(&r);
  if (r.bad || (op == STORE_REGISTER) == clients[c].registered)
    return; /* the master ends such a connection before the map sees it */
  store_reader request = r;
  store_writer reply = {0};
  char why[FERRY_WIRE_MAX_REASON] = "";
  ferry_status st = store_map_serve(m, (uint64_t)c + 1, op, &r, count, &reply, why, sizeof why);
  if (st == FERRY_OK) {
    FUZZ_CHECK(!reply.failed);
    if (op == STORE_REGISTER)
      note_register(&clients[c], request);
    check_reply(op, request, count, &reply, scratch_dir());
  } else {
    FUZZ_CHECK(why[0] != '\0');
  }
  store_writer_free(&reply);
  if (st == FERRY_EPROTO) /* the master ends the connection */
    leave(m, c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_log_set_level(FERRY_LOG_OFF);
  store_eviction eviction = {0.95, 0.05, 1000, 60000, 0};
  store_map *m = store_map_create(1000, 30000, &eviction);
  FUZZ_CHECK(m != NULL && store_map_set_disk(m, scratch_dir()) == 0);
  memset(clients, 0, sizeof clients);
  while (size >= 4) {
    int c = data[0] & (CLIENTS - 1), leaves = data[0] & 0x80;
    uint32_t count = data[1];
    size_t len = (size_t)data[2] | (size_t)data[3] << 8;
    data += 4;
    size -= 4;
    if (len > size)
      len = size;
    if (leaves) {
      leave(m, c);
    } else {
      serve(m, c, count, data, len);
    }
    data += len;
    size -= len;
  }
  store_map_destroy(m);
  return 0;
}
