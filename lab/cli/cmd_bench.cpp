// `mxlab bench [EXP.yaml] --device cuda [--steps N] [--warmup W]`: milliseconds per step of the
// trainer's step and of its pieces on one device (DESIGN.md section 10), each the median of N
// timed steps after W warm-up steps, with CUDA graphs (each piece captured once and replayed, as
// the trainer captures an unlogged step) and CUDA events on CUDA, a host clock on the CPU. Every
// figure runs the trainer's own code (lab/train/trainer.h: its schedule, optimizer, data and step
// functions) on one trainer of the configuration with one MX arm under the YAML's precision
// policy, which trains through the figures as `mxlab run` would:
//   fp32     the FP32 trajectory's part of a step (Trainer::step_trajectory): forward + loss +
//            backward + optimizer update, on steps 0 .. W+N-1 of the run, each on its own batch
//            (made before its timer starts)
//   mx       the same for the MX trajectory
//   shadow   the FP32 forward + backward at the MX weights (Trainer::step_shadow), the bias
//            metric's reference
//   data     the step's batch: data + teacher forward + label noise (Trainer::step_batch)
//   paired   the trainer's whole unlogged step with the shadow pass (Trainer::step_unlogged,
//            shadow every step): all of the above spread over lanes (streams) and the shadow
//            metrics' reductions, on steps W+N .. 2(W+N)-1 of the run
// followed by the trainer's losses after them (those `mxlab run` computes at that step). With
// --arms K, the trainer's run (logging only at the first and last step) with 1 arm and with K arms
// (K copies of the policy, or the experiment's `arms:`), per step, against the serial sum of its
// parts: FP32 step + K x (MX step + shadow / bias_every) + data, the cost per recipe-step
// against K separate runs, and what each arm beyond the first adds, (t_K - t_1) / (K - 1), also as
// a multiple of the MX trajectory step measured in the same run. On CUDA, in the same process,
// the floors these are measured against: the step's GEMMs alone in cuBLAS (6 per layer: 2 forward, 2 dgrad, 2 wgrad; SGEMM with TF32 off
// for FP32, bf16 operands already quantized for MX; the teacher's 2 per block; an attention block
// adds its 12: 4 projections and 8 strided-batched per-head GEMMs), each figure also as a ratio to
// its floor. Then the cost of one curvature measurement (lab/model/curvature.h: the primal pass
// plus --curvature-iters Lanczos steps of exact Hessian-vector products per eigenvalue) at the
// FP32 trajectory's weights and optimizer state, on the trainer's probe batch of data.batch rows,
// for lambda_max(H) alone and for both lambda_max(H) and lambda_max(P^-1 H), in ms (host clock
// around a synchronised measurement, median of a few after one warm-up that records the product's
// graph) and in forward-backward equivalents (the shadow figure: an FP32 forward + loss +
// backward). With --log-steps N, the trainer's logged step (log_every 1: eager, statistics
// counted, every metric computed and written to an HDF5 run file in a temporary directory, as a
// run writes it) against its unlogged step, and where a logged step's time goes, phase by phase
// (Trainer::set_phase_clock: each phase synchronised, so their sum is a little more than the
// logged step). Every measured quantity is also a record (value, unit, device, revision, command,
// configuration; lab/runs/bench_records.h): --csv FILE writes them as CSV, and they are added to
// the bench cache that `mxlab plan` predicts device time from (--bench-file FILE, default
// $XDG_CACHE_HOME/mxlab/bench/<device>.json; not with --no-graphs or --no-producer-quant, which
// time a step `mxlab run` does not take). The last line is one JSON object for scripts.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lab/backends/backends.h"
#include "lab/backends/op_table.h"
#include "lab/cli/commands.h"
#include "lab/cli/option_checks.h"
#include "lab/core/error.h"
#include "lab/model/backend.h"
#include "lab/model/curvature.h"
#include "lab/model/gemm_list.h"
#include "lab/model/hvp.h"
#include "lab/model/mlp.h"
#include "lab/train/batch.h"
#include "lab/config/config_io.h"
#include "lab/io/table_text.h"
#include "lab/io/writable_dir.h"
#include "lab/runs/bench_records.h"
#include "lab/runs/cost_estimate.h"
#include "lab/runs/memory_estimate.h"
#include "lab/runs/run_file.h"
#include "lab/stats/stats.h"
#include "lab/config/sweep.h"
#include "lab/train/trainer.h"
#include "mxlab_build_info.h"
#ifdef MXLAB_HAVE_CUDA
#include "kernels/bench_support.h"
#endif

