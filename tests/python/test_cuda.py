"""mxlab.quantize on CUDA: the lab's CUDA quantize kernels (kernels/quantize.cuh) through the
Python package built with CUDA, against the CPU path of the same package (which test_package.py
holds to `mxlab quantize` bit for bit), on the conformance inputs of quant_inputs.py:

  - host data through the kernels (device="cuda": copied there and back; needs no torch): every
    format x scale rule x rounding, the statistics of quantize_stats number for number, shapes
    and block sizes that take each kernel (contiguous, strided tile, strided, generic), axis=0;
  - torch CUDA tensors (when torch has CUDA): the result stays on the tensor's device with the
    CPU's bits and statistics, from unaligned views too; the kernels run on the tensor's current
    stream (a side stream whose input is written after a long sleep must still be read after the
    write); the op mxlab::fake_quant and MXLinear on CUDA;
  - always, without a GPU: asking for CUDA from a package built without it (or where no device
    is visible) is one clear error that says what to do.

The GPU tests skip, saying why, when the package lacks CUDA (the default `pip install .`) or no
GPU is visible; MXLAB_REQUIRE_GPU=1 (bench/device_pytest.sh sets it) turns those skips into
failures, so that a GPU run cannot pass by skipping.
"""

import os

import numpy as np
import pytest

from quant_inputs import CASES, assert_same_bits, conformance_input

REQUIRE_GPU = os.environ.get("MXLAB_REQUIRE_GPU") == "1"


def _skip(why):
    if REQUIRE_GPU:
        pytest.fail(f"MXLAB_REQUIRE_GPU=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def gpu(mxlab):
    """The package, when it can run on a GPU here."""
    if not mxlab.built_with_cuda():
        _skip("this mxlab was built without CUDA (pip install . -Ccmake.define.MXLAB_ENABLE_CUDA=ON, or "
              "bench/device_pytest.sh on a GPU machine)")
    count, why = mxlab._core.cuda_device_count()
    if count == 0:
        _skip(f"no CUDA device is visible ({why})")
    return mxlab


@pytest.fixture(scope="session")
def torch_cuda(gpu):
    """torch with a CUDA device, or a skip that says why (the GPU machine may have no torch)."""
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed: the CUDA-tensor tests need torch with CUDA (the device=\"cuda\" "
                    "tests above cover the same kernels without it)")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA device (CPU-only build?)")
    return torch


def assert_same_stats(got, want, what):
    assert set(got) == set(want), what
    for key in want:
        g, w = got[key], want[key]
        same = (g == w) or (isinstance(w, float) and np.isnan(w) and np.isnan(g))
        assert same, f"{what}: {key} = {g!r} on CUDA, {w!r} on the CPU"


# ---- without a GPU: the errors -----------------------------------------------------------------

def test_asking_for_cuda_says_what_to_do(mxlab):
    x = conformance_input()
    if not mxlab.built_with_cuda():
        for f in (mxlab.quantize, mxlab.quantize_stats):
            with pytest.raises(RuntimeError, match=r"built without CUDA: .*-Ccmake\.define\.MXLAB_ENABLE_CUDA=ON"):
                f(x, "mxfp8_e4m3", device="cuda")
        assert not mxlab.cuda_available()
    elif mxlab._core.cuda_device_count()[0] == 0:
        with pytest.raises(RuntimeError, match="no CUDA device is visible"):
            mxlab.quantize(x, "mxfp8_e4m3", device="cuda:0")
        assert not mxlab.cuda_available()
    else:
        count = mxlab._core.cuda_device_count()[0]
        with pytest.raises(ValueError, match=f"only {count} CUDA device"):
            mxlab.quantize(x, "mxfp8_e4m3", device=f"cuda:{count}")
        assert mxlab.cuda_available()
    for bad in ("gpu", "cuda:x", "cuda:-1"):
        with pytest.raises(ValueError, match="use None .*'cpu', 'cuda' or 'cuda:N'"):
            mxlab.quantize(x, "mxfp8_e4m3", device=bad)
    # device="cpu" is the CPU path itself.
    assert_same_bits(mxlab.quantize(x, "mxfp8_e4m3", device="cpu"), mxlab.quantize(x, "mxfp8_e4m3"), "cpu")


def test_torch_tensor_on_another_device_says_what_to_do(mxlab):
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"CPU or CUDA tensors .*x\.cpu\(\)"):
        mxlab.quantize(torch.ones(4, 32, device="meta"), "mxfp8_e4m3")


# ---- host data through the CUDA kernels (no torch needed) --------------------------------------

@pytest.mark.parametrize("fmt,rule,rounding", CASES, ids=["-".join(c) for c in CASES])
def test_host_data_through_cuda_equals_cpu(gpu, fmt, rule, rounding):
    x = conformance_input()
    want = gpu.quantize(x, fmt, 32, rule, rounding, seed=7)
    got = gpu.quantize(x, fmt, 32, rule, rounding, seed=7, device="cuda")
    assert isinstance(got, np.ndarray)
    assert_same_bits(got, want, f"{fmt} {rule} {rounding}")
    assert_same_stats(gpu.quantize_stats(x, fmt, 32, rule, rounding, seed=7, device="cuda:0"),
                      gpu.quantize_stats(x, fmt, 32, rule, rounding, seed=7), f"{fmt} {rule} {rounding}")


