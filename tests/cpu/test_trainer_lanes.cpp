// The trainer's use of lanes (CUDA streams), checked on the CPU. LaneCheckingBackend runs every
// op on the CPU backend at once and also places it on a lane as the CUDA backend issues it
// (kernels/cuda_backend.cu: set_lane forks from lane 0, join, wait_lane, the synchronising ops
// join first), with a vector clock per lane for the order the lanes' events impose. Each access
// of an op to a buffer is checked against the earlier accesses of other ops to the same buffer:
// a write and another access on two lanes must be ordered by events, or the GPU may run them in
// either order (a race). The tests:
//   - the checker itself finds an unordered write and accepts the orders fork, join and
//     wait_lane make (else the trainer tests below could pass by finding nothing);
//   - a multi-arm run with a shadow pass, a branch and log steps issues no race under either
//     order of the updates (Trainer::set_arm_update): each MX trajectory's update, issued on a
//     lane right after its passes, waits for its shadow pass (which reads the weights the update
//     overwrites) and nothing later reads the old weights unordered;
//   - under `lanes` the unlogged steps' MX updates really run off lane 0, under `joined` on it;
//   - both orders write the same rows and losses, bit for bit (no update is lost or doubled).
// The CUDA twin (bits under both orders on a GPU): ArmsGpu.UpdatesOnTheLanesWriteTheJoinedOrdersBits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lab/config/config_io.h"
#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/model/backend.h"
#include "lab/train/trainer.h"

using namespace mxlab;

namespace {

class LaneCheckingBackend final : public Backend {
 public:
  explicit LaneCheckingBackend(int lanes = 8) : lanes_(lanes), vc_(lanes, Clock(lanes, 0)), forked_(lanes, false) {}

  std::vector<std::string> races;          // the first few, described
  size_t race_count = 0;
  std::map<int, size_t> adam_on_lane;      // optimizer updates per lane

  // ---- the lane model (as kernels/cuda_backend.cu) ----
  int lanes() const override { return lanes_; }
  void set_lane(int lane) override {
    check_lane(lane);
    if (lane == cur_) return;
    cur_ = lane;
    if (lane != 0) fork(lane);
  }
  void join() override {
    for (int i = 1; i < lanes_; ++i)
      if (forked_[i]) {
        merge(vc_[0], vc_[i]);
        forked_[i] = false;
      }
    cur_ = 0;
  }
  void wait_lane(int waiter, int waited) override {
    check_lane(waiter);
    check_lane(waited);
    if (waiter == waited) return;
    if (waited != 0 && !forked_[waited]) return;
    if (waiter != 0 && !forked_[waiter]) fork(waiter);
    merge(vc_[waiter], vc_[waited]);
  }

  // ---- memory ----
  std::string name() const override { return "lane-checking-cpu"; }
  std::string math_mode() const override { return in_->math_mode(); }
  float* alloc(size_t n) override {
    float* p = in_->alloc(n);
    allocs_[p] = {n, allocs_.size()};
    return p;
  }
  void upload(float* d, const float* s, size_t n) override {
    op("upload", {}, {d});
    in_->upload(d, s, n);
  }
  void download(float* d, const float* s, size_t n) override {
    sync_op("download", {s}, {});
    in_->download(d, s, n);
  }
  void copy(float* d, const float* s, size_t n) override {
    op("copy", {s}, {d});
    in_->copy(d, s, n);
  }
  void fill(float* d, float v, size_t n) override {
    op("fill", {}, {d});
    in_->fill(d, v, n);
  }
  void set_step(const StepScalars& s) override {
    sync_op("set_step", {}, {});
    in_->set_step(s);
  }

