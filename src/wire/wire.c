/* wire.c - encoding and checking of ferry frames.
 *
 * Everything that arrives from a socket passes through a decoder here before
 * the engine trusts a single length or address in it, so each decoder checks
 * sizes against what the fields announce and against fixed limits, and says
 * precisely what was wrong (the detail ends up in the peer's log). Integers
 * are written byte by byte in little-endian order so the layout does not
 * depend on the host's endianness, padding or alignment. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strnlen, if the build did not ask already */
#endif
#include "wire/wire.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) &&                             \
    !defined(FERRY_CRC32C_SOFTWARE_ONLY)
#define FERRY_HAVE_SSE42_CRC 1
#include <nmmintrin.h>
#endif

/* ---- Little-endian helpers ---------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

/* Two's complement without relying on implementation-defined conversions. */
static int32_t u32_to_i32(uint32_t v) {
  return v <= INT32_MAX ? (int32_t)v : -(int32_t)(UINT32_MAX - v) - 1;
}

/* ---- Header ------------------------------------------------------------- */

/* Header field offsets. */
enum {
  OFF_MAGIC = 0,
  OFF_TYPE = 4,
  OFF_FLAGS = 5,
  OFF_RESERVED = 6,
  OFF_COUNT = 8,
  OFF_STATUS = 12,
  OFF_BODY_LEN = 16,
  OFF_ID = 24,
};

/* Fixed parts of the handshake bodies (everything but the trailing string). */
#define HELLO_FIXED (2 + 2 + 1 + 8 + FERRY_WIRE_NONCE_SIZE + 2)
#define FACTS_FIXED (8 + 4 + FERRY_WIRE_BOOT_ID_SIZE + 4 + 1)
#define DESCRIPTOR_FIXED (4 + 2)
#define CHECKSUM_SIZE 4

void ferry_wire_header_encode(uint8_t out[FERRY_WIRE_HEADER_SIZE], const ferry_frame_header *h) {
  put_u32(out + OFF_MAGIC, FERRY_WIRE_MAGIC);
  out[OFF_TYPE] = h->type;
  out[OFF_FLAGS] = h->flags;
  put_u16(out + OFF_RESERVED, 0);
  put_u32(out + OFF_COUNT, h->count);
  put_u32(out + OFF_STATUS, (uint32_t)h->status);
  put_u64(out + OFF_BODY_LEN, h->body_len);
  put_u64(out + OFF_ID, h->id);
}

/* Records "frame type T: <why>" as the detail and returns FERRY_EPROTO. */
static ferry_status __attribute__((format(printf, 2, 3)))
bad_frame(const ferry_frame_header *h, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return ferry_fail(FERRY_EPROTO, "frame type %u: %s", (unsigned)h->type, why);
}

static int is_reply(uint8_t type) {
  switch (type) {
  case FERRY_FRAME_HELLO_REPLY:
  case FERRY_FRAME_AUTH_REPLY:
  case FERRY_FRAME_REGIONS_REPLY:
  case FERRY_FRAME_WRITE_ACK:
  case FERRY_FRAME_READ_REPLY:
  case FERRY_FRAME_NOTIFY_ACK:
  case FERRY_FRAME_PONG:
  case FERRY_FRAME_POOL_REPLY:
  case FERRY_FRAME_CUT_REPLY:
  case FERRY_FRAME_STORE_REPLY: return 1;
  default: return 0;
  }
}

/* The checksum flag belongs on frames that carry data (WRITE, READ_REPLY:
 * a crc32c u32 follows the payload) and on READ, where it adds no bytes and
 * asks the target to checksum its READ_REPLY: the reader has no other way
 * to ask for it. */
static ferry_status check_flags(const ferry_frame_header *h) {
  if (h->flags & ~(FERRY_FRAME_FLAG_CHECKSUM | FERRY_FRAME_FLAG_AFTER))
    return bad_frame(h, "unknown flags 0x%02x", (unsigned)h->flags);
  if ((h->flags & FERRY_FRAME_FLAG_CHECKSUM) && h->type != FERRY_FRAME_WRITE &&
      h->type != FERRY_FRAME_READ && h->type != FERRY_FRAME_READ_REPLY)
    return bad_frame(h, "checksum flag on a frame that carries no data");
  if ((h->flags & FERRY_FRAME_FLAG_AFTER) && h->type != FERRY_FRAME_WRITE &&
      h->type != FERRY_FRAME_WRITE_ACK)
    return bad_frame(h, "after-landed flag on a frame that is not a WRITE or its ack");
  return FERRY_OK;
}

static ferry_status check_body_range(const ferry_frame_header *h, uint64_t min, uint64_t max) {
  if (h->body_len < min)
    return bad_frame(h, "body of %" PRIu64 " bytes is shorter than %" PRIu64, h->body_len, min);
  if (h->body_len > max)
    return bad_frame(h, "body of %" PRIu64 " bytes exceeds %" PRIu64, h->body_len, max);
  return FERRY_OK;
}

