// The stability instruments on CUDA against the CPU reference: the curvature ops, quant_gap,
// the Hessian-vector product and a whole curvature measurement.
//
// How each is compared:
//   - bit-exact: act_jvp, act_bwd_tangent, ln_affine_tangent, axpby, mul, precond_isqrt (both
//     backends evaluate lab/model/instrument_elementwise.h element by element), and quant_gap
//     (per-element values from the shared scalar code, sums in the same sequential order).
//   - row ops (layernorm_bwd_tangent, loss_kl_tangent): their row means are double sums in
//     different orders cast to float, which land on different floats only when a double lies
//     within ~2^-29 relative of a float rounding boundary. Then each mean moves by one float ulp
//     and the element's float expression by at most a few ulps of its terms: >= 99% of rows
//     bit-exact, every element within 4 u sum|terms| (u = 2^-24; the terms written in the test).
//   - col_dot: a double sum in another order: 2 n 2^-53 sum|terms| + 2^-23 |ref| (as col_sum).
//   - the Hessian-vector product: both backends are within the FP32 budget of
//     tests/cpu/test_curvature.cpp of the exact product, budget = 4 (6L + 2) K u with
//     K = max(B, d, H1) (the GEMMs' gamma_K along the longest chain, a factor 4 for the
//     two-term cancellations), so they differ by at most 2 budget (relative 2-norm per group).
//   - a measurement: the same start vector and the same number of Lanczos steps on operators
//     within 2 budget of each other (relative to |H|): |lambda_gpu - lambda_cpu| <=
//     2 budget |H|_2 plus the two runs' convergence uncertainty (their last relative changes),
//     with |H|_2 = max(|lambda_max|, |lambda_min|) <= the Ritz value's scale: we use
//     (2 budget + resid_cpu + resid_gpu) |lambda|, |lambda_min| being below lambda_max here.
//     Repeated GPU measurements (eager first product, then graph replays) are bit-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"
#include "kernels/quant_gap.cuh"
#include "lab/config/config.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/curvature.h"
#include "lab/model/hvp.h"
#include "lab/model/instrument_elementwise.h"
#include "lab/model/mlp.h"
#include "tests/gpu/backend_twin.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

using namespace gputest;

constexpr double kU = 1.0 / (1 << 24);

