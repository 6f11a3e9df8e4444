/* test_metrics.c - the statistics API and the /metrics endpoint: counters
 * move by exactly the bytes and entries moved, scraped over HTTP the way
 * Prometheus does, including in the middle of a transfer held at a chosen
 * point by a proxy (tests/support/holdproxy.c), never timed. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"
#include "holdproxy.h"
#include "wire/wire.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define LONG_MS 10000 /* generous: time is not what these tests measure */

static ferry_engine *metrics_engine(unsigned transports) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = transports;
  cfg.metrics_port = 0;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  assert_true(ferry_engine_metrics_port(e) > 0);
  return e;
}

/* GET path on the engine's endpoint; returns the whole response. */
static char *http_get(ferry_engine *e, const char *path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct timeval tv = {LONG_MS / 1000, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ferry_engine_metrics_port(e))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  char req[256];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
  assert_int_equal(send(fd, req, (size_t)n, 0), n);
  size_t len = 0, cap = 1 << 16;
  char *buf = malloc(cap);
  ssize_t got;
  while ((got = recv(fd, buf + len, cap - 1 - len, 0)) > 0) {
    len += (size_t)got;
    if (len == cap - 1)
      buf = realloc(buf, cap *= 2);
  }
  close(fd);
  buf[len] = 0;
  return buf;
}

static char *scrape(ferry_engine *e) {
  char *r = http_get(e, "/metrics");
  assert_non_null(strstr(r, "HTTP/1.1 200 OK\r\n"));
  assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4"));
  return r;
}

/* The value of one series ("name{labels}") in exposition text; 0 when the
 * series is absent (a link appears once it moved something). */
static uint64_t series(const char *text, const char *name) {
  size_t n = strlen(name);
  for (const char *p = text; (p = strstr(p, name)); p += n)
    if ((p == text || p[-1] == '\n') && p[n] == ' ')
      return strtoull(p + n + 1, NULL, 10);
  return 0;
}

static uint64_t link_series(const char *text, const char *metric, const char *op, const char *peer,
                            const char *transport) {
  char name[512];
  if (op)
    snprintf(name, sizeof name, "%s{op=\"%s\",peer=\"%s\",transport=\"%s\"}", metric, op, peer,
             transport);
  else
    snprintf(name, sizeof name, "%s{peer=\"%s\",transport=\"%s\"}", metric, peer, transport);
  return series(text, name);
}

typedef struct pair {
  ferry_engine *target, *initiator;
  uint8_t *remote, *local;
  size_t size;
} pair;

static void pair_start(pair *p, unsigned transports) {
  p->size = 4 * MiB;
  p->target = metrics_engine(transports);
  p->initiator = metrics_engine(transports);
  assert_int_equal(ferry_memory_alloc(p->target, p->size, (void **)&p->remote), FERRY_OK);
  assert_int_equal(ferry_memory_alloc(p->initiator, p->size, (void **)&p->local), FERRY_OK);
}

static void pair_stop(pair *p) {
  ferry_engine_destroy(p->initiator);
  ferry_engine_destroy(p->target);
}

