#!/usr/bin/env python3
"""Paired, pre-specified statistics of an arm against a reference when every seed trains both.

The design: each seed trains the reference trajectory (e.g. FP32) and every arm from the same
initial weights on the same batches, so a seed's trajectories are a matched set, and seeds
differ a lot in how unstable they are (results/README.md §10: the MX arms fail in the same
seeds). Every test here compares an arm with the reference *within* seeds; none pools the
trajectories as if they were independent. Input, per (seed, arm): `time` (the step of the
event, e.g. `excursion_step`, or the step the trajectory is censored at), `event` (True when it
had one) and, optionally, `tail_log_ratio` (a paired continuous outcome). Seeds that lack the
arm or the reference are left out of that comparison; a (seed, arm) given twice is an error.

Primary test (one per question): a within-seed label-permutation log-rank test.
  - Statistic: the seed-stratified log-rank statistic U = sum over seeds of (O - E) of the arm,
    with V = sum of the hypergeometric variances (the usual formulas, applied within each seed
    and summed; a trajectory censored at a step is still at risk at an event at that step).
  - In a pair, only the first event counts, and only while the other member is still at risk:
    a pair adds +1/2 to U when the arm's event comes first (the reference then still at risk,
    censored at the same step included), -1/2 when the reference's does, 0 otherwise (no event
    while both at risk, or both at the same step); V adds 1/4 per pair that adds +-1/2.
  - Null: within a seed the labels "arm" and "reference" are exchangeable. Swapping them in a
    pair negates that pair's term and leaves V unchanged, so the permutation distribution of U
    over all 2^n within-seed swaps is that of a sum of k = b + c independent +-1/2 terms (b pairs
    where the arm's event came first, c where the reference's did); swaps of the other pairs do
    not change U. Two-sided p = P(|U*| >= |U|) over the 2^n swaps, counted exactly for any n
    (binomial counts of the k informative pairs; this is the exact sign test of "who fails
    first"). `method="monte_carlo"` instead draws 10^4 swap vectors from a fixed seed
    (p = (hits + 1) / (draws + 1)); it exists as a check of the exact count.
  - Its asymptotic twin, the stratified log-rank chi^2 = U^2 / V on 1 degree of freedom, is
    reported for comparison only: with few informative pairs it is anti-conservative.
  Why paired: the seed decides much of the outcome, shared by its trajectories; a pooled test
  (unpaired log-rank, Fisher) carries that seed-to-seed variance as noise, and a family test that
  treats a seed's arms as exchangeable with each other is wrong when they are correlated.

Effect size: a Cox proportional-hazards model stratified by seed (statsmodels PHReg, ties="efron";
each seed its own baseline hazard), hazard ratio arm / reference with a 95 % Wald interval.
HR > 1: the arm has its event sooner. Degenerate cases, never a crash:
  - no informative risk set (no event, or no event while both were at risk): HR not estimable
    ("none"), every number NaN;
  - monotone likelihood (every informative pair goes the same way): the MLE is infinite. HR is
    reported as inf (arm always first) or 0 (reference always first) with the one-sided 95 %
    profile-likelihood bound, {beta : 2 (l(sup) - l(beta)) <= 3.841}, as the finite end ("+inf" /
    "0" in hr_kind);
  - always, also Firth's penalised estimate (partial likelihood + 1/2 log I(beta), Heinze &
    Schemper 2001), finite whenever there is information, with its penalised profile-likelihood
    95 % interval. For pairs without ties it is log HR = log((b + 1/2) / (c + 1/2)).
Secondary, continuous: the paired Wilcoxon signed-rank test (scipy.stats.wilcoxon, zero_method
"wilcox", its default exact/normal choice) of d = tail_log_ratio(arm) - tail_log_ratio(reference)
over the seeds that have both, with the Hodges-Lehmann estimate (median of the Walsh averages) and
its exact distribution-free 95 % interval (Walsh averages at the signed-rank critical values; NaN
when n is too small for 95 %, n <= 5).
Replacing the family "exchangeability" test: a cluster bootstrap over seeds (seeds drawn with
replacement, all arms of a seed together) of the difference arm - reference in the Kaplan-Meier
event fraction by tau, F(tau) = 1 - S(tau), and in the restricted mean event-free time
RMST(tau) = integral_0^tau S(t) dt, per arm and for the mean over the arms; percentile 95 %
intervals and the two-sided bootstrap p = (1 + #{|D* - D| >= |D|}) / (B + 1).
Multiplicity: Holm over every test of one question (arms x W x lr...), holm_family.
Pre-registration: power() simulates the paired design (module text at power()).

CLI (a long CSV, one row per seed and arm; `event` is 1/0 or true/false):

  python3 results/paired_stats.py --csv EVENTS.csv --ref fp32 [--by lr,W] [--out TABLE.csv]
      [--bootstrap 10000 [--tau STEP]]

Columns: seed, arm, time, event, optionally tail_log_ratio and the --by columns. Prints, per
arm (and --by group) against --ref: pairs, events ref / arm, pairs where each came first, HR
[95 % CI], Firth HR, permutation log-rank p, asymptotic stratified log-rank p, Wilcoxon p with
the Hodges-Lehmann estimate, and the Holm-adjusted permutation p over every row of the table
(the table is the question's family). A blank tail_log_ratio of the FP32 trajectory (--fp32,
default fp32) reads as 0 (its log ratio to itself); other blanks leave the pair out of the
Wilcoxon test. Exit codes: 2 bad input, 74 the --out file could not be written.
numpy, scipy, statsmodels (PHReg), and results/stats_util.py's Holm.
"""
import argparse
import csv
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from stats_util import Z95, holm  # noqa: E402

