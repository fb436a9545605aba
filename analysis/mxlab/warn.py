"""`warn DIR`: how well each logged signal warns of a divergence before it happens.
For every candidate signal, sweep an alarm threshold over all trajectories of a set
of runs and report, per threshold, the fraction of diverging trajectories that raised the
alarm before they diverged (TPR) with the lead time, and the fraction of the others that ever
raised it (false alarms, FPR); per signal the ROC AUC and the best threshold.

Definitions (analysis/README.md, `warn`, says the same):
- A trajectory *diverges* at its event step: `divergence_step`, else `first_nonfinite_step`
  (metrics.event_step); one with neither is *stable*.
- A signal is a series over a trajectory's logged rows (or, for curvature, its own
  `curvature_step` axis); non-finite values are dropped. A branch's series is its arm's rows
  before `at` followed by its own: what a monitor of that trajectory would have seen.
- The alarm, direction `above` at threshold t, is raised at the first step where value >= t
  (`below`: value <= t). A diverging trajectory counts only steps < its event step; a stable
  one its whole run. So a trajectory's *score* is the max (above) or min (below) of its
  window, and it raises the alarm at t iff its score >= t (<= t).
- Lead time = event step - first alarm step (>= 1, since only earlier steps count).
- ROC: thresholds at every distinct score; AUC by the trapezoid rule = the Mann-Whitney
  probability that a diverging trajectory scores beyond a stable one (ties count 1/2).
- Both directions are evaluated; the one with the larger AUC is reported as the signal's
  direction (choosing it on the same data flatters the AUC a little: the report says when
  the data picked the direction opposite to the expected one).
- Best threshold: the largest Youden J = TPR - FPR (or, with max_fpr, the largest TPR with
  FPR <= max_fpr); ties go to the longer median lead, then to the stricter threshold.
- Missing data: a signal absent from every trajectory is skipped with a note (old files,
  curvature off); a trajectory without the signal or without a finite value of it in its
  window (e.g. one that diverged before its first row) is left out of that signal and
  counted (`nodata_pos`, `nodata_neg`).
"""

import csv
import io
import math
import sys
from dataclasses import dataclass, field

import numpy as np

from . import AnalysisError
from . import common as C
from . import metrics
from . import schema as S
from . import sweep

ABOVE, BELOW = "above", "below"
EITHER = "either"


@dataclass(frozen=True)
class Signal:
    name: str
    expected: str            # above / below / either: what the literature predicts


SIGNALS = (
    Signal("gamma_lastbin", ABOVE),       # paper fig. 3: LN gamma piles into the last bin
    Signal("gamma_above_frac", ABOVE),    # clamp debt: stored gamma above what its block represents
    Signal("gamma_gap_mean", ABOVE),      # clamp debt: the gap the quantizer hides from the forward
    Signal("bias_ratio_avg", ABOVE),      # paper app. B.2: divergence follows once it nears 2
    Signal("cosine", EITHER),             # paper: decays; fresh-seed study: rises before divergence
    Signal("precond_ratio", ABOVE),       # Cohen et al. 2022: adaptive edge of stability at 1
    Signal("eq10_lhs", ABOVE),            # paper Eq. 10: unstable above ~1
    Signal("grad_norm", ABOVE),           # loss spikes follow gradient growth
    Signal("cross_ratio_sq_avg", ABOVE),  # the paper code's stab/zeta_norm; 2 = uncorrelated
)
SIGNAL_NAMES = tuple(s.name for s in SIGNALS)


