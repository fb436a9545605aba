"""Figures say what ran: one FP32 line per FP32 trajectory (each seed its own, a divergence
included), and an arm or branch made of `set:` items only (which the trainer stores as
`apply: none`) is titled by those items, with the formats it really ran in the title and the
headers, not those of the base `precision`."""

import numpy as np

import make_fixtures as F
from mxlab import common as C
from mxlab import curves, grid, interventions, panel
from mxlab import schema as S

FP6 = {"weight": "mxfp6_e3m2", "activation": "mxfp6_e3m2", "grad": "mxfp6_e3m2"}
FP6_TEXT = "mxfp6_e3m2 (W/A/G)"
BASE_TEXT = "mxfp8_e4m3 (W/A/G)"  # the base `precision` of these runs
LRS = (2e-4, 6e-4)
SEEDS = (1, 2)
FP32_DIVERGES = (6e-4, 2)  # (lr, seed) whose FP32 trajectory diverges, at step 120


def _curves_in(ax):
    return [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]


def _markers(ax):
    """Divergence markers drawn on a curve (not the legend's empty sample)."""
    return [ln for ln in ax.get_lines() if ln.get_marker() == "x" and len(ln.get_xdata()) == 1]


def test_curves_one_fp32_line_per_seed(tmp_path):
    """2 learning rates x 2 seeds x 2 MX formats, one model size: each row draws the two seeds'
    FP32 trajectories (the two formats of a seed share one) as their median and band, made of
    those two trajectories, and the diverging one shows."""
    for lr in LRS:
        for seed in SEEDS:
            for weight in ("mxfp8_e4m3", "mxfp6_e3m2"):
                F.write_run(str(tmp_path / f"lr{lr}_s{seed}_{weight}.h5"), steps=200, seed=seed,
                            width=256, depth=2, lr=lr, weight=weight,
                            fp32_diverge_at=120 if (lr, seed) == FP32_DIVERGES else None)
    fig = curves.build(S.find_runs([str(tmp_path)]), row="optimizer.lr")
    axes = np.array(fig.axes[:2 * 3]).reshape(2, 3)  # rows: lr; columns: FP32, two formats
    assert axes[0, 0].get_title() == "FP32"
    runs = [S.load_run(p) for p in S.find_runs([str(tmp_path)])]
    for i, lr in enumerate(LRS):
        fp32 = _curves_in(axes[i, 0])
        assert len(fp32) == 1 and len(axes[i, 0].collections) == 1, (lr, len(fp32))  # median, band
        # the median of the two seeds' FP32 trajectories (one run of each seed: the other
        # format's run has the same FP32 trajectory), not of one seed twice
        one_per_seed = {r.config["seed"]: r for r in runs if r.config["optimizer.lr"] == lr}
        assert len(one_per_seed) == len(SEEDS)
        _, median, _, _ = curves.seed_band([(r.fp32.step, r.fp32.loss) for r in one_per_seed.values()])
        np.testing.assert_allclose(fp32[0].get_ydata(), median)
        a, b = (r.fp32.loss for r in one_per_seed.values())
        assert not np.allclose(a, b)  # two seeds
        assert len(_markers(axes[i, 0])) == (1 if lr == FP32_DIVERGES[0] else 0), lr
        for j in (1, 2):  # an MX column: the seeds of its format, as their median and band
            assert len(_curves_in(axes[i, j])) == 1 and len(axes[i, j].collections) == 1


def test_curves_fp32_identity_ignores_only_the_mx_recipe(lr_format_sweep, tmp_path):
    """Runs that differ in the MX recipe alone share an FP32 trajectory; any other key (the
    seed, a model setting) makes it another one."""
    runs = [S.load_run(p) for p in S.find_runs([lr_format_sweep])]
    same = [r for r in runs if r.config["optimizer.lr"] == 2e-4 and r.config["model.width"] == 256]
    assert len(same) == 2 and same[0].config["precision.weight"] != same[1].config["precision.weight"]
    assert curves.fp32_identity(same[0]) == curves.fp32_identity(same[1])
    other = S.load_run(F.write_run(str(tmp_path / "other_seed.h5"), steps=200, seed=8,
                                   width=256, depth=2, lr=2e-4))
    assert curves.fp32_identity(other) != curves.fp32_identity(same[0])


def _set_only_run(path, seed=4, **kw):
    return F.write_run(str(path), steps=200, seed=seed, width=256, depth=2,
                       arms=[{"name": "fp6", "set": FP6}, {"name": "fp8", "diverge_at": 150},
                             {"name": "bf16a", "apply": "bf16_activations",
                              "set": {"scale_rule": "rceil"}}],
                       branches=[{"name": "act_bf16", "at": 100, "from": "fp6", "apply": "none",
                                  "set": {"activation": "bf16"}}], **kw)


