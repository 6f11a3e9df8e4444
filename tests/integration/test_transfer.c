/* test_transfer.c - two engines in two processes over loopback: the target
 * is a `ferry serve` process, the initiator is this test (or the other way
 * round, with this program started again as the initiator: child.h).
 * Every transfer is verified byte for byte. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "cases.h"
#include "child.h"
#include "ferry.h"
#include "harness.h"
#include "rawclient.h"

#define MiB (1024ull * 1024ull)
#define TARGET_SIZE (256 * MiB)

/* ThreadSanitizer shadows every byte a socket call touches, so its build
 * moves less data; the shapes of the tests (sizes spanning slices, 100,000
 * entries) stay the same. */
#ifdef __SANITIZE_THREAD__
#define LARGEST_BLOCK (8 * MiB)
#define SMALL_ENTRY 256
#else
#define LARGEST_BLOCK (64 * MiB)
#define SMALL_ENTRY 2048
#endif

static test_target target;

static int start_target(void **state) { return test_target_start(&target, 0, TARGET_SIZE, NULL); }

static int stop_target(void **state) {
  test_target_stop(&target);
  return 0;
}

/* An engine whose calls get TEST_SETUP_MS until a test shortens them for
 * the calls it is about (short_timeouts). */
static ferry_engine *patient_engine(void) {
  ferry_config cfg;
  test_config(&cfg);
  cfg.timeout_ms = cfg.connect_timeout_ms = TEST_SETUP_MS;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  return e;
}

/* timeout_ms, and connect_timeout_ms no longer than 5 s. */
static void short_timeouts(ferry_engine *e, uint32_t timeout_ms) {
  test_engine_set_timeouts(e, timeout_ms, timeout_ms < 5000 ? timeout_ms : 5000);
}

/* Writes random bytes of `size` at `offset` of the target, reads them back
 * into a second buffer and compares. */
static void round_trip(ferry_engine *e, uint8_t *out, uint8_t *in, uint64_t offset, size_t size,
                       uint64_t seed) {
  test_fill_random(out, size, seed);
  memset(in, 0, size);
  ferry_status st =
      ferry_transfer_sync(e, target.target, FERRY_OP_WRITE, out, target.addr + offset, size);
  if (st)
    fail_msg("write of %zu bytes: %s", size, ferry_last_error());
  st = ferry_transfer_sync(e, target.target, FERRY_OP_READ, in, target.addr + offset, size);
  if (st)
    fail_msg("read of %zu bytes: %s", size, ferry_last_error());
  assert_memory_equal(out, in, size);
}

static void random_sizes_round_trip(void **state) {
  ferry_engine *e = test_engine(NULL);
  size_t cap = LARGEST_BLOCK;
  uint8_t *out = test_buffer(e, cap), *in = test_buffer(e, cap);
  size_t fixed[] = {1, 2, 3, 63, 64, 4095, 4096, 4097, 65537, MiB + 3, 7 * MiB + 1, LARGEST_BLOCK};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
    round_trip(e, out, in, (i * 4099) % (TARGET_SIZE - cap), fixed[i], i + 1);
  srand(12345);
  for (int i = 0; i < 24; i++) {
    size_t size = 1 + ((size_t)rand() * 7919u) % cap;
    uint64_t offset = ((uint64_t)rand() * 4093u) % (TARGET_SIZE - size);
    round_trip(e, out, in, offset, size, 100 + (uint64_t)i);
  }
  ferry_engine_destroy(e);
  free(out);
  free(in);
}

/* 100,000 entries of 2 KiB scattered over the target, written in one batch
 * and read back in one batch. */
static void hundred_thousand_entry_batch(void **state) {
  enum { N = 100000, ENTRY = SMALL_ENTRY };
  ferry_engine *e = test_engine(NULL);
  /* Time is not the point: over fabric's shm provider on a busy 2-core
   * machine beside two CPU burners one such batch took over 60 s. */
  test_engine_set_timeouts(e, 300000, 0);
  uint8_t *out = test_buffer(e, (size_t)N * ENTRY), *in = test_buffer(e, (size_t)N * ENTRY);
  ferry_entry *entries = malloc(N * sizeof *entries);
  test_fill_random(out, (size_t)N * ENTRY, 77);
  for (size_t i = 0; i < N; i++) {
    /* remote slots in a scrambled order, so neighbours are not contiguous */
    size_t slot = (i * 7919) % N;
    entries[i] = (ferry_entry){FERRY_OP_WRITE, out + i * ENTRY, target.addr + slot * ENTRY, ENTRY};
  }
  double t0 = test_now_s();
  assert_int_equal(ferry_transfer_sync_batch(e, target.target, entries, N, NULL), FERRY_OK);
  for (size_t i = 0; i < N; i++) {
    entries[i].op = FERRY_OP_READ;
    entries[i].local = in + i * ENTRY;
  }
  assert_int_equal(ferry_transfer_sync_batch(e, target.target, entries, N, NULL), FERRY_OK);
  print_message("100,000 x %d B written and read back in %.2f s\n", ENTRY, test_now_s() - t0);
  assert_memory_equal(out, in, (size_t)N * ENTRY);
  free(entries);
  ferry_engine_destroy(e);
  free(out);
  free(in);
}

