// Every metric the trainer writes into a trajectory's or branch's group of the run file, each
// declared once: its dataset name, its shape, the series its rows belong to, which groups have
// it and what it means. The trainer (lab/train/trainer.cpp) writes rows through these
// declarations, RunFile (lab/runs/run_file.cpp) shapes its datasets by them, lab/train/SCHEMA.md
// documents the same list (tests/cpu/test_metrics_schema.cpp fails when the two differ) and
// analysis/mxlab/schema.py reads through the same names.
//
// A declaration whose name holds "{tensor}" is a family: one dataset per tensor, for the
// tensors `family` names (member_names).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mxlab {

struct NetShape;
enum class StatTensor : uint8_t;

// Shape of a metric's dataset; n = the rows of its series, L = layers, G = parameter groups.
enum class MetricShape : uint8_t {
  scalar,        // [n]: one value per row
  per_layer,     // [n, L]
  per_group,     // [n, G]: per parameter group (dataset attribute `names`: the group names)
  per_weight,    // [n, 2L]: per W1 and W2 weight group (dataset attribute `names`: their names)
  per_step_run,  // [steps_run]: one value per step the trajectory ran (not a row series)
};
// The series a metric's rows belong to, i.e. its step axis.
enum class MetricSeries : uint8_t {
  logged,     // one row per logged step (axis `step`)
  shadow,     // one row per shadow step (axis `shadow_step`)
  curvature,  // one row per curvature measurement (axis `curvature_step`)
  history,    // no rows: written whole at the end (loss_all)
};
// Which groups have the metric.
enum class MetricHolders : uint8_t {
  all,  // the FP32 trajectory, every arm and every branch
  mx,   // the MX trajectories only: every arm and every branch
};
// When a group has the metric at all.
enum class MetricWhen : uint8_t {
  always,
  norm_gain,  // the network has that norm gain (γ; for a family member, that member's γ or β)
  attention,  // attention networks only (model.block: attention)
  curvature,  // with log.curvature_every > 0
};
// The tensors a "{tensor}" family is over.
enum class MetricFamily : uint8_t {
  none,         // a single dataset
  stat_tensor,  // every statistics tensor of the network (lab/model/mlp.h stat_tensors)
  norm_gain,    // the norm gains γ and β the network has
};

struct Metric {
  const char* name;  // the dataset name ("{tensor}_lastbin" for a family)
  MetricShape shape;
  MetricSeries series;
  MetricHolders holders;
  MetricWhen when;
  MetricFamily family;
  const char* meaning;  // one line
};

