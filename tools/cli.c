/* cli.c - parsing and engine set-up shared by the ferry subcommands, so that
 * "--size 256M" and "--protocol shm" mean the same thing everywhere. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Returns log2 of the multiplier a suffix letter stands for, or -1. */
static int suffix_shift(char c) {
  switch (toupper((unsigned char)c)) {
  case 'K': return 10;
  case 'M': return 20;
  case 'G': return 30;
  case 'T': return 40;
  default: return -1;
  }
}

/* Accepts what may follow the number: "", "B", or a multiplier letter
 * optionally followed by "B" or "iB". */
static int parse_suffix(const char *s, int *shift) {
  *shift = 0;
  if (*s == '\0')
    return 0;
  if ((*s == 'B' || *s == 'b') && s[1] == '\0')
    return 0;
  *shift = suffix_shift(*s);
  if (*shift < 0)
    return -1;
  s++;
  if (*s == '\0' || strcasecmp(s, "B") == 0 || strcasecmp(s, "iB") == 0)
    return 0;
  return -1;
}

int ferry_cli_parse_size(const char *text, size_t *out) {
  /* strtoull silently accepts a sign and leading blanks; sizes have neither. */
  if (text == NULL || !isdigit((unsigned char)text[0]))
    return -1;
  char *end;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  int shift;
  if (errno != 0 || parse_suffix(end, &shift) != 0 || value == 0)
    return -1;
  if (value > (unsigned long long)SIZE_MAX >> shift)
    return -1;
  *out = (size_t)(value << shift);
  return 0;
}

int ferry_cli_parse_count(const char *text, unsigned long min, unsigned long max,
                          unsigned long *out) {
  if (text == NULL || !isdigit((unsigned char)text[0]))
    return -1;
  char *end;
  errno = 0;
  unsigned long value = strtoul(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < min || value > max)
    return -1;
  *out = value;
  return 0;
}

int ferry_cli_parse_protocol(const char *text, unsigned *out) {
  if (text == NULL)
    return -1;
  /* "all" is the tools' spelling; the library parses the names themselves. */
  if (strcasecmp(text, "all") == 0) {
    *out = FERRY_TRANSPORT_ALL;
    return 0;
  }
  unsigned bits = ferry_transport_parse(text);
  if (bits == 0)
    return -1;
  *out = bits;
  return 0;
}

void ferry_cli_protocol_names(unsigned transports, char *buf, size_t size) {
  /* The default allows whatever the library can offer; naming every bit
   * would claim transports this build may not have. */
  if (transports == 0 || (transports & FERRY_TRANSPORT_ALL) == FERRY_TRANSPORT_ALL) {
    snprintf(buf, size, "all");
    return;
  }
  size_t used = 0;
  buf[0] = '\0';
  for (unsigned bit = 1; bit <= FERRY_TRANSPORT_ALL && used < size; bit <<= 1) {
    if (!(transports & bit))
      continue;
    int n = snprintf(buf + used, size - used, "%s%s", used ? "," : "", ferry_transport_name(bit));
    if (n < 0)
      break;
    used += (size_t)n;
  }
}

void ferry_cli_engine_opts_init(ferry_cli_engine_opts *opts) {
  memset(opts, 0, sizeof *opts);
  /* Loopback unless told otherwise: a tool should not expose memory on
   * every interface by accident. */
  opts->host = "127.0.0.1";
  opts->metrics_port = -1;
}

ferry_status ferry_cli_engine_try(const ferry_cli_engine_opts *opts, ferry_engine **out) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = opts->host;
  cfg.advertise_host = opts->host;
  cfg.port = opts->port;
  if (opts->secret != NULL)
    cfg.secret = opts->secret;
  if (opts->transports != 0)
    cfg.transports = opts->transports;
  if (opts->connections != 0)
    cfg.tcp_connections = opts->connections;
  cfg.metadata_url = opts->metadata_url;
  cfg.segment_name = opts->segment_name;
  if (opts->metadata_ttl_ms != 0)
    cfg.metadata_ttl_ms = opts->metadata_ttl_ms;
  if (opts->metrics_port >= 0)
    cfg.metrics_port = opts->metrics_port;
  if (opts->fabric_provider) /* else FERRY_FABRIC_PROVIDER, as ferry_config_init read it */
    cfg.fabric_provider = opts->fabric_provider;
  if (opts->fabric_device)
    cfg.fabric_device = opts->fabric_device;
  /* A client's output is its result: its engine's info lines (listening,
   * transport chosen) only when FERRY_LOG asks for them. */
  if (opts->client && ferry_log_get_level() == FERRY_LOG_INFO && !getenv("FERRY_LOG"))
    ferry_log_set_level(FERRY_LOG_WARN);
  return ferry_engine_create(&cfg, out);
}

ferry_status ferry_cli_engine_create(const char *prog, const ferry_cli_engine_opts *opts,
                                     ferry_engine **out) {
  ferry_status st = ferry_cli_engine_try(opts, out);
  if (st != FERRY_OK)
    ferry_cli_report(prog, "cannot create engine", st);
  return st;
}

