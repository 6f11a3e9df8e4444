/* metrics_log.c - Mooncake's MC_TE_METRIC: every metrics_log_s seconds one
 * INFO line with the throughput since the previous line, for operators who
 * read logs rather than scrape. A thread that sleeps on a condition
 * variable between lines; shutdown wakes and joins it. */
#include <pthread.h>
#include <stdlib.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "core/engine.h"
#include "observe.h"

struct ferry_metrics_log {
  ferry_engine *engine;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int stop;
  pthread_t thread;
};

typedef struct totals {
  uint64_t bytes[2], ops[2], errors;
} totals;

static void sum(const ferry_stats *s, totals *t) {
  *t = (totals){0};
  for (size_t i = 0; i < s->link_count; i++)
    for (int op = 0; op < 2; op++) {
      t->bytes[op] += s->links[i].bytes[op];
      t->ops[op] += s->links[i].ops[op];
    }
  for (int i = 0; i < FERRY_STATS_CODES; i++)
    t->errors += s->errors[i];
}

/* Logs the change from *last to now over `seconds`, and keeps now. */
static void log_line(ferry_engine *e, totals *last, double seconds) {
  ferry_stats *s;
  if (ferry_stats_snapshot(e, &s))
    return; /* shutting down: no line */
  totals now;
  sum(s, &now);
  FERRY_INFO(
      "metrics %s: write %.3f GB/s %.0f ops/s, read %.3f GB/s %.0f ops/s, "
      "%llu errors, %llu batches in flight",
      e->name, (double)(now.bytes[FERRY_OP_WRITE] - last->bytes[FERRY_OP_WRITE]) / seconds / 1e9,
      (double)(now.ops[FERRY_OP_WRITE] - last->ops[FERRY_OP_WRITE]) / seconds,
      (double)(now.bytes[FERRY_OP_READ] - last->bytes[FERRY_OP_READ]) / seconds / 1e9,
      (double)(now.ops[FERRY_OP_READ] - last->ops[FERRY_OP_READ]) / seconds,
      (unsigned long long)(now.errors - last->errors), (unsigned long long)s->batches_in_flight);
  ferry_stats_free(s);
  *last = now;
}

static void *log_thread(void *arg) {
  struct ferry_metrics_log *m = arg;
  uint64_t interval = (uint64_t)m->engine->cfg.metrics_log_s * 1000000000ull;
  totals last = {0};
  uint64_t since = ferry_now_ns();
  pthread_mutex_lock(&m->lock);
  while (!m->stop) {
    struct timespec until = ferry_timespec(since + interval);
    if (pthread_cond_timedwait(&m->cond, &m->lock, &until) == 0 || m->stop)
      continue; /* woken: stop, or spurious */
    pthread_mutex_unlock(&m->lock);
    uint64_t now = ferry_now_ns();
    log_line(m->engine, &last, (double)(now - since) / 1e9);
    since = now;
    pthread_mutex_lock(&m->lock);
  }
  pthread_mutex_unlock(&m->lock);
  return NULL;
}

ferry_status ferry_metrics_log_start(ferry_engine *e) {
  if (!e->cfg.metrics_log_s)
    return FERRY_OK;
  struct ferry_metrics_log *m = calloc(1, sizeof *m);
  if (!m)
    return ferry_fail(FERRY_ENOMEM, "no memory for the metrics log");
  m->engine = e;
  pthread_mutex_init(&m->lock, NULL);
  ferry_cond_init(&m->cond);
  if (pthread_create(&m->thread, NULL, log_thread, m) != 0) {
    pthread_mutex_destroy(&m->lock);
    pthread_cond_destroy(&m->cond);
    free(m);
    return ferry_fail(FERRY_ENOMEM, "metrics log: cannot start its thread");
  }
  e->metrics_log = m;
  return FERRY_OK;
}

void ferry_metrics_log_stop(ferry_engine *e) {
  struct ferry_metrics_log *m = e->metrics_log;
  if (!m)
    return;
  pthread_mutex_lock(&m->lock);
  m->stop = 1;
  pthread_cond_signal(&m->cond);
  pthread_mutex_unlock(&m->lock);
  pthread_join(m->thread, NULL);
  pthread_mutex_destroy(&m->lock);
  pthread_cond_destroy(&m->cond);
  free(m);
  e->metrics_log = NULL;
}
