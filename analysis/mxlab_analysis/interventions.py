"""`interventions RUN.h5`: the baseline MX loss, the FP32 loss and every branch's loss,
one subplot per intervention step (the paper's figure 4: step 4500 and step 5080).

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


def _fate(summary):
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


def _apply_of(run, branch):
    """The preset or `set:` patch named in the config for this branch, for the legend."""
    for i in range(1000):
        name = run.config.get(f"interventions.{i}.name")
        if name is None:
            break
        if name == branch.name:
            apply = run.config.get(f"interventions.{i}.apply")
            if apply:
                return str(apply)
            sets = sorted((k.split(".", 3)[3], v) for k, v in run.config.items()
                          if k.startswith(f"interventions.{i}.set."))
            return ", ".join(f"{k}={v}" for k, v in sets) if sets else ""
    patch = str(branch.attrs.get(S.ATTR_PATCH, "")).strip().replace("\n", "; ")
    return patch[:40]


def _parse_xlim(xlim):
    if xlim in (None, "auto", "full"):
        return xlim or "auto"
    try:
        lo, hi = (float(v) if v else None for v in xlim.split(":"))
    except ValueError:
        raise AnalysisError(f"--xlim {xlim}: expected auto, full or A:B (e.g. 4000:6000)") from None
    return (lo, hi)


def build(run, xlim="auto"):
    if not run.branches:
        raise AnalysisError(f"{run.path}: no '{S.GROUP_BRANCHES}/' group - run an experiment with "
                            "`interventions:` to get branches")
    xlim = _parse_xlim(xlim)
    ats = sorted({b.at for b in run.branches.values()})
    fig = C.new_figure(max(6.5 * len(ats), 8), 5.6)
    axes = fig.subplots(1, len(ats), sharey=True, squeeze=False)[0]
    fig.suptitle("interventions: " + C.run_title(run), fontsize=10)
    summaries = {g.name: metrics.summarize(g, run.config) for g in run.groups()}
    end = max((int(g.step[-1]) for g in run.groups() if g.n), default=0)
    log_every = C.cfg(run, "log.log_every")

    color_of = {name: C.BRANCH_COLORS[i % len(C.BRANCH_COLORS)]
                for i, name in enumerate(run.branches)}
    for ax, at in zip(axes, ats):
        for traj, color, label, width in ((run.fp32, C.COLOR_FP32, "FP32", 1.0),
                                          (run.mx, C.COLOR_MX, "MX baseline", 1.2)):
            if traj is None:
                continue
            x, y = C.finite(traj.step, traj.loss)
            ax.plot(x, y, color=color, linewidth=width,
                    label=f"{label}: {_fate(summaries[traj.name])}")
            _mark_divergence(ax, x, y, summaries[traj.name], color)
        for name, branch in run.branches.items():
            if branch.at != at:
                continue
            x, y = C.finite(branch.step, branch.loss)
            apply = _apply_of(run, branch)
            label = f"{name}" + (f" ({apply})" if apply and apply not in name else "")
            ax.plot(x, y, color=color_of[name], linewidth=1.1,
                    label=f"{label}: {_fate(summaries[name])}")
            _mark_divergence(ax, x, y, summaries[name], color_of[name])
        ax.axvline(at, color="0.2", linestyle="--", linewidth=1.0)
        ax.annotate(f"intervention\nat step {at}", xy=(at, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(-4, -4), textcoords="offset points", ha="right", va="top", fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(f"intervening at step {at}   (\u00d7 = divergence step)", loc="left")
        ax.grid(True, alpha=0.25)
        ax.legend(loc="upper left", fontsize=7.5, bbox_to_anchor=(0.0, -0.13), ncol=1,
                  frameon=False)
        if xlim == "auto":
            ax.set_xlim(max(0.0, at - AUTO_LEAD * max(end - at, 1)), end)
        elif isinstance(xlim, tuple):
            ax.set_xlim(*xlim)
    axes[0].set_ylabel(f"training loss (logged every {log_every} steps)")
    return fig
