/* map_internal.h - the store master's state (struct store_map: objects,
 * segments, LRU lists, offload's tasks) and the functions its two files
 * call in each other: map.c (the table, eviction, requests, HA) and
 * map_offload.c (client-owned SSD offload). Shared by those two only: the
 * rest of the store sees map.h. */
#ifndef FERRY_STORE_MAP_INTERNAL_H
#define FERRY_STORE_MAP_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "store/extents.h"
#include "store/map.h"

typedef struct segment {
  struct segment *next;
  uint64_t client;
  char name[STORE_NAME_MAX + 1];
  uint64_t base, size;
  uint64_t nonce; /* its client's name for this memory (REGISTER); 0: not known */
  store_extents space;
  /* --enable_offload: its client owns an offload directory (it polled);
   * the tasks waiting for that client, oldest first. */
  int offload;
  struct task *tasks, **tasks_tail;
  size_t task_count;
} segment;

/* One task for an offloading client (offload.c's poll): write a value's
 * file, load one back, or delete one. The key only: the object is looked
 * up when the task is handed out (it may have changed or gone since). */
typedef struct task {
  struct task *next;
  uint8_t kind; /* STORE_TASK_* */
  uint16_t key_len;
  char key[];
} task;

typedef struct replica {
  segment *seg;
  uint64_t offset;
} replica;

/* 80 bytes, then 16 per replica and the key: the master's cost of an
 * object is that, malloc's header and a bucket or two of the table
 * (docs/store.md counts it). */
typedef struct object {
  struct object *next;          /* hash chain */
  struct object *older, *newer; /* its LRU list (committed, not hard-pinned) */
  uint64_t hash;
  uint64_t size;
  uint64_t writer;         /* nonzero: pending, written by this client */
  uint64_t lease_until_ns; /* a GET's lease; 0: none */
  uint64_t used_ns;        /* committed or last got: the LRU order */
  uint64_t pin_until_ns;   /* soft-pinned: the pin's deadline; pending: the TTL it asks */
  uint16_t key_len;
  uint8_t pin;         /* FERRY_STORE_PIN_* */
  uint8_t soft_action; /* pending: the FERRY_STORE_SOFT_PIN_* its commit applies */
  uint8_t room;        /* rep[]'s length: the replicas asked */
  uint8_t replicas;    /* held (a segment that left takes its replica along); 0: disk-only */
  uint8_t on_disk;     /* its file is complete (--root_fs_dir) */
  uint8_t off;         /* --enable_offload: OFF_* */
  replica rep[];       /* rep[room], then the key (not NUL-terminated) */
} object;

_Static_assert(sizeof(object) == 80, "the master's bytes per object (docs/store.md)");

typedef struct lru {
  object *oldest, *newest;
} lru;

/* --enable_offload: an object's copy on the local disk of the client whose
 * segment holds its replica (the owner). LOCAL: the owner's file is
 * complete (a disk-only one keeps the owner's segment in rep[0], with
 * replicas 0). QUEUED: an offload task waits; WRITING: handed out, the
 * owner reads the replica (not evicted nor removed meanwhile); EVICT:
 * eviction chose it (--offload_on_evict), its memory goes once the file
 * is written; LOADING: a GET asked it back: rep[0] holds space in the
 * owner's segment that the owner fills from the file;
 * STAGED: loaded back for gets only: on the staged list, its memory given
 * back once their lease ends (not promoted). */
enum {
  OFF_LOCAL = 1,
  OFF_QUEUED = 2,
  OFF_WRITING = 4,
  OFF_EVICT = 8,
  OFF_LOADING = 16,
  OFF_STAGED = 32
};

/* --promotion_on_hit's count of gets per key on disk only: a count-min
 * sketch (each row counts the key at a slot its hash picks; the least of
 * the rows is the count, over-estimated only by collisions), saturating
 * at 255; every SKETCH_AGE additions halve every slot, so old hits fade. */
#define SKETCH_ROWS 4
#define SKETCH_WIDTH 4096
#define SKETCH_AGE (8 * SKETCH_WIDTH)

/* A GET's removal under --enable_gc: key, got at got_ns, goes at due_ns. */
typedef struct gc_entry {
  struct gc_entry *next;
  uint64_t got_ns, due_ns;
  uint16_t key_len;
  char key[]; /* not NUL-terminated */
} gc_entry;

