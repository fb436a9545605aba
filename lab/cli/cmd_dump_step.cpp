// `mxlab dump-step EXP.yaml --out DIR [--set KEY=VALUE ...] [--step N]`: one FP32 training step
// of the student on the CPU reference backend, written out as float32 .npy files so that an
// outside implementation (tests/torch/crosscheck.py, PyTorch autograd) can rebuild the network,
// load the same weights and batch, and compare the loss and every gradient:
//   config.yaml                 the resolved configuration (`mxlab dump-config` format)
//   student.<group>.npy         initial student parameters, one file per group of lab/model
//                               (e.g. student.layer0.W1.npy [H1, d], student.layer0.gamma.npy [d])
//   teacher.<group>.npy         the teacher's parameters
//   x.npy, target.npy           the batch of step N [batch, seq_len, d] (target = teacher(x) + noise)
//   out.npy                     the student's output [batch, seq_len, d]
//   loss.npy                    [1]
//   grad.<group>.npy            the gradient of the loss, one file per student group
// The batch is the one the trainer draws at step N; the policy is all FP32 (the reference path).
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
#include "lab/model/mlp.h"
#include "lab/train/config_io.h"
#include "lab/train/memory_estimate.h"
#include "lab/train/table_text.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 92;  // after dump-config

struct Args {
  std::string path, out;
  std::vector<std::string> sets;
  int step = 0;
};

std::vector<float> host(Backend& be, const float* p, size_t n) {
  std::vector<float> v(n);
  be.download(v.data(), p, n);
  return v;
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
  const RunConfig cfg = load_config(a.path, a.sets);
  check_run_fits_memory(cfg, false, a.path);  // its parameters are built on the host
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (ec) throw Error(msg("--out ", a.out, ": cannot create the directory (", ec.message(), ")"));

  const NetShape S = NetShape::student(cfg.model, cfg.data.seq_len);
  const NetShape T = NetShape::teacher(cfg.model, cfg.teacher, cfg.data.seq_len);
  const int64_t rows = cfg.tokens(), d = cfg.model.width;
  const size_t n = static_cast<size_t>(rows * d);
  std::unique_ptr<Backend> be = make_cpu_backend();
  StepScalars sc;
  sc.step = static_cast<uint32_t>(a.step);
  be->set_step(sc);

  const std::vector<float> sp = init_params(S, cfg.model.init, cfg.model.init_gain, cfg.seed, Stream::init);
  const std::vector<float> tp = init_params(T, InitKind::pytorch, 1.0f, cfg.seed, Stream::teacher_init);
  float* P = be->alloc(sp.size());
  float* TP = be->alloc(tp.size());
  float* G = be->alloc(sp.size());
  float* x = be->alloc(n);
  be->upload(P, sp.data(), sp.size());
  be->upload(TP, tp.data(), tp.size());
  Workspace ws = Workspace::make(*be, S, rows), wt = Workspace::make(*be, T, rows);

  // The trainer's batch of this step (lab/train/trainer.cpp, compute_phase).
  PassPolicy pol;
  pol.p = PrecisionConfig::fp32();
  pol.seed = cfg.seed;
  be->randn(x, n, cfg.seed, Stream::data, 1.0f);
  forward(*be, T, TP, x, wt, pol);
  if (cfg.data.label_noise > 0.0f) be->add_randn(wt.out, n, cfg.seed, Stream::label_noise, cfg.data.label_noise);
  forward(*be, S, P, x, ws, pol);
  loss_and_grad(*be, cfg, wt.out, ws, pol, nullptr);
  backward(*be, S, P, x, ws, G, pol);

  const std::vector<int64_t> batch_shape = {cfg.data.batch, cfg.data.seq_len, d};
  write_groups(a.out, "student", S, sp);
  write_groups(a.out, "teacher", T, tp);
  write_groups(a.out, "grad", S, host(*be, G, sp.size()));
  write_npy(a.out + "/x.npy", batch_shape, host(*be, x, n).data());
  write_npy(a.out + "/target.npy", batch_shape, host(*be, wt.out, n).data());
  write_npy(a.out + "/out.npy", batch_shape, host(*be, ws.out, n).data());
  const float loss = be->read_scalar(ws.loss);
  write_npy(a.out + "/loss.npy", {1}, &loss);
  write_text_atomically(a.out + "/config.yaml", dump_config(cfg));
  std::printf("dump-step: %s step %d: loss %.9g, %zu student and %zu teacher groups written to %s\n", a.path.c_str(),
              a.step, static_cast<double>(loss), S.groups.size(), T.groups.size(), a.out.c_str());
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "dump-step", "Write one FP32 CPU step (weights, batch, loss, every gradient) as .npy for outside checks");
  sub->add_option("config", args->path, "experiment YAML file (one run)")->required();
  sub->add_option("--out", args->out, "directory to write the .npy files and config.yaml into")->required();
  sub->add_option("--set", args->sets, "override a key, e.g. --set model.block=attention (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--step", args->step, "the step whose batch to use (default 0)")->check(integer_in(0));
  sub->callback([args] { dump_step(*args); });
});

}  // namespace
}  // namespace mxlab::cli
