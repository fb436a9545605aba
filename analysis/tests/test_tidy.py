"""mxlab.tidy: the long table of a results directory. On the synthetic sweep: columns,
swept keys, values against h5py. With the binary (MXLAB_BINARY): `mxlab export DIR --long` and
tidy.load agree row for row on a small real sweep, and pandas reads `summarize --compare-csv`."""

import os
import subprocess

import h5py
import numpy as np
import pytest

pd = pytest.importorskip("pandas")

from mxlab import AnalysisError, tidy  # noqa: E402

FIXED = ["seed", "trajectory", "kind", "arm", "step", "metric", "column", "value"]


def test_load_columns_and_values_against_h5py(sweep_dir):
    df = tidy.load(sweep_dir)
    assert list(df.columns[:1]) == ["run_id"] and list(df.columns[-8:]) == FIXED
    swept = list(df.columns[1:-8])
    assert "model.width" in swept and "model.depth" in swept and "seed" not in swept
    assert df["step"].dtype == np.int64 and df["value"].dtype == np.float64
    assert set(df["kind"]) == {"fp32", "arm"}
    path = os.path.join(sweep_dir, "w512_L4.h5")
    with h5py.File(path, "r") as f:
        run_id = f.attrs["run_id"]
        run_id = run_id.decode() if isinstance(run_id, bytes) else str(run_id)
        sub = df[df["run_id"] == run_id]
        assert set(sub["model.width"]) == {512} and set(sub["model.depth"]) == {4}
        assert set(sub["seed"]) == {int(f.attrs["seed"])}
        mx = sub[sub["trajectory"] == "mx"]
        loss = mx[mx["metric"] == "loss"]
        np.testing.assert_array_equal(loss["step"], f["trajectories/mx/step"][()])
        np.testing.assert_array_equal(loss["value"], f["trajectories/mx/loss"][()])
        assert (loss["column"] == "").all() and (loss["arm"] == "mx").all()
        # A per-layer dataset: one column per layer, layer<k> without `names`.
        g = f["trajectories/mx/gamma_lastbin"][()]
        for k in range(g.shape[1]):
            rows = mx[(mx["metric"] == "gamma_lastbin") & (mx["column"] == f"layer{k}")]
            np.testing.assert_array_equal(rows["value"], g[:, k])
        # loss_all at its own steps, from 0.
        all_ = mx[mx["metric"] == "loss_all"]
        np.testing.assert_array_equal(all_["step"], np.arange(len(f["trajectories/mx/loss_all"])))
        np.testing.assert_array_equal(all_["value"], f["trajectories/mx/loss_all"][()].astype(np.float64))
    # The fp32 trajectory's arm is fp32, and its rows come first in each run.
    first = df.groupby("run_id", sort=False).head(1)
    assert (first["trajectory"] == "fp32").all() and (first["metric"] == "loss").all()


def test_branches_fork_from_their_arm(branches_run):
    df = tidy.load(branches_run)
    assert list(df.columns) == ["run_id"] + FIXED  # one run: no swept keys
    br = df[df["kind"] == "branch"]
    assert set(br["trajectory"]) == {"fp32_early", "skip_ln_quant_early", "fp32_late"}
    assert set(br["arm"]) == {"mx"}
    late = br[(br["trajectory"] == "fp32_late") & (br["metric"] == "loss_all")]
    assert late["step"].iloc[0] == 290  # a branch's loss_all starts at its `at`
    # Branches in the order of their `at`, after the trajectories.
    order = list(dict.fromkeys(df["trajectory"]))
    assert order[:2] == ["fp32", "mx"] and order[-1] == "fp32_late"


def test_bad_input_is_an_analysis_error(tmp_path):
    with pytest.raises(AnalysisError, match="no such file or directory"):
        tidy.load(str(tmp_path / "nosuch"))
    with pytest.raises(AnalysisError, match="no readable run file"):
        tidy.load(str(tmp_path))
    (tmp_path / "bad.h5").write_text("not hdf5")
    with pytest.raises(AnalysisError, match="no readable run file"):
        with pytest.warns(UserWarning, match="left out bad.h5"):
            tidy.load(str(tmp_path))


def test_top_level_load_and_to_xarray_are_the_tidy_ones(sweep_dir):
    import mxlab
    df = mxlab.load(sweep_dir)
    pd.testing.assert_frame_equal(df, tidy.load(sweep_dir))
    with pytest.raises(AnalysisError) as top:
        mxlab.to_xarray(df, "nosuch")
    with pytest.raises(AnalysisError) as direct:
        tidy.to_xarray(df, "nosuch")
    assert str(top.value) == str(direct.value)  # "no rows of metric", or "needs xarray" without it


