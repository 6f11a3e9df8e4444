/* fuzz_crc32c.c - checksum mode's crc32c against a bitwise reference, on
 * any length and alignment, and the chaining rule crc(crc(a), b) ==
 * crc(a || b) that multi-segment frames rely on. */
#include "../tests/support/crc32c_reference.h"
#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint32_t whole = ferry_crc32c(0, data, size);
  FUZZ_CHECK(whole == crc32c_reference(0, data, size));
  size_t cut = size ? data[0] % (size + 1) : 0;
  FUZZ_CHECK(ferry_crc32c(ferry_crc32c(0, data, cut), data + cut, size - cut) == whole);
  return 0;
}
