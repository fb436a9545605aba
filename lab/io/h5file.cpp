// HDF5 file, attribute and extendable-dataset wrappers over the C API (see h5file.h).
// Only calls present unchanged from HDF5 1.10 to 1.14 are used (no H5Literate/H5Oget_info,
// whose signatures changed in 1.12): links are listed with H5Lget_name_by_idx and object
// kinds found by opening them.
#include "lab/io/h5file.h"

#include <hdf5.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lab/core/error.h"

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
// files are recoverable from their snapshots by design (lab/train/run_file.h), so nothing
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
[[noreturn]] void fail(const std::string& what, const std::string& file, const std::string& object = "") {
  const StackText st = hdf5_error_stack();
  // Only the file system's refusals; e.g. a lock held by another process (EAGAIN) keeps HDF5's
  // own text, which lab/train/run_file.cpp recognises.
  const bool refused = st.err == ENOSPC || st.err == EDQUOT || st.err == EROFS || st.err == EACCES ||
                       st.err == EPERM || st.err == EFBIG || st.err == EIO;
  if (refused) {
    const bool reading = what.rfind("cannot read", 0) == 0 || what.rfind("cannot open file for reading", 0) == 0;
    const bool creating = what.rfind("cannot create file", 0) == 0;
    throw_io_error(reading ? "read" : (creating ? "create" : "write"), file, st.err);
  }
  throw Error(msg("HDF5: ", what, object.empty() ? "" : " '" + object + "'", " in ", file, ": ", st.text));
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
  if (is_vlen > 0) {
    // Same character set as stored (HDF5 does not convert ASCII <-> UTF-8).
    Handle mtype(H5Tcopy(H5T_C_S1), H5Tclose);
    if (!mtype.ok() || H5Tset_size(mtype.get(), H5T_VARIABLE) < 0 ||
        H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get())) < 0)
      fail("cannot make a string type", file);
    std::vector<char*> ptrs(count, nullptr);
    if (count > 0 && H5Aread(attr, mtype.get(), ptrs.data()) < 0) fail("cannot read string attribute", file, what);
    for (size_t i = 0; i < count; ++i) {
      out[i] = ptrs[i] ? ptrs[i] : "";
      H5free_memory(ptrs[i]);
    }
  } else {
    const size_t len = H5Tget_size(ftype.get());
    Handle mtype(H5Tcopy(H5T_C_S1), H5Tclose);
    if (len == 0 || !mtype.ok() || H5Tset_size(mtype.get(), len) < 0 ||
        H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get())) < 0)
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

// Number of elements of an attribute's dataspace (1 for a scalar).
size_t attr_element_count(hid_t attr, const std::string& file, const std::string& what) {
  Handle space(H5Aget_space(attr), H5Sclose);
  const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (n < 0) fail("cannot read the shape of attribute", file, what);
  return static_cast<size_t>(n);
}

H5T_class_t attr_class(hid_t attr) {
  Handle t(H5Aget_type(attr), H5Tclose);
  return t.ok() ? H5Tget_class(t.get()) : H5T_NO_CLASS;
}

