/* probe.c - `ferry probe TARGET`: asks a peer to answer a ping and names the
 * transport data would use (and the target's rails, when it has several),
 * for scripts that wait for a target to come up and for people checking
 * reachability and secrets by hand. */
#include <getopt.h>
#include <stdio.h>

#include "cli.h"
#include "commands.h"
#include "ferry.h"

#define PROG "ferry probe"

static void probe_usage(FILE *out) {
  fprintf(out, "usage: ferry probe [--secret S] [--protocol tcp|shm|fabric|all] [--host ADDR]\n"
               "                   TARGET\n"
               "Exits 0 and prints \"TARGET answers (transport NAME)\" if the target answers;\n"
               "else exits 1 saying what was wrong, or what answered instead (an HTTP or TLS\n"
               "server, a service that closes or stays silent).\n");
}

/* Returns 0 to run, 1 for --help, 2 on a usage error. */
static int parse_probe_args(int argc, char **argv, ferry_cli_engine_opts *o, const char **target) {
  static const struct option longopts[] = {{"secret", required_argument, NULL, 'S'},
                                           {"protocol", required_argument, NULL, 'P'},
                                           {"host", required_argument, NULL, 'H'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  ferry_cli_engine_opts_init(o);
  o->client = 1;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'S': o->secret = optarg; break;
    case 'H': o->host = optarg; break;
    case 'h': return 1;
    case 'P':
      if (ferry_cli_parse_protocol(optarg, &o->transports) != 0)
        return ferry_cli_bad_value(PROG, "protocol", optarg);
      break;
    default: return 2;
    }
  }
  if (argc - optind != 1) {
    fprintf(stderr, "%s: expected exactly one TARGET\n", PROG);
    return 2;
  }
  *target = argv[optind];
  return 0;
}

int ferry_cmd_probe(int argc, char **argv) {
  ferry_cli_engine_opts o;
  const char *target = NULL;
  int rc = parse_probe_args(argc, argv, &o, &target);
  if (rc != 0)
    return ferry_cli_usage_exit(rc, probe_usage);
  ferry_engine *engine;
  if (ferry_cli_engine_create(PROG, &o, &engine) != FERRY_OK)
    return 1;
  unsigned transport = 0;
  char what[256];
  if (ferry_cli_sniff(target, what, sizeof what) == 0) {
    fprintf(stderr, "%s: %s: %s\n", PROG, target, what);
    ferry_engine_destroy(engine);
    return 1;
  }
  ferry_status st = ferry_probe(engine, target);
  if (st == FERRY_OK)
    st = ferry_peer_transport(engine, target, &transport);
  if (st == FERRY_OK) {
    char rails[512];
    ferry_cli_rails(engine, target, rails, sizeof rails);
    printf("%s answers (transport %s%s%s)\n", target, ferry_transport_name(transport),
           *rails ? ", rails " : "", rails);
  } else {
    fprintf(stderr, "%s: %s: %s: %s\n", PROG, target, ferry_strerror(st), ferry_last_error());
  }
  ferry_engine_destroy(engine);
  return st == FERRY_OK ? 0 : 1;
}