static ferry_status check_segment_count(const ferry_frame_header *h) {
  if (h->count == 0)
    return bad_frame(h, "no segments");
  if (h->count > FERRY_WIRE_MAX_SEGMENTS)
    return bad_frame(h, "%" PRIu32 " segments exceeds %d", h->count, FERRY_WIRE_MAX_SEGMENTS);
  return FERRY_OK;
}

static ferry_status check_empty(const ferry_frame_header *h) {
  if (h->body_len != 0)
    return bad_frame(h, "unexpected body of %" PRIu64 " bytes", h->body_len);
  if (h->count != 0)
    return bad_frame(h, "unexpected count %" PRIu32, h->count);
  return FERRY_OK;
}

static ferry_status check_write(const ferry_frame_header *h) {
  ferry_status st = check_segment_count(h);
  if (st != FERRY_OK)
    return st;
  uint64_t table = (uint64_t)h->count * FERRY_WIRE_SEGMENT_SIZE;
  uint64_t trailer = (h->flags & FERRY_FRAME_FLAG_CHECKSUM) ? CHECKSUM_SIZE : 0;
  uint64_t after_extra = 0; /* an after-landed message's bytes past its fixed part */
  if (h->flags & FERRY_FRAME_FLAG_AFTER) {
    trailer += FERRY_WIRE_POOL_FIXED;
    after_extra = FERRY_WIRE_POOL_MAX - FERRY_WIRE_POOL_FIXED;
  }
  if (h->body_len < table + trailer)
    return bad_frame(h, "body of %" PRIu64 " bytes cannot hold %" PRIu32 " segments", h->body_len,
                     h->count);
  uint64_t payload = h->body_len - table - trailer;
  if (payload > FERRY_WIRE_MAX_PAYLOAD + after_extra)
    return bad_frame(h, "payload of %" PRIu64 " bytes exceeds %llu", payload,
                     FERRY_WIRE_MAX_PAYLOAD);
  return FERRY_OK;
}

/* A body that is exactly h->count table entries (`what`: segments or regions). */
static ferry_status check_table_body(const ferry_frame_header *h, const char *what) {
  uint64_t table = (uint64_t)h->count * FERRY_WIRE_SEGMENT_SIZE;
  if (h->body_len != table)
    return bad_frame(h, "body of %" PRIu64 " bytes does not match %" PRIu32 " %s", h->body_len,
                     h->count, what);
  return FERRY_OK;
}

static ferry_status check_read(const ferry_frame_header *h) {
  ferry_status st = check_segment_count(h);
  if (st != FERRY_OK)
    return st;
  return check_table_body(h, "segments");
}

/* The ranges themselves are checked by ferry_wire_ranges_decode. */
static ferry_status check_regions_req(const ferry_frame_header *h) {
  if (h->count > FERRY_WIRE_MAX_REGION_RANGES)
    return bad_frame(h, "%" PRIu32 " ranges exceeds %d", h->count, FERRY_WIRE_MAX_REGION_RANGES);
  return check_table_body(h, "ranges");
}

/* The table and its key sections are checked by ferry_wire_regions_decode. */
static ferry_status check_regions_reply(const ferry_frame_header *h) {
  uint64_t table = (uint64_t)h->count * FERRY_WIRE_SEGMENT_SIZE;
  return check_body_range(h, table + 1, FERRY_WIRE_MAX_CONTROL_BODY);
}

/* Limits of a successful frame (requests, and replies with status 0). */
static ferry_status check_type_limits(const ferry_frame_header *h) {
  uint64_t trailer = (h->flags & FERRY_FRAME_FLAG_CHECKSUM) ? CHECKSUM_SIZE : 0;
  switch (h->type) {
  case FERRY_FRAME_HELLO: return check_body_range(h, HELLO_FIXED, FERRY_WIRE_HELLO_MAX);
  case FERRY_FRAME_HELLO_REPLY:
    return check_body_range(h, FERRY_WIRE_NEGOTIATION_SIZE, FERRY_WIRE_HELLO_REPLY_MAX);
  case FERRY_FRAME_AUTH: return check_body_range(h, FERRY_WIRE_PROOF_SIZE, FERRY_WIRE_PROOF_SIZE);
  case FERRY_FRAME_AUTH_REPLY: /* the target's own proof, then its facts */
    return check_body_range(h, FERRY_WIRE_PROOF_SIZE + FACTS_FIXED, FERRY_WIRE_AUTH_REPLY_MAX);
  case FERRY_FRAME_REGIONS_REQ: return check_regions_req(h);
  case FERRY_FRAME_WRITE_ACK:
    if (h->flags & FERRY_FRAME_FLAG_AFTER)
      return check_body_range(h, FERRY_WIRE_POOL_REPLY_SIZE, FERRY_WIRE_POOL_REPLY_SIZE);
    return check_empty(h);
  case FERRY_FRAME_NOTIFY_ACK:
  case FERRY_FRAME_PING:
  case FERRY_FRAME_PONG:
  case FERRY_FRAME_CUT_REPLY: return check_empty(h);
  case FERRY_FRAME_CUT: return check_body_range(h, FERRY_WIRE_NONCE_SIZE, FERRY_WIRE_NONCE_SIZE);
  case FERRY_FRAME_REGIONS_REPLY: return check_regions_reply(h);
  case FERRY_FRAME_WRITE: return check_write(h);
  case FERRY_FRAME_READ: return check_read(h);
  case FERRY_FRAME_READ_REPLY:
    return check_body_range(h, trailer, FERRY_WIRE_MAX_PAYLOAD + trailer);
  case FERRY_FRAME_NOTIFY:
    return check_body_range(h, 3, 2 + FERRY_WIRE_MAX_NAME + FERRY_WIRE_MAX_NOTIFY_DATA);
  case FERRY_FRAME_POOL: return check_body_range(h, FERRY_WIRE_POOL_FIXED, FERRY_WIRE_POOL_MAX);
  case FERRY_FRAME_POOL_REPLY:
    return check_body_range(h, FERRY_WIRE_POOL_REPLY_SIZE, FERRY_WIRE_POOL_REPLY_SIZE);
  case FERRY_FRAME_STORE: return check_body_range(h, 1, FERRY_WIRE_MAX_CONTROL_BODY);
  case FERRY_FRAME_STORE_REPLY: return check_body_range(h, 0, FERRY_WIRE_MAX_CONTROL_BODY);
  }
  return bad_frame(h, "unknown frame type"); /* unreachable: type checked first */
}

