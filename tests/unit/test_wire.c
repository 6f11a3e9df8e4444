/* test_wire.c - unit tests of the frame codecs and their checks.
 *
 * The decoders are the first code that sees bytes from the network, so
 * besides round trips this checks every limit the header and bodies promise
 * to enforce, and feeds 200,000 random or mutated frames to every decoder
 * (the ASan build turns any overread into a failure). Accepted input must
 * re-encode to the same bytes, which catches decoders that ignore a field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c_reference.h"
#include "ferry.h"
#include "wire/wire.h"

#define HELLO_FIXED (2 + 2 + 1 + 8 + FERRY_WIRE_NONCE_SIZE + 2)
#define FACTS_FIXED (8 + 4 + FERRY_WIRE_BOOT_ID_SIZE + 4 + 1)
#define DESCRIPTOR_FIXED (4 + 2)
#define HELLO_REPLY_FIXED (FERRY_WIRE_NEGOTIATION_SIZE + FACTS_FIXED)

/* splitmix64: deterministic randomness, so a failure reproduces. */
static uint64_t rng_next(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void fill_random(uint64_t *seed, uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)rng_next(seed);
}

static ferry_frame_header header(uint8_t type, uint8_t flags, uint32_t count, int32_t status,
                                 uint64_t body_len) {
  ferry_frame_header h = {type, flags, count, status, body_len, 0x1122334455667788ull};
  return h;
}

/* Encodes h and decodes it back; returns the decoder's verdict. */
static ferry_status check_header(ferry_frame_header h) {
  uint8_t buf[FERRY_WIRE_HEADER_SIZE];
  ferry_frame_header out;
  ferry_wire_header_encode(buf, &h);
  return ferry_wire_header_decode(buf, &out);
}

static void assert_detail(const char *needle) {
  if (strstr(ferry_last_error(), needle) == NULL)
    fail_msg("detail \"%s\" lacks \"%s\"", ferry_last_error(), needle);
}

/* ---- Header ------------------------------------------------------------- */

static void test_header_round_trip(void **state) {
  (void)state;
  ferry_frame_header h =
      header(FERRY_FRAME_READ_REPLY, FERRY_FRAME_FLAG_CHECKSUM, 7, FERRY_ENOTREG, 1000);
  h.id = 0xA1B2C3D4E5F60718ull;
  uint8_t buf[FERRY_WIRE_HEADER_SIZE];
  ferry_wire_header_encode(buf, &h);
  /* Pin the layout byte by byte: magic "FRRY", then little-endian fields. */
  const uint8_t expected[FERRY_WIRE_HEADER_SIZE] = {
      'F',  'R',  'R', 'Y', 10, 1, 0, 0, 7,    0,    0,    0,    0xFE, 0xFF, 0xFF, 0xFF,
      0xE8, 0x03, 0,   0,   0,  0, 0, 0, 0x18, 0x07, 0xF6, 0xE5, 0xD4, 0xC3, 0xB2, 0xA1};
  assert_memory_equal(buf, expected, sizeof expected);
  /* A failed reply: body is the reason, count is not checked. */
  ferry_frame_header out;
  assert_int_equal(ferry_wire_header_decode(buf, &out), FERRY_OK);
  assert_int_equal(out.type, h.type);
  assert_int_equal(out.flags, h.flags);
  assert_int_equal(out.count, h.count);
  assert_int_equal(out.status, FERRY_ENOTREG);
  assert_int_equal(out.body_len, h.body_len);
  assert_int_equal(out.id, h.id);

  h = header(FERRY_FRAME_WRITE, 0, FERRY_WIRE_MAX_SEGMENTS, 0,
             FERRY_WIRE_MAX_SEGMENTS * 16ull + FERRY_WIRE_MAX_PAYLOAD);
  ferry_wire_header_encode(buf, &h);
  assert_int_equal(ferry_wire_header_decode(buf, &out), FERRY_OK);
  assert_int_equal(out.body_len, h.body_len);
  assert_int_equal(out.id, h.id);
  h.status = INT32_MIN;
  h.type = FERRY_FRAME_PONG;
  h.body_len = 0;
  ferry_wire_header_encode(buf, &h);
  assert_int_equal(ferry_wire_header_decode(buf, &out), FERRY_OK);
  assert_int_equal(out.status, INT32_MIN);
}

static void test_header_bad_magic_reserved_type(void **state) {
  (void)state;
  uint8_t buf[FERRY_WIRE_HEADER_SIZE];
  ferry_frame_header h = header(FERRY_FRAME_PING, 0, 0, 0, 0), out;
  ferry_wire_header_encode(buf, &h);
  assert_int_equal(ferry_wire_header_decode(buf, &out), FERRY_OK);

  memcpy(buf, "GET ", 4); /* an HTTP client on the RPC port */
  assert_int_equal(ferry_wire_header_decode(buf, &out), FERRY_EPROTO);
  assert_detail("bad magic 0x20544547");

  ferry_wire_header_encode(buf, &h);
  buf[7] = 0x80; /* reserved */
  assert_int_equal(ferry_wire_header_decode(buf, &out), FERRY_EPROTO);
  assert_detail("reserved");

  const uint8_t bad_types[] = {0, FERRY_FRAME_LAST + 1, 200, 255};
  for (size_t i = 0; i < sizeof bad_types; i++) {
    h.type = bad_types[i];
    assert_int_equal(check_header(h), FERRY_EPROTO);
    assert_detail("unknown frame type");
  }
}

static void test_header_flags_and_status(void **state) {
  (void)state;
  assert_int_equal(check_header(header(FERRY_FRAME_PING, 0x4, 0, 0, 0)), FERRY_EPROTO);
  assert_detail("flags");
  /* The after-landed flag: only on WRITE (room for at least the fixed
   * part of a POOL body past the table) and on its ack (a grant). */
  assert_int_equal(check_header(header(FERRY_FRAME_PING, FERRY_FRAME_FLAG_AFTER, 0, 0, 0)),
                   FERRY_EPROTO);
  assert_detail("after-landed");
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE, FERRY_FRAME_FLAG_AFTER, 1, 0,
                                       16 + FERRY_WIRE_POOL_FIXED)),
                   FERRY_OK);
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE, FERRY_FRAME_FLAG_AFTER, 1, 0,
                                       16 + FERRY_WIRE_POOL_FIXED - 1)),
                   FERRY_EPROTO);
  assert_int_equal(
      check_header(header(FERRY_FRAME_WRITE, FERRY_FRAME_FLAG_AFTER | FERRY_FRAME_FLAG_CHECKSUM, 1,
                          0, 16 + FERRY_WIRE_POOL_FIXED + 3)),
      FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE, FERRY_FRAME_FLAG_AFTER, 1, 0,
                                       16 + FERRY_WIRE_MAX_PAYLOAD + FERRY_WIRE_POOL_MAX)),
                   FERRY_OK);
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE, FERRY_FRAME_FLAG_AFTER, 1, 0,
                                       16 + FERRY_WIRE_MAX_PAYLOAD + FERRY_WIRE_POOL_MAX + 1)),
                   FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE_ACK, FERRY_FRAME_FLAG_AFTER, 0, 0,
                                       FERRY_WIRE_POOL_REPLY_SIZE)),
                   FERRY_OK);
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE_ACK, FERRY_FRAME_FLAG_AFTER, 0, 0, 0)),
                   FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_READ, FERRY_FRAME_FLAG_AFTER, 1, 0, 16)),
                   FERRY_EPROTO);
  /* On READ the flag asks for a checksummed reply and adds no bytes. */
  assert_int_equal(check_header(header(FERRY_FRAME_READ, FERRY_FRAME_FLAG_CHECKSUM, 1, 0, 16)),
                   FERRY_OK);
  assert_int_equal(check_header(header(FERRY_FRAME_READ, FERRY_FRAME_FLAG_CHECKSUM, 1, 0, 20)),
                   FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_HELLO, FERRY_FRAME_FLAG_CHECKSUM, 0, 0, 31)),
                   FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_NOTIFY, FERRY_FRAME_FLAG_CHECKSUM, 0, 0, 9)),
                   FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE_ACK, FERRY_FRAME_FLAG_CHECKSUM, 0, 0, 0)),
                   FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE, FERRY_FRAME_FLAG_CHECKSUM, 1, 0, 21)),
                   FERRY_OK);
  /* Requests never carry a status; replies carry only ferry_status codes. */
  assert_int_equal(check_header(header(FERRY_FRAME_PING, 0, 0, FERRY_EINVAL, 0)), FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE, 0, 1, FERRY_EINVAL, 16)), FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_PONG, 0, 0, 5, 0)), FERRY_EPROTO);
  /* A failed reply's reason text is bounded. */
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE_ACK, 0, 0, FERRY_ENOTREG, 1024)),
                   FERRY_OK);
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE_ACK, 0, 0, FERRY_ENOTREG, 1025)),
                   FERRY_EPROTO);
  assert_int_equal(check_header(header(FERRY_FRAME_HELLO_REPLY, 0, 0, FERRY_EVERSION, 20)),
                   FERRY_OK);
}

