/* rails.c - parsing and checking the rail list (see rails.h). Strict on
 * purpose: a rail that silently binds a wildcard or a resolved name could
 * carry data over a NIC nobody chose. */
#include "rails.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

/* Nonzero when s is a literal, non-wildcard IPv4 or IPv6 address. */
static int literal_address(const char *s) {
  unsigned char a[16], zero[16] = {0};
  if (inet_pton(AF_INET, s, a) == 1)
    return memcmp(a, zero, 4) != 0;
  if (inet_pton(AF_INET6, s, a) == 1)
    return memcmp(a, zero, 16) != 0;
  return 0;
}

/* ADDR, ADDR:PORT or [V6]:PORT into host and port (0 when absent). */
static int split_address(const char *text, int need_port, char host[FERRY_RAIL_NAME_MAX],
                         uint16_t *port) {
  char scratch[FERRY_HOST_MAX];
  *port = 0;
  if (strlen(text) >= FERRY_RAIL_NAME_MAX)
    return 0;
  int has_port = text[0] == '[' || (strchr(text, ':') && strchr(text, ':') == strrchr(text, ':'));
  if (!has_port) {
    snprintf(host, FERRY_RAIL_NAME_MAX, "%s", text);
    return !need_port && literal_address(host);
  }
  if (ferry_net_parse_target(text, scratch, port) != FERRY_OK || (need_port && !*port))
    return 0;
  snprintf(host, FERRY_RAIL_NAME_MAX, "%.*s", FERRY_RAIL_NAME_MAX - 1, scratch);
  return literal_address(host);
}

static ferry_status parse_entry(const char *entry, ferry_rail_spec *spec) {
  char listen[FERRY_RAIL_NAME_MAX * 2];
  snprintf(listen, sizeof listen, "%s", entry);
  char *advertise = strchr(listen, '=');
  if (advertise)
    *advertise++ = 0;
  char host[FERRY_RAIL_NAME_MAX];
  uint16_t port;
  memset(spec, 0, sizeof *spec);
  if (!split_address(listen, 0, spec->host, &spec->port))
    return ferry_fail(FERRY_EINVAL,
                      "rail \"%s\" is not valid: expected a literal IP address (not a name, not "
                      "0.0.0.0 or ::), optionally with :PORT",
                      listen);
  if (advertise && !split_address(advertise, 1, host, &port))
    return ferry_fail(FERRY_EINVAL,
                      "rail \"%s\": the advertised address \"%s\" is not valid: expected a "
                      "literal IP address with :PORT",
                      listen, advertise);
  if (advertise)
    ferry_net_format_target(spec->advertise, sizeof spec->advertise, host, port);
  return FERRY_OK;
}

ferry_status ferry_rails_parse(const char *list, ferry_rail_spec *out, unsigned *count) {
  *count = 0;
  if (!list || !*list)
    return FERRY_OK;
  for (const char *p = list;; p++) {
    size_t len = strcspn(p, ",");
    char entry[FERRY_RAIL_NAME_MAX * 2];
    if (!len || len >= sizeof entry)
      return ferry_fail(FERRY_EINVAL, "rail list \"%.80s\" has an empty or overlong entry", list);
    if (*count == FERRY_RAILS_MAX)
      return ferry_fail(FERRY_EINVAL, "rail list \"%.80s\" names more than %d rails", list,
                        FERRY_RAILS_MAX);
    memcpy(entry, p, len);
    entry[len] = 0;
    ferry_rail_spec spec;
    ferry_status st = parse_entry(entry, &spec);
    if (st)
      return st;
    if (out)
      out[*count] = spec;
    (*count)++;
    p += len;
    if (!*p)
      return FERRY_OK;
  }
}
