/* disk.h - the store's SSD tier (docs/store.md "The SSD tier", Mooncake's
 * --root_fs_dir): one file per object in <root_fs_dir>/<cluster_id>,
 * written by the client that puts the object, from the caller's buffer,
 * before the put commits, and read by any client when the object has no
 * replica in memory left (evicted, or its segments left). The master
 * checks the directory at start, tells it to clients at REGISTER, keeps
 * per object whether its file is complete and deletes the files of
 * objects that leave the store. The directory must be the same path on
 * every client's host: a local one when all run on one host, else a
 * shared file system.
 *
 * A file is named by a hash of its key (SHA-256, 128 bits of it in hex),
 * never by the key itself, so no key reaches outside the directory. It is
 * written to a temporary name and renamed into place (a reader never sees
 * a partial file), and carries a header that a reader checks against what
 * the master recorded: magic, the key, the value's size and the crc32c of
 * key and value. No fsync: the tier is a cache that a master restart
 * forgets anyway (docs/store.md). */
#ifndef FERRY_STORE_DISK_H
#define FERRY_STORE_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "store/protocol.h"

#define STORE_DIR_MAX 1024 /* bytes of the files' directory (REGISTER's reply carries it) */
#define STORE_DISK_PATH_MAX (STORE_DIR_MAX + 96)

/* Resolves root (an existing directory), makes <root>/<cluster_id> in it
 * when missing and checks that a file can be created there; dir gets that
 * directory's absolute path. FERRY_EINVAL naming the flag, the path and
 * the cause (errno) when it cannot be used. */
ferry_status store_disk_prepare(const char *root, const char *cluster_id, char *dir, size_t size);

/* Resolves path (an existing directory a process of this user can create
 * files in) into dir, for a client's offload directory (offload.h).
 * FERRY_EINVAL naming `what`, the path and the cause (errno). */
ferry_status store_disk_own_dir(const char *what, const char *path, char *dir, size_t size);

/* The file of key in dir; -1 when OpenSSL has no memory to hash it. */
int store_disk_path(const char *dir, const char *key, size_t key_len,
                    char path[STORE_DISK_PATH_MAX]);

/* Writes key's file in dir, its value the n parts concatenated (len
 * bytes, their total): a temporary file, then renamed over the key's name.
 * FERRY_EINVAL naming the path and errno. */
ferry_status store_disk_write(const char *dir, const char *key, const ferry_store_buffer *parts,
                              size_t n, size_t len);

/* Reads key's value (len bytes: the size the master recorded) from its
 * file into the n parts, one after the other (they hold at least len
 * bytes together), header and checksum checked. FERRY_ENOTFOUND when the
 * file is missing or cannot be opened, FERRY_ECHECKSUM when it is not the
 * complete file of this key and size; each names the key and the path.
 * *bad is set when the file is gone or damaged for good (missing, wrong
 * header, size or checksum): the master should forget it. */
ferry_status store_disk_read(const char *dir, const char *key, const ferry_store_buffer *parts,
                             size_t n, size_t len, int *bad);

/* The key (NUL-terminated) and value size in the header of the file
 * `name` in dir, checked against the file's length and name (the value's
 * checksum is checked when it is read); -1 when it is not such a file. */
int store_disk_header(const char *dir, const char *name, char key[STORE_KEY_MAX + 1],
                      size_t *key_len, uint64_t *len);

/* The bytes of a file holding a value of len bytes under a key of key_len. */
size_t store_disk_file_size(size_t key_len, size_t len);

/* Deletes key's file; a file that is not there is fine. */
void store_disk_remove(const char *dir, const char *key, size_t key_len);

#endif
