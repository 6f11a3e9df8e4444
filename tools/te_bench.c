/* te_bench.c - `ferry transfer-engine-bench`, also run as
 * `transfer_engine_bench`: Mooncake's transfer engine benchmark on ferry,
 * with Mooncake's flags (gflags spelling) and its result line, so the
 * commands operators run to validate a setup keep working.
 *
 * --mode=target registers --buffer_size bytes under --local_server_name and
 * serves them until SIGINT/SIGTERM. --mode=initiator opens --segment_id and
 * runs --threads threads, each submitting batches of --batch_size entries of
 * --block_size bytes (READ or WRITE, --operation) for --duration seconds,
 * entry i of thread t at block i * threads + t of the target's buffer (as
 * Mooncake lays them out), then prints
 *   Test completed: duration D, batch count N, throughput X UNIT/s
 * Flags ferry cannot honour are refused by name where they would change
 * what is measured, and accepted with a note where they would not. */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cli.h"
#include "commands.h"
#include "ferry.h"
#include "vram.h"

#define PROG "transfer_engine_bench"
#define P2PHANDSHAKE "P2PHANDSHAKE"
#define INIT_BYTE 0x5A /* --init_mem: what the buffer is filled with */

typedef struct te_flags {
  const char *local_server_name;
  int name_given; /* --local_server_name was on the command line */
  const char *metadata_server;
  const char *segment_id;
  const char *protocol;
  const char *device_name; /* NULL: the provider's first device */
  int initiator;
  ferry_op op;
  size_t buffer_size;
  size_t block_size;
  unsigned long batch_size;
  unsigned long threads;
  unsigned long duration;
  unsigned long report_precision;
  const char *report_unit;
  double unit_bytes;
  int use_vram; /* -1: not given (on where a CUDA device is) */
  int init_mem;
  unsigned long gpu_id;
} te_flags;

static const struct {
  const char *name;
  double bytes;
} units[] = {{"GB", 1e9}, {"GiB", 1073741824.0}, {"Gb", 1e9 / 8},
             {"MB", 1e6}, {"MiB", 1048576.0},    {"Mb", 1e6 / 8},
             {"KB", 1e3}, {"KiB", 1024.0},       {"Kb", 1e3 / 8}};

/* Mooncake's protocols ferry has no transport for: it runs its own. */
static const char *const foreign_protocols[] = {
    "barex", "nvlink", "nvlink_intra", "mnnvl", "hip", "musa", "sunrise_link", "cxl", "nvmeof",
};

static void usage(FILE *out) {
  fprintf(out,
          "usage: transfer_engine_bench --mode=target|initiator [--flag=value ...]\n"
          "       (also `ferry transfer-engine-bench`; Mooncake's flags and result line)\n"
          "  --mode=M                 target: serve --buffer_size bytes until SIGINT/SIGTERM;\n"
          "                           initiator (default): transfer with --segment_id\n"
          "  --local_server_name=H[:P]  this engine's address (and, with a metadata server,\n"
          "                           its segment name); default 127.0.0.1, port free\n"
          "  --metadata_server=S      P2PHANDSHAKE (default here), http://HOST:PORT/PATH,\n"
          "                           etcd://HOST:PORT, redis://HOST:PORT or HOST:PORT (etcd)\n"
          "  --segment_id=NAME        initiator: the target's segment (P2PHANDSHAKE: the\n"
          "                           HOST:PORT its ready line prints)\n"
          "  --operation=read|write   default read\n"
          "  --protocol=P             rdma (default; ferry's fabric transport, tcp/shm where\n"
          "                           there is no RDMA device), efa, tcp, or ferry's shm,\n"
          "                           fabric, all; nvlink, hip, barex...: ferry's own, with a\n"
          "                           warning\n"
          "  --device_name=NIC[,NIC]  rdma/efa: the NICs (default: the provider's first)\n"
          "  --buffer_size=N          bytes registered on each side (default 1G)\n"
          "  --batch_size=N           entries per batch (default 128)\n"
          "  --block_size=N           bytes per entry (default 65536)\n"
          "  --threads=N              submitting threads (default 12)\n"
          "  --duration=S             seconds (default 10)\n"
          "  --report_unit=U          GB|GiB|Gb|MB|MiB|Mb|KB|KiB|Kb (default GB)\n"
          "  --report_precision=N     decimals (default 2)\n"
          "  --use_vram[=false]       buffers in CUDA memory of --gpu_id (default: true where\n"
          "                           the CUDA driver finds a device; moved over tcp, staged)\n"
          "  --gpu_id=N               the CUDA device (default 0; -1, all GPUs, is refused)\n"
          "  --init_mem[=false]       fill the buffers before use (default true)\n"
          "  --auto_discovery, --nic_priority_matrix=F, --backend=classic|tent: accepted,\n"
          "                           with a note: ferry discovers its transports itself\n"
          "  --logtostderr, --v=N, ... (glog's): accepted, with a note: FERRY_LOG sets the level\n"
          "Sizes take K/M/G suffixes too. The target prints \"ready segment_id=NAME\"; the\n"
          "initiator \"Test completed: duration D, batch count N, throughput X UNIT/s\".\n");
}

