"""`mxlab export RUN_OR_DIR --tensorboard OUT` read back with TensorBoard's own reader
(EventAccumulator): one TensorBoard run per trajectory and branch, every logged scalar at its
steps, loss_all at every step (a branch's from its `at`), values equal to the run file's as
float32, and the same bytes when exported again. Needs MXLAB_BINARY (scripts/test.sh sets it) and
the `tensorboard` package (scripts/install-deps.sh)."""

import os
import subprocess

import h5py
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

YAML = """name: tb
seed: 3
steps: 60
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2}
data: {batch: 32}
log: {log_every: 10}
arms:
  - {name: mx}
  - {name: e5m2, set: {weight: mxfp8_e5m2}}
interventions:
  - {name: to32, at: 30, apply: to_fp32}
"""


@pytest.fixture(scope="module")
def exported(binary, tmp_path_factory):
    d = tmp_path_factory.mktemp("tb")
    (d / "tb.yaml").write_text(YAML)
    out = d / "runs"
    subprocess.run([binary, "run", str(d / "tb.yaml"), "--out", str(out), "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    (run_file,) = [p for p in out.iterdir() if p.suffix == ".h5"]
    tb = d / "tensorboard"
    listed = subprocess.run([binary, "export", str(out), "--tensorboard", str(tb)], check=True,
                            capture_output=True, text=True).stdout.split()
    return run_file, tb, listed


def accumulator(path):
    acc = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return acc


def test_one_tensorboard_run_per_trajectory_and_branch(exported):
    run_file, tb, listed = exported
    run_id = run_file.stem
    assert sorted(os.listdir(tb / run_id)) == ["branch-to32", "e5m2", "fp32", "mx"]
    assert len(listed) == 4
    for p in listed:
        assert os.path.basename(p).startswith("events.out.tfevents.")
        assert os.path.exists(p)


def test_scalars_equal_the_run_file(exported):
    run_file, tb, _ = exported
    with h5py.File(run_file, "r") as f:
        for kind, names in (("trajectories", ["fp32", "mx", "e5m2"]), ("branches", ["to32"])):
            for name in names:
                g = f[f"{kind}/{name}"]
                acc = accumulator(tb / run_file.stem / (name if kind == "trajectories" else "branch-" + name))
                tags = acc.Tags()["scalars"]
                # loss_all: every step, from the branch's first step.
                first = int(g.attrs["at"]) if kind == "branches" else 0
                events = acc.Scalars("loss_all")
                loss_all = np.asarray(g["loss_all"][:], dtype=np.float32)
                assert [e.step for e in events] == list(range(first, first + len(loss_all)))
                np.testing.assert_array_equal(np.array([e.value for e in events], dtype=np.float32), loss_all)
                # Every 1-D dataset on the logged steps, at those steps.
                steps = list(g["step"][:])
                checked = 0
                for d, ds in g.items():
                    if d in ("step", "loss_all") or d.endswith("_step") or ds.ndim != 1 or "axis" in ds.attrs:
                        continue
                    assert d in tags, (name, d)
                    ev = acc.Scalars(d)
                    assert [e.step for e in ev] == steps[: len(ds)], (name, d)
                    want = np.asarray(ds[:], dtype=np.float32)
                    got = np.array([e.value for e in ev], dtype=np.float32)
                    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=d)
                    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)], err_msg=d)
                    checked += 1
                assert checked >= 2, (name, tags)
                # A per-layer dataset as <metric>/layer<k> (or /<group>).
                two_d = [d for d, ds in g.items() if ds.ndim == 2 and "axis" not in ds.attrs]
                for d in two_d:
                    width = g[d].shape[1]
                    names2 = [n.decode() if isinstance(n, bytes) else n for n in g[d].attrs.get("names", [])]
                    sub = names2 if len(names2) == width else [f"layer{k}" for k in range(width)]
                    for k, s in enumerate(sub):
                        ev = acc.Scalars(f"{d}/{s}")
                        want = np.asarray(g[d][:, k], dtype=np.float32)
                        got = np.array([e.value for e in ev], dtype=np.float32)
                        np.testing.assert_array_equal(np.nan_to_num(got, nan=-7), np.nan_to_num(want, nan=-7))


def test_exporting_again_gives_the_same_bytes(exported, binary, tmp_path):
    run_file, tb, listed = exported
    again = tmp_path / "again"
    out = subprocess.run([binary, "export", str(run_file), "--tensorboard", str(again)], check=True,
                         capture_output=True, text=True).stdout.split()
    assert len(out) == len(listed)
    for p in listed:
        rel = os.path.relpath(p, tb)
        with open(p, "rb") as a, open(again / rel, "rb") as b:
            assert a.read() == b.read(), rel


def test_csv_and_npy_refuse_a_directory(exported, binary, tmp_path):
    run_file, _, _ = exported
    r = subprocess.run([binary, "export", str(run_file.parent), "--csv", str(tmp_path / "c")], capture_output=True,
                       text=True)
    assert r.returncode == 2, r.stderr
    assert "--tensorboard" in r.stderr
