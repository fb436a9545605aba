// Element-wise kernels of the CUDA backend (see elementwise.cuh). One pattern throughout: a
// functor with `vec(v)` (four consecutive elements 4v..4v+3, float4 loads and stores) and
// `one(i)` (a single element); ew_kernel runs vec over [0, n/4) when every pointer is 16-byte
// aligned, and one() over the rest. Each element is computed by exactly the scalar function
// the CPU backend calls, in the same order, so vectorisation never changes a bit.
// Pointers are not __restrict__: the model calls add(dst, dst, b) and in-place rounding.
#include "kernels/elementwise.cuh"

#include "kernels/launch_util.cuh"
#include "lab/model/elementwise.h"

namespace mxlab::cuda {

namespace {

__device__ __forceinline__ float4 ld4(const float* p, int64_t v) { return reinterpret_cast<const float4*>(p)[v]; }
__device__ __forceinline__ void st4(float* p, int64_t v, float4 x) { reinterpret_cast<float4*>(p)[v] = x; }

template <class Op>
__global__ void __launch_bounds__(kBlock) ew_kernel(Op op, int64_t nvec, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t v = t; v < nvec; v += stride) op.vec(v);
  for (int64_t i = nvec * 4 + t; i < n; i += stride) op.one(i);
}

// Launch `op` over n elements; the float4 path only when `vec_ok` (all pointers aligned and
// any row structure compatible with groups of four).
template <class Op>
void launch_ew(const Op& op, int64_t n, bool vec_ok, cudaStream_t s) {
  if (n <= 0) return;
  const int64_t nvec = vec_ok ? n / 4 : 0;
  const int64_t items = std::max<int64_t>(nvec, n - nvec * 4);
  ew_kernel<<<grid_for(items), kBlock, 0, s>>>(op, nvec, n);
  MXLAB_CUDA_LAUNCH_CHECK();
}

// ---- fill / round ----

struct FillOp {
  float* dst;
  float value;
  __device__ void vec(int64_t v) const { st4(dst, v, make_float4(value, value, value, value)); }
  __device__ void one(int64_t i) const { dst[i] = value; }
};

struct RoundOp {
  float* x;
  Rounding mode;
  __device__ void vec(int64_t v) const {
    float4 a = ld4(x, v);
    a.x = round_bf16(a.x, mode);
    a.y = round_bf16(a.y, mode);
    a.z = round_bf16(a.z, mode);
    a.w = round_bf16(a.w, mode);
    st4(x, v, a);
  }
  __device__ void one(int64_t i) const { x[i] = round_bf16(x[i], mode); }
};

// ---- Gaussian samples ----
// One Philox call yields the pair (2p, 2p+1); the float4 path computes two pairs. Same
// values as randn_elem (elementwise.h), which the CPU calls per element.
struct RandnOp {
  float* out;
  uint64_t seed;
  Stream stream;
  float scale;
  bool accumulate;
  const StepScalars* d_step;
  __device__ void pair(uint64_t p, float& z0, float& z1) const {
    const U32x4 w = philox(seed, stream, d_step->step, p);
    det_box_muller(w.v[0], w.v[1], z0, z1);
  }
  __device__ float put(float old, float z) const { return accumulate ? old + scale * z : scale * z; }
  __device__ void vec(int64_t v) const {
    float z0, z1, z2, z3;
    pair(static_cast<uint64_t>(2 * v), z0, z1);
    pair(static_cast<uint64_t>(2 * v + 1), z2, z3);
    float4 o = accumulate ? ld4(out, v) : make_float4(0.f, 0.f, 0.f, 0.f);
    o.x = put(o.x, z0);
    o.y = put(o.y, z1);
    o.z = put(o.z, z2);
    o.w = put(o.w, z3);
    st4(out, v, o);
  }
  __device__ void one(int64_t i) const {
    const float z = randn_elem(seed, stream, d_step->step, static_cast<uint64_t>(i));
    out[i] = accumulate ? out[i] + scale * z : scale * z;
  }
};

// ---- activations (ACT a compile-time constant: act_value's switch folds away) ----

// The input roundings (hb/hm of h, gb/gm of da): a GEMM output's bf16 rounding deferred to its
// consumer (Backend::act_fwd), applied as the value is read.
template <Act ACT>
struct ActFwdOp {
  const float* h;
  float* a;
  bool rb;
  Rounding rm;
  bool hb;
  Rounding hm;
  __device__ float f(float x) const { return act_fwd_elem(ACT, ew_round(x, hb, hm), rb, rm); }
  __device__ float4 vec4(int64_t v) const {
    float4 x = ld4(h, v);
    x.x = f(x.x);
    x.y = f(x.y);
    x.z = f(x.z);
    x.w = f(x.w);
    st4(a, v, x);
    return x;
  }
  __device__ void vec(int64_t v) const { vec4(v); }
  __device__ void one(int64_t i) const { a[i] = f(h[i]); }
};

template <Act ACT>
struct ActBwdOp {
  const float* h;
  const float* da;
  float* dh;
  bool rb;
  Rounding rm;
  bool hb;
  Rounding hm;
  bool gb;
  Rounding gm;
  __device__ float f(float x, float g) const {
    return act_bwd_elem(ACT, ew_round(x, hb, hm), ew_round(g, gb, gm), rb, rm);
  }
  __device__ float4 vec4(int64_t v) const {
    const float4 x = ld4(h, v), g = ld4(da, v);
    float4 o;
    o.x = f(x.x, g.x);
    o.y = f(x.y, g.y);
    o.z = f(x.z, g.z);
    o.w = f(x.w, g.w);
    st4(dh, v, o);
    return o;
  }
  __device__ void vec(int64_t v) const { vec4(v); }
  __device__ void one(int64_t i) const { dh[i] = f(h[i], da[i]); }
};

// SwiGLU: element i of a (rows, cols) reads u = h[r, c] and gate = h[r, cols + c] of the
// (rows, 2*cols) pre-activation. The float4 path needs cols % 4 == 0 (a group of four never
// straddles a row).
struct SwigluFwdOp {
  const float* h;
  float* a;
  int64_t cols;
  bool rb;
  Rounding rm;
  bool hb;
  Rounding hm;
  __device__ float f(float u, float g) const { return swiglu_fwd_elem(ew_round(u, hb, hm), ew_round(g, hb, hm), rb, rm); }
  __device__ void vec(int64_t v) const {
    const int64_t i = 4 * v, r = i / cols, c = i - r * cols;
    const int64_t base = r * 2 * cols + c;
    const float4 u = *reinterpret_cast<const float4*>(h + base);
    const float4 g = *reinterpret_cast<const float4*>(h + base + cols);
    float4 o;
    o.x = f(u.x, g.x);
    o.y = f(u.y, g.y);
    o.z = f(u.z, g.z);
    o.w = f(u.w, g.w);
    st4(a, v, o);
  }
  __device__ void one(int64_t i) const {
    const int64_t r = i / cols, c = i - r * cols, base = r * 2 * cols + c;
    a[i] = f(h[base], h[base + cols]);
  }
};

struct SwigluBwdOp {
  const float* h;
  const float* da;
  float* dh;
  int64_t cols;
  bool rb;
  Rounding rm;
  bool hb;
  Rounding hm;
  bool gb;
  Rounding gm;
  __device__ void f(float u, float g, float d, float& du, float& dg) const {
    swiglu_bwd_elem(ew_round(u, hb, hm), ew_round(g, hb, hm), ew_round(d, gb, gm), du, dg, rb, rm);
  }
  __device__ void vec(int64_t v) const {
    const int64_t i = 4 * v, r = i / cols, c = i - r * cols;
    const int64_t base = r * 2 * cols + c;
    const float4 u = *reinterpret_cast<const float4*>(h + base);
    const float4 g = *reinterpret_cast<const float4*>(h + base + cols);
    const float4 d = ld4(da, v);
    float4 du, dg;
    f(u.x, g.x, d.x, du.x, dg.x);
    f(u.y, g.y, d.y, du.y, dg.y);
    f(u.z, g.z, d.z, du.z, dg.z);
    f(u.w, g.w, d.w, du.w, dg.w);
    *reinterpret_cast<float4*>(dh + base) = du;
    *reinterpret_cast<float4*>(dh + base + cols) = dg;
  }
  __device__ void one(int64_t i) const {
    const int64_t r = i / cols, c = i - r * cols, base = r * 2 * cols + c;
    f(h[base], h[base + cols], da[i], dh[base], dh[base + cols]);
  }
};

// ---- residual add / add ----

// The residual update out = x + (y, bias) under one of two rounding rules (Round, below); the
// vectorised path reads x and y four at a time.
template <class Round>
struct ResidualOp {
  float* out;  // may be x
  const float* x;
  const float* y;     // a GEMM output left unrounded: Round rounds it on read
  const float* bias;  // (d) or null
  int64_t d;
  Round r;
  __device__ float f(float xv, float yv, int64_t c) const { return r(xv, yv, bias ? bias[c] : 0.0f, bias != nullptr); }
  __device__ void vec(int64_t v) const {
    const int64_t c = (4 * v) % d;  // d % 4 == 0 on this path: c..c+3 lie in one row
    float4 a = ld4(x, v);
    const float4 b = ld4(y, v);
    a.x = f(a.x, b.x, c);
    a.y = f(a.y, b.y, c + 1);
    a.z = f(a.z, b.z, c + 2);
    a.w = f(a.w, b.w, c + 3);
    st4(out, v, a);
  }
  __device__ void one(int64_t i) const { out[i] = f(x[i], y[i], i % d); }
};

// residual_add: out = R(x + R(R_y(y) + b)) (residual_elem), y read through R_y (yb, ym).
struct ResidualPlainRound {
  bool rb;
  Rounding rm;
  bool yb;
  Rounding ym;
  __device__ float operator()(float xv, float yv, float b, bool has_bias) const {
    return residual_elem(xv, ew_round(yv, yb, ym), b, has_bias, rb, rm);
  }
};

// residual_add_r: out = R_out(x + R_in(R_y(y) + R_b(b))) (residual_r_elem).
struct ResidualSpeltRound {
  Backend::ResidualRound rr;
  __device__ float operator()(float xv, float yv, float b, bool has_bias) const {
    return residual_r_elem(xv, yv, b, has_bias, rr.y_in.bf16, rr.y_in.mode, rr.bias_in.bf16, rr.bias_in.mode,
                           rr.inner.bf16, rr.inner.mode, rr.out.bf16, rr.out.mode);
  }
};

struct AddOp {
  float* dst;
  const float* a;
  const float* b;
  bool rb;
  Rounding rm;
  __device__ float4 vec4(int64_t v) const {
    const float4 x = ld4(a, v), y = ld4(b, v);
    float4 o;
    o.x = add_elem(x.x, y.x, rb, rm);
    o.y = add_elem(x.y, y.y, rb, rm);
    o.z = add_elem(x.z, y.z, rb, rm);
    o.w = add_elem(x.w, y.w, rb, rm);
    st4(dst, v, o);
    return o;
  }
  __device__ void vec(int64_t v) const { vec4(v); }
  __device__ void one(int64_t i) const { dst[i] = add_elem(a[i], b[i], rb, rm); }
};

template <template <Act> class OpT, class... Args>
void dispatch_act(Act act, int64_t n, bool vec_ok, cudaStream_t s, Args... args) {
  switch (act) {
    case Act::relu: launch_ew(OpT<Act::relu>{args...}, n, vec_ok, s); break;
    case Act::gelu: launch_ew(OpT<Act::gelu>{args...}, n, vec_ok, s); break;
    case Act::gelu_tanh: launch_ew(OpT<Act::gelu_tanh>{args...}, n, vec_ok, s); break;
    case Act::linear: launch_ew(OpT<Act::linear>{args...}, n, vec_ok, s); break;
    case Act::gelu_vector: launch_ew(OpT<Act::gelu_vector>{args...}, n, vec_ok, s); break;
    default: throw Error(msg("activation ", static_cast<int>(act), " has no element-wise kernel"));
  }
}

// ---- producer-side quantization (kernels/mx_produce.cuh) ----
// The op's float4 path over nvec groups (nvec % 8 == 0: rows are multiples of 32 long, so the
// 8 lanes of a block are all in range or all out), each warp on 32 consecutive groups, then
// the same four values quantized into pq.out. op.vec4(v) computes and stores group v and
// returns it.
template <class Op, int kElem>
__global__ void __launch_bounds__(kBlock) ew_produce_kernel(Op op, ProducedQuant pq, int64_t nvec) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t base = ((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5) * 32; base < nvec;
       base += warps * 32) {  // warp-uniform: every lane reaches the shuffles of produce_quant4
    const int64_t v = base + lane;
    const bool active = v < nvec;
    const float4 o = active ? op.vec4(v) : make_float4(0.f, 0.f, 0.f, 0.f);
    produce_quant4<kElem>(pq, o, 4 * v, active);
  }
}

