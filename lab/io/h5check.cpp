// Whole-file checks of HDF5 files in a child process (see h5check.h).
#include "lab/io/h5check.h"

#include <fcntl.h>
#include <hdf5.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lab/core/error.h"
#include "lab/io/h5file.h"

namespace mxlab::h5 {

namespace {

bool g_inside_check = false;
uint64_t g_file_bytes = 0;  // in the child: the size of the file it reads

// The child may use this much address space beyond what it inherited (plus a multiple of the
// file's size: a whole dataset is read as doubles): a damaged length then fails one allocation
// instead of making HDF5 clear gigabytes.
constexpr uint64_t kChildMemoryBudget = uint64_t{2} << 30;
constexpr uint64_t kChildMemoryPerFileByte = 8;
// The child is killed after this long (plus kSecondsPerByte for every byte of the file).
constexpr double kChildSeconds = 120.0;
constexpr double kSecondsPerByte = 1.0 / 10e6;

// What the child found: ok ('K', `text` is the image), an Error ('E') or an IoError ('I', with
// errno and path).
struct Outcome {
  char kind = 'K';
  int err = 0;
  std::string io_path, text;
};

// Recently made images, by file version, within a byte budget.
constexpr size_t kCachedImages = 8;
constexpr size_t kCachedBytes = size_t{256} << 20;

// Refuses `n` elements of `size` bytes that a file of g_file_bytes cannot hold (a damaged shape
// or type), before anything is allocated for them.
void check_fits(hssize_t n, size_t size, const std::string& what, const std::string& path) {
  constexpr uint64_t kSlack = uint64_t{64} << 20;
  const uint64_t limit = 2 * g_file_bytes + kSlack;
  if (n < 0 || size == 0 || static_cast<uint64_t>(n) > limit / size)
    throw Error(msg("HDF5: cannot ", what, " in ", path, ": it claims ", n, " elements of ", size,
                    " bytes, more than the file holds: the file is damaged"));
}

[[noreturn]] void rethrow(const Outcome& o) {
  if (o.kind == 'I') throw IoError(o.text, o.io_path, o.err);
  throw Error(o.text);
}

// HDF5 calls of the copy: a failure is an Error with HDF5's reason (h5file's message format).
void ok_or_throw(bool ok, const std::string& what, const std::string& path) {
  if (ok) return;
  std::string why;
  auto collect = [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
    auto* w = static_cast<std::string*>(data);
    if (err->desc != nullptr && err->desc[0] != '\0') *w = err->desc;  // the innermost record
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &why);
  H5Eclear2(H5E_DEFAULT);
  for (char& c : why)
    if (c == '\n') c = ' ';
  throw Error(msg("HDF5: cannot ", what, " in ", path, ": ", why.empty() ? "no HDF5 error message" : why));
}

// Copies every attribute of object `src` onto object `dst` (same names, types and shapes).
void copy_attributes(hid_t src, hid_t dst, const std::string& path) {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  ok_or_throw(H5Aiterate2(src, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &names) >= 0, "list attributes", path);
  for (const std::string& name : names) {
    const std::string what = "copy attribute '" + name + "'";
    const hid_t a = H5Aopen(src, name.c_str(), H5P_DEFAULT);
    ok_or_throw(a >= 0, what, path);
    const hid_t type = H5Aget_type(a), space = H5Aget_space(a);
    const hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    const htri_t vlen = type >= 0 ? H5Tis_variable_str(type) : -1;
    ok_or_throw(type >= 0 && space >= 0 && n >= 0 && vlen >= 0, what, path);
    const hid_t b = H5Acreate2(dst, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    ok_or_throw(b >= 0, what, path);
    check_fits(n, H5Tget_size(type), what, path);
    if (n > 0 && vlen > 0) {
      const hid_t mem = H5Tcopy(H5T_C_S1);
      ok_or_throw(mem >= 0 && H5Tset_size(mem, H5T_VARIABLE) >= 0 && H5Tset_cset(mem, H5Tget_cset(type)) >= 0, what, path);
      std::vector<char*> p(static_cast<size_t>(n), nullptr);
      ok_or_throw(H5Aread(a, mem, p.data()) >= 0 && H5Awrite(b, mem, p.data()) >= 0, what, path);
      for (char* q : p) H5free_memory(q);
      H5Tclose(mem);
    } else if (n > 0) {
      const hid_t mem = H5Tget_native_type(type, H5T_DIR_ASCEND);
      const size_t size = mem >= 0 ? H5Tget_size(mem) : 0;
      ok_or_throw(size > 0, what, path);
      std::vector<char> buf(static_cast<size_t>(n) * size);
      ok_or_throw(H5Aread(a, mem, buf.data()) >= 0 && H5Awrite(b, mem, buf.data()) >= 0, what, path);
      H5Tclose(mem);
    }
    H5Aclose(b);
    H5Sclose(space);
    H5Tclose(type);
    H5Aclose(a);
  }
}

// The elements of a dataspace (rank <= 32), or -1.
hssize_t points_of(hid_t space) { return space >= 0 ? H5Sget_simple_extent_npoints(space) : -1; }

void copy_group(hid_t src, hid_t dst, const std::string& where, const std::string& path);

// Copies dataset `name` of group `src` into group `dst`: its type, shape, values and
// attributes, stored contiguous at its current shape (no unused chunk rows: smaller).
void copy_dataset(hid_t src, hid_t dst, const std::string& name, const std::string& where, const std::string& path) {
  const std::string what = "copy dataset '" + where + "'";
  const hid_t d = H5Dopen2(src, name.c_str(), H5P_DEFAULT);
  ok_or_throw(d >= 0, what, path);
  const hid_t type = H5Dget_type(d), space = H5Dget_space(d);
  const hssize_t n = points_of(space);
  ok_or_throw(type >= 0 && n >= 0, what, path);
  if (H5Tis_variable_str(type) > 0) throw Error(msg("HDF5: ", path, ": dataset '", where, "' holds variable-length strings"));
  const int rank = H5Sget_simple_extent_ndims(space);
  ok_or_throw(rank >= 0, what, path);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  ok_or_throw(rank == 0 || H5Sget_simple_extent_dims(space, dims.data(), nullptr) >= 0, what, path);
  const hid_t new_space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), nullptr);
  ok_or_throw(new_space >= 0, what, path);
  const hid_t e = H5Dcreate2(dst, name.c_str(), type, new_space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ok_or_throw(e >= 0, what, path);
  if (n > 0) {
    const hid_t mem = H5Tget_native_type(type, H5T_DIR_ASCEND);
    const size_t size = mem >= 0 ? H5Tget_size(mem) : 0;
    ok_or_throw(size > 0, what, path);
    check_fits(n, size, what, path);
    std::vector<char> buf(static_cast<size_t>(n) * size);
    ok_or_throw(H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0 &&
                    H5Dwrite(e, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0,
                what, path);
    H5Tclose(mem);
  }
  copy_attributes(d, e, path);
  H5Dclose(e);
  H5Sclose(new_space);
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(d);
}

// Copies the attributes and every link of group `src` (what they lead to, recursively) into `dst`.
void copy_group(hid_t src, hid_t dst, const std::string& where, const std::string& path) {
  copy_attributes(src, dst, path);
  H5G_info_t info;
  ok_or_throw(H5Gget_info(src, &info) >= 0, "read group '" + where + "'", path);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(src, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    ok_or_throw(len >= 0, "list group '" + where + "'", path);
    std::string name(static_cast<size_t>(len) + 1, '\0');
    ok_or_throw(H5Lget_name_by_idx(src, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT) ==
                    len,
                "list group '" + where + "'", path);
    name.resize(static_cast<size_t>(len));
    const std::string child = where == "/" ? name : where + "/" + name;
    H5L_info_t li;
    ok_or_throw(H5Lget_info(src, name.c_str(), &li, H5P_DEFAULT) >= 0, "read link '" + child + "'", path);
    if (li.type == H5L_TYPE_SOFT) {
      std::string target(li.u.val_size + 1, '\0');
      ok_or_throw(H5Lget_val(src, name.c_str(), target.data(), target.size(), H5P_DEFAULT) >= 0 &&
                      H5Lcreate_soft(target.c_str(), dst, name.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0,
                  "copy link '" + child + "'", path);
      continue;
    }
    if (li.type != H5L_TYPE_HARD) throw Error(msg("HDF5: ", path, ": link '", child, "' is neither a hard nor a soft link"));
    const hid_t o = H5Oopen(src, name.c_str(), H5P_DEFAULT);
    ok_or_throw(o >= 0, "open '" + child + "'", path);
    const H5I_type_t kind = H5Iget_type(o);
    if (kind == H5I_GROUP) {
      const hid_t g = H5Gcreate2(dst, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      ok_or_throw(g >= 0, "copy group '" + child + "'", path);
      copy_group(o, g, child, path);
      H5Gclose(g);
    } else if (kind == H5I_DATASET) {
      copy_dataset(src, dst, name, child, path);
    } else {
      throw Error(msg("HDF5: ", path, ": '", child, "' is neither a group nor a dataset"));
    }
    H5Oclose(o);
  }
}

// A new in-memory HDF5 file holding everything of `src`, as the bytes of its image.
std::string copy_to_image(hid_t src, const std::string& path) {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  ok_or_throw(fapl >= 0 && H5Pset_fapl_core(fapl, size_t{1} << 20, 0) >= 0, "set up an in-memory file", path);
  const hid_t dst = H5Fcreate("mxlab-clean-image", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  ok_or_throw(dst >= 0, "create an in-memory file", path);
  const hid_t src_root = H5Gopen2(src, "/", H5P_DEFAULT), dst_root = H5Gopen2(dst, "/", H5P_DEFAULT);
  ok_or_throw(src_root >= 0 && dst_root >= 0, "open the root group", path);
  copy_group(src_root, dst_root, "/", path);
  H5Gclose(dst_root);
  H5Gclose(src_root);
  ok_or_throw(H5Fflush(dst, H5F_SCOPE_GLOBAL) >= 0, "flush the in-memory file", path);
  const ssize_t n = H5Fget_file_image(dst, nullptr, 0);
  ok_or_throw(n > 0, "read the in-memory file", path);
  std::string image(static_cast<size_t>(n), '\0');
  ok_or_throw(H5Fget_file_image(dst, image.data(), image.size()) == n, "read the in-memory file", path);
  ok_or_throw(H5Fclose(dst) >= 0, "close the in-memory file", path);
  return image;
}

// The check itself, in the child: never returns.
[[noreturn]] void child_main(int fd, const std::string& path, uint64_t file_bytes) {
  g_inside_check = true;
  g_file_bytes = file_bytes;
  // Silent: the C library reports heap damage it finds ("free(): invalid pointer") on the
  // terminal or stderr before it aborts; the parent says what happened instead.
  ::setenv("LIBC_FATAL_STDERR_", "1", 1);
  const int null_fd = ::open("/dev/null", O_WRONLY);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(null_fd, STDERR_FILENO);
    ::close(null_fd);
  }
  // Address space now (from /proc/self/statm, in pages) plus the budget.
  unsigned long pages = 0;
  if (std::FILE* s = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(s, "%lu", &pages) != 1) pages = 0;
    std::fclose(s);
  }
  if (pages > 0) {
    const uint64_t limit = static_cast<uint64_t>(pages) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) +
                           kChildMemoryBudget + kChildMemoryPerFileByte * file_bytes;
    struct rlimit rl {};
    if (::getrlimit(RLIMIT_AS, &rl) == 0 && (rl.rlim_max == RLIM_INFINITY || limit < rl.rlim_max)) {
      rl.rlim_cur = static_cast<rlim_t>(limit);
      ::setrlimit(RLIMIT_AS, &rl);
    }
  }
  Outcome o;
  // Kept open when something fails: closing a damaged file can crash too, and _exit needs no
  // cleanup then.
  std::unique_ptr<H5File> f;
  try {
    f = std::make_unique<H5File>(path, H5File::Mode::read);
    o.text = copy_to_image(f->id(), path);
    f->close();
    f.reset();
    // What decoding the file allocated is freed here (its structures by the close above, HDF5's
    // free lists now): heap damage done while decoding surfaces in this process (free() aborts),
    // not in the parent. Not H5close(): it closes every file the library has open, and this
    // process inherited the parent's open files with their unflushed state: closing them here
    // would write that state, as of the fork, into files the parent is still writing.
    ok_or_throw(H5garbage_collect() >= 0, "free HDF5's free lists", path);
  } catch (const IoError& e) {
    o = {'I', e.error_number(), e.path(), e.what()};
  } catch (const Error& e) {
    o = {'E', 0, "", e.what()};
  } catch (const std::bad_alloc&) {
    o = {'E', 0, "", msg("HDF5: ", path, " is damaged: reading it needs more memory than the file can hold")};
  } catch (const std::exception& e) {
    o = {'E', 0, "", msg("HDF5: ", path, " cannot be read: ", e.what())};
  }
  const std::string head = msg(o.kind, " ", o.err, " ", o.io_path.size(), "\n", o.io_path);
  for (const std::string* part : std::vector<const std::string*>{&head, &o.text}) {
    size_t off = 0;
    while (off < part->size()) {
      const ssize_t w = ::write(fd, part->data() + off, part->size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) ::_exit(1);
      off += static_cast<size_t>(w);
    }
  }
  ::_exit(0);
}

Outcome parse(const std::string& text, const std::string& path) {
  Outcome o;
  char kind = 0;
  int err = 0;
  size_t path_len = 0;
  int used = 0;
  if (std::sscanf(text.c_str(), "%c %d %zu\n%n", &kind, &err, &path_len, &used) != 3 || used <= 0 ||
      (kind != 'K' && kind != 'E' && kind != 'I') || static_cast<size_t>(used) + path_len > text.size())
    return {'E', 0, "", msg("HDF5: the check of ", path, " ended without a result")};
  o.kind = kind;
  o.err = err;
  o.io_path = text.substr(static_cast<size_t>(used), path_len);
  o.text = text.substr(static_cast<size_t>(used) + path_len);
  if (kind == 'K' && o.text.empty()) return {'E', 0, "", msg("HDF5: the check of ", path, " sent no image")};
  return o;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGTRAP: return "SIGTRAP";
    case SIGSYS: return "SIGSYS";
    default: return "a signal";
  }
}

// Forks the child and waits for its verdict.
Outcome check_in_child(const std::string& path, uint64_t file_bytes) {
  int fds[2];
  // The system refusing a pipe or a process says nothing about the file: an IoError, so that no
  // caller takes it for damage (run_driver.cpp).
  if (::pipe(fds) != 0) {
    const int e = errno;
    throw IoError(msg("cannot check ", path, ": pipe: ", std::strerror(e), " (the system refuses: file descriptor "
                      "limit?; the file is left as it is)"), path, e);
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw IoError(msg("cannot check ", path, ": fork: ", std::strerror(e), " (the system refuses new processes: its "
                      "process or memory limit; the file is left as it is)"), path, e);
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_main(fds[1], path, file_bytes);
  }
  ::close(fds[1]);
  const double limit_s = kChildSeconds + kSecondsPerByte * static_cast<double>(file_bytes);
  const auto t0 = std::chrono::steady_clock::now();
  std::string text;
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el > limit_s && !timed_out) {
      ::kill(pid, SIGKILL);
      timed_out = true;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, 200);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return {'E', 0, "", msg("HDF5: ", path, " is damaged: reading it did not finish in ", static_cast<long>(limit_s),
                            " s (HDF5 loops on its metadata)")};
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    // Only a signal the process raises on itself says the library crashed on the file. Any other
    // came from outside (the out-of-memory killer's SIGKILL, a scheduler's SIGTERM to the whole
    // job) and says nothing about the file: an I/O refusal, never damage.
    const bool crash = sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGABRT ||
                       sig == SIGTRAP || sig == SIGSYS;
    if (!crash)
      return {'I', EINTR, path, msg("cannot check ", path, ": its checking process was stopped from outside (",
                                    signal_name(sig), ": the out-of-memory killer, a scheduler's cancel?); the "
                                    "file is left as it is")};
    return {'E', 0, "", msg("HDF5: ", path, " is damaged: the HDF5 library crashes (", signal_name(sig),
                            ") reading its metadata")};
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return {'E', 0, "", msg("HDF5: the check of ", path, " failed (its process exited with ", WEXITSTATUS(status), ")")};
  return parse(text, path);
}

using Key = std::tuple<dev_t, ino_t, off_t, time_t, long>;

}  // namespace

