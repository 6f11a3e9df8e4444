/* metrics.c - the master's counts as Prometheus text and as a report line
 * (metrics.h). The names are Mooncake's master metrics where ferry's
 * master has the same thing (master_key_count, master_put_start_requests_
 * total, ...), so dashboards made for mooncake_master read this one; the
 * operations Mooncake does not have are named the same way
 * (master_upsert_start_*, master_drop_file_*, master_mounted_segments).
 * Every request counts each of its keys, batches included (Mooncake keeps
 * separate master_batch_* series; ferry's protocol is batched throughout). */
#include "store/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* The metric name of each counted operation (map.h's slots). */
static const char *const op_names[STORE_COUNT_SLOTS] = {
    [STORE_REGISTER] = "mount_segment",
    [STORE_PING] = "ping",
    [STORE_PUT_START] = "put_start",
    [STORE_PUT_END] = "put_end",
    [STORE_GET] = "get_replica_list",
    [STORE_QUERY] = "exist_key",
    [STORE_REMOVE] = "remove",
    [STORE_REMOVE_ALL] = "remove_all",
    [STORE_DROP_FILE] = "drop_file",
    [STORE_UPSERT_START] = "upsert_start",
    [STORE_COUNT_REVOKE] = "put_revoke",
    [STORE_COUNT_OFFLOAD_POLL] = "offload_poll",
    [STORE_COUNT_OFFLOAD_WRITE] = "offload_write",
    [STORE_COUNT_OFFLOAD_LOAD] = "offload_load",
    [STORE_COUNT_OFFLOAD_DELETE] = "offload_delete",
    [STORE_COUNT_OFFLOAD_DROP] = "offload_drop",
    [STORE_COUNT_OFFLOAD_REPORT] = "offload_report",
    [STORE_COUNT_CLEAR] = "batch_replica_clear",
};

typedef struct text {
  char *buf;
  size_t len, cap;
  int failed;
} text;

static void add(text *t, const char *fmt, ...) {
  for (int pass = 0; pass < 2 && !t->failed; pass++) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = 1;
    } else if (t->buf && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    } else {
      size_t cap = (t->cap + (size_t)n + 1) * 2;
      char *grown = realloc(t->buf, cap);
      if (!grown)
        t->failed = 1;
      else
        t->buf = grown, t->cap = cap;
    }
  }
}

static void metric(text *t, const char *name, const char *type, const char *help, uint64_t v) {
  add(t, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
      (unsigned long long)v);
}

char *store_metrics_prometheus(const store_map_stats *s) {
  text t = {0};
  metric(&t, "master_key_count", "gauge", "Objects in the master's map", s->keys);
  metric(&t, "master_allocated_bytes", "gauge", "Bytes of the pool held by replicas",
         s->allocated_bytes);
  metric(&t, "master_total_capacity_bytes", "gauge", "Bytes of the mounted segments",
         s->capacity_bytes);
  metric(&t, "master_mounted_segments", "gauge", "Segments mounted by clients", s->segments);
  metric(&t, "master_active_clients", "gauge", "Clients connected", s->clients);
  metric(&t, "master_serving", "gauge", "1 while this master serves (0: an HA standby)",
         s->serving);
  metric(&t, "master_evicted_key_count", "counter", "Objects evicted since start", s->evicted_keys);
  metric(&t, "master_evicted_size_bytes", "counter", "Bytes evicted since start", s->evicted_bytes);
  for (unsigned op = 0; op < STORE_COUNT_SLOTS; op++) {
    if (!op_names[op])
      continue;
    char name[96];
    snprintf(name, sizeof name, "master_%s_requests_total", op_names[op]);
    metric(&t, name, "counter", "Keys asked (each key of a batch counts)", s->ops[op].requests);
    snprintf(name, sizeof name, "master_%s_failures_total", op_names[op]);
    metric(&t, name, "counter", "Keys whose answer was an error", s->ops[op].failures);
  }
  /* Promotion (--promotion_on_hit) under Mooncake's names: the gets that
   * found a key on disk only, admitted into memory or not. */
  const store_op_count *hits = &s->ops[STORE_COUNT_PROMOTION];
  metric(&t, "master_promotion_admitted_total", "counter",
         "Gets of a key on disk only that kept it in memory", hits->requests - hits->failures);
  metric(&t, "master_promotion_rejected_frequency_total", "counter",
         "Gets of a key on disk only that left it there (below the admission threshold)",
         hits->failures);
  if (t.failed) {
    free(t.buf);
    return NULL;
  }
  return t.buf;
}

static double gib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024 * 1024); }

void store_metrics_summary(const store_map_stats *s, char *out, size_t size) {
  const store_op_count *o = s->ops;
  snprintf(out, size,
           "%llu keys, %.2f GiB of %.2f GiB allocated (%.1f%%) in %llu segments, %llu clients; "
           "puts %llu (%llu failed), gets %llu (%llu failed), removes %llu; evicted %llu keys "
           "(%.2f GiB) since start",
           (unsigned long long)s->keys, gib(s->allocated_bytes), gib(s->capacity_bytes),
           s->capacity_bytes ? 100.0 * (double)s->allocated_bytes / (double)s->capacity_bytes : 0.0,
           (unsigned long long)s->segments, (unsigned long long)s->clients,
           (unsigned long long)(o[STORE_PUT_START].requests + o[STORE_UPSERT_START].requests),
           (unsigned long long)(o[STORE_PUT_START].failures + o[STORE_UPSERT_START].failures),
           (unsigned long long)o[STORE_GET].requests, (unsigned long long)o[STORE_GET].failures,
           (unsigned long long)o[STORE_REMOVE].requests, (unsigned long long)s->evicted_keys,
           gib(s->evicted_bytes));
}
