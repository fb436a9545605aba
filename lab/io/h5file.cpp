// HDF5 file, attribute and extendable-dataset wrappers over the C API (see h5file.h).
// Only calls present unchanged from HDF5 1.10 to 1.14 are used (no H5Literate/H5Oget_info,
// whose signatures changed in 1.12): links are listed with H5Lget_name_by_idx and object
// kinds found by opening them.
#include "lab/io/h5file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "lab/core/error.h"
#include "lab/io/h5check.h"
#include "lab/io/out_file.h"

namespace mxlab::h5 {

static_assert(std::is_same<hid_t, Hid>::value, "HDF5 >= 1.10 is required (hid_t must be int64_t)");

namespace {

// HDF5 prints its error stack to stderr by default. Switch that off (the stack is still
// recorded) and turn failures into exceptions carrying the innermost messages instead. The
// setting is per thread in a thread-safe HDF5 build (Debian's is one), so every thread that
// touches a file does this once; `mxlab run --jobs N` opens files from N threads.
//
// Also, once per process and before HDF5 initialises: no teardown of the library at exit.
// A file whose close failed (its disk is full, so the final flush fails) stays in HDF5's table
// of open ids with its memory already freed, and the teardown at exit then crashes (SIGSEGV in
// H5F__close_cb, HDF5 1.10.8). mxlab closes every file it opens before it exits, and the run
// files are recoverable from their snapshots by design (lab/runs/run_file.h), so nothing
// relies on that teardown.
void silence_hdf5_printing() {
  static const bool process_once = [] {
    H5dont_atexit();
    return true;
  }();
  (void)process_once;
  thread_local bool thread_done = false;
  if (thread_done) return;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  thread_done = true;
}

// The current HDF5 error stack, cleared: its innermost records (they say what actually went
// wrong), outermost first, as "desc; desc; desc" on one line, and the errno of a failed system
// call when a record reports one (the file drivers write "errno = 28, error message = ...").
struct StackText {
  std::string text;
  int err = 0;
};
StackText hdf5_error_stack() {
  std::vector<std::string> records;  // from the API call down to the failing internal function
  auto collect = [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
    if (err->desc != nullptr && err->desc[0] != '\0') static_cast<std::vector<std::string>*>(data)->push_back(err->desc);
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &records);
  H5Eclear2(H5E_DEFAULT);
  StackText out;
  for (const std::string& r : records) {
    const auto at = r.find("errno = ");
    if (at != std::string::npos) out.err = std::atoi(r.c_str() + at + 8);
  }
  constexpr size_t kMaxRecords = 3;
  for (size_t i = records.size() > kMaxRecords ? records.size() - kMaxRecords : 0; i < records.size(); ++i) {
    if (!out.text.empty()) out.text += "; ";
    out.text += records[i];
  }
  for (char& c : out.text)
    if (c == '\n') c = ' ';
  if (out.text.empty()) out.text = "no HDF5 error message";
  return out;
}

// A failed HDF5 call. Where the file system refused (disk full, read-only, permissions) the
// error is an IoError that names the file and the cause in words, not HDF5's driver dump.
[[noreturn]] void fail_with(const StackText& st, const std::string& what, const std::string& file,
                            const std::string& object = "") {
  // Only the file system's refusals; e.g. a lock held by another process (EAGAIN) keeps HDF5's
  // own text, which lab/runs/run_file.cpp recognises.
  const bool refused = st.err == ENOSPC || st.err == EDQUOT || st.err == EROFS || st.err == EACCES ||
                       st.err == EPERM || st.err == EFBIG || st.err == EIO;
  if (refused) {
    const bool reading = what.rfind("cannot read", 0) == 0 || what.rfind("cannot open file for reading", 0) == 0;
    const bool creating = what.rfind("cannot create file", 0) == 0;
    throw_io_error(reading ? "read" : (creating ? "create" : "write"), file, st.err);
  }
  throw Error(msg("HDF5: ", what, object.empty() ? "" : " '" + object + "'", " in ", file, ": ", st.text));
}

[[noreturn]] void fail(const std::string& what, const std::string& file, const std::string& object = "") {
  fail_with(hdf5_error_stack(), what, file, object);
}

// A temporary HDF5 handle closed at scope exit (types, spaces, property lists, attributes).
class Handle {
 public:
  Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  ~Handle() {
    if (id_ >= 0) closer_(id_);
  }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, -1)), closer_(other.closer_) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle& operator=(Handle&&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*closer_)(hid_t);
};

// Closes any object id (group, dataset, file) by its kind.
herr_t close_object(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE: return H5Fclose(id);
    case H5I_GROUP: return H5Gclose(id);
    case H5I_DATASET: return H5Dclose(id);
    default: return H5Oclose(id);
  }
}

std::string normalize_path(const std::string& p) { return p.empty() ? "/" : p; }

// Variable-length UTF-8 string type (what h5py writes for str).
Handle vlen_string_type(const std::string& file) {
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!t.ok() || H5Tset_size(t.get(), H5T_VARIABLE) < 0 || H5Tset_cset(t.get(), H5T_CSET_UTF8) < 0)
    fail("cannot make a string type", file);
  return t;
}

