#!/usr/bin/env python3
"""Do the paper's precursors come before a divergence? A risk-set test on logged series.

The paper reads two signs of an imminent MX divergence: Fig. 5's ζ² (`cross_ratio_sq_avg`, the
running average of ‖g_mx − g_fp32‖² / ‖g_fp32‖², cross-trajectory) near 2, and Fig. 3's layernorm
gains in the last quantization bin (`gamma_lastbin_max`, the worst layer). Section 9 of
results/README.md found both at the same level in stable and diverging runs over 5 seeds, with no
test. This script is that test, written before the code-faithful 20k series it is meant for were
seen (part M: `results/code_faithful_20k/series_*`).
results/reanalysis_excursion.py runs this test at the first spike, with intervals and power
(results/README.md §12).

Design (a nested case-control on the risk set, stratified by learning rate):
  - Subjects: the trajectories named by --trajectory (default mx) in runs.csv of each series
    directory (results/extract_series.py). An event is a divergence that lasted at least
    --sustained W steps (stats_util.diverged_to_end; default 500, the window §10 found the end-of-run
    effect gone by); other trajectories are censored at steps_run - W.
  - For each event at step D: the window [D - gap - length, D - gap) (--gap 500, --length 1000);
    the quantity's median over the window's logged steps, for the event's trajectory and for every
    trajectory of the same lr still at risk at D (no event up to D, and censored after D).
    Events whose window starts before --burn-in (1000) or with nobody at risk are left out and
    listed.
  - The event's percentile in its risk set: (#below + #equal / 2) / (risk-set size). If the
    quantity carries no information about what diverges next, the event's rank is uniform
    among the risk set plus itself, and the percentiles average 0.5.
  - Test: the mean percentile against that null, two-sided, by 200,000 draws of uniform ranks
    (seeded, so the p-value is reproducible), for each quantity; Holm over the quantities.
  A mean percentile near 1 says the quantity is higher before a divergence than in the runs
  that have not diverged at that point; near 0, lower.

--event spike (added after the code-faithful series were seen, so exploratory, not the
pre-registered test): the event is instead a trajectory's first loss spike, the first logged step
whose loss exceeds --spike-factor (10, the divergence criterion's factor) times the smallest loss
logged before it; a trajectory without one is censored at steps_run. In the code-faithful 20k
runs most divergences follow earlier spikes, so the divergence's window often lies after the
instability began; the first spike asks what came before it began. Same windows, risk sets, test.

Usage (repository root):
  python3 results/precursors.py DIR [DIR ...] [--trajectory mx] [--sustained 500] [--gap 500]
      [--length 1000] [--burn-in 1000] [--event divergence|spike] [--spike-factor 10] [--figure PNG]
"""
import argparse
import csv
import glob
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from stats_util import diverged_to_end, holm  # noqa: E402

QUANTITIES = (("cross_ratio_sq_avg", "ζ² running average (Fig. 5)"),
              ("gamma_lastbin_max", "γ last-bin fraction, worst layer (Fig. 3)"))
DRAWS = 200_000


def first_spike(losses, factor):
    """The first step whose loss exceeds factor x the smallest loss logged before it, or None.
    losses: [(step, loss)] in step order."""
    low = None
    for step, loss in losses:
        if low is not None and loss > factor * low:
            return step
        low = loss if low is None else min(low, loss)
    return None


def load(dirs, trajectory, sustained, event_kind="divergence", spike_factor=10.0):
    """[(run_id, lr, event, time, {quantity: [(step, value)]})] of the named trajectory of every run.
    event_kind "divergence": a divergence lasting >= sustained steps (else censored at steps_run -
    sustained); "spike": the first loss spike (first_spike; else censored at steps_run)."""
    subjects = []
    seen = set()
    for d in dirs:
        runs_csv = os.path.join(d, "runs.csv")
        if not os.path.exists(runs_csv):
            raise SystemExit(f"precursors: {runs_csv} does not exist (results/extract_series.py writes it)")
        with open(runs_csv, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["trajectory"] == trajectory and r["kind"] == "trajectory"]
        for r in rows:
            if r["run_id"] in seen:
                raise SystemExit(f"precursors: run {r['run_id']} appears in two series directories")
            seen.add(r["run_id"])
            series = {q: [] for q, _ in QUANTITIES}
            losses = []
            path = os.path.join(d, f"series_{r['run_id']}.csv")
            with open(path, newline="") as f:
                for s in csv.DictReader(f):
                    if s["trajectory"] != trajectory:
                        continue
                    step = int(s["step"])
                    losses.append((step, float(s["loss"])))
                    for q, _ in QUANTITIES:
                        v = float(s[q])
                        if v == v:  # not NaN (no shadow pass yet)
                            series[q].append((step, v))
            if event_kind == "spike":
                spike = first_spike(sorted(losses), spike_factor)
                event, time = (True, spike) if spike is not None else (False, int(r["steps_run"]))
            else:
                event, time = diverged_to_end(r, sustained)
            subjects.append((r["run_id"], r["lr"], event, time, series))
    if not subjects:
        raise SystemExit(f"precursors: no trajectory named {trajectory!r} in {', '.join(dirs)}")
    return subjects


def window_median(points, lo, hi):
    vals = [v for s, v in points if lo <= s < hi]
    return statistics.median(vals) if vals else None


def percentile(value, others):
    below = sum(1 for v in others if v < value)
    equal = sum(1 for v in others if v == value)
    return (below + 0.5 * equal) / len(others)


