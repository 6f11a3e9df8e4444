/* main.c - the `ferry` command-line tool: dispatches `ferry <command> [args]`
 * to the subcommands declared in commands.h. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "ferry.h"

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command;

static int cmd_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("ferry %s\n", ferry_version());
  return 0;
}

static int cmd_help(int argc, char **argv);

static const command commands[] = {
    {"serve", ferry_cmd_serve, "serve a registered buffer until SIGINT/SIGTERM"},
    {"bench", ferry_cmd_bench, "measure WRITE/READ throughput and latency against a target"},
    {"probe", ferry_cmd_probe, "check that a target answers"},
    {"metadata-server", ferry_cmd_metadata_server, "run an HTTP metadata service"},
    {"doctor", ferry_cmd_doctor, "check what ferry can do on this host (and reach a target)"},
    {"store-master", ferry_cmd_store_master, "run a store master (also as mooncake_master)"},
    {"transfer-engine-bench", ferry_cmd_transfer_engine_bench,
     "Mooncake's transfer_engine_bench, its flags (also as transfer_engine_bench)"},
    {"version", cmd_version, "print the library version"},
    {"help", cmd_help, "show this help"},
};

static void usage(FILE *out) {
  fprintf(out, "usage: ferry <command> [args]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(out, "  %-16s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "\nRun `ferry <command> --help` for a command's options.\n");
}

static int cmd_help(int argc, char **argv) {
  (void)argc;
  (void)argv;
  usage(stdout);
  return 0;
}

static const command *find_command(const char *name) {
  /* The usual spellings of help and version work too. */
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0)
    name = "help";
  else if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0)
    name = "version";
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(commands[i].name, name) == 0)
      return &commands[i];
  return NULL;
}

int main(int argc, char **argv) {
  /* Installed or linked as mooncake_master or transfer_engine_bench, it is
   * that command. */
  const char *self = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  if (strcmp(self, "mooncake_master") == 0) {
    signal(SIGPIPE, SIG_IGN);
    return ferry_cmd_store_master(argc, argv);
  }
  if (strcmp(self, "transfer_engine_bench") == 0) {
    signal(SIGPIPE, SIG_IGN);
    return ferry_cmd_transfer_engine_bench(argc, argv);
  }
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const command *cmd = find_command(argv[1]);
  if (cmd == NULL) {
    fprintf(stderr, "ferry: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  /* A peer vanishing mid-send, or a closed stdout pipe, must surface as an
   * error code rather than kill the tool silently. */
  signal(SIGPIPE, SIG_IGN);
  return cmd->run(argc - 1, argv + 1);
}
