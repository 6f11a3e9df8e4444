/* crc32c_reference.h - a bit-at-a-time crc32c (Castagnoli), independent of
 * both of the library's code paths (table and SSE4.2), for tests and fuzz
 * targets to check ferry_crc32c against. */
#ifndef FERRY_TEST_CRC32C_REFERENCE_H
#define FERRY_TEST_CRC32C_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

static inline uint32_t crc32c_reference(uint32_t crc, const uint8_t *p, size_t n) {
  crc = ~crc;
  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; k++)
      crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

#endif
