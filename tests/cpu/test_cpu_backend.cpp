// CPU backend ops on tiny inputs worked out by hand, and the GEMM against a naive loop
// (plain and with MX operands). The exact semantics under test are in lab/model/README.md.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lab/cpu/cpu_backend.h"
#include "lab/model/elementwise.h"
#include "lab/mx/quantize.h"

using namespace mxlab;

namespace {

constexpr double kU32 = 1.0 / 16777216.0;  // unit roundoff of FP32 (2^-24)

std::vector<float> noise(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * randn_elem(seed, Stream::validation, 0, i);
  return v;
}

// The backend owns its memory: helpers to move vectors in and out.
float* put(Backend& be, const std::vector<float>& v) {
  float* p = be.alloc(v.size());
  be.upload(p, v.data(), v.size());
  return p;
}
std::vector<float> get(Backend& be, const float* p, size_t n) {
  std::vector<float> v(n);
  be.download(v.data(), p, n);
  return v;
}

const ElementwiseRound kNoRound{};
const ElementwiseRound kBf16Even{true, Rounding::nearest_even};

// Storage of a logical [rows x K] operand: [rows x K] when k_contiguous, else [K x rows].
float at(const std::vector<float>& stored, bool k_contiguous, int64_t rows, int64_t K, int64_t r, int64_t k) {
  return k_contiguous ? stored[r * K + k] : stored[k * rows + r];
}

// C = A B^T in double with the error bound of any FP32 summation order:
// |fl(sum) - sum| <= gamma_K * sum |a_k b_k|, gamma_K = K u / (1 - K u) (Higham, Thm 3.1).
struct RefGemm {
  std::vector<double> c, bound;
};
RefGemm ref_gemm(int64_t M, int64_t N, int64_t K, const std::vector<float>& a, bool akc, const std::vector<float>& b,
                 bool bkc) {
  RefGemm r{std::vector<double>(M * N), std::vector<double>(M * N)};
  const double gamma = K * kU32 / (1.0 - K * kU32);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0, sa = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(at(a, akc, M, K, i, k)) * at(b, bkc, N, K, j, k);
        s += p;
        sa += std::fabs(p);
      }
      r.c[i * N + j] = s;
      r.bound[i * N + j] = gamma * sa;
    }
  return r;
}

// Element-wise check with a per-element bound; reports at most a few failures.
void expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= bound[i]) && reported++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << " want " << want[i] << " err " << err
                    << " bound " << bound[i];
  }
}

}  // namespace

// x = [1 2 3 4]: mean 2.5, xc = [-1.5 -0.5 0.5 1.5], var 1.25; eps = 2.75 makes rstd exactly
// 0.5, xhat = [-0.75 -0.25 0.25 0.75]; gamma 2, beta [1 0 0 -1] -> y = [-0.5 -0.5 0.5 0.5].
TEST(CpuBackend, LayernormForwardKnownRow) {
  auto be = make_cpu_backend();
  const std::vector<float> x = {1, 2, 3, 4, 4, 3, 2, 1};
  float* px = put(*be, x);
  float* g = put(*be, {2, 2, 2, 2});
  float* b = put(*be, {1, 0, 0, -1});
  float* y = be->alloc(8);
  float* xhat = be->alloc(8);
  float* rstd = be->alloc(2);
  for (const ElementwiseRound& r : {kNoRound, kBf16Even}) {  // every value is exact in bf16 too
    be->layernorm_fwd(px, g, b, y, xhat, rstd, 2, 4, 2.75f, r);
    EXPECT_EQ(get(*be, rstd, 2), (std::vector<float>{0.5f, 0.5f}));
    EXPECT_EQ(get(*be, xhat, 8), (std::vector<float>{-0.75f, -0.25f, 0.25f, 0.75f, 0.75f, 0.25f, -0.25f, -0.75f}));
    EXPECT_EQ(get(*be, y, 8), (std::vector<float>{-0.5f, -0.5f, 0.5f, 0.5f, 2.5f, 0.5f, -0.5f, -2.5f}));
  }
  // Without affine, y = xhat.
  be->layernorm_fwd(px, nullptr, nullptr, y, xhat, rstd, 2, 4, 2.75f, kNoRound);
  EXPECT_EQ(get(*be, y, 4), (std::vector<float>{-0.75f, -0.25f, 0.25f, 0.75f}));
}

