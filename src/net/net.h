/* net.h - socket helpers shared by the server, the peers and the TCP
 * transport: address parsing, bounded connect, and whole-frame I/O with a
 * deadline. Failures set the error detail naming the peer. */
#ifndef FERRY_NET_H
#define FERRY_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ferry.h"
#include "wire/wire.h"

#define FERRY_HOST_MAX 256
/* Read-ahead buffer of the long-lived data connections (see ferry_sock). */
#define FERRY_READAHEAD (16 * 1024)

/* "host:port" or "[v6]:port" -> host (without brackets) and port. */
ferry_status ferry_net_parse_target(const char *target, char host[FERRY_HOST_MAX], uint16_t *port);
/* Formats host and port the way targets are written ("[v6]:port" for v6). */
void ferry_net_format_target(char *out, size_t size, const char *host, uint16_t port);
/* "host:port" of the peer connected on fd ("?:0" when unknown), for logs. */
void ferry_net_describe_peer(int fd, char *out, size_t size);

/* Listening socket on host:port (port 0: any); *bound_port gets the port. */
ferry_status ferry_net_listen(const char *host, uint16_t port, int *fd, uint16_t *bound_port);
/* Nonzero when the listening socket fd is bound to a loopback address only
 * (not the wildcard, not an interface other hosts reach). */
int ferry_net_loopback_only(int fd);
/* Connects with a deadline and sets the data-path socket options. */
ferry_status ferry_net_connect(const char *host, uint16_t port, uint64_t deadline_ns, int *fd);
/* TCP_NODELAY, keepalive, and large buffers where the kernel allows them. */
void ferry_net_tune(int fd);

/* An authenticated session (a shared secret is set): a key per direction
 * from the handshake (auth.c) and the frame counters, which are part of
 * every tag and never sent, so a replayed or reordered frame fails. Lives
 * as long as its connection; the connection's ferry_sock points to it. */
#define FERRY_SESSION_KEY_SIZE 32
#define FERRY_SESSION_TAG_SIZE 16
typedef struct ferry_tag_stream ferry_tag_stream; /* auth.c, below */
typedef struct ferry_session {
  int on;
  uint8_t send_key[FERRY_SESSION_KEY_SIZE], recv_key[FERRY_SESSION_KEY_SIZE];
  uint64_t send_seq, recv_seq;
  /* The frame being received: its header, and the bytes of its head and
   * payload not received yet (ferry_wire_split). */
  uint8_t header[FERRY_WIRE_HEADER_SIZE];
  uint64_t head_left, payload_left;
  int payload_split; /* payload taken in pieces (dropped): its tag is not checked */
  /* A payload streamed in pieces (ferry_sock_send_open, _recv_stream):
   * its tag so far, in each direction. */
  ferry_tag_stream *send_tag, *recv_tag;
  int recv_streaming;
  /* Initiator side: the nonce of this connection's HELLO, which names it to
   * its target (a CUT request, peer.h); set with or without a secret. */
  uint8_t id[FERRY_WIRE_NONCE_SIZE];
} ferry_session;

/* auth.c: the tag of part (0 header and head, 1 payload) of frame seq over
 * the bytes of iov. Zero if OpenSSL failed (the frame is then refused). */
int ferry_session_tag(const uint8_t key[FERRY_SESSION_KEY_SIZE], uint64_t seq, uint8_t part,
                      const struct iovec *iov, int iovcnt, uint8_t tag[FERRY_SESSION_TAG_SIZE]);
int ferry_session_tag_equal(const uint8_t *a, const uint8_t *b); /* constant time */
/* The same tag over bytes given a piece at a time (a payload streamed
 * through bounce buffers). open: NULL if OpenSSL failed. close frees it
 * and, with tag not NULL, sets the tag (zero if OpenSSL failed). */
ferry_tag_stream *ferry_tag_stream_open(const uint8_t key[FERRY_SESSION_KEY_SIZE], uint64_t seq,
                                        uint8_t part);
int ferry_tag_stream_add(ferry_tag_stream *t, const void *buf, size_t len);
int ferry_tag_stream_close(ferry_tag_stream *t, uint8_t tag[FERRY_SESSION_TAG_SIZE]);

/* A socket with the peer's name for messages and the deadline-driven timeout
 * currently set on it, so each call sets SO_*TIMEO only when it shrinks. */
typedef struct ferry_sock {
  int fd;
  const char *peer;     /* "host:port", for messages */
  uint64_t deadline_ns; /* 0 = none */
  uint64_t timeout_set_ns;
  /* Optional read-ahead: a receive of less than rcap bytes takes whatever
   * has arrived (up to rcap) in one recv, so a small frame's header, table
   * and payload cost one system call. NULL: every receive goes direct. */
  uint8_t *rbuf;
  size_t rcap, rpos, rlen;
  uint64_t spin_ns;       /* receives poll this long before sleeping (0: never) */
  ferry_session *session; /* NULL: frames go as they are */
  /* Optional: once *cancel is nonzero, every transfer fails with
   * FERRY_ECLOSED before its next system call. An unregister fence sets it
   * (and shuts the socket down to wake a blocked call). */
  const int *cancel;
  /* Optional stall bound (0: none): a socket that moves no byte for
   * stall_ns, while nothing it sent is acknowledged meanwhile either, fails
   * its call with FERRY_ESOCKET "no progress for N ms" when
   * stall_ok(stall_arg) agrees at that moment (a silent link worth dropping);
   * otherwise it waits on, up to the deadline. Progress resets it, not
   * completion: a slow link that moves bytes never trips it. It counts
   * from ferry_sock_set_deadline. */
  uint64_t stall_ns;
  int (*stall_ok)(void *arg);
  void *stall_arg;
  int unacked;          /* bytes in the send queue at the last look; -1: none since a send */
  uint64_t progress_ns; /* the last progress seen */
  int stalled;          /* the last failure was the stall bound */
  uint64_t send_left;   /* payload bytes a frame sent in pieces still owes */
} ferry_sock;

