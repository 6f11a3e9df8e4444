/* rails.h - the rails of a target: the addresses (NICs) it serves data on
 * besides its RPC port, from ferry_config.rail_hosts. Each rail is one
 * listener pinned to a literal address; initiators learn the rails from the
 * tcp descriptor of the handshake facts and spread their data channels over
 * them (peer.c), so one engine can drive several NICs toward one peer. */
#ifndef FERRY_RAILS_H
#define FERRY_RAILS_H

#include <stdint.h>

#include "net/net.h"

#define FERRY_RAILS_MAX 8
/* "host:port" or "[v6]:port" of one rail, as advertised. */
#define FERRY_RAIL_NAME_MAX 64

typedef struct ferry_rail_spec {
  char host[FERRY_RAIL_NAME_MAX];      /* literal address to listen on */
  uint16_t port;                       /* 0: any free port */
  char advertise[FERRY_RAIL_NAME_MAX]; /* "host:port" initiators are told; "" = where it listens */
} ferry_rail_spec;

/* Parses a comma-separated rail list: each entry ADDR, ADDR:PORT or
 * [V6]:PORT, optionally followed by =ADDR:PORT, the address initiators are
 * told instead (a proxy or NAT in front of the rail). Every address must
 * be a literal IPv4/IPv6 address and not a wildcard. FERRY_EINVAL names the
 * bad entry; out may be NULL to only check. */
ferry_status ferry_rails_parse(const char *list, ferry_rail_spec *out, unsigned *count);

#endif
