/* fabric_service.c - the engine-wide half of the libfabric transport: which
 * provider, a fabric and domain per device (one without fabric_device),
 * the target's RDM endpoints that peers write into and read from, their
 * progress threads, and the memory registrations (fi_mr_reg per region and
 * domain, in a sorted table) whose keys the region table carries to
 * initiators.
 *
 * Progress is manual for every provider seen (libfabric.md): RMA aimed at
 * a target that never calls into libfabric stalls. So a thread reads the
 * target's CQ, sleeping on its wait fd where the provider has one (tcp,
 * net, verbs). Where it has none (shm, efa) it polls, yielding while remote
 * RMA events (a counter) show traffic and sleeping longer and longer once
 * they stop, so an idle engine costs ~0 CPU; the first operation after an
 * idle spell waits up to FABRIC_SLEEP_MAX_US for it.
 *
 * Lanes: on the software providers (tcp;ofi_rxm, net, shm) the target's
 * progress call does the copying (the kernel's recv into the registered
 * memory, on tcp), so one progress thread bounds a target to one CPU. A
 * target opens fabric_lanes endpoints in its one domain (registrations
 * belong to the domain: every key works on each), each with its own CQ,
 * counter and progress thread; the descriptor lists the lanes' addresses
 * after the main one, and initiators aim their channels at the lanes in
 * turn. A provider whose registrations bind to one endpoint
 * (FI_MR_ENDPOINT) serves on one lane, and so does one without a wait fd
 * unless fabric_lanes says otherwise (lane_count).
 *
 * Rails (fabric.c's top comment): one more endpoint per rail host, in the
 * same domain and on lane 0's CQ and counter, so lane 0's thread serves
 * them and every registration's key works on each.
 *
 * Devices: fabric_device may list several ("mlx5_0,mlx5_1"). Each is its
 * own domain (fabric, domain, AV) with one lane (endpoint, CQ, progress
 * thread: a NIC copies nothing, lanes are for software providers), after
 * domain 0's lanes in lanes[]; every region is registered in every domain
 * (all or nothing) and the region table carries a key per domain
 * (region_key_size = devices x 8; one device keeps the 8-byte table). A
 * deregistration closes each domain's MR after the same quiesce of every
 * lane. On IP providers a named device is an interface, and its endpoint
 * is pinned to that interface's address instead of the engine's host.
 *
 * Keys: the endpoints take connections from anyone, secret or not, so
 * where the provider takes ferry's keys (tcp, net, shm) each registration
 * gets 64 random bits (ferry_fabric_new_key) that only the region table,
 * served after AUTH, reveals; the key checks that fail are logged
 * (fabric_log.c), and messages, which ferry never sends, are dropped by
 * receives each endpoint keeps posted (fabric_sink.c). RELIABILITY.md 16
 * says what holds on each provider.
 *
 * Device memory: on a host with a CUDA driver the provider is asked for
 * FI_HMEM too (with_hmem); where it has it, device regions are registered
 * with fi_mr_regattr(FI_HMEM_CUDA) until the first it refuses. Otherwise
 * they stay unregistered (their keys zeros: initiators route them to tcp
 * or refuse them, core/batch.c), local ones are staged (fabric.c), and one
 * line per engine says why (ferry_fabric_say_staged). */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "core/transport.h"
#include "memory/kind.h"
#include "transport/fabric.h"

#define FABRIC_SPIN_ROUNDS 4096 /* yields before the first sleep */
/* A yield that gave the CPU away for longer than this: other work wants the
 * CPU, so the yields end at once (under two CPU burners, 4096 yields were
 * seconds of an "idle" engine's CPU). */
#define FABRIC_YIELD_BUSY_NS 50000
#define FABRIC_SLEEP_MIN_US 50    /* then sleeps, doubling */
#define FABRIC_SLEEP_MAX_US 20000 /* up to this: 50 wake-ups a second when idle */
/* With a wake word (shm): once the sleeps reached this many rounds, the
 * lane sleeps on its word, at most FABRIC_DEEP_MAX_S (bounds what a peer
 * that cannot reach the word costs it). */
#define FABRIC_DEEP_ROUNDS (FABRIC_SPIN_ROUNDS + 8)
#define FABRIC_DEEP_MAX_S 1
#define FABRIC_DESCRIPTOR_VERSION 1

void ferry_fabric_backoff(unsigned *idle, int wake_fd) {
  unsigned n = (*idle)++;
  if (n < FABRIC_SPIN_ROUNDS) {
    uint64_t before = ferry_now_ns();
    sched_yield();
    if (ferry_now_ns() - before > FABRIC_YIELD_BUSY_NS)
      *idle = FABRIC_SPIN_ROUNDS;
    return;
  }
  unsigned shift = n - FABRIC_SPIN_ROUNDS;
  unsigned us = shift < 8 ? FABRIC_SLEEP_MIN_US << shift : FABRIC_SLEEP_MAX_US;
  if (us > FABRIC_SLEEP_MAX_US)
    us = FABRIC_SLEEP_MAX_US;
  struct timespec ts = {0, (long)us * 1000};
  struct pollfd p = {.fd = wake_fd, .events = POLLIN};
  if (ppoll(&p, wake_fd >= 0, &ts, NULL) > 0)
    ferry_fabric_consume(wake_fd);
}

void ferry_fabric_consume(int wake_fd) {
  uint64_t count;
  if (read(wake_fd, &count, sizeof count) < 0 && errno != EAGAIN)
    FERRY_DEBUG("fabric: reading a wake fd: %s", strerror(errno));
}

/* ---- provider choice ------------------------------------------------------------------ */

static int is_wildcard(const char *host) {
  return !*host || !strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !strcmp(host, "[::]");
}

/* A provider over the host's IP stack (tcp, net, sockets, udp) offers one
 * entry per interface, eth0 first: it is pinned to the engine's own host,
 * so traffic never leaves the interface the engine was told to use
 * (loopback in tests). verbs and efa address their NICs themselves. */
int ferry_fabric_is_host_ip(const struct fi_info *info) {
  uint32_t f = info->addr_format;
  const char *prov = info->fabric_attr->prov_name;
  int ip = f == FI_SOCKADDR || f == FI_SOCKADDR_IN || f == FI_SOCKADDR_IN6;
  return ip && strncmp(prov, "verbs", 5) != 0 && strcmp(prov, "efa") != 0;
}

static int query(const ferry_config *cfg, const char *provider, const char *device,
                 uint64_t extra_caps, const char *node, struct fi_info **out) {
  struct fi_info *hints = ferry_fabric_hints(provider, cfg->fabric_mr_basic);
  if (!hints)
    return -FI_ENOMEM;
  hints->caps |= extra_caps;
  if (extra_caps & FI_HMEM) /* ferry registers device memory it hands the provider */
    hints->domain_attr->mr_mode |= FI_MR_HMEM;
  if (device && !(hints->domain_attr->name = strdup(device))) {
    ferry_fi.freeinfo(hints);
    return -FI_ENOMEM;
  }
  int rc = ferry_fi.getinfo(FERRY_FABRIC_API(cfg->fabric_mr_basic), node, NULL,
                            node ? FI_SOURCE : 0, hints, out);
  ferry_fi.freeinfo(hints);
  return rc;
}

/* The entry on device: providers may ignore the domain name in the hints
 * (rxm does), so it is checked here; an IPv4 one first where an IP
 * provider offers several (an IPv6 link-local address needs a scope).
 * -FI_ENODATA when no entry is on it. */
static int pick_device(const char *device, struct fi_info **info) {
  if (!device)
    return 0;
  struct fi_info *hit = NULL;
  for (struct fi_info *i = *info; i; i = i->next)
    if (i->domain_attr->name && !strcmp(i->domain_attr->name, device) &&
        (!hit || (hit->addr_format != FI_SOCKADDR_IN && i->addr_format == FI_SOCKADDR_IN)))
      hit = i;
  struct fi_info *one = hit ? ferry_fi.dupinfo(hit) : NULL;
  ferry_fi.freeinfo(*info);
  *info = one;
  return one ? 0 : hit ? -FI_ENOMEM : -FI_ENODATA;
}

