// The block Hadamard rotation of GEMM operands (precision.rotation, rotation_block; lab/mx/hadamard.h,
// lab/mx/README.md "Block Hadamard rotation"), on the CPU reference:
//   - the transform: the normalised Sylvester matrix (checked entry by entry against its closed
//     form), orthogonal, its own inverse to rounding, strided = transposed contiguous, the signs of
//     random_hadamard the documented counter-based stream, stacked operands, NaN handling, refusals;
//   - the GEMM: a rotated FP32 product equals the unrotated one within a derived bound; the operand
//     is rounded to bf16, rotated, then counted and quantized, in that order;
//   - the model: each GEMM's rotation acts on that GEMM only, never where nothing is rounded;
//     the passes refuse a block that does not divide a rotated GEMM's reduction length;
//   - the configuration: parse, print, round trip, run ids of configurations without it, patches,
//     --set, clear one-line errors; arms with rotation equal their single runs;
//   - experiments/paper/why_mx_e4.yaml: the pre-registered E4 arms.
// The CUDA twin (bits of the transform and of every rotated GEMM operand against these):
// tests/gpu/test_rotation_gpu.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <bitset>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lab/config/config_io.h"
#include "lab/config/sweep.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/mlp.h"
#include "lab/mx/hadamard.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"
#include "tests/cpu/model_reference.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"
#include "tests/cpu/trainer_util.h"

using namespace mxlab;

namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24, the unit roundoff of float32

std::vector<float> randoms(size_t n, uint64_t seed) { return test::noise(n, seed); }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

RotationSpec spec(int block, bool random_signs = false, uint64_t seed = 77, uint32_t salt = 3) {
  RotationSpec r;
  r.block = block;
  r.random_signs = random_signs;
  r.seed = seed;
  r.salt = salt;
  return r;
}

double norm2(const float* v, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(v[i]) * v[i];
  return std::sqrt(s);
}

int popcount(unsigned v) { return static_cast<int>(std::bitset<32>(v).count()); }

}  // namespace

// ---- the transform ---------------------------------------------------------------------

TEST(HadamardRotation, BlocksAndScale) {
  for (int n : {2, 4, 32, 64, 1024, 4096}) EXPECT_TRUE(is_rotation_block(n)) << n;
  for (int n : {-32, 0, 1, 3, 24, 48, 8192}) EXPECT_FALSE(is_rotation_block(n)) << n;
  // fl(1/sqrt(n)), correctly rounded, for every block size.
  for (int l = 1; l <= 12; ++l) {
    const int n = 1 << l;
    EXPECT_EQ(bits(hadamard_scale(n)), bits(static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))))) << n;
  }
  // The sign stream is part of the reproducibility contract.
  EXPECT_EQ(static_cast<uint32_t>(Stream::rotation_sign), 11u);
}

// Rotating the unit vectors gives the matrix: entry (i, j) = (-1)^popcount(i & j) / sqrt(n), the
// Sylvester-Hadamard matrix (symmetric), exactly (a unit vector meets only zeros in the butterflies);
// H H^T = I within the rounding of the scale.
TEST(HadamardRotation, IsTheNormalisedSylvesterMatrix) {
  for (int n : {2, 4, 8, 32, 128}) {
    SCOPED_TRACE(n);
    std::vector<float> I(static_cast<size_t>(n * n), 0.0f), H(I.size());
    for (int i = 0; i < n; ++i) I[static_cast<size_t>(i * n + i)] = 1.0f;
    hadamard_rotate(I.data(), H.data(), n, n, Axis::contiguous, n, spec(n));
    const float s = hadamard_scale(n);
    int wrong = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const float want = popcount(static_cast<unsigned>(i & j)) % 2 ? -s : s;
        wrong += bits(H[static_cast<size_t>(i * n + j)]) != bits(want);
      }
    EXPECT_EQ(wrong, 0);
    double worst = 0.0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double dot = 0.0;
        for (int k = 0; k < n; ++k)
          dot += static_cast<double>(H[static_cast<size_t>(i * n + k)]) * H[static_cast<size_t>(j * n + k)];
        worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
      }
    EXPECT_LE(worst, 2.0 * kU * 2.0) << "H H^T - I";  // |n fl(1/sqrt n)^2 - 1| <= 2u (1 + u)
  }
}

// Each transform rounds l = log2(n) butterfly stages and one scaling: in the 2-norm each stage's
// roundings are at most u times its output (which it scales by sqrt 2 exactly), so one transform
// is within (l + 2) u ||x|| of the exact orthogonal image (l stages, the scale's own rounding, the
// product's). Deterministic: R R = I, so twice returns x within 2 (l + 2) u ||x||. Random signs:
// R = H D / sqrt(n) is orthogonal (norms kept within (l + 2) u) and D R^T = D R undoes it.
TEST(HadamardRotation, TwiceIsTheIdentityToRoundingAndNormsAreKept) {
  const int rows = 6, cols = 4096;
  const std::vector<float> x = randoms(static_cast<size_t>(rows * cols), 5);
  for (int n : {2, 32, 256, 4096}) {
    SCOPED_TRACE(n);
    const double l = std::log2(static_cast<double>(n)), one = (l + 2.0) * kU * 1.001;
    std::vector<float> y(x.size()), z(x.size());
    hadamard_rotate(x.data(), y.data(), rows, cols, Axis::contiguous, cols, spec(n));
    hadamard_rotate(y.data(), z.data(), rows, cols, Axis::contiguous, cols, spec(n));
    for (int r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * cols;
      std::vector<float> d(static_cast<size_t>(cols));
      for (int c = 0; c < cols; ++c) d[static_cast<size_t>(c)] = z[static_cast<size_t>(r * cols + c)] - xr[c];
      EXPECT_LE(norm2(d.data(), d.size()), 2.0 * one * norm2(xr, cols)) << "row " << r;
      EXPECT_GT(norm2(d.data(), d.size()), 0.0) << "exactly x: the rotation did nothing?";
    }
    // Random signs: ||R x|| = ||x||; then the deterministic transform and D give x back.
    const RotationSpec rs = spec(n, true);
    hadamard_rotate(x.data(), y.data(), rows, cols, Axis::contiguous, cols, rs);
    hadamard_rotate(y.data(), z.data(), rows, cols, Axis::contiguous, cols, spec(n));
    for (int r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * cols;
      const double nx = norm2(xr, cols), ny = norm2(y.data() + r * cols, cols);
      EXPECT_LE(std::fabs(ny - nx), one * nx);
      double e = 0.0;
      for (int c = 0; c < cols; ++c) {
        const float back = rotation_signed(z[static_cast<size_t>(r * cols + c)], true, rs.seed, rs.salt, c);
        e += (static_cast<double>(back) - xr[c]) * (static_cast<double>(back) - xr[c]);
      }
      EXPECT_LE(std::sqrt(e), 2.0 * one * nx) << "row " << r;
    }
  }
}