// One row, xhat = [-0.75 -0.25 0.25 0.75], rstd 0.5, dy = [1 0 0 0], no gamma:
// mean(g) = 0.25, mean(g xhat) = -0.1875, dx = 0.5 ((g - 0.25) - xhat * (-0.1875)).
TEST(CpuBackend, LayernormBackwardByHand) {
  auto be = make_cpu_backend();
  float* dy = put(*be, {1, 0, 0, 0, 0, 2, 0, 0});
  float* xhat = put(*be, {-0.75f, -0.25f, 0.25f, 0.75f, -0.75f, -0.25f, 0.25f, 0.75f});
  float* rstd = put(*be, {0.5f, 0.5f});
  float* dx = be->alloc(8);
  float* dg = be->alloc(4);
  float* db = be->alloc(4);
  be->layernorm_bwd(dy, xhat, rstd, nullptr, dx, dg, db, 2, 4, kNoRound, kNoRound);
  const auto r = get(*be, dx, 4);
  EXPECT_EQ(r, (std::vector<float>{0.3046875f, -0.1484375f, -0.1015625f, -0.0546875f}));
  // dgamma = sum_rows dy * xhat, dbeta = sum_rows dy.
  EXPECT_EQ(get(*be, dg, 4), (std::vector<float>{-0.75f, -0.5f, 0.0f, 0.0f}));
  EXPECT_EQ(get(*be, db, 4), (std::vector<float>{1.0f, 2.0f, 0.0f, 0.0f}));
  // gamma = 2 doubles g, hence dx; parameter gradients do not depend on gamma.
  float* g2 = put(*be, {2, 2, 2, 2});
  be->layernorm_bwd(dy, xhat, rstd, g2, dx, dg, db, 2, 4, kNoRound, kNoRound);
  EXPECT_EQ(get(*be, dx, 4), (std::vector<float>{0.609375f, -0.296875f, -0.203125f, -0.109375f}));
  EXPECT_EQ(get(*be, dg, 4), (std::vector<float>{-0.75f, -0.5f, 0.0f, 0.0f}));
  // dy read through its own rounding (a GEMM output left unrounded): 1 + 3 * 2^-9 reads as
  // bf16 1 + 2^-7 everywhere, in dx and in both column sums; unrounded, it does not.
  const float e = std::ldexp(1.0f, -9);
  float* dy3 = put(*be, {1 + 3 * e, 0, 0, 0, 0, 2, 0, 0});
  float* dy4 = put(*be, {1 + 4 * e, 0, 0, 0, 0, 2, 0, 0});  // = 1 + 2^-7, bf16-exact
  float* dx4 = be->alloc(8);
  float* dg4 = be->alloc(4);
  float* db4 = be->alloc(4);
  be->layernorm_bwd(dy4, xhat, rstd, nullptr, dx4, dg4, db4, 2, 4, kNoRound, kNoRound);
  be->layernorm_bwd(dy3, xhat, rstd, nullptr, dx, dg, db, 2, 4, kNoRound, kBf16Even);
  EXPECT_EQ(get(*be, dx, 8), get(*be, dx4, 8));
  EXPECT_EQ(get(*be, dg, 4), get(*be, dg4, 4));
  EXPECT_EQ(get(*be, db, 4), get(*be, db4, 4));
  be->layernorm_bwd(dy3, xhat, rstd, nullptr, dx, dg, db, 2, 4, kNoRound, kNoRound);
  EXPECT_NE(get(*be, db, 4), get(*be, db4, 4));
}

