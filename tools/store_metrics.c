/* store_metrics.c - the store master's /metrics endpoint (store_metrics.h),
 * on libmicrohttpd as the metadata server is: the tool links it already,
 * and its own thread answers scrapes without touching the master's. */
#include "store_metrics.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "store/metrics.h"

#define PROG "store-master"

struct store_metrics_server {
  struct MHD_Daemon *daemon;
  store_stats_fn stats;
  void *arg;
  unsigned port;
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, char *body,
                             enum MHD_ResponseMemoryMode mode) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, mode);
  if (!r)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  enum MHD_Result ok = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **state) {
  (void)version, (void)upload_data, (void)upload_size, (void)state;
  store_metrics_server *s = cls;
  int metrics = !strcmp(url, "/metrics"), summary = !strcmp(url, "/metrics/summary");
  if (strcmp(method, "GET") || (!metrics && !summary))
    return reply(conn, MHD_HTTP_NOT_FOUND, "only GET /metrics and /metrics/summary are served\n",
                 MHD_RESPMEM_PERSISTENT);
  store_map_stats stats;
  s->stats(s->arg, &stats);
  if (summary) {
    char line[512];
    store_metrics_summary(&stats, line, sizeof line - 1);
    strcat(line, "\n");
    return reply(conn, MHD_HTTP_OK, line, MHD_RESPMEM_MUST_COPY);
  }
  char *text = store_metrics_prometheus(&stats);
  if (!text)
    return reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory\n", MHD_RESPMEM_PERSISTENT);
  return reply(conn, MHD_HTTP_OK, text, MHD_RESPMEM_MUST_FREE);
}

store_metrics_server *store_metrics_start(const char *host, unsigned port, store_stats_fn stats,
                                          void *arg) {
  struct sockaddr_storage ss;
  if (ferry_cli_resolve(PROG, host, port, &ss) != 0)
    return NULL;
  store_metrics_server *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->stats = stats;
  s->arg = arg;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (ss.ss_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  s->daemon =
      MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
                       (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_TIMEOUT, 5u, MHD_OPTION_END);
  if (!s->daemon) {
    fprintf(stderr, PROG ": --metrics_port=%u: cannot listen on %s:%u (in use?)\n", port, host,
            port);
    free(s);
    return NULL;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = info ? info->port : port;
  return s;
}

unsigned store_metrics_port(const store_metrics_server *s) { return s->port; }

void store_metrics_stop(store_metrics_server *s) {
  if (!s)
    return;
  MHD_stop_daemon(s->daemon);
  free(s);
}
