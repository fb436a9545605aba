// The paired-run training loop (see trainer.h). One step t:
//   0. branches whose `at` is t start from their arm's state; snapshots due at t are written
//   1. data: x = N(0,1) from (seed, data, t); target = teacher(x) + sigma * N(0,1)(label_noise, t)
//   2. every active trajectory: forward, loss, backward (its own policy; stats on log steps);
//      MX trajectories (arms, branches) on shadow steps also get the FP32 gradient at their
//      weights (shadow). The j-th MX trajectory runs on its own lane, its shadow pass on
//      another, so that arms overlap each other and the FP32 trajectory on a GPU.
//   3. metrics from gradients (log steps; the running averages and the shadow_* series on
//      every shadow step)
//   4. optimizer updates, then metrics from the new weights (log steps)
// Steps that log nothing run as one captured unit (CUDA graphs on the GPU backend).
#include "lab/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "lab/core/error.h"
#include "lab/train/attn_instruments.h"
#include "lab/train/batch.h"
#include "lab/config/config_io.h"
#include "lab/config/names.h"

namespace mxlab {

namespace {

constexpr int kLaneMain = 0;    // data, teacher, FP32 trajectory (MX passes: train_lane/shadow_lane)
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double safe_ratio(double num, double den) { return den > 0.0 ? num / den : kNaN; }

// Does this trajectory train at the current step?
bool live(const Trajectory& t) { return t.started && !t.stopped && !t.dormant && !t.finished; }

}  // namespace

Trainer::Trainer(const RunConfig& cfg, Backend& be, MetricSink& sink) : cfg_(cfg), be_(be), sink_(sink) {
  shape_ = NetShape::student(cfg_.model, cfg_.data.seq_len, cfg_.vocab());
  teacher_shape_ = NetShape::teacher(cfg_.model, cfg_.teacher, cfg_.data.seq_len);
  bias_every_ = cfg_.log.bias_every > 0 ? cfg_.log.bias_every : cfg_.log.log_every;
  const int64_t B = cfg_.tokens();
  const int64_t d = cfg_.model.width;

  // Teacher: fixed FP32 network from its own init stream.
  const std::vector<float> tp = teacher_params_host(cfg_, teacher_shape_);
  teacher_params_ = be_.alloc(tp.size());
  be_.upload(teacher_params_, tp.data(), tp.size());
  teacher_ws_ = Workspace::make(be_, teacher_shape_, B);
  target_ = teacher_ws_.out;
  if (cfg_.data.mx_teacher_targets) teacher_ws_mx_ = Workspace::make(be_, teacher_shape_, B);
  x_ = be_.alloc(static_cast<size_t>(B * d));
  lanes_ = std::max(1, be_.lanes());

  const std::vector<float> init =
      init_params(shape_, cfg_.model.init, cfg_.model.init_gain, cfg_.seed, Stream::init);
  const size_t np = static_cast<size_t>(shape_.num_params);
  auto make = [&](TrajectoryKind kind, const std::string& name, const std::string& group, const PrecisionConfig& pol,
                  int start) {
    const bool mx = kind != TrajectoryKind::fp32;
    auto t = std::make_unique<Trajectory>();
    t->name = name;
    t->h5_group = group;
    t->kind = kind;
    t->policy = pol;
    t->is_mx = mx;
    t->start_step = start;
    t->end_step = cfg_.steps;
    t->params = be_.alloc(np);
    t->grads = be_.alloc(np);
    t->m = be_.alloc(np);
    t->v = be_.alloc(np);
    t->prev = be_.alloc(np);
    if (mx && cfg_.data.mx_teacher_targets) t->target = be_.alloc(static_cast<size_t>(B * cfg_.model.width));
    if (mx) {
      t->shadow = be_.alloc(np);
      t->shadow_loss = be_.alloc(1);
      be_.fill(t->shadow_loss, std::numeric_limits<float>::quiet_NaN(), 1);
    }
    t->loss_hist = be_.alloc(static_cast<size_t>(std::max(cfg_.steps, 1)));
    be_.fill(t->loss_hist, std::numeric_limits<float>::quiet_NaN(), static_cast<size_t>(std::max(cfg_.steps, 1)));
    t->ws = Workspace::make(be_, shape_, B);
    be_.upload(t->params, init.data(), np);
    be_.fill(t->m, 0.0f, np);
    be_.fill(t->v, 0.0f, np);
    t->started = start == 0;
    traj_.push_back(std::move(t));
  };
  make(TrajectoryKind::fp32, kFp32Name, std::string("trajectories/") + kFp32Name, PrecisionConfig::fp32(), 0);
  const std::vector<ResolvedArm> arms = resolved_arms(cfg_);
  n_arms_ = arms.size();
  for (const ResolvedArm& a : arms) make(TrajectoryKind::arm, a.name, "trajectories/" + a.name, a.policy, 0);
  for (const auto& iv : cfg_.interventions) {
    // The source is an arm, found among the arms only, or the FP32 trajectory (`from: fp32`,
    // the reserved name, which no arm has); never another branch, whatever the names.
    const bool from_fp32 = iv.from == kFp32Name;
    const auto from = std::find_if(arms.begin(), arms.end(), [&](const ResolvedArm& a) { return a.name == iv.from; });
    MXLAB_ASSERT(from_fp32 || from != arms.end(), "intervention '", iv.name, "' forks from unknown arm '", iv.from, "'");
    make(TrajectoryKind::branch, iv.name, "branches/" + iv.name, branch_policy(cfg_, iv), iv.at);
    traj_.back()->source = from_fp32 ? 0 : 1 + static_cast<int>(from - arms.begin());
    if (iv.steps > 0) traj_.back()->end_step = iv.at + iv.steps;
    MXLAB_ASSERT(traj_[static_cast<size_t>(traj_.back()->source)]->kind ==
                     (from_fp32 ? TrajectoryKind::fp32 : TrajectoryKind::arm),
                 "branch '", iv.name, "' forks from a trajectory that is neither an arm nor the FP32 trajectory");
    traj_.back()->snap_gamma = snaps_gamma(iv);
    if (traj_.back()->snap_gamma && cfg_.model.block != BlockKind::mlp)
      throw Error(msg("intervention '", iv.name, "': snap_gamma covers the norms of MLP blocks only (model.block: mlp)"));
    traj_.back()->reset_v = resets_adam_v(iv);
    if (traj_.back()->reset_v && cfg_.optimizer.name == OptKind::sgd)
      throw Error(msg("intervention '", iv.name, "': reset_adam_v needs Adam (optimizer.name: adam or adamw)"));
  }
  // One shadow workspace per lane a shadow pass can run on (passes on one lane run in order).
  for (int j = 0; j + 1 < static_cast<int>(traj_.size()); ++j)
    if (!shadow_ws_.count(shadow_lane(j))) shadow_ws_.emplace(shadow_lane(j), Workspace::make(be_, shape_, B));

  // The probe batch (curvature, snapshots): fixed, from its own stream, the same for every
  // trajectory and step: x from counter word 0, label noise from word 1.
  const bool snapshots = cfg_.log.snapshot_every > 0 || !cfg_.log.snapshot_steps.empty();
  if (cfg_.log.curvature_every > 0 || snapshots) {
    probe_rows_ = cfg_.log.probe_batch > 0 ? cfg_.log.probe_batch : B;
    probe_x_ = be_.alloc(static_cast<size_t>(probe_rows_ * d));
    probe_y_ = be_.alloc(static_cast<size_t>(probe_rows_ * d));
    make_probe_batch(be_, cfg_, teacher_shape_, teacher_params_, probe_rows_, probe_x_, probe_y_);
  }
  if (cfg_.log.curvature_every > 0) curvature_ = std::make_unique<Curvature>(be_, shape_, cfg_.loss_spec(), cfg_.seed, probe_rows_);
}

int Trainer::train_lane(int j) const { return lanes_ > 1 ? 1 + (2 * j) % (lanes_ - 1) : kLaneMain; }
int Trainer::shadow_lane(int j) const { return lanes_ > 1 ? 1 + (2 * j + 1) % (lanes_ - 1) : kLaneMain; }

Trainer::~Trainer() = default;

Trajectory* Trainer::find_trajectory(const std::string& name) {
  for (auto& t : traj_)
    if (t->name == name) return t.get();
  return nullptr;
}

bool Trainer::checkpoint_due(int64_t step) const {
  if (step <= 0 || step >= cfg_.steps) return false;
  if (cfg_.checkpoint_every > 0 && step % cfg_.checkpoint_every == 0) return true;
  for (const auto& iv : cfg_.interventions)
    if (iv.at == step) return true;
  return false;
}

StepScalars Trainer::scalars(int64_t t) const { return step_scalars(cfg_, t); }

int Trainer::stats_base(int index) const { return index * cfg_.model.depth * kStatTensors; }

PassPolicy Trainer::pass_policy(const Trajectory& tr, bool collect, int index) const {
  PassPolicy p;
  p.p = tr.policy;
  p.seed = cfg_.seed;
  p.collect_stats = collect;
  p.stats_base = stats_base(index);
  return p;
}

void Trainer::restrict_output(const std::vector<std::string>& branches) {
  for (auto& t : traj_) {
    const bool keep = t->kind == TrajectoryKind::branch &&
                      std::find(branches.begin(), branches.end(), t->name) != branches.end();
    t->muted = !keep;
    if (!keep && t->kind != TrajectoryKind::fp32) t->dormant = true;  // the FP32 trajectory feeds the cross metrics
  }
  for (auto& t : traj_)  // an arm a kept branch forks from trains (muted) until the branch starts
    if (!t->muted && t->source > 0) traj_[static_cast<size_t>(t->source)]->dormant = false;
}

void Trainer::start_branches() {
  const size_t np = static_cast<size_t>(shape_.num_params);
  for (size_t i = 1 + n_arms_; i < traj_.size(); ++i) {
    Trajectory& br = *traj_[i];
    // A branch with `steps` ends here: it has trained at .. end_step - 1 (after a resume, the
    // flag is set again at the first step, from the step counter).
    if (br.started && step_ >= br.end_step) br.finished = true;
    if (br.started || br.start_step != step_) continue;
    const Trajectory& base = *traj_[static_cast<size_t>(br.source)];
    flush_shadow();  // the branch starts from the arm's running averages, complete to this step
    if (base.stopped) {  // the arm died before the branch point: nothing to branch from
      br.stopped = true;
      continue;
    }
    // The branch continues from its arm's exact state: its prefix is the arm's.
    be_.copy(br.params, base.params, np);
    be_.copy(br.m, base.m, np);
    be_.copy(br.v, base.v, np);
    be_.copy(br.loss_hist, base.loss_hist, static_cast<size_t>(cfg_.steps));
    br.bias_avg = base.bias_avg;
    br.bias_avg_weight = base.bias_avg_weight;
    br.cross_sq_avg = base.cross_sq_avg;
    br.cross_sq_avg_weight = base.cross_sq_avg_weight;
    br.delta_bias_cumsum = base.delta_bias_cumsum;
    br.dwq_err_prev = base.dwq_err_prev;  // the arm's last logged error is the branch's previous one too
    if (br.snap_gamma) {
      // Stored gamma/beta := the values the arm's forward pass used (under the arm's policy, the
      // step's stochastic stream); the branch's gradient buffer is free scratch here.
      be_.set_step(scalars(step_));
      snap_norm_affine(be_, shape_, br.params, pass_policy(base, false, 0), br.grads);
    }
    if (br.reset_v) {
      // v := bc2 * g^2 with g the gradient the branch's first step computes (same policy,
      // weights and batch: the step recomputes it identically), so that v-hat = g^2 there.
      const StepScalars sc = scalars(step_);
      be_.set_step(sc);
      be_.set_lane(kLaneMain);
      make_batch(be_, cfg_, teacher_shape_, teacher_params_, x_, teacher_ws_);
      make_targets(i);
      gradient_pass(br.params, targets_of(br), br.ws, pass_policy(br, false, 0), br.grads, nullptr);
      std::vector<float> g = download(br.grads, np);
      for (float& x : g) x = sc.bc2 * (x * x);
      upload(br.v, g);
    }
    br.started = true;
  }
  // A muted arm is only needed until the last unmuted branch forking from it has started.
  for (size_t a = 1; a <= n_arms_; ++a) {
    Trajectory& arm = *traj_[a];
    if (!arm.muted || arm.dormant) continue;
    bool needed = false;
    for (size_t i = 1 + n_arms_; i < traj_.size(); ++i)
      if (traj_[i]->source == static_cast<int>(a) && !traj_[i]->muted && !traj_[i]->started) needed = true;
    if (!needed) arm.dormant = true;
  }
}

void Trainer::snapshot(const Trajectory& tr) {
  const size_t np = static_cast<size_t>(shape_.num_params);
  const std::string base = msg("snapshots/", tr.name, "/step_", step_, "/");
  auto write = [&](const float* buf, const std::string& prefix) {
    const std::vector<float> host = download(buf, np);
    for (const ParamGroup& g : shape_.groups) {
      const std::vector<float> part(host.begin() + g.offset, host.begin() + g.offset + g.size());
      // Vectors (gamma, beta, b2) as [d], matrices as [rows, cols] (lab/model's layout).
      if (g.rows == 1) sink_.write_array(base + prefix + g.name, g.cols, 0, part);
      else sink_.write_array(base + prefix + g.name, g.rows, g.cols, part);
    }
  };
  write(tr.params, "");
  if (cfg_.log.snapshot_optimizer) {
    write(tr.m, "m/");
    if (cfg_.optimizer.name != OptKind::sgd) write(tr.v, "v/");
  }
}

// At the start of step_: the snapshots due now (log.snapshot_steps / snapshot_every) of every
// started trajectory, and always the arm a branch forks from at the branch's step.
void Trainer::write_snapshots() {
  const LogConfig& lg = cfg_.log;
  const bool due = (lg.snapshot_every > 0 && step_ % lg.snapshot_every == 0) ||
                   std::find(lg.snapshot_steps.begin(), lg.snapshot_steps.end(), step_) != lg.snapshot_steps.end();
  for (size_t i = 0; i < traj_.size(); ++i) {
    const Trajectory& tr = *traj_[i];
    if (!tr.started || (tr.stopped && !due) || step_ > tr.end_step) continue;
    bool source_now = false;
    for (size_t b = 1 + n_arms_; b < traj_.size(); ++b)
      if (traj_[b]->source == static_cast<int>(i) && traj_[b]->start_step == step_ && !traj_[b]->muted)
        source_now = true;
    if ((due && !tr.muted && !tr.dormant) || source_now) snapshot(tr);
  }
}

void Trainer::gradient_pass(const float* params, const float* targets, Workspace& ws, const PassPolicy& pol,
                            float* grads, float* loss_hist) {
  forward(be_, shape_, params, x_, ws, pol);
  loss_and_grad(be_, cfg_.loss_spec(), targets, ws, pol, loss_hist);
  backward(be_, shape_, params, x_, ws, grads, pol);
}

void Trainer::make_targets(size_t i) {
  Trajectory& tr = *traj_[i];
  if (!tr.target) return;
  make_mx_targets(be_, cfg_, teacher_shape_, teacher_params_, x_, teacher_ws_mx_, pass_policy(tr, false, 0), tr.target);
}

void Trainer::step_batch() {
  be_.set_lane(kLaneMain);
  make_batch(be_, cfg_, teacher_shape_, teacher_params_, x_, teacher_ws_);  // target_ = teacher_ws_.out
  for (size_t i = 0; i < traj_.size(); ++i)
    if (live(*traj_[i])) make_targets(i);
}

void Trainer::train_pass(size_t i, bool log) {
  Trajectory& tr = *traj_[i];
  gradient_pass(tr.params, targets_of(tr), tr.ws, pass_policy(tr, log, static_cast<int>(i)), tr.grads, tr.loss_hist);
}

// The shadow pass: FP32 gradient at the MX weights on the same batch (and the same targets:
// the trajectory's own with data.mx_teacher_targets).
void Trainer::shadow_pass(size_t i, Workspace& sw) {
  Trajectory& tr = *traj_[i];
  PassPolicy fp32_pol;
  fp32_pol.p = PrecisionConfig::fp32();
  fp32_pol.seed = cfg_.seed;
  gradient_pass(tr.params, targets_of(tr), sw, fp32_pol, tr.shadow, nullptr);
  be_.copy(tr.shadow_loss, sw.loss, 1);
}

void Trainer::update(Trajectory& tr, bool log) {
  const size_t np = static_cast<size_t>(shape_.num_params);
  if (log) be_.copy(tr.prev, tr.params, np);
  optimizer_step(be_, cfg_, tr.params, tr.grads, tr.m, tr.v, np);
}

void Trainer::compute_phase(bool log, bool shadow) {
  step_batch();
  // MX trajectories (and their shadow passes) fork off lane 0 right after the data, so they
  // overlap with the FP32 trajectory, which is issued last on lane 0.
  int j = 0;  // the j-th live MX trajectory: its own pair of lanes
  for (size_t i = 0; i < traj_.size(); ++i) {
    Trajectory& tr = *traj_[i];
    if (!live(tr) || !tr.is_mx) continue;
    be_.set_lane(train_lane(j));
    train_pass(i, log);
    if (shadow) {
      const int lane = shadow_lane(j);
      be_.set_lane(lane);
      shadow_pass(i, shadow_ws_.at(lane));
    }
    ++j;
  }
  be_.set_lane(kLaneMain);
  for (size_t i = 0; i < traj_.size(); ++i)
    if (live(*traj_[i]) && !traj_[i]->is_mx) train_pass(i, log);
  be_.set_lane(kLaneMain);
  be_.join();
}

void Trainer::update_phase(bool log) {
  for (auto& t : traj_)
    if (live(*t)) update(*t, log);
}

void Trainer::step_trajectory(size_t i) {
  MXLAB_ASSERT(i < traj_.size(), "step_trajectory(", i, "): the trainer has ", traj_.size(), " trajectories");
  be_.set_lane(kLaneMain);
  train_pass(i, false);
  update(*traj_[i], false);
}

void Trainer::step_shadow(size_t i) {
  MXLAB_ASSERT(i < traj_.size() && traj_[i]->is_mx, "step_shadow(", i, "): not an MX trajectory");
  int j = 0;  // its place among the live MX trajectories: the workspace of the lane its step uses
  for (size_t k = 0; k < i; ++k)
    if (live(*traj_[k]) && traj_[k]->is_mx) ++j;
  be_.set_lane(kLaneMain);
  shadow_pass(i, shadow_ws_.at(shadow_lane(j)));
}

// On shadow steps that are not logged: the running averages and the shadow_* series.
void Trainer::shadow_only_metrics() {
  std::vector<Reduction> req;
  std::vector<Trajectory*> who;
  const int64_t np = shape_.num_params;
  const Trajectory& ref = *traj_[0];
  for (auto& t : traj_) {
    if (!t->is_mx || !live(*t)) continue;
    req.push_back({Reduction::dot, t->grads, t->shadow, np});
    req.push_back({Reduction::dot, t->shadow, t->shadow, np});
    req.push_back({Reduction::diff_sq, t->grads, t->shadow, np});
    req.push_back({Reduction::dot, t->grads, t->grads, np});
    req.push_back({Reduction::dot, t->grads, ref.grads, np});
    req.push_back({Reduction::diff_sq, t->grads, ref.grads, np});
    req.push_back({Reduction::dot, ref.grads, ref.grads, np});
    who.push_back(t.get());
  }
  if (req.empty()) return;
  // Queued, not read: reading back here would stall the pipeline once per step (kernels/PERF.md).
  be_.reduce_deferred(req.data(), req.size());
  for (Trajectory* t : who) be_.defer_scalar(t->shadow_loss);
  pending_shadow_.push_back({step_, std::move(who), live(ref)});
  if (static_cast<int64_t>(pending_shadow_.size()) >= shadow_flush_every_) flush_shadow();
}

void Trainer::flush_shadow() {
  if (pending_shadow_.empty()) return;
  const std::vector<double> v = be_.take_deferred();
  size_t at = 0;
  for (const PendingShadow& p : pending_shadow_) {
    const size_t k = p.who.size();
    MXLAB_ASSERT(at + 8 * k <= v.size(), "deferred shadow results shorter than the queued steps");
    const double* sums = v.data() + at;  // 7 sums per trajectory, then one FP32 loss each
    for (size_t j = 0; j < k; ++j) {
      const double* s7 = sums + 7 * j;
      const double nan3[3] = {kNaN, kNaN, kNaN};
      append_shadow_row(*p.who[j], shadow_scalars(*p.who[j], s7, p.ref_live ? s7 + 4 : nan3, sums[7 * k + j]), p.step);
    }
    at += 8 * k;
  }
  MXLAB_ASSERT(at == v.size(), "deferred shadow results longer than the queued steps");
  pending_shadow_.clear();
}

Trainer::ShadowScalars Trainer::shadow_scalars(Trajectory& tr, const double* sums, const double* cross,
                                               double fp32_loss) {
  const double gs = sums[0], ss = sums[1], dd = sums[2], gg = sums[3];
  ShadowScalars o;
  o.bias_ratio = std::sqrt(safe_ratio(dd, ss));
  o.cosine = safe_ratio(gs, std::sqrt(gg) * std::sqrt(ss));
  o.eps_norm = std::sqrt(dd);
  o.gbar_norm = std::sqrt(ss);
  o.gtilde_norm = std::sqrt(gg);
  // eps = g - s split along s and across it: <eps, s>/|s| = (g.s - s.s)/|s|.
  o.eps_par = safe_ratio(gs - ss, std::sqrt(ss));
  o.eps_perp = std::isfinite(o.eps_par) ? std::sqrt(std::max(0.0, dd - o.eps_par * o.eps_par)) : kNaN;
  o.cross_ratio_sq = safe_ratio(cross[1], cross[2]);
  o.cross_ratio = std::sqrt(o.cross_ratio_sq);
  o.fp32_loss = fp32_loss;
  const double beta = cfg_.log.bias_avg_beta;
  if (std::isfinite(o.bias_ratio)) {
    tr.bias_avg = beta * tr.bias_avg + (1.0 - beta) * o.bias_ratio;
    tr.bias_avg_weight = beta * tr.bias_avg_weight + (1.0 - beta);
  }
  if (std::isfinite(o.cross_ratio_sq)) {
    tr.cross_sq_avg = beta * tr.cross_sq_avg + (1.0 - beta) * o.cross_ratio_sq;
    tr.cross_sq_avg_weight = beta * tr.cross_sq_avg_weight + (1.0 - beta);
  }
  return o;
}

void Trainer::append_shadow_row(Trajectory& tr, const ShadowScalars& s, int64_t step) {
  if (tr.muted) return;
  MetricRow row;
  row.step = step;
  row.axis = series_axis(MetricSeries::shadow).name;
  row.add(metric::shadow_bias_ratio, s.bias_ratio);
  row.add(metric::shadow_cosine, s.cosine);
  row.add(metric::shadow_cross_ratio, s.cross_ratio);
  row.add(metric::shadow_cross_ratio_sq, s.cross_ratio_sq);
  row.add(metric::shadow_eps_norm, s.eps_norm);
  row.add(metric::shadow_gbar_norm, s.gbar_norm);
  row.add(metric::shadow_gtilde_norm, s.gtilde_norm);
  row.add(metric::shadow_eps_par, s.eps_par);
  row.add(metric::shadow_eps_perp, s.eps_perp);
  row.add(metric::shadow_fp32_loss, s.fp32_loss);
  sink_.append(tr.h5_group, row);
}

// ---- a logged step's rows ----

// The gradient sums of a logged step, reduced in one batch. Per live trajectory: g.g (g: its
// gradient). Per MX trajectory on a shadow step, for each parameter group: g.s, s.s, (g-s)^2,
// g.g (s: the shadow FP32 gradient at its weights). Per MX trajectory while the FP32
// trajectory is live, the cross sums g.f, (g-f)^2, f.f (f: the FP32 trajectory's gradient).
struct Trainer::GradientSums {
  struct Where {  // offsets into `sums` of one trajectory's
    size_t grad_sq = 0, groups = 0, cross = 0;
    bool has_groups = false, has_cross = false;
  };
  std::vector<Where> where;  // per trajectory
  std::vector<double> sums;
  double grad_sq(size_t i) const { return sums[where[i].grad_sq]; }
  // 4 sums per parameter group, or null (not a shadow step / not an MX trajectory).
  const double* group_sums(size_t i) const { return where[i].has_groups ? &sums[where[i].groups] : nullptr; }
  const double* cross_sums(size_t i) const { return where[i].has_cross ? &sums[where[i].cross] : nullptr; }
};

// After the update, per live trajectory: (w - w_prev)^2, w.w, (w - w_fp32)^2.
struct Trainer::WeightSums {
  std::vector<size_t> at;  // per trajectory: offset of its 3 sums
  std::vector<double> sums;
  const double* of(size_t i) const { return &sums[at[i]]; }
};

void Trainer::log_metrics(bool shadow_step) {
  flush_shadow();  // this step's rows follow the queued ones, and its averages include them
  // Gradient metrics (before the update).
  const GradientSums grads = reduce_gradients(shadow_step);
  phase("gradient reductions");
  const std::vector<QuantStats> quant_stats = be_.read_stats();
  phase("statistics counters");
  std::vector<MetricRow> rows(traj_.size());
  std::vector<double> losses(traj_.size(), kNaN);
  for (size_t i = 0; i < traj_.size(); ++i) {
    Trajectory& tr = *traj_[i];
    if (!live(tr)) continue;
    MetricRow& row = rows[i];
    row.step = step_;
    losses[i] = add_loss_metrics(tr, grads, i, row);
    if (tr.is_mx) add_gradient_bias_metrics(tr, grads, i, row);
    phase("gradient metrics (host)");
    clamp_debt(tr, static_cast<int>(i), row);  // the stored weights the step's forward used
    phase("clamp debt (quantization gaps)");
    add_quant_stat_metrics(tr, static_cast<int>(i), quant_stats, row);
    phase("last-bin statistics (host)");
    if (shape_.attention()) {
      add_attention_metrics(tr, row);
      phase("attention logits");
      add_attention_weight_metrics(tr, grads.group_sums(i) != nullptr, row);
      phase("attention weights (host)");
    }
  }

  // The update, then the weight metrics.
  update_phase(true);
  phase("update");
  const WeightSums weights = reduce_weights();
  phase("weight reductions");
  const bool has_gamma = shape_.find(0, ParamGroup::gamma) != nullptr;
  const Trajectory& fp32 = *traj_[0];
  for (size_t i = 0; i < traj_.size(); ++i) {
    Trajectory& tr = *traj_[i];
    if (!live(tr)) continue;
    // live(fp32) per row: the FP32 row, written first, may have stopped it (non-finite loss),
    // and the MX rows after it then have no weight_distance.
    add_weight_metrics(tr, weights.of(i), live(fp32) ? weights.of(0) : nullptr, rows[i]);
    if (has_gamma) {
      add_gamma_metrics(tr, rows[i]);
      phase("gamma moments");
    }
    write_logged_row(tr, rows[i], losses[i]);
    phase("sink write");
  }
  if (cfg_.log.flush_every > 0 && traj_[0]->rows_logged % cfg_.log.flush_every == 0) sink_.flush();
  phase("sink flush");
}

Trainer::GradientSums Trainer::reduce_gradients(bool shadow_step) {
  const int64_t np = shape_.num_params;
  const Trajectory& fp32 = *traj_[0];
  GradientSums out;
  out.where.resize(traj_.size());
  std::vector<Reduction> req;
  for (size_t i = 0; i < traj_.size(); ++i) {
    const Trajectory& tr = *traj_[i];
    if (!live(tr)) continue;
    GradientSums::Where& at = out.where[i];
    at.grad_sq = req.size();
    req.push_back({Reduction::dot, tr.grads, tr.grads, np});
    if (tr.is_mx && shadow_step) {
      at.has_groups = true;
      at.groups = req.size();
      for (const ParamGroup& g : shape_.groups) {
        const float* grad = tr.grads + g.offset;
        const float* shadow = tr.shadow + g.offset;
        req.push_back({Reduction::dot, grad, shadow, g.size()});
        req.push_back({Reduction::dot, shadow, shadow, g.size()});
        req.push_back({Reduction::diff_sq, grad, shadow, g.size()});
        req.push_back({Reduction::dot, grad, grad, g.size()});
      }
    }
    if (tr.is_mx && live(fp32)) {
      at.has_cross = true;
      at.cross = req.size();
      req.push_back({Reduction::dot, tr.grads, fp32.grads, np});
      req.push_back({Reduction::diff_sq, tr.grads, fp32.grads, np});
      req.push_back({Reduction::dot, fp32.grads, fp32.grads, np});
    }
  }
  out.sums.resize(req.size());
  be_.reduce(req.data(), req.size(), out.sums.data());
  return out;
}

// loss, lr, grad_norm.
double Trainer::add_loss_metrics(Trajectory& tr, const GradientSums& sums, size_t index, MetricRow& row) {
  const double loss = be_.read_scalar(tr.ws.loss);
  tr.last_loss = loss;
  phase("losses");
  row.add(metric::loss, loss);
  row.add(metric::lr, static_cast<double>(scalars(step_).lr));
  row.add(metric::grad_norm, std::sqrt(sums.grad_sq(index)));
  return loss;
}

// The gradient bias of an MX trajectory against the shadow FP32 gradient at its weights (NaN
// without a shadow pass at this step; a shadow step also appends its shadow_step row and
// updates the running averages) and against the FP32 trajectory's gradient (cross_*).
void Trainer::add_gradient_bias_metrics(Trajectory& tr, const GradientSums& sums, size_t index, MetricRow& row) {
  const size_t num_groups = shape_.groups.size();
  ShadowScalars shadow{kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
  std::vector<double> bias_ratio_g(num_groups, kNaN), cosine_g(num_groups, kNaN), eps_norm_g(num_groups, kNaN),
      gbar_norm_g(num_groups, kNaN), gtilde_norm_g(num_groups, kNaN);
  const double no_cross[3] = {kNaN, kNaN, kNaN};
  const double* cross = sums.cross_sums(index) ? sums.cross_sums(index) : no_cross;  // g.f, (g-f)^2, f.f
  if (const double* per_group = sums.group_sums(index)) {
    double total[4] = {0, 0, 0, 0};  // g.s, s.s, (g-s)^2, g.g over every group
    for (size_t k = 0; k < num_groups; ++k) {
      const double* v = per_group + 4 * k;
      const double gs = v[0], ss = v[1], diff_sq = v[2], gg = v[3];
      bias_ratio_g[k] = std::sqrt(safe_ratio(diff_sq, ss));
      cosine_g[k] = safe_ratio(gs, std::sqrt(gg) * std::sqrt(ss));
      eps_norm_g[k] = std::sqrt(diff_sq);
      gbar_norm_g[k] = std::sqrt(ss);
      gtilde_norm_g[k] = std::sqrt(gg);
      for (int q = 0; q < 4; ++q) total[q] += v[q];
    }
    shadow = shadow_scalars(tr, total, cross, be_.read_scalar(tr.shadow_loss));
    append_shadow_row(tr, shadow, step_);
    phase("shadow row (with its sink write)");
  }
  const double bias_ratio = shadow.bias_ratio;
  if (std::isfinite(bias_ratio) && !(bias_ratio <= tr.max_bias_ratio)) tr.max_bias_ratio = bias_ratio;
  row.add(metric::bias_ratio, bias_ratio);
  row.add(metric::cosine, shadow.cosine);
  row.add(metric::bias_ratio_avg, tr.bias_avg_weight > 0 ? tr.bias_avg / tr.bias_avg_weight : kNaN);
  row.add(metric::bias_ratio_group, std::move(bias_ratio_g));
  row.add(metric::cosine_group, std::move(cosine_g));
  // The cross-trajectory metrics (the paper code's) on every logged row.
  const double cross_ratio_sq = safe_ratio(cross[1], cross[2]);
  row.add(metric::cross_ratio, std::sqrt(cross_ratio_sq));
  row.add(metric::cross_cosine, safe_ratio(cross[0], std::sqrt(sums.grad_sq(index)) * std::sqrt(cross[2])));
  row.add(metric::cross_ratio_sq, cross_ratio_sq);
  row.add(metric::cross_ratio_sq_avg, tr.cross_sq_avg_weight > 0 ? tr.cross_sq_avg / tr.cross_sq_avg_weight : kNaN);
  row.add(metric::eps_norm, shadow.eps_norm);
  row.add(metric::gbar_norm, shadow.gbar_norm);
  row.add(metric::gtilde_norm, shadow.gtilde_norm);
  row.add(metric::eps_par, shadow.eps_par);
  row.add(metric::eps_perp, shadow.eps_perp);
  row.add(metric::shadow_loss, shadow.fp32_loss);
  row.add(metric::eps_norm_group, std::move(eps_norm_g));
  row.add(metric::gbar_norm_group, std::move(gbar_norm_g));
  row.add(metric::gtilde_norm_group, std::move(gtilde_norm_g));
}

// Last-bin and clamped fractions of every statistics tensor of trajectory `index`'s pass, per
// layer (NaN where the pass counted nothing).
void Trainer::add_quant_stat_metrics(Trajectory& tr, int index, const std::vector<QuantStats>& stats,
                                     MetricRow& row) {
  const int layers = cfg_.model.depth;
  for (const StatTensor t : stat_tensors(shape_)) {
    std::vector<double> lastbin(layers, kNaN), clamped(layers, kNaN);
    for (int l = 0; l < layers; ++l) {
      const size_t slot = static_cast<size_t>(stats_base(index) + stats_slot(l, t));
      if (slot < stats.size() && stats[slot].n > 0) {
        lastbin[l] = stats[slot].lastbin_frac();
        clamped[l] = stats[slot].clamped_frac();
      }
    }
    if (t == StatTensor::gamma)
      for (double f : lastbin)
        if (std::isfinite(f) && !(f <= tr.max_gamma_lastbin)) tr.max_gamma_lastbin = f;
    row.add(member_name(metric::lastbin, t), std::move(lastbin));
    row.add(member_name(metric::clamped, t), std::move(clamped));
  }
}

// The attention logits' maxima and, for layers whose last forward ran the flash kernel, its
// instruments (NaN elsewhere); the running sum of the delta bias goes on across logged rows.
void Trainer::add_attention_metrics(Trajectory& tr, MetricRow& row) {
  const int layers = cfg_.model.depth;
  std::vector<double> logit_max(layers), multi_max(layers, kNaN), multi_one(layers, kNaN), bias(layers, kNaN),
      cumsum(layers, kNaN);
  tr.delta_bias_cumsum.resize(static_cast<size_t>(layers), 0.0);
  for (int l = 0; l < layers; ++l) {
    logit_max[l] = attention_logit_max(be_, shape_, tr.ws, l);
    if (!tr.ws.attn_flash[static_cast<size_t>(l)]) continue;
    const FlashInstruments f = flash_instruments(be_, shape_, tr.ws, l);
    multi_max[l] = f.multi_max_frac;
    multi_one[l] = f.multi_one_frac;
    bias[l] = f.delta_bias;
    cumsum[l] = tr.delta_bias_cumsum[static_cast<size_t>(l)] += f.delta_bias;
  }
  row.add(metric::attn_logit_max, std::move(logit_max));
  row.add(metric::attn_multi_max_frac, std::move(multi_max));
  row.add(metric::attn_multi_one_frac, std::move(multi_one));
  row.add(metric::attn_delta_bias, std::move(bias));
  row.add(metric::attn_delta_bias_cumsum, std::move(cumsum));
}

// The spectral norms of every layer's W_Q, W_K, W_V as the step's forward used them (before the
// update), and, on a shadow step of an MX trajectory, the cosine of the W_Q block of g~ - g-bar
// with that of the trajectory's previous logged shadow step (NaN without one; the FP32
// trajectory: NaN throughout). On the host, from downloaded buffers (lab/train/attn_instruments.h).
void Trainer::add_attention_weight_metrics(Trajectory& tr, bool shadow_step, MetricRow& row) {
  const int layers = cfg_.model.depth;
  const int64_t d = shape_.d;
  const size_t block = static_cast<size_t>(d * d);  // Wqkv [3d x d]: rows Q | K | V, d x d each
  std::vector<std::vector<float>> wqkv(static_cast<size_t>(layers));
  std::vector<const float*> mats(3 * static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    const ParamGroup* g = shape_.find(l, ParamGroup::wqkv);
    wqkv[l] = download(tr.params + g->offset, 3 * block);
    for (size_t k = 0; k < 3; ++k) mats[3 * static_cast<size_t>(l) + k] = wqkv[l].data() + k * block;
  }
  std::vector<double> norms(mats.size());
  spectral_norms(mats.data(), mats.size(), d, d, norms.data());
  std::vector<double> wq(layers), wk(layers), wv(layers), cosine(layers, kNaN);
  for (int l = 0; l < layers; ++l) {
    wq[l] = norms[3 * static_cast<size_t>(l)];
    wk[l] = norms[3 * static_cast<size_t>(l) + 1];
    wv[l] = norms[3 * static_cast<size_t>(l) + 2];
  }
  if (tr.is_mx && shadow_step) {
    std::vector<float> err(static_cast<size_t>(layers) * block);
    for (int l = 0; l < layers; ++l) {
      const int64_t off = shape_.find(l, ParamGroup::wqkv)->offset;  // W_Q: the first d rows
      const std::vector<float> g = download(tr.grads + off, block), s = download(tr.shadow + off, block);
      float* e = err.data() + static_cast<size_t>(l) * block;
      for (size_t j = 0; j < block; ++j) e[j] = g[j] - s[j];
      if (tr.dwq_err_prev.size() == err.size())
        cosine[l] = direction_cosine(e, tr.dwq_err_prev.data() + static_cast<size_t>(l) * block, block);
    }
    tr.dwq_err_prev = std::move(err);
  }
  row.add(metric::attn_wq_spec, std::move(wq));
  row.add(metric::attn_wk_spec, std::move(wk));
  row.add(metric::attn_wv_spec, std::move(wv));
  row.add(metric::attn_dwq_err_cos, std::move(cosine));
}

Trainer::WeightSums Trainer::reduce_weights() {
  const int64_t np = shape_.num_params;
  const Trajectory& fp32 = *traj_[0];
  WeightSums out;
  out.at.assign(traj_.size(), 0);
  std::vector<Reduction> req;
  for (size_t i = 0; i < traj_.size(); ++i) {
    const Trajectory& tr = *traj_[i];
    if (!live(tr)) continue;
    out.at[i] = req.size();
    req.push_back({Reduction::diff_sq, tr.params, tr.prev, np});
    req.push_back({Reduction::dot, tr.params, tr.params, np});
    req.push_back({Reduction::diff_sq, tr.params, fp32.params, np});
  }
  out.sums.assign(req.size(), 0.0);
  be_.reduce(req.data(), req.size(), out.sums.data());
  return out;
}

// update_norm, weight_norm and (MX trajectories) weight_distance, from the trajectory's weight
// sums and the FP32 trajectory's (null when it is not live).
void Trainer::add_weight_metrics(const Trajectory& tr, const double* sums, const double* fp32_sums, MetricRow& row) {
  row.add(metric::update_norm, std::sqrt(sums[0]));
  row.add(metric::weight_norm, std::sqrt(sums[1]));
  if (tr.is_mx) row.add(metric::weight_distance, fp32_sums ? std::sqrt(safe_ratio(sums[2], fp32_sums[1])) : kNaN);
}

// Mean, standard deviation, minimum and maximum of the FP32 master gamma of each layer.
void Trainer::add_gamma_metrics(const Trajectory& tr, MetricRow& row) {
  const int layers = cfg_.model.depth;
  std::vector<double> mean(layers), sd(layers), min(layers), max(layers), moments(4 * static_cast<size_t>(layers));
  std::vector<const float*> gamma(layers);
  std::vector<size_t> count(layers);
  for (int l = 0; l < layers; ++l) {
    const ParamGroup* g = shape_.find(l, ParamGroup::gamma);
    gamma[l] = tr.params + g->offset;
    count[l] = static_cast<size_t>(g->size());
  }
  be_.moments_batch(gamma.data(), count.data(), gamma.size(), moments.data());  // per layer: min, max, mean, sd
  for (int l = 0; l < layers; ++l) {
    min[l] = moments[4 * l];
    max[l] = moments[4 * l + 1];
    mean[l] = moments[4 * l + 2];
    sd[l] = moments[4 * l + 3];
  }
  row.add(metric::gamma_mean, std::move(mean));
  row.add(metric::gamma_std, std::move(sd));
  row.add(metric::gamma_min, std::move(min));
  row.add(metric::gamma_max, std::move(max));
}

// The row goes to the sink (its step first); a non-finite loss stops the trajectory under
// log.on_nonfinite: stop.
void Trainer::write_logged_row(Trajectory& tr, MetricRow& row, double loss) {
  row.cols.insert(row.cols.begin(), {metric::step.name, {static_cast<double>(step_)}});
  if (!tr.muted) sink_.append(tr.h5_group, row);
  tr.rows_logged += 1;
  if (!std::isfinite(loss) && cfg_.log.on_nonfinite == OnNonfinite::stop) tr.stopped = true;
}

// The curvature instrument at the start of step_ (every log.curvature_every-th step from the
// first such step on: Adam's v then holds step_ updates): for every live trajectory, on the
// probe batch, the largest eigenvalue of the FP32 loss's Hessian and of P^-1 H (Adam: P =
// diag(sqrt(v_hat) + eps); SGD: P = I), the edge-of-stability threshold of Cohen et al. 2022 for
// the optimizer at this step's lr, and the left-hand side of the paper's Eq. 10.
void Trainer::measure_curvature() {
  flush_shadow();  // Eq. 10 reads the running bias ratio, complete to this step
  const StepScalars sc = scalars(step_);
  be_.set_step(sc);
  const auto& o = cfg_.optimizer;
  const bool adam = o.name != OptKind::sgd;
  const double lr = sc.lr;
  // Adam (Cohen et al. 2022, eq. 2): (2 + 2 beta1) / ((1 - beta1) lr); heavy-ball SGD: (2 + 2 m) / lr.
  const double threshold = adam ? (2.0 + 2.0 * o.beta1) / ((1.0 - o.beta1) * lr) : (2.0 + 2.0 * o.momentum) / lr;
  // v after step_ updates: its bias correction is 1 - beta2^step_ (scalars(t) holds that of t + 1).
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(step_)));
  for (auto& t : traj_) {
    Trajectory& tr = *t;
    if (!live(tr) || tr.muted) continue;
    const CurvatureResult c = curvature_->measure(tr.params, probe_x_, probe_y_, adam ? tr.v : nullptr, bc2,
                                                  o.eps, cfg_.log.curvature_iters, cfg_.seed);
    // Eq. 10: |1 - s| + s r with s = lr lambda_max(P^-1 H), r = the running bias ratio (the FP32
    // trajectory's gradient is exact: r = 0).
    const double s_ = lr * c.precond_lmax;
    const double r = tr.is_mx ? (tr.bias_avg_weight > 0 ? tr.bias_avg / tr.bias_avg_weight : kNaN) : 0.0;
    MetricRow row;
    row.step = step_;
    row.axis = series_axis(MetricSeries::curvature).name;
    row.add(metric::hessian_lmax, c.hessian_lmax);
    row.add(metric::hessian_resid, c.hessian_resid);
    row.add(metric::precond_lmax, c.precond_lmax);
    row.add(metric::precond_resid, c.precond_resid);
    row.add(metric::precond_threshold, threshold);
    row.add(metric::eq10_lhs, std::fabs(1.0 - s_) + s_ * r);
    row.add(metric::probe_loss, c.loss);
    sink_.append(tr.h5_group, row);
  }
}

