#!/usr/bin/env python3
"""Re-analysis of results/README.md sections 10 and 11 and of the precursor test with events
known when they happen, from committed CSVs only (section 12 of that README is this script's
output; analysis/tests/test_reanalysis_excursion.py pins it).

Why: sections 10-11 count a trajectory as diverged at t when its loss stays above 10 x its running
minimum from t *until the run's last step* (stats_util.diverged_to_end). That event is known only at
the end of the run, depends on the run's length, keeps whatever excursion is under way at the last
step and drops every one that recovered. This script uses the primary event of lab/stats/README.md
("Events") instead:

  excursion   5 consecutive 100-step loss blocks (W = 500 steps) whose minimum exceeds 10 x the
              minimum of all blocks before them; reported at the first block's first step t, known
              at t + W; without one a trajectory is censored at steps_run - W. stats_util's
              excursion_block on the committed block minima (results/extract_loss_blocks.py's
              CSVs); W = 1000 and 2000 are reported descriptively.

Data (what is committed decides what can be recomputed):
  - results/fresh_seeds_20k/loss_blocks_*: shards 3-9 only (seeds 103-109 and 113-119, both lrs):
    14 seeds per lr for the arms floor_away, floor_even, rceil_even and their FP32 trajectory. The
    blocks of shards 0-2 were not extracted before their run files were gone.
  - results/code_faithful_20k/loss_blocks_*: all 10 shards (seeds 100-119, both lrs): FP32 and the
    code-faithful MX trajectory (`mx`, called code_faithful here).
  - The FP32 trajectory of a (seed, lr) is the same in both studies; the script checks that its
    block minima are equal on every (seed, lr) both have.
  - results/study_arms/ (section 10, 10,000 steps): summaries only, no loss blocks. The excursion
    cannot be recomputed there; the script gives the paired statistics of the old rule
    (diverged_to_end, lasting >= 500 steps), clearly labelled, and nothing else.
  - results/code_faithful_20k/series_*: the logged series (every 50 steps) of the precursor test.

Paired statistics (results/paired_stats.py): per comparison of an arm with a reference on the seeds
that have both, the within-seed permutation log-rank p (the exact sign test of which trajectory had
its excursion first) and the seed-stratified Cox hazard ratio (Breslow ties, as the
pre-registration results/prereg/why_mx.md fixes) with its 95 % interval; Firth's estimate beside
it. Holm over every test of one question (the families are named in FAMILIES). Where a question's
test is not significant: the power of that test by paired_stats.power (gamma frailty variance 0.5
as in the pre-registration, the reference's observed event rate, Holm over the family's m).
Family level ("do the MX arms fail where FP32 does not?"): the cluster bootstrap over seeds of the
difference in the Kaplan-Meier excursion fraction by step 19,500 and in the restricted mean
excursion-free time.

Precursors (section 11's risk-set test, results/precursors.py) against the *first spike*: the first
logged loss above 10 x the smallest logged before it (precursors.first_spike; the "spiked" of
section 11), whose window [t - 1500, t - 500) precedes the instability's onset by construction.
Two further event definitions as sensitivity: the documented spike rule of stats_util
(first_spike_step: a loss above 100 x the previous one) applied to the 50-step series, and the
excursion from the loss blocks. Per quantity: the mean percentile, its 95 % bootstrap interval over
events, the two-sided test against uniform ranks (Holm over the two quantities), and against a
strong precursor (mean percentile 0.70): P(mean percentile <= observed) when each event's rank is
drawn with an exponential tilt giving an expected percentile of 0.70, and the power of the test
against that alternative.

  python3 results/reanalysis_excursion.py [--bootstrap 10000] [--power-sims 2000]

numpy, scipy, statsmodels (through results/paired_stats.py).
"""
import argparse
import csv
import glob
import gzip
import math
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import paired_stats as ps  # noqa: E402
import precursors as pc  # noqa: E402
from stats_util import diverged_to_end, excursion_block, first_spike_step, holm, wilson  # noqa: E402

