/* offload.c - the client's side of client-owned SSD offload (offload.h,
 * docs/store.md "Client-owned SSD offload"). A thread asks the master for
 * this client's tasks on a connection of its own (a long poll: the master
 * answers as soon as a task is queued, so the client's own calls never
 * wait behind it), then does them one after the other:
 *
 *   OFFLOAD  write the value at addr (a replica in this client's segment)
 *            to the key's file in the directory;
 *   LOAD     read the key's file into addr (space the master took in the
 *            segment for a get that waits for it);
 *   DELETE   delete the key's file (the object left the store);
 *
 * and reports what became of each (OFFLOAD_DONE). No byte crosses the
 * network here: the segment is this process's memory. Readers then READ
 * the loaded replica over ferry like any other: no new listener, nothing
 * but the object's own bytes exposed, the staging bounded by the segment.
 * Files: disk.h's format (a hash of the key as the name, a header with the
 * key, size and crc32c checked on every load). */
#include "store/offload.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "store/client.h"
#include "store/disk.h"
#include "store/protocol.h"

#define POLL_WAIT_MS 250 /* a poll's wait at the master: also how long close waits */
#define POLL_MAX 64      /* tasks taken per poll */
#define REPORT_MAX 256   /* files told per OFFLOAD_DONE of a report */

/* A file this client wrote, in the order written (the capacity's FIFO). */
typedef struct written {
  struct written *next;
  size_t key_len;
  char key[];
} written;

struct store_offload {
  ferry_store *s;    /* the client whose segment this serves */
  ferry_store *conn; /* the offload connection: a client without segment, on the same engine */
  char dir[STORE_DIR_MAX];
  pthread_t thread;
  int started;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int closing;
  int failing; /* the last poll failed (its WARN logged once per outage) */
  /* The directory's capacity (0: none): the bytes of the files this
   * client wrote and still holds, and those files, oldest first (an entry
   * whose file is gone is skipped when its turn comes). */
  uint64_t capacity, used;
  written *oldest, **newest;
};

/* One task as the master handed it. */
typedef struct job {
  uint8_t kind;
  char key[STORE_KEY_MAX + 1];
  size_t key_len;
  uint64_t addr, size;
  int32_t outcome;
} job;

/* The request's head: op, this client's segment and its nonce (the proof
 * that the offload connection speaks for that segment). */
static void put_head(store_offload *o, store_writer *w, uint8_t op) {
  const char *name = ferry_engine_name(o->s->engine);
  store_put_u8(w, op);
  store_put_str(w, name, strnlen(name, STORE_NAME_MAX));
  store_put_u64(w, o->s->segment_nonce);
}

/* One poll: the tasks into jobs (malloc'd), their count into *n. */
static ferry_status poll_tasks(store_offload *o, uint32_t wait_ms, job **jobs, size_t *n) {
  store_writer w = {0};
  put_head(o, &w, STORE_OFFLOAD_POLL);
  store_put_u32(&w, wait_ms);
  store_put_u32(&w, POLL_MAX);
  ferry_frame_header h;
  uint8_t *body = NULL;
  *jobs = NULL;
  *n = 0;
  ferry_status st = store_request(o->conn, &w, 0, &h, &body, "store OFFLOAD_POLL");
  if (st)
    return st;
  store_reader r = {body, (size_t)h.body_len, 0};
  uint32_t count = store_get_u32(&r);
  if (count > POLL_MAX || !(*jobs = calloc(count ? count : 1, sizeof **jobs))) {
    free(body);
    return ferry_fail(count > POLL_MAX ? FERRY_EPROTO : FERRY_ENOMEM,
                      "store OFFLOAD_POLL: %u tasks from store master %s (at most %d asked)", count,
                      o->s->master, POLL_MAX);
  }
  for (uint32_t i = 0; i < count && !r.bad; i++) {
    job *j = &(*jobs)[i];
    const char *key;
    j->kind = store_get_u8(&r);
    store_get_str(&r, &key, &j->key_len, STORE_KEY_MAX);
    j->addr = store_get_u64(&r);
    j->size = store_get_u64(&r);
    if (!r.bad)
      memcpy(j->key, key, j->key_len);
  }
  free(body);
  if (r.bad || r.left) {
    free(*jobs);
    *jobs = NULL;
    return ferry_fail(FERRY_EPROTO, "store master %s sent a malformed OFFLOAD_POLL reply",
                      o->s->master);
  }
  *n = count;
  return FERRY_OK;
}

/* ---- the directory's capacity -------------------------------------------------------------- */

/* The size of key's file, 0 when there is none. */
static uint64_t file_bytes(store_offload *o, const char *key, size_t key_len) {
  char path[STORE_DISK_PATH_MAX];
  struct stat st;
  if (store_disk_path(o->dir, key, key_len, path) != 0 || stat(path, &st) != 0)
    return 0;
  return (uint64_t)st.st_size;
}

