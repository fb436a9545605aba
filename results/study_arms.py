#!/usr/bin/env python3
"""A recipe-arms study over seeds (results/README.md §10; §11's fresh-seed survival study): merges the
shards' summaries and prints its table, tests and figure, from committed CSVs only.

Each shard (`[MXLAB_SHARD=i/n] [MXLAB_GPUS=0,1] bash experiments/paper/run_repro.sh K OUT` on the
GPU machine) writes OUT/summary_study_arms_shard<i>of<n>.csv (or ...shardall.csv: `mxlab
summarize DIR --csv`, one row per trajectory); commit those under results/study_arms/. Then:

  python3 results/study_arms.py [--dir results/study_arms] [--figure results/figures/study_arms_lr5e-4.png]

Part M (§11, 20k steps at two learning rates) the same way, one study per lr:

  python3 results/study_arms.py --dir results/fresh_seeds_20k --prefix summary_fresh_seeds_20k_shard \
      --split optimizer.lr --figure results/figures/fresh_seeds_20k.png --title "fresh seeds, 20k steps"

Per arm (the FP32 trajectory counts as the arm `fp32`): seeds n, diverged k/n with a Wilson 95 %
interval, degraded k/n (final loss > 2 x the same run's FP32 minimum loss), median divergence
step. Tests, for diverged and for degraded: every arm against the paper's emulator (`floor_away`)
and against FP32, two-sided Fisher exact (unpaired) and exact McNemar (paired by seed: the arms
of a seed share its initial weights and batches), Holm-corrected within each family; a
family-level exchangeability test: is FP32 a seed's failing trajectory less often than chance?;
and a permutation test of a seed effect: do the MX arms fail in the same seeds? Only runs whose
every trajectory finished count there (an interrupted run is listed and left out).

Censored statistics: "steps to divergence" per arm as Kaplan-Meier estimates with 95 %
log-log bands, and log-rank tests of every arm against FP32 and against the reference (Holm within
each family), from analysis/mxlab/survival.py. Here every trajectory counts, an
interrupted run's too: an event at its divergence step, else censored where it stopped.

A sustained divergence (--sustained W): the divergence step of `mxlab summarize` is the first step
from which the loss never again falls below 10 x its earlier minimum *up to the run's last step*,
so a loss that is just above that line at the last few steps counts as a divergence at the
horizon (the 10k study has 9 of its 43 events in its last 100 steps). With W > 0 a trajectory counts as
diverged only when that excursion lasted at least W steps (divergence step <= steps_run - W), and
every trajectory is censored at steps_run - W otherwise: the same window for all, so the tests
stay fair. W = 0 (default) is the plain criterion. --sensitivity 0,250,500,1000 prints, per W,
each arm's events and its log-rank p-values (Holm) against FP32 and the reference.
Its divergence is the old rule, which looks into the future (stats_util.diverged_to_end);
results/reanalysis_excursion.py redoes §10-§11 with the excursion (README §12).
Standard library + numpy (through the survival module), matplotlib for the figure.
"""
import argparse
import csv
import glob
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from stats_util import (diverged_to_end, diverged_to_end_column, fisher_two_sided, holm, mcnemar_exact,  # noqa: E402
                        poisson_binomial_cdf, wilson)

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "analysis"))

REFERENCE = "floor_away"  # the comparison arm (--reference)
PREFIX = "summary_study_arms_shard"
DEFAULT_TITLE = "lr 5e-4, L = 4, d = 512: MX recipes as arms sharing each seed's FP32 run"
DEGRADED_FACTOR = 2.0
FINISHED = ("complete", "diverged")


def load(directory, prefix=PREFIX):
    """({run_id: {group: row}}, [interrupted run ids]) from every shard CSV `prefix`*.csv in
    `directory`; a run that appears in several shards (a rerun) must agree, else it is an error."""
    return finished(load_all(directory, prefix))


def finished(runs):
    """(the runs whose every trajectory finished, [the others' ids]) of load_all's runs."""
    done = {rid: g for rid, g in runs.items() if all(r["status"] in FINISHED for r in g.values())}
    return done, sorted(set(runs) - set(done))


