"""The Python package `mxlab` (pyproject.toml, lab/python/, analysis/mxlab/) as a user gets it.

The session fixture builds and installs the package with `pip install . --target DIR` (the
interpreter running pytest; scikit-build-core and nanobind must be installed for it:
scripts/install-deps.sh), then:

  - mxlab.quantize / quantize_stats against `mxlab quantize` (MXLAB_BINARY) bit for bit, on inputs
    written as .npy files here: every MX format x scale rule x rounding (bf16/fp16 too), odd block
    sizes, a short last block, higher rank, the top-of-range and special-value rows of
    tests/cpu/test_quantize_top.cpp (the conformance report's E5M2 block, FLT_MAX's neighbours,
    NaN/Inf, subnormals, zero blocks, random bit patterns); and the --stats numbers;
  - NumPy and torch CPU inputs alike; axis=0; the error messages of bad input;
  - torchao's to_mx / to_dtype where the semantics coincide (skips, saying why, where torchao's
    MX formats cannot be imported, as under Debian 12's torch 1.13);
  - torch: the op mxlab::fake_quant (its bits, its straight-through backward) and MXLinear (a tiny
    model trains: the loss falls; gradients reach every parameter; dY is quantized when asked).

ctest: python_package (label cpu), under MXLAB_TORCH_PYTHON. Run by hand:
  MXLAB_BINARY=build/mxlab /usr/bin/python3 -m pytest -q -rs tests/python
(MXLAB_PY_BUILD_DIR keeps scikit-build-core's build folder between runs; MXLAB_PY_SITE uses a
package already installed there instead of building one.)
"""

import importlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MX = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8"]
RULES = ["floor", "rceil", "ceil", "even", "floor_bump"]
ROUNDINGS = ["nearest_even", "nearest_away", "toward_zero", "stochastic", "noise"]


# ---- the package, built and installed as a user would ------------------------------------------

@pytest.fixture(scope="session")
def mxlab(tmp_path_factory):
    site = os.environ.get("MXLAB_PY_SITE")
    if not site:
        site = str(tmp_path_factory.mktemp("site"))
        cmd = [sys.executable, "-m", "pip", "install", ROOT, "--no-build-isolation", "--no-deps", "--target", site,
               "--quiet", "--disable-pip-version-check"]
        if os.environ.get("MXLAB_PY_BUILD_DIR"):
            cmd += ["--config-settings=build-dir=" + os.environ["MXLAB_PY_BUILD_DIR"]]
        env = dict(os.environ)
        if shutil.which("ccache") and "CMAKE_CXX_COMPILER_LAUNCHER" not in env:
            env["CMAKE_CXX_COMPILER_LAUNCHER"] = "ccache"
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"pip install . failed:\n{r.stdout}\n{r.stderr}"
    for name in [m for m in sys.modules if m == "mxlab" or m.startswith("mxlab.")]:
        del sys.modules[name]  # an mxlab from the source tree (analysis/) must not stand in
    sys.path.insert(0, site)
    m = importlib.import_module("mxlab")
    assert os.path.dirname(m.__file__) == os.path.join(site, "mxlab"), m.__file__
    importlib.import_module("mxlab._core")
    return m


@pytest.fixture(scope="session")
def binary():
    path = os.environ.get("MXLAB_BINARY", os.path.join(ROOT, "build", "mxlab"))
    if not os.path.exists(path):
        pytest.fail(f"no mxlab binary at {path}: build it (cmake --build build --target mxlab) or set MXLAB_BINARY")
    return path