TEST(CpuBackend, ActivationsAtKnownPoints) {
  auto be = make_cpu_backend();
  float* h = put(*be, {0.0f, 1.0f, -1.0f});
  float* a = be->alloc(3);
  float* dh = be->alloc(3);
  float* ones = put(*be, {1, 1, 1});
  // gelu(x) = x Phi(x): gelu(0) = 0, gelu(1) = Phi(1) = 0.8413447460685429, gelu'(0) = 0.5.
  be->act_fwd(Act::gelu, h, a, 1, 3, kNoRound, kNoRound);
  auto v = get(*be, a, 3);
  EXPECT_EQ(v[0], 0.0f);
  EXPECT_NEAR(v[1], 0.8413447460685429, 2e-7);
  EXPECT_NEAR(v[2], -0.15865525393145707, 2e-7);
  be->act_bwd(Act::gelu, h, ones, dh, 1, 3, kNoRound, kNoRound, kNoRound);
  v = get(*be, dh, 3);
  EXPECT_NEAR(v[0], 0.5, 1e-7);
  EXPECT_NEAR(v[1], 0.8413447460685429 + 0.24197072451914337, 4e-7);  // Phi(1) + phi(1)
  // gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) = 0.8411919906082768.
  be->act_fwd(Act::gelu_tanh, h, a, 1, 3, kNoRound, kNoRound);
  EXPECT_NEAR(get(*be, a, 3)[1], 0.8411919906082768, 2e-7);
  be->act_fwd(Act::relu, h, a, 1, 3, kNoRound, kNoRound);
  EXPECT_EQ(get(*be, a, 3), (std::vector<float>{0.0f, 1.0f, 0.0f}));
  be->act_bwd(Act::relu, h, ones, dh, 1, 3, kNoRound, kNoRound, kNoRound);
  EXPECT_EQ(get(*be, dh, 3), (std::vector<float>{0.0f, 1.0f, 0.0f}));
  be->act_fwd(Act::linear, h, a, 1, 3, kNoRound, kNoRound);
  EXPECT_EQ(get(*be, a, 3), (std::vector<float>{0.0f, 1.0f, -1.0f}));
  // swiglu: h row = [u | g]; a = u silu(g); silu(1) = 0.7310585786300049, silu'(0) = 0.5.
  float* hs = put(*be, {2.0f, 3.0f, 1.0f, 0.0f});  // u = (2, 3), g = (1, 0)
  float* as = be->alloc(2);
  be->act_fwd(Act::swiglu, hs, as, 1, 2, kNoRound, kNoRound);
  v = get(*be, as, 2);
  EXPECT_NEAR(v[0], 2 * 0.7310585786300049, 4e-7);
  EXPECT_EQ(v[1], 0.0f);
  float* das = put(*be, {1.0f, 1.0f});
  float* dhs = be->alloc(4);
  be->act_bwd(Act::swiglu, hs, das, dhs, 1, 2, kNoRound, kNoRound, kNoRound);
  v = get(*be, dhs, 4);
  EXPECT_NEAR(v[0], 0.7310585786300049, 2e-7);  // du = silu(g)
  EXPECT_EQ(v[1], 0.0f);
  // dg = u silu'(g): silu'(1) = s (1 + 1 (1 - s)) with s = sigmoid(1) = 0.7310585786300049.
  EXPECT_NEAR(v[2], 2 * 0.7310585786300049 * (1 + (1 - 0.7310585786300049)), 1e-6);
  EXPECT_EQ(v[3], 1.5f);  // 3 * 0.5
}

