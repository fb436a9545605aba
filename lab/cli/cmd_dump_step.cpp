// `mxlab dump-step EXP.yaml --out DIR [--set KEY=VALUE ...] [--run I] [--step N] [--trajectory T] [--gemm G]
// [--weights DIR]`: one training step of the student on the CPU reference backend, written out as float32 .npy
// files so that an outside implementation (tests/torch/crosscheck.py, PyTorch autograd;
// tests/torch/paper_emulator.py, the MX emulation library) can rebuild the network, load the
// same weights and batch, and compare the loss, every gradient and the updated weights:
//   config.yaml                 the resolved configuration (`mxlab dump-config` format)
//   student.<group>.npy         initial student parameters, one file per group of lab/model
//                               (e.g. student.layer0.W1.npy [H1, d], student.layer0.gamma.npy [d])
//   teacher.<group>.npy         the teacher's parameters
//   x.npy, target.npy           the batch of step N [batch, seq_len, d] (target = teacher(x) + noise);
//                               data.kind: tokens: the token ids and the next tokens [batch, seq_len]
//   out.npy                     the student's output [batch, seq_len, d] (tokens: logits [.., vocab])
//   loss.npy                    [1]
//   grad.<group>.npy            the gradient of the loss, one file per student group
//   updated.<group>.npy         the parameters after the trainer's optimizer update of step N
//                               from a zero optimizer state (Adam: m = v = 0, bias corrections of
//                               step N), one file per student group
//   policy.txt                  the trajectory and its precision policy, one line
//   bf16_table.npy              [65536 x 4]: for every bfloat16 bit pattern x (as float32, in
//                               pattern order) the scalar functions the step evaluates on
//                               bf16-rounded inputs: x, act_value(model.activation, x),
//                               act_deriv(model.activation, x), det_exp(x) (lab/model/
//                               elementwise.h), so that an outside check can use the lab's
//                               element functions and tell them apart from its composition
// The batch is the one the trainer draws at step N. The trajectory (`--trajectory`) is `fp32`
// (default: the all-FP32 reference path) or one of the run's MX arms (`mx` without `arms:`),
// whose step is the trainer's: that arm's policy, its own targets under data.mx_teacher_targets
// (target.npy then holds them). `--gemm double` accumulates every GEMM product in double and
// rounds it once (lab/cpu/cpu_backend.h), which makes the step independent of the summation
// order an outside GEMM uses. `--weights DIR` steps from other student parameters than the initial
// ones: DIR/<group>.npy for every student group, e.g. a snapshot that `mxlab export RUN.h5
// --snapshot S --npy OUT` wrote as OUT/<trajectory>/ (a state a run trained to); student.*.npy
// then holds them, and the optimizer state is still zero.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/cli/option_checks.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/io/npy.h"
#include "lab/model/elementwise.h"
#include "lab/model/mlp.h"
#include "lab/train/batch.h"
#include "lab/config/config_io.h"
#include "lab/config/sweep.h"
#include "lab/runs/memory_estimate.h"
#include "lab/io/table_text.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 92;  // after dump-config

struct Args {
  std::string path, out;
  std::vector<std::string> sets;
  int step = 0;
  int run = -1;  // --run: run I of a sweep
  std::string trajectory = "fp32";
  std::string gemm = "eigen";
  std::string weights;  // --weights DIR: DIR/<group>.npy in place of the initial student parameters
};

std::vector<float> host(Backend& be, const float* p, size_t n) {
  std::vector<float> v(n);
  be.download(v.data(), p, n);
  return v;
}

