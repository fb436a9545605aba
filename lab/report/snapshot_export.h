// Parameter snapshots of a run file (lab/train/SCHEMA.md, "Snapshots") as NumPy .npy files:
// `mxlab export RUN.h5 --snapshot S --npy DIR`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mxlab {

// Steps at which `run` holds snapshots of any trajectory, ascending.
std::vector<int64_t> snapshot_steps_in(const std::string& run);

// Write every snapshot of step `step` as DIR/<trajectory>/<group>.npy (Adam's moments, when
// stored, as DIR/<trajectory>/m/<group>.npy and .../v/<group>.npy) and the probe batch as
// DIR/probe_x.npy, DIR/probe_y.npy; float32, the shapes of the HDF5 datasets. Returns the paths
// written. Throws mxlab::Error when the file has no snapshot at `step` (naming the steps it has).
std::vector<std::string> export_snapshot_npy(const std::string& run, int64_t step, const std::string& dir);

}  // namespace mxlab
