// Fuzzing the command line with broken input: mutated experiment YAMLs (from the committed
// experiments: keys deleted, duplicated, renamed or retyped, numbers out of range, wrong
// nesting, truncated or garbled text) through `mxlab run --dry-run`, `plan` and `dump-config`,
// and mutated .npy files (header and body) through `mxlab quantize`. Every process must exit
// (no signal, no hang) with 0 or 2 (bad input, lab/core/exit_codes.h); an error must be exactly
// one line "mxlab: error: ..." and leave no output file behind; a quantize that succeeds must
// write a readable .npy of the input's shape, and succeed exactly when the .npy parses.
//
// Deterministic: case i uses seed MXLAB_FUZZ_SEED + i (default base 1). A failure prints the
// seed, the command and the mutated input (kept on disk), so it reproduces with
//   MXLAB_FUZZ_SEED=<seed> MXLAB_FUZZ_COUNT=1 build/mxlab_tests --gtest_filter='Fuzz.*'
// MXLAB_FUZZ_COUNT=N raises the number of cases of each kind for a long local run (default
// kDefaultCases: a few seconds).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/core/exit_codes.h"
#include "lab/io/npy.h"
#include "tests/cpu/run_binary_util.h"

namespace fs = std::filesystem;
using namespace mxlab;
using testutil::contains;