TEST(CurvatureOpsGpu, ElementwiseTangentsMatchCpuBitForBit) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 37, cols = 45;  // odd, larger than a warp
  for (Act act : {Act::relu, Act::gelu, Act::gelu_tanh, Act::swiglu, Act::linear}) {
    SCOPED_TRACE(static_cast<int>(act));
    const int64_t h1 = act == Act::swiglu ? 2 * cols : cols;
    Buf h = t.make(normal(rows * h1, 1, 2.0f)), rh = t.make(normal(rows * h1, 2));
    Buf da = t.make(normal(rows * cols, 3)), rda = t.make(normal(rows * cols, 4));
    Buf ra = t.poisoned(rows * cols), rdh = t.poisoned(rows * h1);
    t.cpu->act_jvp(act, h.c, rh.c, ra.c, rows, cols);
    t.gpu->act_jvp(act, h.g, rh.g, ra.g, rows, cols);
    EXPECT_TRUE(same_bits(t.host_cpu(ra), t.host_gpu(ra))) << "act_jvp";
    t.cpu->act_bwd_tangent(act, h.c, rh.c, da.c, rda.c, rdh.c, rows, cols);
    t.gpu->act_bwd_tangent(act, h.g, rh.g, da.g, rda.g, rdh.g, rows, cols);
    EXPECT_TRUE(same_bits(t.host_cpu(rdh), t.host_gpu(rdh))) << "act_bwd_tangent";
  }
  const int64_t d = 67;
  Buf rx = t.make(normal(rows * d, 5)), xh = t.make(normal(rows * d, 6)), g = t.make(normal(d, 7, 0.2f, 1.0f));
  Buf vg = t.make(normal(d, 8)), vb = t.make(normal(d, 9)), ry = t.poisoned(rows * d);
  for (bool zero : {false, true}) {
    t.cpu->ln_affine_tangent(zero ? nullptr : rx.c, xh.c, g.c, vg.c, vb.c, ry.c, rows, d);
    t.gpu->ln_affine_tangent(zero ? nullptr : rx.g, xh.g, g.g, vg.g, vb.g, ry.g, rows, d);
    EXPECT_TRUE(same_bits(t.host_cpu(ry), t.host_gpu(ry))) << "ln_affine_tangent, rxhat null " << zero;
  }
  const size_t n = 1031 * 7 + 3;
  Buf x = t.make(normal(n, 10)), y = t.poisoned(n), o = t.poisoned(n);
  t.cpu->axpby(y.c, x.c, 0.75f, 0.0f, n);  // b == 0 over a NaN y
  t.gpu->axpby(y.g, x.g, 0.75f, 0.0f, n);
  EXPECT_TRUE(same_bits(t.host_cpu(y), t.host_gpu(y))) << "axpby b=0";
  t.cpu->axpby(y.c + 1, x.c, -1.3f, 0.6f, n - 1);  // unaligned
  t.gpu->axpby(y.g + 1, x.g, -1.3f, 0.6f, n - 1);
  EXPECT_TRUE(same_bits(t.host_cpu(y), t.host_gpu(y))) << "axpby";
  t.cpu->mul(o.c, x.c, y.c, n);
  t.gpu->mul(o.g, x.g, y.g, n);
  EXPECT_TRUE(same_bits(t.host_cpu(o), t.host_gpu(o))) << "mul";
  std::vector<float> v = normal(n, 11);
  for (size_t i = 0; i < n; ++i) v[i] = v[i] * v[i] * (i % 3 == 0 ? 1e-9f : 1e-3f);
  v[0] = 0.0f;
  Buf vv = t.make(v);
  t.cpu->precond_isqrt(vv.c, o.c, n, 0.37f, 1e-8f);
  t.gpu->precond_isqrt(vv.g, o.g, n, 0.37f, 1e-8f);
  EXPECT_TRUE(same_bits(t.host_cpu(o), t.host_gpu(o))) << "precond_isqrt";
}

