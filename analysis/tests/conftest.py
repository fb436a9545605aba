"""pytest setup: make `mxlab` and the fixture writer importable from the repo root
(`python3 -m pytest -q analysis/tests`), and build the synthetic run files once per session."""

import glob
import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # analysis/ -> import mxlab
sys.path.insert(0, HERE)                   # make_fixtures

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import make_fixtures as F  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(scope="module")
def binary():
    """The built mxlab binary (MXLAB_BINARY; scripts/test.sh sets it), or the test is skipped."""
    b = os.environ.get("MXLAB_BINARY")
    if not b or not os.path.exists(b):
        pytest.skip("MXLAB_BINARY (built mxlab) not set: scripts/test.sh sets it")
    return b


def load_results_script(name):
    """results/<name>.py as a module: the results scripts are scripts, not a package (results/ goes
    on sys.path too, for their shared stats_util)."""
    sys.path.insert(0, os.path.join(ROOT, "results"))
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "results", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

STEPS = 400
DIVERGE_AT = 300
EARLY, LATE = 200, 290
BRANCHES = [
    {"name": "fp32_early", "at": EARLY, "apply": "to_fp32"},
    {"name": "skip_ln_quant_early", "at": EARLY, "apply": "skip_ln_quant", "diverge_at": 360},
    {"name": "fp32_late", "at": LATE, "apply": "to_fp32", "diverge_at": 340},
]
SWEEP = [(256, 2), (256, 4), (512, 2), (512, 4)]


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def stable_run(runs_dir):
    return F.write_run(str(runs_dir / "stable.h5"), steps=STEPS, seed=1)


@pytest.fixture(scope="session")
def diverging_run(runs_dir):
    return F.write_run(str(runs_dir / "diverging.h5"), steps=STEPS, seed=2, mx_diverge_at=DIVERGE_AT)


@pytest.fixture(scope="session")
def branches_run(runs_dir):
    return F.write_run(str(runs_dir / "branches.h5"), steps=STEPS, seed=3,
                       mx_diverge_at=DIVERGE_AT, branches=BRANCHES)


@pytest.fixture(scope="session")
def nan_run(runs_dir):
    return F.write_run(str(runs_dir / "nan.h5"), steps=STEPS, seed=5, mx_nan_at=250)


@pytest.fixture
def killed_ragged(tmp_path):
    return F.write_run(str(tmp_path / "killed.h5"), steps=STEPS, seed=4, killed="ragged")


@pytest.fixture
def killed_zeros(tmp_path):
    return F.write_run(str(tmp_path / "killed0.h5"), steps=STEPS, seed=4, killed="zeros")


def _sweep(directory, skip=None):
    os.makedirs(directory, exist_ok=True)
    for i, (width, depth) in enumerate(SWEEP):
        if (width, depth) == skip:
            continue
        F.write_run(os.path.join(directory, f"w{width}_L{depth}.h5"), steps=200, seed=10,
                    noise_seed=10 + i, width=width, depth=depth,
                    mx_diverge_at=120 if (width, depth) == (512, 4) else None,
                    fp32_spike_at=50 if depth == 4 else None)
    return str(directory)


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="session")
def sweep_missing_dir(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("sweep_missing"), skip=(256, 4))


@pytest.fixture(scope="session")
def lr_format_sweep(tmp_path_factory):
    """2 learning rates x 2 model sizes x 2 MX formats (the axes of the paper's figure 6)."""
    directory = tmp_path_factory.mktemp("lr_format")
    i = 0
    for lr in (2e-4, 6e-4):
        for width, depth in ((256, 2), (512, 4)):
            for fmt in ("mxfp8_e4m3", "mxfp6_e3m2"):
                F.write_run(str(directory / f"r{i}.h5"), steps=200, seed=7, noise_seed=i,
                            width=width, depth=depth, lr=lr, weight=fmt,
                            mx_diverge_at=120 if (lr, depth) == (6e-4, 4) else None)
                i += 1
    return str(directory)


# A multi-arm run: three arms beside FP32, branches forking from two of them, the
# clamp-debt rows and curvature every 50 steps.
ARMS = [{"name": "floor", "diverge_at": 300},
        {"name": "rne", "set": {"rounding": "nearest_even"}},
        {"name": "rceil", "set": {"scale_rule": "rceil"}, "diverge_at": 340}]
ARM_BRANCHES = [{"name": "to_fp32_floor", "at": 200, "apply": "to_fp32", "from": "floor"},
                {"name": "skip_ln_rne", "at": 250, "apply": "skip_ln_quant", "from": "rne",
                 "diverge_at": 380}]
CURVATURE_EVERY = 50


