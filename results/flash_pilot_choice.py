#!/usr/bin/env python3
"""The flash study's choice of its configuration from the pilot (pre-registered in
results/prereg/flash_bf16.md, "Choice of the configuration"), applied mechanically to the pilot's
CSVs as experiments/paper/run_why_mx.sh brings them back (experiments/paper/flash_pilot.yaml):
`summary_flash_pilot_*.csv` (mxlab summarize --csv) and `blocks_flash_pilot_*.csv`
(results/extract_loss_blocks.py, 100-step blocks).

    python3 results/flash_pilot_choice.py --dir DIR

For every trajectory (fp32, flash) of every pilot run: the primary excursion (k = 10, B = 100,
W = 500) from its loss blocks, checked against the binary's `excursion_step` (they must agree), and
the secondary one (k = 2, same B and W). Per cell (model.depth, optimizer.lr): the counts over the
pilot's seeds. The rule, in order:
  A. Cells where no FP32 trajectory had a primary excursion and some flash trajectory did: the
     one with the most flash primary excursions; ties: the most flash secondary excursions minus
     FP32 secondary excursions, then the lower lr, then the smaller depth.
  B. Else cells where no FP32 trajectory had a secondary excursion and some flash trajectory did:
     the most flash secondary excursions; ties: the lower lr, then the smaller depth.
  C. Else (no configuration explodes: the null fallback): the larger depth at the largest lr at
     which no FP32 trajectory of either depth had a secondary excursion (the most stress that
     exact arithmetic survives); the smallest lr if there is none.
The rule runs only on the complete pilot (every cell x seed of flash_pilot.yaml finished);
otherwise it says what is missing and exits 2. It prints the table, the chosen cell, the step of
the rule that chose it and the two keys to set in experiments/paper/flash_study.yaml.
"""
import argparse
import csv
import glob
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reanalysis_excursion as R  # noqa: E402

DEPTHS = (2, 4)
LRS = (1e-3, 3e-3, 1e-2, 3e-2)
SEEDS = (1100, 1101)
TRAJECTORIES = ("fp32", "flash")
PRIMARY, SECONDARY = 10.0, 2.0


class PilotError(Exception):
    """Pilot data that the rule cannot use: one line."""


def _trajectories(paths):
    """{(run_id, trajectory): traj} (reanalysis_excursion's trajectory dict) from blocks CSVs, keyed
    by run: the pilot has two runs (depths) per (seed, lr), which read_blocks would merge."""
    return {key: R.trajectory_of(key[0], key[1], blocks) for key, blocks in R.blocks_by_run(paths).items()}


def read_plan(path):
    """{run_id: (depth, lr, seed)} from `mxlab plan experiments/paper/flash_pilot.yaml` saved as text:
    a summary of a shard that holds one run has no swept-key columns, so its run's depth and lr come
    from the plan (run ids are the configurations' hashes)."""
    out = {}
    with open(path) as f:
        header = f.readline().split()
        need = ("run_id", "model.depth", "optimizer.lr", "seed")
        if not all(k in header for k in need):
            raise PilotError(f"{path}: not the run table of mxlab plan (columns {', '.join(need)})")
        col = {k: header.index(k) for k in need}
        for line in f:
            cells = line.split()
            if len(cells) != len(header):
                continue
            out[cells[col["run_id"]]] = (int(cells[col["model.depth"]]), float(cells[col["optimizer.lr"]]),
                                         int(cells[col["seed"]]))
    return out