ferry_status ferry_wire_header_decode(const uint8_t in[FERRY_WIRE_HEADER_SIZE],
                                      ferry_frame_header *h) {
  uint32_t magic = get_u32(in + OFF_MAGIC);
  uint16_t reserved = get_u16(in + OFF_RESERVED);
  h->type = in[OFF_TYPE];
  h->flags = in[OFF_FLAGS];
  h->count = get_u32(in + OFF_COUNT);
  h->status = u32_to_i32(get_u32(in + OFF_STATUS));
  h->body_len = get_u64(in + OFF_BODY_LEN);
  h->id = get_u64(in + OFF_ID);

  if (magic != FERRY_WIRE_MAGIC)
    return ferry_fail(FERRY_EPROTO, "bad magic 0x%08" PRIx32 " (expected 0x%08x): not a ferry peer",
                      magic, FERRY_WIRE_MAGIC);
  if (reserved != 0)
    return bad_frame(h, "reserved field is 0x%04x, not 0", (unsigned)reserved);
  if (h->type < FERRY_FRAME_HELLO || h->type > FERRY_FRAME_LAST)
    return ferry_fail(FERRY_EPROTO, "unknown frame type %u", (unsigned)h->type);
  ferry_status st = check_flags(h);
  if (st != FERRY_OK)
    return st;
  if (h->status != 0) {
    if (!is_reply(h->type))
      return bad_frame(h, "request carries status %" PRId32, h->status);
    /* Every ferry_status is negative; a positive one would read as success
     * to a caller testing "< 0". */
    if (h->status > 0)
      return bad_frame(h, "status %" PRId32 " is not a ferry status", h->status);
    /* A failed reply's body is the target's reason text. */
    return check_body_range(h, 0, FERRY_WIRE_MAX_REASON);
  }
  return check_type_limits(h);
}

/* ---- Segment tables ----------------------------------------------------- */

static void regions_put(uint8_t *out, const ferry_region *regions, uint32_t count) {
  for (uint32_t i = 0; i < count; i++) {
    put_u64(out + (size_t)i * FERRY_WIRE_SEGMENT_SIZE, regions[i].addr);
    put_u64(out + (size_t)i * FERRY_WIRE_SEGMENT_SIZE + 8, regions[i].length);
  }
}

static ferry_region region_get(const uint8_t *in, uint32_t i) {
  ferry_region r;
  r.addr = get_u64(in + (size_t)i * FERRY_WIRE_SEGMENT_SIZE);
  r.length = get_u64(in + (size_t)i * FERRY_WIRE_SEGMENT_SIZE + 8);
  return r;
}

/* Length > 0 and [addr, addr+length) representable; what names it in a
 * detail is the caller's `what` ("segment", "region"). */
static ferry_status check_range(const char *what, uint32_t i, const ferry_region *r) {
  if (r->length == 0)
    return ferry_fail(FERRY_EPROTO, "%s %" PRIu32 " at 0x%" PRIx64 " has length 0", what, i,
                      r->addr);
  if (r->length > UINT64_MAX - r->addr)
    return ferry_fail(FERRY_EPROTO,
                      "%s %" PRIu32 " [0x%" PRIx64 ", +%" PRIu64 ") wraps around the address space",
                      what, i, r->addr, r->length);
  return FERRY_OK;
}

void ferry_wire_segments_encode(uint8_t *out, const ferry_region *segs, uint32_t count) {
  regions_put(out, segs, count);
}

