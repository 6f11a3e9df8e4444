/* net.c - sockets: parsing targets, bounded connect, whole-frame I/O.
 *
 * Sockets stay blocking: a blocked thread costs no CPU, and a deadline is
 * enforced with SO_SNDTIMEO/SO_RCVTIMEO set to the time left, re-set only
 * when the time left is shorter than what the socket already has. With a
 * stall bound a blocking call wakes four times per bound to look for
 * progress (a byte moved, or the kernel's send queue shrank: a byte
 * acknowledged), and a socket with none for a whole bound gives a silent
 * link up early (ferry_sock.stall_ns).
 *
 * With a session (a shared secret) frames are sealed here, below the code
 * that speaks the protocol: a tag after the header and head, checked before
 * the caller sees the head (so a segment table is authentic before a byte
 * of payload lands), and a tag after the payload. */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"

#define FERRY_SOCKET_BUFFER (8 << 20)
#define STALL_LOOKS 4 /* looks for progress per stall bound */

ferry_status ferry_net_parse_target(const char *target, char host[FERRY_HOST_MAX], uint16_t *port) {
  if (!target || !*target)
    return ferry_fail(FERRY_EINVAL, "target is empty (expected host:port)");
  const char *colon;
  size_t host_len;
  const char *host_start = target;
  if (target[0] == '[') {
    const char *close = strchr(target, ']');
    if (!close || close[1] != ':')
      return ferry_fail(FERRY_EINVAL, "target \"%s\" is not [addr]:port", target);
    host_start = target + 1;
    host_len = (size_t)(close - host_start);
    colon = close + 1;
  } else {
    colon = strrchr(target, ':');
    if (!colon || strchr(target, ':') != colon)
      return ferry_fail(FERRY_EINVAL, "target \"%s\" is not host:port", target);
    host_len = (size_t)(colon - target);
  }
  char *end;
  errno = 0;
  unsigned long p = strtoul(colon + 1, &end, 10);
  if (host_len && host_len < FERRY_HOST_MAX && !*end && colon[1] && (p == 0 || p > 65535 || errno))
    return ferry_fail(FERRY_EINVAL, "target \"%s\": port out of range (expected 1..65535)", target);
  if (host_len == 0 || host_len >= FERRY_HOST_MAX || *end || colon[1] == 0)
    return ferry_fail(FERRY_EINVAL, "target \"%s\" is not host:port with a port in 1..65535",
                      target);
  memcpy(host, host_start, host_len);
  host[host_len] = 0;
  *port = (uint16_t)p;
  return FERRY_OK;
}

void ferry_net_format_target(char *out, size_t size, const char *host, uint16_t port) {
  if (strchr(host, ':'))
    snprintf(out, size, "[%s]:%u", host, port);
  else
    snprintf(out, size, "%s:%u", host, port);
}

void ferry_net_describe_peer(int fd, char *out, size_t size) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char host[FERRY_HOST_MAX] = "?";
  uint16_t port = 0;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      port = ntohs(a->sin6_port);
    } else {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      port = ntohs(a->sin_port);
    }
  }
  ferry_net_format_target(out, size, host, port);
}

static ferry_status resolve(const char *host, uint16_t port, int passive, struct addrinfo **out) {
  struct addrinfo hints = {0};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  char service[8];
  snprintf(service, sizeof service, "%u", port);
  int rc = getaddrinfo(host, service, &hints, out);
  if (rc != 0)
    return ferry_fail(FERRY_EDNS, "resolve \"%s\" failed: %s", host, gai_strerror(rc));
  return FERRY_OK;
}

ferry_status ferry_net_listen(const char *host, uint16_t port, int *fd_out, uint16_t *bound_port) {
  struct addrinfo *ai;
  ferry_status st = resolve(host, port, 1, &ai);
  if (st)
    return st;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(ai);
    return ferry_fail_errno(FERRY_ESOCKET, errno, "socket for listening on %s failed", host);
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 512) < 0) {
    int err = errno;
    freeaddrinfo(ai);
    close(fd);
    return ferry_fail_errno(FERRY_ESOCKET, err, "listen on %s port %u failed", host, port);
  }
  freeaddrinfo(ai);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  getsockname(fd, (struct sockaddr *)&ss, &len);
  *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
  *fd_out = fd;
  return FERRY_OK;
}

int ferry_net_loopback_only(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
    return 0;
  if (ss.ss_family == AF_INET)
    return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
  if (ss.ss_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&ss)->sin6_addr);
  return 0;
}

static int kernel_allows_buffer(const char *path, int want) {
  FILE *f = fopen(path, "r");
  long max = 0;
  if (f) {
    if (fscanf(f, "%ld", &max) != 1)
      max = 0;
    fclose(f);
  }
  return max >= want;
}

