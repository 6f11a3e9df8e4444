/* test_soak.c - many threads doing random WRITEs, READs and notifications of
 * random sizes to several targets at once, for FERRY_SOAK_SECONDS (default
 * 60), with every byte read back checked against a shadow copy.
 *
 * Targets: two `ferry serve` processes and one engine inside this process
 * (whose notifications are drained and checked one by one), all on
 * 127.0.0.1. Initiators: two engines, the second in checksum mode, shared
 * by FERRY_SOAK_THREADS threads (default 4). Thread t owns slice t of every
 * target's buffer, so its shadow copy is exact; within a batch entries never
 * overlap. Operations: sync and async batches of 1-8 entries (1 B to 1 MiB,
 * mostly small), batches with a notification, and bare notifications.
 *
 * Checked: zero failed calls, zero corrupted bytes (every READ and a full
 * read-back at the end), every notification to the in-process target
 * delivered once with intact data, memory of the targets bounded, and the
 * target processes exit cleanly (status 0, so sanitizer reports in them fail
 * the test too). Built plain, with ASan and with TSan by `make check`. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fault.h"

#define TARGET_SIZE (64u << 20)
#define MAX_THREADS 16
#define MAX_ENTRIES 8
#define MAX_ENTRY (1u << 20)
#define LOCAL_SIZE (MAX_ENTRIES * MAX_ENTRY)
#define NTARGETS 3

typedef struct target {
  char name[80];
  uint64_t addr;
} target;

typedef struct worker {
  int id;
  pthread_t thread;
  ferry_engine *eng;
  uint8_t *src, *dst;        /* registered on eng */
  uint8_t *shadow[NTARGETS]; /* expected content of this thread's slice */
  uint64_t slice;            /* bytes per slice */
  uint64_t rng;
  uint64_t ops, bytes, notifies_local, corrupt, failures;
  char first_error[300];
} worker;

static struct {
  target targets[NTARGETS];
  fault_proc procs[2];
  ferry_engine *local_target; /* targets[2] */
  void *local_buf;
  ferry_engine *initiators[2];
  worker workers[MAX_THREADS];
  int nthreads;
  double until;
  /* notifications received by local_target */
  pthread_t drainer;
  int stop_drain;
  uint64_t received, bad_notifies;
} S;

static uint64_t rnd(worker *w) {
  w->rng ^= w->rng << 13;
  w->rng ^= w->rng >> 7;
  w->rng ^= w->rng << 17;
  return w->rng;
}

static size_t random_size(worker *w, size_t max) {
  uint64_t r = rnd(w);
  size_t cap = r % 10 < 5 ? 4096 : r % 10 < 8 ? 65536 : MAX_ENTRY;
  if (cap > max)
    cap = max;
  return 1 + (size_t)((r >> 8) % cap);
}

static void failed(worker *w, ferry_status st, const char *what) {
  if (w->failures++ == 0)
    snprintf(w->first_error, sizeof w->first_error, "%s: %s: %s", what, ferry_strerror(st),
             ferry_last_error());
}

/* Notification data: 8-byte sequence number, then a pattern seeded by it. */
static size_t make_notify(worker *w, uint8_t *buf, size_t max) {
  uint64_t seq = rnd(w);
  size_t len = 8 + (size_t)(rnd(w) % (max - 8));
  memcpy(buf, &seq, 8);
  fault_pattern(buf + 8, len - 8, seq);
  return len;
}

static int notify_ok(const ferry_notification *n) {
  if (n->length < 8 || strncmp(n->name, "soak-", 5) != 0)
    return 0;
  uint64_t seq;
  memcpy(&seq, n->data, 8);
  uint8_t expect[4096];
  if (n->length - 8 > sizeof expect)
    return 0;
  fault_pattern(expect, n->length - 8, seq);
  return memcmp(expect, n->data + 8, n->length - 8) == 0;
}

