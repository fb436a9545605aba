"""`grid DIR --x KEY --y KEY --metric M`: a sweep as heatmaps, FP32 and each MX arm side by
side (the comparisons of the paper's figures 6 and 9: which depth x width cells go unstable
in MX but not in FP32). Runs sharing a cell (seeds, keys not on the axes) are combined;
`--arm NAME` keeps only some arms."""

import math
import sys
from dataclasses import dataclass

import numpy as np
from matplotlib.colors import LogNorm, Normalize

from . import AnalysisError
from . import common as C
from . import metrics
from . import schema as S
from . import sweep
from . import yamlcfg

# metric -> (label, colormap, default aggregation)
METRICS = {
    "final_loss": ("final loss (last finite)", "viridis", "mean"),
    "min_loss": ("minimum loss", "viridis", "mean"),
    "divergence_step": ("divergence step (white: stable)", "magma", "min"),
    "spike_count": ("loss spikes (loss_t > spike_factor \u00d7 loss_t\u22121)", "Reds", "mean"),
    "spike_score": ("spike score (mxnorm app. J)", "Reds", "mean"),
    "diverged": ("fraction of runs that diverged", "Reds", "mean"),
}
AGGREGATES = {"mean": np.mean, "median": np.median, "min": np.min, "max": np.max, "sum": np.sum}
LOG_NORM_RANGE = 20.0  # log colour scale for losses spanning more than this factor
MISSING_COLOR = "0.85"
CELL_INCHES = 1.6
SKIPPED = "left out "  # the note of a file that could not be read


@dataclass
class GridData:
    cells: dict        # "fp32" and each arm -> {(x value, y value): [metric of each run]}
    xs: list           # sorted axis values
    ys: list
    notes: list        # skipped files, keys combined within cells
    max_steps: int     # longest configured run (colour range of divergence_step)
    shared: bool       # some cell holds more than one run
    titles: dict       # panel name ("fp32", each arm) -> its title


def _value(summary, metric):
    if metric == "divergence_step":
        step = int(summary[S.SUM_DIVERGENCE])
        return math.nan if step == S.NO_STEP else float(step)
    if metric == "diverged":
        return 1.0 if metrics.diverged(summary) else 0.0
    return float(summary[metric])


def collect(files, xkey, ykey, metric, where=(), agg=None, arms=None):
    """The metric of every run, by trajectory (FP32, each arm) and cell (GridData). `arms`:
    only these arms (default: every arm found)."""
    if metric not in METRICS:
        raise AnalysisError(f"unknown metric {metric}; choose one of {', '.join(METRICS)}")
    where = sweep.parse_where(where)
    notes = []
    runs = []
    for path, run, error in sweep.load_all(files):
        if run is None:
            notes.append(f"{SKIPPED}{error}")
            continue
        for key in (xkey, ykey):
            if key not in run.config:
                raise AnalysisError(f"{path}: config has no key '{key}' (dotted, e.g. "
                                    "model.width, model.depth, optimizer.lr)")
        if sweep.matches(run, where):
            runs.append(run)
    if not runs:
        raise AnalysisError("no run files left to plot" + (" after --where" if where else ""))
    found = C.select_arms(list(dict.fromkeys(a for run in runs for a in run.arms)), arms,
                          "such arm in these runs")
    cells = {name: {} for name in [S.TRAJ_FP32] + found}
    titles = {S.TRAJ_FP32: "FP32"}
    labels = {}  # arm name -> the labels (name and patch) it has in the runs
    for run in runs:
        cell = (run.config[xkey], run.config[ykey])
        for name in cells:
            traj = run.trajectories.get(name)
            if traj is None:
                continue
            cells[name].setdefault(cell, []).append(_value(metrics.summarize(traj, run.config), metric))
            if name != S.TRAJ_FP32 and not C.single_mx(run):
                labels.setdefault(name, [])
                if C.arm_label(run, traj) not in labels[name]:
                    labels[name].append(C.arm_label(run, traj))
    for name, seen in labels.items():
        titles[name] = seen[0]
        if len(seen) > 1:  # one name, different recipes: the panel pools them, and says so
            titles[name] = f"arm {name} (patch differs between runs)"
            notes.append(f"arm {name} is patched differently in different runs "
                         f"({'; '.join(seen)}): pooled in one panel")
    others = [k for k in sweep.swept_keys(runs) if k not in (xkey, ykey)]
    shared = any(len(v) > 1 for by_cell in cells.values() for v in by_cell.values())
    if others and shared:
        notes.append(f"runs differing in {', '.join(others)} share cells "
                     f"({agg or METRICS[metric][2]} of each cell)")
    xs = sweep.sort_values({run.config[xkey] for run in runs})
    ys = sweep.sort_values({run.config[ykey] for run in runs})
    max_steps = max(int(run.config.get("steps", 0) or 0) for run in runs)
    mx_title = "MX"
    texts = {C.precision_text(run).split(", ")[0] for run in runs}
    if len(texts) == 1:
        mx_title += ": " + texts.pop()
    for name in cells:
        titles.setdefault(name, mx_title)  # the `mx` arm of files before arms
    return GridData(cells, xs, ys, notes, max_steps, shared, titles)


