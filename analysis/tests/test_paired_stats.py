"""results/paired_stats.py: the within-seed permutation log-rank, the seed-stratified log-rank and
Cox model, the paired Wilcoxon test with its Hodges-Lehmann interval, the cluster bootstrap over
seeds, Holm over a question's tests, the power simulation and the CLI; by hand-worked cases,
against independent implementations (brute-force label swaps, a Newton-Raphson partial
likelihood, scipy, mxlab.survival) and by properties."""

import csv
import itertools
import math

import numpy as np
import pytest
from conftest import load_results_script
from scipy import stats as sps


@pytest.fixture(scope="module")
def ps():
    return load_results_script("paired_stats")


def pairs(ps, arm, ref):
    """Pairs from [(time, event)] of the arm and of the reference, seed by seed."""
    return ps.Pairs(list(range(len(arm))), np.array([t for t, _ in arm], float), np.array([e for _, e in arm], bool),
                    np.array([t for t, _ in ref], float), np.array([e for _, e in ref], bool))


def swapped(ps, p):
    return ps.Pairs(p.seeds, p.t_ref, p.e_ref, p.t_arm, p.e_arm)


# ------------------------------------------------------------------ log-rank, by hand

def test_permutation_p_three_seeds_by_hand(ps):
    # Arm first in every seed: of the 2^3 swaps, U* = +-3/2 in 2 -> p = 2/8.
    p = pairs(ps, [(100, 1), (200, 1), (400, 1)], [(500, 0), (300, 1), (900, 1)])
    lr = ps.permutation_logrank(p)
    assert (lr.arm_first, lr.ref_first, lr.u, lr.v) == (3, 0, 1.5, 0.75)
    assert lr.p_perm == pytest.approx(2 / 8)
    assert lr.p_asym == pytest.approx(math.erfc(math.sqrt(3.0 / 2)))  # chi2 = 1.5^2 / 0.75 = 3
    # Two seeds arm first, one with no event: U* = (s1 + s2) / 2, |U*| >= 1 in 4 of 8 swaps.
    p = pairs(ps, [(100, 1), (200, 1), (1000, 0)], [(500, 0), (300, 1), (1000, 0)])
    lr = ps.permutation_logrank(p)
    assert (lr.arm_first, lr.ref_first, lr.u, lr.v) == (2, 0, 1.0, 0.5)
    assert lr.p_perm == pytest.approx(4 / 8)
    assert lr.p_asym == pytest.approx(math.erfc(1.0))  # chi2 = 2


def test_first_event_rules_by_hand(ps):
    # seed 0: both at 300 -> neither; seed 1: the reference censored at the arm's event step is
    # still at risk -> arm first; seed 2: the arm censored (150) before the reference's event (200)
    # -> neither; seed 3: the reference first.
    p = pairs(ps, [(300, 1), (100, 1), (150, 0), (800, 1)], [(300, 1), (100, 0), (200, 1), (700, 1)])
    a, r = ps.first_events(p)
    assert a.tolist() == [False, True, False, False]
    assert r.tolist() == [False, False, False, True]
    lr = ps.permutation_logrank(p)
    assert lr.p_perm == 1.0  # |U*| = 1/2 under every swap of the two informative pairs
    assert lr.p_asym == pytest.approx(1.0)


def test_stratified_logrank_by_hand(ps):
    # stratum A (3 subjects): t = 2: n 3, n1 1, d 1, d1 1 -> O-E = 2/3, V = 1*2*1*2 / (9*2) = 2/9; t = 3: n1 = 0.
    # stratum B: a tie at 4 -> O-E = 0, V = 0. stratum C: the reference at 1 -> O-E = -1/2, V = 1/4.
    time = [2, 3, 5, 4, 4, 6, 1]
    event = [1, 1, 0, 1, 1, 0, 1]
    group = [1, 0, 0, 1, 0, 1, 0]
    strata = ["A", "A", "A", "B", "B", "C", "C"]
    u, v, chi2, p = ps.stratified_logrank(time, event, group, strata)
    assert u == pytest.approx(2 / 3 - 1 / 2)
    assert v == pytest.approx(2 / 9 + 1 / 4)
    assert chi2 == pytest.approx((1 / 6) ** 2 / (17 / 36))
    assert p == pytest.approx(math.erfc(math.sqrt(chi2 / 2)))


