// Names of formats, scale rules and rounding modes, and their parsers.
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/mx/format.h"

namespace mxlab {

namespace {

const char* const kNumFmtNames[] = {"fp32", "bf16", "fp16", "mxfp8_e4m3", "mxfp8_e5m2",
                                    "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8"};
const char* const kScaleRuleNames[] = {"floor", "rceil", "ceil", "even", "floor_bump"};
const char* const kRoundingNames[] = {"nearest_even", "nearest_away", "toward_zero", "stochastic", "noise"};
const char* const kBumpNames[] = {"clamp", "always"};

template <typename E, size_t N>
E parse_enum(const std::string& s, const char* const (&names)[N], const char* what) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<E>(i);
  std::string list;
  for (size_t i = 0; i < N; ++i) list += (i ? ", " : "") + std::string(names[i]);
  throw Error(msg("unknown ", what, " '", s, "' (valid: ", list, ")"));
}

template <size_t N>
std::vector<std::string> all_names(const char* const (&names)[N]) {
  return std::vector<std::string>(names, names + N);
}

}  // namespace

const char* name(NumFmt f) { return kNumFmtNames[static_cast<int>(f)]; }
const char* name(ScaleRule r) { return kScaleRuleNames[static_cast<int>(r)]; }
const char* name(Rounding r) { return kRoundingNames[static_cast<int>(r)]; }
const char* name(Bump b) { return kBumpNames[static_cast<int>(b)]; }
NumFmt parse_numfmt(const std::string& s) { return parse_enum<NumFmt>(s, kNumFmtNames, "format"); }
ScaleRule parse_scale_rule(const std::string& s) { return parse_enum<ScaleRule>(s, kScaleRuleNames, "scale rule"); }
Rounding parse_rounding(const std::string& s) { return parse_enum<Rounding>(s, kRoundingNames, "rounding mode"); }
Bump parse_bump(const std::string& s) { return parse_enum<Bump>(s, kBumpNames, "bump mode"); }
std::vector<std::string> numfmt_names() { return all_names(kNumFmtNames); }
std::vector<std::string> scale_rule_names() { return all_names(kScaleRuleNames); }
std::vector<std::string> rounding_names() { return all_names(kRoundingNames); }

}  // namespace mxlab
