/* tcp.c - the TCP data transport.
 *
 * Each channel is one persistent connection. A WRITE frame is sent with one
 * sendmsg straight from registered memory (header, segment table, payload
 * segments); the target reads it into its memory with recvmsg and answers
 * once the last byte landed. A READ is a segment table; the reply's payload
 * is received straight into local memory. A batch's after-landed message
 * rides on its last WRITE frame (FERRY_FRAME_FLAG_AFTER) and its reply on
 * that frame's ack. Several frames are kept in flight per connection so
 * the link never idles waiting for an acknowledgement.
 *
 * Rails: a target with rail_hosts listens on each rail too (service_start;
 * the server accepts there) and its descriptor lists them, "host:port"
 * comma-separated. An initiator opens each data channel on one of them
 * (rail_open); without a descriptor the peer has one rail, its RPC port.
 *
 * A silent link (no reset: a pulled cable, an interface set down) would
 * hold a rail's chunks until the batch's deadline. While another rail or
 * transport of the peer is usable, a channel whose chunk in flight moves no
 * byte and gets none acknowledged for stall_ms gives its link up instead
 * (ferry_sock.stall_ns): it is cut at the target, as a broken one is, and
 * its chunks move on. */
#include <endian.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "core/transport.h"
#include "memory/staging.h"

/* Frames in flight per connection. One, with the engine's 4 connections
 * and 512 KiB frames, measured best on loopback (FERRY_DEFAULT_SLICE); the
 * code keeps a window so that a long-delay link can be given a deeper one. */
#define TCP_WINDOW 1

typedef struct tcp_slot {
  ferry_chunk chunk;
  uint8_t header[FERRY_WIRE_HEADER_SIZE];
  uint8_t table[FERRY_CHUNK_MAX_SEGMENTS * FERRY_WIRE_SEGMENT_SIZE];
  uint32_t crc;       /* little-endian on the wire */
  ferry_after *after; /* carried after the payload (batch.h), or NULL */
} tcp_slot;

typedef struct tcp_channel {
  ferry_channel base;
  ferry_sock sock;
  ferry_session session;
  char address[FERRY_HOST_MAX + 8];
  int cuttable; /* the target speaks CUT (wire v5) */
  struct iovec iov[FERRY_WIRE_MAX_SEGMENTS + 4];
  tcp_slot slots[TCP_WINDOW];
  uint8_t readahead[FERRY_READAHEAD];
  /* Staging: where the local memory of the chunk at hand lives, and the
   * bounce buffers, opened when a chunk first needs them. */
  ferry_stage_range ranges[FERRY_CHUNK_MAX_SEGMENTS];
  ferry_stager *stager;
} tcp_channel;

static int tcp_usable(ferry_engine *e, const ferry_hello_reply *info, char *why, size_t size) {
  return 1; /* anything that answered the handshake over TCP can carry data over TCP */
}

static size_t tcp_slice(const ferry_batch *b) { return b->engine->cfg.slice_size; }

/* The stall bound's question, when a window passed with no progress: is
 * there somewhere else for this channel's chunks to go? */
static int may_drop(void *arg) {
  tcp_channel *ch = arg;
  return ferry_peer_can_fail_over(ch->base.peer, &ch->base);
}

/* The stall bound of this drive: only when another rail could take over,
 * else (one rail, no standby) the batch's deadline alone, as always. */
static uint64_t stall_bound(tcp_channel *ch) {
  ferry_peer *p = ch->base.peer;
  return may_drop(ch) ? p->engine->cfg.stall_ms * 1000000ull : 0;
}