static void async_batch_polled_to_completion(void **state) {
  enum { N = 64 };
  ferry_engine *e = test_engine(NULL);
  size_t size = N * MiB;
  uint8_t *out = test_buffer(e, size), *in = test_buffer(e, size);
  test_fill_random(out, size, 5);
  ferry_entry entries[N];
  for (size_t i = 0; i < N; i++)
    entries[i] = (ferry_entry){FERRY_OP_WRITE, out + i * MiB, target.addr + (N - 1 - i) * MiB, MiB};
  ferry_batch *b;
  assert_int_equal(ferry_batch_submit(e, target.target, entries, N, NULL, &b), FERRY_OK);
  ferry_batch_state state_now;
  ferry_status error = FERRY_OK;
  int polls = 0;
  while ((state_now = ferry_batch_status(b, &error)) == FERRY_BATCH_PENDING) {
    polls++;
    usleep(1000);
  }
  assert_int_equal(state_now, FERRY_BATCH_DONE);
  assert_int_equal(error, FERRY_OK);
  assert_int_equal(ferry_batch_wait(b, 0), FERRY_OK);
  ferry_batch_free(b);
  for (size_t i = 0; i < N; i++)
    entries[i] = (ferry_entry){FERRY_OP_READ, in + i * MiB, target.addr + (N - 1 - i) * MiB, MiB};
  assert_int_equal(ferry_batch_submit(e, target.target, entries, N, NULL, &b), FERRY_OK);
  assert_int_equal(ferry_batch_wait(b, 30000), FERRY_OK);
  ferry_batch_free(b);
  assert_memory_equal(out, in, size);
  print_message("async batch polled %d times\n", polls);
  ferry_engine_destroy(e);
  free(out);
  free(in);
}

typedef struct thread_job {
  ferry_engine *engine;
  int index;
  int failures;
} thread_job;

static void *thread_transfers(void *arg) {
  thread_job *job = arg;
  const size_t span = LARGEST_BLOCK / 8; /* each thread owns its own slice of the target */
  uint8_t *out = test_buffer(job->engine, span), *in = test_buffer(job->engine, span);
  uint64_t base = target.addr + (uint64_t)job->index * span;
  unsigned seed = (unsigned)job->index * 31u + 1;
  for (int i = 0; i < 40 && out && in; i++) {
    size_t size = 1 + (size_t)rand_r(&seed) % span;
    test_fill_random(out, size, (uint64_t)job->index * 1000 + (uint64_t)i);
    if (ferry_transfer_sync(job->engine, target.target, FERRY_OP_WRITE, out, base, size) ||
        ferry_transfer_sync(job->engine, target.target, FERRY_OP_READ, in, base, size) ||
        memcmp(out, in, size) != 0)
      job->failures++;
  }
  ferry_memory_unregister(job->engine, out);
  ferry_memory_unregister(job->engine, in);
  free(out);
  free(in);
  return NULL;
}

static void many_threads_one_engine(void **state) {
  enum { THREADS = 8 };
  ferry_engine *e = test_engine(NULL);
  pthread_t threads[THREADS];
  thread_job jobs[THREADS];
  for (int i = 0; i < THREADS; i++) {
    jobs[i] = (thread_job){e, i, 0};
    pthread_create(&threads[i], NULL, thread_transfers, &jobs[i]);
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(threads[i], NULL);
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(jobs[i].failures, 0);
  ferry_engine_destroy(e);
}

/* The target itself refuses an out-of-region WRITE (sent by a raw client
 * that skips the initiator's own check), and the same connection then
 * carries a valid WRITE and READ. */
static void target_refuses_unregistered_and_connection_survives(void **state) {
  int fd = raw_connect(target.port);
  assert_true(fd >= 0);
  assert_int_equal(raw_hello(fd, FERRY_WIRE_VERSION_MIN, FERRY_WIRE_VERSION_MAX, NULL, 0), 0);
  char reason[1100] = "";
  uint8_t data[4096], back[4096];
  test_fill_random(data, sizeof data, 9);
  int st = raw_write(fd, target.addr + TARGET_SIZE - 100, data, sizeof data, reason, sizeof reason);
  assert_int_equal(st, FERRY_ENOTREG);
  assert_non_null(strstr(reason, "not registered"));
  st = raw_write(fd, 0x1000, data, sizeof data, reason, sizeof reason);
  assert_int_equal(st, FERRY_ENOTREG);
  assert_int_equal(raw_write(fd, target.addr + 12345, data, sizeof data, NULL, 0), 0);
  assert_int_equal(raw_read(fd, target.addr + 12345, back, sizeof back), 0);
  assert_memory_equal(data, back, sizeof data);
  assert_int_equal(raw_read(fd, target.addr - 8, back, 16), FERRY_ENOTREG);
  close(fd);
}

static void initiator_refuses_unregistered_addresses(void **state) {
  ferry_engine *e = test_engine(NULL);
  uint8_t *buf = test_buffer(e, MiB);
  uint8_t unregistered[64];
  ferry_status st =
      ferry_transfer_sync(e, target.target, FERRY_OP_WRITE, buf, target.addr + TARGET_SIZE, 64);
  assert_int_equal(st, FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "not registered"));
  assert_non_null(strstr(ferry_last_error(), target.target));
  st = ferry_transfer_sync(e, target.target, FERRY_OP_WRITE, unregistered, target.addr, 64);
  assert_int_equal(st, FERRY_ENOTREG);
  assert_non_null(strstr(ferry_last_error(), "local address"));
  assert_int_equal(ferry_transfer_sync(e, target.target, FERRY_OP_WRITE, buf, target.addr, 0),
                   FERRY_EINVAL);
  assert_int_equal(ferry_transfer_sync(e, target.target, FERRY_OP_WRITE, buf, target.addr, MiB),
                   FERRY_OK);
  ferry_engine_destroy(e);
  free(buf);
}

