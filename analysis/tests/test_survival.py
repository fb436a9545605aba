"""survival: the Kaplan-Meier estimator, Greenwood bands and the log-rank test against
hand-computed and textbook values, then the command on run files."""

import csv
import io
import math
from fractions import Fraction

import numpy as np
import pytest

import make_fixtures as F
from mxlab import AnalysisError
from mxlab import schema as S
from mxlab import survival as V
from mxlab.__main__ import main
from test_figures import _is_png

# Freireich et al. (1963) leukaemia remission data, the textbook example (Klein & Moeschberger
# 1.2; Kleinbaum & Klein ch. 2): 6-MP arm with censoring, placebo arm all events.
MP6_TIME = [6, 6, 6, 6, 7, 9, 10, 10, 11, 13, 16, 17, 19, 20, 22, 23, 25, 32, 32, 34, 35]
MP6_EVENT = [1, 1, 1, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]
PLACEBO_TIME = [1, 1, 2, 2, 3, 4, 4, 5, 5, 8, 8, 8, 8, 11, 11, 12, 12, 15, 17, 22, 23]


def test_km_and_greenwood_match_the_textbook():
    km = V.kaplan_meier(MP6_TIME, MP6_EVENT, band="plain")
    assert list(km.times) == [6, 7, 10, 13, 16, 22, 23]
    assert list(km.at_risk) == [21, 17, 15, 12, 11, 7, 6]
    assert list(km.events) == [3, 1, 1, 1, 1, 1, 1]
    np.testing.assert_allclose(km.survival, [0.857, 0.807, 0.753, 0.690, 0.627, 0.538, 0.448],
                               atol=5e-4)
    # the published Greenwood standard errors; plain band = S +- 1.96 se (upper clipped at 1)
    se = [0.0764, 0.0869, 0.0963, 0.1068, 0.1141, 0.1282, 0.1346]
    np.testing.assert_allclose((km.survival - km.lower) / V.Z95, se, atol=5e-5)
    assert km.upper[0] == 1.0
    assert km.median == 23 and (km.n, km.n_events) == (21, 9)
    # log-log band at step 6, as survfit(conf.type = "log-log") prints it: 0.620 .. 0.952
    loglog = V.kaplan_meier(MP6_TIME, MP6_EVENT)
    assert (round(loglog.lower[0], 3), round(loglog.upper[0], 3)) == (0.620, 0.952)


def test_logrank_matches_the_textbook():
    chi2, p = V.logrank((MP6_TIME, MP6_EVENT, [0] * 21), (PLACEBO_TIME, [1] * 21, [0] * 21))
    assert chi2 == pytest.approx(16.79, abs=0.005)  # survdiff: Chisq= 16.8 on 1 df
    assert p == pytest.approx(4.17e-5, rel=1e-2)


# A small case worked by hand. A: events at 3, 5, 8; censored at 5 and 10. B: events at 4, 9;
# censored at 6.
A = ([3, 5, 5, 8, 10], [1, 1, 0, 1, 0], [0] * 5)
B = ([4, 6, 9], [1, 0, 1], [0] * 3)


def test_km_by_hand():
    km = V.kaplan_meier(A[0], A[1], band="plain")
    # at 3: 5 at risk, 1 event; at 5: 4 at risk (the censored 5 still counts); at 8: 2 at risk
    assert list(km.at_risk) == [5, 4, 2]
    np.testing.assert_allclose(km.survival, [4 / 5, 4 / 5 * 3 / 4, 4 / 5 * 3 / 4 * 1 / 2])
    greenwood = np.cumsum([1 / (5 * 4), 1 / (4 * 3), 1 / (2 * 1)])
    half = V.Z95 * km.survival * np.sqrt(greenwood)
    np.testing.assert_allclose(km.lower, np.maximum(km.survival - half, 0))
    np.testing.assert_allclose(km.upper, np.minimum(km.survival + half, 1))
    assert km.upper[0] == 1.0  # clipped
    np.testing.assert_array_equal(km.censored_times, [5, 10])
    assert km.at(2) == 1.0 and km.at(5) == pytest.approx(0.6) and km.at(100) == pytest.approx(0.3)
    # log-log at step 3 from its definition: exp(-exp(log(-log S) -+ z se)), se = sqrt(1/20)/|log S|
    loglog = V.kaplan_meier(A[0], A[1])
    theta, se = math.log(-math.log(0.8)), math.sqrt(1 / 20) / abs(math.log(0.8))
    assert loglog.lower[0] == pytest.approx(math.exp(-math.exp(theta + V.Z95 * se)))
    assert loglog.upper[0] == pytest.approx(math.exp(-math.exp(theta - V.Z95 * se)))
    # B ends at S = 0 (the last subject at risk fails): no band there
    kb = V.kaplan_meier(B[0], B[1])
    np.testing.assert_allclose(kb.survival, [2 / 3, 0.0])
    assert np.isfinite(kb.lower[0]) and np.isnan(kb.lower[1]) and np.isnan(kb.upper[1])
    assert kb.median == 9


