/* test_fabric_fence.c - unregistration as a fence on libfabric's IP
 * providers (tcp;ofi_rxm, net), two engines in this process. Those
 * providers check a key once per operation, so a target that unregisters
 * memory aborts every connection its endpoints accepted
 * (fabric_sockets.c), and initiators move the operations it cut again on a
 * fresh connection (fabric.c). Here a large WRITE into a region that stays
 * registered completes, verified byte for byte, while the target
 * unregisters other regions during it; the WRITE provably saw aborts (the
 * target's count). The fence itself (no byte lands in the unregistered
 * region) is test_transfer's unregister_waits_for_writes_in_flight, run as
 * test_transfer_fabric_tcp and _net. The same WRITEs go to a target on two
 * fabric rails, both cut by each unregister; and a target whose fabric
 * endpoint dies while its control connection stays up fails the WRITE
 * within connect_timeout_ms of the move, not at its deadline. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "ferry.h"
#include "harness.h"
#include "transport/fabric.h"

#define MiB (1024ull * 1024ull)
#ifdef __SANITIZE_THREAD__
#define WRITE_SIZE (8 * MiB)
#else
#define WRITE_SIZE (64 * MiB)
#endif
#define ROUNDS 4
#define ABORTS_PER_WRITE 2 /* within the initiator's bound of moves per chunk */
#define WAIT_S 60.0        /* a bound on waiting for the other thread, not a timing */

static void fabric_config(ferry_config *cfg, const char *provider) {
  ferry_config_init(cfg);
  cfg->bind_host = cfg->advertise_host = "127.0.0.1";
  cfg->transports = FERRY_TRANSPORT_FABRIC;
  cfg->fabric_provider = provider;
  /* A WRITE through aborts reconnects more than once: seconds each under a
   * sanitizer. Where a bound is the point, the case sets its own. */
  cfg->timeout_ms = cfg->connect_timeout_ms = TEST_SETUP_MS;
}

static ferry_engine *create(const ferry_config *cfg) {
  ferry_engine *e = NULL;
  if (ferry_engine_create(cfg, &e) != FERRY_OK)
    fail_msg("engine on %s: %s", cfg->fabric_provider, ferry_last_error());
  return e;
}

/* rails: NULL, or the target's rail_hosts. */
static ferry_engine *fabric_engine(const char *provider, const char *rails) {
  ferry_config cfg;
  fabric_config(&cfg, provider);
  cfg.rail_hosts = rails;
  return create(&cfg);
}

struct write_job {
  ferry_engine *engine;
  const char *target;
  const uint8_t *src;
  uint64_t remote;
  size_t size;
  ferry_status st;
  char error[512];
  int done;
};

