// HDF5 files for run output (lab/train/SCHEMA.md): an RAII file with nested groups and typed
// attributes, extendable row-by-row datasets (one row per logged step) that can be reopened
// for appending and truncated when a run resumes, and whole-dataset readers for tests and
// tools. Written against the HDF5 1.10 C API (also builds with 1.12/1.14). Every failure
// throws mxlab::Error naming the file, the object and HDF5's own message; HDF5 never prints.
// An existing file is read whole in a child process first, and this process then reads the
// clean copy that the child made of it, so that a damaged file is an error and never a crash
// of this process (lab/io/h5check.h); a link that exists but does not open is
// damage, not an absent object; sizes read from a file are checked against its size before
// anything is allocated for them. Nothing is written through a symbolic link
// (lab/io/out_file.h).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mxlab::h5 {

// File locks. HDF5 locks a file it opens (flock(2): shared to read, exclusive to write) and
// refuses to open a file that another process holds in a conflicting way. mxlab's own readers
// take no lock (a reader is never a reason for a writer to fail: `mxlab run` shards rebuild
// index.csv from files other shards are resuming), and its writers are kept apart by the
// per-run lock (lab/io/locks.h). What remains is another program holding the file open:
// an h5py or HDFView session. Opening to append then waits for it, up to append_lock_wait(),
// and throws FileInUse (lab/core/error.h) if it is still held: never a reason to treat the
// file as damaged.
constexpr std::chrono::seconds kDefaultAppendLockWait{60};
std::chrono::milliseconds append_lock_wait();
void set_append_lock_wait(std::chrono::milliseconds wait);  // tests shorten it
// Whether another open file of `path` holds an flock(2) lock on it (false when it does not exist).
bool locked_by_another_open(const std::string& path);
// Calls `attempt` until it returns without throwing FileInUse, for up to `wait`: one line on stderr
// when the wait begins, and FileInUse ("<path> is open in another process ..., still after N s")
// when it ends without success. It sleeps between attempts holding nothing: a caller that must
// hold a lock around HDF5 calls takes it inside `attempt` (lab/runs/run_driver.cpp).
void retry_while_in_use(const std::string& path, std::chrono::milliseconds wait, const std::function<void()>& attempt);

using Hid = int64_t;  // hid_t (int64_t since HDF5 1.10); hdf5.h stays out of this header

// Element type of a dataset in the file.
enum class DType { f64, f32, i64 };
const char* dtype_name(DType t);

// Attribute access on one open object (the file root, a group or a dataset). Setting an
// attribute replaces any previous one of that name, whatever its type. Strings are stored as
// variable-length UTF-8 (h5py reads them as str), numbers as scalars, vectors as 1-D arrays.
class H5Object {
 public:
  H5Object() = default;
  H5Object(Hid id, std::string file, std::string path);
  ~H5Object();
  H5Object(H5Object&& other) noexcept;
  H5Object& operator=(H5Object&& other) noexcept;
  H5Object(const H5Object&) = delete;
  H5Object& operator=(const H5Object&) = delete;

  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, const char* value) { set_attr(name, std::string(value)); }
  void set_attr(const std::string& name, int64_t value);
  void set_attr(const std::string& name, int value) { set_attr(name, static_cast<int64_t>(value)); }
  void set_attr(const std::string& name, uint64_t value);
  void set_attr(const std::string& name, double value);
  void set_attr(const std::string& name, const std::vector<std::string>& value);
  void set_attr(const std::string& name, const std::vector<double>& value);

  bool has_attr(const std::string& name) const;
  std::vector<std::string> attr_names() const;  // in name order
  std::string get_attr_string(const std::string& name) const;
  int64_t get_attr_int64(const std::string& name) const;    // any integer attribute
  uint64_t get_attr_uint64(const std::string& name) const;  // any non-negative integer attribute
  double get_attr_double(const std::string& name) const;    // any numeric scalar attribute
  std::vector<std::string> get_attr_strings(const std::string& name) const;
  std::vector<double> get_attr_doubles(const std::string& name) const;  // any numeric 1-D (or scalar)

  Hid id() const { return id_; }
  const std::string& file_name() const { return file_; }
  const std::string& path() const { return path_; }  // inside the file, e.g. "trajectories/mx/loss"

 protected:
  void close_handle() noexcept;
  Hid id_ = -1;
  std::string file_;  // for error messages
  std::string path_;
};

class H5Series;

