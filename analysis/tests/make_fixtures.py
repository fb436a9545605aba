"""Synthetic mxlab run files that follow lab/train/SCHEMA.md exactly, written with h5py.

The tests build them in a temporary directory (nothing binary is committed); run this file
to write a demo set for looking at the figures:

    python3 analysis/tests/make_fixtures.py /tmp/mxlab-demo [--steps 6000]

The curves are shaped like the paper's (arXiv 2506.20752, figures 3-5): an MX loss that
tracks FP32 and then blows up, a bias ratio that dips and climbs to ~2 before the blow-up,
a cosine that decays to ~0, and LayerNorm gains piling into the last quantization bin.
"""

import argparse
import hashlib
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mxlab import metrics  # noqa: E402
from mxlab import schema as S  # noqa: E402

# The defaults of lab/config/config.h, in the nesting `mxlab dump-config` prints.
DEFAULT_CONFIG = {
    "name": "run", "seed": 0, "steps": 1000, "device": "auto",
    "model": {"depth": 4, "width": 512, "hidden_mult": 4, "activation": "gelu",
              "layernorm": True, "ln_affine": True, "ln_eps": 1e-5, "fc2_bias": True,
              "init": "pytorch", "init_gain": 1.0},
    "teacher": {"depth": 0, "width": 0, "activation": "same", "residual": False},
    "data": {"batch": 2048, "label_noise": 0.005},
    "loss": "mse", "kl_temperature": 1.0,
    "optimizer": {"name": "adam", "lr": 6e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                  "weight_decay": 0.0, "momentum": 0.0},
    "schedule": {"name": "constant", "warmup": 0, "lr_min": 0.0},
    "precision": {"weight": "mxfp8_e4m3", "activation": "mxfp8_e4m3", "grad": "mxfp8_e4m3",
                  "weight_bwd": "same", "activation_bwd": "same", "ln_affine": "mxfp8_e4m3",
                  "elementwise": "bf16", "backward": True, "block_size": 32,
                  "scale_rule": "floor", "bump": "clamp", "rounding": "nearest_even",
                  "elementwise_rounding": "nearest_even", "diagnostic_format": "mxfp8_e4m3"},
    "log": {"log_every": 10, "bias_every": 0, "spike_factor": 100.0,
            "divergence_factor": 10.0, "bias_avg_beta": 0.99, "on_nonfinite": "stop",
            "flush_every": 100, "progress": True},
    "checkpoint_every": 0,
    "interventions": [],
}


def _yaml_scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _emit(tree, indent=0):
    pad = " " * indent
    lines = []
    for key, value in tree.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines.extend(_emit(value, indent + 2))
        elif isinstance(value, list):
            if not value:
                lines.append(f"{pad}{key}: []")
                continue
            lines.append(f"{pad}{key}:")
            for item in value:  # a list of maps, the way interventions are dumped
                sub = _emit(item, indent + 4)
                lines.append(f"{pad}  - {sub[0].strip()}")
                lines.extend(sub[1:])
        else:
            lines.append(f"{pad}{key}: {_yaml_scalar(value)}")
    return lines


def config_yaml(overrides=None, interventions=(), arms=None):
    """Resolved config text: the defaults with dotted-key overrides applied; `arms` (a list of
    {name, apply or set}) adds the `arms:` list of a multi-arm run."""
    import copy
    tree = copy.deepcopy(DEFAULT_CONFIG)
    for dotted, value in (overrides or {}).items():
        node = tree
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        if leaf not in node:
            raise KeyError(f"fixture config has no key {dotted}")
        node[leaf] = value
    if arms is not None:
        tree["arms"] = [dict(a) for a in arms]
    tree["interventions"] = [dict(i) for i in interventions]
    return "\n".join(_emit(tree)) + "\n"