// Reads `count` strings stored as variable-length or fixed-length strings.
std::vector<std::string> read_strings(hid_t attr, size_t count, const std::string& file, const std::string& what) {
  Handle ftype(H5Aget_type(attr), H5Tclose);
  if (!ftype.ok() || H5Tget_class(ftype.get()) != H5T_STRING)
    throw Error(msg("HDF5: attribute ", what, " in ", file, " is not a string"));
  std::vector<std::string> out(count);
  const htri_t is_vlen = H5Tis_variable_str(ftype.get());
  const H5T_cset_t cset = H5Tget_cset(ftype.get());
  if (is_vlen < 0 || cset < 0) fail("cannot read the type of string attribute", file, what);
  if (is_vlen > 0) {
    // Same character set as stored (HDF5 does not convert ASCII <-> UTF-8).
    Handle mtype(H5Tcopy(H5T_C_S1), H5Tclose);
    if (!mtype.ok() || H5Tset_size(mtype.get(), H5T_VARIABLE) < 0 || H5Tset_cset(mtype.get(), cset) < 0)
      fail("cannot make a string type", file);
    std::vector<char*> ptrs(count, nullptr);
    if (count > 0 && H5Aread(attr, mtype.get(), ptrs.data()) < 0) fail("cannot read string attribute", file, what);
    for (size_t i = 0; i < count; ++i) {
      out[i] = ptrs[i] ? ptrs[i] : "";
      H5free_memory(ptrs[i]);
    }
  } else {
    const size_t len = H5Tget_size(ftype.get());
    if (len == 0) fail("cannot read the type of string attribute", file, what);
    Handle mtype(H5Tcopy(H5T_C_S1), H5Tclose);
    if (!mtype.ok() || H5Tset_size(mtype.get(), len) < 0 || H5Tset_cset(mtype.get(), cset) < 0)
      fail("cannot make a string type", file);
    std::vector<char> buf(len * count + 1, '\0');
    if (count > 0 && H5Aread(attr, mtype.get(), buf.data()) < 0) fail("cannot read string attribute", file, what);
    for (size_t i = 0; i < count; ++i) {
      const char* s = buf.data() + i * len;
      size_t n = 0;
      while (n < len && s[n] != '\0') ++n;  // fixed-length strings are null- or space-padded
      while (n > 0 && s[n - 1] == ' ') --n;
      out[i] = std::string(s, n);
    }
  }
  return out;
}

