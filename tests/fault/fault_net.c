/* fault_net.c - test hosts for the fault tests: namespaces, links, `ferry
 * serve` processes inside them, and the cleanup that must run however a test
 * ends (see fault.h).
 *
 * Everything this process creates is recorded in a small static registry
 * (namespace paths, child pids) that the teardown, an atexit handler and the
 * fatal-signal handlers all walk. Removing a namespace is what `ip netns del`
 * does (detach the bind mount, unlink it), done with plain syscalls so the
 * signal handler can do it too; links die with their namespaces. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "fault_emu.h"
#include "harness.h"

#define NETNS_DIR "/var/run/netns"
#define NS_PREFIX "ferryt-"
#define MAX_TRACKED 64

/* ---- time and helpers ------------------------------------------------------------ */

double fault_now(void) { return test_now_s(); }

void fault_sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
    ;
}

void fault_pattern(void *buf, size_t size, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
  uint8_t *p = buf;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint64_t v = x + i; /* position-dependent: a shifted copy never matches */
    memcpy(p + i, &v, 8);
  }
  for (; i < size; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = (uint8_t)(x + i);
  }
}

int fault_cmd(char *out, size_t out_size, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  char *argv[64];
  int argc = 0;
  for (char *tok = strtok(line, " "); tok && argc < 63; tok = strtok(NULL, " "))
    argv[argc++] = tok;
  argv[argc] = NULL;
  if (out && out_size)
    out[0] = 0;
  int fds[2];
  if (argc == 0 || pipe2(fds, O_CLOEXEC) < 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(fds[1]);
  size_t used = 0;
  char scratch[256];
  for (;;) {
    ssize_t n = out && used + 1 < out_size ? read(fds[0], out + used, out_size - 1 - used)
                                           : read(fds[0], scratch, sizeof scratch);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    if (out && used + 1 < out_size)
      used += (size_t)n;
  }
  if (out && out_size)
    out[used] = 0;
  close(fds[0]);
  int status;
  if (pid < 0 || waitpid(pid, &status, 0) != pid)
    return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ---- cleanup registry --------------------------------------------------------------- */

static char tracked_ns[MAX_TRACKED][160]; /* "" = free slot */
static volatile pid_t tracked_pid[MAX_TRACKED];
static char log_dir[64];
static int handlers_installed;
static char watchdog_what[160];

static void remove_ns_path(const char *path) {
  umount2(path, MNT_DETACH);
  unlink(path);
}

/* Async-signal-safe: kill, umount2, unlink only. */
static void emergency_cleanup(void) {
  for (int i = 0; i < MAX_TRACKED; i++) {
    pid_t pid = tracked_pid[i];
    if (pid > 0) {
      kill(pid, SIGCONT);
      kill(pid, SIGKILL);
    }
  }
  for (int i = 0; i < MAX_TRACKED; i++)
    if (tracked_ns[i][0])
      remove_ns_path(tracked_ns[i]);
}

static void remove_logs(void) {
  if (!log_dir[0] || getenv("FERRY_FAULT_KEEP_LOGS"))
    return;
  DIR *d = opendir(log_dir);
  if (d) {
    struct dirent *e;
    char path[400];
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.')
        continue;
      snprintf(path, sizeof path, "%s/%s", log_dir, e->d_name);
      unlink(path);
    }
    closedir(d);
  }
  rmdir(log_dir);
}

static void at_exit_cleanup(void) {
  emergency_cleanup();
  for (int i = 0; i < MAX_TRACKED; i++)
    if (tracked_pid[i] > 0)
      waitpid(tracked_pid[i], NULL, WNOHANG);
  remove_logs();
}

static void on_fatal_signal(int sig) {
  static const char msg[] = "fault harness: fatal signal, removing test namespaces\n";
  ssize_t unused = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)unused;
  emergency_cleanup();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void on_watchdog(int sig) {
  static const char msg[] = "fault harness: WATCHDOG expired (a call hung?) during: ";
  ssize_t unused = write(STDERR_FILENO, msg, sizeof msg - 1);
  unused = write(STDERR_FILENO, watchdog_what, strlen(watchdog_what));
  unused = write(STDERR_FILENO, "\n", 1);
  (void)unused;
  emergency_cleanup();
  _exit(3);
}

static void install_handlers(void) {
  if (handlers_installed)
    return;
  handlers_installed = 1;
  atexit(at_exit_cleanup);
  int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
    signal(sigs[i], on_fatal_signal);
  signal(SIGALRM, on_watchdog);
  signal(SIGPIPE, SIG_IGN);
  snprintf(log_dir, sizeof log_dir, "/tmp/ferryt-%d", (int)getpid());
  mkdir(log_dir, 0700);
}

void fault_watchdog(unsigned seconds, const char *what) {
  install_handlers();
  snprintf(watchdog_what, sizeof watchdog_what, "%s (limit %u s)", what ? what : "?", seconds);
  alarm(seconds);
}

static void track_ns(const char *path) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (!tracked_ns[i][0]) {
      snprintf(tracked_ns[i], sizeof tracked_ns[i], "%s", path);
      return;
    }
}

