/* test_config.c - no silent configuration: every environment variable and
 * config field ferry_engine_create checks is refused, when bad, with
 * FERRY_EINVAL and a message naming the setting, the value and what is
 * accepted; booleans take every spelling; a caller compiled against an
 * older (shorter) ferry_config keeps working. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "core/config.h"
#include "ferry.h"

static int clear_env(void **state) {
  for (size_t i = 0; ferry_env_name(i); i++)
    unsetenv(ferry_env_name(i));
  return 0;
}

/* ferry_config_adopt on a default config, as ferry_engine_create does. */
static ferry_status adopt_defaults(ferry_config *out) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  return ferry_config_adopt(out, &cfg);
}

static void assert_refused(ferry_status st, const char *const *words) {
  assert_int_equal(st, FERRY_EINVAL);
  for (; *words; words++)
    if (!strstr(ferry_last_error(), *words))
      fail_msg("\"%s\" not in \"%s\"", *words, ferry_last_error());
}

static void bad_environment_is_refused(void **state) {
  static const struct {
    const char *name, *value, *accepted;
  } cases[] = {
      {"FERRY_TRANSPORTS", "tpc", "tcp, shm, fabric or all"},
      {"FERRY_TRANSPORTS", "tcp,,shm", "tcp, shm"}, /* an empty name */
      {"FERRY_LOG", "verbose", "debug, info, warn, error or off"},
      {"MC_TRANSFER_TIMEOUT", "abc", "whole seconds"},
      {"MC_TRANSFER_TIMEOUT", "-5", "whole seconds"},
      {"MC_TRANSFER_TIMEOUT", "0", "1 to 4294967"},
      {"MC_TRANSFER_TIMEOUT", "4294968", "1 to 4294967"},
      {"FERRY_SPIN_US", "abc", "0 to 10000"},
      {"FERRY_SPIN_US", "10001", "0 to 10000"},
      {"FERRY_SPIN_US", " 5", "0 to 10000"},
      {"MC_FORCE_TCP", "maybe", FERRY_BOOL_SPELLINGS},
      {"FERRY_CHECKSUM", "2", FERRY_BOOL_SPELLINGS},
      {"MC_TCP_BIND_ADDRESS", "10.0.0.1 10.0.0.2", "host name or IP address"},
      {"FERRY_POOL_GRANT_TIMEOUT_MS", "999", "1000 to 86400000"},
      {"FERRY_POOL_SENDER_SLOTS", "0", "1 to 1048576"},
      {"FERRY_POOL_SENDER_BYTES", "half", "a whole number"},
      {"FERRY_FILE_QUEUE_DEPTH", "257", "1 to 256"},
      {"FERRY_FILE_QUEUE_DEPTH", "0", "1 to 256"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    setenv(cases[i].name, cases[i].value, 1);
    ferry_config cfg;
    const char *words[] = {cases[i].name, cases[i].value, cases[i].accepted, NULL};
    assert_refused(adopt_defaults(&cfg), words);
    assert_refused(ferry_env_check(cases[i].name), words);
    unsetenv(cases[i].name);
  }
}

/* ferry_engine_create itself refuses it (the hook is in place), whatever
 * the config passed holds. */
static void engine_create_refuses_bad_environment(void **state) {
  setenv("FERRY_TRANSPORTS", "tpc", 1);
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.transports = FERRY_TRANSPORT_TCP;
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  ferry_engine *e = NULL;
  const char *words[] = {"FERRY_TRANSPORTS", "tpc", "tcp, shm, fabric or all", NULL};
  assert_refused(ferry_engine_create(&cfg, &e), words);
  assert_null(e);
  assert_refused(ferry_engine_create(NULL, &e), words);
  unsetenv("FERRY_TRANSPORTS");
  assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_OK);
  ferry_engine_destroy(e);
}

static void good_environment_is_applied(void **state) {
  setenv("MC_TRANSFER_TIMEOUT", "7", 1);
  setenv("FERRY_SPIN_US", "10000", 1);
  setenv("FERRY_TRANSPORTS", "tcp,shm", 1);
  setenv("FERRY_LOG", "WARN", 1);
  setenv("FERRY_CHECKSUM", "", 1); /* empty: unset */
  ferry_config cfg;
  assert_int_equal(adopt_defaults(&cfg), FERRY_OK);
  assert_int_equal(cfg.timeout_ms, 7000);
  assert_int_equal(cfg.spin_us, 10000);
  assert_int_equal(cfg.transports, FERRY_TRANSPORT_TCP | FERRY_TRANSPORT_SHM);
  assert_int_equal(cfg.checksum, 0);
  clear_env(state);
}

