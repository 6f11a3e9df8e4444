/* test_file.c - FILE memory (ferry.h, ferry_file_*): registered memory of
 * an engine moved to and from byte ranges of a registered file with
 * preadv/pwritev, completed through ferry_batch. Files live in /var/tmp
 * (a disk file system, so O_DIRECT is seen working where it can be);
 * every transfer is checked byte for byte against the file, read with
 * plain pread. Transfers held provably in flight use memory whose first
 * touch blocks (pagestall.h): a READ's preadv stops inside its copy until
 * the test lets it go, with no sleep deciding the order. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"
#include "pagestall.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define FILE_DIR "/var/tmp"

typedef struct file_rig {
  ferry_engine *e;
  char path[128];
  int fd;
  ferry_file *file;
} file_rig;

static ferry_engine *file_engine(unsigned workers, unsigned depth) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.workers = workers;
  cfg.file_queue_depth = depth;
  cfg.timeout_ms = TEST_SETUP_MS;
  return test_engine_create(&cfg);
}

/* A new empty file opened with flags (O_RDWR unless told). */
static int temp_file(char *path, size_t size, int flags) {
  snprintf(path, size, FILE_DIR "/ferry-test-file-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  if (flags != O_RDWR) {
    close(fd);
    fd = open(path, flags);
    assert_true(fd >= 0);
  }
  return fd;
}

static void rig_open(file_rig *r, unsigned workers, unsigned depth, unsigned reg_flags) {
  r->e = file_engine(workers, depth);
  r->fd = temp_file(r->path, sizeof r->path, O_RDWR);
  if (ferry_file_register(r->e, r->fd, reg_flags, &r->file))
    fail_msg("register %s: %s", r->path, ferry_last_error());
}

static void rig_close(file_rig *r) {
  if (r->file)
    assert_int_equal(ferry_file_unregister(r->e, r->file), FERRY_OK);
  ferry_engine_destroy(r->e);
  close(r->fd);
  unlink(r->path);
}

/* Page-aligned memory registered on e (zeroed). */
static uint8_t *aligned_buffer(ferry_engine *e, size_t size) {
  void *p = NULL;
  assert_int_equal(posix_memalign(&p, 4096, size), 0);
  memset(p, 0, size);
  assert_int_equal(ferry_memory_register(e, p, size), FERRY_OK);
  return p;
}

static void free_buffer(ferry_engine *e, uint8_t *p) {
  assert_int_equal(ferry_memory_unregister(e, p), FERRY_OK);
  free(p);
}

/* The file's bytes [offset, offset+size), by plain pread. */
static void read_back(int fd, uint64_t offset, uint8_t *out, size_t size) {
  assert_int_equal(pread(fd, out, size, (off_t)offset), (ssize_t)size);
}

static ferry_status run(file_rig *r, const ferry_entry *entries, size_t count, unsigned flags) {
  ferry_batch *b = NULL;
  ferry_status st = ferry_file_submit(r->e, r->file, entries, count, flags, &b);
  if (st)
    return st;
  st = ferry_batch_wait(b, -1);
  ferry_batch_free(b);
  return st;
}

/* ---- round trips ------------------------------------------------------------------ */

/* count entries of `length` bytes (its own memory each, spaced by stride
 * in memory and by fstride in the file from file_at): WRITE them, check
 * the file, READ them back into zeroed memory and check that. */
