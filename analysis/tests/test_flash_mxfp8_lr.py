"""results/flash_mxfp8_lr.py: the exploratory MXFP8-over-lr check of the flash study's token model
(experiments/paper/flash_mxfp8_lr.yaml), on runs the binary makes here (CPU, a tiny width) and on
hand-made CSVs whose events are known."""
import csv
import os
import subprocess
import sys

from conftest import ROOT, load_results_script

EXP = os.path.join(ROOT, "experiments", "paper", "flash_mxfp8_lr.yaml")


def script(args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "results", "flash_mxfp8_lr.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_table_of_runs_the_binary_made(binary, tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "csv"
    out.mkdir()
    # shard 0 of 4: runs 0 and 4 of the sweep (lr 1e-3 and 1e-2, seed 1200)
    subprocess.run([binary, "run", EXP, "--device", "cpu", "--steps", "600", "--set", "model.width=32", "--set",
                    "data.batch=4", "--set", "data.seq_len=32", "--shard", "0/4", "--quiet", "--out", str(runs)],
                   check=True, capture_output=True, timeout=600)
    ex = load_results_script("extract_loss_blocks")
    files = sorted(str(p) for p in runs.glob("*.h5"))
    assert len(files) == 2
    assert ex.main([str(out / "blocks_flash_mxfp8_lr_0of4.csv"), "100", *files]) == 0
    s = subprocess.run([binary, "summarize", str(runs), "--csv", "--no-index"], check=True, capture_output=True,
                       text=True, timeout=120)
    (out / "summary_flash_mxfp8_lr_0of4.csv").write_text(s.stdout)
    r = script(["--dir", str(out)])
    assert r.returncode == 0, r.stderr
    assert "4 trajectories of 2 runs" in r.stdout and "C++ and Python agree" in r.stdout, r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("| 0.0")]
    assert [row.split(" | ")[:3] for row in rows] == [["| 0.001", "fp32", "1200"], ["| 0.001", "mxfp8_exact", "1200"],
                                                      ["| 0.01", "fp32", "1200"], ["| 0.01", "mxfp8_exact", "1200"]], r.stdout

    # the binary's excursion changed in the summary: the check refuses, in one line
    with open(out / "summary_flash_mxfp8_lr_0of4.csv", newline="") as f:
        rs = list(csv.DictReader(f))
    rs[1]["excursion_step"] = "300"
    with open(out / "summary_flash_mxfp8_lr_0of4.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rs[0]))
        w.writeheader()
        w.writerows(rs)
    r = script(["--dir", str(out)])
    assert r.returncode == 2 and "binary 300" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def blocks_rows(run_id, seed, lr, trajectory, mins):
    return [{"run_id": run_id, "seed": seed, "lr": lr, "trajectory": trajectory, "block_start": 100 * i,
             "steps": 100, "min": m, "max": m, "mean": m, "nonfinite": 0, "last": m} for i, m in enumerate(mins)]


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_known_events_at_both_thresholds(tmp_path):
    # mxfp8_exact's block minima treble from block 6 on for 5 blocks (k = 2 at step 600, not k = 10);
    # fp32's fall steadily: no event
    flat = [4.0, 3.0, 2.0, 1.5, 1.2, 1.0]
    mx = flat + [3.0] * 5 + [3.5]
    fp = flat + [0.9, 0.85, 0.8, 0.78, 0.76, 0.75]
    write(tmp_path / "blocks_x.csv", blocks_rows("r1", 1200, 0.03, "fp32", fp) + blocks_rows("r1", 1200, 0.03, "mxfp8_exact", mx))
    summary = [{"run_id": "r1", "group": g, "status": "complete", "excursion_step": "-1"} for g in ("fp32", "mxfp8_exact")]
    write(tmp_path / "summary_x.csv", summary)
    r = script(["--dir", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert "| 0.03 | fp32 | 1200 | 0/1 | 0/1 | – | 0.75 (0.75–0.75) |" in r.stdout, r.stdout
    # it leaves FP32 (block mean more than 0.1 above FP32's) at block 600
    assert "| 0.03 | mxfp8_exact | 1200 | 0/1 | 1/1 (600) | 600 | 3.5 (3.5–3.5) |" in r.stdout, r.stdout
    # a second seed whose MX trajectory stays within 0.1 of FP32's (0.08 above it): "never"
    fp2 = [m + 0.01 for m in fp]
    write(tmp_path / "blocks_y.csv", blocks_rows("r3", 1201, 0.03, "fp32", fp2) +
          blocks_rows("r3", 1201, 0.03, "mxfp8_exact", [m + 0.08 for m in fp2]))
    write(tmp_path / "summary_y.csv", [{"run_id": "r3", "group": g, "status": "complete", "excursion_step": "-1"}
                                       for g in ("fp32", "mxfp8_exact")])
    r = script(["--dir", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert "| 0.03 | mxfp8_exact | 1200, 1201 | 0/2 | 1/2 (600) | 600, never |" in r.stdout, r.stdout
    for f in ("blocks_y.csv", "summary_y.csv"):
        (tmp_path / f).unlink()
    # a finished trajectory without blocks, and a folder without CSVs: one line each, exit 2
    write(tmp_path / "summary_x.csv", summary + [{"run_id": "r2", "group": "fp32", "status": "complete",
                                                  "excursion_step": "-1"}])
    r = script(["--dir", str(tmp_path)])
    assert r.returncode == 2 and "run r2 fp32: finished, but no loss blocks" in r.stderr, r.stderr
    r = script(["--dir", str(tmp_path / "nothing")])
    assert r.returncode == 2 and "no blocks_*.csv" in r.stderr, r.stderr


def test_readme_tables_are_the_scripts_on_the_committed_csvs():
    # results/README.md §14 quotes both checks' tables verbatim (the lr check, the roles check), CPU and GPU
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    for d, n in (("flash_mxfp8_lr_cpu", 8), ("flash_mxfp8_roles_cpu", 33), ("flash_mxfp8_lr_gpu", 16),
                 ("flash_mxfp8_roles_gpu", 33)):
        r = script(["--dir", os.path.join(ROOT, "results", d)])
        assert r.returncode == 0, r.stderr
        assert f"{n} trajectories" in r.stdout, r.stdout
        tbl = r.stdout[r.stdout.index("| lr |"):].strip()
        assert tbl in readme, d
