/* rail_choice.c - the choice of a checkout's rail (rail_choice.h).
 *
 * Failover only, never striping across transports: a batch is done when
 * its slowest chunk is, so chunks spread over a fast and a slow transport
 * (fabric on an RDMA NIC and tcp) would make every large batch as slow as
 * the slow transport's share; and a small one is quickest on the best
 * transport too. The rails of one transport are alike (one NIC each), so
 * they share its batches. */
#include "rail_choice.h"

int ferry_rail_usable(const ferry_peer_rail *rail, uint64_t now) {
  return rail->down_until_ns <= now;
}

static int usable_here(const ferry_peer_rail *rails, unsigned r, uint64_t now, unsigned excluded) {
  return !(excluded & 1u << r) && ferry_rail_usable(&rails[r], now);
}

const struct ferry_transport *ferry_rails_carrier(const ferry_peer_rail *rails, unsigned count,
                                                  uint64_t now, unsigned excluded) {
  for (unsigned r = 0; r < count; r++)
    if (usable_here(rails, r, now, excluded))
      return rails[r].transport;
  return NULL;
}

int ferry_rails_pick(const ferry_peer_rail *rails, unsigned count, unsigned *next, uint64_t now,
                     unsigned excluded) {
  const struct ferry_transport *carrier = ferry_rails_carrier(rails, count, now, excluded);
  for (unsigned k = 0; carrier && k < count; k++) {
    unsigned r = (*next + k) % count;
    if (rails[r].transport == carrier && usable_here(rails, r, now, excluded)) {
      *next = r + 1;
      return (int)r;
    }
  }
  return -1;
}

int ferry_rails_other_usable(const ferry_peer_rail *rails, unsigned count, unsigned rail,
                             uint64_t now, unsigned excluded) {
  for (unsigned r = 0; r < count; r++)
    if (r != rail && usable_here(rails, r, now, excluded))
      return 1;
  return 0;
}

unsigned ferry_rails_of(const ferry_peer_rail *rails, unsigned count,
                        const struct ferry_transport *transport) {
  unsigned n = 0;
  for (unsigned r = 0; r < count; r++)
    n += rails[r].transport == transport;
  return n;
}
