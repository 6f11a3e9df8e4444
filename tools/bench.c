/* bench.c - `ferry bench`: drives WRITE or READ batches against a target
 * (usually `ferry serve`) from N threads for a fixed time and reports
 * throughput, per-batch latency percentiles and CPU cost, optionally checking
 * every byte. Each thread owns a disjoint slice of the remote buffer and its
 * own registered local buffer, so threads never race on data and --verify
 * can predict exactly what each slice must hold. With --random-offsets the
 * entries land on block-sized slots picked at random (fixed seed) from the
 * whole remote region instead, still disjoint between threads. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "commands.h"
#include "ferry.h"

#define PROG "ferry bench"
#define NS_PER_S 1000000000ull
/* Runs longer than this get a progress line every PROGRESS_EVERY_S. */
#define PROGRESS_AFTER_S 10.0
#define PROGRESS_EVERY_S 5
/* Byte written over the local buffer before each verified read, so a read
 * that silently moved nothing cannot pass as correct. */
#define POISON 0xA5
/* Mismatches reported in detail per thread; the rest are only counted. */
#define MISMATCH_REPORT_MAX 3

typedef struct bench_opts {
  ferry_cli_engine_opts engine;
  const char *target;
  uint64_t remote_addr;
  int remote_addr_set;
  ferry_op op;
  size_t block;
  unsigned long batch;
  unsigned long threads;
  double duration;
  int verify;
  int json;
  int random_offsets;
  unsigned long depth;         /* batches in flight per thread (async when > 1) */
  unsigned long first_contact; /* rounds of first_contact.c instead of a run */
  int send;                    /* --op send: bench_send.c instead of a run */
  int fixed_write;             /* --op send: its WRITEs all into one BLOCK */
} bench_opts;

/* Latencies of one thread's batch calls, in nanoseconds. */
typedef struct lat_log {
  uint64_t *ns;
  size_t count;
  size_t cap;
} lat_log;

typedef struct bench_shared {
  ferry_engine *engine;
  const bench_opts *opts;
  uint64_t remote_base;
  /* Every phase change (prepared, started, stopped, measured) is one
   * rendezvous of all workers and the main thread on this barrier. */
  pthread_barrier_t phase;
  uint64_t deadline_ns; /* written by main between two barrier waits */
  uint64_t *slots;      /* --random-offsets: threads*batch slot numbers */
  sigset_t stop;        /* SIGINT, SIGTERM: end the run early, keep its result */
  atomic_int interrupted;
} bench_shared;

typedef struct bench_worker {
  bench_shared *shared;
  unsigned index;
  pthread_t thread;
  size_t span;       /* batch * block: bytes per batch call */
  uint64_t remote;   /* start of this thread's slice of the remote buffer */
  uint8_t *local;    /* registered, span bytes */
  uint8_t *expected; /* --verify --op read: what the remote slice holds */
  ferry_entry *entries;
  _Atomic uint64_t bytes; /* read by the progress printer while running */
  uint64_t iterations;
  lat_log lat;
  unsigned errors;
  uint64_t mismatches;
  uint64_t verified_bytes;
} bench_worker;

typedef struct bench_result {
  uint64_t bytes;
  double seconds;
  double p50_us;
  double p99_us;
  unsigned errors;
  uint64_t mismatches;
  uint64_t verified_bytes;
  double cpu_user_s;
  double cpu_sys_s;
  const char *protocol;
  int interrupted; /* stopped by SIGINT/SIGTERM before the duration */
} bench_result;

/* ---- Options ------------------------------------------------------------ */