ferry_status ferry_wire_segments_decode(const uint8_t *in, uint32_t count, ferry_region *segs,
                                        uint64_t *total) {
  if (count > FERRY_WIRE_MAX_SEGMENTS)
    return ferry_fail(FERRY_EPROTO, "%" PRIu32 " segments exceeds %d", count,
                      FERRY_WIRE_MAX_SEGMENTS);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < count; i++) {
    segs[i] = region_get(in, i);
    ferry_status st = check_range("segment", i, &segs[i]);
    if (st != FERRY_OK)
      return st;
    /* Checked per step so the running sum itself never overflows. */
    if (segs[i].length > FERRY_WIRE_MAX_PAYLOAD - sum)
      return ferry_fail(FERRY_EPROTO, "segments total more than %llu bytes at segment %" PRIu32,
                        FERRY_WIRE_MAX_PAYLOAD, i);
    sum += segs[i].length;
  }
  if (total != NULL)
    *total = sum;
  return FERRY_OK;
}

/* ---- Handshake ---------------------------------------------------------- */

/* Cursor helpers for the handshake bodies: each writes or reads one field
 * and moves the cursor past it, so field order reads like the layout. */
static uint8_t *emit_u8(uint8_t *p, uint8_t v) {
  *p = v;
  return p + 1;
}
static uint8_t *emit_u16(uint8_t *p, uint16_t v) {
  put_u16(p, v);
  return p + 2;
}
static uint8_t *emit_u32(uint8_t *p, uint32_t v) {
  put_u32(p, v);
  return p + 4;
}
static uint8_t *emit_u64(uint8_t *p, uint64_t v) {
  put_u64(p, v);
  return p + 8;
}
static uint8_t *emit_bytes(uint8_t *p, const void *src, size_t n) {
  if (n > 0)
    memcpy(p, src, n);
  return p + n;
}
/* "u16 length | bytes"; names longer than the limit are cut, not overrun. */
static uint8_t *emit_string(uint8_t *p, const char *s) {
  uint16_t n = (uint16_t)strnlen(s, FERRY_WIRE_MAX_NAME);
  return emit_bytes(emit_u16(p, n), s, n);
}

static uint8_t take_u8(const uint8_t **p) { return *(*p)++; }
static uint16_t take_u16(const uint8_t **p) {
  *p += 2;
  return get_u16(*p - 2);
}
static uint32_t take_u32(const uint8_t **p) {
  *p += 4;
  return get_u32(*p - 4);
}
static uint64_t take_u64(const uint8_t **p) {
  *p += 8;
  return get_u64(*p - 8);
}
static void take_bytes(const uint8_t **p, void *dst, size_t n) {
  memcpy(dst, *p, n);
  *p += n;
}

/* Reads "u16 length | bytes", which must fill exactly the `avail` bytes
 * left in the body, into a NUL-terminated buffer of FERRY_WIRE_MAX_NAME + 1
 * bytes. An embedded NUL is refused: the text would be silently cut. */
static ferry_status take_string(const char *what, const uint8_t *p, size_t avail, char *dst) {
  uint16_t n = take_u16(&p);
  if (n > FERRY_WIRE_MAX_NAME)
    return ferry_fail(FERRY_EPROTO, "%s of %u bytes exceeds %d", what, (unsigned)n,
                      FERRY_WIRE_MAX_NAME);
  if ((size_t)n != avail - 2)
    return ferry_fail(FERRY_EPROTO, "%s says %u bytes but the body has %zu left", what, (unsigned)n,
                      avail - 2);
  if (memchr(p, '\0', n) != NULL)
    return ferry_fail(FERRY_EPROTO, "%s contains a NUL byte", what);
  take_bytes(&p, dst, n);
  dst[n] = '\0';
  return FERRY_OK;
}

size_t ferry_wire_hello_encode(uint8_t *out, const ferry_hello *hello) {
  uint8_t *p = out;
  p = emit_u16(p, hello->version_min);
  p = emit_u16(p, hello->version_max);
  p = emit_u8(p, hello->conn_kind);
  p = emit_u64(p, hello->engine_id);
  p = emit_bytes(p, hello->nonce, FERRY_WIRE_NONCE_SIZE);
  p = emit_string(p, hello->name);
  return (size_t)(p - out);
}

ferry_status ferry_wire_hello_decode(const uint8_t *in, size_t len, ferry_hello *hello) {
  if (len < HELLO_FIXED || len > FERRY_WIRE_HELLO_MAX)
    return ferry_fail(FERRY_EPROTO, "HELLO body of %zu bytes (expected %d..%d)", len, HELLO_FIXED,
                      FERRY_WIRE_HELLO_MAX);
  const uint8_t *p = in;
  hello->version_min = take_u16(&p);
  hello->version_max = take_u16(&p);
  hello->conn_kind = take_u8(&p);
  hello->engine_id = take_u64(&p);
  take_bytes(&p, hello->nonce, FERRY_WIRE_NONCE_SIZE);
  return take_string("HELLO name", p, len - (size_t)(p - in), hello->name);
}

const ferry_wire_descriptor *ferry_wire_descriptor_find(const ferry_hello_reply *reply,
                                                        unsigned transport) {
  for (unsigned i = 0; i < reply->descriptor_count; i++)
    if (reply->descriptors[i].transport == transport)
      return &reply->descriptors[i];
  return NULL;
}

