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
#include <set>
#include <sstream>
#include <string>
#include <tuple>
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
using mxlab::test::read_file;
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

namespace {

// Lines of a CSV file without quoted fields, split on commas.
std::vector<std::vector<std::string>> csv_rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells(1);
    for (char c : line) {
      if (c == ',') cells.emplace_back();
      else cells.back() += c;
    }
    rows.push_back(cells);
  }
  return rows;
}

// Two runs of tiny_run() that differ in the learning rate and the seed, in `dir`.
std::vector<RunOutcome> two_runs(const std::string& dir) {
  RunOptions opt;
  opt.out_dir = dir;
  opt.make_backend = [](const std::string&) { return make_cpu_backend(); };
  std::vector<RunOutcome> out;
  for (int i = 0; i < 2; ++i) {
    RunConfig c = tiny_run();
    c.optimizer.lr = i == 0 ? 3e-3f : 1e-3f;
    c.seed = 3 + i;
    out.push_back(run_one(c, opt));
    EXPECT_EQ(to_string(out.back().status), std::string("complete")) << out.back().error;
  }
  return out;
}

}  // namespace

// `mxlab export DIR --long OUT.csv`: the header (the swept key, seed, ...), every value the
// per-trajectory export writes and nothing else, cell for cell the same text, and the identifying
// columns of each row.
TEST(ExportLong, EveryValueOfTheFlatExportOnceWithItsRun) {
  TempDir dir;
  const std::string runs = dir.str() + "/runs";
  const std::vector<RunOutcome> r = two_runs(runs);
  ASSERT_EQ(r.size(), 2u);
  const std::string long_csv = dir.str() + "/out/long.csv";
  auto [rc, out] = run_command(std::string(MXLAB_BINARY) + " export " + runs + " --long " + long_csv);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, long_csv + "\n");
  const auto rows = csv_rows(read_file(long_csv));
  ASSERT_GT(rows.size(), 1000u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"run_id", "optimizer.lr", "seed", "trajectory", "kind", "arm", "step",
                                               "metric", "column", "value"}));

  // (run_id, T, flat column, step) -> cell of the per-trajectory files (loss_all: column loss_all).
  std::map<std::tuple<std::string, std::string, std::string, std::string>, std::string> flat;
  std::map<std::string, std::string> lr_of;
  for (const RunOutcome& o : r) {
    const std::string csv = dir.str() + "/csv_" + o.run_id;
    auto [erc, eout] = run_command(std::string(MXLAB_BINARY) + " export " + o.path + " --csv " + csv);
    ASSERT_EQ(erc, 0) << eout;
    for (const auto& e : std::filesystem::directory_iterator(csv)) {
      std::string name = e.path().stem().string();
      if (name == o.run_id + "_summary") continue;
      name = name.substr(o.run_id.size() + 1);  // <T>[_loss_all | _<series>]
      std::string tag = name;
      bool loss_all = false;
      for (const std::string suffix : {"_loss_all", "_shadow", "_curvature"})
        if (tag.size() > suffix.size() && tag.compare(tag.size() - suffix.size(), suffix.size(), suffix) == 0) {
          tag = tag.substr(0, tag.size() - suffix.size());
          loss_all = suffix == "_loss_all";
        }
      const auto t = csv_rows(read_file(e.path().string()));
      for (size_t i = 1; i < t.size(); ++i)
        for (size_t c = 1; c < t[0].size(); ++c)
          flat[{o.run_id, tag, loss_all ? "loss_all" : t[0][c], t[i][0]}] = t[i][c];
    }
    lr_of[o.run_id] = o.run_id == r[0].run_id ? "0.003" : "0.001";
  }
  std::set<std::tuple<std::string, std::string, std::string, std::string>> seen;
  std::string last_run;
  for (size_t i = 1; i < rows.size(); ++i) {
    const std::vector<std::string>& row = rows[i];
    ASSERT_EQ(row.size(), 10u) << i;
    const std::string &id = row[0], &traj = row[3], &kind = row[4], &arm = row[5], &metric = row[7], &column = row[8];
    ASSERT_TRUE(lr_of.count(id)) << id;
    ASSERT_LE(last_run, id) << "runs in run id order";
    last_run = id;
    EXPECT_EQ(row[1], lr_of[id]);
    EXPECT_EQ(row[2], id == r[0].run_id ? "3" : "4");
    const std::string expected_kind = traj == "fp32" ? "fp32" : traj == "fp32_late" ? "branch" : "arm";
    EXPECT_EQ(kind, expected_kind) << traj;
    EXPECT_EQ(arm, traj == "fp32_late" ? "mx" : traj);
    const std::string tag = kind == "branch" ? "branch-" + traj : traj;
    const auto key = std::make_tuple(id, tag, column.empty() ? metric : metric + "_" + column, row[6]);
    const auto it = flat.find(key);
    ASSERT_NE(it, flat.end()) << "row " << i << ": no such cell in the per-trajectory export: " << id << " " << tag
                              << " " << std::get<2>(key) << " step " << row[6];
    EXPECT_EQ(row[9], it->second) << "row " << i;
    EXPECT_TRUE(seen.insert(key).second) << "row " << i << " twice";
  }
  EXPECT_EQ(seen.size(), flat.size()) << "cells of the per-trajectory export missing from the long table";

  // Against the file directly: the branch's loss_all starts at its `at`, the named per-group
  // columns, and the first rows of a group are its loss.
  h5::H5File f(r[0].path, h5::H5File::Mode::read);
  const std::vector<double> all = f.read_doubles("branches/fp32_late/loss_all");
  const std::vector<double> ratio = f.read_doubles("trajectories/mx/bias_ratio_group");
  const std::vector<std::string> names = f.get_attr_strings("trajectories/mx/bias_ratio_group", "names");
  const size_t groups = names.size();
  size_t found_all = 0, found_ratio = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto& row = rows[i];
    if (row[0] != r[0].run_id) continue;
    if (row[3] == "fp32_late" && row[7] == "loss_all") {
      const int64_t step = std::stoll(row[6]);
      ASSERT_GE(step, 12);
      EXPECT_TRUE(same_value(row[9], all[static_cast<size_t>(step - 12)]));
      ++found_all;
    }
    if (row[3] == "mx" && row[7] == "bias_ratio_group" && row[8] == names[1]) {
      EXPECT_TRUE(same_value(row[9], ratio[found_ratio * groups + 1])) << row[6];
      ++found_ratio;
    }
  }
  EXPECT_EQ(found_all, all.size());
  EXPECT_EQ(found_ratio, ratio.size() / groups);
  EXPECT_EQ(rows[1][3], "fp32");
  EXPECT_EQ(rows[1][7], "loss");
}

