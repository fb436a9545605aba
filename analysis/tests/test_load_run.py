"""load_run: the round trip of every part of a run file, bytes attributes, killed-run files."""

import h5py
import numpy as np
import pytest

import make_fixtures as F
from conftest import BRANCHES, STEPS
from mxlab import AnalysisError, metrics
from mxlab import schema as S


def test_round_trip_root_config_and_groups(branches_run):
    run = S.load_run(branches_run)
    with h5py.File(branches_run, "r") as f:
        assert run.run_id == f.attrs["run_id"]
        assert run.attrs["seed"] == 3 and isinstance(run.attrs["seed"], int)
        assert run.attrs["steps"] == STEPS
        assert run.config_text == f.attrs["config_yaml"]
        mx_loss = f["trajectories/mx/loss"][:]
        per_layer = f["trajectories/mx/gamma_lastbin"][:]
    assert run.status == "diverged"
    assert run.config["model.width"] == 512 and run.config["optimizer.lr"] == pytest.approx(6e-4)
    assert set(run.trajectories) == {"fp32", "mx"}
    assert list(run.branches) == [b["name"] for b in BRANCHES]  # ordered by `at`, then name
    mx = run.mx
    np.testing.assert_array_equal(mx.loss, mx_loss)
    np.testing.assert_array_equal(mx.get("gamma_lastbin"), per_layer)
    assert mx.get("gamma_lastbin").shape == (mx.n, 4)
    assert mx.layers == 4
    assert mx.attrs[S.ATTR_PARAM_GROUPS][:2] == ["layer0.gamma", "layer0.beta"]
    assert mx.quantized("gamma_lastbin") is True
    assert run.fp32.quantized("ln_out_lastbin") is False
    assert mx.dataset_attrs["bias_ratio_group"][S.DATASET_ATTR_NAMES] == F.param_group_names(4)
    assert mx.loss_all.size == STEPS and mx.loss_all.dtype == np.float64
    # bias rows are NaN where the shadow pass did not run (bias_every = 2 * log_every)
    assert np.isnan(mx.get("bias_ratio")[1]) and np.isfinite(mx.get("bias_ratio")[0])
    assert "bias_ratio" not in run.fp32.data
    branch = run.branches["fp32_late"]
    assert branch.kind == "branch" and branch.at == 290 and branch.step[0] >= 290
    assert "fp32" in branch.attrs[S.ATTR_PATCH]
    assert not run.truncated


def test_summary_attributes_read_from_file(diverging_run):
    run = S.load_run(diverging_run)
    summary = metrics.summarize(run.mx, run.config)
    assert summary["source"] == "file"
    with h5py.File(diverging_run, "r") as f:
        assert summary[S.SUM_DIVERGENCE] == f["trajectories/mx"].attrs[S.SUM_DIVERGENCE]
    assert 300 <= summary[S.SUM_DIVERGENCE] < 340
    assert metrics.summarize(run.fp32, run.config)[S.SUM_DIVERGENCE] == S.NO_STEP


def test_fixed_length_byte_attributes_decode(tmp_path, stable_run):
    """The C++ writer may store fixed-length ASCII strings; h5py hands those back as bytes."""
    path = tmp_path / "bytes.h5"
    with h5py.File(stable_run, "r") as src, h5py.File(path, "w") as dst:
        for k, v in src.attrs.items():
            dst.attrs[k] = np.bytes_(v.encode()) if isinstance(v, str) else v
        src.copy("trajectories", dst)
        names = src["trajectories/mx"].attrs[S.ATTR_PARAM_GROUPS]
        dst["trajectories/mx"].attrs[S.ATTR_PARAM_GROUPS] = np.array([n.encode() for n in names],
                                                                      dtype="S16")
    run = S.load_run(str(path))
    assert run.status == "complete" and isinstance(run.run_id, str)
    assert run.config["model.depth"] == 4
    assert run.mx.attrs[S.ATTR_PARAM_GROUPS][0] == "layer0.gamma"