/* A data connection to the peer's RPC port (rail NULL) or to one rail. */
static ferry_status open_on(ferry_peer *p, const char *rail, uint64_t deadline_ns,
                            ferry_channel **out) {
  tcp_channel *ch = calloc(1, sizeof *ch);
  if (!ch)
    return ferry_fail(FERRY_ENOMEM, "no memory for a connection to %s", p->address);
  int fd;
  ferry_hello_reply reply;
  ferry_status st =
      ferry_peer_connect_at(p, rail, FERRY_CONN_DATA, deadline_ns, &fd, &reply, &ch->session);
  if (st) {
    free(ch);
    return st;
  }
  ch->base.transport = &ferry_transport_tcp;
  ch->base.peer = p;
  ch->base.peer_instance = reply.engine_id;
  ch->cuttable = reply.version >= 5;
  if (rail)
    snprintf(ch->address, sizeof ch->address, "%.190s (rail %.60s)", p->address, rail);
  else
    snprintf(ch->address, sizeof ch->address, "%s", p->address);
  ferry_sock_init(&ch->sock, fd, ch->address);
  ferry_sock_auth(&ch->sock, &ch->session);
  ferry_sock_readahead(&ch->sock, ch->readahead, sizeof ch->readahead);
  ch->sock.spin_ns = p->engine->cfg.spin_us * 1000ull;
  ch->sock.stall_ok = may_drop;
  ch->sock.stall_arg = ch;
  FERRY_DEBUG("opened tcp data connection to %s", ch->address);
  *out = &ch->base;
  return FERRY_OK;
}

static ferry_status tcp_open(ferry_peer *p, uint64_t deadline_ns, ferry_channel **out) {
  return open_on(p, NULL, deadline_ns, out);
}

static ferry_status tcp_rail_open(ferry_peer *p, const char *rail, uint64_t deadline_ns,
                                  ferry_channel **out) {
  return open_on(p, rail, deadline_ns, out);
}

/* The peer's rails from its descriptor; a name that does not parse as
 * host:port is skipped (the RPC port still works). */
static unsigned tcp_rails(const ferry_hello_reply *info, char names[][FERRY_RAIL_NAME_MAX],
                          unsigned max) {
  const ferry_wire_descriptor *d = ferry_wire_descriptor_find(info, FERRY_TRANSPORT_TCP);
  unsigned count = 0;
  for (size_t at = 0; d && at < d->len && count < max;) {
    const uint8_t *comma = memchr(d->data + at, ',', d->len - at);
    size_t len = comma ? (size_t)(comma - (d->data + at)) : d->len - at;
    char host[FERRY_HOST_MAX];
    uint16_t port;
    if (len && len < FERRY_RAIL_NAME_MAX) {
      memcpy(names[count], d->data + at, len);
      names[count][len] = 0;
      if (!memchr(names[count], 0, len) &&
          ferry_net_parse_target(names[count], host, &port) == FERRY_OK)
        count++;
    }
    at += len + 1;
  }
  return count;
}

/* Opens a pinned listener on every configured rail. */
static ferry_status tcp_service_start(ferry_engine *e) {
  ferry_rail_spec specs[FERRY_RAILS_MAX];
  unsigned count;
  ferry_status st = ferry_rails_parse(e->rail_hosts, specs, &count); /* checked at adopt */
  for (unsigned i = 0; i < count && !st; i++) {
    uint16_t port;
    st = ferry_net_listen(specs[i].host, specs[i].port, &e->rail_fds[i], &port);
    if (st)
      break;
    e->rail_count++;
    if (specs[i].advertise[0])
      snprintf(e->rail_names[i], FERRY_RAIL_NAME_MAX, "%s", specs[i].advertise);
    else
      ferry_net_format_target(e->rail_names[i], FERRY_RAIL_NAME_MAX, specs[i].host, port);
    FERRY_INFO("rail %u: serving data on %s", i, e->rail_names[i]);
  }
  return st;
}

static size_t tcp_describe(ferry_engine *e, uint8_t *out, size_t size) {
  size_t used = 0;
  for (unsigned i = 0; i < e->rail_count; i++) {
    size_t len = strlen(e->rail_names[i]);
    if (used + len + (i ? 1 : 0) > size)
      break;
    if (i)
      out[used++] = ',';
    memcpy(out + used, e->rail_names[i], len);
    used += len;
  }
  return used;
}

