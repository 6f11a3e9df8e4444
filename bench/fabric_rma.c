/* fabric_rma.c - libfabric's own one-sided RMA throughput on one provider,
 * the baseline the fabric transport is measured against (issue 12).
 *
 * One process forks a passive target: it opens an RDM endpoint, registers
 * one buffer and hands its fi_getname address, key and base address to the
 * initiator over a socketpair, then only drives progress (every provider
 * here has manual progress: a target that never reads its CQ stalls the
 * initiator). The initiator, one thread, keeps DEPTH writes or reads of one
 * size in flight for a given time, each WRITE asking for delivery
 * completion (done means in the target's memory), and verifies every run by
 * reading back what it wrote.
 *
 * Waiting: "block" sleeps on the CQ's wait fd (FI_WAIT_FD) on both sides,
 * falling back to polling where the provider has no wait object (shm);
 * "spin" polls. --basic asks for FI_MR_BASIC with API 1.4: virtual
 * addresses and provider keys, the verbs/efa addressing path.
 *
 *   fabric_rma [-p PROVIDER] [-n NODE] [-w block|spin] [-t SECONDS]
 *              [-d DEPTH] [-o write|read] [--basic] SIZE...
 * PROVIDER defaults to "tcp;ofi_rxm". NODE is the source address to bind;
 * without it, a provider with IP addresses is pinned to 127.0.0.1 (traffic
 * never leaves loopback) and others (shm) choose their own. One JSON line
 * per (op, size) on stdout, with CPU seconds per GB of both processes.
 */
#include <errno.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"

#define BUF_BYTES (64u << 20) /* per side: DEPTH slots of the size, wrapped */
#define ADDR_MAX 256

enum { OP_WRITE = 1, OP_READ = 2 };

struct opts {
  const char *provider, *node;
  int spin, basic, depth, ops;
  double seconds;
};

/* What the target tells the initiator. */
struct target_facts {
  uint64_t key, base, len, addrlen;
  char addr[ADDR_MAX];
};

struct fab {
  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_av *av;
  struct fid_cq *cq;
  struct fid_ep *ep;
  struct fid_mr *mr;
  int cq_fd; /* -1: the provider has no wait fd, poll */
  char *buf;
};

static void die(const char *what, int rc) {
  fprintf(stderr, "fabric_rma: %s: %s (%d)\n", what, fi_strerror(-rc), rc);
  exit(1);
}

static void check(const char *what, int rc) {
  if (rc != 0)
    die(what, rc);
}

static uint64_t cpu_ns(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
         ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

static int is_ip(uint32_t format) {
  return format == FI_SOCKADDR || format == FI_SOCKADDR_IN || format == FI_SOCKADDR_IN6;
}

/* Every MR mode bit this program honours; the provider clears those it does
 * not need (libfabric.md: the strict set cannot be forced with API 1.17). */
static struct fi_info *get_info(const struct opts *o) {
  struct fi_info *hints = fi_allocinfo(), *info = NULL;
  if (!hints)
    die("fi_allocinfo", -FI_ENOMEM);
  hints->caps = FI_RMA;
  hints->ep_attr->type = FI_EP_RDM;
  hints->fabric_attr->prov_name = strdup(o->provider);
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  uint32_t version = FI_VERSION(1, 17);
  if (o->basic) {
    version = FI_VERSION(1, 4);
    hints->domain_attr->mr_mode = FI_MR_BASIC;
  } else {
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  }
  const char *node = o->node;
  int rc = fi_getinfo(version, node, NULL, node ? FI_SOURCE : 0, hints, &info);
  if (rc == 0 && !node && is_ip(info->addr_format)) {
    /* An IP provider offers one entry per interface, eth0 first: pin the
     * source address to loopback instead. */
    fi_freeinfo(info);
    info = NULL;
    node = "127.0.0.1";
    rc = fi_getinfo(version, node, NULL, FI_SOURCE, hints, &info);
  }
  fi_freeinfo(hints);
  if (rc != 0) {
    fprintf(stderr, "fabric_rma: fi_getinfo(%s, node %s): %s\n", o->provider, node ? node : "any",
            fi_strerror(-rc));
    exit(1);
  }
  return info;
}

/* FI_MR_BASIC (API < 1.5) means VIRT_ADDR and PROV_KEY. */
static int uses_virt_addr(const struct fi_info *info) {
  int mode = info->domain_attr->mr_mode;
  return mode == FI_MR_BASIC || (mode & FI_MR_VIRT_ADDR);
}

static void open_cq(struct fab *f, int spin) {
  struct fi_cq_attr attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 1024};
  attr.wait_obj = spin ? FI_WAIT_NONE : FI_WAIT_FD;
  int rc = fi_cq_open(f->domain, &attr, &f->cq, NULL);
  f->cq_fd = -1;
  if (!spin && rc == -FI_ENOSYS) { /* no wait object (shm): poll */
    attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(f->domain, &attr, &f->cq, NULL);
  } else if (rc == 0 && !spin) {
    check("fi_control(FI_GETWAIT)", fi_control(&f->cq->fid, FI_GETWAIT, &f->cq_fd));
  }
  check("fi_cq_open", rc);
}