TEST(HadamardRotation, StridedIsTheTransposedContiguousAndInPlaceIsTheSame) {
  const int K = 64, M = 48;
  const std::vector<float> x = randoms(static_cast<size_t>(K * M), 9);  // [K x M], K down the rows
  std::vector<float> xt(x.size()), yt(x.size()), y(x.size());
  for (int k = 0; k < K; ++k)
    for (int m = 0; m < M; ++m) xt[static_cast<size_t>(m * K + k)] = x[static_cast<size_t>(k * M + m)];
  for (bool random : {false, true}) {
    const RotationSpec r = spec(16, random);
    hadamard_rotate(x.data(), y.data(), K, M, Axis::strided, K, r);
    hadamard_rotate(xt.data(), yt.data(), M, K, Axis::contiguous, K, r);
    int wrong = 0;
    for (int k = 0; k < K; ++k)
      for (int m = 0; m < M; ++m) wrong += bits(y[static_cast<size_t>(k * M + m)]) != bits(yt[static_cast<size_t>(m * K + k)]);
    EXPECT_EQ(wrong, 0) << (random ? "random signs" : "deterministic");
    std::vector<float> inplace = x;
    hadamard_rotate(inplace.data(), inplace.data(), K, M, Axis::strided, K, r);
    EXPECT_EQ(std::memcmp(inplace.data(), y.data(), y.size() * sizeof(float)), 0);
  }
}

// The signs are the documented stream: bit (k mod 128) of philox(seed, Stream::rotation_sign, salt,
// k / 128), words v[0..3] holding bits 0..127; deterministic in (seed, salt), another salt (step)
// or seed gives other signs, about half of them negative.
TEST(HadamardRotation, RandomSignsAreTheDocumentedCounterBasedStream) {
  const uint64_t seed = 0x1234abcdULL;
  const int n = 4096;
  int negative = 0, differ_salt = 0, differ_seed = 0;
  for (int k = 0; k < n; ++k) {
    const U32x4 w = philox(seed, Stream::rotation_sign, 7, static_cast<uint64_t>(k / 128));
    const bool want = (w.v[(k % 128) / 32] >> (k % 32)) & 1u;
    ASSERT_EQ(rotation_sign_negative(seed, 7, k), want) << k;
    negative += want;
    differ_salt += rotation_sign_negative(seed, 8, k) != want;
    differ_seed += rotation_sign_negative(seed + 1, 7, k) != want;
  }
  EXPECT_NEAR(negative, n / 2, 5 * 32);  // 5 sigma of a fair coin over 4096 positions
  EXPECT_NEAR(differ_salt, n / 2, 5 * 32);
  EXPECT_NEAR(differ_seed, n / 2, 5 * 32);
  // The rotation itself: the same (seed, salt) twice, the same bits; another salt, other ones.
  const std::vector<float> x = randoms(8 * 256, 3);
  std::vector<float> a(x.size()), b(x.size()), c(x.size());
  hadamard_rotate(x.data(), a.data(), 8, 256, Axis::contiguous, 256, spec(32, true, seed, 7));
  hadamard_rotate(x.data(), b.data(), 8, 256, Axis::contiguous, 256, spec(32, true, seed, 7));
  hadamard_rotate(x.data(), c.data(), 8, 256, Axis::contiguous, 256, spec(32, true, seed, 8));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
  // Deterministic Hadamard ignores seed and salt.
  hadamard_rotate(x.data(), a.data(), 8, 256, Axis::contiguous, 256, spec(32, false, 1, 1));
  hadamard_rotate(x.data(), b.data(), 8, 256, Axis::contiguous, 256, spec(32, false, 2, 9));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// A stacked operand (batch items of K along the axis) repeats its signs per item: the same as
// rotating each item alone.
TEST(HadamardRotation, StackedItemsTakeTheSameSigns) {
  const int K = 64, M = 5, items = 3;
  const std::vector<float> x = randoms(static_cast<size_t>(items * K * M), 4);
  std::vector<float> all(x.size());
  const RotationSpec r = spec(32, true);
  hadamard_rotate(x.data(), all.data(), items * K, M, Axis::strided, K, r);
  for (int i = 0; i < items; ++i) {
    std::vector<float> one(static_cast<size_t>(K * M));
    hadamard_rotate(x.data() + i * K * M, one.data(), K, M, Axis::strided, K, r);
    EXPECT_EQ(std::memcmp(one.data(), all.data() + i * K * M, one.size() * sizeof(float)), 0) << "item " << i;
  }
}

// NaN anywhere in a block makes the block's outputs NaN, the canonical quiet NaN (the CPU's and
// the GPU's + and - carry different payloads); Inf - Inf too. Other blocks are untouched.
TEST(HadamardRotation, NonFiniteBlocksGiveTheCanonicalNaN) {
  std::vector<float> x = randoms(3 * 32, 8);
  uint32_t payload = 0xffc00001u;  // a negative NaN with a payload
  std::memcpy(&x[5], &payload, sizeof payload);
  x[40] = INFINITY;
  x[41] = INFINITY;  // block 1: Inf + Inf and Inf - Inf meet
  std::vector<float> y(x.size());
  hadamard_rotate(x.data(), y.data(), 1, 96, Axis::contiguous, 96, spec(32));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bits(y[static_cast<size_t>(i)]), 0x7fc00000u) << i;
  int nan = 0;
  for (int i = 32; i < 64; ++i) nan += std::isnan(y[static_cast<size_t>(i)]);
  EXPECT_GT(nan, 0);
  for (int i = 32; i < 64; ++i)
    if (std::isnan(y[static_cast<size_t>(i)])) {
      EXPECT_EQ(bits(y[static_cast<size_t>(i)]), 0x7fc00000u) << i;
    }
  for (int i = 64; i < 96; ++i) EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(i)])) << i;
}