RNG_SEED = 2718          # the fixed seed of every Monte Carlo draw here (reproducible p-values)
DRAWS = 10_000           # permutation draws (method="monte_carlo") and default bootstrap draws
CHI2_95 = Z95 * Z95      # 3.841: the 95 % quantile of chi^2 with 1 degree of freedom
TIES = "efron"           # PHReg's tie handling (Efron's approximation; "breslow" also accepted)
BETA_LIMIT = 20.0        # |log HR| beyond which the partial likelihood is taken as flat (HR 4.9e8)


class InputError(Exception):
    """Bad input: a one-line message naming the problem and the fix."""


# --------------------------------------------------------------------------- pairing

@dataclass
class Pairs:
    """One arm against the reference, aligned by seed (only seeds that have both)."""
    seeds: list
    t_arm: np.ndarray
    e_arm: np.ndarray
    t_ref: np.ndarray
    e_ref: np.ndarray


def _index(seed, arm, which):
    out = {}
    for i, (s, a) in enumerate(zip(seed, arm)):
        if a == which:
            if s in out:
                raise InputError(f"seed {s} has two rows of arm {a}: give the columns that tell them apart "
                                 "(--by), or one row per seed and arm")
            out[s] = i
    return out


def make_pairs(time, event, seed, arm, arm_name, ref_name):
    """Pairs of `arm_name` vs `ref_name` from parallel (time, event, seed, arm) sequences."""
    time = np.asarray(time, dtype=float)
    event = np.asarray(event, dtype=bool)
    ia, ir = _index(seed, arm, arm_name), _index(seed, arm, ref_name)
    seeds = [s for s in ir if s in ia]
    a = np.array([ia[s] for s in seeds], dtype=int)
    r = np.array([ir[s] for s in seeds], dtype=int)
    return Pairs(seeds, time[a], event[a], time[r], event[r])


def first_events(p):
    """(arm_first, ref_first) boolean arrays per pair: whose event came first while the other was
    still at risk (a trajectory censored at the event's step is still at risk; events at the same
    step count for neither)."""
    a_first = p.e_arm & ((p.t_ref > p.t_arm) | ((p.t_ref == p.t_arm) & ~p.e_ref))
    r_first = p.e_ref & ((p.t_arm > p.t_ref) | ((p.t_arm == p.t_ref) & ~p.e_arm))
    return a_first, r_first


# --------------------------------------------------------------------------- log-rank

def stratified_logrank(time, event, group, strata):
    """(U, V, chi2, p) of the stratified log-rank test of group 1 against group 0: U = sum over
    strata and event steps of d1 - d n1 / n, V = sum of n1 n0 d (n - d) / (n^2 (n - 1)); at risk at
    t when time >= t. chi2 = U^2 / V, p = P(chi2_1 >= chi2); chi2 = p = NaN when V = 0."""
    time = np.asarray(time, dtype=float)
    event = np.asarray(event, dtype=bool)
    group = np.asarray(group, dtype=bool)
    strata = np.asarray(strata)
    u = v = 0.0
    for s in np.unique(strata):
        m = strata == s
        t, e, g = time[m], event[m], group[m]
        for tj in np.unique(t[e]):
            risk = t >= tj
            n, n1 = int(risk.sum()), int((risk & g).sum())
            hit = e & (t == tj)
            d, d1 = int(hit.sum()), int((hit & g).sum())
            if n < 2:
                continue
            u += d1 - d * n1 / n
            v += n1 * (n - n1) * d * (n - d) / (n * n * (n - 1))
    if v <= 0.0:
        return u, v, math.nan, math.nan
    chi2 = u * u / v
    return u, v, chi2, math.erfc(math.sqrt(chi2 / 2.0))


