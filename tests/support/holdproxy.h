/* holdproxy.h - a TCP proxy for tests that need a peer to stall at a chosen
 * point of the conversation: it forwards every connection to a target on
 * 127.0.0.1, reads the target's replies frame by frame, and holds back the
 * frames of one chosen type until released. A test then knows, without
 * timing, that the initiator is waiting for exactly those replies. It can
 * also be a silent link (blackhole: nothing forwarded, nothing read, no
 * connection closed) or a slow one (the initiator's bytes in small pieces). */
#ifndef FERRY_TEST_HOLDPROXY_H
#define FERRY_TEST_HOLDPROXY_H

#include <stddef.h>
#include <stdint.h>

typedef struct hold_proxy hold_proxy;

/* Listens on 127.0.0.1 (any port) and forwards to 127.0.0.1:target_port. */
hold_proxy *hold_proxy_start(uint16_t target_port);
/* The same on a chosen port (0: any), e.g. that of a stopped proxy. */
hold_proxy *hold_proxy_start_on(uint16_t port, uint16_t target_port);
/* A slow link from initiators to the target: at most `piece` bytes every
 * gap_ms, through a receive buffer of about that size, so an initiator sees
 * its bytes acknowledged only as they are forwarded. Replies go at full
 * speed. */
hold_proxy *hold_proxy_start_slow(uint16_t target_port, size_t piece, unsigned gap_ms);
/* "127.0.0.1:PORT", what initiators pass as the target. */
const char *hold_proxy_target(const hold_proxy *proxy);
/* From now on, frames of this type (FERRY_FRAME_*) from the target wait. */
void hold_proxy_hold(hold_proxy *proxy, uint8_t frame_type);
/* Waits at most timeout_ms until `count` frames are being held; 0 when
 * they are, -1 on timeout. */
int hold_proxy_wait_held(hold_proxy *proxy, unsigned count, int timeout_ms);
/* From now on the proxy is a silent link: it forwards nothing either way
 * and reads nothing more from initiators (their bytes go unacknowledged
 * once the buffers are full), closing nothing. A piece already read waits
 * (parked) until release forwards it or stop drops it. */
void hold_proxy_blackhole(hold_proxy *proxy);
/* Forwards the held frames and parked pieces and stops holding. */
void hold_proxy_release(hold_proxy *proxy);
/* Waits at most timeout_ms until every connection that had a piece parked
 * has ended toward its initiator: the target closed it, or the reply that
 * followed could not be delivered (so what it carried was applied or
 * dropped by then); 0 when they have, -1 on timeout. */
int hold_proxy_wait_drained(hold_proxy *proxy, int timeout_ms);
/* Closes every connection and joins every thread. */
void hold_proxy_stop(hold_proxy *proxy);

#endif
