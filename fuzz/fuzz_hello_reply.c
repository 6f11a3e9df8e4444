/* fuzz_hello_reply.c - the HELLO_REPLY body an initiator receives from the
 * target it dialed (which may be hostile or an impostor), and the same bytes
 * as the facts of an AUTH_REPLY. Accepted bodies re-encode identically and
 * the transport descriptors stay within their limits. */
#include <string.h>

#include "fuzz.h"
#include "wire/wire.h"

static void check_descriptors(const ferry_hello_reply *r) {
  FUZZ_CHECK(r->descriptor_count <= FERRY_WIRE_MAX_DESCRIPTORS);
  for (unsigned i = 0; i < r->descriptor_count; i++)
    FUZZ_CHECK(r->descriptors[i].len <= FERRY_WIRE_MAX_DESCRIPTOR);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_hello_reply reply;
  uint8_t again[FERRY_WIRE_HELLO_REPLY_MAX];
  if (ferry_wire_hello_reply_decode(data, size, &reply) == FERRY_OK) {
    check_descriptors(&reply);
    size_t len = ferry_wire_hello_reply_encode(again, &reply);
    FUZZ_CHECK(len == size && memcmp(again, data, size) == 0);
  }
  memset(&reply, 0, sizeof reply);
  if (ferry_wire_facts_decode(data, size, &reply) == FERRY_OK) {
    check_descriptors(&reply);
    size_t len = ferry_wire_facts_encode(again, &reply);
    FUZZ_CHECK(len == size && memcmp(again, data, size) == 0);
  }
  return 0;
}