  // ---- the ops (reads: const pointers; writes: the others) ----
  void randn(float* o, size_t n, uint64_t s, Stream st, float sc) override {
    op("randn", {}, {o});
    in_->randn(o, n, s, st, sc);
  }
  void add_randn(float* o, size_t n, uint64_t s, Stream st, float sc) override {
    op("add_randn", {o}, {o});
    in_->add_randn(o, n, s, st, sc);
  }
  void quantize(const float* i, float* o, int64_t rows, int64_t cols, Axis ax, const QuantSpec& s, int slot) override {
    op("quantize", {i}, {o});
    in_->quantize(i, o, rows, cols, ax, s, slot);
  }
  void round_bf16(float* x, size_t n, Rounding m) override {
    op("round_bf16", {x}, {x});
    in_->round_bf16(x, n, m);
  }
  void gemm(int64_t M, int64_t N, int64_t K, const GemmOperand& a, const GemmOperand& b, float* C, float beta,
            const ElementwiseRound& out) override {
    op("gemm", {a.p, b.p, beta != 0.0f ? C : nullptr}, {C});
    in_->gemm(M, N, K, a, b, C, beta, out);
  }
  void prequantize(const AheadOperand* ops, size_t n) override {
    std::vector<const float*> reads;
    for (size_t i = 0; i < n; ++i) reads.push_back(ops[i].op.p);
    op("prequantize", reads, {});  // the CUDA backend quantizes them now, on this lane
    in_->prequantize(ops, n);
  }
  void layernorm_fwd(const float* x, const float* g, const float* b, float* y, float* xh, float* rs, int64_t rows,
                     int64_t d, float eps, const ElementwiseRound& R, const GemmOperand* qout) override {
    op("layernorm_fwd", {x, g, b}, {y, xh, rs});
    in_->layernorm_fwd(x, g, b, y, xh, rs, rows, d, eps, R, qout);
  }
  void layernorm_bwd(const float* dy, const float* xh, const float* rs, const float* g, float* dx, float* dg,
                     float* db, int64_t rows, int64_t d, const ElementwiseRound& R,
                     const ElementwiseRound& Rdy) override {
    op("layernorm_bwd", {dy, xh, rs, g}, {dx, dg, db});
    in_->layernorm_bwd(dy, xh, rs, g, dx, dg, db, rows, d, R, Rdy);
  }
  void act_fwd(Act a, const float* h, float* o, int64_t rows, int64_t cols, const ElementwiseRound& R,
               const ElementwiseRound& Rh, const GemmOperand* qout) override {
    op("act_fwd", {h}, {o});
    in_->act_fwd(a, h, o, rows, cols, R, Rh, qout);
  }
  void act_bwd(Act a, const float* h, const float* da, float* dh, int64_t rows, int64_t cols,
               const ElementwiseRound& R, const ElementwiseRound& Rh, const ElementwiseRound& Rda,
               const GemmOperand* qout) override {
    op("act_bwd", {h, da}, {dh});
    in_->act_bwd(a, h, da, dh, rows, cols, R, Rh, Rda, qout);
  }
  void residual_add(float* o, const float* x, const float* y, const float* b, int64_t rows, int64_t d,
                    const ElementwiseRound& R, const ElementwiseRound& Ry) override {
    op("residual_add", {x, y, b}, {o});
    in_->residual_add(o, x, y, b, rows, d, R, Ry);
  }
  void col_sum(const float* x, float* o, int64_t rows, int64_t d) override {
    op("col_sum", {x}, {o});
    in_->col_sum(x, o, rows, d);
  }
  void add(float* d, const float* a, const float* b, size_t n, const ElementwiseRound& R, const GemmOperand* qout,
           int64_t qc) override {
    op("add", {a, b}, {d});
    in_->add(d, a, b, n, R, qout, qc);
  }
  void loss_mse(const float* o, const float* t, float* d, float* l, float* h, int64_t rows, int64_t c,
                const ElementwiseRound& R) override {
    op("loss_mse", {o, t}, {d, l, h});
    in_->loss_mse(o, t, d, l, h, rows, c, R);
  }
  void loss_kl(const float* o, const float* t, float* d, float* l, float* h, int64_t rows, int64_t c, float T,
               const ElementwiseRound& R) override {
    op("loss_kl", {o, t}, {d, l, h});
    in_->loss_kl(o, t, d, l, h, rows, c, T, R);
  }
  void adam(float* p, const float* g, float* m, float* v, size_t n, const AdamHyper& h) override {
    op("adam", {g, p, m, v}, {p, m, v});
    ++adam_on_lane[cur_];
    in_->adam(p, g, m, v, n, h);
  }
  void sgd(float* p, const float* g, float* b, size_t n, float m, float wd) override {
    op("sgd", {g, p, b}, {p, b});
    in_->sgd(p, g, b, n, m, wd);
  }
  void reduce(const Reduction* rq, size_t c, double* o) override {
    std::vector<const float*> reads;
    for (size_t i = 0; i < c; ++i) reads.insert(reads.end(), {rq[i].a, rq[i].b});
    sync_op("reduce", reads, {});
    in_->reduce(rq, c, o);
  }
  float read_scalar(const float* p) override {
    sync_op("read_scalar", {p}, {});
    return in_->read_scalar(p);
  }
  void moments(const float* x, size_t n, double o[4]) override {
    sync_op("moments", {x}, {});
    in_->moments(x, n, o);
  }
  void reset_stats(int slots) override {
    sync_op("reset_stats", {}, {});
    in_->reset_stats(slots);
  }
  std::vector<QuantStats> read_stats() override {
    sync_op("read_stats", {}, {});
    return in_->read_stats();
  }
  QuantGap quant_gap(const float* x, int64_t rows, int64_t cols, Axis axis, const QuantSpec& q, bool first,
                     Rounding mode) override {
    sync_op("quant_gap", {x}, {});
    return in_->quant_gap(x, rows, cols, axis, q, first, mode);
  }

