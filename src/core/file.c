/* file.c - FILE memory: the public ferry_file_* calls. A registered file
 * (file/file_io.h: its descriptors, ranged preadv/pwritev) is the far side
 * of a ferry_batch whose near side is registered memory, so completion,
 * deadline, wait, status and cancel are the network batches' own
 * (batch.c); only the driving differs: a driver claims a chunk (the
 * chunker's cut: one op, up to file_slice bytes) and moves it with
 * preadv/pwritev, one system call per run that is contiguous in the file.
 * file_queue_depth drivers run on ferry's workers (workers.c), so as many
 * operations are in flight.
 *
 * Unregister is a fence: it marks the file closed and waits until no
 * driver is inside an operation on it (busy); drivers look at closed under
 * the file's lock before each operation, so none starts after. The struct
 * lives on while batches hold references (their handles outlive the
 * registration); its descriptors are closed at the fence. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/sync.h"
#include "batch.h"
#include "file/file_io.h"

/* Operations: an entry up to FILE_SLICE_MAX is one (larger ones are cut);
 * small entries are gathered up to FILE_SLICE_MIN (ferry.h). */
#define FILE_SLICE_MAX ((size_t)16 << 20)
#define FILE_SLICE_MIN ((size_t)256 << 10)
#define FILE_NAME_MAX (FERRY_FILE_PATH_MAX + 32)

struct ferry_file {
  ferry_file_io io;
  char name[FILE_NAME_MAX]; /* "file PATH (fd N)" */
  pthread_mutex_t lock;
  pthread_cond_t idle; /* busy dropped to 0 */
  unsigned refs;       /* the registration, and each batch over the file */
  unsigned busy;       /* drivers inside an operation on it */
  int closed;          /* unregistered: no operation starts */
  struct ferry_file *next;
};

/* ---- lifetime ------------------------------------------------------------------ */

static void file_hold(ferry_file *f) {
  pthread_mutex_lock(&f->lock);
  f->refs++;
  pthread_mutex_unlock(&f->lock);
}

void ferry_file_release(ferry_file *f) {
  if (ferry_unref_last(&f->lock, &f->idle, &f->refs))
    free(f);
}

/* The fence: no operation starts after it, none is still running when it
 * returns; then the descriptors are closed and the registration's
 * reference dropped. */
static void file_close(ferry_file *f) {
  pthread_mutex_lock(&f->lock);
  f->closed = 1;
  while (f->busy)
    pthread_cond_wait(&f->idle, &f->lock);
  pthread_mutex_unlock(&f->lock);
  ferry_file_io_close(&f->io);
  FERRY_DEBUG("%s unregistered", f->name);
  ferry_file_release(f);
}

/* Enters an operation on f; FERRY_ENOTREG once it was unregistered. */
static ferry_status file_enter(ferry_file *f) {
  pthread_mutex_lock(&f->lock);
  int closed = f->closed;
  if (!closed)
    f->busy++;
  pthread_mutex_unlock(&f->lock);
  return closed ? ferry_fail(FERRY_ENOTREG, "%s was unregistered during the batch", f->name)
                : FERRY_OK;
}

static void file_leave(ferry_file *f) {
  pthread_mutex_lock(&f->lock);
  if (--f->busy == 0)
    pthread_cond_broadcast(&f->idle);
  pthread_mutex_unlock(&f->lock);
}

static ferry_status file_register(ferry_engine *e, int fd, unsigned flags, ferry_file **out) {
  if (!e || !out || (flags & ~FERRY_FILE_BUFFERED))
    return ferry_fail(FERRY_EINVAL, "register file: null engine or out, or unknown flags 0x%x",
                      flags);
  ferry_file *f = calloc(1, sizeof *f);
  if (!f)
    return ferry_fail(FERRY_ENOMEM, "no memory to register fd %d", fd);
  ferry_status st = ferry_file_io_open(&f->io, fd, flags & FERRY_FILE_BUFFERED);
  if (st) {
    ferry_file_io_close(&f->io);
    free(f);
    return st;
  }
  ferry_file_io_name(&f->io, f->name, sizeof f->name);
  pthread_mutex_init(&f->lock, NULL);
  ferry_cond_init(&f->idle);
  f->refs = 1;
  pthread_mutex_lock(&e->files_lock);
  f->next = e->files;
  e->files = f;
  pthread_mutex_unlock(&e->files_lock);
  *out = f;
  return FERRY_OK;
}