/* One row per limit: the frame and whether it must pass. */
struct limit_case {
  ferry_frame_header h;
  ferry_status want;
};

static void test_header_limits(void **state) {
  (void)state;
  const uint64_t max = FERRY_WIRE_MAX_PAYLOAD, ck = FERRY_FRAME_FLAG_CHECKSUM;
  const struct limit_case cases[] = {
      {header(FERRY_FRAME_HELLO, 0, 0, 0, HELLO_FIXED), FERRY_OK},
      {header(FERRY_FRAME_HELLO, 0, 0, 0, HELLO_FIXED - 1), FERRY_EPROTO},
      {header(FERRY_FRAME_HELLO, 0, 0, 0, FERRY_WIRE_HELLO_MAX), FERRY_OK},
      {header(FERRY_FRAME_HELLO, 0, 0, 0, FERRY_WIRE_HELLO_MAX + 1), FERRY_EPROTO},
      {header(FERRY_FRAME_HELLO, 0, 0, 0, UINT64_MAX), FERRY_EPROTO},
      {header(FERRY_FRAME_HELLO_REPLY, 0, 0, 0, FERRY_WIRE_NEGOTIATION_SIZE), FERRY_OK},
      {header(FERRY_FRAME_HELLO_REPLY, 0, 0, 0, FERRY_WIRE_NEGOTIATION_SIZE - 1), FERRY_EPROTO},
      {header(FERRY_FRAME_HELLO_REPLY, 0, 0, 0, FERRY_WIRE_HELLO_REPLY_MAX), FERRY_OK},
      {header(FERRY_FRAME_HELLO_REPLY, 0, 0, 0, FERRY_WIRE_HELLO_REPLY_MAX + 1), FERRY_EPROTO},
      {header(FERRY_FRAME_AUTH, 0, 0, 0, FERRY_WIRE_PROOF_SIZE), FERRY_OK},
      {header(FERRY_FRAME_AUTH, 0, 0, 0, FERRY_WIRE_PROOF_SIZE - 1), FERRY_EPROTO},
      {header(FERRY_FRAME_AUTH, 0, 0, 0, FERRY_WIRE_PROOF_SIZE + 1), FERRY_EPROTO},
      {header(FERRY_FRAME_AUTH_REPLY, 0, 0, 0, FERRY_WIRE_PROOF_SIZE + FACTS_FIXED), FERRY_OK},
      {header(FERRY_FRAME_AUTH_REPLY, 0, 0, 0, FERRY_WIRE_AUTH_REPLY_MAX), FERRY_OK},
      {header(FERRY_FRAME_AUTH_REPLY, 0, 0, 0, FERRY_WIRE_AUTH_REPLY_MAX + 1), FERRY_EPROTO},
      {header(FERRY_FRAME_AUTH_REPLY, 0, 0, 0, FERRY_WIRE_PROOF_SIZE), FERRY_EPROTO},
      {header(FERRY_FRAME_AUTH_REPLY, 0, 0, 0, 0), FERRY_EPROTO},
      {header(FERRY_FRAME_AUTH_REPLY, 0, 0, 0, 1), FERRY_EPROTO},
      {header(FERRY_FRAME_REGIONS_REQ, 0, 1, 0, 0), FERRY_EPROTO},
      {header(FERRY_FRAME_REGIONS_REQ, 0, 0, 0, 0), FERRY_OK}, /* the whole table */
      {header(FERRY_FRAME_REGIONS_REQ, 0, 2, 0, 32), FERRY_OK},
      {header(FERRY_FRAME_REGIONS_REQ, 0, 2, 0, 33), FERRY_EPROTO},
      {header(FERRY_FRAME_REGIONS_REQ, 0, 0, 0, 16), FERRY_EPROTO},
      {header(FERRY_FRAME_REGIONS_REQ, 0, FERRY_WIRE_MAX_REGION_RANGES, 0,
              FERRY_WIRE_MAX_REGION_RANGES * 16ull),
       FERRY_OK},
      {header(FERRY_FRAME_REGIONS_REQ, 0, FERRY_WIRE_MAX_REGION_RANGES + 1, 0,
              (FERRY_WIRE_MAX_REGION_RANGES + 1) * 16ull),
       FERRY_EPROTO},
      {header(FERRY_FRAME_WRITE_ACK, 0, 0, 0, 8), FERRY_EPROTO},
      {header(FERRY_FRAME_NOTIFY_ACK, 0, 0, 0, 1), FERRY_EPROTO},
      {header(FERRY_FRAME_PING, 0, 0, 0, 1), FERRY_EPROTO},
      {header(FERRY_FRAME_PONG, 0, 3, 0, 0), FERRY_EPROTO},
      /* The table, then at least the key sections' count byte. */
      {header(FERRY_FRAME_REGIONS_REPLY, 0, 0, 0, 1), FERRY_OK},
      {header(FERRY_FRAME_REGIONS_REPLY, 0, 0, 0, 0), FERRY_EPROTO},
      {header(FERRY_FRAME_REGIONS_REPLY, 0, 3, 0, 49), FERRY_OK},
      {header(FERRY_FRAME_REGIONS_REPLY, 0, 3, 0, 48), FERRY_EPROTO},
      {header(FERRY_FRAME_REGIONS_REPLY, 0, 0, 0, 16), FERRY_OK}, /* key sections */
      {header(FERRY_FRAME_REGIONS_REPLY, 0, (2u << 20) - 1, 0, 32ull << 20), FERRY_OK},
      {header(FERRY_FRAME_REGIONS_REPLY, 0, 2u << 20, 0, (32ull << 20) + 1), FERRY_EPROTO},
      {header(FERRY_FRAME_REGIONS_REPLY, 0, UINT32_MAX, 0, UINT32_MAX * 16ull), FERRY_EPROTO},
      {header(FERRY_FRAME_WRITE, 0, 1, 0, 16), FERRY_OK}, /* payload 0 is allowed by the header */
      {header(FERRY_FRAME_WRITE, 0, 0, 0, 0), FERRY_EPROTO},
      {header(FERRY_FRAME_WRITE, 0, 1025, 0, 1025 * 16), FERRY_EPROTO},
      {header(FERRY_FRAME_WRITE, 0, 2, 0, 31), FERRY_EPROTO},
      {header(FERRY_FRAME_WRITE, 0, 1, 0, 16 + max), FERRY_OK},
      {header(FERRY_FRAME_WRITE, 0, 1, 0, 17 + max), FERRY_EPROTO},
      {header(FERRY_FRAME_WRITE, ck, 1, 0, 19), FERRY_EPROTO},
      {header(FERRY_FRAME_WRITE, ck, 1, 0, 20 + max), FERRY_OK},
      {header(FERRY_FRAME_WRITE, ck, 1, 0, 21 + max), FERRY_EPROTO},
      {header(FERRY_FRAME_WRITE, 0, 1, 0, UINT64_MAX), FERRY_EPROTO},
      {header(FERRY_FRAME_READ, 0, 1, 0, 16), FERRY_OK},
      {header(FERRY_FRAME_READ, 0, 1024, 0, 1024 * 16), FERRY_OK},
      {header(FERRY_FRAME_READ, 0, 0, 0, 0), FERRY_EPROTO},
      {header(FERRY_FRAME_READ, 0, 1025, 0, 1025 * 16), FERRY_EPROTO},
      {header(FERRY_FRAME_READ, 0, 2, 0, 33), FERRY_EPROTO},
      {header(FERRY_FRAME_READ, 0, UINT32_MAX, 0, UINT32_MAX * 16ull), FERRY_EPROTO},
      {header(FERRY_FRAME_READ_REPLY, 0, 0, 0, 0), FERRY_OK},
      {header(FERRY_FRAME_READ_REPLY, 0, 0, 0, max), FERRY_OK},
      {header(FERRY_FRAME_READ_REPLY, 0, 0, 0, max + 1), FERRY_EPROTO},
      {header(FERRY_FRAME_READ_REPLY, ck, 0, 0, 3), FERRY_EPROTO},
      {header(FERRY_FRAME_READ_REPLY, ck, 0, 0, max + 4), FERRY_OK},
      {header(FERRY_FRAME_READ_REPLY, ck, 0, 0, max + 5), FERRY_EPROTO},
      {header(FERRY_FRAME_NOTIFY, 0, 0, 0, 2), FERRY_EPROTO},
      {header(FERRY_FRAME_NOTIFY, 0, 0, 0, 3), FERRY_OK},
      {header(FERRY_FRAME_NOTIFY, 0, 0, 0, 2 + FERRY_WIRE_MAX_NAME + FERRY_WIRE_MAX_NOTIFY_DATA),
       FERRY_OK},
      {header(FERRY_FRAME_NOTIFY, 0, 0, 0, 3 + FERRY_WIRE_MAX_NAME + FERRY_WIRE_MAX_NOTIFY_DATA),
       FERRY_EPROTO},
      {header(FERRY_FRAME_CUT, 0, 0, 0, FERRY_WIRE_NONCE_SIZE), FERRY_OK}, /* a HELLO nonce */
      {header(FERRY_FRAME_CUT, 0, 0, 0, FERRY_WIRE_NONCE_SIZE - 1), FERRY_EPROTO},
      {header(FERRY_FRAME_CUT, 0, 0, 0, FERRY_WIRE_NONCE_SIZE + 1), FERRY_EPROTO},
      {header(FERRY_FRAME_CUT_REPLY, 0, 0, 0, 0), FERRY_OK},
      {header(FERRY_FRAME_CUT_REPLY, 0, 0, 0, 1), FERRY_EPROTO},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ferry_status st = check_header(cases[i].h);
    if (st != cases[i].want)
      fail_msg("case %zu (type %u count %u body %llu): got %d (%s), want %d", i,
               (unsigned)cases[i].h.type, (unsigned)cases[i].h.count,
               (unsigned long long)cases[i].h.body_len, st, ferry_last_error(), cases[i].want);
  }
  /* The detail names the type and the numbers. */
  assert_int_equal(check_header(header(FERRY_FRAME_WRITE, 0, 2000, 0, 2000 * 16)), FERRY_EPROTO);
  assert_string_equal(ferry_last_error(), "frame type 7: 2000 segments exceeds 1024");
}