void Trainer::clamp_debt(const Trajectory& tr, int index, MetricRow& row) {
  const int L = cfg_.model.depth;
  const PassPolicy pol = pass_policy(tr, false, index);
  // Every gap of the row in one batch (one synchronisation on the GPU): the norm gains by kind
  // and layer, then the weights in group order.
  std::vector<Backend::QuantGapRequest> reqs;
  auto request = [&](const ParamGroup& g) {
    const ParamQuant pq = forward_param_quant(g, pol);
    reqs.emplace_back(tr.params + g.offset, pq.rows, pq.cols, pq.axis, pq.q, pq.round_bf16_first, pq.bf16_mode);
  };
  const ParamGroup::Kind norm_kinds[] = {ParamGroup::gamma, ParamGroup::beta};
  for (const ParamGroup::Kind kind : norm_kinds)
    if (shape_.find(0, kind))
      for (int l = 0; l < L; ++l) request(*shape_.find(l, kind));
  for (const ParamGroup& g : shape_.groups)
    if (g.kind == ParamGroup::w1 || g.kind == ParamGroup::w2) request(g);
  std::vector<Backend::QuantGap> gaps(reqs.size());
  be_.quant_gaps(reqs.data(), reqs.size(), gaps.data());
  size_t k = 0;
  for (const ParamGroup::Kind kind : norm_kinds) {
    if (!shape_.find(0, kind)) continue;
    std::vector<double> mean(L, kNaN), mx(L, kNaN), above(L, kNaN);
    for (int l = 0; l < L; ++l, ++k) {
      mean[l] = gaps[k].mean_rel();
      mx[l] = gaps[k].max_rel;
      above[l] = gaps[k].above_frac();
    }
    const StatTensor t = kind == ParamGroup::gamma ? StatTensor::gamma : StatTensor::beta;
    row.add(member_name(metric::gap_mean, t), mean);
    row.add(member_name(metric::gap_max, t), mx);
    row.add(member_name(metric::above_frac, t), above);
  }
  std::vector<double> wmean, wabove;
  for (; k < gaps.size(); ++k) {
    wmean.push_back(gaps[k].mean_rel());
    wabove.push_back(gaps[k].above_frac());
  }
  row.add(metric::weight_gap_mean, wmean);
  row.add(metric::weight_above_frac, wabove);
}

