/* test_metadata_http.c - the http metadata backend and segment descriptors
 * against a real `ferry metadata-server` child process.
 *
 * The group setup starts "$FERRY_TOOL metadata-server --port 0" and reads its
 * ready line to learn the URL; the group teardown always stops it (SIGTERM,
 * then SIGKILL if it hangs) and checks it exited 0. Only 127.0.0.1 is used. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "harness.h"
#include "metadata/metadata.h"

static pid_t server_pid = -1;
static char server_url[256];

/* ---- the server child ----------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads one line from fd within timeout_ms; 0 on success. */
static int read_line(int fd, char *buf, size_t size, int timeout_ms) {
  size_t n = 0;
  double deadline = now_s() + timeout_ms / 1000.0;
  while (n + 1 < size) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int left = (int)((deadline - now_s()) * 1000);
    if (left <= 0 || poll(&p, 1, left) <= 0)
      return -1;
    ssize_t r = read(fd, buf + n, 1);
    if (r <= 0)
      return -1;
    if (buf[n] == '\n') {
      buf[n] = '\0';
      return 0;
    }
    n++;
  }
  return -1;
}

/* state: the --state FILE, or NULL. */
static pid_t spawn_server(int out_fd, const char *state) {
  const char *tool = getenv("FERRY_TOOL");
  if (!tool)
    tool = "ferry";
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a crashed test */
    dup2(out_fd, STDOUT_FILENO);
    if (state)
      execl(tool, tool, "metadata-server", "--host", "127.0.0.1", "--port", "0", "--state", state,
            (char *)NULL);
    else
      execl(tool, tool, "metadata-server", "--host", "127.0.0.1", "--port", "0", (char *)NULL);
    static const char failed[] = "test_metadata_http: cannot run $FERRY_TOOL\n";
    ssize_t unused = write(STDERR_FILENO, failed, sizeof failed - 1); /* async-signal-safe */
    (void)unused;
    _exit(127);
  }
  return pid;
}

/* SIGTERM, wait up to TEST_SETUP_MS, then SIGKILL. Returns the exit status or -1. */
static int stop_server(void) {
  if (server_pid <= 0)
    return -1;
  kill(server_pid, SIGTERM);
  int status = 0;
  double deadline = now_s() + TEST_SETUP_MS / 1000.0;
  pid_t r;
  while ((r = waitpid(server_pid, &status, WNOHANG)) == 0 && now_s() < deadline)
    usleep(10000);
  if (r == 0) {
    kill(server_pid, SIGKILL);
    waitpid(server_pid, &status, 0);
    status = -1;
  }
  server_pid = -1;
  return status;
}

/* Starts a server and reads its URL from the ready line. 0, or -1 with
 * the child (if any) left in *pid for the caller to reap. */
static int start_server(const char *state, pid_t *pid, char *url_out, size_t size) {
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  *pid = spawn_server(fds[1], state);
  close(fds[1]);
  char line[512];
  int rc = *pid > 0 ? read_line(fds[0], line, sizeof line, TEST_SETUP_MS) : -1;
  close(fds[0]);
  const char *url = rc == 0 ? strstr(line, "url=") : NULL;
  if (!url || strncmp(line, "ready metadata-server ", 22) != 0)
    return -1;
  snprintf(url_out, size, "%s", url + 4);
  return 0;
}

