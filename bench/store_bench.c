/* store_bench.c - the store's rows of bench/run (section store, issue 33):
 * what a client's batch put/get costs against ferry's own WRITE/READ of the
 * same bytes, small-object operations per second, the master's CPU per
 * operation, its memory per object and its allocator's cost per operation.
 * One JSON line per run.
 *
 *   store_bench batch MASTER tcp|shm SIZE COUNT REPS
 *   store_bench ops MASTER MASTER_PID THREADS SECONDS
 *   store_bench memory COUNT KEYLEN
 *   store_bench alloc COUNT
 *
 * batch and ops fork a holder: a second process (its own engine on
 * 127.0.0.1, all transports) whose store client contributes the segment
 * every value goes to (preferred_segment), so each put and get crosses
 * between two processes; this process's client contributes none. batch
 * then times, per repetition and interleaved, ferry_store_put_from_batch
 * and ferry_store_get_into_batch of COUNT values of SIZE bytes, and, the
 * baseline, ferry_transfer_sync_batch WRITE/READ of the same bytes between
 * the same addresses: an untimed put of the repetition's keys, removed,
 * shows where the timed one lands (the allocator reuses the place; "moved"
 * counts the values it did not), and each timed call follows one call on
 * the same memory. Where the bytes land matters on a VM: memory of a large
 * segment touched a while ago moved 10-40% slower than a buffer rewritten
 * every repetition (BENCHMARKS.md), which is the machine, not the store.
 * The old baseline, WRITE/READ of one fixed buffer the holder allocated as
 * its segment is (ferry_memory_alloc), is reported too ("fixed_").
 * This engine speaks only the protocol named, and fails when the peer used
 * another.
 * ops runs THREADS threads over one client: 4 KiB put_from of new keys for
 * SECONDS, then get_into of those keys for SECONDS, and reads the master's
 * CPU time (/proc/MASTER_PID/stat) around each phase.
 * memory measures the master's state in this process, as docs/store.md
 * does: glibc's mallinfo2 before and after COUNT committed objects of
 * KEYLEN-byte keys (4 KiB, one replica) in a store_map, made through the
 * master's restore path (store_map_restore_object), which builds the same
 * object a commit does.
 * alloc times one segment's allocator (store/extents.h) in this process:
 * COUNT allocations of mixed sizes (4 KiB mostly, 16-64 KiB, 256 KiB,
 * 1 MiB), half of them freed in random order (a fragmented pool: as many
 * holes as a scan-based allocator could not bear), COUNT / 10 allocations
 * in that state, then the rest freed (a client's death); ns per operation
 * of each phase. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BENCH_PROG "store_bench"
#include "bench_common.h"
#include "bench_engine.h"
#include "ferry.h"
#include "store/extents.h"
#include "store/map.h"

#define SMALL 4096

/* ---- the holder: the other client, in its own process ---------------------------------- */

typedef struct holder {
  pid_t pid;
  int stop_fd;             /* closed to end the holder */
  char name[128];          /* its segment's (and engine's) name */
  unsigned long long base; /* its registered baseline memory */
} holder;

/* Forks the holder: segment of seg bytes and a registered region of base
 * bytes (0: none), its name and that region's address told through a pipe.
 * It lives until stop_fd closes. */
static holder holder_start(const char *master, size_t seg, size_t base) {
  int up[2], down[2];
  if (pipe(up) || pipe(down))
    perror("store_bench: pipe"), exit(1);
  holder h = {0};
  h.pid = fork();
  if (h.pid < 0)
    perror("store_bench: fork"), exit(1);
  if (h.pid == 0) {
    close(up[0]);
    close(down[1]);
    ferry_engine *e = engine_with(0);
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    cfg.master = master;
    cfg.segment_size = seg;
    ferry_store *s;
    check(ferry_store_open(e, &cfg, &s), "holder: store open");
    void *mem = NULL; /* shareable memory, as the segment is (ferry_memory_alloc) */
    if (base) {
      check(ferry_memory_alloc(e, base, &mem), "holder: alloc");
      memset(mem, 0, base); /* its pages faulted in, as the warmed segment's */
    }
    dprintf(up[1], "%s %llu\n", ferry_store_segment(s), (unsigned long long)(uintptr_t)mem);
    close(up[1]);
    char c;
    while (read(down[0], &c, 1) > 0)
      ;
    ferry_store_close(s);
    if (mem)
      ferry_memory_free(e, mem);
    ferry_engine_destroy(e);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  char line[256];
  ssize_t n = 0, r;
  while (n < (ssize_t)sizeof line - 1 && (r = read(up[0], line + n, sizeof line - 1 - n)) > 0)
    n += r;
  line[n] = '\0';
  close(up[0]);
  if (sscanf(line, "%127s %llu", h.name, &h.base) != 2)
    fprintf(stderr, "store_bench: the holder did not start\n"), exit(1);
  h.stop_fd = down[1];
  return h;
}

static void holder_stop(holder *h) {
  close(h->stop_fd);
  waitpid(h->pid, NULL, 0);
}

static ferry_store *client(ferry_engine *e, const char *master) {
  ferry_store_config cfg;
  ferry_store_config_init(&cfg);
  cfg.master = master;
  ferry_store *s;
  check(ferry_store_open(e, &cfg, &s), "store open");
  return s;
}

static double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
      double t = v[j];
      v[j] = v[j - 1], v[j - 1] = t;
    }
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double gbps(size_t bytes, uint64_t t0) {
  return (double)bytes / (double)(ferry_now_ns() - t0);
}