static void version_mismatch_names_both_versions(void **state) {
  int fd = raw_connect(target.port);
  assert_true(fd >= 0);
  char reason[1100] = "";
  assert_int_equal(raw_hello(fd, 7, 9, reason, sizeof reason), FERRY_EVERSION);
  assert_non_null(strstr(reason, "7..9"));
  char ours[32];
  snprintf(ours, sizeof ours, "%d..%d", FERRY_WIRE_VERSION_MIN, FERRY_WIRE_VERSION_MAX);
  assert_non_null(strstr(reason, ours));
  close(fd);
}

static void malformed_frames_close_only_their_connection(void **state) {
  static const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n..........";
  int fd = raw_connect(target.port);
  assert_int_equal(raw_send(fd, garbage, sizeof garbage - 1), 0);
  assert_true(raw_closed_by_peer(fd, 5000));
  close(fd);

  fd = raw_connect(target.port);
  assert_int_equal(raw_hello(fd, FERRY_WIRE_VERSION_MIN, FERRY_WIRE_VERSION_MAX, NULL, 0), 0);
  ferry_frame_header h = {.type = FERRY_FRAME_WRITE, .count = 1, .body_len = 1ull << 40};
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  ferry_wire_header_encode(raw, &h);
  assert_int_equal(raw_send(fd, raw, sizeof raw), 0);
  assert_true(raw_closed_by_peer(fd, 5000));
  close(fd);

  fd = raw_connect(target.port); /* truncated frame, then hang up */
  assert_int_equal(raw_hello(fd, FERRY_WIRE_VERSION_MIN, FERRY_WIRE_VERSION_MAX, NULL, 0), 0);
  assert_int_equal(raw_send(fd, raw, 10), 0);
  close(fd);

  ferry_engine *e = test_engine(NULL);
  assert_int_equal(ferry_probe(e, target.target), FERRY_OK);
  uint8_t *buf = test_buffer(e, 4096);
  assert_int_equal(ferry_transfer_sync(e, target.target, FERRY_OP_WRITE, buf, target.addr, 4096),
                   FERRY_OK);
  ferry_engine_destroy(e);
  free(buf);
}

static void probe_live_and_dead_peers(void **state) {
  ferry_engine *e = test_engine(NULL);
  assert_int_equal(ferry_probe(e, target.target), FERRY_OK);
  assert_int_equal(ferry_probe(e, "127.0.0.1:1"), FERRY_ESOCKET);
  assert_non_null(strstr(ferry_last_error(), "127.0.0.1:1"));
  assert_non_null(strstr(ferry_last_error(), "refused"));
  assert_int_equal(ferry_probe(e, "not-a-target"), FERRY_EINVAL);
  assert_int_equal(ferry_probe(e, "no.such.host.invalid:80"), FERRY_EDNS);
  ferry_engine_destroy(e);
}

/* The transports this run is about (FERRY_TEST_TRANSPORTS, default tcp). */
static unsigned suite_transports = FERRY_TRANSPORT_TCP;

static void transport_choice_is_reported(void **state) {
  ferry_engine *e = test_engine(NULL);
  unsigned transport = 0;
  assert_int_equal(ferry_peer_transport(e, target.target, &transport), FERRY_OK);
  assert_true(transport & suite_transports);
  ferry_region *regions;
  size_t count;
  assert_int_equal(ferry_peer_regions(e, target.target, &regions, &count), FERRY_OK);
  assert_int_equal(count, 1);
  assert_int_equal(regions[0].addr, target.addr);
  assert_int_equal(regions[0].length, TARGET_SIZE);
  free(regions);
  ferry_engine_destroy(e);
}

/* utime + stime of a process, in clock ticks. */
static long cpu_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* fields after the command name */
  long utime = 0, stime = 0;
  if (!p ||
      sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &utime, &stime) != 2)
    return -1;
  return utime + stime;
}

/* Both engines (the target process and this one) use at most 2 clock
 * ticks in 2 s of idleness: a poll loop, even one that sleeps a
 * millisecond between rounds, uses far more. The window opens a second
 * after the last transfer, past the bounded spin and yields that follow
 * each completion (ferry_fabric_backoff, FERRY_SPIN_US), which take tens
 * of milliseconds under ThreadSanitizer. */
/* The CPU ticks (10 ms) an idle process may use in 2 s: a poller uses
 * hundreds. ThreadSanitizer's runtime runs a thread of its own and slows
 * every wake-up: idle fabric tcp engines of a TSan build measured 2-4
 * ticks on a 2-vCPU VM, with or without ferry's own threads changed, so
 * that build gets room; the plain and ASan builds keep the strict bound. */
#if defined(__SANITIZE_THREAD__)
#define IDLE_TICKS_MAX 10
#else
#define IDLE_TICKS_MAX 2
#endif

/* A second window is measured when the first is over the bound: a busy
 * VM's one-off wake-ups (3 ticks once, on a loaded CI machine) do not
 * repeat, a poller's do. */
