"""warn: ROC, AUC, lead times and false alarms on hand-made series with known answers."""

import csv
import io
import math
import re

import numpy as np
import pytest

import make_fixtures as F
from mxlab import AnalysisError
from mxlab import warn as W
from mxlab.__main__ import main
from test_figures import _is_png

STEPS = 1000
DIVERGE = (500, 600, 700, 800)   # four diverging arms
LEAD_A = 50                      # gamma_lastbin jumps this many steps before the divergence
LEAD_COS = 100                   # the cosine rises this many steps before
LEAD_CURV = 200                  # precond_ratio crosses 1 this many steps before
POS_LEVELS = (1.0, 3.0, 5.0, 7.0)   # bias_ratio_avg: constant per trajectory, interleaved
NEG_LEVELS = (2.0, 4.0, 6.0, 8.0)   # ... so AUC(above) = 6/16, AUC(below) = 10/16


def _layers(values):
    """[n] -> [n, 3]: the signal in layer 1, quiet layers around it (max over layers)."""
    values = np.asarray(values, dtype=np.float64)
    return np.stack([np.full_like(values, 0.05), values, np.full_like(values, 0.02)], axis=1)


def _diverging(name, e, level):
    return {"name": name, "divergence": e, "rows": {
        "gamma_lastbin": lambda s: _layers(np.where(s >= e - LEAD_A, 0.9, 0.1)),
        "cosine": lambda s: np.where(s >= e - LEAD_COS, 0.6, 0.2),
        "bias_ratio_avg": lambda s: np.full(len(s), level),
        "grad_norm": lambda s: np.ones(len(s)),   # useless: the same everywhere
    }, "curvature": {
        "precond_lmax": lambda s: np.where(s >= e - LEAD_CURV, 1.5, 0.5) * 38 / 5e-4,
        "precond_threshold": lambda s: np.full(len(s), 38 / 5e-4),
    }}


def _stable(name, level, k):
    return {"name": name, "rows": {
        "gamma_lastbin": lambda s: _layers(0.1 + 0.05 * k * (s > 900)),  # peaks 0.1 .. 0.25
        "cosine": lambda s: np.full(len(s), 0.2 + 0.02 * k),
        "bias_ratio_avg": lambda s: np.full(len(s), level),
        "grad_norm": lambda s: np.ones(len(s)),
    }, "curvature": {
        "precond_lmax": lambda s: np.full(len(s), 0.5 * 38 / 5e-4),
        "precond_threshold": lambda s: np.full(len(s), 38 / 5e-4),
    }}


@pytest.fixture(scope="module")
def warn_dir(tmp_path_factory):
    """Two run files: 4 diverging arms, 4 stable arms, one arm that fails at step 0 (before any
    row), and the FP32 trajectories (stable, grad_norm only)."""
    d = tmp_path_factory.mktemp("warn")
    fp32 = {"name": "fp32", "rows": {"grad_norm": lambda s: np.ones(len(s))}}
    F.write_signal_run(str(d / "a.h5"), [fp32] + [
        _diverging(f"d{i}", e, POS_LEVELS[i]) for i, e in enumerate(DIVERGE[:2])] + [
        _stable(f"s{k}", NEG_LEVELS[k], k) for k in range(2)], steps=STEPS, curvature_every=50)
    F.write_signal_run(str(d / "b.h5"), [fp32] + [
        _diverging(f"d{i}", e, POS_LEVELS[i]) for i, e in enumerate(DIVERGE) if i >= 2] + [
        _stable(f"s{k}", NEG_LEVELS[k], k) for k in range(2, 4)] + [
        {"name": "dead", "nonfinite": 0, "rows": {"grad_norm": lambda s: np.ones(len(s))}}],
        steps=STEPS, curvature_every=50)
    return str(d)


@pytest.fixture(scope="module")
def results(warn_dir):
    cases, notes = W.collect(W.S.find_runs([warn_dir]))
    found, more = W.analyze(cases)
    return cases, {r.signal.name: r for r in found}, notes + more


def test_cases_events_and_exclusions(results):
    cases, _, notes = results
    assert len(cases) == 9  # fp32 left out by default
    assert sorted(c.event for c in cases if c.event is not None) == [0] + list(DIVERGE)
    dead = next(c for c in cases if c.group == "dead")
    assert dead.event == 0 and dead.window("grad_norm") is None
    note = W.excluded_note(cases)
    assert note.startswith("1 diverging trajectory without any signal value") and "dead@0" in note
    assert any(n.startswith("eq10_lhs: in no trajectory") for n in notes)
    assert any(n.startswith("cross_ratio_sq_avg: in no trajectory") for n in notes)


