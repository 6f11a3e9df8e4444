/* stats.c - turning the engine's counters (core/counters.h) into a
 * ferry_stats snapshot or Prometheus' text format.
 *
 * Counters are relaxed atomics: a snapshot taken during traffic is a set of
 * recent values, each exact, not one instant; that is all a rate needs. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "core/counters.h"
#include "core/engine.h"
#include "core/peer.h"
#include "core/pool.h"
#include "core/transport.h"

#define GET(counter) __atomic_load_n(&(counter), __ATOMIC_RELAXED)

static const char *const op_names[] = {"read", "write"}; /* by ferry_op */

static const char *const code_names[] = {
    "OK",        "EINVAL",     "ENOTREG",  "EOVERLAP",    "ENOMEM",    "ESOCKET",
    "EDNS",      "EHANDSHAKE", "EVERSION", "EAUTH",       "ETIMEDOUT", "EPROTO",
    "EMETADATA", "EJSON",      "ENOTIMPL", "EBUSY",       "ECHECKSUM", "ETRANSPORT",
    "ECLOSED",   "ENOTFOUND",  "EREMOTE",  "EINPROGRESS", "EFAULT"};

/* Name of a code for labels: "ETIMEDOUT"; NULL for a number no code has. */
static const char *code_name(int code) {
  size_t i = (size_t)-code;
  return code <= 0 && i < sizeof code_names / sizeof *code_names ? code_names[i] : NULL;
}

/* ---- snapshot ---------------------------------------------------------------------------- */

static int link_used(const ferry_link_counters *c) {
  return c->bytes[0] || c->bytes[1] || c->ops[0] || c->ops[1] || c->connections_opened;
}

static const char *transport_name_of_slot(size_t slot) {
  for (size_t i = 0; ferry_transports[i]; i++)
    if ((size_t)__builtin_ctz(ferry_transports[i]->id) % FERRY_STATS_TRANSPORTS == slot)
      return ferry_transports[i]->name;
  return "none";
}

/* Appends the used links of one peer; 0 or -1 when out of memory. */
static int add_peer_links(ferry_stats *s, size_t *cap, ferry_peer *p) {
  s->control_connections_opened += GET(p->stats.control_opened);
  for (size_t slot = 0; slot < FERRY_STATS_TRANSPORTS; slot++) {
    ferry_link_counters c;
    for (int op = 0; op < 2; op++) {
      c.bytes[op] = GET(p->stats.link[slot].bytes[op]);
      c.ops[op] = GET(p->stats.link[slot].ops[op]);
    }
    c.connections_opened = GET(p->stats.link[slot].connections_opened);
    if (!link_used(&c))
      continue;
    if (s->link_count == *cap) {
      size_t n = *cap ? *cap * 2 : 8;
      ferry_stats_link *grown = realloc(s->links, n * sizeof *grown);
      if (!grown)
        return -1;
      s->links = grown, *cap = n;
    }
    ferry_stats_link *l = &s->links[s->link_count];
    l->peer = strdup(p->address);
    if (!l->peer)
      return -1;
    l->transport = transport_name_of_slot(slot);
    memcpy(l->bytes, c.bytes, sizeof c.bytes);
    memcpy(l->ops, c.ops, sizeof c.ops);
    l->connections_opened = c.connections_opened;
    s->link_count++;
  }
  return 0;
}

/* Appends the rails of one peer with several; 0 or -1 when out of memory. */
static int add_peer_rails(ferry_stats *s, ferry_peer *p) {
  pthread_mutex_lock(&p->lock);
  unsigned n = p->rail_count >= 2 ? p->rail_count : 0;
  ferry_stats_rail *grown = n ? realloc(s->rails, (s->rail_count + n) * sizeof *grown) : s->rails;
  int failed = n && !grown;
  if (!failed)
    s->rails = grown;
  for (unsigned r = 0; r < n && !failed; r++) {
    ferry_stats_rail *out = &s->rails[s->rail_count];
    const ferry_peer_rail *rail = &p->rails[r];
    out->peer = strdup(p->address);
    out->rail = strdup(rail->label); /* names the transport when the peer has several */
    failed = !out->peer || !out->rail;
    out->bytes[0] = GET(rail->bytes[0]);
    out->bytes[1] = GET(rail->bytes[1]);
    out->failures = GET(rail->failures);
    out->up = rail->down_until_ns == 0; /* reset when a channel over it opens */
    s->rail_count++;
  }
  pthread_mutex_unlock(&p->lock);
  return failed ? -1 : 0;
}

