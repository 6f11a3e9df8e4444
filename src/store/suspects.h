/* suspects.h - the segments a client's reads failed to reach lately, so
 * that its gets read their replicas last. A holder that hangs or is cut
 * off from this client while the master still lists it would otherwise
 * cost every get a connect or transfer timeout before the next replica
 * (Mooncake #2039: one replica's failure slowed every HiCache get). A
 * suspect is still read when its replica is an object's last one left: the
 * order changes, never what is tried. */
#ifndef FERRY_STORE_SUSPECTS_H
#define FERRY_STORE_SUSPECTS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "store/protocol.h"

#define STORE_SUSPECTS_MAX 16
#define STORE_SUSPECT_MS 30000 /* how long a failed segment's replicas go last */

typedef struct store_suspects {
  pthread_mutex_t lock;
  unsigned count; /* atomic: 0 lets the reads skip the table */
  struct {
    char segment[STORE_NAME_MAX + 1];
    uint64_t until_ns;
  } entry[STORE_SUSPECTS_MAX];
} store_suspects;

void store_suspects_init(store_suspects *t);
void store_suspects_destroy(store_suspects *t);
/* A read from segment (len bytes, not terminated) ended in st (detail: its
 * error's text): a failure to reach it (a socket, handshake or deadline
 * error) makes it a suspect for STORE_SUSPECT_MS, a success clears it. Other failures (memory the
 * holder no longer has, say) say nothing about the link and change nothing. */
void store_suspects_note(store_suspects *t, const char *segment, size_t len, ferry_status st,
                         const char *detail);
/* Whether segment is a suspect now (an expired one leaves the table). */
int store_suspects_has(store_suspects *t, const char *segment, size_t len);
/* Moves the replicas on suspect segments after the others, each group in
 * its order; returns how many it moved back. */
unsigned store_suspects_order(store_suspects *t, store_replica_ref *reps, unsigned count);

#endif