void ferry_net_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  /* Setting SO_*BUF turns kernel autotuning off and is capped at
   * net.core.[rw]mem_max, so a fixed size only helps when the cap is large;
   * otherwise autotuning (up to tcp_[rw]mem's max) gives bigger buffers. */
  static int allowed = -1; /* racing first readers compute the same answer */
  int ok = __atomic_load_n(&allowed, __ATOMIC_RELAXED);
  if (ok < 0) {
    ok = kernel_allows_buffer("/proc/sys/net/core/wmem_max", FERRY_SOCKET_BUFFER) &&
         kernel_allows_buffer("/proc/sys/net/core/rmem_max", FERRY_SOCKET_BUFFER);
    __atomic_store_n(&allowed, ok, __ATOMIC_RELAXED);
  }
  if (ok) {
    int size = FERRY_SOCKET_BUFFER;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  }
}

static ferry_status connect_one(const struct addrinfo *ai, const char *host, uint16_t port,
                                uint64_t deadline_ns, int *fd_out) {
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return ferry_fail_errno(FERRY_ESOCKET, errno, "socket for %s:%u failed", host, port);
  int err = 0;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
    err = errno;
    if (err == EINPROGRESS) {
      struct pollfd p = {fd, POLLOUT, 0};
      int n = poll(&p, 1, ferry_ms_left(deadline_ns));
      socklen_t len = sizeof err;
      if (n == 0)
        err = ETIMEDOUT;
      else if (n < 0)
        err = errno;
      else
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
  }
  if (err) {
    close(fd);
    return ferry_fail_errno(err == ETIMEDOUT ? FERRY_ETIMEDOUT : FERRY_ESOCKET, err,
                            "connect to %s:%u failed", host, port);
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  ferry_net_tune(fd);
  *fd_out = fd;
  return FERRY_OK;
}

ferry_status ferry_net_connect(const char *host, uint16_t port, uint64_t deadline_ns, int *fd) {
  struct addrinfo *ai;
  ferry_status st = resolve(host, port, 0, &ai);
  if (st)
    return st;
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    st = connect_one(a, host, port, deadline_ns, fd);
    if (st == FERRY_OK || st == FERRY_ETIMEDOUT)
      break;
  }
  freeaddrinfo(ai);
  return st;
}

void ferry_sock_init(ferry_sock *s, int fd, const char *peer) {
  s->fd = fd;
  s->peer = peer;
  s->deadline_ns = 0;
  s->timeout_set_ns = 0; /* a new socket has no timeout */
  s->rbuf = NULL;
  s->rcap = s->rpos = s->rlen = 0;
  s->spin_ns = 0;
  s->session = NULL;
  s->cancel = NULL;
  s->stall_ns = 0;
  s->stall_ok = NULL;
  s->stall_arg = NULL;
  s->unacked = 0;
  s->progress_ns = 0;
  s->stalled = 0;
}

void ferry_sock_auth(ferry_sock *s, ferry_session *session) {
  s->session = session && session->on ? session : NULL;
}

void ferry_sock_readahead(ferry_sock *s, uint8_t *buf, size_t cap) {
  s->rbuf = buf;
  s->rcap = cap;
}

int ferry_sock_buffered(const ferry_sock *s) { return s->rpos < s->rlen; }

void ferry_sock_set_deadline(ferry_sock *s, uint64_t deadline_ns) {
  s->deadline_ns = deadline_ns;
  s->progress_ns = ferry_now_ns();
  s->stalled = 0;
}

/* Makes sure the next blocking call returns by the deadline, and that a
 * cancelled socket makes no further call. timeout_set_ns: 0 = no limit
 * set, UINT64_MAX = unknown, anything else = the limit last set.
 * Setting one costs two system calls, so a request and its reply, each
 * with a fresh deadline, should not set them every time: a limit is set
 * an eighth short of what is left (the next deadline as long finds it
 * short enough), and a call without a deadline keeps a limit already set.
 * Either may wake a call early: timeout_is_early re-arms it. */
