/* vram.h - CUDA device memory for the tools (transfer_engine_bench
 * --use_vram): allocated through the CUDA driver, loaded at run time like
 * libferry loads it, so the tools need no CUDA toolkit to build. ferry
 * registers such memory with ferry_memory_register_at("cuda:N"). */
#ifndef FERRY_TOOLS_VRAM_H
#define FERRY_TOOLS_VRAM_H

#include <stddef.h>

/* Allocates size bytes on CUDA device gpu, filled with byte fill when
 * fill >= 0. Returns 0 and sets *out, or -1 with why (size bytes) saying
 * which driver call failed and the driver's words. */
int ferry_vram_alloc(int gpu, size_t size, int fill, void **out, char *why, size_t why_size);

/* Frees what ferry_vram_alloc returned. */
void ferry_vram_free(void *ptr);

#endif