static int bad(const char *flag, const char *value, const char *expected) {
  fprintf(stderr, "%s: invalid value \"%s\" for --%s: expected %s\n", PROG, value ? value : "",
          flag, expected);
  return -1;
}

static int parse_number(const char *flag, const char *value, unsigned long min, unsigned long max,
                        unsigned long *out) {
  if (value && ferry_cli_parse_count(value, min, max, out) == 0)
    return 0;
  char expected[80];
  snprintf(expected, sizeof expected, "a whole number, %lu to %lu", min, max);
  return bad(flag, value, expected);
}

static int parse_bytes(const char *flag, const char *value, size_t *out) {
  return value && ferry_cli_parse_size(value, out) == 0 ? 0
                                                        : bad(flag, value, FERRY_CLI_SIZE_SYNTAX);
}

static int parse_unit(te_flags *f, const char *value) {
  for (size_t i = 0; value && i < sizeof units / sizeof *units; i++)
    if (strcmp(units[i].name, value) == 0) {
      f->report_unit = units[i].name;
      f->unit_bytes = units[i].bytes;
      return 0;
    }
  return bad("report_unit", value, "GB, GiB, Gb, MB, MiB, Mb, KB, KiB or Kb");
}

/* glog's flags (Mooncake's tools log through glog): ferry logs through
 * FERRY_LOG instead. */
static const char *const glog_flags[] = {
    "logtostderr", "alsologtostderr", "colorlogtostderr", "stderrthreshold", "minloglevel",
    "v",           "log_dir",
};

/* The flags that take their value only after '=' (ferry_cli_gflag). */
static const char *const booleans[] = {"use_vram",    "init_mem",        "auto_discovery",
                                       "logtostderr", "alsologtostderr", "colorlogtostderr",
                                       NULL};

/* The flags that change nothing here: a note each, so nobody believes
 * they did. 1: not one of them. */
static int accept_with_note(const char *name, const char *value) {
  int on = 1;
  if (!strcmp(name, "auto_discovery") && ferry_cli_gflag_bool(PROG, name, value, &on) != 0)
    return -1;
  if ((!strcmp(name, "auto_discovery") && on) || !strcmp(name, "nic_priority_matrix")) {
    fprintf(stderr,
            "%s: note: --%s%s%s changes nothing: ferry finds its transports and NICs itself "
            "(--device_name picks the NICs for rdma/efa)\n",
            PROG, name, value ? "=" : "", value ? value : "");
    return 0;
  }
  if (!strcmp(name, "auto_discovery"))
    return 0; /* =false: Mooncake's default, and ferry's way anyway */
  for (size_t i = 0; i < sizeof glog_flags / sizeof *glog_flags; i++)
    if (!strcmp(name, glog_flags[i])) {
      fprintf(stderr, "%s: note: --%s is glog's; ferry logs to stderr, FERRY_LOG sets the level\n",
              PROG, name);
      return 0;
    }
  if (!strcmp(name, "backend")) {
    if (value && !strcmp(value, "classic"))
      return 0;
    if (value && !strcmp(value, "tent")) {
      fprintf(stderr, "%s: note: --backend=tent: ferry has one engine; this measures it\n", PROG);
      return 0;
    }
    return bad(name, value, "classic or tent");
  }
  return 1;
}

