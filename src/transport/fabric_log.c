/* fabric_log.c - what a target hears of the remote operations libfabric
 * refused for their key. On the software providers (tcp;ofi_rxm, net,
 * shm) the target's own progress call checks each RMA's key, access and
 * range (ofi_mr_map_verify in 1.17) and, when one fails, only writes a
 * warning to libfabric's log; tcp and net then drop the connection, shm
 * the operation. Nothing reaches a CQ, so ferry could not see a peer
 * guessing keys. While any fabric service runs, the process imports
 * libfabric's logging (fi_import_log, API 1.13 and later): those warnings
 * become one rate-limited WARN line in ferry's log, and every other line
 * goes where libfabric would have sent it (its own filter, FI_LOG_LEVEL,
 * and stderr). The import is process-wide: the first engine takes it, the
 * last gives it back. An application that imported libfabric's log itself
 * keeps it, and ferry goes without (one INFO line). NICs (verbs, efa)
 * check keys in hardware and tell the target's software nothing. */
#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "transport/fabric.h"

#define REFUSED_LINE_INTERVAL_NS (10ull * 1000000000ull) /* at most one line per 10 s */
#define VERIFY_FUNC "ofi_mr_map_verify"                  /* libfabric 1.17's key check */

static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned holders;
static int imported;
static struct fi_ops_log original; /* libfabric's own: set once, before the first import */
static struct fi_ops_log ours;
static struct fid_logging import = {.ops = &ours};

/* The target whose progress call this thread makes; refusals on other
 * threads count process-wide. */
static __thread ferry_fabric *serving;
static ferry_fabric_refusals elsewhere;

void ferry_fabric_log_serving(ferry_fabric *f) { serving = f; }

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int is_refusal(enum fi_log_level level, enum fi_log_subsys subsys) {
  return level == FI_LOG_WARN && subsys == FI_LOG_MR;
}

int ferry_fabric_refusal_count(ferry_fabric_refusals *r, char *since, size_t size) {
  uint64_t count = __atomic_add_fetch(&r->count, 1, __ATOMIC_RELAXED), now = now_ns();
  uint64_t last = __atomic_load_n(&r->line_ns, __ATOMIC_RELAXED);
  if (last && (now < last || now - last < REFUSED_LINE_INTERVAL_NS))
    return 0;
  if (!__atomic_compare_exchange_n(&r->line_ns, &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    return 0; /* another thread writes this line */
  uint64_t before = __atomic_exchange_n(&r->count_at_line, count, __ATOMIC_RELAXED);
  if (last)
    snprintf(since, size, "%llu more since the last such line",
             (unsigned long long)(count > before ? count - before - 1 : 0));
  else
    snprintf(since, size, "later ones are counted, in a line every 10 s at most");
  return 1;
}

static void refused(ferry_fabric_refusals *r, const char *provider, const char *msg) {
  char since[96];
  if (ferry_fabric_refusal_count(r, since, sizeof since))
    FERRY_WARN("fabric: provider %s refused a remote operation (%.*s): a peer that was never "
               "given this key (guessing) or one whose region table went stale at an "
               "unregister; %s",
               provider, (int)strcspn(msg, "\n"), msg, since);
}

static int log_enabled(const struct fi_provider *prov, enum fi_log_level level,
                       enum fi_log_subsys subsys, uint64_t flags) {
  return is_refusal(level, subsys) || original.enabled(prov, level, subsys, flags);
}

static void log_line(const struct fi_provider *prov, enum fi_log_level level,
                     enum fi_log_subsys subsys, const char *func, int line, const char *msg) {
  if (is_refusal(level, subsys) && func && !strcmp(func, VERIFY_FUNC))
    refused(serving ? &serving->refusals : &elsewhere, prov->name, msg);
  if (original.enabled(prov, level, subsys, 0))
    original.log(prov, level, subsys, func, line, msg);
}

/* Opens libfabric's logging, keeps its own operations (the first time)
 * and puts ours in their place. 0 or a libfabric error. */
static int import_log(void) {
  struct fid *opened;
  int rc = ferry_fi.open(FERRY_FABRIC_API(0), "logging", NULL, 0, 0, &opened, NULL);
  if (rc)
    return rc;
  if (!original.log)
    original = *((struct fid_logging *)opened)->ops;
  ours = (struct fi_ops_log){.size = sizeof ours, .enabled = log_enabled, .log = log_line};
  import.fid.fclass = FI_CLASS_LOG;
  rc = fi_import_fid(opened, &import.fid, 0);
  fi_close(opened);
  return rc;
}

void ferry_fabric_log_hold(void) {
  pthread_mutex_lock(&hold_lock);
  if (holders++ == 0) {
    int rc = import_log();
    imported = rc == 0;
    if (rc)
      FERRY_INFO("fabric: libfabric's log is not ferry's (%s): remote operations it refuses for "
                 "their key are not logged by ferry",
                 ferry_fi.strerror(-rc));
  }
  pthread_mutex_unlock(&hold_lock);
}

void ferry_fabric_log_release(void) {
  pthread_mutex_lock(&hold_lock);
  if (--holders == 0 && imported) {
    fi_close(&import.fid); /* libfabric's own operations again */
    imported = 0;
  }
  pthread_mutex_unlock(&hold_lock);
}
