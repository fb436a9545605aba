// The proxy model (paper Eq. 1, DESIGN.md section 1): a residual MLP student and the fixed
// teacher, written once against the Backend interface. Parameters of one network live in
// one flat buffer (so the optimizer and global norms are single calls) with named groups.
// With model.block: attention each block is Eq. 11 of the paper's appendix D (a self-attention
// sub-block, then the MLP sub-block; lab/model/attention.cpp), and the norm before each
// sub-block is layernorm, RMSNorm or MXNorm (lab/model/README.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/model/backend.h"
#include "lab/model/model_config.h"

namespace mxlab {

// One named slice of the flat parameter buffer.
struct ParamGroup {
  std::string name;  // "layer0.gamma", "layer0.beta", "layer0.W1", "layer0.W2", "layer0.b2"; attention
                     // blocks also "layer0.attn_gamma", "layer0.attn_beta", "layer0.Wqkv", "layer0.Wo", "layer0.bo"
  // Token networks (vocab > 0) add "embed" [V x d] (first) and "unembed" [V x d] (last).
  enum Kind : uint8_t { gamma = 0, beta, w1, w2, b2, attn_gamma, attn_beta, wqkv, wo, bo, embed, unembed } kind;
  int layer = 0;
  int64_t offset = 0;  // in floats
  int64_t rows = 0, cols = 0;  // W1: [H1 x d], W2: [d x H], Wqkv: [3d x d] (rows Q | K | V), Wo: [d x d],
                               // vectors: [1 x d]
  int64_t size() const { return rows * cols; }
};

// Shapes and parameter layout of a student or teacher network.
struct NetShape {
  int depth = 0, d = 0;
  int hidden = 0;     // H: width of phi's output (input of W2)
  int hidden_in = 0;  // H1: rows of W1 (= 2H for swiglu, else H)
  Act act = Act::gelu;
  bool layernorm = true, ln_affine = true, fc2_bias = true;  // layernorm: the block has a norm (any kind)
  bool residual = true;  // teacher.residual: false gives the plain MLP (A_k = W2 phi(W1 A_{k-1}))
  bool is_teacher = false;  // the teacher network (precision.gelu: vector_teacher)
  float ln_eps = 1e-5f;
  NormKind norm = NormKind::layernorm;  // which norm (none when !layernorm)
  int mxnorm_p = 2, mxnorm_block = 32;
  float mxnorm_c = 0.0f;  // MXNorm's RMS / p-mean-of-block-absmax ratio c(p, block) (papers/mxnorm.md App. F)
  BlockKind block = BlockKind::mlp;
  int heads = 1;
  int seq_len = 1;        // tokens per sequence (attention mixes the tokens of one sequence)
  bool causal = false;    // model.causal: attention sees a sequence's earlier tokens and itself only
  int vocab = 0;          // > 0: a token network (data.kind: tokens): ids in, token embedding E [V x d],
                          // the blocks, unembedding logits = A_L U^T [rows x V], cross-entropy loss
  std::vector<ParamGroup> groups;
  int64_t num_params = 0;

  // seq_len: data.seq_len (matters for attention blocks only; an MLP treats every token alone);
  // vocab: RunConfig::vocab() (0: the regression student of Gaussian data).
  static NetShape student(const ModelConfig& m, int seq_len = 1, int vocab = 0);
  static NetShape teacher(const ModelConfig& m, const TeacherConfig& t, int seq_len = 1);
  const ParamGroup* find(int layer, ParamGroup::Kind kind) const;  // null when absent
  bool attention() const { return block == BlockKind::attention; }
  bool tokens() const { return vocab > 0; }
  int out_width() const { return tokens() ? vocab : d; }  // columns of the output (logits) and the loss
  int head_dim() const { return d / heads; }
};

// MXNorm's ratio c(p, block) of papers/mxnorm.md appendix F (Monte Carlo, Gaussian input);
// throws mxlab::Error for a (p, block) the paper does not tabulate.
float mxnorm_coefficient(int p, int block);

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
  grad_out,     // dY into W2's dgrad GEMM (gradient operand under grad, along the output axis)
  grad_hidden,  // dH into W1's dgrad GEMM (the wgrad GEMMs' operands, under grad_wgrad, have no slot)
  gamma,        // Q(gamma)
  beta,         // Q(beta)
  // Attention blocks only (lab/model/README.md "Attention"):
  attn_ln_out,    // norm-1 output into Wqkv (activation)
  attn_q,         // Q in S = Q K^T (attn_logits)
  attn_k,         // K in S = Q K^T (attn_logits)
  attn_p,         // P in O = P V (attn_probs)
  attn_v,         // V in O = P V (attn_probs)
  attn_ctx,       // merged heads O into Wo (activation)
  grad_attn_out,  // dZ into Wo's dgrad (grad)
  grad_ctx,       // dO into dP = dO V^T (grad)
  grad_logits,    // dS into dQ = dS K (grad)
  grad_qkv,       // d[Q|K|V] into Wqkv's dgrad (grad)
  attn_gamma,     // Q(gamma) of norm 1
  attn_beta,      // Q(beta) of norm 1
  kCount
};
constexpr int kStatTensors = static_cast<int>(StatTensor::kCount);
inline int stats_slot(int layer, StatTensor t) { return layer * kStatTensors + static_cast<int>(t); }
const char* name(StatTensor t);
// The tensors a network of this shape has statistics for, in dataset order (an MLP network
// lists the first six only, so its files are what they were before attention existed).
std::vector<StatTensor> stat_tensors(const NetShape& s);
// Whether policy `p` MX-quantizes tensor `t` (else its statistics are a diagnostic under
// p.diagnostic_format, or, for the attention GEMMs' operands under precision.attention:
// flash_bf16, not counted at all), and the format of the role it belongs to.
bool stat_quantized(const PrecisionConfig& p, StatTensor t);
NumFmt stat_role_format(const PrecisionConfig& p, StatTensor t);

