/* log.h - leveled log lines, each carrying a timestamp, the level, the
 * thread and the engine it is about; written to stderr or handed to the
 * host's handler (ferry_log_set_handler). */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

#include <stddef.h>

#include "ferry.h"

void ferry_log(ferry_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ferry_log_enabled(ferry_log_level level);
/* "debug", "info", "warn", "error" or "off" (any case). Returns 0 or -1. */
int ferry_log_level_parse(const char *name, ferry_log_level *out);

/* Text from outside (a peer's HELLO name, a refusal's reason, a key) made
 * safe for one log line: every byte outside printable ASCII, and the
 * backslash, becomes \xNN, so it cannot end the line, forge another or
 * drive a terminal. Escapes the len bytes of src into dst (size bytes,
 * NUL-terminated, cut before an escape that does not fit). Returns dst. */
char *ferry_log_escape(char *dst, size_t size, const char *src, size_t len);

/* The engine this thread works for, by its name (the string is read only
 * when a line is emitted, so it may be filled in later). NULL: none.
 * Returns the previous one, for the caller to put back. */
const char *ferry_log_set_engine(const char *name);

#define FERRY_DEBUG(...)                                                                           \
  do {                                                                                             \
    if (ferry_log_enabled(FERRY_LOG_DEBUG))                                                        \
      ferry_log(FERRY_LOG_DEBUG, __VA_ARGS__);                                                     \
  } while (0)
#define FERRY_INFO(...) ferry_log(FERRY_LOG_INFO, __VA_ARGS__)
#define FERRY_WARN(...) ferry_log(FERRY_LOG_WARN, __VA_ARGS__)
#define FERRY_ERROR(...) ferry_log(FERRY_LOG_ERROR, __VA_ARGS__)

#endif
