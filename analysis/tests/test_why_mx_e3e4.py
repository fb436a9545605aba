"""results/why_mx.py e3, e4 and q0 (results/prereg/why_mx.md: "E3 - bias, variance or Adam?", "E4 -
fixes from the literature", Question 0 of "E1" and its amendment) on synthetic CSVs in the
committed format: E3's three runs per seed kept apart by their Adam setting, the families' Holm
size and verdict rules, no family before all 40 seeds, and the pairing check against E1 (bit for
bit); E1's committed CSVs (without the eps and beta2 columns) still load as before."""
import csv
import glob
import math
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, load_results_script

E1 = os.path.join(ROOT, "results", "why_mx", "e1")
BLOCKS = 200
P40 = 2 * 0.5 ** 40   # the exact permutation p when all 40 seeds go one way
P10 = 2 * 0.5 ** 10   # ... when 10 informative seeds do


@pytest.fixture(scope="module")
def W():
    return load_results_script("why_mx")


def write_runs(d, tag, runs, settings=True, seed_column=True, lr="0.0005"):
    """A blocks CSV and a summary CSV in `d` (created): runs [(run_id, seed, eps, beta2,
    {trajectory: excursion block or None})], 200 blocks of 100 steps, the loss 1.0 and from the
    excursion block on 100.0. `settings`: the eps and beta2 columns (and the summary's
    optimizer.eps / optimizer.beta2, as a sweep's `mxlab summarize --csv` has them); without,
    the format of E1's committed CSVs. `seed_column` False: the summary without `seed`, as
    `mxlab summarize --csv` writes a directory of one seed (only keys that vary are columns)."""
    os.makedirs(d, exist_ok=True)
    extra = ["eps", "beta2"] if settings else []
    with open(os.path.join(d, f"blocks_{tag}.csv"), "w", newline="") as fb, \
            open(os.path.join(d, f"summary_{tag}.csv"), "w", newline="") as fs:
        b, s = csv.writer(fb), csv.writer(fs)
        b.writerow(["run_id", "seed", "lr", "trajectory", "block_start", "steps", "min", "max", "mean", "nonfinite",
                    "last"] + extra)
        s.writerow(["run_id", "group", "seed", "status", "excursion_step", "excursion_censored_at"] +
                   (["optimizer.eps", "optimizer.beta2"] if settings else []))
        for rid, seed, eps, beta2, trajs in runs:
            opt = [eps, beta2] if settings else []
            for t, at in trajs.items():
                for i in range(BLOCKS):
                    m = 1.0 if at is None or i < at else 100.0
                    b.writerow([rid, seed, lr, t, 100 * i, 100, m, m, m, 0, m] + opt)
                s.writerow([rid, t, seed, "complete", -1 if at is None else 100 * at, 19500 if at is None else -1] + opt)
    if not seed_column:
        with open(os.path.join(d, f"summary_{tag}.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        with open(os.path.join(d, f"summary_{tag}.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, [c for c in rows[0] if c != "seed"], extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)


def fp32_of(s):
    return 150 if s % 4 == 0 else None  # 10 of 40 seeds, late


def mx_all_of(s):
    return 50


def write_e1(d, seeds=range(200, 240)):
    """E1's fp32 and mx_all in E1's committed format (no eps, beta2 columns)."""
    write_runs(d, "e1", [(f"e1-{s}", s, "", "", {"fp32": fp32_of(s), "mx_all": mx_all_of(s)}) for s in seeds],
               settings=False)


# E3: (setting, eps, beta2 as the run file's config writes them) and each trajectory's excursion block
E3_RUNS = (("default", "1.0e-08", "0.999"), ("eps", "1.0e-06", "0.999"), ("beta2", "1.0e-08", "0.95"))


def e3_events(setting, traj, s):
    if traj == "fp32":
        return None if setting == "beta2" else fp32_of(s)  # eps: FP32 as the default's (same blocks)
    if traj == "mx_all":
        return {"default": 50, "eps": 50 if s < 230 else None, "beta2": 100}[setting]
    if traj == "noise_mx":
        return 150 if s % 2 == 0 else None        # 20 events, fp32's 10 among them
    if traj == "mx_sr_grad":
        return 40 if s < 225 else 60              # before mx_all on 25 seeds, after on 15


def write_e3(d, seeds=range(200, 240), skip=()):
    runs = []
    for s in seeds:
        for setting, eps, beta2 in E3_RUNS:
            if (s, setting) in skip:
                continue
            trajs = ("fp32", "mx_all", "noise_mx", "mx_sr_grad") if setting == "default" else ("fp32", "mx_all")
            runs.append((f"{setting}-{s}", s, eps, beta2, {t: e3_events(setting, t, s) for t in trajs}))
    write_runs(d, "e3", runs)


def test_e1s_committed_csvs_without_the_setting_columns_load_as_before(W):
    """E1's CSVs predate the eps and beta2 columns: read by setting, each trajectory is there once
    with an empty setting and the same blocks, and load() gives the excursions results/README.md
    section 13 reports (test_why_mx.py pins its tables)."""
    paths = W.R.csv_paths(E1, "blocks_*")
    with W.R.open_csv(paths[0]) as f:
        assert "eps" not in next(csv.reader(f))
    plain = W.R.read_blocks(paths)
    by_setting = W.R.read_blocks(paths, optimizer=True)
    assert {(s, lr, "", "", t) for s, lr, t in plain} == set(by_setting)
    assert all(plain[(s, lr, t)] == by_setting[(s, lr, e, b, t)] for s, lr, e, b, t in by_setting)
    events = W.load(E1)
    assert len(events) == 640 and sum(e for (_, a), (e, _) in events.items() if a == "mx_all") == 35


def test_e3s_settings_are_kept_apart(W, tmp_path):
    """The three runs of a seed train fp32 and mx_all under the same names: E3 keys them by their
    setting (identical blocks in two settings included), E1's loader refuses the directory instead
    of merging them, and blocks without the setting columns are refused."""
    d = str(tmp_path / "e3")
    write_e3(d)
    ev = W.load_e3(d)
    assert len(ev) == 40 * 8
    assert ev[(230, "mx_all")] == (True, 5000) and ev[(230, "mx_all@eps=1e-6")] == (False, 19500)
    assert ev[(230, "mx_all@beta2=0.95")] == (True, 10000)
    # FP32 at eps 1e-6 has the default's very blocks here: still two trajectories
    assert ev[(200, "fp32")] == ev[(200, "fp32@eps=1e-6")] == (True, 15000) and ev[(200, "fp32@beta2=0.95")][0] is False
    with pytest.raises(W.R.DataError, match="different Adam settings"):
        W.load(d)
    assert W.main(["--dir", d]) == 2
    old = str(tmp_path / "old")
    write_runs(old, "x", [("a", 200, "", "", {"fp32": None, "mx_all": 50}), ("b", 200, "", "", {"fp32": None})],
               settings=False)
    with pytest.raises(W.StudyError, match="none of E3's"):
        W.load_e3(old)


def test_e3s_summaries_are_matched_to_their_run(W, tmp_path):
    d = tmp_path / "e3"
    write_e3(str(d), seeds=[200, 201])
    assert len(W.load_e3(str(d))) == 16
    summary = d / "summary_e3.csv"
    text = summary.read_text()
    # a summary row whose setting is not its run's blocks'
    summary.write_text(text.replace("eps-201,mx_all,201,complete,5000,-1,1.0e-06", "eps-201,mx_all,201,complete,5000,-1,1.0e-08"))
    with pytest.raises(W.StudyError, match="optimizer.eps"):
        W.load_e3(str(d))
    # a finished run without loss blocks
    summary.write_text(text + "zz-1,fp32,201,complete,-1,19500,1.0e-08,0.999\n")
    with pytest.raises(W.StudyError, match="no loss blocks"):
        W.load_e3(str(d))
    # an arm the eps runs do not train
    write_runs(str(tmp_path / "bad"), "x", [("r", 200, "1.0e-06", "0.999", {"fp32": None, "noise_mx": None})])
    with pytest.raises(W.StudyError, match="noise_mx"):
        W.load_e3(str(tmp_path / "bad"))


def test_e3_family_is_the_preregistrations(W, tmp_path, capsys):
    """m = 6 with the FP32 interaction check; Holm over the six; the verdicts of each test."""
    assert [(t[1], t[2], t[3], t[4]) for t in W.E3_TESTS] == [
        ("noise_mx", "fp32", ">1", 2.0), ("noise_mx", "mx_all", "<1", 0.5), ("mx_sr_grad", "mx_all", "<1", 0.5),
        ("mx_all@eps=1e-6", "mx_all", "<1", 0.5), ("mx_all@beta2=0.95", "mx_all", "<1", 0.5),
        ("fp32@eps=1e-6", "fp32", "two-sided", None)]
    d, e1 = str(tmp_path / "e3"), str(tmp_path / "e1")
    write_e3(d)
    write_e1(e1)
    ev = W.load_e3(d)
    res = W.run_family(ev, W.E3_TESTS)
    by = {label: (lr, cox, h) for label, lr, cox, h in res}
    assert len(res) == 6
    # noise_mx first on the 10 seeds where FP32 has none: p = 2 / 2^10, the third smallest of six
    lr, cox, h = by["Variance suffices"]
    assert (lr.arm_first, lr.ref_first, lr.p_perm) == (10, 0, P10) and h == pytest.approx(4 * P10)
    # mx_all before noise_mx on all 40: the smallest p (tied with beta2's), x 6
    lr, cox, h = by["Bias matters"]
    assert (lr.arm_first, lr.ref_first) == (0, 40) and h == pytest.approx(6 * P40, rel=1e-9)
    assert by["Adam beta2 0.95 (MX)"][2] == pytest.approx(6 * P40, rel=1e-9)
    lr, cox, h = by["SR of gradients"]
    assert (lr.arm_first, lr.ref_first) == (25, 15) and h == pytest.approx(2 * lr.p_perm) and cox.lo > 0.5
    lr, cox, h = by["Adam eps 1e-6 (MX)"]   # across runs of a seed: mx_all@eps=1e-6 censored on 10 seeds
    assert (lr.arm_first, lr.ref_first) == (0, 10) and h == pytest.approx(4 * P10)
    lr, cox, h = by["Adam eps 1e-6 (FP32, interaction check)"]
    assert (lr.arm_first, lr.ref_first, h) == (0, 0, 1.0)
    assert W.e3_readings(res) == ["supported", "supported", "falsified", "supported", "supported", "not significant"]
    assert W.main(["e3", "--dir", d, "--e1", e1]) == 0
    out = capsys.readouterr().out
    assert "E3's pre-registered family (m = 6" in out and "| Holm p (m = 6) |" in out
    assert "on all 80 (seed, trajectory)" in out and "| eps 1e-6, beta2 0.999 | mx_all | 40 | 30/40" in out


def test_no_e3_family_before_all_40_seeds(W, tmp_path, capsys):
    d, e1 = str(tmp_path / "e3"), str(tmp_path / "e1")
    write_e3(d, skip={(239, "beta2")})
    write_e1(e1)
    ev = W.load_e3(d)
    assert not W.complete(ev, W.E3_TESTS)
    with pytest.raises(W.StudyError, match="200-239.*mx_all@beta2=0.95 has 39"):
        W.run_family(ev, W.E3_TESTS)
    assert W.main(["e3", "--dir", d, "--e1", e1]) == 0
    out = capsys.readouterr().out
    assert "confirmatory tests: not run" in out and "Holm" not in out
    assert "| eps 1e-8, beta2 0.95 | mx_all | 39 |" in out


def _tables(out):
    """The markdown tables of a why_mx.py report, each as one block of lines."""
    chunks = ["\n".join(line for line in c.splitlines() if line.startswith("|")) for c in out.split("\n\n")]
    return [c for c in chunks if c]


def _section13():
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    return readme[readme.index("## 13. "):readme.index("## 14. ")]


def test_readme_e3_is_the_scripts_on_the_committed_runs(W, capsys):
    """results/README.md section 13 quotes every table of `why_mx.py e3` on the committed E3 runs
    verbatim (the progress, and with all 120 runs in, the family, every trajectory, the recipes'
    classification; the loss levels) and says how many seeds it counts; the pairing with E1 holds
    on every committed (seed, trajectory)."""
    d = os.path.join(ROOT, "results", "why_mx", "e3")
    assert W.main(["e3", "--dir", d]) == 0
    out = capsys.readouterr().out
    events = W.load_e3(d)
    n = len({s for s, _ in events})
    assert f"e3: {n} of 40 seeds" in out and "E1's loss blocks bit for bit on all" in out
    sec = _section13()
    tables = _tables(out)
    assert len(tables) == (5 if W.complete(events, W.E3_TESTS) else 2)
    for t in tables:
        assert t in sec, t.splitlines()[0]
    assert f"**E3: {n} of 40 seeds" in sec


def test_readme_confirmation_of_beta2_is_the_scripts_on_the_committed_runs(W, capsys):
    """Section 13 quotes `why_mx.py confirm --dir results/why_mx/confirm_adam` verbatim: its
    progress, tests, reading, the comparisons beside them and the loss levels."""
    d = os.path.join(ROOT, "results", "why_mx", "confirm_adam")
    assert W.main(["confirm", "--dir", d]) == 0
    out = capsys.readouterr().out
    n = len({s for s, _ in W.load_confirm(d)[0]})
    assert f"confirm: {n} of 20 seeds" in out and "recipes mx_all@beta2=0.95;" in out
    sec = _section13()
    for t in _tables(out):
        assert t in sec, t.splitlines()[0]
    assert f"**The confirmation of β₂ = 0.95: {n} of 20 seeds" in sec


def test_readme_e4_progress_is_the_scripts_on_the_committed_runs(W, capsys):
    """Section 13 quotes `why_mx.py e4` on the committed E4 runs verbatim and says how many seeds
    it counts; E4's FP32 and MX-all equal E1's loss blocks on every committed (seed, trajectory)."""
    d = os.path.join(ROOT, "results", "why_mx", "e4")
    assert W.main(["e4", "--dir", d]) == 0
    out = capsys.readouterr().out
    events = W.load(d)
    n = len({s for s, _ in events})
    assert f"e4: {n} of 40 seeds" in out and f"bit for bit on all {2 * n} (seed, trajectory)" in out
    sec = _section13()
    for t in _tables(out):
        assert t in sec, t.splitlines()[0]
    done = W.complete(events, W.E4_TESTS)
    assert (f"**E4: {n} of 40 seeds" if done else f"**E4 so far: {n} of 40 seeds") in sec


def _cox(W, hr, lo, hi):
    return W.P.Cox(hr, lo, hi, "finite", math.log(hr), 0.1, hr, lo, hi, "breslow")


def test_the_e3_e4_verdict_rules(W):
    v = W.directional_verdict
    # HR > 1 (Variance suffices): falsified when the upper bound < 2
    assert v(">1", 2.0, _cox(W, 3.0, 1.2, 8.0), 0.01) == "supported"
    assert v(">1", 2.0, _cox(W, 1.0, 0.5, 1.9), 1.0) == "falsified"
    assert v(">1", 2.0, _cox(W, 1.0, 0.25, 4.0), 1.0) == "undecided"
    assert v(">1", 2.0, _cox(W, 3.0, 1.2, 8.0), 0.06) == "undecided"          # Holm p not < 0.05
    assert v(">1", 2.0, _cox(W, 1.5, 1.1, 1.9), 0.01).startswith("mixed")     # significant, but < 2
    # HR < 1 (Bias, SR, the Adam settings on MX, each recipe vs mx_all): falsified when the lower bound > 0.5
    assert v("<1", 0.5, _cox(W, 0.2, 0.08, 0.48), 0.001) == "supported"
    assert v("<1", 0.5, _cox(W, 0.8, 0.55, 1.2), 0.3) == "falsified"
    assert v("<1", 0.5, _cox(W, 0.6, 0.3, 1.2), 0.3) == "undecided"
    assert v("<1", 0.5, _cox(W, 0.6, 0.5, 1.2), 0.3) == "undecided"           # 0.5 itself not excluded
    assert v("<1", 0.5, _cox(W, 2.0, 1.1, 3.6), 0.01) == "falsified"          # significant the wrong way
    assert v("<1", 0.5, _cox(W, 0.7, 0.52, 0.94), 0.01).startswith("mixed")
    zero = W.P.Cox(0.0, 0.0, 0.2, "0", -math.inf, math.nan, 0.05, 0.0, 0.3, "breslow")
    assert v("<1", 0.5, zero, 1e-9) == "supported"
    none = W.P.Cox(*([math.nan] * 3), "none", *([math.nan] * 5), "breslow")
    assert v("<1", 0.5, none, 1.0) == v(">1", 2.0, none, 1.0) == "undecided"
    # two-sided (FP32 at eps 1e-6, each recipe vs fp32): no verdict, only whether it differs
    assert v("two-sided", None, _cox(W, 0.3, 0.1, 0.9), 0.01) == "significant (HR < 1)"
    assert v("two-sided", None, _cox(W, 3.0, 1.1, 9.0), 0.049) == "significant (HR > 1)"
    assert v("two-sided", None, _cox(W, 3.0, 1.1, 9.0), 0.05) == "not significant"


def test_e4s_fix_classification(W):
    f = W.fix_class
    mx = lambda hr: _cox(W, hr, hr / 3, hr * 3)  # noqa: E731
    assert f(mx(0.5), _cox(W, 1.0, 0.7, 1.4)) == "fix"
    assert f(mx(0.5), _cox(W, 0.9, 0.6, 1.5)) == "no fix"                      # upper bound not < 1.5
    assert f(mx(0.2), _cox(W, 1.0, 0.42, 2.4)).startswith("candidate fix")
    assert f(mx(0.25), _cox(W, 1.0, 0.42, 2.4)).startswith("candidate fix")   # HR <= 0.25
    assert f(mx(0.3), _cox(W, 1.0, 0.42, 2.4)) == "no fix"
    assert f(mx(0.1), _cox(W, 2.5, 1.1, 5.6)) == "no fix"                      # vs FP32 above 1
    zero = W.P.Cox(0.0, 0.0, 1.2, "0", -math.inf, math.nan, 0.1, 0.0, 1.3, "breslow")
    assert f(mx(0.1), zero) == "fix"                                           # [0, 1.2] contains 1
    # the amendment of 2026-11-28: an interval below 1 (fewer excursions than FP32) is not above it
    below = W.P.Cox(0.0, 0.0, 0.47, "0", -math.inf, math.nan, 0.1, 0.0, 0.5, "breslow")
    assert f(mx(0.01), below) == "fix"
    assert f(mx(0.1), _cox(W, 0.3, 0.1, 0.9)) == "fix"
    assert f(mx(0.1), _cox(W, 0.4, 0.1, 1.6)).startswith("candidate fix")     # below 1 or not, wide
    assert f(mx(0.1), _cox(W, 3.0, 1.01, 9.0)) == "no fix"                     # lower bound just above 1
    none = W.P.Cox(*([math.nan] * 3), "none", *([math.nan] * 5), "breslow")
    assert f(mx(0.1), none) == "no fix"


def e4_events(traj, s):
    return {"fp32": fp32_of(s), "mx_all": mx_all_of(s), "rot_all": 150 if s % 4 == 1 else None,
            "rand_rot_sr": 50, "rot_e1": fp32_of(s)}[traj]


def write_e4(d, arms=("fp32", "mx_all", "rot_all", "rand_rot_sr", "rot_e1"), seeds=range(200, 240)):
    write_runs(d, "e4", [(f"e4-{s}", s, "1.0e-08", "0.999", {a: e4_events(a, s) for a in arms}) for s in seeds])


def test_e4_family_holm_verdicts_and_fixes(W, tmp_path, capsys):
    assert [(t[1], t[2], t[3], t[4]) for t in W.E4_TESTS] == [
        (r, ref, d, b) for r in ("rot_all", "rand_rot_sr", "rot_e1")
        for ref, d, b in (("mx_all", "<1", 0.5), ("fp32", "two-sided", None))]
    d, e1 = str(tmp_path / "e4"), str(tmp_path / "e1")
    write_e4(d)
    write_e1(e1)
    ev = W.load(d)
    res = W.run_family(ev, W.E4_TESTS)
    by = {label: (lr, cox, h) for label, lr, cox, h in res}
    # three tests at p = 2 / 2^40, the rest at 1: Holm over m = 6 gives each of the three 6 p
    for label in ("rot_all vs mx_all", "rand_rot_sr vs fp32", "rot_e1 vs mx_all"):
        assert by[label][0].p_perm == P40 and by[label][2] == pytest.approx(6 * P40, rel=1e-9)
    lr, cox, h = by["rot_all vs fp32"]
    assert (lr.arm_first, lr.ref_first, h) == (10, 10, 1.0) and cox.lo < 1 < cox.hi and cox.hi > 1.5
    # rand_rot_sr is mx_all here: every seed's excursions tie, which Breslow's Cox reads as HR 1
    # (0.65-1.55), so its lower bound > 0.5 falsifies "HR < 1" although no seed is informative
    # for the permutation test
    lr, cox, h = by["rand_rot_sr vs mx_all"]
    assert (lr.arm_first, lr.ref_first, h) == (0, 0, 1.0) and cox.hr == pytest.approx(1) and cox.lo > 0.5
    assert W.e4_readings(res) == ["supported", "not significant", "falsified", "significant (HR > 1)", "supported",
                                  "not significant"]
    fixes = {r: c for r, _, _, c in W.e4_fixes(res)}
    # rot_all: HR 0 against mx_all, FP32-like (interval contains 1) but too wide for a fix; rot_e1
    # (FP32's very excursions here) the same; rand_rot_sr (mx_all's) none
    assert fixes["rot_all"].startswith("candidate fix") and fixes["rot_e1"].startswith("candidate fix")
    assert fixes["rand_rot_sr"] == "no fix"
    assert W.main(["e4", "--dir", d, "--e1", e1]) == 0
    out = capsys.readouterr().out
    assert "| Holm p (m = 6) |" in out and "| rot_all | 0 (0, " in out and "**candidate fix" in out
    assert "nothing of E4 is confirmed" not in out and "not run until" not in out
    # between the recipes (descriptive): rand_rot_sr's excursion (block 50) comes first in every seed
    assert [(a, ref) for a, ref in W.E4_BETWEEN] == [("rot_all", "rand_rot_sr"), ("rot_e1", "rand_rot_sr"),
                                                     ("rot_all", "rot_e1")]
    assert "| rot_all vs rand_rot_sr | 10 / 40 | 0/40 | " in out and "| rot_all vs rot_e1 | 10 / " in out
    # loss levels over the last 2,000 steps: 100 after an excursion, 1 without
    assert "| eps 1e-8, beta2 0.999 (default) | rand_rot_sr | 40 | 100 (100–100) |" in out
    assert "| eps 1e-8, beta2 0.999 (default) | rot_all | 40 | 1 (1–25.8) |" in out  # quartiles interpolated: 10 of 40 at 100


def test_e4_without_a_fix_says_nothing_is_confirmed(W, tmp_path, capsys):
    """Every recipe as unstable as mx_all: no fix, no candidate, and the report says the
    confirmation is not run (the amendment of 2026-11-27)."""
    d, e1 = str(tmp_path / "e4"), str(tmp_path / "e1")
    write_runs(d, "e4", [(f"e4-{s}", s, "1.0e-08", "0.999",
                          {"fp32": fp32_of(s), "mx_all": mx_all_of(s), "rot_all": mx_all_of(s),
                           "rand_rot_sr": mx_all_of(s), "rot_e1": mx_all_of(s)}) for s in range(200, 240)])
    write_e1(e1)
    assert {c for _, _, _, c in W.e4_fixes(W.run_family(W.load(d), W.E4_TESTS))} == {"no fix"}
    assert W.main(["e4", "--dir", d, "--e1", e1]) == 0
    assert "No recipe is a fix or a candidate fix: nothing of E4 is confirmed" in capsys.readouterr().out


def test_no_e4_family_without_rot_e1_or_all_seeds(W, tmp_path, capsys):
    e1 = str(tmp_path / "e1")
    write_e1(e1)
    d = str(tmp_path / "no_rot_e1")
    write_e4(d, arms=("fp32", "mx_all", "rot_all", "rand_rot_sr"))
    with pytest.raises(W.StudyError, match="rot_e1 has 0"):
        W.run_family(W.load(d), W.E4_TESTS)
    assert W.main(["e4", "--dir", d, "--e1", e1]) == 0 and "not run" in capsys.readouterr().out
    d = str(tmp_path / "few")
    write_e4(d, seeds=range(200, 239))
    assert not W.complete(W.load(d), W.E4_TESTS)
    for figure in ([], ["--figure", str(tmp_path / "few.png")]):
        assert W.main(["e4", "--dir", d, "--e1", e1] + figure) == 0
        out = capsys.readouterr().out
        assert "not run until all 40 seeds" in out and "Holm" not in out


def test_a_shard_of_one_seed_has_no_seed_column(W, tmp_path):
    """`mxlab summarize --csv` of a shard of one seed has no `seed` column: the run's seed is taken
    from its loss blocks (E4 and Question 0 through load(), E3 through load_e3())."""
    for seed in (200, 201):
        write_runs(str(tmp_path / "e4"), f"s{seed}", [(f"e4-{seed}", seed, "1.0e-08", "0.999",
                                                       {"fp32": None, "mx_all": 50})], seed_column=False)
    assert W.load(str(tmp_path / "e4")) == {(200, "fp32"): (False, 19500), (200, "mx_all"): (True, 5000),
                                            (201, "fp32"): (False, 19500), (201, "mx_all"): (True, 5000)}
    write_runs(str(tmp_path / "e3"), "x", [("a", 205, "1.0e-06", "0.999", {"fp32": 60, "mx_all": 50})],
               seed_column=False)
    assert W.load_e3(str(tmp_path / "e3")) == {(205, "fp32@eps=1e-6"): (True, 6000), (205, "mx_all@eps=1e-6"): (True, 5000)}
    # and a finished run whose blocks are missing is named, not a KeyError
    with open(tmp_path / "e4" / "summary_s200.csv", "a") as f:
        f.write("zz,fp32,complete,-1,19500,1.0e-08,0.999\n")
    with pytest.raises(W.StudyError, match="run zz finished but has no loss blocks"):
        W.load(str(tmp_path / "e4"))


def write_pe(d, seeds=range(200, 240)):
    write_runs(d, "pe", [(f"pe-{s}", s, "1.0e-08", "0.999", {"fp32": fp32_of(s), "paper_emulator": 100 if s < 230 else None,
                                                             "mx_ops": 50}) for s in seeds])


def test_q0_family(W, tmp_path, capsys):
    """Question 0: mx_all from E1, the rest from the paper_emulator run set; m = 4, Holm; the
    two-sided tests read in the question's direction (more excursions than the reference)."""
    assert [(t[1], t[2], t[3]) for t in W.Q0_TESTS] == [
        ("mx_all", "paper_emulator", ">1"), ("mx_all", "mx_ops", ">1"), ("paper_emulator", "fp32", ">1"),
        ("mx_ops", "fp32", ">1")]
    d, e1 = str(tmp_path / "pe"), str(tmp_path / "e1")
    write_pe(d)
    write_runs(e1, "e1", [(f"e1-{s}", s, "", "", {"fp32": fp32_of(s), "mx_all": 80}) for s in range(200, 240)],
               settings=False)
    ev = W.load_q0(d, e1)
    assert ev[(200, "mx_all")] == (True, 8000) and ev[(200, "paper_emulator")] == (True, 10000)
    res = W.run_family(ev, W.Q0_TESTS)
    by = {label: (lr, cox, h) for label, lr, cox, h in res}
    lr, _, h = by["MX-all vs paper_emulator"]
    assert (lr.arm_first, lr.ref_first) == (40, 0) and h == pytest.approx(4 * P40, rel=1e-9)
    lr, _, h = by["MX-all vs mx_ops"]
    assert (lr.arm_first, lr.ref_first) == (0, 40) and h == pytest.approx(4 * P40, rel=1e-9)
    assert by["paper_emulator vs FP32"][0].arm_first == 30 and by["paper_emulator vs FP32"][0].ref_first == 2
    readings = W.q0_readings(res)
    assert readings[0] == "significant, in the question's direction (HR > 1)"
    assert readings[1] == "significant, against the question's direction (HR < 1)"
    assert W.q0_reading(">1", _cox(W, 2.0, 0.9, 4.4), 0.2) == "not significant"
    assert W.main(["q0", "--dir", d, "--e1", e1]) == 0
    out = capsys.readouterr().out
    assert "| Holm p (m = 4) |" in out and "on all 40 seeds" in out
    # on 8 seeds: the progress table only
    few = str(tmp_path / "few")
    write_pe(few, seeds=range(200, 208))
    assert W.main(["q0", "--dir", few, "--e1", e1]) == 0
    out = capsys.readouterr().out
    assert "not run" in out and "| mx_all | 8 | 8/8" in out and "Holm" not in out
    # mx_all belongs to E1: a run set that has its own is refused
    write_runs(str(tmp_path / "own"), "x", [("r", 200, "1.0e-08", "0.999", {"fp32": None, "mx_all": 50})])
    with pytest.raises(W.StudyError, match="takes mx_all from E1"):
        W.load_q0(str(tmp_path / "own"), e1)


def _break_e1(e1, seed, traj):
    """Change one block of E1's `traj` of `seed` by one ulp (the text of one cell)."""
    path = os.path.join(e1, "blocks_e1.csv")
    with open(path) as f:
        lines = f.read().split("\n")
    i = next(i for i, line in enumerate(lines) if line.startswith(f"e1-{seed},{seed},0.0005,{traj},300,"))
    lines[i] = lines[i].replace(",1.0,1.0,1.0,0,1.0", ",1.0000000000000002,1.0,1.0,0,1.0")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def test_the_pairing_check_against_e1(W, tmp_path, capsys):
    """The default setting's fp32 and mx_all (E3), fp32 and mx_all (E4) and fp32 (Question 0) must
    be E1's blocks bit for bit: one ulp in one block of one seed fails the analysis; E3's other
    settings are not E1's trajectories and are not compared."""
    e3, e4, pe, e1 = (str(tmp_path / x) for x in ("e3", "e4", "pe", "e1"))
    write_e3(e3)
    write_e4(e4)
    write_pe(pe)
    write_e1(e1)
    assert W.pairing_check_blocks(e3, e1, keep_row=W._default_setting) == 80  # beta2's fp32 differs from E1's: not compared
    assert W.pairing_check_blocks(e4, e1) == 80 and W.pairing_check_blocks(pe, e1, trajectories=("fp32",)) == 40
    capsys.readouterr()
    for traj, exp, d in (("fp32", "e3", e3), ("mx_all", "e3", e3), ("mx_all", "e4", e4), ("fp32", "q0", pe)):
        broken = str(tmp_path / f"e1_{exp}_{traj}")
        shutil.copytree(e1, broken)
        _break_e1(broken, 213, traj)
        assert W.main([exp, "--dir", d, "--e1", broken]) == 2
        err = capsys.readouterr().err
        assert f"seed 213 {traj}: its loss blocks differ from E1's" in err, err
    # a seed E1 lacks, and no E1 at all
    few = str(tmp_path / "e1_few")
    write_e1(few, seeds=range(200, 239))
    with pytest.raises(W.StudyError, match="seed 239 fp32: not in E1"):
        W.pairing_check_blocks(e4, few)
    with pytest.raises(W.StudyError, match="pairing check needs"):
        W.pairing_check_blocks(e4, str(tmp_path / "nowhere"))


def test_q0_on_the_committed_run_set(W, capsys):
    """The paper_emulator run set so far (8 of 40 seeds): progress only; its FP32 is E1's bit for bit."""
    d = os.path.join(ROOT, "results", "why_mx", "paper_emulator")
    assert W.main(["q0", "--dir", d, "--e1", E1]) == 0
    out = capsys.readouterr().out
    n = len({s for s, _ in W.load(d)})
    assert f"bit for bit on all {n} seeds" in out
    if n < 40:
        assert "not run until all 40 seeds" in out


def test_e3_from_the_binary(W, binary, tmp_path):
    """Seed 200's three runs of experiments/paper/why_mx_e3.yaml made by the binary (20 steps of a
    width-32 model on the CPU): extract_loss_blocks.py and `mxlab summarize --csv` as
    run_why_mx.sh brings them back, read by `why_mx.py e3`, its pairing check against an "E1" made
    of the default-setting run alone."""
    runs = tmp_path / "runs"
    subprocess.run([binary, "run", os.path.join(ROOT, "experiments", "paper", "why_mx_e3.yaml"), "--device", "cpu",
                    "--steps", "20", "--set", "model.width=32", "--set", "data.batch=32", "--shard", "0/40", "--quiet",
                    "--out", str(runs)], check=True, capture_output=True, timeout=600)
    ex = load_results_script("extract_loss_blocks")

    def bring_back(run_dir, out):
        os.makedirs(out)
        files = sorted(glob.glob(os.path.join(run_dir, "*.h5")))
        r = subprocess.run([binary, "summarize", run_dir, "--csv", "--no-index"], check=True, capture_output=True,
                           text=True)
        with open(os.path.join(out, "summary_x.csv"), "w") as f:
            f.write(r.stdout)
        assert ex.main([os.path.join(out, "blocks_x.csv"), "100"] + files) == 0
        return files

    files = bring_back(str(runs), str(tmp_path / "e3"))
    ev = W.load_e3(str(tmp_path / "e3"))
    assert sorted(a for _, a in ev) == sorted(["fp32", "mx_all", "noise_mx", "mx_sr_grad", "fp32@eps=1e-6",
                                               "mx_all@eps=1e-6", "fp32@beta2=0.95", "mx_all@beta2=0.95"])
    default = [p for p in files if W.R.optimizer_setting(
        dict(zip(("eps", "beta2"), ex._optimizer(_config(p))))) == ("1e-08", "0.999")]
    assert len(default) == 1
    (tmp_path / "e1runs").mkdir()
    shutil.copy(default[0], tmp_path / "e1runs")
    bring_back(str(tmp_path / "e1runs"), str(tmp_path / "e1"))
    assert W.main(["e3", "--dir", str(tmp_path / "e3"), "--e1", str(tmp_path / "e1")]) == 0


def _config(path):
    import h5py
    with h5py.File(path, "r") as f:
        c = f.attrs["config_yaml"]
    return c.decode() if isinstance(c, bytes) else str(c)


# The confirmation of E4's candidate fixes (the amendment of 2026-11-27): seeds 240-259, lr 6e-4.
def confirm_events(traj, s):
    i = s - 240
    if traj == "mx_all":
        return 40 + i % 5                       # every seed, early
    if traj == "fp32":
        return 120 + i if i % 4 else None       # 15 of 20, late
    if traj == "good":                          # FP32's seeds, a block before or after it: after mx_all everywhere
        return (119 if i % 2 else 121) + i if i % 4 else None
    return 30 + i % 5 if i < 18 else None       # "bad": before mx_all in 18 seeds


def write_confirm(d, arms=("fp32", "mx_all", "good", "bad"), seeds=range(240, 260), lr="0.0006"):
    write_runs(d, "confirm", [(f"c-{s}", s, "1.0e-08", "0.999", {t: confirm_events(t, s) for t in arms})
                              for s in seeds], lr=lr)


def test_confirm_family_and_readings(W, tmp_path, capsys):
    d = str(tmp_path / "c")
    write_confirm(d)
    assert W.main(["confirm", "--dir", d]) == 0
    out = capsys.readouterr().out
    assert "confirm: 20 of 20 seeds" in out and "recipes bad, good" in out and "(m = 4, Holm" in out
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| ")}
    # good: first in no seed against mx_all (every seed informative: p = 2 / 2^20); against FP32 first
    # in 10 of its 15 seeds (an interval containing 1, wide): confirmed, not "the fix"
    assert "good vs mx_all" in out and "| 0/20 |" in rows["good vs mx_all"] and "| 10/5 |" in rows["good vs fp32"]
    assert "**confirmed: brings MX's hazard near FP32's, within what 20 seeds resolve**" in rows["good"]
    assert "**not confirmed: stays a candidate**" in rows["bad"]
    res = W.run_family(W.load(d), W.confirm_tests(["bad", "good"]), W.CONFIRM_SEEDS)
    assert [r[0] for r in res] == ["bad vs mx_all", "bad vs fp32", "good vs mx_all", "good vs fp32"]
    assert res[2][1].p_perm == pytest.approx(2 * 0.5 ** 20)


def test_confirm_reading_rules(W):
    r = W.confirm_reading
    assert r(_cox(W, 0.2, 0.08, 0.5), 0.001, _cox(W, 1.0, 0.7, 1.4)) == "the fix"
    assert r(_cox(W, 0.2, 0.08, 0.5), 0.001, _cox(W, 1.1, 0.5, 2.4)).startswith("confirmed: brings MX's hazard near")
    assert r(_cox(W, 0.2, 0.08, 0.5), 0.001, _cox(W, 3.0, 1.2, 7.0)) == "not confirmed: its hazard is above FP32's"
    # an interval vs FP32 wholly below 1 (the amendment of 2026-11-28): the fix
    assert r(_cox(W, 0.05, 0.01, 0.2), 0.001, _cox(W, 0.1, 0.02, 0.6)) == "the fix"
    assert r(_cox(W, 0.2, 0.08, 0.5), 0.06, _cox(W, 1.0, 0.7, 1.4)) == "not confirmed: stays a candidate"
    assert r(_cox(W, 2.0, 1.2, 3.0), 0.001, _cox(W, 1.0, 0.7, 1.4)) == "not confirmed: stays a candidate"


def test_confirm_waits_for_all_seeds_and_refuses_other_data(W, tmp_path, capsys):
    d = str(tmp_path / "part")
    write_confirm(d, seeds=range(240, 250))
    assert W.main(["confirm", "--dir", d]) == 0
    out = capsys.readouterr().out
    assert "confirm: 10 of 20 seeds" in out and "not run until all 20 seeds" in out and "Holm" not in out
    for name, kw, msg in (("lr", {"lr": "0.0005"}, "runs at lr 0.0006 only"),
                          ("seed", {"seeds": range(239, 241)}, "seed 239: the confirmation's seeds are 240-259"),
                          ("arms", {"arms": ("fp32", "mx_all")}, "at least one recipe")):
        write_confirm(str(tmp_path / name), **kw)
        assert W.main(["confirm", "--dir", str(tmp_path / name)]) == 2
        assert msg in capsys.readouterr().err, name


def test_e3s_adam_settings_are_classified_as_recipes(W, tmp_path, capsys):
    """The amendment of 2026-11-28: on all 40 seeds, MX-all at eps 1e-6 and at beta2 0.95 are
    classified as E4's recipes against the default setting's mx_all and fp32, and e3 prints the
    loss levels (the median over seeds of the median block minimum of the last 2,000 steps)."""
    d, e1 = str(tmp_path / "e3"), str(tmp_path / "e1")
    write_e3(d)
    write_e1(e1)
    rows = {r: (vm, vf, c) for r, vm, vf, c in W.e3_fixes(W.load_e3(d))}
    assert list(rows) == ["mx_all@eps=1e-6", "mx_all@beta2=0.95"]
    # beta2: mx_all's step-50 event moved to 100 on every seed, after FP32's on none (FP32's are at
    # 150 or none): later than mx_all everywhere, earlier than FP32 on all 40 seeds -> above FP32
    assert rows["mx_all@beta2=0.95"][2] == "no fix" and rows["mx_all@beta2=0.95"][1].lo > 1
    assert W.main(["e3", "--dir", d, "--e1", e1]) == 0
    out = capsys.readouterr().out
    assert "MX-all at the other Adam settings as recipes" in out and "| mx_all@beta2=0.95 |" in out
    levels = out[out.index("Loss levels (descriptive):"):]
    # write_runs' loss: 1.0, and 100.0 from the excursion block on (all 200 blocks: events before 180)
    assert "| eps 1e-8, beta2 0.999 (default) | mx_all | 40 | 100 (100–100) |" in levels
    assert "| eps 1e-8, beta2 0.95 | fp32 | 40 | 1 (1–1) |" in levels
    # fp32 has its event at block 150 on 10 seeds: their level is 100, the quartiles say so
    assert "| eps 1e-8, beta2 0.999 (default) | fp32 | 40 | 1 (1–25.8) |" in levels


def test_loss_levels_by_hand(W, tmp_path):
    """loss_levels: the median of the last 20 full blocks' minima; a partial last block is left out,
    a block without a finite loss counts as +inf, and a trajectory shorter than 2,000 steps is an error."""
    d = tmp_path / "lv"
    d.mkdir()
    cols = ["run_id", "seed", "lr", "trajectory", "block_start", "steps", "min", "max", "mean", "nonfinite", "last",
            "eps", "beta2"]
    def write(mins, last_steps=100):
        with open(d / "blocks_lv.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for i, m in enumerate(mins):
                st = last_steps if i == len(mins) - 1 else 100
                w.writerow(["r", 200, "0.0005", "fp32", 100 * i, st, m, m, m, 0 if m != "" else st, m or "nan",
                            "1.0e-08", "0.999"])
    # 30 blocks: the first 10 at 9.0, then 1..20: the median of the last 20 is 10.5
    write(["9.0"] * 10 + [str(float(v)) for v in range(1, 21)])
    assert W.loss_levels(_trajs(W, d)) == {(200, "fp32"): 10.5}
    # a partial 31st block of 0.0 is not one of the last 20 full blocks
    write(["9.0"] * 10 + [str(float(v)) for v in range(1, 21)] + ["0.0"], last_steps=50)
    assert W.loss_levels(_trajs(W, d)) == {(200, "fp32"): 10.5}
    # 11 of the last 20 without a finite loss: the median is +inf
    write(["1.0"] * 9 + [""] * 11)
    assert W.loss_levels(_trajs(W, d)) == {(200, "fp32"): math.inf}
    write(["1.0"] * 19)
    with pytest.raises(W.StudyError, match="19 full blocks, fewer than the last 2000 steps"):
        W.loss_levels(_trajs(W, d))


def _trajs(W, d):
    """{(seed, trajectory@setting): trajectory} of the loss blocks in `d`, unchecked (no summaries)."""
    return {(seed, W.at_setting(name, W.setting_label(eps, beta2))): t for (seed, _lr, eps, beta2, name), t
            in W.R.read_blocks(W.R.csv_paths(str(d), "blocks_*"), optimizer=True).items()}


def write_confirm_adam(d, seeds=range(240, 260)):
    """The confirmation of an Adam setting (experiments/paper/why_mx_confirm_adam.yaml): per seed a
    default run and a beta2 0.95 run, each training fp32 and mx_all."""
    def beta2(traj, s):
        i = s - 240
        return None if traj == "fp32" or i % 10 else 150   # mx_all: 2 late events of 20; fp32 none
    runs = []
    for s in seeds:
        runs.append((f"d-{s}", s, "1.0e-08", "0.999", {t: confirm_events(t, s) for t in ("fp32", "mx_all")}))
        runs.append((f"b-{s}", s, "1.0e-08", "0.95", {t: beta2(t, s) for t in ("fp32", "mx_all")}))
    write_runs(d, "confirm_adam", runs, lr="0.0006")


def test_confirm_of_an_adam_setting(W, tmp_path, capsys):
    """A run set over Adam settings: MX-all at beta2 0.95 is the recipe (named as e3 names it), FP32
    at beta2 0.95 is shown but not a recipe; the tests pair a seed's trajectories across its two runs."""
    d = str(tmp_path / "ca")
    write_confirm_adam(d)
    events, recipes = W.load_confirm(d)
    assert recipes == ["mx_all@beta2=0.95"] and (240, "fp32@beta2=0.95") in events
    assert W.main(["confirm", "--dir", d]) == 0
    out = capsys.readouterr().out
    assert "recipes mx_all@beta2=0.95;" in out and "(m = 2, Holm" in out
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| ")}
    # vs mx_all: mx_all's event (blocks 40-44) comes first on all 20 seeds; vs FP32 (15 events, late):
    # the recipe's 2 events at block 150 come after FP32's (block 120 + i) on seed 250 and FP32 has
    # none on seed 240: fewer, so an interval not above 1 -> the fix, if its upper bound is < 1.5
    assert "| 0/20 |" in rows["mx_all@beta2=0.95 vs mx_all"]
    assert rows["mx_all@beta2=0.95"].endswith("**the fix** |"), rows["mx_all@beta2=0.95"]
    # written before the amendment, the reading would have been "its hazard differs from FP32's"
    res = W.run_family(events, W.confirm_tests(recipes), W.CONFIRM_SEEDS)
    assert res[1][2].hi < 1
    # beside the tests, not tests: FP32 at beta2 0.95 (no event) vs the default FP32 (15 events), and
    # MX-all vs FP32 at beta2 0.95 (2 events vs none, so both informative seeds have MX-all first)
    beside = out[out.index("Beside them, not tests"):out.index("Loss levels")]
    assert "| fp32@beta2=0.95 vs fp32 | 0 / 15 | 0/15 |" in beside
    assert "| mx_all@beta2=0.95 vs fp32@beta2=0.95 | 2 / 0 | 2/0 | 0.5 | inf [" in beside
    assert [(a, ref) for a, ref, _, _ in W.confirm_beside(events, recipes)] == [
        ("fp32@beta2=0.95", "fp32"), ("mx_all@beta2=0.95", "fp32@beta2=0.95")]
    # the runs (200 blocks) are long enough for the loss levels; write_runs' loss is 1.0 before an
    # excursion block and 100.0 from it on: the default mx_all's events all come before step 18,000
    levels = out[out.index("Loss levels (descriptive):"):]
    assert "| eps 1e-8, beta2 0.999 (default) | mx_all | 20 | 100 (100–100) |" in levels
    assert "| eps 1e-8, beta2 0.95 | fp32 | 20 | 1 (1–1) |" in levels


def test_confirm_of_an_mx_recipe_shows_nothing_beside(W, tmp_path, capsys):
    """E4's recipes run at the default Adam setting: no setting, so no comparison beside the tests."""
    d = str(tmp_path / "c")
    write_confirm(d)
    events, recipes = W.load_confirm(d)
    assert W.confirm_beside(events, recipes) == []
    assert W.main(["confirm", "--dir", d]) == 0
    assert "Beside them" not in capsys.readouterr().out


def test_answers_rows_on_adam_and_bias_are_the_scripts(W):
    """The answers table of results/README.md (row 14) and README's "What the lab found" quote E3's
    family and the confirmation of beta2 0.95 as the scripts compute them on the committed runs."""
    ev = W.load_e3(os.path.join(ROOT, "results", "why_mx", "e3"))
    res = W.run_family(ev, W.E3_TESTS)
    assert W.e3_readings(res) == ["falsified", "supported", "undecided", "supported", "supported", "not significant"]
    by = {label: (lr, cox, h) for label, lr, cox, h in res}
    hr = {label: W.R.hr_cell(cox) for label, (_, cox, _) in by.items()}
    cev, recipes = W.load_confirm(os.path.join(ROOT, "results", "why_mx", "confirm_adam"))
    cres = W.run_family(cev, W.confirm_tests(recipes), W.CONFIRM_SEEDS)
    (_, _, vm, hm), (_, _, vf, hf) = cres
    assert recipes == ["mx_all@beta2=0.95"] and W.confirm_reading(vm, hm, vf) == "the fix"
    n = {a: W._counts(ev, a) for a in ("fp32", "mx_all", "noise_mx", "mx_sr_grad", "mx_all@eps=1e-6",
                                        "mx_all@beta2=0.95", "fp32@beta2=0.95")}
    cn = {a: W._counts(cev, a) for a in ("fp32", "mx_all", "mx_all@beta2=0.95", "fp32@beta2=0.95")}
    # section 13's reading of the figure: MX-all at eps 1e-6 has its excursions early, none after 6,000
    assert max(t for (_, a), (e, t) in ev.items() if a == "mx_all@eps=1e-6" and e) < 6000
    assert n == {"fp32": 5, "mx_all": 35, "noise_mx": 1, "mx_sr_grad": 34, "mx_all@eps=1e-6": 11,
                 "mx_all@beta2=0.95": 0, "fp32@beta2=0.95": 0}
    assert cn == {"fp32": 15, "mx_all": 19, "mx_all@beta2=0.95": 0, "fp32@beta2=0.95": 0}
    results = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    row = next(line for line in results.splitlines() if line.startswith("| 14 |"))
    top = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    averts = next(line for line in top.splitlines() if line.startswith("| What averts MX's excursions?"))
    bias = next(line for line in top.splitlines() if line.startswith("| Is it MX's error size or its bias?"))
    p = lambda x: f"{x:.1e}".replace("e-0", "e-")  # noqa: E731  (5.38e-09 -> 5.4e-9)
    for text in (row, bias):
        assert f"HR {hr['Variance suffices']}" in text
        assert f"HR {hr['Bias matters']}, Holm p = {p(by['Bias matters'][2])}" in text
        assert f"HR {hr['SR of gradients']}, Holm p = {by['SR of gradients'][2]:.2f}" in text
    assert f"HR {hr['Adam eps 1e-6 (MX)']}, Holm p = {by['Adam eps 1e-6 (MX)'][2]:.2g}" in row
    b = by["Adam beta2 0.95 (MX)"]
    for text in (row, averts):
        assert f"upper bound {b[1].hi:.2g}, Holm p = {p(b[2])}" in text
        assert f"Holm p = {p(hm)}" in text and f"Holm p = {p(hf)}" in text
    assert f"upper bound {vm.hi:.2g}, Holm p = {p(hm)}" in row and f"upper bound {vf.hi:.2g}, Holm p = {p(hf)}" in row


def test_e3_figure_with_the_confirmation(W, tmp_path, capsys):
    """e3 --figure writes the Kaplan-Meier PNG (a second panel with --confirm); --confirm alone is
    refused with one line."""
    d, e1, c = str(tmp_path / "e3"), str(tmp_path / "e1"), str(tmp_path / "ca")
    write_e3(d)
    write_e1(e1)
    write_confirm_adam(c)
    png = tmp_path / "km.png"
    assert W.main(["e3", "--dir", d, "--e1", e1, "--figure", str(png), "--confirm", c]) == 0
    assert f"wrote {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one = tmp_path / "one.png"
    assert W.main(["e3", "--dir", d, "--e1", e1, "--figure", str(one)]) == 0
    assert one.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and one.stat().st_size < png.stat().st_size
    capsys.readouterr()
    assert W.main(["e3", "--dir", d, "--e1", e1, "--confirm", c]) == 2
    assert "give --figure PNG too" in capsys.readouterr().err


def test_e4_figure_draws_every_arm(W, tmp_path, capsys, monkeypatch):
    """e4 --figure writes the Kaplan-Meier PNG with one curve per arm, labelled with its counts."""
    d, e1 = str(tmp_path / "e4"), str(tmp_path / "e1")
    write_e4(d)
    write_e1(e1)
    drawn, draw = [], W._km_step
    monkeypatch.setattr(W, "_km_step", lambda ax, events, arm, label, **k: (drawn.append(label),
                                                                           draw(ax, events, arm, label, **k)))
    png = tmp_path / "e4.png"
    assert W.main(["e4", "--dir", d, "--e1", e1, "--figure", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {png}" in out and "| Holm p (m = 6) |" in out and "not run until" not in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn == ["fp32 (10/40)", "mx_all (40/40)", "rot_all (10/40)", "rot_e1 (10/40)", "rand_rot_sr (40/40)"]


def test_answers_rows_on_rotations_are_the_scripts(W):
    """The answers table of results/README.md (row 15) and README's "What the lab found" quote E4's
    family as the script computes it on the committed runs."""
    ev = W.load(os.path.join(ROOT, "results", "why_mx", "e4"))
    res = W.run_family(ev, W.E4_TESTS)
    assert W.e4_readings(res) == ["supported", "significant (HR > 1)"] * 3
    assert {c for _, _, _, c in W.e4_fixes(res)} == {"no fix"}
    by = {label: (W.R.hr_cell(cox), h) for label, _, cox, h in res}
    n = {a: W._counts(ev, a) for a in ("fp32", "mx_all", "rot_all", "rot_e1", "rand_rot_sr")}
    assert n == {"fp32": 5, "mx_all": 35, "rot_all": 19, "rot_e1": 23, "rand_rot_sr": 29}
    lr, cox = W.compare(ev, "rot_all", "rand_rot_sr")
    results = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    row = next(line for line in results.splitlines() if line.startswith("| 15 |"))
    top = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    rot = next(line for line in top.splitlines() if line.startswith("| Do Hadamard rotations"))
    p = lambda x: f"{x:.2g}" if x >= 1e-3 else f"{x:.1e}".replace("e-0", "e-")  # noqa: E731
    for r in ("rot_all", "rot_e1", "rand_rot_sr"):
        hr, h = by[f"{r} vs mx_all"]
        assert f"{n[r]}/40 (HR {hr}, Holm p = {p(h)})" in row
        assert by[f"{r} vs fp32"][0] in row
    hrf, hf = by["rot_all vs fp32"]
    assert f"HR {hrf} for every GEMM rotated, Holm p = {p(hf)}" in rot
    hr, h = by["rot_all vs mx_all"]
    assert f"19/40 (HR {hr}, Holm p = {p(h)})" in rot
    assert f"Holm p = {p(by['rot_all vs fp32'][1])}, {p(by['rot_e1 vs fp32'][1])}, {p(by['rand_rot_sr vs fp32'][1])}" in row
    for text in (row, rot):
        assert f"HR {W.R.hr_cell(cox)}" in text
    assert f"unadjusted p = {lr.p_perm:.3f}" in row