static int group_setup(void **state) {
  if (start_server(NULL, &server_pid, server_url, sizeof server_url) != 0) {
    fprintf(stderr, "metadata-server did not report ready\n");
    stop_server();
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  int status = stop_server();
  if (!(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    fprintf(stderr, "metadata-server did not exit cleanly (status %d)\n", status);
    return -1;
  }
  return 0;
}

static ferry_metadata *open_store(void) {
  ferry_metadata *md = NULL;
  assert_int_equal(ferry_metadata_open(server_url, &md), FERRY_OK);
  assert_non_null(md);
  return md;
}

/* ---- raw keys ------------------------------------------------------------- */

static void test_put_get_round_trip(void **state) {
  ferry_metadata *md = open_store();
  char *v = NULL;
  assert_int_equal(ferry_metadata_put(md, "rt/key", "{\"a\":1}"), FERRY_OK);
  assert_int_equal(ferry_metadata_get(md, "rt/key", &v), FERRY_OK);
  assert_string_equal(v, "{\"a\":1}");
  free(v);
  assert_int_equal(ferry_metadata_put(md, "rt/key", "second"), FERRY_OK);
  assert_int_equal(ferry_metadata_get(md, "rt/key", &v), FERRY_OK);
  assert_string_equal(v, "second");
  free(v);
  assert_int_equal(ferry_metadata_delete(md, "rt/key"), FERRY_OK);
  assert_int_equal(ferry_metadata_get(md, "rt/key", &v), FERRY_ENOTFOUND);
  assert_null(v);
  assert_non_null(strstr(ferry_last_error(), "rt/key"));
  assert_int_equal(ferry_metadata_delete(md, "rt/key"), FERRY_ENOTFOUND);
  ferry_metadata_close(md);
}

static void test_missing_key(void **state) {
  ferry_metadata *md = open_store();
  char *v = NULL;
  assert_int_equal(ferry_metadata_get(md, "never/put", &v), FERRY_ENOTFOUND);
  assert_int_equal(ferry_metadata_put(md, "", "x"), FERRY_EINVAL);
  ferry_metadata_close(md);
}

static void test_escaped_keys(void **state) {
  static const char *const keys[] = {
      "mooncake/ram/host:1234",
      "with space",
      "a&b",
      "a=b",
      "a&key=evil",
      "a",
      "100%",
      "plus+sign",
      "q?x=1#frag",
      "ünïcode",
  };
  size_t n = sizeof keys / sizeof keys[0];
  ferry_metadata *md = open_store();
  char value[64], *v = NULL;
  for (size_t i = 0; i < n; i++) {
    snprintf(value, sizeof value, "value-%zu", i);
    assert_int_equal(ferry_metadata_put(md, keys[i], value), FERRY_OK);
  }
  /* Distinct keys stayed distinct: "a&key=evil" did not overwrite "a". */
  for (size_t i = 0; i < n; i++) {
    snprintf(value, sizeof value, "value-%zu", i);
    assert_int_equal(ferry_metadata_get(md, keys[i], &v), FERRY_OK);
    assert_string_equal(v, value);
    free(v);
    assert_int_equal(ferry_metadata_delete(md, keys[i]), FERRY_OK);
  }
  ferry_metadata_close(md);
}

static void test_url_with_query(void **state) {
  char url[300];
  snprintf(url, sizeof url, "%s?tenant=t1", server_url);
  ferry_metadata *md = NULL;
  char *v = NULL;
  assert_int_equal(ferry_metadata_open(url, &md), FERRY_OK);
  assert_int_equal(ferry_metadata_put(md, "q/k", "1"), FERRY_OK);
  ferry_metadata_close(md);
  md = open_store(); /* the same key, reached without the extra parameter */
  assert_int_equal(ferry_metadata_get(md, "q/k", &v), FERRY_OK);
  assert_string_equal(v, "1");
  free(v);
  assert_int_equal(ferry_metadata_delete(md, "q/k"), FERRY_OK);
  ferry_metadata_close(md);
}

static void test_large_value(void **state) {
  size_t len = 1u << 20;
  char *big = malloc(len + 1), *v = NULL;
  assert_non_null(big);
  for (size_t i = 0; i < len; i++)
    big[i] = (char)('a' + i % 26);
  big[len] = '\0';
  ferry_metadata *md = open_store();
  assert_int_equal(ferry_metadata_put(md, "big", big), FERRY_OK);
  assert_int_equal(ferry_metadata_get(md, "big", &v), FERRY_OK);
  assert_int_equal(strlen(v), len);
  assert_memory_equal(v, big, len);
  free(v);
  assert_int_equal(ferry_metadata_delete(md, "big"), FERRY_OK);
  ferry_metadata_close(md);
  free(big);
}

/* ---- concurrency ------------------------------------------------------------ */

#define THREADS 8
#define OPS 200

typedef struct worker {
  ferry_metadata *md;
  int id;
  int failures;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  char key[64], value[64], *v;
  for (int i = 0; i < OPS; i++) {
    snprintf(key, sizeof key, "conc/%d/%d", w->id, i % 16);
    snprintf(value, sizeof value, "{\"thread\":%d,\"i\":%d}", w->id, i);
    v = NULL;
    if (ferry_metadata_put(w->md, key, value) != FERRY_OK ||
        ferry_metadata_get(w->md, key, &v) != FERRY_OK || strcmp(v, value) != 0) {
      fprintf(stderr, "thread %d op %d: %s\n", w->id, i, ferry_last_error());
      w->failures++;
    }
    free(v);
  }
  return NULL;
}

static void test_concurrent(void **state) {
  ferry_metadata *md = open_store(); /* one handle shared by every thread */
  pthread_t tids[THREADS];
  worker workers[THREADS];
  for (int t = 0; t < THREADS; t++) {
    workers[t] = (worker){.md = md, .id = t};
    assert_int_equal(pthread_create(&tids[t], NULL, worker_main, &workers[t]), 0);
  }
  int failures = 0;
  for (int t = 0; t < THREADS; t++) {
    pthread_join(tids[t], NULL);
    failures += workers[t].failures;
  }
  assert_int_equal(failures, 0);
  ferry_metadata_close(md);
}

/* ---- segments --------------------------------------------------------------- */

static void test_segment(void **state) {
  ferry_metadata *md = open_store();
  const char *name = "node-a:15000";
  ferry_region regions[] = {
      {0x7f0000002000ull, 8192},
      {0xfffffffffffff000ull, 4096}, /* above INT64_MAX */
      {0x1000ull, 64},
  };
  assert_int_equal(ferry_segment_publish(md, name, "127.0.0.1", 15000, regions, 3), FERRY_OK);

  char host[64];
  uint16_t port = 0;
  assert_int_equal(ferry_segment_lookup(md, name, host, sizeof host, &port), FERRY_OK);
  assert_string_equal(host, "127.0.0.1");
  assert_int_equal(port, 15000);

  ferry_region *got = NULL;
  size_t count = 0;
  assert_int_equal(ferry_segment_lookup_regions(md, name, &got, &count), FERRY_OK);
  assert_int_equal(count, 3);
  assert_true(got[0].addr == 0x1000ull && got[0].length == 64);
  assert_true(got[1].addr == 0x7f0000002000ull && got[1].length == 8192);
  assert_true(got[2].addr == 0xfffffffffffff000ull && got[2].length == 4096);
  free(got);

  /* The layout is Mooncake's: check the keys the other side reads. */
  char *raw = NULL;
  assert_int_equal(ferry_metadata_get(md, "mooncake/rpc_meta/node-a:15000", &raw), FERRY_OK);
  assert_non_null(strstr(raw, "\"ip_or_host_name\""));
  assert_non_null(strstr(raw, "\"rpc_port\":15000"));
  free(raw);
  assert_int_equal(ferry_metadata_get(md, "mooncake/ram/node-a:15000", &raw), FERRY_OK);
  assert_non_null(strstr(raw, "\"buffers\""));
  assert_non_null(strstr(raw, "\"protocol\":\"tcp\""));
  free(raw);

  /* Rewriting only the regions leaves the rpc key alone. */
  assert_int_equal(ferry_segment_publish_regions(md, name, 15000, regions, 1), FERRY_OK);
  assert_int_equal(ferry_segment_lookup_regions(md, name, &got, &count), FERRY_OK);
  assert_int_equal(count, 1);
  free(got);
  assert_int_equal(ferry_segment_publish_regions(md, name, 15000, NULL, 0), FERRY_OK);
  assert_int_equal(ferry_segment_lookup_regions(md, name, &got, &count), FERRY_OK);
  assert_int_equal(count, 0);
  free(got);
  assert_int_equal(ferry_segment_lookup(md, name, host, sizeof host, &port), FERRY_OK);

  assert_int_equal(ferry_segment_unpublish(md, name), FERRY_OK);
  assert_int_equal(ferry_segment_lookup(md, name, host, sizeof host, &port), FERRY_ENOTFOUND);
  assert_non_null(strstr(ferry_last_error(), name));
  assert_int_equal(ferry_segment_lookup_regions(md, name, &got, &count), FERRY_ENOTFOUND);
  assert_int_equal(ferry_segment_unpublish(md, name), FERRY_OK); /* already gone: fine */
  ferry_metadata_close(md);
}

static void test_segment_malformed(void **state) {
  ferry_metadata *md = open_store();
  char host[64];
  uint16_t port;
  ferry_region *got = NULL;
  size_t count = 0;
  assert_int_equal(ferry_metadata_put(md, "mooncake/rpc_meta/bad", "{not json"), FERRY_OK);
  assert_int_equal(ferry_segment_lookup(md, "bad", host, sizeof host, &port), FERRY_EJSON);
  assert_non_null(strstr(ferry_last_error(), "mooncake/rpc_meta/bad"));
  assert_int_equal(ferry_metadata_put(md, "mooncake/rpc_meta/bad", "{\"rpc_port\":\"x\"}"),
                   FERRY_OK);
  assert_int_equal(ferry_segment_lookup(md, "bad", host, sizeof host, &port), FERRY_EJSON);
  assert_int_equal(ferry_metadata_put(md, "mooncake/rpc_meta/bad",
                                      "{\"ip_or_host_name\":\"a-long-host-name\",\"rpc_port\":1}"),
                   FERRY_OK);
  assert_int_equal(ferry_segment_lookup(md, "bad", host, 8, &port), FERRY_EINVAL); /* no cut */
  assert_int_equal(ferry_metadata_put(md, "mooncake/ram/bad", "{\"buffers\":[{\"addr\":1}]}"),
                   FERRY_OK);
  assert_int_equal(ferry_segment_lookup_regions(md, "bad", &got, &count), FERRY_EJSON);
  assert_non_null(strstr(ferry_last_error(), "mooncake/ram/bad"));
  assert_null(got);
  assert_int_equal(ferry_segment_unpublish(md, "bad"), FERRY_OK);
  ferry_metadata_close(md);
}

/* ---- URL forms ------------------------------------------------------------------ */

static void test_unsupported_schemes(void **state) {
  ferry_metadata *md = NULL;
  /* redis connects at open: a closed loopback port fails, naming the URL
   * with its password masked. */
  assert_int_equal(ferry_metadata_open("redis://u:pw@127.0.0.1:1", &md), FERRY_EMETADATA);
  assert_non_null(strstr(ferry_last_error(), "redis://u:***@127.0.0.1:1"));
  assert_null(md);
  assert_int_equal(ferry_metadata_open("redis://127.0.0.1:notaport", &md), FERRY_EINVAL);
  assert_int_equal(ferry_metadata_open("rediss://127.0.0.1:1", &md), FERRY_ENOTIMPL);
  /* etcd (also a bare host:port list) is reached by the first request. */
  assert_int_equal(ferry_metadata_open("etcd://127.0.0.1:1,127.0.0.1:2", &md), FERRY_OK);
  char *v = NULL;
  assert_int_equal(ferry_metadata_get(md, "k", &v), FERRY_EMETADATA);
  assert_non_null(strstr(ferry_last_error(), "127.0.0.1:2"));
  ferry_metadata_close(md);
  assert_int_equal(ferry_metadata_open("127.0.0.1:1", &md), FERRY_OK);
  ferry_metadata_close(md);
  assert_int_equal(ferry_metadata_open("etcd://127.0.0.1:1/path", &md), FERRY_EINVAL);
  assert_int_equal(ferry_metadata_open("ftp://x/", &md), FERRY_EINVAL);
  assert_int_equal(ferry_metadata_open("P2PHANDSHAKE", &md), FERRY_EINVAL);
  assert_int_equal(ferry_metadata_open("", &md), FERRY_EINVAL);
  assert_int_equal(ferry_metadata_open(NULL, &md), FERRY_EINVAL);
  assert_int_equal(ferry_metadata_open("http://", &md), FERRY_EINVAL);
}

static void test_unreachable(void **state) {
  ferry_metadata *md = NULL;
  assert_int_equal(ferry_metadata_open("http://127.0.0.1:1/", &md), FERRY_OK);
  char *v = NULL;
  double t0 = now_s();
  assert_int_equal(ferry_metadata_get(md, "k", &v), FERRY_EMETADATA);
  assert_true(now_s() - t0 < 3.0);
  assert_non_null(strstr(ferry_last_error(), "127.0.0.1:1"));
  assert_int_equal(ferry_metadata_put(md, "k", "v"), FERRY_EMETADATA);
  char host[16];
  uint16_t port;
  assert_int_equal(ferry_segment_lookup(md, "s", host, sizeof host, &port), FERRY_EMETADATA);
  ferry_metadata_close(md);
}

/* ---- the server's own answers (raw HTTP) -------------------------------------- */

static long raw_request(const char *method, const char *url, const char *body, size_t len) {
  CURL *c = curl_easy_init();
  assert_non_null(c);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 20000L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, fwrite);
  FILE *sink = fopen("/dev/null", "w");
  curl_easy_setopt(c, CURLOPT_WRITEDATA, sink);
  if (body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  }
  long code = 0;
  CURLcode rc = curl_easy_perform(c);
  if (rc == CURLE_OK)
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(c);
  fclose(sink);
  return code;
}

static void test_server_status_codes(void **state) {
  char url[300];
  snprintf(url, sizeof url, "%s", server_url);
  assert_int_equal(raw_request("GET", url, NULL, 0), 400);
  snprintf(url, sizeof url, "%s?key=raw", server_url);
  assert_int_equal(raw_request("POST", url, "x", 1), 405);
  assert_int_equal(raw_request("DELETE", url, NULL, 0), 404);
  size_t big = (64u << 20) + 1;
  char *body = calloc(1, big);
  assert_non_null(body);
  assert_int_equal(raw_request("PUT", url, body, big), 413);
  free(body);
  assert_int_equal(raw_request("GET", url, NULL, 0), 404);
}

/* ---- expiry and the state file ------------------------------------------------ */

/* Seconds until GET key's presence is want, at most limit_s; -1 if never. */
static double wait_key(const char *url, const char *key, int want, double limit_s) {
  ferry_metadata *md = NULL;
  assert_int_equal(ferry_metadata_open(url, &md), FERRY_OK);
  double start = now_s(), took = -1;
  while (now_s() - start < limit_s) {
    char *v = NULL;
    ferry_status st = ferry_metadata_get(md, key, &v);
    free(v);
    if ((st == FERRY_OK) == want) {
      took = now_s() - start;
      break;
    }
    usleep(20000); /* expiry runs on the server's clock: nothing to wait on */
  }
  ferry_metadata_close(md);
  return took;
}

/* A leased key stays while its writer refreshes it and goes within the ttl
 * once the writer stops; a plain key stays. */
static void test_expiry(void **state) {
  ferry_metadata_options opt = {.ttl_ms = 400};
  ferry_metadata *leased = NULL, *plain = open_store();
  assert_int_equal(ferry_metadata_open_with(server_url, &opt, &leased), FERRY_OK);
  assert_int_equal(ferry_metadata_put(leased, "exp/leased", "v"), FERRY_OK);
  assert_int_equal(ferry_metadata_put(plain, "exp/plain", "v"), FERRY_OK);
  usleep(1200 * 1000); /* three ttls: only the refresher keeps it */
  assert_true(wait_key(server_url, "exp/leased", 1, 0.1) >= 0);
  ferry_metadata_close(leased); /* stops refreshing, deletes nothing */
  double gone = wait_key(server_url, "exp/leased", 0, 10);
  print_message("leased key gone %.2f s after its writer stopped (ttl 0.4 s)\n", gone);
  assert_true(gone >= 0);
  assert_true(wait_key(server_url, "exp/plain", 1, 0.1) >= 0);
  char url[300];
  snprintf(url, sizeof url, "%s?key=exp/bad&ttl=-5", server_url);
  assert_int_equal(raw_request("PUT", url, "x", 1), 400);
  assert_int_equal(ferry_metadata_delete(plain, "exp/plain"), FERRY_OK);
  ferry_metadata_close(plain);
}

/* Keys survive a SIGKILL of the server; a damaged state file stops it. */
static void test_state_file(void **state) {
  char dir[] = "/tmp/ferry-state-XXXXXX", path[64], url[256];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/state", dir);
  pid_t pid = -1;
  assert_int_equal(start_server(path, &pid, url, sizeof url), 0);
  ferry_metadata *md = NULL;
  assert_int_equal(ferry_metadata_open(url, &md), FERRY_OK);
  assert_int_equal(ferry_segment_publish(md, "kept", "127.0.0.1", 4242, NULL, 0), FERRY_OK);
  assert_int_equal(ferry_metadata_put(md, "gone", "v"), FERRY_OK);
  assert_int_equal(ferry_metadata_delete(md, "gone"), FERRY_OK);
  ferry_metadata_close(md);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);

  assert_int_equal(start_server(path, &pid, url, sizeof url), 0);
  assert_int_equal(ferry_metadata_open(url, &md), FERRY_OK);
  char host[64], *v = NULL;
  uint16_t port = 0;
  assert_int_equal(ferry_segment_lookup(md, "kept", host, sizeof host, &port), FERRY_OK);
  assert_int_equal(port, 4242);
  assert_int_equal(ferry_metadata_get(md, "gone", &v), FERRY_ENOTFOUND);
  ferry_metadata_close(md);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);

  FILE *f = fopen(path, "a");
  fputs("garbage", f);
  fclose(f);
  int status = 0;
  assert_int_equal(start_server(path, &pid, url, sizeof url), -1);
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_get_round_trip),
      cmocka_unit_test(test_missing_key),
      cmocka_unit_test(test_escaped_keys),
      cmocka_unit_test(test_url_with_query),
      cmocka_unit_test(test_large_value),
      cmocka_unit_test(test_concurrent),
      cmocka_unit_test(test_segment),
      cmocka_unit_test(test_segment_malformed),
      cmocka_unit_test(test_unsupported_schemes),
      cmocka_unit_test(test_unreachable),
      cmocka_unit_test(test_server_status_codes),
      cmocka_unit_test(test_expiry),
      cmocka_unit_test(test_state_file),
  };
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
