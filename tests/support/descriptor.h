/* descriptor.h - checks of a fabric descriptor as untrusted input, shared
 * by test_fabric, test_fabric_lanes, test_fabric_rails and
 * test_fabric_domains: every truncation of a real descriptor, and one
 * altered byte, each decoded from a buffer of exactly the decoded length so
 * that AddressSanitizer sees any read past the end. */
#ifndef FERRY_TEST_DESCRIPTOR_H
#define FERRY_TEST_DESCRIPTOR_H

#include <stddef.h>
#include <stdint.h>

/* Decodes every cut of real (0 .. len-1 bytes) and asserts that exactly
 * the lengths in ok[0 .. ok_count-1] decode, each with neither rails nor
 * lanes (the shorter, older forms). */
void test_descriptor_cuts(const uint8_t *real, size_t len, const size_t *ok, size_t ok_count);

/* Decodes decode_len bytes of real (zeros past len) with the byte at `at`
 * set to value, and asserts it is refused with a reason naming `needle`. */
void test_descriptor_refused(const uint8_t *real, size_t len, size_t decode_len, size_t at,
                             uint8_t value, const char *needle);

#endif
