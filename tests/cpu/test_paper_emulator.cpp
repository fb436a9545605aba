// The paper's emulator op by op (lab/model/README.md, "The paper's emulator"): the MX emulation
// library's (microxcaling's) GeLU and LayerNorm in bf16 vector ops, the residual add with its
// roundings spelt out, and what precision.layernorm / gelu / residual / bias / ln_beta_grad and the
// paper_emulator preset do to a step. Expected values marked "microxcaling" were computed by the
// library itself on the CPU (Debian's torch 1.13): specs = mx.finalize_mx_specs({w_elem_format,
// a_elem_format: fp8_e4m3, scale_bits: 8, block_size: 32, bfloat: 16, custom_cuda: False,
// quantize_backprop: True}); y = mx.gelu(x, mx_specs=specs), y.backward(g), and
// y = mx.layer_norm(x, (8,), w, b, 1e-5, mx_specs=specs), y.backward(dy), printed as floats
// (and, for the exhaustive GeLU check, FNV-1a over the outputs' bit patterns, little-endian bytes);
// tests/torch/paper_emulator.py compares whole steps with the library.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/elementwise.h"
#include "lab/model/mlp.h"
#include "lab/io/h5file.h"
#include "lab/config/config_io.h"
#include "lab/train/eval.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {

constexpr Rounding kAway = Rounding::nearest_away;
const ElementwiseRound kR{true, kAway};

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
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// ---- GeLU ------------------------------------------------------------------------------

// microxcaling: mx.gelu forward and backward (gradient g) at these inputs.
const std::vector<float> kGeluX = {-5.0f, -2.5f, -1.0f, -0.3125f, 0.0f, 0.0625f, 0.5f, 1.0f, 1.75f, 3.0f, 6.0f, 10.0f};
const std::vector<float> kGeluY = {-2.3376197e-07f, -1.5258789e-02f, -1.5820312e-01f, -1.1767578e-01f, 0.0f,
                                   3.2714844e-02f,  3.4570312e-01f,  8.4375e-01f,     1.6796875e+00f, 3.0f,
                                   6.0f,            10.0f};
const std::vector<float> kGeluG = {1.0f, -0.5f, 2.0f, 0.25f, 1.0f, 3.0f, -1.5f, 0.75f, 1.25f, -2.0f, 0.5f, 1.0f};
const std::vector<float> kGeluDx = {-1.5795231e-06f, 1.9042969e-02f,  -1.6601562e-01f, 6.4453125e-02f,
                                    5.0e-01f,        1.640625e+00f,   -1.3046875e+00f, 8.1640625e-01f,
                                    1.390625e+00f,   -2.0f,           5.0e-01f,        1.0f};

TEST(PaperEmulatorOps, GeluVectorEqualsTheLibrary) {
  for (size_t i = 0; i < kGeluX.size(); ++i) {
    EXPECT_TRUE(same_bits(act_fwd_elem(Act::gelu_vector, kGeluX[i], true, kAway), kGeluY[i]))
        << "x = " << kGeluX[i] << ": " << act_fwd_elem(Act::gelu_vector, kGeluX[i], true, kAway) << " vs " << kGeluY[i];
    EXPECT_TRUE(same_bits(act_bwd_elem(Act::gelu_vector, kGeluX[i], kGeluG[i], true, kAway), kGeluDx[i]))
        << "x = " << kGeluX[i] << ": " << act_bwd_elem(Act::gelu_vector, kGeluX[i], kGeluG[i], true, kAway) << " vs "
        << kGeluDx[i];
  }
}