static void *drain_loop(void *arg) {
  while (!__atomic_load_n(&S.stop_drain, __ATOMIC_ACQUIRE)) {
    ferry_notification *list;
    size_t count;
    if (ferry_notify_drain(S.local_target, &list, &count) == FERRY_OK) {
      for (size_t i = 0; i < count; i++)
        if (!notify_ok(&list[i]))
          __atomic_add_fetch(&S.bad_notifies, 1, __ATOMIC_RELAXED);
      __atomic_add_fetch(&S.received, count, __ATOMIC_RELAXED);
      ferry_notify_free(list, count);
    }
    fault_sleep_ms(5);
  }
  return NULL;
}

/* Up to MAX_ENTRIES disjoint ranges inside the thread's slice: one per
 * 1/MAX_ENTRIES of it. */
static size_t plan(worker *w, ferry_op op, ferry_entry *entries, uint64_t *offsets, int t) {
  size_t n = 1 + (size_t)(rnd(w) % MAX_ENTRIES);
  uint64_t part = w->slice / MAX_ENTRIES;
  size_t local_off = 0;
  size_t max = part - 1 < MAX_ENTRY ? (size_t)part - 1 : MAX_ENTRY;
  for (size_t i = 0; i < n; i++) {
    size_t len = random_size(w, max);
    uint64_t off = part * i + rnd(w) % (part - len);
    offsets[i] = off;
    uint8_t *local = (op == FERRY_OP_WRITE ? w->src : w->dst) + local_off;
    entries[i] =
        (ferry_entry){op, local, S.targets[t].addr + (uint64_t)w->id * w->slice + off, len};
    local_off += len;
  }
  return n;
}

static void do_write(worker *w, int t, int async, int with_notify) {
  ferry_entry entries[MAX_ENTRIES];
  uint64_t offsets[MAX_ENTRIES];
  size_t n = plan(w, FERRY_OP_WRITE, entries, offsets, t);
  for (size_t i = 0; i < n; i++)
    fault_pattern(entries[i].local, entries[i].length, rnd(w));
  uint8_t note_data[512];
  char note_name[32];
  ferry_notification note = {note_name, (char *)note_data, 0};
  if (with_notify) {
    snprintf(note_name, sizeof note_name, "soak-%d", w->id);
    note.length = make_notify(w, note_data, sizeof note_data);
  }
  ferry_status st;
  if (async) {
    ferry_batch *b;
    st = ferry_batch_submit(w->eng, S.targets[t].name, entries, n, with_notify ? &note : NULL, &b);
    if (st == FERRY_OK) {
      while (ferry_batch_status(b, NULL) == FERRY_BATCH_PENDING && rnd(w) % 4)
        sched_yield();
      st = ferry_batch_wait(b, -1);
      ferry_batch_free(b);
    }
  } else {
    st = ferry_transfer_sync_batch(w->eng, S.targets[t].name, entries, n,
                                   with_notify ? &note : NULL);
  }
  if (st != FERRY_OK) {
    failed(w, st, async ? "async write batch" : "write batch");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    memcpy(w->shadow[t] + offsets[i], entries[i].local, entries[i].length);
    w->bytes += entries[i].length;
  }
  if (with_notify && t == 2)
    w->notifies_local++;
}

static void do_read(worker *w, int t) {
  ferry_entry entries[MAX_ENTRIES];
  uint64_t offsets[MAX_ENTRIES];
  size_t n = plan(w, FERRY_OP_READ, entries, offsets, t);
  for (size_t i = 0; i < n; i++)
    memset(entries[i].local, 0xA5, entries[i].length);
  ferry_status st = ferry_transfer_sync_batch(w->eng, S.targets[t].name, entries, n, NULL);
  if (st != FERRY_OK) {
    failed(w, st, "read batch");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    if (memcmp(entries[i].local, w->shadow[t] + offsets[i], entries[i].length) != 0) {
      if (w->corrupt++ == 0)
        fprintf(stderr, "soak: thread %d: %zu bytes read from %s at slice offset %llu differ\n",
                w->id, entries[i].length, S.targets[t].name, (unsigned long long)offsets[i]);
    }
    w->bytes += entries[i].length;
  }
}

