#!/usr/bin/env python3
"""The per-layer attention instruments of mxlab run files, in one CSV: what the flash-attention
study (results/prereg/flash_bf16.md, "Mechanism") reads of its trajectories, written on the GPU
machine where the run files stay, so only the CSV comes back.

  python3 results/extract_flash_instruments.py OUT.csv RUN.h5 [RUN.h5 ...]    (OUT.csv.gz: gzip-compressed)

One row per logged step and attention layer of every trajectory (`trajectories/<name>`; branches
are left out) of every run file with attention blocks: run_id, seed, lr, trajectory, step, layer,
then the datasets of lab/train/SCHEMA.md, "Attention networks only":
  attn_logit_max           the layer's largest scaled attention logit (every trajectory);
  attn_multi_max_frac      rows of S whose maximum is attained more than once (flash only);
  attn_multi_one_frac      rows with more than one bf16 P-bar = 1 (flash only);
  attn_delta_bias          sum over the rows of delta_lp - delta_hp (flash only);
  attn_delta_bias_cumsum   its running sum over the logged rows (flash only);
  attn_wq_spec, attn_wk_spec, attn_wv_spec   spectral norms of the layer's W_Q, W_K, W_V (every
                           trajectory; files from before these datasets: empty cells);
  attn_dwq_err_cos         cosine between this and the previous logged shadow step's W_Q gradient
                           error (MX/flash arms, rows with a shadow pass; else empty).
A value that is NaN in the file (a trajectory whose attention is exact has no flash instrument) is
an empty cell; numbers have 9 significant digits (float64 datasets of float32 arithmetic). A run
file without attention layers adds no row; nothing is written when none has any.
"""
import math
import sys

import h5py
import numpy as np

from extract_loss_blocks import _lr, _text, run_extractor  # results/ is on sys.path: this script's folder

INSTRUMENTS = ("attn_logit_max", "attn_multi_max_frac", "attn_multi_one_frac", "attn_delta_bias",
               "attn_delta_bias_cumsum", "attn_wq_spec", "attn_wk_spec", "attn_wv_spec", "attn_dwq_err_cos")
COLUMNS = ("run_id", "seed", "lr", "trajectory", "step", "layer") + INSTRUMENTS


def _cell(x):
    x = float(x)
    return "" if math.isnan(x) else f"{x:.9g}"


def rows_of(path):
    """The CSV rows (lists in COLUMNS order) of one run file."""
    out = []
    with h5py.File(path, "r") as f:
        if "trajectories" not in f:
            return out
        rid, seed, lr = _text(f.attrs["run_id"]), int(f.attrs["seed"]), _lr(_text(f.attrs["config_yaml"]))
        for name in sorted(f["trajectories"]):
            g = f["trajectories"][name]
            if "attn_logit_max" not in g:
                continue
            steps = g["step"][:]
            data = {k: (g[k][:] if k in g else np.full((len(steps), g["attn_logit_max"].shape[1]), np.nan))
                    for k in INSTRUMENTS}
            for i, s in enumerate(steps):
                for layer in range(data["attn_logit_max"].shape[1]):
                    out.append([rid, seed, lr, name, int(s), layer] + [_cell(data[k][i, layer]) for k in INSTRUMENTS])
    return out


def main(argv):
    return run_extractor(argv, __doc__, "extract_flash_instruments", rows_of, COLUMNS, lambda r: r, "rows",
                         "attention layer")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
