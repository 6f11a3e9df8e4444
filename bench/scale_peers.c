/* scale_peers.c - how a target's and an initiator's cost grows with peers
 * (issue 13). Every peer is its own process with its own engine, forked
 * before any engine exists; TCP only (shm would bypass the server).
 *
 *   scale_peers many N SIZE SECONDS   N initiators write SIZE blocks into
 *                                     one target (this process) at once
 *   scale_peers fan N SIZE SECONDS    this process writes SIZE blocks
 *                                     round-robin to N targets
 *
 * Prints one JSON line: aggregate GB/s, per-call p50/p99 (many), CPU
 * seconds per GB (every process), and this process's threads, RSS and open
 * descriptors before the peers and at their peak (fan: also the sockets
 * left once the idle limit of the targets and of this engine has passed,
 * and after one more call, which sweeps this side's). Blocks all go to one
 * SIZE buffer per process, so 64 processes fit in a small machine. */
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "ferry.h"

#define MAX_PEERS 256
#define IDLE_MS 1500 /* the targets' idle limit in fan mode */

typedef struct peer {
  pid_t pid;
  int to, from; /* pipes to and from the child */
} peer;

typedef struct hello {
  char name[64];
  uint64_t addr;
} hello;

typedef struct result {
  uint64_t bytes, calls, elapsed_ns, cpu_ns, switches;
} result;

typedef struct usage {
  long threads, rss_kb, fds, sockets;
} usage;

static void die(const char *what) {
  fprintf(stderr, "scale_peers: %s: %s\n", what, ferry_last_error());
  exit(1);
}

static void xwrite(int fd, const void *p, size_t n) {
  if (write(fd, p, n) != (ssize_t)n) {
    perror("scale_peers: write");
    exit(1);
  }
}

static int xread(int fd, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)p + got, n - got);
    if (r <= 0)
      return -1;
    got += (size_t)r;
  }
  return 0;
}

static uint64_t cpu_ns(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000ull +
         (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ull;
}

/* Context switches of every thread of this process, both kinds. */
static uint64_t switches(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (uint64_t)(ru.ru_nvcsw + ru.ru_nivcsw);
}

static usage usage_now(void) {
  usage u = {0, 0, 0, 0};
  char line[256];
  FILE *f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f)) {
    sscanf(line, "Threads: %ld", &u.threads);
    sscanf(line, "VmRSS: %ld", &u.rss_kb);
  }
  if (f)
    fclose(f);
  DIR *d = opendir("/proc/self/fd");
  for (struct dirent *de; d && (de = readdir(d)) != NULL;) {
    char link[300], to[32] = "";
    if (de->d_name[0] == '.')
      continue;
    snprintf(link, sizeof link, "/proc/self/fd/%s", de->d_name);
    u.fds++;
    u.sockets += readlink(link, to, sizeof to - 1) > 0 && strncmp(to, "socket:", 7) == 0;
  }
  if (d)
    closedir(d);
  return u;
}

static void usage_max(usage *peak, usage u) {
  peak->threads = u.threads > peak->threads ? u.threads : peak->threads;
  peak->rss_kb = u.rss_kb > peak->rss_kb ? u.rss_kb : peak->rss_kb;
  peak->fds = u.fds > peak->fds ? u.fds : peak->fds;
  peak->sockets = u.sockets > peak->sockets ? u.sockets : peak->sockets;
}

static ferry_engine *engine(void) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = FERRY_TRANSPORT_TCP;
  ferry_engine *e;
  if (ferry_engine_create(&cfg, &e))
    die("engine create");
  return e;
}

/* SCALE_PEERS_SHARED=1: every initiator writes from one buffer mapped
 * before the fork, so all of them read the same memory (the cost of N
 * source buffers' cache misses, told apart from the rest). */
static void *shared_source;

static void *buffer(ferry_engine *e, size_t size) {
  void *buf = malloc(size);
  if (!buf)
    exit(1);
  memset(buf, 0x5a, size);
  if (ferry_memory_register(e, buf, size))
    die("register");
  return buf;
}

static void *source(ferry_engine *e, size_t size) {
  if (!shared_source)
    return buffer(e, size);
  if (ferry_memory_register(e, shared_source, size))
    die("register");
  return shared_source;
}

static peer fork_peer(int (*child)(int in, int out, size_t size, double secs), size_t size,
                      double secs) {
  int down[2], up[2];
  if (pipe(down) || pipe(up))
    exit(1);
  peer p = {fork(), down[1], up[0]};
  if (p.pid == 0) {
    close(down[1]);
    close(up[0]);
    _exit(child(down[0], up[1], size, secs));
  }
  close(down[0]);
  close(up[1]);
  return p;
}

static void end_peers(peer *peers, int n) {
  for (int i = 0; i < n; i++)
    close(peers[i].to);
  for (int i = 0; i < n; i++) {
    waitpid(peers[i].pid, NULL, 0);
    close(peers[i].from);
  }
}