static void assert_idle(const char *what, pid_t target_pid) {
  sleep(1);
  long target_used = LONG_MAX, self_used = LONG_MAX, target_before = 0;
  for (int window = 0; window < 2 && (target_used > IDLE_TICKS_MAX || self_used > IDLE_TICKS_MAX);
       window++) {
    target_before = cpu_ticks(target_pid);
    long self_before = cpu_ticks(getpid());
    sleep(2);
    target_used = cpu_ticks(target_pid) - target_before;
    self_used = cpu_ticks(getpid()) - self_before;
    print_message("%s idle for 2 s: target used %ld ticks, initiator %ld\n", what, target_used,
                  self_used);
  }
  assert_true(target_before >= 0 && target_used <= IDLE_TICKS_MAX);
  assert_true(self_used <= IDLE_TICKS_MAX);
}

/* Nothing polls: a target with open connections and an initiator with
 * pooled channels both sit at zero CPU while no transfer runs. */
static void idle_engines_use_no_cpu(void **state) {
  ferry_engine *e = test_engine(NULL);
  uint8_t *buf = test_buffer(e, MiB);
  assert_int_equal(ferry_transfer_sync(e, target.target, FERRY_OP_WRITE, buf, target.addr, MiB),
                   FERRY_OK);
  assert_idle("idle engines", target.pid);
  ferry_engine_destroy(e);
  free(buf);
}

/* ---- tests with their own targets --------------------------------------------- */

/* FERRY_SPIN_US on both ends: data-socket receives poll before they sleep.
 * Every size still arrives intact (partial non-blocking reads included),
 * and once the traffic stops both engines are back at zero CPU: the spin
 * is bounded. */
static void spinning_receives_then_idle(void **state) {
  setenv("FERRY_SPIN_US", "300", 1); /* the target process inherits it */
  test_target t;
  int started = test_target_start(&t, 0, 16 * MiB, NULL);
  ferry_engine *e = test_engine(NULL);
  unsetenv("FERRY_SPIN_US");
  assert_int_equal(started, 0);
  assert_non_null(e);
  size_t sizes[] = {1, 100, 4096, 20000, 70000, MiB + 1, 5 * MiB + 3};
  uint8_t *buf = test_buffer(e, 6 * MiB), *back = test_buffer(e, 6 * MiB);
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
    for (int round = 0; round < 20; round++)
      test_round_trip(e, t.target, buf, back, t.addr + 4099 * i, sizes[i], 10 * i + round);
  assert_idle("spinning engines", t.pid);
  ferry_engine_destroy(e);
  free(buf);
  free(back);
  assert_int_equal(test_target_stop(&t), 0);
}

static void wrong_secret_is_refused(void **state) {
  test_target t;
  const char *extra[] = {"--secret", "right-secret", NULL};
  assert_int_equal(test_target_start(&t, 0, MiB, extra), 0);
  ferry_engine *none = test_engine(NULL), *wrong = test_engine("wrong-secret"),
               *right = test_engine("right-secret");
  uint8_t *b1 = test_buffer(none, 4096), *b2 = test_buffer(wrong, 4096),
          *b3 = test_buffer(right, 4096);
  assert_int_equal(ferry_transfer_sync(none, t.target, FERRY_OP_WRITE, b1, t.addr, 4096),
                   FERRY_EAUTH);
  assert_non_null(strstr(ferry_last_error(), "secret"));
  assert_int_equal(ferry_transfer_sync(wrong, t.target, FERRY_OP_WRITE, b2, t.addr, 4096),
                   FERRY_EAUTH);
  assert_non_null(strstr(ferry_last_error(), "wrong shared secret"));
  assert_int_equal(ferry_transfer_sync(right, t.target, FERRY_OP_WRITE, b3, t.addr, 4096),
                   FERRY_OK);
  /* Authentication is mutual: an engine with a secret refuses a target
   * that does not ask for it (it could be anyone listening there). */
  test_target open;
  assert_int_equal(test_target_start(&open, 0, MiB, NULL), 0);
  assert_int_equal(ferry_transfer_sync(right, open.target, FERRY_OP_WRITE, b3, open.addr, 4096),
                   FERRY_EAUTH);
  assert_non_null(strstr(ferry_last_error(), "unauthenticated target"));
  assert_int_equal(test_target_stop(&open), 0);
  ferry_engine_destroy(none);
  ferry_engine_destroy(wrong);
  ferry_engine_destroy(right);
  free(b1);
  free(b2);
  free(b3);
  assert_int_equal(test_target_stop(&t), 0);
}

/* A WRITE to a target that stopped mid-conversation times out with the
 * engine's 1 s timeout. Only that WRITE has it: the first contact before
 * it (seconds for a fabric endpoint under a sanitizer on a busy machine)
 * and the call after the target resumed (which first drains what the
 * abandoned call left queued) are not what is tested. The first contact
 * is a WRITE of the same size, so every channel the timed one uses is
 * open before the target stops. */
