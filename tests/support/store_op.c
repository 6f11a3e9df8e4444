/* store_op.c - a store put or get on a thread of its own (store_op.h). */
#include "store_op.h"

#include <stdio.h>

#include <setjmp.h>
#include <stdarg.h>

#include <cmocka.h>

static void *op_main(void *arg) {
  test_store_op *op = arg;
  size_t got;
  op->status = op->put ? ferry_store_put_from(op->store, op->key, op->buf, op->len, &op->rep)
                       : ferry_store_get_into(op->store, op->key, op->buf, op->len, &got);
  snprintf(op->detail, sizeof op->detail, "%s", ferry_last_error());
  return NULL;
}

void test_store_op_start(test_store_op *op) {
  assert_int_equal(pthread_create(&op->thread, NULL, op_main, op), 0);
}

void test_store_op_join(test_store_op *op) { assert_int_equal(pthread_join(op->thread, NULL), 0); }