BLOCK = 100
FACTOR = 10.0
PRIMARY_W = 500
WINDOWS = (500, 1000, 2000)
TIES = "breslow"
FRAILTY_VAR = 0.5          # the pre-registration's power model
POWER_HRS = (0.25, 0.5, 2.0, 4.0)
STRONG = 0.70              # "a strong precursor": an expected mean percentile of 0.70
RNG_SEED = 2718
LR_NAME = {"0.0005": "5e-4", "0.0006": "6e-4"}
FRESH_ARMS = ("floor_away", "floor_even", "rceil_even")
CF = "code_faithful"       # the code-faithful study's `mx` trajectory

# The questions and their Holm families at the primary W (comparison: (arm, reference)).
FAMILIES = (
    ("MX arm vs FP32", [(a, "fp32") for a in FRESH_ARMS]),
    ("rounding and scale rule", [("floor_even", "floor_away"), ("rceil_even", "floor_even"),
                                 ("rceil_even", "floor_away")]),
    ("code-faithful MX vs FP32", [(CF, "fp32")]),
    ("code-faithful (bf16 γ, β) vs floor_away (MXFP8 γ, β)", [(CF, "floor_away")]),
)
STUDY10_FAMILIES = ("vs fp32", "vs floor_away")


class DataError(Exception):
    """Committed data that do not fit together: a one-line message naming the problem."""


# --------------------------------------------------------------------------- CSV files, plain or gzip

