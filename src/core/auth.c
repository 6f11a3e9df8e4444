/* auth.c - randomness and the shared-secret proof of the handshake.
 *
 * Both sides send a fresh nonce; the initiator answers the target's with
 * HMAC-SHA256(secret, label | client nonce | target nonce), and the target
 * answers with its own proof, so neither talks to an impostor. The secret
 * never crosses the wire and a recorded proof is useless against new nonces. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

/* Each side proves the secret with its own label, so a proof can never be
 * reflected back as the other side's. */
static const char initiator_label[] = "ferry-auth-v1-initiator";
static const char target_label[] = "ferry-auth-v1-target";

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

static void hmac_proof(const char *label, const char *secret,
                       const uint8_t client_nonce[FERRY_WIRE_NONCE_SIZE],
                       const uint8_t server_nonce[FERRY_WIRE_NONCE_SIZE],
                       uint8_t proof[FERRY_WIRE_PROOF_SIZE]) {
  uint8_t msg[sizeof initiator_label + 2 * FERRY_WIRE_NONCE_SIZE];
  size_t label_len = strlen(label);
  memcpy(msg, label, label_len);
  memcpy(msg + label_len, client_nonce, FERRY_WIRE_NONCE_SIZE);
  memcpy(msg + label_len + FERRY_WIRE_NONCE_SIZE, server_nonce, FERRY_WIRE_NONCE_SIZE);
  unsigned int len = FERRY_WIRE_PROOF_SIZE;
  HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, label_len + 2 * FERRY_WIRE_NONCE_SIZE, proof,
       &len);
}

void ferry_auth_proof(const char *secret, ferry_auth_role role,
                      const uint8_t client_nonce[FERRY_WIRE_NONCE_SIZE],
                      const uint8_t server_nonce[FERRY_WIRE_NONCE_SIZE],
                      uint8_t proof[FERRY_WIRE_PROOF_SIZE]) {
  hmac_proof(role == FERRY_AUTH_TARGET ? target_label : initiator_label, secret, client_nonce,
             server_nonce, proof);
}

int ferry_auth_check(const char *secret, ferry_auth_role role,
                     const uint8_t client_nonce[FERRY_WIRE_NONCE_SIZE],
                     const uint8_t server_nonce[FERRY_WIRE_NONCE_SIZE],
                     const uint8_t proof[FERRY_WIRE_PROOF_SIZE]) {
  uint8_t expected[FERRY_WIRE_PROOF_SIZE];
  ferry_auth_proof(secret, role, client_nonce, server_nonce, expected);
  return CRYPTO_memcmp(expected, proof, FERRY_WIRE_PROOF_SIZE) == 0;
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
