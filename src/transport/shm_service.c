/* shm_service.c - the target side of the same-host transport.
 *
 * A thread listens on an abstract UNIX socket ("@ferry-<pid>-<random>", no
 * filesystem path) and serves initiators on this host. Any process can
 * connect to such a socket, so the service trusts only what the kernel
 * says about the caller: a connection whose SO_PEERCRED uid is neither
 * this process's nor in cfg.shm_allowed_uids is refused at once (a
 * GREETING with FERRY_EAUTH, then close), and so is one past
 * SHM_CONNS_MAX. Others are greeted (engine id, an address to test
 * process_vm_readv on, an auth nonce) and must send HELLO (with a proof
 * when the engine has a secret) within connect_timeout_ms. Then they get,
 * by SCM_RIGHTS, the region table (a memfd sealed against writing: no
 * reopened descriptor maps it writable) and a page of slots for that
 * link; later the service answers SYNC (refresh the table) and MAP (the
 * memfd of one ferry_memory_alloc buffer that is registered now) and
 * EXPORT (the handle of a registered device region's allocation, from its
 * memory kind: a CUDA IPC handle; shm.h says how allocations are
 * numbered). The data never passes here. The thread never blocks on a
 * peer: sockets are non-blocking and a peer that does not take a reply is
 * dropped.
 *
 * The table is rewritten under a seqlock whenever it is stale (the registry
 * or the allocation list changed) and an initiator asks, and eagerly by
 * ferry_shm_revoke after every unregistration, which then waits until no
 * initiator is still copying under an older table version. The slots a
 * peer writes are only read here, as untrusted input: a link whose slots
 * do not clear within timeout_ms is cut off (its socket shut down, so its
 * initiator stops using it) and unregister returns. See shm.c for the
 * initiator's half of that protocol.
 *
 * Posted notices. A HELLO names the initiator's engine (id, name) and an
 * address in its memory that holds the id; when process_vm_readv on the
 * caller's pid (from the kernel) reads the same id there, the link's
 * sender is known, and ATTACH also hands over a post page and an eventfd
 * (shm.h). This thread polls the eventfd with the sockets, drains the
 * notice ring (bounded per round, so one busy link cannot starve the
 * others) and serves each entry through pool.c as a LANDED of that
 * sender (FERRY_NOTICE_POSTED): the entry is copied out first, its index,
 * length and body are checked, and pool.c accepts it only for a slot
 * granted to that sender, of at most the slot's length. Each reply's
 * grant goes to the credit ring; when that is full the notice's request
 * for one is dropped (the sender then asks on the control connection).
 * Before it sleeps the thread sets `sleeping` and looks at head once more,
 * so a notice is never left unseen. After serving a link's notices it
 * writes the link's credit eventfd when a sender thread there awaits
 * credits (`awaiting`, shm.h), so that sender sleeps instead of spinning. A sender that dies leaves
 * at most notices of complete messages; its slots without one are reclaimed by pool.c when its
 * connections end, as on every transport; before they go, ferry_shm_peer_gone bumps the reclaim
 * count of its links' pages, so credits granted earlier stop working. A link whose ring indices
 * make no sense is cut off. A link being dropped serves its ring once more before it stops
 * counting as one of its sender's connections (`closed`, shm.h), so no notice posted to it is
 * left unserved without its sender knowing. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "core/counters.h"
#include "core/pool.h"
#include "memory/kind.h"
#include "transport/shm.h"

/* A device allocation the table lists, and the id initiators know it by. */
typedef struct svc_device {
  uint64_t base, id;
} svc_device;

typedef struct svc_conn {
  int fd;
  struct ucred cred;    /* of the connecting process, from the kernel */
  uint64_t deadline_ns; /* HELLO due by then; 0 once attached */
  int attached;         /* HELLO accepted: it holds the table and may copy */
  int cut;              /* revocation gave up waiting for it: drop it */
  unsigned refs;        /* the service thread's, plus one per revocation using it */
  uint64_t *slots;      /* shared with the initiator: untrusted */
  uint8_t nonce[FERRY_WIRE_NONCE_SIZE];
  shm_post *post;       /* shared with the initiator: untrusted; NULL: none */
  int efd;              /* the initiator writes it to wake this thread */
  int cefd;             /* we write it to wake initiator threads awaiting credits */
  uint64_t tail, given; /* notices consumed, credits given (ours, not the page's) */
  uint64_t reclaims;    /* its sender's slots taken back (atomic): see shm.h */
  uint64_t sender;      /* engine id of the initiator, verified */
  char sender_name[FERRY_WIRE_MAX_NAME + 1];
  unsigned refused_notices; /* for the log */
  struct svc_conn *next;
} svc_conn;

struct ferry_shm_service {
  ferry_engine *engine;
  int listen_fd;
  int wake[2];
  pthread_t thread;
  int thread_started;
  uint64_t probe; /* holds the engine id; initiators read it with CMA */
  uid_t uid;      /* served besides the allowed list */
  uint32_t *allowed_uids;
  size_t allowed_count;
  unsigned refused;         /* connections refused, for the log */
  pthread_cond_t held_cond; /* held, parked (under lock): ferry_shm_service_hold */
  int held, parked;

  pthread_mutex_t lock; /* conns, nconns, every conn's refs and attached */
  svc_conn *conns;
  unsigned nconns;

  pthread_mutex_t table_lock; /* everything below: one writer at a time */
  shm_table *table;
  int table_fd;
  int built;
  uint64_t built_generation;
  size_t built_allocs;
  int warned_truncated;
  svc_device *devices; /* device allocations holding registered regions, by base */
  size_t ndevices;
  uint64_t device_ids; /* the last id given */
};

/* ---- messages (shared with shm.c) --------------------------------------------- */

void shm_msg_init(shm_msg *m, shm_msg_type type) {
  memset(m, 0, sizeof *m);
  m->magic = SHM_MAGIC;
  m->version = SHM_VERSION;
  m->type = (uint16_t)type;
}