TEST(CurvatureOpsGpu, RowOpsMatchCpuWithinDerivedTolerance) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  for (int64_t d : {int64_t{67}, int64_t{512}}) {
    SCOPED_TRACE(d);
    const int64_t rows = 131;
    Buf x = t.make(normal(rows * d, 1, 1.5f, 0.3f)), y = t.poisoned(rows * d), xh = t.poisoned(rows * d);
    Buf rs = t.poisoned(rows);
    t.cpu->layernorm_fwd(x.c, nullptr, nullptr, y.c, xh.c, rs.c, rows, d, 1e-5f, ElementwiseRound{});
    // One set of saved tensors for both (the forward is tested elsewhere).
    const auto xhh = t.host_cpu(xh), rsh = t.host_cpu(rs);
    t.gpu->upload(xh.g, xhh.data(), xhh.size());
    t.gpu->upload(rs.g, rsh.data(), rsh.size());
    Buf dy = t.make(normal(rows * d, 2)), rdy = t.make(normal(rows * d, 3)), rx = t.make(normal(rows * d, 4));
    Buf rxh = t.make(normal(rows * d, 5)), g = t.make(normal(d, 6, 0.2f, 1.0f)), vg = t.make(normal(d, 7));
    Buf rdx = t.poisoned(rows * d);
    const auto dyh = t.host_cpu(dy), rdyh = t.host_cpu(rdy), rxhh = t.host_cpu(rxh), gh = t.host_cpu(g),
               vgh = t.host_cpu(vg), rxx = t.host_cpu(rx);
    for (bool affine : {false, true}) {
      t.poison(rdx);
      t.cpu->layernorm_bwd_tangent(dy.c, rdy.c, xh.c, rxh.c, rx.c, rs.c, affine ? g.c : nullptr,
                                   affine ? vg.c : nullptr, rdx.c, rows, d);
      t.gpu->layernorm_bwd_tangent(dy.g, rdy.g, xh.g, rxh.g, rx.g, rs.g, affine ? g.g : nullptr,
                                   affine ? vg.g : nullptr, rdx.g, rows, d);
      const auto ref = t.host_cpu(rdx), got = t.host_gpu(rdx);
      // Tolerance from the magnitudes of the terms (double, from the same inputs).
      std::vector<double> tol(ref.size());
      int64_t rows_diff = 0;
      for (int64_t i = 0; i < rows; ++i) {
        double mg = 0, mgx = 0, rmg = 0, rmgx = 0, sx = 0;
        std::vector<double> gg(d), rg(d);
        for (int64_t j = 0; j < d; ++j) {
          const int64_t e = i * d + j;
          gg[j] = affine ? double(dyh[e]) * gh[j] : dyh[e];
          rg[j] = affine ? double(rdyh[e]) * gh[j] + double(dyh[e]) * vgh[j] : rdyh[e];
          mg += gg[j] / d;
          mgx += gg[j] * xhh[e] / d;
          rmg += rg[j] / d;
          rmgx += (rg[j] * xhh[e] + gg[j] * rxhh[e]) / d;
          sx += double(xhh[e]) * rxx[e] / d;
        }
        const double r = rsh[i], rr = r * r * std::fabs(sx);
        bool diff = false;
        for (int64_t j = 0; j < d; ++j) {
          const int64_t e = i * d + j;
          const double terms = rr * (std::fabs(gg[j]) + std::fabs(mg) + std::fabs(xhh[e] * mgx)) +
                               r * (std::fabs(rg[j]) + std::fabs(rmg) + std::fabs(rxhh[e] * mgx) +
                                    std::fabs(xhh[e] * rmgx));
          tol[e] = 4 * kU * terms;
          diff = diff || bits(ref[e]) != bits(got[e]);
        }
        rows_diff += diff;
      }
      EXPECT_TRUE(within(ref, got, tol)) << "layernorm_bwd_tangent affine " << affine;
      EXPECT_LE(rows_diff * 100, rows) << rows_diff << " rows not bit-exact";
    }
    // KL tangent.
    Buf out = t.make(normal(rows * d, 8, 2.0f)), rout = t.make(normal(rows * d, 9)), rd = t.poisoned(rows * d);
    t.cpu->loss_kl_tangent(out.c, rout.c, rd.c, rows, d, 1.5f);
    t.gpu->loss_kl_tangent(out.g, rout.g, rd.g, rows, d, 1.5f);
    const auto ref = t.host_cpu(rd), got = t.host_gpu(rd), oh = t.host_cpu(out), roh = t.host_cpu(rout);
    std::vector<double> tol(ref.size());
    const double scale = kl_tangent_scale(1.5f, rows);
    for (int64_t i = 0; i < rows; ++i) {
      double m = -INFINITY, s = 0, qr = 0;
      for (int64_t j = 0; j < d; ++j) m = std::max(m, oh[i * d + j] / 1.5);
      for (int64_t j = 0; j < d; ++j) s += std::exp(oh[i * d + j] / 1.5 - m);
      for (int64_t j = 0; j < d; ++j) qr += std::exp(oh[i * d + j] / 1.5 - m) / s * roh[i * d + j];
      for (int64_t j = 0; j < d; ++j) {
        const double q = std::exp(oh[i * d + j] / 1.5 - m) / s;
        tol[i * d + j] = 4 * kU * scale * (std::fabs(q * roh[i * d + j]) + std::fabs(q * qr)) + 1e-300;
      }
    }
    EXPECT_TRUE(within(ref, got, tol)) << "loss_kl_tangent";
  }
  // col_dot over many rows.
  const int64_t rows = 1031, d = 67;
  const auto a = normal(rows * d, 20), b = normal(rows * d, 21);
  Buf A = t.make(a), B = t.make(b), o = t.poisoned(d);
  t.cpu->col_dot(A.c, B.c, o.c, rows, d);
  t.gpu->col_dot(A.g, B.g, o.g, rows, d);
  const auto ref = t.host_cpu(o);
  std::vector<double> tol(d);
  for (int64_t j = 0; j < d; ++j) {
    double S = 0;
    for (int64_t i = 0; i < rows; ++i) S += std::fabs(double(a[i * d + j]) * b[i * d + j]);
    tol[j] = sum_tol(rows, S, ref[j]);
  }
  EXPECT_TRUE(within(ref, t.host_gpu(o), tol)) << "col_dot";
}