static void *run_write(void *arg) {
  struct write_job *job = arg;
  job->st = ferry_transfer_sync(job->engine, job->target, FERRY_OP_WRITE, (void *)job->src,
                                job->remote, job->size);
  snprintf(job->error, sizeof job->error, "%s", ferry_last_error());
  __atomic_store_n(&job->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static int job_done(struct write_job *job) { return __atomic_load_n(&job->done, __ATOMIC_ACQUIRE); }

static uint64_t counter(uint64_t *c) { return __atomic_load_n(c, __ATOMIC_RELAXED); }

/* Until cond(arg) or the WRITE ended. */
static void wait_for(int (*cond)(void *), void *arg, struct write_job *job) {
  double until = test_now_s() + WAIT_S;
  while (!cond(arg) && !job_done(job) && test_now_s() < until)
    sched_yield();
}

struct landed {
  volatile const uint8_t *dst;
  uint8_t first;
};

static int first_landed(void *arg) {
  struct landed *l = arg;
  return l->dst[0] == l->first;
}

struct moved {
  uint64_t *reposts;
  uint64_t before;
};

static int moved_again(void *arg) {
  struct moved *m = arg;
  return counter(m->reposts) > m->before;
}

/* Registers and unregisters a region of its own on target a: 1 when the
 * unregister aborted a connection before the WRITE ended. */
static int unregister_other(ferry_engine *a, struct write_job *job) {
  uint64_t before = counter(&a->fabric->aborts);
  void *other = test_buffer(a, 4096);
  assert_int_equal(ferry_memory_unregister(a, other), FERRY_OK);
  free(other);
  return counter(&a->fabric->aborts) > before && !job_done(job);
}

/* Starts b's WRITE of src (WRITE_SIZE, src[0] not 0) into a's dst on a
 * thread, and waits until its first byte landed (or it ended). */
static void start_write(struct write_job *job, pthread_t *thread, ferry_engine *a, ferry_engine *b,
                        uint8_t *dst, const uint8_t *src) {
  memset(dst, 0, WRITE_SIZE);
  *job = (struct write_job){.engine = b,
                            .target = ferry_engine_name(a),
                            .src = src,
                            .remote = (uint64_t)(uintptr_t)dst,
                            .size = WRITE_SIZE};
  assert_int_equal(pthread_create(thread, NULL, run_write, job), 0);
  struct landed landed = {dst, src[0]};
  wait_for(first_landed, &landed, job);
}

/* One WRITE of WRITE_SIZE: once its first byte landed, the target
 * unregisters another region; once the initiator moved the cut
 * operations again, once more. Returns the aborts made during it. */
static unsigned write_through_aborts(ferry_engine *a, ferry_engine *b, uint8_t *dst,
                                     const uint8_t *src) {
  struct write_job job;
  pthread_t thread;
  start_write(&job, &thread, a, b, dst, src);
  unsigned aborts = 0;
  for (int k = 0; k < ABORTS_PER_WRITE && !job_done(&job); k++) {
    struct moved moved = {&b->fabric->reposts, counter(&b->fabric->reposts)};
    aborts += (unsigned)unregister_other(a, &job);
    wait_for(moved_again, &moved, &job);
  }
  pthread_join(thread, NULL);
  if (job.st)
    fail_msg("the WRITE failed after %u aborts: %s", aborts, job.error);
  if (memcmp(dst, src, WRITE_SIZE) != 0)
    fail_msg("the WRITE succeeded after %u aborts but its bytes differ", aborts);
  return aborts;
}

static void others_unregister_during_a_write(const char *provider, const char *rails) {
  ferry_engine *a = fabric_engine(provider, rails), *b = fabric_engine(provider, NULL);
  uint8_t *dst = test_buffer(a, WRITE_SIZE), *src = test_buffer(b, WRITE_SIZE);
  unsigned aborts = 0;
  for (int round = 0; round < ROUNDS; round++) {
    test_fill_random(src, WRITE_SIZE, (uint64_t)round + 1);
    src[0] |= 1; /* never 0: its landing is seen */
    aborts += write_through_aborts(a, b, dst, src);
  }
  print_message("%s%s%s: %d WRITEs of %llu MiB verified through %u aborts; %llu operations moved "
                "again\n",
                provider, rails ? ", rails " : "", rails ? rails : "", ROUNDS,
                (unsigned long long)(WRITE_SIZE / MiB), aborts,
                (unsigned long long)counter(&b->fabric->reposts));
  assert_true(aborts > 0);
  ferry_engine_destroy(b);
  ferry_engine_destroy(a);
  free(dst);
  free(src);
}

static void others_unregister_during_a_write_tcp(void **state) {
  others_unregister_during_a_write("tcp;ofi_rxm", NULL);
}

static void others_unregister_during_a_write_net(void **state) {
  others_unregister_during_a_write("net", NULL);
}

/* Every rail's connections are cut at once, so no rail is left to move a
 * cut chunk to: it moves again on a fresh connection all the same. */
static void others_unregister_during_a_striped_write_tcp(void **state) {
  others_unregister_during_a_write("tcp;ofi_rxm", "127.0.0.1,127.0.0.2");
}

/* The port of a's main fabric endpoint. */
static uint16_t endpoint_port(ferry_engine *a) {
  uint8_t desc[FERRY_WIRE_MAX_DESCRIPTOR];
  size_t len = ferry_fabric_describe(a, desc, sizeof desc);
  ferry_fabric_descriptor d;
  char why[160];
  assert_int_equal(ferry_fabric_descriptor_decode(desc, len, &d, why, sizeof why), 1);
  struct sockaddr_storage ss;
  assert_true(ferry_fabric_ip_endpoint(d.addr, d.addr_len, &ss) == sizeof(struct sockaddr_in));
  return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* Shuts every socket of this process bound to 127.0.0.1:port, as a dead
 * endpoint would leave them: its listener and the connections it accepted.
 * Returns how many. */
static int cut_port(uint16_t port) {
  int cut = 0;
  for (int fd = 3; fd < 4096; fd++) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) == 0 && a.sin_family == AF_INET &&
        a.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && a.sin_port == htons(port) &&
        shutdown(fd, SHUT_RDWR) == 0)
      cut++;
  }
  return cut;
}

