/* kind.h - memory kinds: what a region's memory is (host memory, CUDA
 * device memory, ...), which device holds it, and how its bytes are copied
 * to and from host memory. Core and the transports ask these questions
 * only through this interface, so a new accelerator (ROCm, ...) is one
 * file defining a ferry_memory_kind, listed in kind.c.
 *
 * Registration decides a region's kind once (ferry_kind_identify asks each
 * kind's driver) and the registry keeps it. A transport that can only touch
 * host memory (tcp) moves a region the CPU cannot reach through a copier:
 * pinned host bounce buffers that the kind fills and drains asynchronously
 * (staging.h pipelines them with the network). A transport that maps a
 * peer's memory (shm) imports the peer's exported allocation and copies
 * with copy_direct, with no bounce. */
#ifndef FERRY_KIND_H
#define FERRY_KIND_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

typedef enum ferry_kind_id { FERRY_KIND_HOST = 0, FERRY_KIND_CUDA = 1 } ferry_kind_id;

/* Where a region's memory lives, as its kind's driver said at registration. */
typedef struct ferry_where {
  uint8_t kind;       /* ferry_kind_id */
  uint8_t cpu_access; /* the CPU may read and write it: host, pinned, managed */
  int16_t device;     /* the device ordinal; -1: none (plain host memory) */
  uint64_t base;      /* the allocation holding it (IPC exports are per */
  uint64_t size;      /* allocation); 0, 0 where the kind does not say */
} ferry_where;

/* Most bounce buffers one copier holds. */
#define FERRY_COPIER_MAX_SLOTS 4

/* A copy engine for one device of one kind: slots pinned host bounce
 * buffers of slot_size bytes and the kind's asynchronous copies between
 * them and the device's memory. Kinds put this head first in their own. */
typedef struct ferry_copier {
  const struct ferry_memory_kind *kind;
  int device;
  unsigned slots;
  size_t slot_size;
  uint8_t *bounce[FERRY_COPIER_MAX_SLOTS];
} ferry_copier;

typedef struct ferry_memory_kind {
  const char *name; /* its location prefix: "cpu", "cuda" */
  ferry_kind_id id;
  /* Nonzero once its driver is loaded (loads it on the first call); else
   * why not in why (how ferry looked), when why is not NULL. */
  int (*available)(char *why, size_t size);
  /* What [addr, addr+length) is: FERRY_OK with *where set when it is this
   * kind's memory; FERRY_ENOTFOUND when it is not; another status, with
   * the error detail set, when the driver failed or the range is not one
   * piece of memory of this kind. */
  ferry_status (*identify)(uint64_t addr, uint64_t length, ferry_where *where);
  /* Opens a copier for device (its bounce buffers allocated). */
  ferry_status (*copier_open)(int device, unsigned slots, size_t slot_size, ferry_copier **out);
  /* Starts copying len bytes between bounce[slot] and memory of this kind
   * at addr (to_host: from the memory into the bounce buffer). Complete
   * only once copy_wait(slot) returned FERRY_OK. */
  ferry_status (*copy_start)(ferry_copier *c, unsigned slot, uint64_t addr, size_t len,
                             int to_host);
  ferry_status (*copy_wait)(ferry_copier *c, unsigned slot);
  void (*copier_close)(ferry_copier *c);
  /* A handle another process of this host can open to map the region's
   * allocation (out: up to *len bytes; *len set to the size used). NULL:
   * this kind cannot export (host memory: its peers map memfds instead).
   * *fd: -1, or a descriptor that goes with the handle (a VMM allocation's
   * POSIX fd), the caller's to pass on and close. */
  ferry_status (*export_handle)(const ferry_where *where, void *out, size_t *len, int *fd);
  /* Maps the allocation another process of this host exported with
   * export_handle (handle, len bytes, and fd, -1 if none: the caller's,
   * still open afterwards) into this process, in the primary
   * context of device; *addr gets where its first byte is. Each open is
   * closed with import_close, once no copy through it runs. NULL: this
   * kind cannot import. */
  ferry_status (*import_open)(int device, const void *handle, size_t len, int fd, uint64_t *addr);
  void (*import_close)(int device, uint64_t addr);
  /* Starts one copy of len bytes from src to dst, either of which may be
   * this kind's memory (its own or imported) or host memory, on c's device
   * (no bounce buffer): complete only once copy_wait(slot) returned
   * FERRY_OK. NULL: this kind has no such copy. */
  ferry_status (*copy_direct)(ferry_copier *c, unsigned slot, uint64_t dst, uint64_t src,
                              size_t len);
} ferry_memory_kind;

extern const ferry_memory_kind ferry_kind_host;
extern const ferry_memory_kind ferry_kind_cuda;

/* The kind of that id (host for an unknown id). */
const ferry_memory_kind *ferry_kind_get(unsigned id);
/* Asks every kind's loaded driver about [addr, addr+length); memory none
 * claims is host memory (cpu_access 1, device -1). */
ferry_status ferry_kind_identify(uint64_t addr, uint64_t length, ferry_where *where);
/* "cpu", "cuda:1": how errors and logs name a region's place. */
void ferry_where_format(const ferry_where *where, char *out, size_t size);

/* Whether a transport that touches only host memory must stage this
 * region's bytes through a copier under a ferry_config.staging mode. */
int ferry_kind_must_stage(const ferry_where *where, int staging);

/* A location string as Mooncake spells it: "cpu:0", "cuda:1", "*" (or ""
 * or NULL: any). device -1: any device of that kind. */
typedef struct ferry_location {
  const ferry_memory_kind *kind; /* NULL: any */
  int device;
} ferry_location;

/* FERRY_EINVAL naming the string and the accepted forms if malformed. */
ferry_status ferry_location_parse(const char *text, ferry_location *out);
/* FERRY_OK when the driver's answer (where) fits the location asked for
 * [addr, addr+length); else an error naming both (FERRY_EINVAL), or, for a
 * kind whose driver did not load, FERRY_ENOTIMPL saying how ferry looked. */
ferry_status ferry_location_check(const char *text, const ferry_location *loc,
                                  const ferry_where *where, uint64_t addr, uint64_t length);

/* ---- Stream order (CUDA): a transfer between two points of an
 * application's CUDA stream (core/stream.c). A fence is opened on the
 * caller's thread: an event is recorded on the stream (the work queued
 * before), and the stream is made to wait for the fence's release (the
 * work queued after): with cuStreamWaitValue32 on a word of pinned,
 * device-mapped memory where the driver supports stream memory
 * operations, else with a host function that blocks until the release.
 * The stream's own context is pushed and popped around each call. */
typedef struct ferry_stream_fence ferry_stream_fence;

/* Opens a fence on stream (a CUstream; NULL: the legacy default stream of
 * the calling thread's current context). FERRY_ENOTIMPL without a driver;
 * FERRY_EFAULT naming the call and the device when the driver refuses. */
ferry_status ferry_stream_fence_open(void *stream, ferry_stream_fence **out);
/* Blocks until the work queued on the stream before the fence completed
 * (any thread); FERRY_EFAULT naming the device if it failed. Called once
 * per fence, before or after its release: each drops its own hold. */
ferry_status ferry_stream_fence_wait(ferry_stream_fence *fence);
/* The transfer ended (landed or failed): the stream goes on. Once; no
 * CUDA call, so it may be called under a lock. The fence is freed once
 * the stream no longer needs it. */
void ferry_stream_fence_release(ferry_stream_fence *fence);
/* "cuda:0 stream 0x..." for messages. */
const char *ferry_stream_fence_name(const ferry_stream_fence *fence);

#endif