@dataclass
class LogRank:
    n_pairs: int
    arm_first: int        # b: informative pairs whose arm had the event first
    ref_first: int        # c: ... whose reference did
    u: float              # stratified log-rank U = (b - c) / 2
    v: float              # its variance, (b + c) / 4
    p_perm: float         # within-seed permutation p (two-sided)
    p_asym: float         # stratified log-rank chi^2 p (NaN when V = 0)
    method: str           # "exact" or "monte carlo (N draws, seed S)"


def permutation_p(b, c, method="exact", draws=DRAWS, rng_seed=RNG_SEED, n_pairs=None):
    """Two-sided within-seed permutation p of the paired log-rank statistic U = (b - c) / 2: the
    fraction of the 2^n label swaps with |U*| >= |U|. Exact: the k = b + c informative pairs each
    contribute +-1/2 with probability 1/2, p = sum over x with |2x - k| >= |b - c| of C(k, x) / 2^k.
    "monte_carlo": `draws` swap vectors over all n_pairs pairs (default k), p = (hits+1)/(draws+1)."""
    k, diff = b + c, abs(b - c)
    if method == "exact":
        return sum(math.comb(k, x) for x in range(k + 1) if abs(2 * x - k) >= diff) / 2 ** k
    if method != "monte_carlo":
        raise ValueError(f"method {method!r}: exact or monte_carlo")
    n = k if n_pairs is None else n_pairs
    u = np.zeros(n)
    u[:b], u[b:k] = 0.5, -0.5
    signs = np.random.default_rng(rng_seed).integers(0, 2, size=(draws, n)) * 2 - 1
    stat = np.abs(signs @ u)
    hits = int(np.count_nonzero(stat >= abs(b - c) / 2.0 - 1e-12))
    return (hits + 1) / (draws + 1)


def permutation_logrank(pairs, method="exact", draws=DRAWS, rng_seed=RNG_SEED):
    """The primary test (module docstring) of one arm against the reference: a LogRank."""
    a_first, r_first = first_events(pairs)
    b, c = int(a_first.sum()), int(r_first.sum())
    n = len(pairs.seeds)
    strata = np.concatenate([np.arange(n), np.arange(n)])
    u, v, _, p_asym = stratified_logrank(np.concatenate([pairs.t_arm, pairs.t_ref]),
                                         np.concatenate([pairs.e_arm, pairs.e_ref]),
                                         np.r_[np.ones(n, bool), np.zeros(n, bool)], strata)
    p = permutation_p(b, c, method, draws, rng_seed, n)
    label = "exact" if method == "exact" else f"monte carlo ({draws} draws, seed {rng_seed})"
    return LogRank(n, b, c, u, v, p, p_asym, label)


# --------------------------------------------------------------------------- Cox

@dataclass
class Cox:
    hr: float
    lo: float
    hi: float
    kind: str             # "finite" (Wald), "+inf" / "0" (monotone likelihood: profile bound), "none"
    beta: float
    se: float
    firth_hr: float
    firth_lo: float
    firth_hi: float
    ties: str


def _solve(f, a, b):
    """A root of f between a and b (f(a), f(b) of opposite signs), else None."""
    from scipy.optimize import brentq

    fa, fb = f(a), f(b)
    if not (np.isfinite(fa) and np.isfinite(fb)) or fa * fb > 0:
        return None
    return brentq(f, a, b, xtol=1e-10)