uint64_t fnv1a(const std::vector<float>& v) {
  uint64_t h = 14695981039346656037ull;
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    for (int k = 0; k < 4; ++k) {
      h ^= (u >> (8 * k)) & 0xFFu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// Every bf16 input with |x| in [2^-10, 16) and 0 (3585 inputs), gradient 1 + (i % 5) / 4: the
// FNV-1a hashes of the library's outputs' bit patterns (forward, backward).
TEST(PaperEmulatorOps, GeluVectorEqualsTheLibraryOnEveryBf16InputOfItsRange) {
  std::vector<float> x = {0.0f};
  for (int e = -10; e < 4; ++e)
    for (uint32_t m = 0; m < 128; ++m) {
      const uint32_t b = (static_cast<uint32_t>(e + 127) << 23) | (m << 16);
      x.push_back(bits_f32(b));
      x.push_back(bits_f32(b | 0x80000000u));
    }
  ASSERT_EQ(x.size(), 3585u);
  std::vector<float> y, dx;
  for (size_t i = 0; i < x.size(); ++i) {
    y.push_back(act_fwd_elem(Act::gelu_vector, x[i], true, kAway));
    dx.push_back(act_bwd_elem(Act::gelu_vector, x[i], 1.0f + static_cast<float>(i % 5) * 0.25f, true, kAway));
  }
  EXPECT_EQ(fnv1a(y), 0x080cbe21e3837c13ull);
  EXPECT_EQ(fnv1a(dx), 0x693b43c3b4ca4e1bull);
}

TEST(PaperEmulatorOps, GeluVectorThroughTheBackendRoundsItsInputs) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  // h and da left unrounded (GEMM outputs): the op rounds them as it reads them (h_in, da_in).
  std::vector<float> h = {0.50390625f + 1e-4f, -1.0f - 3e-4f, 2.0f};
  std::vector<float> da = {1.0f + 2e-4f, 0.5f, -0.25f};
  float *H = put(*be, h), *DA = put(*be, da), *A = be->alloc(3), *DH = be->alloc(3);
  be->act_fwd(Act::gelu_vector, H, A, 1, 3, kR, kR);
  be->act_bwd(Act::gelu_vector, H, DA, DH, 1, 3, kR, kR, kR);
  const std::vector<float> a = get(*be, A, 3), dh = get(*be, DH, 3);
  for (int i = 0; i < 3; ++i) {
    const float hr = round_bf16(h[i], kAway), dar = round_bf16(da[i], kAway);
    EXPECT_TRUE(same_bits(a[i], gelu_vector_fwd(hr, true, kAway)));
    EXPECT_TRUE(same_bits(dh[i], round_bf16(gelu_vector_grad(hr, true, kAway) * dar, kAway)));
  }
}

// Unrounded, the chain is the tanh approximation with the library's coefficients: close to
// PyTorch's tanh GeLU (its coefficients differ by < 0.1 %), and its "derivative" the derivative of
// that function (checked against central differences of the unrounded forward).
TEST(PaperEmulatorOps, GeluVectorUnroundedIsTheTanhApproximation) {
  for (float x = -6.0f; x <= 6.0f; x += 0.0625f) {
    const double u = 1.59375 * (x + 0.044677734375 * double(x) * x * x);
    const double ref = x / (1.0 + std::exp(-u));
    EXPECT_NEAR(act_fwd_elem(Act::gelu_vector, x, false, kAway), ref, 2e-6 * (1.0 + std::fabs(ref))) << x;
    EXPECT_NEAR(act_fwd_elem(Act::gelu_vector, x, false, kAway), act_value(Act::gelu_tanh, x), 2e-3) << x;
    const double h = 1e-3;
    auto f = [](double v) {
      const double uu = 1.59375 * (v + 0.044677734375 * v * v * v);
      return v / (1.0 + std::exp(-uu));
    };
    const double fd = (f(x + h) - f(x - h)) / (2 * h);
    // The library's derivative uses 0.2138671875 for 3 * 0.044677734375 * 1.59375 = 0.21361...
    EXPECT_NEAR(gelu_vector_grad(x, false, kAway), fd, 2e-3 * (1.0 + std::fabs(fd))) << x;
  }
}

// ---- LayerNorm -------------------------------------------------------------------------

// microxcaling: mx.layer_norm (eps 1e-5, bfloat 16) on 3 rows of 8 (the last row not
// bf16-valued: the library rounds its input first), forward and backward.
const std::vector<float> kLnX = {
    -2.546875e+00f, -1.0f,          -8.0859375e-01f, -2.71875e+00f,  2.9882812e-01f, -7.1875e-01f,
    -1.4609375e+00f, -2.71875e+00f, 1.375e+00f,      2.84375e+00f,   4.03125e+00f,   3.0859375e-01f,
    7.7734375e-01f,  -2.65625e+00f, -1.4160156e-01f, -9.863281e-02f, 1.0e-01f,       -7.0e-01f,
    2.3e+00f,        1.1e+00f,      -5.0e-02f,       9.0e-01f,       3.3e+00f,       -1.9e+00f};
const std::vector<float> kLnW = {1.0f, 8.75e-01f, 1.125e+00f, 9.375e-01f, 1.0f, 1.25e+00f, 7.5e-01f, 1.0f};
const std::vector<float> kLnB = {0.0f, 1.25e-01f, -6.25e-02f, 2.5e-01f, 0.0f, -5.0e-01f, 1.00097656e-01f, 0.0f};
const std::vector<float> kLnDy = {5.0e-01f, -1.0f,     2.5e-01f, 2.0f,      -7.5e-01f, 1.5f,      -1.25e-01f, 3.0e-01f,
                                  1.0f,     1.0f,      -1.0f,    5.0e-01f,  2.5e-01f,  -2.0f,     5.0e-01f,   1.0e-01f,
                                  -3.0e-01f, 6.0e-01f, 9.0e-01f, -1.2f,     4.0e-01f,  2.0e-01f,  -8.0e-01f,  1.7f};
const std::vector<float> kLnY = {
    -1.046875e+00f, 5.15625e-01f,    6.40625e-01f,    -8.828125e-01f, 1.6875e+00f,     3.9453125e-01f,
    1.00097656e-01f, -1.2109375e+00f, 2.9882812e-01f, 1.0625e+00f,    1.84375e+00f,    6.8359375e-03f,
    -1.4343262e-02f, -2.765625e+00f, -2.7148438e-01f, -4.7265625e-01f, -3.3984375e-01f, -6.25e-01f,
    1.1484375e+00f,  5.3515625e-01f,  -4.375e-01f,    -2.8320312e-01f, 1.390625e+00f,  -1.6328125e+00f};
const std::vector<float> kLnDx = {
    -3.1054688e-01f, -1.0390625e+00f, 1.4453125e-01f,  9.53125e-01f,    -4.296875e-01f,  1.71875e+00f,
    -4.6484375e-01f, -5.6640625e-01f, 4.921875e-01f,   2.5e-01f,        -9.4140625e-01f, 3.4179688e-01f,
    1.71875e-01f,    -8.59375e-01f,   3.4765625e-01f,  1.9921875e-01f,  -4.4335938e-01f, -5.5664062e-02f,
    8.0859375e-01f,  -7.890625e-01f,  -1.7578125e-02f, 6.1523438e-02f,  -4.3945312e-02f, 4.84375e-01f};
const std::vector<float> kLnDw = {-1.22558594e-01f, 1.11328125e-01f, -5.703125e-01f, -2.921875e+00f,
                                  -1.4453125e+00f,  4.71875e+00f,    -1.625e+00f,    -3.1875e+00f};
const std::vector<float> kLnDb = {1.203125e+00f,  6.015625e-01f,   1.484375e-01f,   1.296875e+00f,
                                  -9.9609375e-02f, -3.0078125e-01f, -4.2578125e-01f, 2.109375e+00f};

TEST(PaperEmulatorOps, LayernormVectorEqualsTheLibrary) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  const int64_t rows = 3, d = 8;
  float *X = put(*be, kLnX), *W = put(*be, kLnW), *Bv = put(*be, kLnB), *DY = put(*be, kLnDy);
  float *Y = be->alloc(24), *XN = be->alloc(24), *VE = be->alloc(3), *DX = be->alloc(24), *DW = be->alloc(8),
        *DB = be->alloc(8);
  be->layernorm_vec_fwd(X, W, Bv, Y, XN, VE, rows, d, 1e-5f, kR);
  be->layernorm_vec_bwd(DY, XN, VE, W, DX, DW, DB, rows, d, kR, kR);
  const std::vector<float> y = get(*be, Y, 24), dx = get(*be, DX, 24), dw = get(*be, DW, 8), db = get(*be, DB, 8);
  for (int i = 0; i < 24; ++i) {
    EXPECT_TRUE(same_bits(y[i], kLnY[i])) << "y[" << i << "] " << y[i] << " vs " << kLnY[i];
    EXPECT_TRUE(same_bits(dx[i], kLnDx[i])) << "dx[" << i << "] " << dx[i] << " vs " << kLnDx[i];
  }
  for (int j = 0; j < 8; ++j) {
    EXPECT_TRUE(same_bits(dw[j], kLnDw[j])) << "dgamma[" << j << "] " << dw[j] << " vs " << kLnDw[j];
    EXPECT_TRUE(same_bits(db[j], kLnDb[j])) << "dbeta[" << j << "] " << db[j] << " vs " << kLnDb[j];
  }
  // Without the beta pointer nothing else changes.
  be->fill(DW, 0.0f, 8);
  be->layernorm_vec_bwd(DY, XN, VE, W, DX, DW, nullptr, rows, d, kR, kR);
  EXPECT_EQ(get(*be, DW, 8), dw);
}