/* Deletes key's file and stops counting it. Every deletion goes here. */
static void forget_file(store_offload *o, const char *key, size_t key_len) {
  uint64_t bytes = file_bytes(o, key, key_len);
  o->used -= bytes < o->used ? bytes : o->used;
  store_disk_remove(o->dir, key, key_len);
}

/* Counts key's file, just written, as the newest. */
static void count_file(store_offload *o, const char *key, size_t key_len) {
  written *w = malloc(sizeof *w + key_len);
  o->used += file_bytes(o, key, key_len);
  if (!w)
    return; /* counted, never chosen to make room: the cap errs on the safe side */
  w->next = NULL;
  w->key_len = key_len;
  memcpy(w->key, key, key_len);
  if (!o->newest)
    o->newest = &o->oldest;
  *o->newest = w;
  o->newest = &w->next;
}

static written *pop_oldest(store_offload *o) {
  written *w = o->oldest;
  if (w && !(o->oldest = w->next))
    o->newest = &o->oldest;
  return w;
}

/* Asks the master to forget this client's copy of w's key (DROP): its
 * status, or -1 when the master did not hear it. */
static int32_t drop_copy(store_offload *o, const written *w) {
  store_writer req = {0};
  put_head(o, &req, STORE_OFFLOAD_DONE);
  store_put_u8(&req, STORE_TASK_DROP);
  store_put_str(&req, w->key, w->key_len);
  store_put_u32(&req, 0);
  ferry_frame_header h;
  uint8_t *body = NULL;
  if (store_request(o->conn, &req, 1, &h, &body, "store OFFLOAD_DONE (drop)") != FERRY_OK)
    return -1;
  store_reader r = {body, (size_t)h.body_len, 0};
  int32_t status = (int32_t)store_get_u32(&r);
  free(body);
  return r.bad ? -1 : status;
}

/* Makes room for a file of need bytes by dropping the oldest files: the
 * master forgets each first (an object left with no replica in memory
 * leaves the store), then the file goes; one a get has loaded back
 * meanwhile (FERRY_EBUSY) stays and counts as the newest. 0 once it fits. */
static int make_room(store_offload *o, uint64_t need) {
  size_t busy = 0; /* in a row: once every file is busy, nothing more can go */
  while (o->used + need > o->capacity && o->oldest && busy < 64) {
    written *w = pop_oldest(o);
    if (!file_bytes(o, w->key, w->key_len)) { /* deleted since: counted out then */
      free(w);
      continue;
    }
    int32_t status = drop_copy(o, w);
    if (status == -1) { /* the file stays, the oldest still */
      if (!(w->next = o->oldest))
        o->newest = &w->next;
      o->oldest = w;
      return -1;
    }
    if (status == FERRY_EBUSY) {
      busy++;
      w->next = NULL;
      *o->newest = w;
      o->newest = &w->next;
      continue;
    }
    busy = 0;
    forget_file(o, w->key, w->key_len);
    free(w);
  }
  return o->used + need > o->capacity ? -1 : 0;
}

/* Writes an offload's file, within the capacity. */
static ferry_status write_file(store_offload *o, job *j, const ferry_store_buffer *part) {
  uint64_t need = store_disk_file_size(j->key_len, part->length);
  forget_file(o, j->key, j->key_len); /* a file of the key left behind is replaced */
  if (o->capacity && (need > o->capacity || make_room(o, need) != 0))
    return ferry_fail(FERRY_ENOMEM,
                      "store offload: no room for \"%s\" (%llu bytes) in %s: the files kept "
                      "hold %llu of its %llu bytes (offload_max_bytes, "
                      "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES) and none can be dropped now; it "
                      "stays in memory only",
                      j->key, (unsigned long long)need, o->dir, (unsigned long long)o->used,
                      (unsigned long long)o->capacity);
  ferry_status st = store_disk_write(o->dir, j->key, part, 1, part->length);
  if (!st)
    count_file(o, j->key, j->key_len);
  return st;
}

/* ---- the files held, told at (re)join ------------------------------------------------------- */

/* Tells the master n files (their keys, sizes) and acts on its answers:
 * one it keeps is counted (the capacity's newest), one it does not is
 * deleted. */
