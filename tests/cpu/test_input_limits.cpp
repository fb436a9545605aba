// Input that is hostile or absurd rather than merely wrong: YAML alias bombs, unterminated
// quotes, tabs in the indentation, megabyte values echoed into messages, numeric options out of
// range, models larger than any machine, sweeps of 10^60 runs, .npy files of more dimensions
// than NumPy loads. Each must end in one short line and exit 2 (bad input), quickly, without
// allocating what the input asks for.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/io/npy.h"
#include "lab/config/config_io.h"
#include "lab/runs/memory_estimate.h"
#include "lab/config/sweep.h"
#include "lab/runs/sweep_runner.h"
#include "lab/config/yaml_tree.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {

using mxlab::test::run_command;
using mxlab::test::TempDir;

// The message of the mxlab::Error thrown by f, or "" (and a test failure) if none.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an mxlab::Error";
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
int newlines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// "Billion laughs": `levels` nested levels of ten aliases each, 10^levels scalars under `name`.
std::string alias_bomb(int levels) {
  std::string y = "a0: &a0 \"lol\"\n";
  for (int i = 1; i <= levels; ++i) {
    y += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) y += (k ? ", *a" : "*a") + std::to_string(i - 1);
    y += "]\n";
  }
  return y + "name: *a" + std::to_string(levels) + "\n";
}

// The binary with `args`, its address space capped at `limit_kib` (so that a regression
// allocates until std::bad_alloc instead of swapping the machine) and killed after 60 s.
std::pair<int, std::string> mxlab_limited(const std::string& args, long limit_kib = 1L << 20) {
  return run_command("ulimit -v " + std::to_string(limit_kib) + "; timeout 60 " + std::string(MXLAB_BINARY) + " " + args);
}

// One line "mxlab: error: ..." of at most `max_len` characters.
void expect_one_short_error(const std::string& out, size_t max_len = 400) {
  EXPECT_EQ(out.rfind("mxlab: error: ", 0), 0u) << out.substr(0, 400);
  EXPECT_EQ(newlines(out), 1) << out.substr(0, 400);
  EXPECT_LE(out.size(), max_len) << out.substr(0, 400);
}

const char* const kSmall = "steps: 4\ndevice: cpu\nmodel: {depth: 1, width: 32}\ndata: {batch: 8}\n";

}  // namespace

// ---- YAML alias expansion ----

TEST(InputLimits, AliasBombIsRefusedWhileParsing) {
  // 6 levels: 10^6 scalars, a few hundred MB as a tree; refused after 100000 nodes.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([] { yaml_parse(alias_bomb(6), "bomb.yaml"); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(has(e, "bomb.yaml:")) << e;
  EXPECT_TRUE(has(e, "more than 100000 keys and values")) << e;
  EXPECT_TRUE(has(e, "aliases")) << e;
  EXPECT_LT(s, 5.0);
  // One huge anchored scalar repeated: few nodes, but far more text than the file holds.
  const std::string big = "a0: &a0 \"" + std::string(1 << 20, 'x') + "\"\nname: [" + [] {
    std::string l;
    for (int k = 0; k < 20; ++k) l += k ? ", *a0" : "*a0";
    return l;
  }() + "]\n";
  const std::string e2 = error_of([&] { yaml_parse(big, "wide.yaml"); });
  EXPECT_TRUE(has(e2, "wide.yaml:")) << e2;
  EXPECT_TRUE(has(e2, "bytes of text")) << e2;
  // Aliases within the bounds still work (and are copied).
  const YNode ok = yaml_parse("a: &x {k: 1}\nb: *x\n", "ok.yaml");
  ASSERT_TRUE(ok.find("b") && ok.find("b")->value.find("k"));
  EXPECT_EQ(ok.find("b")->value.find("k")->value.text, "1");
}

