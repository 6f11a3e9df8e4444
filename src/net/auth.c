/* auth.c - randomness, the shared-secret proofs and the per-frame tags.
 *
 * TCP handshake (wire version 2). The proofs cover the transcript: a hash of
 * the HELLO and HELLO_REPLY bodies as sent (both nonces, versions, engine
 * ids, conn kind, names). The initiator answers with HMAC-SHA256(secret,
 * label | transcript); the target answers with its own label over the
 * transcript and the facts it reveals only now (ids, boot id, shm path). A
 * relay that forwards the handshake unchanged gets nothing it can use:
 * every later frame carries a tag under keys derived from the secret and
 * the transcript, one per direction, over an implicit frame counter, so a
 * frame it forges, replays, reorders or reflects is refused.
 *
 * Tags are AES-256-GCM with no plaintext (GMAC): the fastest authenticator
 * OpenSSL offers on CPUs with AES-NI and carry-less multiply (BENCHMARKS.md).
 * The nonce is (frame counter, part): unique, since keys are per connection
 * and direction.
 *
 * The shm service still uses the older proof over two nonces: its socket is
 * local and checked with SO_PEERCRED, so there is no relay to bind against. */
#include "auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Each side proves the secret with its own label, so a proof can never be
 * reflected back as the other side's. */
static const char initiator_label[] = "ferry-auth-v1-initiator";
static const char target_label[] = "ferry-auth-v1-target";
static const char transcript_label[] = "ferry-transcript-v2";
static const char initiator_label_v2[] = "ferry-auth-v2-initiator";
static const char target_label_v2[] = "ferry-auth-v2-target";
static const char session_label[] = "ferry-session-v2";

static void fill_random(void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = getrandom((char *)buf + got, len - got, 0);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  if (got < len) { /* getrandom cannot fail on Linux >= 3.17; keep a fallback anyway */
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    for (; got < len; got++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      ((uint8_t *)buf)[got] = (uint8_t)(seed >> 56);
    }
  }
}

void ferry_auth_nonce(uint8_t nonce[FERRY_WIRE_NONCE_SIZE]) {
  fill_random(nonce, FERRY_WIRE_NONCE_SIZE);
}

uint64_t ferry_random_u64(void) {
  uint64_t v;
  fill_random(&v, sizeof v);
  return v;
}

/* HMAC-SHA256(key, a | b | c); b and c may be empty. */
static void hmac3(const void *key, size_t key_len, const void *a, size_t a_len, const void *b,
                  size_t b_len, const void *c, size_t c_len, uint8_t out[FERRY_WIRE_PROOF_SIZE]) {
  uint8_t msg[64 + FERRY_WIRE_PROOF_SIZE + FERRY_WIRE_FACTS_MAX];
  memcpy(msg, a, a_len);
  if (b_len)
    memcpy(msg + a_len, b, b_len);
  if (c_len)
    memcpy(msg + a_len + b_len, c, c_len);
  unsigned int len = FERRY_WIRE_PROOF_SIZE;
  HMAC(EVP_sha256(), key, (int)key_len, msg, a_len + b_len + c_len, out, &len);
}

void ferry_auth_proof(const char *secret, ferry_auth_role role,
                      const uint8_t client_nonce[FERRY_WIRE_NONCE_SIZE],
                      const uint8_t server_nonce[FERRY_WIRE_NONCE_SIZE],
                      uint8_t proof[FERRY_WIRE_PROOF_SIZE]) {
  const char *label = role == FERRY_AUTH_TARGET ? target_label : initiator_label;
  hmac3(secret, strlen(secret), label, strlen(label), client_nonce, FERRY_WIRE_NONCE_SIZE,
        server_nonce, FERRY_WIRE_NONCE_SIZE, proof);
}

int ferry_auth_check(const char *secret, ferry_auth_role role,
                     const uint8_t client_nonce[FERRY_WIRE_NONCE_SIZE],
                     const uint8_t server_nonce[FERRY_WIRE_NONCE_SIZE],
                     const uint8_t proof[FERRY_WIRE_PROOF_SIZE]) {
  uint8_t expected[FERRY_WIRE_PROOF_SIZE];
  ferry_auth_proof(secret, role, client_nonce, server_nonce, expected);
  return CRYPTO_memcmp(expected, proof, FERRY_WIRE_PROOF_SIZE) == 0;
}

/* ---- handshake v2: transcript, proofs, session keys --------------------- */

