// Reading, validating, printing and hashing a RunConfig (lab/config/config.h), and the
// intervention presets (DESIGN.md sections 4, 6, 7, 11). The YAML keys are the struct's
// field names; parsing is strict: an unknown key, a wrong type, a value out of range or an
// impossible shape is an mxlab::Error of one line "WHERE: what is wrong (how to fix it)",
// WHERE being "FILE:LINE" (1-based) or the `--set` option at fault.
#pragma once
#include <string>
#include <vector>

#include "lab/config/config.h"

namespace mxlab {

// Load a run configuration from a YAML file, then apply `overrides` ("dotted.key=value", the
// CLI's --set; same validation as the file). The file may use `extends:`, `base:` and a
// `sweep:` of exactly one run (lab/config/sweep.h); a sweep of more runs is an error here: use
// expand_experiment / `mxlab plan`.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from YAML text; `origin_name` stands for the file name in messages.
RunConfig config_from_yaml_string(const std::string& text, const std::string& origin_name,
                                  const std::vector<std::string>& overrides = {});

// Range and cross-field checks of a configuration built in code (the loader runs the same
// checks, with file and line). Throws mxlab::Error.
void validate_config(const RunConfig& cfg);

// The fully resolved configuration as YAML in the input schema: every field, in a fixed
// order, floats printed so that they read back to the same float. `same` (precision.*_bwd,
// teacher.activation) and 0 (teacher.depth/width, log.bias_every) are printed as written so
// that dump -> load gives back an identical struct.
std::string dump_config(const RunConfig& cfg);

// Run id: 12 hex digits, the top 48 bits of the 64-bit FNV-1a hash of dump_config's text with
// the presentation-only fields left out: name, device, log.progress, log.flush_every. These
// change no number a run produces; leaving out `device` lets a sweep started with
// `--device cuda` resume with `--device cpu` (or on another GPU) and find its finished runs.
// Fields are hashed as written (`weight_bwd: same` and an explicit equal format give different
// ids: they differ once an intervention changes `weight`). Keys added after schema 1 (leaves
// marked since_v2 in config.cpp, and list-valued keys such as `arms`) are left out while they
// hold their default, so every run id published before them is still the id of that run (so is
// grad_wgrad's own rounding mode, which `rounding` prints only when it is set). `precision.gemm`
// is no field: it is hashed as the roles it set.
std::string config_hash(const RunConfig& cfg);
std::string canonical_config_text(const RunConfig& cfg);  // the text config_hash hashes

// ---- interventions (DESIGN.md section 6) ----
// Presets and what each sets (nothing else changes):
//   to_fp32              every role fp32 (weight_bwd, activation_bwd, attn_logits, attn_probs too), ln_affine
//                        none, elementwise fp32; layernorm, gelu, residual, bias, ln_beta_grad at their
//                        defaults (the lab's FP32 ops); attention exact, attention_softmax standard,
//                        attention_delta lp (attention_tile, _beta, _eps kept)
//   skip_ln_quant        ln_affine none
//   bump_exponent        scale_rule floor_bump, bump clamp
//   bump_exponent_always scale_rule floor_bump, bump always
//   forward_only         backward false
//   bf16_activations     activation bf16, activation_bwd bf16
//   bf16_weights         weight bf16, weight_bwd bf16
//   bf16_fwd_activations activation bf16; activation_bwd keeps the format it resolved to
//   paper_emulator       the arithmetic of the paper's emulator as its released code ran it (lab/model/
//                        README.md, "The paper's emulator"): scale_rule floor, bump clamp, rounding
//                        nearest_away (every role), elementwise bf16 nearest_away, ln_affine bf16,
//                        layernorm vector, gelu vector_teacher, residual fp32, bias elementwise,
//                        ln_beta_grad false; formats, block_size and backward as they were
//   flash_bf16           attention flash_bf16 (lab/model/README.md, "Flash attention in bf16")
//   stabilized_softmax   attention flash_bf16, attention_softmax stabilized (the paper's Algorithm 3)
//   delta_hp             attention flash_bf16, attention_delta hp (delta from the FP32 O)
// (to_fp32 also sets grad_wgrad fp32.) Then `set:` applies precision fields (same names and
// values as the precision section): first the GEMM fields gemm.fprop / gemm.dgrad / gemm.wgrad
// (YAML `set: {gemm: {wgrad: F}}`), each setting its GEMM's two operand roles (fprop: weight,
// activation; dgrad: grad, weight_bwd; wgrad: grad_wgrad, activation_bwd) and pinning the
// `same` roles of the other GEMMs that would follow them (fprop: weight_bwd, activation_bwd;
// dgrad: grad_wgrad) to the format they had; then the other fields. A patch may not give a
// GEMM field and a role it sets (mxlab::Error). `precision.gemm` in a configuration works the
// same way on the roles given beside it, which may not include the GEMM's own.
std::vector<std::string> intervention_presets();
PrecisionConfig apply_intervention(const PrecisionConfig& base, const InterventionConfig& iv);
// Whether the curvature instrument's Hessian-vector products cover this model: the MLP block,
// with layernorm or no norm (log.curvature_every is refused otherwise; `mxlab bench` skips it).
bool curvature_supported(const ModelConfig& m);
// The presets of an `apply` value: one name, or several joined by '+' ("" -> none).
std::vector<std::string> preset_parts(const std::string& apply);
// Whether the patch's presets (preset_parts) include `preset`.
bool has_preset(const InterventionConfig& iv, const std::string& preset);
// snap_gamma: the stored norm affine weights (gamma, beta) are set to the values the forward pass
// used (their quantized values under the policy the trajectory had) when the branch starts.
inline bool snaps_gamma(const InterventionConfig& iv) { return has_preset(iv, "snap_gamma"); }
// reset_adam_v: when the branch starts, Adam's second moment v := bc2 * g^2 with g the branch's
// gradient at its first step (its new policy, its weights, the step's batch), so that v-hat =
// g^2: v recalibrated on the new gradients, m kept.
inline bool resets_adam_v(const InterventionConfig& iv) { return has_preset(iv, "reset_adam_v"); }
// The patch as one line of flow YAML, e.g. "{apply: to_fp32, set: {backward: false}}".
std::string describe_patch(const InterventionConfig& iv);
std::string describe_patch(const ArmConfig& arm);
// Every field of a policy on one line ("weight=mxfp8_e4m3 activation=... grad_wgrad=...
// rounding=nearest_away ..."; a per-role rounding as rounding=weight:M,activation:M,grad:M,
// ln_affine:M, with ,grad_wgrad:M when that role's mode differs from grad's): the `policy`
// attribute of the run file's groups.
std::string describe_policy(const PrecisionConfig& p);

// Every leaf key of the schema in dotted form ("model.width", ...), "arms", "interventions", the
// per-role roundings "precision.rounding.<role>" and "precision.gemm", "precision.gemm.<GEMM>".
std::vector<std::string> config_keys();

// Activation names (relu, gelu, gelu_tanh, swiglu, linear).
const char* act_name(Act a);

// Field-by-field equality (floats compared exactly: a round trip must be exact).
bool operator==(const DataConfig& a, const DataConfig& b);
bool operator==(const OptimizerConfig& a, const OptimizerConfig& b);
bool operator==(const ScheduleConfig& a, const ScheduleConfig& b);
bool operator==(const LogConfig& a, const LogConfig& b);
bool operator==(const InterventionConfig& a, const InterventionConfig& b);
bool operator==(const ArmConfig& a, const ArmConfig& b);
bool operator==(const RunConfig& a, const RunConfig& b);
inline bool operator!=(const PrecisionConfig& a, const PrecisionConfig& b) { return !(a == b); }
inline bool operator!=(const RunConfig& a, const RunConfig& b) { return !(a == b); }

// ---- building blocks of the experiment loader (lab/config/sweep.cpp) ----
struct YNode;
struct YLoc;
// Apply "dotted.key=value" options to a YAML tree (before parsing it).
void apply_overrides(YNode& root, const std::vector<std::string>& overrides);
// Set a dotted key in a YAML tree (overrides, sweep values): yaml_set_path, except that
// `precision.rounding.<role>` under a one-mode `precision.rounding` keeps the other roles' mode.
void set_config_path(YNode& root, const std::vector<std::string>& path, const YNode& value, const YLoc& loc);
// Parse a tree holding run keys only into a validated RunConfig. `origin` names the source
// in messages about the file as a whole.
RunConfig config_from_tree(const YNode& root, const std::string& origin);

}  // namespace mxlab
