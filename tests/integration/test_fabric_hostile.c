/* test_fabric_hostile.c - the fabric endpoint of a target with a shared
 * secret, attacked by a peer that never proved it: a plain libfabric client
 * (no HELLO, no AUTH, so no region table) that found the endpoint's address
 * (from the descriptor here; on a network, by listing the target's
 * listening ports, as the first case does).
 *
 * Messages: ferry sends none over fabric, but rxm queued every message
 * nobody received, without bound; the target's sinks drop them
 * (fabric_sink.c), so a flood of them leaves the target's memory as it was
 * and the target still serves an honest peer.
 *
 * Keys: they are random 64-bit numbers (RELIABILITY.md 16), so neither the
 * counter values of before (1, 2, 3: a region, a receive pool, a region)
 * nor any other small guess READs or WRITEs a registered byte where the
 * right key would; the target counts and logs what it refused, and
 * messages too. The same client holding a real key (which only
 * a peer that proved the secret learns) reaches the memory: what stopped it
 * was the key, not the client. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "core/engine.h"
#include "ferry.h"
#include "harness.h"
#include "transport/fabric.h"

#define SECRET "the hostile peer does not know this"
#define MiB (1024u * 1024u)
#define REGION_SIZE (64u * 1024u)
#define REGIONS 3         /* two plain regions and a receive pool's */
#define GUESSES 32        /* keys 0..31: the old counter's values and more */
#define PROBE_SIZE 256    /* bytes each guessed READ or WRITE moves */
#define MESSAGE_SIZE 4096 /* below rxm's eager limit: queued whole when unmatched */
/* A flood's messages fit a sink's receive (rxm ends the connection of a
 * truncated one): the connection stays, the flood goes fast. rxm queued
 * each unmatched one in a receive buffer of its own all the same. */
#define FLOOD_MESSAGE_SIZE FERRY_FABRIC_SINK_BYTES
#define WAIT_S 20.0     /* a bound on one operation's answer, not a timing */
#define SEND_WAIT_S 2.0 /* a send unanswered this long: the client moves on */
#define FLOOD_MESSAGES 60000
#define FLOOD_S 60.0 /* a bound on the flood, not a timing */
/* Target growth allowed under the flood, after a warm-up: rxm's pools
 * still grow once under a burst (3 MB for these 60000 messages, at most
 * 29 MB seen over 10^6, flat after), but queued messages kept 3-17 KB
 * each. */
#define FLOOD_GROWTH_MAX_KIB (64u * 1024u)

/* The attacker: a domain of its own with a local buffer, and per attempt
 * an RDM endpoint (with its CQ and AV) aimed at the target's endpoint. */
typedef struct raw_client {
  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_mr *mr;
  struct fid_av *av;
  struct fid_cq *cq;
  struct fid_ep *ep;
  fi_addr_t target;
  uint8_t buf[MESSAGE_SIZE];
} raw_client;

static void check(const char *what, int rc) {
  if (rc)
    fail_msg("raw client: %s: %s", what, fi_strerror(-rc));
}

static void raw_open(raw_client *c, const char *provider) {
  memset(c, 0, sizeof *c);
  struct fi_info *hints = ferry_fabric_hints(provider, 0);
  assert_non_null(hints);
  hints->caps |= FI_MSG | FI_TAGGED;
  check("fi_getinfo",
        fi_getinfo(FERRY_FABRIC_API(0), "127.0.0.1", NULL, FI_SOURCE, hints, &c->info));
  fi_freeinfo(hints);
  check("fi_fabric", fi_fabric(c->info->fabric_attr, &c->fabric, NULL));
  check("fi_domain", fi_domain(c->fabric, c->info, &c->domain, NULL));
  check("fi_mr_reg", fi_mr_reg(c->domain, c->buf, sizeof c->buf, FI_READ | FI_WRITE | FI_SEND, 0, 0,
                               0, &c->mr, NULL));
}

static void raw_close(raw_client *c) {
  struct fid *fids[] = {&c->mr->fid, &c->domain->fid, &c->fabric->fid};
  for (size_t i = 0; i < sizeof fids / sizeof *fids; i++)
    fi_close(fids[i]);
  fi_freeinfo(c->info);
}

/* A fresh endpoint aimed at the one named addr (fi_getname's form: a
 * sockaddr on the IP providers), so a fresh connection. */