/* ---- batch: put_from/get_into batches against WRITE/READ batches ------------------------- */

/* The figures of a batch run: the store's calls, ferry's WRITE/READ of the
 * same bytes at the addresses the put gave them (the baseline), and of the
 * same bytes at one fixed buffer (another baseline). */
enum { PUT, GET, WRITE, READ, FIXED_WRITE, FIXED_READ, FIGURES };

/* count entries of op, buf's values of size bytes: to the addresses at[]
 * or (at NULL) one after another from base. */
static void set_entries(ferry_entry *entries, ferry_op op, uint8_t *buf, size_t size, size_t count,
                        const uint64_t *at, uint64_t base) {
  for (size_t i = 0; i < count; i++)
    entries[i] = (ferry_entry){op, buf + i * size, at ? at[i] : base + i * size, size};
}

/* Where the master placed keys[0..count): each one's single replica, in memory. */
static void replica_addresses(ferry_store *s, char (*keys)[48], size_t count, uint64_t *at) {
  ferry_store_replica_list *lists = calloc(count, sizeof *lists);
  if (!lists)
    fprintf(stderr, "store_bench: no memory\n"), exit(1);
  for (size_t i = 0; i < count; i++)
    lists[i].key = keys[i];
  check(ferry_store_replicas_batch(s, lists, count), "replicas_batch");
  for (size_t i = 0; i < count; i++) {
    if (lists[i].status || lists[i].count != 1 ||
        lists[i].replicas[0].kind != FERRY_STORE_REPLICA_MEMORY)
      fprintf(stderr, "store_bench: %s is not one replica in memory\n", keys[i]), exit(1);
    at[i] = lists[i].replicas[0].address;
  }
  ferry_store_replica_lists_free(lists, count);
  free(lists);
}

/* How many of keys[0..count) the master placed elsewhere than at[]. */
static size_t placed_elsewhere(ferry_store *s, char (*keys)[48], size_t count, const uint64_t *at) {
  uint64_t *now = calloc(count, sizeof *now);
  if (!now)
    fprintf(stderr, "store_bench: no memory\n"), exit(1);
  replica_addresses(s, keys, count, now);
  size_t n = 0;
  for (size_t i = 0; i < count; i++)
    n += now[i] != at[i];
  free(now);
  return n;
}

