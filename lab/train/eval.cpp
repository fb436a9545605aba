// Evaluating snapshots under policies (see eval.h).
#include "lab/train/eval.h"

#include <algorithm>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/model/mlp.h"
#include "lab/train/batch.h"
#include "lab/config/config_io.h"

namespace mxlab {

namespace {

std::vector<float> read_floats(const h5::H5File& f, const std::string& path) {
  const std::vector<double> v = f.read_doubles(path);
  return {v.begin(), v.end()};
}

}  // namespace

PrecisionConfig trajectory_policy(const RunConfig& cfg, const std::string& trajectory, int64_t step) {
  if (trajectory == "fp32") return PrecisionConfig::fp32();
  const std::vector<ResolvedArm> arms = resolved_arms(cfg);
  std::string names = "fp32";
  for (const ResolvedArm& a : arms) {
    if (a.name == trajectory) return a.policy;
    names += ", " + a.name;
  }
  for (const InterventionConfig& iv : cfg.interventions) {
    if (iv.name != trajectory) continue;
    const auto from = std::find_if(arms.begin(), arms.end(), [&](const ResolvedArm& a) { return a.name == iv.from; });
    MXLAB_ASSERT(from != arms.end(), "branch ", iv.name, " of an unknown arm");
    return step >= iv.at ? apply_intervention(from->policy, iv) : from->policy;
  }
  for (const InterventionConfig& iv : cfg.interventions) names += ", " + iv.name;
  throw Error(msg("no trajectory '", trajectory, "' in this run (it has ", names, ")"));
}

std::vector<EvalRow> eval_snapshot(Backend& be, const std::string& run_file, const std::string& trajectory,
                                   int64_t step, const std::vector<InterventionConfig>& patches, bool train_batch) {
  const h5::H5File f(run_file, h5::H5File::Mode::read);
  if (!f.has_attr("/", "config_yaml")) throw Error(msg(run_file, " is not an mxlab run file (no config_yaml)"));
  const RunConfig cfg = config_from_yaml_string(f.get_attr_string("/", "config_yaml"), run_file);
  const PrecisionConfig own = trajectory_policy(cfg, trajectory, step);
  const std::string dir = msg("snapshots/", trajectory, "/step_", step);
  if (!f.is_group(dir))
    throw Error(msg(run_file, " has no snapshot of '", trajectory, "' at step ", step,
                    " (mxlab export --snapshot lists none? run with log.snapshot_steps: [", step, "])"));
  const NetShape S = NetShape::student(cfg.model, cfg.data.seq_len, cfg.vocab());
  const NetShape T = NetShape::teacher(cfg.model, cfg.teacher, cfg.data.seq_len);
  std::vector<float> params(static_cast<size_t>(S.num_params));
  for (const ParamGroup& g : S.groups) {
    const std::vector<float> v = read_floats(f, dir + "/" + g.name);
    if (static_cast<int64_t>(v.size()) != g.size())
      throw Error(msg(run_file, ": ", dir, "/", g.name, " has ", v.size(), " values, the model's group ", g.size()));
    std::copy(v.begin(), v.end(), params.begin() + g.offset);
  }
  const int64_t d = cfg.model.width;
  int64_t rows = cfg.tokens();
  std::vector<float> px, py;
  if (!train_batch) {
    if (!f.is_dataset("snapshots/probe_x")) throw Error(msg(run_file, " holds no probe batch (snapshots/probe_x)"));
    px = read_floats(f, "snapshots/probe_x");
    py = read_floats(f, "snapshots/probe_y");
    rows = static_cast<int64_t>(px.size()) / (cfg.vocab() > 0 ? 1 : d);  // token ids: one per row
  }

  float* p = be.alloc(params.size());
  be.upload(p, params.data(), params.size());
  float* x = be.alloc(static_cast<size_t>(rows * d));
  float* y = be.alloc(static_cast<size_t>(rows * d));
  StepScalars sc;
  sc.step = static_cast<uint32_t>(step);  // the stochastic-rounding stream of that step
  be.set_step(sc);
  if (train_batch) {
    const std::vector<float> tp = teacher_params_host(cfg, T);
    float* tpd = be.alloc(tp.size());
    be.upload(tpd, tp.data(), tp.size());
    Workspace tws = Workspace::make(be, T, rows);
    make_batch(be, cfg, T, tpd, x, tws);
    if (cfg.data.mx_teacher_targets && trajectory != "fp32") {
      // The MX trajectory's own targets (the teacher under its policy, fresh noise).
      make_mx_targets(be, cfg, T, tpd, x, tws, PassPolicy{own, cfg.seed}, y);
    } else {
      be.copy(y, tws.out, static_cast<size_t>(rows * (cfg.vocab() > 0 ? 1 : d)));
    }
  } else {
    be.upload(x, px.data(), px.size());
    be.upload(y, py.data(), py.size());
  }
  Workspace ws = Workspace::make(be, S, rows);
  RunConfig lcfg = cfg;
  lcfg.data.batch = static_cast<int>(rows / cfg.data.seq_len);
  float* snapped = nullptr;  // the snapshot with gamma/beta := Q(gamma), Q(beta) (snap_gamma)
  auto loss_under = [&](const PrecisionConfig& pol, bool snap) {
    const PassPolicy pp{pol, cfg.seed};
    if (snap && !snapped) {
      snapped = be.alloc(params.size());
      be.copy(snapped, p, params.size());
      snap_norm_affine(be, S, snapped, PassPolicy{own, cfg.seed}, be.alloc(static_cast<size_t>(S.d)));
    }
    forward(be, S, snap ? snapped : p, x, ws, pp);
    loss_and_grad(be, lcfg.loss_spec(), y, ws, pp, nullptr);
    return static_cast<double>(be.read_scalar(ws.loss));
  };
  std::vector<EvalRow> out;
  out.push_back({"as trained", describe_policy(own), loss_under(own, false)});
  for (const InterventionConfig& iv : patches) {
    const PrecisionConfig pol = apply_intervention(own, iv);
    out.push_back({describe_patch(iv), describe_policy(pol), loss_under(pol, snaps_gamma(iv))});
  }
  return out;
}

}  // namespace mxlab