int shm_msg_send(int fd, const shm_msg *m, const int *fds, int nfds, int flags) {
  struct iovec iov = {(void *)m, sizeof *m};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * SHM_MAX_FDS)];
  } ctl;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    memset(&ctl, 0, sizeof ctl);
    mh.msg_control = ctl.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  ssize_t n;
  do
    n = sendmsg(fd, &mh, MSG_NOSIGNAL | flags);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return -errno;
  return n == (ssize_t)sizeof *m ? 0 : -EPROTO;
}

/* Moves the descriptors of every SCM_RIGHTS header into fds (at most max;
 * extra ones are closed). Returns how many were kept. */
static int take_fds(struct msghdr *mh, int *fds, int max) {
  int kept = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (kept < max)
        fds[kept++] = fd;
      else
        close(fd);
    }
  }
  return kept;
}

int shm_msg_recv(int fd, shm_msg *m, shm_msg_type type, int *fds, int *nfds, int flags) {
  struct iovec iov = {m, sizeof *m};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * SHM_MAX_FDS)];
  } ctl;
  struct msghdr mh = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
  ssize_t n;
  do
    n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | flags);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return -errno;
  int got = take_fds(&mh, fds ? fds : (int[1]){0}, fds ? SHM_MAX_FDS : 0);
  if (nfds)
    *nfds = got;
  int bad = n != (ssize_t)sizeof *m || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
            m->magic != SHM_MAGIC || m->version != SHM_VERSION || (type && m->type != type);
  if (n == 0 || bad) {
    for (int i = 0; i < got; i++)
      close(fds[i]);
    if (nfds)
      *nfds = 0;
    return n == 0 ? -ECONNRESET : -EPROTO;
  }
  return 0;
}

int shm_sockaddr(const char *path, void *addr, unsigned *len) {
  struct sockaddr_un *sa = addr;
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof sa->sun_path)
    return -1;
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  memcpy(sa->sun_path, path, n);
  if (path[0] == '@')
    sa->sun_path[0] = '\0'; /* abstract namespace: the name is not NUL-terminated */
  *len = (unsigned)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '@' ? 0 : 1));
  return 0;
}

/* ---- memfds ---------------------------------------------------------------------- */

/* A memfd of `size` bytes, mapped read-write here, then sealed: it can
 * neither shrink nor grow (a peer's mapping of it can never fault), nobody
 * can add or remove seals, and `extra` seals more (F_SEAL_FUTURE_WRITE: no
 * descriptor, however reopened, gives a writable mapping or write(2); only
 * the mapping made here can change it). */
static ferry_status sealed_memfd(const char *name, size_t size, int extra, int *fd, void **map) {
  *fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (*fd < 0)
    return ferry_fail_errno(FERRY_ENOMEM, errno, "shm service: memfd_create failed");
  *map = MAP_FAILED;
  if (ftruncate(*fd, (off_t)size) < 0 ||
      (*map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0)) == MAP_FAILED ||
      fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | extra) < 0) {
    int err = errno;
    if (*map != MAP_FAILED)
      munmap(*map, size);
    close(*fd);
    *fd = -1;
    return ferry_fail_errno(FERRY_ENOMEM, err, "shm service: sealed %zu-byte %s", size, name);
  }
  return FERRY_OK;
}

static uint64_t fd_ino(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* ---- the table ------------------------------------------------------------------- */

typedef struct alloc_info {
  uint64_t addr, length, ino;
} alloc_info;

static int compare_allocs(const void *a, const void *b) {
  const alloc_info *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The engine's allocations, sorted by address (malloc'd; NULL when none). */
static size_t list_allocations(ferry_engine *e, alloc_info **out) {
  size_t n = 0, cap = 0;
  alloc_info *list = NULL;
  pthread_mutex_lock(&e->alloc_lock);
  for (ferry_allocation *a = e->allocations; a; a = a->next) {
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      alloc_info *grown = realloc(list, cap * sizeof *grown);
      if (!grown)
        break; /* regions left out are reached with CMA instead */
      list = grown;
    }
    list[n++] = (alloc_info){(uint64_t)(uintptr_t)a->addr, a->length, fd_ino(a->fd)};
  }
  pthread_mutex_unlock(&e->alloc_lock);
  if (n > 1)
    qsort(list, n, sizeof *list, compare_allocs);
  *out = list;
  return n;
}

/* Inode of the allocation holding the whole region, 0 if none does. */
static uint64_t region_ino(const alloc_info *allocs, size_t n, const ferry_region *r) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (allocs[mid].addr <= r->addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0)
    return 0;
  const alloc_info *a = &allocs[lo - 1];
  uint64_t off = r->addr - a->addr;
  return off < a->length && r->length <= a->length - off ? a->ino : 0;
}

/* The id of the device allocation at base: the one it has in this table
 * already (now) or had in the last (old), else a new one (++*next); now
 * gets it. */
static uint64_t device_id(const svc_device *old, size_t nold, svc_device *now, size_t *nnow,
                          uint64_t base, uint64_t *next) {
  for (size_t i = 0; i < *nnow; i++)
    if (now[i].base == base)
      return now[i].id;
  uint64_t id = 0;
  for (size_t i = 0; i < nold && !id; i++)
    if (old[i].base == base)
      id = old[i].id;
  if (!id)
    id = ++*next;
  now[(*nnow)++] = (svc_device){base, id};
  return id;
}

/* Where a region lives: 0 for memory the CPU reaches, else SHM_PLACE,
 * with *id its allocation's id (from devices, the allocations listed so
 * far in this table, and s->devices, the last table's; -1: out of
 * memory for the list, so the region is left out of the table, never
 * listed under a stale id). */
static uint64_t region_place(ferry_shm_service *s, const ferry_region *r, svc_device *devices,
                             size_t *ndevices, uint64_t *id) {
  ferry_where w;
  if (!ferry_registry_where(s->engine->registry, r->addr, r->length, &w) || w.cpu_access || !w.base)
    return 0;
  *id = devices ? device_id(s->devices, s->ndevices, devices, ndevices, w.base, &s->device_ids)
                : (uint64_t)-1;
  return SHM_PLACE(w.kind, w.device);
}

