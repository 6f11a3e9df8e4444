/* metadata_server.c - `ferry metadata-server`: a small in-memory key/value
 * store speaking the http metadata protocol of Mooncake's Transfer Engine.
 *
 *   GET    <any path>?key=K   200 + value, or 404
 *   PUT    <any path>?key=K   stores the request body (at most 64 MiB, else 413)
 *   DELETE <any path>?key=K   200, or 404
 *   no key parameter          400
 *
 * Engines started with metadata_url=http://HOST:PORT/metadata publish their
 * segment descriptors here and look up their peers, so a test or a small
 * cluster needs no etcd or redis. Nothing is persisted. libmicrohttpd serves
 * clients from a thread pool; the map is one mutex-protected hash table. Once
 * bound it prints one line, "ready metadata-server url=...", and then serves
 * until SIGINT or SIGTERM, when it exits 0. */
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

#include "cli.h"
#include "commands.h"
#include "core/log.h"

#define PROG "ferry metadata-server"
#define MAX_VALUE ((size_t)64 << 20)
#define POOL_THREADS 4
#define IDLE_TIMEOUT_S 60

/* ---- the key/value map --------------------------------------------------- */

typedef struct entry {
  struct entry *next;
  char *key;
  char *value;
  size_t len;
} entry;

typedef struct kv_map {
  pthread_mutex_t lock;
  entry **buckets;
  size_t nbuckets, count;
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

/* Takes ownership of value. Returns 0, or -1 when out of memory. */
static int map_put(kv_map *m, const char *key, char *value, size_t len) {
  pthread_mutex_lock(&m->lock);
  entry **slot = find_slot(m, key);
  entry *e = *slot;
  if (e) {
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
  pthread_mutex_unlock(&m->lock);
  return 0;
}

/* A private copy of the value (the entry may change once the lock drops).
 * Returns 1 found, 0 missing, -1 out of memory. */
static int map_get(kv_map *m, const char *key, char **value, size_t *len) {
  pthread_mutex_lock(&m->lock);
  entry *e = *find_slot(m, key);
  int rc = 0;
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

static int map_delete(kv_map *m, const char *key) {
  pthread_mutex_lock(&m->lock);
  entry **slot = find_slot(m, key);
  entry *e = *slot;
  if (e) {
    *slot = e->next;
    m->count--;
  }
  pthread_mutex_unlock(&m->lock);
  if (!e)
    return 0;
  free(e->key);
  free(e->value);
  free(e);
  return 1;
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

static enum MHD_Result finish_put(kv_map *map, struct MHD_Connection *conn, const char *key,
                                  request *req) {
  if (req->too_large)
    return reply(conn, MHD_HTTP_CONTENT_TOO_LARGE, "value larger than 64 MiB\n");
  if (req->no_memory)
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  char *value = req->body ? req->body : malloc(1);
  req->body = NULL; /* the map owns it now */
  if (!value || map_put(map, key, value, req->len) != 0)
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
    return map_delete(map, key) ? reply(conn, MHD_HTTP_OK, "ok\n")
                                : reply(conn, MHD_HTTP_NOT_FOUND, "not found\n");
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
} options;

static void usage(FILE *f) {
  fprintf(f, "usage: ferry metadata-server [--host ADDR] [--port N]\n"
             "  In-memory http metadata store (GET|PUT|DELETE ?key=K).\n"
             "  --host ADDR  address to listen on (default 127.0.0.1)\n"
             "  --port N     port to listen on, 0 picks a free one (default 8080)\n"
             "Prints one line \"ready metadata-server url=http://HOST:PORT/metadata\"\n"
             "and serves until SIGINT or SIGTERM.\n");
}

/* Returns 0 to run, 1 for --help, 2 on a usage error (serve.c's convention). */
static int parse_options(int argc, char **argv, options *opt) {
  static const struct option longopts[] = {{"host", required_argument, NULL, 'H'},
                                           {"port", required_argument, NULL, 'p'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  opt->host = "127.0.0.1";
  opt->port = 8080;
  unsigned long n;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'H': opt->host = optarg; break;
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
  struct MHD_Daemon *d = start_daemon(&opt, &map);
  if (!d) {
    map_free(&map);
    return 1;
  }
  print_ready(&opt, d);

  int sig = 0;
  sigwait(&stop, &sig);
  MHD_stop_daemon(d); /* joins the pool threads: the map is ours alone after */
  FERRY_INFO("metadata-server: signal %d, stopped (%zu keys dropped)", sig, map.count);
  map_free(&map);
  return 0;
}