/* The same entry with FI_HMEM (GPUDirect RDMA: the provider registers and
 * moves device memory), where the host has a CUDA driver and the provider
 * offers it; *out stays as it is otherwise. Not with FI_MR_BASIC, which
 * predates it. */
static void with_hmem(ferry_engine *e, const char *provider, const char *device, uint64_t caps,
                      const char *node, struct fi_info **out) {
  if (e->cfg.fabric_mr_basic || !ferry_kind_cuda.available(NULL, 0))
    return;
  struct fi_info *hmem = NULL;
  if (query(&e->cfg, provider, device, caps | FI_HMEM, node, &hmem) == 0 &&
      pick_device(device, &hmem) == 0 && (hmem->caps & FI_HMEM)) {
    ferry_fi.freeinfo(*out);
    *out = hmem;
    return;
  }
  ferry_fi.freeinfo(hmem);
}

/* fi_getinfo for provider on device (NULL: its first), with remote RMA
 * events (for polling without a wait fd) and receives (for the sinks,
 * fabric_sink.c) where the provider has them. An IP provider is pinned to
 * the engine's host, unless pin is 0: a named device (an interface) is
 * pinned to that interface's own address. */
static int provider_info(ferry_engine *e, const char *provider, const char *device, int pin,
                         struct fi_info **out, const char **node) {
  static const uint64_t wanted[] = {FI_RMA_EVENT | FI_MSG | FI_TAGGED, FI_MSG | FI_TAGGED,
                                    FI_RMA_EVENT, 0};
  const char *host = is_wildcard(e->bind_host) ? e->advertise_host : e->bind_host;
  int rc = -FI_ENODATA;
  *node = NULL;
  for (size_t i = 0; i < sizeof wanted / sizeof *wanted && rc; i++) {
    uint64_t caps = wanted[i];
    rc = query(&e->cfg, provider, device, caps, NULL, out);
    if (rc == 0 && pin && ferry_fabric_is_host_ip(*out)) {
      ferry_fi.freeinfo(*out);
      *out = NULL;
      *node = host;
      rc = query(&e->cfg, provider, device, caps, host, out);
    }
    if (rc == 0)
      rc = pick_device(device, out);
    if (rc == 0)
      with_hmem(e, provider, device, caps, *node, out);
  }
  return rc;
}

/* An explicitly named provider (or device) that cannot start. */
static ferry_status provider_failed(ferry_engine *e, const char *provider, const char *device,
                                    const char *node, int rc) {
  if (device && rc == -FI_ENODATA) {
    struct fi_info *all = NULL;
    char names[256] = "none";
    if (query(&e->cfg, provider, NULL, 0, node, &all) == 0)
      ferry_fabric_domains(all, names, sizeof names);
    ferry_fi.freeinfo(all);
    return ferry_fail(FERRY_ETRANSPORT,
                      "fabric device \"%s\" not found for provider %s; its devices: %s", device,
                      provider, names);
  }
  return ferry_fail(FERRY_ETRANSPORT, "fabric provider %s cannot start: fi_getinfo(%s%s): %s%s",
                    provider, node ? "node " : "no node", node ? node : "", ferry_fi.strerror(-rc),
                    rc == -FI_ENODATA ? " (no such provider or device here)" : "");
}

/* " tcp, shm": what the engine uses instead, for the fallback line. */
static void others(const ferry_engine *e, char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; ferry_transports[i] && used < size; i++)
    if ((e->transports & ferry_transports[i]->id) &&
        ferry_transports[i]->id != FERRY_TRANSPORT_FABRIC)
      used += (size_t)snprintf(out + used, size - used, "%s%s", used ? ", " : "",
                               ferry_transports[i]->name);
}

/* fabric_device as a list ("mlx5_0,mlx5_1", as Mooncake's device_name):
 * each entry once, at most FERRY_FABRIC_DOMAINS_MAX; none: the
 * provider's first device (*count 1, names[0] NULL). */
typedef struct device_list {
  char buf[FERRY_FABRIC_DOMAINS_MAX * (FERRY_FABRIC_NAME_MAX + 1)];
  const char *names[FERRY_FABRIC_DOMAINS_MAX];
  unsigned count;
} device_list;

static ferry_status parse_devices(const char *list, device_list *out) {
  memset(out, 0, sizeof *out);
  out->count = 1;
  if (!list)
    return FERRY_OK;
  if (strlen(list) >= sizeof out->buf)
    return ferry_fail(FERRY_EINVAL, "fabric_device \"%.64s...\" is too long", list);
  strcpy(out->buf, list);
  out->count = 0;
  for (char *save = NULL, *name = strtok_r(out->buf, ",", &save); name;
       name = strtok_r(NULL, ",", &save)) {
    if (out->count == FERRY_FABRIC_DOMAINS_MAX)
      return ferry_fail(FERRY_EINVAL, "fabric_device \"%s\" lists more than %d devices", list,
                        FERRY_FABRIC_DOMAINS_MAX);
    for (unsigned i = 0; i < out->count; i++)
      if (!strcmp(out->names[i], name))
        return ferry_fail(FERRY_EINVAL, "fabric_device \"%s\" lists %s twice", list, name);
    out->names[out->count++] = name;
  }
  if (!out->count || strstr(list, ",,") || list[0] == ',' || list[strlen(list) - 1] == ',')
    return ferry_fail(FERRY_EINVAL, "fabric_device \"%s\" has an empty device name", list);
  return FERRY_OK;
}

/* An entry per device of provider into f->domains; 0 or the first device's
 * libfabric error (*failed: which device, *node: where pinned). */
static int devices_info(ferry_engine *e, ferry_fabric *f, const char *provider,
                        const device_list *devs, const char **failed, const char **node) {
  int rc = 0;
  for (unsigned i = 0; i < devs->count && !rc; i++) {
    *failed = devs->names[i];
    rc = provider_info(e, provider, devs->names[i], !devs->names[i], &f->domains[i].info, node);
    f->domain_count = rc ? i : i + 1;
  }
  return rc;
}

/* The provider to open, on each device: the configured one, else the
 * first RDMA provider with the (first) device. 1 with f->domains' infos
 * set; 0 when automatic choice found none (why says so); -1 with the
 * error set. */
static int choose_provider(ferry_engine *e, ferry_fabric *f, const device_list *devs, char *why,
                           size_t size) {
  const char *node, *failed, *named = e->cfg.fabric_provider;
  if (named) {
    int rc = devices_info(e, f, named, devs, &failed, &node);
    if (rc)
      return provider_failed(e, named, failed, node, rc), -1;
    return 1;
  }
  static const char *const rdma[] = {"verbs;ofi_rxm", "efa"};
  size_t used = (size_t)snprintf(why, size, "no RDMA device:");
  for (size_t i = 0; i < sizeof rdma / sizeof *rdma; i++) {
    int rc = devices_info(e, f, rdma[i], devs, &failed, &node);
    if (rc == 0)
      return 1;
    if (f->domain_count) /* it has the first device, not a later one */
      return provider_failed(e, rdma[i], failed, node, rc), -1;
    if (used < size)
      used += (size_t)snprintf(why + used, size - used, "%s fi_getinfo(%s) found none (%s)",
                               i ? "," : "", rdma[i], ferry_fi.strerror(-rc));
  }
  return 0;
}

/* ---- opening --------------------------------------------------------------------------- */

static ferry_status step(const ferry_fabric *f, const char *what, int rc) {
  if (rc == 0)
    return FERRY_OK;
  return ferry_fail(FERRY_ETRANSPORT, "fabric provider %s: %s failed: %s",
                    f->info->fabric_attr->prov_name, what, ferry_fi.strerror(rc < 0 ? -rc : rc));
}

/* A CQ that sleeps on an fd where the provider has one, else a polled one
 * (*fd = -1). Shared with the initiator's channels. */
