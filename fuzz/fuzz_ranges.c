/* fuzz_ranges.c - REGIONS_REQ bodies from an initiator: the address ranges
 * it asks the target's regions for. The first two bytes are the header's
 * count; accepted ranges must be within the limit, non-empty,
 * non-wrapping, sorted and disjoint, since the target walks its registry
 * with them in one pass. */
#include <stdlib.h>

#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  uint32_t count = (uint32_t)data[0] | (uint32_t)data[1] << 8;
  /* Mostly a count that matches the body, sometimes the raw value. */
  if (!(data[1] & 0x80))
    count = (uint32_t)((size - 2) / FERRY_WIRE_SEGMENT_SIZE);
  if (count > FERRY_WIRE_MAX_REGION_RANGES + 1)
    count = FERRY_WIRE_MAX_REGION_RANGES + 1;
  ferry_region *out = malloc((count ? count : 1) * sizeof *out);
  if (!out)
    return 0;
  if (ferry_wire_ranges_decode(data + 2, size - 2, count, out) == FERRY_OK) {
    FUZZ_CHECK(count <= FERRY_WIRE_MAX_REGION_RANGES);
    FUZZ_CHECK((uint64_t)count * FERRY_WIRE_SEGMENT_SIZE == size - 2);
    for (uint32_t i = 0; i < count; i++) {
      FUZZ_CHECK(out[i].length > 0);
      FUZZ_CHECK(out[i].addr + out[i].length > out[i].addr);
      if (i > 0)
        FUZZ_CHECK(out[i].addr >= out[i - 1].addr + out[i - 1].length);
    }
  }
  free(out);
  return 0;
}
