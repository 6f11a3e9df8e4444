/* error.h - setting and reading the per-thread error detail.
 *
 * Every failing path calls ferry_fail() once, at the place that knows the
 * step, the peer and the cause; callers above it just pass the code up. */
#ifndef FERRY_ERROR_H
#define FERRY_ERROR_H

#include "ferry.h"

#define FERRY_ERROR_MAX 512

/* Records "fmt..." as this thread's detail and returns code. */
ferry_status ferry_fail(ferry_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Same, appending ": strerror(err)". */
ferry_status ferry_fail_errno(ferry_status code, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Replaces this thread's detail verbatim (used to carry a detail across
 * threads, from a driver to the waiter). */
void ferry_error_set_detail(const char *detail);

#endif
