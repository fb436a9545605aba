// `mxlab gc DIR [--keep-checkpoints N|all] [--dry-run]`: remove what the finished runs of a
// results directory no longer need (their snapshots, checkpoints beyond the rule, temporary
// files of killed writes; lab/runs/disk_use.h), one line per file and the bytes freed.
#include <cstdio>
#include <memory>
#include <string>

#include "lab/cli/commands.h"
#include "lab/runs/disk_use.h"

namespace mxlab::cli {
namespace {

constexpr int kOrder = 42;  // after summarize in --help

struct GcArgs {
  std::string dir;
  std::string keep = std::to_string(kDefaultKeepCheckpoints);
  bool dry_run = false;
};

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

int do_gc(const GcArgs& a) {
  const int keep = parse_keep_checkpoints(a.keep, 0);
  const GcResult r = gc_run_dir(a.dir, keep, a.dry_run);
  const char* verb = a.dry_run ? "would remove" : "removed";
  for (const GcItem& it : r.removed)
    std::printf("%s %s (%llu bytes): %s\n", verb, it.path.c_str(), static_cast<unsigned long long>(it.bytes),
                it.why.c_str());
  for (const GcSkip& s : r.skipped) std::printf("kept %s: %s\n", s.path.c_str(), s.why.c_str());
  std::printf("gc: %s %zu files, %llu bytes (%s)%s\n", verb, r.removed.size(), static_cast<unsigned long long>(r.bytes),
              mib(r.bytes).c_str(), a.dry_run ? "; nothing was removed (--dry-run)" : "");
  return 0;
}

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto a = std::make_shared<GcArgs>();
  CLI::App* c = app.add_subcommand(
      "gc", "Remove what the finished runs of a results directory no longer need: snapshots, checkpoints beyond "
            "--keep-checkpoints (never those at an intervention or branch step), temporary files of killed writes");
  c->add_option("dir", a->dir, "results directory (the --out of mxlab run)")->required();
  c->add_option("--keep-checkpoints", a->keep,
                "checkpoints each finished run keeps besides those at intervention and branch steps: the latest N "
                "(0 removes them all), or all")
      ->capture_default_str();
  c->add_flag("--dry-run", a->dry_run, "list what would be removed and the bytes it would free; remove nothing");
  c->callback([a] { set_exit_code(do_gc(*a)); });
});

}  // namespace
}  // namespace mxlab::cli
