// Reading what `mxlab bench` and `mxlab run` wrote, for the tests that check that bench times the
// run's own step (tests/cpu/test_bench_step.cpp, tests/gpu/test_bench_step_gpu.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "lab/io/h5file.h"

namespace mxlab::test {

// The number after "key": in the last (JSON) line of bench's output, or NaN.
inline double json_number(const std::string& out, const std::string& key) {
  const size_t p = out.rfind("\"" + key + "\":");
  if (p == std::string::npos) return std::nan("");
  return std::strtod(out.c_str() + p + key.size() + 3, nullptr);
}

// Trajectory `traj`'s loss at `step` in a run file, or NaN past its end.
inline float run_loss(const std::string& file, const std::string& traj, int64_t step) {
  const h5::H5File f(file, h5::H5File::Mode::read);
  const std::vector<double> l = f.read_doubles("trajectories/" + traj + "/loss_all");
  return step < static_cast<int64_t>(l.size()) ? static_cast<float>(l[static_cast<size_t>(step)]) : NAN;
}

}  // namespace mxlab::test
