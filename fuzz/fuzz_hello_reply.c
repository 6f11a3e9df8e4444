/* fuzz_hello_reply.c - the HELLO_REPLY body an initiator receives from the
 * target it dialed (which may be hostile or an impostor). Accepted bodies
 * re-encode identically and the shm path is a proper C string. */
#include <string.h>

#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_hello_reply reply;
  if (ferry_wire_hello_reply_decode(data, size, &reply) != FERRY_OK)
    return 0;
  FUZZ_CHECK(strnlen(reply.shm_path, sizeof reply.shm_path) <= FERRY_WIRE_MAX_NAME);
  uint8_t again[FERRY_WIRE_HELLO_REPLY_MAX];
  size_t len = ferry_wire_hello_reply_encode(again, &reply);
  FUZZ_CHECK(len == size && memcmp(again, data, size) == 0);
  return 0;
}
