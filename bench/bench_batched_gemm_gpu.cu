// Lever (b) and (c) of kernels/PERF.md ("The levers, with predicted gains"): would the K arms'
// GEMMs of a step be cheaper as one strided-batched cuBLAS call per shape than as K separate
// calls, and would the batched results have the bits of the separate ones?
//
// For every GEMM shape of one trajectory step of an experiment (default
// experiments/paper/fig4_baseline.yaml: 24 GEMMs, 6 shapes 4 times each; lab/model/gemm_list.h
// gives them as the model issues them) and every arm count K (default 1, 4, 8, 15), two kinds:
//   bf16   the MX step's GEMMs: bf16-exact operands stored as bf16, FP32 accumulation and output,
//          CUBLAS_COMPUTE_32F (kernels/gemm.cu's bf16 path);
//   sgemm  the shadow pass's (and FP32 trajectory's) GEMMs: FP32 in and out,
//          CUBLAS_COMPUTE_32F_PEDANTIC, no TF32 (lever (c));
// it times
//   single   K calls exactly as the backend makes them, one per arm (bench/batched_gemm.cuh's
//            backend_gemm on a handle configured like GemmRunner's: 32 MiB workspace, atomics
//            off), back to back;
//   batched  one cublasGemmStridedBatchedEx call over the K arms' items (same operand types,
//            compute type and handle);
//   Lt       (unless --no-lt) cuBLASLt with one algorithm, the heuristic's choice for the batched
//            shape, used for the batched call ("Lt K") and for each arm alone ("Lt 1xK");
// and compares outputs bit for bit, on random operands from a fixed seed (every FP32 output
// word of the K items): batched vs single ("bits"), the same calls repeated ("rep"), Lt K vs
// Lt 1 ("Lt bits": does pinning give one arm the K-arm bits?) and Lt 1 vs the backend's single
// call ("=today": would pinning keep today's bits?).
//
// Timing: CUDA events around CUDA-graph replays of at least 16 GEMMs (the trainer replays its
// step as a graph; --eager launches directly), operand sets rotated so that each repetition
// touches more than twice the L2 (no operand served from L2 by the previous repetition), 3
// warm-up replays, the median of --reps (default 30). Totals: a step of K arms runs every shape
// `count` times (4 layers), so step totals are sums of count x time.
//
// Usage: bench_batched_gemm_gpu [EXP.yaml] [--arms 1,4,8,15] [--reps 30] [--eager] [--no-lt]
// Output: the device, one table per kind (a row per shape and K), step totals per K, the pinned
// cuBLASLt algorithms, then one JSON line (the last line, starting with '{"bench"').
// Exit: 0 done; 2 no CUDA device, or a bad argument or experiment; 3 a CUDA/cuBLAS failure.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/batched_gemm.cuh"
#include "bench/event_timing.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/launch_util.cuh"
#include "lab/config/config_io.h"
#include "lab/core/error.h"
#include "lab/core/exit_codes.h"
#include "lab/core/philox.h"
#include "lab/model/gemm_list.h"
#include "lab/model/mlp.h"

