"""results/study_arms.py: merging shard summaries of the arms study, its counts, tests and figure,
on synthetic shard CSVs with known answers; results/stats_util.py's Holm correction by hand."""

import csv
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLS = ["run_id", "group", "at", "seed", "status", "divergence_step", "first_nonfinite_step", "final_loss", "min_loss",
        "steps_run"]


@pytest.fixture(scope="module")
def mod():
    sys.path.insert(0, os.path.join(ROOT, "results"))
    spec = importlib.util.spec_from_file_location("study_arms", os.path.join(ROOT, "results", "study_arms.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLS)
        for r in rows:
            w.writerow(r)


def run_rows(rid, seed, away_div, even_div, status="complete"):
    """fp32 never diverges (min 0.002); floor_away / floor_even diverge at the given step (-1: no)."""
    def row(g, d):
        final = 0.05 if d >= 0 else 0.0021
        st = status if g == "floor_even" else ("diverged" if d >= 0 else "complete")
        return [rid, g, "", seed, st, d, -1, final, 0.002, 10000]
    return [row("fp32", -1), row("floor_away", away_div), row("floor_even", even_div)]


def test_merges_shards_and_counts(mod, tmp_path, capsys):
    write(tmp_path / "summary_study_arms_shard0of2.csv",
          run_rows("a", 10, 5000, -1) + run_rows("b", 11, 7000, -1) + run_rows("c", 12, -1, -1))
    write(tmp_path / "summary_study_arms_shard1of2.csv",
          run_rows("d", 13, 9000, 8000) + run_rows("e", 14, -1, -1, status="interrupted") +
          run_rows("a", 10, 5000, -1))  # a rerun of a finished run: identical, counted once
    runs, interrupted = mod.load(str(tmp_path))
    assert sorted(runs) == ["a", "b", "c", "d"] and interrupted == ["e"]
    s = mod.per_arm(runs)
    assert (s["fp32"]["n"], s["fp32"]["div"]) == (4, 0)
    assert (s["floor_away"]["div"], s["floor_away"]["deg"], s["floor_away"]["steps"]) == (3, 3, [5000, 7000, 9000])
    assert (s["floor_even"]["div"], s["floor_even"]["seeds_div"]) == (1, [13])
    t1, t2 = mod.tables(s)
    assert "| floor_away | 4 | 3/4 (" in t1 and "| 7000 |" in t1
    # floor_even 1/4 vs floor_away 3/4: Fisher p = 0.486 (hand: tables with 4 events, P(a=1) =
    # P(a=3) = 16/70, as or less likely: a in {0, 1, 3, 4} -> (1 + 16 + 16 + 1)/70).
    assert "| floor_even vs floor_away | 1/4 vs 3/4 | 0.486 |" in t2
    assert mod.main(["--dir", str(tmp_path), "--figure", str(tmp_path / "f.png")]) == 0
    out = capsys.readouterr().out
    assert "4 finished runs (seeds 10, 11, 12, 13); left out, not finished: e" in out
    assert (tmp_path / "f.png").stat().st_size > 5000


def test_conflicting_shards_are_an_error(mod, tmp_path):
    write(tmp_path / "summary_study_arms_shard0of2.csv", run_rows("a", 10, 5000, -1))
    write(tmp_path / "summary_study_arms_shard1of2.csv", run_rows("a", 10, 5100, -1))
    with pytest.raises(SystemExit, match="differs between shards"):
        mod.load(str(tmp_path))
    with pytest.raises(SystemExit, match="no summary_study_arms_shard"):
        mod.load(str(tmp_path / "nowhere"))


def test_holm_by_hand(mod):
    from stats_util import holm
    # p = 0.01, 0.04, 0.03 (m = 3): sorted 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> max-accumulated 0.06.
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]
    assert holm([0.4, 0.9]) == pytest.approx([0.8, 0.9])


def test_diverged_at_takes_the_earlier_step(mod):
    from stats_util import diverged_at
    row = lambda d, nf: {"divergence_step": str(d), "first_nonfinite_step": str(nf)}
    assert diverged_at(row(-1, -1)) == -1
    assert diverged_at(row(500, -1)) == 500
    assert diverged_at(row(-1, 30)) == 30
    assert diverged_at(row(500, 30)) == 30
    assert diverged_at(row(20, 30)) == 20