static void test_counters_move_by_bytes_moved(void **state) {
  pair p;
  pair_start(&p, FERRY_TRANSPORT_TCP);
  const char *t = ferry_engine_name(p.target);
  uint64_t remote = (uint64_t)(uintptr_t)p.remote;
  const size_t w1 = MiB + 123, r1 = 64 * KiB + 7;

  assert_int_equal(ferry_transfer_sync(p.initiator, t, FERRY_OP_WRITE, p.local, remote, w1),
                   FERRY_OK);
  char *s1 = scrape(p.initiator), *ts1 = scrape(p.target);
  assert_int_equal(link_series(s1, "ferry_bytes_total", "write", t, "tcp"), w1);
  assert_int_equal(link_series(s1, "ferry_operations_total", "write", t, "tcp"), 1);
  assert_int_equal(series(ts1, "ferry_served_bytes_total{op=\"write\",transport=\"tcp\"}"), w1);
  assert_int_equal(series(ts1, "ferry_registered_bytes"), p.size);
  assert_int_equal(series(ts1, "ferry_registered_regions"), 1);

  /* A READ and a batch of three WRITEs: each counter moves by its share. */
  assert_int_equal(ferry_transfer_sync(p.initiator, t, FERRY_OP_READ, p.local, remote, r1),
                   FERRY_OK);
  ferry_entry three[3];
  for (int i = 0; i < 3; i++)
    three[i] = (ferry_entry){FERRY_OP_WRITE, p.local + i * 4096, remote + i * 4096, 4096 - i};
  assert_int_equal(ferry_transfer_sync_batch(p.initiator, t, three, 3, NULL), FERRY_OK);
  char *s2 = scrape(p.initiator), *ts2 = scrape(p.target);
  uint64_t batch_bytes = 4096 + 4095 + 4094;
  assert_int_equal(link_series(s2, "ferry_bytes_total", "write", t, "tcp"), w1 + batch_bytes);
  assert_int_equal(link_series(s2, "ferry_bytes_total", "read", t, "tcp"), r1);
  assert_int_equal(link_series(s2, "ferry_operations_total", "write", t, "tcp"), 4);
  assert_int_equal(link_series(s2, "ferry_operations_total", "read", t, "tcp"), 1);
  assert_int_equal(series(ts2, "ferry_served_bytes_total{op=\"read\",transport=\"tcp\"}"), r1);
  assert_int_equal(series(ts2, "ferry_served_bytes_total{op=\"write\",transport=\"tcp\"}"),
                   w1 + batch_bytes);
  assert_int_equal(series(s2, "ferry_sync_transfer_duration_seconds_count"), 3);
  assert_int_equal(series(s2, "ferry_sync_transfer_duration_seconds_bucket{le=\"+Inf\"}"), 3);
  assert_true(link_series(s2, "ferry_connections_opened_total", NULL, t, "tcp") >= 1);
  /* The target sees each data connection the initiator opened. */
  assert_int_equal(series(ts2, "ferry_connections_accepted_total{transport=\"tcp\"}"),
                   link_series(s2, "ferry_connections_opened_total", NULL, t, "tcp"));
  assert_true(series(s2, "ferry_control_connections_opened_total") >= 1);
  assert_int_equal(series(s2, "ferry_errors_total{code=\"ENOTREG\"}"), 0);

  /* A refused call is an error by its code, and moves no byte. */
  assert_int_equal(
      ferry_transfer_sync(p.initiator, t, FERRY_OP_WRITE, p.local, remote + p.size, 4096),
      FERRY_ENOTREG);
  char *s3 = scrape(p.initiator);
  assert_int_equal(series(s3, "ferry_errors_total{code=\"ENOTREG\"}"), 1);
  assert_int_equal(link_series(s3, "ferry_bytes_total", "write", t, "tcp"), w1 + batch_bytes);

  /* The C snapshot says the same as the text. */
  ferry_stats *st;
  assert_int_equal(ferry_stats_snapshot(p.initiator, &st), FERRY_OK);
  assert_int_equal(st->link_count, 1);
  assert_string_equal(st->links[0].peer, t);
  assert_string_equal(st->links[0].transport, "tcp");
  assert_int_equal(st->links[0].bytes[FERRY_OP_WRITE], w1 + batch_bytes);
  assert_int_equal(st->links[0].bytes[FERRY_OP_READ], r1);
  assert_int_equal(st->errors[-FERRY_ENOTREG], 1);
  assert_int_equal(st->latency_count, 3);
  ferry_stats_free(st);
  free(s1), free(ts1), free(s2), free(ts2), free(s3);
  pair_stop(&p);
}

/* A WRITE whose ack the proxy holds: the target has the bytes, the
 * initiator has not counted them yet and shows the batch in flight. */
static void test_scrape_during_a_transfer(void **state) {
  pair p;
  pair_start(&p, FERRY_TRANSPORT_TCP);
  hold_proxy *proxy = hold_proxy_start(ferry_engine_port(p.target));
  const char *via = hold_proxy_target(proxy);
  const size_t len = 256 * KiB + 5; /* one frame */
  hold_proxy_hold(proxy, FERRY_FRAME_WRITE_ACK);
  ferry_entry en = {FERRY_OP_WRITE, p.local, (uint64_t)(uintptr_t)p.remote, len};
  ferry_batch *b;
  assert_int_equal(ferry_batch_submit(p.initiator, via, &en, 1, NULL, &b), FERRY_OK);
  assert_int_equal(hold_proxy_wait_held(proxy, 1, LONG_MS), 0);

  char *during = scrape(p.initiator), *target_during = scrape(p.target);
  assert_int_equal(series(during, "ferry_batches_in_flight"), 1);
  assert_int_equal(link_series(during, "ferry_operations_total", "write", via, "tcp"), 1);
  assert_int_equal(link_series(during, "ferry_bytes_total", "write", via, "tcp"), 0);
  assert_int_equal(
      series(target_during, "ferry_served_bytes_total{op=\"write\",transport=\"tcp\"}"), len);

  hold_proxy_release(proxy);
  assert_int_equal(ferry_batch_wait(b, -1), FERRY_OK);
  ferry_batch_free(b);
  char *after = scrape(p.initiator);
  assert_int_equal(series(after, "ferry_batches_in_flight"), 0);
  assert_int_equal(link_series(after, "ferry_bytes_total", "write", via, "tcp"), len);
  free(during), free(target_during), free(after);
  pair_stop(&p);
  hold_proxy_stop(proxy);
}