static void tcp_service_stop(ferry_engine *e) {
  for (unsigned i = 0; i < e->rail_count; i++)
    close(e->rail_fds[i]);
  e->rail_count = 0;
}

static uint32_t chunk_crc(const ferry_chunk *c) {
  uint32_t crc = 0;
  for (uint32_t i = 0; i < c->count; i++)
    crc = ferry_crc32c(crc, c->local[i].iov_base, c->local[i].iov_len);
  return crc;
}

/* ---- staging (memory/staging.h) ------------------------------------------ */

/* Whether the chunk's local memory moves through the staging pipeline
 * (ch->ranges then says where it lives). */
static int staged(tcp_channel *ch, const ferry_chunk *c) {
  ferry_engine *e = ch->base.peer->engine;
  if (!ferry_stage_plan(e->registry, c->local, c->count, e->cfg.staging, ch->ranges))
    return 0;
  if (!ch->stager && !(ch->stager = ferry_stager_create()))
    FERRY_WARN("no memory for a staging pipeline: a chunk to %s moves unstaged", ch->address);
  return ch->stager != NULL;
}

/* A staged WRITE: header and table, the payload through bounce buffers,
 * then the after-landed message and the crc. */
static ferry_status send_staged(tcp_channel *ch, tcp_slot *s, int n, int checksum) {
  ferry_chunk *c = &s->chunk;
  ferry_sock_crc io = {&ch->sock, checksum, 0, "send WRITE (staged)"};
  ferry_status st = ferry_sock_send_open(&ch->sock, ch->iov, n, "send WRITE");
  if (!st)
    st = ferry_stage_out(ch->stager, ch->ranges, c->count, ferry_sock_crc_send, &io);
  if (!st && s->after)
    st = ferry_sock_send_piece(&ch->sock, s->after->body, s->after->len, "send WRITE");
  if (!st && checksum) {
    s->crc = htole32(s->after ? ferry_crc32c(io.crc, s->after->body, s->after->len) : io.crc);
    st = ferry_sock_send_piece(&ch->sock, &s->crc, sizeof s->crc, "send WRITE");
  }
  st = ferry_sock_send_close(&ch->sock, st, "send WRITE");
  if (!st)
    ferry_stats_staged(ch->base.peer->engine, FERRY_OP_WRITE, c->bytes);
  if (st && st != FERRY_ESOCKET && st != FERRY_ETIMEDOUT && st != FERRY_ECLOSED)
    st = ferry_fail(st, "WRITE to %s cut short: %s", ch->address, ferry_last_error());
  return st;
}

static ferry_status send_request(tcp_channel *ch, tcp_slot *s, uint64_t id, int checksum) {
  ferry_chunk *c = &s->chunk;
  int write = c->op == FERRY_OP_WRITE;
  uint64_t table_len = (uint64_t)c->count * FERRY_WIRE_SEGMENT_SIZE;
  uint64_t after_len = s->after ? s->after->len : 0;
  ferry_frame_header h = {
      .type = write ? FERRY_FRAME_WRITE : FERRY_FRAME_READ,
      .flags = (checksum ? FERRY_FRAME_FLAG_CHECKSUM : 0) | (s->after ? FERRY_FRAME_FLAG_AFTER : 0),
      .count = c->count,
      .id = id,
      .body_len = table_len + (write ? c->bytes + after_len + (checksum ? 4 : 0) : 0)};
  ferry_wire_header_encode(s->header, &h);
  ferry_wire_segments_encode(s->table, c->remote, c->count);
  struct iovec *iov = ch->iov;
  int n = 0;
  iov[n++] = (struct iovec){s->header, sizeof s->header};
  iov[n++] = (struct iovec){s->table, (size_t)table_len};
  if (write && staged(ch, c))
    return send_staged(ch, s, n, checksum);
  if (write) {
    memcpy(&iov[n], c->local, c->count * sizeof *iov);
    n += (int)c->count;
    if (s->after)
      iov[n++] = (struct iovec){s->after->body, s->after->len};
    if (checksum) {
      uint32_t crc = chunk_crc(c);
      s->crc = htole32(s->after ? ferry_crc32c(crc, s->after->body, s->after->len) : crc);
      iov[n++] = (struct iovec){&s->crc, sizeof s->crc};
    }
  }
  return ferry_sock_sendv(&ch->sock, iov, n, write ? "send WRITE" : "send READ");
}

