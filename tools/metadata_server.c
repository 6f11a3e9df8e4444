/* metadata_server.c - `ferry metadata-server`: a small in-memory key/value
 * store speaking the http metadata protocol of Mooncake's Transfer Engine.
 *
 *   GET    <any path>?key=K         200 + value, or 404
 *   PUT    <any path>?key=K[&ttl=MS] stores the request body (at most 64 MiB,
 *                                   else 413); with ttl the key is dropped
 *                                   unless put again within MS milliseconds
 *   DELETE <any path>?key=K         200, or 404
 *   no key parameter, bad ttl       400
 *
 * Engines started with metadata_url=http://HOST:PORT/metadata publish their
 * segment descriptors here (leased: they put them again every ttl/3) and
 * look up their peers, so a test or a small cluster needs no etcd or redis.
 * With --state FILE every change of content is written to FILE (a new file
 * renamed over the old) before the reply, and FILE is read at start, so a
 * restart loses nothing; a leased key read back gets a full ttl again, time
 * for its engine to refresh it. A refresh that changes nothing but the
 * expiry is not written. libmicrohttpd serves clients from a thread pool;
 * the map is one mutex-protected hash table. Once bound it prints one line,
 * "ready metadata-server url=...", and then serves until SIGINT or SIGTERM,
 * when it exits 0. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "cli.h"
#include "commands.h"

#define PROG "ferry metadata-server"
#define MAX_VALUE ((size_t)64 << 20)
#define POOL_THREADS 4
#define IDLE_TIMEOUT_S 60
#define MAX_TTL_MS (24u * 3600 * 1000) /* a longer lease is a mistake */
#define SWEEP_NS (500 * 1000 * 1000L)  /* how often expired keys are dropped */
#define STATE_MAGIC "ferry-metadata-state 1\n"

/* ---- the key/value map --------------------------------------------------- */

typedef struct entry {
  struct entry *next;
  char *key;
  char *value;
  size_t len;
  uint32_t ttl_ms;     /* 0: never expires */
  uint64_t expires_ns; /* monotonic; meaningful when ttl_ms != 0 */
} entry;

typedef struct kv_map {
  pthread_mutex_t lock; /* guards everything below, and the state file */
  entry **buckets;
  size_t nbuckets, count;
  const char *state_path; /* NULL: nothing is persisted */
} kv_map;

static uint64_t hash_key(const char *key) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++)
    h = (h ^ *p) * 1099511628211ull;
  return h;
}

static entry **find_slot(kv_map *m, const char *key) {
  entry **slot = &m->buckets[hash_key(key) % m->nbuckets];
  while (*slot && strcmp((*slot)->key, key) != 0)
    slot = &(*slot)->next;
  return slot;
}

/* Doubles the bucket array when the load passes 1; on ENOMEM just stays. */
static void maybe_grow(kv_map *m) {
  if (m->count < m->nbuckets)
    return;
  size_t n = m->nbuckets * 2;
  entry **fresh = calloc(n, sizeof *fresh);
  if (!fresh)
    return;
  for (size_t i = 0; i < m->nbuckets; i++)
    for (entry *e = m->buckets[i], *next; e; e = next) {
      next = e->next;
      entry **head = &fresh[hash_key(e->key) % n];
      e->next = *head;
      *head = e;
    }
  free(m->buckets);
  m->buckets = fresh;
  m->nbuckets = n;
}

static int map_init(kv_map *m) {
  m->nbuckets = 64;
  m->count = 0;
  m->buckets = calloc(m->nbuckets, sizeof *m->buckets);
  pthread_mutex_init(&m->lock, NULL);
  return m->buckets ? 0 : -1;
}

static void map_free(kv_map *m) {
  for (size_t i = 0; i < m->nbuckets; i++)
    for (entry *e = m->buckets[i], *next; e; e = next) {
      next = e->next;
      free(e->key);
      free(e->value);
      free(e);
    }
  free(m->buckets);
  pthread_mutex_destroy(&m->lock);
}

static void free_entry(entry *e) {
  free(e->key);
  free(e->value);
  free(e);
}

static int expired(const entry *e, uint64_t now) { return e->ttl_ms && now >= e->expires_ns; }

