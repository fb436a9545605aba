"""Multi-arm run files: the loader exposes every arm, and every command handles
them; files from before arms (exactly `fp32` and `mx`) read as they always did."""

import csv
import io

import numpy as np
import pytest

from conftest import ARM_BRANCHES, ARMS, CURVATURE_EVERY, STEPS
from mxlab import AnalysisError, common, curves, grid, interventions, metrics, panel
from mxlab import schema as S
from mxlab import summary
from mxlab.__main__ import main
from test_figures import _is_png

ARM_NAMES = [a["name"] for a in ARMS]


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_load_every_arm_in_config_order(arms_run):
    run = S.load_run(arms_run)
    assert run.arms == ARM_NAMES
    assert list(run.trajectories) == ["fp32"] + ARM_NAMES
    assert run.mx.name == "floor"  # no arm named mx: the first arm
    assert run.arm("rne").attrs[S.ATTR_PATCH] == "{set: {rounding: nearest_even}}"
    assert run.arm().name == "floor"
    with pytest.raises(AnalysisError, match="no arm 'nope'; arms: floor, rne, rceil"):
        run.arm("nope")
    with pytest.raises(AnalysisError, match="no arm 'fp32'"):
        run.arm("fp32")
    assert [g.name for g in run.groups()] == ["fp32"] + ARM_NAMES + [b["name"] for b in ARM_BRANCHES]
    assert [g.name for g in run.mx_groups()] == ARM_NAMES + [b["name"] for b in ARM_BRANCHES]
    for b in ARM_BRANCHES:
        branch = run.branches[b["name"]]
        assert branch.arm == b["from"] and run.parent(branch) is run.trajectories[b["from"]]
    assert run.fp32.arm is None and run.fp32.is_fp32 and run.arm("rne").arm == "rne"
    # the arms diverge as configured, each with its own summary attributes
    div = {a: metrics.summarize(run.trajectories[a], run.config)[S.SUM_DIVERGENCE] for a in ARM_NAMES}
    assert 300 <= div["floor"] < 340 and div["rne"] == S.NO_STEP and 340 <= div["rceil"] < 380


def test_new_datasets_and_curvature_axis(arms_run):
    run = S.load_run(arms_run)
    floor = run.arm("floor")
    L = floor.layers
    for name in S.DEBT_DATASETS:
        assert floor.get(name).shape == (floor.n, L), name
    for name in S.WEIGHT_DEBT_DATASETS:
        assert floor.get(name).shape == (floor.n, 2 * L)
        assert floor.dataset_attrs[name][S.DATASET_ATTR_NAMES][:2] == ["layer0.W1", "layer0.W2"]
    for name in S.MX_SERIES_V2:
        assert floor.get(name).shape == (floor.n,), name
    assert S.DS_CROSS_RATIO_SQ not in run.fp32.data
    # the curvature datasets have their own axis and do not cut the log rows
    assert floor.n == STEPS // 10 and floor.m == STEPS // CURVATURE_EVERY
    steps, values = floor.series(S.DS_EQ10_LHS)
    np.testing.assert_array_equal(steps, np.arange(0, STEPS, CURVATURE_EVERY))
    assert values.shape == (floor.m,)
    steps, _ = floor.series(S.DS_LOSS)
    assert steps.shape == (floor.n,)
    assert floor.series("nope") is None
    branch = run.branches["skip_ln_rne"]
    assert branch.series(S.DS_PRECOND_LMAX)[0][0] == 250


def test_old_file_reads_as_one_arm_named_mx(branches_run):
    run = S.load_run(branches_run)
    assert run.arms == ["mx"] and run.mx is run.trajectories["mx"] and common.single_mx(run)
    assert all(b.arm == "mx" and run.parent(b) is run.mx for b in run.branches.values())
    assert run.mx.m == 0 and run.mx.curvature == {}


def test_summary_one_row_per_arm_and_branch(arms_run):
    rows, columns = summary.collect([arms_run])
    assert columns[:4] == ("run_id", "group", "at", "from")
    assert [r["group"] for r in rows] == ["fp32"] + ARM_NAMES + [b["name"] for b in ARM_BRANCHES]
    assert [r["from"] for r in rows] == [None] * 4 + [b["from"] for b in ARM_BRANCHES]
    parsed = list(csv.DictReader(io.StringIO(summary.to_csv(rows, columns))))
    assert [r["from"] for r in parsed] == [""] * 4 + ["floor", "rne"]
    assert parsed[0][S.SUM_MAX_BIAS_RATIO] == "" and float(parsed[2][S.SUM_MAX_BIAS_RATIO]) > 0


def test_panel_of_each_arm(arms_run):
    run = S.load_run(arms_run)
    fig = panel.build(run)  # default: the first arm
    assert "MX panels: arm floor" in fig._suptitle.get_text()
    assert any(t.startswith("MX arm floor divergence step") for t in _legend(fig.axes[0]))
    fig = panel.build(run, arm="rne")
    title = fig._suptitle.get_text()
    assert "arm rne (rounding=nearest_even)" in title and "arms in this file: floor, rne, rceil" in title
    assert not any("MX arm" in t and "divergence" in t for t in _legend(fig.axes[0]))
    assert "arm rne (rounding=nearest_even)" in _legend(fig.axes[0])
    with pytest.raises(AnalysisError, match="no arm 'x'"):
        panel.build(run, arm="x")


