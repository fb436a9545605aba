// Lock files and the HDF5 mutex (locks.h).
#include "lab/io/locks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>

#include "lab/core/error.h"

namespace mxlab {

namespace {

// A lock file with no content yet is being written by its creator; one that stays empty this
// long belonged to a process that died between creating and writing it.
constexpr int kStaleEmptyLockSeconds = 60;
// A `.break` file (held for microseconds while a stale lock is replaced) older than this is
// left over from a process that died in that window.
constexpr int kStaleBreakSeconds = 30;
// O_EXCL attempts before giving up on a contended lock (each after a short sleep).
constexpr int kLockAttempts = 50;
constexpr auto kLockRetrySleep = std::chrono::milliseconds(10);

// ---- lock files ----

struct LockInfo {
  bool exists = false;
  std::string raw;
  long pid = -1;
  std::string host;
  std::time_t mtime = 0;
};

LockInfo read_lock(const std::string& path) {
  LockInfo info;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return info;
  struct stat st {};
  if (::fstat(fd, &st) == 0) info.mtime = st.st_mtime;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  info.exists = true;
  if (n > 0) info.raw.assign(buf, static_cast<size_t>(n));
  // "pid=<pid> host=<host> time=<utc>"
  const auto p = info.raw.find("pid=");
  const auto h = info.raw.find(" host=");
  if (p != std::string::npos && h != std::string::npos && h > p) {
    info.pid = std::strtol(info.raw.c_str() + p + 4, nullptr, 10);
    const auto end = info.raw.find(' ', h + 6);
    info.host = info.raw.substr(h + 6, end == std::string::npos ? std::string::npos : end - h - 6);
    while (!info.host.empty() && (info.host.back() == '\n' || info.host.back() == '\r')) info.host.pop_back();
  }
  return info;
}

std::string describe_holder(const LockInfo& info) {
  if (info.pid < 0) return "a process that is still writing the lock file";
  return msg("pid ", info.pid, " on host ", info.host.empty() ? "?" : info.host);
}

// Whether the holder of a lock is alive; when not, `why` says why the lock is stale.
enum class Holder { alive, being_written, stale };
Holder judge(const LockInfo& info, std::string* why) {
  const std::time_t now = std::time(nullptr);
  const long age = static_cast<long>(now - info.mtime);
  if (info.pid < 0) {
    if (age > kStaleEmptyLockSeconds) {
      *why = msg("it has held no owner for ", age, " s");
      return Holder::stale;
    }
    return Holder::being_written;
  }
  if (info.host == host_name()) {
    if (info.pid == static_cast<long>(::getpid())) return Holder::alive;  // another thread of ours
    if (::kill(static_cast<pid_t>(info.pid), 0) == 0 || errno == EPERM) return Holder::alive;
    *why = msg("pid ", info.pid, " on this host (", info.host, ") is gone");
    return Holder::stale;
  }
  if (age > kStaleRemoteLockSeconds) {
    *why = msg("its holder, pid ", info.pid, " on host ", info.host, ", has not refreshed it for ", age / 60, " min");
    return Holder::stale;
  }
  return Holder::alive;
}

// Remove the stale lock `path` (whose content was `seen`) unless someone replaced it meanwhile.
// The `.break` file makes the check-and-remove atomic among processes doing the same.
void break_stale_lock(const std::string& path, const LockInfo& seen, const std::string& why) {
  const std::string brk = path + ".break";
  const int fd = ::open(brk.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    struct stat st {};
    if (errno == EEXIST && ::stat(brk.c_str(), &st) == 0 && std::time(nullptr) - st.st_mtime > kStaleBreakSeconds)
      ::unlink(brk.c_str());
    return;
  }
  ::close(fd);
  const LockInfo now = read_lock(path);
  if (now.exists && now.raw == seen.raw && now.mtime == seen.mtime) {
    ::unlink(path.c_str());
    std::fprintf(stderr, "mxlab: taking over the stale lock %s: %s\n", path.c_str(), why.c_str());
  }
  ::unlink(brk.c_str());
}

}  // namespace

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

std::string RunLock::lock_path(const std::string& dir, const std::string& run_id) {
  return dir + "/" + run_id + ".lock";
}

bool RunLock::try_acquire(const std::string& dir, const std::string& run_id) {
  release();
  const std::string path = lock_path(dir, run_id);
  const std::string content = msg("pid=", ::getpid(), " host=", host_name(), " time=", utc_now(), "\n");
  holder_.clear();
  for (int attempt = 0; attempt < kLockAttempts; ++attempt) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      const ssize_t n = ::write(fd, content.data(), content.size());
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      if (n != static_cast<ssize_t>(content.size())) {
        ::unlink(path.c_str());
        throw_io_error("write lock file", path, err);
      }
      path_ = path;
      content_ = content;
      last_beat_ = static_cast<int64_t>(std::time(nullptr));
      return true;
    }
    if (errno != EEXIST)
      throw_io_error("create lock file", path, errno);
    const LockInfo info = read_lock(path);
    if (!info.exists) continue;  // released between our open and read: try again
    std::string why;
    switch (judge(info, &why)) {
      case Holder::alive:
        holder_ = describe_holder(info);
        return false;
      case Holder::being_written:
        holder_ = describe_holder(info);
        std::this_thread::sleep_for(kLockRetrySleep);
        break;
      case Holder::stale:
        break_stale_lock(path, info, why);
        break;
    }
  }
  if (holder_.empty()) holder_ = "another process (the lock stayed contended)";
  return false;
}

void RunLock::heartbeat() {
  if (path_.empty()) return;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  if (now - last_beat_ < kLockHeartbeatSeconds) return;
  last_beat_ = now;
  ::utimensat(AT_FDCWD, path_.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
}

void RunLock::release() {
  if (path_.empty()) return;
  const LockInfo info = read_lock(path_);
  if (info.exists && info.raw == content_) ::unlink(path_.c_str());
  path_.clear();
  content_.clear();
}

std::string live_lock_holder(const std::string& dir, const std::string& run_id) {
  const LockInfo info = read_lock(RunLock::lock_path(dir, run_id));
  if (!info.exists) return "";
  std::string why;
  return judge(info, &why) == Holder::stale ? "" : describe_holder(info);
}

}  // namespace mxlab
