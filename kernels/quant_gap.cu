// Quantization-gap kernels (see quant_gap.cuh). The CPU reference sums each chunk of
// kQuantGapChunk flat indices in index order, then the chunk sums in chunk order; only those sums
// depend on order (the counts are integers held exactly in doubles, the maximum ignores order),
// so the kernels run them as chains in the same order and take the rest across a warp at once.
// The double results agree with the CPU's bit for bit.
//   - one pass (gap_one_pass_kernel, v14): one warp per chunk computes its elements itself and
//     folds them (scalar formats; MX blocks of 32 along whole-block rows: a warp's 32 elements
//     are one block);
//   - else pass 1 writes each element's rel and flag (one thread per MX block, as
//     mx_generic_kernel walks blocks; one per element for scalar formats) and pass 2 folds
//     them a warp per chunk;
//   - then one warp adds the chunk partials (gap_final_kernel).
// A warp reads 32 consecutive values at a time (coalesced); every lane runs the sum's chain,
// taking each value from its lane by a shuffle, unrolled so that the shuffles issue ahead of the
// chain. (Before v14 every lane also folded the maximum and the counts one element at a time,
// and before that one thread per chunk read 1024 values 8 KB apart from its neighbours'.)
#include "kernels/quant_gap.cuh"

#include "kernels/launch_util.cuh"
#include "lab/model/instrument_elementwise.h"
#include "lab/mx/scalar.h"

namespace mxlab::cuda {

namespace {

constexpr double kFlagClamped = 1.0;
constexpr double kFlagNonfinite = 2.0;
constexpr int kPartialWords = 5;  // sum, max, above, n, nonfinite

struct GapParams {
  const float* x;
  int64_t rows, cols;
  QuantSpec q;
  bool round_first;
  Rounding bf16_mode;
  const StepScalars* d_step;
  double* rel;   // [n]
  double* flag;  // [n]
};

__device__ float input_v(const GapParams& p, int64_t i) {
  return p.round_first ? round_bf16(p.x[i], p.bf16_mode) : p.x[i];
}

__global__ void __launch_bounds__(kBlock) gap_mx_kernel(GapParams p, ElemSpec es, Axis axis) {
  const bool contiguous = axis == Axis::contiguous;
  const int64_t lines = contiguous ? p.rows : p.cols;
  const int64_t length = contiguous ? p.cols : p.rows;
  const int64_t k = p.q.block;
  const int64_t nb = (length + k - 1) / k;
  const uint32_t salt = p.d_step->step;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < lines * nb;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t line = contiguous ? u / nb : u % lines;
    const int64_t begin = (contiguous ? u % nb : u / lines) * k;
    const int64_t end = begin + k < length ? begin + k : length;
    auto index = [&](int64_t pos) { return contiguous ? line * p.cols + pos : pos * p.cols + line; };
    float amax = 0.0f;
    bool special = false;
    for (int64_t q = begin; q < end; ++q) {
      const float v = input_v(p, index(q));
      special |= !is_finite_bits(f32_bits(v));
      amax = fmaxf(amax, fabsf(v));
    }
    const int s = special ? 0 : shared_exponent(amax, es, p.q.rule, p.q.bump);
    for (int64_t q = begin; q < end; ++q) {
      const int64_t idx = index(q);
      if (special) {
        p.rel[idx] = 0.0;
        p.flag[idx] = kFlagNonfinite;
        continue;
      }
      const uint32_t rnd = p.q.rounding == Rounding::stochastic
                               ? philox(p.q.seed, Stream::stochastic_round, salt, static_cast<uint64_t>(idx)).v[0]
                               : 0u;
      const ElemResult e = quantize_element(input_v(p, idx), s, es, p.q.rounding, rnd);
      p.rel[idx] = quant_gap_rel(p.x[idx], e.value);
      p.flag[idx] = e.clamped ? kFlagClamped : 0.0;
    }
  }
}

__global__ void __launch_bounds__(kBlock) gap_scalar_kernel(GapParams p) {
  const int64_t n = p.rows * p.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = input_v(p, i);
    const float qv = p.q.fmt == NumFmt::bf16 ? round_bf16(v, p.q.rounding)
                                             : (p.q.fmt == NumFmt::fp16 ? round_fp16(v, p.q.rounding) : v);
    const bool bad = !is_finite_bits(f32_bits(p.x[i])) || !is_finite_bits(f32_bits(qv));
    p.rel[i] = bad ? 0.0 : quant_gap_rel(p.x[i], qv);
    p.flag[i] = bad ? kFlagNonfinite : 0.0;
  }
}

constexpr unsigned kFullMask = 0xffffffffu;

// A chunk's running partials. Only `sum` depends on the order of the additions (the CPU's: index
// order); the counts are integers held exactly in doubles and the maximum of the non-NaN values is
// the same in any order (fmax drops NaN, as the CPU's std::max(acc, NaN) keeps acc), so those are
// taken across the warp at once, and only the sum runs as a chain.
struct GapAcc {
  double sum = 0.0, mx = 0.0, above = 0.0, cnt = 0.0, bad = 0.0;
};