void ferry_auth_transcript(const uint8_t *hello, size_t hello_len, const uint8_t *reply,
                           size_t reply_len, uint8_t th[FERRY_WIRE_PROOF_SIZE]) {
  /* Lengths first, so no split of the same bytes hashes alike. */
  uint8_t lens[16];
  for (int i = 0; i < 8; i++) {
    lens[i] = (uint8_t)((uint64_t)hello_len >> (8 * i));
    lens[8 + i] = (uint8_t)((uint64_t)reply_len >> (8 * i));
  }
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  unsigned int len = FERRY_WIRE_PROOF_SIZE;
  if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL) ||
      !EVP_DigestUpdate(md, transcript_label, sizeof transcript_label - 1) ||
      !EVP_DigestUpdate(md, lens, sizeof lens) || !EVP_DigestUpdate(md, hello, hello_len) ||
      !EVP_DigestUpdate(md, reply, reply_len) || !EVP_DigestFinal_ex(md, th, &len))
    fill_random(th, FERRY_WIRE_PROOF_SIZE); /* out of memory: a hash no peer will match */
  EVP_MD_CTX_free(md);
}

void ferry_auth_bound_proof(const char *secret, ferry_auth_role role,
                            const uint8_t th[FERRY_WIRE_PROOF_SIZE], const uint8_t *facts,
                            size_t facts_len, uint8_t proof[FERRY_WIRE_PROOF_SIZE]) {
  const char *label = role == FERRY_AUTH_TARGET ? target_label_v2 : initiator_label_v2;
  hmac3(secret, strlen(secret), label, strlen(label), th, FERRY_WIRE_PROOF_SIZE, facts, facts_len,
        proof);
}

int ferry_auth_bound_check(const char *secret, ferry_auth_role role,
                           const uint8_t th[FERRY_WIRE_PROOF_SIZE], const uint8_t *facts,
                           size_t facts_len, const uint8_t proof[FERRY_WIRE_PROOF_SIZE]) {
  uint8_t expected[FERRY_WIRE_PROOF_SIZE];
  ferry_auth_bound_proof(secret, role, th, facts, facts_len, expected);
  return CRYPTO_memcmp(expected, proof, FERRY_WIRE_PROOF_SIZE) == 0;
}

/* An HKDF-style extract and expand: the secret keyed by the transcript, then
 * one key per direction, so a frame cannot be reflected back to its sender. */
void ferry_session_start(ferry_session *s, const char *secret, ferry_auth_role self,
                         const uint8_t th[FERRY_WIRE_PROOF_SIZE]) {
  uint8_t prk[FERRY_WIRE_PROOF_SIZE], to_target[FERRY_SESSION_KEY_SIZE],
      to_initiator[FERRY_SESSION_KEY_SIZE];
  hmac3(secret, strlen(secret), session_label, sizeof session_label - 1, th, FERRY_WIRE_PROOF_SIZE,
        NULL, 0, prk);
  hmac3(prk, sizeof prk, "to target", 9, NULL, 0, NULL, 0, to_target);
  hmac3(prk, sizeof prk, "to initiator", 12, NULL, 0, NULL, 0, to_initiator);
  memset(s, 0, sizeof *s);
  int initiator = self == FERRY_AUTH_INITIATOR;
  memcpy(s->send_key, initiator ? to_target : to_initiator, FERRY_SESSION_KEY_SIZE);
  memcpy(s->recv_key, initiator ? to_initiator : to_target, FERRY_SESSION_KEY_SIZE);
  s->on = 1;
  OPENSSL_cleanse(prk, sizeof prk);
}

/* ---- frame tags ----------------------------------------------------------- */

/* Cipher contexts per thread, each keeping its key schedule: a tag under
 * a key the thread used recently only sets the nonce (re-keying costs about
 * as much as tagging 4 KiB). A tag is computed within one call, so no
 * context is shared between threads or outlives its use. A thread drives
 * one connection at a time: its two keys, with room to spare. */
#define TAG_CACHE 4

typedef struct tag_cache {
  EVP_CIPHER_CTX *ctx[TAG_CACHE];
  uint8_t key[TAG_CACHE][FERRY_SESSION_KEY_SIZE];
  unsigned next; /* the slot a new key replaces */
} tag_cache;

static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void cache_free(void *arg) {
  tag_cache *c = arg;
  for (int i = 0; i < TAG_CACHE; i++)
    EVP_CIPHER_CTX_free(c->ctx[i]);
  OPENSSL_cleanse(c, sizeof *c);
  free(c);
}

static void cache_key_init(void) { pthread_key_create(&cache_key, cache_free); }

