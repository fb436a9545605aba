"""results/jump_explanations.py: the jump table on synthetic series with known answers, and
results/README.md section 7d's tables are the script's output over the committed CSVs."""

import csv
import json
import os

import pytest
from conftest import load_results_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def mod():
    return load_results_script("jump_explanations")


def synthetic(d, mod):
    """One run, seed 7, switch at 100: every branch's loss is 1.0 at 100 with grad_norm 2 (MX: 0.5,
    grad 1); to_fp32 peaks at 30 at step 150 and is back to 1 by 200; new_v peaks at step 210 (outside
    the 100-step window: not counted)."""
    with open(os.path.join(d, "runs.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run_id", "seed", "lr", "trajectory", "kind", "at", "from", "divergence_step",
                    "first_nonfinite_step", "steps_run"])
        w.writerow(["r1", 7, 5e-4, "fp32", "trajectory", 0, "", -1, -1, 300])
        w.writerow(["r1", 7, 5e-4, "mx", "trajectory", 0, "", 250, -1, 300])
        for b in mod.BRANCHES:
            w.writerow(["r1", 7, 5e-4, b, "branch", 100, "mx", 290 if b == "to_fp32" else -1, -1, 200])
    with open(os.path.join(d, "series_r1.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trajectory", "step", "loss", "grad_norm"])
        for step in range(0, 301, 10):
            w.writerow(["mx", step, 0.5, 1.0])
        for b in mod.BRANCHES:
            for step in range(100, 301, 10):
                loss = 1.0
                if b == "to_fp32" and step == 150:
                    loss = 30.0
                if b == "new_v" and step == 210:
                    loss = 1000.0
                w.writerow([b, step, loss, 2.0])
    with open(os.path.join(d, "eval_x_r1_step100_train.txt"), "w") as f:
        rows = [{"label": "as trained", "loss": 0.5}] + [
            {"label": l, "loss": 0.6} for l in ["{apply: to_fp32}", "{apply: snap_gamma+to_fp32}",
                                                "{apply: to_fp32_keep_gamma_q}", "{apply: skip_ln_quant}",
                                                "{apply: snap_gamma+skip_ln_quant}"]]
        f.write("header\n" + json.dumps({"run": "runs/L/x/r1.h5", "trajectory": "mx", "step": 100, "rows": rows}) + "\n")


def test_jump_rows_by_hand(mod, tmp_path):
    synthetic(str(tmp_path), mod)
    rows = mod.jump_rows(mod.load(str(tmp_path)))
    assert len(rows) == 1
    r = rows[0]
    assert (r["seed"], r["at"], r["mx_div"]) == (7, 100, 250)
    g, p = r["cells"]["to_fp32"]
    assert g == pytest.approx(2.0) and p == pytest.approx(60.0)  # 30 / 0.5
    g, p = r["cells"]["new_v"]
    assert p == pytest.approx(2.0)  # the peak at 210 is outside (100, 200]
    assert r["div"]["to_fp32"] == 290 and r["div"]["snap_to_fp32"] == -1


def test_tables_and_counts(mod, tmp_path, capsys):
    synthetic(str(tmp_path), mod)
    mod.main(["--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| 7 | 100 | 250 | **60 (2.00)** | 2 (2.00) |" in out
    assert "Seeds whose to_fp32 or skip_ln_quant switch jumps: 1 of 1 (7)." in out
    assert "- to_fp32 neither: jumps in 1 of 1 seeds; in 1 of the 1 that jump" in out
    assert "- new_v none: v only: jumps in 0 of 1 seeds" in out
    assert "| 7 | 100 | 0.5 | 1.200 | 1.200 | 1.200 | 1.200 | 1.200 |" in out
    assert "| 7 | 250 | 290 | - |" in out


def test_missing_window_is_an_error(mod, tmp_path):
    synthetic(str(tmp_path), mod)
    path = os.path.join(str(tmp_path), "series_r1.csv")
    keep = [l for l in open(path) if not (l.startswith("skip_ln_quant,") and not l.startswith("skip_ln_quant,100,"))]
    open(path, "w").writelines(keep)
    with pytest.raises(ValueError, match="skip_ln_quant"):
        mod.jump_rows(mod.load(str(tmp_path)))


def test_readme_section_7d_is_what_the_committed_csvs_give(mod, capsys):
    mod.main([])
    out = capsys.readouterr().out
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    sec = readme[readme.index("### 7d."):readme.index("## 8.")]
    assert out.strip() in sec