// One HDF5 file, open until destruction (or close()). Object paths are relative to the root
// ("trajectories/mx"; "/" or "" is the root itself); groups are created with their parents.
class H5File {
 public:
  enum class Mode {
    create,  // create, replacing any existing file: a new file under a name of its own (O_EXCL),
             // renamed over `path` (a link there is replaced, never followed)
    append,  // open an existing file read-write (resume) once it was read whole (h5check.h);
             // error if it does not exist or is damaged, IoError (ELOOP) if it is a symbolic link,
             // FileInUse if another process keeps it locked for longer than append_lock_wait()
    read,    // open an existing file read-only (its clean image, in memory), taking no lock
  };
  // `lock_wait`: how long append waits for another program's lock (default append_lock_wait()).
  H5File(const std::string& path, Mode mode, std::optional<std::chrono::milliseconds> lock_wait = std::nullopt);
  ~H5File();  // closes; errors at this point are swallowed: call close() to see them
  H5File(H5File&& other) noexcept;
  H5File& operator=(H5File&& other) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  const std::string& path() const { return path_; }
  bool is_open() const { return id_ >= 0; }
  // Writes everything buffered to disk, so a process killed afterwards leaves a readable file.
  void flush();
  // Closes the file (datasets still open keep it alive until they are destroyed).
  void close();

  void create_group(const std::string& group);  // no-op when it already exists
  bool exists(const std::string& object) const;  // group or dataset
  bool is_group(const std::string& object) const;
  bool is_dataset(const std::string& object) const;
  std::vector<std::string> list_groups(const std::string& group) const;    // names, sorted
  std::vector<std::string> list_datasets(const std::string& group) const;  // names, sorted

  // Opens a group or dataset (or the root) for attribute access.
  H5Object object(const std::string& path) const;
  template <typename T>
  void set_attr(const std::string& object_path, const std::string& name, const T& value) {
    object(object_path).set_attr(name, value);
  }
  bool has_attr(const std::string& o, const std::string& name) const { return object(o).has_attr(name); }
  std::string get_attr_string(const std::string& o, const std::string& name) const {
    return object(o).get_attr_string(name);
  }
  int64_t get_attr_int64(const std::string& o, const std::string& name) const { return object(o).get_attr_int64(name); }
  uint64_t get_attr_uint64(const std::string& o, const std::string& name) const {
    return object(o).get_attr_uint64(name);
  }
  double get_attr_double(const std::string& o, const std::string& name) const { return object(o).get_attr_double(name); }
  std::vector<std::string> get_attr_strings(const std::string& o, const std::string& name) const {
    return object(o).get_attr_strings(name);
  }
  std::vector<double> get_attr_doubles(const std::string& o, const std::string& name) const {
    return object(o).get_attr_doubles(name);
  }

  // Whole datasets, row-major, for tests and tools. read_doubles converts any numeric type;
  // read_int64s only integer ones.
  std::vector<uint64_t> dataset_shape(const std::string& dataset) const;
  std::vector<double> read_doubles(const std::string& dataset) const;
  std::vector<int64_t> read_int64s(const std::string& dataset) const;

  Hid id() const { return id_; }

 private:
  void open_image(const std::string& image);  // read mode: the file's clean image (h5check.h)
  void open_to_append(const std::string& path, std::chrono::milliseconds lock_wait);  // FileInUse after it
  std::string path_;
  Hid id_ = -1;
};

// A dataset that grows along axis 0: shape [n] (width 0) or [n, width], chunked, unlimited.
// Rows are written as they come; values are converted to the dataset's dtype by HDF5 (doubles
// into a float32 dataset round to nearest), except that floating-point values are refused by
// int64 datasets.
class H5Series : public H5Object {
 public:
  static constexpr size_t kDefaultChunkRows = 1024;

  H5Series() = default;
  // Creates a new dataset (parent groups included); error if one exists at `path`.
  static H5Series create(H5File& file, const std::string& path, DType dtype, size_t width = 0,
                         size_t chunk_rows = kDefaultChunkRows);
  // Opens an existing extendable dataset to append to it (resume); dtype and width from the file.
  static H5Series open(H5File& file, const std::string& path);

  size_t size() const { return rows_; }  // rows
  size_t width() const { return width_; }  // 0 for a 1-D series
  size_t row_length() const { return width_ == 0 ? 1 : width_; }
  DType dtype() const { return dtype_; }

  // n_rows rows of row_length() values each, row-major.
  void append_rows(const double* values, size_t n_rows);
  void append_rows(const float* values, size_t n_rows);
  void append_rows(const int64_t* values, size_t n_rows);
  // One value of a 1-D series.
  void append(double value) { append_one_row(&value, 1); }
  void append(float value) { append_one_row(&value, 1); }
  void append(int64_t value) { append_one_row(&value, 1); }
  // One row of row_length() values.
  template <typename T>
  void append_row(const std::vector<T>& row) {
    append_one_row(row.data(), row.size());
  }
  // Drops every row from `rows` on (a resumed run discards rows logged after its checkpoint).
  void truncate(size_t rows);

 private:
  template <typename T>
  void append_one_row(const T* values, size_t count);
  void write_rows(const void* values, Hid mem_type, bool values_are_float, size_t n_rows);
  DType dtype_ = DType::f64;
  size_t width_ = 0;
  size_t rows_ = 0;
};

// Writes a file that must appear complete or not at all: fill() writes into `path.tmp`, which
// is then closed and renamed over `path`. On an exception the .tmp file is removed.
void write_file_atomically(const std::string& path, const std::function<void(H5File&)>& fill);

}  // namespace mxlab::h5