static void read_gauges(ferry_engine *e, ferry_stats *s) {
  ferry_region *regions = NULL;
  size_t n = ferry_registry_snapshot(e->registry, &regions);
  s->registered_regions = n;
  for (size_t i = 0; i < n; i++)
    s->registered_bytes += regions[i].length;
  free(regions);
  pthread_mutex_lock(&e->notify_lock);
  s->notifications_queued = e->notify_count;
  pthread_mutex_unlock(&e->notify_lock);
  ferry_pools_stats(e, s);
}

static void read_engine_counters(ferry_engine *e, ferry_stats *s) {
  for (int i = 0; i < FERRY_STATS_CODES; i++)
    s->errors[i] = GET(e->stats.errors[i]);
  s->batches_in_flight = GET(e->stats.batches_in_flight);
  for (int i = 0; i < FERRY_STATS_LATENCY_BUCKETS; i++) {
    s->latency_le[i] = ferry_stats_latency_le[i];
    s->latency_buckets[i] = GET(e->stats.latency[i]);
  }
  s->latency_sum_seconds = (double)GET(e->stats.latency_sum_ns) / 1e9;
  s->latency_count = GET(e->stats.latency_count);
  for (int op = 0; op < 2; op++) {
    s->served_bytes[op] = GET(e->stats.served_bytes[op]);
    s->served_requests[op] = GET(e->stats.served_requests[op]);
    s->staged_bytes[op] = GET(e->stats.staged_bytes[op]);
  }
  for (int slot = 0; slot < FERRY_STATS_TRANSPORTS; slot++)
    s->connections_accepted[slot] = GET(e->stats.accepted[slot]);
}

static ferry_status stats_snapshot(ferry_engine *e, ferry_stats **out) {
  if (!e || !out)
    return ferry_fail(FERRY_EINVAL, "stats snapshot: null engine or out");
  ferry_stats *s = calloc(1, sizeof *s);
  if (!s)
    return ferry_fail(FERRY_ENOMEM, "no memory for a stats snapshot");
  read_engine_counters(e, s);
  read_gauges(e, s);
  size_t cap = 0;
  int failed = 0;
  pthread_mutex_lock(&e->peers_lock);
  for (ferry_peer *p = e->peers; p && !failed; p = p->next)
    failed = add_peer_links(s, &cap, p) || add_peer_rails(s, p);
  pthread_mutex_unlock(&e->peers_lock);
  if (failed) {
    ferry_stats_free(s);
    return ferry_fail(FERRY_ENOMEM, "no memory for the peers of a stats snapshot");
  }
  *out = s;
  return FERRY_OK;
}

ferry_status ferry_stats_snapshot(ferry_engine *e, ferry_stats **out) {
  FERRY_GATED(e, stats_snapshot(e, out));
}

void ferry_stats_free(ferry_stats *s) {
  if (!s)
    return;
  for (size_t i = 0; i < s->link_count; i++)
    free((char *)s->links[i].peer);
  free(s->links);
  for (size_t i = 0; i < s->rail_count; i++) {
    free((char *)s->rails[i].peer);
    free((char *)s->rails[i].rail);
  }
  free(s->rails);
  free(s);
}

/* ---- Prometheus text ---------------------------------------------------------------------- */

/* A label value with \, " and newlines escaped, as the format requires. */
static void put_label(FILE *f, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"')
      fputc('\\', f), fputc(*v, f);
    else if (*v == '\n')
      fputs("\\n", f);
    else
      fputc(*v, f);
  }
}