/* Seqlock write: odd while entries change; readers that saw the old even
 * value notice the change and look again. */
static uint64_t table_publish(ferry_shm_service *s, const ferry_region *regions, size_t count,
                              const alloc_info *allocs, size_t nallocs) {
  shm_table *t = s->table;
  uint64_t seq = __atomic_load_n(&t->seq, __ATOMIC_RELAXED);
  size_t n = count < SHM_TABLE_CAPACITY ? count : SHM_TABLE_CAPACITY;
  /* The device allocations this table lists replace the last table's:
   * one no region holds any more loses its id. */
  int device_memory = ferry_registry_device_regions(s->engine->registry) != 0;
  svc_device *devices = device_memory ? malloc((n ? n : 1) * sizeof *devices) : NULL;
  size_t ndevices = 0;
  if (device_memory && !devices)
    FERRY_WARN("shm: no memory to number device allocations; same-host peers are refused "
               "device memory until the next table");
  __atomic_store_n(&t->seq, seq + 1, __ATOMIC_SEQ_CST);
  /* Release stores (plain moves on x86): a reader that sees new data also
   * sees the odd seq before it. */
  for (size_t i = 0; i < n; i++) {
    uint64_t id = 0;
    uint64_t place = device_memory ? region_place(s, &regions[i], devices, &ndevices, &id) : 0;
    __atomic_store_n(&t->entries[i].addr, regions[i].addr, __ATOMIC_RELEASE);
    __atomic_store_n(&t->entries[i].length, id == (uint64_t)-1 ? 0 : regions[i].length,
                     __ATOMIC_RELEASE);
    __atomic_store_n(&t->entries[i].ino, place ? id : region_ino(allocs, nallocs, &regions[i]),
                     __ATOMIC_RELEASE);
    __atomic_store_n(&t->entries[i].place, place, __ATOMIC_RELEASE);
  }
  free(s->devices);
  s->devices = devices;
  s->ndevices = ndevices;
  __atomic_store_n(&t->count, (uint64_t)n, __ATOMIC_RELEASE);
  __atomic_store_n(&t->truncated, (uint64_t)(n < count), __ATOMIC_RELEASE);
  __atomic_store_n(&t->seq, seq + 2, __ATOMIC_SEQ_CST);
  if (n < count && !s->warned_truncated++)
    FERRY_WARN("shm: %zu regions registered, the shared table lists the first %u; same-host "
               "peers are refused the rest",
               count, SHM_TABLE_CAPACITY);
  return seq + 2;
}

/* Rewrites the table from the registry when it changed (or always, with
 * force). Returns the table's seq afterwards. */
static uint64_t table_refresh(ferry_shm_service *s, int force) {
  ferry_engine *e = s->engine;
  pthread_mutex_lock(&s->table_lock);
  uint64_t generation = ferry_registry_generation(e->registry);
  alloc_info *allocs;
  size_t nallocs = list_allocations(e, &allocs);
  if (force || !s->built || generation != s->built_generation || nallocs != s->built_allocs) {
    ferry_region *regions = NULL;
    size_t count = ferry_registry_snapshot(e->registry, &regions);
    table_publish(s, regions, count, allocs, nallocs);
    free(regions);
    s->built = 1;
    s->built_generation = generation;
    s->built_allocs = nallocs;
  }
  free(allocs);
  uint64_t seq = __atomic_load_n(&s->table->seq, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&s->table_lock);
  return seq;
}

/* ---- connections ------------------------------------------------------------------ */

static void conn_free(svc_conn *c) {
  if (c->slots)
    munmap(c->slots, SHM_SLOTS_BYTES);
  if (c->post)
    munmap(c->post, sizeof(shm_post));
  if (c->efd >= 0)
    close(c->efd);
  if (c->cefd >= 0)
    close(c->cefd);
  close(c->fd);
  free(c);
}

/* Drops one reference; the last one frees the connection. */
static void conn_release(ferry_shm_service *s, svc_conn *c) {
  pthread_mutex_lock(&s->lock);
  unsigned left = --c->refs;
  pthread_mutex_unlock(&s->lock);
  if (!left)
    conn_free(c);
}

static int serve_posted(ferry_shm_service *s, svc_conn *c);

/* Unlinks the connection (only the service thread does) and drops the
 * service thread's reference: a revocation still reading its slots keeps
 * it until it is done. A link that carried its sender's notices serves
 * them once more, and then no longer counts as one of the sender's
 * connections (pool.c). */
static void conn_drop(ferry_shm_service *s, svc_conn *c) {
  pthread_mutex_lock(&s->lock);
  svc_conn **pp = &s->conns;
  while (*pp && *pp != c)
    pp = &(*pp)->next;
  if (*pp) {
    *pp = c->next;
    s->nconns--;
  }
  pthread_mutex_unlock(&s->lock);
  if (c->post) {
    __atomic_store_n(&c->post->closed, SHM_CLOSING, __ATOMIC_SEQ_CST);
    serve_posted(s, c); /* the last notices (shm.h: `closed`) */
    __atomic_store_n(&c->post->closed, SHM_DRAINED, __ATOMIC_SEQ_CST);
    ferry_pools_peer_left(s->engine, c->sender);
  }
  conn_release(s, c);
}

static int uid_allowed(const ferry_shm_service *s, uid_t uid) {
  if (uid == s->uid)
    return 1;
  for (size_t i = 0; i < s->allowed_count; i++)
    if (s->allowed_uids[i] == (uint32_t)uid)
      return 1;
  return 0;
}

int ferry_shm_uid_allowed(const ferry_engine *e, uid_t uid) {
  return e->shm ? uid_allowed(e->shm, uid) : uid == geteuid();
}

/* Says no in a GREETING that carries nothing but the status, and closes.
 * Only the first refusal is a warning: a flood must not flood the log. */