def load_all(directory, prefix=PREFIX):
    """{run_id: {group: row}} of every run in the shards, finished or not (load's merge rules)."""
    runs = {}
    paths = sorted(glob.glob(os.path.join(directory, prefix + "*.csv")))
    if not paths:
        raise SystemExit(f"study_arms: no {prefix}*.csv in {directory}")
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("at"):
                    continue  # branches are not arms
                rid, group = row["run_id"], row["group"]
                prev = runs.setdefault(rid, {}).get(group)
                if prev is not None and (prev["status"] in FINISHED and row["status"] in FINISHED and
                                         (diverged_to_end_column(prev), prev["final_loss"]) !=
                                         (diverged_to_end_column(row), row["final_loss"])):
                    raise SystemExit(f"study_arms: run {rid} {group} differs between shards ({path})")
                if prev is None or row["status"] in FINISHED:
                    runs[rid][group] = row
    return runs


def per_arm(runs, sustained=0):
    """{arm: {'n', 'div', 'deg', 'steps', 'seeds_div', 'seed': {seed: (diverged, degraded)}}} over
    the finished runs; 'seed' pairs the arms' outcomes by seed (same initial weights and batches).
    Diverged: for at least `sustained` steps (diverged_to_end)."""
    out = {}
    for rid, groups in sorted(runs.items(), key=lambda kv: int(kv[1]["fp32"]["seed"])):
        fmin = float(groups["fp32"]["min_loss"])
        for arm, row in groups.items():
            a = out.setdefault(arm, {"n": 0, "div": 0, "deg": 0, "steps": [], "seeds_div": [], "seed": {},
                                     "horizon": 0})
            a["n"] += 1
            a["horizon"] = max(a["horizon"], int(row["steps_run"]))
            div, d = diverged_to_end(row, sustained)
            deg = float(row["final_loss"]) > DEGRADED_FACTOR * fmin
            if div:
                a["div"] += 1
                a["steps"].append(d)
                a["seeds_div"].append(int(row["seed"]))
            if deg:
                a["deg"] += 1
            a["seed"][int(row["seed"])] = (div, deg)
    return out


def references(reference):
    """The comparison arms: FP32, then the reference when it is another arm (--reference fp32
    compares with FP32 once, not twice)."""
    return list(dict.fromkeys(("fp32", reference)))


def compared_with(arms, ref, reference):
    """The arms tested against `ref`: every other one, except FP32 against the reference (that
    pair is already FP32's family)."""
    return [a for a in arms if a != ref and not (ref == reference and a == "fp32")]


def arm_order(arms, ref=REFERENCE):
    first = [a for a in references(ref) if a in arms]
    return first + sorted(a for a in arms if a not in first)


def paired(stats, a, ref, outcome):
    """(seeds where only `a` had the outcome, seeds where only `ref` had it): the discordant pairs
    of a McNemar test. outcome 0: diverged, 1: degraded."""
    seeds = set(stats[a]["seed"]) & set(stats[ref]["seed"])
    only_a = sum(1 for x in seeds if stats[a]["seed"][x][outcome] and not stats[ref]["seed"][x][outcome])
    only_ref = sum(1 for x in seeds if stats[ref]["seed"][x][outcome] and not stats[a]["seed"][x][outcome])
    return only_a, only_ref


def comparisons(stats, outcome, reference=REFERENCE):
    """The test table of one outcome (0: diverged, 1: degraded): every arm against FP32 and
    against the paper's emulator; Fisher exact (unpaired) and exact McNemar (paired by seed), each
    Holm-corrected within its family (one reference = one family). * marks Holm-adjusted p < 0.05."""
    key = ("div", "deg")[outcome]
    arms = arm_order(stats, reference)
    lines = [f"| comparison | {('diverged', 'degraded')[outcome]} | Fisher p (Holm) | seeds only a / only ref | "
             "McNemar p (Holm) |", "|---|---|---|---|---|"]
    for ref in references(reference):
        if ref not in stats:
            continue
        others = compared_with(arms, ref, reference)
        fp = [fisher_two_sided(stats[a][key], stats[a]["n"], stats[ref][key], stats[ref]["n"]) for a in others]
        pairs = [paired(stats, a, ref, outcome) for a in others]
        mp = [mcnemar_exact(b, c) for b, c in pairs]
        for a, p, adj, (b, c), q, qadj in zip(others, fp, holm(fp), pairs, mp, holm(mp)):
            star = lambda x: " *" if x < 0.05 else ""
            lines.append(f"| {a} vs {ref} | {stats[a][key]}/{stats[a]['n']} vs {stats[ref][key]}/{stats[ref]['n']} | "
                         f"{p:.3g} ({adj:.3g}{star(adj)}) | {b} / {c} | {q:.3g} ({qadj:.3g}{star(qadj)}) |")
    return "\n".join(lines)


