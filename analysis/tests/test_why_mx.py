"""results/why_mx.py: the causal study's analysis from committed CSVs. The excursion computed from
the committed loss blocks must equal the binary's `excursion_step` on every finished trajectory;
the confirmatory family runs only on all 40 pre-registered seeds."""
import csv
import math
import os

import pytest

from conftest import load_results_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
E1 = os.path.join(ROOT, "results", "why_mx", "e1")


@pytest.fixture(scope="module")
def W():
    return load_results_script("why_mx")


def test_committed_e1_blocks_agree_with_the_binary(W):
    events = W.load(E1)
    seeds = {s for s, _ in events}
    assert seeds <= set(W.SEEDS) and len(seeds) >= 6
    arms = {a for _, a in events}
    assert {"fp32", "mx_all", "only_wgrad", "keep_bf16_ln_affine"} <= arms and len(arms) == 16
    # every trajectory of every finished seed is there
    assert len(events) == 16 * len(seeds)
    rows = W.progress(events)
    assert rows[0][0] == "fp32" and rows[1][0] == "mx_all"
    assert all(n == len(seeds) for _, n, *_ in rows)


def _write(tmp, seeds, arms, event_of):
    """A blocks CSV and a summary CSV: 200 blocks of 100 steps each, an excursion at block 50 when
    event_of(seed, arm) is true (loss x 100 from there on)."""
    with open(tmp / "blocks_x.csv", "w", newline="") as fb, open(tmp / "summary_x.csv", "w", newline="") as fs:
        b = csv.writer(fb)
        b.writerow(["run_id", "seed", "lr", "trajectory", "block_start", "steps", "min", "max", "mean", "nonfinite", "last"])
        s = csv.writer(fs)
        s.writerow(["run_id", "group", "seed", "status", "excursion_step", "excursion_censored_at"])
        for seed in seeds:
            for arm in arms:
                ev = event_of(seed, arm)
                for i in range(200):
                    m = 1.0 if not ev or i < 50 else 100.0
                    b.writerow([f"r{seed}", seed, "0.0005", arm, 100 * i, 100, m, m, m, 0, m])
                s.writerow([f"r{seed}", arm, seed, "complete", 5000 if ev else -1, -1 if ev else 19500])


def test_a_disagreement_with_the_binary_is_an_error(W, tmp_path):
    _write(tmp_path, [200], ["fp32", "mx_all"], lambda s, a: a == "mx_all")
    assert W.load(str(tmp_path))[(200, "mx_all")] == (True, 5000)
    # the binary says otherwise: the script refuses rather than picking one
    text = (tmp_path / "summary_x.csv").read_text().replace("mx_all,200,complete,5000,-1", "mx_all,200,complete,-1,19500")
    (tmp_path / "summary_x.csv").write_text(text)
    with pytest.raises(W.StudyError, match="binary"):
        W.load(str(tmp_path))
    assert W.main(["--dir", str(tmp_path)]) == 2


def test_the_family_needs_all_seeds_and_holm_adjusts(W, tmp_path):
    arms = sorted({a for _, a, r, _ in W.E1_TESTS} | {r for _, _, r, _ in W.E1_TESTS})
    _write(tmp_path, W.SEEDS[:10], arms, lambda s, a: True)
    with pytest.raises(W.StudyError, match="200-239"):
        W.family(W.load(str(tmp_path)))
    # all seeds: MX-all always has its excursion, keep_bf16_grad never, the rest as MX-all
    (tmp_path / "blocks_x.csv").unlink()
    _write(tmp_path, W.SEEDS, arms, lambda s, a: a != "keep_bf16_grad" and not (a == "fp32" and s % 2))
    res = W.family(W.load(str(tmp_path)))
    assert [r[0] for r in res] == [t[0] for t in W.E1_TESTS] and len(res) == 16
    by = {label: (lr, cox, h) for label, lr, cox, h in res}
    lr, cox, h = by["N-role(grad)"]
    # keep_bf16_grad never has an excursion, MX-all always (at 5000): 40 informative seeds, all c
    assert (lr.arm_first, lr.ref_first) == (0, 40) and lr.p_perm == pytest.approx(2 * 0.5 ** 40) and h >= lr.p_perm
    assert cox.hr == 0 or cox.hr < 0.05
    # ties at the same step count for neither arm: identical arms are uninformative
    lr, _, h = by["N-role(weight)"]
    assert (lr.arm_first, lr.ref_first) == (0, 0) and lr.p_perm == 1 and h == 1
    assert all(0 <= r[3] <= 1 and r[3] >= r[1].p_perm - 1e-15 for r in res if not math.isnan(r[1].p_perm))


def test_readme_progress_table_is_the_scripts(W):
    events = W.load(E1)
    table = W.markdown_progress(W.progress(events), len(W.SEEDS))
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    assert table in readme, "results/README.md section 13's table is not what results/why_mx.py prints"
    n = len({s for s, _ in events})
    assert f"**Progress: {n} of 40 seeds**" in readme


def test_readme_paper_emulator_table_is_the_scripts(W):
    d = os.path.join(ROOT, "results", "why_mx", "paper_emulator")
    events = W.load(d)
    assert {a for _, a in events} == {"fp32", "paper_emulator", "mx_ops"}
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    assert W.markdown_progress(W.progress(events), len(W.SEEDS)) in readme
    # the pairing check: each seed's FP32 trajectory is E1's, block for block (bit-identical losses)
    import glob
    pe = W.R.read_blocks(glob.glob(os.path.join(d, "blocks_*.csv")))
    e1 = W.R.read_blocks(glob.glob(os.path.join(E1, "blocks_*.csv")))
    shared = [k for k in pe if k[2] == "fp32" and k in e1]
    assert shared
    for k in shared:
        assert pe[k]["mins"] == e1[k]["mins"] and pe[k]["steps_run"] == e1[k]["steps_run"]
