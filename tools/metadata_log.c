/* metadata_log.c - see metadata_log.h.
 *
 * The file is a magic line, then records "OP KEYLEN VALUELEN TTL CRC\n",
 * the key, the value and "\n": OP '+' stores the value, '-' deletes the
 * key (no value); CRC is the crc32c (hex) of the line before it and of the
 * key and value. A crash can leave only the last record cut short or half
 * written: one that runs past the end of the file, or the last one with a
 * bad crc or terminator, is dropped with a WARN. Anything else that does
 * not parse is damage, and the server refuses to start rather than lose
 * keys silently. A version 1 file (a snapshot of records without OP and
 * CRC) is read and rewritten in this format.
 *
 * Appends go in batches: the writer takes everything queued, writes it with
 * one writev per 64 records and syncs once (a failed batch is cut off the
 * file again and refused). A compaction takes its snapshot under the
 * store's lock (references, not copies of the values), writes it to FILE.tmp
 * with no lock held, then, with the writer paused between batches, adds
 * the changes the writer appended since the snapshot, syncs and renames it
 * over FILE. */
#include "metadata_log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/log.h"
#include "wire/wire.h"

#define PROG "ferry metadata-server"
#define MAGIC_V1 "ferry-metadata-state 1\n"
#define MAGIC "ferry-metadata-state 2\n"
#define COMPACT_MIN ((off_t)1 << 20) /* a file this much past twice its live keys is compacted */
#define KEY_MAX 65536
#define HEADER_MAX 96
#define OUT_RECORDS 64

struct md_record {
  md_record *next;
  uint64_t seq;
  unsigned refs; /* under the log's lock: the queue's, and a waiter's */
  char op;
  uint32_t ttl_ms;
  char *key;
  md_value *value; /* NULL for '-' */
  int done, error;
};

struct md_log {
  char *path;
  md_snapshot_fn snapshot;
  void *arg;
  /* The file: held across a batch's write and sync and a compaction's
   * switch, never across a store lock. Taken before lock. */
  pthread_mutex_t io;
  int fd; /* appends */
  off_t bytes, compact_at;
  pthread_mutex_t lock; /* everything below */
  pthread_cond_t queued, written, wanted;
  md_record *head, *tail;
  uint64_t seq; /* of the last change queued */
  /* A compaction's snapshot holds the changes up to mark; those the writer
   * appends past it are carried into the new file. */
  int compacting, compact_wanted, stopping;
  uint64_t mark;
  md_record *carry, **carry_tail;
  pthread_t writer, compactor;
  int threads; /* started: 0, 1 (the writer) or 2 */
};

/* ---- values and records ---------------------------------------------------- */

md_value *md_value_alloc(size_t cap) {
  md_value *v = malloc(sizeof *v + (cap ? cap : 1));
  if (v) {
    v->refs = 1;
    v->len = 0;
  }
  return v;
}

md_value *md_value_ref(md_value *v) {
  __atomic_add_fetch(&v->refs, 1, __ATOMIC_RELAXED);
  return v;
}

void md_value_unref(md_value *v) {
  if (v && __atomic_sub_fetch(&v->refs, 1, __ATOMIC_ACQ_REL) == 0)
    free(v);
}

/* Drops one reference; the log's lock held (or no thread but this one). */
static void release(md_record *r) {
  if (--r->refs)
    return;
  free(r->key);
  md_value_unref(r->value);
  free(r);
}

/* Drops a reference to each record of a list. */
static void release_list(md_log *log, md_record *r) {
  pthread_mutex_lock(&log->lock);
  while (r) {
    md_record *next = r->next;
    release(r);
    r = next;
  }
  pthread_mutex_unlock(&log->lock);
}

/* ---- writing records ------------------------------------------------------- */

/* Records gathered for one writev: four pieces each. */
typedef struct out {
  int fd, error;
  unsigned n;
  off_t bytes; /* written so far */
  char headers[OUT_RECORDS][HEADER_MAX];
  struct iovec iov[OUT_RECORDS * 4];
} out;

/* The header line of a record; its length. */
static size_t record_header(char *header, char op, const char *key, size_t klen, const char *value,
                            size_t vlen, uint32_t ttl_ms) {
  int n = snprintf(header, HEADER_MAX, "%c %zu %zu %u ", op, klen, vlen, ttl_ms);
  uint32_t crc =
      ferry_crc32c(ferry_crc32c(ferry_crc32c(0, header, (size_t)n), key, klen), value, vlen);
  return (size_t)n + (size_t)snprintf(header + n, HEADER_MAX - (size_t)n, "%08x\n", crc);
}