/* "count u8 | count * (transport u32 | len u16 | bytes)" after the fixed facts. */
size_t ferry_wire_facts_encode(uint8_t *out, const ferry_hello_reply *reply) {
  uint8_t *p = out;
  p = emit_u64(p, reply->engine_id);
  p = emit_u32(p, reply->transports);
  p = emit_bytes(p, reply->boot_id, FERRY_WIRE_BOOT_ID_SIZE);
  p = emit_u32(p, reply->pid);
  p = emit_u8(p, reply->descriptor_count);
  for (unsigned i = 0; i < reply->descriptor_count; i++) {
    const ferry_wire_descriptor *d = &reply->descriptors[i];
    p = emit_u32(p, d->transport);
    p = emit_bytes(emit_u16(p, d->len), d->data, d->len);
  }
  return (size_t)(p - out);
}

/* One descriptor from the `avail` bytes at *p: one known transport bit, not
 * described before, and a length within the limit and the body. */
static ferry_status take_descriptor(const uint8_t **p, size_t avail, ferry_hello_reply *reply) {
  if (avail < DESCRIPTOR_FIXED)
    return ferry_fail(FERRY_EPROTO, "transport descriptor cut short (%zu bytes left)", avail);
  ferry_wire_descriptor *d = &reply->descriptors[reply->descriptor_count];
  d->transport = take_u32(p);
  d->len = take_u16(p);
  if (!d->transport || (d->transport & (d->transport - 1)) ||
      (d->transport & ~(uint32_t)FERRY_TRANSPORT_ALL))
    return ferry_fail(FERRY_EPROTO, "descriptor of unknown transport 0x%x", d->transport);
  if (ferry_wire_descriptor_find(reply, d->transport)) /* d is not counted yet */
    return ferry_fail(FERRY_EPROTO, "transport %s described twice",
                      ferry_transport_name(d->transport));
  if (d->len > FERRY_WIRE_MAX_DESCRIPTOR || d->len > avail - DESCRIPTOR_FIXED)
    return ferry_fail(FERRY_EPROTO, "%s descriptor of %u bytes (limit %d, %zu left)",
                      ferry_transport_name(d->transport), (unsigned)d->len,
                      FERRY_WIRE_MAX_DESCRIPTOR, avail - DESCRIPTOR_FIXED);
  take_bytes(p, d->data, d->len);
  reply->descriptor_count++;
  return FERRY_OK;
}

ferry_status ferry_wire_facts_decode(const uint8_t *in, size_t len, ferry_hello_reply *reply) {
  if (len < FACTS_FIXED || len > FERRY_WIRE_FACTS_MAX)
    return ferry_fail(FERRY_EPROTO, "peer facts of %zu bytes (expected %d..%d)", len, FACTS_FIXED,
                      FERRY_WIRE_FACTS_MAX);
  const uint8_t *p = in, *end = in + len;
  reply->engine_id = take_u64(&p);
  reply->transports = take_u32(&p);
  take_bytes(&p, reply->boot_id, FERRY_WIRE_BOOT_ID_SIZE);
  reply->pid = take_u32(&p);
  unsigned count = take_u8(&p);
  if (count > FERRY_WIRE_MAX_DESCRIPTORS)
    return ferry_fail(FERRY_EPROTO, "%u transport descriptors (limit %d)", count,
                      FERRY_WIRE_MAX_DESCRIPTORS);
  reply->descriptor_count = 0;
  for (unsigned i = 0; i < count; i++) {
    ferry_status st = take_descriptor(&p, (size_t)(end - p), reply);
    if (st)
      return st;
  }
  if (p != end)
    return ferry_fail(FERRY_EPROTO, "peer facts carry %zu bytes after the descriptors",
                      (size_t)(end - p));
  return FERRY_OK;
}

size_t ferry_wire_hello_reply_encode(uint8_t *out, const ferry_hello_reply *reply) {
  uint8_t *p = out;
  p = emit_u16(p, reply->version);
  p = emit_u16(p, reply->version_min);
  p = emit_u16(p, reply->version_max);
  p = emit_u8(p, reply->auth_required);
  p = emit_bytes(p, reply->nonce, FERRY_WIRE_NONCE_SIZE);
  if (!reply->auth_required)
    p += ferry_wire_facts_encode(p, reply);
  return (size_t)(p - out);
}

ferry_status ferry_wire_hello_reply_decode(const uint8_t *in, size_t len,
                                           ferry_hello_reply *reply) {
  if (len < FERRY_WIRE_NEGOTIATION_SIZE || len > FERRY_WIRE_HELLO_REPLY_MAX)
    return ferry_fail(FERRY_EPROTO, "HELLO_REPLY body of %zu bytes (expected %d..%d)", len,
                      FERRY_WIRE_NEGOTIATION_SIZE, FERRY_WIRE_HELLO_REPLY_MAX);
  memset(reply, 0, sizeof *reply);
  const uint8_t *p = in;
  reply->version = take_u16(&p);
  reply->version_min = take_u16(&p);
  reply->version_max = take_u16(&p);
  reply->auth_required = take_u8(&p);
  take_bytes(&p, reply->nonce, FERRY_WIRE_NONCE_SIZE);
  size_t rest = len - FERRY_WIRE_NEGOTIATION_SIZE;
  if (reply->auth_required && rest != 0)
    return ferry_fail(FERRY_EPROTO, "HELLO_REPLY asks for the secret but carries %zu more bytes",
                      rest);
  return reply->auth_required ? FERRY_OK : ferry_wire_facts_decode(p, rest, reply);
}

