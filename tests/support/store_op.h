/* store_op.h - a store put or get on a thread of its own, for the store
 * tests that act while the call is in the middle of its transfers (cut a
 * link, restart the master) and then check how it ended and its error. */
#ifndef FERRY_TEST_STORE_OP_H
#define FERRY_TEST_STORE_OP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "ferry.h"

typedef struct test_store_op {
  pthread_t thread;
  ferry_store *store;
  int put; /* ferry_store_put_from with rep, else ferry_store_get_into */
  const char *key;
  uint8_t *buf;
  size_t len;
  ferry_store_replicate rep;
  ferry_status status;          /* set when the call returns */
  char detail[FERRY_ERROR_MAX]; /* its ferry_last_error() */
} test_store_op;

/* Starts the call on a new thread (asserts, cmocka). */
void test_store_op_start(test_store_op *op);
/* Waits until it returned (asserts); then status and detail are set. */
void test_store_op_join(test_store_op *op);

#endif