// Element-wise outputs are rounded per ElementwiseRound: 1 + 2^-9 is below bf16's half ulp at 1.
TEST(CpuBackend, ResidualAndAddRoundAsSpecified) {
  auto be = make_cpu_backend();
  const float tiny = std::ldexp(1.0f, -9);
  float* x = put(*be, {1.0f, 1.0f});
  float* y = put(*be, {tiny, 0.5f});
  be->residual_add(x, x, y, nullptr, 1, 2, kBf16Even, kNoRound);
  EXPECT_EQ(get(*be, x, 2), (std::vector<float>{1.0f, 1.5f}));
  be->residual_add(x, x, y, nullptr, 1, 2, kNoRound, kNoRound);
  EXPECT_EQ(get(*be, x, 2), (std::vector<float>{1.0f + tiny, 2.0f}));
  // With a bias the inner sum is rounded first: R(x + R(y + b)).
  float* x2 = put(*be, {0.0f, 10.0f, 1.0f, 20.0f});
  float* y2 = put(*be, {1.0f, 2.0f, 3.0f, 4.0f});
  float* b2 = put(*be, {0.5f, -1.0f});
  be->residual_add(x2, x2, y2, b2, 2, 2, kNoRound, kNoRound);
  EXPECT_EQ(get(*be, x2, 4), (std::vector<float>{1.5f, 11.0f, 4.5f, 23.0f}));
  // Out of place, y read through its own rounding: out = R(x + R(R_y(y) + b)); x is kept.
  // y = 1 + 3 * 2^-9 rounds (bf16, even) to 1 + 2^-7; + 0.5 is exact in FP32 and in bf16.
  float* x3 = put(*be, {1.0f});
  float* y3 = put(*be, {1.0f + 3 * tiny});
  float* b3 = put(*be, {0.5f});
  float* o3 = be->alloc(1);
  be->residual_add(o3, x3, y3, b3, 1, 1, kNoRound, kBf16Even);
  EXPECT_EQ(get(*be, o3, 1)[0], 2.5f + std::ldexp(1.0f, -7));
  EXPECT_EQ(get(*be, x3, 1)[0], 1.0f);
  be->residual_add(o3, x3, y3, b3, 1, 1, kNoRound, kNoRound);  // unrounded y: 2.5 + 3 * 2^-9
  EXPECT_EQ(get(*be, o3, 1)[0], 2.5f + 3 * tiny);
  float* d = be->alloc(2);
  be->add(d, x, y, 2, kNoRound);
  EXPECT_EQ(get(*be, d, 2), (std::vector<float>{1.0f + 2 * tiny, 2.5f}));
  be->add(d, x, y, 2, kBf16Even);  // 1 + 2^-8 is a tie: even keeps 1
  EXPECT_EQ(get(*be, d, 2)[0], 1.0f);
  be->add(d, x, y, 2, ElementwiseRound{true, Rounding::nearest_away});
  EXPECT_EQ(get(*be, d, 2)[0], 1.0f + std::ldexp(1.0f, -7));
}

TEST(CpuBackend, ColSumReduceMoments) {
  auto be = make_cpu_backend();
  float* x = put(*be, {1, 2, 3, 4, 5, 6});
  float* out = be->alloc(3);
  be->col_sum(x, out, 2, 3);
  EXPECT_EQ(get(*be, out, 3), (std::vector<float>{5, 7, 9}));
  float* y = put(*be, {1, 1, 1, 1, 1, 1});
  Reduction reqs[2];
  reqs[0] = Reduction{Reduction::dot, x, x, 6};       // 1+4+9+16+25+36
  reqs[1] = Reduction{Reduction::diff_sq, x, y, 6};   // 0+1+4+9+16+25
  double res[2];
  be->reduce(reqs, 2, res);
  EXPECT_EQ(res[0], 91.0);
  EXPECT_EQ(res[1], 55.0);
  double m[4];
  be->moments(x, 4, m);  // 1 2 3 4
  EXPECT_EQ(m[0], 1.0);
  EXPECT_EQ(m[1], 4.0);
  EXPECT_EQ(m[2], 2.5);
  EXPECT_DOUBLE_EQ(m[3], std::sqrt(1.25));
  // moments_batch: each tensor's moments, in order.
  const float* xs[2] = {x, x + 2};
  const size_t ns[2] = {4, 4};
  double mb[8];
  be->moments_batch(xs, ns, 2, mb);
  EXPECT_EQ(std::vector<double>(mb, mb + 4), std::vector<double>(m, m + 4));
  EXPECT_EQ(mb[4], 3.0);
  EXPECT_EQ(mb[5], 6.0);
  EXPECT_EQ(mb[6], 4.5);
  EXPECT_EQ(be->read_scalar(x + 5), 6.0f);
}

