// The GEMMs of one pass of the model, as shapes: what `mxlab bench` times against cuBLAS alone
// (its floors) and counts in GFLOP, and what `mxlab plan` scales a step's measured cost by when
// the planned model's shape is not the benched one.
#pragma once
#include <cstdint>
#include <vector>

#include "lab/model/mlp.h"

namespace mxlab {

// One GEMM in the Backend's convention (C[M x N] = A B^T; *_kc: stored with K contiguous),
// `batch` of them in one strided-batched call.
struct GemmDims {
  int64_t M, N, K;
  bool a_kc, b_kc;
  int64_t batch = 1;
};

// The GEMMs of one pass of `s` at B tokens (lab/model/README.md): forward only, or forward and
// backward (the dgrad of layer 0 included: the model computes it).
std::vector<GemmDims> pass_gemms(const NetShape& s, int64_t B, bool backward);

// 2 M N K per GEMM (times its batch), summed, in GFLOP.
double gemm_gflop(const std::vector<GemmDims>& v);

}  // namespace mxlab
