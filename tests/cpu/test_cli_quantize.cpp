// `mxlab quantize` and `mxlab formats`, run as the built binary (MXLAB_BINARY): the output
// equals the library's quantization bit for bit, --stats reports the right numbers, and bad
// input gives one clear line on stderr, a non-zero exit and no output file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "lab/io/npy.h"
#include "lab/mx/quantize.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {

using mxlab::test::read_file;

struct Result {
  int rc;
  std::string out, err;
};


// Per-test, per-process file names: ctest runs the tests of this file in parallel.
std::string tmp(const std::string& name) {
  return ::testing::TempDir() + "/mxlab_cli_" + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
         "_" + std::to_string(static_cast<long>(::getpid())) + "_" + name;
}

Result run(const std::string& args) {
  const std::string o = tmp("stdout.txt"), e = tmp("stderr.txt");
  const std::string cmd = std::string(MXLAB_BINARY) + " " + args + " >" + o + " 2>" + e;
  const int status = std::system(cmd.c_str());
  Result r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(o);
  r.err = read_file(e);
  return r;
}

bool exists(const std::string& p) { return std::ifstream(p).good(); }
int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(CliQuantize, OutputEqualsLibraryBitForBit) {
  // Shape (2, 3, 45): last dim not a multiple of 32, so each row ends in a padded block.
  const std::vector<int64_t> shape = {2, 3, 45};
  std::vector<float> x(2 * 3 * 45);
  uint32_t state = 12345;
  for (float& v : x) {
    state = state * 1664525u + 1013904223u;
    v = std::ldexp(static_cast<float>(static_cast<int>(state >> 8) % 20001 - 10000) / 1000.0f,
                   static_cast<int>(state >> 28) - 8);
  }
  const std::string in = tmp("in.npy"), out = tmp("out.npy");
  write_npy(in, shape, x.data());
  struct Case {
    const char* args;
    NumFmt f;
    ScaleRule rule;
    Rounding r;
    int block;
    Bump bump;
    uint64_t seed;
  };
  const Case cases[] = {
      {"--format mxfp8_e4m3", NumFmt::mxfp8_e4m3, ScaleRule::floor, Rounding::nearest_even, 32, Bump::clamp, 0},
      {"--format mxfp4_e2m1 --scale-rule rceil --rounding nearest_away --block-size 16", NumFmt::mxfp4_e2m1,
       ScaleRule::rceil, Rounding::nearest_away, 16, Bump::clamp, 0},
      {"--format mxint8 --scale-rule floor_bump --bump always --block-size 7", NumFmt::mxint8, ScaleRule::floor_bump,
       Rounding::nearest_even, 7, Bump::always, 0},
      {"--format mxfp6_e3m2 --rounding stochastic --seed 99", NumFmt::mxfp6_e3m2, ScaleRule::floor,
       Rounding::stochastic, 32, Bump::clamp, 99},
      {"--format bf16 --rounding nearest_away", NumFmt::bf16, ScaleRule::floor, Rounding::nearest_away, 32,
       Bump::clamp, 0},
      {"--format fp16", NumFmt::fp16, ScaleRule::floor, Rounding::nearest_even, 32, Bump::clamp, 0},
  };
  for (const Case& c : cases) {
    std::remove(out.c_str());
    const Result r = run(std::string("quantize ") + c.args + " --in " + in + " --out " + out);
    ASSERT_EQ(r.rc, 0) << c.args << ": " << r.err;
    const NpyArray y = read_npy(out);
    EXPECT_EQ(y.shape, shape);
    QuantSpec s;
    s.fmt = c.f;
    s.rule = c.rule;
    s.rounding = c.r;
    s.block = c.block;
    s.bump = c.bump;
    s.seed = c.seed;
    std::vector<float> want(x.size());
    quantize_dequantize(x.data(), want.data(), 6, 45, Axis::contiguous, s);
    ASSERT_EQ(y.data.size(), want.size());
    EXPECT_EQ(std::memcmp(y.data.data(), want.data(), want.size() * 4), 0) << c.args;
  }
  std::remove(in.c_str());
  std::remove(out.c_str());
}