/* A staged READ reply's data: into bounce buffers, copied into the local
 * memory, every copy ended before this returns (done means landed). */
static ferry_status receive_staged(tcp_channel *ch, ferry_chunk *c, int checksum) {
  ferry_sock_crc io = {&ch->sock, checksum, 0, "receive READ data (staged)"};
  ferry_status copied;
  ferry_sock_recv_stream(&ch->sock, 1);
  ferry_status st =
      ferry_stage_in(ch->stager, ch->ranges, c->count, ferry_sock_crc_recv, &io, &copied);
  uint32_t crc = 0;
  if (!st && checksum)
    st = ferry_sock_recv(&ch->sock, &crc, sizeof crc, "receive READ data");
  ferry_sock_recv_stream(&ch->sock, 0);
  if (st || copied)
    return st ? st : copied;
  if (checksum && le32toh(crc) != io.crc)
    return ferry_fail(FERRY_ECHECKSUM, "checksum mismatch on READ of %llu bytes from %s",
                      (unsigned long long)c->bytes, ch->address);
  ferry_stats_staged(ch->base.peer->engine, FERRY_OP_READ, c->bytes);
  return FERRY_OK;
}

static ferry_status receive_read_data(tcp_channel *ch, tcp_slot *s, const ferry_frame_header *h,
                                      int checksum) {
  ferry_chunk *c = &s->chunk;
  uint64_t expected = c->bytes + (checksum ? 4 : 0);
  if (h->body_len != expected || (checksum && !(h->flags & FERRY_FRAME_FLAG_CHECKSUM)))
    return ferry_fail(FERRY_EPROTO, "READ reply from %s carries %llu bytes, expected %llu",
                      ch->address, (unsigned long long)h->body_len, (unsigned long long)expected);
  if (staged(ch, c))
    return receive_staged(ch, c, checksum);
  memcpy(ch->iov, c->local, c->count * sizeof *ch->iov);
  int n = (int)c->count;
  uint32_t crc = 0;
  if (checksum)
    ch->iov[n++] = (struct iovec){&crc, sizeof crc};
  ferry_status st = ferry_sock_recvv(&ch->sock, ch->iov, n, "receive READ data");
  if (!st && checksum && le32toh(crc) != chunk_crc(c))
    st = ferry_fail(FERRY_ECHECKSUM, "checksum mismatch on READ of %llu bytes from %s",
                    (unsigned long long)c->bytes, ch->address);
  return st;
}

/* Receives the reply to the oldest frame in flight. *fatal tells whether
 * the connection is out of step (must close) or merely saw a refusal. */
