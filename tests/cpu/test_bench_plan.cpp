// `mxlab bench --arms K`'s per-extra-arm figure and its records (--csv, the bench cache), and the
// device time `mxlab plan` predicts from a bench cache or, without one, from the stated model
// (lab/runs/bench_records.h, lab/runs/cost_estimate.h). CPU backend, tiny model: no timing is
// checked, only the arithmetic on the numbers the bench measured and the plan's on given ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/runs/bench_records.h"
#include "lab/runs/cost_estimate.h"
#include "mxlab_build_info.h"
#include "tests/cpu/bench_util.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;
using mxlab::test::json_number;
using mxlab::test::run_command;
using mxlab::test::TempDir;

namespace {

const std::string kBin = MXLAB_BINARY;

// A tiny experiment: L = 1, d = 32, B = 16, the shadow pass every 4 steps, on the CPU.
const char* const kTiny =
    "steps: 16\nseed: 3\ndevice: cpu\nmodel: {depth: 1, width: 32, hidden_mult: 2}\n"
    "optimizer: {name: adam, lr: 3.0e-3}\ndata: {batch: 16}\nlog: {progress: false, bias_every: 4}\n";

std::vector<std::string> split_csv_simple(const std::string& line) {  // no quoted commas in the fields read
  std::vector<std::string> f;
  std::string cur;
  bool quoted = false;
  for (const char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) {
      f.push_back(cur);
      cur.clear();
    } else cur += c;
  }
  f.push_back(cur);
  return f;
}

// The CSV's rows by quantity, each as column name -> field.
std::map<std::string, std::map<std::string, std::string>> csv_by_quantity(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = split_csv_simple(line);
  std::map<std::string, std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = split_csv_simple(line);
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < f.size(); ++i) row[header[i]] = f[i];
    rows[row["quantity"]] = row;
  }
  return rows;
}

// The number after `prefix` in `out`, or NaN.
double number_after(const std::string& out, const std::string& prefix) {
  const size_t p = out.find(prefix);
  return p == std::string::npos ? std::nan("") : std::strtod(out.c_str() + p + prefix.size(), nullptr);
}

}  // namespace

// --arms 3: per_extra_arm_ms is (t_3 - t_1) / 2 on the two trainer steps the bench measured, and
// per_extra_arm_mx_ratio that over the MX trajectory step of the same run, in the JSON line, in the
// text and in the --csv records, which carry the device, the revision and the command.
TEST(BenchArms, PerExtraArmIsTheArithmeticOfTheMeasuredStepsInEveryOutput) {
  TempDir dir;
  const std::string exp = dir.write("t.yaml", kTiny), csv = dir.str() + "/r.csv";
  const auto [rc, out] = run_command(kBin + " bench " + exp + " --device cpu --steps 3 --warmup 1 --arms 3 --csv " +
                                     csv + " --bench-file " + dir.str() + "/cache.json");
  ASSERT_EQ(rc, 0) << out;
  const double t1 = json_number(out, "trainer_1arm_ms"), tk = json_number(out, "trainer_arms_ms");
  const double mx = json_number(out, "mx_step_ms"), extra = json_number(out, "per_extra_arm_ms");
  const double ratio = json_number(out, "per_extra_arm_mx_ratio");
  ASSERT_GT(t1, 0.0) << out;
  ASSERT_GT(tk, 0.0) << out;
  ASSERT_GT(mx, 0.0) << out;
  EXPECT_EQ(json_number(out, "arms"), 3.0) << out;
  EXPECT_EQ(extra, (tk - t1) / 2) << out;
  EXPECT_EQ(ratio, extra / mx) << out;
  char want[256];
  std::snprintf(want, sizeof want, "  per extra arm: (%.3f - %.3f) / (3 - 1) = %.3f ms = %.3f x the MX trajectory step (%.3f ms)",
                tk, t1, extra, ratio, mx);
  EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;

  const auto rows = csv_by_quantity(mxlab::test::read_file(csv));
  for (const char* q : {"fp32_step_ms", "mx_step_ms", "shadow_ms", "data_ms", "paired_ms", "trainer_1arm_ms",
                        "trainer_arms_ms", "per_extra_arm_ms", "per_extra_arm_mx_ratio", "curvature_ms"}) {
    ASSERT_TRUE(rows.count(q)) << q;
    const auto& r = rows.at(q);
    EXPECT_EQ(r.at("device"), "cpu") << q;
    EXPECT_EQ(r.at("backend"), "cpu") << q;
    EXPECT_EQ(r.at("revision"), MXLAB_GIT_COMMIT) << q;
    EXPECT_NE(r.at("command").find(" bench " + exp + " --device cpu --steps 3 --warmup 1 --arms 3"), std::string::npos)
        << r.at("command");
    EXPECT_EQ(r.at("config"), exp) << q;
    EXPECT_EQ(r.at("shape"), "mlp layernorm L1 d32 H64 tokens16") << q;
    EXPECT_FALSE(r.at("measured_at").empty()) << q;
  }
  EXPECT_EQ(std::strtod(rows.at("per_extra_arm_ms").at("value").c_str(), nullptr), extra);
  EXPECT_EQ(std::strtod(rows.at("per_extra_arm_mx_ratio").at("value").c_str(), nullptr), ratio);
  EXPECT_EQ(std::strtod(rows.at("trainer_1arm_ms").at("value").c_str(), nullptr), t1);
  EXPECT_EQ(rows.at("per_extra_arm_ms").at("unit"), "ms");
  EXPECT_EQ(rows.at("per_extra_arm_mx_ratio").at("unit"), "ratio");
  EXPECT_EQ(rows.at("per_extra_arm_ms").at("arms"), "3");
  EXPECT_EQ(rows.at("per_extra_arm_ms").at("shadow_every"), "4");
  EXPECT_EQ(rows.at("trainer_1arm_ms").at("arms"), "1");
}