static int compare_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* ---- many initiators into one target ------------------------------------ */

/* An initiator: a warm-up call, "ready", then WRITEs for secs after the
 * parent's start byte; sends its result and every call's latency. */
static int initiator(int in, int out, size_t size, double secs) {
  hello h;
  if (xread(in, &h, sizeof h))
    return 1;
  ferry_engine *e = engine();
  uint8_t *buf = source(e, size);
  if (ferry_transfer_sync(e, h.name, FERRY_OP_WRITE, buf, h.addr, size))
    die("warm-up WRITE");
  char c = 'r';
  xwrite(out, &c, 1);
  if (xread(in, &c, 1))
    return 1;
  size_t cap = 1024, n = 0;
  uint64_t *lat = malloc(cap * sizeof *lat), cpu0 = cpu_ns(), sw0 = switches();
  uint64_t t0 = ferry_now_ns(), now = t0;
  uint64_t end = t0 + (uint64_t)(secs * 1e9);
  while (now < end) {
    if (ferry_transfer_sync(e, h.name, FERRY_OP_WRITE, buf, h.addr, size))
      die("WRITE");
    uint64_t t = ferry_now_ns();
    if (n == cap)
      lat = realloc(lat, (cap *= 2) * sizeof *lat);
    lat[n++] = t - now;
    now = t;
  }
  result r = {n * size, n, now - t0, cpu_ns() - cpu0, switches() - sw0};
  xwrite(out, &r, sizeof r);
  xwrite(out, lat, n * sizeof *lat);
  if (xread(in, &c, 1)) { /* EOF: the parent is done */
  }
  ferry_engine_destroy(e);
  return 0;
}

static void wait_ready(peer *peers, int n) {
  for (int i = 0; i < n; i++) {
    char c;
    if (xread(peers[i].from, &c, 1))
      die("a peer did not start");
  }
}

/* Samples usage every 50 ms until every peer's result is readable. */
static void sample_until_done(peer *peers, int n, usage *peak) {
  for (int i = 0; i < n; i++) {
    struct pollfd p = {peers[i].from, POLLIN, 0};
    while (poll(&p, 1, 50) == 0)
      usage_max(peak, usage_now());
  }
}

static void many(int n, size_t size, double secs) {
  peer peers[MAX_PEERS];
  const char *shared = getenv("SCALE_PEERS_SHARED");
  if (shared && strcmp(shared, "1") == 0) {
    shared_source = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared_source == MAP_FAILED)
      exit(1);
    memset(shared_source, 0x5a, size);
  }
  for (int i = 0; i < n; i++)
    peers[i] = fork_peer(initiator, size, secs);
  ferry_engine *t = engine();
  void *buf = buffer(t, size);
  usage before = usage_now(), peak = before;
  hello h = {.addr = (uint64_t)(uintptr_t)buf};
  snprintf(h.name, sizeof h.name, "%s", ferry_engine_name(t));
  for (int i = 0; i < n; i++)
    xwrite(peers[i].to, &h, sizeof h);
  wait_ready(peers, n);
  usage_max(&peak, usage_now());
  uint64_t cpu0 = cpu_ns(), sw0 = switches();
  for (int i = 0; i < n; i++)
    xwrite(peers[i].to, "g", 1);
  sample_until_done(peers, n, &peak);
  uint64_t target_cpu = cpu_ns() - cpu0, bytes = 0, calls = 0, elapsed = 0, cpu = target_cpu;
  uint64_t target_sw = switches() - sw0, sw = target_sw;
  uint64_t *lat = NULL;
  for (int i = 0; i < n; i++) {
    result r;
    if (xread(peers[i].from, &r, sizeof r))
      die("a peer's result");
    lat = realloc(lat, (calls + r.calls) * sizeof *lat);
    if (xread(peers[i].from, lat + calls, r.calls * sizeof *lat))
      die("a peer's latencies");
    bytes += r.bytes;
    calls += r.calls;
    cpu += r.cpu_ns;
    sw += r.switches;
    elapsed = r.elapsed_ns > elapsed ? r.elapsed_ns : elapsed;
  }
  qsort(lat, calls, sizeof *lat, compare_u64);
  printf("{\"mode\": \"many\", \"peers\": %d, \"size\": %zu, \"gbps\": %.3f, \"calls\": %llu, "
         "\"p50_us\": %.1f, \"p99_us\": %.1f, \"cpu_s_per_gb\": %.3f, "
         "\"target_cpu_s_per_gb\": %.3f, \"switches_per_mb\": %.2f, "
         "\"target_switches_per_mb\": %.2f, \"threads_before\": %ld, \"threads_peak\": %ld, "
         "\"rss_before_kb\": %ld, \"rss_peak_kb\": %ld, \"fds_before\": %ld, "
         "\"fds_peak\": %ld}\n",
         n, size, bytes / (elapsed / 1e9) / 1e9, (unsigned long long)calls,
         calls ? lat[calls / 2] / 1e3 : 0, calls ? lat[calls * 99 / 100] / 1e3 : 0,
         cpu / 1e9 / (bytes / 1e9), target_cpu / 1e9 / (bytes / 1e9), sw / (bytes / 1048576.0),
         target_sw / (bytes / 1048576.0), before.threads, peak.threads, before.rss_kb, peak.rss_kb,
         before.fds, peak.fds);
  free(lat);
  end_peers(peers, n);
  ferry_engine_destroy(t);
  free(buf);
}