// Deferred results (Backend::reduce_deferred / defer_scalar / take_deferred): in call order, the
// values at the time of the call, and an empty queue after each take.
TEST(CpuBackend, DeferredResultsComeBackInOrderWithTheirValuesAtCallTime) {
  auto be = make_cpu_backend();
  float* x = put(*be, {1, 2, 3, 4, 5, 6});
  float* y = put(*be, {1, 1, 1, 1, 1, 1});
  const Reduction reqs[2] = {Reduction{Reduction::dot, x, x, 6}, Reduction{Reduction::diff_sq, x, y, 6}};
  be->reduce_deferred(reqs, 2);
  be->defer_scalar(x + 5);
  be->fill(x, 0.0f, 6);  // later writes do not change what was queued
  be->reduce_deferred(reqs, 1);
  be->defer_scalar(x + 5);
  EXPECT_EQ(be->take_deferred(), (std::vector<double>{91.0, 55.0, 6.0, 0.0, 0.0}));
  EXPECT_TRUE(be->take_deferred().empty());
  be->reduce_deferred(reqs, 0);
  EXPECT_TRUE(be->take_deferred().empty());
}

// Adam, step 1 with bc1 = 1 - beta1 and bc2 = 1 - beta2 (as float): m = (1 - b1) g,
// v = (1 - b2) g^2, so mhat = g = 0.5 and vhat = g^2 = 0.25 exactly; sqrt(vhat) + 1e-8 = 0.5
// in float, and p = 1 - 0.1 * 0.5 / 0.5 = 1 - 0.1 (all of it exact in float but the last step).
TEST(CpuBackend, AdamAndSgdOneStepByHand) {
  auto be = make_cpu_backend();
  StepScalars s;
  s.lr = 0.1f;
  s.bc1 = 1.0f - 0.9f;
  s.bc2 = 1.0f - 0.999f;
  be->set_step(s);
  float* p = put(*be, {1.0f});
  float* g = put(*be, {0.5f});
  float* m = put(*be, {0.0f});
  float* v = put(*be, {0.0f});
  be->adam(p, g, m, v, 1, Backend::AdamHyper{});
  EXPECT_EQ(get(*be, m, 1)[0], (1.0f - 0.9f) * 0.5f);
  EXPECT_EQ(get(*be, v, 1)[0], (1.0f - 0.999f) * 0.25f);
  EXPECT_EQ(get(*be, p, 1)[0], 1.0f - 0.1f);
  // AdamW decays the parameter first: p = 1 - 0.1 * 0.5 * 1 = 0.95, then the same update.
  be->upload(p, std::vector<float>{1.0f}.data(), 1);
  be->fill(m, 0.0f, 1);
  be->fill(v, 0.0f, 1);
  Backend::AdamHyper hw;
  hw.weight_decay = 0.5f;
  hw.decoupled = true;
  be->adam(p, g, m, v, 1, hw);
  EXPECT_EQ(get(*be, p, 1)[0], (1.0f - 0.1f * 0.5f) - 0.1f);  // 0.95 - 0.1
  // SGD with momentum 0.9: buf = 0.9 * 1 + 0.5 = 1.4, p = 2 - 0.1 * 1.4.
  float* q = put(*be, {2.0f});
  float* buf = put(*be, {1.0f});
  be->sgd(q, g, buf, 1, 0.9f, 0.0f);
  EXPECT_NEAR(get(*be, buf, 1)[0], 1.4, 1e-7);
  EXPECT_NEAR(get(*be, q, 1)[0], 1.86, 2e-7);
  be->sgd(q, g, nullptr, 1, 0.0f, 0.0f);  // vanilla: no buffer needed
  EXPECT_NEAR(get(*be, q, 1)[0], 1.81, 2e-7);
}

