"""results/precursors.py: the risk-set percentile test of the paper's precursors, on synthetic
series directories with answers worked by hand (who is at risk, the percentiles, the sustained
and burn-in rules), a planted signal it must find and a null it must not."""

import csv
import math
import os

import pytest
from conftest import load_results_script

RUN_COLS = ["run_id", "seed", "lr", "trajectory", "kind", "at", "from", "divergence_step", "first_nonfinite_step",
            "steps_run"]
SERIES_COLS = ["trajectory", "step", "loss", "grad_norm", "bias_ratio_avg", "cosine", "cross_ratio_sq_avg",
               "gamma_lastbin_max", "gamma_above_frac_max", "gamma_gap_mean_max"]


@pytest.fixture(scope="module")
def mod():
    return load_results_script("precursors")


def write_dir(d, runs, steps=5000, every=50):
    """runs: [(run_id, lr, divergence_step, zeta(step), gamma(step)[, loss(step)])] (loss 0.01
    unless given); the fp32 trajectory of each run never diverges and carries other values (it
    must not be read for --trajectory mx)."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "runs.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(RUN_COLS)
        for rid, lr, div, *_ in runs:
            w.writerow([rid, 1, lr, "fp32", "trajectory", 0, "", -1, -1, steps])
            w.writerow([rid, 1, lr, "mx", "trajectory", 0, "", div, -1, steps])
        for rid, lr, div, zeta, gamma, *rest in runs:
            loss = rest[0] if rest else const(0.01)
            with open(os.path.join(d, f"series_{rid}.csv"), "w", newline="") as sf:
                sw = csv.writer(sf)
                sw.writerow(SERIES_COLS)
                for s in range(0, steps + 1, every):
                    sw.writerow(["fp32", s, 5.0 if s == 2000 else 0.01, 0.1, "nan", "nan", "nan", 99.0, 0, 0])
                    z = "nan" if s == 0 else zeta(s)
                    sw.writerow(["mx", s, loss(s), 0.1, 1.0, 0.5, z, gamma(s), 0, 0])


def const(v):
    return lambda s: v


def test_hand_worked_risk_set_and_percentiles(mod, tmp_path):
    # Events (W = 0): a at 3000, b at 3600 (lr 5e-4); c, d never; e at 3000 is lr 6e-4 (not in a's set).
    # Window of a: [1500, 2500): a 3.0, at risk b 2.0, c 4.0, d 3.0 -> (1 + 0.5) / 3 = 0.5.
    # Window of b: [2100, 3100): b 2.0, at risk c 4.0, d 3.0 (a diverged at 3000 < 3600) -> 0 / 2 = 0.
    # e: nobody of lr 6e-4 at risk -> left out.
    d = str(tmp_path / "s")
    write_dir(d, [("a", "0.0005", 3000, const(3.0), const(0.5)), ("b", "0.0005", 3600, const(2.0), const(0.9)),
                  ("c", "0.0005", -1, const(4.0), const(0.1)), ("d", "0.0005", -1, const(3.0), const(0.5)),
                  ("e", "0.0006", 3000, const(9.0), const(0.5))])
    subjects = mod.load([d], "mx", 0)
    rows, left_out, mean, p = mod.analyse(subjects, "cross_ratio_sq_avg", 500, 1000, 1000)
    assert [(r[0], r[5], r[6]) for r in rows] == [("a", 3, 0.5), ("b", 2, 0.0)]
    assert mean == pytest.approx(0.25)
    assert [(x[0], x[3]) for x in left_out] == [("e", "nobody at risk")]
    # Null of two events with 3 and 2 at risk: mean percentile in {0, 1/3, 2/3, 1} + {0, 1/2, 1} over 2,
    # 12 equally likely pairs; |mean - 0.5| >= 0.25 in 6 of them: p = 0.5 (up to the draws).
    assert p == pytest.approx(0.5, abs=0.01)
    # gamma: a 0.5 vs (0.9, 0.1, 0.5) -> 0.5; b 0.9 vs (0.1, 0.5) -> 1.0.
    rows, _, mean, _ = mod.analyse(subjects, "gamma_lastbin_max", 500, 1000, 1000)
    assert [r[6] for r in rows] == [0.5, 1.0]


def test_sustained_and_burn_in_rules(mod, tmp_path):
    d = str(tmp_path / "s")
    write_dir(d, [("late", "0.0005", 4800, const(3.0), const(0.5)), ("early", "0.0005", 2000, const(3.0), const(0.5)),
                  ("never", "0.0005", -1, const(2.0), const(0.5))])
    subjects = {s[0]: s for s in mod.load([d], "mx", 500)}
    assert subjects["late"][2:4] == (False, 4500)  # 200 steps before the end: censored at 5000 - 500
    assert subjects["early"][2:4] == (True, 2000)
    rows, left_out, mean, p = mod.analyse(list(subjects.values()), "cross_ratio_sq_avg", 500, 1000, 1000)
    assert rows == [] and mean is None and p is None
    assert [(x[0], x[3]) for x in left_out] == [("early", "window starts at 500 < burn-in 1000")]


def test_finds_a_planted_precursor_and_not_a_null(mod, tmp_path):
    runs = []
    for i in range(8):  # ζ² 3 before each divergence, 2 elsewhere and in every stable run (windows apart)
        div = 3000 + 1000 * i
        runs.append((f"d{i}", "0.0005", div, (lambda s, div=div: 3.0 if div - 1500 <= s < div - 500 else 2.0),
                     const(0.5)))
    for i in range(12):
        runs.append((f"s{i}", "0.0005", -1, const(2.0), const(0.5)))
    d = str(tmp_path / "s")
    write_dir(d, runs, steps=12000)
    subjects = mod.load([d], "mx", 500)
    rows, _, mean, p = mod.analyse(subjects, "cross_ratio_sq_avg", 500, 1000, 1000)
    assert len(rows) == 8 and mean == 1.0
    assert p < 1e-3
    rows, _, mean, p = mod.analyse(subjects, "gamma_lastbin_max", 500, 1000, 1000)  # all equal: 0.5
    assert mean == 0.5 and p == 1.0


def test_cli_prints_the_table_and_draws_the_figure(mod, tmp_path, capsys):
    d = str(tmp_path / "s")
    write_dir(d, [("a", "0.0005", 3000, const(3.0), const(0.5)), ("c", "0.0005", -1, const(2.0), const(0.1))])
    png = str(tmp_path / "f.png")
    mod.main([d, "--sustained", "0", "--figure", png])
    out = capsys.readouterr().out
    assert "2 mx trajectories, 1 diverged for at least 0 steps" in out
    assert "| ζ² running average (Fig. 5) | 1 | 1.000 |" in out
    assert os.path.getsize(png) > 0
    with pytest.raises(SystemExit):
        mod.main([str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        mod.main([d, "--length", "0"])
    with pytest.raises(SystemExit):  # the same run in two directories
        mod.main([d, d])


def test_first_spike_by_hand(mod):
    losses = [(0, 1.0), (50, 0.5), (100, 0.2), (150, 1.9), (200, 2.1), (250, 9.0)]
    assert mod.first_spike(losses, 10) == 200  # 2.1 > 10 x 0.2; 1.9 is not
    assert mod.first_spike(losses, 5) == 150
    assert mod.first_spike(losses[:4], 10) is None
    assert mod.first_spike([], 10) is None


def test_spike_events_replace_divergences(mod, tmp_path, capsys):
    # a: loss 0.01, 0.2 from step 3000 on (a spike at 3000), never diverges; b: diverges at 3500
    # but never spikes (its divergence is not an event here); c: neither. The fp32 trajectory
    # spikes at 2000 and must not be read. Window of a: [1500, 2500): a 3.0 vs b 2.0, c 4.0 -> 0.5.
    d = str(tmp_path / "s")
    write_dir(d, [("a", "0.0005", -1, const(3.0), const(0.9), lambda s: 0.2 if s >= 3000 else 0.01),
                  ("b", "0.0005", 3500, const(2.0), const(0.1)), ("c", "0.0005", -1, const(4.0), const(0.1))])
    subjects = {x[0]: x for x in mod.load([d], "mx", 500, "spike", 10.0)}
    assert {k: v[2:4] for k, v in subjects.items()} == {"a": (True, 3000), "b": (False, 5000), "c": (False, 5000)}
    rows, _, mean, _ = mod.analyse(list(subjects.values()), "cross_ratio_sq_avg", 500, 1000, 1000)
    assert [(r[0], r[5], r[6]) for r in rows] == [("a", 2, 0.5)]
    rows, _, mean, _ = mod.analyse(list(subjects.values()), "gamma_lastbin_max", 500, 1000, 1000)
    assert mean == 1.0
    mod.main([d, "--event", "spike"])
    out = capsys.readouterr().out
    assert "3 mx trajectories, 1 had a first loss spike (> 10 x the smallest loss before it; exploratory)" in out
    assert "| run | lr | spiked at |" in out
    mod.main([d, "--event", "spike", "--spike-factor", "30"])  # 0.2 < 30 x 0.01: no event
    assert "3 mx trajectories, 0 had a first loss spike (> 30 x" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        mod.main([d, "--event", "spike", "--spike-factor", "1"])


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERIES = os.path.join(ROOT, "results", "code_faithful_20k", "series_code_faithful_20k_shard*")
FIRST = [os.path.join(ROOT, "results", "code_faithful_20k", f"series_code_faithful_20k_shard{i}of10")
         for i in range(4, 10)]  # the first analysis: the shards that had series then


def _readme():
    """(README, its section 11, the same two with whitespace collapsed): results/README.md with its
    bold marks dropped; the collapsed texts match prose that wraps lines anywhere."""
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read().replace("**", "")
    section = readme[readme.index("## 11. "):readme.index("## Not done")]
    return readme, section, " ".join(readme.split()), " ".join(section.split())


def _results(mod, dirs, trajectory="mx", event="divergence"):
    """(subjects, {quantity: (events used, mean, p, Holm)}) with the CLI's defaults."""
    subjects = mod.load(dirs, trajectory, 500, event, 10.0)
    res = {q: mod.analyse(subjects, q, 500, 1000, 1000) for q, _ in mod.QUANTITIES}
    adj = iter(mod.holm([r[3] for r in res.values() if r[3] is not None]))
    return subjects, {q: (len(r[0]), r[2], r[3], next(adj) if r[3] is not None else None) for q, r in res.items()}