void Trainer::step_once(bool log) {
  start_branches();
  write_snapshots();
  if (curvature_ && step_ > 0 && step_ % cfg_.log.curvature_every == 0) measure_curvature();
  be_.set_step(scalars(step_));
  // The last step is always logged with its shadow gradient, so every run ends with a bias row.
  const bool shadow = (step_ % bias_every_) == 0 || (log && step_ == cfg_.steps - 1);
  if (log) {
    phase(nullptr);
    be_.reset_stats(static_cast<int>(traj_.size()) * cfg_.model.depth * kStatTensors);
    compute_phase(true, shadow);
    phase("eager compute with statistics");
    log_metrics(shadow);
    return;
  }
  // An unlogged step is one capturable unit: its key is the set of live trajectories (all of
  // them) + shadow.
  std::vector<bool> alive(traj_.size());
  for (size_t i = 0; i < traj_.size(); ++i) alive[i] = live(*traj_[i]);
  const int key = capture_keys_.key(shadow, alive);
  if (!step_capture_) {
    compute_phase(false, shadow);
    update_phase(false);
  } else if (!be_.replay(key)) {
    const bool recording = be_.begin_capture(key);
    compute_phase(false, shadow);
    update_phase(false);
    be_.end_capture(key);
    if (recording) be_.replay(key);
  }
  if (shadow) shadow_only_metrics();
}