/* ---- Segments ----------------------------------------------------------- */

static void test_segments(void **state) {
  (void)state;
  const ferry_region segs[3] = {{0x1000, 10}, {0xFFFF0000ull, 4096}, {UINT64_MAX - 8, 8}};
  uint8_t buf[3 * 16];
  ferry_region out[3];
  uint64_t total = 0;
  ferry_wire_segments_encode(buf, segs, 3);
  assert_int_equal(buf[0], 0x00);
  assert_int_equal(buf[1], 0x10);
  assert_int_equal(buf[8], 10);
  assert_int_equal(ferry_wire_segments_decode(buf, 3, out, &total), FERRY_OK);
  assert_memory_equal(out, segs, sizeof segs);
  assert_int_equal(total, 10 + 4096 + 8);

  ferry_region bad[2] = {{0x1000, 10}, {0x2000, 0}}; /* empty segment */
  ferry_wire_segments_encode(buf, bad, 2);
  assert_int_equal(ferry_wire_segments_decode(buf, 2, out, &total), FERRY_EPROTO);
  assert_detail("length 0");
  bad[1] = (ferry_region){UINT64_MAX - 8, 9}; /* wraps */
  ferry_wire_segments_encode(buf, bad, 2);
  assert_int_equal(ferry_wire_segments_decode(buf, 2, out, &total), FERRY_EPROTO);
  assert_detail("wraps");
  /* The total is bounded, and its sum cannot overflow on the way. */
  bad[0] = (ferry_region){0, FERRY_WIRE_MAX_PAYLOAD};
  bad[1] = (ferry_region){1ull << 60, 1};
  ferry_wire_segments_encode(buf, bad, 2);
  assert_int_equal(ferry_wire_segments_decode(buf, 2, out, &total), FERRY_EPROTO);
  bad[1] = (ferry_region){0, UINT64_MAX};
  ferry_wire_segments_encode(buf, bad, 2);
  assert_int_equal(ferry_wire_segments_decode(buf, 2, out, &total), FERRY_EPROTO);
  ferry_wire_segments_encode(buf, bad, 1);
  assert_int_equal(ferry_wire_segments_decode(buf, 1, out, &total), FERRY_OK);
  assert_int_equal(total, FERRY_WIRE_MAX_PAYLOAD);
  assert_int_equal(ferry_wire_segments_decode(buf, FERRY_WIRE_MAX_SEGMENTS + 1, out, &total),
                   FERRY_EPROTO);
}

/* ---- Handshake ---------------------------------------------------------- */

static ferry_hello sample_hello(const char *name) {
  ferry_hello h = {.version_min = 1,
                   .version_max = 3,
                   .conn_kind = FERRY_CONN_DATA,
                   .engine_id = 0x0123456789ABCDEFull};
  for (int i = 0; i < FERRY_WIRE_NONCE_SIZE; i++)
    h.nonce[i] = (uint8_t)(0xA0 + i);
  snprintf(h.name, sizeof h.name, "%s", name);
  return h;
}