def extract(traj, name):
    """(steps, values) of signal `name` in one group, non-finite values dropped; None when the
    group lacks the datasets."""
    if name == "precond_ratio":
        lmax, thr = traj.series(S.DS_PRECOND_LMAX), traj.series(S.DS_PRECOND_THRESHOLD)
        if lmax is None or thr is None:
            return None
        steps = lmax[0]
        thr = np.asarray(thr[1], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(thr > 0, np.asarray(lmax[1], dtype=np.float64) / thr, np.nan)
    else:
        found = traj.series(name)
        if found is None:
            return None
        steps, values = found[0], np.asarray(found[1], dtype=np.float64)
        if values.ndim == 2:  # per layer: the worst layer; fmax skips NaN without warnings
            values = np.fmax.reduce(values, axis=1) if values.shape[1] else np.full(len(steps), np.nan)
    keep = np.isfinite(values)
    return np.asarray(steps, dtype=np.int64)[keep], values[keep]


def trajectory_series(run, traj, name):
    """The series a monitor of `traj` sees: for a branch, its arm's rows before `at` first."""
    own = extract(traj, name)
    if own is None or traj.kind != "branch":
        return own
    parent = run.parent(traj)
    before = extract(parent, name) if parent is not None else None
    if before is None:
        return own
    keep = before[0] < traj.at
    return np.concatenate([before[0][keep], own[0]]), np.concatenate([before[1][keep], own[1]])


@dataclass
class Case:
    """One trajectory: where it came from, its event step (None = stable), its series."""
    file: str
    run_id: str
    group: str
    kind: str
    event: int = None
    series: dict = field(default_factory=dict)   # signal -> (steps, values)

    def window(self, name):
        """(steps, values) the alarm may use: steps before the event for a diverging case."""
        found = self.series.get(name)
        if found is None:
            return None
        steps, values = found
        if self.event is not None:
            keep = steps < self.event
            steps, values = steps[keep], values[keep]
        return (steps, values) if steps.size else None


def collect(files, signals=SIGNAL_NAMES, fp32=False, branches=True, where=()):
    """(cases, notes): every MX trajectory (arms, branches; FP32 too with `fp32`) of the runs."""
    where = sweep.parse_where(where)
    cases, notes = [], []
    for path, run, error in sweep.load_all(files):
        if run is None:
            notes.append(f"left out {error}")  # the error names the file
            continue
        if not sweep.matches(run, where):
            continue
        for traj in run.groups():
            if (traj.is_fp32 and not fp32) or (traj.kind == "branch" and not branches):
                continue
            if traj.not_started:
                continue
            summary = metrics.summarize(traj, run.config)
            case = Case(file=path, run_id=run.run_id, group=traj.name, kind=traj.kind,
                        event=metrics.event_step(summary))
            for name in signals:
                found = trajectory_series(run, traj, name)
                if found is not None:
                    case.series[name] = found
            cases.append(case)
    if not cases:
        raise AnalysisError("no trajectories to evaluate" + (" after --where" if where else ""))
    return cases, notes


@dataclass
class Curve:
    """One signal in one direction: the ROC over thresholds and the lead times."""
    signal: str
    direction: str
    thresholds: np.ndarray     # strictest first
    tp: np.ndarray
    fp: np.ndarray
    n_pos: int
    n_neg: int
    leads: list                # per threshold: lead times of the diverging cases that alarmed
    auc: float
    nodata_pos: int
    nodata_neg: int

    @property
    def tpr(self):
        return self.tp / self.n_pos if self.n_pos else np.full(len(self.tp), np.nan)

    @property
    def fpr(self):
        return self.fp / self.n_neg if self.n_neg else np.full(len(self.fp), np.nan)

    def median_lead(self, i):
        return float(np.median(self.leads[i])) if self.leads[i] else math.nan


def evaluate(cases, name, direction):
    """The Curve of signal `name` alarming `direction` over `cases`; None when no case has a
    value of the signal in its window."""
    sign = 1.0 if direction == ABOVE else -1.0  # below = above on the negated series
    pos, neg = [], []
    nodata_pos = nodata_neg = 0
    for case in cases:
        window = case.window(name)
        if window is None:  # no dataset, or no finite value before the divergence: left out
            nodata_pos += case.event is not None
            nodata_neg += case.event is None
            continue
        steps, values = window[0], sign * window[1]
        (pos if case.event is not None else neg).append((case.event, steps, values))
    if not pos and not neg:
        return None
    scores_pos = np.array([v.max() for _, _, v in pos])
    scores_neg = np.array([v.max() for _, _, v in neg])
    thresholds = np.unique(np.concatenate([scores_pos, scores_neg]))[::-1]  # strictest first
    tp = np.array([(scores_pos >= t).sum() for t in thresholds], dtype=np.int64)
    fp = np.array([(scores_neg >= t).sum() for t in thresholds], dtype=np.int64)
    leads = []
    for t in thresholds:
        leads.append([int(event - steps[np.argmax(values >= t)])
                      for event, steps, values in pos if values.max() >= t])
    auc = math.nan
    if pos and neg:
        x = np.concatenate([[0.0], fp / len(neg)])
        y = np.concatenate([[0.0], tp / len(pos)])
        auc = float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0))
    return Curve(name, direction, sign * thresholds, tp, fp, len(pos), len(neg), leads, auc,
                 nodata_pos, nodata_neg)