static void open_fab(struct fab *f, const struct opts *o) {
  f->info = get_info(o);
  check("fi_fabric", fi_fabric(f->info->fabric_attr, &f->fabric, NULL));
  check("fi_domain", fi_domain(f->fabric, f->info, &f->domain, NULL));
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  check("fi_av_open", fi_av_open(f->domain, &av_attr, &f->av, NULL));
  open_cq(f, o->spin);
  check("fi_endpoint", fi_endpoint(f->domain, f->info, &f->ep, NULL));
  check("fi_ep_bind(av)", fi_ep_bind(f->ep, &f->av->fid, 0));
  check("fi_ep_bind(cq)", fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV));
  check("fi_enable", fi_enable(f->ep));

  f->buf = mmap(NULL, BUF_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (f->buf == MAP_FAILED)
    die("mmap", -FI_ENOMEM);
  memset(f->buf, 0, BUF_BYTES); /* fault the pages in before timing */
  uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  check("fi_mr_reg", fi_mr_reg(f->domain, f->buf, BUF_BYTES, access, 0, 0, 0, &f->mr, NULL));
  if (f->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    check("fi_mr_bind", fi_mr_bind(f->mr, &f->ep->fid, 0));
    check("fi_mr_enable", fi_mr_enable(f->mr));
  }
}

static void close_fab(struct fab *f) {
  fi_close(&f->mr->fid);
  fi_close(&f->ep->fid);
  fi_close(&f->cq->fid);
  fi_close(&f->av->fid);
  fi_close(&f->domain->fid);
  fi_close(&f->fabric->fid);
  fi_freeinfo(f->info);
  munmap(f->buf, BUF_BYTES);
}

/* Reads completions; 0 when none. A failed operation ends the run with the
 * provider's own text. */
static int reap(struct fab *f) {
  struct fi_cq_entry done[64];
  ssize_t n = fi_cq_read(f->cq, done, 64);
  if (n > 0)
    return (int)n;
  if (n == -FI_EAGAIN)
    return 0;
  if (n == -FI_EAVAIL) {
    struct fi_cq_err_entry err = {0};
    fi_cq_readerr(f->cq, &err, 0);
    fprintf(stderr, "fabric_rma: operation failed: %s (%s)\n", fi_strerror(err.err),
            fi_cq_strerror(f->cq, err.prov_errno, err.err_data, NULL, 0));
    exit(1);
  }
  die("fi_cq_read", (int)n);
  return 0;
}

/* Sleeps until the CQ or fd has something (fi_trywait first: the provider
 * may have work to progress before its fd is meaningful). Polls where the
 * provider has no wait fd. */