static void refuse_conn(ferry_shm_service *s, int fd, const struct ucred *cred, ferry_status status,
                        const char *why) {
  shm_msg m;
  shm_msg_init(&m, SHM_GREETING);
  m.status = status;
  shm_msg_send(fd, &m, NULL, 0, MSG_DONTWAIT);
  close(fd);
  if (s->refused++ == 0)
    FERRY_WARN("shm: refused a same-host connection from pid %d uid %u: %s (later refusals are "
               "logged at debug level)",
               (int)cred->pid, (unsigned)cred->uid, why);
  else
    FERRY_DEBUG("shm: refused a same-host connection from pid %d uid %u: %s", (int)cred->pid,
                (unsigned)cred->uid, why);
}

/* 0 once nobody is waiting to be accepted. */
static int accept_one(ferry_shm_service *s) {
  int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0)
    return 0;
  struct ucred cred = {0, (uid_t)-1, (gid_t)-1};
  socklen_t len = sizeof cred;
  const char *refusal = NULL;
  ferry_status status = FERRY_EAUTH;
  svc_conn *c = NULL;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
    refusal = "its credentials are unknown";
  else if (!uid_allowed(s, cred.uid))
    refusal = "another user (allow it with ferry_config.shm_allowed_uids)";
  else if (s->nconns >= SHM_CONNS_MAX)
    refusal = "too many connections", status = FERRY_EBUSY;
  else if (!(c = calloc(1, sizeof *c)))
    refusal = "out of memory", status = FERRY_ENOMEM;
  if (refusal) {
    refuse_conn(s, fd, &cred, status, refusal);
    return 1;
  }
  c->fd = fd;
  c->efd = c->cefd = -1;
  c->cred = cred;
  c->refs = 1;
  c->deadline_ns = ferry_now_ns() + (uint64_t)s->engine->cfg.connect_timeout_ms * 1000000ull;
  ferry_auth_nonce(c->nonce);
  shm_msg m;
  shm_msg_init(&m, SHM_GREETING);
  m.engine_id = s->engine->instance_id;
  m.probe_addr = (uint64_t)(uintptr_t)&s->probe;
  m.auth_required = s->engine->secret != NULL;
  memcpy(m.nonce, c->nonce, sizeof m.nonce);
  if (shm_msg_send(fd, &m, NULL, 0, MSG_DONTWAIT) != 0) {
    conn_free(c);
    return 1;
  }
  pthread_mutex_lock(&s->lock);
  c->next = s->conns;
  s->conns = c;
  s->nconns++;
  pthread_mutex_unlock(&s->lock);
  return 1;
}

/* Whether the HELLO's engine id is in the caller's memory where it says:
 * then notices on this link are that engine's. */
static int sender_verified(const svc_conn *c, const shm_msg *req) {
  uint64_t value = 0;
  struct iovec local = {&value, sizeof value};
  struct iovec remote = {(void *)(uintptr_t)req->probe_addr, sizeof value};
  return req->engine_id && c->cred.pid > 0 &&
         process_vm_readv(c->cred.pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof value &&
         value == req->engine_id;
}

/* The post page and eventfds of a verified sender (fd: the page's memfd
 * to hand over, c->efd and c->cefd); 0 without: its notices then take
 * the control connection. */
static int post_page(ferry_shm_service *s, svc_conn *c, const shm_msg *req, int fd[3]) {
  void *page;
  if (!sender_verified(c, req)) {
    FERRY_DEBUG("shm: peer pid %d posts no notices: its engine id could not be read back",
                (int)c->cred.pid);
    return 0;
  }
  if (sealed_memfd("ferry-shm-post", sizeof(shm_post), 0, &fd[0], &page) != FERRY_OK)
    return 0;
  c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  c->cefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->efd < 0 || c->cefd < 0) {
    if (c->efd >= 0)
      close(c->efd);
    if (c->cefd >= 0)
      close(c->cefd);
    c->efd = c->cefd = -1;
    munmap(page, sizeof(shm_post));
    close(fd[0]);
    fd[0] = -1;
    return 0;
  }
  c->post = page;
  c->post->sleeping = 1;
  c->sender = req->engine_id;
  snprintf(c->sender_name, sizeof c->sender_name, "%.*s",
           (int)strnlen(req->name, FERRY_WIRE_MAX_NAME), req->name);
  fd[1] = c->efd;
  fd[2] = c->cefd;
  ferry_pools_peer_joined(s->engine, c->sender);
  ferry_pools_peer_copies(s->engine, c->sender); /* it maps the pools: its copies are unseen */
  return 1;
}

static int serve_hello(ferry_shm_service *s, svc_conn *c, const shm_msg *req) {
  shm_msg m;
  shm_msg_init(&m, SHM_ATTACH);
  const char *secret = s->engine->secret;
  if (c->attached || (secret && !ferry_auth_check(secret, FERRY_AUTH_INITIATOR, req->nonce,
                                                  c->nonce, req->proof))) {
    FERRY_WARN("shm: refused a same-host peer (pid %d): %s", (int)c->cred.pid,
               c->attached ? "second HELLO" : "wrong shared secret");
    m.status = FERRY_EAUTH;
    shm_msg_send(c->fd, &m, NULL, 0, MSG_DONTWAIT);
    return -1;
  }
  int slots_fd;
  void *slots;
  if (sealed_memfd("ferry-shm-slots", SHM_SLOTS_BYTES, 0, &slots_fd, &slots) != FERRY_OK) {
    FERRY_WARN("shm: refused a same-host peer (pid %d): %s", (int)c->cred.pid, ferry_last_error());
    return -1;
  }
  int fds[5] = {s->table_fd, slots_fd, -1, -1, -1};
  int nfds = post_page(s, c, req, &fds[2]) ? 5 : 2;
  pthread_mutex_lock(&s->lock);
  c->slots = slots;
  c->deadline_ns = 0;
  c->attached = 1; /* before the table is built: revocations now wait for it */
  pthread_mutex_unlock(&s->lock);
  ferry_stats_accepted(s->engine, FERRY_TRANSPORT_SHM);
  m.seq = table_refresh(s, 0);
  int rc = shm_msg_send(c->fd, &m, fds, nfds, MSG_DONTWAIT);
  close(slots_fd); /* the mapping is all this side needs */
  if (fds[2] >= 0)
    close(fds[2]);
  return rc;
}