def mann_whitney_auc(scores_pos, scores_neg):
    """P(pos > neg) + P(pos = neg)/2 over all pairs: the AUC by its definition (for tests)."""
    p = np.asarray(scores_pos, dtype=np.float64)[:, None]
    n = np.asarray(scores_neg, dtype=np.float64)[None, :]
    return float(((p > n).sum() + 0.5 * (p == n).sum()) / (p.size * n.size))


def best_index(curve, max_fpr=None):
    """Index of the chosen threshold (module docstring), or None when there is none."""
    if not curve.n_pos or not curve.n_neg:
        return None
    tpr, fpr = curve.tpr, curve.fpr
    keys = []
    for i in range(len(curve.thresholds)):
        if max_fpr is not None and fpr[i] > max_fpr + 1e-12:
            continue
        lead = curve.median_lead(i)
        primary = tpr[i] if max_fpr is not None else tpr[i] - fpr[i]
        # max primary, then max median lead, then the strictest (smallest i)
        keys.append((-primary, -(lead if not math.isnan(lead) else -math.inf), i))
    return min(keys)[2] if keys else None


@dataclass
class Result:
    signal: Signal
    curves: dict               # direction -> Curve
    chosen: str                # the direction reported (larger AUC)
    best: int                  # index into curves[chosen], or None

    @property
    def curve(self):
        return self.curves[self.chosen]

    @property
    def against_expectation(self):
        return self.signal.expected in (ABOVE, BELOW) and self.chosen != self.signal.expected


def analyze(cases, signals=SIGNAL_NAMES, max_fpr=None):
    """(results, notes): one Result per signal that any case has; notes for the others."""
    results, notes = [], []
    by_name = {s.name: s for s in SIGNALS}
    for name in signals:
        if name not in by_name:
            raise AnalysisError(f"unknown signal {name}; choose from {', '.join(SIGNAL_NAMES)}")
        signal = by_name[name]
        if not any(name in c.series for c in cases):
            notes.append(f"{name}: in no trajectory (files before it was logged, or "
                         f"{'log.curvature_every 0' if name in ('precond_ratio', 'eq10_lhs') else 'not logged'}): skipped")
            continue
        curves = {d: evaluate(cases, name, d) for d in (ABOVE, BELOW)}
        if curves[ABOVE] is None:
            notes.append(f"{name}: no trajectory has a value before its divergence: skipped")
            continue
        a_above, a_below = curves[ABOVE].auc, curves[BELOW].auc
        preferred = signal.expected if signal.expected != EITHER else ABOVE
        other = BELOW if preferred == ABOVE else ABOVE
        chosen = preferred
        if not math.isnan(curves[other].auc) and (math.isnan(curves[preferred].auc) or
                                                  curves[other].auc > curves[preferred].auc):
            chosen = other
        result = Result(signal, curves, chosen, best_index(curves[chosen], max_fpr))
        if math.isnan(a_above) or math.isnan(a_below):
            notes.append(f"{name}: AUC needs both diverging and stable trajectories "
                         f"({curves[ABOVE].n_pos} diverging, {curves[ABOVE].n_neg} stable)")
        results.append(result)
    return results, notes


def excluded_note(cases):
    """Diverging trajectories that no signal could judge (e.g. diverged before any row)."""
    blind = [c for c in cases if c.event is not None and
             all(c.window(n) is None for n in c.series)]
    if not blind:
        return None
    names = ", ".join(f"{c.run_id}/{c.group}@{c.event}" for c in blind[:4])
    more = f" and {len(blind) - 4} more" if len(blind) > 4 else ""
    return (f"{len(blind)} diverging trajector{'y' if len(blind) == 1 else 'ies'} without any "
            f"signal value before the divergence step, left out: {names}{more}")