def cox_stratified(pairs, ties=TIES):
    """Seed-stratified Cox model of the arm indicator (module docstring): a Cox."""
    import warnings

    from statsmodels.duration.hazard_regression import PHReg

    nan = math.nan
    n = len(pairs.seeds)
    status = np.concatenate([pairs.e_arm, pairs.e_ref]).astype(float)
    none = Cox(nan, nan, nan, "none", nan, nan, nan, nan, nan, ties)
    if n == 0 or status.sum() == 0:
        return none
    model = PHReg(np.concatenate([pairs.t_arm, pairs.t_ref]), np.r_[np.ones(n), np.zeros(n)][:, None],
                  status=status, strata=np.concatenate([np.arange(n), np.arange(n)]), ties=ties)
    ll = lambda b: float(model.loglike(np.array([b])))
    score = lambda b: float(model.score(np.array([b]))[0])
    info = lambda b: float(-model.hessian(np.array([b]))[0, 0])
    if info(0.0) <= 1e-12:
        return none

    # Firth: maximise the penalised partial likelihood; its 95 % profile interval.
    pen = lambda b: ll(b) + 0.5 * math.log(max(info(b), 1e-300))
    from scipy.optimize import minimize_scalar

    fb = minimize_scalar(lambda b: -pen(b), bounds=(-BETA_LIMIT, BETA_LIMIT), method="bounded",
                         options={"xatol": 1e-10}).x
    top = pen(fb)
    drop = lambda b: top - pen(b) - CHI2_95 / 2.0
    f_lo = _solve(drop, -BETA_LIMIT, fb)
    f_hi = _solve(drop, fb, BETA_LIMIT)
    firth = (math.exp(fb), math.exp(f_lo) if f_lo is not None else 0.0,
             math.exp(f_hi) if f_hi is not None else math.inf)

    if score(BETA_LIMIT) > 0.0 or score(-BETA_LIMIT) < 0.0:
        # Monotone likelihood: sup l is approached at +-inf; the finite end of the profile interval.
        up = score(BETA_LIMIT) > 0.0
        sup = ll(2 * BETA_LIMIT if up else -2 * BETA_LIMIT)  # the limit, to ~ e^-40
        g = lambda b: sup - ll(b) - CHI2_95 / 2.0
        if up:
            bound = _solve(g, -BETA_LIMIT, BETA_LIMIT)
            lo = math.exp(bound) if bound is not None else 0.0
            return Cox(math.inf, lo, math.inf, "+inf", math.inf, nan, *firth, ties)
        bound = _solve(g, -BETA_LIMIT, BETA_LIMIT)
        hi = math.exp(bound) if bound is not None else math.inf
        return Cox(0.0, 0.0, hi, "0", -math.inf, nan, *firth, ties)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = model.fit()
    beta, se = float(res.params[0]), float(res.bse[0])
    return Cox(math.exp(beta), math.exp(beta - Z95 * se), math.exp(beta + Z95 * se), "finite", beta, se,
               *firth, ties)


# --------------------------------------------------------------------------- Wilcoxon

def signed_rank_counts(n):
    """counts[t] = number of sign vectors of ranks 1..n with positive-rank sum t (2^n in all)."""
    counts = [1]
    for r in range(1, n + 1):
        nxt = counts + [0] * r
        for t, c in enumerate(counts):
            nxt[t + r] += c
        counts = nxt
    return counts


def hodges_lehmann(d, alpha=0.05):
    """(estimate, lo, hi) of the one-sample Hodges-Lehmann shift of differences d: the median of
    the Walsh averages (d_i + d_j) / 2, i <= j, and the exact distribution-free interval
    [W_(k), W_(M + 1 - k)], M = n (n + 1) / 2, k - 1 the largest c with P(T+ <= c) <= alpha / 2
    under the signed-rank null (coverage >= 1 - alpha; NaN bounds when no such c, n <= 5 at 95 %)."""
    d = np.asarray(d, dtype=float)
    n = d.size
    if n == 0:
        return math.nan, math.nan, math.nan
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2.0)
    est = float(np.median(walsh))
    counts = signed_rank_counts(n)
    cdf = np.cumsum(counts) / 2.0 ** n
    ok = np.nonzero(cdf <= alpha / 2.0 + 1e-15)[0]
    if ok.size == 0:
        return est, math.nan, math.nan
    k = int(ok[-1]) + 1
    return est, float(walsh[k - 1]), float(walsh[walsh.size - k])


@dataclass
class Wilcoxon:
    n: int                # pairs with both values
    n_nonzero: int
    statistic: float
    p: float
    hl: float
    hl_lo: float
    hl_hi: float


def wilcoxon_paired(x_arm, x_ref):
    """Paired Wilcoxon signed-rank test of d = x_arm - x_ref (NaN pairs left out), with the
    Hodges-Lehmann estimate and its 95 % interval. No non-zero difference: p = 1."""
    from scipy.stats import wilcoxon

    d = np.asarray(x_arm, dtype=float) - np.asarray(x_ref, dtype=float)
    d = d[~np.isnan(d)]
    nz = int(np.count_nonzero(d))
    hl, lo, hi = hodges_lehmann(d)
    if nz == 0:
        return Wilcoxon(int(d.size), 0, math.nan, 1.0 if d.size else math.nan, hl, lo, hi)
    res = wilcoxon(d, zero_method="wilcox", alternative="two-sided")
    return Wilcoxon(int(d.size), nz, float(res.statistic), float(res.pvalue), hl, lo, hi)


