/* An LD_PRELOAD shim that fills the disk: once MXLAB_ENOSPC_AFTER bytes have been written to
 * files under the directory MXLAB_ENOSPC_DIR whose path contains MXLAB_ENOSPC_MATCH (any file
 * there when unset), every further write to such a file fails with ENOSPC (the disk stays full
 * until the process exits). A deterministic stand-in for a small
 * tmpfs where the tests cannot mount one (tests/cpu/test_disk_full.cpp). Covers the calls
 * mxlab's writers reach through the PLT: write, writev, pwrite, pwrite64 (HDF5, checkpoints,
 * lock files, libstdc++ streams) and fwrite (snapshots, index.csv, CSV export); glibc's stdio
 * flushes buffered data through internal calls, so an fwrite is judged when it is made.
 * Built by CMake as the module `mxlab_enospc_shim`; never linked into anything. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long long g_written = 0;
static int g_full = 0;

static int under_dir(int fd) {
  const char* dir = getenv("MXLAB_ENOSPC_DIR");
  if (!dir || !*dir || fd < 0) return 0;
  char link[64], target[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = '\0';
  const size_t len = strlen(dir);
  if (strncmp(target, dir, len) != 0 || (target[len] != '/' && target[len] != '\0')) return 0;
  const char* match = getenv("MXLAB_ENOSPC_MATCH");
  return !match || !*match || strstr(target + len, match) != NULL;
}

/* 1 when this write of n bytes to fd must fail. */
static int refuse(int fd, size_t n) {
  if (n == 0 || !under_dir(fd)) return 0;
  const char* after = getenv("MXLAB_ENOSPC_AFTER");
  const long long budget = after ? atoll(after) : -1;
  if (budget < 0) return 0;
  if (!g_full && g_written + (long long)n <= budget) {
    g_written += (long long)n;
    return 0;
  }
  g_full = 1;
  return 1;
}

ssize_t write(int fd, const void* buf, size_t n) {
  static ssize_t (*real)(int, const void*, size_t);
  if (!real) real = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  if (refuse(fd, n)) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, buf, n);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  static ssize_t (*real)(int, const void*, size_t, off_t);
  if (!real) real = (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  if (refuse(fd, n)) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  static ssize_t (*real)(int, const void*, size_t, off_t);
  if (!real) real = (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
  if (refuse(fd, n)) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec* iov, int n) {
  static ssize_t (*real)(int, const struct iovec*, int);
  if (!real) real = (ssize_t(*)(int, const struct iovec*, int))dlsym(RTLD_NEXT, "writev");
  size_t total = 0;
  for (int i = 0; i < n; ++i) total += iov[i].iov_len;
  if (refuse(fd, total)) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, iov, n);
}

size_t fwrite(const void* buf, size_t size, size_t count, FILE* f) {
  static size_t (*real)(const void*, size_t, size_t, FILE*);
  if (!real) real = (size_t(*)(const void*, size_t, size_t, FILE*))dlsym(RTLD_NEXT, "fwrite");
  if (refuse(fileno(f), size * count)) {
    errno = ENOSPC;
    return 0;
  }
  return real(buf, size, count, f);
}