static void untrack_ns(const char *path) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (strcmp(tracked_ns[i], path) == 0)
      tracked_ns[i][0] = 0;
}

static void track_pid(pid_t pid) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (tracked_pid[i] <= 0) {
      tracked_pid[i] = pid;
      return;
    }
}

static void untrack_pid(pid_t pid) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (tracked_pid[i] == pid)
      tracked_pid[i] = 0;
}

/* Namespaces of earlier runs that were killed outright (SIGKILL from a test
 * timeout leaves no chance to clean up): their pid is gone. */
static void sweep_stale(void) {
  DIR *d = opendir(NETNS_DIR);
  if (!d)
    return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int pid;
    if (strncmp(e->d_name, NS_PREFIX, strlen(NS_PREFIX)) != 0 ||
        sscanf(e->d_name + strlen(NS_PREFIX), "%d-", &pid) != 1 || pid <= 0)
      continue;
    if (pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH)
      continue;
    char path[400];
    snprintf(path, sizeof path, NETNS_DIR "/%s", e->d_name);
    remove_ns_path(path);
  }
  closedir(d);
}

/* ---- namespaces ------------------------------------------------------------------------- */

typedef struct fault_link {
  int a, b;
  fault_link_kind kind;
  char dev[2][IFNAMSIZ];
  char addr[2][32];
  fault_emu *emu;
} fault_link;

struct fault_net {
  int nhosts;
  int isolated;
  int root_fd; /* the namespace the creating thread started in */
  char ns[FAULT_MAX_HOSTS][64];
  int nlinks;
  fault_link links[FAULT_MAX_LINKS];
};

static int net_seq;

int fault_netns_available(char *why, size_t why_size) {
  if (geteuid() != 0) {
    snprintf(why, why_size, "needs root for network namespaces (euid %d)", (int)geteuid());
    return 0;
  }
  char out[512];
  char name[64];
  snprintf(name, sizeof name, NS_PREFIX "%d-probe", (int)getpid());
  /* `ip -n` also needs a private mount namespace (it remounts / as a
   * slave): that fails where / is not a mount point, e.g. in a chroot. */
  int rc = fault_cmd(out, sizeof out, "ip netns add %s", name);
  char path[128];
  snprintf(path, sizeof path, NETNS_DIR "/%s", name);
  if (rc == 0 && fault_cmd(out, sizeof out, "ip -n %s link set lo up", name) != 0) {
    remove_ns_path(path);
    rc = 1;
  }
  if (rc != 0) {
    snprintf(why, why_size,
             "network namespaces unusable here: `ip netns add` / `ip -n` failed (%s): %s",
             rc < 0 ? "cannot run ip" : "exit status", out);
    return 0;
  }
  remove_ns_path(path);
  return 1;
}

static int ns_path(const fault_net *n, int host, char *path, size_t size) {
  return snprintf(path, size, NETNS_DIR "/%s", n->ns[host]) < (int)size ? 0 : -1;
}

static int open_ns(const fault_net *n, int host) {
  char path[128];
  ns_path(n, host, path, sizeof path);
  return open(path, O_RDONLY | O_CLOEXEC);
}

