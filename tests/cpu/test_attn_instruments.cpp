// The attention projections' instruments (lab/train/attn_instruments.h; lab/train/SCHEMA.md,
// "Attention networks only"): attn_wq_spec, attn_wk_spec, attn_wv_spec (power iteration against a
// dense SVD, on constructed matrices and on a run's own weights) and attn_dwq_err_cos (the cosine
// function on constructed directions; the trainer's rows against the cosine recomputed from its
// gradient buffers; NaN where the schema says; carried by checkpoints and into branches).
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "lab/config/config_io.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/io/h5file.h"
#include "lab/model/mlp.h"
#include "lab/runs/checkpoint.h"
#include "lab/train/attn_instruments.h"
#include "lab/train/trainer.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/test_util.h"
#include "tests/cpu/trainer_util.h"

namespace mxlab {
namespace {

using Mat = Eigen::MatrixXd;

std::vector<float> gaussian(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(nd(rng));
  return v;
}

Mat to_mat(const std::vector<float>& a, int64_t rows, int64_t cols) {
  Mat m(rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m(i, j) = a[static_cast<size_t>(i * cols + j)];
  return m;
}

// The largest singular value of the float matrix, by a dense SVD in double.
double dense_sigma_max(const std::vector<float>& a, int64_t rows, int64_t cols) {
  return Eigen::BDCSVD<Mat>(to_mat(a, rows, cols)).singularValues()(0);
}

// Orthogonal n x n from the QR of a Gaussian matrix.
Mat orthogonal(int64_t n, uint64_t seed) {
  const std::vector<float> g = gaussian(static_cast<size_t>(n * n), seed);
  Eigen::HouseholderQR<Mat> qr(to_mat(g, n, n));
  return qr.householderQ() * Mat::Identity(n, n);
}

// U diag(s) Vᵀ, rounded to float: a matrix with singular values (almost exactly) s.
std::vector<float> with_spectrum(const std::vector<double>& s, uint64_t seed) {
  const int64_t n = static_cast<int64_t>(s.size());
  const Mat u = orthogonal(n, seed), v = orthogonal(n, seed + 1);
  Mat d = Mat::Zero(n, n);
  for (int64_t i = 0; i < n; ++i) d(i, i) = s[static_cast<size_t>(i)];
  const Mat a = u * d * v.transpose();
  std::vector<float> out(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) out[static_cast<size_t>(i * n + j)] = static_cast<float>(a(i, j));
  return out;
}

// Relative error of spectral_norm against the dense value; never above it beyond rounding.
double rel_error(const std::vector<float>& a, int64_t rows, int64_t cols) {
  const double exact = dense_sigma_max(a, rows, cols), est = spectral_norm(a.data(), rows, cols);
  EXPECT_LE(est, exact * (1.0 + 1e-12)) << rows << "x" << cols << ": above the exact value";
  return (exact - est) / exact;
}

// ---- spectral_norm ----

// Gaussian matrices are the hard case of power iteration (the top singular values of a random
// matrix crowd together, about d^(-2/3) apart relatively, and now and then two nearly coincide):
// 100 iterations stay within 2 %, square or not, up to the largest width the study runs (d = 512).
// (Over 200 Gaussian matrices of each shape from 8 x 8 to 192 x 64 the worst was 1.5 %, the mean
// 0.01-0.04 %; 30 iterations reach 4.5 % in 30.)
TEST(SpectralNorm, WithinTwoPercentOfADenseSvdOnGaussianMatrices) {
  double worst = 0.0;
  uint64_t seed = 10;
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {16, 16}, {64, 64}, {128, 128}, {256, 256}, {512, 512}, {96, 32}, {40, 24}, {24, 40}})
    for (int trial = 0; trial < (rows >= 256 ? 1 : 3); ++trial) {
      const double e = rel_error(gaussian(static_cast<size_t>(rows * cols), seed++, 1.0 / std::sqrt(cols)), rows, cols);
      EXPECT_LE(e, 2e-2) << rows << "x" << cols << " trial " << trial;
      worst = std::max(worst, e);
    }
  std::printf("[spectral_norm] Gaussian matrices: largest relative error %.3g\n", worst);
}

// Where the top singular value stands apart (ratio >= 1.2 to the next: trained weights whose norm
// grows), and on ill-conditioned matrices (singular values spread over 12 decades; also scaled by
// 2^±40), 100 iterations agree with the SVD within 1e-12: rounding only.
TEST(SpectralNorm, ExactUpToRoundingWhereTheTopValueStandsApart) {
  for (const int64_t n : {32, 64, 128}) {
    std::vector<double> spike(static_cast<size_t>(n)), ill(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      spike[static_cast<size_t>(i)] = i == 0 ? 1.2 : 1.0 - 0.5 * static_cast<double>(i) / static_cast<double>(n);
      ill[static_cast<size_t>(i)] = std::pow(10.0, -12.0 * static_cast<double>(i) / static_cast<double>(n - 1));
    }
    EXPECT_LE(rel_error(with_spectrum(spike, 100 + n), n, n), 1e-12) << "spike, n " << n;
    EXPECT_LE(rel_error(with_spectrum(ill, 200 + n), n, n), 1e-12) << "ill-conditioned, n " << n;
    // Scaled by 2^±40: the same relative accuracy (nothing under- or overflows).
    std::vector<float> big = with_spectrum(ill, 300 + n), small = big;
    for (float& x : big) x = std::ldexp(x, 40);
    for (float& x : small) x = std::ldexp(x, -40);
    EXPECT_LE(rel_error(big, n, n), 1e-12) << "ill-conditioned x 2^40, n " << n;
    EXPECT_LE(rel_error(small, n, n), 1e-12) << "ill-conditioned x 2^-40, n " << n;
  }
  // Rank one, u vᵀ: exactly |u| |v| up to rounding, whatever the shape.
  const std::vector<float> u = gaussian(48, 7), v = gaussian(20, 8);
  std::vector<float> r1(48 * 20);
  double nu = 0.0, nv = 0.0;
  for (size_t i = 0; i < 48; ++i) nu += static_cast<double>(u[i]) * u[i];
  for (size_t j = 0; j < 20; ++j) nv += static_cast<double>(v[j]) * v[j];
  for (size_t i = 0; i < 48; ++i)
    for (size_t j = 0; j < 20; ++j) r1[i * 20 + j] = u[i] * v[j];
  EXPECT_NEAR(spectral_norm(r1.data(), 48, 20), std::sqrt(nu * nv), 1e-6 * std::sqrt(nu * nv));
}

TEST(SpectralNorm, ZeroNonFiniteAndTheStartVector) {
  std::vector<float> a(64, 0.0f);
  EXPECT_EQ(spectral_norm(a.data(), 8, 8), 0.0);
  a[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(spectral_norm(a.data(), 8, 8)));
  a[5] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(spectral_norm(a.data(), 8, 8)));
  // The start is no multiple of the all-ones vector: a matrix whose rows sum to zero (A·1 = 0,
  // as W_Q's gradient behind a layernorm) is measured like any other.
  std::vector<float> centred = gaussian(32 * 32, 11, 1.0 / std::sqrt(32.0));
  for (int i = 0; i < 32; ++i) {
    double mean = 0.0;
    for (int j = 0; j < 32; ++j) mean += centred[i * 32 + j];
    mean /= 32.0;
    for (int j = 0; j < 32; ++j) centred[i * 32 + j] = static_cast<float>(centred[i * 32 + j] - mean);
  }
  EXPECT_LE(rel_error(centred, 32, 32), 2e-2);
  double ones_overlap = 0.0, sq = 0.0;
  for (int64_t j = 0; j < 512; ++j) {
    const double x = spectral_start(j);
    EXPECT_TRUE(x >= -0.5 && x < 0.5) << j;
    ones_overlap += x;
    sq += x * x;
  }
  EXPECT_LT(std::fabs(ones_overlap) / std::sqrt(512.0 * sq), 0.2);  // far from the all-ones direction
  EXPECT_EQ(spectral_start(3), spectral_start(3));
  EXPECT_NE(spectral_start(3), spectral_start(4));
}