// --csv or --bench-file where nothing can be written: exit 74 before any timing, nothing on stdout.
TEST(BenchArms, AnUnwritableRecordFileFailsBeforeTheTimings) {
  TempDir dir;
  const std::string exp = dir.write("t.yaml", kTiny), file = dir.write("file.txt", "x");
  for (const std::string opt : {"--csv", "--bench-file"}) {
    const auto [rc, out] = run_command("(" + kBin + " bench " + exp + " --device cpu --steps 1 --warmup 0 " + opt + " " +
                                       file + "/sub/r.json 2>/dev/null)");
    EXPECT_EQ(rc, 74) << opt << "\n" << out;
    EXPECT_EQ(out, "") << opt;
  }
}

// One arm has no extra arm; without the MX figure (--only fp32) there is no ratio to it.
TEST(BenchArms, PerExtraArmNeedsTwoArmsAndItsRatioTheMxStep) {
  TempDir dir;
  const std::string exp = dir.write("t.yaml", kTiny), cache = " --bench-file " + dir.str() + "/cache.json";
  auto [rc, out] = run_command(kBin + " bench " + exp + " --device cpu --steps 2 --warmup 1 --arms 1" + cache);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("  per extra arm: - (needs 2 or more arms: --arms K)"), std::string::npos) << out;
  EXPECT_TRUE(std::isnan(json_number(out, "per_extra_arm_ms"))) << out;
  std::tie(rc, out) = run_command(kBin + " bench " + exp + " --device cpu --steps 2 --warmup 1 --arms 2 --only fp32" + cache);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(json_number(out, "per_extra_arm_ms"),
            json_number(out, "trainer_arms_ms") - json_number(out, "trainer_1arm_ms")) << out;
  EXPECT_TRUE(std::isnan(json_number(out, "per_extra_arm_mx_ratio"))) << out;
  EXPECT_NE(out.find("(the MX trajectory step was not timed: --only)"), std::string::npos) << out;
}

// Without --bench-file the bench adds its records to $XDG_CACHE_HOME/mxlab/bench/<device>.json,
// a later bench replaces the quantities it measured again and keeps the others, and plan (for the
// experiment's device, cpu) predicts from that file with the bench's own trainer step.
TEST(BenchCache, BenchWritesTheDevicesCacheAndPlanReadsIt) {
  TempDir dir;
  const std::string exp = dir.write("t.yaml", kTiny), env = "XDG_CACHE_HOME=" + dir.str() + "/xdg HOME=/nonexistent ";
  auto [rc, out] = run_command(env + kBin + " bench " + exp + " --device cpu --steps 2 --warmup 1 --arms 3 --log-steps 2");
  ASSERT_EQ(rc, 0) << out;
  const std::string file = dir.str() + "/xdg/mxlab/bench/cpu.json";
  EXPECT_NE(out.find("records added to " + file), std::string::npos) << out;
  BenchCache c = read_bench_cache(file);
  EXPECT_EQ(c.device, "cpu");
  auto count = [&](const std::string& q) {
    int n = 0;
    for (const BenchRecord& r : c.records) n += r.quantity == q;
    return n;
  };
  ASSERT_EQ(count("per_extra_arm_ms"), 1);
  ASSERT_EQ(count("logged_step_extra_ms"), 1);
  std::tie(rc, out) = run_command(env + kBin + " bench " + exp + " --device cpu --steps 2 --warmup 1 --arms 2");
  ASSERT_EQ(rc, 0) << out;
  c = read_bench_cache(file);
  EXPECT_EQ(count("per_extra_arm_ms"), 1);      // replaced
  EXPECT_EQ(count("logged_step_extra_ms"), 1);  // kept: not measured again
  double t1 = 0.0;
  for (const BenchRecord& r : c.records) {
    if (r.quantity == "per_extra_arm_ms") {
      EXPECT_EQ(r.arms, 2);
    }
    if (r.quantity == "trainer_1arm_ms") t1 = r.value;
  }
  ASSERT_GT(t1, 0.0);
  std::tie(rc, out) = run_command("(" + env + kBin + " plan " + exp + " 2>/dev/null)");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("  from: bench file " + file), std::string::npos) << out;
  EXPECT_NE(out.find(" CPU-hours ("), std::string::npos) << out;
  EXPECT_DOUBLE_EQ(number_after(out, "    t1 = "), std::stod(msg(t1))) << out;
}

