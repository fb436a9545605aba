#include "lab/runs/cost_estimate.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lab/core/error.h"
#include "lab/model/gemm_list.h"
#include "lab/model/mlp.h"

namespace mxlab {

namespace {

// ---- the stated model: constants measured on an H100 (kernels/PERF.md, "Arms at the GPU's
// throughput: plan", where each is listed with its log) at the paper's configuration ----
constexpr const char* kStatedDevice = "NVIDIA H100 80GB HBM3";
constexpr double kStatedT1 = 3.983;         // trainer step, 1 arm, shadow every 10 (fig4, --arms 8, d43e7af)
constexpr int kStatedT1Every = 10;
constexpr double kStatedExtra = 1.139;      // (11.956 - 3.983) / 7, the same bench
constexpr double kStatedShadow = 2.531;     // shadow pass (results/bench/h100_2026-11-25d_bench_study.log)
constexpr double kStatedLogged = 2.354;     // a logged step over an unlogged one, 1 arm: an H200's (a805519)
constexpr double kStatedCurvature = 219.346;  // lambda_max(H) and lambda_max(P^-1 H), 20 iterations (H100)
constexpr int kStatedCurvatureIters = 20;
constexpr double kStatedStartup = 1000.0;   // a run's start-up: a 10-step run takes 0.9-1.1 s wall (H200)

// The paper's configuration, which the stated constants were measured at.
RunConfig paper_shape() {
  RunConfig c;
  c.model.depth = 4;
  c.model.width = 512;
  c.model.hidden_mult = 4;
  c.model.block = BlockKind::mlp;
  c.model.norm = NormKind::layernorm;
  c.model.layernorm = true;
  c.data.batch = 2048;
  c.data.seq_len = 1;
  return c;
}

CostTerm stated(double ms, const char* from, const char* measured, double scale, int shadow_every = 0, int arms = 0) {
  CostTerm t;
  t.ms = ms * scale;
  t.scale = scale;
  t.shadow_every = shadow_every;
  t.arms = arms;
  t.stated = true;
  t.from = from;
  t.measured = measured;
  return t;
}

}  // namespace

std::string cost_shape_key(const RunConfig& cfg) {
  const NetShape s = NetShape::student(cfg.model, cfg.data.seq_len);
  static const char* const kNorms[] = {"layernorm", "rmsnorm", "mxnorm", "none"};
  const char* norm = s.layernorm ? kNorms[static_cast<int>(s.norm)] : "none";
  std::string k = msg(s.attention() ? "attention" : "mlp", " ", norm, " L", s.depth, " d", s.d, " H", s.hidden);
  if (s.hidden_in != s.hidden) k += msg(" H1=", s.hidden_in);
  k += msg(" tokens", cfg.tokens());
  if (s.attention()) k += msg(" heads", s.heads, " seq", s.seq_len);
  return k;
}

double step_gflop(const RunConfig& cfg) {
  const NetShape s = NetShape::student(cfg.model, cfg.data.seq_len);
  return gemm_gflop(pass_gemms(s, cfg.tokens(), true));
}

CostModel stated_cost_model(const RunConfig& cfg) {
  const RunConfig paper = paper_shape();
  const double scale = cost_shape_key(cfg) == cost_shape_key(paper) ? 1.0 : step_gflop(cfg) / step_gflop(paper);
  CostModel m;
  m.device = kStatedDevice;
  m.source = "stated";
  m.t1 = stated(kStatedT1, "the trainer's step with 1 arm", "H100, fig4_baseline --arms 8, d43e7af", scale, kStatedT1Every);
  m.extra = stated(kStatedExtra, "per extra arm", "H100, fig4_baseline --arms 8, d43e7af", scale, kStatedT1Every);
  m.shadow = stated(kStatedShadow, "shadow pass", "H100, 2026-11-25", scale);
  m.logged = stated(kStatedLogged, "logged step over an unlogged one", "H200, a805519 (no recent H100 figure)", scale, 0, 1);
  m.curvature = stated(kStatedCurvature, "curvature measurement", "H100, 2026-11-25", scale, 0, kStatedCurvatureIters);
  m.startup = stated(kStatedStartup, "start-up", "H200, a 10-step run's wall time", 1.0);
  return m;
}

CostModel cost_model_from_bench(const BenchCache& cache, const RunConfig& cfg, const std::string& config_path) {
  const std::string key = cost_shape_key(cfg), path = bench_config_path(config_path);
  const double gflop = step_gflop(cfg);
  // The record of `quantity` that fits best (see the header), or null.
  auto find = [&](const char* quantity) -> const BenchRecord* {
    // Tiers: this experiment's own record; a record of the same shape whose arms were copies
    // of the base recipe (`bench --arms K`) or that timed no arms; one of the same shape that
    // timed another experiment's own arms (recipe-specific: a rotated or noise arm costs more
    // than twice a plain MX arm); another shape, scaled by GEMM FLOPs.
    const BenchRecord* best[4] = {nullptr, nullptr, nullptr, nullptr};
    for (const BenchRecord& r : cache.records) {
      if (r.quantity != quantity || !std::isfinite(r.value) || r.value <= 0) continue;
      const bool own = !path.empty() && r.config == path;
      const bool generic = r.arms == 0 || bench_arms_were_copies(r);
      const int tier = r.shape != key ? 3 : own ? 0 : generic ? 1 : 2;
      if (tier == 3 && !(r.step_gflop > 0)) continue;  // cannot be scaled
      if (!best[tier] || r.measured_at >= best[tier]->measured_at) best[tier] = &r;
    }
    for (const BenchRecord* r : best)
      if (r) return r;
    return nullptr;
  };
  auto term = [&](const BenchRecord& r, double value, const std::string& from) {
    CostTerm t;
    t.scale = r.shape == key ? 1.0 : gflop / r.step_gflop;
    t.ms = value * t.scale;
    t.shadow_every = r.shadow_every;
    t.arms = r.arms;
    t.from = from;
    t.measured = r.revision + ", " + r.measured_at;
    if (r.shape != key) t.measured += ", at " + r.shape;
    return t;
  };
  CostModel m = stated_cost_model(cfg);
  m.device = cache.device;
  m.source = "bench file " + cache.path;
  const BenchRecord* mx = find("mx_step_ms");
  const BenchRecord* shadow = find("shadow_ms");
  if (shadow) m.shadow = term(*shadow, shadow->value, "shadow_ms");
  if (const BenchRecord* r = find("trainer_1arm_ms")) {
    m.t1 = term(*r, r->value, "trainer_1arm_ms");
  } else if (const BenchRecord* p = find("paired_ms")) {  // the step with the shadow pass every step
    m.t1 = term(*p, p->value, "paired_ms (1 arm, shadow every step)");
    m.t1.shadow_every = 1;
  }
  if (const BenchRecord* r = find("per_extra_arm_ms")) {
    m.extra = term(*r, r->value, "per_extra_arm_ms");
  } else if (mx && shadow && mx->shape == shadow->shape) {  // an arm in series: its step and its shadow pass
    m.extra = term(*mx, mx->value + shadow->value, "mx_step_ms + shadow_ms (in series, shadow every step)");
    m.extra.shadow_every = 1;
  }
  if (const BenchRecord* r = find("logged_step_extra_ms")) m.logged = term(*r, r->value, "logged_step_extra_ms");
  if (const BenchRecord* r = find("curvature_ms")) {
    m.curvature = term(*r, r->value, "curvature_ms");
    const BenchRecord* it = find("curvature_iters");
    m.curvature.arms = it && it->shape == r->shape && it->config == r->config ? static_cast<int>(it->value)
                                                                              : kStatedCurvatureIters;
  }
  return m;
}

double RunCost::total_ms() const {
  return startup_ms + static_cast<double>(steps) * step_ms + static_cast<double>(branch_steps) * extra_ms +
         static_cast<double>(logged_steps) * logged_extra_ms + static_cast<double>(curvature_measurements) * curvature_ms;
}

RunCost run_cost(const RunConfig& cfg, const CostModel& m) {
  RunCost c;
  const int64_t N = std::max(cfg.steps, 0);
  c.steps = N;
  c.arms = static_cast<int>(resolved_arms(cfg).size());
  c.shadow_every = cfg.log.bias_every > 0 ? cfg.log.bias_every : cfg.log.log_every;
  const int64_t le = std::max(cfg.log.log_every, 1);
  // Logged: every step t % log_every == 0, and the last.
  c.logged_steps = N == 0 ? 0 : (N + le - 1) / le + ((N - 1) % le != 0 ? 1 : 0);
  for (const InterventionConfig& iv : cfg.interventions) {
    if (iv.at >= N) continue;
    const int64_t len = N - iv.at;
    c.branch_steps += iv.steps > 0 ? std::min<int64_t>(iv.steps, len) : len;
  }
  const double inv = 1.0 / c.shadow_every;
  c.extra_ms = m.extra.ms + m.shadow.ms * (inv - 1.0 / std::max(m.extra.shadow_every, 1));
  c.step_ms = m.t1.ms + m.shadow.ms * (inv - 1.0 / std::max(m.t1.shadow_every, 1)) + (c.arms - 1) * c.extra_ms;
  c.logged_extra_ms = m.logged.ms * (1.0 + c.arms) / (1.0 + std::max(m.logged.arms, 1));
  const int ce = cfg.log.curvature_every;
  c.curvature_measurements = ce > 0 && N > 0 ? (N - 1) / ce : 0;
  c.curvature_ms = m.curvature.ms * (1.0 + c.arms) * cfg.log.curvature_iters / std::max(m.curvature.arms, 1);
  c.startup_ms = m.startup.ms;
  return c;
}

}  // namespace mxlab