void Trainer::step_unlogged() {
  MXLAB_ASSERT(step_ < cfg_.steps, "step_unlogged at step ", step_, " of a ", cfg_.steps, "-step run");
  if (!output_open_) open_output();
  step_once(false);
  ++step_;
}

std::string Trainer::run(const RunControl& ctl, int64_t to_step) {
  const int64_t end = to_step < 0 ? cfg_.steps : std::min<int64_t>(to_step, cfg_.steps);
  // A resumed run skips open_output(); without it, datasets first created after the checkpoint
  // (a branch that had not logged yet) would lack their attributes.
  if (!output_open_) open_output();
  while (step_ < end) {
    if (ctl.stop_requested && ctl.stop_requested()) {
      flush_shadow();
      return "interrupted";
    }
    if (ctl.checkpoint && checkpoint_due(step_)) {
      flush_shadow();  // the checkpoint holds the running averages, the run file every row before it
      ctl.checkpoint(step_);
    }
    const bool log = (step_ % cfg_.log.log_every) == 0 || step_ == cfg_.steps - 1;
    step_once(log);
    if (log && ctl.progress) {
      std::string line;
      for (auto& t : traj_) {
        if (!t->started || t->finished) continue;  // a branch that has trained its `steps` has no new loss
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s%s %.4g", line.empty() ? "" : "  ", t->name.c_str(), t->last_loss);
        line += buf;
        if (t->stopped) line += " (stopped)";
      }
      ctl.progress(step_, line);
    }
    ++step_;
    bool any_alive = false;
    for (auto& t : traj_)
      if (!t->stopped && !t->dormant && step_ < t->end_step && (t->started || t->start_step >= step_)) any_alive = true;
    if (!any_alive) break;
  }
  flush_shadow();
  be_.synchronize();
  // The state after the last step, when a snapshot asks for it (snapshot_steps may hold `steps`).
  if (step_ == cfg_.steps) write_snapshots();
  // Non-finite losses are detected on log steps; the loss history tells the truth.
  for (size_t a = 1; a <= n_arms_; ++a) {
    const LossSummary s = summary(a);
    if (s.first_nonfinite_step >= 0 || s.divergence_step >= 0) return "diverged";
  }
  return "complete";
}