TEST(HadamardRotation, RefusesBadBlocksAndShapes) {
  std::vector<float> x(64 * 64, 1.0f);
  for (int n : {0, 1, 24, 8192}) EXPECT_THROW(hadamard_rotate(x.data(), x.data(), 64, 64, Axis::contiguous, 64, spec(n)), Error) << n;
  try {
    hadamard_rotate(x.data(), x.data(), 2, 48, Axis::contiguous, 48, spec(32));
    FAIL() << "48 is not a multiple of 32";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of the Hadamard block"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  EXPECT_THROW(hadamard_rotate(x.data(), x.data(), 96, 2, Axis::strided, 64, spec(32)), Error);  // 96 rows, period 64
}

// ---- the GEMM --------------------------------------------------------------------------

namespace {

// C[M x N] = A B^T on backend `be` from host operands stored as their layouts say.
std::vector<float> gemm_of(Backend& be, int64_t M, int64_t N, int64_t K, const std::vector<float>& A, GemmOperand a,
                           const std::vector<float>& B, GemmOperand b) {
  a.p = test::put(be, A);
  b.p = test::put(be, B);
  float* C = be.alloc(static_cast<size_t>(M * N));
  be.gemm(M, N, K, a, b, C, 0.0f, ElementwiseRound{});
  std::vector<float> out(static_cast<size_t>(M * N));
  be.download(out.data(), C, out.size());
  return out;
}

// Row i (logical [rows x K]) of an operand stored with `kc`.
std::vector<float> logical_row(const std::vector<float>& s, int64_t rows, int64_t K, bool kc, int64_t i) {
  std::vector<float> r(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) r[static_cast<size_t>(k)] = kc ? s[static_cast<size_t>(i * K + k)] : s[static_cast<size_t>(k * rows + i)];
  return r;
}

}  // namespace

// Rotating both operands of an FP32 GEMM along K with the same R leaves A B^T unchanged in exact
// arithmetic. In floats, per output (i, j), with a, b the rows of A and B, l = log2(n):
//   - each rotated row is within (l + 2) u ||a|| of R a (the transform's bound above), so the exact
//     products of the rotated rows differ from a . b by at most 2 (l + 2) u ||a|| ||b|| (first order,
//     Cauchy-Schwarz; ||R a|| = ||a||);
//   - the double-sum backend rounds each exact sum once (u |C| <= u ||a|| ||b||, both GEMMs);
//     Eigen's FP32 accumulation adds at most K u ||a|| ||b|| per GEMM (gamma_K with Cauchy-Schwarz).
// So |C_rot - C| <= (2 (l + 2) + 2) u ||a|| ||b|| (double sums) or (2 (l + 2) + 2 K) u ||a|| ||b|| (Eigen);
// required with 1 % slack. The products must also not all be bit-identical (the rotation ran).
TEST(RotatedGemm, Fp32ProductEqualsTheUnrotatedOneWithinTheDerivedBound) {
  const int64_t M = 7, N = 5, K = 256;
  for (CpuGemm g : {CpuGemm::double_sum, CpuGemm::eigen}) {
    auto be = make_cpu_backend(g);
    be->set_step(StepScalars{4, 0.0f, 1.0f, 1.0f});
    for (int layout = 0; layout < 4; ++layout)
      for (int n : {2, 32, 256})
        for (bool random : {false, true}) {
          SCOPED_TRACE(testing::Message() << (g == CpuGemm::eigen ? "eigen" : "double") << " layout " << layout
                                          << " n " << n << (random ? " random" : ""));
          const bool akc = layout & 1, bkc = layout & 2;
          const std::vector<float> A = randoms(static_cast<size_t>(M * K), 21), B = randoms(static_cast<size_t>(N * K), 22);
          GemmOperand a, b;
          a.k_contiguous = akc;
          b.k_contiguous = bkc;
          const std::vector<float> C0 = gemm_of(*be, M, N, K, A, a, B, b);
          a.rot = b.rot = spec(n, random, 99, 0);
          const std::vector<float> C1 = gemm_of(*be, M, N, K, A, a, B, b);
          const double l = std::log2(static_cast<double>(n));
          const double c = (2.0 * (l + 2.0) + (g == CpuGemm::eigen ? 2.0 * K : 2.0)) * kU * 1.01;
          int64_t differing = 0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              const std::vector<float> ar = logical_row(A, M, K, akc, i), br = logical_row(B, N, K, bkc, j);
              const double bound = c * norm2(ar.data(), ar.size()) * norm2(br.data(), br.size());
              const float x = C0[static_cast<size_t>(i * N + j)], y = C1[static_cast<size_t>(i * N + j)];
              EXPECT_LE(std::fabs(static_cast<double>(y) - x), bound) << "(" << i << ", " << j << ") " << x << " vs " << y;
              differing += bits(x) != bits(y);
            }
          EXPECT_GT(differing, 0) << "every product bit-identical: was the operand rotated?";
        }
  }
}