/* A context ready to tag under key with nonce; NULL when out of memory. */
static EVP_CIPHER_CTX *keyed_ctx(const uint8_t key[FERRY_SESSION_KEY_SIZE], const uint8_t *nonce) {
  pthread_once(&cache_once, cache_key_init);
  tag_cache *c = pthread_getspecific(cache_key);
  if (!c && (c = calloc(1, sizeof *c)) != NULL)
    pthread_setspecific(cache_key, c);
  if (!c)
    return NULL;
  for (int i = 0; i < TAG_CACHE; i++)
    if (c->ctx[i] && CRYPTO_memcmp(c->key[i], key, FERRY_SESSION_KEY_SIZE) == 0)
      return EVP_EncryptInit_ex(c->ctx[i], NULL, NULL, NULL, nonce) ? c->ctx[i] : NULL;
  unsigned i = c->next++ % TAG_CACHE;
  if (!c->ctx[i] && (c->ctx[i] = EVP_CIPHER_CTX_new()) == NULL)
    return NULL;
  memset(c->key[i], 0, FERRY_SESSION_KEY_SIZE); /* unusable until keyed */
  if (!EVP_EncryptInit_ex(c->ctx[i], EVP_aes_256_gcm(), NULL, key, nonce))
    return NULL;
  memcpy(c->key[i], key, FERRY_SESSION_KEY_SIZE);
  return c->ctx[i];
}

static void tag_nonce(uint64_t seq, uint8_t part, uint8_t nonce[12]) {
  memset(nonce, 0, 12);
  nonce[0] = part;
  for (int i = 0; i < 8; i++)
    nonce[4 + i] = (uint8_t)(seq >> (8 * i));
}

static int tag_add(EVP_CIPHER_CTX *ctx, const void *buf, size_t len) {
  int out;
  return len == 0 || EVP_EncryptUpdate(ctx, NULL, &out, buf, (int)len);
}

static int tag_final(EVP_CIPHER_CTX *ctx, uint8_t tag[FERRY_SESSION_TAG_SIZE]) {
  int len;
  return EVP_EncryptFinal_ex(ctx, NULL, &len) &&
         EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, FERRY_SESSION_TAG_SIZE, tag);
}

int ferry_session_tag(const uint8_t key[FERRY_SESSION_KEY_SIZE], uint64_t seq, uint8_t part,
                      const struct iovec *iov, int iovcnt, uint8_t tag[FERRY_SESSION_TAG_SIZE]) {
  uint8_t nonce[12];
  tag_nonce(seq, part, nonce);
  EVP_CIPHER_CTX *ctx = keyed_ctx(key, nonce);
  int ok = ctx != NULL;
  for (int i = 0; ok && i < iovcnt; i++)
    ok = tag_add(ctx, iov[i].iov_base, iov[i].iov_len);
  return ok && tag_final(ctx, tag);
}

/* A tag over bytes that come a piece at a time: a context of its own, so
 * that other frames tagged meanwhile on this thread do not disturb it. */
struct ferry_tag_stream {
  EVP_CIPHER_CTX *ctx;
};

ferry_tag_stream *ferry_tag_stream_open(const uint8_t key[FERRY_SESSION_KEY_SIZE], uint64_t seq,
                                        uint8_t part) {
  uint8_t nonce[12];
  tag_nonce(seq, part, nonce);
  ferry_tag_stream *t = malloc(sizeof *t);
  if (t && (t->ctx = EVP_CIPHER_CTX_new()) != NULL &&
      EVP_EncryptInit_ex(t->ctx, EVP_aes_256_gcm(), NULL, key, nonce))
    return t;
  if (t)
    EVP_CIPHER_CTX_free(t->ctx);
  free(t);
  return NULL;
}

int ferry_tag_stream_add(ferry_tag_stream *t, const void *buf, size_t len) {
  return tag_add(t->ctx, buf, len);
}

int ferry_tag_stream_close(ferry_tag_stream *t, uint8_t tag[FERRY_SESSION_TAG_SIZE]) {
  if (!t)
    return 0;
  int ok = tag && tag_final(t->ctx, tag);
  EVP_CIPHER_CTX_free(t->ctx);
  free(t);
  return ok;
}

int ferry_session_tag_equal(const uint8_t *a, const uint8_t *b) {
  return CRYPTO_memcmp(a, b, FERRY_SESSION_TAG_SIZE) == 0;
}

/* Two engines with the same boot id run on the same booted kernel, which is
 * what sharing memory between them needs. */
void ferry_read_boot_id(uint8_t boot_id[FERRY_WIRE_BOOT_ID_SIZE]) {
  memset(boot_id, 0, FERRY_WIRE_BOOT_ID_SIZE);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f)
    return;
  int c, nibble = 0;
  while ((c = fgetc(f)) != EOF && nibble < 2 * FERRY_WIRE_BOOT_ID_SIZE) {
    int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (v < 0)
      continue;
    boot_id[nibble / 2] |= (uint8_t)(nibble % 2 ? v : v << 4);
    nibble++;
  }
  fclose(f);
}