static void do_notify(worker *w, int t) {
  uint8_t data[4096];
  char name[32];
  snprintf(name, sizeof name, "soak-%d", w->id);
  /* Small ones to the serve processes: nothing drains their queues. */
  size_t len = make_notify(w, data, t == 2 ? sizeof data : 64);
  ferry_status st = ferry_notify_send(w->eng, S.targets[t].name, name, data, len);
  if (st != FERRY_OK)
    failed(w, st, "notify");
  else if (t == 2)
    w->notifies_local++;
}

static void *worker_loop(void *arg) {
  worker *w = arg;
  while (fault_now() < S.until && !w->failures && !w->corrupt) {
    int t = (int)(rnd(w) % NTARGETS);
    unsigned op = (unsigned)(rnd(w) % 100);
    if (op < 30)
      do_write(w, t, 0, 0);
    else if (op < 40)
      do_write(w, t, 1, 0);
    else if (op < 47)
      do_write(w, t, (int)(rnd(w) % 2), 1);
    else if (op < 92)
      do_read(w, t);
    else
      do_notify(w, t);
    w->ops++;
  }
  return NULL;
}

/* Reads the whole slice of every target back and compares it. */
static void final_check(worker *w) {
  for (int t = 0; t < NTARGETS; t++)
    for (uint64_t off = 0; off < w->slice; off += LOCAL_SIZE) {
      size_t len = (size_t)(w->slice - off < LOCAL_SIZE ? w->slice - off : LOCAL_SIZE);
      ferry_status st =
          ferry_transfer_sync(w->eng, S.targets[t].name, FERRY_OP_READ, w->dst,
                              S.targets[t].addr + (uint64_t)w->id * w->slice + off, len);
      if (st != FERRY_OK)
        failed(w, st, "final read");
      else if (memcmp(w->dst, w->shadow[t] + off, len) != 0)
        w->corrupt++;
    }
}

