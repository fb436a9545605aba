// `mxlab dump-config [EXP.yaml] [--set KEY=VALUE ...] [--id]`: the fully defaulted
// configuration (of a file with overrides, or the built-in defaults) in the input schema,
// so that every default is visible and any printed config can be fed back as a file.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/train/config_io.h"

namespace mxlab::cli {
namespace {

// Help lists commands by this order (run, plan, ... first; inspection tools last).
constexpr int kOrder = 90;

struct Args {
  std::string path;
  std::vector<std::string> sets;
  bool id_only = false;
};

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("dump-config", "Print the fully defaulted configuration (of EXP.yaml, or the defaults)");
  sub->add_option("config", args->path, "experiment YAML file (omit for the built-in defaults)");
  sub->add_option("--set", args->sets, "override a key, e.g. --set model.width=256 (repeatable)")
      ->allow_extra_args(false);
  sub->add_flag("--id", args->id_only, "print only the run id (hash of the fields that change results)");
  sub->callback([args] {
    const RunConfig cfg = args->path.empty() ? config_from_yaml_string("", "defaults", args->sets)
                                             : load_config(args->path, args->sets);
    const std::string out = args->id_only ? config_hash(cfg) + "\n" : dump_config(cfg);
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
});

}  // namespace
}  // namespace mxlab::cli
