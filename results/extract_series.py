#!/usr/bin/env python3
"""Compact CSVs of the series results/README.md's instrument figures need, from mxlab run files
(run on the machine that holds them; the figures are then drawn from these CSVs):

  OUT/series_<run_id>.csv     one row per logged step and trajectory/branch: loss, grad_norm,
                              bias_ratio_avg, cosine, cross_ratio_sq_avg, max over layers of
                              gamma_lastbin, gamma_above_frac, gamma_gap_mean
  OUT/curvature_<run_id>.csv  one row per curvature measurement: hessian_lmax, precond_lmax,
                              precond_threshold, eq10_lhs, probe_loss, hessian_resid, precond_resid
  OUT/runs.csv                run id, seed, lr, trajectory, at, from, divergence_step, first_nonfinite_step

Usage: python3 results/extract_series.py OUT RUN.h5 [RUN.h5 ...]
"""
import csv
import os
import sys

import h5py
import numpy as np

ROW = ("loss", "grad_norm", "bias_ratio_avg", "cosine", "cross_ratio_sq_avg")
PER_LAYER_MAX = ("gamma_lastbin", "gamma_above_frac", "gamma_gap_mean")
CURV = ("hessian_lmax", "precond_lmax", "precond_threshold", "eq10_lhs", "probe_loss", "hessian_resid",
        "precond_resid")


def groups(f):
    for top in ("trajectories", "branches"):
        if top in f:
            for name in f[top]:
                yield top, name, f[top][name]


def col(g, name, n):
    if name not in g:
        return np.full(n, np.nan)
    return np.asarray(g[name][:n], dtype=float)


def main(out, paths):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "runs.csv"), "w", newline="") as rf:
        runs = csv.writer(rf)
        runs.writerow(["run_id", "seed", "lr", "trajectory", "kind", "at", "from", "divergence_step",
                       "first_nonfinite_step", "steps_run"])
        for path in paths:
            with h5py.File(path, "r") as f:
                rid = f.attrs["run_id"]
                rid = rid.decode() if isinstance(rid, bytes) else str(rid)
                cfg = f.attrs["config_yaml"]
                cfg = cfg.decode() if isinstance(cfg, bytes) else str(cfg)
                lr = next((l.split(":")[1].strip() for l in cfg.splitlines() if l.strip().startswith("lr:")), "")
                seed = int(f.attrs["seed"])
                with open(os.path.join(out, f"series_{rid}.csv"), "w", newline="") as sf, \
                        open(os.path.join(out, f"curvature_{rid}.csv"), "w", newline="") as cf:
                    sw, cw = csv.writer(sf), csv.writer(cf)
                    sw.writerow(("trajectory", "step") + ROW + tuple(f"{p}_max" for p in PER_LAYER_MAX))
                    cw.writerow(("trajectory", "curvature_step") + CURV)
                    for top, name, g in groups(f):
                        a = dict(g.attrs)
                        runs.writerow([rid, seed, lr, name, "branch" if top == "branches" else "trajectory",
                                       int(a.get("at", 0)), str(a.get("from", "")), int(a.get("divergence_step", -1)),
                                       int(a.get("first_nonfinite_step", -1)), int(a.get("steps_run", 0))])
                        if "step" in g:
                            steps = g["step"][:]
                            n = len(steps)
                            cols = [col(g, c, n) for c in ROW]
                            for p in PER_LAYER_MAX:
                                cols.append(np.nanmax(g[p][:n], axis=1) if p in g else np.full(n, np.nan))
                            for i in range(n):
                                sw.writerow([name, int(steps[i])] + [repr(float(c[i])) for c in cols])
                        if "curvature_step" in g:
                            steps = g["curvature_step"][:]
                            cols = [col(g, c, len(steps)) for c in CURV]
                            for i in range(len(steps)):
                                cw.writerow([name, int(steps[i])] + [repr(float(c[i])) for c in cols])


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
