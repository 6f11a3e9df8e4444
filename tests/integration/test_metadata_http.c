/* test_metadata_http.c - the http metadata backend and segment descriptors
 * against a real `ferry metadata-server` child process.
 *
 * The group setup starts "$FERRY_TOOL metadata-server --port 0" and reads its
 * ready line to learn the URL; the group teardown always stops it (SIGTERM,
 * then SIGKILL if it hangs) and checks it exited 0. Only 127.0.0.1 is used. */
#include <errno.h>
#include <fcntl.h>
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
#include <sys/stat.h>
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

/* The environment for a server with preload as LD_PRELOAD: built before
 * the fork, so the child only calls async-signal-safe functions. An ASan
 * build's runtime is loaded after the shim: verify_asan_link_order=0 lets
 * it. */
static char **preload_env(const char *preload, char *ld, size_t ld_size, char *asan,
                          size_t asan_size) {
  extern char **environ;
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 3, sizeof *env);
  assert_non_null(env);
  const char *was = getenv("ASAN_OPTIONS");
  snprintf(ld, ld_size, "LD_PRELOAD=%s", preload);
  snprintf(asan, asan_size, "ASAN_OPTIONS=%s%sverify_asan_link_order=0", was ? was : "",
           was ? ":" : "");
  size_t k = 0;
  env[k++] = ld;
  env[k++] = asan;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "LD_PRELOAD=", 11) && strncmp(environ[i], "ASAN_OPTIONS=", 13))
      env[k++] = environ[i];
  return env;
}

/* `$FERRY_TOOL metadata-server --host 127.0.0.1 --port 0 [args...]` (args
 * NULL-terminated, or NULL), its stdout to out_fd; its stderr to err_fd
 * when that is >= 0; with preload as LD_PRELOAD when given. */
static pid_t spawn_server(int out_fd, int err_fd, const char *const *args, const char *preload) {
  extern char **environ;
  const char *tool = getenv("FERRY_TOOL");
  if (!tool)
    tool = "ferry";
  const char *argv[32] = {tool, "metadata-server", "--host", "127.0.0.1", "--port", "0"};
  for (int i = 0; args && args[i] && i < 24; i++)
    argv[6 + i] = args[i];
  char ld[512], asan[1024];
  char **env = preload ? preload_env(preload, ld, sizeof ld, asan, sizeof asan) : environ;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a crashed test */
    dup2(out_fd, STDOUT_FILENO);
    if (err_fd >= 0)
      dup2(err_fd, STDERR_FILENO);
    execve(tool, (char *const *)argv, env);
    static const char failed[] = "test_metadata_http: cannot run $FERRY_TOOL\n";
    ssize_t unused = write(STDERR_FILENO, failed, sizeof failed - 1); /* async-signal-safe */
    (void)unused;
    _exit(127);
  }
  if (env != environ)
    free(env);
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

/* Starts a server (as spawn_server) and reads its URL from the ready line.
 * 0, or -1 with the child (if any) left in *pid for the caller to reap. */
