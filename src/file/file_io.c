/* file_io.c - see file_io.h. */
#include "file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"

/* Where the kernel does not say (no STATX_DIOALIGN: kernels before 6.1,
 * some file systems), a page: what every file system that takes O_DIRECT
 * accepts. */
#define DEFAULT_ALIGN 4096u

const char *ferry_file_io_name(const ferry_file_io *f, char *buf, size_t size) {
  snprintf(buf, size, "file %s (fd %d)", f->path, f->caller_fd);
  return buf;
}

static const char *op_name(ferry_op op) { return op == FERRY_OP_READ ? "READ" : "WRITE"; }

/* The path behind fd, as /proc/self/fd shows it ("(unknown path)" where it
 * cannot be read). */
static void path_of(int fd, char *out, size_t size) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, out, size - 1);
  if (n < 0)
    snprintf(out, size, "(unknown path)");
  else
    out[n] = 0;
}

static const char *type_name(mode_t mode) {
  return S_ISDIR(mode)    ? "directory"
         : S_ISCHR(mode)  ? "character device"
         : S_ISFIFO(mode) ? "pipe"
         : S_ISSOCK(mode) ? "socket"
         : S_ISLNK(mode)  ? "symbolic link"
                          : "special file";
}

/* The O_DIRECT alignment of f's file: the kernel's answer (statx), the
 * logical block size of a block device, else DEFAULT_ALIGN. 0 when the
 * kernel says the file takes no direct I/O. */
static int direct_alignment(ferry_file_io *f) {
  struct statx sx;
  if (statx(f->buffered_fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN)) {
    f->mem_align = sx.stx_dio_mem_align;
    f->off_align = sx.stx_dio_offset_align;
    return f->mem_align && f->off_align;
  }
  int sector = 0;
  if (f->block_device && ioctl(f->buffered_fd, BLKSSZGET, &sector) == 0 && sector > 0)
    f->mem_align = f->off_align = (size_t)sector;
  else
    f->mem_align = f->off_align = DEFAULT_ALIGN;
  return 1;
}

/* A second open file description of the same file, through /proc/self/fd
 * (so a file unlinked since still works), with O_DIRECT set or cleared. */
static int reopen(int fd, int accmode, int direct) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  return open(link, accmode | O_CLOEXEC | (direct ? O_DIRECT : 0));
}

/* The descriptors: the caller's duplicated for the one its flags make it
 * (buffered, or direct when the caller opened it O_DIRECT), the other
 * reopened. */
static void open_descriptors(ferry_file_io *f, int fd, int flags, int buffered_only) {
  int accmode = flags & O_ACCMODE;
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (flags & O_DIRECT) {
    f->direct_fd = dup_fd;
    f->buffered_fd = reopen(fd, accmode, 0); /* -1: unaligned operations fail */
    return;
  }
  f->buffered_fd = dup_fd;
  if (buffered_only) {
    snprintf(f->direct_why, sizeof f->direct_why, "buffered I/O was asked for");
    return;
  }
  if (!direct_alignment(f)) {
    snprintf(f->direct_why, sizeof f->direct_why, "the file system takes no direct I/O (statx)");
    return;
  }
  f->direct_fd = reopen(fd, accmode, 1);
  if (f->direct_fd < 0)
    snprintf(f->direct_why, sizeof f->direct_why, "open with O_DIRECT failed: %s", strerror(errno));
}

ferry_status ferry_file_io_open(ferry_file_io *f, int fd, int buffered_only) {
  memset(f, 0, sizeof *f);
  f->caller_fd = fd;
  f->buffered_fd = f->direct_fd = -1;
  int flags = fd < 0 ? -1 : fcntl(fd, F_GETFL);
  if (flags < 0)
    return ferry_fail(FERRY_EINVAL, "register file: fd %d is not an open file descriptor: %s", fd,
                      strerror(fd < 0 ? EBADF : errno));
  path_of(fd, f->path, sizeof f->path);
  char name[FERRY_FILE_PATH_MAX + 32];
  ferry_file_io_name(f, name, sizeof name);
  struct stat st;
  if (flags & O_PATH)
    return ferry_fail(FERRY_EINVAL,
                      "register %s: opened with O_PATH, which reads and writes "
                      "nothing",
                      name);
  if (fstat(fd, &st) != 0)
    return ferry_fail(FERRY_EINVAL, "register %s: fstat failed: %s", name, strerror(errno));
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
    return ferry_fail(FERRY_EINVAL, "register %s: a %s, not a regular file or block device", name,
                      type_name(st.st_mode));
  int accmode = flags & O_ACCMODE;
  f->readable = accmode != O_WRONLY;
  f->writable = accmode != O_RDONLY;
  if (f->writable && (flags & O_APPEND))
    return ferry_fail(FERRY_EINVAL,
                      "register %s: opened with O_APPEND, where a WRITE would append "
                      "instead of writing at its offset (open it without O_APPEND)",
                      name);
  f->block_device = S_ISBLK(st.st_mode);
  if (!f->mem_align)
    f->mem_align = f->off_align = DEFAULT_ALIGN;
  open_descriptors(f, fd, flags, buffered_only);
  if (f->buffered_fd < 0 && f->direct_fd < 0)
    return ferry_fail(FERRY_EINVAL, "register %s: cannot duplicate the descriptor: %s", name,
                      strerror(errno));
  if (f->direct_fd >= 0)
    FERRY_DEBUG("%s registered: O_DIRECT for operations aligned to %zu bytes (memory %zu), "
                "buffered I/O for the others",
                name, f->off_align, f->mem_align);
  else if (buffered_only)
    FERRY_DEBUG("%s registered with buffered I/O, as asked", name);
  else
    FERRY_INFO("%s registered with buffered I/O: no O_DIRECT (%s)", name, f->direct_why);
  return FERRY_OK;
}