static int parse_flag(te_flags *f, const char *name, const char *value) {
  int rc = accept_with_note(name, value);
  if (rc <= 0)
    return rc;
  if (!strcmp(name, "mode")) {
    if (value && (!strcmp(value, "initiator") || !strcmp(value, "target")))
      return f->initiator = !strcmp(value, "initiator"), 0;
    return bad(name, value, "initiator or target");
  }
  if (!strcmp(name, "operation")) {
    if (value && (!strcmp(value, "read") || !strcmp(value, "write")))
      return f->op = !strcmp(value, "read") ? FERRY_OP_READ : FERRY_OP_WRITE, 0;
    return bad(name, value, "read or write");
  }
  const char **text = !strcmp(name, "local_server_name") ? &f->local_server_name
                      : !strcmp(name, "metadata_server") ? &f->metadata_server
                      : !strcmp(name, "segment_id")      ? &f->segment_id
                      : !strcmp(name, "protocol")        ? &f->protocol
                      : !strcmp(name, "device_name")     ? &f->device_name
                                                         : NULL;
  if (text != NULL && (!value || !*value))
    return bad(name, value, "a non-empty string");
  if (text != NULL) {
    f->name_given |= text == &f->local_server_name;
    return *text = value, 0;
  }
  if (!strcmp(name, "buffer_size"))
    return parse_bytes(name, value, &f->buffer_size);
  if (!strcmp(name, "block_size"))
    return parse_bytes(name, value, &f->block_size);
  if (!strcmp(name, "batch_size"))
    return parse_number(name, value, 1, 1ul << 20, &f->batch_size);
  if (!strcmp(name, "threads"))
    return parse_number(name, value, 1, 1024, &f->threads);
  if (!strcmp(name, "duration"))
    return parse_number(name, value, 1, 1ul << 31, &f->duration);
  if (!strcmp(name, "report_precision"))
    return parse_number(name, value, 0, 17, &f->report_precision);
  if (!strcmp(name, "report_unit"))
    return parse_unit(f, value);
  if (!strcmp(name, "use_vram"))
    return ferry_cli_gflag_bool(PROG, name, value, &f->use_vram);
  if (!strcmp(name, "init_mem"))
    return ferry_cli_gflag_bool(PROG, name, value, &f->init_mem);
  if (!strcmp(name, "gpu_id")) {
    if (value && !strcmp(value, "-1")) {
      fprintf(stderr,
              "%s: --gpu_id=-1 (a buffer on every GPU) is not supported: ferry's bench "
              "uses one device; name it (--gpu_id=0)\n",
              PROG);
      return -1;
    }
    return parse_number(name, value, 0, 1023, &f->gpu_id);
  }
  fprintf(stderr, "%s: unknown flag --%s (see --help)\n", PROG, name);
  return -1;
}

/* Returns 0 to run, 1 for --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, te_flags *f) {
  *f = (te_flags){.local_server_name = "127.0.0.1",
                  .metadata_server = P2PHANDSHAKE,
                  .protocol = "rdma",
                  .initiator = 1,
                  .op = FERRY_OP_READ,
                  .buffer_size = (size_t)1 << 30,
                  .block_size = 65536,
                  .batch_size = 128,
                  .threads = 12,
                  .duration = 10,
                  .report_precision = 2,
                  .report_unit = "GB",
                  .unit_bytes = 1e9,
                  .use_vram = -1,
                  .init_mem = 1};
  for (int i = 1; i < argc; i++) {
    char name[64];
    const char *value;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") || !strcmp(argv[i], "--helpshort"))
      return 1;
    if (ferry_cli_gflag(argc, argv, &i, booleans, name, sizeof name, &value) != 0) {
      fprintf(stderr, "%s: unexpected argument \"%s\" (see --help)\n", PROG, argv[i]);
      return 2;
    }
    if (parse_flag(f, name, value) != 0)
      return 2;
  }
  if (f->initiator && f->segment_id == NULL) {
    fprintf(stderr, "%s: --mode=initiator needs --segment_id (the target's segment name)\n", PROG);
    return 2;
  }
  if (f->initiator && f->name_given && strcmp(f->metadata_server, P2PHANDSHAKE) != 0 &&
      !strcmp(f->local_server_name, f->segment_id)) {
    fprintf(stderr,
            "%s: --local_server_name=%s is the target's --segment_id: the initiator "
            "would publish over the target's segment; give it a name of its own\n",
            PROG, f->segment_id);
    return 2;
  }
  uint64_t need;
  if (f->initiator && (__builtin_mul_overflow((uint64_t)f->block_size, f->batch_size, &need) ||
                       __builtin_mul_overflow(need, f->threads, &need) || need > f->buffer_size)) {
    fprintf(stderr,
            "%s: --block_size * --batch_size * --threads = %zu * %lu * %lu bytes is more than "
            "--buffer_size=%zu: raise --buffer_size or lower one of them\n",
            PROG, f->block_size, f->batch_size, f->threads, f->buffer_size);
    return 2;
  }
  return 0;
}

/* ---- The engine ------------------------------------------------------------ */

