// The CUDA backend against the CPU reference, op by op (tests named ...MatchesCpu), on odd
// shapes larger than a warp, with outputs poisoned (NaN) before each op so that an element
// the kernel forgot to write fails the comparison.
//
// How each op is compared (STYLE.md, "write down how each op is compared"):
//   - bit-exact: randn, fill, copy, round_bf16, quantize (values and statistics counts),
//     act fwd/bwd, residual_add, add, MSE gradient, adam, sgd. Both backends evaluate the
//     same scalar code (lab/model/elementwise.h, lab/mx/scalar.h) element by element.
//   - double sums cast to float (col_sum, layernorm dgamma/dbeta, losses, reduce, moments):
//     both sum exactly-representable terms in double, in different orders. Each double sum
//     is within n * 2^-53 * sum|terms| of the exact one, so the two differ by at most twice
//     that, plus one float ulp (2^-24 relative each side) where the cast rounds a value
//     near a float tie differently: tolerance = 2 n 2^-53 S + 2^-23 |ref|.
//   - layernorm element outputs: the row mean/variance come from such double sums, so in
//     rare rows a cast lands on the other side of a float (or bf16) rounding boundary and
//     the row's elements move by about one ulp of the element format. Required: at least
//     99% of rows bit-exact, every element within 4 ulps of the element format.
//   - GEMM: FP32 accumulation in different orders (cuBLAS vs Eigen) on bit-identical
//     quantized operands: |diff| <= 2 K 2^-24 sum_k |a_ik b_jk| (+ one bf16 ulp of |ref|
//     when the output is rounded to bf16).
// Determinism (same op twice: identical bits) and graph capture (replay == eager) follow.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/backend.h"
#include "lab/model/elementwise.h"
#include "lab/mx/quantize.h"
#include "tests/gpu/backend_twin.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

using namespace gputest;

const ElementwiseRound kFp32{};
const ElementwiseRound kBf16Even{true, Rounding::nearest_even};
const ElementwiseRound kBf16Away{true, Rounding::nearest_away};

// ---------------------------------------------------------------------------------------------

TEST(CudaBackend, NameAndMathMode) {
  MXLAB_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  EXPECT_EQ(be->name().rfind("cuda:0 (", 0), 0u) << be->name();
  EXPECT_FALSE(be->math_mode().empty());
  std::printf("[backend] %s; %s\n", be->name().c_str(), be->math_mode().c_str());
  // The facts a run file records about the device (HDF5 root attributes).
  const auto facts = be->describe();
  for (const char* key : {"gpu", "cuda_runtime", "cuda_driver", "cublas"}) {
    bool found = false;
    for (const auto& [k, v] : facts) found = found || (k == key && !v.empty());
    EXPECT_TRUE(found) << "describe() lacks " << key;
  }
}

TEST(CudaBackend, MemoryRoundTripFillCopy) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const size_t n = 1031 * 7 + 3;
  const auto v = normal(n, 1);
  Buf a = t.make(v), b = t.poisoned(n);
  EXPECT_TRUE(same_bits(v, t.host_gpu(a)));
  t.cpu->copy(b.c, a.c, n);
  t.gpu->copy(b.g, a.g, n);
  EXPECT_TRUE(same_bits(v, t.host_gpu(b)));
  t.cpu->fill(b.c + 1, 2.5f, n - 2);  // unaligned start, odd length
  t.gpu->fill(b.g + 1, 2.5f, n - 2);
  t.cpu->copy(b.c, a.c, 1);
  t.gpu->copy(b.g, a.g, 1);
  EXPECT_TRUE(same_bits(t.host_cpu(b), t.host_gpu(b)));
}

TEST(CudaBackend, RandnMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  t.set_step(StepScalars{7, 0.0f, 1.0f, 1.0f});
  for (size_t n : {size_t{1}, size_t{33}, size_t{1031 * 97 + 1}}) {
    Buf x = t.poisoned(n + 1);
    t.cpu->randn(x.c, n, 12345, Stream::data, 0.75f);
    t.gpu->randn(x.g, n, 12345, Stream::data, 0.75f);
    auto ref = t.host_cpu(x, n), got = t.host_gpu(x, n);
    EXPECT_TRUE(same_bits(ref, got)) << "randn n=" << n;
    EXPECT_TRUE(std::isnan(t.host_gpu(x)[n])) << "randn wrote past its end";
    // Label noise: accumulate, from an unaligned start (the scalar path).
    t.cpu->add_randn(x.c + 1, n - (n > 1), 99, Stream::label_noise, 0.005f);
    t.gpu->add_randn(x.g + 1, n - (n > 1), 99, Stream::label_noise, 0.005f);
    EXPECT_TRUE(same_bits(t.host_cpu(x, n), t.host_gpu(x, n))) << "add_randn n=" << n;
  }
  // The step selects the batch: a different step gives different samples on both.
  Buf a = t.poisoned(64), b = t.poisoned(64);
  t.gpu->randn(a.g, 64, 1, Stream::data, 1.0f);
  t.set_step(StepScalars{8, 0.0f, 1.0f, 1.0f});
  t.gpu->randn(b.g, 64, 1, Stream::data, 1.0f);
  EXPECT_NE(t.host_gpu(a), t.host_gpu(b));
}

TEST(CudaBackend, RoundBf16MatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  auto v = normal(1031 * 9, 2, 3.0f);
  // Special values: ties at both parities, subnormals, overflow to Inf, Inf, NaN, -0.
  const float specials[] = {1.00390625f, 1.01171875f, -1.00390625f, 1e-40f, -3e-39f, 3.3961e38f, 3.4e38f,
                            std::numeric_limits<float>::infinity(), kNaN, -0.0f};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i) v[100 + i] = specials[i];
  for (Rounding mode : {Rounding::nearest_even, Rounding::nearest_away}) {
    Buf x = t.make(v);
    t.cpu->round_bf16(x.c + 3, v.size() - 3, mode);
    t.gpu->round_bf16(x.g + 3, v.size() - 3, mode);
    EXPECT_TRUE(same_bits(t.host_cpu(x), t.host_gpu(x), true)) << name(mode);
  }
}

