// The CPU (reference) backend: plain loops and Eigen, never clever. See lab/model/backend.h.
#pragma once
#include <memory>

#include "lab/model/backend.h"

namespace mxlab {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace mxlab