void ferry_cli_report(const char *prog, const char *what, ferry_status status) {
  fprintf(stderr, "%s: %s: %s: %s\n", prog, what, ferry_strerror(status), ferry_last_error());
}

int ferry_cli_no_operands(const char *prog, int argc, char **argv) {
  if (optind == argc)
    return 0;
  fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
  return 2;
}

int ferry_cli_usage_exit(int parse_rc, void (*usage)(FILE *out)) {
  if (parse_rc == 1) {
    usage(stdout);
    return 0;
  }
  usage(stderr);
  return 2;
}

void ferry_cli_block_stop_signals(sigset_t *stop) {
  sigemptyset(stop);
  sigaddset(stop, SIGINT);
  sigaddset(stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, stop, NULL);
}

/* What each option accepts, so a usage error says how to fix it. */
static const struct {
  const char *option, *accepted;
  int numeric; /* digits that do not parse are out of range, not garbage */
} accepted_values[] = {
    {"port", "a port number, 0 to 65535 (0 picks a free one)", 1},
    {"size", FERRY_CLI_SIZE_SYNTAX, 0},
    {"block", FERRY_CLI_SIZE_SYNTAX, 0},
    {"protocol", "tcp, shm, fabric or all, or a comma-separated list (tcp,shm)", 0},
    {"connections", "a whole number, 1 to 1024", 1},
    {"threads", "a whole number, 1 to 1024", 1},
    {"depth", "a whole number, 1 to 1024", 1},
    {"batch", "a whole number, 1 to 1048576", 1},
    {"op", "write, read or send", 0},
    {"duration", "seconds, more than 0 and at most 1000000 (5, 0.5)", 0},
    {"remote-addr", "an address, decimal or 0x-prefixed hexadecimal", 0},
    {"max-value", FERRY_CLI_SIZE_SYNTAX, 0},
    {"max-bytes", FERRY_CLI_SIZE_SYNTAX, 0},
    {"max-keys", "a whole number, 1 to 4294967295", 1},
};

int ferry_cli_bad_value(const char *prog, const char *option, const char *value) {
  for (size_t i = 0; i < sizeof accepted_values / sizeof *accepted_values; i++) {
    if (strcmp(accepted_values[i].option, option) != 0)
      continue;
    int digits = *value && strspn(value, "0123456789") == strlen(value);
    fprintf(stderr, "%s: %s '%s' for --%s: expected %s\n", prog,
            accepted_values[i].numeric && digits ? "value out of range" : "invalid value", value,
            option, accepted_values[i].accepted);
    return 2;
  }
  fprintf(stderr, "%s: invalid value '%s' for --%s\n", prog, value, option);
  return 2;
}

void ferry_cli_rails(ferry_engine *engine, const char *target, char *out, size_t size) {
  ferry_stats *s;
  size_t used = 0;
  out[0] = 0;
  if (ferry_stats_snapshot(engine, &s) != FERRY_OK)
    return;
  for (size_t i = 0; i < s->rail_count && used < size; i++)
    if (strcmp(s->rails[i].peer, target) == 0)
      used += (size_t)snprintf(out + used, size - used, "%s%s", used ? ", " : "", s->rails[i].rail);
  ferry_stats_free(s);
}

int ferry_cli_resolve(const char *prog, const char *host, unsigned port,
                      struct sockaddr_storage *ss) {
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0) {
    fprintf(stderr, "%s: cannot resolve \"%s\": %s\n", prog, host, gai_strerror(rc));
    return -1;
  }
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  if (ss->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
  else
    ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
  freeaddrinfo(res);
  return 0;
}

static int listed(const char *const *names, const char *name) {
  for (const char *const *n = names; n && *n; n++)
    if (strcmp(*n, name) == 0)
      return 1;
  return 0;
}

int ferry_cli_gflag(int argc, char **argv, int *i, const char *const *booleans, char *name,
                    size_t size, const char **value) {
  const char *arg = argv[*i];
  if (arg[0] != '-' || arg[1] == '\0')
    return -1;
  arg += arg[1] == '-' ? 2 : 1;
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  if (len == 0 || len >= size)
    return -1;
  memcpy(name, arg, len);
  name[len] = '\0';
  if (!eq && strncmp(name, "no", 2) == 0 && listed(booleans, name + 2)) {
    memmove(name, name + 2, len - 1); /* --noflag: flag=false */
    *value = "false";
    return 0;
  }
  *value = eq ? eq + 1 : (!listed(booleans, name) && *i + 1 < argc ? argv[++*i] : NULL);
  return 0;
}

int ferry_cli_gflag_bool(const char *prog, const char *flag, const char *value, int *out) {
  if (!value || !strcmp(value, "true") || !strcmp(value, "1"))
    return *out = 1, 0;
  if (!strcmp(value, "false") || !strcmp(value, "0"))
    return *out = 0, 0;
  fprintf(stderr, "%s: --%s takes true or false, not \"%s\"\n", prog, flag, value);
  return -1;
}