TEST(CudaBackend, QuantizeMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 1031, cols = 96;
  auto v = normal(rows * cols, 3, 2.0f);
  for (int64_t i = 0; i < rows * cols; i += 97) v[i] *= 300.0f;  // blocks that clamp under floor
  v[5] = kNaN;                                                    // one NaN block per axis
  Buf in = t.make(v), out = t.poisoned(v.size());
  const int kSlots = 3;
  struct Case {
    NumFmt f;
    ScaleRule rule;
    Rounding rnd;
    Axis axis;
  };
  const Case cases[] = {
      {NumFmt::mxfp8_e4m3, ScaleRule::floor, Rounding::nearest_even, Axis::contiguous},
      {NumFmt::mxfp8_e4m3, ScaleRule::rceil, Rounding::nearest_away, Axis::strided},
      {NumFmt::mxfp8_e5m2, ScaleRule::floor_bump, Rounding::nearest_even, Axis::strided},
      {NumFmt::mxfp6_e3m2, ScaleRule::ceil, Rounding::toward_zero, Axis::contiguous},
      {NumFmt::mxfp6_e2m3, ScaleRule::even, Rounding::nearest_even, Axis::contiguous},
      {NumFmt::mxfp4_e2m1, ScaleRule::floor, Rounding::stochastic, Axis::strided},
      {NumFmt::mxint8, ScaleRule::floor, Rounding::nearest_even, Axis::contiguous},
      {NumFmt::bf16, ScaleRule::floor, Rounding::nearest_even, Axis::contiguous},
      {NumFmt::fp16, ScaleRule::floor, Rounding::nearest_away, Axis::contiguous},
  };
  t.set_step(StepScalars{3, 0.0f, 1.0f, 1.0f});
  for (const Case& c : cases) {
    QuantSpec q;
    q.fmt = c.f;
    q.rule = c.rule;
    q.rounding = c.rnd;
    q.seed = 77;
    t.cpu->reset_stats(kSlots);
    t.gpu->reset_stats(kSlots);
    t.poison(out);
    t.cpu->quantize(in.c, out.c, rows, cols, c.axis, q, 1);
    t.gpu->quantize(in.g, out.g, rows, cols, c.axis, q, 1);
    const std::string what = msg(name(c.f), " ", name(c.rule), " ", name(c.rnd), c.axis == Axis::strided ? " strided" : "");
    EXPECT_TRUE(same_bits(t.host_cpu(out), t.host_gpu(out), true)) << what;
    // Only the NaN block may hold NaN.
    const auto got = t.host_gpu(out);
    size_t nans = 0;
    for (float x : got) nans += std::isnan(x);
    EXPECT_LE(nans, static_cast<size_t>(is_mx(c.f) ? q.block : 1)) << what;
    // Statistics only (out = null) counts the same again.
    t.cpu->quantize(in.c, nullptr, rows, cols, c.axis, q, 2);
    t.gpu->quantize(in.g, nullptr, rows, cols, c.axis, q, 2);
    const auto sc = t.cpu->read_stats(), sg = t.gpu->read_stats();
    ASSERT_EQ(sc.size(), static_cast<size_t>(kSlots));
    ASSERT_EQ(sg.size(), static_cast<size_t>(kSlots));
    for (int s = 0; s < kSlots; ++s) {
      EXPECT_EQ(sc[s].n, sg[s].n) << what << " slot " << s;
      EXPECT_EQ(sc[s].lastbin, sg[s].lastbin) << what << " slot " << s;
      EXPECT_EQ(sc[s].clamped, sg[s].clamped) << what << " slot " << s;
      EXPECT_EQ(sc[s].nan_blocks, sg[s].nan_blocks) << what << " slot " << s;
      EXPECT_EQ(sc[s].blocks, sg[s].blocks) << what << " slot " << s;
    }
    EXPECT_EQ(sg[1].n, static_cast<uint64_t>(rows * cols)) << what;
  }
}

// GEMM: every storage layout, FP32 and MX operands, bf16 and FP32 outputs, beta 0 and 1.
TEST(CudaBackend, GemmMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t M = 257, N = 193, K = 320;
  const auto av = normal(M * K, 4), bv = normal(N * K, 5, 0.5f), cv = normal(M * N, 6);
  Buf A = t.make(av), B = t.make(bv), C = t.poisoned(M * N), Aq = t.poisoned(M * K), Bq = t.poisoned(N * K);
  t.cpu->reset_stats(4);
  t.gpu->reset_stats(4);
  t.set_step(StepScalars{1, 0.0f, 1.0f, 1.0f});
  for (NumFmt f : {NumFmt::fp32, NumFmt::mxfp8_e4m3, NumFmt::mxfp4_e2m1}) {
    for (int layout = 0; layout < 4; ++layout) {
      for (const ElementwiseRound& r : {kFp32, kBf16Even}) {
        for (float beta : {0.0f, 1.0f}) {
          const bool ak = layout & 1, bk = layout & 2;
          GemmOperand a, b;
          a.p = A.g;
          a.k_contiguous = ak;
          a.q.fmt = f;
          a.round_bf16_first = is_mx(f);
          a.stats_slot = is_mx(f) ? 0 : -1;
          a.stats_q = a.q;
          a.sr_op = 3;
          b = a;
          b.p = B.g;
          b.k_contiguous = bk;
          b.stats_slot = is_mx(f) ? 1 : -1;
          b.sr_op = 4;
          if (beta == 0.0f) {
            t.poison(C);
          } else {
            t.cpu->upload(C.c, cv.data(), cv.size());
            t.gpu->upload(C.g, cv.data(), cv.size());
          }
          t.gpu->gemm(M, N, K, a, b, C.g, beta, r);
          GemmOperand ac = a, bc = b;
          ac.p = A.c;
          bc.p = B.c;
          t.cpu->gemm(M, N, K, ac, bc, C.c, beta, r);
          const auto ref = t.host_cpu(C), got = t.host_gpu(C);
          // Tolerance from the quantized operands (the CPU's own quantizer, bit-identical).
          const int64_t arows = ak ? M : K, acols = ak ? K : M, brows = bk ? N : K, bcols = bk ? K : N;
          std::vector<float> aq(M * K), bq(N * K);
          {
            std::vector<float> ab = av, bb = bv;
            if (is_mx(f))
              for (float& x : ab) x = round_bf16(x, Rounding::nearest_even);
            if (is_mx(f))
              for (float& x : bb) x = round_bf16(x, Rounding::nearest_even);
            QuantSpec qa = a.q, qb = b.q;
            qa.seed = sr_seed(qa.seed, a.sr_op);
            qb.seed = sr_seed(qb.seed, b.sr_op);
            quantize_dequantize(ab.data(), aq.data(), arows, acols, ak ? Axis::contiguous : Axis::strided, qa);
            quantize_dequantize(bb.data(), bq.data(), brows, bcols, bk ? Axis::contiguous : Axis::strided, qb);
          }
          std::vector<double> tol(M * N);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double s = beta != 0.0f ? std::fabs(cv[i * N + j]) : 0.0;
              for (int64_t k = 0; k < K; ++k) {
                const float x = ak ? aq[i * K + k] : aq[k * M + i];
                const float y = bk ? bq[j * K + k] : bq[k * N + j];
                s += std::fabs(static_cast<double>(x) * y);
              }
              const double ref_ij = ref[i * N + j];
              tol[i * N + j] = 2.0 * K * std::ldexp(s, -24) + (r.bf16 ? ulp(ref_ij, 7) : 0.0);
            }
          EXPECT_TRUE(within(ref, got, tol)) << name(f) << " layout " << layout << (r.bf16 ? " bf16" : " fp32")
                                             << " beta " << beta;
        }
      }
    }
    if (is_mx(f)) {
      const auto sc = t.cpu->read_stats(), sg = t.gpu->read_stats();
      for (int s = 0; s < 2; ++s) {
        EXPECT_EQ(sc[s].n, sg[s].n) << name(f);
        EXPECT_EQ(sc[s].lastbin, sg[s].lastbin) << name(f);
        EXPECT_EQ(sc[s].clamped, sg[s].clamped) << name(f);
      }
      t.cpu->reset_stats(4);
      t.gpu->reset_stats(4);
    }
  }
  (void)Aq;
  (void)Bq;
}

