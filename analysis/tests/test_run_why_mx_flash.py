"""experiments/paper/run_why_mx.sh on an attention network (the flash study's shards): besides the
summary and the loss blocks, it brings back the per-layer flash instruments and the spectral norms
of the attention projections, read from the shard's finished runs only, so that the mechanism of
results/prereg/flash_bf16.md can be computed from what comes back (the run files stay on the GPU
machine). A tiny flash study made by the CPU binary through the script (a stand-in nvidia-smi, the
binary behind a wrapper that drops --gpus). And the flash study's file with two runs in one
process (`mxlab run --jobs 2`, as a shard given two GPUs): both run files read back whole."""
import csv
import gzip
import os
import subprocess

import pytest

from conftest import ROOT, run_device_script

# flash_study.yaml in miniature: the FP32 trajectory and two flash arms, snapshots every 20 steps
TINY = """name: flash_tiny
seed: 1
steps: 60
device: cpu
model: {depth: 2, width: 32, heads: 2, block: attention, causal: true}
data: {kind: tokens, vocab: 16, seq_len: 32, batch: 2}
loss: xent
optimizer: {name: adamw, lr: 3.0e-3, beta2: 0.95}
schedule: {name: constant, warmup: 10}
precision: {weight: fp32, activation: fp32, grad: fp32, ln_affine: none, elementwise: fp32}
log: {log_every: 10, bias_every: 20, snapshot_every: 20}
arms:
  - {name: flash, apply: flash_bf16}
  - {name: stabilized, apply: stabilized_softmax}
sweep:
  seeds: [5, 6]
"""


def read_gz(path):
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def flash_out(binary, tmp_path_factory):
    root = tmp_path_factory.mktemp("flash_device")
    out, log = run_device_script(binary, root, {"flash_tiny": TINY}, ["flash_tiny=0/1"])
    return out, log


def test_a_flash_shard_brings_back_its_instruments_and_spectral_norms(flash_out):
    out, log = flash_out
    tag = "flash_tiny_0of1"
    assert sorted(os.listdir(out)) == sorted([f"summary_{tag}.csv", f"blocks_{tag}.csv", f"instruments_{tag}.csv.gz",
                                              f"spectral_{tag}.csv.gz", "logs.tgz"]), log
    inst = read_gz(os.path.join(out, f"instruments_{tag}.csv.gz"))
    # 2 seeds x 3 trajectories x 2 layers x logged steps; flash instruments on the flash arms only
    assert {r["seed"] for r in inst} == {"5", "6"}
    assert {r["trajectory"] for r in inst} == {"fp32", "flash", "stabilized"}
    assert {r["layer"] for r in inst} == {"0", "1"}
    for r in inst:
        assert r["attn_logit_max"] != "" and r["attn_wq_spec"] != ""
        assert (r["attn_multi_max_frac"] == "") == (r["trajectory"] == "fp32")
    steps = sorted({int(r["step"]) for r in inst})
    assert len(steps) >= 6 and steps[-1] >= 50
    spec = read_gz(os.path.join(out, f"spectral_{tag}.csv.gz"))
    assert {r["matrix"] for r in spec} == {"W_Q", "W_K", "W_V", "W_O"}
    assert {int(r["step"]) for r in spec} >= {20, 40}
    # the error against FP32 exists for the flash arms, not for the FP32 trajectory itself
    for r in spec:
        assert (r["diff_fro"] == "") == (r["trajectory"] == "fp32")
        assert float(r["sigma_max"]) > 0



def test_two_runs_in_one_process_both_read_back_whole(binary, tmp_path):
    """`mxlab run --jobs 2` (as `run_why_mx.sh` gives a shard two GPUs): the first run to finish
    reads its file back in a forked child, which must not write the other run's open file (it did:
    the other file then failed to decode, "inflate() failed", while `mxlab run` said complete)."""
    study = os.path.join(ROOT, "experiments", "paper", "flash_study.yaml")
    out = tmp_path / "runs"
    r = subprocess.run([binary, "run", study, "--device", "cpu", "--steps", "600", "--shard", "0/20", "--jobs", "2",
                        "--set", "data.batch=1", "--set", "model.width=32", "--set", "model.heads=1",
                        "--set", "data.seq_len=32", "--set", "model.depth=1", "--set", "log.log_every=100",
                        "--set", "log.bias_every=300", "--set", "log.snapshot_every=100", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    s = subprocess.run([binary, "summarize", str(out), "--csv"], capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(s.stdout.splitlines()))
    assert len({row["run_id"] for row in rows}) == 2
    assert all(row["status"] == "complete" for row in rows), [(row["run_id"], row["status"], row.get("error"))
                                                               for row in rows if row["status"] != "complete"]
    assert not list(out.glob("*.snapshot")), "a finished run's snapshot is left: its file did not read back whole"
