/* doctor.c - `ferry doctor [--target HOST:PORT] [--metadata URL]`: tells an
 * operator, before anything is deployed, what ferry can do on this host:
 * which transports are built and actually move bytes here, which address an
 * engine would advertise, what the environment overrides, whether a given
 * peer answers, and whether a metadata store is reachable, accepts the
 * credentials and round-trips a key. Every line says OK, WARN or FAIL and
 * why. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "cli.h"
#include "commands.h"
#include "core/config.h"
#include "ferry.h"
#include "metadata/metadata.h"
#include "transport/fabric.h"

#define PROG "ferry doctor"
#define SELFTEST_BYTES (4u << 20)

static int failures;

static void line(const char *verdict, const char *what, const char *detail) {
  printf("%-5s %-28s %s\n", verdict, what, detail);
  if (strcmp(verdict, "FAIL") == 0)
    failures++;
}

/* Every variable ferry reads that is set: its value, or FAIL with what is
 * wrong with it (an engine would refuse to start). */
static void show_environment(void) {
  for (size_t i = 0; ferry_env_name(i); i++) {
    const char *name = ferry_env_name(i), *v = getenv(name);
    if (!v)
      continue;
    if (ferry_env_check(name) != FERRY_OK)
      line("FAIL", name, ferry_last_error());
    else
      line("INFO", name, strcmp(name, "FERRY_SECRET") == 0 ? "(set)" : v);
  }
}

static void show_default_engine(void) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.port = 0;
  ferry_engine *e;
  ferry_status st = ferry_engine_create(&cfg, &e);
  char detail[600];
  if (st) {
    snprintf(detail, sizeof detail, "%s: %s", ferry_strerror(st), ferry_last_error());
    line("FAIL", "default engine", detail);
    return;
  }
  snprintf(detail, sizeof detail, "peers would be told %s (override: MC_TCP_BIND_ADDRESS)",
           ferry_engine_name(e));
  line("OK", "advertised address", detail);
  ferry_engine_destroy(e);
}

static int dir_has_entries(const char *path) {
  DIR *d = opendir(path);
  int found = 0;
  struct dirent *ent;
  while (d && (ent = readdir(d)) != NULL)
    if (ent->d_name[0] != '.')
      found = 1;
  if (d)
    closedir(d);
  return found;
}

static void show_rdma(void) {
  if (dir_has_entries("/sys/class/infiniband"))
    line("OK", "RDMA devices", "present under /sys/class/infiniband");
  else
    line("INFO", "RDMA devices", "none: \"rdma\" requests fall back to tcp/shm");
}

/* Each libfabric provider ferry drives: whether it offers RMA here, on
 * which domains. One that is missing is no failure: ferry falls back. */
static void show_fabric(void) {
  for (size_t i = 0; ferry_fabric_providers[i]; i++) {
    char what[64], detail[512];
    snprintf(what, sizeof what, "fabric %s", ferry_fabric_providers[i]);
    int ok = ferry_fabric_probe(ferry_fabric_providers[i], detail, sizeof detail);
    line(ok ? "OK" : "INFO", what, detail);
  }
}

/* The configured fabric_device entries that name no device of the
 * configured provider (or, chosen automatically, of verbs or efa): an
 * engine would refuse to start on them, or fall back without RDMA. */
static void show_fabric_devices(void) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  if (!cfg.fabric_device)
    return;
  char missing[512], have[512], detail[1200];
  int n = ferry_fabric_missing_devices(cfg.fabric_provider, cfg.fabric_device, missing,
                                       sizeof missing, have, sizeof have);
  const char *prov = cfg.fabric_provider ? cfg.fabric_provider : "verbs;ofi_rxm or efa";
  if (n)
    snprintf(detail, sizeof detail, "%s not found for %s; its devices: %s", missing, prov,
             *have ? have : "none");
  else
    snprintf(detail, sizeof detail, "%s: each found for %s", cfg.fabric_device, prov);
  line(n ? "FAIL" : "OK", "fabric devices", detail);
}