void ferry_wire_split(const ferry_frame_header *h, uint64_t *head, uint64_t *payload) {
  *head = h->body_len;
  *payload = 0;
  if (h->status != 0)
    return; /* a refusal's reason */
  if (h->type == FERRY_FRAME_WRITE)
    *head = (uint64_t)h->count * FERRY_WIRE_SEGMENT_SIZE;
  else if (h->type == FERRY_FRAME_READ_REPLY)
    *head = 0;
  *payload = h->body_len - *head;
}

/* ---- Region tables ------------------------------------------------------ */

#define KEYS_FIXED 6 /* u32 transport | u16 size */

size_t ferry_wire_regions_size(uint32_t count, const ferry_region_keys *keys, unsigned sections) {
  size_t len = (size_t)count * FERRY_WIRE_SEGMENT_SIZE + 1;
  for (unsigned i = 0; i < sections; i++)
    len += KEYS_FIXED + (size_t)count * keys[i].size;
  return len;
}

size_t ferry_wire_regions_encode(uint8_t *out, const ferry_region *regions, uint32_t count,
                                 const ferry_region_keys *keys, unsigned sections) {
  regions_put(out, regions, count);
  uint8_t *p = out + (size_t)count * FERRY_WIRE_SEGMENT_SIZE;
  *p++ = (uint8_t)sections;
  for (unsigned i = 0; i < sections; i++) {
    p = emit_u16(emit_u32(p, keys[i].transport), keys[i].size);
    if (count)
      p = emit_bytes(p, keys[i].data, (size_t)count * keys[i].size);
  }
  return (size_t)(p - out);
}

void ferry_region_table_free(ferry_region_table *t) {
  free(t->regions);
  for (unsigned i = 0; i < t->key_sections; i++)
    free(t->keys[i].data);
  memset(t, 0, sizeof *t);
}

/* count ranges from in into out, each checked, in order and disjoint
 * (what lets the receiver binary-search them); `what` names them. */
static ferry_status get_sorted(const uint8_t *in, uint32_t count, ferry_region *out,
                               const char *what) {
  for (uint32_t i = 0; i < count; i++) {
    out[i] = region_get(in, i);
    ferry_status st = check_range(what, i, &out[i]);
    if (st == FERRY_OK && i > 0 && out[i].addr < out[i - 1].addr + out[i - 1].length)
      st = ferry_fail(FERRY_EPROTO,
                      "%s %" PRIu32 " at 0x%" PRIx64 " is not after %s %" PRIu32 " [0x%" PRIx64
                      ", +%" PRIu64 "): not sorted and disjoint",
                      what, i, out[i].addr, what, i - 1, out[i - 1].addr, out[i - 1].length);
    if (st != FERRY_OK)
      return st;
  }
  return FERRY_OK;
}

static ferry_status take_regions(const uint8_t *in, uint32_t count, ferry_region_table *t) {
  if (count == 0)
    return FERRY_OK;
  t->regions = malloc((size_t)count * sizeof *t->regions);
  if (t->regions == NULL)
    return ferry_fail(FERRY_ENOMEM, "region table of %" PRIu32 " regions: out of memory", count);
  t->count = count;
  return get_sorted(in, count, t->regions, "region");
}

static int has_key_section(const ferry_region_table *t, uint32_t transport) {
  for (unsigned i = 0; i < t->key_sections; i++)
    if (t->keys[i].transport == transport)
      return 1;
  return 0;
}

/* One key section from the `avail` bytes at *p: a known transport bit not
 * seen before, a size within the limit, count keys within the body. */
static ferry_status take_keys(const uint8_t **p, size_t avail, uint32_t count,
                              ferry_region_table *t) {
  if (avail < KEYS_FIXED)
    return ferry_fail(FERRY_EPROTO, "region key section cut short (%zu bytes left)", avail);
  uint32_t transport = take_u32(p);
  uint16_t size = take_u16(p);
  if (!transport || (transport & (transport - 1)) || (transport & ~(uint32_t)FERRY_TRANSPORT_ALL))
    return ferry_fail(FERRY_EPROTO, "region keys of unknown transport 0x%x", transport);
  if (has_key_section(t, transport))
    return ferry_fail(FERRY_EPROTO, "region keys of %s sent twice",
                      ferry_transport_name(transport));
  uint64_t bytes = (uint64_t)count * size;
  if (size == 0 || size > FERRY_WIRE_MAX_KEY || bytes > avail - KEYS_FIXED)
    return ferry_fail(FERRY_EPROTO, "%s region keys of %u bytes each (limit %d, %zu bytes left)",
                      ferry_transport_name(transport), (unsigned)size, FERRY_WIRE_MAX_KEY,
                      avail - KEYS_FIXED);
  ferry_region_keys *k = &t->keys[t->key_sections];
  k->data = malloc(bytes ? bytes : 1);
  if (!k->data)
    return ferry_fail(FERRY_ENOMEM, "region keys of %" PRIu32 " regions: out of memory", count);
  k->transport = transport;
  k->size = size;
  take_bytes(p, k->data, bytes);
  t->key_sections++;
  return FERRY_OK;
}

