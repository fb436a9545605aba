// Loss-trajectory summary (see summary.h for the definitions).
#include "lab/train/summary.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mxlab {

namespace {
constexpr int kSpikeRollingWindow = 8;      // mxnorm appendix J: rolling minimum over 8 steps
constexpr double kSpikeTailFraction = 0.3;  // sigma from the last 30 % of steps
constexpr double kSpikeSigmas = 3.0;
}  // namespace

LossSummary summarize_losses(const std::vector<float>& loss, int64_t first_step, double divergence_factor,
                             double spike_factor) {
  LossSummary s;
  const int64_t n = static_cast<int64_t>(loss.size());
  s.steps_run = n;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  s.final_loss = nan;
  s.min_loss = nan;
  const double inf = std::numeric_limits<double>::infinity();
  auto value = [&](int64_t t) { return std::isfinite(loss[t]) ? static_cast<double>(loss[t]) : inf; };

  for (int64_t t = 0; t < n; ++t) {
    if (!std::isfinite(loss[t])) {
      if (s.first_nonfinite_step < 0) s.first_nonfinite_step = first_step + t;
      continue;
    }
    s.final_loss = loss[t];
    if (std::isnan(s.min_loss) || loss[t] < s.min_loss) s.min_loss = loss[t];
  }
  // Spikes: a finite or non-finite jump by more than spike_factor over the previous finite step.
  for (int64_t t = 1; t < n; ++t) {
    if (!std::isfinite(loss[t - 1])) continue;
    if (value(t) > spike_factor * static_cast<double>(loss[t - 1])) ++s.spike_count;
  }
  // Divergence: suffix minimum (non-finite = +inf) against the prefix minimum before t.
  if (n >= 2) {
    std::vector<double> suffix_min(n + 1, inf);
    for (int64_t t = n - 1; t >= 0; --t) suffix_min[t] = std::min(suffix_min[t + 1], value(t));
    double prefix_min = value(0);
    for (int64_t t = 1; t < n; ++t) {
      if (std::isfinite(prefix_min) && suffix_min[t] > divergence_factor * prefix_min) {
        s.divergence_step = first_step + t;
        break;
      }
      prefix_min = std::min(prefix_min, value(t));
    }
  }
  // Spike score.
  std::vector<double> tail;
  const int64_t tail_begin = n - static_cast<int64_t>(std::ceil(kSpikeTailFraction * static_cast<double>(n)));
  for (int64_t t = std::max<int64_t>(0, tail_begin); t < n; ++t)
    if (std::isfinite(loss[t])) tail.push_back(loss[t]);
  if (tail.size() >= 2) {
    double mean = 0.0;
    for (double v : tail) mean += v;
    mean /= static_cast<double>(tail.size());
    double var = 0.0;
    for (double v : tail) var += (v - mean) * (v - mean);
    const double sigma = std::sqrt(var / static_cast<double>(tail.size()));
    if (sigma > 0.0) {
      for (int64_t t = 0; t < n; ++t) {
        if (!std::isfinite(loss[t])) continue;
        double m = loss[t];
        for (int64_t j = std::max<int64_t>(0, t - kSpikeRollingWindow + 1); j <= t; ++j)
          if (std::isfinite(loss[j])) m = std::min(m, static_cast<double>(loss[j]));
        s.spike_score += std::max((loss[t] - m) / sigma - kSpikeSigmas, 0.0);
      }
    }
  }
  return s;
}

}  // namespace mxlab
