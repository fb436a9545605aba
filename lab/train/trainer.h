// The paired run (README, "What a run records"): the `fp32` trajectory and one or more MX arms of the
// student (`arms:`; without it the one arm `mx`), trained from identical initial
// weights on identical batches in lock-step, the shadow FP32 gradient at each MX trajectory's
// weights, intervention branches (forking from an arm or from the FP32 trajectory, training to
// the end or for their `steps`), metrics, snapshots and summaries.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lab/model/backend.h"
#include "lab/model/curvature.h"
#include "lab/model/mlp.h"
#include "lab/train/capture_key.h"
#include "lab/config/config.h"
#include "lab/train/sink.h"
#include "lab/stats/loss_events.h"
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
  // Builds the teacher, the FP32 trajectory, every arm and every branch (branches start at
  // their `at`), and allocates every buffer up front (no allocation inside the step loop).
  Trainer(const RunConfig& cfg, Backend& be, MetricSink& sink);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Declare every (unmuted) group with its attributes and the attributes its datasets get when
  // they are created. Idempotent; run() calls it if nobody has, so that a resumed run whose
  // branch datasets did not exist yet at its checkpoint still creates them with their attributes.
  void open_output();
  // Write only the named branches (a branch added to a finished run): the FP32 trajectory
  // still trains (cross metrics), an arm a selected branch forks from until that branch has
  // started, other arms and branches not at all. Names match branches only, never the FP32
  // trajectory or an arm.
  void restrict_output(const std::vector<std::string>& branches);
  // Train until `to_step` (exclusive; cfg.steps by default) or until stopped. Returns
  // "complete", "diverged" (some arm had a non-finite loss or diverged) or "interrupted"
  // (stop_requested).
  std::string run(const RunControl& ctl, int64_t to_step = -1);
  // Write the summaries (attributes) and loss histories of every trajectory to the sink.
  void finish(const std::string& status);

  int64_t step() const { return step_; }
  const RunConfig& config() const { return cfg_; }
  const NetShape& shape() const { return shape_; }
  size_t num_trajectories() const { return traj_.size(); }
  size_t num_arms() const { return n_arms_; }  // trajectories 1 .. num_arms() are the arms
  Trajectory& trajectory(size_t i) { return *traj_[i]; }
  Trajectory* find_trajectory(const std::string& name);
  LossSummary summary(size_t i);
  // Trajectory i's per-step losses from its first step (a stopped one's up to its first
  // non-finite loss).
  std::vector<float> history(size_t i);
  // The capture keys of the unlogged steps so far: which sets of live trajectories (and shadow
  // or not) the run has stepped with.
  const StepCaptureKeys& capture_keys() const { return capture_keys_; }
  // Steps at which the run wants a checkpoint saved (intervention steps, checkpoint_every).
  bool checkpoint_due(int64_t step) const;

  // Where a logged step's time goes (`mxlab bench --log-steps`): when set, a logged step calls
  // `clock(nullptr)` as it begins and `clock(phase)` at the end of each of its phases (eager
  // compute with statistics, reductions, the update, the sink, ...; a phase may recur within
  // one step). The callee synchronises the backend and charges the time since its previous
  // call to `phase`. Unlogged steps never call it. Empty (the default): no calls, no cost.
  void set_phase_clock(std::function<void(const char* phase)> clock) { phase_clock_ = std::move(clock); }
  // Unlogged shadow steps queued per flush of their `shadow_*` rows (default 64; 1 turns each
  // into rows at once, as before the queue existed). The rows and running averages do not
  // depend on it.
  void set_shadow_flush_every(int64_t steps) { shadow_flush_every_ = steps < 1 ? 1 : steps; }
  // Unlogged steps run as one captured unit (CUDA graphs on the GPU; the default) or, off,
  // eagerly op by op (`mxlab bench --no-graphs`). The same ops either way: the same bits.
  void set_step_capture(bool on) { step_capture_ = on; }

  // ---- one unlogged step, or one piece of it, for timing (`mxlab bench`) ----
  // One step at step() that logs nothing, whatever log_every says, exactly as run() runs a step
  // between its log steps (branches, snapshots and curvature due then; compute and update as
  // one captured unit; the shadow metrics on shadow steps), then step() + 1. Unlike run() it
  // neither synchronises nor checks for a stop, checkpoint or progress, so that steps can be
  // issued back to back; run(ctl, step()) afterwards flushes the queued shadow rows and
  // synchronises. step() must be below config().steps.
  void step_unlogged();
  // The pieces of the unlogged step, each alone, with the very calls that step makes for it
  // (the step spreads them over lanes; these run on lane 0). They neither set the step's scalars
  // (the caller does, as the step does: Backend::set_step(step_scalars(config(), t)), t below
  // config().steps), nor capture, synchronise or move step().
  void step_batch();                // the batch: x, teacher(x) + label noise, each live MX trajectory's own targets
  void step_trajectory(size_t i);   // trajectory i's forward, loss, backward and optimizer update on that batch
  void step_shadow(size_t i);       // MX trajectory i's shadow pass: the FP32 gradient at its weights on that batch

  // ---- state for checkpoints (lab/runs/checkpoint.h) ----
  // Restore the step counter (after restoring trajectory buffers and bookkeeping).
  void set_step(int64_t step) { step_ = step; }
  std::vector<float> download(const float* p, size_t n);
  void upload(float* p, const std::vector<float>& host);

 private:
  // Global shadow-pass scalars of one MX trajectory at one step (the `shadow_*` series).
  struct ShadowScalars {
    double bias_ratio, cosine, cross_ratio, cross_ratio_sq, eps_norm, gbar_norm, gtilde_norm, eps_par, eps_perp,
        fp32_loss;
  };
  void step_once(bool log);
  void compute_phase(bool log, bool shadow);
  void update_phase(bool log);
  // The pieces of compute_phase and update_phase (and of step_batch .. step_shadow), on the
  // current lane: trajectory i's gradient pass (statistics when `log`), MX trajectory i's shadow
  // pass in workspace `sw`, a trajectory's optimizer update (keeping the old weights when `log`).
  void train_pass(size_t i, bool log);
  void shadow_pass(size_t i, Workspace& sw);
  void update(Trajectory& tr, bool log);
  void start_branches();
  void write_snapshots();
  void measure_curvature();
  // Clamp debt: gap and clamped fraction of the stored gamma, beta and weights
  // against the forward pass's quantization, per layer / weight group, into `row`.
  void clamp_debt(const Trajectory& tr, int index, MetricRow& row);
  void snapshot(const Trajectory& tr);
  StepScalars scalars(int64_t t) const;
  PassPolicy pass_policy(const Trajectory& tr, bool collect, int index) const;
  // A logged step's rows (lab/train/SCHEMA.md "Datasets"), one metric family per function.
  struct GradientSums;  // the step's gradient reductions, per trajectory (trainer.cpp)
  struct WeightSums;    // the weight reductions after the update
  void log_metrics(bool shadow_step);
  GradientSums reduce_gradients(bool shadow_step);
  double add_loss_metrics(Trajectory& tr, const GradientSums& sums, size_t index, MetricRow& row);  // returns the loss
  void add_gradient_bias_metrics(Trajectory& tr, const GradientSums& sums, size_t index, MetricRow& row);
  void add_quant_stat_metrics(Trajectory& tr, int index, const std::vector<QuantStats>& stats, MetricRow& row);
  void add_attention_metrics(Trajectory& tr, MetricRow& row);
  void add_attention_weight_metrics(Trajectory& tr, bool shadow_step, MetricRow& row);
  WeightSums reduce_weights();
  void add_weight_metrics(const Trajectory& tr, const double* sums, const double* fp32_sums, MetricRow& row);
  void add_gamma_metrics(const Trajectory& tr, MetricRow& row);
  void write_logged_row(Trajectory& tr, MetricRow& row, double loss);
  // An unlogged shadow step's sums are queued on the backend (Backend::reduce_deferred) and
  // turned into rows by flush_shadow(), in step order: every shadow_flush_every_ queued steps,
  // and before anything reads the running averages or the run file (a log step, a branch start,
  // a curvature measurement, a checkpoint, the run's end).
  void shadow_only_metrics();
  void flush_shadow();
  // From the global sums g.s, s.s, (g-s)^2, g.g (g: applied gradient, s: shadow), the cross
  // sums g.f, (g-f)^2, f.f (f: the FP32 trajectory's gradient; NaN when it is not live) and the
  // FP32 loss at the MX weights.
  ShadowScalars shadow_scalars(Trajectory& tr, const double* sums, const double* cross, double fp32_loss);
  void append_shadow_row(Trajectory& tr, const ShadowScalars& s, int64_t step);
  int stats_base(int index) const;
  int train_lane(int j) const;   // lanes of the j-th live MX trajectory of a step
  int shadow_lane(int j) const;
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
  Workspace teacher_ws_mx_;  // the MX teacher passes (data.mx_teacher_targets)
  // The targets trajectory `tr` trains on this step (its own with data.mx_teacher_targets).
  const float* targets_of(const Trajectory& tr) const { return tr.target ? tr.target : target_; }
  // With data.mx_teacher_targets: trajectory i's targets for the current batch (lane main).
  void make_targets(size_t i);
  // One forward-backward of `params` on the current batch x_ against `targets` under `pol`, in
  // `ws`: the gradient into `grads`, the loss into loss_hist[step] when loss_hist is given.
  void gradient_pass(const float* params, const float* targets, Workspace& ws, const PassPolicy& pol, float* grads,
                     float* loss_hist);
  std::map<int, Workspace> shadow_ws_;  // per shadow lane (passes on one lane run in order)
  std::vector<std::unique_ptr<Trajectory>> traj_;  // 0: fp32, 1..n_arms_: arms, then branches
  size_t n_arms_ = 1;
  int lanes_ = 1;
  std::unique_ptr<Curvature> curvature_;  // log.curvature_every > 0
  float* probe_x_ = nullptr;  // [probe_rows x d] fixed probe batch (curvature, snapshots); null if unused
  float* probe_y_ = nullptr;
  int64_t probe_rows_ = 0;
  int64_t step_ = 0;
  int bias_every_ = 1;
  StepCaptureKeys capture_keys_;  // of the unlogged steps (one per set of live trajectories)
  bool output_open_ = false;  // open_output() has declared the groups in the sink
  std::function<void(const char*)> phase_clock_;  // set_phase_clock
  struct PendingShadow {  // an unlogged shadow step whose sums are queued on the backend
    int64_t step;
    std::vector<Trajectory*> who;  // its live MX trajectories, in queue order
    bool ref_live;                 // the FP32 trajectory was live (else the cross sums are NaN)
  };
  std::vector<PendingShadow> pending_shadow_;
  int64_t shadow_flush_every_ = 64;
  bool step_capture_ = true;  // set_step_capture
  void phase(const char* name) {
    if (phase_clock_) phase_clock_(name);
  }
};

}  // namespace mxlab
