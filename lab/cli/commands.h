// Registration of the CLI subcommands. Each lab/cli/<name>.cpp registers itself with a
// static `Registrar` (these files are compiled into the executable itself, so the static
// objects are always linked) and never touches the others; --help lists them by `order`.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace mxlab::cli {

using RegisterFn = std::function<void(CLI::App& app)>;

struct Registrar {
  Registrar(int order, RegisterFn fn);
};

void register_all(CLI::App& app);
// Subcommand callbacks set this to report failure without throwing (e.g. a failed run).
void set_exit_code(int code);
int exit_code();
// The command line as typed (main() records it), each argument shell-quoted where it needs it:
// what `mxlab bench` writes beside its measurements.
void set_command_line(int argc, const char* const* argv);
const std::string& command_line();

}  // namespace mxlab::cli
