// Internal-invariant failures: a bug in mxlab, not bad input.
#include "lab/core/error.h"

#include <cerrno>
#include <cstring>

namespace mxlab {

void assert_fail(const char* expr, const char* file, int line, const std::string& what) {
  throw std::logic_error(msg("internal error (please report): ", expr, " failed at ", file, ":", line,
                             what.empty() ? "" : ": ", what));
}

std::string io_message(const std::string& verb, const std::string& path, int err) {
  const char* cause;
  const char* fix;
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      cause = err == ENOSPC ? "no space left on device" : "disk quota exceeded";
      fix = "free space on that file system, or write somewhere else";
      break;
    case EROFS: cause = "read-only file system"; fix = "write to a writable directory"; break;
    case EACCES:
    case EPERM: cause = "permission denied"; fix = "write to a directory you may write to"; break;
    case ENOENT: cause = "no such file or directory"; fix = "check the path"; break;
    case ELOOP:
      cause = "it is a symbolic link";
      fix = "mxlab writes no file through a link inside its output directories: remove the link";
      break;
    default: cause = std::strerror(err); fix = "check the file system"; break;
  }
  return msg("cannot ", verb, " ", path, ": ", cause, " (", fix, ")");
}

void throw_io_error(const std::string& verb, const std::string& path, int err) {
  throw IoError(io_message(verb, path, err), path, err);
}

}  // namespace mxlab
