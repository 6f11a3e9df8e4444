/* test_stream_order.c - stream-ordered transfers (ferry_batch_submit_on_stream)
 * without a GPU, through the test double of the CUDA driver (support/fake_cuda,
 * libcuda.so.1 from LD_LIBRARY_PATH), whose streams run in order and only
 * when waited for, so a missing wait shows as wrong bytes:
 *
 *  - the work queued on the stream before the call is seen by the transfer
 *    (a copy into its source lands first), and the work queued after sees
 *    the landed bytes: while the target's landing is held (fake_cuda_hold),
 *    the stream's later copy has not run (cuEventQuery: not ready);
 *  - the same for a READ into device memory;
 *  - a transfer that fails (the target unregistered its memory meanwhile)
 *    releases the stream, and its batch says why;
 *  - with no handle (out NULL, Mooncake's *_on_cuda) the bytes land and
 *    the stream goes on;
 *  - a transfer refused by the checks queues nothing on the stream;
 *  - a batch cancelled while ferry waits for the stream's earlier work
 *    releases the stream and never starts;
 *  - shutdown while ferry waits for the stream's earlier work fails the
 *    batch once that work completed, and releases the stream;
 *  - no CUDA context is left current on the calling thread.
 *
 * ctest runs it twice: as is (the stream waits with cuStreamWaitValue32)
 * and with FAKE_CUDA_NO_STREAM_MEMOPS=1 (the driver lacks stream memory
 * operations: a host function holds the stream). Both engines live in this
 * process, on 127.0.0.1, over tcp (device memory staged). */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "cuda_double.h"
#include "ferry.h"
#include "harness.h"
#include "rig.h"

#define SIZE (600 * 1024) /* more than two of the staging pipeline's slots */

static int memops(void) {
  const char *off = getenv("FAKE_CUDA_NO_STREAM_MEMOPS");
  return !(off && *off == '1');
}

/* ---- the rig: two engines, device memory on both, the application's stream ---------- */

typedef struct stream_rig {
  test_rig r;
  uint8_t *remote, *local; /* device memory: the target's, the initiator's */
  uint8_t *staged;         /* pinned host memory the stream copies from and to */
  void *stream;
} stream_rig;

static void rig_start(stream_rig *s) {
  cuda_double_need();
  test_rig_start(&s->r, test_engine_tcp(), test_engine_tcp(), 4096);
  s->remote = cuda_double_alloc(SIZE);
  s->local = cuda_double_alloc(SIZE);
  s->staged = cuda_double_pinned(SIZE);
  s->stream = cuda_double_stream();
  assert_int_equal(ferry_memory_register_at(s->r.target, s->remote, SIZE, "cuda:0"), FERRY_OK);
  assert_int_equal(ferry_memory_register_at(s->r.initiator, s->local, SIZE, "cuda:0"), FERRY_OK);
}

static void rig_stop(stream_rig *s) {
  test_rig_stop(&s->r);
  cuda_double_stream_destroy(s->stream);
  cuda_double_free(s->remote);
  cuda_double_free(s->local);
  cuda_double_free_pinned(s->staged);
}

static void put(uint8_t *dev, uint64_t seed) {
  uint8_t *bytes = malloc(SIZE);
  assert_non_null(bytes);
  test_fill_random(bytes, SIZE, seed);
  cuda_double_put(dev, bytes, SIZE);
  free(bytes);
}

/* Asserts the device memory (host: NULL) or host memory holds seed's bytes. */
static void assert_holds(const uint8_t *dev, const uint8_t *host, uint64_t seed) {
  uint8_t *want = malloc(SIZE), *got = malloc(SIZE);
  assert_non_null(want);
  assert_non_null(got);
  test_fill_random(want, SIZE, seed);
  if (dev)
    cuda_double_get(got, dev, SIZE);
  else
    memcpy(got, host, SIZE);
  if (memcmp(got, want, SIZE))
    fail_msg("the bytes are not seed %llu's", (unsigned long long)seed);
  free(want);
  free(got);
}

/* Queues on the stream a copy of dev into the pinned buffer, and an event
 * after it. */
static void *queue_after(stream_rig *s, uint8_t *dev) {
  cuda_double_copy_async(dev, s->staged, SIZE, 0, s->stream);
  return cuda_double_record(s->stream);
}

/* The stream reached event (and the event is gone). With stream memory
 * operations a query runs the stream as far as it can; a host function it
 * does not run (it may block), so then the test waits. */
