// The data a step trains on (DESIGN.md section 1) and the fixed probe batch of the instruments,
// as pure functions of the configuration (seed) and the step: the trainer, `mxlab eval` and the
// tests build them through here, so that they are the same bits everywhere.
#pragma once
#include <cstdint>
#include <vector>

#include "lab/model/backend.h"
#include "lab/model/mlp.h"
#include "lab/config/config.h"

namespace mxlab {

// The fixed teacher's parameters (its own init stream, PyTorch-default init).
std::vector<float> teacher_params_host(const RunConfig& cfg, const NetShape& teacher);

// The batch of the current step (StepScalars.step must already be the step): x = N(0, 1) from
// (seed, data, step) into `x` [B x d]; target = teacher(x) + label_noise * N(0, 1) from (seed,
// label_noise, step) into teacher_ws.out. data.kind: tokens: Backend::token_batch from (seed, data,
// step): the token ids into x [B], the next tokens into teacher_ws.out [B] (the teacher is not run;
// there is no label noise).
void make_batch(Backend& be, const RunConfig& cfg, const NetShape& teacher, const float* teacher_params, float* x,
                Workspace& teacher_ws);

// The MX trajectories' targets with data.mx_teacher_targets (the paper code's path): teacher(x)
// under the trajectory's precision policy `pol` (its GEMM operands quantized as the student's)
// into teacher_ws, plus label_noise * N(0, 1) from (seed, mx_label_noise, step), into `target`.
void make_mx_targets(Backend& be, const RunConfig& cfg, const NetShape& teacher, const float* teacher_params,
                     const float* x, Workspace& teacher_ws, const PassPolicy& pol, float* target);

// The probe batch of `rows` rows: x from (seed, probe) with counter word 0, y = teacher(x) +
// label noise from word 1. Sets StepScalars (to words 0 and 1) and synchronises. data.kind: tokens:
// token_batch from (seed, probe, 0), ids into x [rows], next tokens into y [rows].
void make_probe_batch(Backend& be, const RunConfig& cfg, const NetShape& teacher, const float* teacher_params,
                      int64_t rows, float* x, float* y);

// The scalars of step t (0-based): the learning rate after warmup and schedule, and Adam's bias
// corrections 1 - beta^(t + 1), computed on the host once (so both backends use the same floats).
StepScalars step_scalars(const RunConfig& cfg, int64_t t);

// One optimizer update of a trajectory's n parameters from its gradient (optimizer.name: adam,
// adamw or sgd; m is SGD's momentum buffer, v unused there), with the backend's current
// StepScalars. The trainer's update and `mxlab dump-step`'s.
void optimizer_step(Backend& be, const RunConfig& cfg, float* params, const float* grads, float* m, float* v,
                    size_t n);

}  // namespace mxlab
