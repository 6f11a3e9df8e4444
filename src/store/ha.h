/* ha.h - the store master's high availability (docs/store.md "High
 * availability"), Mooncake's --enable_ha with an etcd backend: masters
 * elect a leader through an etcd key (metadata/election.h) that names the
 * leader's address; the leader serves while its lease holds, the others
 * stand by, fenced, and take over when the key goes. Clients given
 * "etcd://HOST:PORT[;HOST:PORT...]" read the key to find the leader. */
#ifndef FERRY_STORE_HA_H
#define FERRY_STORE_HA_H

#include <stddef.h>
#include <stdint.h>

#include "store/master.h"

#define STORE_HA_SCHEME "etcd://"
#define STORE_HA_TTL_S 5 /* the leader's lease (Mooncake's master view lease) */

typedef struct store_ha store_ha;

/* Starts cfg's master fenced and campaigns once (then on a thread of its
 * own) on connstring's etcd ("HOST:PORT[,;HOST:PORT...]") under the key
 * mooncake-store/<cluster_id>/master_view. *leading: whether the first
 * round won. FERRY_EMETADATA naming etcd when it cannot be reached. */
ferry_status store_ha_start(const store_master_config *cfg, const char *connstring, uint32_t ttl_s,
                            store_ha **out, int *leading);
/* The address the key names when this master leads ("HOST:PORT"). */
const char *store_ha_address(const store_ha *h);
/* The counts of the master it runs now (zero while it could not listen). */
void store_ha_stats(store_ha *h, struct store_map_stats *out);
/* Resigns the lead (the key goes at once: a standby takes over without
 * waiting for the lease) and stops the master. */
void store_ha_stop(store_ha *h);

/* A client's lookup: the leader's "HOST:PORT" that the key at url
 * ("etcd://HOST:PORT[;,...]"; the cluster from MC_STORE_CLUSTER_ID, else
 * mooncake_cluster) names. FERRY_ENOTFOUND when no master leads now,
 * FERRY_EMETADATA when etcd cannot be reached. */
ferry_status store_ha_find_leader(const char *url, char *addr, size_t size);

#endif
