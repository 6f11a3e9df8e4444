/* auth.h - randomness, the shared-secret proofs of the handshakes and the
 * keys that seal a connection's frames (auth.c; the per-frame tags are in
 * net.h, next to the socket that uses them). */
#ifndef FERRY_AUTH_H
#define FERRY_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "net/net.h"
#include "wire/wire.h"

/* The shared-secret proofs. The shm service's: HMAC-SHA256 over
 * both nonces. */
void ferry_auth_nonce(uint8_t nonce[FERRY_WIRE_NONCE_SIZE]);
/* Which side proves: each uses its own label, so a proof cannot be
 * reflected back as the other side's. */
typedef enum ferry_auth_role { FERRY_AUTH_INITIATOR, FERRY_AUTH_TARGET } ferry_auth_role;
void ferry_auth_proof(const char *secret, ferry_auth_role role,
                      const uint8_t client_nonce[FERRY_WIRE_NONCE_SIZE],
                      const uint8_t server_nonce[FERRY_WIRE_NONCE_SIZE],
                      uint8_t proof[FERRY_WIRE_PROOF_SIZE]);
int ferry_auth_check(const char *secret, ferry_auth_role role,
                     const uint8_t client_nonce[FERRY_WIRE_NONCE_SIZE],
                     const uint8_t server_nonce[FERRY_WIRE_NONCE_SIZE],
                     const uint8_t proof[FERRY_WIRE_PROOF_SIZE]);
/* The TCP handshake's (wire version 2): th hashes the HELLO and HELLO_REPLY
 * bodies as sent; a proof is HMAC(secret, role label | th | facts), facts
 * being what the target reveals in AUTH_REPLY (none for the initiator). */
void ferry_auth_transcript(const uint8_t *hello, size_t hello_len, const uint8_t *reply,
                           size_t reply_len, uint8_t th[FERRY_WIRE_PROOF_SIZE]);
void ferry_auth_bound_proof(const char *secret, ferry_auth_role role,
                            const uint8_t th[FERRY_WIRE_PROOF_SIZE], const uint8_t *facts,
                            size_t facts_len, uint8_t proof[FERRY_WIRE_PROOF_SIZE]);
int ferry_auth_bound_check(const char *secret, ferry_auth_role role,
                           const uint8_t th[FERRY_WIRE_PROOF_SIZE], const uint8_t *facts,
                           size_t facts_len, const uint8_t proof[FERRY_WIRE_PROOF_SIZE]);
/* Keys for sealing the frames after the handshake, for side self. */
void ferry_session_start(ferry_session *s, const char *secret, ferry_auth_role self,
                         const uint8_t th[FERRY_WIRE_PROOF_SIZE]);
/* The AUTH step on s, after HELLO and HELLO_REPLY hashed into th
 * (auth_step.c). On success session holds the keys; the caller seals s
 * with them (ferry_sock_auth) when its next frame is due.
 * Target: reads AUTH and answers with its proof over th and the facts.
 * A missing or wrong proof is refused with an AUTH_REPLY carrying
 * FERRY_EAUTH and returns FERRY_EAUTH, the reason as the last error; the
 * WARN "refused connection from PEER: reason" is logged before the reply. */
ferry_status ferry_auth_accept(ferry_sock *s, const char *secret,
                               const uint8_t th[FERRY_WIRE_PROOF_SIZE],
                               const ferry_hello_reply *facts, ferry_session *session);
/* Initiator: sends its proof, checks the target's over th and the facts
 * AUTH_REPLY carries, and decodes them into facts (NULL: not wanted). who
 * names the target in messages ("peer", "store master"). */
ferry_status ferry_auth_prove(ferry_sock *s, const char *secret,
                              const uint8_t th[FERRY_WIRE_PROOF_SIZE], const char *who,
                              ferry_hello_reply *facts, ferry_session *session);
uint64_t ferry_random_u64(void);
void ferry_read_boot_id(uint8_t boot_id[FERRY_WIRE_BOOT_ID_SIZE]);

#endif
