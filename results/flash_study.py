#!/usr/bin/env python3
"""The flash-attention study's analysis (pre-registered in results/prereg/flash_bf16.md), from the
CSVs that experiments/paper/run_why_mx.sh and the extractors bring back for
experiments/paper/flash_study.yaml (seeds 300-339; one run per seed trains the trajectories fp32,
flash, stabilized, delta_hp, mxfp8_flash and mxfp8_exact in lock-step; `group` / `trajectory` in
the CSVs).

    python3 results/flash_study.py [--dir results/flash_study] [--pilot results/flash_pilot]
        [--figure [PNG]] [--mechanism-figure [PNG]] [--per-trajectory] [--power-sims 4000]

Reads, all from --dir (every file matching; several device calls may each have brought some):
  summary_*.csv        `mxlab summarize --csv` of the runs (status, the binary's excursion_step);
  blocks_*.csv         results/extract_loss_blocks.py, 100-step loss blocks (the endpoints' input);
  instruments*.csv[.gz]  results/extract_flash_instruments.py (the mechanism's items 1, 2 and the
                       logged spectral norms and W_Q-error cosine);
  spectral*.csv[.gz]   results/extract_spectral.py (item 3: sigma_max, the difference to FP32);
and the pilot's CSVs from --pilot (results/flash_pilot_choice.py: its table and chosen cell), the
pre-registered power table from results/prereg/flash_bf16.md. Nothing is read from run files
(HDF5): the extractors run where the run files are. Only runs the summaries list as finished
(complete or diverged) count; the extractors' rows of other runs are dropped, and rows that two
CSVs both hold must agree. The count of re-runs (runs stopped for a technical reason and resumed)
is not in these CSVs: it comes from the device calls' logs.

Endpoints, per trajectory, from its loss blocks: the primary excursion (k = 10, B = 100, W = 500,
censored at 9,500), which must equal the binary's `excursion_step` on every finished trajectory
(else exit 2: why_mx.checked_trajectories), and the secondary one (k = 2, same B and W).

The study counts once (a) all 40 seeds have every trajectory finished and (b) the pilot is
complete and the study ran its chosen cell (the blocks' lr; the instruments' number of layers,
when there, is its depth): the pre-registration counts no run of the study before the choice.
Until then the script prints an INTERIM table of counts (per arm: seeds, excursions at k = 10 and
k = 2 with Wilson 95 % intervals) and no test and no verdict. A pilot whose choice differs from the
study's configuration is an error (exit 2).

On the complete study:
  - the primary family H1-H5 (k = 10; m = 5, Holm): within-seed permutation log-rank (two-sided,
    exact; paired_stats), seed-stratified Cox with Breslow ties (HR compared / reference, 95 % Wald
    interval; where every informative seed goes one way the one-sided profile-likelihood bound, and
    Firth's estimate beside), the Holm-adjusted p, event counts and the verdict:
      H1 flash vs fp32, H5 mxfp8_flash vs mxfp8_exact (HR > 1): supported when Holm p < 0.05 with
        HR > 1; falsified when the HR's upper 95 % bound < 2;
      H2 stabilized vs flash, H3 delta_hp vs flash (HR < 1): supported when Holm p < 0.05 with
        HR < 1; falsified when the lower bound > 0.5;
      H4 mxfp8_flash vs flash (two-sided): supported when Holm p < 0.05, its direction reported;
        falsified when the 95 % interval lies within [0.5, 2];
      otherwise undecided. Both at once (a significant effect whose interval excludes the effect
      the hypothesis needs) is "mixed", as results/why_mx.py has it (the pre-registration orders
      neither). With fewer than 6 informative seeds (one arm's excursion first while the other is
      at risk) a comparison is undecided by construction, whatever its interval (said so, with
      what the rules alone would have said): 6 is the least that can give p < 0.05.
    An undecided hypothesis is reported with its power for the effect it needed (HR 2 for H1 and
    H5, 0.5 for H2 and H3, 0.5 and 2 for H4, the falsification bounds) at the reference arm's
    observed event fraction (results/prereg/power_flash_bf16.py's model: gamma frailty 0.5,
    censoring at 9,500, n = 40; at 0.05 and at the first Holm step 0.05 / 5), and with the
    pre-registered power rows of its question.
  - beside the family, not tested: every arm against fp32 (mxfp8_exact vs fp32 among them), with
    the unadjusted permutation p and the HR's interval;
  - the secondary family (k = 2): the same five comparisons, criteria and Holm over its own m = 5;
    its verdicts are secondary and change none of the primary ones;
  - if the pilot's rule ended in step C, the null-result statement of the pre-registration;
  - the mechanism (descriptive; "the event" of a trajectory is its first excursion, primary or
    secondary: the k = 2 one, which never comes after the k = 10 one; rows and snapshots before it
    are those at steps < its onset; without an event, all rows and snapshots to the end):
      1. ties: per trajectory and layer the mean of attn_multi_max_frac and attn_multi_one_frac over
         the logged rows; per arm and layer the mean over trajectories, and in how many seeds
         stabilized's attn_multi_one_frac is below flash's (the kernel check);
      2. delta bias (flash, mxfp8_flash): per trajectory and layer the mean of attn_delta_bias, the
         fraction of positive rows, t = mean / (sd / sqrt(rows)) and the running sum;
      3. weights: at the last snapshot before the event (at the end without one), per arm, layer
         and W_Q, W_K, W_V, W_O: sigma_max's ratio to the FP32 trajectory's, the rank-one share
         sigma_1(D)^2 / |D|_F^2 and the direction cosine of D = W_arm - W_fp32; at every snapshot,
         the median sigma_max ratio of W_Q and W_K over the trajectories without an event by then;
         beside them, the largest logged attn_wq_spec, attn_wk_spec and the mean attn_dwq_err_cos
         before the event;
      4. the chain, per flash and mxfp8_flash trajectory: some layer with mean attn_multi_one_frac
         > 0, that layer's |t| > 3, and for its W_Q or W_K a sigma_max ratio that rises over the
         last three snapshots (after step 0) before the event, the last with rank-one share > 0.5
         and direction cosine > 0.9. An event with fewer than three such snapshots (an onset at or
         before step 3,000: the snapshot at the onset step holds the weights the exploded loss was
         computed with, so it is not before the event) is "not evaluable", counted apart; the same
         criteria at the end of the run for trajectories without an event.
    --per-trajectory adds items 1, 2 and 4 per trajectory and layer.
  - exploratory, not pre-registered (after the mechanism): loss spikes the sustained endpoints do
    not count. A trajectory's first spike is the first block (100 steps) starting at step 1,000 or
    later whose maximum loss exceeds 10 x the minimum of every earlier block, or that holds a
    non-finite loss; per arm the trajectories with one and their seeds and steps (the first 1,000
    steps are left out: there the earlier minimum is still the initial loss's).
--figure writes the Kaplan-Meier curves of the six arms (k = 10 and k = 2) to PNG (default
results/figures/flash_study_km.png), the command, the data and the commit in its caption.
--mechanism-figure writes the mechanism's items 1-3 over steps to PNG (default
results/figures/flash_study_mechanism.png), descriptive, on an interim study too (its title says
"interim: n of 40 seeds"): a row per item (1. attn_multi_one_frac and attn_multi_max_frac; 2. the
running sum attn_delta_bias_cumsum, one line per seed, flash and mxfp8_flash; 3. W_Q's and W_K's
sigma_max over FP32's and the rank-one share of their difference, at the snapshots), a column per
arm (fp32, the reference, has none), of the layer with the largest mean attn_multi_one_frac; the
median and interquartile band over the seeds without an event by then (item 2: the seeds' own
lines), each trajectory before its event, an x at each event's onset; the command, the commit and
the configuration in its caption. It needs instruments*.csv[.gz] and spectral*.csv[.gz] (else
exit 2).

Exit codes: 0 printed (an interim count included), 2 the data do not fit the study (one line on
stderr), 74 a figure could not be written.
numpy, scipy, statsmodels (results/paired_stats.py), matplotlib for --figure and --mechanism-figure.
"""
import argparse
import csv
import glob
import importlib.util
import math
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import flash_pilot_choice as C  # noqa: E402
import paired_stats as P  # noqa: E402
import reanalysis_excursion as R  # noqa: E402
import why_mx as W  # noqa: E402