static ferry_status report_some(store_offload *o, const job *files, size_t n) {
  store_writer w = {0};
  put_head(o, &w, STORE_OFFLOAD_DONE);
  for (size_t i = 0; i < n; i++) {
    store_put_u8(&w, STORE_TASK_REPORT);
    store_put_str(&w, files[i].key, files[i].key_len);
    store_put_u32(&w, 0);
    store_put_u64(&w, files[i].size);
  }
  ferry_frame_header h;
  uint8_t *body = NULL;
  ferry_status st =
      store_request(o->conn, &w, (uint32_t)n, &h, &body, "store OFFLOAD_DONE (the files held)");
  if (st)
    return st;
  store_reader r = {body, (size_t)h.body_len, 0};
  for (size_t i = 0; i < n; i++) {
    int32_t status = (int32_t)store_get_u32(&r);
    if (r.bad)
      break;
    if (status == FERRY_OK)
      count_file(o, files[i].key, files[i].key_len);
    else /* a newer value of the key is in the store, or no room for the record */
      forget_file(o, files[i].key, files[i].key_len);
  }
  free(body);
  return r.bad ? ferry_fail(FERRY_EPROTO, "store master %s sent a malformed OFFLOAD_DONE reply",
                            o->s->master)
               : FERRY_OK;
}

/* Tells the master every file in the directory (disk.h's, named by its
 * key): a restarted master takes them back as disk-only objects of this
 * client, and so does one this client's earlier process left them to.
 * The capacity's count starts over from what the master keeps (in the
 * directory's order). A file that is not one of ours is left alone. */
