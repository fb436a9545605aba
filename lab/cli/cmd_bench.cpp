// `mxlab bench [EXP.yaml] --device cuda [--steps N] [--warmup W]`: milliseconds per step of
// the pieces of a paired training step on one device (DESIGN.md section 10), each the median
// of N timed steps after W warm-up steps, with CUDA graphs (each piece is captured once and
// replayed, as the trainer does) and CUDA events on CUDA, a host clock on the CPU:
//   fp32     the FP32 trajectory step: forward + loss + backward + Adam, FP32 policy
//   mx       the MX trajectory step under the YAML's precision policy
//   shadow   the FP32 forward + backward at the MX weights (the bias metric's reference)
//   data     data generation + teacher forward + label noise
//   paired   all of the above as one step, spread over lanes (streams)
// and, on CUDA, in the same process, the floors these are measured against: the step's GEMMs
// alone in cuBLAS (6 per layer: 2 forward, 2 dgrad, 2 wgrad; SGEMM with TF32 off for FP32,
// bf16 operands already quantized for MX; the teacher's 2 per block), each figure also as a
// ratio to its floor. The last line is one JSON object for scripts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lab/backends/backends.h"
#include "lab/cli/commands.h"
#include "lab/core/error.h"
#include "lab/model/mlp.h"
#include "lab/train/config_io.h"
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

// Capture keys of the benchmarked regions (any distinct ints).
enum Key : int { kKeyFp32 = 101, kKeyMx, kKeyShadow, kKeyData, kKeyPaired };

struct Args {
  std::string path;
  std::vector<std::string> sets;
  std::string device = "cuda";
  int steps = 0, warmup = -1;
  int depth = 0, width = 0, batch = 0;
  bool no_graphs = false;
  std::string only;  // run one figure (e.g. under a profiler), no floors
};

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
    S = NetShape::student(cfg.model);
    T = NetShape::teacher(cfg.model, cfg.teacher);
    B = cfg.data.batch;
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
    loss_and_grad(be, cfg, target, ws, pol, nullptr);
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

// One GEMM in the Backend's convention (C[M x N] = A B^T; *_kc: stored with K contiguous).
struct Shape {
  int64_t M, N, K;
  bool a_kc, b_kc;
};

// The GEMMs of one pass of `s` at batch B (lab/model/README.md): forward only, or forward and
// backward (the dgrad of layer 0 included: the model computes it).
std::vector<Shape> pass_gemms(const NetShape& s, int64_t B, bool backward) {
  const int64_t d = s.d, H = s.hidden, H1 = s.hidden_in;
  std::vector<Shape> v;
  for (int k = 0; k < s.depth; ++k) {
    v.push_back({B, H1, d, true, true});  // h = y W1^T
    v.push_back({B, d, H, true, true});   // o = a W2^T
  }
  if (backward)
    for (int k = s.depth - 1; k >= 0; --k) {
      v.push_back({d, H, B, false, false});   // dW2 = dA^T a
      v.push_back({B, H, d, true, false});    // da = dA W2
      v.push_back({H1, d, B, false, false});  // dW1 = dh^T y
      v.push_back({B, d, H1, true, false});   // dy = dh W1
    }
  return v;
}

