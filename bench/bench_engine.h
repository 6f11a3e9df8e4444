/* bench_engine.h - what the bench programs that drive the engine itself
 * (scale_batch, scale_regions, plan_bench) share: a failed call exits naming the
 * program (BENCH_PROG, defined before the include) and the step, and their
 * engines are TCP only on 127.0.0.1 (engine_new), so what they measure is
 * ferry's own path and server, never shm; plan_bench also asks for shm
 * (engine_with). Header-only, like bench_common.h. */
#ifndef FERRY_BENCH_ENGINE_H
#define FERRY_BENCH_ENGINE_H

#include <stdio.h>
#include <stdlib.h>

#include "ferry.h"

static inline void check(ferry_status st, const char *what) {
  if (st) {
    fprintf(stderr, "%s: %s: %s\n", BENCH_PROG, what, ferry_last_error());
    exit(1);
  }
}

/* An engine on 127.0.0.1 with these transports (0: all). */
static inline ferry_engine *engine_with(unsigned transports) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.port = 0;
  cfg.transports = transports;
  ferry_engine *e;
  check(ferry_engine_create(&cfg, &e), "engine");
  return e;
}

static inline ferry_engine *engine_new(void) { return engine_with(FERRY_TRANSPORT_TCP); }

#endif