static void bench_usage(FILE *out) {
  fprintf(out, "usage: ferry bench --target HOST:PORT|SEGMENT [options]\n"
               "  --target T         the peer to transfer with (required)\n"
               "  --metadata URL     look T up as a segment name in this store\n"
               "  --first-contact N  instead: N rounds of engine start -> first WRITE to T,\n"
               "                     store lookups and known-peer WRITEs (needs --metadata)\n"
               "  --remote-addr A    remote start address (default: the target's first region)\n"
               "  --op write|read    direction (default write)\n"
               "  --op send          instead: ferry_send into a receive pool of a second\n"
               "                     engine here, next to sync WRITEs of --block bytes from\n"
               "                     --threads senders (no --target; --duration each),\n"
               "                     each WRITE into the next block of a buffer as large\n"
               "                     as the pool\n"
               "  --fixed-write      --op send: every WRITE into the same block instead\n"
               "                     (cache-hot: a memcpy, not a message's cost)\n"
               "  --block SIZE       bytes per entry, K/M/G suffixes (default 1M)\n"
               "  --batch N          entries per submitted batch (default 1)\n"
               "  --random-offsets   scatter entries over random block-sized slots of the\n"
               "                     remote region (default: one contiguous slice)\n"
               "  --threads N        concurrent threads, each on its own slice (default 1)\n"
               "  --depth N          batches each thread keeps in flight, submitted\n"
               "                     asynchronously (default 1: synchronous calls)\n"
               "  --duration SEC     timed run length (default 5)\n"
               "  --verify           write: read each slice back after the run and compare;\n"
               "                     read: seed a pattern, compare every read byte\n"
               "  --json             print one JSON object instead of a line of text\n"
               "                     (gbytes_per_s: 10^9 bytes per second; p50_us, p99_us:\n"
               "                     latency of one batch call, submit to completion)\n"
               "  --protocol P       tcp|shm|fabric|all, or a list (tcp,shm): transports to allow\n"
               "                     (default all)\n"
               "  --connections N    TCP data connections per peer\n"
               "  --secret S         shared secret\n"
               "  --host ADDR        address of this side's engine (default 127.0.0.1)\n"
               "SIGINT (Ctrl-C) or SIGTERM ends the run early: the result so far is printed\n"
               "(\"interrupted\":true in JSON) and the exit code is 130.\n");
}

static int parse_op(const char *text, ferry_op *op) {
  if (strcmp(text, "write") == 0)
    *op = FERRY_OP_WRITE;
  else if (strcmp(text, "read") == 0)
    *op = FERRY_OP_READ;
  else
    return -1;
  return 0;
}

static int parse_duration(const char *text, double *out) {
  char *end;
  double d = strtod(text, &end);
  if (end == text || *end != '\0' || !(d > 0.0) || d > 1e6)
    return -1;
  *out = d;
  return 0;
}

static int parse_addr(const char *text, uint64_t *out) {
  char *end;
  unsigned long long a = strtoull(text, &end, 0);
  if (end == text || *end != '\0' || text[0] == '-')
    return -1;
  *out = a;
  return 0;
}

/* Handles one option; returns 0, or 2 after printing a usage error. */
static int apply_option(int c, const char *arg, bench_opts *o) {
  unsigned long n;
  switch (c) {
  case 't': o->target = arg; return 0;
  case 'S': o->engine.secret = arg; return 0;
  case 'H': o->engine.host = arg; return 0;
  case 'M': o->engine.metadata_url = arg; return 0;
  case 'F':
    return ferry_cli_parse_count(arg, 1, 10000, &o->first_contact)
               ? ferry_cli_bad_value(PROG, "first-contact", arg)
               : 0;
  case 'v': o->verify = 1; return 0;
  case 'j': o->json = 1; return 0;
  case 'r': o->random_offsets = 1; return 0;
  case 'X': o->fixed_write = 1; return 0;
  case 'a':
    o->remote_addr_set = 1;
    return parse_addr(arg, &o->remote_addr) ? ferry_cli_bad_value(PROG, "remote-addr", arg) : 0;
  case 'o':
    o->send = strcmp(arg, "send") == 0;
    return !o->send && parse_op(arg, &o->op) ? ferry_cli_bad_value(PROG, "op", arg) : 0;
  case 'b':
    return ferry_cli_parse_size(arg, &o->block) ? ferry_cli_bad_value(PROG, "block", arg) : 0;
  case 'B':
    return ferry_cli_parse_count(arg, 1, 1ul << 20, &o->batch)
               ? ferry_cli_bad_value(PROG, "batch", arg)
               : 0;
  case 'D':
    return ferry_cli_parse_count(arg, 1, 1024, &o->depth) ? ferry_cli_bad_value(PROG, "depth", arg)
                                                          : 0;
  case 'T':
    return ferry_cli_parse_count(arg, 1, 1024, &o->threads)
               ? ferry_cli_bad_value(PROG, "threads", arg)
               : 0;
  case 'd':
    return parse_duration(arg, &o->duration) ? ferry_cli_bad_value(PROG, "duration", arg) : 0;
  case 'P':
    return ferry_cli_parse_protocol(arg, &o->engine.transports)
               ? ferry_cli_bad_value(PROG, "protocol", arg)
               : 0;
  case 'c':
    if (ferry_cli_parse_count(arg, 1, 1024, &n) != 0)
      return ferry_cli_bad_value(PROG, "connections", arg);
    o->engine.connections = (unsigned)n;
    return 0;
  default: return 2;
  }
}