namespace {

using namespace mxlab;
using namespace mxlab::bench;
using mxlab::cuda::grid_for;
using mxlab::cuda::kBlock;

constexpr uint64_t kSeed = 0x6a7b8c9dull;
constexpr int kWarmup = 3;
constexpr int kMinGemmsPerRep = 16;
constexpr int kMaxSets = 16;
// max |x - y| / max |y| above which two calls compute different products: another summation order
// moves outputs by ~1e-5 of the largest here (at most ~1e-3 at a reduction of 2048), a wrong operand by O(1).
constexpr double kOrderTolerance = 1e-2;

struct BadInput : Error {
  using Error::Error;
};

struct Options {
  std::string exp = "experiments/paper/fig4_baseline.yaml";
  std::vector<int> arms{1, 4, 8, 15};
  int reps = 30;
  bool graphs = true, lt = true;
};

Options parse(int argc, char** argv) {
  Options o;
  bool have_exp = false;
  auto number = [](const std::string& flag, const char* v, int lo, int hi) {
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < lo || x > hi)
      throw BadInput(msg(flag, " ", v, ": give an integer in [", lo, ", ", hi, "]"));
    return static_cast<int>(x);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--arms" || a == "--reps") {
      if (i + 1 >= argc) throw BadInput(msg(a, " needs a value"));
      const char* v = argv[++i];
      if (a == "--reps") {
        o.reps = number(a, v, 20, 10000);
      } else {
        o.arms.clear();
        std::string s = v;
        size_t p = 0;
        while (p <= s.size()) {
          const size_t q = std::min(s.find(',', p), s.size());
          o.arms.push_back(number("--arms", s.substr(p, q - p).c_str(), 1, 64));
          p = q + 1;
        }
        std::sort(o.arms.begin(), o.arms.end());
        o.arms.erase(std::unique(o.arms.begin(), o.arms.end()), o.arms.end());
      }
    } else if (a == "--eager") {
      o.graphs = false;
    } else if (a == "--no-lt") {
      o.lt = false;
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: bench_batched_gemm_gpu [EXP.yaml] [--arms 1,4,8,15] [--reps N>=20] [--eager] [--no-lt]\n"
          "(kernels/PERF.md, lever (b): \"How to measure\")\n");
      std::exit(0);
    } else if (!a.empty() && a[0] != '-' && !have_exp) {
      o.exp = a;
      have_exp = true;
    } else {
      throw BadInput(msg("unknown argument ", a, ": see --help"));
    }
  }
  return o;
}

// ---- operands and comparisons on the device ----

// Random values u * 2^e, u uniform in [-1, 1) (24 significant bits), e in [-4, 3]: FP32 operands
// as they are; bf16 operands rounded to bf16 (8 significant bits, bf16-exact by construction;
// MX operands have fewer, so their sums would hide an order change more often).
__device__ float random_value(uint32_t salt, int64_t i) {
  const U32x4 w = philox(kSeed, Stream::validation, salt, static_cast<uint64_t>(i));
  return ldexpf(u32_to_uniform(w.v[0]) * 2.0f - 1.0f, static_cast<int>(w.v[1] % 8u) - 4);
}

__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t salt) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(random_value(salt, i));
}

__global__ void fill_f32(float* p, int64_t n, uint32_t salt) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = random_value(salt, i);
}

struct DiffCounters {
  unsigned long long differ;
  unsigned int max_diff, max_ref;  // non-negative floats' bits: ordered like the floats
};

// Counts the elements whose bits differ; max |x - y| and max |y|.
__global__ void compare_kernel(const float* x, const float* y, int64_t n, DiffCounters* out) {
  unsigned long long differ = 0;
  float md = 0.0f, mr = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float a = x[i], b = y[i];
    differ += __float_as_uint(a) != __float_as_uint(b);
    md = fmaxf(md, fabsf(a - b));
    mr = fmaxf(mr, fabsf(b));
  }
  for (int o = 16; o > 0; o >>= 1) {  // the warp's totals, then one atomic per warp
    differ += __shfl_xor_sync(0xFFFFFFFFu, differ, o);
    md = fmaxf(md, __shfl_xor_sync(0xFFFFFFFFu, md, o));
    mr = fmaxf(mr, __shfl_xor_sync(0xFFFFFFFFu, mr, o));
  }
  if ((threadIdx.x & 31) != 0) return;
  if (differ) atomicAdd(&out->differ, differ);
  atomicMax(&out->max_diff, __float_as_uint(md));
  atomicMax(&out->max_ref, __float_as_uint(mr));
}

struct Diff {
  bool run = false;      // false: not compared (n/a)
  long long differ = 0;  // elements whose bits differ
  double max_rel = 0.0;  // max |x - y| / max |y|
  bool equal() const { return run && differ == 0; }
};