static void put_head(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_link_metric(FILE *f, const ferry_stats *s, const char *name, int by_op,
                            size_t field) {
  for (size_t i = 0; i < s->link_count; i++) {
    const ferry_stats_link *l = &s->links[i];
    for (int op = 0; op < (by_op ? 2 : 1); op++) {
      const uint64_t *v = (const uint64_t *)((const char *)l + field);
      fprintf(f, "%s{", name);
      if (by_op)
        fprintf(f, "op=\"%s\",", op_names[op]);
      fputs("peer=\"", f);
      put_label(f, l->peer);
      fprintf(f, "\",transport=\"%s\"} %llu\n", l->transport, (unsigned long long)v[op]);
    }
  }
}

static void put_gauge(FILE *f, const char *name, const char *help, uint64_t v) {
  put_head(f, name, "gauge", help);
  fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

static void put_histogram(FILE *f, const ferry_stats *s) {
  const char *name = "ferry_sync_transfer_duration_seconds";
  put_head(f, name, "histogram", "Synchronous transfer calls, submit to return.");
  uint64_t cumulative = 0;
  for (int i = 0; i < FERRY_STATS_LATENCY_BUCKETS; i++) {
    cumulative += s->latency_buckets[i];
    if (isinf(s->latency_le[i]))
      fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cumulative);
    else
      fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, s->latency_le[i],
              (unsigned long long)cumulative);
  }
  fprintf(f, "%s_sum %.9f\n%s_count %llu\n", name, s->latency_sum_seconds, name,
          (unsigned long long)s->latency_count);
}

/* As a target: what it served over tcp, and what it can see of the
 * one-sided transports, whose bytes only their initiators count. */
static void put_served(FILE *f, const ferry_stats *s) {
  put_head(f, "ferry_served_bytes_total", "counter",
           "Bytes served to peers over tcp, as target; shm and fabric transfers are one-sided, "
           "counted only by their initiators (ferry_bytes_total there).");
  for (int op = 0; op < 2; op++)
    fprintf(f, "ferry_served_bytes_total{op=\"%s\",transport=\"%s\"} %llu\n", op_names[op],
            ferry_transport_tcp.name, (unsigned long long)s->served_bytes[op]);
  put_head(f, "ferry_served_requests_total", "counter", "Requests served over tcp, as target.");
  for (int op = 0; op < 2; op++)
    fprintf(f, "ferry_served_requests_total{op=\"%s\",transport=\"%s\"} %llu\n", op_names[op],
            ferry_transport_tcp.name, (unsigned long long)s->served_requests[op]);
  put_head(f, "ferry_connections_accepted_total", "counter",
           "Peers' connections accepted as target, by transport: tcp data connections, shm "
           "links; fabric initiators open nothing the target sees.");
  for (size_t i = 0; ferry_transports[i]; i++) {
    unsigned slot = (unsigned)__builtin_ctz(ferry_transports[i]->id) % FERRY_STATS_TRANSPORTS;
    fprintf(f, "ferry_connections_accepted_total{transport=\"%s\"} %llu\n",
            ferry_transports[i]->name, (unsigned long long)s->connections_accepted[slot]);
  }
  put_head(f, "ferry_staged_bytes_total", "counter",
           "Bytes moved through the staging pipeline's bounce buffers.");
  for (int op = 0; op < 2; op++)
    fprintf(f, "ferry_staged_bytes_total{op=\"%s\"} %llu\n", op_names[op],
            (unsigned long long)s->staged_bytes[op]);
}

static void put_errors(FILE *f, const ferry_stats *s) {
  put_head(f, "ferry_errors_total", "counter", "Errors returned, by ferry_status code.");
  for (int i = 1; i < FERRY_STATS_CODES; i++) {
    if (code_name(-i))
      fprintf(f, "ferry_errors_total{code=\"%s\"} %llu\n", code_name(-i),
              (unsigned long long)s->errors[i]);
    else if (s->errors[i]) /* a code newer than the table: its number */
      fprintf(f, "ferry_errors_total{code=\"%d\"} %llu\n", -i, (unsigned long long)s->errors[i]);
  }
}

static void put_rail_labels(FILE *f, const ferry_stats_rail *r) {
  fputs("peer=\"", f);
  put_label(f, r->peer);
  fputs("\",rail=\"", f);
  put_label(f, r->rail);
  fputs("\"}", f);
}