TEST(CliQuantize, StatsReportFractionsAndError) {
  // One block of 4 (E4M3, floor, s = 0): 460 clamps into the last bin, 448 is in it, 100 -> 96.
  const std::vector<float> x = {460.0f, 448.0f, 100.0f, 1.0f};
  const std::string in = tmp("stats_in.npy"), out = tmp("stats_out.npy");
  write_npy(in, {4}, x.data());
  const Result r = run("quantize --format mxfp8_e4m3 --block-size 4 --stats --in " + in + " --out " + out);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "lastbin_frac   0.5 ")) << r.out;
  EXPECT_TRUE(contains(r.out, "clamped_frac   0.25 ")) << r.out;
  EXPECT_TRUE(contains(r.out, "nan_blocks     0")) << r.out;
  // ||Q(x) - x|| / ||x|| = sqrt(12^2 + 4^2) / sqrt(460^2 + 448^2 + 100^2 + 1^2)
  char rel[64];
  std::snprintf(rel, sizeof rel, "rel_error      %.9g", std::sqrt(160.0) / std::sqrt(460.0 * 460 + 448.0 * 448 + 10001));
  EXPECT_TRUE(contains(r.out, rel)) << r.out << " expected " << rel;
  std::remove(in.c_str());
  std::remove(out.c_str());
}

TEST(CliQuantize, BadInputOneLineNonZeroExitNoOutput) {
  const std::string good = tmp("good.npy"), out = tmp("bad_out.npy");
  const float v[4] = {1, 2, 3, 4};
  write_npy(good, {2, 2}, v);
  // Hand-made bad files: text, float64, Fortran order.
  const std::string text = tmp("text.npy"), f64 = tmp("f64.npy"), fort = tmp("fortran.npy");
  std::ofstream(text) << "not an npy file\n";
  {
    std::string img = encode_npy({2, 2}, v);
    std::string f64img = img;
    f64img.replace(f64img.find("<f4"), 3, "<f8");
    std::ofstream(f64, std::ios::binary) << f64img;
    std::string fimg = img;
    fimg.replace(fimg.find("False"), 5, "True ");
    std::ofstream(fort, std::ios::binary) << fimg;
  }
  struct Case {
    std::string args, expect;
  };
  const Case cases[] = {
      {"quantize --format mxfp8_e4m3 --in " + text + " --out " + out, "not a NumPy .npy file"},
      {"quantize --format mxfp8_e4m3 --in " + f64 + " --out " + out, "float64"},
      {"quantize --format mxfp8_e4m3 --in " + fort + " --out " + out, "Fortran"},
      {"quantize --format mxfp7 --in " + good + " --out " + out, "unknown --format 'mxfp7'"},
      {"quantize --format mxfp8_e4m3 --block-size 0 --in " + good + " --out " + out, "--block-size: must be an integer >= 1"},
      {"quantize --format mxfp8_e4m3 --block-size -3 --in " + good + " --out " + out, "--block-size: must be an integer >= 1"},
      {"quantize --format mxfp8_e4m3 --scale-rule nearest --in " + good + " --out " + out, "unknown scale rule"},
      {"quantize --format bf16 --rounding stochastic --in " + good + " --out " + out, "nearest_even or nearest_away"},
      {"quantize --format mxfp8_e4m3 --bump always --in " + good + " --out " + out, "floor_bump"},
      {"quantize --format mxfp8_e4m3 --in " + tmp("missing.npy") + " --out " + out, "missing.npy"},
  };
  for (const Case& c : cases) {
    std::remove(out.c_str());
    const Result r = run(c.args);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_EQ(lines(r.err), 1) << c.args << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "mxlab: error: ")) << r.err;
    EXPECT_TRUE(contains(r.err, c.expect)) << c.args << ": " << r.err;
    EXPECT_FALSE(exists(out)) << c.args << " left an output file";
  }
  for (const std::string& p : {good, text, f64, fort}) std::remove(p.c_str());
}

TEST(CliFormats, PrintsTableComputedFromCode) {
  const Result r = run("formats");
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* s : {"mxfp8_e4m3", "448", "2^-9", "57344", "2^-16", "mxfp6_e3m2", "28", "7.5", "mxfp4_e2m1",
                        "mxint8", "1.984375", "bf16", "2^-133", "fp16", "65504", "fp32", "2^-149"})
    EXPECT_TRUE(contains(r.out, s)) << s << " missing from:\n" << r.out;
}

TEST(CliHelp, EverySubcommandHasHelp) {
  for (const char* sub : {"quantize", "formats"}) {
    const Result r = run(std::string(sub) + " --help");
    EXPECT_EQ(r.rc, 0) << sub;
    EXPECT_TRUE(contains(r.out, "Usage")) << sub << ": " << r.out;
  }
  const Result q = run("quantize --help");
  for (const char* opt : {"--format", "--scale-rule", "--rounding", "--block-size", "--in", "--out", "--stats",
                          "--seed", "--bump"})
    EXPECT_TRUE(contains(q.out, opt)) << opt;
}