static int batch(const char *master, const char *protocol, size_t size, size_t count, int reps) {
  unsigned t = !strcmp(protocol, "shm") ? FERRY_TRANSPORT_SHM : FERRY_TRANSPORT_TCP;
  size_t bytes = size * count;
  /* Leased values stay (a get's lease): room for every repetition's, with
   * the pool kept below the master's high watermark (0.95), so no
   * eviction runs in the timed puts nor takes a value the gets want. */
  holder h = holder_start(master, bytes * (size_t)(reps + 1) / 4 * 5 + (16u << 20), bytes);
  ferry_engine *e = engine_with(t);
  ferry_store *s = client(e, master);
  uint8_t *buf = NULL;
  if (posix_memalign((void **)&buf, 4096, bytes))
    fprintf(stderr, "store_bench: no memory\n"), exit(1);
  memset(buf, 0x5a, bytes);
  check(ferry_memory_register(e, buf, bytes), "register");
  ferry_store_item *items = calloc(count, sizeof *items);
  ferry_entry *entries = calloc(count, sizeof *entries);
  char(*keys)[48] = calloc(count, sizeof *keys); /* room for any int and size_t */
  ferry_store_replicate rep;
  ferry_store_replicate_init(&rep);
  rep.preferred_segment = h.name;
  uint64_t *at = calloc(count, sizeof *at);
  double *v[FIGURES];
  for (int k = 0; k < FIGURES; k++)
    v[k] = calloc((size_t)reps, sizeof(double));
  size_t moved = 0;
  for (int r = 0; r < reps; r++) {
    set_entries(entries, FERRY_OP_WRITE, buf, size, count, NULL, h.base);
    uint64_t t0 = ferry_now_ns();
    check(ferry_transfer_sync_batch(e, h.name, entries, count, NULL), "batch WRITE");
    v[FIXED_WRITE][r] = gbps(bytes, t0);
    set_entries(entries, FERRY_OP_READ, buf, size, count, NULL, h.base);
    t0 = ferry_now_ns();
    check(ferry_transfer_sync_batch(e, h.name, entries, count, NULL), "batch READ");
    v[FIXED_READ][r] = gbps(bytes, t0);
    /* Where this repetition's put goes: an untimed put there, removed, so
     * the timed one lands in the same place (the allocator reuses it). */
    for (size_t i = 0; i < count; i++) {
      snprintf(keys[i], sizeof keys[i], "r%d-%zu", r, i);
      items[i] = (ferry_store_item){keys[i], buf + i * size, size, 0};
    }
    check(ferry_store_put_from_batch(s, items, count, &rep), "untimed put_from_batch");
    replica_addresses(s, keys, count, at);
    for (size_t i = 0; i < count; i++)
      check(ferry_store_remove(s, keys[i]), "remove");
    /* Each timed call below follows one call on the same memory. */
    set_entries(entries, FERRY_OP_WRITE, buf, size, count, at, 0);
    t0 = ferry_now_ns();
    check(ferry_transfer_sync_batch(e, h.name, entries, count, NULL), "batch WRITE, same place");
    v[WRITE][r] = gbps(bytes, t0);
    t0 = ferry_now_ns();
    check(ferry_store_put_from_batch(s, items, count, &rep), "put_from_batch");
    v[PUT][r] = gbps(bytes, t0);
    moved += placed_elsewhere(s, keys, count, at);
    /* The first read after a write there runs slower: not timed, as the
     * timed READ and get both follow a read. */
    set_entries(entries, FERRY_OP_READ, buf, size, count, at, 0);
    check(ferry_transfer_sync_batch(e, h.name, entries, count, NULL), "untimed batch READ");
    t0 = ferry_now_ns();
    check(ferry_transfer_sync_batch(e, h.name, entries, count, NULL), "batch READ, same place");
    v[READ][r] = gbps(bytes, t0);
    t0 = ferry_now_ns();
    check(ferry_store_get_into_batch(s, items, count), "get_into_batch");
    v[GET][r] = gbps(bytes, t0);
  }
  unsigned used = 0;
  check(ferry_peer_transport(e, h.name, &used), "peer transport");
  if (used != t)
    fprintf(stderr, "store_bench: %s unavailable here\n", protocol), exit(1);
  printf("{\"mode\": \"batch\", \"protocol\": \"%s\", \"size\": %zu, \"count\": %zu, "
         "\"write_gbps\": %.4f, \"put_gbps\": %.4f, \"read_gbps\": %.4f, \"get_gbps\": %.4f, "
         "\"fixed_write_gbps\": %.4f, \"fixed_read_gbps\": %.4f, \"moved\": %zu}\n",
         protocol, size, count, median(v[WRITE], reps), median(v[PUT], reps), median(v[READ], reps),
         median(v[GET], reps), median(v[FIXED_WRITE], reps), median(v[FIXED_READ], reps), moved);
  ferry_store_close(s);
  check(ferry_memory_unregister(e, buf), "unregister");
  ferry_engine_destroy(e);
  holder_stop(&h);
  for (int k = 0; k < FIGURES; k++)
    free(v[k]);
  free(items), free(entries), free(keys), free(buf), free(at);
  return 0;
}

/* ---- ops: 4 KiB put/get per second, and the master's CPU ---------------------------------- */

typedef struct worker {
  pthread_t thread;
  ferry_store *s;
  const ferry_store_replicate *rep;
  unsigned id;
  uint8_t *buf;   /* SMALL registered bytes */
  int get;        /* 0: put new keys; 1: get the keys put */
  uint64_t until; /* ferry_now_ns deadline */
  size_t puts, gets;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  char key[48];
  size_t *n = w->get ? &w->gets : &w->puts;
  do {
    snprintf(key, sizeof key, "t%02u-%010zu", w->id, w->get ? *n % w->puts : *n);
    size_t len;
    ferry_status st = w->get ? ferry_store_get_into(w->s, key, w->buf, SMALL, &len)
                             : ferry_store_put_from(w->s, key, w->buf, SMALL, w->rep);
    check(st, w->get ? "get_into" : "put_from");
    (*n)++;
  } while (ferry_now_ns() < w->until);
  return NULL;
}

