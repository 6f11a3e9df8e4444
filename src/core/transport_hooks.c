/* transport_hooks.c - the engine-wide calls into every transport in use
 * (their hooks, transport.h) that the server's replies and the unregister
 * need: the descriptors of a HELLO_REPLY (describe), the key sections of a
 * region table (region_keys) and the fence (fence). */
#include <stdlib.h>

#include "base/error.h"
#include "engine.h"
#include "transport.h"

void ferry_engine_describe(ferry_engine *e, ferry_hello_reply *r) {
  r->descriptor_count = 0;
  for (size_t i = 0; ferry_transports[i] && r->descriptor_count < FERRY_WIRE_MAX_DESCRIPTORS; i++) {
    const ferry_transport *t = ferry_transports[i];
    if (!(e->transports & t->id) || !t->describe)
      continue;
    ferry_wire_descriptor *d = &r->descriptors[r->descriptor_count];
    d->len = (uint16_t)t->describe(e, d->data, sizeof d->data);
    d->transport = t->id;
    if (d->len)
      r->descriptor_count++;
  }
}

ferry_status ferry_engine_region_keys(ferry_engine *e, const ferry_region *regions, size_t count,
                                      ferry_region_keys keys[FERRY_WIRE_MAX_DESCRIPTORS],
                                      unsigned *sections) {
  *sections = 0;
  for (size_t i = 0; ferry_transports[i] && *sections < FERRY_WIRE_MAX_DESCRIPTORS; i++) {
    const ferry_transport *t = ferry_transports[i];
    size_t size = (e->transports & t->id) && t->region_key_size ? t->region_key_size(e) : 0;
    if (!size || size > FERRY_WIRE_MAX_KEY || !t->region_keys)
      continue;
    ferry_region_keys *k = &keys[*sections];
    k->data = calloc(count ? count : 1, size);
    if (!k->data)
      return ferry_fail(FERRY_ENOMEM, "no memory for %s keys of %zu regions", t->name, count);
    k->transport = t->id;
    k->size = (uint16_t)size;
    t->region_keys(e, regions, count, k->data);
    (*sections)++;
  }
  return FERRY_OK;
}

void ferry_engine_fence(ferry_engine *e, ferry_region *removed, size_t count) {
  for (size_t i = 0; ferry_transports[i]; i++)
    if ((e->transports & ferry_transports[i]->id) && ferry_transports[i]->fence)
      ferry_transports[i]->fence(e, removed, count);
  ferry_server_fence(e, removed, count);
}
