/* make_seeds.c - writes the seed corpus of every fuzz target into
 * fuzz/corpus/<target>/ (run by fuzz/run.sh --seeds; the files are kept in
 * the repository): well-formed examples built with the real encoders, so
 * the fuzzers start from inputs that pass the first checks. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "store/protocol.h"
#include "wire/wire.h"

static const char *root;

static void put(const char *target, const char *name, const void *data, size_t len) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, target);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, len, f) != len) {
    fprintf(stderr, "make_seeds: cannot write %s: %s\n", path, strerror(errno));
    exit(1);
  }
  fclose(f);
}

/* A growing byte string for multi-frame seeds. */
typedef struct buf {
  uint8_t data[1 << 16];
  size_t len;
} buf;

static void add(buf *b, const void *p, size_t n) {
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

static void add_frame(buf *b, uint8_t type, uint8_t flags, uint32_t count, int32_t status,
                      uint64_t id, const void *body, size_t body_len) {
  ferry_frame_header h = {.type = type,
                          .flags = flags,
                          .count = count,
                          .status = status,
                          .body_len = body_len,
                          .id = id};
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  ferry_wire_header_encode(raw, &h);
  add(b, raw, sizeof raw);
  if (body_len)
    add(b, body, body_len);
}

static size_t hello(uint8_t *out) {
  ferry_hello h;
  memset(&h, 0, sizeof h);
  h.version_min = h.version_max = FERRY_WIRE_VERSION_MIN;
  h.conn_kind = FERRY_CONN_DATA;
  h.engine_id = 0x1122334455667788ull;
  memset(h.nonce, 0xab, sizeof h.nonce);
  snprintf(h.name, sizeof h.name, "127.0.0.1:40000");
  return ferry_wire_hello_encode(out, &h);
}

/* auth_required: the negotiation alone (the facts follow the proof). */
static size_t hello_reply_auth(uint8_t *out, uint8_t auth_required) {
  ferry_hello_reply r;
  memset(&r, 0, sizeof r);
  r.version = r.version_min = r.version_max = FERRY_WIRE_VERSION_MIN;
  r.auth_required = auth_required;
  r.engine_id = 0x99;
  r.transports = FERRY_TRANSPORT_TCP;
  r.pid = 4242;
  static const char path[] = "/tmp/ferry-4242.sock";
  r.descriptor_count = 1;
  r.descriptors[0].transport = FERRY_TRANSPORT_SHM;
  r.descriptors[0].len = sizeof path - 1;
  memcpy(r.descriptors[0].data, path, sizeof path - 1);
  return ferry_wire_hello_reply_encode(out, &r);
}

static size_t hello_reply(uint8_t *out) { return hello_reply_auth(out, 0); }

/* WRITE of `len` bytes (value v) to addr, optionally checksummed and
 * carrying an after-landed message (a POOL body). */
static void add_write(buf *b, uint64_t id, uint64_t addr, size_t len, int checksum,
                      const ferry_pool_req *after) {
  uint8_t body[16 + 4096 + FERRY_WIRE_POOL_MAX + 4];
  ferry_region seg = {addr, len};
  ferry_wire_segments_encode(body, &seg, 1);
  memset(body + 16, 0x5a, len);
  size_t n = 16 + len;
  if (after)
    n += ferry_wire_pool_encode(body + n, after);
  if (checksum) {
    uint32_t c = ferry_crc32c(0, body + 16, n - 16);
    for (int i = 0; i < 4; i++)
      body[n++] = (uint8_t)(c >> (8 * i));
  }
  uint8_t flags = (checksum ? FERRY_FRAME_FLAG_CHECKSUM : 0) | (after ? FERRY_FRAME_FLAG_AFTER : 0);
  add_frame(b, FERRY_FRAME_WRITE, flags, 1, 0, id, body, n);
}

static void add_read(buf *b, uint64_t id, uint64_t addr, size_t len, int checksum) {
  uint8_t table[16];
  ferry_region seg = {addr, len};
  ferry_wire_segments_encode(table, &seg, 1);
  add_frame(b, FERRY_FRAME_READ, checksum ? FERRY_FRAME_FLAG_CHECKSUM : 0, 1, 0, id, table, 16);
}

static void header_seeds(void) {
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  struct {
    const char *name;
    ferry_frame_header h;
  } cases[] = {
      {"hello", {.type = FERRY_FRAME_HELLO, .body_len = 48}},
      {"write", {.type = FERRY_FRAME_WRITE, .count = 2, .body_len = 32 + 8192, .id = 7}},
      {"write_crc",
       {.type = FERRY_FRAME_WRITE, .flags = 1, .count = 1, .body_len = 16 + 100 + 4, .id = 8}},
      {"write_after",
       {.type = FERRY_FRAME_WRITE, .flags = 3, .count = 1, .body_len = 16 + 100 + 33 + 4, .id = 8}},
      {"write_ack_after",
       {.type = FERRY_FRAME_WRITE_ACK,
        .flags = 2,
        .body_len = FERRY_WIRE_POOL_REPLY_SIZE,
        .id = 8}},
      {"read", {.type = FERRY_FRAME_READ, .count = 3, .body_len = 48, .id = 9}},
      {"read_reply_crc", {.type = FERRY_FRAME_READ_REPLY, .flags = 1, .body_len = 4100, .id = 9}},
      {"refusal", {.type = FERRY_FRAME_WRITE_ACK, .status = FERRY_ENOTREG, .body_len = 40}},
      {"regions_reply", {.type = FERRY_FRAME_REGIONS_REPLY, .count = 2, .body_len = 33}},
      {"notify", {.type = FERRY_FRAME_NOTIFY, .body_len = 10}},
      {"ping", {.type = FERRY_FRAME_PING, .id = 1}},
      {"cut", {.type = FERRY_FRAME_CUT, .body_len = FERRY_WIRE_NONCE_SIZE, .id = 10}},
      {"auth_reply", {.type = FERRY_FRAME_AUTH_REPLY, .body_len = FERRY_WIRE_PROOF_SIZE + 34}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ferry_wire_header_encode(raw, &cases[i].h);
    put("fuzz_header", cases[i].name, raw, sizeof raw);
  }
}

static void wire_seeds(void) {
  uint8_t out[4096];
  ferry_region segs[3] = {{0x1000, 100}, {0x7f0000000000ull, 1 << 20}, {0x2000, 1}};
  out[0] = 3;
  out[1] = 0;
  ferry_wire_segments_encode(out + 2, segs, 3);
  put("fuzz_segments", "three", out, 2 + 48);
  out[0] = 1;
  put("fuzz_segments", "one", out, 2 + 16);

  put("fuzz_hello", "hello", out, hello(out));
  put("fuzz_hello_reply", "reply", out, hello_reply(out));
  put("fuzz_hello_reply", "reply_auth", out, hello_reply_auth(out, 1));

  ferry_region regions[3] = {{0x1000, 0x1000}, {0x4000, 0x100}, {0x7f0000000000ull, 1 << 30}};
  memset(out, 0, 4);
  out[0] = 3;
  put("fuzz_regions", "three", out, 4 + ferry_wire_regions_encode(out + 4, regions, 3, NULL, 0));
  uint8_t key_bytes[3 * 8] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ferry_region_keys keys = {FERRY_TRANSPORT_FABRIC, 8, key_bytes};
  put("fuzz_regions", "keyed", out, 4 + ferry_wire_regions_encode(out + 4, regions, 3, &keys, 1));
  out[0] = 0;
  put("fuzz_regions", "empty", out, 4 + ferry_wire_regions_encode(out + 4, regions, 0, NULL, 0));

  const ferry_region ranges[2] = {{0x1000, 0x10}, {0x4000, 0x2000}};
  out[0] = 2, out[1] = 0;
  ferry_wire_ranges_encode(out + 2, ranges, 2);
  put("fuzz_ranges", "two", out, 2 + 32);
  out[0] = 0;
  put("fuzz_ranges", "whole_table", out, 2); /* count 0, no body: the whole table */

  size_t n = ferry_wire_notify_encode(out, "kv-ready", "page 17", 7);
  put("fuzz_notify", "notify", out, n);
  n = ferry_wire_notify_encode(out, "x", "", 0);
  put("fuzz_notify", "empty_data", out, n);

  put("fuzz_crc32c", "check", "123456789", 9);
  for (int i = 0; i < 100; i++)
    out[i] = (uint8_t)(i * 7);
  put("fuzz_crc32c", "hundred", out, 100);
}

static void metadata_seeds(void) {
  const char *seeds[][2] = {
      {"rpc", "{\"ip_or_host_name\": \"10.0.0.2\", \"rpc_port\": 15023}"},
      {"ram", "{\"name\": \"seg\", \"protocol\": \"tcp\", \"tcp_data_port\": 15023, \"buffers\": "
              "[{\"name\": \"cpu:0\", \"addr\": 140000000000, \"length\": 1048576}, {\"name\": "
              "\"cpu:0\", \"addr\": 4096, \"length\": 4096}]}"},
      {"negative", "{\"buffers\": [{\"addr\": -1, \"length\": -4096}], \"rpc_port\": 1}"},
      {"big", "{\"buffers\": [{\"addr\": 18446744073709551615, \"length\": 1e300}]}"},
      {"nested", "{\"ip_or_host_name\": [\"a\"], \"rpc_port\": 65536, \"buffers\": {}}"},
  };
  for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++)
    put("fuzz_metadata", seeds[i][0], seeds[i][1], strlen(seeds[i][1]));
}

static void server_seeds(void) {
  uint8_t body[1024];
  buf b = {.len = 0};
  uint8_t selector = 0;
  add(&b, &selector, 1);
  add_frame(&b, FERRY_FRAME_HELLO, 0, 0, 0, 0, body, hello(body));
  add_frame(&b, FERRY_FRAME_PING, 0, 0, 0, 1, NULL, 0);
  add_frame(&b, FERRY_FRAME_REGIONS_REQ, 0, 0, 0, 2, NULL, 0);
  const ferry_region asked[2] = {{FUZZ_SERVER_BUF, 64}, {FUZZ_SERVER_BUF + 4096, 1}};
  ferry_wire_ranges_encode(body, asked, 2);
  add_frame(&b, FERRY_FRAME_REGIONS_REQ, 0, 2, 0, 2, body, 32);
  add_write(&b, 3, FUZZ_SERVER_BUF + 64, 256, 0, NULL);
  add_write(&b, 4, FUZZ_SERVER_BUF + 1024, 64, 1, NULL);
  add_read(&b, 5, FUZZ_SERVER_BUF + 64, 256, 0);
  add_read(&b, 6, FUZZ_SERVER_BUF + 64, 256, 1);
  size_t n = ferry_wire_notify_encode(body, "seed", "hello", 5);
  add_frame(&b, FERRY_FRAME_NOTIFY, 0, 0, 0, 7, body, n);
  add_write(&b, 8, 0x1000, 16, 0, NULL); /* refused: not registered */
  ferry_pool_req landed = {.op = FERRY_POOL_LANDED,
                           .grant = 1,
                           .length = 64,
                           .pool = "seed",
                           .pool_len = 4,
                           .tag = "t",
                           .tag_len = 1};
  add_write(&b, 9, FUZZ_SERVER_BUF + 2048, 64, 1, &landed); /* refused: no such pool */
  memset(body, 0x5a, FERRY_WIRE_NONCE_SIZE);
  add_frame(&b, FERRY_FRAME_CUT, 0, 0, 0, 10, body, FERRY_WIRE_NONCE_SIZE); /* no such connection */
  put("fuzz_server", "session", b.data, b.len);

  b.len = 0;
  selector = 1;
  add(&b, &selector, 1);
  add_frame(&b, FERRY_FRAME_HELLO, 0, 0, 0, 0, body, hello(body));
  memset(body, 0x11, FERRY_WIRE_PROOF_SIZE);
  add_frame(&b, FERRY_FRAME_AUTH, 0, 0, 0, 0, body, FERRY_WIRE_PROOF_SIZE);
  add_frame(&b, FERRY_FRAME_PING, 0, 0, 0, 1, NULL, 0);
  put("fuzz_server", "auth", b.data, b.len);
}

/* One connection's answers, as "u16 length | bytes". */
static void add_part(buf *b, const buf *part) {
  uint8_t len[2] = {(uint8_t)part->len, (uint8_t)(part->len >> 8)};
  add(b, len, 2);
  add(b, part->data, part->len);
}

static void client_seeds(void) {
  uint8_t body[8192];
  ferry_region region = {FUZZ_CLIENT_REMOTE, 1 << 20};
  buf control = {.len = 0}, data = {.len = 0}, b;
  add_frame(&control, FERRY_FRAME_HELLO_REPLY, 0, 0, 0, 0, body, hello_reply(body));
  add_frame(&control, FERRY_FRAME_REGIONS_REPLY, 0, 1, 0, 0, body,
            ferry_wire_regions_encode(body, &region, 1, NULL, 0));
  add_frame(&control, FERRY_FRAME_NOTIFY_ACK, 0, 0, 0, 0, NULL, 0);
  add_frame(&control, FERRY_FRAME_PONG, 0, 0, 0, 0, NULL, 0);
  add_frame(&data, FERRY_FRAME_HELLO_REPLY, 0, 0, 0, 0, body, hello_reply(body));
  memset(body, 0x42, FUZZ_CLIENT_LEN);
  add_frame(&data, FERRY_FRAME_READ_REPLY, 0, 0, 0, 0, body, FUZZ_CLIENT_LEN);
  add_frame(&data, FERRY_FRAME_WRITE_ACK, 0, 0, 0, 1, NULL, 0);
  const char *names[] = {"regions", "read", "write", "notify", "probe"};
  for (uint8_t op = 0; op < 5; op++) {
    b.len = 0;
    add(&b, &op, 1);
    add_part(&b, &control);
    add_part(&b, &data);
    put("fuzz_client", names[op], b.data, b.len);
  }
  /* A refusal with a reason, and a checksummed READ reply. */
  b.len = 0;
  uint8_t op = 1;
  add(&b, &op, 1);
  add_part(&b, &control);
  data.len = 0;
  add_frame(&data, FERRY_FRAME_HELLO_REPLY, 0, 0, 0, 0, body, hello_reply(body));
  add_frame(&data, FERRY_FRAME_READ_REPLY, 0, 0, FERRY_ENOTREG, 0, "not registered here", 19);
  add_part(&b, &data);
  put("fuzz_client", "refused", b.data, b.len);
  b.len = 0;
  op = 6; /* READ with checksum mode */
  add(&b, &op, 1);
  add_part(&b, &control);
  data.len = 0;
  add_frame(&data, FERRY_FRAME_HELLO_REPLY, 0, 0, 0, 0, body, hello_reply(body));
  memset(body, 0x42, FUZZ_CLIENT_LEN);
  uint32_t c = ferry_crc32c(0, body, FUZZ_CLIENT_LEN);
  for (int i = 0; i < 4; i++)
    body[FUZZ_CLIENT_LEN + i] = (uint8_t)(c >> (8 * i));
  add_frame(&data, FERRY_FRAME_READ_REPLY, FERRY_FRAME_FLAG_CHECKSUM, 0, 0, 0, body,
            FUZZ_CLIENT_LEN + 4);
  add_part(&b, &data);
  put("fuzz_client", "read_checksum", b.data, b.len);
}

/* ---- fuzz_store: records of (client, count, body) -------------------------------------------- */

static void add_request(buf *b, int client, uint8_t count, store_writer *w) {
  uint8_t head[4] = {(uint8_t)client, count, (uint8_t)w->len, (uint8_t)(w->len >> 8)};
  add(b, head, sizeof head);
  add(b, w->buf, w->len);
  store_writer_free(w);
  memset(w, 0, sizeof *w);
}

static void add_register(buf *b, int client, const char *segment, uint64_t base, uint64_t size) {
  store_writer w = {0};
  store_put_u8(&w, STORE_REGISTER);
  store_put_u16(&w, STORE_PROTOCOL_VERSION);
  store_put_u64(&w, base);
  store_put_u64(&w, size);
  store_put_str(&w, segment, strlen(segment));
  store_put_u64(&w, base ^ 0x5eed); /* the segment's nonce */
  add_request(b, client, 0, &w);
}

/* op's entries are the keys k0..k(n-1); PUT_START's and UPSERT_START's
 * ask replicas of size bytes each (client 2's PUT_STARTs a 1 ms soft
 * pin), PUT_END's commit (odd keys with their
 * file written). */
static void add_keys(buf *b, int client, uint8_t op, uint8_t n, uint8_t replicas, uint64_t size) {
  store_writer w = {0};
  int starts = op == STORE_PUT_START || op == STORE_UPSERT_START;
  store_put_u8(&w, op);
  if (op == STORE_CLEAR)
    store_put_str(&w, client ? "seg-a" : "", client ? 5 : 0);
  if (starts) {
    store_put_u8(&w, replicas);
    store_put_u8(&w, 1); /* a preferred segment */
    store_put_str(&w, client & 1 ? "seg-b" : "seg-a", 5);
    store_put_u8(&w, FERRY_STORE_PIN_NONE);
    /* Client 2's puts pin softly for 1 ms, and upserts keep that pin. */
    int enable = client == 2 && op == STORE_PUT_START;
    store_put_u8(&w, enable ? FERRY_STORE_SOFT_PIN_ENABLE : FERRY_STORE_SOFT_PIN_PRESERVE);
    store_put_u8(&w, (uint8_t)enable);
    store_put_u64(&w, enable);
  }
  for (uint8_t i = 0; i < n; i++) {
    char key[8];
    snprintf(key, sizeof key, "k%u", i);
    store_put_str(&w, key, strlen(key));
    if (starts)
      store_put_u64(&w, size);
    if (op == STORE_PUT_END) {
      store_put_u32(&w, 0);
      store_put_u8(&w, i & 1); /* odd keys: their file was written (the SSD tier) */
    }
  }
  add_request(b, client, n, &w);
}

/* One request of a seed: add_keys' arguments. */
typedef struct store_step {
  int client;
  uint8_t op, n, replicas;
  uint64_t size;
} store_step;

static void add_steps(buf *b, const store_step *steps, size_t n) {
  for (size_t i = 0; i < n; i++)
    add_keys(b, steps[i].client, steps[i].op, steps[i].n, steps[i].replicas, steps[i].size);
}

static void store_seeds(void) {
  buf b = {.len = 0};
  add_register(&b, 0, "seg-a", 0x100000000ull, 1 << 20);
  add_register(&b, 1, "seg-b", 0x200000000ull, 1 << 20);
  static const store_step session[] = {
      {0, STORE_PUT_START, 4, 2, 4096}, {0, STORE_PUT_END, 4, 0, 0}, {1, STORE_GET, 4, 0, 0},
      {1, STORE_QUERY, 4, 0, 0},        {1, STORE_REMOVE, 2, 0, 0},  {1, STORE_DROP_FILE, 4, 0, 0},
      {1, STORE_REPLICAS, 4, 0, 0},     {1, STORE_CLEAR, 4, 0, 0},   {0, STORE_CLEAR, 4, 0, 0},
  };
  add_steps(&b, session, sizeof session / sizeof *session);
  put("fuzz_store", "put_get_remove", b.data, b.len);

  /* A pool that fills: puts evict, a client leaves with its replicas. */
  b.len = 0;
  add_register(&b, 0, "seg-a", 0x100000000ull, 64 << 10);
  add_register(&b, 1, "seg-b", 0x200000000ull, 64 << 10);
  for (int round = 0; round < 3; round++) {
    add_keys(&b, round & 1, STORE_PUT_START, 8, 1, 8192);
    add_keys(&b, round & 1, STORE_PUT_END, 8, 0, 0);
  }
  uint8_t leave[4] = {0x81, 0, 0, 0};
  add(&b, leave, sizeof leave);
  add_keys(&b, 0, STORE_GET, 8, 0, 0);
  add_register(&b, 2, "", 0, 0); /* a client that lends no memory */
  store_writer w = {0};
  store_put_u8(&w, STORE_REMOVE_ALL);
  add_request(&b, 2, 0, &w);
  put("fuzz_store", "evict_and_leave", b.data, b.len);

  /* Upserts: a larger new value beside the committed one, read between
   * its start and end. */
  b.len = 0;
  add_register(&b, 0, "seg-a", 0x100000000ull, 1 << 20);
  add_register(&b, 1, "seg-b", 0x200000000ull, 1 << 20);
  add_register(&b, 2, "", 0, 0);
  static const store_step upsert[] = {
      {2, STORE_PUT_START, 3, 2, 4096}, {2, STORE_PUT_END, 3, 0, 0},
      {0, STORE_GET, 3, 0, 0},          {2, STORE_UPSERT_START, 2, 1, 100000},
      {0, STORE_GET, 2, 0, 0},          {2, STORE_PUT_END, 2, 0, 0},
      {0, STORE_QUERY, 3, 0, 0},        {0, STORE_REMOVE, 3, 0, 0},
  };
  add_steps(&b, upsert, sizeof upsert / sizeof *upsert);
  put("fuzz_store", "upsert", b.data, b.len);

  /* In a small pool, upserts that must evict, and a client whose bad
   * request (an unknown op) ends its connection. */
  b.len = 0;
  add_register(&b, 0, "small", 0x100000000ull, 64 << 10);
  add_register(&b, 2, "", 0, 0);
  static const store_step evicting[] = {
      {2, STORE_PUT_START, 4, 1, 16 << 10},
      {2, STORE_PUT_END, 4, 0, 0},
      {0, STORE_GET, 4, 0, 0},
      {2, STORE_UPSERT_START, 4, 1, 16 << 10},
      {2, STORE_PUT_END, 4, 0, 0},
      {2, STORE_PUT_START, 1, 1, 40 << 10},
  };
  add_steps(&b, evicting, sizeof evicting / sizeof *evicting);
  uint8_t bad[] = {0, 0, 1, 0, 99}; /* an unknown op: client 0 and its segment leave */
  add(&b, bad, sizeof bad);
  add_keys(&b, 2, STORE_GET, 4, 0, 0);
  put("fuzz_store", "upsert_evictions", b.data, b.len);
}

int main(int argc, char **argv) {
  root = argc > 1 ? argv[1] : "fuzz/corpus";
  mkdir(root, 0755);
  header_seeds();
  wire_seeds();
  metadata_seeds();
  server_seeds();
  client_seeds();
  store_seeds();
  return 0;
}