template <class Op>
void launch_produce(const Op& op, const ProducedQuant& pq, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const int64_t nvec = n / 4;
  if (pq.elem == static_cast<Elem>(kProducedFolded))
    ew_produce_kernel<Op, kProducedFolded><<<grid_for(nvec), kBlock, 0, s>>>(op, pq, nvec);
  else
    ew_produce_kernel<Op, -1><<<grid_for(nvec), kBlock, 0, s>>>(op, pq, nvec);
  MXLAB_CUDA_LAUNCH_CHECK();
}

template <template <Act> class OpT, class... Args>
void dispatch_act_produce(Act act, const ProducedQuant& pq, int64_t n, cudaStream_t s, Args... args) {
  switch (act) {
    case Act::relu: launch_produce(OpT<Act::relu>{args...}, pq, n, s); break;
    case Act::gelu: launch_produce(OpT<Act::gelu>{args...}, pq, n, s); break;
    case Act::gelu_tanh: launch_produce(OpT<Act::gelu_tanh>{args...}, pq, n, s); break;
    case Act::linear: launch_produce(OpT<Act::linear>{args...}, pq, n, s); break;
    case Act::gelu_vector: launch_produce(OpT<Act::gelu_vector>{args...}, pq, n, s); break;
    default: throw Error(msg("activation ", static_cast<int>(act), " has no producer kernel"));
  }
}

