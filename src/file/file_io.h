/* file_io.h - one file as a transfer's far side (FILE memory, ferry.h's
 * ferry_file_*): the caller's descriptor checked and duplicated, an
 * O_DIRECT descriptor beside it where the file system takes one, and
 * ranged reads and writes that complete in full or fail naming the file,
 * the range and the cause.
 *
 * Why two descriptors: O_DIRECT skips the page cache (KV blocks offloaded
 * to NVMe are read back once, and caching them evicts what the host needs),
 * but it takes only ranges whose offset, length and memory are aligned to
 * the file system's block. An operation that is not aligned goes through
 * the buffered descriptor instead of failing. Linux keeps the two coherent:
 * a direct read writes back dirty cached pages of its range first, a direct
 * write drops them. */
#ifndef FERRY_FILE_IO_H
#define FERRY_FILE_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ferry.h"

#define FERRY_FILE_PATH_MAX 256 /* of the path kept for messages (cut beyond) */

typedef struct ferry_file_io {
  int caller_fd;   /* the number the caller registered, for messages */
  int buffered_fd; /* through the page cache; -1 where none could be had */
  int direct_fd;   /* O_DIRECT; -1 where the file system refuses it */
  int readable, writable;
  int block_device;
  size_t mem_align; /* O_DIRECT: of each buffer's address */
  size_t off_align; /* O_DIRECT: of the offset and of each buffer's length */
  char path[FERRY_FILE_PATH_MAX];
  char direct_why[128]; /* why direct_fd is -1 */
  int fell_back;        /* an aligned operation was refused by O_DIRECT (logged once) */
} ferry_file_io;

/* Checks fd (open, not O_PATH, a regular file or a block device, not
 * O_APPEND where writable: pwritev would append instead of writing at the
 * offset) and sets f up: a duplicate of fd, and unless buffered_only an
 * O_DIRECT descriptor reopened through /proc/self/fd. FERRY_EINVAL naming
 * fd, its path and the cause; nothing to close on failure. */
ferry_status ferry_file_io_open(ferry_file_io *f, int fd, int buffered_only);
void ferry_file_io_close(ferry_file_io *f);

/* Moves bytes (the sum of iov's lengths, iovcnt at most IOV_MAX) between
 * memory and the file at offset: READ file -> memory, WRITE memory ->
 * file, in full. iov is consumed (advanced over what moved). A READ that
 * meets the end of file fails with FERRY_EIO naming where it ends; any
 * system call error with FERRY_EIO (FERRY_EFAULT for memory the kernel
 * cannot reach) naming the file, the range and errno. */
ferry_status ferry_file_io_move(ferry_file_io *f, ferry_op op, struct iovec *iov, int iovcnt,
                                uint64_t offset, uint64_t bytes);

/* fdatasync: what was written is on the device. FERRY_EIO naming the file. */
ferry_status ferry_file_io_sync(ferry_file_io *f);

/* "file PATH (fd N)", for messages. */
const char *ferry_file_io_name(const ferry_file_io *f, char *buf, size_t size);

#endif