// The operand's order of operations: bf16 rounding (round_bf16_first), then the rotation, then the
// statistics and the quantization, all on the rotated tensor. Seen through C = op . I^T with an
// unrotated bf16 identity (each output one exact product).
TEST(RotatedGemm, OperandIsRoundedThenRotatedThenCountedAndQuantized) {
  const int64_t M = 6, K = 64;
  auto be = make_cpu_backend();
  const uint32_t step = 11;
  be->set_step(StepScalars{step, 0.0f, 1.0f, 1.0f});
  be->reset_stats(1);
  const std::vector<float> A = randoms(static_cast<size_t>(M * K), 31);
  std::vector<float> I(static_cast<size_t>(K * K), 0.0f);
  for (int64_t k = 0; k < K; ++k) I[static_cast<size_t>(k * K + k)] = 1.0f;
  GemmOperand a;  // stored [K x M]: blocks and the rotation down the columns
  a.k_contiguous = false;
  a.q.fmt = NumFmt::mxfp4_e2m1;
  a.q.rounding = Rounding::stochastic;
  a.q.seed = 5;
  a.sr_op = 3;
  a.round_bf16_first = true;
  a.bf16_mode = Rounding::nearest_away;
  a.stats_slot = 0;
  a.stats_q = a.q;
  a.rot = spec(32, true, 1234, 0);
  GemmOperand eye;
  eye.q.fmt = NumFmt::bf16;
  std::vector<float> At(A.size());  // A as stored [K x M]
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) At[static_cast<size_t>(k * M + i)] = A[static_cast<size_t>(i * K + k)];
  const std::vector<float> got = gemm_of(*be, M, K, K, At, a, I, eye);
  // By hand: bf16, rotate (salt = the step), count, quantize (seed sr_seed(5, 3), salt = the step).
  std::vector<float> w = At;
  for (float& v : w) v = round_bf16(v, Rounding::nearest_away);
  RotationSpec r = a.rot;
  r.salt = step;
  hadamard_rotate(w.data(), w.data(), K, M, Axis::strided, K, r);
  QuantSpec q = a.q;
  q.seed = sr_seed(5, 3);
  q.salt = step;
  const QuantStats want_stats = mx_stats(w.data(), K, M, Axis::strided, q);
  quantize_dequantize(w.data(), w.data(), K, M, Axis::strided, q);
  // Equal as values: a quantized -0 comes out of the identity product as +0 when it is summed with
  // a +0 product of its row (the only bits the product does not carry over).
  int wrong = 0, zeros = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const float g = got[static_cast<size_t>(i * K + k)], v = w[static_cast<size_t>(k * M + i)];
      wrong += !(g == v);
      zeros += v == 0.0f;
    }
  EXPECT_EQ(wrong, 0);
  EXPECT_LT(zeros, M * K / 2) << "mostly zeros: the check would prove little";
  const QuantStats st = be->read_stats().at(0);
  EXPECT_EQ(st.n, want_stats.n);
  EXPECT_EQ(st.lastbin, want_stats.lastbin);
  EXPECT_EQ(st.clamped, want_stats.clamped);
  EXPECT_EQ(st.blocks, want_stats.blocks);
}

// ---- the model -------------------------------------------------------------------------

namespace {

struct PassResult {
  std::vector<float> out, grads;
  float loss = 0.0f;
};

// Forward, loss and backward of a small MX network (L = 2, d = 32, H = 64, B = 64) under `p`.
PassResult run_pass(const PrecisionConfig& p, int width = 32, int64_t B = 64) {
  ModelConfig m;
  m.depth = 2;
  m.width = width;
  m.hidden_mult = 2;
  const NetShape S = NetShape::student(m);
  auto be = make_cpu_backend();
  be->set_step(StepScalars{3, 0.0f, 1.0f, 1.0f});
  const std::vector<float> init = init_params(S, InitKind::pytorch, 1.0f, 5, Stream::init);
  float* P = test::put(*be, init);
  float* X = test::put(*be, test::noise(static_cast<size_t>(B * S.d), 6));
  float* T = test::put(*be, test::noise(static_cast<size_t>(B * S.d), 7));
  float* G = be->alloc(init.size());
  Workspace ws = Workspace::make(*be, S, B);
  PassPolicy pol;
  pol.p = p;
  pol.seed = 9;
  forward(*be, S, P, X, ws, pol);
  loss_and_grad(*be, LossSpec{}, T, ws, pol, nullptr);
  backward(*be, S, P, X, ws, G, pol);
  PassResult r;
  r.out.resize(static_cast<size_t>(B * S.d));
  be->download(r.out.data(), ws.out, r.out.size());
  r.grads.resize(init.size());
  be->download(r.grads.data(), G, r.grads.size());
  r.loss = be->read_scalar(ws.loss);
  return r;
}

bool same(const std::vector<float>& a, const std::vector<float>& b, int64_t off, int64_t n) {
  return std::memcmp(a.data() + off, b.data() + off, static_cast<size_t>(n) * sizeof(float)) == 0;
}

PrecisionConfig mx_policy() {
  PrecisionConfig p;  // MXFP8 E4M3 everywhere, bf16 element-wise
  p.rounding = Rounding::nearest_away;
  p.elementwise_rounding = Rounding::nearest_away;
  return p;
}

PrecisionConfig rotated(PrecisionConfig p, Gemm g, Rotation r = Rotation::hadamard) {
  p.rotation[static_cast<size_t>(g)] = r;
  return p;
}

}  // namespace

