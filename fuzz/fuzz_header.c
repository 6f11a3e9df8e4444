/* fuzz_header.c - ferry_wire_header_decode on arbitrary 32 bytes: whatever
 * it accepts must respect the per-type limits and re-encode to the same
 * bytes. */
#include <string.h>

#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < FERRY_WIRE_HEADER_SIZE)
    return 0;
  ferry_frame_header h;
  if (ferry_wire_header_decode(data, &h) != FERRY_OK)
    return 0;
  FUZZ_CHECK(h.type >= FERRY_FRAME_HELLO && h.type <= FERRY_FRAME_LAST);
  FUZZ_CHECK(h.status <= 0);
  if (h.status == 0 && (h.type == FERRY_FRAME_WRITE || h.type == FERRY_FRAME_READ)) {
    FUZZ_CHECK(h.count >= 1 && h.count <= FERRY_WIRE_MAX_SEGMENTS);
    FUZZ_CHECK(h.body_len >= (uint64_t)h.count * FERRY_WIRE_SEGMENT_SIZE);
    /* A WRITE may carry an after-landed message (a POOL body) past its data. */
    uint64_t after = (h.flags & FERRY_FRAME_FLAG_AFTER) ? FERRY_WIRE_POOL_MAX : 0;
    FUZZ_CHECK(h.body_len <=
               (uint64_t)h.count * FERRY_WIRE_SEGMENT_SIZE + FERRY_WIRE_MAX_PAYLOAD + 4 + after);
  } else if (h.status == 0 && h.type != FERRY_FRAME_REGIONS_REPLY) {
    FUZZ_CHECK(h.body_len <= FERRY_WIRE_MAX_PAYLOAD + 4);
  } else if (h.status != 0) {
    FUZZ_CHECK(h.body_len <= FERRY_WIRE_MAX_REASON);
  }
  uint8_t again[FERRY_WIRE_HEADER_SIZE];
  ferry_wire_header_encode(again, &h);
  FUZZ_CHECK(memcmp(again, data, FERRY_WIRE_HEADER_SIZE) == 0);
  return 0;
}