/* Each limit lands in its own field, at its own width. */
static void limits_from_environment_reach_their_fields(void **state) {
  setenv("FERRY_MAX_CONNECTIONS", "5", 1);
  setenv("FERRY_MAX_CONNECTIONS_PER_PEER", "7", 1);
  setenv("FERRY_IDLE_TIMEOUT_MS", "1234", 1);
  setenv("FERRY_NOTIFY_PEER_BYTES", "99999999999", 1);
  setenv("FERRY_METADATA_TTL_MS", "7000", 1);
  setenv("FERRY_SERVER_THREADS", "3", 1);
  setenv("FERRY_POOL_SENDER_BYTES", "99999999999", 1);
  setenv("FERRY_POOL_SENDER_SLOTS", "9", 1);
  setenv("FERRY_POOL_GRANT_TIMEOUT_MS", "1500", 1);
  setenv("FERRY_FILE_QUEUE_DEPTH", "64", 1);
  ferry_config cfg;
  assert_int_equal(adopt_defaults(&cfg), FERRY_OK);
  assert_int_equal(cfg.file_queue_depth, 64);
  assert_true(cfg.pool_sender_bytes == 99999999999ull);
  assert_int_equal(cfg.pool_sender_slots, 9);
  assert_int_equal(cfg.pool_grant_timeout_ms, 1500);
  assert_int_equal(cfg.server_threads, 3);
  assert_int_equal(cfg.max_connections, 5);
  assert_int_equal(cfg.max_connections_per_peer, 7);
  assert_int_equal(cfg.idle_timeout_ms, 1234);
  assert_true(cfg.notify_peer_bytes == 99999999999ull);
  assert_int_equal(cfg.metadata_ttl_ms, 7000);
  setenv("FERRY_IDLE_TIMEOUT_MS", "0", 1);
  assert_int_equal(adopt_defaults(&cfg), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "FERRY_IDLE_TIMEOUT_MS"));
  clear_env(state);
  /* Unset: one server worker per CPU, at least 2; past 1024 a typo. */
  assert_int_equal(adopt_defaults(&cfg), FERRY_OK);
  assert_true(cfg.server_threads >= 2);
  setenv("FERRY_SERVER_THREADS", "1025", 1);
  assert_int_equal(adopt_defaults(&cfg), FERRY_EINVAL);
  assert_non_null(strstr(ferry_last_error(), "FERRY_SERVER_THREADS"));
  clear_env(state);
}

static void booleans_take_every_spelling(void **state) {
  static const char *const yes[] = {"1", "true", "TRUE", "yes", "Yes", "on", "ON"};
  static const char *const no[] = {"0", "false", "False", "no", "NO", "off", "Off"};
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
    setenv("MC_FORCE_TCP", yes[i], 1);
    setenv("FERRY_CHECKSUM", yes[i], 1);
    ferry_config cfg;
    assert_int_equal(adopt_defaults(&cfg), FERRY_OK);
    assert_int_equal(cfg.transports, FERRY_TRANSPORT_TCP);
    assert_int_equal(cfg.checksum, 1);
    setenv("MC_FORCE_TCP", no[i], 1);
    setenv("FERRY_CHECKSUM", no[i], 1);
    assert_int_equal(adopt_defaults(&cfg), FERRY_OK);
    assert_int_equal(cfg.transports, 0);
    assert_int_equal(cfg.checksum, 0);
  }
  clear_env(state);
}

static void bad_fields_are_refused(void **state) {
  static const struct {
    const char *field, *value, *accepted;
    size_t offset, width;
    unsigned long long bad;
  } cases[] = {
#define FIELD(f, v, acc) #f, #v, acc, offsetof(ferry_config, f), sizeof(((ferry_config *)0)->f), v
      {FIELD(tcp_connections, 0, "1 to 1024")},
      {FIELD(tcp_connections, 1025, "1 to 1024")},
      {FIELD(workers, 0, "1 to 1024")},
      {FIELD(slice_size, 100, "4096 to 67108864")},
      {FIELD(slice_size, 67108865, "4096 to 67108864")},
      {FIELD(spin_us, 10001, "0 to 10000")},
      {FIELD(transports, 256, "FERRY_TRANSPORT_")},
      {FIELD(pool_sender_slots, 1048577, "1 to 1048576")},
      {FIELD(pool_grant_timeout_ms, 999, "1000 to 86400000")},
      {FIELD(pool_grant_timeout_ms, 86400001, "1000 to 86400000")},
#undef FIELD
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ferry_config cfg, out;
    ferry_config_init(&cfg);
    if (cases[i].width == sizeof(unsigned)) {
      unsigned v = (unsigned)cases[i].bad;
      memcpy((char *)&cfg + cases[i].offset, &v, sizeof v);
    } else {
      size_t v = (size_t)cases[i].bad;
      memcpy((char *)&cfg + cases[i].offset, &v, sizeof v);
    }
    const char *words[] = {cases[i].field, cases[i].value, cases[i].accepted, NULL};
    assert_refused(ferry_config_adopt(&out, &cfg), words);
  }
  ferry_config cfg, out;
  ferry_config_init(&cfg);
  cfg.log_level = (ferry_log_level)9;
  cfg.log_level_set = 1;
  const char *level_words[] = {"log_level", "9", NULL};
  assert_refused(ferry_config_adopt(&out, &cfg), level_words);
  ferry_config_init(&cfg);
  cfg.bind_host = "";
  const char *host_words[] = {"bind_host", "host name", NULL};
  assert_refused(ferry_config_adopt(&out, &cfg), host_words);
}

