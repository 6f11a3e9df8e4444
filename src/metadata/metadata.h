/* metadata.h - a key/value metadata store where engines publish segment
 * descriptors and look up their peers (Mooncake's keys and JSON layout).
 *
 * Backends live one per file in this folder: http.c, redis.c, etcd.c. A
 * store URL's scheme picks the backend; an unknown one fails with a message
 * naming it. Keys an engine publishes can live under a lease (lease.c), so
 * a killed engine's segment disappears within the ttl. */
#ifndef FERRY_METADATA_H
#define FERRY_METADATA_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

typedef struct ferry_metadata ferry_metadata;

/* ferry_config.metadata_ttl_ms when it is 0. */
#define FERRY_METADATA_TTL_DEFAULT_MS 5000

typedef struct ferry_metadata_options {
  uint32_t ttl_ms;             /* > 0: every put is leased and kept alive */
  uint32_t connect_timeout_ms; /* bound on reaching the store; 0 = 2000 */
} ferry_metadata_options;

/* "http(s)://host:port/path" -> http; "redis://[user[:pass]@]host:port[/db]"
 * -> redis; "etcd://host:port[,host:port...]" or a bare "host:port[,...]"
 * -> etcd. Else FERRY_EINVAL. redis connects and authenticates at open;
 * http and etcd are first reached by the first operation. Every request is
 * bounded by the connect timeout (to connect) plus 3 s (to answer). */
ferry_status ferry_metadata_open(const char *url, ferry_metadata **out);
ferry_status ferry_metadata_open_with(const char *url, const ferry_metadata_options *opt,
                                      ferry_metadata **out);
void ferry_metadata_close(ferry_metadata *md);
/* "scheme://user:secret@host..." -> "scheme://user:***@host...", so no
 * message or log line carries a store password. */
void ferry_metadata_redact(const char *url, char *out, size_t size);

/* Raw key operations. get: FERRY_ENOTFOUND when the key is missing (404);
 * *value is malloc'd, NUL-terminated. Failures name the URL and the cause. */
ferry_status ferry_metadata_put(ferry_metadata *md, const char *key, const char *value);
ferry_status ferry_metadata_get(ferry_metadata *md, const char *key, char **value);
ferry_status ferry_metadata_delete(ferry_metadata *md, const char *key);

/* Segment descriptors:
 *   mooncake/rpc_meta/<name> = {"ip_or_host_name": host, "rpc_port": port}
 *   mooncake/ram/<name> = {"name": name, "protocol": "tcp", "tcp_data_port": port,
 *                          "buffers": [{"name": "cpu:0", "addr": A, "length": L}, ...]} */
ferry_status ferry_segment_publish(ferry_metadata *md, const char *name, const char *host,
                                   uint16_t port, const ferry_region *regions, size_t count);
/* Rewrites only the ram key (after registrations change). */
ferry_status ferry_segment_publish_regions(ferry_metadata *md, const char *name, uint16_t port,
                                           const ferry_region *regions, size_t count);
ferry_status ferry_segment_unpublish(ferry_metadata *md, const char *name);
/* Finds where segment `name` listens. host gets at most host_size-1 chars.
 * When the store cannot be reached (FERRY_EMETADATA), a segment this handle
 * has looked up before is answered from its last known address, so peers
 * already known stay reachable; a segment never seen fails at once. */
ferry_status ferry_segment_lookup(ferry_metadata *md, const char *name, char *host,
                                  size_t host_size, uint16_t *port);
/* The segment's buffers as published (malloc'd, sorted by addr). */
ferry_status ferry_segment_lookup_regions(ferry_metadata *md, const char *name,
                                          ferry_region **regions, size_t *count);

#endif