static void round_trip(file_rig *r, size_t count, size_t length, size_t stride, size_t fstride,
                       uint64_t file_at, unsigned flags, uint64_t seed) {
  size_t span = count * stride;
  uint8_t *out = aligned_buffer(r->e, span), *in = aligned_buffer(r->e, span);
  uint8_t *check = malloc(length);
  test_fill_random(out, span, seed);
  ferry_entry *entries = calloc(count, sizeof *entries);
  for (size_t i = 0; i < count; i++)
    entries[i] = (ferry_entry){FERRY_OP_WRITE, out + i * stride, file_at + i * fstride, length};
  if (run(r, entries, count, flags))
    fail_msg("WRITE of %zu x %zu bytes: %s", count, length, ferry_last_error());
  for (size_t i = 0; i < count; i++) {
    read_back(r->fd, file_at + i * fstride, check, length);
    assert_memory_equal(check, out + i * stride, length);
  }
  for (size_t i = 0; i < count; i++)
    entries[i] = (ferry_entry){FERRY_OP_READ, in + i * stride, file_at + i * fstride, length};
  if (run(r, entries, count, 0))
    fail_msg("READ of %zu x %zu bytes: %s", count, length, ferry_last_error());
  for (size_t i = 0; i < count; i++)
    assert_memory_equal(in + i * stride, out + i * stride, length);
  free(entries);
  free(check);
  free_buffer(r->e, out);
  free_buffer(r->e, in);
}

/* Aligned entries (O_DIRECT where it works), many more operations than
 * workers (one worker, a queue depth of 16: the pool grows for them). */
static void aligned_entries_round_trip(void **state) {
  (void)state;
  file_rig r;
  rig_open(&r, 1, 16, 0);
  char why[128];
  size_t align = 0;
  int direct = ferry_file_direct(r.file, &align, why, sizeof why);
  printf("# %s: %s (align %zu) %s\n", r.path, direct ? "O_DIRECT" : "buffered", align, why);
  round_trip(&r, 256, 64 * KiB, 64 * KiB, 64 * KiB, 0, 0, 1);          /* gathered by 4 */
  round_trip(&r, 8, 1 * MiB, 1 * MiB, 2 * MiB, 32 * MiB, 0, 2);        /* holes between */
  round_trip(&r, 2, 20 * MiB + 4096, 21 * MiB, 24 * MiB, 0, 0, 3);     /* cut at 16 MiB */
  round_trip(&r, 512, 4096, 8192, 4096, 64 * MiB, FERRY_FILE_SYNC, 4); /* memory gaps */
  rig_close(&r);
}

/* Lengths, offsets and memory that O_DIRECT cannot take: each such
 * operation goes through the buffered descriptor, none fails. */
static void unaligned_entries_round_trip(void **state) {
  (void)state;
  file_rig r;
  rig_open(&r, 2, 8, 0);
  round_trip(&r, 300, 1000, 1003, 1001, 7, 0, 5);
  round_trip(&r, 5, 3 * MiB + 17, 3 * MiB + 64, 3 * MiB + 111, 4097, 0, 6);
  round_trip(&r, 1, 1, 1, 1, 12345, 0, 7);
  rig_close(&r);
  rig_open(&r, 2, 8, FERRY_FILE_BUFFERED);
  char why[128];
  assert_int_equal(ferry_file_direct(r.file, NULL, why, sizeof why), 0);
  assert_non_null(strstr(why, "buffered I/O was asked for"));
  round_trip(&r, 64, 8192, 8192, 8192, 0, 0, 8);
  rig_close(&r);
}

