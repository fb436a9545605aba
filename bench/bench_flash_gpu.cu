// The flash kernels' time (precision.attention: flash_bf16; kernels/PERF.md, "Flash attention in
// bf16: tiled kernels"): the launchers' tiled kernels against the reference kernels (one thread per
// query row or key, the kernels before the tiled ones), in one process on the same inputs, with the
// check that both give the same bits (every output of the forward and the backward; exit 3 if not).
// Shapes (items = sequences x heads):
//   pilot      128 x S 128 x dh 32, causal, tile [128, 64]: experiments/paper/flash_pilot.yaml
//              (32 sequences of 128 tokens, width 128, 4 heads)
//   pilot_dh64  64 x S 128 x dh 64, causal, tile [128, 64]: the same tokens with 2 heads of 64
//   pilot_stab 128 x S 128 x dh 32, causal, stabilized softmax, delta hp
// or one shape given on the command line. Inputs: tie-heavy (K rows from 9 distinct bf16 vectors per
// item, as the token model's first layer), Q bf16, V and dO Gaussian. Method: CUDA events around
// batches of calls on one stream, warm-up first, median of kReps batches (bench/event_timing.cuh).
// Prints a table and one JSON line (prefix "JSON ").
// Usage: bench_flash_gpu [items S dh [bc [causal 0|1]]]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/event_timing.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/flash_attention.cuh"
#include "lab/core/error.h"
#include "lab/model/backend.h"
#include "lab/mx/scalar.h"

