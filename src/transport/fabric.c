/* fabric.c - the libfabric (RDMA-class) data transport: one-sided fi_write /
 * fi_read straight into the memory a peer registered, on verbs (InfiniBand,
 * RoCE), efa, or the tcp and shm providers that run the same path here.
 *
 * The engine-wide part (provider, domain, the target endpoint and its
 * progress thread, registrations and keys) is fabric_service.c. A channel
 * is an RDM endpoint of its own, with its own CQ and address vector holding
 * the one peer, driven by the thread that checked it out: it claims chunks
 * and keeps up to FABRIC_DEPTH operations in flight, one per segment, each
 * aimed at the peer's registration by the key the peer's region table
 * carries (ferry_peer_region_key). A channel without a rail aims at the
 * next of the target's lanes (pick_lane; fabric_service.c's top comment),
 * so a batch's channels are served by several target threads.
 *
 * Done means landed: every WRITE asks for FI_DELIVERY_COMPLETE (and the
 * service only opens providers that grant it in tx op_flags), so its
 * completion means the bytes are in the target's memory, not just handed
 * to a socket. A chunk completes only once all its operations did, so the
 * batch's notification (sent by core when the last chunk completes) always
 * follows the data.
 *
 * Unregistration is a fence (RELIABILITY.md 7, 16): the service closes a
 * region's registrations after the engine's fence, then waits until every
 * lane's progress thread began a new round. verbs and efa NICs stop at the
 * deregistration; shm's target copies inside its progress call, which the
 * wait covers. The IP providers (tcp;ofi_rxm, net) check a key once per
 * operation and copy the rest as it arrives, so there the service first
 * aborts every connection its endpoints accepted (fabric_sockets.c). Each
 * of its initiators then sees its operations fail (FERRY_ESOCKET) with the
 * target up: it fetches the target's table again (the same instance, else
 * the call fails as restarted), fails a chunk whose ranges are gone with
 * FERRY_ENOTREG, and posts one still registered again from its start on a
 * fresh endpoint (renew; at most FABRIC_REPOSTS times a chunk, within the
 * call's deadline). So other peers' operations in flight see a reconnect,
 * not an error. With another rail or a standby transport up, the chunk
 * moves there instead, as for a lost link (core cannot tell them apart). Nothing of the cut
 * connection lands later: the target dropped what it had received, and the old endpoint closes as a
 * reset.
 *
 * Rails: a target with rail_hosts on a provider over the host's IP stack
 * (tcp, net: one domain spans every address of the host) opens one more
 * endpoint per rail host in its one domain, pinned to that address
 * (fabric_service.c), and appends their fi_getname addresses to its
 * descriptor. An initiator's `rails` lists them (named host:port) and
 * rail_open aims a channel at one; core spreads channels over the rails,
 * and chunks are claimed with ferry_batch_claim_on and reported with
 * ferry_batch_settle, so a chunk lost with its rail's link (FERRY_ESOCKET)
 * is moved again on another rail. One domain suffices because a
 * registration belongs to a domain, not an endpoint: every rail reaches a
 * region by the same key, and the region table keeps one key per region.
 *
 * Rails over devices: verbs and efa NICs are each a domain of their own.
 * A target whose fabric_device lists several runs a domain per device
 * (fabric_service.c), registers every region in each, publishes a key per
 * device in the region table (in domain order) and lists each domain's
 * endpoint as rail r, flagged as domains. A channel on rail r then aims at
 * the target's domain r with the r-th key (remote_key), from this engine's
 * domain r mod its device count, whose registrations give the local
 * descriptors.
 *
 * Device memory (RELIABILITY.md 20): registered with the provider where it
 * takes CUDA memory (FI_HMEM, fabric_service.c), it moves like host memory;
 * else a batch with local device memory (and any batch under
 * FERRY_STAGING=always) goes through the staging pipeline, a chunk at a
 * time (the staging section below). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "core/transport.h"
#include "memory/staging.h"
#include "transport/fabric.h"

/* Operations in flight per channel: enough to cover the per-operation
 * latency of the tcp and shm providers at 512 KiB (libfabric.md's baseline
 * uses the same depth). Chunks in flight: as many, for small entries (one
 * operation each). A segment larger than an operation is split. */
#define FABRIC_DEPTH 16
#define FABRIC_SLOTS FABRIC_DEPTH
#define FABRIC_WAIT_MS 10 /* longest sleep on the CQ fd before checking deadline and target */
/* Operations silent this long make the channel ask the target whether
 * their regions are still registered: shm (1.17) drops an operation with
 * a key it no longer knows, without a completion. */
#define FABRIC_STALL_NS (1000 * 1000 * 1000ull)
/* Operations silent this long make the channel check, once per this much,
 * whether the target is gone: the provider does not fail them when it dies
 * (rxm keeps reconnecting until the deadline), but the kernel closes the
 * dead target's control connection at once. A probe after such a close is
 * given at most FABRIC_PROBE_NS; when it cannot conclude (a slow or cut
 * link), the next one waits FABRIC_REPROBE_NS. */
#define FABRIC_GONE_CHECK_NS (1000 * 1000ull)
#define FABRIC_PROBE_NS (250 * 1000 * 1000ull)
#define FABRIC_REPROBE_NS (1000 * 1000 * 1000ull)
/* Times a chunk is posted again after its connection broke while the
 * target stayed up (a deregistration there aborts every connection; the
 * bound keeps a target that keeps cutting from holding a call until its
 * deadline). */
#define FABRIC_REPOSTS 2
/* Bounce buffers a channel keeps registered: every slot of the copiers
 * its stager keeps (staging.c: 4 devices, FERRY_STAGE_SLOTS each). */
#define FABRIC_BOUNCE_MRS (4 * FERRY_STAGE_SLOTS)
/* A staged chunk: a channel has one operation in flight (its pipeline's
 * moves are synchronous), so a batch is cut into chunks of a few slots
 * that its channels (up to tcp_connections) stage side by side. */
#define FABRIC_STAGED_SLICE (4 * FERRY_STAGE_SLOT)

typedef struct fabric_slot {
  ferry_chunk chunk;
  uint32_t posted, done, planned; /* operations; planned drops when posting stops */
  uint32_t seg;                   /* where the next operation starts */
  uint64_t seg_off;
  int active;
  int repost;       /* lost to a target's abort: posted again from the start on a fresh endpoint */
  unsigned reposts; /* times so far (at most FABRIC_REPOSTS) */
  ferry_status st;
  char detail[FERRY_ERROR_MAX];
} fabric_slot;

typedef struct fabric_channel {
  ferry_channel base;
  ferry_fabric *fabric;
  unsigned dom;    /* this engine's domain its endpoint is in */
  unsigned key_at; /* which of the target's keys per region: its domain's */
  struct fid_av *av;
  struct fid_cq *cq;
  struct fid_ep *ep;
  int cq_fd, wake_fd;
  int stopping;
  int virt_addr; /* the target addresses its registrations virtually */
  int local_mr;  /* the provider needs a descriptor for local buffers */
  size_t op_max; /* bytes per operation */
  fi_addr_t dest;
  uint8_t dest_addr[FERRY_FABRIC_ADDR_MAX]; /* the target endpoint's fi_getname */
  size_t dest_addr_len;
  int renew;           /* slots wait to be posted again on a fresh endpoint (repost) */
  uint64_t renewed_ns; /* when a fresh endpoint replaced a cut one; 0 once it completed */
  int outcome_known;   /* the batch failed on another channel: this turn ends */
  uint64_t refused_ns; /* since when the provider refuses every post with nothing in flight */
  struct sockaddr_storage dest_ip; /* the target endpoint's address on an IP provider */
  socklen_t dest_ip_len;           /* 0: not one */
  int orphaned;                    /* abandoned with operations in flight */
  char address[FERRY_HOST_MAX + 8];
  ferry_batch *batch;   /* being driven */
  uint64_t progress_ns; /* when an operation last completed, or the drive began */
  uint64_t check_ns;    /* when target_gone may look again */
  unsigned idle;        /* empty waits in a row without a wait fd (ferry_fabric_backoff) */
  ferry_status first;
  unsigned inflight, active;
  fabric_slot *posting; /* the slot with operations left to post */
  uint32_t *wake_map;   /* shm: the target's wake page, and its lane's word */
  uint32_t *sleep_word;
  fabric_slot slots[FABRIC_SLOTS];
  /* Staging (a batch with device memory the provider cannot register, or
   * FERRY_STAGING=always): the pipeline, where each range lives, and the
   * bounce buffers' registrations with the provider (oldest first). */
  ferry_stager *stager;
  ferry_stage_range ranges[FERRY_CHUNK_MAX_SEGMENTS];
  struct {
    void *buf;
    struct fid_mr *mr;
  } bounce[FABRIC_BOUNCE_MRS];
  int staged_op; /* the context of the one staged operation in flight */
} fabric_channel;

