// `mxlab eval RUN.h5 --snapshot S [--trajectory T] [--apply PRESET]... [--set k=v]... [--train-batch]`:
// the loss of a parameter snapshot under its trajectory's policy and under patched policies
// (lab/train/eval.h), e.g. the loss jump an intervention would cause at its first step.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/cli/option_checks.h"
#include "lab/core/error.h"
#include "lab/model/backend.h"
#include "lab/config/config_io.h"
#include "lab/backends/backends.h"
#include "lab/train/eval.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 47;  // after export in --help

struct Args {
  std::string run, trajectory = "mx", device = "cpu";
  int64_t snapshot = -1;
  std::vector<std::string> applies, sets;
  bool train_batch = false;
};

int do_eval(const Args& a) {
  std::vector<InterventionConfig> patches;
  for (const std::string& p : a.applies) patches.push_back({"eval", 0, p, {}});
  if (!a.sets.empty()) {
    InterventionConfig iv{"eval", 0, "", {}};
    for (const std::string& kv : a.sets) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) throw Error(msg("--set expects field=value, got ", quoted_excerpt(kv)));
      iv.set[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    patches.push_back(iv);
  }
  for (const InterventionConfig& iv : patches) apply_intervention(PrecisionConfig{}, iv);  // bad names: before any work
  std::unique_ptr<Backend> be = make_backend(a.device);
  const std::vector<EvalRow> rows = eval_snapshot(*be, a.run, a.trajectory, a.snapshot, patches, a.train_batch);
  std::printf("%s, trajectory %s, snapshot at step %lld, %s batch, %s\n", a.run.c_str(), a.trajectory.c_str(),
              static_cast<long long>(a.snapshot), a.train_batch ? "training" : "probe", be->name().c_str());
  std::printf("  %-40s %14s %10s\n", "policy", "loss", "ratio");
  for (const EvalRow& r : rows) std::printf("  %-40s %14.7g %10.4f\n", r.label.c_str(), r.loss, r.loss / rows[0].loss);
  std::string json = msg("{\"run\":\"", a.run, "\",\"trajectory\":\"", a.trajectory, "\",\"step\":", a.snapshot,
                         ",\"batch\":\"", a.train_batch ? "train" : "probe", "\",\"rows\":[");
  for (size_t i = 0; i < rows.size(); ++i)
    json += msg(i ? "," : "", "{\"label\":\"", rows[i].label, "\",\"loss\":", rows[i].loss, "}");
  std::printf("%s]}\n", json.c_str());
  return 0;
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "eval", "Loss of a parameter snapshot under its policy and under patched policies (probe or training batch)");
  c->add_option("run", a->run, "run file <run_id>.h5 with snapshots (log.snapshot_steps)")->required()->check(CLI::ExistingFile);
  c->add_option("--snapshot", a->snapshot, "the step of the snapshot")->required()->check(integer_in(0, LLONG_MAX));
  c->add_option("--trajectory", a->trajectory, "fp32, an arm (default mx) or a branch");
  c->add_option("--apply", a->applies, "a preset to evaluate under (repeatable: one row each)");
  c->add_option("--set", a->sets, "policy fields of one more row, e.g. --set ln_affine=none (repeatable, combined)");
  c->add_flag("--train-batch", a->train_batch, "the batch the snapshot's step trained on instead of the probe batch");
  c->add_option("--device", a->device, "cpu | auto | cuda | cuda:N")->capture_default_str();
  c->callback([a] { set_exit_code(do_eval(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