/* The target's fabric endpoint dies (its listener and connections shut)
 * during a WRITE while its control connection stays up: the initiator
 * posts the cut operations again on a fresh endpoint, which cannot
 * connect, so the call fails as on a lost link once connect_timeout_ms
 * (1 s here) passed without a completion, not at its deadline (60 s). A
 * WRITE that ended before the cut (also one that completed while the
 * sockets were being cut: it succeeds) is tried again with fresh engines,
 * five times at most. */
static void fresh_endpoint_that_cannot_connect_fails_tcp(void **state) {
  int cut = 0;
  for (int attempt = 0; attempt < 5 && !cut; attempt++) {
    ferry_config cfg;
    fabric_config(&cfg, "tcp;ofi_rxm");
    cfg.fabric_lanes = 1; /* one endpoint to cut */
    ferry_engine *a = create(&cfg);
    fabric_config(&cfg, "tcp;ofi_rxm");
    cfg.connect_timeout_ms = 1000;
    cfg.timeout_ms = 60000;
    ferry_engine *b = create(&cfg);
    uint8_t *dst = test_buffer(a, WRITE_SIZE), *src = test_buffer(b, WRITE_SIZE);
    test_fill_random(src, WRITE_SIZE, (uint64_t)attempt + 1);
    src[0] |= 1;
    struct write_job job;
    pthread_t thread;
    start_write(&job, &thread, a, b, dst, src);
    double cut_at = test_now_s();
    cut = job_done(&job) ? 0 : cut_port(endpoint_port(a));
    pthread_join(thread, NULL);
    double took = test_now_s() - cut_at;
    print_message("attempt %d: cut %d sockets; the WRITE ended %.2f s later: %s\n", attempt, cut,
                  took, job.st ? job.error : "success");
    if (cut && job.st == FERRY_OK)
      cut = 0; /* it completed between job_done() and the cut: again (a cut WRITE cannot) */
    if (cut) {
      assert_int_equal(job.st, FERRY_ESOCKET);
      assert_non_null(strstr(job.error, "fresh endpoint completed nothing in 1000 ms"));
      assert_true(took < 30.0); /* the deadline is 60 s away */
    }
    ferry_engine_destroy(b);
    ferry_engine_destroy(a);
    free(dst);
    free(src);
  }
  assert_true(cut);
}

int main(void) {
  const char *filter = getenv("FERRY_TEST_FILTER"); /* one case, by name (a glob) */
  if (filter && *filter)
    cmocka_set_test_filter(filter);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(others_unregister_during_a_write_tcp),
      cmocka_unit_test(others_unregister_during_a_write_net),
      cmocka_unit_test(others_unregister_during_a_striped_write_tcp),
      cmocka_unit_test(fresh_endpoint_that_cannot_connect_fails_tcp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