void ferry_file_io_close(ferry_file_io *f) {
  if (f->buffered_fd >= 0)
    close(f->buffered_fd);
  if (f->direct_fd >= 0)
    close(f->direct_fd);
  f->buffered_fd = f->direct_fd = -1;
}

/* Whether an operation may take the O_DIRECT descriptor. */
static int direct_fits(const ferry_file_io *f, const struct iovec *iov, int iovcnt,
                       uint64_t offset) {
  if (f->direct_fd < 0 || offset % f->off_align)
    return 0;
  for (int i = 0; i < iovcnt; i++)
    if ((uintptr_t)iov[i].iov_base % f->mem_align || iov[i].iov_len % f->off_align)
      return 0;
  return 1;
}

static ferry_status io_error(ferry_file_io *f, ferry_op op, uint64_t offset, uint64_t bytes,
                             uint64_t done, int err) {
  char name[FERRY_FILE_PATH_MAX + 32];
  return ferry_fail(err == EFAULT ? FERRY_EFAULT : FERRY_EIO,
                    "%s of %s at offset %llu, %llu bytes failed after %llu bytes: %s (errno %d)",
                    op_name(op), ferry_file_io_name(f, name, sizeof name),
                    (unsigned long long)offset, (unsigned long long)bytes, (unsigned long long)done,
                    strerror(err), err);
}

static ferry_status end_of_file(ferry_file_io *f, ferry_op op, uint64_t offset, uint64_t bytes,
                                uint64_t done) {
  char name[FERRY_FILE_PATH_MAX + 32];
  struct stat st;
  long long size = fstat(f->buffered_fd >= 0 ? f->buffered_fd : f->direct_fd, &st) == 0
                       ? (long long)st.st_size
                       : -1;
  if (op == FERRY_OP_WRITE) /* pwritev wrote nothing and said no error */
    return ferry_fail(FERRY_EIO,
                      "WRITE of %s at offset %llu, %llu bytes: the file took no more "
                      "after %llu bytes",
                      ferry_file_io_name(f, name, sizeof name), (unsigned long long)offset,
                      (unsigned long long)bytes, (unsigned long long)done);
  return ferry_fail(FERRY_EIO,
                    "READ of %s at offset %llu, %llu bytes: end of file at byte %llu "
                    "(the file has %lld bytes)",
                    ferry_file_io_name(f, name, sizeof name), (unsigned long long)offset,
                    (unsigned long long)bytes, (unsigned long long)(offset + done), size);
}

/* Skips n bytes of *iov (updating it and *iovcnt). */
static void advance(struct iovec **iov, int *iovcnt, size_t n) {
  while (n && *iovcnt) {
    size_t take = n < (*iov)->iov_len ? n : (*iov)->iov_len;
    (*iov)->iov_base = (char *)(*iov)->iov_base + take;
    (*iov)->iov_len -= take;
    n -= take;
    if (!(*iov)->iov_len) {
      (*iov)++;
      (*iovcnt)--;
    }
  }
}

/* An aligned operation O_DIRECT refused anyway (a file system that takes
 * direct I/O only on some ranges, a stricter alignment than reported):
 * said once per file, then the buffered descriptor serves it. */
static void note_fallback(ferry_file_io *f, ferry_op op, uint64_t offset, int err) {
  if (__atomic_exchange_n(&f->fell_back, 1, __ATOMIC_RELAXED))
    return;
  char name[FERRY_FILE_PATH_MAX + 32];
  FERRY_DEBUG("%s of %s at offset %llu: O_DIRECT refused it (%s); buffered I/O serves such "
              "operations",
              op_name(op), ferry_file_io_name(f, name, sizeof name), (unsigned long long)offset,
              strerror(err));
}

ferry_status ferry_file_io_move(ferry_file_io *f, ferry_op op, struct iovec *iov, int iovcnt,
                                uint64_t offset, uint64_t bytes) {
  int fd = direct_fits(f, iov, iovcnt, offset) ? f->direct_fd : f->buffered_fd;
  uint64_t done = 0;
  while (done < bytes) {
    if (fd < 0) /* a caller's O_DIRECT descriptor, and no buffered one could be opened */
      return io_error(f, op, offset, bytes, done, EINVAL);
    ssize_t n = op == FERRY_OP_READ ? preadv(fd, iov, iovcnt, (off_t)(offset + done))
                                    : pwritev(fd, iov, iovcnt, (off_t)(offset + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EINVAL && fd == f->direct_fd && f->buffered_fd >= 0) {
      note_fallback(f, op, offset + done, errno);
      fd = f->buffered_fd;
      continue;
    }
    if (n < 0)
      return io_error(f, op, offset, bytes, done, errno);
    if (n == 0)
      return end_of_file(f, op, offset, bytes, done);
    done += (uint64_t)n;
    advance(&iov, &iovcnt, (size_t)n);
    /* A short direct transfer (the end of the file inside a block) leaves
     * a rest that need not be aligned. */
    if (done < bytes && fd == f->direct_fd && f->buffered_fd >= 0)
      fd = f->buffered_fd;
  }
  return FERRY_OK;
}

ferry_status ferry_file_io_sync(ferry_file_io *f) {
  int fd = f->buffered_fd >= 0 ? f->buffered_fd : f->direct_fd;
  while (fdatasync(fd) != 0) {
    if (errno == EINTR)
      continue;
    int err = errno;
    char name[FERRY_FILE_PATH_MAX + 32];
    return ferry_fail(FERRY_EIO, "fdatasync of %s failed: %s (errno %d)",
                      ferry_file_io_name(f, name, sizeof name), strerror(err), err);
  }
  return FERRY_OK;
}
