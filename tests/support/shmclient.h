/* shmclient.h - a hand-driven client of a target's shm service, for tests
 * that act as a hostile or careless same-host process would: connect from
 * another user, sit idle, scribble on the slots page, reopen the table,
 * resize a buffer it mapped. */
#ifndef FERRY_TEST_SHMCLIENT_H
#define FERRY_TEST_SHMCLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport/shm.h"

typedef struct shmc {
  int fd;
  shm_msg greeting;
  int table_fd, slots_fd;
  const shm_table *table; /* mapped read-only after shmc_attach */
  uint64_t *slots;        /* mapped read-write after shmc_attach */
} shmc;

#define SHMC_NAME_MAX 108
#define SHMC_NAMES_MAX 16

/* The abstract names of the shm services process pid runs, as any local
 * process can find them in /proc/net/unix; returns how many (at most max). */
int shmc_names(pid_t pid, char (*names)[SHMC_NAME_MAX], int max);
/* The name of pid's only shm service, or (with before, from shmc_names)
 * the one name not in before. 0, or -1 when there is not exactly one. */
int shmc_find(pid_t pid, char (*before)[SHMC_NAME_MAX], int nbefore, char *path, size_t size);
/* Connects and reads the greeting: 0, the greeting's refusal status, or
 * -errno (a receive never waits more than 10 s). */
int shmc_connect(shmc *c, const char *path);
/* HELLO without a proof; 0 once the table and slots are mapped, else the
 * refusal status or -errno. */
int shmc_attach(shmc *c);
/* MAP of the buffer with this inode holding [addr, addr+length): the reply
 * status (0: *fd gets the memfd) or -errno. */
int shmc_map(shmc *c, uint64_t ino, uint64_t addr, uint64_t length, int *fd);
/* The table entry holding addr (copied), or 0 when none does. */
int shmc_entry(const shmc *c, uint64_t addr, shm_table_entry *out);
/* Nonzero when the service closed the connection within timeout_ms. */
int shmc_closed_by_peer(const shmc *c, int timeout_ms);
void shmc_close(shmc *c);

#endif
