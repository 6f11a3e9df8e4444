/* rawclient.h - a hand-driven wire-protocol client for tests that must send
 * what a well-behaved engine never would: out-of-region addresses, wrong
 * versions, garbage and truncated frames. */
#ifndef FERRY_TEST_RAWCLIENT_H
#define FERRY_TEST_RAWCLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "wire/wire.h"

/* Connects to 127.0.0.1:port; -1 on failure. */
int raw_connect(uint16_t port);
/* Sends HELLO with the version range; returns the reply status (0 = ok) and
 * copies a refusal reason into reason (may be NULL). */
int raw_hello(int fd, uint16_t vmin, uint16_t vmax, char *reason, size_t reason_size);
/* WRITE of one segment; returns the ack status, or 1 if the connection broke. */
int raw_write(int fd, uint64_t remote, const void *data, size_t len, char *reason,
              size_t reason_size);
/* READ of one segment into out; returns the reply status or 1. */
int raw_read(int fd, uint64_t remote, void *out, size_t len);
/* Begins a WRITE of len bytes at remote: header, segment table and the
 * first `sent` bytes of data, then returns, leaving the frame unfinished. */
int raw_write_begin(int fd, uint64_t remote, const void *data, size_t len, size_t sent);
/* Sends a READ request of len bytes and returns without reading the reply. */
int raw_read_begin(int fd, uint64_t remote, size_t len);
/* Receives one reply header; returns its status (reason copied), or 1 if
 * the connection broke first. */
int raw_reply(int fd, char *reason, size_t reason_size);
/* HELLO as raw_hello, with the name given (any bytes but NUL). */
int raw_hello_called(int fd, const char *name, uint16_t vmin, uint16_t vmax, char *reason,
                     size_t reason_size);
/* HELLO as raw_hello, claiming to be the engine engine_id. */
int raw_hello_as(int fd, uint64_t engine_id, char *reason, size_t reason_size);
/* HELLO as raw_hello_as, with the nonce that names the connection (CUT). */
int raw_hello_named(int fd, uint64_t engine_id, const uint8_t nonce[FERRY_WIRE_NONCE_SIZE]);
/* CUT of the connection named nonce; returns the reply status, or 1 if the
 * connection broke or the reply is not CUT_REPLY. */
int raw_cut(int fd, const uint8_t nonce[FERRY_WIRE_NONCE_SIZE]);
/* Sends CUT and returns without reading the reply: 0, or -1. */
int raw_cut_begin(int fd, const uint8_t nonce[FERRY_WIRE_NONCE_SIZE]);
/* The reply to a CUT, as raw_cut; a refusal's reason goes to reason. */
int raw_cut_reply(int fd, char *reason, size_t reason_size);
int raw_send(int fd, const void *data, size_t len);
/* Exactly len bytes; -1 on EOF or error. */
int raw_recv(int fd, void *buf, size_t len);
/* Nonzero when the peer closed the connection within timeout_ms. */
int raw_closed_by_peer(int fd, int timeout_ms);

#endif
