/* offload.h - the client's side of client-owned SSD offload (docs/store.md
 * "Client-owned SSD offload", Mooncake's --enable_offload): a client that
 * owns an offload directory keeps copies of the objects in its segment
 * there, as the master asks, and loads them back into its segment when a
 * get needs one. */
#ifndef FERRY_STORE_OFFLOAD_H
#define FERRY_STORE_OFFLOAD_H

#include "ferry.h"

typedef struct store_offload store_offload;

/* Checks dir (an existing directory this process can create files in:
 * FERRY_EINVAL naming it and the cause), opens the offload connection to
 * s's master, polls once (a master without --enable_offload refuses it:
 * FERRY_EINVAL) and starts the thread that serves the master's tasks. s
 * must have a segment. capacity: the bytes its files may hold (0: no
 * limit); past it the oldest are dropped, from the store too. */
ferry_status store_offload_start(ferry_store *s, const char *dir, uint64_t capacity,
                                 store_offload **out);
/* Stops the thread (within a poll, 250 ms) and closes its connection. */
void store_offload_stop(store_offload *o);

#endif
