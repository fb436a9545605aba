// The proxy model (paper Eq. 1, DESIGN.md section 1): a residual MLP student and the fixed
// teacher, written once against the Backend interface. Parameters of one network live in
// one flat buffer (so the optimizer and global norms are single calls) with named groups.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/model/backend.h"
#include "lab/train/config.h"

namespace mxlab {

// One named slice of the flat parameter buffer.
struct ParamGroup {
  std::string name;  // "layer0.gamma", "layer0.beta", "layer0.W1", "layer0.W2", "layer0.b2"
  enum Kind : uint8_t { gamma = 0, beta, w1, w2, b2 } kind;
  int layer = 0;
  int64_t offset = 0;  // in floats
  int64_t rows = 0, cols = 0;  // W1: [H1 x d], W2: [d x H], vectors: [1 x d]
  int64_t size() const { return rows * cols; }
};

// Shapes and parameter layout of a student or teacher network.
struct NetShape {
  int depth = 0, d = 0;
  int hidden = 0;     // H: width of phi's output (input of W2)
  int hidden_in = 0;  // H1: rows of W1 (= 2H for swiglu, else H)
  Act act = Act::gelu;
  bool layernorm = true, ln_affine = true, fc2_bias = true;
  bool residual = true;  // teacher.residual: false gives the plain MLP (A_k = W2 phi(W1 A_{k-1}))
  float ln_eps = 1e-5f;
  std::vector<ParamGroup> groups;
  int64_t num_params = 0;

  static NetShape student(const ModelConfig& m);
  static NetShape teacher(const ModelConfig& m, const TeacherConfig& t);
  const ParamGroup* find(int layer, ParamGroup::Kind kind) const;  // null when absent
};

// Initial parameters on the host (deterministic: Philox stream `stream`, seed):
// pytorch: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases; xavier_normal(gain)
// for weights with zero biases; gamma = 1, beta = 0.
std::vector<float> init_params(const NetShape& s, InitKind init, float gain, uint64_t seed, Stream stream);

// The numeric policy of one forward/backward pass, resolved from PrecisionConfig.
struct PassPolicy {
  PrecisionConfig p;  // as configured (for the MX trajectory) or PrecisionConfig::fp32()
  uint64_t seed = 0;  // stochastic rounding
  bool collect_stats = false;  // fill the last-bin statistics slots (log steps only)
  int stats_base = 0;          // slot offset of this pass: slots stats_base + stats_slot(layer, t)
};

// Statistics slots filled by a pass with collect_stats (see Backend::read_stats); slot ids:
//   pol.stats_base + stats_slot(layer, StatTensor) for per-layer tensors (the trainer gives
//   each trajectory its own base, so passes on different lanes never share a slot).
enum class StatTensor : uint8_t {
  ln_out = 0,   // LN output into W1 (forward activation operand)
  act_out,      // phi output into W2 (forward activation operand)
  grad_out,     // dY into the W2 backward GEMMs (gradient operand, along the output axis)
  grad_hidden,  // dH into the W1 backward GEMMs
  gamma,        // Q(gamma)
  beta,         // Q(beta)
  kCount
};
constexpr int kStatTensors = static_cast<int>(StatTensor::kCount);
inline int stats_slot(int layer, StatTensor t) { return layer * kStatTensors + static_cast<int>(t); }
const char* name(StatTensor t);

// Activation storage for one forward/backward pass of a network at batch B.
struct Workspace {
  int64_t batch = 0;
  std::vector<float*> a_in;   // [L] residual stream entering block k   [B x d]
  std::vector<float*> ln_y;   // [L] layernorm output (= a_in without LN) [B x d]
  std::vector<float*> xhat;   // [L] normalised input                    [B x d]
  std::vector<float*> rstd;   // [L]                                     [B]
  std::vector<float*> h;      // [L] pre-activation                      [B x H1]
  std::vector<float*> a;      // [L] activation                          [B x H]
  float* out = nullptr;       // network output                          [B x d]
  float* dout = nullptr;      // loss gradient / residual-stream gradient [B x d]
  float* d_ln = nullptr;      // gradient scratch                        [B x d]
  float* d_a = nullptr;       //                                         [B x H]
  float* d_h = nullptr;       //                                         [B x H1]
  float* d_x = nullptr;       //                                         [B x d]
  float* gq_gamma = nullptr;  // quantized gamma / beta of one layer      [d]
  float* gq_beta = nullptr;
  float* y = nullptr;         // block output scratch                    [B x d]
  float* loss = nullptr;      // [1]
  static Workspace make(Backend& be, const NetShape& s, int64_t batch);
};

// Forward pass: ws.out = net(x). `params` is the flat buffer. For the teacher, policy is FP32.
void forward(Backend& be, const NetShape& s, const float* params, const float* x, Workspace& ws,
             const PassPolicy& pol);

// Loss of ws.out against target, its gradient into ws.dout (loss value into ws.loss[0] and,
// when loss_history != null, loss_history[step]).
void loss_and_grad(Backend& be, const RunConfig& cfg, const float* target, Workspace& ws, const PassPolicy& pol,
                   float* loss_history);

// Backward pass after forward + loss_and_grad: writes the flat gradient `grads`
// (same layout as params). With pol.p.backward == false the backward is entirely FP32.
void backward(Backend& be, const NetShape& s, const float* params, const float* x, Workspace& ws,
              float* grads, const PassPolicy& pol);

// How the forward pass quantizes a parameter group under `pol`, for Backend::quant_gap (the
// clamp debt of issue 12): gamma / beta as Q_ln does (the ln_affine role, one row of d, no bf16
// first), W1 / W2 as the forward GEMM's weight operand (the weight role, blocks along K, its
// stochastic seed sr_seed(pol.seed, sr_op), bf16 first per the policy). b2 is never quantized
// (q.fmt = fp32). Stochastic rounding also needs the step's StepScalars, as the pass does.
struct ParamQuant {
  QuantSpec q;
  Axis axis = Axis::contiguous;
  int64_t rows = 0, cols = 0;  // the group's stored shape
  bool round_bf16_first = false;
  Rounding bf16_mode = Rounding::nearest_even;
};
ParamQuant forward_param_quant(const ParamGroup& g, const PassPolicy& pol);

}  // namespace mxlab
