// The stability-instrument ops of the CPU backend (backend.h, "stability instruments") on
// tiny inputs: exact hand-worked values where the arithmetic is exact (linear/relu tangents,
// the layernorm affine tangent, col_dot, axpby, mul, preconditioner, the quantization gap of a
// gamma-like block that clamps), and independent double-precision derivatives otherwise (the
// activations' second derivatives and the layernorm / KL tangents against central differences
// of double reimplementations of the ops they differentiate).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/instrument_elementwise.h"
#include "lab/model/mlp.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"
#include "tests/cpu/model_reference.h"

using namespace mxlab;
using namespace mxlab::test;

namespace {

struct Host {
  std::unique_ptr<Backend> be = make_cpu_backend();
  float* put(const std::vector<float>& v) { return test::put(*be, v); }
  std::vector<float> get(const float* p, size_t n) {
    std::vector<float> v(n);
    be->download(v.data(), p, n);
    return v;
  }
};

double central(double (*f)(double), double x) {
  const double h = 1e-5;
  return (f(x + h) - f(x - h)) / (2 * h);
}

}  // namespace

TEST(InstrumentOps, SecondDerivativesMatchCentralDifferencesOfTheFirst) {
  // det_* are within 1.5 ulp; the formulas chain a few float operations: 1e-5 relative to
  // the scale of the derivative (about 1) bounds them; central differences in double are
  // accurate to ~1e-10 at h = 1e-5.
  for (float x : {-4.0f, -2.5f, -1.0f, -0.3f, 0.0f, 0.2f, 0.7f, 1.5f, 3.0f}) {
    const double g2 = central([](double v) { return act1_d(Act::gelu, v); }, x);
    const double t2 = central([](double v) { return act1_d(Act::gelu_tanh, v); }, x);
    const double s2 = central(silu1_d, x);
    EXPECT_NEAR(act_deriv2(Act::gelu, x), g2, 1e-5) << x;
    EXPECT_NEAR(act_deriv2(Act::gelu_tanh, x), t2, 1e-5) << x;
    EXPECT_NEAR(silu_deriv2(x), s2, 1e-5) << x;
    EXPECT_EQ(act_deriv2(Act::relu, x), 0.0f);
    EXPECT_EQ(act_deriv2(Act::linear, x), 0.0f);
  }
}

