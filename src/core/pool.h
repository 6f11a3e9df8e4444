/* pool.h - receive pools (message handoff): the receiver's pools and the
 * grants it gave, served from POOL frames (or the POOL body a WRITE frame
 * carries after its payload), and the sender's side of ferry_send. Built
 * on the engine's WRITE path and its control connection, so it works over
 * every transport. Declared in core, implemented by pool/pool.c: the
 * server and the transports call the hooks below when data lands, the
 * composition root (engine/engine.c) creates and destroys the pools. */
#ifndef FERRY_POOL_H
#define FERRY_POOL_H

#include "core/engine.h"

typedef struct ferry_pools ferry_pools;

ferry_status ferry_pools_init(ferry_engine *engine);
/* Shutdown: wakes every wait on a pool (receivers, grant requests). */
void ferry_pools_wake(ferry_engine *engine);
/* After shutdown: frees what is left. */
void ferry_pools_destroy(ferry_engine *engine);

/* How a LANDED notice came (the inband argument of ferry_pools_serve). */
#define FERRY_NOTICE_CONTROL 0 /* a POOL frame on the control connection */
#define FERRY_NOTICE_INBAND 1  /* after the payload of one of the message's WRITE frames */
#define FERRY_NOTICE_POSTED 2  /* posted by a transport once every byte was in place */

/* Server side of a POOL frame from peer (its engine id and name), or of
 * an after-landed message carried in-band or posted (inband: one of
 * FERRY_NOTICE_*); on FERRY_OK reply holds the POOL_REPLY body. May wait
 * for room in the pool up to the request's wait_ms, at most the engine's
 * timeout_ms; a posted message is served only if it is a LANDED (it never
 * waits), and its receivers wake only at ferry_pools_landed_wake. */
ferry_status ferry_pools_serve(ferry_engine *engine, uint64_t peer, const char *peer_name,
                               const uint8_t *body, size_t len, int inband,
                               uint8_t reply[FERRY_WIRE_POOL_REPLY_SIZE]);
/* After a batch of posted notices was served: wakes the receivers of the
 * pools where their messages landed (once, not once per message). */
void ferry_pools_landed_wake(ferry_engine *engine);
/* The pools' part of a stats snapshot (ferry.h: pool_*). */
void ferry_pools_stats(ferry_engine *engine, ferry_stats *out);
/* A WRITE of segs by peer: FERRY_OK unless one touches a pool outside a
 * slot granted to that peer, not expired and not landed yet (then reason
 * says why). On FERRY_OK the slots count the WRITE as in flight, and hold
 * back LANDED, until ferry_pools_writes_done: a slot is writable by its
 * sender only until it landed. One atomic load when the engine has no pool. */
ferry_status ferry_pools_check_writes(ferry_engine *engine, uint64_t peer, const ferry_region *segs,
                                      uint32_t count, char *reason, size_t size);
/* The WRITE checked by ferry_pools_check_writes moves no more bytes;
 * landed: all of them arrived (and passed the checksum), so they count as
 * written under the grant (a message is delivered only once every byte of
 * it was). */
void ferry_pools_writes_done(ferry_engine *engine, uint64_t peer, const ferry_region *segs,
                             uint32_t count, int landed);
/* A connection of peer began (the server's control connections, and a
 * transport's own links that carry peer's notices), or ended: when peer
 * holds none any more, no WRITE or notice of it can arrive, and its slots
 * not yet landed go back. Any thread; no lock of the caller's held that
 * the transports' peer_gone takes. */
void ferry_pools_peer_joined(ferry_engine *engine, uint64_t peer);
void ferry_pools_peer_left(ferry_engine *engine, uint64_t peer);
/* peer, which just joined, writes into pools without WRITEs the target
 * sees (shm: it maps them and copies itself): until all its connections
 * ended, its LANDED notices are served without checking that its WRITEs
 * covered the message. Only for a sender the kernel shows to be the same
 * user (shm_service.c), who can write that memory anyway. */
void ferry_pools_peer_copies(ferry_engine *engine, uint64_t peer);

#endif
