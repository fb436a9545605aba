// Loss-trajectory events (see loss_events.h for the definitions).
#include "lab/stats/loss_events.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lab/core/error.h"
#include "lab/stats/stats.h"

namespace mxlab {

namespace {
constexpr int kSpikeRollingWindow = 8;      // mxnorm appendix J: rolling minimum over 8 steps
constexpr double kSpikeTailFraction = 0.3;  // sigma from the last 30 % of steps
constexpr double kSpikeSigmas = 3.0;
const double kInf = std::numeric_limits<double>::infinity();

// A loss as the event rules read it: non-finite counts as +inf ("above").
double event_value(float x) { return std::isfinite(x) ? static_cast<double>(x) : kInf; }
}  // namespace

std::string excursion_rule_problem(const ExcursionRule& r) {
  if (r.block < 1) return msg("excursion block ", r.block, " must be at least 1 step (e.g. --excursion-block 100)");
  if (r.window < r.block || r.window % r.block != 0)
    return msg("excursion window ", r.window, " must be a positive multiple of the block ", r.block, " (e.g. ",
               r.block * std::max<int64_t>(1, (r.window + r.block - 1) / r.block), ")");
  if (!(r.factor > 0) || !std::isfinite(r.factor))
    return msg("excursion factor ", r.factor, " must be a finite number > 0 (e.g. 10)");
  return "";
}

namespace {

// The block minima the excursion rule reads (+inf for a block without a finite loss); a history
// that ends non-finite stays so: its partial block and window/block more blocks are +inf.
std::vector<double> block_minima(const std::vector<float>& loss, const ExcursionRule& r) {
  const int64_t n = static_cast<int64_t>(loss.size());
  const bool absorbing = n > 0 && !std::isfinite(loss.back());
  const int64_t n_blocks = absorbing ? (n + r.block - 1) / r.block + r.window / r.block : n / r.block;
  std::vector<double> mins(static_cast<size_t>(n_blocks), kInf);
  for (int64_t b = 0; b < n_blocks; ++b)
    for (int64_t t = b * r.block; t < std::min(n, (b + 1) * r.block); ++t)
      mins[static_cast<size_t>(b)] = std::min(mins[static_cast<size_t>(b)], event_value(loss[static_cast<size_t>(t)]));
  return mins;
}

// The first block b >= 1 with b*block >= from_offset and b*block < until_offset whose
// window/block blocks from b each have a minimum above factor x the minimum of all blocks
// before b; -1 when there is none.
int64_t excursion_block(const std::vector<double>& mins, const ExcursionRule& r, int64_t from_offset,
                        int64_t until_offset) {
  const int64_t run = r.window / r.block, n_blocks = static_cast<int64_t>(mins.size());
  double before = kInf;  // minimum of blocks 0 .. b-1
  for (int64_t b = 0; b + run <= n_blocks && b * r.block < until_offset; ++b) {
    if (b >= 1 && b * r.block >= from_offset) {
      bool above = true;
      for (int64_t j = b; j < b + run && above; ++j) above = mins[static_cast<size_t>(j)] > r.factor * before;
      if (above) return b;
    }
    before = std::min(before, mins[static_cast<size_t>(b)]);
  }
  return -1;
}

void check_rule(const ExcursionRule& r) {
  const std::string problem = excursion_rule_problem(r);
  if (!problem.empty()) throw Error(problem);
}

}  // namespace

Excursion excursion(const std::vector<float>& loss, int64_t first_step, const ExcursionRule& r) {
  check_rule(r);
  const int64_t n = static_cast<int64_t>(loss.size());
  const int64_t b = excursion_block(block_minima(loss, r), r, 0, std::numeric_limits<int64_t>::max());
  if (b >= 0) return {true, first_step + b * r.block};
  return {false, first_step + std::max<int64_t>(n - r.window, 0)};
}

Excursion excursion_between(const std::vector<float>& loss, int64_t first_step, int64_t from, int64_t until,
                            const ExcursionRule& r) {
  check_rule(r);
  const int64_t n = static_cast<int64_t>(loss.size());
  const bool absorbing = n > 0 && !std::isfinite(loss.back());
  const int64_t end = std::max(from, absorbing ? until : std::min(until, first_step + n - r.window));
  const int64_t b = excursion_block(block_minima(loss, r), r, from - first_step, end - first_step);
  if (b >= 0) return {true, first_step + b * r.block};
  return {false, end};
}

BranchEndpoint branch_endpoint(const std::vector<float>& parent, const std::vector<float>& branch, int64_t at,
                               int64_t end, const ExcursionRule& r) {
  check_rule(r);
  if (at < 0 || static_cast<int64_t>(parent.size()) < at)
    throw Error(msg("the parent trajectory holds ", parent.size(), " losses, fewer than the branch's step ", at,
                    ": it stopped before the branch started (no endpoint)"));
  std::vector<float> joined(parent.begin(), parent.begin() + at);
  joined.insert(joined.end(), branch.begin(), branch.end());
  BranchEndpoint e;
  // The window the branch's series can show: [at, E).
  const bool absorbing = !branch.empty() && !std::isfinite(branch.back());
  e.window_end = std::max(at, absorbing ? end - r.window
                                        : std::min(end, at + static_cast<int64_t>(branch.size())) - r.window);
  e.branch = excursion_between(joined, 0, at, e.window_end, r);
  e.control = excursion_between(parent, 0, at, e.window_end, r);
  const Excursion whole = excursion(parent, 0, r);
  e.at_risk = !(whole.event && whole.step < at);
  return e;
}

double tail_log_ratio(const std::vector<float>& arm, int64_t first_arm, const std::vector<float>& ref,
                      int64_t first_ref, int64_t last) {
  const int64_t na = static_cast<int64_t>(arm.size()), nr = static_cast<int64_t>(ref.size());
  const bool arm_abs = na > 0 && !std::isfinite(arm.back()), ref_abs = nr > 0 && !std::isfinite(ref.back());
  const int64_t arm_end = first_arm + na, ref_end = first_ref + nr;
  int64_t end = 0;
  if (arm_abs && ref_abs) end = std::max(arm_end, ref_end);
  else if (arm_abs) end = ref_end;
  else if (ref_abs) end = arm_end;
  else end = std::min(arm_end, ref_end);
  const int64_t begin = std::max({first_arm, first_ref, end - last});
  auto at = [](const std::vector<float>& v, int64_t first, int64_t step) {
    const int64_t i = step - first;
    return i < static_cast<int64_t>(v.size()) ? event_value(v[static_cast<size_t>(i)]) : kInf;
  };
  std::vector<double> ratios;
  for (int64_t step = begin; step < end; ++step) {
    const double a = at(arm, first_arm, step), b = at(ref, first_ref, step);
    if (a == kInf && b == kInf) ratios.push_back(0.0);
    else if (a == kInf) ratios.push_back(kInf);
    else if (b == kInf) ratios.push_back(-kInf);
    else ratios.push_back(std::log(a / b));
  }
  return median(std::move(ratios));
}

LossSummary summarize_losses(const std::vector<float>& loss, int64_t first_step, double divergence_factor,
                             double spike_factor, const ExcursionRule& excursion_rule) {
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
    if (value(t) > spike_factor * static_cast<double>(loss[t - 1])) {
      if (s.first_spike_step < 0) s.first_spike_step = first_step + t;
      ++s.spike_count;
    }
  }
  s.excursion = excursion(loss, first_step, excursion_rule);
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
