"""mxlab.quantize / mxlab.quantize_stats: the lab's MX quantizer (lab/mx/quantize.h, the code
behind `mxlab quantize`) on NumPy arrays and PyTorch CPU tensors.

The compiled part is the extension mxlab._core (lab/python/module.cpp), built by `pip install .`;
from a source checkout without it (PYTHONPATH=analysis) the analysis modules import as usual and
only these two functions say what to do.
"""

import numpy as np


def _core():
    try:
        from . import _core as core
    except ImportError as e:
        import os
        raise ImportError(
            "mxlab.quantize needs the compiled extension mxlab._core, which this mxlab ("
            + os.path.dirname(os.path.abspath(__file__))
            + ") does not have: install the package with `pip install .` from the repository root"
            + f" ({e})") from None
    return core


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _check(x):
    """x as the array the extension reads (no copy), and a new empty output of the same kind."""
    if _is_torch(x):
        import torch
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"mxlab.quantize takes a NumPy array or a torch.Tensor (got {type(x).__name__})")
        if x.device.type != "cpu":
            raise TypeError(f"mxlab.quantize runs on the CPU only (got a tensor on {x.device}): pass x.cpu(); "
                            "CUDA tensors are not supported by the Python binding")
        if x.dtype != torch.float32:
            raise TypeError(f"mxlab.quantize needs float32 (got {x.dtype}): pass x.float()")
        if not x.is_contiguous():
            raise TypeError("mxlab.quantize needs a contiguous tensor: pass x.contiguous()")
        x = x.detach()
        return x, torch.empty_like(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"mxlab.quantize takes a NumPy array or a torch.Tensor (got {type(x).__name__}): "
                        "pass np.asarray(x, dtype=np.float32)")
    if x.dtype != np.float32:
        raise TypeError(f"mxlab.quantize needs float32 (got {x.dtype}): pass x.astype(np.float32)")
    if not x.flags.c_contiguous:
        raise TypeError("mxlab.quantize needs a C-contiguous array: pass np.ascontiguousarray(x)")
    return x, np.empty_like(x)


def _run(x, format, block_size, scale_rule, rounding, axis, bump, seed, with_error):
    x, out = _check(x)
    stats = _core().quantize_into(x, out, format, int(block_size), scale_rule, rounding, int(axis),
                                  "clamp" if bump is None else bump, bump is not None, int(seed), with_error)
    return out, stats


def quantize(x, format, block_size=32, scale_rule="floor", rounding="nearest_even", axis=-1, *,
             bump=None, seed=0):
    """Quantize-dequantize x with one MX format (blocks of block_size along `axis`) or bf16/fp16,
    bit for bit as `mxlab quantize --format FORMAT ...` does; returns a new float32 array of the
    same kind (NumPy or torch CPU) and shape.

    format: mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4_e2m1, mxint8, bf16, fp16.
    scale_rule: floor, rceil, ceil, even, floor_bump (with bump='clamp' or 'always').
    rounding: nearest_even, nearest_away, toward_zero, stochastic, noise (seed picks the stream;
    noise: x + u * ulp(x), off the grid, lab/mx/README.md; bf16/fp16: nearest_* only).
    axis: -1 (the last, as the CLI) or 0 (the first). A last block that is short is zero-padded.
    x: float32, C-contiguous, on the CPU.
    """
    return _run(x, format, block_size, scale_rule, rounding, axis, bump, seed, False)[0]


def quantize_stats(x, format, block_size=32, scale_rule="floor", rounding="nearest_even", axis=-1, *,
                   bump=None, seed=0):
    """What `mxlab quantize --stats` reports for the same options, as a dict: elements, blocks,
    nan_blocks, lastbin (elements at +-max_normal*X), clamped (elements above max_normal*X before
    saturation), lastbin_frac, clamped_frac, nonfinite (elements left out of rel_error) and
    rel_error (||Q(x)-x|| / ||x||)."""
    return _run(x, format, block_size, scale_rule, rounding, axis, bump, seed, True)[1]
