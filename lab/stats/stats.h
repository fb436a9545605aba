// Statistics of seed studies (`mxlab summarize --by`): binomial intervals for divergence
// counts, Fisher's exact test between two counts, and, since a trajectory that did not diverge
// within its steps tells only that it survived that long, Kaplan-Meier survival curves and the
// log-rank test for right-censored steps to divergence. Plain formulas, each with its
// reference in lab/report/README.md ("mxlab summarize DIR --by"); no tuning.
#pragma once
#include <cstdint>
#include <vector>

namespace mxlab {

// The 0.975 quantile of the standard normal distribution (two-sided 95 % intervals).
constexpr double kZ95 = 1.959963984540054;

struct Interval {
  double lo, hi;  // NaN, NaN when undefined
};

// Wilson score interval of a binomial proportion k/n (Wilson 1927): the p with
// |k/n - p| <= z sqrt(p(1-p)/n). Exactly 0 below at k = 0 and 1 above at k = n; NaN for n = 0.
Interval wilson_interval(int64_t k, int64_t n, double z = kZ95);

// Two-sided p-value of Fisher's exact test of the 2x2 table [[a, b], [c, d]] (rows: the two
// groups; columns: events, non-events): the total hypergeometric probability, given the
// margins, of the tables no more probable than the observed one (up to a relative 1e-7, so
// that tables equally probable in exact arithmetic count whatever the rounding), as R's
// fisher.test and scipy.stats.fisher_exact define it. 1 when a margin is 0.
double fisher_exact_two_sided(int64_t a, int64_t b, int64_t c, int64_t d);

// Two-sided p-value of the exact McNemar test of paired binary outcomes (McNemar 1947; the
// exact binomial form, R's binom.test on the discordant pairs, scipy.stats.binomtest): b pairs
// where only the first member had the event, c where only the second had it; under the null
// each discordant pair goes either way with probability 1/2, so p = min(1, 2 P(Bin(b + c, 1/2)
// <= min(b, c))). 1 when there is no discordant pair.
double mcnemar_exact(int64_t b, int64_t c);

// P(X >= x) for X chi-square with one degree of freedom: erfc(sqrt(x / 2)).
double chi2_1df_sf(double x);

// The median (mean of the two middle values for an even count); NaN for none. Infinite values
// order as such.
double median(std::vector<double> v);

// One observation of a time to event: `time` is the event's time when `event`, else the last
// time it was seen without one (right-censored).
struct SurvivalObs {
  int64_t time;
  bool event;
};

// Kaplan-Meier estimate of S(t) = P(T > t) (Kaplan & Meier 1958). Censored observations at a
// time of events are taken to be at risk at it (they were censored after it).
struct KaplanMeier {
  struct Step {
    int64_t time;     // a time with at least one event
    int64_t at_risk;  // observations with time >= this time
    int64_t events;   // events at this time
    double survival;  // S just after this time
  };
  std::vector<Step> steps;
  int64_t n = 0;
  int64_t end_time = -1;       // the largest observed time (-1 without observations)
  double survival_end = 1.0;   // S(end_time); NaN without observations
  // 95 % interval of S(end_time) from Greenwood's variance, on the log(-log S) scale
  // (Kalbfleisch & Prentice): S^exp(+-z sqrt(sum d/(n(n-d))) / |log S|). It stays inside
  // [0, 1]; it is [S, S] where Greenwood's variance is 0 (S = 1: no event yet; S = 0).
  Interval survival_end_ci{1.0, 1.0};
  // The smallest event time with S <= 0.5 (the conventional median survival time; -1 when S
  // stays above 0.5). S is compared with 0.5 up to 1e-12, so an S that is exactly 0.5 in exact
  // arithmetic counts.
  int64_t median_time = -1;
};
KaplanMeier kaplan_meier(const std::vector<SurvivalObs>& obs, double z = kZ95);

// The log-rank test of equal survival in two samples (Mantel 1966; Peto & Peto 1972): at every
// time with events, the events of sample a against their expectation under a common hazard,
// with the hypergeometric variance; chi2 = (O_a - E_a)^2 / V with one degree of freedom.
// chi2 and p are NaN when V = 0 (no events at all, or no time with both samples at risk).
struct LogRank {
  double observed_a = 0, expected_a = 0, variance = 0;
  double chi2 = 0, p = 0;
};
LogRank log_rank(const std::vector<SurvivalObs>& a, const std::vector<SurvivalObs>& b);

// One subject of a stratified two-sample comparison: its time to event, and its label (sample a
// or b).
struct LabelledObs {
  SurvivalObs obs;
  bool in_a = false;
};

// The stratified log-rank test with a within-stratum label-permutation p-value (a paired
// design: one stratum per seed, holding the trajectories that share its initial weights and
// batches). Per stratum s, u_s = O_a - E_a and v_s the hypergeometric variance of log_rank over
// the stratum's subjects alone; U = sum u_s, V = sum v_s, chi2 = U^2 / V (1 df, asymptotic p).
// The permutation null keeps every stratum's subjects and its number of a labels and permutes
// which subjects carry them: every labeling of a stratum (its C(n_s, k_s) choices of the a
// subjects, in lexicographic order of their indices) is equally likely, independently across
// strata. p = P(|U*| >= |U|) (up to a relative 1e-9, so that ties in exact arithmetic count)
// over the product of the strata's labelings: enumerated exactly when there are at most
// max_exact of them, else estimated from `draws` random labelings, (1 + #{|U*| >= |U|}) /
// (1 + draws), each stratum's labeling drawn as splitmix64() % C(n_s, k_s) from a generator
// seeded with `seed` (results/stats_util.py permutation_log_rank draws the same ones).
// Strata where every labeling gives the same u (no event, or one label only) are left out: they
// change no U. p and chi2 are NaN when no stratum is left.
constexpr int64_t kPermutationMaxExact = int64_t{1} << 16;
constexpr int64_t kPermutationDraws = 10000;
constexpr uint64_t kPermutationSeed = 0x6d786c6162ULL;  // "mxlab"
struct PermutationLogRank {
  int64_t strata = 0;       // informative strata
  double u = 0, variance = 0;
  double chi2 = 0, p_asymptotic = 0;
  double p = 0;             // permutation p
  bool exact = false;       // p from every labeling (else from `labelings` random ones)
  int64_t labelings = 0;    // labelings counted
};
PermutationLogRank permutation_log_rank(const std::vector<std::vector<LabelledObs>>& strata,
                                        int64_t max_exact = kPermutationMaxExact, int64_t draws = kPermutationDraws,
                                        uint64_t seed = kPermutationSeed);

}  // namespace mxlab