// Unrounded, the op chain is layernorm and DeepSpeed's backward is its exact gradient: against
// double-precision formulas (forward y, backward dx = rstd (g - mean g - xhat mean(g xhat)),
// g = dy gamma, dgamma = sum dy xhat, dbeta = sum dy).
TEST(PaperEmulatorOps, LayernormVectorUnroundedIsLayernormAndItsGradient) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  const int64_t rows = 5, d = 48;
  std::vector<float> x(rows * d), w(d), b(d), dy(rows * d);
  for (int64_t i = 0; i < rows * d; ++i) {
    x[i] = 2.0f * randn_elem(7, Stream::validation, 0, i) + 0.3f * static_cast<float>(i % 5);
    dy[i] = randn_elem(8, Stream::validation, 0, i);
  }
  for (int64_t j = 0; j < d; ++j) {
    w[j] = 1.0f + 0.1f * randn_elem(9, Stream::validation, 0, j);
    b[j] = 0.1f * randn_elem(10, Stream::validation, 0, j);
  }
  float *X = put(*be, x), *W = put(*be, w), *Bv = put(*be, b), *DY = put(*be, dy);
  float *Y = be->alloc(rows * d), *XN = be->alloc(rows * d), *VE = be->alloc(rows), *DX = be->alloc(rows * d),
        *DW = be->alloc(d), *DB = be->alloc(d);
  const float eps = 1e-5f;
  be->layernorm_vec_fwd(X, W, Bv, Y, XN, VE, rows, d, eps, ElementwiseRound{});
  be->layernorm_vec_bwd(DY, XN, VE, W, DX, DW, DB, rows, d, ElementwiseRound{}, ElementwiseRound{});
  const std::vector<float> y = get(*be, Y, rows * d), dx = get(*be, DX, rows * d), dw = get(*be, DW, d),
                           db = get(*be, DB, d);
  std::vector<double> gw(d, 0.0), gb(d, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < d; ++j) m += x[i * d + j];
    m /= d;
    for (int64_t j = 0; j < d; ++j) v += (x[i * d + j] - m) * (x[i * d + j] - m);
    v /= d;
    const double rs = 1.0 / std::sqrt(v + eps);
    std::vector<double> xh(d), g(d);
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < d; ++j) {
      xh[j] = (x[i * d + j] - m) * rs;
      g[j] = dy[i * d + j] * double(w[j]);
      mg += g[j];
      mgx += g[j] * xh[j];
      gw[j] += dy[i * d + j] * xh[j];
      gb[j] += dy[i * d + j];
      EXPECT_NEAR(y[i * d + j], xh[j] * w[j] + b[j], 2e-6) << i << "," << j;
    }
    mg /= d;
    mgx /= d;
    for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(dx[i * d + j], rs * (g[j] - mg - xh[j] * mgx), 2e-5) << i << "," << j;
  }
  for (int64_t j = 0; j < d; ++j) {
    EXPECT_NEAR(dw[j], gw[j], 1e-5 * (1 + std::fabs(gw[j])));
    EXPECT_NEAR(db[j], gb[j], 1e-5 * (1 + std::fabs(gb[j])));
  }
}

