/* shm.c - the same-host data transport: WRITE and READ are copies made by
 * the initiator itself, with no syscall per transfer for ferry-allocated
 * memory.
 *
 * Links. The first channel to a peer opens a link: a SOCK_SEQPACKET
 * connection to the target's service (shm_service.c), which hands over its
 * region table (a memfd mapped read-only) and a page of slots. Buffers the
 * target got from ferry_memory_alloc are memfds: the link maps each one the
 * first time a transfer touches it (MAP request, fd by SCM_RIGHTS) and then
 * copies with memcpy, or with non-temporal AVX2 stores for large copies.
 * Other registered memory (malloc, numpy) is reached with process_vm_writev
 * and process_vm_readv on the target's pid (as seen through SO_PEERCRED, so
 * pid namespaces cannot mislead it). The peer's channels share one link,
 * even those opened at once ("the links of this process"); each channel
 * owns one slot. A large batch is cut into several chunks, so
 * the workers' channels copy its parts in parallel.
 *
 * Choice. usable() says yes only for a peer with our boot id whose service
 * answers and whose memory process_vm_readv may read (a probe of a word the
 * target names); otherwise the reason goes to the log and TCP is used.
 *
 * Validation and revocation. Before each chunk the channel stores the
 * table's seq in its slot, re-reads seq (both sequentially consistent),
 * checks every segment against the table, confirms seq did not move, copies
 * and clears the slot. A miss asks the service to refresh the table once
 * (new registrations), then fails with FERRY_ENOTREG. Unregistration on the
 * target rewrites the table (new seq) and then waits until no slot holds an
 * older seq. So for in-flight transfers: a chunk that passed its check
 * before the table changed may still complete, but once
 * ferry_memory_unregister (or ferry_memory_free) returns on the target, no
 * copy into the region is running and none will start; later chunks fail
 * with FERRY_ENOTREG. A target that sees no copy end within its timeout
 * cuts the link off (a stopped initiator cannot hang it); the chunk that
 * outlasted it then fails here with FERRY_ESOCKET, as the link is checked
 * after every copy.
 *
 * Trust. Links go only to a service running as this engine's uid or an
 * allowed one (SO_PEERCRED), and every memfd received (table, slots,
 * buffers) must be sealed against shrinking before it is mapped, so no
 * later act of the target or of its other peers can make a copy fault.
 *
 * Peer exit. Mapped memory stays valid after the target dies, so a copy
 * cannot crash; the link's socket then reports a hang-up, which fails the
 * chunk being completed and every later checkout of the channel, and the
 * next transfer reconnects (ping + new link) or fails with the reason.
 *
 * Device memory. The table says where each region lives (shm.h: place);
 * a target's device allocation is imported once per link (EXPORT: its
 * CUDA IPC handle, or a VMM allocation's POSIX fd by SCM_RIGHTS, as
 * buffers' memfds come; memory/kind.h import_open) and kept under maps_lock
 * like a buffer's mapping. Segments with device memory on either side are
 * copied by the device (copy_direct on the channel's copier: its own
 * stream), and the copies' events are waited for before the slot is
 * cleared, so the fence above covers them and done means landed. A local
 * device range and a remote one reached with CMA meet in the copier's
 * bounce buffer. Imports are closed under maps_lock held for writing,
 * once the table no longer lists their allocation's id (a new id follows
 * a re-registration), and when the link ends.
 *
 * Notifications still go over the control connection after the data; done
 * means the copy finished, so the bytes are in the target's memory. There
 * is no network to guard, so checksum mode does not apply here.
 *
 * Posting (pool sends). A link whose target could verify who we are (the
 * HELLO names our engine id and where our memory holds it; the service
 * reads it there with process_vm_readv) also gets a post page and an
 * eventfd (shm.h). A batch's after-landed message (pool.c's LANDED) is
 * then posted to the page's notice ring once the batch's copies are done
 * (post_after), instead of crossing the control connection: a copy into
 * the entry, a release store of its seq and of head, and a write to the
 * eventfd only when the target's service said it sleeps. The grants the
 * service answers with come back in the page's credit ring and pool.c
 * collects them before its next send (take_credits). A full ring, a
 * link without a page, or one the service is dropping (`closed`, shm.h:
 * unless its last drain served the notice), falls back to the control
 * connection. Credits
 * count only under the page's current reclaim count and from this link
 * (the epoch take_credits reports): see shm.h. A sender holding no credit
 * while notices of ours are unserved sleeps on the link's credit eventfd
 * (await_credits: the service writes it after serving them, the Dekker
 * order of shm.h; bounded by the link's hang-up and by connect_timeout_ms,
 * or by SHM_CREDIT_BRIEF_NS when pool.c would rather add a credit with a
 * control grant next) rather than spin. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
#include "base/sync.h"
#include "memory/kind.h"
#include "transport/shm.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SHM_HAVE_STREAMING 1
#endif

#define SHM_SLICE_MAX (64ull << 20) /* no frame limit: one chunk may be this large */
#define SHM_SPLIT_MIN (4ull << 20)  /* batches from here on are split across CPUs */
/* Non-temporal stores from here on. Measured on 2 cores: 64 MiB batches (two
 * 32 MiB pieces) ran about 2x faster with them; 8 MiB pieces ran slower. */
#define SHM_NT_MIN (32ull << 20)
#define SHM_RESOLVE_TRIES 64
/* How long a sender without credits sleeps, at most, for those its posted
 * notices may bring when pool.c would rather ask the control connection
 * next (FERRY_CREDITS_BRIEFLY): a fraction of a control round trip
 * (20-40 us here). */
#define SHM_CREDIT_BRIEF_NS (20ull * 1000)

/* A mapping of one of the target's memfd buffers. */
typedef struct shm_map {
  uint64_t ino, base, length; /* base/length: the buffer in the target */
  uint8_t *local;
} shm_map;

/* An import of one of the target's device allocations (shm.h: place). */
typedef struct shm_import {
  uint64_t id;         /* the allocation's id in the target's table */
  uint64_t base, size; /* the allocation in the target */
  uint64_t place;      /* SHM_PLACE: its kind and device */
  uint64_t local;      /* where it is mapped here */
  int opened;          /* 0: the target is this process, local is base */
} shm_import;

/* Most (kind, device) pairs one channel copies with at once. */
#define SHM_COPIERS 8
#define SHM_BOUNCE (1u << 20) /* device memory to or from a region reached with CMA */

typedef struct shm_link {
  int fd; /* SOCK_SEQPACKET connection to the target's service */
  pid_t pid;
  uint64_t engine_id;
  char address[FERRY_HOST_MAX + 8];
  const shm_table *table; /* read-only */
  uint64_t *slots;
  int dead;

  pthread_mutex_t lock; /* requests on fd, slot_used, refs */
  unsigned refs;
  uint8_t slot_used[SHM_SLOTS];

  pthread_rwlock_t maps_lock; /* held for reading while copying */
  shm_map *maps;
  size_t map_count, map_cap;
  shm_import *imports; /* under maps_lock too: closed only while no copy runs */
  size_t import_count, import_cap;

  shm_post *post;            /* NULL: the target offered no post page */
  int efd;                   /* wakes the target's service */
  int cefd;                  /* the target's service wakes us: credits (or their verdict) */
  pthread_mutex_t post_lock; /* this side's ends of both rings */
  pthread_mutex_t wait_lock; /* one thread at a time asleep on cefd (it reads the wake) */
  uint64_t posted, taken;    /* notices posted, credits taken (ours, not the page's; atomic) */
  uint64_t serial;           /* this engine's links, counted: the high half of credit epochs */

  const ferry_peer *owner; /* links_lock: the peer it was made for */
  struct shm_link *next;   /* links_lock: in links */
} shm_link;