/* ---- choosing ------------------------------------------------------------------------- */

static const ferry_wire_descriptor *
peer_descriptor(const ferry_hello_reply *info, ferry_fabric_descriptor *d, char *why, size_t size) {
  const ferry_wire_descriptor *w = ferry_wire_descriptor_find(info, FERRY_TRANSPORT_FABRIC);
  if (!w)
    return snprintf(why, size, "the peer describes no fabric endpoint"), NULL;
  return ferry_fabric_descriptor_decode(w->data, w->len, d, why, size) ? w : NULL;
}

/* Whether libfabric accepts the peer's address, tried in an AV of its own
 * that no endpoint is bound to. Not domain 0's, which the lanes' endpoints
 * are bound to: after an insert 1.17's shm divides, for each endpoint bound
 * to the AV, by the AV's peer count, without its lock, so another thread's
 * probe removing its entry meanwhile made that a division by zero (SIGFPE
 * in many_threads_one_engine; RELIABILITY.md 16). */
static int probe_address(ferry_fabric *f, const ferry_fabric_descriptor *d, char *why,
                         size_t size) {
  struct fi_av_attr attr = {.type = FI_AV_TABLE, .count = 1};
  struct fid_av *av = NULL;
  fi_addr_t probe;
  int rc = fi_av_open(f->domains[0].domain, &attr, &av, NULL);
  if (rc)
    return snprintf(why, size, "fi_av_open for its address: %s", ferry_fi.strerror(-rc)), 0;
  int ok = fi_av_insert(av, d->addr, 1, &probe, 0, NULL) == 1;
  fi_close(&av->fid);
  if (!ok)
    snprintf(why, size, "libfabric refuses its address (%zu bytes)", d->addr_len);
  return ok;
}

/* Same provider and fabric (IP providers: any subnet, routing decides), an
 * address libfabric accepts, and for shm the same host. The descriptor is untrusted input: decoded
 * with every length checked, then only compared and handed to fi_av_insert. */
static int fabric_usable(ferry_engine *e, const ferry_hello_reply *info, char *why, size_t size) {
  ferry_fabric *f = e->fabric;
  ferry_fabric_descriptor d;
  if (!f)
    return snprintf(why, size, "fabric is off here"), 0;
  if (!peer_descriptor(info, &d, why, size))
    return 0;
  if (strcmp(d.provider, f->self.provider) != 0)
    return snprintf(why, size, "the peer uses provider %s, this engine %s", d.provider,
                    f->self.provider),
           0;
  if (!ferry_fabric_is_host_ip(f->info) && strcmp(d.fabric, f->self.fabric) != 0)
    return snprintf(why, size, "the peer is on fabric %s, this engine on %s", d.fabric,
                    f->self.fabric),
           0;
  if (!strcmp(d.provider, "shm") && memcmp(info->boot_id, e->boot_id, sizeof e->boot_id) != 0)
    return snprintf(why, size, "shm reaches only this host (boot ids differ)"), 0;
  return probe_address(f, &d, why, size);
}

/* Whether b moves through the staging pipeline (the staging section). */
static int staged_batch(const ferry_fabric *f, const ferry_batch *b) {
  if (b->engine->cfg.staging == FERRY_STAGING_ALWAYS)
    return 1;
  return (b->needs & FERRY_NEEDS_DEVICE_MEMORY) && !__atomic_load_n(&f->hmem, __ATOMIC_ACQUIRE);
}

/* Bytes per operation: the engine's slice size, within what the provider
 * takes in one message. */
static size_t op_size(const ferry_engine *e) {
  size_t slice = e->cfg.slice_size;
  size_t max = e->fabric ? e->fabric->info->ep_attr->max_msg_size : slice;
  return slice < max ? slice : max;
}

/* A slice is at least FABRIC_DEPTH operations: it sets how many channels
 * drive a batch (one per slice, up to tcp_connections; batch.c), so one
 * channel keeps an 8 MiB batch's operations in flight on its own. And a
 * batch gets no more channels than CPUs (at least 2, which rails and lanes
 * share): on a software provider each channel's thread and the target
 * lane it feeds copy bytes, so more only take CPUs from each other (32 x
 * 16 MiB on 2 vCPUs: 3.6-3.8 GB/s with 4 channels, 5.0-5.2 with 1 or 2),
 * and a NIC's host has CPUs to spare. A channel claims less
 * (claim_slot): what it can post now. */
static size_t fabric_slice(const ferry_batch *b) {
  const ferry_fabric *f = b->engine->fabric;
  if (f && staged_batch(f, b))
    return FABRIC_STAGED_SLICE;
  unsigned drivers = f && f->cpus > 2 ? f->cpus : 2;
  size_t depth = FABRIC_DEPTH * op_size(b->engine);
  uint64_t per_driver = b->total_bytes / drivers + 1;
  return per_driver > depth ? (size_t)per_driver : depth;
}

/* ---- channels ------------------------------------------------------------------------- */

static ferry_status channel_step(fabric_channel *ch, const char *what, int rc) {
  if (rc == 0)
    return FERRY_OK;
  return ferry_fail(FERRY_ETRANSPORT, "fabric channel to %s: %s failed: %s", ch->address, what,
                    ferry_fi.strerror(rc < 0 ? -rc : rc));
}

/* Makes the provider's close of an abandoned channel a reset. Its WRITEs
 * may still sit in a socket's send queue (the link was down), and the
 * tcp and net providers close their sockets gracefully, so the kernel
 * would deliver them once the link is back, after the caller was told
 * they failed and perhaps wrote the range again. libfabric offers no way
 * to abort a connection, so every socket of this process connected to the
 * target endpoint gets SO_LINGER 0: closed, it sends a reset and drops
 * what it still queued. Sockets of other channels to the same endpoint
 * only close that way too, later, with nothing queued (their operations
 * completed; a completion means landed). A descriptor that another thread
 * closes and reuses between the check and setsockopt would get the option
 * too, and close with a reset: a window of two system calls. */
