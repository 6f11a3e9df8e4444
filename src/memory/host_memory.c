/* host_memory.c - whether this process's CPU can read and write memory,
 * from the kernel's list of its mappings.
 *
 * Why: a peer's WRITE into memory the target cannot touch (a CUDA device
 * pointer is PROT_NONE to the CPU when no driver maps it; a freed buffer is
 * not mapped at all) made the target fault. So registration refuses such
 * memory, naming the likely cause, and a READ checks its ranges before its
 * reply goes out (a WRITE needs no check: the kernel places its bytes and
 * returns EFAULT, net.c).
 *
 * Cost: per mapping, never per page, and no page is touched or faulted in
 * (a 1 GiB MAP_NORESERVE reservation costs what a 4 KiB buffer does). The
 * PROCMAP_QUERY ioctl on /proc/self/maps (Linux 6.11) answers for one
 * address with the mapping that holds it, or the next one: one call per
 * mapping a range spans, cheap enough for every READ. Older kernels get
 * one pass over /proc/self/maps's text per registration, in address
 * order, so a batch of a million regions is still one pass; a READ then
 * goes unchecked and relies on the kernel's EFAULT. */
#include "memory/host_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"

#ifndef PROCMAP_QUERY
/* The uapi of Linux 6.11 (include/uapi/linux/fs.h), for older headers. */
struct procmap_query {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
#define PROCMAP_QUERY _IOWR('f', 17, struct procmap_query)
#define PROCMAP_QUERY_VMA_READABLE 0x01
#define PROCMAP_QUERY_VMA_WRITABLE 0x02
#define PROCMAP_QUERY_VMA_EXECUTABLE 0x04
#define PROCMAP_QUERY_VMA_SHARED 0x08
#define PROCMAP_QUERY_COVERING_OR_NEXT_VMA 0x10
#endif

#define MAPS_PATH "/proc/self/maps"

struct ferry_host_memory {
  int query_fd; /* /proc/self/maps for PROCMAP_QUERY; -1: read the text */
};

typedef struct mapping {
  uint64_t start, end;
  char perms[5]; /* "rw-p" */
} mapping;

static int can_read(const mapping *m) { return m->perms[0] == 'r'; }
static int can_write(const mapping *m) { return m->perms[1] == 'w'; }

/* Where mappings come from during one check: queries, or the text read
 * forward once (so lookups must come in address order). */
typedef struct maps_cursor {
  int query_fd;
  FILE *text;
  char *line;
  size_t line_size;
  mapping last; /* the last mapping found: the next range often lies in it */
  int have_last;
} maps_cursor;

static int query_mapping(int fd, uint64_t addr, mapping *m) {
  struct procmap_query q;
  memset(&q, 0, sizeof q);
  q.size = sizeof q;
  q.query_flags = PROCMAP_QUERY_COVERING_OR_NEXT_VMA;
  q.query_addr = addr;
  if (ioctl(fd, PROCMAP_QUERY, &q) < 0)
    return errno == ENOENT ? 0 : -1;
  m->start = q.vma_start;
  m->end = q.vma_end;
  m->perms[0] = q.vma_flags & PROCMAP_QUERY_VMA_READABLE ? 'r' : '-';
  m->perms[1] = q.vma_flags & PROCMAP_QUERY_VMA_WRITABLE ? 'w' : '-';
  m->perms[2] = q.vma_flags & PROCMAP_QUERY_VMA_EXECUTABLE ? 'x' : '-';
  m->perms[3] = q.vma_flags & PROCMAP_QUERY_VMA_SHARED ? 's' : 'p';
  m->perms[4] = 0;
  return 1;
}

/* The next line of the text ending after addr. */
static int text_mapping(maps_cursor *c, uint64_t addr, mapping *m) {
  while (getline(&c->line, &c->line_size, c->text) > 0) {
    if (sscanf(c->line, "%" SCNx64 "-%" SCNx64 " %4s", &m->start, &m->end, m->perms) != 3) {
      errno = EPROTO;
      return -1;
    }
    if (m->end > addr)
      return 1;
  }
  return ferror(c->text) ? -1 : 0;
}

/* The mapping holding addr, else the first one after it: 1; 0 when none
 * follows; -1 with errno when the kernel could not say. */
static int mapping_from(maps_cursor *c, uint64_t addr, mapping *m) {
  /* In the text, every line before last ended at or before an earlier
   * lookup: last is also the first mapping after an addr it does not hold. */
  if (c->have_last && addr < c->last.end && (c->text || c->last.start <= addr)) {
    *m = c->last;
    return 1;
  }
  int found = c->text ? text_mapping(c, addr, m) : query_mapping(c->query_fd, addr, m);
  c->have_last = found == 1;
  if (found == 1)
    c->last = *m;
  return found;
}

/* The first part of [addr, addr+length) that is unmapped or lacks an
 * access asked for: 1 with *p set, 0 when none, -1 when the kernel could
 * not say (errno). */
static int find_problem(maps_cursor *c, uint64_t addr, uint64_t length, int need_write,
                        ferry_host_problem *p) {
  uint64_t at = addr, end = addr + length;
  while (at < end) {
    mapping m;
    int found = mapping_from(c, at, &m);
    if (found < 0)
      return -1;
    if (!found || m.start > at) {
      *p = (ferry_host_problem){at, found && m.start < end ? m.start : end, ""};
      return 1;
    }
    if (!can_read(&m) || (need_write && !can_write(&m))) {
      *p = (ferry_host_problem){at, m.end < end ? m.end : end, ""};
      memcpy(p->perms, m.perms, sizeof p->perms);
      return 1;
    }
    at = m.end;
  }
  return 0;
}

int ferry_host_memory_query = 1;

ferry_host_memory *ferry_host_memory_open(int use_query) {
  ferry_host_memory *hm = calloc(1, sizeof *hm);
  if (!hm)
    return NULL;
  hm->query_fd = use_query ? open(MAPS_PATH, O_RDONLY | O_CLOEXEC) : -1;
  mapping probe;
  static const int here = 1; /* an address that is surely mapped */
  if (hm->query_fd >= 0 && query_mapping(hm->query_fd, (uint64_t)(uintptr_t)&here, &probe) != 1) {
    close(hm->query_fd); /* ENOTTY: a kernel before 6.11 */
    hm->query_fd = -1;
  }
  return hm;
}

void ferry_host_memory_close(ferry_host_memory *hm) {
  if (!hm)
    return;
  if (hm->query_fd >= 0)
    close(hm->query_fd);
  free(hm);
}

int ferry_host_memory_has_query(const ferry_host_memory *hm) { return hm && hm->query_fd >= 0; }

void ferry_host_problem_describe(const ferry_host_problem *p, char *out, size_t size) {
  int n = snprintf(out, size, "[0x%" PRIx64 ", 0x%" PRIx64 ") ", p->start, p->end);
  if (n < 0 || (size_t)n >= size)
    return;
  if (!p->perms[0])
    snprintf(out + n, size - (size_t)n, "is not mapped at all");
  else
    snprintf(out + n, size - (size_t)n, "is mapped without %s access (%s)",
             p->perms[0] != 'r' && p->perms[1] != 'w' ? "read or write"
             : p->perms[0] != 'r'                     ? "read"
                                                      : "write",
             p->perms);
}

/* Registration's detail: the region, the range at fault, the likely cause. */
static ferry_status refuse(const ferry_region *r, const ferry_host_problem *p) {
  char what[160];
  ferry_host_problem_describe(p, what, sizeof what);
  const char *cause = !p->perms[0] ? "; check the address and length, or it was freed"
                      : p->perms[0] != 'r'
                          ? ": not mapped for the CPU: GPU memory, and the CUDA driver (if "
                            "found) did not claim it; register host memory instead"
                          : ": peers write registered memory, so it must be writable";
  return ferry_fail(FERRY_EFAULT, "register [0x%" PRIx64 ", +%" PRIu64 "): %s%s", r->addr,
                    r->length, what, cause);
}

static int compare_addr(const void *a, const void *b) {
  const ferry_region *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The ranges in address order (the text can only be read forward): the
 * ranges themselves when they are, else *copy (NULL: out of memory). */
static const ferry_region *in_order(const ferry_region *ranges, size_t count, ferry_region **copy) {
  *copy = NULL;
  size_t i = 1;
  while (i < count && ranges[i - 1].addr <= ranges[i].addr)
    i++;
  if (i >= count)
    return ranges;
  *copy = malloc(count * sizeof **copy);
  if (!*copy)
    return NULL;
  memcpy(*copy, ranges, count * sizeof **copy);
  qsort(*copy, count, sizeof **copy, compare_addr);
  return *copy;
}

/* Walks the ranges; a range starting inside the span just checked is
 * checked from where that span ends, so sorted ranges (as the text needs)
 * are looked up in forward order, each address once. */
static int walk(maps_cursor *c, const ferry_region *ranges, size_t count, int need_write,
                ferry_host_problem *p, const ferry_region **at) {
  uint64_t good_from = 0, good_to = 0; /* [good_from, good_to): checked */
  for (size_t i = 0; i < count; i++) {
    const ferry_region *r = &ranges[i];
    uint64_t from = r->addr, end = r->addr + r->length;
    int extends = from >= good_from && from < good_to;
    if (extends)
      from = good_to;
    if (end <= from)
      continue;
    int found = find_problem(c, from, end - from, need_write, p);
    if (found) {
      *at = r;
      return found;
    }
    if (!extends)
      good_from = r->addr;
    good_to = end;
  }
  return 0;
}

static int find_in(ferry_host_memory *hm, const ferry_region *ranges, size_t count, int need_write,
                   int cheap_only, ferry_host_problem *p, ferry_region *at) {
  maps_cursor c = {.query_fd = hm ? hm->query_fd : -1};
  if (c.query_fd < 0 && cheap_only)
    return -1;
  ferry_region *copy = NULL;
  const ferry_region *sorted = c.query_fd >= 0 ? ranges : in_order(ranges, count, &copy);
  if (!sorted || (c.query_fd < 0 && !(c.text = fopen(MAPS_PATH, "re")))) {
    free(copy);
    return -1;
  }
  const ferry_region *bad = NULL;
  int found = walk(&c, sorted, count, need_write, p, &bad), err = errno;
  if (found == 1 && at)
    *at = *bad;
  if (c.text)
    fclose(c.text);
  free(c.line);
  free(copy);
  errno = err;
  return found;
}

int ferry_host_memory_find(ferry_host_memory *hm, const ferry_region *ranges, size_t count,
                           int need_write, int cheap_only, ferry_host_problem *p) {
  return find_in(hm, ranges, count, need_write, cheap_only, p, NULL);
}

ferry_status ferry_host_memory_check(ferry_host_memory *hm, const ferry_region *regions,
                                     size_t count) {
  for (size_t i = 0; i < count; i++)
    if (regions[i].length == 0 || regions[i].length > UINT64_MAX - regions[i].addr)
      return FERRY_OK; /* the registry refuses it with its own reason */
  ferry_host_problem p;
  ferry_region bad;
  int found = find_in(hm, regions, count, 1, 0, &p, &bad);
  if (found == 1)
    return refuse(&bad, &p);
  if (found < 0) {
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
      FERRY_WARN("cannot read " MAPS_PATH " (%s): registrations are not checked for memory this "
                 "process cannot touch",
                 strerror(errno));
  }
  return FERRY_OK;
}
