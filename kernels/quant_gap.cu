// Quantization-gap kernels (see quant_gap.cuh). The CPU reference sums each chunk of
// kQuantGapChunk flat indices in index order, then the chunk sums in chunk order; only those sums
// depend on order (the counts are integers held exactly in doubles, the maximum ignores order),
// so the kernels run them as chains in the same order and take the rest across a warp at once.
// The double results agree with the CPU's bit for bit.
//   - one pass (gap_one_pass_kernel, a block per chunk): the chunk's elements
//     are computed and folded where they are read (scalar formats; MX blocks of 32 along
//     whole-block rows: a warp's 32 elements are one block);
//   - else pass 1 writes each element's rel and flag (one thread per MX block, as
//     mx_generic_kernel walks blocks; one per element for scalar formats) and pass 2 folds
//     them a warp per chunk;
//   - then one block adds the chunk partials (gap_final_kernel: the sums' chain in one thread,
//     from shared memory).
// A warp reads 32 consecutive values at a time (coalesced; in the one-pass kernel kGapIlp windows
// per warp, the chunk's sum chained by thread 0 from shared memory); in the two-pass
// path every lane runs the sum's chain, taking each value from its lane by a shuffle. (Before,
// every lane also folded the maximum and the counts one element at a time and one warp
// folded the chunk partials so; before that one thread per chunk read 1024 values 8 KB apart
// from its neighbours'.)
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

constexpr uint32_t kGapQuietNaN = 0x7FC00000u;  // what the quantizer writes for a NaN block

struct GapElem {
  double rel, flag;
};

