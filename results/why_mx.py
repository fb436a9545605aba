#!/usr/bin/env python3
"""The causal study's analysis (pre-registered in results/prereg/why_mx.md), from the committed
CSVs of results/why_mx/<experiment>/: the 100-step loss blocks (results/extract_loss_blocks.py)
and `mxlab summarize --csv` of the same runs.

    python3 results/why_mx.py [--dir results/why_mx/e1] [--markdown]
    python3 results/why_mx.py e2 [--dir results/why_mx/e2]

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
Holm over m = 2, the verdicts) runs once every seed has all three branch points."""
import argparse
import csv
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


# The pre-registered verdict rules ("Verdicts" and "E1"): supported when the Holm-adjusted p is
# below ALPHA and the HR lies in the hypothesis's direction; falsified when the HR's 95 % interval
# excludes the effect the hypothesis needs; otherwise undecided.
ALPHA = 0.05
N_FALSIFY_HI, N_FALSIFY_LO = 0.5, 0.19  # N-*: falsified if hi >= 0.5 and lo > 0.19 (FP32's hazard out of reach)
S_FALSIFY_HI = 2.0                      # S-*: falsified if hi < 2
DRIVER_FALSIFY_HI = 1.0                 # "Wgrad is the main driver": falsified if either hi < 1


def verdict(label, direction, cox, holm_p):
    """'supported', 'falsified' or 'undecided' for one test of E1's family (the rules above). An HR
    with no estimate (no informative seed) is undecided."""
    if label.startswith("N-"):
        falsified = cox.hi >= N_FALSIFY_HI and cox.lo > N_FALSIFY_LO
    elif label.startswith("S-"):
        falsified = cox.hi < S_FALSIFY_HI
    else:
        falsified = cox.hi < DRIVER_FALSIFY_HI
    in_direction = cox.hr < 1 if direction == "<1" else cox.hr > 1
    if holm_p < ALPHA and in_direction:
        return "supported"
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
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["status"] in ("complete", "diverged"):
                    v = r["tail_log_ratio"]
                    out[(int(r["seed"]), r["group"])] = 0.0 if r["group"] == FP32 and v == "" else float(v)
    return out


def secondary(events, tail):
    """Per test of the family, the pre-registration's secondary readings (not tests): the asymptotic
    stratified log-rank p and the paired Wilcoxon signed-rank test of tail_log_ratio (arm vs
    reference, by seed): [(label, p_asym, Wilcoxon)]."""
    out = []
    for label, a, ref, _ in E1_TESTS:
        seeds = sorted(s for s, b in events if b == a and (s, ref) in events)
        lr = P.permutation_logrank(_pairs(events, a, ref))
        w = P.wilcoxon_paired([tail[(s, a)] for s in seeds], [tail[(s, ref)] for s in seeds])
        out.append((label, lr.p_asym, w))
    return out


def _pairs(events, a, ref):
    keys = sorted(events)
    return P.make_pairs([events[k][1] for k in keys], [events[k][0] for k in keys], [k[0] for k in keys],
                        [k[1] for k in keys], a, ref)


def every_arm(events, refs=(MX_ALL, FP32)):
    """Descriptive (pre-registration "E1": every arm's HR against MX-all and against FP32, not
    tests): [(arm, ref, LogRank, Cox)]."""
    arms = sorted({a for _, a in events}, key=lambda a: (a != FP32, a != MX_ALL, a))
    return [(a, ref, P.permutation_logrank(_pairs(events, a, ref)),
             P.cox_stratified(_pairs(events, a, ref), ties="breslow"))
            for ref in refs for a in arms if a != ref]


def markdown_family(res, sec):
    """E1's family as a markdown table: counts, permutation p, Holm p, HR, verdict, secondary."""
    out = ["| test | arm vs reference (direction) | first event arm/ref | permutation p | Holm p | HR (95 %) | verdict "
           "| asymptotic log-rank p | tail_log_ratio: Hodges–Lehmann (95 %), Wilcoxon p |",
           "|---|---|---|---|---|---|---|---|---|"]
    verdicts = {}
    for (label, lr, cox, h), (_, p_asym, w), (_, a, ref, d) in zip(res, sec, E1_TESTS):
        v = verdict(label, d, cox, h)
        verdicts[label] = v
        out.append(f"| {label} | {a} vs {ref} (HR {d}) | {lr.arm_first}/{lr.ref_first} | {lr.p_perm:.3g} | {h:.3g} | "
                   f"{R.hr_cell(cox)} | **{v}** | {p_asym:.3g} | {w.hl:+.3g} ({w.hl_lo:+.3g} to {w.hl_hi:+.3g}), {w.p:.3g} |")
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
            xs, ys, _ = km_curve([ev for (s, a), ev in events.items() if a == arm])
            ax.step(xs, ys, where="post", label=arm, **style)
        for i, arm in enumerate(arms):
            xs, ys, _ = km_curve([ev for (s, a), ev in events.items() if a == arm])
            ax.step(xs, ys, where="post", label=arm, color=colours[i % 4 if title == "tensor roles" else i % 3],
                    ls="--" if arm.startswith("keep_bf16") else "-", lw=1.3)
        ax.set_title(f"{title}: dashed = that part kept in bf16, solid = only that part MX", fontsize=9)
        ax.set_xlabel("step (excursion onset)")
        ax.set_xlim(0, 20000)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_ylabel("fraction of seeds without an excursion")
    fig.suptitle(f"E1, {n} seeds (200-239), lr 5e-4, 20,000 steps; excursion k = 10, B = 100, W = 500 "
                 "(Kaplan-Meier)", fontsize=10)
    fig.text(0.01, 0.005, "python3 results/why_mx.py --figure " + os.path.basename(path) +
             "; data: results/why_mx/e1/ (experiments/paper/why_mx_e1.yaml)", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    blocks = sorted(glob.glob(os.path.join(directory, "blocks_*.csv")))
    if not blocks:
        raise StudyError(f"no blocks_*.csv in {directory}")
    trajs = {}
    for (seed, lr, name), t in R.read_blocks(blocks, block=block, branches=True).items():
        if (seed, name) in trajs:
            raise StudyError(f"seed {seed} {name}: loss blocks at two learning rates")
        trajs[(seed, name)] = t
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "summary_*.csv"))):
        with open(path, newline="") as f:
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
    e1_paths = sorted(glob.glob(os.path.join(e1_directory, "blocks_*.csv")))
    if not e1_paths:
        return 0
    e1 = {(s, t): v for (s, _, t), v in R.read_blocks(e1_paths).items() if t in trajectories}
    here = {(s, t): v for (s, _, t), v in R.read_blocks(sorted(glob.glob(os.path.join(directory, "blocks_*.csv"))),
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
        with open(path, newline="") as f:
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


def main_e2(argv):
    ap = argparse.ArgumentParser(prog="why_mx.py e2", description="E2 of results/prereg/why_mx.md")
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "why_mx")
    ap.add_argument("--dir", default=os.path.join(here, "e2"))
    ap.add_argument("--e1", default=os.path.join(here, "e1"), help="E1's directory, for the pairing check")
    a = ap.parse_args(argv)
    try:
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
    except (StudyError, R.DataError, OSError) as e:
        print(f"why_mx: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["e2"]:
        return main_e2(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "why_mx", "e1"))
    ap.add_argument("--figure", metavar="PNG", help="also write the Kaplan-Meier figure of E1's arms (all 40 seeds)")
    a = ap.parse_args(argv)
    try:
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
    except (StudyError, R.DataError, OSError) as e:
        print(f"why_mx: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
