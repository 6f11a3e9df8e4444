/* staging.h - the staging pipeline: the bytes of memory a transport cannot
 * touch (device memory; under FERRY_STAGING=always any memory) move
 * through the bounce buffers of their kind's copier (kind.h), a slice at a
 * time, with the kind's copy of one slice overlapping the network transfer
 * of the one before: sending, the copy of slice n+1 out of the memory runs
 * while slice n is sent; receiving, the copy of slice n into the memory
 * runs while slice n+1 is received. A receive returns only once every copy
 * into the memory completed: done means landed.
 *
 * One stager per connection (a channel, a server connection), used by one
 * thread at a time; its copiers are opened on first use, one per device. */
#ifndef FERRY_STAGING_H
#define FERRY_STAGING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ferry.h"
#include "memory/kind.h"
#include "memory/registry.h"

#define FERRY_STAGE_SLOT (256u * 1024u) /* bytes per bounce buffer */
#define FERRY_STAGE_SLOTS 3             /* bounce buffers in flight per connection */

typedef struct ferry_stager ferry_stager;

/* One range of memory to move, and where it lives. */
typedef struct ferry_stage_range {
  uint64_t addr;
  size_t len;
  ferry_where where;
} ferry_stage_range;

/* Moves len bytes at buf over the network (a send or a receive). */
typedef ferry_status (*ferry_stage_move)(void *arg, void *buf, size_t len);

/* NULL when out of memory. */
ferry_stager *ferry_stager_create(void);
void ferry_stager_destroy(ferry_stager *s);

/* Fills out[0..count) from iov with where each range lives (the registry's
 * record; memory it does not hold: asked of the drivers). Returns nonzero
 * when staging (a FERRY_STAGING_* mode) must move them: then all of them
 * go through the pipeline, each through its own kind's copier. */
int ferry_stage_plan(ferry_registry *registry, const struct iovec *iov, unsigned count, int staging,
                     ferry_stage_range *out);

/* Sends the ranges' bytes in order through move, copied out of the memory
 * into bounce buffers. A failed copy fails the call: the frame is then cut
 * short, so the caller must end the connection. */
ferry_status ferry_stage_out(ferry_stager *s, const ferry_stage_range *ranges, unsigned count,
                             ferry_stage_move move, void *arg);

/* Receives the ranges' bytes in order through move into bounce buffers and
 * copies them into the memory; returns once every copy started has ended.
 * A failed copy (*copy_status, with the error detail) stops the copies but
 * not the receiving, so the stream stays in step; the return value is the
 * network's status. */
ferry_status ferry_stage_in(ferry_stager *s, const ferry_stage_range *ranges, unsigned count,
                            ferry_stage_move move, void *arg, ferry_status *copy_status);

#endif
