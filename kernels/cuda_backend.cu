// The CUDA backend (lab/model/backend.h): device buffers, lanes (streams), CUDA-graph capture
// of whole steps, and dispatch of every op to the launchers of kernels/*.cuh and to the
// GEMM runner of kernels/gemm.cuh.
//
// Design points (DESIGN.md sections 9, 10):
//   - Memory: cudaMalloc only (never managed memory), owned by the backend, freed at
//     destruction. Scratch for reductions is per lane (lanes run concurrently) and grows
//     only outside graph capture; a growth invalidates recorded graphs, since they hold
//     the old addresses.
//   - StepScalars: set_step copies them from a ring of pinned host slots into one device
//     struct on lane 0; kernels read step/lr/bc1/bc2 from that struct, so a captured step
//     replays with the current step's values. A ring (not one pinned slot) because the host
//     may run several steps ahead of the device: a slot is rewritten only after its copy ran.
//   - Lanes: set_lane(i) forks lane i from lane 0 (an event), so work on lane i sees all
//     work enqueued on lane 0 before; join() makes lane 0 wait for every forked lane.
//   - Capture: the first begin_capture(key) returns false and the region runs eagerly (so
//     every scratch buffer and GEMM workspace reaches its size before any capture); the
//     second records the region into a graph (lane 0 in thread-local capture mode, other
//     lanes joining through the fork events) and end_capture instantiates it; replay(key)
//     launches it (the caller replays right after recording, see backend.h).
//   - No float atomics anywhere; the statistics counters are integer atomics.
//   - Threads: runs in threads of one process may share a GPU (mxlab run --jobs). A capture
//     holds capture_guard.cuh's guard shared and every allocation / release / creation holds it
//     exclusively, since those calls would invalidate another thread's capture on the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/capture_guard.cuh"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_backend_internal.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/curvature.cuh"
#include "kernels/device_info.h"
#include "kernels/elementwise.cuh"
#include "kernels/flash_attention.cuh"
#include "kernels/gemm.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/loss.cuh"
#include "kernels/optim.cuh"
#include "kernels/quant_gap.cuh"
#include "kernels/quantize.cuh"
#include "kernels/reduce.cuh"
#include "kernels/tokens.cuh"

namespace mxlab {

namespace cuda {
namespace {

constexpr int kLanes = 8;          // streams: data + FP32 on lane 0; MX arms and their shadow passes on 1..7
constexpr int kStepRing = 16;      // pinned StepScalars slots (steps the host may run ahead)
constexpr int kMinStatSlots = 64;  // statistics counters allocated at least this many slots

// A device allocation owned by one object (grow-only scratch).
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    ResourceSection rs;  // cudaFree synchronises the device (capture_guard.cuh)
    cudaFree(p_);
  }
  T* get() const { return p_; }
  int64_t size() const { return n_; }
  // Reallocate to hold n elements (contents are not kept). The caller synchronises first.
  void reset(int64_t n) {
    ResourceSection rs;
    cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
    MXLAB_CUDA_CHECK(cudaMalloc(&p_, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)));
    n_ = n;
  }

 private:
  T* p_ = nullptr;
  int64_t n_ = 0;
};