bool inside_file_check() { return g_inside_check; }

std::shared_ptr<const std::string> clean_image(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_io_error("read", path, errno);
  if (!S_ISREG(st.st_mode)) throw Error(msg("HDF5: ", path, " is not a regular file"));
  static std::mutex mu;
  static std::list<std::pair<Key, std::shared_ptr<const std::string>>> cache;  // most recent first
  const Key key{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
  {
    std::lock_guard<std::mutex> g(mu);
    for (auto it = cache.begin(); it != cache.end(); ++it)
      if (it->first == key) {
        cache.splice(cache.begin(), cache, it);
        return cache.front().second;
      }
  }
  // Only images are kept: a refusal may pass later (a lock released, a permission granted)
  // without the file changing.
  Outcome o = check_in_child(path, static_cast<uint64_t>(st.st_size));
  if (o.kind != 'K') rethrow(o);
  auto image = std::make_shared<const std::string>(std::move(o.text));
  std::lock_guard<std::mutex> g(mu);
  cache.emplace_front(key, image);
  size_t bytes = 0, n = 0;
  for (auto it = cache.begin(); it != cache.end();) {
    bytes += it->second->size();
    if (++n > kCachedImages || (n > 1 && bytes > kCachedBytes)) it = cache.erase(it);
    else ++it;
  }
  return image;
}

}  // namespace mxlab::h5
