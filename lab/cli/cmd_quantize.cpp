// `mxlab quantize`: quantize-dequantize a float32 .npy along its last axis with one MX (or
// bf16/fp16) format, write the result as a float32 .npy of the same shape, and optionally
// print what the quantization did (last-bin and clamped fractions, relative error).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "lab/cli/commands.h"
#include "lab/cli/option_checks.h"
#include "lab/core/error.h"
#include "lab/io/npy.h"
#include "lab/mx/format.h"
#include "lab/mx/quantize.h"

namespace mxlab::cli {

namespace {

constexpr int kOrder = 30;  // after run and plan in --help

struct QuantizeOpts {
  std::string format, scale_rule = "floor", rounding = "nearest_even", bump = "clamp";
  std::string in, out;
  int block = 32;
  bool stats = false;
  uint64_t seed = 0;
  bool bump_given = false;
};

std::string quantize_format_list() {
  std::string list;
  for (const std::string& n : numfmt_names())
    if (n != "fp32") list += (list.empty() ? "" : ", ") + n;
  return list;
}

// Turn the command-line strings into a QuantSpec; every refusal is one line naming the fix.
QuantSpec make_spec(const QuantizeOpts& o) {
  QuantSpec s;
  NumFmt f;
  try {
    f = parse_numfmt(o.format);
  } catch (const Error&) {
    throw Error(msg("unknown --format ", quoted_excerpt(o.format), " (valid: ", quantize_format_list(), ")"));
  }
  if (f == NumFmt::fp32)
    throw Error(msg("--format fp32 would leave the data unchanged; choose one of ", quantize_format_list()));
  s.fmt = f;
  s.rule = parse_scale_rule(o.scale_rule);
  s.rounding = parse_rounding(o.rounding);
  s.bump = parse_bump(o.bump);
  s.block = o.block;
  s.seed = o.seed;
  if (is_mx(f)) {
    if (o.block <= 0) throw Error(msg("--block-size must be positive (got ", o.block, ")"));
    if (o.bump_given && s.rule != ScaleRule::floor_bump)
      throw Error(msg("--bump applies only to --scale-rule floor_bump (got --scale-rule ", o.scale_rule, ")"));
  } else if (s.rounding != Rounding::nearest_even && s.rounding != Rounding::nearest_away) {
    throw Error(msg("--format ", o.format, " supports --rounding nearest_even or nearest_away only (got ",
                    o.rounding, ")"));
  }
  return s;
}

void run_quantize(const QuantizeOpts& o) {
  const QuantSpec spec = make_spec(o);  // validate the options before touching any file
  NpyArray a = read_npy(o.in);
  const int64_t rows = a.rows(), cols = a.cols();
  std::vector<float> q(a.data.size());
  QuantStats st;
  quantize_dequantize(a.data.data(), q.data(), rows, cols, Axis::contiguous, spec, &st);
  write_npy(o.out, a.shape, q.data());
  if (!o.stats) return;

  // Relative error over the elements both sides hold as finite numbers (NaN blocks are
  // reported separately; bf16/fp16 overflow to Inf is counted as non-finite).
  const QuantError qe = quant_error(a.data.data(), q.data(), static_cast<int64_t>(q.size()));
  std::printf("format         %s\n", name(spec.fmt));
  if (is_mx(spec.fmt)) {
    std::printf("scale_rule     %s%s%s\n", name(spec.rule), spec.rule == ScaleRule::floor_bump ? " bump=" : "",
                spec.rule == ScaleRule::floor_bump ? name(spec.bump) : "");
    std::printf("block_size     %d (along the last axis, %lld columns)\n", spec.block, static_cast<long long>(cols));
  }
  std::printf("rounding       %s\n", name(spec.rounding));
  std::printf("elements       %llu\n", static_cast<unsigned long long>(st.n));
  if (is_mx(spec.fmt)) {
    std::printf("blocks         %llu\n", static_cast<unsigned long long>(st.blocks));
    std::printf("nan_blocks     %llu\n", static_cast<unsigned long long>(st.nan_blocks));
    std::printf("lastbin_frac   %.9g  (%llu elements at +-max_normal*X)\n", st.lastbin_frac(),
                static_cast<unsigned long long>(st.lastbin));
    std::printf("clamped_frac   %.9g  (%llu elements above max_normal*X before saturation)\n", st.clamped_frac(),
                static_cast<unsigned long long>(st.clamped));
  }
  std::printf("nonfinite      %llu  (elements left out of rel_error)\n", static_cast<unsigned long long>(qe.nonfinite));
  std::printf("rel_error      %.9g  (||Q(x)-x|| / ||x||)\n", qe.rel);
}

const Registrar reg(kOrder, [](CLI::App& app) {
  auto o = std::make_shared<QuantizeOpts>();
  CLI::App* sub = app.add_subcommand(
      "quantize", "Quantize-dequantize a float32 .npy along its last axis (blocks of --block-size elements)");
  sub->add_option("--format", o->format,
                  "mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4_e2m1, mxint8, bf16 or fp16")
      ->required();
  sub->add_option("--scale-rule", o->scale_rule, "Shared exponent rule: floor, rceil, ceil, even, floor_bump")
      ->capture_default_str();
  sub->add_option("--rounding", o->rounding,
                  "Element rounding: nearest_even, nearest_away, toward_zero, stochastic, noise "
                  "(x + u * ulp(x), off the grid; bf16/fp16: nearest_* only)")
      ->capture_default_str();
  sub->add_option("--block-size", o->block, "Elements per block (a last block that is short is zero-padded)")
      ->capture_default_str()
      ->check(integer_in(1));
  sub->add_option("--bump", o->bump, "floor_bump only: clamp (bump blocks that would clamp) or always")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed of the stochastic-rounding and noise streams")->capture_default_str()->check(unsigned_64());
  sub->add_option("--in", o->in, "Input .npy (float32, C order, rank >= 1)")->required();
  sub->add_option("--out", o->out, "Output .npy (written atomically)")->required();
  sub->add_flag("--stats", o->stats, "Print last-bin/clamped fractions, NaN blocks and relative error");
  sub->callback([o, sub]() {
    o->bump_given = sub->count("--bump") > 0;
    run_quantize(*o);
  });
});

}  // namespace

}  // namespace mxlab::cli
