/* log.c - process-wide log level (FERRY_LOG=debug|info|warn|error|off) and
 * one-line writes to stderr, so concurrent threads never interleave, or to
 * the host's handler. A record is always one line: control characters in
 * a message are escaped, whatever text from outside a caller put in it
 * (that text is escaped where it comes in, ferry_log_escape, so that error
 * details handed to the host are safe too). Nothing here costs anything on a path that emits no
 * line: the thread's engine is one thread-local pointer, and the time, the
 * thread id and the format are taken only for a line that is emitted. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static volatile int current_level = FERRY_LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};
static const char *const level_tags[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};

/* The handler and its argument change together; a line being handed to
 * the old handler finishes before ferry_log_set_handler returns, so the
 * host may free arg then. */
static pthread_rwlock_t handler_lock = PTHREAD_RWLOCK_INITIALIZER;
static ferry_log_handler handler;
static void *handler_arg;

static __thread const char *thread_engine;

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

void ferry_log_set_handler(ferry_log_handler fn, void *arg) {
  pthread_rwlock_wrlock(&handler_lock);
  handler = fn;
  handler_arg = arg;
  pthread_rwlock_unlock(&handler_lock);
}

const char *ferry_log_set_engine(const char *name) {
  const char *prev = thread_engine;
  thread_engine = name;
  return prev;
}

/* strict: everything but printable ASCII and the backslash (text from
 * outside); else control characters only (a whole message, in which text
 * from outside is escaped already and the rest is ferry's or the host's). */
static int needs_escape(unsigned char c, int strict) {
  return c < 0x20 || c == 0x7f || (strict && (c > 0x7f || c == '\\'));
}

static char *escape(char *dst, size_t size, const char *src, size_t len, int strict) {
  static const char hex[] = "0123456789abcdef";
  size_t n = 0;
  for (size_t i = 0; i < len && n + 1 < size; i++) {
    unsigned char c = (unsigned char)src[i];
    if (!needs_escape(c, strict)) {
      dst[n++] = (char)c;
      continue;
    }
    if (n + 5 > size)
      break;
    dst[n++] = '\\';
    dst[n++] = 'x';
    dst[n++] = hex[c >> 4];
    dst[n++] = hex[c & 15];
  }
  if (size)
    dst[n] = '\0';
  return dst;
}

char *ferry_log_escape(char *dst, size_t size, const char *src, size_t len) {
  return escape(dst, size, src, len, 1);
}

/* "2026-12-01T08:34:12.123Z INFO ferry[pid:tid] engine: " */
static int format_prefix(char *buf, size_t size, const ferry_log_record *r) {
  time_t secs = (time_t)(r->time_ns / 1000000000ull);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  return snprintf(buf, size, "%s.%03uZ %s ferry[%d:%ld] %s: ", stamp,
                  (unsigned)(r->time_ns / 1000000ull % 1000), level_tags[r->level], (int)getpid(),
                  r->thread, *r->engine ? r->engine : "-");
}

void ferry_log(ferry_log_level level, const char *fmt, ...) {
  if (!ferry_log_enabled(level) || level >= FERRY_LOG_OFF)
    return;
  char raw[1024], message[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  /* One record is one line, whatever text from outside a caller put in
   * it without escaping. */
  escape(message, sizeof message, raw, strlen(raw), 0);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  ferry_log_record r = {
      .level = level,
      .time_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec,
      .thread = (long)syscall(SYS_gettid),
      .engine = thread_engine ? thread_engine : "",
      .message = message,
  };
  char line[1280];
  int n = format_prefix(line, sizeof line - 1, &r);
  if (n < 0 || (size_t)n >= sizeof line - 1)
    n = 0;
  size_t len = (size_t)n + (size_t)snprintf(line + n, sizeof line - 1 - (size_t)n, "%s", message);
  if (len > sizeof line - 2)
    len = sizeof line - 2;
  r.line = line;
  pthread_rwlock_rdlock(&handler_lock);
  if (handler) {
    handler(&r, handler_arg);
  } else {
    line[len++] = '\n';
    ssize_t unused = write(STDERR_FILENO, line, len);
    (void)unused;
  }
  pthread_rwlock_unlock(&handler_lock);
}
