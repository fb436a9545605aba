/* An LD_PRELOAD shim under which the system refuses new processes, or kills them: while
 * MXLAB_FORK_FAILS is set, fork() fails with EAGAIN (what a node at its process limit answers)
 * without creating one; while MXLAB_FORK_CHILD_SIGNAL=N is set, every child dies of signal N
 * (default action) as soon as it exists (the out-of-memory killer's SIGKILL, a scheduler's
 * SIGTERM to the whole job). mxlab reads every existing HDF5 file in a child process first
 * (lab/io/h5check.h), so under this shim no run file can be looked at: a stand-in for a loaded
 * cluster node (tests/cpu/test_resume.cpp). Built by CMake as the module `mxlab_fork_shim`;
 * never linked into anything. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

pid_t fork(void) {
  if (getenv("MXLAB_FORK_FAILS") != NULL) {
    errno = EAGAIN;
    return -1;
  }
  pid_t (*real)(void) = (pid_t(*)(void))dlsym(RTLD_NEXT, "fork");
  const pid_t pid = real();
  const char* sig = getenv("MXLAB_FORK_CHILD_SIGNAL");
  if (pid == 0 && sig != NULL) {
    signal(atoi(sig), SIG_DFL);
    raise(atoi(sig));
    _exit(127);  /* a signal whose default action is not to end the process */
  }
  return pid;
}