/* Only for peers with several rails: nothing at all without. */
static void put_rails(FILE *f, const ferry_stats *s) {
  if (!s->rail_count)
    return;
  put_head(f, "ferry_rail_bytes_total", "counter", "Bytes moved and acknowledged on one rail.");
  for (size_t i = 0; i < s->rail_count; i++)
    for (int op = 0; op < 2; op++) {
      fprintf(f, "ferry_rail_bytes_total{op=\"%s\",", op_names[op]);
      put_rail_labels(f, &s->rails[i]);
      fprintf(f, " %llu\n", (unsigned long long)s->rails[i].bytes[op]);
    }
  put_head(f, "ferry_rail_failures_total", "counter", "Times a rail's link failed.");
  for (size_t i = 0; i < s->rail_count; i++) {
    fputs("ferry_rail_failures_total{", f);
    put_rail_labels(f, &s->rails[i]);
    fprintf(f, " %llu\n", (unsigned long long)s->rails[i].failures);
  }
  put_head(f, "ferry_rail_up", "gauge",
           "1 when the rail is in use, 0 from its failure until a connection over it works again.");
  for (size_t i = 0; i < s->rail_count; i++) {
    fputs("ferry_rail_up{", f);
    put_rail_labels(f, &s->rails[i]);
    fprintf(f, " %d\n", s->rails[i].up);
  }
}

static void put_all(FILE *f, const ferry_stats *s) {
  put_head(f, "ferry_bytes_total", "counter", "Bytes moved and acknowledged.");
  put_link_metric(f, s, "ferry_bytes_total", 1, offsetof(ferry_stats_link, bytes));
  put_head(f, "ferry_operations_total", "counter", "Transfer entries submitted.");
  put_link_metric(f, s, "ferry_operations_total", 1, offsetof(ferry_stats_link, ops));
  put_head(f, "ferry_connections_opened_total", "counter", "Data connections opened.");
  put_link_metric(f, s, "ferry_connections_opened_total", 0,
                  offsetof(ferry_stats_link, connections_opened));
  put_head(f, "ferry_control_connections_opened_total", "counter",
           "Control connections opened, all peers.");
  fprintf(f, "ferry_control_connections_opened_total %llu\n",
          (unsigned long long)s->control_connections_opened);
  put_rails(f, s);
  put_served(f, s);
  put_errors(f, s);
  put_gauge(f, "ferry_batches_in_flight", "Batches submitted and not final.", s->batches_in_flight);
  put_gauge(f, "ferry_registered_bytes", "Bytes of registered memory.", s->registered_bytes);
  put_gauge(f, "ferry_registered_regions", "Registered regions.", s->registered_regions);
  put_gauge(f, "ferry_notifications_queued", "Notifications received and not drained.",
            s->notifications_queued);
  put_gauge(f, "ferry_pool_senders_waiting", "Grant requests waiting for room in a full pool.",
            s->pool_senders_waiting);
  put_gauge(f, "ferry_pool_bytes_granted",
            "Bytes of pool slots granted to senders, their message not landed yet.",
            s->pool_bytes_granted);
  put_head(f, "ferry_pool_messages_landed_total", "counter",
           "Messages landed in this engine's pools.");
  fprintf(f, "ferry_pool_messages_landed_total{notice=\"inband\"} %llu\n",
          (unsigned long long)s->pool_landed_inband);
  fprintf(f, "ferry_pool_messages_landed_total{notice=\"control\"} %llu\n",
          (unsigned long long)(s->pool_messages_landed - s->pool_landed_inband));
  put_histogram(f, s);
}

ferry_status ferry_stats_prometheus(const ferry_stats *s, char **text) {
  if (!s || !text)
    return ferry_fail(FERRY_EINVAL, "stats text: null stats or text");
  size_t len;
  FILE *f = open_memstream(text, &len);
  if (!f)
    return ferry_fail(FERRY_ENOMEM, "no memory for the stats text");
  put_all(f, s);
  if (fclose(f) != 0) {
    free(*text);
    *text = NULL;
    return ferry_fail(FERRY_ENOMEM, "no memory for the stats text");
  }
  return FERRY_OK;
}
