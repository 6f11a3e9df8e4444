/* disk.c - the SSD tier's files (disk.h): the directory's check, a key's
 * file name, and writing and reading one object's file with plain
 * pwritev/preadv, straight from or into the caller's buffers (a value of
 * several buffers is their concatenation).
 *
 * A file: a 24-byte header, the key, the value.
 *   "ferrykv1" | u16 key length | u16 0 | u32 crc32c(key, value) | u64 value size
 * (little-endian). A reader knows the key and the size from the master and
 * checks every field, the file's length and the checksum: a torn file (a
 * crash before the page cache reached the disk), another key's file (a
 * hash collision, a stray copy) or damaged bytes are refused, never
 * returned as the value. */
#include "store/disk.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/error.h"
#include "net/auth.h"
#include "store/protocol.h"
#include "wire/wire.h"

#ifndef IOV_MAX
#define IOV_MAX 1024 /* POSIX's least; Linux's */
#endif

#define MAGIC "ferrykv1"
#define HEADER 24
#define CLUSTER_ID_MAX 255

/* ---- the directory -------------------------------------------------------------------------- */

static ferry_status unusable(const char *root, const char *path, int err, const char *what) {
  return ferry_fail_errno(FERRY_EINVAL, err,
                          "--root_fs_dir=%s: %s %s (the master must be able to create files there)",
                          root, path, what);
}

static int bad_cluster_id(const char *id) {
  size_t len = strlen(id);
  return len == 0 || len > CLUSTER_ID_MAX || strchr(id, '/') || !strcmp(id, ".") ||
         !strcmp(id, "..");
}

/* A file created and deleted in dir: the master can write there. */
static int probe(const char *dir) {
  char path[STORE_DISK_PATH_MAX];
  snprintf(path, sizeof path, "%s/.probe.%016llx", dir, (unsigned long long)ferry_random_u64());
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return -1;
  close(fd);
  unlink(path);
  return 0;
}

ferry_status store_disk_prepare(const char *root, const char *cluster_id, char *dir, size_t size) {
  if (!root || !*root)
    return ferry_fail(FERRY_EINVAL, "--root_fs_dir: an empty path");
  if (bad_cluster_id(cluster_id))
    return ferry_fail(FERRY_EINVAL,
                      "--cluster_id=%s: a directory name of 1 to %d bytes without '/', not . or ..",
                      cluster_id, CLUSTER_ID_MAX);
  char real[PATH_MAX];
  struct stat st;
  if (!realpath(root, real))
    return unusable(root, root, errno, "cannot be resolved");
  if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode))
    return unusable(root, real, ENOTDIR, "is not a directory");
  size_t need = strlen(real) + 1 + strlen(cluster_id) + 1;
  if (need > size || need > STORE_DIR_MAX)
    return ferry_fail(FERRY_EINVAL, "--root_fs_dir=%s: with --cluster_id=%s, more than %d bytes",
                      root, cluster_id, STORE_DIR_MAX - 1);
  snprintf(dir, size, "%s%s%s", real, strcmp(real, "/") ? "/" : "", cluster_id);
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return unusable(root, dir, errno, "cannot be created");
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return unusable(root, dir, ENOTDIR, "is not a directory");
  if (probe(dir) != 0)
    return unusable(root, dir, errno, "is not writable");
  return FERRY_OK;
}

ferry_status store_disk_own_dir(const char *what, const char *path, char *dir, size_t size) {
  char real[PATH_MAX];
  struct stat st;
  if (!path || !*path)
    return ferry_fail(FERRY_EINVAL, "%s: an empty path", what);
  if (!realpath(path, real))
    return ferry_fail_errno(FERRY_EINVAL, errno, "%s=%s cannot be resolved", what, path);
  if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode))
    return ferry_fail_errno(FERRY_EINVAL, ENOTDIR, "%s=%s: %s is not a directory", what, path,
                            real);
  if (strlen(real) >= size || strlen(real) >= STORE_DIR_MAX)
    return ferry_fail(FERRY_EINVAL, "%s=%s: more than %d bytes", what, path, STORE_DIR_MAX - 1);
  if (probe(real) != 0)
    return ferry_fail_errno(FERRY_EINVAL, errno,
                            "%s=%s: %s is not writable (this client must be able to create files "
                            "there)",
                            what, path, real);
  snprintf(dir, size, "%s", real);
  return FERRY_OK;
}