void ferry_sock_init(ferry_sock *s, int fd, const char *peer);
/* From now on every frame sent is sealed and every frame received must be,
 * under session (when session->on; else nothing changes). Each send must be
 * whole frames starting with a header alone in iov[0]; each receive after a
 * header takes the head, or the payload, or a piece of the payload. */
void ferry_sock_auth(ferry_sock *s, ferry_session *session);
/* Turns read-ahead on, with a buffer that lives as long as the socket. */
void ferry_sock_readahead(ferry_sock *s, uint8_t *buf, size_t cap);
/* Nonzero when read-ahead holds bytes nobody has asked for yet. */
int ferry_sock_buffered(const ferry_sock *s);
/* Also restarts the stall bound and clears the mark of an earlier stall. */
void ferry_sock_set_deadline(ferry_sock *s, uint64_t deadline_ns);
/* Sends/receives the whole iovec (which is consumed). step names the
 * operation for the message ("send WRITE"). FERRY_ETIMEDOUT at the
 * deadline, FERRY_ESOCKET on errors or EOF. */
ferry_status ferry_sock_sendv(ferry_sock *s, struct iovec *iov, int iovcnt, const char *step);
ferry_status ferry_sock_recvv(ferry_sock *s, struct iovec *iov, int iovcnt, const char *step);
ferry_status ferry_sock_recv(ferry_sock *s, void *buf, size_t len, const char *step);
/* ferry_sock_recvv into memory a peer chose (registered memory): only the
 * kernel writes it (recvmsg, and process_vm_writev on this process for
 * bytes read ahead), so a page this process cannot write (unmapped or
 * protected since it was registered) fails the receive with FERRY_EFAULT
 * instead of a fault. *placed: the bytes of iov received before that; the
 * frame's other bytes are still to be read (ferry_sock_discard them). */
ferry_status ferry_sock_recvv_registered(ferry_sock *s, struct iovec *iov, int iovcnt,
                                         uint64_t *placed, const char *step);
/* One frame sent in pieces, its payload streamed (from bounce buffers)
 * instead of gathered in one iovec: open sends the header (iov[0]) and all
 * of the head (as ferry_sock_sendv takes them, no payload byte), each piece
 * is payload, and close ends it (sealed: the payload's tag). Call close
 * once after open whatever happened, with the status so far: it returns it
 * when it is not FERRY_OK (only freeing), and fails a payload not sent
 * whole. The bytes on the wire are those of one ferry_sock_sendv. */
ferry_status ferry_sock_send_open(ferry_sock *s, struct iovec *iov, int iovcnt, const char *step);
ferry_status ferry_sock_send_piece(ferry_sock *s, void *buf, size_t len, const char *step);
ferry_status ferry_sock_send_close(ferry_sock *s, ferry_status so_far, const char *step);

/* A streamed payload's pieces (ferry_sock_send_piece, ferry_sock_recv)
 * with their running crc32c kept when checksum is set: the movers staging
 * (memory/staging.h) hands bounce buffers to, arg a ferry_sock_crc. */
typedef struct ferry_sock_crc {
  ferry_sock *sock;
  int checksum;
  uint32_t crc;
  const char *step;
} ferry_sock_crc;
ferry_status ferry_sock_crc_send(void *arg, void *buf, size_t len);
ferry_status ferry_sock_crc_recv(void *arg, void *buf, size_t len);
/* Receiving a payload in pieces that must all be checked (sealed: one
 * tag over every piece, compared when the last arrives): on 1 before the
 * first piece, 0 after the last or on failure (frees what is left). */
void ferry_sock_recv_stream(ferry_sock *s, int on);
/* Reads and throws away len bytes (payload of a refused request). */
ferry_status ferry_sock_discard(ferry_sock *s, uint64_t len, const char *step);

/* One frame: header (+ body). Receiving checks the header with the wire
 * codecs; recv_frame reads a body of at most max_body into body. */
ferry_status ferry_sock_send_frame(ferry_sock *s, const ferry_frame_header *h, const void *body,
                                   const char *step);
ferry_status ferry_sock_recv_header(ferry_sock *s, ferry_frame_header *h, const char *step);
/* A reply with status != 0: reads the reason text and records it as the
 * error detail "<step> refused by <peer>: <reason>", returning the status. */
ferry_status ferry_sock_read_refusal(ferry_sock *s, const ferry_frame_header *h, const char *step);

/* Nonzero when an idle connection has nothing pending and is not closed. */
int ferry_net_idle_alive(int fd);

#endif