static ferry_status receive_reply(tcp_channel *ch, tcp_slot *s, uint64_t id, int checksum,
                                  int *fatal) {
  int write = s->chunk.op == FERRY_OP_WRITE;
  ferry_frame_header h;
  *fatal = 1;
  ferry_status st =
      ferry_sock_recv_header(&ch->sock, &h, write ? "receive WRITE ack" : "receive READ reply");
  if (st)
    return st;
  uint8_t want = write ? FERRY_FRAME_WRITE_ACK : FERRY_FRAME_READ_REPLY;
  if (h.type != want || h.id != id)
    return ferry_fail(FERRY_EPROTO,
                      "reply from %s is frame type %u id %llu, expected type %u id %llu",
                      ch->address, h.type, (unsigned long long)h.id, want, (unsigned long long)id);
  if (!h.status && write && !(h.flags & FERRY_FRAME_FLAG_AFTER) != !s->after)
    return ferry_fail(FERRY_EPROTO, "WRITE ack from %s %s the after-landed reply", ch->address,
                      s->after ? "lacks" : "carries an unasked");
  if (h.status) {
    st = ferry_sock_read_refusal(&ch->sock, &h, write ? "WRITE" : "READ");
    *fatal = st == FERRY_ESOCKET || st == FERRY_ETIMEDOUT;
    return st;
  }
  *fatal = 0;
  if (write && s->after) { /* the after-landed message's reply */
    st = ferry_sock_recv(&ch->sock, s->after->reply, sizeof s->after->reply, "receive WRITE ack");
    *fatal = st != FERRY_OK;
    s->after->carried = !st;
    return st;
  }
  if (write)
    return FERRY_OK; /* header decode guaranteed an empty body */
  st = receive_read_data(ch, s, &h, checksum);
  *fatal = st != FERRY_OK && st != FERRY_ECHECKSUM;
  return st;
}

/* Nonzero once the target has ended its side of the connection (a FIN or
 * a reset): every byte it sent is queued here, so reading cannot wait. */
static int target_hung_up(const tcp_channel *ch) {
  struct pollfd p = {.fd = ch->sock.fd, .events = POLLIN | POLLRDHUP};
  return poll(&p, 1, 0) == 1 && p.revents & (POLLHUP | POLLRDHUP | POLLERR);
}

/* The outcome of a frame in flight when a send failed (failed, in the
 * error detail). A target that refused the frame and closed (a fence:
 * "region ... unregistered at T while the WRITE from P was in flight")
 * answered before its reset, so the answer is queued here and says more
 * than "Broken pipe". It is read only from a target that hung up. */
static ferry_status after_failed_send(tcp_channel *ch, tcp_slot *s, uint64_t id, int checksum,
                                      ferry_status failed) {
  if (failed != FERRY_ESOCKET || !target_hung_up(ch))
    return failed;
  char cause[FERRY_ERROR_MAX];
  snprintf(cause, sizeof cause, "%s", ferry_last_error());
  int fatal;
  ferry_status st = receive_reply(ch, s, id, checksum, &fatal);
  if (!fatal)
    return st; /* the target's own answer */
  return ferry_fail(failed, "%s", cause);
}

/* What became of the WRITEs a broken connection left unacknowledged. */
enum { CUT_NOT_NEEDED, CUT_CONFIRMED, CUT_UNCONFIRMED };

/* The connection broke with a WRITE unacknowledged. Before that WRITE is
 * sent again on another rail, or the call fails and its caller writes
 * again, the target must stop serving this connection: bytes of it still
 * in the target's socket buffer would otherwise land later, over the newer
 * ones (RELIABILITY 5). Keeps the failure's own detail. */
static int cut_at_target(tcp_channel *ch, uint64_t deadline_ns) {
  if (!ch->cuttable) /* a v4 target: as before the protocol had CUT */
    return CUT_CONFIRMED;
  char cause[FERRY_ERROR_MAX];
  snprintf(cause, sizeof cause, "%s", ferry_last_error());
  if (ferry_peer_cut(ch->base.peer, ch->session.id, deadline_ns) == FERRY_OK) {
    ferry_fail(FERRY_ESOCKET, "%s", cause);
    return CUT_CONFIRMED;
  }
  ferry_fail(FERRY_ESOCKET,
             "%s; the target did not confirm it stopped serving that connection (%s), so its "
             "WRITE is not sent again elsewhere",
             cause, ferry_last_error());
  return CUT_UNCONFIRMED;
}

