"""results/flash_pilot_choice.py: the flash study's pre-registered choice of its configuration
from the pilot (results/prereg/flash_bf16.md), each step of the rule on made-up pilot CSVs, and
the column names on the CSVs of real (3-step) runs of experiments/paper/flash_pilot.yaml."""
import csv
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, load_results_script, mxlab_binary


@pytest.fixture(scope="module")
def C():
    return load_results_script("flash_pilot_choice")


BLOCKS = 100  # of 100 steps: 10,000 steps as the pilot


def _write(tmp, C, events, drop=None, binary_lies=None):
    """The pilot's CSVs: events {(depth, lr, seed, trajectory): 'primary' | 'secondary'} (the rest
    none): the loss x 100 (a k = 10 excursion) or x 3 (k = 2 only) from block 50 on."""
    with open(tmp / "blocks_flash_pilot_0of1.csv", "w", newline="") as fb, \
            open(tmp / "summary_flash_pilot_0of1.csv", "w", newline="") as fs:
        b, s = csv.writer(fb), csv.writer(fs)
        b.writerow(["run_id", "seed", "lr", "trajectory", "block_start", "steps", "min", "max", "mean", "nonfinite", "last"])
        s.writerow(["run_id", "group", "at", "seed", "model.depth", "optimizer.lr", "status", "excursion_step",
                    "excursion_censored_at"])
        for d in C.DEPTHS:
            for lr in C.LRS:
                for seed in C.SEEDS:
                    rid = f"d{d}lr{lr:g}s{seed}"
                    if rid == drop:
                        continue
                    for g in C.TRAJECTORIES:
                        kind = events.get((d, lr, seed, g))
                        factor = {"primary": 100.0, "secondary": 3.0, None: 1.0}[kind]
                        for i in range(BLOCKS):
                            m = 1.0 if i < 50 else factor
                            b.writerow([rid, seed, f"{lr:g}", g, 100 * i, 100, m, m, m, 0, m])
                        ev = kind == "primary"
                        if (rid, g) == binary_lies:
                            ev = not ev
                        s.writerow([rid, g, "", seed, d, f"{lr:g}", "complete", 5000 if ev else -1, -1 if ev else 9500])


def _choose(C, tmp):
    return C.choose(C.cells(C.load(str(tmp))))


def test_step_a_most_flash_excursions_where_fp32_has_none(C, tmp_path):
    ev = {}
    for s in C.SEEDS:
        ev[(4, 3e-3, s, "flash")] = "primary"
        ev[(2, 1e-2, s, "flash")] = "primary"        # as many, but FP32 explodes there too: not eligible
        ev[(2, 3e-3, s, "flash")] = "primary"        # as many, fewer secondary excursions net of FP32's
    ev[(2, 1e-2, 1100, "fp32")] = "primary"
    ev[(2, 3e-3, 1101, "fp32")] = "secondary"
    ev[(2, 1e-3, 1100, "flash")] = "primary"         # eligible, one excursion only
    _write(tmp_path, C, ev)
    assert _choose(C, tmp_path) == ((4, 3e-3), "A")


def test_step_a_ties_go_to_the_lower_lr_then_the_smaller_depth(C, tmp_path):
    ev = {(d, lr, 1100, "flash"): "primary" for d, lr in ((4, 1e-2), (2, 3e-2), (2, 1e-2))}
    _write(tmp_path, C, ev)
    assert _choose(C, tmp_path) == ((2, 1e-2), "A")


def test_step_b_secondary_excursions(C, tmp_path):
    ev = {}
    for s in C.SEEDS:
        ev[(4, 1e-2, s, "flash")] = "secondary"
        ev[(2, 3e-2, s, "flash")] = "secondary"
        ev[(2, 3e-2, s, "fp32")] = "secondary"       # FP32 degrades there too
    ev[(2, 1e-3, 1100, "flash")] = "secondary"
    ev[(4, 3e-2, 1100, "fp32")] = "primary"          # FP32's own excursion, no flash one: no step A
    _write(tmp_path, C, ev)
    assert _choose(C, tmp_path) == ((4, 1e-2), "B")


