#!/usr/bin/env python3
"""Issue 17, part L: which explanation of the loss jump at a precision switch holds, on every lr 5e-4
seed whose MX trajectory diverges (results/README.md section 7d).

Each run (experiments/paper/jump_lr5e-4_{seed0,late,seed25}.yaml) branches eight ways off its MX
trajectory at one step s. Explanation (1) is the clamp debt: un-clamping gamma changes the
function. The snap_gamma / keep_gamma_q branches remove it. Explanation (2) is that Adam's v was
calibrated on the smaller MX gradients. The reset_adam_v branches remove that one. What this
script reads is all committed, in --dir (default results/jump_lr5e-4):
  runs.csv, series_<run>.csv  results/extract_series.py's series (logged every 10 steps)
  eval_*_train.txt            mxlab eval at the snapshot s on the training batch (its JSON line)

For each seed and branch it reports:
  grad x   |g_branch(s)| / |g_mx(s)|: the branch's first gradient against the MX one, both from
           the logged grad_norm at s;
  peak x   the largest logged loss in (s, s + 100] over the MX trajectory's loss at s;
  jump     peak x >= JUMP (10): an order of magnitude within 100 steps.
It also gives the eval table: the loss each switch causes at once, at s, before any step.

  python3 results/jump_explanations.py [--dir DIR] [--figure PNG]
"""
import argparse
import csv
import glob
import json
import os
import sys
from collections import defaultdict

BRANCHES = ["to_fp32", "snap_to_fp32", "to_fp32_keep_q", "to_fp32_new_v", "snap_to_fp32_new_v", "skip_ln_quant",
            "snap_skip_ln_quant", "new_v"]
# What each branch removes: clamp debt (1) and/or Adam's v calibration (2).
REMOVES = {
    "to_fp32": "neither", "snap_to_fp32": "(1)", "to_fp32_keep_q": "(1)", "to_fp32_new_v": "(2)",
    "snap_to_fp32_new_v": "(1)+(2)", "skip_ln_quant": "neither", "snap_skip_ln_quant": "(1)", "new_v": "none: v only",
}
WINDOW = 100
JUMP = 10.0


def load(d):
    """{run_id: {"seed", "at", "div": {traj: divergence step}, "series": {traj: {step: (loss, grad_norm)}}}}"""
    runs = {}
    for r in csv.DictReader(open(os.path.join(d, "runs.csv"))):
        e = runs.setdefault(r["run_id"], {"seed": int(r["seed"]), "at": None, "div": {}})
        if r["kind"] == "branch":
            e["at"] = int(r["at"])
        e["div"][r["trajectory"]] = int(r["divergence_step"])
    for rid, e in runs.items():
        s = defaultdict(dict)
        for r in csv.DictReader(open(os.path.join(d, f"series_{rid}.csv"))):
            s[r["trajectory"]][int(r["step"])] = (float(r["loss"]), float(r["grad_norm"]))
        e["series"] = s
    return runs


def jump_rows(runs):
    """One row per run (seed order): seed, s, MX divergence step, {branch: (grad x, peak x)}."""
    rows = []
    for rid, e in sorted(runs.items(), key=lambda kv: kv[1]["seed"]):
        s, ser = e["at"], e["series"]
        loss0, grad0 = ser["mx"][s]
        cells = {}
        for b in BRANCHES:
            tr = ser[b]
            window = [tr[k][0] for k in sorted(tr) if s < k <= s + WINDOW]
            if s not in tr or not window:
                raise ValueError(f"run {rid}: branch {b} has no logged step at {s} or in ({s}, {s + WINDOW}]")
            cells[b] = (tr[s][1] / grad0, max(window) / loss0)
        rows.append({"run": rid, "seed": e["seed"], "at": s, "mx_div": e["div"]["mx"], "cells": cells,
                     "div": e["div"]})
    return rows


def load_evals(d):
    """{run_id: {label: loss}} from the eval files' JSON lines."""
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "eval_*_train.txt"))):
        for line in open(f):
            if line.startswith("{"):
                j = json.loads(line)
                rid = os.path.basename(j["run"])[:-3]
                out[rid] = {r["label"]: r["loss"] for r in j["rows"]}
    return out