// ---- the residual add ------------------------------------------------------------------

TEST(PaperEmulatorOps, ResidualAddRoundsWhereItIsTold) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  // One row of 2: x FP32, y an unrounded GEMM output, b an FP32 bias.
  const std::vector<float> x = {1.0f + 0x1p-20f, -3.0f}, y = {0.5f + 0x1p-12f, 0.25f - 0x1p-14f},
                           b = {0x1p-9f + 0x1p-15f, 1.0f + 0x1p-10f};
  float *X = put(*be, x), *Y = put(*be, y), *Bv = put(*be, b), *O = be->alloc(2);
  const ElementwiseRound none{};
  auto R = [](float v) { return round_bf16(v, kAway); };
  // The paper's code: x + R(R(y) + R(b)), the sum in FP32.
  be->residual_add_r(O, X, Y, Bv, 1, 2, Backend::ResidualRound{kR, kR, kR, none});
  std::vector<float> o = get(*be, O, 2);
  for (int j = 0; j < 2; ++j) EXPECT_TRUE(same_bits(o[j], x[j] + R(R(y[j]) + R(b[j]))));
  EXPECT_FALSE(same_bits(o[0], R(o[0])));  // the stream keeps FP32 bits
  // microxcaling's simd_add after its Linear: R(x + R(R(y) + R(b))).
  be->residual_add_r(O, X, Y, Bv, 1, 2, Backend::ResidualRound{kR, kR, kR, kR});
  o = get(*be, O, 2);
  for (int j = 0; j < 2; ++j) EXPECT_TRUE(same_bits(o[j], R(x[j] + R(R(y[j]) + R(b[j])))));
  // The lab's residual_add is {y_in, none, r, r}.
  float* O2 = be->alloc(2);
  be->residual_add_r(O, X, Y, Bv, 1, 2, Backend::ResidualRound{kR, none, kR, kR});
  be->residual_add(O2, X, Y, Bv, 1, 2, kR, kR);
  EXPECT_EQ(get(*be, O, 2), get(*be, O2, 2));
  // Without a bias: R_out(x + R_y(y)); in place.
  be->residual_add_r(X, X, Y, nullptr, 1, 2, Backend::ResidualRound{kR, kR, kR, none});
  o = get(*be, X, 2);
  for (int j = 0; j < 2; ++j) EXPECT_TRUE(same_bits(o[j], x[j] + R(y[j])));
}

