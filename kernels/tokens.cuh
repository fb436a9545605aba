// Launchers of the token-network ops of the CUDA backend (lab/model/backend.h, "token networks";
// lab/model/README.md, "Token networks"), bit-identical to the CPU reference:
//   - token_batch: one thread per sequence walks the chain (token_successor of
//     lab/model/elementwise.h, the Philox word of its position, the step read on the device);
//   - embed_fwd: one thread per element, R(E[id, c]);
//   - embed_bwd: one block per (token, 128 columns); the block scans the ids in chunks of 128 rows,
//     lists the chunk's rows holding its token in row order (warp ballots, no atomics), and each
//     thread adds dout[r, c] of the listed rows into its double in that order: the CPU's sum, in
//     the CPU's order. Every block reads all ids, so the cost grows with vocab * rows (fine for the
//     lab's vocabularies; not tuned).
// An id that is not an integer in [0, vocab) (token_index < 0; the CPU throws mxlab::Error) makes
// the elements that would use it NaN: embed_fwd's row, and all of embed_bwd's output.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "lab/model/backend.h"

namespace mxlab::cuda {

// ids, targets [sequences * S]; step from d_step.
void launch_token_batch(float* ids, float* targets, int64_t sequences, int64_t S, int64_t vocab, uint64_t seed,
                        Stream stream, const StepScalars* d_step, cudaStream_t s);
// out [rows x d] = R(E[ids[r], c]), E [vocab x d].
void launch_embed_fwd(const float* ids, const float* E, float* out, int64_t rows, int64_t d, int64_t vocab,
                      const ElementwiseRound& r, cudaStream_t s);
// dE [vocab x d] (written, not accumulated) = double sum over rows r with ids[r] = v, in row order, of dout[r, c].
void launch_embed_bwd(const float* ids, const float* dout, float* dE, int64_t rows, int64_t d, int64_t vocab,
                      cudaStream_t s);

}  // namespace mxlab::cuda