/* Unlinks and frees *slot; called with the lock. */
static void drop(kv_map *m, entry **slot) {
  entry *e = *slot;
  *slot = e->next;
  m->count--;
  free_entry(e);
}

/* ---- the state file ------------------------------------------------------ */

/* Writes the whole map to state_path (a new file, synced, renamed over the
 * old one, so a crash leaves the old or the new state, never half). Called
 * with the lock. 0, or -1 with errno. */
static int save_state(kv_map *m) {
  if (!m->state_path)
    return 0;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", m->state_path);
  /* Owner only: the descriptors map segment names to addresses. */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  int ok = fputs(STATE_MAGIC, f) >= 0;
  for (size_t i = 0; ok && i < m->nbuckets; i++)
    for (entry *e = m->buckets[i]; ok && e; e = e->next)
      ok = fprintf(f, "%zu %zu %u\n", strlen(e->key), e->len, e->ttl_ms) > 0 &&
           fwrite(e->key, 1, strlen(e->key), f) == strlen(e->key) &&
           fwrite(e->value, 1, e->len, f) == e->len && fputc('\n', f) != EOF;
  ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
  int err = errno;
  ok = fclose(f) == 0 && ok && rename(tmp, m->state_path) == 0;
  if (!ok) {
    err = err ? err : errno;
    unlink(tmp);
    errno = err;
    return -1;
  }
  return 0;
}

/* Reads one "KEYLEN VALUELEN TTL\nKEYVALUE\n" record. 1 read, 0 at the end,
 * -1 malformed or out of memory. */
static int read_record(FILE *f, char **key, char **value, size_t *len, uint32_t *ttl) {
  size_t klen;
  int n = fscanf(f, "%zu %zu %u", &klen, len, ttl);
  if (n == EOF)
    return 0;
  if (n != 3 || fgetc(f) != '\n' || klen == 0 || klen > 65536 || *len > MAX_VALUE)
    return -1;
  *key = malloc(klen + 1);
  *value = malloc(*len ? *len : 1);
  if (!*key || !*value || fread(*key, 1, klen, f) != klen || fread(*value, 1, *len, f) != *len ||
      fgetc(f) != '\n') {
    free(*key);
    free(*value);
    return -1;
  }
  (*key)[klen] = '\0';
  return 1;
}

static int map_put(kv_map *m, const char *key, char *value, size_t len, uint32_t ttl_ms);

/* Loads state_path into the (empty) map; a missing file is an empty store.
 * 0, or -1 after printing why. */
static int load_state(kv_map *m) {
  FILE *f = fopen(m->state_path, "r");
  if (!f && errno == ENOENT)
    return 0;
  char magic[sizeof STATE_MAGIC] = "";
  if (!f || !fgets(magic, sizeof magic, f) || strcmp(magic, STATE_MAGIC) != 0) {
    fprintf(stderr, PROG ": cannot read state file %s: %s\n", m->state_path,
            f ? "not a ferry metadata state file" : strerror(errno));
    if (f)
      fclose(f);
    return -1;
  }
  const char *saved = m->state_path;
  m->state_path = NULL; /* no rewriting while loading */
  char *key, *value;
  size_t len;
  uint32_t ttl;
  int rc;
  while ((rc = read_record(f, &key, &value, &len, &ttl)) == 1) {
    rc = map_put(m, key, value, len, ttl) == 0 ? 1 : -1;
    free(key);
    if (rc < 0)
      break;
  }
  fclose(f);
  m->state_path = saved;
  if (rc < 0)
    fprintf(stderr, PROG ": state file %s is damaged (after %zu keys); refusing to start\n", saved,
            m->count);
  return rc < 0 ? -1 : 0;
}

/* ---- map operations ------------------------------------------------------ */

/* Takes ownership of value. ttl_ms 0: keeps it until deleted. Returns 0,
 * -1 when out of memory, -2 when the state file could not be written. */
