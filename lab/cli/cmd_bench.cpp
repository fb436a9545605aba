// `mxlab bench [EXP.yaml] --device cuda [--steps N] [--warmup W]`: milliseconds per step of
// the pieces of a paired training step on one device (DESIGN.md section 10), each the median
// of N timed steps after W warm-up steps, with CUDA graphs (each piece is captured once and
// replayed, as the trainer does) and CUDA events on CUDA, a host clock on the CPU:
//   fp32     the FP32 trajectory step: forward + loss + backward + Adam, FP32 policy
//   mx       the MX trajectory step under the YAML's precision policy
//   shadow   the FP32 forward + backward at the MX weights (the bias metric's reference)
//   data     data generation + teacher forward + label noise
//   paired   all of the above as one step, spread over lanes (streams)
// and with --arms K (issue 13), the trainer itself (lab/train/trainer.h, logging only at the
// first and last step) with 1 arm and with K arms (K copies of the policy, or the experiment's
// `arms:`), per step, against the serial sum of its parts: FP32 step + K x (MX step +
// shadow / bias_every) + data, and the cost per recipe-step against K separate runs.
// and, on CUDA, in the same process, the floors these are measured against: the step's GEMMs
// alone in cuBLAS (6 per layer: 2 forward, 2 dgrad, 2 wgrad; SGEMM with TF32 off for FP32,
// bf16 operands already quantized for MX; the teacher's 2 per block; an attention block adds
// its 12: 4 projections and 8 strided-batched per-head GEMMs), each figure also as a
// ratio to its floor. Then the cost of one curvature measurement (lab/model/curvature.h: the
// primal pass plus --curvature-iters Lanczos steps of exact Hessian-vector products per
// eigenvalue, probe batch = data.batch) at the FP32 trajectory's weights, for lambda_max(H)
// alone and for both lambda_max(H) and lambda_max(P^-1 H), in ms (host clock around a
// synchronised measurement, median of a few after one warm-up that records the product's
// graph) and in forward-backward equivalents: the FP32 forward + loss + backward of the same
// run (timed like the step figures). With --log-steps N, the trainer's logged step (log_every 1:
// eager, statistics counted, every metric computed and written to an HDF5 run file in a
// temporary directory, as a run writes it) against its unlogged step, and where a logged step's
// time goes, phase by phase (Trainer::set_phase_clock: each phase synchronised, so their sum is
// a little more than the logged step). The last line is one JSON object for scripts.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
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
#include "lab/model/hvp.h"
#include "lab/model/mlp.h"
#include "lab/config/config_io.h"
#include "lab/runs/memory_estimate.h"
#include "lab/runs/run_file.h"
#include "lab/config/sweep.h"
#include "lab/train/trainer.h"
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

// Capture keys of the benchmarked regions (distinct ints below the trainer's, StepCaptureKeys::kFirstKey).
enum Key : int { kKeyFp32 = 101, kKeyMx, kKeyShadow, kKeyData, kKeyPaired, kKeyFwdBwd };

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
};

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

