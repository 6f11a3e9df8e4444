/* config.h - checking a ferry_config and the environment before an engine
 * starts (config.c), and the boolean spellings every setting accepts. */
#ifndef FERRY_CONFIG_H
#define FERRY_CONFIG_H

#include <stddef.h>

#include "ferry.h"

#define FERRY_BOOL_SPELLINGS "1, 0, true, false, yes, no, on or off"

/* Parses a boolean in any FERRY_BOOL_SPELLINGS (case-insensitive). Returns
 * 0 and sets *out, or -1. */
int ferry_parse_bool(const char *text, int *out);

/* Name of the i-th environment variable ferry reads; NULL past the last. */
const char *ferry_env_name(size_t i);
/* Checks the current value of one of them (unset or empty is fine): returns
 * FERRY_OK or FERRY_EINVAL with the message ferry_engine_create would give. */
ferry_status ferry_env_check(const char *name);

/* Copies the caller's config (of src->size bytes: an older header's struct
 * is shorter) into dst, the library's full struct, after checking every
 * environment variable and every field. Resolves the documented "0 means
 * default" fields. Returns FERRY_EINVAL naming the bad setting, its value
 * and what is accepted. */
ferry_status ferry_config_adopt(ferry_config *dst, const ferry_config *src);

#endif
