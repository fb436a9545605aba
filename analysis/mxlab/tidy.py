"""A results directory as one long ("tidy") pandas DataFrame: one row per logged value of every
run file, the same table as `mxlab export DIR --long OUT.csv` writes (lab/report/long_export.h
documents the columns and the row order; this module follows it row for row).

    from mxlab import tidy
    df = tidy.load("runs/")                       # read the run files with h5py
    df = tidy.read_long_csv("long.csv")           # or the CSV the binary wrote
    df[(df.metric == "loss") & (df.kind == "arm")].groupby(["optimizer.lr", "step"]).value.median()
    ds = tidy.to_xarray(df, "loss")               # needs xarray (optional)

Columns: run_id, the configuration keys that differ between the runs (values typed: numbers,
booleans, text; NaN where a run lacks the key), seed, trajectory, kind (fp32 | arm | branch),
arm, step, metric, column ("" for one value per step; the group name or layer<k> for [n, k]
datasets), value (float64).
"""

import glob
import os
import warnings

import numpy as np

from . import AnalysisError
from . import schema as S
from . import yamlcfg

FIXED_COLUMNS = ["seed", "trajectory", "kind", "arm", "step", "metric", "column", "value"]
LOSS_ALL = "loss_all"
STEP = "step"
# Keys left out of the swept columns, as `mxlab export --long` does (lab/runs/run_records.h
# swept_keys): `seed` has a column of its own.
NOT_SWEPT = ("name", "interventions", "seed")


def _pandas():
    try:
        import pandas as pd
    except ImportError as e:  # scripts/install-deps.sh installs it
        raise AnalysisError("tidy needs pandas (scripts/install-deps.sh installs it; pip install pandas)") from e
    return pd


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def _flow(value):
    """A sequence or map as one flow-YAML text, as the binary prints a sequence-valued key."""
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _flatten(tree, prefix="", out=None):
    """Nested maps -> dotted keys; a sequence is one key (its flow text), as the binary does."""
    out = {} if out is None else out
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):  # an empty map has no key, as in the binary
            _flatten(value, name + ".", out)
        elif isinstance(value, list):
            out[name] = _flow(value)
        else:
            out[name] = value
    return out


def _files(path):
    if os.path.isdir(path):
        return sorted(glob.glob(os.path.join(glob.escape(path), "*.h5")))
    if os.path.exists(path):
        return [path]
    raise AnalysisError(f"{path}: no such file or directory (give a results directory or a run file)")


def _is_axis(name):
    return name == STEP or (len(name) > 5 and name.endswith("_step"))


class _Run:
    def __init__(self, path, f):
        attrs = f.attrs
        if "schema_version" not in attrs:
            raise AnalysisError(f"{path}: no schema_version attribute: not an mxlab run file")
        self.path = path
        run_id = _text(attrs["run_id"]) if "run_id" in attrs else ""
        self.run_id = run_id or os.path.splitext(os.path.basename(path))[0]
        text = _text(attrs.get("config_yaml", ""))
        tree = yamlcfg.parse(text) if text else {}
        self.config = _flatten(tree) if isinstance(tree, dict) else {}
        if "seed" in attrs:
            self.seed = int(attrs["seed"])
        else:
            self.seed = self.config.get("seed")


def _groups(f):
    """(h5 path, name, kind, arm, first step) of every trajectory and branch, in the binary's order."""
    out = []
    if "trajectories" in f:
        names = sorted(f["trajectories"].keys())
        names = [n for n in names if n == "fp32"] + [n for n in names if n != "fp32"]
        for n in names:
            out.append((f"trajectories/{n}", n, "fp32" if n == "fp32" else "arm", n, 0))
    if "branches" in f:
        br = []
        for n in sorted(f["branches"].keys()):
            g = f[f"branches/{n}"]
            at = int(g.attrs["at"]) if "at" in g.attrs else -1
            arm = _text(g.attrs["from"]) if "from" in g.attrs else "mx"
            br.append((at, n, arm))
        for at, n, arm in sorted(br, key=lambda b: (b[0], b[1])):
            out.append((f"branches/{n}", n, "branch", arm, at if at > 0 else 0))
    return out


def _group_chunks(f, h5_path, first, path):
    """[(steps int64 array, metric, column, values float64 array)] of one group, in row order."""
    g = f[h5_path]
    by_axis = {}
    for d in sorted(g.keys()):
        if d == LOSS_ALL or not isinstance(g[d], S.h5py.Dataset):
            continue
        if _is_axis(d):
            by_axis.setdefault(d, [])
            continue
        axis = _text(g[d].attrs["axis"]) if "axis" in g[d].attrs else STEP
        by_axis.setdefault(axis, []).append(d)
    axes = ([STEP] if STEP in by_axis else []) + sorted(a for a in by_axis if a != STEP)
    chunks = []
    for axis in axes:
        names = by_axis[axis]
        if axis not in g or not isinstance(g[axis], S.h5py.Dataset) or not names:
            continue
        steps = np.asarray(g[axis][()], dtype=np.int64)
        names = [n for n in names if n == "loss"] + [n for n in names if n != "loss"]
        kept = [n for n in names if 1 <= g[n].ndim <= 2]
        rows = min([len(steps)] + [g[n].shape[0] for n in kept])
        if rows < len(steps):
            warnings.warn(f"{path}: datasets of {h5_path} (axis {axis}) have different lengths "
                          f"(a run that was killed?); using the first {rows} rows that all have")
        steps = steps[:rows]
        for n in kept:
            values = np.asarray(g[n][:rows], dtype=np.float64)
            if values.ndim == 1:
                chunks.append((steps, n, "", values))
                continue
            width = values.shape[1]
            labels = [_text(x) for x in g[n].attrs["names"]] if "names" in g[n].attrs else []
            if len(labels) != width:
                labels = [f"layer{k}" for k in range(width)]
            for k in range(width):
                chunks.append((steps, n, labels[k], values[:, k]))
    if LOSS_ALL in g:
        loss = np.asarray(g[LOSS_ALL][()], dtype=np.float64)
        chunks.append((first + np.arange(len(loss), dtype=np.int64), LOSS_ALL, "", loss))
    return chunks