typedef struct shm_channel {
  ferry_channel base;
  shm_link *link;
  unsigned slot;
  ferry_chunk chunk;
  uint8_t *mapped[FERRY_CHUNK_MAX_SEGMENTS]; /* per segment; NULL: reached with CMA */
  uint64_t device[FERRY_CHUNK_MAX_SEGMENTS]; /* per segment: remote device memory, mapped
                                                here (imported); 0: host memory */
  uint64_t place[FERRY_CHUNK_MAX_SEGMENTS];  /* and its SHM_PLACE */
  struct {
    unsigned kind;
    int device, used; /* used: copies started in this chunk */
    ferry_copier *copier;
  } copiers[SHM_COPIERS]; /* opened on first use, one per kind and device */
  struct iovec cma_local[FERRY_CHUNK_MAX_SEGMENTS];
  struct iovec cma_remote[FERRY_CHUNK_MAX_SEGMENTS];
} shm_channel;

/* ---- copying ------------------------------------------------------------------------ */

#ifdef SHM_HAVE_STREAMING
/* Streaming stores bypass the cache: no read-for-ownership of the
 * destination, which pays off once copies are far larger than the caches. */
__attribute__((target("avx2"))) static void copy_streaming(uint8_t *dst, const uint8_t *src,
                                                           size_t n) {
  while (n && ((uintptr_t)dst & 31)) {
    *dst++ = *src++;
    n--;
  }
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
    __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(src + i + 64));
    __m256i d = _mm256_loadu_si256((const __m256i *)(src + i + 96));
    _mm256_stream_si256((__m256i *)(dst + i), a);
    _mm256_stream_si256((__m256i *)(dst + i + 32), b);
    _mm256_stream_si256((__m256i *)(dst + i + 64), c);
    _mm256_stream_si256((__m256i *)(dst + i + 96), d);
  }
  _mm_sfence(); /* streaming stores are weakly ordered: complete them before "done" */
  memcpy(dst + i, src + i, n - i);
}

static int have_avx2(void) {
  static int cached = -1;
  int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx2") ? 1 : 0;
    __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
  }
  return v;
}

#else
static int have_avx2(void) { return 0; }
static void copy_streaming(uint8_t *dst, const uint8_t *src, size_t n) { memcpy(dst, src, n); }
#endif

static void copy_bytes(void *dst, const void *src, size_t n) {
  if (n >= SHM_NT_MIN && have_avx2())
    copy_streaming(dst, src, n);
  else
    memcpy(dst, src, n);
}

/* Advances a pair of iovec arrays with equal element lengths by `bytes`. */
static void iov_advance(struct iovec **a, struct iovec **b, int *n, size_t bytes) {
  while (bytes && *n) {
    size_t step = bytes < (*a)->iov_len ? bytes : (*a)->iov_len;
    (*a)->iov_base = (char *)(*a)->iov_base + step;
    (*a)->iov_len -= step;
    (*b)->iov_base = (char *)(*b)->iov_base + step;
    (*b)->iov_len -= step;
    bytes -= step;
    if ((*a)->iov_len == 0) {
      (*a)++, (*b)++, (*n)--;
    }
  }
}

static ferry_status cma_error(const shm_link *l, int err, int write) {
  const char *call = write ? "process_vm_writev" : "process_vm_readv";
  if (err == ESRCH)
    return ferry_fail(FERRY_ESOCKET, "peer %s: its process (pid %d) is gone", l->address,
                      (int)l->pid);
  if (err == EPERM)
    return ferry_fail_errno(FERRY_ETRANSPORT, err, "peer %s: %s on pid %d refused", l->address,
                            call, (int)l->pid);
  return ferry_fail_errno(FERRY_EREMOTE, err, "peer %s: %s on pid %d failed", l->address, call,
                          (int)l->pid);
}

static int table_find(const shm_table *t, uint64_t addr, uint64_t length, shm_table_entry *out);

/* A copy stopped by EFAULT at local / remote: this process's own buffer
 * when the kernel says it cannot use it so, else the target's region,
 * which its process unmapped or protected since it registered it. */
static ferry_status cma_fault(ferry_engine *e, const shm_link *l, int write,
                              const struct iovec *local, const struct iovec *remote) {
  const char *op = write ? "WRITE to" : "READ from";
  const char *call = write ? "process_vm_writev" : "process_vm_readv";
  ferry_region mine = {(uint64_t)(uintptr_t)local->iov_base, local->iov_len};
  ferry_host_problem p;
  char what[160];
  if (ferry_host_memory_find(e->host_memory, &mine, 1, !write, 0, &p) == 1) {
    ferry_host_problem_describe(&p, what, sizeof what);
    return ferry_fail(FERRY_EFAULT, "%s peer %s: this process's buffer %s (%s failed: Bad address)",
                      op, l->address, what, call);
  }
  uint64_t addr = (uint64_t)(uintptr_t)remote->iov_base;
  shm_table_entry en;
  if (!table_find(l->table, addr, 1, &en)) /* for the message only: a torn read misnames it */
    en = (shm_table_entry){addr, 0, 0, 0};
  return ferry_fail(FERRY_EFAULT,
                    "%s peer %s: its region 0x%llx (+%llu bytes) cannot be %s at 0x%llx: its "
                    "process unmapped or protected it since it registered it (%s failed: Bad "
                    "address)",
                    op, l->address, (unsigned long long)en.addr, (unsigned long long)en.length,
                    write ? "written" : "read", (unsigned long long)addr, call);
}

/* Cross-memory attach for the segments that are not in a mapped buffer. */
static ferry_status cma_move(ferry_engine *e, const shm_link *l, int write, struct iovec *local,
                             struct iovec *remote, int n) {
  while (n > 0) {
    ssize_t done =
        write ? process_vm_writev(l->pid, local, (unsigned long)n, remote, (unsigned long)n, 0)
              : process_vm_readv(l->pid, local, (unsigned long)n, remote, (unsigned long)n, 0);
    if (done < 0 && errno == EINTR)
      continue;
    if (done < 0 && errno == EFAULT) /* at local/remote: a short copy came first */
      return cma_fault(e, l, write, local, remote);
    if (done <= 0)
      return cma_error(l, done < 0 ? errno : EFAULT, write);
    iov_advance(&local, &remote, &n, (size_t)done);
  }
  return FERRY_OK;
}

/* ---- the shared table -------------------------------------------------------------- */

/* Seqlock reads are acquire loads (plain moves on x86): nothing after one,
 * such as the final check of seq, can be done before it. */
static uint64_t load64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* The entry holding [addr, addr+length) whole; a seqlock read that the
 * caller validates with table_stable. */
static int table_find(const shm_table *t, uint64_t addr, uint64_t length, shm_table_entry *out) {
  uint64_t count = load64(&t->count);
  size_t lo = 0, hi = count < SHM_TABLE_CAPACITY ? (size_t)count : SHM_TABLE_CAPACITY;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (load64(&t->entries[mid].addr) <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0)
    return 0;
  const shm_table_entry *e = &t->entries[lo - 1];
  *out =
      (shm_table_entry){load64(&e->addr), load64(&e->length), load64(&e->ino), load64(&e->place)};
  uint64_t off = addr - out->addr;
  return off < out->length && length <= out->length - off;
}

static int table_stable(const shm_table *t, uint64_t seq) { return load64(&t->seq) == seq; }

static int link_alive(shm_link *l) {
  if (__atomic_load_n(&l->dead, __ATOMIC_ACQUIRE))
    return 0;
  struct pollfd p = {l->fd, POLLRDHUP, 0};
  if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
    __atomic_store_n(&l->dead, 1, __ATOMIC_RELEASE);
    return 0;
  }
  return 1;
}

static ferry_status link_gone(shm_link *l) {
  __atomic_store_n(&l->dead, 1, __ATOMIC_RELEASE);
  return ferry_fail(FERRY_ESOCKET,
                    "peer %s: its shm service closed the link (the peer exited, or cut "
                    "the link off because a copy outlasted an unregister)",
                    l->address);
}

/* Publishes the table version this channel checks against, in a way the
 * target's revocation cannot miss (see the top comment). */