// The trainer's own step (compute, update, the shadow pass every bias_every steps and its
// metrics; CUDA graphs as the trainer uses them), ms per step: `warmup` steps, then the wall
// time of `steps` more over their count. Logging happens only at step 0 and the last step.
double trainer_ms_per_step(Backend& be, RunConfig cfg, int warmup, int steps) {
  cfg = bare_trainer_config(cfg);
  cfg.steps = warmup + steps + 2;
  cfg.log.log_every = cfg.steps;
  MemorySink sink;
  Trainer tr(cfg, be, sink);
  tr.open_output();
  tr.run(RunControl{}, 1 + warmup);  // step 0 logs; then warm-up (graph recording)
  const auto t0 = std::chrono::steady_clock::now();
  tr.run(RunControl{}, 1 + warmup + steps);
  const auto t1 = std::chrono::steady_clock::now();  // run() synchronises before it returns
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / steps;
}

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
LogProfile trainer_log_profile(Backend& be, RunConfig cfg, int warmup, int steps) {
  cfg = bare_trainer_config(cfg);
  cfg.steps = warmup + 2 * steps + 1;
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

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// The state of a paired run at one configuration, in backend memory.
struct Bench {
  Backend& be;
  RunConfig cfg;
  NetShape S, T;
  int64_t B = 0;
  size_t P = 0;
  float *p32, *g32, *m32, *v32, *pmx, *gmx, *mmx, *vmx, *gsh, *tp, *x, *target;
  Workspace ws32, wsmx, wssh, wst;
  PassPolicy pol32, polmx;
  Backend::AdamHyper hyper;

  Bench(Backend& b, const RunConfig& c) : be(b), cfg(c) {
    S = NetShape::student(cfg.model, cfg.data.seq_len);
    T = NetShape::teacher(cfg.model, cfg.teacher, cfg.data.seq_len);
    B = cfg.tokens();
    P = static_cast<size_t>(S.num_params);
    const std::vector<float> init = init_params(S, cfg.model.init, cfg.model.init_gain, cfg.seed, Stream::init);
    const std::vector<float> tinit = init_params(T, InitKind::pytorch, 1.0f, cfg.seed, Stream::teacher_init);
    for (float** p : {&p32, &g32, &m32, &v32, &pmx, &gmx, &mmx, &vmx, &gsh}) *p = be.alloc(P);
    tp = be.alloc(static_cast<size_t>(T.num_params));
    x = be.alloc(static_cast<size_t>(B * S.d));
    target = be.alloc(static_cast<size_t>(B * S.d));
    be.upload(p32, init.data(), P);
    be.upload(pmx, init.data(), P);
    be.upload(tp, tinit.data(), tinit.size());
    for (float* p : {m32, v32, mmx, vmx}) be.fill(p, 0.0f, P);
    ws32 = Workspace::make(be, S, B);
    wsmx = Workspace::make(be, S, B);
    wssh = Workspace::make(be, S, B);
    wst = Workspace::make(be, T, B);
    for (Workspace* w : {&ws32, &wsmx, &wssh}) be.fill(w->loss, 0.0f, 1);  // read at the end, also when not run
    pol32.p = PrecisionConfig::fp32();
    pol32.seed = cfg.seed;
    polmx.p = cfg.precision;
    polmx.seed = cfg.seed;
    hyper.beta1 = cfg.optimizer.beta1;
    hyper.beta2 = cfg.optimizer.beta2;
    hyper.eps = cfg.optimizer.eps;
    hyper.weight_decay = cfg.optimizer.weight_decay;
    hyper.decoupled = cfg.optimizer.name == OptKind::adamw;
  }

  StepScalars scalars(uint32_t step) const {
    const float t = static_cast<float>(step + 1);
    return StepScalars{step, cfg.optimizer.lr, 1.0f - std::pow(cfg.optimizer.beta1, t),
                       1.0f - std::pow(cfg.optimizer.beta2, t)};
  }

  void data() {
    const size_t n = static_cast<size_t>(B * S.d);
    be.randn(x, n, cfg.seed, Stream::data, 1.0f);
    forward(be, T, tp, x, wst, pol32);
    be.copy(target, wst.out, n);
    be.add_randn(target, n, cfg.seed, Stream::label_noise, cfg.data.label_noise);
  }
  void fwd_bwd(const float* params, Workspace& ws, float* grads, const PassPolicy& pol) {
    forward(be, S, params, x, ws, pol);
    loss_and_grad(be, cfg.loss_spec(), target, ws, pol, nullptr);
    backward(be, S, params, x, ws, grads, pol);
  }
  void step32() {
    fwd_bwd(p32, ws32, g32, pol32);
    be.adam(p32, g32, m32, v32, P, hyper);
  }
  void stepmx() {
    fwd_bwd(pmx, wsmx, gmx, polmx);
    be.adam(pmx, gmx, mmx, vmx, P, hyper);
  }
  void shadow() { fwd_bwd(pmx, wssh, gsh, pol32); }
  // The whole paired step: targets first; then the FP32 step, the MX forward/backward and
  // the shadow pass (which must read the MX weights before their update) concurrently.
  void paired() {
    data();
    be.set_lane(1);
    step32();
    be.set_lane(2);
    fwd_bwd(pmx, wsmx, gmx, polmx);
    be.set_lane(3);
    shadow();
    be.join();
    be.adam(pmx, gmx, mmx, vmx, P, hyper);
  }
};

// One GEMM in the Backend's convention (C[M x N] = A B^T; *_kc: stored with K contiguous),
// `batch` of them in one strided-batched call.
struct Shape {
  int64_t M, N, K;
  bool a_kc, b_kc;
  int64_t batch = 1;
};

// The GEMMs of one pass of `s` at B tokens (lab/model/README.md): forward only, or forward and
// backward (the dgrad of layer 0 included: the model computes it).
std::vector<Shape> pass_gemms(const NetShape& s, int64_t B, bool backward) {
  const int64_t d = s.d, H = s.hidden, H1 = s.hidden_in;
  const int64_t S = s.seq_len, dh = s.head_dim(), bh = B / S * s.heads;
  std::vector<Shape> v;
  for (int k = 0; k < s.depth; ++k) {
    if (s.attention()) {
      v.push_back({B, 3 * d, d, true, true});      // qkv = y1 Wqkv^T
      v.push_back({S, S, dh, true, true, bh});     // logits = Q K^T per (sequence, head)
      v.push_back({S, dh, S, true, false, bh});    // O = P V
      v.push_back({B, d, d, true, true});          // o = ctx Wo^T
    }
    v.push_back({B, H1, d, true, true});  // h = y W1^T
    v.push_back({B, d, H, true, true});   // o = a W2^T
  }
  if (backward)
    for (int k = s.depth - 1; k >= 0; --k) {
      v.push_back({d, H, B, false, false});   // dW2 = dA^T a
      v.push_back({B, H, d, true, false});    // da = dA W2
      v.push_back({H1, d, B, false, false});  // dW1 = dh^T y
      v.push_back({B, d, H1, true, false});   // dy = dh W1
      if (s.attention()) {
        v.push_back({d, d, B, false, false});        // dWo = dZ^T ctx
        v.push_back({B, d, d, true, false});         // dctx = dZ Wo
        v.push_back({S, S, dh, true, true, bh});     // dP = dO V^T
        v.push_back({S, dh, S, false, false, bh});   // dV = P^T dO
        v.push_back({S, dh, S, true, false, bh});    // dQ = dS K
        v.push_back({S, dh, S, false, false, bh});   // dK = dS^T Q
        v.push_back({3 * d, d, B, false, false});    // dWqkv = dQKV^T y1
        v.push_back({B, d, 3 * d, true, false});     // dy1 = dQKV Wqkv
      }
    }
  return v;
}

double gflop(const std::vector<Shape>& v) {
  double f = 0.0;
  for (const Shape& g : v)
    f += 2.0 * static_cast<double>(g.batch) * static_cast<double>(g.M) * static_cast<double>(g.N) *
         static_cast<double>(g.K);
  return f * 1e-9;
}

struct Figure {
  const char* key;    // JSON key
  const char* label;  // printed
  double ms = 0.0;
  double floor_ms = 0.0;  // 0: no floor
  double gflop = 0.0;
};

void run_bench(const Args& a) {
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
  std::unique_ptr<Backend> be = make_backend(a.device);
  const bool is_cuda = be->name().rfind("cuda", 0) == 0;
  check_run_fits_memory(cfg, !is_cuda, a.path.empty() ? "the benchmarked configuration" : a.path,
                        static_cast<size_t>(std::max(a.arms, 0)));  // --arms K: the trainer with K arms
  const int steps = a.steps > 0 ? a.steps : (is_cuda ? kCudaSteps : kCpuSteps);
  const int warmup = a.warmup >= 0 ? a.warmup : (is_cuda ? kCudaWarmup : kCpuWarmup);
  const bool graphs = is_cuda && !a.no_graphs;
  if (graphs && warmup < 3)
    throw Error(msg("--warmup ", warmup, " is too short with CUDA graphs (the first pass of a step runs eagerly, "
                    "the second records): use --warmup 3 or more, or --no-graphs"));

  Bench bench(*be, cfg);
  std::printf("mxlab bench: %s\n", be->name().c_str());
  std::printf("  math mode: %s\n", be->math_mode().c_str());
  std::printf("  TF32: off (FP32 GEMMs are IEEE: %s)\n", is_cuda ? "cuBLAS pedantic SGEMM" : "Eigen FP32");
  std::printf("  config: %s  L=%d d=%d H=%d B=%lld act=%s, MX policy weight=%s activation=%s grad=%s "
              "elementwise=%s\n",
              a.path.empty() ? "(defaults)" : a.path.c_str(), bench.S.depth, bench.S.d, bench.S.hidden,
              static_cast<long long>(bench.B), act_name(cfg.model.activation), name(cfg.precision.weight),
              name(cfg.precision.activation), name(cfg.precision.grad), cfg.precision.elementwise_bf16 ? "bf16" : "fp32");
  if (bench.S.attention())
    std::printf("  attention blocks: %d sequences x %d tokens (B above = tokens), %d heads of %d; attn_logits=%s "
                "attn_probs=%s\n",
                cfg.data.batch, cfg.data.seq_len, bench.S.heads, bench.S.head_dim(),
                name(cfg.precision.attn_logits_fmt()), name(cfg.precision.attn_probs_fmt()));
#ifdef MXLAB_HAVE_CUDA
  if (is_cuda) {
    cuda::set_producer_quant(*be, !a.no_producer_quant);
    std::printf("  producer-side quantization: %s\n",
                a.no_producer_quant ? "off (--no-producer-quant: every GEMM quantizes its operands itself)"
                                    : "on (layernorm / activation / add kernels write the next GEMM's MX operand; "
                                      "each pass's weights are quantized together, ahead)");
  }
#endif
  std::printf("  %d warm-up + %d timed steps per figure, median; %s\n", warmup, steps,
              graphs ? "CUDA graphs on, CUDA events" : (is_cuda ? "CUDA graphs off, CUDA events" : "host clock"));

  // Time `body` as a step with capture key `key`, the way the trainer runs a step.
  auto time_region = [&](int key, const std::function<void()>& body) {
    std::vector<double> ms;
#ifdef MXLAB_HAVE_CUDA
    std::unique_ptr<cuda::LaneTimer> timer;
    if (is_cuda) timer = std::make_unique<cuda::LaneTimer>(*be, warmup + steps);
#endif
    for (int i = 0; i < warmup + steps; ++i) {
      be->set_step(bench.scalars(static_cast<uint32_t>(i)));
      const auto t0 = std::chrono::steady_clock::now();
#ifdef MXLAB_HAVE_CUDA
      if (timer) timer->start(i);
#endif
      if (!graphs) {
        body();
        be->join();
      } else if (!be->replay(key)) {
        const bool rec = be->begin_capture(key);
        body();
        be->end_capture(key);
        if (rec) be->replay(key);
      }
#ifdef MXLAB_HAVE_CUDA
      if (timer) timer->stop(i);
#endif
      if (!is_cuda) {
        be->synchronize();
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
    }
#ifdef MXLAB_HAVE_CUDA
    if (timer) {
      const std::vector<double> all = timer->elapsed_ms();
      ms.assign(all.begin() + warmup, all.end());
    }
#endif
    be->synchronize();
    return median(ms);
  };

  const std::vector<Shape> student = pass_gemms(bench.S, bench.B, true);
  const std::vector<Shape> teacher = pass_gemms(bench.T, bench.B, false);
  std::vector<Figure> figs = {
      {"fp32_step_ms", "FP32 trajectory step", 0, 0, gflop(student)},
      {"mx_step_ms", "MX trajectory step", 0, 0, gflop(student)},
      {"shadow_ms", "shadow pass (FP32 at MX weights)", 0, 0, gflop(student)},
      {"data_ms", "data + teacher forward", 0, 0, gflop(teacher)},
      {"paired_ms", "paired step (all, on lanes)", 0, 0, 3 * gflop(student) + gflop(teacher)},
  };
  const std::vector<std::pair<int, std::function<void()>>> bodies = {
      {kKeyFp32, [&] { bench.step32(); }},
      {kKeyMx, [&] { bench.stepmx(); }},
      {kKeyShadow, [&] { bench.shadow(); }},
      {kKeyData, [&] { bench.data(); }},
      {kKeyPaired, [&] { bench.paired(); }},
  };
  static const char* const kOnlyNames[] = {"fp32", "mx", "shadow", "data", "paired", "curvature"};
  constexpr int kOnlyCurvature = 5;
  int only = -1;
  if (!a.only.empty()) {
    for (int i = 0; i <= kOnlyCurvature; ++i)
      if (a.only == kOnlyNames[i]) only = i;
    if (only < 0) throw Error(msg("--only ", a.only, ": use one of fp32, mx, shadow, data, paired, curvature"));
  }
  bench.data();  // targets for the single-trajectory figures
  for (int i = 0; i < 5; ++i)
    if (only < 0 || only == i) figs[i].ms = time_region(bodies[i].first, bodies[i].second);
  const float loss32 = be->read_scalar(bench.ws32.loss), lossmx = be->read_scalar(bench.wsmx.loss);
  if (!std::isfinite(loss32) || !std::isfinite(lossmx))
    throw Error(msg("bench: non-finite loss after the timed steps (fp32 ", loss32, ", mx ", lossmx,
                    "): the timings would be of a broken step"));

  double floor_sgemm = 0.0, floor_bf16 = 0.0, floor_teacher = 0.0;
  double floor_sgemm_default = 0.0, sgemm_default_diff = 0.0;  // a candidate for the FP32 GEMMs, not used
#ifdef MXLAB_HAVE_CUDA
  if (is_cuda && only < 0) {
    int dev = 0;
    if (a.device.size() > 5) dev = std::stoi(a.device.substr(5));
    auto to_cuda = [](const std::vector<Shape>& v) {
      std::vector<cuda::GemmShape> out;
      for (const Shape& g : v) out.push_back({g.M, g.N, g.K, g.a_kc, g.b_kc, g.batch});
      return out;
    };
    floor_sgemm = cuda::gemm_floor_ms(to_cuda(student), cuda::FloorKind::sgemm, dev, 3, kFloorReps);
    floor_bf16 = cuda::gemm_floor_ms(to_cuda(student), cuda::FloorKind::bf16, dev, 3, kFloorReps);
    floor_teacher = cuda::gemm_floor_ms(to_cuda(teacher), cuda::FloorKind::sgemm, dev, 3, kFloorReps);
    floor_sgemm_default = cuda::gemm_floor_ms(to_cuda(student), cuda::FloorKind::sgemm_default, dev, 3, kFloorReps);
    sgemm_default_diff = cuda::sgemm_default_rel_diff(to_cuda(student).front(), dev);
    const bool mx_gemms = is_mx(cfg.precision.weight) || is_mx(cfg.precision.activation) ||
                          cfg.precision.weight == NumFmt::bf16 || cfg.precision.elementwise_bf16;
    figs[0].floor_ms = floor_sgemm;
    figs[1].floor_ms = mx_gemms ? floor_bf16 : floor_sgemm;
    figs[2].floor_ms = floor_sgemm;
    figs[3].floor_ms = floor_teacher;
    figs[4].floor_ms = 2 * floor_sgemm + figs[1].floor_ms + floor_teacher;  // serial sum of the parts' floors
  }
#endif

  std::printf("\n  %-36s %10s %10s %8s %10s\n", "figure", "ms/step", "floor ms", "ratio", "TFLOP/s");
  for (const Figure& f : figs) {
    if (f.ms <= 0) continue;  // not run (--only)
    const double tflops = f.ms > 0 ? f.gflop / f.ms : 0.0;  // GFLOP / ms = TFLOP/s
    if (f.floor_ms > 0)
      std::printf("  %-36s %10.3f %10.3f %8.3f %10.2f\n", f.label, f.ms, f.floor_ms, f.ms / f.floor_ms, tflops);
    else
      std::printf("  %-36s %10.3f %10s %8s %10.2f\n", f.label, f.ms, "-", "-", tflops);
  }
  if (is_cuda)
    std::printf("  floors: cuBLAS alone on the same GEMM shapes (%zu per step): SGEMM %.3f ms, bf16 %.3f ms, "
                "teacher SGEMM %.3f ms\n",
                student.size(), floor_sgemm, floor_bf16, floor_teacher);
  if (floor_sgemm_default > 0)
    std::printf("  not used, for comparison: FP32 SGEMM as CUBLAS_COMPUTE_32F with the default math mode (TF32 off) "
                "%.3f ms = %.3f x pedantic; max relative difference from pedantic on the %lld x %lld x %lld GEMM "
                "%.2g (IEEE FP32 in another order ~1e-6, TF32 ~1e-3)\n",
                floor_sgemm_default, floor_sgemm_default / floor_sgemm, static_cast<long long>(student.front().M),
                static_cast<long long>(student.front().N), static_cast<long long>(student.front().K),
                sgemm_default_diff);
  std::printf("  final losses: fp32 %.6g, mx %.6g\n", loss32, lossmx);
#ifdef MXLAB_HAVE_CUDA
  if (is_cuda)
    std::printf("  GEMM operands taken from their producers: %lld (counted as steps are issued: eager runs and graph "
                "recordings, not replays)\n",
                static_cast<long long>(cuda::producer_quant_hits(*be)));
#endif

  // --arms K: the trainer with 1 arm and with K arms.
  double t1 = 0.0, tk = 0.0, serial = 0.0, saving = 0.0;
  int K = 0;
  if (a.arms > 0 || (!cfg.arms.empty() && only < 0)) {
    RunConfig one = cfg, many = cfg;
    one.arms.clear();
    if (a.arms > 0) {
      many.arms.clear();
      for (int k = 0; k < a.arms; ++k) many.arms.push_back({msg("arm", k), "", {}});
    }
    K = static_cast<int>(many.arms.size());
    const int bias_every = cfg.log.bias_every > 0 ? cfg.log.bias_every : cfg.log.log_every;
    t1 = trainer_ms_per_step(*be, one, warmup, steps);
    tk = trainer_ms_per_step(*be, many, warmup, steps);
    serial = figs[0].ms + K * (figs[1].ms + figs[2].ms / bias_every) + figs[3].ms;
    saving = t1 / (tk / K);
    std::printf("\n  trainer step (shadow every %d steps%s):\n", bias_every, is_cuda ? ", CUDA graphs as the trainer uses them" : "");
    std::printf("  %-36s %10.3f\n", "1 arm (a run of one recipe)", t1);
    std::printf("  %-36s %10.3f   serial sum of parts %.3f (FP32 + %d x (MX + shadow/%d) + data): ratio %.3f\n",
                msg(K, " arms").c_str(), tk, serial, K, bias_every, tk / serial);
    std::printf("  per recipe-step: %d arms %.3f ms vs separate runs %.3f ms: %.2fx cheaper\n", K, tk / K, t1, saving);
  }

  // --log-steps N: a logged trainer step against an unlogged one, and its phases.
  LogProfile lp;
  double unlogged_ms = 0.0;
  if (a.log_steps > 0) {
    unlogged_ms = trainer_ms_per_step(*be, cfg, warmup, steps);
    lp = trainer_log_profile(*be, cfg, std::min(warmup, 3), a.log_steps);
    std::printf("\n  logged trainer step (log_every 1: eager, statistics counted, every metric written to an HDF5 "
                "run file), %d steps, %d with the shadow pass:\n", a.log_steps, lp.shadow_steps);
    std::printf("  %-36s %10.3f   unlogged step %.3f ms (shadow every %d steps%s): +%.3f ms per logged step\n",
                "logged step", lp.logged_ms, unlogged_ms, lp.bias_every, is_cuda ? ", CUDA graphs" : "",
                lp.logged_ms - unlogged_ms);
    double sum = 0.0;
    for (const auto& ph : lp.phases) sum += ph.second;
    std::printf("  where it goes (each phase synchronised: %.3f ms per logged step in all):\n", lp.clocked_ms);
    for (const auto& [name, ms] : lp.phases)
      std::printf("    %-38s %8.3f  %5.1f %%\n", name.c_str(), ms, sum > 0 ? 100.0 * ms / sum : 0.0);
  }

  // ---- curvature: one measurement at the FP32 weights on the batch, vs one forward-backward ----
  const bool curv_supported = curvature_supported(cfg.model);
  if (only == kOnlyCurvature && !curv_supported)
    throw Error("--only curvature: the curvature instrument covers the MLP block with layernorm only");
  const bool curv = (only < 0 || only == kOnlyCurvature) && curv_supported;
  if (only < 0 && !curv_supported)
    std::printf("\n  curvature: not measured (its Hessian-vector products cover the MLP block with layernorm only)\n");
  double fb_ms = 0.0, curv_ms = 0.0, curv_h_ms = 0.0;
  CurvatureResult cres;
  if (curv) {
    if (a.curvature_iters < 2) throw Error(msg("--curvature-iters must be at least 2 (got ", a.curvature_iters, ")"));
    fb_ms = time_region(kKeyFwdBwd, [&] { bench.fwd_bwd(bench.p32, bench.ws32, bench.g32, bench.pol32); });
    Curvature curvature(*be, bench.S, cfg.loss_spec(), cfg.seed, bench.B);
    const StepScalars sc = bench.scalars(static_cast<uint32_t>(steps + warmup));
    be->set_step(sc);
    auto time_measure = [&](const float* v) {
      std::vector<double> ms;
      const int reps = is_cuda ? kCurvatureReps : 1;
      for (int i = 0; i <= reps; ++i) {  // i == 0: warm-up (records the product's graph)
        be->synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        cres = curvature.measure(bench.p32, bench.x, bench.target, v, sc.bc2, cfg.optimizer.eps, a.curvature_iters,
                                 cfg.seed);
        be->synchronize();
        const auto t1 = std::chrono::steady_clock::now();
        if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      return median(ms);
    };
    curv_h_ms = time_measure(nullptr);
    curv_ms = time_measure(bench.v32);
    const int gemms = hvp_gemms(bench.S), fb_gemms = 6 * bench.S.depth;
    std::printf("\n  curvature (probe batch %lld rows, %d Lanczos steps per eigenvalue, FP32 SGEMM):\n",
                static_cast<long long>(bench.B), a.curvature_iters);
    std::printf("    FP32 forward+backward (no optimizer)  %10.3f ms\n", fb_ms);
    std::printf("    lambda_max(H) alone                  %10.3f ms = %7.2f fwd-bwd = %5.2f x iters\n", curv_h_ms,
                curv_h_ms / fb_ms, curv_h_ms / fb_ms / a.curvature_iters);
    std::printf("    lambda_max(H) and lambda_max(P^-1 H) %10.3f ms = %7.2f fwd-bwd = %5.2f x iters\n", curv_ms,
                curv_ms / fb_ms, curv_ms / fb_ms / a.curvature_iters);
    std::printf("    per Hessian-vector product: %d GEMMs (a forward+backward: %d); one primal pass per measurement\n",
                gemms, fb_gemms);
    std::printf("    at the FP32 weights: lambda_max(H) %.6g (resid %.2g), lambda_max(P^-1 H) %.6g (resid %.2g), "
                "probe loss %.6g\n",
                cres.hessian_lmax, cres.hessian_resid, cres.precond_lmax, cres.precond_resid, cres.loss);
  }

  std::string json = msg("{\"bench\":\"mxlab\",\"device\":\"", be->name(), "\",\"math_mode\":\"", be->math_mode(),
                         "\",\"config\":\"", a.path, "\",\"depth\":", bench.S.depth, ",\"width\":", bench.S.d,
                         ",\"batch\":", bench.B, ",\"block\":\"", bench.S.attention() ? "attention" : "mlp",
                         "\",\"seq_len\":", cfg.data.seq_len, ",\"steps\":", steps, ",\"warmup\":", warmup,
                         ",\"graphs\":", graphs ? "true" : "false");
  for (const Figure& f : figs) {
    if (f.ms <= 0) continue;
    json += msg(",\"", f.key, "\":", f.ms);
    if (f.floor_ms > 0) json += msg(",\"", f.key, "_floor\":", f.floor_ms, ",\"", f.key, "_ratio\":", f.ms / f.floor_ms);
  }
  if (floor_sgemm_default > 0)
    json += msg(",\"sgemm_default_floor_ms\":", floor_sgemm_default, ",\"sgemm_default_rel_diff\":", sgemm_default_diff);
  if (K > 0)
    json += msg(",\"arms\":", K, ",\"trainer_1arm_ms\":", t1, ",\"trainer_arms_ms\":", tk, ",\"arms_serial_ms\":", serial,
                ",\"arms_saving\":", saving);
  if (curv)
    json += msg(",\"fwd_bwd_ms\":", fb_ms, ",\"curvature_iters\":", a.curvature_iters, ",\"curvature_hessian_ms\":",
                curv_h_ms, ",\"curvature_ms\":", curv_ms, ",\"curvature_hessian_fb_equiv\":", curv_h_ms / fb_ms,
                ",\"curvature_fb_equiv\":", curv_ms / fb_ms, ",\"hvp_gemms\":", hvp_gemms(bench.S));
  if (a.log_steps > 0) {
    json += msg(",\"log_steps\":", a.log_steps, ",\"logged_step_ms\":", lp.logged_ms, ",\"unlogged_step_ms\":", unlogged_ms,
                ",\"logged_step_clocked_ms\":", lp.clocked_ms);
  }
  json += msg(",\"step_gflop\":", gflop(student), "}");
  std::printf("%s\n", json.c_str());
}

// `mxlab bench --ops [NAME...] --device D`: instead of the step figures above, each op of the op
// table (lab/backends/op_table.h; all of them without names) at its bench size (the paper
// configuration) on a fresh backend, one row per op: name, size, ms per call = host clock around
// `steps` calls (after `warmup`), synchronised after the last.
void run_op_bench(const Args& a, const std::vector<std::string>& names) {
  if (!a.path.empty() || !a.sets.empty() || a.depth || a.width || a.batch || a.arms || !a.only.empty() ||
      a.log_steps || a.run)
    throw Error("--ops times each backend op at its fixed bench size: drop the experiment file and --set, --depth, "
                "--width, --batch, --arms, --only, --log-steps, --run");
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
  CLI::App* sub = app.add_subcommand("bench", "Time the pieces of a paired training step on a device (ms/step)");
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
