"""`curves DIR --row KEY --color KEY...`: loss curves of a sweep as small multiples - the
layout of the paper's figures 2 and 6: one column for FP32 and one per MX recipe found in
the runs (a recipe: the run's precision and, in files with arms, the arm), one row per value
of `--row` (e.g. optimizer.lr or model.activation), one colour per value of the `--color`
keys (e.g. model size: model.depth and model.width).

Runs whose configurations differ only in their MX recipe (`precision`, `arms`,
`interventions`, `name`) train the same FP32 trajectory (same seed, same batches), so the FP32
column draws that trajectory once; runs that differ in anything else each get their own FP32
line, except the seed: runs of one panel and colour that differ only in their seed are drawn
as one line, their median loss at each logged step, with the band between the 25th and 75th
percentiles of those seeds (seed_band).
"""

import textwrap
import warnings

import numpy as np

from . import AnalysisError
from . import common as C
from . import metrics
from . import schema as S
from . import sweep
from . import yamlcfg

DIVERGENCE_MARKER = "x"
COLOR_CMAP = "plasma"
TITLE_CHARS = 44  # a column title wraps at this width (3.6 in of 9 pt text)


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


def seed_identity(run):
    """fp32_identity without the seed: runs that share it differ only in their seed (and MX
    recipe), so their curves are seeds of one configuration."""
    return tuple(item for item in fp32_identity(run) if item[0] != "seed")


# log(loss) of a non-finite loss in seed_band: above any real one, so that a seed that has
# diverged pulls the quantiles up (exp of a quantile this large is +inf, drawn as off the axes).
_LOG_INF = 1e6


def seed_band(traces):
    """The median and interquartile band of several seeds' loss curves: `traces` is a list of
    (steps, loss) (the logged rows of each seed). Returns (steps, median, q25, q75) at every
    step some seed logged; at each step the quantiles are over the seeds that logged it, a
    non-finite loss counting as +inf, as does every step after a seed's last row when that row
    is non-finite (a trajectory stops at its first NaN/Inf). Quantiles are taken of log(loss)
    (linear interpolation), so an odd number of seeds gives the middle seed's loss exactly."""
    steps = np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s, _ in traces]))
    table = np.full((len(traces), steps.size), np.nan)
    for k, (s, loss) in enumerate(traces):
        s, loss = np.asarray(s, dtype=np.int64), np.asarray(loss, dtype=np.float64)
        logs = np.full(loss.shape, _LOG_INF)  # NaN and +inf: diverged
        positive = np.isfinite(loss) & (loss > 0)
        logs[positive] = np.log(loss[positive])
        logs[np.isfinite(loss) & (loss <= 0)] = -_LOG_INF
        table[k, np.searchsorted(steps, s)] = logs
        if s.size and not np.isfinite(loss[-1]):
            table[k, steps > s[-1]] = _LOG_INF
    with warnings.catch_warnings(), np.errstate(over="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # a step no seed logged cannot occur
        q25, med, q75 = np.exp(np.nanquantile(table, [0.25, 0.5, 0.75], axis=0))
    return steps, med, q25, q75


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
    lines = {}  # (row, column, colour, configuration but the seed) -> [(traj, run)], in order
    for run in runs:
        i = rows.index(run.config[row]) if row else 0
        shade = _label(run, color)
        key = (i, fp32_identity(run))
        targets = [(0, run.fp32)] if key not in seen_fp32 else []
        seen_fp32.add(key)
        for traj in _arms(run):
            targets.append((1 if one_mx_column else 1 + recipes.index(recipe(run, traj)), traj))
        for j, traj in targets:
            if traj is not None:
                lines.setdefault((i, j, shade, seed_identity(run)), []).append((traj, run))
    banded = False
    for (i, j, shade, _), members in lines.items():
        ax = axes[i, j]
        if len(members) == 1:
            x, y = C.finite(members[0][0].step, members[0][0].loss)  # logged rows
            ax.plot(x, y, color=colour_of[shade], linewidth=0.7, alpha=0.9)
        else:  # seeds of one configuration: their median, and the interquartile band
            x, y, lo, hi = seed_band([(t.step, t.loss) for t, _ in members])
            ax.fill_between(x, lo, hi, color=colour_of[shade], alpha=0.25, linewidth=0)
            ax.plot(x, y, color=colour_of[shade], linewidth=1.0)
            banded = True
        for traj, run in members:
            div = int(metrics.summarize(traj, run.config)[S.SUM_DIVERGENCE])
            near = np.searchsorted(x, div) if div != S.NO_STEP else len(x)
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
                ax.set_title(textwrap.fill(title, TITLE_CHARS), fontsize=9)  # no overlap
            if i == len(rows) - 1:
                ax.set_xlabel("step")
        ylabel = "loss" if value is None else f"{row} = {yamlcfg.format_value(value)}\nloss"
        axes[i, 0].set_ylabel(ylabel)
    handles = [axes[0, 0].plot([], [], color=colour_of[s], label=s)[0] for s in shades]
    handles.append(axes[0, 0].plot([], [], color="0.3", marker=DIVERGENCE_MARKER,
                                   linestyle="none", label="divergence step")[0])
    if banded:
        from matplotlib.patches import Patch
        handles.append(Patch(color="0.3", alpha=0.25, label="seeds: median,\n25-75 % band"))
    # Beside the first row's last panel, off the data (a figure-level legend is outside
    # constrained layout on matplotlib 3.6).
    C.legend_outside(axes[0, -1], handles=handles, fontsize=7)
    fig.suptitle(f"training loss, {len(runs)} runs" + (f", rows: {row}" if row else "") +
                 f", colour: {', '.join(color)}" +
                 (f"\nall MX runs: {', '.join(common)}" if common else "") +
                 (f"\nleft out (unreadable): {', '.join(skipped)}" if skipped else ""), fontsize=10)
    return fig