std::vector<float> Trainer::history(size_t i) {
  Trajectory& tr = *traj_[i];
  const int64_t first = tr.start_step;
  const int64_t n = std::max<int64_t>(0, std::min<int64_t>(step_, tr.end_step) - first);
  std::vector<float> hist = download(tr.loss_hist + first, static_cast<size_t>(n));
  // A stopped trajectory ran up to its first non-finite step: what was computed after it, on
  // non-finite weights, until the stop was noticed on a log step, and the untouched tail are
  // not steps it ran.
  if (tr.stopped)
    for (size_t t = 0; t < hist.size(); ++t)
      if (!std::isfinite(hist[t])) {
        hist.resize(t + 1);
        break;
      }
  return hist;
}

LossSummary Trainer::summary(size_t i) {
  return summarize_losses(history(i), traj_[i]->start_step, cfg_.log.divergence_factor, cfg_.log.spike_factor);
}

std::vector<float> Trainer::download(const float* p, size_t n) {
  std::vector<float> h(n);
  if (n) be_.download(h.data(), p, n);
  return h;
}

void Trainer::upload(float* p, const std::vector<float>& host) {
  if (!host.empty()) be_.upload(p, host.data(), host.size());
}

Attrs Trainer::group_attrs(const Trajectory& tr) const {
  Attrs a;
  for (const auto& g : shape_.groups) a.lists["param_groups"].push_back(g.name);
  a.ints["layers"] = cfg_.model.depth;
  a.str["policy"] = tr.kind == TrajectoryKind::fp32 ? "fp32" : describe_policy(tr.policy);
  if (tr.kind == TrajectoryKind::arm) {
    a.str["arm"] = tr.name;
    a.str["patch"] = "{}";
    for (const ArmConfig& arm : cfg_.arms)
      if (arm.name == tr.name) a.str["patch"] = describe_patch(arm);
  }
  if (tr.kind == TrajectoryKind::branch) {
    a.ints["at"] = tr.start_step;
    a.str["from"] = traj_[static_cast<size_t>(tr.source)]->name;
    if (tr.end_step < cfg_.steps) a.ints["end_step"] = tr.end_step;  // `steps`: trains at .. end_step - 1
    for (const auto& iv : cfg_.interventions)
      if (iv.name == tr.name) a.str["patch"] = describe_patch(iv);
  }
  return a;
}

