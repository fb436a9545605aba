"""Power of the causal study's primary test, computed before any of its runs (results/prereg/why_mx.md).

Model: per seed a shared gamma frailty Z (mean 1, variance `frailty_var`); within a seed the
reference arm's excursion time is exponential with hazard Z * lam_ref and the compared arm's with
hazard Z * HR * lam_ref; lam_ref is set so that P(event by the horizon) = p_ref at Z = 1 averaged
over Z; administrative censoring at the horizon (steps 20,000 - W 500 = 19,500; the time unit
cancels). Test: the seed-stratified log-rank statistic (two subjects per stratum), two-sided, its
p from the within-seed label-permutation distribution (the 2^n label swaps; with two subjects
per stratum the statistic is a sum of +-1/2 terms, one per seed with an event, and its permutation
distribution is an exact binomial). Power is reported at
alpha = 0.05 and at the first Holm step alpha / m.

    python3 results/prereg/power_why_mx.py            # prints the table of the pre-registration
    python3 results/prereg/power_why_mx.py --p-mx 0.875 --p-fp32 0.125   # other reference event
        probabilities (e.g. those a study observed: then a description, not the pre-registered power)
"""
import argparse
import math

import numpy as np


def lam_for(p_ref, frailty_var, horizon, rng, draws=200_000):
    """The baseline hazard giving marginal event probability p_ref by `horizon` (bisection)."""
    z = rng.gamma(1 / frailty_var, frailty_var, draws) if frailty_var > 0 else np.ones(draws)
    lo, hi = 1e-12, 1e-1
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        p = np.mean(1 - np.exp(-z * mid * horizon))
        lo, hi = (mid, hi) if p < p_ref else (lo, mid)
    return math.sqrt(lo * hi)


def pair_scores(t_ref, e_ref, t_arm, e_arm):
    """Per stratum (two subjects) the arm's log-rank score, observed - expected events of the arm
    summed over the stratum's event times: at the first event both are at risk (the arm expects
    1/2), so +1/2 when the arm's event comes first and -1/2 when the reference's does; a later
    event has one subject at risk (observed = expected) and a stratum without events scores 0.
    Swapping the labels negates the score: the within-seed permutation flips its sign."""
    arm_first = e_arm & (t_arm < t_ref)
    ref_first = e_ref & (t_ref < t_arm)
    return np.where(arm_first, 0.5, np.where(ref_first, -0.5, 0.0))


def power(n, p_ref, hr, frailty_var=0.5, horizon=19_500.0, alphas=(0.05,), sims=4000, seed=1):
    rng = np.random.default_rng(seed)
    lam = lam_for(p_ref, frailty_var, horizon, rng)
    hits = np.zeros(len(alphas))
    for _ in range(sims):
        z = rng.gamma(1 / frailty_var, frailty_var, n) if frailty_var > 0 else np.ones(n)
        t_ref = rng.exponential(1 / (z * lam))
        t_arm = rng.exponential(1 / (z * lam * hr))
        e_ref, e_arm = t_ref <= horizon, t_arm <= horizon
        t_ref, t_arm = np.minimum(t_ref, horizon), np.minimum(t_arm, horizon)
        s = pair_scores(t_ref, e_ref, t_arm, e_arm)
        k = int(np.count_nonzero(s))
        if k == 0:
            continue
        # the permutation distribution of sum(s) is that of (2 Bin(k, 1/2) - k) / 2: exact binomial
        pos = int(np.count_nonzero(s > 0))
        tail = sum(math.comb(k, i) for i in range(min(pos, k - pos) + 1)) / 2 ** k
        p = min(1.0, 2 * tail)
        hits += np.array([p < a for a in alphas])
    return hits / sims


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--tests", type=int, default=16, help="m, the size of the Holm family")
    ap.add_argument("--sims", type=int, default=4000)
    ap.add_argument("--p-mx", type=float, default=0.85, help="MX-all's P(event by the horizon)")
    ap.add_argument("--p-fp32", type=float, default=0.30, help="FP32's P(event by the horizon)")
    a = ap.parse_args()
    for name, p in (("--p-mx", a.p_mx), ("--p-fp32", a.p_fp32)):
        if not 0.0 < p < 1.0:
            ap.error(f"{name} {p}: a probability strictly between 0 and 1")
    alphas = (0.05, 0.05 / a.tests)
    print(f"n = {a.seeds} seeds, Holm family m = {a.tests}: power at alpha 0.05 | at 0.05/m = {alphas[1]:.4f}")
    print("| reference | P(event by 19,500) | HR | power at 0.05 | power at 0.05/m |")
    print("|---|---|---|---|---|")
    for ref, p_ref, hrs in (("MX-all", a.p_mx, (0.5, 0.33, 0.25, 0.2)),
                            ("FP32", a.p_fp32, (2.0, 3.0, 4.0, 6.0))):
        for hr in hrs:
            pw = power(a.seeds, p_ref, hr, alphas=alphas, sims=a.sims)
            print(f"| {ref} | {p_ref:.2f} | {hr:g} | {pw[0]:.2f} | {pw[1]:.2f} |")


if __name__ == "__main__":
    main()
