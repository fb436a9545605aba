#!/usr/bin/env python3
"""The figures and tables of results/README.md sections 7 (issue 12's instruments) and 8 (issue
14's attention block and norms), recomputed from committed CSVs only:

  results/instruments_lr5e-4/{series,curvature}_<run_id>.csv, runs.csv, eval_*.txt
      (results/extract_series.py and `mxlab eval` on the device, run_repro.sh part J)
  results/summary_instruments_lr5e-4.csv, summary_attn_lr5e-4.csv, summary_norms_lr5e-4.csv
      (`mxlab summarize DIR --csv`, run_repro.sh parts J, H, I)

Usage (repository root):
  PYTHONPATH=analysis python3 results/figures_instruments.py [FIGDIR]   # default results/figures
  PYTHONPATH=analysis python3 results/figures_instruments.py --tables    # the tables only

Figures: fig12a_switch_seed0.png, fig12b_sharpness_lr5e-4.png, fig14_survival_lr5e-4.png.
Statistics: Wilson 95 % intervals for k/n, two-sided Fisher exact tests, Kaplan-Meier and
log-rank (mxlab.survival) with steps to divergence, censored at the last step run.
"""
import csv
import glob
import math
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "instruments_lr5e-4")
LR = 5e-4
SEED0_RUN = "9f778bb8187d"  # instruments_lr5e-4_seed0.yaml


# ---- statistics: results/stats_util.py (the same formulas as lab/stats/stats.cpp) ----
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stats_util import diverged_at, fisher_power, fisher_two_sided, wilson  # noqa: E402


def power_table():
    lines = ["| seeds per arm | power to see 60 % → 30 % failures (two-sided Fisher, α = 0.05) |", "|---|---|"]
    for n in (5, 10, 20, 32):
        lines.append(f"| {n} | {fisher_power(0.6, 0.3, n):.3f} |")
    return "\n".join(lines)


# ---- data ----
def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def subjects(summary, where=None):
    """{group: [(seed, time, diverged)]} of a summary CSV's trajectories (no branches): time is
    the divergence step, or the last step run (censored) when the trajectory did not diverge."""
    out = {}
    for row in read_csv(os.path.join(HERE, summary)):
        if row["at"] or any(row.get(k) != v for k, v in (where or {}).items()):
            continue
        d = diverged_at(row)
        end = int(row["steps_run"])
        out.setdefault(row["group"], []).append((int(row["seed"]), d if d >= 0 else end, d >= 0))
    return out


# Issue 14's comparison: (label, summary CSV, filter). The MLP / layernorm rows are part J's
# lr 5e-4 runs (the same run configurations as repro_lr_search.yaml's lr 5e-4 row plus logging).
SURVIVAL_GROUPS = [
    ("MLP, layernorm", "summary_instruments_lr5e-4.csv", {}),
    ("attention, layernorm", "summary_attn_lr5e-4.csv", {}),
    ("MLP, RMSNorm", "summary_norms_lr5e-4.csv", {"model.norm": "rmsnorm"}),
    ("MLP, MXNorm", "summary_norms_lr5e-4.csv", {"model.norm": "mxnorm"}),
]


