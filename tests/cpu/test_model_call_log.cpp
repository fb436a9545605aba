// The model's backend call sequence, pinned: forward, loss and backward of small networks under
// the paper's policy (experiments/paper/fig4_baseline.yaml) and the variants that take the other
// branches of lab/model/mlp.cpp and attention.cpp (no norm, RMSNorm, MXNorm with its fused weight,
// attention blocks, SwiGLU, the paper's emulator ops, `backward: false`, the plain teacher,
// statistics collected, precision.rotation: the operands' `rot` is printed where it is on) run on a backend that logs every call it receives with every argument:
// GEMM operands field by field (the producer-side `q_out` and `prequantized` flags and the
// operands handed to prequantize included: the CUDA backend acts on them, the CPU ignores
// them), rounding modes, shapes, and each pointer as the allocation it falls in. The log must
// equal tests/cpu/golden/model_calls.txt line for line, and each pass's output and gradient
// bits their digests in it. A refactor of the model that changes no call passes; one that
// reorders, adds or drops a call, or changes an argument, fails with the first differing line.
// After a deliberate change of the op sequence, regenerate the file:
//   MXLAB_WRITE_CALL_LOG=tests/cpu/golden/model_calls.txt build-cpu/mxlab_tests --gtest_filter='ModelCallLog.*'
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lab/config/config_io.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/backend.h"
#include "lab/model/mlp.h"
#include "tests/cpu/model_reference.h"

namespace mxlab {
namespace {

using test::noise;
using test::put;

std::string hexf(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  char b[16];
  std::snprintf(b, sizeof b, "%08x", u);
  return b;
}

// The CPU backend, logging every call (one line each) before running it.
class LoggingBackend final : public Backend {
 public:
  std::unique_ptr<Backend> in = make_cpu_backend();
  std::ostringstream log;

  // A pointer as the allocation it falls in: "b<index>" or "b<index>+<offset>"; "null"; "host".
  std::string ptr(const void* p) const {
    if (!p) return "null";
    const float* f = static_cast<const float*>(p);
    for (size_t i = 0; i < allocs_.size(); ++i)
      if (f >= allocs_[i].first && f < allocs_[i].first + allocs_[i].second) {
        const auto off = f - allocs_[i].first;
        return "b" + std::to_string(i) + (off ? "+" + std::to_string(off) : "");
      }
    return "host";
  }
  static std::string r(const ElementwiseRound& e) {
    return e.bf16 ? std::string("bf16/") + mxlab::name(e.mode) : std::string("none");
  }
  static std::string q(const QuantSpec& s) {
    std::ostringstream o;
    o << "{" << mxlab::name(s.fmt) << " blk" << s.block << " " << mxlab::name(s.rule) << " "
      << mxlab::name(s.rounding) << " " << mxlab::name(s.bump) << " seed" << s.seed << " salt" << s.salt << "}";
    return o.str();
  }
  std::string op(const GemmOperand& g) const {
    std::ostringstream o;
    o << "[" << ptr(g.p) << (g.k_contiguous ? " kc " : " strided ") << q(g.q) << " bf16first" << g.round_bf16_first
      << "/" << mxlab::name(g.bf16_mode) << " slot" << g.stats_slot;
    if (g.stats_slot >= 0) o << " stats" << q(g.stats_q);
    o << " sr" << g.sr_op << " preq" << g.prequantized;
    if (g.rot.active()) o << " rot" << g.rot.block << (g.rot.random_signs ? " random seed" : " seed") << g.rot.seed;
    o << "]";
    return o.str();
  }
  std::string qo(const GemmOperand* g) const { return g ? op(*g) : std::string("q_out=null"); }

