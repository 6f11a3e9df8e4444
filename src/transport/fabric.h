/* fabric.h - private to the libfabric (RDMA-class) transport of issue 12.
 * Today it holds the provider probe `ferry doctor` reports with; the
 * transport itself (fi_write/fi_read into registered memory) builds on the
 * same provider table. */
#ifndef FERRY_FABRIC_H
#define FERRY_FABRIC_H

#include <stddef.h>

/* The providers ferry drives, RDMA hardware first: InfiniBand/RoCE, AWS
 * EFA, then the tcp and shm providers that run the same RMA path without
 * an RDMA device. NULL-terminated. */
extern const char *const ferry_fabric_providers[];

/* Asks libfabric for one-sided RMA on a reliable-datagram endpoint of
 * `provider`. Returns 1 with its domains (devices or interfaces), progress
 * model and memory-registration modes in out, or 0 with why not (libfabric's
 * own words: "No data available" when no device exists). */
int ferry_fabric_probe(const char *provider, char *out, size_t size);

#endif