namespace {

constexpr int kDefaultCases = 120;    // per kind (YAML, .npy)
constexpr double kTimeoutS = 30.0;   // a process running longer counts as a hang
constexpr int kMaxReported = 5;      // failures printed in full

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

struct Result {
  int exit_code = -1;
  int term_signal = 0;
  bool timed_out = false;
  std::string out, err;
};

// Runs MXLAB_BINARY with `args`, stdout and stderr apart, no Slurm variables, killed after
// kTimeoutS.
Result run(const std::vector<std::string>& args) {
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) throw Error("fuzz: pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("fuzz: fork failed");
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    for (const char* v : {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX"})
      ::unsetenv(v);
    std::vector<std::string> copy = args;
    std::string bin = MXLAB_BINARY;
    std::vector<char*> argv = {bin.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    std::_Exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[4096];
  while (open_fds > 0) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el > kTimeoutS && !r.timed_out) {
      ::kill(pid, SIGKILL);
      r.timed_out = true;
    }
    if (::poll(fds, 2, 100) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  return r;
}

std::string joined(const std::vector<std::string>& args) {
  std::string s = "mxlab";
  for (const auto& a : args) s += " " + a;
  return s;
}

// What is wrong with a result ("" if nothing). `wrote` lists files that must not exist after an
// error.
std::string judge(const Result& r, const std::vector<std::string>& must_not_exist_on_error) {
  if (r.timed_out) return "did not finish in time";
  if (r.term_signal != 0) return "killed by signal " + std::to_string(r.term_signal);
  if (r.exit_code != kExitOk && r.exit_code != kExitBadInput) return "exit code " + std::to_string(r.exit_code);
  if (r.exit_code == kExitOk) {
    if (contains(r.err, "mxlab: error")) return "exit 0 with an error message";
    return "";
  }
  const bool one_line = testutil::count_of(r.err, "\n") == 1 && r.err.rfind("mxlab: error: ", 0) == 0;
  if (!one_line) return "the error is not one line 'mxlab: error: ...'";
  if (!r.out.empty()) return "an error, and something on stdout";
  for (const std::string& p : must_not_exist_on_error)
    if (testutil::file_exists(p)) return "an error, and " + p + " was left behind";
  return "";
}

// ---- YAML mutations ---------------------------------------------------------------------------

using Rng = std::mt19937_64;

size_t pick(Rng& g, size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(g); }

const char* const kOddValues[] = {
    "text", "42", "-3", "0", "-0", "1", "0.5", "-1", "1.5e308", "-1.5e308", "1e-320", "4.9e-324", ".nan", ".inf",
    "-.inf", "true", "false", "null", "~", "[]", "{}", "[1, 2]", "{a: 1}", "2147483648", "-2147483649",
    "9223372036854775808", "18446744073709551616", "99999999999999999999999", "0x10", "1_000", "'quoted'",
    "\"\\u00e9\"", "mxfp8_e4m3", "floor", "cuda:7", "cpu", "[[1]]", "{steps: 5}", "1e9", "65536", "-65536", "3.0e-4",
};

std::vector<std::pair<YAML::Node, std::string>> map_entries(const YAML::Node& n) {
  std::vector<std::pair<YAML::Node, std::string>> out;
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      out.emplace_back(n, it->first.as<std::string>());
      for (auto& e : map_entries(it->second)) out.push_back(e);
    }
  } else if (n.IsSequence()) {
    for (auto it = n.begin(); it != n.end(); ++it)
      for (auto& e : map_entries(*it)) out.push_back(e);
  }
  return out;
}

std::vector<YAML::Node> maps_in(const YAML::Node& n) {
  std::vector<YAML::Node> out;
  if (n.IsMap()) {
    out.push_back(n);
    for (auto it = n.begin(); it != n.end(); ++it)
      for (auto& m : maps_in(it->second)) out.push_back(m);
  } else if (n.IsSequence()) {
    for (auto it = n.begin(); it != n.end(); ++it)
      for (auto& m : maps_in(*it)) out.push_back(m);
  }
  return out;
}

YAML::Node odd_value(Rng& g) { return YAML::Load(kOddValues[pick(g, std::size(kOddValues))]); }

std::string typo(Rng& g, std::string k) {
  if (k.empty()) return "x";
  switch (pick(g, 4)) {
    case 0: k.erase(pick(g, k.size()), 1); break;
    case 1: if (k.size() > 1) { const size_t i = pick(g, k.size() - 1); std::swap(k[i], k[i + 1]); } break;
    case 2: k[pick(g, k.size())] = static_cast<char>(std::toupper(static_cast<unsigned char>(k[0]))); break;
    default: k += "_x"; break;
  }
  return k.empty() ? "x" : k;
}

// One structural mutation of the tree; false if it found nothing to mutate.
bool mutate_tree(Rng& g, YAML::Node& root) {
  const auto entries = map_entries(root);
  const auto maps = maps_in(root);
  if (entries.empty() || maps.empty()) return false;
  auto [parent, key] = entries[pick(g, entries.size())];
  YAML::Node m = parent;  // handle: edits go to the shared tree
  switch (pick(g, 7)) {
    case 0: m.remove(key); break;                                      // delete a key
    case 1: m[key] = odd_value(g); break;                              // retype / out of range
    case 2: {                                                          // move under another map
      YAML::Node value = YAML::Clone(m[key]);
      m.remove(key);
      YAML::Node to = maps[pick(g, maps.size())];
      to[key] = value;
      break;
    }
    case 3: {                                                          // wrap the value in a map
      YAML::Node wrapped;
      wrapped[typo(g, key)] = YAML::Clone(m[key]);
      m[key] = wrapped;
      break;
    }
    case 4: {                                                          // rename (typo)
      YAML::Node value = YAML::Clone(m[key]);
      m.remove(key);
      m[typo(g, key)] = value;
      break;
    }
    case 5: {                                                          // a map becomes a list
      if (!m[key].IsMap()) {
        m[key] = odd_value(g);
        break;
      }
      YAML::Node seq(YAML::NodeType::Sequence);
      for (auto it = m[key].begin(); it != m[key].end(); ++it) seq.push_back(YAML::Clone(it->second));
      m[key] = seq;
      break;
    }
    default: {                                                         // an unknown key
      YAML::Node to = maps[pick(g, maps.size())];
      to["fuzz_" + std::to_string(pick(g, 100))] = odd_value(g);
      break;
    }
  }
  return true;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) lines.push_back(l);
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// One mutation of the text.
std::string mutate_text(Rng& g, std::string text) {
  std::vector<std::string> lines = split_lines(text);
  switch (pick(g, 6)) {
    case 0: return text.substr(0, pick(g, text.size() + 1));  // truncated
    case 1: if (!lines.empty()) lines.erase(lines.begin() + static_cast<long>(pick(g, lines.size()))); break;
    case 2: if (!lines.empty()) { const size_t i = pick(g, lines.size()); lines.insert(lines.begin() + static_cast<long>(i), lines[i]); } break;  // duplicate key
    case 3: if (!lines.empty()) { std::string& l = lines[pick(g, lines.size())]; l = std::string(1 + pick(g, 3), ' ') + l; } break;
    case 4: {  // garbage bytes
      const char garbage[] = {'\t', ':', '-', '[', '{', '}', ']', '&', '*', '!', '%', '@', '`', '|', '>', '\'', '"', '#',
                              '\x01', '\x7f', '\xff', '\xc3', ','};
      const size_t at = pick(g, text.size() + 1);
      std::string ins;
      for (size_t i = 0, n = 1 + pick(g, 4); i < n; ++i) ins += garbage[pick(g, sizeof garbage)];
      return text.insert(at, ins);
    }
    default: if (lines.size() > 1) { const size_t i = pick(g, lines.size() - 1); std::swap(lines[i], lines[i + 1]); } break;
  }
  return join_lines(lines);
}

std::string mutate_yaml(Rng& g, const std::string& original) {
  std::string text = original;
  const size_t n = 1 + pick(g, 3);
  for (size_t i = 0; i < n; ++i) {
    if (pick(g, 3) != 0) {  // mostly structural, on a parse of the current text
      try {
        YAML::Node root = YAML::Load(text);
        if (mutate_tree(g, root)) {
          YAML::Emitter e;
          e << root;
          text = std::string(e.c_str()) + "\n";
          continue;
        }
      } catch (const YAML::Exception&) {
      }
    }
    text = mutate_text(g, text);
  }
  return text;
}

// The committed experiments, copied (with their folders, so that `extends:` resolves) into a
// scratch directory where the mutants are written beside them.
struct Corpus {
  std::string root;
  std::vector<std::string> files;  // copies, relative paths kept
};

Corpus copy_experiments() {
  Corpus c;
  c.root = testutil::make_temp_dir("fuzz_corpus");
  const fs::path src = fs::path(MXLAB_SOURCE_DIR) / "experiments";
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file() || e.path().extension() != ".yaml") continue;
    const fs::path to = fs::path(c.root) / fs::relative(e.path(), src);
    fs::create_directories(to.parent_path());
    fs::copy_file(e.path(), to, fs::copy_options::overwrite_existing);
    c.files.push_back(to.string());
  }
  std::sort(c.files.begin(), c.files.end());
  return c;
}