def null_p(mean, sizes, draws=DRAWS, seed=17):
    """Two-sided p of a mean percentile under uniform ranks: an event with m others at risk takes
    percentile k/m, k = 0..m, each with probability 1/(m+1) (its null mean is 0.5)."""
    rng = random.Random(seed)
    n = len(sizes)
    dev = abs(mean - 0.5)
    hits = 0
    for _ in range(draws):
        s = sum(rng.randint(0, m) / m for m in sizes)
        if abs(s / n - 0.5) >= dev - 1e-12:
            hits += 1
    return (hits + 1) / (draws + 1)


def analyse(subjects, quantity, gap, length, burn_in):
    """(per-event rows, left-out rows, mean percentile, p) for one quantity."""
    rows, left_out = [], []
    for rid, lr, event, time, series in subjects:
        if not event:
            continue
        lo, hi = time - gap - length, time - gap
        if lo < burn_in:
            left_out.append((rid, lr, time, f"window starts at {lo} < burn-in {burn_in}"))
            continue
        mine = window_median(series[quantity], lo, hi)
        at_risk = []
        for rid2, lr2, event2, time2, series2 in subjects:
            if rid2 == rid or lr2 != lr or time2 <= time:
                continue
            v = window_median(series2[quantity], lo, hi)
            if v is not None:
                at_risk.append(v)
        if mine is None or not at_risk:
            left_out.append((rid, lr, time, "no logged value in the window" if mine is None else "nobody at risk"))
            continue
        rows.append((rid, lr, time, mine, statistics.median(at_risk), len(at_risk), percentile(mine, at_risk)))
    if not rows:
        return rows, left_out, None, None
    mean = statistics.fmean(r[6] for r in rows)
    return rows, left_out, mean, null_p(mean, [r[5] for r in rows])


def report(subjects, args):
    out = []
    events = sum(1 for s in subjects if s[2])
    what = (f"had a first loss spike (> {args.spike_factor:g} x the smallest loss before it; exploratory)"
            if args.event == "spike" else f"diverged for at least {args.sustained} steps")
    out.append(f"{len(subjects)} {args.trajectory} trajectories, {events} {what}; "
               f"window [D - {args.gap + args.length}, D - {args.gap}), burn-in {args.burn_in}, risk sets by lr")
    results = []
    for q, label in QUANTITIES:
        results.append((q, label) + analyse(subjects, q, args.gap, args.length, args.burn_in))
    adjusted = holm([r[5] for r in results if r[5] is not None])
    adj = iter(adjusted)
    out.append("")
    out.append("| quantity | events used | mean percentile in the risk set | p (two-sided) | Holm |")
    out.append("|---|---|---|---|---|")
    for q, label, rows, left_out, mean, p in results:
        if mean is None:
            out.append(f"| {label} | 0 | – | – | – |")
        else:
            out.append(f"| {label} | {len(rows)} | {mean:.3f} | {p:.3g} | {next(adj):.3g} |")
    for q, label, rows, left_out, mean, p in results:
        out.append("")
        out.append(f"{label} (`{q}`), per event:")
        out.append(f"| run | lr | {'spiked' if args.event == 'spike' else 'diverged'} at | its window median | "
                   "risk-set median | at risk | percentile |")
        out.append("|---|---|---|---|---|---|---|")
        for rid, lr, time, mine, med, n, pc in rows:
            out.append(f"| {rid} | {lr} | {time} | {mine:.4g} | {med:.4g} | {n} | {pc:.3f} |")
        for rid, lr, time, why in left_out:
            out.append(f"| {rid} | {lr} | {time} | left out: {why} | | | |")
    return "\n".join(out), results


def figure(subjects, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(QUANTITIES), figsize=(12, 4.2))
    for ax, (q, label) in zip(axes, QUANTITIES):
        for rid, lr, event, time, series in subjects:
            pts = series[q]
            if not pts:
                continue
            shown = [(s, v) for s, v in pts if not event or s <= time]  # up to the divergence
            ax.plot([s for s, _ in shown], [v for _, v in shown], lw=0.7, alpha=0.8,
                    color="tab:red" if event else "0.6")
        if q == "cross_ratio_sq_avg":
            ax.axhline(2.0, color="k", ls="--", lw=0.8)
            ax.set_yscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step")
    axes[0].set_ylabel(f"{args.trajectory} trajectory")
    what = "first loss spike" if args.event == "spike" else f"diverged (≥ {args.sustained} steps)"
    fig.suptitle(f"red: {what}, drawn up to that step; grey: none", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", help="series directories (runs.csv + series_*.csv)")
    ap.add_argument("--trajectory", default="mx")
    ap.add_argument("--sustained", type=int, default=500)
    ap.add_argument("--gap", type=int, default=500)
    ap.add_argument("--length", type=int, default=1000)
    ap.add_argument("--burn-in", type=int, default=1000)
    ap.add_argument("--event", choices=("divergence", "spike"), default="divergence",
                    help="the event: a sustained divergence (default, the pre-registered test) or the first "
                         "loss spike (exploratory)")
    ap.add_argument("--spike-factor", type=float, default=10.0,
                    help="--event spike: a loss above this times the smallest loss before it (default 10)")
    ap.add_argument("--figure")
    args = ap.parse_args(argv)
    for name in ("sustained", "gap", "burn_in"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.length <= 0:
        ap.error("--length must be positive")
    if args.spike_factor <= 1:
        ap.error("--spike-factor must be > 1")
    dirs = []
    for d in args.dirs:
        dirs.extend(sorted(glob.glob(d)) or [d])
    subjects = load(dirs, args.trajectory, args.sustained, args.event, args.spike_factor)
    text, _ = report(subjects, args)
    print(text)
    if args.figure:
        figure(subjects, args, args.figure)


if __name__ == "__main__":
    main()