def test_readme_section_11_is_what_the_committed_series_give(mod, capsys):
    """results/README.md section 11's two precursor tables (pre-registered test: all 40 runs, and
    the first analysis on shards 4-9's 24) and the numbers its prose, the answers table and
    sections 2 and 9 quote from them and from the exploratory first-spike and FP32 variants are
    precursors.py's output over the committed code-faithful series."""
    import glob
    import re
    dirs = sorted(glob.glob(SERIES))
    assert len(dirs) == 10 and all(os.path.isdir(d) for d in FIRST)  # every shard has its series
    _, section, flat, flat_section = _readme()
    full = section[section.index("*All 40 runs*"):section.index("*First analysis, 24 runs*")]
    first = section[section.index("*First analysis, 24 runs*"):section.index("![precursors]")]
    for where, args, n, events in ((full, [SERIES], 40, 18), (first, FIRST, 24, 13)):
        mod.main(args)
        out = capsys.readouterr().out
        assert f"{n} mx trajectories, {events} diverged for at least 500 steps" in out
        assert f"{n} MX trajectories, {events} events." in " ".join(where.split())
        for _, label in mod.QUANTITIES:
            e, mean, p, holm = re.search(
                rf"^\| {re.escape(label)} \| (\d+) \| ([0-9.]+) \| ([0-9.e-]+) \| ([0-9.e-]+) \|", out, re.M).groups()
            assert int(e) == events
            row = f"| {label} | {e} | {mean} | {float(p):.2g} | {float(holm):.2g} |"
            assert row in where, row

    z, g = (q for q, _ in mod.QUANTITIES)
    _, all_div = _results(mod, dirs)
    _, first_div = _results(mod, FIRST)
    _, all_spike = _results(mod, dirs, event="spike")
    _, first_spike = _results(mod, FIRST, event="spike")
    _, all_fp = _results(mod, dirs, "fp32")
    _, first_fp = _results(mod, FIRST, "fp32")
    # The prose of section 11.
    expected = [
        f"ζ² (Fig. 5) does not precede the divergences (40 runs: mean percentile {all_div[z][1]:.2f}, "
        f"p {all_div[z][2]:.2g}; first analysis: {first_div[z][1]:.2f}, p {first_div[z][2]:.2g}).",
        f"does not precede them either, on all 40 runs ({all_div[g][0]} events, mean percentile "
        f"{all_div[g][1]:.2f}, p {all_div[g][2]:.2g}, Holm {all_div[g][3]:.2g}).",
        f"({first_div[g][0]} events, mean percentile {first_div[g][1]:.2f}, Holm p = {first_div[g][3]:.2g})",
        f"37 events with someone at risk). ζ²: mean percentile {all_spike[z][1]:.2f}, p {all_spike[z][2]:.2g}. "
        f"γ: {all_spike[g][1]:.2f}, p {all_spike[g][2]:.2g} (Holm {all_spike[g][3]:.2g}). First analysis "
        f"({first_spike[g][0]} events): ζ² {first_spike[z][1]:.2f}, p {first_spike[z][2]:.2g}; "
        f"γ {first_spike[g][1]:.2f}, p {first_spike[g][2]:.2g} (Holm {first_spike[g][3]:.2g}).",
        f"has {all_fp[g][0]} events (40 runs: mean percentile {all_fp[g][1]:.2f}, p {all_fp[g][2]:.2g}; "
        f"first analysis: {first_fp[g][0]} events, p {first_fp[g][2]:.2g}).",
        f"(pre-registered test, 40 runs, {all_div[g][0]} events): - ζ² ≈ 2 holds before the instability in every "
        f"run, and it is no precursor (p = {all_div[z][2]:.2g}). - The γ last-bin fraction is no precursor either "
        f"(Holm p = {all_div[g][3]:.2g}), nor before the first spike (exploratory, p = {all_spike[g][2]:.2g}).",
        f"elevated before sustained divergences (Holm p = {first_div[g][3]:.2g})",
    ]
    for text in expected:
        assert text in flat_section, text
    assert all_spike[g][0] == 37 and all_div[g][0] == 18 and first_div[g][0] == 13
    # The answers table (rows 2, 3, 9: what they still quote of this test; their first-spike numbers
    # are test_reanalysis_excursion.py's) and sections 2 and 9.
    expected = [
        f"§11's pre-registered test, at the {all_div[g][0]} sustained divergences (16 of which came after the first "
        f"spike, so its window often lay inside the instability), found mean percentile {all_div[g][1]:.2f} (Holm "
        f"p = {all_div[g][3]:.2g}); its first analysis, on the 24 runs whose series existed then "
        f"({first_div[g][0]} divergences), {first_div[g][1]:.2f} (Holm p = {first_div[g][3]:.2g}).",
        f"§11's pre-registered test on the paper's code path, at sustained divergences (40 runs, {all_div[z][0]} "
        f"events, mean percentile {all_div[z][1]:.2f}, p = {all_div[z][2]:.2g}; first analysis on 24 runs: "
        f"{first_div[z][0]} events, {first_div[z][1]:.2f}, p = {first_div[z][2]:.2g}); §9, 5 seeds.",
        "§11, 40 code-faithful runs: until the first loss spike",
        f"before FP32's own {all_fp[g][0]} sustained divergences the γ fraction does not differ from the runs at "
        f"risk (§11, 40 runs, p = {all_fp[g][2]:.2g}; first analysis on 24 runs: {first_fp[g][0]}, "
        f"p = {first_fp[g][2]:.2g})",
        "§11 repeats it on the paper's code path with 18 events (40 runs): neither separates (a first analysis "
        "on 24 runs, 13 events,",
    ]
    for text in expected:
        assert text in flat, text
    for out_line, args in (("40 mx trajectories, 38 had a first loss spike", [SERIES, "--event", "spike"]),
                           ("24 mx trajectories, 22 had a first loss spike", FIRST + ["--event", "spike"]),
                           ("40 fp32 trajectories, 25 had a first loss spike", [SERIES, "--event", "spike",
                                                                                 "--trajectory", "fp32"]),
                           ("24 fp32 trajectories, 14 had a first loss spike", FIRST + ["--event", "spike",
                                                                                     "--trajectory", "fp32"]),
                           ("40 fp32 trajectories, 4 diverged for at least 500 steps", [SERIES, "--trajectory", "fp32"]),
                           ("24 fp32 trajectories, 3 diverged for at least 500 steps", FIRST + ["--trajectory", "fp32"])):
        mod.main(args)
        assert out_line in capsys.readouterr().out, out_line
    assert ("38 of the 40 MX trajectories spike and 25 of the 40 FP32 ones do; only 4 FP32 trajectories diverge "
            "for ≥ 500 steps (first analysis: 22 and 14 of 24; 3)") in flat_section
    assert "38 first spikes, 37 events with someone at risk" in flat_section