def test_stratified_logrank_one_stratum_is_the_lab_logrank(ps):
    from mxlab.survival import logrank

    rng = np.random.default_rng(3)
    for _ in range(20):
        n = 12
        t = rng.integers(1, 30, size=n)
        e = rng.random(n) < 0.6
        g = rng.random(n) < 0.5
        if g.all() or not g.any():
            continue
        u, v, chi2, p = ps.stratified_logrank(t, e, g, np.zeros(n))
        chi2_ref, p_ref = logrank((t[g], e[g], np.zeros(g.sum())), (t[~g], e[~g], np.zeros((~g).sum())))
        if v == 0:
            assert math.isnan(chi2_ref)
        else:
            assert chi2 == pytest.approx(chi2_ref) and p == pytest.approx(p_ref)


def test_permutation_p_equals_brute_force_swaps(ps):
    """Every one of the 2^n label swaps done on the data, U recomputed by the general stratified
    log-rank: the exact p counts the same swaps."""
    rng = np.random.default_rng(7)
    for trial in range(6):
        n = 8
        t_a, t_r = rng.integers(1, 12, size=n) * 100, rng.integers(1, 12, size=n) * 100
        e_a, e_r = rng.random(n) < 0.6, rng.random(n) < 0.4
        if trial == 0:
            e_a[:] = True  # a lopsided case too
        p = ps.Pairs(list(range(n)), t_a.astype(float), e_a, t_r.astype(float), e_r)
        lr = ps.permutation_logrank(p)
        strata = np.r_[np.arange(n), np.arange(n)]
        hits = 0
        for s in itertools.product((False, True), repeat=n):
            s = np.array(s)
            ta, tr = np.where(s, t_r, t_a), np.where(s, t_a, t_r)
            ea, er = np.where(s, e_r, e_a), np.where(s, e_a, e_r)
            u, v, _, _ = ps.stratified_logrank(np.r_[ta, tr], np.r_[ea, er], np.r_[np.ones(n), np.zeros(n)], strata)
            assert v == pytest.approx(lr.v)  # V does not change under swaps
            hits += abs(u) >= abs(lr.u) - 1e-12
        assert lr.p_perm == pytest.approx(hits / 2 ** n)
        assert lr.u == pytest.approx((lr.arm_first - lr.ref_first) / 2)


def test_monte_carlo_permutation_agrees_with_exact(ps):
    for b, c in ((9, 2), (5, 5), (12, 0), (0, 0)):
        exact = ps.permutation_p(b, c)
        mc = ps.permutation_p(b, c, method="monte_carlo", n_pairs=30)
        assert abs(mc - exact) < 4 * math.sqrt(exact * (1 - exact) / ps.DRAWS) + 2 / ps.DRAWS
    assert ps.permutation_p(9, 2, "monte_carlo") == ps.permutation_p(9, 2, "monte_carlo")  # fixed seed
    assert ps.permutation_p(3, 0) == pytest.approx(ps.permutation_p(0, 3)) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        ps.permutation_p(1, 1, method="asymptotic")


def test_permutation_p_is_valid_and_roughly_uniform_under_the_null(ps):
    rng = np.random.default_rng(11)
    pvals = []
    for _ in range(600):
        n = 25
        z = rng.gamma(2.0, 0.5, size=n)  # a shared seed frailty: pairs correlated, labels exchangeable
        ta, tr = rng.exponential(1.0, size=n) / z, rng.exponential(1.0, size=n) / z
        p = ps.Pairs(list(range(n)), np.minimum(ta, 1.2), ta <= 1.2, np.minimum(tr, 1.2), tr <= 1.2)
        pvals.append(ps.permutation_logrank(p).p_perm)
    pvals = np.array(pvals)
    for x in (0.05, 0.1, 0.25, 0.5, 0.75):
        frac = np.mean(pvals <= x)
        assert frac <= x + 3 * math.sqrt(x * (1 - x) / pvals.size)  # valid (discreteness: conservative)
        assert frac >= 0.6 * x                                      # and not degenerate


