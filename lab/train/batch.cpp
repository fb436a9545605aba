// Step batches and the probe batch (see batch.h).
#include "lab/train/batch.h"

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
  Workspace tws = Workspace::make(be, teacher, rows);
  StepScalars s;
  s.step = 0;
  be.set_step(s);
  be.randn(x, n, cfg.seed, Stream::probe, 1.0f);
  forward(be, teacher, teacher_params, x, tws, fp32_policy(cfg));
  be.copy(y, tws.out, n);
  s.step = 1;
  be.set_step(s);
  if (cfg.data.label_noise > 0.0f) be.add_randn(y, n, cfg.seed, Stream::probe, cfg.data.label_noise);
  be.synchronize();
}

}  // namespace mxlab