  // ---- for the checker's own test ----
  void touch(const char* name, const std::vector<const float*>& reads, const std::vector<const float*>& writes) {
    op(name, reads, writes);
  }

 private:
  using Clock = std::vector<uint64_t>;
  struct Access {
    int lane = -1;
    uint64_t clock = 0;
    std::string op;
  };
  struct Buffer {
    Access write;                // the last write (lane -1: none)
    std::vector<Access> reads;   // per lane, its last read since that write
  };

  void check_lane(int lane) const {
    if (lane < 0 || lane >= lanes_) throw Error(msg("lane ", lane, " out of range"));
  }
  static void merge(Clock& into, const Clock& from) {
    for (size_t i = 0; i < into.size(); ++i) into[i] = std::max(into[i], from[i]);
  }
  void fork(int lane) {
    merge(vc_[lane], vc_[0]);
    forked_[lane] = true;
  }
  // The allocation holding p (index; -1: host memory or null).
  long find(const float* p) const {
    if (!p) return -1;
    auto it = allocs_.upper_bound(p);
    if (it == allocs_.begin()) return -1;
    --it;
    return p < it->first + it->second.first ? static_cast<long>(it->second.second) : -1;
  }
  bool ordered(const Access& a, const Clock& now) const { return a.lane < 0 || now[a.lane] >= a.clock; }
  void race(const Access& earlier, const char* what, const std::string& op, long buf) {
    ++race_count;
    if (races.size() < 8)
      races.push_back(msg(op, " on lane ", cur_, " ", what, " buffer b", buf, " unordered after ", earlier.op,
                          " on lane ", earlier.lane));
  }
  void op(const std::string& name, const std::vector<const float*>& reads, const std::vector<const float*>& writes) {
    const int l = cur_;
    ++vc_[l][l];
    const Clock& now = vc_[l];
    const Access me{l, now[l], name};
    for (const float* p : reads) {
      const long b = find(p);
      if (b < 0) continue;
      Buffer& st = bufs_[b];
      if (!ordered(st.write, now)) race(st.write, "reads", name, b);
      if (st.reads.empty()) st.reads.resize(lanes_);
      st.reads[l] = me;
    }
    for (const float* p : writes) {
      const long b = find(p);
      if (b < 0) continue;
      Buffer& st = bufs_[b];
      if (!ordered(st.write, now)) race(st.write, "writes", name, b);
      for (const Access& r : st.reads)
        if (r.lane != l && !ordered(r, now)) race(r, "writes", name, b);
      st.write = me;
      st.reads.assign(lanes_, Access{});
    }
  }
  // A synchronising op: on lane 0 after the lanes join (as the CUDA backend runs them).
  void sync_op(const std::string& name, const std::vector<const float*>& reads,
               const std::vector<const float*>& writes) {
    join();
    op(name, reads, writes);
  }