/* Whether page `page` of fd's file is in the page cache (mincore). */
static int cached(int fd, size_t pages, size_t page) {
  void *map = mmap(NULL, pages * 4096, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(map != MAP_FAILED);
  unsigned char *vec = calloc(pages, 1);
  assert_int_equal(mincore(map, pages * 4096, vec), 0);
  int in = vec[page] & 1;
  free(vec);
  munmap(map, pages * 4096);
  return in;
}

/* Where the file system takes O_DIRECT, an aligned WRITE bypasses the
 * page cache and an unaligned one goes through it: the file's pages say
 * which descriptor served each. */
static void aligned_writes_skip_the_page_cache(void **state) {
  (void)state;
  file_rig r;
  rig_open(&r, 2, 4, 0);
  char why[128];
  if (!ferry_file_direct(r.file, NULL, why, sizeof why)) {
    rig_close(&r);
    print_message(FILE_DIR " takes no O_DIRECT here (%s)\n", why);
    skip();
  }
  uint8_t *mem = aligned_buffer(r.e, 1 * MiB);
  test_fill_random(mem, 1 * MiB, 9);
  ferry_entry direct = {FERRY_OP_WRITE, mem, 0, 512 * KiB};
  ferry_entry buffered = {FERRY_OP_WRITE, mem + 512 * KiB, 512 * KiB + 100, 4096};
  assert_int_equal(run(&r, &direct, 1, FERRY_FILE_SYNC), FERRY_OK);
  assert_int_equal(run(&r, &buffered, 1, FERRY_FILE_SYNC), FERRY_OK);
  size_t pages = (512 * KiB + 100 + 4096 + 4095) / 4096;
  assert_int_equal(cached(r.fd, pages, 0), 0);         /* O_DIRECT */
  assert_int_equal(cached(r.fd, pages, pages - 1), 1); /* buffered */
  free_buffer(r.e, mem);
  rig_close(&r);
}

/* ---- refusals ------------------------------------------------------------------------ */

static void unregistered_memory_is_refused(void **state) {
  (void)state;
  file_rig r;
  rig_open(&r, 2, 4, 0);
  uint8_t *mem = aligned_buffer(r.e, 64 * KiB);
  uint8_t *loose = malloc(64 * KiB);
  memset(loose, 0xab, 64 * KiB);
  ferry_entry entries[2] = {{FERRY_OP_WRITE, mem, 0, 4096}, {FERRY_OP_WRITE, loose, 4096, 4096}};
  ferry_batch *b = NULL;
  assert_int_equal(ferry_file_submit(r.e, r.file, entries, 2, 0, &b), FERRY_ENOTREG);
  assert_null(b);
  assert_non_null(strstr(ferry_last_error(), "entry 1"));
  assert_non_null(strstr(ferry_last_error(), "not registered"));
  ferry_entry reading = {FERRY_OP_READ, loose, 0, 4096};
  assert_int_equal(ferry_file_transfer_sync(r.e, r.file, &reading, 1, 0), FERRY_ENOTREG);
  struct stat st;
  assert_int_equal(fstat(r.fd, &st), 0);
  assert_int_equal(st.st_size, 0); /* nothing was written, not even entry 0 */
  free(loose);
  free_buffer(r.e, mem);
  rig_close(&r);
}

static void expect_register_refused(ferry_engine *e, int fd, const char *why) {
  ferry_file *f = NULL;
  assert_int_equal(ferry_file_register(e, fd, 0, &f), FERRY_EINVAL);
  assert_null(f);
  if (!strstr(ferry_last_error(), why))
    fail_msg("fd %d: expected \"%s\" in \"%s\"", fd, why, ferry_last_error());
}

static void bad_descriptors_are_refused(void **state) {
  (void)state;
  ferry_engine *e = file_engine(2, 4);
  expect_register_refused(e, -1, "not an open file descriptor");
  char path[128];
  int fd = temp_file(path, sizeof path, O_RDWR);
  close(fd); /* a closed descriptor */
  expect_register_refused(e, fd, "not an open file descriptor");
  int dir = open(FILE_DIR, O_RDONLY | O_DIRECTORY);
  expect_register_refused(e, dir, "a directory, not a regular file");
  close(dir);
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  expect_register_refused(e, pipefd[1], "a pipe, not a regular file");
  close(pipefd[0]);
  close(pipefd[1]);
  int app = open(path, O_WRONLY | O_APPEND);
  expect_register_refused(e, app, "O_APPEND");
  close(app);
  int opath = open(path, O_PATH);
  expect_register_refused(e, opath, "O_PATH");
  close(opath);
  unlink(path);
  ferry_engine_destroy(e);
}

/* A read-only descriptor takes READs only, a write-only one WRITEs only:
 * the other op is refused at submit, naming the file. */
static void access_mode_decides_the_op(void **state) {
  (void)state;
  ferry_engine *e = file_engine(2, 4);
  char path[128];
  int rw = temp_file(path, sizeof path, O_RDWR);
  uint8_t *mem = aligned_buffer(e, 8192);
  test_fill_random(mem, 8192, 10);
  assert_int_equal(pwrite(rw, mem, 8192, 0), 8192);
  int ro = open(path, O_RDONLY), wo = open(path, O_WRONLY);
  ferry_file *fro, *fwo;
  assert_int_equal(ferry_file_register(e, ro, 0, &fro), FERRY_OK);
  assert_int_equal(ferry_file_register(e, wo, 0, &fwo), FERRY_OK);
  ferry_entry w = {FERRY_OP_WRITE, mem, 0, 4096}, rd = {FERRY_OP_READ, mem + 4096, 0, 4096};
  assert_int_equal(ferry_file_transfer_sync(e, fro, &w, 1, 0), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "opened read-only"));
  assert_non_null(strstr(ferry_last_error(), path));
  assert_int_equal(ferry_file_transfer_sync(e, fwo, &rd, 1, 0), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "opened write-only"));
  assert_int_equal(ferry_file_transfer_sync(e, fro, &rd, 1, 0), FERRY_OK); /* the allowed ops */
  assert_memory_equal(mem + 4096, mem, 4096);
  assert_int_equal(ferry_file_transfer_sync(e, fwo, &w, 1, 0), FERRY_OK);
  /* The caller's descriptors may close: ferry holds duplicates. */
  close(ro);
  assert_int_equal(ferry_file_transfer_sync(e, fro, &rd, 1, 0), FERRY_OK);
  assert_int_equal(ferry_file_unregister(e, fro), FERRY_OK);
  assert_int_equal(ferry_file_unregister(e, fwo), FERRY_OK);
  assert_int_equal(ferry_file_unregister(e, fwo), FERRY_ENOTFOUND);
  close(wo);
  close(rw);
  unlink(path);
  free_buffer(e, mem);
  ferry_engine_destroy(e);
}

