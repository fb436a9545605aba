"""Figures a paper can use: seeds drawn as their median with an interquartile band, legends
beside the data (never over it), and `--style paper` (small, paper fonts, a vector PDF)."""

import struct

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import make_fixtures as F
from conftest import STEPS, DIVERGE_AT
from mxlab import common, curves, panel
from mxlab import schema as S
from mxlab import survival as V
from mxlab.__main__ import main


def _png_size(path):
    """(width, height) in pixels from the PNG's IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_seed_band_is_the_median_and_quartiles_of_the_seeds():
    steps = np.array([0, 10, 20])
    traces = [(steps, np.full(3, 1.0)), (steps, np.full(3, 2.0)), (steps, np.full(3, 4.0))]
    x, med, lo, hi = curves.seed_band(traces)
    assert list(x) == [0, 10, 20]
    np.testing.assert_allclose(med, 2.0)                  # the middle seed, exactly
    np.testing.assert_allclose(lo, np.sqrt(2.0))          # quartiles of log(loss), interpolated
    np.testing.assert_allclose(hi, np.sqrt(8.0))
    # a seed whose loss turns NaN and stops there counts as +inf from then on: the median moves
    # to the larger of the finite ones, the upper quartile is off the axes
    stopped = (np.array([0, 10]), np.array([0.5, np.nan]))
    x, med, lo, hi = curves.seed_band([traces[0], traces[1], stopped])
    np.testing.assert_allclose(med, [1.0, 2.0, 2.0])
    assert np.isinf(hi[1]) and np.isinf(hi[2]) and np.isfinite(hi[0])
    # steps only some seeds logged: the quantiles of those that did
    x, med, _, _ = curves.seed_band([(np.array([0, 10]), np.array([1.0, 1.0])),
                                     (np.array([10, 20]), np.array([4.0, 4.0]))])
    assert list(x) == [0, 10, 20]
    np.testing.assert_allclose(med, [1.0, 2.0, 4.0])


@pytest.fixture(scope="module")
def seeds_dir(tmp_path_factory):
    """lr 2e-4 on seeds 0, 1, 2; lr 6e-4 on seeds 0, 1 (MX diverges at step 120 on seed 1);
    one lr 6e-4 run of another width, seed 0."""
    d = tmp_path_factory.mktemp("seeds")
    for lr, seeds in ((2e-4, (0, 1, 2)), (6e-4, (0, 1))):
        for seed in seeds:
            F.write_run(str(d / f"lr{lr:g}_s{seed}.h5"), steps=200, seed=seed, width=256, depth=2,
                        lr=lr, mx_diverge_at=120 if (lr, seed) == (6e-4, 1) else None)
    F.write_run(str(d / "wide.h5"), steps=200, seed=0, width=512, depth=2, lr=6e-4)
    return str(d)


def _bands(ax):
    return [c for c in ax.collections if type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")]


def test_curves_draw_each_configuration_as_the_median_of_its_seeds(seeds_dir):
    files = S.find_runs([seeds_dir])
    runs = {f: S.load_run(f) for f in files}
    fig = curves.build(files, row="optimizer.lr", color=["model.width"])
    (fp32_a, mx_a), (fp32_b, mx_b) = fig.axes[0:2], fig.axes[2:4]
    # rows: lr 2e-4 (3 seeds of one configuration), lr 6e-4 (2 seeds, plus the wider model)
    assert len(_bands(fp32_a)) == len(_bands(mx_a)) == 1
    assert len(_bands(fp32_b)) == len(_bands(mx_b)) == 1  # the wide run is one line, no band

    def lines(ax):
        return [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
    assert len(lines(fp32_a)) == 1 and len(lines(fp32_b)) == 2

    def band_of(lr, seeds, traj):
        chosen = [r for r in runs.values() if r.config["optimizer.lr"] == lr and
                  r.config["model.width"] == 256 and r.config["seed"] in seeds]
        assert len(chosen) == len(seeds)
        return curves.seed_band([(getattr(r, traj).step, getattr(r, traj).loss) for r in chosen])
    for ax, lr, seeds, traj in ((fp32_a, 2e-4, (0, 1, 2), "fp32"), (mx_a, 2e-4, (0, 1, 2), "mx"),
                                (fp32_b, 6e-4, (0, 1), "fp32"), (mx_b, 6e-4, (0, 1), "mx")):
        x, med, lo, hi = band_of(lr, seeds, traj)
        drawn = [ln for ln in lines(ax) if len(ln.get_xdata()) == len(x) and
                 np.allclose(ln.get_ydata(), med, equal_nan=True)]
        assert drawn, (lr, traj)  # the median of exactly these seeds, not of the wide run too
        (band,) = _bands(ax)
        ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
        finite = np.isfinite(lo) & np.isfinite(hi)
        assert np.isclose(ys.min(), min(lo[finite].min(), hi[finite].min()))
        assert np.isclose(ys.max(), max(lo[finite].max(), hi[finite].max()))
    # the diverging seed keeps its divergence marker, on its configuration's median
    assert len([ln for ln in mx_b.get_lines() if ln.get_marker() == "x"]) == 1
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert any("median" in t for t in legend)


def _assert_legends_off_the_data(fig):
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            if ax.get_lines() or ax.collections:
                assert not box.overlaps(ax.get_window_extent(renderer)), \
                    ([t.get_text() for t in legend.get_texts()][:2], ax.get_title(loc="left"))


def test_legends_are_beside_the_data(seeds_dir, runs_dir, tmp_path):
    _assert_legends_off_the_data(curves.build(S.find_runs([seeds_dir]), row="optimizer.lr"))
    diverging = F.write_run(str(tmp_path / "div.h5"), steps=STEPS, seed=2, mx_diverge_at=DIVERGE_AT)
    _assert_legends_off_the_data(panel.build(S.load_run(diverging)))
    keys = ["arm"]
    groups, _ = V.collect(S.find_runs([seeds_dir]), keys)
    fig = V.build(keys, *V.estimate(groups))
    _assert_legends_off_the_data(fig)


def test_style_paper_is_small_with_paper_fonts_and_a_vector_pdf(seeds_dir, tmp_path):
    default, paper = tmp_path / "d.png", tmp_path / "p.png"
    assert main(["curves", seeds_dir, "--row", "optimizer.lr", "-o", str(default)]) == 0
    assert main(["curves", seeds_dir, "--row", "optimizer.lr", "-o", str(paper),
                 "--style", "paper"]) == 0
    assert not (tmp_path / "d.pdf").exists()
    pdf = (tmp_path / "p.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"/Subtype /Image" not in pdf  # vector: no raster
    width, height = _png_size(paper)
    assert width <= common.PAPER_WIDTH * common.PAPER_DPI + 1
    assert _png_size(default)[0] / common.DPI > common.PAPER_WIDTH  # the default is larger
    # the style ends with the command: the next figure is a default one again
    assert common.style() == "default"
    import matplotlib
    assert matplotlib.rcParams["font.size"] != common.PAPER_FONT or \
        matplotlib.rcParamsDefault["font.size"] == common.PAPER_FONT
    # every text of a paper figure is at most PAPER_FONT points, and the title is left to the
    # caption
    with common.using_style("paper"):
        fig = curves.build(S.find_runs([seeds_dir]), row="optimizer.lr")
        common.save(fig, str(tmp_path / "q.png"))
    from matplotlib.text import Text
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text() and t.get_visible()]
    assert sizes and max(sizes) <= common.PAPER_FONT
    assert not fig._suptitle.get_visible()
    for command in (["panel", F.write_run(str(tmp_path / "s.h5"), steps=200, seed=1)],
                    ["survival", seeds_dir, "--by", "arm"]):
        out = tmp_path / f"{command[0]}.png"
        assert main(command + ["-o", str(out), "--style", "paper"]) == 0
        assert (tmp_path / f"{command[0]}.pdf").exists()
        assert _png_size(out)[0] <= common.PAPER_WIDTH * common.PAPER_DPI + 1
    with pytest.raises(SystemExit) as e:
        main(["curves", seeds_dir, "--style", "poster"])
    assert e.value.code == 2
