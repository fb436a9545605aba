// The cuBLAS calls of kernels/PERF.md's lever (b) (the K arms' GEMMs batched) and lever (c) (their
// shadow passes' SGEMMs batched), shared by bench/bench_batched_gemm_gpu.cu and its GPU test
// (tests/gpu/test_batched_gemm_gpu.cu):
//   - backend_gemm(): the very call kernels/gemm.cu's GemmRunner makes for one GEMM of a step
//     (cublas_gemm there: cublasGemmEx for one item, cublasGemmStridedBatchedEx for more, e.g.
//     attention's per-head GEMMs), on a handle set up as GemmRunner sets up its own
//     (RunnerHandle: its stream, a fixed 32 MiB workspace, atomics off, host pointer mode, the
//     default math mode);
//   - strided_gemm(): cublasGemmStridedBatchedEx over any number of items, also one: what the K
//     arms' GEMMs of one shape would be as one call (same operand types, compute type, options);
//   - LtPinned: cuBLASLt with one algorithm chosen by the heuristic for the batched shape and
//     then used for every batch count, one arm's included (the pinning lever (b) needs if the
//     single-arm and K-arm runs are to share bits).
// Two kinds, as in GemmRunner: the MX roles' bf16 GEMM (bf16-exact operands stored as bf16,
// FP32 output, CUBLAS_COMPUTE_32F) and the FP32 roles' SGEMM (FP32 in and out,
// CUBLAS_COMPUTE_32F_PEDANTIC: no TF32). The test checks that backend_gemm() gives
// GemmRunner's bits; if kernels/gemm.cu's call changes, change this file with it.
//
// Convention (lab/model/backend.h): row-major C[M x N] = A[M x K] . B[N x K]^T, A stored [M x K]
// when a_kc (K contiguous) else [K x M], B stored [N x K] when b_kc else [K x N]; items of a
// batch follow each other (strides M*K, N*K and M*N elements). beta = 0, as in every GEMM of the
// model's passes. Host code only: plain C++ over the CUDA runtime, cuBLAS and cuBLASLt.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "kernels/cuda_check.cuh"
#include "lab/core/error.h"

namespace mxlab::bench {

enum class GemmKind : uint8_t {
  bf16,   // the MX roles: bf16 operands (bf16-exact values), FP32 accumulation and output
  sgemm,  // the FP32 roles (FP32 trajectory, shadow pass): FP32 in and out, pedantic, no TF32
};

inline const char* kind_name(GemmKind k) { return k == GemmKind::bf16 ? "bf16" : "sgemm"; }
inline cudaDataType_t in_type(GemmKind k) { return k == GemmKind::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
inline size_t in_bytes(GemmKind k) { return k == GemmKind::bf16 ? 2 : 4; }
inline cublasComputeType_t compute_type(GemmKind k) {
  return k == GemmKind::bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
}
inline const char* compute_name(cublasComputeType_t c) {
  return c == CUBLAS_COMPUTE_32F_PEDANTIC ? "CUBLAS_COMPUTE_32F_PEDANTIC" : "CUBLAS_COMPUTE_32F";
}

// One GEMM shape in the Backend's convention.
struct GemmSize {
  int64_t M = 0, N = 0, K = 0;
  bool a_kc = true, b_kc = true;
};

inline int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) throw Error(msg("batched GEMM bench: ", what, " = ", v, " is outside cuBLAS's int range"));
  return static_cast<int>(v);
}

// The workspace GemmRunner gives its handle (kernels/gemm.cu, kWorkspaceBytes).
constexpr size_t kRunnerWorkspaceBytes = size_t{32} << 20;