/* Takes f off e's list and marks it closed, both under the list's lock:
 * once a transfer no longer finds the handle, no operation starts on it.
 * 1 when it was there. */
static int file_unlink(ferry_engine *e, ferry_file *f) {
  pthread_mutex_lock(&e->files_lock);
  ferry_file **pp = &e->files;
  while (*pp && *pp != f)
    pp = &(*pp)->next;
  int found = *pp != NULL;
  if (found) {
    *pp = f->next;
    pthread_mutex_lock(&f->lock);
    f->closed = 1;
    pthread_mutex_unlock(&f->lock);
  }
  pthread_mutex_unlock(&e->files_lock);
  return found;
}

static ferry_status file_unregister(ferry_engine *e, ferry_file *f) {
  if (!e || !f)
    return ferry_fail(FERRY_EINVAL, "unregister file: null engine or file");
  if (!file_unlink(e, f))
    return ferry_fail(FERRY_ENOTFOUND,
                      "unregister file: handle %p is not a file registered on "
                      "this engine (unregistered already?)",
                      (void *)f);
  file_close(f);
  return FERRY_OK;
}

/* f, with a reference for a batch, when e holds it; else FERRY_ENOTFOUND. */
static ferry_status file_take(ferry_engine *e, ferry_file *f) {
  pthread_mutex_lock(&e->files_lock);
  ferry_file *it = e->files;
  while (it && it != f)
    it = it->next;
  if (it)
    file_hold(f);
  pthread_mutex_unlock(&e->files_lock);
  return it ? FERRY_OK
            : ferry_fail(FERRY_ENOTFOUND,
                         "file transfer: handle %p is not a file registered on "
                         "this engine (unregistered?)",
                         (void *)f);
}

void ferry_files_close_all(ferry_engine *e) {
  for (;;) {
    pthread_mutex_lock(&e->files_lock);
    ferry_file *f = e->files;
    if (f)
      e->files = f->next;
    pthread_mutex_unlock(&e->files_lock);
    if (!f)
      return;
    file_close(f);
  }
}

int ferry_file_direct(const ferry_file *f, size_t *align, char *why, size_t size) {
  if (!f)
    return 0;
  if (align)
    *align = f->io.off_align;
  if (why && size)
    snprintf(why, size, "%s", f->io.direct_fd >= 0 ? "" : f->io.direct_why);
  return f->io.direct_fd >= 0;
}

const char *ferry_file_path(const ferry_file *f) { return f ? f->io.path : ""; }

/* ---- driving ----------------------------------------------------------------------- */

/* Moves one claimed chunk: each run of segments contiguous in the file is
 * one preadv or pwritev. */
static ferry_status move_chunk(ferry_file *f, ferry_chunk *c) {
  ferry_status st = file_enter(f);
  if (st)
    return st;
  for (uint32_t i = 0; i < c->count && !st;) {
    uint32_t j = i + 1;
    uint64_t bytes = c->remote[i].length;
    while (j < c->count && c->remote[j].addr == c->remote[i].addr + bytes)
      bytes += c->remote[j++].length;
    st = ferry_file_io_move(&f->io, c->op, &c->local[i], (int)(j - i), c->remote[i].addr, bytes);
    i = j;
  }
  file_leave(f);
  return st;
}

void ferry_file_drive(ferry_batch *b) {
  ferry_chunk *c = malloc(sizeof *c); /* 32 KiB: kept off the worker's stack */
  if (!c) {
    ferry_batch_fail(b, ferry_fail(FERRY_ENOMEM, "no memory to move a chunk of %s", b->address));
    return;
  }
  while (ferry_batch_claim(b, b->file_slice, c))
    ferry_batch_complete(b, move_chunk(b->file, c));
  free(c);
}

ferry_status ferry_file_sync_batch(ferry_batch *b) {
  ferry_status st = file_enter(b->file);
  if (st)
    return st;
  st = ferry_file_io_sync(&b->file->io);
  file_leave(b->file);
  return st;
}

/* ---- transfers ---------------------------------------------------------------------- */

/* What only a file can refuse: the op its access mode does not allow, a
 * range off_t cannot hold. */