TEST(InputLimits, AliasBombCommandsExit2FastNamingTheFile) {
  // 9 levels, ~550 bytes: 10^9 nodes (tens of GB) without the bound. Under a 1 GiB address
  // space a regression ends in std::bad_alloc (exit 3), not in a hung machine.
  TempDir dir;
  const std::string path = dir.write("bomb.yaml", alias_bomb(9));
  for (const std::string& cmd : {"dump-config " + path, "plan " + path,
                                 "run " + path + " --out " + dir.str() + "/out --dry-run"}) {
    SCOPED_TRACE(cmd);
    const auto t0 = std::chrono::steady_clock::now();
    const auto [rc, out] = mxlab_limited(cmd);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, 2) << out.substr(0, 400);
    expect_one_short_error(out);
    EXPECT_TRUE(has(out, path + ":")) << out.substr(0, 400);
    EXPECT_TRUE(has(out, "aliases")) << out.substr(0, 400);
    EXPECT_LT(s, 20.0);
  }
}

// ---- numeric options ----

TEST(InputLimits, NumericOptionsOutOfRangeExit2) {
  TempDir dir;
  const std::string exp = dir.write("small.yaml", kSmall);
  const std::string any_file = exp;  // positional files are checked for existence only before the options
  const std::string out = " --out " + dir.str() + "/out";
  struct Case {
    std::string args, option;
  };
  const std::vector<Case> cases = {
      {"run " + exp + out + " --steps 0", "--steps"},
      {"run " + exp + out + " --steps -5", "--steps"},
      {"run " + exp + out + " --steps 99999999999", "--steps"},
      {"run " + exp + out + " --jobs 0", "--jobs"},
      {"run " + exp + out + " -j -1", "--jobs"},
      {"bench " + exp + " --device cpu --steps 0", "--steps"},
      {"bench " + exp + " --device cpu --warmup -5", "--warmup"},
      {"bench " + exp + " --device cpu --depth 0", "--depth"},
      {"bench " + exp + " --device cpu --width -1", "--width"},
      {"bench " + exp + " --device cpu --batch 0", "--batch"},
      {"bench " + exp + " --device cpu --run -1", "--run"},
      {"bench " + exp + " --device cpu --arms 0", "--arms"},
      {"bench " + exp + " --device cpu --log-steps 0", "--log-steps"},
      {"bench " + exp + " --device cpu --curvature-iters 1", "--curvature-iters"},
      {"dump-config " + exp + " --run -5", "--run"},
      {"dump-step " + exp + out + " --step -1", "--step"},
      {"eval " + any_file + " --snapshot -5", "--snapshot"},
      {"export " + any_file + " --snapshot -5 --npy " + dir.str() + "/npy", "--snapshot"},
      {"quantize --format mxfp4_e2m1 --in " + any_file + " --out " + dir.str() + "/q.npy --block-size 0", "--block-size"},
      {"quantize --format bf16 --in " + any_file + " --out " + dir.str() + "/q.npy --block-size -3", "--block-size"},
      {"quantize --format mxfp4_e2m1 --in " + any_file + " --out " + dir.str() + "/q.npy --seed -1", "--seed"},
      {"summarize " + dir.str() + " --by arm --degraded-factor -1", "--degraded-factor"},
      {"summarize " + dir.str() + " --by arm --degraded-factor 0", "--degraded-factor"},
      {"summarize " + dir.str() + " --by arm --degraded-factor nan", "--degraded-factor"},
      {"summarize " + dir.str() + " --by arm --degraded-factor inf", "--degraded-factor"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const auto [rc, text] = run_command(std::string(MXLAB_BINARY) + " " + c.args);
    EXPECT_EQ(rc, 2) << text;
    expect_one_short_error(text, 300);
    EXPECT_TRUE(has(text, c.option + ":")) << text;
    EXPECT_TRUE(has(text, "must be")) << text;
    EXPECT_FALSE(has(text, "17976931348623157")) << text;  // DBL_MAX's digits
  }
  // Nothing ran: no run file, no output directory.
  EXPECT_FALSE(std::filesystem::exists(dir.path / "out"));
  // In range still works.
  const auto [rc, text] = run_command(std::string(MXLAB_BINARY) + " run " + exp + out + " --dry-run --steps 3 --jobs 1");
  EXPECT_EQ(rc, 0) << text;
}

// ---- small ones ----

TEST(InputLimits, UnterminatedQuotedStringIsAnError) {
  for (const std::string& text : {std::string("name: \"abc\nsteps: 10\n"), std::string("steps: 10\nname: 'abc\n"),
                                  std::string("name: &n \"abc\n"), std::string("\"name: abc\n"),
                                  std::string("\xEF\xBB\xBFname: \"abc\nsteps: 10\n")}) {  // after a byte order mark
    SCOPED_TRACE(text);
    const std::string e = error_of([&] { config_from_yaml_string(text, "q.yaml"); });
    EXPECT_TRUE(has(e, "unterminated")) << e;
    EXPECT_TRUE(has(e, "q.yaml:")) << e;
  }
  // Closed strings with escapes are not mistaken for open ones.
  EXPECT_EQ(config_from_yaml_string("name: \"a\\\"b\"\n", "q.yaml").name, "a\"b");
  EXPECT_EQ(config_from_yaml_string("name: 'it''s'\n", "q.yaml").name, "it's");
  EXPECT_EQ(config_from_yaml_string("name: it's\n", "q.yaml").name, "it's");
  EXPECT_EQ(config_from_yaml_string("name: \"a # b\" # comment\n", "q.yaml").name, "a # b");
  EXPECT_EQ(config_from_yaml_string("\xEF\xBB\xBFname: 'it''s'\nsteps: 3\n", "q.yaml").name, "it's");
  EXPECT_EQ(config_from_yaml_string("name: \"a\"\r\nsteps: 3\r\n", "q.yaml").name, "a");
}

TEST(InputLimits, TabIndentationIsNamed) {
  for (const std::string& text : {std::string("model:\n\twidth: 64\n"), std::string("model:\n  width: 64\n\tdepth: 2\n"),
                                  std::string("model:\n \twidth: 64\n")}) {
    SCOPED_TRACE(text);
    const std::string e = error_of([&] { config_from_yaml_string(text, "t.yaml"); });
    EXPECT_TRUE(has(e, "tabs are not allowed in YAML indentation")) << e;
    EXPECT_TRUE(has(e, "t.yaml:2:") || has(e, "t.yaml:3:")) << e;
  }
  // A tab as a separator (not indentation) is fine.
  EXPECT_EQ(config_from_yaml_string("steps:\t10\n", "t.yaml").steps, 10);
}

TEST(InputLimits, QuotedTextInMessagesIsCut) {
  const std::string huge(1 << 20, '9');
  for (const std::string& text : {"steps: " + huge + "\n", "steps: x" + huge + "\n",
                                  "model: {activation: g" + huge + "}\n", "name: x\n" + std::string(1 << 16, 'k') + "y: 1\n",
                                  "model: {" + std::string(1 << 16, 'k') + ": 1}\n"}) {
    const std::string e = error_of([&] { config_from_yaml_string(text, "big.yaml"); });
    EXPECT_LE(e.size(), 400u) << e.substr(0, 400);
    EXPECT_TRUE(has(e, "big.yaml:")) << e.substr(0, 400);
  }
  // A whole file that is not an experiment (extends: /etc/passwd and the like) is not echoed.
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 2000; ++i) lines += "user" + std::to_string(i) + ":x:" + std::to_string(i) + ":secret\n";
  const std::string other = dir.write("passwd", lines);
  const std::string exp = dir.write("e.yaml", "extends: " + other + "\n");
  const std::string e = error_of([&] { expand_experiment(exp); });
  EXPECT_LE(e.size(), 400u) << e.substr(0, 400);
  EXPECT_FALSE(has(e, "user1999")) << e.substr(0, 400);
  // --set values and keys.
  const std::string e2 = error_of([&] { config_from_yaml_string("", "d", {"steps=" + std::string(1 << 16, 'z')}); });
  EXPECT_LE(e2.size(), 400u) << e2.substr(0, 400);
  // (an unknown key with no close match lists every valid key: longer, but never the key in full)
  const std::string e3 = error_of([&] { config_from_yaml_string("", "d", {std::string(1 << 16, 'z') + "=1"}); });
  EXPECT_TRUE(has(e3, "...' (65536 bytes)")) << e3.substr(0, 600);
  EXPECT_LE(e3.size(), 4000u) << e3.substr(0, 600);
}

