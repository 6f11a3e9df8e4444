/* store_serve.h - one request served by a store_map as a master's
 * connection serves it, without a network: for the tests that drive the
 * master's map directly. */
#ifndef FERRY_TEST_STORE_SERVE_H
#define FERRY_TEST_STORE_SERVE_H

#include <stdint.h>

#include "store/map.h"
#include "store/protocol.h"

/* Serves req (an operation byte, then its body; freed) from client with
 * count entries; fails the test when refused. The reply's reader; free
 * *reply when done. */
store_reader test_store_serve(store_map *m, uint64_t client, store_writer *req, uint32_t count,
                              store_writer *reply);

/* A PUT_START's head: replicas asked, the preferred segment ("": none),
 * no pin; the caller adds the entries (key, size). */
void test_store_put_start(store_writer *w, uint8_t replicas, const char *preferred);
/* An offloading client's round (client, its segment and nonce): one poll
 * of up to max tasks, their kinds in kinds as letters (O offload, L load,
 * D delete; NUL-terminated, cap bytes), every offload reported written
 * (each report asserted accepted). Returns the tasks' count. */
uint32_t test_store_offload_round(store_map *m, uint64_t client, const char *segment,
                                  uint64_t nonce, uint32_t max, char *kinds, size_t cap);
/* A REGISTER of this protocol: a segment of size bytes at base, its name
 * and nonce. */
void test_store_register(store_writer *w, uint64_t base, uint64_t size, const char *name,
                         uint64_t nonce);

#endif
