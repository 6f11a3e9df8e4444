/* stores.c - starting and stopping real redis-server and etcd processes for
 * the metadata tests (see stores.h). Readiness is asked of the store itself
 * through ferry's own backend, so a started store is one ferry can use. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "metadata/metadata.h"
#include "stores.h"

#define MAX_CHILDREN 32

static pid_t children[MAX_CHILDREN];

static void kill_children(void) {
  for (int i = 0; i < MAX_CHILDREN; i++)
    if (children[i] > 0)
      test_kill_and_reap(children[i], 5000);
}

static void remember(pid_t pid) {
  static int hooked;
  if (!hooked && (hooked = 1))
    atexit(kill_children);
  for (int i = 0; i < MAX_CHILDREN; i++)
    if (children[i] <= 0) {
      children[i] = pid;
      return;
    }
}

static void forget(pid_t pid) {
  for (int i = 0; i < MAX_CHILDREN; i++)
    if (children[i] == pid)
      children[i] = 0;
}

int test_store_available(int etcd) {
  return access(etcd ? "/usr/bin/etcd" : "/usr/bin/redis-server", X_OK) == 0;
}

uint16_t test_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

/* argv run with output to dir/log; the child dies with the test. */
static pid_t spawn(const char *dir, char *const argv[]) {
  char log[256];
  snprintf(log, sizeof log, "%s/log", dir);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    /* Between fork and exec: async-signal-safe calls only. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(1);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    execv(argv[0], argv);
    _exit(127);
  }
  if (fd >= 0)
    close(fd);
  if (pid > 0)
    remember(pid);
  return pid;
}

/* Member i's own endpoint URL (etcd), or the store's URL (redis). */
static void member_url(const test_store *s, int i, char *out, size_t size) {
  if (s->etcd)
    snprintf(out, size, "etcd://127.0.0.1:%u", s->port[i]);
  else
    snprintf(out, size, "%s", s->url);
}

/* Waits until member i answers a GET (a missing key is an answer). */
static int wait_ready(const test_store *s, int i) {
  char url[512];
  member_url(s, i, url, sizeof url);
  double deadline = test_now_s() + TEST_SETUP_MS / 1000.0;
  while (test_now_s() < deadline) {
    ferry_metadata *md = NULL;
    if (ferry_metadata_open(url, &md) == FERRY_OK) {
      char *v = NULL;
      ferry_status st = ferry_metadata_get(md, "ferry-test/ready", &v);
      free(v);
      ferry_metadata_close(md);
      if (st == FERRY_OK || st == FERRY_ENOTFOUND)
        return 0;
    }
    usleep(50000); /* polling a process we do not control: no event to wait on */
  }
  fprintf(stderr, "store %s did not become ready (see %s/log)\n", url, s->dir);
  return -1;
}

static pid_t start_redis(test_store *s) {
  char port[16];
  snprintf(port, sizeof port, "%u", s->port[0]);
  char *argv[16];
  int n = 0;
  argv[n++] = "/usr/bin/redis-server";
  argv[n++] = "--port";
  argv[n++] = port;
  argv[n++] = "--bind";
  argv[n++] = "127.0.0.1";
  argv[n++] = "--dir";
  argv[n++] = s->dir;
  argv[n++] = "--save";
  argv[n++] = "";
  argv[n++] = "--appendonly";
  argv[n++] = "no";
  if (s->password[0]) {
    argv[n++] = "--requirepass";
    argv[n++] = s->password;
  }
  argv[n] = NULL;
  return spawn(s->dir, argv);
}

static pid_t start_etcd_member(test_store *s, int i) {
  char name[16], data[256], client[64], peer[64], cluster[512] = "";
  snprintf(name, sizeof name, "m%d", i);
  snprintf(data, sizeof data, "%s/m%d", s->dir, i);
  snprintf(client, sizeof client, "http://127.0.0.1:%u", s->port[i]);
  snprintf(peer, sizeof peer, "http://127.0.0.1:%u", s->peer_port[i]);
  for (int k = 0; k < s->members; k++) {
    size_t len = strlen(cluster);
    snprintf(cluster + len, sizeof cluster - len, "%sm%d=http://127.0.0.1:%u", k ? "," : "", k,
             s->peer_port[k]);
  }
  char *argv[] = {"/usr/bin/etcd",
                  "--name",
                  name,
                  "--data-dir",
                  data,
                  "--listen-client-urls",
                  client,
                  "--advertise-client-urls",
                  client,
                  "--listen-peer-urls",
                  peer,
                  "--initial-advertise-peer-urls",
                  peer,
                  "--initial-cluster",
                  cluster,
                  "--initial-cluster-token",
                  s->dir,
                  "--log-level",
                  "error",
                  NULL};
  return spawn(s->dir, argv);
}

static int make_dir(test_store *s) {
  snprintf(s->dir, sizeof s->dir, "%s/ferry-store-XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  return mkdtemp(s->dir) ? 0 : -1;
}

int test_redis_start(test_store *s, const char *password) {
  memset(s, 0, sizeof *s);
  s->members = 1;
  if (password)
    snprintf(s->password, sizeof s->password, "%s", password);
  s->port[0] = test_free_port();
  if (make_dir(s) != 0)
    return -1;
  snprintf(s->url, sizeof s->url, "redis://%s%s%s127.0.0.1:%u", password ? ":" : "",
           password ? password : "", password ? "@" : "", s->port[0]);
  s->pid[0] = start_redis(s);
  return s->pid[0] > 0 ? wait_ready(s, 0) : -1;
}

int test_etcd_start(test_store *s, int members) {
  memset(s, 0, sizeof *s);
  s->etcd = 1;
  s->members = members;
  if (make_dir(s) != 0)
    return -1;
  size_t len = 0;
  for (int i = 0; i < members; i++) {
    s->port[i] = test_free_port();
    s->peer_port[i] = test_free_port();
    len += snprintf(s->url + len, sizeof s->url - len, "%s127.0.0.1:%u", i ? "," : "etcd://",
                    s->port[i]);
  }
  for (int i = 0; i < members; i++)
    if ((s->pid[i] = start_etcd_member(s, i)) <= 0)
      return -1;
  for (int i = 0; i < members; i++)
    if (wait_ready(s, i) != 0)
      return -1;
  return 0;
}

int test_store_wait(const test_store *s) {
  for (int i = 0; i < s->members; i++)
    if (s->pid[i] > 0 && wait_ready(s, i) != 0)
      return -1;
  return 0;
}

void test_store_kill(test_store *s, int i) {
  if (s->pid[i] > 0) {
    test_kill_and_reap(s->pid[i], 5000);
    forget(s->pid[i]);
  }
  s->pid[i] = 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  return remove(path);
}

static void wipe(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

int test_store_restart(test_store *s, int i, int wipe_data) {
  test_store_kill(s, i);
  if (wipe_data && s->etcd) {
    char data[256];
    snprintf(data, sizeof data, "%s/m%d", s->dir, i);
    wipe(data);
  }
  s->pid[i] = s->etcd ? start_etcd_member(s, i) : start_redis(s);
  return s->pid[i] > 0 ? wait_ready(s, i) : -1;
}

void test_store_stop(test_store *s) {
  for (int i = 0; i < s->members; i++)
    test_store_kill(s, i);
  if (s->dir[0])
    wipe(s->dir);
  s->dir[0] = '\0';
}