// The student parameters from DIR/<group>.npy, one file per group of `s`, each of the group's shape
// (a vector as [cols] or [1, cols]); every file must be there and finite, so that a step never
// mixes loaded and initial parameters.
void load_groups(const std::string& dir, const NetShape& s, std::vector<float>& flat) {
  if (!std::filesystem::is_directory(dir))
    throw Error(msg("--weights ", dir, ": no such directory (give the folder of <group>.npy files, e.g. what "
                    "`mxlab export RUN.h5 --snapshot S --npy OUT` wrote as OUT/<trajectory>)"));
  for (const ParamGroup& g : s.groups) {
    const std::string path = dir + "/" + g.name + ".npy";
    if (!std::filesystem::exists(path))
      throw Error(msg("--weights ", dir, ": no ", g.name, ".npy (the student has groups ", [&] {
                        std::string names;
                        for (const ParamGroup& h : s.groups) names += (names.empty() ? "" : ", ") + h.name;
                        return names;
                      }(), ")"));
    const NpyArray arr = read_npy(path);
    if (arr.rows() != g.rows || arr.cols() != g.cols || (g.rows > 1 && arr.shape.size() != 2))
      throw Error(msg(path, ": shape [", arr.rows(), " x ", arr.cols(), "], the configuration's ", g.name, " is [",
                      g.rows, " x ", g.cols, "] (same model.* and data.* as the run that wrote it? pass its --set too)"));
    for (size_t i = 0; i < arr.data.size(); ++i)
      if (!std::isfinite(arr.data[i]))
        throw Error(msg(path, ": element ", i, " is not finite (", arr.data[i], "): no step from such a state"));
    std::copy(arr.data.begin(), arr.data.end(), flat.begin() + static_cast<std::ptrdiff_t>(g.offset));
  }
}

// One file per parameter group: <dir>/<prefix>.<group>.npy, vectors as 1-D arrays.
void write_groups(const std::string& dir, const std::string& prefix, const NetShape& s, const std::vector<float>& flat) {
  for (const ParamGroup& g : s.groups) {
    std::vector<int64_t> shape = g.rows == 1 ? std::vector<int64_t>{g.cols} : std::vector<int64_t>{g.rows, g.cols};
    write_npy(dir + "/" + prefix + "." + g.name + ".npy", shape, flat.data() + g.offset);
  }
}