def test_logrank_by_hand():
    # pooled event steps 3, 4, 5, 8, 9 with (n_A, n_B, d_A, d_B):
    # (5,3,1,0) (4,3,0,1) (4,2,1,0) (2,1,1,0) (1,1,0,1)
    table = [(5, 3, 1, 0), (4, 3, 0, 1), (4, 2, 1, 0), (2, 1, 1, 0), (1, 1, 0, 1)]
    o_minus_e = sum(Fraction(d1) - Fraction((d1 + d2) * n1, n1 + n2) for n1, n2, d1, d2 in table)
    var = sum(Fraction(n1 * n2 * (d1 + d2) * (n1 + n2 - d1 - d2), (n1 + n2) ** 2 * (n1 + n2 - 1))
              for n1, n2, d1, d2 in table)
    chi2, p = V.logrank(A, B)
    assert chi2 == pytest.approx(float(o_minus_e ** 2 / var), rel=1e-12)
    assert p == pytest.approx(math.erfc(math.sqrt(float(o_minus_e ** 2 / var) / 2)), rel=1e-12)
    assert V.logrank(B, A)[0] == pytest.approx(chi2)  # symmetric
    assert all(math.isnan(x) for x in V.logrank(([5], [0], [0]), ([7], [0], [0])))  # no events


def test_delayed_entry():
    """Branches enter the risk set at `at`: before that they were their arm."""
    time, event, entry = [10, 4, 8, 12], [0, 1, 1, 0], [0, 0, 5, 5]
    km = V.kaplan_meier(time, event, entry)
    assert list(km.at_risk) == [2, 3]  # at 4 the two late entrants are not at risk yet
    np.testing.assert_allclose(km.survival, [1 / 2, 1 / 2 * 2 / 3])
    # log-rank with entries: a group of late entrants is not compared before it enters
    late = ([9, 12], [1, 0], [8, 8])
    early = ([3, 20], [1, 0], [0, 0])
    # only step 9 has both at risk: n1 = 2, n2 = 1, d1 = 1 -> O-E = 1 - 2/3, V = 2*1*1*2/(9*2)
    chi2, _ = V.logrank(late, early)
    assert chi2 == pytest.approx((1 / 3) ** 2 / (2 / 9))


@pytest.fixture(scope="module")
def survival_dir(tmp_path_factory):
    """Two runs x arms a (diverges at 300 / 500) and b (stable, 1000 steps), a branch of a
    from 200 that stops at 700 without diverging, and the stable FP32 trajectories."""
    d = tmp_path_factory.mktemp("survival")
    for i, (div, lr) in enumerate(((300, 5e-4), (500, 6e-4))):
        F.write_signal_run(str(d / f"r{i}.h5"), [
            {"name": "fp32"}, {"name": "a", "divergence": div}, {"name": "b"},
            {"name": "br", "kind": "branch", "at": 200, "from": "a", "steps_run": 500}],
            steps=1000, seed=i)
        # the learning rate, as a config key to group by
        import h5py
        with h5py.File(d / f"r{i}.h5", "a") as f:
            f.attrs["config_yaml"] = f.attrs["config_yaml"].replace("lr: 0.0006", f"lr: {lr!r}")
    return str(d)