TEST(Fuzz, MutatedExperimentsGiveResultsOrOneLineErrors) {
  const Corpus corpus = copy_experiments();
  ASSERT_GT(corpus.files.size(), 5u);
  const int base = env_int("MXLAB_FUZZ_SEED", 1);
  const int count = env_int("MXLAB_FUZZ_COUNT", kDefaultCases);
  int failures = 0, errors = 0, accepted = 0;
  for (int i = 0; i < count; ++i) {
    const int seed = base + i;
    Rng g(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull);
    const std::string& original = corpus.files[pick(g, corpus.files.size())];
    const std::string mutant = fs::path(original).parent_path().string() + "/fuzz_" + std::to_string(seed) + ".yaml";
    testutil::write_bytes(mutant, mutate_yaml(g, testutil::slurp(original)));
    const std::string out = corpus.root + "/out_" + std::to_string(seed);
    bool case_failed = false;
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"run", mutant, "--dry-run", "--out", out}, {"plan", mutant}, {"dump-config", mutant}}) {
      const Result r = run(args);
      // --dry-run writes nothing, error or not.
      std::string why = judge(r, {});
      if (why.empty() && testutil::file_exists(out)) why = "--dry-run created " + out;
      if (!why.empty()) {
        case_failed = true;
        if (failures++ < kMaxReported)
          ADD_FAILURE() << "seed " << seed << " (from " << fs::relative(original, corpus.root).string() << "): "
                        << joined(args) << ": " << why << "\nstderr: " << r.err << "stdout: " << r.out.substr(0, 500)
                        << "\nthe input is kept at " << mutant << "\nreproduce: MXLAB_FUZZ_SEED=" << seed
                        << " MXLAB_FUZZ_COUNT=1 build/mxlab_tests --gtest_filter='Fuzz.Mutated*'";
      }
      (r.exit_code == 0 ? accepted : errors) += 1;
    }
    if (!case_failed) fs::remove(mutant);
  }
  std::printf("[fuzz] %d YAML mutants (seeds %d..%d): %d commands accepted, %d refused, %d failures\n", count, base,
              base + count - 1, accepted, errors, failures);
  EXPECT_EQ(failures, 0);
  EXPECT_GT(errors, 0);
  EXPECT_GT(accepted, 0) << "no mutant was valid: the mutations are too coarse to reach the deeper checks";
  if (failures == 0) fs::remove_all(corpus.root);  // kept as evidence otherwise
}

