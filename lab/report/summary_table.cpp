// The table of `mxlab summarize DIR`: one row per trajectory and branch of every run.
#include "lab/report/summary_table.h"

#include <algorithm>
#include <filesystem>

#include "lab/core/text_table.h"
#include "lab/runs/run_status.h"
#include "lab/io/table_text.h"

namespace mxlab {

std::string summary_table(const std::vector<RunRecord>& runs, bool csv) {
  std::vector<std::string> swept = swept_keys(runs);
  // The CSV always names each row's seed, the key a paired analysis joins on, also when the
  // directory holds one run or one seed (then `seed` is not a swept key).
  if (csv && std::find(swept.begin(), swept.end(), "seed") == swept.end()) swept.insert(swept.begin(), "seed");
  std::vector<std::string> header = {"run_id", "group", "at"};
  header.insert(header.end(), swept.begin(), swept.end());
  for (const char* c : {"status", "excursion_step", "excursion_censored_at", "first_spike_step", "tail_log_ratio",
                        "parent", "at_risk", "branch_excursion_step", "branch_censored_at", "control_excursion_step",
                        "control_censored_at", "diverged_to_end_step", "first_nonfinite_step", "spike_count", "spike_score", "final_loss",
                        "min_loss", "max_bias_ratio", "max_gamma_lastbin", "steps_run", "source", "file", "error"})
    header.push_back(c);
  const TableCell cell{csv};
  std::vector<std::vector<std::string>> rows = {header};
  for (const RunRecord& r : runs) {
    auto base = [&](const GroupRecord* g) {
      std::vector<std::string> row = {r.run_id, g ? g->name : cell.none(),
                                      g && g->branch && g->at >= 0 ? std::to_string(g->at) : cell.none()};
      for (const auto& k : swept) {
        bool found = false;
        const std::string v = config_value(r, k, &found);
        row.push_back(found ? format_config_value(v) : cell.none());
      }
      row.push_back(cell.text(to_string(r.status)));
      return row;
    };
    const std::string file = csv ? r.path : std::filesystem::path(r.path).filename().string();
    if (r.groups.empty()) {
      std::vector<std::string> row = base(nullptr);
      for (int i = 0; i < 20; ++i) row.push_back(cell.none());
      row.push_back(file);
      row.push_back(cell.text(r.error));
      rows.push_back(row);
      continue;
    }
    for (const GroupRecord& g : r.groups) {
      std::vector<std::string> row = base(&g);
      // Events: empty (text "-") when unknown (no per-step losses); -1 for "no such step".
      auto event_step = [&](int64_t s) { return g.has_events ? cell.step(s) : cell.none(); };
      row.push_back(event_step(g.excursion ? g.excursion_step : -1));
      row.push_back(event_step(g.excursion ? -1 : g.excursion_step));
      row.push_back(event_step(g.first_spike_step));
      row.push_back(g.has_events ? cell.num(g.tail_log_ratio) : cell.none());
      // Branches: the endpoint against the parent (empty for trajectories, or when unknown).
      row.push_back(g.branch ? cell.text(g.parent) : cell.none());
      const BranchEndpoint& e = g.endpoint;
      auto endpoint_step = [&](int64_t s) { return g.has_endpoint ? cell.step(s) : cell.none(); };
      row.push_back(g.has_endpoint ? std::string(e.at_risk ? "1" : "0") : cell.none());
      row.push_back(endpoint_step(e.branch.event ? e.branch.step : -1));
      row.push_back(endpoint_step(e.branch.event ? -1 : e.branch.step));
      row.push_back(endpoint_step(e.control.event ? e.control.step : -1));
      row.push_back(endpoint_step(e.control.event ? -1 : e.control.step));
      row.push_back(cell.step(g.divergence_step));
      row.push_back(cell.step(g.first_nonfinite_step));
      row.push_back(std::to_string(g.spike_count));
      row.push_back(cell.num(g.spike_score));
      row.push_back(cell.num(g.final_loss));
      row.push_back(cell.num(g.min_loss));
      row.push_back(cell.num(g.max_bias_ratio));
      row.push_back(cell.num(g.max_gamma_lastbin));
      row.push_back(std::to_string(g.steps_run));
      row.push_back(g.source);
      row.push_back(file);
      row.push_back(cell.text(r.error));
      rows.push_back(row);
    }
  }
  if (!csv) return aligned_table(rows);
  std::string out;
  for (const auto& row : rows) out += csv_line(row);
  return out;
}

}  // namespace mxlab