static ferry_status tcp_drive(ferry_channel *base, ferry_batch *b) {
  tcp_channel *ch = (tcp_channel *)base;
  int checksum = b->engine->cfg.checksum;
  size_t slice = tcp_slice(b);
  uint64_t sent = 0, done = 0; /* frame ids; slot = id % window */
  ferry_status first = FERRY_OK;
  int cut = CUT_NOT_NEEDED;
  ferry_sock_set_deadline(&ch->sock, b->deadline_ns);
  ch->sock.stall_ns = stall_bound(ch);
  for (;;) {
    while (!base->broken && sent - done < TCP_WINDOW &&
           ferry_batch_claim_on(b, base, slice, &ch->slots[sent % TCP_WINDOW].chunk,
                                &ch->slots[sent % TCP_WINDOW].after)) {
      ferry_status st = send_request(ch, &ch->slots[sent % TCP_WINDOW], sent, checksum);
      sent++;
      if (st) { /* settled below, with the frames still in flight */
        base->broken = 1;
        first = first ? first : st;
      }
    }
    if (done == sent)
      break;
    int fatal = 0;
    tcp_slot *slot = &ch->slots[done % TCP_WINDOW];
    ferry_status st = base->broken ? after_failed_send(ch, slot, done, checksum, first)
                                   : receive_reply(ch, slot, done, checksum, &fatal);
    if (fatal)
      base->broken = 1;
    if (st && !first)
      first = st;
    ferry_chunk *c = &slot->chunk;
    if (st == FERRY_ESOCKET && c->op == FERRY_OP_WRITE) {
      if (cut == CUT_NOT_NEEDED)
        cut = cut_at_target(ch, b->deadline_ns);
      c->retried |= cut == CUT_UNCONFIRMED; /* it may still land: it stays failed */
    }
    ferry_stats_moved(base->peer, base->transport, c, st);
    ferry_batch_settle(b, base, c, st);
    done++;
  }
  ferry_sock_set_deadline(&ch->sock, 0);
  if (done && !base->broken)
    base->replied_ns = ferry_now_ns();
  return first;
}

static int tcp_alive(ferry_channel *base) {
  tcp_channel *ch = (tcp_channel *)base;
  if (ferry_sock_buffered(&ch->sock))
    return 0; /* bytes nobody asked for: the stream is out of step */
  if (ferry_now_ns() - base->replied_ns < FERRY_PEER_TRUST_NS)
    return 1;
  return ferry_net_idle_alive(ch->sock.fd);
}

static void tcp_shutdown(ferry_channel *base) {
  shutdown(((tcp_channel *)base)->sock.fd, SHUT_RDWR);
}

static void tcp_close(ferry_channel *base) {
  tcp_channel *ch = (tcp_channel *)base;
  if (base->broken) {
    /* Abandoned mid-conversation (timeout, error): reset rather than close
     * gracefully, so bytes still queued in the kernel are dropped instead of
     * being delivered later, on top of a newer WRITE. */
    struct linger hard = {1, 0};
    setsockopt(ch->sock.fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  }
  close(ch->sock.fd);
  ferry_stager_destroy(ch->stager);
  free(ch);
}

const ferry_transport ferry_transport_tcp = {
    .name = "tcp",
    .id = FERRY_TRANSPORT_TCP,
    .usable = tcp_usable,
    .slice_size = tcp_slice,
    .channel_open = tcp_open,
    .channel_drive = tcp_drive,
    .carries_after = 1,
    .pool_writes_bounded = 1,                     /* server.c checks every WRITE frame */
    .carries_device_memory = FERRY_DEVICE_STAGED, /* through the staging pipeline */
    .channel_alive = tcp_alive,
    .channel_shutdown = tcp_shutdown,
    .channel_close = tcp_close,
    .service_start = tcp_service_start,
    .describe = tcp_describe,
    .service_stop = tcp_service_stop,
    .rails = tcp_rails,
    .rail_open = tcp_rail_open,
};