/* ---- one initiator over many targets -------------------------------------- */

/* A target: its name and buffer to the parent, then serves until EOF. */
static int target(int in, int out, size_t size, double secs) {
  (void)secs;
  ferry_engine *e = engine();
  hello h = {.addr = (uint64_t)(uintptr_t)buffer(e, size)};
  snprintf(h.name, sizeof h.name, "%s", ferry_engine_name(e));
  xwrite(out, &h, sizeof h);
  char c;
  if (xread(in, &c, 1)) { /* EOF: the parent is done */
  }
  ferry_engine_destroy(e);
  return 0;
}

static void fan(int n, size_t size, double secs) {
  char idle[16];
  snprintf(idle, sizeof idle, "%d", IDLE_MS);
  setenv("FERRY_IDLE_TIMEOUT_MS", idle, 1); /* the targets' */
  peer peers[MAX_PEERS];
  hello hs[MAX_PEERS];
  for (int i = 0; i < n; i++)
    peers[i] = fork_peer(target, size, secs);
  for (int i = 0; i < n; i++)
    if (xread(peers[i].from, &hs[i], sizeof hs[i]))
      die("a target did not start");
  ferry_engine *e = engine(); /* the same idle limit as its targets */
  unsetenv("FERRY_IDLE_TIMEOUT_MS");
  uint8_t *buf = buffer(e, size);
  usage before = usage_now(), peak = before;
  uint64_t cpu0 = cpu_ns(), t0 = ferry_now_ns(), end = t0 + (uint64_t)(secs * 1e9), calls = 0;
  for (uint64_t now = t0; now < end || calls < (uint64_t)n; now = ferry_now_ns()) {
    const hello *h = &hs[calls++ % (uint64_t)n];
    if (ferry_transfer_sync(e, h->name, FERRY_OP_WRITE, buf, h->addr, size))
      die("WRITE");
    if (calls % (uint64_t)n == 0)
      usage_max(&peak, usage_now());
  }
  double elapsed = (ferry_now_ns() - t0) / 1e9, gb = calls * size / 1e9;
  uint64_t cpu = cpu_ns() - cpu0;
  usage_max(&peak, usage_now());
  /* Past the targets' idle limit their connections close; count what this
   * process still holds then (sleeping is the point here). */
  usleep((IDLE_MS + 1000) * 1000);
  usage idle_after = usage_now();
  /* The next call (to one target) sweeps this side's idle connections. */
  if (ferry_transfer_sync(e, hs[0].name, FERRY_OP_WRITE, buf, hs[0].addr, size))
    die("WRITE");
  usage next_call = usage_now();
  printf("{\"mode\": \"fan\", \"peers\": %d, \"size\": %zu, \"gbps\": %.3f, \"calls\": %llu, "
         "\"initiator_cpu_s_per_gb\": %.3f, \"threads_before\": %ld, \"threads_peak\": %ld, "
         "\"rss_before_kb\": %ld, \"rss_peak_kb\": %ld, \"fds_before\": %ld, \"fds_peak\": %ld, "
         "\"sockets_before\": %ld, \"sockets_peak\": %ld, \"sockets_after_idle\": %ld, "
         "\"sockets_after_next_call\": %ld}\n",
         n, size, gb / elapsed, (unsigned long long)calls, cpu / 1e9 / gb, before.threads,
         peak.threads, before.rss_kb, peak.rss_kb, before.fds, peak.fds, before.sockets,
         peak.sockets, idle_after.sockets, next_call.sockets);
  end_peers(peers, n);
  ferry_engine_destroy(e);
  free(buf);
}

int main(int argc, char **argv) {
  int n = argc == 5 ? atoi(argv[2]) : 0;
  size_t size = argc == 5 ? parse_size(argv[3]) : 0;
  double secs = argc == 5 ? atof(argv[4]) : 0;
  if (n < 1 || n > MAX_PEERS || !size || secs <= 0 ||
      (strcmp(argv[1], "many") != 0 && strcmp(argv[1], "fan") != 0)) {
    fprintf(stderr, "usage: scale_peers many|fan N(1-%d) SIZE SECONDS\n", MAX_PEERS);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argv[1][0] == 'm')
    many(n, size, secs);
  else
    fan(n, size, secs);
  return 0;
}