// ---- the model under the options ---------------------------------------------------------

struct Step {
  std::vector<float> out, grads, target;
  float loss = 0.0f;
};

// One step of a small paper-shaped student (fc2 bias, layernorm, GeLU) and its MX teacher targets
// under `p`; teacher_out: the teacher's forward under p.
Step run_step(const PrecisionConfig& p, std::vector<float>* teacher_out = nullptr, int64_t B = 32) {
  RunConfig cfg;
  cfg.model.depth = 2;
  cfg.model.width = 32;
  cfg.model.hidden_mult = 2;
  cfg.data.batch = static_cast<int>(B);
  cfg.seed = 4;
  std::unique_ptr<Backend> be = make_cpu_backend();
  StepScalars sc;
  be->set_step(sc);
  const NetShape S = NetShape::student(cfg.model), T = NetShape::teacher(cfg.model, cfg.teacher);
  const std::vector<float> sp = init_params(S, InitKind::pytorch, 1.0f, cfg.seed, Stream::init);
  const std::vector<float> tp = init_params(T, InitKind::pytorch, 1.0f, cfg.seed, Stream::teacher_init);
  float *P = put(*be, sp), *TP = put(*be, tp), *G = be->alloc(sp.size()), *X = be->alloc(B * 32);
  be->randn(X, B * 32, cfg.seed, Stream::data, 1.0f);
  Workspace ws = Workspace::make(*be, S, B), wt = Workspace::make(*be, T, B);
  PassPolicy pol;
  pol.p = p;
  pol.seed = cfg.seed;
  forward(*be, T, TP, X, wt, pol);
  if (teacher_out) *teacher_out = get(*be, wt.out, B * 32);
  forward(*be, S, P, X, ws, pol);
  loss_and_grad(*be, cfg.loss_spec(), wt.out, ws, pol, nullptr);
  backward(*be, S, P, X, ws, G, pol);
  Step st;
  st.out = get(*be, ws.out, B * 32);
  st.grads = get(*be, G, sp.size());
  st.loss = be->read_scalar(ws.loss);
  return st;
}

