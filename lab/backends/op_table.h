// The op table: one descriptor per Backend operation (lab/model/backend.h), read by the
// CPU-vs-CUDA table test (tests/gpu/test_op_table.cu), the coverage test that fails when a
// Backend method has no descriptor (tests/cpu/test_op_table.cpp) and `mxlab bench --ops`.
// It lives in lab/backends because the bench (lab/cli) and both test binaries link this
// library; it uses only the Backend interface, never a particular backend.
//
// A descriptor holds: the op's name (its Backend method), the other methods its call also
// exercises, an input generator (sizes + seed -> host tensors, deterministic: Philox), how to
// call the op on a Backend, the comparison rule between two backends (bit-exact, or a stated
// tolerance and why), a small odd test size and the bench size (the op at the paper
// configuration of experiments/paper/fig4_baseline.yaml: batch 2048, width 512, hidden 2048,
// depth 4; attention ops at experiments/paper/attn_vs_mlp_lr5e-4.yaml: 64 sequences x 32
// tokens, 8 heads). Methods that are plumbing (memory, streams, identity strings) are in
// op_exemptions(), each with its reason.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/model/backend.h"

namespace mxlab {

// The sizes one case of an op is generated at: up to four dimensions, named by the
// descriptor's `dims` ("rows,cols", "M,N,K", ...).
struct OpSize {
  int64_t v[4] = {0, 0, 0, 0};
};

// One generated case, in host memory: every tensor the call reads or writes (outputs poisoned
// with NaN, so that an element an op forgets to write fails the comparison) and which of them
// are compared after the call.
struct OpCase {
  OpSize size;
  std::vector<std::vector<float>> tensors;
  std::vector<int> outputs;  // indices into tensors, compared after the call
};

// A case placed on one backend: tensors[i] allocated and uploaded at p[i].
struct OpBufs {
  OpSize size;
  std::vector<float*> p;
};

// How two backends' results of an op are compared.
//   exact: every compared float (and host result) bit-identical, NaN equal to NaN.
//   close: |got - ref| <= rel * max(|ref|, rms of that output), every got finite where ref is
//          (the rms floor covers elements near zero left by a cancellation).
enum class OpMatch : uint8_t { exact, close };
struct OpRule {
  OpMatch match = OpMatch::exact;
  double rel = 0.0;
  const char* why = "";  // one line: why bit-exact, or where the difference comes from
};

struct OpDesc {
  const char* name;  // the Backend method
  const char* also;  // other Backend methods the call exercises, space-separated ("" if none)
  const char* dims;  // names of OpSize::v, comma-separated
  OpSize test;       // odd sizes, larger than a warp, small enough for the CPU
  OpSize bench;      // the size the op runs at in the paper configuration
  OpRule rule;
  OpCase (*make)(const OpSize& s, uint64_t seed);
  // Untimed, once after the case is placed on a backend (may be null).
  void (*prepare)(Backend& be, const OpBufs& b);
  // The call (what the bench times). Host results (reductions, statistics) go to `host`.
  void (*run)(Backend& be, const OpBufs& b, std::vector<double>& host);
  // Untimed, after the call: host results that need a read of their own (may be null).
  void (*collect)(Backend& be, const OpBufs& b, std::vector<double>& host);
};

// Backend methods no descriptor covers, and why.
struct OpExemption {
  const char* name;
  const char* why;
};

const std::vector<OpDesc>& op_table();
const std::vector<OpExemption>& op_exemptions();
// Ops of the table that the CUDA backend does not implement yet (it throws mxlab::Error for them),
// with the reason; the CUDA-vs-CPU table test expects that error instead of a comparison. Empty
// while the CUDA backend has every op (a new op may start here, with its CPU reference only).
const std::vector<OpExemption>& op_cuda_pending();
const OpExemption* find_cuda_pending(const std::string& name);  // null when CUDA has the op
// The descriptor named `name` (its `name`, not an `also`), or null.
const OpDesc* find_op(const std::string& name);
// "rows=2048 cols=512".
std::string op_size_text(const OpDesc& d, const OpSize& s);

// The step scalars every case runs under (stochastic rounding salt, random batch, Adam).
StepScalars op_step();

// What one call of an op produced, in host memory.
struct OpResult {
  std::vector<std::vector<float>> outputs;  // the case's outputs, in its order
  std::vector<double> host;                 // host results
};

// Place `c` on `be` (alloc + upload), set op_step() and run the descriptor's prepare.
OpBufs op_place(Backend& be, const OpDesc& d, const OpCase& c);
// Run the op once on placed buffers and read back its outputs and host results.
OpResult op_run(Backend& be, const OpDesc& d, const OpCase& c, const OpBufs& b);
// "" when `got` matches `ref` under the rule, else what differs (the first few mismatches).
std::string op_compare(const OpRule& rule, const OpResult& ref, const OpResult& got);

}  // namespace mxlab