static void reset_if_to(int fd, void *arg) {
  const fabric_channel *ch = arg;
  struct sockaddr_storage peer;
  socklen_t len = sizeof peer;
  if (getpeername(fd, (struct sockaddr *)&peer, &len) != 0 ||
      !ferry_fabric_same_endpoint(&peer, &ch->dest_ip))
    return;
  struct linger reset = {.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
}

static void reset_on_close(fabric_channel *ch) {
  if (ferry_fabric_each_socket(reset_if_to, ch) != 0)
    FERRY_WARN("fabric channel to %s: cannot list /proc/self/fd (%s): its abandoned WRITEs "
               "may still land",
               ch->address, strerror(errno));
}

/* Closes the bounce buffers' registrations (after the endpoint that
 * used them). */
static void bounce_close(fabric_channel *ch) {
  for (unsigned i = 0; i < FABRIC_BOUNCE_MRS; i++)
    if (ch->bounce[i].mr)
      fi_close(&ch->bounce[i].mr->fid);
  memset(ch->bounce, 0, sizeof ch->bounce);
}

static void close_endpoint(fabric_channel *ch) {
  struct fid *fids[] = {ch->ep ? &ch->ep->fid : NULL, ch->cq ? &ch->cq->fid : NULL,
                        ch->av ? &ch->av->fid : NULL};
  for (size_t i = 0; i < sizeof fids / sizeof *fids; i++)
    if (fids[i])
      fi_close(fids[i]); /* the endpoint first: it cancels what is still in flight */
  bounce_close(ch);
  ch->ep = NULL;
  ch->cq = NULL;
  ch->av = NULL;
  ch->cq_fd = -1;
}

static void fabric_close(ferry_channel *base) {
  fabric_channel *ch = (fabric_channel *)base;
  if (ch->orphaned && ch->dest_ip_len)
    reset_on_close(ch);
  close_endpoint(ch);
  ferry_stager_destroy(ch->stager); /* its buffers: after the endpoint that used them */
  if (ch->wake_fd >= 0)
    close(ch->wake_fd);
  ferry_fabric_wake_unmap(ch->wake_map);
  free(ch);
}

static ferry_status open_endpoint(fabric_channel *ch) {
  const ferry_fabric_domain *dom = &ch->fabric->domains[ch->dom];
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = 1};
  ferry_status st =
      channel_step(ch, "fi_av_open", fi_av_open(dom->domain, &av_attr, &ch->av, NULL));
  if (!st)
    st = channel_step(ch, "fi_cq_open", ferry_fabric_cq_open(dom->domain, &ch->cq, &ch->cq_fd));
  if (!st)
    st = channel_step(ch, "fi_endpoint", fi_endpoint(dom->domain, dom->info, &ch->ep, NULL));
  if (!st)
    st = channel_step(ch, "fi_ep_bind(av)", fi_ep_bind(ch->ep, &ch->av->fid, 0));
  if (!st)
    st =
        channel_step(ch, "fi_ep_bind(cq)", fi_ep_bind(ch->ep, &ch->cq->fid, FI_TRANSMIT | FI_RECV));
  if (!st)
    st = channel_step(ch, "fi_enable", fi_enable(ch->ep));
  if (!st && fi_av_insert(ch->av, ch->dest_addr, 1, &ch->dest, 0, NULL) != 1)
    st = ferry_fail(FERRY_ETRANSPORT, "fabric channel to %s: fi_av_insert refused its address",
                    ch->address);
  return st;
}

/* A rail's name: its address as host:port where it is an IP one. */
static void rail_name(const uint8_t *addr, size_t len, unsigned r, char *out) {
  char host[INET6_ADDRSTRLEN] = "";
  sa_family_t family = 0;
  if (len >= sizeof family)
    memcpy(&family, addr, sizeof family);
  struct sockaddr_in in4;
  struct sockaddr_in6 in6;
  if (family == AF_INET && len >= sizeof in4) {
    memcpy(&in4, addr, sizeof in4);
    inet_ntop(AF_INET, &in4.sin_addr, host, sizeof host);
    snprintf(out, FERRY_RAIL_NAME_MAX, "%s:%u", host, ntohs(in4.sin_port));
  } else if (family == AF_INET6 && len >= sizeof in6) {
    memcpy(&in6, addr, sizeof in6);
    inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof host);
    snprintf(out, FERRY_RAIL_NAME_MAX, "[%s]:%u", host, ntohs(in6.sin6_port));
  } else {
    snprintf(out, FERRY_RAIL_NAME_MAX, "fabric rail %u", r);
  }
}

/* The peer's rail endpoints from its descriptor (none: one rail, its main
 * endpoint). */
static unsigned fabric_rails(const ferry_hello_reply *info, char names[][FERRY_RAIL_NAME_MAX],
                             unsigned max) {
  ferry_fabric_descriptor d;
  char why[160];
  if (!peer_descriptor(info, &d, why, sizeof why))
    return 0;
  unsigned n = d.rail_count < max ? d.rail_count : max;
  for (unsigned r = 0; r < n; r++)
    rail_name(d.rail_addr[r], d.rail_addr_len[r], r, names[r]);
  return n;
}

/* Aims d at the endpoint of the rail named `rail` (NULL: the main one,
 * rail 0), setting *index to the rail's. */
static int pick_rail(ferry_fabric_descriptor *d, const char *rail, unsigned *index, char *why,
                     size_t size) {
  *index = 0;
  for (unsigned r = 0; rail && r < d->rail_count; r++) {
    char name[FERRY_RAIL_NAME_MAX];
    rail_name(d->rail_addr[r], d->rail_addr_len[r], r, name);
    if (!strcmp(name, rail)) {
      memcpy(d->addr, d->rail_addr[r], d->rail_addr_len[r]);
      d->addr_len = d->rail_addr_len[r];
      *index = r;
      return 1;
    }
  }
  return rail ? (snprintf(why, size, "it lists no rail %s", rail), 0) : 1;
}

/* Aims d at the next of the peer's lanes (round robin over this engine's
 * channels), so that the target's progress threads share the work;
 * returns the lane. */
static unsigned pick_lane(ferry_fabric *f, ferry_fabric_descriptor *d) {
  if (!d->lane_count)
    return 0;
  unsigned lane = __atomic_fetch_add(&f->next_lane, 1, __ATOMIC_RELAXED) % (d->lane_count + 1);
  if (lane) {
    memcpy(d->addr, d->lane_addr[lane - 1], d->lane_addr_len[lane - 1]);
    d->addr_len = d->lane_addr_len[lane - 1];
  }
  return lane;
}

/* The target lane's wake word where it has one (shm, fabric_wake.c; the
 * page is named after the target's main address, path). */
static void map_wake(fabric_channel *ch, const char *path, unsigned lane) {
  ch->wake_map = ferry_fabric_wake_map(path, 0);
  if (ch->wake_map)
    ch->sleep_word = ch->wake_map + lane * FERRY_FABRIC_WAKE_STRIDE;
  else
    FERRY_DEBUG("fabric channel to %s: no wake page %s (%s): its idle target polls", ch->address,
                path, strerror(errno));
}

static ferry_status open_on(ferry_peer *p, const char *rail, uint64_t deadline_ns,
                            ferry_channel **out) {
  ferry_fabric *f = p->engine->fabric;
  ferry_fabric_descriptor d;
  char why[160];
  pthread_mutex_lock(&p->lock);
  uint64_t instance = p->info.engine_id;
  unsigned r = 0;
  int ok = f && p->known && peer_descriptor(&p->info, &d, why, sizeof why) &&
           pick_rail(&d, rail, &r, why, sizeof why);
  pthread_mutex_unlock(&p->lock);
  if (!ok)
    return ferry_fail(FERRY_ETRANSPORT, "fabric channel to %s: %s", p->address,
                      f ? why : "fabric is off here");
  fabric_channel *ch = calloc(1, sizeof *ch);
  if (!ch)
    return ferry_fail(FERRY_ENOMEM, "no memory for a fabric channel to %s", p->address);
  snprintf(ch->address, sizeof ch->address, "%s", p->address);
  char wake[FERRY_FABRIC_WAKE_PATH_MAX];
  int has_wake = ferry_fabric_wake_path(&d, wake, sizeof wake); /* before d aims at a lane */
  unsigned lane = rail ? 0 : pick_lane(f, &d);
  if (has_wake)
    map_wake(ch, wake, lane);
  ch->base.transport = &ferry_transport_fabric;
  ch->base.peer = p;
  ch->base.peer_instance = instance;
  ch->fabric = f;
  if (d.domain_rails) { /* rail r: the target's domain r, from ours r (mod how many) */
    ch->key_at = r;
    ch->dom = r % f->domain_count;
  }
  ch->cq_fd = -1;
  ch->virt_addr = d.virt_addr;
  memcpy(ch->dest_addr, d.addr, d.addr_len);
  ch->dest_addr_len = d.addr_len;
  if (ferry_fabric_is_host_ip(f->info))
    ch->dest_ip_len = ferry_fabric_ip_endpoint(d.addr, d.addr_len, &ch->dest_ip);
  ch->op_max = op_size(p->engine);
  ch->local_mr = (f->info->domain_attr->mr_mode & FI_MR_LOCAL) || (f->info->mode & FI_LOCAL_MR);
  if (rail)
    snprintf(ch->address, sizeof ch->address, "%.190s (rail %.60s)", p->address, rail);
  ch->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ferry_status st = ch->wake_fd < 0 ? ferry_fail_errno(FERRY_ETRANSPORT, errno,
                                                       "fabric channel to %s: eventfd", p->address)
                                    : open_endpoint(ch);
  if (st) {
    fabric_close(&ch->base);
    return st;
  }
  FERRY_DEBUG("opened fabric channel to %s (%s, domain %s)", ch->address, d.provider, d.domain);
  *out = &ch->base;
  return FERRY_OK;
}

