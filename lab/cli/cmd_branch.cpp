// `mxlab branch RUN.h5 --at STEP (--apply PRESET | --set k=v ...) --name N`: add an
// intervention branch to an existing run after the fact, from its checkpoint at (or before,
// replaying forward) STEP. The branch is written to branches/<N> of the same file.
#include <cstdio>
#include <string>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/core/error.h"
#include "lab/model/backend.h"
#include "lab/train/checkpoint.h"
#include "lab/train/config_io.h"
#include "lab/train/run_driver.h"
#include "lab/train/run_file.h"
#include "lab/train/trainer.h"

namespace mxlab::cli {
namespace {

struct BranchArgs {
  std::string file, apply, name, device;
  std::vector<std::string> sets;
  int at = -1;
};

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

int do_branch(const BranchArgs& a) {
  const std::string run_id = RunFile::peek_root_str(a.file, "run_id");
  const std::string yaml = RunFile::peek_root_str(a.file, "config_yaml");
  const std::string run_status = RunFile::peek_root_str(a.file, "status");
  if (run_id.empty() || yaml.empty()) throw Error(msg(a.file, " is not an mxlab run file (no run_id/config_yaml)"));
  RunConfig cfg = config_from_yaml_string(yaml, a.file, {});
  for (const auto& iv : cfg.interventions)
    if (iv.name == a.name) throw Error(msg("branch '", a.name, "' already exists in ", a.file, "; choose another --name"));
  InterventionConfig iv;
  iv.name = a.name;
  iv.at = a.at;
  iv.apply = a.apply;
  for (const auto& kv : a.sets) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw Error(msg("--set expects key=value, got '", kv, "'"));
    iv.set[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (iv.at <= 0 || iv.at >= cfg.steps) throw Error(msg("--at must be in [1, ", cfg.steps, "), got ", iv.at));
  apply_intervention(cfg.precision, iv);  // validates the preset and fields before any work
  cfg.interventions.push_back(iv);

  const std::string dir = dir_of(a.file);
  int64_t best = -1;
  for (int64_t s : list_checkpoints(dir, run_id))
    if (s <= iv.at) best = s;
  if (best < 0)
    throw Error(msg("no checkpoint of run ", run_id, " at or before step ", iv.at, " in ", dir,
                    " (set checkpoint_every in the experiment, or interventions at this step, and run it again)"));
  std::unique_ptr<Backend> be = make_backend(a.device.empty() ? cfg.device : a.device);
  std::unique_ptr<RunFile> file = RunFile::open(a.file);
  Trainer tr(cfg, *be, *file);
  tr.restrict_output({iv.name});
  load_checkpoint(tr, run_id, checkpoint_path(dir, run_id, best));
  tr.open_output();
  if (best < iv.at) std::fprintf(stderr, "replaying steps %lld..%d from the checkpoint at %lld\n",
                                 static_cast<long long>(best), iv.at - 1, static_cast<long long>(best));
  RunControl ctl;
  const std::atomic<bool>* stop = install_stop_handlers();
  ctl.stop_requested = [stop] { return stop->load(); };
  const std::string status = tr.run(ctl);
  if (status == "interrupted") {
    std::fprintf(stderr, "mxlab: interrupted; the branch is incomplete in %s\n", a.file.c_str());
    file->flush();
    return 130;
  }
  tr.finish(run_status);  // the run's own status is unchanged by a branch
  file->flush();
  const LossSummary s = tr.summary(tr.num_trajectories() - 1);
  std::printf("branch %s (at %d, from checkpoint %lld) -> %s: divergence step %lld, final loss %.6g\n",
              iv.name.c_str(), iv.at, static_cast<long long>(best), a.file.c_str(),
              static_cast<long long>(s.divergence_step), s.final_loss);
  return 0;
}

const Registrar reg(30, [](CLI::App& app) {
  auto a = std::make_shared<BranchArgs>();
  CLI::App* c = app.add_subcommand("branch", "Add an intervention branch to an existing run, from a checkpoint");
  c->add_option("run", a->file, "run file <run_id>.h5 (its checkpoints lie beside it)")->required()->check(CLI::ExistingFile);
  c->add_option("--at", a->at, "step from which the patch applies")->required();
  c->add_option("--apply", a->apply, "preset: to_fp32, skip_ln_quant, bump_exponent, bump_exponent_always, "
                                     "forward_only, bf16_activations, bf16_weights, bf16_fwd_activations");
  c->add_option("--set", a->sets, "policy field patch, e.g. --set activation=bf16 (repeatable)");
  c->add_option("--name", a->name, "branch name (group branches/<name>)")->required();
  c->add_option("--device", a->device, "cpu | auto | cuda | cuda:N");
  c->callback([a] { set_exit_code(do_branch(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