static void stopped_target_times_out(void **state) {
  test_target t;
  assert_int_equal(test_target_start(&t, 0, 64 * MiB, NULL), 0);
  ferry_engine *e = patient_engine();
  uint8_t *buf = test_buffer(e, 64 * MiB);
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, 64 * MiB),
                   FERRY_OK);
  kill(t.pid, SIGSTOP); /* it stops reading, mid-conversation */
  short_timeouts(e, 1000);
  double t0 = test_now_s();
  ferry_status st = ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, 64 * MiB);
  double took = test_now_s() - t0;
  assert_int_equal(st, FERRY_ETIMEDOUT);
  print_message("timed out after %.2f s: %s\n", took, ferry_last_error());
  assert_true(took < 5.0);
  kill(t.pid, SIGCONT);
  test_engine_set_timeouts(e, TEST_SETUP_MS, TEST_SETUP_MS);
  /* Once it reads again, the next call works. */
  if (ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, MiB))
    fail_msg("call after the target resumed: %s", ferry_last_error());
  ferry_engine_destroy(e);
  free(buf);
  test_target_stop(&t);
}

static void target_restart_on_same_port(void **state) {
  test_target t;
  assert_int_equal(test_target_start(&t, 0, 256 * MiB, NULL), 0);
  uint16_t port = t.port;
  ferry_engine *e = patient_engine(); /* 5 s only for the batch the target's death ends */
  size_t size = 256 * MiB;
  uint8_t *buf = test_buffer(e, size), *back = test_buffer(e, MiB);
  /* The first contact opens as many channels as the batch below uses. */
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, 64 * MiB),
                   FERRY_OK);

  short_timeouts(e, 5000);
  kill(t.pid, SIGSTOP); /* make sure the batch is in flight when the target dies */
  ferry_entry entries[64];
  for (int i = 0; i < 64; i++)
    entries[i] = (ferry_entry){FERRY_OP_WRITE, buf + (size_t)i * 4 * MiB,
                               t.addr + (uint64_t)i * 4 * MiB, 4 * MiB};
  ferry_batch *b;
  assert_int_equal(ferry_batch_submit(e, t.target, entries, 64, NULL, &b), FERRY_OK);
  usleep(200 * 1000);
  double t0 = test_now_s();
  test_target_kill(&t);
  ferry_status st = ferry_batch_wait(b, -1);
  double took = test_now_s() - t0;
  print_message("in-flight batch ended after %.2f s: %s\n", took, ferry_last_error());
  assert_true(st == FERRY_ESOCKET || st == FERRY_ETIMEDOUT);
  assert_non_null(strstr(ferry_last_error(), "127.0.0.1"));
  assert_true(took < 8.0);
  ferry_batch_free(b);

  assert_int_equal(ferry_probe(e, t.target), FERRY_ESOCKET);
  test_engine_set_timeouts(e, TEST_SETUP_MS, TEST_SETUP_MS); /* a first contact again */
  assert_int_equal(test_target_restart(&t, port, 256 * MiB), 0);
  assert_int_equal(t.port, port);
  test_round_trip(e, t.target, buf, back, t.addr, MiB, 4);
  ferry_engine_destroy(e);
  free(buf);
  free(back);
  test_target_stop(&t);
}

/* A batch cancelled while its target is stopped: what had not started
 * never starts (the range of its last entry, far beyond what any
 * transport keeps in flight, holds what it held before), the batch fails
 * with FERRY_ECANCELED once the target resumes and the parts in flight
 * end, and a second cancel finds nothing to cancel. */
static void cancelled_batch_starts_nothing_more(void **state) {
  enum { ENTRIES = 256 };
  const size_t size = ENTRIES * MiB;
  test_target t;
  assert_int_equal(test_target_start(&t, 0, size, NULL), 0);
  ferry_engine *e = patient_engine();
  uint8_t *buf = test_buffer(e, size), *before = test_buffer(e, MiB), *after = test_buffer(e, MiB);
  const uint64_t last = t.addr + (uint64_t)(ENTRIES - 1) * MiB;
  /* First contact: the channels the batch uses open before the target stops. */
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_WRITE, buf, t.addr, 64 * MiB),
                   FERRY_OK);
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_READ, before, last, MiB), FERRY_OK);
  memset(buf, 0x5c, size);
  ferry_entry entries[ENTRIES];
  for (int i = 0; i < ENTRIES; i++)
    entries[i] =
        (ferry_entry){FERRY_OP_WRITE, buf + (size_t)i * MiB, t.addr + (uint64_t)i * MiB, MiB};
  kill(t.pid, SIGSTOP);
  ferry_batch *b;
  assert_int_equal(ferry_batch_submit(e, t.target, entries, ENTRIES, NULL, &b), FERRY_OK);
  assert_int_equal(ferry_batch_cancel(b), FERRY_OK);
  kill(t.pid, SIGCONT);
  assert_int_equal(ferry_batch_wait(b, -1), FERRY_ECANCELED);
  assert_non_null(strstr(ferry_last_error(), "cancelled by the caller"));
  assert_int_equal(ferry_batch_status(b, NULL), FERRY_BATCH_FAILED);
  assert_int_equal(ferry_batch_cancel(b), FERRY_EBUSY);
  assert_non_null(strstr(ferry_last_error(), "has already ended"));
  ferry_batch_free(b);
  assert_int_equal(ferry_transfer_sync(e, t.target, FERRY_OP_READ, after, last, MiB), FERRY_OK);
  assert_memory_equal(after, before, MiB);
  ferry_engine_destroy(e);
  free(buf);
  free(before);
  free(after);
  test_target_stop(&t);
}

/* The initiator of notification_arrives_after_data (child.h): writes the
 * pattern to TARGET at ADDR (hex) with a batch carrying a notification,
 * then sends a plain notification. */