static ferry_status arm_timeout(ferry_sock *s, const char *step) {
  uint64_t left = 0;
  if (s->cancel && __atomic_load_n(s->cancel, __ATOMIC_ACQUIRE))
    return ferry_fail(FERRY_ECLOSED, "%s with %s cancelled", step, s->peer);
  if (s->deadline_ns) {
    uint64_t now = ferry_now_ns();
    if (now >= s->deadline_ns)
      return ferry_fail(FERRY_ETIMEDOUT, "%s to %s timed out", step, s->peer);
    left = s->deadline_ns - now;
    if (left < 1000000)
      left = 1000000; /* SO_*TIMEO of zero would mean "forever" */
  }
  uint64_t look = s->stall_ns / STALL_LOOKS;
  if (look && (!left || look < left))
    left = look; /* a blocking call wakes to look for progress */
  if (left) {
    if (s->timeout_set_ns && s->timeout_set_ns <= left)
      return FERRY_OK;
    left -= left / 8;
    if (left < 1000000)
      left = 1000000;
  } else if (s->timeout_set_ns != UINT64_MAX) {
    return FERRY_OK; /* none set, or one that wakes the call early: it comes back unset */
  }
  struct timeval tv = {(time_t)(left / 1000000000ull),
                       (suseconds_t)((left % 1000000000ull) / 1000)};
  setsockopt(s->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  s->timeout_set_ns = left;
  return FERRY_OK;
}

/* Bytes sent on fd and not acknowledged yet (or not sent yet). */
static int send_queue(int fd) {
  int n = 0;
  return ioctl(fd, SIOCOUTQ, &n) == 0 ? n : 0;
}

/* A byte moved: the stall bound counts from now. The send queue is not
 * looked at here (no system call per frame): the next look takes it as
 * the level later acknowledgements count from. */
static void progressed(ferry_sock *s, int sending) {
  if (!s->stall_ns)
    return;
  s->progress_ns = ferry_now_ns();
  if (sending)
    s->unacked = -1;
}

/* A blocking call woke without moving a byte: the link is silent when the
 * peer acknowledged nothing of what was sent before either (a slow link
 * drains its queue) for a whole bound, and stall_ok agrees to give it up. */
static int stalled(ferry_sock *s) {
  if (!s->stall_ns)
    return 0;
  int unacked = send_queue(s->fd);
  uint64_t now = ferry_now_ns();
  if (s->unacked >= 0 && unacked != s->unacked)
    s->progress_ns = now;
  s->unacked = unacked;
  return now - s->progress_ns >= s->stall_ns && (!s->stall_ok || s->stall_ok(s->stall_arg));
}

/* A socket timeout that fired before the deadline (it was armed for an
 * earlier, shorter one, or to look for progress) is not an error: re-arm
 * and go on, unless the stall bound gives the link up. */
static int timeout_is_early(ferry_sock *s, int err) {
  if ((err != EAGAIN && err != EWOULDBLOCK) || (s->deadline_ns && ferry_now_ns() >= s->deadline_ns))
    return 0;
  if (stalled(s)) {
    s->stalled = 1;
    return 0;
  }
  s->timeout_set_ns = UINT64_MAX;
  return 1;
}

static ferry_status io_error(ferry_sock *s, int err, int sending, const char *step) {
  const char *dir = sending ? "to" : "from";
  if (s->stalled)
    return ferry_fail(FERRY_ESOCKET,
                      "%s %s %s failed: no progress for %llu ms (no byte moved or acknowledged: "
                      "the link is silent)",
                      step, dir, s->peer, (unsigned long long)(s->stall_ns / 1000000ull));
  if (err == EAGAIN || err == EWOULDBLOCK)
    return ferry_fail(FERRY_ETIMEDOUT, "%s %s %s timed out", step, dir, s->peer);
  return ferry_fail_errno(err == EFAULT ? FERRY_EFAULT : FERRY_ESOCKET, err, "%s %s %s failed",
                          step, dir, s->peer);
}

static ferry_status closed_by_peer(ferry_sock *s, const char *step) {
  return ferry_fail(FERRY_ESOCKET, "%s from %s failed: connection closed by peer", step, s->peer);
}

/* Drops n bytes from the front of an iovec array; returns the new start. */
static struct iovec *iov_advance(struct iovec *iov, int *iovcnt, size_t n) {
  while (*iovcnt > 0 && n >= iov->iov_len) {
    n -= iov->iov_len;
    iov++;
    (*iovcnt)--;
  }
  if (*iovcnt > 0) {
    iov->iov_base = (char *)iov->iov_base + n;
    iov->iov_len -= n;
  }
  return iov;
}

#if defined(__SANITIZE_THREAD__)
#define FERRY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TSAN 1
#endif
#endif

#ifdef FERRY_TSAN
/* The payload is registered user memory, and the order of accesses to it
 * is set by the peers over the network, which ThreadSanitizer cannot see
 * (just as with RDMA hardware). Checking every byte of every frame would
 * only report races between remote peers, and slow the TSan build to a
 * crawl; ferry's own state is still checked everywhere else. */
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define IGNORE_PAYLOAD_BEGIN() __tsan_ignore_thread_begin()
#define IGNORE_PAYLOAD_END() __tsan_ignore_thread_end()
#else
#define IGNORE_PAYLOAD_BEGIN() ((void)0)
#define IGNORE_PAYLOAD_END() ((void)0)
#endif

/* Bounded spin (ferry_sock.spin_ns): until spin_until a receive does not
 * sleep but polls, yielding the CPU between tries so that a peer thread on
 * the same CPU can run and answer. */
static uint64_t spin_deadline(const ferry_sock *s) {
  return s->spin_ns ? ferry_now_ns() + s->spin_ns : 0;
}

static int still_spinning(uint64_t spin_until) { return spin_until && ferry_now_ns() < spin_until; }

/* Nonzero when a failed socket call should simply be tried again: a signal,
 * a polling receive that found nothing yet (yield first), or a socket timeout
 * armed for an earlier deadline. The poll is checked before the timeout,
 * which would take its EAGAIN for an expired SO_RCVTIMEO and re-arm the
 * timeouts (two setsockopt calls) on every try. */
static int retry_after(ferry_sock *s, int spin, int err) {
  if (err == EINTR)
    return 1;
  if (spin && (err == EAGAIN || err == EWOULDBLOCK)) {
    sched_yield();
    return 1;
  }
  return timeout_is_early(s, err);
}

/* Moves the whole iovec through sendmsg or recvmsg, resuming after partial
 * transfers, early timeouts and signals. The kernel takes at most IOV_MAX
 * entries per call; longer lists simply take more calls. *moved (if not
 * NULL) grows by every byte moved, so a failure says where it stopped. */
static ferry_status transfer_iov(ferry_sock *s, struct iovec *iov, int iovcnt, int sending,
                                 const char *step, uint64_t *moved) {
  while (iovcnt > 0 && iov->iov_len == 0)
    iov++, iovcnt--;
  uint64_t spin_until = sending ? 0 : spin_deadline(s);
  while (iovcnt > 0) {
    ferry_status st = arm_timeout(s, step);
    if (st)
      return st;
    struct msghdr msg = {.msg_iov = iov,
                         .msg_iovlen = (size_t)(iovcnt < IOV_MAX ? iovcnt : IOV_MAX)};
    int spin = still_spinning(spin_until);
    IGNORE_PAYLOAD_BEGIN();
    ssize_t n = sending ? sendmsg(s->fd, &msg, MSG_NOSIGNAL)
                        : recvmsg(s->fd, &msg, spin ? MSG_DONTWAIT : MSG_WAITALL);
    int err = errno;
    IGNORE_PAYLOAD_END();
    if (n < 0) {
      if (retry_after(s, spin, err))
        continue;
      return io_error(s, err, sending, step);
    }
    if (n == 0 && !sending)
      return closed_by_peer(s, step);
    progressed(s, sending);
    if (moved)
      *moved += (uint64_t)n;
    iov = iov_advance(iov, &iovcnt, (size_t)n);
  }
  return FERRY_OK;
}

/* ---- sealed frames ------------------------------------------------------ */

/* A sealed frame's iovec: its own entries plus header and two tags. */
#define SEALED_IOV_MAX (FERRY_WIRE_MAX_SEGMENTS + 8)

/* Moves the entries that cover the next n bytes of *in into out (splitting
 * the last one if needed); returns how many it wrote. */
static int iov_take(struct iovec *out, struct iovec **in, int *incnt, uint64_t n) {
  int k = 0;
  while (n > 0 && *incnt > 0) {
    struct iovec *v = *in;
    size_t take = v->iov_len < n ? v->iov_len : (size_t)n;
    if (take > 0)
      out[k++] = (struct iovec){v->iov_base, take};
    n -= take;
    if (take == v->iov_len) {
      (*in)++;
      (*incnt)--;
    } else {
      v->iov_base = (char *)v->iov_base + take;
      v->iov_len -= take;
    }
  }
  return k;
}

static ferry_status send_sealed(ferry_sock *s, struct iovec *iov, int iovcnt, const char *step) {
  ferry_session *ss = s->session;
  ferry_frame_header h;
  if (iovcnt < 1 || iovcnt + 3 > SEALED_IOV_MAX || iov[0].iov_len != FERRY_WIRE_HEADER_SIZE ||
      ferry_wire_header_decode(iov[0].iov_base, &h) != FERRY_OK)
    return ferry_fail(FERRY_EINVAL, "%s to %s: not one whole frame, cannot seal it", step, s->peer);
  uint64_t head, payload;
  ferry_wire_split(&h, &head, &payload);
  struct iovec out[SEALED_IOV_MAX];
  uint8_t head_tag[FERRY_SESSION_TAG_SIZE], payload_tag[FERRY_SESSION_TAG_SIZE];
  struct iovec *in = iov + 1;
  int left = iovcnt - 1;
  out[0] = iov[0];
  int n = 1 + iov_take(out + 1, &in, &left, head);
  int ok = ferry_session_tag(ss->send_key, ss->send_seq, 0, out, n, head_tag);
  out[n++] = (struct iovec){head_tag, sizeof head_tag};
  if (payload) {
    int first = n;
    n += iov_take(out + n, &in, &left, payload);
    ok =
        ok && ferry_session_tag(ss->send_key, ss->send_seq, 1, out + first, n - first, payload_tag);
    out[n++] = (struct iovec){payload_tag, sizeof payload_tag};
  }
  if (!ok)
    return ferry_fail(FERRY_ENOMEM, "%s to %s: cannot compute the frame tag", step, s->peer);
  ss->send_seq++;
  return transfer_iov(s, out, n, 1, step, NULL);
}

ferry_status ferry_sock_sendv(ferry_sock *s, struct iovec *iov, int iovcnt, const char *step) {
  if (s->session)
    return send_sealed(s, iov, iovcnt, step);
  return transfer_iov(s, iov, iovcnt, 1, step, NULL);
}

static size_t iov_total(const struct iovec *iov, int iovcnt);

ferry_status ferry_sock_send_open(ferry_sock *s, struct iovec *iov, int iovcnt, const char *step) {
  ferry_frame_header h;
  uint64_t head, payload;
  if (iovcnt < 1 || iov[0].iov_len != FERRY_WIRE_HEADER_SIZE ||
      ferry_wire_header_decode(iov[0].iov_base, &h) != FERRY_OK)
    return ferry_fail(FERRY_EINVAL, "%s to %s: not a frame's header", step, s->peer);
  ferry_wire_split(&h, &head, &payload);
  if (iov_total(iov + 1, iovcnt - 1) != head)
    return ferry_fail(FERRY_EINVAL, "%s to %s: a frame sent in pieces opens with its whole head",
                      step, s->peer);
  s->send_left = payload;
  ferry_session *ss = s->session;
  if (!ss)
    return transfer_iov(s, iov, iovcnt, 1, step, NULL);
  struct iovec out[SEALED_IOV_MAX];
  uint8_t head_tag[FERRY_SESSION_TAG_SIZE];
  if (iovcnt + 1 > SEALED_IOV_MAX)
    return ferry_fail(FERRY_EINVAL, "%s to %s: too many pieces in a head", step, s->peer);
  memcpy(out, iov, (size_t)iovcnt * sizeof *iov);
  if (!ferry_session_tag(ss->send_key, ss->send_seq, 0, out, iovcnt, head_tag) ||
      (payload && !(ss->send_tag = ferry_tag_stream_open(ss->send_key, ss->send_seq, 1))))
    return ferry_fail(FERRY_ENOMEM, "%s to %s: cannot compute the frame tag", step, s->peer);
  out[iovcnt] = (struct iovec){head_tag, sizeof head_tag};
  return transfer_iov(s, out, iovcnt + 1, 1, step, NULL);
}

ferry_status ferry_sock_send_piece(ferry_sock *s, void *buf, size_t len, const char *step) {
  if (len > s->send_left)
    return ferry_fail(FERRY_EINVAL, "%s to %s: %zu bytes past the frame's payload", step, s->peer,
                      len);
  ferry_session *ss = s->session;
  if (ss && !ferry_tag_stream_add(ss->send_tag, buf, len))
    return ferry_fail(FERRY_ENOMEM, "%s to %s: cannot compute the frame tag", step, s->peer);
  s->send_left -= len;
  struct iovec iov = {buf, len};
  return transfer_iov(s, &iov, 1, 1, step, NULL);
}

ferry_status ferry_sock_send_close(ferry_sock *s, ferry_status so_far, const char *step) {
  ferry_session *ss = s->session;
  ferry_tag_stream *tag = ss ? ss->send_tag : NULL;
  if (ss)
    ss->send_tag = NULL;
  if (so_far || s->send_left) {
    ferry_tag_stream_close(tag, NULL);
    return so_far ? so_far
                  : ferry_fail(FERRY_EINVAL, "%s to %s: frame closed %llu bytes short", step,
                               s->peer, (unsigned long long)s->send_left);
  }
  if (!ss)
    return FERRY_OK;
  uint8_t payload_tag[FERRY_SESSION_TAG_SIZE];
  int sealed = !tag || ferry_tag_stream_close(tag, payload_tag);
  if (!sealed)
    return ferry_fail(FERRY_ENOMEM, "%s to %s: cannot compute the frame tag", step, s->peer);
  ss->send_seq++;
  if (!tag)
    return FERRY_OK; /* no payload: the head's tag ended the frame */
  struct iovec iov = {payload_tag, sizeof payload_tag};
  return transfer_iov(s, &iov, 1, 1, step, NULL);
}

void ferry_sock_recv_stream(ferry_sock *s, int on) {
  ferry_session *ss = s->session;
  if (!ss)
    return;
  ss->recv_streaming = on;
  ferry_tag_stream_close(ss->recv_tag, NULL);
  ss->recv_tag = NULL;
}

/* Memory a peer chose (registered memory) is written only by the kernel:
 * a page of it that this process can no longer write (unmapped or
 * protected after it was registered) then fails the receive with EFAULT
 * instead of faulting in user space. NULL for ferry's own buffers.
 * placed: the bytes that reached it before such a failure. */
typedef struct peer_memory {
  uint64_t placed;
} peer_memory;

static size_t iov_total(const struct iovec *iov, int iovcnt) {
  size_t n = 0;
  for (int i = 0; i < iovcnt; i++)
    n += iov[i].iov_len;
  return n;
}

/* Set once process_vm_writev on this process is refused (a seccomp
 * filter): read-ahead bytes then go into registered memory by memcpy,
 * guarded by the registration check alone. */
static int self_write_refused;

#define PLACE_IOV 64 /* iovec entries per process_vm_writev */

/* Copies n bytes (at most iov's room) to the front of iov through the
 * kernel (process_vm_writev on this process); returns how many landed.
 * Fewer: errno says why (EFAULT: the next page cannot be written). */
static size_t place_by_kernel(const struct iovec *iov, int iovcnt, const uint8_t *from, size_t n) {
  size_t placed = 0;
  while (placed < n) {
    struct iovec to[PLACE_IOV];
    int k = 0;
    size_t want = 0;
    for (; k < iovcnt && k < PLACE_IOV && placed + want < n; k++) {
      size_t take = iov[k].iov_len < n - placed - want ? iov[k].iov_len : n - placed - want;
      to[k] = (struct iovec){iov[k].iov_base, take};
      want += take;
    }
    struct iovec local = {(void *)(from + placed), want};
    ssize_t done;
    do
      done = process_vm_writev(getpid(), &local, 1, to, (unsigned long)k, 0);
    while (done < 0 && errno == EINTR);
    if (done > 0)
      placed += (size_t)done;
    if (done < 0 || (size_t)done < want) {
      if (done >= 0)
        errno = EFAULT;
      return placed;
    }
    iov += k, iovcnt -= k;
  }
  return placed;
}

/* Copies n bytes (at most iov's room) to the front of iov: by the kernel
 * into memory a peer chose, else by memcpy. Returns how many landed. */
static size_t place(const struct iovec *iov, int iovcnt, const uint8_t *from, size_t n,
                    int peer_memory) {
  if (peer_memory && !__atomic_load_n(&self_write_refused, __ATOMIC_RELAXED)) {
    size_t placed = place_by_kernel(iov, iovcnt, from, n);
    if (placed == n || errno == EFAULT)
      return placed;
    FERRY_INFO("process_vm_writev on this process is refused (%s): bytes read ahead go into "
               "registered memory by memcpy",
               strerror(errno));
    __atomic_store_n(&self_write_refused, 1, __ATOMIC_RELAXED);
  }
  size_t done = 0;
  for (int k = 0; k < iovcnt && done < n; k++) {
    size_t take = iov[k].iov_len < n - done ? iov[k].iov_len : n - done;
    IGNORE_PAYLOAD_BEGIN(); /* iov may be registered memory, like recvmsg's */
    memcpy(iov[k].iov_base, from + done, take);
    IGNORE_PAYLOAD_END();
    done += take;
  }
  return done;
}

/* Moves read-ahead bytes into the iovec, advancing it; FERRY_EFAULT when
 * peer memory could not take them. */
static ferry_status drain_readahead(ferry_sock *s, struct iovec **iov, int *iovcnt, peer_memory *pm,
                                    const char *step) {
  if (ferry_sock_buffered(s) && *iovcnt > 0) {
    size_t n = s->rlen - s->rpos, room = iov_total(*iov, *iovcnt);
    size_t want = n < room ? n : room;
    size_t placed = place(*iov, *iovcnt, s->rbuf + s->rpos, want, pm != NULL);
    s->rpos += placed;
    if (pm)
      pm->placed += placed;
    *iov = iov_advance(*iov, iovcnt, placed);
    if (placed < want)
      return ferry_fail_errno(FERRY_EFAULT, EFAULT, "%s from %s failed", step, s->peer);
  }
  if (s->rpos == s->rlen)
    s->rpos = s->rlen = 0;
  return FERRY_OK;
}

static ferry_status recv_plain(ferry_sock *s, struct iovec *iov, int iovcnt, peer_memory *pm,
                               const char *step) {
  uint64_t *moved = pm ? &pm->placed : NULL;
  if (!s->rbuf)
    return transfer_iov(s, iov, iovcnt, 0, step, moved);
  ferry_status st = drain_readahead(s, &iov, &iovcnt, pm, step);
  if (st)
    return st;
  if (iov_total(iov, iovcnt) >= s->rcap)
    return transfer_iov(s, iov, iovcnt, 0, step, moved); /* large: straight into place */
  uint64_t spin_until = spin_deadline(s);
  while (iov_total(iov, iovcnt) > 0) {
    st = arm_timeout(s, step);
    if (st)
      return st;
    int spin = still_spinning(spin_until);
    ssize_t n = recv(s->fd, s->rbuf, s->rcap, spin ? MSG_DONTWAIT : 0);
    int err = errno;
    if (n < 0) {
      if (retry_after(s, spin, err))
        continue;
      return io_error(s, err, 0, step);
    }
    if (n == 0)
      return closed_by_peer(s, step);
    progressed(s, 0);
    s->rpos = 0;
    s->rlen = (size_t)n;
    if ((st = drain_readahead(s, &iov, &iovcnt, pm, step)) != FERRY_OK)
      return st;
  }
  return FERRY_OK;
}

/* Receives the tag of part (0: header and head, 1: payload) of the frame
 * being received and compares it with the one computed over iov, or with
 * the streamed tag (ss->recv_tag) when iov is NULL and one is open (else
 * the payload came in pieces and was dropped; its tag is only consumed). */
static ferry_status check_tag(ferry_sock *s, uint8_t part, const struct iovec *iov, int iovcnt,
                              const char *step) {
  ferry_session *ss = s->session;
  uint8_t got[FERRY_SESSION_TAG_SIZE], want[FERRY_SESSION_TAG_SIZE];
  struct iovec t = {got, sizeof got};
  ferry_tag_stream *streamed = iov ? NULL : ss->recv_tag;
  ss->recv_tag = iov ? ss->recv_tag : NULL;
  ferry_status st = recv_plain(s, &t, 1, NULL, step);
  if (st) {
    ferry_tag_stream_close(streamed, NULL);
    return st;
  }
  uint64_t seq = ss->recv_seq;
  if (part == 1 || ss->payload_left == 0)
    ss->recv_seq++; /* the frame is complete */
  if (!iov && !streamed)
    return FERRY_OK;
  int computed = streamed ? ferry_tag_stream_close(streamed, want)
                          : ferry_session_tag(ss->recv_key, seq, part, iov, iovcnt, want);
  if (!computed || !ferry_session_tag_equal(got, want))
    return ferry_fail(FERRY_EPROTO,
                      "%s from %s: frame %llu fails authentication (forged, altered, replayed or "
                      "out of order)",
                      step, s->peer, (unsigned long long)seq);
  return FERRY_OK;
}

/* Starts receiving a sealed frame; a frame without a head has its first
 * tag right after the header. */
static ferry_status open_sealed(ferry_sock *s, const uint8_t raw[FERRY_WIRE_HEADER_SIZE],
                                const ferry_frame_header *h, const char *step) {
  ferry_session *ss = s->session;
  memcpy(ss->header, raw, FERRY_WIRE_HEADER_SIZE);
  ferry_wire_split(h, &ss->head_left, &ss->payload_left);
  ss->payload_split = 0;
  if (ss->head_left)
    return FERRY_OK;
  struct iovec hv = {ss->header, FERRY_WIRE_HEADER_SIZE};
  return check_tag(s, 0, &hv, 1, step);
}

/* A receive within a sealed frame: all of its head (checked before the
 * caller sees it), all of its payload (checked), or a piece of a payload
 * that is being dropped. A payload that peer memory could not take whole
 * is a payload in pieces: the caller drops the rest. */
static ferry_status recv_sealed(ferry_sock *s, struct iovec *iov, int iovcnt, peer_memory *pm,
                                const char *step) {
  ferry_session *ss = s->session;
  int head = ss->head_left > 0;
  uint64_t left = head ? ss->head_left : ss->payload_left;
  uint64_t total = iov_total(iov, iovcnt);
  if (total == 0)
    return FERRY_OK;
  if (total > left || (head && total != left) || iovcnt + 1 > SEALED_IOV_MAX)
    return ferry_fail(FERRY_EPROTO, "%s from %s: a receive of %llu bytes outside the sealed frame",
                      step, s->peer, (unsigned long long)total);
  struct iovec copy[SEALED_IOV_MAX];
  int n = 0;
  if (head)
    copy[n++] = (struct iovec){ss->header, FERRY_WIRE_HEADER_SIZE};
  memcpy(copy + n, iov, (size_t)iovcnt * sizeof *iov);
  n += iovcnt;
  int stream = !head && ss->recv_streaming && !ss->payload_split;
  if (stream && !ss->recv_tag &&
      !(ss->recv_tag = ferry_tag_stream_open(ss->recv_key, ss->recv_seq, 1)))
    return ferry_fail(FERRY_ENOMEM, "%s from %s: cannot compute the frame tag", step, s->peer);
  ferry_status st = recv_plain(s, iov, iovcnt, pm, step);
  for (int i = 0; !st && stream && i < iovcnt; i++)
    if (!ferry_tag_stream_add(ss->recv_tag, iov[i].iov_base, iov[i].iov_len))
      return ferry_fail(FERRY_ENOMEM, "%s from %s: cannot compute the frame tag", step, s->peer);
  if (st == FERRY_EFAULT && pm && !head) {
    ferry_sock_recv_stream(s, 0); /* the rest is dropped: unchecked */
    ss->payload_left -= pm->placed;
    ss->payload_split = 1;
  }
  if (st)
    return st;
  if (head) {
    ss->head_left = 0;
    return check_tag(s, 0, copy, n, step);
  }
  ss->payload_left -= total;
  if (total < left && !stream)
    ss->payload_split = 1;
  if (ss->payload_left)
    return FERRY_OK;
  return check_tag(s, 1, ss->payload_split || stream ? NULL : copy, n, step);
}

ferry_status ferry_sock_recvv(ferry_sock *s, struct iovec *iov, int iovcnt, const char *step) {
  if (s->session)
    return recv_sealed(s, iov, iovcnt, NULL, step);
  return recv_plain(s, iov, iovcnt, NULL, step);
}

ferry_status ferry_sock_recvv_registered(ferry_sock *s, struct iovec *iov, int iovcnt,
                                         uint64_t *placed, const char *step) {
  peer_memory pm = {0};
  ferry_status st =
      s->session ? recv_sealed(s, iov, iovcnt, &pm, step) : recv_plain(s, iov, iovcnt, &pm, step);
  *placed = pm.placed;
  return st;
}

ferry_status ferry_sock_recv(ferry_sock *s, void *buf, size_t len, const char *step) {
  struct iovec iov = {buf, len};
  return ferry_sock_recvv(s, &iov, 1, step);
}

ferry_status ferry_sock_discard(ferry_sock *s, uint64_t len, const char *step) {
  char scratch[64 * 1024];
  while (len > 0) {
    size_t n = len < sizeof scratch ? (size_t)len : sizeof scratch;
    ferry_status st = ferry_sock_recv(s, scratch, n, step);
    if (st)
      return st;
    len -= n;
  }
  return FERRY_OK;
}

ferry_status ferry_sock_send_frame(ferry_sock *s, const ferry_frame_header *h, const void *body,
                                   const char *step) {
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  ferry_wire_header_encode(raw, h);
  struct iovec iov[2] = {{raw, sizeof raw}, {(void *)body, body ? h->body_len : 0}};
  return ferry_sock_sendv(s, iov, 2, step);
}

ferry_status ferry_sock_recv_header(ferry_sock *s, ferry_frame_header *h, const char *step) {
  uint8_t raw[FERRY_WIRE_HEADER_SIZE];
  struct iovec iov = {raw, sizeof raw};
  ferry_status st = recv_plain(s, &iov, 1, NULL, step);
  if (st)
    return st;
  st = ferry_wire_header_decode(raw, h);
  if (st) {
    char detail[FERRY_ERROR_MAX];
    snprintf(detail, sizeof detail, "%s", ferry_last_error());
    return ferry_fail(FERRY_EPROTO, "%s from %s: %s", step, s->peer, detail);
  }
  return s->session ? open_sealed(s, raw, h, step) : FERRY_OK;
}

/* The codes a target sends for a refused request. Anything else (a local
 * meaning such as FERRY_EINPROGRESS, FERRY_ETIMEDOUT or FERRY_ECLOSED, or a
 * code from a newer peer) would mislead the caller: it becomes EREMOTE. */
static int remote_status_ok(ferry_status code) {
  switch (code) {
  case FERRY_EINVAL:
  case FERRY_ENOTREG:
  case FERRY_ENOMEM:
  case FERRY_EVERSION:
  case FERRY_EAUTH:
  case FERRY_EPROTO:
  case FERRY_ENOTIMPL:
  case FERRY_EBUSY:
  case FERRY_ECHECKSUM:
  case FERRY_ENOTFOUND: /* an unknown receive pool or slot */
  case FERRY_EFAULT:    /* registered memory its process can no longer touch */
  case FERRY_EREMOTE: return 1;
  default: return 0;
  }
}

ferry_status ferry_sock_read_refusal(ferry_sock *s, const ferry_frame_header *h, const char *step) {
  char reason[FERRY_WIRE_MAX_REASON + 1];
  size_t len = (size_t)h->body_len; /* header decode bounded it by MAX_REASON */
  ferry_status st = ferry_sock_recv(s, reason, len, step);
  if (st)
    return st;
  char text[FERRY_WIRE_MAX_REASON + 1]; /* the peer's words: escaped for logs */
  ferry_log_escape(text, sizeof text, reason, len);
  ferry_status code = (ferry_status)h->status;
  if (!remote_status_ok(code))
    code = FERRY_EREMOTE;
  return ferry_fail(code, "%s refused by %s: %s", step, s->peer, len ? text : ferry_strerror(code));
}

int ferry_net_idle_alive(int fd) {
  struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) == 0;
}

/* ---- streamed payloads with their crc ---------------------------------------- */

ferry_status ferry_sock_crc_send(void *arg, void *buf, size_t len) {
  ferry_sock_crc *io = arg;
  if (io->checksum)
    io->crc = ferry_crc32c(io->crc, buf, len);
  return ferry_sock_send_piece(io->sock, buf, len, io->step);
}

ferry_status ferry_sock_crc_recv(void *arg, void *buf, size_t len) {
  ferry_sock_crc *io = arg;
  ferry_status st = ferry_sock_recv(io->sock, buf, len, io->step);
  if (!st && io->checksum)
    io->crc = ferry_crc32c(io->crc, buf, len);
  return st;
}
