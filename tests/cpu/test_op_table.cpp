// The op table (lab/backends/op_table.h) without a GPU:
//   - every virtual method of lab/model/backend.h has a descriptor (as its name or one of its
//     `also`), or an exemption with its reason: a new Backend op without one fails here, in CI;
//   - every name the table uses is a Backend method, named once;
//   - every descriptor runs on the CPU backend at its test size, writes every output (nothing
//     left poisoned), and gives the same bits from a fresh backend and a regenerated case;
//   - op_compare tells a result beyond the rule from one within it;
//   - `mxlab bench --device cpu --ops NAME` times a descriptor at its bench size and prints its row.
// The CPU-vs-CUDA comparison of every descriptor is tests/gpu/test_op_table.cpp.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "lab/backends/op_table.h"
#include "lab/cpu/cpu_backend.h"
#include "tests/cpu/run_binary_util.h"

namespace mxlab {
namespace {

// The names of the virtual methods declared in `text` (a C++ header): for each `virtual`
// outside a // comment, the identifier just before the next '('. Destructors are skipped.
std::vector<std::string> virtual_methods(const std::string& text) {
  std::string code;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t c = line.find("//");
    code += (c == std::string::npos ? line : line.substr(0, c)) + "\n";
  }
  std::vector<std::string> names;
  for (size_t at = code.find("virtual"); at != std::string::npos; at = code.find("virtual", at + 7)) {
    const bool word = (at == 0 || !(std::isalnum(static_cast<unsigned char>(code[at - 1])) || code[at - 1] == '_')) &&
                      at + 7 < code.size() && !(std::isalnum(static_cast<unsigned char>(code[at + 7])) || code[at + 7] == '_');
    if (!word) continue;
    const size_t paren = code.find('(', at);
    if (paren == std::string::npos) break;
    size_t end = paren;
    while (end > at && std::isspace(static_cast<unsigned char>(code[end - 1]))) --end;
    size_t begin = end;
    while (begin > at && (std::isalnum(static_cast<unsigned char>(code[begin - 1])) || code[begin - 1] == '_')) --begin;
    if (begin == end || (begin > 0 && code[begin - 1] == '~')) continue;  // a destructor
    names.push_back(code.substr(begin, end - begin));
  }
  return names;
}

std::vector<std::string> words(const char* s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Where each name of the table is used: "descriptor X", "also of X", "exemption".
std::map<std::string, std::vector<std::string>> table_names() {
  std::map<std::string, std::vector<std::string>> uses;
  for (const OpDesc& d : op_table()) {
    uses[d.name].push_back(msg("descriptor ", d.name));
    for (const std::string& w : words(d.also)) uses[w].push_back(msg("also of ", d.name));
  }
  for (const OpExemption& e : op_exemptions()) uses[e.name].push_back("exemption");
  return uses;
}

std::string backend_header() { return testutil::slurp(std::string(MXLAB_SOURCE_DIR) + "/lab/model/backend.h"); }

TEST(OpTable, HeaderParserFindsVirtualMethods) {
  const std::string text =
      "class X {\n virtual ~X() = default;\n  // virtual commented(int)\n  virtual std::vector<std::pair<int, int>>\n"
      "      describe() const { return {}; }\n  virtual void gemm(int64_t M,\n int n) = 0;\n  int nonvirtual(int);\n"
      "  virtual float* alloc (size_t n) = 0;\n};\n";
  EXPECT_EQ(virtual_methods(text), (std::vector<std::string>{"describe", "gemm", "alloc"}));
}

TEST(OpTable, EveryBackendMethodHasADescriptorOrAnExemption) {
  const std::vector<std::string> methods = virtual_methods(backend_header());
  ASSERT_GE(methods.size(), 60u) << "lab/model/backend.h: the parser found too few virtual methods";
  const auto uses = table_names();
  std::string missing;
  for (const std::string& m : methods)
    if (!uses.count(m)) missing += (missing.empty() ? "" : ", ") + m;
  EXPECT_TRUE(missing.empty()) << "Backend methods with no op descriptor: " << missing
                               << ". Add a descriptor to op_table() in lab/backends/op_table.cpp (or, for pure "
                                  "plumbing, an entry with its reason to op_exemptions())";
}

TEST(OpTable, EveryNameIsABackendMethodUsedOnce) {
  const std::vector<std::string> methods = virtual_methods(backend_header());
  const std::set<std::string> known(methods.begin(), methods.end());
  for (const auto& [name, where] : table_names()) {
    EXPECT_TRUE(known.count(name)) << "'" << name << "' (" << where.front()
                                   << ") is not a virtual method of lab/model/backend.h";
    std::set<std::string> kinds;
    bool exempt = false;
    for (const std::string& w : where) {
      exempt = exempt || w == "exemption";
      kinds.insert(w);
    }
    EXPECT_FALSE(exempt && where.size() > 1) << "'" << name << "' is both exempt and covered by a descriptor";
    EXPECT_EQ(kinds.size(), where.size()) << "'" << name << "' listed twice in the same place";
    int descriptors = 0;
    for (const OpDesc& d : op_table()) descriptors += name == d.name;
    EXPECT_LE(descriptors, 1) << "two descriptors named '" << name << "'";
  }
  for (const OpDesc& d : op_table()) {
    EXPECT_TRUE(d.make && d.run) << d.name;
    EXPECT_NE(std::string(d.rule.why), "") << d.name << ": a rule needs its reason";
    EXPECT_EQ(d.rule.match == OpMatch::exact, d.rule.rel == 0.0) << d.name << ": exact has rel 0, close rel > 0";
    EXPECT_LT(d.rule.rel, 0.5) << d.name;
    EXPECT_FALSE(op_size_text(d, d.test).empty()) << d.name;
    EXPECT_EQ(op_size_text(d, d.bench).find("=0"), std::string::npos) << d.name << ": bench size " << op_size_text(d, d.bench);
  }
  for (const OpExemption& e : op_exemptions()) EXPECT_NE(std::string(e.why), "") << e.name;
}

bool same_case(const OpCase& a, const OpCase& b) {
  if (a.outputs != b.outputs || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].size() != b.tensors[i].size()) return false;
    for (size_t j = 0; j < a.tensors[i].size(); ++j) {
      const float x = a.tensors[i][j], y = b.tensors[i][j];
      if (!(x == y || (std::isnan(x) && std::isnan(y)))) return false;
    }
  }
  return true;
}

