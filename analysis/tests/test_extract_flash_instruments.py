"""results/extract_flash_instruments.py: the per-layer attention instruments of a real run file of
the trainer (MXLAB_BINARY: a causal token network with exact attention in the FP32 trajectory and
a flash arm), one row per logged step and layer, equal to the file's datasets to 9 digits, flash
instruments empty where the attention is exact; gzip output."""
import csv
import gzip
import subprocess

import h5py
import numpy as np
import pytest

from conftest import load_results_script, mxlab_binary

EXPERIMENT = """\
name: instruments
seed: 1004
steps: 6
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2, block: attention, heads: 2, causal: true}
data: {batch: 2, seq_len: 32, kind: tokens, vocab: 16}
loss: xent
optimizer: {name: adamw, lr: 1.0e-2, beta2: 0.95}
precision: {weight: fp32, activation: fp32, grad: fp32, ln_affine: none, elementwise: fp32}
log: {log_every: 2, bias_every: 2, progress: false}
arms:
  - {name: flash, apply: flash_bf16}
"""


@pytest.fixture(scope="module")
def mod():
    return load_results_script("extract_flash_instruments")


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    binary = mxlab_binary()
    d = tmp_path_factory.mktemp("flash_instruments")
    (d / "e.yaml").write_text(EXPERIMENT)
    subprocess.run([binary, "run", str(d / "e.yaml"), "--out", str(d / "out"), "--quiet"], check=True,
                   capture_output=True, timeout=600)
    (path,) = list((d / "out").glob("*.h5"))
    return path


def test_rows_equal_the_datasets(mod, run_file, tmp_path):
    out = tmp_path / "inst.csv"
    assert mod.main([str(out), str(run_file)]) == 0
    rows = list(csv.DictReader(open(out)))
    with h5py.File(run_file, "r") as f:
        steps = f["trajectories/flash/step"][:]
        ds = {k: f[f"trajectories/flash/{k}"][:] for k in mod.INSTRUMENTS}
        fp32_logits = f["trajectories/fp32/attn_logit_max"][:]
    assert len(steps) == 4 and len(rows) == 2 * len(steps) * 2  # trajectories x logged rows (0, 2, 4, 5) x layers
    flash = [r for r in rows if r["trajectory"] == "flash"]
    assert [(int(r["step"]), int(r["layer"])) for r in flash] == [(int(s), k) for s in steps for k in (0, 1)]
    for r in flash:
        i = list(steps).index(int(r["step"]))
        for k in mod.INSTRUMENTS:
            want = ds[k][i, int(r["layer"])]
            if np.isnan(want):  # e.g. attn_dwq_err_cos on a row without a previous shadow step
                assert r[k] == "", k
            else:
                assert float(r[k]) == pytest.approx(want, rel=1e-8, abs=1e-300), k
    # the running sum is the sum of the logged rows' delta bias
    for k in (0, 1):
        np.testing.assert_allclose(ds["attn_delta_bias_cumsum"][:, k], np.cumsum(ds["attn_delta_bias"][:, k]), rtol=1e-12)
    fp32 = [r for r in rows if r["trajectory"] == "fp32"]
    assert all(r["attn_multi_max_frac"] == r["attn_delta_bias"] == "" for r in fp32)  # exact attention: NaN
    assert [float(r["attn_logit_max"]) for r in fp32] == pytest.approx(list(fp32_logits.ravel()), rel=1e-8)
    assert any(float(r["attn_multi_max_frac"]) > 0 for r in flash if r["layer"] == "0")  # repeated tokens
    assert all(float(r["attn_wq_spec"]) > 0 and float(r["attn_wk_spec"]) > 0 for r in rows)  # every trajectory


def test_gzip_output_and_no_attention(mod, run_file, tmp_path, capsys):
    out = tmp_path / "inst.csv.gz"
    assert mod.main([str(out), str(run_file)]) == 0
    plain = tmp_path / "plain.csv"
    mod.main([str(plain), str(run_file)])
    assert gzip.decompress(out.read_bytes()) == plain.read_bytes()
    with h5py.File(tmp_path / "mlp.h5", "w") as f:  # no attention datasets
        f.attrs["run_id"], f.attrs["seed"], f.attrs["config_yaml"] = "x", 1, "lr: 0.001\n"
        f.create_dataset("trajectories/fp32/step", data=np.arange(3))
        f.create_dataset("trajectories/fp32/loss", data=np.ones(3))
    none = tmp_path / "none.csv"
    assert mod.main([str(none), str(tmp_path / "mlp.h5")]) == 0
    assert not none.exists() and "no attention layer" in capsys.readouterr().out