fault_net *fault_net_create(int nhosts, int isolated, char *why, size_t why_size) {
  install_handlers();
  if (nhosts < 1 || nhosts > FAULT_MAX_HOSTS) {
    snprintf(why, why_size, "bad host count %d", nhosts);
    return NULL;
  }
  fault_net *n = calloc(1, sizeof *n);
  n->nhosts = nhosts;
  n->isolated = isolated;
  n->root_fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (!isolated)
    return n;
  sweep_stale();
  int seq = __atomic_fetch_add(&net_seq, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < nhosts; i++) {
    snprintf(n->ns[i], sizeof n->ns[i], NS_PREFIX "%d-%d%c", (int)getpid(), seq, 'a' + i);
    char path[128], out[512];
    ns_path(n, i, path, sizeof path);
    track_ns(path);
    if (fault_cmd(out, sizeof out, "ip netns add %s", n->ns[i]) != 0 ||
        fault_cmd(out, sizeof out, "ip -n %s link set lo up", n->ns[i]) != 0) {
      snprintf(why, why_size, "creating namespace %s failed: %s", n->ns[i], out);
      fault_net_destroy(n);
      return NULL;
    }
  }
  return n;
}

fault_net *fault_net_open(int nhosts) {
  char why[512] = "";
  int isolated = fault_netns_available(why, sizeof why);
  if (!isolated)
    printf("note: running on 127.0.0.1 without namespaces: %s\n", why);
  fault_net *net = fault_net_create(nhosts, isolated, why, sizeof why);
  if (!net)
    fprintf(stderr, "cannot create test hosts: %s\n", why);
  return net;
}

int fault_net_open_isolated(int nhosts, fault_net **net, char *skip_why, size_t skip_size) {
  *net = NULL;
  if (!fault_netns_available(skip_why, skip_size))
    return 0;
  char why[512];
  *net = fault_net_create(nhosts, 1, why, sizeof why);
  if (!*net) {
    fprintf(stderr, "cannot create test hosts: %s\n", why);
    return -1;
  }
  return 0;
}

int fault_net_isolated(const fault_net *n) { return n->isolated; }

uint16_t fault_port(const fault_net *n, uint16_t port) { return n->isolated ? port : 0; }

const char *fault_host_ns(const fault_net *n, int host) {
  return host >= 0 && host < n->nhosts ? n->ns[host] : "";
}

int fault_net_enter(fault_net *n, int host) {
  if (!n->isolated)
    return 0;
  int fd = open_ns(n, host);
  if (fd < 0)
    return -1;
  int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  return rc;
}

int fault_net_leave(fault_net *n) {
  if (!n || !n->isolated || n->root_fd < 0)
    return 0;
  return setns(n->root_fd, CLONE_NEWNET);
}

void fault_net_destroy(fault_net *n) {
  if (!n)
    return;
  fault_net_leave(n);
  for (int i = 0; i < n->nlinks; i++)
    if (n->links[i].emu)
      fault_emu_stop(n->links[i].emu);
  for (int i = 0; i < n->nhosts; i++) {
    if (!n->ns[i][0])
      continue;
    char path[128];
    ns_path(n, i, path, sizeof path);
    remove_ns_path(path);
    untrack_ns(path);
  }
  if (n->root_fd >= 0)
    close(n->root_fd);
  free(n);
}

/* ---- links -------------------------------------------------------------------------------- */

static int config_side(fault_net *n, fault_link *l, int side, int host, char *out, size_t size) {
  if (fault_cmd(out, size, "ip -n %s addr add %s/24 dev %s", n->ns[host], l->addr[side],
                l->dev[side]) != 0)
    return -1;
  return fault_cmd(out, size, "ip -n %s link set %s up", n->ns[host], l->dev[side]) == 0 ? 0 : -1;
}

static int link_host(const fault_link *l, int side) { return side ? l->b : l->a; }

/* Routes for a host's addresses on its other links: a host reaches only its
 * neighbour's address on their shared link, so a reply to an engine bound to
 * another of the neighbour's addresses (a fabric endpoint is pinned to the
 * engine's address, not chosen by the kernel) would have no way back. For
 * every host the new link shares with an older one, each far end gets a
 * route to that host's address on the other link, over its own link. */