// The batch over threads gives the bits of one matrix at a time, whatever the number of threads.
TEST(SpectralNorm, ThreadsChangeNoBit) {
  const int64_t d = 256;
  std::vector<std::vector<float>> m;
  std::vector<const float*> p;
  for (int k = 0; k < 20; ++k) m.push_back(gaussian(static_cast<size_t>(d * d), 500 + k, 0.0625));
  for (const auto& x : m) p.push_back(x.data());
  std::vector<double> serial(p.size());
  for (size_t k = 0; k < p.size(); ++k) serial[k] = spectral_norm(p[k], d, d);
  for (unsigned threads : {0u, 1u, 3u, 64u}) {
    std::vector<double> out(p.size(), -1.0);
    spectral_norms(p.data(), p.size(), d, d, out.data(), threads);
    for (size_t k = 0; k < p.size(); ++k) EXPECT_EQ(out[k], serial[k]) << threads << " threads, matrix " << k;
  }
}

// ---- direction_cosine ----

TEST(DirectionCosine, ExactlyOneWhenTheDirectionRepeats) {
  const std::vector<float> a = gaussian(4096, 21, 1e-3);
  std::vector<float> scaled = a, neg = a, other = gaussian(4096, 22, 5.0);
  for (float& x : scaled) x = std::ldexp(x, -7);
  for (float& x : neg) x = -x;
  EXPECT_EQ(direction_cosine(a.data(), a.data(), a.size()), 1.0);
  EXPECT_EQ(direction_cosine(a.data(), scaled.data(), a.size()), 1.0);
  EXPECT_EQ(direction_cosine(scaled.data(), a.data(), a.size()), 1.0);
  EXPECT_EQ(direction_cosine(a.data(), neg.data(), a.size()), -1.0);
  // Any positive multiple: 1 up to rounding, never beyond.
  std::vector<float> times3 = a;
  for (float& x : times3) x *= 3.0f;
  const double c3 = direction_cosine(a.data(), times3.data(), a.size());
  EXPECT_LE(c3, 1.0);
  EXPECT_GT(c3, 1.0 - 1e-12);
  // Against Eigen, and within [-1, 1], on unrelated and on partly aligned directions.
  for (double mix : {0.0, 0.3, 0.9, -0.7}) {
    std::vector<float> b(a.size());
    for (size_t i = 0; i < a.size(); ++i) b[i] = static_cast<float>(mix * a[i] * 5e3 + other[i]);
    Eigen::VectorXd x(a.size()), y(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      x(static_cast<Eigen::Index>(i)) = a[i];
      y(static_cast<Eigen::Index>(i)) = b[i];
    }
    const double want = x.dot(y) / (x.norm() * y.norm()), got = direction_cosine(a.data(), b.data(), a.size());
    EXPECT_NEAR(got, want, 1e-12) << mix;
    EXPECT_TRUE(got >= -1.0 && got <= 1.0);
  }
  std::vector<float> orth = {1.0f, 0.0f, 0.0f}, e2 = {0.0f, 2.0f, 0.0f};
  EXPECT_EQ(direction_cosine(orth.data(), e2.data(), 3), 0.0);
}

