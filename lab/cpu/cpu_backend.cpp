// The CPU reference backend: every Backend op as a plain loop over the shared scalar code
// (lab/model/elementwise.h, lab/mx/scalar.h) and Eigen for the GEMM's FP32 product. The exact
// semantics of each op are written down in lab/model/README.md; the CUDA backend implements
// the same and is tested against this one.
#include "lab/cpu/cpu_backend.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "lab/core/error.h"
#include "lab/model/elementwise.h"
#include "lab/model/flash_attention.h"
#include "lab/model/instrument_elementwise.h"
#include "lab/mx/hadamard.h"
#include "lab/mx/quantize.h"
#include "lab/mx/scalar.h"

namespace mxlab {

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMajor>;
using Map = Eigen::Map<RowMajor>;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuGemm gemm) : gemm_(gemm) {}
  std::string name() const override { return "cpu"; }
  std::string math_mode() const override {
    return gemm_ == CpuGemm::eigen ? "IEEE FP32 (Eigen GEMM, FP32 accumulation, no TF32)"
                                   : "IEEE FP32 (GEMM products accumulated in double, rounded once)";
  }

  // ---- memory ----
  float* alloc(size_t n) override {
    // At least one element so that every allocation has a distinct, valid address.
    buffers_.push_back(std::make_unique<float[]>(std::max<size_t>(n, 1)));
    return buffers_.back().get();
  }
  void upload(float* dst, const float* src, size_t n) override { copy(dst, src, n); }
  void download(float* dst, const float* src, size_t n) override { copy(dst, src, n); }
  void copy(float* dst, const float* src, size_t n) override {
    if (n && dst != src) std::memmove(dst, src, n * sizeof(float));
  }
  void fill(float* dst, float value, size_t n) override { std::fill(dst, dst + n, value); }

  void set_step(const StepScalars& s) override { step_ = s; }

  // ---- random numbers ----
  void randn(float* out, size_t n, uint64_t seed, Stream stream, float scale) override {
    for (size_t i = 0; i < n; ++i) out[i] = scale * randn_elem(seed, stream, step_.step, i);
  }
  void add_randn(float* out, size_t n, uint64_t seed, Stream stream, float scale) override {
    for (size_t i = 0; i < n; ++i) out[i] = out[i] + scale * randn_elem(seed, stream, step_.step, i);
  }

  // ---- quantization ----
  void quantize(const float* in, float* out, int64_t rows, int64_t cols, Axis axis, const QuantSpec& q,
                int stats_slot) override {
    QuantSpec spec = q;
    spec.salt = step_.step;
    QuantStats st;
    quantize_dequantize(in, out, rows, cols, axis, spec, &st);
    if (stats_slot >= 0) slot(stats_slot).add(st);
  }
  void round_bf16(float* x, size_t n, Rounding mode) override {
    for (size_t i = 0; i < n; ++i) x[i] = mxlab::round_bf16(x[i], mode);
  }

  // ---- GEMM ----
  void gemm(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C, float beta,
            const ElementwiseRound& out) override {
    prepare_operand(a, M, K, K, qa_);
    prepare_operand(b, N, K, K, qb_);
    product_into(M, N, K, qa_.data(), a.k_contiguous, qb_.data(), b.k_contiguous, C, beta, out);
  }

  // ---- vector ops ----
  void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xhat, float* rstd,
                     int64_t rows, int64_t d, float eps, const ElementwiseRound& r,
                     const GemmOperand* /*q_out: every gemm quantizes its operands here*/) override {
    MXLAB_ASSERT((gamma == nullptr) == (beta == nullptr), "layernorm affine needs both gamma and beta");
    std::vector<float> xc(static_cast<size_t>(d));
    for (int64_t i = 0; i < rows; ++i) {
      const float* xr = x + i * d;
      double sum = 0.0;
      for (int64_t j = 0; j < d; ++j) sum += xr[j];
      const float mean = ew_round(mean_from_sum(sum, d), r.bf16, r.mode);
      double sq = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        xc[j] = ln_center(xr[j], mean, r.bf16, r.mode);
        sq += dot_term(xc[j], xc[j]);
      }
      const float var = ew_round(mean_from_sum(sq, d), r.bf16, r.mode);
      const float rs = ln_rstd(var, eps, r.bf16, r.mode);
      rstd[i] = rs;
      for (int64_t j = 0; j < d; ++j) {
        const float xh = ln_xhat(xc[j], rs, r.bf16, r.mode);
        xhat[i * d + j] = xh;
        y[i * d + j] = gamma ? ln_affine(xh, gamma[j], beta[j], r.bf16, r.mode) : xh;
      }
    }
  }

  void layernorm_bwd(const float* dy_raw, const float* xhat, const float* rstd, const float* gamma, float* dx,
                     float* dgamma, float* dbeta, int64_t rows, int64_t d, const ElementwiseRound& r,
                     const ElementwiseRound& dy_in) override {
    std::vector<float> dy_rounded;
    const float* dy = dy_raw;
    if (dy_in.bf16) {  // rounded as read, here once up front (rows x d floats of scratch)
      dy_rounded.resize(static_cast<size_t>(rows * d));
      for (size_t i = 0; i < dy_rounded.size(); ++i) dy_rounded[i] = ew_round(dy_raw[i], true, dy_in.mode);
      dy = dy_rounded.data();
    }
    std::vector<float> g(static_cast<size_t>(d));
    for (int64_t i = 0; i < rows; ++i) {
      const float* dyr = dy + i * d;
      const float* xr = xhat + i * d;
      double sg = 0.0, sgx = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        g[j] = gamma ? ln_bwd_g(dyr[j], gamma[j], r.bf16, r.mode) : dyr[j];
        sg += g[j];
        sgx += dot_term(g[j], xr[j]);
      }
      const float mg = mean_from_sum(sg, d), mgx = mean_from_sum(sgx, d);
      for (int64_t j = 0; j < d; ++j) dx[i * d + j] = ln_bwd_dx(rstd[i], g[j], mg, xr[j], mgx, r.bf16, r.mode);
    }
    // Parameter gradients: column sums over rows in row order (double), not rounded.
    for (int64_t j = 0; j < d; ++j) {
      double sgam = 0.0, sbet = 0.0;
      for (int64_t i = 0; i < rows; ++i) {
        sgam += dot_term(dy[i * d + j], xhat[i * d + j]);
        sbet += dy[i * d + j];
      }
      if (dgamma) dgamma[j] = static_cast<float>(sgam);
      if (dbeta) dbeta[j] = static_cast<float>(sbet);
    }
  }

  void act_fwd(Act act, const float* h, float* a, int64_t rows, int64_t cols, const ElementwiseRound& r,
               const ElementwiseRound& h_in, const GemmOperand* /*q_out*/) override {
    auto H = [&](int64_t i) { return ew_round(h[i], h_in.bf16, h_in.mode); };
    if (act == Act::swiglu) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          a[i * cols + j] = swiglu_fwd_elem(H(i * 2 * cols + j), H(i * 2 * cols + cols + j), r.bf16, r.mode);
      return;
    }
    for (int64_t i = 0; i < rows * cols; ++i) a[i] = act_fwd_elem(act, H(i), r.bf16, r.mode);
  }

  void act_bwd(Act act, const float* h, const float* da, float* dh, int64_t rows, int64_t cols,
               const ElementwiseRound& r, const ElementwiseRound& h_in, const ElementwiseRound& da_in,
               const GemmOperand* /*q_out*/) override {
    auto H = [&](int64_t i) { return ew_round(h[i], h_in.bf16, h_in.mode); };
    auto D = [&](int64_t i) { return ew_round(da[i], da_in.bf16, da_in.mode); };
    if (act == Act::swiglu) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t u = i * 2 * cols + j, g = u + cols;
          swiglu_bwd_elem(H(u), H(g), D(i * cols + j), dh[u], dh[g], r.bf16, r.mode);
        }
      return;
    }
    for (int64_t i = 0; i < rows * cols; ++i) dh[i] = act_bwd_elem(act, H(i), D(i), r.bf16, r.mode);
  }

  void residual_add(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                    const ElementwiseRound& r, const ElementwiseRound& y_in) override {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < d; ++j)
        out[i * d + j] = residual_elem(x[i * d + j], ew_round(y[i * d + j], y_in.bf16, y_in.mode),
                                       bias ? bias[j] : 0.0f, bias != nullptr, r.bf16, r.mode);
  }

  void residual_add_r(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                      const ResidualRound& rr) override {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < d; ++j)
        out[i * d + j] = residual_r_elem(x[i * d + j], y[i * d + j], bias ? bias[j] : 0.0f, bias != nullptr,
                                         rr.y_in.bf16, rr.y_in.mode, rr.bias_in.bf16, rr.bias_in.mode, rr.inner.bf16,
                                         rr.inner.mode, rr.out.bf16, rr.out.mode);
  }

  void layernorm_vec_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xn, float* vare,
                         int64_t rows, int64_t d, float eps, const ElementwiseRound& r) override {
    MXLAB_ASSERT((gamma == nullptr) == (beta == nullptr), "layernorm affine needs both gamma and beta");
    for (int64_t i = 0; i < rows; ++i)
      ln_vec_fwd_row(x + i * d, gamma, beta, y + i * d, xn + i * d, vare + i, d, eps, r.bf16, r.mode);
  }

  void layernorm_vec_bwd(const float* dy, const float* xn, const float* vare, const float* gamma, float* dx,
                         float* dgamma, float* dbeta, int64_t rows, int64_t d, const ElementwiseRound& r,
                         const ElementwiseRound& dy_in) override {
    MXLAB_ASSERT(dx != dy, "layernorm_vec_bwd: dx must not alias dy");
    for (int64_t i = 0; i < rows; ++i)
      ln_vec_bwd_row(dy + i * d, xn + i * d, vare[i], gamma, dx + i * d, d, r.bf16, r.mode, dy_in.bf16, dy_in.mode);
    if (dgamma || dbeta)
      for (int64_t j = 0; j < d; ++j)
        ln_vec_bwd_col(dy, xn, dgamma, dbeta, rows, d, j, r.bf16, r.mode, dy_in.bf16, dy_in.mode);
  }

  void col_sum(const float* x, float* out, int64_t rows, int64_t d) override {
    for (int64_t j = 0; j < d; ++j) {
      double s = 0.0;
      for (int64_t i = 0; i < rows; ++i) s += x[i * d + j];
      out[j] = static_cast<float>(s);
    }
  }

  void add(float* dst, const float* a, const float* b, size_t n, const ElementwiseRound& r, const GemmOperand*,
           int64_t) override {
    for (size_t i = 0; i < n; ++i) dst[i] = add_elem(a[i], b[i], r.bf16, r.mode);
  }

  // ---- loss ----
  void loss_mse(const float* out, const float* target, float* dout, float* loss_out, float* loss_history,
                int64_t rows, int64_t d, const ElementwiseRound& r) override {
    const int64_t n = rows * d;
    const float scale = mse_grad_scale(n);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      sum += diff_sq_term(out[i], target[i]);
      dout[i] = mse_grad_elem(out[i], target[i], scale, r.bf16, r.mode);
    }
    store_loss(mean_from_sum(sum, n), loss_out, loss_history);
  }

  void loss_kl(const float* out, const float* target, float* dout, float* loss_out, float* loss_history,
               int64_t rows, int64_t d, float temperature, const ElementwiseRound& r) override {
    const float scale = kl_grad_scale(temperature, rows);
    std::vector<float> p(static_cast<size_t>(d)), q(static_cast<size_t>(d));
    std::vector<float> logp(static_cast<size_t>(d)), logq(static_cast<size_t>(d));
    double total = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      softmax_row(target + i * d, d, temperature, p.data(), logp.data());
      softmax_row(out + i * d, d, temperature, q.data(), logq.data());
      double row = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        row += kl_term(p[j], logp[j], logq[j]);
        dout[i * d + j] = kl_grad_elem(q[j], p[j], scale, r.bf16, r.mode);
      }
      total += row;
    }
    store_loss(mean_from_sum(total, rows), loss_out, loss_history);
  }

  // ---- optimizers ----
  void adam(float* p, const float* g, float* m, float* v, size_t n, const AdamHyper& h) override {
    for (size_t i = 0; i < n; ++i)
      adam_scalar(p[i], g[i], m[i], v[i], step_.lr, step_.bc1, step_.bc2, h.beta1, h.beta2, h.eps, h.weight_decay,
                  h.decoupled);
  }
  void sgd(float* p, const float* g, float* buf, size_t n, float momentum, float weight_decay) override {
    MXLAB_ASSERT(buf != nullptr || momentum == 0.0f, "sgd with momentum needs a buffer");
    float unused = 0.0f;
    for (size_t i = 0; i < n; ++i)
      sgd_scalar(p[i], g[i], buf ? buf[i] : unused, step_.lr, momentum, weight_decay);
  }

  // ---- reductions and statistics ----
  void reduce(const Reduction* reqs, size_t count, double* results) override {
    for (size_t k = 0; k < count; ++k) {
      const Reduction& q = reqs[k];
      double s = 0.0;
      for (int64_t i = 0; i < q.n; ++i)
        s += q.kind == Reduction::dot ? dot_term(q.a[i], q.b[i]) : diff_sq_term(q.a[i], q.b[i]);
      results[k] = s;
    }
  }
  float read_scalar(const float* p) override { return *p; }
  void moments(const float* x, size_t n, double out[4]) override {
    if (n == 0) {
      for (int i = 0; i < 4; ++i) out[i] = 0.0;
      return;
    }
    double mn = x[0], mx = x[0], sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      mn = std::min<double>(mn, x[i]);
      mx = std::max<double>(mx, x[i]);
      sum += x[i];
    }
    const double mean = sum / static_cast<double>(n);
    double sq = 0.0;
    for (size_t i = 0; i < n; ++i) sq += (x[i] - mean) * (x[i] - mean);
    out[0] = mn;
    out[1] = mx;
    out[2] = mean;
    out[3] = std::sqrt(sq / static_cast<double>(n));
  }
  void reset_stats(int slots) override { stats_.assign(static_cast<size_t>(std::max(slots, 0)), QuantStats{}); }
  std::vector<QuantStats> read_stats() override { return stats_; }

  // ==== stability instruments (backend.h): curvature tangents and the quantization gap ====
  void act_jvp(Act act, const float* h, const float* rh, float* ra, int64_t rows, int64_t cols) override {
    if (act == Act::swiglu) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t u = i * 2 * cols + j, g = u + cols;
          ra[i * cols + j] = swiglu_jvp_elem(h[u], h[g], rh[u], rh[g]);
        }
      return;
    }
    for (int64_t i = 0; i < rows * cols; ++i) ra[i] = act_jvp_elem(act, h[i], rh[i]);
  }

  void act_bwd_tangent(Act act, const float* h, const float* rh, const float* da, const float* rda, float* rdh,
                       int64_t rows, int64_t cols) override {
    if (act == Act::swiglu) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t u = i * 2 * cols + j, g = u + cols, e = i * cols + j;
          swiglu_bwd_tangent_elem(h[u], h[g], rh[u], rh[g], da[e], rda[e], rdh[u], rdh[g]);
        }
      return;
    }
    for (int64_t i = 0; i < rows * cols; ++i) rdh[i] = act_bwd_tangent_elem(act, h[i], rh[i], da[i], rda[i]);
  }

  void ln_affine_tangent(const float* rxhat, const float* xhat, const float* gamma, const float* vgamma,
                         const float* vbeta, float* ry, int64_t rows, int64_t d) override {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < d; ++j) {
        const int64_t e = i * d + j;
        ry[e] = ln_affine_tangent_elem(rxhat ? rxhat[e] : 0.0f, xhat[e], gamma[j], vgamma[j], vbeta[j]);
      }
  }

  void layernorm_bwd_tangent(const float* dy, const float* rdy, const float* xhat, const float* rxhat, const float* rx,
                             const float* rstd, const float* gamma, const float* vgamma, float* rdx, int64_t rows,
                             int64_t d) override {
    MXLAB_ASSERT((gamma == nullptr) == (vgamma == nullptr), "layernorm tangent needs both gamma and its tangent");
    std::vector<float> g(static_cast<size_t>(d)), rg(static_cast<size_t>(d));
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t o = i * d;
      double sg = 0.0, sgx = 0.0, srg = 0.0, srgx = 0.0, sx = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        g[j] = gamma ? ln_bwd_g(dy[o + j], gamma[j], false, Rounding::nearest_even) : dy[o + j];
        rg[j] = gamma ? ln_bwd_tangent_g(rdy[o + j], dy[o + j], gamma[j], vgamma[j]) : rdy[o + j];
        sg += g[j];
        sgx += dot_term(g[j], xhat[o + j]);
        srg += rg[j];
        srgx += ln_tangent_rmgx_term(rg[j], xhat[o + j], g[j], rxhat[o + j]);
        sx += dot_term(xhat[o + j], rx[o + j]);
      }
      const float mg = mean_from_sum(sg, d), mgx = mean_from_sum(sgx, d);
      const float rmg = mean_from_sum(srg, d), rmgx = mean_from_sum(srgx, d);
      const float rrstd = ln_tangent_rrstd(rstd[i], mean_from_sum(sx, d));
      for (int64_t j = 0; j < d; ++j)
        rdx[o + j] = ln_bwd_tangent_dx(rstd[i], rrstd, g[j], mg, xhat[o + j], mgx, rg[j], rmg, rxhat[o + j], rmgx);
    }
  }

  void col_dot(const float* a, const float* b, float* out, int64_t rows, int64_t d) override {
    for (int64_t j = 0; j < d; ++j) {
      double s = 0.0;
      for (int64_t i = 0; i < rows; ++i) s += dot_term(a[i * d + j], b[i * d + j]);
      out[j] = static_cast<float>(s);
    }
  }

  void axpby(float* y, const float* x, float a, float b, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] = axpby_elem(x[i], y[i], a, b);
  }
  void mul(float* dst, const float* a, const float* b, size_t n) override {
    for (size_t i = 0; i < n; ++i) dst[i] = a[i] * b[i];
  }
  void precond_isqrt(const float* v, float* out, size_t n, float bc2, float eps) override {
    for (size_t i = 0; i < n; ++i) out[i] = precond_isqrt_elem(v[i], bc2, eps);
  }

  void loss_kl_tangent(const float* out, const float* rout, float* rdout, int64_t rows, int64_t d,
                       float temperature) override {
    const float scale = kl_tangent_scale(temperature, rows);
    std::vector<float> q(static_cast<size_t>(d)), logq(static_cast<size_t>(d));
    for (int64_t i = 0; i < rows; ++i) {
      softmax_row(out + i * d, d, temperature, q.data(), logq.data());
      double s = 0.0;
      for (int64_t j = 0; j < d; ++j) s += dot_term(q[j], rout[i * d + j]);
      const float sf = static_cast<float>(s);
      for (int64_t j = 0; j < d; ++j) rdout[i * d + j] = kl_tangent_elem(q[j], rout[i * d + j], sf, scale);
    }
  }

  QuantGap quant_gap(const float* x, int64_t rows, int64_t cols, Axis axis, const QuantSpec& q, bool round_bf16_first,
                     Rounding bf16_mode) override {
    // Q is what the quantizer itself makes of v (quantize_dequantize: one walk over the blocks,
    // the same block_scale_exp and quantize_element as every quantizer), then one pass in flat
    // index order folds (x, Q) into the fixed-order sums: elements counted where both are finite
    // (quant_gap_counts), `above` = the quantizer's clamped count (a clamped element is never
    // +-Inf: its block's scale leaves room for max_normal, lab/mx/README.md).
    MXLAB_ASSERT(!is_mx(q.fmt) || q.block > 0, "quant_gap: block size ", q.block,
                 " (configuration admits only positive sizes)");
    const int64_t n = rows * cols;
    std::vector<float> qv(static_cast<size_t>(n));
    if (round_bf16_first)
      for (int64_t i = 0; i < n; ++i) qv[i] = mxlab::round_bf16(x[i], bf16_mode);
    QuantSpec qs = q;
    qs.salt = step_.step;  // the stochastic stream of the quantizer at this step
    QuantStats st;
    quantize_dequantize(round_bf16_first ? qv.data() : x, qv.data(), rows, cols, axis, qs, &st);
    QuantGap out;
    out.above = st.clamped;
    for (int64_t c0 = 0; c0 < n; c0 += kQuantGapChunk) {
      double chunk = 0.0;
      for (int64_t i = c0; i < std::min(n, c0 + kQuantGapChunk); ++i) {
        if (!quant_gap_counts(x[i], qv[i])) {
          out.nonfinite += 1;
          continue;
        }
        const double rel = quant_gap_rel(x[i], qv[i]);
        chunk += rel;
        out.max_rel = std::max(out.max_rel, rel);
        out.n += 1;
      }
      out.sum_rel += chunk;
    }
    return out;
  }
  // ==== end of the stability instruments ====

  // ==== attention blocks and RMS/MX norms (backend.h section of the same name) ====
  void gemm_batched(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b,
                    float* C, float beta, const ElementwiseRound& out) override {
    // The stacked operands, quantized as one tensor each: [batch*rows x K] or [batch*K x rows].
    prepare_operand(a, a.k_contiguous ? batch * M : M, a.k_contiguous ? K : batch * K, K, qa_);
    prepare_operand(b, b.k_contiguous ? batch * N : N, b.k_contiguous ? K : batch * K, K, qb_);
    for (int64_t i = 0; i < batch; ++i)
      product_into(M, N, K, qa_.data() + i * M * K, a.k_contiguous, qb_.data() + i * N * K, b.k_contiguous,
                   C + i * M * N, beta, out);
  }

  void rmsnorm_fwd(const float* x, const float* gamma, float* y, float* xhat, float* rstd, int64_t rows, int64_t d,
                   float eps, const RmsEstimate& est, const ElementwiseRound& r) override {
    for (int64_t i = 0; i < rows; ++i) {
      const float* xr = x + i * d;
      float ms;
      if (est.block > 0) {
        // MXNorm: the p-mean of the block absmaxes (blocks of est.block along the row).
        double sum = 0.0;
        int64_t blocks = 0;
        for (int64_t b0 = 0; b0 < d; b0 += est.block, ++blocks) {
          float m = 0.0f;
          for (int64_t j = b0; j < std::min<int64_t>(b0 + est.block, d); ++j) m = std::max(m, std::fabs(xr[j]));
          sum += est.p == 2 ? dot_term(m, m) : static_cast<double>(m);
        }
        ms = mxnorm_ms(sum, blocks, est.p, est.c, r.bf16, r.mode);
      } else {
        double sq = 0.0;
        for (int64_t j = 0; j < d; ++j) sq += dot_term(xr[j], xr[j]);
        ms = ew_round(mean_from_sum(sq, d), r.bf16, r.mode);
      }
      const float rs = ln_rstd(ms, eps, r.bf16, r.mode);
      rstd[i] = rs;
      for (int64_t j = 0; j < d; ++j) {
        const float xh = ln_xhat(xr[j], rs, r.bf16, r.mode);
        xhat[i * d + j] = xh;
        y[i * d + j] = gamma ? mul_elem(xh, gamma[j], r.bf16, r.mode) : xh;
      }
    }
  }

  void rmsnorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                   float* dgamma, int64_t rows, int64_t d, const ElementwiseRound& r) override {
    std::vector<float> g(static_cast<size_t>(d));
    for (int64_t i = 0; i < rows; ++i) {
      const float* dyr = dy + i * d;
      const float* xr = xhat + i * d;
      double sgx = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        g[j] = gamma ? ln_bwd_g(dyr[j], gamma[j], r.bf16, r.mode) : dyr[j];
        sgx += dot_term(g[j], xr[j]);
      }
      const float mgx = mean_from_sum(sgx, d);
      for (int64_t j = 0; j < d; ++j) dx[i * d + j] = rms_bwd_dx(rstd[i], g[j], xr[j], mgx, r.bf16, r.mode);
    }
    if (!dgamma) return;
    for (int64_t j = 0; j < d; ++j) {
      double sgam = 0.0;
      for (int64_t i = 0; i < rows; ++i) sgam += dot_term(dy[i * d + j], xhat[i * d + j]);
      dgamma[j] = static_cast<float>(sgam);
    }
  }

  void scale_cols(const float* x, const float* g, float* out, int64_t rows, int64_t cols,
                  const ElementwiseRound& r) override {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = mul_elem(x[i * cols + j], g[j], r.bf16, r.mode);
  }

  void softmax_fwd(const float* logits, float* probs, float* rowmax, int64_t rows, int64_t n, float scale,
                   const ElementwiseRound& r) override {
    std::vector<float> z(static_cast<size_t>(n));
    for (int64_t i = 0; i < rows; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        z[j] = attn_logit(logits[i * n + j], scale, r.bf16, r.mode);
        m = std::max(m, z[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        z[j] = softmax_exp(z[j], m, r.bf16, r.mode);
        sum += z[j];
      }
      for (int64_t j = 0; j < n; ++j) probs[i * n + j] = softmax_prob(z[j], sum, r.bf16, r.mode);
      rowmax[i] = m;
    }
  }

  void softmax_bwd(const float* probs, const float* dprobs, float* dlogits, int64_t rows, int64_t n, float scale,
                   const ElementwiseRound& r) override {
    for (int64_t i = 0; i < rows; ++i) {
      double dot = 0.0;
      for (int64_t j = 0; j < n; ++j) dot += dot_term(probs[i * n + j], dprobs[i * n + j]);
      const float D = static_cast<float>(dot);
      for (int64_t j = 0; j < n; ++j)
        dlogits[i * n + j] = softmax_bwd_elem(probs[i * n + j], dprobs[i * n + j], D, scale, r.bf16, r.mode);
    }
  }

  // Token networks.
  void token_batch(float* ids, float* targets, int64_t sequences, int64_t S, int64_t vocab, uint64_t seed,
                   Stream stream) override {
    for (int64_t b = 0; b < sequences; ++b) {
      int64_t x = 0;
      for (int64_t i = 0; i < S; ++i) {
        const int64_t r = b * S + i;
        ids[r] = static_cast<float>(x);
        x = token_successor(seed, vocab, x, u32_to_uniform(philox(seed, stream, step_.step, static_cast<uint64_t>(r)).v[0]));
        targets[r] = static_cast<float>(x);
      }
    }
  }
  static int64_t token_id(float v, int64_t vocab, int64_t row) {
    const int64_t id = token_index(v, vocab);
    if (id < 0) throw Error(msg("token id ", v, " of row ", row, " is not an integer in [0, ", vocab, ")"));
    return id;
  }
  void embed_fwd(const float* ids, const float* E, float* out, int64_t rows, int64_t d, int64_t vocab,
                 const ElementwiseRound& r) override {
    for (int64_t i = 0; i < rows; ++i) {
      const float* e = E + token_id(ids[i], vocab, i) * d;
      for (int64_t c = 0; c < d; ++c) out[i * d + c] = ew_round(e[c], r.bf16, r.mode);
    }
  }
  void embed_bwd(const float* ids, const float* dout, float* dE, int64_t rows, int64_t d, int64_t vocab) override {
    std::vector<double> acc(static_cast<size_t>(vocab * d), 0.0);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t v = token_id(ids[i], vocab, i);
      for (int64_t c = 0; c < d; ++c) acc[static_cast<size_t>(v * d + c)] += static_cast<double>(dout[i * d + c]);
    }
    for (size_t j = 0; j < acc.size(); ++j) dE[j] = static_cast<float>(acc[j]);
  }
  void loss_xent(const float* logits, const float* target, float* dlogits, float* loss_out, float* loss_history,
                 int64_t rows, int64_t vocab, const ElementwiseRound& r) override {
    const float scale = kl_grad_scale(1.0f, rows);
    std::vector<float> e(static_cast<size_t>(vocab));
    double total = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      const float* l = logits + i * vocab;
      const int64_t t = token_id(target[i], vocab, i);
      float m = l[0];
      for (int64_t j = 1; j < vocab; ++j) m = l[j] > m ? l[j] : m;
      double S = 0.0;
      for (int64_t j = 0; j < vocab; ++j) S += static_cast<double>(e[static_cast<size_t>(j)] = kl_exp(l[j], m));
      const float ls = det_log(static_cast<float>(S));
      total += -static_cast<double>(kl_logprob(l[t], m, ls));
      for (int64_t j = 0; j < vocab; ++j)
        dlogits[i * vocab + j] = xent_grad_elem(kl_prob(e[static_cast<size_t>(j)], S), j == t, scale, r.bf16, r.mode);
    }
    store_loss(mean_from_sum(total, rows), loss_out, loss_history);
  }

  void mask_causal(float* x, int64_t items, int64_t S) override {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < items; ++i)
      for (int64_t r = 0; r < S; ++r)
        for (int64_t t = r + 1; t < S; ++t) x[(i * S + r) * S + t] = neg_inf;
  }

  // Flash attention in bf16: the functions of lab/model/flash_attention.h, row by row and key by key.
  void flash_attn_fwd(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse,
                      float* rowmax, float* row_stats, int64_t items, int64_t S, int64_t dh, float scale,
                      const FlashSpec& f) override {
    MXLAB_ASSERT(f.bc > 0 && f.br > 0, "flash attention tile ", f.br, " x ", f.bc, " (configuration admits >= 1)");
    for (int64_t b = 0; b < items; ++b) {
      const int64_t off = b * S * dh;
      for (int64_t r = 0; r < S; ++r)
        fa_fwd_row(q + off, k + off, v + off, S, dh, scale, f, r, o + off + r * dh, o_hp + off + r * dh,
                   lse + b * S + r, rowmax + b * S + r, row_stats + (b * S + r) * kFlashRowStats);
    }
  }
  void flash_attn_bwd(const float* q, const float* k, const float* v, const float* o, const float* o_hp,
                      const float* dout, const float* lse, float* dq, float* dk, float* dv, float* delta,
                      float* delta_hp, int64_t items, int64_t S, int64_t dh, float scale, const FlashSpec& f) override {
    MXLAB_ASSERT(f.bc > 0 && f.br > 0, "flash attention tile ", f.br, " x ", f.bc, " (configuration admits >= 1)");
    std::vector<float> part(static_cast<size_t>(dh));
    for (int64_t b = 0; b < items; ++b) {
      const int64_t off = b * S * dh;
      for (int64_t r = 0; r < S; ++r) {
        float lp, hp;
        fa_delta_row(dout + off + r * dh, o + off + r * dh, o_hp + off + r * dh, dh, &lp, &hp);
        delta[b * S + r] = f.delta_hp ? hp : lp;
        delta_hp[b * S + r] = hp;
      }
      for (int64_t t = 0; t < S; ++t)
        fa_bwd_key(q + off, k + off, v + off, dout + off, lse + b * S, delta + b * S, S, dh, scale, f, t,
                   dk + off + t * dh, dv + off + t * dh);
      for (int64_t r = 0; r < S; ++r)
        fa_bwd_query(q + off, k + off, v + off, dout + off, lse + b * S, delta + b * S, S, dh, scale, f, r,
                     dq + off + r * dh, part.data());
    }
  }

  void heads_split(const float* x, float* heads, int64_t nb, int64_t S, int64_t h, int64_t dh, int64_t ld,
                   int64_t col0) override {
    for_heads(nb, S, h, dh, ld, col0, [&](int64_t hi, int64_t xi) { heads[hi] = x[xi]; });
  }
  void heads_merge(const float* heads, float* x, int64_t nb, int64_t S, int64_t h, int64_t dh, int64_t ld,
                   int64_t col0) override {
    for_heads(nb, S, h, dh, ld, col0, [&](int64_t hi, int64_t xi) { x[xi] = heads[hi]; });
  }

 private:
  // f(heads index, x index) for every element of the heads layout (backend.h, heads_split).
  template <class F>
  static void for_heads(int64_t nb, int64_t S, int64_t h, int64_t dh, int64_t ld, int64_t col0, F f) {
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t j = 0; j < h; ++j)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t c = 0; c < dh; ++c) f(((b * h + j) * S + s) * dh + c, (b * S + s) * ld + col0 + j * dh + c);
  }

  // C[M x N] = beta C + A B^T from quantized operand copies qa (logical [M x K]) and qb
  // ([N x K]), stored as their k_contiguous flags say, then R(C).
  void product_into(int64_t M, int64_t N, int64_t K, const float* qa, bool a_kc, const float* qb, bool b_kc, float* C,
                    float beta, const ElementwiseRound& out) {
    Map c(C, M, N);
    product_.resize(M, N);
    if (gemm_ == CpuGemm::double_sum) {
      // Each element the double sum of its K products (exact products of floats), in k order,
      // rounded to float once: the same float as any order of an exact (or double) summation.
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0.0;
          for (int64_t k = 0; k < K; ++k)
            acc += dot_term(a_kc ? qa[i * K + k] : qa[k * M + i], b_kc ? qb[j * K + k] : qb[k * N + j]);
          product_(i, j) = static_cast<float>(acc);
        }
    } else if (K == 0) {
      product_.setZero();
    } else {
      const ConstMap as(qa, a_kc ? M : K, a_kc ? K : M);
      const ConstMap bs(qb, b_kc ? N : K, b_kc ? K : N);
      if (a_kc && b_kc) product_.noalias() = as * bs.transpose();
      else if (a_kc) product_.noalias() = as * bs;
      else if (b_kc) product_.noalias() = as.transpose() * bs.transpose();
      else product_.noalias() = as.transpose() * bs;
    }
    // beta == 0 overwrites C (its old contents may be garbage or NaN).
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const float p = product_(i, j);
        const float v = beta == 0.0f ? p : beta * c(i, j) + p;
        c(i, j) = ew_round(v, out.bf16, out.mode);
      }
  }

  CpuGemm gemm_;

  QuantStats& slot(int s) {
    MXLAB_ASSERT(s >= 0 && static_cast<size_t>(s) < stats_.size(), "statistics slot ", s, " not reset (have ",
                 stats_.size(), ")");
    return stats_[static_cast<size_t>(s)];
  }

  // The quantized copy of one GEMM operand whose logical shape is [rows x K] (stored
  // [rows x K] when k_contiguous, else [K x rows]): optional bf16 rounding, the optional
  // rotation along K (`period`: the GEMM's reduction length, K but for a stacked batched
  // operand), then Q along K.
  void prepare_operand(const GemmOperand& op, int64_t rows, int64_t K, int64_t period, std::vector<float>& buf) {
    const size_t n = static_cast<size_t>(rows * K);
    buf.assign(op.p, op.p + n);
    if (op.round_bf16_first)
      for (float& v : buf) v = mxlab::round_bf16(v, op.bf16_mode);
    const int64_t srows = op.k_contiguous ? rows : K, scols = op.k_contiguous ? K : rows;
    const Axis axis = op.k_contiguous ? Axis::contiguous : Axis::strided;
    if (op.rot.active() && n > 0) {
      RotationSpec r = op.rot;
      r.salt = step_.step;
      hadamard_rotate(buf.data(), buf.data(), srows, scols, axis, period, r);
    }
    if (op.stats_slot >= 0) {
      QuantSpec sq = op.stats_q;
      sq.seed = sr_seed(sq.seed, op.sr_op);
      sq.salt = step_.step;
      slot(op.stats_slot).add(mx_stats(buf.data(), srows, scols, axis, sq));
    }
    QuantSpec q = op.q;
    q.seed = sr_seed(q.seed, op.sr_op);
    q.salt = step_.step;
    quantize_dequantize(buf.data(), buf.data(), srows, scols, axis, q);
  }

  // Softmax of one row of logits z / T: probabilities and log-probabilities (see elementwise.h).
  static void softmax_row(const float* z, int64_t d, float temperature, float* prob, float* logprob) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < d; ++j) m = std::max(m, kl_logit(z[j], temperature));
    double s = 0.0;
    for (int64_t j = 0; j < d; ++j) s += kl_exp(kl_logit(z[j], temperature), m);
    const float log_sum = det_log(static_cast<float>(s));
    for (int64_t j = 0; j < d; ++j) {
      const float logit = kl_logit(z[j], temperature);
      prob[j] = kl_prob(kl_exp(logit, m), s);
      logprob[j] = kl_logprob(logit, m, log_sum);
    }
  }

  void store_loss(float loss, float* loss_out, float* loss_history) const {
    loss_out[0] = loss;
    if (loss_history) loss_history[step_.step] = loss;
  }

  StepScalars step_;
  std::vector<std::unique_ptr<float[]>> buffers_;
  std::vector<QuantStats> stats_;
  std::vector<float> qa_, qb_;  // quantized operand copies (reused across calls)
  RowMajor product_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(CpuGemm gemm) { return std::make_unique<CpuBackend>(gemm); }

}  // namespace mxlab