static int route_shared_hosts(fault_net *n, const fault_link *l, char *out, size_t size) {
  for (const fault_link *m = n->links; m < l; m++)
    for (int s = 0; s < 2; s++)
      for (int t = 0; t < 2; t++) {
        /* A second link between the same two hosts needs none: a route
         * would steer the first link's traffic onto it. */
        if (link_host(l, s) != link_host(m, t) || link_host(l, !s) == link_host(m, !t))
          continue;
        if (fault_cmd(out, size, "ip -n %s route add %s/32 dev %s", n->ns[link_host(l, !s)],
                      m->addr[t], l->dev[!s]) != 0 ||
            fault_cmd(out, size, "ip -n %s route add %s/32 dev %s", n->ns[link_host(m, !t)],
                      l->addr[s], m->dev[!t]) != 0)
          return -1;
      }
  return 0;
}

/* Moves the calling thread into a host's namespace for a moment; *home is
 * where end_visit takes it back. 0 on success. */
static int visit_host(const fault_net *n, int host, int *home) {
  *home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  int there = open_ns(n, host);
  int rc = *home >= 0 && there >= 0 ? setns(there, CLONE_NEWNET) : -1;
  if (there >= 0)
    close(there);
  if (rc != 0 && *home >= 0)
    close(*home);
  return rc;
}

static void end_visit(int home) {
  setns(home, CLONE_NEWNET);
  close(home);
}

/* Opens a TUN device named dev inside a host's namespace. */
static int open_tun(fault_net *n, int host, const char *dev) {
  int home;
  if (visit_host(n, host, &home) != 0)
    return -1;
  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", dev);
  if (fd >= 0 && ioctl(fd, TUNSETIFF, &ifr) < 0) {
    close(fd);
    fd = -1;
  }
  end_visit(home);
  return fd;
}

int fault_net_link(fault_net *n, int a, int b, fault_link_kind kind) {
  if (n->nlinks >= FAULT_MAX_LINKS || a < 0 || b < 0 || a >= n->nhosts || b >= n->nhosts)
    return -1;
  int id = n->nlinks;
  fault_link *l = &n->links[id];
  memset(l, 0, sizeof *l);
  l->a = a;
  l->b = b;
  l->kind = kind;
  if (!n->isolated) {
    snprintf(l->addr[0], sizeof l->addr[0], "127.0.0.1");
    snprintf(l->addr[1], sizeof l->addr[1], "127.0.0.1");
    n->nlinks++;
    return id;
  }
  snprintf(l->addr[0], sizeof l->addr[0], "10.202.%d.1", id + 1);
  snprintf(l->addr[1], sizeof l->addr[1], "10.202.%d.2", id + 1);
  /* Devices live only inside the namespaces, so short fixed names are fine. */
  snprintf(l->dev[0], sizeof l->dev[0], "%s%d", kind == FAULT_LINK_VETH ? "fv" : "ft", id);
  snprintf(l->dev[1], sizeof l->dev[1], "%s%dp", kind == FAULT_LINK_VETH ? "fv" : "ft", id);
  char out[512];
  if (kind == FAULT_LINK_VETH) {
    if (fault_cmd(out, sizeof out, "ip link add %s netns %s type veth peer name %s netns %s",
                  l->dev[0], n->ns[a], l->dev[1], n->ns[b]) != 0) {
      fprintf(stderr, "fault: veth %s: %s\n", l->dev[0], out);
      return -1;
    }
  } else {
    int fa = open_tun(n, a, l->dev[0]);
    int fb = fa >= 0 ? open_tun(n, b, l->dev[1]) : -1;
    if (fb < 0) {
      fprintf(stderr, "fault: cannot open TUN devices for link %d: %s\n", id, strerror(errno));
      if (fa >= 0)
        close(fa);
      return -1;
    }
    l->emu = fault_emu_start(fa, fb);
    if (!l->emu)
      return -1;
  }
  if (config_side(n, l, 0, a, out, sizeof out) != 0 ||
      config_side(n, l, 1, b, out, sizeof out) != 0 ||
      route_shared_hosts(n, l, out, sizeof out) != 0) {
    fprintf(stderr, "fault: configuring link %d: %s\n", id, out);
    return -1;
  }
  n->nlinks++;
  return id;
}

