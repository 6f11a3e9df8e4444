/* cli.h - helpers shared by the ferry subcommands: parsing sizes, counts and
 * protocol names, and creating an engine from the options every command
 * accepts. Kept in one place so serve, bench and probe agree on syntax. */
#ifndef FERRY_TOOLS_CLI_H
#define FERRY_TOOLS_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#include "ferry.h"

/* Parses "4096", "4K", "1M", "256M", "2G", "1T" (binary multiples, case
 * insensitive, an optional trailing "B" or "iB" allowed). Returns 0 and sets
 * *out, or -1 on garbage, zero or overflow. */
int ferry_cli_parse_size(const char *text, size_t *out);

/* Parses a decimal count in [min, max]. Returns 0 or -1. */
int ferry_cli_parse_count(const char *text, unsigned long min, unsigned long max,
                          unsigned long *out);

/* Parses "tcp", "shm", "fabric", "all" or a comma list into FERRY_TRANSPORT_*
 * bits. Returns 0 or -1. */
int ferry_cli_parse_protocol(const char *text, unsigned *out);

/* Writes the names of the bits in transports as "tcp,shm" into buf. */
void ferry_cli_protocol_names(unsigned transports, char *buf, size_t size);

/* The engine options serve, bench and probe share. Zero / NULL fields keep
 * the library's defaults. */
typedef struct ferry_cli_engine_opts {
  const char *host; /* bind and advertise address */
  uint16_t port;
  const char *secret;
  unsigned transports;
  unsigned connections;
  const char *metadata_url;    /* --metadata: publish / look up segments there */
  const char *segment_name;    /* --segment: the name published */
  uint32_t metadata_ttl_ms;    /* --metadata-ttl: lease on published keys */
  int metrics_port;            /* --metrics-port: -1 keeps the library's default */
  int client;                  /* the engine only initiates: warnings and errors
                                  only, unless FERRY_LOG says otherwise */
  const char *fabric_provider; /* NULL: the library's choice */
  const char *fabric_device;
} ferry_cli_engine_opts;

/* Fills opts with the tools' defaults (host 127.0.0.1, everything else the
 * library's). */
void ferry_cli_engine_opts_init(ferry_cli_engine_opts *opts);

/* Creates the engine and prints nothing: for a caller that tries another
 * configuration when this one fails. */
ferry_status ferry_cli_engine_try(const ferry_cli_engine_opts *opts, ferry_engine **out);

/* Creates the engine; on failure prints "PROG: ...: cause: detail" to stderr
 * and returns the status. */
ferry_status ferry_cli_engine_create(const char *prog, const ferry_cli_engine_opts *opts,
                                     ferry_engine **out);

/* "A, B" (at most size bytes): the rails the engine knows target by, after
 * a ferry_peer_transport call reached it; "" when it has fewer than two. */
void ferry_cli_rails(ferry_engine *engine, const char *target, char *out, size_t size);

/* What listens on target ("HOST:PORT", tools/sniff.c), within about 4 s:
 * 1 a ferry engine; 0 something else, described in what ("an HTTP server
 * answered (...), not a ferry engine"); -1 nothing to tell (no such form,
 * or no connection: the caller's own call reports that). */
int ferry_cli_sniff(const char *target, char *what, size_t size);

/* What ferry_cli_parse_size accepts, in words. */
#define FERRY_CLI_SIZE_SYNTAX                                                                      \
  "a size in bytes, more than 0, with an optional binary K, M, G or T suffix (4096, 64K, 1M, 2G)"

/* Prints "PROG: invalid value 'VALUE' for --OPTION: expected WHAT IT ACCEPTS"
 * ("value out of range" for a number outside the option's range) and
 * returns 2, the usage error exit code. */
int ferry_cli_bad_value(const char *prog, const char *option, const char *value);

/* Prints "PROG: WHAT: <strerror>: <last error>" to stderr. */
void ferry_cli_report(const char *prog, const char *what, ferry_status status);

/* After getopt: 0 when no operands are left, else prints
 * "PROG: unexpected argument 'ARG'" and returns 2, the usage error code. */
int ferry_cli_no_operands(const char *prog, int argc, char **argv);

/* For a command whose option parser returned parse_rc != 0 (1: --help,
 * 2: usage error): prints usage to stdout or stderr and returns the exit
 * code, 0 or 2. */
int ferry_cli_usage_exit(int parse_rc, void (*usage)(FILE *out));

/* Blocks SIGINT and SIGTERM in the calling thread and fills stop with them,
 * for sigwait(). Call it before any thread starts: threads inherit the mask,
 * so only the sigwait can take the signal. */
void ferry_cli_block_stop_signals(sigset_t *stop);

/* Mooncake's flag spelling (gflags): argv[*i] is "--name=value", "--name
 * value", or the same with one dash. A flag named in booleans (a NULL-ended
 * list) takes its value only after '=' ("--flag" alone: *value NULL, read as
 * true; "--noflag": *value "false"). Copies the name into name (size bytes), points *value at the
 * value and advances *i past a separate one. Returns -1 for an argument that is no flag. */
int ferry_cli_gflag(int argc, char **argv, int *i, const char *const *booleans, char *name,
                    size_t size, const char **value);

/* A gflags boolean: NULL (the bare flag), "true" or "1" set *out to 1,
 * "false" or "0" to 0; else prints "PROG: --FLAG takes true or false, not
 * "VALUE"" and returns -1. */
int ferry_cli_gflag_bool(const char *prog, const char *flag, const char *value, int *out);

/* Resolves host (numeric or a name) to its first socket address, with
 * port; -1 after printing "PROG: cannot resolve ..." to stderr. */
int ferry_cli_resolve(const char *prog, const char *host, unsigned port,
                      struct sockaddr_storage *ss);

#endif
