// The resolved configuration of one run: every field has a default here (the one place
// defaults live; `mxlab dump-config` prints them). The YAML schema mirrors this struct
// one-to-one (key names = field names); lab/config/config.cpp parses it strictly.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lab/model/model_config.h"

namespace mxlab {

enum class OptKind : uint8_t { adam = 0, adamw, sgd };
enum class SchedKind : uint8_t { constant = 0, cosine };
enum class OnNonfinite : uint8_t { stop = 0, cont };  // YAML: stop | continue
// What a step trains on (lab/train/README.md, "MX teacher targets" and "Token data";
// experiments/README.md): Gaussian inputs and the teacher's targets, or token sequences of a fixed
// random Markov chain with the next token as the target.
enum class DataKind : uint8_t { gaussian = 0, tokens };

struct DataConfig {
  int batch = 2048;            // sequences per step (with seq_len 1: tokens per step)
  int seq_len = 1;             // tokens per sequence: rows per step = batch * seq_len
  float label_noise = 0.005f;
  // The paper code's target path for the MX trajectories: each MX arm/branch trains on
  // teacher(x) computed under its own precision policy plus fresh label noise (its own stream);
  // false (default): every trajectory trains on the same FP32 targets.
  bool mx_teacher_targets = false;
  DataKind kind = DataKind::gaussian;
  int vocab = 64;              // tokens: token ids 0 .. vocab - 1, 0 the BOS at position 0
};

struct OptimizerConfig {
  OptKind name = OptKind::adam;
  float lr = 6e-4f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;       // sgd
};

struct ScheduleConfig {
  SchedKind name = SchedKind::constant;
  int warmup = 0;              // linear warmup steps (from 0 to lr)
  float lr_min = 0.0f;         // cosine floor
};

struct LogConfig {
  int log_every = 10;
  int bias_every = 0;          // 0 = log_every; shadow FP32 gradient every this many steps
  float spike_factor = 100.0f; // spike: loss_t > spike_factor * loss_{t-1}
  float divergence_factor = 10.0f;  // see lab/stats/README.md, "Events": divergence step definition
  float bias_avg_beta = 0.99f; // running average of bias_ratio: a = beta a + (1-beta) r (debiased)
  OnNonfinite on_nonfinite = OnNonfinite::stop;
  int flush_every = 100;       // HDF5 flush period in logged rows
  bool progress = true;        // progress line on a terminal
  // Curvature instrument: every N-th step (0 = off), the largest eigenvalue of the
  // FP32 loss's Hessian and of the Adam-preconditioned one at each trajectory's weights, on a
  // fixed probe batch of `probe_batch` rows (0 = data.batch), `curvature_iters` iterations.
  int curvature_every = 0;
  int curvature_iters = 20;
  int probe_batch = 0;
  // Parameter snapshots: the state at the start of these steps / every N-th step.
  std::vector<int> snapshot_steps;
  int snapshot_every = 0;
  bool snapshot_optimizer = false;  // also Adam's m and v
};

// One intervention: a named patch of an arm's MX policy from step `at` on.
struct InterventionConfig {
  std::string name;
  int at = 0;
  std::string apply;                         // preset name or empty
  std::map<std::string, std::string> set;    // policy field -> value (YAML scalars as text)
  // What it forks from: an arm's name, or kFp32Name ("fp32": the FP32 trajectory's state at
  // `at`, trained under `precision` patched by apply/set; lab/train/README.md "Interventions").
  std::string from = "mx";
  int steps = 0;                             // steps it trains (at .. at+steps-1); 0 = to the run's end
};

// One arm: a named MX recipe, a patch of `precision` with an intervention's syntax.
// All arms of a run train in lock-step with the one FP32 trajectory. No `arms:` = one arm `mx`
// with `precision` unpatched.
struct ArmConfig {
  std::string name;
  std::string apply;
  std::map<std::string, std::string> set;
};

struct RunConfig {
  std::string name = "run";
  uint64_t seed = 0;
  int steps = 1000;
  std::string device = "auto";  // cpu | auto | cuda | cuda:N
  ModelConfig model;
  TeacherConfig teacher;
  DataConfig data;
  LossKind loss = LossKind::mse;
  float kl_temperature = 1.0f;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  PrecisionConfig precision;
  LogConfig log;
  int checkpoint_every = 0;     // 0 = only at intervention steps
  std::vector<ArmConfig> arms;
  std::vector<InterventionConfig> interventions;

  // The loss the model computes (the model layer's view of `loss` and `kl_temperature`).
  LossSpec loss_spec() const { return LossSpec{loss, kl_temperature}; }
  // Rows of one step's batch: data.batch sequences of data.seq_len tokens.
  int64_t tokens() const { return static_cast<int64_t>(data.batch) * data.seq_len; }
  // The student's vocabulary: data.vocab with data.kind: tokens (embedding and unembedding), else 0.
  int vocab() const { return data.kind == DataKind::tokens ? data.vocab : 0; }
};

// An arm resolved: its name and policy (precision with its patch applied).
struct ResolvedArm {
  std::string name;
  PrecisionConfig policy;
};
// The arms a run trains, in order: `arms:` resolved, or the single arm `mx` = `precision`.
std::vector<ResolvedArm> resolved_arms(const RunConfig& cfg);
// The policy an intervention's branch trains under: its patch (apply, set) applied to the policy
// of the arm named by `from`, or to `precision` when `from` is kFp32Name (the branch forks from
// the FP32 trajectory's state; `precision` is the MX recipe, whatever the arms patch). Throws
// mxlab::Error when `from` names neither.
PrecisionConfig branch_policy(const RunConfig& cfg, const InterventionConfig& iv);

}  // namespace mxlab
