// The statistics of `mxlab summarize --by` (lab/stats/stats.h) against values worked out by
// hand (in the comments) and, for a larger censored sample, against scipy 1.17.1
// (scipy.stats.ecdf / CensoredData / logrank / fisher_exact / binomtest(...).proportion_ci
// (method='wilson'), computed once in a throwaway venv; scipy is not needed to run this test)
// and against a second, deliberately naive implementation in this file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "lab/stats/stats.h"

using namespace mxlab;

namespace {

constexpr double kTight = 1e-9;  // the formulas are closed-form: only rounding separates them

// Observations written as {time, 1 = event / 0 = censored}.
std::vector<SurvivalObs> obs(std::initializer_list<std::pair<int64_t, int>> list) {
  std::vector<SurvivalObs> v;
  for (const auto& [t, e] : list) v.push_back({t, e != 0});
  return v;
}

// Exponential times to event (rate per step), censored at `horizon`: a 64-bit LCG (Knuth's
// MMIX constants) so that the same sample is easy to rebuild in Python for the scipy values:
//   s = (s * 6364136223846793005 + 1442695040888963407) % 2**64; u = (s >> 11) / 2**53
//   t = int(-log(1 - u) / rate); (t, event) = (t, 1) if t < horizon else (horizon, 0)
std::vector<SurvivalObs> exponential_sample(uint64_t seed, int n, int64_t horizon, double rate) {
  std::vector<SurvivalObs> v;
  uint64_t s = seed;
  for (int i = 0; i < n; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const double u = static_cast<double>(s >> 11) / 9007199254740992.0;  // 2^53
    const auto t = static_cast<int64_t>(-std::log(1 - u) / rate);
    v.push_back(t < horizon ? SurvivalObs{t, true} : SurvivalObs{horizon, false});
  }
  return v;
}

// Naive Kaplan-Meier: for a time t, S(t) is the product over every event time u <= t of
// (1 - events at u / observations with time >= u), each count a full pass over the data.
double naive_survival(const std::vector<SurvivalObs>& v, int64_t t) {
  double s = 1;
  for (int64_t u = 0; u <= t; ++u) {
    int64_t d = 0, n = 0;
    for (const auto& o : v) {
      n += o.time >= u;
      d += o.time == u && o.event;
    }
    if (d) s *= 1.0 - static_cast<double>(d) / static_cast<double>(n);
  }
  return s;
}

// Naive log-rank: every step u up to the last time, counts by full passes.
double naive_log_rank_chi2(const std::vector<SurvivalObs>& a, const std::vector<SurvivalObs>& b, int64_t last) {
  double o = 0, e = 0, v = 0;
  for (int64_t u = 0; u <= last; ++u) {
    double na = 0, nb = 0, da = 0, db = 0;
    for (const auto& x : a) {
      na += x.time >= u;
      da += x.time == u && x.event;
    }
    for (const auto& x : b) {
      nb += x.time >= u;
      db += x.time == u && x.event;
    }
    const double n = na + nb, d = da + db;
    if (d == 0) continue;
    o += da;
    e += d * na / n;
    if (n > 1) v += d * (na / n) * (nb / n) * (n - d) / (n - 1);
  }
  return (o - e) * (o - e) / v;
}

}  // namespace

