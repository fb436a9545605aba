"""results/study_arms.py: merging shard summaries of the arms study, its counts, tests and figure,
on synthetic shard CSVs with known answers; results/stats_util.py's Holm correction by hand."""

import csv
import os

import pytest
from conftest import load_results_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLS = ["run_id", "group", "at", "seed", "status", "divergence_step", "first_nonfinite_step", "final_loss", "min_loss",
        "steps_run"]


@pytest.fixture(scope="module")
def mod():
    return load_results_script("study_arms")


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLS)
        for r in rows:
            w.writerow(r)


def run_rows(rid, seed, away_div, even_div, status="complete"):
    """fp32 never diverges (min 0.002); floor_away / floor_even diverge at the given step (-1: no)."""
    def row(g, d):
        final = 0.05 if d >= 0 else 0.0021
        st = status if g == "floor_even" else ("diverged" if d >= 0 else "complete")
        return [rid, g, "", seed, st, d, -1, final, 0.002, 10000]
    return [row("fp32", -1), row("floor_away", away_div), row("floor_even", even_div)]


def test_merges_shards_and_counts(mod, tmp_path, capsys):
    write(tmp_path / "summary_study_arms_shard0of2.csv",
          run_rows("a", 10, 5000, -1) + run_rows("b", 11, 7000, -1) + run_rows("c", 12, -1, -1))
    write(tmp_path / "summary_study_arms_shard1of2.csv",
          run_rows("d", 13, 9000, 8000) + run_rows("e", 14, -1, -1, status="interrupted") +
          run_rows("a", 10, 5000, -1))  # a rerun of a finished run: identical, counted once
    runs, interrupted = mod.load(str(tmp_path))
    assert sorted(runs) == ["a", "b", "c", "d"] and interrupted == ["e"]
    s = mod.per_arm(runs)
    assert (s["fp32"]["n"], s["fp32"]["div"]) == (4, 0)
    assert (s["floor_away"]["div"], s["floor_away"]["deg"], s["floor_away"]["steps"]) == (3, 3, [5000, 7000, 9000])
    assert (s["floor_even"]["div"], s["floor_even"]["seeds_div"]) == (1, [13])
    t1, t2, t3, fam = mod.tables(s)
    assert "| floor_away | 4 | 3/4 (" in t1 and "| 7000 |" in t1
    # floor_even 1/4 vs floor_away 3/4: Fisher p = 0.486 (hand: tables with 4 events, P(a=1) =
    # P(a=3) = 16/70, as or less likely: a in {0, 1, 3, 4} -> (1 + 16 + 16 + 1)/70). Paired by
    # seed: floor_even diverged alone in no seed, floor_away alone in 2 (seeds 10, 11; both in 13):
    # McNemar p = 2 * (1/2)^2 = 0.5; Holm over the one comparison of that family leaves it.
    assert "| floor_even vs floor_away | 1/4 vs 3/4 | 0.486 (0.486) | 0 / 2 | 0.5 (0.5) |" in t2
    # Degraded (final 0.05 > 2 * 0.002) equals diverged here.
    assert "| floor_away vs fp32 | 3/4 vs 0/4 | 0.143 (0.286) | 3 / 0 | 0.25 (0.5) |" in t3
    # Exchangeability: per seed 3 trajectories, failures 1, 1, 0, 2 (seeds 10, 11, 12, 13):
    # P(FP32 never fails) = (2/3) * (2/3) * 1 * (1/3) = 4/27 = 0.148.
    assert "diverged: FP32 in 0 of the 4 failing trajectories (of 12)" in fam and "= 0.148 (one-sided)" in fam
    assert mod.main(["--dir", str(tmp_path), "--figure", str(tmp_path / "f.png")]) == 0
    out = capsys.readouterr().out
    assert "4 finished runs (seeds 10, 11, 12, 13); left out, not finished: e" in out
    assert (tmp_path / "f.png").stat().st_size > 5000