// A GEMM's rotation changes that GEMM and what depends on it, nothing else: Wgrad rotation leaves
// the output, the loss and every gradient that is not a weight's (gamma, beta, b2) bit for bit;
// Dgrad rotation leaves the output and the last block's dW2 and b2 (computed from dout before any
// Dgrad GEMM); Fprop rotation changes the output.
TEST(RotationModel, EachGemmsRotationActsOnThatGemmOnly) {
  const PrecisionConfig base = mx_policy();
  ModelConfig m;
  m.depth = 2;
  m.width = 32;
  m.hidden_mult = 2;
  const NetShape S = NetShape::student(m);
  const PassResult r0 = run_pass(base);
  for (Rotation mode : {Rotation::hadamard, Rotation::random_hadamard}) {
    SCOPED_TRACE(mode == Rotation::hadamard ? "hadamard" : "random_hadamard");
    const PassResult w = run_pass(rotated(base, Gemm::wgrad, mode));
    EXPECT_TRUE(same(w.out, r0.out, 0, static_cast<int64_t>(r0.out.size())));
    EXPECT_EQ(bits(w.loss), bits(r0.loss));
    for (const ParamGroup& g : S.groups) {
      const bool weight = g.kind == ParamGroup::w1 || g.kind == ParamGroup::w2;
      EXPECT_EQ(same(w.grads, r0.grads, g.offset, g.size()), !weight) << "wgrad rotation, " << g.name;
    }
    const PassResult d = run_pass(rotated(base, Gemm::dgrad, mode));
    EXPECT_TRUE(same(d.out, r0.out, 0, static_cast<int64_t>(r0.out.size())));
    for (const ParamGroup& g : S.groups) {
      const bool before_any_dgrad = g.layer == S.depth - 1 && (g.kind == ParamGroup::w2 || g.kind == ParamGroup::b2);
      EXPECT_EQ(same(d.grads, r0.grads, g.offset, g.size()), before_any_dgrad) << "dgrad rotation, " << g.name;
    }
    const PassResult f = run_pass(rotated(base, Gemm::fprop, mode));
    EXPECT_FALSE(same(f.out, r0.out, 0, static_cast<int64_t>(r0.out.size())));
  }
  // Deterministic and random signs are different rotations.
  const PassResult h = run_pass(rotated(base, Gemm::fprop)), rh = run_pass(rotated(base, Gemm::fprop, Rotation::random_hadamard));
  EXPECT_FALSE(same(h.out, rh.out, 0, static_cast<int64_t>(h.out.size())));
}

// Nothing rounded, nothing rotated: an FP32 policy (and the FP32 backward of `backward: false`)
// with rotation on every GEMM is bit for bit the same policy without it.
TEST(RotationModel, GemmsThatRoundNothingAreNotRotated) {
  PrecisionConfig all;
  all.rotation.fill(Rotation::random_hadamard);
  PrecisionConfig f = PrecisionConfig::fp32();
  PrecisionConfig fr = f;
  fr.rotation = all.rotation;
  for (Gemm g : {Gemm::fprop, Gemm::dgrad, Gemm::wgrad}) EXPECT_FALSE(fr.rotates(g));
  const PassResult a = run_pass(f), b = run_pass(fr);
  EXPECT_TRUE(same(a.out, b.out, 0, static_cast<int64_t>(a.out.size())));
  EXPECT_TRUE(same(a.grads, b.grads, 0, static_cast<int64_t>(a.grads.size())));
  // bf16 element-wise rounding alone rounds the operands: rotated.
  fr.elementwise_bf16 = true;
  EXPECT_TRUE(fr.rotates(Gemm::fprop) && fr.rotates(Gemm::dgrad) && fr.rotates(Gemm::wgrad));
  fr.elementwise_bf16 = false;
  fr.grad_wgrad = NumFmt::bf16;  // one rounded operand is enough
  EXPECT_TRUE(fr.rotates(Gemm::wgrad));
  EXPECT_FALSE(fr.rotates(Gemm::dgrad));
  // backward: false: the backward GEMMs are FP32 and not rotated.
  PrecisionConfig fwd = mx_policy();
  fwd.backward = false;
  PrecisionConfig fwd_rot = fwd;
  fwd_rot.rotation[static_cast<size_t>(Gemm::dgrad)] = Rotation::hadamard;
  fwd_rot.rotation[static_cast<size_t>(Gemm::wgrad)] = Rotation::hadamard;
  EXPECT_FALSE(fwd_rot.rotates(Gemm::dgrad) || fwd_rot.rotates(Gemm::wgrad));
  const PassResult c = run_pass(fwd), d = run_pass(fwd_rot);
  EXPECT_TRUE(same(c.grads, d.grads, 0, static_cast<int64_t>(c.grads.size())));
  // to_fp32 (make_fp32) turns the rotation off.
  PrecisionConfig t = mx_policy();
  t.rotation.fill(Rotation::hadamard);
  t.make_fp32();
  EXPECT_EQ(t.rotation, (std::array<Rotation, kLinearGemms>{Rotation::none, Rotation::none, Rotation::none}));
}

TEST(RotationModel, PassesRefuseABlockThatDoesNotDivideARotatedReduction) {
  PrecisionConfig p = mx_policy();
  p.block_size = 16;
  p.rotation.fill(Rotation::hadamard);
  // d = 48: Fprop of fc1 reduces over 48, not a multiple of 32.
  try {
    run_pass(p, 48, 64);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string s = e.what();
    EXPECT_NE(s.find("precision.rotation_block = 32 does not divide the reduction length K = 48 of the Fprop of fc1"),
              std::string::npos)
        << s;
    EXPECT_EQ(s.find('\n'), std::string::npos);
  }
  // B = 16 tokens: the Wgrad GEMMs reduce over 16 < 32 (the forward runs: its GEMMs reduce over d, H).
  try {
    run_pass(p, 32, 16);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is larger than the reduction length K = 16 of the Wgrad GEMMs"),
              std::string::npos)
        << e.what();
  }
  // Leaving the GEMM unrotated is the fix the message names.
  p.rotation[static_cast<size_t>(Gemm::wgrad)] = Rotation::none;
  EXPECT_NO_THROW(run_pass(p, 32, 16));
}

