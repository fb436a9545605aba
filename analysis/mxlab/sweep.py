"""A directory of run files as a sweep: loading (a bad file is reported, not fatal), the
config keys that differ between runs, and `--where` filters."""

import math
from collections import namedtuple

from . import AnalysisError
from . import schema as S
from . import yamlcfg

# Keys that differ between runs without being a swept setting of the experiment (arms and
# branches have rows of their own).
NOT_SWEPT_PREFIXES = ("interventions.", "arms.")
NOT_SWEPT = ("name",)


class Loaded(namedtuple("Loaded", "path run error")):
    """One file of a sweep: its Run, or None and why it could not be read."""


def load_all(files):
    """[Loaded(path, Run or None, error text or None)] in the order given. A file that cannot be
    read (not HDF5, damaged, not an mxlab run) is kept with its reason, not fatal; items that
    are already Loaded (the CLI loads once, then counts the unreadable ones) pass through."""
    out = []
    for path in files:
        if isinstance(path, Loaded):
            out.append(path)
            continue
        try:
            out.append(Loaded(path, S.load_run(path), None))
        except AnalysisError as e:
            out.append(Loaded(path, None, str(e)))
    return out


def unreadable(loaded):
    """The Loaded items of `loaded` whose file could not be read."""
    return [item for item in loaded if item.run is None]


def swept_keys(runs):
    """Dotted config keys whose value is not the same in every run, in config order."""
    if len(runs) < 2:
        return []
    keys = []
    for run in runs:
        for k in run.config:
            if k not in keys:
                keys.append(k)
    out = []
    for k in keys:
        if k in NOT_SWEPT or k.startswith(NOT_SWEPT_PREFIXES) or k + "." in NOT_SWEPT_PREFIXES:
            continue
        values = {_key(run.config.get(k)) for run in runs}
        if len(values) > 1:
            out.append(k)
    return out


def _key(value):
    """Hashable identity of a config value (lists from `[]`, NaN that is unequal to itself)."""
    return repr(value)


def parse_where(items):
    """["optimizer.lr=6e-4", ...] -> [(key, value)] with YAML scalar typing (so 6e-4 == 0.0006)."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AnalysisError(f"--where {item}: expected KEY=VALUE, e.g. optimizer.lr=6e-4")
        out.append((key.strip(), yamlcfg.scalar(value.strip())))
    return out


def matches(run, where):
    for key, value in where:
        if key not in run.config:
            raise AnalysisError(f"--where {key}: no such key in {run.path}'s config "
                                f"(keys look like model.width, optimizer.lr)")
        have = run.config[key]
        if isinstance(have, (int, float)) and isinstance(value, (int, float)) and \
                not isinstance(have, bool):
            if not math.isclose(float(have), float(value), rel_tol=1e-6, abs_tol=0.0):
                return False
        elif str(have) != str(value) and have != value:
            return False
    return True


def sort_values(values):
    """Numbers numerically, everything else as text."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return sorted(values, key=lambda v: str(v))