def test_config_patch_reads_apply_none_as_no_preset(tmp_path):
    run = S.load_run(_set_only_run(tmp_path / "r.h5"))
    assert "apply: none" in run.config_text  # what the trainer stores for a set-only arm
    assert C.config_patch(run, "arms", "fp6") == "W/A/G=mxfp6_e3m2"
    assert C.config_patch(run, "arms", "fp8") == ""
    assert C.config_patch(run, "arms", "bf16a") == "bf16_activations, scale_rule=rceil"
    assert C.config_patch(run, "interventions", "act_bf16") == "activation=bf16"
    assert C.config_patch(run, "arms", "nope") is None
    labels = [C.arm_label(run, run.trajectories[a]) for a in run.arms]
    assert labels == ["arm fp6 (W/A/G=mxfp6_e3m2)", "arm fp8",
                      "arm bf16a (bf16_activations, scale_rule=rceil)"]
    assert C.patch_text(run, run.branches["act_bf16"]) == "activation=bf16"


def test_titles_state_the_format_the_arm_ran(tmp_path):
    run = S.load_run(_set_only_run(tmp_path / "r.h5"))
    fp6, fp8 = run.arm("fp6"), run.arm("fp8")
    assert C.precision_text(run, fp6).startswith(FP6_TEXT)
    assert C.precision_text(run, fp8).startswith(BASE_TEXT)
    assert C.precision_text(run, run.arm("bf16a")).endswith("scale rule rceil")
    branch = run.branches["act_bf16"]
    assert C.precision_text(run, branch).startswith("W mxfp6_e3m2 / A bf16 / G mxfp6_e3m2")

    title = panel.build(run, arm="fp6")._suptitle.get_text()
    assert FP6_TEXT in title and BASE_TEXT not in title and "(none)" not in title
    assert "MX panels: arm fp6 (W/A/G=mxfp6_e3m2)" in title
    assert BASE_TEXT in panel.build(run, arm="fp8")._suptitle.get_text()

    fig = interventions.build(run)  # one row: the branches fork from fp6
    assert FP6_TEXT in fig._suptitle.get_text() and BASE_TEXT not in fig._suptitle.get_text()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("act_bf16 (activation=bf16): ") for t in legend), legend
    assert not any("(none)" in t for t in legend)


def test_curves_columns_and_header_of_set_only_arms(tmp_path):
    for seed in (4, 5):
        _set_only_run(tmp_path / f"r{seed}.h5", seed=seed)
    fig = curves.build(S.find_runs([str(tmp_path)]), row="optimizer.lr")
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes[1:4]]
    header = fig._suptitle.get_text()
    assert BASE_TEXT not in header.split("all MX runs:")[1]  # fp6 did not run in mxfp8
    fp6 = next(t for t in titles if "arm fp6" in t)
    assert FP6_TEXT in fp6 and "(none)" not in fp6, titles
    assert BASE_TEXT in next(t for t in titles if "arm fp8" in t)
    assert "scale rule rceil" in next(t for t in titles if "arm bf16a" in t)
    # two seeds of one configuration: one FP32 line, their median, and their band
    assert len(_curves_in(fig.axes[0])) == 1 and len(fig.axes[0].collections) == 1


def test_grid_titles_and_pooled_patches(tmp_path):
    _set_only_run(tmp_path / "a.h5")
    fig = grid.build([str(tmp_path / "a.h5")], "model.width", "model.depth", "final_loss")
    assert [ax.get_title() for ax in fig.axes[:4]] == [
        "FP32", "arm fp6 (W/A/G=mxfp6_e3m2)", "arm fp8", "arm bf16a (bf16_activations, scale_rule=rceil)"]
    # another run whose arm fp6 is another recipe: one panel, which says it pools both
    F.write_run(str(tmp_path / "b.h5"), steps=200, seed=4, width=512, depth=2,
                arms=[{"name": "fp6", "set": {"weight": "mxfp6_e2m3"}}])
    data = grid.collect(S.find_runs([str(tmp_path)]), "model.width", "model.depth", "final_loss")
    assert data.titles["fp6"] == "arm fp6 (patch differs between runs)"
    assert any("arm fp6 is patched differently" in n and "weight=mxfp6_e2m3" in n for n in data.notes)


def test_an_arm_named_mx_with_a_patch_is_not_the_plain_mx(tmp_path):
    run = S.load_run(F.write_run(str(tmp_path / "m.h5"), steps=100, seed=1,
                                 arms=[{"name": "mx", "set": FP6}]))
    assert not C.single_mx(run)
    assert C.arm_label(run, run.mx) == "arm mx (W/A/G=mxfp6_e3m2)"
    assert FP6_TEXT in panel.build(run)._suptitle.get_text()


def test_a_real_run_with_a_set_only_arm(mxlab_run):
    """The trainer's own file (MXLAB_BINARY): arm fp6 is `set:` items only."""
    run = S.load_run(mxlab_run)
    assert "apply: none" in run.config_text
    fp6 = run.arm("fp6")
    assert C.arm_label(run, fp6) == "arm fp6 (W/A/G=mxfp6_e3m2)"
    title = panel.build(run, arm="fp6")._suptitle.get_text()
    assert FP6_TEXT in title and BASE_TEXT not in title
    assert BASE_TEXT in C.precision_text(run, run.arm("fp8"))
    assert C.precision_text(run, run.branches["act_bf16"]).startswith("W mxfp6_e3m2 / A bf16 / G mxfp6_e3m2")
    fig = curves.build([mxlab_run])
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes[1:3]]
    assert any(FP6_TEXT in t and "arm fp6 (W/A/G=mxfp6_e3m2)" in t for t in titles), titles
    assert BASE_TEXT not in fig._suptitle.get_text()
