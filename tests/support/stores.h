/* stores.h - real metadata stores for the tests: Debian's redis-server and
 * etcd, started by the test on loopback ports it picks, with data under a
 * temporary folder, and killed at the end even when the test fails (every
 * child dies with the test process, and an atexit hook kills the rest). */
#ifndef FERRY_TEST_STORES_H
#define FERRY_TEST_STORES_H

#include <stdint.h>
#include <sys/types.h>

#define TEST_ETCD_MAX 3

typedef struct test_store {
  int etcd; /* 0 redis, 1 etcd */
  int members;
  pid_t pid[TEST_ETCD_MAX];
  uint16_t port[TEST_ETCD_MAX];      /* client ports */
  uint16_t peer_port[TEST_ETCD_MAX]; /* etcd peer ports */
  char dir[128];                     /* data folder, removed by stop */
  char password[64];                 /* redis requirepass, "" for none */
  char url[512];                     /* what an engine is given */
} test_store;

/* 1 when the server binary is installed (else the test skips). */
int test_store_available(int etcd);
/* Starts redis (password NULL: none) or an etcd cluster of `members` (1..3)
 * and waits until it answers. 0 or -1. */
int test_redis_start(test_store *s, const char *password);
int test_etcd_start(test_store *s, int members);
/* Waits until every member still running answers (after a kill, etcd may
 * be electing a new leader for a moment). 0 or -1. */
int test_store_wait(const test_store *s);
/* SIGKILL of member i (redis: 0), reaped. */
void test_store_kill(test_store *s, int i);
/* Starts member i again on the same ports; wipe: with an empty data folder.
 * Waits until it answers (etcd: the cluster). 0 or -1. */
int test_store_restart(test_store *s, int i, int wipe);
/* Kills every member and removes the data folder. */
void test_store_stop(test_store *s);
/* A free loopback TCP port. */
uint16_t test_free_port(void);

#endif