/* Returns 0 to run, 1 for --help, 2 on a usage error. */
static int parse_bench_args(int argc, char **argv, bench_opts *o) {
  static const struct option longopts[] = {{"target", required_argument, NULL, 't'},
                                           {"remote-addr", required_argument, NULL, 'a'},
                                           {"op", required_argument, NULL, 'o'},
                                           {"block", required_argument, NULL, 'b'},
                                           {"batch", required_argument, NULL, 'B'},
                                           {"random-offsets", no_argument, NULL, 'r'},
                                           {"threads", required_argument, NULL, 'T'},
                                           {"depth", required_argument, NULL, 'D'},
                                           {"duration", required_argument, NULL, 'd'},
                                           {"verify", no_argument, NULL, 'v'},
                                           {"json", no_argument, NULL, 'j'},
                                           {"protocol", required_argument, NULL, 'P'},
                                           {"connections", required_argument, NULL, 'c'},
                                           {"secret", required_argument, NULL, 'S'},
                                           {"host", required_argument, NULL, 'H'},
                                           {"metadata", required_argument, NULL, 'M'},
                                           {"first-contact", required_argument, NULL, 'F'},
                                           {"fixed-write", no_argument, NULL, 'X'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  memset(o, 0, sizeof *o);
  ferry_cli_engine_opts_init(&o->engine);
  o->engine.client = 1;
  o->op = FERRY_OP_WRITE;
  o->block = (size_t)1 << 20;
  o->batch = 1;
  o->threads = 1;
  o->depth = 1;
  o->duration = 5.0;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    if (c == 'h')
      return 1;
    if (apply_option(c, optarg, o) != 0)
      return 2;
  }
  if (optind != argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", PROG, argv[optind]);
    return 2;
  }
  if (o->target == NULL && !o->send) {
    fprintf(stderr, "%s: --target is required\n", PROG);
    return 2;
  }
  if (o->depth > 1 && o->verify) {
    /* In-flight batches share one buffer: their bytes cannot be predicted. */
    fprintf(stderr, "%s: --verify needs --depth 1\n", PROG);
    return 2;
  }
  return 0;
}

/* ---- Patterns ----------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
  /* splitmix64 finaliser: neighbouring (thread, iteration, entry) triples
   * get unrelated seeds, so a block landing in the wrong place is caught. */
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static uint64_t pattern_seed(unsigned thread, uint64_t iteration, size_t entry) {
  return mix64(mix64(mix64(thread) + iteration) + entry);
}

/* Word i of a block is seed + i * step: cheap enough to run before every
 * write, and it differs at every offset, so shifted data is caught too. */
#define PATTERN_STEP 0xD1B54A32D192ED03ull

static void fill_pattern(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t v = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8, v += PATTERN_STEP)
    memcpy(p + i, &v, 8);
  memcpy(p + i, &v, n - i);
}

/* Returns the offset of the first byte that differs from the pattern, or n. */
static size_t check_pattern(const uint8_t *p, size_t n, uint64_t seed) {
  uint64_t v = seed;
  for (size_t i = 0; i < n; i += 8, v += PATTERN_STEP) {
    size_t len = n - i < 8 ? n - i : 8;
    if (memcmp(p + i, &v, len) == 0)
      continue;
    for (size_t j = 0; j < len; j++)
      if (p[i + j] != ((const uint8_t *)&v)[j])
        return i + j;
  }
  return n;
}

/* ---- Worker ------------------------------------------------------------- */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static void lat_push(lat_log *log, uint64_t ns) {
  if (log->count == log->cap) {
    size_t cap = log->cap ? log->cap * 2 : 4096;
    uint64_t *grown = realloc(log->ns, cap * sizeof *grown);
    if (grown == NULL)
      return; /* a missing sample skews nothing measurable; keep running */
    log->ns = grown;
    log->cap = cap;
  }
  log->ns[log->count++] = ns;
}

static void set_entries_op(bench_worker *w, ferry_op op) {
  for (size_t e = 0; e < w->shared->opts->batch; e++)
    w->entries[e].op = op;
}

static int interrupted(const bench_shared *s) {
  return atomic_load_explicit(&s->interrupted, memory_order_relaxed);
}

static ferry_status run_batch(bench_worker *w) {
  const bench_shared *s = w->shared;
  return ferry_transfer_sync_batch(s->engine, s->opts->target, w->entries, s->opts->batch, NULL);
}

static void report_error(bench_worker *w, const char *what, ferry_status st) {
  fprintf(stderr, "%s: thread %u: %s: %s: %s\n", PROG, w->index, what, ferry_strerror(st),
          ferry_last_error());
  w->errors++;
}

/* Fills every block of the local buffer with its pattern for iteration. */
static void fill_batch(bench_worker *w, uint8_t *buf, uint64_t iteration) {
  const bench_opts *o = w->shared->opts;
  for (size_t e = 0; e < o->batch; e++)
    fill_pattern(buf + e * o->block, o->block, pattern_seed(w->index, iteration, e));
}

