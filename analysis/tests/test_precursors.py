"""results/precursors.py: the risk-set percentile test of the paper's precursors, on synthetic
series directories with answers worked by hand (who is at risk, the percentiles, the sustained
and burn-in rules), a planted signal it must find and a null it must not."""

import csv
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


def test_readme_section_11_is_what_the_committed_series_give(mod, capsys):
    """results/README.md section 11's precursor table (pre-registered test) and the numbers it
    quotes from the exploratory first-spike test are precursors.py's output over the committed
    code-faithful series."""
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    series = os.path.join(root, "results", "code_faithful_20k", "series_code_faithful_20k_shard*")
    readme = open(os.path.join(root, "results", "README.md"), encoding="utf-8").read()
    section = readme[readme.index("## 11. "):readme.index("## Not done")].replace("**", "")
    mod.main([series])
    out = capsys.readouterr().out
    assert "24 mx trajectories, 13 diverged for at least 500 steps" in out
    for _, label in mod.QUANTITIES:
        n, mean, p, holm = re.search(rf"^\| {re.escape(label)} \| (\d+) \| ([0-9.]+) \| ([0-9.e-]+) \| ([0-9.e-]+) \|",
                                     out, re.M).groups()
        row = f"| {label} | {n} | {mean} | {float(p):.2g} | {float(holm):.2g} |"
        assert row in section, row
    mod.main([series, "--event", "spike"])
    out = capsys.readouterr().out
    assert "24 mx trajectories, 22 had a first loss spike" in out
    assert "| ζ² running average (Fig. 5) | 21 | 0.527 | 0.729 |" in out
    assert "| γ last-bin fraction, worst layer (Fig. 3) | 21 | 0.411 | 0.247 | 0.494 |" in out
    assert "ζ²: mean percentile 0.53, p 0.73. γ: 0.41, p 0.25 (Holm 0.49)" in section
    assert "22 of the 24 MX trajectories spike and 14 of the 24 FP32 ones do" in section
    mod.main([series, "--event", "spike", "--trajectory", "fp32"])
    assert "24 fp32 trajectories, 14 had a first loss spike" in capsys.readouterr().out
