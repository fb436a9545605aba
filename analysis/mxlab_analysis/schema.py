"""The HDF5 run-file schema (lab/train/SCHEMA.md, schema_version 1) in one place, and the
loader every other module reads through.

The names below are the contract with the C++ writer (lab/train/schema.h);
tests/test_schema_names.py parses SCHEMA.md and fails if the two drift apart.
"""

import os
from dataclasses import dataclass, field

import h5py
import numpy as np

from . import AnalysisError
from . import yamlcfg

SCHEMA_VERSION = 1

# ---- root attributes -------------------------------------------------------------------
ATTR_SCHEMA_VERSION = "schema_version"
ATTR_RUN_ID = "run_id"
ATTR_CONFIG_YAML = "config_yaml"
ATTR_STATUS = "status"
ATTR_STEPS = "steps"
ATTR_SEED = "seed"
ROOT_ATTRS = (
    ATTR_SCHEMA_VERSION, "mxlab_version", "git_commit", "build_type", "device",
    "cuda_runtime", "cuda_driver", "cublas", "math_mode", ATTR_SEED, ATTR_RUN_ID,
    ATTR_CONFIG_YAML, "start_time", "end_time", ATTR_STATUS, ATTR_STEPS,
)
STATUS_RUNNING = "running"
STATUSES = (STATUS_RUNNING, "complete", "diverged", "failed", "interrupted")

# ---- groups and their attributes -------------------------------------------------------
GROUP_TRAJECTORIES = "trajectories"
GROUP_BRANCHES = "branches"
TRAJ_FP32 = "fp32"
TRAJ_MX = "mx"
TRAJECTORY_NAMES = (TRAJ_FP32, TRAJ_MX)
ATTR_PARAM_GROUPS = "param_groups"
ATTR_LAYERS = "layers"
GROUP_ATTRS = (ATTR_PARAM_GROUPS, ATTR_LAYERS)
ATTR_AT = "at"
ATTR_PATCH = "patch"
BRANCH_ATTRS = (ATTR_AT, ATTR_PATCH)

# ---- datasets: one row per logged step -------------------------------------------------
DS_STEP = "step"
DS_LOSS = "loss"
SCALAR_SERIES = (DS_STEP, DS_LOSS, "lr", "grad_norm", "update_norm", "weight_norm")
GAMMA_STATS = ("gamma_mean", "gamma_std", "gamma_min", "gamma_max")
LASTBIN_TENSORS = ("gamma", "beta", "ln_out", "act_out", "grad_out", "grad_hidden")
SUFFIX_LASTBIN = "lastbin"
SUFFIX_CLAMPED = "clamped"
LASTBIN_SUFFIXES = (SUFFIX_LASTBIN, SUFFIX_CLAMPED)
DATASET_ATTR_QUANTIZED = "quantized"  # on each {tensor}_lastbin/_clamped: 1 = MX-quantized


def lastbin_name(tensor, suffix=SUFFIX_LASTBIN):
    """`gamma_lastbin`, `act_out_clamped`, ..."""
    return f"{tensor}_{suffix}"


LASTBIN_DATASETS = tuple(lastbin_name(t, s) for t in LASTBIN_TENSORS for s in LASTBIN_SUFFIXES)
PER_LAYER_DATASETS = GAMMA_STATS + LASTBIN_DATASETS  # shape [n, L]
DS_LOSS_ALL = "loss_all"  # [steps run]: every step's loss, not one row per logged step

# Attention networks only (model.block: attention): more last-bin tensors and the logit maximum,
# all [n, L]; MLP networks' files do not have them.
ATTN_LASTBIN_TENSORS = ("attn_ln_out", "attn_q", "attn_k", "attn_p", "attn_v", "attn_ctx", "grad_attn_out",
                        "grad_ctx", "grad_logits", "grad_qkv", "attn_gamma", "attn_beta")
DS_ATTN_LOGIT_MAX = "attn_logit_max"
ATTN_DATASETS = tuple(lastbin_name(t, s) for t in ATTN_LASTBIN_TENSORS for s in LASTBIN_SUFFIXES) + \
    (DS_ATTN_LOGIT_MAX,)

# MX trajectory and branches only; NaN on rows where the shadow pass did not run.
DS_BIAS_RATIO = "bias_ratio"
DS_COSINE = "cosine"
DS_BIAS_RATIO_AVG = "bias_ratio_avg"
MX_SERIES = (DS_BIAS_RATIO, DS_COSINE, DS_BIAS_RATIO_AVG, "cross_ratio", "cross_cosine",
             "weight_distance")
