// One trained copy of the student: parameters, gradients and optimizer state in backend
// memory, its precision policy, and the per-step bookkeeping for its metrics and summary.
// The paired run holds the `fp32` trajectory, one per MX arm (`mx` without `arms:`) and one
// per intervention branch.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lab/model/backend.h"
#include "lab/model/mlp.h"
#include "lab/config/config.h"

namespace mxlab {

// What a trajectory is. Code that treats the FP32 trajectory, the arms or the branches apart
// asks this, never the name (names are checked in lab/config/names.h, but a file or a checkpoint
// read back is only data).
enum class TrajectoryKind {
  fp32,    // the FP32 reference, trajectories/fp32
  arm,     // an MX arm: trains from step 0 under its recipe, trajectories/<name>
  branch,  // an intervention branch: starts at `at` from the state of its source (an arm or fp32), branches/<name>
};

struct Trajectory {
  std::string name;        // "fp32", an arm's name ("mx" without `arms:`), or the branch name
  std::string h5_group;    // "trajectories/fp32", "trajectories/<arm>", "branches/<name>"
  TrajectoryKind kind = TrajectoryKind::fp32;
  PrecisionConfig policy;  // current policy (a branch's is patched at `at`)
  bool is_mx = false;      // logs the shadow-gradient metrics (arms and branches)
  // A branch: the index (in the trainer's list) of the arm it forks from (0: the FP32 trajectory,
  // `from: fp32`), set from the intervention's `from` when the trainer is built; -1 for the FP32
  // trajectory and the arms.
  int source = -1;
  bool snap_gamma = false; // a branch: stored gamma/beta := their quantized values when it starts
  bool reset_v = false;    // a branch: Adam's v := bc2 * g^2 of its first gradient when it starts
  int start_step = 0;      // first step this trajectory trains (branches: `at`)
  int end_step = 0;        // one past the last step it trains: the run's `steps`, or a branch's at + `steps`
  bool started = false;
  bool finished = false;   // a branch that has trained its `steps` (step >= end_step): no longer trains
  bool stopped = false;    // stopped on a non-finite loss (on_nonfinite: stop)
  bool muted = false;      // computes but writes nothing (branches added after the fact)
  bool dormant = false;    // neither computes nor writes (no longer needed)

  // Backend buffers (num_params floats each).
  float* params = nullptr;
  float* grads = nullptr;
  float* m = nullptr;       // adam first moment / sgd momentum buffer
  float* v = nullptr;       // adam second moment
  float* prev = nullptr;    // parameters before the update (log steps: update norm)
  float* shadow = nullptr;  // FP32 gradient at these weights (mx trajectories)
  float* shadow_loss = nullptr;  // [1] FP32 loss at these weights from the shadow pass
  float* loss_hist = nullptr;  // [steps] loss of every step, in backend memory
  float* target = nullptr;     // [B x d] its own targets (MX trajectories with data.mx_teacher_targets)
  Workspace ws;

  // Host-side bookkeeping carried across steps (part of a checkpoint).
  double bias_avg = 0.0;        // EMA of bias_ratio (raw, before debiasing)
  double bias_avg_weight = 0.0; // 1 - beta^k for debiasing
  double cross_sq_avg = 0.0;        // EMA of cross_ratio^2 (the paper code's zeta_norm), same beta
  double cross_sq_avg_weight = 0.0;
  int64_t rows_logged = 0;
  double last_loss = std::numeric_limits<double>::quiet_NaN();  // of the last logged step
  // Largest logged bias_ratio and gamma last-bin fraction (summary attributes; NaN = none yet).
  double max_bias_ratio = std::numeric_limits<double>::quiet_NaN();
  double max_gamma_lastbin = std::numeric_limits<double>::quiet_NaN();
  // Per layer: the running sum of the logged attn_delta_bias (flash attention; empty until set).
  std::vector<double> delta_bias_cumsum;
  // Attention networks, MX trajectories: the W_Q blocks of the gradient error g~ - g-bar at the
  // last logged shadow step, layer after layer (depth * d * d floats; empty until the first), the
  // "previous" of attn_dwq_err_cos.
  std::vector<float> dwq_err_prev;
};

}  // namespace mxlab