TEST(DirectionCosine, NaNWithoutADirection) {
  const std::vector<float> a = gaussian(100, 31), zero(100, 0.0f);
  EXPECT_TRUE(std::isnan(direction_cosine(a.data(), zero.data(), 100)));
  EXPECT_TRUE(std::isnan(direction_cosine(zero.data(), a.data(), 100)));
  std::vector<float> bad = a;
  bad[50] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(direction_cosine(a.data(), bad.data(), 100)));
  bad[50] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(direction_cosine(bad.data(), a.data(), 100)));
}

// ---- the trainer's rows ----

// An attention network with the FP32 trajectory, an exact-attention MX arm and a flash arm, a
// branch of each (the flash arm's to FP32 at 4, the MX arm's to the stabilized flash kernel at 6),
// rows at 0, 2, 4, 6, 8 and shadow passes at 0, 3, 6 and the last step, 8: logged shadow rows 0,
// 6, 8 (step 3's shadow pass is not logged).
RunConfig attn_run() {
  RunConfig c;
  c.seed = 4;
  c.steps = 9;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 1;
  c.model.block = BlockKind::attention;
  c.model.heads = 2;
  c.data.batch = 2;
  c.data.seq_len = 32;
  c.precision.block_size = 16;
  c.optimizer.lr = 1e-2f;
  c.log.log_every = 2;
  c.log.bias_every = 3;
  c.log.progress = false;
  c.log.snapshot_steps = {6};
  c.log.probe_batch = 32;  // one sequence
  c.arms = {{"mx", "", {}}, {"flash", "flash_bf16", {{"attention_tile", "[16, 8]"}}}};
  c.interventions = {{"flash_fp32", 4, "to_fp32", {}, "flash"}, {"mx_stab", 6, "stabilized_softmax", {}, "mx"}};
  validate_config(c);
  return c;
}

