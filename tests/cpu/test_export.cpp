// `mxlab export RUN.h5 --csv DIR`: the file names, the columns (per-layer and per-group metrics
// flattened), and values that read back to exactly what the HDF5 datasets hold; the number
// format on its own.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/cpu/cpu_backend.h"
#include "lab/io/h5file.h"
#include "lab/report/csv_export.h"
#include "lab/io/table_text.h"
#include "lab/runs/run_driver.h"
#include "lab/config/config_io.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {

using mxlab::test::TempDir;
using mxlab::test::run_command;


std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    rows.push_back(cells);
  }
  return rows;
}

// A CSV number equals the stored value: float32 values read back through float, others exactly.
::testing::AssertionResult same_value(const std::string& text, double stored) {
  const double v = std::strtod(text.c_str(), nullptr);
  if (std::isnan(stored)) {
    return std::isnan(v) ? ::testing::AssertionSuccess()
                         : ::testing::AssertionFailure() << "'" << text << "' for NaN";
  }
  const bool is_float = static_cast<double>(static_cast<float>(stored)) == stored;
  const bool ok = is_float ? static_cast<float>(v) == static_cast<float>(stored) : v == stored;
  if (ok) return ::testing::AssertionSuccess();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", stored);
  return ::testing::AssertionFailure() << "'" << text << "' does not read back to " << buf;
}

RunConfig tiny_run() {
  RunConfig c;
  c.name = "export";
  c.seed = 3;
  c.steps = 30;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 2;
  c.data.batch = 32;
  c.optimizer.lr = 3e-3f;
  c.log.log_every = 4;
  c.log.progress = false;
  InterventionConfig iv;
  iv.name = "fp32_late";
  iv.at = 12;
  iv.apply = "to_fp32";
  c.interventions.push_back(iv);
  return c;
}

}  // namespace

TEST(Export, NumberFormatRoundTrips) {
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isfinite(f)) continue;
    const std::string s = csv_number(f);
    EXPECT_EQ(static_cast<float>(std::strtod(s.c_str(), nullptr)), f) << s;
    EXPECT_LE(s.size(), 15u) << s << ": float32 values use %.9g";
    uint64_t b64 = (static_cast<uint64_t>(rng()) << 32) | rng();
    double d;
    std::memcpy(&d, &b64, 8);
    if (!std::isfinite(d)) continue;
    const std::string t = csv_number(d);
    EXPECT_EQ(std::strtod(t.c_str(), nullptr), d) << t;
  }
  EXPECT_EQ(csv_number(0.1f), "0.100000001");
  EXPECT_EQ(csv_number(0.1), "0.10000000000000001");
  EXPECT_EQ(csv_number(std::nan("")), "nan");
  EXPECT_EQ(csv_number(-INFINITY), "-inf");
  EXPECT_EQ(csv_number(3.0), "3");
}

