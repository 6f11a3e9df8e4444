/* auth_step.c - the AUTH step of the TCP handshake on a socket, for both
 * sides (auth.h), shared by the engine's server and peers and by the
 * store's master and clients: each side proves the shared secret over the
 * transcript of HELLO and HELLO_REPLY, the target also over the facts it
 * reveals only to a peer that proved it, and both then derive the keys
 * that seal every later frame. */
#include "auth.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"

/* The refusal goes out as AUTH_REPLY with FERRY_EAUTH and the reason,
 * logged first: once the peer reads it, the target's line exists. */
static ferry_status refuse(ferry_sock *s, const char *why) {
  FERRY_WARN("refused connection from %s: %s", s->peer, why);
  ferry_frame_header h = {.type = FERRY_FRAME_AUTH_REPLY, .status = FERRY_EAUTH};
  h.body_len = strnlen(why, FERRY_WIRE_MAX_REASON - 1);
  ferry_sock_send_frame(s, &h, why, "send AUTH_REPLY");
  return ferry_fail(FERRY_EAUTH, "%s", why);
}

ferry_status ferry_auth_accept(ferry_sock *s, const char *secret,
                               const uint8_t th[FERRY_WIRE_PROOF_SIZE],
                               const ferry_hello_reply *facts, ferry_session *session) {
  uint8_t body[FERRY_WIRE_AUTH_REPLY_MAX];
  ferry_frame_header h;
  ferry_status st = ferry_sock_recv_header(s, &h, "receive AUTH");
  if (st)
    return st;
  if (h.type != FERRY_FRAME_AUTH)
    return refuse(s, "shared secret required, no proof sent");
  st = ferry_sock_recv(s, body, FERRY_WIRE_PROOF_SIZE, "receive AUTH");
  if (st)
    return st;
  if (!ferry_auth_bound_check(secret, FERRY_AUTH_INITIATOR, th, NULL, 0, body))
    return refuse(s, "wrong shared secret, or the handshake was altered on the way");
  size_t len = ferry_wire_facts_encode(body + FERRY_WIRE_PROOF_SIZE, facts);
  ferry_auth_bound_proof(secret, FERRY_AUTH_TARGET, th, body + FERRY_WIRE_PROOF_SIZE, len, body);
  ferry_frame_header ok = {.type = FERRY_FRAME_AUTH_REPLY, .body_len = FERRY_WIRE_PROOF_SIZE + len};
  st = ferry_sock_send_frame(s, &ok, body, "send AUTH_REPLY");
  if (!st)
    ferry_session_start(session, secret, FERRY_AUTH_TARGET, th);
  return st;
}

ferry_status ferry_auth_prove(ferry_sock *s, const char *secret,
                              const uint8_t th[FERRY_WIRE_PROOF_SIZE], const char *who,
                              ferry_hello_reply *facts, ferry_session *session) {
  uint8_t body[FERRY_WIRE_AUTH_REPLY_MAX];
  char step[64];
  snprintf(step, sizeof step, "authenticate with %s", who);
  ferry_auth_bound_proof(secret, FERRY_AUTH_INITIATOR, th, NULL, 0, body);
  ferry_frame_header h = {.type = FERRY_FRAME_AUTH, .body_len = FERRY_WIRE_PROOF_SIZE};
  ferry_status st = ferry_sock_send_frame(s, &h, body, "send AUTH");
  if (!st)
    st = ferry_sock_recv_header(s, &h, step);
  if (st)
    return st;
  if (h.type != FERRY_FRAME_AUTH_REPLY)
    return ferry_fail(FERRY_EHANDSHAKE, "%s %s: answered with frame type %u", step, s->peer,
                      h.type);
  if (h.status)
    return ferry_sock_read_refusal(s, &h, step);
  size_t len = (size_t)h.body_len - FERRY_WIRE_PROOF_SIZE; /* the codec checked the range */
  st = ferry_sock_recv(s, body, (size_t)h.body_len, step);
  if (st)
    return st;
  if (!ferry_auth_bound_check(secret, FERRY_AUTH_TARGET, th, body + FERRY_WIRE_PROOF_SIZE, len,
                              body))
    return ferry_fail(FERRY_EAUTH, "%s %s could not prove it knows the shared secret", who,
                      s->peer);
  if (facts && ferry_wire_facts_decode(body + FERRY_WIRE_PROOF_SIZE, len, facts) != FERRY_OK)
    return ferry_fail(FERRY_EHANDSHAKE, "%s %s: %s", step, s->peer, ferry_last_error());
  ferry_session_start(session, secret, FERRY_AUTH_INITIATOR, th);
  return FERRY_OK;
}