def _flow(items):
    """A `set:` mapping as the trainer dumps it: `{k: v, ...}` sorted by key, `{}` for none."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted((items or {}).items())) + "}"


def patch_text(spec):
    """The group attribute `patch` of an arm, as the trainer writes it: `{apply: P, set: {...}}`
    with what the arm has, `{}` for neither."""
    parts = ([f"apply: {spec['apply']}"] if spec.get("apply") else []) + \
        ([f"set: {_flow(spec['set'])}"] if spec.get("set") else [])
    return "{" + ", ".join(parts) + "}"


POLICY_FIELDS = ("weight", "activation", "grad", "weight_bwd", "activation_bwd", "ln_affine",
                 "elementwise", "backward", "block_size", "scale_rule", "bump", "rounding",
                 "elementwise_rounding")


def policy_text(config_text, sets=None):
    """The group attribute `policy`: every precision field of the config's `precision`, the
    `set:` items applied, `same` backward formats resolved (the trainer's describe_policy)."""
    from mxlab import yamlcfg
    prec = {k[len("precision."):]: v for k, v in yamlcfg.parse_flat(config_text).items()
            if k.startswith("precision.")}
    prec.update(sets or {})
    for bwd, fwd in (("weight_bwd", "weight"), ("activation_bwd", "activation")):
        if prec.get(bwd) == "same":
            prec[bwd] = prec[fwd]
    return " ".join(f"{k}={_yaml_scalar(prec[k])}" for k in POLICY_FIELDS if k in prec)


def _write_rows(group, name, array, attrs=None):
    """An extendable, chunked dataset like the trainer's (maxshape None along axis 0)."""
    array = np.asarray(array)
    ds = group.create_dataset(name, data=array, maxshape=(None,) + array.shape[1:], chunks=True)
    for k, v in (attrs or {}).items():
        ds.attrs[k] = v
    return ds


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))  # no exp overflow