MX_GROUP_DATASETS = ("bias_ratio_group", "cosine_group")  # shape [n, G]
DATASET_ATTR_NAMES = "names"  # on the *_group datasets: the G parameter-group names
MX_DATASETS = MX_SERIES + MX_GROUP_DATASETS

ROW_DATASETS = SCALAR_SERIES + PER_LAYER_DATASETS + MX_DATASETS  # all share the row count n
ALL_DATASETS = ROW_DATASETS + (DS_LOSS_ALL,)

# ---- summary attributes (per trajectory / branch group, once it has ended) --------------
SUM_STEPS_RUN = "steps_run"
SUM_FIRST_NONFINITE = "first_nonfinite_step"
SUM_DIVERGENCE = "divergence_step"
SUM_SPIKE_COUNT = "spike_count"
SUM_SPIKE_SCORE = "spike_score"
SUM_FINAL_LOSS = "final_loss"
SUM_MIN_LOSS = "min_loss"
SUM_MAX_BIAS_RATIO = "max_bias_ratio"
SUM_MAX_GAMMA_LASTBIN = "max_gamma_lastbin"
SUMMARY_ATTRS = (SUM_STEPS_RUN, SUM_FIRST_NONFINITE, SUM_DIVERGENCE, SUM_SPIKE_COUNT,
                 SUM_SPIKE_SCORE, SUM_FINAL_LOSS, SUM_MIN_LOSS, SUM_MAX_BIAS_RATIO,
                 SUM_MAX_GAMMA_LASTBIN)
NO_STEP = -1  # first_nonfinite_step / divergence_step when there is none


# ---- loading ----------------------------------------------------------------------------
def _py(value):
    """HDF5 attribute -> plain Python: bytes -> str, string arrays -> list[str], numpy scalars
    -> int/float. The C++ writer may store fixed-length ASCII; h5py returns bytes for those."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "SOU":
            return [_py(v) for v in value.tolist()]
        if value.ndim == 0:
            return value.item()
        return value
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass
class Trajectory:
    """One group: `trajectories/fp32`, `trajectories/mx` or `branches/<name>`.

    `data` maps dataset name -> array, every row dataset cut to the same length `n`
    (per-layer arrays are [n, L]); `loss_all` is kept separately (one entry per step run).
    """
    name: str
    kind: str                      # "trajectory" or "branch"
    attrs: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    dataset_attrs: dict = field(default_factory=dict)
    loss_all: np.ndarray = None
    n: int = 0
    truncated: bool = False        # rows were dropped to make the datasets consistent

    @property
    def step(self):
        return self.data.get(DS_STEP, np.zeros(0, dtype=np.int64))

    @property
    def loss(self):
        return self.data.get(DS_LOSS, np.zeros(0))

    @property
    def layers(self):
        return int(self.attrs.get(ATTR_LAYERS, 0))

    @property
    def at(self):
        """Intervention step of a branch (None for a trajectory)."""
        return int(self.attrs[ATTR_AT]) if ATTR_AT in self.attrs else None

    @property
    def has_summary(self):
        return all(k in self.attrs for k in SUMMARY_ATTRS if k != SUM_MAX_BIAS_RATIO)

    def get(self, name):
        return self.data.get(name)

    def quantized(self, dataset):
        """True/False from the dataset's `quantized` attribute, None when absent."""
        value = self.dataset_attrs.get(dataset, {}).get(DATASET_ATTR_QUANTIZED)
        return None if value is None else bool(value)


@dataclass
class Run:
    path: str
    attrs: dict
    config_text: str
    config: dict                   # flat dotted keys of config_text ("model.width": 512)
    trajectories: dict             # "fp32"/"mx" -> Trajectory
    branches: dict                 # branch name -> Trajectory, in file order

    @property
    def run_id(self):
        return str(self.attrs.get(ATTR_RUN_ID, os.path.splitext(os.path.basename(self.path))[0]))

    @property
    def status(self):
        return str(self.attrs.get(ATTR_STATUS, "?"))

    @property
    def fp32(self):
        return self.trajectories.get(TRAJ_FP32)

    @property
    def mx(self):
        return self.trajectories.get(TRAJ_MX)

    def groups(self):
        """All trajectories then all branches, as (Trajectory) in a stable order."""
        return [self.trajectories[k] for k in TRAJECTORY_NAMES if k in self.trajectories] + \
            list(self.branches.values())

    @property
    def truncated(self):
        return any(g.truncated for g in self.groups())


