"""`survival DIR --by KEY[,KEY]`: Kaplan-Meier curves of "steps to divergence" per group of
trajectories, with 95 % bands and pairwise log-rank tests (most divergences come
late, so a fixed horizon censors them; counting k/n at the horizon throws that away).

Definitions (analysis/README.md, `survival`, says the same):
- Each trajectory (FP32, each arm, each branch) is one subject. Event: its divergence step,
  else its first non-finite step (metrics.event_step). Otherwise it is censored at the step
  it stopped: `steps_run` (for a branch, `at` + steps_run, steps_run counting from `at`).
- A branch enters the risk set at its intervention step `at` (delayed entry): before that it
  was its arm, which is a subject of its own. Trajectories enter at 0. A subject is at risk
  at step t when entry <= t <= its time; at a tie, censored subjects are still at risk.
- Kaplan-Meier: S(t) = prod over event steps t_j <= t of (1 - d_j / n_j).
- Greenwood: Var S(t) = S(t)^2 sum_{t_j <= t} d_j / (n_j (n_j - d_j)). Band `loglog`
  (default): S^exp(+-z se), se = sqrt(sum d/(n(n-d))) / |log S|, z = 1.959964 (stays in
  [0, 1]; undefined where S = 0 or after n_j = d_j); band `plain`: S +- z sqrt(Var), clipped.
- Log-rank (two groups, pooled event steps): O1 - E1 = sum (d1 - d n1/n), V = sum n1 n2 d
  (n - d) / (n^2 (n - 1)); chi2 = (O1 - E1)^2 / V, 1 degree of freedom, p = erfc(sqrt(chi2/2)).
  No event while both groups are at risk (V = 0): no test.
"""

import csv
import io
import math
import sys
from dataclasses import dataclass

import numpy as np

from . import AnalysisError
from . import common as C
from . import metrics
from . import sweep
from . import yamlcfg

Z95 = 1.959963984540054  # two-sided 95 % normal quantile
ARM_KEY = "arm"          # --by key meaning the trajectory's group name
BANDS = ("loglog", "plain")


@dataclass
class Subject:
    group: tuple      # the --by values
    entry: int        # first step at risk
    time: int         # event or censoring step
    event: bool


@dataclass
class KM:
    """A Kaplan-Meier estimate: one entry per distinct event step."""
    times: np.ndarray
    at_risk: np.ndarray
    events: np.ndarray
    survival: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    n: int
    n_events: int
    censored_times: np.ndarray

    def at(self, t):
        """S(t): the estimate just after step t."""
        i = np.searchsorted(self.times, t, side="right")
        return 1.0 if i == 0 else float(self.survival[i - 1])

    @property
    def median(self):
        """First event step with S <= 1/2 (None: not reached)."""
        hit = np.nonzero(self.survival <= 0.5)[0]
        return int(self.times[hit[0]]) if hit.size else None


def _at_risk(entry, time, t):
    return int(np.count_nonzero((entry <= t) & (time >= t)))


