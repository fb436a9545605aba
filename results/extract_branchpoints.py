#!/usr/bin/env python3
"""The state at every branch point of mxlab run files, in one CSV: what E2 of
results/prereg/why_mx.md reports descriptively at each branch point (lambda_max(H),
lambda_max(P^-1 H) and Adam v's median and quantiles), read on the GPU machine where the run
files stay (experiments/paper/run_why_mx.sh calls it).

  python3 results/extract_branchpoints.py OUT.csv RUN.h5 [RUN.h5 ...]

One row per branch (branches/<name>) of every run file: run_id, seed, lr, branch, parent (the
trajectory it forked from: its `from`, `mx` in files without it), at (its first step), then
  parent_hessian_lmax, parent_precond_lmax, parent_precond_threshold
      the parent's curvature row at step `at` (trajectories/<parent>/curvature_step, with
      log.curvature_every a divisor of `at`): the largest eigenvalue of the Hessian, of P^-1 H
      (Adam's preconditioned sharpness) and its edge-of-stability threshold (lab/train/SCHEMA.md);
  branch_hessian_lmax, branch_precond_lmax
      the branch's own row at `at` (the state it starts from: the parent's, after its patch, e.g.
      gamma and beta snapped);
  v_count, v_min, v_q01, v_q10, v_q25, v_median, v_q75, v_q90, v_q99, v_max
      Adam's second moment v (as stored, without bias correction) over every parameter of the
      parent's snapshot at `at` (snapshots/<parent>/step_<at>/v/<group>, written with
      log.snapshot_optimizer for every branch source), quantiles by numpy's default (linear).
A value the file lacks (no curvature row at `at`, no v in the snapshot) is an empty cell. Nothing
is written when no run file has a branch.
"""
import math
import sys

import h5py
import numpy as np

from extract_loss_blocks import _lr, _text, run_extractor  # results/ is on sys.path: this script's folder

CURVATURE = ("hessian_lmax", "precond_lmax", "precond_threshold")
QUANTILES = (("v_min", 0.0), ("v_q01", 0.01), ("v_q10", 0.10), ("v_q25", 0.25), ("v_median", 0.5),
             ("v_q75", 0.75), ("v_q90", 0.90), ("v_q99", 0.99), ("v_max", 1.0))
COLUMNS = (("run_id", "seed", "lr", "branch", "parent", "at") + tuple(f"parent_{c}" for c in CURVATURE) +
           ("branch_hessian_lmax", "branch_precond_lmax", "v_count") + tuple(q for q, _ in QUANTILES))


def _cell(x):
    """A CSV cell: repr of a float, empty for None or NaN."""
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else repr(x)


def curvature_at(group, step, names):
    """{name: value} of the group's curvature row at `step` (None each when it has none)."""
    out = dict.fromkeys(names)
    if "curvature_step" not in group:
        return out
    steps = group["curvature_step"][:]
    rows = np.nonzero(steps == step)[0]
    if rows.size:
        for n in names:
            if n in group:
                out[n] = float(group[n][rows[0]])
    return out


def v_quantiles(f, parent, step):
    """{column: value} of Adam's v over every parameter of the parent's snapshot at `step`."""
    path = f"snapshots/{parent}/step_{step}/v"
    out = {"v_count": None, **{q: None for q, _ in QUANTILES}}
    if path not in f:
        return out
    v = np.concatenate([np.asarray(f[path][g][()], dtype=np.float64).ravel() for g in sorted(f[path])])
    if v.size == 0:
        return out
    out["v_count"] = int(v.size)
    for (name, q), value in zip(QUANTILES, np.quantile(v, [q for _, q in QUANTILES])):
        out[name] = float(value)
    return out


def rows_of(path):
    """The CSV rows (dicts of COLUMNS) of one run file's branches, by (at, name)."""
    out = []
    with h5py.File(path, "r") as f:
        rid, seed, lr = _text(f.attrs["run_id"]), int(f.attrs["seed"]), _lr(_text(f.attrs["config_yaml"]))
        branches = f["branches"] if "branches" in f else {}
        for name in sorted(branches, key=lambda n: (int(branches[n].attrs.get("at", 0)), n)):
            g = branches[name]
            at = int(g.attrs.get("at", 0))
            parent = _text(g.attrs["from"]) if "from" in g.attrs else "mx"
            row = {"run_id": rid, "seed": seed, "lr": lr, "branch": name, "parent": parent, "at": at}
            pg = f["trajectories"][parent] if "trajectories" in f and parent in f["trajectories"] else {}
            for k, v in curvature_at(pg, at, CURVATURE).items():
                row[f"parent_{k}"] = v
            for k, v in curvature_at(g, at, ("hessian_lmax", "precond_lmax")).items():
                row[f"branch_{k}"] = v
            row.update(v_quantiles(f, parent, at))
            out.append(row)
    return out


def main(argv):
    keep = ("run_id", "seed", "lr", "branch", "parent", "at", "v_count")
    return run_extractor(argv, __doc__, "extract_branchpoints", rows_of, COLUMNS,
                         lambda r: [r[c] if c in keep and r[c] is not None else _cell(r[c]) for c in COLUMNS],
                         "branch points", "branch")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