bool can_produce(Act act, int64_t cols, const ProducedQuant* pq) {
  return pq && pq->out && act != Act::swiglu && cols % kProducedBlock == 0 &&
         (reinterpret_cast<uintptr_t>(pq->out) & 7u) == 0;
}

}  // namespace

void launch_fill(float* dst, float value, int64_t n, cudaStream_t s) {
  launch_ew(FillOp{dst, value}, n, aligned16(dst), s);
}

void launch_round_bf16(float* x, int64_t n, Rounding mode, cudaStream_t s) {
  launch_ew(RoundOp{x, mode}, n, aligned16(x), s);
}

void launch_randn(float* out, int64_t n, uint64_t seed, Stream stream, float scale, bool accumulate,
                  const StepScalars* d_step, cudaStream_t s) {
  launch_ew(RandnOp{out, seed, stream, scale, accumulate, d_step}, n, aligned16(out), s);
}

bool launch_act_fwd(Act act, const float* h, float* a, int64_t rows, int64_t cols, const ElementwiseRound& r,
                    const ElementwiseRound& h_in, cudaStream_t s, const ProducedQuant* pq) {
  const int64_t n = rows * cols;
  if (act == Act::swiglu) {
    const bool vec_ok = cols % 4 == 0 && aligned16(h) && aligned16(a);
    launch_ew(SwigluFwdOp{h, a, cols, r.bf16, r.mode, h_in.bf16, h_in.mode}, n, vec_ok, s);
    return false;
  }
  if (can_produce(act, cols, pq) && aligned16(h) && aligned16(a)) {
    dispatch_act_produce<ActFwdOp>(act, *pq, n, s, h, a, r.bf16, r.mode, h_in.bf16, h_in.mode);
    return true;
  }
  dispatch_act<ActFwdOp>(act, n, aligned16(h) && aligned16(a), s, h, a, r.bf16, r.mode, h_in.bf16, h_in.mode);
  return false;
}

