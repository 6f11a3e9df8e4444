/* test_device_pool.c - a receive pool in device memory (issue 30): an
 * encoder's embedding, sent from its device memory with ferry_send over
 * tcp (staged), lands straight in the prefill's GPU pool, and ferry_recv
 * hands out the slot's device address; both engines in this process, on
 * 127.0.0.1, through the test double of the CUDA driver (support/fake_cuda,
 * whose device memory the CPU cannot touch: a CPU touch of the pool
 * crashes, a system call into it fails with EFAULT). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "cuda_double.h"
#include "ferry.h"
#include "harness.h"
#include "rig.h"

#define POOL_BYTES (4u << 20)
#define EMBEDDING (700u * 1024 + 3) /* several staging slots, odd */

/* Three embeddings in a row into one GPU pool; each received at a device
 * address inside the pool, every byte intact, the slot given back. */
static void embedding_lands_in_gpu_pool(void **state) {
  (void)state;
  cuda_double_need();
  test_rig r;
  test_rig_start(&r, test_engine_tcp(), test_engine_tcp(), 4096);
  uint8_t *pool_memory = cuda_double_alloc(POOL_BYTES), *embedding = cuda_double_alloc(EMBEDDING);
  uint8_t *want = malloc(EMBEDDING), *got = malloc(EMBEDDING);
  assert_true(want && got);
  ferry_pool *pool;
  if (ferry_pool_create(r.target, "prefill", pool_memory, POOL_BYTES, &pool))
    fail_msg("pool over device memory: %s", ferry_last_error());
  assert_int_equal(ferry_memory_register_at(r.initiator, embedding, EMBEDDING, "cuda:0"), FERRY_OK);
  for (uint64_t i = 0; i < 3; i++) {
    test_fill_random(want, EMBEDDING, 100 + i);
    cuda_double_put(embedding, want, EMBEDDING);
    if (ferry_send(r.initiator, r.name, "prefill", "req", 3, embedding, EMBEDDING, -1, 0))
      fail_msg("send %llu: %s", (unsigned long long)i, ferry_last_error());
    ferry_message m;
    if (ferry_recv(r.target, pool, "req", 3, TEST_SETUP_MS, &m))
      fail_msg("recv %llu: %s", (unsigned long long)i, ferry_last_error());
    assert_int_equal(m.length, EMBEDDING);
    assert_true((uint8_t *)m.addr >= pool_memory &&
                (uint8_t *)m.addr + m.length <= pool_memory + POOL_BYTES);
    cuda_double_get(got, m.addr, EMBEDDING);
    assert_memory_equal(got, want, EMBEDDING);
    assert_int_equal(ferry_pool_release(r.target, pool, m.slot), FERRY_OK);
  }
  cuda_double_no_context();
  assert_int_equal(ferry_pool_destroy(r.target, pool), FERRY_OK);
  test_rig_stop(&r);
  cuda_double_free(pool_memory);
  cuda_double_free(embedding);
  free(want);
  free(got);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(embedding_lands_in_gpu_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
