/* election.h - a leader election on etcd (the store master's HA, docs/store.md
 * "High availability"): one key that names the leader, held under an etcd
 * lease the leader keeps alive and written only when absent (a transaction
 * on the key's create revision), so at most one holder exists at a time. */
#ifndef FERRY_METADATA_ELECTION_H
#define FERRY_METADATA_ELECTION_H

#include <stdint.h>

#include "ferry.h"

typedef struct ferry_election ferry_election;

/* endpoints: "host:port[,host:port...]" (';' separates too, Mooncake's
 * form); ttl_s: the lease's life in seconds (etcd raises it to its minimum).
 * Nothing is contacted yet. */
ferry_status ferry_election_open(const char *endpoints, const char *key, uint32_t ttl_s,
                                 ferry_election **out);
/* One round: when the key is absent, grants a lease and writes value under
 * it unless another wrote the key meanwhile. FERRY_OK: this handle leads,
 * and etcd cannot give the key to another before *until_ns (monotonic: the
 * grant's send time plus its ttl). FERRY_EBUSY: another leads (*holder, when
 * asked, its value, malloc'd). Else etcd was not reached (the detail). */
ferry_status ferry_election_campaign(ferry_election *e, const char *value, char **holder,
                                     uint64_t *until_ns);
/* A standby's wait: returns once the key changed after the last
 * campaign's read of it (FERRY_OK: campaign again), FERRY_ETIMEDOUT after
 * wait_ms without a change, else etcd's failure. An etcd watch, so a
 * standby wakes when the key goes instead of reading it in a loop. Call
 * it from the thread that campaigns. */
ferry_status ferry_election_watch(ferry_election *e, uint32_t wait_ms);
/* The leader's keep-alive: FERRY_OK pushes *until_ns on (send time plus the
 * ttl etcd answered); FERRY_ENOTFOUND: the lease or the key is gone (lost
 * the lead: stop at once); else etcd was not reached (the old *until_ns
 * still holds). */
ferry_status ferry_election_keep(ferry_election *e, uint64_t *until_ns);
/* The leader's log (docs/store.md "High availability"): writes key=value
 * (value NULL: deletes key) only while the leader key still hangs on this
 * handle's lease, in one transaction, so a deposed leader writes nothing.
 * FERRY_ENOTFOUND when it does not lead (any more). */
ferry_status ferry_election_write(ferry_election *e, const char *key, const char *value);
/* The same for n keys in one transaction: all written, or none. etcd
 * refuses more operations per transaction than its --max-txn-ops (128 by
 * default) and the same key twice. */
#define FERRY_ELECTION_TXN_MAX 128
ferry_status ferry_election_write_many(ferry_election *e, size_t n, const char *const *keys,
                                       const char *const *values);
/* Calls each(ctx, key, value) for every key under prefix. */
ferry_status ferry_election_scan(ferry_election *e, const char *prefix,
                                 void (*each)(void *ctx, const char *key, const char *value),
                                 void *ctx);
/* Gives the lead up: revokes the lease, so the key goes at once. */
void ferry_election_resign(ferry_election *e);
void ferry_election_close(ferry_election *e);

#endif
