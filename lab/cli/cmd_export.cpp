// `mxlab export RUN.h5 --csv DIR`: a run file as flat CSV tables, for people who don't use
// HDF5 (file names and number format: lab/train/csv_export.h).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "lab/cli/commands.h"
#include "lab/train/csv_export.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 45;  // after summarize in --help

struct Args {
  std::string run, dir;
};

int do_export(const Args& a) {
  ::setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);  // as summarize: a run in progress can be exported
  for (const std::string& p : export_run_csv(a.run, a.dir)) std::printf("%s\n", p.c_str());
  return 0;
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("export", "Write a run file as CSV tables (one per trajectory/branch, loss_all, summary)");
  c->add_option("run", a->run, "run file <run_id>.h5")->required()->check(CLI::ExistingFile);
  c->add_option("--csv", a->dir, "directory for the CSV files (created if missing)")->required();
  c->callback([a] { set_exit_code(do_export(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
