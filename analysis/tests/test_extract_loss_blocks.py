"""results/extract_loss_blocks.py: block statistics of loss_all from run files (fixture files
written by make_fixtures.py), checked against numpy on the same datasets."""
import csv

import h5py
import numpy as np
import pytest

import make_fixtures as F
from conftest import load_results_script


@pytest.fixture(scope="module")
def mod():
    return load_results_script("extract_loss_blocks")


def test_blocks_by_hand(mod):
    loss = np.array([1.0, 3.0, np.nan, 2.0, np.inf, 5.0, 4.0], dtype=np.float32)
    b = mod.blocks(loss, 3)
    assert b[0][:2] == (0, 3) and b[0][2:5] == (1.0, 3.0, 2.0) and b[0][5] == 1 and np.isnan(b[0][6])
    assert b[1] == (3, 3, 2.0, 5.0, 3.5, 1, 5.0)
    assert b[2] == (6, 1, 4.0, 4.0, 4.0, 0, 4.0)
    allbad = mod.blocks(np.array([np.nan, np.nan]), 5)
    assert allbad[0][:2] == (0, 2) and np.isnan(allbad[0][2]) and allbad[0][5] == 2


def test_run_files_to_csv(mod, tmp_path, capsys):
    a = F.write_run(str(tmp_path / "a.h5"), steps=250, seed=7, lr=5e-4, mx_diverge_at=120,
                    branches=[{"name": "to32", "at": 100}])
    b = F.write_run(str(tmp_path / "b.h5"), steps=250, seed=8)
    out = tmp_path / "blocks.csv"
    assert mod.main([str(out), "100", a, b]) == 0
    assert "blocks of 100 steps from 2 run files" in capsys.readouterr().out
    rows = list(csv.DictReader(open(out)))
    with h5py.File(a, "r") as f:
        rid = f.attrs["run_id"]
        rid = rid.decode() if isinstance(rid, bytes) else str(rid)
        mx = f["trajectories/mx/loss_all"][:].astype(np.float64)
        br = f["branches/to32/loss_all"][:].astype(np.float64)
    mine = [r for r in rows if r["run_id"] == rid and r["trajectory"] == "mx"]
    assert [int(r["block_start"]) for r in mine] == [0, 100, 200] and [int(r["steps"]) for r in mine] == [100, 100, 50]
    assert mine[0]["seed"] == "7" and float(mine[0]["lr"]) == 5e-4
    seg = mx[100:200]
    fin = seg[np.isfinite(seg)]
    assert int(mine[1]["nonfinite"]) == seg.size - fin.size
    if fin.size:
        assert float(mine[1]["max"]) == fin.max() and float(mine[1]["mean"]) == pytest.approx(fin.mean(), rel=1e-12)
    # A branch's blocks start at its `at`.
    to32 = [r for r in rows if r["run_id"] == rid and r["trajectory"] == "to32"]
    assert int(to32[0]["block_start"]) == 100 and sum(int(r["steps"]) for r in to32) == br.size
    assert {r["trajectory"] for r in rows} >= {"fp32", "mx", "to32"}
    with pytest.raises(SystemExit, match=">= 1"):
        mod.main([str(out), "0", a])
    with pytest.raises(SystemExit, match="number of steps"):
        mod.main([str(out), "ten", a])


def test_optimizer_setting_is_read_from_the_optimizer_section(mod):
    text = ("model:\n  ln_eps: 1.0e-05\noptimizer:\n  name: adam\n  lr: 0.0005\n  beta1: 0.9\n  beta2: 0.95\n"
            "  eps: 1.0e-06\nprecision:\n  attention_eps: 0.001\n  eps: 7\n")
    assert mod._optimizer(text) == ("1.0e-06", "0.95")
    # other sections' eps-like keys are not Adam's
    assert mod._optimizer("model:\n  ln_eps: 1.0e-05\nprecision:\n  eps: 7\n") == ("", "")


def test_the_optimizer_setting_tells_apart_the_runs_of_one_seed(mod, tmp_path):
    """Three runs of one seed at the E3 settings (same trajectory names): each row carries its
    run's eps and beta2, and reanalysis_excursion.read_blocks keeps the three apart with
    optimizer=True and refuses to merge them without it."""
    R = load_results_script("reanalysis_excursion")
    paths = [F.write_run(str(tmp_path / f"r{i}.h5"), steps=250, seed=7, lr=5e-4, noise_seed=i,
                         extra_config={"optimizer.eps": eps, "optimizer.beta2": b2})
             for i, (eps, b2) in enumerate([(1e-8, 0.999), (1e-6, 0.999), (1e-8, 0.95)])]
    out = tmp_path / "blocks.csv"
    assert mod.main([str(out), "100"] + paths) == 0
    rows = list(csv.DictReader(open(out)))
    assert tuple(rows[0]) == mod.COLUMNS
    assert {(float(r["eps"]), float(r["beta2"])) for r in rows} == {(1e-8, 0.999), (1e-6, 0.999), (1e-8, 0.95)}
    trajs = R.read_blocks([str(out)], optimizer=True)
    assert sorted(k for k in trajs if k[-1] == "fp32") == [(7, "0.0005", "1e-06", "0.999", "fp32"),
                                                         (7, "0.0005", "1e-08", "0.95", "fp32"),
                                                         (7, "0.0005", "1e-08", "0.999", "fp32")]
    with pytest.raises(R.DataError, match="different Adam settings"):
        R.read_blocks([str(out)])


def test_a_run_of_the_e3_sweep_made_by_the_binary(mod, binary, tmp_path):
    """Seed 200's three runs of experiments/paper/why_mx_e3.yaml (shard 0/40: runs 0, 40, 80, one
    per Adam setting), 20 steps of a width-32 model on the CPU: the run files' config_yaml gives
    the eps and beta2 columns, and the eight trajectories stay apart."""
    import os
    import subprocess

    from conftest import ROOT
    R = load_results_script("reanalysis_excursion")
    subprocess.run([binary, "run", os.path.join(ROOT, "experiments", "paper", "why_mx_e3.yaml"), "--device", "cpu",
                    "--steps", "20", "--set", "model.width=32", "--set", "data.batch=32", "--shard", "0/40", "--quiet",
                    "--out", str(tmp_path / "runs")], check=True, capture_output=True, timeout=600)
    import glob
    files = sorted(glob.glob(str(tmp_path / "runs" / "*.h5")))
    assert len(files) == 3
    out = tmp_path / "blocks.csv"
    assert mod.main([str(out), "100"] + files) == 0
    trajs = R.read_blocks([str(out)], optimizer=True)
    assert sorted((k[2], k[3], k[4]) for k in trajs) == sorted(
        [("1e-08", "0.999", t) for t in ("fp32", "mx_all", "noise_mx", "mx_sr_grad")] +
        [("1e-06", "0.999", t) for t in ("fp32", "mx_all")] + [("1e-08", "0.95", t) for t in ("fp32", "mx_all")])
    # the three runs' FP32 trajectories differ (Adam's setting changes them): merged they would collide
    fp32 = [t["mins"] for k, t in trajs.items() if k[-1] == "fp32"]
    assert len({tuple(m) for m in fp32}) == 3