static void out_flush(out *o) {
  struct iovec *iov = o->iov;
  int count = (int)o->n * 4;
  while (count > 0 && !o->error) {
    ssize_t n = writev(o->fd, iov, count);
    if (n < 0) {
      o->error = errno == EINTR ? 0 : errno;
      continue;
    }
    o->bytes += n;
    while (count > 0 && (size_t)n >= iov->iov_len) {
      n -= (ssize_t)iov->iov_len;
      iov++;
      count--;
    }
    if (count > 0) {
      iov->iov_base = (char *)iov->iov_base + n;
      iov->iov_len -= (size_t)n;
    }
  }
  o->n = 0;
}

/* Adds a record (key and value stay referenced until the next flush). */
static void out_record(out *o, char op, const char *key, const md_value *value, uint32_t ttl_ms) {
  size_t klen = strlen(key), vlen = value ? value->len : 0;
  const char *data = value ? value->data : "";
  char *header = o->headers[o->n];
  struct iovec *iov = &o->iov[o->n * 4];
  iov[0] = (struct iovec){header, record_header(header, op, key, klen, data, vlen, ttl_ms)};
  iov[1] = (struct iovec){(char *)key, klen};
  iov[2] = (struct iovec){(char *)data, vlen};
  iov[3] = (struct iovec){"\n", 1};
  if (++o->n == OUT_RECORDS)
    out_flush(o);
}

/* The magic line, first in a new file. */
static void out_magic(out *o) {
  ssize_t n = write(o->fd, MAGIC, strlen(MAGIC));
  if (n != (ssize_t)strlen(MAGIC))
    o->error = n < 0 ? errno : EIO;
  o->bytes = n > 0 ? n : 0;
}

static void out_records(out *o, const md_record *r) {
  for (; r; r = r->next)
    out_record(o, r->op, r->key, r->value, r->ttl_ms);
  out_flush(o);
}

/* ---- reading records ------------------------------------------------------- */

enum { READ_OK, READ_END, READ_TORN, READ_DAMAGED, READ_NO_MEMORY };

typedef struct reader {
  FILE *f;
  off_t size;
  int v2;
} reader;

/* A version 2 header cut short may be the start of a record a crash cut
 * off; anything else is not. */
static int header_start(const char *line) {
  return (line[0] == '+' || line[0] == '-') &&
         strspn(line + 1, " 0123456789abcdef") == strlen(line + 1);
}

/* The header line: READ_OK, READ_END (none), READ_TORN or READ_DAMAGED. */
static int read_header(reader *rd, char *line, size_t size) {
  size_t n = 0;
  int c = EOF;
  while (n < size - 1 && (c = fgetc(rd->f)) != EOF && c != '\n')
    line[n++] = (char)c;
  line[n] = '\0';
  if (c == EOF)
    return !n ? READ_END : rd->v2 && header_start(line) ? READ_TORN : READ_DAMAGED;
  return c == '\n' ? READ_OK : READ_DAMAGED;
}

static int read_record(reader *rd, char *op, char **key, md_value **value, uint32_t *ttl_ms) {
  char line[HEADER_MAX];
  int rc = read_header(rd, line, sizeof line);
  if (rc != READ_OK)
    return rc;
  size_t klen, vlen;
  unsigned crc = 0;
  int used = 0;
  *op = '+';
  int parsed = rd->v2
                   ? sscanf(line, "%c %zu %zu %u %x%n", op, &klen, &vlen, ttl_ms, &crc, &used) == 5
                   : sscanf(line, "%zu %zu %u%n", &klen, &vlen, ttl_ms, &used) == 3;
  if (!parsed || (size_t)used != strlen(line) || (*op != '+' && *op != '-') || !klen ||
      klen > KEY_MAX || (*op == '-' && vlen))
    return READ_DAMAGED;
  off_t left = rd->size - ftello(rd->f);
  if (left < 0 || (uint64_t)left < (uint64_t)klen + vlen + 1)
    return rd->v2 ? READ_TORN : READ_DAMAGED; /* runs past the end of the file */
  char *k = malloc(klen + 1);
  md_value *v = md_value_alloc(vlen);
  if (!k || !v) {
    free(k);
    md_value_unref(v);
    return READ_NO_MEMORY;
  }
  int whole = fread(k, 1, klen, rd->f) == klen && fread(v->data, 1, vlen, rd->f) == vlen &&
              fgetc(rd->f) == '\n';
  k[klen] = '\0';
  v->len = vlen;
  size_t prefix = (size_t)(strrchr(line, ' ') - line) + 1; /* the line before the crc */
  if (whole && rd->v2)
    whole =
        crc == ferry_crc32c(ferry_crc32c(ferry_crc32c(0, line, prefix), k, klen), v->data, vlen);
  if (!whole) {
    free(k);
    md_value_unref(v);
    /* Half written by a crash only if nothing follows it. */
    return rd->v2 && ftello(rd->f) >= rd->size ? READ_TORN : READ_DAMAGED;
  }
  if (*op == '-') {
    md_value_unref(v);
    v = NULL;
  }
  *key = k;
  *value = v;
  return READ_OK;
}

