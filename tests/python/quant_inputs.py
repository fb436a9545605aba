"""Inputs and comparisons shared by the tests of tests/python (imported by name: pytest puts
this folder on sys.path)."""

import numpy as np

MX = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8"]
RULES = ["floor", "rceil", "ceil", "even", "floor_bump"]
ROUNDINGS = ["nearest_even", "nearest_away", "toward_zero", "stochastic", "noise"]


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_same_bits(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    diff = np.flatnonzero(bits(got) != bits(want))
    assert diff.size == 0, (f"{what}: {diff.size} element(s) differ, first at {diff[0]}: "
                            f"{got.flat[diff[0]]!r} want {want.flat[diff[0]]!r}")


# ---- the inputs --------------------------------------------------------------------------------

def conformance_input():
    """(12, 96): three blocks of 32 a row. Rows of Gaussian data at scales 2^-140 .. 2^100 (the
    tiniest blocks reach E8M0's bottom and float32's subnormals), zero blocks, the conformance
    report's E5M2 block, values next to FLT_MAX, NaN and Inf blocks, exact powers of two and
    the midpoints between MX elements, and random float32 bit patterns."""
    rng = np.random.default_rng(20240917)
    x = np.zeros((12, 96), np.float32)
    for r, e in enumerate([-140, -100, -20, 0, 20, 100]):
        x[r] = (rng.standard_normal(96) * 2.0 ** e).astype(np.float32)
    x[3, 32:64] = 0.0                                  # an all-zero block
    x[6, :7] = [3.33e38, -3.33e38, 2.0 ** 126, -3.0 * 2.0 ** 120, 1e38, 1.0, -0.0]
    x[6, 32:40] = [np.finfo(np.float32).max, -3.4028233e38, 1.0, -2.0, 0.5, 7.0, 1e-3, 0.0]
    x[7, :32] = rng.standard_normal(32)
    x[7, 3] = np.nan                                   # a NaN block
    x[7, 32:64] = rng.standard_normal(32)
    x[7, 40] = -np.inf                                 # an Inf block
    x[7, 64:] = np.float32(2.0) ** np.arange(-16, 16, dtype=np.float32)
    x[8] = (np.arange(96) - 48).astype(np.float32) * 0.0625 + 0.03125  # midpoints of fine grids
    words = rng.integers(0, 2 ** 32, size=(3, 96), dtype=np.uint64).astype(np.uint32)
    rand = words.view(np.float32).copy()
    rand[~np.isfinite(rand)] = 1.0
    rand[np.abs(rand) > 1e30] = 1.0
    x[9:12] = rand
    return x


CASES = ([(f, r, rd) for f in MX for r in RULES for rd in ROUNDINGS]
         + [(f, "floor", rd) for f in ("bf16", "fp16") for rd in ("nearest_even", "nearest_away")])
