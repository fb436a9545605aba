// Statistics of seed studies: Wilson intervals, Fisher's exact test, Kaplan-Meier and the
// log-rank test (formulas and references in lab/report/README.md, "mxlab summarize DIR --by").
#include "lab/stats/stats.h"

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

namespace {

// splitmix64 (Steele, Lea & Flood 2014): a small generator that Python reproduces exactly.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};

// Every choice of k indices of n, in lexicographic order.
std::vector<std::vector<size_t>> combinations(size_t n, size_t k) {
  std::vector<std::vector<size_t>> out;
  std::vector<size_t> c(k);
  for (size_t i = 0; i < k; ++i) c[i] = i;
  while (true) {
    out.push_back(c);
    size_t i = k;
    while (i > 0 && c[i - 1] == n - k + i - 1) --i;
    if (i == 0) return out;
    ++c[i - 1];
    for (size_t j = i; j < k; ++j) c[j] = c[j - 1] + 1;
  }
}

}  // namespace

PermutationLogRank permutation_log_rank(const std::vector<std::vector<LabelledObs>>& strata, int64_t max_exact,
                                        int64_t draws, uint64_t seed) {
  PermutationLogRank r;
  std::vector<std::vector<double>> options;  // per informative stratum: u of each labeling
  std::vector<size_t> observed;              // the index of the observed labeling
  for (const auto& s : strata) {
    size_t k = 0;
    for (const LabelledObs& o : s) k += o.in_a ? 1 : 0;
    if (k == 0 || k == s.size()) continue;
    std::vector<double> us;
    size_t obs_index = 0;
    double obs_v = 0;
    for (const std::vector<size_t>& c : combinations(s.size(), k)) {
      std::vector<bool> in_a(s.size(), false);
      for (size_t i : c) in_a[i] = true;
      std::vector<SurvivalObs> a, b;
      bool is_observed = true;
      for (size_t i = 0; i < s.size(); ++i) {
        (in_a[i] ? a : b).push_back(s[i].obs);
        is_observed = is_observed && in_a[i] == s[i].in_a;
      }
      const LogRank lr = log_rank(a, b);
      if (is_observed) {
        obs_index = us.size();
        obs_v = lr.variance;
      }
      us.push_back(lr.observed_a - lr.expected_a);
    }
    if (std::all_of(us.begin(), us.end(), [&](double u) { return u == us[0]; })) continue;
    options.push_back(std::move(us));
    observed.push_back(obs_index);
    r.variance += obs_v;
  }
  r.strata = static_cast<int64_t>(options.size());
  if (options.empty()) {
    r.u = 0;
    r.chi2 = r.p_asymptotic = r.p = kNaN;
    return r;
  }
  for (size_t i = 0; i < options.size(); ++i) r.u += options[i][observed[i]];
  r.chi2 = r.variance > 0 ? r.u * r.u / r.variance : kNaN;
  r.p_asymptotic = chi2_1df_sf(r.chi2);
  const double bar = std::fabs(r.u) * (1 - 1e-9);
  // The number of labelings, capped (saturating) just above max_exact.
  int64_t total = 1;
  for (const auto& o : options) {
    const int64_t n = static_cast<int64_t>(o.size());
    total = total > max_exact / n ? max_exact + 1 : total * n;
  }
  int64_t hits = 0;
  if (total <= max_exact) {
    std::vector<size_t> idx(options.size(), 0);
    for (int64_t it = 0; it < total; ++it) {
      double u = 0;
      for (size_t i = 0; i < options.size(); ++i) u += options[i][idx[i]];
      hits += std::fabs(u) >= bar ? 1 : 0;
      for (size_t i = 0; i < options.size(); ++i) {  // next labeling (mixed radix)
        if (++idx[i] < options[i].size()) break;
        idx[i] = 0;
      }
    }
    r.exact = true;
    r.labelings = total;
    r.p = static_cast<double>(hits) / static_cast<double>(total);
  } else {
    MXLAB_ASSERT(draws > 0);
    SplitMix64 rng{seed};
    for (int64_t it = 0; it < draws; ++it) {
      double u = 0;
      for (const auto& o : options) u += o[static_cast<size_t>(rng.next() % o.size())];
      hits += std::fabs(u) >= bar ? 1 : 0;
    }
    r.labelings = draws;
    r.p = static_cast<double>(1 + hits) / static_cast<double>(1 + draws);
  }
  return r;
}

}  // namespace mxlab