/* Two engines in this process, forced to one transport: write, read back,
 * compare. Proves the transport moves bytes here, not just that it exists. */
static ferry_status selftest(unsigned transport, char *detail, size_t size) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.transports = transport;
  ferry_engine *a = NULL, *b = NULL;
  void *src = NULL, *dst = NULL, *back = NULL;
  ferry_status st = ferry_engine_create(&cfg, &a);
  if (!st)
    st = ferry_engine_create(&cfg, &b);
  if (!st)
    st = ferry_memory_alloc(a, SELFTEST_BYTES, &src);
  if (!st)
    st = ferry_memory_alloc(a, SELFTEST_BYTES, &back);
  if (!st)
    st = ferry_memory_alloc(b, SELFTEST_BYTES, &dst);
  if (!st) {
    memset(src, 0x5a, SELFTEST_BYTES);
    st = ferry_transfer_sync(a, ferry_engine_name(b), FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst,
                             SELFTEST_BYTES);
  }
  if (!st)
    st = ferry_transfer_sync(a, ferry_engine_name(b), FERRY_OP_READ, back, (uint64_t)(uintptr_t)dst,
                             SELFTEST_BYTES);
  unsigned used = 0;
  if (!st)
    st = ferry_peer_transport(a, ferry_engine_name(b), &used);
  if (st)
    snprintf(detail, size, "%s: %s", ferry_strerror(st), ferry_last_error());
  else if (memcmp(src, back, SELFTEST_BYTES) != 0)
    snprintf(detail, size, "data read back differs from data written"), st = FERRY_EREMOTE;
  else
    snprintf(detail, size, "4 MiB written and read back over %s, verified",
             ferry_transport_name(used));
  ferry_engine_destroy(a);
  ferry_engine_destroy(b);
  return st;
}

static void show_transports(void) {
  static const unsigned all[] = {FERRY_TRANSPORT_TCP, FERRY_TRANSPORT_SHM, FERRY_TRANSPORT_FABRIC};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
    char what[64], detail[700];
    snprintf(what, sizeof what, "transport %s", ferry_transport_name(all[i]));
    ferry_status st = selftest(all[i], detail, sizeof detail);
    if (st == FERRY_ETRANSPORT && strstr(detail, "built in"))
      line("INFO", what, "not built into this library");
    else if (st == FERRY_ETRANSPORT && strstr(detail, "fabric transport unavailable"))
      line("INFO", what, /* automatic choice found no RDMA device: engines fall back */
           "would not be used: no RDMA device (fi_getinfo finds no verbs or efa); engines use "
           "tcp/shm. FERRY_FABRIC_PROVIDER=\"tcp;ofi_rxm\" or shm runs it without one");
    else
      line(st ? "FAIL" : "OK", what, detail);
  }
}

/* "answers; data would go over tcp (rails A, B)". */
static void data_path(ferry_engine *e, const char *target, unsigned used, char *out, size_t size) {
  char rails[512];
  ferry_cli_rails(e, target, rails, sizeof rails);
  snprintf(out, size, "answers; data would go over %s%s%s%s", ferry_transport_name(used),
           *rails ? " (rails " : "", rails, *rails ? ")" : "");
}

static void show_target(const char *target) {
  ferry_cli_engine_opts opts;
  ferry_cli_engine_opts_init(&opts);
  opts.host = NULL; /* the default address: the one peers would really see */
  ferry_engine *e;
  char detail[700];
  if (ferry_cli_engine_create(PROG, &opts, &e))
    return;
  ferry_status st = ferry_probe(e, target);
  unsigned used = 0;
  if (!st)
    st = ferry_peer_transport(e, target, &used);
  if (st)
    snprintf(detail, sizeof detail, "%s: %s", ferry_strerror(st), ferry_last_error());
  else
    data_path(e, target, used, detail, sizeof detail);
  line(st ? "FAIL" : "OK", target, detail);
  ferry_engine_destroy(e);
}