def test_to_xarray(sweep_dir):
    df = tidy.load(sweep_dir)
    try:
        import xarray  # noqa: F401
    except ImportError:
        with pytest.raises(AnalysisError, match="xarray"):
            tidy.to_xarray(df, "loss")
        return
    da = tidy.to_xarray(df, "loss")
    assert da.dims == ("run_id", "trajectory", "step")
    with pytest.raises(AnalysisError, match="no rows of metric"):
        tidy.to_xarray(df, "nosuch")


# A small real sweep: 2 learning rates x 2 seeds, two arms, a branch from one of them.
YAML = """name: tidy
seed: 1
steps: 40
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2}
data: {batch: 32}
optimizer: {name: adam, lr: 0.003}
log: {log_every: 10}
arms:
  - {name: e4}
  - {name: e2, set: {weight: mxfp4_e2m1}}
interventions:
  - {name: to32, at: 20, apply: to_fp32, from: e2}
sweep:
  grid: {optimizer.lr: [0.001, 0.003]}
  seeds: [1, 2]
"""


@pytest.fixture(scope="module")
def real_sweep(binary, tmp_path_factory):
    d = tmp_path_factory.mktemp("tidy_sweep")
    (d / "s.yaml").write_text(YAML)
    out = d / "runs"
    subprocess.run([binary, "run", str(d / "s.yaml"), "--out", str(out), "--quiet"], check=True,
                   capture_output=True, text=True)
    return str(out)


def test_binary_long_csv_and_load_agree_row_for_row(binary, real_sweep, tmp_path):
    out = tmp_path / "long.csv"
    p = subprocess.run([binary, "export", real_sweep, "--long", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    a = tidy.load(real_sweep)
    b = tidy.read_long_csv(str(out))
    assert list(a.columns) == ["run_id", "optimizer.lr"] + FIXED
    assert list(b.columns) == list(a.columns)
    assert len(a) == len(b) > 4000
    assert set(a["kind"]) == {"fp32", "arm", "branch"}
    assert set(a[a["kind"] == "branch"]["arm"]) == {"e2"}
    for c in a.columns:
        if c == "value":
            continue
        assert a[c].dtype == b[c].dtype, c
        assert (a[c].to_numpy() == b[c].to_numpy()).all(), c
    x, y = a["value"].to_numpy(), b["value"].to_numpy()
    nan = np.isnan(x)
    assert (nan == np.isnan(y)).all()
    # float32 values are written with 9 digits (they read back to the same float32), others exactly.
    assert (x[~nan].astype(np.float32) == y[~nan].astype(np.float32)).all()
    f64 = ~nan & (x.astype(np.float32).astype(np.float64) != x)
    assert f64.any() and (x[f64] == y[f64]).all()
    assert sorted(a["optimizer.lr"].unique()) == [0.001, 0.003]
    assert sorted(a["seed"].unique()) == [1, 2]


def test_pandas_reads_the_compare_csv(binary, real_sweep, tmp_path):
    pairs = tmp_path / "pairs.csv"
    p = subprocess.run([binary, "summarize", real_sweep, "--no-index", "--by", "arm,optimizer.lr",
                        "--within", "optimizer.lr", "--compare-csv", str(pairs), "--csv",
                        "--excursion-window", "10", "--excursion-block", "5"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    df = pd.read_csv(pairs)
    assert list(df.columns[:4]) == ["a_arm", "a_optimizer.lr", "b_arm", "b_optimizer.lr"]
    assert "fisher_p" in df.columns and "permutation_p" in df.columns
    assert len(df) == 6  # fp32, e2, e4: 3 pairs at each of 2 learning rates
    assert (df["a_optimizer.lr"] == df["b_optimizer.lr"]).all()
    assert df["fisher_p"].dtype == np.float64
    # --where narrows the runs (numbers as numbers: 1e-3 is 0.001).
    p = subprocess.run([binary, "summarize", real_sweep, "--no-index", "--by", "arm", "--where",
                        "optimizer.lr=1e-3", "--compare-csv", str(pairs), "--csv",
                        "--excursion-window", "10", "--excursion-block", "5"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    groups = pd.read_csv(__import__("io").StringIO(p.stdout))
    assert list(groups["n"]) == [2, 2, 2]
    assert len(pd.read_csv(pairs)) == 3