/* Finds the allocation with this inode that holds [addr, addr+length),
 * a range registered now; *fd gets a duplicate of its memfd. */
static int find_allocation(ferry_engine *e, const shm_msg *req, shm_msg *m, int *fd) {
  *fd = -1;
  if (!req->length || !ferry_registry_contains(e->registry, req->addr, req->length))
    return 0;
  pthread_mutex_lock(&e->alloc_lock);
  for (ferry_allocation *a = e->allocations; a && *fd < 0; a = a->next) {
    uint64_t base = (uint64_t)(uintptr_t)a->addr;
    if (req->addr < base || req->addr - base >= a->length ||
        req->length > a->length - (req->addr - base) || fd_ino(a->fd) != req->ino)
      continue;
    *fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    m->addr = base;
    m->length = a->length;
  }
  pthread_mutex_unlock(&e->alloc_lock);
  return *fd >= 0;
}

static int serve_map(ferry_shm_service *s, svc_conn *c, const shm_msg *req) {
  shm_msg m;
  shm_msg_init(&m, SHM_MAPPED);
  m.ino = req->ino;
  int fd;
  if (!find_allocation(s->engine, req, &m, &fd)) {
    m.status = FERRY_ENOTREG;
    return shm_msg_send(c->fd, &m, NULL, 0, MSG_DONTWAIT);
  }
  int rc = shm_msg_send(c->fd, &m, &fd, 1, MSG_DONTWAIT);
  close(fd);
  return rc;
}

/* The id the table gives the device allocation at base; 0: none. */
static uint64_t listed_device(ferry_shm_service *s, uint64_t base) {
  uint64_t id = 0;
  pthread_mutex_lock(&s->table_lock);
  for (size_t i = 0; i < s->ndevices && !id; i++)
    if (s->devices[i].base == base)
      id = s->devices[i].id;
  pthread_mutex_unlock(&s->table_lock);
  return id;
}

/* The handle of the allocation holding a device region registered now,
 * under the id the table gives it (an initiator asking for an older id
 * gets FERRY_ENOTREG and refreshes its table). A kind that cannot export
 * it says why in name. */
static int serve_export(ferry_shm_service *s, svc_conn *c, const shm_msg *req) {
  shm_msg m;
  shm_msg_init(&m, SHM_EXPORTED);
  m.ino = req->ino;
  ferry_where w;
  int fd = -1; /* a VMM allocation's POSIX fd: passed like the memfds */
  m.status = FERRY_ENOTREG;
  if (req->length && ferry_registry_where(s->engine->registry, req->addr, req->length, &w) &&
      !w.cpu_access && w.base && listed_device(s, w.base) == req->ino) {
    const ferry_memory_kind *k = ferry_kind_get(w.kind);
    size_t len = sizeof m.handle;
    ferry_status st = k->export_handle
                          ? k->export_handle(&w, m.handle, &len, &fd)
                          : ferry_fail(FERRY_ENOTIMPL, "%s memory has no export", k->name);
    m.status = st;
    if (st) {
      snprintf(m.name, sizeof m.name, "%s", ferry_last_error());
      FERRY_DEBUG("shm: refused pid %d an export: %s", (int)c->cred.pid, m.name);
    } else {
      m.handle_len = (uint32_t)len;
      m.place = SHM_PLACE(w.kind, w.device);
      m.addr = w.base;
      m.length = w.size;
    }
  }
  int rc = shm_msg_send(c->fd, &m, &fd, fd >= 0, MSG_DONTWAIT);
  if (fd >= 0)
    close(fd);
  return rc;
}

/* One request; nonzero drops the connection. */
static int serve_request(ferry_shm_service *s, svc_conn *c) {
  shm_msg req;
  if (shm_msg_recv(c->fd, &req, 0, NULL, NULL, MSG_DONTWAIT) != 0)
    return -1;
  if (req.type == SHM_HELLO)
    return serve_hello(s, c, &req);
  if (!c->attached)
    return -1;
  if (req.type == SHM_MAP)
    return serve_map(s, c, &req);
  if (req.type == SHM_EXPORT)
    return serve_export(s, c, &req);
  if (req.type != SHM_SYNC)
    return -1;
  shm_msg m;
  shm_msg_init(&m, SHM_SYNCED);
  m.seq = table_refresh(s, 0);
  return shm_msg_send(c->fd, &m, NULL, 0, MSG_DONTWAIT);
}

/* ---- posted notices ---------------------------------------------------------------- */

#define NOTICE_ROUNDS 4 /* rounds of draining one link before the others get a turn */

static void refuse_notice(svc_conn *c, const char *why) {
  if (c->refused_notices++ == 0)
    FERRY_WARN("shm: refused a notice posted by %s (pid %d): %s (later ones at debug level)",
               c->sender_name, (int)c->cred.pid, why);
  else
    FERRY_DEBUG("shm: refused a notice posted by %s (pid %d): %s", c->sender_name, (int)c->cred.pid,
                why);
}

/* A reply's grant into the credit ring (room was checked before). */
static void give_credit(svc_conn *c, const ferry_pool_req *r, const uint8_t *reply,
                        uint64_t reclaims) {
  shm_credit *cr = &c->post->credits[c->given % SHM_CREDITS];
  cr->issued_ns = ferry_now_ns();
  cr->reclaims = reclaims;
  memcpy(cr->grant, reply, sizeof cr->grant);
  snprintf(cr->pool, sizeof cr->pool, "%.*s", (int)r->pool_len, r->pool);
  __atomic_store_n(&cr->seq, c->given + 1, __ATOMIC_RELEASE);
  __atomic_store_n(&c->post->credits_given, ++c->given, __ATOMIC_RELEASE);
}

/* One notice, already copied out of the ring: a LANDED of this link's
 * sender, re-encoded without its request for a grant when the credit ring
 * has no room for one. */
