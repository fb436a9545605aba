// The token-network ops and the causal mask on CUDA against the CPU reference (lab/model/README.md,
// "Token networks"), bit for bit: both backends evaluate the same scalar code (token_successor,
// kl_exp, kl_prob, kl_logprob, xent_grad_elem of lab/model/elementwise.h) and add every double sum
// in the same order (embed_bwd: the rows of a token in row order; loss_xent: a row's exponentials in
// index order, the row terms in row order). Shapes are odd and cross the kernels' chunk sizes (128
// rows / columns for embed_bwd, 32 for the warp windows of loss_xent); outputs are poisoned (NaN)
// first. An invalid id, which the CPU refuses with mxlab::Error, gives NaN on CUDA where it is used.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "lab/core/philox.h"
#include "lab/model/backend.h"
#include "lab/model/elementwise.h"
#include "tests/gpu/backend_twin.h"
#include "tests/gpu/gpu_test_util.h"

namespace mxlab {
namespace {

using namespace gputest;

const ElementwiseRound kFp32{};
const ElementwiseRound kBf16Even{true, Rounding::nearest_even};
const ElementwiseRound kBf16Away{true, Rounding::nearest_away};

// Token ids in [0, vocab) from Philox (repeats guaranteed when n > vocab).
std::vector<float> ids_of(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] =
        static_cast<float>(philox(seed, Stream::validation, 1, static_cast<uint64_t>(i)).v[0] % vocab);
  return v;
}

StepScalars at_step(uint32_t step) {
  StepScalars s;
  s.step = step;
  return s;
}

TEST(TokensGpu, TokenBatchesMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  for (const auto& [seqs, S, vocab] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{7, 33, 2}, {5, 37, 50},
                                                                                          {300, 16, 1000}}) {
    const size_t n = static_cast<size_t>(seqs * S);
    const Buf ids = t.poisoned(n), tg = t.poisoned(n);
    for (uint32_t step : {0u, 3u, 1000u}) {
      t.set_step(at_step(step));
      t.poison(ids);
      t.poison(tg);
      t.cpu->token_batch(ids.c, tg.c, seqs, S, vocab, 17, Stream::data);
      t.gpu->token_batch(ids.g, tg.g, seqs, S, vocab, 17, Stream::data);
      EXPECT_TRUE(same_bits(t.host_cpu(ids), t.host_gpu(ids))) << "ids vocab " << vocab << " step " << step;
      EXPECT_TRUE(same_bits(t.host_cpu(tg), t.host_gpu(tg))) << "targets vocab " << vocab << " step " << step;
    }
  }
}

TEST(TokensGpu, EmbeddingForwardAndBackwardMatchCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  // rows and d cross embed_bwd's 128-row chunks and 128-column blocks; vocab 400 > rows leaves
  // tokens unseen (dE = 0 there), vocab 7 makes every token repeat many times.
  for (const auto& [rows, d, vocab] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{300, 200, 37}, {67, 129, 400}, {1031, 64, 7}}) {
    const Buf ids = t.make(ids_of(rows, vocab, 5 + rows));
    const Buf E = t.make(normal(static_cast<size_t>(vocab * d), 11, 1.3f));
    const Buf out = t.poisoned(static_cast<size_t>(rows * d));
    for (const ElementwiseRound& r : {kFp32, kBf16Even, kBf16Away}) {
      t.poison(out);
      t.cpu->embed_fwd(ids.c, E.c, out.c, rows, d, vocab, r);
      t.gpu->embed_fwd(ids.g, E.g, out.g, rows, d, vocab, r);
      EXPECT_TRUE(same_bits(t.host_cpu(out), t.host_gpu(out))) << "embed_fwd " << rows << "x" << d << " bf16 " << r.bf16;
    }
    // dout with a wide dynamic range, so that the order of the double additions matters.
    std::vector<float> dv = normal(static_cast<size_t>(rows * d), 12, 1.0f);
    for (size_t i = 0; i < dv.size(); i += 3) dv[i] *= 1e6f;
    const Buf dout = t.make(dv);
    const Buf dE = t.poisoned(static_cast<size_t>(vocab * d));
    t.cpu->embed_bwd(ids.c, dout.c, dE.c, rows, d, vocab);
    t.gpu->embed_bwd(ids.g, dout.g, dE.g, rows, d, vocab);
    EXPECT_TRUE(same_bits(t.host_cpu(dE), t.host_gpu(dE))) << "embed_bwd " << rows << "x" << d << " vocab " << vocab;
  }
}