def test_subjects_from_run_files(survival_dir):
    groups, notes = V.collect(S.find_runs([survival_dir]), ["arm"])
    assert list(groups) == [("fp32",), ("a",), ("b",), ("br",)] and not notes
    a = groups[("a",)]
    assert [(s.entry, s.time, s.event) for s in a] == [(0, 300, True), (0, 500, True)]
    assert [(s.entry, s.time, s.event) for s in groups[("b",)]] == [(0, 1000, False)] * 2
    # the branch: enters at 200, censored at 200 + steps_run
    assert [(s.entry, s.time, s.event) for s in groups[("br",)]] == [(200, 700, False)] * 2
    groups, _ = V.collect(S.find_runs([survival_dir]), ["arm", "optimizer.lr"], fp32=False,
                          branches=False)
    assert list(groups) == [("a", 5e-4), ("a", 6e-4), ("b", 5e-4), ("b", 6e-4)]


def test_cli_figure_csv_and_text(survival_dir, tmp_path, capsys):
    out, table = tmp_path / "s.png", tmp_path / "s.csv"
    assert main(["survival", survival_dir, "--by", "arm", "-o", str(out), "--csv", str(table)]) == 0
    assert _is_png(out)
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].split() == ["#", "group", "n", "events", "censored", "median", "step"]
    assert lines[2].split() == ["2", "a", "2", "2", "0", "300"]  # first step with S <= 1/2
    assert lines[3].split()[-2:] == ["not", "reached"]
    chi2, p = V.logrank(([1000, 1000], [0, 0], [0, 0]), ([300, 500], [1, 1], [0, 0]))
    assert f"[1] fp32  vs  [2] a: p = {p:.3f} (chi2 {chi2:.3f})" in text
    assert "[1] fp32  vs  [3] b: p = n/a (no test" in text
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    assert tuple(rows[0]) == V.CSV_COLUMNS
    a = [r for r in rows if r["group"] == "a"]
    assert [(r["step"], r["at_risk"], r["events"], float(r["survival"])) for r in a] == \
        [("0", "2", "0", 1.0), ("300", "2", "1", 0.5), ("500", "1", "1", 0.0)]
    assert a[2]["lower"] == "" and a[2]["upper"] == ""


def test_figure_has_a_curve_per_group_and_the_p_table(survival_dir):
    keys = ["arm"]
    groups, notes = V.collect(S.find_runs([survival_dir]), keys)
    curves, tests = V.estimate(groups)
    fig = V.build(keys, curves, tests, notes)
    ax, ax_table = fig.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:4] == ["[1] fp32  (n=2, events=0)", "[2] a  (n=2, events=2)",
                          "[3] b  (n=2, events=0)", "[4] br  (n=2, events=0)"]
    cells = {(i, j): c.get_text().get_text() for (i, j), c in ax_table.tables[0].get_celld().items()}
    p = next(p for i, j, _, p in tests if (i, j) == (0, 1))
    assert cells[(1, 1)] == f"{p:.3f}" and cells[(2, 0)] == f"{p:.3f}"  # row [2], column [1]
    one = V.build(keys, {k: v for k, v in list(curves.items())[:1]}, [])
    assert len(one.axes) == 1  # one group: no table


def test_old_files_and_errors(sweep_dir, arms_run, tmp_path, capsys):
    assert main(["survival", sweep_dir, "--by", "model.depth", "--no-fp32",
                 "-o", str(tmp_path / "old.png")]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[:4] == ["2", "4", "2", "1"]
    groups, _ = V.collect(S.find_runs([sweep_dir]), ["arm", "model.depth"])
    assert [g for g in groups] == [("fp32", 2), ("fp32", 4), ("mx", 2), ("mx", 4)]
    assert sum(s.event for s in groups[("mx", 4)]) == 1  # the (512, 4) cell diverges
    groups, _ = V.collect([arms_run], ["arm"])
    assert [g[0] for g in groups] == ["fp32", "floor", "rne", "rceil", "to_fp32_floor", "skip_ln_rne"]
    with pytest.raises(AnalysisError, match="no key 'nope'"):
        V.collect([arms_run], ["nope"])
    with pytest.raises(AnalysisError, match="--by: give at least one key"):
        V.parse_keys(" , ")
    with pytest.raises(AnalysisError, match="--band"):
        V.kaplan_meier([1], [1], band="wide")