class Comparer {
 public:
  explicit Comparer(cudaStream_t s) : s_(s) { MXLAB_CUDA_CHECK(cudaMalloc(&d_, sizeof(DiffCounters))); }
  ~Comparer() { cudaFree(d_); }
  Diff operator()(const float* x, const float* y, int64_t n) {
    MXLAB_CUDA_CHECK(cudaMemsetAsync(d_, 0, sizeof(DiffCounters), s_));
    compare_kernel<<<std::min(grid_for(n), 1024), kBlock, 0, s_>>>(x, y, n, d_);
    MXLAB_CUDA_LAUNCH_CHECK();
    DiffCounters h{};
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(&h, d_, sizeof h, cudaMemcpyDeviceToHost, s_));
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(s_));
    Diff d;
    d.run = true;
    d.differ = static_cast<long long>(h.differ);
    float md, mr;
    std::memcpy(&md, &h.max_diff, 4);
    std::memcpy(&mr, &h.max_ref, 4);
    d.max_rel = mr > 0.0f ? static_cast<double>(md) / mr : 0.0;
    return d;
  }

 private:
  cudaStream_t s_;
  DiffCounters* d_ = nullptr;
};

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t bytes) { MXLAB_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};

// ---- the step's GEMM shapes ----

struct Shape {
  GemmSize g;
  int64_t b = 1;  // items per arm (attention's per-head GEMMs); 1 for the MLP
  int count = 0;  // how often the step runs it
  std::string name;
};

std::vector<Shape> step_shapes(const RunConfig& cfg) {
  const NetShape S = NetShape::student(cfg.model, cfg.data.seq_len, cfg.vocab());
  const std::vector<GemmDims> v = pass_gemms(S, cfg.tokens(), true);
  static const char* const kFwd[2] = {"h=yW1^T", "o=aW2^T"};
  static const char* const kBwd[4] = {"dW2=dA^Ta", "da=dAW2", "dW1=dh^Ty", "dy=dhW1"};
  const size_t nfwd = 2 * static_cast<size_t>(S.depth);
  std::vector<Shape> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const GemmDims& d = v[i];
    const std::string name = S.attention() ? msg("gemm", i) : (i < nfwd ? kFwd[i % 2] : kBwd[(i - nfwd) % 4]);
    auto same = [&](const Shape& s) {
      return s.g.M == d.M && s.g.N == d.N && s.g.K == d.K && s.g.a_kc == d.a_kc && s.g.b_kc == d.b_kc && s.b == d.batch;
    };
    auto it = std::find_if(out.begin(), out.end(), same);
    if (it == out.end()) {
      out.push_back(Shape{GemmSize{d.M, d.N, d.K, d.a_kc, d.b_kc}, d.batch, 1, name});
    } else {
      ++it->count;
      if (it->name.find(name) == std::string::npos) it->name += "/" + name;
    }
  }
  return out;
}

// ---- one shape at one arm count ----

struct Row {
  GemmKind kind = GemmKind::bf16;
  int shape = 0, arms = 0, sets = 0;
  double single_ms = 0, batched_ms = 0;
  Diff bits;           // batched vs single
  bool repeat = true;  // single and batched repeated: same bits
  bool lt_ok = false;
  std::string lt_algo, lt_why;
  double lt_batched_ms = 0, lt_single_ms = 0;
  Diff lt_bits;   // Lt K vs Lt 1, per item
  Diff lt_today;  // Lt 1 vs the backend's single call
};

struct Ctx {
  cudaStream_t s = nullptr;
  cublasHandle_t h = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_ws = nullptr;
  size_t l2 = 0;
  Options opt;
};