class OpTableCpu : public ::testing::TestWithParam<size_t> {};

TEST_P(OpTableCpu, RunsWritesEveryOutputAndRepeats) {
  const OpDesc& d = op_table()[GetParam()];
  const OpCase c = d.make(d.test, 42);
  ASSERT_TRUE(same_case(c, d.make(d.test, 42))) << "the generator is not deterministic";
  bool has_inputs = false;  // a tensor the generator filled (not an output poisoned with NaN)
  for (const auto& t : c.tensors) has_inputs = has_inputs || (!t.empty() && !std::isnan(t.front()));
  if (has_inputs) {
    EXPECT_FALSE(same_case(c, d.make(d.test, 43))) << "the seed does not change the inputs";
  }
  auto be = make_cpu_backend();
  const OpResult r = op_run(*be, d, c, op_place(*be, d, c));
  EXPECT_FALSE(r.outputs.empty() && r.host.empty()) << d.name << ": the descriptor compares nothing";
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    size_t unwritten = 0;
    for (float v : r.outputs[i]) unwritten += !std::isfinite(v);
    EXPECT_EQ(unwritten, 0u) << d.name << " output " << i << ": elements not finite (left poisoned?)";
  }
  for (double v : r.host) EXPECT_TRUE(std::isfinite(v)) << d.name << ": host result not finite";
  auto be2 = make_cpu_backend();
  const OpResult r2 = op_run(*be2, d, c, op_place(*be2, d, c));
  EXPECT_EQ(op_compare(OpRule{OpMatch::exact, 0.0, "repeat"}, r, r2), "") << d.name << " is not repeatable";
}

// The comparison: one float ulp apart passes a close rule and fails an exact one; a doubled
// element fails both.
TEST_P(OpTableCpu, CompareTellsBeyondTheRuleFromWithin) {
  const OpDesc& d = op_table()[GetParam()];
  const OpCase c = d.make(d.test, 42);
  auto be = make_cpu_backend();
  const OpResult ref = op_run(*be, d, c, op_place(*be, d, c));
  EXPECT_EQ(op_compare(d.rule, ref, ref), "");
  OpResult ulp = ref, doubled = ref;
  if (!ref.outputs.empty()) {
    std::vector<float>& o = ulp.outputs.back();
    o[o.size() / 2] = std::nextafter(o[o.size() / 2], INFINITY);
    std::vector<float>& t = doubled.outputs.back();
    t[t.size() / 2] = 2.0f * t[t.size() / 2] + 1.0f;
  } else {
    ulp.host.back() = std::nextafter(ulp.host.back(), INFINITY);
    doubled.host.back() = 2.0 * doubled.host.back() + 1.0;
  }
  EXPECT_EQ(op_compare(d.rule, ref, ulp).empty(), d.rule.match == OpMatch::close) << op_compare(d.rule, ref, ulp);
  EXPECT_NE(op_compare(d.rule, ref, doubled), "");
}

std::string param_name(const ::testing::TestParamInfo<size_t>& info) { return op_table()[info.param].name; }

INSTANTIATE_TEST_SUITE_P(Ops, OpTableCpu, ::testing::Range(size_t{0}, op_table().size()), param_name);

// The row of `op` in bench output: "  NAME  SIZE  MS" (empty when there is none).
std::string bench_row(const std::string& out, const std::string& op) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("  " + op + " ", 0) == 0) return line;
  return "";
}

TEST(OpTableBench, CpuPrintsOneRowPerOp) {
  const testutil::Proc p = testutil::run_mxlab({"bench", "--device", "cpu", "--ops", "add", "col_sum", "--steps", "2"});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  // name, size at the paper configuration, ms per call
  for (const auto& [op, size] : std::vector<std::pair<std::string, std::string>>{{"add", "n=1048576"},
                                                                                 {"col_sum", "rows=2048 d=512"}}) {
    const std::string row = bench_row(p.output, op);
    ASSERT_FALSE(row.empty()) << op << ": no row in\n" << p.output;
    EXPECT_TRUE(testutil::contains(row, " " + size + " ")) << row;
    const double ms = std::strtod(row.substr(row.find_last_of(' ') + 1).c_str(), nullptr);
    EXPECT_GT(ms, 0.0) << row;
  }
  EXPECT_TRUE(bench_row(p.output, "gemm").empty()) << "an op that was not asked for was timed:\n" << p.output;
}

TEST(OpTableBench, UnknownOpIsBadInput) {
  const testutil::Proc p = testutil::run_mxlab({"bench", "--device", "cpu", "--ops", "gemmm"});
  EXPECT_EQ(p.exit_code, 2) << p.output;
  EXPECT_TRUE(testutil::contains(p.output, "gemmm")) << p.output;
}

}  // namespace
}  // namespace mxlab
