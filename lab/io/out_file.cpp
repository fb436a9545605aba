// Output files that never follow symbolic links (see out_file.h).
#include "lab/io/out_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "lab/core/error.h"

namespace mxlab {

int create_fresh_file(const std::string& path, const std::string& report_as) {
  const std::string& name = report_as.empty() ? path : report_as;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_io_error("write", name, errno);
  // O_EXCL fails on any existing entry, a link included (dangling or not): if something put a
  // new entry there since the unlink, this refuses instead of writing through it.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw_io_error("write", name, errno == EEXIST ? ELOOP : errno);
  return fd;
}

void refuse_symlink(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) throw_io_error("write", path, ELOOP);
}

void make_dirs_below(const std::string& root, const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if ((i == dir.size() || dir[i] == '/') && !cur.empty()) {
      const bool below_root = cur.size() > root.size();
      if (::mkdir(cur.c_str(), 0755) != 0) {
        if (errno != EEXIST) throw_io_error("create directory", cur, errno);
        if (below_root) {
          struct stat st {};
          if (::lstat(cur.c_str(), &st) != 0) throw_io_error("create directory", cur, errno);
          if (S_ISLNK(st.st_mode)) throw_io_error("create directory", cur, ELOOP);
          if (!S_ISDIR(st.st_mode)) throw_io_error("create directory", cur, ENOTDIR);
        }
      }
    }
    if (i < dir.size()) cur += dir[i];
  }
}

}  // namespace mxlab
