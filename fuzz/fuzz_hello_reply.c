/* fuzz_hello_reply.c - the HELLO_REPLY body an initiator receives from the
 * target it dialed (which may be hostile or an impostor), and the same bytes
 * as the facts of an AUTH_REPLY. Accepted bodies re-encode identically and
 * the shm path is a proper C string. */
#include <string.h>

#include "fuzz.h"
#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_hello_reply reply;
  uint8_t again[FERRY_WIRE_HELLO_REPLY_MAX];
  if (ferry_wire_hello_reply_decode(data, size, &reply) == FERRY_OK) {
    FUZZ_CHECK(strnlen(reply.shm_path, sizeof reply.shm_path) <= FERRY_WIRE_MAX_NAME);
    size_t len = ferry_wire_hello_reply_encode(again, &reply);
    FUZZ_CHECK(len == size && memcmp(again, data, size) == 0);
  }
  memset(&reply, 0, sizeof reply);
  if (ferry_wire_facts_decode(data, size, &reply) == FERRY_OK) {
    FUZZ_CHECK(strnlen(reply.shm_path, sizeof reply.shm_path) <= FERRY_WIRE_MAX_NAME);
    size_t len = ferry_wire_facts_encode(again, &reply);
    FUZZ_CHECK(len == size && memcmp(again, data, size) == 0);
  }
  return 0;
}