PrecisionConfig patched(const std::string& apply, std::map<std::string, std::string> set = {}) {
  PrecisionConfig base;
  base.rounding = kAway;
  base.elementwise_rounding = kAway;
  return apply_intervention(base, InterventionConfig{"t", 0, apply, std::move(set)});
}

std::vector<float> slice(const std::vector<float>& flat, const NetShape& S, int layer, ParamGroup::Kind kind) {
  const ParamGroup* g = S.find(layer, kind);
  return std::vector<float>(flat.begin() + g->offset, flat.begin() + g->offset + g->size());
}

NetShape small_shape() {
  ModelConfig m;
  m.depth = 2;
  m.width = 32;
  m.hidden_mult = 2;
  return NetShape::student(m);
}

bool all_bf16(const std::vector<float>& v) {
  for (float x : v)
    if (!same_bits(x, round_bf16(x, kAway))) return false;
  return true;
}

TEST(PaperEmulatorModel, BetaGradientIsZeroWithoutChangingAnythingElse) {
  const NetShape S = small_shape();
  const Step on = run_step(patched("paper_emulator", {{"ln_beta_grad", "true"}}));
  const Step off = run_step(patched("paper_emulator"));
  EXPECT_EQ(on.out, off.out);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(slice(off.grads, S, k, ParamGroup::beta), std::vector<float>(32, 0.0f));
    EXPECT_NE(slice(on.grads, S, k, ParamGroup::beta), std::vector<float>(32, 0.0f));
    for (auto kind : {ParamGroup::gamma, ParamGroup::w1, ParamGroup::w2, ParamGroup::b2})
      EXPECT_EQ(slice(on.grads, S, k, kind), slice(off.grads, S, k, kind)) << k << " " << int(kind);
  }
}

TEST(PaperEmulatorModel, ResidualFp32KeepsTheStreamAndItsGradientUnrounded) {
  const Step fp32 = run_step(patched("paper_emulator"));
  const Step rounded = run_step(patched("paper_emulator", {{"residual", "elementwise"}}));
  EXPECT_FALSE(all_bf16(fp32.out));   // x + (bf16 updates), never rounded
  EXPECT_TRUE(all_bf16(rounded.out));
  EXPECT_NE(fp32.grads, rounded.grads);
  // The gradients the GEMMs see are rounded either way: dW are bf16 values.
  const NetShape S = small_shape();
  EXPECT_TRUE(all_bf16(slice(fp32.grads, S, 1, ParamGroup::w2)));
}

TEST(PaperEmulatorModel, RoundedBiasIsTheBiasRoundedFirstAndItsGradientRoundedLast) {
  const NetShape S = small_shape();
  const Step r = run_step(patched("paper_emulator", {{"bias", "elementwise"}, {"residual", "elementwise"}}));
  const Step f = run_step(patched("paper_emulator", {{"bias", "fp32"}, {"residual", "elementwise"}}));
  EXPECT_NE(r.out, f.out);
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(all_bf16(slice(r.grads, S, k, ParamGroup::b2)));
    EXPECT_FALSE(all_bf16(slice(f.grads, S, k, ParamGroup::b2)));
  }
}

TEST(PaperEmulatorModel, GeluVectorTeacherChangesOnlyTheTeacher) {
  std::vector<float> t_fused, t_teacher, t_all;
  const Step fused = run_step(patched("paper_emulator", {{"gelu", "fused"}}), &t_fused);
  const Step teacher = run_step(patched("paper_emulator", {{"gelu", "vector_teacher"}}), &t_teacher);
  const Step all = run_step(patched("paper_emulator", {{"gelu", "vector"}}), &t_all);
  EXPECT_NE(t_fused, t_teacher);
  EXPECT_EQ(t_teacher, t_all);
  // The student's step differs only through the targets: same output as fused.
  EXPECT_EQ(fused.out, teacher.out);
  EXPECT_NE(teacher.out, all.out);
}

TEST(PaperEmulatorModel, LayernormVectorChangesTheStep) {
  const Step vec = run_step(patched("paper_emulator", {{"residual", "elementwise"}}));
  const Step fused = run_step(patched("paper_emulator", {{"residual", "elementwise"}, {"layernorm", "fused"}}));
  EXPECT_NE(vec.out, fused.out);
  EXPECT_NE(vec.grads, fused.grads);
}

