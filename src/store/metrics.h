/* metrics.h - the master's counts (store_map_stats) as Prometheus text
 * under Mooncake's master metric names, and as the one line of its
 * periodic report, for `ferry store-master --metrics_port` and
 * `--enable_metric_reporting` (tools/store_master.c). */
#ifndef FERRY_STORE_METRICS_H
#define FERRY_STORE_METRICS_H

#include <stddef.h>

#include "store/map.h"

/* The exposition text (malloc'd, NUL-terminated); NULL without memory. */
char *store_metrics_prometheus(const store_map_stats *s);
/* "12 keys, 1.5 GiB of 4.0 GiB allocated (37.5%) in 3 segments, ..." */
void store_metrics_summary(const store_map_stats *s, char *out, size_t size);

#endif
