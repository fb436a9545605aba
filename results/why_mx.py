#!/usr/bin/env python3
"""The causal study's analysis (pre-registered in results/prereg/why_mx.md), from the committed
CSVs of results/why_mx/<experiment>/: the 100-step loss blocks (results/extract_loss_blocks.py)
and `mxlab summarize --csv` of the same runs.

    python3 results/why_mx.py [--dir results/why_mx/e1] [--markdown]
    python3 results/why_mx.py e2 [--dir results/why_mx/e2]
    python3 results/why_mx.py e3 [--dir results/why_mx/e3] [--e1 results/why_mx/e1]
                                 [--figure PNG [--confirm results/why_mx/confirm_adam]]
    python3 results/why_mx.py e4 [--dir results/why_mx/e4] [--e1 results/why_mx/e1] [--figure PNG]
    python3 results/why_mx.py q0 [--dir results/why_mx/paper_emulator] [--e1 results/why_mx/e1]
    python3 results/why_mx.py confirm [--dir results/why_mx/confirm]

For every trajectory the excursion (k = 10, B = 100, W = 500) is computed from its loss blocks
and checked against the binary's `excursion_step` in the summary CSV (the C++ and Python
definitions must agree on the study's own data). Until every pre-registered seed has run, only
the progress table (per arm: seeds, excursions with a Wilson 95 % interval, median step) is
printed: the confirmatory tests of E1's family run once, on all 40 seeds, as the
pre-registration fixes them (within-seed permutation log-rank, seed-stratified Cox with Breslow
ties, Holm over the 16 tests).

`e2`: the second experiment ("E2 - the state or the dynamics?"), from results/why_mx/e2/: the
summaries, the loss blocks (branches' from their `at`) and, when there, the branch points
(results/extract_branchpoints.py). For every branch of every finished seed the endpoint (an
excursion with onset in [b, b + 2000) on the joined series: the parent's blocks before b, the
branch's from b) and its control's (the parent's own series, same window), and whether the
(seed, b) pair is at risk (the parent had no excursion before b), are computed from the blocks
and checked against the binary's columns (at_risk, branch_excursion_step, ...). The family (exact
McNemar over the at-risk pairs' discordant pairs, conditional odds ratio with its exact interval,
Holm over m = 2, the verdicts) runs once every seed has all three branch points.

`e3` ("E3 - bias, variance or Adam?"): each seed has three runs, one per Adam setting of
experiments/paper/why_mx_e3.yaml ((eps, beta2) = (1e-8, 0.999) with mx_all, noise_mx and
mx_sr_grad; (1e-6, 0.999) and (1e-8, 0.95) with mx_all), whose trajectories have the same names:
they are told apart by the eps and beta2 columns of the loss blocks (results/extract_loss_blocks.py)
and named `<trajectory>@eps=1e-6` / `@beta2=0.95` outside the default setting; a summary row gets
its run's setting by run_id. Progress per (setting, trajectory); on all 40 seeds of every
trajectory the family of m = 6 (Holm): noise_mx vs fp32 (Variance suffices, HR > 1, falsified if
the upper bound < 2), noise_mx vs mx_all (Bias matters), mx_sr_grad vs mx_all, eps 1e-6 MX and beta2
0.95 MX vs the default mx_all (each HR < 1, falsified if the lower bound > 0.5), and eps 1e-6 FP32 vs
the default FP32 (two-sided: significant or not, no verdict); comparisons across settings pair a
seed's trajectories of different runs. A test both significant in its direction and falsified (a
significant effect smaller than the one needed) is reported as "mixed". Every trajectory against
the default mx_all and fp32 is given descriptively, and so is each trajectory's loss level (the
median over the seeds of the median block minimum over its last 2,000 steps). The amendment of
2026-11-28 classifies MX-all at each other Adam setting as E4 classifies a recipe (below), against
the default setting's mx_all and fp32. --figure writes the Kaplan-Meier curves of E3's
trajectories, with --confirm a second panel of the confirmation's.

`e4` ("E4 - fixes from the literature"): progress; on all 40 seeds the family of m = 6 (rot_e1
runs: E1's N-GEMM(fprop) was significant): rot_all, rand_rot_sr and rot_e1 each vs mx_all (HR < 1,
falsified if the lower bound > 0.5) and vs fp32 (two-sided), Holm, and the classification: a fix
(HR vs fp32 with a 95 % interval not above 1, i.e. lower bound <= 1, and upper bound < 1.5), else
a candidate fix (HR vs mx_all <= 0.25 and an interval vs fp32 not above 1); either is confirmed on
seeds 240-259 at lr 6e-4 before it is called one; else none. "Not above 1" (the amendment of
2026-11-28) reads the pre-registration's "containing 1" as the "no less stable than FP32" it stands
for: a recipe that also removes FP32's own excursions is not excluded for being better. With no
fix and no candidate the report says the confirmation is not run. Beside the tests, descriptive:
every arm against mx_all and fp32, the recipes against each other (E4_BETWEEN: deterministic
against randomised rotations with stochastic rounding, all GEMMs against E1's) and each arm's loss
level as e3 gives it. --figure writes the Kaplan-Meier curves of E4's arms.

`confirm` (the amendments of 2026-11-27 and 2026-11-28: confirming E4's candidate fixes and E3's
Adam settings): seeds 240-259 at lr 6e-4, the default setting's fp32 and mx_all trajectories and
every other MX trajectory of the run set as a recipe to confirm (a run set over Adam settings, as
experiments/paper/why_mx_confirm_adam.yaml, names them as e3 does: mx_all@beta2=0.95; FP32 at
another setting is shown, not a recipe); progress, and on all 20 seeds per recipe (a) recipe vs
mx_all (HR < 1) and (b) recipe vs fp32 (two-sided), Holm over all of them (m = 2 x recipes), and
the reading: "the fix" when (a) is significant with HR < 1 and (b)'s 95 % interval is not above 1
with upper bound < 1.5; "confirmed" when (a) is and (b)'s interval is not above 1 without that
bound; else "not confirmed". For a run set over Adam settings it also shows, not as tests, FP32
at the setting vs the default FP32 and MX-all vs FP32 at the setting; and the loss levels as e3
gives them. Loss blocks of another lr or of seeds outside 240-259 are an error (exit 2).

`q0` (Question 0, "E1" and its amendment): fp32, paper_emulator and mx_ops from the paper_emulator
run set, mx_all of the same seeds from E1; progress, and on all 40 seeds the four tests (mx_all vs
paper_emulator, mx_all vs mx_ops, paper_emulator vs fp32, mx_ops vs fp32; Holm over m = 4). The
pre-registration gives Question 0 directions ("diverge more often") but no falsification rule and
the primary test is two-sided: the tests are two-sided and the direction only reads a significant
result (in or against the question's direction).

The pairing check (e3, e4, q0): the trajectories that are E1's (the default setting's fp32 and
mx_all in E3, fp32 and mx_all in E4, fp32 of the paper_emulator run set) must have E1's loss blocks
bit for bit, every column as written; a difference, or a seed E1 lacks, stops the analysis (exit
2). The count checked is printed."""
import argparse
import csv
import functools
import glob
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paired_stats as P  # noqa: E402
import reanalysis_excursion as R  # noqa: E402
from stats_util import conditional_odds_ratio, excursion_block, holm, mcnemar_exact, wilson  # noqa: E402

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
    return {k: R.excursion(t) for k, t in checked_trajectories(directory).items()}


def checked_trajectories(directory):
    """{(seed, trajectory): trajectory of reanalysis_excursion.read_blocks} of the blocks CSVs in
    `directory`, once the excursion (k = 10, B = 100, W = 500) of each equals the binary's in the
    summary CSVs and every finished trajectory has its blocks (else a StudyError): for an analysis
    that reads more of the blocks than the primary event (results/flash_study.py's k = 2)."""
    blocks = R.csv_paths(directory, "blocks_*")
    if not blocks:
        raise StudyError(f"no blocks_*.csv in {directory}")
    trajs = {(seed, name): t for (seed, _lr, name), t in R.read_blocks(blocks).items()}
    out = {k: R.excursion(t) for k, t in trajs.items()}
    seeds = _run_seeds(blocks)
    binary = {}
    for path in sorted(glob.glob(os.path.join(directory, "summary_*.csv"))):
        with R.open_csv(path) as f:
            for r in csv.DictReader(f):
                if r["status"] in ("complete", "diverged"):
                    binary[(_summary_seed(r, seeds), r["group"])] = _binary_excursion(r)
    _agree(out, binary)
    return trajs


def block_values(directory, of_row):
    """The set of of_row(row) over the rows of the loss blocks CSVs in `directory`."""
    out = set()
    for path in R.csv_paths(directory, "blocks_*"):
        with R.open_csv(path) as f:
            out |= {of_row(r) for r in csv.DictReader(f)}
    return out


def block_lrs(directory):
    """The learning rates (the `lr` column, as written) of the loss blocks CSVs in `directory`."""
    return block_values(directory, lambda r: r["lr"])


def _run_seeds(paths):
    """{run_id: seed} of the loss blocks CSVs `paths`."""
    out = {}
    for path in paths:
        with R.open_csv(path) as f:
            for r in csv.DictReader(f):
                out[r["run_id"]] = int(r["seed"])
    return out