namespace metric {

// Shorthands for the table below.
using S = MetricShape;
using R = MetricSeries;
using H = MetricHolders;
using W = MetricWhen;
using F = MetricFamily;

// ---- logged rows, every group ----
inline constexpr Metric step{"step", S::scalar, R::logged, H::all, W::always, F::none,
                             "0-based step index of the row (logged after the update of that step)"};
inline constexpr Metric loss{"loss", S::scalar, R::logged, H::all, W::always, F::none,
                             "loss on the step's batch, before the update"};
inline constexpr Metric lr{"lr", S::scalar, R::logged, H::all, W::always, F::none, "learning rate applied at the step"};
inline constexpr Metric grad_norm{"grad_norm", S::scalar, R::logged, H::all, W::always, F::none,
                                  "norm of the gradient applied"};
inline constexpr Metric update_norm{"update_norm", S::scalar, R::logged, H::all, W::always, F::none,
                                    "norm of the update, |w_{t+1} - w_t|"};
inline constexpr Metric weight_norm{"weight_norm", S::scalar, R::logged, H::all, W::always, F::none,
                                    "norm of the weights after the update, |w_{t+1}|"};
inline constexpr Metric gamma_mean{"gamma_mean", S::per_layer, R::logged, H::all, W::norm_gain, F::none,
                                   "mean of the FP32 master norm gain γ of each layer"};
inline constexpr Metric gamma_std{"gamma_std", S::per_layer, R::logged, H::all, W::norm_gain, F::none,
                                  "standard deviation of γ of each layer"};
inline constexpr Metric gamma_min{"gamma_min", S::per_layer, R::logged, H::all, W::norm_gain, F::none,
                                  "smallest γ of each layer"};
inline constexpr Metric gamma_max{"gamma_max", S::per_layer, R::logged, H::all, W::norm_gain, F::none,
                                  "largest γ of each layer"};
inline constexpr Metric lastbin{"{tensor}_lastbin", S::per_layer, R::logged, H::all, W::always, F::stat_tensor,
                                "fraction of the tensor's elements in the last bin of their MX block"};
inline constexpr Metric clamped{"{tensor}_clamped", S::per_layer, R::logged, H::all, W::always, F::stat_tensor,
                                "fraction of the tensor's elements clamped by the quantizer"};
inline constexpr Metric attn_logit_max{"attn_logit_max", S::per_layer, R::logged, H::all, W::attention, F::none,
                                       "largest scaled attention logit of each layer on the step's batch"};
// The flash kernel's instruments (precision.attention: flash_bf16; NaN for a trajectory whose
// attention is exact at that step).
inline constexpr Metric attn_multi_max_frac{"attn_multi_max_frac", S::per_layer, R::logged, H::all, W::attention,
                                            F::none, "fraction of rows of S whose maximum is attained more than once"};
inline constexpr Metric attn_multi_one_frac{"attn_multi_one_frac", S::per_layer, R::logged, H::all, W::attention,
                                            F::none, "fraction of rows with more than one bf16 P-bar entry equal to 1"};
inline constexpr Metric attn_delta_bias{"attn_delta_bias", S::per_layer, R::logged, H::all, W::attention, F::none,
                                        "sum over the rows of delta - delta_hp (the flash backward's delta bias)"};
inline constexpr Metric attn_delta_bias_cumsum{"attn_delta_bias_cumsum", S::per_layer, R::logged, H::all,
                                               W::attention, F::none, "running sum of attn_delta_bias over the rows"};
// The projections of the attention sub-block (lab/train/attn_instruments.h; every trajectory).
inline constexpr Metric attn_wq_spec{"attn_wq_spec", S::per_layer, R::logged, H::all, W::attention, F::none,
                                     "spectral norm of the layer's W_Q the step's forward used (power iteration)"};
inline constexpr Metric attn_wk_spec{"attn_wk_spec", S::per_layer, R::logged, H::all, W::attention, F::none,
                                     "spectral norm of the layer's W_K the step's forward used (power iteration)"};
inline constexpr Metric attn_wv_spec{"attn_wv_spec", S::per_layer, R::logged, H::all, W::attention, F::none,
                                     "spectral norm of the layer's W_V the step's forward used (power iteration)"};
inline constexpr Metric attn_dwq_err_cos{"attn_dwq_err_cos", S::per_layer, R::logged, H::all, W::attention, F::none,
                                         "cosine of the W_Q gradient error g~ - g-bar with the previous logged "
                                         "shadow step's (NaN for the FP32 trajectory)"};
// Clamp debt: the stored FP32 parameters the step's forward pass used against what it made of them.
inline constexpr Metric gap_mean{"{tensor}_gap_mean", S::per_layer, R::logged, H::all, W::norm_gain, F::norm_gain,
                                 "mean over the layer's elements of |x - Q(x)| / |x|"};
inline constexpr Metric gap_max{"{tensor}_gap_max", S::per_layer, R::logged, H::all, W::norm_gain, F::norm_gain,
                                "largest |x - Q(x)| / |x| of the layer's elements"};
inline constexpr Metric above_frac{"{tensor}_above_frac", S::per_layer, R::logged, H::all, W::norm_gain,
                                   F::norm_gain, "fraction of the stored elements the quantizer clamps"};
inline constexpr Metric weight_gap_mean{"weight_gap_mean", S::per_weight, R::logged, H::all, W::always, F::none,
                                        "mean |x - Q(x)| / |x| of each W1 and W2"};
inline constexpr Metric weight_above_frac{"weight_above_frac", S::per_weight, R::logged, H::all, W::always, F::none,
                                          "fraction of each W1's and W2's elements the quantizer clamps"};

// ---- logged rows, MX trajectories (NaN where the step had no shadow pass, except cross_*) ----
inline constexpr Metric bias_ratio{"bias_ratio", S::scalar, R::logged, H::mx, W::always, F::none,
                                   "|g~ - g-bar| / |g-bar|, g-bar the FP32 gradient at the MX weights"};
inline constexpr Metric cosine{"cosine", S::scalar, R::logged, H::mx, W::always, F::none,
                               "cosine between g~ and g-bar"};
inline constexpr Metric bias_ratio_avg{"bias_ratio_avg", S::scalar, R::logged, H::mx, W::always, F::none,
                                       "running average of bias_ratio (bias-corrected EMA)"};
inline constexpr Metric bias_ratio_group{"bias_ratio_group", S::per_group, R::logged, H::mx, W::always, F::none,
                                         "bias_ratio of each parameter group"};
inline constexpr Metric cosine_group{"cosine_group", S::per_group, R::logged, H::mx, W::always, F::none,
                                     "cosine of each parameter group"};
inline constexpr Metric cross_ratio{"cross_ratio", S::scalar, R::logged, H::mx, W::always, F::none,
                                    "|g_mx - g_fp32| / |g_fp32| against the FP32 trajectory's gradient (every row)"};
inline constexpr Metric cross_cosine{"cross_cosine", S::scalar, R::logged, H::mx, W::always, F::none,
                                     "cosine between g_mx and the FP32 trajectory's gradient (every row)"};
inline constexpr Metric cross_ratio_sq{"cross_ratio_sq", S::scalar, R::logged, H::mx, W::always, F::none,
                                       "cross_ratio squared (every row)"};
inline constexpr Metric cross_ratio_sq_avg{"cross_ratio_sq_avg", S::scalar, R::logged, H::mx, W::always, F::none,
                                           "running average of cross_ratio_sq (bias-corrected EMA)"};
inline constexpr Metric eps_norm{"eps_norm", S::scalar, R::logged, H::mx, W::always, F::none,
                                 "|eps| = |g~ - g-bar|"};
inline constexpr Metric gbar_norm{"gbar_norm", S::scalar, R::logged, H::mx, W::always, F::none, "|g-bar|"};
inline constexpr Metric gtilde_norm{"gtilde_norm", S::scalar, R::logged, H::mx, W::always, F::none, "|g~|"};
inline constexpr Metric eps_par{"eps_par", S::scalar, R::logged, H::mx, W::always, F::none,
                                "eps along g-bar, <eps, g-bar> / |g-bar| (signed)"};
inline constexpr Metric eps_perp{"eps_perp", S::scalar, R::logged, H::mx, W::always, F::none,
                                 "eps across g-bar, sqrt(|eps|^2 - eps_par^2)"};
inline constexpr Metric shadow_loss{"shadow_loss", S::scalar, R::logged, H::mx, W::always, F::none,
                                    "FP32 loss at the MX weights on the step's batch (the shadow pass's)"};
inline constexpr Metric eps_norm_group{"eps_norm_group", S::per_group, R::logged, H::mx, W::always, F::none,
                                       "eps_norm of each parameter group"};
inline constexpr Metric gbar_norm_group{"gbar_norm_group", S::per_group, R::logged, H::mx, W::always, F::none,
                                        "gbar_norm of each parameter group"};
inline constexpr Metric gtilde_norm_group{"gtilde_norm_group", S::per_group, R::logged, H::mx, W::always, F::none,
                                          "gtilde_norm of each parameter group"};
inline constexpr Metric weight_distance{"weight_distance", S::scalar, R::logged, H::mx, W::always, F::none,
                                        "|w_mx - w_fp32| / |w_fp32|"};

// ---- every group: the loss of every step run ----
inline constexpr Metric loss_all{"loss_all", S::per_step_run, R::history, H::all, W::always, F::none,
                                 "loss of every step the trajectory ran, from its first (float32)"};

// ---- the shadow series (MX trajectories): one row per shadow step, logged or not ----
inline constexpr Metric shadow_step{"shadow_step", S::scalar, R::shadow, H::mx, W::always, F::none,
                                    "the shadow step of the row"};
inline constexpr Metric shadow_bias_ratio{"shadow_bias_ratio", S::scalar, R::shadow, H::mx, W::always, F::none,
                                          "bias_ratio of the shadow step"};
inline constexpr Metric shadow_cosine{"shadow_cosine", S::scalar, R::shadow, H::mx, W::always, F::none,
                                      "cosine of the shadow step"};
inline constexpr Metric shadow_cross_ratio{"shadow_cross_ratio", S::scalar, R::shadow, H::mx, W::always, F::none,
                                           "cross_ratio of the shadow step"};
inline constexpr Metric shadow_cross_ratio_sq{"shadow_cross_ratio_sq", S::scalar, R::shadow, H::mx, W::always,
                                              F::none, "cross_ratio_sq of the shadow step"};
inline constexpr Metric shadow_eps_norm{"shadow_eps_norm", S::scalar, R::shadow, H::mx, W::always, F::none,
                                        "eps_norm of the shadow step"};
inline constexpr Metric shadow_gbar_norm{"shadow_gbar_norm", S::scalar, R::shadow, H::mx, W::always, F::none,
                                         "gbar_norm of the shadow step"};
inline constexpr Metric shadow_gtilde_norm{"shadow_gtilde_norm", S::scalar, R::shadow, H::mx, W::always, F::none,
                                           "gtilde_norm of the shadow step"};
inline constexpr Metric shadow_eps_par{"shadow_eps_par", S::scalar, R::shadow, H::mx, W::always, F::none,
                                       "eps_par of the shadow step"};
inline constexpr Metric shadow_eps_perp{"shadow_eps_perp", S::scalar, R::shadow, H::mx, W::always, F::none,
                                        "eps_perp of the shadow step"};
inline constexpr Metric shadow_fp32_loss{"shadow_fp32_loss", S::scalar, R::shadow, H::mx, W::always, F::none,
                                         "shadow_loss of the shadow step"};

// ---- the curvature series (log.curvature_every > 0): at the FP32 master weights, probe batch ----
inline constexpr Metric curvature_step{"curvature_step", S::scalar, R::curvature, H::all, W::curvature, F::none,
                                       "the step at whose start the row was measured"};
inline constexpr Metric hessian_lmax{"hessian_lmax", S::scalar, R::curvature, H::all, W::curvature, F::none,
                                     "largest eigenvalue of the loss Hessian H"};
inline constexpr Metric hessian_resid{"hessian_resid", S::scalar, R::curvature, H::all, W::curvature, F::none,
                                      "last relative change of the Lanczos estimate of hessian_lmax"};
inline constexpr Metric precond_lmax{"precond_lmax", S::scalar, R::curvature, H::all, W::curvature, F::none,
                                     "largest eigenvalue of P^-1 H (Adam's preconditioner P; SGD: H)"};
inline constexpr Metric precond_resid{"precond_resid", S::scalar, R::curvature, H::all, W::curvature, F::none,
                                      "last relative change of the Lanczos estimate of precond_lmax"};
inline constexpr Metric precond_threshold{"precond_threshold", S::scalar, R::curvature, H::all, W::curvature, F::none,
                                          "edge-of-stability threshold for precond_lmax at the step's lr"};
inline constexpr Metric eq10_lhs{"eq10_lhs", S::scalar, R::curvature, H::all, W::curvature, F::none,
                                 "left-hand side of the paper's Eq. 10, |1 - s| + s r"};
inline constexpr Metric probe_loss{"probe_loss", S::scalar, R::curvature, H::all, W::curvature, F::none,
                                   "FP32 loss on the probe batch at the measured weights"};

// Every declaration above, in this order (the order of SCHEMA.md's tables).
inline constexpr const Metric* kAll[] = {
    &step, &loss, &lr, &grad_norm, &update_norm, &weight_norm, &gamma_mean, &gamma_std, &gamma_min, &gamma_max,
    &lastbin, &clamped, &loss_all,
    &bias_ratio, &cosine, &bias_ratio_avg, &bias_ratio_group, &cosine_group, &eps_norm, &gbar_norm, &gtilde_norm,
    &eps_norm_group, &gbar_norm_group, &gtilde_norm_group, &eps_par, &eps_perp, &shadow_loss, &cross_ratio,
    &cross_cosine, &cross_ratio_sq, &cross_ratio_sq_avg, &weight_distance,
    &attn_logit_max, &attn_multi_max_frac, &attn_multi_one_frac, &attn_delta_bias, &attn_delta_bias_cumsum,
    &attn_wq_spec, &attn_wk_spec, &attn_wv_spec, &attn_dwq_err_cos,
    &gap_mean, &gap_max, &above_frac, &weight_gap_mean, &weight_above_frac,
    &shadow_step, &shadow_bias_ratio, &shadow_cosine, &shadow_cross_ratio, &shadow_cross_ratio_sq, &shadow_eps_norm,
    &shadow_gbar_norm, &shadow_gtilde_norm, &shadow_eps_par, &shadow_eps_perp, &shadow_fp32_loss,
    &curvature_step, &hessian_lmax, &hessian_resid, &precond_lmax, &precond_resid, &precond_threshold, &eq10_lhs,
    &probe_loss,
};

}  // namespace metric

// The step dataset (axis) of a row series: step, shadow_step or curvature_step.
const Metric& series_axis(MetricSeries series);
// The declaration named `name` (a family member resolves to its family), or null.
const Metric* find_metric(const std::string& name);
// The dataset of one member of a family: "{tensor}_lastbin" and gamma -> "gamma_lastbin".
std::string member_name(const Metric& family, const std::string& tensor);
std::string member_name(const Metric& family, StatTensor tensor);
// Every tensor a family can be over, whatever the network ({} for a single dataset).
std::vector<std::string> family_tensors(MetricFamily family);
// The datasets of `m` a group of a network of this shape has (with log.curvature_every > 0
// when `curvature`, an MX trajectory when `mx`): its name, or its family's members there.
std::vector<std::string> dataset_names(const Metric& m, const NetShape& shape, bool mx, bool curvature);
// "[n]", "[n, L]", "[n, G]", "[n, 2L]", "[steps_run]": the shape as SCHEMA.md writes it.
const char* shape_text(MetricShape shape);

}  // namespace mxlab