TEST(QuantGapGpu, MatchesCpuBitForBit) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  t.set_step(StepScalars{5, 0.0f, 1.0f, 1.0f});
  const int64_t rows = 1031, cols = 77;  // blocks divide neither
  std::vector<float> x = normal(rows * cols, 1);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 1e4f;  // outliers: clamps under floor
  for (size_t i = 5; i < x.size(); i += 101) x[i] = 0.0f;
  x[3000] = std::numeric_limits<float>::infinity();
  x[4000] = std::numeric_limits<float>::quiet_NaN();
  Buf X = t.make(x);
  int cases = 0;
  for (NumFmt f : {NumFmt::mxfp8_e4m3, NumFmt::mxfp8_e5m2, NumFmt::mxfp4_e2m1, NumFmt::mxint8, NumFmt::bf16,
                   NumFmt::fp16, NumFmt::fp32})
    for (ScaleRule rule : {ScaleRule::floor, ScaleRule::rceil, ScaleRule::floor_bump})
      for (Rounding rnd : {Rounding::nearest_even, Rounding::nearest_away, Rounding::stochastic})
        for (Axis axis : {Axis::contiguous, Axis::strided})
          for (bool first : {false, true}) {
            if (!is_mx(f) && (rule != ScaleRule::floor || rnd == Rounding::stochastic)) continue;
            QuantSpec q;
            q.fmt = f;
            q.block = axis == Axis::contiguous ? 32 : 16;
            q.rule = rule;
            q.rounding = rnd;
            q.seed = 99;
            const Backend::QuantGap a = t.cpu->quant_gap(X.c, rows, cols, axis, q, first, Rounding::nearest_away);
            const Backend::QuantGap b = t.gpu->quant_gap(X.g, rows, cols, axis, q, first, Rounding::nearest_away);
            const std::string label = msg(name(f), " ", name(rule), " ", name(rnd), axis == Axis::strided ? " strided" : "",
                                          first ? " bf16-first" : "");
            EXPECT_EQ(a.sum_rel, b.sum_rel) << label;
            EXPECT_EQ(a.max_rel, b.max_rel) << label;
            EXPECT_EQ(a.above, b.above) << label;
            EXPECT_EQ(a.n, b.n) << label;
            EXPECT_EQ(a.nonfinite, b.nonfinite) << label;
            EXPECT_GT(a.n, 0u) << label;
            if (is_mx(f) && rule == ScaleRule::floor) EXPECT_GT(a.above, 0u) << label << ": no clamps tested";
            ++cases;
          }
  // A weight of the paper configuration's size: 1024 chunks, so the final pass folds 32 pieces
  // of 32 chunk partials.
  const int64_t wr = 2048, wc = 512;
  std::vector<float> w = normal(wr * wc, 2);
  for (size_t i = 0; i < w.size(); i += 89) w[i] *= 3e3f;
  Buf W = t.make(w);
  for (Axis axis : {Axis::contiguous, Axis::strided}) {
    QuantSpec q;
    q.fmt = NumFmt::mxfp8_e4m3;
    q.rounding = Rounding::nearest_away;
    const Backend::QuantGap a = t.cpu->quant_gap(W.c, wr, wc, axis, q, false, Rounding::nearest_away);
    const Backend::QuantGap b = t.gpu->quant_gap(W.g, wr, wc, axis, q, false, Rounding::nearest_away);
    EXPECT_EQ(a.sum_rel, b.sum_rel);
    EXPECT_EQ(a.max_rel, b.max_rel);
    EXPECT_EQ(a.above, b.above);
    EXPECT_EQ(a.n, b.n);
    EXPECT_EQ(a.n, static_cast<uint64_t>(wr * wc));
    EXPECT_GT(a.above, 0u);
    ++cases;
  }
  std::printf("[quant_gap] %d cases bit-exact\n", cases);
}

