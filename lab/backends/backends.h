// Choosing a backend by device string. This folder sits above the model layer and both
// backends: lab/model/ defines the Backend interface, lab/cpu/ and kernels/ implement it, and
// only make_backend (lab/backends/make_backend.cpp, library mxlab_backends) knows them all,
// so nothing in lab/model/ depends on what implements it.
#pragma once
#include <memory>
#include <string>

#include "lab/model/backend.h"

namespace mxlab {

// Create a backend from a device string: "cpu", "cuda", "cuda:N" or "auto" (cuda:0 when a
// CUDA device is usable, else cpu). Throws mxlab::Error for unknown or unavailable devices.
std::unique_ptr<Backend> make_backend(const std::string& device);

}  // namespace mxlab