/* The master's user + system CPU in seconds (/proc/PID/stat). */
static double cpu_of(long pid) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f || !fgets(line, sizeof line, f))
    fprintf(stderr, "store_bench: %s: cannot read\n", path), exit(1);
  fclose(f);
  unsigned long long ut = 0, st = 0;
  char *p = strrchr(line, ')'); /* fields after the name: state is the 3rd */
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    fprintf(stderr, "store_bench: %s: no CPU times\n", path), exit(1);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* One phase over every worker: ops per second and the master's CPU seconds. */
static void phase(worker *w, unsigned threads, int get, double seconds, long pid, double *ops_s,
                  double *cpu) {
  double c0 = cpu_of(pid);
  uint64_t t0 = ferry_now_ns();
  size_t ops = 0;
  for (unsigned i = 0; i < threads; i++) {
    w[i].get = get;
    w[i].until = t0 + (uint64_t)(seconds * 1e9);
    pthread_create(&w[i].thread, NULL, work, &w[i]);
  }
  for (unsigned i = 0; i < threads; i++) {
    pthread_join(w[i].thread, NULL);
    ops += get ? w[i].gets : w[i].puts;
  }
  *ops_s = (double)ops / ((double)(ferry_now_ns() - t0) / 1e9);
  *cpu = (cpu_of(pid) - c0) / (double)ops * 1e6;
}

static int ops(const char *master, long pid, unsigned threads, double seconds) {
  holder h = holder_start(master, 1ull << 30, 0);
  ferry_engine *e = engine_with(FERRY_TRANSPORT_TCP);
  ferry_store *s = client(e, master);
  uint8_t *buf = NULL;
  if (posix_memalign((void **)&buf, 4096, (size_t)threads * SMALL))
    fprintf(stderr, "store_bench: no memory\n"), exit(1);
  memset(buf, 0x5a, (size_t)threads * SMALL);
  check(ferry_memory_register(e, buf, (size_t)threads * SMALL), "register");
  ferry_store_replicate rep;
  ferry_store_replicate_init(&rep);
  rep.preferred_segment = h.name;
  worker *w = calloc(threads, sizeof *w);
  for (unsigned i = 0; i < threads; i++)
    w[i] = (worker){.s = s, .rep = &rep, .id = i, .buf = buf + (size_t)i * SMALL};
  double put_s, put_cpu, get_s, get_cpu;
  phase(w, threads, 0, seconds, pid, &put_s, &put_cpu);
  phase(w, threads, 1, seconds, pid, &get_s, &get_cpu);
  printf("{\"mode\": \"ops\", \"threads\": %u, \"size\": %d, \"put_ops\": %.1f, \"get_ops\": %.1f, "
         "\"master_cpu_s_per_m_put\": %.3f, \"master_cpu_s_per_m_get\": %.3f}\n",
         threads, SMALL, put_s, get_s, put_cpu, get_cpu);
  ferry_store_close(s);
  check(ferry_memory_unregister(e, buf), "unregister");
  ferry_engine_destroy(e);
  holder_stop(&h);
  free(w), free(buf);
  return 0;
}

/* ---- memory: the master's heap per object ------------------------------------------------- */

static int memory(size_t count, size_t keylen) {
  store_eviction ev = {.high_watermark = 0.95,
                       .ratio = 0.05,
                       .soft_pin_ttl_ms = 30 * 60 * 1000,
                       .max_soft_pin_ttl_ms = 24 * 60 * 60 * 1000};
  store_map *m = store_map_create(5000, 10000, &ev);
  char record[128], key[1100];
  /* one segment that holds them all, as a master's restore mounts it */
  snprintf(record, sizeof record, "4096 %llu", (unsigned long long)count * SMALL + SMALL);
  if (!m || store_map_restore_segment(m, 1, "seg", record))
    fprintf(stderr, "store_bench: memory: no segment\n"), exit(1);
  struct mallinfo2 before = mallinfo2();
  for (size_t i = 0; i < count; i++) {
    snprintf(key, sizeof key, "%0*zu", (int)keylen, i);
    /* SIZE PIN ON_DISK REPLICAS, then OFFSET HEXNAME ("seg") */
    snprintf(record, sizeof record, "%d 0 0 1 %zu 736567", SMALL, i * SMALL);
    if (store_map_restore_object(m, key, keylen, record))
      fprintf(stderr, "store_bench: memory: object %zu refused\n", i), exit(1);
  }
  struct mallinfo2 after = mallinfo2();
  double per = (double)(after.uordblks - before.uordblks) / (double)count;
  printf("{\"mode\": \"memory\", \"objects\": %zu, \"key\": %zu, \"bytes_per_object\": %.1f, "
         "\"bytes_per_object_less_key\": %.1f}\n",
         count, keylen, per, per - (double)keylen);
  store_map_destroy(m);
  return 0;
}