// Size in bytes of the file that holds object `id` (0 if unknown).
uint64_t file_size_of(hid_t id) {
  const hid_t f = H5Iget_file_id(id);
  if (f < 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  hsize_t size = 0;
  if (H5Fget_filesize(f, &size) < 0) {
    H5Eclear2(H5E_DEFAULT);
    size = 0;
  }
  H5Fclose(f);
  return static_cast<uint64_t>(size);
}

// Whether `count` elements of `elem_bytes` bytes each can be in a file of `file_bytes` bytes:
// a damaged shape or type claims more (an extendable dataset may hold one chunk of fill values
// beyond what was written, hence the slack). Refusing it keeps a damaged size from becoming a
// huge allocation.
bool fits_in_file(uint64_t count, uint64_t elem_bytes, uint64_t file_bytes) {
  constexpr uint64_t kSlack = uint64_t{64} << 20;
  if (file_bytes == 0) return true;
  if (elem_bytes != 0 && count > (UINT64_MAX / 4) / elem_bytes) return false;
  return count * elem_bytes <= 2 * file_bytes + kSlack;
}

// Number of elements of an attribute's dataspace (1 for a scalar).
size_t attr_element_count(hid_t attr, const std::string& file, const std::string& what) {
  Handle space(H5Aget_space(attr), H5Sclose);
  const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (n < 0) fail("cannot read the shape of attribute", file, what);
  Handle type(H5Aget_type(attr), H5Tclose);
  const size_t elem = type.ok() ? H5Tget_size(type.get()) : 0;
  if (elem == 0) fail("cannot read the type of attribute", file, what);
  if (!fits_in_file(static_cast<uint64_t>(n), elem, file_size_of(attr)))
    throw Error(msg("HDF5: attribute ", what, " in ", file, " claims ", n, " elements, more than the file holds: the "
                    "file is damaged"));
  return static_cast<size_t>(n);
}

H5T_class_t attr_class(hid_t attr) {
  Handle t(H5Aget_type(attr), H5Tclose);
  return t.ok() ? H5Tget_class(t.get()) : H5T_NO_CLASS;
}

// A link that exists but does not open: a soft link may dangle (nothing there); a hard link
// that does not open is damage, and says so instead of looking like an absent object.
H5I_type_t unopenable_link(hid_t loc, const std::string& name, const std::string& file_name, const std::string& path) {
  const StackText why = hdf5_error_stack();  // of the failed open (the next call clears it)
  H5L_info_t info;
  const herr_t rc = H5Lget_info(loc, name.c_str(), &info, H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  if (rc >= 0 && info.type != H5L_TYPE_HARD) return H5I_BADID;
  throw Error(msg("HDF5: cannot open object '", path, "' in ", file_name, " (the file is damaged): ", why.text));
}

// Kind of the object at `path` (H5I_GROUP, H5I_DATASET), or H5I_BADID if there is none; an
// error when a link on the way is damaged. Walks the path one link at a time because H5Lexists
// fails on a missing parent.
H5I_type_t object_kind(hid_t file, const std::string& file_name, const std::string& path) {
  if (path.empty() || path == "/") return H5I_GROUP;
  size_t pos = 0;
  std::string parent = "/";
  while (true) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    const htri_t exists = H5Lexists(file, prefix.c_str(), H5P_DEFAULT);
    if (exists == 0) return H5I_BADID;
    if (exists < 0) {
      // Fails on a parent that is not a group (nothing there), or on damage.
      H5Eclear2(H5E_DEFAULT);
      const hid_t g = H5Gopen2(file, parent.c_str(), H5P_DEFAULT);
      if (g < 0) {
        H5Eclear2(H5E_DEFAULT);
        return H5I_BADID;
      }
      H5Gclose(g);
      H5Lexists(file, prefix.c_str(), H5P_DEFAULT);  // again, for its error stack
      fail("cannot look up link (the file is damaged)", file_name, prefix);
    }
    if (pos == std::string::npos) break;
    parent = prefix;
  }
  const hid_t id = H5Oopen(file, path.c_str(), H5P_DEFAULT);
  if (id < 0) return unopenable_link(file, path, file_name, path);
  const H5I_type_t kind = H5Iget_type(id);
  H5Oclose(id);
  return kind;
}

// Link-creation properties that create missing parent groups.
Handle intermediate_groups_lcpl(const std::string& file) {
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  if (!lcpl.ok() || H5Pset_create_intermediate_group(lcpl.get(), 1) < 0) fail("cannot make link properties", file);
  return lcpl;
}

std::vector<std::string> list_links_of_kind(hid_t file, const std::string& file_name, const std::string& group,
                                            H5I_type_t kind) {
  const std::string g = normalize_path(group);
  Handle gid(H5Gopen2(file, g.c_str(), H5P_DEFAULT), H5Gclose);
  if (!gid.ok()) fail("cannot open group", file_name, g);
  H5G_info_t info;
  if (H5Gget_info(gid.get(), &info) < 0) fail("cannot read group", file_name, g);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(gid.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) fail("cannot list group", file_name, g);
    std::string name(static_cast<size_t>(len) + 1, '\0');
    if (H5Lget_name_by_idx(gid.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT) != len)
      fail("cannot list group", file_name, g);
    name.resize(static_cast<size_t>(len));
    const hid_t child = H5Oopen(gid.get(), name.c_str(), H5P_DEFAULT);
    if (child < 0) {
      // A dangling soft link is neither a group nor a dataset; a hard link must open.
      unopenable_link(gid.get(), name, file_name, g == "/" ? name : g + "/" + name);
      continue;
    }
    if (H5Iget_type(child) == kind) names.push_back(name);
    H5Oclose(child);
  }
  return names;  // H5_INDEX_NAME + H5_ITER_INC: already in name order
}

hid_t file_type_of(DType t) {
  switch (t) {
    case DType::f64: return H5T_IEEE_F64LE;
    case DType::f32: return H5T_IEEE_F32LE;
    default: return H5T_STD_I64LE;
  }
}

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "float64";
    case DType::f32: return "float32";
    default: return "int64";
  }
}

// ---------------------------------------------------------------- H5Object (attributes)

H5Object::H5Object(Hid id, std::string file, std::string path) : id_(id), file_(std::move(file)), path_(std::move(path)) {
  silence_hdf5_printing();  // an object may be used from a thread other than its file's
}

H5Object::~H5Object() { close_handle(); }

H5Object::H5Object(H5Object&& other) noexcept
    : id_(std::exchange(other.id_, -1)), file_(std::move(other.file_)), path_(std::move(other.path_)) {}

H5Object& H5Object::operator=(H5Object&& other) noexcept {
  if (this != &other) {
    close_handle();
    id_ = std::exchange(other.id_, -1);
    file_ = std::move(other.file_);
    path_ = std::move(other.path_);
  }
  return *this;
}

void H5Object::close_handle() noexcept {
  if (id_ >= 0) close_object(id_);
  id_ = -1;
}