// metric -> step -> the row's values, over the logged rows of `group`.
std::map<std::string, std::map<int64_t, std::vector<double>>> by_step(const MemorySink& s, const std::string& group) {
  std::map<std::string, std::map<int64_t, std::vector<double>>> out;
  for (const MetricRow& r : s.groups.at(group).rows)
    if (r.axis == "step")
      for (const auto& [name, v] : r.cols) out[name][r.step] = v;
  return out;
}

const char* const kNew[] = {"attn_wq_spec", "attn_wk_spec", "attn_wv_spec", "attn_dwq_err_cos"};

// The MX trajectories' shadow rows after their first have a cosine in [-1, 1]; the FP32
// trajectory's rows, rows without a shadow pass and the first shadow row are NaN; a branch's
// first row compares with its source's last logged error (carried), and a to_fp32 branch has no
// error at all (its gradient is the shadow's, bit for bit): NaN.
TEST(AttnInstrumentsTrainer, TheCosineIsNaNWhereThereIsNoErrorOrNoPreviousOne) {
  const MemorySink s = test::run_in_memory(attn_run());
  for (const char* g : {"trajectories/fp32", "trajectories/mx", "trajectories/flash", "branches/flash_fp32",
                        "branches/mx_stab"}) {
    const auto rows = by_step(s, g);
    for (const char* m : kNew) ASSERT_TRUE(rows.count(m)) << g << " has no " << m;
    for (const auto& [step, v] : rows.at("attn_dwq_err_cos")) {
      ASSERT_EQ(v.size(), 2u) << g;
      for (double c : v) {
        const std::string gs = g;
        const bool finite_expected = (gs == "trajectories/mx" || gs == "trajectories/flash") ? (step == 6 || step == 8)
                                     : gs == "branches/mx_stab"                              ? (step == 6 || step == 8)
                                                                                             : false;
        if (finite_expected) {
          EXPECT_TRUE(c >= -1.0 && c <= 1.0) << g << " step " << step << ": " << c;
        } else {
          EXPECT_TRUE(std::isnan(c)) << g << " step " << step << ": " << c;
        }
      }
    }
    for (const char* m : {"attn_wq_spec", "attn_wk_spec", "attn_wv_spec"})
      for (const auto& [step, v] : rows.at(m)) {
        ASSERT_EQ(v.size(), 2u);
        for (double x : v) EXPECT_TRUE(std::isfinite(x) && x > 0.0) << g << " " << m << " step " << step;
      }
  }
  // The flash arm's error is no noise: its direction persists from step 6 to 8 in some layer.
  const auto flash = by_step(s, "trajectories/flash").at("attn_dwq_err_cos");
  EXPECT_GT(std::max(flash.at(8)[0], flash.at(8)[1]), 0.0);
}