// Kind of the object at `path` (H5I_GROUP, H5I_DATASET), or H5I_BADID if there is none.
// Walks the path one link at a time because H5Lexists fails on a missing parent.
H5I_type_t object_kind(hid_t file, const std::string& path) {
  if (path.empty() || path == "/") return H5I_GROUP;
  size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return H5I_BADID;
    }
    if (pos == std::string::npos) break;
  }
  const hid_t id = H5Oopen(file, path.c_str(), H5P_DEFAULT);
  if (id < 0) {
    H5Eclear2(H5E_DEFAULT);
    return H5I_BADID;
  }
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
    H5Lget_name_by_idx(gid.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    const hid_t child = H5Oopen(gid.get(), name.c_str(), H5P_DEFAULT);
    if (child < 0) {
      H5Eclear2(H5E_DEFAULT);  // dangling soft link: neither a group nor a dataset
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

H5File::H5File(const std::string& path, Mode mode) : path_(path) {
  silence_hdf5_printing();
  switch (mode) {
    case Mode::create:
      id_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
      if (id_ < 0) fail("cannot create file (is the directory there and writable?)", path);
      break;
    case Mode::append:
    case Mode::read: {
      const unsigned flags = mode == Mode::append ? H5F_ACC_RDWR : H5F_ACC_RDONLY;
      if (std::FILE* probe = std::fopen(path.c_str(), "rb")) {
        std::fclose(probe);
      } else {
        throw Error(msg("HDF5: cannot open ", path, ": no such file (check the path)"));
      }
      id_ = H5Fopen(path.c_str(), flags, H5P_DEFAULT);
      if (id_ < 0) fail(mode == Mode::append ? "cannot open file for appending" : "cannot open file for reading", path);
      break;
    }
  }
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
  const H5I_type_t kind = object_kind(id_, group);
  if (kind == H5I_GROUP) return;
  if (kind != H5I_BADID) throw Error(msg("HDF5: ", path_, ": '", group, "' exists and is not a group"));
  Handle lcpl = intermediate_groups_lcpl(path_);
  Handle g(H5Gcreate2(id_, group.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g.ok()) fail("cannot create group", path_, group);
}

bool H5File::exists(const std::string& object) const { return object_kind(id_, object) != H5I_BADID; }
bool H5File::is_group(const std::string& object) const { return object_kind(id_, object) == H5I_GROUP; }
bool H5File::is_dataset(const std::string& object) const { return object_kind(id_, object) == H5I_DATASET; }

std::vector<std::string> H5File::list_groups(const std::string& group) const {
  return list_links_of_kind(id_, path_, group, H5I_GROUP);
}

std::vector<std::string> H5File::list_datasets(const std::string& group) const {
  return list_links_of_kind(id_, path_, group, H5I_DATASET);
}

H5Object H5File::object(const std::string& path) const {
  const std::string p = normalize_path(path);
  if (object_kind(id_, p) == H5I_BADID) throw Error(msg("HDF5: ", path_, ": no group or dataset '", p, "'"));
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
  if (object_kind(file, path) != H5I_DATASET) throw Error(msg("HDF5: ", file_name, ": no dataset '", path, "'"));
  Handle d(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.ok()) fail("cannot open dataset", file_name, path);
  return d;
}

size_t element_count(const std::vector<hsize_t>& dims) {
  size_t n = 1;
  for (hsize_t d : dims) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

std::vector<uint64_t> H5File::dataset_shape(const std::string& dataset) const {
  Handle d = open_dataset(id_, path_, dataset);
  const std::vector<hsize_t> dims = dataset_dims(d.get(), path_, dataset);
  return std::vector<uint64_t>(dims.begin(), dims.end());
}

std::vector<double> H5File::read_doubles(const std::string& dataset) const {
  Handle d = open_dataset(id_, path_, dataset);
  std::vector<double> v(element_count(dataset_dims(d.get(), path_, dataset)));
  Handle type(H5Dget_type(d.get()), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    throw Error(msg("HDF5: dataset '", dataset, "' in ", path_, " is not numeric"));
  if (!v.empty() && H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    fail("cannot read dataset", path_, dataset);
  return v;
}

std::vector<int64_t> H5File::read_int64s(const std::string& dataset) const {
  Handle d = open_dataset(id_, path_, dataset);
  std::vector<int64_t> v(element_count(dataset_dims(d.get(), path_, dataset)));
  Handle type(H5Dget_type(d.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    throw Error(msg("HDF5: dataset '", dataset, "' in ", path_, " is not an integer dataset (use read_doubles)"));
  if (!v.empty() && H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    fail("cannot read dataset", path_, dataset);
  return v;
}

// ---------------------------------------------------------------- H5Series

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
