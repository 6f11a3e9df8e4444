/* names.c - the transports' names, for the FERRY_TRANSPORT_* bits of
 * ferry.h: messages and settings (FERRY_TRANSPORTS) use the names, the
 * wire format the bits (a descriptor's or a key section's transport). Here,
 * below the wire codecs, so that every layer may name a transport. */
#include <stddef.h>
#include <string.h>

#include "ferry.h"

static const struct {
  const char *name;
  unsigned bit;
} transport_names[] = {
    {"tcp", FERRY_TRANSPORT_TCP}, {"shm", FERRY_TRANSPORT_SHM}, {"fabric", FERRY_TRANSPORT_FABRIC}};

const char *ferry_transport_name(unsigned transport) {
  for (size_t i = 0; i < sizeof transport_names / sizeof *transport_names; i++)
    if (transport_names[i].bit == transport)
      return transport_names[i].name;
  return "none";
}

unsigned ferry_transport_parse(const char *names) {
  unsigned bits = 0;
  const char *p = names;
  while (p && *p) {
    size_t len = strcspn(p, ",");
    int found = len == 3 && strncmp(p, "all", 3) == 0;
    if (found)
      bits |= FERRY_TRANSPORT_ALL;
    for (size_t i = 0; !found && i < sizeof transport_names / sizeof *transport_names; i++) {
      if (strlen(transport_names[i].name) == len && strncmp(p, transport_names[i].name, len) == 0) {
        bits |= transport_names[i].bit;
        found = 1;
      }
    }
    if (!found)
      return 0;
    p += len;
    if (*p == ',')
      p++;
  }
  return bits;
}
