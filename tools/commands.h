/* commands.h - the subcommands of the `ferry` command-line tool. Each takes
 * the arguments after its name (argv[0] is the subcommand) and returns the
 * process exit code. */
#ifndef FERRY_TOOLS_COMMANDS_H
#define FERRY_TOOLS_COMMANDS_H

#include <stddef.h>

int ferry_cmd_serve(int argc, char **argv);
int ferry_cmd_bench(int argc, char **argv);
int ferry_cmd_probe(int argc, char **argv);
int ferry_cmd_metadata_server(int argc, char **argv);
int ferry_cmd_doctor(int argc, char **argv);
int ferry_cmd_store_master(int argc, char **argv);
int ferry_cmd_transfer_engine_bench(int argc, char **argv);

/* metadata_server.c: the http metadata store, for store-master's
 * --enable_http_metadata_server too. start: NULL after saying why on stderr
 * (block the stop signals first: its threads inherit the mask); sweep drops
 * expired keys (call it every half second or so); stop returns the keys
 * dropped. */
typedef struct ferry_md_server ferry_md_server;
ferry_md_server *ferry_md_server_start(const char *host, unsigned port);
unsigned ferry_md_server_port(const ferry_md_server *s);
void ferry_md_server_sweep(ferry_md_server *s);
size_t ferry_md_server_stop(ferry_md_server *s);

/* first_contact.c: `ferry bench --first-contact N` (opts is cli.h's). */
struct ferry_cli_engine_opts;
int ferry_bench_first_contact(const struct ferry_cli_engine_opts *opts, const char *target,
                              unsigned long rounds, int json);

/* bench_send.c: `ferry bench --op send`. */
int ferry_bench_send(const struct ferry_cli_engine_opts *opts, size_t block, unsigned threads,
                     double seconds, int fixed_write, int json);

#endif