TEST(Stats, WilsonIntervalHandWorked) {
  // p = k/n, z = 1.959963984540054 (z^2 = 3.8414588206941254):
  // centre = (p + z^2/2n) / (1 + z^2/n), half = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2).
  // k=0, n=5: centre = 0.38414588/1.76829176 = 0.21724123, half the same: [0, 0.43448246].
  Interval w = wilson_interval(0, 5);
  EXPECT_EQ(w.lo, 0.0);
  EXPECT_NEAR(w.hi, 0.4344824648, 1e-10);
  // k=3, n=5: centre = (0.6 + 0.38414588)/1.76829176 = 0.55655175,
  // half = 1.10839378 * sqrt(0.048 + 0.03841459) = 1.10839378 * 0.29396359 = 0.32582747.
  w = wilson_interval(3, 5);
  EXPECT_NEAR(w.lo, 0.2307242813, 1e-10);
  EXPECT_NEAR(w.hi, 0.8823792258, 1e-10);
  // k=n=20: the lower bound is n / (n + z^2) = 20 / 23.84145882 = 0.83887484; the upper is 1.
  w = wilson_interval(20, 20);
  EXPECT_NEAR(w.lo, 20.0 / (20.0 + kZ95 * kZ95), 1e-15);
  EXPECT_NEAR(w.lo, 0.8388748419, 1e-10);
  EXPECT_EQ(w.hi, 1.0);
  // Two more, from scipy's binomtest(k, n).proportion_ci(method='wilson').
  w = wilson_interval(1, 10);
  EXPECT_NEAR(w.lo, 0.0178762131, 1e-10);
  EXPECT_NEAR(w.hi, 0.4041500268, 1e-10);
  w = wilson_interval(7, 32);
  EXPECT_NEAR(w.lo, 0.1102383625, 1e-10);
  EXPECT_NEAR(w.hi, 0.3875499365, 1e-10);
  // Symmetry: the interval of k/n mirrors the one of (n-k)/n.
  const Interval a = wilson_interval(2, 7), b = wilson_interval(5, 7);
  EXPECT_NEAR(a.lo, 1 - b.hi, 1e-15);
  EXPECT_NEAR(a.hi, 1 - b.lo, 1e-15);
  w = wilson_interval(0, 0);
  EXPECT_TRUE(std::isnan(w.lo) && std::isnan(w.hi));
}

TEST(Stats, McNemarExactHandWorked) {
  // No discordant pair: no evidence either way.
  EXPECT_EQ(mcnemar_exact(0, 0), 1.0);
  // 8 / 0: 2 * (1/2)^8.
  EXPECT_NEAR(mcnemar_exact(8, 0), 2.0 / 256, kTight);
  EXPECT_NEAR(mcnemar_exact(0, 8), 2.0 / 256, kTight);
  // 7 / 2: 2 * (C(9,0) + C(9,1) + C(9,2)) / 2^9 = 2 * 46 / 512.
  EXPECT_NEAR(mcnemar_exact(7, 2), 92.0 / 512, kTight);
  // 1 / 1: 2 * 3/4 > 1: capped.
  EXPECT_EQ(mcnemar_exact(1, 1), 1.0);
  // Larger counts, exact rational arithmetic (Python fractions): 2 * sum C(n, i) / 2^n.
  EXPECT_NEAR(mcnemar_exact(60, 40), 0.05688793364098079, 1e-12);
  EXPECT_NEAR(mcnemar_exact(300, 250), 0.036578745549102704, 1e-11);
}

TEST(Stats, FisherExactHandWorked) {
  // 0/5 vs 3/5: margins 5, 5 and 3 events of 10; P(x events in the first row) =
  // C(5,x) C(5,3-x) / C(10,3) = 10, 50, 50, 10 (/120) for x = 0..3. Observed x = 0 (10/120);
  // no more probable: x = 0 and x = 3 (equal in exact arithmetic): p = 20/120 = 1/6.
  EXPECT_NEAR(fisher_exact_two_sided(0, 5, 3, 2), 1.0 / 6, kTight);
  EXPECT_NEAR(fisher_exact_two_sided(3, 2, 0, 5), 1.0 / 6, kTight);  // rows swapped
  EXPECT_NEAR(fisher_exact_two_sided(5, 0, 2, 3), 1.0 / 6, kTight);  // columns swapped
  // Fisher's lady tasting tea, [[3,1],[1,3]]: C(4,x) C(4,4-x) / 70 = 1, 16, 36, 16, 1 (/70);
  // observed 16/70: p = (1 + 16 + 16 + 1)/70 = 34/70.
  EXPECT_NEAR(fisher_exact_two_sided(3, 1, 1, 3), 34.0 / 70, kTight);
  // 0/5 vs 5/5: C(5,x) C(5,5-x) / C(10,5): x = 0 and x = 5 are 1/252 each: p = 2/252.
  EXPECT_NEAR(fisher_exact_two_sided(0, 5, 5, 0), 2.0 / 252, kTight);
  // Equal counts: every table is at most as probable as the most probable one: p = 1.
  EXPECT_DOUBLE_EQ(fisher_exact_two_sided(3, 2, 3, 2), 1.0);
  // Asymmetric tables, from scipy.stats.fisher_exact (two-sided).
  EXPECT_NEAR(fisher_exact_two_sided(1, 9, 11, 3), 0.00275945618522, 1e-13);
  EXPECT_NEAR(fisher_exact_two_sided(7, 25, 0, 32), 0.0108363434287, 1e-13);
  EXPECT_NEAR(fisher_exact_two_sided(12, 8, 3, 17), 0.00791169367365, 1e-13);
  // A zero margin: only one table is possible.
  EXPECT_DOUBLE_EQ(fisher_exact_two_sided(0, 5, 0, 5), 1.0);
}