static void test_soak(void **state) {
  const char *env = getenv("FERRY_SOAK_SECONDS");
  double seconds = env && atof(env) > 0 ? atof(env) : 60;
  env = getenv("FERRY_SOAK_THREADS");
  S.nthreads = env && atoi(env) > 0 && atoi(env) <= MAX_THREADS ? atoi(env) : 4;
  fault_watchdog((unsigned)seconds + 300, "soak");

  for (int i = 0; i < 2; i++) {
    assert_int_equal(fault_serve_start(&S.procs[i], NULL, 0, "127.0.0.1", 0, "64M", NULL, 0), 0);
    snprintf(S.targets[i].name, sizeof S.targets[i].name, "%s", S.procs[i].target);
    S.targets[i].addr = S.procs[i].addr;
  }
  S.local_target = fault_engine("127.0.0.1", 0, 0, 0);
  assert_non_null(S.local_target);
  assert_int_equal(ferry_memory_alloc(S.local_target, TARGET_SIZE, &S.local_buf), FERRY_OK);
  snprintf(S.targets[2].name, sizeof S.targets[2].name, "%s", ferry_engine_name(S.local_target));
  S.targets[2].addr = (uint64_t)(uintptr_t)S.local_buf;
  for (int i = 0; i < 2; i++) {
    S.initiators[i] = fault_engine("127.0.0.1", 0, 0, i == 1);
    assert_non_null(S.initiators[i]);
  }
  pthread_create(&S.drainer, NULL, drain_loop, NULL);

  uint64_t slice = (TARGET_SIZE / (uint64_t)S.nthreads) & ~4095ull;
  for (int i = 0; i < S.nthreads; i++) {
    worker *w = &S.workers[i];
    w->id = i;
    w->eng = S.initiators[i % 2];
    w->slice = slice;
    w->rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    w->src = fault_buffer(w->eng, LOCAL_SIZE);
    w->dst = fault_buffer(w->eng, LOCAL_SIZE);
    assert_non_null(w->src);
    assert_non_null(w->dst);
    for (int t = 0; t < NTARGETS; t++) {
      w->shadow[t] = malloc(slice);
      fault_pattern(w->shadow[t], slice, (uint64_t)(i * 10 + t));
      /* Start from known content. */
      for (uint64_t off = 0; off < slice; off += LOCAL_SIZE) {
        size_t len = (size_t)(slice - off < LOCAL_SIZE ? slice - off : LOCAL_SIZE);
        memcpy(w->src, w->shadow[t] + off, len);
        ferry_status st = ferry_transfer_sync(w->eng, S.targets[t].name, FERRY_OP_WRITE, w->src,
                                              S.targets[t].addr + (uint64_t)i * slice + off, len);
        if (st != FERRY_OK)
          fail_msg("initial fill of %s: %s: %s", S.targets[t].name, ferry_strerror(st),
                   ferry_last_error());
      }
    }
  }
  long rss0[2] = {fault_rss_kib(S.procs[0].pid), fault_rss_kib(S.procs[1].pid)};
  long self0 = fault_rss_kib(getpid());

  double t0 = fault_now();
  S.until = t0 + seconds;
  for (int i = 0; i < S.nthreads; i++)
    pthread_create(&S.workers[i].thread, NULL, worker_loop, &S.workers[i]);
  for (int i = 0; i < S.nthreads; i++)
    pthread_join(S.workers[i].thread, NULL);
  double took = fault_now() - t0;

  uint64_t ops = 0, bytes = 0, sent_local = 0, corrupt = 0, failures = 0;
  for (int i = 0; i < S.nthreads; i++) {
    final_check(&S.workers[i]);
    ops += S.workers[i].ops;
    bytes += S.workers[i].bytes;
    sent_local += S.workers[i].notifies_local;
    corrupt += S.workers[i].corrupt;
    failures += S.workers[i].failures;
    if (S.workers[i].failures)
      fprintf(stderr, "soak: thread %d: %s\n", i, S.workers[i].first_error);
  }
  /* The drainer polls every 5 ms; a generous bound for a busy machine. */
  for (double until = fault_now() + 30.0;
       __atomic_load_n(&S.received, __ATOMIC_RELAXED) < sent_local && fault_now() < until;)
    fault_sleep_ms(5);
  __atomic_store_n(&S.stop_drain, 1, __ATOMIC_RELEASE);
  pthread_join(S.drainer, NULL);
  long rss1[2] = {fault_rss_kib(S.procs[0].pid), fault_rss_kib(S.procs[1].pid)};
  long self1 = fault_rss_kib(getpid());

  printf("soak: %d threads, %.0f s: %llu operations (%.0f/s), %.1f GiB moved, %llu notifications "
         "to the in-process target (%llu received, %llu malformed), %llu failed calls, %llu "
         "corrupted ranges\n",
         S.nthreads, took, (unsigned long long)ops, ops / took, bytes / 1073741824.0,
         (unsigned long long)sent_local, (unsigned long long)S.received,
         (unsigned long long)S.bad_notifies, (unsigned long long)failures,
         (unsigned long long)corrupt);
  printf("soak: resident memory (KiB) serve 1: %ld -> %ld, serve 2: %ld -> %ld, this process: %ld "
         "-> %ld\n",
         rss0[0], rss1[0], rss0[1], rss1[1], self0, self1);

  for (int i = 0; i < S.nthreads; i++) {
    worker *w = &S.workers[i];
    fault_buffer_free(w->eng, w->src);
    fault_buffer_free(w->eng, w->dst);
    for (int t = 0; t < NTARGETS; t++)
      free(w->shadow[t]);
  }
  ferry_engine_destroy(S.initiators[0]);
  ferry_engine_destroy(S.initiators[1]);
  ferry_memory_free(S.local_target, S.local_buf);
  ferry_engine_destroy(S.local_target);
  int status[2] = {fault_proc_term(&S.procs[0]), fault_proc_term(&S.procs[1])};
  fault_watchdog(0, NULL);

  assert_int_equal(failures, 0);
  assert_int_equal(corrupt, 0);
  assert_int_equal(S.bad_notifies, 0);
  assert_int_equal(S.received, sent_local);
  assert_true(ops > 0);
  /* The targets' memory is their 64 MiB buffer plus queued notifications
   * (small ones here); a leak per operation would show far above this. */
  for (int i = 0; i < 2; i++)
    assert_true(rss1[i] - rss0[i] < 64 * 1024 + (long)(ops / 8));
  assert_int_equal(status[0], 0);
  assert_int_equal(status[1], 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_soak)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