/* "host", "host:port", "[v6]:port" or a bare IPv6 address into host (size
 * bytes) and *port (0 when absent). */
static int split_server_name(const char *text, char *host, size_t size, unsigned long *port) {
  const char *host_at = text, *end = strchr(text, ':'), *rest;
  if (text[0] == '[') {
    host_at = text + 1;
    if ((end = strchr(text, ']')) == NULL)
      return -1;
    rest = end + 1;
  } else if (end == NULL || strchr(end + 1, ':') != NULL) {
    end = rest = text + strlen(text); /* no port, or a bare IPv6 address */
  } else {
    rest = end;
  }
  size_t len = (size_t)(end - host_at);
  if (len == 0 || len >= size || (*rest && *rest != ':'))
    return -1;
  memcpy(host, host_at, len);
  host[len] = '\0';
  *port = 0;
  return *rest ? ferry_cli_parse_count(rest + 1, 0, 65535, port) : 0;
}

/* The transports FERRY_TRANSPORTS allows (all when unset). */
static unsigned allowed_transports(void) {
  const char *env = getenv("FERRY_TRANSPORTS");
  return env ? ferry_transport_parse(env) : FERRY_TRANSPORT_ALL;
}

/* --protocol into the engine's transports; *fabric: the fabric transport
 * was asked for (rdma, efa). */
static int apply_protocol(const te_flags *f, ferry_cli_engine_opts *e, int *fabric) {
  const char *p = f->protocol;
  *fabric = 0;
  if (!strcasecmp(p, "rdma") || !strcasecmp(p, "efa")) {
    if (!(allowed_transports() & FERRY_TRANSPORT_FABRIC)) {
      fprintf(stderr,
              "%s: WARNING: protocol '%s': FERRY_TRANSPORTS leaves ferry's fabric "
              "transport out; using ferry's own transports (tcp, shm)\n",
              PROG, p);
      return 0;
    }
    *fabric = 1;
    if (!getenv("FERRY_FABRIC_PROVIDER"))
      e->fabric_provider = strcasecmp(p, "efa") ? "verbs;ofi_rxm" : "efa";
    e->fabric_device = f->device_name;
    return 0;
  }
  if (!strcasecmp(p, "ascend") || !strcasecmp(p, "ascend_direct") || !strcasecmp(p, "hccl") ||
      !strcasecmp(p, "ubshmem") || !strcasecmp(p, "ub")) {
    fprintf(stderr, "%s: --protocol=%s moves NPU memory, which ferry does not (FERRY_ENOTIMPL)\n",
            PROG, p);
    return -1;
  }
  for (size_t i = 0; i < sizeof foreign_protocols / sizeof *foreign_protocols; i++)
    if (!strcasecmp(p, foreign_protocols[i])) {
      fprintf(stderr,
              "%s: WARNING: protocol '%s', which ferry does not provide (it has no such "
              "transport); using ferry's own transports instead (tcp between hosts, shm on one "
              "host). See docs/errors.md.\n",
              PROG, p);
      return 0;
    }
  if (ferry_cli_parse_protocol(p, &e->transports) != 0)
    return bad("protocol", p, "rdma, efa or tcp (Mooncake's), shm, fabric or all (ferry's)");
  return 0;
}