def family(stats, outcome):
    """Is the FP32 trajectory more stable than the MX arms as a family? Conditional exact test:
    if the seed's trajectories (FP32 and the m arms) were exchangeable, the FP32 one would be each
    seed's failing one with probability (failures in that seed) / (m + 1), independently over
    seeds; the p-value is P(FP32 fails in <= the observed number of seeds) under that
    Poisson-binomial law (one-sided). Returns (FP32 failures, failing trajectories, trajectories,
    p)."""
    seeds = stats["fp32"]["seed"]
    arms = [a for a in stats if seeds.keys() <= stats[a]["seed"].keys()]
    probs, fails = [], 0
    for x in seeds:
        m = sum(1 for a in arms if stats[a]["seed"][x][outcome])
        fails += m
        probs.append(m / len(arms))
    k = sum(1 for x in seeds if seeds[x][outcome])
    return k, fails, len(arms) * len(seeds), poisson_binomial_cdf(probs, k)


def seed_effect(stats, outcome, permutations=20000, rng_seed=1):
    """Do the MX arms fail in the same seeds? The per-seed count of failing MX arms, its variance,
    and a permutation p-value: each arm's outcomes shuffled over the seeds independently (keeping
    every arm's failure count), P(variance >= the observed one). Overdispersed counts mean that a
    seed (its initial weights and batch order) is unstable under many recipes at once. A fixed
    RNG seed makes the p-value reproducible; its Monte Carlo error is ~ sqrt(p / permutations)."""
    import random

    seeds = sorted(stats["fp32"]["seed"])
    rows = [[stats[a]["seed"][x][outcome] for x in seeds] for a in stats if a != "fp32"]

    def variance(cols):
        counts = [sum(col[j] for col in cols) for j in range(len(seeds))]
        return counts, statistics.pvariance(counts)

    counts, observed = variance(rows)
    rng = random.Random(rng_seed)
    hits = sum(1 for _ in range(permutations)
               if variance([rng.sample(r, len(r)) for r in rows])[1] >= observed - 1e-12)
    return counts, observed, (hits + 1) / (permutations + 1)


def tables(stats, reference=REFERENCE):
    """(per-arm table, diverged tests, degraded tests, family line)."""
    arms = arm_order(stats, reference)
    lines = ["| arm | seeds | diverged (Wilson 95 %) | degraded (Wilson 95 %) | median divergence step |",
             "|---|---|---|---|---|"]
    for a in arms:
        s = stats[a]
        lo, hi = wilson(s["div"], s["n"])
        dlo, dhi = wilson(s["deg"], s["n"])
        med = f"{statistics.median(s['steps']):.0f}" if s["steps"] else "-"
        lines.append(f"| {a} | {s['n']} | {s['div']}/{s['n']} ({lo:.2f}–{hi:.2f}) | "
                     f"{s['deg']}/{s['n']} ({dlo:.2f}–{dhi:.2f}) | {med} |")
    fam = []
    if "fp32" in stats and len(stats) > 1:
        for outcome, word in ((0, "diverged"), (1, "degraded")):
            k, fails, total, p = family(stats, outcome)
            fam.append(f"{word}: FP32 in {k} of the {fails} failing trajectories (of {total}); if a seed's "
                       f"trajectories were exchangeable, P(FP32 <= {k}) = {p:.3g} (one-sided)")
            counts, var, p = seed_effect(stats, outcome)
            fam.append(f"{word}: MX arms failing per seed {counts}, variance {var:.2f}; arms shuffled over seeds "
                       f"independently: P(variance >= observed) = {p:.3g}")
    return "\n".join(lines), comparisons(stats, 0, reference), comparisons(stats, 1, reference), "\n".join(fam)


