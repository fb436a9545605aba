// `mxlab flash-attention --q Q.npy --k K.npy --v V.npy [--do dO.npy] --out DIR [--tile BR,BC]
// [--causal] [--softmax standard|stabilized] [--beta B] [--eps E] [--delta lp|hp] [--scale S]`:
// the numerics of precision.attention: flash_bf16 (lab/model/flash_attention.h) on tensors of
// one's own, on the CPU reference: softmax(scale Q K^T) V per leading index of [..., S, dh]
// float32 arrays, and with --do the backward. Writes into DIR (float32 .npy):
//   o.npy, o_hp.npy        [..., S, dh] the bf16 output O_lp and the FP32 O before that rounding
//   lse.npy, rowmax.npy    [..., S]     m + log l, and the largest scaled logit of each row
//   row_stats.npy          [..., S, 2]  keys attaining the row maximum; bf16 P-bar entries equal to 1
//   dq.npy, dk.npy, dv.npy [..., S, dh] (with --do) the gradients
//   delta.npy, delta_hp.npy [..., S]    (with --do) the delta the backward used, and delta_hp
// tests/torch/flash_attention.py compares these with a PyTorch emulation of the paper's
// Algorithms 1-3, bit for bit.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/cli/option_checks.h"
#include "lab/core/detmath.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/io/npy.h"
#include "lab/io/writable_dir.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 32;  // after quantize in --help

struct Args {
  std::string q, k, v, dout, out;
  std::vector<int> tile = {128, 64};
  bool causal = false;
  std::string softmax = "standard", delta = "lp";
  float beta = 2.0f, eps = 1e-3f;
  float scale = 0.0f;  // 0: 1 / sqrt(dh)
};

// [..., S, dh] -> (items, S, dh); every input must have q's shape.
struct Dims {
  int64_t items = 1, S = 0, dh = 0;
};

Dims dims_of(const NpyArray& a, const std::string& what) {
  if (a.shape.size() < 2)
    throw Error(msg(what, ": expected an array of rank >= 2, [..., S, dh], got rank ", a.shape.size()));
  Dims d;
  d.S = a.shape[a.shape.size() - 2];
  d.dh = a.shape.back();
  for (size_t i = 0; i + 2 < a.shape.size(); ++i) d.items *= a.shape[i];
  if (d.S < 1 || d.dh < 1) throw Error(msg(what, ": S and dh must be >= 1, got S = ", d.S, ", dh = ", d.dh));
  return d;
}

