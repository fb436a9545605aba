// RunFile: the HDF5 layout of lab/train/SCHEMA.md on top of lab/io/h5file.h.
#include "lab/runs/run_file.h"

#include <hdf5.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/io/out_file.h"
#include "lab/train/metrics.h"

namespace mxlab {

namespace {

constexpr const char* kAxisAttr = "axis";  // dataset attribute: the step dataset of its series
constexpr const char* kStep = metric::step.name;
constexpr const char* kLossAll = metric::loss_all.name;

// Metrics declared scalar are stored as 1-D [n]; everything else a logged row holds is
// [n, width] (per layer / group).
bool scalar_metric(const std::string& name) {
  const Metric* m = find_metric(name);
  return m && m->shape == MetricShape::scalar;
}

void write_attrs(h5::H5Object& o, const Attrs& a) {
  for (const auto& [k, v] : a.str) o.set_attr(k, v);
  for (const auto& [k, v] : a.num) o.set_attr(k, v);
  for (const auto& [k, v] : a.ints) o.set_attr(k, v);
  for (const auto& [k, v] : a.lists) o.set_attr(k, v);
}

// Copies `from` over `to` so that `to` is either the old file or the complete copy: through
// `to.tmp` and a rename. No fsync: this guards against killed processes, not power loss.
void copy_atomically(const std::string& from, const std::string& to) {
  const std::string tmp = to + ".tmp";
  std::FILE* in = std::fopen(from.c_str(), "rb");
  if (!in) throw_io_error("read", from, errno);
  int fd = -1;
  try {
    fd = create_fresh_file(tmp, to);
  } catch (...) {
    std::fclose(in);
    throw;
  }
  std::FILE* out = ::fdopen(fd, "wb");
  if (!out) {
    const int err = errno;
    ::close(fd);
    std::fclose(in);
    std::remove(tmp.c_str());
    throw_io_error("write", to, err);
  }
  constexpr size_t kBuffer = 1 << 20;
  std::vector<char> buf(kBuffer);
  bool ok = true;
  int err = 0;
  size_t n;
  while (ok && (n = std::fread(buf.data(), 1, buf.size(), in)) > 0) {
    ok = std::fwrite(buf.data(), 1, n, out) == n;
    if (!ok) err = errno;
  }
  ok = ok && !std::ferror(in);
  std::fclose(in);
  if (std::fclose(out) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && std::rename(tmp.c_str(), to.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    throw_io_error("write", to, err != 0 ? err : EIO);
  }
}

// Why `path` is not a readable run file ("" if it is). Reading takes no lock (h5file.h); where
// HDF5 still refuses for a lock (a version without H5Pset_file_locking), that is FileInUse, not
// damage: repairing the file would clobber a live run.
std::string damage_of(const std::string& path) {
  try {
    const h5::H5File f(path, h5::H5File::Mode::read);  // reads it whole first (lab/io/h5check.h)
    return "";
  } catch (const IoError&) {
    throw;  // the system refused (a read, the check's process): not damage
  } catch (const Error& e) {
    const std::string why = e.what();
    if (why.find("unable to lock") != std::string::npos)
      throw FileInUse(msg(path, " is in use by another process (", why, "): wait for it or stop it"), path);
    H5Eclear2(H5E_DEFAULT);
    return why;
  }
}

}  // namespace

struct RunFile::Impl {
  std::unique_ptr<h5::H5File> file;
  std::map<std::string, std::map<std::string, Attrs>> pending_dataset_attrs;  // group -> dataset -> attrs
  std::map<std::string, h5::H5Series> series;  // "group/metric" -> open dataset