static int map_put(kv_map *m, const char *key, char *value, size_t len, uint32_t ttl_ms) {
  pthread_mutex_lock(&m->lock);
  entry **slot = find_slot(m, key);
  entry *e = *slot;
  int changed = 1;
  if (e) {
    changed = e->len != len || memcmp(e->value, value, len) != 0 || e->ttl_ms != ttl_ms;
    free(e->value);
  } else if ((e = calloc(1, sizeof *e)) && (e->key = strdup(key))) {
    *slot = e;
    m->count++;
    maybe_grow(m);
  } else {
    pthread_mutex_unlock(&m->lock);
    free(e);
    free(value);
    return -1;
  }
  e->value = value;
  e->len = len;
  e->ttl_ms = ttl_ms;
  e->expires_ns = ferry_now_ns() + (uint64_t)ttl_ms * 1000000ull;
  /* A refresh that only moves the expiry is not worth a disk write. */
  int rc = changed && save_state(m) != 0 ? -2 : 0;
  pthread_mutex_unlock(&m->lock);
  return rc;
}

/* A private copy of the value (the entry may change once the lock drops).
 * Returns 1 found, 0 missing (or expired), -1 out of memory. */
static int map_get(kv_map *m, const char *key, char **value, size_t *len) {
  pthread_mutex_lock(&m->lock);
  entry **slot = find_slot(m, key);
  entry *e = *slot;
  int rc = 0;
  if (e && expired(e, ferry_now_ns())) {
    drop(m, slot);
    save_state(m); /* best effort: a stale key in the file expires again */
    e = NULL;
  }
  if (e) {
    *value = malloc(e->len ? e->len : 1);
    *len = e->len;
    rc = *value ? 1 : -1;
    if (*value)
      memcpy(*value, e->value, e->len);
  }
  pthread_mutex_unlock(&m->lock);
  return rc;
}

/* 1 deleted, 0 missing, -2 deleted but the state file could not be written. */
static int map_delete(kv_map *m, const char *key) {
  pthread_mutex_lock(&m->lock);
  entry **slot = find_slot(m, key);
  int rc = 0;
  if (*slot) {
    int live = !expired(*slot, ferry_now_ns());
    drop(m, slot);
    rc = save_state(m) != 0 ? -2 : live;
  }
  pthread_mutex_unlock(&m->lock);
  return rc;
}

/* Drops every expired key, so dead engines' keys do not pile up. */
static void map_sweep(kv_map *m) {
  pthread_mutex_lock(&m->lock);
  uint64_t now = ferry_now_ns();
  size_t before = m->count;
  for (size_t i = 0; i < m->nbuckets; i++)
    for (entry **slot = &m->buckets[i]; *slot;)
      if (expired(*slot, now))
        drop(m, slot);
      else
        slot = &(*slot)->next;
  if (m->count != before) {
    FERRY_DEBUG("metadata-server: %zu keys expired", before - m->count);
    if (save_state(m) != 0)
      FERRY_WARN("metadata-server: cannot write %s: %s", m->state_path, strerror(errno));
  }
  pthread_mutex_unlock(&m->lock);
}

/* ---- HTTP handling ------------------------------------------------------- */

/* Per-request state, kept across the access-handler calls of one request. */
typedef struct request {
  char *body;
  size_t len, cap;
  int too_large, no_memory;
} request;

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *text) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
  if (!r)
    return MHD_NO;
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result reply_value(struct MHD_Connection *conn, char *value, size_t len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, value, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(value);
    return MHD_NO;
  }
  enum MHD_Result rc = MHD_queue_response(conn, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return rc;
}

/* Appends one chunk of a PUT body, up to MAX_VALUE; beyond it, drops data. */
static void append_body(request *req, const char *data, size_t size) {
  if (req->too_large || req->no_memory)
    return;
  if (size > MAX_VALUE - req->len) {
    req->too_large = 1;
    return;
  }
  if (req->len + size + 1 > req->cap) {
    size_t cap = req->cap ? req->cap : 4096;
    while (cap < req->len + size + 1)
      cap *= 2;
    char *grown = realloc(req->body, cap);
    if (!grown) {
      req->no_memory = 1;
      return;
    }
    req->body = grown;
    req->cap = cap;
  }
  memcpy(req->body + req->len, data, size);
  req->len += size;
}