static int notifying_initiator(int argc, char **argv) {
  enum { SIZE = 32 * MiB };
  if (argc != 2)
    return 2;
  const char *target = argv[0];
  uint64_t addr = strtoull(argv[1], NULL, 16);
  ferry_engine *e = test_engine(NULL);
  uint8_t *buf = e ? test_buffer(e, SIZE) : NULL;
  if (!buf)
    return 3;
  test_fill_random(buf, SIZE, 2024);
  ferry_entry entries[32];
  for (int i = 0; i < 32; i++)
    entries[i] =
        (ferry_entry){FERRY_OP_WRITE, buf + (size_t)i * MiB, addr + (uint64_t)i * MiB, MiB};
  ferry_notification note = {"kv-ready", "request-42", 10};
  ferry_status st = ferry_transfer_sync_batch(e, target, entries, 32, &note);
  if (!st)
    st = ferry_notify_send(e, target, "plain", "hello", 5);
  if (st)
    fprintf(stderr, "notifying initiator: %s\n", ferry_last_error());
  ferry_engine_destroy(e);
  free(buf);
  return st == FERRY_OK ? 0 : 1;
}

/* The target is this process; the initiator is another (this program
 * started again: notifying_initiator), which writes a pattern with a
 * batch carrying a notification. When the notification is seen, the whole
 * pattern must already be in memory. */
static void notification_arrives_after_data(void **state) {
  enum { SIZE = 32 * MiB };
  ferry_engine *e = test_engine(NULL);
  void *landing;
  assert_int_equal(ferry_memory_alloc(e, SIZE, &landing), FERRY_OK);
  uint8_t *expected = malloc(SIZE);
  test_fill_random(expected, SIZE, 2024);
  char addr[32];
  snprintf(addr, sizeof addr, "%llx", (unsigned long long)(uintptr_t)landing);
  const char *args[] = {ferry_engine_name(e), addr, NULL};
  pid_t pid = test_child_start("notifying-initiator", args, NULL, NULL);
  assert_true(pid > 0);
  /* Its start and first contact are not the point: the bound is generous,
   * and a child that failed ends the wait. */
  int got_batch = 0, got_plain = 0, exited = 0, status = 0;
  double deadline = test_now_s() + TEST_SETUP_MS / 1000.0;
  while (!(got_batch && got_plain) && test_now_s() < deadline) {
    int ended = exited || (exited = waitpid(pid, &status, WNOHANG) == pid);
    ferry_notification *list;
    size_t count;
    assert_int_equal(ferry_notify_drain(e, &list, &count), FERRY_OK);
    for (size_t i = 0; i < count; i++) {
      if (strcmp(list[i].name, "kv-ready") == 0) {
        assert_string_equal(list[i].data, "request-42");
        assert_memory_equal(landing, expected, SIZE); /* data before notification */
        got_batch = 1;
      } else if (strcmp(list[i].name, "plain") == 0) {
        assert_int_equal(list[i].length, 5);
        got_plain = 1;
      }
    }
    ferry_notify_free(list, count);
    if (ended && !count)
      break; /* it is gone and nothing more came */
    usleep(5000);
  }
  if (!exited)
    assert_int_equal(test_wait_exit(pid, TEST_SETUP_MS, &status), 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_true(got_batch && got_plain);
  free(expected);
  ferry_memory_free(e, landing);
  ferry_engine_destroy(e);
}

/* Two engines in this process: the target registers a region after the
 * initiator fetched its table; the initiator refreshes on the miss. */
static void region_registered_after_connect_is_reachable(void **state) {
  ferry_engine *a = test_engine(NULL), *b = test_engine(NULL);
  uint8_t *first = test_buffer(a, 4096), *src = test_buffer(b, MiB);
  assert_int_equal(ferry_transfer_sync(b, ferry_engine_name(a), FERRY_OP_WRITE, src,
                                       (uint64_t)(uintptr_t)first, 4096),
                   FERRY_OK);
  uint8_t *later = test_buffer(a, MiB);
  test_fill_random(src, MiB, 3);
  assert_int_equal(ferry_transfer_sync(b, ferry_engine_name(a), FERRY_OP_WRITE, src,
                                       (uint64_t)(uintptr_t)later, MiB),
                   FERRY_OK);
  assert_memory_equal(src, later, MiB);
  /* after unregistration the target refuses again */
  assert_int_equal(ferry_memory_unregister(a, later), FERRY_OK);
  assert_int_equal(ferry_transfer_sync(b, ferry_engine_name(a), FERRY_OP_WRITE, src,
                                       (uint64_t)(uintptr_t)later, MiB),
                   FERRY_ENOTREG);
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  free(first);
  free(later);
  free(src);
}

struct write_job {
  ferry_engine *engine;
  const char *target;
  uint8_t *src;
  uint64_t remote;
  size_t size;
  ferry_status st;
  char error[512];
};

static void *run_write(void *arg) {
  struct write_job *job = arg;
  job->st = ferry_transfer_sync(job->engine, job->target, FERRY_OP_WRITE, job->src, job->remote,
                                job->size);
  snprintf(job->error, sizeof job->error, "%s", ferry_last_error());
  return NULL;
}

/* Once unregister returns, no byte of a WRITE in flight lands in the region
 * any more, and the initiator's call fails with the target's reason
 * (FERRY_ENOTREG, naming the step and the target), although over tcp its
 * send met the reset of the connection the target closed.
 * The WRITE is one 64 MiB frame; unregister is called once its first byte
 * is in the target's memory and its last is not, so it is provably in
 * flight. The owner then overwrites the region: no byte of the WRITE may
 * reach it afterwards. */
static void unregister_waits_for_writes_in_flight(void **state) {
  size_t size = LARGEST_BLOCK;
  ferry_config cfg;
  test_config(&cfg);
  cfg.slice_size = size; /* one frame */
  cfg.tcp_connections = 1;
  ferry_engine *a = test_engine(NULL), *b = NULL;
  assert_int_equal(ferry_engine_create(&cfg, &b), FERRY_OK);
  uint8_t *src = test_buffer(b, size);
  memset(src, 0xab, size);
  int fenced = 0;
  for (int attempt = 0; attempt < 10 && !fenced; attempt++) {
    volatile uint8_t *dst = test_buffer(a, size);
    memset((uint8_t *)dst, 0, size);
    struct write_job job = {.engine = b,
                            .target = ferry_engine_name(a),
                            .src = src,
                            .remote = (uint64_t)(uintptr_t)dst,
                            .size = size};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, run_write, &job), 0);
    double until = test_now_s() + 10;
    while (dst[0] != 0xab && test_now_s() < until)
      sched_yield();
    fenced = dst[0] == 0xab && dst[size - 1] != 0xab;
    double t0 = test_now_s();
    assert_int_equal(ferry_memory_unregister(a, (void *)dst), FERRY_OK);
    double took = test_now_s() - t0;
    memset((uint8_t *)dst, 0x5c, size); /* the owner reuses the memory */
    pthread_join(thread, NULL);
    print_message("attempt %d: in flight %d, unregister %.3f ms, WRITE: %s\n", attempt, fenced,
                  took * 1e3, job.st ? job.error : "success");
    if (fenced) {
      assert_true(took < 1.0);
      assert_int_equal(job.st, FERRY_ENOTREG); /* the target's reason, not the reset */
      assert_non_null(strstr(job.error, "registered"));
      assert_non_null(strstr(job.error, "WRITE"));
      assert_non_null(strstr(job.error, ferry_engine_name(a)));
    }
    for (size_t i = 0; i < size; i++)
      if (dst[i] != 0x5c)
        fail_msg("byte %zu of the WRITE landed after unregister returned", i);
    free((void *)dst);
  }
  assert_true(fenced);
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  free(src);
}

