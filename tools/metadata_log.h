/* metadata_log.h - the state file of `ferry metadata-server --state FILE`:
 * an append log of the store's changes. A writer thread of its own
 * appends and syncs what the store queued (under its lock, so the log
 * keeps the store's order), so no store lock is held across a disk write
 * and each change costs its own bytes; a compactor thread rewrites the
 * file from a snapshot of the live keys once it grew past twice their size,
 * while changes go on being appended. */
#ifndef FERRY_TOOLS_METADATA_LOG_H
#define FERRY_TOOLS_METADATA_LOG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A stored value, shared by the store, the log's queue and snapshots. */
typedef struct md_value {
  size_t refs; /* atomic */
  size_t len;
  char data[];
} md_value;

/* A value of cap bytes (len 0, one reference); NULL when out of memory. */
md_value *md_value_alloc(size_t cap);
md_value *md_value_ref(md_value *v);
void md_value_unref(md_value *v);

/* One live key of a snapshot (the compactor frees the key and drops the
 * reference). */
typedef struct md_item {
  char *key;
  md_value *value;
  uint32_t ttl_ms;
} md_item;

typedef struct md_log md_log;
typedef struct md_record md_record;

/* Replays one change at open: op '+' (a reference to value passes to the
 * callee) or '-' (value NULL). 0, or -1 to stop (out of memory). */
typedef int (*md_replay_fn)(void *arg, char op, const char *key, md_value *value, uint32_t ttl_ms);
/* Takes a snapshot for a compaction: under the store's lock, calls
 * md_log_mark and fills *items (malloc'd). Returns the count, or -1. */
typedef ssize_t (*md_snapshot_fn)(void *arg, md_log *log, md_item **items);

/* Replays path (missing: an empty store; a record cut short at its end by
 * a crash is ignored, with a WARN), writes it back compacted and starts
 * the threads. NULL, after printing why, when the file is damaged or
 * cannot be written. */
md_log *md_log_open(const char *path, md_replay_fn replay, md_snapshot_fn snapshot, void *arg);
/* Queues a change: op '+' with value (a reference is taken) or '-'. Called
 * under the store's lock. With wait, *wait is what md_log_wait takes. 0, or
 * -1 when out of memory. */
int md_log_append(md_log *log, char op, const char *key, md_value *value, uint32_t ttl_ms,
                  md_record **wait);
/* Waits until that change is on disk (synced): 0, or the errno that failed
 * it. Releases it. */
int md_log_wait(md_log *log, md_record *r);
/* The snapshot being taken holds every change queued so far. */
void md_log_mark(md_log *log);
/* Writes what is queued, stops the threads and frees the log. */
void md_log_close(md_log *log);

#endif
