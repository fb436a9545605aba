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
    assert f"**Progress: {n} of 40 seeds**" in readme or (n == 40 and "**E1 is complete: 40 of 40 seeds**" in readme)


def _cox(W, hr, lo, hi):
    return W.P.Cox(hr, lo, hi, "finite", math.log(hr) if hr > 0 else -math.inf, 0.1, hr, lo, hi, "breslow")


def test_the_verdict_rules_are_the_preregistrations(W):
    v = W.verdict
    # N (keep r in bf16 vs MX-all, HR < 1): supported needs Holm p < 0.05 in the direction
    assert v("N-role(grad)", "<1", _cox(W, 0.2, 0.08, 0.48), 0.001) == "supported"
    assert v("N-role(grad)", "<1", _cox(W, 1.5, 0.8, 2.8), 0.001) == "falsified"   # significant the wrong way
    # falsified: upper >= 0.5 and lower > 0.19 (FP32's hazard, HR 0.19, out of reach)
    assert v("N-role(grad)", "<1", _cox(W, 0.42, 0.21, 0.86), 0.2) == "falsified"
    assert v("N-role(grad)", "<1", _cox(W, 0.42, 0.18, 0.86), 0.2) == "undecided"  # 0.19 not excluded
    assert v("N-role(grad)", "<1", _cox(W, 0.3, 0.2, 0.49), 0.2) == "undecided"    # upper < 0.5
    assert v("N-role(grad)", "<1", _cox(W, 0.4, 0.25, 0.64), 0.01).startswith("mixed")  # significant, too small
    # S (only r vs FP32, HR > 1): falsified when the upper bound < 2
    assert v("S-GEMM(dgrad)", ">1", _cox(W, 1.0, 0.25, 4.0), 1.0) == "undecided"
    assert v("S-GEMM(dgrad)", ">1", _cox(W, 1.0, 0.5, 1.9), 1.0) == "falsified"
    assert v("S-GEMM(dgrad)", ">1", _cox(W, 3.0, 1.2, 8.0), 0.01) == "supported"
    inf = W.P.Cox(math.inf, 15.0, math.inf, "+inf", math.inf, math.nan, 40.0, 6.0, math.inf, "breslow")
    assert v("S-role(activation)", ">1", inf, 1e-8) == "supported"
    none = W.P.Cox(*([math.nan] * 3), "none", *([math.nan] * 5), "breslow")
    assert v("S-role(grad)", ">1", none, 1.0) == "undecided"
    # the driver tests: falsified when the upper bound < 1; the hypothesis needs both
    assert v("Wgrad vs Fprop", ">1", _cox(W, 0.09, 0.03, 0.3), 3e-6) == "falsified"
    assert W.driver_verdict(["supported", "supported"]) == "supported"
    assert W.driver_verdict(["supported", "undecided"]) == "undecided"
    assert W.driver_verdict(["undecided", "falsified"]) == "falsified"


def test_e1_family_on_the_committed_40_seeds(W):
    """The confirmatory family as results/README.md section 13 reports it (pre-registered: run once,
    on all 40 seeds)."""
    events = W.load(E1)
    assert sorted({s for s, _ in events}) == W.SEEDS
    res = W.family(events)
    by = {label: (lr, cox, h) for label, lr, cox, h in res}
    verdicts = {label: W.verdict(label, d, by[label][1], by[label][2]) for label, _, _, d in W.E1_TESTS}
    assert [k for k, x in verdicts.items() if x == "supported"] == ["S-role(activation)", "N-GEMM(fprop)",
                                                                      "S-GEMM(fprop)"]
    lr, cox, h = by["N-GEMM(fprop)"]
    assert (lr.arm_first, lr.ref_first) == (6, 30) and h == pytest.approx(0.000905, rel=1e-2)
    assert (cox.hr, cox.lo, cox.hi) == pytest.approx((0.2, 0.0832, 0.481), rel=1e-2)
    lr, cox, h = by["Wgrad vs Fprop"]
    assert (lr.arm_first, lr.ref_first) == (3, 33) and cox.hi < 1
    assert W.driver_verdict([verdicts["Wgrad vs Fprop"], verdicts["Wgrad vs Dgrad"]]) == "falsified"
    # the README carries the script's tables verbatim
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    sec = W.secondary(events, W.tails(E1))
    assert W.markdown_family(res, sec) in readme, "section 13's family table is not what results/why_mx.py prints"
    assert W.markdown_every_arm(W.every_arm(events)) in readme


def test_tails_take_fp32_as_zero_and_the_figure_is_written(W, tmp_path):
    tail = W.tails(E1)
    assert all(v == 0.0 for (s, a), v in tail.items() if a == "fp32")
    assert len(tail) == 16 * 40
    png = tmp_path / "km.png"
    W.figure(W.load(E1), str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    xs, ys, n = W.km_curve([(True, 100), (False, 19500), (True, 300), (True, 300)])
    assert n == 4 and xs[:3] == [0, 100, 300] and ys[1] == pytest.approx(0.75) and ys[2] == pytest.approx(0.25)


def test_readme_paper_emulator_table_is_the_scripts(W, capsys):
    d = os.path.join(ROOT, "results", "why_mx", "paper_emulator")
    events = W.load(d)
    assert {a for _, a in events} == {"fp32", "paper_emulator", "mx_ops"}
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    # Question 0 (its run set complete): results/why_mx.py q0's tables, verbatim in section 13
    assert W.main(["q0"]) == 0
    out = capsys.readouterr().out
    assert "Question 0 (m = 4, Holm" in out, out
    tables = [b for b in out.split("\n\n") if b.lstrip().startswith("|") or "\n|" in b]
    assert len(tables) == 2, out
    for t in tables:
        t = t[t.index("|"):].strip()
        assert t in readme, "results/README.md section 13's Question 0 table is not what why_mx.py q0 prints:\n" + t
    assert "**What Question 0 says** (n = 40 seeds" in readme
    # the pairing check: each seed's FP32 trajectory is E1's, block for block (bit-identical losses)
    pe = W.R.read_blocks(W.R.csv_paths(d, "blocks_*"))
    e1 = W.R.read_blocks(W.R.csv_paths(E1, "blocks_*"))
    shared = [k for k in pe if k[2] == "fp32" and k in e1]
    assert shared
    for k in shared:
        assert pe[k]["mins"] == e1[k]["mins"] and pe[k]["steps_run"] == e1[k]["steps_run"]