bool launch_act_bwd(Act act, const float* h, const float* da, float* dh, int64_t rows, int64_t cols,
                    const ElementwiseRound& r, const ElementwiseRound& h_in, const ElementwiseRound& da_in,
                    cudaStream_t s, const ProducedQuant* pq) {
  const int64_t n = rows * cols;
  if (act == Act::swiglu) {
    const bool vec_ok = cols % 4 == 0 && aligned16(h) && aligned16(da) && aligned16(dh);
    launch_ew(SwigluBwdOp{h, da, dh, cols, r.bf16, r.mode, h_in.bf16, h_in.mode, da_in.bf16, da_in.mode}, n, vec_ok,
              s);
    return false;
  }
  const bool aligned = aligned16(h) && aligned16(da) && aligned16(dh);
  if (can_produce(act, cols, pq) && aligned) {
    dispatch_act_produce<ActBwdOp>(act, *pq, n, s, h, da, dh, r.bf16, r.mode, h_in.bf16, h_in.mode, da_in.bf16,
                                   da_in.mode);
    return true;
  }
  dispatch_act<ActBwdOp>(act, n, aligned, s, h, da, dh, r.bf16, r.mode, h_in.bf16, h_in.mode, da_in.bf16,
                         da_in.mode);
  return false;
}