TEST(CudaBackend, LayernormFwdMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 1031;
  for (int64_t d : {int64_t{96}, int64_t{777}}) {
    const auto x = normal(rows * d, 10 + d, 2.0f, 0.5f);
    const auto gm = normal(d, 11, 0.2f, 1.0f), bt = normal(d, 12, 0.1f);
    Buf X = t.make(x), G = t.make(gm), Bt = t.make(bt);
    Buf Y = t.poisoned(rows * d), H = t.poisoned(rows * d), R = t.poisoned(rows);
    for (const ElementwiseRound& r : {kFp32, kBf16Even, kBf16Away}) {
      for (bool affine : {true, false}) {
        t.poison(Y);
        t.poison(H);
        t.poison(R);
        t.cpu->layernorm_fwd(X.c, affine ? G.c : nullptr, affine ? Bt.c : nullptr, Y.c, H.c, R.c, rows, d, 1e-5f, r);
        t.gpu->layernorm_fwd(X.g, affine ? G.g : nullptr, affine ? Bt.g : nullptr, Y.g, H.g, R.g, rows, d, 1e-5f, r);
        const std::string what = msg("d=", d, r.bf16 ? " bf16" : " fp32", affine ? " affine" : "");
        expect_rows_nearly_exact(t.host_cpu(Y), t.host_gpu(Y), rows, d, r.bf16, (what + " y").c_str());
        expect_rows_nearly_exact(t.host_cpu(H), t.host_gpu(H), rows, d, r.bf16, (what + " xhat").c_str());
        expect_rows_nearly_exact(t.host_cpu(R), t.host_gpu(R), rows, 1, r.bf16, (what + " rstd").c_str());
      }
    }
  }
}

TEST(CudaBackend, LayernormBwdMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 1031;
  for (int64_t d : {int64_t{96}, int64_t{777}}) {
    const auto x = normal(rows * d, 20 + d, 1.5f, -0.3f), dy = normal(rows * d, 21, 0.01f);
    const auto gm = normal(d, 22, 0.2f, 1.0f), bt = normal(d, 23, 0.1f);
    Buf X = t.make(x), DY = t.make(dy), G = t.make(gm), Bt = t.make(bt);
    Buf Y = t.poisoned(rows * d), H = t.poisoned(rows * d), R = t.poisoned(rows);
    Buf DX = t.poisoned(rows * d), DG = t.poisoned(d), DB = t.poisoned(d);
    for (const ElementwiseRound& r : {kFp32, kBf16Even}) {
      for (int variant = 0; variant < 3; ++variant) {
        // 0, 1: with / without affine; 2: affine, dy read through R (a GEMM output left unrounded).
        const bool affine = variant != 1;
        const ElementwiseRound dy_in = variant == 2 ? r : kFp32;
        // Use the CPU's forward outputs on both sides, so that only the backward is compared.
        t.cpu->layernorm_fwd(X.c, G.c, Bt.c, Y.c, H.c, R.c, rows, d, 1e-5f, r);
        const auto xh = t.host_cpu(H), rs = t.host_cpu(R);
        t.gpu->upload(H.g, xh.data(), xh.size());
        t.gpu->upload(R.g, rs.data(), rs.size());
        t.poison(DX);
        t.poison(DG);
        t.poison(DB);
        t.cpu->layernorm_bwd(DY.c, H.c, R.c, affine ? G.c : nullptr, DX.c, DG.c, DB.c, rows, d, r, dy_in);
        t.gpu->layernorm_bwd(DY.g, H.g, R.g, affine ? G.g : nullptr, DX.g, DG.g, DB.g, rows, d, r, dy_in);
        const std::string what =
            msg("d=", d, r.bf16 ? " bf16" : " fp32", affine ? " affine" : "", dy_in.bf16 ? " dy rounded as read" : "");
        expect_rows_nearly_exact(t.host_cpu(DX), t.host_gpu(DX), rows, d, r.bf16, (what + " dx").c_str());
        const auto dgc = t.host_cpu(DG), dbc = t.host_cpu(DB);
        std::vector<double> tg(d), tb(d);
        for (int64_t j = 0; j < d; ++j) {
          double sg = 0.0, sb = 0.0;
          for (int64_t i = 0; i < rows; ++i) {
            sg += std::fabs(static_cast<double>(dy[i * d + j]) * xh[i * d + j]);
            sb += std::fabs(dy[i * d + j]);
          }
          tg[j] = sum_tol(rows, sg, dgc[j]);
          tb[j] = sum_tol(rows, sb, dbc[j]);
        }
        EXPECT_TRUE(within(dgc, t.host_gpu(DG), tg)) << what << " dgamma";
        EXPECT_TRUE(within(dbc, t.host_gpu(DB), tb)) << what << " dbeta";
      }
    }
    // dgamma/dbeta may be null.
    t.gpu->layernorm_bwd(DY.g, H.g, R.g, G.g, DX.g, nullptr, nullptr, rows, d, kFp32, kFp32);
    t.gpu->synchronize();
  }
}

TEST(CudaBackend, ActivationsMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 1031, cols = 777;
  for (Act act : {Act::relu, Act::gelu, Act::gelu_tanh, Act::swiglu, Act::linear}) {
    const int64_t hcols = act == Act::swiglu ? 2 * cols : cols;
    auto h = normal(rows * hcols + 1, 30, 3.0f);
    h[7] = 0.0f;
    h[8] = -0.0f;
    const auto da = normal(rows * cols + 1, 31, 0.1f);
    Buf Hb = t.make(h), DA = t.make(da), A = t.poisoned(rows * cols + 1), DH = t.poisoned(rows * hcols + 1);
    // Output rounding r; the inputs' deferred rounding (h_in, da_in): none, as r, or another.
    struct Rounds {
      ElementwiseRound r, h_in, da_in;
    };
    const std::vector<Rounds> rounds = {{kFp32, kFp32, kFp32},         {kBf16Even, kFp32, kFp32},
                                        {kBf16Away, kFp32, kFp32},     {kBf16Even, kBf16Even, kBf16Even},
                                        {kBf16Away, kBf16Away, kBf16Away}, {kFp32, kBf16Away, kFp32},
                                        {kBf16Away, kBf16Even, kBf16Away}};
    for (const Rounds& q : rounds) {
      const ElementwiseRound& r = q.r;
      for (int off : {0, 1}) {  // off = 1: misaligned pointers take the scalar path
        t.poison(A);
        t.poison(DH);
        t.cpu->act_fwd(act, Hb.c + off, A.c + off, rows, cols, r, q.h_in);
        t.gpu->act_fwd(act, Hb.g + off, A.g + off, rows, cols, r, q.h_in);
        t.cpu->act_bwd(act, Hb.c + off, DA.c + off, DH.c + off, rows, cols, r, q.h_in, q.da_in);
        t.gpu->act_bwd(act, Hb.g + off, DA.g + off, DH.g + off, rows, cols, r, q.h_in, q.da_in);
        auto name = [](const ElementwiseRound& e) {
          return std::string(e.bf16 ? (e.mode == Rounding::nearest_away ? "bf16-away" : "bf16-even") : "fp32");
        };
        const std::string what = msg("act ", static_cast<int>(act), " out ", name(r), " h_in ", name(q.h_in),
                                     " da_in ", name(q.da_in), " off ", off);
        auto ac = t.host_cpu(A), ag = t.host_gpu(A), dc = t.host_cpu(DH), dg = t.host_gpu(DH);
        EXPECT_TRUE(std::isnan(ag[off ? 0 : rows * cols])) << what << ": wrote outside";
        ac.erase(ac.begin() + (off ? 0 : rows * cols));
        ag.erase(ag.begin() + (off ? 0 : rows * cols));
        dc.erase(dc.begin() + (off ? 0 : rows * hcols));
        dg.erase(dg.begin() + (off ? 0 : rows * hcols));
        EXPECT_TRUE(same_bits(ac, ag)) << what << " fwd";
        EXPECT_TRUE(same_bits(dc, dg)) << what << " bwd";
      }
    }
  }
}