static void test_hello(void **state) {
  (void)state;
  uint8_t buf[FERRY_WIRE_HELLO_MAX + 8];
  ferry_hello h = sample_hello("10.0.0.1:15023"), out;
  size_t n = ferry_wire_hello_encode(buf, &h);
  assert_int_equal(n, HELLO_FIXED + strlen("10.0.0.1:15023"));
  memset(&out, 0x55, sizeof out);
  assert_int_equal(ferry_wire_hello_decode(buf, n, &out), FERRY_OK);
  assert_int_equal(out.version_min, 1);
  assert_int_equal(out.version_max, 3);
  assert_int_equal(out.conn_kind, FERRY_CONN_DATA);
  assert_int_equal(out.engine_id, h.engine_id);
  assert_memory_equal(out.nonce, h.nonce, FERRY_WIRE_NONCE_SIZE);
  assert_string_equal(out.name, "10.0.0.1:15023");

  /* Truncated and overlong bodies disagree with the name length. */
  assert_int_equal(ferry_wire_hello_decode(buf, n - 1, &out), FERRY_EPROTO);
  assert_int_equal(ferry_wire_hello_decode(buf, n + 1, &out), FERRY_EPROTO);
  assert_int_equal(ferry_wire_hello_decode(buf, HELLO_FIXED - 1, &out), FERRY_EPROTO);

  /* Empty and longest names. */
  h = sample_hello("");
  n = ferry_wire_hello_encode(buf, &h);
  assert_int_equal(n, HELLO_FIXED);
  assert_int_equal(ferry_wire_hello_decode(buf, n, &out), FERRY_OK);
  assert_string_equal(out.name, "");
  memset(h.name, 'x', FERRY_WIRE_MAX_NAME);
  h.name[FERRY_WIRE_MAX_NAME] = '\0';
  n = ferry_wire_hello_encode(buf, &h);
  assert_int_equal(n, FERRY_WIRE_HELLO_MAX);
  assert_int_equal(ferry_wire_hello_decode(buf, n, &out), FERRY_OK);
  assert_string_equal(out.name, h.name);

  /* A name length over the limit is refused even if the bytes are there. */
  buf[HELLO_FIXED - 2] = (FERRY_WIRE_MAX_NAME + 1) & 0xff;
  buf[HELLO_FIXED - 1] = (FERRY_WIRE_MAX_NAME + 1) >> 8;
  assert_int_equal(ferry_wire_hello_decode(buf, n, &out), FERRY_EPROTO);
  assert_detail("exceeds");
  assert_int_equal(ferry_wire_hello_decode(buf, n + 1, &out), FERRY_EPROTO);

  h = sample_hello("abc");
  n = ferry_wire_hello_encode(buf, &h);
  buf[HELLO_FIXED + 1] = '\0'; /* embedded NUL would silently cut the name */
  assert_int_equal(ferry_wire_hello_decode(buf, n, &out), FERRY_EPROTO);
}

static void add_descriptor(ferry_hello_reply *r, unsigned transport, const char *data) {
  ferry_wire_descriptor *d = &r->descriptors[r->descriptor_count++];
  d->transport = transport;
  d->len = (uint16_t)strlen(data);
  memcpy(d->data, data, d->len);
}

static ferry_hello_reply sample_reply(uint8_t auth_required) {
  ferry_hello_reply r = {.version = 2,
                         .version_min = 2,
                         .version_max = 3,
                         .auth_required = auth_required,
                         .engine_id = 0xFEEDFACECAFEBEEFull,
                         .transports = 0x3,
                         .pid = 4242};
  for (int i = 0; i < 16; i++) {
    r.nonce[i] = (uint8_t)i;
    r.boot_id[i] = (uint8_t)(0xF0 | i);
  }
  add_descriptor(&r, FERRY_TRANSPORT_SHM, "/tmp/ferry-4242.sock");
  return r;
}

static void assert_facts_equal(const ferry_hello_reply *a, const ferry_hello_reply *b) {
  assert_int_equal(a->engine_id, b->engine_id);
  assert_int_equal(a->transports, b->transports);
  assert_memory_equal(a->boot_id, b->boot_id, 16);
  assert_int_equal(a->pid, b->pid);
  assert_int_equal(a->descriptor_count, b->descriptor_count);
  for (unsigned i = 0; i < a->descriptor_count; i++) {
    assert_int_equal(a->descriptors[i].transport, b->descriptors[i].transport);
    assert_int_equal(a->descriptors[i].len, b->descriptors[i].len);
    assert_memory_equal(a->descriptors[i].data, b->descriptors[i].data, a->descriptors[i].len);
  }
}

static void test_hello_reply(void **state) {
  (void)state;
  ferry_hello_reply r = sample_reply(0);
  uint8_t buf[FERRY_WIRE_HELLO_REPLY_MAX + 1];
  size_t n = ferry_wire_hello_reply_encode(buf, &r);
  assert_int_equal(n, HELLO_REPLY_FIXED + DESCRIPTOR_FIXED + r.descriptors[0].len);
  ferry_hello_reply out;
  memset(&out, 0x55, sizeof out);
  assert_int_equal(ferry_wire_hello_reply_decode(buf, n, &out), FERRY_OK);
  assert_int_equal(out.version, 2);
  assert_int_equal(out.version_min, 2);
  assert_int_equal(out.version_max, 3);
  assert_int_equal(out.auth_required, 0);
  assert_memory_equal(out.nonce, r.nonce, 16);
  assert_facts_equal(&out, &r);
  assert_int_equal(ferry_wire_hello_reply_decode(buf, n - 1, &out), FERRY_EPROTO);
  assert_int_equal(ferry_wire_hello_reply_decode(buf, n + 1, &out), FERRY_EPROTO);
  assert_int_equal(ferry_wire_hello_reply_decode(buf, HELLO_REPLY_FIXED - 1, &out), FERRY_EPROTO);

  r.descriptor_count = 0;
  n = ferry_wire_hello_reply_encode(buf, &r);
  assert_int_equal(n, HELLO_REPLY_FIXED);
  assert_int_equal(ferry_wire_hello_reply_decode(buf, n, &out), FERRY_OK);
  assert_int_equal(out.descriptor_count, 0);
  assert_null(ferry_wire_descriptor_find(&out, FERRY_TRANSPORT_SHM));
}

/* A target that asks for the secret reveals nothing about itself before
 * the proof: the body is the negotiation alone and carries no fact. */
static void test_hello_reply_with_auth_hides_facts(void **state) {
  (void)state;
  ferry_hello_reply r = sample_reply(1), out;
  uint8_t buf[FERRY_WIRE_HELLO_REPLY_MAX];
  size_t n = ferry_wire_hello_reply_encode(buf, &r);
  assert_int_equal(n, FERRY_WIRE_NEGOTIATION_SIZE);
  assert_null(memmem(buf, n, r.boot_id, sizeof r.boot_id));
  memset(&out, 0x55, sizeof out);
  assert_int_equal(ferry_wire_hello_reply_decode(buf, n, &out), FERRY_OK);
  assert_int_equal(out.auth_required, 1);
  assert_memory_equal(out.nonce, r.nonce, 16);
  ferry_hello_reply zero = {0};
  assert_facts_equal(&out, &zero);
  /* Facts appended to a reply that asks for the secret are refused. */
  r.auth_required = 0;
  n = ferry_wire_hello_reply_encode(buf, &r);
  buf[6] = 1; /* auth_required */
  assert_int_equal(ferry_wire_hello_reply_decode(buf, n, &out), FERRY_EPROTO);
}