// Folds 32 consecutive elements' (rel, flag), lane j holding element j and lanes >= m none, into
// `a` (every lane ends with the same values). Elements of NaN/Inf blocks add 0.0 to the sum, which
// leaves it as it is (it is +0, positive or NaN), as the CPU's skipping them does.
__device__ __forceinline__ void fold_window(double r, double f, int m, GapAcc& a) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const bool in = lane < m;
  const bool bad = in && f == kFlagNonfinite;
  const bool good = in && !bad;
  a.bad += static_cast<double>(__popc(__ballot_sync(kFullMask, bad)));
  a.cnt += static_cast<double>(__popc(__ballot_sync(kFullMask, good)));
  a.above += static_cast<double>(__popc(__ballot_sync(kFullMask, good && f == kFlagClamped)));
  double wm = good ? r : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) wm = fmax(wm, __shfl_xor_sync(kFullMask, wm, o));
  a.mx = fmax(a.mx, wm);
  const double v = good ? r : 0.0;
  double sum = a.sum;
  if (m == 32) {
    // Unrolled: the 32 shuffles are independent of the chain and issue ahead of it.
#pragma unroll
    for (int j = 0; j < 32; ++j) sum += __shfl_sync(kFullMask, v, j);
  } else {
    for (int j = 0; j < m; ++j) sum += __shfl_sync(kFullMask, v, j);
  }
  a.sum = sum;
}

__device__ __forceinline__ void write_partials(double* partials, int64_t c, const GapAcc& a) {
  double* o = partials + kPartialWords * c;
  o[0] = a.sum;
  o[1] = a.mx;
  o[2] = a.above;
  o[3] = a.cnt;
  o[4] = a.bad;
}

// The one-pass path (v14): one warp per chunk computes each element's rel and flag itself and
// folds them at once, so nothing is written per element. Scalar formats (mx == false) need
// nothing but the element; MX blocks need `32 consecutive flat indices == one block`, i.e.
// blocks of 32 along the contiguous axis of rows that are whole blocks (quant_gap_one_pass):
// the warp's 32 lanes hold exactly one block, whose amax is a warp maximum (order-free: the
// maximum of finite floats is exact). Same scalar code and fold order as passes 1 and 2.
__global__ void __launch_bounds__(kBlock) gap_one_pass_kernel(GapParams p, ElemSpec es, bool mx_fmt, int64_t n,
                                                              int64_t chunks, double* partials) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const uint32_t salt = p.d_step->step;
  for (int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; c < chunks; c += warps) {
    GapAcc acc;
    const int64_t end = (c + 1) * kQuantGapChunk < n ? (c + 1) * kQuantGapChunk : n;
    for (int64_t base = c * kQuantGapChunk; base < end; base += 32) {
      const int64_t i = base + lane;
      const bool in = i < end;
      const float x = in ? p.x[i] : 0.0f;
      const float v = p.round_first ? round_bf16(x, p.bf16_mode) : x;
      double r = 0.0, f = 0.0;
      if (mx_fmt) {
        const bool special = __any_sync(kFullMask, in && !is_finite_bits(f32_bits(v)));
        float amax = 0.0f;
        if (!special) {
          amax = fabsf(v);
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
        }
        if (special) {
          f = kFlagNonfinite;
        } else if (in) {
          const int s = shared_exponent(amax, es, p.q.rule, p.q.bump);
          const uint32_t rnd = p.q.rounding == Rounding::stochastic
                                   ? philox(p.q.seed, Stream::stochastic_round, salt, static_cast<uint64_t>(i)).v[0]
                                   : 0u;
          const ElemResult e = quantize_element(v, s, es, p.q.rounding, rnd);
          r = quant_gap_rel(x, e.value);
          f = e.clamped ? kFlagClamped : 0.0;
        }
      } else if (in) {
        const float qv = p.q.fmt == NumFmt::bf16 ? round_bf16(v, p.q.rounding)
                                                 : (p.q.fmt == NumFmt::fp16 ? round_fp16(v, p.q.rounding) : v);
        const bool badv = !is_finite_bits(f32_bits(x)) || !is_finite_bits(f32_bits(qv));
        r = badv ? 0.0 : quant_gap_rel(x, qv);
        f = badv ? kFlagNonfinite : 0.0;
      }
      fold_window(r, f, end - base < 32 ? static_cast<int>(end - base) : 32, acc);
    }
    if (lane == 0) write_partials(partials, c, acc);
  }
}