# Each kernel of kernels/quantize.cu: contiguous blocks of 8*G (G | 32) -> the tuned contiguous
# kernel, other sizes -> the generic one; strided blocks of 32 with cols % 4 == 0 -> the tile
# kernel, other blocks up to 64 -> the shared-memory strided kernel, larger -> generic.
SHAPES = [((3, 5, 40), 32, -1), ((7, 33), 7, -1), ((100,), 16, -1), ((2, 3, 64), 1, -1), ((4, 256), 256, -1),
          ((257, 1030), 32, -1), ((96, 12), 32, 0), ((200, 36), 32, 0), ((130, 9), 24, 0), ((300, 20), 96, 0),
          ((1, 1), 32, 0)]


@pytest.mark.parametrize("shape,block,axis", SHAPES, ids=[f"{s}-{b}-ax{a}" for s, b, a in SHAPES])
@pytest.mark.parametrize("fmt,rule,rounding", [("mxfp8_e4m3", "floor", "nearest_even"),
                                               ("mxfp4_e2m1", "floor_bump", "stochastic"),
                                               ("mxint8", "rceil", "toward_zero"),
                                               ("mxfp6_e3m2", "even", "nearest_away")])
def test_shapes_blocks_and_axes_through_cuda_equal_cpu(gpu, shape, block, axis, fmt, rule, rounding):
    x = (np.random.default_rng(3).standard_normal(shape) * 4).astype(np.float32)
    bump = "always" if rule == "floor_bump" else None
    kw = dict(block_size=block, scale_rule=rule, rounding=rounding, axis=axis, bump=bump, seed=11)
    what = f"{shape} block {block} axis {axis} {fmt} {rule} {rounding}"
    assert_same_bits(gpu.quantize(x, fmt, device="cuda", **kw), gpu.quantize(x, fmt, **kw), what)
    assert_same_stats(gpu.quantize_stats(x, fmt, device="cuda", **kw), gpu.quantize_stats(x, fmt, **kw), what)


def test_empty_and_large_inputs_through_cuda(gpu):
    empty = np.zeros((0, 32), np.float32)
    assert gpu.quantize(empty, "mxfp8_e4m3", device="cuda").shape == (0, 32)
    assert gpu.quantize_stats(empty, "mxfp8_e4m3", device="cuda")["elements"] == 0
    # More blocks than one grid covers: the grid-stride loops.
    x = (np.random.default_rng(4).standard_normal((4096, 2048)) * 2.0 ** 20).astype(np.float32)
    assert_same_bits(gpu.quantize(x, "mxfp8_e5m2", device="cuda"), gpu.quantize(x, "mxfp8_e5m2"), "4096x2048")
    assert_same_bits(gpu.quantize(x, "mxfp6_e2m3", axis=0, device="cuda"), gpu.quantize(x, "mxfp6_e2m3", axis=0),
                     "4096x2048 axis 0")


# ---- torch CUDA tensors ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,rule,rounding", CASES, ids=["-".join(c) for c in CASES])
def test_torch_cuda_tensor_equals_cpu(gpu, torch_cuda, fmt, rule, rounding):
    torch = torch_cuda
    x = conformance_input()
    xc = torch.from_numpy(x).cuda()
    y = gpu.quantize(xc, fmt, 32, rule, rounding, seed=7)
    assert isinstance(y, torch.Tensor) and y.device == xc.device and y.dtype == torch.float32
    assert_same_bits(y.cpu().numpy(), gpu.quantize(x, fmt, 32, rule, rounding, seed=7), f"{fmt} {rule} {rounding}")
    assert_same_stats(gpu.quantize_stats(xc, fmt, 32, rule, rounding, seed=7),
                      gpu.quantize_stats(x, fmt, 32, rule, rounding, seed=7), f"{fmt} {rule} {rounding}")


def test_torch_cuda_views_axis0_and_device_argument(gpu, torch_cuda):
    torch = torch_cuda
    x = conformance_input()
    big = torch.from_numpy(np.concatenate([np.ones(1, np.float32), x.reshape(-1)])).cuda()
    view = big[1:].view(12, 96)  # contiguous, but 4 bytes past an aligned address: the unvectorised paths
    assert view.data_ptr() % 16 != 0
    for fmt in ("mxfp8_e4m3", "mxfp4_e2m1", "bf16"):
        assert_same_bits(gpu.quantize(view, fmt).cpu().numpy(), gpu.quantize(x, fmt), fmt + " unaligned view")
    xt = np.ascontiguousarray(x.T)
    assert_same_bits(gpu.quantize(torch.from_numpy(xt).cuda(), "mxfp6_e2m3", axis=0).cpu().numpy(),
                     gpu.quantize(xt, "mxfp6_e2m3", axis=0), "axis 0")
    xc = torch.from_numpy(x).cuda()
    assert_same_bits(gpu.quantize(xc, "mxint8", device=xc.device).cpu().numpy(), gpu.quantize(x, "mxint8"),
                     "device=x.device")
    with pytest.raises(ValueError, match=r"is on cuda:\d but device='cpu'.*x\.cpu\(\)"):
        gpu.quantize(xc, "mxint8", device="cpu")
    # A CPU tensor sent through the kernels comes back as a CPU tensor.
    y = gpu.quantize(torch.from_numpy(x), "mxfp8_e5m2", device="cuda")
    assert y.device.type == "cpu"
    assert_same_bits(y.numpy(), gpu.quantize(x, "mxfp8_e5m2"), "cpu tensor via cuda")


