// `mxlab export RUN.h5 --csv DIR`: a run file as flat CSV tables, for people who don't use
// HDF5 (file names and number format: lab/train/csv_export.h); `--snapshot S --npy DIR`: the
// parameter snapshots of step S as .npy files (lab/train/snapshot_export.h).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/cli/option_checks.h"
#include "lab/core/error.h"
#include "lab/io/writable_dir.h"
#include "lab/train/csv_export.h"
#include "lab/train/snapshot_export.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 45;  // after summarize in --help

struct Args {
  std::string run, dir, npy;
  int64_t snapshot = -1;
};

// The CSVs are written into a staging folder inside DIR and moved into DIR only when every one
// of them was written, so that a failure (a full disk halfway) leaves no partial set behind.
int do_export(const Args& a) {
  if (a.dir.empty() && a.npy.empty()) throw Error("nothing to export: give --csv DIR and/or --snapshot S --npy DIR");
  if (!a.npy.empty() && a.snapshot < 0) throw Error("--npy DIR needs --snapshot S (the step of the snapshot to write)");
  if (a.npy.empty() && a.snapshot >= 0) throw Error("--snapshot S needs --npy DIR (where to write the .npy files)");
  ::setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);  // as summarize: a run in progress can be exported
  if (!a.dir.empty()) {
    ensure_writable_dir(a.dir);
    const std::string staging = a.dir + "/.mxlab-export." + std::to_string(::getpid());
    std::vector<std::string> done;
    try {
      for (const std::string& p : export_run_csv(a.run, staging)) {
        const std::string name = std::filesystem::path(p).filename().string();
        const std::string to = a.dir + "/" + name;
        if (std::rename(p.c_str(), to.c_str()) != 0) throw_io_error("write", to, errno);
        done.push_back(to);
      }
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove_all(staging, ec);
      throw;
    }
    std::error_code ec;
    std::filesystem::remove(staging, ec);
    for (const std::string& p : done) std::printf("%s\n", p.c_str());
  }
  if (!a.npy.empty())
    for (const std::string& p : export_snapshot_npy(a.run, a.snapshot, a.npy)) std::printf("%s\n", p.c_str());
  return 0;
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("export", "Write a run file as CSV tables (one per trajectory/branch, loss_all, summary), or its snapshots as .npy");
  c->add_option("run", a->run, "run file <run_id>.h5")->required()->check(CLI::ExistingFile);
  c->add_option("--csv", a->dir, "directory for the CSV files (created if missing)");
  c->add_option("--snapshot", a->snapshot, "with --npy: the step of the parameter snapshots to write")
      ->check(integer_in(0, LLONG_MAX));
  c->add_option("--npy", a->npy,
                "directory for the snapshot's .npy files: <trajectory>/<group>.npy (m/, v/: Adam), probe_x/y.npy");
  c->callback([a] { set_exit_code(do_export(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