/* Compares every block of the local buffer with its pattern for iteration;
 * returns the number of blocks that differ. */
static uint64_t check_batch(bench_worker *w, uint64_t iteration) {
  const bench_opts *o = w->shared->opts;
  uint64_t bad = 0;
  for (size_t e = 0; e < o->batch; e++) {
    const uint8_t *blk = w->local + e * o->block;
    size_t at = check_pattern(blk, o->block, pattern_seed(w->index, iteration, e));
    if (at == o->block)
      continue;
    if (w->mismatches + bad < MISMATCH_REPORT_MAX)
      fprintf(stderr, "%s: thread %u: block %zu (remote 0x%" PRIx64 ") differs at byte %zu\n", PROG,
              w->index, e, w->entries[e].remote, at);
    bad++;
  }
  return bad;
}

/* --verify --op read: put a known pattern into this thread's slice first,
 * and keep a private copy to compare every read with. */
static ferry_status prepare_read_verify(bench_worker *w) {
  fill_batch(w, w->local, 0);
  memcpy(w->expected, w->local, w->span);
  set_entries_op(w, FERRY_OP_WRITE);
  ferry_status st = run_batch(w);
  set_entries_op(w, FERRY_OP_READ);
  if (st != FERRY_OK)
    report_error(w, "writing the pattern to verify reads against", st);
  return st;
}

/* Compares one verified read with the expected slice contents. */
static void check_read(bench_worker *w) {
  if (memcmp(w->local, w->expected, w->span) == 0) {
    w->verified_bytes += w->span;
    return;
  }
  w->mismatches += check_batch(w, 0);
}

/* --verify --op write: after the run, read the slice back; it must hold the
 * pattern of the last iteration written. */
static void verify_written(bench_worker *w) {
  if (w->iterations == 0)
    return;
  memset(w->local, POISON, w->span);
  set_entries_op(w, FERRY_OP_READ);
  ferry_status st = run_batch(w);
  set_entries_op(w, FERRY_OP_WRITE);
  if (st != FERRY_OK) {
    report_error(w, "reading back the written data", st);
    return;
  }
  uint64_t bad = check_batch(w, w->iterations - 1);
  w->mismatches += bad;
  if (bad == 0)
    w->verified_bytes += w->span;
}

/* One finished batch: its latency and its bytes. */
static void count_batch(bench_worker *w, uint64_t ns) {
  lat_push(&w->lat, ns);
  atomic_store_explicit(&w->bytes, atomic_load_explicit(&w->bytes, memory_order_relaxed) + w->span,
                        memory_order_relaxed);
  w->iterations++;
}

/* The timed loop: one batch call per iteration until the deadline. */
static void run_timed(bench_worker *w) {
  const bench_opts *o = w->shared->opts;
  const int verify_write = o->verify && o->op == FERRY_OP_WRITE;
  const int verify_read = o->verify && o->op == FERRY_OP_READ;
  uint64_t deadline = w->shared->deadline_ns;
  uint64_t t = now_ns();
  while (t < deadline && !interrupted(w->shared)) {
    if (verify_write)
      fill_batch(w, w->local, w->iterations);
    else if (verify_read)
      memset(w->local, POISON, w->span);
    uint64_t t0 = now_ns();
    ferry_status st = run_batch(w);
    t = now_ns();
    if (st != FERRY_OK) {
      /* A failed batch nearly always means a broken peer; retrying would
       * only repeat the same message until the deadline. */
      report_error(w, o->op == FERRY_OP_WRITE ? "write failed" : "read failed", st);
      return;
    }
    count_batch(w, t - t0);
    if (verify_read)
      check_read(w);
  }
}

/* --depth N: keeps N batches over the same buffers in flight, submitting a
 * new one as the oldest completes; latency is submit to completion. Those
 * still in flight at the deadline are waited for and counted (the run's
 * time includes them). */