// The plan's arithmetic on a bench file of given numbers: K = 3 arms, the shadow every 50 steps,
// logged every 100, a 100-step branch, curvature every 250 steps at 10 iterations; two seeds.
TEST(Plan, PredictsFromAGivenBenchFile) {
  TempDir dir;
  const std::string exp = dir.write(
      "p.yaml",
      "steps: 1000\ndevice: cuda\nmodel: {depth: 2, width: 32, hidden_mult: 2}\ndata: {batch: 16}\n"
      "log: {log_every: 100, bias_every: 50, curvature_every: 250, curvature_iters: 10}\n"
      "arms:\n  - {name: a}\n  - {name: b, set: {weight: bf16}}\n  - {name: c, set: {grad: bf16}}\n"
      "interventions:\n  - {name: br, at: 600, steps: 100, from: a, apply: to_fp32}\n"
      "sweep: {seeds: [0, 1]}\n");
  const std::string shape = "mlp layernorm L2 d32 H64 tokens16";
  auto rec = [&](const char* q, double v, int arms, int every, const std::string& sh, const char* when) {
    return msg("{\"quantity\": \"", q, "\", \"value\": ", v, ", \"unit\": \"ms\", \"arms\": ", arms,
               ", \"shadow_every\": ", every, ", \"device\": \"Test GPU\", \"revision\": \"abc\", \"command\": "
               "\"mxlab bench \\\"x\\\"\", \"config\": \"\", \"shape\": \"", sh, "\", \"step_gflop\": 0.001572864, "
               "\"measured_at\": \"", when, "\"}");
  };
  const std::string head = "{\"format\": \"mxlab-bench-cache\", \"version\": 1, \"device\": \"Test GPU\", \"records\": [";
  const std::string other = "mlp layernorm L4 d32 H64 tokens16";  // another shape, older: never preferred
  const std::string file = dir.write(
      "bench.json", head + rec("trainer_1arm_ms", 4.0, 1, 10, shape, "2026-01-02T00:00:00Z") + ", " +
                        rec("trainer_1arm_ms", 99.0, 1, 10, other, "2026-01-03T00:00:00Z") + ", " +
                        rec("per_extra_arm_ms", 1.0, 8, 10, shape, "2026-01-02T00:00:00Z") + ", " +
                        rec("shadow_ms", 2.5, 0, 0, shape, "2026-01-02T00:00:00Z") + ", " +
                        rec("logged_step_extra_ms", 2.0, 1, 1, shape, "2026-01-02T00:00:00Z") + ", " +
                        rec("curvature_ms", 200.0, 0, 0, shape, "2026-01-02T00:00:00Z") + ", " +
                        "{\"quantity\": \"curvature_iters\", \"value\": 20, \"unit\": \"count\", \"shape\": \"" +
                        shape + "\", \"config\": \"\", \"measured_at\": \"2026-01-02T00:00:00Z\"}]}\n");
  const auto [rc, out] = run_command(kBin + " plan " + exp + " --bench-file " + file);
  ASSERT_EQ(rc, 0) << out;
  // a = 1 + 2.5 (1/50 - 1/10) = 0.8; u = 4 + 2.5 (1/50 - 1/10) + 2 a = 5.4; 11 logged steps (0, 100, ..., 900
  // and 999) at 2 (1 + 3)/(1 + 1) = 4 ms; 100 branch steps at a; 3 curvature measurements (250, 500, 750) of
  // 4 trajectories at 200 x 10/20 ms: 400 ms each; start-up 1000 ms (the stated model's).
  const double per_run_ms = 1000 + 1000 * 5.4 + 100 * 0.8 + 11 * 4.0 + 3 * 400.0;  // 7724 ms
  EXPECT_NE(out.find("  runs 0-1 (2): N 1000, K 3, b 50: u 5.4 ms, a 0.8 ms; 11 logged steps (+4 ms each), "
                     "100 branch steps, 3 curvature measurements (400 ms each), start-up 1000 ms: 7.724 s a run"),
            std::string::npos)
      << out;
  EXPECT_NEAR(number_after(out, " GPU-hours ("), 2 * per_run_ms / 1000, 2 * per_run_ms / 1000 * 1e-5) << out;  // 6 digits
  EXPECT_NE(out.find(" on Test GPU,"), std::string::npos) << out;
  EXPECT_NE(out.find("  from: bench file " + file), std::string::npos) << out;
  EXPECT_NE(out.find("    t1 = 4  the trainer's step with 1 arm, shadow every 10  [trainer_1arm_ms: abc, "
                     "2026-01-02T00:00:00Z]"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("    T0 = 1000  a run's start-up  [stated: "), std::string::npos) << out;

  // Only records of another shape: each scaled by the student's GEMM FLOPs, 0.000786432 / 0.001572864.
  const std::string scaled = dir.write("scaled.json", head + rec("trainer_1arm_ms", 4.0, 1, 10, other, "2026-01-02T00:00:00Z") + "]}\n");
  const auto [rc2, out2] = run_command(kBin + " plan " + exp + " --bench-file " + scaled);
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("    t1 = 2  the trainer's step with 1 arm, shadow every 10  [trainer_1arm_ms: abc, "
                      "2026-01-02T00:00:00Z, at " + other + ", scaled x0.5 by the student's GEMM FLOPs]"),
            std::string::npos)
      << out2;
  EXPECT_NE(out2.find("[stated: H100, fig4_baseline --arms 8, d43e7af, scaled x"), std::string::npos) << out2;
}