def open_csv(path):
    """A CSV file opened for csv.DictReader: gzip-compressed when its name ends in .gz (the committed
    loss blocks of the larger studies are, to keep the repository small), plain text otherwise."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", newline="")
    return open(path, newline="")


def csv_paths(directory, pattern):
    """The files `pattern`.csv and `pattern`.csv.gz in `directory` (pattern a glob without the
    suffix, e.g. "blocks_*"), sorted; one file present both ways is a DataError (which is the data?)."""
    plain = glob.glob(os.path.join(directory, pattern + ".csv"))
    packed = glob.glob(os.path.join(directory, pattern + ".csv.gz"))
    both = sorted(set(plain) & {p[:-3] for p in packed})
    if both:
        raise DataError(f"{both[0]} is there both plain and as .gz: keep one")
    return sorted(plain + packed)


# --------------------------------------------------------------------------- excursions from blocks

def optimizer_setting(row):
    """(eps, beta2) of a row of results/extract_loss_blocks.py as canonical strings (repr of the
    float: "1.0e-08" and "1e-08" are one setting), "" for a column that is absent or empty (a CSV
    written before the columns existed)."""
    def canon(v):
        return repr(float(v)) if v else ""
    return canon(row.get("eps")), canon(row.get("beta2"))


def trajectory_of(run_id, name, blocks, block=BLOCK, branches=False):
    """One run's trajectory as read_blocks gives it ({'run_id', 'first', 'mins', 'steps_run',
    'absorbing', 'partial'}) from its rows of a blocks CSV (any order); DataError unless they are
    consecutive `block`-step blocks from step 0 (with `branches`: from the first one), only the
    last partial."""
    blocks = sorted(blocks, key=lambda b: int(b["block_start"]))
    starts = [int(b["block_start"]) for b in blocks]
    sizes = [int(b["steps"]) for b in blocks]
    first = starts[0] if branches else 0
    if starts != [first + block * i for i in range(len(blocks))] or any(s != block for s in sizes[:-1]):
        raise DataError(f"run {run_id} {name}: blocks are not consecutive {block}-step blocks from "
                        f"{'its first one' if branches else 'step 0'}")
    last = blocks[-1]["last"]
    return {"run_id": run_id, "first": first, "mins": [float(b["min"]) if b["min"] else math.inf for b in blocks],
            "steps_run": sum(sizes), "absorbing": not (last and math.isfinite(float(last))),
            "partial": sizes[-1] != block}


def blocks_by_run(paths):
    """{(run_id, trajectory): [rows]} of results/extract_loss_blocks.py CSVs, the rows as csv gives
    them: for a study with several runs of one (seed, lr), which read_blocks would merge."""
    rows = {}
    for path in paths:
        with open_csv(path) as f:
            for r in csv.DictReader(f):
                rows.setdefault((r["run_id"], r["trajectory"]), []).append(r)
    return rows


def read_blocks(paths, block=BLOCK, branches=False, optimizer=False):
    """{(seed, lr, trajectory): {'run_id', 'first', 'mins', 'steps_run', 'absorbing', 'partial'}}
    from results/extract_loss_blocks.py CSVs. Blocks must run from step 0 (with `branches`: from
    the trajectory's first step `first`, a branch's `at`) in steps of `block`, only the last may
    be partial; `min` empty (no finite loss) reads as +inf; absorbing: the trajectory's last loss is not finite (it
    counts as non-finite from then on, as stats_util.excursion_step has it). A trajectory given
    twice must agree (a rerun), else DataError. With `optimizer` the keys are
    (seed, lr, eps, beta2, trajectory) (optimizer_setting; "" in CSVs without the columns): a
    sweep over Adam's settings trains trajectories of the same name in several runs of a seed.
    Without it, runs of one (seed, lr, trajectory) at different recorded (eps, beta2) are a
    DataError, not taken as reruns."""
    rows = {}
    for path in paths:
        with open_csv(path) as f:
            for r in csv.DictReader(f):
                setting = optimizer_setting(r)
                key = ((int(r["seed"]), r["lr"]) + (setting if optimizer else ()) + (r["trajectory"],))
                rows.setdefault(key, {}).setdefault(r["run_id"], []).append((setting, r))
    out = {}
    for key, runs in rows.items():
        traj = None
        settings = {s for blocks in runs.values() for s, _ in blocks if s != ("", "")}  # "": not recorded
        if len(settings) > 1:
            raise DataError(f"seed {key[0]} lr {key[1]} {key[-1]}: runs at different Adam settings (eps, beta2) "
                            f"{sorted(settings)} under one name; read them apart (read_blocks(..., optimizer=True))")
        for rid, blocks in runs.items():
            t = trajectory_of(rid, key[-1], [b for _, b in blocks], block, branches)
            if traj is not None and (t["mins"], t["steps_run"]) != (traj["mins"], traj["steps_run"]):
                raise DataError(f"seed {key[0]} lr {key[1]} {key[-1]}: runs {traj['run_id']} and {rid} differ")
            traj = traj or t
        out[key] = traj
    return out


def excursion(traj, window=PRIMARY_W, factor=FACTOR, block=BLOCK):
    """(event, step) of stats_util.excursion_step for a trajectory of read_blocks (of `block`-step
    blocks): the same block rule on its block minima (a trailing partial block is not used unless
    the trajectory ends non-finite, and then W / B blocks of +inf follow); censored at
    first + steps_run - window (not before first)."""
    if window % block or window < block:
        raise ValueError(f"window {window} must be a positive multiple of {block}")
    first = traj.get("first", 0)
    b = excursion_block(event_mins(traj, window, block), factor, window // block)
    if b >= 0:
        return True, first + b * block
    return False, first + max(traj["steps_run"] - window, 0)


def event_mins(traj, window=PRIMARY_W, block=BLOCK):
    """The block minima the excursion rule reads of a trajectory of read_blocks: a trailing
    partial block left out, or, when it ends non-finite, window / block blocks of +inf after it."""
    mins = list(traj["mins"])
    if traj["absorbing"]:
        mins += [math.inf] * (window // block)
    elif traj["partial"]:
        mins = mins[:-1]
    return mins


def load_studies(fresh_dir, cf_dir):
    """(trajectories {(seed, lr, arm): traj}, notes): the fresh study's arms and FP32, the
    code-faithful study's MX as `code_faithful` and its FP32 (the same trajectory: checked equal
    where both studies have it; FP32 of a seed only the code-faithful study has is taken from it)."""
    fresh = read_blocks(csv_paths(fresh_dir, "loss_blocks_*"))
    cf = read_blocks(csv_paths(cf_dir, "loss_blocks_*"))
    if not fresh or not cf:
        raise DataError(f"no loss_blocks_*.csv in {fresh_dir if not fresh else cf_dir}")
    out = dict(fresh)
    shared = 0
    for (seed, lr, t), traj in cf.items():
        if t == "mx":
            out[(seed, lr, CF)] = traj
        elif t == "fp32":
            if (seed, lr, "fp32") in fresh:
                f = fresh[(seed, lr, "fp32")]
                if (f["mins"], f["steps_run"]) != (traj["mins"], traj["steps_run"]):
                    raise DataError(f"seed {seed} lr {lr}: the FP32 trajectory differs between the studies")
                shared += 1
            else:
                out[(seed, lr, "fp32")] = traj
    return out, {"fp32_shared_equal": shared, "cf_blocks": cf,
                 "fresh_seeds": sorted({s for s, _, t in fresh if t != "fp32"}),
                 "cf_seeds": sorted({s for s, _, t in cf})}


def events(trajs, window):
    """{(seed, lr, arm): (event, step)} at `window`."""
    return {k: excursion(t, window) for k, t in trajs.items()}


def seeds_of(ev, lr, arm):
    return sorted(s for s, l, a in ev if l == lr and a == arm)


# --------------------------------------------------------------------------- paired comparisons

def pairs(ev, lr, arm, ref):
    """paired_stats.Pairs of `arm` vs `ref` at `lr` over the seeds that have both."""
    seeds = sorted(set(seeds_of(ev, lr, arm)) & set(seeds_of(ev, lr, ref)))
    get = lambda a, i: np.array([ev[(s, lr, a)][i] for s in seeds], dtype=float if i else bool)
    return ps.Pairs(seeds, get(arm, 1), get(arm, 0), get(ref, 1), get(ref, 0))


def compare(p):
    """{'n', 'ev_ref', 'ev_arm', 'b', 'c', 'p', 'cox'} of one Pairs: permutation log-rank, Cox."""
    lr = ps.permutation_logrank(p)
    return {"n": lr.n_pairs, "ev_ref": int(p.e_ref.sum()), "ev_arm": int(p.e_arm.sum()),
            "b": lr.arm_first, "c": lr.ref_first, "p": lr.p_perm, "cox": ps.cox_stratified(p, ties=TIES)}


def lrs_of(ev):
    return sorted({lr for _, lr, _ in ev}, key=float)


def family_tests(ev, families=FAMILIES):
    """[(family, lr, arm, ref, result, Holm p)]: every (comparison x lr) of a family is one test of
    its question, Holm over them."""
    out = []
    for name, comps in families:
        tests = [(lr, a, r, compare(pairs(ev, lr, a, r))) for a, r in comps for lr in lrs_of(ev)]
        adj = holm([t[3]["p"] for t in tests])
        out += [(name, lr, a, r, res, q) for (lr, a, r, res), q in zip(tests, adj)]
    return out


def g(x, digits=2):
    """A number as the tables print it: `digits` significant figures (no exponent from 100 up), inf,
    or – for NaN."""
    if x != x:
        return "–"
    if x == math.inf:
        return "inf"
    text = f"{x:.{digits}g}"
    return f"{float(text):.0f}" if abs(x) >= 100 else text


def hr_cell(cx):
    if cx.kind == "none":
        return "– (no informative pair)"
    if cx.kind == "+inf":
        return f"inf [{g(cx.lo)}, inf)"
    if cx.kind == "0":
        return f"0 (0, {g(cx.hi)}]"
    return f"{g(cx.hr)} [{g(cx.lo)}, {g(cx.hi)}]"


def firth_cell(cx):
    return "–" if cx.kind == "none" else f"{g(cx.firth_hr)} [{g(cx.firth_lo)}, {g(cx.firth_hi)}]"


def event_table(ev_by_w):
    """Per lr and arm: seeds, events k/n (Wilson 95 %) at each W, the median excursion step at the
    primary W."""
    ws = sorted(ev_by_w)
    lines = ["| lr | trajectory | seeds | " + " | ".join(f"W = {w}: excursions (Wilson 95 %)" for w in ws) +
             f" | median excursion step (W = {PRIMARY_W}) |", "|---|---|---|" + "---|" * (len(ws) + 1)]
    prim = ev_by_w[PRIMARY_W]
    for lr in lrs_of(prim):
        for arm, label in (("fp32", None), ("floor_away", None), ("floor_even", None), ("rceil_even", None),
                           ("fp32", "all"), (CF, None)):
            seeds = seeds_of(prim, lr, arm)
            if label is None and arm == "fp32":
                fresh = set(seeds_of(prim, lr, "floor_away"))
                seeds = [s for s in seeds if s in fresh]
            if not seeds:
                continue
            name = arm + (f" (seeds {seeds[0]}–{seeds[-1]})" if label else "")
            cells = []
            for w in ws:
                k = sum(ev_by_w[w][(s, lr, arm)][0] for s in seeds)
                lo, hi = wilson(k, len(seeds))
                cells.append(f"{k}/{len(seeds)} ({lo:.2f}–{hi:.2f})")
            steps = [prim[(s, lr, arm)][1] for s in seeds if prim[(s, lr, arm)][0]]
            med = f"{statistics.median(steps):.0f}" if steps else "–"
            lines.append(f"| {LR_NAME.get(lr, lr)} | {name} | {len(seeds)} | " + " | ".join(cells) + f" | {med} |")
    return "\n".join(lines)


def tests_table(rows):
    lines = ["| question (Holm family) | lr | arm vs reference | seeds | excursions ref / arm | first: arm / ref | "
             "HR [95 % CI] | Firth HR [95 % CI] | permutation p | Holm p |", "|---|---|---|---|---|---|---|---|---|---|"]
    for fam, lr, a, r, res, q in rows:
        m = sum(1 for x in rows if x[0] == fam)
        lines.append(f"| {fam} (m = {m}) | {LR_NAME.get(lr, lr)} | {a} vs {r} | {res['n']} | "
                     f"{res['ev_ref']} / {res['ev_arm']} | {res['b']} / {res['c']} | {hr_cell(res['cox'])} | "
                     f"{firth_cell(res['cox'])} | {g(res['p'])} | {g(q)}{' *' if q < 0.05 else ''} |")
    return "\n".join(lines)


def descriptive_table(ev_by_w, families=FAMILIES):
    """Every comparison of the families at the other W (not tests: no Holm)."""
    ws = [w for w in sorted(ev_by_w) if w != PRIMARY_W]
    lines = ["| lr | arm vs reference | " + " | ".join(f"W = {w}: ref / arm; first arm / ref; HR [95 % CI]"
                                                     for w in ws) + " |", "|---|---|" + "---|" * len(ws)]
    for _, comps in families:
        for a, r in comps:
            for lr in lrs_of(ev_by_w[PRIMARY_W]):
                cells = []
                for w in ws:
                    res = compare(pairs(ev_by_w[w], lr, a, r))
                    cells.append(f"{res['ev_ref']} / {res['ev_arm']}; {res['b']} / {res['c']}; {hr_cell(res['cox'])}")
                lines.append(f"| {LR_NAME.get(lr, lr)} | {a} vs {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def power_rows(rows, sims):
    """For every test of `rows` not significant after Holm: its power (paired_stats.power) at the
    hazard ratios POWER_HRS, with n = its pairs, p0 = the reference's observed rate (clipped to
    [0.05, 0.95]) and m = its family's size."""
    out = []
    for fam, lr, a, r, res, q in rows:
        if q < 0.05:
            continue
        m = sum(1 for x in rows if x[0] == fam)
        p0 = min(0.95, max(0.05, res["ev_ref"] / res["n"]))
        pw = [ps.power(res["n"], p0, hr, m=m, frailty_var=FRAILTY_VAR, sims=sims)["power"] for hr in POWER_HRS]
        out.append((fam, lr, a, r, res["n"], p0, m, pw))
    return out


