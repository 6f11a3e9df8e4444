/* redis.c - the redis metadata backend, with hiredis (Debian's maintained
 * client library): SET/GET/DEL of the same keys and JSON as the other
 * stores, leased keys as SET ... PX <ttl> written again by the lease keeper.
 *
 * URL: redis://[user[:password]@]host[:port][/db] (port 6379, db 0); what
 * the URL leaves out comes from Mooncake's MC_REDIS_USERNAME,
 * MC_REDIS_PASSWORD and MC_REDIS_DB_INDEX. Messages show the URL with the
 * password masked.
 *
 * One connection under a mutex: metadata calls are few and on the control
 * path. A broken connection (the server restarted) is dropped and the call
 * retried once on a fresh one, so a store that comes back is used again
 * without restarting the engine.
 *
 * hiredis is loaded when the first redis store opens (base/library.h), so
 * a host without it keeps every other feature. */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend.h"
#include "base/error.h"
#include "base/library.h"

#define DEFAULT_PORT 6379
#define STRINGIFY(x) #x
#define TEXT(x) STRINGIFY(x)

/* The hiredis calls ferry makes, typed by hiredis's own header. */
static struct {
  __typeof__(redisConnectWithTimeout) *ConnectWithTimeout;
  __typeof__(redisSetTimeout) *SetTimeout;
  __typeof__(redisCommandArgv) *CommandArgv;
  __typeof__(freeReplyObject) *FreeReplyObject;
  __typeof__(redisFree) *Free;
} hiredis;

#define SYMBOL(field, name) FERRY_LIBRARY_SYMBOL(__typeof__(hiredis), field, name, NULL)
static const ferry_library_symbol hiredis_symbols[] = {
    SYMBOL(ConnectWithTimeout, "redisConnectWithTimeout"),
    SYMBOL(SetTimeout, "redisSetTimeout"),
    SYMBOL(CommandArgv, "redisCommandArgv"),
    SYMBOL(FreeReplyObject, "freeReplyObject"),
    SYMBOL(Free, "redisFree"),
};

/* The soname and Debian package follow the headers built against:
 * libhiredis.so.0.14 in libhiredis0.14 on Debian 12. */
static ferry_library hiredis_library =
    FERRY_LIBRARY("libhiredis.so." TEXT(HIREDIS_SONAME), "libhiredis" TEXT(HIREDIS_SONAME),
                  "the redis metadata store (redis:// URLs)", hiredis_symbols, hiredis);

typedef struct redis_store {
  char url[512]; /* redacted, for messages */
  char host[256];
  int port;
  char *user, *password; /* NULL when not given */
  long db;
  int db_given; /* the URL named a db: MC_REDIS_DB_INDEX does not apply */
  struct timeval connect_tv, command_tv;
  pthread_mutex_t lock; /* guards ctx */
  redisContext *ctx;    /* NULL when not connected */
} redis_store;