// ---- the configuration -----------------------------------------------------------------

namespace {

RunConfig load(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return config_from_yaml_string(yaml, "r.yaml", overrides);
}

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return test::config_error(yaml, "r.yaml", overrides);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using Rot3 = std::array<Rotation, kLinearGemms>;
constexpr Rotation kN = Rotation::none, kH = Rotation::hadamard, kR = Rotation::random_hadamard;

}  // namespace

TEST(RotationConfig, ParsesPrintsAndRoundTrips) {
  const RunConfig def;
  EXPECT_EQ(def.precision.rotation, (Rot3{kN, kN, kN}));
  EXPECT_EQ(def.precision.rotation_block, 32);
  RunConfig c = load("precision: {rotation: hadamard}\n");
  EXPECT_EQ(c.precision.rotation, (Rot3{kH, kH, kH}));
  c = load("precision: {rotation: {wgrad: random_hadamard}, rotation_block: 64}\n");
  EXPECT_EQ(c.precision.rotation, (Rot3{kN, kN, kR}));
  EXPECT_EQ(c.precision.rotation_block, 64);
  const std::string dumped = dump_config(c);
  EXPECT_TRUE(has(dumped, "  rotation: {fprop: none, dgrad: none, wgrad: random_hadamard}\n")) << dumped;
  EXPECT_TRUE(has(dumped, "  rotation_block: 64\n"));
  EXPECT_TRUE(load(dumped) == c);
  EXPECT_TRUE(has(dump_config(load("precision: {rotation: random_hadamard}\n")), "  rotation: random_hadamard\n"));
  EXPECT_TRUE(has(dump_config(def), "  rotation: none\n"));
  // The run file's policy attribute names it only when it is on (older policies read as before).
  EXPECT_FALSE(has(describe_policy(def.precision), "rotation"));
  EXPECT_TRUE(has(describe_policy(c.precision), " rotation={fprop:none,dgrad:none,wgrad:random_hadamard} rotation_block=64"))
      << describe_policy(c.precision);
  EXPECT_TRUE(has(describe_policy(load("precision: {rotation: hadamard}\n").precision), " rotation=hadamard rotation_block=32"));
}

// Added after run ids were published: left out of the canonical text at its defaults, so every
// existing configuration keeps its id; on, it is a different run.
TEST(RotationConfig, RunIdsOfConfigurationsWithoutItAreUnchanged) {
  const RunConfig def;
  EXPECT_FALSE(has(canonical_config_text(def), "rotation"));
  EXPECT_EQ(config_hash(load("precision: {rotation: none, rotation_block: 32}\n")), config_hash(def));
  EXPECT_NE(config_hash(load("precision: {rotation: hadamard}\n")), config_hash(def));
  EXPECT_NE(config_hash(load("precision: {rotation_block: 64}\n")), config_hash(def));
  EXPECT_NE(config_hash(load("precision: {rotation: hadamard}\n")), config_hash(load("precision: {rotation: random_hadamard}\n")));
}

TEST(RotationConfig, PatchesSetOverridesAndSweeps) {
  // A patch's mapping form changes the GEMMs it names only.
  RunConfig c = load("precision: {rotation: hadamard}\narms:\n  - {name: a, set: {rotation: {wgrad: none}}}\n"
                     "  - {name: b, set: {rotation: random_hadamard, rotation_block: 16}}\n  - {name: c}\n");
  const std::vector<ResolvedArm> arms = resolved_arms(c);
  EXPECT_EQ(arms[0].policy.rotation, (Rot3{kH, kH, kN}));
  EXPECT_EQ(arms[1].policy.rotation, (Rot3{kR, kR, kR}));
  EXPECT_EQ(arms[1].policy.rotation_block, 16);
  EXPECT_EQ(arms[2].policy.rotation, (Rot3{kH, kH, kH}));
  EXPECT_EQ(c.arms[0].set.at("rotation.wgrad"), "none");
  // --set of one GEMM under a one-mode rotation keeps the others' mode.
  c = load("precision: {rotation: hadamard}\n", {"precision.rotation.dgrad=none"});
  EXPECT_EQ(c.precision.rotation, (Rot3{kH, kN, kH}));
  c = load("steps: 5\n", {"precision.rotation=random_hadamard"});
  EXPECT_EQ(c.precision.rotation, (Rot3{kR, kR, kR}));
  // A sweep over it.
  const std::vector<ExpandedRun> runs =
      expand_experiment_string("sweep:\n  grid:\n    precision.rotation: [none, hadamard]\n", "s.yaml");
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[1].cfg.precision.rotation, (Rot3{kH, kH, kH}));
  EXPECT_NE(runs[0].id, runs[1].id);
  // Interventions take it too, and to_fp32 ends it.
  c = load("steps: 10\ninterventions:\n  - {name: r, at: 5, set: {rotation: {fprop: hadamard}}}\n"
           "  - {name: f, at: 5, apply: to_fp32}\nprecision: {rotation: random_hadamard}\n");
  EXPECT_EQ(apply_intervention(c.precision, c.interventions[0]).rotation, (Rot3{kH, kR, kR}));
  EXPECT_EQ(apply_intervention(c.precision, c.interventions[1]).rotation, (Rot3{kN, kN, kN}));
}

