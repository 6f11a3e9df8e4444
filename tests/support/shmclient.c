/* shmclient.c - see shmclient.h. */
#include "shmclient.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int listed(char (*names)[SHMC_NAME_MAX], int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0)
      return 1;
  return 0;
}

int shmc_names(pid_t pid, char (*names)[SHMC_NAME_MAX], int max) {
  FILE *f = fopen("/proc/net/unix", "r");
  if (!f)
    return 0;
  char prefix[32], line[512];
  snprintf(prefix, sizeof prefix, "@ferry-%d-", (int)pid);
  int n = 0;
  while (n < max && fgets(line, sizeof line, f)) {
    char *name = strstr(line, prefix);
    if (!name)
      continue;
    name[strcspn(name, "\n")] = '\0';
    if (strlen(name) < SHMC_NAME_MAX && !listed(names, n, name)) /* accepted ones repeat it */
      snprintf(names[n++], SHMC_NAME_MAX, "%s", name);
  }
  fclose(f);
  return n;
}

int shmc_find(pid_t pid, char (*before)[SHMC_NAME_MAX], int nbefore, char *path, size_t size) {
  char names[SHMC_NAMES_MAX][SHMC_NAME_MAX];
  int n = shmc_names(pid, names, SHMC_NAMES_MAX), found = -1;
  for (int i = 0; i < n; i++) {
    if (listed(before, nbefore, names[i]))
      continue;
    if (found >= 0)
      return -1;
    found = i;
  }
  if (found < 0 || strlen(names[found]) >= size)
    return -1;
  snprintf(path, size, "%s", names[found]);
  return 0;
}

int shmc_connect(shmc *c, const char *path) {
  memset(c, 0, sizeof *c);
  c->table_fd = c->slots_fd = -1;
  struct sockaddr_un sa;
  unsigned len;
  if (shm_sockaddr(path, &sa, &len) != 0)
    return -EINVAL;
  c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct timeval tv = {10, 0}; /* a test never waits forever */
  if (c->fd < 0 || setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
      connect(c->fd, (struct sockaddr *)&sa, len) < 0)
    return -errno;
  int rc = shm_msg_recv(c->fd, &c->greeting, SHM_GREETING, NULL, NULL, 0);
  return rc ? rc : c->greeting.status;
}

int shmc_attach(shmc *c) {
  shm_msg m;
  shm_msg_init(&m, SHM_HELLO);
  int fds[SHM_MAX_FDS], nfds = 0;
  int rc = shm_msg_send(c->fd, &m, NULL, 0, 0);
  if (!rc)
    rc = shm_msg_recv(c->fd, &m, SHM_ATTACH, fds, &nfds, 0);
  if (rc)
    return rc;
  if (m.status || nfds != 2) {
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    return m.status ? m.status : -EPROTO;
  }
  c->table_fd = fds[0];
  c->slots_fd = fds[1];
  void *t = mmap(NULL, SHM_TABLE_BYTES, PROT_READ, MAP_SHARED, c->table_fd, 0);
  void *s = mmap(NULL, SHM_SLOTS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, c->slots_fd, 0);
  c->table = t == MAP_FAILED ? NULL : t;
  c->slots = s == MAP_FAILED ? NULL : s;
  return c->table && c->slots ? 0 : -ENOMEM;
}

int shmc_map(shmc *c, uint64_t ino, uint64_t addr, uint64_t length, int *fd) {
  shm_msg m;
  shm_msg_init(&m, SHM_MAP);
  m.ino = ino;
  m.addr = addr;
  m.length = length;
  int fds[SHM_MAX_FDS], nfds = 0;
  *fd = -1;
  int rc = shm_msg_send(c->fd, &m, NULL, 0, 0);
  if (!rc)
    rc = shm_msg_recv(c->fd, &m, SHM_MAPPED, fds, &nfds, 0);
  if (rc)
    return rc;
  for (int i = 0; i < nfds; i++) {
    if (i == 0 && !m.status)
      *fd = fds[0];
    else
      close(fds[i]);
  }
  return m.status ? m.status : *fd >= 0 ? 0 : -EPROTO;
}

int shmc_entry(const shmc *c, uint64_t addr, shm_table_entry *out) {
  for (uint64_t i = 0; i < c->table->count && i < SHM_TABLE_CAPACITY; i++) {
    const shm_table_entry *e = &c->table->entries[i];
    if (addr >= e->addr && addr - e->addr < e->length) {
      *out = *e;
      return 1;
    }
  }
  return 0;
}

int shmc_closed_by_peer(const shmc *c, int timeout_ms) {
  struct pollfd p = {c->fd, POLLRDHUP, 0};
  return poll(&p, 1, timeout_ms) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

void shmc_close(shmc *c) {
  if (c->table)
    munmap((void *)c->table, SHM_TABLE_BYTES);
  if (c->slots)
    munmap(c->slots, SHM_SLOTS_BYTES);
  int fds[] = {c->fd, c->table_fd, c->slots_fd};
  for (size_t i = 0; i < 3; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  memset(c, 0, sizeof *c);
  c->fd = c->table_fd = c->slots_fd = -1;
}