// One warp per chunk (the loop bounds are the same in every lane of a warp).
__global__ void __launch_bounds__(kBlock) gap_chunk_kernel(const double* rel, const double* flag, int64_t n,
                                                          int64_t chunks, double* partials) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; c < chunks; c += warps) {
    GapAcc acc;
    const int64_t end = (c + 1) * kQuantGapChunk < n ? (c + 1) * kQuantGapChunk : n;
    for (int64_t base = c * kQuantGapChunk; base < end; base += 32) {
      const int64_t i = base + lane;
      const double r = i < end ? rel[i] : 0.0;
      const double f = i < end ? flag[i] : 0.0;
      fold_window(r, f, end - base < 32 ? static_cast<int>(end - base) : 32, acc);
    }
    if (lane == 0) write_partials(partials, c, acc);
  }
}

// One warp (launched with 32 threads): the chunk partials, the sums in chunk order (a chain, its
// shuffles unrolled ahead of it), the maximum and the counts across the warp (order-free, as in
// fold_window).
__global__ void gap_final_kernel(const double* partials, int64_t chunks, double* out) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  double sum = 0.0, mx = 0.0, above = 0.0, cnt = 0.0, bad = 0.0;
  for (int64_t base = 0; base < chunks; base += 32) {
    const int64_t c = base + lane;
    const bool in = c < chunks;
    const double* pc = partials + kPartialWords * c;
    const double ps = in ? pc[0] : 0.0;
    double pm = in ? pc[1] : 0.0;
    double pa = in ? pc[2] : 0.0, pn = in ? pc[3] : 0.0, pb = in ? pc[4] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      pm = fmax(pm, __shfl_xor_sync(kFullMask, pm, o));
      pa += __shfl_xor_sync(kFullMask, pa, o);  // integers below 2^53: exact in any order
      pn += __shfl_xor_sync(kFullMask, pn, o);
      pb += __shfl_xor_sync(kFullMask, pb, o);
    }
    mx = fmax(mx, pm);
    above += pa;
    cnt += pn;
    bad += pb;
    if (chunks - base >= 32) {
#pragma unroll
      for (int j = 0; j < 32; ++j) sum += __shfl_sync(kFullMask, ps, j);
    } else {
      const int m = static_cast<int>(chunks - base);
      for (int j = 0; j < m; ++j) sum += __shfl_sync(kFullMask, ps, j);
    }
  }
  if (lane == 0) {
    out[0] = sum;
    out[1] = mx;
    out[2] = above;
    out[3] = cnt;
    out[4] = bad;
  }
}

int64_t chunks_of(int64_t n) { return (n + kQuantGapChunk - 1) / kQuantGapChunk; }

}  // namespace

bool quant_gap_one_pass(int64_t cols, Axis axis, const QuantSpec& q) {
  if (!is_mx(q.fmt)) return true;
  return q.block == 32 && axis == Axis::contiguous && cols % 32 == 0;
}

int64_t quant_gap_scratch_doubles(int64_t rows, int64_t cols, Axis axis, const QuantSpec& q) {
  const int64_t n = rows * cols;
  return (quant_gap_one_pass(cols, axis, q) ? 0 : 2 * n) + kPartialWords * chunks_of(n) + 1;
}

void launch_quant_gap(const float* x, int64_t rows, int64_t cols, Axis axis, const QuantSpec& q,
                      bool round_bf16_first, Rounding bf16_mode, const StepScalars* d_step, double* scratch,
                      double* d_results, cudaStream_t s) {
  const int64_t n = rows * cols;
  const bool one_pass = quant_gap_one_pass(cols, axis, q);
  GapParams p{x, rows, cols, q, round_bf16_first, bf16_mode, d_step, scratch, scratch + n};
  double* partials = one_pass ? scratch : scratch + 2 * n;
  // (kElemSpecs read directly: nvcc rejects the HD accessor elem_spec() in host code here.)
  const ElemSpec es = is_mx(q.fmt) ? kElemSpecs[static_cast<int>(mx_elem(q.fmt))] : ElemSpec{};
  if (n > 0 && one_pass) {
    gap_one_pass_kernel<<<grid_for(32 * chunks_of(n)), kBlock, 0, s>>>(p, es, is_mx(q.fmt), n, chunks_of(n),
                                                                       partials);
    MXLAB_CUDA_LAUNCH_CHECK();
  } else if (n > 0) {
    if (is_mx(q.fmt)) {
      const int64_t lines = axis == Axis::contiguous ? rows : cols;
      const int64_t length = axis == Axis::contiguous ? cols : rows;
      gap_mx_kernel<<<grid_for(lines * ((length + q.block - 1) / q.block)), kBlock, 0, s>>>(p, es, axis);
    } else {
      gap_scalar_kernel<<<grid_for(n), kBlock, 0, s>>>(p);
    }
    MXLAB_CUDA_LAUNCH_CHECK();
    gap_chunk_kernel<<<grid_for(32 * chunks_of(n)), kBlock, 0, s>>>(p.rel, p.flag, n, chunks_of(n), partials);
    MXLAB_CUDA_LAUNCH_CHECK();
  }
  gap_final_kernel<<<1, 32, 0, s>>>(partials, chunks_of(n), d_results);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
