/* fuzz_notify.c - NOTIFY bodies. Accepted ones point inside the input, the
 * name is 1..256 bytes without NUL, and name + data account for the body. */
#include <string.h>

#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *name;
  const uint8_t *payload;
  size_t name_len, data_len;
  if (ferry_wire_notify_decode(data, size, &name, &name_len, &payload, &data_len) != FERRY_OK)
    return 0;
  FUZZ_CHECK(name_len >= 1 && name_len <= FERRY_WIRE_MAX_NAME);
  FUZZ_CHECK(memchr(name, 0, name_len) == NULL);
  FUZZ_CHECK((const uint8_t *)name == data + 2);
  FUZZ_CHECK(payload == data + 2 + name_len);
  FUZZ_CHECK(2 + name_len + data_len == size);
  FUZZ_CHECK(data_len <= FERRY_WIRE_MAX_NOTIFY_DATA);
  return 0;
}
