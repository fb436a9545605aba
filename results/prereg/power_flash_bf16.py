"""Power of the flash-attention study's primary test, computed before any of its runs
(results/prereg/flash_bf16.md, "Power").

The model and the test are those of results/prereg/power_why_mx.py (shared gamma frailty per seed,
exponential event times, administrative censoring at the horizon, the exact within-seed
permutation log-rank = sign test of "which arm had its excursion first"), reused from there. What
is new: each comparison is given as the two arms' marginal event probabilities by the horizon
(the pilot states probabilities, not hazard ratios), and the hazard ratio that gives the compared
arm its probability under the reference's baseline hazard is found by bisection (hr_for). The
test is two-sided, so which arm is called the reference does not change the power.

    python3 results/prereg/power_flash_bf16.py            # prints the table of the pre-registration
"""
import argparse
import importlib.util
import math
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("power_why_mx", os.path.join(HERE, "power_why_mx.py"))
PW = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(PW)

HORIZON = 9_500.0  # steps 10,000 - W 500: the censoring step of the study (the time unit cancels)
FRAILTY_VAR = 0.5  # as power_why_mx.py


def marginal_p(lam, hr, frailty_var, horizon, z):
    """P(event by horizon) of an arm with hazard Z * hr * lam, averaged over the frailty draws z."""
    return float(np.mean(1 - np.exp(-z * lam * hr * horizon)))


def hr_for(p_arm, p_ref, frailty_var=FRAILTY_VAR, horizon=HORIZON, seed=1, draws=200_000):
    """The hazard ratio arm / reference at which the arm's marginal event probability by the
    horizon is p_arm, when the reference's is p_ref (both in (0, 1)); the baseline hazard is
    power_why_mx.lam_for's with the same seed and draws, the one power() uses."""
    if not (0 < p_arm < 1 and 0 < p_ref < 1):
        raise ValueError(f"event probabilities must lie in (0, 1): p_arm={p_arm}, p_ref={p_ref}")
    lam = PW.lam_for(p_ref, frailty_var, horizon, np.random.default_rng(seed), draws)
    # the frailty draws lam_for averaged over (the same generator state), so hr = 1 gives p_ref
    rng = np.random.default_rng(seed)
    z = rng.gamma(1 / frailty_var, frailty_var, draws) if frailty_var > 0 else np.ones(draws)
    lo, hi = 1e-6, 1e6
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if marginal_p(lam, mid, frailty_var, horizon, z) < p_arm else (lo, mid)
    return math.sqrt(lo * hi)


# (question, reference arm, P(event) of the reference, compared arm, P(event) of the compared arm)
ROWS = (
    ("H1", "fp32", 0.05, "flash", 0.25),
    ("H1", "fp32", 0.05, "flash", 0.50),
    ("H1", "fp32", 0.05, "flash", 0.75),
    ("H2/H3", "flash", 0.50, "stabilized or delta_hp", 0.05),
    ("H2/H3", "flash", 0.50, "stabilized or delta_hp", 0.20),
    ("H2/H3", "flash", 0.75, "stabilized or delta_hp", 0.05),
    ("H2/H3", "flash", 0.75, "stabilized or delta_hp", 0.30),
    ("H4", "flash", 0.50, "mxfp8_flash", 0.85),
    ("H4", "flash", 0.50, "mxfp8_flash", 0.15),
)


def table(seeds, tests, sims):
    alphas = (0.05, 0.05 / tests)
    out = []
    for q, ref, p_ref, arm, p_arm in ROWS:
        hr = hr_for(p_arm, p_ref)
        pw = PW.power(seeds, p_ref, hr, frailty_var=FRAILTY_VAR, horizon=HORIZON, alphas=alphas, sims=sims)
        out.append((q, ref, p_ref, arm, p_arm, hr, pw[0], pw[1]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[20, 40])
    ap.add_argument("--tests", type=int, default=5, help="m, the size of the Holm family")
    ap.add_argument("--sims", type=int, default=4000)
    a = ap.parse_args()
    print(f"Holm family m = {a.tests}: power at alpha 0.05 | at the first Holm step 0.05/m = {0.05 / a.tests:.4f}; "
          f"horizon {HORIZON:.0f} steps, frailty variance {FRAILTY_VAR}, {a.sims} simulated studies per cell")
    print("| question | reference | P(event) | compared | P(event) | HR | " +
          " | ".join(f"n = {n}: power at 0.05 | at 0.05/m" for n in a.seeds) + " |")
    print("|---|---|---|---|---|---|" + "---|---|" * len(a.seeds))
    rows = {n: table(n, a.tests, a.sims) for n in a.seeds}
    for i, (q, ref, p_ref, arm, p_arm, hr, _, _) in enumerate(rows[a.seeds[0]]):
        cells = " | ".join(f"{rows[n][i][6]:.2f} | {rows[n][i][7]:.2f}" for n in a.seeds)
        print(f"| {q} | {ref} | {p_ref:.2f} | {arm} | {p_arm:.2f} | {hr:.3g} | {cells} |")


if __name__ == "__main__":
    main()
