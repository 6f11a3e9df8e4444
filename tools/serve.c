/* serve.c - `ferry serve`: an engine with one registered buffer that peers
 * can WRITE to and READ from, kept alive until SIGINT or SIGTERM. It is the
 * target side for `ferry bench`, the demo and the integration tests, which
 * learn where to aim from the single "ready ..." line it prints. On exit it
 * prints what it moved, so a run leaves a record of what it did. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli.h"
#include "commands.h"
#include "ferry.h"

#define PROG "ferry serve"
/* How often pending notifications are printed with --print-notifies. */
#define NOTIFY_POLL_NS (100 * 1000 * 1000L)
/* Longest notification payload shown; the rest is summarised by length. */
#define NOTIFY_SHOW_MAX 1024

typedef struct serve_opts {
  ferry_cli_engine_opts engine;
  size_t size;
  int print_notifies;
  int use_malloc; /* plain memory (reached over CMA by same-host peers) */
} serve_opts;

static void serve_usage(FILE *out) {
  fprintf(
      out,
      "usage: ferry serve [--host ADDR] [--port N] [--size SIZE] [--secret S]\n"
      "                   [--protocol tcp|shm|fabric|all] [--connections N] [--print-notifies]\n"
      "                   [--malloc] [--metadata URL] [--segment NAME]\n"
      "                   [--metadata-ttl MS] [--metrics-port N]\n"
      "  --host ADDR        bind and advertise address (default 127.0.0.1)\n"
      "  --port N           RPC port, 0 picks a free one (default 0)\n"
      "  --size SIZE        registered buffer size, K/M/G suffixes (default 256M)\n"
      "  --secret S         shared secret peers must prove\n"
      "  --protocol P       transports to allow: tcp, shm, fabric, all, or a list\n"
      "                     (tcp,shm; default all)\n"
      "  --connections N    TCP data connections per peer\n"
      "  --print-notifies   print received notifications to stdout\n"
      "  --malloc           register malloc'd memory instead of ferry_memory_alloc\n"
      "  --metadata URL     publish in this store (http, redis, etcd URL or host:port)\n"
      "  --segment NAME     segment name to publish (default HOST:PORT)\n"
      "  --metadata-ttl MS  lease on the published keys (default 5000)\n"
      "  --metrics-port N   serve Prometheus metrics on http://127.0.0.1:N/metrics\n"
      "                     (0 picks a free port, shown as metrics=PORT)\n"
      "Prints one line \"ready target=HOST:PORT addr=0xADDR size=BYTES protocol=...\"\n"
      "and serves until SIGINT or SIGTERM, then prints a summary to stderr.\n");
}

/* Returns 0 to run, 1 for --help, 2 on a usage error. */
static int parse_serve_args(int argc, char **argv, serve_opts *o) {
  static const struct option longopts[] = {
      {"host", required_argument, NULL, 'H'},
      {"port", required_argument, NULL, 'p'},
      {"size", required_argument, NULL, 's'},
      {"secret", required_argument, NULL, 'S'},
      {"protocol", required_argument, NULL, 'P'},
      {"connections", required_argument, NULL, 'c'},
      {"print-notifies", no_argument, NULL, 'n'},
      {"malloc", no_argument, NULL, 'm'},
      {"metadata", required_argument, NULL, 'M'},
      {"segment", required_argument, NULL, 'G'},
      {"metadata-ttl", required_argument, NULL, 'T'},
      {"metrics-port", required_argument, NULL, 'X'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  ferry_cli_engine_opts_init(&o->engine);
  o->size = (size_t)256 << 20;
  o->print_notifies = 0;
  o->use_malloc = 0;
  unsigned long n;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'H': o->engine.host = optarg; break;
    case 'S': o->engine.secret = optarg; break;
    case 'n': o->print_notifies = 1; break;
    case 'm': o->use_malloc = 1; break;
    case 'M': o->engine.metadata_url = optarg; break;
    case 'G': o->engine.segment_name = optarg; break;
    case 'h': return 1;
    case 'T':
      if (ferry_cli_parse_count(optarg, 1, UINT32_MAX, &n) != 0)
        return ferry_cli_bad_value(PROG, "metadata-ttl", optarg);
      o->engine.metadata_ttl_ms = (uint32_t)n;
      break;
    case 'p':
      if (ferry_cli_parse_count(optarg, 0, 65535, &n) != 0)
        return ferry_cli_bad_value(PROG, "port", optarg);
      o->engine.port = (uint16_t)n;
      break;
    case 's':
      if (ferry_cli_parse_size(optarg, &o->size) != 0)
        return ferry_cli_bad_value(PROG, "size", optarg);
      break;
    case 'P':
      if (ferry_cli_parse_protocol(optarg, &o->engine.transports) != 0)
        return ferry_cli_bad_value(PROG, "protocol", optarg);
      break;
    case 'c':
      if (ferry_cli_parse_count(optarg, 1, 1024, &n) != 0)
        return ferry_cli_bad_value(PROG, "connections", optarg);
      o->engine.connections = (unsigned)n;
      break;
    case 'X':
      if (ferry_cli_parse_count(optarg, 0, 65535, &n) != 0)
        return ferry_cli_bad_value(PROG, "metrics-port", optarg);
      o->engine.metrics_port = (int)n;
      break;
    default: return 2;
    }
  }
  return ferry_cli_no_operands(PROG, argc, argv);
}