TEST(InstrumentOps, ActivationTangentsHandWorked) {
  Host h;
  const std::vector<float> hv = {-1.5f, 0.5f, 2.0f, -0.25f}, rh = {3.0f, -2.0f, 0.5f, 8.0f};
  const std::vector<float> da = {0.5f, 4.0f, -1.0f, 2.0f}, rda = {1.0f, 0.25f, 2.0f, -3.0f};
  float *H = h.put(hv), *RH = h.put(rh), *DA = h.put(da), *RDA = h.put(rda), *O = h.be->alloc(4);
  // relu: R{a} = [h > 0] rh, R{dh} = [h > 0] rda (relu'' = 0).
  h.be->act_jvp(Act::relu, H, RH, O, 1, 4);
  EXPECT_EQ(h.get(O, 4), (std::vector<float>{0.0f, -2.0f, 0.5f, 0.0f}));
  h.be->act_bwd_tangent(Act::relu, H, RH, DA, RDA, O, 1, 4);
  EXPECT_EQ(h.get(O, 4), (std::vector<float>{0.0f, 0.25f, 2.0f, -0.0f}));
  h.be->act_jvp(Act::linear, H, RH, O, 2, 2);
  EXPECT_EQ(h.get(O, 4), rh);
  h.be->act_bwd_tangent(Act::linear, H, RH, DA, RDA, O, 2, 2);
  EXPECT_EQ(h.get(O, 4), rda);
  // The forward tangent is act_bwd's expression without rounding: the same bits.
  const auto big = noise(300, 1, 2.0f), rbig = noise(300, 2);
  float *B = h.put(big), *RB = h.put(rbig), *O1 = h.be->alloc(300), *O2 = h.be->alloc(300);
  for (Act a : {Act::relu, Act::gelu, Act::gelu_tanh, Act::linear}) {
    h.be->act_jvp(a, B, RB, O1, 10, 30);
    h.be->act_bwd(a, B, RB, O2, 10, 30, ElementwiseRound{}, ElementwiseRound{}, ElementwiseRound{});
    EXPECT_EQ(h.get(O1, 300), h.get(O2, 300)) << static_cast<int>(a);
  }
  // swiglu, one (u, g) pair: R{a} = ru silu(g) + u silu'(g) rg; the backward tangent against
  // the double formulas of the derivation.
  const float u = 0.75f, g = -0.5f, ru = 0.5f, rg = 2.0f, d = 1.25f, rd = -0.5f;
  float *SH = h.put({u, g}), *SR = h.put({ru, rg}), *SD = h.put({d}), *SRD = h.put({rd}), *SO = h.be->alloc(2);
  const double s1 = silu1_d(g), s2 = central(silu1_d, g);
  h.be->act_jvp(Act::swiglu, SH, SR, SO, 1, 1);
  EXPECT_NEAR(h.get(SO, 1)[0], ru * silu_d(g) + u * s1 * rg, 1e-6);
  h.be->act_bwd_tangent(Act::swiglu, SH, SR, SD, SRD, SO, 1, 1);
  const auto o = h.get(SO, 2);
  EXPECT_NEAR(o[0], rd * silu_d(g) + d * s1 * rg, 1e-6);
  EXPECT_NEAR(o[1], (rd * u + d * ru) * s1 + d * u * s2 * rg, 1e-6);
}

TEST(InstrumentOps, LayernormAffineTangentHandWorked) {
  Host h;
  // ry = (rxhat gamma + xhat vgamma) + vbeta = (1*3 + 2*0.5) + 0.25 = 4.25 (all exact).
  float *RX = h.put({1.0f, -1.0f}), *XH = h.put({2.0f, 4.0f}), *G = h.put({3.0f}), *VG = h.put({0.5f}),
        *VB = h.put({0.25f}), *RY = h.be->alloc(2);
  h.be->ln_affine_tangent(RX, XH, G, VG, VB, RY, 2, 1);
  EXPECT_EQ(h.get(RY, 2), (std::vector<float>{4.25f, -0.75f}));
  h.be->ln_affine_tangent(nullptr, XH, G, VG, VB, RY, 2, 1);  // rxhat = 0: xhat vgamma + vbeta
  EXPECT_EQ(h.get(RY, 2), (std::vector<float>{1.25f, 2.25f}));
}

namespace {
// layernorm_bwd's dx in double from the layernorm input x (forward recomputed), for central
// differences along (rx, rdy, vgamma).
std::vector<double> ln_dx_d(const std::vector<double>& x, const std::vector<double>& dy, const std::vector<double>* gamma,
                            int64_t rows, int64_t d, double eps) {
  std::vector<double> dx(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += x[i * d + j] / d;
    for (int64_t j = 0; j < d; ++j) var += (x[i * d + j] - mean) * (x[i * d + j] - mean) / d;
    const double r = 1 / std::sqrt(var + eps);
    double mg = 0, mgx = 0;
    std::vector<double> g(d), xh(d);
    for (int64_t j = 0; j < d; ++j) {
      xh[j] = (x[i * d + j] - mean) * r;
      g[j] = gamma ? dy[i * d + j] * (*gamma)[j] : dy[i * d + j];
      mg += g[j] / d;
      mgx += g[j] * xh[j] / d;
    }
    for (int64_t j = 0; j < d; ++j) dx[i * d + j] = r * (g[j] - mg - xh[j] * mgx);
  }
  return dx;
}
}  // namespace