  std::string name() const override { return "logging-cpu"; }
  std::string math_mode() const override { return in->math_mode(); }
  float* alloc(size_t n) override {
    float* p = in->alloc(n);
    allocs_.push_back({p, n});
    log << "alloc " << n << " -> " << ptr(p) << "\n";
    return p;
  }
  void upload(float* d, const float* s, size_t n) override {
    log << "upload " << ptr(d) << " " << n << "\n";
    in->upload(d, s, n);
  }
  void download(float* d, const float* s, size_t n) override {
    log << "download " << ptr(s) << " " << n << "\n";
    in->download(d, s, n);
  }
  void copy(float* d, const float* s, size_t n) override {
    log << "copy " << ptr(d) << " " << ptr(s) << " " << n << "\n";
    in->copy(d, s, n);
  }
  void fill(float* d, float v, size_t n) override {
    log << "fill " << ptr(d) << " " << hexf(v) << " " << n << "\n";
    in->fill(d, v, n);
  }
  void set_step(const StepScalars& s) override {
    log << "set_step " << s.step << " " << hexf(s.lr) << " " << hexf(s.bc1) << " " << hexf(s.bc2) << "\n";
    in->set_step(s);
  }
  void set_lane(int lane) override { log << "set_lane " << lane << "\n"; }
  void join() override { log << "join\n"; }
  void randn(float* o, size_t n, uint64_t s, Stream st, float sc) override {
    log << "randn " << ptr(o) << " " << n << " " << s << " " << int(st) << " " << hexf(sc) << "\n";
    in->randn(o, n, s, st, sc);
  }
  void add_randn(float* o, size_t n, uint64_t s, Stream st, float sc) override {
    log << "add_randn " << ptr(o) << " " << n << " " << s << " " << int(st) << " " << hexf(sc) << "\n";
    in->add_randn(o, n, s, st, sc);
  }
  void quantize(const float* i, float* o, int64_t rows, int64_t cols, Axis ax, const QuantSpec& s, int slot) override {
    log << "quantize " << ptr(i) << " " << ptr(o) << " " << rows << "x" << cols << " axis" << int(ax) << " " << q(s)
        << " slot" << slot << "\n";
    in->quantize(i, o, rows, cols, ax, s, slot);
  }
  void round_bf16(float* x, size_t n, Rounding m) override {
    log << "round_bf16 " << ptr(x) << " " << n << " " << mxlab::name(m) << "\n";
    in->round_bf16(x, n, m);
  }
  void gemm(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C, float beta,
            const ElementwiseRound& out) override {
    log << "gemm " << M << "x" << N << "x" << K << " A" << op(a) << " B" << op(b) << " C " << ptr(C) << " beta"
        << hexf(beta) << " out " << r(out) << "\n";
    in->gemm(M, N, K, a, b, C, beta, out);
  }
  void prequantize(const AheadOperand* ops, size_t n) override {
    log << "prequantize " << n << "\n";
    for (size_t i = 0; i < n; ++i)
      log << "  ahead " << ops[i].rows << "x" << ops[i].cols << " " << op(ops[i].op) << "\n";
    in->prequantize(ops, n);
  }
  void layernorm_fwd(const float* x, const float* g, const float* b, float* y, float* xh, float* rs, int64_t rows,
                     int64_t d, float eps, const ElementwiseRound& R, const GemmOperand* qout) override {
    log << "layernorm_fwd " << ptr(x) << " " << ptr(g) << " " << ptr(b) << " " << ptr(y) << " " << ptr(xh) << " "
        << ptr(rs) << " " << rows << "x" << d << " " << hexf(eps) << " " << r(R) << " " << qo(qout) << "\n";
    in->layernorm_fwd(x, g, b, y, xh, rs, rows, d, eps, R, qout);
  }
  void layernorm_bwd(const float* dy, const float* xh, const float* rs, const float* g, float* dx, float* dg,
                     float* db, int64_t rows, int64_t d, const ElementwiseRound& R,
                     const ElementwiseRound& Rdy) override {
    log << "layernorm_bwd " << ptr(dy) << " " << ptr(xh) << " " << ptr(rs) << " " << ptr(g) << " " << ptr(dx) << " "
        << ptr(dg) << " " << ptr(db) << " " << rows << "x" << d << " " << r(R) << " dy_in " << r(Rdy) << "\n";
    in->layernorm_bwd(dy, xh, rs, g, dx, dg, db, rows, d, R, Rdy);
  }
  void act_fwd(Act a, const float* h, float* o, int64_t rows, int64_t cols, const ElementwiseRound& R,
               const ElementwiseRound& Rh, const GemmOperand* qout) override {
    log << "act_fwd " << int(a) << " " << ptr(h) << " " << ptr(o) << " " << rows << "x" << cols << " " << r(R)
        << " h_in " << r(Rh) << " " << qo(qout) << "\n";
    in->act_fwd(a, h, o, rows, cols, R, Rh, qout);
  }
  void act_bwd(Act a, const float* h, const float* da, float* dh, int64_t rows, int64_t cols,
               const ElementwiseRound& R, const ElementwiseRound& Rh, const ElementwiseRound& Rda,
               const GemmOperand* qout) override {
    log << "act_bwd " << int(a) << " " << ptr(h) << " " << ptr(da) << " " << ptr(dh) << " " << rows << "x" << cols
        << " " << r(R) << " h_in " << r(Rh) << " da_in " << r(Rda) << " " << qo(qout) << "\n";
    in->act_bwd(a, h, da, dh, rows, cols, R, Rh, Rda, qout);
  }
  void residual_add(float* o, const float* x, const float* y, const float* b, int64_t rows, int64_t d,
                    const ElementwiseRound& R, const ElementwiseRound& Ry) override {
    log << "residual_add " << ptr(o) << " " << ptr(x) << " " << ptr(y) << " " << ptr(b) << " " << rows << "x" << d
        << " " << r(R) << " y_in " << r(Ry) << "\n";
    in->residual_add(o, x, y, b, rows, d, R, Ry);
  }
  void col_sum(const float* x, float* o, int64_t rows, int64_t d) override {
    log << "col_sum " << ptr(x) << " " << ptr(o) << " " << rows << "x" << d << "\n";
    in->col_sum(x, o, rows, d);
  }
  void add(float* d, const float* a, const float* b, size_t n, const ElementwiseRound& R, const GemmOperand* qout,
           int64_t qc) override {
    log << "add " << ptr(d) << " " << ptr(a) << " " << ptr(b) << " " << n << " " << r(R) << " " << qo(qout) << " qc"
        << qc << "\n";
    in->add(d, a, b, n, R, qout, qc);
  }
  void loss_mse(const float* o, const float* t, float* d, float* l, float* h, int64_t rows, int64_t c,
                const ElementwiseRound& R) override {
    log << "loss_mse " << ptr(o) << " " << ptr(t) << " " << ptr(d) << " " << ptr(l) << " " << ptr(h) << " " << rows
        << "x" << c << " " << r(R) << "\n";
    in->loss_mse(o, t, d, l, h, rows, c, R);
  }
  void loss_kl(const float* o, const float* t, float* d, float* l, float* h, int64_t rows, int64_t c, float T,
               const ElementwiseRound& R) override {
    log << "loss_kl " << ptr(o) << " " << ptr(t) << " " << ptr(d) << " " << ptr(l) << " " << ptr(h) << " " << rows
        << "x" << c << " " << hexf(T) << " " << r(R) << "\n";
    in->loss_kl(o, t, d, l, h, rows, c, T, R);
  }
  void adam(float* p, const float* g, float* m, float* v, size_t n, const AdamHyper& h) override {
    log << "adam " << ptr(p) << "\n";
    in->adam(p, g, m, v, n, h);
  }
  void sgd(float* p, const float* g, float* b, size_t n, float m, float wd) override {
    log << "sgd " << ptr(p) << "\n";
    in->sgd(p, g, b, n, m, wd);
  }
  void reduce(const Reduction* rq, size_t c, double* o) override {
    log << "reduce " << c << "\n";
    in->reduce(rq, c, o);
  }
  float read_scalar(const float* p) override {
    log << "read_scalar " << ptr(p) << "\n";
    return in->read_scalar(p);
  }
  void moments(const float* x, size_t n, double o[4]) override {
    log << "moments " << ptr(x) << " " << n << "\n";
    in->moments(x, n, o);
  }
  void reset_stats(int slots) override {
    log << "reset_stats " << slots << "\n";
    in->reset_stats(slots);
  }
  std::vector<QuantStats> read_stats() override {
    log << "read_stats\n";
    return in->read_stats();
  }
  void gemm_batched(int64_t nb, int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C,
                    float beta, const ElementwiseRound& out) override {
    log << "gemm_batched " << nb << "*" << M << "x" << N << "x" << K << " A" << op(a) << " B" << op(b) << " C "
        << ptr(C) << " beta" << hexf(beta) << " out " << r(out) << "\n";
    in->gemm_batched(nb, M, N, K, a, b, C, beta, out);
  }
  void rmsnorm_fwd(const float* x, const float* g, float* y, float* xh, float* rs, int64_t rows, int64_t d, float eps,
                   const RmsEstimate& est, const ElementwiseRound& R) override {
    log << "rmsnorm_fwd " << ptr(x) << " " << ptr(g) << " " << ptr(y) << " " << ptr(xh) << " " << ptr(rs) << " "
        << rows << "x" << d << " " << hexf(eps) << " est" << est.block << "/" << est.p << "/" << hexf(est.c) << " "
        << r(R) << "\n";
    in->rmsnorm_fwd(x, g, y, xh, rs, rows, d, eps, est, R);
  }
  void rmsnorm_bwd(const float* dy, const float* xh, const float* rs, const float* g, float* dx, float* dg,
                   int64_t rows, int64_t d, const ElementwiseRound& R) override {
    log << "rmsnorm_bwd " << ptr(dy) << " " << ptr(xh) << " " << ptr(rs) << " " << ptr(g) << " " << ptr(dx) << " "
        << ptr(dg) << " " << rows << "x" << d << " " << r(R) << "\n";
    in->rmsnorm_bwd(dy, xh, rs, g, dx, dg, rows, d, R);
  }
  void scale_cols(const float* x, const float* g, float* o, int64_t rows, int64_t cols,
                  const ElementwiseRound& R) override {
    log << "scale_cols " << ptr(x) << " " << ptr(g) << " " << ptr(o) << " " << rows << "x" << cols << " " << r(R)
        << "\n";
    in->scale_cols(x, g, o, rows, cols, R);
  }
  void softmax_fwd(const float* l, float* p, float* m, int64_t rows, int64_t n, float scale,
                   const ElementwiseRound& R) override {
    log << "softmax_fwd " << ptr(l) << " " << ptr(p) << " " << ptr(m) << " " << rows << "x" << n << " " << hexf(scale)
        << " " << r(R) << "\n";
    in->softmax_fwd(l, p, m, rows, n, scale, R);
  }
  void softmax_bwd(const float* p, const float* dp, float* dl, int64_t rows, int64_t n, float scale,
                   const ElementwiseRound& R) override {
    log << "softmax_bwd " << ptr(p) << " " << ptr(dp) << " " << ptr(dl) << " " << rows << "x" << n << " "
        << hexf(scale) << " " << r(R) << "\n";
    in->softmax_bwd(p, dp, dl, rows, n, scale, R);
  }
  void heads_split(const float* x, float* h, int64_t nb, int64_t S, int64_t hh, int64_t dh, int64_t ld,
                   int64_t col0) override {
    log << "heads_split " << ptr(x) << " " << ptr(h) << " " << nb << " " << S << " " << hh << " " << dh << " " << ld
        << " " << col0 << "\n";
    in->heads_split(x, h, nb, S, hh, dh, ld, col0);
  }
  void heads_merge(const float* h, float* x, int64_t nb, int64_t S, int64_t hh, int64_t dh, int64_t ld,
                   int64_t col0) override {
    log << "heads_merge " << ptr(h) << " " << ptr(x) << " " << nb << " " << S << " " << hh << " " << dh << " " << ld
        << " " << col0 << "\n";
    in->heads_merge(h, x, nb, S, hh, dh, ld, col0);
  }
  void layernorm_vec_fwd(const float* x, const float* g, const float* b, float* y, float* xn, float* vare,
                         int64_t rows, int64_t d, float eps, const ElementwiseRound& R) override {
    log << "layernorm_vec_fwd " << ptr(x) << " " << ptr(g) << " " << ptr(b) << " " << ptr(y) << " " << ptr(xn) << " "
        << ptr(vare) << " " << rows << "x" << d << " " << hexf(eps) << " " << r(R) << "\n";
    in->layernorm_vec_fwd(x, g, b, y, xn, vare, rows, d, eps, R);
  }
  void layernorm_vec_bwd(const float* dy, const float* xn, const float* vare, const float* g, float* dx, float* dg,
                         float* db, int64_t rows, int64_t d, const ElementwiseRound& R,
                         const ElementwiseRound& Rdy) override {
    log << "layernorm_vec_bwd " << ptr(dy) << " " << ptr(xn) << " " << ptr(vare) << " " << ptr(g) << " " << ptr(dx)
        << " " << ptr(dg) << " " << ptr(db) << " " << rows << "x" << d << " " << r(R) << " dy_in " << r(Rdy) << "\n";
    in->layernorm_vec_bwd(dy, xn, vare, g, dx, dg, db, rows, d, R, Rdy);
  }
  void residual_add_r(float* o, const float* x, const float* y, const float* b, int64_t rows, int64_t d,
                      const ResidualRound& rr) override {
    log << "residual_add_r " << ptr(o) << " " << ptr(x) << " " << ptr(y) << " " << ptr(b) << " " << rows << "x" << d
        << " y_in " << r(rr.y_in) << " bias_in " << r(rr.bias_in) << " inner " << r(rr.inner) << " out " << r(rr.out)
        << "\n";
    in->residual_add_r(o, x, y, b, rows, d, rr);
  }
  static std::string fs(const FlashSpec& f) {
    std::ostringstream o;
    o << "{tile " << f.br << "x" << f.bc << (f.causal ? " causal" : "") << (f.stabilized ? " stabilized " : " standard ")
      << hexf(f.beta) << " " << hexf(f.eps) << (f.delta_hp ? " delta_hp}" : " delta_lp}");
    return o.str();
  }
  void flash_attn_fwd(const float* q, const float* k, const float* v, float* o, float* ohp, float* lse, float* rm,
                      float* st, int64_t items, int64_t S, int64_t dh, float scale, const FlashSpec& f) override {
    log << "flash_attn_fwd " << ptr(q) << " " << ptr(k) << " " << ptr(v) << " " << ptr(o) << " " << ptr(ohp) << " "
        << ptr(lse) << " " << ptr(rm) << " " << ptr(st) << " " << items << "x" << S << "x" << dh << " " << hexf(scale)
        << " " << fs(f) << "\n";
    in->flash_attn_fwd(q, k, v, o, ohp, lse, rm, st, items, S, dh, scale, f);
  }
  void flash_attn_bwd(const float* q, const float* k, const float* v, const float* o, const float* ohp,
                      const float* dout, const float* lse, float* dq, float* dk, float* dv, float* delta,
                      float* delta_hp, int64_t items, int64_t S, int64_t dh, float scale, const FlashSpec& f) override {
    log << "flash_attn_bwd " << ptr(q) << " " << ptr(k) << " " << ptr(v) << " " << ptr(o) << " " << ptr(ohp) << " "
        << ptr(dout) << " " << ptr(lse) << " " << ptr(dq) << " " << ptr(dk) << " " << ptr(dv) << " " << ptr(delta)
        << " " << ptr(delta_hp) << " " << items << "x" << S << "x" << dh << " " << hexf(scale) << " " << fs(f) << "\n";
    in->flash_attn_bwd(q, k, v, o, ohp, dout, lse, dq, dk, dv, delta, delta_hp, items, S, dh, scale, f);
  }

