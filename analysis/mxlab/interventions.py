"""`interventions RUN.h5`: the baseline MX loss, the FP32 loss and every branch's loss,
one subplot per intervention step (the paper's figure 4: step 4500 and step 5080), and with
several arms one row of subplots per arm that branches fork from (attribute `from`).

Curves are the logged rows (`step`, `loss`): every branch logs on the same steps as the
baseline, so the overlays line up without guessing where a branch's loss_all starts.
"""

import numpy as np

from . import AnalysisError
from . import common as C
from . import metrics
from . import schema as S

DIVERGENCE_MARKER = "x"
AUTO_LEAD = 0.35  # --xlim auto: show this fraction of (end - at) before the intervention


def _fate(summary, traj):
    if traj.not_started:
        return "never started (its arm had stopped)"
    div = int(summary.get(S.SUM_DIVERGENCE, S.NO_STEP))
    bad = int(summary.get(S.SUM_FIRST_NONFINITE, S.NO_STEP))
    if div != S.NO_STEP:
        return f"diverges at step {div}"
    if bad != S.NO_STEP:
        return f"NaN/Inf at step {bad}"
    return "no divergence"


def _mark_divergence(ax, x, y, summary, color):
    """An x on the curve at its divergence step (the first logged row at or after it)."""
    div = int(summary.get(S.SUM_DIVERGENCE, S.NO_STEP))
    if div == S.NO_STEP:
        return
    i = int(np.searchsorted(x, div))
    if i < len(x):
        ax.plot([x[i]], [y[i]], marker=DIVERGENCE_MARKER, color=color, markersize=8, mew=2,
                linestyle="none")


def _parse_xlim(xlim):
    if xlim in (None, "auto", "full"):
        return xlim or "auto"
    try:
        lo, hi = (float(v) if v else None for v in xlim.split(":"))
    except ValueError:
        raise AnalysisError(f"--xlim {xlim}: expected auto, full or A:B (e.g. 4000:6000)") from None
    return (lo, hi)


def _panels(run, arms):
    """[(arm name, at)] in arm order, then intervention order: one subplot each."""
    branches = list(run.branches.values())
    forked = {b.arm for b in branches}
    order = [a for a in run.arms if a in forked] + sorted(forked - set(run.arms))
    order = C.select_arms(order, arms, f"branches from that arm in {run.path}")
    return [(arm, at) for arm in order for at in sorted({b.at for b in branches if b.arm == arm})]


def build(run, xlim="auto", arms=None):
    """One subplot per (arm, intervention step): FP32, the arm the branches fork from (the
    baseline) and those branches. `arms`: only branches from these arms."""
    if not run.branches:
        raise AnalysisError(f"{run.path}: no '{S.GROUP_BRANCHES}/' group - run an experiment with "
                            "`interventions:` to get branches")
    xlim = _parse_xlim(xlim)
    panels = _panels(run, arms)
    rows = list(dict.fromkeys(arm for arm, _ in panels))
    ncols = max(sum(1 for arm, _ in panels if arm == r) for r in rows)
    fig = C.new_figure(max(6.5 * ncols, 11), 5.6 * len(rows))  # 11: room for the title
    grid = fig.subplots(len(rows), ncols, sharey=True, squeeze=False)
    axes = []
    for i, row in enumerate(rows):
        used = [p for p in panels if p[0] == row]
        axes.extend(grid[i, :len(used)])
        for ax in grid[i, len(used):]:
            ax.remove()
    # The precision in the title: the arm the branches fork from when there is one row.
    fig.suptitle("interventions: " + C.run_title(run, run.trajectories.get(rows[0])
                                                  if len(rows) == 1 else None), fontsize=10)
    summaries = {(g.kind, g.name): metrics.summarize(g, run.config) for g in run.groups()}
    end = max((int(g.step[-1]) for g in run.groups() if g.n), default=0)
    log_every = C.cfg(run, "log.log_every")
    single = C.single_mx(run) and set(rows) == {S.TRAJ_MX}

    color_of = {name: C.BRANCH_COLORS[i % len(C.BRANCH_COLORS)]
                for i, name in enumerate(run.branches)}
    for ax, (arm, at) in zip(axes, panels):
        base = run.trajectories.get(arm)
        baseline = "MX baseline" if single else f"baseline arm {arm}"
        for traj, color, label, width in ((run.fp32, C.COLOR_FP32, "FP32", 1.0),
                                          (base, C.COLOR_MX, baseline, 1.2)):
            if traj is None:
                continue
            summary = summaries[(traj.kind, traj.name)]
            x, y = C.finite(traj.step, traj.loss)
            ax.plot(x, y, color=color, linewidth=width, label=f"{label}: {_fate(summary, traj)}")
            _mark_divergence(ax, x, y, summary, color)
        for name, branch in run.branches.items():
            if branch.at != at or branch.arm != arm:
                continue
            summary = summaries[(branch.kind, name)]
            x, y = C.finite(branch.step, branch.loss)
            apply = C.patch_text(run, branch)
            label = f"{name}" + (f" ({apply})" if apply and apply not in name else "")
            ax.plot(x, y, color=color_of[name], linewidth=1.1, label=f"{label}: {_fate(summary, branch)}")
            _mark_divergence(ax, x, y, summary, color_of[name])
        ax.axvline(at, color="0.2", linestyle="--", linewidth=1.0)
        ax.annotate(f"intervention\nat step {at}", xy=(at, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(-4, -4), textcoords="offset points", ha="right", va="top", fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        where = "" if single else (f"arm {arm}: " if base is not None
                                   else f"arm {arm} (not in this file): ")
        ax.set_title(f"{where}intervening at step {at}   (\u00d7 = divergence step)", loc="left")
        ax.grid(True, alpha=0.25)
        ax.legend(loc="upper left", fontsize=7.5, bbox_to_anchor=(0.0, -0.13), ncol=1,
                  frameon=False)
        if xlim == "auto":
            ax.set_xlim(max(0.0, at - AUTO_LEAD * max(end - at, 1)), end)
        elif isinstance(xlim, tuple):
            ax.set_xlim(*xlim)
    for i in range(len(rows)):
        grid[i, 0].set_ylabel(f"training loss (logged every {log_every} steps)")
    return fig