def test_killed_run_ragged_is_truncated_to_shortest(killed_ragged):
    with h5py.File(killed_ragged, "r") as f:
        full = f["trajectories/mx/step"].shape[0]
        assert f["trajectories/mx/loss"].shape[0] == full - 2
        assert f["trajectories/mx/gamma_lastbin"].shape[0] == full - 3
    run = S.load_run(killed_ragged)
    assert run.status == S.STATUS_RUNNING and run.truncated
    mx = run.mx
    assert mx.n == full - 3 and mx.truncated
    assert {len(v) for v in mx.data.values()} == {full - 3}
    assert run.fp32.n == full - 1  # each group is cut on its own
    summary = metrics.summarize(mx, run.config)
    assert summary["source"] == "computed"  # a killed run has no summary attributes
    assert summary[S.SUM_DIVERGENCE] == S.NO_STEP and summary[S.SUM_STEPS_RUN] == STEPS


def test_killed_run_unwritten_rows_are_dropped(killed_zeros):
    """Rows extended but never written read back as step 0: cut where step stops increasing."""
    with h5py.File(killed_zeros, "r") as f:
        written = f["trajectories/mx/step"].shape[0] - 2
        assert f["trajectories/mx/step"][-1] == 0
    run = S.load_run(killed_zeros)
    assert run.mx.n == written and run.mx.truncated
    assert np.all(np.diff(run.mx.step) > 0)


def test_bad_inputs_raise_analysis_error(tmp_path):
    with pytest.raises(AnalysisError, match="no such file"):
        S.load_run(str(tmp_path / "missing.h5"))
    (tmp_path / "junk.h5").write_text("not hdf5")
    with pytest.raises(AnalysisError, match="not a readable HDF5"):
        S.load_run(str(tmp_path / "junk.h5"))
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.attrs["x"] = 1
    with pytest.raises(AnalysisError, match="not an mxlab run file"):
        S.load_run(str(tmp_path / "other.h5"))
    with h5py.File(tmp_path / "newer.h5", "w") as f:
        f.attrs["schema_version"] = S.SCHEMA_VERSION + 1
    with pytest.raises(AnalysisError, match="newer"):
        S.load_run(str(tmp_path / "newer.h5"))


def test_find_runs(tmp_path, sweep_dir):
    assert len(S.find_runs([sweep_dir])) == 4
    with pytest.raises(AnalysisError, match="no .h5 run files"):
        S.find_runs([str(tmp_path)])
    with pytest.raises(AnalysisError, match="no such file"):
        S.find_runs([str(tmp_path / "nope")])


def test_reads_a_file_another_process_holds_open_for_writing(stable_run, tmp_path):
    """A run in progress: the trainer keeps its file open (and HDF5-locked) for writing."""
    import shutil
    import subprocess
    import sys
    path = tmp_path / "live.h5"
    shutil.copy(stable_run, path)
    with subprocess.Popen(
            [sys.executable, "-c", "import sys, h5py; f = h5py.File(sys.argv[1], 'a'); "
             "print('open', flush=True); sys.stdin.read()", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as writer:
        try:
            assert writer.stdout.readline().strip() == "open"
            run = S.load_run(str(path))
            assert run.status == "complete" and run.mx.n > 0
        finally:
            writer.stdin.close()  # the writer exits when its stdin ends
            writer.wait(timeout=30)


def test_unknown_dataset_on_another_axis_does_not_cut_the_rows(tmp_path, arms_run):
    """A later schema may log something on its own axis (as curvature does): a dataset this
    package does not know whose length is not the row count is kept aside, not cut to."""
    import shutil
    path = tmp_path / "extra.h5"
    shutil.copy(arms_run, path)
    with h5py.File(path, "a") as f:
        g = f["trajectories/floor"]
        g.create_dataset("future_step", data=np.arange(7))
        g.create_dataset("new_row_thing", data=np.ones(g["step"].shape[0]))
    floor = S.load_run(str(path)).arm("floor")
    assert floor.n == STEPS // 10 and not floor.truncated
    assert floor.other["future_step"].shape == (7,) and floor.get("new_row_thing").shape == (floor.n,)