TEST(RotationConfig, ErrorsAreOneLineNamingTheProblemAndTheFix) {
  std::string e = error_of("precision: {rotation_block: 24}\n");
  EXPECT_TRUE(has(e, "r.yaml:1: precision.rotation_block must be a power of two from 2 to 4096 (the Hadamard block), got 24"))
      << e;
  EXPECT_TRUE(has(error_of("precision: {rotation_block: 8192}\n"), "got 8192"));
  EXPECT_TRUE(has(error_of("precision: {rotation_block: 1}\n"), "got 1"));
  EXPECT_TRUE(has(error_of("precision: {rotation: hadamrd}\n"), "precision.rotation: unknown rotation 'hadamrd'"));
  EXPECT_TRUE(has(error_of("precision: {rotation: {wgrd: hadamard}}\n"), "unknown GEMM 'wgrd' in precision.rotation"));
  EXPECT_TRUE(has(error_of("precision: {rotation: {wgrd: hadamard}}\n"), "did you mean 'wgrad'"));
  EXPECT_TRUE(has(error_of("steps: 5\n", {"precision.rotation.wgard=hadamard"}), "unknown key 'precision.rotation.wgard'"));
  // Block larger than a rotated reduction: d = 16 < 32 (MX blocks of 16).
  e = error_of("model: {width: 16}\nprecision: {block_size: 16, rotation: {fprop: hadamard}}\n");
  EXPECT_TRUE(has(e, "r.yaml:2: precision.rotation_block = 32 is larger than the reduction length K = 16 of the Fprop of fc1"))
      << e;
  EXPECT_TRUE(has(e, "use a power-of-two rotation_block that divides 16, or leave fprop unrotated")) << e;
  // Not dividing: 48 tokens a step in the Wgrad GEMMs.
  e = error_of("data: {batch: 48}\nprecision: {rotation: hadamard}\n");
  EXPECT_TRUE(has(e, "does not divide the reduction length K = 48 of the Wgrad GEMMs")) << e;
  EXPECT_TRUE(has(e, "data.batch * data.seq_len")) << e;
  // SwiGLU at d = 512: H' = 1365 (fc2's Fprop reduces over it) and W1 has 2 H' = 2730 rows (fc1's
  // Dgrad): neither takes blocks of 32; the Wgrad GEMMs (2048 tokens) do.
  e = error_of("model: {activation: swiglu}\nprecision: {rotation: {dgrad: hadamard}}\n");
  EXPECT_TRUE(has(e, "K = 2730 of the Dgrad of fc1")) << e;
  e = error_of("model: {activation: swiglu}\nprecision: {rotation: {fprop: hadamard}}\n");
  EXPECT_TRUE(has(e, "K = 1365 of the Fprop of fc2")) << e;
  EXPECT_EQ(error_of("model: {activation: swiglu}\nprecision: {rotation: {wgrad: hadamard}}\n"), "");
  // An arm's patch is checked as its own policy, and the error names the arm.
  e = error_of("data: {batch: 48}\narms:\n  - {name: ok}\n  - {name: rot, set: {rotation: {wgrad: hadamard}}}\n");
  EXPECT_TRUE(has(e, "arm 'rot'")) << e;
  EXPECT_TRUE(has(e, "K = 48 of the Wgrad GEMMs")) << e;
  // A GEMM that rounds nothing is not rotated, so it is not checked (FP32 policy).
  EXPECT_EQ(error_of("data: {batch: 48}\nprecision: {weight: fp32, activation: fp32, grad: fp32, ln_affine: none, "
                     "elementwise: fp32, rotation: hadamard}\n"),
            "");
  for (const std::string& s : {error_of("precision: {rotation_block: 24}\n"), error_of("data: {batch: 48}\nprecision: {rotation: hadamard}\n")})
    EXPECT_EQ(s.find('\n'), std::string::npos) << s;
}

// Arms with rotations train in lock-step with the others, each bit-identical to its single-arm run;
// each rotation changes the trajectory.
TEST(RotationArms, EachArmEqualsItsSingleRunAndRotationMatters) {
  RunConfig multi;
  multi.seed = 11;
  multi.steps = 8;
  multi.model.depth = 2;
  multi.model.width = 32;
  multi.model.hidden_mult = 2;
  multi.data.batch = 64;
  multi.optimizer.lr = 3e-3f;
  multi.precision.rounding = Rounding::nearest_away;
  multi.precision.elementwise_rounding = Rounding::nearest_away;
  multi.log.log_every = 4;
  multi.log.bias_every = 3;
  multi.log.progress = false;
  RunConfig base = multi;
  multi.arms = {{"mx", "", {}},
                {"rot_all", "", {{"rotation", "hadamard"}}},
                {"rand_rot_sr", "", {{"rotation", "random_hadamard"}, {"rounding.grad", "stochastic"}}},
                {"rot_wgrad", "", {{"rotation.wgrad", "hadamard"}}}};
  ASSERT_NO_THROW(validate_config(multi));
  const MemorySink m = test::run_in_memory(multi);
  std::map<std::string, std::vector<float>> losses;
  for (const ResolvedArm& arm : resolved_arms(multi)) {
    SCOPED_TRACE(arm.name);
    RunConfig single = base;
    single.precision = arm.policy;
    const MemorySink s = test::run_in_memory(single);
    const auto& lm = m.groups.at("trajectories/" + arm.name).loss_all;
    const auto& ls = s.groups.at("trajectories/mx").loss_all;
    ASSERT_EQ(lm.size(), ls.size());
    EXPECT_EQ(std::memcmp(lm.data(), ls.data(), lm.size() * sizeof(float)), 0);
    EXPECT_EQ(m.groups.at("trajectories/fp32").loss_all, s.groups.at("trajectories/fp32").loss_all);
    losses[arm.name] = lm;
  }
  for (const auto& [arm, loss] : losses)
    if (arm != "mx") {
      EXPECT_NE(loss, losses.at("mx")) << arm << " trains like the unrotated arm";
    }
  EXPECT_TRUE(has(m.groups.at("trajectories/rot_all").attrs.str.at("policy"), " rotation=hadamard rotation_block=32"));
}