// The batched gaps (one read-back per batch, one pass where a warp's 32 elements are one
// block or need none) against the CPU's quant_gap of each tensor: the one-pass shapes (blocks of
// 32 along whole-block rows, with NaN/Inf blocks, zeros and clamps; scalar formats with a
// partial last window), the two-pass ones beside them in the same batch, and a batch longer
// than one read-back (kHostResults / 5 = 204 tensors).
TEST(QuantGapGpu, BatchesMatchCpuBitForBitOnePassAndTwo) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  t.set_step(StepScalars{7, 0.0f, 1.0f, 1.0f});
  const int64_t rows = 257, cols = 96;  // 3 blocks per row; 24,672 elements: a partial last chunk
  std::vector<float> x = normal(rows * cols, 11);
  for (size_t i = 0; i < x.size(); i += 89) x[i] *= 2e3f;  // clamps under floor
  for (size_t i = 7; i < x.size(); i += 53) x[i] = 0.0f;
  x[1000] = std::numeric_limits<float>::infinity();
  x[5001] = std::numeric_limits<float>::quiet_NaN();
  x[5002] = 3.4e38f;  // rounds to Inf in bf16 (a non-finite block only when bf16 comes first)
  Buf X = t.make(x);
  std::vector<Backend::QuantGapRequest> reqs;
  for (NumFmt f : {NumFmt::mxfp8_e4m3, NumFmt::mxfp4_e2m1, NumFmt::mxint8, NumFmt::bf16, NumFmt::fp32})
    for (Rounding rnd : {Rounding::nearest_away, Rounding::stochastic})
      for (bool first : {false, true})
        for (int shape = 0; shape < 3; ++shape) {  // one-pass; strided (two passes); odd length
          if (!is_mx(f) && rnd == Rounding::stochastic) continue;
          Backend::QuantGapRequest r;
          r.q.fmt = f;
          r.q.block = 32;
          r.q.rounding = rnd;
          r.q.seed = 5;
          r.q.rule = f == NumFmt::mxint8 ? ScaleRule::rceil : ScaleRule::floor;
          r.round_bf16_first = first;
          r.bf16_mode = Rounding::nearest_even;
          r.rows = rows;
          r.cols = shape == 2 ? 95 : cols;
          r.axis = shape == 1 ? Axis::strided : Axis::contiguous;
          r.x = X.g;
          reqs.push_back(r);
        }
  const size_t distinct = reqs.size();
  EXPECT_EQ(cuda::quant_gap_one_pass(cols, Axis::contiguous, reqs[0].q), true);
  EXPECT_EQ(cuda::quant_gap_one_pass(cols, Axis::strided, reqs[0].q), false);
  EXPECT_EQ(cuda::quant_gap_one_pass(95, Axis::contiguous, reqs[0].q), false);
  while (reqs.size() < 230) reqs.push_back(reqs[reqs.size() % distinct]);  // two read-backs
  std::vector<Backend::QuantGap> got(reqs.size());
  t.gpu->quant_gaps(reqs.data(), reqs.size(), got.data());
  size_t nonfinite_seen = 0, clamps_seen = 0, nan_sums = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Backend::QuantGapRequest& r = reqs[i];
    const Backend::QuantGap a = t.cpu->quant_gap(X.c, r.rows, r.cols, r.axis, r.q, r.round_bf16_first, r.bf16_mode);
    const std::string label = msg("request ", i, ": ", name(r.q.fmt), " ", name(r.q.rounding), " cols ", r.cols,
                                  r.axis == Axis::strided ? " strided" : "", r.round_bf16_first ? " bf16-first" : "");
    // A block whose scale exponent is beyond E8M0 (mxint8 under rceil with the 3.4e38 in a finite
    // block, strided) is all NaN after quantization: its elements count in `nonfinite` only on
    // both backends, and the sums stay finite.
    EXPECT_EQ(a.sum_rel, got[i].sum_rel) << label;
    nan_sums += std::isnan(a.sum_rel) || std::isnan(got[i].sum_rel);
    EXPECT_EQ(a.max_rel, got[i].max_rel) << label;
    EXPECT_EQ(a.above, got[i].above) << label;
    EXPECT_EQ(a.n, got[i].n) << label;
    EXPECT_EQ(a.nonfinite, got[i].nonfinite) << label;
    EXPECT_GT(a.n, 0u) << label;
    nonfinite_seen += a.nonfinite > 0;
    clamps_seen += a.above > 0;
  }
  EXPECT_EQ(nonfinite_seen, reqs.size());  // every request met the Inf and the NaN
  EXPECT_GT(clamps_seen, 0u);
  EXPECT_EQ(nan_sums, 0u);
  // One request alone (quant_gap) is the batch's first.
  const Backend::QuantGap one = t.gpu->quant_gap(X.g, rows, cols, Axis::contiguous, reqs[0].q, false,
                                                 Rounding::nearest_even);
  EXPECT_EQ(one.sum_rel, got[0].sum_rel);
  std::printf("[quant_gaps] %zu requests (%zu distinct) bit-exact\n", reqs.size(), distinct);
}