const char *fault_link_addr(const fault_net *n, int link, int side) {
  if (link < 0 || link >= n->nlinks || side < 0 || side > 1)
    return "0.0.0.0";
  return n->links[link].addr[side];
}

int fault_link_set_up(fault_net *n, int link, int up) {
  if (!n->isolated)
    return FAULT_UNSUPPORTED;
  if (link < 0 || link >= n->nlinks)
    return -1;
  fault_link *l = &n->links[link];
  char out[512];
  int hosts[2] = {l->a, l->b};
  for (int side = 0; side < 2; side++)
    if (fault_cmd(out, sizeof out, "ip -n %s link set %s %s", n->ns[hosts[side]], l->dev[side],
                  up ? "up" : "down") != 0) {
      fprintf(stderr, "fault: link %d %s: %s\n", link, up ? "up" : "down", out);
      return -1;
    }
  return 0;
}

/* The rx_bytes column of /proc/net/dev, read in the device's namespace: what
 * the host's kernel received on it, whether or not a process read it. */
int fault_link_rx_bytes(const fault_net *n, int link, int side, uint64_t *bytes) {
  if (!n->isolated)
    return FAULT_UNSUPPORTED;
  if (link < 0 || link >= n->nlinks || side < 0 || side > 1)
    return -1;
  const fault_link *l = &n->links[link];
  int home;
  if (visit_host(n, side ? l->b : l->a, &home) != 0)
    return -1;
  FILE *f = fopen("/proc/thread-self/net/dev", "r");
  int rc = -1;
  char line[512];
  while (f && rc != 0 && fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    char *name = line + strspn(line, " ");
    unsigned long long rx;
    if (colon && (size_t)(colon - name) == strlen(l->dev[side]) &&
        strncmp(name, l->dev[side], (size_t)(colon - name)) == 0 &&
        sscanf(colon + 1, "%llu", &rx) == 1) {
      *bytes = rx;
      rc = 0;
    }
  }
  if (f)
    fclose(f);
  end_visit(home);
  return rc;
}

int fault_link_impair(fault_net *n, int link, unsigned delay_ms, double loss_pct,
                      double reorder_pct) {
  if (!n->isolated)
    return FAULT_UNSUPPORTED;
  if (link < 0 || link >= n->nlinks)
    return -1;
  fault_link *l = &n->links[link];
  if (l->kind == FAULT_LINK_EMU) {
    fault_emu_set(l->emu, delay_ms, loss_pct, reorder_pct);
    return 0;
  }
  int hosts[2] = {l->a, l->b};
  for (int side = 0; side < 2; side++) {
    char out[512];
    fault_cmd(NULL, 0, "tc -n %s qdisc del dev %s root", n->ns[hosts[side]], l->dev[side]);
    if (!delay_ms && loss_pct <= 0 && reorder_pct <= 0)
      continue;
    char args[128];
    int len = snprintf(args, sizeof args, "delay %ums", delay_ms);
    if (loss_pct > 0)
      len += snprintf(args + len, sizeof args - (size_t)len, " loss %.2f%%", loss_pct);
    if (reorder_pct > 0)
      snprintf(args + len, sizeof args - (size_t)len, " reorder %.2f%%", reorder_pct);
    int rc = fault_cmd(out, sizeof out, "tc -n %s qdisc add dev %s root netem %s",
                       n->ns[hosts[side]], l->dev[side], args);
    if (rc != 0) {
      if (strstr(out, "qdisc kind is unknown") || strstr(out, "No such file") || rc == 127 ||
          rc < 0)
        return FAULT_UNSUPPORTED;
      fprintf(stderr, "fault: netem on link %d: %s\n", link, out);
      return -1;
    }
  }
  return 0;
}

void fault_link_counters(const fault_net *n, int link, uint64_t *forwarded, uint64_t *dropped) {
  *forwarded = *dropped = 0;
  if (link >= 0 && link < n->nlinks && n->links[link].emu)
    fault_emu_counters(n->links[link].emu, forwarded, dropped);
}

/* ---- ferry serve processes --------------------------------------------------------------------
 */