def test_perfect_signal_auc_1_and_lead_k(results):
    _, r, _ = results
    a = r["gamma_lastbin"]
    assert a.chosen == W.ABOVE and a.curve.auc == 1.0 and not a.against_expectation
    c = a.curve
    assert (c.n_pos, c.n_neg, c.nodata_pos, c.nodata_neg) == (4, 4, 1, 0)
    i = a.best
    assert c.thresholds[i] == pytest.approx(0.9)
    assert (c.tp[i], c.fp[i]) == (4, 0)
    assert c.leads[i] == [LEAD_A] * 4 and c.median_lead(i) == LEAD_A
    # the stable peaks (0.1 .. 0.25) set the other thresholds: each adds false alarms, no hits
    np.testing.assert_allclose(c.thresholds, [0.9, 0.25, 0.2, 0.15, 0.1])
    assert list(c.tp) == [4, 4, 4, 4, 4] and list(c.fp) == [0, 1, 2, 3, 4]


def test_useless_signal_auc_half(results):
    _, r, _ = results
    g = r["grad_norm"]
    for direction in (W.ABOVE, W.BELOW):
        curve = g.curves[direction]
        assert curve.auc == 0.5 and len(curve.thresholds) == 1
        assert (curve.tp[0], curve.fp[0]) == (4, 4)
    assert g.chosen == W.ABOVE  # ties keep the expected direction


def test_interleaved_levels_pick_the_better_direction(results):
    _, r, _ = results
    b = r["bias_ratio_avg"]
    assert b.curves[W.ABOVE].auc == pytest.approx(6 / 16)
    assert b.curves[W.BELOW].auc == pytest.approx(10 / 16)
    assert b.chosen == W.BELOW and b.against_expectation
    assert W.mann_whitney_auc(POS_LEVELS, NEG_LEVELS) == pytest.approx(6 / 16)
    c = b.curve
    np.testing.assert_allclose(c.thresholds, sorted(POS_LEVELS + NEG_LEVELS))  # strictest first
    # Youden J = 1/4 at 1, 3, 5, 7 (1/4 - 0, 2/4 - 1/4, ...) and 0 at 2, 4, 6, 8; a constant
    # alarms at the first row (lead = event step), so the median lead breaks the tie: 500 at
    # 1, 550 at 3, 600 at 5, 650 at 7
    assert [c.median_lead(i) for i in (0, 2, 4, 6)] == [500, 550, 600, 650]
    assert c.thresholds[b.best] == 7.0 and sorted(c.leads[b.best]) == list(DIVERGE)


def test_cosine_rise_is_found_in_either_direction(results):
    _, r, _ = results
    cos = r["cosine"]
    assert cos.signal.expected == W.EITHER and cos.chosen == W.ABOVE and not cos.against_expectation
    assert cos.curve.auc == 1.0 and cos.curve.leads[cos.best] == [LEAD_COS] * 4
    # below: the diverging minimum 0.2 ties with one stable run and is below the other three
    assert cos.curves[W.BELOW].auc == pytest.approx(3 / 4 + 1 / 8)


def test_curvature_signal_on_its_own_axis(results):
    _, r, _ = results
    p = r["precond_ratio"]
    assert p.curve.auc == 1.0 and p.curve.thresholds[p.best] == pytest.approx(1.5)
    assert p.curve.leads[p.best] == [LEAD_CURV] * 4


def test_max_fpr_criterion(results):
    cases, _, _ = results
    found, _ = W.analyze(cases, ["bias_ratio_avg"], max_fpr=0.5)
    b = found[0]
    c = b.curve  # below: the largest TPR with FPR <= 1/2 is 3/4 at threshold 5
    assert c.thresholds[b.best] == 5.0 and (c.tp[b.best], c.fp[b.best]) == (3, 2)
    found, _ = W.analyze(cases, ["gamma_lastbin"], max_fpr=0.0)
    assert found[0].curve.thresholds[found[0].best] == pytest.approx(0.9)


def test_auc_equals_mann_whitney_with_ties():
    rng = np.random.default_rng(3)
    cases = []
    for i in range(30):
        event = 500 if i % 3 == 0 else None
        values = np.round(rng.normal(size=60) + (0.5 if event else 0.0), 1)  # ties on purpose
        cases.append(W.Case("f", "r", f"g{i}", "trajectory", event,
                            {"grad_norm": (np.arange(60) * 10, values)}))
    for direction, pick in ((W.ABOVE, np.max), (W.BELOW, np.min)):
        curve = W.evaluate(cases, "grad_norm", direction)
        scores = [pick(c.window("grad_norm")[1]) for c in cases]
        pos = [s for s, c in zip(scores, cases) if c.event is not None]
        neg = [s for s, c in zip(scores, cases) if c.event is None]
        expected = W.mann_whitney_auc(pos, neg) if direction == W.ABOVE else \
            W.mann_whitney_auc(neg, pos)
        assert curve.auc == pytest.approx(expected, abs=1e-12)