// Activation storage for one forward/backward pass of a network at batch B.
struct Workspace {
  int64_t batch = 0;
  int64_t width = 0;          // d: columns of the output and its gradient
  std::vector<float*> a_in;   // [L] residual stream entering block k   [B x d]
  std::vector<float*> ln_y;   // [L] layernorm output (= a_in without LN) [B x d]
  std::vector<float*> xhat;   // [L] normalised input                    [B x d]
  std::vector<float*> rstd;   // [L]                                     [B]
  std::vector<float*> h;      // [L] pre-activation, unrounded           [B x H1]
  // The rounding its readers (act_fwd, act_bwd) apply to h: the forward pass's element-wise
  // rounding, deferred from the GEMM that produced h (kernels/PERF.md). Set by forward(), so a
  // backward under another policy still reads h as that forward left it.
  ElementwiseRound h_round;
  std::vector<float*> a;      // [L] activation                          [B x H]
  float* out = nullptr;       // network output                          [B x d] (token networks: logits [B x V])
  float* dout = nullptr;      // loss gradient / residual-stream gradient [B x d] (token networks: [B x V])
  // Token networks: the residual stream leaving the last block and its gradient [B x d] (else null).
  float* a_final = nullptr;
  float* d_final = nullptr;
  float* d_ln = nullptr;      // gradient scratch                        [B x d]
  float* d_a = nullptr;       //                                         [B x H]
  float* d_h = nullptr;       //                                         [B x H1]
  float* d_x = nullptr;       //                                         [B x d]
  float* gq_gamma = nullptr;  // Q(gamma) of every layer and norm site    [L x sites x d]
                              // (sites: the MLP norm, and the attention norm in attention blocks);
                              // the forward writes layer k's, the backward reads it (gain_slot)
  float* gq_beta = nullptr;   // Q(beta) of the current layer (the forward's only) [d]
  float* y = nullptr;         // block output scratch                    [B x d]
  float* loss = nullptr;      // [1]
  float* w_fused = nullptr;   // MXNorm: W o Q(gamma), the weight after the norm [max(H1, 3d) x d]
  // Attention blocks (B here is the token count; nb = B / seq_len sequences, heads h, S = seq_len,
  // dh = d / h; "heads layout" is [nb*h x S x dh]); empty for MLP blocks:
  std::vector<float*> z;          // [L] residual stream after attention        [B x d]
  std::vector<float*> attn_y;     // [L] norm-1 output (Wqkv's input)           [B x d]
  std::vector<float*> attn_xhat;  // [L]                                        [B x d]
  std::vector<float*> attn_rstd;  // [L]                                        [B]
  std::vector<float*> qkv;        // [L] projections                            [B x 3d]
  std::vector<float*> qh, kh, vh; // [L] Q, K, V in heads layout
  std::vector<float*> probs;      // [L] softmax(scale Q K^T)                   [nb*h x S x S]
  std::vector<float*> rowmax;     // [L] max scaled logit of each row of probs [nb*h*S]
  std::vector<float*> ctx;        // [L] heads merged (Wo's input)              [B x d]
  float* ctx_h = nullptr;         // scratch in heads layout (O, then dO)
  float* d_qkv = nullptr;         //                                            [B x 3d]
  float* d_qh = nullptr;          // heads layout
  float* d_kh = nullptr;
  float* d_vh = nullptr;
  float* d_probs = nullptr;       // dP, then dS                                [nb*h x S x S]
  // Flash attention (precision.attention: flash_bf16; rows = nb*h*S query rows), per layer:
  std::vector<float*> fa_o;       // [L] O_lp, the bf16 output, heads layout    [B x d]
  std::vector<float*> fa_o_hp;    // [L] O_hp, the FP32 O before its rounding   [B x d]
  std::vector<float*> fa_lse;     // [L] m + log l per row                      [rows]
  std::vector<float*> fa_stats;   // [L] per row: keys attaining its max, bf16 P-bar entries equal to 1
                                  //     [rows x Backend::kFlashRowStats]
  std::vector<float*> fa_delta;   // [L] the delta the last backward used       [rows]
  std::vector<float*> fa_delta_hp;  // [L] delta_hp = rowsum(dO o O_hp) of it  [rows]
  std::vector<char> attn_flash;   // [L] the last forward ran the flash kernel (its backward must too)
  // batch: rows (tokens) of one pass; a multiple of s.seq_len.
  static Workspace make(Backend& be, const NetShape& s, int64_t batch);
};

