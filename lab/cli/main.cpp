// mxlab command-line entry point (CLI11). Subcommands are registered by lab/cli/*.cpp.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "lab/cli/commands.h"
#include "lab/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"mxlab: a laboratory for training instabilities in MX (microscaling) formats"};
  app.require_subcommand(1);
  mxlab::cli::register_all(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mxlab::Error& e) {
    std::fprintf(stderr, "mxlab: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mxlab: error: %s\n", e.what());
    return 3;
  }
  return mxlab::cli::exit_code();
}