static void test_facts(void **state) {
  (void)state;
  ferry_hello_reply r = sample_reply(1), out;
  uint8_t buf[FERRY_WIRE_FACTS_MAX + 1];
  size_t n = ferry_wire_facts_encode(buf, &r);
  assert_int_equal(n, FACTS_FIXED + DESCRIPTOR_FIXED + r.descriptors[0].len);
  memset(&out, 0, sizeof out);
  assert_int_equal(ferry_wire_facts_decode(buf, n, &out), FERRY_OK);
  assert_facts_equal(&out, &r);
  assert_int_equal(ferry_wire_facts_decode(buf, n - 1, &out), FERRY_EPROTO);
  assert_int_equal(ferry_wire_facts_decode(buf, FACTS_FIXED - 1, &out), FERRY_EPROTO);
}

/* Decodes r's facts after `mutate` changed their encoding; returns the
 * status, with the detail left in ferry_last_error. */
static ferry_status facts_after(ferry_hello_reply r, void (*mutate)(uint8_t *, size_t *)) {
  uint8_t buf[FERRY_WIRE_FACTS_MAX + 64];
  size_t n = ferry_wire_facts_encode(buf, &r);
  if (mutate)
    mutate(buf, &n);
  ferry_hello_reply out;
  memset(&out, 0, sizeof out);
  return ferry_wire_facts_decode(buf, n, &out);
}

/* The first descriptor's transport field and length field. */
#define FIRST_TRANSPORT (FACTS_FIXED)
#define FIRST_LEN (FACTS_FIXED + 4)
static void too_many(uint8_t *b, size_t *n) { b[FACTS_FIXED - 1] = FERRY_WIRE_MAX_DESCRIPTORS + 1; }
static void unknown_bit(uint8_t *b, size_t *n) { b[FIRST_TRANSPORT] = 0x80; }
static void two_bits(uint8_t *b, size_t *n) { b[FIRST_TRANSPORT] = 0x3; }
static void no_bit(uint8_t *b, size_t *n) { b[FIRST_TRANSPORT] = 0; }
static void len_past_body(uint8_t *b, size_t *n) { b[FIRST_LEN] += 1; }
static void trailing_byte(uint8_t *b, size_t *n) { b[(*n)++] = 0; }
static void oversized(uint8_t *b, size_t *n) {
  /* One descriptor longer than the limit, and the body really that long. */
  b[FIRST_LEN] = (FERRY_WIRE_MAX_DESCRIPTOR + 1) & 0xff;
  b[FIRST_LEN + 1] = (FERRY_WIRE_MAX_DESCRIPTOR + 1) >> 8;
  memset(b + FIRST_LEN + 2, 'x', FERRY_WIRE_MAX_DESCRIPTOR + 1);
  *n = FIRST_LEN + 2 + FERRY_WIRE_MAX_DESCRIPTOR + 1;
}

/* A hostile target's descriptor list is checked before any transport sees
 * it: count, transport bits, duplicates, lengths, exact fill. */
static void test_facts_descriptors_checked(void **state) {
  (void)state;
  ferry_hello_reply r = sample_reply(0);
  add_descriptor(&r, FERRY_TRANSPORT_FABRIC, "prov=tcp;ofi_rxm");
  assert_int_equal(facts_after(r, NULL), FERRY_OK);
  uint8_t buf[FERRY_WIRE_FACTS_MAX];
  ferry_hello_reply out;
  assert_int_equal(ferry_wire_facts_decode(buf, ferry_wire_facts_encode(buf, &r), &out), FERRY_OK);
  const ferry_wire_descriptor *d = ferry_wire_descriptor_find(&out, FERRY_TRANSPORT_FABRIC);
  assert_non_null(d);
  assert_memory_equal(d->data, "prov=tcp;ofi_rxm", d->len);
  assert_null(ferry_wire_descriptor_find(&out, FERRY_TRANSPORT_TCP));

  assert_int_equal(facts_after(r, too_many), FERRY_EPROTO);
  assert_detail("transport descriptors");
  assert_int_equal(facts_after(r, unknown_bit), FERRY_EPROTO);
  assert_detail("unknown transport");
  assert_int_equal(facts_after(r, two_bits), FERRY_EPROTO);
  assert_detail("unknown transport");
  assert_int_equal(facts_after(r, no_bit), FERRY_EPROTO);
  r.descriptor_count = 1;
  assert_int_equal(facts_after(r, len_past_body), FERRY_EPROTO);
  assert_detail("left");
  assert_int_equal(facts_after(r, trailing_byte), FERRY_EPROTO);
  assert_detail("after the descriptors");
  assert_int_equal(facts_after(r, oversized), FERRY_EPROTO);
  assert_detail("limit");
  add_descriptor(&r, FERRY_TRANSPORT_SHM, "/elsewhere");
  assert_int_equal(facts_after(r, NULL), FERRY_EPROTO);
  assert_detail("described twice");
}

/* Where a sealed frame's tags go: after the table of a WRITE, right after
 * the header of a READ_REPLY, after the whole body of anything else. */
static void split(ferry_frame_header h, uint64_t *head, uint64_t *payload) {
  ferry_wire_split(&h, head, payload);
}

static void test_split(void **state) {
  (void)state;
  uint64_t head, payload;
  split(header(FERRY_FRAME_WRITE, 0, 2, 0, 32 + 100), &head, &payload);
  assert_int_equal(head, 32);
  assert_int_equal(payload, 100);
  split(header(FERRY_FRAME_READ, 0, 2, 0, 32), &head, &payload);
  assert_int_equal(head, 32);
  assert_int_equal(payload, 0);
  split(header(FERRY_FRAME_READ_REPLY, FERRY_FRAME_FLAG_CHECKSUM, 0, 0, 104), &head, &payload);
  assert_int_equal(head, 0);
  assert_int_equal(payload, 104);
  split(header(FERRY_FRAME_READ_REPLY, 0, 0, FERRY_ENOTREG, 40), &head, &payload);
  assert_int_equal(head, 40);
  assert_int_equal(payload, 0);
  split(header(FERRY_FRAME_NOTIFY, 0, 0, 0, 7), &head, &payload);
  assert_int_equal(head, 7);
  assert_int_equal(payload, 0);
}

/* ---- Region tables ------------------------------------------------------ */

static ferry_status decode_regions(const ferry_region *table, uint32_t count,
                                   ferry_region_table *out) {
  uint8_t buf[16 * 8 + 1];
  size_t len = ferry_wire_regions_encode(buf, table, count, NULL, 0);
  assert_int_equal(len, count * 16u + 1);
  return ferry_wire_regions_decode(buf, len, count, out);
}

