/* handshake.c - the engine's handshake (wire.h: HELLO, HELLO_REPLY, and
 * with a shared secret AUTH, AUTH_REPLY and sealed frames afterwards)
 * between a store client and its master, built from net/'s proofs and
 * session keys. A master is no engine: its facts name no transport, and it
 * takes control connections only. Each side refuses the other's missing
 * secret, as engines do. */
#include "store/handshake.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "net/auth.h"

/* The HELLO and HELLO_REPLY bodies as sent: the transcript the proofs and
 * session keys are bound to. */
typedef struct transcript {
  uint8_t hello[FERRY_WIRE_HELLO_MAX];
  uint8_t reply[FERRY_WIRE_HELLO_REPLY_MAX];
  size_t hello_len, reply_len;
} transcript;

static void transcript_hash(const transcript *t, uint8_t th[FERRY_WIRE_PROOF_SIZE]) {
  ferry_auth_transcript(t->hello, t->hello_len, t->reply, t->reply_len, th);
}

/* A refusal: the reply frame with status and the reason as its body. */
static ferry_status refuse(ferry_sock *s, uint8_t type, ferry_status status, const char *why) {
  ferry_frame_header h = {.type = type, .status = status, .body_len = strlen(why)};
  ferry_sock_send_frame(s, &h, why, "send a store refusal");
  return ferry_fail(status, "refused store client %s: %s", s->peer, why);
}

/* ---- master side ---------------------------------------------------------------------------- */

static ferry_status receive_hello(ferry_sock *s, transcript *t, ferry_hello *hello) {
  ferry_frame_header h;
  ferry_status st = ferry_sock_recv_header(s, &h, "receive HELLO");
  if (st)
    return st;
  if (h.type != FERRY_FRAME_HELLO)
    return ferry_fail(FERRY_EPROTO, "store client %s began with frame type %u, not HELLO", s->peer,
                      h.type);
  t->hello_len = (size_t)h.body_len; /* the codec bounded it */
  st = ferry_sock_recv(s, t->hello, t->hello_len, "receive HELLO");
  return st ? st : ferry_wire_hello_decode(t->hello, t->hello_len, hello);
}

static ferry_status answer_hello(ferry_sock *s, transcript *t, const ferry_hello *hello,
                                 const store_identity *self, ferry_hello_reply *r) {
  char why[FERRY_WIRE_MAX_REASON];
  if (hello->version_max < FERRY_WIRE_VERSION_MIN || hello->version_min > FERRY_WIRE_VERSION_MAX) {
    snprintf(
        why, sizeof why, "incompatible protocol: client speaks versions %u..%u, this master %u..%u",
        hello->version_min, hello->version_max, FERRY_WIRE_VERSION_MIN, FERRY_WIRE_VERSION_MAX);
    return refuse(s, FERRY_FRAME_HELLO_REPLY, FERRY_EVERSION, why);
  }
  if (hello->conn_kind != FERRY_CONN_CONTROL)
    return refuse(s, FERRY_FRAME_HELLO_REPLY, FERRY_EHANDSHAKE,
                  "a store master takes control connections only");
  memset(r, 0, sizeof *r);
  r->version =
      hello->version_max < FERRY_WIRE_VERSION_MAX ? hello->version_max : FERRY_WIRE_VERSION_MAX;
  r->version_min = FERRY_WIRE_VERSION_MIN;
  r->version_max = FERRY_WIRE_VERSION_MAX;
  r->auth_required = self->secret != NULL;
  ferry_auth_nonce(r->nonce);
  r->engine_id = self->instance_id;
  ferry_read_boot_id(r->boot_id);
  r->pid = (uint32_t)getpid();
  ferry_frame_header h = {.type = FERRY_FRAME_HELLO_REPLY};
  h.body_len = t->reply_len = ferry_wire_hello_reply_encode(t->reply, r);
  return ferry_sock_send_frame(s, &h, t->reply, "send HELLO_REPLY");
}

static ferry_status check_client_proof(ferry_sock *s, const transcript *t, const char *secret,
                                       const ferry_hello_reply *r, ferry_session *session) {
  uint8_t th[FERRY_WIRE_PROOF_SIZE];
  transcript_hash(t, th);
  ferry_status st = ferry_auth_accept(s, secret, th, r, session);
  if (st == FERRY_EAUTH)
    return ferry_fail(st, "refused store client %s: %s", s->peer, ferry_last_error());
  if (!st)
    ferry_sock_auth(s, session);
  return st;
}

