// `mxlab formats`: the element-format table, computed from lab/mx/format.h (never typed in),
// plus the scalar formats bf16/fp16/fp32 described by the same parameters.
#include <cstdio>
#include <string>

#include "lab/cli/commands.h"
#include "lab/mx/format.h"

namespace mxlab::cli {

namespace {

constexpr int kOrder = 40;

// IEEE-style scalar formats as ElemSpec rows, so their limits come from the same code.
constexpr ElemSpec kScalarSpecs[] = {
    {"bf16", 16, 8, 7, 127, Reserved::ieee},
    {"fp16", 16, 5, 10, 15, Reserved::ieee},
    {"fp32", 32, 8, 23, 127, Reserved::ieee},
};

std::string pow2_str(int e) { return "2^" + std::to_string(e); }

void print_row(const char* fmt_name, const ElemSpec& es) {
  char max_normal[32];
  std::snprintf(max_normal, sizeof max_normal, "%.9g", es.max_normal());
  std::printf("%-11s %-9s %4d %5d %5d %5s %5d %14s %12s %13s %7d\n", fmt_name, es.name, es.bits, es.ebits,
              es.mbits, es.is_int() ? "-" : std::to_string(es.bias).c_str(), es.emax(), max_normal,
              es.is_int() ? "-" : pow2_str(es.emin()).c_str(), pow2_str(es.min_sub_exp()).c_str(), es.binades());
}

void run_formats() {
  std::printf("%-11s %-9s %4s %5s %5s %5s %5s %14s %12s %13s %7s\n", "format", "element", "bits", "ebits",
              "mbits", "bias", "emax", "max_normal", "min_normal", "min_subnormal", "binades");
  for (int f = static_cast<int>(NumFmt::mxfp8_e4m3); f < static_cast<int>(NumFmt::kCount); ++f) {
    const NumFmt nf = static_cast<NumFmt>(f);
    print_row(name(nf), elem_spec(mx_elem(nf)));
  }
  for (const ElemSpec& es : kScalarSpecs) print_row(es.name, es);
  std::printf(
      "\nMX formats: blocks of k elements (default 32) share a scale X = 2^e, e in [-127, 127] (E8M0).\n"
      "int8 elements are k/64 with |k| <= 127 (mbits = 6 fraction bits; no exponent).\n"
      "Element bits include the sign. emax is the exponent of the largest normal binade.\n");
}

const Registrar reg(kOrder, [](CLI::App& app) {
  CLI::App* sub = app.add_subcommand("formats", "Print the element-format table (computed from the code)");
  sub->callback([]() { run_formats(); });
});

}  // namespace

}  // namespace mxlab::cli