namespace {

// Creates attribute `name` on `obj` (replacing an existing one) and writes its `count`
// elements from `data` (an empty attribute is created and left unwritten).
void write_attr(const H5Object& obj, const std::string& name, hid_t file_type, hid_t mem_type, hid_t space,
                const void* data, size_t count = 1) {
  const std::string what = obj.path() + "@" + name;
  const htri_t exists = H5Aexists(obj.id(), name.c_str());
  if (exists < 0) fail("cannot look up attribute", obj.file_name(), what);
  if (exists > 0 && H5Adelete(obj.id(), name.c_str()) < 0) fail("cannot replace attribute", obj.file_name(), what);
  Handle attr(H5Acreate2(obj.id(), name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) fail("cannot create attribute", obj.file_name(), what);
  if (count > 0 && H5Awrite(attr.get(), mem_type, data) < 0) fail("cannot write attribute", obj.file_name(), what);
}

Handle scalar_space(const std::string& file) {
  Handle s(H5Screate(H5S_SCALAR), H5Sclose);
  if (!s.ok()) fail("cannot make a dataspace", file);
  return s;
}

Handle vector_space(size_t n, const std::string& file) {
  const hsize_t dims[1] = {static_cast<hsize_t>(n)};
  Handle s(H5Screate_simple(1, dims, nullptr), H5Sclose);
  if (!s.ok()) fail("cannot make a dataspace", file);
  return s;
}

Handle open_attr(const H5Object& obj, const std::string& name) {
  Handle attr(H5Aopen(obj.id(), name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) {
    H5Eclear2(H5E_DEFAULT);
    throw Error(msg("HDF5: ", obj.file_name(), ": object '", obj.path(), "' has no attribute '", name, "'"));
  }
  return attr;
}

}  // namespace

void H5Object::set_attr(const std::string& name, const std::string& value) {
  Handle type = vlen_string_type(file_);
  Handle space = scalar_space(file_);
  const char* ptr = value.c_str();
  write_attr(*this, name, type.get(), type.get(), space.get(), &ptr);
}

void H5Object::set_attr(const std::string& name, int64_t value) {
  Handle space = scalar_space(file_);
  write_attr(*this, name, H5T_STD_I64LE, H5T_NATIVE_INT64, space.get(), &value);
}

void H5Object::set_attr(const std::string& name, uint64_t value) {
  Handle space = scalar_space(file_);
  write_attr(*this, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, space.get(), &value);
}

void H5Object::set_attr(const std::string& name, double value) {
  Handle space = scalar_space(file_);
  write_attr(*this, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space.get(), &value);
}

void H5Object::set_attr(const std::string& name, const std::vector<std::string>& value) {
  Handle type = vlen_string_type(file_);
  Handle space = vector_space(value.size(), file_);
  std::vector<const char*> ptrs;
  for (const auto& s : value) ptrs.push_back(s.c_str());
  write_attr(*this, name, type.get(), type.get(), space.get(), ptrs.data(), ptrs.size());
}

void H5Object::set_attr(const std::string& name, const std::vector<double>& value) {
  Handle space = vector_space(value.size(), file_);
  write_attr(*this, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space.get(), value.data(), value.size());
}

bool H5Object::has_attr(const std::string& name) const {
  const htri_t exists = H5Aexists(id_, name.c_str());
  if (exists < 0) fail("cannot look up attribute", file_, path_ + "@" + name);
  return exists > 0;
}

std::vector<std::string> H5Object::attr_names() const {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Aiterate2(id_, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &names) < 0) fail("cannot list attributes", file_, path_);
  return names;
}

std::string H5Object::get_attr_string(const std::string& name) const {
  Handle attr = open_attr(*this, name);
  const std::string what = path_ + "@" + name;
  if (attr_element_count(attr.get(), file_, what) != 1)
    throw Error(msg("HDF5: attribute ", what, " in ", file_, " is a list, not a single string"));
  return read_strings(attr.get(), 1, file_, what)[0];
}

std::vector<std::string> H5Object::get_attr_strings(const std::string& name) const {
  Handle attr = open_attr(*this, name);
  const std::string what = path_ + "@" + name;
  return read_strings(attr.get(), attr_element_count(attr.get(), file_, what), file_, what);
}

int64_t H5Object::get_attr_int64(const std::string& name) const {
  Handle attr = open_attr(*this, name);
  const std::string what = path_ + "@" + name;
  if (attr_class(attr.get()) != H5T_INTEGER || attr_element_count(attr.get(), file_, what) != 1)
    throw Error(msg("HDF5: attribute ", what, " in ", file_, " is not a single integer"));
  int64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0) fail("cannot read attribute", file_, what);
  return v;
}

uint64_t H5Object::get_attr_uint64(const std::string& name) const {
  Handle attr = open_attr(*this, name);
  const std::string what = path_ + "@" + name;
  if (attr_class(attr.get()) != H5T_INTEGER || attr_element_count(attr.get(), file_, what) != 1)
    throw Error(msg("HDF5: attribute ", what, " in ", file_, " is not a single integer"));
  // HDF5 clamps a negative value to 0 when converting to unsigned: refuse instead.
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_sign(type.get()) == H5T_SGN_2) {
    int64_t v = 0;
    if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0) fail("cannot read attribute", file_, what);
    if (v < 0) throw Error(msg("HDF5: attribute ", what, " in ", file_, " is negative (", v, "), not a uint64"));
    return static_cast<uint64_t>(v);
  }
  uint64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_UINT64, &v) < 0) fail("cannot read attribute", file_, what);
  return v;
}