static ferry_status fabric_open(ferry_peer *p, uint64_t deadline_ns, ferry_channel **out) {
  return open_on(p, NULL, deadline_ns, out);
}

static ferry_status fabric_rail_open(ferry_peer *p, const char *rail, uint64_t deadline_ns,
                                     ferry_channel **out) {
  return open_on(p, rail, deadline_ns, out);
}

/* ---- completing ----------------------------------------------------------------------- */

static void slot_error(fabric_slot *s, ferry_status st) {
  if (s->st)
    return;
  s->st = st;
  snprintf(s->detail, sizeof s->detail, "%s", ferry_last_error());
}

static void slot_finish(fabric_channel *ch, fabric_slot *s) {
  if (s->st)
    ferry_fail(s->st, "%s", s->detail); /* the batch takes the thread's detail */
  ferry_stats_moved(ch->base.peer, ch->base.transport, &s->chunk, s->st);
  ferry_batch_settle(ch->batch, &ch->base, &s->chunk, s->st); /* ESOCKET: another rail */
  if (s->st && !ch->first)
    ch->first = s->st;
  s->active = 0;
  ch->active--;
}

static void op_done(fabric_channel *ch, fabric_slot *s) {
  s->done++;
  ch->inflight--;
  if (s->done == s->planned && !s->repost)
    slot_finish(ch, s);
}

/* No more operations of s are posted (it failed). */
static void stop_posting(fabric_channel *ch, fabric_slot *s) {
  s->planned = s->posted;
  if (ch->posting == s)
    ch->posting = NULL;
  if (s->done == s->planned && !s->repost)
    slot_finish(ch, s);
}

/* What a failed operation means for the caller. A key the target no
 * longer holds (unregistered after this engine fetched its table) is
 * FERRY_ENOTREG, as over tcp; the tcp provider reports it as a canceled
 * operation with the target's ENOENT. A link that went away reads as a
 * socket error, so the caller reconnects; anything else is the target's
 * failure. */
static ferry_status cq_status(const struct fi_cq_err_entry *err) {
  switch (err->err) {
  case FI_EACCES:
  case FI_EKEYREJECTED: return FERRY_ENOTREG;
  case FI_ECANCELED:
    return err->prov_errno == ENOENT || err->prov_errno == EACCES ? FERRY_ENOTREG : FERRY_ESOCKET;
  case FI_ECONNREFUSED:
  case FI_ECONNRESET:
  case FI_ECONNABORTED:
  case FI_ENOTCONN:
  case FI_EHOSTUNREACH: return FERRY_ESOCKET;
  default: return FERRY_EREMOTE;
  }
}

static uint64_t key_of(const uint8_t *bytes) {
  uint64_t key = 0;
  for (int b = FERRY_FABRIC_KEY_SIZE - 1; b >= 0; b--)
    key = key << 8 | bytes[b];
  return key;
}

/* The key of the peer's cached region holding [addr, addr+length) for
 * this channel's target domain (one key per domain in the table), and the
 * region's start; 0 when the table has no such region or key. */
static int remote_key(fabric_channel *ch, uint64_t addr, uint64_t length, uint64_t *key,
                      uint64_t *base) {
  uint8_t keys[FERRY_WIRE_MAX_KEY];
  size_t n = ferry_peer_region_key(ch->base.peer, FERRY_TRANSPORT_FABRIC, addr, length, keys,
                                   sizeof keys, base);
  size_t at = (size_t)ch->key_at * FERRY_FABRIC_KEY_SIZE;
  if (n % FERRY_FABRIC_KEY_SIZE || n < at + FERRY_FABRIC_KEY_SIZE)
    return 0;
  *key = key_of(keys + at);
  return 1;
}

/* FERRY_ENOTREG (detail set) when the cached table no longer holds a
 * remote range of s. */
static ferry_status unregistered(fabric_channel *ch, const fabric_slot *s) {
  uint64_t key, base;
  for (uint32_t i = 0; i < s->chunk.count; i++) {
    const ferry_region *r = &s->chunk.remote[i];
    if (!remote_key(ch, r->addr, r->length, &key, &base))
      return ferry_fail(FERRY_ENOTREG,
                        "fabric %s to %s: remote address 0x%llx (+%llu bytes) not registered "
                        "there any more",
                        s->chunk.op == FERRY_OP_WRITE ? "WRITE" : "READ", ch->address,
                        (unsigned long long)r->addr, (unsigned long long)r->length);
  }
  return FERRY_OK;
}

/* After a failure or stall: FERRY_ENOTREG (detail set) when the target's
 * fresh table no longer holds a remote range of s, else FERRY_OK (also when
 * the table cannot be fetched: the failure stands as it is; *fetched says
 * whether it was). */
static ferry_status gone_remote(fabric_channel *ch, const fabric_slot *s, int *fetched) {
  ferry_region span = s->chunk.remote[0]; /* one span covering the chunk's ranges */
  uint64_t end = span.addr + span.length;
  for (uint32_t i = 1; i < s->chunk.count; i++) {
    const ferry_region *r = &s->chunk.remote[i];
    span.addr = r->addr < span.addr ? r->addr : span.addr;
    end = r->addr + r->length > end ? r->addr + r->length : end;
  }
  span.length = end - span.addr;
  *fetched =
      ferry_peer_refresh_regions(ch->base.peer, &span, 1, ch->batch->deadline_ns) == FERRY_OK;
  return *fetched ? unregistered(ch, s) : FERRY_OK;
}

/* Nonzero once the peer's facts name another instance than the one this
 * channel was opened to. */
static int target_restarted(fabric_channel *ch) {
  ferry_peer *p = ch->base.peer;
  pthread_mutex_lock(&p->lock);
  int restarted = p->info.engine_id != ch->base.peer_instance;
  pthread_mutex_unlock(&p->lock);
  return restarted;
}

/* Whether s, whose operation failed with st (detail set), moves again on a
 * fresh endpoint: its connection broke (FERRY_ESOCKET) while the target
 * stayed up, the same instance, and still holds its ranges, and no other
 * rail or standby transport can take it (then core moves it there, as for
 * a lost link: the cut cannot be told from one). A target
 * aborts every accepted connection when it unregisters memory on the IP
 * providers (fabric_sockets.c), and what it aborted can never land
 * later: it dropped the bytes it had received, and the endpoint this
 * channel leaves closes as a reset (renew). The table is fetched for each
 * failed operation: a fetch also notices a restart (a new instance), which
 * a cached answer would hide. */
static int moves_again(fabric_channel *ch, fabric_slot *s, ferry_status *st) {
  int fetched;
  char detail[FERRY_ERROR_MAX];
  snprintf(detail, sizeof detail, "%s", ferry_last_error());
  ferry_status gone = gone_remote(ch, s, &fetched);
  if (target_restarted(ch)) {
    *st = ferry_fail(FERRY_ESOCKET, "%s; %s restarted meanwhile", detail, ch->address);
    return 0;
  }
  if (gone) {
    *st = FERRY_ENOTREG;
    return 0;
  }
  /* A refused key while the fresh table holds every range: the refusal
   * was the connection's (a cut's operations can come back so on
   * tcp;ofi_rxm), or of a key the target replaced by registering again,
   * and a repost takes the table's. A refused key when the target cannot
   * be asked: a killed target's provider cancels its operations so too, so
   * the link's failure is all that is known. */
  int held = fetched && *st == FERRY_ENOTREG, unasked = !fetched && *st == FERRY_ENOTREG;
  *st = held || unasked ? FERRY_ESOCKET : *st;
  ferry_fail(*st, "%s%s", detail,
             held      ? "; the target still holds that range"
             : unasked ? "; the target did not answer whether it still holds that range (it may "
                         "have exited)"
                       : "");
  return fetched && *st == FERRY_ESOCKET && !s->st && s->reposts < FABRIC_REPOSTS &&
         !ferry_peer_can_fail_over(ch->base.peer, &ch->base);
}