@pytest.fixture(scope="session")
def arms_run(runs_dir):
    return F.write_run(str(runs_dir / "arms.h5"), steps=STEPS, seed=6, arms=ARMS,
                       branches=ARM_BRANCHES, new_datasets=True, curvature_every=CURVATURE_EVERY)


@pytest.fixture(scope="session")
def arms_sweep(tmp_path_factory):
    """2 learning rates x 2 model sizes, each run with the three arms."""
    directory = tmp_path_factory.mktemp("arms_sweep")
    i = 0
    for lr in (2e-4, 6e-4):
        for width, depth in ((256, 2), (512, 4)):
            # at lr 6e-4 the arms that diverge in ARMS diverge at step 120, the rest never
            arms = [{k: v for k, v in a.items() if k != "diverge_at"} for a in ARMS]
            for arm, spec in zip(arms, ARMS):
                if lr > 5e-4 and "diverge_at" in spec:
                    arm["diverge_at"] = 120
            F.write_run(str(directory / f"r{i}.h5"), steps=200, seed=8, noise_seed=i, width=width,
                        depth=depth, lr=lr, arms=arms, new_datasets=True)
            i += 1
    return str(directory)


# A small run of the real trainer (MXLAB_BINARY, which scripts/test.sh sets): two arms, one of
# them made of `set:` items only (stored as `apply: none`), and a set-only branch from it.
TINY_EXPERIMENT = """\
name: tiny
seed: 3
steps: 40
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2}
data: {batch: 16}
optimizer: {lr: 1.0e-3}
precision: {weight: mxfp8_e4m3, activation: mxfp8_e4m3, grad: mxfp8_e4m3}
log: {log_every: 5, bias_every: 10, progress: false}
arms:
  - name: fp6
    set: {weight: mxfp6_e3m2, activation: mxfp6_e3m2, grad: mxfp6_e3m2}
  - name: fp8
interventions:
  - {name: act_bf16, at: 20, from: fp6, set: {activation: bf16}}
"""


def mxlab_binary():
    binary = os.environ.get("MXLAB_BINARY")
    if not binary or not os.path.exists(binary):
        pytest.skip("MXLAB_BINARY (built mxlab) not set: scripts/test.sh sets it")
    return binary


@pytest.fixture(scope="session")
def mxlab_run(tmp_path_factory):
    """The run file `mxlab run` writes for TINY_EXPERIMENT (skips without MXLAB_BINARY)."""
    binary = mxlab_binary()
    directory = tmp_path_factory.mktemp("mxlab_run")
    experiment = directory / "tiny.yaml"
    experiment.write_text(TINY_EXPERIMENT)
    subprocess.run([binary, "run", str(experiment), "--out", str(directory / "out")], check=True,
                   capture_output=True, timeout=600)
    (path,) = glob.glob(str(directory / "out" / "*.h5"))
    return path


def run_device_script(binary, root, experiments, shards, deadline="200", script="run_why_mx.sh", gpus=1, env_extra=None):
    """Run a device script of experiments/paper/ (run_why_mx.sh, or run_queue.sh, which calls it)
    as on the GPU machine, in a scratch tree `root` (a pathlib.Path): `experiments` maps EXP to its
    YAML text (written to experiments/paper/EXP.yaml), `shards` are the script's EXP=SHARD/N
    arguments; the CPU binary stands in behind a wrapper that drops --gpus, and a stand-in
    nvidia-smi names `gpus` GPUs. A second call on the same `root` runs in the same tree (its runs/
    kept), as a second call on a warm machine would. Returns (OUT directory, stdout)."""
    if not (root / "experiments").exists():
        (root / "experiments" / "paper").mkdir(parents=True)
        for name, text in experiments.items():
            (root / "experiments" / "paper" / f"{name}.yaml").write_text(text)
        os.symlink(os.path.join(ROOT, "results"), root / "results")
        (root / "build").mkdir()
        wrapper = root / "build" / "mxlab"
        wrapper.write_text('#!/usr/bin/env bash\n# the CPU binary: --gpus dropped\nargs=()\n'
                           'while [ $# -gt 0 ]; do if [ "$1" = --gpus ]; then shift 2; continue; fi; args+=("$1"); shift; done\n'
                           f'exec {binary} "${{args[@]}}"\n')
        wrapper.chmod(0o755)
        (root / "bin").mkdir()
        smi = root / "bin" / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {g}: stand-in (UUID: none)'\n" for g in range(gpus)))
        smi.chmod(0o755)
    out = root / "out"
    env = dict(os.environ, PATH=f"{root / 'bin'}:{os.environ['PATH']}")
    env.update(env_extra or {})  # may replace PATH (keep root/bin on it: the stand-in nvidia-smi)
    r = subprocess.run(["bash", os.path.join(ROOT, "experiments", "paper", script), str(out), deadline, *shards],
                       cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return str(out), r.stdout