static void raw_connect(raw_client *c, const void *addr) {
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 64};
  check("fi_av_open", fi_av_open(c->domain, &av_attr, &c->av, NULL));
  check("fi_cq_open", fi_cq_open(c->domain, &cq_attr, &c->cq, NULL));
  check("fi_endpoint", fi_endpoint(c->domain, c->info, &c->ep, NULL));
  check("fi_ep_bind(av)", fi_ep_bind(c->ep, &c->av->fid, 0));
  check("fi_ep_bind(cq)", fi_ep_bind(c->ep, &c->cq->fid, FI_TRANSMIT | FI_RECV));
  check("fi_enable", fi_enable(c->ep));
  assert_int_equal(fi_av_insert(c->av, addr, 1, &c->target, 0, NULL), 1);
}

static void raw_disconnect(raw_client *c) {
  struct fid *fids[] = {&c->ep->fid, &c->cq->fid, &c->av->fid};
  for (size_t i = 0; i < sizeof fids / sizeof *fids; i++)
    fi_close(fids[i]);
}

/* Posts with post() until the provider takes it, then waits for its
 * completion: 1 success, 0 failure, -1 nothing within wait_s (or never
 * posted). */
static int raw_complete(raw_client *c, ssize_t (*post)(raw_client *c, const void *arg),
                        const void *arg, double wait_s) {
  double deadline = test_now_s() + wait_s;
  ssize_t rc;
  while ((rc = post(c, arg)) == -FI_EAGAIN && test_now_s() < deadline)
    fi_cq_read(c->cq, NULL, 0); /* progress: the connection is being made */
  if (rc)
    return -1;
  for (;;) {
    struct fi_cq_entry done;
    ssize_t n = fi_cq_read(c->cq, &done, 1);
    if (n == 1)
      return 1;
    struct fi_cq_err_entry err = {0};
    if (n == -FI_EAVAIL && fi_cq_readerr(c->cq, &err, 0) == 1)
      return 0;
    if (test_now_s() >= deadline)
      return -1;
  }
}

typedef struct rma_op {
  int write;
  uint64_t addr, key;
} rma_op;

static ssize_t post_rma(raw_client *c, const void *arg) {
  const rma_op *op = arg;
  void *desc = fi_mr_desc(c->mr);
  struct iovec iov = {c->buf, PROBE_SIZE};
  struct fi_rma_iov rma = {op->addr, PROBE_SIZE, op->key};
  struct fi_msg_rma msg = {.msg_iov = &iov,
                           .desc = &desc,
                           .iov_count = 1,
                           .addr = c->target,
                           .rma_iov = &rma,
                           .rma_iov_count = 1,
                           .context = c};
  /* a WRITE completes once landed (net would complete it once sent) */
  return op->write ? fi_writemsg(c->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE)
                   : fi_readmsg(c->ep, &msg, FI_COMPLETION);
}

/* A READ or WRITE of PROBE_SIZE bytes at (addr, key): 1 when it
 * completed, 0 when it failed; no answer within WAIT_S fails the test. */
static int raw_rma(raw_client *c, int write, uint64_t addr, uint64_t key) {
  rma_op op = {write, addr, key};
  int done = raw_complete(c, post_rma, &op, WAIT_S);
  if (done < 0)
    fail_msg("raw client: a %s with key %llu at 0x%llx had no answer in %.0f s",
             write ? "WRITE" : "READ", (unsigned long long)key, (unsigned long long)addr, WAIT_S);
  return done;
}

typedef struct message {
  int tagged;
  size_t size;
} message;

static ssize_t post_message(raw_client *c, const void *arg) {
  const message *m = arg;
  void *desc = fi_mr_desc(c->mr);
  return m->tagged ? fi_tsend(c->ep, c->buf, m->size, desc, c->target, 0x7a6, c)
                   : fi_send(c->ep, c->buf, m->size, desc, c->target, c);
}

/* Sends messages of size bytes, alternately tagged, until one is not
 * answered well (the target may drop the connection), at most limit; how
 * many completed. */
static unsigned raw_messages(raw_client *c, size_t size, unsigned limit) {
  unsigned sent = 0;
  message m = {0, size};
  while (sent < limit && raw_complete(c, post_message, &m, SEND_WAIT_S) == 1) {
    sent++;
    m.tagged = !m.tagged;
  }
  return sent;
}

/* ---- a flood of messages -------------------------------------------------------------- */

static long rss_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
      break;
  if (f)
    fclose(f);
  return kib;
}