// A pass refuses the options where they are not implemented (eval / branch patches reach the
// model without the configuration's check).
TEST(PaperEmulatorModel, PassRefusesAttentionAndOtherNorms) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  for (int variant = 0; variant < 2; ++variant) {
    ModelConfig m;
    m.depth = 1;
    m.width = 32;
    m.hidden_mult = 2;
    if (variant == 0) {
      m.block = BlockKind::attention;
      m.heads = 2;
    } else {
      m.norm = NormKind::rmsnorm;
    }
    const NetShape S = NetShape::student(m, 32);
    const std::vector<float> sp = init_params(S, InitKind::pytorch, 1.0f, 1, Stream::init);
    float *P = put(*be, sp), *X = be->alloc(32 * 32);
    be->fill(X, 0.5f, 32 * 32);
    Workspace ws = Workspace::make(*be, S, 32);
    PassPolicy pol;
    pol.p = patched("paper_emulator");
    EXPECT_THROW(forward(*be, S, P, X, ws, pol), Error) << variant;
    pol.p = patched("");
    EXPECT_NO_THROW(forward(*be, S, P, X, ws, pol)) << variant;
  }
}

// ---- configuration -----------------------------------------------------------------------

TEST(PaperEmulatorConfig, PresetSetsTheEmulatorsArithmeticOnly) {
  PrecisionConfig base;
  base.weight = NumFmt::mxfp6_e3m2;
  base.block_size = 16;
  base.scale_rule = ScaleRule::rceil;
  base.rounding_grad = Rounding::stochastic;
  base.backward = false;
  const PrecisionConfig p = apply_intervention(base, InterventionConfig{"t", 0, "paper_emulator", {}});
  EXPECT_EQ(p.weight, NumFmt::mxfp6_e3m2);  // formats, block size, backward as they were
  EXPECT_EQ(p.block_size, 16);
  EXPECT_FALSE(p.backward);
  EXPECT_EQ(p.scale_rule, ScaleRule::floor);
  EXPECT_EQ(p.bump, Bump::clamp);
  EXPECT_TRUE(p.rounding_uniform());
  EXPECT_EQ(p.rounding_of(PrecisionConfig::Role::grad), Rounding::nearest_away);
  EXPECT_TRUE(p.elementwise_bf16);
  EXPECT_EQ(p.elementwise_rounding, Rounding::nearest_away);
  EXPECT_EQ(p.ln_affine, NumFmt::bf16);
  EXPECT_EQ(p.layernorm, LnOps::vector);
  EXPECT_EQ(p.gelu, GeluOps::vector_teacher);
  EXPECT_EQ(p.residual, ResidualPrec::fp32);
  EXPECT_EQ(p.bias, BiasPrec::elementwise);
  EXPECT_FALSE(p.ln_beta_grad);
  // to_fp32 is the lab's FP32 again, ops included.
  const PrecisionConfig f = apply_intervention(p, InterventionConfig{"t", 0, "to_fp32", {}});
  const PrecisionConfig ref = PrecisionConfig::fp32();
  EXPECT_EQ(f.layernorm, ref.layernorm);
  EXPECT_EQ(f.gelu, ref.gelu);
  EXPECT_EQ(f.residual, ref.residual);
  EXPECT_EQ(f.bias, ref.bias);
  EXPECT_EQ(f.ln_beta_grad, ref.ln_beta_grad);
  EXPECT_EQ(ref.layernorm, LnOps::fused);  // and the FP32 trajectory's policy has the lab's ops
  EXPECT_TRUE(ref.ln_beta_grad);
}