struct Lane {
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;  // lane 0: fork point; others: join point
  std::unique_ptr<GemmRunner> gemm;
  int64_t gemm_reserved = 0;
  DeviceArray<double> scratch;  // reduction partials
  bool forked = false;          // has work since the last join
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    info_ = device_info(device);  // throws for a bad index
    ResourceSection rs;           // no other thread's capture runs through these calls
    name_ = msg("cuda:", device, " (", info_.name, ")");
    MXLAB_CUDA_CHECK(cudaSetDevice(device));
    for (Lane& l : lanes_) {
      MXLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
      MXLAB_CUDA_CHECK(cudaEventCreateWithFlags(&l.event, cudaEventDisableTiming));
      l.gemm = std::make_unique<GemmRunner>(l.stream);
    }
    MXLAB_CUDA_CHECK(cudaMalloc(&d_step_, sizeof(StepScalars)));
    MXLAB_CUDA_CHECK(cudaMallocHost(&h_step_ring_, kStepRing * sizeof(StepScalars)));
    for (cudaEvent_t& e : step_events_) MXLAB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    MXLAB_CUDA_CHECK(cudaMallocHost(&h_results_, kHostResults * sizeof(double)));
    results_.reset(kHostResults);
    stats_.reset(static_cast<int64_t>(kMinStatSlots) * kStatWords);
    stat_capacity_ = kMinStatSlots;
    set_step(StepScalars{});  // kernels may read the struct before the first set_step
    MXLAB_CUDA_CHECK(cudaMemsetAsync(stats_.get(), 0, sizeof(unsigned long long) * stats_.size(), lanes_[0].stream));
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(lanes_[0].stream));
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (capturing_) {  // an op threw inside a captured region: drop the partial capture
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(lanes_[0].stream, &g);
      if (g) cudaGraphDestroy(g);
    }
    capture_hold_.release();
    ResourceSection rs;
    for (Lane& l : lanes_) cudaStreamSynchronize(l.stream);
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    for (void* p : buffers_) cudaFree(p);
    cudaFree(d_step_);
    cudaFreeHost(h_step_ring_);
    cudaFreeHost(h_results_);
    for (cudaEvent_t e : step_events_) cudaEventDestroy(e);
    for (Lane& l : lanes_) {
      l.gemm.reset();
      cudaEventDestroy(l.event);
      cudaStreamDestroy(l.stream);
    }
  }

  std::string name() const override { return name_; }
  std::string math_mode() const override { return lanes_[0].gemm->math_mode(); }
  std::vector<std::pair<std::string, std::string>> describe() const override {
    return {{"gpu", info_.name},
            {"cuda_runtime", info_.cuda_runtime},
            {"cuda_driver", info_.cuda_driver},
            {"cublas", info_.cublas}};
  }

  cudaStream_t stream_of(int lane) const {
    if (lane < 0 || lane >= kLanes) throw Error(msg("lane ", lane, " out of range [0, ", kLanes, ")"));
    return lanes_[lane].stream;
  }

  // ---- memory ----
  float* alloc(size_t n) override {
    ctx();
    refuse_in_capture("alloc");
    ResourceSection rs;
    void* p = nullptr;
    MXLAB_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float)));
    buffers_.push_back(p);
    return static_cast<float*>(p);
  }
  void upload(float* dst, const float* src, size_t n) override {
    ctx();
    refuse_in_capture("upload");
    if (n == 0) return;
    // The source is pageable host memory the caller may reuse at once: copy synchronously
    // with respect to the host, ordered on the current lane.
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, cur()));
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(cur()));
  }
  void download(float* dst, const float* src, size_t n) override {
    ctx();
    refuse_in_capture("download");
    join();
    if (n == 0) return;
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, cur()));
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(cur()));
  }
  void copy(float* dst, const float* src, size_t n) override {
    ctx();
    if (n == 0 || dst == src) return;
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cur()));
  }
  void fill(float* dst, float value, size_t n) override {
    ctx();
    launch_fill(dst, value, static_cast<int64_t>(n), cur());
  }

  // ---- step control ----
  void set_step(const StepScalars& s) override {
    ctx();
    refuse_in_capture("set_step");
    // Every lane must be done reading the previous values before lane 0 overwrites them;
    // lanes forked afterwards see the new ones.
    join();
    const int slot = step_slot_;
    step_slot_ = (step_slot_ + 1) % kStepRing;
    if (step_slot_used_[slot]) MXLAB_CUDA_CHECK(cudaEventSynchronize(step_events_[slot]));
    h_step_ring_[slot] = s;
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(d_step_, &h_step_ring_[slot], sizeof(StepScalars), cudaMemcpyHostToDevice,
                                     lanes_[0].stream));
    MXLAB_CUDA_CHECK(cudaEventRecord(step_events_[slot], lanes_[0].stream));
    step_slot_used_[slot] = true;
    step_ = s;
  }

  int lanes() const override { return kLanes; }
  void set_lane(int lane) override {
    ctx();
    if (lane < 0 || lane >= kLanes) throw Error(msg("lane ", lane, " out of range [0, ", kLanes, ")"));
    if (lane == cur_) return;
    cur_ = lane;
    if (lane == 0) return;
    // Fork: lane `lane` continues after everything enqueued on lane 0 so far.
    MXLAB_CUDA_CHECK(cudaEventRecord(lanes_[0].event, lanes_[0].stream));
    MXLAB_CUDA_CHECK(cudaStreamWaitEvent(lanes_[lane].stream, lanes_[0].event, 0));
    lanes_[lane].forked = true;
  }

  void join() override {
    ctx();
    for (int i = 1; i < kLanes; ++i) {
      Lane& l = lanes_[i];
      if (!l.forked) continue;
      MXLAB_CUDA_CHECK(cudaEventRecord(l.event, l.stream));
      MXLAB_CUDA_CHECK(cudaStreamWaitEvent(lanes_[0].stream, l.event, 0));
      l.forked = false;
    }
    cur_ = 0;
  }

  bool replay(int key) override {
    ctx();
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    refuse_in_capture("replay");
    join();
    MXLAB_CUDA_CHECK(cudaGraphLaunch(it->second, lanes_[0].stream));
    return true;
  }

  bool begin_capture(int key) override {
    ctx();
    refuse_in_capture("begin_capture");
    if (seen_.insert(key).second) return false;  // first time: run eagerly, sizing every buffer
    drop_graph(key);
    join();
    capture_hold_.acquire();  // until end_capture: no cudaFree of another thread meanwhile
    const cudaError_t began = cudaStreamBeginCapture(lanes_[0].stream, cudaStreamCaptureModeThreadLocal);
    if (began != cudaSuccess) capture_hold_.release();
    MXLAB_CUDA_CHECK(began);
    capturing_ = true;
    capture_key_ = key;
    return true;
  }

  void end_capture(int key) override {
    ctx();
    if (!capturing_) {  // the eager first pass: leave the lanes as a recorded region would
      join();
      return;
    }
    if (key != capture_key_)
      throw Error(msg("end_capture(", key, ") does not match begin_capture(", capture_key_, ")"));
    join();  // every forked lane must rejoin lane 0 before the capture ends
    cudaGraph_t graph = nullptr;
    capturing_ = false;
    const cudaError_t ended = cudaStreamEndCapture(lanes_[0].stream, &graph);
    capture_hold_.release();
    MXLAB_CUDA_CHECK(ended);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    MXLAB_CUDA_CHECK(err);
    graphs_[key] = exec;  // recorded, not run: the caller runs it with replay(key)
  }

  void synchronize() override {
    ctx();
    refuse_in_capture("synchronize");
    for (Lane& l : lanes_) MXLAB_CUDA_CHECK(cudaStreamSynchronize(l.stream));
  }

  // ---- random numbers ----
  void randn(float* out, size_t n, uint64_t seed, Stream stream, float scale) override {
    ctx();
    launch_randn(out, static_cast<int64_t>(n), seed, stream, scale, false, d_step_, cur());
  }
  void add_randn(float* out, size_t n, uint64_t seed, Stream stream, float scale) override {
    ctx();
    launch_randn(out, static_cast<int64_t>(n), seed, stream, scale, true, d_step_, cur());
  }

  // ---- quantization ----
  void quantize(const float* in, float* out, int64_t rows, int64_t cols, Axis axis, const QuantSpec& q,
                int stats_slot) override {
    ctx();
    QuantLaunch l;
    l.in = in;
    l.rows = rows;
    l.cols = cols;
    l.axis = axis;
    l.q = q;
    l.stats_q = q;              // the statistics of this very quantization (same pass)
    l.d_step = &d_step_->step;  // stochastic-rounding salt = StepScalars.step, read on the device
    l.d_stats = stats_slot >= 0 ? slot_counters(stats_slot) : nullptr;
    if (out) {
      quantize_f32(l, out, cur());
    } else if (l.d_stats) {
      quant_stats(l, cur());
    }
  }
  void round_bf16(float* x, size_t n, Rounding mode) override {
    ctx();
    launch_round_bf16(x, static_cast<int64_t>(n), mode, cur());
  }

  // ---- GEMM ----
  void gemm(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C, float beta,
            const ElementwiseRound& out) override {
    ctx();
    if (a.stats_slot >= 0) slot_counters(a.stats_slot);  // validates the slot
    if (b.stats_slot >= 0) slot_counters(b.stats_slot);
    reserve_gemm(std::max(M * K, N * K))->run(M, N, K, a, b, C, beta, out, &d_step_->step, stats_.get());
  }

  // ---- vector ops ----
  void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xhat, float* rstd,
                     int64_t rows, int64_t d, float eps, const ElementwiseRound& r, const GemmOperand* q_out) override {
    ctx();
    MXLAB_ASSERT((gamma == nullptr) == (beta == nullptr), "layernorm affine needs both gamma and beta");
    produce(q_out, y, rows, d, [&](const ProducedQuant* pq) {
      return launch_layernorm_fwd(x, gamma, beta, y, xhat, rstd, rows, d, eps, r, cur(), pq);
    });
  }
  void layernorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                     float* dgamma, float* dbeta, int64_t rows, int64_t d, const ElementwiseRound& r,
                     const ElementwiseRound& dy_in) override {
    ctx();
    double* scratch = lane_scratch(layernorm_bwd_scratch_doubles(rows, d));
    launch_layernorm_bwd(dy, xhat, rstd, gamma, dx, dgamma, dbeta, rows, d, r, dy_in, scratch, cur());
  }
  void act_fwd(Act act, const float* h, float* a, int64_t rows, int64_t cols, const ElementwiseRound& r,
               const ElementwiseRound& h_in, const GemmOperand* q_out) override {
    ctx();
    produce(q_out, a, rows, cols,
            [&](const ProducedQuant* pq) { return launch_act_fwd(act, h, a, rows, cols, r, h_in, cur(), pq); });
  }
  void act_bwd(Act act, const float* h, const float* da, float* dh, int64_t rows, int64_t cols,
               const ElementwiseRound& r, const ElementwiseRound& h_in, const ElementwiseRound& da_in,
               const GemmOperand* q_out) override {
    ctx();
    produce(q_out, dh, rows, cols, [&](const ProducedQuant* pq) {
      return launch_act_bwd(act, h, da, dh, rows, cols, r, h_in, da_in, cur(), pq);
    });
  }
  // Producer-side quantization (lab/model/backend.h, kernels/gemm.cuh): runs a producer that
  // writes `out` [rows x cols], launch(pq) returning whether it also wrote q_out's quantization
  // (pq null: not asked), and records what the lane's GEMM runner then holds. The held buffer
  // grows here outside capture; inside, a producer whose operand does not fit just writes its
  // output (the GEMM quantizes it then).
  template <class Launch>
  void produce(const GemmOperand* q_out, const float* out, int64_t rows, int64_t cols, Launch launch) {
    ProducedQuant pq;
    bool want = false;
    if (q_out) {
      MXLAB_ASSERT(q_out->p == out, "a producer's q_out must describe its output");
      if (!capturing_ && produce_on_) reserve_gemm(rows * cols);
      want = lanes_[cur_].gemm->produce_target(*q_out, rows, cols, &pq) && produce_on_;  // drops what was held
    }
    if (launch(want ? &pq : nullptr)) lanes_[cur_].gemm->hold(*q_out, rows, cols);
  }
  void prequantize(const AheadOperand* ops, size_t n) override {
    ctx();
    if (!produce_on_ || n == 0) return;
    int64_t most = 0;
    for (size_t i = 0; i < n; ++i) most = std::max(most, ops[i].rows * ops[i].cols);
    if (!capturing_) reserve_gemm(most);
    lanes_[cur_].gemm->prequantize(ops, static_cast<int>(n), &d_step_->step);
  }
  // Tests and benchmarks: producer-side quantization and prequantize() on/off (off: every GEMM
  // quantizes its operands itself), and how many GEMM operands were taken from producers or
  // prequantize(), over all lanes.
  void set_producer_quant(bool on) { produce_on_ = on; }
  int64_t producer_quant_hits() const {
    int64_t n = 0;
    for (const Lane& l : lanes_) n += l.gemm->produced_hits();
    return n;
  }
  void residual_add(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                    const ElementwiseRound& r, const ElementwiseRound& y_in) override {
    ctx();
    launch_residual_add(out, x, y, bias, rows, d, r, y_in, cur());
  }
  // The paper's emulator op by op (lab/model/README.md): bit-identical to the CPU's.
  void residual_add_r(float* out, const float* x, const float* y, const float* bias, int64_t rows, int64_t d,
                      const ResidualRound& rr) override {
    ctx();
    launch_residual_add_r(out, x, y, bias, rows, d, rr, cur());
  }
  void layernorm_vec_fwd(const float* x, const float* gamma, const float* beta, float* y, float* xn, float* vare,
                         int64_t rows, int64_t d, float eps, const ElementwiseRound& r) override {
    MXLAB_ASSERT((gamma == nullptr) == (beta == nullptr), "layernorm affine needs both gamma and beta");
    ctx();
    launch_layernorm_vec_fwd(x, gamma, beta, y, xn, vare, rows, d, eps, r, cur());
  }
  void layernorm_vec_bwd(const float* dy, const float* xn, const float* vare, const float* gamma, float* dx,
                         float* dgamma, float* dbeta, int64_t rows, int64_t d, const ElementwiseRound& r,
                         const ElementwiseRound& dy_in) override {
    MXLAB_ASSERT(dx != dy, "layernorm_vec_bwd: dx must not alias dy");
    ctx();
    launch_layernorm_vec_bwd(dy, xn, vare, gamma, dx, dgamma, dbeta, rows, d, r, dy_in, cur());
  }
  void col_sum(const float* x, float* out, int64_t rows, int64_t d) override {
    ctx();
    double* scratch = lane_scratch(col_sum_scratch_doubles(rows, d, 1));
    launch_col_sum(x, out, rows, d, scratch, cur());
  }
  void add(float* dst, const float* a, const float* b, size_t n, const ElementwiseRound& r, const GemmOperand* q_out,
           int64_t q_cols) override {
    ctx();
    const int64_t len = static_cast<int64_t>(n);
    if (q_out && (q_cols <= 0 || len % q_cols != 0))
      throw Error(msg("add: q_out's row length ", q_cols, " does not divide the ", len, " elements"));
    produce(q_out, dst, q_out ? len / q_cols : 0, q_out ? q_cols : 0,
            [&](const ProducedQuant* pq) { return launch_add(dst, a, b, len, r, cur(), pq); });
  }

  // ---- loss ----
  void loss_mse(const float* out, const float* target, float* dout, float* loss_out, float* loss_history,
                int64_t rows, int64_t d, const ElementwiseRound& r) override {
    ctx();
    double* scratch = lane_scratch(loss_scratch_doubles(rows, d));
    launch_loss_mse(out, target, dout, loss_out, loss_history, rows, d, r, d_step_, scratch, cur());
  }
  void loss_kl(const float* out, const float* target, float* dout, float* loss_out, float* loss_history,
               int64_t rows, int64_t d, float temperature, const ElementwiseRound& r) override {
    ctx();
    double* scratch = lane_scratch(loss_scratch_doubles(rows, d));
    launch_loss_kl(out, target, dout, loss_out, loss_history, rows, d, temperature, r, d_step_, scratch, cur());
  }

  // ---- optimizers ----
  void adam(float* p, const float* g, float* m, float* v, size_t n, const AdamHyper& h) override {
    ctx();
    launch_adam(p, g, m, v, static_cast<int64_t>(n), h, d_step_, cur());
  }
  void sgd(float* p, const float* g, float* buf, size_t n, float momentum, float weight_decay) override {
    ctx();
    MXLAB_ASSERT(buf != nullptr || momentum == 0.0f, "sgd with momentum needs a buffer");
    launch_sgd(p, g, buf, static_cast<int64_t>(n), momentum, weight_decay, d_step_, cur());
  }

  // ---- reductions and statistics (synchronising; run on lane 0 after a join) ----
  void reduce(const Reduction* reqs, size_t count, double* results) override {
    ctx();
    refuse_in_capture("reduce");
    reduce_into(reqs, count, results);
  }
  float read_scalar(const float* p) override {
    float v = 0.0f;
    download(&v, p, 1);
    return v;
  }
  // Deferred results: the reductions write into a device queue on lane 0 (after the lanes join,
  // as reduce() does) and nothing waits until take_deferred(). A full queue is moved to the host
  // first (one synchronisation), so it never grows while results are pending.
  void reduce_deferred(const Reduction* reqs, size_t count) override {
    ctx();
    refuse_in_capture("reduce_deferred");
    reduce_into(reqs, count, nullptr);
  }
  void defer_scalar(const float* p) override {
    ctx();
    refuse_in_capture("defer_scalar");
    join();
    launch_widen_scalar(p, deferred_slots(1), cur());
    deferred_n_ += 1;
  }
  std::vector<double> take_deferred() override {
    ctx();
    refuse_in_capture("take_deferred");
    join();
    spill_deferred();
    std::vector<double> out;
    out.swap(deferred_spilled_);
    return out;
  }
  void moments(const float* x, size_t n, double out[4]) override {
    ctx();
    refuse_in_capture("moments");
    join();
    double* scratch = lane_scratch(moments_scratch_doubles(static_cast<int64_t>(n)));
    launch_moments(x, static_cast<int64_t>(n), scratch, results_.get(), cur());
    read_results(4, out);
  }
  void moments_batch(const float* const* x, const size_t* n, size_t count, double* out) override {
    ctx();
    refuse_in_capture("moments");
    per_item_batch(
        count, 4, [&](size_t i) { return moments_scratch_doubles(static_cast<int64_t>(n[i])); },
        [&](size_t i, double* scratch, double* words) {
          launch_moments(x[i], static_cast<int64_t>(n[i]), scratch, words, cur());
        },
        out);
  }
  void reset_stats(int slots) override {
    ctx();
    refuse_in_capture("reset_stats");
    join();
    slots = std::max(slots, 0);
    if (slots > stat_capacity_) {
      synchronize_all();
      stat_capacity_ = std::max(slots, 2 * stat_capacity_);
      stats_.reset(static_cast<int64_t>(stat_capacity_) * kStatWords);
      invalidate_graphs();  // they hold the old counters' address
    }
    stat_slots_ = slots;
    MXLAB_CUDA_CHECK(cudaMemsetAsync(stats_.get(), 0, sizeof(unsigned long long) * kStatWords * stat_capacity_,
                                     lanes_[0].stream));
  }
  // ==== attention blocks and RMS/MX norms (backend.h section of the same name) ====
  void gemm_batched(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b,
                    float* C, float beta, const ElementwiseRound& out) override {
    ctx();
    if (a.stats_slot >= 0) slot_counters(a.stats_slot);  // validates the slot
    if (b.stats_slot >= 0) slot_counters(b.stats_slot);
    reserve_gemm(batch * std::max(M * K, N * K))
        ->run_batched(batch, M, N, K, a, b, C, beta, out, &d_step_->step, stats_.get());
  }
  void rmsnorm_fwd(const float* x, const float* gamma, float* y, float* xhat, float* rstd, int64_t rows, int64_t d,
                   float eps, const RmsEstimate& est, const ElementwiseRound& r) override {
    ctx();
    launch_rmsnorm_fwd(x, gamma, y, xhat, rstd, rows, d, eps, est, r, cur());
  }
  void rmsnorm_bwd(const float* dy, const float* xhat, const float* rstd, const float* gamma, float* dx,
                   float* dgamma, int64_t rows, int64_t d, const ElementwiseRound& r) override {
    ctx();
    double* scratch = lane_scratch(rmsnorm_bwd_scratch_doubles(rows, d));
    launch_rmsnorm_bwd(dy, xhat, rstd, gamma, dx, dgamma, rows, d, r, scratch, cur());
  }
  void scale_cols(const float* x, const float* g, float* out, int64_t rows, int64_t cols,
                  const ElementwiseRound& r) override {
    ctx();
    launch_scale_cols(x, g, out, rows, cols, r, cur());
  }
  void softmax_fwd(const float* logits, float* probs, float* rowmax, int64_t rows, int64_t n, float scale,
                   const ElementwiseRound& r) override {
    ctx();
    launch_softmax_fwd(logits, probs, rowmax, rows, n, scale, r, cur());
  }
  void softmax_bwd(const float* probs, const float* dprobs, float* dlogits, int64_t rows, int64_t n, float scale,
                   const ElementwiseRound& r) override {
    ctx();
    launch_softmax_bwd(probs, dprobs, dlogits, rows, n, scale, r, cur());
  }
  void heads_split(const float* x, float* heads, int64_t nb, int64_t S, int64_t h, int64_t dh, int64_t ld,
                   int64_t col0) override {
    ctx();
    launch_heads_copy(x, heads, nb, S, h, dh, ld, col0, true, cur());
  }
  void heads_merge(const float* heads, float* x, int64_t nb, int64_t S, int64_t h, int64_t dh, int64_t ld,
                   int64_t col0) override {
    ctx();
    launch_heads_copy(heads, x, nb, S, h, dh, ld, col0, false, cur());
  }

  // ==== token networks (backend.h): kernels/tokens.cuh, the loss in kernels/loss.cuh ====
  void token_batch(float* ids, float* targets, int64_t sequences, int64_t S, int64_t vocab, uint64_t seed,
                   Stream stream) override {
    ctx();
    launch_token_batch(ids, targets, sequences, S, vocab, seed, stream, d_step_, cur());
  }
  void embed_fwd(const float* ids, const float* E, float* out, int64_t rows, int64_t d, int64_t vocab,
                 const ElementwiseRound& r) override {
    ctx();
    launch_embed_fwd(ids, E, out, rows, d, vocab, r, cur());
  }
  void embed_bwd(const float* ids, const float* dout, float* dE, int64_t rows, int64_t d, int64_t vocab) override {
    ctx();
    launch_embed_bwd(ids, dout, dE, rows, d, vocab, cur());
  }
  void loss_xent(const float* logits, const float* target, float* dlogits, float* loss_out, float* loss_history,
                 int64_t rows, int64_t vocab, const ElementwiseRound& r) override {
    ctx();
    double* scratch = lane_scratch(loss_scratch_doubles(rows, vocab));
    launch_loss_xent(logits, target, dlogits, loss_out, loss_history, rows, vocab, r, d_step_, scratch, cur());
  }
  void mask_causal(float* x, int64_t items, int64_t S) override {
    ctx();
    launch_mask_causal(x, items, S, cur());
  }
  // ==== flash attention in bf16 (backend.h): kernels/flash_attention.cuh, the functions of
  // lab/model/flash_attention.h one thread per query row or key ====
  void flash_attn_fwd(const float* q, const float* k, const float* v, float* o, float* o_hp, float* lse,
                      float* rowmax, float* row_stats, int64_t items, int64_t S, int64_t dh, float scale,
                      const FlashSpec& f) override {
    ctx();
    MXLAB_ASSERT(f.bc > 0 && f.br > 0, "flash attention tile ", f.br, " x ", f.bc, " (configuration admits >= 1)");
    launch_flash_attn_fwd(q, k, v, o, o_hp, lse, rowmax, row_stats, items, S, dh, scale, f, cur());
  }
  void flash_attn_bwd(const float* q, const float* k, const float* v, const float* o, const float* o_hp,
                      const float* dout, const float* lse, float* dq, float* dk, float* dv, float* delta,
                      float* delta_hp, int64_t items, int64_t S, int64_t dh, float scale, const FlashSpec& f) override {
    ctx();
    MXLAB_ASSERT(f.bc > 0 && f.br > 0, "flash attention tile ", f.br, " x ", f.bc, " (configuration admits >= 1)");
    // The per-row dQ tile sums live in the lane's reduction scratch (doubles, 8-byte aligned: floats fit).
    float* part = reinterpret_cast<float*>(lane_scratch((flash_bwd_scratch_floats(items, S, dh) + 1) / 2));
    launch_flash_attn_bwd(q, k, v, o, o_hp, dout, lse, dq, dk, dv, delta, delta_hp, items, S, dh, scale, f, part,
                          cur());
  }

  std::vector<QuantStats> read_stats() override {
    ctx();
    refuse_in_capture("read_stats");
    join();
    std::vector<unsigned long long> raw(static_cast<size_t>(stat_slots_) * kStatWords);
    if (!raw.empty()) {
      MXLAB_CUDA_CHECK(cudaMemcpyAsync(raw.data(), stats_.get(), raw.size() * sizeof(unsigned long long),
                                       cudaMemcpyDeviceToHost, lanes_[0].stream));
    }
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(lanes_[0].stream));
    std::vector<QuantStats> out(static_cast<size_t>(stat_slots_));
    for (size_t i = 0; i < out.size(); ++i) {
      const unsigned long long* w = raw.data() + i * kStatWords;
      out[i].n = w[0];
      out[i].lastbin = w[1];
      out[i].clamped = w[2];
      out[i].nan_blocks = w[3];
      out[i].blocks = w[4];
    }
    return out;
  }

  // ==== stability instruments (backend.h): curvature tangents and the quantization gap ====
  void act_jvp(Act act, const float* h, const float* rh, float* ra, int64_t rows, int64_t cols) override {
    ctx();
    launch_act_jvp(act, h, rh, ra, rows, cols, cur());
  }
  void act_bwd_tangent(Act act, const float* h, const float* rh, const float* da, const float* rda, float* rdh,
                       int64_t rows, int64_t cols) override {
    ctx();
    launch_act_bwd_tangent(act, h, rh, da, rda, rdh, rows, cols, cur());
  }
  void ln_affine_tangent(const float* rxhat, const float* xhat, const float* gamma, const float* vgamma,
                         const float* vbeta, float* ry, int64_t rows, int64_t d) override {
    ctx();
    launch_ln_affine_tangent(rxhat, xhat, gamma, vgamma, vbeta, ry, rows, d, cur());
  }
  void layernorm_bwd_tangent(const float* dy, const float* rdy, const float* xhat, const float* rxhat, const float* rx,
                             const float* rstd, const float* gamma, const float* vgamma, float* rdx, int64_t rows,
                             int64_t d) override {
    ctx();
    MXLAB_ASSERT((gamma == nullptr) == (vgamma == nullptr), "layernorm tangent needs both gamma and its tangent");
    launch_layernorm_bwd_tangent(dy, rdy, xhat, rxhat, rx, rstd, gamma, vgamma, rdx, rows, d, cur());
  }
  void col_dot(const float* a, const float* b, float* out, int64_t rows, int64_t d) override {
    ctx();
    // layernorm_bwd's dgamma sum: (float) double sum over rows of a * b.
    double* scratch = lane_scratch(col_sum_scratch_doubles(rows, d, 2));
    launch_col_sum_ln(a, b, out, nullptr, rows, d, scratch, cur());
  }
  void axpby(float* y, const float* x, float a, float b, size_t n) override {
    ctx();
    launch_axpby(y, x, a, b, static_cast<int64_t>(n), cur());
  }
  void mul(float* dst, const float* a, const float* b, size_t n) override {
    ctx();
    launch_mul(dst, a, b, static_cast<int64_t>(n), cur());
  }
  void precond_isqrt(const float* v, float* out, size_t n, float bc2, float eps) override {
    ctx();
    launch_precond_isqrt(v, out, static_cast<int64_t>(n), bc2, eps, cur());
  }
  void loss_kl_tangent(const float* out, const float* rout, float* rdout, int64_t rows, int64_t d,
                       float temperature) override {
    ctx();
    launch_loss_kl_tangent(out, rout, rdout, rows, d, temperature, cur());
  }
  QuantGap quant_gap(const float* x, int64_t rows, int64_t cols, Axis axis, const QuantSpec& q, bool round_bf16_first,
                     Rounding bf16_mode) override {
    const QuantGapRequest r(x, rows, cols, axis, q, round_bf16_first, bf16_mode);
    QuantGap g;
    quant_gaps(&r, 1, &g);
    return g;
  }
  // The batch's gaps run one after another on lane 0, each into its own scratch and its own 5
  // result words, and come back in one read per kHostResults / 5 tensors.
  void quant_gaps(const QuantGapRequest* reqs, size_t count, QuantGap* out) override {
    ctx();
    refuse_in_capture("quant_gap");
    constexpr size_t kWords = 5;
    for (size_t i = 0; i < count; ++i)
      MXLAB_ASSERT(!is_mx(reqs[i].q.fmt) || reqs[i].q.block > 0, "quant_gap: block size ", reqs[i].q.block,
                   " (configuration admits only positive sizes)");
    std::vector<double> w(kWords * count);
    per_item_batch(
        count, kWords,
        [&](size_t i) { return quant_gap_scratch_doubles(reqs[i].rows, reqs[i].cols, reqs[i].axis, reqs[i].q); },
        [&](size_t i, double* scratch, double* words) {
          const QuantGapRequest& r = reqs[i];
          launch_quant_gap(r.x, r.rows, r.cols, r.axis, r.q, r.round_bf16_first, r.bf16_mode, d_step_, scratch, words,
                           cur());
        },
        w.data());
    for (size_t i = 0; i < count; ++i) {
      const double* v = &w[kWords * i];
      out[i].sum_rel = v[0];
      out[i].max_rel = v[1];
      out[i].above = static_cast<uint64_t>(v[2]);
      out[i].n = static_cast<uint64_t>(v[3]);
      out[i].nonfinite = static_cast<uint64_t>(v[4]);
    }
  }
  // ==== end of the stability instruments ====

 private:
  static constexpr size_t kHostResults = 1024;  // doubles per reduce batch read back
  static constexpr size_t kDeferred = 1 << 16;   // doubles of the device queue of deferred results

  // Make this backend's device current for the calling thread (runs on several GPUs of one
  // host may live in one process).
  void ctx() const {
    int dev = -1;
    MXLAB_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev != device_) MXLAB_CUDA_CHECK(cudaSetDevice(device_));
  }
  cudaStream_t cur() const { return lanes_[cur_].stream; }

  void refuse_in_capture(const char* what) const {
    if (capturing_)
      throw Error(msg(what, " inside a captured region (begin_capture(", capture_key_,
                      ")): capture only a step's device work; synchronising and allocating calls go outside"));
  }

  void synchronize_all() {
    for (Lane& l : lanes_) MXLAB_CUDA_CHECK(cudaStreamSynchronize(l.stream));
  }

  // Scratch of the current lane, grown (outside capture) to at least n doubles.
  double* lane_scratch(int64_t n) {
    Lane& l = lanes_[cur_];
    if (l.scratch.size() < n) {
      refuse_in_capture("growing reduction scratch (the first pass of a captured region runs eagerly to size it)");
      synchronize_all();
      l.scratch.reset(std::max<int64_t>(n, 2 * l.scratch.size()));
      invalidate_graphs();
    }
    return l.scratch.get();
  }

  // Reductions of `count` requests on lane 0 after a join, in chunks of kHostResults: into
  // `results` (one read back per chunk), or with results == null into the deferred queue.
  void reduce_into(const Reduction* reqs, size_t count, double* results) {
    join();
    for (size_t first = 0; first < count; first += kHostResults) {
      const size_t m = std::min<size_t>(kHostResults, count - first);
      double* scratch = lane_scratch(reduce_scratch_doubles(reqs + first, m));
      launch_reduce(reqs + first, m, scratch, results ? results_.get() : deferred_slots(m), cur());
      if (results) {
        read_results(m, results + first);
      } else {
        deferred_n_ += m;
      }
    }
  }
  // `count` items on lane 0 after a join, each with scratch_of(i) doubles of its own scratch and
  // `words` result doubles: launch(i, scratch, words_ptr) enqueues item i; the words come back
  // into out[words * i ...], one read per chunk of kHostResults / words items.
  template <class ScratchOf, class Launch>
  void per_item_batch(size_t count, size_t words, ScratchOf scratch_of, Launch launch, double* out) {
    join();
    const size_t chunk = kHostResults / words;
    for (size_t first = 0; first < count; first += chunk) {
      const size_t m = std::min<size_t>(chunk, count - first);
      std::vector<int64_t> at(m + 1, 0);
      for (size_t i = 0; i < m; ++i) at[i + 1] = at[i] + scratch_of(first + i);
      double* scratch = lane_scratch(at[m]);
      for (size_t i = 0; i < m; ++i) launch(first + i, scratch + at[i], results_.get() + words * i);
      read_results(words * m, out + words * first);
    }
  }

  // The current lane's GEMM runner with scratch for operands of `need` elements (grown outside
  // capture only: the first pass of a captured region runs eagerly and sizes it).
  GemmRunner* reserve_gemm(int64_t need) {
    Lane& l = lanes_[cur_];
    if (need > l.gemm_reserved) {
      refuse_in_capture("a GEMM larger than any run before (the first pass of a captured region runs eagerly "
                        "to size its workspaces)");
      synchronize_all();
      l.gemm->reserve(need);
      l.gemm_reserved = need;
      invalidate_graphs();
    }
    return l.gemm.get();
  }

  unsigned long long* slot_counters(int slot) {
    if (slot >= stat_slots_)
      throw Error(msg("statistics slot ", slot, " used but reset_stats(", stat_slots_,
                      ") sized fewer: call reset_stats with enough slots first"));
    return stats_.get() + static_cast<int64_t>(slot) * kStatWords;
  }

  // Room for m more deferred results on the device (moving the queue to the host when full).
  double* deferred_slots(size_t m) {
    if (deferred_.size() == 0) deferred_.reset(kDeferred);
    if (deferred_n_ + m > kDeferred) spill_deferred();
    return deferred_.get() + deferred_n_;
  }
  void spill_deferred() {
    if (deferred_n_ == 0) return;
    const size_t at = deferred_spilled_.size();
    deferred_spilled_.resize(at + deferred_n_);
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(deferred_spilled_.data() + at, deferred_.get(), deferred_n_ * sizeof(double),
                                     cudaMemcpyDeviceToHost, lanes_[0].stream));
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(lanes_[0].stream));
    deferred_n_ = 0;
  }

  void read_results(size_t m, double* out) {
    MXLAB_CUDA_CHECK(cudaMemcpyAsync(h_results_, results_.get(), m * sizeof(double), cudaMemcpyDeviceToHost,
                                     lanes_[0].stream));
    MXLAB_CUDA_CHECK(cudaStreamSynchronize(lanes_[0].stream));
    std::copy(h_results_, h_results_ + m, out);
  }

  void drop_graph(int key) {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return;
    synchronize_all();
    ResourceSection rs;
    cudaGraphExecDestroy(it->second);
    graphs_.erase(it);
  }

  // A buffer a graph refers to was reallocated: forget every graph. Keys stay "seen": each
  // of them has run eagerly at least once, and buffers only grow, so recording it again
  // needs no allocation.
  void invalidate_graphs() {
    ResourceSection rs;
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  int device_;
  DeviceInfo info_;
  std::string name_;
  Lane lanes_[kLanes];
  int cur_ = 0;

  StepScalars step_;
  StepScalars* d_step_ = nullptr;
  StepScalars* h_step_ring_ = nullptr;
  cudaEvent_t step_events_[kStepRing] = {};
  bool step_slot_used_[kStepRing] = {};
  int step_slot_ = 0;

  std::vector<void*> buffers_;
  DeviceArray<double> results_;
  DeviceArray<double> deferred_;          // reduce_deferred / defer_scalar, not yet taken
  size_t deferred_n_ = 0;                 // doubles queued in deferred_
  std::vector<double> deferred_spilled_;  // queued results already moved to the host
  double* h_results_ = nullptr;
  DeviceArray<unsigned long long> stats_;
  int stat_capacity_ = 0;
  int stat_slots_ = 0;

  std::map<int, cudaGraphExec_t> graphs_;
  std::set<int> seen_;
  bool capturing_ = false;
  CaptureHold capture_hold_;  // held while capturing_ (capture_guard.cuh)
  int capture_key_ = -1;
  bool produce_on_ = true;  // producer-side quantization (set_producer_quant)
};

}  // namespace

namespace {
CudaBackend& as_cuda(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (!cb) throw Error(msg("backend '", be.name(), "' is not a CUDA backend"));
  return *cb;
}
}  // namespace

cudaStream_t lane_stream(Backend& be, int lane) { return as_cuda(be).stream_of(lane); }

void set_producer_quant(Backend& be, bool on) { as_cuda(be).set_producer_quant(on); }
int64_t producer_quant_hits(Backend& be) { return as_cuda(be).producer_quant_hits(); }

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<cuda::CudaBackend>(device); }

}  // namespace mxlab