TEST(Stats, ChiSquareOneDfAndMedian) {
  EXPECT_NEAR(chi2_1df_sf(kZ95 * kZ95), 0.05, 1e-15);  // z^2 is the 95 % point
  EXPECT_NEAR(chi2_1df_sf(1.0), 0.3173105078629141, 1e-15);  // P(|Z| >= 1)
  EXPECT_EQ(chi2_1df_sf(0.0), 1.0);
  EXPECT_TRUE(std::isnan(median({})));
  EXPECT_EQ(median({3}), 3);
  EXPECT_EQ(median({9, 1, 4}), 4);
  EXPECT_EQ(median({9, 1, 4, 2}), 3);
  EXPECT_EQ(median({1, INFINITY, INFINITY}), INFINITY);
}

TEST(Stats, KaplanMeierHandWorked) {
  // Times 2, 3+, 4, 4, 5+, 7, 9+ (+ = censored), n = 7.
  //   t=2: 7 at risk, 1 event:  S = 6/7             Greenwood term 1/(7*6)  = 1/42
  //   t=4: 5 at risk, 2 events: S = 6/7 * 3/5 = 18/35       2/(5*3)  = 2/15
  //   t=7: 2 at risk, 1 event:  S = 18/35 * 1/2 = 9/35      1/(2*1)  = 1/2
  // Median: S(4) = 0.514 > 0.5, S(7) = 0.257: 7. End: t = 9, S = 9/35 = 0.25714.
  // Greenwood sum 138/210; sd of log(-log S) = sqrt(138/210) / |ln(9/35)| = 0.81064 / 1.35812
  // = 0.59689; interval S^exp(+-1.96 * 0.59689) = S^3.22157, S^0.31041 = [0.012584, 0.65602]
  // (scipy ecdf(...).sf.confidence_interval(method='log-log'): 0.0125842620705, 0.656015963204).
  const KaplanMeier km = kaplan_meier(obs({{2, 1}, {3, 0}, {4, 1}, {4, 1}, {5, 0}, {7, 1}, {9, 0}}));
  ASSERT_EQ(km.steps.size(), 3u);
  EXPECT_EQ(km.steps[0].time, 2);
  EXPECT_EQ(km.steps[1].time, 4);
  EXPECT_EQ(km.steps[1].at_risk, 5);
  EXPECT_EQ(km.steps[1].events, 2);
  EXPECT_NEAR(km.steps[0].survival, 6.0 / 7, kTight);
  EXPECT_NEAR(km.steps[1].survival, 18.0 / 35, kTight);
  EXPECT_NEAR(km.steps[2].survival, 9.0 / 35, kTight);
  EXPECT_EQ(km.n, 7);
  EXPECT_EQ(km.end_time, 9);
  EXPECT_EQ(km.median_time, 7);
  EXPECT_NEAR(km.survival_end, 9.0 / 35, kTight);
  const double sigma = std::sqrt(138.0 / 210) / std::fabs(std::log(9.0 / 35));
  EXPECT_NEAR(km.survival_end_ci.lo, std::pow(9.0 / 35, std::exp(kZ95 * sigma)), kTight);
  EXPECT_NEAR(km.survival_end_ci.lo, 0.0125842620705, 1e-12);
  EXPECT_NEAR(km.survival_end_ci.hi, 0.656015963204, 1e-12);
}

