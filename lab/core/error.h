// Errors. User input problems throw mxlab::Error with a message that says what to do;
// `main` prints it on one line and exits non-zero. Internal invariants use MXLAB_ASSERT.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mxlab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A file that could not be written, created or read because of the system rather than its
// content: disk full, read-only file system, permissions. `mxlab` exits with kExitIo for it
// (lab/core/exit_codes.h), so a script can tell "free some space" from "fix your input".
class IoError : public Error {
 public:
  IoError(const std::string& what, std::string path, int err) : Error(what), path_(std::move(path)), err_(err) {}
  const std::string& path() const { return path_; }  // the file that failed
  int error_number() const { return err_; }          // errno
 private:
  std::string path_;
  int err_;
};

// "cannot <verb> <path>: no space left on device (free space on that file system, or write
// somewhere else)": the cause in words and what to do about it, on one line.
std::string io_message(const std::string& verb, const std::string& path, int err);
[[noreturn]] void throw_io_error(const std::string& verb, const std::string& path, int err);

// Build a message from stream-able parts: throw Error(msg("bad block size ", k)).
template <typename... Args>
std::string msg(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& what);

}  // namespace mxlab

#define MXLAB_ASSERT(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond)) ::mxlab::assert_fail(#cond, __FILE__, __LINE__, ::mxlab::msg("" __VA_ARGS__)); \
  } while (0)