def cli(binary, tmp, x, fmt, block=32, rule="floor", rounding="nearest_even", bump=None, seed=0):
    """`mxlab quantize` on x: (output array, the --stats lines as a dict of strings)."""
    src, dst = os.path.join(tmp, "in.npy"), os.path.join(tmp, "out.npy")
    np.save(src, x)
    cmd = [binary, "quantize", "--format", fmt, "--in", src, "--out", dst, "--stats", "--scale-rule", rule,
           "--rounding", rounding, "--block-size", str(block), "--seed", str(seed)]
    if bump:
        cmd += ["--bump", bump]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr}"
    stats = {}
    for line in r.stdout.splitlines():
        key, _, rest = line.partition(" ")
        stats[key] = rest.split()[0]
    return np.load(dst), stats


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


@pytest.mark.parametrize("fmt,rule,rounding", CASES, ids=["-".join(c) for c in CASES])
def test_quantize_bits_equal_the_cli(mxlab, binary, tmp_path, fmt, rule, rounding):
    x = conformance_input()
    want, st = cli(binary, str(tmp_path), x, fmt, 32, rule, rounding, seed=7)
    got = mxlab.quantize(x, fmt, 32, rule, rounding, seed=7)
    assert_same_bits(got, want, f"{fmt} {rule} {rounding}")
    s = mxlab.quantize_stats(x, fmt, 32, rule, rounding, seed=7)
    assert str(s["elements"]) == st["elements"]
    assert str(s["nonfinite"]) == st["nonfinite"]
    assert f"{s['rel_error']:.9g}" == st["rel_error"]
    if fmt.startswith("mx"):
        for key in ("blocks", "nan_blocks"):
            assert str(s[key]) == st[key], key
        assert f"{s['lastbin_frac']:.9g}" == st["lastbin_frac"]
        assert f"{s['clamped_frac']:.9g}" == st["clamped_frac"]
    if (fmt, rule) == ("mxfp8_e4m3", "floor"):
        assert s["clamped"] > 0 and s["lastbin"] > 0, "the input should exercise the last bin"


@pytest.mark.parametrize("shape,block", [((3, 5, 40), 32), ((7, 33), 7), ((100,), 16), ((2, 3, 64), 1)])
@pytest.mark.parametrize("fmt,rule,bump", [("mxfp8_e4m3", "floor", None), ("mxfp4_e2m1", "floor_bump", "always"),
                                           ("mxfp6_e3m2", "floor_bump", "clamp"), ("mxint8", "rceil", None)])
def test_shapes_and_block_sizes_equal_the_cli(mxlab, binary, tmp_path, shape, block, fmt, rule, bump):
    x = (np.random.default_rng(1).standard_normal(shape) * 3).astype(np.float32)
    want, st = cli(binary, str(tmp_path), x, fmt, block, rule, bump=bump)
    assert_same_bits(mxlab.quantize(x, fmt, block, rule, bump=bump), want, f"{shape} {block} {fmt} {rule} {bump}")
    s = mxlab.quantize_stats(x, fmt, block, rule, bump=bump)
    assert str(s["blocks"]) == st["blocks"]
    assert f"{s['lastbin_frac']:.9g}" == st["lastbin_frac"]


def test_torch_tensors_and_axis_0(mxlab):
    torch = pytest.importorskip("torch")
    x = conformance_input()
    for fmt in ("mxfp8_e5m2", "mxfp4_e2m1", "bf16"):
        y = mxlab.quantize(torch.from_numpy(x), fmt)
        assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
        assert_same_bits(y.numpy(), mxlab.quantize(x, fmt), fmt + " torch")
    # axis 0: blocks down the columns, i.e. the transposed array's rows.
    xt = np.ascontiguousarray(x.T)  # (96, 12)
    for fmt in ("mxfp8_e4m3", "mxfp6_e2m3"):
        assert_same_bits(mxlab.quantize(xt, fmt, 32, "floor", "nearest_even", axis=0),
                         mxlab.quantize(x, fmt).T, fmt + " axis=0")
    assert_same_bits(mxlab.quantize(x, "mxint8", axis=1), mxlab.quantize(x, "mxint8", axis=-1), "axis=1 is last")