/* ---- names ---------------------------------------------------------------------------------- */

int store_disk_path(const char *dir, const char *key, size_t key_len,
                    char path[STORE_DISK_PATH_MAX]) {
  uint8_t digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!EVP_Digest(key, key_len, digest, &n, EVP_sha256(), NULL) || n < 16)
    return -1; /* OpenSSL out of memory */
  char hex[33];
  for (int i = 0; i < 16; i++)
    snprintf(hex + 2 * i, 3, "%02x", digest[i]);
  snprintf(path, STORE_DISK_PATH_MAX, "%s/%s.kv", dir, hex);
  return 0;
}

static ferry_status no_name(const char *key) {
  return ferry_fail(FERRY_ENOMEM, "store: no memory to name the file of \"%s\"", key);
}

/* ---- one file ------------------------------------------------------------------------------- */

static void put_le(uint8_t *at, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; i++)
    at[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++)
    v |= (uint64_t)at[i] << (8 * i);
  return v;
}

/* The crc32c of key and value, the value being parts' bytes up to len. */
static uint32_t value_crc(const char *key, size_t key_len, const ferry_store_buffer *parts,
                          size_t n, size_t len) {
  uint32_t crc = ferry_crc32c(0, key, key_len);
  for (size_t i = 0; i < n && len; i++) {
    size_t k = parts[i].length < len ? parts[i].length : len;
    crc = ferry_crc32c(crc, parts[i].buf, k);
    len -= k;
  }
  return crc;
}

static void header_of(uint8_t h[HEADER], const char *key, size_t key_len, uint32_t crc,
                      size_t len) {
  memcpy(h, MAGIC, 8);
  put_le(h + 8, key_len, 2);
  put_le(h + 10, 0, 2);
  put_le(h + 12, crc, 4);
  put_le(h + 16, len, 8);
}

/* iov[0..2) given, then parts' bytes up to len (a get's buffers may hold
 * more than the value); malloc'd, NULL without memory. *count gets its
 * entries. */
static struct iovec *value_iov(const struct iovec head[2], const ferry_store_buffer *parts,
                               size_t n, size_t len, int *count) {
  if (n > (size_t)INT_MAX - 2)
    return NULL;
  struct iovec *iov = malloc((n + 2) * sizeof *iov);
  if (!iov)
    return NULL;
  iov[0] = head[0];
  iov[1] = head[1];
  int k = 2;
  for (size_t i = 0; i < n && len; i++) {
    size_t part = parts[i].length < len ? parts[i].length : len;
    iov[k++] = (struct iovec){parts[i].buf, part};
    len -= part;
  }
  *count = k;
  return iov;
}

/* preadv / pwritev until every byte of iov moved (they may move fewer).
 * -1 with errno, or 0 with errno 0 when the file ended first. */
static int move_all(int fd, struct iovec *iov, int n, int writing) {
  off_t at = 0;
  while (n > 0) {
    int some = n < IOV_MAX ? n : IOV_MAX; /* more is EINVAL */
    ssize_t done = writing ? pwritev(fd, iov, some, at) : preadv(fd, iov, some, at);
    if (done < 0 && errno == EINTR)
      continue;
    if (done <= 0) {
      if (done == 0)
        errno = 0;
      return -1;
    }
    at += done;
    while (n > 0 && (size_t)done >= iov->iov_len) {
      done -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + done;
      iov->iov_len -= (size_t)done;
    }
  }
  return 0;
}

ferry_status store_disk_write(const char *dir, const char *key, const ferry_store_buffer *parts,
                              size_t n, size_t len) {
  size_t key_len = strlen(key);
  char path[STORE_DISK_PATH_MAX], temp[STORE_DISK_PATH_MAX + 32];
  if (store_disk_path(dir, key, key_len, path) != 0)
    return no_name(key);
  snprintf(temp, sizeof temp, "%s.tmp.%016llx", path, (unsigned long long)ferry_random_u64());
  uint8_t h[HEADER];
  header_of(h, key, key_len, value_crc(key, key_len, parts, n, len), len);
  const struct iovec head[2] = {{h, HEADER}, {(void *)key, key_len}};
  int count = 0;
  struct iovec *iov = value_iov(head, parts, n, len, &count);
  if (!iov)
    return ferry_fail(FERRY_ENOMEM, "store: no memory to write the file of \"%s\"", key);
  int fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  int err = fd < 0 ? errno : 0;
  if (!err && move_all(fd, iov, count, 1) != 0)
    err = errno ? errno : EIO;
  free(iov);
  if (fd >= 0 && close(fd) != 0 && !err)
    err = errno;
  if (!err && rename(temp, path) != 0)
    err = errno;
  if (err) {
    unlink(temp);
    return ferry_fail_errno(FERRY_EINVAL, err, "store: cannot write the file of \"%s\" (%s)", key,
                            fd < 0 ? temp : path);
  }
  return FERRY_OK;
}