ferry_status store_handshake_accept(ferry_sock *s, ferry_session *session,
                                    const store_identity *self, char *client_name, size_t size) {
  transcript t;
  ferry_hello hello;
  ferry_hello_reply r;
  memset(session, 0, sizeof *session);
  ferry_status st = receive_hello(s, &t, &hello);
  if (!st)
    st = answer_hello(s, &t, &hello, self, &r);
  if (!st && self->secret)
    st = check_client_proof(s, &t, self->secret, &r, session);
  if (!st)
    snprintf(client_name, size, "%s", hello.name);
  return st;
}

/* ---- client side ---------------------------------------------------------------------------- */

static ferry_status send_hello(ferry_sock *s, transcript *t, const store_identity *self) {
  ferry_hello hello;
  memset(&hello, 0, sizeof hello);
  hello.version_min = FERRY_WIRE_VERSION_MIN;
  hello.version_max = FERRY_WIRE_VERSION_MAX;
  hello.conn_kind = FERRY_CONN_CONTROL;
  hello.engine_id = self->instance_id;
  ferry_auth_nonce(hello.nonce);
  snprintf(hello.name, sizeof hello.name, "%s", self->name);
  ferry_frame_header h = {.type = FERRY_FRAME_HELLO};
  h.body_len = t->hello_len = ferry_wire_hello_encode(t->hello, &hello);
  return ferry_sock_send_frame(s, &h, t->hello, "send HELLO");
}

static ferry_status receive_reply(ferry_sock *s, transcript *t, ferry_hello_reply *r) {
  ferry_frame_header h;
  ferry_status st = ferry_sock_recv_header(s, &h, "store handshake");
  if (st)
    return st;
  if (h.type != FERRY_FRAME_HELLO_REPLY)
    return ferry_fail(FERRY_EHANDSHAKE, "store master %s answered HELLO with frame type %u",
                      s->peer, h.type);
  if (h.status)
    return ferry_sock_read_refusal(s, &h, "store handshake");
  t->reply_len = (size_t)h.body_len;
  st = ferry_sock_recv(s, t->reply, t->reply_len, "store handshake");
  if (!st)
    st = ferry_wire_hello_reply_decode(t->reply, t->reply_len, r);
  if (st)
    return st;
  if (r->version < FERRY_WIRE_VERSION_MIN || r->version > FERRY_WIRE_VERSION_MAX)
    return ferry_fail(FERRY_EVERSION, "store master %s chose wire version %u (this client: %u..%u)",
                      s->peer, r->version, FERRY_WIRE_VERSION_MIN, FERRY_WIRE_VERSION_MAX);
  return FERRY_OK;
}

/* With a secret the master's facts (its instance id) come after its proof. */
static ferry_status prove_to_master(ferry_sock *s, const transcript *t, const char *secret,
                                    ferry_session *session, ferry_hello_reply *r) {
  uint8_t th[FERRY_WIRE_PROOF_SIZE];
  transcript_hash(t, th);
  ferry_status st = ferry_auth_prove(s, secret, th, "store master", r, session);
  if (!st)
    ferry_sock_auth(s, session);
  return st;
}

ferry_status store_handshake_connect(ferry_sock *s, ferry_session *session,
                                     const store_identity *self, uint64_t *master_id) {
  transcript t;
  ferry_hello_reply r;
  memset(session, 0, sizeof *session);
  ferry_status st = send_hello(s, &t, self);
  if (!st)
    st = receive_reply(s, &t, &r);
  if (st)
    return st;
  if (r.auth_required && !self->secret)
    return ferry_fail(FERRY_EAUTH,
                      "store master %s requires a shared secret and none is configured", s->peer);
  if (!r.auth_required && self->secret)
    return ferry_fail(FERRY_EAUTH,
                      "store master %s does not ask for the shared secret; refusing an "
                      "unauthenticated master",
                      s->peer);
  st = r.auth_required ? prove_to_master(s, &t, self->secret, session, &r) : FERRY_OK;
  if (!st)
    *master_id = r.engine_id;
  return st;
}