TEST(InstrumentOps, LayernormBackwardTangentIsTheDirectionalDerivative) {
  Host h;
  const int64_t rows = 3, d = 7;
  const float eps = 1e-5f;
  const auto x = noise(rows * d, 11, 1.5f, 0.3f), dy = noise(rows * d, 12), rx = noise(rows * d, 13);
  const auto rdy = noise(rows * d, 14), gamma = noise(d, 15, 0.3f, 1.0f), vgamma = noise(d, 16);
  float *X = h.put(x), *DY = h.put(dy), *RX = h.put(rx), *RDY = h.put(rdy), *G = h.put(gamma), *VG = h.put(vgamma);
  float *Y = h.be->alloc(rows * d), *XH = h.be->alloc(rows * d), *RS = h.be->alloc(rows);
  float *RXH = h.be->alloc(rows * d), *RDX = h.be->alloc(rows * d);
  h.be->layernorm_fwd(X, nullptr, nullptr, Y, XH, RS, rows, d, eps, ElementwiseRound{});
  h.be->layernorm_bwd(RX, XH, RS, nullptr, RXH, nullptr, nullptr, rows, d, ElementwiseRound{},
                      ElementwiseRound{});  // R{xhat} = J rx
  for (bool affine : {false, true}) {
    SCOPED_TRACE(affine ? "affine" : "no affine");
    h.be->layernorm_bwd_tangent(DY, RDY, XH, RXH, RX, RS, affine ? G : nullptr, affine ? VG : nullptr, RDX, rows, d);
    const auto got = h.get(RDX, rows * d);
    const double step = 1e-6;
    auto at = [&](double e) {
      std::vector<double> xe(x.size()), dye(x.size()), ge(d);
      for (size_t i = 0; i < x.size(); ++i) {
        xe[i] = x[i] + e * rx[i];
        dye[i] = dy[i] + e * rdy[i];
      }
      for (int64_t j = 0; j < d; ++j) ge[j] = gamma[j] + e * vgamma[j];
      return ln_dx_d(xe, dye, affine ? &ge : nullptr, rows, d, eps);
    };
    const auto p = at(step), m = at(-step);
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double want = (p[i] - m[i]) / (2 * step);
      num += (got[i] - want) * (got[i] - want);
      den += want * want;
    }
    // FP32 row means and products over d = 7 terms: ~1e-6 relative.
    EXPECT_LT(std::sqrt(num / den), 1e-5);
    EXPECT_GT(den, 0.0);
  }
}