/* A READ that meets the end of the file fails naming where it ends, after
 * the bytes before it; none is left silently short. */
static void read_past_end_of_file_fails(void **state) {
  (void)state;
  file_rig r;
  rig_open(&r, 2, 4, 0);
  uint8_t *mem = aligned_buffer(r.e, 64 * KiB);
  test_fill_random(mem, 10000, 11);
  assert_int_equal(pwrite(r.fd, mem, 10000, 0), 10000);
  ferry_entry inside = {FERRY_OP_READ, mem + 32 * KiB, 0, 8192};
  assert_int_equal(run(&r, &inside, 1, 0), FERRY_OK);
  ferry_entry across = {FERRY_OP_READ, mem + 32 * KiB, 8192, 4096};
  assert_int_equal(run(&r, &across, 1, 0), FERRY_EIO);
  const char *err = ferry_last_error();
  if (!strstr(err, "end of file at byte 10000") || !strstr(err, "offset 8192, 4096 bytes") ||
      !strstr(err, r.path))
    fail_msg("unexpected detail: %s", err);
  ferry_entry beyond = {FERRY_OP_READ, mem + 32 * KiB, 1 * MiB, 4096};
  assert_int_equal(run(&r, &beyond, 1, 0), FERRY_EIO);
  assert_non_null(strstr(ferry_last_error(), "end of file at byte 1048576"));
  free_buffer(r.e, mem);
  rig_close(&r);
}

/* ---- in flight: cancel, unregister ---------------------------------------------------- */

#define STALL_OPS 8
#define STALL_OP (256 * KiB)

/* A rig whose memory is a page stall: READs into [0, STALL_OPS * STALL_OP)
 * block in the first one's copy until released. One operation at a time
 * (queue depth 1), so the others wait behind it. The file holds
 * STALL_OPS * STALL_OP known bytes (*expect). */
typedef struct stall_rig {
  file_rig r;
  page_stall p;
  uint8_t *expect;
  ferry_entry entries[STALL_OPS];
  ferry_batch *b;
} stall_rig;

