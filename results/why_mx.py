#!/usr/bin/env python3
"""The causal study's analysis (pre-registered in results/prereg/why_mx.md), from the committed
CSVs of results/why_mx/<experiment>/: the 100-step loss blocks (results/extract_loss_blocks.py)
and `mxlab summarize --csv` of the same runs.

    python3 results/why_mx.py [--dir results/why_mx/e1] [--markdown]

For every trajectory the excursion (k = 10, B = 100, W = 500) is computed from its loss blocks
and checked against the binary's `excursion_step` in the summary CSV (the C++ and Python
definitions must agree on the study's own data). Until every pre-registered seed has run, only
the progress table (per arm: seeds, excursions with a Wilson 95 % interval, median step) is
printed: the confirmatory tests of E1's family run once, on all 40 seeds, as the
pre-registration fixes them (within-seed permutation log-rank, seed-stratified Cox with Breslow
ties, Holm over the 16 tests)."""
import argparse
import csv
import glob
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paired_stats as P  # noqa: E402
import reanalysis_excursion as R  # noqa: E402
from stats_util import wilson  # noqa: E402

SEEDS = list(range(200, 240))
FP32, MX_ALL = "fp32", "mx_all"
ROLES = ("weight", "activation", "grad", "ln_affine")
GEMMS = ("fprop", "dgrad", "wgrad")
# E1's family (prereg "E1"): (label, compared arm, reference, direction of the hypothesis)
E1_TESTS = ([(f"N-role({r})", f"keep_bf16_{r}", MX_ALL, "<1") for r in ROLES] +
            [(f"S-role({r})", f"only_{r}", FP32, ">1") for r in ROLES] +
            [(f"N-GEMM({g})", f"keep_bf16_{g}", MX_ALL, "<1") for g in GEMMS] +
            [(f"S-GEMM({g})", f"only_{g}", FP32, ">1") for g in GEMMS] +
            [("Wgrad vs Fprop", "only_wgrad", "only_fprop", ">1"),
             ("Wgrad vs Dgrad", "only_wgrad", "only_dgrad", ">1")])


class StudyError(Exception):
    """Committed data that do not fit the study: one line."""


def load(directory):
    """{(seed, trajectory): (event, step)} from the blocks CSVs, checked against the summaries."""
    blocks = sorted(glob.glob(os.path.join(directory, "blocks_*.csv")))
    if not blocks:
        raise StudyError(f"no blocks_*.csv in {directory}")
    trajs = R.read_blocks(blocks)
    out = {}
    for (seed, _lr, name), t in trajs.items():
        out[(seed, name)] = R.excursion(t)
    binary = {}
    for path in sorted(glob.glob(os.path.join(directory, "summary_*.csv"))):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["status"] in ("complete", "diverged"):
                    step = int(r["excursion_step"])
                    binary[(int(r["seed"]), r["group"])] = (step >= 0, step if step >= 0 else int(r["excursion_censored_at"]))
    for key, ev in out.items():
        if key not in binary:
            raise StudyError(f"seed {key[0]} {key[1]}: in the loss blocks but not in a summary CSV")
        if binary[key] != ev:
            raise StudyError(f"seed {key[0]} {key[1]}: excursion from the blocks {ev} != the binary's {binary[key]}")
    if set(binary) != set(out):
        missing = sorted(set(binary) - set(out))[:3]
        raise StudyError(f"finished trajectories without loss blocks, e.g. {missing}")
    return out


def progress(events):
    """Rows (arm, n seeds, k excursions, Wilson lo, hi, median step) in a stable order."""
    arms = sorted({a for _, a in events}, key=lambda a: (a != FP32, a != MX_ALL, a))
    rows = []
    for a in arms:
        evs = [ev for (s, b), ev in events.items() if b == a]
        k = sum(e for e, _ in evs)
        lo, hi = wilson(k, len(evs))
        steps = [t for e, t in evs if e]
        rows.append((a, len(evs), k, lo, hi, statistics.median(steps) if steps else None))
    return rows


def family(events):
    """E1's 16 pre-registered tests on complete data: [(label, LogRank, Cox, holm p)]."""
    seeds = sorted({s for s, _ in events})
    if seeds != SEEDS:
        raise StudyError(f"the confirmatory tests need seeds 200-239; have {len(seeds)}")
    keys = sorted(events)
    time = [events[k][1] for k in keys]
    event = [events[k][0] for k in keys]
    seed = [k[0] for k in keys]
    arm = [k[1] for k in keys]
    res = []
    for label, a, ref, _ in E1_TESTS:
        pairs = P.make_pairs(time, event, seed, arm, a, ref)
        res.append((label, P.permutation_logrank(pairs), P.cox_stratified(pairs, ties="breslow")))
    adj = P.holm_family([(label, lr.p_perm) for label, lr, _ in res])
    return [(label, lr, cox, h) for (label, lr, cox), (_, _, h) in zip(res, adj)]


def markdown_progress(rows, n_expected):
    out = [f"| arm | seeds (of {n_expected}) | excursions (Wilson 95 %) | median step |", "|---|---|---|---|"]
    for a, n, k, lo, hi, med in rows:
        m = "-" if med is None else f"{med:.0f}"
        out.append(f"| {a} | {n} | {k}/{n} ({lo:.2f}–{hi:.2f}) | {m} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "why_mx", "e1"))
    a = ap.parse_args(argv)
    try:
        events = load(a.dir)
        seeds = sorted({s for s, _ in events})
        print(f"{os.path.basename(os.path.normpath(a.dir))}: {len(seeds)} of {len(SEEDS)} seeds finished ({', '.join(map(str, seeds))}); "
              f"excursion k=10, B=100, W=500; C++ and Python agree on all {len(events)} trajectories")
        print(markdown_progress(progress(events), len(SEEDS)))
        if seeds == SEEDS:
            print("\n| test | seeds with a first event arm/ref | permutation p | Holm p | HR (95 %) |\n|---|---|---|---|---|")
            for label, lr, cox, h in family(events):
                print(f"| {label} | {lr.arm_first}/{lr.ref_first} | {lr.p_perm:.3g} | {h:.3g} | {cox.hr:.3g} ({cox.lo:.3g}–{cox.hi:.3g}) |")
        else:
            print("\nconfirmatory tests: not run until all 40 seeds have finished (pre-registration)")
    except (StudyError, R.DataError, OSError) as e:
        print(f"why_mx: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