static int spawn_serve(fault_proc *p) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0)
    return -1;
  char port_s[16];
  snprintf(port_s, sizeof port_s, "%u", p->port);
  const char *argv[24] = {test_tool_path(), "serve", "--host", p->bind,
                          "--port",         port_s,  "--size", p->size_arg};
  int argc = 8;
  for (int i = 0; i < 7 && p->extra[i]; i++)
    argv[argc++] = p->extra[i];
  argv[argc] = NULL;
  int ns_fd = -1;
  if (p->net && p->net->isolated) {
    ns_fd = open_ns(p->net, p->host);
    if (ns_fd < 0) {
      close(fds[0]);
      close(fds[1]);
      return -1;
    }
  }
  int log_fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    /* Between fork and exec: async-signal-safe calls only. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(126);
    if (ns_fd >= 0 && setns(ns_fd, CLONE_NEWNET) < 0)
      _exit(125);
    if (p->fixed_layout)
      personality(ADDR_NO_RANDOMIZE);
    dup2(fds[1], STDOUT_FILENO);
    if (log_fd >= 0)
      dup2(log_fd, STDERR_FILENO);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  if (ns_fd >= 0)
    close(ns_fd);
  if (log_fd >= 0)
    close(log_fd);
  if (pid < 0) {
    close(fds[0]);
    return -1;
  }
  p->pid = pid;
  track_pid(pid);
  char line[512];
  int rc = test_read_line(fds[0], line, sizeof line, TEST_SETUP_MS);
  close(fds[0]);
  unsigned long long addr, size;
  if (rc == 0 &&
      sscanf(line, "ready target=%79s addr=%llx size=%llu", p->target, &addr, &size) == 3) {
    p->addr = addr;
    p->size = size;
    return 0;
  }
  fprintf(stderr, "fault: ferry serve on %s:%u did not get ready (see %s)\n", p->bind, p->port,
          p->log);
  fault_proc_kill(p);
  return -1;
}

int fault_serve_start(fault_proc *p, const fault_net *net, int host, const char *bind,
                      uint16_t port, const char *size, const char *const *extra, int fixed_layout) {
  install_handlers();
  fault_transports(); /* before the first fork: the serve processes inherit it */
  memset(p, 0, sizeof *p);
  p->net = net;
  p->host = host;
  p->fixed_layout = fixed_layout;
  snprintf(p->bind, sizeof p->bind, "%s", bind);
  snprintf(p->size_arg, sizeof p->size_arg, "%s", size);
  for (int i = 0; extra && i < 7 && extra[i]; i++)
    p->extra[i] = extra[i];
  static int serial;
  snprintf(p->log, sizeof p->log, "%s/serve-%d.log", log_dir,
           __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED));
  p->port = port;
  if (spawn_serve(p) != 0)
    return -1;
  /* A restart must come back where peers look for it. */
  const char *colon = strrchr(p->target, ':');
  p->port = colon ? (uint16_t)atoi(colon + 1) : port;
  return 0;
}

int fault_serve_restart(fault_proc *p) {
  if (p->pid > 0)
    fault_proc_kill(p);
  /* The port may still be held for a moment by the dying process. */
  for (int attempt = 0; attempt < 50; attempt++) {
    if (spawn_serve(p) == 0)
      return 0;
    fault_sleep_ms(20);
  }
  return -1;
}

void fault_proc_kill(fault_proc *p) {
  if (p->pid <= 0)
    return;
  test_kill_and_reap(p->pid, 10000);
  untrack_pid(p->pid);
  p->pid = 0;
  p->stopped = 0;
}

int fault_proc_term(fault_proc *p) {
  if (p->pid <= 0)
    return -1;
  kill(p->pid, SIGCONT);
  kill(p->pid, SIGTERM);
  int status = -1;
  if (test_wait_exit(p->pid, TEST_SETUP_MS, &status) != 0) {
    kill(p->pid, SIGKILL);
    test_wait_exit(p->pid, 10000, &status);
    status = -1;
  }
  untrack_pid(p->pid);
  p->pid = 0;
  p->stopped = 0;
  return status;
}