/* Documented: zero timeouts, slice size and pool bounds mean the default. */
static void zero_means_default(void **state) {
  ferry_config cfg, out;
  ferry_config_init(&cfg);
  cfg.timeout_ms = cfg.connect_timeout_ms = 0;
  cfg.slice_size = 0;
  assert_int_equal(ferry_config_adopt(&out, &cfg), FERRY_OK);
  assert_int_equal(out.timeout_ms, 30000);
  assert_int_equal(out.connect_timeout_ms, 5000);
  assert_int_equal(out.slice_size, 512u << 10);
  cfg.pool_sender_slots = cfg.pool_grant_timeout_ms = 0;
  cfg.pool_sender_bytes = 0;
  assert_int_equal(ferry_config_adopt(&out, &cfg), FERRY_OK);
  assert_int_equal(out.pool_sender_slots, 1024);
  assert_int_equal(out.pool_grant_timeout_ms, 30000);
  assert_int_equal(out.pool_sender_bytes, 0); /* half of each pool, per pool */
}

static void size_is_checked(void **state) {
  ferry_config cfg, out;
  memset(&cfg, 0, sizeof cfg); /* filled by hand, without ferry_config_init */
  const char *words[] = {"ferry_config.size = 0", "ferry_config_init", NULL};
  assert_refused(ferry_config_adopt(&out, &cfg), words);
  ferry_config_init(&cfg);
  cfg.size = sizeof cfg + 8; /* a newer header than this library */
  const char *newer[] = {"newer", NULL};
  assert_refused(ferry_config_adopt(&out, &cfg), newer);
}

/* A caller compiled against the first ferry.h with a size field has a
 * struct ending at spin_us: ferry_config_init writes no byte past it, and
 * the library gives the fields it lacks their defaults. */
static void older_shorter_config_works(void **state) {
  const size_t old_size = offsetof(ferry_config, spin_us) + sizeof(unsigned);
  _Alignas(ferry_config) unsigned char buf[sizeof(ferry_config) + 16];
  memset(buf, 0xEE, sizeof buf);
  ferry_config *old = (ferry_config *)(void *)buf;
  /* Shorter still than any real caller, so the bound is tested even while
   * old_size is the whole struct. */
  const size_t shorter = offsetof(ferry_config, spin_us);
  ferry_config_init_size(old, shorter);
  for (size_t i = shorter; i < sizeof buf; i++)
    assert_int_equal(buf[i], 0xEE);
  assert_int_equal(old->size, shorter);
  ferry_config_init_size(old, old_size);
  for (size_t i = old_size; i < sizeof buf; i++)
    assert_int_equal(buf[i], 0xEE);
  assert_int_equal(old->size, old_size);
  ferry_config out;
  assert_int_equal(ferry_config_adopt(&out, old), FERRY_OK);
  assert_int_equal(out.size, sizeof out);
  assert_int_equal(out.tcp_connections, 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(bad_environment_is_refused, clear_env),
      cmocka_unit_test_setup(engine_create_refuses_bad_environment, clear_env),
      cmocka_unit_test_setup(good_environment_is_applied, clear_env),
      cmocka_unit_test_setup(limits_from_environment_reach_their_fields, clear_env),
      cmocka_unit_test_setup(booleans_take_every_spelling, clear_env),
      cmocka_unit_test_setup(bad_fields_are_refused, clear_env),
      cmocka_unit_test_setup(zero_means_default, clear_env),
      cmocka_unit_test_setup(size_is_checked, clear_env),
      cmocka_unit_test_setup(older_shorter_config_works, clear_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
