"""results/extract_spectral.py: spectral norms of W_Q, W_K, W_V, W_O from parameter snapshots and
the low-rank share and direction of a trajectory's difference to the FP32 trajectory, on a
hand-built run file with known matrices and on a real run file of the trainer (MXLAB_BINARY)."""
import csv
import gzip
import subprocess

import h5py
import numpy as np
import pytest

from conftest import load_results_script, mxlab_binary

D = 4


@pytest.fixture(scope="module")
def mod():
    return load_results_script("extract_spectral")


def _wqkv(q, k, v):
    return np.concatenate([q, k, v]).astype(np.float32)


def _write(path):
    """fp32 and arm `flash` at steps 0, 10, 20, 30, 40. fp32 never changes; flash's W_Q is fp32's
    plus a rank-one error along e0 e1^T growing at 10 and 20, then mostly along e2 e3^T at 30 and
    along e2 e0^T at 40 (the same left vector, another right one)."""
    q, k, v, o = (np.diag([s, 1.0, 1.0, 1.0]) for s in (5.0, 2.0, 7.0, 4.0))
    e = np.eye(D)
    errs = {0: 0.0 * e[0:1].T @ e[1:2], 10: 0.5 * e[0:1].T @ e[1:2], 20: 1.5 * e[0:1].T @ e[1:2],
            30: 1.5 * e[0:1].T @ e[1:2] + 3.0 * e[2:3].T @ e[3:4],
            40: 1.5 * e[0:1].T @ e[1:2] + 10.0 * e[2:3].T @ e[0:1]}
    with h5py.File(path, "w") as f:
        f.attrs["run_id"], f.attrs["seed"] = "abc123def456", 301
        f.attrs["config_yaml"] = "optimizer:\n  name: adamw\n  lr: 0.003\n"
        f.create_dataset("snapshots/probe_x", data=np.zeros((2, 1), np.float32))
        for s, err in errs.items():
            f.create_dataset(f"snapshots/fp32/step_{s}/layer0.Wqkv", data=_wqkv(q, k, v))
            f.create_dataset(f"snapshots/fp32/step_{s}/layer0.Wo", data=o.astype(np.float32))
            f.create_dataset(f"snapshots/fp32/step_{s}/layer0.W1", data=np.ones((8, D), np.float32))
            f.create_dataset(f"snapshots/flash/step_{s}/layer0.Wqkv", data=_wqkv(q + err, k, v))
            f.create_dataset(f"snapshots/flash/step_{s}/layer0.Wo", data=o.astype(np.float32))


def _rows(mod, tmp_path, *paths):
    out = tmp_path / "spectral.csv"
    assert mod.main([str(out), *map(str, paths)]) == 0
    return list(csv.DictReader(open(out)))


def _one(rows, trajectory, step, matrix, layer="0"):
    (r,) = [r for r in rows if (r["trajectory"], r["step"], r["matrix"], r["layer"]) == (trajectory, str(step), matrix, layer)]
    return r


def test_known_matrices(mod, tmp_path):
    _write(tmp_path / "r.h5")
    rows = _rows(mod, tmp_path, tmp_path / "r.h5")
    assert len(rows) == 2 * 5 * 4  # trajectories x steps x (Q, K, V, O); W1 is no attention matrix
    r = _one(rows, "fp32", 10, "W_Q")
    assert (r["run_id"], r["seed"], r["lr"]) == ("abc123def456", "301", "0.003")
    # each block of Wqkv is its own matrix: rows 0..d-1 Q, d..2d-1 K, 2d..3d-1 V
    for name, sigma in (("W_Q", 5.0), ("W_K", 2.0), ("W_V", 7.0), ("W_O", 4.0)):
        r = _one(rows, "fp32", 20, name)
        assert float(r["sigma_max"]) == pytest.approx(sigma)
        assert float(r["fro"]) == pytest.approx(np.sqrt(sigma ** 2 + 3))
        assert r["diff_fro"] == r["diff_rank1"] == r["diff_dir_cos"] == ""  # no difference of fp32 to itself
    # flash: no error at 0; rank one at 10 (no previous direction); the same direction grows at 20
    r0 = _one(rows, "flash", 0, "W_Q")
    assert float(r0["diff_fro"]) == 0.0 and r0["diff_rank1"] == "" and r0["diff_dir_cos"] == ""
    r10 = _one(rows, "flash", 10, "W_Q")
    assert float(r10["diff_fro"]) == pytest.approx(0.5) and float(r10["diff_sigma1"]) == pytest.approx(0.5)
    assert float(r10["diff_rank1"]) == pytest.approx(1.0) and r10["diff_dir_cos"] == ""
    r20 = _one(rows, "flash", 20, "W_Q")
    assert float(r20["diff_rank1"]) == pytest.approx(1.0) and float(r20["diff_dir_cos"]) == pytest.approx(1.0)
    # at 30 the largest error lies along e2 e3^T, orthogonal to the previous direction; two directions
    r30 = _one(rows, "flash", 30, "W_Q")
    assert float(r30["diff_sigma1"]) == pytest.approx(3.0)
    assert float(r30["diff_rank1"]) == pytest.approx(9.0 / (9.0 + 2.25))
    assert float(r30["diff_dir_cos"]) == pytest.approx(0.0, abs=1e-12)
    # at 40 the left singular vector stays e2 and the right one turns from e3 to e0: both count
    r40 = _one(rows, "flash", 40, "W_Q")
    assert float(r40["diff_sigma1"]) == pytest.approx(10.0)
    assert float(r40["diff_dir_cos"]) == pytest.approx(0.0, abs=1e-12)
    # W_K, W_V, W_O of flash equal fp32's: zero difference
    assert all(float(_one(rows, "flash", 30, m)["diff_fro"]) == 0.0 for m in ("W_K", "W_V", "W_O"))


