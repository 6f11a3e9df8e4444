/* kind.c - the list of memory kinds, the identification of a region's
 * memory at registration, and Mooncake's location strings ("cpu:0",
 * "cuda:1", "*") checked against what the drivers say. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "memory/kind.h"

/* Every kind but host, asked in this order; host memory is what none claims. */
static const ferry_memory_kind *const device_kinds[] = {&ferry_kind_cuda, NULL};

const ferry_memory_kind *ferry_kind_get(unsigned id) {
  for (size_t i = 0; device_kinds[i]; i++)
    if (device_kinds[i]->id == id)
      return device_kinds[i];
  return &ferry_kind_host;
}

ferry_status ferry_kind_identify(uint64_t addr, uint64_t length, ferry_where *where) {
  for (size_t i = 0; device_kinds[i]; i++) {
    const ferry_memory_kind *k = device_kinds[i];
    if (!k->available(NULL, 0))
      continue;
    ferry_status st = k->identify(addr, length, where);
    if (st != FERRY_ENOTFOUND)
      return st;
  }
  return ferry_kind_host.identify(addr, length, where);
}

void ferry_where_format(const ferry_where *where, char *out, size_t size) {
  const ferry_memory_kind *k = ferry_kind_get(where->kind);
  if (where->device < 0)
    snprintf(out, size, "%s", k->name);
  else
    snprintf(out, size, "%s:%d%s", k->name, where->device,
             where->cpu_access && k->id != FERRY_KIND_HOST ? " (host-accessible)" : "");
}

int ferry_kind_must_stage(const ferry_where *where, int staging) {
  if (staging == FERRY_STAGING_NEVER)
    return 0;
  return staging == FERRY_STAGING_ALWAYS || !where->cpu_access;
}

/* ---- location strings ----------------------------------------------------- */

static ferry_status bad_location(const char *text) {
  return ferry_fail(FERRY_EINVAL,
                    "location \"%.64s\" is not valid: expected \"*\" (or empty), \"cpu\", "
                    "\"cpu:N\", \"cuda\" or \"cuda:N\" (N a device number, 0 to 32767)",
                    text);
}

static const ferry_memory_kind *kind_named(const char *name, size_t len) {
  if (len == strlen(ferry_kind_host.name) && !memcmp(name, ferry_kind_host.name, len))
    return &ferry_kind_host;
  for (size_t i = 0; device_kinds[i]; i++)
    if (len == strlen(device_kinds[i]->name) && !memcmp(name, device_kinds[i]->name, len))
      return device_kinds[i];
  return NULL;
}

ferry_status ferry_location_parse(const char *text, ferry_location *out) {
  out->kind = NULL;
  out->device = -1;
  if (!text || !*text || !strcmp(text, "*"))
    return FERRY_OK;
  const char *colon = strchr(text, ':');
  size_t name_len = colon ? (size_t)(colon - text) : strlen(text);
  out->kind = kind_named(text, name_len);
  if (!out->kind)
    return bad_location(text);
  if (!colon)
    return FERRY_OK;
  const char *digits = colon + 1;
  if (*digits < '0' || *digits > '9' || strlen(digits) > 5)
    return bad_location(text);
  char *end;
  errno = 0;
  long device = strtol(digits, &end, 10);
  if (*end || errno || device > 32767)
    return bad_location(text);
  /* A host location's number is a NUMA node to Mooncake: any host memory. */
  out->device = out->kind->id == FERRY_KIND_HOST ? -1 : (int)device;
  return FERRY_OK;
}

static ferry_status contradiction(const char *text, const ferry_where *where, uint64_t addr,
                                  uint64_t length) {
  char said[64];
  ferry_where_format(where, said, sizeof said);
  return ferry_fail(FERRY_EINVAL,
                    "register 0x%llx (+%llu bytes) at location \"%.64s\": the memory is %s "
                    "according to %s",
                    (unsigned long long)addr, (unsigned long long)length, text, said,
                    where->kind == FERRY_KIND_HOST ? "every memory driver ferry loaded"
                                                   : "its driver");
}

ferry_status ferry_location_check(const char *text, const ferry_location *loc,
                                  const ferry_where *where, uint64_t addr, uint64_t length) {
  if (!loc->kind)
    return FERRY_OK;
  char why[256];
  if (!loc->kind->available(why, sizeof why))
    return ferry_fail(FERRY_ENOTIMPL,
                      "register 0x%llx (+%llu bytes) at location \"%.64s\": no %s driver was "
                      "found (%s)",
                      (unsigned long long)addr, (unsigned long long)length, text,
                      loc->kind->id == FERRY_KIND_CUDA ? "CUDA" : loc->kind->name, why);
  if (loc->kind->id == FERRY_KIND_HOST)
    return where->cpu_access ? FERRY_OK : contradiction(text, where, addr, length);
  if (where->kind != loc->kind->id || (loc->device >= 0 && where->device != loc->device))
    return contradiction(text, where, addr, length);
  return FERRY_OK;
}