static struct timeval tv_of_ms(uint32_t ms) {
  return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

static char *env_or_null(const char *name) {
  const char *v = getenv(name);
  return v && *v ? strdup(v) : NULL;
}

/* user[:password] from the part before '@'. */
static ferry_status parse_userinfo(redis_store *s, const char *p, size_t len) {
  const char *colon = memchr(p, ':', len);
  size_t ulen = colon ? (size_t)(colon - p) : len;
  if (ulen && !(s->user = strndup(p, ulen)))
    return FERRY_ENOMEM;
  if (colon && !(s->password = strndup(colon + 1, len - ulen - 1)))
    return FERRY_ENOMEM;
  return FERRY_OK;
}

/* host[:port] or [v6][:port], then an optional /db. */
static ferry_status parse_hostport(redis_store *s, const char *p) {
  size_t hlen;
  const char *rest;
  if (*p == '[') {
    const char *close = strchr(p, ']');
    if (!close)
      return FERRY_EINVAL;
    hlen = (size_t)(close - p - 1);
    p++;
    rest = close + 1;
  } else {
    hlen = strcspn(p, ":/");
    rest = p + hlen;
  }
  if (!hlen || hlen >= sizeof s->host)
    return FERRY_EINVAL;
  memcpy(s->host, p, hlen);
  s->host[hlen] = '\0';
  s->port = DEFAULT_PORT;
  char *end;
  if (*rest == ':') {
    long port = strtol(rest + 1, &end, 10);
    if (end == rest + 1 || port < 1 || port > 65535)
      return FERRY_EINVAL;
    s->port = (int)port;
    rest = end;
  }
  if (*rest == '/' && rest[1]) {
    s->db = strtol(rest + 1, &end, 10);
    if (end == rest + 1 || *end || s->db < 0)
      return FERRY_EINVAL;
    s->db_given = 1;
  } else if (*rest && strcmp(rest, "/") != 0) {
    return FERRY_EINVAL;
  }
  return FERRY_OK;
}

static ferry_status parse_url(redis_store *s, const char *url) {
  const char *p = url + strlen("redis://");
  const char *at = strchr(p, '@');
  ferry_status st = at ? parse_userinfo(s, p, (size_t)(at - p)) : FERRY_OK;
  if (st == FERRY_OK)
    st = parse_hostport(s, at ? at + 1 : p);
  if (st == FERRY_EINVAL)
    return ferry_fail(FERRY_EINVAL,
                      "metadata store \"%s\": expected redis://[user[:password]@]host[:port][/db]",
                      s->url);
  if (st == FERRY_OK && !s->user)
    s->user = env_or_null("MC_REDIS_USERNAME");
  if (st == FERRY_OK && !s->password)
    s->password = env_or_null("MC_REDIS_PASSWORD");
  const char *db = getenv("MC_REDIS_DB_INDEX");
  if (st == FERRY_OK && !s->db_given && db && *db)
    s->db = strtol(db, NULL, 10);
  return st == FERRY_ENOMEM ? ferry_fail(FERRY_ENOMEM, "metadata store %s: out of memory", s->url)
                            : st;
}

/* A reply that is an error, as a status; NOAUTH and WRONGPASS say so. */
static ferry_status reply_error(redis_store *s, const char *step, const redisReply *r) {
  if (strncmp(r->str, "NOAUTH", 6) == 0)
    return ferry_fail(FERRY_EAUTH,
                      "metadata %s %s: redis requires authentication (%s); give the password in "
                      "the URL or MC_REDIS_PASSWORD",
                      step, s->url, r->str);
  if (strncmp(r->str, "WRONGPASS", 9) == 0 || strstr(r->str, "invalid password") ||
      strstr(r->str, "invalid username"))
    return ferry_fail(FERRY_EAUTH, "metadata %s %s: redis refused the credentials: %s", step,
                      s->url, r->str);
  return ferry_fail(FERRY_EMETADATA, "metadata %s %s: redis error: %s", step, s->url, r->str);
}

/* Runs one command on ctx; *out is the reply (never an error reply). */
static ferry_status command(redis_store *s, const char *step, int argc, const char **argv,
                            redisReply **out) {
  size_t lens[6];
  for (int i = 0; i < argc; i++)
    lens[i] = strlen(argv[i]);
  redisReply *r = hiredis.CommandArgv(s->ctx, argc, argv, lens);
  if (!r)
    return ferry_fail(FERRY_EMETADATA, "metadata %s %s failed: %s", step, s->url,
                      s->ctx->errstr[0] ? s->ctx->errstr : "connection lost");
  if (r->type == REDIS_REPLY_ERROR) {
    ferry_status st = reply_error(s, step, r);
    hiredis.FreeReplyObject(r);
    return st;
  }
  *out = r;
  return FERRY_OK;
}

static ferry_status simple(redis_store *s, const char *step, int argc, const char **argv) {
  redisReply *r = NULL;
  ferry_status st = command(s, step, argc, argv, &r);
  hiredis.FreeReplyObject(r);
  return st;
}

/* Connects, authenticates and selects the db; called with the lock. */
static ferry_status connect_store(redis_store *s) {
  s->ctx = hiredis.ConnectWithTimeout(s->host, s->port, s->connect_tv);
  ferry_status st = FERRY_OK;
  if (!s->ctx)
    st = ferry_fail(FERRY_ENOMEM, "metadata store %s: out of memory", s->url);
  else if (s->ctx->err)
    st = ferry_fail(FERRY_EMETADATA, "metadata store %s: cannot connect: %s", s->url,
                    s->ctx->errstr);
  else if (hiredis.SetTimeout(s->ctx, s->command_tv) != REDIS_OK)
    st = ferry_fail(FERRY_EMETADATA, "metadata store %s: cannot set a timeout", s->url);
  if (st == FERRY_OK && s->password) {
    const char *auth[] = {"AUTH", s->user ? s->user : s->password, s->password};
    st = simple(s, "AUTH", s->user ? 3 : 2, auth);
  }
  if (st == FERRY_OK && s->db) {
    char db[24];
    snprintf(db, sizeof db, "%ld", s->db);
    const char *select[] = {"SELECT", db};
    st = simple(s, "SELECT", 2, select);
  }
  if (st != FERRY_OK && s->ctx) {
    hiredis.Free(s->ctx);
    s->ctx = NULL;
  }
  return st;
}

/* command() on a live connection: connects first if needed, and once more
 * when the connection broke (a restarted server closes it). */
static ferry_status run(redis_store *s, const char *step, int argc, const char **argv,
                        redisReply **out) {
  pthread_mutex_lock(&s->lock);
  ferry_status st = FERRY_OK;
  for (int attempt = 0; attempt < 2; attempt++) {
    int fresh = !s->ctx;
    if (fresh && (st = connect_store(s)) != FERRY_OK)
      break;
    st = command(s, step, argc, argv, out);
    if (st == FERRY_OK || !s->ctx->err)
      break; /* done, or an answer that was an error: the link is fine */
    hiredis.Free(s->ctx);
    s->ctx = NULL;
    if (fresh)
      break;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

static ferry_status redis_put(void *state, const char *key, const char *value, uint32_t ttl_ms) {
  char ttl[16];
  snprintf(ttl, sizeof ttl, "%u", ttl_ms);
  const char *argv[] = {"SET", key, value, "PX", ttl};
  redisReply *r = NULL;
  ferry_status st = run(state, "SET", ttl_ms ? 5 : 3, argv, &r);
  hiredis.FreeReplyObject(r);
  return st;
}

static ferry_status redis_get(void *state, const char *key, char **value) {
  redis_store *s = state;
  const char *argv[] = {"GET", key};
  redisReply *r = NULL;
  ferry_status st = run(s, "GET", 2, argv, &r);
  if (st != FERRY_OK)
    return st;
  if (r->type == REDIS_REPLY_NIL)
    st = ferry_fail(FERRY_ENOTFOUND, "metadata key \"%s\" not found (GET %s)", key, s->url);
  else if (r->type != REDIS_REPLY_STRING)
    st = ferry_fail(FERRY_EJSON, "metadata key \"%s\" at %s: not a string value", key, s->url);
  else if (!(*value = strndup(r->str, r->len)))
    st = ferry_fail(FERRY_ENOMEM, "metadata GET %s: out of memory", key);
  hiredis.FreeReplyObject(r);
  return st;
}

static ferry_status redis_del(void *state, const char *key) {
  redis_store *s = state;
  const char *argv[] = {"DEL", key};
  redisReply *r = NULL;
  ferry_status st = run(s, "DEL", 2, argv, &r);
  if (st == FERRY_OK && r->type == REDIS_REPLY_INTEGER && r->integer == 0)
    st = ferry_fail(FERRY_ENOTFOUND, "metadata key \"%s\" not found (DEL %s)", key, s->url);
  hiredis.FreeReplyObject(r);
  return st;
}

static void redis_close(void *state) {
  redis_store *s = state;
  if (s->ctx)
    hiredis.Free(s->ctx);
  pthread_mutex_destroy(&s->lock);
  free(s->user);
  free(s->password);
  free(s);
}

static const ferry_metadata_ops redis_ops = {
    .scheme = "redis",
    .put = redis_put,
    .get = redis_get,
    .del = redis_del,
    .close = redis_close,
};

ferry_status ferry_metadata_redis_open(const char *url, const ferry_metadata_options *opt,
                                       const ferry_metadata_ops **ops, void **state) {
  ferry_status st = ferry_library_load(&hiredis_library);
  if (st != FERRY_OK)
    return st;
  redis_store *s = calloc(1, sizeof *s);
  if (!s)
    return ferry_fail(FERRY_ENOMEM, "metadata store: out of memory");
  pthread_mutex_init(&s->lock, NULL);
  ferry_metadata_redact(url, s->url, sizeof s->url);
  s->connect_tv = tv_of_ms(opt->connect_timeout_ms);
  s->command_tv = tv_of_ms(opt->connect_timeout_ms + FERRY_METADATA_ANSWER_MS);
  st = parse_url(s, url);
  if (st == FERRY_OK) {
    pthread_mutex_lock(&s->lock);
    st = connect_store(s);
    pthread_mutex_unlock(&s->lock);
  }
  if (st != FERRY_OK) {
    redis_close(s);
    return st;
  }
  *ops = &redis_ops;
  *state = s;
  return FERRY_OK;
}