def test_torch_cuda_runs_on_the_current_stream(gpu, torch_cuda):
    """The kernels are enqueued on the tensor's current stream, after what it holds and before
    what comes next. (a) On a side stream, x is written only after a long sleep kernel: a launch
    on another stream would read the zeros there before. (b) With the default stream held up by
    a sleep, a quantization on a side stream and a copy of its result queued right after it
    there: the copy sees the result (a launch on the default stream would run after the sleep,
    and the copy would read the uninitialised output; recent torch's __dlpack__ orders the
    default stream after the current one, which (a) alone would not notice)."""
    torch = torch_cuda
    rng = np.random.default_rng(6)
    src_a, src_b = ((rng.standard_normal((2048, 1024)) * 3).astype(np.float32) for _ in range(2))
    gpu_a, gpu_b = torch.from_numpy(src_a).cuda(), torch.from_numpy(src_b).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros_like(gpu_a)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on the side stream
        x.copy_(gpu_a)
        y = gpu.quantize(x, "mxfp8_e4m3")
        stats = gpu.quantize_stats(x, "mxfp8_e4m3")  # waits for the side stream itself
    side.synchronize()
    assert_same_bits(y.cpu().numpy(), gpu.quantize(src_a, "mxfp8_e4m3"), "(a) after the side stream's writes")
    assert_same_stats(stats, gpu.quantize_stats(src_a, "mxfp8_e4m3"), "(a) statistics")

    torch.cuda._sleep(500_000_000)  # ~0.3 s on the default (current) stream
    with torch.cuda.stream(side):
        y = gpu.quantize(gpu_b, "mxfp6_e2m3")
        seen = y.clone()
    side.synchronize()
    got = seen.cpu().numpy()  # after the default stream's sleep too
    assert_same_bits(got, gpu.quantize(src_b, "mxfp6_e2m3"), "(b) before the side stream's next work")


def test_torch_tensor_on_a_second_gpu(gpu, torch_cuda):
    torch = torch_cuda
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: the tensor-on-another-device case needs two")
    x = conformance_input()
    x1 = torch.from_numpy(x).to("cuda:1")
    torch.cuda.set_device(0)
    y = gpu.quantize(x1, "mxfp8_e4m3")
    assert y.device == x1.device and torch.cuda.current_device() == 0
    assert_same_bits(y.cpu().numpy(), gpu.quantize(x, "mxfp8_e4m3"), "cuda:1")
    assert_same_bits(gpu.quantize(x, "mxfp8_e4m3", device="cuda:1"), gpu.quantize(x, "mxfp8_e4m3"), "device=cuda:1")


def test_fake_quant_op_and_mxlinear_on_cuda(gpu, torch_cuda):
    torch = torch_cuda
    import importlib
    nn = importlib.import_module("mxlab.nn")
    x = torch.from_numpy(conformance_input()[:6].copy()).cuda().requires_grad_()
    for fmt, rule, rounding in [("mxfp8_e4m3", "floor", "nearest_even"), ("mxfp4_e2m1", "rceil", "stochastic")]:
        y = torch.ops.mxlab.fake_quant(x, fmt, 32, rule, rounding, -1, 3)
        assert y.is_cuda
        assert_same_bits(y.detach().cpu().numpy(),
                         gpu.quantize(x.detach().cpu().numpy(), fmt, 32, rule, rounding, seed=3), f"fake_quant {fmt}")
        g = torch.randn_like(x)
        (gx,) = torch.autograd.grad(y, x, g)
        assert torch.equal(gx, g), "the backward of fake_quant is the identity (straight-through)"
    torch.manual_seed(2)
    layer = nn.MXLinear(64, 32, format="mxfp8_e4m3", weight_format="mxfp4_e2m1", grad_format="mxfp8_e5m2").cuda()
    xin = torch.randn(16, 64, device="cuda")
    dy = torch.randn(16, 32, device="cuda")
    y = layer(xin)
    xq = gpu.quantize(xin, "mxfp8_e4m3")
    wq = gpu.quantize(layer.weight.detach().contiguous(), "mxfp4_e2m1")
    assert xq.is_cuda and wq.is_cuda
    assert torch.equal(y.detach(), torch.nn.functional.linear(xq, wq, layer.bias.detach()))
    y.backward(dy)
    dyq = gpu.quantize(dy, "mxfp8_e5m2")
    assert not torch.equal(dyq, dy)
    assert torch.allclose(layer.weight.grad, dyq.t() @ xq, rtol=1e-5, atol=1e-5)