/* Prints one notification as `notify name=N length=L data=ESCAPED`, escaping
 * anything unprintable so a binary payload cannot garble the output. */
static void print_notification(const ferry_notification *nt) {
  printf("notify name=%s length=%zu data=", nt->name ? nt->name : "", nt->length);
  size_t show = nt->length < NOTIFY_SHOW_MAX ? nt->length : NOTIFY_SHOW_MAX;
  for (size_t i = 0; i < show; i++) {
    unsigned char ch = (unsigned char)nt->data[i];
    if (isprint(ch) && ch != '\\')
      putchar(ch);
    else
      printf("\\x%02x", ch);
  }
  printf("%s\n", show < nt->length ? "..." : "");
}

static void drain_notifications(ferry_engine *engine) {
  ferry_notification *list;
  size_t count;
  ferry_status st = ferry_notify_drain(engine, &list, &count);
  if (st != FERRY_OK) {
    ferry_cli_report(PROG, "cannot drain notifications", st);
    return;
  }
  for (size_t i = 0; i < count; i++)
    print_notification(&list[i]);
  if (count > 0)
    fflush(stdout);
  ferry_notify_free(list, count);
}

/* Blocks until one of the signals in set arrives. With notifications on it
 * wakes every NOTIFY_POLL_NS to print them; otherwise it sleeps in sigwait. */
static int wait_for_stop(ferry_engine *engine, const sigset_t *set, int print_notifies) {
  const struct timespec poll = {0, NOTIFY_POLL_NS};
  for (;;) {
    int sig;
    if (!print_notifies) {
      if (sigwait(set, &sig) == 0)
        return sig;
      continue;
    }
    sig = sigtimedwait(set, NULL, &poll);
    if (sig > 0) {
      drain_notifications(engine);
      return sig;
    }
    if (errno == EAGAIN)
      drain_notifications(engine);
  }
}

static void print_ready(ferry_engine *engine, const void *buf, const serve_opts *o) {
  char protocols[64];
  ferry_cli_protocol_names(o->engine.transports, protocols, sizeof protocols);
  printf("ready target=%s addr=0x%llx size=%zu protocol=%s", ferry_engine_name(engine),
         (unsigned long long)(uintptr_t)buf, o->size, protocols);
  if (ferry_engine_metrics_port(engine))
    printf(" metrics=%u", ferry_engine_metrics_port(engine));
  printf("\n");
  fflush(stdout);
}

/* The served buffer: shareable memory from ferry, or (--malloc) plain
 * zeroed memory registered as it is, like a user's own buffer. */
static ferry_status alloc_buffer(ferry_engine *engine, const serve_opts *o, void **buf) {
  if (!o->use_malloc)
    return ferry_memory_alloc(engine, o->size, buf);
  *buf = calloc(1, o->size);
  if (*buf == NULL)
    return FERRY_ENOMEM;
  ferry_status st = ferry_memory_register(engine, *buf, o->size);
  if (st != FERRY_OK)
    free(*buf);
  return st;
}

static void free_buffer(ferry_engine *engine, const serve_opts *o, void *buf) {
  if (!o->use_malloc) {
    ferry_memory_free(engine, buf);
    return;
  }
  ferry_memory_unregister(engine, buf);
  free(buf);
}

/* One line on exit: what peers moved through this engine over tcp, what
 * it saw of the one-sided transports (their bytes are counted only by the
 * initiators), and what failed. */
static void print_summary(ferry_engine *engine) {
  ferry_stats *s;
  if (ferry_stats_snapshot(engine, &s) != FERRY_OK)
    return;
  uint64_t errors = 0;
  for (int i = 0; i < FERRY_STATS_CODES; i++)
    errors += s->errors[i];
  fprintf(stderr,
          PROG ": %s served %llu bytes written in %llu requests, %llu bytes read in %llu "
               "requests over tcp; accepted %llu tcp data connections, %llu shm links (shm and "
               "fabric transfers are one-sided: only their initiators count them); %llu errors\n",
          ferry_engine_name(engine), (unsigned long long)s->served_bytes[FERRY_OP_WRITE],
          (unsigned long long)s->served_requests[FERRY_OP_WRITE],
          (unsigned long long)s->served_bytes[FERRY_OP_READ],
          (unsigned long long)s->served_requests[FERRY_OP_READ],
          (unsigned long long)s->connections_accepted[0],
          (unsigned long long)s->connections_accepted[1], (unsigned long long)errors);
  ferry_stats_free(s);
}

int ferry_cmd_serve(int argc, char **argv) {
  serve_opts o;
  int rc = parse_serve_args(argc, argv, &o);
  if (rc != 0)
    return ferry_cli_usage_exit(rc, serve_usage);
  /* Before the engine starts its threads, so that they inherit the mask. */
  sigset_t stop;
  ferry_cli_block_stop_signals(&stop);

  ferry_engine *engine;
  if (ferry_cli_engine_create(PROG, &o.engine, &engine) != FERRY_OK)
    return 1;
  void *buf;
  ferry_status st = alloc_buffer(engine, &o, &buf);
  if (st != FERRY_OK) {
    ferry_cli_report(PROG, "cannot allocate the buffer", st);
    ferry_engine_destroy(engine);
    return 1;
  }
  print_ready(engine, buf, &o);
  wait_for_stop(engine, &stop, o.print_notifies);
  print_summary(engine);
  free_buffer(engine, &o, buf);
  ferry_engine_destroy(engine);
  return 0;
}