  h5::H5Series& get(const std::string& group, const std::string& metric, h5::DType type, size_t width) {
    const std::string path = group + "/" + metric;
    auto it = series.find(path);
    if (it != series.end()) return it->second;
    h5::H5Series s = file->is_dataset(path) ? h5::H5Series::open(*file, path)
                                            : h5::H5Series::create(*file, path, type, width);
    auto g = pending_dataset_attrs.find(group);
    if (g != pending_dataset_attrs.end()) {
      auto d = g->second.find(metric);
      if (d != g->second.end()) write_attrs(s, d->second);
    }
    return series.emplace(path, std::move(s)).first->second;
  }
};

RunFile::RunFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RunFile::~RunFile() = default;

std::unique_ptr<RunFile> RunFile::create(const std::string& path, const Attrs& root) {
  refuse_symlink(path);  // a link there is the user's: neither follow nor replace it
  auto impl = std::make_unique<Impl>();
  impl->file = std::make_unique<h5::H5File>(path, h5::H5File::Mode::create);
  h5::H5Object r = impl->file->object("/");
  write_attrs(r, root);
  std::unique_ptr<RunFile> rf(new RunFile(std::move(impl)));
  rf->flush();  // also replaces a snapshot left by an earlier attempt
  return rf;
}

std::unique_ptr<RunFile> RunFile::open(const std::string& path, std::optional<std::chrono::milliseconds> lock_wait) {
  refuse_symlink(path);
  const std::string damage = damage_of(path);
  if (!damage.empty()) {
    const std::string snap = snapshot_path(path);
    const std::string snap_damage = ::access(snap.c_str(), F_OK) == 0 ? damage_of(snap) : "there is none";
    if (!snap_damage.empty())
      throw Error(msg(path, " is damaged (", damage, ") and its snapshot ", snap, " cannot replace it (", snap_damage, ")"));
    std::fprintf(stderr,
                 "mxlab: warning: %s is damaged (%s), likely by a process killed while writing it; restored from "
                 "%s (its state at the last completed flush)\n",
                 path.c_str(), damage.c_str(), snap.c_str());
    copy_atomically(snap, path);
  }
  auto impl = std::make_unique<Impl>();
  impl->file = std::make_unique<h5::H5File>(path, h5::H5File::Mode::append, lock_wait);
  std::unique_ptr<RunFile> rf(new RunFile(std::move(impl)));
  copy_atomically(path, snapshot_path(path));  // the state this session starts from
  return rf;
}

std::string RunFile::restore_snapshot(const std::string& path) {
  const std::string snap = snapshot_path(path);
  if (::access(snap.c_str(), F_OK) != 0) return msg(path, " may be damaged and has no snapshot to restore it from");
  // rename(2) needs no free space, unlike a copy; the next open() makes a new snapshot.
  if (std::rename(snap.c_str(), path.c_str()) != 0)
    return msg(path, " may be damaged; its last good state is ", snap, " (rename could not restore it: ",
               std::strerror(errno), ")");
  return msg(path, " is kept as of its last completed flush");
}

std::string RunFile::peek_root_str(const std::string& path, const std::string& name) {
  for (const std::string& p : {path, snapshot_path(path)}) {
    try {
      h5::H5File f(p, h5::H5File::Mode::read);
      return f.has_attr("/", name) ? f.get_attr_string("/", name) : "";
    } catch (const IoError&) {
      throw;  // the system refused: "" would say the file holds no such attribute
    } catch (const Error&) {
    }
  }
  return "";
}

std::string RunFile::root_str(const std::string& name) const {
  return impl_->file->has_attr("/", name) ? impl_->file->get_attr_string("/", name) : "";
}

bool RunFile::has_group(const std::string& group) const { return impl_->file->is_group(group); }

bool RunFile::group_has_attr(const std::string& group, const std::string& name) const {
  return impl_->file->is_group(group) && impl_->file->has_attr(group, name);
}

void RunFile::open_group(const std::string& path, const Attrs& attrs, const std::map<std::string, Attrs>& da) {
  impl_->file->create_group(path);
  h5::H5Object g = impl_->file->object(path);
  write_attrs(g, attrs);
  for (const auto& [k, v] : da) impl_->pending_dataset_attrs[path][k] = v;
}

void RunFile::append(const std::string& group, const MetricRow& row) {
  impl_->get(group, row.axis, h5::DType::i64, 0).append(static_cast<int64_t>(row.step));
  for (const auto& [name, values] : row.cols) {
    if (name == kStep || name == row.axis) continue;
    // A series with its own axis: every one of its datasets is a scalar per row.
    const bool scalar = scalar_metric(name) || row.axis != kStep;
    if (row.axis != kStep && !impl_->file->is_dataset(group + "/" + name))
      impl_->pending_dataset_attrs[group][name].str[kAxisAttr] = row.axis;
    h5::H5Series& s = impl_->get(group, name, h5::DType::f64, scalar ? 0 : values.size());
    if (s.row_length() != values.size())
      throw Error(msg("internal: metric ", group, "/", name, " has ", values.size(), " values, dataset width ",
                      s.row_length()));
    s.append_rows(values.data(), 1);
  }
}

void RunFile::set_group_attrs(const std::string& group, const Attrs& attrs) {
  impl_->file->create_group(group);
  h5::H5Object g = impl_->file->object(group);
  write_attrs(g, attrs);
}

void RunFile::set_root_attrs(const Attrs& attrs) {
  h5::H5Object r = impl_->file->object("/");
  write_attrs(r, attrs);
}

void RunFile::write_loss_history(const std::string& group, const std::vector<float>& loss) {
  h5::H5Series& s = impl_->get(group, kLossAll, h5::DType::f32, 0);
  s.truncate(0);
  if (!loss.empty()) s.append_rows(loss.data(), loss.size());
}

void RunFile::write_array(const std::string& path, int64_t rows, int64_t cols, const std::vector<float>& data) {
  MXLAB_ASSERT(rows >= 0 && cols >= 0 && data.size() == static_cast<size_t>(rows * std::max<int64_t>(cols, 1)),
               "write_array ", path, ": ", data.size(), " values for shape [", rows, ", ", cols, "]");
  impl_->series.erase(path);
  h5::H5Series s = impl_->file->is_dataset(path)
                       ? h5::H5Series::open(*impl_->file, path)
                       : h5::H5Series::create(*impl_->file, path, h5::DType::f32, static_cast<size_t>(cols));
  s.truncate(0);
  if (rows > 0) s.append_rows(data.data(), static_cast<size_t>(rows));
}

void RunFile::flush() {
  impl_->file->flush();
  copy_atomically(impl_->file->path(), snapshot_path(impl_->file->path()));
}

void RunFile::truncate_from(int64_t step) {
  h5::H5File& f = *impl_->file;
  std::vector<std::string> groups;
  for (const char* top : {"trajectories", "branches"})
    if (f.is_group(top))
      for (const auto& g : f.list_groups(top)) groups.push_back(std::string(top) + "/" + g);
  for (const auto& g : groups) truncate_group_from(g, step);
}

void RunFile::truncate_group_from(const std::string& g, int64_t step) {
  h5::H5File& f = *impl_->file;
  if (!f.is_group(g)) return;
  {
    // Rows before `step` were flushed before its checkpoint was written, so every dataset has
    // them; rows after it may be on disk in some datasets and not others (a kill inside a
    // flush), which is why all are cut to their axis dataset's count (`step`, or the `axis`
    // attribute's series such as `curvature_step`). An axis dataset that does not exist has no
    // row from before the checkpoint at all. A kill can also leave an axis dataset extended
    // over rows whose values never reached the disk: they read as the fill value 0, below
    // `step`. Axis values increase strictly, so the rows kept end at the first that does not.
    std::map<std::string, size_t> keep;  // axis dataset -> rows kept
    auto rows_before = [&](const std::string& axis) {
      auto it = keep.find(axis);
      if (it != keep.end()) return it->second;
      size_t k = 0;
      if (f.is_dataset(g + "/" + axis)) {
        const std::vector<int64_t> steps = f.read_int64s(g + "/" + axis);
        while (k < steps.size() && steps[k] < step && (k == 0 || steps[k] > steps[k - 1])) ++k;
      }
      return keep[axis] = k;
    };
    for (const auto& d : f.list_datasets(g)) {
      if (d == kLossAll) continue;  // rewritten whole at the end
      const std::string path = g + "/" + d;
      std::string axis = kStep;
      if (f.has_attr(path, kAxisAttr)) axis = f.get_attr_string(path, kAxisAttr);
      else if (d.size() > 5 && d.compare(d.size() - 5, 5, "_step") == 0) axis = d;  // an axis itself
      impl_->get(g, d, h5::DType::f64, 0).truncate(rows_before(axis));
    }
  }
}

void RunFile::clear_group(const std::string& group) {
  h5::H5File& f = *impl_->file;
  if (!f.is_group(group)) return;
  for (const auto& d : f.list_datasets(group)) impl_->get(group, d, h5::DType::f64, 0).truncate(0);
}

}  // namespace mxlab