 private:
  std::vector<std::pair<const float*, size_t>> allocs_;
};

// FNV-1a over the float bits of v.
uint64_t bits_digest(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    for (int i = 0; i < 4; ++i) {
      h ^= (u >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

struct Case {
  std::string label;
  ModelConfig m;
  PrecisionConfig p;
  bool collect = false;
  bool teacher_plain = false;  // the plain teacher (forward only, FP32), as the trainer runs it
  int seq_len = 1;
};

// The paper's configuration (fig4_baseline.yaml) at a small size: L = 2, d = 32, B = 32.
RunConfig paper() {
  RunConfig c = load_config(std::string(MXLAB_SOURCE_DIR) + "/experiments/paper/fig4_baseline.yaml");
  c.model.depth = 2;
  c.model.width = 32;
  return c;
}

std::vector<Case> cases() {
  const RunConfig base = paper();
  std::vector<Case> v;
  auto add = [&](const std::string& label) -> Case& {
    v.push_back(Case{label, base.model, base.precision});
    return v.back();
  };
  add("paper");
  add("paper, statistics collected").collect = true;
  add("no norm").m.layernorm = false;
  add("no affine, no fc2 bias").m.ln_affine = false;
  v.back().m.fc2_bias = false;
  add("rmsnorm").m.norm = NormKind::rmsnorm;
  add("mxnorm (fused W1)").m.norm = NormKind::mxnorm;
  add("swiglu").m.activation = Act::swiglu;
  {
    Case& c = add("attention, statistics collected");
    c.m.block = BlockKind::attention;
    c.m.heads = 2;
    c.seq_len = 8;
    c.collect = true;
  }
  {
    Case& c = add("attention, no norm");
    c.m.block = BlockKind::attention;
    c.m.layernorm = false;
    c.m.heads = 2;
    c.seq_len = 8;
  }
  {
    Case& c = add("the paper's emulator ops");
    c.p.layernorm = LnOps::vector;
    c.p.gelu = GeluOps::vector;
    c.p.residual = ResidualPrec::fp32;
    c.p.bias = BiasPrec::elementwise;
    c.p.ln_beta_grad = false;
  }
  add("backward: false").p.backward = false;
  {
    Case& c = add("grad_wgrad bf16, bf16 activations");
    c.p.grad_wgrad = NumFmt::bf16;
    c.p.activation = NumFmt::bf16;
  }
  add("plain teacher (fp32)").teacher_plain = true;
  // precision.rotation: Hadamard on every GEMM; random Hadamard on Wgrad only, with attention
  // (its projections' GEMMs rotated, the attention-internal ones not).
  add("rotation hadamard").p.rotation.fill(Rotation::hadamard);
  {
    Case& c = add("rotation random_hadamard on wgrad, attention");
    c.m.block = BlockKind::attention;
    c.m.heads = 2;
    c.seq_len = 32;
    c.p.rotation[static_cast<size_t>(Gemm::wgrad)] = Rotation::random_hadamard;
  }
  {
    Case& c = add("attention, flash_bf16 (stabilized, delta hp), statistics collected");
    c.m.block = BlockKind::attention;
    c.m.heads = 2;
    c.seq_len = 8;
    c.collect = true;
    c.p.attention = AttnImpl::flash_bf16;
    c.p.attention_tile_c = 4;
    c.p.attention_softmax = AttnSoftmax::stabilized;
    c.p.attention_delta = AttnDelta::hp;
  }
  return v;
}

// One case's log: workspace made, forward, loss, backward (the student) or forward (the teacher).
std::string run_case(const Case& c) {
  LoggingBackend be;
  const int64_t B = 32;
  TeacherConfig tc;
  tc.residual = false;
  const NetShape s = c.teacher_plain ? NetShape::teacher(c.m, tc, c.seq_len) : NetShape::student(c.m, c.seq_len);
  StepScalars st;
  st.step = 5;
  be.set_step(st);
  const std::vector<float> init = init_params(s, InitKind::pytorch, 1.0f, 17, Stream::init);
  float* P = put(be, init);
  float* X = put(be, noise(static_cast<size_t>(B * s.d), 22));
  float* T = put(be, noise(static_cast<size_t>(B * s.d), 23));
  float* G = be.alloc(init.size());
  Workspace ws = Workspace::make(be, s, B);
  PassPolicy pol;
  pol.p = c.teacher_plain ? PrecisionConfig::fp32() : c.p;
  pol.seed = 1234;
  pol.collect_stats = c.collect;
  pol.stats_base = c.collect ? 3 : 0;
  if (c.collect) be.reset_stats(pol.stats_base + s.depth * kStatTensors);
  be.log << "-- forward\n";
  forward(be, s, P, X, ws, pol);
  std::vector<float> out(static_cast<size_t>(B * s.d));
  be.download(out.data(), ws.out, out.size());
  std::ostringstream bits;
  bits << "out bits " << std::hex << bits_digest(out) << "\n";
  if (!c.teacher_plain) {
    be.log << "-- loss\n";
    LossSpec loss;
    loss_and_grad(be, loss, T, ws, pol, nullptr);
    be.log << "-- backward\n";
    backward(be, s, P, X, ws, G, pol);
    std::vector<float> g(init.size());
    be.download(g.data(), G, g.size());
    bits << "grad bits " << std::hex << bits_digest(g) << "\n";
  }
  if (c.collect) {
    uint64_t n = 0, lastbin = 0, clamped = 0;
    for (const QuantStats& q : be.read_stats()) n += q.n, lastbin += q.lastbin, clamped += q.clamped;
    bits << "stats " << std::dec << n << " " << lastbin << " " << clamped << "\n";
  }
  return be.log.str() + bits.str();
}

std::string full_log() {
  std::string all;
  for (const Case& c : cases()) all += "== " + c.label + "\n" + run_case(c);
  return all;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

TEST(ModelCallLog, EveryBackendCallAsPinned) {
  const std::string got = full_log();
  if (const char* path = std::getenv("MXLAB_WRITE_CALL_LOG")) {
    std::ofstream(path) << got;
    GTEST_SKIP() << "wrote the call log to " << path;
  }
  const std::string golden = std::string(MXLAB_SOURCE_DIR) + "/tests/cpu/golden/model_calls.txt";
  const std::vector<std::string> want = lines(slurp(golden)), have = lines(got);
  std::string section;
  for (size_t i = 0; i < std::min(want.size(), have.size()); ++i) {
    if (want[i].rfind("== ", 0) == 0) section = want[i];
    ASSERT_EQ(have[i], want[i]) << "first difference at line " << i + 1 << " of " << golden << " (" << section
                                << ")";
  }
  EXPECT_EQ(have.size(), want.size()) << "the log has " << have.size() << " lines, " << golden << " " << want.size();
}

// The log names what it must: the forward hands y and a to their producers and the weights to
// prequantize, and an operand the backend is to read quantized ahead is marked (a log that lost
// these fields would pin nothing of producer-side quantization).
TEST(ModelCallLog, RecordsTheProducerSideFlags) {
  const std::string log = run_case(cases()[0]);
  EXPECT_NE(log.find("prequantize 4\n"), std::string::npos);
  EXPECT_NE(log.find("preq1]"), std::string::npos);
  EXPECT_NE(log.find("preq0]"), std::string::npos);
  const size_t ln = log.find("layernorm_fwd "), act = log.find("act_fwd ");
  ASSERT_NE(ln, std::string::npos);
  ASSERT_NE(act, std::string::npos);
  EXPECT_EQ(log.substr(ln, log.find('\n', ln) - ln).find("q_out=null"), std::string::npos);
  EXPECT_EQ(log.substr(act, log.find('\n', act) - act).find("q_out=null"), std::string::npos);
}

}  // namespace
}  // namespace mxlab