TEST(CpuBackend, LossMseByHand) {
  auto be = make_cpu_backend();
  StepScalars s;
  s.step = 2;
  be->set_step(s);
  float* out = put(*be, {1.0f, 2.0f});
  float* t = put(*be, {0.0f, 0.0f});
  float* dout = be->alloc(2);
  float* loss = be->alloc(1);
  float* hist = put(*be, {-1, -1, -1, -1});
  be->loss_mse(out, t, dout, loss, hist, 1, 2, kNoRound);
  EXPECT_EQ(be->read_scalar(loss), 2.5f);  // (1 + 4) / 2
  EXPECT_EQ(get(*be, dout, 2), (std::vector<float>{1.0f, 2.0f}));  // 2 (out - t) / 2
  EXPECT_EQ(get(*be, hist, 4), (std::vector<float>{-1, -1, 2.5f, -1}));
}

// KL of identical rows is 0 with zero gradient; a row against a uniform target by hand.
TEST(CpuBackend, LossKlByHand) {
  auto be = make_cpu_backend();
  float* out = put(*be, {0.0f, std::log(3.0f)});  // q = (1/4, 3/4)
  float* t = put(*be, {5.0f, 5.0f});              // p = (1/2, 1/2)
  float* dout = be->alloc(2);
  float* loss = be->alloc(1);
  be->loss_kl(out, t, dout, loss, nullptr, 1, 2, 1.0f, kNoRound);
  // sum p log(p/q) = 0.5 log 2 + 0.5 log(2/3); dout = q - p.
  EXPECT_NEAR(be->read_scalar(loss), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-6);
  const auto g = get(*be, dout, 2);
  EXPECT_NEAR(g[0], -0.25, 1e-6);
  EXPECT_NEAR(g[1], 0.25, 1e-6);
  be->loss_kl(t, t, dout, loss, nullptr, 1, 2, 2.0f, kNoRound);
  EXPECT_EQ(be->read_scalar(loss), 0.0f);
  EXPECT_EQ(get(*be, dout, 2), (std::vector<float>{0.0f, 0.0f}));
}