TEST(Export, CsvColumnsAndValuesMatchTheRunFile) {
  TempDir dir;
  RunOptions opt;
  opt.out_dir = dir.str();
  opt.make_backend = [](const std::string&) { return make_cpu_backend(); };
  const RunOutcome r = run_one(tiny_run(), opt);
  ASSERT_EQ(to_string(r.status), std::string("complete")) << r.error;

  const std::string csv_dir = dir.str() + "/csv";
  auto [rc, out] = run_command(std::string(MXLAB_BINARY) + " export " + r.path + " --csv " + csv_dir);
  ASSERT_EQ(rc, 0) << out;
  const std::string id = r.run_id;
  const std::map<std::string, std::string> groups = {
      {"fp32", "trajectories/fp32"}, {"mx", "trajectories/mx"}, {"branch-fp32_late", "branches/fp32_late"}};
  // The binary lists what it wrote (fp32, mx, branches, then the summary).
  EXPECT_NE(out.find(csv_dir + "/" + id + "_summary.csv"), std::string::npos) << out;
  for (const auto& [tag, g] : groups) {
    EXPECT_NE(out.find(csv_dir + "/" + id + "_" + tag + ".csv\n"), std::string::npos) << out;
    EXPECT_NE(out.find(csv_dir + "/" + id + "_" + tag + "_loss_all.csv\n"), std::string::npos) << out;
  }

  h5::H5File f(r.path, h5::H5File::Mode::read);
  const int L = tiny_run().model.depth;
  for (const auto& [tag, g] : groups) {
    const auto rows = read_csv(csv_dir + "/" + id + "_" + tag + ".csv");
    ASSERT_GE(rows.size(), 2u);
    const std::vector<std::string>& header = rows[0];
    ASSERT_EQ(header[0], "step");
    ASSERT_EQ(header[1], "loss");
    // Column -> (dataset, index within the row).
    std::map<std::string, std::pair<std::string, size_t>> where;
    for (const std::string& d : f.list_datasets(g)) {
      if (d == "step" || d == "loss_all") continue;
      // Series on their own axis (shadow_step, ...) have files of their own
      // (InstrumentsTrainer.ExportWritesEachSeriesToItsOwnCsv).
      if (f.has_attr(g + "/" + d, "axis") || (d.size() > 5 && d.compare(d.size() - 5, 5, "_step") == 0)) continue;
      const auto shape = f.dataset_shape(g + "/" + d);
      if (shape.size() == 1) {
        where[d] = {d, 0};
      } else {
        const bool per_group = f.has_attr(g + "/" + d, "names");
        const auto names = per_group ? f.get_attr_strings(g + "/" + d, "names") : std::vector<std::string>{};
        for (size_t k = 0; k < shape[1]; ++k)
          where[per_group ? d + "_" + names[k] : d + "_layer" + std::to_string(k)] = {d, k};
      }
    }
    EXPECT_EQ(header.size(), where.size() + 1) << tag;
    for (int k = 0; k < L; ++k) EXPECT_TRUE(where.count("gamma_lastbin_layer" + std::to_string(k))) << tag;
    const bool mx_like = tag != "fp32";
    EXPECT_EQ(where.count("bias_ratio"), mx_like ? 1u : 0u) << tag;
    const bool has_group_cols = std::any_of(where.begin(), where.end(), [](const auto& kv) {
      return kv.first.rfind("bias_ratio_group_", 0) == 0;
    });
    EXPECT_EQ(has_group_cols, mx_like) << tag << ": per-group columns are named by the group";
    const std::vector<int64_t> steps = f.read_int64s(g + "/step");
    ASSERT_EQ(rows.size(), steps.size() + 1) << tag;
    std::map<std::string, std::vector<double>> cache;
    size_t checked = 0;
    for (size_t c = 1; c < header.size(); ++c) {
      ASSERT_TRUE(where.count(header[c])) << tag << ": unexpected column " << header[c];
      const auto& [d, k] = where[header[c]];
      if (!cache.count(d)) cache[d] = f.read_doubles(g + "/" + d);
      const auto shape = f.dataset_shape(g + "/" + d);
      const size_t width = shape.size() == 2 ? shape[1] : 1;
      for (size_t i = 0; i < steps.size(); ++i) {
        ASSERT_EQ(rows[i + 1].size(), header.size()) << tag << " row " << i;
        ASSERT_EQ(rows[i + 1][0], std::to_string(steps[i]));
        ASSERT_TRUE(same_value(rows[i + 1][c], cache[d][i * width + k])) << tag << " " << header[c] << " row " << i;
        ++checked;
      }
    }
    EXPECT_GT(checked, 100u) << tag;

    // loss_all: every step run, absolute step numbers (a branch starts at its `at`).
    const auto all = read_csv(csv_dir + "/" + id + "_" + tag + "_loss_all.csv");
    const std::vector<double> loss = f.read_doubles(g + "/loss_all");
    ASSERT_EQ(all.size(), loss.size() + 1) << tag;
    EXPECT_EQ(all[0], (std::vector<std::string>{"step", "loss"}));
    const int64_t first = tag.rfind("branch-", 0) == 0 ? 12 : 0;
    for (size_t i = 0; i < loss.size(); ++i) {
      EXPECT_EQ(all[i + 1][0], std::to_string(first + static_cast<int64_t>(i))) << tag;
      EXPECT_EQ(static_cast<float>(std::strtod(all[i + 1][1].c_str(), nullptr)), static_cast<float>(loss[i])) << tag;
    }
  }

  // The summary: one row per trajectory/branch with the file's summary attributes.
  const auto sum = read_csv(csv_dir + "/" + id + "_summary.csv");
  ASSERT_EQ(sum.size(), 4u);
  const std::vector<std::string>& h = sum[0];
  auto col = [&](const std::string& name) { return static_cast<size_t>(std::find(h.begin(), h.end(), name) - h.begin()); };
  ASSERT_LT(col("final_loss"), h.size());
  ASSERT_LT(col("divergence_step"), h.size());
  const std::vector<std::string> order = {"fp32", "mx", "fp32_late"};
  for (size_t i = 0; i < 3; ++i) {
    const auto& row = sum[i + 1];
    ASSERT_EQ(row.size(), h.size());
    EXPECT_EQ(row[col("run_id")], id);
    EXPECT_EQ(row[col("group")], order[i]);
    EXPECT_EQ(row[col("status")], "complete");
    const std::string g = i == 2 ? "branches/fp32_late" : "trajectories/" + order[i];
    EXPECT_TRUE(same_value(row[col("final_loss")], f.get_attr_double(g, "final_loss")));
    EXPECT_TRUE(same_value(row[col("min_loss")], f.get_attr_double(g, "min_loss")));
    EXPECT_EQ(row[col("divergence_step")], std::to_string(f.get_attr_int64(g, "divergence_step")));
    EXPECT_EQ(row[col("steps_run")], std::to_string(f.get_attr_int64(g, "steps_run")));
    EXPECT_EQ(row[col("at")], i == 2 ? "12" : "");
  }
  // No temp files are left behind.
  for (const auto& e : std::filesystem::directory_iterator(csv_dir))
    EXPECT_EQ(e.path().extension(), ".csv") << e.path();
}

TEST(Export, NotARunFileIsOneLineError) {
  TempDir dir;
  const std::string bogus = dir.str() + "/x.h5";
  std::ofstream(bogus) << "not hdf5";
  auto [rc, out] = run_command(std::string(MXLAB_BINARY) + " export " + bogus + " --csv " + dir.str() + "/csv");
  EXPECT_NE(rc, 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("x.h5"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.str() + "/csv/x_summary.csv"));
}
