// mxlab command-line entry point (CLI11). Subcommands are registered by lab/cli/*.cpp.
// Every failure ends here as one line on stderr (control bytes escaped, cut at a length no
// real message reaches: see one_line_message) and one of the exit codes of lab/core/exit_codes.h.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "lab/cli/commands.h"
#include "lab/core/error.h"
#include "lab/core/exit_codes.h"
#include "lab/io/h5file.h"

int main(int argc, char** argv) {
  CLI::App app{"mxlab: a laboratory for training instabilities in MX (microscaling) formats"};
  app.require_subcommand(1);
  mxlab::cli::register_all(app);
  mxlab::cli::set_command_line(argc, argv);
  // How long opening a run file to append waits for another program's HDF5 lock (h5file.h).
  if (const char* w = std::getenv("MXLAB_FILE_LOCK_WAIT")) {
    char* end = nullptr;
    const double s = std::strtod(w, &end);
    if (end == w || *end != '\0' || !(s >= 0.0 && s <= 86400.0)) {
      std::fprintf(stderr, "mxlab: error: MXLAB_FILE_LOCK_WAIT=%s: give seconds from 0 to 86400\n",
                   mxlab::one_line_message(w).c_str());
      return mxlab::kExitBadInput;
    }
    mxlab::h5::set_append_lock_wait(std::chrono::milliseconds(std::llround(s * 1000.0)));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // CLI11 would print two lines and exit with its own codes (100+); a usage error is bad input.
    std::fprintf(stderr, "mxlab: error: %s (see --help)\n", mxlab::one_line_message(e.what()).c_str());
    return mxlab::kExitBadInput;
  } catch (const mxlab::FileInUse& e) {
    std::fprintf(stderr, "mxlab: error: %s\n", mxlab::one_line_message(e.what()).c_str());
    return mxlab::kExitBusy;
  } catch (const mxlab::IoError& e) {
    std::fprintf(stderr, "mxlab: error: %s\n", mxlab::one_line_message(e.what()).c_str());
    return mxlab::kExitIo;
  } catch (const mxlab::Error& e) {
    std::fprintf(stderr, "mxlab: error: %s\n", mxlab::one_line_message(e.what()).c_str());
    return mxlab::kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mxlab: error: %s\n", mxlab::one_line_message(e.what()).c_str());
    return mxlab::kExitInternal;
  }
  return mxlab::cli::exit_code();
}