static void run_timed_async(bench_worker *w) {
  const bench_opts *o = w->shared->opts;
  const bench_shared *s = w->shared;
  ferry_batch **flight = calloc(o->depth, sizeof *flight);
  uint64_t *start = calloc(o->depth, sizeof *start);
  if (flight == NULL || start == NULL) {
    report_error(w, "no memory for the batches in flight", FERRY_ENOMEM);
    free(flight);
    free(start);
    return;
  }
  ferry_status st = FERRY_OK;
  for (size_t i = 0; i < o->depth && st == FERRY_OK; i++) {
    start[i] = now_ns();
    st = ferry_batch_submit(s->engine, o->target, w->entries, o->batch, NULL, &flight[i]);
  }
  if (st != FERRY_OK)
    report_error(w, "submit failed", st);
  for (size_t i = 0; flight[i] != NULL; i = (i + 1) % o->depth) {
    ferry_status done = ferry_batch_wait(flight[i], -1);
    uint64_t t = now_ns();
    ferry_batch_free(flight[i]);
    flight[i] = NULL;
    if (done != FERRY_OK) {
      if (st == FERRY_OK)
        report_error(w, o->op == FERRY_OP_WRITE ? "write failed" : "read failed", done);
      st = done;
      continue;
    }
    count_batch(w, t - start[i]);
    if (st == FERRY_OK && t < s->deadline_ns && !interrupted(s)) {
      start[i] = now_ns();
      st = ferry_batch_submit(s->engine, o->target, w->entries, o->batch, NULL, &flight[i]);
      if (st != FERRY_OK)
        report_error(w, "submit failed", st);
    }
  }
  for (size_t i = 0; i < o->depth; i++) /* after a failure, the rest */
    if (flight[i] != NULL)
      ferry_batch_free(flight[i]);
  free(flight);
  free(start);
}

static void *worker_main(void *arg) {
  bench_worker *w = arg;
  const bench_opts *o = w->shared->opts;
  ferry_status prep = FERRY_OK;
  if (o->verify && o->op == FERRY_OP_READ)
    prep = prepare_read_verify(w);
  pthread_barrier_wait(&w->shared->phase); /* prepared */
  pthread_barrier_wait(&w->shared->phase); /* deadline set: go */
  if (prep == FERRY_OK && o->depth > 1)
    run_timed_async(w);
  else if (prep == FERRY_OK)
    run_timed(w);
  pthread_barrier_wait(&w->shared->phase); /* stopped */
  pthread_barrier_wait(&w->shared->phase); /* main has measured */
  if (o->verify && o->op == FERRY_OP_WRITE && w->errors == 0)
    verify_written(w);
  return NULL;
}

/* ---- Set-up ------------------------------------------------------------- */

/* Picks the remote start address and checks that every thread's slice fits
 * inside one registered region of the target; *room gets the bytes from
 * the start to the end of that region. */
static int resolve_remote(ferry_engine *engine, const bench_opts *o, uint64_t *base,
                          uint64_t *room) {
  ferry_region *regions = NULL;
  size_t count = 0;
  ferry_status st = ferry_peer_regions(engine, o->target, &regions, &count);
  if (st != FERRY_OK) {
    ferry_cli_report(PROG, "cannot fetch the target's registered regions", st);
    return -1;
  }
  int rc = -1;
  const ferry_region *r = NULL;
  for (size_t i = 0; i < count && r == NULL; i++) {
    uint64_t want = o->remote_addr_set ? o->remote_addr : regions[i].addr;
    if (want >= regions[i].addr && want - regions[i].addr < regions[i].length)
      r = &regions[i];
  }
  uint64_t start = o->remote_addr_set ? o->remote_addr : (r ? r->addr : 0);
  /* Checked multiplication: with large --threads/--batch/--block the product
   * must not wrap into something that appears to fit. */
  uint64_t need;
  if (r == NULL) {
    if (o->remote_addr_set)
      fprintf(stderr, "%s: 0x%" PRIx64 " is not inside any region registered at %s\n", PROG,
              o->remote_addr, o->target);
    else
      fprintf(stderr, "%s: %s has no registered memory\n", PROG, o->target);
  } else if (__builtin_mul_overflow((uint64_t)o->threads * o->batch, (uint64_t)o->block, &need) ||
             need > r->addr + r->length - start) {
    fprintf(stderr,
            "%s: threads*batch*block = %lu*%lu*%zu bytes does not fit the %" PRIu64
            " bytes registered at %s from 0x%" PRIx64 "\n",
            PROG, o->threads, o->batch, o->block, r->addr + r->length - start, o->target, start);
  } else {
    *base = start;
    *room = r->addr + r->length - start;
    rc = 0;
  }
  free(regions);
  return rc;
}

/* Largest region span --random-offsets scatters over, in multiples of the
 * entries placed: wide enough to defeat locality, small enough for a bitmap. */
#define RANDOM_SPREAD_MAX 64

/* --random-offsets: n distinct slot numbers below room/block, in random order,
 * from a fixed seed so every run hits the same places. */