TEST(CudaBackend, ResidualAddAndAddMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 1031;
  for (int64_t d : {int64_t{96}, int64_t{777}}) {
    const auto x = normal(rows * d, 40, 1.0f), y = normal(rows * d, 41, 0.3f), b = normal(d, 42, 0.1f);
    for (const ElementwiseRound& r : {kFp32, kBf16Even, kBf16Away}) {
      for (bool bias : {true, false}) {
        Buf X = t.make(x), Y = t.make(y), Bb = t.make(b);
        // Out of place with y read through R (the model's unrounded GEMM output o), then in place.
        Buf O = t.poisoned(rows * d);
        t.cpu->residual_add(O.c, X.c, Y.c, bias ? Bb.c : nullptr, rows, d, r, r);
        t.gpu->residual_add(O.g, X.g, Y.g, bias ? Bb.g : nullptr, rows, d, r, r);
        EXPECT_TRUE(same_bits(t.host_cpu(O), t.host_gpu(O))) << "residual out of place d=" << d << " bias " << bias;
        EXPECT_TRUE(same_bits(t.host_gpu(X), x)) << "residual out of place wrote x, d=" << d;
        t.cpu->residual_add(X.c, X.c, Y.c, bias ? Bb.c : nullptr, rows, d, r, kFp32);
        t.gpu->residual_add(X.g, X.g, Y.g, bias ? Bb.g : nullptr, rows, d, r, kFp32);
        EXPECT_TRUE(same_bits(t.host_cpu(X), t.host_gpu(X))) << "residual d=" << d << " bias " << bias;
        // add with dst aliasing a (the model accumulates dA = dA + dx this way).
        t.cpu->add(X.c, X.c, Y.c, rows * d, r);
        t.gpu->add(X.g, X.g, Y.g, rows * d, r);
        EXPECT_TRUE(same_bits(t.host_cpu(X), t.host_gpu(X))) << "add d=" << d;
        Buf Z = t.poisoned(rows * d);
        t.cpu->add(Z.c + 1, X.c + 1, Y.c, rows * d - 1, r);
        t.gpu->add(Z.g + 1, X.g + 1, Y.g, rows * d - 1, r);
        auto zc = t.host_cpu(Z), zg = t.host_gpu(Z);
        EXPECT_TRUE(std::isnan(zg[0]));
        zc.erase(zc.begin());
        zg.erase(zg.begin());
        EXPECT_TRUE(same_bits(zc, zg)) << "add unaligned d=" << d;
      }
    }
  }
}

TEST(CudaBackend, ColSumMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  for (int64_t rows : {int64_t{1}, int64_t{1031}, int64_t{4099}}) {
    for (int64_t d : {int64_t{1}, int64_t{96}, int64_t{777}}) {
      const auto x = normal(rows * d, 50 + rows + d, 1.0f, 0.25f);
      Buf X = t.make(x), O = t.poisoned(d);
      t.cpu->col_sum(X.c, O.c, rows, d);
      t.gpu->col_sum(X.g, O.g, rows, d);
      const auto ref = t.host_cpu(O);
      std::vector<double> tol(d);
      for (int64_t j = 0; j < d; ++j) {
        double s = 0.0;
        for (int64_t i = 0; i < rows; ++i) s += std::fabs(x[i * d + j]);
        tol[j] = sum_tol(rows, s, ref[j]);
      }
      EXPECT_TRUE(within(ref, t.host_gpu(O), tol)) << rows << " x " << d;
    }
  }
}

TEST(CudaBackend, LossesMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 1031, d = 96;
  const auto out = normal(rows * d, 60, 1.0f), tg = normal(rows * d, 61, 1.0f);
  Buf O = t.make(out), T = t.make(tg), D = t.poisoned(rows * d), L = t.poisoned(1), Hist = t.poisoned(16);
  t.set_step(StepScalars{5, 0.0f, 1.0f, 1.0f});
  for (const ElementwiseRound& r : {kFp32, kBf16Even}) {
    t.poison(D);
    t.cpu->loss_mse(O.c, T.c, D.c, L.c, Hist.c, rows, d, r);
    t.gpu->loss_mse(O.g, T.g, D.g, L.g, Hist.g, rows, d, r);
    EXPECT_TRUE(same_bits(t.host_cpu(D), t.host_gpu(D))) << "mse dout";
    double s = 0.0;
    for (int64_t i = 0; i < rows * d; ++i) s += diff_sq_term(out[i], tg[i]);
    const float lc = t.cpu->read_scalar(L.c), lg = t.gpu->read_scalar(L.g);
    EXPECT_NEAR(lg, lc, sum_tol(rows * d, s, lc) / (rows * d) + std::ldexp(std::fabs(lc), -23)) << "mse loss";
    EXPECT_EQ(bits(t.gpu->read_scalar(Hist.g + 5)), bits(lg)) << "loss_history[step]";
    EXPECT_TRUE(std::isnan(t.gpu->read_scalar(Hist.g + 4)));

    t.poison(D);
    t.cpu->loss_kl(O.c, T.c, D.c, L.c, nullptr, rows, d, 2.0f, r);
    t.gpu->loss_kl(O.g, T.g, D.g, L.g, nullptr, rows, d, 2.0f, r);
    // dout = R((q - p) / (T rows)): p and q are (float)(e / S) with S a double sum, so a row
    // whose S differs in its last double bits can move p or q by one float ulp.
    expect_rows_nearly_exact(t.host_cpu(D), t.host_gpu(D), rows, d, r.bf16, "kl dout");
    const float kc = t.cpu->read_scalar(L.c), kg = t.gpu->read_scalar(L.g);
    // A flipped p or q (see above) moves its term by ~2^-24 relative: allow 2^-20 overall.
    EXPECT_NEAR(kg, kc, std::ldexp(std::fabs(kc), -20)) << "kl loss";
    EXPECT_GT(kc, 0.0f);
  }
}