int ferry_fabric_cq_open(struct fid_domain *domain, struct fid_cq **cq, int *fd) {
  struct fi_cq_attr attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 1024, .wait_obj = FI_WAIT_FD};
  *fd = -1;
  if (fi_cq_open(domain, &attr, cq, NULL) == 0) {
    if (fi_control(&(*cq)->fid, FI_GETWAIT, fd) == 0)
      return 0;
    fi_close(&(*cq)->fid);
    *fd = -1;
  }
  attr.wait_obj = FI_WAIT_NONE; /* shm: -FI_ENOSYS for an fd */
  return fi_cq_open(domain, &attr, cq, NULL);
}

/* The remote-event counter that tells a polling lane traffic is on. */
static ferry_status open_counter(ferry_fabric *f, ferry_fabric_lane *l) {
  if (l->cq_fd >= 0 || !(l->dom->info->caps & FI_RMA_EVENT))
    return FERRY_OK;
  struct fi_cntr_attr attr = {.events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_NONE};
  ferry_status st = step(f, "fi_cntr_open", fi_cntr_open(l->dom->domain, &attr, &l->cntr, NULL));
  if (!st)
    st = step(f, "fi_ep_bind(counter)",
              fi_ep_bind(l->ep, &l->cntr->fid, FI_REMOTE_WRITE | FI_REMOTE_READ));
  return st;
}

/* A lane of domain dom: its endpoint on the domain's AV, its own CQ and
 * counter. */