def _summary_seed(row, run_seeds):
    """The seed of a summary row: its `seed` column, or, where the CSV has none, its run's seed in
    the loss blocks. `mxlab summarize --csv` always writes the column now; binaries before that
    change (73f069c, which E1 and the paper_emulator set run with) left it out of a directory with
    one seed."""
    if row.get("seed"):
        return int(row["seed"])
    if row["run_id"] not in run_seeds:
        raise StudyError(f"run {row['run_id']} finished but has no loss blocks")
    return run_seeds[row["run_id"]]


def _binary_excursion(row):
    """(event, step) of a finished trajectory's `mxlab summarize --csv` row."""
    step = int(row["excursion_step"])
    return step >= 0, step if step >= 0 else int(row["excursion_censored_at"])


def _agree(out, binary):
    """The excursions from the blocks `out` equal the binary's `binary`, trajectory for trajectory,
    and every finished trajectory has its blocks; else a StudyError."""
    for key, ev in out.items():
        if key not in binary:
            raise StudyError(f"seed {key[0]} {key[1]}: in the loss blocks but not in a summary CSV")
        if binary[key] != ev:
            raise StudyError(f"seed {key[0]} {key[1]}: excursion from the blocks {ev} != the binary's {binary[key]}")
    if set(binary) != set(out):
        missing = sorted(set(binary) - set(out))[:3]
        raise StudyError(f"finished trajectories without loss blocks, e.g. {missing}")


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
    return run_family(events, E1_TESTS)


# The pre-registered verdict rules ("Verdicts" and "E1"): supported when the Holm-adjusted p is
# below ALPHA and the HR lies in the hypothesis's direction; falsified when the HR's 95 % interval
# excludes the effect the hypothesis needs; otherwise undecided.
ALPHA = 0.05
N_FALSIFY_HI, N_FALSIFY_LO = 0.5, 0.19  # N-*: falsified if hi >= 0.5 and lo > 0.19 (FP32's hazard out of reach)
S_FALSIFY_HI = 2.0                      # S-*: falsified if hi < 2
DRIVER_FALSIFY_HI = 1.0                 # "Wgrad is the main driver": falsified if either hi < 1


def verdict(label, direction, cox, holm_p):
    """'supported', 'falsified' or 'undecided' for one test of E1's family (the rules above); both at
    once (a significant effect smaller than the one needed) is 'mixed', as in E2-E4. An HR with no
    estimate (no informative seed) is undecided."""
    if label.startswith("N-"):
        falsified = cox.hi >= N_FALSIFY_HI and cox.lo > N_FALSIFY_LO
    elif label.startswith("S-"):
        falsified = cox.hi < S_FALSIFY_HI
    else:
        falsified = cox.hi < DRIVER_FALSIFY_HI
    in_direction = cox.hr < 1 if direction == "<1" else cox.hr > 1
    if holm_p < ALPHA and in_direction:
        return "mixed (significant, but the interval excludes the effect needed)" if falsified else "supported"
    return "falsified" if falsified else "undecided"


def driver_verdict(verdicts):
    """"Wgrad is the main driver" from its two tests' verdicts: supported if both are, falsified if
    either is."""
    if all(v == "supported" for v in verdicts):
        return "supported"
    return "falsified" if "falsified" in verdicts else "undecided"