def kaplan_meier(time, event, entry=None, band="loglog"):
    """KM estimate of subjects with these times, event flags (True = diverged) and entry steps
    (default 0), with a 95 % band (module docstring)."""
    if band not in BANDS:
        raise AnalysisError(f"--band {band}: choose one of {', '.join(BANDS)}")
    time = np.asarray(time, dtype=np.int64)
    event = np.asarray(event, dtype=bool)
    entry = np.zeros_like(time) if entry is None else np.asarray(entry, dtype=np.int64)
    times = np.unique(time[event])
    n = np.array([_at_risk(entry, time, t) for t in times], dtype=np.int64)
    d = np.array([np.count_nonzero(event & (time == t)) for t in times], dtype=np.int64)
    s = np.cumprod(1.0 - d / n) if times.size else np.zeros(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(n > d, d / (n * (n - d)), np.inf)
        greenwood = np.cumsum(terms)
        if band == "loglog":
            se = np.sqrt(greenwood) / np.abs(np.log(s))
            lower, upper = s ** np.exp(Z95 * se), s ** np.exp(-Z95 * se)
        else:
            half = Z95 * s * np.sqrt(greenwood)
            lower, upper = np.clip(s - half, 0.0, 1.0), np.clip(s + half, 0.0, 1.0)
    undefined = ~np.isfinite(greenwood) | (s <= 0.0)
    lower, upper = np.where(undefined, np.nan, lower), np.where(undefined, np.nan, upper)
    return KM(times, n, d, s, lower, upper, int(time.size), int(event.sum()), np.sort(time[~event]))


def logrank(a, b):
    """(chi2, p) of the log-rank test between two groups, each (time, event, entry) arrays;
    (nan, nan) when no event happens while both groups have subjects at risk (V = 0)."""
    ta, ea, na = (np.asarray(x) for x in a)
    tb, eb, nb = (np.asarray(x) for x in b)
    times = np.unique(np.concatenate([ta[ea.astype(bool)], tb[eb.astype(bool)]]))
    o_minus_e = var = 0.0
    for t in times:
        n1, n2 = _at_risk(na, ta, t), _at_risk(nb, tb, t)
        d1 = int(np.count_nonzero(ea.astype(bool) & (ta == t)))
        d2 = int(np.count_nonzero(eb.astype(bool) & (tb == t)))
        n_all, d_all = n1 + n2, d1 + d2
        if n_all < 2 or d_all == 0:
            continue
        o_minus_e += d1 - d_all * n1 / n_all
        var += n1 * n2 * d_all * (n_all - d_all) / (n_all ** 2 * (n_all - 1))
    if var <= 0.0:
        return math.nan, math.nan
    chi2 = o_minus_e ** 2 / var
    return chi2, math.erfc(math.sqrt(chi2 / 2.0))


def subject_of(run, traj, keys):
    """One trajectory as a Subject grouped by `keys` (None when it never started)."""
    if traj.not_started:
        return None
    summary = metrics.summarize(traj, run.config)
    step = metrics.event_step(summary)
    entry = traj.at if traj.kind == "branch" and traj.at is not None else 0
    group = tuple(traj.name if k == ARM_KEY else run.config.get(k) for k in keys)
    if step is not None:
        return Subject(group, entry, step, True)
    return Subject(group, entry, metrics.end_step(traj, summary), False)


def parse_keys(by):
    keys = [k.strip() for k in (by or "").split(",") if k.strip()]
    if not keys:
        raise AnalysisError("--by: give at least one key, e.g. --by arm or --by arm,optimizer.lr")
    return keys


def collect(files, keys, where=(), fp32=True, branches=True):
    """(groups, notes): {group values: [Subject]} in first-seen order."""
    where = sweep.parse_where(where)
    groups, notes = {}, []
    for path, run, error in sweep.load_all(files):
        if run is None:
            notes.append(f"left out {error}")  # the error names the file
            continue
        for key in keys:
            if key != ARM_KEY and key not in run.config:
                raise AnalysisError(f"{path}: config has no key '{key}' (dotted, e.g. "
                                    f"optimizer.lr; '{ARM_KEY}' is the trajectory's group name)")
        if not sweep.matches(run, where):
            continue
        for traj in run.groups():
            if (traj.is_fp32 and not fp32) or (traj.kind == "branch" and not branches):
                continue
            subject = subject_of(run, traj, keys)
            if subject is None:
                notes.append(f"{run.run_id}/{traj.name}: never started, left out")
                continue
            groups.setdefault(subject.group, []).append(subject)
    if not groups:
        raise AnalysisError("no trajectories" + (" after --where" if where else ""))
    # Config values in order (numbers numerically); arm names in the order first seen (fp32,
    # the arms in config order, then the branches).
    seen = {}
    for g in groups:
        for k, v in zip(keys, g):
            if k == ARM_KEY:
                seen.setdefault(v, len(seen))

    def order(g):
        return tuple((0, seen[v], "") if k == ARM_KEY else
                     ((1, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool)
                      else (2, 0.0, str(v))) for k, v in zip(keys, g))
    return dict(sorted(groups.items(), key=lambda kv: order(kv[0]))), notes


def group_label(keys, values):
    if len(keys) == 1:
        return yamlcfg.format_value(values[0])
    return ", ".join(f"{k}={yamlcfg.format_value(v)}" for k, v in zip(keys, values))


def estimate(groups, band="loglog"):
    """{group: KM} and the pairwise log-rank tests [(i, j, chi2, p)] over the group order."""
    names = list(groups)
    arrays = {g: (np.array([s.time for s in groups[g]]), np.array([s.event for s in groups[g]]),
                  np.array([s.entry for s in groups[g]])) for g in names}
    curves = {g: kaplan_meier(arrays[g][0], arrays[g][1], arrays[g][2], band) for g in names}
    tests = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            chi2, p = logrank(arrays[names[i]], arrays[names[j]])
            tests.append((i, j, chi2, p))
    return curves, tests


def _p(p):
    if math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def to_text(keys, curves, tests):
    labels = [group_label(keys, g) for g in curves]
    rows = [("#", "group", "n", "events", "censored", "median step")]
    for k, (g, km) in enumerate(curves.items()):
        rows.append((str(k + 1), labels[k], str(km.n), str(km.n_events), str(km.n - km.n_events),
                     "not reached" if km.median is None else str(km.median)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    if tests:
        lines.append("")
        lines.append("log-rank (two-sided, 1 df):")
        for i, j, chi2, p in tests:
            stat = "no test: no event with both groups at risk" if math.isnan(chi2) else f"chi2 {chi2:.3f}"
            lines.append(f"  [{i + 1}] {labels[i]}  vs  [{j + 1}] {labels[j]}: p = {_p(p)} ({stat})")
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ("group", "step", "at_risk", "events", "survival", "lower", "upper")


def to_csv(keys, curves):
    """The KM table: one row per group and event step (step 0 row: S = 1)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for g, km in curves.items():
        label = group_label(keys, g)
        w.writerow([label, 0, km.n, 0, 1.0, 1.0, 1.0])
        for t, n, d, s, lo, hi in zip(km.times, km.at_risk, km.events, km.survival, km.lower, km.upper):
            w.writerow([label, int(t), int(n), int(d), repr(float(s)),
                        "" if math.isnan(lo) else repr(float(lo)), "" if math.isnan(hi) else repr(float(hi))])
    return buf.getvalue()


def _steps(km, end):
    """(x, S, lower, upper) as post-steps from 0 to `end`."""
    x = np.concatenate([[0], km.times, [end]])
    s = np.concatenate([[1.0], km.survival, [km.survival[-1] if km.survival.size else 1.0]])
    lo = np.concatenate([[1.0], km.lower, [km.lower[-1] if km.lower.size else 1.0]])
    hi = np.concatenate([[1.0], km.upper, [km.upper[-1] if km.upper.size else 1.0]])
    return x, s, lo, hi


def build(keys, curves, tests, notes=(), band="loglog", where=()):
    n_groups = len(curves)
    table = n_groups > 1
    fig = C.new_figure(14 if table else 10, 6.2)
    if table:
        ax, ax_table = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
    else:
        ax, ax_table = fig.subplots(1, 1), None
    from matplotlib import colormaps
    cmap = colormaps["tab10" if n_groups <= 10 else "viridis"]
    end = max(int(max(km.times.max(initial=0), km.censored_times.max(initial=0))) for km in curves.values())
    labels = [group_label(keys, g) for g in curves]
    for k, (g, km) in enumerate(curves.items()):
        color = cmap(k % 10) if n_groups <= 10 else cmap(k / max(n_groups - 1, 1))
        x, s, lo, hi = _steps(km, end)
        ax.step(x, s, where="post", color=color, linewidth=max(3.0 - 0.3 * k, 1.2),  # overlaps
                label=f"[{k + 1}] {labels[k]}  (n={km.n}, events={km.n_events})")
        ax.fill_between(x, np.nan_to_num(lo, nan=0.0), np.nan_to_num(hi, nan=0.0), step="post",
                        color=color, alpha=0.15, linewidth=0,
                        where=np.isfinite(lo) | (s >= 1.0))
        if km.censored_times.size:
            ax.plot(km.censored_times, [km.at(t) for t in km.censored_times], marker="|",
                    markersize=10, mew=1.5, color=color, linestyle="none")
    ax.plot([], [], marker="|", color="0.3", linestyle="none", markersize=10, label="censored")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlim(0, end * 1.02 if end else 1)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction not yet diverged  S(step)")
    ax.grid(True, alpha=0.25)
    C.legend_outside(ax, below=True, ncol=2)
    ax.set_title(f"Kaplan\u2013Meier, 95 % band ({'log-log' if band == 'loglog' else 'plain'} "
                 "Greenwood)", loc="left")
    if ax_table is not None:
        ax_table.axis("off")
        ax_table.set_title("log-rank p (two-sided)", loc="left")
        cells = [["" for _ in range(n_groups)] for _ in range(n_groups)]
        for i, j, _, p in tests:
            cells[i][j] = cells[j][i] = _p(p)
        for i in range(n_groups):
            cells[i][i] = "\u2014"
        names = [f"[{k + 1}]" for k in range(n_groups)]
        t = ax_table.table(cellText=cells, rowLabels=names, colLabels=names, loc="upper center",
                           cellLoc="center")
        t.auto_set_font_size(False)
        t.set_fontsize(8 if n_groups <= 8 else 6)
        t.scale(1.0, 1.4)
        for (i, j), cell in t.get_celld().items():
            if i >= 1 and j >= 0 and cells[i - 1][j] not in ("", "\u2014", "n/a"):
                p = float(cells[i - 1][j].lstrip("<"))
                if p < 0.05:
                    cell.set_facecolor("#fde0c5")
        ax_table.text(0.0, 0.02, "shaded: p < 0.05 (not corrected for multiple pairs)",
                      transform=ax_table.transAxes, fontsize=7, color="0.3")
    title = (f"steps to divergence by {', '.join(keys)}: event = divergence_step, else first "
             f"non-finite step; censored at the last step run")
    if where:
        title += "   [" + ", ".join(where) + "]"
    if notes:
        title += "\n" + "; ".join(list(notes)[:3]) + (f" (+{len(notes) - 3} more)" if len(notes) > 3 else "")
    fig.suptitle(title, fontsize=9)
    return fig


def run_command(files, by, out=None, csv_path=None, pdf=False, band="loglog", where=(),
                fp32=True, branches=True):
    keys = parse_keys(by)
    groups, notes = collect(files, keys, where=where, fp32=fp32, branches=branches)
    curves, tests = estimate(groups, band)
    sys.stdout.write(to_text(keys, curves, tests))
    for note in notes:
        print(f"note: {note}")
    written = []
    if csv_path:
        with open(csv_path, "w", encoding="utf-8") as f:
            f.write(to_csv(keys, curves))
        written.append(csv_path)
    if out:
        written += C.save(build(keys, curves, tests, notes, band, where), out, pdf)
    return written