static ferry_status open_lane(ferry_fabric *f, ferry_fabric_domain *dom, ferry_fabric_lane *l) {
  l->dom = dom;
  ferry_status st = step(f, "fi_cq_open", ferry_fabric_cq_open(dom->domain, &l->cq, &l->cq_fd));
  if (!st)
    st = step(f, "fi_endpoint", fi_endpoint(dom->domain, dom->info, &l->ep, NULL));
  if (!st)
    st = step(f, "fi_ep_bind(av)", fi_ep_bind(l->ep, &dom->av->fid, 0));
  if (!st)
    st = step(f, "fi_ep_bind(cq)", fi_ep_bind(l->ep, &l->cq->fid, FI_TRANSMIT | FI_RECV));
  if (!st)
    st = open_counter(f, l);
  if (!st)
    st = step(f, "fi_enable", fi_enable(l->ep));
  if (!st)
    ferry_fabric_sink_open(f, dom, l->ep, &l->sink);
  if (!st && (l->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
    st = ferry_fail_errno(FERRY_ETRANSPORT, errno, "fabric: eventfd for a progress thread");
  return st;
}

static ferry_status open_domain(ferry_fabric *f, ferry_fabric_domain *dom) {
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  ferry_status st =
      step(f, "fi_fabric", ferry_fi.fabric(dom->info->fabric_attr, &dom->fabric, NULL));
  if (!st)
    st = step(f, "fi_domain", fi_domain(dom->fabric, dom->info, &dom->domain, NULL));
  if (!st)
    st = step(f, "fi_av_open", fi_av_open(dom->domain, &av_attr, &dom->av, NULL));
  return st;
}

/* 64 bits from the kernel's CSPRNG (whole, for 8 bytes, once it is
 * seeded); 0 with errno set when it cannot give them. */
static uint64_t random_bits(void) {
  uint64_t bits;
  return getrandom(&bits, sizeof bits, 0) == (ssize_t)sizeof bits ? bits : 0;
}

/* FI_MR_BASIC (API < 1.5) means VIRT_ADDR, ALLOCATED and PROV_KEY. */
static void read_mr_mode(ferry_fabric *f) {
  int mode = f->info->domain_attr->mr_mode;
  int basic = mode == FI_MR_BASIC;
  f->virt_addr = basic || (mode & FI_MR_VIRT_ADDR);
  f->prov_key = basic || (mode & FI_MR_PROV_KEY);
  f->mr_endpoint = !basic && (mode & FI_MR_ENDPOINT);
  f->draw_key = random_bits;
  f->hmem = (f->info->caps & FI_HMEM) != 0;
  if (!f->hmem)
    snprintf(f->no_hmem, sizeof f->no_hmem, "lacks FI_HMEM%s",
             ferry_kind_cuda.available(NULL, 0) ? "" : " (no CUDA driver here: not asked)");
}

static void copy_name(char *out, const char *in) {
  snprintf(out, FERRY_FABRIC_NAME_MAX + 1, "%s", in ? in : "");
}

static ferry_status fill_self(ferry_fabric *f) {
  ferry_fabric_descriptor *d = &f->self;
  d->virt_addr = f->virt_addr;
  copy_name(d->provider, f->info->fabric_attr->prov_name);
  copy_name(d->fabric, f->info->fabric_attr->name);
  copy_name(d->domain, f->info->domain_attr->name);
  d->addr_len = sizeof d->addr;
  return step(f, "fi_getname", fi_getname(&f->lanes[0].ep->fid, d->addr, &d->addr_len));
}

/* A completion on the lane's CQ: the target posts only its sinks'
 * receives (lane 0's CQ serves the rails' too). */
static void sink_took(ferry_fabric_lane *l, void *context, int err) {
  ferry_fabric *f = l->fabric;
  int took = ferry_fabric_sink_took(&l->sink, context, err);
  for (unsigned r = 0; l == &f->lanes[0] && r < FERRY_RAILS_MAX && !took; r++)
    took = ferry_fabric_sink_took(&f->rail_sinks[r], context, err);
  if (!took && err)
    FERRY_DEBUG("fabric target CQ error: %s", ferry_fi.strerror(err));
}

/* One read takes every sink receive that completed: rxm brings in up to
 * 32 messages per progress call, and each round reposts as many. */
static void drain(ferry_fabric_lane *l) {
  ferry_fabric *f = l->fabric;
  struct fi_cq_entry done[2 * FERRY_FABRIC_SINK_RECVS];
  ssize_t n = fi_cq_read(l->cq, done, 2 * FERRY_FABRIC_SINK_RECVS);
  for (ssize_t i = 0; i < n; i++)
    sink_took(l, done[i].op_context, 0);
  if (n == -FI_EAVAIL) {
    struct fi_cq_err_entry err = {0};
    if (fi_cq_readerr(l->cq, &err, 0) > 0)
      sink_took(l, err.op_context, err.err);
  }
  ferry_fabric_sink_refill(&l->sink);
  for (unsigned r = 0; l == &f->lanes[0] && r < FERRY_RAILS_MAX; r++)
    ferry_fabric_sink_refill(&f->rail_sinks[r]);
}

/* The lane's previous round (and any copy it made) is over: answer the
 * deregistrations that asked before it. */
static void quiesce_answer(ferry_fabric_lane *l) {
  ferry_fabric *f = l->fabric;
  pthread_mutex_lock(&f->quiesce_lock);
  if (l->quiesce_seen != f->quiesce_asked) {
    l->quiesce_seen = f->quiesce_asked;
    pthread_cond_broadcast(&f->quiesce_cond);
  }
  pthread_mutex_unlock(&f->quiesce_lock);
}

static void wake(const ferry_fabric_lane *l) {
  uint64_t one = 1;
  if (write(l->wake_fd, &one, sizeof one) < 0)
    FERRY_DEBUG("fabric: waking a progress thread: %s", strerror(errno));
  if (l->sleep_word) {
    __atomic_store_n(l->sleep_word, 0, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, l->sleep_word, FUTEX_WAKE, 1, NULL, NULL, 0);
  }
}

/* Stop or a deregistration asked since the lane's last round. */
static int asked(ferry_fabric_lane *l) {
  ferry_fabric *f = l->fabric;
  return __atomic_load_n(&f->stop, __ATOMIC_SEQ_CST) ||
         __atomic_load_n(&f->quiesce_asked, __ATOMIC_SEQ_CST) !=
             __atomic_load_n(&l->quiesce_seen, __ATOMIC_SEQ_CST);
}

/* Sleeps on the lane's wake word until an initiator or wake() flips it
 * (fabric_wake.c): first the word says so, then one more progress call
 * serves what was posted before, and a remote event or a request seen
 * then cancels the sleep. Returns 0 when only the cap ended it. */
static int sleep_deep(ferry_fabric_lane *l, uint64_t seen) {
  __atomic_store_n(l->sleep_word, FERRY_FABRIC_SLEEPING, __ATOMIC_SEQ_CST);
  drain(l);
  uint64_t events = l->cntr ? fi_cntr_read(l->cntr) : seen;
  if (events == seen && !asked(l)) {
    struct timespec ts = {FABRIC_DEEP_MAX_S, 0};
    syscall(SYS_futex, l->sleep_word, FUTEX_WAIT, FERRY_FABRIC_SLEEPING, &ts, NULL, 0);
  }
  int flipped = __atomic_exchange_n(l->sleep_word, 0, __ATOMIC_SEQ_CST) != FERRY_FABRIC_SLEEPING;
  if (flipped)
    __atomic_fetch_add(&l->woken, 1, __ATOMIC_RELAXED);
  return flipped || events != seen || asked(l);
}

/* The running lanes that have not yet started a round since ticket. */
static unsigned lanes_behind(const ferry_fabric *f, uint64_t ticket) {
  unsigned behind = 0;
  for (unsigned i = 0; i < f->lane_count; i++)
    behind += f->lanes[i].running && f->lanes[i].quiesce_seen < ticket;
  return behind;
}

/* Returns once every progress thread started a round after this call. */
static void quiesce(ferry_fabric *f) {
  pthread_mutex_lock(&f->quiesce_lock);
  uint64_t ticket =
      __atomic_add_fetch(&f->quiesce_asked, 1, __ATOMIC_SEQ_CST); /* asked() reads it */
  for (unsigned i = 0; i < f->lane_count; i++)
    if (f->lanes[i].running)
      wake(&f->lanes[i]);
  while (lanes_behind(f, ticket))
    pthread_cond_wait(&f->quiesce_cond, &f->quiesce_lock);
  pthread_mutex_unlock(&f->quiesce_lock);
}

static void *progress_main(void *arg) {
  ferry_fabric_lane *l = arg;
  ferry_fabric *f = l->fabric;
  ferry_log_set_engine(f->engine->name); /* its lines (fabric_log.c) name the target */
  ferry_fabric_log_serving(f);
  unsigned idle = 0;
  uint64_t seen = 0;
  struct fid *fids[] = {&l->cq->fid};
  struct pollfd p[2] = {{.fd = l->cq_fd, .events = POLLIN}, {.fd = l->wake_fd, .events = POLLIN}};
  while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
    __atomic_fetch_add(&l->rounds, 1, __ATOMIC_RELAXED);
    quiesce_answer(l);
    drain(l);
    if (l->cq_fd >= 0) {
      /* The wake fd is read only after a poll saw it, and the loop then
       * checks stop and quiesce: a wake-up is never lost. */
      if (fi_trywait(l->dom->fabric, fids, 1) == FI_SUCCESS && poll(p, 2, -1) > 0 &&
          (p[1].revents & POLLIN))
        ferry_fabric_consume(l->wake_fd);
      continue;
    }
    uint64_t events = l->cntr ? fi_cntr_read(l->cntr) : 0;
    if (events != seen) {
      seen = events;
      idle = 0;
    }
    if (l->sleep_word && idle >= FABRIC_DEEP_ROUNDS) {
      if (sleep_deep(l, seen))
        idle = 0; /* woken: an initiator waits, poll as after traffic */
      continue;
    }
    ferry_fabric_backoff(&idle, l->wake_fd);
  }
  quiesce_answer(l);
  return NULL;
}

static void stop_lanes(ferry_fabric *f) {
  __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
  for (unsigned i = 0; i < f->lane_count; i++)
    if (f->lanes[i].running) {
      wake(&f->lanes[i]);
      pthread_join(f->lanes[i].thread, NULL);
      pthread_mutex_lock(&f->quiesce_lock); /* a deregistration no longer waits for it */
      f->lanes[i].running = 0;
      pthread_cond_broadcast(&f->quiesce_cond);
      pthread_mutex_unlock(&f->quiesce_lock);
    }
}

/* Closes three objects, in this order, skipping those never opened. */
static void close_fids(struct fid *first, struct fid *second, struct fid *third) {
  struct fid *fids[] = {first, second, third};
  for (size_t i = 0; i < sizeof fids / sizeof *fids; i++)
    if (fids[i])
      fi_close(fids[i]);
}

static void close_lane(ferry_fabric_lane *l) {
  close_fids(l->ep ? &l->ep->fid : NULL, l->cntr ? &l->cntr->fid : NULL,
             l->cq ? &l->cq->fid : NULL);
  ferry_fabric_sink_close(&l->sink);
  if (l->wake_fd >= 0)
    close(l->wake_fd);
}

static void close_domain(ferry_fabric_domain *dom) {
  close_fids(dom->av ? &dom->av->fid : NULL, dom->domain ? &dom->domain->fid : NULL,
             dom->fabric ? &dom->fabric->fid : NULL);
  if (dom->info)
    ferry_fi.freeinfo(dom->info);
}

static void mr_close(const ferry_fabric *f, ferry_fabric_mr *m);

static void fabric_free(ferry_fabric *f) {
  stop_lanes(f);
  for (size_t i = 0; i < f->mr_count; i++)
    mr_close(f, &f->mrs[i]);
  free(f->mrs);
  for (unsigned r = 0; r < FERRY_RAILS_MAX; r++)
    if (f->rail_eps[r]) {
      fi_close(&f->rail_eps[r]->fid);
      ferry_fabric_sink_close(&f->rail_sinks[r]);
    }
  for (unsigned i = 0; i < sizeof f->lanes / sizeof *f->lanes; i++)
    close_lane(&f->lanes[i]);
  ferry_fabric_wake_unmap(f->wake_words);
  if (f->wake_path[0])
    unlink(f->wake_path);
  for (unsigned i = 0; i < FERRY_FABRIC_DOMAINS_MAX; i++)
    close_domain(&f->domains[i]);
  pthread_rwlock_destroy(&f->mr_lock);
  pthread_mutex_destroy(&f->quiesce_lock);
  pthread_cond_destroy(&f->quiesce_cond);
  free(f);
  ferry_fabric_log_release();
}

/* f's entry with its source address moved to host (a literal address of
 * the same family), port 0: the domain spans the host's addresses, and
 * fi_getinfo would name another domain for an address that is no
 * interface's own (127.0.0.2 on lo). NULL when host does not fit. */
static struct fi_info *rail_info(const ferry_fabric *f, const char *host) {
  struct sockaddr_storage ss = {0};
  struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
  size_t len = 0;
  if (f->info->addr_format != FI_SOCKADDR_IN6 && inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
    in4->sin_family = AF_INET;
    len = sizeof *in4;
  } else if (f->info->addr_format != FI_SOCKADDR_IN &&
             inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    len = sizeof *in6;
  }
  struct fi_info *one = len ? ferry_fi.dupinfo(f->info) : NULL;
  void *addr = one ? malloc(len) : NULL;
  if (!addr) {
    ferry_fi.freeinfo(one);
    return NULL;
  }
  memcpy(addr, &ss, len);
  free(one->src_addr);
  one->src_addr = addr;
  one->src_addrlen = len;
  return one;
}

/* One more endpoint of the domain, pinned to host, on the target's AV and
 * lane 0's CQ and counter (so lane 0's thread serves it too); its address
 * is rail r of the descriptor. */
static ferry_status open_rail(ferry_fabric *f, unsigned r, const char *host) {
  struct fi_info *info = rail_info(f, host);
  if (!info)
    return ferry_fail(FERRY_ETRANSPORT,
                      "fabric rail %u: %s is no literal address of provider %s's kind (or no "
                      "memory)",
                      r, host, f->self.provider);
  struct fid_ep **ep = &f->rail_eps[r];
  ferry_status st = step(f, "fi_endpoint(rail)", fi_endpoint(f->domains[0].domain, info, ep, NULL));
  ferry_fi.freeinfo(info);
  if (!st)
    st = step(f, "fi_ep_bind(rail av)", fi_ep_bind(*ep, &f->domains[0].av->fid, 0));
  if (!st)
    st = step(f, "fi_ep_bind(rail cq)",
              fi_ep_bind(*ep, &f->lanes[0].cq->fid, FI_TRANSMIT | FI_RECV));
  if (!st && f->lanes[0].cntr)
    st = step(f, "fi_ep_bind(rail counter)",
              fi_ep_bind(*ep, &f->lanes[0].cntr->fid, FI_REMOTE_WRITE | FI_REMOTE_READ));
  if (!st)
    st = step(f, "fi_enable(rail)", fi_enable(*ep));
  if (!st)
    ferry_fabric_sink_open(f, &f->domains[0], *ep, &f->rail_sinks[r]);
  f->self.rail_addr_len[r] = sizeof f->self.rail_addr[r];
  if (!st)
    st = step(f, "fi_getname(rail)",
              fi_getname(&(*ep)->fid, f->self.rail_addr[r], &f->self.rail_addr_len[r]));
  if (!st)
    FERRY_INFO("fabric rail %u: serving on %s", r, host);
  return st;
}

/* An endpoint per rail host (ferry_config.rail_hosts) for providers over
 * the host's IP stack, whose one domain spans the host's addresses; other
 * providers (a domain per NIC) serve on their one endpoint. */
static ferry_status open_rails(ferry_fabric *f) {
  ferry_rail_spec specs[FERRY_RAILS_MAX];
  unsigned count = 0;
  if (!f->engine->rail_hosts || ferry_rails_parse(f->engine->rail_hosts, specs, &count))
    return FERRY_OK; /* the tcp transport reports a bad list */
  if (count && f->domain_count > 1) {
    FERRY_INFO("fabric: the rails are its %u devices (fabric_device); rail_hosts is not used",
               f->domain_count);
    return FERRY_OK;
  }
  if (count && (!ferry_fabric_is_host_ip(f->info) || f->mr_endpoint)) {
    FERRY_INFO("fabric: provider %s serves on one endpoint (rails need an IP provider without "
               "FI_MR_ENDPOINT)",
               f->self.provider);
    return FERRY_OK;
  }
  ferry_status st = FERRY_OK;
  for (unsigned r = 0; r < count && !st; r++)
    if (!(st = open_rail(f, r, specs[r].host)))
      f->self.rail_count = r + 1;
  return st;
}

/* fabric_lanes, or one per CPU (at least 2, at most the maximum) where
 * the CQ has a wait fd, else one: polling threads (shm) would take the CPUs
 * from each other and from the initiators (shm WRITE 16 MiB fell from 4.6
 * to 0.4 GB/s with 2 lanes on 2 CPUs). One where registrations bind to an
 * endpoint (FI_MR_ENDPOINT). Lane 0 is open. */
static unsigned lane_count(const ferry_fabric *f) {
  unsigned cpus = f->cpus;
  unsigned n = f->engine->cfg.fabric_lanes;
  if (!n && f->lanes[0].cq_fd < 0)
    n = 1;
  if (!n)
    n = cpus < 2 ? 2 : cpus > FERRY_FABRIC_LANES_MAX ? FERRY_FABRIC_LANES_MAX : cpus;
  if (n > 1 && f->mr_endpoint) {
    FERRY_INFO("fabric: provider %s serves on one lane (its registrations bind to one endpoint)",
               f->self.provider);
    n = 1;
  }
  if (n > 1 && f->domain_count > 1) {
    FERRY_INFO("fabric: one lane per device on %u devices", f->domain_count);
    n = 1;
  }
  return n;
}

/* The lanes, each published (but the first: the main address) in the
 * descriptor, then a progress thread per lane. */
static ferry_status open_lanes(ferry_fabric *f) {
  ferry_status st = open_lane(f, &f->domains[0], &f->lanes[0]);
  unsigned count = st ? 0 : lane_count(f);
  if (!st)
    f->lane_count = 1;
  for (unsigned i = 1; i < count && !st; i++)
    if (!(st = open_lane(f, &f->domains[0], &f->lanes[i])))
      f->lane_count = i + 1;
  ferry_fabric_descriptor *d = &f->self;
  for (unsigned i = 1; i < f->lane_count && !st; i++) {
    d->lane_addr_len[i - 1] = sizeof d->lane_addr[i - 1];
    st = step(f, "fi_getname(lane)",
              fi_getname(&f->lanes[i].ep->fid, d->lane_addr[i - 1], &d->lane_addr_len[i - 1]));
    d->lane_count = st ? 0 : i;
  }
  return st;
}

/* The devices after the first (fabric.c's top comment): each a domain
 * with one lane (an RDMA NIC moves the bytes itself: lanes are for the
 * software providers), published as the rails list, rail d being domain
 * d's endpoint (domain 0's main one first). */
static ferry_status open_devices(ferry_fabric *f) {
  ferry_fabric_descriptor *d = &f->self;
  if (f->domain_count < 2)
    return FERRY_OK;
  memcpy(d->rail_addr[0], d->addr, d->addr_len);
  d->rail_addr_len[0] = d->addr_len;
  ferry_status st = FERRY_OK;
  for (unsigned i = 1; i < f->domain_count && !st; i++) {
    ferry_fabric_domain *dom = &f->domains[i];
    ferry_fabric_lane *l = &f->lanes[f->lane_count];
    dom->lane = f->lane_count;
    st = open_domain(f, dom);
    if (!st && !(st = open_lane(f, dom, l)))
      f->lane_count++;
    d->rail_addr_len[i] = sizeof d->rail_addr[i];
    if (!st)
      st = step(f, "fi_getname(device)",
                fi_getname(&l->ep->fid, d->rail_addr[i], &d->rail_addr_len[i]));
  }
  if (!st) {
    d->rail_count = f->domain_count;
    d->domain_rails = 1;
  }
  return st;
}

static ferry_status start_lanes(ferry_fabric *f) {
  for (unsigned i = 0; i < f->lane_count; i++) {
    int rc = pthread_create(&f->lanes[i].thread, NULL, progress_main, &f->lanes[i]);
    if (rc)
      return ferry_fail_errno(FERRY_ETRANSPORT, rc, "fabric: starting progress thread %u", i);
    f->lanes[i].running = 1;
  }
  return FERRY_OK;
}

/* shm: the lanes' wake words (fabric_wake.c), else (or when the page
 * cannot be made) capped sleeps. */
static void open_wake(ferry_fabric *f) {
  if (f->lanes[0].cq_fd >= 0 ||
      !ferry_fabric_wake_path(&f->self, f->wake_path, sizeof f->wake_path))
    return;
  f->wake_words = ferry_fabric_wake_map(f->wake_path, 1);
  if (!f->wake_words) {
    FERRY_INFO("fabric: no wake page %s (%s): idle lanes poll, up to %d ms apart", f->wake_path,
               strerror(errno), FABRIC_SLEEP_MAX_US / 1000);
    f->wake_path[0] = '\0';
    return;
  }
  for (unsigned i = 0; i < f->lane_count; i++)
    f->lanes[i].sleep_word = f->wake_words + i * FERRY_FABRIC_WAKE_STRIDE;
}

static ferry_status fabric_open(ferry_fabric *f) {
  read_mr_mode(f);
  copy_name(f->self.provider, f->info->fabric_attr->prov_name);
  ferry_status st = open_domain(f, &f->domains[0]);
  if (!st)
    st = open_lanes(f);
  if (!st)
    st = fill_self(f);
  if (!st)
    st = open_devices(f);
  if (!st)
    st = open_rails(f);
  if (!st)
    open_wake(f);
  if (!st)
    st = start_lanes(f);
  return st;
}

/* Drops the fabric bit: the engine goes on with its other transports,
 * unless fabric was the only one. */
static ferry_status transport_off(ferry_engine *e, const char *why) {
  e->transports &= ~(unsigned)FERRY_TRANSPORT_FABRIC;
  if (!e->transports)
    return ferry_fail(FERRY_ETRANSPORT, "fabric transport unavailable (%s) and no other enabled",
                      why);
  char names[64];
  others(e, names, sizeof names);
  FERRY_INFO("fabric transport off: %s; using %s", why, names);
  return FERRY_OK;
}

/* The software providers number their own keys 1, 2, 3, ... (FI_MR_BASIC,
 * fabric_mr_basic): with a secret, only the regions' addresses then stand
 * between a peer that never proved it and the memory. */
static void warn_counted_keys(const ferry_fabric *f) {
  const char *prov = f->self.provider;
  if (f->engine->secret && f->prov_key &&
      (ferry_fabric_is_host_ip(f->info) || !strcmp(prov, "shm")))
    FERRY_WARN("fabric: provider %s numbers its memory keys 1, 2, 3, ... (fabric_mr_basic): a "
               "peer that never proved the shared secret can guess them; turn fabric_mr_basic off "
               "for random keys",
               prov);
}

ferry_status ferry_fabric_service_start(ferry_engine *e) {
  char why[512];
  if (!ferry_fabric_library_load(why, sizeof why))
    return e->cfg.fabric_provider
               ? ferry_fail(FERRY_ETRANSPORT, "fabric provider %s cannot start: %s",
                            e->cfg.fabric_provider, why)
               : transport_off(e, why);
  ferry_fabric *f = calloc(1, sizeof *f);
  if (!f)
    return ferry_fail(FERRY_ENOMEM, "no memory for the fabric transport");
  f->engine = e;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  f->cpus = cpus > 0 ? (unsigned)cpus : 1;
  ferry_fabric_log_hold(); /* before any lane: their key checks are logged */
  for (unsigned i = 0; i < sizeof f->lanes / sizeof *f->lanes; i++) {
    f->lanes[i].fabric = f;
    f->lanes[i].cq_fd = f->lanes[i].wake_fd = -1;
  }
  pthread_rwlock_init(&f->mr_lock, NULL);
  pthread_mutex_init(&f->quiesce_lock, NULL);
  pthread_cond_init(&f->quiesce_cond, NULL);
  device_list devs;
  ferry_status st = parse_devices(e->cfg.fabric_device, &devs);
  int chosen = st ? 0 : choose_provider(e, f, &devs, why, sizeof why);
  f->info = f->domains[0].info;
  if (!st)
    st = chosen < 0 ? FERRY_ETRANSPORT : chosen ? fabric_open(f) : FERRY_OK;
  if (st || !chosen) {
    fabric_free(f);
    return st ? st : transport_off(e, why);
  }
  e->fabric = f;
  int several = f->domain_count > 1;
  FERRY_INFO("fabric transport on: provider %s, fabric %s, %s %s, %u lanes, %s progress "
             "wait, MR mode 0x%x, %s keys",
             f->self.provider, f->self.fabric, several ? "devices" : "domain",
             several ? e->cfg.fabric_device : f->self.domain, f->lane_count,
             f->lanes[0].cq_fd >= 0 ? "fd"
             : f->lanes[0].cntr     ? "polled (counter)"
                                    : "polled",
             (unsigned)f->info->domain_attr->mr_mode, f->prov_key ? "the provider's" : "random");
  warn_counted_keys(f);
  return FERRY_OK;
}

void ferry_fabric_service_stop(ferry_engine *e) {
  if (!e->fabric)
    return;
  fabric_free(e->fabric);
  e->fabric = NULL;
}

/* ---- the descriptor ---------------------------------------------------------------------- */

/* version | flags | 3 x (u8 len, name) | u16 addr_len | addr [| rails [|
 * lanes]]: the rails list is there when it or the lanes list is not
 * empty, so a descriptor without either is as it was before them. Flags:
 * 1 virtual addresses, 2 the rails are domains (a key each). */
static size_t put_name(uint8_t *out, const char *name) {
  size_t n = strlen(name);
  out[0] = (uint8_t)n;
  memcpy(out + 1, name, n);
  return n + 1;
}

/* A list of addresses, as many as fit in size bytes: u8 count | count x
 * (u16 len | addr). */
static size_t put_addrs(const uint8_t (*addr)[FERRY_FABRIC_ADDR_MAX], const size_t *len,
                        unsigned count, uint8_t *out, size_t size) {
  size_t n = 1;
  unsigned put = 0;
  if (!size)
    return 0;
  for (; put < count && n + 2 + len[put] <= size; put++) {
    out[n++] = (uint8_t)(len[put] & 0xff);
    out[n++] = (uint8_t)(len[put] >> 8);
    memcpy(out + n, addr[put], len[put]);
    n += len[put];
  }
  out[0] = (uint8_t)put;
  return n;
}

size_t ferry_fabric_describe(ferry_engine *e, uint8_t *out, size_t size) {
  const ferry_fabric *f = e->fabric;
  if (!f || size < 2 + 3 * (FERRY_FABRIC_NAME_MAX + 1) + 2 + f->self.addr_len)
    return 0;
  size_t n = 0;
  out[n++] = FABRIC_DESCRIPTOR_VERSION;
  out[n++] = (uint8_t)((f->self.virt_addr ? 1 : 0) | (f->self.domain_rails ? 2 : 0));
  n += put_name(out + n, f->self.provider);
  n += put_name(out + n, f->self.fabric);
  n += put_name(out + n, f->self.domain);
  out[n++] = (uint8_t)(f->self.addr_len & 0xff);
  out[n++] = (uint8_t)(f->self.addr_len >> 8);
  memcpy(out + n, f->self.addr, f->self.addr_len);
  n += f->self.addr_len;
  const ferry_fabric_descriptor *d = &f->self;
  if (d->rail_count || d->lane_count)
    n += put_addrs(d->rail_addr, d->rail_addr_len, d->rail_count, out + n, size - n);
  if (d->lane_count)
    n += put_addrs(d->lane_addr, d->lane_addr_len, d->lane_count, out + n, size - n);
  return n;
}

static int get_name(const uint8_t *in, size_t len, size_t *at, char *out) {
  if (*at >= len || in[*at] > FERRY_FABRIC_NAME_MAX || len - *at - 1 < in[*at])
    return 0;
  size_t n = in[(*at)++];
  memcpy(out, in + *at, n);
  out[n] = '\0';
  *at += n;
  return memchr(out, '\0', n) == NULL;
}

/* u16 len | addr, with 0 < len <= FERRY_FABRIC_ADDR_MAX within in. */
static int get_addr(const uint8_t *in, size_t len, size_t *at, uint8_t *out, size_t *out_len) {
  if (len - *at < 2)
    return 0;
  size_t n = in[*at] | (size_t)in[*at + 1] << 8;
  *at += 2;
  if (!n || n > FERRY_FABRIC_ADDR_MAX || len - *at < n)
    return 0;
  memcpy(out, in + *at, n);
  *out_len = n;
  *at += n;
  return 1;
}

/* A list put_addrs wrote, of min to max addresses (a lanes list is
 * written only when not empty). */
static int get_addrs(const uint8_t *in, size_t len, size_t *at, const char *what, unsigned min,
                     unsigned max, uint8_t (*addr)[FERRY_FABRIC_ADDR_MAX], size_t *addr_len,
                     unsigned *count, char *why, size_t size) {
  *count = in[(*at)++];
  if (*count < min || *count > max)
    return snprintf(why, size, "its fabric descriptor lists %u %ss", *count, what), 0;
  for (unsigned r = 0; r < *count; r++)
    if (!get_addr(in, len, at, addr[r], &addr_len[r]))
      return snprintf(why, size, "its fabric %s %u address is malformed", what, r), 0;
  return 1;
}

static int decode(const uint8_t *in, size_t len, ferry_fabric_descriptor *d, char *why,
                  size_t size) {
  size_t at = 2;
  memset(d, 0, sizeof *d);
  if (len < 2 || in[0] != FABRIC_DESCRIPTOR_VERSION || in[1] > 3)
    return snprintf(why, size, "its fabric descriptor is of an unknown version"), 0;
  d->virt_addr = in[1] & 1;
  d->domain_rails = in[1] >> 1;
  if (!get_name(in, len, &at, d->provider) || !get_name(in, len, &at, d->fabric) ||
      !get_name(in, len, &at, d->domain))
    return snprintf(why, size, "its fabric descriptor is malformed"), 0;
  if (!get_addr(in, len, &at, d->addr, &d->addr_len))
    return snprintf(why, size, "its fabric address is malformed"), 0;
  if (at == len)
    return 1;
  if (!get_addrs(in, len, &at, "rail", 0, FERRY_RAILS_MAX, d->rail_addr, d->rail_addr_len,
                 &d->rail_count, why, size))
    return 0;
  if (at == len)
    return 1;
  if (!get_addrs(in, len, &at, "lane", 1, FERRY_FABRIC_LANES_MAX - 1, d->lane_addr,
                 d->lane_addr_len, &d->lane_count, why, size))
    return 0;
  if (at != len)
    return snprintf(why, size, "its fabric descriptor has %zu bytes past its lanes", len - at), 0;
  return 1;
}

int ferry_fabric_descriptor_decode(const uint8_t *in, size_t len, ferry_fabric_descriptor *d,
                                   char *why, size_t size) {
  if (!decode(in, len, d, why, size))
    return 0;
  if (d->domain_rails && (d->rail_count < 2 || d->rail_count > FERRY_FABRIC_DOMAINS_MAX))
    return snprintf(why, size, "its fabric descriptor lists %u device rails", d->rail_count), 0;
  return 1;
}

/* ---- memory registrations ----------------------------------------------------------------- */

static int mr_cmp(const void *a, const void *b) {
  const ferry_fabric_mr *x = a, *y = b;
  return x->addr < y->addr       ? -1
         : x->addr > y->addr     ? 1
         : x->length < y->length ? -1
                                 : x->length > y->length;
}

/* Index of the registration holding [addr, addr+length), or -1. */
static long mr_find(const ferry_fabric *f, uint64_t addr, uint64_t length) {
  size_t lo = 0, hi = f->mr_count;
  while (lo < hi) { /* the last one starting at or below addr */
    size_t mid = lo + (hi - lo) / 2;
    if (f->mrs[mid].addr <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (!lo)
    return -1;
  const ferry_fabric_mr *m = &f->mrs[lo - 1];
  return addr - m->addr <= m->length && length <= m->length - (addr - m->addr) ? (long)lo - 1 : -1;
}

static long mr_exact(const ferry_fabric *f, const ferry_region *r) {
  long i = mr_find(f, r->addr, r->length);
  return i >= 0 && f->mrs[i].addr == r->addr && f->mrs[i].length == r->length ? i : -1;
}

static void mr_close(const ferry_fabric *f, ferry_fabric_mr *m) {
  for (unsigned d = 0; d < f->domain_count; d++)
    if (m->mr[d]) {
      fi_close(&m->mr[d]->fid);
      m->mr[d] = NULL;
    }
}

/* What peers may do to m: a receive pool takes no one-sided WRITE, which
 * its target could not check against the writer's grants (pool.c sends
 * its messages over tcp or shm); it stays readable. */
static uint64_t mr_access(const ferry_fabric_mr *m) {
  return FI_READ | FI_WRITE | FI_REMOTE_READ | (m->pool ? 0 : FI_REMOTE_WRITE);
}

/* m's registration in domain d (bound to its endpoint with FI_MR_ENDPOINT). */
static int mr_open_in(ferry_fabric *f, unsigned d, ferry_fabric_mr *m, uint64_t key) {
  uint64_t access = mr_access(m);
  struct fid_mr **mr = &m->mr[d];
  struct iovec iov = {(void *)(uintptr_t)m->addr, m->length};
  struct fi_mr_attr attr = {.mr_iov = &iov,
                            .iov_count = 1,
                            .access = access,
                            .requested_key = key,
                            .iface = m->device >= 0 ? FI_HMEM_CUDA : FI_HMEM_SYSTEM};
  attr.device.cuda = m->device >= 0 ? m->device : 0;
  int rc = m->device >= 0 ? fi_mr_regattr(f->domains[d].domain, &attr, 0, mr)
                          : fi_mr_reg(f->domains[d].domain, iov.iov_base, iov.iov_len, access, 0,
                                      key, 0, mr, NULL);
  if (rc == 0 && f->mr_endpoint) {
    rc = fi_mr_bind(*mr, &f->lanes[f->domains[d].lane].ep->fid, 0);
    if (rc == 0)
      rc = fi_mr_enable(*mr);
    if (rc) {
      fi_close(&(*mr)->fid);
      *mr = NULL;
    }
  }
  return rc;
}

uint64_t ferry_fabric_new_key(const ferry_fabric *f) {
  size_t size = f->info->domain_attr->mr_key_size;
  uint64_t mask = size && size < sizeof(uint64_t) ? (1ull << (8 * size)) - 1 : UINT64_MAX;
  for (int draw = 0; draw < 4; draw++) { /* 0 is never a key: draw again */
    uint64_t key = f->draw_key() & mask;
    if (key)
      return key;
  }
  return 0;
}

/* A registration whose keys are all 0 would read, in the region table,
 * as memory the fabric cannot reach (transport.h): refused (only a
 * provider's own key can be 0; ferry never draws it). */
static ferry_status zero_keys(ferry_fabric *f, ferry_fabric_mr *m) {
  for (unsigned d = 0; d < f->domain_count; d++)
    if (fi_mr_key(m->mr[d]))
      return FERRY_OK;
  mr_close(f, m);
  return ferry_fail(FERRY_ETRANSPORT,
                    "fabric: registering 0x%llx (+%llu bytes) with %s: the provider's key is 0, "
                    "which the region table keeps for memory the fabric cannot reach",
                    (unsigned long long)m->addr, (unsigned long long)m->length, f->self.provider);
}

/* m registered in every domain, or in none; a key of its own in each
 * (where the provider takes ours: RELIABILITY.md 16, who can reach
 * registered memory), as NICs' keys are. */
static ferry_status mr_open(ferry_fabric *f, ferry_fabric_mr *m) {
  for (unsigned d = 0; d < f->domain_count; d++) {
    uint64_t key = f->prov_key ? 0 : ferry_fabric_new_key(f);
    if (!f->prov_key && !key) {
      mr_close(f, m);
      return ferry_fail_errno(FERRY_ETRANSPORT, errno,
                              "fabric: registering 0x%llx (+%llu bytes): no random key (getrandom)",
                              (unsigned long long)m->addr, (unsigned long long)m->length);
    }
    int rc = mr_open_in(f, d, m, key);
    if (rc) {
      mr_close(f, m);
      return ferry_fail(
          FERRY_ETRANSPORT, "fabric: registering 0x%llx (+%llu bytes)%s with %s on device %s: %s%s",
          (unsigned long long)m->addr, (unsigned long long)m->length,
          m->device >= 0 ? " of CUDA memory" : "", f->self.provider,
          f->domains[d].info->domain_attr->name,
          m->device >= 0 ? "fi_mr_regattr(FI_HMEM_CUDA): " : "", ferry_fi.strerror(-rc));
    }
  }
  return zero_keys(f, m);
}

/* The regions of this call not registered yet, sorted, each once. */
static size_t fresh_regions(const ferry_fabric *f, const ferry_region *regions, size_t count,
                            unsigned flags, ferry_fabric_mr *out) {
  size_t n = 0;
  int pool = (flags & FERRY_REGISTER_POOL) != 0;
  for (size_t i = 0; i < count; i++)
    if (mr_exact(f, &regions[i]) < 0)
      out[n++] = (ferry_fabric_mr){
          .addr = regions[i].addr, .length = regions[i].length, .pool = pool, .device = -1};
  qsort(out, n, sizeof *out, mr_cmp);
  size_t kept = 0;
  for (size_t i = 0; i < n; i++)
    if (!kept || mr_cmp(&out[kept - 1], &out[i]) != 0)
      out[kept++] = out[i];
  return kept;
}

/* Room for need registrations (amortized doubling); under the write lock,
 * as it may move the table. */
static int reserve(ferry_fabric *f, size_t need) {
  if (need <= f->mr_cap)
    return 0;
  size_t cap = f->mr_cap * 2 > need ? f->mr_cap * 2 : need;
  ferry_fabric_mr *grown = realloc(f->mrs, cap * sizeof *grown);
  if (!grown)
    return -1;
  f->mrs = grown;
  f->mr_cap = cap;
  return 0;
}

/* Merges the sorted fresh registrations in from the back: appending at the
 * end (addresses registered in order) moves nothing. */
static void merge_in(ferry_fabric *f, const ferry_fabric_mr *fresh, size_t n) {
  size_t i = f->mr_count, j = n, k = f->mr_count + n;
  while (j > 0)
    f->mrs[--k] = i > 0 && mr_cmp(&f->mrs[i - 1], &fresh[j - 1]) > 0 ? f->mrs[--i] : fresh[--j];
  f->mr_count += n;
}

void ferry_fabric_say_staged(ferry_fabric *f) {
  /* With FI_HMEM only FERRY_STAGING=always stages device memory: no line.
   * The acquire pairs with no_hmem's release: its reason is written. */
  if (__atomic_load_n(&f->hmem, __ATOMIC_ACQUIRE))
    return;
  if (!__atomic_exchange_n(&f->staging_said, 1, __ATOMIC_RELAXED))
    FERRY_INFO("fabric provider %s %s: device memory is staged through host buffers",
               f->self.provider, f->no_hmem);
}

/* Device memory stays unregistered from now on (its key zeros: peers
 * reach it over tcp, staged), and moves from here through bounce buffers. */
static void no_hmem(ferry_fabric *f, const char *why) {
  snprintf(f->no_hmem, sizeof f->no_hmem, "cannot register CUDA memory (%s)", why);
  __atomic_store_n(&f->hmem, 0, __ATOMIC_RELEASE);
  ferry_fabric_say_staged(f);
}

/* Which device holds each device region (FI_HMEM_CUDA wants its
 * ordinal). */
static ferry_status place_devices(ferry_fabric_mr *fresh, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ferry_where where;
    ferry_status st = ferry_kind_identify(fresh[i].addr, fresh[i].length, &where);
    if (st)
      return st;
    if (where.kind != FERRY_KIND_CUDA || where.device < 0)
      return ferry_fail(FERRY_ENOTIMPL, "0x%llx is device memory of no CUDA device",
                        (unsigned long long)fresh[i].addr);
    fresh[i].device = where.device;
  }
  return FERRY_OK;
}

ferry_status ferry_fabric_region_register(ferry_engine *e, const ferry_region *regions,
                                          size_t count, unsigned flags) {
  ferry_fabric *f = e->fabric;
  if (!f || !count)
    return FERRY_OK;
  if ((flags & FERRY_REGISTER_DEVICE) && !__atomic_load_n(&f->hmem, __ATOMIC_ACQUIRE)) {
    ferry_fabric_say_staged(f); /* left unregistered: its key zeros (transport.h) */
    return FERRY_OK;
  }
  ferry_fabric_mr *fresh = malloc(count * sizeof *fresh);
  if (!fresh)
    return ferry_fail(FERRY_ENOMEM, "no memory to register %zu regions with fabric", count);
  size_t n = fresh_regions(f, regions, count, flags, fresh), done = 0;
  ferry_status st = (flags & FERRY_REGISTER_DEVICE) ? place_devices(fresh, n) : FERRY_OK;
  while (done < n && !st && !(st = mr_open(f, &fresh[done])))
    done++;
  if (st && (flags & FERRY_REGISTER_DEVICE) && st != FERRY_ENOMEM) {
    no_hmem(f, ferry_last_error()); /* the provider takes no CUDA memory: staged from now on */
    while (done)
      mr_close(f, &fresh[--done]);
    free(fresh);
    return FERRY_OK;
  }
  pthread_rwlock_wrlock(&f->mr_lock);
  if (!st && reserve(f, f->mr_count + n) != 0)
    st = ferry_fail(FERRY_ENOMEM, "no memory for %zu fabric registrations", f->mr_count + n);
  if (!st)
    merge_in(f, fresh, n);
  pthread_rwlock_unlock(&f->mr_lock);
  while (st && done)
    mr_close(f, &fresh[--done]);
  free(fresh);
  return st;
}

/* Marks the registrations of regions (mr[0] = NULL, the table stays
 * sorted) and copies them to closing; returns how many. */
static size_t mark_removed(ferry_fabric *f, const ferry_region *regions, size_t count,
                           ferry_fabric_mr *closing) {
  size_t n = 0;
  for (size_t i = 0; i < count; i++) {
    long at = mr_exact(f, &regions[i]);
    if (at >= 0 && f->mrs[at].mr[0]) {
      closing[n++] = f->mrs[at];
      f->mrs[at].mr[0] = NULL;
    }
  }
  return n;
}

static void compact(ferry_fabric *f) {
  size_t kept = 0;
  for (size_t i = 0; i < f->mr_count; i++)
    if (f->mrs[i].mr[0])
      f->mrs[kept++] = f->mrs[i];
  f->mr_count = kept;
}

/* The IP providers check a key once per operation, at its header, and
 * copy the rest of a WRITE as it arrives: only aborting the connection
 * stops one under way (fabric_sockets.c). Every accepted connection goes,
 * since none says which operations it carries; their initiators move
 * the operations again on a fresh connection (fabric.c). */
static void abort_connections(ferry_fabric *f) {
  int n = ferry_fabric_abort_accepted(f);
  if (n < 0)
    FERRY_WARN("fabric: cannot list /proc/self/fd (%s): a WRITE under way into the memory "
               "just unregistered may still land",
               strerror(errno));
  else
    FERRY_DEBUG("fabric: unregister aborted %d accepted connections", n);
}

void ferry_fabric_region_deregister(ferry_engine *e, const ferry_region *regions, size_t count) {
  ferry_fabric *f = e->fabric;
  if (!f || !count)
    return;
  ferry_fabric_mr one, *closing = count > 1 ? malloc(count * sizeof *closing) : &one;
  pthread_rwlock_wrlock(&f->mr_lock);
  size_t n = 0;
  for (size_t done = 0; done < count;) { /* without memory for the list: one at a time */
    size_t step = closing ? count - done : 1;
    ferry_fabric_mr *into = closing ? closing + n : &one;
    size_t got = mark_removed(f, regions + done, step, into);
    if (!closing && got)
      mr_close(f, &one);
    else if (closing)
      n += got;
    done += step;
  }
  compact(f);
  pthread_rwlock_unlock(&f->mr_lock);
  for (size_t i = 0; i < n; i++)
    mr_close(f, &closing[i]);
  if (closing != &one)
    free(closing);
  if (n && ferry_fabric_is_host_ip(f->info))
    abort_connections(f);
  quiesce(f); /* a copy into a closed registration under way now ended */
}

/* A key per domain: the single-domain table is as it always was. */
size_t ferry_fabric_region_key_size(ferry_engine *e) {
  return e->fabric ? e->fabric->domain_count * FERRY_FABRIC_KEY_SIZE : 0;
}

void ferry_fabric_region_keys(ferry_engine *e, const ferry_region *regions, size_t count,
                              uint8_t *out) {
  ferry_fabric *f = e->fabric;
  if (!f)
    return;
  size_t size = ferry_fabric_region_key_size(e);
  memset(out, 0, count * size);
  pthread_rwlock_rdlock(&f->mr_lock);
  for (size_t i = 0; i < count; i++) {
    long at = mr_exact(f, &regions[i]);
    for (unsigned d = 0; at >= 0 && d < f->domain_count; d++) {
      uint64_t key = fi_mr_key(f->mrs[at].mr[d]);
      for (int b = 0; b < FERRY_FABRIC_KEY_SIZE; b++)
        out[i * size + d * FERRY_FABRIC_KEY_SIZE + b] = (uint8_t)(key >> (8 * b));
    }
  }
  pthread_rwlock_unlock(&f->mr_lock);
}

int ferry_fabric_local_desc(ferry_fabric *f, unsigned dom, const void *addr, size_t length,
                            void **desc) {
  pthread_rwlock_rdlock(&f->mr_lock);
  long at = mr_find(f, (uint64_t)(uintptr_t)addr, length);
  *desc = at >= 0 ? fi_mr_desc(f->mrs[at].mr[dom]) : NULL;
  pthread_rwlock_unlock(&f->mr_lock);
  return at >= 0;
}