TEST(Stats, KaplanMeierEdges) {
  // Survival exactly 0.5: 1, 2, 3+, 4+: S = 3/4, then 3/4 * 2/3 = 1/2 at t = 2 (the median).
  KaplanMeier km = kaplan_meier(obs({{1, 1}, {2, 1}, {3, 0}, {4, 0}}));
  EXPECT_EQ(km.median_time, 2);
  EXPECT_NEAR(km.survival_end, 0.5, kTight);
  // No event: S = 1, no median, Greenwood's variance 0: the interval is [1, 1].
  km = kaplan_meier(obs({{10, 0}, {10, 0}, {10, 0}}));
  EXPECT_EQ(km.survival_end, 1.0);
  EXPECT_EQ(km.median_time, -1);
  EXPECT_EQ(km.survival_end_ci.lo, 1.0);
  EXPECT_EQ(km.survival_end_ci.hi, 1.0);
  EXPECT_EQ(km.end_time, 10);
  // Every one an event: S = 2/3, 1/3, 0; median at t = 2; interval [0, 0].
  km = kaplan_meier(obs({{3, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(km.median_time, 2);
  EXPECT_EQ(km.survival_end, 0.0);
  EXPECT_EQ(km.survival_end_ci.lo, 0.0);
  EXPECT_EQ(km.survival_end_ci.hi, 0.0);
  // Censored at an event's time: at risk at it (4 at risk at t = 5, not 3).
  km = kaplan_meier(obs({{5, 1}, {5, 0}, {6, 0}, {7, 1}}));
  EXPECT_EQ(km.steps[0].at_risk, 4);
  EXPECT_NEAR(km.steps[0].survival, 0.75, kTight);
  // Nothing observed.
  km = kaplan_meier({});
  EXPECT_TRUE(std::isnan(km.survival_end));
  EXPECT_EQ(km.end_time, -1);
}

TEST(Stats, LogRankHandWorked) {
  // a: 2, 4+, 6; b: 1, 3, 5. At each event time: (n_a, n_b, d_a, d), E_a = d n_a/n,
  // V = d (n_a/n)(n_b/n)(n-d)/(n-1):
  //   t=1: (3, 3, 0, 1) E 0.5  V 0.25     t=2: (3, 2, 1, 1) E 0.6  V 0.24
  //   t=3: (2, 2, 0, 1) E 0.5  V 0.25     t=5: (1, 1, 0, 1) E 0.5  V 0.25
  //   t=6: (1, 0, 1, 1) E 1    V 0 (n = 1)
  // O_a = 2, E_a = 3.1, V = 0.99: chi2 = 1.21/0.99 = 1.2222, p = erfc(sqrt(0.6111)) = 0.26892
  // (scipy.stats.logrank: statistic^2 = 1.2222222222, p = 0.2689249805116197).
  const LogRank r = log_rank(obs({{2, 1}, {4, 0}, {6, 1}}), obs({{1, 1}, {3, 1}, {5, 1}}));
  EXPECT_NEAR(r.observed_a, 2, kTight);
  EXPECT_NEAR(r.expected_a, 3.1, kTight);
  EXPECT_NEAR(r.variance, 0.99, kTight);
  EXPECT_NEAR(r.chi2, 1.21 / 0.99, kTight);
  EXPECT_NEAR(r.p, 0.2689249805116197, 1e-12);
  // Symmetric in the samples (chi2), O - E changes sign.
  const LogRank s = log_rank(obs({{1, 1}, {3, 1}, {5, 1}}), obs({{2, 1}, {4, 0}, {6, 1}}));
  EXPECT_NEAR(s.chi2, r.chi2, kTight);
  EXPECT_NEAR(s.observed_a - s.expected_a, -(r.observed_a - r.expected_a), kTight);
  // No events at all: undefined.
  const LogRank none = log_rank(obs({{10, 0}}), obs({{10, 0}, {8, 0}}));
  EXPECT_TRUE(std::isnan(none.chi2) && std::isnan(none.p));
}

TEST(Stats, LargerCensoredSampleMatchesScipyAndNaive) {
  // 40 trajectories with hazard 1/2500 per step and 35 with 1/1200, censored at step 2000.
  const std::vector<SurvivalObs> a = exponential_sample(1, 40, 2000, 1 / 2500.0);
  const std::vector<SurvivalObs> b = exponential_sample(2, 35, 2000, 1 / 1200.0);
  int64_t ea = 0, eb = 0;
  for (const auto& o : a) ea += o.event;
  for (const auto& o : b) eb += o.event;
  ASSERT_EQ(ea, 22) << "the sample differs from the one the scipy values were computed on";
  ASSERT_EQ(eb, 28);
  const KaplanMeier ka = kaplan_meier(a), kb = kaplan_meier(b);
  // scipy: S(2000) 0.45 [0.293360263516, 0.594563920884] and 0.2 [0.0881046032561,
  // 0.344279728327]; first time with S <= 0.5: 1938 and 544; log-rank chi2 10.1951740438,
  // p 0.00140808669989.
  EXPECT_NEAR(ka.survival_end, 0.45, 1e-12);
  EXPECT_NEAR(ka.survival_end_ci.lo, 0.293360263516, 1e-11);
  EXPECT_NEAR(ka.survival_end_ci.hi, 0.594563920884, 1e-11);
  EXPECT_NEAR(kb.survival_end, 0.2, 1e-12);
  EXPECT_NEAR(kb.survival_end_ci.lo, 0.0881046032561, 1e-11);
  EXPECT_NEAR(kb.survival_end_ci.hi, 0.344279728327, 1e-11);
  EXPECT_EQ(ka.median_time, 1938);
  EXPECT_EQ(kb.median_time, 544);
  const LogRank r = log_rank(a, b);
  EXPECT_NEAR(r.chi2, 10.1951740438, 1e-9);
  EXPECT_NEAR(r.p, 0.00140808669989, 1e-13);
  // The naive implementations agree at every event time and on chi2.
  for (const KaplanMeier* km : {&ka, &kb})
    for (const auto& s : km->steps)
      EXPECT_NEAR(s.survival, naive_survival(km == &ka ? a : b, s.time), 1e-13) << "t=" << s.time;
  EXPECT_NEAR(r.chi2, naive_log_rank_chi2(a, b, 2000), 1e-10);
}

namespace {

// Subjects of one stratum written as {time, 1 = event / 0 = censored, 1 = sample a / 0 = b}.
std::vector<LabelledObs> stratum(std::initializer_list<std::tuple<int64_t, int, int>> list) {
  std::vector<LabelledObs> v;
  for (const auto& [t, e, a] : list) v.push_back({{t, e != 0}, a != 0});
  return v;
}

// Naive O_a - E_a of one labeling: every step up to `last`, counts by full passes.
double naive_u(const std::vector<LabelledObs>& s, const std::vector<bool>& in_a, int64_t last) {
  double o = 0, e = 0;
  for (int64_t u = 0; u <= last; ++u) {
    double na = 0, n = 0, da = 0, d = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      n += s[i].obs.time >= u;
      d += s[i].obs.time == u && s[i].obs.event;
      if (in_a[i]) {
        na += s[i].obs.time >= u;
        da += s[i].obs.time == u && s[i].obs.event;
      }
    }
    if (d == 0) continue;
    o += da;
    e += d * na / n;
  }
  return o - e;
}

}  // namespace

TEST(Stats, PermutationLogRankHandWorkedPairs) {
  // Five seeds, one trajectory of each arm:
  //   seed 0: a event 100, b censored 500: both at risk at 100, O_a 1, E_a 1/2: u = +1/2, v = 1/4
  //   seed 1: a event 200, b event 300: at 200 u = +1/2, v = 1/4; at 300 only b is at risk
  //   seed 2: both censored: nothing (left out)
  //   seed 3: both events at 250: O_a 1 = E_a 1, v 0 whatever the labels: left out
  //   seed 4: a event 400, b censored 500: u = +1/2, v = 1/4
  // U = 3/2, V = 3/4, chi2 = 3; swapping the labels of a seed flips its u: U* = +-1/2 +-1/2
  // +-1/2, |U*| >= 3/2 in 2 of the 8 labelings: p = 1/4.
  const std::vector<std::vector<LabelledObs>> strata = {
      stratum({{100, 1, 1}, {500, 0, 0}}), stratum({{200, 1, 1}, {300, 1, 0}}), stratum({{500, 0, 1}, {500, 0, 0}}),
      stratum({{250, 1, 1}, {250, 1, 0}}), stratum({{400, 1, 1}, {500, 0, 0}})};
  const PermutationLogRank r = permutation_log_rank(strata);
  EXPECT_EQ(r.strata, 3);
  EXPECT_DOUBLE_EQ(r.u, 1.5);
  EXPECT_DOUBLE_EQ(r.variance, 0.75);
  EXPECT_DOUBLE_EQ(r.chi2, 3.0);
  EXPECT_DOUBLE_EQ(r.p_asymptotic, std::erfc(std::sqrt(1.5)));
  EXPECT_TRUE(r.exact);
  EXPECT_EQ(r.labelings, 8);
  EXPECT_DOUBLE_EQ(r.p, 0.25);
  // Flipping seed 4 gives U = 1/2: every labeling is as extreme.
  std::vector<std::vector<LabelledObs>> flipped = strata;
  for (LabelledObs& o : flipped[4]) o.in_a = !o.in_a;
  EXPECT_DOUBLE_EQ(permutation_log_rank(flipped).p, 1.0);
  // Nothing informative: NaN.
  const PermutationLogRank none = permutation_log_rank({strata[2], strata[3]});
  EXPECT_EQ(none.strata, 0);
  EXPECT_TRUE(std::isnan(none.p));
  EXPECT_TRUE(std::isnan(none.chi2));
  EXPECT_TRUE(std::isnan(permutation_log_rank({}).p));
}

TEST(Stats, PermutationLogRankGeneralStrataMatchNaiveEnumeration) {
  // Strata of 3 and 4 subjects (a stratum's labelings: which k of its n carry label a), ties
  // and censoring between events.
  const std::vector<std::vector<LabelledObs>> strata = {
      stratum({{100, 1, 1}, {200, 1, 0}, {300, 0, 0}}),
      stratum({{150, 1, 0}, {150, 1, 1}, {400, 0, 1}, {120, 1, 0}}),
      stratum({{50, 1, 1}, {60, 0, 0}}),
      stratum({{70, 1, 0}, {80, 1, 1}, {90, 1, 0}})};
  // Naive: every assignment of labels that keeps each stratum's count of a (bit masks).
  std::vector<std::vector<double>> us(strata.size());
  double u_obs = 0;
  for (size_t s = 0; s < strata.size(); ++s) {
    const size_t n = strata[s].size();
    size_t k = 0;
    std::vector<bool> observed(n);
    for (size_t i = 0; i < n; ++i) k += (observed[i] = strata[s][i].in_a);
    u_obs += naive_u(strata[s], observed, 500);
    for (unsigned m = 0; m < (1u << n); ++m) {
      std::vector<bool> in_a(n);
      size_t c = 0;
      for (size_t i = 0; i < n; ++i) c += (in_a[i] = (m >> i) & 1u);
      if (c == k) us[s].push_back(naive_u(strata[s], in_a, 500));
    }
  }
  int64_t total = 0, hits = 0;
  for (double a : us[0])
    for (double b : us[1])
      for (double c : us[2])
        for (double d : us[3]) {
          ++total;
          hits += std::fabs(a + b + c + d) >= std::fabs(u_obs) - 1e-9;
        }
  EXPECT_EQ(total, 3 * 6 * 2 * 3);
  const PermutationLogRank r = permutation_log_rank(strata);
  EXPECT_NEAR(r.u, u_obs, 1e-12);
  EXPECT_TRUE(r.exact);
  EXPECT_EQ(r.labelings, total);
  EXPECT_DOUBLE_EQ(r.p, static_cast<double>(hits) / static_cast<double>(total));
  EXPECT_LT(r.p, 1.0);
  // Above max_exact: random labelings from the fixed seed, (1 + hits) / (1 + draws), close to
  // the exact p, the same every time, and another seed draws others.
  const PermutationLogRank d = permutation_log_rank(strata, 50, 20000);
  EXPECT_FALSE(d.exact);
  EXPECT_EQ(d.labelings, 20000);
  EXPECT_NEAR(d.p, r.p, 0.015);
  EXPECT_EQ(permutation_log_rank(strata, 50, 20000).p, d.p);
  EXPECT_NE(permutation_log_rank(strata, 50, 20000, 7).p, d.p);
  EXPECT_DOUBLE_EQ(d.u, r.u);
  // The values results/stats_util.py permutation_log_rank gives (analysis/tests/test_events.py
  // pins the same): exact 84/108, and the draws of the fixed seed, bit for bit.
  EXPECT_EQ(r.labelings, 108);
  EXPECT_DOUBLE_EQ(r.p, 84.0 / 108.0);
  EXPECT_EQ(d.p, 0.7712614369281536);
}