/* A declared Content-Length over the cap is refused before the body comes. */
static int declared_too_large(struct MHD_Connection *conn) {
  const char *cl =
      MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  return cl && strtoull(cl, NULL, 10) > MAX_VALUE;
}

/* The ttl parameter: 0 when absent, 1..MAX_TTL_MS, else -1. */
static long ttl_param(struct MHD_Connection *conn) {
  const char *t = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "ttl");
  if (!t)
    return 0;
  char *end;
  errno = 0;
  long ms = strtol(t, &end, 10);
  return errno || end == t || *end || ms < 1 || ms > (long)MAX_TTL_MS ? -1 : ms;
}

static enum MHD_Result state_error(kv_map *map, struct MHD_Connection *conn) {
  FERRY_WARN("metadata-server: cannot write %s: %s", map->state_path, strerror(errno));
  return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot write the state file\n");
}

static enum MHD_Result finish_put(kv_map *map, struct MHD_Connection *conn, const char *key,
                                  request *req) {
  if (req->too_large)
    return reply(conn, MHD_HTTP_CONTENT_TOO_LARGE, "value larger than 64 MiB\n");
  if (req->no_memory)
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  long ttl = ttl_param(conn);
  if (ttl < 0)
    return reply(conn, MHD_HTTP_BAD_REQUEST, "ttl must be milliseconds in 1..86400000\n");
  char *value = req->body ? req->body : malloc(1);
  req->body = NULL; /* the map owns it now */
  int rc = value ? map_put(map, key, value, req->len, (uint32_t)ttl) : -1;
  if (rc == -2)
    return state_error(map, conn);
  if (rc != 0)
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  FERRY_DEBUG("metadata-server: PUT %s (%zu bytes)", key, req->len);
  return reply(conn, MHD_HTTP_OK, "ok\n");
}

static enum MHD_Result handle_put(kv_map *map, struct MHD_Connection *conn, const char *key,
                                  const char *data, size_t *data_size, void **con_cls) {
  request *req = *con_cls;
  if (!req) { /* first call: headers only */
    if (declared_too_large(conn))
      return reply(conn, MHD_HTTP_CONTENT_TOO_LARGE, "value larger than 64 MiB\n");
    if (!(req = calloc(1, sizeof *req)))
      return MHD_NO;
    *con_cls = req;
    return MHD_YES;
  }
  if (*data_size) {
    append_body(req, data, *data_size);
    *data_size = 0;
    return MHD_YES;
  }
  return finish_put(map, conn, key, req);
}

static enum MHD_Result handle_get(kv_map *map, struct MHD_Connection *conn, const char *key) {
  char *value = NULL;
  size_t len = 0;
  int rc = map_get(map, key, &value, &len);
  if (rc < 0)
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  if (rc == 0)
    return reply(conn, MHD_HTTP_NOT_FOUND, "not found\n");
  return reply_value(conn, value, len);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **con_cls) {
  kv_map *map = cls;
  const char *key = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "key");
  int is_put = strcmp(method, MHD_HTTP_METHOD_PUT) == 0;
  /* A body on anything but PUT is read and ignored before replying. */
  if (!is_put && *data_size) {
    *data_size = 0;
    return MHD_YES;
  }
  if (!key || !*key)
    return reply(conn, MHD_HTTP_BAD_REQUEST, "missing ?key= parameter\n");
  if (is_put)
    return handle_put(map, conn, key, data, data_size, con_cls);
  if (strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0)
    return handle_get(map, conn, key);
  if (strcmp(method, MHD_HTTP_METHOD_DELETE) == 0) {
    FERRY_DEBUG("metadata-server: DELETE %s", key);
    int rc = map_delete(map, key);
    if (rc == -2)
      return state_error(map, conn);
    return rc ? reply(conn, MHD_HTTP_OK, "ok\n") : reply(conn, MHD_HTTP_NOT_FOUND, "not found\n");
  }
  return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "use GET, PUT or DELETE\n");
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  request *req = *con_cls;
  if (req) {
    free(req->body);
    free(req);
    *con_cls = NULL;
  }
}

/* ---- command line and lifetime ------------------------------------------- */

typedef struct options {
  const char *host;
  unsigned port;
  const char *state; /* --state FILE, or NULL */
} options;