ROOT = os.path.dirname(HERE)
PREREG = os.path.join(HERE, "prereg", "flash_bf16.md")
SEEDS = list(range(300, 340))
STEPS = 10_000
FP32 = "fp32"
ARMS = (FP32, "flash", "stabilized", "delta_hp", "mxfp8_flash", "mxfp8_exact")
FLASH_KERNEL = ("flash", "stabilized", "delta_hp", "mxfp8_flash")  # the arms with the flash instruments
CHAIN_ARMS = ("flash", "mxfp8_flash")
PRIMARY_K, SECONDARY_K = R.FACTOR, 2.0
ALPHA = 0.05
MIN_INFORMATIVE = 6   # the fewest informative seeds that can give p < 0.05 (2^(1-k))
T_DELTA = 3.0         # the chain's |t| of the delta bias
RANK1, DIR_COS = 0.5, 0.9
CHAIN_SNAPSHOTS = 3
SPIKE_FACTOR, SPIKE_AFTER = 10.0, 1000   # the exploratory loss spikes: block max > 10 x the earlier minimum


@dataclass(frozen=True)
class Test:
    label: str
    arm: str           # the compared arm (the HR's numerator)
    ref: str           # the reference
    direction: str     # ">1", "<1" or "two-sided"
    text: str


TESTS = (Test("H1", "flash", FP32, ">1", "flash in bf16 makes excursions"),
         Test("H2", "stabilized", "flash", "<1", "Algorithm 3 removes them"),
         Test("H3", "delta_hp", "flash", "<1", "the biased δ carries them"),
         Test("H4", "mxfp8_flash", "flash", "two-sided", "MXFP8 linear layers change flash's hazard"),
         Test("H5", "mxfp8_flash", "mxfp8_exact", ">1", "under MXFP8 too, the flash kernel adds excursions"))
# falsification: ">1" upper bound < 2; "<1" lower bound > 0.5; "two-sided" interval within [0.5, 2]
BOUND = {">1": 2.0, "<1": 0.5}
WITHIN = (0.5, 2.0)
# the effect each needed (the falsification bounds), for the power of an undecided hypothesis
NEEDED_HR = {">1": (2.0,), "<1": (0.5,), "two-sided": (0.5, 2.0)}
BESIDE = tuple((a, FP32) for a in ARMS[1:])
ENDPOINTS = (("primary", PRIMARY_K), ("secondary", SECONDARY_K))


StudyError = W.StudyError  # data that do not fit the study: one line (why_mx's, which checked_trajectories raises)


# --------------------------------------------------------------------------- loading

@dataclass
class Study:
    events: dict       # {"primary" | "secondary": {(seed, arm): (event, step)}}
    run_of: dict       # {seed: run_id} of the finished runs
    lr: str            # the blocks' lr ("" with no data)
    unfinished: list   # [(run_id, status)] of summary rows of runs without a finished trajectory
    trajectories: int  # finished trajectories read

    def seeds(self):
        """The seeds with every arm finished, sorted."""
        have = {}
        for s, a in self.events["primary"]:
            have.setdefault(s, set()).add(a)
        return sorted(s for s, arms in have.items() if arms == set(ARMS))

    def complete(self):
        return self.seeds() == SEEDS


def load(directory):
    """The Study of the CSVs in `directory` (an empty one when it has no summary or blocks CSV);
    StudyError when they do not fit the study (a seed or trajectory it does not have, two learning
    rates, the excursions from the blocks unlike the binary's: why_mx.checked_trajectories)."""
    if not os.path.isdir(directory):
        raise StudyError(f"no directory {directory} (0 of 40 seeds): give --dir the folder of the study's CSVs")
    if not _glob(directory, "summary_*.csv") and not R.csv_paths(directory, "blocks_*"):
        return Study({"primary": {}, "secondary": {}}, {}, "", [], 0)
    trajs = W.checked_trajectories(directory)
    run_of, lrs = {}, W.block_lrs(directory)
    for (seed, arm), t in trajs.items():
        if seed not in SEEDS:
            raise StudyError(f"seed {seed} ({arm}): not one of the study's seeds 300-339")
        if arm not in ARMS:
            raise StudyError(f"seed {seed}: trajectory {arm} is none of the study's {', '.join(ARMS)}")
        if run_of.setdefault(seed, t["run_id"]) != t["run_id"]:
            raise StudyError(f"seed {seed}: trajectories of two runs ({run_of[seed]}, {t['run_id']})")
    if len(lrs) > 1:
        raise StudyError(f"loss blocks at several learning rates {sorted(lrs)}: the study has one")
    finished, unfinished = set(run_of.values()), {}
    for path in _glob(directory, "summary_*.csv"):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["run_id"] not in finished and r["status"] not in ("complete", "diverged"):
                    unfinished[r["run_id"]] = r["status"]
    events = {name: {k: R.excursion(t, factor=k_) for k, t in trajs.items()} for name, k_ in ENDPOINTS}
    return Study(events, run_of, lrs.pop() if lrs else "", sorted(unfinished.items()), len(trajs))


def _glob(directory, pattern):
    return sorted(glob.glob(os.path.join(directory, pattern)))


def pilot_choice(directory):
    """(table, (depth, lr), step, None) of the pilot's complete CSVs (flash_pilot_choice), or
    (None, None, None, why) when there is no complete pilot."""
    if not directory or not os.path.isdir(directory):
        return None, None, None, f"no pilot directory {directory}"
    try:
        table = C.cells(C.load_dir(directory))
    except (C.PilotError, R.DataError, OSError, KeyError, ValueError) as e:
        return None, None, None, str(e)
    cell, step = C.choose(table)
    return table, cell, step, None


def check_configuration(study, cell, layers):
    """StudyError unless the study ran the pilot's chosen cell: its lr (the blocks') and, when the
    instruments say (`layers`, None otherwise), its depth."""
    depth, lr = cell
    if study.lr and not math.isclose(float(study.lr), lr, rel_tol=1e-9):
        raise StudyError(f"the study's runs have lr {study.lr}, the pilot's rule chose {lr:g}: they are not the "
                         "pre-registered configuration (set flash_study.yaml to the chosen cell and rerun)")
    if layers is not None and layers != depth:
        raise StudyError(f"the study's runs have {layers} attention layers, the pilot's rule chose depth {depth}: "
                         "they are not the pre-registered configuration")


# --------------------------------------------------------------------------- the families

def family(events, tests=TESTS):
    """A pre-registered family on the complete study: [(Test, LogRank, Cox, Holm p)] in the order of
    `tests`, Holm over all len(tests) permutation p-values (m = 5)."""
    have = {}
    for s, a in events:
        have.setdefault(a, set()).add(s)
    for t in tests:
        for x in (t.arm, t.ref):
            if have.get(x, set()) != set(SEEDS):
                raise StudyError(f"the family needs seeds 300-339 for every arm; {x} has {len(have.get(x, ()))}")
    res = [(t,) + W.compare(events, t.arm, t.ref) for t in tests]
    adj = P.holm_family([(t.label, lr.p_perm) for t, lr, _ in res])
    return [(t, lr, cox, h) for (t, lr, cox), (_, _, h) in zip(res, adj)]


def informative(lr):
    """Seeds where one arm's excursion came first while the other was at risk."""
    return lr.arm_first + lr.ref_first


def rule(test, cox, holm_p):
    """The pre-registered criteria alone: supported, falsified, mixed (both) or undecided."""
    if test.direction != "two-sided":
        return W.directional_verdict(test.direction, BOUND[test.direction], cox, holm_p)
    within = WITHIN[0] <= cox.lo and cox.hi <= WITHIN[1]  # False for NaN
    if holm_p < ALPHA:
        way = "HR > 1" if cox.hr > 1 else "HR < 1"
        return (f"mixed (significant, {way}, but the interval lies within [{WITHIN[0]:g}, {WITHIN[1]:g}])"
                if within else f"supported ({way})")
    return "falsified" if within else "undecided"


