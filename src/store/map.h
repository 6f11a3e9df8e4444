/* map.h - the store master's state: key -> object (size, pending or
 * committed, lease, replicas) and the segments clients contribute with
 * their free space. One lock over all of it; each request is decoded and
 * answered under it (protocol.h gives the bodies). Clients are named by
 * the id the master gave their connection. */
#ifndef FERRY_STORE_MAP_H
#define FERRY_STORE_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "store/protocol.h"

typedef struct store_map store_map;

/* lease_ttl_ms: a GET's lease; client_ttl_ms: the silence that drops a
 * client (its PING interval is a third of it). */
store_map *store_map_create(uint32_t lease_ttl_ms, uint32_t client_ttl_ms);
void store_map_destroy(store_map *m);

/* Answers one request of `client` (REGISTER included: it mounts the
 * segment the body names). The reply's entries go to reply; a request the
 * master refuses whole returns its status with the reason in why (the
 * connection stays up for FERRY_EVERSION, FERRY_EINVAL and FERRY_EBUSY; a
 * malformed body, FERRY_EPROTO, ends it). */
ferry_status store_map_serve(store_map *m, uint64_t client, uint8_t op, store_reader *r,
                             uint32_t count, store_writer *reply, char *why, size_t why_size);

/* A client left (its connection ended, or it fell silent): its segment and
 * every replica in it, and its pending puts, are gone. Returns how many
 * objects were dropped with it. */
size_t store_map_drop_client(store_map *m, uint64_t client);

#endif