  std::unique_ptr<Backend> in_ = make_cpu_backend();
  int lanes_;
  int cur_ = 0;
  std::vector<Clock> vc_;
  std::vector<bool> forked_;
  std::map<const float*, std::pair<size_t, size_t>> allocs_;  // start -> (floats, index)
  std::map<long, Buffer> bufs_;
};

// Four arms (the fourth shares its shadow lane with the first arm's training lane), a shadow pass
// every 3 steps, a log step every 5, a branch from an arm at step 7 (a fifth MX trajectory).
RunConfig four_arms() {
  RunConfig c;
  c.seed = 3;
  c.steps = 16;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 2;
  c.data.batch = 32;
  c.optimizer.lr = 3e-3f;
  c.log.log_every = 5;
  c.log.bias_every = 3;
  c.log.progress = false;
  c.arms = {{"a", "", {}},
            {"even", "", {{"rounding", "nearest_even"}}},
            {"rceil", "", {{"scale_rule", "rceil"}}},
            {"b", "", {{"rounding.grad", "nearest_even"}}}};
  c.interventions = {{"fp32_at7", 7, "to_fp32", {}, "even"}};
  validate_config(c);
  return c;
}

struct Outcome {
  MemorySink sink;
  std::vector<std::string> races;
  size_t race_count = 0;
  std::map<int, size_t> adam_on_lane;
};

Outcome run_checked(const RunConfig& cfg, Trainer::ArmUpdate order) {
  LaneCheckingBackend be;
  Outcome o;
  {
    Trainer tr(cfg, be, o.sink);
    tr.set_arm_update(order);
    tr.open_output();
    tr.finish(tr.run(RunControl{}));
  }
  o.races = be.races;
  o.race_count = be.race_count;
  o.adam_on_lane = be.adam_on_lane;
  return o;
}

std::string joined_lines(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b); }

}  // namespace

TEST(TrainerLanes, TheCheckerFindsAnUnorderedWriteAndAcceptsForkJoinAndWaitLane) {
  LaneCheckingBackend be;
  float* x = be.alloc(4);
  float* y = be.alloc(4);
  // Two lanes forked from lane 0 both read x: no race.
  be.touch("w0", {}, {x});
  be.set_lane(1);
  be.touch("r1", {x}, {y});
  be.set_lane(2);
  be.touch("r2", {x}, {});
  EXPECT_EQ(be.race_count, 0u) << joined_lines(be.races);
  // Lane 2 writes y, which lane 1 wrote, with nothing ordering them: a race.
  be.touch("w2", {}, {y});
  EXPECT_EQ(be.race_count, 1u);
  // Lane 1 writes x that lane 2 has read: a race, unless lane 1 waits for lane 2 first.
  be.set_lane(1);
  be.touch("w1", {}, {x});
  EXPECT_EQ(be.race_count, 2u);
  be.wait_lane(1, 2);
  be.touch("w1 after wait", {}, {x});
  EXPECT_EQ(be.race_count, 2u) << joined_lines(be.races);
  // After the join lane 0 sees everything; a lane forked afterwards too.
  be.join();
  be.touch("r0", {x, y}, {});
  be.set_lane(3);
  be.touch("w3", {}, {x, y});
  EXPECT_EQ(be.race_count, 2u) << joined_lines(be.races);
  // A wait for a lane's earlier work does not cover what that lane does after the wait.
  be.set_lane(4);
  be.wait_lane(4, 3);
  be.set_lane(3);
  be.touch("w3 again", {}, {y});
  be.set_lane(4);
  be.touch("r4", {y}, {});
  EXPECT_EQ(be.race_count, 3u) << joined_lines(be.races);
}

