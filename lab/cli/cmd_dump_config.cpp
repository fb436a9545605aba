// `mxlab dump-config [EXP.yaml] [--set KEY=VALUE ...] [--run N] [--id]`: the fully defaulted
// configuration (of a file with overrides, or the built-in defaults) in the input schema,
// so that every default is visible and any printed config can be fed back as a file.
// For a sweep, --run N picks run N of `mxlab plan`.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lab/cli/commands.h"
#include "lab/cli/option_checks.h"
#include "lab/core/error.h"
#include "lab/config/config_io.h"
#include "lab/config/sweep.h"

namespace mxlab::cli {
namespace {

// Help lists commands by this order (run, plan, ... first; inspection tools last).
constexpr int kOrder = 90;

struct Args {
  std::string path;
  std::vector<std::string> sets;
  bool id_only = false;
  int run = -1;
};

const Registrar kRegister(kOrder, [](CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("dump-config", "Print the fully defaulted configuration (of EXP.yaml, or the defaults)");
  sub->add_option("config", args->path, "experiment YAML file (omit for the built-in defaults)");
  sub->add_option("--set", args->sets, "override a key, e.g. --set model.width=256 (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--run", args->run, "for a sweep: the index of the run to print (see `mxlab plan`)")
      ->check(integer_in(0));
  sub->add_flag("--id", args->id_only, "print only the run id (hash of the fields that change results)");
  sub->callback([args] {
    RunConfig cfg;
    if (args->path.empty()) {
      cfg = config_from_yaml_string("", "defaults", args->sets);
    } else if (args->run < 0) {
      cfg = load_config(args->path, args->sets);
    } else {
      cfg = run_of_experiment(args->path, args->sets, args->run);
    }
    const std::string out = args->id_only ? config_hash(cfg) + "\n" : dump_config(cfg);
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
});

}  // namespace
}  // namespace mxlab::cli