static ferry_status check_file_entries(const ferry_file *f, const ferry_entry *entries,
                                       size_t count) {
  for (size_t i = 0; i < count; i++) {
    const ferry_entry *en = &entries[i];
    if (en->op == FERRY_OP_WRITE && !f->io.writable)
      return ferry_fail(FERRY_EINVAL, "entry %zu: WRITE to %s, which was opened read-only", i,
                        f->name);
    if (en->op == FERRY_OP_READ && !f->io.readable)
      return ferry_fail(FERRY_EINVAL, "entry %zu: READ of %s, which was opened write-only", i,
                        f->name);
    if (en->remote > (uint64_t)LLONG_MAX || en->length > (uint64_t)LLONG_MAX - en->remote)
      return ferry_fail(FERRY_EINVAL, "entry %zu: offset %llu + %zu bytes of %s is past 2^63", i,
                        (unsigned long long)en->remote, en->length, f->name);
  }
  return FERRY_OK;
}

/* The largest entry, clamped to [FILE_SLICE_MIN, FILE_SLICE_MAX]: an entry
 * is one operation, small ones are gathered. */
static size_t file_slice(const ferry_entry *entries, size_t count) {
  size_t slice = FILE_SLICE_MIN;
  for (size_t i = 0; i < count; i++)
    if (entries[i].length > slice)
      slice = entries[i].length;
  return slice < FILE_SLICE_MAX ? slice : FILE_SLICE_MAX;
}

/* Operations worth running at once: one per chunk, up to the queue depth.
 * The count of chunks is bounded from below by one per slice of bytes. */
static unsigned file_drivers(const ferry_batch *b) {
  uint64_t chunks = (b->total_bytes + b->file_slice - 1) / b->file_slice;
  if (chunks < 1)
    chunks = 1;
  unsigned depth = b->engine->cfg.file_queue_depth;
  return chunks < depth ? (unsigned)chunks : depth;
}

static ferry_status file_batch(ferry_engine *e, ferry_file *f, const ferry_entry *entries,
                               size_t count, unsigned flags, ferry_batch **out) {
  if (!e || !f || !entries || !count || !out || (flags & ~FERRY_FILE_SYNC))
    return ferry_fail(FERRY_EINVAL,
                      "file transfer: null engine, file, entries or out, zero "
                      "entries, or unknown flags 0x%x",
                      flags);
  ferry_status st = file_take(e, f);
  if (st)
    return st;
  ferry_batch *b = NULL;
  if (!(st = check_file_entries(f, entries, count)))
    st = ferry_batch_local(e, f->name, entries, count, &b);
  if (st) {
    ferry_file_release(f);
    return st;
  }
  b->file = f; /* the reference taken above: released with the batch */
  b->file_slice = file_slice(entries, count);
  b->file_sync = (flags & FERRY_FILE_SYNC) != 0;
  *out = b;
  return FERRY_OK;
}

static ferry_status file_submit(ferry_engine *e, ferry_file *f, const ferry_entry *entries,
                                size_t count, unsigned flags, ferry_batch **out) {
  ferry_status st = file_batch(e, f, entries, count, flags, out);
  if (st)
    return st;
  (*out)->async = 1;
  ferry_workers_post(e, *out, file_drivers(*out));
  return FERRY_OK;
}

static ferry_status file_transfer_sync(ferry_engine *e, ferry_file *f, const ferry_entry *entries,
                                       size_t count, unsigned flags) {
  ferry_batch *b;
  ferry_status st = file_batch(e, f, entries, count, flags, &b);
  if (st)
    return st;
  unsigned drivers = file_drivers(b);
  if (drivers > 1)
    ferry_workers_post(e, b, drivers - 1);
  ferry_file_drive(b); /* the caller is one of the drivers */
  st = ferry_batch_wait(b, -1);
  ferry_batch_release(b);
  return st;
}

ferry_status ferry_file_register(ferry_engine *e, int fd, unsigned flags, ferry_file **out) {
  FERRY_GATED(e, file_register(e, fd, flags, out));
}

ferry_status ferry_file_unregister(ferry_engine *e, ferry_file *f) {
  FERRY_GATED(e, file_unregister(e, f));
}

ferry_status ferry_file_submit(ferry_engine *e, ferry_file *f, const ferry_entry *entries,
                               size_t count, unsigned flags, ferry_batch **out) {
  FERRY_GATED(e, file_submit(e, f, entries, count, flags, out));
}

ferry_status ferry_file_transfer_sync(ferry_engine *e, ferry_file *f, const ferry_entry *entries,
                                      size_t count, unsigned flags) {
  FERRY_GATED(e, file_transfer_sync(e, f, entries, count, flags));
}