void flash_attention(const Args& a) {
  if (a.tile.size() != 2 || a.tile[0] < 1 || a.tile[1] < 1)
    throw Error("--tile: give two sizes >= 1, BR,BC (query rows and keys of a tile), e.g. --tile 128,64");
  if (a.softmax != "standard" && a.softmax != "stabilized")
    throw Error(msg("--softmax ", quoted_excerpt(a.softmax), ": use standard or stabilized"));
  if (a.delta != "lp" && a.delta != "hp") throw Error(msg("--delta ", quoted_excerpt(a.delta), ": use lp or hp"));
  if (!(a.beta > 1.0f)) throw Error(msg("--beta must be > 1 (Algorithm 3), got ", a.beta));
  if (!(a.eps > 0.0f)) throw Error(msg("--eps must be > 0, got ", a.eps));
  const NpyArray q = read_npy(a.q), k = read_npy(a.k), v = read_npy(a.v);
  const Dims d = dims_of(q, "--q");
  for (const auto& [arr, what] : {std::pair<const NpyArray*, const char*>{&k, "--k"}, {&v, "--v"}})
    if (arr->shape != q.shape) throw Error(msg(what, " must have --q's shape (the same [..., S, dh])"));
  NpyArray dout;
  if (!a.dout.empty()) {
    dout = read_npy(a.dout);
    if (dout.shape != q.shape) throw Error("--do must have --q's shape (the gradient of O, [..., S, dh])");
  }
  ensure_writable_dir(a.out);

  Backend::FlashSpec f;
  f.br = a.tile[0];
  f.bc = a.tile[1];
  f.causal = a.causal;
  f.stabilized = a.softmax == "stabilized";
  f.beta = a.beta;
  f.eps = a.eps;
  f.delta_hp = a.delta == "hp";
  const float scale = a.scale > 0.0f ? a.scale : 1.0f / sqrtf_ieee(static_cast<float>(d.dh));

  std::unique_ptr<Backend> be = make_cpu_backend();
  const size_t n = q.data.size(), rows = static_cast<size_t>(d.items * d.S);
  auto put = [&](const std::vector<float>& host) {
    float* p = be->alloc(host.size());
    be->upload(p, host.data(), host.size());
    return p;
  };
  auto get = [&](const float* p, size_t count) {
    std::vector<float> h(count);
    be->download(h.data(), p, count);
    return h;
  };
  float *Q = put(q.data), *K = put(k.data), *V = put(v.data);
  float *O = be->alloc(n), *Ohp = be->alloc(n), *lse = be->alloc(rows), *rowmax = be->alloc(rows);
  float* stats = be->alloc(rows * Backend::kFlashRowStats);
  be->flash_attn_fwd(Q, K, V, O, Ohp, lse, rowmax, stats, d.items, d.S, d.dh, scale, f);

  std::vector<int64_t> row_shape(q.shape.begin(), q.shape.end() - 1);
  std::vector<int64_t> stats_shape = row_shape;
  stats_shape.push_back(Backend::kFlashRowStats);
  const std::string dir = a.out + "/";
  write_npy(dir + "o.npy", q.shape, get(O, n).data());
  write_npy(dir + "o_hp.npy", q.shape, get(Ohp, n).data());
  write_npy(dir + "lse.npy", row_shape, get(lse, rows).data());
  write_npy(dir + "rowmax.npy", row_shape, get(rowmax, rows).data());
  write_npy(dir + "row_stats.npy", stats_shape, get(stats, rows * Backend::kFlashRowStats).data());
  if (a.dout.empty()) {
    std::printf("flash-attention: %lld x [%lld, %lld], forward written to %s\n", static_cast<long long>(d.items),
                static_cast<long long>(d.S), static_cast<long long>(d.dh), a.out.c_str());
    return;
  }
  float* dO = put(dout.data);
  float *dQ = be->alloc(n), *dK = be->alloc(n), *dV = be->alloc(n), *delta = be->alloc(rows),
        *delta_hp = be->alloc(rows);
  be->flash_attn_bwd(Q, K, V, O, Ohp, dO, lse, dQ, dK, dV, delta, delta_hp, d.items, d.S, d.dh, scale, f);
  write_npy(dir + "dq.npy", q.shape, get(dQ, n).data());
  write_npy(dir + "dk.npy", q.shape, get(dK, n).data());
  write_npy(dir + "dv.npy", q.shape, get(dV, n).data());
  write_npy(dir + "delta.npy", row_shape, get(delta, rows).data());
  write_npy(dir + "delta_hp.npy", row_shape, get(delta_hp, rows).data());
  std::printf("flash-attention: %lld x [%lld, %lld], forward and backward written to %s\n",
              static_cast<long long>(d.items), static_cast<long long>(d.S), static_cast<long long>(d.dh),
              a.out.c_str());
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "flash-attention",
      "FlashAttention-2's bf16 numerics (precision.attention: flash_bf16) on .npy tensors, on the CPU reference");
  sub->add_option("--q", a->q, "queries [..., S, dh], float32 .npy")->required();
  sub->add_option("--k", a->k, "keys, --q's shape")->required();
  sub->add_option("--v", a->v, "values, --q's shape")->required();
  sub->add_option("--do", a->dout, "gradient of the output, --q's shape: also run the backward");
  sub->add_option("--out", a->out, "directory for the .npy outputs")->required();
  sub->add_option("--tile", a->tile, "BR,BC: query rows and keys of a tile (only BC changes a bit)")
      ->delimiter(',')
      ->expected(2)
      ->capture_default_str();
  sub->add_flag("--causal", a->causal, "query r sees keys t <= r");
  sub->add_option("--softmax", a->softmax, "standard, or stabilized (the paper's Algorithm 3)")->capture_default_str();
  sub->add_option("--beta", a->beta, "Algorithm 3's beta (> 1)")->capture_default_str()->check(finite_positive());
  sub->add_option("--eps", a->eps, "Algorithm 3's tie tolerance epsilon (> 0)")
      ->capture_default_str()
      ->check(finite_positive());
  sub->add_option("--delta", a->delta, "lp: delta from the bf16 O (the kernel's); hp: from the FP32 O")
      ->capture_default_str();
  sub->add_option("--scale", a->scale, "logit scale (default 1/sqrt(dh))")->check(finite_positive());
  sub->callback([a]() { flash_attention(*a); });
});

}  // namespace
}  // namespace mxlab::cli
