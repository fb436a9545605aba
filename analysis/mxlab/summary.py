"""`summary DIR`: one row per trajectory (FP32 and each arm) and branch of every run file, as
an aligned text table or CSV - the Python side of `mxlab summarize`. Values come from the
summary attributes the trainer writes; for a group that has none (a killed run) they are
recomputed from loss_all and the row says `source=computed`."""

import csv
import io
import math
import os

from . import metrics
from . import schema as S
from . import sweep
from . import yamlcfg

BASE_COLUMNS = ("run_id", "group", "at", "from")  # from: the arm a branch forks from
VALUE_COLUMNS = ("status", S.SUM_DIVERGENCE, S.SUM_FIRST_NONFINITE, S.SUM_SPIKE_COUNT,
                 S.SUM_SPIKE_SCORE, S.SUM_FINAL_LOSS, S.SUM_MIN_LOSS, S.SUM_MAX_BIAS_RATIO,
                 S.SUM_MAX_GAMMA_LASTBIN, S.SUM_STEPS_RUN, "source", "file")
STEP_COLUMNS = (S.SUM_DIVERGENCE, S.SUM_FIRST_NONFINITE)
FLOAT_DIGITS = 4


def collect(files):
    """(rows, columns): rows are dicts with raw values (None where not applicable)."""
    loaded = sweep.load_all(files)
    runs = [r for _, r, _ in loaded if r is not None]
    swept = sweep.swept_keys(runs)
    columns = BASE_COLUMNS + tuple(swept) + VALUE_COLUMNS
    rows = []
    for path, run, error in loaded:
        if run is None:  # the reason without the path, which has a column of its own
            reason = error[len(f"{path}: "):] if error.startswith(f"{path}: ") else error
            rows.append({"run_id": os.path.splitext(os.path.basename(path))[0],
                         "status": f"unreadable: {reason}", "file": path})
            continue
        for traj in run.groups():
            s = metrics.summarize(traj, run.config)
            row = {"run_id": run.run_id, "group": traj.name, "at": traj.at,
                   "from": traj.arm if traj.kind == "branch" else None,
                   "status": run.status, "source": s["source"], "file": path}
            for key in swept:
                row[key] = run.config.get(key)
            for key in S.SUMMARY_ATTRS:
                row[key] = s[key]
            if traj.is_fp32:
                row[S.SUM_MAX_BIAS_RATIO] = None  # no shadow pass on the FP32 trajectory
            rows.append(row)
    return rows, columns


def _cell(column, value, csv_mode):
    if value is None:
        return "" if csv_mode else "-"
    if column in STEP_COLUMNS and int(value) == S.NO_STEP:
        return str(S.NO_STEP) if csv_mode else "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "" if csv_mode else "-"
        return repr(value) if csv_mode else f"{value:.{FLOAT_DIGITS}g}"
    if column == "file" and not csv_mode:
        return os.path.basename(value)
    return yamlcfg.format_value(value)


def to_csv(rows, columns):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow([_cell(c, row.get(c), True) for c in columns])
    return buf.getvalue()


def to_text(rows, columns):
    table = [list(columns)] + [[_cell(c, row.get(c), False) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    return "\n".join(lines) + "\n"
