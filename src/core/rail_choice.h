/* rail_choice.h - which of a peer's rails a checkout uses. A peer's rails
 * are those of every transport that can reach it, in the order of
 * preference (ferry_transports): a transport with several rails (NICs)
 * lists each, one without lists one. Only the most preferred transport
 * with a rail in use carries data (its rails take turns, so a large batch
 * is striped over them); the other transports are standby rails, used
 * when every rail of the better ones is out of use (a failed link, during
 * its back-off). Pure functions over the rail array, so the choice is
 * tested without a network (tests/unit/test_rail_choice.c). */
#ifndef FERRY_RAIL_CHOICE_H
#define FERRY_RAIL_CHOICE_H

#include <stdint.h>

#include "net/rails.h"

struct ferry_transport;

/* One rail toward the peer (transport.h): its channels carry
 * rail_generation, bumped when the rail fails so they retire. A failed
 * rail is out of use until down_until_ns, then tried again. */
typedef struct ferry_peer_rail {
  const struct ferry_transport *transport; /* whose rail it is */
  char name[FERRY_RAIL_NAME_MAX];          /* as the transport listed it; "" for its one rail */
  char label[FERRY_RAIL_NAME_MAX + 16];    /* for messages and stats */
  unsigned generation;
  uint64_t down_until_ns; /* 0: up */
  char cause[200];        /* why it went down, for messages */
  uint64_t bytes[2];      /* atomics, by ferry_op: moved on this rail */
  uint64_t failures;      /* atomics: times it went down */
} ferry_peer_rail;

/* A rail a channel may use at now: up, or down past its back-off. */
int ferry_rail_usable(const ferry_peer_rail *rail, uint64_t now);
/* In each call below, `excluded` has bit r set for a rail r the batch
 * must not use (a pool message's WRITEs avoid transports whose target
 * cannot check them, pool.c); those rails count as out of use. */
/* The transport that carries data at now: that of the first usable rail;
 * NULL when every rail is out of use. */
const struct ferry_transport *ferry_rails_carrier(const ferry_peer_rail *rails, unsigned count,
                                                  uint64_t now, unsigned excluded);
/* The rail of the next checkout: the next usable rail of the carrier in
 * turn from *next (advanced past it); -1 when every rail is out of use. */
int ferry_rails_pick(const ferry_peer_rail *rails, unsigned count, unsigned *next, uint64_t now,
                     unsigned excluded);
/* Nonzero when a rail other than `rail` is usable at now (any transport's):
 * a chunk lost on `rail` has somewhere to go. */
int ferry_rails_other_usable(const ferry_peer_rail *rails, unsigned count, unsigned rail,
                             uint64_t now, unsigned excluded);
/* How many of the rails belong to transport. */
unsigned ferry_rails_of(const ferry_peer_rail *rails, unsigned count,
                        const struct ferry_transport *transport);

#endif
