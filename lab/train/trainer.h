// The paired run (DESIGN.md section 5): the `fp32` and `mx` trajectories of the student,
// trained from identical initial weights on identical batches in lock-step, the shadow FP32
// gradient at the MX weights, intervention branches, metrics and summaries.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lab/model/backend.h"
#include "lab/model/mlp.h"
#include "lab/train/config.h"
#include "lab/train/sink.h"
#include "lab/train/summary.h"
#include "lab/train/trajectory.h"

namespace mxlab {

// What the caller lets the loop do and see.
struct RunControl {
  std::function<bool()> stop_requested;                    // e.g. SIGINT; checked every step
  std::function<void(int64_t step, const std::string&)> progress;  // called on log steps
  // Called at the start of step `step` (before its data) when a checkpoint is due
  // (checkpoint_every, intervention steps); the caller saves it (see checkpoint.h).
  std::function<void(int64_t step)> checkpoint;
};

class Trainer {
 public:
  // Builds the teacher, both trajectories and every branch (branches start at their `at`),
  // and allocates every buffer up front (no allocation inside the step loop).
  Trainer(const RunConfig& cfg, Backend& be, MetricSink& sink);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Declare every (unmuted) group with its attributes and the attributes its datasets get when
  // they are created. Idempotent; run() calls it if nobody has, so that a resumed run whose
  // branch datasets did not exist yet at its checkpoint still creates them with their attributes.
  void open_output();
  // Write only the named trajectories (a branch added to a finished run): the FP32 trajectory
  // still trains (cross metrics), the MX baseline until the last selected branch has started,
  // other branches not at all.
  void restrict_output(const std::vector<std::string>& names);
  // Train until `to_step` (exclusive; cfg.steps by default) or until stopped. Returns
  // "complete", "diverged" (the MX trajectory had a non-finite loss or diverged) or
  // "interrupted" (stop_requested).
  std::string run(const RunControl& ctl, int64_t to_step = -1);
  // Write the summaries (attributes) and loss histories of every trajectory to the sink.
  void finish(const std::string& status);

  int64_t step() const { return step_; }
  const RunConfig& config() const { return cfg_; }
  const NetShape& shape() const { return shape_; }
  size_t num_trajectories() const { return traj_.size(); }
  Trajectory& trajectory(size_t i) { return *traj_[i]; }
  Trajectory* find_trajectory(const std::string& name);
  LossSummary summary(size_t i);
  // Steps at which the run wants a checkpoint saved (intervention steps, checkpoint_every).
  bool checkpoint_due(int64_t step) const;

  // ---- state for checkpoints (lab/train/checkpoint.h) ----
  // Restore the step counter (after restoring trajectory buffers and bookkeeping).
  void set_step(int64_t step) { step_ = step; }
  std::vector<float> download(const float* p, size_t n);
  void upload(float* p, const std::vector<float>& host);

 private:
  void step_once(bool log);
  void compute_phase(bool log, bool shadow);
  void update_phase(bool log);
  void start_branches();
  StepScalars scalars(int64_t t) const;
  PassPolicy pass_policy(const Trajectory& tr, bool collect, int index) const;
  void log_metrics(bool shadow_step);
  void shadow_only_metrics();
  int stats_base(int index) const;
  Attrs group_attrs(const Trajectory& tr) const;
  std::map<std::string, Attrs> dataset_attrs(const Trajectory& tr) const;

  RunConfig cfg_;
  Backend& be_;
  MetricSink& sink_;
  NetShape shape_, teacher_shape_;
  float* teacher_params_ = nullptr;
  Workspace teacher_ws_;
  float* x_ = nullptr;       // [B x d] batch inputs
  float* target_ = nullptr;  // [B x d] teacher(x) + noise (= teacher_ws_.out)
  Workspace shadow_ws_;
  std::vector<std::unique_ptr<Trajectory>> traj_;  // 0: fp32, 1: mx, 2..: branches
  int64_t step_ = 0;
  int bias_every_ = 1;
  bool output_open_ = false;  // open_output() has declared the groups in the sink
};

}  // namespace mxlab
