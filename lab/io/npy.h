// Reading and writing float32 NumPy .npy files (format versions 1.0, 2.0 and 3.0), the
// exchange format of `mxlab quantize` with Python. Only what the lab needs: dtype float32
// ('<f4', or '>f4' which is byte-swapped on read), C order, rank 1 to 32 (kNpyMaxDims). Everything else
// is refused with an mxlab::Error that names the file, what is wrong and how to fix it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mxlab {

// The most dimensions an .npy file may have: what every NumPy reads (NumPy 1's NPY_MAXDIMS;
// NumPy 2 raised it to 64). Reading and writing refuse more, naming the limit.
constexpr size_t kNpyMaxDims = 32;

struct NpyArray {
  std::vector<int64_t> shape;  // rank >= 1, C (row-major) order
  std::vector<float> data;     // product(shape) values

  int64_t size() const;
  // The array as a (rows x cols) matrix: cols = last dim, rows = product of the others.
  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  int64_t rows() const;
};

// Parse an .npy image held in memory; `what` names the source in error messages.
NpyArray parse_npy(const std::string& bytes, const std::string& what);
// Read a float32 C-order .npy file. Throws mxlab::Error on any problem.
NpyArray read_npy(const std::string& path);

// The bytes of a version-1.0 .npy file (version 2.0 if the header would not fit).
std::string encode_npy(const std::vector<int64_t>& shape, const float* data);
// Write atomically: to a temporary file beside `path`, then rename over it, so a reader
// never sees a partial file and a failure leaves no file behind.
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const float* data);

}  // namespace mxlab
