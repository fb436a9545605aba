// `mxlab export RUN.h5 --csv DIR`: a run file as flat CSV tables, for people who don't use
// HDF5 (file names and number format: lab/report/csv_export.h); `--snapshot S --npy DIR`: the
// parameter snapshots of step S as .npy files (lab/report/snapshot_export.h); `RUN_OR_DIR
// --tensorboard DIR`: TensorBoard event files (lab/report/tensorboard_export.h).
// `mxlab export DIR --long OUT.csv`: every run file of a results directory (or one run file) as
// one long table, one row per logged value (lab/report/long_export.h).
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
#include "lab/io/out_file.h"
#include "lab/io/writable_dir.h"
#include "lab/report/csv_export.h"
#include "lab/report/long_export.h"
#include "lab/report/snapshot_export.h"
#include "lab/report/tensorboard_export.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 45;  // after summarize in --help

struct Args {
  std::string run, dir, npy, long_out;
  std::string tensorboard;  // --tensorboard DIR
  int64_t snapshot = -1;
};

// What one output directory gets: files written into a fresh staging folder inside it, by
// their paths relative to it.
struct Staged {
  std::string dir, staging;
  bool created = false;  // `dir` did not exist before
  std::vector<std::string> files;
};

Staged make_staging(const std::string& dir) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(dir, ec);
  ensure_writable_dir(dir);
  std::string tmpl = dir + "/.mxlab-export.XXXXXX";  // mkdtemp: a new directory, never a link
  if (!::mkdtemp(tmpl.data())) throw_io_error("write in directory", dir, errno);
  return {dir, tmpl, !existed, {}};
}

void add_files(Staged& s, const std::vector<std::string>& written) {
  for (const std::string& p : written) {
    const std::string rel = std::filesystem::path(p).lexically_relative(s.staging).lexically_normal().string();
    if (rel.empty() || rel.rfind("..", 0) == 0 || rel[0] == '/')
      throw Error(msg("internal: export wrote ", p, " outside its staging folder ", s.staging));
    s.files.push_back(rel);
  }
}

// Everything is written into staging folders inside DIR first (CSV and .npy alike) and moved
// into place only when every file of the export was written, so that a failure (a damaged run
// file, a full disk halfway) leaves no partial set behind. Files are moved with rename(2), which
// replaces a link of that name instead of writing through it; a subfolder that is a link is
// refused (lab/io/out_file.h).
constexpr size_t kMaxLeftOutLines = 10;  // notes on stderr about run files left out of --long

int do_long(const Args& a) {
  if (!a.dir.empty() || !a.npy.empty() || a.snapshot >= 0 || !a.tensorboard.empty())
    throw Error("--long writes one table by itself: run --csv DIR, --snapshot S --npy DIR or --tensorboard DIR as a "
                "separate export");
  const std::string ext = std::filesystem::path(a.long_out).extension().string();
  if (ext == ".gz" || ext == ".parquet")
    throw Error(msg("--long ", a.long_out, ": writes plain CSV only; name it .csv (and compress it afterwards, e.g. "
                    "gzip)"));
  ::setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);  // as summarize: a run in progress can be exported
  const LongExportResult r = export_long_csv(a.run, a.long_out);
  for (size_t i = 0; i < r.left_out.size() && i < kMaxLeftOutLines; ++i)
    std::fprintf(stderr, "mxlab: note: left out %s\n", r.left_out[i].c_str());
  if (r.left_out.size() > kMaxLeftOutLines)
    std::fprintf(stderr, "mxlab: note: left out %zu more\n", r.left_out.size() - kMaxLeftOutLines);
  std::printf("%s\n", a.long_out.c_str());
  return 0;
}

int do_export(const Args& a) {
  if (!a.long_out.empty()) return do_long(a);
  if (a.dir.empty() && a.npy.empty() && a.tensorboard.empty())
    throw Error("nothing to export: give --csv DIR, --snapshot S --npy DIR and/or --tensorboard DIR (or --long OUT.csv)");
  if (std::filesystem::is_directory(a.run) && !(a.dir.empty() && a.npy.empty()))
    throw Error(msg(a.run, " is a directory: --csv and --npy export one run file (give DIR/<run_id>.h5); a "
                    "directory of runs only with --tensorboard DIR, or --long OUT.csv for one table"));
  if (!a.npy.empty() && a.snapshot < 0) throw Error("--npy DIR needs --snapshot S (the step of the snapshot to write)");
  if (a.npy.empty() && a.snapshot >= 0) throw Error("--snapshot S needs --npy DIR (where to write the .npy files)");
  ::setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);  // as summarize: a run in progress can be exported
  std::vector<Staged> stages;
  std::vector<std::string> done;
  try {
    if (!a.dir.empty()) {
      stages.push_back(make_staging(a.dir));
      add_files(stages.back(), export_run_csv(a.run, stages.back().staging));
    }
    if (!a.npy.empty()) {
      stages.push_back(make_staging(a.npy));
      add_files(stages.back(), export_snapshot_npy(a.run, a.snapshot, stages.back().staging));
    }
    if (!a.tensorboard.empty()) {
      stages.push_back(make_staging(a.tensorboard));
      add_files(stages.back(), export_run_tensorboard(a.run, stages.back().staging));
    }
    try {
      for (const Staged& s : stages)
        for (const std::string& rel : s.files) {
          const std::string to = s.dir + "/" + rel;
          make_dirs_below(s.dir, std::filesystem::path(to).parent_path().string());
          if (std::rename((s.staging + "/" + rel).c_str(), to.c_str()) != 0) throw_io_error("write", to, errno);
          done.push_back(to);
        }
    } catch (...) {
      for (const std::string& p : done) std::remove(p.c_str());
      throw;
    }
  } catch (...) {
    for (const Staged& s : stages) {
      std::error_code ec;
      std::filesystem::remove_all(s.staging, ec);
      if (s.created) std::filesystem::remove(s.dir, ec);  // only if empty
    }
    throw;
  }
  for (const Staged& s : stages) {
    std::error_code ec;
    std::filesystem::remove_all(s.staging, ec);
  }
  for (const std::string& p : done) std::printf("%s\n", p.c_str());
  return 0;
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("export", "Write a run file as CSV tables (one per trajectory/branch, loss_all, summary), or its "
                                   "snapshots as .npy; a run file or a results directory as TensorBoard event files, "
                                   "or every run file of a results directory as one long CSV table");
  c->add_option("run", a->run, "run file <run_id>.h5 (with --long or --tensorboard: also a results directory)")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--csv", a->dir, "directory for the CSV files (created if missing)");
  c->add_option("--snapshot", a->snapshot, "with --npy: the step of the parameter snapshots to write")
      ->check(integer_in(0, LLONG_MAX));
  c->add_option("--npy", a->npy,
                "directory for the snapshot's .npy files: <trajectory>/<group>.npy (m/, v/: Adam), probe_x/y.npy");
  c->add_option("--long", a->long_out,
                "write one long table to this CSV file: a row per logged value of every run file of RUN (a results "
                "directory or one run file), columns run_id, the configuration keys that differ between the runs, "
                "seed, trajectory, kind, arm, step, metric, column, value (lab/report/README.md)")
      ->type_name("OUT.csv");
  c->add_option("--tensorboard", a->tensorboard,
                "directory for TensorBoard event files: <run_id>/<trajectory>/events.out.tfevents.* (scalars per "
                "logged step, loss_all per step); view with tensorboard --logdir DIR");
  c->callback([a] { set_exit_code(do_export(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
