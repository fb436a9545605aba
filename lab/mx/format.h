// MX element formats as one table of data (OCP Microscaling spec v1.0, section 5).
// Every number the lab prints or uses (max normal, min subnormal, emax) is derived here
// from (exponent bits, mantissa bits, bias, which codes are reserved) by constexpr code,
// and tests/cpu/test_formats.cpp checks the derived values against the spec's table and
// every code of every format by round trip.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/core/hd.h"

namespace mxlab {

// Element formats of MX blocks. Order is part of the HDF5 schema (stored as names, though).
enum class Elem : uint8_t { fp8_e4m3 = 0, fp8_e5m2, fp6_e3m2, fp6_e2m3, fp4_e2m1, int8, kCount };

// Which top-of-range codes a format reserves (they bound the largest normal value).
enum class Reserved : uint8_t {
  none,      // FP6, FP4: every code is a number
  nan_only,  // FP8 E4M3 ("fn"): only S.1111.111 is NaN, no Inf
  ieee,      // FP8 E5M2: the all-ones exponent is Inf/NaN, as in IEEE 754
};

struct ElemSpec {
  const char* name;  // e.g. "fp8_e4m3"
  int bits;          // storage bits including the sign
  int ebits;         // exponent bits; 0 for the integer format
  int mbits;         // fraction bits below the leading one (int8: 6, elements are k/64)
  int bias;          // exponent bias (int8: unused)
  Reserved reserved;

  MXLAB_HD constexpr bool is_int() const { return ebits == 0; }
  // Exponent of the smallest normal binade (int8: the grid is 2^-6 everywhere: treat the
  // format as "all subnormal" with emin 0, i.e. one binade [1, 2) plus fixed point below).
  MXLAB_HD constexpr int emin() const { return is_int() ? 0 : 1 - bias; }
  // Exponent of the largest normal binade: the paper's e_max^elem used by the floor scale.
  MXLAB_HD constexpr int emax() const {
    return is_int() ? 0 : ((1 << ebits) - 1 - (reserved == Reserved::ieee ? 1 : 0)) - bias;
  }
  // Largest normal magnitude, as an integer significand times 2^(emax - mbits):
  // max_normal = max_sig() * 2^(emax() - mbits).
  MXLAB_HD constexpr uint32_t max_sig() const {
    // Significand with the implicit one: (1 << mbits) | fraction.
    return is_int() ? 127u
                    : (reserved == Reserved::nan_only ? ((2u << mbits) - 2u)   // fraction all-ones is NaN
                                                      : ((2u << mbits) - 1u));
  }
  // Exponent of the least significant bit of the largest binade.
  MXLAB_HD constexpr int max_lsb_exp() const { return emax() - mbits; }
  // Exponent of the smallest subnormal (the grid spacing of the lowest binade).
  MXLAB_HD constexpr int min_sub_exp() const { return emin() - mbits; }
  MXLAB_HD constexpr double max_normal() const {
    return static_cast<double>(max_sig()) * pow2(max_lsb_exp());
  }
  MXLAB_HD constexpr double min_normal() const { return is_int() ? pow2(-mbits) : pow2(emin()); }
  MXLAB_HD constexpr double min_subnormal() const { return pow2(min_sub_exp()); }
  // Binades spanned from the smallest subnormal to the largest normal.
  MXLAB_HD constexpr int binades() const { return emax() - min_sub_exp() + 1; }

  MXLAB_HD static constexpr double pow2(int e) {
    double r = 1.0;
    for (int i = 0; i < (e < 0 ? -e : e); ++i) r = e < 0 ? r * 0.5 : r * 2.0;
    return r;
  }
};

// The table. Spec values it must reproduce (checked in tests): see DESIGN.md section 2.
constexpr ElemSpec kElemSpecs[static_cast<int>(Elem::kCount)] = {
    {"fp8_e4m3", 8, 4, 3, 7, Reserved::nan_only},
    {"fp8_e5m2", 8, 5, 2, 15, Reserved::ieee},
    {"fp6_e3m2", 6, 3, 2, 3, Reserved::none},
    {"fp6_e2m3", 6, 2, 3, 1, Reserved::none},
    {"fp4_e2m1", 4, 2, 1, 1, Reserved::none},
    {"int8", 8, 0, 6, 0, Reserved::none},
};

MXLAB_HD constexpr const ElemSpec& elem_spec(Elem e) { return kElemSpecs[static_cast<int>(e)]; }

// ---- the numeric roles of a precision policy -------------------------------------------
// A tensor operand is either left in FP32, rounded to a scalar format (bf16/fp16), or
// block-quantized to an MX format.
enum class NumFmt : uint8_t {
  fp32 = 0, bf16, fp16,
  mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4_e2m1, mxint8,
  kCount
};

MXLAB_HD constexpr bool is_mx(NumFmt f) { return f >= NumFmt::mxfp8_e4m3 && f < NumFmt::kCount; }
MXLAB_HD constexpr Elem mx_elem(NumFmt f) {
  return static_cast<Elem>(static_cast<int>(f) - static_cast<int>(NumFmt::mxfp8_e4m3));
}

// Shared-exponent (scale) rules, DESIGN.md section 2.
enum class ScaleRule : uint8_t { floor = 0, rceil, ceil, even, floor_bump, kCount };
// Element rounding. `noise` is no rounding: the element becomes v + u * ulp(v), off the grid
// (lab/mx/README.md, "Noise instead of rounding"; lab/mx/scalar.h, noise_element).
enum class Rounding : uint8_t { nearest_even = 0, nearest_away, toward_zero, stochastic, noise, kCount };
// For floor_bump: bump only blocks where an element would clamp, or every block.
enum class Bump : uint8_t { clamp = 0, always, kCount };

// Names <-> enums. Parsing throws mxlab::Error listing the valid names.
const char* name(NumFmt f);
const char* name(ScaleRule r);
const char* name(Rounding r);
const char* name(Bump b);
NumFmt parse_numfmt(const std::string& s);
ScaleRule parse_scale_rule(const std::string& s);
Rounding parse_rounding(const std::string& s);
Bump parse_bump(const std::string& s);
std::vector<std::string> numfmt_names();
std::vector<std::string> scale_rule_names();
std::vector<std::string> rounding_names();

}  // namespace mxlab