static ferry_status slot_enter(shm_channel *ch, uint64_t deadline_ns, uint64_t *seq) {
  shm_link *l = ch->link;
  uint64_t *slot = &l->slots[ch->slot];
  for (unsigned round = 0;; round++) {
    uint64_t s = __atomic_load_n(&l->table->seq, __ATOMIC_ACQUIRE);
    if (s && !(s & 1)) {
      __atomic_store_n(slot, s, __ATOMIC_SEQ_CST);
      if (__atomic_load_n(&l->table->seq, __ATOMIC_SEQ_CST) == s) {
        *seq = s;
        return FERRY_OK;
      }
      __atomic_store_n(slot, 0, __ATOMIC_RELEASE);
    }
    if (round < 16) {
      sched_yield();
      continue;
    }
    if (!link_alive(l))
      return link_gone(l);
    if (ferry_now_ns() >= deadline_ns)
      return ferry_fail(FERRY_ETIMEDOUT, "peer %s: its region table stayed locked", l->address);
    struct timespec ts = {0, 20 * 1000};
    nanosleep(&ts, NULL);
  }
}

static void slot_leave(shm_channel *ch) {
  __atomic_store_n(&ch->link->slots[ch->slot], 0, __ATOMIC_RELEASE);
}

/* ---- requests to the service --------------------------------------------------------- */

/* One request and its reply on the link; fds may be NULL. */
static ferry_status link_call(shm_link *l, const shm_msg *req, shm_msg *reply, int *fds,
                              int *nfds) {
  pthread_mutex_lock(&l->lock);
  int rc = shm_msg_send(l->fd, req, NULL, 0, 0);
  if (rc == 0)
    rc = shm_msg_recv(l->fd, reply, (shm_msg_type)(req->type + 1), fds, nfds, 0);
  pthread_mutex_unlock(&l->lock);
  if (rc == 0)
    return FERRY_OK;
  __atomic_store_n(&l->dead, 1, __ATOMIC_RELEASE); /* out of step: never reuse it */
  if (rc == -EAGAIN)
    return ferry_fail(FERRY_ETIMEDOUT, "peer %s: its shm service did not answer", l->address);
  if (rc == -EPROTO)
    return ferry_fail(FERRY_EPROTO, "peer %s: malformed message from its shm service", l->address);
  return link_gone(l);
}

/* Whether the target sealed this memfd against shrinking and it holds
 * `size` bytes: a mapping of it can then never fault, whatever the target
 * (or another of its peers) does later. */
static int sealed_at_size(int fd, uint64_t size) {
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_SHRINK) && fstat(fd, &st) == 0 &&
         (uint64_t)st.st_size >= size;
}

static ferry_status link_sync(shm_link *l) {
  shm_msg req, reply;
  shm_msg_init(&req, SHM_SYNC);
  return link_call(l, &req, &reply, NULL, NULL);
}

static const shm_map *map_find(const shm_link *l, uint64_t ino) {
  for (size_t i = 0; i < l->map_count; i++)
    if (l->maps[i].ino == ino)
      return &l->maps[i];
  return NULL;
}

/* Whether the table lists a buffer (place 0) or a device allocation
 * (place nonzero) with this inode or id. */
static int table_lists(const shm_table *t, uint64_t ino, int device) {
  uint64_t count = load64(&t->count);
  for (size_t i = 0; i < count && i < SHM_TABLE_CAPACITY; i++)
    if (load64(&t->entries[i].ino) == ino && !load64(&t->entries[i].place) == !device)
      return 1;
  return 0;
}

/* Unmaps buffers the target no longer lists (freed there: the mapping was
 * all that kept their pages). Caller holds maps_lock for writing, so no
 * copy is using them; a torn read of the table only costs a later re-map. */
static void maps_prune(shm_link *l) {
  if (load64(&l->table->seq) & 1)
    return;
  for (size_t i = l->map_count; i-- > 0;) {
    if (table_lists(l->table, l->maps[i].ino, 0))
      continue;
    munmap(l->maps[i].local, l->maps[i].length);
    l->maps[i] = l->maps[--l->map_count];
  }
}

static ferry_status maps_add(shm_link *l, const shm_map *m) {
  pthread_rwlock_wrlock(&l->maps_lock);
  ferry_status st = FERRY_OK;
  if (map_find(l, m->ino)) {
    munmap(m->local, m->length); /* another channel was faster */
  } else {
    maps_prune(l);
    if (l->map_count == l->map_cap) {
      size_t cap = l->map_cap ? l->map_cap * 2 : 8;
      shm_map *grown = realloc(l->maps, cap * sizeof *grown);
      if (grown) {
        l->maps = grown;
        l->map_cap = cap;
      }
    }
    if (l->map_count < l->map_cap)
      l->maps[l->map_count++] = *m;
    else
      st = ferry_fail(FERRY_ENOMEM, "peer %s: no memory to track a mapping", l->address);
    if (st)
      munmap(m->local, m->length);
  }
  pthread_rwlock_unlock(&l->maps_lock);
  return st;
}

/* One request about the target's region `want` (MAP, EXPORT) and its
 * reply, with the descriptors that came with it. */
static ferry_status link_ask(shm_link *l, shm_msg_type type, const shm_table_entry *want,
                             shm_msg *reply, int *fds, int *nfds) {
  shm_msg req;
  shm_msg_init(&req, type);
  req.ino = want->ino;
  req.addr = want->addr;
  req.length = want->length;
  return link_call(l, &req, reply, fds, nfds);
}

/* Asks for the memfd of the buffer with this inode, which holds the
 * registered region `want`, and maps it. */