namespace mxlab::cli {
namespace {

constexpr int kOrder = 80;             // after the run/analysis commands in --help
constexpr int kCudaSteps = 200;        // default timed steps on a GPU
constexpr int kCudaWarmup = 10;        // >= 3: eager pass, recording, then replays
constexpr int kCpuSteps = 3;           // a paper-size CPU step takes seconds
constexpr int kCpuWarmup = 1;
constexpr int kFloorReps = 50;         // timed replays of each cuBLAS floor graph
constexpr int kCurvatureReps = 5;      // timed curvature measurements on a GPU (1 on the CPU)
constexpr int kCurvatureIters = 20;    // the default log.curvature_iters
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Capture keys of the timed pieces of a step (distinct ints below the trainer's,
// StepCaptureKeys::kFirstKey; the paired figure is the trainer's own step and key).
enum Key : int { kKeyFp32 = 101, kKeyMx, kKeyShadow, kKeyData };

struct Args {
  std::string path;
  std::vector<std::string> sets;
  std::string device = "cuda";
  int steps = 0, warmup = -1;
  int depth = 0, width = 0, batch = 0;
  bool no_graphs = false;
  bool no_producer_quant = false;
  std::string only;  // run one figure (e.g. under a profiler), no floors
  int arms = 0;      // --arms K: time the trainer with 1 and with K arms
  int curvature_iters = kCurvatureIters;
  int run = 0;  // --run I: which run of a sweep
  int log_steps = 0;  // --log-steps N: time N logged trainer steps and their phases
  std::string csv;         // --csv FILE: one record per measured quantity
  std::string bench_file;  // --bench-file FILE: the bench cache to add the records to (default: per device)
};

// The figures of a step, in report order; --only names one of them (or curvature).
enum Fig : int { kFigFp32, kFigMx, kFigShadow, kFigData, kFigPaired, kNumFigs };
constexpr int kOnlyAll = -1;
constexpr int kOnlyCurvature = kNumFigs;
const char* const kOnlyNames[] = {"fp32", "mx", "shadow", "data", "paired", "curvature"};

// What every section reads: the benchmarked configuration, its backend and how steps are timed.
struct Setup {
  Args args;
  RunConfig cfg;  // the run benched, with --set, --depth, --width and --batch applied
  std::unique_ptr<Backend> be;
  bool is_cuda = false;
  bool graphs = false;  // CUDA graphs (not --no-graphs)
  int steps = 0, warmup = 0;
  int only = kOnlyAll;
  NetShape S, T;  // student, teacher
  int64_t B = 0;  // tokens per step
  bool wants(int fig) const { return only == kOnlyAll || only == fig; }
};

// The experiment's run --run I (or the defaults) with the command line's overrides.
RunConfig load_config(const Args& a) {
  RunConfig cfg;
  if (a.path.empty()) {
    cfg = config_from_yaml_string("", "defaults", a.sets);
  } else {
    // A sweep benches one of its runs (they share the step's shape unless the sweep changes it).
    const std::vector<ExpandedRun> runs = expand_experiment(a.path, a.sets);
    if (a.run < 0 || static_cast<size_t>(a.run) >= runs.size())
      throw Error(msg("--run ", a.run, ": ", a.path, " has ", runs.size(), " run", runs.size() == 1 ? "" : "s",
                      " (indices 0..", runs.size() - 1, "; see mxlab plan ", a.path, ")"));
    const ExpandedRun& r = runs[static_cast<size_t>(a.run)];
    cfg = r.cfg;
    if (runs.size() > 1) {
      std::string sw;
      for (const auto& kv : r.swept) sw += (sw.empty() ? "" : ", ") + kv.first + "=" + kv.second;
      std::fprintf(stderr, "note: %s expands to %zu runs; benchmarking run %d (%s); choose another with --run I\n",
                   a.path.c_str(), runs.size(), a.run, sw.c_str());
    }
  }
  if (a.depth > 0) cfg.model.depth = a.depth;
  if (a.width > 0) cfg.model.width = a.width;
  if (a.batch > 0) cfg.data.batch = a.batch;
  validate_config(cfg);
  return cfg;
}

Setup make_setup(const Args& a) {
  Setup s;
  s.args = a;
  s.cfg = load_config(a);
  if (!a.only.empty()) {
    for (int i = 0; i <= kOnlyCurvature; ++i)
      if (a.only == kOnlyNames[i]) s.only = i;
    if (s.only == kOnlyAll)
      throw Error(msg("--only ", a.only, ": use one of fp32, mx, shadow, data, paired, curvature"));
  }
  if (s.only == kOnlyCurvature && !curvature_supported(s.cfg.model))
    throw Error("--only curvature: the curvature instrument covers the MLP block with layernorm only");
  s.be = make_backend(a.device);
  s.is_cuda = s.be->name().rfind("cuda", 0) == 0;
  check_run_fits_memory(s.cfg, !s.is_cuda, a.path.empty() ? "the benchmarked configuration" : a.path,
                        static_cast<size_t>(std::max(a.arms, 0)));  // --arms K: the trainer with K arms
  s.steps = a.steps > 0 ? a.steps : (s.is_cuda ? kCudaSteps : kCpuSteps);
  s.warmup = a.warmup >= 0 ? a.warmup : (s.is_cuda ? kCudaWarmup : kCpuWarmup);
  s.graphs = s.is_cuda && !a.no_graphs;
  if (s.graphs && s.warmup < 3)
    throw Error(msg("--warmup ", s.warmup, " is too short with CUDA graphs (the first pass of a step runs eagerly, "
                    "the second records): use --warmup 3 or more, or --no-graphs"));
  s.S = NetShape::student(s.cfg.model, s.cfg.data.seq_len, s.cfg.vocab());
  s.T = NetShape::teacher(s.cfg.model, s.cfg.teacher, s.cfg.data.seq_len);
  s.B = s.cfg.tokens();
#ifdef MXLAB_HAVE_CUDA
  if (s.is_cuda) cuda::set_producer_quant(*s.be, !a.no_producer_quant);
#endif
  return s;
}

void print_setup(const Setup& s) {
  const RunConfig& cfg = s.cfg;
  std::printf("mxlab bench: %s\n", s.be->name().c_str());
  std::printf("  math mode: %s\n", s.be->math_mode().c_str());
  std::printf("  TF32: off (FP32 GEMMs are IEEE: %s)\n", s.is_cuda ? "cuBLAS pedantic SGEMM" : "Eigen FP32");
  std::printf("  config: %s  L=%d d=%d H=%d B=%lld act=%s, MX policy weight=%s activation=%s grad=%s "
              "elementwise=%s\n",
              s.args.path.empty() ? "(defaults)" : s.args.path.c_str(), s.S.depth, s.S.d, s.S.hidden,
              static_cast<long long>(s.B), act_name(cfg.model.activation), name(cfg.precision.weight),
              name(cfg.precision.activation), name(cfg.precision.grad), cfg.precision.elementwise_bf16 ? "bf16" : "fp32");
  if (s.S.attention())
    std::printf("  attention blocks: %d sequences x %d tokens (B above = tokens), %d heads of %d; attn_logits=%s "
                "attn_probs=%s\n",
                cfg.data.batch, cfg.data.seq_len, s.S.heads, s.S.head_dim(), name(cfg.precision.attn_logits_fmt()),
                name(cfg.precision.attn_probs_fmt()));
  static const char* const kOptimizers[] = {"adam", "adamw", "sgd"};
  static const char* const kSchedules[] = {"constant", "cosine"};
  std::printf("  the trainer's step: optimizer %s, lr %g, schedule %s (warm-up %d steps)\n",
              kOptimizers[static_cast<int>(cfg.optimizer.name)], static_cast<double>(cfg.optimizer.lr),
              kSchedules[static_cast<int>(cfg.schedule.name)], cfg.schedule.warmup);
  if (s.is_cuda)
    std::printf("  producer-side quantization: %s\n",
                s.args.no_producer_quant ? "off (--no-producer-quant: every GEMM quantizes its operands itself)"
                                         : "on (layernorm / activation / add kernels write the next GEMM's MX "
                                           "operand; each pass's weights are quantized together, ahead)");
  std::printf("  %d warm-up + %d timed steps per figure, median; %s\n", s.warmup, s.steps,
              s.graphs ? "CUDA graphs on, CUDA events" : (s.is_cuda ? "CUDA graphs off, CUDA events" : "host clock"));
}

// Median ms of one step of a figure: warmup + steps steps i = 0, 1, ..., each `prepare(i)`
// (untimed; may be empty) then `step(i)` (timed): with CUDA events on lane 0 around step(i) on
// CUDA (nothing synchronises in between: the host runs ahead, as in a run), with the host clock
// around a synchronised step(i) on the CPU.
double time_steps(const Setup& s, const std::function<void(int)>& prepare, const std::function<void(int)>& step) {
  Backend& be = *s.be;
  const int n = s.warmup + s.steps;
  std::vector<double> ms;
#ifdef MXLAB_HAVE_CUDA
  std::unique_ptr<cuda::LaneTimer> timer;
  if (s.is_cuda) timer = std::make_unique<cuda::LaneTimer>(be, n);
#endif
  for (int i = 0; i < n; ++i) {
    if (prepare) prepare(i);
    if (!s.is_cuda) be.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
#ifdef MXLAB_HAVE_CUDA
    if (timer) timer->start(i);
#endif
    step(i);
#ifdef MXLAB_HAVE_CUDA
    if (timer) timer->stop(i);
#endif
    if (!s.is_cuda) {
      be.synchronize();
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= s.warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
#ifdef MXLAB_HAVE_CUDA
  if (timer) {
    const std::vector<double> all = timer->elapsed_ms();
    ms.assign(all.begin() + s.warmup, all.end());
  }
#endif
  be.synchronize();
  return median(ms);
}

// `piece` as the trainer runs an unlogged step: one captured unit under `key`, replayed (CUDA
// graphs), or eagerly with --no-graphs.
void run_captured(const Setup& s, int key, const std::function<void()>& piece) {
  Backend& be = *s.be;
  if (!s.graphs) {
    piece();
    be.join();
  } else if (!be.replay(key)) {
    const bool rec = be.begin_capture(key);
    piece();
    be.end_capture(key);
    if (rec) be.replay(key);
  }
}

// The trainer's configuration for timing its steps: no curvature, snapshots, interventions or
// checkpoints; no progress line.
RunConfig bare_trainer_config(RunConfig cfg) {
  cfg.log.progress = false;
  cfg.log.curvature_every = 0;
  cfg.log.snapshot_steps.clear();
  cfg.log.snapshot_every = 0;
  cfg.interventions.clear();
  cfg.checkpoint_every = 0;
  return cfg;
}
// The GEMMs of a pass (lab/model/gemm_list.h), under the bench's short names.
using Shape = GemmDims;
double gflop(const std::vector<Shape>& v) { return gemm_gflop(v); }

struct Figure {
  const char* key;    // JSON key
  const char* label;  // printed
  double ms = 0.0;        // 0: not run (--only)
  double floor_ms = 0.0;  // 0: no floor
  double gflop = 0.0;
};

// The trainer of the step figures: one MX arm under the configuration's precision policy (the
// --arms figures time the experiment's arms), the shadow pass on every unlogged step (the paired
// figure's step), and at least `steps` steps (the experiment's run, lengthened where shorter).
RunConfig step_trainer_config(const RunConfig& cfg, int steps) {
  RunConfig c = bare_trainer_config(cfg);
  c.arms.clear();
  c.log.bias_every = 1;
  c.steps = std::max(c.steps, steps);
  return c;
}

// The step figures and the trainer they ran on, with what it trained: the FP32 and MX figures
// each train their trajectory through steps 0 .. n-1, the paired figure both through n .. 2n-1
// (n = warmup + steps), as a run would (the curvature figure measures at the FP32 trajectory).
struct StepFigures {
  std::vector<Figure> figs;          // indexed by Fig
  std::unique_ptr<MemorySink> sink;  // the trainer's (the paired figure's shadow rows)
  std::unique_ptr<Trainer> trainer;
  int64_t fp32_steps = 0, mx_steps = 0;     // steps each trajectory has trained
  double fp32_loss = kNaN, mx_loss = kNaN;  // the loss of its last step (fp32_steps - 1, mx_steps - 1)
  bool lengthened = false;                  // the trainer's run is longer than the experiment's
};

// Step t's scalars and batch, as the trainer makes them (the batch one captured unit).
void batch_at(const Setup& s, Trainer& tr, int64_t t) {
  s.be->set_step(step_scalars(tr.config(), t));
  run_captured(s, kKeyData, [&] { tr.step_batch(); });
}

// Trajectory i's part of steps 0, 1, ...: each on its own batch, made before its timer starts.
double time_trajectory_figure(const Setup& s, Trainer& tr, size_t i, int key) {
  return time_steps(s, [&](int t) { batch_at(s, tr, t); },
                    [&](int) { run_captured(s, key, [&] { tr.step_trajectory(i); }); });
}

// The MX trajectory's shadow pass (an FP32 forward + loss + backward) on the batches of steps 0, 1, ...
double time_shadow_figure(const Setup& s, Trainer& tr) {
  return time_steps(s, [&](int t) { batch_at(s, tr, t); },
                    [&](int) { run_captured(s, kKeyShadow, [&] { tr.step_shadow(1); }); });
}

double time_data_figure(const Setup& s, Trainer& tr) {
  return time_steps(s, [&](int t) { s.be->set_step(step_scalars(tr.config(), t)); },
                    [&](int) { run_captured(s, kKeyData, [&] { tr.step_batch(); }); });
}

StepFigures time_step_figures(const Setup& s) {
  const std::vector<Shape> student = pass_gemms(s.S, s.B, true), teacher = pass_gemms(s.T, s.B, false);
  StepFigures out;
  out.figs = {
      {"fp32_step_ms", "FP32 trajectory step", 0, 0, gflop(student)},
      {"mx_step_ms", "MX trajectory step", 0, 0, gflop(student)},
      {"shadow_ms", "shadow pass (FP32 at MX weights)", 0, 0, gflop(student)},
      {"data_ms", "data + teacher forward", 0, 0, gflop(teacher)},
      {"paired_ms", "paired step (all, on lanes)", 0, 0, 3 * gflop(student) + gflop(teacher)},
  };
  const int n = s.warmup + s.steps;
  out.sink = std::make_unique<MemorySink>();
  out.trainer = std::make_unique<Trainer>(step_trainer_config(s.cfg, 2 * n), *s.be, *out.sink);
  Trainer& tr = *out.trainer;
  tr.set_step_capture(s.graphs);
  out.lengthened = tr.config().steps != s.cfg.steps;
  auto loss_of = [&](size_t i) -> double { return s.be->read_scalar(tr.trajectory(i).ws.loss); };
  if (s.wants(kFigFp32)) {
    out.figs[kFigFp32].ms = time_trajectory_figure(s, tr, 0, kKeyFp32);
    out.fp32_steps = n;
    out.fp32_loss = loss_of(0);
  }
  if (s.wants(kFigMx)) {
    out.figs[kFigMx].ms = time_trajectory_figure(s, tr, 1, kKeyMx);
    out.mx_steps = n;
    out.mx_loss = loss_of(1);
  }
  if (s.wants(kFigShadow)) out.figs[kFigShadow].ms = time_shadow_figure(s, tr);
  if (s.wants(kFigData)) out.figs[kFigData].ms = time_data_figure(s, tr);
  if (s.wants(kFigPaired)) {
    MXLAB_ASSERT(out.fp32_steps == out.mx_steps, "the paired figure continues both trajectories from one step");
    tr.set_step(out.fp32_steps);  // where the FP32 and MX figures left off
    out.figs[kFigPaired].ms = time_steps(s, {}, [&](int) { tr.step_unlogged(); });
    tr.run(RunControl{}, tr.step());  // no more steps: flushes the queued shadow rows, synchronises
    out.fp32_steps = out.mx_steps = tr.step();
    out.fp32_loss = loss_of(0);
    out.mx_loss = loss_of(1);
  }
  if ((out.fp32_steps > 0 && !std::isfinite(out.fp32_loss)) || (out.mx_steps > 0 && !std::isfinite(out.mx_loss)))
    throw Error(msg("bench: non-finite loss after the timed steps (fp32 ", out.fp32_loss, ", mx ", out.mx_loss,
                    "): the timings would be of a broken step"));
  return out;
}

// The cuBLAS floors of the step figures (CUDA; not with --only).
struct Floors {
  double sgemm = 0.0, bf16 = 0.0, teacher = 0.0;
  double sgemm_default = 0.0, sgemm_default_diff = 0.0;  // a candidate for the FP32 GEMMs, not used
};

Floors measure_floors(const Setup& s, std::vector<Figure>& figs) {
  Floors f;
#ifdef MXLAB_HAVE_CUDA
  if (!s.is_cuda || s.only != kOnlyAll) return f;
  int dev = 0;
  if (s.args.device.size() > 5) dev = std::stoi(s.args.device.substr(5));
  auto to_cuda = [](const std::vector<Shape>& v) {
    std::vector<cuda::GemmShape> out;
    for (const Shape& g : v) out.push_back({g.M, g.N, g.K, g.a_kc, g.b_kc, g.batch});
    return out;
  };
  const std::vector<cuda::GemmShape> student = to_cuda(pass_gemms(s.S, s.B, true));
  const std::vector<cuda::GemmShape> teacher = to_cuda(pass_gemms(s.T, s.B, false));
  f.sgemm = cuda::gemm_floor_ms(student, cuda::FloorKind::sgemm, dev, 3, kFloorReps);
  f.bf16 = cuda::gemm_floor_ms(student, cuda::FloorKind::bf16, dev, 3, kFloorReps);
  f.teacher = cuda::gemm_floor_ms(teacher, cuda::FloorKind::sgemm, dev, 3, kFloorReps);
  f.sgemm_default = cuda::gemm_floor_ms(student, cuda::FloorKind::sgemm_default, dev, 3, kFloorReps);
  f.sgemm_default_diff = cuda::sgemm_default_rel_diff(student.front(), dev);
  const PrecisionConfig& p = s.cfg.precision;
  const bool mx_gemms = is_mx(p.weight) || is_mx(p.activation) || p.weight == NumFmt::bf16 || p.elementwise_bf16;
  figs[kFigFp32].floor_ms = f.sgemm;
  figs[kFigMx].floor_ms = mx_gemms ? f.bf16 : f.sgemm;
  figs[kFigShadow].floor_ms = f.sgemm;
  figs[kFigData].floor_ms = f.teacher;
  figs[kFigPaired].floor_ms = 2 * f.sgemm + figs[kFigMx].floor_ms + f.teacher;  // serial sum of the parts' floors
#else
  (void)s;
  (void)figs;
#endif
  return f;
}

// A loss as text with every digit a float has (the same bits as a run file's).
std::string loss_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void print_step_figures(const Setup& s, const StepFigures& st, const Floors& fl) {
  std::printf("\n  %-36s %10s %10s %8s %10s\n", "figure", "ms/step", "floor ms", "ratio", "TFLOP/s");
  for (const Figure& f : st.figs) {
    if (f.ms <= 0) continue;  // not run (--only)
    const double tflops = f.gflop / f.ms;  // GFLOP / ms = TFLOP/s
    if (f.floor_ms > 0)
      std::printf("  %-36s %10.3f %10.3f %8.3f %10.2f\n", f.label, f.ms, f.floor_ms, f.ms / f.floor_ms, tflops);
    else
      std::printf("  %-36s %10.3f %10s %8s %10.2f\n", f.label, f.ms, "-", "-", tflops);
  }
  const std::vector<Shape> student = pass_gemms(s.S, s.B, true);
  if (fl.sgemm > 0)
    std::printf("  floors: cuBLAS alone on the same GEMM shapes (%zu per step): SGEMM %.3f ms, bf16 %.3f ms, "
                "teacher SGEMM %.3f ms\n",
                student.size(), fl.sgemm, fl.bf16, fl.teacher);
  if (fl.sgemm_default > 0)
    std::printf("  not used, for comparison: FP32 SGEMM as CUBLAS_COMPUTE_32F with the default math mode (TF32 off) "
                "%.3f ms = %.3f x pedantic; max relative difference from pedantic on the %lld x %lld x %lld GEMM "
                "%.2g (IEEE FP32 in another order ~1e-6, TF32 ~1e-3)\n",
                fl.sgemm_default, fl.sgemm_default / fl.sgemm, static_cast<long long>(student.front().M),
                static_cast<long long>(student.front().N), static_cast<long long>(student.front().K),
                fl.sgemm_default_diff);
  auto loss = [](int64_t steps, double v) {
    return steps > 0 ? msg(loss_text(v), " at step ", steps - 1) : std::string("- (not trained)");
  };
  if (st.fp32_steps > 0 || st.mx_steps > 0)
    std::printf("  final losses: fp32 %s, mx %s (the trainer's, as mxlab run computes them at that step%s)\n",
                loss(st.fp32_steps, st.fp32_loss).c_str(), loss(st.mx_steps, st.mx_loss).c_str(),
                st.lengthened ? msg("; the run lengthened to ", st.trainer->config().steps,
                                    " steps for the bench, which moves a cosine schedule").c_str()
                              : "");
#ifdef MXLAB_HAVE_CUDA
  if (s.is_cuda)
    std::printf("  GEMM operands taken from their producers: %lld (counted as steps are issued: eager runs and graph "
                "recordings, not replays)\n",
                static_cast<long long>(cuda::producer_quant_hits(*s.be)));
#endif
}
// ---- --arms K: the trainer's run with 1 arm and with K arms ----

// The trainer's run (every step of it: compute, update, the shadow pass every bias_every steps
// and its metrics; CUDA graphs as the trainer uses them unless --no-graphs), ms per step:
// `warmup` steps, then the wall time of `steps` more over their count. It logs only at step 0.
double trainer_ms_per_step(const Setup& s, RunConfig cfg) {
  cfg = bare_trainer_config(cfg);
  cfg.steps = std::max(cfg.steps, s.warmup + s.steps + 2);  // the experiment's run, lengthened where shorter
  cfg.log.log_every = cfg.steps;
  MemorySink sink;
  Trainer tr(cfg, *s.be, sink);
  tr.set_step_capture(s.graphs);
  tr.open_output();
  tr.run(RunControl{}, 1 + s.warmup);  // step 0 logs; then warm-up (graph recording)
  const auto t0 = std::chrono::steady_clock::now();
  tr.run(RunControl{}, 1 + s.warmup + s.steps);
  const auto t1 = std::chrono::steady_clock::now();  // run() synchronises before it returns
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / s.steps;
}

struct ArmsFigures {
  int K = 0;  // 0: not timed
  int bias_every = 1;
  double one_ms = 0.0, arms_ms = 0.0;  // the trainer's step with 1 arm, with K arms
  double serial_ms = kNaN;             // FP32 + K x (MX + shadow / bias_every) + data, from the step figures
                                       // (NaN when --only left one of them untimed)
  double saving = 0.0;                 // per recipe-step: 1 arm over K arms / K
  // What each arm beyond the first adds, (t_K - t_1) / (K - 1) (K >= 2, else NaN), and that over
  // the MX trajectory step measured in the same run (NaN without it: --only).
  double per_extra_ms = kNaN, mx_ms = 0.0, per_extra_mx_ratio = kNaN;
};

// The arms figures' arithmetic on the two trainer steps and the step figures.
void derive_arms_figures(ArmsFigures& r, const std::vector<Figure>& figs) {
  if (figs[kFigFp32].ms > 0 && figs[kFigMx].ms > 0 && figs[kFigShadow].ms > 0 && figs[kFigData].ms > 0)
    r.serial_ms = figs[kFigFp32].ms + r.K * (figs[kFigMx].ms + figs[kFigShadow].ms / r.bias_every) + figs[kFigData].ms;
  r.saving = r.one_ms / (r.arms_ms / r.K);
  r.mx_ms = figs[kFigMx].ms;
  if (r.K >= 2) r.per_extra_ms = (r.arms_ms - r.one_ms) / (r.K - 1);
  if (r.K >= 2 && r.mx_ms > 0) r.per_extra_mx_ratio = r.per_extra_ms / r.mx_ms;
}

ArmsFigures time_arms(const Setup& s, const std::vector<Figure>& figs) {
  ArmsFigures r;
  if (!(s.args.arms > 0 || (!s.cfg.arms.empty() && s.only == kOnlyAll))) return r;
  RunConfig one = s.cfg, many = s.cfg;
  one.arms.clear();
  if (s.args.arms > 0) {
    many.arms.clear();
    for (int k = 0; k < s.args.arms; ++k) many.arms.push_back({msg("arm", k), "", {}});
  }
  r.K = static_cast<int>(many.arms.size());
  r.bias_every = s.cfg.log.bias_every > 0 ? s.cfg.log.bias_every : s.cfg.log.log_every;
  r.one_ms = trainer_ms_per_step(s, one);
  r.arms_ms = trainer_ms_per_step(s, many);
  derive_arms_figures(r, figs);
  return r;
}

void print_arms(const Setup& s, const ArmsFigures& r) {
  if (r.K == 0) return;
  std::printf("\n  trainer step (shadow every %d steps%s):\n", r.bias_every,
              s.graphs ? ", CUDA graphs as the trainer uses them" : "");
  std::printf("  %-36s %10.3f\n", "1 arm (a run of one recipe)", r.one_ms);
  if (std::isfinite(r.serial_ms))
    std::printf("  %-36s %10.3f   serial sum of parts %.3f (FP32 + %d x (MX + shadow/%d) + data): ratio %.3f\n",
                msg(r.K, " arms").c_str(), r.arms_ms, r.serial_ms, r.K, r.bias_every, r.arms_ms / r.serial_ms);
  else
    std::printf("  %-36s %10.3f   serial sum of parts: - (--only left the step figures untimed)\n",
                msg(r.K, " arms").c_str(), r.arms_ms);
  std::printf("  per recipe-step: %d arms %.3f ms vs separate runs %.3f ms: %.2fx cheaper\n", r.K, r.arms_ms / r.K,
              r.one_ms, r.saving);
  if (r.K < 2)
    std::printf("  per extra arm: - (needs 2 or more arms: --arms K)\n");
  else if (r.mx_ms > 0)
    std::printf("  per extra arm: (%.3f - %.3f) / (%d - 1) = %.3f ms = %.3f x the MX trajectory step (%.3f ms) "
                "measured above\n", r.arms_ms, r.one_ms, r.K, r.per_extra_ms, r.per_extra_mx_ratio, r.mx_ms);
  else
    std::printf("  per extra arm: (%.3f - %.3f) / (%d - 1) = %.3f ms (the MX trajectory step was not timed: --only)\n",
                r.arms_ms, r.one_ms, r.K, r.per_extra_ms);
}

// ---- --log-steps N: a logged trainer step against an unlogged one, and its phases ----

// --log-steps: a logged step against an unlogged one, and its phases.
struct LogProfile {
  double logged_ms = 0.0;   // per logged step, no phase clock
  double clocked_ms = 0.0;  // per logged step with the phase clock (its synchronisations)
  int bias_every = 1;       // the shadow cadence of the logged and the unlogged steps
  int shadow_steps = 0;     // logged steps of the timed ones with the shadow pass
  std::vector<std::pair<std::string, double>> phases;  // ms per logged step, in order of first use
};

// `warmup` logged steps, then `steps` timed ones without the phase clock and `steps` with it,
// every one logged (log_every 1) into a RunFile in a temporary directory.
// The experiment's run, lengthened where shorter: its schedule.
LogProfile trainer_log_profile(Backend& be, RunConfig cfg, int warmup, int steps) {
  cfg = bare_trainer_config(cfg);
  cfg.steps = std::max(cfg.steps, warmup + 2 * steps + 1);
  // The unlogged step's shadow cadence (bias_every 0 means every log_every steps).
  if (cfg.log.bias_every <= 0) cfg.log.bias_every = cfg.log.log_every;
  cfg.log.log_every = 1;
  namespace fs = std::filesystem;
  struct TempDir {  // removed however the profile ends (after the run file below is closed)
    fs::path path;
    ~TempDir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } dir{fs::temp_directory_path() / msg("mxlab_bench_log_", ::getpid())};
  fs::create_directories(dir.path);
  LogProfile p;
  p.bias_every = std::max(1, cfg.log.bias_every);
  {
    std::unique_ptr<RunFile> file = RunFile::create((dir.path / "bench.h5").string(), Attrs{});
    Trainer tr(cfg, be, *file);
    tr.open_output();
    tr.run(RunControl{}, warmup);
    auto timed = [&](int64_t to) {
      const auto t0 = std::chrono::steady_clock::now();
      tr.run(RunControl{}, to);  // run() synchronises before it returns
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
    };
    p.logged_ms = timed(warmup + steps);
    auto last = std::chrono::steady_clock::now();
    tr.set_phase_clock([&](const char* phase) {
      be.synchronize();
      const auto now = std::chrono::steady_clock::now();
      if (phase) {
        const double ms = std::chrono::duration<double, std::milli>(now - last).count() / steps;
        auto it = std::find_if(p.phases.begin(), p.phases.end(), [&](const auto& e) { return e.first == phase; });
        if (it == p.phases.end()) p.phases.push_back({phase, ms});
        else it->second += ms;
      }
      last = now;
    });
    p.clocked_ms = timed(warmup + 2 * steps);
    for (int t = warmup + steps; t < warmup + 2 * steps; ++t) p.shadow_steps += t % p.bias_every == 0;
  }
  return p;
}

struct LogFigures {
  int steps = 0;  // 0: not timed
  double unlogged_ms = 0.0;
  LogProfile profile;
};

LogFigures time_logged_steps(const Setup& s) {
  LogFigures r;
  if (s.args.log_steps <= 0) return r;
  r.steps = s.args.log_steps;
  r.unlogged_ms = trainer_ms_per_step(s, s.cfg);
  r.profile = trainer_log_profile(*s.be, s.cfg, std::min(s.warmup, 3), r.steps);
  return r;
}

void print_logged_steps(const Setup& s, const LogFigures& r) {
  if (r.steps == 0) return;
  const LogProfile& lp = r.profile;
  std::printf("\n  logged trainer step (log_every 1: eager, statistics counted, every metric written to an HDF5 "
              "run file), %d steps, %d with the shadow pass:\n", r.steps, lp.shadow_steps);
  std::printf("  %-36s %10.3f   unlogged step %.3f ms (shadow every %d steps%s): +%.3f ms per logged step\n",
              "logged step", lp.logged_ms, r.unlogged_ms, lp.bias_every, s.graphs ? ", CUDA graphs" : "",
              lp.logged_ms - r.unlogged_ms);
  double sum = 0.0;
  for (const auto& ph : lp.phases) sum += ph.second;
  std::printf("  where it goes (each phase synchronised: %.3f ms per logged step in all):\n", lp.clocked_ms);
  for (const auto& [name, ms] : lp.phases)
    std::printf("    %-38s %8.3f  %5.1f %%\n", name.c_str(), ms, sum > 0 ? 100.0 * ms / sum : 0.0);
}

// ---- curvature: one measurement at the FP32 trajectory's weights vs one forward-backward ----

struct CurvatureFigures {
  bool measured = false;
  bool precond = true;  // Adam: lambda_max(P^-1 H) too (SGD: P = I, the trainer measures H alone)
  double fb_ms = 0.0;   // an FP32 forward + loss + backward (the shadow pass)
  double hessian_ms = 0.0, both_ms = 0.0;
  CurvatureResult res;
};

// As the trainer measures (Trainer::measure_curvature) at the FP32 trajectory's weights and
// Adam's v after the steps it trained, on the trainer's probe batch (make_probe_batch) of
// data.batch rows.
CurvatureFigures time_curvature(const Setup& s, StepFigures& st) {
  CurvatureFigures c;
  if (!s.wants(kOnlyCurvature) || !curvature_supported(s.cfg.model)) return c;
  if (s.args.curvature_iters < 2)
    throw Error(msg("--curvature-iters must be at least 2 (got ", s.args.curvature_iters, ")"));
  Backend& be = *s.be;
  Trainer& tr = *st.trainer;
  const RunConfig& cfg = tr.config();
  c.measured = true;
  c.fb_ms = st.figs[kFigShadow].ms > 0 ? st.figs[kFigShadow].ms : time_shadow_figure(s, tr);
  const int64_t rows = s.B;
  const size_t n = static_cast<size_t>(rows * s.S.d);
  float* px = be.alloc(n);
  float* py = be.alloc(n);
  const std::vector<float> tp = teacher_params_host(cfg, s.T);
  float* teacher = be.alloc(tp.size());
  be.upload(teacher, tp.data(), tp.size());
  make_probe_batch(be, cfg, s.T, teacher, rows, px, py);
  Curvature curvature(be, s.S, cfg.loss_spec(), cfg.seed, rows);
  const int64_t updates = std::max<int64_t>(1, st.fp32_steps);
  be.set_step(step_scalars(cfg, updates));
  const float bc2 = step_scalars(cfg, updates - 1).bc2;  // 1 - beta2^updates: v after `updates` updates
  c.precond = cfg.optimizer.name != OptKind::sgd;
  const Trajectory& fp32 = tr.trajectory(0);
  auto time_measure = [&](const float* v) {
    std::vector<double> ms;
    const int reps = s.is_cuda ? kCurvatureReps : 1;
    for (int i = 0; i <= reps; ++i) {  // i == 0: warm-up (records the product's graph)
      be.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      c.res = curvature.measure(fp32.params, px, py, v, bc2, cfg.optimizer.eps, s.args.curvature_iters, cfg.seed);
      be.synchronize();
      const auto t1 = std::chrono::steady_clock::now();
      if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    return median(ms);
  };
  c.hessian_ms = time_measure(nullptr);
  c.both_ms = c.precond ? time_measure(fp32.v) : c.hessian_ms;
  return c;
}

void print_curvature(const Setup& s, const CurvatureFigures& c) {
  if (s.only == kOnlyAll && !curvature_supported(s.cfg.model))
    std::printf("\n  curvature: not measured (its Hessian-vector products cover the MLP block with layernorm only)\n");
  if (!c.measured) return;
  const int iters = s.args.curvature_iters;
  std::printf("\n  curvature (probe batch %lld rows, %d Lanczos steps per eigenvalue, FP32 SGEMM):\n",
              static_cast<long long>(s.B), iters);
  std::printf("    FP32 forward+backward (no optimizer)  %10.3f ms\n", c.fb_ms);
  std::printf("    lambda_max(H) alone                  %10.3f ms = %7.2f fwd-bwd = %5.2f x iters\n", c.hessian_ms,
              c.hessian_ms / c.fb_ms, c.hessian_ms / c.fb_ms / iters);
  if (c.precond)
    std::printf("    lambda_max(H) and lambda_max(P^-1 H) %10.3f ms = %7.2f fwd-bwd = %5.2f x iters\n", c.both_ms,
                c.both_ms / c.fb_ms, c.both_ms / c.fb_ms / iters);
  else
    std::printf("    lambda_max(P^-1 H): not measured (sgd: P = I, the trainer measures lambda_max(H) alone)\n");
  std::printf("    per Hessian-vector product: %d GEMMs (a forward+backward: %d); one primal pass per measurement\n",
              hvp_gemms(s.S), 6 * s.S.depth);
  std::printf("    at the FP32 weights: lambda_max(H) %.6g (resid %.2g), lambda_max(P^-1 H) %.6g (resid %.2g), "
              "probe loss %.6g\n",
              c.res.hessian_lmax, c.res.hessian_resid, c.res.precond_lmax, c.res.precond_resid, c.res.loss);
}

// ---- the last line: one JSON object ----

std::string json_line(const Setup& s, const StepFigures& st, const Floors& fl, const ArmsFigures& arms,
                      const LogFigures& log, const CurvatureFigures& curv) {
  std::string json = msg("{\"bench\":\"mxlab\",\"device\":\"", s.be->name(), "\",\"math_mode\":\"", s.be->math_mode(),
                         "\",\"config\":\"", s.args.path, "\",\"depth\":", s.S.depth, ",\"width\":", s.S.d,
                         ",\"batch\":", s.B, ",\"block\":\"", s.S.attention() ? "attention" : "mlp",
                         "\",\"seq_len\":", s.cfg.data.seq_len, ",\"steps\":", s.steps, ",\"warmup\":", s.warmup,
                         ",\"graphs\":", s.graphs ? "true" : "false");
  for (const Figure& f : st.figs) {
    if (f.ms <= 0) continue;
    json += msg(",\"", f.key, "\":", shortest_repr(f.ms));  // full precision: per_extra_arm_mx_ratio divides by mx_step_ms
    if (f.floor_ms > 0) json += msg(",\"", f.key, "_floor\":", f.floor_ms, ",\"", f.key, "_ratio\":", f.ms / f.floor_ms);
  }
  if (st.fp32_steps > 0) json += msg(",\"fp32_loss\":", loss_text(st.fp32_loss), ",\"fp32_loss_step\":", st.fp32_steps - 1);
  if (st.mx_steps > 0) json += msg(",\"mx_loss\":", loss_text(st.mx_loss), ",\"mx_loss_step\":", st.mx_steps - 1);
  if (fl.sgemm_default > 0)
    json += msg(",\"sgemm_default_floor_ms\":", fl.sgemm_default, ",\"sgemm_default_rel_diff\":", fl.sgemm_default_diff);
  if (arms.K > 0) {  // full precision: per_extra_arm_ms is (trainer_arms_ms - trainer_1arm_ms) / (arms - 1)
    json += msg(",\"arms\":", arms.K, ",\"trainer_1arm_ms\":", shortest_repr(arms.one_ms),
                ",\"trainer_arms_ms\":", shortest_repr(arms.arms_ms), ",\"arms_saving\":", arms.saving);
    if (std::isfinite(arms.serial_ms)) json += msg(",\"arms_serial_ms\":", arms.serial_ms);
    if (std::isfinite(arms.per_extra_ms)) json += msg(",\"per_extra_arm_ms\":", shortest_repr(arms.per_extra_ms));
    if (std::isfinite(arms.per_extra_mx_ratio))
      json += msg(",\"per_extra_arm_mx_ratio\":", shortest_repr(arms.per_extra_mx_ratio));
  }
  if (curv.measured)
    json += msg(",\"fwd_bwd_ms\":", curv.fb_ms, ",\"curvature_iters\":", s.args.curvature_iters,
                ",\"curvature_hessian_ms\":", curv.hessian_ms, ",\"curvature_ms\":", curv.both_ms,
                ",\"curvature_hessian_fb_equiv\":", curv.hessian_ms / curv.fb_ms,
                ",\"curvature_fb_equiv\":", curv.both_ms / curv.fb_ms, ",\"hvp_gemms\":", hvp_gemms(s.S));
  if (log.steps > 0)
    json += msg(",\"log_steps\":", log.steps, ",\"logged_step_ms\":", log.profile.logged_ms,
                ",\"unlogged_step_ms\":", log.unlogged_ms, ",\"logged_step_clocked_ms\":", log.profile.clocked_ms);
  json += msg(",\"step_gflop\":", gflop(pass_gemms(s.S, s.B, true)), "}");
  return json;
}

// ---- the records: one per measured quantity (--csv FILE, the bench cache of mxlab plan) ----

// The device's model: the GPU's name, or the backend's ("cpu").
std::string device_model(const Backend& be) {
  for (const auto& [key, value] : be.describe())
    if (key == "gpu" && !value.empty()) return value;
  return be.name();
}

// Every quantity the run measured (the timings and their ratios; not the losses), each with the
// device, the revision, the command and the benched configuration.
std::vector<BenchRecord> bench_records(const Setup& s, const StepFigures& st, const Floors& fl, const ArmsFigures& arms,
                                       const LogFigures& log, const CurvatureFigures& curv) {
  BenchRecord base;
  base.device = device_model(*s.be);
  base.backend = s.be->name();
  base.revision = MXLAB_GIT_COMMIT;
  base.command = command_line();
  base.config = bench_config_path(s.args.path);
  base.shape = cost_shape_key(s.cfg);
  base.step_gflop = step_gflop(s.cfg);
  base.measured_at = utc_now_iso();
  std::vector<BenchRecord> out;
  auto add = [&](const std::string& quantity, double value, const char* unit, int arms_n = 0, int every = 0) {
    if (!std::isfinite(value)) return;
    BenchRecord r = base;
    r.quantity = quantity;
    r.value = value;
    r.unit = unit;
    r.arms = arms_n;
    r.shadow_every = every;
    out.push_back(std::move(r));
  };
  for (int f = 0; f < kNumFigs; ++f) {
    const Figure& fig = st.figs[static_cast<size_t>(f)];
    if (fig.ms <= 0) continue;
    const bool step = f == kFigPaired;  // the trainer's whole step: 1 arm, the shadow pass every step
    add(fig.key, fig.ms, "ms", step ? 1 : 0, step ? 1 : 0);
    if (fig.floor_ms > 0) {
      const std::string k = fig.key;
      const std::string stem = k.size() > 3 && k.compare(k.size() - 3, 3, "_ms") == 0 ? k.substr(0, k.size() - 3) : k;
      add(stem + "_floor_ms", fig.floor_ms, "ms");
    }
  }
  if (fl.sgemm_default > 0) add("sgemm_default_floor_ms", fl.sgemm_default, "ms");
  if (arms.K > 0) {
    add("trainer_1arm_ms", arms.one_ms, "ms", 1, arms.bias_every);
    add("trainer_arms_ms", arms.arms_ms, "ms", arms.K, arms.bias_every);
    add("arms_serial_ms", arms.serial_ms, "ms", arms.K, arms.bias_every);
    add("arms_saving", arms.saving, "ratio", arms.K, arms.bias_every);
    add("per_extra_arm_ms", arms.per_extra_ms, "ms", arms.K, arms.bias_every);
    add("per_extra_arm_mx_ratio", arms.per_extra_mx_ratio, "ratio", arms.K, arms.bias_every);
  }
  if (log.steps > 0) {
    const int k = static_cast<int>(resolved_arms(s.cfg).size());
    const int every = log.profile.bias_every;
    add("logged_step_ms", log.profile.logged_ms, "ms", k, every);
    add("unlogged_step_ms", log.unlogged_ms, "ms", k, every);
    add("logged_step_extra_ms", log.profile.logged_ms - log.unlogged_ms, "ms", k, every);
  }
  if (curv.measured) {
    add("fwd_bwd_ms", curv.fb_ms, "ms");
    add("curvature_hessian_ms", curv.hessian_ms, "ms");
    add("curvature_ms", curv.both_ms, "ms");
    add("curvature_iters", s.args.curvature_iters, "count");
  }
  return out;
}

// --csv FILE, and the bench cache (--bench-file FILE, or the device's file in the cache folder).
void save_records(const Setup& s, const std::vector<BenchRecord>& records) {
  if (records.empty()) return;
  std::printf("\n");
  if (!s.args.csv.empty()) {
    write_text_atomically(s.args.csv, bench_records_csv(records));
    std::printf("  records: %zu measured quantities written to %s\n", records.size(), s.args.csv.c_str());
  }
  if (s.args.no_graphs || s.args.no_producer_quant) {
    std::printf("  bench cache: not written (%s times a step mxlab run does not take)\n",
                s.args.no_graphs ? "--no-graphs" : "--no-producer-quant");
    return;
  }
  const std::string device = records.front().device;
  std::string path = s.args.bench_file;
  if (path.empty()) {
    const std::string dir = default_bench_dir();
    if (dir.empty()) {
      std::printf("  bench cache: not written (neither XDG_CACHE_HOME nor HOME is set: name a file with --bench-file)\n");
      return;
    }
    path = (std::filesystem::path(dir) / bench_file_name(device)).string();
  }
  try {
    write_bench_cache(path, device, records);
  } catch (const IoError& e) {
    if (!s.args.bench_file.empty()) throw;
    std::fprintf(stderr, "mxlab: warning: %s; mxlab plan will not see this bench (--bench-file FILE writes elsewhere)\n",
                 one_line_message(e.what()).c_str());
    return;
  }
  std::printf("  bench cache: %zu records added to %s (what mxlab plan predicts device time from)\n", records.size(),
              path.c_str());
}

void run_bench(const Args& a) {
  // A file named on the command line that cannot be written fails now, not after the timings.
  for (const std::string& f : {a.csv, a.bench_file})
    if (!f.empty()) {
      const std::string dir = std::filesystem::path(f).parent_path().string();
      ensure_writable_dir(dir.empty() ? "." : dir);
    }
  Setup s = make_setup(a);
  print_setup(s);
  StepFigures st = time_step_figures(s);
  const Floors floors = measure_floors(s, st.figs);
  print_step_figures(s, st, floors);
  const ArmsFigures arms = time_arms(s, st.figs);
  print_arms(s, arms);
  const LogFigures log = time_logged_steps(s);
  print_logged_steps(s, log);
  const CurvatureFigures curv = time_curvature(s, st);
  print_curvature(s, curv);
  save_records(s, bench_records(s, st, floors, arms, log, curv));
  std::printf("%s\n", json_line(s, st, floors, arms, log, curv).c_str());
}

// `mxlab bench --ops [NAME...] --device D`: instead of the step figures above, each op of the op
// table (lab/backends/op_table.h; all of them without names) at its bench size (the paper
// configuration) on a fresh backend, one row per op: name, size, ms per call = host clock around
// `steps` calls (after `warmup`), synchronised after the last.
void run_op_bench(const Args& a, const std::vector<std::string>& names) {
  if (!a.path.empty() || !a.sets.empty() || a.depth || a.width || a.batch || a.arms || !a.only.empty() ||
      a.log_steps || a.run || !a.csv.empty() || !a.bench_file.empty())
    throw Error("--ops times each backend op at its fixed bench size: drop the experiment file and --set, --depth, "
                "--width, --batch, --arms, --only, --log-steps, --run, --csv, --bench-file");
  std::vector<const OpDesc*> ops;
  for (const std::string& n : names) {
    if (n.empty()) continue;
    const OpDesc* d = find_op(n);
    if (!d) {
      std::string known;
      for (const OpDesc& o : op_table()) known += (known.empty() ? "" : " ") + std::string(o.name);
      throw Error(msg("--ops: no op named '", n, "' in the op table (lab/backends/op_table.cpp); ops: ", known));
    }
    ops.push_back(d);
  }
  if (ops.empty())
    for (const OpDesc& d : op_table()) ops.push_back(&d);
  const std::string device_name = make_backend(a.device)->name();
  const bool is_cuda = device_name.rfind("cuda", 0) == 0;
  const int steps = a.steps > 0 ? a.steps : (is_cuda ? 100 : 3);
  const int warmup = a.warmup >= 0 ? a.warmup : (is_cuda ? 5 : 1);
  std::printf("mxlab bench --ops: %s\n", device_name.c_str());
  std::printf("  %d warm-up + %d timed calls per op (host clock, synchronised after the last); sizes of the paper "
              "configuration\n\n", warmup, steps);
  std::printf("  %-24s %-36s %12s\n", "op", "size", "ms/call");
  for (const OpDesc* d : ops) {
    if (const OpExemption* pending = is_cuda ? find_cuda_pending(d->name) : nullptr) {
      std::printf("  %-24s %-36s %12s  (%s)\n", d->name, op_size_text(*d, d->bench).c_str(), "-", pending->why);
      continue;
    }
    std::unique_ptr<Backend> be = make_backend(a.device);  // its buffers go with it
    const OpCase c = d->make(d->bench, 1);
    const OpBufs b = op_place(*be, *d, c);
    std::vector<double> host;
    for (int i = 0; i < warmup; ++i) d->run(*be, b, host);
    be->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      host.clear();
      d->run(*be, b, host);
    }
    be->synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
    std::printf("  %-24s %-36s %12.4f\n", d->name, op_size_text(*d, d->bench).c_str(), ms);
    std::fflush(stdout);
  }
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("bench", "Time the trainer's step and its pieces on a device (ms/step)");
  sub->add_option("config", args->path, "experiment YAML file (omit for the built-in defaults)");
  sub->add_option("--set", args->sets, "override a key, e.g. --set model.width=256 (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--device", args->device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--steps", args->steps, "timed steps per figure (default 200 on CUDA, 3 on the CPU)")
      ->check(integer_in(1));
  sub->add_option("--warmup", args->warmup, "warm-up steps per figure (default 10 on CUDA, 1 on the CPU)")
      ->check(integer_in(0));
  sub->add_option("--depth", args->depth, "override model.depth")->check(integer_in(1));
  sub->add_option("--width", args->width, "override model.width")->check(integer_in(1));
  sub->add_option("--batch", args->batch, "override data.batch (sequences with data.seq_len > 1)")->check(integer_in(1));
  sub->add_option("--run", args->run, "which run of a sweep to bench (index as in mxlab plan; default 0)")
      ->check(integer_in(0));
  sub->add_flag("--no-graphs", args->no_graphs, "launch every op eagerly instead of replaying CUDA graphs");
  sub->add_flag("--no-producer-quant", args->no_producer_quant,
                "CUDA: every GEMM quantizes its operands itself, instead of taking the MX operand its producer "
                "(layernorm / activation / add kernel) wrote in the same pass or the pass quantized ahead "
                "(its weights) (same bits; for comparisons)");
  sub->add_option("--arms", args->arms,
                  "also time the trainer with 1 and with K arms (K copies of the policy; without --arms an "
                  "experiment's own arms: are used)")
      ->check(integer_in(1));
  sub->add_option("--only", args->only,
                  "time one figure only (fp32, mx, shadow, data, paired, curvature), no cuBLAS floors");
  sub->add_option("--log-steps", args->log_steps,
                  "also time N logged trainer steps (log_every 1, metrics to a temporary HDF5 file) against an "
                  "unlogged one, phase by phase")
      ->check(integer_in(1));
  sub->add_option("--csv", args->csv,
                  "also write one CSV record per measured quantity (value, unit, device, revision, command, "
                  "configuration) to FILE");
  sub->add_option("--bench-file", args->bench_file,
                  "the bench cache to add this bench's records to (default: $XDG_CACHE_HOME/mxlab/bench/<device>.json, "
                  "$HOME/.cache/... without XDG_CACHE_HOME); mxlab plan predicts device time from it");
  sub->add_option("--curvature-iters", args->curvature_iters,
                  "Lanczos steps per eigenvalue of the curvature figure (log.curvature_iters)")
      ->capture_default_str()
      ->check(integer_in(2));
  auto ops = std::make_shared<std::vector<std::string>>();
  CLI::Option* ops_opt =
      sub->add_option("--ops", *ops,
                      "time backend ops from the op table instead, one row per op (name, size, ms per call) at "
                      "their sizes in the paper configuration; all ops without names")
          ->expected(0, -1);
  sub->callback([args, ops, ops_opt] {
    if (ops_opt->count() > 0) run_op_bench(*args, *ops);
    else run_bench(*args);
  });
});

}  // namespace
}  // namespace mxlab::cli