static ferry_status take_table(const uint8_t *in, size_t len, uint32_t count,
                               ferry_region_table *t) {
  uint64_t table = (uint64_t)count * FERRY_WIRE_SEGMENT_SIZE;
  if (len > FERRY_WIRE_MAX_CONTROL_BODY)
    return ferry_fail(FERRY_EPROTO, "region table of %zu bytes exceeds %llu", len,
                      FERRY_WIRE_MAX_CONTROL_BODY);
  if ((uint64_t)len < table + 1)
    return ferry_fail(FERRY_EPROTO, "region table of %zu bytes cannot hold %" PRIu32 " regions",
                      len, count);
  ferry_status st = take_regions(in, count, t);
  const uint8_t *p = in + table, *end = in + len;
  unsigned sections = take_u8(&p);
  if (!st && sections > FERRY_WIRE_MAX_DESCRIPTORS)
    st = ferry_fail(FERRY_EPROTO, "%u region key sections (limit %d)", sections,
                    FERRY_WIRE_MAX_DESCRIPTORS);
  for (unsigned i = 0; !st && i < sections; i++)
    st = take_keys(&p, (size_t)(end - p), count, t);
  if (!st && p != end)
    st = ferry_fail(FERRY_EPROTO, "%zu bytes after the region table", (size_t)(end - p));
  return st;
}

ferry_status ferry_wire_regions_decode(const uint8_t *in, size_t len, uint32_t count,
                                       ferry_region_table *out) {
  memset(out, 0, sizeof *out);
  ferry_status st = take_table(in, len, count, out);
  if (st)
    ferry_region_table_free(out);
  return st;
}

void ferry_wire_ranges_encode(uint8_t *out, const ferry_region *ranges, uint32_t count) {
  regions_put(out, ranges, count);
}

ferry_status ferry_wire_ranges_decode(const uint8_t *in, size_t len, uint32_t count,
                                      ferry_region *out) {
  if (count > FERRY_WIRE_MAX_REGION_RANGES)
    return ferry_fail(FERRY_EPROTO, "REGIONS_REQ asks for %" PRIu32 " ranges (limit %d)", count,
                      FERRY_WIRE_MAX_REGION_RANGES);
  if ((uint64_t)len != (uint64_t)count * FERRY_WIRE_SEGMENT_SIZE)
    return ferry_fail(FERRY_EPROTO,
                      "REGIONS_REQ body of %zu bytes does not match %" PRIu32 " ranges", len,
                      count);
  return get_sorted(in, count, out, "range");
}

/* ---- Notifications ------------------------------------------------------ */

size_t ferry_wire_notify_size(size_t name_len, size_t data_len) { return 2 + name_len + data_len; }

size_t ferry_wire_notify_encode(uint8_t *out, const char *name, const void *data, size_t data_len) {
  size_t n = strlen(name); /* the caller has checked 1..FERRY_WIRE_MAX_NAME */
  put_u16(out, (uint16_t)n);
  memcpy(out + 2, name, n);
  if (data_len > 0)
    memcpy(out + 2 + n, data, data_len);
  return ferry_wire_notify_size(n, data_len);
}

ferry_status ferry_wire_notify_decode(const uint8_t *in, size_t len, const char **name,
                                      size_t *name_len, const uint8_t **data, size_t *data_len) {
  if (len < 2)
    return ferry_fail(FERRY_EPROTO, "NOTIFY body of %zu bytes is too short", len);
  size_t n = get_u16(in);
  if (n == 0 || n > FERRY_WIRE_MAX_NAME)
    return ferry_fail(FERRY_EPROTO, "NOTIFY name of %zu bytes (expected 1..%d)", n,
                      FERRY_WIRE_MAX_NAME);
  if (n > len - 2)
    return ferry_fail(FERRY_EPROTO, "NOTIFY name of %zu bytes overruns a body of %zu", n, len);
  if (memchr(in + 2, '\0', n) != NULL)
    return ferry_fail(FERRY_EPROTO, "NOTIFY name contains a NUL byte");
  size_t rest = len - 2 - n;
  if (rest > FERRY_WIRE_MAX_NOTIFY_DATA)
    return ferry_fail(FERRY_EPROTO, "NOTIFY data of %zu bytes exceeds %u", rest,
                      FERRY_WIRE_MAX_NOTIFY_DATA);
  *name = (const char *)(in + 2);
  *name_len = n;
  *data = in + 2 + n;
  *data_len = rest;
  return FERRY_OK;
}

/* ---- crc32c ------------------------------------------------------------- */

/* Castagnoli polynomial, bit-reflected. */
#define CRC32C_POLY 0x82F63B78u

/* Slicing-by-8 tables for CPUs without the crc32 instruction: table[k][b]
 * is the crc of byte b followed by k zero bytes. */
