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

// A file that another process holds open in a way that excludes this use (an HDF5 lock: an
// h5py session reading a run file that `mxlab run` would resume). Not damage, not bad input:
// `mxlab` exits with kExitBusy, and the file is left as it is.
class FileInUse : public Error {
 public:
  FileInUse(const std::string& what, std::string path) : Error(what), path_(std::move(path)) {}
  const std::string& path() const { return path_; }
 private:
  std::string path_;
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

// Text from the user (a YAML value, a key, an option, a file's content) as it may appear inside a
// one-line error message: control bytes and bytes that are not UTF-8 written as \n, \t or \xHH
// (UTF-8 characters kept), and cut after `max_chars`
// bytes (at a UTF-8 character boundary) with "..." and the full length, e.g.
//   excerpt("abc")                 -> abc
//   excerpt(10 MB of 'x')          -> xxxx...xxx... (10485760 bytes)
// so that a 10 MB scalar or a whole file never ends up in a message. Every message that echoes
// such text goes through this (or quoted_excerpt).
constexpr size_t kExcerptChars = 80;
std::string excerpt(const std::string& text, size_t max_chars = kExcerptChars);
// The same in single quotes: 'abc', 'xxxx...' (10485760 bytes).
std::string quoted_excerpt(const std::string& text, size_t max_chars = kExcerptChars);
// A whole error message made safe to print as one line: excerpt() with a generous cap (a
// message is never cut where one with the quoted excerpts above fits).
std::string one_line_message(const std::string& message);

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& what);

}  // namespace mxlab

#define MXLAB_ASSERT(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond)) ::mxlab::assert_fail(#cond, __FILE__, __LINE__, ::mxlab::msg("" __VA_ARGS__)); \
  } while (0)