def test_conflicting_shards_are_an_error(mod, tmp_path):
    write(tmp_path / "summary_study_arms_shard0of2.csv", run_rows("a", 10, 5000, -1))
    write(tmp_path / "summary_study_arms_shard1of2.csv", run_rows("a", 10, 5100, -1))
    with pytest.raises(SystemExit, match="differs between shards"):
        mod.load(str(tmp_path))
    with pytest.raises(SystemExit, match="no summary_study_arms_shard"):
        mod.load(str(tmp_path / "nowhere"))


def test_holm_by_hand(mod):
    from stats_util import holm
    # p = 0.01, 0.04, 0.03 (m = 3): sorted 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> max-accumulated 0.06.
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]
    assert holm([0.4, 0.9]) == pytest.approx([0.8, 0.9])


def test_diverged_at_takes_the_earlier_step(mod):
    from stats_util import diverged_at
    row = lambda d, nf: {"divergence_step": str(d), "first_nonfinite_step": str(nf)}
    assert diverged_at(row(-1, -1)) == -1
    assert diverged_at(row(500, -1)) == 500
    assert diverged_at(row(-1, 30)) == 30
    assert diverged_at(row(500, 30)) == 30
    assert diverged_at(row(20, 30)) == 20


def test_mcnemar_and_poisson_binomial_by_hand(mod):
    from stats_util import mcnemar_exact, poisson_binomial_cdf
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(8, 0) == pytest.approx(2 / 256)            # 2 * (1/2)^8
    assert mcnemar_exact(7, 2) == pytest.approx(2 * 46 / 512)       # 2 * (1 + 9 + 36) / 2^9
    assert mcnemar_exact(2, 7) == mcnemar_exact(7, 2)
    assert mcnemar_exact(1, 1) == 1.0                               # 2 * 3/4, capped
    assert poisson_binomial_cdf([0.5, 0.5], 0) == pytest.approx(0.25)
    assert poisson_binomial_cdf([0.5, 0.5], 1) == pytest.approx(0.75)
    assert poisson_binomial_cdf([0.2, 0.5, 1.0], 1) == pytest.approx(0.8 * 0.5)   # the third always succeeds
    assert poisson_binomial_cdf([0.3], -1) == 0.0
    assert poisson_binomial_cdf([0.3, 0.9], 2) == pytest.approx(1.0)


def test_paired_counts_use_the_same_seed(mod):
    stats = {"x": {"seed": {1: (True, True), 2: (False, True), 3: (True, False)}},
             "y": {"seed": {1: (True, False), 2: (True, True), 4: (True, True)}}}
    assert mod.paired(stats, "x", "y", 0) == (0, 1)   # seed 1 both, seed 2 only y; seeds 3, 4 unpaired
    assert mod.paired(stats, "x", "y", 1) == (1, 0)   # degraded: seed 1 only x, seed 2 both


def test_readme_section_10_is_what_the_committed_csvs_give(mod, capsys):
    """results/README.md section 10's tables are study_arms.py's output over the committed CSVs."""
    assert mod.main(["--dir", os.path.join(ROOT, "results", "study_arms")]) == 0
    out = capsys.readouterr().out
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    section = readme[readme.index("## 10. "):]
    for block in out.split("\n\n")[1:]:
        block = block.replace("Diverged:\n", "").replace("Degraded:\n", "").strip()
        if block.startswith("|"):
            assert block in section, block.splitlines()[0]
    assert "0 of the 43 diverging trajectories** (P = 0.0022)" in section and "0.00221" in out
    assert "variance 2.63, P = 0.020" in section and "variance 2.63; arms shuffled" in out and "= 0.0198" in out
    # The sensitivity table and the W = 500 numbers the section quotes.
    assert mod.main(["--dir", os.path.join(ROOT, "results", "study_arms"), "--sensitivity", "0,100,250,500,1000"]) == 0
    table = capsys.readouterr().out.split("Sensitivity to the sustained-divergence window W")[1].split("\n", 1)[1].strip()
    assert table in section
    assert mod.main(["--dir", os.path.join(ROOT, "results", "study_arms"), "--sustained", "500"]) == 0
    out = capsys.readouterr().out
    assert "FP32 in 0 of the 29 failing trajectories (of 180)" in out and "P(FP32 <= 0) = 0.0208" in out
    assert "| rceil_away vs fp32 | 6/20 vs 0/20 | 0.0202 (0.162) | 6 / 0 | 0.0312 (0.25) |" in out
    assert "none of the 29 sustained divergences. The family test gives P = 0.021." in section