// ---- the pre-registered experiment E4 ----------------------------------------------------

namespace {

// The policy with the fields an E4 arm may change put back to mx_all's.
PrecisionConfig without_rotation_and_rounding(PrecisionConfig p, const PrecisionConfig& ref) {
  p.rotation = ref.rotation;
  p.rotation_block = ref.rotation_block;
  p.rounding = ref.rounding;
  p.rounding_weight = ref.rounding_weight;
  p.rounding_activation = ref.rounding_activation;
  p.rounding_grad = ref.rounding_grad;
  p.rounding_ln_affine = ref.rounding_ln_affine;
  p.rounding_grad_wgrad = ref.rounding_grad_wgrad;
  return p;
}

}  // namespace

TEST(WhyMxE4, TheExperimentFollowsThePreRegistration) {
  const std::string dir = std::string(MXLAB_SOURCE_DIR) + "/experiments/paper/";
  const std::string path = dir + "why_mx_e4.yaml";
  const testutil::Proc p = testutil::run_mxlab({"plan", path});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(testutil::contains(p.output, "239")) << p.output;
  const std::vector<ExpandedRun> runs = expand_experiment(path);
  ASSERT_EQ(runs.size(), 40u);
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].cfg.seed, 200 + i);
  const RunConfig& c = runs[0].cfg;
  EXPECT_EQ(c.steps, 20000);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 5.0e-4f);
  EXPECT_TRUE(c.interventions.empty());
  const std::vector<ResolvedArm> arms = resolved_arms(c);
  ASSERT_EQ(arms.size(), 4u);
  EXPECT_EQ(arms[0].name, "mx_all");
  EXPECT_EQ(arms[1].name, "rot_all");
  EXPECT_EQ(arms[2].name, "rand_rot_sr");
  EXPECT_EQ(arms[3].name, "rot_e1");
  using R = PrecisionConfig::Role;
  // mx_all: MX-all, no rotation, the emulator's ties-away rounding everywhere.
  const PrecisionConfig& mx = arms[0].policy;
  EXPECT_TRUE(mx == c.precision);
  EXPECT_EQ(mx.rotation, (Rot3{kN, kN, kN}));
  EXPECT_EQ(mx.rotation_block, 32);
  EXPECT_TRUE(mx.rounding_uniform());
  EXPECT_EQ(mx.rounding_of(R::weight), Rounding::nearest_away);
  for (NumFmt f : {mx.weight, mx.activation, mx.grad, mx.weight_bwd_fmt(), mx.activation_bwd_fmt(), mx.grad_wgrad_fmt(),
                   mx.ln_affine})
    EXPECT_EQ(f, NumFmt::mxfp8_e4m3);
  // rot_all: deterministic Hadamard on the three GEMMs, blocks of 32; nothing else changed.
  const PrecisionConfig& rot = arms[1].policy;
  EXPECT_EQ(rot.rotation, (Rot3{kH, kH, kH}));
  EXPECT_EQ(rot.rotation_block, 32);
  EXPECT_TRUE(rot.rotates(Gemm::fprop) && rot.rotates(Gemm::dgrad) && rot.rotates(Gemm::wgrad));
  EXPECT_TRUE(without_rotation_and_rounding(rot, mx) == mx);
  EXPECT_TRUE(rot.rounding_uniform() && rot.rounding_of(R::weight) == Rounding::nearest_away);
  // rand_rot_sr: random Hadamard on the three GEMMs and stochastic rounding of the gradients
  // (dY in Dgrad and Wgrad), weights, activations and the layernorm gains as in mx_all.
  const PrecisionConfig& rr = arms[2].policy;
  EXPECT_EQ(rr.rotation, (Rot3{kR, kR, kR}));
  EXPECT_EQ(rr.rotation_block, 32);
  EXPECT_EQ(rr.rounding_of(R::grad), Rounding::stochastic);
  EXPECT_EQ(rr.rounding_of(R::grad_wgrad), Rounding::stochastic);
  for (R role : {R::weight, R::activation, R::ln_affine}) EXPECT_EQ(rr.rounding_of(role), Rounding::nearest_away);
  EXPECT_TRUE(without_rotation_and_rounding(rr, mx) == mx);
  // rot_e1: deterministic Hadamard on the GEMM E1 found necessary (Fprop, the only keep_bf16_<GEMM>
  // arm with a significant HR < 1 against mx_all) and nowhere else; nothing else changed.
  const PrecisionConfig& r1 = arms[3].policy;
  EXPECT_EQ(r1.rotation, (Rot3{kH, kN, kN}));
  EXPECT_TRUE(r1.rotates(Gemm::fprop) && !r1.rotates(Gemm::dgrad) && !r1.rotates(Gemm::wgrad));
  EXPECT_TRUE(without_rotation_and_rounding(r1, mx) == mx);
  EXPECT_TRUE(r1.rounding_uniform() && r1.rounding_of(R::weight) == Rounding::nearest_away);
  // Pairing with E1: the same runs but for the arms (so the FP32 trajectory and mx_all are E1's).
  const std::vector<ExpandedRun> e1 = expand_experiment(dir + "why_mx_e1.yaml");
  ASSERT_EQ(e1.size(), runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    RunConfig a = runs[i].cfg, b = e1[i].cfg;
    EXPECT_TRUE(resolved_arms(b)[0].name == "mx_all" && resolved_arms(b)[0].policy == resolved_arms(a)[0].policy);
    a.arms.clear();
    b.arms.clear();
    a.name = b.name;
    EXPECT_TRUE(a == b) << "seed " << a.seed << ": E4's run differs from E1's beyond its arms\n"
                        << dump_config(a) << "\nvs\n" << dump_config(b);
  }
}
