/* fuzz_regions.c - REGIONS_REPLY tables from a target. The first four bytes
 * are the header's count; accepted tables must be sorted, disjoint and
 * non-wrapping, since the initiator binary-searches them. */
#include <stdlib.h>

#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  uint32_t count = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                   (uint32_t)data[3] << 24;
  /* Mostly a count that matches the table, sometimes the raw value. */
  if (!(data[3] & 0x80))
    count = (uint32_t)((size - 4) / FERRY_WIRE_SEGMENT_SIZE);
  ferry_region *regions = NULL;
  if (ferry_wire_regions_decode(data + 4, size - 4, count, &regions) != FERRY_OK) {
    FUZZ_CHECK(regions == NULL);
    return 0;
  }
  FUZZ_CHECK((uint64_t)count * FERRY_WIRE_SEGMENT_SIZE == size - 4);
  for (uint32_t i = 0; i < count; i++) {
    FUZZ_CHECK(regions[i].length > 0);
    FUZZ_CHECK(regions[i].addr + regions[i].length > regions[i].addr);
    if (i > 0)
      FUZZ_CHECK(regions[i].addr >= regions[i - 1].addr + regions[i - 1].length);
  }
  free(regions);
  return 0;
}
