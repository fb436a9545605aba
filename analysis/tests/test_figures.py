"""Each command builds the figure a reader expects (axes, curves, labels) and writes a PNG."""

import os

import numpy as np
import pytest

from conftest import BRANCHES, EARLY, LATE
from mxlab import AnalysisError, common, grid, interventions, panel
from mxlab import schema as S
from mxlab.__main__ import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIN_PNG_BYTES = 10_000  # a blank figure of these sizes is far smaller than one with curves


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC and os.path.getsize(path) > MIN_PNG_BYTES


def _titles(fig):
    return [ax.get_title(loc="left") or ax.get_title() for ax in fig.axes]


def test_panel_has_the_five_panels_of_figures_3_and_5(diverging_run, tmp_path):
    run = S.load_run(diverging_run)
    fig = panel.build(run)
    assert len(fig.axes) == 5
    titles = _titles(fig)
    for tag in ("(a)", "(b)", "(c)", "(d)", "(e)"):
        assert any(t.startswith(tag) for t in titles), (tag, titles)
    ax_loss, ax_bias, ax_cos, ax_gamma, ax_act = fig.axes
    assert ax_loss.get_yscale() == "log"
    legend = [t.get_text() for t in ax_loss.get_legend().get_texts()]
    div = S.load_run(diverging_run).mx.attrs[S.SUM_DIVERGENCE]
    assert f"MX divergence step {div}" in legend
    # the divergence line is drawn on every panel
    for ax in fig.axes:
        assert any(np.allclose(line.get_xdata(), div) for line in ax.get_lines())
    # the alarm line at 2 and the running average in (b)
    assert any(np.allclose(line.get_ydata(), common.BIAS_RATIO_ALARM) for line in ax_bias.get_lines())
    assert "running average" in [t.get_text() for t in ax_bias.get_legend().get_texts()]
    # one gamma curve per layer (+ clamped), activations: per layer + mean for two tensors
    layers = run.mx.layers
    gamma_curves = [ln for ln in ax_gamma.get_lines() if len(ln.get_xdata()) == run.mx.n]
    assert len(gamma_curves) == 2 * layers
    act_curves = [ln for ln in ax_act.get_lines() if len(ln.get_xdata()) == run.mx.n]
    assert len(act_curves) == 2 * (layers + 1)
    assert "quantized" in ax_gamma.get_title(loc="left")
    assert run.run_id in fig._suptitle.get_text() and "lr=0.0006" in fig._suptitle.get_text()
    out = tmp_path / "panel.png"
    common.save(fig, str(out), pdf=True)
    assert _is_png(out) and (tmp_path / "panel.pdf").stat().st_size > 0


def test_panel_of_a_stable_run_has_no_divergence_line(stable_run):
    fig = panel.build(S.load_run(stable_run))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert not any("divergence" in t for t in legend)


def test_panel_marks_first_nonfinite_loss(nan_run):
    fig = panel.build(S.load_run(nan_run))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("first NaN/Inf loss at step 250" in t for t in legend), legend


def test_panel_of_killed_run_says_so(killed_ragged):
    fig = panel.build(S.load_run(killed_ragged))
    assert "unfinished" in fig._suptitle.get_text()


def test_interventions_one_subplot_per_at(branches_run, tmp_path):
    run = S.load_run(branches_run)
    fig = interventions.build(run)
    assert len(fig.axes) == 2
    for ax, at in zip(fig.axes, (EARLY, LATE)):
        assert str(at) in ax.get_title(loc="left")
        names = [b["name"] for b in BRANCHES if b["at"] == at]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert len(legend) == 2 + len(names)  # FP32, MX baseline, the branches at this step
        assert legend[0].startswith("FP32") and legend[1].startswith("MX baseline: diverges at")
        for name in names:
            entry = next(t for t in legend if t.startswith(name))
            summary = run.branches[name].attrs
            if summary[S.SUM_DIVERGENCE] == S.NO_STEP:
                assert entry.endswith("no divergence")
            else:
                assert entry.endswith(f"diverges at step {summary[S.SUM_DIVERGENCE]}")
        assert any(np.allclose(line.get_xdata(), at) for line in ax.get_lines())
        assert ax.get_yscale() == "log"
        assert ax.get_xlim()[0] > 0  # auto: starts a little before the intervention
    assert fig.axes[1].get_shared_y_axes().joined(fig.axes[0], fig.axes[1])
    full = interventions.build(run, xlim="full")
    assert full.axes[0].get_xlim()[0] <= 0
    common.save(fig, str(tmp_path / "iv.png"))
    assert _is_png(tmp_path / "iv.png")


def test_interventions_without_branches_is_an_error(stable_run):
    with pytest.raises(AnalysisError, match="no 'branches/' group"):
        interventions.build(S.load_run(stable_run))
    with pytest.raises(AnalysisError, match="--xlim"):
        interventions._parse_xlim("a:b")


def _cell_texts(ax):
    return sorted(t.get_text() for t in ax.texts)