# ------------------------------------------------------------------ Cox

def cox_newton(time, event, x, strata, ties):
    """Independent stratified Cox partial likelihood, one covariate, by Newton-Raphson:
    (beta, se). Efron: at an event step with tied set D (size d) and risk set R, the r-th
    denominator is sum_R e^(bx) - (r/d) sum_D e^(bx); Breslow drops the r/d term."""
    time, event, x, strata = (np.asarray(a) for a in (time, event, x, strata))

    def derivs(b):
        score = info = 0.0
        for s in set(strata.tolist()):
            m = strata == s
            t, e, xs = time[m], event[m].astype(bool), x[m].astype(float)
            for tj in sorted(set(t[e].tolist())):
                risk = t >= tj
                dead = e & (t == tj)
                d = int(dead.sum())
                score += xs[dead].sum()
                for r in range(d):
                    c = risk.astype(float) - (r / d if ties == "efron" else 0.0) * dead
                    w = c * np.exp(b * xs)
                    m1 = (w * xs).sum() / w.sum()
                    m2 = (w * xs * xs).sum() / w.sum()
                    score -= m1
                    info += m2 - m1 * m1
        return score, info

    b = 0.0
    for _ in range(100):
        s, i = derivs(b)
        step = s / i
        b += step
        if abs(step) < 1e-13:
            break
    return b, 1.0 / math.sqrt(derivs(b)[1])


COX_DATA = ([(100, 1), (300, 1), (500, 0), (150, 1), (50, 1), (700, 1)],
            [(200, 1), (300, 1), (250, 1), (400, 0), (600, 1), (80, 1)])


@pytest.mark.parametrize("ties", ["efron", "breslow"])
def test_cox_matches_newton_raphson_and_statsmodels(ps, ties):
    from statsmodels.duration.hazard_regression import PHReg

    p = pairs(ps, *COX_DATA)  # arm first 3, reference first 2, one tie at 300
    cx = ps.cox_stratified(p, ties=ties)
    n = len(p.seeds)
    args = (np.r_[p.t_arm, p.t_ref], np.r_[p.e_arm, p.e_ref], np.r_[np.ones(n), np.zeros(n)],
            np.r_[np.arange(n), np.arange(n)])
    beta, se = cox_newton(*args, ties)
    assert cx.kind == "finite" and cx.ties == ties
    assert cx.beta == pytest.approx(beta, abs=1e-7)
    assert cx.se == pytest.approx(se, rel=1e-6)
    assert (cx.lo, cx.hi) == pytest.approx((math.exp(beta - 1.959964 * se), math.exp(beta + 1.959964 * se)), rel=1e-5)
    fit = PHReg(args[0], args[2][:, None], status=args[1].astype(float), strata=args[3], ties=ties).fit()
    assert cx.hr == pytest.approx(math.exp(fit.params[0]), rel=1e-8)
    # Without the tie, Efron = Breslow = conditional logistic: log HR = log(b / c).
    p2 = pairs(ps, COX_DATA[0][:1] + COX_DATA[0][2:], COX_DATA[1][:1] + COX_DATA[1][2:])
    assert ps.cox_stratified(p2, ties=ties).hr == pytest.approx(3 / 2, rel=1e-6)


def test_cox_swapping_labels_inverts_the_hazard_ratio(ps):
    p = pairs(ps, *COX_DATA)
    a, b = ps.cox_stratified(p), ps.cox_stratified(swapped(ps, p))
    assert a.hr == pytest.approx(1 / b.hr) and a.lo == pytest.approx(1 / b.hi) and a.hi == pytest.approx(1 / b.lo)
    assert a.firth_hr == pytest.approx(1 / b.firth_hr, rel=1e-6)
    assert ps.permutation_logrank(p).p_perm == ps.permutation_logrank(swapped(ps, p)).p_perm


