// Step batches and the probe batch (see batch.h).
#include "lab/train/batch.h"

#include <algorithm>
#include <cmath>

#include "lab/core/error.h"

namespace mxlab {

namespace {
PassPolicy fp32_policy(const RunConfig& cfg) {
  PassPolicy p;
  p.p = PrecisionConfig::fp32();
  p.seed = cfg.seed;
  return p;
}
}  // namespace

std::vector<float> teacher_params_host(const RunConfig& cfg, const NetShape& teacher) {
  return init_params(teacher, InitKind::pytorch, 1.0f, cfg.seed, Stream::teacher_init);
}

void make_batch(Backend& be, const RunConfig& cfg, const NetShape& teacher, const float* teacher_params, float* x,
                Workspace& teacher_ws) {
  if (cfg.data.kind == DataKind::tokens) {  // no teacher: the next tokens are the targets
    be.token_batch(x, teacher_ws.out, cfg.data.batch, cfg.data.seq_len, cfg.data.vocab, cfg.seed, Stream::data);
    return;
  }
  const size_t n = static_cast<size_t>(teacher_ws.batch * cfg.model.width);
  be.randn(x, n, cfg.seed, Stream::data, 1.0f);
  forward(be, teacher, teacher_params, x, teacher_ws, fp32_policy(cfg));
  if (cfg.data.label_noise > 0.0f) be.add_randn(teacher_ws.out, n, cfg.seed, Stream::label_noise, cfg.data.label_noise);
}

void make_mx_targets(Backend& be, const RunConfig& cfg, const NetShape& teacher, const float* teacher_params,
                     const float* x, Workspace& teacher_ws, const PassPolicy& pol, float* target) {
  const size_t n = static_cast<size_t>(teacher_ws.batch * cfg.model.width);
  PassPolicy p = pol;
  p.collect_stats = false;
  forward(be, teacher, teacher_params, x, teacher_ws, p);
  be.copy(target, teacher_ws.out, n);
  if (cfg.data.label_noise > 0.0f) be.add_randn(target, n, cfg.seed, Stream::mx_label_noise, cfg.data.label_noise);
}

void make_probe_batch(Backend& be, const RunConfig& cfg, const NetShape& teacher, const float* teacher_params,
                      int64_t rows, float* x, float* y) {
  const size_t n = static_cast<size_t>(rows * cfg.model.width);
  StepScalars s;
  s.step = 0;
  be.set_step(s);
  if (cfg.data.kind == DataKind::tokens) {
    if (rows % cfg.data.seq_len != 0)
      throw Error(msg("log.probe_batch = ", rows, " is not a whole number of sequences of data.seq_len = ",
                      cfg.data.seq_len));
    be.token_batch(x, y, rows / cfg.data.seq_len, cfg.data.seq_len, cfg.data.vocab, cfg.seed, Stream::probe);
    be.synchronize();
    return;
  }
  Workspace tws = Workspace::make(be, teacher, rows);
  be.randn(x, n, cfg.seed, Stream::probe, 1.0f);
  forward(be, teacher, teacher_params, x, tws, fp32_policy(cfg));
  be.copy(y, tws.out, n);
  s.step = 1;
  be.set_step(s);
  if (cfg.data.label_noise > 0.0f) be.add_randn(y, n, cfg.seed, Stream::probe, cfg.data.label_noise);
  be.synchronize();
}

StepScalars step_scalars(const RunConfig& cfg, int64_t t) {
  StepScalars s;
  s.step = static_cast<uint32_t>(t);
  const auto& o = cfg.optimizer;
  const auto& sc = cfg.schedule;
  double lr = o.lr;
  if (sc.warmup > 0 && t < sc.warmup) {
    lr = o.lr * static_cast<double>(t + 1) / static_cast<double>(sc.warmup);
  } else if (sc.name == SchedKind::cosine) {
    const double span = std::max<double>(1.0, static_cast<double>(cfg.steps - sc.warmup));
    const double progress = std::min(1.0, static_cast<double>(t - sc.warmup) / span);
    lr = sc.lr_min + 0.5 * (o.lr - sc.lr_min) * (1.0 + std::cos(M_PI * progress));
  }
  s.lr = static_cast<float>(lr);
  s.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(o.beta1), static_cast<double>(t + 1)));
  s.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(t + 1)));
  return s;
}

void optimizer_step(Backend& be, const RunConfig& cfg, float* params, const float* grads, float* m, float* v,
                    size_t n) {
  const auto& o = cfg.optimizer;
  switch (o.name) {
    case OptKind::adam:
    case OptKind::adamw: {
      Backend::AdamHyper h;
      h.beta1 = o.beta1;
      h.beta2 = o.beta2;
      h.eps = o.eps;
      h.weight_decay = o.weight_decay;
      h.decoupled = o.name == OptKind::adamw;
      be.adam(params, grads, m, v, n, h);
      break;
    }
    case OptKind::sgd:
      be.sgd(params, grads, m, n, o.momentum, o.weight_decay);
      break;
  }
}

}  // namespace mxlab