double H5Object::get_attr_double(const std::string& name) const {
  const std::vector<double> v = get_attr_doubles(name);
  if (v.size() != 1)
    throw Error(msg("HDF5: attribute ", path_, "@", name, " in ", file_, " has ", v.size(), " values, not one"));
  return v[0];
}

std::vector<double> H5Object::get_attr_doubles(const std::string& name) const {
  Handle attr = open_attr(*this, name);
  const std::string what = path_ + "@" + name;
  const H5T_class_t cls = attr_class(attr.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) throw Error(msg("HDF5: attribute ", what, " in ", file_, " is not numeric"));
  std::vector<double> v(attr_element_count(attr.get(), file_, what));
  if (!v.empty() && H5Aread(attr.get(), H5T_NATIVE_DOUBLE, v.data()) < 0) fail("cannot read attribute", file_, what);
  return v;
}

// ---------------------------------------------------------------- H5File

namespace {

// The file descriptor HDF5 holds for file `id` (sec2 driver), or -1.
int file_descriptor(hid_t id) {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(id, H5P_DEFAULT, &handle) < 0 || handle == nullptr) {
    H5Eclear2(H5E_DEFAULT);
    return -1;
  }
  return *static_cast<int*>(handle);
}

}  // namespace

void H5File::open_image(const std::string& image) {
  // HDF5's in-memory driver on a copy of the image, under a name of its own that names no file
  // (with an image, the driver refuses a name that exists; open files are told apart by name).
  static std::atomic<uint64_t> counter{0};
  const std::string name = msg("/dev/null/mxlab-image-", ::getpid(), "-", counter.fetch_add(1));
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.ok() || H5Pset_fapl_core(fapl.get(), size_t{1} << 20, 0) < 0 ||
      H5Pset_file_image(fapl.get(), const_cast<char*>(image.data()), image.size()) < 0)
    fail("cannot set up reading", path_);
  id_ = H5Fopen(name.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (id_ < 0) fail("cannot open file for reading", path_);
}

namespace {

std::atomic<int64_t> g_append_lock_wait_ms{std::chrono::milliseconds(kDefaultAppendLockWait).count()};

// A file access property list that takes no file lock (HDF5 >= 1.10.7; older versions lock).
Handle no_lock_fapl(const std::string& path) {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.ok()) fail("cannot set up reading", path);
#if H5_VERSION_GE(1, 10, 7)
  if (H5Pset_file_locking(fapl.get(), false, true) < 0) fail("cannot set up reading without a lock", path);
#endif
  return fapl;
}

}  // namespace

std::chrono::milliseconds append_lock_wait() { return std::chrono::milliseconds(g_append_lock_wait_ms.load()); }
void set_append_lock_wait(std::chrono::milliseconds wait) { g_append_lock_wait_ms.store(wait.count()); }