static void wait_cq(struct fab *f, int fd) {
  if (f->cq_fd < 0) {
    sched_yield();
    return;
  }
  struct fid *fids[] = {&f->cq->fid};
  if (fi_trywait(f->fabric, fids, 1) != 0)
    return;
  struct pollfd p[2] = {{.fd = f->cq_fd, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
  poll(p, fd >= 0 ? 2 : 1, 1000);
}

/* The passive side: progress, answer each byte from the initiator with
 * the CPU time used so far, stop when it closes its end. */
static void run_target(const struct opts *o, int sock) {
  struct fab f;
  open_fab(&f, o);
  struct target_facts tf = {.len = BUF_BYTES, .addrlen = ADDR_MAX};
  check("fi_getname", fi_getname(&f.ep->fid, tf.addr, &tf.addrlen));
  tf.key = fi_mr_key(f.mr);
  tf.base = uses_virt_addr(f.info) ? (uint64_t)(uintptr_t)f.buf : 0;
  if (write(sock, &tf, sizeof tf) != (ssize_t)sizeof tf)
    die("send facts", -errno);
  struct pollfd p = {.fd = sock, .events = POLLIN};
  for (;;) {
    reap(&f);
    if (poll(&p, 1, 0) == 1) {
      char c;
      if (read(sock, &c, 1) != 1)
        break;
      uint64_t cpu = cpu_ns();
      if (write(sock, &cpu, sizeof cpu) != (ssize_t)sizeof cpu)
        die("send cpu", -errno);
    }
    wait_cq(&f, sock);
  }
  close_fab(&f);
}

struct run {
  int sock; /* to the target */
  struct fab *f;
  fi_addr_t peer;
  struct target_facts *tf;
  size_t size, slots;
  int depth;
};

/* Posts one op into slot i, progressing the CQ while the provider says
 * -FI_EAGAIN (it does for the first operations, while it connects). */
static int post(struct run *r, int is_write, size_t i, int *inflight) {
  size_t off = (i % r->slots) * r->size;
  struct iovec iov = {.iov_base = r->f->buf + off, .iov_len = r->size};
  void *desc = fi_mr_desc(r->f->mr);
  struct fi_rma_iov rma = {.addr = r->tf->base + off, .len = r->size, .key = r->tf->key};
  struct fi_msg_rma msg = {.msg_iov = &iov,
                           .desc = &desc,
                           .iov_count = 1,
                           .addr = r->peer,
                           .rma_iov = &rma,
                           .rma_iov_count = 1};
  for (;;) {
    ssize_t rc = is_write ? fi_writemsg(r->f->ep, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION)
                          : fi_readmsg(r->f->ep, &msg, FI_COMPLETION);
    if (rc == 0)
      return 1;
    if (rc != -FI_EAGAIN)
      die(is_write ? "fi_writemsg" : "fi_readmsg", (int)rc);
    *inflight -= reap(r->f);
  }
}

/* Keeps depth ops in flight until `seconds` passed (at least one round);
 * returns the bytes moved. */
static uint64_t transfer(struct run *r, int is_write, double seconds) {
  uint64_t end = ferry_now_ns() + (uint64_t)(seconds * 1e9), moved = 0;
  size_t next = 0;
  int inflight = 0, stop = 0;
  while (!stop || inflight > 0) {
    while (!stop && inflight < r->depth) {
      post(r, is_write, next++, &inflight);
      inflight++;
      moved += r->size;
      if (next % r->slots == 0 && ferry_now_ns() >= end)
        stop = 1;
    }
    int n = reap(r->f);
    if (n == 0)
      wait_cq(r->f, -1);
    inflight -= n;
  }
  return moved;
}

static void fill(char *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i += sizeof seed) {
    uint32_t v = seed ^ (uint32_t)(i * 2654435761u);
    memcpy(p + i, &v, n - i < sizeof v ? n - i : sizeof v);
  }
}

/* Writes a pattern, reads it back over the slots into zeroed memory, and
 * compares: every run shows its bytes really landed in the target. */
static void verify(struct run *r, uint32_t seed) {
  size_t span = r->slots * r->size;
  fill(r->f->buf, span, seed);
  transfer(r, 1, 0);
  char *want = malloc(span);
  if (!want)
    die("malloc", -FI_ENOMEM);
  memcpy(want, r->f->buf, span);
  memset(r->f->buf, 0, span);
  transfer(r, 0, 0);
  if (memcmp(want, r->f->buf, span) != 0) {
    fprintf(stderr, "fabric_rma: verify failed at %zu bytes\n", r->size);
    exit(1);
  }
  free(want);
}

static uint64_t target_cpu_ns(struct run *r) {
  uint64_t cpu;
  if (write(r->sock, "c", 1) != 1 || read(r->sock, &cpu, sizeof cpu) != (ssize_t)sizeof cpu)
    die("target CPU time", -EPROTO);
  return cpu;
}

/* One timed run; a JSON line with its throughput and both sides' CPU. */
static void measure(const struct opts *o, struct run *r, int is_write) {
  uint64_t t0 = ferry_now_ns(), c0 = cpu_ns(), tc0 = target_cpu_ns(r);
  uint64_t bytes = transfer(r, is_write, o->seconds);
  uint64_t ns = ferry_now_ns() - t0, cpu = cpu_ns() - c0, tcpu = target_cpu_ns(r) - tc0;
  double gb = (double)bytes / 1e9;
  printf("{\"provider\": \"%s\", \"op\": \"%s\", \"size\": %zu, \"depth\": %d, \"wait\": "
         "\"%s\", \"mr\": \"%s\", \"gbps\": %.3f, \"cpu_s_per_gb\": %.3f, "
         "\"initiator_cpu_s_per_gb\": %.3f}\n",
         o->provider, is_write ? "write" : "read", r->size, o->depth, o->spin ? "spin" : "block",
         o->basic ? "basic" : "scalable", gb / ((double)ns / 1e9), (double)(cpu + tcpu) / 1e9 / gb,
         (double)cpu / 1e9 / gb);
  fflush(stdout);
}

static void run_initiator(const struct opts *o, int sock, size_t *sizes, int nsizes) {
  struct fab f;
  open_fab(&f, o);
  struct target_facts tf;
  if (read(sock, &tf, sizeof tf) != (ssize_t)sizeof tf)
    die("receive facts", -EPROTO);
  struct run r = {.sock = sock, .f = &f, .tf = &tf, .depth = o->depth};
  if (fi_av_insert(f.av, tf.addr, 1, &r.peer, 0, NULL) != 1)
    die("fi_av_insert", -FI_EADDRNOTAVAIL);
  for (int i = 0; i < nsizes; i++) {
    r.size = sizes[i];
    r.slots = BUF_BYTES / r.size < (size_t)o->depth ? BUF_BYTES / r.size : (size_t)o->depth;
    verify(&r, (uint32_t)i + 1); /* also warms the connection up */
    for (int is_write = 1; is_write >= 0; is_write--)
      if (o->ops & (is_write ? OP_WRITE : OP_READ))
        measure(o, &r, is_write);
    verify(&r, (uint32_t)i + 101);
  }
  close_fab(&f);
}

static void usage(void) {
  fprintf(stderr, "usage: fabric_rma [-p PROVIDER] [-n NODE] [-w block|spin] [-t SECONDS] "
                  "[-d DEPTH] [-o write|read] [--basic] SIZE...\n");
  exit(2);
}

int main(int argc, char **argv) {
  struct opts o = {.provider = "tcp;ofi_rxm", .depth = 16, .seconds = 2, .ops = OP_WRITE | OP_READ};
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--basic")) {
      o.basic = 1;
      continue;
    }
    if (!v)
      usage();
    if (!strcmp(a, "-p"))
      o.provider = v;
    else if (!strcmp(a, "-n"))
      o.node = v;
    else if (!strcmp(a, "-w") && (!strcmp(v, "spin") || !strcmp(v, "block")))
      o.spin = !strcmp(v, "spin");
    else if (!strcmp(a, "-t"))
      o.seconds = atof(v);
    else if (!strcmp(a, "-d") && atoi(v) > 0)
      o.depth = atoi(v);
    else if (!strcmp(a, "-o") && (!strcmp(v, "write") || !strcmp(v, "read")))
      o.ops = !strcmp(v, "write") ? OP_WRITE : OP_READ;
    else
      usage();
    i++;
  }
  int nsizes = argc - i;
  if (nsizes <= 0)
    usage();
  size_t *sizes = calloc((size_t)nsizes, sizeof *sizes);
  for (int k = 0; k < nsizes; k++)
    if ((sizes[k] = parse_size(argv[i + k])) == 0 || sizes[k] > BUF_BYTES)
      usage();

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
    die("socketpair", -errno);
  pid_t pid = fork();
  if (pid < 0)
    die("fork", -errno);
  if (pid == 0) {
    close(sv[0]);
    run_target(&o, sv[1]);
    _exit(0);
  }
  close(sv[1]);
  run_initiator(&o, sv[0], sizes, nsizes);
  free(sizes);
  close(sv[0]); /* the target's cue to stop */
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
