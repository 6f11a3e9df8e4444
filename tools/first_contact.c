/* first_contact.c - `ferry bench --metadata URL --target SEGMENT
 * --first-contact N`: what a metadata store costs an engine. Each of N
 * rounds creates an engine on the store (which publishes its own segment),
 * times it up to the end of its first 4 KiB WRITE to SEGMENT (lookup,
 * handshake, transfer), then times raw store lookups of SEGMENT (one round
 * trip each) and WRITEs to the now-known peer (no store involved), and
 * destroys the engine. Prints medians with min and max. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "cli.h"
#include "commands.h"
#include "metadata/metadata.h"

#define PROG "ferry bench"
#define BLOCK 4096
#define SAMPLES 50 /* lookups and known-peer WRITEs per round */

typedef struct samples {
  uint64_t *ns;
  size_t n;
} samples;

static int cmp_ns(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void print_stat(const char *name, samples *s, double unit_ns, const char *unit, int json,
                       int last) {
  qsort(s->ns, s->n, sizeof *s->ns, cmp_ns);
  double med = s->ns[s->n / 2] / unit_ns, lo = s->ns[0] / unit_ns, hi = s->ns[s->n - 1] / unit_ns;
  if (json)
    printf("\"%s_%s\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f}%s", name, unit, med, lo, hi,
           last ? "" : ", ");
  else
    printf("%-22s median %9.3f %s  (min %.3f, max %.3f, %zu samples)\n", name, med, unit, lo, hi,
           s->n);
}

/* One round; appends to the three sample sets. */
static ferry_status round_trip(const ferry_cli_engine_opts *opts, const char *target,
                               uint64_t remote, ferry_metadata *md, samples *first, samples *lookup,
                               samples *known) {
  uint64_t t0 = ferry_now_ns();
  ferry_engine *e = NULL;
  void *buf = NULL;
  ferry_status st = ferry_cli_engine_create(PROG, opts, &e);
  if (!st)
    st = ferry_memory_alloc(e, BLOCK, &buf);
  if (!st)
    st = ferry_transfer_sync(e, target, FERRY_OP_WRITE, buf, remote, BLOCK);
  if (!st)
    first->ns[first->n++] = ferry_now_ns() - t0;
  char host[256];
  uint16_t port;
  for (int i = 0; !st && i < SAMPLES; i++) {
    uint64_t t = ferry_now_ns();
    st = ferry_segment_lookup(md, target, host, sizeof host, &port);
    lookup->ns[lookup->n++] = ferry_now_ns() - t;
  }
  for (int i = 0; !st && i < SAMPLES; i++) {
    uint64_t t = ferry_now_ns();
    st = ferry_transfer_sync(e, target, FERRY_OP_WRITE, buf, remote, BLOCK);
    known->ns[known->n++] = ferry_now_ns() - t;
  }
  if (st)
    ferry_cli_report(PROG, "first-contact round failed", st);
  ferry_engine_destroy(e);
  return st;
}

/* The target's first registered address, asked once by a setup engine. */
static ferry_status first_region(const ferry_cli_engine_opts *opts, const char *target,
                                 uint64_t *remote) {
  ferry_engine *e = NULL;
  ferry_region *regions = NULL;
  size_t count = 0;
  ferry_status st = ferry_cli_engine_create(PROG, opts, &e);
  if (!st)
    st = ferry_peer_regions(e, target, &regions, &count);
  if (!st && count == 0)
    st = FERRY_ENOTREG;
  if (!st)
    *remote = regions[0].addr;
  if (st)
    ferry_cli_report(PROG, "cannot find the target's memory", st);
  free(regions);
  ferry_engine_destroy(e);
  return st;
}

int ferry_bench_first_contact(const ferry_cli_engine_opts *opts, const char *target,
                              unsigned long rounds, int json) {
  if (!opts->metadata_url) {
    fprintf(stderr, "%s: --first-contact needs --metadata URL\n", PROG);
    return 2;
  }
  uint64_t remote = 0;
  ferry_metadata *md = NULL;
  if (first_region(opts, target, &remote) != FERRY_OK)
    return 1;
  ferry_status st = ferry_metadata_open(opts->metadata_url, &md);
  if (st) {
    ferry_cli_report(PROG, "cannot open the metadata store", st);
    return 1;
  }
  samples first = {calloc(rounds, sizeof(uint64_t)), 0};
  samples lookup = {calloc(rounds * SAMPLES, sizeof(uint64_t)), 0};
  samples known = {calloc(rounds * SAMPLES, sizeof(uint64_t)), 0};
  for (unsigned long r = 0; !st && r < rounds && first.ns && lookup.ns && known.ns; r++)
    st = round_trip(opts, target, remote, md, &first, &lookup, &known);
  int ok = !st && first.n == rounds;
  if (ok && json)
    printf("{\"rounds\": %lu, ", rounds);
  if (ok) {
    print_stat("first_contact", &first, 1e6, "ms", json, 0);
    print_stat("store_lookup", &lookup, 1e3, "us", json, 0);
    print_stat("known_peer_write", &known, 1e3, "us", json, 1);
    printf("%s", json ? "}\n" : "");
  }
  free(first.ns);
  free(lookup.ns);
  free(known.ns);
  ferry_metadata_close(md);
  return ok ? 0 : 1;
}