# --------------------------------------------------------------------------- cluster bootstrap

def km_weighted(t, e, w, tau):
    """(F(tau), RMST(tau)) of the Kaplan-Meier estimate per row of weights w (draws x subjects):
    subject i counts w[b, i] times in draw b. F = 1 - S(tau) (events at tau included),
    RMST = integral_0^tau S(t) dt."""
    t, e = np.asarray(t, dtype=float), np.asarray(e, dtype=bool)
    w = np.atleast_2d(np.asarray(w, dtype=float))
    u = np.unique(t[e & (t <= tau)])
    if u.size == 0:
        return np.zeros(w.shape[0]), np.full(w.shape[0], float(tau))
    at_risk = w @ (t[:, None] >= u[None, :]).astype(float)
    died = w @ ((t[:, None] == u[None, :]) & e[:, None]).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(at_risk > 0, 1.0 - died / at_risk, 1.0)
    s = np.cumprod(factor, axis=1)
    before = np.hstack([np.ones((w.shape[0], 1)), s[:, :-1]])
    widths = np.diff(np.r_[0.0, u])
    rmst = before @ widths + s[:, -1] * (tau - u[-1])
    return 1.0 - s[:, -1], rmst


@dataclass
class BootRow:
    arm: str              # an arm, or "mean of arms"
    d_event: float        # F_arm(tau) - F_ref(tau)
    d_event_lo: float
    d_event_hi: float
    p_event: float
    d_rmst: float         # RMST_arm(tau) - RMST_ref(tau) (negative: the arm has its event sooner)
    d_rmst_lo: float
    d_rmst_hi: float
    p_rmst: float


def bootstrap_p(est, boot):
    """Two-sided bootstrap p of an estimate `est` against its draws `boot`: (1 + #{|D* - D| >= |D|}) /
    (draws + 1). The comparison has a relative tolerance (1e-9 of |D|): a draw at D* = 0 or 2D
    lies on the boundary, and whether its computed |D* - D| lands an ulp above or below |D| depends
    on the order of a sum (numpy and BLAS versions differ), which must not change the p-value."""
    boot = np.asarray(boot, dtype=float)
    hits = np.count_nonzero(np.abs(boot - est) >= abs(est) * (1 - 1e-9) - 1e-12)
    return float(min(1.0, (1 + hits) / (boot.size + 1)))


def cluster_bootstrap(time, event, seed, arm, ref, arms=None, tau=None, draws=DRAWS, rng_seed=RNG_SEED):
    """(tau, [BootRow]): arm - reference differences in F(tau) and RMST(tau), per arm and for the
    mean over the arms, with seeds resampled with replacement (every arm of a drawn seed comes
    along; a seed that lacks an arm adds nothing to it). tau defaults to the common follow-up: the
    smallest over the arms of the largest time. Percentile 95 % intervals; two-sided p =
    (1 + #{|D* - D| >= |D|}) / (draws + 1)."""
    time = np.asarray(time, dtype=float)
    event = np.asarray(event, dtype=bool)
    seeds = list(dict.fromkeys(seed))
    col = {s: i for i, s in enumerate(seeds)}
    if arms is None:
        arms = sorted({a for a in arm if a != ref})
    names = [ref] + list(arms)
    idx = {a: _index(seed, arm, a) for a in names}
    for a in names:
        if not idx[a]:
            raise InputError(f"no rows of arm {a}")
    if tau is None:
        tau = min(max(time[i] for i in idx[a].values()) for a in names)
    rng = np.random.default_rng(rng_seed)
    n = len(seeds)
    w = np.vstack([np.ones(n), rng.multinomial(n, np.full(n, 1.0 / n), size=draws)])

    def arm_stats(a):
        rows = idx[a]
        cols = [col[s] for s in rows]
        sel = list(rows.values())
        return km_weighted(time[sel], event[sel], w[:, cols], tau)

    stats = {a: arm_stats(a) for a in names}
    rows = []

    def row(label, f, r):
        out = [label]
        for x in (f, r):
            est, boot = x[0], x[1:]
            lo, hi = np.percentile(boot, [2.5, 97.5])
            out += [float(est), float(lo), float(hi), bootstrap_p(est, boot)]
        rows.append(BootRow(*out))

    for a in arms:
        row(a, stats[a][0] - stats[ref][0], stats[a][1] - stats[ref][1])
    if len(arms) > 1:
        row("mean of arms", np.mean([stats[a][0] for a in arms], axis=0) - stats[ref][0],
            np.mean([stats[a][1] for a in arms], axis=0) - stats[ref][1])
    return float(tau), rows