void dump_step(const Args& a) {
  if (a.step < 0) throw Error(msg("--step ", a.step, " must be >= 0"));
  if (a.gemm != "eigen" && a.gemm != "double")
    throw Error(msg("--gemm ", a.gemm, ": use eigen (the reference FP32 product) or double"));
  const RunConfig cfg = a.run < 0 ? load_config(a.path, a.sets) : run_of_experiment(a.path, a.sets, a.run);
  check_run_fits_memory(cfg, false, a.path);  // its parameters are built on the host
  // The trajectory's policy: fp32, or one of the run's MX arms.
  PrecisionConfig policy = PrecisionConfig::fp32();
  bool mx = false;
  if (a.trajectory != "fp32") {
    std::string names = "fp32";
    bool found = false;
    for (const ResolvedArm& arm : resolved_arms(cfg)) {
      names += ", " + arm.name;
      if (arm.name == a.trajectory) {
        policy = arm.policy;
        found = true;
      }
    }
    if (!found) throw Error(msg("--trajectory ", a.trajectory, ": the run has no such trajectory (it has ", names, ")"));
    mx = true;
  }
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (ec) throw Error(msg("--out ", a.out, ": cannot create the directory (", ec.message(), ")"));

  const NetShape S = NetShape::student(cfg.model, cfg.data.seq_len, cfg.vocab());
  const NetShape T = NetShape::teacher(cfg.model, cfg.teacher, cfg.data.seq_len);
  const int64_t rows = cfg.tokens(), d = cfg.model.width;
  const size_t n = static_cast<size_t>(rows * d);
  std::unique_ptr<Backend> be = make_cpu_backend(a.gemm == "double" ? CpuGemm::double_sum : CpuGemm::eigen);
  be->set_step(step_scalars(cfg, a.step));

  std::vector<float> sp = init_params(S, cfg.model.init, cfg.model.init_gain, cfg.seed, Stream::init);
  if (!a.weights.empty()) load_groups(a.weights, S, sp);
  const std::vector<float> tp = teacher_params_host(cfg, T);
  float* P = be->alloc(sp.size());
  float* TP = be->alloc(tp.size());
  float* G = be->alloc(sp.size());
  float* M = be->alloc(sp.size());
  float* V = be->alloc(sp.size());
  float* x = be->alloc(n);
  be->upload(P, sp.data(), sp.size());
  be->upload(TP, tp.data(), tp.size());
  be->fill(M, 0.0f, sp.size());
  be->fill(V, 0.0f, sp.size());
  Workspace ws = Workspace::make(*be, S, rows), wt = Workspace::make(*be, T, rows);

  // The trainer's batch and targets of this step (lab/train/trainer.cpp, compute_phase).
  PassPolicy pol;
  pol.p = policy;
  pol.seed = cfg.seed;
  make_batch(*be, cfg, T, TP, x, wt);
  const float* target = wt.out;
  float* mx_target = nullptr;
  if (mx && cfg.data.mx_teacher_targets) {
    Workspace wmx = Workspace::make(*be, T, rows);
    mx_target = be->alloc(n);
    make_mx_targets(*be, cfg, T, TP, x, wmx, pol, mx_target);
    target = mx_target;
  }
  forward(*be, S, P, x, ws, pol);
  loss_and_grad(*be, cfg.loss_spec(), target, ws, pol, nullptr);
  backward(*be, S, P, x, ws, G, pol);
  const std::vector<float> grads = host(*be, G, sp.size());
  optimizer_step(*be, cfg, P, G, M, V, sp.size());

  // Token data: x and target are the ids [batch, seq_len], out the logits [batch, seq_len, vocab].
  const bool tokens = cfg.vocab() > 0;
  const std::vector<int64_t> batch_shape =
      tokens ? std::vector<int64_t>{cfg.data.batch, cfg.data.seq_len} : std::vector<int64_t>{cfg.data.batch, cfg.data.seq_len, d};
  const std::vector<int64_t> out_shape = {cfg.data.batch, cfg.data.seq_len, S.out_width()};
  const size_t n_in = tokens ? static_cast<size_t>(rows) : n, n_out = static_cast<size_t>(rows * S.out_width());
  write_groups(a.out, "student", S, sp);
  write_groups(a.out, "teacher", T, tp);
  write_groups(a.out, "grad", S, grads);
  write_groups(a.out, "updated", S, host(*be, P, sp.size()));
  write_npy(a.out + "/x.npy", batch_shape, host(*be, x, n_in).data());
  write_npy(a.out + "/target.npy", batch_shape, host(*be, target, n_in).data());
  write_npy(a.out + "/out.npy", out_shape, host(*be, ws.out, n_out).data());
  const float loss = be->read_scalar(ws.loss);
  write_npy(a.out + "/loss.npy", {1}, &loss);
  std::vector<float> table(65536 * 4);
  for (uint32_t i = 0; i < 65536; ++i) {
    const float v = bits_f32(i << 16);
    table[i * 4 + 0] = v;
    table[i * 4 + 1] = act_value(S.act, v);
    table[i * 4 + 2] = act_deriv(S.act, v);
    table[i * 4 + 3] = det_exp(v);
  }
  write_npy(a.out + "/bf16_table.npy", {65536, 4}, table.data());
  write_text_atomically(a.out + "/config.yaml", dump_config(cfg));
  write_text_atomically(a.out + "/policy.txt", "trajectory: " + a.trajectory + "\ngemm: " + a.gemm +
                                                   "\npolicy: " + describe_policy(policy) + "\n");
  std::printf("dump-step: %s step %d, trajectory %s: loss %.9g, %zu student and %zu teacher groups written to %s\n",
              a.path.c_str(), a.step, a.trajectory.c_str(), static_cast<double>(loss), S.groups.size(),
              T.groups.size(), a.out.c_str());
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "dump-step",
      "Write one CPU training step (weights, batch, loss, every gradient, updated weights) as .npy for outside checks");
  sub->add_option("config", args->path, "experiment YAML file (one run, or a sweep with --run)")->required();
  sub->add_option("--out", args->out, "directory to write the .npy files and config.yaml into")->required();
  sub->add_option("--set", args->sets, "override a key, e.g. --set model.block=attention (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--step", args->step, "the step whose batch to use (default 0)")->check(integer_in(0));
  sub->add_option("--run", args->run, "for a sweep: the index of the run to step (see `mxlab plan`)")
      ->check(integer_in(0));
  sub->add_option("--trajectory", args->trajectory,
                  "fp32 (default) or an MX arm of the run (mx without arms:): the step under its policy");
  sub->add_option("--gemm", args->gemm,
                  "eigen (default: the reference FP32 product) or double (products summed in double, rounded once)");
  sub->add_option("--weights", args->weights,
                  "step from the student parameters in DIR/<group>.npy (e.g. `mxlab export RUN.h5 --snapshot S --npy "
                  "OUT` wrote OUT/<trajectory>/) instead of the initial ones; the optimizer state stays zero");
  sub->callback([args] { dump_step(*args); });
});

}  // namespace
}  // namespace mxlab::cli
