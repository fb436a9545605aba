"""results/figures_instruments.py: sections 7-8 of results/README.md recomputed from the committed
CSVs; its statistics agree with mxlab summarize's (lab/stats/stats.cpp) on the same runs."""

import csv
import math
import os

import pytest
from conftest import load_results_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def fig():
    return load_results_script("figures_instruments")


def test_wilson_and_fisher_by_hand(fig):
    # 3/5: p = 0.6, z^2 = 3.8415; centre = (0.6 + 0.38415) / 1.7683 = 0.55655,
    # half = 1.96 * sqrt(0.048 + 0.038415) / 1.7683 = 0.32583.
    lo, hi = fig.wilson(3, 5)
    assert lo == pytest.approx(0.23072, abs=1e-4) and hi == pytest.approx(0.88238, abs=1e-4)
    assert fig.wilson(0, 5)[0] == 0.0
    # 0/5 vs 3/5: tables with 3 events; P(a=0) = C(5,0)C(5,3)/C(10,3) = 10/120; as or less likely:
    # a = 0 and a = 3 (10/120 each) -> p = 20/120.
    assert fig.fisher_two_sided(0, 5, 3, 5) == pytest.approx(1 / 6)
    assert fig.fisher_two_sided(2, 4, 2, 4) == pytest.approx(1.0)


def test_agrees_with_mxlab_summarize_on_the_same_runs(fig):
    with open(os.path.join(ROOT, "results", "summary_by_arm_instruments_lr5e-4.csv")) as f:
        text = f.read().split("\n\n")
    groups = {r["arm"]: r for r in csv.DictReader(text[0].splitlines())}
    test = next(csv.DictReader(text[1].strip().splitlines()))
    for arm in ("fp32", "mx"):
        g = groups[arm]
        lo, hi = fig.wilson(int(g["diverged"]), int(g["n"]))
        assert lo == pytest.approx(float(g["diverged_lo"]), abs=1e-9)
        assert hi == pytest.approx(float(g["diverged_hi"]), abs=1e-9)
    assert fig.fisher_two_sided(0, 5, 3, 5) == pytest.approx(float(test["fisher_p"]), rel=1e-9)
    _, table = fig.survival_table()
    row = next(line for line in table.splitlines() if line.startswith("| MLP, layernorm fp32 vs MLP, layernorm mx"))
    assert row.split("|")[4].strip() == f"{float(test['logrank_p']):.3f}"


def test_tables_and_figures_from_the_committed_csvs(fig, tmp_path, capsys):
    assert fig.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in ("fig12a_switch_seed0.png", "fig12b_sharpness_lr5e-4.png", "fig14_survival_lr5e-4.png"):
        assert (tmp_path / name).stat().st_size > 10000, name
    # The numbers results/README.md quotes.
    assert "| 4200 | probe | 0.002488 | 1.118× | 1.122× | 1.138× |" in out
    assert "| 0 | mx | 4817 | 96 | 0.866 | 0.995 | 0.00 | 2.13 | 60.6 |" in out
    assert "| MLP, MXNorm | mx | 5 | 5/5 (0.57–1.00)" in out
    assert not any(math.isnan(x) for x in fig.wilson(1, 2))


def test_paper_metric_table_stops_at_the_divergence(fig):
    table = fig.paper_metric_table()
    rows = [line for line in table.splitlines() if line.startswith("| 0 | 4817 | ζ²")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].split("|")[4:-1]]
    assert cells[:4] == ["4.50", "2.49", "1.85", "1.79"] and set(cells[4:]) == {"(diverged)"}
    fp32 = [line for line in table.splitlines() if "(FP32)" in line]
    assert len(fp32) == 5 and all("(diverged)" not in line for line in fp32)


def test_fisher_power_by_hand_and_as_quoted(fig):
    # n = 1 per arm: no 2x2 table with one trial each reaches p < 0.05 -> power 0.
    assert fig.fisher_power(0.6, 0.3, 1) == 0.0
    # Identical arms: the power is the test's size, at most alpha.
    assert fig.fisher_power(0.5, 0.5, 10) <= 0.05
    assert round(fig.fisher_power(0.6, 0.3, 5), 3) == 0.085
    assert round(fig.fisher_power(0.6, 0.3, 32), 2) == 0.62
