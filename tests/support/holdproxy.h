/* holdproxy.h - a TCP proxy for tests that need a peer to stall at a chosen
 * point of the conversation: it forwards every connection to a target on
 * 127.0.0.1, reads the target's replies frame by frame, and holds back the
 * frames of one chosen type until released. A test then knows, without
 * timing, that the initiator is waiting for exactly those replies. */
#ifndef FERRY_TEST_HOLDPROXY_H
#define FERRY_TEST_HOLDPROXY_H

#include <stdint.h>

typedef struct hold_proxy hold_proxy;

/* Listens on 127.0.0.1 (any port) and forwards to 127.0.0.1:target_port. */
hold_proxy *hold_proxy_start(uint16_t target_port);
/* The same on a chosen port (0: any), e.g. that of a stopped proxy. */
hold_proxy *hold_proxy_start_on(uint16_t port, uint16_t target_port);
/* "127.0.0.1:PORT", what initiators pass as the target. */
const char *hold_proxy_target(const hold_proxy *proxy);
/* From now on, frames of this type (FERRY_FRAME_*) from the target wait. */
void hold_proxy_hold(hold_proxy *proxy, uint8_t frame_type);
/* Waits at most timeout_ms until `count` frames are being held; 0 when
 * they are, -1 on timeout. */
int hold_proxy_wait_held(hold_proxy *proxy, unsigned count, int timeout_ms);
/* Forwards the held frames and stops holding. */
void hold_proxy_release(hold_proxy *proxy);
/* Closes every connection and joins every thread. */
void hold_proxy_stop(hold_proxy *proxy);

#endif
