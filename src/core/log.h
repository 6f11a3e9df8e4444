/* log.h - leveled log lines to stderr ("ferry[pid] LEVEL: message"). */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

#include "ferry.h"

void ferry_log(ferry_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ferry_log_enabled(ferry_log_level level);
/* "debug", "info", "warn", "error" or "off" (any case). Returns 0 or -1. */
int ferry_log_level_parse(const char *name, ferry_log_level *out);

#define FERRY_DEBUG(...)                                                                           \
  do {                                                                                             \
    if (ferry_log_enabled(FERRY_LOG_DEBUG))                                                        \
      ferry_log(FERRY_LOG_DEBUG, __VA_ARGS__);                                                     \
  } while (0)
#define FERRY_INFO(...) ferry_log(FERRY_LOG_INFO, __VA_ARGS__)
#define FERRY_WARN(...) ferry_log(FERRY_LOG_WARN, __VA_ARGS__)
#define FERRY_ERROR(...) ferry_log(FERRY_LOG_ERROR, __VA_ARGS__)

#endif