# ---- output ----------------------------------------------------------------------------
CSV_COLUMNS = ("signal", "direction", "expected", "chosen", "threshold", "n_pos", "n_neg", "tp",
               "fp", "tpr", "fpr", "youden", "median_lead", "min_lead", "max_lead", "auc", "best",
               "nodata_pos", "nodata_neg")


def to_csv(results):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in results:
        for direction, curve in r.curves.items():
            tpr, fpr = curve.tpr, curve.fpr
            for i, t in enumerate(curve.thresholds):
                leads = curve.leads[i]
                w.writerow([r.signal.name, direction, r.signal.expected,
                            int(direction == r.chosen), repr(float(t)), curve.n_pos, curve.n_neg,
                            int(curve.tp[i]), int(curve.fp[i]), _num(tpr[i]), _num(fpr[i]),
                            _num(tpr[i] - fpr[i]), _num(curve.median_lead(i)),
                            min(leads) if leads else "", max(leads) if leads else "",
                            _num(curve.auc), int(direction == r.chosen and i == r.best),
                            curve.nodata_pos, curve.nodata_neg])
    return buf.getvalue()


def _num(x):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else repr(float(x))


def _arrow(direction):
    return "\u2265" if direction == ABOVE else "\u2264"


def to_text(results, notes, max_fpr=None):
    header = ("signal", "dir", "AUC above", "AUC below", "div/stable", "best threshold", "TPR",
              "FPR", "median lead [min, max]")
    table = [header]
    for r in results:
        c = r.curve
        flag = "*" if r.against_expectation else ""
        row = [r.signal.name, r.chosen + flag, _fmt(r.curves[ABOVE].auc), _fmt(r.curves[BELOW].auc),
               f"{c.n_pos}/{c.n_neg}"]
        if r.best is None:
            row += ["-", "-", "-", "-"]
        else:
            i, leads = r.best, c.leads[r.best]
            row += [f"{_arrow(r.chosen)} {c.thresholds[i]:.4g}", f"{c.tp[i]}/{c.n_pos}",
                    f"{c.fp[i]}/{c.n_neg}",
                    f"{c.median_lead(i):.0f} [{min(leads)}, {max(leads)}]" if leads else "-"]
        table.append(row)
    widths = [max(len(r[k]) for r in table) for k in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines.append("")
    lines.append("dir: the direction with the larger AUC (alarm when the signal is above / below "
                 "the threshold); * = opposite to the expected one.")
    lines.append("best threshold: " + (f"largest TPR with FPR <= {max_fpr:g}" if max_fpr is not None
                                       else "largest Youden J = TPR - FPR") +
                 ", ties to the longer median lead; lead = divergence step - first alarm step.")
    lines.extend(f"note: {n}" for n in notes)
    return "\n".join(lines) + "\n"


def _fmt(x):
    return "-" if math.isnan(x) else f"{x:.3f}"


def build(results, notes, n_cases, n_files, max_fpr=None):
    """ROC curve per signal (its reported direction) and the lead times at the chosen
    threshold, one row per signal."""
    if not results:
        raise AnalysisError("no signal to evaluate: " + "; ".join(notes))
    fig = C.new_figure(15, 1.6 + max(4.6, 0.55 * len(results) + 1.5))
    ax_roc, ax_lead = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.35]})
    from matplotlib import colormaps
    cmap = colormaps["tab10"]
    ax_roc.plot([0, 1], [0, 1], color="0.6", linestyle=":", linewidth=1, label="chance (AUC 0.5)")
    all_leads = [v for r in results if r.best is not None for v in r.curve.leads[r.best]]
    for k, r in enumerate(results):
        c, color = r.curve, cmap(k % 10)
        if c.n_pos and c.n_neg:
            x = np.concatenate([[0.0], c.fpr])
            y = np.concatenate([[0.0], c.tpr])
            flag = ", opposite to expected" if r.against_expectation else ""
            ax_roc.plot(x, y, color=color, linewidth=max(3.2 - 0.3 * k, 1.0),  # overlaps stay visible
                        label=f"{r.signal.name} ({r.chosen}{flag}): AUC {c.auc:.2f}")
            if r.best is not None:
                ax_roc.plot([c.fpr[r.best]], [c.tpr[r.best]], marker="o", color=color,
                            markersize=6, linestyle="none")
        row = len(results) - 1 - k
        if r.best is not None:
            leads = c.leads[r.best]
            jitter = np.linspace(-0.18, 0.18, len(leads)) if len(leads) > 1 else np.zeros(len(leads))
            ax_lead.plot(leads, row + jitter, marker="o", linestyle="none", color=color, alpha=0.8,
                         markersize=5)
            if leads:
                ax_lead.plot([np.median(leads)] * 2, [row - 0.32, row + 0.32], color="black",
                             linewidth=2)
    ax_roc.set_xlim(-0.02, 1.02)
    ax_roc.set_ylim(-0.02, 1.02)
    ax_roc.set_aspect("equal")
    ax_roc.set_xlabel("false-alarm rate (stable trajectories that ever cross)")
    ax_roc.set_ylabel("hit rate (diverging trajectories that cross before diverging)")
    ax_roc.set_title("ROC per signal (\u25cf = chosen threshold)", loc="left")
    ax_roc.grid(True, alpha=0.25)
    ax_roc.legend(loc="lower right", fontsize=7.5)

    labels = []
    for r in results:
        c = r.curve
        if r.best is None:
            labels.append(f"{r.signal.name}: no threshold")
            continue
        i = r.best
        labels.append(f"{r.signal.name} {_arrow(r.chosen)} {c.thresholds[i]:.3g}\n"
                      f"hits {c.tp[i]}/{c.n_pos}, false alarms {c.fp[i]}/{c.n_neg}")
    ax_lead.set_yticks(range(len(results)))
    ax_lead.set_yticklabels(labels[::-1], fontsize=8)
    ax_lead.set_ylim(-0.6, len(results) - 0.4)
    positive = [v for v in all_leads if v > 0]
    if positive and max(positive) / min(positive) > 20:
        ax_lead.set_xscale("log")
    ax_lead.set_xlabel("lead time: divergence step \u2212 first alarm step (steps; bar = median)")
    ax_lead.set_title("lead time at the chosen threshold, each diverging trajectory", loc="left")
    ax_lead.grid(True, axis="x", alpha=0.25)
    criterion = (f"largest TPR with FPR \u2264 {max_fpr:g}" if max_fpr is not None
                 else "largest Youden J = TPR \u2212 FPR")
    title = (f"early warning: {n_cases} trajectories from {n_files} run files; threshold: "
             f"{criterion}; direction: the larger AUC of above/below")
    if notes:
        title += "\n" + "\n".join(notes[:4]) + (f"\n(+{len(notes) - 4} more notes)" if len(notes) > 4 else "")
    fig.suptitle(title, fontsize=9)
    return fig


def run_command(files, out=None, csv_path=None, pdf=False, signals=None, fp32=False,
                branches=True, max_fpr=None, where=()):
    """The CLI: text report on stdout, the figure, and the CSV. Returns the files written."""
    if max_fpr is not None and not 0.0 <= max_fpr <= 1.0:
        raise AnalysisError(f"--max-fpr {max_fpr}: a fraction between 0 and 1")
    signals = tuple(signals) if signals else SIGNAL_NAMES
    for name in signals:
        if name not in SIGNAL_NAMES:
            raise AnalysisError(f"unknown signal {name}; choose from {', '.join(SIGNAL_NAMES)}")
    cases, notes = collect(files, signals, fp32=fp32, branches=branches, where=where)
    results, more = analyze(cases, signals, max_fpr)
    notes += more
    blind = excluded_note(cases)
    if blind:
        notes.append(blind)
    sys.stdout.write(to_text(results, notes, max_fpr))
    written = []
    if csv_path:
        with open(csv_path, "w", encoding="utf-8") as f:
            f.write(to_csv(results))
        written.append(csv_path)
    if out:
        n_files = len({c.file for c in cases})
        written += C.save(build(results, notes, len(cases), n_files, max_fpr), out, pdf)
    return written