def swept_keys(runs):
    """Configuration keys whose value differs between the runs (absent counts as a value), in
    configuration order; as the binary's swept_keys, less `seed`."""
    runs = [r for r in runs if r.config]
    if len(runs) < 2:
        return []
    keys = []
    for r in runs:
        for k in r.config:
            if k not in keys:
                keys.append(k)
    out = []
    for k in keys:
        if k in NOT_SWEPT or k.startswith("interventions."):
            continue
        values = {("=", repr(r.config[k])) if k in r.config else ("absent",) for r in runs}
        if len(values) > 1:
            out.append(k)
    return out


def load(path):
    """The long table of every run file of results directory `path` (or of one run file) as a
    pandas DataFrame. A file that cannot be read is left out with a warning; none readable is an
    AnalysisError."""
    pd = _pandas()
    runs = []
    for p in _files(path):
        try:
            with S._open_unlocked(p) as f:
                runs.append(_Run(p, f))
        except (AnalysisError, *S.DAMAGED_FILE_ERRORS) as e:
            warnings.warn(f"left out {os.path.basename(p)}: {e}")
    if not runs:
        raise AnalysisError(f"{path}: no readable run file")
    runs.sort(key=lambda r: (r.run_id, r.path))
    keys = swept_keys(runs)
    cols = {c: [] for c in ["run_id"] + keys + FIXED_COLUMNS}
    for r in runs:
        with S._open_unlocked(r.path) as f:
            for h5_path, name, kind, arm, first in _groups(f):
                for steps, metric, column, values in _group_chunks(f, h5_path, first, r.path):
                    n = len(steps)
                    cols["run_id"].append(np.full(n, r.run_id, dtype=object))
                    for k in keys:
                        v = r.config.get(k, np.nan)
                        cols[k].append(np.full(n, v, dtype=object))
                    cols["seed"].append(np.full(n, r.seed, dtype=object))
                    cols["trajectory"].append(np.full(n, name, dtype=object))
                    cols["kind"].append(np.full(n, kind, dtype=object))
                    cols["arm"].append(np.full(n, arm, dtype=object))
                    cols["step"].append(steps)
                    cols["metric"].append(np.full(n, metric, dtype=object))
                    cols["column"].append(np.full(n, column, dtype=object))
                    cols["value"].append(values)
    data = {c: (np.concatenate(v) if v else np.array([], dtype=object)) for c, v in cols.items()}
    df = pd.DataFrame(data)
    df["step"] = df["step"].astype(np.int64)
    df["value"] = df["value"].astype(np.float64)
    for c in ["run_id", "trajectory", "kind", "arm", "metric", "column"]:
        df[c] = df[c].astype(str)
    return df.infer_objects()


def read_long_csv(path):
    """The CSV of `mxlab export DIR --long OUT.csv` as the DataFrame `load` gives: `column` ""
    (not NaN) for one-value datasets, text columns as text, value float64 (nan, inf kept)."""
    pd = _pandas()
    text = ["run_id", "trajectory", "kind", "arm", "metric", "column"]
    # The 17-digit values must read back to the same double: pandas before 3 needs round_trip
    # for that (its default parser may be off in the last bit); 3 does it by default and
    # deprecates the argument.
    exact = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}
    df = pd.read_csv(path, dtype={c: str for c in text}, keep_default_na=False, **exact,
                     na_values={c: [""] for c in pd.read_csv(path, nrows=0).columns if c not in text})
    df["value"] = df["value"].astype(np.float64)
    df["step"] = df["step"].astype(np.int64)
    return df


def to_xarray(df, metric, dims=None):
    """One metric of a long table as an xarray DataArray indexed by `dims` (default: run_id,
    trajectory, column where it varies, step). Needs xarray, an optional dependency: an
    AnalysisError says so when it is missing."""
    try:
        import xarray  # noqa: F401
    except ImportError as e:
        raise AnalysisError("to_xarray needs xarray, an optional dependency (pip install xarray)") from e
    sub = df[df["metric"] == metric]
    if sub.empty:
        raise AnalysisError(f"to_xarray: no rows of metric '{metric}' (metrics here: "
                            f"{', '.join(sorted(df['metric'].unique()))})")
    if dims is None:
        dims = ["run_id", "trajectory"] + (["column"] if sub["column"].nunique() > 1 else []) + ["step"]
    return sub.set_index(list(dims))["value"].to_xarray()