/* put, get (compared), delete and a get that must miss, on a key of our
 * own; the detail names the first step that failed. */
static ferry_status metadata_round_trip(ferry_metadata *md, char *detail, size_t size) {
  char key[64], value[64], *got = NULL;
  snprintf(key, sizeof key, "ferry-doctor/%d", (int)getpid());
  snprintf(value, sizeof value, "{\"doctor\": %d}", (int)getpid());
  const char *step = "put", *why = NULL;
  ferry_status st = ferry_metadata_put(md, key, value);
  if (!st) {
    step = "get";
    st = ferry_metadata_get(md, key, &got);
  }
  if (!st && strcmp(got, value) != 0)
    why = "get returned another value than put";
  free(got);
  got = NULL;
  if (!st && !why) {
    step = "delete";
    st = ferry_metadata_delete(md, key);
  }
  if (!st && !why && ferry_metadata_get(md, key, &got) != FERRY_ENOTFOUND)
    why = "the key is still there after delete";
  free(got);
  if (why) {
    snprintf(detail, size, "%s", why);
    return FERRY_EMETADATA;
  }
  if (st)
    snprintf(detail, size, "%s failed: %s: %s", step, ferry_strerror(st), ferry_last_error());
  return st;
}

static void show_metadata(const char *url) {
  char what[300], detail[800] = "";
  ferry_metadata_redact(url, what, sizeof what);
  ferry_metadata *md = NULL;
  uint64_t t0 = ferry_now_ns();
  ferry_status st = ferry_metadata_open(url, &md);
  if (st) {
    snprintf(detail, sizeof detail, "%s%s: %s",
             st == FERRY_EAUTH ? "credentials refused: " : "cannot open: ", ferry_strerror(st),
             ferry_last_error());
    line("FAIL", what, detail);
    return;
  }
  st = metadata_round_trip(md, detail, sizeof detail);
  if (!st)
    snprintf(detail, sizeof detail, "reachable; put/get/delete round trip in %.1f ms",
             (double)(ferry_now_ns() - t0) / 1e6);
  line(st ? "FAIL" : "OK", what, detail);
  ferry_metadata_close(md);
}

/* --help (bad = 0) to stdout and exit 0, else to stderr and exit 2. */
static int doctor_usage(int bad) {
  fprintf(bad ? stderr : stdout,
          "usage: %s [--target HOST:PORT] [--metadata URL]\n"
          "Checks what ferry can do on this host; every line says OK, INFO, WARN or FAIL.\n"
          "  --target HOST:PORT  also check that this peer answers, and over which transport\n"
          "  --metadata URL      also check a metadata store: reachability, credentials\n"
          "                      and a put/get/delete round trip\n"
          "  --help              show this help\n"
          "Checked: the environment variables ferry reads (a bad value is a FAIL), the\n"
          "address an engine would advertise, RDMA devices, each fabric_device entry\n"
          "(FERRY_FABRIC_DEVICE) that names no device, and each transport by\n"
          "writing and reading back 4 MiB. Exits 0 when nothing FAILed, 1 otherwise, 2 on\n"
          "a usage error.\n",
          PROG);
  return bad ? 2 : 0;
}

int ferry_cmd_doctor(int argc, char **argv) {
  const char *target = NULL, *metadata = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--target") == 0 && i + 1 < argc)
      target = argv[++i];
    else if (strcmp(argv[i], "--metadata") == 0 && i + 1 < argc)
      metadata = argv[++i];
    else
      return doctor_usage(strcmp(argv[i], "--help") && strcmp(argv[i], "-h"));
  }
  ferry_log_set_level(FERRY_LOG_ERROR); /* the report is the output */
  printf("ferry %s doctor\n", ferry_version());
  show_environment();
  show_default_engine();
  show_rdma();
  show_fabric();
  show_fabric_devices();
  show_transports();
  if (target)
    show_target(target);
  if (metadata)
    show_metadata(metadata);
  printf("%s\n", failures ? "some checks FAILED" : "all checks passed");
  return failures ? 1 : 0;
}