def _aggregate(values, metric, agg):
    if metric == "divergence_step":
        diverged = [v for v in values if not math.isnan(v)]
        return AGGREGATES[agg](diverged) if diverged else math.nan
    return float(AGGREGATES[agg](values))


def _label(value, metric, values):
    if metric == "divergence_step":
        k = sum(1 for v in values if not math.isnan(v))
        text = "stable" if math.isnan(value) else f"{value:.0f}"
        return text + (f"\n{k}/{len(values)} div." if len(values) > 1 else "")
    if metric in ("spike_count",) and float(value).is_integer():
        text = f"{value:.0f}"
    elif metric == "diverged":
        text = f"{value:.0%}"
    else:
        text = f"{value:.3g}"
    return text + (f"\n(n={len(values)})" if len(values) > 1 else "")


def build(files, xkey, ykey, metric, where=(), agg=None, arms=None):
    """FP32 and one heatmap per arm (`arms`: only these), on one colour scale."""
    data = collect(files, xkey, ykey, metric, where, agg, arms)
    cells, xs, ys, notes = data.cells, data.xs, data.ys, data.notes
    max_steps, shared = data.max_steps, data.shared
    agg = agg or METRICS[metric][2]
    label, cmap_name, _ = METRICS[metric]
    grids = {}
    for name, by_cell in cells.items():
        g = np.full((len(ys), len(xs)), np.nan)
        present = np.zeros_like(g, dtype=bool)
        for (xv, yv), values in by_cell.items():
            i, j = ys.index(yv), xs.index(xv)
            g[i, j] = _aggregate(values, metric, agg)
            present[i, j] = True
        grids[name] = (g, present)

    finite_vals = np.concatenate([g[np.isfinite(g)] for g, _ in grids.values()])
    vmin = float(finite_vals.min()) if finite_vals.size else 0.0
    vmax = float(finite_vals.max()) if finite_vals.size else 1.0
    if metric in ("spike_count", "spike_score", "diverged"):
        vmin = 0.0
        vmax = max(vmax, 1.0)
    if metric == "divergence_step":  # position within the run: dark = early
        vmin, vmax = 0.0, float(max(max_steps, vmax + 1))
    if metric in ("final_loss", "min_loss") and vmin > 0 and vmax / vmin > LOG_NORM_RANGE:
        norm = LogNorm(vmin=vmin, vmax=vmax)
    else:
        norm = Normalize(vmin=vmin, vmax=vmax if vmax > vmin else vmin + 1)

    fig = C.new_figure(2.2 + CELL_INCHES * len(cells) * len(xs), 1.9 + 0.75 * CELL_INCHES * len(ys))
    axes = fig.subplots(1, len(cells), sharey=True, squeeze=False)[0]
    from matplotlib import colormaps
    cmap = colormaps[cmap_name].with_extremes(bad="white")  # NaN cells: stable / no value
    image = None
    for ax, name in zip(axes, cells):
        g, present = grids[name]
        image = ax.imshow(np.ma.masked_invalid(g), cmap=cmap, norm=norm, origin="lower",
                          aspect="auto")
        for i in range(len(ys)):
            for j in range(len(xs)):
                if not present[i, j]:
                    ax.add_patch(_missing_patch(j, i))
                    ax.text(j, i, "no run", ha="center", va="center", fontsize=9, color="0.35")
                    continue
                value = g[i, j]
                values = cells[name][(xs[j], ys[i])]
                rgba = image.cmap(image.norm(value)) if np.isfinite(value) else (1, 1, 1, 1)
                dark = (0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2]) < 0.5
                ax.text(j, i, _label(value, metric, values), ha="center", va="center",
                        fontsize=9, color="white" if dark else "black")
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels([yamlcfg.format_value(v) for v in xs])
        ax.set_yticks(range(len(ys)))
        ax.set_yticklabels([yamlcfg.format_value(v) for v in ys])
        ax.set_xticks(np.arange(len(xs) + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(len(ys) + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="0.7", linewidth=0.8)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel(xkey)
        ax.set_title(data.titles[name], fontsize=11)
    axes[0].set_ylabel(ykey)
    cbar = fig.colorbar(image, ax=list(axes), shrink=0.9)
    cbar.set_label(label + (f" ({agg} per cell)" if shared and metric != "diverged" else ""))
    if metric in ("spike_count", "divergence_step"):
        from matplotlib.ticker import MaxNLocator
        cbar.locator = MaxNLocator(integer=True)
        cbar.update_ticks()
    title = f"{label}: {ykey} \u00d7 {xkey}"
    if where:
        title += "   [" + ", ".join(where) + "]"
    if notes:
        title += "\n" + "; ".join(notes)
        for n in notes:
            if not n.startswith(SKIPPED):  # an unreadable file: the CLI's closing line says so
                print(f"grid: {n}", file=sys.stderr)
    fig.suptitle(title, fontsize=10)
    return fig


def _missing_patch(j, i):
    from matplotlib.patches import Rectangle
    return Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=MISSING_COLOR, hatch="//",
                     edgecolor="0.6", linewidth=0)