/* Whether the socket with this inode is one of pid's descriptors. */
static int owns_socket(pid_t pid, unsigned long inode) {
  char path[64], link[64], want[48];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  snprintf(want, sizeof want, "socket:[%lu]", inode);
  DIR *dir = opendir(path);
  int found = 0;
  for (struct dirent *e; dir && !found && (e = readdir(dir)) != NULL;) {
    char fd_path[320];
    snprintf(fd_path, sizeof fd_path, "%s/%s", path, e->d_name);
    ssize_t n = readlink(fd_path, link, sizeof link - 1);
    found = n > 0 && (link[n] = '\0', !strcmp(link, want));
  }
  if (dir)
    closedir(dir);
  return found;
}

/* What an attacker on the network sees: the port pid listens on besides
 * its control port (one lane: one endpoint). 0 when there is none. */
static uint16_t fabric_port(pid_t pid, uint16_t control) {
  FILE *f = fopen("/proc/net/tcp", "r");
  char line[512];
  uint16_t found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    unsigned local_ip, port, state;
    unsigned long inode;
    if (sscanf(line, " %*d: %x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &local_ip, &port,
               &state, &inode) == 4 &&
        state == 0x0A /* LISTEN */ && port != control && owns_socket(pid, inode))
      found = (uint16_t)port;
  }
  if (f)
    fclose(f);
  return found;
}

/* An unauthenticated client floods the target's fabric endpoint with
 * FLOOD_MESSAGES messages, on a fresh endpoint whenever the target drops
 * one: the target (its own process, on
 * tcp;ofi_rxm, one lane) keeps its memory, and an engine with the secret
 * then moves bytes to it as before. The only test process fork is this
 * one's target, before any thread. */
static void messages_do_not_pile_up_tcp(void **state) {
  (void)state;
  setenv("FERRY_TRANSPORTS", "fabric", 1);
  setenv("FERRY_FABRIC_PROVIDER", "tcp;ofi_rxm", 1);
  setenv("FERRY_FABRIC_LANES", "1", 1);
  test_target t;
  const char *const extra[] = {"--secret", SECRET, NULL};
  assert_int_equal(test_target_start(&t, 0, MiB, extra), 0);
  uint16_t port = fabric_port(t.pid, t.port);
  assert_int_not_equal(port, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

  raw_client c;
  raw_open(&c, "tcp;ofi_rxm");
  raw_connect(&c, &addr); /* rxm's pools fill before the baseline */
  raw_messages(&c, FLOOD_MESSAGE_SIZE, 16);
  raw_disconnect(&c);
  long before = rss_kib(t.pid);
  unsigned sent = 0, endpoints = 0;
  double end = test_now_s() + FLOOD_S;
  while (sent < FLOOD_MESSAGES && test_now_s() < end) {
    raw_connect(&c, &addr);
    sent += raw_messages(&c, FLOOD_MESSAGE_SIZE, FLOOD_MESSAGES - sent);
    raw_disconnect(&c);
    endpoints++;
  }
  raw_close(&c);
  long after = rss_kib(t.pid);
  print_message("%u messages of %u bytes completed on %u endpoints; the target's memory went "
                "from %ld to %ld KiB\n",
                sent, FLOOD_MESSAGE_SIZE, endpoints, before, after);
  assert_true(before > 0 && after > 0);
  assert_int_equal(sent, FLOOD_MESSAGES);
  assert_true(after - before < (long)FLOOD_GROWTH_MAX_KIB);

  ferry_engine *honest = test_engine(SECRET); /* on fabric alone (FERRY_TRANSPORTS) */
  assert_non_null(honest);
  uint8_t *out = test_buffer(honest, MiB), *in = test_buffer(honest, MiB);
  test_round_trip(honest, t.target, out, in, t.addr, MiB, 7);
  ferry_engine_destroy(honest);
  free(out);
  free(in);
  unsetenv("FERRY_TRANSPORTS");
  unsetenv("FERRY_FABRIC_PROVIDER");
  unsetenv("FERRY_FABRIC_LANES");
  assert_int_equal(test_target_stop(&t), 0);
}

/* ---- guessed keys ----------------------------------------------------------------------- */

/* The target: a secret, fabric alone on provider, its memory registered;
 * the WARN lines it writes about refused keys and dropped messages. */
typedef struct target {
  ferry_engine *engine;
  uint8_t *memory[REGIONS];
  uint8_t *copy[REGIONS]; /* what each region must still hold */
  ferry_pool *pool;
  pthread_mutex_t lock;
  int key_lines, message_lines; /* under lock */
  char key_line[512];
} target;

static void count_lines(const ferry_log_record *r, void *arg) {
  target *t = arg;
  if (r->level != FERRY_LOG_WARN)
    return;
  pthread_mutex_lock(&t->lock);
  if (strstr(r->message, "refused a remote operation (unknown key") && !t->key_lines++)
    snprintf(t->key_line, sizeof t->key_line, "%s", r->line);
  if (strstr(r->message, "message to this target's endpoint"))
    t->message_lines++;
  pthread_mutex_unlock(&t->lock);
}

static int message_logged(target *t) {
  pthread_mutex_lock(&t->lock);
  int logged = t->message_lines > 0;
  pthread_mutex_unlock(&t->lock);
  return logged;
}

static void target_start(target *t, const char *provider) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->lock, NULL);
  ferry_config cfg;
  test_config(&cfg);
  cfg.transports = FERRY_TRANSPORT_FABRIC;
  cfg.fabric_provider = provider;
  cfg.secret = SECRET;
  if (ferry_engine_create(&cfg, &t->engine) != FERRY_OK)
    fail_msg("target on %s: %s", provider, ferry_last_error());
  for (int i = 0; i < REGIONS; i++) {
    t->memory[i] = malloc(REGION_SIZE);
    t->copy[i] = malloc(REGION_SIZE);
    test_fill_random(t->memory[i], REGION_SIZE, 100u + (uint64_t)i);
    memcpy(t->copy[i], t->memory[i], REGION_SIZE);
  }
  /* Registered in this order, the counter of before gave them keys 1, 2, 3. */
  assert_int_equal(ferry_memory_register(t->engine, t->memory[0], REGION_SIZE), FERRY_OK);
  assert_int_equal(ferry_pool_create(t->engine, "inbox", t->memory[1], REGION_SIZE, &t->pool),
                   FERRY_OK);
  assert_int_equal(ferry_memory_register(t->engine, t->memory[2], REGION_SIZE), FERRY_OK);
  ferry_log_set_handler(count_lines, t);
}