static uint32_t crc_table[8][256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void) {
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int k = 0; k < 8; k++)
      c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1u)));
    crc_table[0][b] = c;
  }
  for (int k = 1; k < 8; k++)
    for (uint32_t b = 0; b < 256; b++)
      crc_table[k][b] = (crc_table[k - 1][b] >> 8) ^ crc_table[0][crc_table[k - 1][b] & 0xff];
}

/* Works on the inverted running value, like the hardware instruction. */
static uint32_t crc32c_software(uint32_t c, const uint8_t *p, size_t n) {
  pthread_once(&crc_table_once, crc_table_init);
  while (n >= 8) {
    uint32_t lo = c ^ get_u32(p);
    uint32_t hi = get_u32(p + 4);
    c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
        crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
        crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--)
    c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
  return c;
}

#ifdef FERRY_HAVE_SSE42_CRC
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t c, const uint8_t *p,
                                                               size_t n) {
  /* Align so the 8-byte loads below never straddle a cache line needlessly. */
  while (n > 0 && ((uintptr_t)p & 7) != 0) {
    c = _mm_crc32_u8(c, *p++);
    n--;
  }
#if defined(__x86_64__)
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8); /* an aligned load; x86 is little-endian like the crc */
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = (uint32_t)c64;
#endif
  while (n >= 4) {
    uint32_t v;
    memcpy(&v, p, 4);
    c = _mm_crc32_u32(c, v);
    p += 4;
    n -= 4;
  }
  while (n--)
    c = _mm_crc32_u8(c, *p++);
  return c;
}
#endif

uint32_t ferry_crc32c(uint32_t crc, const void *data, size_t len) {
  const uint8_t *p = data;
  /* The running value is kept in its final (inverted) form between calls,
   * so crc(crc(0, a), b) == crc(0, a || b). */
  uint32_t c = ~crc;
#ifdef FERRY_HAVE_SSE42_CRC
  if (__builtin_cpu_supports("sse4.2"))
    return ~crc32c_sse42(c, p, len);
#endif
  return ~crc32c_software(c, p, len);
}

/* ---- receive pools ---------------------------------------------------------- */

size_t ferry_wire_pool_encode(uint8_t *out, const ferry_pool_req *r) {
  out[0] = r->op;
  out[1] = r->flags;
  put_u16(out + 2, (uint16_t)r->pool_len);
  put_u16(out + 4, (uint16_t)r->tag_len);
  put_u16(out + 6, 0);
  put_u32(out + 8, r->wait_ms);
  put_u64(out + 12, r->grant);
  put_u64(out + 20, r->length);
  memcpy(out + FERRY_WIRE_POOL_FIXED, r->pool, r->pool_len);
  if (r->tag_len)
    memcpy(out + FERRY_WIRE_POOL_FIXED + r->pool_len, r->tag, r->tag_len);
  return FERRY_WIRE_POOL_FIXED + r->pool_len + r->tag_len;
}

ferry_status ferry_wire_pool_decode(const uint8_t *in, size_t len, ferry_pool_req *r) {
  if (len < FERRY_WIRE_POOL_FIXED)
    return ferry_fail(FERRY_EPROTO, "POOL body of %zu bytes is too short", len);
  r->op = in[0];
  r->flags = in[1];
  r->pool_len = get_u16(in + 2);
  r->tag_len = get_u16(in + 4);
  r->wait_ms = get_u32(in + 8);
  r->grant = get_u64(in + 12);
  r->length = get_u64(in + 20);
  if ((r->op != FERRY_POOL_GRANT && r->op != FERRY_POOL_LANDED) || (r->flags & ~FERRY_POOL_NEXT) ||
      get_u16(in + 6))
    return ferry_fail(FERRY_EPROTO, "POOL body has op %u flags %u", r->op, r->flags);
  if (!r->pool_len || r->pool_len > FERRY_WIRE_MAX_NAME || r->tag_len > FERRY_WIRE_MAX_NAME ||
      (r->op == FERRY_POOL_LANDED && !r->tag_len) ||
      len != FERRY_WIRE_POOL_FIXED + r->pool_len + r->tag_len)
    return ferry_fail(FERRY_EPROTO, "POOL body: pool name %zu bytes, tag %zu, body %zu",
                      r->pool_len, r->tag_len, len);
  r->pool = (const char *)in + FERRY_WIRE_POOL_FIXED;
  r->tag = r->pool + r->pool_len;
  return FERRY_OK;
}

void ferry_wire_grant_encode(uint8_t out[FERRY_WIRE_POOL_REPLY_SIZE], const ferry_pool_grant *g) {
  put_u64(out, g->instance);
  put_u64(out + 8, g->id);
  put_u64(out + 16, g->addr);
  put_u64(out + 24, g->length);
}

void ferry_wire_grant_decode(const uint8_t in[FERRY_WIRE_POOL_REPLY_SIZE], ferry_pool_grant *g) {
  g->instance = get_u64(in);
  g->id = get_u64(in + 8);
  g->addr = get_u64(in + 16);
  g->length = get_u64(in + 24);
}