def test_interventions_one_row_per_arm_with_its_baseline(arms_run):
    run = S.load_run(arms_run)
    fig = interventions.build(run)
    assert len(fig.axes) == 2
    for ax, b in zip(fig.axes, ARM_BRANCHES):
        assert ax.get_title(loc="left").startswith(f"arm {b['from']}: intervening at step {b['at']}")
        legend = _legend(ax)
        assert legend[0].startswith("FP32") and legend[1].startswith(f"baseline arm {b['from']}: ")
        assert len(legend) == 3 and legend[2].startswith(b["name"])
    assert _legend(fig.axes[0])[1].startswith("baseline arm floor: diverges at step")
    assert _legend(fig.axes[1])[2].endswith(
        f"diverges at step {run.branches['skip_ln_rne'].attrs[S.SUM_DIVERGENCE]}")
    only = interventions.build(run, arms=["rne"])
    assert len(only.axes) == 1 and "arm rne" in only.axes[0].get_title(loc="left")
    with pytest.raises(AnalysisError, match=r"--arm rceil: no branches from that arm in .*; there are: floor, rne"):
        interventions.build(run, arms=["rceil"])


def test_interventions_of_an_old_file_keep_their_titles(branches_run):
    fig = interventions.build(S.load_run(branches_run))
    assert all(ax.get_title(loc="left").startswith("intervening at step") for ax in fig.axes)


def test_grid_one_heatmap_per_arm(arms_sweep):
    files = S.find_runs([arms_sweep])
    fig = grid.build(files, "model.width", "model.depth", "divergence_step")
    assert len(fig.axes) == 1 + 3 + 1  # FP32, three arms, colourbar
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes[:4]]
    assert titles == ["FP32", "arm floor", "arm rne (rounding=nearest_even)",
                      "arm rceil (scale_rule=rceil)"]
    data = grid.collect(files, "model.width", "model.depth", "diverged")
    # every cell holds the two learning rates; the lr 6e-4 run diverges in floor and rceil only
    for arm, expected in (("fp32", 0.0), ("floor", 0.5), ("rne", 0.0), ("rceil", 0.5)):
        assert all(np.mean(v) == expected for v in data.cells[arm].values()), arm
    fig = grid.build(files, "model.width", "model.depth", "final_loss", arms=["rne"])
    assert [ax.get_title().replace("\n", " ") for ax in fig.axes[:2]] == ["FP32", "arm rne (rounding=nearest_even)"]
    assert len(fig.axes) == 3
    with pytest.raises(AnalysisError, match="--arm mx: no such arm"):
        grid.build(files, "model.width", "model.depth", "final_loss", arms=["mx"])


def test_curves_a_column_per_arm(arms_sweep):
    fig = curves.build(S.find_runs([arms_sweep]), row="optimizer.lr")
    assert len(fig.axes) == 2 * 4
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes[:4]]
    assert titles[0] == "FP32"
    # each column: what differs between the recipes, the arm's own scale rule included
    assert sorted(titles[1:]) == ["MX: scale rule floor, arm floor",
                                  "MX: scale rule floor, arm rne (rounding=nearest_even)",
                                  "MX: scale rule rceil, arm rceil (scale_rule=rceil)"]
    rne = 1 + titles[1:].index("MX: scale rule floor, arm rne (rounding=nearest_even)")
    floor = 1 + titles[1:].index("MX: scale rule floor, arm floor")

    def markers(ax):
        return len([ln for ln in ax.get_lines() if ln.get_marker() == "x"])
    # row lr 6e-4 (second row): both sizes diverge in floor, none in rne
    assert markers(fig.axes[4 + floor]) == 2 and markers(fig.axes[4 + rne]) == 0
    assert markers(fig.axes[floor]) == 0  # lr 2e-4 is stable


def test_cli_every_command_on_a_multi_arm_file(arms_run, arms_sweep, tmp_path, capsys):
    for argv in (["panel", arms_run, "--arm", "rceil"],
                 ["interventions", arms_run, "--arm", "floor"],
                 ["grid", arms_sweep, "--metric", "diverged", "--arm", "floor", "--arm", "rne"],
                 ["curves", arms_sweep, "--row", "optimizer.lr"]):
        out = tmp_path / f"{argv[0]}.png"
        assert main(argv + ["-o", str(out)]) == 0, argv
        assert _is_png(out)
    assert main(["summary", arms_run]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 6 and lines[0].split()[:4] == ["run_id", "group", "at", "from"]
    assert main(["panel", arms_run, "--arm", "x", "-o", str(tmp_path / "x.png")]) == 2
    assert "no arm 'x'; arms: floor, rne, rceil" in capsys.readouterr().err
