/* handshake.h - the handshake between a store client and its master: the
 * engine's (wire.h), from net/'s proofs; afterwards the socket seals every
 * frame when a secret is set. Both calls run under the socket's deadline. */
#ifndef FERRY_STORE_HANDSHAKE_H
#define FERRY_STORE_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "net/net.h"

/* Who this side is: its random instance id, its name (logs only) and the
 * shared secret it proves (NULL: none). */
typedef struct store_identity {
  uint64_t instance_id;
  const char *name;
  const char *secret;
} store_identity;

/* Master side; client_name gets the HELLO's name (unproven: logs only). */
ferry_status store_handshake_accept(ferry_sock *s, ferry_session *session,
                                    const store_identity *self, char *client_name, size_t size);
/* Client side; *master_id gets the master's instance id (HELLO_REPLY's
 * engine_id, proven with a secret): a new one means it restarted. */
ferry_status store_handshake_connect(ferry_sock *s, ferry_session *session,
                                     const store_identity *self, uint64_t *master_id);

#endif