def _consistent_length(data):
    """Rows that every row dataset has, cut further where `step` stops increasing (a killed
    writer can leave extended-but-unwritten rows, which read back as the fill value 0)."""
    lengths = [len(v) for v in data.values()]
    n = min(lengths) if lengths else 0
    step = data.get(DS_STEP)
    if step is not None and n > 1:
        bad = np.nonzero(np.diff(step[:n]) <= 0)[0]
        if bad.size:
            n = int(bad[0]) + 1
    return n


def _load_group(group, name, kind):
    traj = Trajectory(name=name, kind=kind, attrs={k: _py(v) for k, v in group.attrs.items()})
    raw = {}
    for key, ds in group.items():
        if not isinstance(ds, h5py.Dataset):
            continue
        traj.dataset_attrs[key] = {k: _py(v) for k, v in ds.attrs.items()}
        values = ds[()]
        if key == DS_LOSS_ALL:
            traj.loss_all = np.asarray(values, dtype=np.float64)
        else:
            raw[key] = np.asarray(values)
    n = _consistent_length(raw)
    traj.truncated = any(len(v) != n for v in raw.values())
    traj.data = {k: v[:n] for k, v in raw.items()}
    traj.n = n
    if traj.loss_all is None:
        traj.loss_all = np.zeros(0)
    steps_run = traj.attrs.get(SUM_STEPS_RUN)
    if isinstance(steps_run, int) and 0 <= steps_run < len(traj.loss_all):
        traj.loss_all = traj.loss_all[:steps_run]
    return traj


def _open_unlocked(path):
    """Open read-only without HDF5's file lock: the trainer holds its file open for writing
    while it runs, and a locked open would refuse to read a run in progress."""
    try:
        return h5py.File(path, "r", locking=False)
    except TypeError:  # h5py < 3.5 has no locking argument
        return h5py.File(path, "r")


def load_run(path):
    """Read one run file into memory. Tolerates a file from a killed run (status `running`,
    datasets of different lengths): each group is cut to its shortest consistent length and
    marked `truncated`."""
    if not os.path.exists(path):
        raise AnalysisError(f"{path}: no such file")
    try:
        f = _open_unlocked(path)
    except OSError as e:
        raise AnalysisError(f"{path}: not a readable HDF5 file ({e}); "
                            "a run still being written may need a moment to flush") from e
    with f:
        attrs = {k: _py(v) for k, v in f.attrs.items()}
        version = attrs.get(ATTR_SCHEMA_VERSION)
        if version is None:
            raise AnalysisError(f"{path}: no '{ATTR_SCHEMA_VERSION}' attribute - not an mxlab run file")
        if int(version) > SCHEMA_VERSION:
            raise AnalysisError(f"{path}: schema_version {version} is newer than this analysis "
                                f"package understands ({SCHEMA_VERSION}); update analysis/")
        trajectories, branches = {}, {}
        if GROUP_TRAJECTORIES in f:
            for name in TRAJECTORY_NAMES:
                if name in f[GROUP_TRAJECTORIES]:
                    trajectories[name] = _load_group(f[GROUP_TRAJECTORIES][name], name, "trajectory")
        if GROUP_BRANCHES in f:
            for name in f[GROUP_BRANCHES]:
                branches[name] = _load_group(f[GROUP_BRANCHES][name], name, "branch")
        # Branches in intervention order (then name), the order a reader expects in legends.
        branches = dict(sorted(branches.items(), key=lambda kv: (kv[1].attrs.get(ATTR_AT, 0), kv[0])))
    text = str(attrs.get(ATTR_CONFIG_YAML, ""))
    try:
        config = yamlcfg.parse_flat(text)
    except AnalysisError as e:
        raise AnalysisError(f"{path}: {e}") from e
    return Run(path=str(path), attrs=attrs, config_text=text, config=config,
               trajectories=trajectories, branches=branches)


def find_runs(paths):
    """Run files named by `paths`: files as given, directories searched for `*.h5` (not
    recursively; temp files of an atomic write do not end in .h5). Sorted per directory."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".h5"))
            if not found:
                raise AnalysisError(f"{p}: no .h5 run files in this directory")
            files.extend(found)
        elif os.path.exists(p):
            files.append(p)
        else:
            raise AnalysisError(f"{p}: no such file or directory")
    return files