def test_branch_sees_its_arms_prefix(tmp_path):
    """The arm crosses at step 300; a branch forks at 400 and diverges at 600: its monitor saw
    the arm's rows first, so its lead is 600 - 300. The arm itself never diverges."""
    cross = lambda s: np.where(s >= 300, 0.9, 0.1)  # noqa: E731
    path = F.write_signal_run(str(tmp_path / "br.h5"), [
        {"name": "mx", "rows": {"gamma_lastbin": lambda s: _layers(cross(s))}},
        {"name": "late", "kind": "branch", "at": 400, "from": "mx", "divergence": 600,
         "rows": {"gamma_lastbin": lambda s: _layers(np.full(len(s), 0.2))}}], steps=1000)
    cases, _ = W.collect([path])
    late = next(c for c in cases if c.group == "late")
    steps, values = late.series["gamma_lastbin"]
    assert steps[0] == 0 and steps[-1] == 990 and values[30] == 0.9 and values[40] == 0.2
    curve = W.evaluate(cases, "gamma_lastbin", W.ABOVE)
    assert curve.leads[0] == [300]
    assert curve.fp[0] == 1 and curve.auc == 0.5  # the stable arm peaks at 0.9 too
    cases, _ = W.collect([path], branches=False)
    assert [c.group for c in cases] == ["mx"]


def test_csv_one_row_per_signal_direction_threshold(results, warn_dir, tmp_path, capsys):
    out, table = tmp_path / "warn.png", tmp_path / "warn.csv"
    assert main(["warn", warn_dir, "-o", str(out), "--csv", str(table)]) == 0
    assert _is_png(out)
    text = capsys.readouterr().out
    assert text.splitlines()[0].split()[:2] == ["signal", "dir"]
    assert re.search(r"^bias_ratio_avg +below\* ", text, re.M)
    assert "note: eq10_lhs: in no trajectory" in text
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    assert tuple(rows[0].keys()) == W.CSV_COLUMNS
    _, r, _ = results
    expected = sum(len(c.thresholds) for res in r.values() for c in res.curves.values())
    assert len(rows) == expected
    best = [row for row in rows if row["best"] == "1"]
    assert sorted(row["signal"] for row in best) == sorted(r)  # one per evaluated signal
    a = next(row for row in best if row["signal"] == "gamma_lastbin")
    assert (a["direction"], float(a["threshold"]), a["tp"], a["fp"], float(a["median_lead"]),
            float(a["auc"])) == ("above", 0.9, "4", "0", 50.0, 1.0)
    assert {row["chosen"] for row in rows if row["signal"] == "bias_ratio_avg" and
            row["direction"] == "below"} == {"1"}


def test_fp32_flag_and_signal_selection(warn_dir, capsys):
    cases, _ = W.collect(W.S.find_runs([warn_dir]), fp32=True)
    assert len(cases) == 11
    found, _ = W.analyze(cases, ["grad_norm"])
    assert found[0].curve.n_neg == 6
    assert main(["warn", warn_dir, "--signals", "cosine,grad_norm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines[1:3]] == ["cosine", "grad_norm"]
    assert main(["warn", warn_dir, "--signals", "nope"]) == 2
    assert "unknown signal nope" in capsys.readouterr().err
    assert main(["warn", warn_dir, "--max-fpr", "2"]) == 2


def test_old_files_skip_the_new_signals(sweep_dir, capsys):
    """Files from before the clamp-debt and curvature datasets: those signals are skipped."""
    assert main(["warn", sweep_dir]) == 0
    text = capsys.readouterr().out
    for name in ("gamma_above_frac", "gamma_gap_mean", "precond_ratio", "eq10_lhs",
                 "cross_ratio_sq_avg"):
        assert f"note: {name}: in no trajectory" in text
    assert text.splitlines()[1].startswith("gamma_lastbin")


def test_every_signal_on_the_multi_arm_fixture(arms_run):
    cases, _ = W.collect([arms_run])
    found, notes = W.analyze(cases)
    assert [r.signal.name for r in found] == list(W.SIGNAL_NAMES) and not notes
    assert all(not math.isnan(r.curve.auc) for r in found)


def test_no_trajectories_is_an_error(warn_dir):
    with pytest.raises(AnalysisError, match="no trajectories"):
        W.collect(W.S.find_runs([warn_dir]), where=["steps=5"])