TEST(CudaBackend, OptimizersMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const size_t n = 1031 * 33 + 3;
  const auto p0 = normal(n, 70, 0.1f);
  for (bool decoupled : {false, true}) {
    Buf P = t.make(p0), M = t.make(std::vector<float>(n, 0.0f)), V = t.make(std::vector<float>(n, 0.0f));
    Backend::AdamHyper h;
    h.weight_decay = decoupled ? 0.1f : 0.01f;
    h.decoupled = decoupled;
    for (uint32_t step = 0; step < 3; ++step) {
      const float lr = 1e-3f * static_cast<float>(step + 1);
      const float bc1 = 1.0f - std::pow(h.beta1, static_cast<float>(step + 1));
      const float bc2 = 1.0f - std::pow(h.beta2, static_cast<float>(step + 1));
      t.set_step(StepScalars{step, lr, bc1, bc2});
      const auto g = normal(n, 71 + step, 0.01f);
      Buf G = t.make(g);
      t.cpu->adam(P.c, G.c, M.c, V.c, n, h);
      t.gpu->adam(P.g, G.g, M.g, V.g, n, h);
      // A slice at an odd offset (parameter groups of a flat buffer) takes the scalar path.
      t.cpu->adam(P.c + 5, G.c + 5, M.c + 5, V.c + 5, 1031, h);
      t.gpu->adam(P.g + 5, G.g + 5, M.g + 5, V.g + 5, 1031, h);
    }
    EXPECT_TRUE(same_bits(t.host_cpu(P), t.host_gpu(P))) << "adam p";
    EXPECT_TRUE(same_bits(t.host_cpu(M), t.host_gpu(M))) << "adam m";
    EXPECT_TRUE(same_bits(t.host_cpu(V), t.host_gpu(V))) << "adam v";
  }
  for (float momentum : {0.0f, 0.9f}) {
    Buf P = t.make(p0), Bm = t.make(std::vector<float>(n, 0.0f));
    for (uint32_t step = 0; step < 3; ++step) {
      t.set_step(StepScalars{step, 0.05f / static_cast<float>(step + 1), 1.0f, 1.0f});
      Buf G = t.make(normal(n, 80 + step, 0.01f));
      t.cpu->sgd(P.c, G.c, momentum > 0 ? Bm.c : nullptr, n, momentum, 1e-3f);
      t.gpu->sgd(P.g, G.g, momentum > 0 ? Bm.g : nullptr, n, momentum, 1e-3f);
    }
    EXPECT_TRUE(same_bits(t.host_cpu(P), t.host_gpu(P))) << "sgd momentum " << momentum;
  }
}

// Deferred results: the same doubles as reduce() / read_scalar() at the time of each call, in
// call order, across a spill of the device queue (more than its 65,536 doubles before a take),
// while the inputs are overwritten in between; and what the CPU backend queues (to rounding).
TEST(CudaBackend, DeferredResultsEqualImmediateOnesAcrossASpill) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t n = 3 * 1031;  // small: the CPU twin repeats every reduction too
  const std::vector<float> ah = normal(n, 501, 1.0f, 0.1f), bh = normal(n, 502, 2.0f);
  Buf a = t.make(ah), b = t.make(bh);
  std::vector<Reduction> rg, rc;
  for (Reduction::Kind k : {Reduction::dot, Reduction::diff_sq}) {
    rg.push_back(Reduction{k, a.g, b.g, n});
    rc.push_back(Reduction{k, a.c, b.c, n});
  }
  std::vector<double> want;  // immediate results, interleaved as queued
  std::vector<double> want_cpu;
  const int rounds = 33000;  // 3 doubles per round: 99,000 queued, one spill
  for (int r = 0; r < rounds; ++r) {
    if (r % 11000 == 0) {  // overwrite the inputs now and then: queued values must not change
      const std::vector<float> nh = normal(n, 600 + r, 1.0f);
      t.gpu->upload(a.g, nh.data(), nh.size());
      t.cpu->upload(a.c, nh.data(), nh.size());
      double now[2];
      t.gpu->reduce(rg.data(), 2, now);
      want.insert(want.end(), now, now + 2);
      want.push_back(t.gpu->read_scalar(a.g + 7));
      t.cpu->reduce(rc.data(), 2, now);
      want_cpu.insert(want_cpu.end(), now, now + 2);
      want_cpu.push_back(t.cpu->read_scalar(a.c + 7));
    } else {
      want.insert(want.end(), want.end() - 3, want.end());
      want_cpu.insert(want_cpu.end(), want_cpu.end() - 3, want_cpu.end());
    }
    t.gpu->reduce_deferred(rg.data(), 2);
    t.gpu->defer_scalar(a.g + 7);
    t.cpu->reduce_deferred(rc.data(), 2);
    t.cpu->defer_scalar(a.c + 7);
  }
  const std::vector<double> got = t.gpu->take_deferred(), got_cpu = t.cpu->take_deferred();
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got_cpu, want_cpu);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "deferred result " << i;
    if (i % 3 == 2) ASSERT_EQ(got[i], got_cpu[i]) << "scalar " << i;
    else ASSERT_NEAR(got[i], got_cpu[i], 1e-9 * std::fabs(got_cpu[i]) + 1e-300) << "reduction " << i;
  }
  EXPECT_TRUE(t.gpu->take_deferred().empty());
}