def survival_table():
    from mxlab.survival import kaplan_meier, logrank
    import numpy as np

    groups = {}
    lines = ["| model | trajectory | n | diverged (Wilson 95 %) | divergence steps | KM median step | censored at |",
             "|---|---|---|---|---|---|---|"]
    for label, name, where in SURVIVAL_GROUPS:
        subj = subjects(name, where)
        for traj in ("fp32", "mx"):
            s = sorted(subj[traj])
            groups[(label, traj)] = s
            k, n = sum(1 for x in s if x[2]), len(s)
            lo, hi = wilson(k, n)
            km = kaplan_meier([x[1] for x in s], [x[2] for x in s])
            steps = ", ".join(f"s{seed}: {t}" for seed, t, e in s if e)
            cens = ", ".join(f"s{seed}: {t}" for seed, t, e in s if not e)
            lines.append(f"| {label} | {traj} | {n} | {k}/{n} ({lo:.2f}–{hi:.2f}) | {steps or '-'} | "
                         f"{km.median if km.median is not None else 'not reached'} | {cens or '-'} |")
    tests = ["| comparison | diverged | Fisher p (two-sided) | log-rank p |", "|---|---|---|---|"]

    def compare(a, b):
        sa, sb = groups[a], groups[b]
        ka, kb = sum(x[2] for x in sa), sum(x[2] for x in sb)
        arr = lambda s: (np.array([x[1] for x in s]), np.array([x[2] for x in s]), np.zeros(len(s)))
        _, p_lr = logrank(arr(sa), arr(sb))
        tests.append(f"| {a[0]} {a[1]} vs {b[0]} {b[1]} | {ka}/{len(sa)} vs {kb}/{len(sb)} | "
                     f"{fisher_two_sided(ka, len(sa), kb, len(sb)):.3f} | {p_lr:.3f} |")

    for label, _, _ in SURVIVAL_GROUPS:
        compare((label, "fp32"), (label, "mx"))
    for label, _, _ in SURVIVAL_GROUPS[1:]:
        for traj in ("fp32", "mx"):
            compare((SURVIVAL_GROUPS[0][0], traj), (label, traj))
    compare(("MLP, RMSNorm", "mx"), ("MLP, MXNorm", "mx"))
    return groups, "\n".join(lines) + "\n\n" + "\n".join(tests)


def runs_info():
    return {(r["run_id"], r["trajectory"]): r for r in read_csv(os.path.join(DATA, "runs.csv"))}


