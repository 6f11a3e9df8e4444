/* doctor.c - `ferry doctor [--target HOST:PORT] [--metadata URL]`: tells an
 * operator, before anything is deployed, what ferry can do on this host:
 * which transports are built and actually move bytes here, which address an
 * engine would advertise, what the environment overrides, whether a given
 * peer answers, whether a metadata store is reachable, accepts the
 * credentials and round-trips a key, and which mooncake.engine Python would
 * import. Every line says OK, WARN or FAIL and why. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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
#define PYTHON_WAIT_MS 30000 /* an import that takes longer is reported, not waited for */

extern char **environ;

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
  char why[512];
  if (!ferry_fabric_library_load(why, sizeof why)) {
    line("INFO", "fabric", why);
    return;
  }
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
    else if (st == FERRY_ETRANSPORT && strstr(detail, "cannot be loaded on this host"))
      line("INFO", what, "would not be used: libfabric cannot be loaded (see \"fabric\" above)");
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
  if (ferry_cli_sniff(target, detail, sizeof detail) == 0) {
    line("FAIL", target, detail);
    return;
  }
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

/* Asks Python where it finds mooncake.engine, without importing it (the
 * package's __init__ runs): "compiled PATH", "ferry PATH", "other PATH",
 * "none" or "error TEXT". A compiled engine*.so left by Mooncake's wheel
 * next to ferry's engine.py wins: extension modules are looked up first. */
static const char mooncake_finder[] =
    "import importlib.machinery as m, importlib.util as u\n"
    "try:\n"
    "    s = u.find_spec('mooncake.engine')\n"
    "except ModuleNotFoundError:\n"
    "    s = None\n"
    "except Exception as e:\n"
    "    print('error', type(e).__name__ + ':', e); raise SystemExit\n"
    "if s is None or not s.origin:\n"
    "    print('none')\n"
    "elif s.origin.endswith(tuple(m.EXTENSION_SUFFIXES)):\n"
    "    print('compiled', s.origin)\n"
    "else:\n"
    "    text = open(s.origin, errors='replace').read(4096)\n"
    "    print('ferry' if 'implemented on ferry' in text else 'other', s.origin)\n";

/* Runs python -c mooncake_finder; its first line of output in out ("" if
 * none). Returns 0, or -1 when python could not be started. */
static int run_python_finder(const char *python, char *out, size_t size) {
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  char *argv[] = {(char *)python, "-c", (char *)mooncake_finder, NULL};
  pid_t pid;
  int err = posix_spawnp(&pid, python, &actions, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  size_t used = 0;
  struct pollfd p = {fds[0], POLLIN, 0};
  while (!err && used + 1 < size && poll(&p, 1, PYTHON_WAIT_MS) == 1) {
    ssize_t n = read(fds[0], out + used, size - 1 - used);
    if (n <= 0)
      break;
    used += (size_t)n;
  }
  out[used] = '\0';
  out[strcspn(out, "\n")] = '\0';
  close(fds[0]);
  if (err)
    return -1;
  kill(pid, SIGKILL); /* done or too slow: the answer is in out either way */
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
  return 0;
}

/* Which mooncake.engine the Python that runs SGLang or vLLM would import:
 * $FERRY_PYTHON (`python -m ferry` sets it to itself), else python3. */
static void show_mooncake_engine(void) {
  const char *python = getenv("FERRY_PYTHON");
  if (!python || !*python)
    python = "python3";
  char answer[1200], detail[1400];
  if (run_python_finder(python, answer, sizeof answer) != 0 || !*answer) {
    snprintf(detail, sizeof detail,
             "cannot ask %s (not found, or it printed nothing); "
             "FERRY_PYTHON names the Python to check",
             python);
    line("INFO", "mooncake.engine", detail);
  } else if (strncmp(answer, "compiled ", 9) == 0) {
    snprintf(detail, sizeof detail,
             "%s would import Mooncake's compiled %s, not ferry's drop-in: remove it (pip "
             "uninstall mooncake-transfer-engine, or delete the file), then reinstall ferry",
             python, answer + 9);
    line("FAIL", "mooncake.engine", detail);
  } else if (strncmp(answer, "ferry ", 6) == 0) {
    snprintf(detail, sizeof detail, "%s imports ferry's drop-in %s", python, answer + 6);
    line("OK", "mooncake.engine", detail);
  } else if (strncmp(answer, "other ", 6) == 0) {
    snprintf(detail, sizeof detail, "%s imports %s, which is not ferry's drop-in", python,
             answer + 6);
    line("WARN", "mooncake.engine", detail);
  } else if (strcmp(answer, "none") == 0) {
    snprintf(detail, sizeof detail, "%s finds none (ferry's Python package provides it)", python);
    line("INFO", "mooncake.engine", detail);
  } else {
    snprintf(detail, sizeof detail, "%s cannot look for it: %s", python,
             strncmp(answer, "error ", 6) == 0 ? answer + 6 : answer);
    line("WARN", "mooncake.engine", detail);
  }
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
          "writing and reading back 4 MiB, and which mooncake.engine Python would import\n"
          "($FERRY_PYTHON, else python3: Mooncake's compiled engine left installed is a\n"
          "FAIL). Exits 0 when nothing FAILed, 1 otherwise, 2 on a usage error.\n",
          PROG);
  return bad ? 2 : 0;
}

/* What was wrong with arg, then the usage: exit 2. */
static int doctor_bad_argument(const char *arg) {
  if (strcmp(arg, "--target") == 0 || strcmp(arg, "--metadata") == 0)
    fprintf(stderr, "%s: %s needs a value\n", PROG, arg);
  else if (arg[0] == '-')
    fprintf(stderr, "%s: unknown option '%s'\n", PROG, arg);
  else
    fprintf(stderr, "%s: unexpected argument '%s': a peer is checked with --target %s\n", PROG, arg,
            arg);
  return doctor_usage(1);
}

int ferry_cmd_doctor(int argc, char **argv) {
  const char *target = NULL, *metadata = NULL;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--target") == 0 && i + 1 < argc)
      target = argv[++i];
    else if (strcmp(arg, "--metadata") == 0 && i + 1 < argc)
      metadata = argv[++i];
    else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)
      return doctor_usage(0);
    else
      return doctor_bad_argument(arg);
  }
  ferry_log_set_level(FERRY_LOG_ERROR); /* the report is the output */
  printf("ferry %s doctor\n", ferry_version());
  show_environment();
  show_default_engine();
  show_rdma();
  show_fabric();
  show_fabric_devices();
  show_transports();
  show_mooncake_engine();
  if (target)
    show_target(target);
  if (metadata)
    show_metadata(metadata);
  printf("%s\n", failures ? "some checks FAILED" : "all checks passed");
  return failures ? 1 : 0;
}