static void target_stop(target *t) {
  ferry_log_set_handler(NULL, NULL);
  ferry_pool_destroy(t->engine, t->pool);
  ferry_engine_destroy(t->engine);
  for (int i = 0; i < REGIONS; i++) {
    free(t->memory[i]);
    free(t->copy[i]);
  }
  pthread_mutex_destroy(&t->lock);
}

static uint64_t region_key(target *t, int i) {
  ferry_region r = {(uint64_t)(uintptr_t)t->memory[i], REGION_SIZE};
  uint8_t bytes[FERRY_FABRIC_KEY_SIZE];
  ferry_fabric_region_keys(t->engine, &r, 1, bytes);
  uint64_t key = 0;
  for (int b = 0; b < FERRY_FABRIC_KEY_SIZE; b++)
    key |= (uint64_t)bytes[b] << (8 * b);
  return key;
}

/* One guess, on a fresh endpoint as an attacker would make it: a refused
 * key ends the connection, and rxm then fails every later operation of
 * that endpoint at once ("Transport endpoint is not connected") without
 * reaching the target. 1 when the READ or WRITE completed. */
static int guess(raw_client *c, const ferry_fabric_descriptor *d, int write, uint64_t addr,
                 uint64_t key) {
  raw_connect(c, d->addr);
  memset(c->buf, write ? 0x5A : 0xEE, PROBE_SIZE);
  int done = raw_rma(c, write, addr, key);
  raw_disconnect(c);
  return done;
}

/* Every guess, READ and WRITE, fails where the right key would reach a
 * region: offset 0 where the provider takes offsets (tcp, net: the key
 * alone picks the region), else each region's address. The READs brought
 * no registered byte, no region changed. Returns how many were tried. */
