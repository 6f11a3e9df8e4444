/* client.h - what the store client's files share (client.c: the
 * connection to the master, open, close, the single-key calls; batch.c:
 * the batch calls and the transfers between buffers and replicas;
 * replicas.c: where objects are). */
#ifndef FERRY_STORE_CLIENT_H
#define FERRY_STORE_CLIENT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "net/net.h"
#include "store/disk.h"
#include "store/protocol.h"
#include "store/suspects.h"

struct ferry_store {
  ferry_engine *engine;
  char master[FERRY_HOST_MAX + 8]; /* as given: messages name it (never rewritten) */
  char *ha_url;                    /* HA: "etcd://..." where the leader is found (NULL: none) */
  char leader[FERRY_HOST_MAX + 8]; /* HA: the leader found at the last connect (under lock) */
  uint32_t timeout_ms;
  char *secret; /* proven again at each reconnect (NULL: none) */
  /* The master connection: one request at a time, and the reconnects. */
  pthread_mutex_t lock;
  int fd; /* -1 while lost: the next request reconnects */
  ferry_sock sock;
  ferry_session session;
  uint8_t readahead[4096];    /* a small reply in one receive, its header and body together */
  uint64_t conn;              /* which connection: 1, 2, ... (each reconnect counts) */
  uint64_t owner_disk_reads;  /* GET answers of a copy loaded from its owner's disk */
  uint64_t master_id;         /* the master's instance id at the last handshake */
  char lost[256];             /* why the connection was lost, or the last reconnect failed */
  uint32_t lease_ms, ping_ms; /* ping_ms atomic: the PING thread reads it */
  char fs_dir[STORE_DIR_MAX]; /* the SSD tier's directory, as the master said ("": none) */
  /* This client's segment, registered on engine (NULL when none). */
  void *segment;
  size_t segment_size;
  uint64_t segment_nonce; /* random, chosen at open; REGISTER sends it (HA's adoption) */
  /* --enable_cxl: the master's pool ("" when it has none, REGISTER's) and
   * this client's mapping of its device (NULL: none, cxl.c). */
  char pool[STORE_NAME_MAX + 1];
  uint64_t pool_base, pool_size;
  void *cxl;
  size_t cxl_size;
  /* Staging for put/get of memory that is not registered. */
  pthread_mutex_t staging_lock;
  void *staging;
  size_t staging_size;
  /* The PING thread. */
  pthread_t pinger;
  int pinger_started;
  pthread_mutex_t ping_lock;
  pthread_cond_t ping_cond;
  int closing;
  struct store_offload *offload; /* client-owned SSD offload (offload.h); NULL: none */
  store_suspects suspects;       /* segments reads failed to reach: their replicas go last */
};

/* A second connection to s's master, for offload.c's long polls: a client
 * without segment on s's engine (its secret, HA and timeout), its PING
 * thread included. Close it with ferry_store_close. */
ferry_status store_open_connection(ferry_store *s, ferry_store **out);

/* One request (body w, starting with its op; count entries) and its reply
 * (*body malloc'd, *h its header). A refusal of the whole request returns
 * its status with the master's reason as the detail. A lost connection is
 * replaced first (docs/store.md "Master restart"); a request that fails on
 * the socket fails, and the next one reconnects. */
ferry_status store_request(ferry_store *s, store_writer *w, uint32_t count, ferry_frame_header *h,
                           uint8_t **body, const char *step);
/* The same on one connection: *conn 0 takes any (and says which); else only
 * that one, FERRY_ESOCKET once it is gone (a PUT_END goes to the master
 * that started its put, never to the next one). */
ferry_status store_request_on(ferry_store *s, uint64_t *conn, store_writer *w, uint32_t count,
                              ferry_frame_header *h, uint8_t **body, const char *step);
/* The SSD tier's directory the master named at the last REGISTER, copied
 * into dir under the lock; 0 when it has none. */
int store_fs_dir(ferry_store *s, char dir[STORE_DIR_MAX]);
/* A key the API takes: 1..STORE_KEY_MAX bytes; FERRY_EINVAL naming it. */
ferry_status store_check_key(const char *key, const char *call);
/* The message of an entry's status (the key given), for the detail. */
ferry_status store_entry_fail(ferry_store *s, ferry_status st, const char *key, uint64_t size,
                              const char *what);

#endif
