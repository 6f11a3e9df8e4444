/* log.c - process-wide log level (FERRY_LOG=debug|info|warn|error|off) and
 * one-line writes to stderr, so concurrent threads never interleave. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static volatile int current_level = FERRY_LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

int ferry_log_level_parse(const char *name, ferry_log_level *out) {
  for (int i = 0; i <= FERRY_LOG_OFF; i++)
    if (strcasecmp(name, level_names[i]) == 0)
      return *out = (ferry_log_level)i, 0;
  return -1;
}

/* A bad value leaves the default; ferry_engine_create reports it. */
static void level_from_env(void) {
  const char *env = getenv("FERRY_LOG");
  ferry_log_level level;
  if (env && ferry_log_level_parse(env, &level) == 0)
    current_level = level;
}

void ferry_log_set_level(ferry_log_level level) {
  pthread_once(&level_once, level_from_env);
  if (level >= FERRY_LOG_DEBUG && level <= FERRY_LOG_OFF)
    __atomic_store_n(&current_level, (int)level, __ATOMIC_RELAXED);
}

ferry_log_level ferry_log_get_level(void) {
  pthread_once(&level_once, level_from_env);
  return (ferry_log_level)__atomic_load_n(&current_level, __ATOMIC_RELAXED);
}

int ferry_log_enabled(ferry_log_level level) { return level >= ferry_log_get_level(); }

void ferry_log(ferry_log_level level, const char *fmt, ...) {
  if (!ferry_log_enabled(level) || level >= FERRY_LOG_OFF)
    return;
  char line[1024];
  int n = snprintf(line, sizeof line, "ferry[%d] %s: ", (int)getpid(), level_names[level]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(line);
  line[len++] = '\n';
  ssize_t unused = write(STDERR_FILENO, line, len);
  (void)unused;
}
