"""The HDF5 run-file schema (lab/train/SCHEMA.md, schema_version 1) in one place, and the
loader every other module reads through.

A run holds the FP32 trajectory and one or more MX trajectories ("arms", `trajectories/<arm>`;
files before arms have exactly one, named `mx`), and intervention branches, each forking from
an arm (attribute `from`, `mx` when absent).

The names below are the contract with the C++ writer, which declares every dataset of a group
once (lab/train/metrics.h); tests/test_schema_names.py parses SCHEMA.md and fails if this module
and the document drift apart (tests/cpu/test_metrics_schema.cpp does the same for the C++ side).
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
    ATTR_CONFIG_YAML, "start_time", "end_time", ATTR_STATUS, ATTR_STEPS, "arms",
)
ATTR_ARMS = "arms"  # list of arm names in config order (absent in files before arms)
STATUS_RUNNING = "running"
STATUSES = (STATUS_RUNNING, "complete", "diverged", "failed", "interrupted")

# ---- groups and their attributes -------------------------------------------------------
GROUP_TRAJECTORIES = "trajectories"
GROUP_BRANCHES = "branches"
TRAJ_FP32 = "fp32"                 # reserved: the FP32 trajectory
TRAJ_MX = "mx"                     # the one arm of a file written before arms
TRAJECTORY_NAMES = (TRAJ_FP32, TRAJ_MX)  # the groups of such a file
ATTR_PARAM_GROUPS = "param_groups"
ATTR_LAYERS = "layers"
GROUP_ATTRS = (ATTR_PARAM_GROUPS, ATTR_LAYERS)
ATTR_ARM = "arm"                   # on each arm group: its name
ATTR_POLICY = "policy"             # one-line description of the group's precision policy
ATTR_PATCH = "patch"               # arm: flow YAML of its patch ("{}" = none); branch: YAML
ARM_ATTRS = (ATTR_ARM, ATTR_POLICY, ATTR_PATCH)
ATTR_AT = "at"
ATTR_FROM = "from"                 # the arm a branch forks from (absent = mx)
BRANCH_ATTRS = (ATTR_AT, ATTR_PATCH)
ATTR_STATE = "state"               # the trainer's `not_started` marks a branch that never ran
STATE_NOT_STARTED = "not_started"

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
# precision.attention: flash_bf16 (NaN for a trajectory whose attention is exact at that step): the
# rows whose maximum is attained more than once, the rows with several bf16 P-bar = 1, and the delta
# bias sum(delta - delta_hp) of the flash backward with its running sum, per layer.
DS_ATTN_MULTI_MAX_FRAC = "attn_multi_max_frac"
DS_ATTN_MULTI_ONE_FRAC = "attn_multi_one_frac"
DS_ATTN_DELTA_BIAS = "attn_delta_bias"
DS_ATTN_DELTA_BIAS_CUMSUM = "attn_delta_bias_cumsum"
# Every trajectory: the spectral norms of W_Q, W_K, W_V the step's forward used, per layer, and the
# cosine of the W_Q gradient error g~ - g-bar with the previous logged shadow step's (NaN for the
# FP32 trajectory, rows without a shadow pass and the first one).
DS_ATTN_WQ_SPEC = "attn_wq_spec"
DS_ATTN_WK_SPEC = "attn_wk_spec"
DS_ATTN_WV_SPEC = "attn_wv_spec"
DS_ATTN_DWQ_ERR_COS = "attn_dwq_err_cos"
ATTN_DATASETS = tuple(lastbin_name(t, s) for t in ATTN_LASTBIN_TENSORS for s in LASTBIN_SUFFIXES) + \
    (DS_ATTN_LOGIT_MAX, DS_ATTN_MULTI_MAX_FRAC, DS_ATTN_MULTI_ONE_FRAC, DS_ATTN_DELTA_BIAS, DS_ATTN_DELTA_BIAS_CUMSUM,
     DS_ATTN_WQ_SPEC, DS_ATTN_WK_SPEC, DS_ATTN_WV_SPEC, DS_ATTN_DWQ_ERR_COS)

# MX trajectory and branches only; NaN on rows where the shadow pass did not run.
DS_BIAS_RATIO = "bias_ratio"
DS_COSINE = "cosine"
DS_BIAS_RATIO_AVG = "bias_ratio_avg"
MX_SERIES = (DS_BIAS_RATIO, DS_COSINE, DS_BIAS_RATIO_AVG, "cross_ratio", "cross_cosine",
             "weight_distance")
MX_GROUP_DATASETS = ("bias_ratio_group", "cosine_group")  # shape [n, G]
DATASET_ATTR_NAMES = "names"  # on the *_group datasets: the G parameter-group names
MX_DATASETS = MX_SERIES + MX_GROUP_DATASETS

# gamma/beta clamp debt: |x - Q(x)|/|x| per layer (mean, max) and the fraction of
# stored elements above what their block can represent (clamped by the quantizer).
DEBT_TENSORS = ("gamma", "beta")
DEBT_STATS = ("gap_mean", "gap_max", "above_frac")
DEBT_DATASETS = tuple(f"{t}_{s}" for t in DEBT_TENSORS for s in DEBT_STATS)  # [n, L]
WEIGHT_DEBT_DATASETS = ("weight_gap_mean", "weight_above_frac")  # [n, 2L], attribute `names`
# MX groups: the paper's code's squared cross-trajectory ratio and its running average, the
# absolute norms of eps = g~ - g-bar, g-bar and g~, the FP32 loss at the MX weights.
DS_CROSS_RATIO_SQ = "cross_ratio_sq"
DS_CROSS_RATIO_SQ_AVG = "cross_ratio_sq_avg"
MX_SERIES_V2 = (DS_CROSS_RATIO_SQ, DS_CROSS_RATIO_SQ_AVG, "eps_norm", "gbar_norm", "gtilde_norm",
                "eps_par", "eps_perp", "shadow_loss")
MX_GROUP_DATASETS_V2 = ("eps_norm_group", "gbar_norm_group", "gtilde_norm_group")  # [n, G]
NEW_ROW_DATASETS = DEBT_DATASETS + WEIGHT_DEBT_DATASETS + MX_SERIES_V2 + MX_GROUP_DATASETS_V2  # may be absent

ROW_DATASETS = SCALAR_SERIES + PER_LAYER_DATASETS + MX_DATASETS + NEW_ROW_DATASETS  # share n

# Curvature (log.curvature_every > 0): their own step axis `curvature_step`, length m.
DS_CURVATURE_STEP = "curvature_step"
DS_HESSIAN_LMAX = "hessian_lmax"
DS_PRECOND_LMAX = "precond_lmax"         # largest eigenvalue of the Adam-preconditioned Hessian
DS_PRECOND_THRESHOLD = "precond_threshold"  # 38/lr (Adam, beta1 0.9); 2/lr (SGD)
DS_EQ10_LHS = "eq10_lhs"                 # |1 - s| + s r, s = lr * precond_lmax, r running bias
CURVATURE_DATASETS = (DS_CURVATURE_STEP, DS_HESSIAN_LMAX, DS_PRECOND_LMAX, DS_PRECOND_THRESHOLD,
                      DS_EQ10_LHS, "hessian_resid", "precond_resid", "probe_loss")

# The shadow series: one row per shadow step (every bias_every-th and the last),
# on their own axis `shadow_step`: the global scalars of that step's shadow pass.
DS_SHADOW_STEP = "shadow_step"
SHADOW_DATASETS = (DS_SHADOW_STEP, "shadow_bias_ratio", "shadow_cosine", "shadow_cross_ratio",
                   "shadow_cross_ratio_sq", "shadow_eps_norm", "shadow_gbar_norm", "shadow_gtilde_norm",
                   "shadow_eps_par", "shadow_eps_perp", "shadow_fp32_loss")

ALL_DATASETS = ROW_DATASETS + (DS_LOSS_ALL,) + CURVATURE_DATASETS + SHADOW_DATASETS

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


def _attrs(obj):
    """An HDF5 object's attributes as plain Python, each read by name: `.attrs.items()` would
    give None for an attribute whose header is damaged instead of raising."""
    return {k: _py(obj.attrs[k]) for k in obj.attrs}


@dataclass
class Trajectory:
    """One group: `trajectories/fp32`, `trajectories/<arm>` or `branches/<name>`.

    `data` maps dataset name -> array, every row dataset cut to the same length `n`
    (per-layer arrays are [n, L]); `curvature` holds the curvature datasets on their own
    axis `curvature_step` (length `m`); `loss_all` is kept separately (one entry per step run).
    """
    name: str
    kind: str                      # "trajectory" or "branch"
    attrs: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    dataset_attrs: dict = field(default_factory=dict)
    loss_all: np.ndarray = None
    n: int = 0
    truncated: bool = False        # rows were dropped to make the datasets consistent
    curvature: dict = field(default_factory=dict)
    m: int = 0
    shadow: dict = field(default_factory=dict)  # the shadow series, on the axis `shadow_step`
    other: dict = field(default_factory=dict)  # unknown datasets whose length is not the rows'

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
    def is_fp32(self):
        return self.kind == "trajectory" and self.name == TRAJ_FP32

    @property
    def arm(self):
        """The MX arm this group belongs to: its own name for an arm, the arm it forks from for
        a branch (`mx` in files before arms), None for the FP32 trajectory."""
        if self.kind == "branch":
            return str(self.attrs.get(ATTR_FROM, TRAJ_MX))
        return None if self.is_fp32 else self.name

    @property
    def not_started(self):
        """A branch the trainer never started (its arm had stopped before `at`)."""
        return self.attrs.get(ATTR_STATE) == STATE_NOT_STARTED

    @property
    def has_summary(self):
        return all(k in self.attrs for k in SUMMARY_ATTRS if k != SUM_MAX_BIAS_RATIO)

    def get(self, name):
        """A row dataset, or a curvature or shadow-series dataset (on its own axis: see `series`)."""
        value = self.data.get(name)
        if value is None:
            value = self.curvature.get(name)
        return self.shadow.get(name) if value is None else value

    def series(self, name):
        """(steps, values) of a dataset on its own axis: `step` for row datasets,
        `curvature_step` for the curvature datasets; None when the group does not have it."""
        if name in self.data:
            return self.step, self.data[name]
        if name in self.curvature and DS_CURVATURE_STEP in self.curvature:
            return self.curvature[DS_CURVATURE_STEP], self.curvature[name]
        if name in self.shadow and DS_SHADOW_STEP in self.shadow:
            return self.shadow[DS_SHADOW_STEP], self.shadow[name]
        return None

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
    trajectories: dict             # "fp32" then each arm -> Trajectory, in arm order
    branches: dict                 # branch name -> Trajectory, ordered by (at, name)

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
    def arms(self):
        """Names of the MX arms, in config order (`["mx"]` for a file before arms)."""
        return [k for k in self.trajectories if k != TRAJ_FP32]

    @property
    def mx(self):
        """The arm named `mx` (every file before arms has it), else the first arm."""
        if TRAJ_MX in self.trajectories:
            return self.trajectories[TRAJ_MX]
        arms = self.arms
        return self.trajectories[arms[0]] if arms else None

    def arm(self, name=None):
        """The arm called `name` (None: `mx`, see above); a wrong name is an AnalysisError that
        lists the arms there are."""
        if name is None:
            if self.mx is None:
                raise AnalysisError(f"{self.path}: no MX trajectory in this file")
            return self.mx
        if name == TRAJ_FP32 or name not in self.trajectories:
            raise AnalysisError(f"{self.path}: no arm '{name}'; arms: {', '.join(self.arms) or 'none'}")
        return self.trajectories[name]

    def parent(self, branch):
        """The arm a branch forks from, or None when the file lacks it."""
        name = branch.arm
        return self.trajectories.get(name) if name and name != TRAJ_FP32 else None

    def groups(self):
        """FP32, every arm (in arm order), then every branch: each a Trajectory."""
        return list(self.trajectories.values()) + list(self.branches.values())

    def mx_groups(self):
        """Every arm and branch: the groups that ran with an MX policy."""
        return [t for t in self.groups() if not t.is_fp32]

    @property
    def truncated(self):
        return any(g.truncated for g in self.groups())


def _consistent_length(data, step_name=DS_STEP):
    """Rows that every dataset of one axis has, cut further where its step stops increasing (a
    killed writer can leave extended-but-unwritten rows, which read back as the fill value 0)."""
    lengths = [len(v) for v in data.values()]
    n = min(lengths) if lengths else 0
    step = data.get(step_name)
    if step is not None and n > 1:
        bad = np.nonzero(np.diff(step[:n]) <= 0)[0]
        if bad.size:
            n = int(bad[0]) + 1
    return n


def _cut(raw, step_name):
    """(arrays cut to one consistent length, length, whether anything was cut)."""
    n = _consistent_length(raw, step_name)
    return {k: v[:n] for k, v in raw.items()}, n, any(len(v) != n for v in raw.values())


NUMBER_ATTRS = SUMMARY_ATTRS + (ATTR_AT, ATTR_LAYERS)  # attributes that must hold a number


def _check_group(traj, group):
    """What the figures rely on, so that a damaged group fails here and not deep in a figure:
    numeric attributes are numbers, a branch has its `at`. Raises ValueError."""
    for key in NUMBER_ATTRS:
        value = traj.attrs.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"attribute '{key}' of {group.name} is {value!r}, not a number")
    if traj.kind == "branch" and not isinstance(traj.attrs.get(ATTR_AT), int):
        raise ValueError(f"branch {group.name} has no integer attribute '{ATTR_AT}'")


def _load_group(group, name, kind):
    traj = Trajectory(name=name, kind=kind, attrs=_attrs(group))
    _check_group(traj, group)
    raw, curvature, shadow = {}, {}, {}
    # Each member by name, not group.items() / group.get(): those return None for a member
    # whose link or header is damaged, and the group would silently lose that dataset.
    members = {key: group[key] for key in group}
    step = members.get(DS_STEP)
    rows = step.shape[0] if isinstance(step, h5py.Dataset) else None
    for key, ds in members.items():
        if not isinstance(ds, h5py.Dataset):
            continue
        traj.dataset_attrs[key] = _attrs(ds)
        values = ds[()]
        if key in ALL_DATASETS and (np.ndim(values) == 0 or np.asarray(values).dtype.kind not in "biuf"):
            raise ValueError(f"dataset {group.name}/{key} holds {np.asarray(values).dtype} "
                             f"of shape {np.shape(values)}, not a series of numbers")
        if key == DS_LOSS_ALL:
            traj.loss_all = np.asarray(values, dtype=np.float64)
        elif key in CURVATURE_DATASETS:
            curvature[key] = np.asarray(values)
        elif key in SHADOW_DATASETS:
            shadow[key] = np.asarray(values)
        elif key in ROW_DATASETS or rows is None or ds.shape[:1] == (rows,):
            raw[key] = np.asarray(values)
        else:  # a dataset this package does not know, on some other axis: not a log row
            traj.other[key] = np.asarray(values)
    traj.data, traj.n, cut_rows = _cut(raw, DS_STEP)
    traj.curvature, traj.m, cut_curvature = _cut(curvature, DS_CURVATURE_STEP)
    traj.shadow, _, cut_shadow = _cut(shadow, DS_SHADOW_STEP)
    traj.truncated = cut_rows or cut_curvature or cut_shadow
    if traj.loss_all is None:
        traj.loss_all = np.zeros(0)
    steps_run = traj.attrs.get(SUM_STEPS_RUN)
    if isinstance(steps_run, int) and 0 <= steps_run < len(traj.loss_all):
        traj.loss_all = traj.loss_all[:steps_run]
    return traj


def _arm_order(names, listed):
    """fp32 first, then the arms in the order of the root attribute `arms`, then any other
    group (a file whose attribute lists fewer arms than it holds) by name."""
    listed = [a for a in listed if a in names and a != TRAJ_FP32]
    rest = sorted(n for n in names if n != TRAJ_FP32 and n not in listed)
    return ([TRAJ_FP32] if TRAJ_FP32 in names else []) + listed + rest


def _open_unlocked(path):
    """Open read-only without HDF5's file lock: the trainer holds its file open for writing
    while it runs, and a locked open would refuse to read a run in progress."""
    try:
        return h5py.File(path, "r", locking=False)
    except TypeError:  # h5py < 3.5 has no locking argument
        return h5py.File(path, "r")


# What h5py raises on a damaged file (flipped bytes in the HDF5 metadata, a file cut short):
# OSError from the library, RuntimeError, KeyError or ValueError from corrupted object headers,
# TypeError for a datatype it cannot map, MemoryError for an absurd dataspace, ... . Any of
# them while reading a run file means the file cannot be read whole.
DAMAGED_FILE_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError,
                       AttributeError, UnicodeError, OverflowError, MemoryError)
REASON_CHARS = 200  # a reason quoted from h5py, cut to keep the message one readable line


def _reason(error):
    """`TypeName: message` of an h5py error on one line, at most REASON_CHARS characters."""
    text = " ".join(str(error).split()) or "(no message)"
    text = f"{type(error).__name__}: {text}"
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "\u2026"


def load_run(path):
    """Read one run file into memory. Tolerates a file from a killed run (status `running`,
    datasets of different lengths): each group is cut to its shortest consistent length and
    marked `truncated`. A file that cannot be read whole (not HDF5, damaged metadata, a
    dataset that is not numbers) is an AnalysisError that says why."""
    if not os.path.exists(path):
        raise AnalysisError(f"{path}: no such file")
    try:
        f = _open_unlocked(path)
    except DAMAGED_FILE_ERRORS as e:
        raise AnalysisError(f"{path}: not a readable HDF5 file ({_reason(e)}); "
                            "a run still being written may need a moment to flush") from e
    try:
        with f:
            attrs, trajectories, branches = _read_file(f, path)
    except DAMAGED_FILE_ERRORS as e:
        raise AnalysisError(f"{path}: unreadable run file, damaged HDF5 metadata? ({_reason(e)}); "
                            "rerun it, or leave it out") from e
    text = attrs.get(ATTR_CONFIG_YAML, "")
    if not isinstance(text, str):
        raise AnalysisError(f"{path}: attribute '{ATTR_CONFIG_YAML}' is not text "
                            f"({type(text).__name__}); damaged file? rerun it, or leave it out")
    try:
        config = yamlcfg.parse_flat(text)
    except AnalysisError as e:
        raise AnalysisError(f"{path}: {e}") from e
    return Run(path=str(path), attrs=attrs, config_text=text, config=config,
               trajectories=trajectories, branches=branches)


def _read_file(f, path):
    """(root attributes, trajectories, branches) of an open run file; h5py errors propagate."""
    attrs = _attrs(f)
    version = attrs.get(ATTR_SCHEMA_VERSION)
    if version is None:
        raise AnalysisError(f"{path}: no '{ATTR_SCHEMA_VERSION}' attribute - not an mxlab run file")
    if int(version) > SCHEMA_VERSION:
        raise AnalysisError(f"{path}: schema_version {version} is newer than this analysis "
                            f"package understands ({SCHEMA_VERSION}); update analysis/")
    listed = attrs.get(ATTR_ARMS, [])
    attrs[ATTR_ARMS] = [listed] if isinstance(listed, str) else list(listed)
    trajectories, branches = {}, {}
    top = {name: f[name] for name in f}  # by name: a damaged link raises, not skipped
    if GROUP_TRAJECTORIES in top:
        groups = {n: g for n, g in ((n, top[GROUP_TRAJECTORIES][n]) for n in top[GROUP_TRAJECTORIES])
                  if isinstance(g, h5py.Group)}
        for name in _arm_order(list(groups), attrs[ATTR_ARMS]):
            trajectories[name] = _load_group(groups[name], name, "trajectory")
    if GROUP_BRANCHES in top:
        for name in top[GROUP_BRANCHES]:
            branches[name] = _load_group(top[GROUP_BRANCHES][name], name, "branch")
    # Branches in intervention order (then name), the order a reader expects in legends.
    branches = dict(sorted(branches.items(), key=lambda kv: (kv[1].attrs.get(ATTR_AT, 0), kv[0])))
    return attrs, trajectories, branches


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
