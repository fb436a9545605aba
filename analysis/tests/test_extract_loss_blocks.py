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