/* The transport label is the transport's own name. */
static void test_shm_link_is_labelled_shm(void **state) {
  pair p;
  pair_start(&p, FERRY_TRANSPORT_TCP | FERRY_TRANSPORT_SHM);
  const char *t = ferry_engine_name(p.target);
  unsigned used = 0;
  assert_int_equal(ferry_peer_transport(p.initiator, t, &used), FERRY_OK);
  if (used != FERRY_TRANSPORT_SHM) {
    pair_stop(&p);
    skip(); /* shm unusable here (no memfd or SO_PEERCRED): nothing to label */
  }
  const size_t len = 3 * MiB + 1;
  assert_int_equal(ferry_transfer_sync(p.initiator, t, FERRY_OP_WRITE, p.local,
                                       (uint64_t)(uintptr_t)p.remote, len),
                   FERRY_OK);
  char *s = scrape(p.initiator), *ts = scrape(p.target);
  assert_int_equal(link_series(s, "ferry_bytes_total", "write", t, "shm"), len);
  assert_int_equal(link_series(s, "ferry_bytes_total", "write", t, "tcp"), 0);
  /* One-sided: the target served no byte, but saw the link. */
  assert_int_equal(series(ts, "ferry_served_bytes_total{op=\"write\",transport=\"tcp\"}"), 0);
  assert_int_equal(series(ts, "ferry_connections_accepted_total{transport=\"shm\"}"), 1);
  free(s);
  free(ts);
  pair_stop(&p);
}

static void test_endpoint_answers_only_metrics(void **state) {
  ferry_engine *e = metrics_engine(FERRY_TRANSPORT_TCP);
  char *r = http_get(e, "/");
  assert_non_null(strstr(r, "HTTP/1.1 404 Not Found\r\n"));
  free(r);
  r = http_get(e, "/metricsX");
  assert_non_null(strstr(r, "HTTP/1.1 404 Not Found\r\n"));
  free(r);
  r = scrape(e);
  assert_non_null(strstr(r, "# TYPE ferry_bytes_total counter\n"));
  assert_non_null(strstr(r, "# TYPE ferry_sync_transfer_duration_seconds histogram\n"));
  free(r);
  ferry_engine_destroy(e);
}

/* A client that connects and sends nothing does not hold up a scrape or
 * shutdown, nor does one that stalls mid-request. */
static void test_silent_client_does_not_hold_the_endpoint(void **state) {
  ferry_engine *e = metrics_engine(FERRY_TRANSPORT_TCP);
  int silent = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ferry_engine_metrics_port(e))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(silent, (struct sockaddr *)&a, sizeof a), 0);
  free(scrape(e)); /* answered once the silent one is dropped */
  int second = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(connect(second, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(send(second, "GET /metr", 9, 0), 9); /* and stalls mid-request */
  double t0 = test_now_s();
  ferry_engine_destroy(e);
  assert_true(test_now_s() - t0 < 1.5); /* the stop pipe, not the 2 s drop */
  close(silent);
  close(second);
}

static int connect_metrics(ferry_engine *e) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ferry_engine_metrics_port(e))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

/* Still open, and nothing sent to it: the endpoint has not dropped it. */
static int open_and_silent(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

/* Silent clients, more than the endpoint keeps open at once (32), each
 * allowed 2 s: a scrape is answered at once all the same, while the
 * newest of them are still open and silent (the oldest made room). The
 * one-client-at-a-time endpoint answered it after 2 s per silent client
 * before it (here 80 s): the scrape's 10 s receive timeout ran out. */
static void test_silent_clients_do_not_delay_a_scrape(void **state) {
  enum { SILENT = 40 };
  ferry_engine *e = metrics_engine(FERRY_TRANSPORT_TCP);
  int silent[SILENT];
  double t0 = test_now_s();
  for (int i = 0; i < SILENT; i++)
    silent[i] = connect_metrics(e);
  free(scrape(e));
  double took = test_now_s() - t0;
  int open = 0;
  for (int i = 0; i < SILENT; i++)
    open += open_and_silent(silent[i]);
  print_message("scrape answered %.3f s after %d silent clients connected; %d still open\n", took,
                SILENT, open);
  assert_true(took < 8); /* generous: the scrape waits for no one */
  if (took < 1.5)        /* none of them can have used up its 2 s yet */
    assert_true(open_and_silent(silent[SILENT - 1]) && open >= 31);
  for (int i = 0; i < SILENT; i++)
    close(silent[i]);
  ferry_engine_destroy(e);
}

/* A second engine given a port already taken runs, without the endpoint. */
static void test_taken_port_leaves_the_engine_running(void **state) {
  ferry_engine *first = metrics_engine(FERRY_TRANSPORT_TCP);
  ferry_config cfg;
  test_config(&cfg);
  cfg.metrics_port = ferry_engine_metrics_port(first);
  ferry_engine *second = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &second), FERRY_OK);
  assert_int_equal(ferry_engine_metrics_port(second), 0);
  free(scrape(first));
  ferry_engine_destroy(second);
  ferry_engine_destroy(first);
}