TEST(TokensGpu, CrossEntropyMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  // vocab 1 (a one-element row), 31 / 33 around the warp window, 200, 1000 (many windows).
  for (int64_t vocab : {1, 31, 33, 200, 1000}) {
    const int64_t rows = 67;
    std::vector<float> l = normal(static_cast<size_t>(rows * vocab), 21 + vocab, 3.0f);
    if (vocab >= 33) {
      // Ties the CPU's scan resolves: the maximum twice in one row, +0 and -0 as the row maximum
      // (the scan keeps the first), a huge logit (exponentials underflow to 0).
      for (int64_t j = 0; j < vocab; ++j) {
        l[static_cast<size_t>(vocab + j)] = j % 7 == 0 ? 5.0f : -1.0f;
        l[static_cast<size_t>(2 * vocab + j)] = j == 3 ? -0.0f : j == 40 % vocab ? 0.0f : -2.0f;
      }
      l[static_cast<size_t>(3 * vocab + 5)] = 200.0f;
    }
    const Buf logits = t.make(l), target = t.make(ids_of(rows, vocab, 9));
    const Buf dl = t.poisoned(static_cast<size_t>(rows * vocab)), loss = t.poisoned(1), hist = t.poisoned(8);
    for (const ElementwiseRound& r : {kFp32, kBf16Even}) {
      t.set_step(at_step(5));
      t.poison(dl);
      t.poison(loss);
      t.cpu->loss_xent(logits.c, target.c, dl.c, loss.c, hist.c, rows, vocab, r);
      t.gpu->loss_xent(logits.g, target.g, dl.g, loss.g, hist.g, rows, vocab, r);
      EXPECT_TRUE(same_bits(t.host_cpu(dl), t.host_gpu(dl))) << "dlogits vocab " << vocab << " bf16 " << r.bf16;
      EXPECT_TRUE(same_bits(t.host_cpu(loss), t.host_gpu(loss))) << "loss vocab " << vocab;
      const std::vector<float> hc = t.host_cpu(hist), hg = t.host_gpu(hist);
      EXPECT_TRUE(same_bits(hc, hg, true)) << "loss history vocab " << vocab;
      EXPECT_EQ(bits(hg[5]), bits(t.host_gpu(loss)[0])) << "history[step] is the loss";
    }
  }
}

TEST(TokensGpu, InvalidIdsGiveNaNWhereTheyAreUsed) {
  MXLAB_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  const int64_t rows = 4, d = 3, vocab = 5;
  const std::vector<float> ids = {1.0f, 2.5f, 4.0f, 5.0f};  // row 1 not an integer, row 3 out of range
  std::vector<float> E(static_cast<size_t>(vocab * d));
  for (size_t i = 0; i < E.size(); ++i) E[i] = static_cast<float>(i);
  float* gi = be->alloc(ids.size());
  float* ge = be->alloc(E.size());
  float* go = be->alloc(static_cast<size_t>(rows * d));
  float* gd = be->alloc(static_cast<size_t>(vocab * d));
  be->upload(gi, ids.data(), ids.size());
  be->upload(ge, E.data(), E.size());
  be->embed_fwd(gi, ge, go, rows, d, vocab, kFp32);
  std::vector<float> out(static_cast<size_t>(rows * d));
  be->download(out.data(), go, out.size());
  for (int64_t c = 0; c < d; ++c) {
    EXPECT_EQ(out[c], E[static_cast<size_t>(1 * d + c)]);  // valid rows as the CPU
    EXPECT_TRUE(std::isnan(out[d + c]));
    EXPECT_EQ(out[2 * d + c], E[static_cast<size_t>(4 * d + c)]);
    EXPECT_TRUE(std::isnan(out[3 * d + c]));
  }
  be->embed_bwd(gi, go, gd, rows, d, vocab);
  std::vector<float> dE(static_cast<size_t>(vocab * d));
  be->download(dE.data(), gd, dE.size());
  for (float x : dE) EXPECT_TRUE(std::isnan(x));  // never a gradient that silently drops a row

  // Cross-entropy with an invalid target in row 1: that row of dlogits and the loss are NaN.
  const std::vector<float> logits(static_cast<size_t>(rows * vocab), 0.5f), target = {0.0f, -1.0f, 4.0f, 2.0f};
  float* gl = be->alloc(logits.size());
  float* gt = be->alloc(target.size());
  float* gdl = be->alloc(logits.size());
  float* loss = be->alloc(1);
  be->upload(gl, logits.data(), logits.size());
  be->upload(gt, target.data(), target.size());
  be->loss_xent(gl, gt, gdl, loss, nullptr, rows, vocab, kFp32);
  std::vector<float> dl(logits.size());
  be->download(dl.data(), gdl, dl.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < vocab; ++j)
      EXPECT_EQ(std::isnan(dl[static_cast<size_t>(r * vocab + j)]), r == 1) << r << " " << j;
  EXPECT_TRUE(std::isnan(be->read_scalar(loss)));
}

TEST(TokensGpu, CausalMaskMatchesCpu) {
  MXLAB_REQUIRE_GPU();
  Twin t;
  for (const auto& [items, S] : std::vector<std::pair<int64_t, int64_t>>{{5, 37}, {3, 1}, {2, 130}}) {
    const Buf x = t.make(normal(static_cast<size_t>(items * S * S), 31 + S, 2.0f));
    t.cpu->mask_causal(x.c, items, S);
    t.gpu->mask_causal(x.g, items, S);
    const std::vector<float> c = t.host_cpu(x), g = t.host_gpu(x);
    EXPECT_TRUE(same_bits(c, g, true)) << items << " x " << S;
    size_t masked = 0;
    for (float v : g) masked += std::isinf(v) && v < 0.0f;
    EXPECT_EQ(masked, static_cast<size_t>(items * S * (S - 1) / 2));
  }
}

}  // namespace
}  // namespace mxlab
