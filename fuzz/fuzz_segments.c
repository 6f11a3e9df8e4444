/* fuzz_segments.c - segment tables of WRITE and READ frames. The first two
 * bytes pick the count; accepted tables must have non-empty, non-wrapping
 * segments whose total fits a frame, and re-encode to the same bytes. */
#include <string.h>

#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  uint32_t count = (uint32_t)(data[0] | data[1] << 8) % (FERRY_WIRE_MAX_SEGMENTS + 8);
  data += 2;
  size -= 2;
  if ((size_t)count * FERRY_WIRE_SEGMENT_SIZE > size)
    count = (uint32_t)(size / FERRY_WIRE_SEGMENT_SIZE);
  static ferry_region segs[FERRY_WIRE_MAX_SEGMENTS + 8];
  uint64_t total = 0;
  if (ferry_wire_segments_decode(data, count, segs, &total) != FERRY_OK)
    return 0;
  FUZZ_CHECK(count <= FERRY_WIRE_MAX_SEGMENTS);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < count; i++) {
    FUZZ_CHECK(segs[i].length > 0);
    FUZZ_CHECK(segs[i].addr + segs[i].length > segs[i].addr);
    sum += segs[i].length;
  }
  FUZZ_CHECK(sum == total && total <= FERRY_WIRE_MAX_PAYLOAD);
  static uint8_t again[(FERRY_WIRE_MAX_SEGMENTS + 8) * FERRY_WIRE_SEGMENT_SIZE];
  ferry_wire_segments_encode(again, segs, count);
  FUZZ_CHECK(memcmp(again, data, (size_t)count * FERRY_WIRE_SEGMENT_SIZE) == 0);
  return 0;
}
