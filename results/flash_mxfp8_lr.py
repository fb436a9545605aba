#!/usr/bin/env python3
"""Does MXFP8 train the flash study's token model, at a lower lr, and which MX role fails it?
Exploratory checks beside the pre-registered study: experiments/paper/flash_mxfp8_lr.yaml (FP32 and
the study's mxfp8_exact arm over the pilot's lr grid, seeds 1200-1201) and
experiments/paper/flash_mxfp8_roles.yaml (FP32, mxfp8_exact, each role kept in FP32 and each alone in
MXFP8, seeds 1210-1212), from the CSVs of their runs: `blocks_*.csv` (results/extract_loss_blocks.py,
100-step blocks) and `summary_*.csv` (mxlab summarize --csv).

    python3 results/flash_mxfp8_lr.py [--dir results/flash_mxfp8_lr]

Per lr and trajectory: the seeds, the excursions at k = 10 (the study's primary event) and at
k = 2 (its secondary one) with their onsets (B = 100, W = 500), where it leaves FP32 (the first
100-step block whose mean loss exceeds the same run's FP32 block mean by more than 0.1 nats, per
seed), and the mean loss of the last 100-step block (median and range over the seeds; the
vocabulary's uniform guess is ln 64 = 4.16 nats). Every k = 10 excursion computed here is checked against the binary's `excursion_step` in
the summaries (a disagreement, or a finished trajectory without blocks: exit 2). Descriptive: no
test, no verdict (the check is not pre-registered).
"""
import argparse
import csv
import glob
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reanalysis_excursion as R  # noqa: E402
from flash_study import repo_commit  # noqa: E402

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_mxfp8_lr")
FACTORS = (10.0, 2.0)


class CheckError(Exception):
    """CSVs that do not fit together: one line."""


def read(directory):
    """({(run_id, trajectory): (lr, seed, trajectory dict of R.trajectory_of, {block_start: mean})},
    {(run_id, trajectory): binary excursion_step or None}) of the CSVs in `directory`."""
    blocks = R.csv_paths(directory, "blocks_*")
    if not blocks:
        raise CheckError(f"no blocks_*.csv in {directory}")
    trajs = {}
    for key, rs in R.blocks_by_run(blocks).items():
        t = R.trajectory_of(key[0], key[1], rs)
        means = {int(r["block_start"]): float(r["mean"]) if r["mean"] else math.inf for r in rs}
        trajs[key] = (float(rs[0]["lr"]), int(rs[0]["seed"]), t, means)
    binary = {}
    for path in sorted(glob.glob(os.path.join(directory, "summary_*.csv"))):
        with R.open_csv(path) as f:
            for r in csv.DictReader(f):
                if r["status"] in ("complete", "diverged"):
                    step = int(r["excursion_step"]) if r["excursion_step"] not in ("", "-1") else None
                    binary[(r["run_id"], r["group"])] = step
    return trajs, binary


def check(trajs, binary):
    """The k = 10 excursion of every trajectory equals the binary's; every finished one has blocks."""
    if not binary:
        raise CheckError("no finished run in the summaries (summary_*.csv)")
    for key, step in sorted(binary.items()):
        if key not in trajs:
            raise CheckError(f"run {key[0]} {key[1]}: finished, but no loss blocks")
        ev, at = R.excursion(trajs[key][2], factor=FACTORS[0])
        if (at if ev else None) != step:
            raise CheckError(f"run {key[0]} {key[1]}: excursion here {at if ev else 'none'}, "
                             f"binary {step if step is not None else 'none'}")


LEAVES = 0.1  # nats: a block mean this far above the same run's FP32 block mean


def leaves_fp32(means, fp32_means):
    """The first block start whose mean exceeds the FP32 trajectory's block mean by more than LEAVES
    (over the blocks both have), or None."""
    for start in sorted(set(means) & set(fp32_means)):
        if means[start] > fp32_means[start] + LEAVES:
            return start
    return None


def table(trajs):
    """The markdown table: a row per (lr, trajectory), lr ascending, fp32 first."""
    groups = {}
    for (run_id, name), (lr, seed, t, means) in trajs.items():
        fp = trajs.get((run_id, "fp32"))
        left = "–" if name == "fp32" or fp is None else leaves_fp32(means, fp[3])
        groups.setdefault((lr, name), []).append((seed, t, means[max(means)], left))
    out = ["| lr | trajectory | seeds | k = 10 excursions (onsets) | k = 2 excursions (onsets) "
           "| leaves FP32 (block, per seed) | last-block mean loss: median (range) |", "|---|---|---|---|---|---|---|"]
    for (lr, name) in sorted(groups, key=lambda k: (k[0], k[1] != "fp32", k[1])):
        g = sorted(groups[(lr, name)], key=lambda x: x[0])
        cols = []
        for k in FACTORS:
            onsets = [at for ev, at in (R.excursion(t, factor=k) for _, t, _, _ in g) if ev]
            cols.append(f"{len(onsets)}/{len(g)}" + (f" ({', '.join(str(s) for s in sorted(onsets))})" if onsets else ""))
        lefts = [x[3] for x in g]
        left = "–" if all(x == "–" for x in lefts) else ", ".join("never" if x is None else str(x) for x in lefts)
        means = [x[2] for x in g]
        out.append(f"| {lr:g} | {name} | {', '.join(str(x[0]) for x in g)} | {cols[0]} | {cols[1]} | {left} "
                   f"| {statistics.median(means):.3g} ({min(means):.3g}–{max(means):.3g}) |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=DEFAULT_DIR, help="the folder of the check's CSVs (default results/flash_mxfp8_lr)")
    a = ap.parse_args(argv)
    try:
        trajs, binary = read(a.dir)
        check(trajs, binary)
    except (OSError, CheckError) as e:
        print(f"flash_mxfp8_lr: {e}", file=sys.stderr)
        return 2
    print(f"flash_mxfp8_lr: {len(trajs)} trajectories of {len({k[0] for k in trajs})} runs in {a.dir}; "
          f"C++ and Python agree on every k = 10 excursion; B = 100, W = 500; "
          f"`python3 results/flash_mxfp8_lr.py` at {repo_commit()}")
    print()
    print(table(trajs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