struct store_map {
  pthread_mutex_t lock;
  uint64_t lease_ns, soft_pin_ns, max_soft_pin_ms;
  uint32_t lease_ms, ping_ms;
  double high_watermark, eviction_ratio;
  segment *segments;
  segment *pool; /* --enable_cxl: the only segment, every value's place (NULL: off) */
  object **buckets;
  size_t bucket_count, objects;
  lru plain, soft;
  size_t soft_count;           /* on the soft list */
  int keep_soft_pinned;        /* --allow_evict_soft_pinned_objects=false */
  size_t pending, hard_pinned; /* objects on neither list (and the disk-only ones) */
  uint64_t gc_ns;              /* --enable_gc: a GET's removal delay; 0: off */
  gc_entry *gc_head, *gc_tail; /* in deadline order */
  char *fs_dir;                /* the SSD tier's directory (disk.h); NULL: none */
  object *retired;             /* replaced by an upsert, still leased (chained by next) */
  size_t retired_count;
  store_journal journal;                 /* HA (ha.c): its functions NULL when off */
  store_op_count ops[STORE_COUNT_SLOTS]; /* for the metrics (store_map_stats_get) */
  uint64_t evicted_keys, evicted_bytes;
  /* --enable_offload (offload_on_evict: only objects eviction chose). */
  int offload, offload_on_evict;
  store_offload_config off_cfg;
  lru staged; /* loaded back, not promoted: in load order */
  uint8_t sketch[SKETCH_ROWS][SKETCH_WIDTH];
  uint32_t sketch_adds;
  pthread_cond_t changed; /* a task queued, a load ended (with lock) */
  int stopping;           /* store_map_stop_waits: nothing waits any more */
};

/* One item of an operation answered with st (or one request refused
 * whole), counted for the metrics. Under m->lock. */
static inline void count_op(store_map *m, unsigned slot, ferry_status st) {
  m->ops[slot].requests++;
  m->ops[slot].failures += st != FERRY_OK;
}

static inline char *key_of(object *o) { return (char *)(o->rep + o->room); }

static inline object **bucket_of(store_map *m, uint64_t hash) {
  return &m->buckets[hash & (m->bucket_count - 1)];
}

/* Which of a key's objects map_find() looks for: the committed one, any
 * pending one, or (a client's id) that writer's pending one. */
#define COMMITTED 0
#define PENDING UINT64_MAX

enum { FOR_PUTS, PAST_WATERMARK };

/* One request's eviction round: a cursor on each list (the next candidate,
 * oldest first) and what it evicted, for the log line. While it lasts the
 * lock is held and nothing but its own evictions takes objects off the
 * lists, so the cursors stay valid. */
typedef struct eviction_round {
  uint64_t now;
  int started;
  object *plain, *soft;
  size_t leased;       /* passed over for a GET's lease */
  size_t writing;      /* ... being written to their owner's disk (--enable_offload) */
  uint64_t lease_ends; /* the first of those leases to end (0: none) */
  int staged_seen;     /* the staged objects' leases counted in those */
  size_t objects[2], puts;
  const char *for_what; /* FOR_PUTS' cause in the log: NULL, "put(s) that did not fit" */
  size_t on_disk[2];    /* of those evicted, the ones left with their file */
  size_t offloading[2]; /* chosen, kept until their owner wrote them (--offload_on_evict) */
  size_t queued;        /* of those, offloads this round queued (--offload_cap_ratio's count) */
  size_t forced[2];     /* evicted without a copy: past the cap, or a full queue */
  size_t queue_full;    /* kept in memory: their owner's queue was full (no force_evict) */
  uint64_t bytes[2];
  uint64_t total, used_before, used_after; /* the pool, around a watermark eviction */
} eviction_round;

/* The bytes o holds in segments. */
static inline uint64_t footprint(const object *o) {
  return o->replicas * store_extents_round(o->size);
}

/* map.c's, for map_offload.c. All under m->lock. */
int map_journal_object(store_map *m, object *o);
int map_journal_segment(store_map *m, segment *s);
uint64_t map_free_replicas(object *o);
lru *map_list_of(store_map *m, const object *o);
void map_enlist(store_map *m, object *o);
void map_unlist(store_map *m, object *o);
uint64_t map_hash_key(const char *key, size_t len);
object **map_find(store_map *m, const char *key, size_t len, uint64_t which);
void map_grow(store_map *m);
uint64_t map_unlink_object(store_map *m, object **at);
object *map_next_victim(store_map *m, eviction_round *r);
uint64_t map_evict(store_map *m, eviction_round *r, object *o, int why);
void map_log_round(const eviction_round *r);
segment *map_find_segment(store_map *m, const char *name, size_t len);

/* map_offload.c's, for map.c (--enable_offload). All under m->lock. */
int map_offload_replica(const object *o);
segment *map_disk_owner(const object *o);
void map_queue_offload(store_map *m, object *o);
void map_queue_delete(store_map *m, object *o);
uint64_t map_to_owner_disk_only(store_map *m, object *o);
void map_unstage_ended(store_map *m, uint64_t now);
uint64_t map_load_back(store_map *m, const store_reader *keys, uint32_t count);
void map_promote(store_map *m, object *o);
ferry_status map_serve_poll(store_map *m, store_reader *r, store_writer *reply, char *why,
                            size_t size);
ferry_status map_serve_done(store_map *m, store_reader *r, uint32_t count, store_writer *reply,
                            char *why, size_t size);

#endif