ferry_status store_disk_read(const char *dir, const char *key, const ferry_store_buffer *parts,
                             size_t n, size_t len, int *bad) {
  size_t key_len = strlen(key);
  char path[STORE_DISK_PATH_MAX];
  *bad = 0;
  if (store_disk_path(dir, key, key_len, path) != 0)
    return no_name(key);
  if (key_len > STORE_KEY_MAX)
    return ferry_fail(FERRY_EINVAL, "store: a key of %zu bytes has no file", key_len);
  uint8_t head[HEADER + STORE_KEY_MAX];
  const struct iovec first[2] = {{head, HEADER}, {head + HEADER, key_len}};
  int count = 0;
  struct iovec *iov = value_iov(first, parts, n, len, &count);
  if (!iov)
    return ferry_fail(FERRY_ENOMEM, "store: no memory to read the file of \"%s\"", key);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *bad = errno == ENOENT;
    free(iov);
    return ferry_fail_errno(FERRY_ENOTFOUND, errno,
                            "store: \"%s\" is on disk only and its file %s cannot be opened", key,
                            path);
  }
  struct stat st = {0};
  const char *wrong = NULL;
  uint64_t want = HEADER + key_len + len;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != want)
    wrong = "its length is not the header's, the key's and the value's";
  else if (move_all(fd, iov, count, 0) != 0)
    wrong = "it cannot be read whole";
  close(fd);
  free(iov);
  if (!wrong && memcmp(head, MAGIC, 8) != 0)
    wrong = "it has no ferry header";
  else if (!wrong && (get_le(head + 8, 2) != key_len || memcmp(head + HEADER, key, key_len) ||
                      get_le(head + 16, 8) != len))
    wrong = "it holds another key or size";
  else if (!wrong && get_le(head + 12, 4) != value_crc(key, key_len, parts, n, len))
    wrong = "its checksum does not match";
  if (!wrong)
    return FERRY_OK;
  *bad = 1;
  return ferry_fail(FERRY_ECHECKSUM,
                    "store: the file of \"%s\" (%zu bytes) is damaged or foreign: %s (%s, %llu "
                    "bytes); the store forgets it",
                    key, len, wrong, path, (unsigned long long)st.st_size);
}

int store_disk_header(const char *dir, const char *name, char key[STORE_KEY_MAX + 1],
                      size_t *key_len, uint64_t *len) {
  char path[STORE_DISK_PATH_MAX], own[STORE_DISK_PATH_MAX];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
    return -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  uint8_t head[HEADER + STORE_KEY_MAX];
  struct stat st = {0};
  ssize_t got = fstat(fd, &st) == 0 ? pread(fd, head, sizeof head, 0) : -1;
  close(fd);
  if (got < HEADER || memcmp(head, MAGIC, 8) != 0)
    return -1;
  *key_len = (size_t)get_le(head + 8, 2);
  *len = get_le(head + 16, 8);
  if (*key_len == 0 || *key_len > STORE_KEY_MAX || (size_t)got < HEADER + *key_len ||
      (uint64_t)st.st_size != HEADER + *key_len + *len)
    return -1;
  memcpy(key, head + HEADER, *key_len);
  key[*key_len] = 0;
  /* Its name must be its key's: a file renamed by hand is not this key's. */
  if (store_disk_path(dir, key, *key_len, own) != 0 || strcmp(own, path) != 0)
    return -1;
  return 0;
}

size_t store_disk_file_size(size_t key_len, size_t len) { return HEADER + key_len + len; }

void store_disk_remove(const char *dir, const char *key, size_t key_len) {
  char path[STORE_DISK_PATH_MAX];
  if (store_disk_path(dir, key, key_len, path) == 0)
    unlink(path);
}