static void assert_reached(void *event) {
  if (memops()) {
    int r = cuda_double_query(event);
    if (r)
      fail_msg("the stream still waits after the transfer ended (cuEventQuery: %d)", r);
  }
  cuda_double_wait(event);
}

static void assert_not_reached(void *event) {
  int r = cuda_double_query(event);
  if (r != CUDA_DOUBLE_NOT_READY)
    fail_msg("the work queued after the transfer ran before it landed (cuEventQuery: %d)", r);
}

/* Submits op over all SIZE bytes of local and remote on the rig's stream;
 * its batch, or with watched 0 none (out NULL). Fails the test if refused. */
static ferry_batch *submit(stream_rig *s, ferry_op op, int watched) {
  ferry_entry entry = {op, s->local, (uint64_t)(uintptr_t)s->remote, SIZE};
  ferry_batch *b = NULL;
  if (ferry_batch_submit_on_stream(s->r.initiator, s->r.name, &entry, 1, NULL, s->stream,
                                   watched ? &b : NULL))
    fail_msg("%s", ferry_last_error());
  return b;
}

/* Queues the stream's work before the transfer: a copy into the source,
 * held (fake_cuda_hold) until the test lets it go. */
static void queue_held_work_before(stream_rig *s) {
  cuda_double_hold(s->local, 1);
  cuda_double_copy_async(s->local, s->staged, SIZE, 1, s->stream);
}

/* ---- cases ------------------------------------------------------------------------------- */

/* WRITE: a copy queued before the call fills the source (the transfer
 * must carry those bytes); a copy queued after reads the target, and must
 * not run while the target's landing is held. */
static void write_between_stream_work(void **state) {
  (void)state;
  stream_rig s;
  rig_start(&s);
  put(s.local, 1);  /* what the source held before the stream's work */
  put(s.remote, 2); /* and the target */
  test_fill_random(s.staged, SIZE, 3);
  cuda_double_copy_async(s.local, s.staged, SIZE, 1, s.stream);
  cuda_double_hold(s.remote, 1);
  ferry_batch *b = submit(&s, FERRY_OP_WRITE, 1);
  cuda_double_no_context();
  void *after = queue_after(&s, s.remote);
  cuda_double_held_wait(); /* the transfer is landing: the work before it ran */
  assert_not_reached(after);
  cuda_double_hold(s.remote, 0);
  assert_int_equal(ferry_batch_wait(b, -1), FERRY_OK);
  ferry_batch_free(b);
  cuda_double_wait(after);
  assert_holds(NULL, s.staged, 3); /* the later copy saw the landed bytes */
  assert_holds(s.remote, NULL, 3);
  rig_stop(&s);
}

/* READ into device memory: the work after waits for the copy into it. */
static void read_lands_before_later_work(void **state) {
  (void)state;
  stream_rig s;
  rig_start(&s);
  put(s.remote, 4);
  put(s.local, 5);
  cuda_double_hold(s.local, 1);
  ferry_batch *b = submit(&s, FERRY_OP_READ, 1);
  void *after = queue_after(&s, s.local);
  cuda_double_held_wait();
  assert_not_reached(after);
  cuda_double_hold(s.local, 0);
  assert_int_equal(ferry_batch_wait(b, -1), FERRY_OK);
  ferry_batch_free(b);
  cuda_double_wait(after);
  assert_holds(NULL, s.staged, 4);
  cuda_double_no_context();
  rig_stop(&s);
}

/* The target unregisters its memory while the stream's earlier work still
 * runs: the transfer fails, the stream goes on, the batch says why. */
static void failure_releases_stream(void **state) {
  (void)state;
  stream_rig s;
  rig_start(&s);
  put(s.remote, 6);
  test_fill_random(s.staged, SIZE, 7);
  queue_held_work_before(&s);
  ferry_batch *b = submit(&s, FERRY_OP_WRITE, 1);
  void *after = queue_after(&s, s.remote);
  cuda_double_held_wait(); /* ferry's thread waits for the work before */
  assert_int_equal(ferry_memory_unregister(s.r.target, s.remote), FERRY_OK);
  cuda_double_hold(s.local, 0);
  ferry_status st = ferry_batch_wait(b, -1);
  if (st == FERRY_OK)
    fail_msg("a WRITE into unregistered memory succeeded");
  if (!strstr(ferry_last_error(), "not registered"))
    fail_msg("detail \"%s\" does not say why", ferry_last_error());
  ferry_batch_free(b);
  assert_reached(after); /* released, not waiting forever */
  assert_holds(NULL, s.staged, 6);
  rig_stop(&s);
}

