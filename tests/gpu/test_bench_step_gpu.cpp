// `mxlab bench --device cuda` times the trainer's own step: its figures train the run's
// trajectories through the trainer's pieces (each captured into a CUDA graph of its own and
// replayed on lane 0) and its whole unlogged step, so the losses it reports are the ones `mxlab
// run --device cuda` writes at the same step, bit for bit, with graphs and without. The CPU twin
// is tests/cpu/test_bench_step.cpp. No timing is checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "lab/io/h5file.h"
#include "tests/cpu/run_binary_util.h"
#include "tests/cpu/bench_util.h"
#include "tests/gpu/gpu_test_util.h"

using mxlab::test::json_number;
using mxlab::test::run_loss;

TEST(BenchGpu, ReportsTheLossesMxlabRunWritesAtTheSameStep) {
  MXLAB_REQUIRE_GPU();
  const std::string dir = mxlab::testutil::make_temp_dir("bench");
  const std::string exp = dir + "/b.yaml";
  mxlab::testutil::write_bytes(exp, "steps: 40\nseed: 3\nmodel: {depth: 2, width: 64, hidden_mult: 2}\n"
                                    "data: {batch: 96}\nschedule: {name: cosine, warmup: 3, lr_min: 1.0e-5}\n"
                                    "optimizer: {name: adamw, lr: 3.0e-3, weight_decay: 0.1}\nlog: {progress: false}\n");
  const mxlab::testutil::Proc run = mxlab::testutil::run_mxlab({"run", exp, "--out", dir + "/r", "--device", "cuda", "--quiet"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string file = mxlab::testutil::run_file_in(dir + "/r");
  ASSERT_FALSE(file.empty());
  // n = 3 + 4 = 7: the FP32 and MX figures train steps 0..6, the paired figure 7..13.
  for (const bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "CUDA graphs" : "--no-graphs");
    std::vector<std::string> args = {"bench", exp, "--device", "cuda", "--steps", "4", "--warmup", "3"};
    if (!graphs) args.push_back("--no-graphs");
    const mxlab::testutil::Proc bench = mxlab::testutil::run_mxlab(args);
    const std::string& out = bench.output;
    ASSERT_EQ(bench.exit_code, 0) << out;
    EXPECT_GT(json_number(out, "paired_ms"), 0.0) << out;
    EXPECT_EQ(json_number(out, "fp32_loss_step"), 13.0) << out;
    EXPECT_EQ(static_cast<float>(json_number(out, "fp32_loss")), run_loss(file, "fp32", 13)) << out;
    EXPECT_EQ(static_cast<float>(json_number(out, "mx_loss")), run_loss(file, "mx", 13)) << out;
  }
}

// A token network with causal attention and flash attention in bf16 (data.kind: tokens, loss: xent,
// precision.attention: flash_bf16) runs on CUDA from the command line (no refusal: every op it needs
// exists there), and bench's figures train it to the losses `mxlab run` writes, bit for bit.
TEST(BenchGpu, TokenFlashConfigRunsAndBenchesOnCuda) {
  MXLAB_REQUIRE_GPU();
  const std::string dir = mxlab::testutil::make_temp_dir("bench_tokens");
  const std::string exp = dir + "/t.yaml";
  mxlab::testutil::write_bytes(exp, "steps: 20\nseed: 3\nmodel: {depth: 2, width: 32, block: attention, heads: 2, "
                                    "causal: true}\ndata: {batch: 4, seq_len: 16, kind: tokens, vocab: 16}\n"
                                    "loss: xent\nprecision: {block_size: 16, attention: flash_bf16, attention_tile: "
                                    "[8, 8]}\noptimizer: {lr: 1.0e-2}\nlog: {progress: false}\n");
  const mxlab::testutil::Proc run = mxlab::testutil::run_mxlab({"run", exp, "--out", dir + "/r", "--device", "cuda", "--quiet"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string file = mxlab::testutil::run_file_in(dir + "/r");
  ASSERT_FALSE(file.empty());
  const mxlab::testutil::Proc bench =
      mxlab::testutil::run_mxlab({"bench", exp, "--device", "cuda", "--steps", "4", "--warmup", "3"});
  const std::string& out = bench.output;
  ASSERT_EQ(bench.exit_code, 0) << out;
  EXPECT_EQ(json_number(out, "fp32_loss_step"), 13.0) << out;
  EXPECT_EQ(static_cast<float>(json_number(out, "fp32_loss")), run_loss(file, "fp32", 13)) << out;
  EXPECT_EQ(static_cast<float>(json_number(out, "mx_loss")), run_loss(file, "mx", 13)) << out;
}