def test_bad_input_says_what_to_do(mxlab):
    x = np.ones((4, 32), np.float32)
    with pytest.raises(TypeError, match=r"float32 .*astype\(np.float32\)"):
        mxlab.quantize(x.astype(np.float64), "mxfp8_e4m3")
    with pytest.raises(TypeError, match="ascontiguousarray"):
        mxlab.quantize(np.ones((32, 4), np.float32).T, "mxfp8_e4m3")
    with pytest.raises(TypeError, match="NumPy array or a torch.Tensor"):
        mxlab.quantize([1.0, 2.0], "mxfp8_e4m3")
    with pytest.raises(ValueError, match=r"unknown format 'mxfp9'.*mxfp8_e4m3"):
        mxlab.quantize(x, "mxfp9")
    with pytest.raises(ValueError, match="unknown scale rule 'round'"):
        mxlab.quantize(x, "mxfp8_e4m3", scale_rule="round")
    with pytest.raises(ValueError, match="block_size must be positive"):
        mxlab.quantize(x, "mxfp8_e4m3", block_size=0)
    with pytest.raises(ValueError, match="bf16' supports rounding"):
        mxlab.quantize(x, "bf16", rounding="stochastic")
    with pytest.raises(ValueError, match="bump applies only to scale_rule='floor_bump'"):
        mxlab.quantize(x, "mxfp8_e4m3", bump="always")
    with pytest.raises(ValueError, match="last axis .-1. or the first .0."):
        mxlab.quantize(np.ones((2, 3, 32), np.float32), "mxfp8_e4m3", axis=1)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"x.float\(\)"):
        mxlab.quantize(torch.ones(4, 32, dtype=torch.float64), "mxfp8_e4m3")
    with pytest.raises(TypeError, match=r"x.contiguous\(\)"):
        mxlab.quantize(torch.ones(32, 4).t(), "mxfp8_e4m3")


def test_source_tree_without_the_extension_says_how_to_install():
    """PYTHONPATH=analysis (CI's pytest, the results scripts): the analysis modules import, and
    mxlab.quantize names the install command instead of failing obscurely."""
    code = ("import numpy as np, mxlab, mxlab.yamlcfg\n"
            "try:\n    mxlab.quantize(np.ones(32, np.float32), 'mxfp8_e4m3')\n"
            "except ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "analysis")))
    assert r.returncode == 0, r.stderr
    assert "pip install ." in r.stdout, r.stdout


# ---- torchao's MX reference --------------------------------------------------------------------

def test_torchao_to_mx_floor(mxlab):
    """torchao.prototype.mx_formats' to_mx + to_dtype against mxlab.quantize where both follow the
    same rules: scale rule floor (torchao's default and only mode before ScaleCalculationMode),
    round-to-nearest-even elements saturated at max_normal, for E4M3, E5M2, E3M2, E2M3 and E2M1,
    on blocks whose amax stays in float32's normal range well away from E8M0's bottom (torchao
    clamps its scale at 2^-126 where the lab goes on to 2^-127) and away from powers of two (its
    float log2 may round 2^k(1 - u) up to k). Not compared: int8 (no torchao format), NaN/Inf
    blocks, short last blocks (torchao refuses them), the other scale rules and roundings."""
    torch = pytest.importorskip("torch")
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    except Exception as e:  # ImportError, or an AttributeError of a torch without float8 dtypes
        pytest.skip(f"torchao's MX formats are not importable under torch {torch.__version__} "
                    f"({type(e).__name__}: {e}); they need torch >= 2.5 with float8 dtypes, newer than "
                    "Debian 12's python3-torch: run this test under such a python with torchao installed")
    rng = np.random.default_rng(5)
    blocks = rng.standard_normal((64, 32)) * 2.0 ** rng.integers(-60, 60, size=(64, 1))
    x = blocks.astype(np.float32)
    amax = np.abs(x).max(axis=1)
    frac = np.log2(amax) - np.floor(np.log2(amax))
    assert np.all((frac > 1e-4) & (frac < 1 - 1e-4)), "an amax is too close to a power of two"
    elems = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2,
             "mxfp6_e3m2": "fp6_e3m2", "mxfp6_e2m3": "fp6_e2m3", "mxfp4_e2m1": "fp4_e2m1"}
    for fmt, elem in elems.items():
        t = torch.from_numpy(x.reshape(-1))
        scale, data = to_mx(t, elem, 32)
        ref = to_dtype(data, scale, elem, 32, torch.float32).reshape(x.shape).numpy()
        assert_same_bits(mxlab.quantize(x, fmt, 32, "floor", "nearest_even"), ref, f"torchao {fmt}")