static void usage(FILE *f) {
  fprintf(f, "usage: ferry metadata-server [--host ADDR] [--port N] [--state FILE]\n"
             "  In-memory http metadata store (GET|PUT|DELETE ?key=K, PUT &ttl=MS).\n"
             "  --host ADDR  address to listen on (default 127.0.0.1)\n"
             "  --port N     port to listen on, 0 picks a free one (default 8080)\n"
             "  --state FILE keep the keys in FILE too, so a restart loses nothing\n"
             "Prints one line \"ready metadata-server url=http://HOST:PORT/metadata\"\n"
             "and serves until SIGINT or SIGTERM.\n");
}

/* Returns 0 to run, 1 for --help, 2 on a usage error (serve.c's convention). */
static int parse_options(int argc, char **argv, options *opt) {
  static const struct option longopts[] = {{"host", required_argument, NULL, 'H'},
                                           {"port", required_argument, NULL, 'p'},
                                           {"state", required_argument, NULL, 's'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  opt->host = "127.0.0.1";
  opt->port = 8080;
  opt->state = NULL;
  unsigned long n;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'H': opt->host = optarg; break;
    case 's': opt->state = optarg; break;
    case 'h': return 1;
    case 'p':
      if (ferry_cli_parse_count(optarg, 0, 65535, &n) != 0)
        return ferry_cli_bad_value(PROG, "port", optarg);
      opt->port = (unsigned)n;
      break;
    default: return 2;
    }
  }
  return ferry_cli_no_operands(PROG, argc, argv);
}

/* Resolves host (numeric or a name) to the first usable socket address. */
static int resolve(const char *host, unsigned port, struct sockaddr_storage *ss) {
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0) {
    fprintf(stderr, PROG ": cannot resolve \"%s\": %s\n", host, gai_strerror(rc));
    return -1;
  }
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  if (ss->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
  else
    ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
  freeaddrinfo(res);
  return 0;
}

static struct MHD_Daemon *start_daemon(const options *opt, kv_map *map) {
  struct sockaddr_storage ss;
  if (resolve(opt->host, opt->port, &ss) != 0)
    return NULL;
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  if (ss.ss_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, (uint16_t)opt->port, NULL, NULL, on_request, map, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)POOL_THREADS,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_COMPLETED,
      on_completed, NULL, MHD_OPTION_END);
  if (!d)
    fprintf(stderr, PROG ": cannot listen on %s:%u (in use or not local?)\n", opt->host, opt->port);
  return d;
}

static void print_ready(const options *opt, struct MHD_Daemon *d) {
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  unsigned port = info ? info->port : opt->port;
  int v6 = strchr(opt->host, ':') != NULL; /* a literal IPv6 address needs brackets */
  printf("ready metadata-server url=http://%s%s%s:%u/metadata\n", v6 ? "[" : "", opt->host,
         v6 ? "]" : "", port);
  fflush(stdout);
}

int ferry_cmd_metadata_server(int argc, char **argv) {
  options opt;
  int rc = parse_options(argc, argv, &opt);
  if (rc != 0)
    return ferry_cli_usage_exit(rc, usage);

  /* Before MHD starts its threads, so that they inherit the mask. */
  sigset_t stop;
  ferry_cli_block_stop_signals(&stop);
  signal(SIGPIPE, SIG_IGN); /* a client that hangs up must not kill us */

  kv_map map;
  if (map_init(&map) != 0) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  map.state_path = opt.state;
  if (opt.state && load_state(&map) != 0) {
    map_free(&map);
    return 1;
  }
  struct MHD_Daemon *d = start_daemon(&opt, &map);
  if (!d) {
    map_free(&map);
    return 1;
  }
  print_ready(&opt, d);

  /* Expired keys are dropped between signals. */
  const struct timespec sweep = {0, SWEEP_NS};
  int sig;
  while ((sig = sigtimedwait(&stop, NULL, &sweep)) <= 0)
    map_sweep(&map);
  MHD_stop_daemon(d); /* joins the pool threads: the map is ours alone after */
  FERRY_INFO("metadata-server: signal %d, stopped (%zu keys dropped)", sig, map.count);
  map_free(&map);
  return 0;
}