static void op_failed(fabric_channel *ch, const struct fi_cq_err_entry *err) {
  fabric_slot *s = err->op_context;
  char prov[128] = "";
  const char *text = fi_cq_strerror(ch->cq, err->prov_errno, err->err_data, prov, sizeof prov);
  ferry_status st = cq_status(err);
  ferry_fail(st, "fabric %s of %llu bytes to %s failed: %s%s (provider %s: %s)",
             s->chunk.op == FERRY_OP_WRITE ? "WRITE" : "READ", (unsigned long long)s->chunk.bytes,
             ch->address, ferry_fi.strerror(err->err),
             st == FERRY_ENOTREG ? ": remote address not registered" : "",
             ch->fabric->self.provider, text ? text : "no detail");
  ch->base.broken = 1; /* the provider may have dropped the link: a fresh one next time */
  /* The target may have dropped the link over a key it no longer holds, or
   * a new instance on its address refuses the old one's keys: the refreshed
   * table (its control connection notices a restart) tells which. */
  if (s->repost) {
    /* already waiting to move again: another of its operations cut */
  } else if ((st == FERRY_ESOCKET || st == FERRY_ENOTREG) && moves_again(ch, s, &st)) {
    FERRY_DEBUG("%s: posted again on a fresh endpoint", ferry_last_error());
    s->repost = 1;
    s->reposts++;
    ch->renew = 1;
  } else {
    slot_error(s, st);
  }
  stop_posting(ch, s);
  op_done(ch, s);
}

/* An error completion that names no operation (libfabric 1.17's shm
 * provider reports an RMA its target refused so): which chunk failed is
 * unknown, so the channel ends with every one in flight (-1 to reap). */
static int unnamed_failure(fabric_channel *ch, const struct fi_cq_err_entry *err) {
  int code = err->err < 0 ? -err->err : err->err;
  ferry_fail(FERRY_ETRANSPORT,
             "fabric transfer to %s: provider %s failed an operation without saying which "
             "(%s, provider error %d): the channel's operations in flight are abandoned",
             ch->address, ch->fabric->self.provider, ferry_fi.strerror(code), err->prov_errno);
  return -1;
}

/* Reads completions: how many, 0 for none, -1 when the CQ itself failed
 * or the channel cannot go on. */
static int reap(fabric_channel *ch) {
  struct fi_cq_entry done[FABRIC_DEPTH];
  if (ch->sleep_word) /* the target lane serves only when awake */
    ferry_fabric_nudge(ch->sleep_word);
  ssize_t n = fi_cq_read(ch->cq, done, FABRIC_DEPTH);
  for (ssize_t i = 0; i < n; i++)
    op_done(ch, done[i].op_context);
  if (n > 0) {
    ch->progress_ns = ferry_now_ns();
    ch->renewed_ns = 0;
    ch->idle = 0;
  }
  if (n >= 0 || n == -FI_EAGAIN)
    return n > 0 ? (int)n : 0;
  struct fi_cq_err_entry err = {0};
  if (n == -FI_EAVAIL && fi_cq_readerr(ch->cq, &err, 0) == 1) {
    if (!err.op_context)
      return unnamed_failure(ch, &err);
    op_failed(ch, &err);
    return 1;
  }
  ferry_fail(FERRY_ETRANSPORT, "fabric channel to %s: fi_cq_read: %s", ch->address,
             ferry_fi.strerror((int)-n));
  return -1;
}

/* Why the channel cannot go on waiting, or FERRY_OK. A fresh endpoint
 * that completed nothing within connect_timeout_ms of renew cannot reach
 * the target (its link or listener is gone, not just the old connection):
 * its chunks then fail as on a lost link instead of at the deadline. Its
 * first completion took up to 271 ms (median 71) in test_fabric_fence
 * beside two CPU burners, 16 operations of 512 KiB in flight on each of 4
 * channels: the connection it must make is most of that. Once the batch
 * failed on another channel, this one's operations cannot change the
 * outcome, and the call returns only when they end: they are abandoned
 * (a channel opened after its target's endpoint died would hold the call
 * until the deadline). */
static ferry_status wait_status(fabric_channel *ch) {
  if (__atomic_load_n(&ch->stopping, __ATOMIC_ACQUIRE))
    return ferry_fail(FERRY_ECLOSED, "fabric transfer to %s ended by shutdown", ch->address);
  ferry_status failed = ferry_batch_error(ch->batch);
  ch->outcome_known = failed != FERRY_OK;
  if (failed) /* the call returns once this channel's operations end too */
    return ferry_fail(failed, "fabric transfer to %s: the batch failed on another channel",
                      ch->address);
  uint32_t renew_ms = ch->base.peer->engine->cfg.connect_timeout_ms;
  if (ch->renewed_ns && ferry_now_ns() - ch->renewed_ns >= renew_ms * 1000000ull)
    return ferry_fail(FERRY_ESOCKET,
                      "fabric transfer to %s: its connection broke, and a fresh endpoint "
                      "completed nothing in %u ms (connect_timeout_ms)",
                      ch->address, renew_ms);
  if (ferry_now_ns() >= ch->batch->deadline_ns)
    return ferry_fail(FERRY_ETIMEDOUT,
                      "fabric transfer to %s: no completion by the deadline (%u operations in "
                      "flight)",
                      ch->address, ch->inflight);
  return FERRY_OK;
}

/* FERRY_ESOCKET once the provider refused every post for connect_timeout_ms
 * with nothing in flight while another rail or standby transport could
 * take the chunk: rxm keeps trying to connect to an endpoint whose
 * listener is gone (a rail whose device or address died) and would hold
 * the chunk until the call's deadline; as a lost link it moves to the
 * other rail. A peer with nowhere else to go keeps the deadline (a
 * stopped target must time out, not fail). */
static ferry_status unconnected(fabric_channel *ch) {
  uint64_t now = ferry_now_ns(), bound = ch->base.peer->engine->cfg.connect_timeout_ms * 1000000ull;
  if (ch->inflight || !ch->refused_ns) {
    ch->refused_ns = ch->inflight ? 0 : now;
    return FERRY_OK;
  }
  if (now - ch->refused_ns < bound || !ferry_peer_can_fail_over(ch->base.peer, &ch->base))
    return FERRY_OK;
  return ferry_fail(FERRY_ESOCKET,
                    "fabric transfer to %s: the provider took no operation for %u ms with none "
                    "in flight (its connection is not being made)",
                    ch->address, ch->base.peer->engine->cfg.connect_timeout_ms);
}

/* Sleeps on the CQ's fd (after fi_trywait: the provider may need to be
 * progressed first) or, without one, polls with backoff. A provider whose
 * trywait keeps failing with nothing to complete (rxm reconnecting to a
 * dead target) is polled with the same backoff instead of spun on. */
static void wait_cq(fabric_channel *ch) {
  struct fid *fids[] = {&ch->cq->fid};
  struct fid_fabric *fabric = ch->fabric->domains[ch->dom].fabric;
  if (ch->cq_fd < 0 || fi_trywait(fabric, fids, 1) != FI_SUCCESS) {
    ferry_fabric_backoff(&ch->idle, ch->wake_fd);
    return;
  }
  uint64_t left_ms = (ch->batch->deadline_ns - ferry_now_ns()) / 1000000 + 1;
  struct pollfd p[2] = {{.fd = ch->cq_fd, .events = POLLIN}, {.fd = ch->wake_fd, .events = POLLIN}};
  poll(p, 2, left_ms < FABRIC_WAIT_MS ? (int)left_ms : FABRIC_WAIT_MS);
}

/* Operations silent for FABRIC_STALL_NS: FERRY_ENOTREG if one aims at a
 * range the target unregistered meanwhile. */
static ferry_status stalled(fabric_channel *ch) {
  if (ferry_now_ns() - ch->progress_ns < FABRIC_STALL_NS)
    return FERRY_OK;
  ch->progress_ns = ferry_now_ns();
  int fetched;
  for (size_t i = 0; i < FABRIC_SLOTS; i++)
    if (ch->slots[i].active && gone_remote(ch, &ch->slots[i], &fetched))
      return FERRY_ENOTREG;
  return FERRY_OK;
}

/* FERRY_ESOCKET when the target is gone or restarted: the target closed
 * its control connection and connecting again failed, or met a new
 * instance. The provider does not say so: rxm keeps reconnecting to a
 * dead target until the deadline. Looks only after FABRIC_GONE_CHECK_NS
 * without a completion, and leaves a passed deadline to wait_status. */