// The top of the float32 range: blocks whose scale exponent is beyond E8M0 (int8 under the
// round-up rules, `even` where amax rounds to 2^128) are all NaN after quantization, and elements
// of blocks with a valid scale may dequantize to +-Inf (ceil, rceil, floor_bump); the gap counts
// both in `nonfinite`, as the quantizer makes them, on both backends alike: the one-pass shapes
// (blocks of 32 along whole-block rows), the two-pass ones (strided, odd length), every MX format
// and rule, deterministic and stochastic rounding, bf16 first or not.
TEST(QuantGapGpu, TopOfRangeBlocksMatchCpuBitForBit) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  t.set_step(StepScalars{9, 0.0f, 1.0f, 1.0f});
  const int64_t rows = 129, cols = 96;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  uint64_t state = 1234;
  auto next = [&]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 32);
  };
  for (float& v : x) {
    const uint32_t u = next();
    const uint32_t sign = (u & 1u) << 31;
    if (u % 23 == 0) v = bits_f32(sign | (0x7F7FFFFFu - (next() % 600000u)));  // the last rounding steps
    else if (u % 5 == 0) v = bits_f32(sign | ((200u + next() % 55u) << 23) | (next() & 0x7FFFFFu));
    else v = bits_f32(sign | ((110u + next() % 30u) << 23) | (next() & 0x7FFFFFu));
  }
  x[500] = std::numeric_limits<float>::quiet_NaN();
  Buf X = t.make(x);
  std::vector<Backend::QuantGapRequest> reqs;
  for (NumFmt f : {NumFmt::mxfp8_e4m3, NumFmt::mxfp8_e5m2, NumFmt::mxfp6_e3m2, NumFmt::mxfp6_e2m3,
                   NumFmt::mxfp4_e2m1, NumFmt::mxint8})
    for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
      for (Rounding rnd : {Rounding::nearest_even, Rounding::stochastic})
        for (bool first : {false, true})
          for (int shape = 0; shape < 3; ++shape) {  // one-pass; strided (two passes); odd length
            Backend::QuantGapRequest q;
            q.q.fmt = f;
            q.q.block = 32;
            q.q.rule = static_cast<ScaleRule>(r);
            q.q.rounding = rnd;
            q.q.seed = 3;
            q.round_bf16_first = first;
            q.bf16_mode = Rounding::nearest_even;
            q.rows = rows;
            q.cols = shape == 2 ? 95 : cols;
            q.axis = shape == 1 ? Axis::strided : Axis::contiguous;
            q.x = X.g;
            reqs.push_back(q);
          }
  std::vector<Backend::QuantGap> got(reqs.size());
  t.gpu->quant_gaps(reqs.data(), reqs.size(), got.data());
  size_t beyond = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Backend::QuantGapRequest& r = reqs[i];
    const Backend::QuantGap a = t.cpu->quant_gap(X.c, r.rows, r.cols, r.axis, r.q, r.round_bf16_first, r.bf16_mode);
    const std::string label = msg("request ", i, ": ", name(r.q.fmt), " ", name(r.q.rule), " ", name(r.q.rounding),
                                  " cols ", r.cols, r.axis == Axis::strided ? " strided" : "",
                                  r.round_bf16_first ? " bf16-first" : "");
    EXPECT_EQ(a.sum_rel, got[i].sum_rel) << label;
    EXPECT_EQ(a.max_rel, got[i].max_rel) << label;
    EXPECT_EQ(a.above, got[i].above) << label;
    EXPECT_EQ(a.n, got[i].n) << label;
    EXPECT_EQ(a.nonfinite, got[i].nonfinite) << label;
    EXPECT_TRUE(std::isfinite(a.sum_rel)) << label;
    // More non-finite elements than the NaN's own block: NaN-scale blocks or +-Inf elements.
    beyond += a.nonfinite > 32;
  }
  EXPECT_GT(beyond, reqs.size() / 2);
  std::printf("[quant_gap top] %zu requests bit-exact\n", reqs.size());
}