def test_split_prefix_reference_and_horizon(mod, tmp_path, capsys):
    """Part M's layout: another file prefix, a swept lr column to split on, a 20k horizon, and a
    reference arm named on the command line."""
    cols = COLS + ["optimizer.lr"]
    with open(tmp_path / "summary_fresh_shard0of1.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for i, (lr, d) in enumerate([("0.0005", -1), ("0.0005", 15000), ("0.0006", 19000), ("0.0006", 12000)]):
            for g, dd in (("fp32", -1), ("floor_away", -1), ("floor_even", d)):
                final = 0.05 if dd >= 0 else 0.0021
                w.writerow([f"r{i}", g, "", 100 + i, "diverged" if dd >= 0 else "complete", dd, -1, final, 0.002,
                            20000, lr])
    runs, _ = mod.load(str(tmp_path), "summary_fresh_shard")
    parts = mod.split_runs(runs, "optimizer.lr")
    assert list(parts) == ["0.0005", "0.0006"] and sorted(parts["0.0006"]) == ["r2", "r3"]
    assert mod.per_arm(parts["0.0005"])["floor_even"]["horizon"] == 20000
    with pytest.raises(SystemExit, match="no such column"):
        mod.split_runs(runs, "optimizer.beta1")
    fig = tmp_path / "m.png"
    assert mod.main(["--dir", str(tmp_path), "--prefix", "summary_fresh_shard", "--split", "optimizer.lr",
                     "--reference", "floor_even", "--figure", str(fig)]) == 0
    out = capsys.readouterr().out
    assert "## optimizer.lr = 0.0005" in out and "## optimizer.lr = 0.0006" in out
    # The reference arm is floor_even: at 6e-4 floor_away (0/2) is compared with it (2/2).
    assert "| floor_away vs floor_even | 0/2 vs 2/2 |" in out
    assert mod.REFERENCE == "floor_away"  # main() leaves the module's default as it was
    assert (tmp_path / "m_optimizer.lr=0.0005.png").stat().st_size > 5000
    assert (tmp_path / "m_optimizer.lr=0.0006.png").stat().st_size > 5000
    # --reference fp32: every arm compared with FP32 once, each arm listed once.
    assert mod.main(["--dir", str(tmp_path), "--prefix", "summary_fresh_shard", "--split", "optimizer.lr",
                     "--reference", "fp32", "--sensitivity", "0,100"]) == 0
    out = capsys.readouterr().out
    assert out.count("| floor_even vs fp32 | 2/2 vs 0/2 |") == 2  # at 6e-4: the diverged and degraded tables
    assert out.count("\n| fp32 | 2 |") == 4  # per lr: the per-arm and Kaplan-Meier tables, once each
    assert "W = 0: events; p vs fp32 |" in out and "vs fp32, vs fp32" not in out


def test_seed_effect_by_hand(mod):
    """Two arms, four seeds, each arm failing in one seed. Same seed: counts [2, 0, 0, 0], the
    largest variance; a shuffle reproduces it when the two arms land on one seed, probability
    1/4. Different seeds: [1, 1, 0, 0], the smallest variance any shuffle can give: p = 1."""
    def stats_of(fail_a, fail_b):
        seeds = {x: (False, False) for x in range(4)}
        return {"fp32": {"seed": dict(seeds)},
                "a": {"seed": {x: (x == fail_a, False) for x in range(4)}},
                "b": {"seed": {x: (x == fail_b, False) for x in range(4)}}}
    counts, var, p = mod.seed_effect(stats_of(0, 0), 0, permutations=20000)
    assert counts == [2, 0, 0, 0] and var == pytest.approx(0.75)
    assert p == pytest.approx(0.25, abs=0.015)
    counts, var, p = mod.seed_effect(stats_of(0, 1), 0, permutations=2000)
    assert counts == [1, 1, 0, 0] and p == 1.0
    assert mod.seed_effect(stats_of(0, 0), 0, permutations=500) == mod.seed_effect(stats_of(0, 0), 0, permutations=500)


def test_survival_by_hand(mod, tmp_path):
    """Three seeds. floor_even diverges at 100 and 200 and its third run is interrupted at 300
    (censored there, kept: the counts leave that run out, the survival table does not); FP32 and
    floor_away never diverge, horizon 400.
    KM of floor_even: S(100) = 2/3, S(200) = 2/3 * 1/2 = 1/3, median 200; log-log band at 200:
    Greenwood sum 1/(3*2) + 1/(2*1) = 2/3, se = sqrt(2/3) / |log 1/3| = 0.7432, band
    (1/3)^exp(+-1.96 * 0.7432) = 0.0090 .. 0.774.
    Log-rank floor_even vs fp32: at 100 n1 = 3, n2 = 3, d = 1: O - E = 1 - 3/6 = 0.5,
    V = 3*3*1*5 / (36*5) = 0.25; at 200 n1 = 2, n2 = 3, d = 1: O - E += 1 - 2/5 = 0.6,
    V += 2*3*1*4 / (25*4) = 0.24; chi2 = 1.1^2 / 0.49 = 2.4694, p = erfc(sqrt(chi2 / 2)) = 0.1161."""
    rows = []
    for i, (d, steps, status) in enumerate([(100, 400, "diverged"), (200, 400, "diverged"), (-1, 300, "interrupted")]):
        for g in ("fp32", "floor_away", "floor_even"):
            dd = d if g == "floor_even" else -1
            st = status if (g == "floor_even" or status == "interrupted") else "complete"
            rows.append([f"r{i}", g, "", i, st, dd, -1, 0.05 if dd >= 0 else 0.0021, 0.002,
                         steps if (status == "interrupted") else 400])
    write(tmp_path / "summary_study_arms_shard0of1.csv", rows)
    done, interrupted = mod.load(str(tmp_path))
    assert interrupted == ["r2"] and sorted(done) == ["r0", "r1"]
    subj = mod.subjects(mod.load_all(str(tmp_path)))
    assert subj["floor_even"] == ([100, 200, 300], [True, True, False])
    km, lr = mod.survival(mod.load_all(str(tmp_path)))
    assert "| floor_even | 3 | 2 | 1 | 0.333 (0.009–0.774) | 200 |" in km
    assert "| fp32 | 3 | 0 | 1 | 1 (no event) | > 400 |" in km
    assert "| floor_even vs fp32 | 2 vs 0 | 2.47 | 0.116 (0.116) |" in lr
    assert "| floor_away vs fp32 | 0 vs 0 | – | no event while both at risk |" in lr


def test_sustained_divergence_window(mod, tmp_path, capsys):
    """--sustained W: a divergence counts only when it lasted W steps before the run's end, and
    every trajectory is censored W steps before its end. Horizon 1000; floor_away diverges at 300
    (seed 0), 960 (seed 1: an end spike) and never (seed 2); floor_even at 990 only (seed 2); a
    fourth run is interrupted at 500 with floor_away diverged at 450.
    W = 0: floor_away 3 events of 4, floor_even 1. W = 100: floor_away keeps 300 only (960 > 900,
    450 > 500 - 100 = 400 -> censored at 400), floor_even none; censored at 900 (and 400).
    Log-rank floor_away vs fp32 at W = 100: one event at 300 with 4 at risk in each: O - E = 1/2,
    V = 4*4*1*7 / (64*7) = 1/4, chi2 = 1, p = erfc(sqrt(1/2)) = 0.3173; floor_even vs floor_away at
    W = 100 the same (that event is the only one). floor_even vs fp32 at W = 0: one event at 990 with
    3 at risk in each, chi2 = 1 again (Holm over the two vs-fp32 tests keeps 0.32). floor_even vs
    floor_away at W = 0, events at 300, 450, 960 (away; even at risk 4, 4, 3 of 8, 7, 5) and 990
    (even; 3 of 4): O - E = -1/2 - 4/7 - 3/5 + 1/4 = -1.4214, V = 1/4 + 12/49 + 6/25 + 3/16 = 0.9224,
    chi2 = 2.190, p = 0.139."""
    rows = []
    for i, (away, even, steps, st) in enumerate([(300, -1, 1000, "diverged"), (960, -1, 1000, "diverged"),
                                                 (-1, 990, 1000, "diverged"), (450, -1, 500, "interrupted")]):
        for g, d in (("fp32", -1), ("floor_away", away), ("floor_even", even)):
            status = st if st == "interrupted" else ("diverged" if d >= 0 else "complete")
            rows.append([f"r{i}", g, "", i, status, d, -1, 0.05 if d >= 0 else 0.0021, 0.002, steps])
    write(tmp_path / "summary_study_arms_shard0of1.csv", rows)
    every = mod.load_all(str(tmp_path))
    assert mod.diverged_to_end({"divergence_step": "960", "first_nonfinite_step": "-1", "steps_run": "1000"}, 0) == (True, 960)
    assert mod.diverged_to_end({"divergence_step": "960", "first_nonfinite_step": "-1", "steps_run": "1000"}, 100) == (False, 900)
    assert mod.diverged_to_end({"divergence_step": "-1", "first_nonfinite_step": "900", "steps_run": "1000"}, 100) == (True, 900)
    assert mod.diverged_to_end({"divergence_step": "-1", "first_nonfinite_step": "-1", "steps_run": "50"}, 100) == (False, 0)
    assert mod.subjects(every, 0)["floor_away"] == ([300, 960, 1000, 450], [True, True, False, True])
    assert mod.subjects(every, 100)["floor_away"] == ([300, 900, 900, 400], [True, False, False, False])
    assert mod.subjects(every, 100)["floor_even"] == ([900, 900, 900, 400], [False, False, False, False])
    done, _ = mod.load(str(tmp_path))
    assert (mod.per_arm(done, 0)["floor_away"]["div"], mod.per_arm(done, 100)["floor_away"]["div"]) == (2, 1)
    assert mod.per_arm(done, 100)["floor_even"]["seed"][2] == (False, True)  # still degraded: final 0.05
    tests = mod.logrank_tests(mod.subjects(every, 100))
    (arm, chi2, p, q), = [r for r in tests["fp32"] if r[0] == "floor_away"]
    assert chi2 == pytest.approx(1.0) and p == pytest.approx(0.3173, abs=1e-4)
    table = mod.sensitivity(every, [0, 100])
    assert "| floor_away | 3/4; " in table and "| floor_even | 1/4; " in table
    assert "| floor_away | 3/4; " in table.splitlines()[3] and " | 1/4; 0.32, – |" in table.splitlines()[3]
    assert "| floor_even | 1/4; 0.32, 0.14 | 0/4; –, 0.32 |" in table
    assert mod.main(["--dir", str(tmp_path), "--sustained", "100", "--sensitivity", "0,100"]) == 0
    out = capsys.readouterr().out
    assert "Sustained divergences only: lasting >= 100 steps" in out and "W = 100: events" in out
    with pytest.raises(SystemExit, match="comma-separated"):
        mod.main(["--dir", str(tmp_path), "--sensitivity", "0,x"])
    with pytest.raises(SystemExit, match=">= 0"):
        mod.main(["--dir", str(tmp_path), "--sustained", "-5"])


def _half_up(x, places="0.01"):
    from decimal import ROUND_HALF_UP, Decimal
    return str(Decimal(x).quantize(Decimal(places), rounding=ROUND_HALF_UP))


@pytest.mark.parametrize("study,reference", [("fresh_seeds_20k", "floor_away"), ("code_faithful_20k", "mx")])
def test_readme_section_11_is_what_the_committed_csvs_give(mod, capsys, study, reference):
    """results/README.md section 11's condensed tables (one row per lr and arm: diverged and
    degraded with Wilson intervals, S(20000) and its band to 2 places, the Holm-adjusted log-rank
    p against FP32 at W = 0 / 100 / 500 / 1000 and the events at W = 1000) are study_arms.py's
    output over the committed part-M summaries."""
    import re
    args = ["--dir", os.path.join(ROOT, "results", study), "--prefix", f"summary_{study}_shard",
            "--split", "optimizer.lr", "--sensitivity", "0,100,500,1000", "--reference", reference]
    assert mod.main(args) == 0
    out = capsys.readouterr().out
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    section = readme[readme.index("## 11. "):readme.index("## Not done")].replace("**", "")
    rows = 0
    for part in out.split("## optimizer.lr = ")[1:]:
        lr = {"0.0005": "5e-4", "0.0006": "6e-4"}[part.split("\n", 1)[0].strip()]
        arms = re.findall(r"^\| (\w+) \| 20 \| (\d+/20 \([0-9.–]+\)) \| (\d+/20 \([0-9.–]+\)) \|", part, re.M)
        km = dict(re.findall(r"^\| (\w+) \| 20 \| \d+ \| 0 \| ([0-9.]+ \([0-9.–]+\)) \|", part, re.M))
        sens = part.split("Sensitivity to the sustained-divergence window W")[1]
        assert arms and len(km) == len(arms)
        for arm, div, deg in arms:
            s, lo, hi = re.match(r"([0-9.]+) \(([0-9.]+)–([0-9.]+)\)", km[arm]).groups()
            cells = re.search(rf"^\| {arm} \| (.*) \|$", sens, re.M).group(1).split(" | ")
            ps = [c.split("; ")[1].split(",")[0].rstrip("*") for c in cells]
            events = cells[-1].split("/")[0]
            p_text = "–" if arm == "fp32" else " / ".join(ps)
            row = (f"| {lr} | {arm} | {div} | {deg} | {_half_up(s)} ({_half_up(lo)}–{_half_up(hi)}) | "
                   f"{p_text} ({events}) |")
            assert row in section, row
            rows += 1
    assert rows == (8 if study == "fresh_seeds_20k" else 4)


def test_readme_section_11_rerun_of_code_faithful_shards_0_3_equals_the_committed_summaries():
    """Section 11's check: the fourth session's re-run of code-faithful shards 0-3
    (results/bench/h200x4_2026-11-26d_rerun_summary_*) has every field of all 32 (run, trajectory)
    rows equal to the committed summaries except the run file's path; the committed ones carry a
    device column the re-run's lack."""
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    section = " ".join(readme[readme.index("## 11. "):readme.index("## Not done")].split())
    rows = 0
    for shard in range(4):
        name = f"summary_code_faithful_20k_shard{shard}of10.csv"
        with open(os.path.join(ROOT, "results", "code_faithful_20k", name), newline="") as f:
            committed = list(csv.DictReader(f))
        with open(os.path.join(ROOT, "results", "bench", "h200x4_2026-11-26d_rerun_" + name), newline="") as f:
            rerun = list(csv.DictReader(f))
        assert set(committed[0]) - set(rerun[0]) == {"device"} and set(rerun[0]) <= set(committed[0])
        by_key = {(r["run_id"], r["group"]): r for r in rerun}
        assert len(by_key) == len(rerun) == len(committed)
        for c in committed:
            r = by_key[(c["run_id"], c["group"])]
            assert {k for k in r if r[k] != c[k]} == {"file"}
            rows += 1
    assert rows == 32
    assert ("equal to the committed ones (809b8d0, first session) in every field of all 32 (run, trajectory) rows"
            in section)
    assert "except the run file's path. The committed summaries also carry a `device` column" in section