static ferry_status link_map(shm_link *l, const shm_table_entry *want) {
  shm_msg reply;
  int fds[SHM_MAX_FDS], nfds = 0;
  ferry_status st = link_ask(l, SHM_MAP, want, &reply, fds, &nfds);
  if (st)
    return st;
  if (reply.status || nfds != 1) {
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    return FERRY_ENOTREG; /* freed meanwhile: the caller refreshes the table */
  }
  shm_map m = {want->ino, reply.addr, reply.length, MAP_FAILED};
  if (m.length && sealed_at_size(fds[0], m.length))
    m.local = mmap(NULL, m.length, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  else
    errno = EPROTO; /* unsealed or smaller than announced: touching it could fault */
  int err = errno;
  close(fds[0]);
  if (m.local == MAP_FAILED)
    return ferry_fail_errno(FERRY_EREMOTE, err, "peer %s: cannot map its %llu-byte buffer",
                            l->address, (unsigned long long)m.length);
  return maps_add(l, &m);
}

/* ---- device memory ------------------------------------------------------------------- */

static const shm_import *import_find(const shm_link *l, uint64_t id) {
  for (size_t i = 0; i < l->import_count; i++)
    if (l->imports[i].id == id)
      return &l->imports[i];
  return NULL;
}

static void import_close(const shm_import *im) {
  if (im->opened)
    ferry_kind_get(SHM_PLACE_KIND(im->place))->import_close(SHM_PLACE_DEVICE(im->place), im->local);
}

/* Closes the imports of allocations the target no longer lists (all their
 * regions unregistered: a later registration there gets a new id). Caller
 * holds maps_lock for writing: no copy through them runs (the fence). */
static void imports_prune(shm_link *l) {
  if (load64(&l->table->seq) & 1)
    return;
  for (size_t i = l->import_count; i-- > 0;) {
    if (table_lists(l->table, l->imports[i].id, 1))
      continue;
    import_close(&l->imports[i]);
    l->imports[i] = l->imports[--l->import_count];
  }
}

/* Opens the import (or, for a target in this very process, takes the
 * address as it is) and keeps it; caller holds maps_lock for writing. */
static ferry_status import_add(shm_link *l, const shm_msg *reply, int fd) {
  if (import_find(l, reply->ino))
    return FERRY_OK; /* another channel was faster */
  imports_prune(l);
  if (l->import_count == l->import_cap) {
    size_t cap = l->import_cap ? l->import_cap * 2 : 4;
    shm_import *grown = realloc(l->imports, cap * sizeof *grown);
    if (!grown)
      return ferry_fail(FERRY_ENOMEM, "peer %s: no memory to track an import", l->address);
    l->imports = grown;
    l->import_cap = cap;
  }
  shm_import im = {reply->ino, reply->addr, reply->length, reply->place, reply->addr, 0};
  if (l->pid != getpid()) {
    const ferry_memory_kind *k = ferry_kind_get(SHM_PLACE_KIND(reply->place));
    ferry_status st = k->import_open(SHM_PLACE_DEVICE(reply->place), reply->handle,
                                     reply->handle_len, fd, &im.local);
    if (st)
      return ferry_fail(st, "peer %s: cannot import its device allocation 0x%llx: %s", l->address,
                        (unsigned long long)reply->addr, ferry_last_error());
    im.opened = 1;
  }
  l->imports[l->import_count++] = im;
  return FERRY_OK;
}

/* Checks the service's EXPORTED reply (fd: what came with it, -1 if
 * nothing) and imports the allocation. */
static ferry_status link_import_reply(shm_link *l, const shm_table_entry *want, shm_msg *reply,
                                      int fd) {
  if (reply->status == FERRY_ENOTREG)
    return FERRY_ENOTREG; /* unregistered meanwhile: the caller refreshes the table */
  reply->name[sizeof reply->name - 1] = '\0';
  if (reply->status)
    return ferry_fail((ferry_status)reply->status,
                      "peer %s: its device region 0x%llx (+%llu bytes) cannot be shared with "
                      "this process: %s",
                      l->address, (unsigned long long)want->addr, (unsigned long long)want->length,
                      reply->name);
  if (reply->ino != want->ino || reply->place != want->place ||
      reply->handle_len > sizeof reply->handle || want->addr < reply->addr ||
      want->addr - reply->addr > reply->length ||
      want->length > reply->length - (want->addr - reply->addr))
    return ferry_fail(FERRY_EPROTO, "peer %s: its export of region 0x%llx does not hold it",
                      l->address, (unsigned long long)want->addr);
  pthread_rwlock_wrlock(&l->maps_lock);
  ferry_status st = import_add(l, reply, fd);
  pthread_rwlock_unlock(&l->maps_lock);
  return st;
}

/* Asks for the handle of the device allocation holding the region `want`
 * (its id in want->ino) and imports it: once per allocation and link. */
static ferry_status link_import(shm_link *l, const shm_table_entry *want) {
  const ferry_memory_kind *k = ferry_kind_get(SHM_PLACE_KIND(want->place));
  char why[256];
  if (k->id == FERRY_KIND_HOST || !k->import_open || !k->available(why, sizeof why))
    return ferry_fail(FERRY_ENOTIMPL,
                      "peer %s: its region 0x%llx (+%llu bytes) is %s:%d memory, which this "
                      "process cannot map (%s)",
                      l->address, (unsigned long long)want->addr, (unsigned long long)want->length,
                      k->name, SHM_PLACE_DEVICE(want->place),
                      k->id == FERRY_KIND_HOST ? "an unknown memory kind" : why);
  shm_msg reply;
  int fds[SHM_MAX_FDS], nfds = 0;
  ferry_status st = link_ask(l, SHM_EXPORT, want, &reply, fds, &nfds);
  if (st)
    return st;
  /* A VMM allocation's POSIX fd comes with the reply; a CUDA IPC handle
   * comes alone. The import, if any, holds its own reference. */
  st = nfds <= 1 ? link_import_reply(l, want, &reply, nfds ? fds[0] : -1)
                 : ferry_fail(FERRY_EPROTO, "peer %s: %d descriptors came with an export",
                              l->address, nfds);
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  return st;
}

/* This channel's copier for (kind, device), opened on first use: one
 * stream, one event, one bounce buffer; *index: its place in copiers. */
static ferry_status channel_copier(shm_channel *ch, unsigned kind, int device, int *index) {
  for (int i = 0; i < SHM_COPIERS; i++) {
    *index = i;
    if (ch->copiers[i].copier && ch->copiers[i].kind == kind && ch->copiers[i].device == device)
      return FERRY_OK;
    if (ch->copiers[i].copier)
      continue;
    const ferry_memory_kind *k = ferry_kind_get(kind);
    if (!k->copy_direct)
      return ferry_fail(FERRY_ENOTIMPL, "%s memory cannot be copied directly", k->name);
    ferry_status st = k->copier_open(device, 1, SHM_BOUNCE, &ch->copiers[i].copier);
    ch->copiers[i].kind = kind;
    ch->copiers[i].device = device;
    return st;
  }
  return ferry_fail(FERRY_ENOTIMPL, "a shm channel copies with at most %d devices at once",
                    SHM_COPIERS);
}

/* Waits for every copy this chunk started (done means landed); the first
 * failure. Every copier is waited for, so none runs after the chunk. */
static ferry_status copiers_wait(shm_channel *ch) {
  ferry_status first = FERRY_OK;
  for (int i = 0; i < SHM_COPIERS; i++) {
    if (!ch->copiers[i].used)
      continue;
    ch->copiers[i].used = 0;
    ferry_copier *c = ch->copiers[i].copier;
    ferry_status st = c->kind->copy_wait(c, 0);
    if (st && !first)
      first = st;
  }
  return first;
}

static void copiers_close(shm_channel *ch) {
  for (int i = 0; i < SHM_COPIERS; i++)
    if (ch->copiers[i].copier)
      ch->copiers[i].copier->kind->copier_close(ch->copiers[i].copier);
}

/* Local device memory to or from a remote region reached with CMA: through
 * the copier's bounce buffer, a slice at a time (the one path with a host
 * bounce: the region is not mapped here). */
static ferry_status bounce_move(shm_channel *ch, ferry_copier *c, int write, uint8_t *local,
                                uint64_t remote, size_t len) {
  const ferry_memory_kind *k = c->kind;
  for (size_t off = 0; off < len;) {
    size_t n = len - off < c->slot_size ? len - off : c->slot_size;
    struct iovec here = {c->bounce[0], n}, there = {(void *)(uintptr_t)(remote + off), n};
    ferry_status st = FERRY_OK;
    if (write && !(st = k->copy_start(c, 0, (uint64_t)(uintptr_t)(local + off), n, 1)))
      st = k->copy_wait(c, 0);
    if (!st)
      st = cma_move(ch->base.peer->engine, ch->link, write, &here, &there, 1);
    if (!write && !st && !(st = k->copy_start(c, 0, (uint64_t)(uintptr_t)(local + off), n, 0)))
      st = k->copy_wait(c, 0);
    if (st)
      return st;
    off += n;
  }
  return FERRY_OK;
}

/* One segment with device memory on either side: a direct copy on the
 * copier of the remote allocation's device (or the local memory's), started
 * here and waited for by copiers_wait. */
static ferry_status device_segment(shm_channel *ch, const ferry_chunk *c, uint32_t i,
                                   const ferry_where *mine) {
  int write = c->op == FERRY_OP_WRITE, index;
  uint8_t *local = c->local[i].iov_base;
  size_t len = c->local[i].iov_len;
  unsigned kind = ch->place[i] ? SHM_PLACE_KIND(ch->place[i]) : mine->kind;
  int device = ch->place[i] ? SHM_PLACE_DEVICE(ch->place[i]) : mine->device;
  ferry_status st = channel_copier(ch, kind, device, &index);
  if (st)
    return st;
  ferry_copier *cp = ch->copiers[index].copier;
  uint64_t remote = ch->device[i] ? ch->device[i] : (uint64_t)(uintptr_t)ch->mapped[i];
  if (!remote) /* local device memory, remote host memory reached with CMA */
    return bounce_move(ch, cp, write, local, c->remote[i].addr, len);
  ch->copiers[index].used = 1;
  uint64_t here = (uint64_t)(uintptr_t)local;
  return cp->kind->copy_direct(cp, 0, write ? remote : here, write ? here : remote, len);
}

/* ---- one chunk ------------------------------------------------------------------------ */

typedef enum resolve_result { RESOLVED, MISSING, NEED_MAP, NEED_IMPORT } resolve_result;

/* Finds every segment in the table and its mapping (if any). Caller holds
 * maps_lock for reading and is inside its slot. */
static resolve_result resolve(shm_channel *ch, const ferry_chunk *c, uint32_t *bad,
                              shm_table_entry *need) {
  shm_link *l = ch->link;
  for (uint32_t i = 0; i < c->count; i++) {
    shm_table_entry en;
    uint64_t addr = c->remote[i].addr, len = c->remote[i].length;
    if (!table_find(l->table, addr, len, &en)) {
      *bad = i;
      return MISSING;
    }
    ch->mapped[i] = NULL;
    ch->device[i] = ch->place[i] = 0;
    if (en.place) {
      const shm_import *im = import_find(l, en.ino);
      if (!im) {
        *bad = i;
        *need = en;
        return NEED_IMPORT;
      }
      if (addr < im->base || addr - im->base > im->size || len > im->size - (addr - im->base)) {
        *bad = i;
        return MISSING;
      }
      ch->device[i] = im->local + (addr - im->base);
      ch->place[i] = im->place;
      continue;
    }
    if (!en.ino)
      continue;
    const shm_map *m = map_find(l, en.ino);
    if (!m) {
      *bad = i;
      *need = en;
      return NEED_MAP;
    }
    if (addr < m->base || addr - m->base > m->length || len > m->length - (addr - m->base)) {
      *bad = i;
      return MISSING; /* table and buffer disagree: treat as not registered */
    }
    ch->mapped[i] = m->local + (addr - m->base);
  }
  return RESOLVED;
}

/* Whether this local range is device memory (*where then says whose). */
static int local_device(ferry_engine *e, const struct iovec *local, ferry_where *where) {
  return ferry_registry_device_regions(e->registry) &&
         ferry_registry_where(e->registry, (uint64_t)(uintptr_t)local->iov_base, local->iov_len,
                              where) &&
         !where->cpu_access;
}

/* Copies a resolved chunk: segments with device memory on either side by
 * the device's copies (waited for before the chunk ends: the fence covers
 * them), mapped segments by memcpy, the rest by CMA. */
static ferry_status move(shm_channel *ch, const ferry_chunk *c) {
  ferry_engine *e = ch->base.peer->engine;
  int write = c->op == FERRY_OP_WRITE, n = 0;
  ferry_status st = FERRY_OK;
  for (uint32_t i = 0; i < c->count; i++) {
    void *local = c->local[i].iov_base;
    size_t len = c->local[i].iov_len;
    ferry_where mine = {0};
    if (ch->device[i] || local_device(e, &c->local[i], &mine)) {
      if (!st)
        st = device_segment(ch, c, i, &mine);
      continue;
    }
    if (ch->mapped[i]) {
      copy_bytes(write ? (void *)ch->mapped[i] : local, write ? local : ch->mapped[i], len);
      continue;
    }
    ch->cma_local[n] = c->local[i];
    ch->cma_remote[n++] = (struct iovec){(void *)(uintptr_t)c->remote[i].addr, len};
  }
  ferry_status waited = copiers_wait(ch);
  if (!st)
    st = waited;
  if (!st && n)
    st = cma_move(e, ch->link, write, ch->cma_local, ch->cma_remote, n);
  return st;
}

static ferry_status refuse(const shm_link *l, const ferry_chunk *c, uint32_t i) {
  const char *why = load64(&l->table->truncated) ? " (its shared table is full)" : "";
  return ferry_fail(FERRY_ENOTREG, "remote address 0x%llx (+%llu bytes) is not registered at %s%s",
                    (unsigned long long)c->remote[i].addr, (unsigned long long)c->remote[i].length,
                    l->address, why);
}

/* Checks and copies one chunk (see the top comment for the protocol). */
static ferry_status copy_chunk(shm_channel *ch, const ferry_chunk *c, uint64_t deadline_ns) {
  shm_link *l = ch->link;
  int synced = 0;
  for (unsigned tries = 0; tries < SHM_RESOLVE_TRIES; tries++) {
    uint32_t bad = 0;
    uint64_t seq = 0;
    shm_table_entry need = {0, 0, 0, 0};
    pthread_rwlock_rdlock(&l->maps_lock);
    ferry_status st = slot_enter(ch, deadline_ns, &seq);
    resolve_result r = st ? MISSING : resolve(ch, c, &bad, &need);
    int stable = !st && table_stable(l->table, seq);
    if (stable && r == RESOLVED)
      st = move(ch, c);
    slot_leave(ch);
    pthread_rwlock_unlock(&l->maps_lock);
    if (st || (stable && r == RESOLVED))
      return st;
    if (!stable)
      continue; /* the table changed while we read it */
    if (r == NEED_MAP && (st = link_map(l, &need)) != FERRY_ENOTREG) {
      if (st)
        return st;
      continue;
    }
    if (r == NEED_IMPORT && (st = link_import(l, &need)) != FERRY_ENOTREG) {
      if (st)
        return st;
      continue;
    }
    if (synced++)
      return refuse(l, c, bad);
    if ((st = link_sync(l)) != FERRY_OK)
      return st;
  }
  return ferry_fail(FERRY_EBUSY, "peer %s: its region table kept changing under the transfer",
                    l->address);
}

/* Chunk size: small batches in one piece, large ones split so that every
 * CPU's driver gets a part. */
static size_t shm_slice(const ferry_batch *b) {
  static long cpus;
  long n = __atomic_load_n(&cpus, __ATOMIC_RELAXED);
  if (!n) {
    n = sysconf(_SC_NPROCESSORS_ONLN);
    n = n < 1 ? 1 : n;
    __atomic_store_n(&cpus, n, __ATOMIC_RELAXED);
  }
  if (b->total_bytes < SHM_SPLIT_MIN || n == 1)
    return SHM_SLICE_MAX;
  uint64_t part = (b->total_bytes + (uint64_t)n - 1) / (uint64_t)n;
  part = (part + 65535) & ~65535ull;
  return part < SHM_SLICE_MAX ? (size_t)part : SHM_SLICE_MAX;
}

static ferry_status chan_drive(ferry_channel *base, ferry_batch *b) {
  shm_channel *ch = (shm_channel *)base;
  size_t slice = shm_slice(b);
  ferry_status first = FERRY_OK;
  while (!base->broken && ferry_batch_claim(b, slice, &ch->chunk)) {
    ferry_status st = copy_chunk(ch, &ch->chunk, b->deadline_ns);
    if (!st && !link_alive(ch->link))
      st = link_gone(ch->link); /* the bytes went to a process that is gone */
    if (st == FERRY_ESOCKET || st == FERRY_EPROTO || st == FERRY_ETRANSPORT)
      base->broken = 1;
    if (st && !first)
      first = st;
    ferry_stats_moved(base->peer, base->transport, &ch->chunk, st);
    ferry_batch_complete(b, st);
    if (!base->broken)
      base->replied_ns = ferry_now_ns(); /* the link was seen alive after the copy */
  }
  return first;
}

/* ---- links ------------------------------------------------------------------------------ */

static ferry_status unix_connect(const char *path, uint32_t timeout_ms, const char *address,
                                 int *out) {
  struct sockaddr_un sa;
  unsigned len;
  if (shm_sockaddr(path, &sa, &len) != 0)
    return ferry_fail(FERRY_EHANDSHAKE, "peer %s advertises a bad shm socket name", address);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
      connect(fd, (struct sockaddr *)&sa, len) < 0) {
    int err = errno;
    if (fd >= 0)
      close(fd);
    return ferry_fail_errno(FERRY_ESOCKET, err, "connect to the shm socket %s of %s", path,
                            address);
  }
  *out = fd;
  return FERRY_OK;
}

