/* chunker.c - see chunker.h. */
#include "chunker.h"

void ferry_chunker_init(ferry_chunker *c, const ferry_entry *entries, size_t count) {
  c->entries = entries;
  c->count = count;
  c->next_entry = 0;
  c->next_offset = 0;
}

int ferry_chunker_done(const ferry_chunker *c) { return c->next_entry >= c->count; }

void ferry_chunker_stop(ferry_chunker *c) { c->next_entry = c->count; }

int ferry_chunker_next(ferry_chunker *c, size_t slice_size, ferry_chunk *chunk) {
  chunk->count = 0;
  chunk->bytes = 0;
  chunk->retried = 0;
  while (!ferry_chunker_done(c) && chunk->count < FERRY_CHUNK_MAX_SEGMENTS &&
         chunk->bytes < slice_size) {
    const ferry_entry *en = &c->entries[c->next_entry];
    if (chunk->count && en->op != chunk->op)
      break; /* one op per frame */
    uint64_t take = en->length - c->next_offset;
    if (take > slice_size - chunk->bytes)
      take = slice_size - chunk->bytes;
    uint32_t i = chunk->count++;
    chunk->op = en->op;
    chunk->local[i].iov_base = (char *)en->local + c->next_offset;
    chunk->local[i].iov_len = (size_t)take;
    chunk->remote[i].addr = en->remote + c->next_offset;
    chunk->remote[i].length = take;
    chunk->bytes += take;
    c->next_offset += take;
    if (c->next_offset == en->length) {
      c->next_entry++;
      c->next_offset = 0;
    }
  }
  return chunk->count > 0;
}