TEST(CudaBackend, ReduceAndMomentsMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t sizes[] = {0, 1, 777, 1031 * 97, 3 * 1000 * 1000 + 7};
  std::vector<Buf> as, bs;
  std::vector<std::vector<float>> ah, bh;
  for (int64_t n : sizes) {
    ah.push_back(normal(n, 90 + n, 1.0f, 0.1f));
    bh.push_back(normal(n, 91 + n, 2.0f));
    as.push_back(t.make(ah.back()));
    bs.push_back(t.make(bh.back()));
  }
  std::vector<Reduction> rc, rg;
  for (size_t i = 0; i < as.size(); ++i)
    for (Reduction::Kind k : {Reduction::dot, Reduction::diff_sq}) {
      rc.push_back(Reduction{k, as[i].c, bs[i].c, sizes[i]});
      rg.push_back(Reduction{k, as[i].g, bs[i].g, sizes[i]});
    }
  rc.push_back(Reduction{Reduction::dot, as[3].c, as[3].c, sizes[3]});  // a squared norm
  rg.push_back(Reduction{Reduction::dot, as[3].g, as[3].g, sizes[3]});
  std::vector<double> resc(rc.size()), resg(rg.size()), resg2(rg.size());
  t.cpu->reduce(rc.data(), rc.size(), resc.data());
  t.gpu->reduce(rg.data(), rg.size(), resg.data());
  t.gpu->reduce(rg.data(), rg.size(), resg2.data());
  for (size_t k = 0; k < rc.size(); ++k) {
    const size_t i = k < 2 * as.size() ? k / 2 : 3;
    double s = 0.0;
    for (int64_t j = 0; j < rc[k].n; ++j) {
      const float x = ah[i][j], y = rc[k].b == as[3].c ? ah[3][j] : bh[i][j];
      s += rc[k].kind == Reduction::dot ? std::fabs(dot_term(x, y)) : diff_sq_term(x, y);
    }
    EXPECT_NEAR(resg[k], resc[k], 2.0 * rc[k].n * std::ldexp(s, -53) + 1e-300) << "reduction " << k;
    EXPECT_EQ(resg[k], resg2[k]) << "reduction " << k << " not deterministic";
  }
  for (size_t i = 0; i < as.size(); ++i) {
    double mc[4], mg[4], mg2[4];
    t.cpu->moments(as[i].c, sizes[i], mc);
    t.gpu->moments(as[i].g, sizes[i], mg);
    t.gpu->moments(as[i].g, sizes[i], mg2);
    EXPECT_EQ(mg[0], mc[0]) << "min n=" << sizes[i];
    EXPECT_EQ(mg[1], mc[1]) << "max n=" << sizes[i];
    // Mean: a double sum over n in two orders, divided by n; std: the same on (x - mean)^2,
    // plus the mean's own error propagated (|d std| <= |d mean|).
    double sabs = 0.0, ssq = 0.0;
    for (float x : ah[i]) sabs += std::fabs(x);
    for (float x : ah[i]) ssq += (x - mc[2]) * (x - mc[2]);
    const double nn = std::max<double>(1.0, static_cast<double>(sizes[i]));
    const double tol_mean = 2.0 * nn * std::ldexp(sabs, -53) / nn + 1e-300;
    const double tol_std = tol_mean + 2.0 * nn * std::ldexp(ssq, -53) / nn / std::max(mc[3], 1e-300);
    EXPECT_NEAR(mg[2], mc[2], tol_mean) << "mean n=" << sizes[i];
    EXPECT_NEAR(mg[3], mc[3], tol_std) << "std n=" << sizes[i];
    for (int k = 0; k < 4; ++k) EXPECT_EQ(mg[k], mg2[k]) << "moments not deterministic";
  }
  // A batch of requests (the trainer's 7 shadow sums per arm and more, lengths mixed): each equals
  // the same request reduced alone, bit for bit. (kernels/PERF.md once ran requests of one
  // length fused with this test; it was slower and is not kept, the test is.)
  {
    const Buf& g = as[4];
    const Buf& sh = bs[4];
    const Buf f = t.make(normal(sizes[4], 95, 0.5f));
    const int64_t n = sizes[4];
    std::vector<Reduction> fused = {
        {Reduction::dot, g.g, sh.g, n},  {Reduction::dot, sh.g, sh.g, n},    {Reduction::diff_sq, g.g, sh.g, n},
        {Reduction::dot, g.g, g.g, n},   {Reduction::dot, g.g, f.g, n},      {Reduction::diff_sq, g.g, f.g, n},
        {Reduction::dot, f.g, f.g, n},   {Reduction::diff_sq, sh.g, f.g, n}, {Reduction::dot, sh.g, f.g, n},
        {Reduction::diff_sq, f.g, g.g, n}, {Reduction::dot, f.g, sh.g, n},
        {Reduction::dot, as[3].g, bs[3].g, sizes[3]}, {Reduction::diff_sq, as[3].g, bs[3].g, sizes[3]},
        {Reduction::dot, g.g, f.g, n - 5}};
    std::vector<double> together(fused.size());
    t.gpu->reduce(fused.data(), fused.size(), together.data());
    for (size_t k = 0; k < fused.size(); ++k) {
      double alone = 0.0;
      t.gpu->reduce(&fused[k], 1, &alone);
      EXPECT_EQ(together[k], alone) << "fused reduction " << k;
    }
    EXPECT_NE(together[4], together[13]);  // n - 5: its own group
  }
  // moments_batch (a log step's gains, one read-back): each tensor's moments() bit for bit.
  std::vector<const float*> xs;
  std::vector<size_t> ns;
  for (size_t i = 0; i < as.size(); ++i) {
    xs.push_back(as[i].g);
    ns.push_back(static_cast<size_t>(sizes[i]));
  }
  std::vector<double> mb(4 * xs.size());
  t.gpu->moments_batch(xs.data(), ns.data(), xs.size(), mb.data());
  for (size_t i = 0; i < as.size(); ++i) {
    double m1[4];
    t.gpu->moments(as[i].g, sizes[i], m1);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(mb[4 * i + w], m1[w]) << "moments_batch n=" << sizes[i] << " word " << w;
  }
}

// ---- determinism, lanes and graphs -----------------------------------------------------------

// A step-shaped sequence of ops (all families) on one backend; returns the state after it.
struct MiniStep {
  // kRows is a multiple of the MX block: the wgrad GEMM quantizes along it.
  static constexpr int64_t kRows = 1056, kD = 96, kH = 384;
  Backend& be;
  float *x, *w1, *w2, *gamma, *beta, *y, *xhat, *rstd, *h, *a, *o, *t, *dout, *loss, *gw, *m, *v, *bsum;
  explicit MiniStep(Backend& b) : be(b) {
    x = be.alloc(kRows * kD);
    w1 = be.alloc(kH * kD);
    w2 = be.alloc(kD * kH);
    gamma = be.alloc(kD);
    beta = be.alloc(kD);
    y = be.alloc(kRows * kD);
    xhat = be.alloc(kRows * kD);
    rstd = be.alloc(kRows);
    h = be.alloc(kRows * kH);
    a = be.alloc(kRows * kH);
    o = be.alloc(kRows * kD);
    t = be.alloc(kRows * kD);
    dout = be.alloc(kRows * kD);
    loss = be.alloc(1);
    gw = be.alloc(kD * kH);
    m = be.alloc(kD * kH);
    v = be.alloc(kD * kH);
    bsum = be.alloc(kD);
    const auto w1h = normal(kH * kD, 100, 0.05f), w2h = normal(kD * kH, 101, 0.05f);
    be.upload(w1, w1h.data(), w1h.size());
    be.upload(w2, w2h.data(), w2h.size());
    be.fill(gamma, 1.0f, kD);
    be.fill(beta, 0.0f, kD);
    be.fill(m, 0.0f, kD * kH);
    be.fill(v, 0.0f, kD * kH);
    be.reset_stats(2);
  }
  GemmOperand op(const float* p, bool kc, int slot) const {
    GemmOperand g;
    g.p = p;
    g.k_contiguous = kc;
    g.q.fmt = NumFmt::mxfp8_e4m3;
    g.round_bf16_first = true;
    g.stats_slot = slot;
    g.stats_q = g.q;
    return g;
  }
  // The ops of one step; lanes exercise fork/join (lane 1: targets, lane 2: LN + forward).
  void ops(bool use_lanes) {
    const ElementwiseRound r = kBf16Even;
    if (use_lanes) be.set_lane(1);
    be.randn(t, kRows * kD, 5, Stream::label_noise, 1.0f);
    if (use_lanes) be.set_lane(2);
    be.randn(x, kRows * kD, 5, Stream::data, 1.0f);
    be.layernorm_fwd(x, gamma, beta, y, xhat, rstd, kRows, kD, 1e-5f, r);
    be.gemm(kRows, kH, kD, op(y, true, 0), op(w1, true, -1), h, 0.0f, r);
    be.act_fwd(Act::gelu, h, a, kRows, kH, r, kFp32);
    be.gemm(kRows, kD, kH, op(a, true, 1), op(w2, true, -1), o, 0.0f, r);
    be.residual_add(o, o, x, beta, kRows, kD, r, kFp32);
    if (use_lanes) be.join();
    be.loss_mse(o, t, dout, loss, nullptr, kRows, kD, r);
    be.gemm(kD, kH, kRows, op(dout, false, -1), op(a, false, -1), gw, 0.0f, kFp32);
    be.col_sum(dout, bsum, kRows, kD);
    be.adam(w2, gw, m, v, kD * kH, Backend::AdamHyper{});
  }
  std::vector<float> state() {
    std::vector<float> s;
    for (auto [p, n] : {std::pair<float*, int64_t>{w2, kD * kH}, {m, kD * kH}, {v, kD * kH}, {loss, 1},
                        {bsum, kD}, {xhat, kRows * kD}}) {
      std::vector<float> part(n);
      be.download(part.data(), p, n);
      s.insert(s.end(), part.begin(), part.end());
    }
    return s;
  }
};

