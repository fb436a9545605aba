// MemorySink helpers (tests).
#include <limits>

#include "lab/train/sink.h"

namespace mxlab {

std::vector<double> MemorySink::series(const std::string& group, const std::string& metric, size_t col,
                                       const std::string& axis) const {
  std::vector<double> out;
  auto it = groups.find(group);
  if (it == groups.end()) return out;
  for (const MetricRow& r : it->second.rows) {
    if (r.axis != axis) continue;
    double v = std::numeric_limits<double>::quiet_NaN();
    for (const auto& [name, vals] : r.cols)
      if (name == metric && col < vals.size()) v = vals[col];
    out.push_back(v);
  }
  return out;
}

}  // namespace mxlab