// The rows against the cosine recomputed from the trainer's own buffers: a second trainer stopped
// after steps 0, 6 and 8 (the logged shadow steps; step 3's unlogged one does not count) gives
// g~ and g-bar of each; E = their difference over W_Q's rows (the first d rows of Wqkv), and the
// cosine of consecutive E's in double with Eigen is the row's value. W_K's block would not be.
TEST(AttnInstrumentsTrainer, TheCosineIsThatOfTheWqErrorAtThePreviousLoggedShadowStep) {
  const RunConfig cfg = attn_run();
  const MemorySink whole = test::run_in_memory(cfg);
  auto be = make_cpu_backend();
  MemorySink sink;
  Trainer tr(cfg, *be, sink);
  tr.open_output();
  const NetShape& shape = tr.shape();
  const int64_t d = shape.d;
  // error[trajectory][layer][block k: 0 = Q, 1 = K] at each stop, as double vectors.
  std::map<int64_t, std::map<std::string, std::vector<std::vector<Eigen::VectorXd>>>> error;
  for (const int64_t stop : {0, 6, 8}) {
    tr.run(RunControl{}, stop + 1);
    for (const char* name : {"mx", "flash"}) {
      Trajectory& t = *tr.find_trajectory(name);
      auto& per_layer = error[stop][name];
      for (int l = 0; l < shape.depth; ++l) {
        const ParamGroup* g = shape.find(l, ParamGroup::wqkv);
        const std::vector<float> gt = tr.download(t.grads + g->offset, static_cast<size_t>(2 * d * d)),
                                 gs = tr.download(t.shadow + g->offset, static_cast<size_t>(2 * d * d));
        per_layer.emplace_back();
        for (int k = 0; k < 2; ++k) {
          Eigen::VectorXd e(d * d);
          for (int64_t j = 0; j < d * d; ++j)
            e(j) = static_cast<double>(gt[static_cast<size_t>(k * d * d + j)]) - gs[static_cast<size_t>(k * d * d + j)];
          per_layer.back().push_back(e);
        }
      }
    }
  }
  size_t compared = 0;
  for (const char* name : {"mx", "flash"}) {
    const auto rows = by_step(whole, std::string("trajectories/") + name).at("attn_dwq_err_cos");
    for (const auto& [prev, now] : std::vector<std::pair<int64_t, int64_t>>{{0, 6}, {6, 8}})
      for (int l = 0; l < shape.depth; ++l) {
        const Eigen::VectorXd& a = error[now][name][l][0];
        const Eigen::VectorXd& b = error[prev][name][l][0];
        const double want = a.dot(b) / (a.norm() * b.norm());
        EXPECT_NEAR(rows.at(now)[l], want, 1e-9) << name << " step " << now << " layer " << l;
        const Eigen::VectorXd& ak = error[now][name][l][1];
        const Eigen::VectorXd& bk = error[prev][name][l][1];
        EXPECT_GT(std::fabs(rows.at(now)[l] - ak.dot(bk) / (ak.norm() * bk.norm())), 1e-6)
            << name << " step " << now << " layer " << l << ": W_K's cosine";
        ++compared;
      }
  }
  EXPECT_EQ(compared, 8u);
}

// The spectral norms of a row are those of the weights the step's forward used: a snapshot at
// step 6 (the state before its update; also of the branch that starts there) gives, block by block of Wqkv, the row's values bit for
// bit through spectral_norm, and a dense SVD agrees within the Gaussian bound.
TEST(AttnInstrumentsTrainer, SpectralNormsAreThoseOfTheWeightsTheStepUsed) {
  const MemorySink s = test::run_in_memory(attn_run());
  const char* const names[] = {"attn_wq_spec", "attn_wk_spec", "attn_wv_spec"};
  size_t compared = 0;
  for (const char* traj : {"fp32", "mx", "flash", "flash_fp32", "mx_stab"}) {
    const std::string group = std::string(traj == std::string("flash_fp32") || traj == std::string("mx_stab")
                                               ? "branches/"
                                               : "trajectories/") + traj;
    const auto rows = by_step(s, group);
    for (int l = 0; l < 2; ++l) {
      const auto it = s.arrays.find(msg("snapshots/", traj, "/step_6/layer", l, ".Wqkv"));
      ASSERT_NE(it, s.arrays.end()) << group << " layer " << l;
      ASSERT_EQ(it->second.rows, 96);
      ASSERT_EQ(it->second.cols, 32);
      for (int k = 0; k < 3; ++k) {
        const std::vector<float> block(it->second.data.begin() + k * 32 * 32, it->second.data.begin() + (k + 1) * 32 * 32);
        const double row = rows.at(names[k]).at(6)[l];
        EXPECT_EQ(row, spectral_norm(block.data(), 32, 32)) << group << " " << names[k] << " layer " << l;
        const double exact = dense_sigma_max(block, 32, 32);
        EXPECT_LE(row, exact * (1.0 + 1e-12));
        EXPECT_GE(row, exact * (1.0 - 2e-2)) << group << " " << names[k] << " layer " << l;
        ++compared;
      }
    }
    // Q, K and V are three different matrices.
    EXPECT_NE(rows.at("attn_wq_spec").at(6)[0], rows.at("attn_wk_spec").at(6)[0]) << group;
  }
  EXPECT_EQ(compared, 5u * 2u * 3u);  // 5 groups, 2 layers, 3 blocks
}

