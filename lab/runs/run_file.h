// The HDF5 run file (lab/train/SCHEMA.md): a MetricSink that writes one file per run.
//
// Crash safety. HDF5 (without SWMR) is consistent on disk only between flushes: a process killed
// inside H5Fflush can leave object headers half-written, and such a file may open yet fail on
// one group. So every flush() also copies the flushed file to `<path>.snapshot` (temp + rename),
// and open() checks the whole file (every object, attribute and dataset read back, in another
// process: lab/io/h5check.h) and, when it is damaged, puts the snapshot back: the state of the
// last completed flush, which holds every row a checkpoint written after that flush needs.
// Neither create() nor open() writes through a symbolic link: a run file that is one is refused
// (IoError, ELOOP; lab/io/out_file.h).
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "lab/train/sink.h"

namespace mxlab {

constexpr int kSchemaVersion = 1;

class RunFile : public MetricSink {
 public:
  // Create `path` (replacing a file there) with the given root attributes.
  static std::unique_ptr<RunFile> create(const std::string& path, const Attrs& root);
  // Open an existing run file to append (resume, branches added after the fact). A damaged file
  // is replaced by its snapshot, with a warning on stderr; throws mxlab::Error when neither is
  // readable (or the file is locked by another process).
  // `lock_wait`: how long to wait for another program's HDF5 lock (default h5::append_lock_wait()).
  static std::unique_ptr<RunFile> open(const std::string& path,
                                       std::optional<std::chrono::milliseconds> lock_wait = std::nullopt);
  // A root string attribute of a file ("" when the file or attribute is missing). When the file
  // cannot be read, the snapshot's value: the run can then resume, and open() repairs the file.
  // Throws IoError when the system refuses to read either (that says nothing about the file).
  static std::string peek_root_str(const std::string& path, const std::string& name);
  static std::string snapshot_path(const std::string& path) { return path + ".snapshot"; }
  // After a write into `path` failed (disk full, ...), with its RunFile already destroyed: puts
  // the snapshot (the state of the last completed flush) back in its place, so that the file is
  // readable at once and `mxlab run` can resume it. Never throws; returns what became of the
  // file, for the error message.
  static std::string restore_snapshot(const std::string& path);
  ~RunFile() override;

  std::string root_str(const std::string& name) const;  // "" when missing
  bool has_group(const std::string& group) const;
  bool group_has_attr(const std::string& group, const std::string& name) const;

  void open_group(const std::string& path, const Attrs& attrs, const std::map<std::string, Attrs>& dataset_attrs) override;
  void append(const std::string& group, const MetricRow& row) override;
  void set_group_attrs(const std::string& group, const Attrs& attrs) override;
  void set_root_attrs(const Attrs& attrs) override;
  void write_loss_history(const std::string& group, const std::vector<float>& loss) override;
  void write_array(const std::string& path, int64_t rows, int64_t cols, const std::vector<float>& data) override;
  // Writes everything to disk, then refreshes the snapshot.
  void flush() override;
  void truncate_from(int64_t step) override;
  void truncate_group_from(const std::string& group, int64_t step) override;
  // Drop every row of one group's datasets (a branch whose `mxlab branch` was interrupted is
  // computed again from its start).
  void clear_group(const std::string& group);

 private:
  struct Impl;
  explicit RunFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mxlab
