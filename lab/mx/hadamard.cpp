// CPU reference of the block Hadamard rotation (hadamard.h): one block at a time, gathered into
// a buffer, signed, transformed by hadamard_transform, scaled and scattered back.
#include "lab/mx/hadamard.h"

#include <vector>

#include "lab/core/error.h"

namespace mxlab {

const char* rotation_shape_problem(int64_t length, int64_t period, const RotationSpec& r) {
  if (!is_rotation_block(r.block)) return "the Hadamard block must be a power of two from 2 to 4096";
  if (period <= 0 || period % r.block != 0) return "the reduction length is not a multiple of the Hadamard block";
  if (length % period != 0) return "the tensor's length along the axis is not a multiple of the reduction length";
  return "";
}

void hadamard_rotate(const float* in, float* out, int64_t rows, int64_t cols, Axis axis, int64_t period,
                     const RotationSpec& r) {
  if (rows < 0 || cols < 0) throw Error(msg("hadamard_rotate: negative shape ", rows, " x ", cols));
  const int64_t length = axis == Axis::contiguous ? cols : rows;
  const int64_t lines = axis == Axis::contiguous ? rows : cols;
  if (const char* problem = rotation_shape_problem(length, period, r); *problem)
    throw Error(msg("hadamard_rotate: ", problem, " (block ", r.block, ", reduction length ", period, ", length ",
                    length, ")"));
  const int n = r.block;
  const float scale = hadamard_scale(n);
  std::vector<float> v(static_cast<size_t>(n));
  auto index = [&](int64_t line, int64_t pos) { return axis == Axis::contiguous ? line * cols + pos : pos * cols + line; };
  for (int64_t line = 0; line < lines; ++line)
    for (int64_t b = 0; b < length; b += n) {
      for (int i = 0; i < n; ++i)
        v[i] = rotation_signed(in[index(line, b + i)], r.random_signs, r.seed, r.salt, (b + i) % period);
      hadamard_transform(v.data(), n);
      for (int i = 0; i < n; ++i) out[index(line, b + i)] = hadamard_output(v[i], scale);
    }
}

}  // namespace mxlab
