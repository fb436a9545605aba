// Subcommand registry (see commands.h).
#include "lab/cli/commands.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace mxlab::cli {

namespace {
std::vector<std::pair<int, RegisterFn>>& registry() {
  static std::vector<std::pair<int, RegisterFn>> r;
  return r;
}
int g_exit_code = 0;
std::string g_command_line;

// `a` as one shell word: as it is when it holds only safe characters, else in single quotes.
std::string shell_word(const std::string& a) {
  const bool safe = !a.empty() && a.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                      "0123456789_-./=:,+@%") == std::string::npos;
  if (safe) return a;
  std::string q = "'";
  for (const char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

Registrar::Registrar(int order, RegisterFn fn) { registry().emplace_back(order, std::move(fn)); }

void register_all(CLI::App& app) {
  auto& r = registry();
  std::stable_sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [order, fn] : r) fn(app);
}

void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

void set_command_line(int argc, const char* const* argv) {
  g_command_line.clear();
  for (int i = 0; i < argc; ++i) g_command_line += (i ? " " : "") + shell_word(argv[i] ? argv[i] : "");
}
const std::string& command_line() { return g_command_line; }

}  // namespace mxlab::cli