TEST(InstrumentOps, ColDotAxpbyMulHandWorked) {
  Host h;
  float *A = h.put({1, 2, 3, 4}), *B = h.put({5, 6, 7, 8}), *O = h.be->alloc(2);
  h.be->col_dot(A, B, O, 2, 2);  // [1*5 + 3*7, 2*6 + 4*8]
  EXPECT_EQ(h.get(O, 2), (std::vector<float>{26.0f, 44.0f}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float* Y = h.put({1.0f, nan, 3.0f});
  float* X = h.put({2.0f, 4.0f, -1.0f});
  h.be->axpby(Y, X, 0.5f, 0.0f, 3);  // b == 0 ignores y, NaN included
  EXPECT_EQ(h.get(Y, 3), (std::vector<float>{1.0f, 2.0f, -0.5f}));
  h.be->axpby(Y, X, -2.0f, 3.0f, 3);  // 3 y - 2 x
  EXPECT_EQ(h.get(Y, 3), (std::vector<float>{-1.0f, -2.0f, 0.5f}));
  h.be->mul(Y, Y, X, 3);
  EXPECT_EQ(h.get(Y, 3), (std::vector<float>{-2.0f, -8.0f, -0.5f}));
}

TEST(InstrumentOps, PreconditionerIsAdamsDenominator) {
  Host h;
  // v / bc2 = 4 -> sqrt = 2 -> 1/sqrt(2 + 0); v = 0 -> 1/sqrt(eps).
  float *V = h.put({2.0f, 0.0f, 8.0f}), *O = h.be->alloc(3);
  h.be->precond_isqrt(V, O, 3, 0.5f, 0.0f);
  const auto o = h.get(O, 3);
  EXPECT_EQ(o[0], 1.0f / std::sqrt(2.0f));
  EXPECT_EQ(o[2], 0.5f);  // v/bc2 = 16, sqrt 4, 1/sqrt(4)
  h.be->precond_isqrt(V, O, 3, 0.5f, 1e-8f);
  EXPECT_FLOAT_EQ(h.get(O, 3)[1], 1e4f);
}

TEST(InstrumentOps, KlTangentIsTheSoftmaxHessian) {
  Host h;
  const int64_t rows = 3, d = 5;
  const float T = 1.5f;
  const auto out = noise(rows * d, 21, 2.0f), rout = noise(rows * d, 22);
  float *OUT = h.put(out), *ROUT = h.put(rout), *R = h.be->alloc(rows * d);
  h.be->loss_kl_tangent(OUT, ROUT, R, rows, d, T);
  const auto got = h.get(R, rows * d);
  // H_out = (diag(q) - q q^T) / (T^2 rows) per row, q = softmax(out / T), in double.
  for (int64_t i = 0; i < rows; ++i) {
    double m = -INFINITY, s = 0, qr = 0;
    std::vector<double> q(d);
    for (int64_t j = 0; j < d; ++j) m = std::max(m, out[i * d + j] / static_cast<double>(T));
    for (int64_t j = 0; j < d; ++j) s += std::exp(out[i * d + j] / static_cast<double>(T) - m);
    for (int64_t j = 0; j < d; ++j) {
      q[j] = std::exp(out[i * d + j] / static_cast<double>(T) - m) / s;
      qr += q[j] * rout[i * d + j];
    }
    for (int64_t j = 0; j < d; ++j) {
      const double want = q[j] * (rout[i * d + j] - qr) / (static_cast<double>(T) * T * rows);
      EXPECT_NEAR(got[i * d + j], want, 1e-6 * (std::fabs(q[j] * rout[i * d + j]) + std::fabs(q[j] * qr)) + 1e-12)
          << i << "," << j;
    }
  }
}

TEST(InstrumentOps, QuantGapOfAGammaBlockThatClamps) {
  Host h;
  // 32 gamma-like values in [0.88, 0.90]: amax 0.9 -> floor(log2 0.9) = -1, MXFP8 E4M3 floor
  // scale 2^(-1-8) = 2^-9, largest value 448 * 2^-9 = 0.875 < every element: all clamp.
  std::vector<float> g(32);
  for (int i = 0; i < 32; ++i) g[i] = 0.88f + 0.02f * static_cast<float>(i) / 31.0f;
  QuantSpec q;
  q.fmt = NumFmt::mxfp8_e4m3;
  q.block = 32;
  q.rule = ScaleRule::floor;
  const Backend::QuantGap r = h.be->quant_gap(h.put(g), 1, 32, Axis::contiguous, q, false, Rounding::nearest_even);
  double sum = 0, mx = 0;
  for (float v : g) {
    const double rel = (static_cast<double>(v) - 0.875) / static_cast<double>(v);
    sum += rel;
    mx = std::max(mx, rel);
  }
  EXPECT_EQ(r.n, 32u);
  EXPECT_EQ(r.above, 32u);
  EXPECT_EQ(r.nonfinite, 0u);
  EXPECT_EQ(r.sum_rel, sum);  // one chunk, index order: the same double sum
  EXPECT_EQ(r.max_rel, mx);
  EXPECT_NEAR(r.max_rel, 0.025 / 0.9, 1e-7);
  EXPECT_EQ(r.above_frac(), 1.0);
  // The model's statistics count the same elements as clamped.
  EXPECT_EQ(mx_stats(g.data(), 1, 32, Axis::contiguous, q).clamped, 32u);
}

TEST(InstrumentOps, QuantGapExactZeroNonfiniteStridedAndBf16First) {
  Host h;
  QuantSpec q;
  q.fmt = NumFmt::mxfp8_e4m3;
  q.block = 4;
  const float inf = std::numeric_limits<float>::infinity();
  // Block 0: exactly representable values and a zero (rel 0, no clamp); block 1: 1.1 at the
  // top of its binade under floor is below 448*2^-8 = 1.75: 1.1 rounds to 1.125 (rel 0.0227);
  // block 2: Inf -> the quantizer makes it NaN: counted as nonfinite only.
  const std::vector<float> x = {0.5f, -0.25f, 0.0f, 1.0f, 1.1f, 0.0f, 0.0f, 0.0f, inf, 1.0f, 2.0f, 3.0f};
  Backend::QuantGap r = h.be->quant_gap(h.put(x), 1, 12, Axis::contiguous, q, false, Rounding::nearest_even);
  EXPECT_EQ(r.n, 8u);
  EXPECT_EQ(r.nonfinite, 4u);
  EXPECT_EQ(r.above, 0u);
  const double rel = (1.125 - static_cast<double>(1.1f)) / static_cast<double>(1.1f);
  EXPECT_EQ(r.sum_rel, rel);
  EXPECT_EQ(r.max_rel, rel);
  // The same values stored as a column (rows 12, cols 1) and blocks down the column: same gap.
  const Backend::QuantGap c = h.be->quant_gap(h.put(x), 12, 1, Axis::strided, q, false, Rounding::nearest_even);
  EXPECT_EQ(c.sum_rel, r.sum_rel);
  EXPECT_EQ(c.nonfinite, r.nonfinite);
  // bf16 first: 1 + 2^-9 rounds to 1 in bf16, then to 1 in E4M3 (rel = 2^-9 / (1 + 2^-9)).
  const float v = 1.0f + std::ldexp(1.0f, -9);
  const Backend::QuantGap b = h.be->quant_gap(h.put({v, 0.5f, 0.5f, 0.5f}), 1, 4, Axis::contiguous, q, true,
                                              Rounding::nearest_even);
  EXPECT_EQ(b.max_rel, (static_cast<double>(v) - 1.0) / static_cast<double>(v));
  // A scalar format: bf16 rounding of 1 + 2^-9 gives the same gap; nothing clamps.
  QuantSpec bf;
  bf.fmt = NumFmt::bf16;
  const Backend::QuantGap s = h.be->quant_gap(h.put({v}), 1, 1, Axis::contiguous, bf, false, Rounding::nearest_even);
  EXPECT_EQ(s.max_rel, b.max_rel);
  EXPECT_EQ(s.above, 0u);
  QuantSpec bad = q;
  bad.block = 0;
  // Configuration admits only positive block sizes; a caller that bypasses it meets an internal check.
  EXPECT_THROW(h.be->quant_gap(h.put({v}), 1, 1, Axis::contiguous, bad, false, Rounding::nearest_even),
               std::logic_error);
}

// The gap is measured on what the quantizer makes of the tensor. Blocks whose scale is NaN (the
// rule's exponent beyond E8M0) are all NaN after quantization, so their elements count in
// `nonfinite` only, as a block holding NaN/Inf does; an element the quantizer makes +-Inf (its
// dequantized value reaches 2^128) likewise; the rest of the tensor is measured as usual.
TEST(InstrumentOps, QuantGapOfBlocksWithoutAScaleIsWhatTheQuantizerDoes) {
  Host h;
  const float big = std::numeric_limits<float>::max();
  struct Case {
    NumFmt fmt;
    ScaleRule rule;
    std::vector<float> x;  // two blocks of 4
    uint64_t nonfinite;    // what the quantizer makes non-finite, worked by hand
  };
  const std::vector<Case> cases = {
      // int8, ceil: ceil(log2 FLT_MAX) - 0 = 128 > 127: no E8M0 scale, block 0 all NaN.
      {NumFmt::mxint8, ScaleRule::ceil, {big, 1.0f, -2.0f, 0.5f, 1.1f, -0.3f, 0.7f, 0.0f}, 4},
      // int8, rceil: FLT_MAX * 64/127 rounds up to 2^128: NaN, block 1 this time.
      {NumFmt::mxint8, ScaleRule::rceil, {1.1f, -0.3f, 0.7f, 0.0f, -big, 1.0f, 2.0f, 3.0f}, 4},
      // E4M3, even: FLT_MAX rounded to 3 mantissa bits is 2^128, exponent 128: NaN.
      {NumFmt::mxfp8_e4m3, ScaleRule::even, {big, 1e38f, -2.0f, 0.5f, 1.1f, -0.3f, 0.7f, 0.0f}, 4},
      // E5M2, rceil: s = 113 is valid; 3.33e38 / 2^113 rounds to 2^15, 2^128: +Inf, that element
      // only (1e38 -> 5 2^124, 2^126 exact, 1 -> 0).
      {NumFmt::mxfp8_e5m2, ScaleRule::rceil, {3.33e38f, 1e38f, 0x1p126f, 1.0f, 1.1f, -0.3f, 0.7f, 0.0f}, 1},
  };
  for (const Case& c : cases) {
    QuantSpec q;
    q.fmt = c.fmt;
    q.block = 4;
    q.rule = c.rule;
    std::vector<float> y(c.x.size());
    QuantStats st;
    quantize_dequantize(c.x.data(), y.data(), 1, 8, Axis::contiguous, q, &st);
    uint64_t nonfinite = 0;
    double sum = 0, mx = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      if (!std::isfinite(y[i])) {
        ++nonfinite;
        continue;
      }
      const double rel = quant_gap_rel(c.x[i], y[i]);
      sum += rel;
      mx = std::max(mx, rel);
    }
    const std::string what = std::string(name(c.fmt)) + " " + name(c.rule);
    ASSERT_EQ(nonfinite, c.nonfinite) << what << ": the quantizer";
    const Backend::QuantGap r = h.be->quant_gap(h.put(c.x), 1, 8, Axis::contiguous, q, false, Rounding::nearest_even);
    EXPECT_EQ(r.nonfinite, c.nonfinite) << what;
    EXPECT_EQ(r.n, 8u - c.nonfinite) << what;
    EXPECT_EQ(r.sum_rel, sum) << what;
    EXPECT_EQ(r.max_rel, mx) << what;
    EXPECT_EQ(r.above, st.clamped) << what;
    EXPECT_TRUE(std::isfinite(r.sum_rel) && std::isfinite(r.max_rel)) << what;
  }
}

// The gap's every field from the quantizer's output, on tensors at the top of the float32 range
// (NaN-scale blocks, +-Inf elements, clamps) and ordinary ones, every MX format, rule, rounding,
// axis and bf16-first: n and nonfinite split by finiteness of x and Q, sum_rel / max_rel over the
// rest in the fixed chunk order, above = the quantizer's clamped count.
TEST(InstrumentOps, QuantGapEqualsTheQuantizersOutputAtTheTopOfTheRange) {
  Host h;
  const uint32_t step = 11;
  h.be->set_step(StepScalars{step, 0.0f, 1.0f, 1.0f});
  const int64_t rows = 37, cols = 70;  // 2450 elements: three chunks, blocks divide neither dim
  std::vector<float> x(static_cast<size_t>(rows * cols));
  uint64_t state = 99;
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
  x[100] = std::numeric_limits<float>::infinity();
  float* X = h.put(x);
  uint64_t saw_nan_block = 0, saw_inf_elem = 0, saw_clamp = 0;
  for (NumFmt f : {NumFmt::mxfp8_e4m3, NumFmt::mxfp8_e5m2, NumFmt::mxfp6_e3m2, NumFmt::mxfp6_e2m3,
                   NumFmt::mxfp4_e2m1, NumFmt::mxint8})
    for (int r = 0; r < static_cast<int>(ScaleRule::kCount); ++r)
      for (Rounding rnd : {Rounding::nearest_even, Rounding::toward_zero, Rounding::stochastic})
        for (Axis axis : {Axis::contiguous, Axis::strided})
          for (bool first : {false, true}) {
            QuantSpec q;
            q.fmt = f;
            q.block = axis == Axis::contiguous ? 32 : 8;
            q.rule = static_cast<ScaleRule>(r);
            q.rounding = rnd;
            q.seed = 5;
            std::vector<float> v = x, y(x.size());
            if (first)
              for (float& e : v) e = round_bf16(e, Rounding::nearest_away);
            QuantSpec qs = q;
            qs.salt = step;
            QuantStats st;
            quantize_dequantize(v.data(), y.data(), rows, cols, axis, qs, &st);
            Backend::QuantGap want;
            want.above = st.clamped;
            for (int64_t c0 = 0; c0 < rows * cols; c0 += kQuantGapChunk) {
              double chunk = 0.0;
              for (int64_t i = c0; i < std::min(rows * cols, c0 + kQuantGapChunk); ++i) {
                if (!std::isfinite(x[i]) || !std::isfinite(y[i])) {
                  ++want.nonfinite;
                  saw_inf_elem += std::isinf(y[i]);
                  continue;
                }
                const double rel = quant_gap_rel(x[i], y[i]);
                chunk += rel;
                want.max_rel = std::max(want.max_rel, rel);
                ++want.n;
              }
              want.sum_rel += chunk;
            }
            saw_nan_block += st.nan_blocks > 1;  // beyond the Inf's own block
            saw_clamp += st.clamped > 0;
            const Backend::QuantGap got = h.be->quant_gap(X, rows, cols, axis, q, first, Rounding::nearest_away);
            const std::string what = std::string(name(f)) + " " + name(q.rule) + " " + name(rnd) +
                                     (axis == Axis::strided ? " strided" : "") + (first ? " bf16-first" : "");
            EXPECT_EQ(got.n, want.n) << what;
            EXPECT_EQ(got.nonfinite, want.nonfinite) << what;
            EXPECT_EQ(got.sum_rel, want.sum_rel) << what;
            EXPECT_EQ(got.max_rel, want.max_rel) << what;
            EXPECT_EQ(got.above, want.above) << what;
          }
  EXPECT_GT(saw_nan_block, 20u);
  EXPECT_GT(saw_inf_elem, 20u);
  EXPECT_GT(saw_clamp, 20u);
}

TEST(InstrumentOps, QuantGapsOfABatchAreEachTensorsQuantGap) {
  // Backend::quant_gaps (the trainer's clamp debt asks for a trajectory's gaps at once) returns,
  // in request order, what quant_gap returns for each request.
  Host h;
  const std::vector<float> x = noise(96 * 5, 3);
  float* X = h.put(x);
  std::vector<Backend::QuantGapRequest> reqs(3);
  reqs[0].x = X;
  reqs[0].rows = 5;
  reqs[0].cols = 96;
  reqs[0].q.fmt = NumFmt::mxfp8_e4m3;
  reqs[1] = reqs[0];
  reqs[1].axis = Axis::strided;
  reqs[1].q.block = 4;
  reqs[1].round_bf16_first = true;
  reqs[2] = reqs[0];
  reqs[2].x = X + 96;
  reqs[2].rows = 1;
  reqs[2].q.fmt = NumFmt::bf16;
  std::vector<Backend::QuantGap> got(reqs.size());
  h.be->quant_gaps(reqs.data(), reqs.size(), got.data());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Backend::QuantGapRequest& r = reqs[i];
    const Backend::QuantGap one = h.be->quant_gap(r.x, r.rows, r.cols, r.axis, r.q, r.round_bf16_first, r.bf16_mode);
    EXPECT_EQ(got[i].sum_rel, one.sum_rel) << i;
    EXPECT_EQ(got[i].max_rel, one.max_rel) << i;
    EXPECT_EQ(got[i].n, one.n) << i;
    EXPECT_GT(one.sum_rel, 0.0) << i;
  }
  EXPECT_NE(got[0].sum_rel, got[1].sum_rel);
  EXPECT_EQ(got[2].n, 96u);
}