static ferry_status target_gone(fabric_channel *ch) {
  uint64_t now = ferry_now_ns();
  if (now - ch->progress_ns < FABRIC_GONE_CHECK_NS || now < ch->check_ns ||
      now >= ch->batch->deadline_ns)
    return FERRY_OK;
  ch->check_ns = now + FABRIC_GONE_CHECK_NS;
  ferry_peer *p = ch->base.peer;
  if (!ferry_peer_control_hangup(p))
    return FERRY_OK;
  uint64_t deadline = now + FABRIC_PROBE_NS;
  ferry_status st =
      ferry_peer_ping(p, deadline < ch->batch->deadline_ns ? deadline : ch->batch->deadline_ns);
  if (st == FERRY_ECLOSED)
    return st;
  if (st == FERRY_ESOCKET)
    return ferry_fail(FERRY_ESOCKET,
                      "fabric transfer to %s: the target is gone (it closed its control "
                      "connection, and connecting again failed: %s)",
                      ch->address, ferry_last_error());
  if (!st && target_restarted(ch))
    return ferry_fail(FERRY_ESOCKET, "fabric transfer to %s: the target restarted meanwhile",
                      ch->address);
  if (st) /* inconclusive (a slow or cut link): the deadline decides */
    ch->check_ns = ferry_now_ns() + FABRIC_REPROBE_NS;
  return FERRY_OK;
}

/* Until at least one completion came; an error when the wait must end. */
static ferry_status await(fabric_channel *ch) {
  for (;;) {
    int n = reap(ch);
    if (n)
      return n < 0 ? FERRY_ETRANSPORT : FERRY_OK;
    ferry_status st = wait_status(ch);
    if (!st)
      st = stalled(ch);
    if (!st)
      st = target_gone(ch);
    if (st)
      return st;
    wait_cq(ch);
  }
}

/* Ends every chunk in flight with st; the channel is closed afterwards,
 * which cancels their operations (fi_close of the endpoint). */
static void abandon(fabric_channel *ch, ferry_status st) {
  char detail[FERRY_ERROR_MAX];
  snprintf(detail, sizeof detail, "%s", ferry_last_error());
  ch->base.broken = 1;
  ch->posting = NULL;
  ch->orphaned |= ch->inflight > 0;
  for (size_t i = 0; i < FABRIC_SLOTS; i++) {
    fabric_slot *s = &ch->slots[i];
    if (!s->active)
      continue;
    ferry_fail(st, "%s", detail);
    slot_error(s, st);
    slot_finish(ch, s);
  }
  ch->inflight = 0;
}

/* ---- posting -------------------------------------------------------------------------- */

/* The peer's key and address for a remote segment, and the local
 * descriptor. */
static ferry_status remote_iov(fabric_channel *ch, const ferry_region *remote,
                               struct fi_rma_iov *rma) {
  uint64_t key, base;
  if (!remote_key(ch, remote->addr, remote->length, &key, &base))
    return ferry_fail(FERRY_ENOTREG,
                      "remote address 0x%llx (+%llu bytes) is not registered at %s (no fabric "
                      "key for its domain in its table)",
                      (unsigned long long)remote->addr, (unsigned long long)remote->length,
                      ch->address);
  *rma = (struct fi_rma_iov){.addr = ch->virt_addr ? remote->addr : remote->addr - base,
                             .len = remote->length,
                             .key = key};
  return FERRY_OK;
}

static ferry_status target_of(fabric_channel *ch, const struct iovec *local,
                              const ferry_region *remote, struct fi_rma_iov *rma, void **desc) {
  ferry_status st = remote_iov(ch, remote, rma);
  if (st)
    return st;
  if (!ferry_fabric_local_desc(ch->fabric, ch->dom, local->iov_base, local->iov_len, desc) &&
      ch->local_mr)
    return ferry_fail(FERRY_ENOTREG,
                      "local buffer %p (+%zu bytes) is not registered with this engine, and "
                      "provider %s needs it to be",
                      local->iov_base, local->iov_len, ch->fabric->self.provider);
  return FERRY_OK;
}

/* Posts operation s->posted, progressing the CQ while the provider answers
 * -FI_EAGAIN (it does for the first operations, while it connects, and
 * whenever its queues are full). */
static ferry_status post_one(fabric_channel *ch, fabric_slot *s) {
  const struct iovec *seg = &s->chunk.local[s->seg];
  size_t len = seg->iov_len - s->seg_off < ch->op_max ? seg->iov_len - s->seg_off : ch->op_max;
  struct iovec local[1] = {{(char *)seg->iov_base + s->seg_off, len}};
  ferry_region remote = {s->chunk.remote[s->seg].addr + s->seg_off, len};
  struct fi_rma_iov rma;
  void *desc = NULL;
  ferry_status st = target_of(ch, local, &remote, &rma, &desc);
  if (st)
    return st;
  int write = s->chunk.op == FERRY_OP_WRITE;
  struct fi_msg_rma msg = {.msg_iov = local,
                           .desc = &desc,
                           .iov_count = 1,
                           .addr = ch->dest,
                           .rma_iov = &rma,
                           .rma_iov_count = 1,
                           .context = s};
  for (;;) {
    ssize_t rc = write ? fi_writemsg(ch->ep, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION)
                       : fi_readmsg(ch->ep, &msg, FI_COMPLETION);
    if (rc == 0) {
      ch->refused_ns = 0;
      s->seg_off += len;
      if (s->seg_off == seg->iov_len) {
        s->seg++;
        s->seg_off = 0;
      }
      return FERRY_OK;
    }
    if (rc != -FI_EAGAIN) {
      ch->base.broken = 1;
      return ferry_fail(FERRY_ETRANSPORT, "fabric %s to %s: %s: %s", write ? "WRITE" : "READ",
                        ch->address, write ? "fi_writemsg" : "fi_readmsg",
                        ferry_fi.strerror((int)-rc));
    }
    if (reap(ch) < 0) {
      ch->base.broken = 1;
      return FERRY_ETRANSPORT;
    }
    if (ch->renew)
      return FERRY_EBUSY; /* the endpoint was cut: renew first */
    if ((st = wait_status(ch)) != FERRY_OK || (st = unconnected(ch)) != FERRY_OK ||
        (st = target_gone(ch)) != FERRY_OK)
      return st;
    ferry_fabric_backoff(&ch->idle, ch->wake_fd);
  }
}

/* s's operations, none posted yet. */
static void plan(fabric_channel *ch, fabric_slot *s) {
  s->posted = s->done = s->seg = 0;
  s->seg_off = 0;
  s->planned = 0;
  for (uint32_t i = 0; i < s->chunk.count; i++)
    s->planned += (uint32_t)((s->chunk.local[i].iov_len + ch->op_max - 1) / ch->op_max);
}

/* Claims as many bytes as the channel can post now (its free depth), not a
 * whole slice: what it cannot post yet stays in the batch for its other
 * channels, so they end together instead of one draining a chunk it
 * claimed early while the rest sit idle. */
static fabric_slot *claim_slot(fabric_channel *ch) {
  size_t room = (size_t)(FABRIC_DEPTH - ch->inflight) * ch->op_max;
  for (size_t i = 0; i < FABRIC_SLOTS; i++) {
    fabric_slot *s = &ch->slots[i];
    if (s->active)
      continue;
    if (!ferry_batch_claim_on(ch->batch, &ch->base, room, &s->chunk, NULL))
      return NULL;
    s->active = 1;
    plan(ch, s);
    s->repost = 0;
    s->reposts = 0;
    s->st = FERRY_OK;
    ch->active++;
    return s;
  }
  return NULL;
}

/* A slot with operations left to post: one moving again, else a new chunk. */
static fabric_slot *next_slot(fabric_channel *ch) {
  for (size_t i = 0; i < FABRIC_SLOTS; i++)
    if (ch->slots[i].active && ch->slots[i].posted < ch->slots[i].planned)
      return &ch->slots[i];
  return claim_slot(ch);
}

/* Once every operation of the broken endpoint came back: a fresh endpoint,
 * and the slots cut with the old one posted again from their start. The
 * old one closes as a reset (reset_on_close), so nothing it still queued
 * is delivered after the moved operations. */