StepScalars step_scalars(uint32_t step) {
  return StepScalars{step, 1e-3f * static_cast<float>(step + 1), 1.0f - std::pow(0.9f, static_cast<float>(step + 1)),
                     1.0f - std::pow(0.999f, static_cast<float>(step + 1))};
}

TEST(CudaBackend, RepeatedRunsAreBitIdentical) {
  MXLAB_REQUIRE_GPU();
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    auto be = make_cuda_backend(0);
    MiniStep s(*be);
    for (uint32_t step = 0; step < 3; ++step) {
      be->set_step(step_scalars(step));
      s.ops(run == 1);  // the second run also spreads work over lanes
    }
    runs.push_back(s.state());
  }
  EXPECT_TRUE(same_bits(runs[0], runs[1]));
}

TEST(CudaBackend, GraphReplayEqualsEager) {
  MXLAB_REQUIRE_GPU();
  auto eager = make_cuda_backend(0), graph = make_cuda_backend(0);
  MiniStep se(*eager), sg(*graph);
  constexpr int kKey = 7;
  int replays = 0;
  for (uint32_t step = 0; step < 5; ++step) {
    eager->set_step(step_scalars(step));
    se.ops(false);
    graph->set_step(step_scalars(step));
    if (graph->replay(kKey)) {
      ++replays;
    } else {
      const bool rec = graph->begin_capture(kKey);
      EXPECT_EQ(rec, step == 1) << "step 0 runs eagerly, step 1 records";
      sg.ops(true);
      graph->end_capture(kKey);
      if (rec) EXPECT_TRUE(graph->replay(kKey));
    }
    EXPECT_TRUE(same_bits(se.state(), sg.state())) << "step " << step;
  }
  // Step 0 runs eagerly (sizing), step 1 records and runs the graph, steps 2-4 replay it.
  EXPECT_EQ(replays, 3);
  // Synchronising calls are refused inside a captured region, with a message.
  EXPECT_FALSE(graph->begin_capture(kKey + 1));  // eager
  graph->end_capture(kKey + 1);
  EXPECT_TRUE(graph->begin_capture(kKey + 1));  // recording
  float v = 0.0f;
  EXPECT_THROW(graph->download(&v, sg.loss, 1), Error);
  graph->end_capture(kKey + 1);
}

// ---- attention blocks and RMS/MX norms ----------------------------------------
// Compared as the header says: the batched GEMM like the GEMM (bit-identical quantized
// operands, accumulation-order tolerance; statistics equal), RMSNorm/MXNorm and softmax like
// layernorm (row sums in double in another order: >= 99% of rows bit-exact, every element
// within 4 ulps; the softmax row maximum and MXNorm's block absmaxes are exact), scale_cols and
// the heads copies bit-exact.

TEST(CudaBackend, GemmBatchedMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t batch = 6, M = 33, N = 40, K = 64;  // K a multiple of the block: blocks stay in an item
  const auto av = normal(batch * M * K, 40), bv = normal(batch * N * K, 41, 0.5f);
  Buf A = t.make(av), B = t.make(bv), C = t.poisoned(batch * M * N);
  t.set_step(StepScalars{3, 0.0f, 1.0f, 1.0f});
  for (NumFmt f : {NumFmt::fp32, NumFmt::mxfp8_e4m3, NumFmt::mxfp4_e2m1}) {
    for (Rounding rounding : {Rounding::nearest_even, Rounding::stochastic}) {
      if (!is_mx(f) && rounding == Rounding::stochastic) continue;
      for (int layout = 0; layout < 4; ++layout) {
        const bool ak = layout & 1, bk = layout & 2;
        GemmOperand a;
        a.k_contiguous = ak;
        a.q.fmt = f;
        a.q.rounding = rounding;
        a.q.seed = 77;
        a.round_bf16_first = is_mx(f);
        a.stats_slot = is_mx(f) ? 0 : -1;
        a.stats_q = a.q;
        a.sr_op = 5;
        GemmOperand b = a;
        b.k_contiguous = bk;
        b.stats_slot = is_mx(f) ? 1 : -1;
        b.sr_op = 6;
        t.cpu->reset_stats(2);
        t.gpu->reset_stats(2);
        t.poison(C);
        GemmOperand ag = a, bg = b, ac = a, bc = b;
        ag.p = A.g, bg.p = B.g, ac.p = A.c, bc.p = B.c;
        t.gpu->gemm_batched(batch, M, N, K, ag, bg, C.g, 0.0f, kBf16Even);
        t.cpu->gemm_batched(batch, M, N, K, ac, bc, C.c, 0.0f, kBf16Even);
        const auto ref = t.host_cpu(C), got = t.host_gpu(C);
        // Tolerance from the quantized stacked operands (the CPU quantizer, as the backends use it).
        auto quantized = [&](std::vector<float> v, const GemmOperand& op, int64_t rows) {
          if (op.round_bf16_first)
            for (float& x : v) x = round_bf16(x, Rounding::nearest_even);
          QuantSpec q = op.q;
          q.seed = sr_seed(q.seed, op.sr_op);
          q.salt = 3;
          const int64_t sr = op.k_contiguous ? batch * rows : batch * K, sc = op.k_contiguous ? K : rows;
          quantize_dequantize(v.data(), v.data(), sr, sc, op.k_contiguous ? Axis::contiguous : Axis::strided, q);
          return v;
        };
        const auto aq = quantized(av, a, M), bq = quantized(bv, b, N);
        std::vector<double> tol(ref.size());
        for (int64_t i = 0; i < batch; ++i)
          for (int64_t r = 0; r < M; ++r)
            for (int64_t c = 0; c < N; ++c) {
              double s = 0.0;
              for (int64_t k = 0; k < K; ++k) {
                const float x = aq[i * M * K + (ak ? r * K + k : k * M + r)];
                const float y = bq[i * N * K + (bk ? c * K + k : k * N + c)];
                s += std::fabs(static_cast<double>(x) * y);
              }
              const size_t o = static_cast<size_t>((i * M + r) * N + c);
              tol[o] = 2.0 * K * std::ldexp(s, -24) + ulp(ref[o], 7);
            }
        EXPECT_TRUE(within(ref, got, tol)) << name(f) << " " << name(rounding) << " layout " << layout;
        if (is_mx(f)) {
          const auto sc = t.cpu->read_stats(), sg = t.gpu->read_stats();
          for (int s = 0; s < 2; ++s) {
            EXPECT_EQ(sc[s].n, sg[s].n) << name(f);
            EXPECT_EQ(sc[s].lastbin, sg[s].lastbin) << name(f);
            EXPECT_EQ(sc[s].clamped, sg[s].clamped) << name(f);
          }
        }
      }
    }
  }
}

