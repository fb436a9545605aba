// Where a run's metrics go. The trainer emits rows through this interface; RunFile
// (lab/runs/run_file.h) writes them to HDF5 per lab/train/SCHEMA.md, and tests use the
// in-memory MemorySink. Keeping the trainer ignorant of HDF5 keeps both simple.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lab/train/metrics.h"

namespace mxlab {

// One logged row of a trajectory: metric name -> values (1 for scalars, L per-layer, G per group).
// The metrics are declared in lab/train/metrics.h.
struct MetricRow {
  int64_t step = 0;
  // The dataset holding the row's step: "step" for logged rows; series with their own cadence
  // (curvature, shadow steps) name theirs ("curvature_step", "shadow_step"). Their datasets carry
  // the attribute `axis` = that name, so that a resumed run cuts each series by its own steps.
  std::string axis = metric::step.name;
  std::vector<std::pair<std::string, std::vector<double>>> cols;
  void add(const std::string& name, double v) { cols.push_back({name, {v}}); }
  void add(const std::string& name, std::vector<double> v) { cols.push_back({name, std::move(v)}); }
  void add(const Metric& m, double v) { add(std::string(m.name), v); }
  void add(const Metric& m, std::vector<double> v) { add(std::string(m.name), std::move(v)); }
};

// Attribute values of a group or dataset.
struct Attrs {
  std::map<std::string, std::string> str;
  std::map<std::string, double> num;
  std::map<std::string, int64_t> ints;
  std::map<std::string, std::vector<std::string>> lists;
};

class MetricSink {
 public:
  virtual ~MetricSink() = default;
  // Create (or reopen) a trajectory/branch group. `dataset_attrs` are attached to the named
  // datasets when they are created (e.g. "gamma_lastbin" -> {quantized: 1}).
  virtual void open_group(const std::string& path, const Attrs& attrs,
                          const std::map<std::string, Attrs>& dataset_attrs) = 0;
  virtual void append(const std::string& group, const MetricRow& row) = 0;
  virtual void set_group_attrs(const std::string& group, const Attrs& attrs) = 0;
  virtual void set_root_attrs(const Attrs& attrs) = 0;
  // Replace the per-step loss history dataset (loss_all) of a group.
  virtual void write_loss_history(const std::string& group, const std::vector<float>& loss) = 0;
  // Write (or replace) a whole float32 array at `path` ("snapshots/mx/step_100/layer0.W1"):
  // shape [rows, cols], or [rows] when cols == 0. Parameter snapshots and the probe batch.
  virtual void write_array(const std::string& path, int64_t rows, int64_t cols, const std::vector<float>& data) = 0;
  virtual void flush() = 0;
  // Resume: drop rows with step >= `step` in every group (rows logged after a checkpoint).
  virtual void truncate_from(int64_t step) = 0;
  // Drop the rows with step >= `step` of one group, in every series (a trajectory stopped on a
  // non-finite loss keeps only the steps it ran).
  virtual void truncate_group_from(const std::string& group, int64_t step) = 0;
};

// In-memory sink for tests.
class MemorySink : public MetricSink {
 public:
  struct Group {
    Attrs attrs;
    std::map<std::string, Attrs> dataset_attrs;
    std::vector<MetricRow> rows;
    std::vector<float> loss_all;
  };
  struct Array {
    int64_t rows = 0, cols = 0;
    std::vector<float> data;
  };
  std::map<std::string, Group> groups;
  std::map<std::string, Array> arrays;
  Attrs root;

  void open_group(const std::string& path, const Attrs& attrs, const std::map<std::string, Attrs>& da) override {
    auto& g = groups[path];
    for (auto& [k, v] : attrs.str) g.attrs.str[k] = v;
    for (auto& [k, v] : attrs.num) g.attrs.num[k] = v;
    for (auto& [k, v] : attrs.ints) g.attrs.ints[k] = v;
    for (auto& [k, v] : attrs.lists) g.attrs.lists[k] = v;
    for (auto& [k, v] : da) g.dataset_attrs[k] = v;
  }
  void append(const std::string& group, const MetricRow& row) override { groups[group].rows.push_back(row); }
  void set_group_attrs(const std::string& group, const Attrs& a) override { open_group(group, a, {}); }
  void set_root_attrs(const Attrs& a) override {
    for (auto& [k, v] : a.str) root.str[k] = v;
    for (auto& [k, v] : a.num) root.num[k] = v;
    for (auto& [k, v] : a.ints) root.ints[k] = v;
    for (auto& [k, v] : a.lists) root.lists[k] = v;
  }
  void write_loss_history(const std::string& group, const std::vector<float>& loss) override {
    groups[group].loss_all = loss;
  }
  void write_array(const std::string& path, int64_t rows, int64_t cols, const std::vector<float>& data) override {
    arrays[path] = {rows, cols, data};
  }
  void flush() override {}
  void truncate_from(int64_t step) override {
    for (auto& [name, g] : groups) truncate_group_from(name, step);
  }
  void truncate_group_from(const std::string& group, int64_t step) override {
    auto& rows = groups[group].rows;
    rows.erase(std::remove_if(rows.begin(), rows.end(), [&](const MetricRow& r) { return r.step >= step; }), rows.end());
  }
  // Values of one scalar metric of a group, in row order (NaN where absent), over the rows of
  // one axis (the logged rows by default).
  std::vector<double> series(const std::string& group, const std::string& metric, size_t col = 0,
                             const std::string& axis = metric::step.name) const;
};

}  // namespace mxlab