int fault_proc_pause(fault_proc *p) {
  if (p->pid <= 0)
    return -1;
  if (p->stopped) /* a second SIGSTOP would report no new stop to wait for */
    return 0;
  kill(p->pid, SIGSTOP);
  int status;
  pid_t r;
  while ((r = waitpid(p->pid, &status, WUNTRACED)) < 0 && errno == EINTR)
    ;
  if (r == p->pid && WIFSTOPPED(status)) {
    p->stopped = 1;
    return 0;
  }
  fprintf(stderr, "fault: %s (pid %d) did not stop: %s\n", p->target, (int)p->pid,
          r == p->pid ? "it exited" : strerror(errno));
  if (r == p->pid) { /* reaped here: nothing left to kill */
    untrack_pid(p->pid);
    p->pid = 0;
  }
  return -1;
}

void fault_proc_resume(fault_proc *p) {
  if (p->pid > 0)
    kill(p->pid, SIGCONT); /* takes effect when sent: no wait needed */
  p->stopped = 0;
}

int fault_proc_log_has(const fault_proc *p, const char *needle) {
  FILE *f = fopen(p->log, "r");
  if (!f)
    return 0;
  char line[2048];
  int found = 0;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

long fault_rss_kib(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
  FILE *f = fopen(path, "r");
  long pages = 0, rss = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
      rss = 0;
    fclose(f);
  }
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* ---- engines ------------------------------------------------------------------------------------
 */

unsigned fault_transports(void) {
  static unsigned transports;
  if (transports)
    return transports;
  const char *forced = getenv("FERRY_TEST_TRANSPORTS");
  const char *names = forced && *forced ? forced : "tcp";
  transports = ferry_transport_parse(names);
  if (!transports) {
    fprintf(stderr, "fault: FERRY_TEST_TRANSPORTS=%s names no transport\n", names);
    exit(1);
  }
  setenv("FERRY_TRANSPORTS", names, 1);
  return transports;
}

ferry_engine *fault_engine(const char *bind, uint32_t timeout_ms, uint32_t connect_timeout_ms,
                           int checksum) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = bind;
  cfg.advertise_host = bind;
  cfg.transports = fault_transports();
  if (timeout_ms)
    cfg.timeout_ms = timeout_ms;
  if (connect_timeout_ms)
    cfg.connect_timeout_ms = connect_timeout_ms;
  cfg.checksum = checksum;
  ferry_engine *e = NULL;
  if (ferry_engine_create(&cfg, &e) != FERRY_OK) {
    fprintf(stderr, "fault: engine on %s: %s\n", bind, ferry_last_error());
    return NULL;
  }
  return e;
}

void *fault_buffer(ferry_engine *e, size_t size) {
  void *buf = NULL;
  if (posix_memalign(&buf, 4096, size ? size : 1) != 0)
    return NULL;
  memset(buf, 0, size);
  if (ferry_memory_register(e, buf, size) != FERRY_OK) {
    free(buf);
    return NULL;
  }
  return buf;
}

void fault_buffer_free(ferry_engine *e, void *buf) {
  if (!buf)
    return;
  ferry_memory_unregister(e, buf);
  free(buf);
}

ferry_status fault_roundtrip(ferry_engine *e, const char *target, uint8_t *local, uint64_t remote,
                             size_t len, uint64_t seed) {
  fault_pattern(local, len, seed);
  memset(local + len, 0xee, len);
  uint32_t sent = ferry_crc32c(0, local, len);
  ferry_status st = ferry_transfer_sync(e, target, FERRY_OP_WRITE, local, remote, len);
  if (st == FERRY_OK)
    st = ferry_transfer_sync(e, target, FERRY_OP_READ, local + len, remote, len);
  if (st == FERRY_OK && ferry_crc32c(0, local + len, len) != sent) {
    fprintf(stderr, "fault: %zu bytes at %s 0x%llx read back differently\n", len, target,
            (unsigned long long)remote);
    return FERRY_ECHECKSUM;
  }
  unsigned used = 0;
  if (st == FERRY_OK && (ferry_peer_transport(e, target, &used) || !(used & fault_transports()))) {
    fprintf(stderr, "fault: bytes to %s moved over %s, not the transports under test\n", target,
            used ? ferry_transport_name(used) : "an unknown transport");
    return FERRY_ETRANSPORT;
  }
  return st;
}