def subjects(runs, sustained=0):
    """{arm: (times, events)} over every trajectory of `runs` (finished or not): the event is its
    divergence (stats_util.diverged_at) lasting `sustained` steps, else it is censored at
    steps_run - sustained (diverged_to_end)."""
    out = {}
    for groups in runs.values():
        for arm, row in groups.items():
            e, step = diverged_to_end(row, sustained)
            t, ev = out.setdefault(arm, ([], []))
            t.append(step)
            ev.append(e)
    return out


def logrank_tests(subj, reference=REFERENCE):
    """{ref: [(arm, chi2, p, Holm p)]} for ref in (fp32, reference): every other arm (not FP32
    against the reference) by log-rank; chi2 = p = Holm p = nan when no event happened while both
    were at risk (Holm over the tests that exist)."""
    from mxlab.survival import logrank

    arms = arm_order(subj, reference)
    out = {}
    for ref in references(reference):
        if ref not in subj:
            continue
        others = compared_with(arms, ref, reference)
        res = [logrank((subj[a][0], subj[a][1], [0] * len(subj[a][0])),
                       (subj[ref][0], subj[ref][1], [0] * len(subj[ref][0]))) for a in others]
        adj = iter(holm([p for _, p in res if p == p]))
        out[ref] = [(a, chi2, p, next(adj) if p == p else float("nan")) for a, (chi2, p) in zip(others, res)]
    return out


def survival(runs, reference=REFERENCE, sustained=0):
    """(Kaplan-Meier table, log-rank table) of steps to divergence per arm (module docstring)."""
    from mxlab.survival import kaplan_meier

    subj = subjects(runs, sustained)
    arms = arm_order(subj, reference)
    horizon = max(max(t) for t, _ in subj.values())
    lines = [f"| arm | trajectories | diverged | censored before {horizon} | S({horizon}) (95 % band) | "
             "median steps to divergence |", "|---|---|---|---|---|---|"]
    for a in arms:
        t, e = subj[a]
        km = kaplan_meier(t, e)
        early = sum(1 for ti, ei in zip(t, e) if not ei and ti < horizon)
        if km.n_events:
            lo, hi = km.lower[-1], km.upper[-1]
            band = f"{km.at(horizon):.3f} ({lo:.3f}–{hi:.3f})" if lo == lo else f"{km.at(horizon):.3f} (–)"
        else:
            band = "1 (no event)"
        med = km.median if km.median is not None else f"> {horizon}"
        lines.append(f"| {a} | {km.n} | {km.n_events} | {early} | {band} | {med} |")
    tests = ["| log-rank | diverged a vs ref | chi2 | p (Holm) |", "|---|---|---|---|"]
    for ref, rows in logrank_tests(subj, reference).items():
        for a, chi2, p, q in rows:
            n_a, n_r = sum(subj[a][1]), sum(subj[ref][1])
            if p != p:
                tests.append(f"| {a} vs {ref} | {n_a} vs {n_r} | – | no event while both at risk |")
                continue
            tests.append(f"| {a} vs {ref} | {n_a} vs {n_r} | {chi2:.2f} | {p:.3g} ({q:.3g}{' *' if q < 0.05 else ''}) |")
    return "\n".join(lines), "\n".join(tests)


