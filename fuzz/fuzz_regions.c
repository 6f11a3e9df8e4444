/* fuzz_regions.c - REGIONS_REPLY tables from a target. The first four bytes
 * are the header's count; accepted tables must be sorted, disjoint and
 * non-wrapping, since the initiator binary-searches them, and their key
 * sections within limits. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  uint32_t count = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                   (uint32_t)data[3] << 24;
  /* Mostly a small count (the first byte), sometimes the raw value. */
  if (!(data[3] & 0x80))
    count = data[0];
  ferry_region_table t;
  if (ferry_wire_regions_decode(data + 4, size - 4, count, &t) != FERRY_OK) {
    FUZZ_CHECK(t.regions == NULL && t.key_sections == 0);
    return 0;
  }
  FUZZ_CHECK(t.count == count && t.key_sections <= FERRY_WIRE_MAX_DESCRIPTORS);
  for (uint32_t i = 0; i < count; i++) {
    FUZZ_CHECK(t.regions[i].length > 0);
    FUZZ_CHECK(t.regions[i].addr + t.regions[i].length > t.regions[i].addr);
    if (i > 0)
      FUZZ_CHECK(t.regions[i].addr >= t.regions[i - 1].addr + t.regions[i - 1].length);
  }
  for (unsigned k = 0; k < t.key_sections; k++)
    FUZZ_CHECK(t.keys[k].size >= 1 && t.keys[k].size <= FERRY_WIRE_MAX_KEY);
  /* What was accepted is exactly what the encoder writes for it. */
  uint8_t *again = malloc(size);
  FUZZ_CHECK(again != NULL);
  FUZZ_CHECK(ferry_wire_regions_encode(again, t.regions, count, t.keys, t.key_sections) ==
             size - 4);
  FUZZ_CHECK(memcmp(again, data + 4, size - 4) == 0);
  free(again);
  ferry_region_table_free(&t);
  return 0;
}