// A cuBLAS handle on `s` configured as GemmRunner's constructor configures its own.
class RunnerHandle {
 public:
  explicit RunnerHandle(cudaStream_t s) {
    MXLAB_CUBLAS_CHECK(cublasCreate(&h_));
    MXLAB_CUBLAS_CHECK(cublasSetStream(h_, s));  // before the workspace: it resets the workspace
    MXLAB_CUDA_CHECK(cudaMalloc(&ws_, kRunnerWorkspaceBytes));
    MXLAB_CUBLAS_CHECK(cublasSetWorkspace(h_, ws_, kRunnerWorkspaceBytes));
    MXLAB_CUBLAS_CHECK(cublasSetAtomicsMode(h_, CUBLAS_ATOMICS_NOT_ALLOWED));
    MXLAB_CUBLAS_CHECK(cublasSetPointerMode(h_, CUBLAS_POINTER_MODE_HOST));
  }
  ~RunnerHandle() {
    if (h_) cublasDestroy(h_);
    if (ws_) cudaFree(ws_);
  }
  RunnerHandle(const RunnerHandle&) = delete;
  RunnerHandle& operator=(const RunnerHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
  void* ws_ = nullptr;
};

// `batch` items of g in one cublasGemmStridedBatchedEx call (batch >= 1).
inline void strided_gemm(cublasHandle_t h, GemmKind kind, int64_t batch, const GemmSize& g, const void* A,
                         const void* B, float* C) {
  const float alpha = 1.0f, beta = 0.0f;
  const cublasOperation_t tb = g.b_kc ? CUBLAS_OP_T : CUBLAS_OP_N, ta = g.a_kc ? CUBLAS_OP_N : CUBLAS_OP_T;
  const int ldb = to_int(g.b_kc ? g.K : g.N, "ld"), lda = to_int(g.a_kc ? g.K : g.M, "ld");
  MXLAB_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, tb, ta, to_int(g.N, "N"), to_int(g.M, "M"), to_int(g.K, "K"), &alpha,
                                                B, in_type(kind), ldb, g.N * g.K, A, in_type(kind), lda, g.M * g.K,
                                                &beta, C, CUDA_R_32F, to_int(g.N, "N"), g.M * g.N,
                                                to_int(batch, "batch"), compute_type(kind), CUBLAS_GEMM_DEFAULT));
}