def test_cox_monotone_likelihood_reports_infinite_hr_with_profile_bound(ps):
    # Arm first in all 3 informative pairs, no ties: l(beta) = 3 log sigma(beta), sup 0; the profile
    # bound solves 3 log sigma(beta) = -3.841 / 2. Firth: log HR = log(3.5 / 0.5).
    p = pairs(ps, [(100, 1), (200, 1), (400, 1), (900, 0)], [(500, 0), (300, 1), (900, 1), (900, 0)])
    cx = ps.cox_stratified(p)
    s = math.exp(-ps.CHI2_95 / 2 / 3)
    assert cx.kind == "+inf" and cx.hr == math.inf and cx.hi == math.inf
    assert cx.lo == pytest.approx(s / (1 - s), rel=1e-7)
    assert cx.firth_hr == pytest.approx(7.0, rel=1e-6)
    # Firth's penalised profile interval, solved here on its closed form.
    pen = lambda b: 3.5 * math.log(1 / (1 + math.exp(-b))) + 0.5 * math.log(1 / (1 + math.exp(b)))
    top = pen(math.log(7.0))
    from scipy.optimize import brentq
    lo = brentq(lambda b: top - pen(b) - ps.CHI2_95 / 2, -20, math.log(7.0))
    hi = brentq(lambda b: top - pen(b) - ps.CHI2_95 / 2, math.log(7.0), 20)
    assert (cx.firth_lo, cx.firth_hi) == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-6)
    # The mirror image: HR 0 with an upper bound.
    cz = ps.cox_stratified(swapped(ps, p))
    assert cz.kind == "0" and cz.hr == 0.0 and cz.lo == 0.0
    assert cz.hi == pytest.approx((1 - s) / s, rel=1e-7)


def test_cox_without_information_does_not_crash(ps):
    none = ps.cox_stratified(pairs(ps, [(1000, 0)] * 3, [(1000, 0)] * 3))
    assert none.kind == "none" and math.isnan(none.hr) and math.isnan(none.firth_hr)
    # events, but never while both members were at risk
    late = ps.cox_stratified(pairs(ps, [(900, 1), (800, 1)], [(500, 0), (300, 0)]))
    assert late.kind == "none"
    assert ps.cox_stratified(pairs(ps, [], [])).kind == "none"
    # only ties: information, no direction -> HR 1
    tie = ps.cox_stratified(pairs(ps, [(300, 1), (500, 1)], [(300, 1), (500, 1)]))
    assert tie.kind == "finite" and tie.hr == pytest.approx(1.0)


# ------------------------------------------------------------------ Wilcoxon, Hodges-Lehmann

def test_wilcoxon_by_hand_and_against_scipy(ps):
    w = ps.wilcoxon_paired([1, 2, 3, 4, 5, 6, 7], [0] * 7)
    assert w.p == pytest.approx(2 / 2 ** 7)  # every difference positive: 2 of 128 sign vectors as extreme
    assert w.hl == 4.0
    # n = 7: P(T+ <= 2) = 3/128 <= 0.025 < P(T+ <= 3) = 5/128 -> k = 3: [W_(3), W_(26)] = [2, 6]
    assert (w.hl_lo, w.hl_hi) == (2.0, 6.0)
    rng = np.random.default_rng(5)
    x, y = rng.normal(0.3, 1, 15), rng.normal(0, 1, 15)
    y[3] = math.nan
    w = ps.wilcoxon_paired(x, y)
    d = (x - y)[~np.isnan(y)]
    ref = sps.wilcoxon(d)
    assert (w.n, w.statistic, w.p) == (14, pytest.approx(ref.statistic), pytest.approx(ref.pvalue))
    assert ps.wilcoxon_paired([1, 2], [1, 2]).p == 1.0
    assert math.isnan(ps.wilcoxon_paired([1, 2, 3, 4, 5], [0] * 5).hl_lo)  # n <= 5: no 95 % interval