static int stall_open(stall_rig *s) {
  size_t size = STALL_OPS * STALL_OP;
  if (page_stall_create(&s->p, size, 0, 0) != 0)
    return -1;
  rig_open(&s->r, 2, 1, 0);
  s->expect = malloc(size);
  test_fill_random(s->expect, size, 12);
  assert_int_equal(pwrite(s->r.fd, s->expect, size, 0), (ssize_t)size);
  assert_int_equal(ferry_memory_register(s->r.e, s->p.base, size), FERRY_OK);
  for (size_t i = 0; i < STALL_OPS; i++)
    s->entries[i] = (ferry_entry){FERRY_OP_READ, s->p.base + i * STALL_OP, i * STALL_OP, STALL_OP};
  assert_int_equal(ferry_file_submit(s->r.e, s->r.file, s->entries, STALL_OPS, 0, &s->b), FERRY_OK);
  assert_int_equal(page_stall_wait(&s->p, TEST_SETUP_MS), 0); /* the first READ is in its copy */
  return 0;
}

/* Operations after the first did not run: their memory holds what the
 * release filled in, not the file's bytes. */
static void assert_only_first_ran(stall_rig *s) {
  assert_memory_equal(s->p.base, s->expect, STALL_OP);
  for (size_t i = 1; i < STALL_OPS; i++)
    for (size_t j = 0; j < STALL_OP; j += 4096)
      if (s->p.base[i * STALL_OP + j] != 0xee)
        fail_msg("operation %zu ran after the batch was stopped", i);
}

static void stall_close(stall_rig *s) {
  ferry_batch_free(s->b);
  assert_int_equal(ferry_memory_unregister(s->r.e, s->p.base), FERRY_OK);
  rig_close(&s->r);
  page_stall_destroy(&s->p);
  free(s->expect);
}

static void cancel_stops_the_operations_not_started(void **state) {
  (void)state;
  stall_rig s;
  if (stall_open(&s) != 0) {
    print_message("no userfaultfd here: cannot hold a READ in flight\n");
    skip();
  }
  assert_int_equal(ferry_batch_cancel(s.b), FERRY_OK);
  assert_int_equal(ferry_batch_status(s.b, NULL), FERRY_BATCH_PENDING); /* one in flight */
  assert_int_equal(page_stall_release(&s.p, 0xee), 0);
  assert_int_equal(ferry_batch_wait(s.b, -1), FERRY_ECANCELED);
  assert_only_first_ran(&s);
  assert_int_equal(ferry_batch_cancel(s.b), FERRY_EBUSY); /* ended already */
  stall_close(&s);
}

typedef struct unregister_call {
  ferry_engine *e;
  ferry_file *file;
  int released; /* set (atomically) by the test just before it lets the READ go */
  int released_at_return;
  ferry_status st;
} unregister_call;

static void *unregister_thread(void *arg) {
  unregister_call *u = arg;
  u->st = ferry_file_unregister(u->e, u->file);
  u->released_at_return = __atomic_load_n(&u->released, __ATOMIC_SEQ_CST);
  return NULL;
}

/* Unregister while a READ is in its system call: it returns only after
 * that READ ended (a fence), and the batch's other operations never run:
 * it fails with FERRY_ENOTREG naming the file. */