static void serve_notice(ferry_shm_service *s, svc_conn *c, const uint8_t *body, size_t len) {
  ferry_pool_req r;
  uint8_t clean[FERRY_WIRE_POOL_MAX], reply[FERRY_WIRE_POOL_REPLY_SIZE];
  if (ferry_wire_pool_decode(body, len, &r) != FERRY_OK) {
    refuse_notice(c, ferry_last_error());
    return;
  }
  uint64_t taken = __atomic_load_n(&c->post->credits_taken, __ATOMIC_ACQUIRE);
  if (c->given - taken >= SHM_CREDITS)
    r.flags &= ~(uint8_t)FERRY_POOL_NEXT;
  size_t n = ferry_wire_pool_encode(clean, &r);
  /* Read before the grant: a reclaim racing with it voids this credit. */
  uint64_t reclaims = __atomic_load_n(&c->reclaims, __ATOMIC_ACQUIRE);
  if (ferry_pools_serve(s->engine, c->sender, c->sender_name, clean, n, FERRY_NOTICE_POSTED,
                        reply) != FERRY_OK) {
    refuse_notice(c, ferry_last_error());
    return;
  }
  ferry_pool_grant g;
  ferry_wire_grant_decode(reply, &g);
  if (g.id)
    give_credit(c, &r, reply, reclaims);
}

/* Notices were served: a sender thread asleep for the credits they may
 * have brought wakes. The count is read with a read-modify-write after
 * our stores of tail and credits_given, as the sender increments it
 * before it reads those: the later of the two sees the other (shm.h). */
static void wake_awaiting(svc_conn *c) {
  if (!__atomic_fetch_add(&c->post->awaiting, 0, __ATOMIC_SEQ_CST))
    return;
  uint64_t one = 1;
  ssize_t w = write(c->cefd, &one, sizeof one);
  (void)w; /* a full counter already wakes it */
}

/* Serves the notices up to head, at most a ring's worth; nonzero when the
 * indices are impossible (the link is then cut off). */
static int serve_posted(ferry_shm_service *s, svc_conn *c) {
  shm_post *q = c->post;
  /* Sequentially consistent, as the sender's store of head and its load
   * of `closed` are: a drain after SHM_CLOSING sees its notice, or the
   * sender sees the link closing (shm.h). */
  uint64_t head = __atomic_load_n(&q->head, __ATOMIC_SEQ_CST);
  if (head - c->tail > SHM_NOTICES)
    return -1;
  if (head == c->tail)
    return 0;
  for (; c->tail != head; __atomic_store_n(&q->tail, ++c->tail, __ATOMIC_RELEASE)) {
    const shm_notice *n = &q->notices[c->tail % SHM_NOTICES];
    uint8_t body[FERRY_WIRE_POOL_MAX];
    uint64_t seq = __atomic_load_n(&n->seq, __ATOMIC_ACQUIRE);
    uint64_t len = __atomic_load_n(&n->len, __ATOMIC_RELAXED);
    if (seq != c->tail + 1 || len > sizeof body) {
      refuse_notice(c, seq != c->tail + 1 ? "entry not written (torn or forged)"
                                          : "entry longer than a POOL body");
      continue;
    }
    memcpy(body, n->body, len);
    serve_notice(s, c, body, len);
  }
  ferry_pools_landed_wake(s->engine);
  wake_awaiting(c);
  return 0;
}

/* The eventfd fired: drains until the ring stays empty with sleeping set
 * (the sender checks sleeping after publishing, we check head after
 * setting it), or wakes itself for another turn after NOTICE_ROUNDS. */
static int drain_notices(ferry_shm_service *s, svc_conn *c) {
  uint64_t count;
  ssize_t r = read(c->efd, &count, sizeof count);
  (void)r; /* nonblocking: nothing to read is fine */
  for (unsigned round = 0; round < NOTICE_ROUNDS; round++) {
    __atomic_store_n(&c->post->sleeping, 0, __ATOMIC_SEQ_CST);
    if (serve_posted(s, c) != 0) {
      FERRY_WARN("shm: cut off %s (pid %d): its notice ring's indices are impossible",
                 c->sender_name, (int)c->cred.pid);
      return -1;
    }
    __atomic_store_n(&c->post->sleeping, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&c->post->head, __ATOMIC_SEQ_CST) == c->tail)
      return 0;
  }
  uint64_t one = 1;
  r = write(c->efd, &one, sizeof one);
  return 0;
}

/* Any thread (the server's, as a control connection ends), before the
 * slots go: under the lock the attached connections and their pages stay. */
void ferry_shm_peer_gone(ferry_engine *e, uint64_t peer) {
  ferry_shm_service *s = e->shm;
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  for (svc_conn *c = s->conns; c; c = c->next) {
    if (!c->attached || !c->post || c->sender != peer)
      continue;
    uint64_t n = __atomic_add_fetch(&c->reclaims, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&c->post->reclaims, n, __ATOMIC_SEQ_CST);
  }
  pthread_mutex_unlock(&s->lock);
}

/* ---- revocation ------------------------------------------------------------------- */