def test_step_c_null_fallback(C, tmp_path):
    _write(tmp_path, C, {(2, 3e-2, 1101, "fp32"): "secondary"})
    assert _choose(C, tmp_path) == ((4, 1e-2), "C")
    _write(tmp_path, C, {})
    assert _choose(C, tmp_path) == ((4, 3e-2), "C")
    _write(tmp_path, C, {(d, lr, 1100, "fp32"): "secondary" for d in C.DEPTHS for lr in C.LRS})
    assert _choose(C, tmp_path) == ((4, 1e-3), "C")


def test_incomplete_pilot_and_disagreement_refused(C, tmp_path, capsys):
    _write(tmp_path, C, {}, drop="d4lr0.01s1101")
    with pytest.raises(C.PilotError, match="incomplete: 2 trajectories missing"):
        C.load(str(tmp_path))
    assert C.main(["--dir", str(tmp_path)]) == 2
    assert "incomplete" in capsys.readouterr().err
    _write(tmp_path, C, {(4, 1e-2, 1100, "flash"): "primary"}, binary_lies=("d4lr0.01s1100", "flash"))
    with pytest.raises(C.PilotError, match="binary"):
        C.load(str(tmp_path))


def test_main_prints_the_choice(C, tmp_path, capsys):
    _write(tmp_path, C, {(4, 1e-3, 1101, "flash"): "primary"})
    assert C.main(["--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 4 | 0.001 | 1 | 0 | 1 | 0 |" in out
    assert "chosen: depth 4, lr 0.001 (rule step A" in out
    assert "flash_study.yaml: model.depth: 4, optimizer.lr: 1.0e-03" in out


def test_real_pilot_csvs(C, tmp_path):
    """The pilot's own file for 3 steps (tiny shapes): summarize's columns and the blocks script's
    are what the rule reads; nothing can explode in 3 steps, so the null fallback at the largest
    lr."""
    binary = mxlab_binary()
    out = tmp_path / "runs"
    subprocess.run([binary, "run", os.path.join(ROOT, "experiments", "paper", "flash_pilot.yaml"), "--device", "cpu",
                    "--steps", "3", "--set", "data.batch=1", "--set", "model.width=32", "--set", "model.heads=1",
                    "--set", "data.seq_len=32", "--out", str(out), "--quiet", "--jobs", "2"],
                   check=True, capture_output=True, timeout=600)
    summary = subprocess.run([binary, "summarize", str(out), "--csv"], check=True, capture_output=True, text=True)
    (tmp_path / "summary_flash_pilot_0of1.csv").write_text(summary.stdout)
    runs = sorted(str(p) for p in out.glob("*.h5"))
    assert len(runs) == 16
    subprocess.run([sys.executable, os.path.join(ROOT, "results", "extract_loss_blocks.py"),
                    str(tmp_path / "blocks_flash_pilot_0of1.csv"), "100", *runs], check=True, capture_output=True)
    assert _choose(C, tmp_path) == ((4, 3e-2), "C")


def _strip_config_columns(tmp):
    """The summary as a one-run shard writes it: no model.depth / optimizer.lr columns."""
    path = tmp / "summary_flash_pilot_0of1.csv"
    rows = list(csv.DictReader(open(path, newline="")))
    keep = [k for k in rows[0] if k not in ("model.depth", "optimizer.lr")]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keep, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def _plan(tmp, C, wrong=None):
    with open(tmp / "plan.txt", "w") as f:
        f.write("index  run_id        model.depth  optimizer.lr  seed\n")
        i = 0
        for d in C.DEPTHS:
            for lr in C.LRS:
                for seed in C.SEEDS:
                    rid = f"d{d}lr{lr:g}s{seed}"
                    f.write(f"{i}  {rid}  {d if rid != wrong else 8}  {lr:.1e}  {seed}\n")
                    i += 1


def test_one_run_shards_take_depth_and_lr_from_the_plan(C, tmp_path):
    _write(tmp_path, C, {(4, 3e-3, s, "flash"): "primary" for s in C.SEEDS})
    want = C.load(str(tmp_path))
    _strip_config_columns(tmp_path)
    with pytest.raises(C.PilotError, match="--plan"):
        C.load(str(tmp_path))
    _plan(tmp_path, C)
    assert C.load(str(tmp_path), C.read_plan(str(tmp_path / "plan.txt"))) == want
    assert C.main(["--dir", str(tmp_path)]) == 0  # DIR/plan.txt is found by itself
    # a plan that disagrees with a summary that has the columns is an error
    _write(tmp_path, C, {})
    _plan(tmp_path, C, wrong="d2lr0.001s1100")
    with pytest.raises(C.PilotError, match="plan"):
        C.load(str(tmp_path), C.read_plan(str(tmp_path / "plan.txt")))


def test_the_committed_pilot_and_the_study_agree(C, capsys):
    """The rule applied to the committed pilot's CSVs (results/flash_pilot/) gives the depth and lr
    that experiments/paper/flash_study.yaml holds, and its output is recorded verbatim in the
    pre-registration's "Configuration selected by the rule" (so the study cannot drift from the
    pilot, nor the record from either)."""
    pilot = os.path.join(ROOT, "results", "flash_pilot")
    assert C.main(["--dir", pilot]) == 0
    out = capsys.readouterr().out
    m = re.search(r"flash_study\.yaml: model\.depth: (\d+), optimizer\.lr: (\S+)", out)
    assert m, out
    with open(os.path.join(ROOT, "experiments", "paper", "flash_study.yaml")) as f:
        study = f.read()
    assert re.search(rf"^  depth: {m.group(1)}\b", study, re.M), "flash_study.yaml's model.depth is not the rule's"
    lr = re.search(r"^  lr: (\S+)", study, re.M)
    assert lr and float(lr.group(1)) == float(m.group(2)), "flash_study.yaml's optimizer.lr is not the rule's"
    with open(os.path.join(ROOT, "results", "prereg", "flash_bf16.md")) as f:
        prereg = f.read()
    record = prereg[prereg.index("### Configuration selected by the rule"):]
    for line in out.strip().splitlines():
        assert "    " + line in record, f"not recorded verbatim: {line}"


def test_results_readme_pilot_numbers():
    """results/README.md section 14's descriptive sentence on the pilot, from the committed summaries:
    the flash trajectory's final loss within 0.012 nats of FP32's (largest gaps +0.0119, +0.0087 at
    lr 3e-2), minimum within 0.008, every trajectory complete (none non-finite)."""
    runs = {}
    for p in glob.glob(os.path.join(ROOT, "results", "flash_pilot", "summary_flash_pilot_*.csv")):
        with open(p, newline="") as f:
            for r in csv.DictReader(f):
                runs.setdefault(r["run_id"], {})[r["group"]] = r
    assert len(runs) == 16 and all(set(g) == {"fp32", "flash"} for g in runs.values())
    gaps = sorted((float(g["flash"]["final_loss"]) - float(g["fp32"]["final_loss"]) for g in runs.values()),
                  key=abs, reverse=True)
    assert max(abs(x) for x in gaps) < 0.012
    assert [round(x, 4) for x in gaps[:2]] == [0.0119, 0.0087]
    assert max(abs(float(g["flash"]["min_loss"]) - float(g["fp32"]["min_loss"])) for g in runs.values()) < 0.008
    assert all(r["status"] == "complete" and r["first_nonfinite_step"] == "-1" for g in runs.values() for r in g.values())
