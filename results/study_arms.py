#!/usr/bin/env python3
"""Issue 13's recipe-arms study: merges the shards' summaries and prints its table, tests and
figure, from committed CSVs only.

Each shard (`MXLAB_SHARD=i/n bash experiments/paper/run_repro.sh K OUT` on the GPU machine)
writes OUT/summary_study_arms_shard<i>of<n>.csv (`mxlab summarize DIR --csv`: one row per
trajectory); commit those under results/study_arms/. Then:

  python3 results/study_arms.py [--dir results/study_arms] [--figure results/figures/study_arms_lr5e-4.png]

Per arm (the FP32 trajectory counts as the arm `fp32`): seeds n, diverged k/n with a Wilson 95 %
interval, degraded k/n (final loss > 2 x the same run's FP32 minimum loss), median divergence
step. Tests: two-sided Fisher exact of every arm against the paper's emulator (`floor_away`) and
against FP32, Holm-corrected within each family. Only runs whose every trajectory finished count
(an interrupted run is listed and left out). Standard library (+ matplotlib for the figure).
"""
import argparse
import csv
import glob
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from stats_util import diverged_at, fisher_two_sided, holm, wilson  # noqa: E402

REFERENCE = "floor_away"
DEGRADED_FACTOR = 2.0
FINISHED = ("complete", "diverged")


def load(directory):
    """({run_id: {group: row}}, [interrupted run ids]) from every shard CSV in `directory`; a run
    that appears in several shards (a rerun) must agree, else it is an error."""
    runs, status = {}, {}
    paths = sorted(glob.glob(os.path.join(directory, "summary_study_arms_shard*.csv")))
    if not paths:
        raise SystemExit(f"study_arms: no summary_study_arms_shard*.csv in {directory}")
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("at"):
                    continue  # branches are not arms
                rid, group = row["run_id"], row["group"]
                prev = runs.setdefault(rid, {}).get(group)
                if prev is not None and (prev["status"] in FINISHED and row["status"] in FINISHED and
                                         (prev["divergence_step"], prev["final_loss"]) !=
                                         (row["divergence_step"], row["final_loss"])):
                    raise SystemExit(f"study_arms: run {rid} {group} differs between shards ({path})")
                if prev is None or row["status"] in FINISHED:
                    runs[rid][group] = row
    done = {rid: g for rid, g in runs.items() if all(r["status"] in FINISHED for r in g.values())}
    interrupted = sorted(set(runs) - set(done))
    return done, interrupted


def per_arm(runs):
    """{arm: {'n', 'div', 'deg', 'steps', 'seeds_div'}} over the finished runs."""
    out = {}
    for rid, groups in sorted(runs.items(), key=lambda kv: int(kv[1]["fp32"]["seed"])):
        fmin = float(groups["fp32"]["min_loss"])
        for arm, row in groups.items():
            a = out.setdefault(arm, {"n": 0, "div": 0, "deg": 0, "steps": [], "seeds_div": []})
            a["n"] += 1
            d = diverged_at(row)
            if d >= 0:
                a["div"] += 1
                a["steps"].append(d)
                a["seeds_div"].append(int(row["seed"]))
            if float(row["final_loss"]) > DEGRADED_FACTOR * fmin:
                a["deg"] += 1
    return out


def arm_order(arms):
    first = [a for a in ("fp32", REFERENCE) if a in arms]
    return first + sorted(a for a in arms if a not in first)


def tables(stats):
    arms = arm_order(stats)
    lines = ["| arm | seeds | diverged (Wilson 95 %) | degraded | median divergence step |", "|---|---|---|---|---|"]
    for a in arms:
        s = stats[a]
        lo, hi = wilson(s["div"], s["n"])
        med = f"{statistics.median(s['steps']):.0f}" if s["steps"] else "-"
        lines.append(f"| {a} | {s['n']} | {s['div']}/{s['n']} ({lo:.2f}–{hi:.2f}) | {s['deg']}/{s['n']} | {med} |")
    tests = ["| comparison | diverged | Fisher p | Holm-adjusted p |", "|---|---|---|---|"]
    for ref in ("fp32", REFERENCE):
        if ref not in stats:
            continue
        others = [a for a in arms if a != ref and not (ref == REFERENCE and a == "fp32")]
        ps = [fisher_two_sided(stats[a]["div"], stats[a]["n"], stats[ref]["div"], stats[ref]["n"]) for a in others]
        for a, p, adj in zip(others, ps, holm(ps)):
            tests.append(f"| {a} vs {ref} | {stats[a]['div']}/{stats[a]['n']} vs {stats[ref]['div']}/{stats[ref]['n']} | "
                         f"{p:.3g} | {adj:.3g}{' *' if adj < 0.05 else ''} |")
    return "\n".join(lines), "\n".join(tests)


def figure(stats, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = arm_order(stats)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(arms) + 1.2))
    for y, a in enumerate(arms):
        s = stats[a]
        lo, hi = wilson(s["div"], s["n"])
        rate = s["div"] / s["n"]
        ax.errorbar(rate, y, xerr=[[rate - lo], [hi - rate]], fmt="o", color="tab:blue" if a != "fp32" else "0.3",
                    capsize=3)
        ax.text(1.02, y, f"{s['div']}/{s['n']}", va="center", fontsize=8)
    ax.set_yticks(range(len(arms)))
    ax.set_yticklabels(arms)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of seeds diverged (Wilson 95 % interval)")
    ax.set_title("lr 5e-4, L = 4, d = 512: divergence by MX recipe (arms share each seed's FP32 run)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(HERE, "study_arms"))
    ap.add_argument("--figure", default=None, help="write the figure here (PNG)")
    a = ap.parse_args(argv)
    runs, interrupted = load(a.dir)
    if not runs:
        raise SystemExit("study_arms: no finished run in the shards")
    stats = per_arm(runs)
    t1, t2 = tables(stats)
    seeds = sorted(int(g["fp32"]["seed"]) for g in runs.values())
    print(f"{len(runs)} finished runs (seeds {', '.join(map(str, seeds))})" +
          (f"; left out, not finished: {', '.join(interrupted)}" if interrupted else ""))
    print("\n" + t1 + "\n\n" + t2)
    if a.figure:
        figure(stats, a.figure)
        print(f"\nwrote {a.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