/* A target that never drains refuses notifications past its queue limit
 * instead of growing without bound, and accepts again once drained. */
static void undrained_notifications_are_bounded(void **state) {
  ferry_engine *a = test_engine(NULL), *b = test_engine(NULL);
  size_t size = 4 * MiB;
  char *data = calloc(1, size);
  ferry_status st = FERRY_OK;
  int sent = 0;
  while (sent < 64 &&
         (st = ferry_notify_send(b, ferry_engine_name(a), "big", data, size)) == FERRY_OK)
    sent++;
  assert_int_equal(st, FERRY_EBUSY);
  assert_non_null(strstr(ferry_last_error(), "queue"));
  assert_true(sent >= 8 && sent <= 16);
  ferry_notification *list;
  size_t count;
  assert_int_equal(ferry_notify_drain(a, &list, &count), FERRY_OK);
  assert_int_equal(count, (size_t)sent);
  ferry_notify_free(list, count);
  assert_int_equal(ferry_notify_send(b, ferry_engine_name(a), "big", data, size), FERRY_OK);
  free(data);
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
}

static void registration_rules(void **state) {
  ferry_engine *e = test_engine(NULL);
  uint8_t *buf = malloc(8192);
  assert_int_equal(ferry_memory_register(e, buf, 4096), FERRY_OK);
  assert_int_equal(ferry_memory_register(e, buf, 4096), FERRY_OK); /* identical: harmless */
  assert_int_equal(ferry_memory_register(e, buf + 100, 4096), FERRY_EOVERLAP);
  assert_non_null(strstr(ferry_last_error(), "overlaps"));
  assert_int_equal(ferry_memory_unregister(e, buf + 1), FERRY_ENOTREG);
  assert_int_equal(ferry_memory_unregister(e, buf), FERRY_OK);
  void *addrs[2] = {buf, buf + 4096};
  size_t lens[2] = {4096, 4096};
  assert_int_equal(ferry_memory_register_batch(e, addrs, lens, 2), FERRY_OK);
  assert_int_equal(ferry_memory_unregister_batch(e, addrs, 2), FERRY_OK);
  ferry_engine_destroy(e);
  free(buf);
}

static void ipv6_loopback_target(void **state) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "::1";
  ferry_engine *a = NULL;
  if (ferry_engine_create(&cfg, &a) != FERRY_OK) {
    print_message("IPv6 loopback unavailable here: %s\n", ferry_last_error());
    skip();
  }
  ferry_engine *b = test_engine(NULL);
  assert_non_null(strstr(ferry_engine_name(a), "[::1]:"));
  uint8_t *dst = test_buffer(a, 4096), *src = test_buffer(b, 4096);
  test_fill_random(src, 4096, 6);
  assert_int_equal(ferry_transfer_sync(b, ferry_engine_name(a), FERRY_OP_WRITE, src,
                                       (uint64_t)(uintptr_t)dst, 4096),
                   FERRY_OK);
  assert_memory_equal(src, dst, 4096);
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  free(dst);
  free(src);
}