namespace {

using namespace mxlab;
using namespace mxlab::cuda;

constexpr int kWarmup = 3;
constexpr int kReps = 11;
constexpr int kPerBatch = 10;

struct Shape {
  std::string name;
  int64_t items, S, dh;
  Backend::FlashSpec f;
};

float bf16(float x) { return round_bf16(x, Rounding::nearest_even); }

struct DevBuf {
  float* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { MXLAB_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(float))); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void put(const std::vector<float>& h) {
    MXLAB_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  std::vector<float> get() const {
    std::vector<float> h(n);
    MXLAB_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
};

struct Outs {
  DevBuf o, o_hp, lse, rowmax, stats, dq, dk, dv, delta, delta_hp;
  Outs(size_t n, size_t rows)
      : o(n), o_hp(n), lse(rows), rowmax(rows), stats(rows * Backend::kFlashRowStats), dq(n), dk(n), dv(n),
        delta(rows), delta_hp(rows) {}
};

struct Result {
  double ref_fwd, ref_bwd, new_fwd, new_bwd;
  bool same;
  bool tiled;
};

Result run(const Shape& sh, cudaStream_t s) {
  const int64_t items = sh.items, S = sh.S, dh = sh.dh;
  const size_t n = static_cast<size_t>(items * S * dh), rows = static_cast<size_t>(items * S);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(n), k(n), v(n), dout(n);
  constexpr int64_t kVocab = 9;
  std::vector<float> table(static_cast<size_t>(items * kVocab * dh));
  for (float& x : table) x = bf16(1.5f * nd(rng));
  for (int64_t b = 0; b < items; ++b)
    for (int64_t t = 0; t < S; ++t) {
      const int64_t tok = static_cast<int64_t>(rng() % kVocab);
      for (int64_t c = 0; c < dh; ++c)
        k[static_cast<size_t>((b * S + t) * dh + c)] = table[static_cast<size_t>((b * kVocab + tok) * dh + c)];
    }
  for (float& x : q) x = bf16(1.5f * nd(rng));
  for (float& x : v) x = nd(rng);
  for (float& x : dout) x = nd(rng);
  DevBuf qd(n), kd(n), vd(n), ddo(n), scratch(static_cast<size_t>(flash_bwd_scratch_floats(items, S, dh)));
  qd.put(q);
  kd.put(k);
  vd.put(v);
  ddo.put(dout);
  Outs a(n, rows), b(n, rows);
  auto fwd_new = [&](Outs& x) {
    launch_flash_attn_fwd(qd.p, kd.p, vd.p, x.o.p, x.o_hp.p, x.lse.p, x.rowmax.p, x.stats.p, items, S, dh, scale,
                          sh.f, s);
  };
  auto fwd_ref = [&](Outs& x) {
    launch_flash_attn_fwd_reference(qd.p, kd.p, vd.p, x.o.p, x.o_hp.p, x.lse.p, x.rowmax.p, x.stats.p, items, S,
                                    dh, scale, sh.f, s);
  };
  auto bwd_new = [&](Outs& x) {
    launch_flash_attn_bwd(qd.p, kd.p, vd.p, x.o.p, x.o_hp.p, ddo.p, x.lse.p, x.dq.p, x.dk.p, x.dv.p, x.delta.p,
                          x.delta_hp.p, items, S, dh, scale, sh.f, scratch.p, s);
  };
  auto bwd_ref = [&](Outs& x) {
    launch_flash_attn_bwd_reference(qd.p, kd.p, vd.p, x.o.p, x.o_hp.p, ddo.p, x.lse.p, x.dq.p, x.dk.p, x.dv.p,
                                    x.delta.p, x.delta_hp.p, items, S, dh, scale, sh.f, scratch.p, s);
  };
  // Bits first: the tiled kernels' outputs against the reference kernels'.
  fwd_new(a);
  bwd_new(a);
  fwd_ref(b);
  bwd_ref(b);
  MXLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  bool same = true;
  const std::pair<const char*, std::pair<DevBuf*, DevBuf*>> outs[] = {
      {"o", {&a.o, &b.o}},       {"o_hp", {&a.o_hp, &b.o_hp}}, {"lse", {&a.lse, &b.lse}},
      {"rowmax", {&a.rowmax, &b.rowmax}}, {"row_stats", {&a.stats, &b.stats}}, {"dq", {&a.dq, &b.dq}},
      {"dk", {&a.dk, &b.dk}},    {"dv", {&a.dv, &b.dv}},       {"delta", {&a.delta, &b.delta}},
      {"delta_hp", {&a.delta_hp, &b.delta_hp}}};
  for (const auto& [name, p] : outs) {
    const std::vector<float> x = p.first->get(), y = p.second->get();
    if (std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) {
      size_t bad = 0;
      for (size_t i = 0; i < x.size(); ++i) bad += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
      std::printf("  %s: %s differs from the reference kernels in %zu of %zu elements\n", sh.name.c_str(), name, bad,
                  x.size());
      same = false;
    }
  }
  Result r{};
  r.same = same;
  r.tiled = flash_fwd_tiled(items, S, dh, sh.f) && flash_bwd_tiled(items, S, dh, sh.f);
  // The backward reads the forward's outputs, which both sets hold already.
  r.new_fwd = bench::median_event_ms(s, kWarmup, kReps, kPerBatch, [&](int) { fwd_new(a); });
  r.new_bwd = bench::median_event_ms(s, kWarmup, kReps, kPerBatch, [&](int) { bwd_new(a); });
  r.ref_fwd = bench::median_event_ms(s, kWarmup, kReps, kPerBatch, [&](int) { fwd_ref(b); });
  r.ref_bwd = bench::median_event_ms(s, kWarmup, kReps, kPerBatch, [&](int) { bwd_ref(b); });
  MXLAB_CUDA_CHECK(cudaGetLastError());
  return r;
}

Backend::FlashSpec spec(int64_t bc, bool causal, bool stabilized, bool delta_hp) {
  return Backend::FlashSpec::make(128, bc, causal, stabilized, delta_hp);
}

}  // namespace

int bench_main(int argc, char** argv) {
  std::vector<Shape> shapes;
  if (argc > 1) {
    if (argc < 4) {
      std::fprintf(stderr, "bench_flash_gpu: give items S dh [bc [causal 0|1]], or nothing for the default shapes\n");
      return 2;
    }
    const int64_t items = std::atoll(argv[1]), S = std::atoll(argv[2]), dh = std::atoll(argv[3]);
    const int64_t bc = argc > 4 ? std::atoll(argv[4]) : 64;
    const bool causal = argc > 5 ? std::atoi(argv[5]) != 0 : true;
    if (items < 1 || S < 1 || dh < 1 || bc < 1) {
      std::fprintf(stderr, "bench_flash_gpu: items, S, dh and bc must be positive integers\n");
      return 2;
    }
    shapes.push_back({"custom", items, S, dh, spec(bc, causal, false, false)});
  } else {
    shapes.push_back({"pilot", 128, 128, 32, spec(64, true, false, false)});
    shapes.push_back({"pilot_dh64", 64, 128, 64, spec(64, true, false, false)});
    shapes.push_back({"pilot_stab", 128, 128, 32, spec(64, true, true, true)});
  }
  cudaDeviceProp prop{};
  MXLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("bench_flash_gpu: %s; median of %d batches of %d calls; ms per call (forward: one launch; "
              "backward: delta + dK/dV + dQ)\n",
              prop.name, kReps, kPerBatch);
  cudaStream_t s;
  MXLAB_CUDA_CHECK(cudaStreamCreate(&s));
  std::printf("%-11s %-17s %6s %9s %9s %9s %9s %8s %8s %8s %5s\n", "shape", "items x S x dh", "Bc", "ref fwd",
              "ref bwd", "new fwd", "new bwd", "x fwd", "x bwd", "x both", "bits");
  std::string json = std::string("{\"bench\":\"flash_gpu\",\"device\":\"") + prop.name + "\",\"shapes\":[";
  bool all_same = true;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& sh = shapes[i];
    const Result r = run(sh, s);
    all_same = all_same && r.same;
    const double ref = r.ref_fwd + r.ref_bwd, now = r.new_fwd + r.new_bwd;
    char dims[64];
    std::snprintf(dims, sizeof dims, "%lldx%lldx%lld", static_cast<long long>(sh.items), static_cast<long long>(sh.S),
                  static_cast<long long>(sh.dh));
    std::printf("%-11s %-17s %6lld %9.4f %9.4f %9.4f %9.4f %8.1f %8.1f %8.1f %5s%s\n", sh.name.c_str(), dims,
                static_cast<long long>(sh.f.bc), r.ref_fwd, r.ref_bwd, r.new_fwd, r.new_bwd, r.ref_fwd / r.new_fwd,
                r.ref_bwd / r.new_bwd, ref / now, r.same ? "same" : "DIFF",
                r.tiled ? "" : " (shape outside the tiled kernels: both are the reference)");
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s{\"name\":\"%s\",\"items\":%lld,\"S\":%lld,\"dh\":%lld,\"bc\":%lld,\"causal\":%s,"
                  "\"stabilized\":%s,\"ref_fwd_ms\":%.5f,\"ref_bwd_ms\":%.5f,\"new_fwd_ms\":%.5f,\"new_bwd_ms\":%.5f,"
                  "\"speedup_fwd\":%.3f,\"speedup_bwd\":%.3f,\"speedup\":%.3f,\"tiled\":%s,\"same_bits\":%s}",
                  i ? "," : "", sh.name.c_str(), static_cast<long long>(sh.items), static_cast<long long>(sh.S),
                  static_cast<long long>(sh.dh), static_cast<long long>(sh.f.bc), sh.f.causal ? "true" : "false",
                  sh.f.stabilized ? "true" : "false", r.ref_fwd, r.ref_bwd, r.new_fwd, r.new_bwd,
                  r.ref_fwd / r.new_fwd, r.ref_bwd / r.new_bwd, ref / now, r.tiled ? "true" : "false",
                  r.same ? "true" : "false");
    json += buf;
  }
  json += "]}";
  std::printf("JSON %s\n", json.c_str());
  MXLAB_CUDA_CHECK(cudaStreamDestroy(s));
  if (!all_same) {
    std::fprintf(stderr, "bench_flash_gpu: the tiled kernels' bits differ from the reference kernels' (see above)\n");
    return 3;
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return bench_main(argc, argv);
  } catch (const mxlab::Error& e) {
    std::fprintf(stderr, "bench_flash_gpu: %s (needs a CUDA device and a driver for CUDA 13)\n", e.what());
    return 3;
  }
}