// A resume from a checkpoint at step 5 ends with the rows of the uninterrupted run bit for bit:
// row 6's cosine needs step 0's error, which only the checkpoint holds.
TEST(AttnInstrumentsTrainer, APreviousErrorResumesFromACheckpoint) {
  const RunConfig cfg = attn_run();
  const MemorySink whole = test::run_in_memory(cfg);
  auto be = make_cpu_backend();
  test::TempDir dir("mxlab_attn_ckpt");
  const std::string path = dir.str() + "/run.ckpt";
  {
    MemorySink first;
    Trainer tr(cfg, *be, first);
    tr.open_output();
    tr.run(RunControl{}, 5);
    ASSERT_EQ(tr.find_trajectory("flash")->dwq_err_prev.size(), 2u * 32 * 32);
    save_checkpoint(tr, config_hash(cfg), path);
  }
  MemorySink second;
  Trainer tr(cfg, *be, second);
  load_checkpoint(tr, config_hash(cfg), path);
  EXPECT_EQ(tr.find_trajectory("flash")->dwq_err_prev.size(), 2u * 32 * 32);
  EXPECT_TRUE(tr.find_trajectory("fp32")->dwq_err_prev.empty());
  tr.open_output();
  tr.finish(tr.run(RunControl{}));
  size_t finite = 0;
  for (const char* g : {"trajectories/fp32", "trajectories/mx", "trajectories/flash", "branches/flash_fp32",
                        "branches/mx_stab"}) {
    const auto a = by_step(whole, g), b = by_step(second, g);
    for (const char* m : kNew) {
      ASSERT_TRUE(b.count(m)) << g << " " << m;
      for (const auto& [step, v] : b.at(m)) {
        ASSERT_TRUE(a.at(m).count(step)) << g << " " << m << " step " << step;
        const std::vector<double>& w = a.at(m).at(step);
        ASSERT_EQ(v.size(), w.size());
        for (size_t l = 0; l < v.size(); ++l) {
          EXPECT_TRUE(std::memcmp(&v[l], &w[l], sizeof(double)) == 0)
              << g << " " << m << " step " << step << " layer " << l << ": " << v[l] << " vs " << w[l];
          finite += std::string(m) == "attn_dwq_err_cos" && step == 6 && std::isfinite(v[l]);
        }
      }
    }
  }
  EXPECT_EQ(finite, 6u);  // mx, flash, mx_stab: both layers of row 6
}

