// Checkpoints: the full training state of a paired run at the start of a step, so that a
// killed run resumes bit-identically and interventions can branch after the fact.
//
// File format (version 1), little-endian, written atomically (temp file + fsync + rename):
//   "MXLABCKP" | u32 version | u32 header_len | header (text, key=value lines) |
//   per trajectory, in header order: params, m, v [num_params f32 each], loss history [steps f32] |
//   per trajectory with t<i>.dwq_err_prev = N, in header order: N f32 |
//   u64 FNV-1a-64 checksum of every preceding byte | "MXLABEND"
// Header keys: config_hash, step, steps, num_params, trajectories (comma list), and per
// trajectory t<i>.{name,started,stopped,start_step,bias_avg,bias_avg_weight,cross_sq_avg,
// cross_sq_avg_weight,rows_logged,last_loss,max_bias_ratio,max_gamma_lastbin,group} (the
// cross_sq_avg keys may be absent in files of earlier builds: the averages then start from zero)
// (doubles written as hex floats, exact); attention networks add, once set, t<i>.delta_bias_cumsum
// (comma list, one hex float per layer: attn_delta_bias_cumsum) and t<i>.dwq_err_prev (N = depth *
// d * d: the W_Q error of attn_dwq_err_cos's previous row, its floats after the fixed part; absent
// in files of earlier builds, whose next cosine is then NaN). Only trajectories that have started
// (or were marked stopped) by the checkpoint's step are saved: a branch that has not started yet is
// rebuilt from the baseline at its `at`. Size: (3 * num_params + steps) * 4 bytes per saved
// trajectory, plus 4 N bytes per t<i>.dwq_err_prev.
// A file whose checksum, size, version or config hash does not match is refused with a message
// saying which and what to do.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/train/trainer.h"

namespace mxlab {

constexpr uint32_t kCheckpointVersion = 1;

// Path of the checkpoint of run `run_id` in `dir` at `step`: <dir>/<run_id>.step<step>.ckpt
std::string checkpoint_path(const std::string& dir, const std::string& run_id, int64_t step);
// Checkpoint steps present for a run, ascending.
std::vector<int64_t> list_checkpoints(const std::string& dir, const std::string& run_id);

// Save the trainer's state (at the start of trainer.step()).
void save_checkpoint(Trainer& trainer, const std::string& config_hash, const std::string& path);
// Restore a trainer built from the same configuration. Throws mxlab::Error for a corrupted,
// truncated, foreign (other config hash) or incompatible file.
void load_checkpoint(Trainer& trainer, const std::string& config_hash, const std::string& path);
// Read and verify only the header (step) of a checkpoint; throws like load_checkpoint.
int64_t checkpoint_step(const std::string& path, const std::string& config_hash);

}  // namespace mxlab