/* The Python drop-in's warning (mooncake/engine.py, _warn_no_device), word
 * for word: rdma/efa found no device, the engine runs on transports. */
static void warn_no_device(const char *protocol, const char *reason, unsigned transports) {
  char names[32] = "";
  if (transports & FERRY_TRANSPORT_TCP)
    strcat(names, "tcp");
  if (transports & FERRY_TRANSPORT_SHM)
    strcat(names, *names ? "/shm" : "shm");
  const char *what = strstr(reason, "which cannot be loaded on this host")
                         ? "ferry's fabric transport is not available"
                     : !strcasecmp(protocol, "efa") ? "no EFA device here"
                                                    : "no RDMA device here";
  fprintf(stderr,
          "%s: WARNING: protocol '%s': %s (%s); using %s; pass protocol 'tcp' to choose this "
          "(see docs/errors.md#warnings-that-are-not-errors)\n",
          PROG, protocol, what, reason, names);
}

/* libferry's refusal of a fabric provider that has no device here. */
static int no_rdma_device(ferry_status st, const char *detail) {
  return st == FERRY_ETRANSPORT && (strstr(detail, "no such provider or device here") ||
                                    strstr(detail, "its devices: none") ||
                                    strstr(detail, "which cannot be loaded on this host"));
}

/* The engine options --local_server_name (host is its host part, size
 * bytes), --metadata_server and --protocol ask for; -1 after a usage error. */
static int engine_opts(const te_flags *f, char *host, size_t size, ferry_cli_engine_opts *e,
                       int *fabric) {
  unsigned long port;
  if (split_server_name(f->local_server_name, host, size, &port) != 0)
    return bad("local_server_name", f->local_server_name, "HOST, HOST:PORT or [IPV6]:PORT");
  ferry_cli_engine_opts_init(e);
  e->host = host;
  e->port = (uint16_t)port;
  e->client = f->initiator;
  if (strcmp(f->metadata_server, P2PHANDSHAKE) != 0) {
    e->metadata_url = f->metadata_server;
    /* The initiator publishes under its name only when it was given one. */
    if (!f->initiator || f->name_given)
      e->segment_name = f->local_server_name;
  }
  return apply_protocol(f, e, fabric);
}

/* The engine: with rdma/efa and no such device, tcp/shm after the drop-in's
 * warning. */
static ferry_engine *create_engine(const te_flags *f, ferry_cli_engine_opts *e, int fabric) {
  ferry_engine *engine = NULL;
  ferry_status st = ferry_cli_engine_try(e, &engine);
  if (st != FERRY_OK && fabric && no_rdma_device(st, ferry_last_error())) {
    char reason[512];
    const char *detail = ferry_last_error();
    if (!strncmp(detail, "engine start failed: ", 21)) /* libferry's step, not the cause */
      detail += 21;
    snprintf(reason, sizeof reason, "%s", detail);
    e->fabric_provider = e->fabric_device = NULL;
    e->transports = allowed_transports() & ~(unsigned)FERRY_TRANSPORT_FABRIC;
    if (e->transports != 0 && (st = ferry_cli_engine_try(e, &engine)) == FERRY_OK)
      warn_no_device(f->protocol, reason, e->transports);
  }
  if (st != FERRY_OK) {
    ferry_cli_report(PROG, "cannot create engine", st);
    return NULL;
  }
  return engine;
}

/* ---- Buffers --------------------------------------------------------------- */

/* size bytes registered on engine: in CUDA memory with --use_vram, else
 * ferry's shareable host memory; filled with --init_mem. */