static void test_regions(void **state) {
  (void)state;
  const ferry_region good[3] = {{0x1000, 0x1000}, {0x2000, 0x10}, {UINT64_MAX - 1, 1}};
  ferry_region_table out;
  assert_int_equal(decode_regions(good, 3, &out), FERRY_OK);
  assert_int_equal(out.count, 3);
  assert_int_equal(out.key_sections, 0);
  assert_memory_equal(out.regions, good, sizeof good);
  ferry_region_table_free(&out);
  assert_int_equal(decode_regions(good, 0, &out), FERRY_OK);
  assert_null(out.regions);

  const ferry_region unsorted[2] = {{0x2000, 0x10}, {0x1000, 0x10}};
  const ferry_region overlapping[2] = {{0x1000, 0x1001}, {0x2000, 0x10}};
  const ferry_region duplicate[2] = {{0x1000, 0x10}, {0x1000, 0x10}};
  const ferry_region empty[1] = {{0x1000, 0}};
  const ferry_region wraps[1] = {{UINT64_MAX - 1, 2}};
  assert_int_equal(decode_regions(unsorted, 2, &out), FERRY_EPROTO);
  assert_null(out.regions);
  assert_detail("not sorted");
  assert_int_equal(decode_regions(overlapping, 2, &out), FERRY_EPROTO);
  assert_int_equal(decode_regions(duplicate, 2, &out), FERRY_EPROTO);
  assert_int_equal(decode_regions(empty, 1, &out), FERRY_EPROTO);
  assert_int_equal(decode_regions(wraps, 1, &out), FERRY_EPROTO);
  assert_null(out.regions);

  uint8_t buf[49];
  ferry_wire_regions_encode(buf, good, 3, NULL, 0);
  assert_int_equal(ferry_wire_regions_decode(buf, 48, 3, &out), FERRY_EPROTO);
  assert_int_equal(ferry_wire_regions_decode(buf, 49, 2, &out), FERRY_EPROTO);
  assert_int_equal(ferry_wire_regions_decode(buf, 33, UINT32_MAX, &out), FERRY_EPROTO);
}

/* Per-transport keys ride after the table, and every section is checked. */
static void test_region_keys(void **state) {
  (void)state;
  const ferry_region table[2] = {{0x1000, 0x1000}, {0x4000, 0x10}};
  uint8_t fabric_keys[2 * 12], shm_keys[2 * 2] = {1, 2, 3, 4};
  for (size_t i = 0; i < sizeof fabric_keys; i++)
    fabric_keys[i] = (uint8_t)(0xa0 + i);
  ferry_region_keys keys[2] = {{FERRY_TRANSPORT_FABRIC, 12, fabric_keys},
                               {FERRY_TRANSPORT_SHM, 2, shm_keys}};
  uint8_t buf[256];
  size_t len = ferry_wire_regions_encode(buf, table, 2, keys, 2);
  assert_int_equal(len, ferry_wire_regions_size(2, keys, 2));
  assert_int_equal(len, 32 + 1 + 6 + 24 + 6 + 4);
  ferry_region_table out;
  assert_int_equal(ferry_wire_regions_decode(buf, len, 2, &out), FERRY_OK);
  assert_int_equal(out.key_sections, 2);
  assert_int_equal(out.keys[0].transport, FERRY_TRANSPORT_FABRIC);
  assert_int_equal(out.keys[0].size, 12);
  assert_memory_equal(out.keys[0].data, fabric_keys, sizeof fabric_keys);
  assert_memory_equal(out.keys[1].data, shm_keys, sizeof shm_keys);
  ferry_region_table_free(&out);

  assert_int_equal(ferry_wire_regions_decode(buf, len - 1, 2, &out), FERRY_EPROTO);
  assert_detail("shm region keys");
  uint8_t longer[257];
  memcpy(longer, buf, len);
  longer[len] = 0;
  assert_int_equal(ferry_wire_regions_decode(longer, len + 1, 2, &out), FERRY_EPROTO);
  assert_detail("after the region table");

  ferry_region_keys twice[2] = {keys[0], keys[0]};
  len = ferry_wire_regions_encode(buf, table, 2, twice, 2);
  assert_int_equal(ferry_wire_regions_decode(buf, len, 2, &out), FERRY_EPROTO);
  assert_detail("sent twice");
  ferry_region_keys unknown = {0x100, 12, fabric_keys},
                    oversized = {FERRY_TRANSPORT_FABRIC, 0, NULL};
  len = ferry_wire_regions_encode(buf, table, 2, &unknown, 1);
  assert_int_equal(ferry_wire_regions_decode(buf, len, 2, &out), FERRY_EPROTO);
  assert_detail("unknown transport");
  len = ferry_wire_regions_encode(buf, table, 2, &oversized, 1);
  assert_int_equal(ferry_wire_regions_decode(buf, len, 2, &out), FERRY_EPROTO);
  assert_null(out.regions);
  buf[32] = FERRY_WIRE_MAX_DESCRIPTORS + 1;
  assert_int_equal(ferry_wire_regions_decode(buf, 33, 2, &out), FERRY_EPROTO);
  assert_detail("key sections");
}

/* REGIONS_REQ bodies: the ranges an initiator needs, each one checked,
 * sorted and disjoint (adjacent is fine), within the limit, length exact. */
static void test_ranges(void **state) {
  (void)state;
  const ferry_region good[] = {{0x1000, 0x10}, {0x1010, 0x1}, {0x7f0000000000ull, 1 << 20}};
  uint8_t buf[4 * 16];
  ferry_region out[4];
  ferry_wire_ranges_encode(buf, good, 3);
  assert_int_equal(ferry_wire_ranges_decode(buf, 48, 3, out), FERRY_OK);
  assert_memory_equal(out, good, sizeof good);
  assert_int_equal(ferry_wire_ranges_decode(buf, 0, 0, out), FERRY_OK);
  assert_int_equal(ferry_wire_ranges_decode(buf, 47, 3, out), FERRY_EPROTO);
  assert_int_equal(ferry_wire_ranges_decode(buf, 48, 2, out), FERRY_EPROTO);
  assert_int_equal(ferry_wire_ranges_decode(buf, 16, FERRY_WIRE_MAX_REGION_RANGES + 1, out),
                   FERRY_EPROTO);
  assert_detail("limit");
  const ferry_region unsorted[] = {{0x2000, 0x10}, {0x1000, 0x10}};
  const ferry_region overlapping[] = {{0x1000, 0x11}, {0x1010, 0x10}};
  const ferry_region empty[] = {{0x1000, 0}};
  const ferry_region wraps[] = {{UINT64_MAX - 1, 2}};
  ferry_wire_ranges_encode(buf, unsorted, 2);
  assert_int_equal(ferry_wire_ranges_decode(buf, 32, 2, out), FERRY_EPROTO);
  assert_detail("not sorted and disjoint");
  ferry_wire_ranges_encode(buf, overlapping, 2);
  assert_int_equal(ferry_wire_ranges_decode(buf, 32, 2, out), FERRY_EPROTO);
  ferry_wire_ranges_encode(buf, empty, 1);
  assert_int_equal(ferry_wire_ranges_decode(buf, 16, 1, out), FERRY_EPROTO);
  ferry_wire_ranges_encode(buf, wraps, 1);
  assert_int_equal(ferry_wire_ranges_decode(buf, 16, 1, out), FERRY_EPROTO);
}

/* ---- Notifications ------------------------------------------------------ */