static unsigned guess_keys(target *t, raw_client *c, const ferry_fabric_descriptor *d,
                           const uint64_t *keys, size_t count) {
  uint64_t addrs[REGIONS] = {0};
  size_t places = d->virt_addr ? REGIONS : 1;
  for (size_t i = 0; d->virt_addr && i < REGIONS; i++)
    addrs[i] = (uint64_t)(uintptr_t)t->memory[i];
  unsigned tried = 0;
  for (size_t k = 0; k < count; k++)
    for (size_t a = 0; a < places; a++, tried += 2) {
      if (guess(c, d, 0, addrs[a], keys[k]))
        fail_msg("a READ with guessed key %llu at 0x%llx completed", (unsigned long long)keys[k],
                 (unsigned long long)addrs[a]);
      for (int i = 0; i < REGIONS; i++)
        if (!memcmp(c->buf, t->copy[i], PROBE_SIZE))
          fail_msg("a failed READ with guessed key %llu brought region %d's bytes",
                   (unsigned long long)keys[k], i);
      if (guess(c, d, 1, addrs[a], keys[k]))
        fail_msg("a WRITE with guessed key %llu at 0x%llx completed", (unsigned long long)keys[k],
                 (unsigned long long)addrs[a]);
    }
  for (int i = 0; i < REGIONS; i++)
    if (memcmp(t->memory[i], t->copy[i], REGION_SIZE))
      fail_msg("region %d changed under guessed keys", i);
  print_message("%u guessed READs and WRITEs failed, each on a fresh endpoint; every region "
                "unchanged\n",
                tried);
  return tried;
}

static void guessed_keys_reach_nothing(const char *provider) {
  target t;
  target_start(&t, provider);
  uint8_t desc[FERRY_WIRE_MAX_DESCRIPTOR];
  size_t len = ferry_fabric_describe(t.engine, desc, sizeof desc);
  ferry_fabric_descriptor d;
  char why[160];
  assert_int_equal(ferry_fabric_descriptor_decode(desc, len, &d, why, sizeof why), 1);

  uint64_t keys[GUESSES + 3];
  for (int k = 0; k < GUESSES; k++)
    keys[k] = (uint64_t)k;
  keys[GUESSES] = UINT64_MAX;
  keys[GUESSES + 1] = 1ull << 32;
  keys[GUESSES + 2] = region_key(&t, 0) ^ 1; /* one bit from a real key */
  raw_client c;
  raw_open(&c, provider);
  unsigned tried = guess_keys(&t, &c, &d, keys, sizeof keys / sizeof *keys);
  for (int i = 0; i < REGIONS; i++)
    print_message("region %d: key 0x%016llx\n", i, (unsigned long long)region_key(&t, i));

  /* Messages too: dropped by the sinks, counted. */
  raw_connect(&c, d.addr);
  unsigned sent = raw_messages(&c, MESSAGE_SIZE, 8);
  raw_disconnect(&c);

  /* The target counted each refused guess (its key check runs before it
   * answers) and, once its lane got to them, the messages; the first of
   * each kind made a WARN line at once (just after it was counted). */
  ferry_fabric *f = t.engine->fabric;
  uint64_t refused = __atomic_load_n(&f->refusals.count, __ATOMIC_RELAXED), dropped = 0;
  for (double end = test_now_s() + WAIT_S; !message_logged(&t) && test_now_s() < end;)
    sched_yield();
  dropped = __atomic_load_n(&f->messages.count, __ATOMIC_RELAXED);
  pthread_mutex_lock(&t.lock);
  print_message("the target counted %llu refused operations and %llu dropped messages (%u "
                "completed), and logged %d and %d lines; the first: %s\n",
                (unsigned long long)refused, (unsigned long long)dropped, sent, t.key_lines,
                t.message_lines, t.key_line);
  assert_true(t.key_lines >= 1 && t.message_lines >= 1);
  pthread_mutex_unlock(&t.lock);
  assert_true(refused >= tried);
  assert_true(dropped >= 1);

  /* The control: the same client with region 0's real key reads its
   * bytes and writes it. */
  uint64_t addr = d.virt_addr ? (uint64_t)(uintptr_t)t.memory[0] : 0;
  assert_int_equal(guess(&c, &d, 0, addr, region_key(&t, 0)), 1);
  assert_memory_equal(c.buf, t.copy[0], PROBE_SIZE);
  assert_int_equal(guess(&c, &d, 1, addr, region_key(&t, 0)), 1);
  assert_memory_equal(t.memory[0], c.buf, PROBE_SIZE);
  raw_close(&c);
  target_stop(&t);
}

static void guessed_keys_reach_nothing_tcp(void **state) {
  (void)state;
  guessed_keys_reach_nothing("tcp;ofi_rxm");
}

static void guessed_keys_reach_nothing_net(void **state) {
  (void)state;
  guessed_keys_reach_nothing("net");
}

int main(void) {
  const char *filter = getenv("FERRY_TEST_FILTER"); /* one case, by name (a glob) */
  if (filter && *filter)
    cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(messages_do_not_pile_up_tcp), /* first: it forks */
      cmocka_unit_test(guessed_keys_reach_nothing_tcp),
      cmocka_unit_test(guessed_keys_reach_nothing_net),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