TEST(CudaBackend, RmsNormAndMxNormMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 1031;
  for (int64_t d : {int64_t{96}, int64_t{776}}) {  // 776: a final partial MXNorm block
    const auto x = normal(rows * d, 50 + d, 2.0f, 0.5f), dy = normal(rows * d, 51, 0.01f);
    const auto gm = normal(d, 52, 0.2f, 1.0f);
    Buf X = t.make(x), DY = t.make(dy), G = t.make(gm);
    Buf Y = t.poisoned(rows * d), H = t.poisoned(rows * d), R = t.poisoned(rows);
    Buf DX = t.poisoned(rows * d), DG = t.poisoned(d);
    for (const Backend::RmsEstimate est : {Backend::RmsEstimate{}, Backend::RmsEstimate{32, 2, 0.4185f},
                                           Backend::RmsEstimate{16, 1, 0.4814f}}) {
      for (const ElementwiseRound& r : {kFp32, kBf16Even}) {
        for (bool affine : {true, false}) {
          t.poison(Y);
          t.poison(H);
          t.poison(R);
          t.cpu->rmsnorm_fwd(X.c, affine ? G.c : nullptr, Y.c, H.c, R.c, rows, d, 1e-5f, est, r);
          t.gpu->rmsnorm_fwd(X.g, affine ? G.g : nullptr, Y.g, H.g, R.g, rows, d, 1e-5f, est, r);
          const std::string what =
              msg("d=", d, " block=", est.block, " p=", est.p, r.bf16 ? " bf16" : " fp32", affine ? " affine" : "");
          expect_rows_nearly_exact(t.host_cpu(Y), t.host_gpu(Y), rows, d, r.bf16, (what + " y").c_str());
          expect_rows_nearly_exact(t.host_cpu(H), t.host_gpu(H), rows, d, r.bf16, (what + " xhat").c_str());
          expect_rows_nearly_exact(t.host_cpu(R), t.host_gpu(R), rows, 1, r.bf16, (what + " rstd").c_str());
          // Backward from the CPU's forward outputs on both sides.
          const auto xh = t.host_cpu(H), rs = t.host_cpu(R);
          t.gpu->upload(H.g, xh.data(), xh.size());
          t.gpu->upload(R.g, rs.data(), rs.size());
          t.poison(DX);
          t.poison(DG);
          t.cpu->rmsnorm_bwd(DY.c, H.c, R.c, affine ? G.c : nullptr, DX.c, DG.c, rows, d, r);
          t.gpu->rmsnorm_bwd(DY.g, H.g, R.g, affine ? G.g : nullptr, DX.g, DG.g, rows, d, r);
          expect_rows_nearly_exact(t.host_cpu(DX), t.host_gpu(DX), rows, d, r.bf16, (what + " dx").c_str());
          const auto dgc = t.host_cpu(DG);
          std::vector<double> tg(d);
          for (int64_t j = 0; j < d; ++j) {
            double sg = 0.0;
            for (int64_t i = 0; i < rows; ++i) sg += std::fabs(static_cast<double>(dy[i * d + j]) * xh[i * d + j]);
            tg[j] = sum_tol(rows, sg, dgc[j]);
          }
          EXPECT_TRUE(within(dgc, t.host_gpu(DG), tg)) << what << " dgamma";
        }
      }
    }
  }
}

TEST(CudaBackend, SoftmaxMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 517;
  for (int64_t n : {int64_t{37}, int64_t{300}}) {
    const auto l = normal(rows * n, 60 + n, 3.0f), dp = normal(rows * n, 61, 0.1f);
    Buf L = t.make(l), DP = t.make(dp), P = t.poisoned(rows * n), M = t.poisoned(rows), DL = t.poisoned(rows * n);
    for (const ElementwiseRound& r : {kFp32, kBf16Even, kBf16Away}) {
      t.poison(P);
      t.poison(M);
      t.cpu->softmax_fwd(L.c, P.c, M.c, rows, n, 0.125f, r);
      t.gpu->softmax_fwd(L.g, P.g, M.g, rows, n, 0.125f, r);
      const std::string what = msg("n=", n, r.bf16 ? " bf16" : " fp32");
      expect_rows_nearly_exact(t.host_cpu(P), t.host_gpu(P), rows, n, r.bf16, (what + " probs").c_str());
      EXPECT_TRUE(same_bits(t.host_cpu(M), t.host_gpu(M))) << what << " rowmax";
      // Backward from the CPU's probabilities on both sides; in place over dP on the GPU.
      const auto pc = t.host_cpu(P);
      t.gpu->upload(P.g, pc.data(), pc.size());
      t.poison(DL);
      t.cpu->softmax_bwd(P.c, DP.c, DL.c, rows, n, 0.125f, r);
      Buf DP2 = t.make(dp);
      t.gpu->softmax_bwd(P.g, DP2.g, DP2.g, rows, n, 0.125f, r);
      expect_rows_nearly_exact(t.host_cpu(DL), t.host_gpu(DP2), rows, n, r.bf16, (what + " dlogits").c_str());
    }
    // In place forward (probs == logits) gives the same as out of place.
    Buf L2 = t.make(l);
    t.gpu->softmax_fwd(L2.g, L2.g, M.g, rows, n, 0.125f, kFp32);
    t.gpu->softmax_fwd(L.g, P.g, M.g, rows, n, 0.125f, kFp32);
    EXPECT_TRUE(same_bits(t.host_gpu(P), t.host_gpu(L2))) << "in place n=" << n;
  }
}

TEST(CudaBackend, ScaleColsAndHeadsCopiesMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  const int64_t rows = 301, cols = 77;
  const auto x = normal(rows * cols, 70), g = normal(cols, 71, 0.5f, 1.0f);
  Buf X = t.make(x), G = t.make(g), O = t.poisoned(rows * cols);
  for (const ElementwiseRound& r : {kFp32, kBf16Even, kBf16Away}) {
    t.poison(O);
    t.cpu->scale_cols(X.c, G.c, O.c, rows, cols, r);
    t.gpu->scale_cols(X.g, G.g, O.g, rows, cols, r);
    EXPECT_TRUE(same_bits(t.host_cpu(O), t.host_gpu(O))) << "scale_cols";
  }
  const int64_t nb = 5, S = 13, h = 3, dh = 24, ld = 3 * h * dh;
  const auto q = normal(nb * S * ld, 72);
  Buf Q = t.make(q), Hh = t.poisoned(nb * h * S * dh), Back = t.make(std::vector<float>(nb * S * ld, 0.0f));
  for (int64_t col0 : {int64_t{0}, h * dh, 2 * h * dh}) {
    t.poison(Hh);
    t.cpu->heads_split(Q.c, Hh.c, nb, S, h, dh, ld, col0);
    t.gpu->heads_split(Q.g, Hh.g, nb, S, h, dh, ld, col0);
    EXPECT_TRUE(same_bits(t.host_cpu(Hh), t.host_gpu(Hh))) << "split col0 " << col0;
    t.cpu->heads_merge(Hh.c, Back.c, nb, S, h, dh, ld, col0);
    t.gpu->heads_merge(Hh.g, Back.g, nb, S, h, dh, ld, col0);
  }
  EXPECT_TRUE(same_bits(q, t.host_gpu(Back))) << "merge(split(x)) == x";
  EXPECT_TRUE(same_bits(q, t.host_cpu(Back)));
}

}  // namespace
}  // namespace mxlab
