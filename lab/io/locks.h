// Locks shared by the run driver and the readers of a results directory: the mutex that
// serialises HDF5 calls, the per-run lock file, and who holds one.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

namespace mxlab {

// HDF5 calls of this library are serialised by this mutex: the HDF5 C library is not
// thread-safe in every build (Ubuntu's serial build need not be). It is held only around the
// file calls of a log step, never around computation.
std::mutex& hdf5_mutex();

// ---- per-run lock ----
// <dir>/<run_id>.lock, created with O_EXCL and holding "pid=<pid> host=<host> time=<utc>".
// The holder refreshes its modification time while it runs (heartbeat). A lock is stale, and
// is taken over with a message on stderr, when its pid is gone on this host, or when it comes
// from another host and has not been refreshed for kStaleRemoteLockSeconds.
constexpr int kLockHeartbeatSeconds = 60;
constexpr int kStaleRemoteLockSeconds = 15 * 60;

class RunLock {
 public:
  RunLock() = default;
  ~RunLock() { release(); }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // True when this object now holds the lock. False when a live holder has it; `holder()` then
  // says who ("pid 123 on host node7"). Throws mxlab::Error when the directory is not writable.
  bool try_acquire(const std::string& dir, const std::string& run_id);
  // Refresh the modification time (at most once per kLockHeartbeatSeconds; cheap otherwise).
  void heartbeat();
  // Remove the lock file if it is still ours.
  void release();
  bool held() const { return !path_.empty(); }
  const std::string& holder() const { return holder_; }
  static std::string lock_path(const std::string& dir, const std::string& run_id);

 private:
  std::string path_, content_, holder_;
  int64_t last_beat_ = 0;
};

// "pid 123 on host node7" for a lock file that exists and is held by a live process, "" when
// there is no such file or its holder is gone (summaries use it to tell a run in progress
// from an abandoned file).
std::string live_lock_holder(const std::string& dir, const std::string& run_id);

// Hostname of this machine ("" if unknown).
std::string host_name();

// The current time in UTC as run files and lock files record it: 2026-11-26T22:30:05Z.
std::string utc_now();

}  // namespace mxlab