static ferry_status renew(fabric_channel *ch) {
  if (ch->dest_ip_len)
    reset_on_close(ch);
  close_endpoint(ch);
  ch->renew = 0;
  ferry_status st = open_endpoint(ch);
  if (st)
    return st;
  ch->base.broken = 0;
  ch->renewed_ns = ferry_now_ns();
  for (size_t i = 0; i < FABRIC_SLOTS; i++) {
    fabric_slot *s = &ch->slots[i];
    if (s->active && s->repost) {
      s->repost = 0;
      plan(ch, s);
      __atomic_add_fetch(&ch->fabric->reposts, 1, __ATOMIC_RELAXED);
    }
  }
  return FERRY_OK;
}

/* Posts until FABRIC_DEPTH operations are in flight or nothing is left;
 * an error that ends the channel's turn is returned. */
static ferry_status post_more(fabric_channel *ch) {
  if (ch->renew && ch->inflight)
    return FERRY_OK; /* the rest of the cut operations first */
  ferry_status st = ch->renew ? renew(ch) : FERRY_OK;
  if (st)
    return st;
  while (!ch->base.broken && !ch->renew && ch->inflight < FABRIC_DEPTH) {
    fabric_slot *s = ch->posting ? ch->posting : (ch->posting = next_slot(ch));
    if (!s)
      return FERRY_OK;
    st = post_one(ch, s);
    if (st == FERRY_EBUSY)
      return FERRY_OK; /* cut meanwhile: posted on the fresh endpoint */
    if (st == FERRY_ECLOSED || st == FERRY_ETIMEDOUT || st == FERRY_ESOCKET || ch->outcome_known)
      return st; /* the wait ended: the channel's turn too */
    if (st) {
      slot_error(s, st);
      stop_posting(ch, s);
      continue;
    }
    s->posted++;
    ch->inflight++;
    if (s->posted == s->planned)
      ch->posting = NULL;
  }
  return FERRY_OK;
}

/* A channel's turn at b begins. */
static void drive_begin(fabric_channel *ch, ferry_batch *b) {
  ch->batch = b;
  ch->first = FERRY_OK;
  ch->progress_ns = ferry_now_ns();
  ch->renewed_ns = 0;
  ch->outcome_known = 0;
  ch->refused_ns = 0;
  ch->check_ns = 0;
  ch->idle = 0;
}

/* ... and ends. */
static ferry_status drive_end(fabric_channel *ch) {
  ch->batch = NULL;
  if (!ch->base.broken)
    ch->base.replied_ns = ferry_now_ns();
  return ch->first;
}

/* ---- staging (memory/staging.h) ------------------------------------------------------- */

/* Device memory the provider cannot register (no FI_HMEM, or it refused
 * CUDA memory: fabric_service.c) and, under FERRY_STAGING=always, any
 * memory, move through the staging pipeline: the kind's copier fills (or
 * drains) pinned bounce buffers, registered here with the provider, and
 * each slice goes as one-sided RMA between a bounce buffer and the
 * target's registered memory while the copier works on the next one
 * (staging.h). A staged batch is driven a chunk at a time with one
 * operation in flight: the pipeline's moves are synchronous, and a READ's
 * copy into device memory starts only once its RMA completed, so done
 * means landed on both sides (a WRITE still asks FI_DELIVERY_COMPLETE). */

/* The descriptor of bounce buffer buf, registered with the provider on
 * first use (FI_MR_LOCAL providers need it; a NIC then reads and writes it
 * without the CPU). A stager that replaced its copiers (more than 4
 * devices on one channel) gives new buffers: then every registration is
 * made again. */
static ferry_status bounce_desc(fabric_channel *ch, void *buf, void **desc) {
  unsigned i = 0;
  for (; i < FABRIC_BOUNCE_MRS && ch->bounce[i].buf; i++)
    if (ch->bounce[i].buf == buf) {
      *desc = fi_mr_desc(ch->bounce[i].mr);
      return FERRY_OK;
    }
  if (i == FABRIC_BOUNCE_MRS) {
    bounce_close(ch);
    i = 0;
  }
  ferry_fabric *f = ch->fabric;
  uint64_t key = f->prov_key ? 0 : ferry_fabric_new_key(f); /* local use only: no remote access */
  struct fid_mr *mr = NULL;
  int rc = fi_mr_reg(f->domains[ch->dom].domain, buf, FERRY_STAGE_SLOT, FI_READ | FI_WRITE, 0, key,
                     0, &mr, NULL);
  if (!rc && f->mr_endpoint && (rc = fi_mr_bind(mr, &ch->ep->fid, 0)) == 0)
    rc = fi_mr_enable(mr);
  if (rc) {
    if (mr)
      fi_close(&mr->fid);
    return ferry_fail(FERRY_ETRANSPORT,
                      "fabric channel to %s: registering a staging buffer with %s: %s", ch->address,
                      f->self.provider, ferry_fi.strerror(-rc));
  }
  ch->bounce[i].buf = buf;
  ch->bounce[i].mr = mr;
  *desc = fi_mr_desc(mr);
  return FERRY_OK;
}

/* The failed staged operation's error, named. */
static ferry_status staged_failed(fabric_channel *ch, const char *what) {
  struct fi_cq_err_entry err = {0};
  if (fi_cq_readerr(ch->cq, &err, 0) != 1)
    return ferry_fail(FERRY_ETRANSPORT, "fabric %s (staged) to %s: fi_cq_readerr read nothing",
                      what, ch->address);
  char prov[128] = "";
  const char *text = fi_cq_strerror(ch->cq, err.prov_errno, err.err_data, prov, sizeof prov);
  ferry_status st = cq_status(&err);
  return ferry_fail(st, "fabric %s (staged) to %s failed: %s%s (provider %s: %s)", what,
                    ch->address, ferry_fi.strerror(err.err < 0 ? -err.err : err.err),
                    st == FERRY_ENOTREG ? ": remote address not registered" : "",
                    ch->fabric->self.provider, text ? text : "no detail");
}

/* Waits for the one staged operation in flight. On failure the channel is
 * broken: an operation that did not complete may still use its buffer, so
 * the endpoint closes before the stager frees it (fabric_close). */
static ferry_status staged_complete(fabric_channel *ch, const char *what) {
  for (;;) {
    struct fi_cq_entry done;
    if (ch->sleep_word) /* the target lane serves only when awake */
      ferry_fabric_nudge(ch->sleep_word);
    ssize_t n = fi_cq_read(ch->cq, &done, 1);
    if (n == 1) {
      ch->progress_ns = ferry_now_ns();
      ch->renewed_ns = 0;
      ch->idle = 0;
      return FERRY_OK;
    }
    ferry_status st = FERRY_OK;
    if (n == -FI_EAVAIL)
      st = staged_failed(ch, what);
    else if (n != -FI_EAGAIN)
      st = ferry_fail(FERRY_ETRANSPORT, "fabric channel to %s: fi_cq_read: %s", ch->address,
                      ferry_fi.strerror((int)-n));
    if (!st && (st = wait_status(ch)) == FERRY_OK && (st = stalled(ch)) == FERRY_OK)
      st = target_gone(ch);
    if (st) {
      ch->base.broken = 1;
      ch->orphaned |= n != -FI_EAVAIL; /* still in flight: its close is a reset */
      return st;
    }
    wait_cq(ch);
  }
}

/* One operation between local (desc: its descriptor) and rma, completed. */
static ferry_status staged_post(fabric_channel *ch, int write, struct iovec *local, void *desc,
                                const struct fi_rma_iov *rma) {
  struct fi_msg_rma msg = {.msg_iov = local,
                           .desc = &desc,
                           .iov_count = 1,
                           .addr = ch->dest,
                           .rma_iov = rma,
                           .rma_iov_count = 1,
                           .context = &ch->staged_op};
  const char *what = write ? "WRITE" : "READ";
  for (;;) {
    ssize_t rc = write ? fi_writemsg(ch->ep, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION)
                       : fi_readmsg(ch->ep, &msg, FI_COMPLETION);
    if (rc == 0) {
      ch->refused_ns = 0;
      return staged_complete(ch, what);
    }
    if (rc != -FI_EAGAIN) {
      ch->base.broken = 1;
      return ferry_fail(FERRY_ETRANSPORT, "fabric %s (staged) to %s: %s", what, ch->address,
                        ferry_fi.strerror((int)-rc));
    }
    struct fi_cq_entry none; /* nothing in flight: progresses the provider's connecting */
    if (ch->sleep_word)
      ferry_fabric_nudge(ch->sleep_word);
    (void)fi_cq_read(ch->cq, &none, 1);
    ferry_status st;
    if ((st = wait_status(ch)) != FERRY_OK || (st = unconnected(ch)) != FERRY_OK ||
        (st = target_gone(ch)) != FERRY_OK) {
      ch->base.broken = 1;
      return st;
    }
    ferry_fabric_backoff(&ch->idle, ch->wake_fd);
  }
}

