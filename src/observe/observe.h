/* observe.h - the engine's exporters of its statistics: the /metrics
 * endpoint (metrics_http.c) and the periodic log line (metrics_log.c),
 * both over ferry_stats_snapshot (stats.c). engine/engine.c starts them
 * at create when configured and stops them at shutdown, before the peers
 * are freed. */
#ifndef FERRY_OBSERVE_H
#define FERRY_OBSERVE_H

#include "ferry.h"

ferry_status ferry_metrics_http_start(ferry_engine *engine);
void ferry_metrics_http_stop(ferry_engine *engine);
ferry_status ferry_metrics_log_start(ferry_engine *engine);
void ferry_metrics_log_stop(ferry_engine *engine);

#endif