def sensitivity(runs, windows, reference=REFERENCE):
    """A table over sustained-divergence windows W (module docstring): per arm and W, events / trajectories,
    and the Holm-adjusted log-rank p against FP32 and against the reference (- for itself, or no
    event while both at risk)."""
    cols = {}
    for w in windows:
        subj = subjects(runs, w)
        tests = logrank_tests(subj, reference)
        cols[w] = (subj, {ref: {a: q for a, _, _, q in rows} for ref, rows in tests.items()})
    arms = arm_order(cols[windows[0]][0], reference)
    refs = references(reference)
    head = "| arm | " + " | ".join(f"W = {w}: events; p vs " + ", vs ".join(refs) for w in windows) + " |"
    lines = [head, "|---|" + "---|" * len(windows)]
    fmt = lambda q: "–" if q is None or q != q else f"{q:.2g}{'*' if q < 0.05 else ''}"
    for a in arms:
        cells = []
        for w in windows:
            subj, q = cols[w]
            e = subj[a][1]
            cells.append(f"{sum(e)}/{len(e)}; " + ", ".join(fmt(q.get(r, {}).get(a)) for r in refs))
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_runs(runs, key):
    """{value: runs} by the value of configuration column `key` (e.g. optimizer.lr, a swept key of
    `mxlab summarize --csv`) in each run's FP32 row; {None: runs} without a key."""
    if not key:
        return {None: runs}
    out = {}
    for rid, groups in runs.items():
        row = groups["fp32"]
        if key not in row:
            raise SystemExit(f"study_arms: --split {key}: no such column (columns: {', '.join(row)})")
        out.setdefault(row[key], {})[rid] = groups
    return dict(sorted(out.items(), key=lambda kv: float(kv[0]) if _is_number(kv[0]) else kv[0]))


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def figure(stats, path, runs_all, title=DEFAULT_TITLE, reference=REFERENCE, sustained=0):
    """Three panels: per-arm rates with Wilson intervals, the seed x arm outcome grid, and the
    fraction diverged by each step: 1 - Kaplan-Meier over every trajectory of `runs_all` (finished
    or not), with the 95 % band for FP32 and the reference arm."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = arm_order(stats, reference)
    seeds = sorted(stats[arms[0]]["seed"])
    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(17, 0.45 * len(arms) + 1.6),
                                     gridspec_kw={"width_ratios": [1, max(1.0, len(seeds) / 14), 1]})
    for y, a in enumerate(arms):
        s = stats[a]
        for k, (key, colour, dy) in enumerate((("div", "tab:red", -0.14), ("deg", "tab:orange", 0.14))):
            lo, hi = wilson(s[key], s["n"])
            rate = s[key] / s["n"]
            ax.errorbar(rate, y + dy, xerr=[[rate - lo], [hi - rate]], fmt="o", color=colour, capsize=3,
                        label=("diverged", "degraded (final > 2 x FP32 min)")[k] if y == 0 else None)
        ax.text(1.02, y, f"{s['div']}/{s['n']}, {s['deg']}/{s['n']}", va="center", fontsize=7)
    ax.set_yticks(range(len(arms)))
    ax.set_yticklabels(arms)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of seeds (Wilson 95 % interval)")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(title, fontsize=8)
    for y, a in enumerate(arms):
        for x, seed in enumerate(seeds):
            div, deg = stats[a]["seed"].get(seed, (False, False))
            if div:
                bx.plot(x, y, "s", color="tab:red", ms=8)
            elif deg:
                bx.plot(x, y, "s", mfc="none", mec="tab:orange", ms=8, mew=1.5)
    bx.set_yticks(range(len(arms)))
    bx.set_yticklabels(arms, fontsize=7)
    bx.set_xticks(range(len(seeds)))
    bx.set_xticklabels(seeds, fontsize=7)
    bx.set_xlim(-0.5, len(seeds) - 0.5)
    bx.set_ylim(len(arms) - 0.5, -0.5)
    bx.set_xlabel("seed (filled: diverged; open: degraded only)")
    bx.grid(True, lw=0.3)
    from mxlab.survival import kaplan_meier

    subj = subjects(runs_all, sustained)
    horizon = max(max(t) for t, _ in subj.values())
    cmap = plt.get_cmap("tab10")
    for i, a in enumerate(arms):
        if a not in subj:
            continue
        km = kaplan_meier(*subj[a])
        colour = "0.2" if a == "fp32" else cmap(i % 10)
        xs, ys = [0], [0.0]
        for t, sv in zip(km.times, km.survival):
            xs += [t, t]
            ys += [ys[-1], 1.0 - sv]
        xs.append(horizon)
        ys.append(ys[-1])
        cx.plot(xs, ys, color=colour, lw=2.2 if a in ("fp32", reference) else 1.2, label=a)
        if a in ("fp32", reference) and km.n_events:
            lo = [0.0] + [1.0 - u for u in km.upper] + [1.0 - km.upper[-1]]
            hi = [0.0] + [1.0 - v for v in km.lower] + [1.0 - km.lower[-1]]
            cx.fill_between([0] + list(km.times) + [horizon], lo, hi, step="post", color=colour, alpha=0.15, lw=0)
    cx.set_xlim(0, horizon)
    cx.set_ylim(0, min(1.0, max(0.5, max(stats[a]["div"] / stats[a]["n"] for a in arms) + 0.1)))
    cx.set_xlabel("step")
    cx.set_ylabel("diverged by then: 1 - Kaplan-Meier (band: 95 %)")
    cx.legend(fontsize=6, loc="upper left")
    cx.grid(True, lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(HERE, "study_arms"))
    ap.add_argument("--prefix", default=PREFIX, help=f"shard CSV names start with this (default {PREFIX})")
    ap.add_argument("--reference", default=REFERENCE, help=f"the arm every other is compared with (default {REFERENCE})")
    ap.add_argument("--split", default=None, metavar="KEY",
                    help="a separate study per value of this swept configuration column, e.g. optimizer.lr")
    ap.add_argument("--figure", default=None, help="write the figure here (PNG); with --split, one per value "
                                                   "(KEY=VALUE before the extension)")
    ap.add_argument("--title", default=DEFAULT_TITLE, help="the figure's title")
    ap.add_argument("--sustained", type=int, default=0, metavar="W",
                    help="count a divergence only when it lasted at least W steps before the run's end; "
                         "censor every trajectory at steps_run - W (default 0: the plain criterion)")
    ap.add_argument("--sensitivity", default=None, metavar="W,W,...",
                    help="also print events and log-rank p-values for each of these windows W, e.g. 0,250,500,1000")
    a = ap.parse_args(argv)
    if a.sustained < 0:
        raise SystemExit("study_arms: --sustained must be >= 0")
    windows = None
    if a.sensitivity:
        try:
            windows = [int(w) for w in a.sensitivity.split(",")]
        except ValueError:
            raise SystemExit(f"study_arms: --sensitivity {a.sensitivity}: a comma-separated list of steps") from None
        if any(w < 0 for w in windows):
            raise SystemExit("study_arms: --sensitivity: windows must be >= 0")
    all_runs = load_all(a.dir, a.prefix)
    runs, interrupted = finished(all_runs)
    if not runs:
        raise SystemExit("study_arms: no finished run in the shards")
    every = split_runs(all_runs, a.split)
    for value, part in split_runs(runs, a.split).items():
        stats = per_arm(part, a.sustained)
        t1, t2, t3, fam = tables(stats, a.reference)
        seeds = sorted(int(g["fp32"]["seed"]) for g in part.values())
        if value is not None:
            print(f"## {a.split} = {value}\n")
        if a.sustained:
            print(f"Sustained divergences only: lasting >= {a.sustained} steps; trajectories censored "
                  f"{a.sustained} steps before their end.\n")
        print(f"{len(part)} finished runs (seeds {', '.join(map(str, seeds))})" +
              (f"; left out, not finished: {', '.join(interrupted)}" if interrupted else ""))
        print("\n" + t1 + "\n\nDiverged:\n" + t2 + "\n\nDegraded:\n" + t3 + ("\n\n" + fam if fam else ""))
        km, lr = survival(every[value], a.reference, a.sustained)
        print("\nSteps to divergence, every trajectory (interrupted runs censored where they stopped):\n" + km +
              "\n\n" + lr)
        if windows:
            print("\nSensitivity to the sustained-divergence window W (log-rank, Holm-adjusted p; * < 0.05):\n" +
                  sensitivity(every[value], windows, a.reference))
        if a.figure:
            path = a.figure
            title = a.title
            if value is not None:
                stem, ext = os.path.splitext(a.figure)
                path = f"{stem}_{a.split}={value}{ext}"
                title = f"{a.title} ({a.split} = {value})"
            figure(stats, path, every[value], title, a.reference, a.sustained)
            print(f"\nwrote {path}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