/* No handle: the bytes land before the work after, as with one. */
static void unwatched_lands(void **state) {
  (void)state;
  stream_rig s;
  rig_start(&s);
  put(s.local, 8);
  put(s.remote, 9);
  submit(&s, FERRY_OP_WRITE, 0);
  void *after = queue_after(&s, s.remote);
  cuda_double_wait(after);
  assert_holds(NULL, s.staged, 8);
  rig_stop(&s);
}

/* Refused by the checks: an error at once, and nothing queued. */
static void refused_queues_nothing(void **state) {
  (void)state;
  stream_rig s;
  rig_start(&s);
  ferry_entry entry = {FERRY_OP_WRITE, s.local, (uint64_t)(uintptr_t)s.remote + SIZE, 64};
  ferry_batch *b = NULL;
  assert_int_not_equal(
      ferry_batch_submit_on_stream(s.r.initiator, s.r.name, &entry, 1, NULL, s.stream, &b),
      FERRY_OK);
  assert_null(b);
  entry = (ferry_entry){FERRY_OP_WRITE, s.local + 1, 0, SIZE};
  assert_int_equal(
      ferry_batch_submit_on_stream(s.r.initiator, s.r.name, &entry, 1, NULL, s.stream, &b),
      FERRY_ENOTREG);
  void *event = cuda_double_record(s.stream);
  assert_int_equal(cuda_double_query(event), 0); /* no wait was queued */
  cuda_double_wait(event);
  cuda_double_no_context();
  rig_stop(&s);
}

/* Cancelled while ferry waits for the stream's earlier work: the stream
 * is released at once, and the batch never starts. */
static void cancel_while_waiting(void **state) {
  (void)state;
  stream_rig s;
  rig_start(&s);
  put(s.remote, 12);
  queue_held_work_before(&s);
  ferry_batch *b = submit(&s, FERRY_OP_WRITE, 1);
  cuda_double_held_wait();
  assert_int_equal(ferry_batch_cancel(b), FERRY_OK);
  assert_int_equal(ferry_batch_wait(b, -1), FERRY_ECANCELED);
  ferry_batch_free(b);
  cuda_double_hold(s.local, 0);
  void *after = queue_after(&s, s.remote);
  /* ferry's thread may still be running the stream's earlier work: wait
   * (a stream left waiting hangs here, past ctest's timeout) */
  cuda_double_wait(after);
  assert_holds(NULL, s.staged, 12); /* nothing was written */
  rig_stop(&s);
}

/* Shutdown while ferry's thread waits for the stream's earlier work: once
 * that completes the batch fails (FERRY_ECLOSED, saying so) instead of
 * starting, and the stream goes on. */
static void *shut_down(void *engine) {
  ferry_engine_shutdown(engine);
  return NULL;
}

static void shutdown_fails_waiting_batch(void **state) {
  (void)state;
  stream_rig s;
  rig_start(&s);
  queue_held_work_before(&s);
  ferry_batch *b = submit(&s, FERRY_OP_WRITE, 1);
  void *after = queue_after(&s, s.remote);
  cuda_double_held_wait();
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, shut_down, s.r.initiator), 0);
  /* the gate refuses calls once the shutdown began */
  while (ferry_memory_check(s.r.initiator, s.local, 1) != FERRY_ECLOSED)
    sched_yield();
  cuda_double_hold(s.local, 0);
  pthread_join(t, NULL);
  assert_int_equal(ferry_batch_wait(b, -1), FERRY_ECLOSED);
  if (!strstr(ferry_last_error(), "shut down before the stream-ordered transfer"))
    fail_msg("detail \"%s\" does not say why", ferry_last_error());
  ferry_batch_free(b);
  assert_reached(after);
  rig_stop(&s);
}

int main(void) {
  const char *filter = getenv("FERRY_TEST_FILTER");
  if (filter && *filter)
    cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(write_between_stream_work), cmocka_unit_test(read_lands_before_later_work),
      cmocka_unit_test(failure_releases_stream),   cmocka_unit_test(unwatched_lands),
      cmocka_unit_test(refused_queues_nothing),    cmocka_unit_test(shutdown_fails_waiting_batch),
      cmocka_unit_test(cancel_while_waiting),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
