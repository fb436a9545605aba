"""mxlab.quantize / mxlab.quantize_stats: the lab's MX quantizer (lab/mx/quantize.h, the code
behind `mxlab quantize`) on NumPy arrays and PyTorch tensors.

The compiled part is the extension mxlab._core (lab/python/module.cpp), built by `pip install .`;
from a source checkout without it (PYTHONPATH=analysis) the analysis modules import as usual and
only these functions say what to do. Built with CUDA (`pip install .
-Ccmake.define.MXLAB_ENABLE_CUDA=ON`), the extension also runs the lab's CUDA quantize kernels
(kernels/quantize.cuh, bit for bit the CPU reference): on a CUDA tensor's own memory, on its
device's current stream, or on host data copied there and back with device="cuda".
"""

import re

import numpy as np

CUDA_BUILD_HINT = ("rebuild the package with CUDA: `pip install . --no-build-isolation "
                   "-Ccmake.define.MXLAB_ENABLE_CUDA=ON` from the repository root (needs nvcc; README, "
                   "\"Python: the quantizer in PyTorch\")")


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


def built_with_cuda():
    """Whether this mxlab's extension has the CUDA kernels (False without the extension)."""
    try:
        return bool(_core().built_with_cuda)
    except ImportError:
        return False


def cuda_available():
    """Whether mxlab.quantize can run on a GPU here: built with CUDA and a CUDA device visible."""
    return built_with_cuda() and _core().cuda_device_count()[0] > 0


def _cuda_core(what):
    """The extension, which must have CUDA, for `what` (the input or the device asked for)."""
    core = _core()
    if not getattr(core, "built_with_cuda", False):
        raise RuntimeError(f"mxlab.quantize got {what}, but this mxlab was built without CUDA: "
                           f"{CUDA_BUILD_HINT}; or quantize on the CPU (x.cpu(), device='cpu')")
    return core


def _parse_device(device):
    """None | ('cpu', None) | ('cuda', index or None). Accepts 'cpu', 'cuda', 'cuda:N' and
    torch.device."""
    if device is None:
        return None
    text = str(device)
    if text == "cpu":
        return ("cpu", None)
    m = re.fullmatch(r"cuda(?::(\d+))?", text)
    if not m:
        raise ValueError(f"device={device!r}: use None (where x is), 'cpu', 'cuda' or 'cuda:N'")
    return ("cuda", None if m.group(1) is None else int(m.group(1)))


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _check_torch(x):
    import torch
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"mxlab.quantize takes a NumPy array or a torch.Tensor (got {type(x).__name__})")
    if x.device.type not in ("cpu", "cuda"):
        raise TypeError(f"mxlab.quantize takes CPU or CUDA tensors (got a tensor on {x.device}): pass x.cpu()")
    if x.dtype != torch.float32:
        raise TypeError(f"mxlab.quantize needs float32 (got {x.dtype}): pass x.float()")
    if not x.is_contiguous():
        raise TypeError("mxlab.quantize needs a contiguous tensor: pass x.contiguous()")
    return x.detach()


def _check_numpy(x):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"mxlab.quantize takes a NumPy array or a torch.Tensor (got {type(x).__name__}): "
                        "pass np.asarray(x, dtype=np.float32)")
    if x.dtype != np.float32:
        raise TypeError(f"mxlab.quantize needs float32 (got {x.dtype}): pass x.astype(np.float32)")
    if not x.flags.c_contiguous:
        raise TypeError("mxlab.quantize needs a C-contiguous array: pass np.ascontiguousarray(x)")
    return x


def _run(x, format, block_size, scale_rule, rounding, axis, bump, seed, device, with_stats):
    """(Q(x), the statistics dict or None). The CPU reference for host data, the CUDA kernels for
    a CUDA tensor (on its device's current stream; waits for it only when with_stats) and for
    host data with device='cuda[:N]' (copied there and back)."""
    where = _parse_device(device)
    args = (format, int(block_size), scale_rule, rounding, int(axis), "clamp" if bump is None else bump,
            bump is not None, int(seed))
    if _is_torch(x):
        x = _check_torch(x)
        if x.device.type == "cuda":
            if where is not None and (where[0] != "cuda" or where[1] not in (None, x.device.index)):
                raise ValueError(f"x is on {x.device} but device={device!r}: move it first (x.cpu(), x.to(...)) "
                                 "or leave device=None")
            core = _cuda_core(f"a tensor on {x.device}")
            import torch
            out = torch.empty_like(x)
            stream = torch.cuda.current_stream(x.device).cuda_stream
            stats = core.quantize_cuda_into(x, out, *args, stream, with_stats, with_stats)
            return out, stats
        import torch
        out = torch.empty_like(x)
    else:
        x = _check_numpy(x)
        out = np.empty_like(x)
    if where is not None and where[0] == "cuda":
        core = _cuda_core(f"device={device!r}")
        count, why = core.cuda_device_count()
        index = -1 if where[1] is None else where[1]
        if count == 0:
            raise RuntimeError(f"mxlab.quantize(device={device!r}): no CUDA device is visible ({why}); "
                               "quantize on the CPU (device=None) or run where a GPU is")
        if index >= count:
            raise ValueError(f"device={device!r}: only {count} CUDA device(s) are visible")
        stats = core.quantize_host_cuda_into(x, out, *args, index, with_stats)
        return out, stats if with_stats else None
    stats = _core().quantize_into(x, out, *args, with_stats)
    return out, stats


def quantize(x, format, block_size=32, scale_rule="floor", rounding="nearest_even", axis=-1, *,
             bump=None, seed=0, device=None):
    """Quantize-dequantize x with one MX format (blocks of block_size along `axis`) or bf16/fp16,
    bit for bit as `mxlab quantize --format FORMAT ...` does; returns a new float32 array of the
    same kind (NumPy or torch), shape and device.

    format: mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4_e2m1, mxint8, bf16, fp16.
    scale_rule: floor, rceil, ceil, even, floor_bump (with bump='clamp' or 'always').
    rounding: nearest_even, nearest_away, toward_zero, stochastic, noise (seed picks the stream;
    noise: x + u * ulp(x), off the grid, lab/mx/README.md; bf16/fp16: nearest_* only).
    axis: -1 (the last, as the CLI) or 0 (the first). A last block that is short is zero-padded.
    x: float32, contiguous; a NumPy array, a CPU tensor or (built with CUDA) a CUDA tensor, which
    the lab's CUDA kernels quantize in place of the CPU reference, on the tensor's device and its
    current stream, without waiting for it.
    device: None (where x is), 'cpu', or 'cuda'/'cuda:N' to send host data through the CUDA
    kernels (copied to the GPU and back; the result is host data again).
    """
    return _run(x, format, block_size, scale_rule, rounding, axis, bump, seed, device, False)[0]


def quantize_stats(x, format, block_size=32, scale_rule="floor", rounding="nearest_even", axis=-1, *,
                   bump=None, seed=0, device=None):
    """What `mxlab quantize --stats` reports for the same options, as a dict: elements, blocks,
    nan_blocks, lastbin (elements at +-max_normal*X), clamped (elements above max_normal*X before
    saturation), lastbin_frac, clamped_frac, nonfinite (elements left out of rel_error) and
    rel_error (||Q(x)-x|| / ||x||). On CUDA (a CUDA tensor, or device='cuda') the counts come
    from the kernel; the call waits for the stream and sums rel_error on the host, in the CPU's
    order, from copies of x and Q(x), so every number equals the CPU's."""
    return _run(x, format, block_size, scale_rule, rounding, axis, bump, seed, device, True)[1]
