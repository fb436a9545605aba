"""bench/ncu_arms.py: where an extra recipe arm's time goes, from two Nsight Compute logs (--arms K
and --arms 1 of the same bench), on logs written here in ncu's --csv layout."""
import csv
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import ncu_arms  # noqa: E402

HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]


def write_log(path, launches):
    """An ncu --csv --log-file log: ncu's own lines, then the table (one row per launch)."""
    with open(path, "w", newline="") as f:
        f.write("==PROF== Connected to process 1\n")
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(HEADER)
        for i, (name, value, unit) in enumerate(launches):
            w.writerow([i, 1, "mxlab", "h", name, 1, 7, "(256, 1, 1)", "(132, 1, 1)", 0, "9.0", "Command line profiler metrics",
                        "gpu__time_duration.sum", unit, f"{value:,}"])


def step(arms):
    """One trainer step's launches: the FP32 trajectory and data once, each arm's GEMM and quantizer."""
    out = [("void mxlab::cuda::(anonymous namespace)::data_kernel(float*)", 300_000, "nsecond"),
           ("sgemm_pedantic", 2.0, "usecond")]
    for _ in range(arms):
        out += [("cutlass_gemm_bf16(int)", 280_000, "nsecond"), ("void mxlab::cuda::<unnamed>::quantize_kernel<3>(int)", 0.5, "msecond")]
    return out


def test_the_extra_arms_kernels_per_step(tmp_path):
    steps, K = 3, 4
    write_log(tmp_path / "k.csv", [x for _ in range(steps) for x in step(K)])
    write_log(tmp_path / "one.csv", [x for _ in range(steps) for x in step(1)])
    (tmp_path / "bench.txt").write_text("  per extra arm: (5.000 - 2.000) / (4 - 1) = 1.000 ms = 1.1 x the MX step\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ncu_arms.py"), str(tmp_path / "k.csv"),
                        str(tmp_path / "one.csv"), "--arms", str(K), "--steps", str(steps), "--bench",
                        str(tmp_path / "bench.txt")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # an extra arm adds one GEMM (280 us) and one quantizer (500 us) a step: 0.780 ms in 2 launches;
    # the FP32 and data kernels, the same in both logs, add nothing
    assert "0.780 ms in 2.0 launches" in r.stdout, r.stdout
    assert "| quantize_kernel<3> | 500.0 | 64.1% | 1.00 |" in r.stdout, r.stdout
    assert "| cutlass_gemm_bf16 | 280.0 | 35.9% | 1.00 |" in r.stdout, r.stdout
    assert "| data_kernel | 0.0 |" in r.stdout, r.stdout
    assert "1.000 ms per extra arm, 1.28 x the serialized kernel time" in r.stdout, r.stdout


def test_swapped_logs_and_bad_input_are_refused_in_one_line(tmp_path):
    write_log(tmp_path / "k.csv", step(4))
    write_log(tmp_path / "one.csv", step(1))
    with pytest.raises(ncu_arms.ProfileError, match="swapped"):
        ncu_arms.extra_arm_rows(ncu_arms.read_launches(str(tmp_path / "one.csv")),
                                ncu_arms.read_launches(str(tmp_path / "k.csv")), 4, 1)
    with pytest.raises(ncu_arms.ProfileError, match="need K >= 2"):
        ncu_arms.extra_arm_rows([], [], 1, 1)
    (tmp_path / "bench.txt").write_text("no such line\n")
    (tmp_path / "empty.csv").write_text("==PROF== nothing profiled\n")
    for args, says in (([str(tmp_path / "k.csv"), str(tmp_path / "empty.csv")], "no kernel launches"),
                       ([str(tmp_path / "k.csv"), str(tmp_path / "one.csv"), "--bench", str(tmp_path / "bench.txt")],
                        "no 'per extra arm' line"),
                       ([str(tmp_path / "k.csv"), str(tmp_path / "none.csv")], "No such file")):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ncu_arms.py"), *args, "--arms", "4", "--steps", "1"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_the_per_extra_arm_line_of_mxlab_bench(binary, tmp_path):
    # the line ncu_arms reads, as the binary prints it (CPU, a tiny model)
    exp = tmp_path / "b.yaml"
    exp.write_text("model: {depth: 1, width: 32, hidden_mult: 1}\ndata: {batch: 16}\n")
    r = subprocess.run([binary, "bench", str(exp), "--device", "cpu", "--only", "data", "--arms", "2", "--steps", "1",
                        "--warmup", "0", "--bench-file", str(tmp_path / "cache.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ms = ncu_arms.measured_per_extra_arm(r.stdout)
    # the value the binary printed, to its 3 decimals (its JSON line has it unrounded); its sign is
    # timing: one timed step of a tiny model can make the two-arm step the faster (seen once in CI)
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert ms is not None and ms == pytest.approx(j["per_extra_arm_ms"], abs=5e-4), r.stdout
    # a negative measurement is read as such, not as a missing line
    line = "  per extra arm: (0.355 - 0.445) / (2 - 1) = -0.090 ms (the MX trajectory step was not timed: --only)\n"
    assert ncu_arms.measured_per_extra_arm(line) == -0.090


def test_gpu_profile_passes_the_warm_up_cuda_graphs_need():
    # `mxlab bench --device cuda` refuses --warmup below 3 with CUDA graphs on (the first pass of a step
    # runs eagerly, the second records); bench/gpu_profile.sh's commands run on the GPU only, so this
    # reads them: every bench command with graphs on asks for at least 3 (or leaves the default)
    import re
    text = open(os.path.join(ROOT, "bench", "gpu_profile.sh"), encoding="utf-8").read().replace("\\\n", " ")
    commands = [line for line in text.splitlines() if re.search(r'"\$BIN" bench ', line)]
    assert len(commands) >= 4, commands
    for c in commands:
        m = re.search(r"--warmup (\S+)", c)
        if m and "--no-graphs" not in c:
            assert m.group(1).isdigit() and int(m.group(1)) >= 3, c
    # and the arms figure's step count for ncu_arms.py is the bench's 1 + 3 + N
    assert "--steps $(( N + 4 ))" in text and "--warmup 3 >" in text