/* Replays the file, if there is one. 0, or -1 after printing why. */
static int load(md_log *log, md_replay_fn replay) {
  FILE *f = fopen(log->path, "r");
  if (!f && errno == ENOENT)
    return 0;
  char magic[sizeof MAGIC] = "";
  struct stat st;
  reader rd = {f, 0, 0};
  if (f && fstat(fileno(f), &st) == 0 && fgets(magic, sizeof magic, f))
    rd.size = st.st_size;
  rd.v2 = strcmp(magic, MAGIC) == 0;
  if (!f || (!rd.v2 && strcmp(magic, MAGIC_V1) != 0)) {
    fprintf(stderr, PROG ": cannot read state file %s: %s\n", log->path,
            f ? "not a ferry metadata state file" : strerror(errno));
    if (f)
      fclose(f);
    return -1;
  }
  char op, *key;
  md_value *value;
  uint32_t ttl_ms;
  size_t records = 0;
  off_t start = ftello(f);
  int rc;
  while ((rc = read_record(&rd, &op, &key, &value, &ttl_ms)) == READ_OK) {
    rc = replay(log->arg, op, key, value, ttl_ms) == 0 ? READ_OK : READ_NO_MEMORY;
    free(key);
    if (rc != READ_OK)
      break;
    records++;
    start = ftello(f);
  }
  fclose(f);
  if (rc == READ_TORN)
    FERRY_WARN("metadata-server: state file %s: dropped its last record (%lld bytes at byte "
               "%lld), cut short or half written by a crash; the %zu before it are kept",
               log->path, (long long)(rd.size - start), (long long)start, records);
  else if (rc != READ_END)
    fprintf(stderr,
            PROG ": state file %s is %s at byte %lld (after %zu records); refusing to start\n",
            log->path, rc == READ_NO_MEMORY ? "too large for memory" : "damaged", (long long)start,
            records);
  return rc == READ_END || rc == READ_TORN ? 0 : -1;
}

/* ---- compaction -------------------------------------------------------------- */

/* Makes a rename in path's directory durable. */
static int sync_directory(const char *path) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash)
    *(slash == dir ? slash + 1 : slash) = '\0';
  int fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rc = fd >= 0 && fsync(fd) == 0 ? 0 : -1;
  if (fd >= 0)
    close(fd);
  return rc;
}

static void free_items(md_item *items, ssize_t count) {
  for (ssize_t i = 0; i < count; i++) {
    free(items[i].key);
    md_value_unref(items[i].value);
  }
  free(items);
}

/* Ends a compaction: nothing more is carried; returns what was. */
static md_record *end_compaction(md_log *log) {
  pthread_mutex_lock(&log->lock);
  md_record *carry = log->carry;
  log->carry = NULL;
  log->carry_tail = &log->carry;
  log->compacting = 0;
  pthread_mutex_unlock(&log->lock);
  return carry;
}

/* With the writer paused: the changes appended since the snapshot, then
 * the new file in place of the old. 0, or an errno. */
static int switch_files(md_log *log, out *o, const char *tmp) {
  md_record *carry = end_compaction(log);
  out_records(o, carry);
  if (!o->error && (fsync(o->fd) != 0 || rename(tmp, log->path) != 0))
    o->error = errno;
  release_list(log, carry);
  if (o->error)
    return o->error;
  if (sync_directory(log->path) != 0) /* the new file is in place all the same */
    FERRY_WARN("metadata-server: cannot sync the directory of %s: %s; a crash now may bring back "
               "its older version",
               log->path, strerror(errno));
  if (log->fd >= 0)
    close(log->fd);
  log->fd = o->fd;
  log->bytes = o->bytes;
  return 0;
}

