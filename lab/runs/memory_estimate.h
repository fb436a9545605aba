// How much memory a run needs, from its configuration alone, so that a model too large for the
// machine is refused with the number of bytes before anything is allocated (instead of ending
// in std::bad_alloc, or in the kernel's out-of-memory killer, halfway through building it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "lab/config/config.h"

namespace mxlab {

// A lower bound of the bytes one run keeps in its backend's memory: per trajectory (FP32, every
// arm, every intervention branch) its parameters, gradients, Adam moments and previous
// parameters (plus the shadow copy for MX trajectories), the activations of one pass (every
// layer's input, hidden pre- and post-activation, the attention probabilities) and the loss of
// every step; the teacher's parameters; the probe batch of snapshots and curvature. Computed in floating point from the configuration's integers, so that
// no size overflows however large the configuration.
// `arms` > 0 stands for that many arms instead of cfg.arms (`mxlab bench --arms K`).
long double run_memory_bytes(const RunConfig& cfg, size_t arms = 0);
// A lower bound of the bytes the host holds while a run on a GPU is set up: the student's and
// the teacher's initial parameters, built on the host and uploaded.
long double run_host_setup_bytes(const RunConfig& cfg);

// The memory this process may use: the machine's physical memory, or less where an address
// space or data limit (ulimit -v / -d) is set.
uint64_t usable_host_memory();

// Throws mxlab::Error (exit 2) when the run cannot fit: on the CPU (`on_cpu`) when
// run_memory_bytes exceeds usable_host_memory; on a GPU when even run_host_setup_bytes does.
// `who` names the run in the message (e.g. "run 3 (a1b2c3d4e5f6)" or the experiment file).
void check_run_fits_memory(const RunConfig& cfg, bool on_cpu, const std::string& who, size_t arms = 0);

// A byte count as text: the exact integer and a readable size, e.g. "105553116266496 bytes
// (96 TiB)"; beyond 64 bits "more than 18446744073709551615 bytes". Never floating notation.
std::string format_bytes(long double bytes);

}  // namespace mxlab