def power_table(prows):
    lines = ["| lr | arm vs reference | seeds | reference's P(excursion) | m | " +
             " | ".join(f"power at HR {h:g}" for h in POWER_HRS) + " |", "|---|---|---|---|---|" + "---|" * len(POWER_HRS)]
    for fam, lr, a, r, n, p0, m, pw in prows:
        lines.append(f"| {LR_NAME.get(lr, lr)} | {a} vs {r} | {n} | {p0:.2f} | {m} | " +
                     " | ".join(f"{x:.2f}" for x in pw) + " |")
    return "\n".join(lines)


def bootstrap_table(ev, draws, tau=None):
    """Cluster bootstrap over seeds (paired_stats.cluster_bootstrap) of arm - FP32 per lr: the fresh
    arms and their mean on their seeds, and the code-faithful MX on its own."""
    lines = ["| lr | arm − FP32 | seeds | excursion fraction by τ [95 %] | p | restricted mean excursion-free steps "
             "[95 %] | p |", "|---|---|---|---|---|---|---|"]
    taus = set()
    for lr in lrs_of(ev):
        for arms in (list(FRESH_ARMS), [CF]):
            seeds = set(seeds_of(ev, lr, arms[0]))
            keys = [(s, lr, a) for s in sorted(seeds) for a in ["fp32"] + arms]
            t, brows = ps.cluster_bootstrap([ev[k][1] for k in keys], [ev[k][0] for k in keys],
                                            [k[0] for k in keys], [k[2] for k in keys], "fp32", arms=arms,
                                            tau=tau, draws=draws)
            taus.add(t)
            for b in brows:
                lines.append(f"| {LR_NAME.get(lr, lr)} | {b.arm} | {len(seeds)} | {b.d_event:+.2f} "
                             f"[{b.d_event_lo:+.2f}, {b.d_event_hi:+.2f}] | {g(b.p_event)} | {b.d_rmst:+.0f} "
                             f"[{b.d_rmst_lo:+.0f}, {b.d_rmst_hi:+.0f}] | {g(b.p_rmst)} |")
    return "\n".join(lines), sorted(taus)