static ferry_status report_files(store_offload *o) {
  DIR *d = opendir(o->dir);
  if (!d)
    return ferry_fail_errno(FERRY_EINVAL, errno, "store offload: cannot list %s", o->dir);
  job *files = calloc(REPORT_MAX, sizeof *files);
  if (!files) {
    closedir(d);
    return ferry_fail(FERRY_ENOMEM, "store offload: out of memory");
  }
  for (written *w; (w = pop_oldest(o));)
    free(w);
  o->used = 0;
  ferry_status st = FERRY_OK;
  size_t n = 0, total = 0;
  for (struct dirent *e; !st && (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    job *f = &files[n];
    if (len < 4 || strcmp(e->d_name + len - 3, ".kv") != 0 ||
        store_disk_header(o->dir, e->d_name, f->key, &f->key_len, &f->size) != 0)
      continue;
    total++;
    if (++n == REPORT_MAX) {
      st = report_some(o, files, n);
      n = 0;
    }
  }
  if (!st && n)
    st = report_some(o, files, n);
  closedir(d);
  free(files);
  if (!st && total)
    FERRY_INFO("store offload: told store master %s of the %zu file(s) in %s", o->s->master, total,
               o->dir);
  return st;
}

/* ---- tasks ------------------------------------------------------------------------------------
 */

/* Whether [addr, addr + size) lies in this client's segment: the master
 * names only that memory; anything else is refused, not touched. */
static int in_segment(const ferry_store *s, uint64_t addr, uint64_t size) {
  uint64_t base = (uint64_t)(uintptr_t)s->segment;
  return size > 0 && addr >= base && size <= s->segment_size &&
         addr - base <= s->segment_size - size;
}

static void do_job(store_offload *o, job *j) {
  ferry_store_buffer part = {(void *)(uintptr_t)j->addr, (size_t)j->size};
  int bad = 0;
  ferry_status st = FERRY_OK;
  if (j->kind == STORE_TASK_DELETE) {
    forget_file(o, j->key, j->key_len);
  } else if (!in_segment(o->s, j->addr, j->size)) {
    st = ferry_fail(FERRY_EPROTO,
                    "store offload: the master named 0x%llx (+%llu bytes) for \"%s\", outside "
                    "this client's segment",
                    (unsigned long long)j->addr, (unsigned long long)j->size, j->key);
  } else if (j->kind == STORE_TASK_OFFLOAD) {
    st = write_file(o, j, &part);
  } else if (j->kind == STORE_TASK_LOAD) {
    st = store_disk_read(o->dir, j->key, &part, 1, part.length, &bad);
  } else {
    st = ferry_fail(FERRY_EPROTO, "store offload: unknown task %u for \"%s\"", j->kind, j->key);
  }
  if (st)
    FERRY_WARN("store offload: %s", ferry_last_error());
  j->outcome = st;
}

/* Tells the master what became of the jobs; the file of each one it does
 * not keep (its object left or changed meanwhile, or the write failed) is
 * deleted. */
static void report(store_offload *o, job *jobs, size_t n) {
  store_writer w = {0};
  size_t sent = 0;
  put_head(o, &w, STORE_OFFLOAD_DONE);
  for (size_t i = 0; i < n; i++) {
    if (jobs[i].kind == STORE_TASK_DELETE)
      continue;
    store_put_u8(&w, jobs[i].kind);
    store_put_str(&w, jobs[i].key, jobs[i].key_len);
    store_put_u32(&w, (uint32_t)jobs[i].outcome);
    jobs[sent++] = jobs[i];
  }
  if (sent == 0) {
    store_writer_free(&w);
    return;
  }
  ferry_frame_header h;
  uint8_t *body = NULL;
  if (store_request(o->conn, &w, (uint32_t)sent, &h, &body, "store OFFLOAD_DONE") != FERRY_OK) {
    FERRY_WARN("store offload: %s", ferry_last_error()); /* the master drops the tasks with us */
    return;
  }
  store_reader r = {body, (size_t)h.body_len, 0};
  for (size_t i = 0; i < sent; i++) {
    int32_t status = (int32_t)store_get_u32(&r);
    if (!r.bad && status != FERRY_OK) /* not kept: an offload not wanted, a load that failed */
      forget_file(o, jobs[i].key, jobs[i].key_len);
  }
  free(body);
}

/* Waits ms or until closing; nonzero once closing. */
static int pause_or_close(store_offload *o, uint64_t ms) {
  pthread_mutex_lock(&o->lock);
  struct timespec at = ferry_timespec(ferry_now_ns() + ms * 1000000ull);
  while (!o->closing && pthread_cond_timedwait(&o->cond, &o->lock, &at) == 0)
    ;
  int closing = o->closing;
  pthread_mutex_unlock(&o->lock);
  return closing;
}

static int closing(store_offload *o) {
  pthread_mutex_lock(&o->lock);
  int c = o->closing;
  pthread_mutex_unlock(&o->lock);
  return c;
}

static void *offload_main(void *arg) {
  store_offload *o = arg;
  while (!closing(o)) {
    job *jobs;
    size_t n;
    /* Back after a failed poll: perhaps to a restarted master, which
     * learns this client's files before it hands out a task. */
    ferry_status st = o->failing ? report_files(o) : FERRY_OK;
    if (!st)
      st = poll_tasks(o, POLL_WAIT_MS, &jobs, &n);
    if (st != FERRY_OK) {
      /* The master restarted or is away: its segment comes back with the
       * client's next call; try again after a PING interval. */
      if (!o->failing++)
        FERRY_WARN("store offload: %s; trying again every PING interval", ferry_last_error());
      if (pause_or_close(o, __atomic_load_n(&o->s->ping_ms, __ATOMIC_RELAXED)))
        break;
      continue;
    }
    if (o->failing)
      FERRY_INFO("store offload: polling store master %s again", o->s->master);
    o->failing = 0;
    for (size_t i = 0; i < n; i++)
      do_job(o, &jobs[i]);
    report(o, jobs, n);
    free(jobs);
  }
  return NULL;
}

ferry_status store_offload_start(ferry_store *s, const char *dir, uint64_t capacity,
                                 store_offload **out) {
  if (!s->segment_size)
    return ferry_fail(FERRY_EINVAL,
                      "ferry_store_open: offload_dir %s given without a segment "
                      "(segment_size 0): offload keeps copies of this client's "
                      "segment",
                      dir);
  store_offload *o = calloc(1, sizeof *o);
  if (!o)
    return ferry_fail(FERRY_ENOMEM, "ferry_store_open: out of memory");
  o->s = s;
  o->capacity = capacity;
  pthread_mutex_init(&o->lock, NULL);
  ferry_cond_init(&o->cond);
  ferry_status st = store_disk_own_dir("offload directory", dir, o->dir, sizeof o->dir);
  if (!st)
    st = store_open_connection(s, &o->conn);
  if (!st) /* files an earlier process of this client left */
    st = report_files(o);
  job *jobs = NULL;
  size_t n = 0;
  if (!st) /* the master now knows this segment offloads: puts into it from here on are copied */
    st = poll_tasks(o, 0, &jobs, &n);
  if (!st) {
    for (size_t i = 0; i < n; i++)
      do_job(o, &jobs[i]);
    report(o, jobs, n);
  }
  free(jobs);
  if (!st && pthread_create(&o->thread, NULL, offload_main, o) != 0)
    st = ferry_fail(FERRY_ENOMEM, "ferry_store_open: cannot start the offload thread");
  o->started = !st;
  if (st) {
    char detail[FERRY_ERROR_MAX];
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
    store_offload_stop(o);
    return ferry_fail(st, "%s", detail);
  }
  FERRY_INFO("store: %s offloads to %s", ferry_engine_name(s->engine), o->dir);
  *out = o;
  return FERRY_OK;
}

void store_offload_stop(store_offload *o) {
  if (!o)
    return;
  pthread_mutex_lock(&o->lock);
  o->closing = 1;
  pthread_cond_signal(&o->cond);
  pthread_mutex_unlock(&o->lock);
  if (o->started)
    pthread_join(o->thread, NULL);
  ferry_store_close(o->conn);
  for (written *w; (w = pop_oldest(o));)
    free(w);
  pthread_cond_destroy(&o->cond);
  pthread_mutex_destroy(&o->lock);
  free(o);
}