// One element of an MX block with the quantizer's scale s (kScaleExpNaN: the quantizer writes
// NaN): Q as the quantizer makes it (quantize_element), then rel and the flag, nonfinite where
// quant_gap_counts says so (the CPU's rule, from the same Q).
__device__ __forceinline__ GapElem gap_elem(const GapParams& p, float v, float x, int s, const ElemSpec& es,
                                            uint32_t salt, int64_t idx) {
  float qv = bits_f32(kGapQuietNaN);
  bool clamped = false;
  if (s != kScaleExpNaN) {
    const uint32_t rnd = element_word(p.q.rounding, p.q.seed, salt, static_cast<uint64_t>(idx));
    const ElemResult e = quantize_element(v, s, es, p.q.rounding, rnd);
    qv = e.value;
    clamped = e.clamped;
  }
  if (!quant_gap_counts(x, qv)) return GapElem{0.0, kFlagNonfinite};
  return GapElem{quant_gap_rel(x, qv), clamped ? kFlagClamped : 0.0};
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
    // The quantizer's scale (NaN for a block holding NaN/Inf or beyond E8M0: every element NaN).
    const int s = block_scale_exp(special ? bits_f32(kGapQuietNaN) : amax, es, p.q.rule, p.q.bump);
    for (int64_t q = begin; q < end; ++q) {
      const int64_t idx = index(q);
      const GapElem g = gap_elem(p, input_v(p, idx), p.x[idx], s, es, salt, idx);
      p.rel[idx] = g.rel;
      p.flag[idx] = g.flag;
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
    const bool bad = !quant_gap_counts(p.x[i], qv);
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

// The order-free part of folding 32 consecutive elements' (rel, flag), lane j holding element j
// and lanes >= m none, into `a` (every lane ends with the same values); returns the value this
// lane's element adds to the sum: rel, or 0.0 for an element of a NaN/Inf block or none, which
// leaves the sum as it is (it is +0, positive or NaN), as the CPU's skipping them does.
__device__ __forceinline__ double fold_counts(double r, double f, int m, GapAcc& a) {
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
  return good ? r : 0.0;
}

// fold_counts, then the sum in index order in every lane (the two-pass path's chunk fold).
__device__ __forceinline__ void fold_window(double r, double f, int m, GapAcc& a) {
  const double v = fold_counts(r, f, m, a);
  double sum = a.sum;
  if (m == 32) {
    // Unrolled: the 32 shuffles are independent of the chain and can issue ahead of it.
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

// The one-pass path: a block per chunk (a warp per chunk, as it ran first, which left ~8 warps
// per SM, 12 % occupancy, latency-bound) computes each element's rel and flag itself and folds
// them at once, so nothing is written per element. Scalar formats (mx == false) need nothing but
// the element; MX blocks need `32 consecutive flat indices == one block`, i.e. blocks of 32 along
// the contiguous axis of rows that are whole blocks (quant_gap_one_pass): a warp's 32 lanes hold
// exactly one block per window, whose amax is a warp maximum (order-free: the maximum of finite
// floats is exact). Each of the block's kBlock / 32 warps takes kGapIlp consecutive windows of 32
// (their loads, block maxima and element quantizations are independent, so they overlap), folds
// their counts and maxima across the warp and writes the sum's terms (0.0 where none: adding +0
// to the sum leaves it as it is) into shared memory; thread 0 then adds the chunk's terms in
// index order (the CPU's chain) and the warps' counts and maxima. Same scalar code and fold order
// as passes 1 and 2.
constexpr int kGapIlp = 4;
static_assert(kBlock / 32 * kGapIlp * 32 == kQuantGapChunk, "a block of the one-pass kernel covers one chunk");

__global__ void __launch_bounds__(kBlock) gap_one_pass_kernel(GapParams p, ElemSpec es, bool mx_fmt, int64_t n,
                                                              int64_t chunks, double* partials) {
  __shared__ double terms[kQuantGapChunk];
  __shared__ double red[4][kBlock / 32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const uint32_t salt = p.d_step->step;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    GapAcc acc;  // counts and maximum of this warp's windows (the same in every lane)
    const int64_t end = (c + 1) * kQuantGapChunk < n ? (c + 1) * kQuantGapChunk : n;
    const int64_t base = c * kQuantGapChunk + static_cast<int64_t>(warp) * 32 * kGapIlp;
    float x[kGapIlp], v[kGapIlp], amax[kGapIlp];
    bool in[kGapIlp], special[kGapIlp];
#pragma unroll
    for (int g = 0; g < kGapIlp; ++g) {
      const int64_t i = base + 32 * g + lane;
      in[g] = i < end;
      x[g] = in[g] ? p.x[i] : 0.0f;
      v[g] = p.round_first ? round_bf16(x[g], p.bf16_mode) : x[g];
    }
    if (mx_fmt) {
#pragma unroll
      for (int g = 0; g < kGapIlp; ++g) {
        special[g] = __any_sync(kFullMask, in[g] && !is_finite_bits(f32_bits(v[g])));
        amax[g] = special[g] ? 0.0f : fabsf(v[g]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int g = 0; g < kGapIlp; ++g) amax[g] = fmaxf(amax[g], __shfl_xor_sync(kFullMask, amax[g], o));
    }
#pragma unroll
    for (int g = 0; g < kGapIlp; ++g) {
      const int64_t i = base + 32 * g + lane;
      double r = 0.0, f = 0.0;
      if (mx_fmt) {
        if (in[g]) {
          const int s = block_scale_exp(special[g] ? bits_f32(kGapQuietNaN) : amax[g], es, p.q.rule, p.q.bump);
          const GapElem e = gap_elem(p, v[g], x[g], s, es, salt, i);
          r = e.rel;
          f = e.flag;
        }
      } else if (in[g]) {
        const float qv = p.q.fmt == NumFmt::bf16 ? round_bf16(v[g], p.q.rounding)
                                                 : (p.q.fmt == NumFmt::fp16 ? round_fp16(v[g], p.q.rounding) : v[g]);
        const bool badv = !quant_gap_counts(x[g], qv);
        r = badv ? 0.0 : quant_gap_rel(x[g], qv);
        f = badv ? kFlagNonfinite : 0.0;
      }
      const int64_t left = end - (base + 32 * g);  // the same in every lane
      const int m = left <= 0 ? 0 : (left < 32 ? static_cast<int>(left) : 32);
      terms[warp * 32 * kGapIlp + 32 * g + lane] = m > 0 ? fold_counts(r, f, m, acc) : 0.0;
    }
    if (lane == 0) {
      red[0][warp] = acc.mx;
      red[1][warp] = acc.above;
      red[2][warp] = acc.cnt;
      red[3][warp] = acc.bad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      GapAcc total;
#pragma unroll 16
      for (int j = 0; j < kQuantGapChunk; ++j) total.sum += terms[j];
      for (int w = 0; w < kBlock / 32; ++w) {
        total.mx = fmax(total.mx, red[0][w]);
        total.above += red[1][w];  // integers below 2^53: exact in any order
        total.cnt += red[2][w];
        total.bad += red[3][w];
      }
      write_partials(partials, c, total);
    }
    __syncthreads();  // terms and red are rewritten by the next chunk
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

// One block of kBlock threads: the chunk partials, kBlock at a time. Each thread takes one
// partial's maximum and counts (order-free: across the block at the end) and puts its sum in
// shared memory; thread 0 then adds those sums in chunk order (a chain read from shared memory,
// unrolled so that the reads issue ahead of it).
__global__ void __launch_bounds__(kBlock) gap_final_kernel(const double* partials, int64_t chunks, double* out) {
  __shared__ double sums[kBlock];
  __shared__ double red[4][kBlock / 32];
  const int t = static_cast<int>(threadIdx.x), lane = t & 31, warp = t >> 5;
  double total = 0.0, mx = 0.0, above = 0.0, cnt = 0.0, bad = 0.0;
  for (int64_t tile = 0; tile < chunks; tile += kBlock) {
    const int64_t c = tile + t;
    const double* pc = partials + kPartialWords * c;
    if (c < chunks) {
      sums[t] = pc[0];
      mx = fmax(mx, pc[1]);
      above += pc[2];  // integers below 2^53: exact in any order
      cnt += pc[3];
      bad += pc[4];
    }
    __syncthreads();
    if (t == 0) {
      const int m = chunks - tile < kBlock ? static_cast<int>(chunks - tile) : kBlock;
#pragma unroll 8
      for (int j = 0; j < m; ++j) total += sums[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    mx = fmax(mx, __shfl_xor_sync(kFullMask, mx, o));
    above += __shfl_xor_sync(kFullMask, above, o);
    cnt += __shfl_xor_sync(kFullMask, cnt, o);
    bad += __shfl_xor_sync(kFullMask, bad, o);
  }
  if (lane == 0) {
    red[0][warp] = mx;
    red[1][warp] = above;
    red[2][warp] = cnt;
    red[3][warp] = bad;
  }
  __syncthreads();
  if (t == 0) {
    for (int w = 1; w < kBlock / 32; ++w) {
      mx = fmax(mx, red[0][w]);
      above += red[1][w];
      cnt += red[2][w];
      bad += red[3][w];
    }
    out[0] = total;
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
    const int blocks = static_cast<int>(std::min<int64_t>(chunks_of(n), kMaxGrid));
    gap_one_pass_kernel<<<blocks, kBlock, 0, s>>>(p, es, is_mx(q.fmt), n, chunks_of(n), partials);
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
  gap_final_kernel<<<1, kBlock, 0, s>>>(partials, chunks_of(n), d_results);
  MXLAB_CUDA_LAUNCH_CHECK();
}

}  // namespace mxlab::cuda