def test_readme_section_11_descriptive_numbers(mod):
    """The descriptive numbers section 11 gives around the precursor test (ζ²'s level before the
    first spike and its peak after it, how many events had spiked before their window, the split of
    the γ result between the first analysis's runs and the 16 added ones, γ after step 10,000)
    recomputed from the committed series."""
    import glob
    import statistics
    dirs = sorted(glob.glob(SERIES))
    first_ids = {r["run_id"] for d in FIRST for r in csv.DictReader(open(os.path.join(d, "runs.csv")))}
    _, _, flat_all, flat = _readme()
    z, g = (q for q, _ in mod.QUANTITIES)
    div = mod.load(dirs, "mx", 500)
    spike = {s[0]: s for s in mod.load(dirs, "mx", 500, "spike", 10.0)}
    assert len(div) == 40 and sum(1 for s in spike.values() if s[2]) == 38

    def sup(n):
        return str(n).translate(str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻"))

    def sci(x):
        e = math.floor(math.log10(x))
        m = f"{x / 10 ** e:.1f}"
        if m == "10.0":
            m, e = "1.0", e + 1
        return f"{m}·10{sup(e)}"

    # ζ²: each run's median from step 2000 to its first spike; its peak from the spike on.
    levels, peaks = [], []
    for rid, lr, event, time, series in div:
        end = spike[rid][3] if spike[rid][2] else math.inf
        levels.append(statistics.median(v for s, v in series[z] if 2000 <= s < end))
        if spike[rid][2]:
            peaks.append(max(v for s, v in series[z] if s >= end))
    assert (f"Its median from step 2000 to the MX trajectory's first loss spike is {min(levels):.1f}–"
            f"{max(levels):.1f} in every one of the 40 runs. From that spike on its maximum is "
            f"{sci(min(peaks))}–{sci(max(peaks))} (median over the {len(peaks)} spiking runs "
            f"{sci(statistics.median(peaks))})") in flat
    assert f"then peaks of {sci(min(peaks))}–{sci(max(peaks))} from the spike on" in flat_all

    # Events that had spiked before their window began, all runs and the first analysis's.
    for subset, text in ((div, "In {} of the {} events the trajectory had already spiked"),
                         ([s for s in div if s[0] in first_ids], "(first analysis: {} of {})")):
        events = [s for s in subset if s[2]]
        before = [s for s in events if spike[s[0]][2] and spike[s[0]][3] < s[3] - 1500]
        assert text.format(len(before), len(events)) in flat, text

    # The γ result split between the first analysis's 13 events and the 5 added ones (full risk sets).
    rows, _, _, _ = mod.analyse(div, g, 500, 1000, 1000)
    old = [r[6] for r in rows if r[0] in first_ids]
    new = [r[6] for r in rows if r[0] not in first_ids]
    assert len(old) == 13 and len(new) == 5
    assert (f"the first analysis's 13 events average {statistics.fmean(old):.2f} and the 5 added ones "
            f"{statistics.fmean(new):.2f}") in flat

    # Window medians of γ, per group: the median over each group's runs of their own medians.
    def group_median(traj, lo, hi, added):
        meds = []
        for rid, lr, event, time, series in mod.load(dirs, traj, 500):
            if (rid not in first_ids) == added:
                vals = [v for s, v in series[g] if lo <= s < hi]
                meds.append(statistics.median(vals))
        return statistics.median(meds)
    assert (f"over steps 10,000–15,000 the median of their MX trajectories' medians is "
            f"{group_median('mx', 10000, 15000, True):.2f}, against {group_median('mx', 10000, 15000, False):.2f} "
            "in shards 4–9") in flat
    windows = [("mx", 2000, 5000), ("mx", 5000, 7000), ("mx", 7000, 10000)] + \
              [("fp32", lo, hi) for lo, hi in ((2000, 5000), (5000, 7000), (7000, 10000), (10000, 15000), (15000, 20001))]
    gap = max(abs(group_median(t, lo, hi, True) - group_median(t, lo, hi, False)) for t, lo, hi in windows)
    assert gap <= 0.07 and "within 0.07)" in flat

    # γ from step 10,000 (up to the divergence) in the runs still at risk then.
    late = []
    for rid, lr, event, time, series in div:
        vals = [v for s, v in series[g] if s >= 10000 and (not event or s <= time)]
        if vals:
            late.append((rid, event, statistics.median(vals)))
    low = [x for x in late if x[2] <= 0.15]
    high = [x for x in late if x[2] > 0.15]
    assert min(x[2] for x in high) > 0.2
    ev_high = sum(1 for x in high if x[1])
    ne_high = sum(1 for x in high if not x[1])
    assert (f"is ≤ 0.15 in {len(low)} of the {len(late)} runs still at risk then. The other {len(high)} stay at "
            f"0.2–{max(x[2] for x in high):.2f} after their spikes: {ev_high} of the {sum(1 for x in late if x[1])} "
            f"that later diverge for ≥ 500 steps and {ne_high} of the {sum(1 for x in late if not x[1])} that do "
            "not") in flat
    added_stable = [x for x in late if not x[1] and x[0] not in first_ids]
    first_stable = [x for x in late if not x[1] and x[0] in first_ids]
    added_high = [x[2] for x in added_stable if x[2] > 0.2]
    assert (f"{len(added_high)} of the {len(added_stable)} added runs without a sustained divergence stay at "
            f"{min(added_high):.2f}–{max(added_high):.2f} from step 10,000 (shards 4–9: "
            f"{sum(1 for x in first_stable if x[2] > 0.2)} of {len(first_stable)})") in flat
