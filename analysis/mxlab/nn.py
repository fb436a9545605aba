"""The lab's MX quantizer in PyTorch: the custom op `mxlab::fake_quant` with a straight-through
backward, a gradient quantizer, and `MXLinear`.

    import torch, mxlab.nn
    y = torch.ops.mxlab.fake_quant(x, "mxfp8_e4m3", 32, "floor", "nearest_even", -1, 0)
    y = mxlab.nn.fake_quant(x, "mxfp4_e2m1")          # the same op with the defaults
    layer = mxlab.nn.MXLinear(64, 32, format="mxfp8_e4m3", grad_format="mxfp8_e5m2")

fake_quant is `mxlab.quantize` (bit for bit `mxlab quantize`): quantize-dequantize in float32,
blocks along `axis` (-1 or 0). Its backward passes the gradient through unchanged (the
straight-through estimator), as MX training recipes do for the quantizer itself. Registered
with torch.library (Library/define/impl, which torch 1.13 and 2.x both have) for the CPU and
Meta dispatch keys and for Autograd, and for CUDA: a CUDA tensor goes through the lab's CUDA
quantize kernels on its current stream when the package is built with CUDA (mxlab.quantize);
otherwise it is refused with a message that says how to build it.
"""

import torch
import torch.nn.functional as F

from ._quant import quantize as _quantize

_SCHEMA = ("fake_quant(Tensor x, str format, int block_size, str scale_rule, str rounding, int axis, "
           "int seed) -> Tensor")

_lib = torch.library.Library("mxlab", "DEF")
_lib.define(_SCHEMA)


def _fake_quant_impl(x, format, block_size, scale_rule, rounding, axis, seed):
    """CPU and CUDA alike: mxlab.quantize runs the CPU reference or the CUDA kernels where x is."""
    return _quantize(x.contiguous(), format, block_size, scale_rule, rounding, axis, seed=seed)


def _fake_quant_meta(x, format, block_size, scale_rule, rounding, axis, seed):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _below_autograd(*args):
    """The op again, dispatched past its Autograd kernel (the guard is a context manager in
    torch 2.x and a scoped object in torch 1.13)."""
    guard = torch._C._AutoDispatchBelowAutograd
    if hasattr(guard, "__enter__"):
        with guard():
            return torch.ops.mxlab.fake_quant(*args)
    g = guard()  # noqa: F841  (held until the call returns)
    return torch.ops.mxlab.fake_quant(*args)


class _FakeQuantSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, format, block_size, scale_rule, rounding, axis, seed):
        return _below_autograd(x, format, block_size, scale_rule, rounding, axis, seed)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None, None, None


def _fake_quant_autograd(x, format, block_size, scale_rule, rounding, axis, seed):
    return _FakeQuantSTE.apply(x, format, block_size, scale_rule, rounding, axis, seed)


_lib.impl("fake_quant", _fake_quant_impl, "CPU")
_lib.impl("fake_quant", _fake_quant_meta, "Meta")
_lib.impl("fake_quant", _fake_quant_impl, "CUDA")
_lib.impl("fake_quant", _fake_quant_autograd, "Autograd")


def fake_quant(x, format, block_size=32, scale_rule="floor", rounding="nearest_even", axis=-1, seed=0):
    """torch.ops.mxlab.fake_quant with mxlab.quantize's defaults (differentiable: straight-through)."""
    return torch.ops.mxlab.fake_quant(x, format, block_size, scale_rule, rounding, axis, seed)


class _QuantizeGrad(torch.autograd.Function):
    """Identity forward; the backward quantizes the incoming gradient (blocks along `axis`)."""

    @staticmethod
    def forward(ctx, y, format, block_size, scale_rule, rounding, axis, seed):
        ctx.args = (format, block_size, scale_rule, rounding, axis, seed)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return (torch.ops.mxlab.fake_quant(grad.contiguous(), *ctx.args),) + (None,) * 6


def quantize_grad(y, format, block_size=32, scale_rule="floor", rounding="nearest_even", axis=-1, seed=0):
    """y unchanged; the gradient flowing back through it is quantize-dequantized with `format`."""
    return _QuantizeGrad.apply(y, format, block_size, scale_rule, rounding, axis, seed)


class MXLinear(torch.nn.Linear):
    """nn.Linear whose forward multiplies the MX-quantized input by the MX-quantized weight, both
    in blocks along in_features (the GEMM's reduction axis), and whose backward optionally
    quantizes the output gradient dY in blocks along out_features (the reduction axis of
    dX = dY W) before both backward GEMMs. The quantizers pass gradients straight through; the
    GEMMs themselves run in float32. Parameters stay float32 (the master weights).

    format: the input's (and weight's, unless weight_format) MX format; grad_format: None leaves
    dY in float32. block_size, scale_rule, rounding: as mxlab.quantize, for all three.
    """

    def __init__(self, in_features, out_features, bias=True, *, format="mxfp8_e4m3", weight_format=None,
                 grad_format=None, block_size=32, scale_rule="floor", rounding="nearest_even"):
        super().__init__(in_features, out_features, bias=bias)
        self.format = format
        self.weight_format = weight_format or format
        self.grad_format = grad_format
        self.block_size = block_size
        self.scale_rule = scale_rule
        self.rounding = rounding

    def _q(self, t, fmt):
        return fake_quant(t, fmt, self.block_size, self.scale_rule, self.rounding, -1)

    def forward(self, x):
        y = F.linear(self._q(x, self.format), self._q(self.weight, self.weight_format), self.bias)
        if self.grad_format is not None:
            y = quantize_grad(y, self.grad_format, self.block_size, self.scale_rule, self.rounding, -1)
        return y

    def extra_repr(self):
        return (super().extra_repr() + f", format={self.format}, weight_format={self.weight_format}, "
                f"grad_format={self.grad_format}, block_size={self.block_size}, scale_rule={self.scale_rule}, "
                f"rounding={self.rounding}")
