/* fabric_sink.c - receives that drop the messages nobody should send to a
 * target's endpoint. ferry moves bytes over fabric with RMA only, but an
 * RDM endpoint takes messages from anyone who connects, no secret needed,
 * and rxm (tcp;ofi_rxm, verbs;ofi_rxm) keeps each message no receive
 * matches in a queue without bound: 20000 messages of 4 KiB from a plain
 * libfabric client grew a target by 330 MB, kept after the client left.
 * So each target endpoint keeps FERRY_FABRIC_SINK_RECVS small receives of
 * each kind (messages, tagged messages with any tag) posted; a message
 * landing in one (truncated to its FERRY_FABRIC_SINK_BYTES) is counted,
 * logged (rate-limited) and dropped, and the receive posted again by the
 * lane's next round. rxm brings in up to 32 messages per progress call,
 * so 32 of each kind keep up with a flood (with 4, 240000 messages still
 * grew the target by 11 MB); a receive posted while messages are queued
 * takes the oldest first. */
#include <errno.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "transport/fabric.h"

#define SINK_SLOTS (2 * FERRY_FABRIC_SINK_RECVS) /* messages first, then tagged */

static int is_tagged(unsigned slot) { return slot >= FERRY_FABRIC_SINK_RECVS; }

static void post(ferry_fabric_sink *s, unsigned slot) {
  void *buf = s->buf[slot], *desc = fi_mr_desc(s->mr);
  ssize_t rc =
      is_tagged(slot)
          ? fi_trecv(s->ep, buf, FERRY_FABRIC_SINK_BYTES, desc, FI_ADDR_UNSPEC, 0, ~0ull, buf)
          : fi_recv(s->ep, buf, FERRY_FABRIC_SINK_BYTES, desc, FI_ADDR_UNSPEC, buf);
  s->posted[slot] = rc == 0; /* else the next refill tries again */
}

void ferry_fabric_sink_refill(ferry_fabric_sink *s) {
  for (unsigned i = 0; s->ep && i < SINK_SLOTS; i++)
    if (!s->posted[i])
      post(s, i);
}

/* An MR for the receive buffers (FI_MR_LOCAL providers need one; it gives
 * no remote access), bound to the endpoint where the provider wants it. */
static int register_buffers(ferry_fabric *f, ferry_fabric_domain *dom, ferry_fabric_sink *s) {
  uint64_t key = f->prov_key ? 0 : ferry_fabric_new_key(f);
  if (!f->prov_key && !key)
    return -FI_EIO;
  int rc = fi_mr_reg(dom->domain, s->buf, sizeof s->buf, FI_RECV, 0, key, 0, &s->mr, NULL);
  if (rc == 0 && f->mr_endpoint && (rc = fi_mr_bind(s->mr, &s->ep->fid, 0)) == 0)
    rc = fi_mr_enable(s->mr);
  return rc;
}

void ferry_fabric_sink_open(ferry_fabric *f, ferry_fabric_domain *dom, struct fid_ep *ep,
                            ferry_fabric_sink *s) {
  memset(s, 0, sizeof *s);
  s->fabric = f;
  uint64_t need = FI_MSG | FI_TAGGED;
  if ((dom->info->caps & need) != need) {
    FERRY_INFO("fabric: provider %s takes no receives on its RMA endpoints: what peers send "
               "there is the provider's to keep",
               f->self.provider);
    return;
  }
  s->ep = ep;
  int rc = register_buffers(f, dom, s);
  if (rc) {
    FERRY_WARN("fabric: no receive buffers for the target's endpoint (%s): messages peers send "
               "there queue in the provider",
               ferry_fi.strerror(-rc));
    ferry_fabric_sink_close(s);
    return;
  }
  ferry_fabric_sink_refill(s);
}

int ferry_fabric_sink_took(ferry_fabric_sink *s, void *context, int err) {
  uint8_t *at = context;
  if (!s->ep || at < s->buf[0] || at >= s->buf[SINK_SLOTS])
    return 0;
  unsigned slot = (unsigned)((at - s->buf[0]) / FERRY_FABRIC_SINK_BYTES);
  s->posted[slot] = 0;
  if (err == FI_ECANCELED) /* the endpoint closes */
    return 1;
  char since[96];
  if (ferry_fabric_refusal_count(&s->fabric->messages, since, sizeof since))
    FERRY_WARN("fabric: a peer sent a %smessage to this target's endpoint (%s), where ferry's "
               "peers send none (it moves bytes with RMA): dropped; %s",
               is_tagged(slot) ? "tagged " : "", err ? ferry_fi.strerror(err) : "received", since);
  return 1;
}

void ferry_fabric_sink_close(ferry_fabric_sink *s) {
  if (s->mr)
    fi_close(&s->mr->fid);
  s->mr = NULL;
  s->ep = NULL;
}