// Among records of the run's shape from other experiments, plan takes the extra arm's cost from a
// bench of copies of the base recipe (`--arms K`) before a newer one that timed another
// experiment's own arms (a rotated or noise arm costs more than twice a plain one); with only the
// latter, it uses that.
TEST(Plan, PrefersCopiesOfTheBaseRecipeOverAnotherExperimentsOwnArms) {
  TempDir dir;
  const std::string exp = dir.write("p.yaml",
                                    "steps: 100\ndevice: cuda\nmodel: {depth: 2, width: 32, hidden_mult: 2}\n"
                                    "data: {batch: 16}\narms:\n  - {name: a}\n  - {name: b}\n");
  const std::string shape = "mlp layernorm L2 d32 H64 tokens16";
  auto rec = [&](const char* q, double v, int arms, const char* command, const char* config, const char* when) {
    return msg("{\"quantity\": \"", q, "\", \"value\": ", v, ", \"unit\": \"ms\", \"arms\": ", arms,
               ", \"shadow_every\": 10, \"device\": \"Test GPU\", \"revision\": \"abc\", \"command\": \"",
               command, "\", \"config\": \"", config, "\", \"shape\": \"", shape,
               "\", \"step_gflop\": 0.001572864, \"measured_at\": \"", when, "\"}");
  };
  const std::string head = "{\"format\": \"mxlab-bench-cache\", \"version\": 1, \"device\": \"Test GPU\", \"records\": [";
  const std::string copies = rec("per_extra_arm_ms", 1.25, 8, "mxlab bench /x/base.yaml --arms 8", "/x/base.yaml",
                                 "2026-01-02T00:00:00Z");
  const std::string own = rec("per_extra_arm_ms", 2.5, 3, "mxlab bench /x/rot.yaml", "/x/rot.yaml", "2026-01-03T00:00:00Z");
  const std::string both = dir.write("both.json", head + copies + ", " + own + "]}\n");
  const auto [rc, out] = run_command(kBin + " plan " + exp + " --bench-file " + both);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[per_extra_arm_ms: abc, 2026-01-02T00:00:00Z]"), std::string::npos) << out;
  EXPECT_EQ(out.find("[per_extra_arm_ms: abc, 2026-01-03T00:00:00Z]"), std::string::npos) << out;
  const std::string only_own = dir.write("own.json", head + own + "]}\n");
  const auto [rc2, out2] = run_command(kBin + " plan " + exp + " --bench-file " + only_own);
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("[per_extra_arm_ms: abc, 2026-01-03T00:00:00Z]"), std::string::npos) << out2;
}

