/* fuzz_hello.c - the HELLO body a target receives from anyone who connects
 * (before any secret is checked). Accepted bodies re-encode identically and
 * their name is a proper C string. */
#include <string.h>

#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_hello hello;
  if (ferry_wire_hello_decode(data, size, &hello) != FERRY_OK)
    return 0;
  size_t n = strnlen(hello.name, sizeof hello.name);
  FUZZ_CHECK(n <= FERRY_WIRE_MAX_NAME);
  uint8_t again[FERRY_WIRE_HELLO_MAX];
  size_t len = ferry_wire_hello_encode(again, &hello);
  FUZZ_CHECK(len == size && memcmp(again, data, size) == 0);
  return 0;
}