// ---- the product and the measurement ---------------------------------------------------------

struct Model {
  RunConfig cfg;
  NetShape s;
  std::vector<float> params, x, y, v;
};

Model make_model(Act act, bool affine, LossKind loss) {
  Model m;
  m.cfg.seed = 11;
  m.cfg.model.depth = 2;
  m.cfg.model.width = 64;
  m.cfg.model.activation = act;
  m.cfg.model.ln_affine = affine;
  m.cfg.loss = loss;
  m.cfg.kl_temperature = 1.5f;
  m.cfg.data.batch = 96;
  m.s = NetShape::student(m.cfg.model);
  m.params = init_params(m.s, InitKind::pytorch, 1.0f, 11, Stream::init);
  const auto z = normal(m.params.size(), 5);
  for (const ParamGroup& g : m.s.groups)
    for (int64_t i = 0; i < g.size(); ++i) {
      float& p = m.params[g.offset + i];
      if (g.kind == ParamGroup::gamma) p = 1.0f + 0.3f * z[g.offset + i];
      if (g.kind == ParamGroup::beta || g.kind == ParamGroup::b2) p = 0.1f * z[g.offset + i];
    }
  m.x = normal(96 * 64, 6);
  m.y = normal(96 * 64, 7);
  m.v = normal(m.params.size(), 8);
  for (float& e : m.v) e = 1e-6f * e * e;
  return m;
}

double budget(const NetShape& s, int64_t B) {
  return 4.0 * (6 * s.depth + 2) * static_cast<double>(std::max<int64_t>({B, s.d, s.hidden_in})) * kU;
}

