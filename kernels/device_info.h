// What a run records about the GPU it ran on (HDF5 root attributes).
#pragma once
#include <string>

namespace mxlab::cuda {

struct DeviceInfo {
  int index = -1;
  std::string name;             // e.g. "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::string cuda_runtime;     // e.g. "13.0"
  std::string cuda_driver;
  std::string cublas;           // e.g. "13.0.0"
};

// Number of CUDA devices (0 when there is no driver or device; never throws).
int device_count();
// Throws mxlab::Error when `index` is not a usable device.
DeviceInfo device_info(int index);

}  // namespace mxlab::cuda