// Bad input is one line and exit 2, with nothing written; a damaged run file is left out with a
// note; OUT that is a link is replaced, never written through; no temp file stays behind.
TEST(ExportLong, RefusesBadInputAndNeverWritesThroughALink) {
  TempDir dir;
  const std::string runs = dir.str() + "/runs", bin = MXLAB_BINARY;
  const std::vector<RunOutcome> r = two_runs(runs);
  const std::string out = dir.str() + "/long.csv";
  const std::string empty = dir.str() + "/empty";
  std::filesystem::create_directories(empty);
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {runs + " --csv " + dir.str() + "/csv", "is a directory: --csv and --npy export one run file"},
           {runs + " --long " + out + " --csv " + dir.str() + "/csv", "--long writes one table by itself"},
           {runs + " --long " + out + ".gz", "writes plain CSV only"},
           {empty + " --long " + out, "no .h5 run files in this directory"},
           {runs + " --long " + empty, "is a directory; give the name of the CSV file"},
           {dir.str() + "/nosuch --long " + out, "nosuch"}}) {
    auto [rc, text] = run_command(bin + " export " + args);
    EXPECT_EQ(rc, 2) << args << ": " << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
    EXPECT_NE(text.find(says), std::string::npos) << text;
    EXPECT_FALSE(std::filesystem::exists(out)) << args;
  }
  // A damaged file beside the runs: left out, named on stderr; the others exported.
  std::ofstream(runs + "/zz.h5") << "not hdf5";
  auto [rc, text] = run_command("(" + bin + " export " + runs + " --long " + out + " >/dev/null)");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_EQ(text.rfind("mxlab: note: left out zz.h5: ", 0), 0u) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  const std::string full = read_file(out);
  EXPECT_NE(full.find(r[1].run_id), std::string::npos);
  // Only damaged files: an error, and the last table stays as it was.
  const std::string bad = dir.str() + "/bad";
  std::filesystem::create_directories(bad);
  std::ofstream(bad + "/x.h5") << "not hdf5";
  std::tie(rc, text) = run_command(bin + " export " + bad + " --long " + out);
  EXPECT_EQ(rc, 2) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_TRUE(read_file(out) == full) << "the table of the last export changed";
  // One run file exports too, without swept keys.
  std::tie(rc, text) = run_command(bin + " export " + r[0].path + " --long " + out);
  ASSERT_EQ(rc, 0) << text;
  EXPECT_EQ(read_file(out).rfind("run_id,seed,trajectory,kind,arm,step,metric,column,value\n", 0), 0u);
  // OUT a link to a file elsewhere: replaced by the table, its target untouched.
  const std::string target = dir.str() + "/target.txt", link = dir.str() + "/link.csv";
  std::ofstream(target) << "keep";
  std::filesystem::create_symlink(target, link);
  std::tie(rc, text) = run_command(bin + " export " + runs + " --long " + link);
  ASSERT_EQ(rc, 0) << text;
  EXPECT_TRUE(read_file(target) == "keep") << "written through the link";
  EXPECT_FALSE(std::filesystem::is_symlink(link));
  EXPECT_TRUE(read_file(link) == full) << "not the table";
  for (const auto& e : std::filesystem::directory_iterator(dir.str()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}
