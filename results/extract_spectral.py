#!/usr/bin/env python3
"""Spectral norms of the attention projections from the parameter snapshots of mxlab run files,
in one CSV: the flash-attention study's weight instrument (results/prereg/flash_bf16.md: the paper
traces its explosion through a low-rank error that accumulates in W_Q and W_K and raises their
spectral norms). The trainer does not log them; the study stores every trajectory's parameters
every `log.snapshot_every` steps, and this script reads them on the GPU machine, where the run
files stay, so only the CSV comes back.

  python3 results/extract_spectral.py OUT.csv RUN.h5 [RUN.h5 ...]    (OUT.csv.gz: gzip-compressed)

Every snapshot `snapshots/<trajectory>/step_<S>/layer<k>.Wqkv` ([3d x d], rows Q, K, V; lab/model
README "The model") and `layer<k>.Wo` gives four matrices W_Q, W_K, W_V, W_O [d x d] (all heads
together), one row each: run_id, seed, lr, trajectory, step, layer, matrix, then
  sigma_max        the largest singular value (exact, numpy's SVD in float64);
  fro              the Frobenius norm;
and, for every trajectory but `fp32` when the file has the FP32 trajectory's snapshot at the same
step (empty cells otherwise), of the difference D = W(trajectory) - W(fp32) at that step (the
error the trajectory has accumulated against exact arithmetic from the same initial weights):
  diff_fro         ||D||_F;
  diff_sigma1      its largest singular value;
  diff_rank1       sigma_1(D)^2 / ||D||_F^2, the share of D in its top singular direction
                   (1: D is rank one, the paper's "low-rank error"; empty when D = 0);
  diff_dir_cos     |u1 . u1'| |v1 . v1'|, the cosine between D's top singular direction u1 v1^T
                   and that of the same trajectory's previous snapshot (1: the error keeps
                   growing along one direction; empty at the first snapshot or when D = 0).
A matrix with a non-finite entry (a trajectory that has blown up: its last snapshot holds NaN or
inf) has its row with empty sigma_max and fro, and so has a difference with a non-finite entry (its
diff_* cells empty; the next snapshot has no previous direction). Trajectories and steps in sorted
order; a run file without snapshots adds no row. Nothing is written when no run file has a
snapshot of an attention layer.
"""
import math
import re
import sys

import h5py
import numpy as np

from extract_loss_blocks import _lr, _text, run_extractor  # results/ is on sys.path: this script's folder

COLUMNS = ("run_id", "seed", "lr", "trajectory", "step", "layer", "matrix", "sigma_max", "fro",
           "diff_fro", "diff_sigma1", "diff_rank1", "diff_dir_cos")
MATRICES = ("W_Q", "W_K", "W_V", "W_O")
LAYER = re.compile(r"^layer(\d+)\.Wqkv$")


def _cell(x):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else repr(float(x))


def attention_matrices(step_group):
    """{(layer, matrix): float64 array [d x d]} of one snapshot step's attention projections."""
    out = {}
    for name in step_group:
        m = LAYER.match(name)
        if not m:
            continue
        k = int(m.group(1))
        w = np.asarray(step_group[name][()], dtype=np.float64)
        d = w.shape[1]
        if w.shape != (3 * d, d):
            raise ValueError(f"{name}: shape {w.shape}, expected [3d x d]")
        out[(k, "W_Q")], out[(k, "W_K")], out[(k, "W_V")] = w[:d], w[d:2 * d], w[2 * d:]
        wo = f"layer{k}.Wo"
        if wo in step_group:
            out[(k, "W_O")] = np.asarray(step_group[wo][()], dtype=np.float64)
    return out


def top_direction(m):
    """(sigma_1, u1, v1) of a matrix (numpy's SVD, float64)."""
    u, s, vt = np.linalg.svd(m, full_matrices=False)
    return float(s[0]), u[:, 0], vt[0]


def rows_of(path):
    """The CSV rows (dicts of COLUMNS) of one run file's snapshots."""
    out = []
    with h5py.File(path, "r") as f:
        if "snapshots" not in f:
            return out
        rid, seed, lr = _text(f.attrs["run_id"]), int(f.attrs["seed"]), _lr(_text(f.attrs["config_yaml"]))
        snaps = f["snapshots"]
        trajectories = sorted(t for t in snaps if isinstance(snaps[t], h5py.Group))
        steps_of = {t: sorted(int(s[len("step_"):]) for s in snaps[t] if s.startswith("step_")) for t in trajectories}
        fp32 = {s: attention_matrices(snaps["fp32"][f"step_{s}"]) for s in steps_of.get("fp32", [])}
        for t in trajectories:
            previous = {}  # (layer, matrix) -> (u1, v1) of the previous snapshot's difference
            for s in steps_of[t]:
                mats = fp32[s] if t == "fp32" and s in fp32 else attention_matrices(snaps[t][f"step_{s}"])
                for (k, name) in sorted(mats, key=lambda km: (km[0], MATRICES.index(km[1]))):
                    w = mats[(k, name)]
                    finite = bool(np.isfinite(w).all())  # numpy's SVD does not converge on NaN or inf
                    row = {"run_id": rid, "seed": seed, "lr": lr, "trajectory": t, "step": s, "layer": k,
                           "matrix": name, "sigma_max": top_direction(w)[0] if finite else None,
                           "fro": float(np.linalg.norm(w)) if finite else None,
                           "diff_fro": None, "diff_sigma1": None, "diff_rank1": None, "diff_dir_cos": None}
                    if t != "fp32" and s in fp32 and (k, name) in fp32[s]:
                        diff = w - fp32[s][(k, name)]
                        if not np.isfinite(diff).all():
                            previous.pop((k, name), None)
                            out.append(row)
                            continue
                        fro = float(np.linalg.norm(diff))
                        row["diff_fro"] = fro
                        if fro > 0:
                            s1, u1, v1 = top_direction(diff)
                            row["diff_sigma1"], row["diff_rank1"] = s1, (s1 / fro) ** 2
                            if (k, name) in previous:
                                pu, pv = previous[(k, name)]
                                row["diff_dir_cos"] = abs(float(u1 @ pu)) * abs(float(v1 @ pv))
                            previous[(k, name)] = (u1, v1)
                        else:
                            row["diff_sigma1"] = 0.0
                            previous.pop((k, name), None)
                    out.append(row)
    return out


def main(argv):
    keep = ("run_id", "seed", "lr", "trajectory", "step", "layer", "matrix")
    return run_extractor(argv, __doc__, "extract_spectral", rows_of, COLUMNS,
                         lambda r: [r[c] if c in keep else _cell(r[c]) for c in COLUMNS], "rows", "attention snapshot")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
