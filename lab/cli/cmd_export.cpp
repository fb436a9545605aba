// `mxlab export RUN.h5 --csv DIR`: a run file as flat CSV tables, for people who don't use
// HDF5 (file names and number format: lab/train/index.h, export_run_csv).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/core/error.h"
#include "lab/io/writable_dir.h"
#include "lab/train/index.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 45;  // after summarize in --help

struct Args {
  std::string run, dir;
};

// The CSVs are written into a staging folder inside DIR and moved into DIR only when every one
// of them was written, so that a failure (a full disk halfway) leaves no partial set behind.
int do_export(const Args& a) {
  ::setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);  // as summarize: a run in progress can be exported
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