std::map<std::string, Attrs> Trainer::dataset_attrs(const Trajectory& tr) const {
  std::map<std::string, Attrs> m;
  const PrecisionConfig& p = tr.policy;
  for (const StatTensor t : stat_tensors(shape_)) {
    const bool q = stat_quantized(p, t);
    for (const Metric* family : {&metric::lastbin, &metric::clamped}) {
      Attrs a;
      a.ints["quantized"] = q ? 1 : 0;
      a.str["format"] = name(q ? stat_role_format(p, t) : p.diagnostic_format);
      m[member_name(*family, t)] = a;
    }
  }
  // The datasets per parameter group or per weight group name their columns.
  Attrs names;
  for (const auto& g : shape_.groups) names.lists["names"].push_back(g.name);
  Attrs wnames;
  for (const auto& g : shape_.groups)
    if (g.kind == ParamGroup::w1 || g.kind == ParamGroup::w2) wnames.lists["names"].push_back(g.name);
  for (const Metric* decl : metric::kAll) {
    if (decl->shape == MetricShape::per_group) m[decl->name] = names;
    if (decl->shape == MetricShape::per_weight) m[decl->name] = wnames;
  }
  return m;
}

void Trainer::open_output() {
  Attrs root;
  for (size_t a = 1; a <= n_arms_; ++a) root.lists["arms"].push_back(traj_[a]->name);
  sink_.set_root_attrs(root);
  for (auto& t : traj_)
    if (!t->muted) sink_.open_group(t->h5_group, group_attrs(*t), dataset_attrs(*t));
  // The probe batch, once (the same for every trajectory and step), when snapshots are taken.
  if (probe_x_ && (cfg_.log.snapshot_every > 0 || !cfg_.log.snapshot_steps.empty())) {
    const int64_t d = cfg_.vocab() > 0 ? 1 : cfg_.model.width;  // token ids: one column
    sink_.write_array("snapshots/probe_x", probe_rows_, d, download(probe_x_, static_cast<size_t>(probe_rows_ * d)));
    sink_.write_array("snapshots/probe_y", probe_rows_, d, download(probe_y_, static_cast<size_t>(probe_rows_ * d)));
  }
  output_open_ = true;
}