static void assert_staged(ferry_engine *e, uint64_t write, uint64_t read) {
  ferry_stats *st;
  assert_int_equal(ferry_stats_snapshot(e, &st), FERRY_OK);
  assert_int_equal(st->staged_bytes[FERRY_OP_WRITE], write);
  assert_int_equal(st->staged_bytes[FERRY_OP_READ], read);
  ferry_stats_free(st);
}

/* The staging pipeline's mode for host memory: under FERRY_STAGING=always
 * (ctest: test_transfer_tcp_staged, where every case of this suite runs
 * staged) each byte of a WRITE and a READ crosses the bounce buffers on
 * both sides; under auto (the default) host memory never does. Both
 * engines are in this process, so both sides' counters are seen. */
static void staging_moves_host_memory_only_when_asked(void **state) {
  const char *mode = getenv("FERRY_STAGING");
  int always = mode && !strcasecmp(mode, "always");
  if (!(suite_transports & FERRY_TRANSPORT_TCP))
    skip(); /* staging is the tcp transport's */
  ferry_engine *target = test_engine(NULL), *initiator = test_engine(NULL);
  size_t size = 3 * MiB + 5; /* slices of the pipeline, and a ragged end */
  uint8_t *remote = test_buffer(target, size + 64), *out = test_buffer(initiator, size),
          *in = test_buffer(initiator, size);
  test_round_trip(initiator, ferry_engine_name(target), out, in, (uint64_t)(uintptr_t)remote + 7,
                  size, 41);
  assert_memory_equal(remote + 7, out, size);
  uint64_t staged = always ? size : 0;
  assert_staged(initiator, staged, staged);
  assert_staged(target, staged, staged);
  ferry_engine_destroy(initiator);
  ferry_engine_destroy(target);
  free(remote);
  free(out);
  free(in);
}

int main(int argc, char **argv) {
  const test_child_role roles[] = {{"notifying-initiator", notifying_initiator}};
  test_child_main(argc, argv, roles, sizeof roles / sizeof *roles);
  /* This suite is about the TCP path; same-host shm has test_shm.c. The
   * target processes inherit the setting. FERRY_TEST_TRANSPORTS runs the
   * same cases over another transport (ctest: test_transfer_fabric_*),
   * and then transport_choice_is_reported checks that one was used. */
  const char *filter = getenv("FERRY_TEST_FILTER"); /* one case, by name (a glob) */
  if (filter && *filter)
    cmocka_set_test_filter(filter);
  const char *forced = getenv("FERRY_TEST_TRANSPORTS");
  if (forced && *forced && !(suite_transports = ferry_transport_parse(forced)))
    return fprintf(stderr, "FERRY_TEST_TRANSPORTS=%s names no transport\n", forced), 1;
  setenv("FERRY_TRANSPORTS", forced && *forced ? forced : "tcp", 1);
  if (!(suite_transports & FERRY_TRANSPORT_TCP)) {
    ferry_engine *e = test_engine(NULL); /* a provider this libfabric lacks: skipped */
    if (!e && strstr(ferry_last_error(), "no such provider or device here"))
      return fprintf(stderr, "[  SKIPPED ] %s\n", ferry_last_error()), 77;
    ferry_engine_destroy(e);
  }
  struct CMUnitTest shared_target[] = {
      cmocka_unit_test(random_sizes_round_trip),
      cmocka_unit_test(hundred_thousand_entry_batch),
      cmocka_unit_test(async_batch_polled_to_completion),
      cmocka_unit_test(many_threads_one_engine),
      cmocka_unit_test(target_refuses_unregistered_and_connection_survives),
      cmocka_unit_test(initiator_refuses_unregistered_addresses),
      cmocka_unit_test(version_mismatch_names_both_versions),
      cmocka_unit_test(malformed_frames_close_only_their_connection),
      cmocka_unit_test(probe_live_and_dead_peers),
      cmocka_unit_test(transport_choice_is_reported),
      cmocka_unit_test(idle_engines_use_no_cpu),
  };
  struct CMUnitTest own_targets[] = {
      cmocka_unit_test(wrong_secret_is_refused),
      cmocka_unit_test(stopped_target_times_out),
      cmocka_unit_test(target_restart_on_same_port),
      cmocka_unit_test(cancelled_batch_starts_nothing_more),
      cmocka_unit_test(notification_arrives_after_data),
      cmocka_unit_test(region_registered_after_connect_is_reachable),
      cmocka_unit_test(undrained_notifications_are_bounded),
      cmocka_unit_test(unregister_waits_for_writes_in_flight),
      cmocka_unit_test(registration_rules),
      cmocka_unit_test(ipv6_loopback_target),
      cmocka_unit_test(spinning_receives_then_idle),
      cmocka_unit_test(staging_moves_host_memory_only_when_asked),
  };
  size_t shared = test_keep_cases(shared_target, sizeof shared_target / sizeof *shared_target);
  size_t own = test_keep_cases(own_targets, sizeof own_targets / sizeof *own_targets);
  int failed =
      _cmocka_run_group_tests("shared target", shared_target, shared, start_target, stop_target);
  failed += _cmocka_run_group_tests("own targets", own_targets, own, NULL, NULL);
  return failed;
}