TEST(TrainerLanes, NeitherOrderOfTheUpdatesRacesAndBothWriteTheSameBits) {
  const RunConfig cfg = four_arms();
  const Outcome lanes = run_checked(cfg, Trainer::ArmUpdate::lanes);
  const Outcome joined = run_checked(cfg, Trainer::ArmUpdate::joined);
  EXPECT_EQ(lanes.race_count, 0u) << joined_lines(lanes.races);
  EXPECT_EQ(joined.race_count, 0u) << joined_lines(joined.races);

  // Steps 0, 5, 10 and 15 log (their updates on lane 0 after the join). Under `lanes` the unlogged
  // steps 1-4, 6-9 and 11-14 update every MX trajectory off lane 0: the 4 arms (12 steps each) and
  // the branch, which trains from step 7 (7, 8, 9, 11, 12, 13, 14).
  size_t off_main = 0, all = 0;
  for (const auto& [lane, n] : lanes.adam_on_lane) {
    all += n;
    if (lane != 0) off_main += n;
  }
  EXPECT_EQ(off_main, 12u * 4u + 7u);
  size_t joined_all = 0;
  for (const auto& [lane, n] : joined.adam_on_lane) {
    joined_all += n;
    EXPECT_EQ(lane, 0) << n << " updates off lane 0 under `joined`";
  }
  EXPECT_EQ(all, joined_all);

  // The same rows and loss histories, bit for bit.
  ASSERT_EQ(lanes.sink.groups.size(), joined.sink.groups.size());
  size_t values = 0;
  for (const auto& [name, g] : joined.sink.groups) {
    ASSERT_TRUE(lanes.sink.groups.count(name)) << name;
    const auto& h = lanes.sink.groups.at(name);
    EXPECT_EQ(h.loss_all, g.loss_all) << name;
    ASSERT_EQ(h.rows.size(), g.rows.size()) << name;
    for (size_t i = 0; i < g.rows.size(); ++i) {
      ASSERT_EQ(h.rows[i].step, g.rows[i].step) << name;
      ASSERT_EQ(h.rows[i].axis, g.rows[i].axis) << name;
      ASSERT_EQ(h.rows[i].cols.size(), g.rows[i].cols.size()) << name;
      for (size_t c = 0; c < g.rows[i].cols.size(); ++c) {
        ASSERT_EQ(h.rows[i].cols[c].first, g.rows[i].cols[c].first);
        ASSERT_EQ(h.rows[i].cols[c].second.size(), g.rows[i].cols[c].second.size());
        for (size_t k = 0; k < g.rows[i].cols[c].second.size(); ++k, ++values)
          ASSERT_TRUE(same_bits(h.rows[i].cols[c].second[k], g.rows[i].cols[c].second[k]))
              << name << " step " << g.rows[i].step << " " << g.rows[i].cols[c].first << "[" << k << "]";
      }
    }
  }
  EXPECT_GT(values, 1000u);
  EXPECT_EQ(lanes.sink.groups.at("branches/fp32_at7").loss_all.size(), 9u);  // trained 7 .. 15
}

// The order is fixed once unlogged steps have run (their recorded steps replay it).
TEST(TrainerLanes, TheOrderCannotChangeAfterUnloggedSteps) {
  RunConfig cfg = four_arms();
  LaneCheckingBackend be;
  MemorySink sink;
  Trainer tr(cfg, be, sink);
  tr.set_arm_update(Trainer::ArmUpdate::joined);
  tr.set_arm_update(Trainer::ArmUpdate::lanes);
  tr.open_output();
  tr.run(RunControl{}, 3);
  tr.set_arm_update(Trainer::ArmUpdate::lanes);  // unchanged: fine
  EXPECT_THROW(tr.set_arm_update(Trainer::ArmUpdate::joined), std::exception);
}