void Trainer::finish(const std::string& status) {
  for (size_t i = 0; i < traj_.size(); ++i) {
    Trajectory& tr = *traj_[i];
    if (tr.muted) continue;
    Attrs a;
    if (!tr.started) {
      a.str["state"] = "not_started";
      sink_.set_group_attrs(tr.h5_group, a);
      continue;
    }
    const LossSummary s = summary(i);
    a.ints["steps_run"] = s.steps_run;
    a.ints["first_nonfinite_step"] = s.first_nonfinite_step;
    a.ints["divergence_step"] = s.divergence_step;
    a.ints["spike_count"] = s.spike_count;
    // The events of lab/train/SCHEMA.md "Event attributes" (default rules).
    a.ints["excursion_step"] = s.excursion.event ? s.excursion.step : -1;
    a.ints["excursion_censored_at"] = s.excursion.event ? -1 : s.excursion.step;
    a.ints["first_spike_step"] = s.first_spike_step;
    if (i > 0 && traj_[0]->started)
      a.num["tail_log_ratio"] = tail_log_ratio(history(i), tr.start_step, history(0), traj_[0]->start_step);
    a.num["spike_score"] = s.spike_score;
    a.num["final_loss"] = s.final_loss;
    a.num["min_loss"] = s.min_loss;
    if (tr.is_mx) a.num["max_bias_ratio"] = tr.max_bias_ratio;
    a.num["max_gamma_lastbin"] = tr.max_gamma_lastbin;
    a.str["state"] = tr.stopped ? "stopped_nonfinite" : "ran";
    sink_.set_group_attrs(tr.h5_group, a);
    // The record holds the steps the trajectory ran (steps_run), no more: a stopped one ends at
    // its first non-finite step, and the steps computed after it until the stop was noticed
    // on a log step are dropped from every series (SCHEMA.md, "Summary attributes").
    if (tr.stopped) sink_.truncate_group_from(tr.h5_group, tr.start_step + s.steps_run);
    sink_.write_loss_history(tr.h5_group, download(tr.loss_hist + tr.start_step, static_cast<size_t>(s.steps_run)));
  }
  // Everything is on disk before the status says so: a kill inside this flush leaves a file
  // that still says `running` (and resumes), never a `complete` one with missing data.
  sink_.flush();
  Attrs root;
  root.str["status"] = status;
  sink_.set_root_attrs(root);
  sink_.flush();
}

}  // namespace mxlab
