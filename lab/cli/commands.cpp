// Subcommand registry (see commands.h).
#include "lab/cli/commands.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace mxlab::cli {

namespace {
std::vector<std::pair<int, RegisterFn>>& registry() {
  static std::vector<std::pair<int, RegisterFn>> r;
  return r;
}
int g_exit_code = 0;
}  // namespace

Registrar::Registrar(int order, RegisterFn fn) { registry().emplace_back(order, std::move(fn)); }

void register_all(CLI::App& app) {
  auto& r = registry();
  std::stable_sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [order, fn] : r) fn(app);
}

void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

}  // namespace mxlab::cli
