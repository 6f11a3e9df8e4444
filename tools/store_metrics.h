/* store_metrics.h - the store master's metrics over HTTP (`ferry
 * store-master --metrics_port`, Mooncake's flag): GET /metrics answers the
 * Prometheus text of src/store/metrics.h, GET /metrics/summary its one
 * report line. */
#ifndef FERRY_TOOLS_STORE_METRICS_H
#define FERRY_TOOLS_STORE_METRICS_H

#include "store/map.h"

/* Fills *out with the counts of the master the tool runs now. */
typedef void (*store_stats_fn)(void *arg, store_map_stats *out);

typedef struct store_metrics_server store_metrics_server;

/* Listens on host:port (0: a free one) and answers from stats(arg) on a
 * thread of its own; NULL after printing why to stderr. */
store_metrics_server *store_metrics_start(const char *host, unsigned port, store_stats_fn stats,
                                          void *arg);
unsigned store_metrics_port(const store_metrics_server *s);
void store_metrics_stop(store_metrics_server *s);

#endif