TEST(InstrumentOps, QuantGapOfTheModelsGammaIsWhatTheForwardPassUses) {
  // An MX policy with stochastic rounding (so that the seed mixing must match too): the gap of
  // the stored gamma / beta under forward_param_quant equals |gamma - Q(gamma)| / |gamma| with
  // the Q(gamma) the forward pass left in the workspace (the last layer's).
  Host h;
  ModelConfig m;
  m.depth = 2;
  m.width = 40;
  const NetShape s = NetShape::student(m);
  std::vector<float> params = init_params(s, InitKind::pytorch, 1.0f, 5, Stream::init);
  const auto z = noise(static_cast<size_t>(s.num_params), 6);
  for (const ParamGroup& g : s.groups)
    for (int64_t i = 0; i < g.size(); ++i) {
      float& v = params[static_cast<size_t>(g.offset + i)];
      if (g.kind == ParamGroup::gamma) v = 0.89f + 0.01f * z[static_cast<size_t>(g.offset + i)];
      if (g.kind == ParamGroup::beta) v = 0.05f * z[static_cast<size_t>(g.offset + i)];
    }
  PassPolicy pol;
  pol.seed = 17;
  pol.p.rounding = Rounding::stochastic;  // defaults otherwise: MXFP8 E4M3 everywhere, floor
  h.be->set_step(StepScalars{3, 0.0f, 1.0f, 1.0f});
  float* P = h.put(params);
  float* X = h.put(noise(static_cast<size_t>(4 * s.d), 7));
  Workspace ws = Workspace::make(*h.be, s, 4);
  forward(*h.be, s, P, X, ws, pol);
  const std::vector<float> gq = h.get(ws.gq_gamma, static_cast<size_t>(s.d)), bq = h.get(ws.gq_beta, s.d);
  for (ParamGroup::Kind kind : {ParamGroup::gamma, ParamGroup::beta}) {
    const ParamGroup& g = *s.find(1, kind);
    const ParamQuant pq = forward_param_quant(g, pol);
    const Backend::QuantGap r = h.be->quant_gap(P + g.offset, pq.rows, pq.cols, pq.axis, pq.q, pq.round_bf16_first,
                                                pq.bf16_mode);
    const std::vector<float>& q = kind == ParamGroup::gamma ? gq : bq;
    double sum = 0, mx = 0;
    uint64_t above = 0;
    for (int64_t i = 0; i < g.size(); ++i) {
      const float x = params[static_cast<size_t>(g.offset + i)];
      const double rel = quant_gap_rel(x, q[static_cast<size_t>(i)]);
      sum += rel;
      mx = std::max(mx, rel);
    }
    above = mx_stats(params.data() + g.offset, 1, s.d, Axis::contiguous, pq.q).clamped;
    EXPECT_EQ(r.sum_rel, sum) << g.name;
    EXPECT_EQ(r.max_rel, mx) << g.name;
    EXPECT_EQ(r.above, above) << g.name;
    EXPECT_GT(r.sum_rel, 0.0) << g.name;
    if (kind == ParamGroup::gamma) {
      EXPECT_GT(r.above, 0u) << "gamma near 0.89 must clamp in some blocks";
    }
  }
  // The weights: the forward GEMM operand's spec (weight role, bf16 first, K-contiguous).
  const ParamQuant w1 = forward_param_quant(*s.find(0, ParamGroup::w1), pol);
  EXPECT_EQ(w1.q.fmt, NumFmt::mxfp8_e4m3);
  EXPECT_TRUE(w1.round_bf16_first);
  EXPECT_EQ(w1.rows, s.hidden_in);
  EXPECT_EQ(w1.cols, s.d);
  EXPECT_EQ(forward_param_quant(*s.find(0, ParamGroup::b2), pol).q.fmt, NumFmt::fp32);
}
