// Trajectory names (see names.h).
#include "lab/config/names.h"

#include <cctype>
#include <cstdio>

#include "lab/core/error.h"

namespace mxlab {

namespace {

constexpr size_t kQuotedMax = 40;
constexpr const char* kRule = "a name is letters, digits, '_', '-' and '.', not starting with '.'";

std::string printable(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (std::isprint(u) && c != '\'') return std::string("'") + c + "'";
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", u);
  return buf;
}

}  // namespace

std::string plain_name_problem(const std::string& name) {
  if (name.empty()) return msg("is empty: ", kRule);
  if (name.size() > kMaxNameLength)
    return msg("is ", name.size(), " characters long: at most ", kMaxNameLength, " (it becomes part of file names)");
  if (name[0] == '.')
    return msg("starts with '.': ", kRule, " (it names a directory on export, where '.' and '..' are this folder and the "
               "one above)");
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
      return msg("holds the character ", printable(c), ": ", kRule, " (it names an HDF5 group and exported files)");
  return {};
}

std::string arm_name_problem(const std::string& name) {
  std::string p = plain_name_problem(name);
  if (!p.empty()) return p;
  if (name == kFp32Name) return "is reserved for the FP32 trajectory (trajectories/fp32): choose another name";
  return {};
}

std::string branch_name_problem(const std::string& name) {
  std::string p = arm_name_problem(name);
  if (!p.empty()) return p;
  if (name == kDefaultArmName)
    return "is reserved for an arm (trajectories/mx, the arm of a run without `arms:`): choose another name";
  return {};
}

std::string quoted_name(const std::string& name) {
  std::string out = "'";
  for (size_t i = 0; i < name.size() && i < kQuotedMax; ++i) {
    const auto u = static_cast<unsigned char>(name[i]);
    if (std::isprint(u)) {
      out += name[i];
    } else {  // one line, whatever the name holds
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  return out + (name.size() > kQuotedMax ? "...'" : "'");
}

}  // namespace mxlab