// ---- .npy mutations ---------------------------------------------------------------------------

std::string mutate_npy(Rng& g, std::string b) {
  // Header: magic (6) version (2) header length (2 or 4) then the dict text ending in '\n'.
  const size_t hl_size = b.size() > 6 && b[6] == 1 ? 2 : 4;
  const size_t dict_at = 8 + hl_size;
  const size_t n = 1 + pick(g, 2);
  for (size_t k = 0; k < n; ++k) {
    switch (pick(g, 9)) {
      case 0: if (!b.empty()) b[pick(g, std::min<size_t>(b.size(), 6))] ^= static_cast<char>(1 + pick(g, 255)); break;
      case 1: if (b.size() > 7) { b[6] = static_cast<char>(pick(g, 5)); b[7] = static_cast<char>(pick(g, 2)); } break;
      case 2: if (b.size() > 9) { b[8] = static_cast<char>(pick(g, 256)); b[9] = static_cast<char>(pick(g, 256)); } break;
      case 3: {  // replace a field of the dict
        const char* const descr[] = {"'<f8'", "'>f4'", "'<i4'", "'|b1'", "'<f2'", "'O'", "'<f4 '", "42", "'<c8'"};
        const char* const shape[] = {"()", "(0,)", "(-1,)", "(1099511627776,)", "(3, 'a')", "(1,2,3,4,5,6,7,8,9)",
                                     "(2, 3)", "(9223372036854775807, 2)", "[4]", "(4,", "(65536, 65536)"};
        const char* const order[] = {"True", "1", "'no'", "None"};
        std::string field, value;
        switch (pick(g, 3)) {
          case 0: field = "'descr': "; value = descr[pick(g, std::size(descr))]; break;
          case 1: field = "'shape': "; value = shape[pick(g, std::size(shape))]; break;
          default: field = "'fortran_order': "; value = order[pick(g, std::size(order))]; break;
        }
        const size_t at = b.find(field, dict_at);
        if (at == std::string::npos) break;
        size_t end = at + field.size();
        int depth = 0;
        while (end < b.size() && (depth > 0 || (b[end] != ',' && b[end] != '}'))) {
          if (b[end] == '(') ++depth;
          if (b[end] == ')') --depth;
          ++end;
        }
        b.replace(at + field.size(), end - at - field.size(), value);
        break;
      }
      case 4: b.resize(pick(g, b.size() + 1)); break;                         // truncated anywhere
      case 5: b += std::string(1 + pick(g, 64), '\x3f'); break;                // trailing bytes
      case 6: if (b.size() > dict_at) b[dict_at + pick(g, b.size() - dict_at)] ^= static_cast<char>(1 + pick(g, 255)); break;
      case 7: { const size_t nl = b.find('\n', dict_at); if (nl != std::string::npos) b[nl] = ' '; break; }
      default: if (b.size() > dict_at + 2) b.erase(dict_at + pick(g, b.size() - dict_at), 1 + pick(g, 3)); break;
    }
  }
  return b;
}