static int start_server_with(const char *const *args, int err_fd, const char *preload, pid_t *pid,
                             char *url_out, size_t size) {
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  *pid = spawn_server(fds[1], err_fd, args, preload);
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

/* state: the --state FILE, or NULL. */
static int start_server(const char *state, pid_t *pid, char *url_out, size_t size) {
  const char *args[] = {"--state", state, NULL};
  return start_server_with(state ? args : NULL, -1, NULL, pid, url_out, size);
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

/* The HTTP status of a request, or 0 when none came within timeout_ms. */
static long request_within(const char *method, const char *url, const char *body, size_t len,
                           long timeout_ms) {
  CURL *c = curl_easy_init();
  assert_non_null(c);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
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

static long raw_request(const char *method, const char *url, const char *body, size_t len) {
  return request_within(method, url, body, len, 20000);
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

/* ---- limits, the append log, and no lock across a disk sync ------------------- */

/* A private server with its own arguments; its stderr in dir/log. */
typedef struct private_server {
  pid_t pid;
  char url[256], log[300];
} private_server;

static void private_start(private_server *p, const char *dir, const char *const *args,
                          const char *preload) {
  snprintf(p->log, sizeof p->log, "%s/log", dir);
  int err = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
  assert_true(err >= 0);
  int rc = start_server_with(args, err, preload, &p->pid, p->url, sizeof p->url);
  close(err);
  assert_int_equal(rc, 0);
}

static void private_kill(private_server *p) {
  kill(p->pid, SIGKILL);
  waitpid(p->pid, NULL, 0);
}

/* The server's stderr so far (malloc'd). */
static char *private_log(const private_server *p) {
  FILE *f = fopen(p->log, "r");
  assert_non_null(f);
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  return strdup(text);
}

static long put(const private_server *p, const char *key, size_t len, char fill) {
  char url[400];
  snprintf(url, sizeof url, "%s?key=%s", p->url, key);
  char *body = malloc(len ? len : 1);
  memset(body, fill, len);
  long code = raw_request("PUT", url, body, len);
  free(body);
  return code;
}

static long request(const private_server *p, const char *method, const char *key) {
  char url[400];
  snprintf(url, sizeof url, "%s?key=%s", p->url, key);
  return raw_request(method, url, NULL, 0);
}

/* A value too large is refused with 413, a store out of room with 507
 * (bytes, then keys), each logged; a smaller value, a replacement and a
 * key freed by a DELETE are let in. */
static void test_limits(void **state) {
  char dir[] = "/tmp/ferry-limits-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const char *args[] = {"--max-value", "1K", "--max-bytes", "2K", "--max-keys", "3", NULL};
  private_server p;
  private_start(&p, dir, args, NULL);
  assert_int_equal(put(&p, "a", 1025, 'a'), 413);
  assert_int_equal(put(&p, "a", 1000, 'a'), 200);
  assert_int_equal(put(&p, "b", 1000, 'b'), 507); /* 2 x (1000 + bookkeeping) > 2 KiB */
  assert_int_equal(put(&p, "b", 10, 'b'), 200);
  assert_int_equal(put(&p, "c", 10, 'c'), 200);
  assert_int_equal(put(&p, "d", 10, 'd'), 507);   /* a fourth key */
  assert_int_equal(put(&p, "a", 1000, 'A'), 200); /* a replacement of the same size */
  assert_int_equal(request(&p, "DELETE", "c"), 200);
  assert_int_equal(put(&p, "d", 10, 'd'), 200);
  assert_int_equal(request(&p, "GET", "d"), 200);
  char *log = private_log(&p);
  print_message("%s", log);
  assert_non_null(
      strstr(log, "refused PUT a (1025 bytes): value larger than 1024 bytes (--max-value)"));
  assert_non_null(
      strstr(log, "refused PUT b (1000 bytes): the store is full: it holds 1058 bytes of 2048"));
  assert_non_null(
      strstr(log, "refused PUT d (10 bytes): the store holds 3 keys, the most (--max-keys)"));
  free(log);
  private_kill(&p);
  unlink(p.log);
  rmdir(dir);
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

static void append_text(const char *path, const char *text) {
  FILE *f = fopen(path, "a");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void expect_stored(const private_server *p, const char *key, size_t len, char fill) {
  ferry_metadata *md = NULL;
  assert_int_equal(ferry_metadata_open(p->url, &md), FERRY_OK);
  char *v = NULL;
  assert_int_equal(ferry_metadata_get(md, key, &v), FERRY_OK);
  assert_int_equal(strlen(v), len);
  for (size_t i = 0; i < len; i++)
    assert_int_equal(v[i], fill);
  free(v);
  ferry_metadata_close(md);
}

/* Changes are appended, and the file is compacted in the background once
 * it holds far more than the live keys (40 rewrites of one 64 KiB value:
 * 2.5 MiB appended, the file ends up well below that); a SIGKILL and
 * restart keeps every key. A record cut short or half written by a crash
 * is dropped with a WARN, the server starts; a bad record followed by
 * more is damage, and it refuses to start. A version 1 file is read. */
static void test_state_file_log(void **state) {
  char dir[] = "/tmp/ferry-state-XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/state", dir);
  const char *args[] = {"--state", path, NULL};
  private_server p;
  private_start(&p, dir, args, NULL);
  for (int i = 0; i < 40; i++)
    assert_int_equal(put(&p, "big", 64 * 1024, (char)('a' + i % 26)), 200);
  assert_int_equal(put(&p, "keep", 5, 'k'), 200);
  assert_int_equal(put(&p, "gone", 5, 'g'), 200);
  assert_int_equal(request(&p, "DELETE", "gone"), 200);
  double until = now_s() + 10;
  while (file_size(path) > 2 * 1024 * 1024 && now_s() < until)
    usleep(10000); /* the compactor runs beside the writes: nothing to wait on */
  print_message("state file: %lld bytes after 2.5 MiB of changes\n", (long long)file_size(path));
  assert_true(file_size(path) <= 2 * 1024 * 1024);
  private_kill(&p);

  private_start(&p, dir, args, NULL);
  expect_stored(&p, "big", 64 * 1024, (char)('a' + 39 % 26));
  expect_stored(&p, "keep", 5, 'k');
  assert_int_equal(request(&p, "GET", "gone"), 404);
  private_kill(&p);

  /* a crash in the middle of an append: the header and part of the key */
  append_text(path, "+ 9 100 0 0abc1234\ntor");
  private_start(&p, dir, args, NULL);
  expect_stored(&p, "keep", 5, 'k');
  assert_int_equal(put(&p, "after", 3, 'x'), 200);
  private_kill(&p);
  /* half written: whole, but its crc does not match */
  append_text(path, "+ 4 1 0 00000000\nhalfx\n");
  private_start(&p, dir, args, NULL);
  expect_stored(&p, "after", 3, 'x');
  assert_int_equal(request(&p, "GET", "half"), 404);
  private_kill(&p);
  char *log = private_log(&p);
  print_message("%s", log);
  assert_non_null(strstr(log, "dropped its last record (22 bytes at byte"));
  assert_non_null(strstr(log, "cut short or half written by a crash"));
  free(log);

  /* the same bad record with another after it: damage, not a crash */
  append_text(path, "+ 4 1 0 00000000\nhalfx\n+ 1 1 0 00000000\nkv\n");
  int status = 0;
  assert_int_equal(start_server_with(args, -1, NULL, &p.pid, p.url, sizeof p.url), -1);
  waitpid(p.pid, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);

  /* a version 1 file (a snapshot, as earlier servers wrote) */
  FILE *f = fopen(path, "w");
  fputs("ferry-metadata-state 1\n3 5 0\nold12345\n", f);
  fclose(f);
  private_start(&p, dir, args, NULL);
  ferry_metadata *md = NULL;
  char *v = NULL;
  assert_int_equal(ferry_metadata_open(p.url, &md), FERRY_OK);
  assert_int_equal(ferry_metadata_get(md, "old", &v), FERRY_OK);
  assert_string_equal(v, "12345");
  free(v);
  ferry_metadata_close(md);
  private_kill(&p);
  unlink(path);
  unlink(p.log);
  rmdir(dir);
}

typedef struct big_put {
  const private_server *p;
  long code;
} big_put;

static void *put_big(void *arg) {
  big_put *b = arg;
  b->code = put(b->p, "big", 8 << 20, 'b');
  return NULL;
}

/* No lock of the map is held across a disk sync: while the server is held
 * inside the fsync of an 8 MiB PUT (an LD_PRELOAD shim blocks it until
 * released), a GET and a lease refresh (a PUT that changes nothing but the
 * expiry) are answered. The old server synced the whole store under the
 * map's lock: both waited for the sync (here: forever). */
static void test_no_lock_across_a_disk_sync(void **state) {
  const char *shim = getenv("FERRY_SYNC_STALL");
  if (!shim || access(shim, R_OK) != 0) {
    print_message("FERRY_SYNC_STALL (the fsync shim) not given: cannot hold a sync\n");
    skip();
  }
  char dir[] = "/tmp/ferry-sync-XXXXXX", path[64], armed[64], gate[64], entered[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/state", dir);
  snprintf(armed, sizeof armed, "%s/armed", dir);
  snprintf(gate, sizeof gate, "%s/gate", dir);
  snprintf(entered, sizeof entered, "%s/entered", dir);
  assert_int_equal(mkfifo(gate, 0600), 0);
  setenv("FERRY_SYNC_STALL_DIR", dir, 1);
  const char *args[] = {"--state", path, NULL};
  private_server p;
  private_start(&p, dir, args, shim);
  char lease[400];
  snprintf(lease, sizeof lease, "%s?key=lease&ttl=60000", p.url);
  assert_int_equal(raw_request("PUT", lease, "v", 1), 200);
  assert_int_equal(put(&p, "other", 3, 'o'), 200);

  close(open(armed, O_WRONLY | O_CREAT, 0600)); /* the next sync stalls */
  big_put b = {&p, 0};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, put_big, &b), 0);
  double until = now_s() + 20;
  while (access(entered, F_OK) != 0 && now_s() < until)
    usleep(1000);
  assert_int_equal(access(entered, F_OK), 0); /* the server is inside the sync */
  unlink(armed);
  long got = request_within("GET", lease, NULL, 0, 10000);
  long refreshed = request_within("PUT", lease, "v", 1, 10000);
  print_message("while the sync is held: GET %ld, lease refresh %ld\n", got, refreshed);
  int gate_fd = open(gate, O_WRONLY); /* lets the sync go */
  assert_int_equal(write(gate_fd, "x", 1), 1);
  close(gate_fd);
  pthread_join(thread, NULL);
  assert_int_equal(got, 200);
  assert_int_equal(refreshed, 200);
  assert_int_equal(b.code, 200);
  private_kill(&p);
  unsetenv("FERRY_SYNC_STALL_DIR");
  unlink(entered);
  unlink(gate);
  unlink(path);
  unlink(p.log);
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
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_state_file_log),
      cmocka_unit_test(test_no_lock_across_a_disk_sync),
  };
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