def load(directory, plan=None):
    """{(depth, lr, seed, trajectory): (primary event, secondary event)} of the finished pilot runs;
    `plan` (read_plan) supplies depth and lr where a summary lacks their columns, and must agree
    where it has them."""
    blocks = sorted(glob.glob(os.path.join(directory, "blocks_flash_pilot_*.csv")))
    summaries = sorted(glob.glob(os.path.join(directory, "summary_flash_pilot_*.csv")))
    if not blocks or not summaries:
        raise PilotError(f"no blocks_flash_pilot_*.csv or summary_flash_pilot_*.csv in {directory}")
    trajs = _trajectories(blocks)
    out = {}
    for path in summaries:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["status"] not in ("complete", "diverged") or r["group"] not in TRAJECTORIES:
                    continue
                if "model.depth" in r and "optimizer.lr" in r:
                    cfg = (int(r["model.depth"]), float(r["optimizer.lr"]), int(r["seed"]))
                    if plan is not None and plan.get(r["run_id"], cfg) != cfg:
                        raise PilotError(f"run {r['run_id']}: the summary says {cfg}, the plan {plan[r['run_id']]}")
                elif plan is not None and r["run_id"] in plan:
                    cfg = plan[r["run_id"]]
                else:
                    raise PilotError(f"run {r['run_id']}: its summary has no model.depth / optimizer.lr column "
                                     "(a shard of one run): give --plan (mxlab plan experiments/paper/flash_pilot.yaml)")
                key = cfg + (r["group"],)
                t = trajs.get((r["run_id"], r["group"]))
                if t is None:
                    raise PilotError(f"run {r['run_id']} {r['group']}: in a summary CSV but not in the loss blocks")
                primary = R.excursion(t, factor=PRIMARY)
                step = int(r["excursion_step"])
                binary = (step >= 0, step if step >= 0 else int(r["excursion_censored_at"]))
                if primary != binary:
                    raise PilotError(f"run {r['run_id']} {r['group']}: excursion from the blocks {primary} "
                                     f"!= the binary's {binary}")
                out[key] = (primary[0], R.excursion(t, factor=SECONDARY)[0])
    missing = [(d, lr, s, g) for d in DEPTHS for lr in LRS for s in SEEDS for g in TRAJECTORIES
               if (d, lr, s, g) not in out]
    if missing:
        d, lr, s, g = missing[0]
        raise PilotError(f"the pilot is incomplete: {len(missing)} trajectories missing, e.g. depth {d} lr {lr:g} "
                         f"seed {s} {g}; run the pilot's shards again until every run is finished")
    return out


def load_dir(directory, plan_path=None):
    """load() of the pilot's CSVs in `directory`, with the plan `plan_path` or else DIR/plan.txt
    when there."""
    default = os.path.join(directory, "plan.txt")
    plan_path = plan_path or (default if os.path.exists(default) else None)
    return load(directory, read_plan(plan_path) if plan_path else None)


def cells(events):
    """{(depth, lr): {'flash10', 'fp3210', 'flash2', 'fp322'}} counts over the seeds."""
    out = {}
    for d in DEPTHS:
        for lr in LRS:
            c = {"flash10": 0, "fp3210": 0, "flash2": 0, "fp322": 0}
            for s in SEEDS:
                for g in TRAJECTORIES:
                    p, q = events[(d, lr, s, g)]
                    c[f"{g}10"] += p
                    c[f"{g}2"] += q
            out[(d, lr)] = c
    return out


def choose(table):
    """((depth, lr), step) by the pre-registered rule (module text)."""
    a = [k for k, c in table.items() if c["fp3210"] == 0 and c["flash10"] > 0]
    if a:
        c = table
        return min(a, key=lambda k: (-c[k]["flash10"], -(c[k]["flash2"] - c[k]["fp322"]), k[1], k[0])), "A"
    b = [k for k, c in table.items() if c["fp322"] == 0 and c["flash2"] > 0]
    if b:
        return min(b, key=lambda k: (-table[k]["flash2"], k[1], k[0])), "B"
    calm = [lr for lr in LRS if all(table[(d, lr)]["fp322"] == 0 for d in DEPTHS)]
    return (max(DEPTHS), max(calm) if calm else min(LRS)), "C"


STEP_TEXT = {"A": "flash has primary excursions where FP32 has none",
             "B": "no primary excursion of flash without FP32's; flash has secondary ones where FP32 has none",
             "C": "no configuration explodes: the null fallback"}


def report(table):
    """The pilot's table (per cell: the counts over the seeds) and the chosen cell with the step of
    the rule, as printed (also by results/flash_study.py)."""
    out = [f"| depth | lr | flash k=10 | fp32 k=10 | flash k=2 | fp32 k=2 |  (of {len(SEEDS)} seeds)",
           "|---|---|---|---|---|---|"]
    for (d, lr), c in table.items():
        out.append(f"| {d} | {lr:g} | {c['flash10']} | {c['fp3210']} | {c['flash2']} | {c['fp322']} |")
    (d, lr), step = choose(table)
    out.append(f"chosen: depth {d}, lr {lr:g} (rule step {step}: {STEP_TEXT[step]})")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="the pilot's summary_ and blocks_ CSVs")
    ap.add_argument("--plan", help="`mxlab plan experiments/paper/flash_pilot.yaml` saved as text (default: "
                    "DIR/plan.txt when there): depth and lr of runs whose summary lacks those columns")
    a = ap.parse_args(argv)
    try:
        table = cells(load_dir(a.dir, a.plan))
    except (PilotError, R.DataError, OSError, KeyError, ValueError) as e:
        print(f"flash_pilot_choice: {e}", file=sys.stderr)
        return 2
    print(report(table))
    (d, lr), _ = choose(table)
    print(f"flash_study.yaml: model.depth: {d}, optimizer.lr: {lr:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