void retry_while_in_use(const std::string& path, std::chrono::milliseconds wait, const std::function<void()>& attempt) {
  const auto t0 = std::chrono::steady_clock::now();
  bool said = false;
  for (;;) {
    try {
      attempt();
      return;
    } catch (const FileInUse&) {
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      if (waited >= wait)
        throw FileInUse(msg(path, " is open in another process, which holds an HDF5 lock on it (an h5py or HDFView "
                            "session?), still after ", (waited.count() + 500) / 1000,
                            " s; it was left as it is: close it there and run the same command again"),
                        path);
      if (!said)
        std::fprintf(stderr, "mxlab: %s is open in another process (an HDF5 lock); waiting up to %lld s for it\n",
                     path.c_str(), static_cast<long long>((wait.count() + 999) / 1000));
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

bool locked_by_another_open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // An exclusive request conflicts with any lock another open file description holds; a lock
  // it gets here is released by the close.
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

H5File::H5File(const std::string& path, Mode mode, std::optional<std::chrono::milliseconds> lock_wait) : path_(path) {
  silence_hdf5_printing();
  switch (mode) {
    case Mode::create: {
      // Created under a name of its own with O_EXCL (never through a link, never truncating a
      // file that other names share), then renamed over `path`.
      const std::string fresh = msg(path, ".new.", ::getpid());
      if (::unlink(fresh.c_str()) != 0 && errno != ENOENT) throw_io_error("create", path, errno);
      id_ = H5Fcreate(fresh.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
      if (id_ < 0) fail("cannot create file (is the directory there and writable?)", path);
      if (std::rename(fresh.c_str(), path.c_str()) != 0) {
        const int err = errno;
        H5Fclose(id_);
        id_ = -1;
        ::unlink(fresh.c_str());
        throw_io_error("create", path, err);
      }
      break;
    }
    case Mode::append:
    case Mode::read: {
      const unsigned flags = mode == Mode::append ? H5F_ACC_RDWR : H5F_ACC_RDONLY;
      if (std::FILE* probe = std::fopen(path.c_str(), "rb")) {
        std::fclose(probe);
      } else {
        throw Error(msg("HDF5: cannot open ", path, ": no such file (check the path)"));
      }
      if (mode == Mode::append) refuse_symlink(path);
      if (!inside_file_check()) {
        // Read whole by another process first; reading, this process decodes only the clean
        // image that process made (h5check.h).
        const std::shared_ptr<const std::string> image = clean_image(path);
        if (mode == Mode::read) {
          open_image(*image);
          break;
        }
      }
      if (mode == Mode::read) {
        const Handle fapl = no_lock_fapl(path);
        id_ = H5Fopen(path.c_str(), flags, fapl.get());
        if (id_ < 0) {
          // A file this process has open to write (inherited by the check's child) is shared
          // with that open, whose locking flag a second open must match: HDF5 refuses one that
          // differs ("file locking flag values don't match"). The same open with locking then
          // takes no new lock. Any other failure is reported as the lock-free open saw it.
          const StackText first = hdf5_error_stack();
          id_ = H5Fopen(path.c_str(), flags, H5P_DEFAULT);
          if (id_ < 0) {
            H5Eclear2(H5E_DEFAULT);
            fail_with(first, "cannot open file for reading", path);
          }
        }
      } else {
        open_to_append(path, lock_wait.value_or(append_lock_wait()));
      }
      if (mode == Mode::append) {
        // What HDF5 opened must be the regular file named `path`, not one a link put there since.
        struct stat opened {}, named {};
        const int fd = file_descriptor(id_);
        const bool same = fd >= 0 && ::fstat(fd, &opened) == 0 && ::lstat(path.c_str(), &named) == 0 &&
                          S_ISREG(named.st_mode) && opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
        if (!same) {
          H5Fclose(id_);
          id_ = -1;
          throw_io_error("write", path, ELOOP);
        }
      }
      break;
    }
  }
}

void H5File::open_to_append(const std::string& path, std::chrono::milliseconds wait) {
  // Another process's lock (an h5py session reading the file) is waited for, then reported as
  // such: the file is whole, and treating it as damaged would throw a resumable run away.
  retry_while_in_use(path, wait, [&] {
    id_ = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (id_ >= 0) return;
    if (!locked_by_another_open(path)) fail("cannot open file for appending", path);
    H5Eclear2(H5E_DEFAULT);
    throw FileInUse(msg(path, " is open in another process, which holds an HDF5 lock on it"), path);
  });
}

H5File::~H5File() {
  if (id_ >= 0) H5Fclose(id_);
}

H5File::H5File(H5File&& other) noexcept : path_(std::move(other.path_)), id_(std::exchange(other.id_, -1)) {}

H5File& H5File::operator=(H5File&& other) noexcept {
  if (this != &other) {
    if (id_ >= 0) H5Fclose(id_);
    path_ = std::move(other.path_);
    id_ = std::exchange(other.id_, -1);
  }
  return *this;
}

void H5File::flush() {
  if (H5Fflush(id_, H5F_SCOPE_GLOBAL) < 0) fail("cannot flush file", path_);
}

void H5File::close() {
  if (id_ < 0) return;
  const herr_t rc = H5Fclose(id_);
  id_ = -1;
  if (rc < 0) fail("cannot close file", path_);
}

void H5File::create_group(const std::string& group) {
  const H5I_type_t kind = object_kind(id_, path_, group);
  if (kind == H5I_GROUP) return;
  if (kind != H5I_BADID) throw Error(msg("HDF5: ", path_, ": '", group, "' exists and is not a group"));
  Handle lcpl = intermediate_groups_lcpl(path_);
  Handle g(H5Gcreate2(id_, group.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g.ok()) fail("cannot create group", path_, group);
}

bool H5File::exists(const std::string& object) const { return object_kind(id_, path_, object) != H5I_BADID; }
bool H5File::is_group(const std::string& object) const { return object_kind(id_, path_, object) == H5I_GROUP; }
bool H5File::is_dataset(const std::string& object) const { return object_kind(id_, path_, object) == H5I_DATASET; }

std::vector<std::string> H5File::list_groups(const std::string& group) const {
  return list_links_of_kind(id_, path_, group, H5I_GROUP);
}

std::vector<std::string> H5File::list_datasets(const std::string& group) const {
  return list_links_of_kind(id_, path_, group, H5I_DATASET);
}

H5Object H5File::object(const std::string& path) const {
  const std::string p = normalize_path(path);
  if (object_kind(id_, path_, p) == H5I_BADID) throw Error(msg("HDF5: ", path_, ": no group or dataset '", p, "'"));
  const hid_t id = H5Oopen(id_, p.c_str(), H5P_DEFAULT);
  if (id < 0) fail("cannot open object", path_, p);
  return H5Object(id, path_, p);
}

namespace {

// Opens a dataset and its dataspace; returns the dims.
std::vector<hsize_t> dataset_dims(hid_t dset, const std::string& file, const std::string& path,
                                  std::vector<hsize_t>* maxdims = nullptr) {
  Handle space(H5Dget_space(dset), H5Sclose);
  const int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank < 0) fail("cannot read the shape of dataset", file, path);
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), maxd(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), maxd.data()) < 0)
    fail("cannot read the shape of dataset", file, path);
  if (maxdims) *maxdims = maxd;
  return dims;
}

Handle open_dataset(hid_t file, const std::string& file_name, const std::string& path) {
  if (object_kind(file, file_name, path) != H5I_DATASET) throw Error(msg("HDF5: ", file_name, ": no dataset '", path, "'"));
  Handle d(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.ok()) fail("cannot open dataset", file_name, path);
  return d;
}

// Elements of a dataset about to be read whole, refused when the file cannot hold that many
// (a damaged shape or element type).
size_t checked_count(hid_t dset, hid_t type, const std::string& file, const std::string& path) {
  const size_t elem = H5Tget_size(type);
  if (elem == 0) fail("cannot read the type of dataset", file, path);
  uint64_t n = 1;
  bool overflow = false;
  for (hsize_t d : dataset_dims(dset, file, path)) {
    if (d != 0 && n > UINT64_MAX / d) overflow = true;
    else n *= d;
  }
  if (overflow || !fits_in_file(n, elem, file_size_of(dset)))
    throw Error(msg("HDF5: dataset '", path, "' in ", file, " claims more elements than the file holds: the file is "
                    "damaged"));
  return static_cast<size_t>(n);
}

}  // namespace

std::vector<uint64_t> H5File::dataset_shape(const std::string& dataset) const {
  Handle d = open_dataset(id_, path_, dataset);
  const std::vector<hsize_t> dims = dataset_dims(d.get(), path_, dataset);
  return std::vector<uint64_t>(dims.begin(), dims.end());
}

std::vector<double> H5File::read_doubles(const std::string& dataset) const {
  Handle d = open_dataset(id_, path_, dataset);
  Handle type(H5Dget_type(d.get()), H5Tclose);
  const H5T_class_t cls = type.ok() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  if (cls == H5T_NO_CLASS) fail("cannot read the type of dataset", path_, dataset);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    throw Error(msg("HDF5: dataset '", dataset, "' in ", path_, " is not numeric"));
  std::vector<double> v(checked_count(d.get(), type.get(), path_, dataset));
  if (!v.empty() && H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    fail("cannot read dataset", path_, dataset);
  return v;
}

std::vector<int64_t> H5File::read_int64s(const std::string& dataset) const {
  Handle d = open_dataset(id_, path_, dataset);
  Handle type(H5Dget_type(d.get()), H5Tclose);
  const H5T_class_t cls = type.ok() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  if (cls == H5T_NO_CLASS) fail("cannot read the type of dataset", path_, dataset);
  if (cls != H5T_INTEGER)
    throw Error(msg("HDF5: dataset '", dataset, "' in ", path_, " is not an integer dataset (use read_doubles)"));
  std::vector<int64_t> v(checked_count(d.get(), type.get(), path_, dataset));
  if (!v.empty() && H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    fail("cannot read dataset", path_, dataset);
  return v;
}

// ---------------------------------------------------------------- H5Series

namespace {
constexpr unsigned kDeflateLevel = 4;
// Without the zlib filter (an HDF5 built without it) datasets are written uncompressed.
bool deflate_available() {
  static const bool avail = [] {
    unsigned config = 0;
    return H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0 && H5Zget_filter_info(H5Z_FILTER_DEFLATE, &config) >= 0 &&
           (config & H5Z_FILTER_CONFIG_ENCODE_ENABLED) != 0;
  }();
  return avail;
}
}  // namespace

H5Series H5Series::create(H5File& file, const std::string& path, DType dtype, size_t width, size_t chunk_rows) {
  if (chunk_rows == 0) throw Error(msg("HDF5: dataset '", path, "' in ", file.path(), ": chunk_rows must be > 0"));
  if (file.exists(path)) throw Error(msg("HDF5: ", file.path(), ": '", path, "' already exists (open it to append)"));
  const int rank = width == 0 ? 1 : 2;
  const hsize_t dims[2] = {0, static_cast<hsize_t>(width)};
  const hsize_t maxdims[2] = {H5S_UNLIMITED, static_cast<hsize_t>(width)};
  const hsize_t chunk[2] = {static_cast<hsize_t>(chunk_rows), static_cast<hsize_t>(width)};
  Handle space(H5Screate_simple(rank, dims, maxdims), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space.ok() || !dcpl.ok() || H5Pset_chunk(dcpl.get(), rank, chunk) < 0)
    fail("cannot set up dataset", file.path(), path);
  // Byte shuffle + deflate: a chunk holds kDefaultChunkRows rows whether or not they are
  // written, so a short series is mostly zeros on disk without it. Values are unchanged.
  if (deflate_available() &&
      (H5Pset_shuffle(dcpl.get()) < 0 || H5Pset_deflate(dcpl.get(), kDeflateLevel) < 0))
    fail("cannot set up compression of dataset", file.path(), path);
  Handle lcpl = intermediate_groups_lcpl(file.path());
  const hid_t d = H5Dcreate2(file.id(), path.c_str(), file_type_of(dtype), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT);
  if (d < 0) fail("cannot create dataset", file.path(), path);
  H5Series s;
  s.id_ = d;
  s.file_ = file.path();
  s.path_ = path;
  s.dtype_ = dtype;
  s.width_ = width;
  s.rows_ = 0;
  return s;
}

H5Series H5Series::open(H5File& file, const std::string& path) {
  if (!file.is_dataset(path)) throw Error(msg("HDF5: ", file.path(), ": no dataset '", path, "' to append to"));
  H5Series s;
  s.id_ = H5Dopen2(file.id(), path.c_str(), H5P_DEFAULT);
  s.file_ = file.path();
  s.path_ = path;
  if (s.id_ < 0) fail("cannot open dataset", file.path(), path);
  std::vector<hsize_t> maxdims;
  const std::vector<hsize_t> dims = dataset_dims(s.id_, s.file_, path, &maxdims);
  if (dims.empty() || dims.size() > 2 || maxdims[0] != H5S_UNLIMITED)
    throw Error(msg("HDF5: dataset '", path, "' in ", s.file_, " is not an extendable [n] or [n, width] series"));
  s.rows_ = static_cast<size_t>(dims[0]);
  s.width_ = dims.size() == 2 ? static_cast<size_t>(dims[1]) : 0;
  Handle type(H5Dget_type(s.id_), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t bytes = H5Tget_size(type.get());
  if (cls == H5T_FLOAT && bytes == 8) {
    s.dtype_ = DType::f64;
  } else if (cls == H5T_FLOAT && bytes == 4) {
    s.dtype_ = DType::f32;
  } else if (cls == H5T_INTEGER && bytes == 8 && H5Tget_sign(type.get()) == H5T_SGN_2) {
    s.dtype_ = DType::i64;
  } else {
    throw Error(msg("HDF5: dataset '", path, "' in ", s.file_, " has an element type other than float64/float32/int64"));
  }
  return s;
}

template <typename T>
void H5Series::append_one_row(const T* values, size_t count) {
  if (count != row_length())
    throw Error(msg("HDF5: dataset '", path_, "' in ", file_, " has rows of ", row_length(), " values, got ", count));
  append_rows(values, 1);
}

template void H5Series::append_one_row<double>(const double*, size_t);
template void H5Series::append_one_row<float>(const float*, size_t);
template void H5Series::append_one_row<int64_t>(const int64_t*, size_t);

void H5Series::append_rows(const double* values, size_t n_rows) { write_rows(values, H5T_NATIVE_DOUBLE, true, n_rows); }
void H5Series::append_rows(const float* values, size_t n_rows) { write_rows(values, H5T_NATIVE_FLOAT, true, n_rows); }
void H5Series::append_rows(const int64_t* values, size_t n_rows) { write_rows(values, H5T_NATIVE_INT64, false, n_rows); }

void H5Series::write_rows(const void* values, Hid mem_type, bool values_are_float, size_t n_rows) {
  if (id_ < 0) throw Error(msg("HDF5: append to a closed or empty series '", path_, "'"));
  if (values_are_float && dtype_ == DType::i64)
    throw Error(msg("HDF5: dataset '", path_, "' in ", file_, " is int64: append integers, not floating-point values"));
  if (n_rows == 0) return;
  const int rank = width_ == 0 ? 1 : 2;
  const hsize_t new_dims[2] = {static_cast<hsize_t>(rows_ + n_rows), static_cast<hsize_t>(width_)};
  if (H5Dset_extent(id_, new_dims) < 0) fail("cannot extend dataset", file_, path_);
  Handle fspace(H5Dget_space(id_), H5Sclose);
  const hsize_t start[2] = {static_cast<hsize_t>(rows_), 0};
  const hsize_t count[2] = {static_cast<hsize_t>(n_rows), static_cast<hsize_t>(width_)};
  if (!fspace.ok() || H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) < 0)
    fail("cannot select rows of dataset", file_, path_);
  Handle mspace(H5Screate_simple(rank, count, nullptr), H5Sclose);
  if (!mspace.ok() || H5Dwrite(id_, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, values) < 0)
    fail("cannot write rows of dataset", file_, path_);
  rows_ += n_rows;
}

void H5Series::truncate(size_t rows) {
  if (rows > rows_)
    throw Error(msg("HDF5: cannot truncate dataset '", path_, "' in ", file_, " to ", rows, " rows: it has only ", rows_));
  const hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(width_)};
  if (H5Dset_extent(id_, dims) < 0) fail("cannot truncate dataset", file_, path_);
  rows_ = rows;
}

// ---------------------------------------------------------------- atomic files

void write_file_atomically(const std::string& path, const std::function<void(H5File&)>& fill) {
  const std::string tmp = path + ".tmp";
  try {
    H5File f(tmp, H5File::Mode::create);
    fill(f);
    f.close();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(msg("cannot rename ", tmp, " to ", path, " (is the directory writable?)"));
  }
}

}  // namespace mxlab::h5