class Curves:
    """Deterministic synthetic metrics for one trajectory (or branch) over steps [start, end)."""

    def __init__(self, rng, steps, layers, diverge_at=None, spike_at=None, nan_at=None,
                 floor=0.02, mx=True, start=0, prefix=None, new_datasets=False):
        self.rng, self.steps, self.layers, self.mx, self.start = rng, steps, layers, mx, start
        self.new_datasets = new_datasets  # clamp debt and the paper-metric shadow series
        self.diverge_at = diverge_at
        t = np.arange(steps, dtype=np.float64)
        loss = np.exp(-t / (steps / 6.0)) + floor
        loss *= np.exp(0.05 * rng.standard_normal(steps))
        if diverge_at is not None:
            # Blow up over ~40 steps to a plateau ~300x the minimum, never to recover.
            ramp = _sigmoid((t - diverge_at - 20) / 5.0)
            loss = loss * (1 - ramp) + ramp * 300 * floor * np.exp(0.3 * rng.standard_normal(steps))
        if spike_at is not None:
            loss[spike_at] *= 500.0   # a recoverable spike (counts under spike_factor 100)
        if prefix is not None:        # a branch shares the baseline's steps before `at`
            loss[:start] = prefix[:start]
        if nan_at is not None:
            loss[nan_at:] = np.nan
            loss = loss[:nan_at + 1]
        self.full_loss = loss.astype(np.float32)   # indexed by absolute step
        self.end = len(loss)

    @property
    def loss_all(self):
        """What the file stores: a branch's loss_all holds the steps from `at` on."""
        return self.full_loss[self.start:]

    def rows(self, log_every, bias_every):
        rng, L = self.rng, self.layers
        first = -(-self.start // log_every) * log_every   # first multiple of log_every >= start
        step = np.arange(first, self.end, log_every, dtype=np.int64)
        n = len(step)
        t = step.astype(np.float64)
        x = t / self.steps
        loss = self.full_loss[step].astype(np.float64)
        trouble = np.zeros(n) if self.diverge_at is None else _sigmoid((t - self.diverge_at + 250) / 90)
        rows = {
            "step": step, "loss": loss,
            "lr": np.full(n, 6e-4),
            "grad_norm": np.sqrt(np.nan_to_num(loss, nan=1e3)) * (1 + 0.1 * rng.standard_normal(n) ** 2),
            "update_norm": 6e-4 * np.sqrt(1 + 0.5 * x),
            "weight_norm": 40 + 5 * x,
        }
        layer = np.arange(L)[None, :]
        mean = 1.0 - 0.1 * x[:, None] + 0.02 * layer
        std = 0.08 * np.exp(-2.5 * x[:, None]) + 0.01
        rows.update(gamma_mean=mean, gamma_std=std, gamma_min=mean - 3 * std, gamma_max=mean + 3 * std)
        gamma_lb = 0.05 + 0.5 * x[:, None] / (1 + layer) + 0.4 * trouble[:, None] * (layer == 0)
        gamma_lb = np.clip(gamma_lb + 0.01 * rng.standard_normal((n, L)), 0, 1)
        act_lb = np.clip(0.004 + 0.004 * x[:, None] * (1 + layer) / L + 0.01 * trouble[:, None], 0, 1)
        ln_lb = np.clip(0.008 + 0.006 * x[:, None] + 0.015 * trouble[:, None] * (1 + layer) / L, 0, 1)
        small = np.full((n, L), 1e-4)
        for tensor, lb in (("gamma", gamma_lb), ("beta", 0.5 * small + 0.002), ("ln_out", ln_lb),
                           ("act_out", act_lb), ("grad_out", small), ("grad_hidden", small)):
            rows[S.lastbin_name(tensor)] = lb
            rows[S.lastbin_name(tensor, S.SUFFIX_CLAMPED)] = 0.6 * lb
        if self.mx:
            shadow = (step % bias_every) == 0
            ratio = 0.55 * np.exp(-4 * x) + 0.25 + 1.9 * trouble + 0.03 * rng.standard_normal(n)
            ratio = np.abs(ratio)
            cosine = np.clip(1 / np.sqrt(1 + ratio ** 2) - 0.3 * trouble, -1, 1)
            rows[S.DS_BIAS_RATIO] = np.where(shadow, ratio, np.nan)
            rows[S.DS_COSINE] = np.where(shadow, cosine, np.nan)
            rows[S.DS_BIAS_RATIO_AVG] = _running_average(rows[S.DS_BIAS_RATIO], 0.99)
            groups = 5 * L
            rows["bias_ratio_group"] = np.where(shadow[:, None], ratio[:, None] * (1 + 0.1 * np.arange(groups)), np.nan)
            rows["cosine_group"] = np.where(shadow[:, None], cosine[:, None] * np.ones(groups), np.nan)
            rows["cross_ratio"] = np.where(shadow, ratio + 0.3 * x, np.nan)
            rows["cross_cosine"] = np.where(shadow, cosine * 0.9, np.nan)
            rows["weight_distance"] = np.where(shadow, 0.02 * x + trouble, np.nan)
            if self.new_datasets:
                sq = rows["cross_ratio"] ** 2
                rows[S.DS_CROSS_RATIO_SQ] = sq
                rows[S.DS_CROSS_RATIO_SQ_AVG] = _running_average(sq, 0.99)
                gbar = np.sqrt(np.nan_to_num(loss, nan=1e3)) * 2.0
                rows["gbar_norm"] = np.where(shadow, gbar, np.nan)
                rows["gtilde_norm"] = np.where(shadow, 0.45 * gbar, np.nan)
                rows["eps_norm"] = np.where(shadow, ratio * gbar, np.nan)
                rows["shadow_loss"] = np.where(shadow, loss * (1.0 + 0.1 * trouble), np.nan)
                # eps split along g-bar (cosine-like share) and across it: par^2 + perp^2 = eps^2
                rows["eps_par"] = rows["eps_norm"] * (cosine - 1.0) * 0.5
                rows["eps_perp"] = np.sqrt(np.maximum(rows["eps_norm"] ** 2 - rows["eps_par"] ** 2, 0.0))
                for name, base in (("eps_norm_group", rows["eps_norm"]), ("gbar_norm_group", rows["gbar_norm"]),
                                   ("gtilde_norm_group", rows["gtilde_norm"])):
                    rows[name] = base[:, None] * np.ones(groups) / np.sqrt(groups)
        if self.new_datasets:
            for tensor, scale in (("gamma", 1.0), ("beta", 0.1)):
                gap = scale * (0.01 + 0.002 * layer + 0.08 * trouble[:, None] * (layer == 0))
                rows[f"{tensor}_gap_mean"] = np.broadcast_to(gap, (n, L)).copy()
                rows[f"{tensor}_gap_max"] = 3.0 * rows[f"{tensor}_gap_mean"]
                above = 0.001 * x[:, None] + scale * 0.3 * trouble[:, None] * (layer == 0)
                rows[f"{tensor}_above_frac"] = np.clip(np.broadcast_to(above, (n, L)), 0, 1)
            rows["weight_gap_mean"] = np.full((n, 2 * L), 0.02) + 0.01 * x[:, None]
            rows["weight_above_frac"] = np.full((n, 2 * L), 1e-4)
        return rows

    def curvature(self, every, lr):
        """The curvature datasets on their own axis: every `every` steps from the group's start."""
        first = -(-self.start // every) * every
        step = np.arange(first, self.end, every, dtype=np.int64)
        t = step.astype(np.float64)
        x = t / self.steps
        trouble = np.zeros(len(step)) if self.diverge_at is None else \
            _sigmoid((t - self.diverge_at + 250) / 90)
        hessian = 40.0 * (1 + x) + 400.0 * trouble
        precond = 2e4 * (1 + x) + 6e4 * trouble     # lr * precond crosses 38 near divergence
        s = lr * precond
        ratio = 0.5 + 1.5 * trouble
        return {S.DS_CURVATURE_STEP: step, S.DS_HESSIAN_LMAX: hessian, S.DS_PRECOND_LMAX: precond,
                S.DS_PRECOND_THRESHOLD: np.full(len(step), 38.0 / lr),
                S.DS_EQ10_LHS: np.abs(1 - s) + s * ratio if self.mx else np.full(len(step), np.nan),
                "hessian_resid": np.full(len(step), 1e-4)}


def _running_average(values, beta):
    """Bias-corrected EMA over the finite entries (NaN rows keep NaN), as log.bias_avg_beta."""
    out, acc, weight = np.full(len(values), np.nan), 0.0, 0.0
    for i in np.nonzero(np.isfinite(values))[0]:
        acc, weight = beta * acc + (1 - beta) * values[i], beta * weight + (1 - beta)
        out[i] = acc / weight
    return out


def param_group_names(layers):
    return [f"layer{k}.{p}" for k in range(layers) for p in ("gamma", "beta", "W1", "W2", "b2")]


def weight_names(layers):
    return [f"layer{k}.{w}" for k in range(layers) for w in ("W1", "W2")]


def _write_group(group, curves, layers, *, log_every, bias_every, quantized, summary, config,
                 curvature_every=0, lr=6e-4):
    rows = curves.rows(log_every, bias_every)
    if curvature_every:
        rows.update(curves.curvature(curvature_every, lr))
    names = param_group_names(layers)
    group.attrs[S.ATTR_PARAM_GROUPS] = names
    group.attrs[S.ATTR_LAYERS] = np.int64(layers)
    for name, array in rows.items():
        attrs = {}
        if name in S.LASTBIN_DATASETS:
            attrs[S.DATASET_ATTR_QUANTIZED] = np.int64(1 if quantized else 0)
        if name in S.MX_GROUP_DATASETS + S.MX_GROUP_DATASETS_V2:
            attrs[S.DATASET_ATTR_NAMES] = names
        if name in S.WEIGHT_DEBT_DATASETS:
            attrs[S.DATASET_ATTR_NAMES] = weight_names(layers)
        _write_rows(group, name, array, attrs)
    _write_rows(group, S.DS_LOSS_ALL, curves.loss_all)
    if summary:
        # Summary attributes as the trainer would write them once the trajectory ends.
        traj = S._load_group(group, group.name.rsplit("/", 1)[-1],
                             "branch" if S.ATTR_AT in group.attrs else "trajectory")
        values = metrics.summarize(traj, config)
        for key in S.SUMMARY_ATTRS:
            if key == S.SUM_MAX_BIAS_RATIO and not curves.mx:
                continue
            v = values[key]
            group.attrs[key] = np.int64(v) if isinstance(v, int) else np.float64(v)


V2_LOG_KEYS = {"curvature_every": 0, "curvature_iters": 20, "probe_batch": 0}


def write_run(path, *, steps=400, log_every=10, bias_every=20, depth=4, width=512, lr=6e-4,
              seed=0, mx_diverge_at=None, fp32_spike_at=None, mx_nan_at=None, branches=(),
              status=None, killed=None, weight="mxfp8_e4m3", extra_config=None, noise_seed=None,
              arms=None, new_datasets=False, curvature_every=0, fp32_diverge_at=None):
    """Write one run file. `branches`: dicts {name, at, apply, diverge_at, from} (diverge_at
    None = the branch stays stable; from: the arm it forks from, only written when given).
    `killed`: None, "ragged" (datasets of different lengths, no summaries, status running) or
    "zeros" (trailing rows extended but never written).

    `arms`: None writes a file from before arms (`trajectories/mx`, the MX curve shaped by
    mx_diverge_at / mx_nan_at). A list of dicts {name, diverge_at, nan_at, set (dict) or
    apply} writes a multi-arm file: root attribute `arms`, one group per arm with attributes
    `arm`, `policy`, `patch`, and the `arms:` list in config_yaml, all as the trainer writes
    them (`apply: none` and `set: {}` where the arm has no preset or no items; `policy` every
    field, the arm's `set:` applied). `new_datasets` adds the clamp-debt and shadow-norm rows;
    `curvature_every` > 0 the curvature datasets. `fp32_diverge_at` makes the FP32 trajectory
    diverge (the FP32 curve depends only on the rng's seed and the shape arguments, so runs
    that share `noise_seed` or `seed` and differ only in MX share it, as in real runs)."""
    rng = np.random.default_rng(seed if noise_seed is None else noise_seed)
    overrides = {"steps": steps, "seed": seed, "model.depth": depth, "model.width": width,
                 "optimizer.lr": lr, "log.log_every": log_every, "log.bias_every": bias_every,
                 "precision.weight": weight}
    overrides.update(extra_config or {})
    interventions = []
    for b in branches:
        entry = {"name": b["name"], "at": b["at"], "apply": b.get("apply", "to_fp32"),
                 "set": _flow(b.get("set"))}
        if "from" in b:
            entry["from"] = b["from"]
        interventions.append(entry)
    arm_entries = None
    if arms is not None:
        arm_entries = [{"name": a["name"], "apply": a.get("apply", "none"),
                        "set": _flow(a.get("set"))} for a in arms]
    text = config_yaml(overrides, interventions, arm_entries)
    if new_datasets or curvature_every or arms is not None:  # a config from after schema 1
        log = "".join(f"  {k}: {curvature_every if k == 'curvature_every' else v}\n"
                      for k, v in V2_LOG_KEYS.items())
        text = text.replace("log:\n", "log:\n" + log, 1)
    config = {"log.spike_factor": 100.0, "log.divergence_factor": 10.0}
    arm_specs = arms if arms is not None else [
        {"name": S.TRAJ_MX, "diverge_at": mx_diverge_at, "nan_at": mx_nan_at}]
    if status is None:
        failed = any(a.get("diverge_at") is not None or a.get("nan_at") is not None for a in arm_specs)
        status = "diverged" if failed else "complete"
    if killed:
        status = S.STATUS_RUNNING
    summaries = not killed
    common = dict(log_every=log_every, bias_every=bias_every, summary=summaries, config=config,
                  curvature_every=curvature_every, lr=lr)
    with h5py.File(path, "w") as f:
        a = f.attrs
        a["schema_version"] = np.int64(S.SCHEMA_VERSION)
        a["mxlab_version"] = "0.1.0"
        a["git_commit"] = "0de69b5+dirty"
        a["build_type"] = "Release"
        a["device"] = "cpu"
        a["cuda_runtime"] = ""
        a["cuda_driver"] = ""
        a["cublas"] = ""
        a["math_mode"] = "IEEE FP32 (Eigen, no TF32)"
        a["seed"] = np.uint64(seed)
        a["run_id"] = hashlib.sha256(text.encode()).hexdigest()[:12]
        a["config_yaml"] = text
        a["start_time"] = "2025-01-01T00:00:00Z"
        a["end_time"] = "" if killed else "2025-01-01T00:05:00Z"
        a["status"] = status
        a["steps"] = np.int64(steps)
        if arms is not None:
            a[S.ATTR_ARMS] = [arm["name"] for arm in arms]
        traj = f.create_group(S.GROUP_TRAJECTORIES)
        fp32 = Curves(rng, steps, depth, spike_at=fp32_spike_at, diverge_at=fp32_diverge_at,
                      mx=False, new_datasets=new_datasets)
        g = traj.create_group(S.TRAJ_FP32)
        if arms is not None:
            g.attrs[S.ATTR_POLICY] = "fp32"
        _write_group(g, fp32, depth, quantized=False, **common)
        full_loss = {}
        for spec in arm_specs:
            curves = Curves(rng, steps, depth, diverge_at=spec.get("diverge_at"),
                            nan_at=spec.get("nan_at"), floor=0.025, new_datasets=new_datasets)
            g = traj.create_group(spec["name"])
            if arms is not None:
                g.attrs[S.ATTR_ARM] = spec["name"]
                g.attrs[S.ATTR_POLICY] = policy_text(text, spec.get("set"))
                g.attrs[S.ATTR_PATCH] = patch_text(spec)
            _write_group(g, curves, depth, quantized=True, **common)
            full_loss[spec["name"]] = curves.full_loss
        if branches:
            bgroup = f.create_group(S.GROUP_BRANCHES)
            for b in branches:
                g = bgroup.create_group(b["name"])
                g.attrs[S.ATTR_AT] = np.int64(b["at"])
                g.attrs[S.ATTR_PATCH] = b.get("patch", "precision: fp32\n")
                if "from" in b:
                    g.attrs[S.ATTR_FROM] = b["from"]
                curves = Curves(rng, steps, depth, diverge_at=b.get("diverge_at"), floor=0.025,
                                start=b["at"], prefix=full_loss[b.get("from", S.TRAJ_MX)],
                                new_datasets=new_datasets)
                _write_group(g, curves, depth, quantized=True, **common)
        first_arm = arm_specs[0]["name"]
        if killed == "ragged":
            for gname, cut in ((first_arm, {"loss": 2, "gamma_lastbin": 3, "bias_ratio": 1}),
                               ("fp32", {"step": 1})):
                grp = f[S.GROUP_TRAJECTORIES][gname]
                for ds_name, k in cut.items():
                    ds = grp[ds_name]
                    ds.resize(ds.shape[0] - k, axis=0)
        elif killed == "zeros":
            for gname in (S.TRAJ_FP32, first_arm):
                grp = f[S.GROUP_TRAJECTORIES][gname]
                for name, ds in grp.items():
                    if name != S.DS_LOSS_ALL:
                        ds.resize(ds.shape[0] + 2, axis=0)  # fill value 0, as h5py leaves it
    return path


def write_signal_run(path, groups, *, steps=1000, log_every=10, curvature_every=0, seed=0):
    """A small run file with hand-made series, for tests with known answers (warn, survival).

    `groups`: dicts {name, kind ("trajectory", default, or "branch"), divergence (step or
    None), nonfinite (step or None), steps_run (default: the run's steps, from `at` for a
    branch), at, from, rows: {dataset: f(step array) -> values}, curvature: {dataset: f}}.
    The FP32 group is one of them (name "fp32") or absent. Summary attributes are written
    from the given steps, so nothing is recomputed from losses."""
    text = config_yaml({"steps": steps, "seed": seed, "log.log_every": log_every}, arms=[
        {"name": g["name"]} for g in groups if g.get("kind", "trajectory") == "trajectory"
        and g["name"] != S.TRAJ_FP32])
    with h5py.File(path, "w") as f:
        f.attrs["schema_version"] = np.int64(S.SCHEMA_VERSION)
        f.attrs["run_id"] = hashlib.sha256((text + path).encode()).hexdigest()[:12]
        f.attrs["config_yaml"] = text
        f.attrs["status"] = "complete"
        f.attrs["steps"] = np.int64(steps)
        f.attrs[S.ATTR_ARMS] = [g["name"] for g in groups if g.get("kind", "trajectory") ==
                                "trajectory" and g["name"] != S.TRAJ_FP32]
        for g in groups:
            kind = g.get("kind", "trajectory")
            parent = f.require_group(S.GROUP_BRANCHES if kind == "branch" else S.GROUP_TRAJECTORIES)
            grp = parent.create_group(g["name"])
            start = g["at"] if kind == "branch" else 0
            if kind == "branch":
                grp.attrs[S.ATTR_AT] = np.int64(g["at"])
                grp.attrs[S.ATTR_PATCH] = "{}"
                grp.attrs[S.ATTR_FROM] = g.get("from", S.TRAJ_MX)
            elif g["name"] != S.TRAJ_FP32:
                grp.attrs[S.ATTR_ARM] = g["name"]
                grp.attrs[S.ATTR_PATCH] = "{}"
            steps_run = g.get("steps_run", steps - start)
            first = -(-start // log_every) * log_every
            step = np.arange(first, start + steps_run, log_every, dtype=np.int64)
            _write_rows(grp, S.DS_STEP, step)
            _write_rows(grp, S.DS_LOSS, np.full(len(step), 0.1))
            for name, fn in g.get("rows", {}).items():
                _write_rows(grp, name, np.asarray(fn(step), dtype=np.float64))
            if g.get("curvature"):
                cstep = np.arange(-(-start // curvature_every) * curvature_every,
                                  start + steps_run, curvature_every, dtype=np.int64)
                _write_rows(grp, S.DS_CURVATURE_STEP, cstep)
                for name, fn in g["curvature"].items():
                    _write_rows(grp, name, np.asarray(fn(cstep), dtype=np.float64))
            attrs = {S.SUM_STEPS_RUN: steps_run,
                     S.SUM_DIVERGENCE: g.get("divergence") if g.get("divergence") is not None else S.NO_STEP,
                     S.SUM_FIRST_NONFINITE: g.get("nonfinite") if g.get("nonfinite") is not None else S.NO_STEP,
                     S.SUM_SPIKE_COUNT: 0}
            for key, value in attrs.items():
                grp.attrs[key] = np.int64(value)
            for key in (S.SUM_SPIKE_SCORE, S.SUM_FINAL_LOSS, S.SUM_MIN_LOSS, S.SUM_MAX_GAMMA_LASTBIN):
                grp.attrs[key] = np.float64(0.1)
    return path


def write_demo(out, steps=6000):
    """The demo set: the shapes of the paper's figures 3-5 and a 2x2 sweep (one cell missing
    in `sweep_missing`)."""
    os.makedirs(out, exist_ok=True)
    div = int(steps * 0.85)
    early, late = int(steps * 0.75), div - 10
    paths = {
        "stable": write_run(os.path.join(out, "stable.h5"), steps=steps, seed=1),
        "diverging": write_run(os.path.join(out, "diverging.h5"), steps=steps, seed=2,
                               mx_diverge_at=div),
        "branches": write_run(os.path.join(out, "branches.h5"), steps=steps, seed=3,
                              mx_diverge_at=div, branches=[
                                  {"name": "fp32_early", "at": early, "apply": "to_fp32"},
                                  {"name": "skip_ln_quant_early", "at": early,
                                   "apply": "skip_ln_quant", "diverge_at": int(steps * 0.95)},
                                  {"name": "fp32_late", "at": late, "apply": "to_fp32",
                                   "diverge_at": div + int(steps * 0.05)},
                                  {"name": "bump_exponent_late", "at": late,
                                   "apply": "bump_exponent", "diverge_at": div + 5}]),
        "killed": write_run(os.path.join(out, "killed.h5"), steps=steps, seed=4, killed="ragged"),
    }
    for sub, skip in (("sweep", None), ("sweep_missing", (256, 4))):
        d = os.path.join(out, sub)
        os.makedirs(d, exist_ok=True)
        for i, (width, depth) in enumerate([(256, 2), (256, 4), (512, 2), (512, 4)]):
            if (width, depth) == skip:
                continue
            diverge = int(steps * 0.6) if (width, depth) == (512, 4) else None
            write_run(os.path.join(d, f"w{width}_L{depth}.h5"), steps=steps // 4, seed=10, noise_seed=10 + i,
                      width=width, depth=depth, mx_diverge_at=diverge and diverge // 4,
                      fp32_spike_at=(steps // 8 if depth == 4 else None))
    paths["sweep"] = os.path.join(out, "sweep")
    # Multi-arm seeds with clamp debt and curvature: for warn, survival.
    d = os.path.join(out, "arms")
    os.makedirs(d, exist_ok=True)
    for seed in range(4):
        at = int(steps * (0.55 + 0.1 * seed))
        arms = [{"name": "floor", "diverge_at": at if seed != 3 else None},
                {"name": "nearest_even", "set": {"rounding": "nearest_even"},
                 "diverge_at": at + steps // 10 if seed == 0 else None},
                {"name": "rceil", "set": {"scale_rule": "rceil"},
                 "diverge_at": at - steps // 20 if seed % 2 else None}]
        write_run(os.path.join(d, f"seed{seed}.h5"), steps=steps, seed=20 + seed, arms=arms,
                  new_datasets=True, curvature_every=max(steps // 100, 1))
    paths["arms"] = d
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write the demo run files into")
    parser.add_argument("--steps", type=int, default=6000)
    args = parser.parse_args()
    for name, p in write_demo(args.out, args.steps).items():
        print(f"{name}: {p}")
