"""`curves DIR --row KEY --color KEY...`: loss curves of a sweep as small multiples - the
layout of the paper's figures 2 and 6: one column for FP32 and one per MX recipe found in
the runs (a recipe: the run's precision and, in files with arms, the arm), one row per value
of `--row` (e.g. optimizer.lr or model.activation), one colour per value of the `--color`
keys (e.g. model size: model.depth and model.width).

Runs whose configurations differ only in their MX recipe (`precision`, `arms`,
`interventions`, `name`) train the same FP32 trajectory (same seed, same batches), so the FP32
column draws that trajectory once; runs that differ in anything else - the seed above all -
each get their own FP32 line.
"""

import numpy as np

from . import AnalysisError
from . import common as C
from . import metrics
from . import schema as S
from . import sweep
from . import yamlcfg

DIVERGENCE_MARKER = "x"
COLOR_CMAP = "plasma"


def _label(run, keys):
    short = {"model.depth": "L", "model.width": "d", "optimizer.lr": "lr", "data.batch": "B"}
    return " ".join(f"{short.get(k, k)}={yamlcfg.format_value(run.config.get(k))}" for k in keys)


def _arms(run):
    return [run.trajectories[a] for a in run.arms]


# Config keys that do not change the FP32 trajectory: the MX recipe and the run's name.
NOT_FP32_PREFIXES = ("precision.", "arms.", "interventions.")
NOT_FP32_KEYS = ("name", "precision", "arms", "interventions")


def fp32_identity(run):
    """What decides a run's FP32 trajectory: every config value but the MX recipe's. Two runs
    with the same identity (same seed, model, data, optimizer, steps, ...) share it."""
    return tuple(sorted((k, repr(v)) for k, v in run.config.items()
                        if k not in NOT_FP32_KEYS and not k.startswith(NOT_FP32_PREFIXES)))


def build(files, row=None, color=("model.depth", "model.width"), where=()):
    where = sweep.parse_where(where)
    runs, skipped = [], []
    for path, run, error in sweep.load_all(files):
        if run is None:
            skipped.append(path)  # the CLI's closing line says why
            continue
        for key in ([row] if row else []) + list(color):
            if key not in run.config:
                raise AnalysisError(f"{path}: config has no key '{key}'")
        if sweep.matches(run, where):
            runs.append(run)
    if not runs:
        raise AnalysisError("no run files left to plot" + (" after --where" if where else ""))

    # A column per MX recipe: the run's precision and, in files with arms, the arm (name and
    # patch). Files before arms have one arm, `mx`, whose recipe is the precision alone.
    parts_of = {}

    def recipe(run, traj):
        parts = C.precision_text(run, traj).split(", ")  # the arm's own policy
        if not C.single_mx(run):
            parts.append(C.arm_label(run, traj))  # may hold ", " itself: kept whole
        text = ", ".join(parts)
        parts_of[text] = parts
        return text

    recipes = sweep.sort_values({recipe(r, t) for r in runs for t in _arms(r)})
    rows = sweep.sort_values({r.config[row] for r in runs}) if row else [None]
    shades = sweep.sort_values({_label(r, color) for r in runs})
    from matplotlib import colormaps
    cmap = colormaps[COLOR_CMAP]
    colour_of = {s: cmap(0.85 * i / max(len(shades) - 1, 1)) for i, s in enumerate(shades)}

    # Column titles show only what differs between the recipes; the rest goes in the title.
    parts = [parts_of[r] for r in recipes]
    common = [p for p in parts[0] if all(p in q for q in parts)] if parts else []
    # A --row key that is itself part of the recipe (e.g. precision.scale_rule) gives one
    # recipe per row: then one MX column, the row label naming the recipe.
    per_row = {}
    for r in runs:
        per_row.setdefault(r.config[row] if row else None, set()).update(
            recipe(r, t) for t in _arms(r))
    one_mx_column = len(recipes) > 1 and all(len(v) == 1 for v in per_row.values())
    titles = [""] if one_mx_column else [", ".join(p for p in q if p not in common) for q in parts]
    ncols = 1 + len(titles)
    fig = C.new_figure(3.6 * ncols + 1.0, 2.6 * len(rows) + 1.2)
    axes = fig.subplots(len(rows), ncols, sharex=True, sharey=True, squeeze=False)
    seen_fp32 = set()  # (row, FP32 identity): each FP32 trajectory drawn once
    for run in runs:
        i = rows.index(run.config[row]) if row else 0
        shade = _label(run, color)
        key = (i, fp32_identity(run))
        targets = [(0, run.fp32)] if key not in seen_fp32 else []
        seen_fp32.add(key)
        for traj in _arms(run):
            targets.append((1 if one_mx_column else 1 + recipes.index(recipe(run, traj)), traj))
        for j, traj in targets:
            if traj is None:
                continue
            ax = axes[i, j]
            x, y = C.finite(traj.step, traj.loss)  # logged rows: readable when overlaid
            ax.plot(x, y, color=colour_of[shade], linewidth=0.7, alpha=0.9)
            div = int(metrics.summarize(traj, run.config)[S.SUM_DIVERGENCE])
            if div != S.NO_STEP:
                near = np.searchsorted(x, div)
                if near < len(x):
                    ax.plot([x[near]], [y[near]], marker=DIVERGENCE_MARKER, color=colour_of[shade],
                            markersize=7, mew=1.8)
    for i, value in enumerate(rows):
        for j in range(ncols):
            ax = axes[i, j]
            ax.set_yscale("log")
            ax.grid(True, alpha=0.25)
            if i == 0:
                title = "FP32" if j == 0 else "MX" + (f": {titles[j - 1]}" if titles[j - 1] else "")
                ax.set_title(title, fontsize=9)
            if i == len(rows) - 1:
                ax.set_xlabel("step")
        ylabel = "loss" if value is None else f"{row} = {yamlcfg.format_value(value)}\nloss"
        axes[i, 0].set_ylabel(ylabel)
    handles = [axes[0, 0].plot([], [], color=colour_of[s], label=s)[0] for s in shades]
    handles.append(axes[0, 0].plot([], [], color="0.3", marker=DIVERGENCE_MARKER,
                                   linestyle="none", label="divergence step")[0])
    # On the first panel: figure-level legends are outside constrained layout on matplotlib 3.6.
    axes[0, 0].legend(handles=handles, loc="lower left", fontsize=7)
    fig.suptitle(f"training loss, {len(runs)} runs" + (f", rows: {row}" if row else "") +
                 f", colour: {', '.join(color)}" +
                 (f"\nall MX runs: {', '.join(common)}" if common else "") +
                 (f"\nleft out (unreadable): {', '.join(skipped)}" if skipped else ""), fontsize=10)
    return fig
