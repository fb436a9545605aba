/* An LD_PRELOAD shim that kills its process (SIGKILL) at the N-th write to a file whose name ends
 * in ".h5": a deterministic way to land a kill inside an HDF5 flush, which random kills rarely
 * do. Used by Resume.KillAtTheNthWriteOfTheRunFile (tests/cpu/test_resume.cpp), skipped unless
 * MXLAB_CRASH_SHIM points at the built library:
 *   cc -O2 -shared -fPIC -o /tmp/kill_at_write.so tests/cpu/crash_shim/kill_at_write.c -ldl
 *   MXLAB_CRASH_SHIM=/tmp/kill_at_write.so build/mxlab_tests --gtest_filter='Resume.KillAtTheNth*'
 * Environment: KILL_AT=N (1-based; unset: never), TORN=1 (write half of the N-th write first),
 * COUNT_WRITES=1 (print "h5writes=<count>" to stderr at exit). Not compiled into any target. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static long g_count = 0;

static int is_run_file(int fd) {
  char link[64], target[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 3) return 0;
  target[n] = '\0';
  return strcmp(target + n - 3, ".h5") == 0;
}

static void before_write(int fd, const void* buf, size_t n, off_t off, int positioned) {
  if (!is_run_file(fd)) return;
  const char* at = getenv("KILL_AT");
  if (++g_count != (at ? atol(at) : -1)) return;
  const char* torn = getenv("TORN");
  if (torn && torn[0] == '1' && positioned && n > 1) {
    ssize_t (*real)(int, const void*, size_t, off_t) = (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
    real(fd, buf, n / 2, off);
  }
  raise(SIGKILL);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  before_write(fd, buf, n, off, 1);
  ssize_t (*real)(int, const void*, size_t, off_t) = (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
  return real(fd, buf, n, off);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  before_write(fd, buf, n, off, 1);
  ssize_t (*real)(int, const void*, size_t, off_t) = (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  return real(fd, buf, n, off);
}

ssize_t write(int fd, const void* buf, size_t n) {
  before_write(fd, buf, n, 0, 0);
  ssize_t (*real)(int, const void*, size_t) = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  return real(fd, buf, n);
}

__attribute__((destructor)) static void report(void) {
  if (getenv("COUNT_WRITES")) fprintf(stderr, "h5writes=%ld\n", g_count);
}