void launch_residual_add(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                         const ElementwiseRound& r, const ElementwiseRound& y_in, cudaStream_t s) {
  const bool vec_ok = d % 4 == 0 && aligned16(out) && aligned16(x) && aligned16(y);  // bias read per element
  launch_ew(ResidualOp<ResidualPlainRound>{out, x, y, bias, d, {r.bf16, r.mode, y_in.bf16, y_in.mode}}, rows * d, vec_ok,
            s);
}

void launch_residual_add_r(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                           const Backend::ResidualRound& rr, cudaStream_t s) {
  const bool vec_ok = d % 4 == 0 && aligned16(out) && aligned16(x) && aligned16(y);  // bias read per element
  launch_ew(ResidualOp<ResidualSpeltRound>{out, x, y, bias, d, {rr}}, rows * d, vec_ok, s);
}

bool launch_add(float* dst, const float* a, const float* b, int64_t n, const ElementwiseRound& r, cudaStream_t s,
                const ProducedQuant* pq) {
  const bool aligned = aligned16(dst) && aligned16(a) && aligned16(b);
  const AddOp op{dst, a, b, r.bf16, r.mode};
  // Rows of a multiple of 32 elements: the flat blocks of 32 are the rows' blocks.
  if (pq && pq->out && aligned && n % kProducedBlock == 0 && (reinterpret_cast<uintptr_t>(pq->out) & 7u) == 0) {
    launch_produce(op, *pq, n, s);
    return true;
  }
  launch_ew(op, n, aligned, s);
  return false;
}

}  // namespace mxlab::cuda
