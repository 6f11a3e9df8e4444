/* fabric_sockets.c - the kernel sockets under libfabric's IP providers
 * (tcp;ofi_rxm, net), reached around the provider where it offers no call:
 * libfabric can neither abort a connection nor say which one an operation
 * arrives on, but the process's own descriptors (/proc/self/fd) say which
 * sockets carry which endpoint's connections.
 *
 * Two uses. An initiator abandoning operations makes its sockets to the
 * target close as a reset (fabric.c, reset_on_close: promise 5). A target
 * that unregisters memory aborts every connection its endpoints accepted
 * (ferry_fabric_abort_accepted), because these providers check a key once
 * per operation, at its header, and copy the rest as it arrives: an abort
 * is the only way to stop a WRITE already under way. connect() with
 * AF_UNSPEC is Linux's abortive disconnect (tcp_disconnect: the receive
 * queue is purged, a reset is sent, later segments find no socket) and
 * leaves the descriptor open, so the provider's epoll set and its later
 * close keep working and no descriptor number is reused under it, as
 * close() or dup2() would allow. shutdown() then marks both directions
 * shut (it answers ENOTCONN, and still does so), so the provider reads
 * end-of-stream and tears the connection down as after a peer's reset:
 * without it the socket reports only EPOLLHUP, which 1.17's tcp and net
 * providers never act on, and their progress spun on it with the next
 * connection from that initiator stuck (one run in three). Only the
 * target's own endpoints' accepted sockets match (local address and port
 * one of its endpoints', a peer set); an initiator's sockets have an
 * ephemeral local port, listeners no peer.
 *
 * A descriptor another thread closes and reuses between the check and the
 * call would get it instead: a window of two system calls, as for any
 * scan of /proc/self/fd. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "base/log.h"
#include "transport/fabric.h"

socklen_t ferry_fabric_ip_endpoint(const uint8_t *addr, size_t len, struct sockaddr_storage *out) {
  sa_family_t family = 0;
  if (len >= sizeof family)
    memcpy(&family, addr, sizeof family);
  size_t need = family == AF_INET    ? sizeof(struct sockaddr_in)
                : family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                     : 0;
  if (!need || len < need)
    return 0;
  memset(out, 0, sizeof *out);
  memcpy(out, addr, need);
  return (socklen_t)need;
}

int ferry_fabric_same_endpoint(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
  if (a->ss_family != b->ss_family)
    return 0;
  if (a->ss_family == AF_INET) {
    const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  if (a->ss_family != AF_INET6)
    return 0;
  const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
  return x->sin6_port == y->sin6_port && !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr);
}

/* The scan inspects descriptors other threads open and close (the window
 * above), which ThreadSanitizer reports as races on the descriptors; they
 * are the point of the scan, so its system calls are not checked. */
#if defined(__SANITIZE_THREAD__)
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define SCAN_UNCHECKED(call) (__tsan_ignore_thread_begin(), (call), __tsan_ignore_thread_end())
#else
#define SCAN_UNCHECKED(call) (call)
#endif

static void visit(int fd, void (*fn)(int fd, void *arg), void *arg) {
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode))
    fn(fd, arg);
}

int ferry_fabric_each_socket(void (*fn)(int fd, void *arg), void *arg) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir)
    return -1;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    char *end;
    long fd = strtol(e->d_name, &end, 10);
    if (!*end && end != e->d_name && fd != dirfd(dir))
      SCAN_UNCHECKED(visit((int)fd, fn, arg));
  }
  closedir(dir);
  return 0;
}

/* The target's endpoints: the main one, the lanes, the rails. */
typedef struct endpoints {
  struct sockaddr_storage addr[1 + FERRY_FABRIC_LANES_MAX + FERRY_RAILS_MAX];
  unsigned count;
  unsigned aborted;
} endpoints;

static void add(endpoints *list, const uint8_t *addr, size_t len) {
  if (ferry_fabric_ip_endpoint(addr, len, &list->addr[list->count]))
    list->count++;
}

static int is_ours(const endpoints *list, const struct sockaddr_storage *local) {
  for (unsigned i = 0; i < list->count; i++)
    if (ferry_fabric_same_endpoint(local, &list->addr[i]))
      return 1;
  return 0;
}

static void abort_if_accepted(int fd, void *arg) {
  endpoints *list = arg;
  struct sockaddr_storage local, peer;
  socklen_t len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, (struct sockaddr *)&local, &len) != 0 || !is_ours(list, &local) ||
      getpeername(fd, (struct sockaddr *)&peer, &peer_len) != 0)
    return;
  struct sockaddr unspec = {.sa_family = AF_UNSPEC};
  if (connect(fd, &unspec, sizeof unspec) == 0) {
    shutdown(fd, SHUT_RDWR); /* ENOTCONN, but it marks both directions shut: see above */
    list->aborted++;
  } else {
    char name[INET6_ADDRSTRLEN] = "?";
    const void *ip = peer.ss_family == AF_INET6
                         ? (const void *)&((struct sockaddr_in6 *)&peer)->sin6_addr
                         : (const void *)&((struct sockaddr_in *)&peer)->sin_addr;
    inet_ntop(peer.ss_family, ip, name, sizeof name);
    FERRY_WARN("fabric: cannot abort the connection accepted from %s (fd %d): %s: a WRITE of it "
               "under way into the memory just unregistered may still land",
               name, fd, strerror(errno));
  }
}

int ferry_fabric_abort_accepted(ferry_fabric *f) {
  endpoints list = {.count = 0};
  const ferry_fabric_descriptor *d = &f->self;
  add(&list, d->addr, d->addr_len);
  for (unsigned i = 0; i < d->lane_count; i++)
    add(&list, d->lane_addr[i], d->lane_addr_len[i]);
  for (unsigned r = 0; r < d->rail_count; r++)
    add(&list, d->rail_addr[r], d->rail_addr_len[r]);
  if (ferry_fabric_each_socket(abort_if_accepted, &list) != 0)
    return -1;
  __atomic_add_fetch(&f->aborts, list.aborted, __ATOMIC_RELAXED);
  return (int)list.aborted;
}