static uint64_t *pick_slots(uint64_t room, size_t block, uint64_t n) {
  uint64_t slots = room / block, seed = 0x5EED;
  if (slots > n * RANDOM_SPREAD_MAX)
    slots = n * RANDOM_SPREAD_MAX;
  uint64_t *out = malloc(n * sizeof *out);
  if (out == NULL)
    return NULL;
  if (n * 2 <= slots) { /* sparse: draw, rejecting slots already taken */
    uint8_t *taken = calloc(slots / 8 + 1, 1);
    if (taken == NULL) {
      free(out);
      return NULL;
    }
    for (uint64_t i = 0; i < n;) {
      uint64_t s = mix64(seed++) % slots;
      if (!(taken[s / 8] & (1u << (s % 8)))) {
        taken[s / 8] |= (uint8_t)(1u << (s % 8));
        out[i++] = s;
      }
    }
    free(taken);
    return out;
  }
  uint64_t *all = malloc(slots * sizeof *all); /* dense: partial Fisher-Yates */
  if (all == NULL) {
    free(out);
    return NULL;
  }
  for (uint64_t i = 0; i < slots; i++)
    all[i] = i;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t j = i + mix64(seed++) % (slots - i), t = all[i];
    all[i] = all[j];
    all[j] = t;
    out[i] = all[i];
  }
  free(all);
  return out;
}

/* Allocates one worker's buffers and lays its entries over its slice. */
static int setup_worker(bench_worker *w, bench_shared *s, unsigned index) {
  const bench_opts *o = s->opts;
  w->shared = s;
  w->index = index;
  w->span = o->batch * o->block;
  w->remote = s->remote_base + (uint64_t)index * w->span;
  atomic_init(&w->bytes, 0);
  ferry_status st = ferry_memory_alloc(s->engine, w->span, (void **)&w->local);
  if (st != FERRY_OK) {
    w->local = NULL;
    ferry_cli_report(PROG, "cannot allocate a local buffer", st);
    return -1;
  }
  /* Fault every page in now: first-touch faults are set-up, not transfer. */
  memset(w->local, 0, w->span);
  w->entries = calloc(o->batch, sizeof *w->entries);
  if (o->verify && o->op == FERRY_OP_READ)
    w->expected = malloc(w->span);
  if (w->entries == NULL || (o->verify && o->op == FERRY_OP_READ && w->expected == NULL)) {
    fprintf(stderr, "%s: out of memory\n", PROG);
    return -1;
  }
  for (size_t e = 0; e < o->batch; e++) {
    w->entries[e].op = o->op;
    w->entries[e].local = w->local + e * o->block;
    w->entries[e].remote = s->slots ? s->remote_base + s->slots[index * o->batch + e] * o->block
                                    : w->remote + e * o->block;
    w->entries[e].length = o->block;
  }
  return 0;
}

static void free_workers(bench_worker *workers, unsigned long n, ferry_engine *engine) {
  for (unsigned long i = 0; i < n; i++) {
    if (workers[i].local != NULL)
      ferry_memory_free(engine, workers[i].local);
    free(workers[i].entries);
    free(workers[i].expected);
    free(workers[i].lat.ns);
  }
  free(workers);
}

/* ---- Measuring and reporting ---------------------------------------------- */

static double timeval_s(struct timeval tv) { return (double)tv.tv_sec + tv.tv_usec / 1e6; }

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted samples, in microseconds. */
static double percentile_us(const uint64_t *sorted, size_t n, double p) {
  if (n == 0)
    return 0.0;
  size_t rank = (size_t)(p * (double)n + 0.999999);
  if (rank == 0)
    rank = 1;
  if (rank > n)
    rank = n;
  return (double)sorted[rank - 1] / 1e3;
}

static void compute_percentiles(bench_worker *workers, unsigned long n, bench_result *r) {
  size_t total = 0;
  for (unsigned long i = 0; i < n; i++)
    total += workers[i].lat.count;
  uint64_t *all = malloc((total ? total : 1) * sizeof *all);
  if (all == NULL)
    return;
  size_t at = 0;
  for (unsigned long i = 0; i < n; i++) {
    memcpy(all + at, workers[i].lat.ns, workers[i].lat.count * sizeof *all);
    at += workers[i].lat.count;
  }
  qsort(all, total, sizeof *all, cmp_u64);
  r->p50_us = percentile_us(all, total, 0.50);
  r->p99_us = percentile_us(all, total, 0.99);
  free(all);
}

static void collect(bench_worker *workers, unsigned long n, bench_result *r) {
  for (unsigned long i = 0; i < n; i++) {
    r->bytes += atomic_load(&workers[i].bytes);
    r->errors += workers[i].errors;
    r->mismatches += workers[i].mismatches;
    r->verified_bytes += workers[i].verified_bytes;
  }
  compute_percentiles(workers, n, r);
}

static uint64_t total_bytes(bench_worker *workers, unsigned long n) {
  uint64_t sum = 0;
  for (unsigned long i = 0; i < n; i++)
    sum += atomic_load_explicit(&workers[i].bytes, memory_order_relaxed);
  return sum;
}

