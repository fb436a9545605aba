// Statistics of seed studies: Wilson intervals, Fisher's exact test, Kaplan-Meier and the
// log-rank test (formulas and references in lab/train/README.md).
#include "lab/train/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lab/core/error.h"

namespace mxlab {

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
// Tables whose probability is within this relative distance of the observed table's count as
// equally probable (R's fisher.test uses the same 1e-7).
constexpr double kFisherRelTol = 1e-7;
// S(t) <= 0.5 up to this, for the median survival time.
constexpr double kMedianTol = 1e-12;

// log C(n, k)
double log_choose(int64_t n, int64_t k) {
  return std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(k) + 1) -
         std::lgamma(static_cast<double>(n - k) + 1);
}

// Number of observations with time >= t (at risk at t) and of events at t, for observations
// sorted by time.
void risk_at(const std::vector<SurvivalObs>& sorted, int64_t t, int64_t* at_risk, int64_t* events) {
  const auto first = std::lower_bound(sorted.begin(), sorted.end(), t,
                                      [](const SurvivalObs& o, int64_t v) { return o.time < v; });
  *at_risk = static_cast<int64_t>(sorted.end() - first);
  *events = 0;
  for (auto it = first; it != sorted.end() && it->time == t; ++it) *events += it->event ? 1 : 0;
}

std::vector<SurvivalObs> sorted_by_time(std::vector<SurvivalObs> obs) {
  std::stable_sort(obs.begin(), obs.end(), [](const SurvivalObs& x, const SurvivalObs& y) { return x.time < y.time; });
  return obs;
}

// The distinct times with an event, ascending.
std::vector<int64_t> event_times(const std::vector<SurvivalObs>& obs) {
  std::vector<int64_t> t;
  for (const auto& o : obs)
    if (o.event) t.push_back(o.time);
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

}  // namespace

Interval wilson_interval(int64_t k, int64_t n, double z) {
  MXLAB_ASSERT(k >= 0 && k <= n, "k = ", k, ", n = ", n);
  if (n == 0) return {kNaN, kNaN};
  const double nd = static_cast<double>(n), p = static_cast<double>(k) / nd, z2 = z * z;
  const double centre = (p + z2 / (2 * nd)) / (1 + z2 / nd);
  const double half = z / (1 + z2 / nd) * std::sqrt(p * (1 - p) / nd + z2 / (4 * nd * nd));
  // At k = 0 (k = n) the bound is 0 (1) exactly; computed, it would be off by rounding.
  return {k == 0 ? 0.0 : std::max(0.0, centre - half), k == n ? 1.0 : std::min(1.0, centre + half)};
}

double fisher_exact_two_sided(int64_t a, int64_t b, int64_t c, int64_t d) {
  MXLAB_ASSERT(a >= 0 && b >= 0 && c >= 0 && d >= 0);
  const int64_t n1 = a + b, n2 = c + d, k = a + c;
  // P(X = x) of the first cell given the margins is C(n1, x) C(n2, k - x) / C(n, k). Summed
  // relative to the largest term and divided by the sum over every table, so that p is exactly
  // 1 when every table counts and no term underflows.
  auto log_w = [&](int64_t x) { return log_choose(n1, x) + log_choose(n2, k - x); };
  const int64_t lo = std::max<int64_t>(0, k - n2), hi = std::min(k, n1);
  double top = -std::numeric_limits<double>::infinity();
  for (int64_t x = lo; x <= hi; ++x) top = std::max(top, log_w(x));
  const double observed = log_w(a);
  double selected = 0, total = 0;
  for (int64_t x = lo; x <= hi; ++x) {
    const double lw = log_w(x), w = std::exp(lw - top);
    total += w;
    if (lw <= observed + std::log1p(kFisherRelTol)) selected += w;
  }
  return std::min(1.0, selected / total);
}

double mcnemar_exact(int64_t b, int64_t c) {
  MXLAB_ASSERT(b >= 0 && c >= 0);
  const int64_t n = b + c;
  if (n == 0) return 1.0;
  double tail = 0;
  for (int64_t i = 0; i <= std::min(b, c); ++i) tail += std::exp(log_choose(n, i) - static_cast<double>(n) * std::log(2.0));
  return std::min(1.0, 2 * tail);
}

double chi2_1df_sf(double x) {
  if (std::isnan(x)) return kNaN;
  return x <= 0 ? 1.0 : std::erfc(std::sqrt(x / 2));
}

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] == v[m] ? v[m] : (v[m - 1] + v[m]) / 2);
}

KaplanMeier kaplan_meier(const std::vector<SurvivalObs>& obs, double z) {
  KaplanMeier km;
  km.n = static_cast<int64_t>(obs.size());
  if (obs.empty()) {
    km.survival_end = kNaN;
    km.survival_end_ci = {kNaN, kNaN};
    return km;
  }
  const std::vector<SurvivalObs> sorted = sorted_by_time(obs);
  km.end_time = sorted.back().time;
  double s = 1.0, greenwood = 0.0;  // greenwood: sum d / (n (n - d))
  for (int64_t t : event_times(sorted)) {
    int64_t at_risk = 0, events = 0;
    risk_at(sorted, t, &at_risk, &events);
    s *= 1.0 - static_cast<double>(events) / static_cast<double>(at_risk);
    if (at_risk > events)
      greenwood += static_cast<double>(events) / (static_cast<double>(at_risk) * static_cast<double>(at_risk - events));
    km.steps.push_back({t, at_risk, events, s});
    if (km.median_time < 0 && s <= 0.5 + kMedianTol) km.median_time = t;
  }
  km.survival_end = s;
  if (s <= 0.0 || s >= 1.0 || greenwood == 0.0) {
    km.survival_end_ci = {s, s};
  } else {
    const double sigma = std::sqrt(greenwood) / std::fabs(std::log(s));  // sd of log(-log S)
    km.survival_end_ci = {std::pow(s, std::exp(z * sigma)), std::pow(s, std::exp(-z * sigma))};
  }
  return km;
}

LogRank log_rank(const std::vector<SurvivalObs>& a, const std::vector<SurvivalObs>& b) {
  const std::vector<SurvivalObs> sa = sorted_by_time(a), sb = sorted_by_time(b);
  std::vector<SurvivalObs> both = sa;
  both.insert(both.end(), sb.begin(), sb.end());
  LogRank r;
  for (int64_t t : event_times(both)) {
    int64_t na = 0, da = 0, nb = 0, db = 0;
    risk_at(sa, t, &na, &da);
    risk_at(sb, t, &nb, &db);
    const double n = static_cast<double>(na + nb), d = static_cast<double>(da + db), fa = static_cast<double>(na) / n;
    r.observed_a += static_cast<double>(da);
    r.expected_a += d * fa;
    if (n > 1) r.variance += d * fa * (1 - fa) * (n - d) / (n - 1);
  }
  if (r.variance > 0) {
    const double diff = r.observed_a - r.expected_a;
    r.chi2 = diff * diff / r.variance;
    r.p = chi2_1df_sf(r.chi2);
  } else {
    r.chi2 = r.p = kNaN;
  }
  return r;
}

}  // namespace mxlab
