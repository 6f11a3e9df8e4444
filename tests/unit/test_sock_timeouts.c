/* test_sock_timeouts.c - the socket timeouts behind a ferry_sock's
 * deadlines (net/net.c's arm_timeout). A request and its reply each set a
 * fresh deadline, or none (a server waiting for the next request): setting
 * SO_RCVTIMEO and SO_SNDTIMEO each time cost the store master four system
 * calls per request. Here every setsockopt the library makes goes through
 * __wrap_setsockopt (tests/CMakeLists.txt: --wrap=setsockopt), which counts
 * them, and the deadlines must still hold: a short deadline after a long
 * timeout ends the call in time, and a call without a deadline outlives
 * the finite timeout left from before (the peer answers only once that
 * timeout has woken the call and it was re-armed for no limit). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "base/clock.h"
#include "base/error.h"
#include "net/net.h"

#define MS 1000000ull

int __real_setsockopt(int fd, int level, int name, const void *value, socklen_t len);
int __wrap_setsockopt(int fd, int level, int name, const void *value, socklen_t len);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static unsigned receive_limits;  /* SO_RCVTIMEO set, any value */
static unsigned unlimited_armed; /* SO_RCVTIMEO set to no limit */

int __wrap_setsockopt(int fd, int level, int name, const void *value, socklen_t len) {
  if (level == SOL_SOCKET && name == SO_RCVTIMEO) {
    const struct timeval *tv = value;
    pthread_mutex_lock(&lock);
    receive_limits++;
    unlimited_armed += tv->tv_sec == 0 && tv->tv_usec == 0;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
  }
  return __real_setsockopt(fd, level, name, value, len);
}

static unsigned limits_set(void) {
  pthread_mutex_lock(&lock);
  unsigned n = receive_limits;
  pthread_mutex_unlock(&lock);
  return n;
}

typedef struct pair {
  int fd[2];
  ferry_sock end[2];
} pair;

static void pair_open(pair *p) {
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, p->fd), 0);
  ferry_sock_init(&p->end[0], p->fd[0], "client");
  ferry_sock_init(&p->end[1], p->fd[1], "server");
}

static void pair_close(pair *p) {
  close(p->fd[0]);
  close(p->fd[1]);
}

static void send_one(ferry_sock *s, uint8_t type) {
  uint8_t body[16] = {type};
  ferry_frame_header h = {.type = type, .body_len = sizeof body};
  assert_int_equal(ferry_sock_send_frame(s, &h, body, "send"), FERRY_OK);
}

static ferry_status recv_one(ferry_sock *s) {
  ferry_frame_header h;
  uint8_t body[16];
  ferry_status st = ferry_sock_recv_header(s, &h, "receive");
  if (!st)
    st = ferry_sock_recv(s, body, sizeof body, "receive");
  return st;
}

static void requests_do_not_reset_the_timeouts_each_time(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  unsigned before = limits_set();
  for (int i = 0; i < 100; i++) {
    ferry_sock_set_deadline(&p.end[0], ferry_now_ns() + 10000 * MS); /* a client's request */
    send_one(&p.end[0], FERRY_FRAME_STORE);
    ferry_sock_set_deadline(&p.end[1], 0); /* a server waits for the next request */
    assert_int_equal(recv_one(&p.end[1]), FERRY_OK);
    ferry_sock_set_deadline(&p.end[1], ferry_now_ns() + 10000 * MS); /* its reply */
    send_one(&p.end[1], FERRY_FRAME_STORE_REPLY);
    assert_int_equal(recv_one(&p.end[0]), FERRY_OK);
  }
  /* Each end sets its limit once (two calls each, one of them counted). */
  assert_in_range(limits_set() - before, 1, 4);
  pair_close(&p);
}

static void a_short_deadline_still_ends_the_call(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  ferry_sock_set_deadline(&p.end[0], ferry_now_ns() + 10000 * MS);
  send_one(&p.end[0], FERRY_FRAME_STORE); /* arms a limit of ~9 s */
  uint64_t start = ferry_now_ns();
  ferry_sock_set_deadline(&p.end[0], start + 50 * MS);
  assert_int_equal(recv_one(&p.end[0]), FERRY_ETIMEDOUT); /* nothing comes */
  assert_true(ferry_now_ns() - start < 5000 * MS);        /* not the ~9 s limit: generous */
  pair_close(&p);
}

static void *answer_once_unlimited(void *arg) {
  pair *p = arg;
  pthread_mutex_lock(&lock);
  while (!unlimited_armed)
    pthread_cond_wait(&changed, &lock);
  pthread_mutex_unlock(&lock);
  send_one(&p->end[1], FERRY_FRAME_STORE_REPLY);
  return NULL;
}

static void no_deadline_outlives_a_finite_timeout(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  ferry_sock_set_deadline(&p.end[0], ferry_now_ns() + 100 * MS);
  send_one(&p.end[0], FERRY_FRAME_STORE); /* arms a limit of ~87 ms */
  assert_int_equal(recv_one(&p.end[1]), FERRY_OK);
  pthread_mutex_lock(&lock);
  unlimited_armed = 0;
  pthread_mutex_unlock(&lock);
  pthread_t peer;
  assert_int_equal(pthread_create(&peer, NULL, answer_once_unlimited, &p), 0);
  ferry_sock_set_deadline(&p.end[0], 0);
  ferry_status st = recv_one(&p.end[0]); /* wakes at ~87 ms, re-arms, then gets the answer */
  pthread_join(peer, NULL);
  if (st)
    fail_msg("a receive without a deadline failed: %s", ferry_last_error());
  pair_close(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(requests_do_not_reset_the_timeouts_each_time),
      cmocka_unit_test(a_short_deadline_still_ends_the_call),
      cmocka_unit_test(no_deadline_outlives_a_finite_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