/* Waits until the absolute time `until`, or until SIGINT/SIGTERM, which
 * ends the run: returns 1 then. */
static int wait_or_stop(bench_shared *s, uint64_t until) {
  for (uint64_t now = now_ns(); now < until; now = now_ns()) {
    struct timespec left = {(time_t)((until - now) / NS_PER_S), (long)((until - now) % NS_PER_S)};
    if (sigtimedwait(&s->stop, NULL, &left) > 0) {
      atomic_store(&s->interrupted, 1);
      return 1;
    }
  }
  return 0;
}

/* Waits until the deadline; on long runs prints progress to stderr every
 * PROGRESS_EVERY_S seconds, sleeping in between rather than polling. */
static void watch_progress(bench_shared *s, bench_worker *workers, uint64_t start, int verbose) {
  const unsigned long n = s->opts->threads;
  uint64_t tick = start, last_bytes = 0;
  if (verbose)
    fprintf(stderr, "%s: running for %.0f s (Ctrl-C stops early and prints the result so far)\n",
            PROG, s->opts->duration);
  for (;;) {
    uint64_t next = verbose ? tick + PROGRESS_EVERY_S * NS_PER_S : s->deadline_ns;
    if (next > s->deadline_ns)
      next = s->deadline_ns;
    if (wait_or_stop(s, next) || next == s->deadline_ns)
      return;
    uint64_t bytes = total_bytes(workers, n);
    fprintf(stderr, "%s: %.0f s: %.0f MB, %.2f GB/s\n", PROG, (double)(next - start) / 1e9,
            (double)bytes / 1e6, (double)(bytes - last_bytes) / (PROGRESS_EVERY_S * 1e9));
    last_bytes = bytes;
    tick = next;
  }
}

static int verify_ok(const bench_opts *o, const bench_result *r) {
  return o->verify && r->mismatches == 0 && r->errors == 0 && r->verified_bytes > 0;
}

static void print_json(const bench_opts *o, const bench_result *r) {
  double gbps = r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0.0;
  double cpu = r->cpu_user_s + r->cpu_sys_s;
  double per_gb = r->bytes > 0 ? cpu / ((double)r->bytes / 1e9) : 0.0;
  printf("{\"op\":\"%s\",\"protocol\":\"%s\",\"block\":%zu,\"batch\":%lu,\"threads\":%lu,"
         "\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"gbytes_per_s\":%.4f,\"gbps\":%.4f,"
         "\"p50_us\":%.1f,\"p99_us\":%.1f,"
         "\"errors\":%u,\"verified\":%s,\"verified_bytes\":%" PRIu64 ",\"mismatches\":%" PRIu64
         ",\"cpu_user_s\":%.3f,\"cpu_sys_s\":%.3f,\"cpu_s_per_gb\":%.4f,"
         "\"random_offsets\":%s,\"depth\":%lu,\"interrupted\":%s}\n",
         o->op == FERRY_OP_WRITE ? "write" : "read", r->protocol, o->block, o->batch, o->threads,
         r->bytes, r->seconds, gbps, gbps, r->p50_us, r->p99_us, r->errors,
         verify_ok(o, r) ? "true" : "false", r->verified_bytes, r->mismatches, r->cpu_user_s,
         r->cpu_sys_s, per_gb, o->random_offsets ? "true" : "false", o->depth,
         r->interrupted ? "true" : "false");
}

static void print_human(const bench_opts *o, const bench_result *r) {
  double gbps = r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0.0;
  printf("%s block=%zu batch=%lu%s threads=%lu depth=%lu protocol=%s: %.2f GB/s, p50 %.0f us, "
         "p99 %.0f us, "
         "%.0f MB in %.2f s",
         o->op == FERRY_OP_WRITE ? "write" : "read", o->block, o->batch,
         o->random_offsets ? " random-offsets" : "", o->threads, o->depth, r->protocol, gbps,
         r->p50_us, r->p99_us, (double)r->bytes / 1e6, r->seconds);
  if (r->interrupted)
    printf(", interrupted");
  if (r->errors > 0)
    printf(", %u errors", r->errors);
  /* A write run can only check what the slices hold at the end: say so. */
  if (o->verify && verify_ok(o, r))
    printf(", verified %s%.0f %s OK", o->op == FERRY_OP_WRITE ? "final " : "",
           r->verified_bytes < 1000000 ? (double)r->verified_bytes / 1e3
                                       : (double)r->verified_bytes / 1e6,
           r->verified_bytes < 1000000 ? "KB" : "MB");
  else if (o->verify)
    printf(", verification FAILED (%" PRIu64 " blocks differ, %.0f MB verified)", r->mismatches,
           (double)r->verified_bytes / 1e6);
  printf("\n");
}