# --------------------------------------------------------------------------- section 10: the old rule

def study10(arms_dir, sustained=PRIMARY_W):
    """Section 10's paired statistics under the old rule (diverged to the end, lasting >= sustained
    steps; censored at steps_run - sustained), every trajectory of every run (an interrupted run's
    too, censored where it stopped): [(family, arm, ref, result, Holm p)], families vs FP32 and vs
    floor_away."""
    import study_arms as sa

    runs = sa.load_all(arms_dir)
    ev = {}
    for groups in runs.values():
        for arm, row in groups.items():
            ev[(int(row["seed"]), "0.0005", arm)] = diverged_to_end(row, sustained)
    arms = sa.arm_order({a for _, _, a in ev}, "floor_away")
    out = []
    for fam, ref in zip(STUDY10_FAMILIES, ("fp32", "floor_away")):
        comps = [a for a in arms if a not in ("fp32", ref)]
        res = [compare(pairs(ev, "0.0005", a, ref)) for a in comps]
        for a, x, q in zip(comps, res, holm([x["p"] for x in res])):
            out.append((fam, a, ref, x, q))
    return out, len({s for s, _, _ in ev})


def study10_table(rows):
    lines = ["| family | arm vs reference | seeds | diverged ≥ 500 steps (old rule) ref / arm | first: arm / ref | "
             "HR [95 % CI] | permutation p | Holm p |", "|---|---|---|---|---|---|---|---|"]
    for fam, a, r, res, q in rows:
        m = sum(1 for x in rows if x[0] == fam)
        lines.append(f"| {fam} (m = {m}) | {a} vs {r} | {res['n']} | {res['ev_ref']} / {res['ev_arm']} | "
                     f"{res['b']} / {res['c']} | {hr_cell(res['cox'])} | {g(res['p'])} | {g(q)}{' *' if q < 0.05 else ''} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- precursors at the first spike

def series_losses(d, run_id, trajectory):
    """[(step, loss)] of one trajectory's logged series, in step order."""
    with open(os.path.join(d, f"series_{run_id}.csv"), newline="") as f:
        return sorted((int(r["step"]), float(r["loss"])) for r in csv.DictReader(f) if r["trajectory"] == trajectory)


def precursor_subjects(series_dirs, trajectory, rule, blocks=None):
    """precursors.py subjects with the event `rule`:
      first_spike       the first logged loss above 10 x the smallest logged before it (primary);
      first_spike_step  stats_util.first_spike_step (a loss above 100 x the previous one) on the
                        logged series (every 50 steps), censored at steps_run;
      excursion         the excursion (W = 500) from the loss blocks, censored at steps_run - 500
                        (`blocks`: read_blocks of the study)."""
    subjects = pc.load(series_dirs, trajectory, PRIMARY_W, "spike", FACTOR)
    if rule == "first_spike":
        return subjects
    where = {}
    for d in series_dirs:
        with open(os.path.join(d, "runs.csv"), newline="") as f:
            for r in csv.DictReader(f):
                if r["trajectory"] == trajectory and r["kind"] == "trajectory":
                    where[r["run_id"]] = (d, r)
    out = []
    for rid, lr, _, _, series in subjects:
        d, row = where[rid]
        if rule == "first_spike_step":
            losses = series_losses(d, rid, trajectory)
            i = first_spike_step([v for _, v in losses])
            event, time = (True, losses[i][0]) if i >= 0 else (False, int(row["steps_run"]))
        elif rule == "excursion":
            traj = blocks[(int(row["seed"]), row["lr"], trajectory)]
            if traj["run_id"] != rid:
                raise DataError(f"run {rid}: its loss blocks are those of run {traj['run_id']}")
            event, time = excursion(traj)
        else:
            raise ValueError(f"unknown event rule {rule!r}")
        out.append((rid, lr, event, time, series))
    return out


def tilt_probs(m, mean):
    """Probabilities of ranks k = 0..m (percentile k / m) proportional to exp(theta k / m), theta
    such that the expected percentile is `mean` (0.5: uniform, the null)."""
    k = np.arange(m + 1) / m

    def mu(theta):
        w = np.exp(theta * (k - 1.0))
        return float((w * k).sum() / w.sum())

    lo, hi = -60.0, 60.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mu(mid) < mean else (lo, mid)
    w = np.exp((lo + hi) / 2 * (k - 1.0))
    return w / w.sum()


def mean_percentiles(sizes, mean, draws, rng):
    """`draws` mean percentiles of events with risk sets of `sizes` when each event's rank follows
    tilt_probs(m, mean)."""
    total = np.zeros(draws)
    for m in sizes:
        total += rng.choice(m + 1, size=draws, p=tilt_probs(m, mean)) / m
    return total / len(sizes)


def precursor_stats(rows, draws, alpha):
    """(95 % bootstrap interval of the mean percentile over events, P(mean <= observed | strong),
    power of the two-sided uniform-rank test at `alpha` against the strong alternative) of the
    per-event rows of precursors.analyse."""
    rng = np.random.default_rng(RNG_SEED)
    pcts = np.array([r[6] for r in rows])
    sizes = [r[5] for r in rows]
    boot = pcts[rng.integers(0, len(pcts), size=(draws, len(pcts)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    strong = mean_percentiles(sizes, STRONG, draws, rng)
    p_strong = float(np.mean(strong <= pcts.mean() + 1e-12))
    null = mean_percentiles(sizes, 0.5, draws, rng)
    crit = np.quantile(np.abs(null - 0.5), 1 - alpha)
    power = float(np.mean(np.abs(strong - 0.5) > crit))
    return float(lo), float(hi), p_strong, power


RULES = (("first_spike", "first spike: logged loss > 10 × the smallest logged before it (primary)"),
         ("first_spike_step", "first_spike_step: logged loss > 100 × the previous logged one"),
         ("excursion", "excursion, W = 500 (loss blocks)"))


def precursors(series_dirs, blocks, draws, trajectories=("mx",)):
    """[(trajectory, rule label, trajectories, events, [(quantity label, used, mean, lo, hi, p, Holm,
    P(<= obs | strong), power)])]."""
    out = []
    for traj in trajectories:
        for rule, label in RULES:
            subjects = precursor_subjects(series_dirs, traj, rule, blocks)
            res = [(ql,) + pc.analyse(subjects, q, 500, 1000, 1000) for q, ql in pc.QUANTITIES]
            res = [r for r in res if r[3] is not None]  # a quantity without logged values (FP32's ζ²)
            adj = iter(holm([r[4] for r in res]))
            qs = []
            for ql, rows, _, mean, p in res:
                lo, hi, p_strong, power = precursor_stats(rows, draws, 0.05 / len(res))
                qs.append((ql, len(rows), mean, lo, hi, p, next(adj), p_strong, power))
            out.append((traj, label, len(subjects), sum(1 for s in subjects if s[2]), qs))
    return out


def precursor_table(res, draws):
    lines = ["| trajectory | event | events (of trajectories) | quantity | events used | mean percentile "
             "[95 % bootstrap] | p vs uniform | Holm | P(≤ observed if strong, 0.70) | power vs 0.70 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for traj, label, n, k, qs in res:
        for ql, used, mean, lo, hi, p, q, p_strong, power in qs:
            strong = f"< {1 / draws:.0e}" if p_strong == 0 else g(p_strong)
            lines.append(f"| {traj} | {label} | {k} ({n}) | {ql} | {used} | {mean:.2f} [{lo:.2f}, {hi:.2f}] | "
                         f"{g(p)} | {g(q)} | {strong} | {power:.2f} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI

def report(fresh_dir, cf_dir, arms_dir, draws, sims):
    """The whole re-analysis as text (section 12 of results/README.md) and its numbers."""
    trajs, notes = load_studies(fresh_dir, cf_dir)
    ev_by_w = {w: events(trajs, w) for w in WINDOWS}
    ev = ev_by_w[PRIMARY_W]
    rows = family_tests(ev)
    prows = power_rows(rows, sims)
    horizon = max(t["steps_run"] for t in trajs.values())
    boot, taus = bootstrap_table(ev, draws, tau=horizon - PRIMARY_W)
    s10, s10_seeds = study10(arms_dir)
    series_dirs = sorted(d for d in glob.glob(os.path.join(cf_dir, "series_*")) if os.path.isdir(d))
    pre = precursors(series_dirs, notes["cf_blocks"], draws, ("mx", "fp32"))
    out = [f"Loss blocks: fresh_seeds_20k seeds {', '.join(map(str, notes['fresh_seeds']))} (14 per lr); "
           f"code_faithful_20k seeds {notes['cf_seeds'][0]}–{notes['cf_seeds'][-1]}; the FP32 trajectory's block "
           f"minima are equal in both studies on all {notes['fp32_shared_equal']} (seed, lr) they share.",
           "", "Excursions per trajectory (k = 10, B = 100):", "", event_table(ev_by_w), "",
           f"Tests at W = {PRIMARY_W} (within-seed permutation log-rank; Cox stratified by seed, {TIES} ties; "
           "Holm within each question; * Holm p < 0.05):", "", tests_table(rows), "",
           "The same comparisons at the other windows (descriptive, no test):", "", descriptive_table(ev_by_w), "",
           f"Power of the tests above that are not significant (paired_stats.power: {sims} simulated studies, "
           f"gamma frailty variance {FRAILTY_VAR}, Holm over the family's m):", "", power_table(prows), "",
           f"Cluster bootstrap over seeds, {draws} draws, τ = {', '.join(f'{t:g}' for t in taus)} (the family-level "
           "question):", "", boot, "",
           f"Section 10 (10,000 steps, {s10_seeds} seeds): no loss blocks are committed, so the excursion cannot be "
           "recomputed; the old rule (diverged to the end, lasting ≥ 500 steps: it looks into the future) with the "
           "paired statistics:", "", study10_table(s10), "",
           f"Precursors at the first spike (code-faithful series, window [t − 1500, t − 500), burn-in 1000; "
           f"{draws} draws for the intervals and the strong alternative; power at α = 0.05 / (quantities tested), Holm's first step):", "",
           precursor_table(pre, draws)]
    return "\n".join(out), {"ev_by_w": ev_by_w, "rows": rows, "power": prows, "study10": s10,
                            "precursors": pre, "notes": notes, "taus": taus}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fresh", default=os.path.join(HERE, "fresh_seeds_20k"), help="fresh_seeds_20k's directory")
    ap.add_argument("--code-faithful", default=os.path.join(HERE, "code_faithful_20k"),
                    help="code_faithful_20k's directory (loss blocks and series)")
    ap.add_argument("--arms", default=os.path.join(HERE, "study_arms"), help="section 10's summaries")
    ap.add_argument("--bootstrap", type=int, default=10_000, help="draws of the bootstraps (default 10000)")
    ap.add_argument("--power-sims", type=int, default=2000, help="simulated studies per power (default 2000)")
    a = ap.parse_args(argv)
    if a.bootstrap < 100 or a.power_sims < 100:
        ap.error("--bootstrap and --power-sims must be >= 100")
    try:
        text, _ = report(a.fresh, a.code_faithful, a.arms, a.bootstrap, a.power_sims)
    except DataError as e:
        print(f"reanalysis_excursion: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
