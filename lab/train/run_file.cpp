// RunFile: the HDF5 layout of lab/train/SCHEMA.md on top of lab/io/h5file.h.
#include "lab/train/run_file.h"

#include <map>
#include <memory>
#include <set>

#include "lab/core/error.h"
#include "lab/io/h5file.h"

namespace mxlab {

namespace {

// Metrics stored as 1-D [n]; everything else a row holds is [n, width] (per layer / group).
const std::set<std::string> kScalarMetrics = {"loss", "lr", "grad_norm", "update_norm", "weight_norm",
                                              "bias_ratio", "cosine", "bias_ratio_avg", "cross_ratio",
                                              "cross_cosine", "weight_distance"};
constexpr const char* kStep = "step";
constexpr const char* kLossAll = "loss_all";

void write_attrs(h5::H5Object& o, const Attrs& a) {
  for (const auto& [k, v] : a.str) o.set_attr(k, v);
  for (const auto& [k, v] : a.num) o.set_attr(k, v);
  for (const auto& [k, v] : a.ints) o.set_attr(k, v);
  for (const auto& [k, v] : a.lists) o.set_attr(k, v);
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
  auto impl = std::make_unique<Impl>();
  impl->file = std::make_unique<h5::H5File>(path, h5::H5File::Mode::create);
  h5::H5Object r = impl->file->object("/");
  write_attrs(r, root);
  impl->file->flush();
  return std::unique_ptr<RunFile>(new RunFile(std::move(impl)));
}

std::unique_ptr<RunFile> RunFile::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->file = std::make_unique<h5::H5File>(path, h5::H5File::Mode::append);
  return std::unique_ptr<RunFile>(new RunFile(std::move(impl)));
}

std::string RunFile::peek_root_str(const std::string& path, const std::string& name) {
  try {
    h5::H5File f(path, h5::H5File::Mode::read);
    return f.has_attr("/", name) ? f.get_attr_string("/", name) : "";
  } catch (const Error&) {
    return "";
  }
}

void RunFile::open_group(const std::string& path, const Attrs& attrs, const std::map<std::string, Attrs>& da) {
  impl_->file->create_group(path);
  h5::H5Object g = impl_->file->object(path);
  write_attrs(g, attrs);
  for (const auto& [k, v] : da) impl_->pending_dataset_attrs[path][k] = v;
}

void RunFile::append(const std::string& group, const MetricRow& row) {
  impl_->get(group, kStep, h5::DType::i64, 0).append(static_cast<int64_t>(row.step));
  for (const auto& [name, values] : row.cols) {
    if (name == kStep) continue;
    const bool scalar = kScalarMetrics.count(name) > 0;
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

void RunFile::flush() { impl_->file->flush(); }

void RunFile::truncate_from(int64_t step) {
  h5::H5File& f = *impl_->file;
  std::vector<std::string> groups;
  for (const char* top : {"trajectories", "branches"})
    if (f.is_group(top))
      for (const auto& g : f.list_groups(top)) groups.push_back(std::string(top) + "/" + g);
  for (const auto& g : groups) {
    // Rows before `step` were flushed before its checkpoint was written, so every dataset has
    // them; rows after it may be on disk in some datasets and not others (a kill inside a
    // flush), which is why all are cut to the `step` dataset's count. A group without a `step`
    // dataset has no row from before the checkpoint at all.
    const std::string sp = g + "/" + kStep;
    size_t keep = 0;
    if (f.is_dataset(sp)) {
      const std::vector<int64_t> steps = f.read_int64s(sp);
      while (keep < steps.size() && steps[keep] < step) ++keep;
    }
    for (const auto& d : f.list_datasets(g)) {
      if (d == kLossAll) continue;  // rewritten whole at the end
      impl_->get(g, d, h5::DType::f64, 0).truncate(keep);
    }
  }
}

void RunFile::clear_group(const std::string& group) {
  h5::H5File& f = *impl_->file;
  if (!f.is_group(group)) return;
  for (const auto& d : f.list_datasets(group)) impl_->get(group, d, h5::DType::f64, 0).truncate(0);
}

}  // namespace mxlab
