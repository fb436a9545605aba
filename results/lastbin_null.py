#!/usr/bin/env python3
"""How many elements of an ordinary block land in the last E4M3 bin under the floor scale?

The paper (Fig. 3) reads "~1 % of activations in the last quantization bin" as a symptom, and
results/README.md §2 measured ~0.9-1.2 % in every run. This script gives the null: blocks of 32
i.i.d. values from smooth, unimodal distributions, with no training at all.

MX with the floor rule (OCP MX v1.0): X = 2^(floor(log2 max|x|) - emax), emax = 8 for E4M3, so a
block's largest magnitude sits in [256, 512) X. E4M3's codes there are 256, 288, ..., 448
(max_normal; 480 is NaN), 32 apart, so |x| / X >= 432 becomes +-448 (432 is a tie; nearest-even
and ties-away both give 448) or is clamped to it: that is the last bin. The count is computed
here with numpy from that definition alone (no mxlab code); with --mxlab BIN (or MXLAB_BINARY)
the same blocks also go through `mxlab quantize --stats`, whose `lastbin_frac` must agree.

Usage: python3 results/lastbin_null.py [--blocks 200000] [--seed 1] [--mxlab BIN]
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

E4M3_EMAX = 8
LAST_BIN_FROM = 432.0  # |x| / X from here on rounds (or clamps) to max_normal = 448


def blocks(kind, n, seed):
    """n blocks of 32 float32 values: gauss N(0, 1), laplace (scale 1), or gelu of N(0, 1)."""
    rng = np.random.default_rng(seed)
    if kind == "laplace":
        return rng.laplace(size=(n, 32)).astype(np.float32)
    x = rng.standard_normal((n, 32)).astype(np.float32)
    if kind == "gelu":
        erf = np.vectorize(math.erf)
        x = (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(np.float32)
    return x


def lastbin_fraction(x):
    """(per-element fraction in the last bin, fraction of blocks with one there) of blocks in rows."""
    amax = np.abs(x).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):  # an all-zero block: no scale, no last bin
        e = np.floor(np.log2(amax.astype(np.float64))) - E4M3_EMAX
        r = np.abs(x.astype(np.float64)) / np.exp2(e)
    last = (r >= LAST_BIN_FROM) & (amax > 0)
    return float(last.mean()), float(last.any(axis=1).mean())


def mxlab_fraction(binary, x):
    """mxlab quantize --stats' last-bin fraction of the same blocks (mxfp8_e4m3, floor, nearest_even),
    from the element count it prints (exact)."""
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "x.npy"), os.path.join(d, "q.npy")
        np.save(src, x)
        out = subprocess.run([binary, "quantize", "--format", "mxfp8_e4m3", "--scale-rule", "floor",
                              "--rounding", "nearest_even", "--in", src, "--out", dst, "--stats"],
                             check=True, capture_output=True, text=True).stdout
    return int(re.search(r"lastbin_frac\s+\S+\s+\((\d+) elements", out).group(1)) / x.size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mxlab", default=os.environ.get("MXLAB_BINARY"),
                    help="also run mxlab quantize --stats on the same blocks (default: $MXLAB_BINARY)")
    a = ap.parse_args(argv)
    if a.blocks <= 0:
        ap.error("--blocks must be positive")
    print(f"{a.blocks} blocks of 32, MXFP8 E4M3, floor scale, seed {a.seed}")
    print("| values | elements in the last bin | blocks with one there | mxlab quantize --stats |")
    print("|---|---|---|---|")
    for kind in ("gauss", "laplace", "gelu"):
        x = blocks(kind, a.blocks, a.seed)
        el, bl = lastbin_fraction(x)
        mx = f"{100 * mxlab_fraction(a.mxlab, x):.3f} %" if a.mxlab and os.path.exists(a.mxlab) else "–"
        print(f"| {kind} | {100 * el:.3f} % | {100 * bl:.1f} % | {mx} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
