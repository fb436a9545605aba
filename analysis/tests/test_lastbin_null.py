"""results/lastbin_null.py: the last-bin count by hand, and against mxlab's own quantizer."""

import os

import numpy as np
import pytest
from conftest import load_results_script


@pytest.fixture(scope="module")
def mod():
    return load_results_script("lastbin_null")


def test_last_bin_by_hand(mod):
    # Block max 500 -> floor(log2 500) = 8, X = 2^0: the last bin is |x| >= 432.
    # Block max 0.5 * 500 -> X = 2^-1, the same elements scaled: the same count.
    row = np.zeros(32, np.float32)
    row[:5] = [500.0, -432.0, 431.9, 440.0, 100.0]
    x = np.stack([row, row * 0.5, np.zeros(32, np.float32)])
    el, bl = mod.lastbin_fraction(x)
    assert el == pytest.approx(6 / 96) and bl == pytest.approx(2 / 3)  # 500, -432, 440 twice; zero block none
    # Max 256 exactly: 256 / 2^0 = 256 < 432, nothing else in the block.
    assert mod.lastbin_fraction(np.full((1, 32), 256.0, np.float32))[0] == 0.0


def test_agrees_with_mxlab_quantize(mod):
    binary = os.environ.get("MXLAB_BINARY")
    if not binary or not os.path.exists(binary):
        pytest.skip("MXLAB_BINARY (built mxlab) not set: scripts/test.sh sets it")
    for kind in ("gauss", "laplace", "gelu"):
        x = mod.blocks(kind, 3000, 7)
        assert mod.mxlab_fraction(binary, x) == pytest.approx(mod.lastbin_fraction(x)[0], abs=1e-12), kind


def test_cli_table(mod, capsys):
    assert mod.main(["--blocks", "20000", "--mxlab", ""]) == 0
    out = capsys.readouterr().out
    gauss = float(out.split("| gauss | ")[1].split(" %")[0])
    assert 1.0 < gauss < 1.3  # ~1.16 % for N(0, 1) blocks (200,000 blocks: 1.157 %)
    with pytest.raises(SystemExit):
        mod.main(["--blocks", "0"])