def test_non_finite_snapshot_gives_empty_cells_not_a_failure(mod, tmp_path):
    """A trajectory that blew up has NaN or inf in its last snapshots (a flash-study seed's
    stabilized arm did, and numpy's SVD stopped the extraction): those rows come with empty cells,
    the finite ones as before, and the direction after a non-finite difference has no previous one."""
    _write(tmp_path / "r.h5")
    with h5py.File(tmp_path / "r.h5", "r+") as f:
        w = f["snapshots/flash/step_30/layer0.Wqkv"]
        bad = w[()]
        bad[0, 0] = np.nan
        bad[D + 1, 2] = np.inf  # W_K
        w[...] = bad
    rows = _rows(mod, tmp_path, tmp_path / "r.h5")
    assert len(rows) == 2 * 5 * 4
    for m in ("W_Q", "W_K"):
        r = _one(rows, "flash", 30, m)
        assert r["sigma_max"] == r["fro"] == r["diff_fro"] == r["diff_sigma1"] == r["diff_rank1"] == r["diff_dir_cos"] == ""
    assert float(_one(rows, "flash", 30, "W_V")["sigma_max"]) == pytest.approx(7.0)
    assert float(_one(rows, "flash", 20, "W_Q")["diff_dir_cos"]) == pytest.approx(1.0)
    r40 = _one(rows, "flash", 40, "W_Q")
    assert float(r40["diff_sigma1"]) == pytest.approx(10.0) and r40["diff_dir_cos"] == ""


def test_gzip_output(mod, tmp_path):
    _write(tmp_path / "r.h5")
    assert mod.main([str(tmp_path / "s.csv.gz"), str(tmp_path / "r.h5")]) == 0
    assert mod.main([str(tmp_path / "s.csv"), str(tmp_path / "r.h5")]) == 0
    assert gzip.decompress((tmp_path / "s.csv.gz").read_bytes()) == (tmp_path / "s.csv").read_bytes()


def test_no_snapshot_writes_nothing(mod, tmp_path, capsys):
    with h5py.File(tmp_path / "bare.h5", "w") as f:
        f.attrs["run_id"], f.attrs["seed"], f.attrs["config_yaml"] = "x", 1, "lr: 0.001\n"
    out = tmp_path / "none.csv"
    assert mod.main([str(out), str(tmp_path / "bare.h5")]) == 0
    assert not out.exists() and "no attention snapshot" in capsys.readouterr().out


TOKEN_FLASH = """\
name: spectral
seed: 1003
steps: 4
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2, block: attention, heads: 2, causal: true}
data: {batch: 2, seq_len: 32, kind: tokens, vocab: 16}
loss: xent
optimizer: {name: adamw, lr: 1.0e-2, beta2: 0.95}
precision: {weight: fp32, activation: fp32, grad: fp32, ln_affine: none, elementwise: fp32}
log: {log_every: 2, bias_every: 2, snapshot_every: 2, progress: false}
arms:
  - {name: flash, apply: flash_bf16}
"""


def test_real_run_file(mod, tmp_path):
    """The trainer's own snapshot layout: every trajectory x step x layer x matrix; at step 0 the
    arm equals the FP32 trajectory (the same initial weights); sigma_max of W_Q is the SVD's of the
    snapshot's first d rows of Wqkv."""
    binary = mxlab_binary()
    exp = tmp_path / "e.yaml"
    exp.write_text(TOKEN_FLASH)
    subprocess.run([binary, "run", str(exp), "--out", str(tmp_path / "out"), "--quiet"], check=True,
                   capture_output=True, timeout=600)
    (path,) = list((tmp_path / "out").glob("*.h5"))
    rows = _rows(mod, tmp_path, path)
    assert len(rows) == 2 * 3 * 2 * 4  # fp32, flash x steps 0, 2, 4 x 2 layers x 4 matrices
    assert all(float(r["diff_fro"]) == 0.0 for r in rows if r["trajectory"] == "flash" and r["step"] == "0")
    assert any(float(r["diff_fro"]) > 0.0 for r in rows if r["trajectory"] == "flash" and r["step"] == "4")
    with h5py.File(path, "r") as f:
        w = f["snapshots/flash/step_4/layer1.Wqkv"][()].astype(np.float64)
    assert w.shape == (96, 32)
    r = _one(rows, "flash", 4, "W_Q", layer="1")
    assert float(r["sigma_max"]) == pytest.approx(np.linalg.svd(w[:32], compute_uv=False)[0], rel=1e-12)