// A checkpoint's W_Q errors are checked against the run (a count that is no number, or not depth x
// d x d, is refused naming the key), and a checkpoint of an earlier build, without them, still
// loads: the trajectories then have no previous error (their next cosine is NaN).
TEST(AttnInstrumentsTrainer, CheckpointErrorsAreCheckedAndEarlierFilesLoad) {
  const RunConfig cfg = attn_run();
  auto be = make_cpu_backend();
  test::TempDir dir("mxlab_attn_ckpt_forge");
  const std::string path = dir.str() + "/run.ckpt";
  {
    MemorySink sink;
    Trainer tr(cfg, *be, sink);
    tr.open_output();
    tr.run(RunControl{}, 5);
    save_checkpoint(tr, config_hash(cfg), path);
  }
  const std::string good = test::read_file(path);
  uint32_t hlen = 0;
  std::memcpy(&hlen, good.data() + 12, 4);
  const std::string header = good.substr(16, hlen);
  // The file's bytes with `header` in place of the original one and `drop` bytes removed before
  // the checksum, sealed again (FNV-1a-64 of every byte before the checksum, as checkpoint.cpp).
  auto forge = [&](const std::string& h, size_t drop) {
    std::string b = good.substr(0, 12);
    const uint32_t n = static_cast<uint32_t>(h.size());
    b.append(reinterpret_cast<const char*>(&n), 4);
    b += h;
    b += good.substr(16 + hlen, good.size() - 16 - hlen - 16 - drop);
    uint64_t f = 0xcbf29ce484222325ull;
    for (unsigned char c : b) {
      f ^= c;
      f *= 0x100000001b3ull;
    }
    b.append(reinterpret_cast<const char*>(&f), 8);
    b += good.substr(good.size() - 8);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
  };
  auto load_error = [&]() -> std::string {
    MemorySink sink;
    Trainer tr(cfg, *be, sink);
    try {
      load_checkpoint(tr, config_hash(cfg), path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string key = "t1.dwq_err_prev=2048\n";  // trajectory 1, the arm `mx`: 2 layers of 32 x 32
  ASSERT_NE(header.find(key), std::string::npos) << header;
  std::string h = header;
  h.replace(h.find(key), key.size(), "t1.dwq_err_prev=20x8\n");
  forge(h, 0);
  std::string e = load_error();
  EXPECT_NE(e.find("malformed t1.dwq_err_prev"), std::string::npos) << e;
  h = header;
  h.replace(h.find(key), key.size(), "t1.dwq_err_prev=2047\n");
  forge(h, 0);
  e = load_error();
  EXPECT_NE(e.find("does not match this run's shapes (t1.dwq_err_prev 2047)"), std::string::npos) << e;
  // An earlier build's file: no such keys and no such floats.
  h.clear();
  size_t dropped = 0;
  std::istringstream lines(header);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find(".dwq_err_prev=");
    if (at == std::string::npos) h += line + "\n";
    else dropped += 4 * std::stoull(line.substr(at + 14));
  }
  EXPECT_EQ(dropped, 3u * 4u * 2048u);  // mx, flash and the branch flash_fp32 (from 4, with flash's); not fp32
  forge(h, dropped);
  MemorySink sink;
  Trainer tr(cfg, *be, sink);
  load_checkpoint(tr, config_hash(cfg), path);
  for (size_t i = 0; i < tr.num_trajectories(); ++i) EXPECT_TRUE(tr.trajectory(i).dwq_err_prev.empty()) << i;
  forge(header, 0);  // the original, sealed again: loads whole
  EXPECT_EQ(load_error(), "");
}

// The run file (HDF5, through the binary): an attention run (rows 0, 2, 4, each with a shadow
// pass) has the four datasets [n, L] in every group; an MLP run has none of them.
TEST(AttnInstrumentsCli, AttentionRunFilesHaveTheDatasetsAndMlpRunFilesDoNot) {
  test::TempDir dir("mxlab_attn_h5");
  const std::string common = "steps: 5\nlog: {log_every: 2, progress: false}\narms:\n  - {name: mx}\n"
                             "  - {name: flash, apply: flash_bf16}\n";
  const std::string attn = dir.write(
      "a.yaml", "model: {depth: 3, width: 32, hidden_mult: 1, block: attention, heads: 2}\ndata: {batch: 2, seq_len: 32}\n" +
                    common);
  const std::string mlp = dir.write("m.yaml", "model: {depth: 3, width: 32, hidden_mult: 1}\ndata: {batch: 16}\n"
                                              "steps: 5\nlog: {log_every: 2, progress: false}\n");
  std::string file;
  ASSERT_NO_FATAL_FAILURE(testutil::train_cpu(attn, dir.str() + "/a", &file));
  {
    const h5::H5File f(file, h5::H5File::Mode::read);
    for (const char* g : {"trajectories/fp32", "trajectories/mx", "trajectories/flash"})
      for (const char* m : kNew) {
        EXPECT_EQ(f.dataset_shape(std::string(g) + "/" + m), (std::vector<uint64_t>{3, 3})) << g << " " << m;
        const std::vector<double> v = f.read_doubles(std::string(g) + "/" + m);
        if (std::string(m) != "attn_dwq_err_cos") {
          for (double x : v) EXPECT_TRUE(std::isfinite(x) && x > 0.0) << g << " " << m;
        }
      }
    for (double x : f.read_doubles("trajectories/fp32/attn_dwq_err_cos")) EXPECT_TRUE(std::isnan(x));
    const std::vector<double> c = f.read_doubles("trajectories/flash/attn_dwq_err_cos");
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(c[i]));  // row 0: no previous error
    for (size_t i = 3; i < c.size(); ++i) EXPECT_TRUE(c[i] >= -1.0 && c[i] <= 1.0) << i;
  }
  ASSERT_NO_FATAL_FAILURE(testutil::train_cpu(mlp, dir.str() + "/m", &file));
  const h5::H5File f(file, h5::H5File::Mode::read);
  for (const char* g : {"trajectories/fp32", "trajectories/mx"})
    for (const char* m : kNew) EXPECT_FALSE(f.exists(std::string(g) + "/" + m)) << g << " " << m;
  EXPECT_TRUE(f.exists("trajectories/mx/bias_ratio"));
}

}  // namespace
}  // namespace mxlab
