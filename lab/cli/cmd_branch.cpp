// `mxlab branch RUN.h5 --at STEP (--apply PRESET | --set k=v ...) --name N [--from ARM|fp32] [--steps N]`: add an
// intervention branch to a finished run after the fact, from its checkpoint at (or before,
// replaying forward) STEP. The branch is written to branches/<N> of the same file, bit-identical
// to the same intervention run in-line (the replay recomputes exactly what the run computed).
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "lab/backends/backends.h"
#include "lab/cli/commands.h"
#include "lab/core/error.h"
#include "lab/runs/run_status.h"
#include "lab/runs/checkpoint.h"
#include "lab/config/config_io.h"
#include "lab/config/names.h"
#include "lab/runs/run_driver.h"
#include "lab/runs/run_file.h"
#include "lab/runs/run_records.h"
#include "lab/train/trainer.h"

namespace mxlab::cli {
namespace {

struct BranchArgs {
  std::string file, apply, name, device, from = kDefaultArmName;
  std::vector<std::string> sets;
  int at = -1;
  int steps = 0;  // 0: to the run's end
};

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The checkpoint a branch at `at` starts from: the latest valid one at or before `at`. Invalid
// ones (corrupted, truncated, another configuration's, another format version) are never used:
// each gets a one-line warning and an earlier one is tried, as `mxlab run` does when resuming.
// -1 when there is none at or before `at` (none was written, or `mxlab run` removed the older
// ones: lab/runs/disk_use.h): the branch then replays from step 0.
int64_t pick_checkpoint(const std::string& dir, const std::string& run_id, int at) {
  std::vector<int64_t> steps;
  for (int64_t s : list_checkpoints(dir, run_id))
    if (s <= at) steps.push_back(s);
  int refused = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    try {
      checkpoint_step(checkpoint_path(dir, run_id, *it), run_id);
      return *it;
    } catch (const Error& e) {
      std::fprintf(stderr, "mxlab: warning: %s; trying an earlier one\n", e.what());
      ++refused;
    }
  }
  if (refused > 0)
    throw Error(msg("no valid checkpoint of run ", run_id, " at or before step ", at, " in ", dir, " (", refused,
                    " refused, see the warnings above): run the experiment again with checkpoint_every set, "
                    "or choose a later --at"));
  return -1;
}

int branch_into(const BranchArgs& a, std::unique_ptr<RunFile>& file, const RunConfig& run_cfg,
                const std::string& run_id, const std::string& run_status);

int do_branch(const BranchArgs& a) {
  // The names first (lab/config/names.h): --name is a new branch's, --from names an arm or fp32.
  if (const std::string p = branch_name_problem(a.name); !p.empty())
    throw Error(msg("--name ", quoted_name(a.name), " ", p));
  if (const std::string p = plain_name_problem(a.from); !p.empty())
    throw Error(msg("--from ", quoted_name(a.from), " ", p));
  const std::string run_id = RunFile::peek_root_str(a.file, "run_id");
  const std::string yaml = RunFile::peek_root_str(a.file, "config_yaml");
  const std::string run_status = RunFile::peek_root_str(a.file, "status");
  if (run_id.empty() || yaml.empty()) throw Error(msg(a.file, " is not an mxlab run file (no run_id/config_yaml)"));
  // Resuming an unfinished run truncates every group at its checkpoint and recomputes only the
  // branches its configuration names, so a branch added now would be silently cut short.
  const std::optional<RunStatus> parsed_status = parse_run_status(run_status);
  if (!parsed_status || !is_finished(*parsed_status))
    throw Error(msg(a.file, " has status '", run_status, "': finish the run first (run the same `mxlab run` "
                    "command again to resume it), then add branches"));
  RunConfig cfg = config_from_yaml_string(yaml, a.file, {});
  for (const auto& iv : cfg.interventions)
    if (iv.name == a.name)
      throw Error(msg("branch '", a.name, "' is one of the run's interventions in ", a.file, "; choose another --name"));
  // Opening checks the whole file and, if an earlier write into it was killed, restores it from
  // its snapshot (run_file.h).
  std::unique_ptr<RunFile> file = RunFile::open(a.file);
  try {
    const int code = branch_into(a, file, cfg, run_id, run_status);
    if (code == 0) {
      // The run is finished again: its snapshot goes once the closed file reads back whole, as
      // at the end of `mxlab run` (lab/runs/disk_use.h).
      file.reset();
      if (read_run_record(a.file).readable) ::unlink(RunFile::snapshot_path(a.file).c_str());
    }
    return code;
  } catch (const IoError& e) {
    // A write into the file failed (disk full, ...): put its last good state back (the branch
    // then looks interrupted, and the same command computes it again once there is room).
    if (e.path() != a.file && e.path() != RunFile::snapshot_path(a.file)) throw;
    file.reset();
    throw IoError(msg(e.what(), "; ", RunFile::restore_snapshot(a.file), ": run the same command again"), e.path(),
                  e.error_number());
  }
}

int branch_into(const BranchArgs& a, std::unique_ptr<RunFile>& file, const RunConfig& run_cfg,
                const std::string& run_id, const std::string& run_status) {
  RunConfig cfg = run_cfg;
  const std::string group = "branches/" + a.name;
  bool redo = false;  // an earlier `mxlab branch` of this name was interrupted: recompute it
  if (file->has_group(group)) {
    if (file->group_has_attr(group, "state"))
      throw Error(msg("branch '", a.name, "' already exists in ", a.file, " (added earlier); choose another --name"));
    redo = true;
  }
  InterventionConfig iv;
  iv.name = a.name;
  iv.at = a.at;
  iv.apply = a.apply;
  iv.from = a.from;
  for (const auto& kv : a.sets) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw Error(msg("--set expects key=value, got '", kv, "'"));
    iv.set[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (iv.at <= 0 || iv.at >= cfg.steps) throw Error(msg("--at must be in [1, ", cfg.steps, "), got ", iv.at));
  if (a.steps < 0 || a.steps > cfg.steps - iv.at)
    throw Error(msg("--steps must be in [1, ", cfg.steps - iv.at, "] (steps - at), got ", a.steps,
                    ": leave it out to train the branch to the run's end"));
  iv.steps = a.steps;
  const bool from_fp32 = iv.from == kFp32Name;  // precision unpatched is a change from the FP32 state
  if (iv.apply.empty() && iv.set.empty() && !from_fp32)
    throw Error("the branch changes nothing: give --apply PRESET and/or --set k=v");
  {  // the arm it forks from, then the preset and fields, before any work
    const std::vector<ResolvedArm> arms = resolved_arms(cfg);
    std::string names;
    const ResolvedArm* from = nullptr;
    for (const ResolvedArm& arm : arms) {
      names += (names.empty() ? "" : ", ") + arm.name;
      if (arm.name == iv.from) from = &arm;
    }
    if (!from && !from_fp32)
      throw Error(msg(a.file, " has no arm '", iv.from, "' (arms: ", names, "): choose one with --from, or --from ",
                      kFp32Name, " for the FP32 trajectory"));
    branch_policy(cfg, iv);
  }
  cfg.interventions.push_back(iv);
  // Every other rule of an `interventions:` entry (name, impossible shapes): parse it as YAML.
  const std::string origin = "branch";
  try {
    cfg = config_from_yaml_string(dump_config(cfg), origin, {});
  } catch (const Error& e) {
    std::string why = e.what();  // "branch:LINE: problem": the line is of generated text
    const auto colon = why.find(": ");
    if (why.rfind(origin + ":", 0) == 0 && colon != std::string::npos) why = why.substr(colon + 2);
    throw Error(msg("invalid branch: ", why));
  }

  const std::string dir = dir_of(a.file);
  const int64_t best = pick_checkpoint(dir, run_id, iv.at);
  std::unique_ptr<Backend> be = make_backend(a.device.empty() ? cfg.device : a.device);
  if (redo) {
    std::fprintf(stderr, "mxlab: branch '%s' in %s is incomplete (an interrupted mxlab branch): computing it again\n",
                 a.name.c_str(), a.file.c_str());
    file->clear_group(group);
  }
  Trainer tr(cfg, *be, *file);
  tr.restrict_output({iv.name});
  if (best >= 0) load_checkpoint(tr, run_id, checkpoint_path(dir, run_id, best));
  tr.open_output();
  if (best < 0)
    std::fprintf(stderr, "no checkpoint of run %s at or before step %d in %s: replaying steps 0..%d from the start\n",
                 run_id.c_str(), iv.at, dir.c_str(), iv.at - 1);
  else if (best < iv.at)
    std::fprintf(stderr, "replaying steps %lld..%d from the checkpoint at %lld\n", static_cast<long long>(best),
                 iv.at - 1, static_cast<long long>(best));
  RunControl ctl;
  const std::atomic<bool>* stop = install_stop_handlers();
  ctl.stop_requested = [stop] { return stop->load(); };
  if (run_status_of(tr.run(ctl)) == RunStatus::interrupted) {
    std::fprintf(stderr, "mxlab: interrupted; branch '%s' is incomplete in %s: run the same command again\n",
                 a.name.c_str(), a.file.c_str());
    file->flush();
    return 130;
  }
  tr.finish(run_status);  // the run's own status is unchanged by a branch
  file->flush();
  const LossSummary s = tr.summary(tr.num_trajectories() - 1);
  std::printf("branch %s (at %d, from %s) -> %s: divergence step %lld, final loss %.6g\n",
              iv.name.c_str(), iv.at, best >= 0 ? msg("checkpoint ", best).c_str() : "step 0, no checkpoint",
              a.file.c_str(),
              static_cast<long long>(s.divergence_step), s.final_loss);
  return 0;
}

const Registrar reg(30, [](CLI::App& app) {
  auto a = std::make_shared<BranchArgs>();
  CLI::App* c = app.add_subcommand("branch", "Add an intervention branch to an existing run, from a checkpoint");
  c->add_option("run", a->file, "run file <run_id>.h5 (its checkpoints lie beside it)")->required()->check(CLI::ExistingFile);
  c->add_option("--at", a->at, "step from which the patch applies")->required();
  c->add_option("--apply", a->apply, "preset: to_fp32, skip_ln_quant, bump_exponent, bump_exponent_always, "
                                     "forward_only, bf16_activations, bf16_weights, bf16_fwd_activations, to_fp32_keep_gamma_q, "
                                     "snap_gamma, reset_adam_v, paper_emulator; several joined by '+', e.g. snap_gamma+to_fp32");
  c->add_option("--set", a->sets, "policy field patch, e.g. --set activation=bf16 (repeatable)");
  c->add_option("--name", a->name, "branch name (group branches/<name>): letters, digits, '_', '-', '.', not "
                                   "starting with '.', not fp32 or mx")->required();
  c->add_option("--from", a->from, "the arm the branch forks from (default mx; see the file's root attribute `arms`), "
                                   "or fp32: the FP32 trajectory's state, trained under the experiment's `precision`");
  c->add_option("--steps", a->steps, "train the branch for this many steps from --at, then stop (default: to the "
                                     "run's end)");
  c->add_option("--device", a->device, "cpu | auto | cuda | cuda:N");
  c->callback([a] { set_exit_code(do_branch(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
