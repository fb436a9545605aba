// Range checks of numeric command-line options. A value out of range is a usage error (exit 2,
// one line naming the option, the range and what was given), never taken as "not given",
// clamped or replaced by a default. CLI11's own range validators print their bounds with every
// digit of DBL_MAX and accept nan; these don't.
#pragma once
#include <CLI/CLI.hpp>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "lab/core/error.h"

namespace mxlab::cli {

// A base-10 integer in [min, max], the whole text.
inline CLI::Validator integer_in(long long min, long long max = INT_MAX) {
  const std::string range = max == INT_MAX      ? msg("an integer >= ", min, " (at most ", INT_MAX, ")")
                            : max == LLONG_MAX ? msg("an integer >= ", min)
                                               : msg("an integer from ", min, " to ", max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno == ERANGE || v < min || v > max)
          return msg("must be ", range, ", got ", quoted_excerpt(text));
        return "";
      },
      max == INT_MAX || max == LLONG_MAX ? msg("INT>=", min) : msg("INT in [", min, ", ", max, "]"));
}

// A base-10 integer in [0, 2^64 - 1] (no sign: "-1" is not read as 2^64 - 1).
inline CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (digits) std::strtoull(text.c_str(), &end, 10);
        if (!digits || errno == ERANGE)
          return msg("must be an integer from 0 to 18446744073709551615, got ", quoted_excerpt(text));
        return "";
      },
      "UINT64");
}

// A finite number > 0 (not nan, not inf).
inline CLI::Validator finite_positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || !(v > 0.0))
          return msg("must be a finite number > 0, got ", quoted_excerpt(text));
        return "";
      },
      "NUMBER>0");
}

}  // namespace mxlab::cli