// Without a bench of the device, plan says it uses the stated H100 model and predicts from it:
// the paper's shape, 1 arm, the shadow every 10 steps as measured, 100 steps logged every 10.
TEST(Plan, WithoutABenchItUsesTheStatedModel) {
  TempDir dir;
  const std::string exp = dir.write(
      "paper.yaml", "steps: 100\ndevice: auto\nmodel: {depth: 4, width: 512, hidden_mult: 4}\ndata: {batch: 2048}\n"
                    "log: {log_every: 10, bias_every: 10}\n");
  const std::string env = "XDG_CACHE_HOME= HOME=" + dir.str() + "/home ";
  auto [rc, out] = run_command("(" + env + kBin + " plan " + exp + " 2>/dev/null)");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("  from: the stated H100 model (kernels/PERF.md, \"Arms at the GPU's throughput: plan\"): "
                     "no bench of a GPU in " + dir.str() + "/home/.cache/mxlab/bench;"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(" GPU-hours (") , std::string::npos) << out;
  EXPECT_NE(out.find(" on NVIDIA H100 80GB HBM3,"), std::string::npos) << out;
  // u = t1 = 3.983 ms; 11 logged steps at 2.354 (1 + 1)/(1 + 1) ms; start-up 1000 ms.
  const double want_s = (1000 + 100 * 3.983 + 11 * 2.354) / 1000;
  EXPECT_NEAR(number_after(out, " GPU-hours ("), want_s, want_s * 1e-5) << out;  // printed to 6 digits
  for (const char* line : {"    t1 = 3.983  the trainer's step with 1 arm, shadow every 10  [stated: ",
                           "    A  = 1.139  per extra arm, shadow every 10  [stated: ",
                           "    S  = 2.531  shadow pass", "    L  = 2.354  a logged step over an unlogged one"})
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;

  // For the CPU there is no stated model.
  std::tie(rc, out) = run_command("(" + env + kBin + " plan " + exp + " --device cpu 2>/dev/null)");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("predicted device time: none (no bench of the CPU in " + dir.str() + "/home/.cache/mxlab/bench;"),
            std::string::npos)
      << out;

  // A --bench-file that is not one: exit 2, one line, no table.
  const std::string bad = dir.write("bad.json", "{\"format\": \"something else\"}\n");
  std::tie(rc, out) = run_command(kBin + " plan " + exp + " --bench-file " + bad);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_EQ(out.find("total:"), std::string::npos) << out;
  EXPECT_NE(out.find("not a bench cache file"), std::string::npos) << out;
}

// The cache file round-trips every byte of its text fields (quotes, backslashes, control bytes,
// UTF-8), and its name is the device's letters and digits.
TEST(BenchCache, RecordsRoundTripAndFileNames) {
  TempDir dir;
  BenchRecord r;
  r.quantity = "mx_step_ms";
  r.value = 0.98312345678901234;
  r.unit = "ms";
  r.arms = 3;
  r.shadow_every = 10;
  r.device = "NVIDIA H100 80GB HBM3";
  r.command = "mxlab bench 'a b' \"q\" back\\slash\ttab é";
  r.config = "/x/y.yaml";
  r.shape = "mlp layernorm L4 d512 H2048 tokens2048";
  r.step_gflop = 103.079215104;
  r.measured_at = "2026-11-28T10:00:00Z";
  const std::string path = dir.str() + "/sub/dir/c.json";
  write_bench_cache(path, r.device, {r});
  const BenchCache c = read_bench_cache(path);
  ASSERT_EQ(c.records.size(), 1u);
  const BenchRecord& b = c.records[0];
  EXPECT_EQ(b.quantity, r.quantity);
  EXPECT_EQ(b.value, r.value);
  EXPECT_EQ(b.command, r.command);
  EXPECT_EQ(b.arms, 3);
  EXPECT_EQ(b.shadow_every, 10);
  EXPECT_EQ(b.step_gflop, r.step_gflop);
  EXPECT_EQ(c.device, r.device);
  EXPECT_EQ(c.latest(), r.measured_at);
  EXPECT_EQ(bench_file_name("NVIDIA H100 80GB HBM3"), "NVIDIA_H100_80GB_HBM3.json");
  EXPECT_EQ(bench_file_name("cpu"), "cpu.json");
  EXPECT_EQ(bench_file_name("../.."), "device.json");
}