def verdict(test, lr, cox, holm_p):
    """The verdict of one hypothesis: rule(), unless fewer than 6 seeds are informative, which
    leaves it undecided by construction (with what the rules alone would have said)."""
    r = rule(test, cox, holm_p)
    k = informative(lr)
    if k < MIN_INFORMATIVE:
        alone = "" if r == "undecided" else f"; the criteria alone would say {r}"
        return f"undecided by construction ({k} informative seeds < {MIN_INFORMATIVE}{alone})"
    return r


def counts(events, arm):
    return sum(1 for (s, a), (e, _) in events.items() if a == arm and e)


def markdown_family(events, res, name):
    m = len(res)
    out = [f"| | comparison (hypothesis) | excursions arm / ref (of {len(SEEDS)}) | informative seeds: arm first / "
           f"ref first | permutation p | Holm p (m = {m}) | HR [95 %] (Breslow) | Firth HR [95 %] | verdict ({name}) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for t, lr, cox, h in res:
        hyp = "two-sided" if t.direction == "two-sided" else f"HR {t.direction[0]} {t.direction[1:]}"
        out.append(f"| {t.label} | {t.arm} vs {t.ref} ({hyp}: {t.text}) | {counts(events, t.arm)} / "
                   f"{counts(events, t.ref)} | {lr.arm_first} / {lr.ref_first} | {lr.p_perm:.3g} | {h:.3g} | "
                   f"{R.hr_cell(cox)} | {R.firth_cell(cox)} | **{verdict(t, lr, cox, h)}** |")
    return "\n".join(out)


def beside(events):
    """Every arm against fp32 (reported beside the family, not tested): [(arm, ref, LogRank, Cox)]."""
    return [(a, ref) + W.compare(events, a, ref) for a, ref in BESIDE]


def markdown_beside(events, rows):
    out = ["| arm vs fp32 | excursions arm / fp32 | first: arm / fp32 | permutation p (unadjusted) | HR [95 %] | "
           "Firth HR [95 %] |", "|---|---|---|---|---|---|"]
    for a, ref, lr, cox in rows:
        out.append(f"| {a} vs {ref} | {counts(events, a)} / {counts(events, ref)} | {lr.arm_first} / {lr.ref_first} | "
                   f"{lr.p_perm:.3g} | {R.hr_cell(cox)} | {R.firth_cell(cox)} |")
    return "\n".join(out)


def markdown_counts(study):
    """Per arm: seeds, excursions at k = 10 and k = 2 (Wilson 95 %) and their median step."""
    out = [f"| arm | seeds (of {len(SEEDS)}) | k = 10 excursions (Wilson 95 %) | median step | k = 2 excursions "
           "(Wilson 95 %) | median step |", "|---|---|---|---|---|---|"]
    rows = {name: {r[0]: r for r in W.progress(ev)} for name, ev in study.events.items()}
    for a in ARMS:
        if a not in rows["primary"]:
            continue
        cells = []
        for name, _ in ENDPOINTS:
            _, n, k, lo, hi, med = rows[name][a]
            cells += [f"{k}/{n} ({lo:.2f}–{hi:.2f})", "-" if med is None else f"{med:.0f}"]
        out.append(f"| {a} | {rows['primary'][a][1]} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def loss_spikes(directory, run_of, factor=SPIKE_FACTOR, after=SPIKE_AFTER):
    """{(seed, arm): step of the first spike or None} of the finished runs (`run_of`: {seed: run_id}),
    from the blocks CSVs' min, max and nonfinite: the first block starting at `after` or later whose
    max exceeds `factor` x the minimum of every earlier block (an empty max or a non-finite loss in
    it counts), exploratory (not pre-registered)."""
    rows = {}
    finished = set(run_of.values())
    for path in R.csv_paths(directory, "blocks_*"):
        with R.open_csv(path) as f:
            for r in csv.DictReader(f):
                if r["run_id"] in finished:
                    rows.setdefault((int(r["seed"]), r["trajectory"]), {})[int(r["block_start"])] = r
    out = {}
    for key, blocks in rows.items():
        low, first = math.inf, None
        for start in sorted(blocks):
            r = blocks[start]
            mx = _float(r["max"])
            if start >= after and (int(r["nonfinite"] or 0) > 0 or math.isnan(mx) or mx > factor * low):
                first = start
                break
            mn = _float(r["min"])
            if not math.isnan(mn):
                low = min(low, mn)
        out[key] = first
    return out


def markdown_spikes(spikes, seeds):
    """Per arm: trajectories, those with a spike (loss_spikes) and their seeds with the step."""
    out = ["| arm | trajectories | with a spike | seed (step of the first spike) |", "|---|---|---|---|"]
    for a in ARMS:
        have = [(s, spikes[(s, a)]) for s in seeds if (s, a) in spikes]
        hit = [(s, t) for s, t in have if t is not None]
        out.append(f"| {a} | {len(have)} | {len(hit)} | " + (", ".join(f"{s} ({t})" for s, t in hit) or "–") + " |")
    return "\n".join(out)


# --------------------------------------------------------------------------- power

def _power_module():
    spec = importlib.util.spec_from_file_location("power_flash_bf16", os.path.join(HERE, "prereg", "power_flash_bf16.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def needed_power(test, events, m, sims):
    """[(HR, power at 0.05, power at 0.05 / m)] of the test for the effect it needed (NEEDED_HR) at
    the reference's observed event fraction by the pre-registration's model (power_flash_bf16:
    gamma frailty, censoring at 9,500, n = 40), or (None, why) when that fraction is 0 or 1."""
    n = len(SEEDS)
    k = counts(events, test.ref)
    if k in (0, n):
        return None, (f"{test.ref} had {'no' if k == 0 else 'every'} excursion ({k} of {n}): under the power model "
                      "no seed could be informative, the power is ~0")
    pf = _power_module()
    out = []
    for hr in NEEDED_HR[test.direction]:
        pw = pf.PW.power(n, k / n, hr, frailty_var=pf.FRAILTY_VAR, horizon=pf.HORIZON, alphas=(ALPHA, ALPHA / m),
                         sims=sims)
        out.append((hr, float(pw[0]), float(pw[1])))
    return out, None


def prereg_power(path=PREREG):
    """{question: [(reference, P ref, compared, P compared, HR, n20 at 0.05, at 0.01, n40 at 0.05,
    at 0.01)]} from the pre-registration's Power table (H1, H2/H3, H4)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        inside = False
        for line in f:
            if line.startswith("## "):
                inside = line.startswith("## Power")
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if inside and len(cells) == 10 and cells[0].startswith("H"):
                out.setdefault(cells[0], []).append((cells[1], float(cells[2]), cells[3], float(cells[4]),
                                                     float(cells[5])) + tuple(float(c) for c in cells[6:]))
    return out


def prereg_rows_for(label, table):
    """The pre-registered power rows of hypothesis `label` (H2 and H3 share theirs)."""
    for q, rows in table.items():
        if label in q.split("/"):
            return rows
    return []


def markdown_power(fam, events, m, sims, prereg):
    """The power of every undecided hypothesis of a family (the pre-registration's "undecided, with
    the power for the effect it would have needed")."""
    out = [f"| | effect needed | reference's excursions | power at 0.05 | at the first Holm step 0.05/{m} | "
           f"pre-registered power, n = {len(SEEDS)} (assumed P(event) ref → compared: at 0.05 / at 0.01) |",
           "|---|---|---|---|---|---|"]
    for t, lr, cox, h in fam:
        if not verdict(t, lr, cox, h).startswith("undecided"):
            continue
        rows, why = needed_power(t, events, m, sims)
        pre = "; ".join(f"{r[1]:.2f} → {r[3]:.2f} (HR {r[4]:g}): {r[7]:.2f} / {r[8]:.2f}"
                        for r in prereg_rows_for(t.label, prereg)) or "none pre-registered"
        ref = f"{counts(events, t.ref)}/{len(SEEDS)} ({t.ref})"
        if rows is None:
            out.append(f"| {t.label} | HR {' or '.join(f'{x:g}' for x in NEEDED_HR[t.direction])} | {ref} | "
                       f"– ({why}) | – | {pre} |")
            continue
        for hr, p05, pm in rows:
            out.append(f"| {t.label} | HR {hr:g} | {ref} | {p05:.2f} | {pm:.2f} | {pre} |")
    return "\n".join(out) if len(out) > 2 else "(no undecided hypothesis)"


# --------------------------------------------------------------------------- mechanism

def _num(x, digits=3):
    return "–" if x is None or x != x else "inf" if x == math.inf else "-inf" if x == -math.inf else f"{x:.{digits}g}"


def _read_rows(paths):
    for path in paths:
        with R.open_csv(path) as f:
            yield from csv.DictReader(f)


def _float(x):
    return float(x) if x not in ("", None) else math.nan


def _keep(rows, run_of, key, what):
    """The rows of finished runs ({seed: run_id}), one per `key`; a key two CSVs give differently is
    a StudyError."""
    finished = set(run_of.values())
    out = {}
    for r in rows:
        if r["run_id"] not in finished:
            continue
        k = key(r)
        if k in out and out[k] != r:
            raise StudyError(f"{what}: run {r['run_id']} {r['trajectory']} step {r['step']}: two CSVs give "
                             "different rows (re-extract from one set of run files)")
        out[k] = r
    return out


def read_instruments(directory, run_of):
    """{(seed, arm): {layer: [row, ...] by step}} of instruments*.csv[.gz] of the finished runs."""
    rows = _keep(_read_rows(_glob(directory, "instruments*.csv*")), run_of,
                 lambda r: (r["run_id"], r["trajectory"], int(r["step"]), int(r["layer"])), "instruments")
    out = {}
    for (_, arm, step, layer), r in sorted(rows.items()):
        out.setdefault((int(r["seed"]), arm), {}).setdefault(layer, []).append(r)
    return out


def read_spectral(directory, run_of):
    """{(seed, arm): {(layer, matrix): {step: row}}} of spectral*.csv[.gz] of the finished runs."""
    rows = _keep(_read_rows(_glob(directory, "spectral*.csv*")), run_of,
                 lambda r: (r["run_id"], r["trajectory"], int(r["step"]), int(r["layer"]), r["matrix"]), "spectral")
    out = {}
    for (_, arm, step, layer, matrix), r in sorted(rows.items()):
        out.setdefault((int(r["seed"]), arm), {}).setdefault((layer, matrix), {})[step] = r
    return out


def event_step(study, seed, arm):
    """The onset of the trajectory's first excursion, primary or secondary (None without one)."""
    steps = [ev[(seed, arm)][1] for ev in study.events.values() if ev[(seed, arm)][0]]
    return min(steps) if steps else None


def _before(step, onset):
    return onset is None or step < onset


def layer_stats(rows, onset):
    """Items 1 and 2 of one trajectory's layer from its instrument rows before `onset`: {'rows',
    'multi_max', 'multi_one', 'delta_n', 'delta_mean', 'delta_pos', 't', 'running_sum', 'wq_max',
    'wk_max', 'err_cos'} (NaN where the rows have no value)."""
    rows = [r for r in rows if _before(int(r["step"]), onset)]

    def vals(col):
        return [v for v in (_float(r[col]) for r in rows) if v == v]

    def mean(xs):
        return statistics.fmean(xs) if xs else math.nan

    d = vals("attn_delta_bias")
    t = math.nan
    if len(d) >= 2:
        sd = statistics.stdev(d)
        mu = statistics.fmean(d)
        t = mu / (sd / math.sqrt(len(d))) if sd > 0 else (math.copysign(math.inf, mu) if mu else math.nan)
    cums = [r["attn_delta_bias_cumsum"] for r in rows if r["attn_delta_bias_cumsum"] != ""]
    wq, wk = vals("attn_wq_spec"), vals("attn_wk_spec")
    return {"rows": len(rows), "multi_max": mean(vals("attn_multi_max_frac")), "multi_one": mean(vals("attn_multi_one_frac")),
            "delta_n": len(d), "delta_mean": mean(d), "delta_pos": (sum(x > 0 for x in d) / len(d)) if d else math.nan,
            "t": t, "running_sum": float(cums[-1]) if cums else math.nan,
            "wq_max": max(wq) if wq else math.nan, "wk_max": max(wk) if wk else math.nan,
            "err_cos": mean(vals("attn_dwq_err_cos"))}


def weight_series(spec, ref, layer, matrix, onset):
    """[(step, sigma_max ratio to fp32, rank-one share, direction cosine)] of the snapshots after
    step 0 and before `onset` (all after step 0 without one) of one trajectory's matrix; `ref` the
    fp32 trajectory's spectral rows."""
    out = []
    own = spec.get((layer, matrix), {})
    base = ref.get((layer, matrix), {})
    for step in sorted(own):
        if step <= 0 or not _before(step, onset) or step not in base:
            continue
        r = own[step]
        out.append((step, _float(r["sigma_max"]) / _float(base[step]["sigma_max"]), _float(r["diff_rank1"]),
                    _float(r["diff_dir_cos"])))
    return out


def chain(layers, spec, ref, onset):
    """Item 4 of one trajectory: ('shows', why) / ('does not', why) / ('not evaluable', why) /
    ('no data', why). `layers` {layer: layer_stats}, `spec` and `ref` its and fp32's spectral rows."""
    if not layers or not spec or not ref:
        return "no data", "no instrument or spectral rows (of it or of fp32)"
    snapshots = max(len(weight_series(spec, ref, layer, m, onset)) for layer in layers for m in ("W_Q", "W_K"))
    if snapshots < CHAIN_SNAPSHOTS:
        return "not evaluable", f"{snapshots} snapshots after step 0 before the event at {onset}"
    for layer in sorted(layers):
        s = layers[layer]
        if not (s["multi_one"] > 0 and abs(s["t"]) > T_DELTA):
            continue
        for matrix in ("W_Q", "W_K"):
            last = weight_series(spec, ref, layer, matrix, onset)[-CHAIN_SNAPSHOTS:]
            rising = len(last) == CHAIN_SNAPSHOTS and all(a[1] < b[1] for a, b in zip(last, last[1:]))
            if rising and last[-1][2] > RANK1 and last[-1][3] > DIR_COS:
                return "shows", f"layer {layer} {matrix}"
    return "does not", ""


def links(layers, spec, ref, onset):
    """Which links of the chain one trajectory has (in some layer): ties (mean attn_multi_one_frac >
    0), delta (|t| > 3), rising (W_Q or W_K's sigma_max ratio rising over its last three snapshots),
    low_rank (W_Q or W_K's last snapshot with rank-one share > 0.5 and direction cosine > 0.9)."""
    out = {"ties": False, "delta": False, "rising": False, "low_rank": False}
    for layer, s in layers.items():
        out["ties"] |= s["multi_one"] > 0
        out["delta"] |= abs(s["t"]) > T_DELTA
        for matrix in ("W_Q", "W_K"):
            ws = weight_series(spec, ref, layer, matrix, onset)
            if len(ws) >= CHAIN_SNAPSHOTS:
                last = ws[-CHAIN_SNAPSHOTS:]
                out["rising"] |= all(a[1] < b[1] for a, b in zip(last, last[1:]))
            if ws:
                out["low_rank"] |= ws[-1][2] > RANK1 and ws[-1][3] > DIR_COS
    return out


@dataclass
class Mechanism:
    layers: dict       # {(seed, arm): {layer: layer_stats}}
    weights: dict      # {(seed, arm): {(layer, matrix): weight_series}}
    chains: dict       # {(seed, arm): (result, why)} for CHAIN_ARMS
    links: dict        # {(seed, arm): links()} for CHAIN_ARMS
    onset: dict        # {(seed, arm): event step or None}
    depth: int         # attention layers in the instruments (None without)


def mechanism(study, directory):
    """The Mechanism of the complete study, or None without instrument and spectral CSVs."""
    if not _glob(directory, "instruments*.csv*") and not _glob(directory, "spectral*.csv*"):
        return None
    inst = read_instruments(directory, study.run_of)
    spec = read_spectral(directory, study.run_of)
    layers, weights, chains, link, onset = {}, {}, {}, {}, {}
    depth = max((layer + 1 for v in inst.values() for layer in v), default=None)
    for seed in study.seeds():
        ref = spec.get((seed, FP32), {})
        for arm in ARMS[1:]:
            key = (seed, arm)
            t = onset[key] = event_step(study, seed, arm)
            layers[key] = {layer: layer_stats(rows, t) for layer, rows in inst.get(key, {}).items()}
            own = spec.get(key, {})
            weights[key] = {lm: weight_series(own, ref, lm[0], lm[1], t) for lm in own}
            if arm in CHAIN_ARMS:
                chains[key] = chain(layers[key], own, ref, t)
                link[key] = links(layers[key], own, ref, t)
    return Mechanism(layers, weights, chains, link, onset, depth)


def _med(xs):
    xs = [x for x in xs if x == x]
    return f"{_num(statistics.median(xs))} ({_num(min(xs))}–{_num(max(xs))})" if xs else "–"


def markdown_ties(mech, seeds):
    out = ["| arm | layer | trajectories | attn_multi_max_frac: mean over trajectories (min–max) | attn_multi_one_frac: "
           "mean (min–max) |", "|---|---|---|---|---|"]
    layers = sorted({layer for v in mech.layers.values() for layer in v})
    for arm in FLASH_KERNEL:
        for layer in layers:
            st = [mech.layers[(s, arm)][layer] for s in seeds if layer in mech.layers.get((s, arm), {})]
            mm = [x["multi_max"] for x in st if x["multi_max"] == x["multi_max"]]
            mo = [x["multi_one"] for x in st if x["multi_one"] == x["multi_one"]]
            if not mm and not mo:
                continue
            cell = lambda xs: f"{_num(statistics.fmean(xs))} ({_num(min(xs))}–{_num(max(xs))})" if xs else "–"
            out.append(f"| {arm} | {layer} | {len(st)} | {cell(mm)} | {cell(mo)} |")
    check = []
    for layer in layers:
        pairs = [(mech.layers[(s, "stabilized")][layer]["multi_one"], mech.layers[(s, "flash")][layer]["multi_one"])
                 for s in seeds if layer in mech.layers.get((s, "stabilized"), {}) and layer in mech.layers.get((s, "flash"), {})]
        pairs = [(a, b) for a, b in pairs if a == a and b == b]
        if pairs:
            check.append(f"layer {layer}: below flash's in {sum(a < b for a, b in pairs)} of {len(pairs)} seeds, "
                         f"equal in {sum(a == b for a, b in pairs)}")
    if check:
        out.append("\nKernel check (expected: stabilized lowers attn_multi_one_frac): stabilized's mean "
                   "attn_multi_one_frac, " + "; ".join(check))
    return "\n".join(out)


def markdown_delta(mech, seeds):
    out = ["| arm | layer | excursion | trajectories | mean δ-bias: median (range) | positive rows: median fraction | "
           "\\|t\\| > 3: positive / negative | running sum: median (range) |", "|---|---|---|---|---|---|---|---|"]
    layers = sorted({layer for v in mech.layers.values() for layer in v})
    pred = []
    for arm in CHAIN_ARMS:
        for had in (True, False):
            keys = [(s, arm) for s in seeds if (mech.onset[(s, arm)] is not None) == had]
            for layer in layers:
                st = [mech.layers[k][layer] for k in keys if layer in mech.layers.get(k, {})]
                st = [x for x in st if x["delta_n"]]
                if not st:
                    continue
                pos = sum(1 for x in st if x["t"] > T_DELTA)
                neg = sum(1 for x in st if x["t"] < -T_DELTA)
                out.append(f"| {arm} | {layer} | {'yes' if had else 'no'} | {len(st)} | {_med([x['delta_mean'] for x in st])} | "
                           f"{_num(statistics.median([x['delta_pos'] for x in st]), 2)} | {pos} / {neg} | "
                           f"{_med([x['running_sum'] for x in st])} |")
            if had and keys:
                some = [k for k in keys if any(abs(x["t"]) > T_DELTA for x in mech.layers.get(k, {}).values())]
                signs = [k for k in some if any(x["t"] > T_DELTA for x in mech.layers[k].values())]
                pred.append(f"{arm}: {len(some)} of {len(keys)} trajectories with an excursion have |t| > 3 in some "
                            f"layer, {len(signs)} of them positive")
    if pred:
        out.append("\nThe chain's prediction (|t| > 3 with one sign, the paper's positive, in some layer of the "
                   "trajectories with an excursion): " + "; ".join(pred))
    return "\n".join(out)


def markdown_weights(mech, seeds):
    out = ["| arm | layer | matrix | excursion | trajectories | σ_max / FP32's at the last snapshot before the event "
           "(or the end): median (range) | rank-one share: median | direction cosine: median | rank-one > 0.5 and "
           "cosine > 0.9 |", "|---|---|---|---|---|---|---|---|---|"]
    lms = sorted({lm for v in mech.weights.values() for lm in v}, key=lambda lm: (lm[0], "W_Q W_K W_V W_O".split().index(lm[1])))
    for arm in ARMS[1:]:
        for had in (True, False):
            keys = [(s, arm) for s in seeds if (mech.onset[(s, arm)] is not None) == had]
            for lm in lms:
                last = [mech.weights[k][lm][-1] for k in keys if mech.weights.get(k, {}).get(lm)]
                if not last:
                    continue
                both = sum(1 for _, _, r1, c in last if r1 > RANK1 and c > DIR_COS)
                out.append(f"| {arm} | {lm[0]} | {lm[1]} | {'yes' if had else 'no'} | {len(last)} | "
                           f"{_med([x[1] for x in last])} | {_num(_median([x[2] for x in last]))} | "
                           f"{_num(_median([x[3] for x in last]))} | {both} |")
    return "\n".join(out)


def markdown_weight_steps(mech, seeds):
    """σ_max of W_Q and W_K over FP32's per snapshot: the median over the trajectories without an
    event by then (the chain's rising ratio, at every snapshot)."""
    steps = sorted({x[0] for v in mech.weights.values() for ws in v.values() for x in ws})
    if not steps:
        return "(no snapshot after step 0)"
    out = ["| arm | layer | matrix | " + " | ".join(str(s) for s in steps) + " |", "|---|---|---|" + "---|" * len(steps)]
    layers = sorted({lm[0] for v in mech.weights.values() for lm in v})
    for arm in ARMS[1:]:
        for layer in layers:
            for matrix in ("W_Q", "W_K"):
                by = {}
                for s in seeds:
                    for step, ratio, _, _ in mech.weights.get((s, arm), {}).get((layer, matrix), []):
                        by.setdefault(step, []).append(ratio)
                if by:
                    out.append(f"| {arm} | {layer} | {matrix} | " +
                               " | ".join(f"{_median(by[s]):.4f}" if s in by else "–" for s in steps) + " |")
    return "\n".join(out)


def _median(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else math.nan


def markdown_logged(mech, seeds):
    out = ["| arm | layer | excursion | trajectories | largest attn_wq_spec before the event: median | largest "
           "attn_wk_spec: median | mean attn_dwq_err_cos: median (range) | mean cosine > 0.5 |", "|---|---|---|---|---|---|---|---|"]
    layers = sorted({layer for v in mech.layers.values() for layer in v})
    for arm in ARMS[1:]:
        for had in (True, False):
            keys = [(s, arm) for s in seeds if (mech.onset[(s, arm)] is not None) == had]
            for layer in layers:
                st = [mech.layers[k][layer] for k in keys if layer in mech.layers.get(k, {})]
                if not st:
                    continue
                out.append(f"| {arm} | {layer} | {'yes' if had else 'no'} | {len(st)} | {_num(_median([x['wq_max'] for x in st]))} | "
                           f"{_num(_median([x['wk_max'] for x in st]))} | {_med([x['err_cos'] for x in st])} | "
                           f"{sum(1 for x in st if x['err_cos'] > 0.5)} |")
    return "\n".join(out)


def markdown_chain(mech, seeds):
    out = ["| arm | with an excursion: show the chain / do not / not evaluable / no data | without (at the end): "
           "show / do not / not evaluable / no data | links present (with / without an excursion): ties, δ bias \\|t\\| > 3, rising σ_max ratio, "
           "rank-one > 0.5 and cosine > 0.9 |", "|---|---|---|---|"]
    for arm in CHAIN_ARMS:
        cells = []
        for had in (True, False):
            keys = [(s, arm) for s in seeds if (mech.onset[(s, arm)] is not None) == had]
            c = [mech.chains[k][0] for k in keys]
            kinds = ("shows", "does not", "not evaluable", "no data")
            cells.append(" / ".join(str(c.count(x)) for x in kinds) + f" (of {len(keys)})")
        ln = []
        for had in (True, False):
            keys = [(s, arm) for s in seeds if (mech.onset[(s, arm)] is not None) == had]
            ln.append(", ".join(str(sum(mech.links[k][x] for k in keys)) for x in ("ties", "delta", "rising", "low_rank")))
        out.append(f"| {arm} | {cells[0]} | {cells[1]} | {ln[0]} / {ln[1]} |")
    return "\n".join(out)


def markdown_per_trajectory(mech, seeds):
    out = ["| seed | arm | event onset | layer | attn_multi_max_frac | attn_multi_one_frac | δ-bias mean | positive rows "
           "| t | running sum | chain |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for seed in seeds:
        for arm in FLASH_KERNEL:
            key = (seed, arm)
            ch = mech.chains.get(key)
            chain_cell = "–" if ch is None else (ch[0] + (f" ({ch[1]})" if ch[1] else ""))
            for layer, s in sorted(mech.layers.get(key, {}).items()):
                on = mech.onset[key]
                out.append(f"| {seed} | {arm} | {'-' if on is None else on} | {layer} | {_num(s['multi_max'])} | "
                           f"{_num(s['multi_one'])} | {_num(s['delta_mean'])} | {_num(s['delta_pos'], 2)} | {_num(s['t'])} | "
                           f"{_num(s['running_sum'])} | {chain_cell} |")
    return "\n".join(out)


# --------------------------------------------------------------------------- figures

# one colour per arm in every figure of the study
ARM_COLOR = {FP32: "black", "flash": "tab:red", "stabilized": "tab:blue", "delta_hp": "tab:green",
             "mxfp8_flash": "tab:purple", "mxfp8_exact": "grey"}


def _shown(path):
    """A path as the caption gives it: relative to the repository when inside it."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return path if rel.startswith("..") else rel


def repo_commit():
    """The repository's short commit (what a caption names), "unknown" outside git."""
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def figure(study, path, command):
    """Kaplan-Meier curves of the six arms at k = 10 (left) and k = 2 (right) to `path` (PNG), the
    command, the data and the commit in the caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {FP32: dict(lw=2.2), "flash": dict(lw=1.6), "stabilized": dict(lw=1.4, ls="--"),
              "delta_hp": dict(lw=1.4, ls="--"), "mxfp8_flash": dict(lw=1.6), "mxfp8_exact": dict(lw=1.6, ls=":")}
    styles = {a: dict(color=ARM_COLOR[a], **st) for a, st in styles.items()}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3), sharey=True)
    for ax, (name, k) in zip(axes, ENDPOINTS):
        ev = study.events[name]
        for arm in ARMS:
            xs, ys, _ = W.km_curve([e for (s, a), e in ev.items() if a == arm], horizon=STEPS - R.PRIMARY_W)
            ax.step(xs, ys, where="post", label=arm, **styles[arm])
        ax.set_title(f"{name}: excursion k = {k:g}, B = 100, W = 500", fontsize=9)
        ax.set_xlabel("step (excursion onset)")
        ax.set_xlim(0, STEPS)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of seeds without an excursion")
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(f"Flash attention in bf16, {len(study.seeds())} seeds (300-339), lr {study.lr}, {STEPS:,} steps "
                 "(Kaplan-Meier)", fontsize=10)
    fig.text(0.01, 0.005, f"{command}; commit {repo_commit()}; experiments/paper/flash_study.yaml", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# The mechanism figure: items 1-3 of the pre-registration per arm over steps (descriptive; drawn on
# an interim study too, labelled so). Its rows (name, y label, arms with a panel); its columns the
# arms but fp32, the reference of item 3 (its ratio is 1) without flash instruments.
MECH_ARMS = ARMS[1:]
MECH_ROWS = (("ties", "1. ties: fraction of rows", FLASH_KERNEL),
             ("delta", "2. δ bias: running sum of\nattn_delta_bias", CHAIN_ARMS),
             ("sigma", "3. σ_max / FP32's σ_max", MECH_ARMS),
             ("rank1", "3. rank-one share of\nD = W_arm − W_fp32", MECH_ARMS))
EXCURSION_MARKER = "x"


@dataclass
class MechanismSeries:
    seeds: list        # the seeds drawn: every arm finished (Study.seeds)
    lr: str            # the study's lr (the blocks')
    layer: int         # the layer drawn (None without seeds)
    depth: int         # attention layers in the instruments (None without)
    layer_means: dict  # {layer: mean attn_multi_one_frac of the flash-kernel trajectories before their events}
    onset: dict        # {(seed, arm): the first excursion's onset, primary or secondary, or None}
    ties: dict         # {(seed, arm): [(step, attn_multi_one_frac, attn_multi_max_frac)]} before the event
    delta: dict        # {(seed, arm): [(step, attn_delta_bias_cumsum)]} before the event
    weights: dict      # {(seed, arm): {"W_Q" | "W_K": weight_series}} before the event


def mechanism_series(study, directory):
    """What the mechanism figure draws, from instruments*.csv[.gz] and spectral*.csv[.gz] of the
    runs the summaries list as finished, for the seeds with every arm finished: each trajectory's
    rows and snapshots before its event (the mechanism's "before"), of the layer with the largest
    mean attn_multi_one_frac over the flash-kernel trajectories (item 1's mean before the event).
    StudyError when either kind of CSV is missing, or when finished seeds have no tie fractions."""
    for pattern, kind, how in (("instruments*.csv", "instruments", "results/extract_flash_instruments.py"),
                               ("spectral*.csv", "spectral", "results/extract_spectral.py")):
        if not _glob(directory, pattern + "*"):
            raise StudyError(f"--mechanism-figure: no {kind} CSV ({pattern}[.gz]) in {directory}: bring back "
                             f"{how}'s output of the study's runs with their summaries")
    inst = read_instruments(directory, study.run_of)
    spec = read_spectral(directory, study.run_of)
    seeds = study.seeds()
    onset = {(s, a): event_step(study, s, a) for s in seeds for a in ARMS}
    by_layer = {}
    for key in ((s, a) for s in seeds for a in FLASH_KERNEL):
        for layer, rows in inst.get(key, {}).items():
            m = layer_stats(rows, onset[key])["multi_one"]
            if m == m:
                by_layer.setdefault(layer, []).append(m)
    means = {layer: statistics.fmean(v) for layer, v in sorted(by_layer.items())}
    if seeds and not means:
        raise StudyError(f"--mechanism-figure: the instruments CSVs in {directory} have no attn_multi_one_frac of a "
                         "finished flash-kernel trajectory (re-extract with results/extract_flash_instruments.py)")
    layer = max(means, key=means.get) if means else None  # the first (lowest) layer of the largest mean
    ties, delta, weights = {}, {}, {}
    for seed in seeds:
        ref = spec.get((seed, FP32), {})
        for arm in MECH_ARMS:
            key, t = (seed, arm), onset[(seed, arm)]
            rows = [r for r in inst.get(key, {}).get(layer, []) if _before(int(r["step"]), t)]
            if arm in FLASH_KERNEL and key in inst:
                ties[key] = [(int(r["step"]), _float(r["attn_multi_one_frac"]), _float(r["attn_multi_max_frac"]))
                             for r in rows]
            if arm in CHAIN_ARMS and key in inst:
                delta[key] = [(int(r["step"]), _float(r["attn_delta_bias_cumsum"])) for r in rows]
            if key in spec and ref:
                weights[key] = {m: weight_series(spec[key], ref, layer, m, t) for m in ("W_Q", "W_K")}
    depth = max((layer + 1 for v in inst.values() for layer in v), default=None)
    return MechanismSeries(seeds, study.lr, layer, depth, means, onset, ties, delta, weights)


def _band(traces):
    """(steps, q25, median, q75) over the traces [(steps, values)] at every step where one of
    them has a finite value (the quantiles over those), or None."""
    import numpy as np

    traces = [(np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.float64)) for x, y in traces if len(x)]
    if not traces:
        return None
    steps = np.unique(np.concatenate([x for x, _ in traces]))
    table = np.full((len(traces), steps.size), np.nan)
    for k, (x, y) in enumerate(traces):
        table[k, np.searchsorted(steps, x)] = y
    keep = np.isfinite(table).any(axis=0)
    if not keep.any():
        return None
    q25, med, q75 = np.nanquantile(table[:, keep], [0.25, 0.5, 0.75], axis=0)
    return steps[keep], q25, med, q75


def _value_before(xs, ys, step, default):
    """The value of a drawn line at its last point before `step` (default where it has none)."""
    before = [y for x, y in zip(xs, ys) if x < step and y == y]
    return before[-1] if before else default


def mechanism_figure_build(series, interim, caption):
    """The mechanism figure (a matplotlib Figure, Agg): a row per item (1. ties, 2. δ bias, 3.
    σ_max ratio and 3. rank-one share of W_Q and W_K), a column per arm but fp32, a legend column;
    bands: median and 25-75 % over the trajectories without an event by that step; item 2: one
    thin line per seed; an `x` at each excursion's onset on its line (on the median of
    attn_multi_one_frac and of W_Q in the bands). Panels are labelled "row:arm" (Axes.get_label),
    excursion markers have the gid "excursion SEED", item 2's lines "seed SEED". `interim`: the
    line that says so ("" for the counted study)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig = Figure(figsize=(3.1 * len(MECH_ARMS) + 2.6, 2.5 * len(MECH_ROWS) + 1.8), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(len(MECH_ROWS), len(MECH_ARMS) + 1, width_ratios=[1] * len(MECH_ARMS) + [0.85])
    first = None
    mark = dict(marker=EXCURSION_MARKER, ls="none", ms=6, mew=1.5)
    for i, (row, ylabel, arms) in enumerate(MECH_ROWS):
        row_first = None
        for j, arm in enumerate(MECH_ARMS):
            if arm not in arms:
                continue
            ax = fig.add_subplot(grid[i, j], sharex=first, sharey=row_first, label=f"{row}:{arm}")
            first, row_first = first or ax, row_first or ax
            colour = ARM_COLOR[arm]
            keys = [(s, arm) for s in series.seeds]
            if row == "delta":
                have = [k for k in keys if k in series.delta]
                for k in have:
                    xs, ys = [x for x, _ in series.delta[k]], [y for _, y in series.delta[k]]
                    ax.plot(xs, ys, color=colour, lw=0.6, alpha=0.6, gid=f"seed {k[0]}")
                    if series.onset[k] is not None:
                        ax.plot([series.onset[k]], [_value_before(xs, ys, series.onset[k], 0.0)], color=colour,
                                gid=f"excursion {k[0]}", **mark)
                ax.axhline(0.0, color="0.5", lw=0.6)
            else:
                if row == "ties":
                    have = [k for k in keys if k in series.ties]
                    lines = (("attn_multi_one_frac", "-", 1), ("attn_multi_max_frac", "--", 2))
                    trace = lambda k, col: ([x[0] for x in series.ties[k]], [x[col] for x in series.ties[k]])
                else:
                    have = [k for k in keys if k in series.weights]
                    col = 1 if row == "sigma" else 2
                    lines = (("W_Q", "-", "W_Q"), ("W_K", "--", "W_K"))
                    trace = lambda k, m, col=col: ([x[0] for x in series.weights[k][m]],
                                                   [x[col] for x in series.weights[k][m]])
                bands = [_band([trace(k, what) for k in have]) for _, _, what in lines]
                for (name, ls, _), band in zip(lines, bands):
                    if band is None:
                        continue
                    xs, lo, med, hi = band
                    ax.fill_between(xs, lo, hi, color=colour, alpha=0.18, linewidth=0)
                    ax.plot(xs, med, color=colour, ls=ls, lw=1.3, gid=f"median {name}")
                if bands[0] is not None:  # the onsets on the first line's median
                    xs, _, med, _ = bands[0]
                    for k in have:
                        if series.onset[k] is not None:
                            ax.plot([series.onset[k]], [_value_before(xs, med, series.onset[k], med[0])],
                                    color=colour, gid=f"excursion {k[0]}", **mark)
                if row == "sigma":
                    ax.axhline(1.0, color="0.5", lw=0.6)
                if not any(b is not None for b in bands):
                    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5")
            events = sum(1 for k in have if series.onset[k] is not None)
            ax.set_title(f"{arm}: {len(have)} seeds, {events} with an excursion", fontsize=8, color=colour)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel(ylabel + f" (layer {series.layer})", fontsize=8)
            if i == len(MECH_ROWS) - 1:
                ax.set_xlabel("step", fontsize=8)
        key = fig.add_subplot(grid[i, -1], label=f"legend:{row}")
        key.axis("off")
        grey = "0.3"
        band = Patch(color=grey, alpha=0.3, label="median and 25–75 % over\nthe seeds without an event yet")
        onset = Line2D([], [], color=grey, label="first excursion (k = 2 or 10)" +
                       {"ties": ",\non attn_multi_one_frac's median", "delta": "", "sigma": ",\non W_Q's median",
                        "rank1": ",\non W_Q's median"}[row], **mark)
        handles = {"ties": [Line2D([], [], color=grey, label="attn_multi_one_frac (P̄ = 1)"),
                            Line2D([], [], color=grey, ls="--", label="attn_multi_max_frac (tied max)"), band, onset],
                   "delta": [Line2D([], [], color=grey, lw=0.6, label="one seed: attn_delta_bias_cumsum"), onset],
                   "sigma": [Line2D([], [], color=grey, label="W_Q"), Line2D([], [], color=grey, ls="--", label="W_K"),
                             band, onset],
                   "rank1": [Line2D([], [], color=grey, label="W_Q: σ₁(D)² / ‖D‖²_F"),
                             Line2D([], [], color=grey, ls="--", label="W_K"), band, onset]}[row]
        key.legend(handles=handles, loc="center left", fontsize=7, frameon=False)
    n = len(series.seeds)
    fig.suptitle(f"Flash attention in bf16: the mechanism (pre-registered items 1–3; descriptive, no test), "
                 f"{n} of {len(SEEDS)} seeds (300–339), lr {series.lr or '–'}, depth {series.depth}, layer {series.layer}" +
                 (f"\n{interim}" if interim else ""), fontsize=10)
    fig.supxlabel(caption, fontsize=7, color="grey", x=0.005, ha="left", multialignment="left")
    return fig


def mechanism_caption(series, command):
    """The mechanism figure's caption: the command, the commit, the configuration and how it is
    drawn."""
    means = ", ".join(f"{layer}: {m:.3g}" for layer, m in series.layer_means.items())
    return "\n".join([
        f"{command}; commit {repo_commit()}; configuration experiments/paper/flash_study.yaml",
        f"Layer {series.layer} in every row: the largest mean attn_multi_one_frac of the flash-kernel trajectories "
        f"before their events (per layer: {means}). Each trajectory before its event (its first excursion, k = 2 or "
        "k = 10: steps before the onset), as the report's mechanism; the seeds with every arm finished;",
        "x: the onset, on the trajectory's line (item 2) or on the median of the row's solid line. Runs the summaries "
        "do not list as finished are left out. fp32: the reference (its σ_max ratio is 1), no flash instruments; "
        "mxfp8_exact: exact attention, no item 1; item 2: flash and mxfp8_flash."])


def mechanism_figure(series, path, command, interim):
    """The mechanism figure to `path` (PNG)."""
    fig = mechanism_figure_build(series, interim, mechanism_caption(series, command))
    fig.savefig(path, dpi=110)


# --------------------------------------------------------------------------- main

NULL_TEXT = ("The pilot's rule ended in step C: no configuration of the pilot's grid (depth 2–4, width 128, lr 1e-3 "
             "to 3e-2, 10,000 steps) reproduced the explosion. The study is reported as a null result: the event "
             "counts with Wilson 95 % intervals above (0 events in 40 seeds bound P(event by 10,000 steps) below "
             "0.088), H1–H5 undecided unless an interval meets its falsification criterion, and the links of the "
             "chain that were present in the mechanism below.")


def report(a):
    """(text, study, counted): everything main prints; counted when the study counts (all 40 seeds
    and the pilot's choice, which it ran). StudyError on data that do not fit."""
    study = load(a.dir)
    seeds = study.seeds()
    lines = []
    say = lines.append
    unfinished = (f"; {len(study.unfinished)} runs listed unfinished ({', '.join(f'{r} {s}' for r, s in study.unfinished[:3])}"
                  f"{', ...' if len(study.unfinished) > 3 else ''})") if study.unfinished else ""
    say(f"flash_study: {a.dir}: {len(seeds)} of {len(SEEDS)} seeds complete (every arm finished){unfinished}; "
        f"lr {study.lr or '–'}; excursion k = 10 (primary) and k = 2 (secondary), B = 100, W = 500; C++ and Python "
        f"agree on the primary excursion of all {study.trajectories} finished trajectories")
    table, cell, step, why = pilot_choice(a.pilot)
    if table is not None:
        say(f"\nPilot ({a.pilot}; results/flash_pilot_choice.py):\n")
        say(C.report(table))
        check_configuration(study, cell, None)
    else:
        say(f"\npilot: not complete ({why}): the configuration is not yet chosen by the pre-registered rule, so no "
            "run of the study counts (pre-registration)")
    counted = study.complete() and table is not None
    if not counted:
        say(f"\nINTERIM COUNT ({len(seeds)} of {len(SEEDS)} seeds{'' if table is not None else ', pilot incomplete'}): "
            "counts only; no test and no verdict until all 40 seeds have finished every arm and the pilot has "
            "chosen the configuration (pre-registration)\n")
        if study.trajectories:
            say(markdown_counts(study))
        return "\n".join(lines), study, False
    mech = mechanism(study, a.dir)
    if mech is not None:
        check_configuration(study, cell, mech.depth)
    say("\nExcursions per arm (Wilson 95 %):\n")
    say(markdown_counts(study))
    prereg = prereg_power()
    for name, k in ENDPOINTS:
        ev = study.events[name]
        fam = family(ev)
        head = ("Primary family (k = 10; m = 5, Holm)" if name == "primary" else
                "Secondary family (k = 2; its own m = 5, Holm; secondary verdicts: they change none of the primary ones)")
        say(f"\n{head}; two-sided within-seed permutation log-rank (exact), seed-stratified Cox with Breslow ties; "
            f"undecided by construction with fewer than {MIN_INFORMATIVE} informative seeds:\n")
        say(markdown_family(ev, fam, name))
        say(f"\nEvery arm against fp32 (k = {k:g}; beside the family, not tested):\n")
        say(markdown_beside(ev, beside(ev)))
        say(f"\nPower of the undecided hypotheses ({name}; the effect each needed: its falsification bound; the "
            f"reference's observed event fraction, gamma frailty 0.5, censoring at {STEPS - R.PRIMARY_W:,}, n = "
            f"{len(SEEDS)}, {a.power_sims} simulated studies):\n")
        say(markdown_power(fam, ev, len(fam), a.power_sims, prereg))
    if step == "C":
        say("\n" + NULL_TEXT)
    if mech is None:
        say(f"\nMechanism: no instruments*.csv[.gz] or spectral*.csv[.gz] in {a.dir} (results/extract_flash_instruments.py, "
            "results/extract_spectral.py on the device)")
    else:
        say("\nMechanism (descriptive; before each trajectory's first excursion, else to the end):\n")
        say("1. Ties, mean over the logged rows per trajectory:\n")
        say(markdown_ties(mech, seeds))
        say("\n2. δ bias per layer (attn_delta_bias over the logged rows: mean, positive fraction, t = mean / (sd / "
            "√rows), running sum):\n")
        say(markdown_delta(mech, seeds))
        say("\n3. Weights at the last snapshot before the event (D = W_arm − W_fp32):\n")
        say(markdown_weights(mech, seeds))
        say("\nσ_max / FP32's of W_Q and W_K at every snapshot (median over the trajectories without an event by "
            "then):\n")
        say(markdown_weight_steps(mech, seeds))
        say("\nBeside item 3, the logged spectral norms and W_Q-error cosine (the paper's R predicts a cosine > 0.5):\n")
        say(markdown_logged(mech, seeds))
        say("\n4. The chain (a layer with ties, |t| > 3 there, its W_Q or W_K with a rising σ_max ratio over the last "
            "three snapshots, the last with rank-one share > 0.5 and direction cosine > 0.9):\n")
        say(markdown_chain(mech, seeds))
    say(f"\nExploratory, not pre-registered: loss spikes the sustained endpoints do not count (the first block from "
        f"step {SPIKE_AFTER:,} on whose maximum exceeds {SPIKE_FACTOR:g} x the minimum of every earlier block, or "
        "that holds a non-finite loss):\n")
    say(markdown_spikes(loss_spikes(a.dir, study.run_of), seeds))
    if mech is not None and a.per_trajectory:
        say("\nPer trajectory and layer (items 1, 2, 4):\n")
        say(markdown_per_trajectory(mech, seeds))
    return "\n".join(lines), study, True


def main(argv=None):
    ap = argparse.ArgumentParser(prog="flash_study.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--dir", default=os.path.join(HERE, "flash_study"), help="the study's CSVs (default results/flash_study)")
    ap.add_argument("--pilot", default=os.path.join(HERE, "flash_pilot"),
                    help="the pilot's CSVs and plan.txt (default results/flash_pilot)")
    ap.add_argument("--figure", nargs="?", const=os.path.join(HERE, "figures", "flash_study_km.png"), metavar="PNG",
                    help="write the Kaplan-Meier figure (default path results/figures/flash_study_km.png); complete "
                         "study only")
    ap.add_argument("--mechanism-figure", nargs="?", const=os.path.join(HERE, "figures", "flash_study_mechanism.png"),
                    metavar="PNG", help="write the mechanism figure (items 1-3 per arm over steps, across seeds; default "
                                        "path results/figures/flash_study_mechanism.png); on an interim study too, "
                                        "labelled so; needs instruments*.csv[.gz] and spectral*.csv[.gz] in --dir")
    ap.add_argument("--per-trajectory", action="store_true", help="also print the mechanism per trajectory and layer")
    ap.add_argument("--power-sims", type=int, default=4000, help="simulated studies per power cell (default 4000, as "
                                                                 "the pre-registration)")
    a = ap.parse_args(argv)
    try:
        if a.power_sims < 1:
            raise StudyError("--power-sims must be >= 1")
        text, study, counted = report(a)
        series = mechanism_series(study, a.dir) if a.mechanism_figure else None
    except (W.StudyError, R.DataError, OSError) as e:
        print(f"flash_study: {e}", file=sys.stderr)
        return 2
    print(text)
    if a.figure:
        if not counted:
            print(f"\nfigure: not written ({a.figure}): the study does not count yet (interim)")
        else:
            command = f"python3 results/flash_study.py --dir {_shown(a.dir)} --figure {_shown(a.figure)}"
            try:
                figure(study, a.figure, command)
            except OSError as e:
                print(f"flash_study: cannot write {a.figure}: {e.strerror}; choose a writable path", file=sys.stderr)
                return 74
            print(f"\nwrote {a.figure}")
    if a.mechanism_figure:
        n = len(series.seeds)
        if not n:
            print(f"\nmechanism figure: not written ({a.mechanism_figure}): no seed has every arm finished")
            return 0
        interim = "" if counted else (f"interim: {n} of {len(SEEDS)} seeds" +
                                      (", pilot incomplete" if study.complete() else "") +
                                      " (descriptive; the study does not count yet)")
        command = (f"python3 results/flash_study.py --dir {_shown(a.dir)} --pilot {_shown(a.pilot)} "
                   f"--mechanism-figure {_shown(a.mechanism_figure)}")
        try:
            mechanism_figure(series, a.mechanism_figure, command, interim)
        except OSError as e:
            print(f"flash_study: cannot write {a.mechanism_figure}: {e.strerror}; choose a writable path",
                  file=sys.stderr)
            return 74
        print(f"\nwrote {a.mechanism_figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