# --------------------------------------------------------------------------- Holm

def holm_family(tests):
    """[(label, p, Holm-adjusted p)] in the given order, for every test of one question
    [(label, p)] (stats_util.holm). A NaN p (a planned test that could not be done) counts as
    p = 1: it stays in the family, so the others' adjustment does not depend on which tests
    happened to be estimable."""
    ps = [1.0 if p != p else float(p) for _, p in tests]
    return [(label, p, q) for (label, p), q in zip(tests, holm(ps))]


# --------------------------------------------------------------------------- power

def power(n_seeds, p0, hr, m=1, alpha=0.05, frailty_var=1.0, hr_others=None, sims=2000, grid=None,
          rng_seed=RNG_SEED):
    """Power of the primary test for a pre-registration, by simulation of the paired design.

    Model (assumptions):
      - Seed i has a frailty Z_i ~ Gamma(mean 1, variance frailty_var) (0: none), shared by all of
        its trajectories: the within-seed correlation (a seed unstable under every recipe).
      - Given Z_i, the reference's event time is exponential with hazard lambda0 Z_i and arm j's
        with hazard HR_j lambda0 Z_i (proportional hazards within a seed; HR is the conditional,
        within-seed ratio that the stratified Cox model estimates, not a marginal one). Every
        trajectory is followed to the horizon tau (administrative censoring only).
      - lambda0 is set so that the reference's *marginal* event probability by tau is p0:
        Lambda0(tau) = ((1 - p0)^-v - 1) / v for frailty variance v (-log(1 - p0) for v = 0).
      - The time scale is immaterial: the test uses only the order of events within a seed, so a
        constant baseline hazard loses no generality. grid=K rounds times up to a grid of K steps
        over [0, tau] (as the excursion step lies on a block grid), which makes ties possible.
      - The family: m tests, each an arm against the same reference trajectory of the same seeds;
        arm 0 has hazard ratio `hr`, the other m - 1 `hr_others` (default `hr`). Holm at alpha
        over the m permutation p-values. Tests of other windows W or learning rates are modelled
        as further arms, which ignores their correlation with test 0; Holm does not need it.
    Returns {"power": P(test 0 rejected), "any": P(at least one rejected) (the family-wise error
    rate when every HR is 1), "mc_se": Monte Carlo standard error of "power", "informative": mean
    number of informative pairs of test 0, "events_ref", "events_arm": mean event counts}."""
    if not 0 < p0 < 1:
        raise ValueError("p0 must lie in (0, 1)")
    rng = np.random.default_rng(rng_seed)
    hrs = np.array([hr] + [hr if hr_others is None else hr_others] * (m - 1), dtype=float)
    lam0 = -math.log1p(-p0) if frailty_var == 0 else ((1 - p0) ** -frailty_var - 1) / frailty_var
    cache = {}
    rejected = np.zeros(m, dtype=int)
    any_rej = informative = ev_ref = ev_arm = 0
    for _ in range(sims):
        z = (rng.gamma(1.0 / frailty_var, frailty_var, size=n_seeds) if frailty_var > 0
             else np.ones(n_seeds))
        t_ref = rng.exponential(1.0, size=n_seeds) / (lam0 * z)
        t_arms = rng.exponential(1.0, size=(m, n_seeds)) / (lam0 * z * hrs[:, None])
        e_ref = t_ref <= 1.0
        e_arms = t_arms <= 1.0
        t_ref, t_arms = np.minimum(t_ref, 1.0), np.minimum(t_arms, 1.0)
        if grid:
            t_ref, t_arms = np.ceil(t_ref * grid) / grid, np.ceil(t_arms * grid) / grid
        ps = []
        for j in range(m):
            pr = Pairs(list(range(n_seeds)), t_arms[j], e_arms[j], t_ref, e_ref)
            a_first, r_first = first_events(pr)
            b, c = int(a_first.sum()), int(r_first.sum())
            if (b, c) not in cache:
                cache[(b, c)] = permutation_p(b, c)
            ps.append(cache[(b, c)])
            if j == 0:
                informative += b + c
                ev_arm += int(e_arms[0].sum())
        ev_ref += int(e_ref.sum())
        rej = np.array(holm(ps)) <= alpha
        rejected += rej
        any_rej += bool(rej.any())
    pw = rejected[0] / sims
    return {"power": float(pw), "any": any_rej / sims, "mc_se": math.sqrt(pw * (1 - pw) / sims),
            "informative": informative / sims, "events_ref": ev_ref / sims, "events_arm": ev_arm / sims}


