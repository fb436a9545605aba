// The HDF5 run file (lab/train/SCHEMA.md): a MetricSink that writes one file per run.
#pragma once
#include <memory>
#include <string>

#include "lab/train/sink.h"

namespace mxlab {

constexpr int kSchemaVersion = 1;

class RunFile : public MetricSink {
 public:
  // Create (truncate) `path` with the given root attributes.
  static std::unique_ptr<RunFile> create(const std::string& path, const Attrs& root);
  // Open an existing run file to append (resume, branches added after the fact).
  static std::unique_ptr<RunFile> open(const std::string& path);
  // A root string attribute of a file ("" when the file or attribute is missing/unreadable).
  static std::string peek_root_str(const std::string& path, const std::string& name);
  ~RunFile() override;

  void open_group(const std::string& path, const Attrs& attrs, const std::map<std::string, Attrs>& dataset_attrs) override;
  void append(const std::string& group, const MetricRow& row) override;
  void set_group_attrs(const std::string& group, const Attrs& attrs) override;
  void set_root_attrs(const Attrs& attrs) override;
  void write_loss_history(const std::string& group, const std::vector<float>& loss) override;
  void flush() override;
  void truncate_from(int64_t step) override;
  // Drop every row of one group's datasets (a branch whose `mxlab branch` was interrupted is
  // computed again from its start).
  void clear_group(const std::string& group);

 private:
  struct Impl;
  explicit RunFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mxlab