def test_grid_two_heatmaps_and_colorbar(sweep_dir, tmp_path):
    files = S.find_runs([sweep_dir])
    fig = grid.build(files, "model.width", "model.depth", "divergence_step")
    assert len(fig.axes) == 3  # FP32, MX, colorbar
    fp32_ax, mx_ax = fig.axes[:2]
    assert fp32_ax.get_title() == "FP32" and mx_ax.get_title().startswith("MX")
    assert [t.get_text() for t in fp32_ax.get_xticklabels()] == ["256", "512"]
    assert [t.get_text() for t in fp32_ax.get_yticklabels()] == ["2", "4"]
    assert _cell_texts(fp32_ax) == ["stable"] * 4
    mx_texts = _cell_texts(mx_ax)
    assert mx_texts.count("stable") == 3 and len(mx_texts) == 4  # only (512, 4) diverges
    image = mx_ax.get_images()[0].get_array()
    assert np.ma.count_masked(image) == 3 and 120 <= image[1, 1] < 160  # [depth 4, width 512]

    spikes = grid.build(files, "model.width", "model.depth", "spike_count")
    assert _cell_texts(spikes.axes[0]) == ["0", "0", "1", "1"]  # the depth-4 runs spiked
    common.save(spikes, str(tmp_path / "grid.png"))
    assert _is_png(tmp_path / "grid.png")


def test_grid_marks_missing_cells(sweep_missing_dir):
    fig = grid.build(S.find_runs([sweep_missing_dir]), "model.width", "model.depth", "final_loss")
    for ax in fig.axes[:2]:
        assert _cell_texts(ax).count("no run") == 1
        assert len(ax.patches) == 1


def test_grid_where_and_errors(sweep_dir):
    files = S.find_runs([sweep_dir])
    fig = grid.build(files, "model.width", "model.depth", "final_loss", where=["model.depth=4"])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["4"]
    with pytest.raises(AnalysisError, match="no key 'model.nope'"):
        grid.build(files, "model.nope", "model.depth", "final_loss")
    with pytest.raises(AnalysisError, match="no run files left"):
        grid.build(files, "model.width", "model.depth", "final_loss", where=["model.depth=3"])


def test_grid_combines_runs_sharing_a_cell(sweep_dir, tmp_path):
    # Same four runs on axes that put them two per cell: the note says which key was merged.
    files = S.find_runs([sweep_dir])
    data = grid.collect(files, "model.width", "optimizer.lr", "spike_count")
    assert data.shared and any("model.depth" in n for n in data.notes)
    assert sorted(len(v) for v in data.cells["fp32"].values()) == [2, 2]


def test_cli_writes_png_and_pdf_and_reports_errors(branches_run, sweep_dir, tmp_path, capsys):
    out = tmp_path / "p.png"
    assert main(["panel", branches_run, "-o", str(out), "--pdf"]) == 0
    assert _is_png(out) and (tmp_path / "p.pdf").exists()
    assert main(["interventions", branches_run, "-o", str(tmp_path / "i.png")]) == 0
    assert main(["grid", sweep_dir, "--metric", "spike_count", "-o", str(tmp_path / "g.png")]) == 0
    assert _is_png(tmp_path / "i.png") and _is_png(tmp_path / "g.png")
    assert main(["panel", str(tmp_path / "missing.h5"), "-o", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_curves_fp32_plus_one_column_per_recipe(lr_format_sweep, tmp_path):
    from mxlab import curves
    fig = curves.build(S.find_runs([lr_format_sweep]), row="optimizer.lr")
    assert len(fig.axes) == 2 * 3  # rows: 2 learning rates; columns: FP32, mxfp6, mxfp8
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes[:3]]
    assert titles == ["FP32", "MX: W mxfp6_e3m2 / A mxfp8_e4m3 / G mxfp8_e4m3",
                      "MX: mxfp8_e4m3 (W/A/G)"]
    assert "optimizer.lr = 0.0002" in fig.axes[0].get_ylabel()

    def curves_in(ax):
        return [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
    # FP32: the two model sizes once each, although each appears in two runs (two formats)
    assert len(curves_in(fig.axes[0])) == 2 and len(curves_in(fig.axes[3])) == 2
    # lr 6e-4, depth 4 diverges in MX: one divergence marker per MX panel of that row
    for ax in fig.axes[4:6]:
        assert len([ln for ln in ax.get_lines() if ln.get_marker() == "x"]) == 1
    common.save(fig, str(tmp_path / "c.png"))
    assert _is_png(tmp_path / "c.png")


def test_curves_row_key_inside_the_recipe_gives_one_mx_column(lr_format_sweep):
    """--row on a precision key: each row holds one recipe, so one MX column, not a diagonal."""
    from mxlab import curves
    fig = curves.build(S.find_runs([lr_format_sweep]), row="precision.weight")
    assert len(fig.axes) == 2 * 2
    assert [ax.get_title().replace("\n", " ") for ax in fig.axes[:2]] == ["FP32", "MX"]
    assert "precision.weight = mxfp6_e3m2" in fig.axes[0].get_ylabel()
    for ax in (fig.axes[1], fig.axes[3]):  # every MX panel holds its row's 4 runs
        assert len([ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]) == 4
    # one recipe in all runs: the column is just "MX", the recipe goes in the title
    fig = curves.build(S.find_runs([lr_format_sweep]), row="optimizer.lr",
                       where=["precision.weight=mxfp8_e4m3"])
    assert [ax.get_title().replace("\n", " ") for ax in fig.axes[:2]] == ["FP32", "MX"]
    assert "mxfp8_e4m3 (W/A/G)" in fig._suptitle.get_text()


def test_panel_without_layernorm_gamma(tmp_path, stable_run):
    """Without LN affine there are no gamma datasets: panel (d) says so instead of failing."""
    import shutil
    import h5py
    path = tmp_path / "nogamma.h5"
    shutil.copy(stable_run, path)
    with h5py.File(path, "a") as f:
        for group in ("trajectories/fp32", "trajectories/mx"):
            for name in [n for n in f[group] if n.startswith("gamma_")]:
                del f[group][name]
    fig = panel.build(S.load_run(str(path)))
    assert any("no LayerNorm" in t.get_text() for t in fig.axes[3].texts)