TEST(PaperEmulatorConfig, KeysParsePrintAndLeaveOldRunIdsAlone) {
  const RunConfig plain = config_from_yaml_string("steps: 10\n", "t.yaml");
  const RunConfig explicit_defaults = config_from_yaml_string(
      "steps: 10\nprecision: {layernorm: fused, gelu: fused, residual: elementwise, bias: fp32, ln_beta_grad: true}\n",
      "t.yaml");
  EXPECT_EQ(config_hash(plain), config_hash(explicit_defaults));
  EXPECT_EQ(canonical_config_text(plain).find("layernorm: fused"), std::string::npos);
  const RunConfig set = config_from_yaml_string(
      "steps: 10\nprecision: {layernorm: vector, gelu: vector_teacher, residual: fp32, bias: elementwise, "
      "ln_beta_grad: false}\n",
      "t.yaml");
  EXPECT_NE(config_hash(plain), config_hash(set));
  const std::string text = dump_config(set);
  for (const char* line : {"  layernorm: vector\n", "  gelu: vector_teacher\n", "  residual: fp32\n",
                           "  bias: elementwise\n", "  ln_beta_grad: false\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line;
  EXPECT_EQ(config_from_yaml_string(text, "round.yaml"), set);
  EXPECT_EQ(describe_policy(plain.precision).find("layernorm"), std::string::npos);
  EXPECT_NE(describe_policy(set.precision).find(" layernorm=vector gelu=vector_teacher residual=fp32 "
                                                "bias=elementwise ln_beta_grad=false"),
            std::string::npos);
  // An arm and an intervention take the preset and the fields.
  const RunConfig arms = config_from_yaml_string(
      "steps: 10\narms: [{name: pe, apply: paper_emulator}, {name: mxops, apply: paper_emulator, set: {gelu: vector, "
      "residual: elementwise}}]\ninterventions: [{name: back, at: 5, apply: to_fp32, from: pe}]\n",
      "t.yaml");
  EXPECT_EQ(resolved_arms(arms)[1].policy.gelu, GeluOps::vector);
}

TEST(PaperEmulatorConfig, RefusesWhatItDoesNotImplement) {
  auto refused = [](const std::string& yaml, const std::string& says) {
    try {
      config_from_yaml_string(yaml, "t.yaml");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << yaml;
  };
  refused("precision: {layernorm: vector}\nmodel: {block: attention}\ndata: {seq_len: 32}\n", "MLP blocks only");
  refused("arms: [{name: a, apply: paper_emulator}]\nmodel: {norm: rmsnorm}\n", "model.norm: rmsnorm");
  refused("precision: {residual: fp32}\n", "needs precision.layernorm: vector");
  refused("precision: {layernorm: sideways}\n", "unknown layernorm ops 'sideways'");
  // Without a norm the residual may stay FP32 (the GEMM rounds its input).
  EXPECT_NO_THROW(config_from_yaml_string("model: {layernorm: false}\nprecision: {residual: fp32}\n", "t.yaml"));
}

// The preset as an arm, an intervention and an eval patch, through the binary: eval of the arm's
// snapshot on its step's batch reproduces the loss the arm recorded there, and eval of the other
// arm's snapshot with `apply: paper_emulator` the loss of the branch that switches to it there.
TEST(PaperEmulatorCli, ArmInterventionAndEvalAgree) {
  mxlab::test::TempDir dir;
  const std::string exp = dir.write(
      "e.yaml",
      "steps: 16\nseed: 2\nmodel: {depth: 2, width: 32, hidden_mult: 2}\ndata: {batch: 32}\n"
      "log: {log_every: 4, progress: false, snapshot_steps: [8]}\n"
      "arms:\n  - {name: mx}\n  - {name: pe, apply: paper_emulator}\n"
      "interventions:\n  - {name: to_pe, at: 8, apply: paper_emulator}\n");
  std::string file;
  ASSERT_NO_FATAL_FAILURE(mxlab::testutil::train_cpu(exp, dir.str() + "/r", &file));
  auto be = make_cpu_backend();
  const h5::H5File f(file, h5::H5File::Mode::read);
  const std::vector<EvalRow> own = eval_snapshot(*be, file, "pe", 8, {}, true);
  EXPECT_EQ(static_cast<float>(own[0].loss), static_cast<float>(f.read_doubles("trajectories/pe/loss_all")[8]));
  const std::vector<EvalRow> sw = eval_snapshot(*be, file, "mx", 8, {{"e", 0, "paper_emulator", {}}}, true);
  ASSERT_EQ(sw.size(), 2u);
  EXPECT_EQ(static_cast<float>(sw[1].loss), static_cast<float>(f.read_doubles("branches/to_pe/loss_all")[0]));
  EXPECT_NE(sw[0].loss, sw[1].loss);
  EXPECT_NE(sw[1].policy.find("layernorm=vector"), std::string::npos) << sw[1].policy;
}

}  // namespace
