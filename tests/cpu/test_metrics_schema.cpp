// The metric declarations (lab/train/metrics.h) against the two things they must agree with:
// lab/train/SCHEMA.md, parsed here (every declared dataset documented with its shape, in the
// section that says which groups have it, and every documented dataset declared), and what the
// trainer actually writes (every row of every group holds exactly the declared datasets of its
// series that apply to that group).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "lab/model/mlp.h"
#include "lab/train/metrics.h"
#include "tests/cpu/test_util.h"
#include "tests/cpu/trainer_util.h"

using namespace mxlab;

namespace {

// ---- SCHEMA.md ----

// One dataset as SCHEMA.md documents it.
struct Documented {
  std::string section;  // the heading it is under
  size_t table = 0;     // which table of that section (0-based)
  std::string shape;    // the `shape` column ("" where the table has none)
  std::string series;   // the table's step axis when it lists one (`shadow_step`, `curvature_step`)
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  const size_t b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string without_backticks(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '`'), s.end());
  return s;
}

// Cells of a table row; `\|` inside a cell is text.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  const std::string body = trim(line).substr(1);  // after the leading '|'
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (body[i] == '|') {
      out.push_back(trim(cell));
      cell.clear();
    } else {
      cell += body[i];
    }
  }
  if (!trim(cell).empty()) out.push_back(trim(cell));
  return out;
}

// The names of a row's first cell: `a, b` lists several; `{tensor}_x` expands over the list
// after "tensor ∈ " in the row's notes (its last cell).
std::vector<std::string> row_names(const std::vector<std::string>& row) {
  std::vector<std::string> tensors;
  const std::string marker = "tensor \u2208 ";
  const size_t at = row.back().find(marker);
  if (at != std::string::npos) {
    std::string list;
    for (size_t i = at + marker.size(); i < row.back().size(); ++i) {
      const char c = row.back()[i];
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == ',' || c == ' ')) break;
      list += c;
    }
    std::stringstream ss(list);
    for (std::string t; std::getline(ss, t, ',');)
      if (!trim(t).empty()) tensors.push_back(trim(t));
  }
  std::vector<std::string> out;
  std::stringstream ss(without_backticks(row[0]));
  for (std::string name; std::getline(ss, name, ',');) {
    name = trim(name);
    const size_t brace = name.find("{tensor}");
    if (brace == std::string::npos) {
      out.push_back(name);
      continue;
    }
    EXPECT_FALSE(tensors.empty()) << "SCHEMA.md row '" << row[0] << "' has no `tensor \u2208 ...` list in its notes";
    for (const std::string& t : tensors) out.push_back(std::string(name).replace(brace, 8, t));
  }
  return out;
}

// The sections of SCHEMA.md that document the datasets of a group (the others document
// attributes, snapshots and the root).
const char* const kDatasetSections[] = {"Datasets", "Attention networks only", "Clamp debt datasets",
                                        "Series with their own step axis"};

// Every dataset SCHEMA.md documents in those sections, by name.
std::map<std::string, Documented> documented_datasets(const std::string& text, std::vector<std::string>& problems) {
  std::map<std::string, Documented> out;
  std::set<std::string> sections_seen;
  std::string section;
  bool in_dataset_section = false;
  size_t table = 0;
  std::vector<std::vector<std::string>> rows;  // of the table being read
  auto end_table = [&] {
    if (rows.size() < 2) {
      rows.clear();
      return;
    }
    const std::vector<std::string>& header = rows[0];
    const auto shape_col = std::find(header.begin(), header.end(), "shape") - header.begin();
    if (header[0] == "name") {
      std::string series;  // a row naming a `*_step` dataset other than `step` makes it the table's axis
      for (size_t r = 2; r < rows.size(); ++r)
        for (const std::string& n : row_names(rows[r]))
          if (n.size() > 5 && n.compare(n.size() - 5, 5, "_step") == 0) series = n;
      for (size_t r = 2; r < rows.size(); ++r)
        for (const std::string& n : row_names(rows[r])) {
          Documented d{section, table, "", series};
          if (shape_col < static_cast<long>(rows[r].size())) d.shape = without_backticks(rows[r][shape_col]);
          if (!out.emplace(n, d).second) problems.push_back("SCHEMA.md documents '" + n + "' twice");
        }
    }
    ++table;
    rows.clear();
  };
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) {
    if (!line.empty() && line[0] == '#') {
      if (in_dataset_section) end_table();
      section = trim(line.substr(line.find_first_not_of('#')));
      in_dataset_section = false;
      for (const char* s : kDatasetSections)
        if (section.rfind(s, 0) == 0) {
          in_dataset_section = true;
          sections_seen.insert(s);
        }
      table = 0;
      continue;
    }
    if (!in_dataset_section) continue;
    if (!line.empty() && line[0] == '|') rows.push_back(cells(line));
    else end_table();
  }
  if (in_dataset_section) end_table();
  for (const char* s : kDatasetSections)
    if (!sections_seen.count(s)) problems.push_back(std::string("SCHEMA.md has no section '") + s + "'");
  return out;
}

