// Events of the trajectories of a results directory, from their per-step losses.
#include "lab/report/run_events.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string>

#include "lab/core/error.h"
#include "lab/io/h5file.h"
#include "lab/config/config.h"
#include "lab/runs/run_driver.h"

namespace mxlab {

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct History {
  bool present = false;
  int64_t first = 0;
  std::vector<float> loss;
};

// The group's loss_all from its first step (a branch's `at`), cut like the trainer's summary:
// a trajectory stopped at a non-finite loss ends at that loss.
History read_history(const h5::H5File& f, const GroupRecord& g) {
  History h;
  const std::string all = g.h5_path + "/loss_all";
  if (!f.is_dataset(all)) return h;
  h.present = true;
  h.first = g.branch && g.at > 0 ? g.at : 0;
  for (double v : f.read_doubles(all)) h.loss.push_back(static_cast<float>(v));
  const bool stopped =
      f.has_attr(g.h5_path, "state") && f.get_attr_string(g.h5_path, "state") == "stopped_nonfinite";
  while (stopped && h.loss.size() >= 2 && std::isnan(h.loss.back()) && std::isnan(h.loss[h.loss.size() - 2]))
    h.loss.pop_back();
  return h;
}

// log.spike_factor of the run, as the trainer reads it (a float), else the default.
double spike_factor(const RunRecord& r) {
  bool found = false;
  const std::string v = config_value(r, "log.spike_factor", &found);
  char* end = nullptr;
  const float f = found ? std::strtof(v.c_str(), &end) : 0.0f;
  return found && end != v.c_str() && *end == '\0' ? static_cast<double>(f)
                                                  : static_cast<double>(LogConfig{}.spike_factor);
}

}  // namespace

void read_events(std::vector<RunRecord>& runs, const EventRules& rules) {
  const std::string problem = excursion_rule_problem(rules.excursion);
  if (!problem.empty()) throw Error(problem);
  if (rules.tail_steps < 1) throw Error(msg("tail_log_ratio steps ", rules.tail_steps, " must be at least 1"));
  for (RunRecord& r : runs) {
    if (!r.readable) continue;
    const double spikes = spike_factor(r);
    try {
      std::lock_guard<std::mutex> lock(hdf5_mutex());
      h5::H5File f(r.path, h5::H5File::Mode::read);
      History ref;
      std::map<std::string, History> trajectories;  // by name: a branch's parent is one of them
      for (const GroupRecord& g : r.groups)
        if (!g.branch) trajectories[g.name] = read_history(f, g);
      if (trajectories.count("fp32")) ref = trajectories["fp32"];
      for (GroupRecord& g : r.groups) {
        const History h = g.branch ? read_history(f, g) : trajectories[g.name];
        g.has_events = h.present;
        g.has_endpoint = false;
        if (!h.present) continue;
        if (g.branch) {
          const auto parent = trajectories.find(g.parent);
          // The step the branch was to stop at: its end_step (`steps`), else the run's end.
          const int64_t end = f.has_attr(g.h5_path, "end_step") ? f.get_attr_int64(g.h5_path, "end_step") : r.steps;
          if (parent != trajectories.end() && parent->second.present && h.first == g.at &&
              static_cast<int64_t>(parent->second.loss.size()) >= g.at) {
            g.endpoint = branch_endpoint(parent->second.loss, h.loss, g.at, end, rules.excursion);
            g.has_endpoint = true;
          }
        }
        const LossSummary s = summarize_losses(h.loss, h.first, LogConfig{}.divergence_factor, spikes, rules.excursion);
        g.excursion = s.excursion.event;
        g.excursion_step = s.excursion.step;
        g.first_spike_step = s.first_spike_step;
        const bool is_ref = !g.branch && g.name == "fp32";
        g.tail_log_ratio = is_ref || !ref.present ? kNaN : tail_log_ratio(h.loss, h.first, ref.loss, ref.first, rules.tail_steps);
      }
    } catch (const std::exception&) {
      for (GroupRecord& g : r.groups) g.has_events = g.has_endpoint = false;
    }
  }
}

}  // namespace mxlab
