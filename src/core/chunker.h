/* chunker.h - cuts a list of transfer entries into chunks, each one data
 * frame: a large entry is sliced, runs of small entries of the same op are
 * coalesced (up to a byte budget and a segment count). Pure logic, no
 * locking: the batch serializes calls. */
#ifndef FERRY_CHUNKER_H
#define FERRY_CHUNKER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ferry.h"
#include "wire/wire.h"

/* Room for the frame header, the segment table and a checksum next to the
 * segments in one sendmsg (IOV_MAX is 1024). */
#define FERRY_CHUNK_MAX_SEGMENTS (FERRY_WIRE_MAX_SEGMENTS - 4)

typedef struct ferry_chunk {
  ferry_op op;
  uint32_t count;
  uint64_t bytes;
  int retried; /* handed out again after its rail failed (batch.c): once at most; set
                * also for one that may still land where it was (tcp.c) */
  struct iovec local[FERRY_CHUNK_MAX_SEGMENTS];
  ferry_region remote[FERRY_CHUNK_MAX_SEGMENTS];
} ferry_chunk;

typedef struct ferry_chunker {
  const ferry_entry *entries;
  size_t count;
  size_t next_entry;
  uint64_t next_offset; /* bytes of entries[next_entry] already handed out */
} ferry_chunker;

void ferry_chunker_init(ferry_chunker *c, const ferry_entry *entries, size_t count);
/* Fills chunk with at most slice_size bytes (at least 1 segment); 0 when
 * every entry has been handed out. */
int ferry_chunker_next(ferry_chunker *c, size_t slice_size, ferry_chunk *chunk);
int ferry_chunker_done(const ferry_chunker *c);
/* Hands out nothing more (the batch failed). */
void ferry_chunker_stop(ferry_chunker *c);

#endif