TEST(CpuBackend, RandnDeterministicPairedAndStandard) {
  auto be = make_cpu_backend();
  const size_t n = 20001;  // odd: the last pair is used half
  float* a = be->alloc(n);
  float* b = be->alloc(n);
  StepScalars s;
  s.step = 7;
  be->set_step(s);
  be->randn(a, n, 42, Stream::data, 2.0f);
  be->randn(b, n, 42, Stream::data, 2.0f);
  const auto va = get(*be, a, n), vb = get(*be, b, n);
  EXPECT_EQ(va, vb);
  // Element i is scale * (z0 or z1) of the Box-Muller pair i / 2.
  for (uint64_t i : {0ull, 1ull, 2ull, 20000ull}) {
    const U32x4 w = philox(42, Stream::data, 7, i / 2);
    float z0, z1;
    det_box_muller(w.v[0], w.v[1], z0, z1);
    EXPECT_EQ(va[i], 2.0f * ((i & 1) ? z1 : z0)) << i;
  }
  s.step = 8;
  be->set_step(s);
  be->randn(b, n, 42, Stream::data, 2.0f);
  EXPECT_NE(get(*be, b, n), va);
  // Moments of N(0, 4): the sample mean is within 5 standard errors (2/sqrt(n) each).
  double sum = 0, sq = 0;
  for (float v : va) {
    sum += v;
    sq += double(v) * v;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_LT(std::fabs(mean), 5 * 2.0 / std::sqrt(double(n)));
  EXPECT_LT(std::fabs(var - 4.0), 5 * 4.0 * std::sqrt(2.0 / n));  // var of s^2 ~ 2 sigma^4 / n
  // add_randn adds the same samples.
  be->fill(b, 1.0f, n);
  s.step = 7;
  be->set_step(s);
  be->add_randn(b, n, 42, Stream::data, 2.0f);
  const auto vc = get(*be, b, n);
  for (size_t i = 0; i < n; i += 997) EXPECT_EQ(vc[i], 1.0f + va[i]);
}

// Plain FP32 GEMM in all four storage combinations, C = beta C + A B^T.
TEST(CpuBackend, GemmStorageCombinationsMatchNaiveLoop) {
  auto be = make_cpu_backend();
  const int64_t M = 5, N = 7, K = 37;
  for (bool akc : {true, false})
    for (bool bkc : {true, false}) {
      const auto a = noise(M * K, 1), b = noise(N * K, 2), c0 = noise(M * N, 3);
      GemmOperand oa, ob;
      oa.p = put(*be, a);
      oa.k_contiguous = akc;
      ob.p = put(*be, b);
      ob.k_contiguous = bkc;
      float* C = put(*be, std::vector<float>(M * N, std::numeric_limits<float>::quiet_NaN()));
      be->gemm(M, N, K, oa, ob, C, 0.0f, kNoRound);  // beta 0 ignores the NaN in C
      const RefGemm r = ref_gemm(M, N, K, a, akc, b, bkc);
      expect_within(get(*be, C, M * N), r.c, r.bound, akc ? (bkc ? "kc/kc" : "kc/strided") : (bkc ? "strided/kc" : "strided/strided"));
      // beta = 0.5: C = 0.5 C0 + A B^T (one more rounding of the product and of the sum).
      be->upload(C, c0.data(), M * N);
      be->gemm(M, N, K, oa, ob, C, 0.5f, kNoRound);
      std::vector<double> want(M * N), bound(M * N);
      for (int64_t i = 0; i < M * N; ++i) {
        want[i] = 0.5 * c0[i] + r.c[i];
        bound[i] = r.bound[i] + 2 * kU32 * (std::fabs(want[i]) + r.bound[i]);
      }
      expect_within(get(*be, C, M * N), want, bound, "beta 0.5");
    }
}

// MX operands: the backend's product equals a naive loop over the operands quantized
// explicitly (bf16 first, then quantize_dequantize along K with the mixed seed and step salt),
// up to FP32 summation order; the statistics slot gets mx_stats of the bf16-rounded operand.
TEST(CpuBackend, GemmMxOperandsMatchExplicitQuantization) {
  auto be = make_cpu_backend();
  const int64_t M = 6, N = 4, K = 80;  // K = 2.5 blocks: a zero-padded tail block
  StepScalars s;
  s.step = 3;
  be->set_step(s);
  for (NumFmt fmt : {NumFmt::mxfp8_e4m3, NumFmt::mxfp4_e2m1})
    for (Rounding rnd : {Rounding::nearest_even, Rounding::stochastic})
      for (bool akc : {true, false})
        for (bool bkc : {true, false}) {
          auto a = noise(M * K, 11, 3.0f), b = noise(N * K, 12, 0.1f);
          // An outlier that clamps under the floor rule: 1.875 * 2^13 is r = 480 > 448 (E4M3)
          // and 7.5 > 6 (E2M1) in its block's scale; the block's other elements flush to zero.
          a[5] = 15360.0f;
          QuantSpec q;
          q.fmt = fmt;
          q.rounding = rnd;
          q.seed = 99;
          GemmOperand oa, ob;
          oa.p = put(*be, a);
          oa.k_contiguous = akc;
          oa.q = q;
          oa.round_bf16_first = true;
          oa.bf16_mode = Rounding::nearest_away;
          oa.sr_op = 5;
          oa.stats_slot = 1;
          oa.stats_q = q;
          ob.p = put(*be, b);
          ob.k_contiguous = bkc;
          ob.q = q;
          ob.sr_op = 6;
          be->reset_stats(2);
          float* C = be->alloc(M * N);
          be->gemm(M, N, K, oa, ob, C, 0.0f, kNoRound);

          auto quantized = [&](std::vector<float> v, const GemmOperand& op, int64_t rows, QuantStats* st) {
            if (op.round_bf16_first)
              for (float& x : v) x = round_bf16(x, op.bf16_mode);
            QuantSpec qs = op.q;
            qs.seed = sr_seed(op.q.seed, op.sr_op);
            qs.salt = s.step;
            const int64_t sr = op.k_contiguous ? rows : K, sc = op.k_contiguous ? K : rows;
            const Axis ax = op.k_contiguous ? Axis::contiguous : Axis::strided;
            if (st) *st = mx_stats(v.data(), sr, sc, ax, qs);
            quantize_dequantize(v.data(), v.data(), sr, sc, ax, qs);
            return v;
          };
          QuantStats want_st;
          const auto qa = quantized(a, oa, M, &want_st), qb = quantized(b, ob, N, nullptr);
          const RefGemm r = ref_gemm(M, N, K, qa, akc, qb, bkc);
          expect_within(get(*be, C, M * N), r.c, r.bound, name(fmt));
          const auto st = be->read_stats();
          ASSERT_EQ(st.size(), 2u);
          EXPECT_EQ(st[1].n, uint64_t(M * K));
          EXPECT_EQ(st[1].blocks, want_st.blocks);
          EXPECT_EQ(st[1].lastbin, want_st.lastbin);
          EXPECT_EQ(st[1].clamped, want_st.clamped);
          EXPECT_GT(st[1].clamped, 0u);
          EXPECT_EQ(st[0].n, 0u);
          // Guard against a vacuous comparison: quantization visibly changed the product.
          const RefGemm raw = ref_gemm(M, N, K, a, akc, b, bkc);
          double diff = 0;
          for (int64_t i = 0; i < M * N; ++i) diff = std::max(diff, std::fabs(raw.c[i] - r.c[i]) - r.bound[i]);
          EXPECT_GT(diff, 0.0);
        }
}

// bf16 output rounding of the GEMM: the result equals round_bf16 of the FP32 product.
TEST(CpuBackend, GemmOutputRounding) {
  auto be = make_cpu_backend();
  const int64_t M = 3, N = 3, K = 4;
  const auto a = noise(M * K, 21), b = noise(N * K, 22);
  GemmOperand oa, ob;
  oa.p = put(*be, a);
  ob.p = put(*be, b);
  float* C = be->alloc(M * N);
  float* Cr = be->alloc(M * N);
  be->gemm(M, N, K, oa, ob, C, 0.0f, kNoRound);
  be->gemm(M, N, K, oa, ob, Cr, 0.0f, ElementwiseRound{true, Rounding::nearest_away});
  const auto c = get(*be, C, M * N), cr = get(*be, Cr, M * N);
  for (int64_t i = 0; i < M * N; ++i) EXPECT_EQ(cr[i], round_bf16(c[i], Rounding::nearest_away));
  EXPECT_NE(c, cr);
}

// quantize(): salt is the step, statistics go to the slot, bf16 rounds element-wise.
TEST(CpuBackend, QuantizeUsesStepSaltAndSlot) {
  auto be = make_cpu_backend();
  const auto x = noise(64, 31);
  float* px = put(*be, x);
  float* out = be->alloc(64);
  QuantSpec q;
  q.fmt = NumFmt::mxfp4_e2m1;
  q.rounding = Rounding::stochastic;
  q.seed = 5;
  StepScalars s;
  s.step = 4;
  be->set_step(s);
  be->reset_stats(3);
  be->quantize(px, out, 2, 32, Axis::contiguous, q, 2);
  QuantSpec qr = q;
  qr.salt = 4;
  std::vector<float> want(64);
  QuantStats st;
  quantize_dequantize(x.data(), want.data(), 2, 32, Axis::contiguous, qr, &st);
  EXPECT_EQ(get(*be, out, 64), want);
  const auto got = be->read_stats();
  EXPECT_EQ(got[2].n, 64u);
  EXPECT_EQ(got[2].lastbin, st.lastbin);
  EXPECT_EQ(got[2].blocks, 2u);
  be->round_bf16(px, 64, Rounding::nearest_even);
  const auto r = get(*be, px, 64);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(r[i], round_bf16(x[i], Rounding::nearest_even));
}
