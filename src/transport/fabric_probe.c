/* fabric_probe.c - which libfabric providers can do one-sided RMA here, and
 * on which domains: what `ferry doctor` lists, so an operator sees why
 * "rdma" falls back (no device) before deploying. Only fi_getinfo: nothing
 * is opened and no traffic is sent. */
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/fabric.h"

const char *const ferry_fabric_providers[] = {"verbs;ofi_rxm", "efa", "tcp;ofi_rxm",
                                              "net",           "shm", NULL};

/* Every MR mode bit ferry honours; the provider clears those it does not
 * need and keeps those it requires (libfabric.md: the strict set cannot be
 * forced with API 1.17, only with FI_MR_BASIC and API 1.4). */
#define FABRIC_MR_MODES                                                                            \
  (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT)

struct fi_info *ferry_fabric_hints(const char *provider, int basic) {
  char why[8];
  if (!ferry_fabric_library_load(why, sizeof why))
    return NULL;
  struct fi_info *hints = ferry_fi.dupinfo(NULL);
  if (!hints)
    return NULL;
  hints->caps = FI_RMA;
  hints->ep_attr->type = FI_EP_RDM;
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  hints->domain_attr->mr_mode = basic ? FI_MR_BASIC : FABRIC_MR_MODES;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->fabric_attr->prov_name = strdup(provider);
  if (!hints->fabric_attr->prov_name) {
    ferry_fi.freeinfo(hints);
    return NULL;
  }
  return hints;
}

void ferry_fabric_domains(const struct fi_info *info, char *out, size_t size) {
  size_t used = 0;
  if (size)
    out[0] = '\0';
  for (const struct fi_info *i = info; i && used < size; i = i->next) {
    const char *name = i->domain_attr->name ? i->domain_attr->name : "?";
    int seen = 0;
    for (const struct fi_info *j = info; j != i && !seen; j = j->next)
      seen = j->domain_attr->name && strcmp(j->domain_attr->name, name) == 0;
    if (!seen)
      used += (size_t)snprintf(out + used, size - used, "%s%s", used ? ", " : "", name);
  }
}

int ferry_fabric_probe(const char *provider, char *out, size_t size) {
  if (!ferry_fabric_library_load(out, size))
    return 0;
  struct fi_info *hints = ferry_fabric_hints(provider, 0), *info = NULL;
  if (!hints)
    return snprintf(out, size, "no memory for fi_getinfo hints"), 0;
  int rc = ferry_fi.getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
  ferry_fi.freeinfo(hints);
  if (rc != 0)
    return snprintf(out, size, "fi_getinfo(%s): %s%s", provider, ferry_fi.strerror(-rc),
                    rc == -FI_ENODATA ? " (no such device or provider here)" : ""),
           0;
  char domains[256];
  ferry_fabric_domains(info, domains, sizeof domains);
  snprintf(out, size, "RMA on %s; %s progress; MR modes 0x%x", domains,
           info->domain_attr->data_progress == FI_PROGRESS_AUTO ? "automatic" : "manual",
           (unsigned)info->domain_attr->mr_mode);
  ferry_fi.freeinfo(info);
  return 1;
}

/* Appends the domain names provider offers (none when it has none). */
static void add_domains(const char *provider, char *have, size_t size) {
  char why[8];
  if (!ferry_fabric_library_load(why, sizeof why))
    return;
  struct fi_info *hints = ferry_fabric_hints(provider, 0), *info = NULL;
  if (hints && ferry_fi.getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0) {
    size_t used = strlen(have);
    if (used && used + 2 < size)
      strcat(have, ", ");
    used = strlen(have);
    ferry_fabric_domains(info, have + used, size - used);
  }
  ferry_fi.freeinfo(hints);
  ferry_fi.freeinfo(info);
}

/* Whether name is one of the ", "-separated names in list. */
static int listed(const char *list, const char *name) {
  size_t len = strlen(name);
  for (const char *p = list; (p = strstr(p, name)) != NULL; p += len)
    if ((p == list || p[-1] == ' ') && (p[len] == ',' || p[len] == '\0'))
      return 1;
  return 0;
}

int ferry_fabric_missing_devices(const char *provider, const char *list, char *missing,
                                 size_t missing_size, char *have, size_t have_size) {
  have[0] = missing[0] = '\0';
  if (provider)
    add_domains(provider, have, have_size);
  else
    for (const char *const *p = (const char *const[]){"verbs;ofi_rxm", "efa", NULL}; *p; p++)
      add_domains(*p, have, have_size);
  char names[512];
  snprintf(names, sizeof names, "%s", list);
  int count = 0;
  size_t used = 0;
  for (char *save = NULL, *name = strtok_r(names, ",", &save); name;
       name = strtok_r(NULL, ",", &save))
    if (!listed(have, name) && used < missing_size) {
      used +=
          (size_t)snprintf(missing + used, missing_size - used, "%s%s", count ? ", " : "", name);
      count++;
    }
  return count;
}