static void test_notify(void **state) {
  (void)state;
  uint8_t buf[2 + FERRY_WIRE_MAX_NAME + 64];
  const char *name, *data_text = "hello\0world";
  const uint8_t *data;
  size_t name_len, data_len;
  size_t n = ferry_wire_notify_encode(buf, "job-7", data_text, 11);
  assert_int_equal(n, ferry_wire_notify_size(5, 11));
  assert_int_equal(n, 2 + 5 + 11);
  assert_int_equal(ferry_wire_notify_decode(buf, n, &name, &name_len, &data, &data_len), FERRY_OK);
  assert_int_equal(name_len, 5);
  assert_memory_equal(name, "job-7", 5);
  assert_int_equal(data_len, 11);
  assert_memory_equal(data, data_text, 11);

  n = ferry_wire_notify_encode(buf, "x", NULL, 0);
  assert_int_equal(n, 3);
  assert_int_equal(ferry_wire_notify_decode(buf, n, &name, &name_len, &data, &data_len), FERRY_OK);
  assert_int_equal(data_len, 0);

  /* Name missing, empty, overrunning the body, too long. */
  assert_int_equal(ferry_wire_notify_decode(buf, 1, &name, &name_len, &data, &data_len),
                   FERRY_EPROTO);
  buf[0] = 0;
  assert_int_equal(ferry_wire_notify_decode(buf, 3, &name, &name_len, &data, &data_len),
                   FERRY_EPROTO);
  buf[0] = 2;
  assert_int_equal(ferry_wire_notify_decode(buf, 3, &name, &name_len, &data, &data_len),
                   FERRY_EPROTO);
  char long_name[FERRY_WIRE_MAX_NAME + 2];
  memset(long_name, 'n', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  n = ferry_wire_notify_encode(buf, long_name, "d", 1);
  assert_int_equal(ferry_wire_notify_decode(buf, n, &name, &name_len, &data, &data_len),
                   FERRY_EPROTO);
  assert_detail("name");
  long_name[FERRY_WIRE_MAX_NAME] = '\0';
  n = ferry_wire_notify_encode(buf, long_name, "d", 1);
  assert_int_equal(ferry_wire_notify_decode(buf, n, &name, &name_len, &data, &data_len), FERRY_OK);
  assert_int_equal(name_len, FERRY_WIRE_MAX_NAME);

  /* Data bounded by FERRY_WIRE_MAX_NOTIFY_DATA. */
  size_t big = 2 + 1 + FERRY_WIRE_MAX_NOTIFY_DATA + 1;
  uint8_t *p = calloc(1, big);
  assert_non_null(p);
  p[0] = 1;
  p[2] = 'n';
  assert_int_equal(ferry_wire_notify_decode(p, big - 1, &name, &name_len, &data, &data_len),
                   FERRY_OK);
  assert_int_equal(data_len, FERRY_WIRE_MAX_NOTIFY_DATA);
  assert_int_equal(ferry_wire_notify_decode(p, big, &name, &name_len, &data, &data_len),
                   FERRY_EPROTO);
  free(p);
}

/* ---- crc32c ------------------------------------------------------------- */

static void test_crc32c_vectors(void **state) {
  (void)state;
  assert_int_equal(ferry_crc32c(0, "123456789", 9), 0xE3069283u);
  assert_int_equal(ferry_crc32c(0, "", 0), 0);
  /* RFC 3720 (iSCSI) appendix B.4 vectors. */
  uint8_t buf[32];
  memset(buf, 0, sizeof buf);
  assert_int_equal(ferry_crc32c(0, buf, 32), 0x8A9136AAu);
  memset(buf, 0xFF, sizeof buf);
  assert_int_equal(ferry_crc32c(0, buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++)
    buf[i] = (uint8_t)i;
  assert_int_equal(ferry_crc32c(0, buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++)
    buf[i] = (uint8_t)(31 - i);
  assert_int_equal(ferry_crc32c(0, buf, 32), 0x113FDB5Cu);
}

static void test_crc32c_random(void **state) {
  (void)state;
  uint64_t seed = 0xC4C32C;
  enum { SIZE = 70000 };
  uint8_t *buf = malloc(SIZE);
  assert_non_null(buf);
  fill_random(&seed, buf, SIZE);
  for (int i = 0; i < 2000; i++) {
    /* Random offsets exercise every alignment of the head and tail. */
    size_t off = rng_next(&seed) % 64;
    size_t len = i < 200 ? (size_t)i : rng_next(&seed) % (i < 1990 ? 4096 : SIZE - 64);
    uint32_t want = crc32c_reference(0, buf + off, len);
    assert_int_equal(ferry_crc32c(0, buf + off, len), want);
    /* Running value: crc over pieces equals crc over the whole. */
    size_t cut = len ? rng_next(&seed) % len : 0;
    uint32_t c = ferry_crc32c(0, buf + off, cut);
    assert_int_equal(ferry_crc32c(c, buf + off + cut, len - cut), want);
  }
  free(buf);
}

/* ---- Fuzz --------------------------------------------------------------- */

#define FUZZ_ROUNDS 200000
#define FUZZ_BODY_MAX 600

/* A valid encoding of a random body kind, as a seed for mutation. */
static size_t valid_body(uint64_t *seed, uint8_t *buf, int kind) {
  switch (kind) {
  case 0: {
    ferry_hello h = sample_hello("");
    size_t n = rng_next(seed) % (FERRY_WIRE_MAX_NAME + 1);
    memset(h.name, 'a' + (int)(n % 26), n);
    h.name[n] = '\0';
    return ferry_wire_hello_encode(buf, &h);
  }
  case 1: {
    ferry_hello_reply r = {.version = 3, .pid = 7, .descriptor_count = 1};
    r.descriptors[0].transport = FERRY_TRANSPORT_SHM;
    r.descriptors[0].len = (uint16_t)(rng_next(seed) % (FERRY_WIRE_MAX_DESCRIPTOR + 1));
    memset(r.descriptors[0].data, '/', r.descriptors[0].len);
    return ferry_wire_hello_reply_encode(buf, &r);
  }
  case 2: {
    ferry_region t[16];
    uint32_t count = (uint32_t)(rng_next(seed) % 17);
    uint64_t at = rng_next(seed) >> 8;
    for (uint32_t i = 0; i < count; i++) {
      t[i] = (ferry_region){at, 1 + rng_next(seed) % 4096};
      at += t[i].length + rng_next(seed) % 2;
    }
    return ferry_wire_regions_encode(buf, t, count, NULL, 0);
  }
  default: {
    char name[40];
    size_t data_len = rng_next(seed) % 200;
    snprintf(name, sizeof name, "n%llu", (unsigned long long)(rng_next(seed) % 100000));
    uint8_t data[200];
    fill_random(seed, data, data_len);
    return ferry_wire_notify_encode(buf, name, data, data_len);
  }
  }
}

/* A random or mutated header: mostly well-formed up front, so the fuzz
 * reaches the per-type checks instead of stopping at the magic. */
static void fuzz_header(uint64_t *seed, uint8_t h[FERRY_WIRE_HEADER_SIZE]) {
  fill_random(seed, h, FERRY_WIRE_HEADER_SIZE);
  uint64_t r = rng_next(seed);
  if (r % 4 != 0) {
    ferry_frame_header f = {.type = (uint8_t)((r >> 8) % 16),
                            .flags = (uint8_t)((r >> 12) % 4 == 0 ? (r >> 16) : (r >> 16) & 1),
                            .count =
                                (uint32_t)((r >> 20) % 3 == 0 ? rng_next(seed) : (r >> 24) % 1100),
                            .status = (r >> 30) % 4 == 0 ? -(int32_t)((r >> 32) % 25) : 0,
                            .body_len = (r >> 36) % 3 == 0 ? rng_next(seed) >> ((r >> 40) % 64)
                                        : ((r >> 44) % 2)  ? ((r >> 46) % 1100) * 16
                                                           : (r >> 46) % 70000,
                            .id = rng_next(seed)};
    ferry_wire_header_encode(h, &f);
    if ((r >> 58) % 8 == 0)
      h[rng_next(seed) % FERRY_WIRE_HEADER_SIZE] ^= (uint8_t)(1u << ((r >> 61) % 8));
  }
}

static void fuzz_one_header(uint64_t *seed, unsigned long *accepted) {
  uint8_t in[FERRY_WIRE_HEADER_SIZE], again[FERRY_WIRE_HEADER_SIZE];
  ferry_frame_header h;
  fuzz_header(seed, in);
  if (ferry_wire_header_decode(in, &h) != FERRY_OK)
    return;
  ++*accepted;
  ferry_wire_header_encode(again, &h); /* accepted headers are canonical */
  assert_memory_equal(in, again, FERRY_WIRE_HEADER_SIZE);
  if (h.status == 0 && (h.type == FERRY_FRAME_WRITE || h.type == FERRY_FRAME_READ))
    assert_true(h.count >= 1 && h.count <= FERRY_WIRE_MAX_SEGMENTS &&
                h.body_len >= h.count * 16ull);
}

/* Feeds one body (exactly `len` heap bytes, so ASan sees any overread) to
 * every body decoder; whatever they accept must re-encode identically. */
static void fuzz_one_body(const uint8_t *body, size_t len, uint32_t count,
                          unsigned long *accepted) {
  uint8_t again[FUZZ_BODY_MAX + 64];
  ferry_hello hello;
  if (ferry_wire_hello_decode(body, len, &hello) == FERRY_OK) {
    assert_int_equal(ferry_wire_hello_encode(again, &hello), len);
    assert_memory_equal(again, body, len);
    ++*accepted;
  }
  ferry_hello_reply reply;
  if (ferry_wire_hello_reply_decode(body, len, &reply) == FERRY_OK) {
    assert_int_equal(ferry_wire_hello_reply_encode(again, &reply), len);
    assert_memory_equal(again, body, len);
    ++*accepted;
  }
  ferry_region_table table;
  if (ferry_wire_regions_decode(body, len, count, &table) == FERRY_OK) {
    size_t n =
        ferry_wire_regions_encode(again, table.regions, count, table.keys, table.key_sections);
    assert_int_equal(n, len);
    assert_memory_equal(again, body, len);
    ++*accepted;
    ferry_region_table_free(&table);
  }
  ferry_region segs[FUZZ_BODY_MAX / 16];
  uint32_t nsegs = (uint32_t)(len / 16) < count ? (uint32_t)(len / 16) : count;
  uint64_t total;
  if (ferry_wire_segments_decode(body, nsegs, segs, &total) == FERRY_OK) {
    ferry_wire_segments_encode(again, segs, nsegs);
    assert_memory_equal(again, body, nsegs * 16u);
    ++*accepted;
  }
  const char *name;
  const uint8_t *data;
  size_t name_len, data_len;
  if (ferry_wire_notify_decode(body, len, &name, &name_len, &data, &data_len) == FERRY_OK) {
    assert_int_equal(2 + name_len + data_len, len);
    assert_true(name_len >= 1 && name_len <= FERRY_WIRE_MAX_NAME);
    ++*accepted;
  }
}

static void test_fuzz_decoders(void **state) {
  (void)state;
  uint64_t seed = 0xF022;
  unsigned long headers_ok = 0, bodies_ok = 0;
  uint8_t scratch[FUZZ_BODY_MAX + 64];
  memset(scratch, 0, sizeof scratch); /* a cut-and-extend reads past the encoding */
  for (int i = 0; i < FUZZ_ROUNDS; i++) {
    fuzz_one_header(&seed, &headers_ok);
    uint64_t r = rng_next(&seed);
    size_t len;
    if (r % 2) { /* a mutated valid body: flipped bytes, cut or extended */
      len = valid_body(&seed, scratch, (int)((r >> 1) % 4));
      for (uint64_t k = (r >> 4) % 4; k > 0; k--)
        if (len > 0)
          scratch[rng_next(&seed) % len] = (uint8_t)rng_next(&seed);
      if ((r >> 8) % 4 == 0)
        len = rng_next(&seed) % (len + 8);
      if (len > FUZZ_BODY_MAX)
        len = FUZZ_BODY_MAX;
    } else {
      len = rng_next(&seed) % FUZZ_BODY_MAX;
      fill_random(&seed, scratch, len);
    }
    uint8_t *body = malloc(len ? len : 1);
    assert_non_null(body);
    memcpy(body, scratch, len);
    uint32_t count = (r >> 12) % 8 == 0 ? (uint32_t)rng_next(&seed) : (uint32_t)(len / 16);
    fuzz_one_body(body, len, count, &bodies_ok);
    free(body);
  }
  printf("  fuzz: %lu of %d headers and %lu body decodes accepted\n", headers_ok, FUZZ_ROUNDS,
         bodies_ok);
  assert_true(headers_ok > FUZZ_ROUNDS / 50); /* the fuzz reached past the first checks */
  assert_true(bodies_ok > FUZZ_ROUNDS / 20);
}

/* ---- POOL bodies ---------------------------------------------------------- */

static void test_pool_body(void **state) {
  (void)state;
  uint8_t buf[FERRY_WIRE_POOL_MAX];
  ferry_pool_req in = {.op = FERRY_POOL_LANDED,
                       .flags = FERRY_POOL_NEXT,
                       .wait_ms = 7,
                       .grant = 42,
                       .length = 1 << 20,
                       .pool = "emb",
                       .pool_len = 3,
                       .tag = "req-1",
                       .tag_len = 5},
                 out;
  size_t len = ferry_wire_pool_encode(buf, &in);
  assert_int_equal(len, FERRY_WIRE_POOL_FIXED + 8);
  assert_int_equal(ferry_wire_pool_decode(buf, len, &out), FERRY_OK);
  assert_int_equal(out.grant, 42);
  assert_int_equal(out.length, 1 << 20);
  assert_int_equal(out.wait_ms, 7);
  assert_memory_equal(out.pool, "emb", 3);
  assert_memory_equal(out.tag, "req-1", 5);
  /* A length that disagrees with the names, an unknown op, a LANDED without a tag. */
  assert_int_equal(ferry_wire_pool_decode(buf, len - 1, &out), FERRY_EPROTO);
  buf[0] = 9;
  assert_int_equal(ferry_wire_pool_decode(buf, len, &out), FERRY_EPROTO);
  in.tag_len = 0;
  len = ferry_wire_pool_encode(buf, &in);
  assert_int_equal(ferry_wire_pool_decode(buf, len, &out), FERRY_EPROTO);
  ferry_pool_grant g = {1, 2, 3, 4}, back;
  uint8_t reply[FERRY_WIRE_POOL_REPLY_SIZE];
  ferry_wire_grant_encode(reply, &g);
  ferry_wire_grant_decode(reply, &back);
  assert_memory_equal(&g, &back, sizeof g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_body),
      cmocka_unit_test(test_header_round_trip),
      cmocka_unit_test(test_header_bad_magic_reserved_type),
      cmocka_unit_test(test_header_flags_and_status),
      cmocka_unit_test(test_header_limits),
      cmocka_unit_test(test_segments),
      cmocka_unit_test(test_hello),
      cmocka_unit_test(test_hello_reply),
      cmocka_unit_test(test_hello_reply_with_auth_hides_facts),
      cmocka_unit_test(test_facts),
      cmocka_unit_test(test_facts_descriptors_checked),
      cmocka_unit_test(test_split),
      cmocka_unit_test(test_regions),
      cmocka_unit_test(test_ranges),
      cmocka_unit_test(test_region_keys),
      cmocka_unit_test(test_notify),
      cmocka_unit_test(test_crc32c_vectors),
      cmocka_unit_test(test_crc32c_random),
      cmocka_unit_test(test_fuzz_decoders),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