/* What the peer's handshake said about its shm service. */
typedef struct shm_peer {
  uint64_t engine_id;
  char path[FERRY_WIRE_MAX_NAME + 1]; /* its UNIX socket */
} shm_peer;

/* Reads the peer's shm descriptor, its socket path; 0 when it has none or
 * the descriptor is no path (empty, or with a NUL in it). */
static int peer_of(const ferry_hello_reply *info, shm_peer *sp) {
  const ferry_wire_descriptor *d = ferry_wire_descriptor_find(info, FERRY_TRANSPORT_SHM);
  if (!d || !d->len || d->len > FERRY_WIRE_MAX_NAME || memchr(d->data, '\0', d->len))
    return 0;
  memcpy(sp->path, d->data, d->len);
  sp->path[d->len] = '\0';
  sp->engine_id = info->engine_id;
  return 1;
}

/* The descriptor: the service's socket path, without its NUL. */
static size_t shm_describe(ferry_engine *e, uint8_t *out, size_t size) {
  size_t n = strnlen(e->shm_path, sizeof e->shm_path);
  if (n > size)
    return 0;
  memcpy(out, e->shm_path, n);
  return n;
}

/* The service's first message: a refusal, or the greeting of the engine
 * the peer's handshake named. */
static ferry_status read_greeting(int fd, const shm_peer *sp, const char *address,
                                  shm_msg *greeting) {
  int rc = shm_msg_recv(fd, greeting, SHM_GREETING, NULL, NULL, 0);
  if (rc)
    return ferry_fail_errno(FERRY_EHANDSHAKE, -rc, "no greeting from the shm service of %s",
                            address);
  if (greeting->status == FERRY_EBUSY)
    return ferry_fail(FERRY_EBUSY,
                      "the shm service of %s refused this process: it has too many "
                      "same-host connections",
                      address);
  if (greeting->status)
    return ferry_fail(FERRY_EAUTH,
                      "the shm service of %s refused this process (uid %u): it serves only its "
                      "own user and the uids it allows",
                      address, (unsigned)geteuid());
  if (greeting->engine_id != sp->engine_id)
    return ferry_fail(FERRY_EHANDSHAKE, "the shm socket %s belongs to another engine than %s",
                      sp->path, address);
  return FERRY_OK;
}