/* Off unless asked; a bad setting is refused, naming it. */
static void test_metrics_settings(void **state) {
  ferry_engine *e = test_engine(NULL);
  assert_non_null(e);
  assert_int_equal(ferry_engine_metrics_port(e), 0);
  ferry_engine_destroy(e);

  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = "127.0.0.1";
  cfg.metrics_port = 70000;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "metrics_port"));

  setenv("FERRY_METRICS_PORT", "abc", 1);
  ferry_config_init(&cfg);
  cfg.bind_host = "127.0.0.1";
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "FERRY_METRICS_PORT=\"abc\""));
  unsetenv("FERRY_METRICS_PORT");

  setenv("MC_TE_METRIC", "maybe", 1);
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "MC_TE_METRIC=\"maybe\""));
  unsetenv("MC_TE_METRIC");
}

/* MC_TE_METRIC and its interval, as Mooncake spells them. */
static void test_te_metric_env(void **state) {
  ferry_config cfg;
  setenv("MC_TE_METRIC", "1", 1);
  ferry_config_init(&cfg);
  assert_int_equal(cfg.metrics_log_s, 5);
  setenv("MC_TE_METRIC_INTERVAL_SECONDS", "2", 1);
  ferry_config_init(&cfg);
  assert_int_equal(cfg.metrics_log_s, 2);
  unsetenv("MC_TE_METRIC");
  ferry_config_init(&cfg);
  assert_int_equal(cfg.metrics_log_s, 0); /* the interval alone turns nothing on */
  unsetenv("MC_TE_METRIC_INTERVAL_SECONDS");
}

/* Reads stderr's pipe until a line holding `want` arrives (LONG_MS at most). */
static int wait_for_log(int fd, const char *want, char *line, size_t size) {
  double until = test_now_s() + LONG_MS / 1000.0;
  while (test_now_s() < until)
    if (test_read_line(fd, line, size, LONG_MS) == 0 && strstr(line, want))
      return 0;
  return -1;
}

static ferry_engine *logging_engine(unsigned seconds) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_TCP;
  cfg.metrics_log_s = seconds;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  return e;
}

/* The throughput line appears in the log; shutdown wakes the sleeping
 * thread instead of waiting out its interval. */
static void test_throughput_line_in_the_log(void **state) {
  int fds[2], saved = dup(STDERR_FILENO);
  assert_int_equal(pipe(fds), 0);
  dup2(fds[1], STDERR_FILENO);
  ferry_engine *e = logging_engine(1), *sleeper = logging_engine(3600);
  char want[128], line[1024];
  snprintf(want, sizeof want, "metrics %s: write ", ferry_engine_name(e));
  int found = wait_for_log(fds[0], want, line, sizeof line);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(fds[1]);
  close(fds[0]);
  assert_int_equal(found, 0);
  assert_non_null(strstr(line, "GB/s"));
  double t0 = test_now_s();
  ferry_engine_destroy(sleeper);
  assert_true(test_now_s() - t0 < 60); /* not the 3600 s interval */
  ferry_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counters_move_by_bytes_moved),
      cmocka_unit_test(test_scrape_during_a_transfer),
      cmocka_unit_test(test_shm_link_is_labelled_shm),
      cmocka_unit_test(test_endpoint_answers_only_metrics),
      cmocka_unit_test(test_silent_client_does_not_hold_the_endpoint),
      cmocka_unit_test(test_silent_clients_do_not_delay_a_scrape),
      cmocka_unit_test(test_taken_port_leaves_the_engine_running),
      cmocka_unit_test(test_metrics_settings),
      cmocka_unit_test(test_te_metric_env),
      cmocka_unit_test(test_throughput_line_in_the_log),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