/* Walks a chunk's segments as the pipeline moves its bytes in order. */
typedef struct staged_cursor {
  fabric_channel *ch;
  const ferry_chunk *chunk;
  uint32_t seg;
  uint64_t off;
} staged_cursor;

/* ferry_stage_move: the chunk's next len bytes between bounce buffer buf
 * and the target's memory, in operations of at most op_max bytes (a slice
 * never spans two segments: staging.c cuts at each range's end). */
static ferry_status staged_move(void *arg, void *buf, size_t len) {
  staged_cursor *k = arg;
  fabric_channel *ch = k->ch;
  void *desc = NULL;
  ferry_status st = bounce_desc(ch, buf, &desc);
  for (size_t done = 0; !st && done < len;) {
    while (k->seg < k->chunk->count && k->off == k->chunk->local[k->seg].iov_len) {
      k->seg++;
      k->off = 0;
    }
    if (k->seg == k->chunk->count) /* the pipeline moved more than the chunk holds */
      return ferry_fail(FERRY_ETRANSPORT, "fabric channel to %s: staged bytes past the chunk's end",
                        ch->address);
    size_t n = len - done < ch->op_max ? len - done : ch->op_max;
    ferry_region remote = {k->chunk->remote[k->seg].addr + k->off, n};
    struct iovec local = {(uint8_t *)buf + done, n};
    struct fi_rma_iov rma;
    if ((st = remote_iov(ch, &remote, &rma)) == FERRY_OK)
      st = staged_post(ch, k->chunk->op == FERRY_OP_WRITE, &local, desc, &rma);
    done += n;
    k->off += n;
  }
  return st;
}

/* A chunk of a staged batch whose memory needs no staging (host memory
 * under FERRY_STAGING=auto): straight from and to its own registration. */
static ferry_status direct_chunk(fabric_channel *ch, const ferry_chunk *c) {
  ferry_status st = FERRY_OK;
  for (uint32_t i = 0; i < c->count && !st; i++)
    for (size_t off = 0; off < c->local[i].iov_len && !st;) {
      size_t n = c->local[i].iov_len - off < ch->op_max ? c->local[i].iov_len - off : ch->op_max;
      struct iovec local = {(uint8_t *)c->local[i].iov_base + off, n};
      ferry_region remote = {c->remote[i].addr + off, n};
      struct fi_rma_iov rma;
      void *desc = NULL;
      if ((st = target_of(ch, &local, &remote, &rma, &desc)) == FERRY_OK)
        st = staged_post(ch, c->op == FERRY_OP_WRITE, &local, desc, &rma);
      off += n;
    }
  return st;
}

/* Device memory among the ranges: said once per engine (why it is staged). */
static void say_staged(fabric_channel *ch, unsigned count) {
  for (unsigned i = 0; i < count; i++)
    if (!ch->ranges[i].where.cpu_access) {
      ferry_fabric_say_staged(ch->fabric);
      return;
    }
}

static ferry_status staged_chunk(fabric_channel *ch, const ferry_chunk *c) {
  ferry_engine *e = ch->base.peer->engine;
  if (!ferry_stage_plan(e->registry, c->local, c->count, e->cfg.staging, ch->ranges))
    return direct_chunk(ch, c);
  if (!ch->stager && !(ch->stager = ferry_stager_create()))
    return ferry_fail(FERRY_ENOMEM, "no memory for a staging pipeline to %s", ch->address);
  say_staged(ch, c->count);
  staged_cursor k = {ch, c, 0, 0};
  ferry_status st, copied = FERRY_OK;
  if (c->op == FERRY_OP_WRITE)
    st = ferry_stage_out(ch->stager, ch->ranges, c->count, staged_move, &k);
  else
    st = ferry_stage_in(ch->stager, ch->ranges, c->count, staged_move, &k, &copied);
  st = st ? st : copied;
  if (!st)
    ferry_stats_staged(e, c->op, c->bytes);
  return st;
}

/* s's chunk through the pipeline; a cut connection or refused key is
 * judged as an unstaged chunk's (moves_again: the fresh table says whether
 * its ranges are still registered), and the chunk moved again from its
 * start on a fresh endpoint when the target stayed up. */
static ferry_status staged_slot(fabric_channel *ch, fabric_slot *s) {
  s->reposts = 0;
  s->st = FERRY_OK;
  s->active = 1; /* for stalled(): shm drops an operation on a key it no longer knows */
  for (;;) {
    ferry_status st = staged_chunk(ch, &s->chunk);
    if (!st || (st != FERRY_ESOCKET && st != FERRY_ENOTREG) || !moves_again(ch, s, &st)) {
      s->active = 0;
      return st;
    }
    FERRY_DEBUG("%s: posted again on a fresh endpoint", ferry_last_error());
    s->reposts++;
    __atomic_add_fetch(&ch->fabric->reposts, 1, __ATOMIC_RELAXED);
    if ((st = renew(ch)) != FERRY_OK) {
      s->active = 0;
      return st;
    }
  }
}

/* Drives b a chunk at a time (FABRIC_STAGED_SLICE bytes),
 * in slot 0 (the slots are otherwise idle here). */
static ferry_status staged_drive(fabric_channel *ch, ferry_batch *b) {
  drive_begin(ch, b);
  fabric_slot *s = &ch->slots[0];
  while (!ch->base.broken &&
         ferry_batch_claim_on(b, &ch->base, FABRIC_STAGED_SLICE, &s->chunk, NULL)) {
    ferry_status st = staged_slot(ch, s);
    ferry_stats_moved(ch->base.peer, ch->base.transport, &s->chunk, st);
    ferry_batch_settle(b, &ch->base, &s->chunk, st); /* ESOCKET: another rail */
    if (st && !ch->first)
      ch->first = st;
  }
  return drive_end(ch);
}

/* ---- driving -------------------------------------------------------------------------- */

static ferry_status fabric_drive(ferry_channel *base, ferry_batch *b) {
  fabric_channel *ch = (fabric_channel *)base;
  if (staged_batch(ch->fabric, b))
    return staged_drive(ch, b);
  drive_begin(ch, b);
  for (;;) {
    ferry_status st = post_more(ch);
    if (!st && !ch->active)
      break;
    if (!st && ch->inflight)
      st = await(ch);
    if (st) {
      abandon(ch, st);
      if (!ch->first)
        ch->first = st;
      break;
    }
  }
  return drive_end(ch);
}

static int fabric_alive(ferry_channel *base) { return !base->broken; }

static void fabric_shutdown(ferry_channel *base) {
  fabric_channel *ch = (fabric_channel *)base;
  __atomic_store_n(&ch->stopping, 1, __ATOMIC_RELEASE);
  uint64_t one = 1;
  if (write(ch->wake_fd, &one, sizeof one) < 0)
    FERRY_DEBUG("fabric channel to %s: wake: %s", ch->address, strerror(errno));
}

const ferry_transport ferry_transport_fabric = {
    .name = "fabric",
    .id = FERRY_TRANSPORT_FABRIC,
    .carries_device_memory = FERRY_DEVICE_STAGED, /* FI_HMEM registration, else the pipeline */
    .usable = fabric_usable,
    .slice_size = fabric_slice,
    .channel_open = fabric_open,
    .channel_drive = fabric_drive,
    .channel_alive = fabric_alive,
    .channel_shutdown = fabric_shutdown,
    .channel_close = fabric_close,
    .service_start = ferry_fabric_service_start,
    .describe = ferry_fabric_describe,
    .service_stop = ferry_fabric_service_stop,
    .region_register = ferry_fabric_region_register,
    .region_deregister = ferry_fabric_region_deregister,
    .region_key_size = ferry_fabric_region_key_size,
    .region_keys = ferry_fabric_region_keys,
    .rails = fabric_rails,
    .rail_open = fabric_rail_open,
};
