// What a planned run will cost in device time (`mxlab plan`), roughly: from the last bench on the
// device (lab/runs/bench_records.h) or, without one, from a stated model of constants measured on
// an H100 (kernels/PERF.md, "Arms at the GPU's throughput: plan", lists each with its source).
//
// A run of N steps with K MX arms (resolved_arms), the shadow pass every b steps
// (log.bias_every, 0 = log.log_every) and a logged step every log.log_every steps costs
//   start-up + N u + (branch steps) a + (logged steps) L (1 + K) / (1 + K_L) + (curvature) C
// where
//   u = t1 + S (1/b - 1/b1) + (K - 1) a     the unlogged step with K arms
//   a = A + S (1/b - 1/bA)                  one more MX trajectory (an arm, or a branch's step)
//   t1  the trainer's step with 1 arm, measured with the shadow pass every b1 steps
//   A   the cost of each extra arm, (t_K - t_1)/(K - 1), measured with the shadow every bA steps
//   S   one shadow pass (FP32 forward + backward at an arm's weights)
//   L   a logged step over an unlogged one, measured with K_L arms (it grows with the trajectories)
//   C   one curvature measurement of one trajectory (log.curvature_every), per Lanczos iteration
//       as measured, for each of the 1 + K trajectories.
// Branches (interventions) add a for each step they train. Not counted: snapshots, checkpoints,
// the HDF5 file's growth, other runs sharing the GPU (kernels/PERF.md: a second run per GPU gains
// ~4 %), and what an arm's recipe costs beyond the benched one's (bf16 roles, the emulator's ops).
// Each constant comes from the best record: the experiment's own bench; else one of the same shape
// that timed copies of the base recipe (`bench --arms K`) or no arms; else one of the same shape
// that timed another experiment's own arms; else another shape's; the newest within a tier.
// Every time is scaled by the ratio of the student's GEMM FLOPs when it was measured at another
// shape: rough, and a lower bound for a smaller model, whose step is bound by latency, not FLOPs.
#pragma once
#include <cstdint>
#include <string>

#include "lab/config/config.h"
#include "lab/runs/bench_records.h"

namespace mxlab {

// The shape a step's cost depends on: block, norm, depth, width, hidden width, tokens per step
// (and heads, sequence length for attention), e.g. "mlp layernorm L4 d512 H2048 tokens2048".
std::string cost_shape_key(const RunConfig& cfg);
// GEMM GFLOP of one forward + backward of the student (lab/model/gemm_list.h).
double step_gflop(const RunConfig& cfg);

// One constant of the model, in ms at the planned run's shape.
struct CostTerm {
  double ms = 0.0;
  int shadow_every = 0;   // t1, A: the shadow cadence of the step it was measured on
  int arms = 0;           // L: the MX arms of the step it was measured on; C: Lanczos iterations
  double scale = 1.0;     // the FLOP ratio it was scaled by (1: measured at this shape)
  bool stated = false;    // from the stated model
  std::string from;       // which measurement: a bench quantity, or the stated constant's name
  std::string measured;   // where: "<revision>, <measured_at>" of the record, or the stated source
};

struct CostModel {
  std::string device;  // the device it predicts for
  std::string source;  // "bench file PATH" or "stated"
  CostTerm t1, extra, shadow, logged, curvature, startup;
  bool from_bench() const { return source != "stated"; }
};

// The stated model: the H100 constants, scaled to cfg's shape.
CostModel stated_cost_model(const RunConfig& cfg);
// Each constant from the cache's records that fit the run best (the same experiment file at the
// same shape, else any at the same shape, else the latest at any shape, scaled), the stated
// model's where the cache has none. `config_path`: the planned experiment file (compared as an
// absolute path with the records' config).
CostModel cost_model_from_bench(const BenchCache& cache, const RunConfig& cfg, const std::string& config_path);

struct RunCost {
  int64_t steps = 0, logged_steps = 0, branch_steps = 0, curvature_measurements = 0;
  int arms = 0, shadow_every = 1;
  double step_ms = 0.0;          // u
  double extra_ms = 0.0;         // a
  double logged_extra_ms = 0.0;  // L (1 + K) / (1 + K_L)
  double curvature_ms = 0.0;     // C per measurement, all trajectories, at the run's iterations
  double startup_ms = 0.0;
  double total_ms() const;
};
RunCost run_cost(const RunConfig& cfg, const CostModel& m);

}  // namespace mxlab