// Median ms per unit: `units` calls of unit(u) per repetition, as one CUDA graph (or eagerly).
double time_units(const Ctx& c, int units, const std::function<void(int)>& unit) {
  for (int u = 0; u < units; ++u) unit(u);  // heuristics and lazy loading outside any capture
  MXLAB_CUDA_CHECK(cudaStreamSynchronize(c.s));
  if (!c.opt.graphs)
    return bench::median_event_ms(c.s, kWarmup * units, c.opt.reps, units, [&](int i) { unit(i % units); });
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MXLAB_CUDA_CHECK(cudaStreamBeginCapture(c.s, cudaStreamCaptureModeThreadLocal));
  try {
    for (int u = 0; u < units; ++u) unit(u);
  } catch (const Error& e) {
    cudaStreamEndCapture(c.s, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw Error(msg(e.what(), " (while capturing a CUDA graph: try --eager)"));
  }
  MXLAB_CUDA_CHECK(cudaStreamEndCapture(c.s, &graph));
  MXLAB_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms =
      bench::median_event_ms(c.s, kWarmup, c.opt.reps, 1, [&](int) { MXLAB_CUDA_CHECK(cudaGraphLaunch(exec, c.s)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms / units;
}

Row measure(Ctx& c, Comparer& cmp, GemmKind kind, const Shape& sh, int shape_index, int K) {
  Row r;
  r.kind = kind;
  r.shape = shape_index;
  r.arms = K;
  const GemmSize& g = sh.g;
  const size_t eb = in_bytes(kind);
  const int64_t nb = K * sh.b;                                    // items in the batched call
  const int64_t ea = g.M * g.K, ebb = g.N * g.K, ec = g.M * g.N;  // elements per item
  const size_t set_bytes = static_cast<size_t>(nb) * (static_cast<size_t>(ea + ebb) * eb + static_cast<size_t>(ec) * 4);
  const int sets =
      static_cast<int>(std::clamp<size_t>((2 * c.l2 + set_bytes - 1) / std::max<size_t>(set_bytes, 1), 1, kMaxSets));
  r.sets = sets;
  DevMem A(static_cast<size_t>(sets * nb * ea) * eb), B(static_cast<size_t>(sets * nb * ebb) * eb),
      C(static_cast<size_t>(sets * nb * ec) * 4);
  const size_t cb = static_cast<size_t>(nb * ec) * 4;
  DevMem Cs(cb), Ca(cb), Cl(cb), Cl1(cb);
  const uint32_t salt = static_cast<uint32_t>(shape_index * 2);
  if (kind == GemmKind::bf16) {
    fill_bf16<<<grid_for(sets * nb * ea), kBlock, 0, c.s>>>(static_cast<__nv_bfloat16*>(A.p), sets * nb * ea, salt);
    fill_bf16<<<grid_for(sets * nb * ebb), kBlock, 0, c.s>>>(static_cast<__nv_bfloat16*>(B.p), sets * nb * ebb,
                                                             salt + 1);
  } else {
    fill_f32<<<grid_for(sets * nb * ea), kBlock, 0, c.s>>>(static_cast<float*>(A.p), sets * nb * ea, salt);
    fill_f32<<<grid_for(sets * nb * ebb), kBlock, 0, c.s>>>(static_cast<float*>(B.p), sets * nb * ebb, salt + 1);
  }
  MXLAB_CUDA_LAUNCH_CHECK();
  auto a_of = [&](int set, int64_t item) {
    return static_cast<const char*>(A.p) + static_cast<size_t>((set * nb + item) * ea) * eb;
  };
  auto b_of = [&](int set, int64_t item) {
    return static_cast<const char*>(B.p) + static_cast<size_t>((set * nb + item) * ebb) * eb;
  };
  auto c_of = [&](void* base, int set, int64_t item) { return static_cast<float*>(base) + (set * nb + item) * ec; };
  // One arm's GEMM is sh.b items (one call); arm i's items start at item i * sh.b.
  auto single = [&](int set, void* out, int out_set) {
    for (int i = 0; i < K; ++i)
      backend_gemm(c.h, kind, sh.b, g, a_of(set, i * sh.b), b_of(set, i * sh.b), c_of(out, out_set, i * sh.b));
  };
  auto batched = [&](int set, void* out, int out_set) {
    strided_gemm(c.h, kind, nb, g, a_of(set, 0), b_of(set, 0), c_of(out, out_set, 0));
  };

  // Bits, on operand set 0: single into Cs, batched into C (set 0), then each again into Ca.
  const int64_t nout = nb * ec;
  single(0, Cs.p, 0);
  batched(0, C.p, 0);
  r.bits = cmp(c_of(C.p, 0, 0), c_of(Cs.p, 0, 0), nout);
  single(0, Ca.p, 0);
  r.repeat = cmp(c_of(Ca.p, 0, 0), c_of(Cs.p, 0, 0), nout).equal();
  batched(0, Ca.p, 0);
  r.repeat = r.repeat && cmp(c_of(Ca.p, 0, 0), c_of(C.p, 0, 0), nout).equal();

  const int units = std::max(sets, (kMinGemmsPerRep + K - 1) / K);
  r.single_ms = time_units(c, units, [&](int u) { single(u % sets, C.p, u % sets); });
  r.batched_ms = time_units(c, units, [&](int u) { batched(u % sets, C.p, u % sets); });

  if (c.opt.lt) {
    LtPinned lt(c.lt, kind, g, nb, c.lt_ws, kRunnerWorkspaceBytes);
    r.lt_algo = lt.describe();
    r.lt_ok = lt.ok() && lt.supports(nb) && lt.supports(sh.b);
    if (!r.lt_ok) {
      r.lt_why = lt.why().empty() ? "the pinned algorithm does not run one arm" : lt.why();
    } else {
      auto lt_single = [&](int set, void* out, int out_set) {
        for (int i = 0; i < K; ++i)
          lt.run(sh.b, a_of(set, i * sh.b), b_of(set, i * sh.b), c_of(out, out_set, i * sh.b), c.s);
      };
      auto lt_batched = [&](int set, void* out, int out_set) {
        lt.run(nb, a_of(set, 0), b_of(set, 0), c_of(out, out_set, 0), c.s);
      };
      lt_batched(0, Cl.p, 0);
      lt_single(0, Cl1.p, 0);
      r.lt_bits = cmp(c_of(Cl.p, 0, 0), c_of(Cl1.p, 0, 0), nout);
      r.lt_today = cmp(c_of(Cl1.p, 0, 0), c_of(Cs.p, 0, 0), nout);
      lt_batched(0, Ca.p, 0);
      r.repeat = r.repeat && cmp(c_of(Ca.p, 0, 0), c_of(Cl.p, 0, 0), nout).equal();
      r.lt_batched_ms = time_units(c, units, [&](int u) { lt_batched(u % sets, C.p, u % sets); });
      r.lt_single_ms = time_units(c, units, [&](int u) { lt_single(u % sets, C.p, u % sets); });
    }
  }
  MXLAB_CUDA_CHECK(cudaStreamSynchronize(c.s));
  return r;
}

// ---- output ----

std::string yn(const Diff& d) { return !d.run ? "n/a" : d.differ == 0 ? "yes" : "no"; }

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) o += ch;
  }
  return o + "\"";
}

std::string json_num(double v) { return std::isfinite(v) ? msg(v) : "null"; }

std::string json_diff(const Diff& d) {
  if (!d.run) return "null";
  return msg("{\"equal\":", d.equal() ? "true" : "false", ",\"differ\":", d.differ,
             ",\"max_rel\":", json_num(d.max_rel), "}");
}

struct Total {
  double single = 0, batched = 0, lt_single = 0, lt_batched = 0;
  bool lt_all = true, bits_all = true, lt_bits_all = true, lt_today_all = true, repeat_all = true;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  Ctx c;
  RunConfig cfg;
  std::vector<Shape> shapes;
  cudaDeviceProp prop{};
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row as it is measured, also through a pipe
  try {
    opt = parse(argc, argv);
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      std::fprintf(stderr, "bench_batched_gemm_gpu: no CUDA device (%s); run it on a machine with an NVIDIA GPU\n",
                   e != cudaSuccess ? cudaGetErrorString(e) : "0 devices found");
      return kExitBadInput;
    }
    cfg = load_config(opt.exp);
    shapes = step_shapes(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_batched_gemm_gpu: %s\n", e.what());
    return kExitBadInput;
  }
  try {
    c.opt = opt;
    MXLAB_CUDA_CHECK(cudaSetDevice(0));
    MXLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    c.l2 = static_cast<size_t>(prop.l2CacheSize);
    MXLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
    RunnerHandle handle(c.s);
    c.h = handle.get();
    MXLAB_CUBLAS_CHECK(cublasLtCreate(&c.lt));
    MXLAB_CUDA_CHECK(cudaMalloc(&c.lt_ws, kRunnerWorkspaceBytes));
    Comparer cmp(c.s);

    int rt = 0, drv = 0, cb_major = 0, cb_minor = 0, cb_patch = 0;
    MXLAB_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
    MXLAB_CUDA_CHECK(cudaDriverGetVersion(&drv));
    cublasGetProperty(MAJOR_VERSION, &cb_major);
    cublasGetProperty(MINOR_VERSION, &cb_minor);
    cublasGetProperty(PATCH_LEVEL, &cb_patch);
    const std::string cublas_v = msg(cb_major, ".", cb_minor, ".", cb_patch);
    int per_step = 0;
    for (const Shape& s : shapes) per_step += s.count;
    std::printf("bench_batched_gemm_gpu: %s (%d SMs, L2 %.0f MiB), CUDA runtime %d.%d, driver %d.%d, cuBLAS %s\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, rt / 1000, (rt % 1000) / 10,
                drv / 1000, (drv % 1000) / 10, cublas_v.c_str());
    const NetShape S = NetShape::student(cfg.model, cfg.data.seq_len, cfg.vocab());
    std::printf("experiment %s: L=%d d=%d H=%d B=%lld, %d GEMMs per trajectory step in %zu shapes\n", opt.exp.c_str(),
                S.depth, S.d, S.hidden, static_cast<long long>(cfg.tokens()), per_step, shapes.size());
    std::printf(
        "timing: %s of >= %d GEMMs, operand sets rotated over > 2 x L2, %d warm-up, median of %d; ms per "
        "K-arm unit (single: K calls; batched: one call)\n",
        opt.graphs ? "CUDA-graph replays" : "eager launches", kMinGemmsPerRep, kWarmup, opt.reps);
    std::printf(
        "bits: every FP32 output of the K items compared word for word (fixed-seed random operands; bf16: 8 "
        "significant bits, sgemm: 24)\n");

    std::vector<Row> rows;
    for (GemmKind kind : {GemmKind::bf16, GemmKind::sgemm}) {
      std::printf("\n== %s: %s ==\n", kind_name(kind),
                  kind == GemmKind::bf16
                      ? "the MX step's GEMMs (lever b): bf16 operands, FP32 output, CUBLAS_COMPUTE_32F, atomics off"
                      : "the shadow pass's SGEMMs (lever c): FP32, CUBLAS_COMPUTE_32F_PEDANTIC (no TF32), atomics off");
      std::printf("%-20s %-18s %3s %3s | %10s %10s %6s | %4s %9s %4s | %10s %10s %6s | %4s %9s | %6s %9s\n", "shape",
                  "M x N x K  A B", "cnt", "K", "single ms", "batched ms", "ratio", "bits", "differ", "rep", "Lt K ms",
                  "Lt 1xK ms", "Lt/sgl", "Lt=", "differ", "=today", "differ");
      for (size_t si = 0; si < shapes.size(); ++si) {
        const Shape& sh = shapes[si];
        for (int K : opt.arms) {
          const Row r = measure(c, cmp, kind, sh, static_cast<int>(si), K);
          rows.push_back(r);
          const std::string dims = msg(sh.g.M, "x", sh.g.N, "x", sh.g.K, sh.b > 1 ? msg("x", sh.b) : std::string(), " ",
                                       sh.g.a_kc ? "k" : "s", " ", sh.g.b_kc ? "k" : "s");
          std::printf("%-20s %-18s %3d %3d | %10.4f %10.4f %6.3f | %4s %9lld %4s |", sh.name.c_str(), dims.c_str(),
                      sh.count, K, r.single_ms, r.batched_ms, r.batched_ms / r.single_ms, yn(r.bits).c_str(),
                      r.bits.differ, r.repeat ? "ok" : "NO");
          if (r.lt_ok)
            std::printf(" %10.4f %10.4f %6.3f | %4s %9lld | %6s %9lld\n", r.lt_batched_ms, r.lt_single_ms,
                        r.lt_batched_ms / r.single_ms, yn(r.lt_bits).c_str(), r.lt_bits.differ, yn(r.lt_today).c_str(),
                        r.lt_today.differ);
          else
            std::printf(" %10s %10s %6s | %4s %9s | %6s %9s\n", "n/a", "n/a", "", "", "", "", "");
        }
      }
      for (const Row& r : rows)
        for (const Diff* d : {&r.bits, &r.lt_bits, &r.lt_today})
          if (r.kind == kind && d->run && d->max_rel > kOrderTolerance)
            std::printf(
                "WARNING: %s K=%d: outputs differ by %.2e of the largest, more than another summation order "
                "allows: a wrong call (see the JSON line)\n",
                shapes[static_cast<size_t>(r.shape)].name.c_str(), r.arms, d->max_rel);
      std::printf(
          "(A B: k = stored with K contiguous, s = strided; ratio = batched / single; bits: batched = single "
          "in every output; rep: every call repeated gave its bits again; Lt/sgl = Lt K / single; Lt=: Lt K "
          "= Lt 1 per arm; =today: Lt 1 = the backend's single call)\n");
    }

    // Step totals: a step of K arms runs each shape `count` times for each arm.
    std::vector<std::vector<Total>> totals(2, std::vector<Total>(opt.arms.size()));
    for (const Row& r : rows) {
      const size_t ki = static_cast<size_t>(std::find(opt.arms.begin(), opt.arms.end(), r.arms) - opt.arms.begin());
      Total& t = totals[r.kind == GemmKind::bf16 ? 0 : 1][ki];
      const double n = shapes[static_cast<size_t>(r.shape)].count;
      t.single += n * r.single_ms;
      t.batched += n * r.batched_ms;
      t.bits_all = t.bits_all && r.bits.equal();
      t.repeat_all = t.repeat_all && r.repeat;
      t.lt_all = t.lt_all && r.lt_ok;
      if (r.lt_ok) {
        t.lt_single += n * r.lt_single_ms;
        t.lt_batched += n * r.lt_batched_ms;
        t.lt_bits_all = t.lt_bits_all && r.lt_bits.equal();
        t.lt_today_all = t.lt_today_all && r.lt_today.equal();
      }
    }
    const auto one = std::find(opt.arms.begin(), opt.arms.end(), 1);
    for (int kk = 0; kk < 2; ++kk) {
      std::printf("\n%s step totals (%d GEMMs per arm; ms for all K arms):\n", kk == 0 ? "bf16 (MX)" : "sgemm (shadow)",
                  per_step);
      std::printf("%3s | %10s %10s %6s %12s | %10s %10s | %5s %5s %6s %6s", "K", "single", "batched", "ratio",
                  "saved/arm", "Lt K", "Lt 1xK", "bits", "rep", "Lt=", "=today");
      std::printf(" | per extra arm: %8s %8s %8s\n", "single", "batched", "Lt K");
      for (size_t ki = 0; ki < opt.arms.size(); ++ki) {
        const Total& t = totals[static_cast<size_t>(kk)][ki];
        const int K = opt.arms[ki];
        std::printf("%3d | %10.4f %10.4f %6.3f %12.4f |", K, t.single, t.batched, t.batched / t.single,
                    (t.single - t.batched) / K);
        if (t.lt_all)
          std::printf(" %10.4f %10.4f |", t.lt_batched, t.lt_single);
        else
          std::printf(" %10s %10s |", "n/a", "n/a");
        std::printf(" %5s %5s %6s %6s", t.bits_all ? "yes" : "no", t.repeat_all ? "ok" : "NO",
                    t.lt_all ? (t.lt_bits_all ? "yes" : "no") : "n/a",
                    t.lt_all ? (t.lt_today_all ? "yes" : "no") : "n/a");
        if (one != opt.arms.end() && K > 1) {
          const Total& t1 = totals[static_cast<size_t>(kk)][static_cast<size_t>(one - opt.arms.begin())];
          std::printf(" | %23.4f %8.4f", (t.single - t1.single) / (K - 1), (t.batched - t1.single) / (K - 1));
          if (t.lt_all)  // the one-arm run with the same pinned algorithm: Lt 1xK / K
            std::printf(" %8.4f", (t.lt_batched - t.lt_single / K) / (K - 1));
        }
        std::printf("\n");
      }
    }
    std::printf(
        "(saved/arm = (single - batched) / K; per extra arm: what an arm beyond the first adds to the "
        "step's GEMM time, (t_K - t_1) / (K - 1): single and batched against today's one-arm calls (K = 1's "
        "single), Lt K against one arm on the same pinned algorithm (Lt 1xK / K); lever (b) predicted "
        "0.08..0.12 ms less per extra arm for bf16, from ~0.28 ms)\n");

    if (opt.lt) {
      std::printf("\npinned cuBLASLt algorithms (chosen for the batched call, used for each arm alone too):\n");
      for (const Row& r : rows)
        std::printf("  %-5s %-20s K=%-3d %s%s%s\n", kind_name(r.kind),
                    shapes[static_cast<size_t>(r.shape)].name.c_str(), r.arms, r.lt_algo.c_str(),
                    r.lt_ok ? "" : " -- n/a: ", r.lt_ok ? "" : r.lt_why.c_str());
    }

    // One JSON line.
    std::string j =
        msg("{\"bench\":\"bench_batched_gemm_gpu\",\"device\":", json_str(prop.name),
            ",\"sms\":", prop.multiProcessorCount, ",\"cuda_runtime\":", rt, ",\"driver\":", drv,
            ",\"cublas\":", json_str(cublas_v), ",\"experiment\":", json_str(opt.exp), ",\"gemms_per_step\":", per_step,
            ",\"graphs\":", opt.graphs ? "true" : "false", ",\"reps\":", opt.reps, ",\"rows\":[");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const Shape& sh = shapes[static_cast<size_t>(r.shape)];
      j += msg(i ? "," : "", "{\"kind\":\"", kind_name(r.kind), "\",\"shape\":", json_str(sh.name), ",\"M\":", sh.g.M,
               ",\"N\":", sh.g.N, ",\"K\":", sh.g.K, ",\"a_kc\":", sh.g.a_kc ? "true" : "false",
               ",\"b_kc\":", sh.g.b_kc ? "true" : "false", ",\"items_per_arm\":", sh.b, ",\"count\":", sh.count,
               ",\"arms\":", r.arms, ",\"operand_sets\":", r.sets, ",\"single_ms\":", json_num(r.single_ms),
               ",\"batched_ms\":", json_num(r.batched_ms), ",\"ratio\":", json_num(r.batched_ms / r.single_ms),
               ",\"bits\":", json_diff(r.bits), ",\"repeat_equal\":", r.repeat ? "true" : "false", ",\"lt\":",
               r.lt_ok ? msg("{\"batched_ms\":", json_num(r.lt_batched_ms), ",\"single_ms\":", json_num(r.lt_single_ms),
                             ",\"bits\":", json_diff(r.lt_bits), ",\"vs_backend\":", json_diff(r.lt_today),
                             ",\"algo\":", json_str(r.lt_algo), "}")
                       : msg("{\"na\":", json_str(r.lt_why.empty() ? "--no-lt" : r.lt_why), "}"),
               "}");
    }
    j += "],\"totals\":[";
    bool first = true;
    for (int kk = 0; kk < 2; ++kk)
      for (size_t ki = 0; ki < opt.arms.size(); ++ki) {
        const Total& t = totals[static_cast<size_t>(kk)][ki];
        j += msg(first ? "" : ",", "{\"kind\":\"", kk == 0 ? "bf16" : "sgemm", "\",\"arms\":", opt.arms[ki],
                 ",\"single_ms\":", json_num(t.single), ",\"batched_ms\":", json_num(t.batched),
                 ",\"bits_equal\":", t.bits_all ? "true" : "false",
                 ",\"repeat_equal\":", t.repeat_all ? "true" : "false",
                 ",\"lt_batched_ms\":", t.lt_all ? json_num(t.lt_batched) : "null",
                 ",\"lt_single_ms\":", t.lt_all ? json_num(t.lt_single) : "null",
                 ",\"lt_bits_equal\":", t.lt_all ? (t.lt_bits_all ? "true" : "false") : "null",
                 ",\"lt_equals_backend\":", t.lt_all ? (t.lt_today_all ? "true" : "false") : "null", "}");
        first = false;
      }
    j += "]}";
    std::printf("\n%s\n", j.c_str());
    cudaFree(c.lt_ws);
    cublasLtDestroy(c.lt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_batched_gemm_gpu: %s\n", e.what());
    return kExitInternal;
  }
  return 0;
}
