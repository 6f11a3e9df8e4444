/* fabric_library.c - libfabric, loaded when the fabric transport or its
 * probe is first used (base/library.h), so a host without libfabric1 keeps
 * tcp, shm and everything else.
 *
 * Only the few entry points below are symbols of libfabric; the rest of its
 * API (endpoints, memory registration, RMA) is inline calls through the
 * objects these return. libfabric versions its symbols: when fi_info grows,
 * fi_getinfo gets a new version and keeps the old ones, so each is bound to
 * the version that the headers built against name, as a link would have
 * done; headers this file does not know bind the library's default. */
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <stdio.h>

#include "base/library.h"
#include "transport/fabric.h"

#if FI_MAJOR_VERSION == 1 && FI_MINOR_VERSION == 17
#define V(version) version
#else
#define V(version) NULL
#endif

ferry_fabric_api ferry_fi;

#define SYMBOL(field, version) FERRY_LIBRARY_SYMBOL(ferry_fabric_api, field, "fi_" #field, version)
static const ferry_library_symbol fabric_symbols[] = {
    SYMBOL(getinfo, V("FABRIC_1.3")),  SYMBOL(dupinfo, V("FABRIC_1.3")),
    SYMBOL(freeinfo, V("FABRIC_1.3")), SYMBOL(fabric, V("FABRIC_1.1")),
    SYMBOL(open, V("FABRIC_1.5")),     SYMBOL(strerror, V("FABRIC_1.0")),
};

static ferry_library fabric_library =
    FERRY_LIBRARY("libfabric.so.1", "libfabric1", "the fabric transport (protocol rdma, efa)",
                  fabric_symbols, ferry_fi);

int ferry_fabric_library_load(char *why, size_t size) {
  if (ferry_library_load(&fabric_library) == FERRY_OK)
    return 1;
  snprintf(why, size, "%s", ferry_last_error());
  return 0;
}
