#include "lab/model/gemm_list.h"

namespace mxlab {

std::vector<GemmDims> pass_gemms(const NetShape& s, int64_t B, bool backward) {
  const int64_t d = s.d, H = s.hidden, H1 = s.hidden_in;
  const int64_t S = s.seq_len, dh = s.head_dim(), bh = B / S * s.heads;
  std::vector<GemmDims> v;
  for (int k = 0; k < s.depth; ++k) {
    if (s.attention()) {
      v.push_back({B, 3 * d, d, true, true});      // qkv = y1 Wqkv^T
      v.push_back({S, S, dh, true, true, bh});     // logits = Q K^T per (sequence, head)
      v.push_back({S, dh, S, true, false, bh});    // O = P V
      v.push_back({B, d, d, true, true});          // o = ctx Wo^T
    }
    v.push_back({B, H1, d, true, true});  // h = y W1^T
    v.push_back({B, d, H, true, true});   // o = a W2^T
  }
  if (backward)
    for (int k = s.depth - 1; k >= 0; --k) {
      v.push_back({d, H, B, false, false});   // dW2 = dA^T a
      v.push_back({B, H, d, true, false});    // da = dA W2
      v.push_back({H1, d, B, false, false});  // dW1 = dh^T y
      v.push_back({B, d, H1, true, false});   // dy = dh W1
      if (s.attention()) {
        v.push_back({d, d, B, false, false});        // dWo = dZ^T ctx
        v.push_back({B, d, d, true, false});         // dctx = dZ Wo
        v.push_back({S, S, dh, true, true, bh});     // dP = dO V^T
        v.push_back({S, dh, S, false, false, bh});   // dV = P^T dO
        v.push_back({S, dh, S, true, false, bh});    // dQ = dS K
        v.push_back({S, dh, S, false, false, bh});   // dK = dS^T Q
        v.push_back({3 * d, d, B, false, false});    // dWqkv = dQKV^T y1
        v.push_back({B, d, 3 * d, true, false});     // dy1 = dQKV Wqkv
      }
    }
  return v;
}

double gemm_gflop(const std::vector<GemmDims>& v) {
  double f = 0.0;
  for (const GemmDims& g : v)
    f += 2.0 * static_cast<double>(g.batch) * static_cast<double>(g.M) * static_cast<double>(g.N) *
         static_cast<double>(g.K);
  return f * 1e-9;
}

}  // namespace mxlab