/* ---- alloc: one segment's allocator under millions of objects ------------------------------ */

static uint64_t next_random(uint64_t *s) { /* xorshift64: the same run every time */
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static uint64_t mixed_size(uint64_t *s) {
  uint64_t k = next_random(s) % 20;
  if (k < 12)
    return SMALL;
  if (k < 17)
    return 16384 + next_random(s) % 49152;
  return k < 19 ? 256 << 10 : 1 << 20;
}

static double ns_per(uint64_t t0, size_t ops) {
  return ops ? (double)(ferry_now_ns() - t0) / (double)ops : 0;
}

static int alloc_bench(size_t count) {
  size_t extra = count / 10, total = count + extra;
  uint64_t s = 88172645463325252ull, bytes = 0;
  uint64_t *len = malloc(total * sizeof *len), *off = malloc(total * sizeof *off);
  if (!len || !off)
    fprintf(stderr, "store_bench: no memory\n"), exit(1);
  for (size_t i = 0; i < total; i++)
    bytes += store_extents_round(len[i] = mixed_size(&s));
  store_extents x; /* room for all with a quarter to spare: a full pool is not the point */
  if (store_extents_init(&x, bytes + bytes / 4))
    fprintf(stderr, "store_bench: alloc: no memory\n"), exit(1);
  uint64_t t = ferry_now_ns();
  for (size_t i = 0; i < count; i++)
    if (store_extents_alloc(&x, len[i], &off[i]))
      fprintf(stderr, "store_bench: alloc: %zu refused\n", i), exit(1);
  double alloc_ns = ns_per(t, count);
  for (size_t i = count - 1; i > 0; i--) { /* a random order of the first count */
    size_t j = next_random(&s) % (i + 1);
    uint64_t o = off[i], l = len[i];
    off[i] = off[j], len[i] = len[j], off[j] = o, len[j] = l;
  }
  size_t half = count / 2;
  t = ferry_now_ns();
  for (size_t i = 0; i < half; i++)
    store_extents_free(&x, off[i], len[i]);
  double free_ns = ns_per(t, half);
  size_t holes = x.count, refused = 0;
  t = ferry_now_ns();
  for (size_t i = count; i < total; i++)
    if (store_extents_alloc(&x, len[i], &off[i]))
      len[i] = 0, refused++;
  double fragmented_ns = ns_per(t, extra);
  t = ferry_now_ns();
  for (size_t i = half; i < total; i++)
    if (len[i])
      store_extents_free(&x, off[i], len[i]);
  double rest_ns = ns_per(t, total - half - refused);
  printf("{\"mode\": \"alloc\", \"objects\": %zu, \"alloc_ns\": %.1f, \"free_random_ns\": %.1f, "
         "\"extents\": %zu, \"fragmented_alloc_ns\": %.1f, \"refused\": %zu, "
         "\"free_rest_ns\": %.1f, \"extents_at_end\": %zu}\n",
         count, alloc_ns, free_ns, holes, fragmented_ns, refused, rest_ns, x.count);
  store_extents_destroy(&x);
  free(len), free(off);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 7 && !strcmp(argv[1], "batch") &&
      (!strcmp(argv[3], "tcp") || !strcmp(argv[3], "shm")) && atoi(argv[6]) > 0)
    return batch(argv[2], argv[3], parse_size(argv[4]), parse_size(argv[5]), atoi(argv[6]));
  if (argc == 6 && !strcmp(argv[1], "ops") && atoi(argv[4]) > 0)
    return ops(argv[2], atol(argv[3]), (unsigned)atoi(argv[4]), atof(argv[5]));
  if (argc == 4 && !strcmp(argv[1], "memory") && parse_size(argv[2]) && atoi(argv[3]) > 0)
    return memory(parse_size(argv[2]), (size_t)atoi(argv[3]));
  if (argc == 3 && !strcmp(argv[1], "alloc") && parse_size(argv[2]) >= 2)
    return alloc_bench(parse_size(argv[2]));
  fprintf(stderr, "usage: store_bench batch MASTER tcp|shm SIZE COUNT REPS\n"
                  "       store_bench ops MASTER MASTER_PID THREADS SECONDS\n"
                  "       store_bench memory COUNT KEYLEN\n"
                  "       store_bench alloc COUNT\n");
  return 2;
}