double gflop(const std::vector<Shape>& v) {
  double f = 0.0;
  for (const Shape& g : v) f += 2.0 * static_cast<double>(g.M) * static_cast<double>(g.N) * static_cast<double>(g.K);
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
  RunConfig cfg = a.path.empty() ? config_from_yaml_string("", "defaults", a.sets) : load_config(a.path, a.sets);
  if (a.depth > 0) cfg.model.depth = a.depth;
  if (a.width > 0) cfg.model.width = a.width;
  if (a.batch > 0) cfg.data.batch = a.batch;
  validate_config(cfg);
  std::unique_ptr<Backend> be = make_backend(a.device);
  const bool is_cuda = be->name().rfind("cuda", 0) == 0;
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
  static const char* const kOnlyNames[] = {"fp32", "mx", "shadow", "data", "paired"};
  int only = -1;
  if (!a.only.empty()) {
    for (int i = 0; i < 5; ++i)
      if (a.only == kOnlyNames[i]) only = i;
    if (only < 0) throw Error(msg("--only ", a.only, ": use one of fp32, mx, shadow, data, paired"));
  }
  bench.data();  // targets for the single-trajectory figures
  for (int i = 0; i < 5; ++i)
    if (only < 0 || only == i) figs[i].ms = time_region(bodies[i].first, bodies[i].second);
  const float loss32 = be->read_scalar(bench.ws32.loss), lossmx = be->read_scalar(bench.wsmx.loss);
  if (!std::isfinite(loss32) || !std::isfinite(lossmx))
    throw Error(msg("bench: non-finite loss after the timed steps (fp32 ", loss32, ", mx ", lossmx,
                    "): the timings would be of a broken step"));

  double floor_sgemm = 0.0, floor_bf16 = 0.0, floor_teacher = 0.0;
#ifdef MXLAB_HAVE_CUDA
  if (is_cuda && only < 0) {
    int dev = 0;
    if (a.device.size() > 5) dev = std::stoi(a.device.substr(5));
    auto to_cuda = [](const std::vector<Shape>& v) {
      std::vector<cuda::GemmShape> out;
      for (const Shape& g : v) out.push_back({g.M, g.N, g.K, g.a_kc, g.b_kc});
      return out;
    };
    floor_sgemm = cuda::gemm_floor_ms(to_cuda(student), cuda::FloorKind::sgemm, dev, 3, kFloorReps);
    floor_bf16 = cuda::gemm_floor_ms(to_cuda(student), cuda::FloorKind::bf16, dev, 3, kFloorReps);
    floor_teacher = cuda::gemm_floor_ms(to_cuda(teacher), cuda::FloorKind::sgemm, dev, 3, kFloorReps);
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
  std::printf("  final losses: fp32 %.6g, mx %.6g\n", loss32, lossmx);

  std::string json = msg("{\"bench\":\"mxlab\",\"device\":\"", be->name(), "\",\"math_mode\":\"", be->math_mode(),
                         "\",\"config\":\"", a.path, "\",\"depth\":", bench.S.depth, ",\"width\":", bench.S.d,
                         ",\"batch\":", bench.B, ",\"steps\":", steps, ",\"warmup\":", warmup,
                         ",\"graphs\":", graphs ? "true" : "false");
  for (const Figure& f : figs) {
    if (f.ms <= 0) continue;
    json += msg(",\"", f.key, "\":", f.ms);
    if (f.floor_ms > 0) json += msg(",\"", f.key, "_floor\":", f.floor_ms, ",\"", f.key, "_ratio\":", f.ms / f.floor_ms);
  }
  json += msg(",\"step_gflop\":", gflop(student), "}");
  std::printf("%s\n", json.c_str());
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("bench", "Time the pieces of a paired training step on a device (ms/step)");
  sub->add_option("config", args->path, "experiment YAML file (omit for the built-in defaults)");
  sub->add_option("--set", args->sets, "override a key, e.g. --set model.width=256 (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--device", args->device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--steps", args->steps, "timed steps per figure (default 200 on CUDA, 3 on the CPU)");
  sub->add_option("--warmup", args->warmup, "warm-up steps per figure (default 10 on CUDA, 1 on the CPU)");
  sub->add_option("--depth", args->depth, "override model.depth");
  sub->add_option("--width", args->width, "override model.width");
  sub->add_option("--batch", args->batch, "override data.batch");
  sub->add_flag("--no-graphs", args->no_graphs, "launch every op eagerly instead of replaying CUDA graphs");
  sub->add_option("--only", args->only, "time one figure only (fp32, mx, shadow, data, paired), no cuBLAS floors");
  sub->callback([args] { run_bench(*args); });
});

}  // namespace
}  // namespace mxlab::cli
