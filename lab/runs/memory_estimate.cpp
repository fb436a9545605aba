// Memory lower bounds of a run (see memory_estimate.h). The counts follow lab/model/mlp.cpp
// (layout, Workspace::make) and lab/train/trainer.cpp (Trainer::Trainer), keeping only the
// largest terms, so the estimate never exceeds what a run really allocates.
#include "lab/runs/memory_estimate.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "lab/core/error.h"

namespace mxlab {

namespace {

using LD = long double;

// Hidden widths of a block (lab/model/mlp.cpp: swiglu_hidden, NetShape::student).
void hidden_widths(const ModelConfig& m, LD* hidden, LD* hidden_in) {
  const LD d = m.width, mult = m.hidden_mult;
  if (m.activation == Act::swiglu) {
    *hidden = (2 * mult * d + 1) / 3;
    *hidden_in = 2 * *hidden;
  } else {
    *hidden = mult * d;
    *hidden_in = *hidden;
  }
}

// Student parameters: per layer W1 [H1 x d], W2 [d x H], and with attention Wqkv [3d x d], Wo [d x d].
LD student_params(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  LD h = 0, h1 = 0;
  hidden_widths(m, &h, &h1);
  const LD d = m.width;
  LD per_layer = (h + h1) * d;
  if (m.block == BlockKind::attention) per_layer += 4 * d * d;
  return per_layer * static_cast<LD>(m.depth) + 2 * static_cast<LD>(cfg.vocab()) * d;  // + embedding, unembedding
}

// Teacher parameters: at least one [width x d] matrix per block.
LD teacher_params(const RunConfig& cfg) {
  const LD depth = cfg.teacher.depth > 0 ? cfg.teacher.depth : cfg.model.depth;
  const LD width = cfg.teacher.width > 0 ? cfg.teacher.width : cfg.model.width;
  return depth * width * static_cast<LD>(cfg.model.width);
}

// Activations one pass keeps (Workspace::make): per layer the block input [rows x d], the hidden
// pre- and post-activation [rows x H1], [rows x H]; with attention the probabilities
// [batch x heads x seq_len x seq_len].
LD pass_activations(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  LD h = 0, h1 = 0;
  hidden_widths(m, &h, &h1);
  const LD rows = static_cast<LD>(cfg.data.batch) * cfg.data.seq_len;
  LD per_layer = rows * (static_cast<LD>(m.width) + h + h1);
  if (m.block == BlockKind::attention)
    per_layer += static_cast<LD>(cfg.data.batch) * m.heads * static_cast<LD>(cfg.data.seq_len) * cfg.data.seq_len;
  return per_layer * static_cast<LD>(m.depth) + 2 * rows * static_cast<LD>(cfg.vocab());  // + logits, their gradient
}

// MX arms of a run (no `arms:` is the one arm `mx`); `arms` > 0 overrides.
size_t arm_count(const RunConfig& cfg, size_t arms) { return arms > 0 ? arms : std::max<size_t>(1, cfg.arms.size()); }

}  // namespace

long double run_memory_bytes(const RunConfig& cfg, size_t arms_override) {
  const LD p = student_params(cfg);
  const LD arms = static_cast<LD>(arm_count(cfg, arms_override));
  const LD mx = arms + static_cast<LD>(cfg.interventions.size());  // MX trajectories
  // Per trajectory: params, grads, m, v, prev (5 P), one pass's activations and the loss of every
  // step; MX ones add the shadow copy.
  const LD per_trajectory = 5 * p + pass_activations(cfg) + static_cast<LD>(std::max(cfg.steps, 1));
  // The probe batch (inputs and targets) of snapshots and curvature.
  const bool probe = cfg.log.curvature_every > 0 || cfg.log.snapshot_every > 0 || !cfg.log.snapshot_steps.empty();
  const LD probe_rows = cfg.log.probe_batch > 0 ? cfg.log.probe_batch : static_cast<LD>(cfg.data.batch) * cfg.data.seq_len;
  const LD floats = (1 + mx) * per_trajectory + mx * p + teacher_params(cfg) +
                    (probe ? 2 * probe_rows * static_cast<LD>(cfg.model.width) : 0);
  return floats * 4;
}

long double run_host_setup_bytes(const RunConfig& cfg) { return (student_params(cfg) + teacher_params(cfg)) * 4; }

uint64_t usable_host_memory() {
  uint64_t limit = std::numeric_limits<uint64_t>::max();
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) limit = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  for (int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    struct rlimit rl {};
    if (::getrlimit(resource, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      limit = std::min<uint64_t>(limit, static_cast<uint64_t>(rl.rlim_cur));
  }
  return limit;
}

std::string format_bytes(long double bytes) {
  const LD max64 = static_cast<LD>(std::numeric_limits<uint64_t>::max());
  if (!(bytes < max64)) return msg("more than ", std::numeric_limits<uint64_t>::max(), " bytes");
  const uint64_t n = static_cast<uint64_t>(bytes + 0.5L);
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (n < 1024) return msg(n, " bytes");
  LD v = static_cast<LD>(n) / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < sizeof kUnits / sizeof kUnits[0]) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.1f" : "%.0f", static_cast<double>(v));
  return msg(n, " bytes (", buf, " ", kUnits[u], ")");
}

void check_run_fits_memory(const RunConfig& cfg, bool on_cpu, const std::string& who, size_t arms) {
  const LD need = on_cpu ? run_memory_bytes(cfg, arms) : run_host_setup_bytes(cfg);
  const uint64_t have = usable_host_memory();
  if (need <= static_cast<LD>(have)) return;
  const size_t trajectories = 1 + arm_count(cfg, arms) + cfg.interventions.size();
  const std::string what = on_cpu ? msg("of memory for the parameters, optimizer state and activations of its ",
                                        trajectories, " trajectories")
                                  : std::string("of host memory to build its initial parameters");
  throw Error(msg(who, ": needs at least ", format_bytes(need), " ", what, " (model.width ", cfg.model.width,
                  ", model.depth ", cfg.model.depth, ", data.batch ", cfg.data.batch, " x data.seq_len ",
                  cfg.data.seq_len, "), more than this machine offers (", format_bytes(static_cast<LD>(have)),
                  "): reduce model.width, model.depth, data.batch or data.seq_len"));
}

}  // namespace mxlab