static int conn_hung_up(const svc_conn *c) {
  struct pollfd p = {c->fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Whether a slot of this link holds a table version older than seq: that
 * copy checked a table that may still list the revoked region. */
static int conn_copying_before(const svc_conn *c, uint64_t seq) {
  for (unsigned i = 0; i < SHM_SLOTS; i++) {
    uint64_t v = __atomic_load_n(&c->slots[i], __ATOMIC_SEQ_CST);
    if (v && v < seq)
      return 1;
  }
  return 0;
}

/* Gives up on a link: shutting its socket down makes its initiator fail
 * the chunk and stop using the link; the service thread then drops it. */
static void conn_shut(ferry_shm_service *s, svc_conn *c) {
  __atomic_store_n(&c->cut, 1, __ATOMIC_RELEASE);
  shutdown(c->fd, SHUT_RDWR);
  ssize_t unused = write(s->wake[1], "c", 1);
  (void)unused;
}

static void conn_cut(ferry_shm_service *s, svc_conn *c) {
  conn_shut(s, c);
  FERRY_WARN("shm: unregister cut off the same-host peer pid %d: a copy it began did not end "
             "within %u ms",
             (int)c->cred.pid, s->engine->cfg.timeout_ms);
}

static void pause_briefly(unsigned round) {
  if (round < 16) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 50 * 1000};
  nanosleep(&ts, NULL);
}

/* Takes a reference on every attached connection; returns how many. */
static size_t attached_conns(ferry_shm_service *s, svc_conn **out) {
  size_t n = 0;
  pthread_mutex_lock(&s->lock);
  for (svc_conn *c = s->conns; c && n < SHM_CONNS_MAX; c = c->next) {
    if (!c->attached || __atomic_load_n(&c->cut, __ATOMIC_ACQUIRE))
      continue;
    c->refs++;
    out[n++] = c;
  }
  pthread_mutex_unlock(&s->lock);
  return n;
}

/* Waits, with all connections in one loop so none uses up another's time,
 * until no link copies under a version older than seq; the ones still
 * copying at the deadline are cut off. Concurrent revocations each wait
 * for their own version, side by side (cutting a link twice is harmless). */
static void wait_links(ferry_shm_service *s, svc_conn **conns, size_t n, uint64_t seq) {
  uint64_t deadline = ferry_now_ns() + (uint64_t)s->engine->cfg.timeout_ms * 1000000ull;
  for (unsigned round = 0;; round++) {
    int late = ferry_now_ns() > deadline, waiting = 0;
    for (size_t i = 0; i < n; i++) {
      if (!conns[i] || !conn_copying_before(conns[i], seq) || conn_hung_up(conns[i])) {
        conns[i] = NULL; /* done with it: a new copy sees the new table */
        continue;
      }
      if (late)
        conn_cut(s, conns[i]);
      else
        waiting = 1;
    }
    if (!waiting)
      return;
    pause_briefly(round);
  }
}

/* The whole table is rewritten, so which regions left does not matter. */
void ferry_shm_revoke(ferry_engine *e, ferry_region *removed, size_t count) {
  ferry_shm_service *s = e->shm;
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  int attached = 0;
  for (svc_conn *c = s->conns; c && !attached; c = c->next)
    attached = c->attached;
  pthread_mutex_unlock(&s->lock);
  if (attached) {
    /* With nobody attached the table is rebuilt on the next HELLO. The new
     * version is published before the links are listed: a link attached
     * later never sees the old one. */
    uint64_t seq = table_refresh(s, 1);
    svc_conn *conns[SHM_CONNS_MAX], *held[SHM_CONNS_MAX];
    size_t n = attached_conns(s, conns);
    memcpy(held, conns, n * sizeof *conns);
    wait_links(s, conns, n, seq);
    for (size_t i = 0; i < n; i++)
      conn_release(s, held[i]);
  }
}

/* ---- the service thread ------------------------------------------------------------- */

#define POLL_MAX (2 * SHM_CONNS_MAX + 2) /* a socket and an eventfd per connection */

/* Fills the poll set (wake pipe, listener, then connections), drops the
 * connections that were cut off or missed their HELLO deadline, and
 * returns the poll timeout: until the next such deadline. */
static size_t poll_set(ferry_shm_service *s, struct pollfd *pfd, svc_conn **conns,
                       int *timeout_ms) {
  size_t n = 0;
  uint64_t now = ferry_now_ns(), next = 0;
  pfd[n++] = (struct pollfd){s->wake[0], POLLIN, 0};
  pfd[n++] = (struct pollfd){s->listen_fd, POLLIN, 0};
  pthread_mutex_lock(&s->lock);
  svc_conn *c = s->conns;
  pthread_mutex_unlock(&s->lock);
  while (c) { /* only this thread changes the list */
    svc_conn *next_conn = c->next;
    int late = c->deadline_ns && now >= c->deadline_ns;
    if (late)
      FERRY_DEBUG("shm: dropped a same-host peer (pid %d) that sent no HELLO in time",
                  (int)c->cred.pid);
    if (late || __atomic_load_n(&c->cut, __ATOMIC_ACQUIRE)) {
      conn_drop(s, c);
    } else if (n + 2 <= POLL_MAX) {
      if (c->deadline_ns && (!next || c->deadline_ns < next))
        next = c->deadline_ns;
      if (c->post) { /* notices first: a hang-up on the socket must not lose them */
        conns[n] = c;
        pfd[n++] = (struct pollfd){c->efd, POLLIN, 0};
      }
      conns[n] = c;
      pfd[n++] = (struct pollfd){c->fd, POLLIN, 0};
    }
    c = next_conn;
  }
  uint64_t wait_ms = next ? (next - now) / 1000000ull + 1 : 0;
  *timeout_ms = !next ? -1 : wait_ms > 60000 ? 60000 : (int)wait_ms;
  return n;
}

/* A readable eventfd (notices) or socket (a request, or a hang-up: the
 * notices posted just before it are served first); nonzero drops the
 * connection. */
static int serve_ready(ferry_shm_service *s, svc_conn *c, int fd) {
  if (fd == c->efd)
    return drain_notices(s, c);
  int rc = serve_request(s, c);
  if (rc && c->post)
    drain_notices(s, c);
  return rc;
}

/* The test seam's hold: parked until ferry_shm_service_hold(e, 0). */
static void park(ferry_shm_service *s) {
  pthread_mutex_lock(&s->lock);
  s->parked = 1;
  pthread_cond_broadcast(&s->held_cond);
  while (s->held)
    pthread_cond_wait(&s->held_cond, &s->lock);
  s->parked = 0;
  pthread_mutex_unlock(&s->lock);
}

void ferry_shm_service_hold(ferry_engine *e, int hold) {
  ferry_shm_service *s = e->shm;
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  s->held = hold;
  pthread_cond_broadcast(&s->held_cond);
  if (hold) {
    ssize_t unused = write(s->wake[1], "h", 1);
    (void)unused;
    while (!s->parked)
      pthread_cond_wait(&s->held_cond, &s->lock);
  }
  pthread_mutex_unlock(&s->lock);
}

void ferry_shm_service_cut_links(ferry_engine *e) {
  ferry_shm_service *s = e->shm;
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  for (svc_conn *c = s->conns; c; c = c->next)
    conn_shut(s, c);
  pthread_mutex_unlock(&s->lock);
}

static void *service_main(void *arg) {
  ferry_shm_service *s = arg;
  ferry_log_set_engine(s->engine->name);
  struct pollfd *pfd = calloc(POLL_MAX, sizeof *pfd);
  svc_conn **conns = calloc(POLL_MAX, sizeof *conns);
  while (pfd && conns) {
    int timeout_ms;
    size_t n = poll_set(s, pfd, conns, &timeout_ms);
    if (poll(pfd, n, timeout_ms) < 0 && errno != EINTR)
      break;
    if (pfd[0].revents) {
      char why = 0;
      if (read(s->wake[0], &why, 1) != 1 || (why != 'c' && why != 'h'))
        break; /* stop; 'c' only says a connection was cut off */
      if (why == 'h')
        park(s);
    }
    svc_conn *dropped = NULL; /* a connection's entries are next to each other */
    for (size_t i = 2; i < n; i++) {
      if (!pfd[i].revents || conns[i] == dropped)
        continue;
      if (serve_ready(s, conns[i], pfd[i].fd) != 0) {
        dropped = conns[i];
        conn_drop(s, conns[i]); /* only this thread unlinks connections */
      }
    }
    /* A bounded number per round: a flood does not starve the others. */
    for (int i = 0; pfd[1].revents && i < 64 && accept_one(s); i++)
      ;
  }
  free(pfd);
  free(conns);
  return NULL;
}

/* ---- start and stop ------------------------------------------------------------------ */

static ferry_status listen_abstract(ferry_shm_service *s, char *path, size_t size) {
  snprintf(path, size, "@ferry-%d-%016llx", (int)getpid(), (unsigned long long)ferry_random_u64());
  struct sockaddr_un sa;
  unsigned len;
  shm_sockaddr(path, &sa, &len);
  s->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->listen_fd < 0 || bind(s->listen_fd, (struct sockaddr *)&sa, len) < 0 ||
      listen(s->listen_fd, 64) < 0)
    return ferry_fail_errno(FERRY_ESOCKET, errno, "shm service: cannot listen on %s", path);
  return FERRY_OK;
}