# ---- PyTorch: the op and MXLinear --------------------------------------------------------------

@pytest.fixture(scope="session")
def nn(mxlab):
    pytest.importorskip("torch")
    return importlib.import_module("mxlab.nn")


def test_fake_quant_op_bits_and_straight_through(mxlab, nn):
    import torch
    x = torch.from_numpy(conformance_input()[:6].copy()).requires_grad_()
    for fmt, rule, rounding in [("mxfp8_e4m3", "floor", "nearest_even"), ("mxfp4_e2m1", "rceil", "stochastic"),
                                ("mxint8", "even", "toward_zero")]:
        y = torch.ops.mxlab.fake_quant(x, fmt, 32, rule, rounding, -1, 3)
        assert_same_bits(y.detach().numpy(), mxlab.quantize(x.detach(), fmt, 32, rule, rounding, seed=3),
                         f"fake_quant {fmt}")
        g = torch.randn_like(x)
        (gx,) = torch.autograd.grad(y, x, g)
        assert torch.equal(gx, g), "the backward of fake_quant is the identity (straight-through)"


def tiny_model(nn, grad_format):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(nn.MXLinear(32, 64, format="mxfp8_e4m3", grad_format=grad_format),
                               torch.nn.ReLU(),
                               nn.MXLinear(64, 1, format="mxfp4_e2m1", weight_format="mxfp6_e2m3",
                                           grad_format=grad_format))


@pytest.mark.parametrize("grad_format", [None, "mxfp8_e5m2"])
def test_mxlinear_trains(nn, grad_format):
    import torch
    model = tiny_model(nn, grad_format)
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(256, 32, generator=gen)
    Y = 2 * X[:, :1] - X[:, 1:2] + 0.5 * X[:, 2:3]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(25):
        opt.zero_grad()
        loss = ((model(X) - Y) ** 2).mean()
        loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses


def test_mxlinear_quantizes_input_weight_and_output_gradient(mxlab, nn):
    """The layer's forward is quantize(x) @ quantize(W)^T + b, and with grad_format its weight
    gradient is quantize(dY)^T @ quantize(x): computed here by hand with mxlab.quantize."""
    import torch
    torch.manual_seed(2)
    layer = nn.MXLinear(64, 32, format="mxfp8_e4m3", weight_format="mxfp4_e2m1", grad_format="mxfp8_e5m2")
    x = torch.randn(16, 64)
    dy = torch.randn(16, 32)
    y = layer(x)
    xq = mxlab.quantize(x, "mxfp8_e4m3")
    wq = mxlab.quantize(layer.weight.detach().contiguous(), "mxfp4_e2m1")
    assert torch.equal(y.detach(), torch.nn.functional.linear(xq, wq, layer.bias.detach()))
    y.backward(dy)
    dyq = mxlab.quantize(dy, "mxfp8_e5m2")
    assert not torch.equal(dyq, dy)
    assert torch.allclose(layer.weight.grad, dyq.t() @ xq, rtol=1e-6, atol=1e-6)
    assert torch.allclose(layer.bias.grad, dyq.sum(0), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(layer.weight.grad, dy.t() @ xq, rtol=1e-6, atol=1e-6)