/* Rewrites the file from a snapshot of the live keys, while changes go on
 * being appended to the old one; *from and *to: its sizes. 0, or -1 with
 * errno (the old file kept). */
static int compact(md_log *log, off_t *from, off_t *to) {
  md_item *items = NULL;
  ssize_t count = log->snapshot(log->arg, log, &items);
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.tmp", log->path);
  out *o = malloc(sizeof *o);
  int err = count < 0 || !o ? ENOMEM : 0;
  if (o)
    *o = (out){.fd = -1};
  if (!err && (o->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600)) < 0)
    err = errno; /* owner only: the descriptors map segment names to addresses */
  if (!err) {
    out_magic(o);
    for (ssize_t i = 0; i < count; i++)
      out_record(o, '+', items[i].key, items[i].value, items[i].ttl_ms);
    out_flush(o);
  }
  pthread_mutex_lock(&log->io);
  *from = log->bytes;
  if (!err)
    err = switch_files(log, o, tmp);
  *to = log->bytes;
  log->compact_at = (err ? log->bytes : 2 * log->bytes) + COMPACT_MIN; /* failed: not at once */
  pthread_mutex_unlock(&log->io);
  release_list(log, end_compaction(log)); /* (empty unless it failed early) */
  free_items(items, count);
  if (err && o && o->fd >= 0) {
    close(o->fd);
    unlink(tmp);
  }
  free(o);
  errno = err;
  return err ? -1 : 0;
}

static void *compactor_main(void *arg) {
  md_log *log = arg;
  pthread_mutex_lock(&log->lock);
  while (!log->stopping) {
    if (!log->compact_wanted) {
      pthread_cond_wait(&log->wanted, &log->lock);
      continue;
    }
    log->compact_wanted = 0;
    pthread_mutex_unlock(&log->lock);
    off_t from = 0, to = 0;
    if (compact(log, &from, &to) == 0)
      FERRY_INFO("metadata-server: compacted %s from %lld to %lld bytes", log->path,
                 (long long)from, (long long)to);
    else
      FERRY_WARN("metadata-server: cannot compact %s: %s; appending to it goes on", log->path,
                 strerror(errno));
    pthread_mutex_lock(&log->lock);
  }
  pthread_mutex_unlock(&log->lock);
  return NULL;
}

/* ---- appending ------------------------------------------------------------- */

/* Writes and syncs a batch; a batch that fails is cut off the file again.
 * io held. 0, or an errno. */
static int append(md_log *log, md_record *batch, out *o) {
  o->fd = log->fd;
  o->error = 0;
  o->n = 0;
  o->bytes = 0;
  out_records(o, batch);
  if (!o->error && fdatasync(log->fd) != 0)
    o->error = errno;
  if (!o->error) {
    log->bytes += o->bytes;
    return 0;
  }
  FERRY_WARN("metadata-server: cannot write %s: %s; the changes of this write are refused",
             log->path, strerror(o->error));
  if (ftruncate(log->fd, log->bytes) != 0)
    FERRY_WARN("metadata-server: cannot cut %s back to %lld bytes: %s; it is rewritten next",
               log->path, (long long)log->bytes, strerror(errno));
  return o->error;
}

/* A written batch: its waiters are told, and the changes past a
 * compaction's snapshot are kept to be carried. Both locks held. */
static void settle(md_log *log, md_record *batch, int err) {
  while (batch) {
    md_record *r = batch;
    batch = r->next;
    r->next = NULL;
    r->done = 1;
    r->error = err;
    if (!err && log->compacting && r->seq > log->mark) {
      *log->carry_tail = r; /* the queue's reference goes with it */
      log->carry_tail = &r->next;
    } else {
      release(r);
    }
  }
  if (err || (!log->compacting && log->bytes >= log->compact_at)) {
    log->compact_wanted = 1; /* a failed write may have left a torn record: rewrite */
    pthread_cond_signal(&log->wanted);
  }
  pthread_cond_broadcast(&log->written);
}