def test_signed_rank_counts(ps):
    for n in range(1, 9):
        counts = ps.signed_rank_counts(n)
        brute = [0] * (n * (n + 1) // 2 + 1)
        for signs in itertools.product((0, 1), repeat=n):
            brute[sum(r * s for r, s in zip(range(1, n + 1), signs))] += 1
        assert counts == brute


def test_hodges_lehmann_interval_inverts_the_exact_wilcoxon_test(ps):
    rng = np.random.default_rng(9)
    d = rng.normal(0.5, 1.0, 11)
    est, lo, hi = ps.hodges_lehmann(d)
    i, j = np.triu_indices(d.size)
    walsh = np.unique((d[i] + d[j]) / 2)
    assert est == pytest.approx(np.median((d[i] + d[j]) / 2))
    mids = (walsh[:-1] + walsh[1:]) / 2
    for mu in mids:
        p = sps.wilcoxon(d - mu, method="exact").pvalue
        assert (p > 0.05) == (lo < mu < hi), mu


# ------------------------------------------------------------------ cluster bootstrap

def test_km_weighted_matches_the_lab_kaplan_meier(ps):
    from mxlab.survival import kaplan_meier

    rng = np.random.default_rng(2)
    t = rng.integers(1, 40, size=15).astype(float)
    e = rng.random(15) < 0.6
    for tau in (10.0, 25.0, 40.0):
        f, rmst = ps.km_weighted(t, e, np.ones((1, 15)), tau)
        km = kaplan_meier(t, e)
        assert f[0] == pytest.approx(1 - km.at(tau))
        grid = np.arange(0, tau)  # S is a step function on integer steps: the integral is a sum
        assert rmst[0] == pytest.approx(sum(km.at(g) for g in grid))
    # a weight of 2 is the subject twice
    w = np.ones(15)
    w[[1, 4]] = 2
    f2, r2 = ps.km_weighted(t, e, w[None, :], 30.0)
    f3, r3 = ps.km_weighted(np.r_[t, t[[1, 4]]], np.r_[e, e[[1, 4]]], np.ones((1, 17)), 30.0)
    assert (f2[0], r2[0]) == pytest.approx((f3[0], r3[0]))


def boot_data():
    """4 seeds to step 1000: the reference has one event (100), `arm` two (200, 500), `copy`
    the reference's trajectories."""
    rows = []
    for s in range(4):
        rows.append((s, "fp32", 100.0 if s == 0 else 1000.0, s == 0))
        rows.append((s, "copy", 100.0 if s == 0 else 1000.0, s == 0))
        rows.append((s, "arm", {0: 200.0, 1: 500.0}.get(s, 1000.0), s in (0, 1)))
    seed, arm, time, event = zip(*rows)
    return time, event, seed, arm


def test_cluster_bootstrap_by_hand_and_keeps_seeds_together(ps):
    tau, rows = ps.cluster_bootstrap(*boot_data(), ref="fp32", draws=2000)
    assert tau == 1000.0
    by = {r.arm: r for r in rows}
    # F: 2/4 - 1/4; RMST: (200 + 300 * 0.75 + 500 * 0.5) - (100 + 900 * 0.75) = 675 - 775
    assert by["arm"].d_event == pytest.approx(0.25) and by["arm"].d_rmst == pytest.approx(-100.0)
    assert by["arm"].d_event_lo <= 0.25 <= by["arm"].d_event_hi
    # A copy of the reference resampled with it differs by exactly 0 in every draw; resampling the
    # arms independently would not.
    c = by["copy"]
    assert (c.d_event, c.d_event_lo, c.d_event_hi, c.p_event) == (0.0, 0.0, 0.0, 1.0)
    assert (c.d_rmst_lo, c.d_rmst_hi) == (0.0, 0.0)
    m = by["mean of arms"]
    assert m.d_event == pytest.approx(0.125) and m.d_rmst == pytest.approx(-50.0)
    again = ps.cluster_bootstrap(*boot_data(), ref="fp32", draws=2000)[1]
    assert again == rows  # fixed seed


def test_bootstrap_p_counts_the_boundary_up_to_rounding(ps):
    """A draw at D* = 0 is on the boundary |D* - D| = |D|. Computed, it may come out a few ulp off
    zero (RMST differences of ~4000 steps: ulp ~ 1e-12), depending on the summation order of the
    numpy / BLAS version; it must count as a hit either way. A draw inside the boundary does not."""
    est = 4050.123
    assert ps.bootstrap_p(est, [3e-12]) == 1.0
    assert ps.bootstrap_p(est, [-3e-12]) == 1.0
    assert ps.bootstrap_p(-est, [-3e-12, 2 * -est * (1 - 1e-15)]) == 1.0
    assert ps.bootstrap_p(est, [2025.0]) == 0.5
    assert ps.bootstrap_p(est, [2025.0, 0.0, 9000.0]) == 0.75


def test_cluster_bootstrap_detects_a_large_paired_difference(ps):
    n = 30
    seed = [s for s in range(n) for _ in range(2)]
    arm = ["ref", "mx"] * n
    time = [1000.0 if a == "ref" or s % 5 == 0 else 300.0 + s for s, a in zip(seed, arm)]
    event = [t < 1000 for t in time]
    tau, rows = ps.cluster_bootstrap(time, event, seed, arm, "ref", draws=2000)
    (r,) = rows
    assert r.d_event == pytest.approx(24 / 30) and r.p_event < 0.01 and r.d_event_lo > 0.5


# ------------------------------------------------------------------ Holm

def test_holm_family_keeps_order_and_counts_untestable_as_one(ps):
    out = ps.holm_family([("a", 0.01), ("b", math.nan), ("c", 0.04)])
    assert [x[0] for x in out] == ["a", "b", "c"]
    assert [x[2] for x in out] == pytest.approx([0.03, 1.0, 0.08])
    assert math.isnan(out[1][1])


# ------------------------------------------------------------------ power

def exact_power(ps, n, p0, hr, alpha=0.05):
    """No frailty, exponential times, horizon 1: a pair is informative with probability
    1 - exp(-(1 + HR) lambda0), the arm first with HR / (1 + HR); sum the exact test's rejections."""
    lam = -math.log1p(-p0)
    q = 1 - math.exp(-(1 + hr) * lam)
    pi = hr / (1 + hr)
    total = 0.0
    for k in range(n + 1):
        pk = math.comb(n, k) * q ** k * (1 - q) ** (n - k)
        for b in range(k + 1):
            if ps.permutation_p(b, k - b) <= alpha:
                total += pk * math.comb(k, b) * pi ** b * (1 - pi) ** (k - b)
    return total


def test_power_is_alpha_or_less_under_the_null_and_matches_the_exact_value(ps):
    res = ps.power(20, 0.4, 1.0, frailty_var=0.0, sims=4000)
    want = exact_power(ps, 20, 0.4, 1.0)
    assert 0.02 < want <= 0.05
    assert abs(res["power"] - want) < 4 * math.sqrt(want * (1 - want) / 4000)
    assert res["power"] <= 0.05 + 3 * res["mc_se"]
    res = ps.power(30, 0.4, 3.0, frailty_var=0.0, sims=4000)
    want = exact_power(ps, 30, 0.4, 3.0)
    assert 0.5 < want < 0.95
    assert abs(res["power"] - want) < 4 * math.sqrt(want * (1 - want) / 4000)


def test_power_frailty_calibration_holm_and_ties(ps):
    res = ps.power(30, 0.3, 1.0, frailty_var=1.5, sims=3000)
    assert res["events_ref"] / 30 == pytest.approx(0.3, abs=0.01)  # p0 is the marginal probability
    assert res["power"] <= 0.05 + 3 * res["mc_se"]
    fam = ps.power(30, 0.3, 1.0, m=5, frailty_var=1.5, sims=2000)
    assert fam["any"] <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000)  # Holm holds the family-wise rate
    one = ps.power(30, 0.5, 4.0, frailty_var=1.0, sims=1500)
    five = ps.power(30, 0.5, 4.0, m=5, hr_others=1.0, frailty_var=1.0, sims=1500)
    assert five["power"] < one["power"]  # Holm over 5 tests costs power
    # One grid step: every time is the horizon; a pair is informative only when exactly one member
    # had the event (the other, censored at that step, still at risk): 0.9375 * 0.5 + 0.0625 * 0.5.
    coarse = ps.power(40, 0.5, 4.0, frailty_var=0.0, grid=1, sims=1000)
    assert coarse["informative"] == pytest.approx(40 * 0.5, abs=0.3)
    fine = ps.power(40, 0.5, 4.0, frailty_var=0.0, sims=1000)
    assert fine["informative"] == pytest.approx(40 * (1 - 0.5 ** 5), abs=0.3)  # P(any event) = 1 - S_ref S_arm
    with pytest.raises(ValueError):
        ps.power(10, 1.0, 2.0)