/* Connects to the service and reads its greeting; *pid gets the target's
 * pid in this process's namespace (0 when it is not visible here). The
 * service must run as a user this engine serves too: the bytes written
 * over the link would otherwise go to another user. */
static ferry_status service_open(const ferry_engine *e, const shm_peer *sp, const char *address,
                                 int *fd, shm_msg *greeting, pid_t *pid) {
  ferry_status st = unix_connect(sp->path, e->cfg.connect_timeout_ms, address, fd);
  if (st)
    return st;
  struct ucred cred = {0};
  socklen_t len = sizeof cred;
  if (getsockopt(*fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
    st = ferry_fail_errno(FERRY_ESOCKET, errno, "SO_PEERCRED on the shm socket of %s", address);
  else if (!ferry_shm_uid_allowed(e, cred.uid))
    st = ferry_fail(FERRY_EAUTH, "the shm service %s of %s runs as uid %u, not as this user",
                    sp->path, address, (unsigned)cred.uid);
  else
    st = read_greeting(*fd, sp, address, greeting);
  if (st) {
    close(*fd);
    return st;
  }
  *pid = cred.pid;
  return FERRY_OK;
}

/* Whether process_vm_readv may read the target: it must return the engine
 * id stored at the probe address, which also proves pid is the right one. */
static int cma_permitted(pid_t pid, const shm_msg *greeting, char *why, size_t size) {
  uint64_t value = 0;
  struct iovec local = {&value, sizeof value};
  struct iovec remote = {(void *)(uintptr_t)greeting->probe_addr, sizeof value};
  if (pid <= 0) {
    snprintf(why, size, "the peer's process is not visible here (another pid namespace)");
    return 0;
  }
  ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n == (ssize_t)sizeof value && value == greeting->engine_id)
    return 1;
  snprintf(why, size, "process_vm_readv on pid %d %s%s", (int)pid,
           n < 0 ? "refused: " : "read the wrong process",
           n < 0 ? (errno == EPERM ? "permission denied (ptrace scope or different users)"
                                   : strerror(errno))
                 : "");
  return 0;
}

static int shm_usable(ferry_engine *e, const ferry_hello_reply *info, char *why, size_t size) {
  static const uint8_t zero[FERRY_WIRE_BOOT_ID_SIZE];
  if (memcmp(info->boot_id, e->boot_id, sizeof zero) != 0 || !memcmp(e->boot_id, zero, sizeof zero))
    return snprintf(why, size, "another host (boot ids differ)"), 0;
  shm_peer sp;
  if (!peer_of(info, &sp))
    return snprintf(why, size, "the peer runs no shm service"), 0;
  int fd;
  shm_msg greeting;
  pid_t pid;
  if (service_open(e, &sp, "this peer", &fd, &greeting, &pid) == FERRY_OK) {
    close(fd);
    if (cma_permitted(pid, &greeting, why, size))
      return 1;
  } else {
    snprintf(why, size, "%s", ferry_last_error());
  }
  FERRY_WARN("shm transport not used with the engine on %s: %s; using TCP for that peer", sp.path,
             why);
  return 0;
}

/* Maps the post page (fds[2]) and keeps the eventfds (fds[3], fds[4],
 * taken out of fds); without them the link still copies, and posts
 * nothing. */
static void link_post_page(shm_link *l, int *fds) {
  if (!sealed_at_size(fds[2], sizeof(shm_post)))
    return;
  void *p = mmap(NULL, sizeof(shm_post), PROT_READ | PROT_WRITE, MAP_SHARED, fds[2], 0);
  if (p == MAP_FAILED)
    return;
  l->post = p;
  l->efd = fds[3];
  l->cefd = fds[4];
  fds[3] = fds[4] = -1;
}

/* HELLO (with the proof of the shared secret, and who we are) and the
 * ATTACH reply, which carries the table, this link's slots and maybe its
 * post page. */
static ferry_status link_attach(shm_link *l, const ferry_engine *e, const shm_msg *greeting) {
  shm_msg hello, reply;
  shm_msg_init(&hello, SHM_HELLO);
  ferry_auth_nonce(hello.nonce);
  if (greeting->auth_required && e->secret)
    ferry_auth_proof(e->secret, FERRY_AUTH_INITIATOR, hello.nonce, greeting->nonce, hello.proof);
  hello.engine_id = e->instance_id;
  hello.probe_addr = (uint64_t)(uintptr_t)&e->instance_id;
  snprintf(hello.name, sizeof hello.name, "%.*s", FERRY_WIRE_MAX_NAME, e->name);
  int fds[SHM_MAX_FDS], nfds = 0;
  ferry_status st = link_call(l, &hello, &reply, fds, &nfds);
  if (st)
    return st;
  if (reply.status || (nfds != 2 && nfds != 5) || !sealed_at_size(fds[0], SHM_TABLE_BYTES) ||
      !sealed_at_size(fds[1], SHM_SLOTS_BYTES)) {
    st = ferry_fail(reply.status ? (ferry_status)reply.status : FERRY_EHANDSHAKE,
                    "the shm service of %s refused the link%s", l->address,
                    reply.status == FERRY_EAUTH ? " (shared secret)" : "");
  } else {
    void *t = mmap(NULL, SHM_TABLE_BYTES, PROT_READ, MAP_SHARED, fds[0], 0);
    void *s = mmap(NULL, SHM_SLOTS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
    l->table = t == MAP_FAILED ? NULL : t;
    l->slots = s == MAP_FAILED ? NULL : s;
    if (!l->table || !l->slots)
      st = ferry_fail(FERRY_ENOMEM, "cannot map the shm table of %s", l->address);
    else if (nfds == 5)
      link_post_page(l, fds);
  }
  for (int i = 0; i < nfds; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  return st;
}

static void link_destroy(shm_link *l) {
  for (size_t i = 0; i < l->map_count; i++)
    munmap(l->maps[i].local, l->maps[i].length);
  free(l->maps);
  for (size_t i = 0; i < l->import_count; i++)
    import_close(&l->imports[i]);
  free(l->imports);
  if (l->table)
    munmap((void *)l->table, SHM_TABLE_BYTES);
  if (l->slots)
    munmap(l->slots, SHM_SLOTS_BYTES);
  if (l->post)
    munmap(l->post, sizeof(shm_post));
  if (l->efd >= 0)
    close(l->efd);
  if (l->cefd >= 0)
    close(l->cefd);
  if (l->fd >= 0)
    close(l->fd);
  pthread_mutex_destroy(&l->post_lock);
  pthread_mutex_destroy(&l->wait_lock);
  pthread_mutex_destroy(&l->lock);
  pthread_rwlock_destroy(&l->maps_lock);
  free(l);
}

static shm_link *link_alloc(const char *address) {
  shm_link *l = calloc(1, sizeof *l);
  if (!l)
    return NULL;
  l->fd = l->efd = l->cefd = -1;
  snprintf(l->address, sizeof l->address, "%s", address);
  pthread_mutex_init(&l->lock, NULL);
  pthread_mutex_init(&l->post_lock, NULL);
  pthread_mutex_init(&l->wait_lock, NULL);
  ferry_rwlock_init(&l->maps_lock);
  return l;
}

/* A new link to the peer as it is now: the ping reconnects the control
 * connection if the peer restarted, which refreshes its facts. */
static ferry_status link_create(ferry_peer *p, uint64_t deadline_ns, shm_link **out) {
  ferry_status st = ferry_peer_ping(p, deadline_ns);
  if (st)
    return st;
  ferry_hello_reply info;
  char address[sizeof p->address];
  pthread_mutex_lock(&p->lock);
  info = p->info;
  snprintf(address, sizeof address, "%s", p->address);
  pthread_mutex_unlock(&p->lock);
  shm_peer sp;
  if (!peer_of(&info, &sp))
    return ferry_fail(FERRY_ETRANSPORT, "peer %s no longer offers shm", address);
  shm_link *l = link_alloc(address);
  if (!l)
    return ferry_fail(FERRY_ENOMEM, "no memory for a shm link to %s", address);
  shm_msg greeting;
  st = service_open(p->engine, &sp, address, &l->fd, &greeting, &l->pid);
  if (!st)
    st = link_attach(l, p->engine, &greeting);
  if (st) {
    link_destroy(l);
    return st;
  }
  l->engine_id = info.engine_id;
  static uint64_t links_made;
  l->serial = __atomic_add_fetch(&links_made, 1, __ATOMIC_RELAXED);
  FERRY_DEBUG("shm link to %s (pid %d) attached", address, (int)l->pid);
  *out = l;
  return FERRY_OK;
}

/* Takes a free slot and a reference; 0 when the link is full. */
static int link_join(shm_link *l, unsigned *slot) {
  int joined = 0;
  pthread_mutex_lock(&l->lock);
  for (unsigned i = 0; i < SHM_SLOTS && !joined; i++) {
    if (l->slot_used[i])
      continue;
    l->slot_used[i] = 1;
    l->refs++;
    *slot = i;
    joined = 1;
  }
  pthread_mutex_unlock(&l->lock);
  return joined;
}

/* ---- the links of this process ---------------------------------------------------------- */

/* Channels to one peer share a link, so each of the target's buffers is
 * mapped once here and each page faults in once, not once per link. A
 * batch's workers open channels in parallel, and a channel enters its
 * peer's list only after channel_open returns, so links are listed here
 * from the moment they are made until destroyed: of two made in a race for
 * one peer, the second is dropped for the first. Lock order: a peer's lock,
 * then links_lock, then a link's lock. */
static pthread_mutex_t links_lock = PTHREAD_MUTEX_INITIALIZER;
static shm_link *links;

/* A listed live link of peer p to incarnation engine_id with a free slot,
 * joined. Caller holds links_lock, so no listed link is destroyed meanwhile. */
static shm_link *links_join(const ferry_peer *p, uint64_t engine_id, unsigned *slot) {
  for (shm_link *l = links; l; l = l->next)
    if (l->owner == p && l->engine_id == engine_id && link_alive(l) && link_join(l, slot))
      return l;
  return NULL;
}

static void links_unlist(shm_link *l) {
  for (shm_link **at = &links; *at; at = &(*at)->next)
    if (*at == l) {
      *at = l->next;
      return;
    }
}

/* Drops a reference (and the slot, unless SHM_SLOTS: none). The last one
 * is dropped under links_lock, so links_join never joins a link that is
 * being destroyed. */
static void link_leave(shm_link *l, unsigned slot) {
  pthread_mutex_lock(&l->lock);
  if (slot < SHM_SLOTS)
    l->slot_used[slot] = 0;
  int others = l->refs > 1;
  if (others)
    l->refs--;
  pthread_mutex_unlock(&l->lock);
  if (others)
    return;
  pthread_mutex_lock(&links_lock);
  pthread_mutex_lock(&l->lock);
  int last = --l->refs == 0;
  pthread_mutex_unlock(&l->lock);
  if (last)
    links_unlist(l);
  pthread_mutex_unlock(&links_lock);
  if (last)
    link_destroy(l);
}

/* The peer's listed link to its current incarnation, joined, else a new
 * one (listed and joined) unless another channel listed one meanwhile. */
static ferry_status link_for(ferry_peer *p, uint64_t deadline_ns, shm_link **out, unsigned *slot) {
  pthread_mutex_lock(&p->lock);
  uint64_t engine_id = p->info.engine_id;
  pthread_mutex_unlock(&p->lock);
  pthread_mutex_lock(&links_lock);
  *out = links_join(p, engine_id, slot);
  pthread_mutex_unlock(&links_lock);
  if (*out)
    return FERRY_OK;
  shm_link *made;
  ferry_status st = link_create(p, deadline_ns, &made);
  if (st)
    return st;
  pthread_mutex_lock(&links_lock);
  *out = links_join(p, made->engine_id, slot);
  if (!*out) {
    made->owner = p;
    made->next = links;
    links = made;
    link_join(made, slot);
    *out = made;
  }
  pthread_mutex_unlock(&links_lock);
  if (*out != made)
    link_destroy(made); /* never listed nor joined: only this thread knows it */
  return FERRY_OK;
}

/* ---- posting ------------------------------------------------------------------------------ */

/* A live link of this peer to incarnation instance that has a post page,
 * with a reference taken (link_leave(l, SHM_SLOTS) drops it). */
static shm_link *post_link(ferry_peer *p, uint64_t instance) {
  shm_link *found = NULL;
  pthread_mutex_lock(&p->lock);
  for (ferry_channel *c = p->all; c && !found; c = c->next_all) {
    shm_link *l = c->transport == &ferry_transport_shm ? ((shm_channel *)c)->link : NULL;
    if (!l || !l->post || l->engine_id != instance || __atomic_load_n(&l->dead, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&l->post->closed, __ATOMIC_ACQUIRE))
      continue; /* a closing link counts no more as ours there: its credits may be void */
    pthread_mutex_lock(&l->lock);
    l->refs++;
    pthread_mutex_unlock(&l->lock);
    found = l;
  }
  pthread_mutex_unlock(&p->lock);
  return found;
}

/* The link closed after notice `index` was published: whether the
 * service's last drain served it. It stores SHM_DRAINED within
 * microseconds; a target that died meanwhile never does, and after
 * wait_ms its notice counts as not served (the batch sends it on the
 * control connection, which then fails or lands it). */
static int served_before_close(shm_link *l, uint64_t index, uint32_t wait_ms) {
  shm_post *q = l->post;
  uint64_t deadline = ferry_now_ns() + wait_ms * 1000000ull;
  for (unsigned round = 0; __atomic_load_n(&q->closed, __ATOMIC_SEQ_CST) != SHM_DRAINED; round++) {
    if (ferry_now_ns() >= deadline)
      return 0;
    struct timespec ts = {0, round < 16 ? 1000 : 100 * 1000};
    nanosleep(&ts, NULL);
  }
  return __atomic_load_n(&q->tail, __ATOMIC_SEQ_CST) > index;
}

/* One notice into the ring; 0 when it is full, or when the link closed
 * before the service could take it (shm.h: `closed`). The target reads
 * head and sleeping in the opposite order (shm_service.c), so either it
 * sees this notice or we see it sleeping and wake it. */
static int post_notice(shm_link *l, const ferry_after *a, uint32_t wait_ms) {
  shm_post *q = l->post;
  pthread_mutex_lock(&l->post_lock);
  uint64_t head = l->posted;
  int room = head - __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE) < SHM_NOTICES;
  int closed = 0;
  if (room) {
    shm_notice *n = &q->notices[head % SHM_NOTICES];
    memcpy(n->body, a->body, a->len);
    __atomic_store_n(&n->len, (uint64_t)a->len, __ATOMIC_RELAXED);
    __atomic_store_n(&n->seq, head + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&l->posted, head + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&q->head, head + 1, __ATOMIC_SEQ_CST);
    closed = __atomic_load_n(&q->closed, __ATOMIC_SEQ_CST) != 0;
    if (!closed && __atomic_load_n(&q->sleeping, __ATOMIC_SEQ_CST)) {
      uint64_t one = 1;
      ssize_t w = write(l->efd, &one, sizeof one);
      (void)w; /* a full counter already wakes it */
    }
  }
  pthread_mutex_unlock(&l->post_lock);
  return room && (!closed || served_before_close(l, head, wait_ms));
}

static int shm_post_after(ferry_peer *p, uint64_t instance, const ferry_after *after) {
  shm_link *l = post_link(p, instance);
  if (!l)
    return 0;
  int posted =
      after->len <= FERRY_WIRE_POOL_MAX && post_notice(l, after, p->engine->cfg.connect_timeout_ms);
  link_leave(l, SHM_SLOTS);
  return posted;
}

/* Whether credits may still come: none is waiting to be taken and the
 * target has notices of ours it did not serve yet. */
static int credits_coming(shm_link *l) {
  shm_post *q = l->post;
  return __atomic_load_n(&q->credits_given, __ATOMIC_SEQ_CST) ==
             __atomic_load_n(&l->taken, __ATOMIC_RELAXED) &&
         __atomic_load_n(&q->tail, __ATOMIC_SEQ_CST) !=
             __atomic_load_n(&l->posted, __ATOMIC_RELAXED);
}

/* Sleeps (no spin, post_lock not held, so other threads still post)
 * until the credits our unserved notices may bring come, the target
 * served them without any, the link hangs up, or deadline_ns: counted in
 * `awaiting`, the target's service writes cefd after serving (shm.h).
 * One sleeper at a time, since the one woken takes the wake; the next
 * looks again once it has the lock. */
static void await_credits(shm_link *l, uint64_t deadline_ns) {
  shm_post *q = l->post;
  pthread_mutex_lock(&l->wait_lock);
  __atomic_add_fetch(&q->awaiting, 1, __ATOMIC_SEQ_CST); /* before the loads: shm.h */
  for (uint64_t now = ferry_now_ns(); credits_coming(l) && now < deadline_ns;
       now = ferry_now_ns()) {
    struct pollfd p[2] = {{l->cefd, POLLIN, 0}, {l->fd, POLLRDHUP, 0}};
    struct timespec left = ferry_timespec(deadline_ns - now);
    if (ppoll(p, 2, &left, NULL) > 0 && p[1].revents)
      break; /* the link is gone: no credit comes that way */
    uint64_t count;
    ssize_t r = read(l->cefd, &count, sizeof count);
    (void)r; /* nonblocking: another waiter may have read it */
  }
  __atomic_sub_fetch(&q->awaiting, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&l->wait_lock);
}

/* The credits given and not taken yet, of the page's current reclaim
 * count (older ones name slots the target took back); a count past the
 * ring's size is the target's error: those are skipped. *epoch: this
 * link and that count, so credits of an earlier link or count are void. */
static size_t take_from(shm_link *l, ferry_credit *out, size_t max, int wait, uint64_t deadline_ns,
                        uint64_t *epoch) {
  shm_post *q = l->post;
  size_t n = 0;
  if (wait)
    await_credits(l, deadline_ns);
  pthread_mutex_lock(&l->post_lock);
  uint64_t reclaims = __atomic_load_n(&q->reclaims, __ATOMIC_ACQUIRE);
  *epoch = l->serial << 32 | (uint32_t)reclaims;
  uint64_t given = __atomic_load_n(&q->credits_given, __ATOMIC_ACQUIRE);
  uint64_t taken = given - l->taken > SHM_CREDITS ? given : l->taken;
  for (; taken != given && n < max; taken++) {
    const shm_credit *c = &q->credits[taken % SHM_CREDITS];
    if (__atomic_load_n(&c->seq, __ATOMIC_ACQUIRE) != taken + 1 || c->reclaims != reclaims)
      continue;
    ferry_wire_grant_decode(c->grant, &out[n].grant);
    out[n].issued_ns = c->issued_ns;
    memcpy(out[n].pool, c->pool, sizeof out[n].pool);
    out[n].pool[sizeof out[n].pool - 1] = '\0';
    n++;
  }
  __atomic_store_n(&l->taken, taken, __ATOMIC_RELAXED);
  __atomic_store_n(&q->credits_taken, taken, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&l->post_lock);
  return n;
}

static size_t shm_take_credits(ferry_peer *p, uint64_t instance, ferry_credit *out, size_t max,
                               int wait, uint64_t *epoch) {
  shm_link *l = post_link(p, instance);
  *epoch = 0;
  if (!l)
    return 0;
  uint64_t wait_ns = wait == FERRY_CREDITS_BRIEFLY
                         ? SHM_CREDIT_BRIEF_NS
                         : (uint64_t)p->engine->cfg.connect_timeout_ms * 1000000ull;
  size_t n = take_from(l, out, max, wait, ferry_now_ns() + wait_ns, epoch);
  link_leave(l, SHM_SLOTS);
  return n;
}

/* ---- channels ----------------------------------------------------------------------------- */

static ferry_status chan_open(ferry_peer *p, uint64_t deadline_ns, ferry_channel **out) {
  shm_channel *ch = calloc(1, sizeof *ch);
  if (!ch)
    return ferry_fail(FERRY_ENOMEM, "no memory for a shm channel to %s", p->address);
  ferry_status st = link_for(p, deadline_ns, &ch->link, &ch->slot);
  if (st) {
    free(ch);
    return st;
  }
  ch->base.transport = &ferry_transport_shm;
  ch->base.peer = p;
  ch->base.peer_instance = ch->link->engine_id;
  *out = &ch->base;
  return FERRY_OK;
}

static int chan_alive(ferry_channel *base) { return link_alive(((shm_channel *)base)->link); }

static void chan_shutdown(ferry_channel *base) {
  shm_link *l = ((shm_channel *)base)->link;
  __atomic_store_n(&l->dead, 1, __ATOMIC_RELEASE);
  shutdown(l->fd, SHUT_RDWR);
}

static void chan_close(ferry_channel *base) {
  shm_channel *ch = (shm_channel *)base;
  copiers_close(ch);
  link_leave(ch->link, ch->slot);
  free(ch);
}

const ferry_transport ferry_transport_shm = {
    .name = "shm",
    .id = FERRY_TRANSPORT_SHM,
    .usable = shm_usable,
    .slice_size = shm_slice,
    .channel_open = chan_open,
    .channel_drive = chan_drive,
    .post_after = shm_post_after,
    .pool_writes_bounded = 1,                     /* the same user only (shm_service.c) */
    .carries_device_memory = FERRY_DEVICE_DIRECT, /* imports of the target's allocations */
    .take_credits = shm_take_credits,
    .channel_alive = chan_alive,
    .channel_shutdown = chan_shutdown,
    .channel_close = chan_close,
    .describe = shm_describe,
    .service_start = ferry_shm_service_start,
    .service_stop = ferry_shm_service_stop,
    .fence = ferry_shm_revoke,
    .peer_gone = ferry_shm_peer_gone,
};