void product_and_measurement(Act act, bool affine, LossKind loss, const char* label) {
  SCOPED_TRACE(label);
  const Model m = make_model(act, affine, loss);
  const int64_t B = m.cfg.data.batch, n = m.s.num_params;
  Twin t;
  Buf P = t.make(m.params), X = t.make(m.x), Y = t.make(m.y), V = t.make(m.v);
  Buf dir = t.make(normal(n, 9)), hv = t.poisoned(n);
  Curvature cc(*t.cpu, m.s, m.cfg.loss_spec(), m.cfg.seed, B), cg(*t.gpu, m.s, m.cfg.loss_spec(), m.cfg.seed, B);
  cc.prepare(P.c, X.c, Y.c);
  cg.prepare(P.g, X.g, Y.g);
  cc.hvp(dir.c, hv.c);
  cg.hvp(dir.g, hv.g);
  const auto hc = t.host_cpu(hv), hg = t.host_gpu(hv);
  const double tol = 2 * budget(m.s, B);
  for (const ParamGroup& g : m.s.groups) {
    double num = 0, den = 0;
    for (int64_t i = g.offset; i < g.offset + g.size(); ++i) {
      ASSERT_TRUE(std::isfinite(hg[i])) << g.name << "[" << i - g.offset << "]";
      num += (double(hg[i]) - hc[i]) * (double(hg[i]) - hc[i]);
      den += double(hc[i]) * hc[i];
    }
    std::printf("[hvp %s] %-14s |Hv_gpu - Hv_cpu| / |Hv_cpu| %.3g (tolerance %.3g)\n", label, g.name.c_str(),
                std::sqrt(num / den), tol);
    EXPECT_GT(den, 0.0) << g.name;
    EXPECT_LE(std::sqrt(num / den), tol) << g.name;
  }
  t.set_step(StepScalars{40, 0.0f, 1.0f, 1.0f});  // the start vector's Philox step
  const CurvatureResult rc = cc.measure(P.c, X.c, Y.c, V.c, 0.2f, 1e-8f, 20, 3);
  const CurvatureResult r1 = cg.measure(P.g, X.g, Y.g, V.g, 0.2f, 1e-8f, 20, 3);
  const CurvatureResult r2 = cg.measure(P.g, X.g, Y.g, V.g, 0.2f, 1e-8f, 20, 3);  // replayed graphs
  std::printf("[measure %s] cpu lmax %.9g (resid %.2g) precond %.9g (resid %.2g) | gpu lmax %.9g (resid %.2g) "
              "precond %.9g (resid %.2g)\n",
              label, rc.hessian_lmax, rc.hessian_resid, rc.precond_lmax, rc.precond_resid, r1.hessian_lmax,
              r1.hessian_resid, r1.precond_lmax, r1.precond_resid);
  EXPECT_EQ(r1.hessian_lmax, r2.hessian_lmax);
  EXPECT_EQ(r1.precond_lmax, r2.precond_lmax);
  EXPECT_EQ(r1.hessian_resid, r2.hessian_resid);
  EXPECT_EQ(r1.iters, rc.iters);
  EXPECT_NEAR(r1.loss, rc.loss, 1e-5 * std::fabs(rc.loss));
  const double th = (tol + rc.hessian_resid + r1.hessian_resid) * std::fabs(rc.hessian_lmax);
  const double tp = (tol + rc.precond_resid + r1.precond_resid) * std::fabs(rc.precond_lmax);
  EXPECT_NEAR(r1.hessian_lmax, rc.hessian_lmax, th);
  EXPECT_NEAR(r1.precond_lmax, rc.precond_lmax, tp);
  EXPECT_GT(rc.hessian_lmax, 0.0);
}

TEST(CurvatureGpu, ProductAndMeasurementMatchCpuGeluLayernormMse) {
  MXLAB_REQUIRE_GPU();
  product_and_measurement(Act::gelu, true, LossKind::mse, "gelu ln-affine mse");
}

TEST(CurvatureGpu, ProductAndMeasurementMatchCpuSwigluKl) {
  MXLAB_REQUIRE_GPU();
  product_and_measurement(Act::swiglu, false, LossKind::kl, "swiglu ln kl");
}

}  // namespace
}  // namespace mxlab
