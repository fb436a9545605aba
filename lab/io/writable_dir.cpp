// ensure_writable_dir (see writable_dir.h).
#include "lab/io/writable_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "lab/core/error.h"

namespace mxlab {

void ensure_writable_dir(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if ((i == dir.size() || dir[i] == '/') && !cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw_io_error("create directory", cur, errno);
    if (i < dir.size()) cur += dir[i];
  }
  // access(W_OK) is not enough: root passes it on a directory without write bits, and it
  // says nothing of quotas. Creating a file asks the file system itself.
  const std::string probe = dir + "/.mxlab-write-probe." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0 && errno != EEXIST) throw_io_error("write in directory", dir, errno);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace mxlab