def fmt_x(v):
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def print_tables(rows, evals):
    """The jump table (rows: jump_rows), the counts, the eval table and the later divergences."""
    print(f"Peak loss in the {WINDOW} steps after the switch / MX loss at the switch (bold: >= {JUMP:g}, a jump); "
          "in brackets the branch's first gradient norm / the MX one:\n")
    print("| seed | switch s | MX diverges | " + " | ".join(f"{b} {REMOVES[b]}" for b in BRANCHES) + " |")
    print("|---" * (3 + len(BRANCHES)) + "|")
    for r in rows:
        cells = []
        for b in BRANCHES:
            g, p = r["cells"][b]
            txt = f"{fmt_x(p)} ({g:.2f})"
            cells.append(f"**{txt}**" if p >= JUMP else txt)
        print(f"| {r['seed']} | {r['at']} | {r['mx_div']} | " + " | ".join(cells) + " |")
    # Counts over seeds.
    print()
    jumped = [r for r in rows if r["cells"]["to_fp32"][1] >= JUMP or r["cells"]["skip_ln_quant"][1] >= JUMP]
    print(f"Seeds whose to_fp32 or skip_ln_quant switch jumps: {len(jumped)} of {len(rows)} "
          f"({', '.join(str(r['seed']) for r in jumped)}).")
    for b in BRANCHES:
        n = sum(1 for r in rows if r["cells"][b][1] >= JUMP)
        nj = sum(1 for r in jumped if r["cells"][b][1] >= JUMP)
        print(f"- {b} {REMOVES[b]}: jumps in {n} of {len(rows)} seeds; in {nj} of the {len(jumped)} that jump")
    print()
    print("Loss at the switch itself (mxlab eval at s, training batch), over the MX trajectory's:\n")
    labels = ["{apply: to_fp32}", "{apply: snap_gamma+to_fp32}", "{apply: to_fp32_keep_gamma_q}",
              "{apply: skip_ln_quant}", "{apply: snap_gamma+skip_ln_quant}"]
    print("| seed | s | loss as trained | " + " | ".join(l[8:-1] for l in labels) + " |")
    print("|---" * (3 + len(labels)) + "|")
    for r in rows:
        ev = evals.get(r["run"])
        if ev is None:
            print(f"| {r['seed']} | {r['at']} | (no eval) |" + " |" * len(labels))
            continue
        base = ev["as trained"]
        print(f"| {r['seed']} | {r['at']} | {base:.4g} | " + " | ".join(f"{ev[l] / base:.3f}" for l in labels) + " |")
    print()
    print("Later divergence (step; - = none by 10,000):\n")
    print("| seed | MX | " + " | ".join(BRANCHES) + " |")
    print("|---" * (2 + len(BRANCHES)) + "|")
    for r in rows:
        print(f"| {r['seed']} | {r['mx_div']} | " +
              " | ".join("-" if r["div"][b] < 0 else str(r["div"][b]) for b in BRANCHES) + " |")


def figure(runs, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 3.6), sharey=True)
    styles = {"to_fp32": ("C3", "-"), "snap_to_fp32": ("C0", "-"), "to_fp32_keep_q": ("C0", ":"),
              "to_fp32_new_v": ("C1", "-"), "snap_to_fp32_new_v": ("C1", ":"), "skip_ln_quant": ("C3", "--"),
              "snap_skip_ln_quant": ("C0", "--"), "new_v": ("C2", "-")}
    for ax, r in zip(axes, rows):
        ser, s = runs[r["run"]]["series"], r["at"]
        for name in ["mx"] + BRANCHES:
            tr = ser[name]
            ks = [k for k in sorted(tr) if s - 100 <= k <= s + 300]
            c, ls = ("k", "-") if name == "mx" else styles[name]
            ax.plot([k - s for k in ks], [tr[k][0] for k in ks], color=c, ls=ls, lw=1.6 if name == "mx" else 1.0,
                    label=name)
        ax.set_yscale("log")
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(f"seed {r['seed']}, switch at {s}")
        ax.set_xlabel("steps after the switch")
    axes[0].set_ylabel("training loss (logged every 10 steps)")
    axes[-1].legend(fontsize=7, loc="upper right")
    fig.suptitle("Issue 17: the jump at a switch on the five diverging lr 5e-4 seeds "
                 "(blue: clamp debt removed first; orange/green: Adam's v reset)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "jump_lr5e-4"))
    ap.add_argument("--figure", help="write the loss-after-switch figure (PNG)")
    a = ap.parse_args(argv)
    runs = load(a.dir)
    rows = jump_rows(runs)
    print_tables(rows, load_evals(a.dir))
    if a.figure:
        figure(runs, rows, a.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