# --------------------------------------------------------------------------- table and CLI

COLUMNS = ["arm", "ref", "n_pairs", "events_ref", "events_arm", "arm_first", "ref_first", "hr", "hr_lo",
           "hr_hi", "hr_kind", "firth_hr", "firth_lo", "firth_hi", "p_perm", "perm_method", "p_logrank_asym",
           "wilcoxon_n", "wilcoxon_p", "hl", "hl_lo", "hl_hi", "p_holm"]


def compare(records, ref, by=(), fp32="fp32"):
    """Rows of the question's table: every arm against `ref`, within each --by group, for records
    [{"seed", "arm", "time", "event", "tail_log_ratio" (float or NaN), by columns...}]. p_holm:
    Holm over every row's permutation p (the whole table is one question)."""
    groups = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key in sorted(groups, key=lambda g: tuple(_sort_key(x) for x in g)):
        rs = groups[key]
        seed = [r["seed"] for r in rs]
        arm = [r["arm"] for r in rs]
        if ref not in arm:
            raise InputError(f"no rows of the reference arm {ref}" + (f" where {_where(by, key)}" if by else ""))
        time = [r["time"] for r in rs]
        event = [r["event"] for r in rs]
        tlr = np.array([0.0 if (a == fp32 and r["tail_log_ratio"] != r["tail_log_ratio"]) else r["tail_log_ratio"]
                        for a, r in zip(arm, rs)])
        for a in sorted(set(arm) - {ref}):
            pr = make_pairs(time, event, seed, arm, a, ref)
            lr = permutation_logrank(pr)
            cx = cox_stratified(pr)
            ia, ir = _index(seed, arm, a), _index(seed, arm, ref)
            wx = wilcoxon_paired([tlr[ia[s]] for s in pr.seeds], [tlr[ir[s]] for s in pr.seeds])
            row = dict(zip(by, key))
            row.update(arm=a, ref=ref, n_pairs=lr.n_pairs, events_ref=int(pr.e_ref.sum()),
                       events_arm=int(pr.e_arm.sum()), arm_first=lr.arm_first, ref_first=lr.ref_first,
                       hr=cx.hr, hr_lo=cx.lo, hr_hi=cx.hi, hr_kind=cx.kind, firth_hr=cx.firth_hr,
                       firth_lo=cx.firth_lo, firth_hi=cx.firth_hi, p_perm=lr.p_perm, perm_method=lr.method,
                       p_logrank_asym=lr.p_asym, wilcoxon_n=wx.n, wilcoxon_p=wx.p, hl=wx.hl, hl_lo=wx.hl_lo,
                       hl_hi=wx.hl_hi)
            out.append(row)
    adj = holm_family([(i, r["p_perm"]) for i, r in enumerate(out)])
    for r, (_, _, q) in zip(out, adj):
        r["p_holm"] = q
    return out


def _where(by, key):
    return ", ".join(f"{k} = {v}" for k, v in zip(by, key))


def _sort_key(x):
    try:
        return (0, float(x), "")
    except ValueError:
        return (1, 0.0, x)


def _g(x):
    if x != x:
        return "–"
    if x == math.inf:
        return "inf"
    return f"{x:.3g}"


def _hr_cell(r):
    if r["hr_kind"] == "none":
        return "– (no informative pair)"
    if r["hr_kind"] == "+inf":
        return f"inf [{_g(r['hr_lo'])}, inf)"
    if r["hr_kind"] == "0":
        return f"0 (0, {_g(r['hr_hi'])}]"
    return f"{_g(r['hr'])} [{_g(r['hr_lo'])}, {_g(r['hr_hi'])}]"


