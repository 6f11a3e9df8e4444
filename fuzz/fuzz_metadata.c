/* fuzz_metadata.c - segment descriptors as the metadata service returns
 * them (JSON that any writer of the store controls). A stand-in backend
 * answers every GET with the fuzz input, and the real lookup code parses it
 * through jansson: ferry_segment_lookup (rpc_meta: host and port) and
 * ferry_segment_lookup_regions (ram: buffers). Accepted results must be a
 * terminated host that fits, a port in 1..65535, and sorted regions. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "metadata/backend.h"

static const uint8_t *input;
static size_t input_size;

static ferry_status fake_get(void *state, const char *key, char **value) {
  char *text = malloc(input_size + 1);
  if (!text)
    return FERRY_ENOMEM;
  memcpy(text, input, input_size);
  text[input_size] = 0;
  *value = text;
  return FERRY_OK;
}

static ferry_status fake_put(void *state, const char *key, const char *value, uint32_t ttl_ms) {
  return FERRY_OK;
}
static ferry_status fake_del(void *state, const char *key) { return FERRY_OK; }
static void fake_close(void *state) {}

static const ferry_metadata_ops fake_ops = {
    .scheme = "fuzz", .put = fake_put, .get = fake_get, .del = fake_del, .close = fake_close};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input = data;
  input_size = size;
  ferry_metadata md = {.ops = &fake_ops, .cache_lock = PTHREAD_MUTEX_INITIALIZER};
  char host[64];
  memset(host, 'x', sizeof host);
  uint16_t port = 0;
  if (ferry_segment_lookup(&md, "seg", host, sizeof host, &port) == FERRY_OK) {
    FUZZ_CHECK(memchr(host, 0, sizeof host) != NULL && host[0] != 0);
    FUZZ_CHECK(port >= 1);
  }
  ferry_region *regions = NULL;
  size_t count = 0;
  if (ferry_segment_lookup_regions(&md, "seg", &regions, &count) == FERRY_OK) {
    FUZZ_CHECK(count == 0 || regions != NULL);
    for (size_t i = 1; i < count; i++)
      FUZZ_CHECK(regions[i].addr >= regions[i - 1].addr);
  }
  free(regions);
  ferry_segment_cache_free(&md);
  return 0;
}
