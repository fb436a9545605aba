// Exit codes of the `mxlab` program, one meaning each, so that shells, Slurm and CI can act on
// them. Documented in `mxlab run --help`, README.md and lab/runs/README.md; tested through the
// binary (tests/cpu/test_exit_codes.cpp).
#pragma once

namespace mxlab {

constexpr int kExitOk = 0;            // everything done (runs complete, diverged or already done)
constexpr int kExitRunFailed = 1;     // mxlab run: a run failed (the report and its file say why)
constexpr int kExitBadInput = 2;      // the command line or an input file is wrong: fix it
constexpr int kExitInternal = 3;      // a bug in mxlab (please report)
constexpr int kExitIo = 74;           // a file could not be written/read: disk full, read-only, permissions, a link
constexpr int kExitBusy = 75;         // runs locked by another live process, or files open in one; run again later
constexpr int kExitInterrupted = 130; // stopped by SIGINT/SIGTERM; run the same command again to resume

// The table above as text, for --help and error reports.
inline const char* exit_codes_help() {
  return "Exit codes:\n"
         "  0    every run is done (complete, diverged, or already done before)\n"
         "  1    a run failed: the report and its file's `error` attribute say why\n"
         "  2    bad input: the command line or an input file is wrong (the message says how to fix it)\n"
         "  3    internal error: a bug in mxlab (please report)\n"
         "  74   a file could not be written or read: disk full, read-only directory, permissions, a link\n"
         "  75   busy: another live process holds some runs' locks or has their files open; run again once it is done\n"
         "  130  interrupted (SIGINT/SIGTERM): checkpoints saved; run the same command again to resume\n"
         "When several apply: 1, then 130, then 75.";
}

}  // namespace mxlab