def markdown(rows, by=()):
    head = list(by) + ["arm vs ref", "pairs", "events ref / arm", "first: arm / ref", "HR [95 % CI]",
                       "Firth HR [95 % CI]", "perm. log-rank p", "asympt. p", "Wilcoxon p (n)",
                       "HL [95 % CI]", "Holm p"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        star = " *" if r["p_holm"] < 0.05 else ""
        cells = [str(r[k]) for k in by] + [
            f"{r['arm']} vs {r['ref']}", str(r["n_pairs"]), f"{r['events_ref']} / {r['events_arm']}",
            f"{r['arm_first']} / {r['ref_first']}", _hr_cell(r),
            f"{_g(r['firth_hr'])} [{_g(r['firth_lo'])}, {_g(r['firth_hi'])}]", _g(r["p_perm"]),
            _g(r["p_logrank_asym"]), f"{_g(r['wilcoxon_p'])} ({r['wilcoxon_n']})",
            f"{_g(r['hl'])} [{_g(r['hl_lo'])}, {_g(r['hl_hi'])}]", _g(r["p_holm"]) + star]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _event(text, line):
    t = text.strip().lower()
    if t in ("1", "true", "yes"):
        return True
    if t in ("0", "false", "no"):
        return False
    raise InputError(f"line {line}: event {text!r} is not 1/0 or true/false")


def read_csv(path, by=()):
    """Records of a long CSV (module docstring) with the --by columns."""
    try:
        f = open(path, newline="")
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from None
    with f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        missing = [c for c in ("seed", "arm", "time", "event") + tuple(by) if c not in cols]
        if missing:
            raise InputError(f"{path} lacks column(s) {', '.join(missing)} (has: {', '.join(cols)})")
        out = []
        for line, row in enumerate(reader, start=2):
            try:
                time = float(row["time"])
            except ValueError:
                raise InputError(f"{path} line {line}: time {row['time']!r} is not a number") from None
            tlr = (row.get("tail_log_ratio") or "").strip()
            try:
                tlr = float(tlr) if tlr else math.nan
            except ValueError:
                raise InputError(f"{path} line {line}: tail_log_ratio {tlr!r} is not a number") from None
            rec = {"seed": row["seed"].strip(), "arm": row["arm"].strip(), "time": time,
                   "event": _event(row["event"], line), "tail_log_ratio": tlr}
            rec.update({k: row[k].strip() for k in by})
            out.append(rec)
    if not out:
        raise InputError(f"{path} has no rows")
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", required=True, help="long CSV: seed, arm, time, event[, tail_log_ratio, --by columns]")
    ap.add_argument("--ref", required=True, help="the reference arm (e.g. fp32)")
    ap.add_argument("--by", default="", help="comma-separated grouping columns, e.g. lr,W")
    ap.add_argument("--fp32", default="fp32", help="the trajectory tail_log_ratio is measured against (its blank "
                                                   "cells read as 0; default fp32)")
    ap.add_argument("--out", help="also write the table as CSV here")
    ap.add_argument("--bootstrap", type=int, default=0, metavar="B",
                    help="also print the cluster bootstrap over seeds with B draws (e.g. 10000)")
    ap.add_argument("--tau", type=float, default=None, help="the bootstrap's horizon (default: common follow-up)")
    a = ap.parse_args(argv)
    by = tuple(k.strip() for k in a.by.split(",") if k.strip())
    try:
        if a.bootstrap < 0:
            raise InputError("--bootstrap must be >= 0")
        records = read_csv(a.csv, by)
        rows = compare(records, a.ref, by, a.fp32)
        print(f"Within-seed permutation log-rank (primary) and seed-stratified Cox ({TIES} ties), "
              f"each arm vs {a.ref}; Holm over the {len(rows)} rows; * Holm p < 0.05\n")
        print(markdown(rows, by))
        if a.bootstrap:
            groups = {}
            for r in records:
                groups.setdefault(tuple(r[k] for k in by), []).append(r)
            for key in sorted(groups, key=lambda g: tuple(_sort_key(x) for x in g)):
                rs = groups[key]
                tau, brows = cluster_bootstrap([r["time"] for r in rs], [r["event"] for r in rs],
                                               [r["seed"] for r in rs], [r["arm"] for r in rs], a.ref,
                                               tau=a.tau, draws=a.bootstrap)
                where = f" ({_where(by, key)})" if by else ""
                print(f"\nCluster bootstrap over seeds{where}, {a.bootstrap} draws, tau = {tau:g}: "
                      "arm - ref, 95 % percentile interval, p\n")
                print("| arm | event fraction by tau | p | RMST(tau) | p |\n|---|---|---|---|---|")
                for b in brows:
                    print(f"| {b.arm} | {b.d_event:+.3f} [{b.d_event_lo:+.3f}, {b.d_event_hi:+.3f}] | "
                          f"{_g(b.p_event)} | {b.d_rmst:+.4g} [{b.d_rmst_lo:+.4g}, {b.d_rmst_hi:+.4g}] | "
                          f"{_g(b.p_rmst)} |")
    except InputError as e:
        print(f"paired_stats: {e}", file=sys.stderr)
        return 2
    if a.out:
        try:
            with open(a.out, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(by) + COLUMNS)
                w.writeheader()
                for r in rows:
                    w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})
        except OSError as e:
            print(f"paired_stats: cannot write {a.out}: {e.strerror}; choose a writable path", file=sys.stderr)
            return 74
        print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