static void *buffer_alloc(ferry_engine *engine, const te_flags *f, size_t size) {
  void *buf = NULL;
  ferry_status st;
  if (f->use_vram) {
    char why[256], location[32];
    if (ferry_vram_alloc((int)f->gpu_id, size, f->init_mem ? INIT_BYTE : -1, &buf, why,
                         sizeof why) != 0) {
      fprintf(stderr, "%s: cannot allocate %zu bytes on CUDA device %lu: %s\n", PROG, size,
              f->gpu_id, why);
      return NULL;
    }
    snprintf(location, sizeof location, "cuda:%lu", f->gpu_id);
    if ((st = ferry_memory_register_at(engine, buf, size, location)) != FERRY_OK) {
      ferry_cli_report(PROG, "cannot register the CUDA buffer", st);
      ferry_vram_free(buf);
      return NULL;
    }
    return buf;
  }
  if ((st = ferry_memory_alloc(engine, size, &buf)) != FERRY_OK) {
    ferry_cli_report(PROG, "cannot allocate the buffer", st);
    return NULL;
  }
  if (f->init_mem) /* faults every page in now, not during the timed run */
    memset(buf, INIT_BYTE, size);
  return buf;
}

static void buffer_free(ferry_engine *engine, const te_flags *f, void *buf) {
  if (f->use_vram) {
    ferry_memory_unregister(engine, buf);
    ferry_vram_free(buf);
  } else {
    ferry_memory_free(engine, buf);
  }
}

/* --use_vram as given, or on where the CUDA driver finds a device. */
static int resolve_vram(te_flags *f) {
  char why[256] = "";
  int cuda = ferry_memory_cuda_available(why, sizeof why);
  if (f->use_vram < 0)
    f->use_vram = cuda;
  if (f->use_vram && !cuda) {
    fprintf(stderr, "%s: --use_vram=true needs a CUDA device, and ferry found none: %s\n", PROG,
            why);
    return -1;
  }
  return 0;
}

/* ---- Target ---------------------------------------------------------------- */

static int run_target(ferry_engine *engine, const te_flags *f, const sigset_t *stop) {
  void *buf = buffer_alloc(engine, f, f->buffer_size);
  if (buf == NULL)
    return 1;
  printf("ready segment_id=%s buffer_size=%zu%s\n", ferry_engine_name(engine), f->buffer_size,
         f->use_vram ? " vram" : "");
  fflush(stdout);
  int sig;
  sigwait(stop, &sig);
  buffer_free(engine, f, buf);
  return 0;
}

/* ---- Initiator ------------------------------------------------------------- */

typedef struct te_run {
  ferry_engine *engine;
  const te_flags *flags;
  uint8_t *local;
  uint64_t remote;
  atomic_int stop;
  atomic_int failed;
} te_run;

typedef struct te_worker {
  te_run *run;
  unsigned index;
  pthread_t thread;
  uint64_t batches;
} te_worker;

static void *worker_main(void *arg) {
  te_worker *w = arg;
  const te_flags *f = w->run->flags;
  ferry_entry *entries = calloc(f->batch_size, sizeof *entries);
  if (entries == NULL) {
    fprintf(stderr, "%s: thread %u: out of memory\n", PROG, w->index);
    atomic_store(&w->run->failed, 1);
    return NULL;
  }
  for (size_t i = 0; i < f->batch_size; i++) {
    uint64_t at = (uint64_t)f->block_size * (i * f->threads + w->index);
    entries[i] = (ferry_entry){.op = f->op,
                               .local = w->run->local + at,
                               .remote = w->run->remote + at,
                               .length = f->block_size};
  }
  while (!atomic_load_explicit(&w->run->stop, memory_order_relaxed)) {
    ferry_status st =
        ferry_transfer_sync_batch(w->run->engine, f->segment_id, entries, f->batch_size, NULL);
    if (st != FERRY_OK) {
      fprintf(stderr, "%s: thread %u: transfer with %s failed: %s (ferry_status %d): %s\n", PROG,
              w->index, f->segment_id, ferry_strerror(st), st, ferry_last_error());
      atomic_store(&w->run->failed, 1);
      atomic_store(&w->run->stop, 1);
      break;
    }
    w->batches++;
  }
  free(entries);
  return NULL;
}

