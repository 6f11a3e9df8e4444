/* fuzz.h - shared by the libFuzzer targets in this folder: the entry point
 * they define, and a check that crashes loudly (so libFuzzer keeps the
 * input) when a decoder accepts something that breaks its own promises. */
#ifndef FERRY_FUZZ_H
#define FERRY_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ferry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* fuzz_server: the target's registered buffer sits at a fixed address so
 * seeds (and the fuzzer) can aim WRITEs and READs at it. */
#define FUZZ_SERVER_BUF 0x200000000000ull
#define FUZZ_SERVER_BUF_SIZE (1u << 20)
#define FUZZ_SERVER_SECRET "fuzz-secret"
/* fuzz_client: the remote address the initiator reads and writes; the
 * seeds' REGIONS_REPLY announces a region holding it. */
#define FUZZ_CLIENT_REMOTE 0x10000ull
#define FUZZ_CLIENT_LEN 4096

/* fuzz_client, fuzz_server: a configuration for an engine on 127.0.0.1,
 * TCP only, with one worker thread. */
static inline void fuzz_loopback_config(ferry_config *cfg) {
  ferry_config_init(cfg);
  cfg->bind_host = cfg->advertise_host = "127.0.0.1";
  cfg->transports = FERRY_TRANSPORT_TCP;
  cfg->workers = 1;
}

#define FUZZ_CHECK(cond)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);                 \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#endif