// Why policy p's block Hadamard rotation (precision.rotation) cannot run on network s with `tokens`
// rows per pass, or "": the reduction length K of every GEMM it rotates must be a multiple of
// p.rotation_block (Fprop: d and H; Dgrad: d and H1, attention also 3d; Wgrad: tokens). `backward`:
// the dgrad and wgrad GEMMs too (else the forward's only). The passes throw mxlab::Error with it;
// the configuration check names the key.
std::string rotation_problem(const NetShape& s, int64_t tokens, const PrecisionConfig& p, bool backward);

// Forward pass: ws.out = net(x). `params` is the flat buffer. For the teacher, policy is FP32.
// A token network reads x as token ids [B] (floats holding integers in [0, V)) and writes logits.
void forward(Backend& be, const NetShape& s, const float* params, const float* x, Workspace& ws,
             const PassPolicy& pol);

// Loss of ws.out against target, its gradient into ws.dout (loss value into ws.loss[0] and,
// when loss_history != null, loss_history[step]). xent: target holds the next token ids [B].
void loss_and_grad(Backend& be, const LossSpec& loss, const float* target, Workspace& ws, const PassPolicy& pol,
                   float* loss_history);

// Backward pass after forward + loss_and_grad: writes the flat gradient `grads`
// (same layout as params). With pol.p.backward == false the backward is entirely FP32.
void backward(Backend& be, const NetShape& s, const float* params, const float* x, Workspace& ws,
              float* grads, const PassPolicy& pol);

// How the forward pass quantizes a parameter group under `pol`, for Backend::quant_gap (the
// clamp debt): gamma / beta as Q_ln does (the ln_affine role, one row of d, no bf16
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
// Set the stored norm affine weights (every gamma and beta group of an MLP block) to the values
// the forward pass uses under `pol` (Q(gamma), Q(beta) of forward_param_quant; the
// snap_gamma intervention). `scratch` holds at least the largest such group. Uses the
// stochastic-rounding stream of the backend's current StepScalars.step.
void snap_norm_affine(Backend& be, const NetShape& S, float* params, const PassPolicy& pol, float* scratch);

// The largest scaled attention logit (scale * q.k, the softmax input) of layer `layer` in the
// last forward pass run on `ws` (attention blocks only; synchronises). NaN when non-finite.
double attention_logit_max(Backend& be, const NetShape& s, const Workspace& ws, int layer);

// The flash kernel's settings under policy `p` (precision.attention_tile, _softmax, _beta, _eps,
// _delta) for network `s`.
Backend::FlashSpec flash_spec(const PrecisionConfig& p, const NetShape& s);

// The flash instruments of layer `layer` from the last forward and backward on `ws` under
// precision.attention: flash_bf16 (lab/train/SCHEMA.md; synchronises): the fraction of query rows
// whose largest scaled logit is attained by more than one key, the fraction of rows with more than
// one bf16 P-bar entry equal to 1, and sum over every row of (delta - delta_hp) (delta the one the
// backward used: 0 exactly under attention_delta: hp), a double sum in row order.
struct FlashInstruments {
  double multi_max_frac = 0.0, multi_one_frac = 0.0, delta_bias = 0.0;
};
FlashInstruments flash_instruments(Backend& be, const NetShape& s, const Workspace& ws, int layer);

}  // namespace mxlab