# ------------------------------------------------------------------ CLI

def write_events(path, rows, cols=("seed", "arm", "time", "event", "tail_log_ratio", "lr")):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(rows)


def cli_rows():
    rows = []
    for lr, k in (("5e-4", 3), ("6e-4", 5)):
        for s in range(6):
            rows.append((s, "fp32", 1000, 0, "", lr))
            rows.append((s, "mx", 100 * (s + 1) if s < k else 1000, int(s < k), 0.1 * (s + 1), lr))
            rows.append((s, "even", 1000, 0, -0.01 * (s + 1), lr))
    return rows


def test_cli_table_and_csv(ps, tmp_path, capsys):
    write_events(tmp_path / "ev.csv", cli_rows())
    out = tmp_path / "table.csv"
    assert ps.main(["--csv", str(tmp_path / "ev.csv"), "--ref", "fp32", "--by", "lr", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| 6e-4 | mx vs fp32 | 6 | 0 / 5 | 5 / 0 | inf [" in text
    with open(out, newline="") as f:
        got = list(csv.DictReader(f))
    assert [(r["lr"], r["arm"]) for r in got] == [("5e-4", "even"), ("5e-4", "mx"), ("6e-4", "even"), ("6e-4", "mx")]
    p = [float(r["p_perm"]) for r in got]
    assert p == pytest.approx([1.0, 2 / 8, 1.0, 2 / 32])
    assert [float(r["p_holm"]) for r in got] == pytest.approx([1.0, 0.75, 1.0, 0.25])
    mx6 = got[3]
    assert (mx6["hr_kind"], mx6["arm_first"], mx6["ref_first"], mx6["events_ref"], mx6["events_arm"]) == \
        ("+inf", "5", "0", "0", "5")
    # fp32's blank tail_log_ratio reads as 0: d = 0.1 .. 0.6, all positive, exact p = 2/64
    assert float(mx6["wilcoxon_p"]) == pytest.approx(2 / 64) and mx6["wilcoxon_n"] == "6"
    assert float(got[0]["wilcoxon_p"]) == pytest.approx(2 / 64) and float(got[0]["hl"]) < 0


def test_cli_bootstrap_and_errors(ps, tmp_path, capsys):
    write_events(tmp_path / "ev.csv", cli_rows())
    assert ps.main(["--csv", str(tmp_path / "ev.csv"), "--ref", "fp32", "--by", "lr", "--bootstrap", "500"]) == 0
    text = capsys.readouterr().out
    assert "Cluster bootstrap over seeds (lr = 6e-4), 500 draws, tau = 1000" in text
    assert "| mx | +0.833 [" in text and "| mean of arms |" in text
    # without --by the two learning rates give each seed two rows of an arm
    assert ps.main(["--csv", str(tmp_path / "ev.csv"), "--ref", "fp32"]) == 2
    assert "seed 0 has two rows of arm" in capsys.readouterr().err
    write_events(tmp_path / "bad.csv", [(0, "fp32", 10, 0)], cols=("seed", "arm", "time", "evnt"))
    assert ps.main(["--csv", str(tmp_path / "bad.csv"), "--ref", "fp32"]) == 2
    assert "lacks column(s) event" in capsys.readouterr().err
    write_events(tmp_path / "bad2.csv", [(0, "fp32", 10, "maybe")], cols=("seed", "arm", "time", "event"))
    assert ps.main(["--csv", str(tmp_path / "bad2.csv"), "--ref", "fp32"]) == 2
    assert ps.main(["--csv", str(tmp_path / "ev.csv"), "--ref", "bf16", "--by", "lr"]) == 2
    assert "no rows of the reference arm bf16" in capsys.readouterr().err
    assert ps.main(["--csv", str(tmp_path / "ev.csv"), "--ref", "fp32", "--by", "lr",
                    "--out", str(tmp_path / "no" / "such" / "dir.csv")]) == 74