/* The target's first region, checked to hold every thread's blocks. */
static int open_segment(ferry_engine *engine, const te_flags *f, uint64_t need, uint64_t *base) {
  ferry_region *regions = NULL;
  size_t count = 0;
  ferry_status st = ferry_peer_regions(engine, f->segment_id, &regions, &count);
  if (st != FERRY_OK) {
    fprintf(stderr, "%s: cannot open segment \"%s\" (--segment_id): %s (ferry_status %d): %s\n",
            PROG, f->segment_id, ferry_strerror(st), st, ferry_last_error());
    return -1;
  }
  int rc = 0;
  if (count == 0) {
    fprintf(stderr, "%s: segment \"%s\" has no registered buffer\n", PROG, f->segment_id);
    rc = -1;
  } else if (regions[0].length < need) {
    fprintf(stderr,
            "%s: segment \"%s\" registered %" PRIu64 " bytes, less than the %" PRIu64
            " this run moves (--block_size * --batch_size * --threads): start its target with a "
            "larger --buffer_size\n",
            PROG, f->segment_id, regions[0].length, need);
    rc = -1;
  } else {
    *base = regions[0].addr;
  }
  free(regions);
  return rc;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sleeps --duration seconds, or until SIGINT/SIGTERM: returns 1 then. */
static int wait_duration(const te_flags *f, const sigset_t *stop, const te_run *run) {
  double end = now_s() + (double)f->duration;
  for (double left; !atomic_load(&run->failed) && (left = end - now_s()) > 0;) {
    /* Short waits: a failed transfer ends the run without waiting it out. */
    double step = left < 0.1 ? left : 0.1;
    struct timespec ts = {0, (long)(step * 1e9)};
    if (sigtimedwait(stop, NULL, &ts) > 0)
      return 1;
  }
  return 0;
}

static int run_initiator(ferry_engine *engine, const te_flags *f, const sigset_t *stop) {
  uint64_t need = (uint64_t)f->block_size * f->batch_size * f->threads;
  te_run run = {.engine = engine, .flags = f};
  if (open_segment(engine, f, need, &run.remote) != 0)
    return 1;
  if ((run.local = buffer_alloc(engine, f, need)) == NULL)
    return 1;
  te_worker *workers = calloc(f->threads, sizeof *workers);
  if (workers == NULL) {
    fprintf(stderr, "%s: out of memory\n", PROG);
    buffer_free(engine, f, run.local);
    return 1;
  }
  double start = now_s();
  unsigned long started = 0;
  for (; started < f->threads; started++) {
    workers[started] = (te_worker){.run = &run, .index = (unsigned)started};
    if (pthread_create(&workers[started].thread, NULL, worker_main, &workers[started]) != 0) {
      fprintf(stderr, "%s: cannot start thread %lu\n", PROG, started);
      atomic_store(&run.failed, 1);
      break;
    }
  }
  int interrupted = started == f->threads && wait_duration(f, stop, &run);
  atomic_store(&run.stop, 1);
  uint64_t batches = 0;
  for (unsigned long i = 0; i < started; i++) {
    pthread_join(workers[i].thread, NULL);
    batches += workers[i].batches;
  }
  double seconds = now_s() - start;
  free(workers);
  buffer_free(engine, f, run.local);
  if (atomic_load(&run.failed))
    return 1;
  double bytes = (double)batches * (double)f->batch_size * (double)f->block_size;
  printf("Test completed: duration %.2f, batch count %" PRIu64 ", throughput %.*f %s/s\n", seconds,
         batches, (int)f->report_precision, bytes / seconds / f->unit_bytes, f->report_unit);
  fflush(stdout);
  return interrupted ? 130 : 0;
}

int ferry_cmd_transfer_engine_bench(int argc, char **argv) {
  te_flags f;
  int rc = parse_args(argc, argv, &f);
  if (rc == 1) {
    usage(stdout);
    return 0;
  }
  char host[256];
  ferry_cli_engine_opts e;
  int fabric;
  if (rc != 0 || resolve_vram(&f) != 0 || engine_opts(&f, host, sizeof host, &e, &fabric) != 0)
    return 2;
  /* Before the engine's threads exist, so only this thread takes them. */
  sigset_t stop;
  ferry_cli_block_stop_signals(&stop);
  ferry_engine *engine = create_engine(&f, &e, fabric);
  if (engine == NULL)
    return 1;
  rc = f.initiator ? run_initiator(engine, &f, &stop) : run_target(engine, &f, &stop);
  ferry_engine_destroy(engine);
  return rc;
}