/* The engine's config may point at the caller's array: keep a copy. */
static ferry_status allowed_uids_copy(ferry_shm_service *s, const ferry_config *cfg) {
  if (!cfg->shm_allowed_uid_count)
    return FERRY_OK;
  if (!cfg->shm_allowed_uids)
    return ferry_fail(FERRY_EINVAL, "shm_allowed_uid_count is %zu but shm_allowed_uids is NULL",
                      cfg->shm_allowed_uid_count);
  s->allowed_uids = malloc(cfg->shm_allowed_uid_count * sizeof *s->allowed_uids);
  if (!s->allowed_uids)
    return ferry_fail(FERRY_ENOMEM, "no memory for the shm service's allowed uids");
  memcpy(s->allowed_uids, cfg->shm_allowed_uids, cfg->shm_allowed_uid_count * sizeof(uint32_t));
  s->allowed_count = cfg->shm_allowed_uid_count;
  return FERRY_OK;
}

static ferry_status service_init(ferry_shm_service *s, char *path, size_t size) {
  void *table;
  ferry_status st =
      sealed_memfd("ferry-shm-table", SHM_TABLE_BYTES, F_SEAL_FUTURE_WRITE, &s->table_fd, &table);
  if (st)
    return st;
  s->table = table;
  st = listen_abstract(s, path, size);
  if (st)
    return st;
  if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) < 0)
    return ferry_fail_errno(FERRY_ESOCKET, errno, "shm service: pipe");
  if (pthread_create(&s->thread, NULL, service_main, s) != 0)
    return ferry_fail(FERRY_ENOMEM, "shm service: cannot start its thread");
  s->thread_started = 1;
  return FERRY_OK;
}

static void service_free(ferry_shm_service *s) {
  if (s->thread_started) {
    ssize_t unused = write(s->wake[1], "x", 1);
    (void)unused;
    pthread_join(s->thread, NULL);
  }
  while (s->conns) {
    svc_conn *c = s->conns;
    s->conns = c->next;
    conn_free(c); /* initiators see the hang-up and stop using their links */
  }
  int fds[] = {s->listen_fd, s->wake[0], s->wake[1], s->table_fd};
  for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  if (s->table)
    munmap(s->table, SHM_TABLE_BYTES);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->held_cond);
  pthread_mutex_destroy(&s->table_lock);
  free(s->allowed_uids);
  free(s->devices);
  free(s);
}

ferry_status ferry_shm_service_start(ferry_engine *e) {
  ferry_shm_service *s = calloc(1, sizeof *s);
  if (!s)
    return ferry_fail(FERRY_ENOMEM, "no memory for the shm service");
  s->engine = e;
  s->probe = e->instance_id;
  s->listen_fd = s->table_fd = s->wake[0] = s->wake[1] = -1;
  s->uid = geteuid();
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->held_cond, NULL);
  pthread_mutex_init(&s->table_lock, NULL);
  char path[sizeof e->shm_path];
  ferry_status st = allowed_uids_copy(s, &e->cfg);
  if (!st)
    st = service_init(s, path, sizeof path);
  if (st) {
    service_free(s);
    e->transports &= ~(unsigned)FERRY_TRANSPORT_SHM;
    if (!e->transports)
      return st;
    FERRY_WARN("shm transport disabled: %s", ferry_last_error());
    return FERRY_OK;
  }
  snprintf(e->shm_path, sizeof e->shm_path, "%s", path);
  e->shm = s;
  FERRY_DEBUG("shm service listening on %s", path);
  return FERRY_OK;
}

void ferry_shm_service_stop(ferry_engine *e) {
  if (!e->shm)
    return;
  ferry_shm_service *s = e->shm;
  service_free(s); /* its thread's last conn_drop may still read e->shm */
  e->shm = NULL;
  e->shm_path[0] = '\0';
}