TEST(Fuzz, MutatedNpyFilesGiveResultsOrOneLineErrors) {
  const std::string dir = testutil::make_temp_dir("fuzz_npy");
  const int base = env_int("MXLAB_FUZZ_SEED", 1);
  const int count = env_int("MXLAB_FUZZ_COUNT", kDefaultCases);
  const char* const formats[] = {"mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp4_e2m1", "mxint8", "bf16", "fp16"};
  const char* const rules[] = {"floor", "rceil", "ceil", "even", "floor_bump"};
  const char* const modes[] = {"nearest_even", "nearest_away", "toward_zero", "stochastic"};
  int failures = 0, errors = 0, accepted = 0;
  for (int i = 0; i < count; ++i) {
    const int seed = base + i;
    Rng g(static_cast<uint64_t>(seed) * 0xD1B54A32D192ED03ull);
    std::vector<int64_t> shape(1 + pick(g, 3));
    int64_t n = 1;
    for (int64_t& d : shape) n *= (d = static_cast<int64_t>(pick(g, 40)));
    std::vector<float> x(static_cast<size_t>(n));
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& v : x) v = normal(g);
    const std::string bytes = mutate_npy(g, encode_npy(shape, x.data()));
    const std::string in = dir + "/in_" + std::to_string(seed) + ".npy";
    const std::string out = dir + "/out_" + std::to_string(seed) + ".npy";
    testutil::write_bytes(in, bytes);
    const std::string fmt = formats[pick(g, std::size(formats))];
    std::vector<std::string> args = {"quantize", "--format", fmt, "--in", in, "--out", out};
    const bool mx = fmt.rfind("mx", 0) == 0;
    if (mx) args.insert(args.end(), {"--scale-rule", rules[pick(g, std::size(rules))], "--rounding",
                                     modes[pick(g, std::size(modes))], "--block-size", std::to_string(1 + pick(g, 40))});
    if (pick(g, 2)) args.push_back("--stats");
    const Result r = run(args);
    std::string why = judge(r, {out});
    // The oracle: the command succeeds exactly when the file parses (all options here are valid
    // for the format, except that bf16/fp16 take only the nearest roundings, which are the
    // defaults), and then it writes an array of the same shape.
    bool parses = true;
    NpyArray parsed;
    try {
      parsed = parse_npy(bytes, in);
    } catch (const Error&) {
      parses = false;
    }
    if (why.empty() && parses != (r.exit_code == 0))
      why = parses ? "the .npy parses but quantize refused it" : "the .npy does not parse but quantize accepted it";
    if (why.empty() && r.exit_code == 0) {
      try {
        if (read_npy(out).shape != parsed.shape) why = "the output's shape differs from the input's";
      } catch (const Error& e) {
        why = std::string("the output does not read back: ") + e.what();
      }
    }
    for (const auto& e : fs::directory_iterator(dir))
      if (why.empty() && contains(e.path().filename().string(), ".tmp")) why = "a temp file was left: " + e.path().string();
    if (!why.empty()) {
      if (failures++ < kMaxReported)
        ADD_FAILURE() << "seed " << seed << ": " << joined(args) << ": " << why << "\nstderr: " << r.err
                      << "\nthe input is kept at " << in << "\nreproduce: MXLAB_FUZZ_SEED=" << seed
                      << " MXLAB_FUZZ_COUNT=1 build/mxlab_tests --gtest_filter='Fuzz.MutatedNpy*'";
    } else {
      fs::remove(in);
      fs::remove(out);
    }
    (r.exit_code == 0 ? accepted : errors) += 1;
  }
  std::printf("[fuzz] %d .npy mutants (seeds %d..%d): %d accepted, %d refused, %d failures\n", count, base,
              base + count - 1, accepted, errors, failures);
  EXPECT_EQ(failures, 0);
  EXPECT_GT(errors, 0);
  EXPECT_GT(accepted, 0);
  if (failures == 0) fs::remove_all(dir);
}

}  // namespace