/* ---- Running -------------------------------------------------------------- */

/* Starts the workers, times the run between the "go" and "stopped"
 * rendezvous, and lets write verification happen outside the timed part. */
static void run_workers(bench_shared *s, bench_worker *workers, bench_result *r) {
  const bench_opts *o = s->opts;
  for (unsigned long i = 0; i < o->threads; i++) {
    if (pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) != 0) {
      /* The barrier counts every thread; there is no clean way back. */
      fprintf(stderr, "%s: cannot start thread %lu\n", PROG, i);
      exit(1);
    }
  }
  pthread_barrier_wait(&s->phase); /* prepared */
  struct rusage ru0, ru1;
  getrusage(RUSAGE_SELF, &ru0);
  uint64_t start = now_ns();
  s->deadline_ns = start + (uint64_t)(o->duration * 1e9);
  pthread_barrier_wait(&s->phase); /* go */
  watch_progress(s, workers, start, o->duration > PROGRESS_AFTER_S);
  pthread_barrier_wait(&s->phase); /* stopped */
  r->interrupted = interrupted(s);
  r->seconds = (double)(now_ns() - start) / 1e9;
  getrusage(RUSAGE_SELF, &ru1);
  r->cpu_user_s = timeval_s(ru1.ru_utime) - timeval_s(ru0.ru_utime);
  r->cpu_sys_s = timeval_s(ru1.ru_stime) - timeval_s(ru0.ru_stime);
  pthread_barrier_wait(&s->phase); /* measured */
  for (unsigned long i = 0; i < o->threads; i++)
    pthread_join(workers[i].thread, NULL);
}

/* Everything after the engine exists: target checks, buffers, the run. */
static int bench_with_engine(ferry_engine *engine, const bench_opts *o, const sigset_t *stop) {
  bench_shared s = {.engine = engine, .opts = o, .stop = *stop};
  bench_result r = {0};
  uint64_t room = 0;
  if (resolve_remote(engine, o, &s.remote_base, &room) != 0)
    return 1;
  unsigned transport = 0;
  ferry_status st = ferry_peer_transport(engine, o->target, &transport);
  if (st != FERRY_OK) {
    ferry_cli_report(PROG, "cannot connect to the target", st);
    return 1;
  }
  r.protocol = ferry_transport_name(transport);
  bench_worker *workers = calloc(o->threads, sizeof *workers);
  if (workers == NULL) {
    fprintf(stderr, "%s: out of memory\n", PROG);
    return 1;
  }
  int rc = 0;
  if (o->random_offsets &&
      (s.slots = pick_slots(room, o->block, (uint64_t)o->threads * o->batch)) == NULL) {
    fprintf(stderr, "%s: out of memory\n", PROG);
    rc = 1;
  }
  for (unsigned long i = 0; i < o->threads && rc == 0; i++)
    rc = setup_worker(&workers[i], &s, (unsigned)i);
  if (rc == 0) {
    pthread_barrier_init(&s.phase, NULL, (unsigned)o->threads + 1);
    run_workers(&s, workers, &r);
    pthread_barrier_destroy(&s.phase);
    collect(workers, o->threads, &r);
    if (o->json)
      print_json(o, &r);
    else
      print_human(o, &r);
    fflush(stdout);
    rc = (r.errors > 0 || (o->verify && !verify_ok(o, &r))) ? 1 : r.interrupted ? 130 : 0;
  } else {
    rc = 1;
  }
  free_workers(workers, o->threads, engine);
  free(s.slots);
  return rc;
}

int ferry_cmd_bench(int argc, char **argv) {
  bench_opts o;
  int rc = parse_bench_args(argc, argv, &o);
  if (rc == 1) {
    bench_usage(stdout);
    return 0;
  }
  if (rc != 0) {
    fprintf(stderr, "Run `ferry bench --help` for the options.\n");
    return 2;
  }
  if (o.first_contact)
    return ferry_bench_first_contact(&o.engine, o.target, o.first_contact, o.json);
  if (o.send)
    return ferry_bench_send(&o.engine, o.block, (unsigned)o.threads, o.duration, o.fixed_write,
                            o.json);
  /* Before the engine's threads exist, so only the timed wait takes them. */
  sigset_t stop;
  ferry_cli_block_stop_signals(&stop);
  ferry_engine *engine;
  if (ferry_cli_engine_create(PROG, &o.engine, &engine) != FERRY_OK)
    return 1;
  rc = bench_with_engine(engine, &o, &stop);
  ferry_engine_destroy(engine);
  return rc;
}
