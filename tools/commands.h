/* commands.h - the subcommands of the `ferry` command-line tool. Each takes
 * the arguments after its name (argv[0] is the subcommand) and returns the
 * process exit code. */
#ifndef FERRY_TOOLS_COMMANDS_H
#define FERRY_TOOLS_COMMANDS_H

int ferry_cmd_serve(int argc, char **argv);
int ferry_cmd_bench(int argc, char **argv);
int ferry_cmd_probe(int argc, char **argv);
int ferry_cmd_metadata_server(int argc, char **argv);
int ferry_cmd_doctor(int argc, char **argv);
int ferry_cmd_store_master(int argc, char **argv);
int ferry_cmd_transfer_engine_bench(int argc, char **argv);

/* first_contact.c: `ferry bench --first-contact N` (opts is cli.h's). */
struct ferry_cli_engine_opts;
int ferry_bench_first_contact(const struct ferry_cli_engine_opts *opts, const char *target,
                              unsigned long rounds, int json);

/* bench_send.c: `ferry bench --op send`. */
int ferry_bench_send(const struct ferry_cli_engine_opts *opts, size_t block, unsigned threads,
                     double seconds, int fixed_write, int json);

#endif