static void *writer_main(void *arg) {
  md_log *log = arg;
  out *o = malloc(sizeof *o);
  pthread_mutex_lock(&log->lock);
  for (;;) {
    while (!log->head && !log->stopping)
      pthread_cond_wait(&log->queued, &log->lock);
    md_record *batch = log->head;
    if (!batch)
      break; /* stopping, and all written */
    log->head = log->tail = NULL;
    pthread_mutex_unlock(&log->lock);
    pthread_mutex_lock(&log->io);
    int err = o ? append(log, batch, o) : ENOMEM;
    pthread_mutex_lock(&log->lock);
    settle(log, batch, err);
    pthread_mutex_unlock(&log->io);
  }
  pthread_mutex_unlock(&log->lock);
  free(o);
  return NULL;
}

int md_log_append(md_log *log, char op, const char *key, md_value *value, uint32_t ttl_ms,
                  md_record **wait) {
  md_record *r = calloc(1, sizeof *r);
  char *copy = r ? strdup(key) : NULL;
  if (!copy) {
    free(r);
    return -1;
  }
  r->op = op;
  r->key = copy;
  r->value = value ? md_value_ref(value) : NULL;
  r->ttl_ms = ttl_ms;
  r->refs = wait ? 2 : 1;
  pthread_mutex_lock(&log->lock);
  r->seq = ++log->seq;
  if (log->tail)
    log->tail->next = r;
  else
    log->head = r;
  log->tail = r;
  pthread_cond_signal(&log->queued);
  pthread_mutex_unlock(&log->lock);
  if (wait)
    *wait = r;
  return 0;
}

int md_log_wait(md_log *log, md_record *r) {
  pthread_mutex_lock(&log->lock);
  while (!r->done)
    pthread_cond_wait(&log->written, &log->lock);
  int err = r->error;
  release(r);
  pthread_mutex_unlock(&log->lock);
  return err;
}

void md_log_mark(md_log *log) {
  pthread_mutex_lock(&log->lock);
  log->compacting = 1;
  log->mark = log->seq;
  pthread_mutex_unlock(&log->lock);
}

/* ---- open and close ---------------------------------------------------------- */

static void log_free(md_log *log) {
  if (log->fd >= 0)
    close(log->fd);
  release_list(log, log->carry);
  pthread_mutex_destroy(&log->io);
  pthread_mutex_destroy(&log->lock);
  pthread_cond_destroy(&log->queued);
  pthread_cond_destroy(&log->written);
  pthread_cond_destroy(&log->wanted);
  free(log->path);
  free(log);
}

md_log *md_log_open(const char *path, md_replay_fn replay, md_snapshot_fn snapshot, void *arg) {
  md_log *log = calloc(1, sizeof *log);
  if (!log || !(log->path = strdup(path))) {
    fprintf(stderr, PROG ": out of memory\n");
    free(log);
    return NULL;
  }
  log->snapshot = snapshot;
  log->arg = arg;
  log->fd = -1;
  log->carry_tail = &log->carry;
  pthread_mutex_init(&log->io, NULL);
  pthread_mutex_init(&log->lock, NULL);
  pthread_cond_init(&log->queued, NULL);
  pthread_cond_init(&log->written, NULL);
  pthread_cond_init(&log->wanted, NULL);
  if (load(log, replay) != 0) {
    log_free(log);
    return NULL;
  }
  /* Written back at once: a version 1 file or a torn record is gone, and
   * appends start from a clean end. */
  off_t from, to;
  if (compact(log, &from, &to) != 0) {
    fprintf(stderr, PROG ": cannot write state file %s: %s\n", path, strerror(errno));
    log_free(log);
    return NULL;
  }
  if (pthread_create(&log->writer, NULL, writer_main, log) == 0)
    log->threads = 1;
  if (log->threads && pthread_create(&log->compactor, NULL, compactor_main, log) == 0)
    log->threads = 2;
  if (log->threads < 2) {
    fprintf(stderr, PROG ": cannot start the state file's threads\n");
    md_log_close(log);
    return NULL;
  }
  return log;
}

void md_log_close(md_log *log) {
  pthread_mutex_lock(&log->lock);
  log->stopping = 1;
  pthread_cond_signal(&log->queued);
  pthread_cond_signal(&log->wanted);
  pthread_mutex_unlock(&log->lock);
  if (log->threads > 0)
    pthread_join(log->writer, NULL);
  if (log->threads > 1)
    pthread_join(log->compactor, NULL);
  log_free(log);
}