def tails(directory):
    """{(seed, trajectory): tail_log_ratio} from the summaries (FP32's own is 0: log(fp32 / fp32))."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "summary_*.csv"))):
        with R.open_csv(path) as f:
            for r in csv.DictReader(f):
                if r["status"] in ("complete", "diverged"):
                    v = r["tail_log_ratio"]
                    out[(int(r["seed"]), r["group"])] = 0.0 if r["group"] == FP32 and v == "" else float(v)
    return out


def secondary(events, tail):
    """Per test of the family, the pre-registration's secondary reading beside the asymptotic
    stratified log-rank p (the family's LogRank.p_asym): the paired Wilcoxon signed-rank test of
    tail_log_ratio (arm vs reference, by seed): [(label, Wilcoxon)]."""
    out = []
    for label, a, ref, _ in E1_TESTS:
        seeds = sorted(s for s, b in events if b == a and (s, ref) in events)
        out.append((label, P.wilcoxon_paired([tail[(s, a)] for s in seeds], [tail[(s, ref)] for s in seeds])))
    return out


def _pairs(events, a, ref):
    keys = sorted(events)
    return P.make_pairs([events[k][1] for k in keys], [events[k][0] for k in keys], [k[0] for k in keys],
                        [k[1] for k in keys], a, ref)


def compare(events, a, ref):
    """Arm `a` against `ref`, paired by seed: (LogRank, Cox), the primary test and the effect size."""
    pairs = _pairs(events, a, ref)
    return P.permutation_logrank(pairs), P.cox_stratified(pairs, ties="breslow")


def every_arm(events, refs=(MX_ALL, FP32)):
    """Descriptive (pre-registration "E1": every arm's HR against MX-all and against FP32, not
    tests): [(arm, ref, LogRank, Cox)]."""
    arms = sorted({a for _, a in events}, key=lambda a: (a != FP32, a != MX_ALL, a))
    return [(a, ref) + compare(events, a, ref) for ref in refs for a in arms if a != ref]


def markdown_family(res, sec):
    """E1's family as a markdown table: counts, permutation p, Holm p, HR, verdict, secondary."""
    out = ["| test | arm vs reference (direction) | first event arm/ref | permutation p | Holm p | HR (95 %) | verdict "
           "| asymptotic log-rank p | tail_log_ratio: Hodges–Lehmann (95 %), Wilcoxon p |",
           "|---|---|---|---|---|---|---|---|---|"]
    verdicts = {}
    for (label, lr, cox, h), (_, w), (_, a, ref, d) in zip(res, sec, E1_TESTS):
        v = verdict(label, d, cox, h)
        verdicts[label] = v
        out.append(f"| {label} | {a} vs {ref} (HR {d}) | {lr.arm_first}/{lr.ref_first} | {lr.p_perm:.3g} | {h:.3g} | "
                   f"{R.hr_cell(cox)} | **{v}** | {lr.p_asym:.3g} | {w.hl:+.3g} ({w.hl_lo:+.3g} to {w.hl_hi:+.3g}), {w.p:.3g} |")
    drv = driver_verdict([verdicts["Wgrad vs Fprop"], verdicts["Wgrad vs Dgrad"]])
    out.append(f"\n\"Wgrad is the main driver\" (both of its tests): **{drv}**")
    return "\n".join(out)


def markdown_every_arm(rows):
    out = ["| arm | vs mx_all: first event arm/ref, p (unadjusted) | HR (95 %) | vs fp32: first event arm/ref, p (unadjusted) | HR (95 %) |",
           "|---|---|---|---|---|"]
    by = {(a, ref): (lr, cox) for a, ref, lr, cox in rows}
    arms = []
    for a, _, _, _ in rows:
        if a not in arms:
            arms.append(a)
    for a in arms:
        cells = []
        for ref in (MX_ALL, FP32):
            if (a, ref) in by:
                lr, cox = by[(a, ref)]
                cells += [f"{lr.arm_first}/{lr.ref_first}, {lr.p_perm:.3g}", R.hr_cell(cox)]
            else:
                cells += ["–", "–"]
        out.append(f"| {a} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def km_curve(times_events, horizon=19500):
    """Kaplan-Meier steps (xs, ys) of 'no excursion yet' for [(event, step)]: at each event step the
    fraction at risk that stays, censored trajectories leave the risk set at their step."""
    n = len(times_events)
    xs, ys, surv = [0], [1.0], 1.0
    for t in sorted({t for e, t in times_events if e}):
        at_risk = sum(1 for _, u in times_events if u >= t)
        d = sum(1 for e, u in times_events if e and u == t)
        surv *= 1.0 - d / at_risk
        xs.append(t)
        ys.append(surv)
    xs.append(max([horizon] + [t for _, t in times_events]))
    ys.append(surv)
    return xs, ys, n


def _km_step(ax, events, arm, label, **style):
    """One Kaplan-Meier curve (km_curve) of `arm`'s trajectories in `events` on the axes `ax`."""
    xs, ys, _ = km_curve([ev for (s, a), ev in events.items() if a == arm])
    ax.step(xs, ys, where="post", label=label, **style)


def _km_axes(ax, title):
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step (excursion onset)")
    ax.set_xlim(0, 20000)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")


def figure(events, path):
    """Kaplan-Meier curves of E1's arms (left: the tensor roles, right: the GEMMs), FP32 and MX-all
    on both, written to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len({s for s, _ in events})
    panels = (("tensor roles", [f"keep_bf16_{r}" for r in ROLES] + [f"only_{r}" for r in ROLES]),
              ("GEMMs", [f"keep_bf16_{g}" for g in GEMMS] + [f"only_{g}" for g in GEMMS]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3), sharey=True)
    colours = plt.get_cmap("tab10").colors
    for ax, (title, arms) in zip(axes, panels):
        for arm, style in ((FP32, dict(color="black", lw=2.2)), (MX_ALL, dict(color="grey", lw=2.2))):
            _km_step(ax, events, arm, arm, **style)
        for i, arm in enumerate(arms):
            _km_step(ax, events, arm, arm, color=colours[i % 4 if title == "tensor roles" else i % 3],
                     ls="--" if arm.startswith("keep_bf16") else "-", lw=1.3)
        _km_axes(ax, f"{title}: dashed = that part kept in bf16, solid = only that part MX")
    axes[0].set_ylabel("fraction of seeds without an excursion")
    fig.suptitle(f"E1, {n} seeds (200-239), lr 5e-4, 20,000 steps; excursion k = 10, B = 100, W = 500 "
                 "(Kaplan-Meier)", fontsize=10)
    fig.text(0.01, 0.005, "python3 results/why_mx.py --figure " + os.path.basename(path) +
             "; data: results/why_mx/e1/ (experiments/paper/why_mx_e1.yaml)", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# The Adam figure's curves: (trajectory@setting, colour, line style); FP32 black, MX-all grey,
# solid at the default setting, dashed at eps 1e-6, dotted at beta2 0.95.
ADAM_CURVES = ((FP32, "black", "-"), (MX_ALL, "grey", "-"), ("noise_mx", "tab:blue", "-"),
               ("mx_sr_grad", "tab:orange", "-"), ("fp32@eps=1e-6", "black", "--"),
               ("mx_all@eps=1e-6", "tab:red", "--"), ("fp32@beta2=0.95", "black", ":"),
               ("mx_all@beta2=0.95", "tab:green", ":"))


def figure_km(panels, curves, suptitle, footer, path):
    """Kaplan-Meier curves, one panel per (title, events) of `panels`, each with the curves
    [(trajectory, colour, line style)] of `curves` that its events have (FP32 and MX-all drawn
    heavier; legend: excursions/seeds), written to `path` (PNG) with `footer` (how it was made)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.3), sharey=True, squeeze=False)
    for ax, (title, events) in zip(axes[0], panels):
        arms = {a for _, a in events}
        for arm, colour, ls in curves:
            if arm in arms:
                n = len({s for s, a in events if a == arm})
                _km_step(ax, events, arm, f"{arm} ({_counts(events, arm)}/{n})", color=colour, ls=ls,
                         lw=2.0 if arm in (FP32, MX_ALL) else 1.4)
        _km_axes(ax, title)
    axes[0][0].set_ylabel("fraction of seeds without an excursion")
    fig.suptitle(suptitle, fontsize=10)
    fig.text(0.01, 0.005, footer, fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.05, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure_adam(e3_events, confirm_events, path):
    """Kaplan-Meier curves of E3 (left: 40 seeds, lr 5e-4) and, when `confirm_events` is given, of
    the confirmation of beta2 0.95 (right: seeds 240-259, lr 6e-4), written to `path` (PNG)."""
    panels = [("E3, seeds 200-239, lr 5e-4", e3_events)]
    if confirm_events is not None:
        panels.append(("confirmation, seeds 240-259, lr 6e-4", confirm_events))
    figure_km(panels, ADAM_CURVES,
              "Bias, variance or Adam: excursion k = 10, B = 100, W = 500 (Kaplan-Meier; legend: excursions/seeds)\n"
              "solid: default Adam (eps 1e-8, beta2 0.999); dashed: eps 1e-6; dotted: beta2 0.95",
              "python3 results/why_mx.py e3 --figure " + os.path.basename(path) +
              " --confirm results/why_mx/confirm_adam\ndata: results/why_mx/e3/ and confirm_adam/ "
              "(experiments/paper/why_mx_e3.yaml, why_mx_confirm_adam.yaml)", path)


# The rotations figure's curves: FP32 black, MX-all grey, the deterministic rotations solid, the
# randomised one with stochastic rounding dashed.
E4_CURVES = ((FP32, "black", "-"), (MX_ALL, "grey", "-"), ("rot_all", "tab:green", "-"),
             ("rot_e1", "tab:blue", "-"), ("rand_rot_sr", "tab:red", "--"))


def figure_e4(events, path):
    """Kaplan-Meier curves of E4's arms (seeds 200-239, lr 5e-4), written to `path` (PNG)."""
    figure_km([("E4, seeds 200-239, lr 5e-4", events)], E4_CURVES,
              "Block Hadamard rotations: excursion k = 10, B = 100, W = 500\n(Kaplan-Meier; legend: "
              "excursions/seeds; rot_e1 rotates Fprop only)",
              "python3 results/why_mx.py e4 --figure " + os.path.basename(path) +
              "\ndata: results/why_mx/e4/ (experiments/paper/why_mx_e4.yaml)", path)


def markdown_progress(rows, n_expected):
    out = [f"| arm | seeds (of {n_expected}) | excursions (Wilson 95 %) | median step |", "|---|---|---|---|"]
    for a, n, k, lo, hi, med in rows:
        m = "-" if med is None else f"{med:.0f}"
        out.append(f"| {a} | {n} | {k}/{n} ({lo:.2f}–{hi:.2f}) | {m} |")
    return "\n".join(out)


# --------------------------------------------------------------------------- E2

E2_POINTS = (4000, 8000, 12000)
E2_HORIZON = 2000  # the endpoint's window [b, b + 2000): branches of 2,500 steps less W = 500
# E2's family (prereg "E2"): (hypothesis, branch kind, its control (the parent), the odds ratio's
# upper bound below which the hypothesis is falsified)
E2_TESTS = (("State", "fp32_from_mx", MX_ALL, 0.5), ("Dynamics", "mx_from_fp32", FP32, 2.0))
E2_COLUMNS = ("parent", "at_risk", "branch_excursion_step", "branch_censored_at", "control_excursion_step",
              "control_censored_at")


def _ceil_div(a, b):
    return -(-a // b)


def endpoint_from_blocks(parent, branch, at, horizon, factor=R.FACTOR, window=R.PRIMARY_W, block=R.BLOCK):
    """stats_util.branch_endpoint on block minima: `parent` and `branch` are trajectories of
    reanalysis_excursion.read_blocks (`branch` from its first step `at`, which must be a multiple of
    `block`), the branch planned for `horizon` + `window` steps. Returns the dict of
    branch_endpoint (at_risk, window_end, branch, control)."""
    if at % block or parent.get("first", 0) != 0 or branch.get("first", 0) != at:
        raise StudyError(f"branch at step {at}: its blocks must start at it and the parent's at 0, on the "
                         f"{block}-step grid")
    k = at // block
    if parent["steps_run"] < at:
        raise StudyError(f"branch at step {at}: its parent ran only {parent['steps_run']} steps")
    run = window // block
    joined = dict(branch, first=0, mins=list(parent["mins"][:k]) + list(branch["mins"]),
                  steps_run=at + branch["steps_run"])
    end = at + horizon if branch["absorbing"] else min(at + horizon, at + branch["steps_run"] - window)
    end = max(at, end)

    def between(t):
        e = max(at, end if t["absorbing"] else min(end, t["steps_run"] - window))
        b = excursion_block(R.event_mins(t, window, block), factor, run, start=k, stop=_ceil_div(e, block))
        return (True, b * block) if b >= 0 else (False, e)

    whole = R.excursion(parent, window, factor, block)
    return {"at_risk": not (whole[0] and whole[1] < at), "window_end": end, "branch": between(joined),
            "control": between(parent)}


def _binary_endpoint(row):
    """(at_risk, branch, control) of a `mxlab summarize --csv` branch row."""
    def ev(step, censored):
        s = int(row[step])
        return (True, s) if s >= 0 else (False, int(row[censored]))
    return (row["at_risk"] == "1", ev("branch_excursion_step", "branch_censored_at"),
            ev("control_excursion_step", "control_censored_at"))


def load_e2(directory, factor=R.FACTOR, window=R.PRIMARY_W, block=R.BLOCK, horizon=E2_HORIZON):
    """{(seed, branch): {'at', 'parent', 'at_risk', 'window_end', 'branch', 'control'}} of every
    branch of the finished runs, from the blocks CSVs, checked against the summaries' columns."""
    blocks = R.csv_paths(directory, "blocks_*")
    if not blocks:
        raise StudyError(f"no blocks_*.csv in {directory}")
    trajs = {}
    for (seed, lr, name), t in R.read_blocks(blocks, block=block, branches=True).items():
        if (seed, name) in trajs:
            raise StudyError(f"seed {seed} {name}: loss blocks at two learning rates")
        trajs[(seed, name)] = t
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "summary_*.csv"))):
        with R.open_csv(path) as f:
            reader = csv.DictReader(f)
            missing = [c for c in E2_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise StudyError(f"{path} has no column {missing[0]}: written by an mxlab without the branch "
                                 "endpoint; rerun `mxlab summarize DIR --csv` with a current build")
            for r in reader:
                if r["status"] not in ("complete", "diverged") or not r["at"]:
                    continue
                seed, name, at, parent = int(r["seed"]), r["group"], int(r["at"]), r["parent"]
                for who in (name, parent):
                    if (seed, who) not in trajs:
                        raise StudyError(f"seed {seed} {name}: no loss blocks of {who}")
                e = endpoint_from_blocks(trajs[(seed, parent)], trajs[(seed, name)], at, horizon, factor, window, block)
                mine = (e["at_risk"], e["branch"], e["control"])
                if mine != _binary_endpoint(r):
                    raise StudyError(f"seed {seed} {name}: endpoint from the blocks {mine} != the binary's "
                                     f"{_binary_endpoint(r)}")
                if (seed, name) in out and out[(seed, name)] != dict(e, at=at, parent=parent):
                    raise StudyError(f"seed {seed} {name}: two summary rows that differ")
                out[(seed, name)] = dict(e, at=at, parent=parent)
    if not out:
        raise StudyError(f"no finished branch in the summaries of {directory}")
    return out


def pairing_check(directory, e1_directory, trajectories=(FP32, MX_ALL)):
    """The pre-registration's pairing check: each seed's `trajectories` in `directory` (E2) have the
    block minima of the same seed's in `e1_directory` (E1), block for block. Returns how many
    (seed, trajectory) both hold; a difference is a StudyError."""
    e1_paths = R.csv_paths(e1_directory, "blocks_*")
    if not e1_paths:
        return 0
    e1 = {(s, t): v for (s, _, t), v in R.read_blocks(e1_paths).items() if t in trajectories}
    here = {(s, t): v for (s, _, t), v in R.read_blocks(R.csv_paths(directory, "blocks_*"),
                                                         branches=True).items() if t in trajectories}
    shared = sorted(set(e1) & set(here))
    for k in shared:
        if (e1[k]["mins"], e1[k]["steps_run"]) != (here[k]["mins"], here[k]["steps_run"]):
            raise StudyError(f"seed {k[0]} {k[1]}: its loss blocks differ from E1's (the pairing of the "
                             "pre-registration needs the same trajectory)")
    return len(shared)


def e2_pairs(endpoints):
    """{hypothesis: {(seed, b): endpoint}} by E2_TESTS: each branch `<kind>_<b>` with its control as
    parent. A branch of another name, or with another parent or step, is an error."""
    out = {h: {} for h, _, _, _ in E2_TESTS}
    for (seed, name), e in sorted(endpoints.items()):
        kind, _, b = name.rpartition("_")
        test = [t for t in E2_TESTS if t[1] == kind]
        if not test or not b.isdigit() or int(b) != e["at"] or e["parent"] != test[0][2]:
            raise StudyError(f"seed {seed} branch {name} (from {e['parent']} at {e['at']}) is none of E2's "
                             f"<kind>_<b> with kind and parent in {[(t[1], t[2]) for t in E2_TESTS]}")
        out[test[0][0]][(seed, e["at"])] = e
    return out


def mcnemar_row(pairs):
    """Counts, exact McNemar p and conditional odds ratio (branch vs control) over the at-risk
    pairs of {(seed, b): endpoint}: {'pairs', 'at_risk', 'branch', 'control', 'only_branch',
    'only_control', 'p', 'or', 'lo', 'hi'}."""
    risk = [e for e in pairs.values() if e["at_risk"]]
    nb = sum(1 for e in risk if e["branch"][0] and not e["control"][0])
    nc = sum(1 for e in risk if e["control"][0] and not e["branch"][0])
    odds, lo, hi = conditional_odds_ratio(nb, nc)
    return {"pairs": len(pairs), "at_risk": len(risk), "branch": sum(e["branch"][0] for e in risk),
            "control": sum(e["control"][0] for e in risk), "only_branch": nb, "only_control": nc,
            "p": mcnemar_exact(nb, nc), "or": odds, "lo": lo, "hi": hi}


def e2_verdict(hypothesis, row, holm_p, bound):
    """The pre-registered verdict. State (fp32_from_mx as many events as its control): falsified
    when fp32_from_mx has significantly fewer (Holm p < 0.05, OR < 1) and the OR's upper bound is
    < 0.5; the pre-registration gives no criterion of support for this equality, so otherwise
    undecided. Dynamics (mx_from_fp32 more events than its control): supported when Holm p < 0.05
    with OR > 1; falsified when the OR's upper bound is < 2; both at once (a significant effect
    whose interval excludes the OR of 2 the hypothesis needs) is reported as mixed, not resolved."""
    sig_fewer = holm_p < 0.05 and row["or"] < 1
    sig_more = holm_p < 0.05 and row["or"] > 1
    below = row["hi"] < bound  # False for NaN (no discordant pair)
    if hypothesis == "State":
        return "falsified" if sig_fewer and below else "undecided"
    if sig_more and below:
        return f"mixed (significant, but the OR's upper bound < {bound:g})"
    return "supported" if sig_more else "falsified" if below else "undecided"


def e2_family(endpoints):
    """E2's two tests on complete data: [(hypothesis, kind, control, row, Holm p, verdict)]."""
    pairs = e2_pairs(endpoints)
    want = {(s, b) for s in SEEDS for b in E2_POINTS}
    for h, kind, _, _ in E2_TESTS:
        if set(pairs[h]) != want:
            raise StudyError(f"the confirmatory tests need seeds 200-239 at b = 4000, 8000, 12000; {kind} has "
                             f"{len(pairs[h])} of {len(want)} (seed, b)")
    rows = [mcnemar_row(pairs[h]) for h, _, _, _ in E2_TESTS]
    adj = holm([r["p"] for r in rows])
    return [(h, kind, ctl, r, q, e2_verdict(h, r, q, bound))
            for (h, kind, ctl, bound), r, q in zip(E2_TESTS, rows, adj)]


def _num(x):
    return "–" if x != x else "inf" if x == float("inf") else f"{x:.3g}"


def markdown_e2_progress(endpoints):
    """Per branch kind and b: seeds, pairs at risk, events branch / control, discordant."""
    pairs = e2_pairs(endpoints)
    out = ["| branch (control) | b | seeds (of 40) | at risk | events branch / control | only branch / only control |",
           "|---|---|---|---|---|---|"]
    for h, kind, ctl, _ in E2_TESTS:
        for b in sorted({b for _, b in pairs[h]}):
            r = mcnemar_row({k: e for k, e in pairs[h].items() if k[1] == b})
            out.append(f"| {kind} ({ctl}) | {b} | {r['pairs']} | {r['at_risk']} | {r['branch']} / {r['control']} | "
                       f"{r['only_branch']} / {r['only_control']} |")
    return "\n".join(out)


def markdown_e2_family(res):
    out = ["| hypothesis | branch vs control | at-risk (seed, b) pairs | events branch / control | discordant: only "
           "branch / only control | odds ratio [exact 95 %] | McNemar p | Holm p (m = 2) | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]
    for h, kind, ctl, r, q, verdict in res:
        out.append(f"| {h} | {kind} vs {ctl} | {r['at_risk']} | {r['branch']} / {r['control']} | {r['only_branch']} / "
                   f"{r['only_control']} | {_num(r['or'])} [{_num(r['lo'])}, {_num(r['hi'])}] | {r['p']:.3g} | {q:.3g} | "
                   f"{verdict} |")
    return "\n".join(out)


def branchpoints(directory):
    """The rows of results/extract_branchpoints.py's CSVs in `directory` ([] when none)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "branchpoints_*.csv"))):
        with R.open_csv(path) as f:
            rows += list(csv.DictReader(f))
    return rows


def markdown_branchpoints(rows):
    """Descriptive, per b and parent (each (seed, b, parent) once): the median over seeds, with
    the range, of the parent's lambda_max(H), lambda_max(P^-1 H), and of Adam v's median and 99th
    percentile at b."""
    seen, by = set(), {}
    for r in rows:
        key = (int(r["seed"]), int(r["at"]), r["parent"])
        if key in seen:
            continue
        seen.add(key)
        by.setdefault((int(r["at"]), r["parent"]), []).append(r)

    def cell(rs, col):
        xs = sorted(float(r[col]) for r in rs if r[col])
        if not xs:
            return "–"
        return f"{statistics.median(xs):.3g} ({xs[0]:.3g}–{xs[-1]:.3g})"

    out = ["| b | parent | seeds | λ_max(H) median (range) | λ_max(P⁻¹H) median (range) | threshold 38/η | Adam v: median "
           "(range over seeds) | Adam v: 99th percentile |", "|---|---|---|---|---|---|---|---|"]
    for (b, parent), rs in sorted(by.items()):
        out.append(f"| {b} | {parent} | {len(rs)} | {cell(rs, 'parent_hessian_lmax')} | {cell(rs, 'parent_precond_lmax')} | "
                   f"{cell(rs, 'parent_precond_threshold')} | {cell(rs, 'v_median')} | {cell(rs, 'v_q99')} |")
    return "\n".join(out)


def _one_line_errors(main_fn):
    """A subcommand's exit status: 0 when it ran, 2 with one line on stderr when the committed data
    do not fit the study (StudyError, R.DataError, a file that cannot be read)."""
    @functools.wraps(main_fn)
    def run(argv):
        try:
            main_fn(argv)
        except (StudyError, R.DataError, OSError) as e:
            print(f"why_mx: {e}", file=sys.stderr)
            return 2
        return 0
    return run


def _args(argv, name, what, default_dir, dir_help=None, e1_help="E1's directory, for the pairing check",
          more=None):
    """The command line of a subcommand: --dir (default results/why_mx/<default_dir>) and --e1;
    `more(parser)` adds a subcommand's own options."""
    ap = argparse.ArgumentParser(prog=f"why_mx.py {name}", description=f"{what} of results/prereg/why_mx.md")
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "why_mx")
    ap.add_argument("--dir", default=os.path.join(here, default_dir), help=dir_help)
    ap.add_argument("--e1", default=os.path.join(here, "e1"), help=e1_help)
    if more:
        more(ap)
    return ap.parse_args(argv)


def _e3_options(ap):
    ap.add_argument("--figure", metavar="PNG", help="also write the Kaplan-Meier figure of E3's trajectories "
                    "(and of the confirmation's, with --confirm)")
    ap.add_argument("--confirm", metavar="DIR", help="with --figure: the confirmation's run set "
                    "(results/why_mx/confirm_adam) for the figure's second panel")


@_one_line_errors
def main_e2(argv):
    a = _args(argv, "e2", "E2", "e2")
    ends = load_e2(a.dir)
    seeds = sorted({s for s, _ in ends})
    paired = pairing_check(a.dir, a.e1)
    print(f"e2: {len(seeds)} of {len(SEEDS)} seeds finished; endpoint: an excursion (k=10, B=100, W=500) with "
          f"onset in [b, b + {E2_HORIZON}) on the parent's losses before b joined to the branch's; C++ and Python "
          f"agree on all {len(ends)} branches; fp32 and mx_all equal E1's block for block on all {paired} "
          "(seed, trajectory) both hold")
    print(markdown_e2_progress(ends))
    if seeds == SEEDS:
        print()
        print(markdown_e2_family(e2_family(ends)))
        print("\nState has no pre-registered criterion of support (an equality): it is falsified or undecided.")
    else:
        print("\nconfirmatory tests: not run until all 40 seeds have finished (pre-registration)")
    bp = branchpoints(a.dir)
    if bp:
        print("\nAt the branch points (descriptive):\n")
        print(markdown_branchpoints(bp))


# --------------------------------------------------------------------------- E3, E4, Question 0

# E3's Adam settings (prereg "E3"; experiments/paper/why_mx_e3.yaml's zip): (label, eps, beta2). A
# trajectory of a setting other than the default is named "<trajectory>@<label>" in the events.
E3_SETTINGS = (("default", 1e-8, 0.999), ("eps=1e-6", 1e-6, 0.999), ("beta2=0.95", 1e-8, 0.95))
E3_TRAJECTORIES = {"default": (FP32, MX_ALL, "noise_mx", "mx_sr_grad"), "eps=1e-6": (FP32, MX_ALL),
                   "beta2=0.95": (FP32, MX_ALL)}
# A test of the families below: (label, compared arm, reference, direction, bound). Direction "<1"
# or ">1": the hypothesis's; falsified when the HR's 95 % interval's lower bound is > bound ("<1")
# or its upper bound is < bound (">1"). "two-sided": no direction, no verdict (significant or not).
E3_TESTS = (("Variance suffices", "noise_mx", FP32, ">1", 2.0),
            ("Bias matters", "noise_mx", MX_ALL, "<1", 0.5),
            ("SR of gradients", "mx_sr_grad", MX_ALL, "<1", 0.5),
            ("Adam eps 1e-6 (MX)", "mx_all@eps=1e-6", MX_ALL, "<1", 0.5),
            ("Adam beta2 0.95 (MX)", "mx_all@beta2=0.95", MX_ALL, "<1", 0.5),
            ("Adam eps 1e-6 (FP32, interaction check)", "fp32@eps=1e-6", FP32, "two-sided", None))
# E4 (prereg "E4"): each recipe vs mx_all (HR < 1, falsified if the lower bound > 0.5) and vs FP32
# (two-sided). rot_e1 runs (E1's N-GEMM(fprop) was significant), so m = 6.
E4_RECIPES = ("rot_all", "rand_rot_sr", "rot_e1")
E4_TESTS = tuple(t for r in E4_RECIPES for t in ((f"{r} vs mx_all", r, MX_ALL, "<1", 0.5),
                                                  (f"{r} vs fp32", r, FP32, "two-sided", None)))
FIX_HI = 1.5          # a fix: HR vs FP32 with a 95 % interval not above 1 (lower bound <= 1), upper bound < 1.5
CANDIDATE_HR = 0.25   # a candidate fix: HR vs mx_all <= 0.25 and an interval vs FP32 not above 1
# Between E4's recipes, descriptive (not tests, not in the family): deterministic rotations against
# the randomised ones with stochastic rounding (the literature's claim that the former restore
# stability where the latter do not), and rotating every GEMM against rotating E1's GEMM only.
E4_BETWEEN = (("rot_all", "rand_rot_sr"), ("rot_e1", "rand_rot_sr"), ("rot_all", "rot_e1"))
# The amendment of 2026-11-28: E3's Adam settings on MX-all are classified as E4's recipes are,
# against the default setting's mx_all and fp32 (the status quo), and confirmed as they are.
E3_RECIPES = ("mx_all@eps=1e-6", "mx_all@beta2=0.95")
# Question 0 (prereg "E1" and its amendment, m = 4): (label, arm, reference, the question's direction).
Q0_ARMS = ("paper_emulator", "mx_ops")
Q0_TESTS = (("MX-all vs paper_emulator", MX_ALL, "paper_emulator", ">1"),
            ("MX-all vs mx_ops", MX_ALL, "mx_ops", ">1"),
            ("paper_emulator vs FP32", "paper_emulator", FP32, ">1"),
            ("mx_ops vs FP32", "mx_ops", FP32, ">1"))


def setting_label(eps, beta2):
    """E3's label of an Adam setting (the strings of the loss blocks' eps and beta2 columns)."""
    for label, e, b in E3_SETTINGS:
        if eps and beta2 and float(eps) == e and float(beta2) == b:
            return label
    raise StudyError(f"Adam setting eps {eps or '(none)'}, beta2 {beta2 or '(none)'} is none of E3's "
                     f"{[(e, b) for _, e, b in E3_SETTINGS]}: loss blocks without the eps and beta2 columns are "
                     "re-extracted with a current results/extract_loss_blocks.py")


def at_setting(trajectory, setting):
    """The events' name of `trajectory` of the runs at E3's Adam `setting`."""
    return trajectory if setting == "default" else f"{trajectory}@{setting}"


def load_e3(directory):
    """{(seed, trajectory@setting): (event, step)} of E3 (at_setting names): the three runs of a
    seed train trajectories of the same names, told apart by the eps and beta2 of their loss
    blocks; the summaries' rows are matched to a setting by run_id (and checked against their
    optimizer.eps / optimizer.beta2 columns where the CSV has them), then the excursions are
    checked against the binary's as in load()."""
    return load_settings(directory, E3_TRAJECTORIES)


def load_settings(directory, allowed=None):
    """load_e3's events of a run set whose runs differ in E3's Adam settings; `allowed`: {setting:
    the trajectories its runs train} (E3_TRAJECTORIES), None for any."""
    return {k: R.excursion(t) for k, t in checked_setting_trajectories(directory, allowed).items()}


def checked_setting_trajectories(directory, allowed=None):
    """{(seed, trajectory@setting): trajectory of reanalysis_excursion.read_blocks} of such a run
    set, once load_settings' checks pass (as checked_trajectories is to load())."""
    paths = R.csv_paths(directory, "blocks_*")
    if not paths:
        raise StudyError(f"no blocks_*.csv in {directory}")
    runs = {}
    for path in paths:
        with R.open_csv(path) as f:
            for r in csv.DictReader(f):
                here = (int(r["seed"]), setting_label(*R.optimizer_setting(r)))
                if runs.setdefault(r["run_id"], here) != here:
                    raise StudyError(f"run {r['run_id']}: loss blocks of two seeds or Adam settings")
    trajs = {}
    for (seed, _lr, eps, beta2, name), t in R.read_blocks(paths, optimizer=True).items():
        setting = setting_label(eps, beta2)
        if allowed is not None and name not in allowed[setting]:
            raise StudyError(f"seed {seed}: trajectory {name} in a run at Adam setting {setting}, whose runs train "
                             f"{', '.join(allowed[setting])} (experiments/paper/why_mx_e3.yaml)")
        key = (seed, at_setting(name, setting))
        if key in trajs:
            raise StudyError(f"seed {seed} {key[1]}: loss blocks at two learning rates")
        trajs[key] = t
    out = {k: R.excursion(t) for k, t in trajs.items()}
    binary = {}
    for path in sorted(glob.glob(os.path.join(directory, "summary_*.csv"))):
        with R.open_csv(path) as f:
            for r in csv.DictReader(f):
                if r["status"] not in ("complete", "diverged"):
                    continue
                if r["run_id"] not in runs:
                    raise StudyError(f"run {r['run_id']} (seed {r['seed']}) finished but has no loss blocks")
                seed, setting = runs[r["run_id"]]
                _, eps, beta2 = next(x for x in E3_SETTINGS if x[0] == setting)
                for col, want in (("optimizer.eps", eps), ("optimizer.beta2", beta2)):
                    if r.get(col) and float(r[col]) != want:
                        raise StudyError(f"run {r['run_id']}: the summary's {col} {r[col]} is not its loss blocks' {want}")
                if _summary_seed(r, {r["run_id"]: seed}) != seed:
                    raise StudyError(f"run {r['run_id']}: seed {r['seed']} in the summary, {seed} in the loss blocks")
                binary[(seed, at_setting(r["group"], setting))] = _binary_excursion(r)
    _agree(out, binary)
    return trajs


def load_q0(directory, e1_directory):
    """Question 0's events: fp32, paper_emulator and mx_ops from the paper_emulator run set
    (`directory`), mx_all of the same seeds from E1 (`e1_directory`): {(seed, arm): (event, step)}
    on the run set's seeds."""
    pe, e1 = load(directory), load(e1_directory)
    out = dict(pe)
    for s in sorted({s for s, _ in pe}):
        if (s, MX_ALL) in pe:
            raise StudyError(f"seed {s}: an mx_all trajectory in {directory}; Question 0 takes mx_all from E1")
        if (s, MX_ALL) not in e1:
            raise StudyError(f"seed {s}: no mx_all in E1's {e1_directory}")
        out[(s, MX_ALL)] = e1[(s, MX_ALL)]
    return out


def _block_rows(directory, trajectories, keep_row=None):
    """{(seed, trajectory): {run_id: ((block_start, steps, min, max, mean, nonfinite, last), ...)}}
    of the loss blocks in `directory`, as written (the CSV's text: equal text is equal bits)."""
    out = {}
    for path in R.csv_paths(directory, "blocks_*"):
        with R.open_csv(path) as f:
            for r in csv.DictReader(f):
                if r["trajectory"] in trajectories and (keep_row is None or keep_row(r)):
                    row = tuple(r[c] for c in ("block_start", "steps", "min", "max", "mean", "nonfinite", "last"))
                    out.setdefault((int(r["seed"]), r["trajectory"]), {}).setdefault(r["run_id"], []).append(row)
    return {k: {rid: tuple(sorted(rows, key=lambda x: int(x[0]))) for rid, rows in v.items()} for k, v in out.items()}


def pairing_check_blocks(directory, e1_directory, trajectories=(FP32, MX_ALL), keep_row=None):
    """The pre-registration's pairing check, bit for bit: every (seed, trajectory in
    `trajectories`) of `directory` (rows passing `keep_row`) has E1's loss blocks, every column as
    written, in every run of either. Returns how many (seed, trajectory) were checked; a
    difference, or one E1 lacks, is a StudyError (E1 has every seed)."""
    e1 = _block_rows(e1_directory, trajectories)
    if not e1:
        raise StudyError(f"no loss blocks of {'/'.join(trajectories)} in {e1_directory}: the pairing check needs "
                         "E1's (--e1)")
    here = _block_rows(directory, trajectories, keep_row)
    for k in sorted(here):
        if k not in e1:
            raise StudyError(f"seed {k[0]} {k[1]}: not in E1's loss blocks ({e1_directory})")
        versions = set(here[k].values()) | set(e1[k].values())
        if len(versions) != 1:
            raise StudyError(f"seed {k[0]} {k[1]}: its loss blocks differ from E1's (the pairing of the "
                             "pre-registration needs the same trajectory, bit for bit)")
    return len(here)


def _default_setting(row):
    return setting_label(*R.optimizer_setting(row)) == "default"


def _seeds_by_arm(events):
    have = {}
    for s, a in events:
        have.setdefault(a, set()).add(s)
    return have


def complete(events, tests, seeds=SEEDS):
    """Whether every arm and reference of `tests` has exactly `seeds` (200-239)."""
    have = _seeds_by_arm(events)
    return all(have.get(x, set()) == set(seeds) for t in tests for x in t[1:3])


def run_family(events, tests, seeds=SEEDS):
    """A pre-registered family on complete data: [(label, LogRank, Cox, Holm p)] in the order of
    `tests`, Holm over all len(tests) (permutation log-rank, seed-stratified Cox with Breslow ties,
    as E1). Every arm and reference must have exactly `seeds` (200-239), else a StudyError."""
    have = _seeds_by_arm(events)
    for t in tests:
        for x in t[1:3]:
            if have.get(x, set()) != set(seeds):
                raise StudyError(f"the confirmatory tests need seeds {seeds[0]}-{seeds[-1]} for every arm; {x} has "
                                 f"{len(have.get(x, ()))}")
    res = [(t[0],) + compare(events, t[1], t[2]) for t in tests]
    adj = P.holm_family([(label, lr.p_perm) for label, lr, _ in res])
    return [(label, lr, cox, h) for (label, lr, cox), (_, _, h) in zip(res, adj)]


def directional_verdict(direction, bound, cox, holm_p):
    """The pre-registered verdict of an E3 / E4 test ("Verdicts"): supported when Holm p < 0.05
    with the HR in the hypothesis's direction; falsified when the HR's 95 % interval excludes the
    effect it needs (direction "<1": lower bound > `bound`; ">1": upper bound < `bound`); both at
    once (a significant effect smaller than the one needed) is "mixed", as the pre-registration
    orders neither; otherwise undecided (also with no informative seed: NaN bounds). A two-sided
    test has no hypothesis: "significant (HR > 1)" / "significant (HR < 1)" or "not significant"."""
    if direction == "two-sided":
        if holm_p < ALPHA:
            return f"significant (HR {'>' if cox.hr > 1 else '<'} 1)"
        return "not significant"
    if direction == "<1":
        in_direction, falsified = cox.hr < 1, cox.lo > bound
        need = f"lower bound > {bound:g}"
    elif direction == ">1":
        in_direction, falsified = cox.hr > 1, cox.hi < bound
        need = f"upper bound < {bound:g}"
    else:
        raise ValueError(f"direction {direction!r}: <1, >1 or two-sided")
    supported = holm_p < ALPHA and in_direction
    if supported and falsified:
        return f"mixed (significant, but the {need})"
    return "supported" if supported else "falsified" if falsified else "undecided"


def q0_reading(direction, cox, holm_p):
    """Question 0 has no falsification rule: its tests are two-sided (the primary test) and the
    question's direction only reads the result."""
    if holm_p >= ALPHA:
        return "not significant"
    same = cox.hr > 1 if direction == ">1" else cox.hr < 1
    return f"significant, {'in' if same else 'against'} the question's direction (HR {'>' if cox.hr > 1 else '<'} 1)"


def not_above_fp32(vs_fp32):
    """Whether a recipe's Cox result against FP32 does not show a higher hazard: the 95 % interval
    contains 1 or lies below it (lower bound <= 1; the amendment of 2026-11-28, which reads the
    pre-registration's "an interval containing 1" as the "no less stable than FP32" it stands for).
    No informative seed (NaN bounds): False, nothing shows it FP32-like."""
    return vs_fp32.lo <= 1.0 and vs_fp32.hi >= vs_fp32.lo


def fix_class(vs_mx, vs_fp32):
    """E4's (and, by the amendment of 2026-11-28, E3's Adam settings') classification of a recipe
    from its Cox results against mx_all and against FP32: "fix" when the HR vs FP32 has a 95 %
    interval not above 1 (not_above_fp32) with upper bound < 1.5; else "candidate fix" when its HR
    vs mx_all is <= 0.25 and its interval vs FP32 is not above 1 (either is confirmed on seeds
    240-259 at lr 6e-4 before the README calls it a fix); else "no fix"."""
    ok = not_above_fp32(vs_fp32)
    if ok and vs_fp32.hi < FIX_HI:
        return "fix"
    if ok and vs_mx.hr <= CANDIDATE_HR:
        return "candidate fix (to confirm on seeds 240-259 at lr 6e-4)"
    return "no fix"


def _counts(events, arm):
    return sum(1 for (s, a), (e, _) in events.items() if a == arm and e)


def markdown_tests(events, tests, res, readings, n_seeds=len(SEEDS)):
    """A family as a markdown table: counts, first events, permutation p, Holm p, HR, verdict."""
    m = len(tests)
    out = [f"| test | arm vs reference (hypothesis) | excursions arm / ref (of {n_seeds}) | first event arm/ref | permutation p "
           f"| Holm p (m = {m}) | HR (95 %) | verdict | asymptotic log-rank p |", "|---|---|---|---|---|---|---|---|---|"]
    for t, (label, lr, cox, h), v in zip(tests, res, readings):
        hyp = "two-sided" if t[3] == "two-sided" else f"HR {t[3]}"
        out.append(f"| {label} | {t[1]} vs {t[2]} ({hyp}) | {_counts(events, t[1])} / {_counts(events, t[2])} | "
                   f"{lr.arm_first}/{lr.ref_first} | {lr.p_perm:.3g} | {h:.3g} | {R.hr_cell(cox)} | **{v}** | {_num(lr.p_asym)} |")
    return "\n".join(out)


def e3_readings(res):
    return [directional_verdict(t[3], t[4], cox, h) for t, (_, _, cox, h) in zip(E3_TESTS, res)]


def e4_readings(res):
    return [directional_verdict(t[3], t[4], cox, h) for t, (_, _, cox, h) in zip(E4_TESTS, res)]


def e4_fixes(res):
    """[(recipe, Cox vs mx_all, Cox vs fp32, classification)] from E4's family."""
    by = {label: cox for label, _, cox, _ in res}
    return [(r, by[f"{r} vs mx_all"], by[f"{r} vs fp32"], fix_class(by[f"{r} vs mx_all"], by[f"{r} vs fp32"]))
            for r in E4_RECIPES]


def markdown_fixes(rows):
    out = ["| recipe | HR vs mx_all (95 %) | HR vs fp32 (95 %) | classification |", "|---|---|---|---|"]
    for r, vm, vf, c in rows:
        out.append(f"| {r} | {R.hr_cell(vm)} | {R.hr_cell(vf)} | **{c}** |")
    return "\n".join(out)


# The confirmation of E4's candidate fixes (the amendment of 2026-11-27): seeds 240-259 at lr 6e-4
CONFIRM_SEEDS = list(range(240, 260))
CONFIRM_LR = 6e-4


def confirm_tests(recipes):
    """Per recipe (a) vs mx_all (HR < 1) and (b) vs fp32 (two-sided), in that order: one Holm family."""
    return tuple(t for r in recipes for t in ((f"{r} vs mx_all", r, MX_ALL, "<1", None),
                                              (f"{r} vs fp32", r, FP32, "two-sided", None)))


def confirm_reading(vs_mx, holm_mx, vs_fp32):
    """The amendment's reading of a recipe from (a)'s Cox result and Holm p and (b)'s Cox result."""
    if not (holm_mx < ALPHA and vs_mx.hr < 1):
        return "not confirmed: stays a candidate"
    if not not_above_fp32(vs_fp32):
        return "not confirmed: its hazard is above FP32's"
    if vs_fp32.hi < FIX_HI:
        return "the fix"
    return f"confirmed: brings MX's hazard near FP32's, within what {len(CONFIRM_SEEDS)} seeds resolve"


def confirm_trajectories(directory):
    """(trajectories, events, recipes) of the confirmation: {(seed, trajectory): reanalysis_excursion
    trajectory}, their excursions, and its recipes (every trajectory but the default setting's fp32
    and mx_all and FP32 at other Adam settings, sorted); a StudyError for blocks of another lr or of
    seeds outside 240-259, or without fp32, mx_all or a recipe. Runs at E3's Adam settings are read
    as e3 reads them (checked_setting_trajectories: mx_all@beta2=0.95); loss blocks of runs at one
    setting without the eps and beta2 columns are read with checked_trajectories."""
    rows = block_values(directory, lambda r: (R.optimizer_setting(r), float(r["lr"])))
    trajs = (checked_trajectories(directory) if {s for s, _ in rows} <= {("", "")}
             else checked_setting_trajectories(directory))
    events = {k: R.excursion(t) for k, t in trajs.items()}
    lrs = {lr for _, lr in rows}
    if lrs != {CONFIRM_LR}:
        raise StudyError(f"loss blocks at lr {sorted(lrs)}: the confirmation runs at lr {CONFIRM_LR:g} only")
    stray = sorted({s for s, _ in events} - set(CONFIRM_SEEDS))
    if stray:
        raise StudyError(f"seed {stray[0]}: the confirmation's seeds are 240-259")
    arms = {a for _, a in events}
    recipes = sorted(a for a in arms - {FP32, MX_ALL} if not a.startswith(FP32 + "@"))
    if FP32 not in arms or MX_ALL not in arms or not recipes:
        raise StudyError(f"the confirmation's runs train fp32, mx_all and at least one recipe; these have "
                         f"{', '.join(sorted(arms))}")
    return trajs, events, recipes


def load_confirm(directory):
    """The confirmation's events and recipes (confirm_trajectories)."""
    _, events, recipes = confirm_trajectories(directory)
    return events, recipes


def confirm_beside(events, recipes):
    """The amendment of 2026-11-28's comparisons shown beside an Adam setting's confirmation, not
    tests: per recipe at a setting s, FP32 at s vs the default FP32 (is the setting specific to MX?)
    and MX-all at s vs FP32 at s, where those trajectories were run: [(arm, ref, LogRank, Cox)]."""
    arms = {a for _, a in events}
    out = []
    for r in recipes:
        setting = r.partition("@")[2]
        if not setting:
            continue
        fp = at_setting(FP32, setting)
        for a, ref in ((fp, FP32), (r, fp)):
            if a in arms and ref in arms:
                out.append((a, ref) + compare(events, a, ref))
    return out


def markdown_beside(events, rows, n_seeds):
    """Rows [(arm, ref, LogRank, Cox)] shown beside a family, not tests (the confirmation's
    comparisons at an Adam setting, E4_BETWEEN), as a markdown table: unadjusted p."""
    out = [f"| arm vs reference | excursions arm / ref (of {n_seeds}) | first event arm/ref | permutation p "
           "(unadjusted) | HR (95 %) |", "|---|---|---|---|---|"]
    for a, ref, lr, cox in rows:
        out.append(f"| {a} vs {ref} | {_counts(events, a)} / {_counts(events, ref)} | {lr.arm_first}/{lr.ref_first} "
                   f"| {lr.p_perm:.3g} | {R.hr_cell(cox)} |")
    return "\n".join(out)


def q0_readings(res):
    return [q0_reading(t[3], cox, h) for t, (_, _, cox, h) in zip(Q0_TESTS, res)]


E3_SETTING_TEXT = {"default": "eps 1e-8, beta2 0.999 (default)", "eps=1e-6": "eps 1e-6, beta2 0.999",
                   "beta2=0.95": "eps 1e-8, beta2 0.95"}


def _by_setting(rows):
    """[(setting, trajectory, *rest)] of rows [(trajectory@setting, *rest)], in the E3 tables' order:
    by Adam setting (E3_SETTINGS' order, others last), then fp32, mx_all, the rest by name."""
    order = [x[0] for x in E3_SETTINGS]
    out = []
    for a, *rest in rows:
        traj, _, setting = a.partition("@")
        setting = setting or "default"
        out.append((order.index(setting) if setting in order else len(order), setting, traj, *rest))
    out.sort(key=lambda x: (x[0], x[2] != FP32, x[2] != MX_ALL, x[2]))
    return [x[1:] for x in out]


def markdown_e3_progress(events):
    """The progress table per (Adam setting, trajectory)."""
    out = [f"| Adam setting | trajectory | seeds (of {len(SEEDS)}) | excursions (Wilson 95 %) | median step |",
           "|---|---|---|---|---|"]
    for setting, traj, n, k, lo, hi, med in _by_setting(progress(events)):
        m = "-" if med is None else f"{med:.0f}"
        out.append(f"| {E3_SETTING_TEXT.get(setting, setting)} | {traj} | {n} | {k}/{n} ({lo:.2f}–{hi:.2f}) | {m} |")
    return "\n".join(out)


LEVEL_STEPS = 2000   # the loss level: the median block minimum over a trajectory's last 2,000 steps


def loss_levels(trajs, steps=LEVEL_STEPS):
    """{(seed, trajectory): the median of the block minima over the trajectory's last `steps` steps
    (its last steps / 100 full blocks; a block without a finite loss counts as +inf)} of
    {(seed, trajectory): trajectory of reanalysis_excursion.read_blocks} (checked_setting_trajectories):
    how low a trajectory's loss sits at the end, beside whether it had an excursion (descriptive)."""
    n = steps // R.BLOCK
    out = {}
    for (seed, name), t in trajs.items():
        mins = t["mins"][:-1] if t["partial"] else t["mins"]
        if len(mins) < n:
            raise StudyError(f"seed {seed} {name}: {len(mins)} full blocks, fewer than the last {steps} steps")
        out[(seed, name)] = statistics.median(mins[-n:])
    return out


def markdown_levels(levels):
    """Per (Adam setting, trajectory) the median over seeds of loss_levels and its quartiles."""
    by = {}
    for (_, a), v in levels.items():
        by.setdefault(a, []).append(v)
    rows = [(a, len(vs), statistics.quantiles(sorted(vs), n=4, method="inclusive") if len(vs) > 1 else [vs[0]] * 3)
            for a, vs in by.items()]
    out = [f"| Adam setting | trajectory | seeds | loss level, last {LEVEL_STEPS:,} steps: median over seeds "
           "(quartiles) |", "|---|---|---|---|"]
    for setting, traj, n, (q1, med, q3) in _by_setting(rows):
        out.append(f"| {E3_SETTING_TEXT.get(setting, setting)} | {traj} | {n} | {med:.3g} ({q1:.3g}–{q3:.3g}) |")
    return "\n".join(out)


def print_levels(trajs):
    """Print the loss levels' table of a report (e3, confirm), or why it is not shown."""
    try:
        levels = loss_levels(trajs)
    except StudyError as e:  # runs shorter than the window (a test's): the rest of the report stands
        print(f"\nLoss levels: not shown ({e})")
    else:
        print("\nLoss levels (descriptive):\n")
        print(markdown_levels(levels))


def e3_fixes(events):
    """[(setting's MX-all, Cox vs the default mx_all, Cox vs the default fp32, classification)] of
    E3_RECIPES (the amendment of 2026-11-28; fix_class)."""
    out = []
    for r in E3_RECIPES:
        vm, vf = compare(events, r, MX_ALL)[1], compare(events, r, FP32)[1]
        out.append((r, vm, vf, fix_class(vm, vf)))
    return out


def _seeds_line(events, expected=SEEDS):
    seeds = sorted({s for s, _ in events})
    return seeds, f"{len(seeds)} of {len(expected)} seeds ({', '.join(map(str, seeds))})"


@_one_line_errors
def main_e3(argv):
    a = _args(argv, "e3", "E3", "e3", more=_e3_options)
    if a.confirm and not a.figure:
        raise StudyError("--confirm names the figure's second panel: give --figure PNG too")
    trajs = checked_setting_trajectories(a.dir, E3_TRAJECTORIES)
    events = {k: R.excursion(t) for k, t in trajs.items()}
    _, seeds = _seeds_line(events)
    paired = pairing_check_blocks(a.dir, a.e1, keep_row=_default_setting)
    print(f"e3: {seeds}; excursion k=10, B=100, W=500; C++ and Python agree on all {len(events)} trajectories; "
          f"the default setting's fp32 and mx_all equal E1's loss blocks bit for bit on all {paired} "
          "(seed, trajectory)")
    print(markdown_e3_progress(events))
    if complete(events, E3_TESTS):
        res = run_family(events, E3_TESTS)
        print("\nE3's pre-registered family (m = 6, Holm; within-seed permutation log-rank, seed-stratified Cox, "
              "Breslow ties; across settings, a seed's trajectories of different runs are paired):\n")
        print(markdown_tests(events, E3_TESTS, res, e3_readings(res)))
        print("\nEvery trajectory against the default setting's mx_all and fp32 (descriptive, not tests):\n")
        print(markdown_every_arm(every_arm(events)))
        print(f"\nMX-all at the other Adam settings as recipes (the amendment of 2026-11-28: classified as E4's, "
              f"against the default setting's mx_all and fp32; a fix or a candidate fix is confirmed on seeds "
              "240-259 at lr 6e-4, experiments/paper/why_mx_confirm_adam.yaml):\n")
        print(markdown_fixes(e3_fixes(events)))
    else:
        print("\nconfirmatory tests: not run until all 40 seeds have finished every setting and arm "
              "(pre-registration)")
    print_levels(trajs)
    if a.figure:
        figure_adam(events, load_confirm(a.confirm)[0] if a.confirm else None, a.figure)
        print(f"\nwrote {a.figure}")


@_one_line_errors
def main_e4(argv):
    a = _args(argv, "e4", "E4", "e4", more=lambda ap: ap.add_argument(
        "--figure", metavar="PNG", help="also write the Kaplan-Meier figure of E4's arms"))
    trajs = checked_trajectories(a.dir)
    events = {k: R.excursion(t) for k, t in trajs.items()}
    _, seeds = _seeds_line(events)
    paired = pairing_check_blocks(a.dir, a.e1)
    print(f"e4: {seeds}; excursion k=10, B=100, W=500; C++ and Python agree on all {len(events)} trajectories; "
          f"fp32 and mx_all equal E1's loss blocks bit for bit on all {paired} (seed, trajectory)")
    print(markdown_progress(progress(events), len(SEEDS)))
    if complete(events, E4_TESTS):
        res = run_family(events, E4_TESTS)
        print("\nE4's pre-registered family (m = 6 with rot_e1, Holm; within-seed permutation log-rank, "
              "seed-stratified Cox, Breslow ties):\n")
        print(markdown_tests(events, E4_TESTS, res, e4_readings(res)))
        print(f"\nFixes (pre-registration and its amendment of 2026-11-28: a fix has an HR vs fp32 whose 95 % "
              f"interval is not above 1 with upper bound < {FIX_HI:g}; a candidate fix, HR vs mx_all <= "
              f"{CANDIDATE_HR:g} with an interval vs fp32 not above 1; either is confirmed on seeds 240-259 at lr "
              "6e-4 before it is called one):\n")
        fixes = e4_fixes(res)
        print(markdown_fixes(fixes))
        if all(c == "no fix" for _, _, _, c in fixes):
            print("\nNo recipe is a fix or a candidate fix: nothing of E4 is confirmed, and its confirmation "
                  "(seeds 240-259 at lr 6e-4) is not run (the amendment of 2026-11-27).")
        print("\nEvery arm against mx_all and against fp32 (descriptive, not tests):\n")
        print(markdown_every_arm(every_arm(events)))
        print("\nBetween the recipes (descriptive, not tests: deterministic against randomised rotations with "
              "stochastic rounding, all GEMMs against E1's):\n")
        print(markdown_beside(events, [(x, ref) + compare(events, x, ref) for x, ref in E4_BETWEEN], len(SEEDS)))
        print_levels(trajs)
    else:
        print("\nconfirmatory tests: not run until all 40 seeds have finished every arm (pre-registration)")
    if a.figure:
        figure_e4(events, a.figure)
        print(f"\nwrote {a.figure}")


@_one_line_errors
def main_q0(argv):
    a = _args(argv, "q0", "Question 0", "paper_emulator", dir_help="the paper_emulator run set",
              e1_help="E1's directory: mx_all, and the pairing check")
    events = load_q0(a.dir, a.e1)
    _, seeds = _seeds_line(events)
    paired = pairing_check_blocks(a.dir, a.e1, trajectories=(FP32,))
    print(f"q0: {seeds} of the paper_emulator run set, mx_all of the same seeds from E1; excursion k=10, B=100, "
          f"W=500; C++ and Python agree on every trajectory; its fp32 equals E1's loss blocks bit for bit on all "
          f"{paired} seeds")
    print(markdown_progress(progress(events), len(SEEDS)))
    if complete(events, Q0_TESTS):
        res = run_family(events, Q0_TESTS)
        print("\nQuestion 0 (m = 4, Holm; two-sided within-seed permutation log-rank, seed-stratified Cox, "
              "Breslow ties; the question's direction only reads the result):\n")
        print(markdown_tests(events, Q0_TESTS, res, q0_readings(res)))
    else:
        print("\nconfirmatory tests: not run until all 40 seeds have finished (pre-registration)")


@_one_line_errors
def main_confirm(argv):
    a = _args(argv, "confirm", "The confirmation of E4's candidate fixes (amendment of 2026-11-27)", "confirm")
    trajs, events, recipes = confirm_trajectories(a.dir)
    _, seeds = _seeds_line(events, CONFIRM_SEEDS)
    print(f"confirm: {seeds}, lr {CONFIRM_LR:g}; "
          f"recipes {', '.join(recipes)}; excursion k=10, B=100, W=500; C++ and Python agree on all {len(events)} "
          "trajectories")
    print(markdown_progress(progress(events), len(CONFIRM_SEEDS)))
    tests = confirm_tests(recipes)
    if not complete(events, tests, CONFIRM_SEEDS):
        print(f"\nconfirmatory tests: not run until all {len(CONFIRM_SEEDS)} seeds have finished every arm "
              "(pre-registration)")
        return
    res = run_family(events, tests, CONFIRM_SEEDS)
    print(f"\nThe confirmation (m = {len(tests)}, Holm; within-seed permutation log-rank, seed-stratified Cox, "
          "Breslow ties):\n")
    # per test only whether it is significant, and which way: the reading is the recipe's, below
    readings = [directional_verdict("two-sided", None, cox, h) for _, _, cox, h in res]
    print(markdown_tests(events, tests, res, readings, len(CONFIRM_SEEDS)))
    by = {label: (cox, h) for label, _, cox, h in res}
    out = ["| recipe | HR vs mx_all (95 %) | Holm p | HR vs fp32 (95 %) | reading |", "|---|---|---|---|---|"]
    for r in recipes:
        (vm, hm), (vf, _) = by[f"{r} vs mx_all"], by[f"{r} vs fp32"]
        out.append(f"| {r} | {R.hr_cell(vm)} | {hm:.3g} | {R.hr_cell(vf)} | **{confirm_reading(vm, hm, vf)}** |")
    print(f"\nReadings (the fix: (a) significant with HR < 1 and (b)'s interval not above 1 with upper bound "
          f"< {FIX_HI:g}; confirmed: without that bound):\n")
    print("\n".join(out))
    beside = confirm_beside(events, recipes)
    if beside:
        print("\nBeside them, not tests (the amendment of 2026-11-28): FP32 at the setting against the default "
              "FP32 (is the setting specific to MX?) and MX-all against FP32 at the same setting:\n")
        print(markdown_beside(events, beside, len(CONFIRM_SEEDS)))
    print_levels(trajs)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    sub = {"e2": main_e2, "e3": main_e3, "e4": main_e4, "q0": main_q0, "confirm": main_confirm}
    if argv[:1] and argv[0] in sub:
        return sub[argv[0]](argv[1:])
    return main_e1(argv)


@_one_line_errors
def main_e1(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "why_mx", "e1"))
    ap.add_argument("--figure", metavar="PNG", help="also write the Kaplan-Meier figure of E1's arms (all 40 seeds)")
    a = ap.parse_args(argv)
    events = load(a.dir)
    seeds = sorted({s for s, _ in events})
    a.family = {x for t in E1_TESTS for x in t[1:3]} <= {arm for _, arm in events}
    print(f"{os.path.basename(os.path.normpath(a.dir))}: {len(seeds)} of {len(SEEDS)} seeds finished ({', '.join(map(str, seeds))}); "
          f"excursion k=10, B=100, W=500; C++ and Python agree on all {len(events)} trajectories")
    print(markdown_progress(progress(events), len(SEEDS)))
    if seeds == SEEDS and a.family:
        print("\nE1's pre-registered family (m = 16, Holm; within-seed permutation log-rank, seed-stratified Cox, Breslow ties):\n")
        print(markdown_family(family(events), secondary(events, tails(a.dir))))
        print("\nEvery arm against mx_all and against fp32 (descriptive, not tests):\n")
        print(markdown_every_arm(every_arm(events)))
        if a.figure:
            figure(events, a.figure)
            print(f"\nwrote {a.figure}")
    elif seeds == SEEDS:
        print("\n(the run set has all 40 seeds; its own family is not E1's: see the pre-registration)")
    else:
        print("\nconfirmatory tests: not run until all 40 seeds have finished (pre-registration)")


if __name__ == "__main__":
    sys.exit(main())