def curvature_rows():
    """{(run_id, trajectory): [(step, ratio, hessian_lmax, eq10_lhs)]}, ratio = eta * lambda_max(P^-1 H)
    / Adam's threshold 38 (precond_lmax / precond_threshold)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(DATA, "curvature_*.csv"))):
        rid = re.search(r"curvature_([0-9a-f]+)\.csv$", path).group(1)
        for r in read_csv(path):
            out.setdefault((rid, r["trajectory"]), []).append(
                (int(r["curvature_step"]), float(r["precond_lmax"]) / float(r["precond_threshold"]),
                 float(r["hessian_lmax"]), float(r["eq10_lhs"])))
    return out


def sharpness_table():
    info = runs_info()
    lines = ["| seed | trajectory | diverges at | measurements before it | η·λ_max(P⁻¹H) / (38/η)… median | max | share > 1 | "
             "λ_max(H) median | eq10_lhs median |", "|---|---|---|---|---|---|---|---|---|"]
    for (rid, traj), rows in sorted(curvature_rows().items(), key=lambda kv: (int(info[kv[0]]["seed"]), kv[0][1])):
        r = info[(rid, traj)]
        if r["kind"] != "trajectory":
            continue
        d = int(r["divergence_step"])
        pre = [x for x in rows if d < 0 or x[0] < d]
        ratio = [x[1] for x in pre]
        eq = [x[3] for x in pre if not math.isnan(x[3])]
        lines.append(f"| {r['seed']} | {traj} | {d if d >= 0 else '-'} | {len(pre)} | {statistics.median(ratio):.3f} | "
                     f"{max(ratio):.3f} | {sum(x > 1 for x in ratio) / len(ratio):.2f} | "
                     f"{statistics.median(x[2] for x in pre):.2f} | {statistics.median(eq):.1f} |")
    return "\n".join(lines)


def eval_table():
    """The immediate loss change of each switch at the snapshot steps (mxlab eval's JSON lines)."""
    import json

    lines = ["| snapshot step | batch | loss as trained | skip_ln_quant | bump_exponent | to_fp32 |", "|---|---|---|---|---|---|"]
    for step in (4200, 4800):
        for suffix in ("", "_train"):
            path = os.path.join(DATA, f"eval_seed0_step{step}{suffix}.txt")
            with open(path) as f:
                js = [json.loads(line) for line in f if line.startswith("{")][0]
            rows = {r["label"]: r["loss"] for r in js["rows"]}
            base = rows["as trained"]
            cells = [f"{rows['{apply: ' + p + '}'] / base:.3f}×" for p in ("skip_ln_quant", "bump_exponent", "to_fp32")]
            lines.append(f"| {step} | {js['batch'] if suffix == '' else 'training'} | {base:.6f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paper_metric_table():
    """Per seed, the 1000-step medians of the paper code's Fig. 5 metric (the running average of
    ||g_mx - g_fp32||^2 / ||g_fp32||^2 across the two trajectories, cross_ratio_sq_avg) and of the
    worst layer's gamma last-bin fraction, for the MX and the FP32 trajectory."""
    info = runs_info()
    windows = list(range(1000, 10000, 1000))
    head = " | ".join(f"{a // 1000}k–{a // 1000 + 1}k" for a in windows)
    lines = [f"| seed | MX diverges at | quantity | {head} |", "|---|---|---|" + "---|" * len(windows)]
    rids = [re.search(r"series_([0-9a-f]+)\.csv$", p).group(1) for p in glob.glob(os.path.join(DATA, "series_*.csv"))]
    for rid in sorted(rids, key=lambda r: int(info[(r, "mx")]["seed"])):
        s = series(rid)
        d = int(info[(rid, "mx")]["divergence_step"])
        seed = info[(rid, "mx")]["seed"]

        def med(traj, key, a):
            v = [float(r[key]) for r in s[traj] if a <= int(r["step"]) < a + 1000 and r[key] != "nan"
                 and (traj != "mx" or d < 0 or int(r["step"]) < d)]
            return f"{statistics.median(v):.2f}" if v else "(diverged)"

        for label, traj, key in (("ζ² running avg (MX)", "mx", "cross_ratio_sq_avg"),
                                 ("γ last-bin, worst layer (MX)", "mx", "gamma_lastbin_max"),
                                 ("γ last-bin, worst layer (FP32)", "fp32", "gamma_lastbin_max")):
            lines.append(f"| {seed} | {d if d >= 0 else '-'} | {label} | " +
                         " | ".join(med(traj, key, a) for a in windows) + " |")
    return "\n".join(lines)


def series(run_id):
    out = {}
    for r in read_csv(os.path.join(DATA, f"series_{run_id}.csv")):
        out.setdefault(r["trajectory"], []).append(r)
    return out


# ---- figures ----
def fig_switch(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = series(SEED0_RUN)
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"fp32": "0.4", "mx": "k", "to_fp32_4200": "tab:red", "skip_ln_quant_4200": "tab:blue",
              "bump_exponent_4200": "tab:green"}
    for traj, c in colors.items():
        rows = [r for r in s[traj] if 4100 <= int(r["step"]) <= 4600]
        st = [int(r["step"]) for r in rows]
        ax[0].semilogy(st, [float(r["loss"]) for r in rows], color=c, label=traj, lw=1.2)
        ax[1].semilogy(st, [float(r["grad_norm"]) for r in rows], color=c, label=traj, lw=1.2)
    for a in ax[:2]:
        a.axvline(4200, color="0.7", ls=":")
        a.set_xlabel("step")
    ax[0].set_title("loss around the switch at 4200 (seed 0, lr 5e-4)")
    ax[1].set_title("gradient norm (each trajectory's own policy)")
    ax[0].legend(fontsize=7)
    mx = s["mx"]
    st = [int(r["step"]) for r in mx]
    ax[2].plot(st, [float(r["gamma_above_frac_max"]) for r in mx], label="γ above block max (fraction, worst layer)")
    ax[2].plot(st, [float(r["gamma_gap_mean_max"]) for r in mx], label="mean |γ − Q(γ)| / |γ| (worst layer)")
    ax[2].axvline(4200, color="0.7", ls=":")
    ax[2].axvline(4817, color="tab:red", ls="--", lw=0.8, label="MX divergence 4817")
    ax[2].set_xlabel("step")
    ax[2].set_title("γ clamp debt of the MX trajectory")
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig_sharpness(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    info = runs_info()
    fig, ax = plt.subplots(1, 2, figsize=(13, 4.2))
    cmap = plt.get_cmap("tab10")
    for (rid, traj), rows in sorted(curvature_rows().items()):
        r = info[(rid, traj)]
        if r["kind"] != "trajectory":
            continue
        seed = int(r["seed"])
        ls = "-" if traj == "mx" else ":"
        st = [x[0] for x in rows]
        ax[0].plot(st, [x[1] for x in rows], ls, color=cmap(seed), lw=0.9, label=f"seed {seed} {traj}")
        ax[1].plot(st, [x[2] for x in rows], ls, color=cmap(seed), lw=0.9)
        d = int(r["divergence_step"])
        if d >= 0:
            for a, k in ((ax[0], 1), (ax[1], 2)):
                before = [x for x in rows if x[0] <= d]
                if before:
                    a.plot(before[-1][0], before[-1][k], "x", color=cmap(seed), ms=9, mew=2)
    ax[0].axhline(1.0, color="k", lw=0.8)
    ax[0].set_ylim(0.5, 1.6)
    ax[0].set_title("η·λ_max(P⁻¹H) / Adam threshold 38/η  (solid: MX, dotted: FP32; × divergence)")
    ax[1].set_yscale("log")
    ax[1].set_title("λ_max(H) of the FP32 loss on the probe batch")
    for a in ax:
        a.set_xlabel("step")
    ax[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig_survival(path, groups):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mxlab.survival import kaplan_meier

    fig, ax = plt.subplots(1, len(SURVIVAL_GROUPS), figsize=(4 * len(SURVIVAL_GROUPS), 3.6), sharey=True)
    for a, (label, _, _) in zip(ax, SURVIVAL_GROUPS):
        for traj, c in (("fp32", "tab:blue"), ("mx", "tab:red")):
            s = groups[(label, traj)]
            km = kaplan_meier([x[1] for x in s], [x[2] for x in s])
            t = [0] + [int(x) for x in km.times] + [10000]
            y = [1.0] + [float(v) for v in km.survival] + [float(km.survival[-1]) if len(km.survival) else 1.0]
            a.step(t, y, where="post", color=c, label=f"{traj} ({sum(x[2] for x in s)}/{len(s)} diverged)")
            cens = [x[1] for x in s if not x[2]]
            a.plot(cens, [km.at(x) for x in cens], "|", color=c, ms=10)
        a.set_title(label)
        a.set_xlabel("step")
        a.set_ylim(-0.03, 1.03)
        a.legend(fontsize=7, loc="lower left")
    ax[0].set_ylabel("fraction not diverged (Kaplan–Meier)")
    fig.suptitle("lr 5e-4, L = 4, d = 512, MXFP8 E4M3, 5 seeds per model (| = censored)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    tables_only = "--tables" in argv
    args = [a for a in argv if a != "--tables"]
    figdir = args[0] if args else os.path.join(HERE, "figures")
    groups, surv = survival_table()
    print("## switch at 4200 (mxlab eval, seed 0)\n\n" + eval_table())
    print("\n## sharpness before divergence (issue 12 b)\n\n" + sharpness_table())
    print("\n## divergence by block and norm (issue 14)\n\n" + surv)
    print("\n## the paper's Fig. 5 metric and Fig. 3 in FP32 (issue 17)\n\n" + paper_metric_table())
    print("\n## power of a 5-seed comparison (issue 17)\n\n" + power_table())
    if not tables_only:
        os.makedirs(figdir, exist_ok=True)
        fig_switch(os.path.join(figdir, "fig12a_switch_seed0.png"))
        fig_sharpness(os.path.join(figdir, "fig12b_sharpness_lr5e-4.png"))
        fig_survival(os.path.join(figdir, "fig14_survival_lr5e-4.png"), groups)
        print(f"\nwrote 3 figures to {figdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
