// make_backend(): maps a device string to a backend (backends.h). The only file that knows every
// backend, compiled into the mxlab_backends library (it links the CUDA backend when it was built).
#include <cstdlib>
#include <string>

#include "lab/core/error.h"
#include "lab/backends/backends.h"
#include "lab/cpu/cpu_backend.h"
#ifdef MXLAB_HAVE_CUDA
#include "kernels/cuda_backend.h"
#include "kernels/device_info.h"
#endif

namespace mxlab {

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "auto") {
#ifdef MXLAB_HAVE_CUDA
    if (cuda::device_count() > 0) return make_cuda_backend(0);
#endif
    return make_cpu_backend();
  }
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (device.size() > 5) {
      char* end = nullptr;
      const long v = std::strtol(device.c_str() + 5, &end, 10);
      if (*end != '\0' || v < 0) throw Error(msg("bad device '", device, "' (use cpu, auto, cuda or cuda:N)"));
      index = static_cast<int>(v);
    }
#ifdef MXLAB_HAVE_CUDA
    return make_cuda_backend(index);
#else
    (void)index;
    throw Error(msg("device '", device, "' requested but this mxlab was built without CUDA (use --device cpu)"));
#endif
  }
  throw Error(msg("unknown device '", device, "' (use cpu, auto, cuda or cuda:N)"));
}

}  // namespace mxlab