// The datasets of every declaration, by name (a family once per tensor it can be over).
std::map<std::string, const Metric*> declared_datasets() {
  std::map<std::string, const Metric*> out;
  for (const Metric* m : metric::kAll) {
    if (m->family == MetricFamily::none) out.emplace(m->name, m);
    for (const std::string& t : family_tensors(m->family)) out.emplace(member_name(*m, t), m);
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Two small networks, to tell attention-only datasets from the others.
NetShape network(BlockKind block) {
  ModelConfig m;
  m.depth = 1;
  m.width = 32;
  m.hidden_mult = 1;
  m.block = block;
  m.heads = 2;
  return NetShape::student(m, block == BlockKind::attention ? 32 : 1);
}

bool has_dataset(const Metric& m, const std::string& dataset, const NetShape& shape) {
  const std::vector<std::string> names = dataset_names(m, shape, true, true);
  return std::find(names.begin(), names.end(), dataset) != names.end();
}

// ---- what the trainer writes ----

// Values per row of a dataset of this shape in a network of this shape.
size_t width(MetricShape kind, const NetShape& shape) {
  switch (kind) {
    case MetricShape::per_layer: return static_cast<size_t>(shape.depth);
    case MetricShape::per_group: return shape.groups.size();
    case MetricShape::per_weight:
      return static_cast<size_t>(std::count_if(shape.groups.begin(), shape.groups.end(), [](const ParamGroup& g) {
        return g.kind == ParamGroup::w1 || g.kind == ParamGroup::w2;
      }));
    default: return 1;
  }
}

// A small run of every kind of group: the FP32 trajectory, two arms and a branch of each, with
// unlogged shadow steps, curvature rows and `model` as given.
RunConfig small_run(BlockKind block) {
  RunConfig c;
  c.seed = 5;
  c.steps = 9;
  c.device = "cpu";
  c.model.depth = 2;
  c.model.width = 32;
  c.model.hidden_mult = 1;
  c.model.block = block;
  c.model.heads = 2;
  c.data.batch = block == BlockKind::attention ? 2 : 24;
  c.data.seq_len = block == BlockKind::attention ? 32 : 1;
  c.optimizer.lr = 4e-3f;
  c.log.log_every = 2;
  c.log.bias_every = 3;
  c.log.progress = false;
  if (block == BlockKind::mlp) {  // the curvature instrument covers MLP blocks only
    c.log.curvature_every = 4;
    c.log.curvature_iters = 3;
    c.log.probe_batch = 8;
  }
  c.arms = {{"a", "", {}}, {"b", "", {{"rounding", "stochastic"}}}};
  c.interventions = {{"a_fp32", 3, "to_fp32", {}, "a"}, {"b_noln", 5, "skip_ln_quant", {}, "b"}};
  return c;
}

// For every group and series of the run, the datasets its rows hold against those the
// declarations give that group; one line per difference.
std::vector<std::string> written_against_declared(const RunConfig& cfg) {
  const MemorySink sink = test::run_in_memory(cfg);
  const NetShape shape = NetShape::student(cfg.model, cfg.data.seq_len);
  const MetricSeries row_series[] = {MetricSeries::logged, MetricSeries::shadow, MetricSeries::curvature};
  std::vector<std::string> problems;
  std::map<std::string, int> differences;  // one line per difference, with the number of rows that have it
  EXPECT_EQ(sink.groups.size(), 5u) << "fp32, two arms, two branches";
  for (const auto& [group, g] : sink.groups) {
    const bool mx = group != "trajectories/fp32";
    for (const MetricSeries series : row_series) {
      const std::string axis = series_axis(series).name;
      std::set<std::string> want;
      for (const Metric* m : metric::kAll)
        if (m->series == series)
          for (const std::string& n : dataset_names(*m, shape, mx, cfg.log.curvature_every > 0)) want.insert(n);
      size_t rows = 0;
      for (const MetricRow& r : g.rows) {
        if (r.axis != axis) continue;
        ++rows;
        std::multiset<std::string> have = {r.axis};  // a series' rows name their step dataset
        for (const auto& [name, values] : r.cols) {
          if (name != r.axis) have.insert(name);
          const Metric* m = find_metric(name);
          if (m && values.size() != width(m->shape, shape))
            differences[group + " writes " + std::to_string(values.size()) + " values into '" + name + "', " +
                        shape_text(m->shape) + " (" + std::to_string(width(m->shape, shape)) + ")"]++;
        }
        const std::set<std::string> unique(have.begin(), have.end());
        if (unique.size() != have.size()) problems.push_back(group + ": a " + axis + " row names a dataset twice");
        std::vector<std::string> undeclared, missing;
        std::set_difference(unique.begin(), unique.end(), want.begin(), want.end(), std::back_inserter(undeclared));
        std::set_difference(want.begin(), want.end(), unique.begin(), unique.end(), std::back_inserter(missing));
        if (!undeclared.empty()) differences[group + " writes undeclared " + axis + " datasets: " + join(undeclared)]++;
        if (!missing.empty()) differences[group + " lacks declared " + axis + " datasets: " + join(missing)]++;
      }
      // Rows of every series the group should have, none of a series it should not.
      const bool expect_rows = series == MetricSeries::logged || !want.empty();
      if ((rows > 0) != expect_rows)
        problems.push_back(group + " has " + std::to_string(rows) + " " + axis + " rows; its declarations say " +
                           (expect_rows ? "some" : "none"));
    }
    if (g.loss_all.empty()) problems.push_back(group + " has no " + metric::loss_all.name);
    // The datasets per parameter or weight group name their columns (attribute `names`).
    for (const Metric* m : metric::kAll) {
      const bool named = m->shape == MetricShape::per_group || m->shape == MetricShape::per_weight;
      const auto it = g.dataset_attrs.find(m->name);
      const size_t names = it == g.dataset_attrs.end() || !it->second.lists.count("names")
                               ? 0
                               : it->second.lists.at("names").size();
      if (names != (named ? width(m->shape, shape) : 0))
        problems.push_back(group + ": dataset '" + m->name + "' has " + std::to_string(names) + " names, " +
                           shape_text(m->shape) + " wants " + (named ? std::to_string(width(m->shape, shape)) : "none"));
    }
  }
  for (const auto& [what, rows] : differences) problems.push_back(what + " (" + std::to_string(rows) + " rows)");
  return problems;
}

}  // namespace

// Every declared dataset is documented in SCHEMA.md and every documented one declared, with the
// same shape; the section a dataset is documented in agrees with its declaration: the MX-only
// table with MX-only datasets, the attention section with attention-only ones, a series' table
// with its series.
TEST(MetricsSchema, DeclarationsAndSchemaDocumentTheSameDatasets) {
  const std::string path = std::string(MXLAB_SOURCE_DIR) + "/lab/train/SCHEMA.md";
  const std::string text = test::read_file(path);
  ASSERT_FALSE(text.empty()) << path << " not found";
  std::vector<std::string> problems;
  const std::map<std::string, Documented> documented = documented_datasets(text, problems);
  const std::map<std::string, const Metric*> declared = declared_datasets();

  std::vector<std::string> undocumented, undeclared;
  for (const auto& [name, m] : declared)
    if (!documented.count(name)) undocumented.push_back(name);
  for (const auto& [name, d] : documented)
    if (!declared.count(name)) undeclared.push_back(name);
  EXPECT_TRUE(undocumented.empty()) << "declared in lab/train/metrics.h, not in SCHEMA.md: " << join(undocumented);
  EXPECT_TRUE(undeclared.empty()) << "documented in SCHEMA.md, not declared in lab/train/metrics.h: "
                                  << join(undeclared);

  const NetShape mlp = network(BlockKind::mlp), attention = network(BlockKind::attention);
  for (const auto& [name, d] : documented) {
    const auto it = declared.find(name);
    if (it == declared.end()) continue;
    const Metric& m = *it->second;
    const std::string where = "'" + name + "' (SCHEMA.md \"" + d.section + "\")";
    if (!d.shape.empty() && d.shape != shape_text(m.shape))
      problems.push_back(where + " has shape " + d.shape + ", declared " + shape_text(m.shape));
    const bool mx_table = d.section.rfind("Datasets", 0) == 0 && d.table == 1;
    if (mx_table != (m.holders == MetricHolders::mx) && m.series == MetricSeries::logged)
      problems.push_back(where + (mx_table ? " is documented for MX trajectories only, declared for every group"
                                           : " is documented for every group, declared for MX trajectories only"));
    const bool attention_section = d.section.rfind("Attention networks only", 0) == 0;
    const bool attention_only = has_dataset(m, name, attention) && !has_dataset(m, name, mlp);
    if (attention_section != attention_only)
      problems.push_back(where + (attention_only ? " is declared for attention networks only"
                                                 : " is declared for MLP networks too"));
    const std::string declared_series = m.series == MetricSeries::shadow      ? "shadow_step"
                                        : m.series == MetricSeries::curvature ? "curvature_step"
                                                                              : "";
    if (d.series != declared_series)
      problems.push_back(where + " is documented on the axis '" + (d.series.empty() ? "step" : d.series) +
                         "', declared on '" + (declared_series.empty() ? "step" : declared_series) + "'");
  }
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

// The declarations are consistent among themselves: a series' step dataset is a scalar of that
// series; only the loss history is per step run; a family's name holds "{tensor}", no other's.
TEST(MetricsSchema, DeclarationsAreConsistent) {
  std::set<std::string> names;
  for (const Metric* m : metric::kAll) {
    EXPECT_TRUE(names.insert(m->name).second) << m->name << " declared twice";
    EXPECT_EQ(m->family != MetricFamily::none, std::string(m->name).find("{tensor}") != std::string::npos) << m->name;
    EXPECT_EQ(m->shape == MetricShape::per_step_run, m->series == MetricSeries::history) << m->name;
    EXPECT_NE(std::string(m->meaning), "") << m->name;
    EXPECT_EQ(find_metric(m->family == MetricFamily::none ? m->name : member_name(*m, "gamma")), m) << m->name;
  }
  for (const MetricSeries s : {MetricSeries::logged, MetricSeries::shadow, MetricSeries::curvature}) {
    EXPECT_EQ(series_axis(s).series, s);
    EXPECT_EQ(series_axis(s).shape, MetricShape::scalar);
  }
  EXPECT_EQ(find_metric("act_out_clamped"), &metric::clamped);
  EXPECT_EQ(find_metric("ln_out_gap_mean"), nullptr);  // the clamp debt covers the norm gains only
  EXPECT_EQ(find_metric("no_such_metric"), nullptr);
}

// What the trainer writes is what the declarations say, group by group and series by series,
// with the declared number of values per row: an MLP network with curvature rows, one without
// norm gains (no γ, β) and an attention network.
TEST(MetricsSchema, TrainerWritesExactlyTheDeclaredDatasets) {
  for (const BlockKind block : {BlockKind::mlp, BlockKind::attention}) {
    SCOPED_TRACE(block == BlockKind::mlp ? "mlp" : "attention");
    for (const std::string& p : written_against_declared(small_run(block))) ADD_FAILURE() << p;
  }
  RunConfig no_gains = small_run(BlockKind::mlp);
  no_gains.model.ln_affine = false;
  no_gains.interventions[1].apply = "to_fp32";  // skip_ln_quant needs quantized norm gains
  SCOPED_TRACE("mlp without norm gains");
  for (const std::string& p : written_against_declared(no_gains)) ADD_FAILURE() << p;
}