TEST(InputLimits, ExcerptHelper) {
  EXPECT_EQ(excerpt("abc"), "abc");
  EXPECT_EQ(quoted_excerpt("abc"), "'abc'");
  EXPECT_EQ(excerpt("a\nb\tc\x01"), "a\\nb\\tc\\x01");
  EXPECT_EQ(quoted_excerpt(std::string(100, 'x')), "'" + std::string(80, 'x') + "...' (100 bytes)");
  // UTF-8 kept whole, never cut inside a character; stray bytes escaped.
  EXPECT_EQ(excerpt("\xc3\xa9t\xc3\xa9"), "\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(excerpt("a\xff"), "a\\xff");
  const std::string e = excerpt(std::string(79, 'x') + "\xc3\xa9yyy");
  EXPECT_EQ(e, std::string(79, 'x') + "... (84 bytes)");
  // The last resort for whole messages (main): one line, bounded.
  const std::string m = one_line_message("line1\nline2" + std::string(1 << 20, 'x'));
  EXPECT_EQ(newlines(m), 0);
  EXPECT_LT(m.size(), 2100u);
}

TEST(InputLimits, ModelTooLargeForMemoryExit2WithBytes) {
  TempDir dir;
  const std::string exp = dir.write("small.yaml", kSmall);
  const std::string out = " --out " + dir.str() + "/out";
  for (const std::string& args :
       {"run " + exp + out + " --set model.width=1048576", "run " + exp + out + " --set model.depth=1000000 --set model.width=4096",
        "run " + exp + out + " --set data.batch=2000000000 --set data.seq_len=1000",
        "run " + exp + out + " --steps 2000000000 --set 'arms=[{name: a}, {name: b}, {name: c}]'",
        "run " + exp + out + " --set log.snapshot_steps=[1] --set log.probe_batch=2000000000 --set model.width=4096",
        "bench " + exp + " --device cpu --width 1048576", "dump-step " + exp + out + " --set model.width=1048576"}) {
    SCOPED_TRACE(args);
    const auto [rc, text] = mxlab_limited(args, 4L << 20);
    EXPECT_EQ(rc, 2) << text;
    expect_one_short_error(text, 600);
    EXPECT_TRUE(has(text, "needs at least")) << text;
    EXPECT_TRUE(has(text, " bytes")) << text;
    EXPECT_FALSE(has(text, "bad_alloc")) << text;
  }
  // The estimate is a lower bound in exact integers: the number in the message is the bound.
  RunConfig cfg = config_from_yaml_string(kSmall, "s");
  cfg.model.width = 1048576;
  const long double need = run_memory_bytes(cfg);
  EXPECT_GT(need, 1e14L);
  EXPECT_TRUE(has(error_of([&] { check_run_fits_memory(cfg, true, "w"); }), format_bytes(need)));
  EXPECT_EQ(format_bytes(1e30L), "more than 18446744073709551615 bytes");
  EXPECT_EQ(format_bytes(1536), "1536 bytes (1.5 KiB)");
  // A small run fits.
  check_run_fits_memory(config_from_yaml_string(kSmall, "s"), true, "small");
}

TEST(InputLimits, HugeSweepCountIsExactNeverFloatingPoint) {
  // 20 keys x 1000 values: 10^60 runs (a size_t product wraps to 2^60, printed as 1.15292e+18).
  const std::vector<std::string> keys = {"model.width",      "model.depth",         "data.batch",      "optimizer.lr",
                                         "seed",             "steps",               "model.hidden_mult", "data.seq_len",
                                         "schedule.warmup",  "optimizer.beta1",     "optimizer.beta2", "optimizer.eps",
                                         "optimizer.weight_decay", "data.label_noise", "log.log_every", "checkpoint_every",
                                         "model.init_gain",  "precision.block_size", "log.bias_every",  "teacher.width"};
  std::string values;
  for (int i = 1; i <= 1000; ++i) values += (i > 1 ? ", " : "") + std::to_string(i);
  auto sweep = [&](size_t n) {
    std::string y = "sweep:\n  grid:\n";
    for (size_t k = 0; k < n; ++k) y += "    " + keys[k] + ": [" + values + "]\n";
    return y;
  };
  const std::string e = error_of([&] { expand_experiment_string(sweep(20), "s.yaml"); });
  EXPECT_TRUE(has(e, "more than 18446744073709551615 runs")) << e;
  EXPECT_FALSE(has(e, "e+")) << e;
  const std::string e2 = error_of([&] { expand_experiment_string(sweep(2), "s.yaml"); });
  EXPECT_TRUE(has(e2, "expands to 1000000 runs")) << e2;
  EXPECT_TRUE(has(e2, "at most 100000")) << e2;
}

TEST(InputLimits, NpyRankBeyondWhatNumpyLoadsIsRefused) {
  auto header_of_rank = [](size_t rank) {
    std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
    for (size_t k = 0; k < rank; ++k) dict += "1, ";
    dict += "), }";
    const size_t total = 10 + dict.size() + 1, padded = (total + 63) / 64 * 64;
    std::string out("\x93NUMPY\x01\x00", 8);
    out += static_cast<char>((padded - 10) & 0xFF);
    out += static_cast<char>((padded - 10) >> 8);
    out += dict + std::string(padded - total, ' ') + "\n";
    return out + std::string(4, '\0');
  };
  for (size_t rank : {33u, 65u, 1001u}) {
    const std::string e = error_of([&] { parse_npy(header_of_rank(rank), "x.npy"); });
    EXPECT_TRUE(has(e, std::to_string(rank) + " dimensions")) << e;
    EXPECT_TRUE(has(e, "32")) << e;
    const float one = 1.0f;
    EXPECT_TRUE(has(error_of([&] { encode_npy(std::vector<int64_t>(rank, 1), &one); }), "dimensions"));
  }
  EXPECT_EQ(parse_npy(header_of_rank(32), "x.npy").shape.size(), 32u);
  // Through `mxlab quantize`: exit 2, no output file.
  TempDir dir;
  const std::string in = dir.write("in.npy", header_of_rank(1001));
  const auto [rc, text] = run_command(std::string(MXLAB_BINARY) + " quantize --format mxfp4_e2m1 --in " + in +
                                      " --out " + dir.str() + "/out.npy");
  EXPECT_EQ(rc, 2) << text;
  EXPECT_TRUE(has(text, "1001 dimensions")) << text;
  EXPECT_FALSE(std::filesystem::exists(dir.path / "out.npy"));
}

TEST(InputLimits, ShardAndGpuIndicesAreNotNarrowedSilently) {
  // 4294967297 = 2^32 + 1 would become 1 as an int: --shard 0/4294967297 is not shard 0 of 1.
  for (const char* s : {"0/4294967297", "4294967296/4294967297", "0/0", "-1/4", "4/4", "1/x"}) {
    SCOPED_TRACE(s);
    const std::string e = error_of([&] { parse_shard(s); });
    EXPECT_TRUE(has(e, "--shard")) << e;
  }
  EXPECT_EQ(parse_shard("3/16").count, 16);
  EXPECT_TRUE(has(error_of([] { parse_gpu_list("4294967296"); }), "--gpus")) << "would be GPU 0";
  EXPECT_TRUE(has(error_of([] { parse_gpu_list("0,-1"); }), "--gpus"));
  EXPECT_EQ(parse_gpu_list("0,3"), (std::vector<int>{0, 3}));
  // Through the binary, exit 2.
  TempDir dir;
  const std::string exp = dir.write("small.yaml", kSmall);
  const auto [rc, text] =
      run_command(std::string(MXLAB_BINARY) + " run " + exp + " --out " + dir.str() + "/out --dry-run --shard 0/4294967297");
  EXPECT_EQ(rc, 2) << text;
}

TEST(InputLimits, BenchArmsCountIsInTheMemoryEstimate) {
  // `bench --arms K` builds the trainer with K arms: K large enough must be refused up front.
  TempDir dir;
  const std::string exp = dir.write("small.yaml", "steps: 4\ndevice: cpu\nmodel: {depth: 1, width: 1024}\ndata: {batch: 8}\n");
  const auto [rc, text] = mxlab_limited("bench " + exp + " --device cpu --arms 2000000", 4L << 20);
  EXPECT_EQ(rc, 2) << text;
  EXPECT_TRUE(has(text, "needs at least")) << text;
  EXPECT_TRUE(has(text, "2000001 trajectories")) << text;
  RunConfig cfg = config_from_yaml_string(kSmall, "s");
  EXPECT_GT(run_memory_bytes(cfg, 100), run_memory_bytes(cfg) * 40);
}