// kernels/gemm.cu's cublas_gemm with beta = 0: one item is cublasGemmEx, more the strided form.
inline void backend_gemm(cublasHandle_t h, GemmKind kind, int64_t batch, const GemmSize& g, const void* A,
                         const void* B, float* C) {
  if (batch != 1) {
    strided_gemm(h, kind, batch, g, A, B, C);
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const cublasOperation_t tb = g.b_kc ? CUBLAS_OP_T : CUBLAS_OP_N, ta = g.a_kc ? CUBLAS_OP_N : CUBLAS_OP_T;
  const int ldb = to_int(g.b_kc ? g.K : g.N, "ld"), lda = to_int(g.a_kc ? g.K : g.M, "ld");
  MXLAB_CUBLAS_CHECK(cublasGemmEx(h, tb, ta, to_int(g.N, "N"), to_int(g.M, "M"), to_int(g.K, "K"), &alpha, B,
                                  in_type(kind), ldb, A, in_type(kind), lda, &beta, C, CUDA_R_32F, to_int(g.N, "N"),
                                  compute_type(kind), CUBLAS_GEMM_DEFAULT));
}

// cuBLASLt matmul of shape g with one algorithm for every batch count: the heuristic's first
// choice for `pin_batch` items (the K arms' batched call), then used for other batch counts too
// where cublasLtMatmulAlgoCheck accepts it. The same column-major mapping as above: Lt's A is our
// B, Lt's B our A, D = C [N x M] column-major. Errors are kept as text (why()), not thrown: the
// bench reports "n/a" and goes on.
class LtPinned {
 public:
  LtPinned(cublasLtHandle_t lt, GemmKind kind, const GemmSize& g, int64_t pin_batch, void* ws, size_t ws_bytes)
      : lt_(lt), kind_(kind), g_(g), ws_(ws), ws_bytes_(ws_bytes) {
    // The SGEMM's pedantic compute type first; if cuBLASLt has no algorithm for it, the default
    // FP32 compute type (IEEE FP32 too: TF32 only when asked for), named in describe().
    const cublasComputeType_t tries[2] = {compute_type(kind), CUBLAS_COMPUTE_32F};
    for (int t = 0; t < (kind == GemmKind::sgemm ? 2 : 1) && !ok_; ++t) {
      compute_ = tries[t];
      release_desc();
      if (!make_desc()) continue;
      Layouts L;
      if (!make_layouts(pin_batch, &L)) continue;
      cublasLtMatmulPreference_t pref = nullptr;
      if (!lt_ok(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate")) {
        destroy(L);
        continue;
      }
      const uint64_t max_ws = ws_bytes_;
      cublasLtMatmulHeuristicResult_t r{};
      int found = 0;
      const bool asked = lt_ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                    &max_ws, sizeof max_ws),
                               "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES") &&
                         lt_ok(cublasLtMatmulAlgoGetHeuristic(lt_, desc_, L.a, L.b, L.c, L.c, pref, 1, &r, &found),
                               "cublasLtMatmulAlgoGetHeuristic");
      cublasLtMatmulPreferenceDestroy(pref);
      destroy(L);
      if (!asked) continue;
      if (found < 1 || r.state != CUBLAS_STATUS_SUCCESS) {
        why_ = msg("no cuBLASLt algorithm for ", compute_name(compute_));
        continue;
      }
      algo_ = r.algo;
      ok_ = true;
      why_.clear();
    }
  }
  ~LtPinned() { release_desc(); }
  LtPinned(const LtPinned&) = delete;
  LtPinned& operator=(const LtPinned&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  cublasComputeType_t compute() const { return compute_; }

  // Whether the pinned algorithm runs `batch` items (cublasLtMatmulAlgoCheck); its workspace fits.
  bool supports(int64_t batch) {
    if (!ok_) return false;
    Layouts L;
    if (!make_layouts(batch, &L)) return false;
    cublasLtMatmulHeuristicResult_t r{};
    const bool good = lt_ok(cublasLtMatmulAlgoCheck(lt_, desc_, L.a, L.b, L.c, L.c, &algo_, &r),
                            msg("cublasLtMatmulAlgoCheck for batch ", batch).c_str()) &&
                      r.workspaceSize <= ws_bytes_;
    if (good == false && why_.empty()) why_ = msg("the pinned algorithm needs ", r.workspaceSize, " workspace bytes");
    destroy(L);
    return good;
  }

  // `batch` items with the pinned algorithm (supports(batch) first).
  void run(int64_t batch, const void* A, const void* B, float* C, cudaStream_t s) {
    Layouts L;
    if (!make_layouts(batch, &L)) throw Error(msg("cuBLASLt layouts for batch ", batch, ": ", why_));
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t st =
        cublasLtMatmul(lt_, desc_, &alpha, B, L.a, A, L.b, &beta, C, L.c, C, L.c, &algo_, ws_, ws_bytes_, s);
    destroy(L);
    if (st != CUBLAS_STATUS_SUCCESS) throw Error(msg("cublasLtMatmul failed with status ", static_cast<int>(st)));
  }

  // The pinned configuration: algorithm id, tile, split-K, reduction scheme, stages, swizzle,
  // custom option (cublasLtMatmulAlgoConfigAttributes_t) and the compute type.
  std::string describe() const {
    if (!ok_) return "n/a";
    int32_t id = 0, splitk = 0;
    uint32_t tile = 0, red = 0, stages = 0, swz = 0, cust = 0;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &cust, sizeof cust, &w);
    return msg("algo ", id, " tile ", tile, " splitK ", splitk, " reduction ", red, " stages ", stages, " swizzle ",
               swz, " custom ", cust, " ", compute_name(compute_));
  }

 private:
  struct Layouts {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  };

  bool lt_ok(cublasStatus_t st, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    why_ = msg(what, ": status ", static_cast<int>(st));
    return false;
  }

  bool make_desc() {
    if (!lt_ok(cublasLtMatmulDescCreate(&desc_, compute_, CUDA_R_32F), "cublasLtMatmulDescCreate")) return false;
    const int32_t ta = g_.b_kc ? CUBLAS_OP_T : CUBLAS_OP_N;  // Lt's A is our B
    const int32_t tb = g_.a_kc ? CUBLAS_OP_N : CUBLAS_OP_T;  // Lt's B is our A
    return lt_ok(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA") &&
           lt_ok(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
  }

  void release_desc() {
    if (desc_) cublasLtMatmulDescDestroy(desc_);
    desc_ = nullptr;
  }

  // A stored column-major rows x cols matrix (ld = rows), `batch` of them `stride` elements apart.
  bool layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t batch, int64_t stride,
              cublasLtMatrixLayout_t* out) {
    if (!lt_ok(cublasLtMatrixLayoutCreate(out, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), rows),
               "cublasLtMatrixLayoutCreate"))
      return false;
    const int32_t n = static_cast<int32_t>(batch);
    return lt_ok(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n),
                 "BATCH_COUNT") &&
           lt_ok(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof stride),
                 "STRIDED_BATCH_OFFSET");
  }

  bool make_layouts(int64_t batch, Layouts* L) {
    const cudaDataType_t t = in_type(kind_);
    // Our B [N x K] row-major is column-major K x N (ld K); [K x N] is N x K (ld N). Likewise A.
    const bool good = layout(t, g_.b_kc ? g_.K : g_.N, g_.b_kc ? g_.N : g_.K, batch, g_.N * g_.K, &L->a) &&
                      layout(t, g_.a_kc ? g_.K : g_.M, g_.a_kc ? g_.M : g_.K, batch, g_.M * g_.K, &L->b) &&
                      layout(CUDA_R_32F, g_.N, g_.M, batch, g_.M * g_.N, &L->c);
    if (!good) destroy(*L);
    return good;
  }

  static void destroy(Layouts& L) {
    for (cublasLtMatrixLayout_t* p : {&L.a, &L.b, &L.c}) {
      if (*p) cublasLtMatrixLayoutDestroy(*p);
      *p = nullptr;
    }
  }

  cublasLtHandle_t lt_;
  GemmKind kind_;
  GemmSize g_;
  void* ws_;
  size_t ws_bytes_;
  cublasComputeType_t compute_ = CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool ok_ = false;
  std::string why_;
};

}  // namespace mxlab::bench