static void unregister_fences_operations_in_flight(void **state) {
  (void)state;
  stall_rig s;
  if (stall_open(&s) != 0) {
    print_message("no userfaultfd here: cannot hold a READ in flight\n");
    skip();
  }
  unregister_call u = {s.r.e, s.r.file, 0, 0, FERRY_OK};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, unregister_thread, &u), 0);
  /* The unregister has begun once the engine no longer knows the handle
   * (the handle's memory lives until it returns). */
  uint8_t *probe_mem = aligned_buffer(s.r.e, 4096);
  ferry_entry probe = {FERRY_OP_READ, probe_mem, 0, 1};
  ferry_batch *nb = NULL;
  while (ferry_file_submit(s.r.e, s.r.file, &probe, 1, 0, &nb) != FERRY_ENOTFOUND) {
    ferry_batch_free(nb);
    nb = NULL;
    sched_yield();
  }
  __atomic_store_n(&u.released, 1, __ATOMIC_SEQ_CST);
  assert_int_equal(page_stall_release(&s.p, 0xee), 0);
  pthread_join(t, NULL);
  assert_int_equal(u.st, FERRY_OK);
  assert_int_equal(u.released_at_return, 1); /* it waited for the READ in flight */
  s.r.file = NULL;                           /* unregistered */
  assert_int_equal(ferry_batch_wait(s.b, -1), FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "was unregistered during the batch"));
  assert_only_first_ran(&s);
  free_buffer(s.r.e, probe_mem);
  stall_close(&s);
}

/* ---- concurrency ---------------------------------------------------------------------- */

#define SUBMITTERS 4
#define ROUNDS 12
#define SHARE (2 * MiB)

typedef struct submitter {
  file_rig *r;
  unsigned index;
  uint8_t *out, *in;
  int failures;
} submitter;

/* Each thread WRITEs and READs back its own share of the file, in entries
 * of mixed sizes, many rounds, with submit and the synchronous call. */
static void *submitter_thread(void *arg) {
  submitter *s = arg;
  uint64_t base = (uint64_t)s->index * SHARE;
  for (unsigned round = 0; round < ROUNDS; round++) {
    test_fill_random(s->out, SHARE, s->index * 1000 + round);
    size_t piece = round % 2 ? 64 * KiB : 4096 + 512 * round;
    size_t n = SHARE / piece;
    ferry_entry *en = calloc(n, sizeof *en);
    for (size_t i = 0; i < n; i++)
      en[i] = (ferry_entry){FERRY_OP_WRITE, s->out + i * piece, base + i * piece, piece};
    ferry_status st =
        round % 3 ? run(s->r, en, n, 0) : ferry_file_transfer_sync(s->r->e, s->r->file, en, n, 0);
    for (size_t i = 0; i < n; i++)
      en[i] = (ferry_entry){FERRY_OP_READ, s->in + i * piece, base + i * piece, piece};
    memset(s->in, 0, SHARE);
    if (!st)
      st =
          round % 3 ? ferry_file_transfer_sync(s->r->e, s->r->file, en, n, 0) : run(s->r, en, n, 0);
    if (st || memcmp(s->in, s->out, n * piece) != 0)
      s->failures++;
    free(en);
  }
  return NULL;
}

static void concurrent_submitters(void **state) {
  (void)state;
  file_rig r;
  rig_open(&r, 2, 8, 0);
  submitter subs[SUBMITTERS];
  pthread_t threads[SUBMITTERS];
  for (unsigned i = 0; i < SUBMITTERS; i++) {
    subs[i] = (submitter){&r, i, aligned_buffer(r.e, SHARE), aligned_buffer(r.e, SHARE), 0};
    assert_int_equal(pthread_create(&threads[i], NULL, submitter_thread, &subs[i]), 0);
  }
  for (unsigned i = 0; i < SUBMITTERS; i++) {
    pthread_join(threads[i], NULL);
    assert_int_equal(subs[i].failures, 0);
    free_buffer(r.e, subs[i].out);
    free_buffer(r.e, subs[i].in);
  }
  rig_close(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(aligned_entries_round_trip),
      cmocka_unit_test(unaligned_entries_round_trip),
      cmocka_unit_test(aligned_writes_skip_the_page_cache),
      cmocka_unit_test(unregistered_memory_is_refused),
      cmocka_unit_test(bad_descriptors_are_refused),
      cmocka_unit_test(access_mode_decides_the_op),
      cmocka_unit_test(read_past_end_of_file_fails),
      cmocka_unit_test(cancel_stops_the_operations_not_started),
      cmocka_unit_test(unregister_fences_operations_in_flight),
      cmocka_unit_test(concurrent_submitters),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
