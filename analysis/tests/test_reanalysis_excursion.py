"""results/reanalysis_excursion.py: the excursion from committed loss blocks (against
stats_util.excursion_step on the per-step series the blocks summarise), the loading rules of the two
20k studies, the paired comparisons and Holm families by hand, the strong-precursor alternative;
and results/README.md section 12 and the answers table as the script's output over the committed
CSVs (which are all it reads)."""

import builtins
import csv
import math
import os
import re
import subprocess
from unittest import mock

import numpy as np
import pytest
from conftest import load_results_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "results")


@pytest.fixture(scope="module")
def mod():
    return load_results_script("reanalysis_excursion")


# --------------------------------------------------------------------------- synthetic

def write_blocks(path, trajectories, block=100):
    """An extract_loss_blocks.py CSV of per-step losses {(run_id, seed, lr, trajectory): loss}."""
    xb = load_results_script("extract_loss_blocks")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(xb.COLUMNS)
        for (rid, seed, lr, traj), loss in trajectories.items():
            for off, n, lo, hi, mean, bad, last in xb.blocks(np.asarray(loss, dtype=float), block):
                w.writerow([rid, seed, lr, traj, off, n, xb._cell(lo), xb._cell(hi), xb._cell(mean), bad,
                            xb._cell(last)])


def random_series(rng, n):
    """A noisy loss at ~0.002 with 0-3 excursions of random height and length, sometimes ending
    non-finite (NaN or inf, from a random step to the end) or with a single NaN."""
    loss = 0.002 * np.exp(0.3 * rng.standard_normal(n))
    for _ in range(rng.integers(0, 4)):
        start, length = rng.integers(1, n), rng.integers(50, 900)
        loss[start:start + length] *= 10 ** rng.uniform(0.5, 3)
    r = rng.random()
    if r < 0.2:
        loss[rng.integers(1, n):] = rng.choice([np.nan, np.inf])
    elif r < 0.3:
        loss[rng.integers(0, n)] = np.nan
    return loss


def test_excursion_from_blocks_is_excursion_step_of_the_series(mod, tmp_path):
    """Over 300 random series (lengths with and without a trailing partial block, non-finite ends),
    the block rule on extract_loss_blocks.py's block minima gives stats_util.excursion_step of the
    per-step series, at every window."""
    from stats_util import excursion_step
    rng = np.random.default_rng(5)
    series = {}
    for i in range(300):
        n = int(rng.choice([3000, 3050, 2999, 1000]))
        series[(f"r{i}", i, "0.0005", "mx")] = random_series(rng, n)
    path = tmp_path / "loss_blocks_x.csv"
    write_blocks(path, series)
    trajs = mod.read_blocks([str(path)])
    events = 0
    for (rid, seed, lr, traj), loss in series.items():
        t = trajs[(seed, lr, traj)]
        for w in (100, 500, 1000):
            got = mod.excursion(t, w)
            assert got == excursion_step(loss, 10.0, w, 100), (rid, w, got)
            events += got[0]
    assert 100 < events < 800  # both outcomes are exercised
    with pytest.raises(ValueError):
        mod.excursion(t, 250)


def test_excursion_by_hand(mod):
    """Blocks 1, 1, 20, 20, 20, 20, 20, 1 (x 0.001): blocks 2-6 all exceed 10 x 0.001, so the
    excursion is at step 200 for W = 500; W = 600 needs a sixth block: none, censored at
    800 - 600 = 200. A trajectory ending non-finite gets W / B more +inf blocks."""
    t = {"mins": [1e-3, 1e-3, 0.02, 0.02, 0.02, 0.02, 0.02, 1e-3], "steps_run": 800, "absorbing": False,
         "partial": False, "run_id": "x"}
    assert mod.excursion(t, 500) == (True, 200)
    assert mod.excursion(t, 600) == (False, 200)
    t = dict(t, mins=[1e-3, 1e-3, 1e-3, 0.02], steps_run=400, absorbing=True)
    assert mod.excursion(t, 500) == (True, 300)  # block 3, then four +inf blocks after the end


def test_read_blocks_rejects_gaps_and_conflicting_reruns(mod, tmp_path):
    a = tmp_path / "loss_blocks_a.csv"
    write_blocks(a, {("r1", 1, "0.0005", "fp32"): [0.002] * 1000})
    rows = list(csv.reader(open(a)))
    del rows[3]  # block 200 missing
    with open(tmp_path / "loss_blocks_gap.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    with pytest.raises(mod.DataError, match="not consecutive"):
        mod.read_blocks([str(tmp_path / "loss_blocks_gap.csv")])
    b = tmp_path / "loss_blocks_b.csv"
    write_blocks(b, {("r2", 1, "0.0005", "fp32"): [0.002] * 500 + [0.5] * 500})
    with pytest.raises(mod.DataError, match="differ"):
        mod.read_blocks([str(a), str(b)])
    write_blocks(b, {("r2", 1, "0.0005", "fp32"): [0.002] * 1000})  # a rerun with the same losses
    assert mod.read_blocks([str(a), str(b)])[(1, "0.0005", "fp32")]["run_id"] == "r1"


def test_gzip_compressed_blocks_read_as_the_plain_ones(mod, tmp_path):
    """Committed loss blocks may be gzip-compressed: csv_paths finds X.csv and X.csv.gz, read_blocks
    gives the same trajectories from either, and one file present both ways is refused."""
    import gzip
    import shutil
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    rng = np.random.default_rng(7)
    for k in range(3):
        write_blocks(plain / f"blocks_s_{k}of3.csv", {(f"r{k}", k, "0.0005", t): random_series(rng, 2000)
                                                     for t in ("fp32", "mx")})
        with open(plain / f"blocks_s_{k}of3.csv", "rb") as src, gzip.open(packed / f"blocks_s_{k}of3.csv.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    shutil.copy(plain / "blocks_s_2of3.csv", packed / "blocks_s_2of3.csv.gz.not_a_match")
    a, b = mod.csv_paths(str(plain), "blocks_*"), mod.csv_paths(str(packed), "blocks_*")
    assert [os.path.basename(p) for p in a] == ["blocks_s_0of3.csv", "blocks_s_1of3.csv", "blocks_s_2of3.csv"]
    assert [os.path.basename(p) for p in b] == [os.path.basename(p) + ".gz" for p in a]
    ta, tb = mod.read_blocks(a), mod.read_blocks(b)
    assert len(ta) == 6 and ta == tb
    assert mod.blocks_by_run(a) == mod.blocks_by_run(b)
    shutil.copy(plain / "blocks_s_1of3.csv", packed / "blocks_s_1of3.csv")
    with pytest.raises(mod.DataError, match="both plain and as .gz"):
        mod.csv_paths(str(packed), "blocks_*")


def test_load_studies_joins_the_two_studies(mod, tmp_path):
    """The code-faithful study's `mx` becomes code_faithful; FP32 must be equal where both studies
    have the seed, and a seed only the code-faithful study has gives its FP32 from there."""
    fresh, cf = tmp_path / "fresh", tmp_path / "cf"
    fresh.mkdir()
    cf.mkdir()
    ok = [0.002] * 1000
    write_blocks(fresh / "loss_blocks_s0.csv", {("f1", 1, "0.0005", "fp32"): ok,
                                                ("f1", 1, "0.0005", "floor_away"): [0.002] * 300 + [1.0] * 700})
    write_blocks(cf / "loss_blocks_s0.csv", {("c1", 1, "0.0005", "fp32"): ok, ("c1", 1, "0.0005", "mx"): ok,
                                             ("c2", 2, "0.0005", "fp32"): ok, ("c2", 2, "0.0005", "mx"): ok})
    trajs, notes = mod.load_studies(str(fresh), str(cf))
    assert sorted(trajs) == [(1, "0.0005", "code_faithful"), (1, "0.0005", "floor_away"), (1, "0.0005", "fp32"),
                             (2, "0.0005", "code_faithful"), (2, "0.0005", "fp32")]
    assert notes["fp32_shared_equal"] == 1 and notes["fresh_seeds"] == [1] and notes["cf_seeds"] == [1, 2]
    assert mod.events(trajs, 500)[(1, "0.0005", "floor_away")] == (True, 300)
    write_blocks(cf / "loss_blocks_s0.csv", {("c1", 1, "0.0005", "fp32"): [0.002] * 900 + [0.001] * 100})
    with pytest.raises(mod.DataError, match="FP32 trajectory differs"):
        mod.load_studies(str(fresh), str(cf))


def test_paired_comparison_and_holm_families_by_hand(mod):
    """Four seeds at one lr. Arm a: excursion first in seeds 1, 2, 3 (the reference censored or
    later), none in seed 4: b = 3, c = 0, exact p = 2 / 2^3 = 0.25, HR infinite. Arm b: first in
    seed 1, the reference first in seed 2, the same step in seed 3: b = c = 1, p = 1. Holm over
    the family (a, b) x one lr: 0.25 * 2 = 0.5 and max(0.5, 1) = 1."""
    lr = "0.0005"
    ev = {}
    for seed, ref, a, b in [(1, (False, 900), (True, 100), (True, 100)), (2, (True, 500), (True, 200), (True, 700)),
                            (3, (True, 800), (True, 300), (True, 800)), (4, (False, 900), (False, 900), (False, 900))]:
        ev[(seed, lr, "ref")], ev[(seed, lr, "a")], ev[(seed, lr, "b")] = ref, a, b
    res = mod.compare(mod.pairs(ev, lr, "a", "ref"))
    assert (res["n"], res["ev_ref"], res["ev_arm"], res["b"], res["c"]) == (4, 2, 3, 3, 0)
    assert res["p"] == pytest.approx(0.25) and res["cox"].kind == "+inf" and res["cox"].ties == "breslow"
    assert mod.hr_cell(res["cox"]).startswith("inf [")
    rows = mod.family_tests(ev, [("q", [("a", "ref"), ("b", "ref")])])
    assert [(r[2], r[4]["b"], r[4]["c"], r[5]) for r in rows] == [("a", 3, 0, pytest.approx(0.5)), ("b", 1, 1, 1.0)]
    assert "| q (m = 2) | 5e-4 | a vs ref | 4 | 2 / 3 | 3 / 0 | inf [" in mod.tests_table(rows)
    assert mod.g(127.7) == "130" and mod.g(0.000291) == "0.00029" and mod.g(math.nan) == "–"


def test_strong_precursor_alternative(mod):
    """tilt_probs gives uniform ranks at 0.5 and the asked-for expected percentile otherwise; a
    planted strong precursor is not rejected as strong, a null mean percentile is."""
    assert np.allclose(mod.tilt_probs(4, 0.5), 0.2)
    for m in (1, 3, 17, 40):
        p = mod.tilt_probs(m, 0.7)
        assert (p * np.arange(m + 1) / m).sum() == pytest.approx(0.7, abs=1e-9)
        assert np.all(np.diff(p) > 0)
    strong = [("r", "lr", 0, 0, 0, 20, 0.9) for _ in range(30)]
    lo, hi, p_strong, power = mod.precursor_stats(strong, 4000, 0.025)
    assert lo == hi == pytest.approx(0.9) and p_strong == 1.0 and power > 0.9
    null = [("r", "lr", 0, 0, 0, 20, x) for x in np.linspace(0.05, 0.95, 30)]
    lo, hi, p_strong, _ = mod.precursor_stats(null, 4000, 0.025)
    assert lo < 0.5 < hi < 0.7 and p_strong < 0.001


# --------------------------------------------------------------------------- the committed data

@pytest.fixture(scope="module")
def committed(mod):
    """report() with the CLI's defaults over the committed CSVs, recording every file it opens."""
    opened = []
    real_open = builtins.open

    def recording_open(file, *args, **kwargs):
        opened.append(os.path.abspath(os.fspath(file)))
        return real_open(file, *args, **kwargs)

    with mock.patch("builtins.open", recording_open):
        text, res = mod.report(os.path.join(RESULTS, "fresh_seeds_20k"), os.path.join(RESULTS, "code_faithful_20k"),
                               os.path.join(RESULTS, "study_arms"), 10_000, 2000)
    return text, res, opened


def _readme():
    readme = open(os.path.join(RESULTS, "README.md"), encoding="utf-8").read()
    section = readme[readme.index("## 12. "):readme.index("## Not done")]
    flat = lambda s: " ".join(s.replace("**", "").split())
    return readme, section, flat(readme), flat(section)


def test_reads_committed_csvs_only(committed):
    """Every file the re-analysis opens is a CSV (plain or gzip-compressed) under results/ that git
    tracks (no run file, no binary, nothing from a device call)."""
    _, _, opened = committed
    # modules and system files (time zones, ...) that lazy imports open on the way are no data
    assert not [p for p in opened if p.endswith((".h5", ".hdf5"))], opened
    data = {p for p in opened if p.startswith(ROOT + os.sep) and not p.endswith((".py", ".pyc"))}
    assert data and all(p.startswith(RESULTS + os.sep) and p.endswith((".csv", ".csv.gz")) for p in data), \
        sorted(data)[:5]
    try:
        tracked = subprocess.run(["git", "-C", ROOT, "ls-files", "results"], capture_output=True, text=True,
                                 check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git checkout: the files are under results/, their tracking cannot be checked")
    tracked = {os.path.join(ROOT, p) for p in tracked}
    assert data <= tracked, sorted(data - tracked)[:5]


def test_readme_section_12_tables_are_the_scripts_output(committed):
    text, _, _ = committed
    _, section, _, flat_section = _readme()
    tables = [b for b in text.split("\n\n") if b.startswith("|")]
    assert len(tables) == 7
    for t in tables:
        assert t in section, t.splitlines()[0]
    assert ("the FP32 trajectory's block minima are equal in both studies on all 28 (seed, lr) they share" in text
            and "arms). The script checks that its block minima are equal on all 28 (seed, lr) the two studies share."
            in flat_section)


def _lr(x):
    return {"5e-4": "0.0005", "6e-4": "0.0006"}[x]


def _counts(res, lr, arm, w=500, seeds=None):
    ev = res["ev_by_w"][w]
    if seeds is None:
        seeds = sorted(s for s, l, a in ev if l == _lr(lr) and a == arm)
    return f"{sum(ev[(s, _lr(lr), arm)][0] for s in seeds)}/{len(seeds)}"


def test_readme_section_12_numbers(mod, committed):
    """The numbers section 12's findings quote, from the script's results."""
    _, res, _ = committed
    _, _, _, flat = _readme()
    cmp = {(lr, a, r): (x, q) for _, lr, a, r, x, q in res["rows"]}
    fresh = {lr: sorted(s for s, l, a in res["ev_by_w"][500] if l == lr and a == "floor_away") for lr in ("0.0005", "0.0006")}
    assert fresh["0.0005"] == [103, 104, 105, 106, 107, 108, 109, 113, 114, 115, 116, 117, 118, 119]
    hr = lambda lr, a, r: mod.hr_cell(cmp[(_lr(lr), a, r)][0]["cox"]).replace("inf", "∞")
    q = lambda lr, a, r: mod.g(cmp[(_lr(lr), a, r)][1])
    # The audit's counts.
    c = lambda lr, a: _counts(res, lr, a, seeds=fresh[_lr(lr)])
    assert (f"At lr 5e-4: FP32 {c('5e-4', 'fp32')}, each of `floor_away`, `floor_even` and `rceil_even` "
            f"{c('5e-4', 'floor_away')}, and the code-faithful MX {_counts(res, '5e-4', 'code_faithful')} against "
            f"FP32's {_counts(res, '5e-4', 'fp32')}. At lr 6e-4: FP32 {c('6e-4', 'fp32')}.") in flat
    assert c("5e-4", "floor_away") == c("5e-4", "floor_even") == c("5e-4", "rceil_even") == "12/14"
    assert (c("5e-4", "fp32"), _counts(res, "5e-4", "code_faithful"), _counts(res, "5e-4", "fp32"),
            c("6e-4", "fp32")) == ("4/14", "18/20", "6/20", "11/14")
    # lr 5e-4, every arm vs FP32.
    assert (f"HR {hr('5e-4', 'floor_away', 'fp32')} for `floor_away`, {hr('5e-4', 'floor_even', 'fp32')} for "
            f"`floor_even`, {hr('5e-4', 'rceil_even', 'fp32')} for `rceil_even`, Holm p "
            f"{q('5e-4', 'floor_away', 'fp32')}, {q('5e-4', 'floor_even', 'fp32')} and "
            f"{q('5e-4', 'rceil_even', 'fp32')}.") in flat
    assert (f"The code-faithful MX: HR {hr('5e-4', 'code_faithful', 'fp32')}, Holm p = "
            f"{q('5e-4', 'code_faithful', 'fp32')}.") in flat
    assert all(cmp[(lr, a, "fp32")][1] < 0.05 for lr in ("0.0005", "0.0006") for a in mod.FRESH_ARMS + (mod.CF,))
    # The bootstrap table's rows, parsed back from the printed table (it is pinned verbatim above).
    text = committed[0]
    boot = re.findall(r"^\| (5e-4|6e-4) \| (\w+|mean of arms) \| \d+ \| ([+-][0-9.]+) \[[^]]*\] \| ([0-9.e-]+) \| "
                      r"(-?\d+) \[[^]]*\] \| ([0-9.e-]+) \|$", text, re.M)
    arms = lambda lr: [b for b in boot if b[0] == lr and b[1] != "code_faithful"]
    assert len(arms("5e-4")) == len(arms("6e-4")) == 4
    d5 = {b[2] for b in arms("5e-4")}
    assert d5 == {"+0.57"}
    assert (f"exceeds FP32's by 0.57 (bootstrap p ≤ {max(float(b[3]) for b in arms('5e-4')):.2g}), and they stay "
            f"excursion-free {min(-int(b[4]) for b in arms('5e-4')):,}–{max(-int(b[4]) for b in arms('5e-4')):,} "
            f"fewer steps on average (p ≤ {max(float(b[5]) for b in arms('5e-4')):.2g}).") in flat
    f6 = sorted(float(b[2]) for b in arms("6e-4"))
    p6 = sorted(float(b[3]) for b in arms("6e-4"))
    r6 = sorted(-int(b[4]) for b in arms("6e-4"))
    assert (f"the fractions differ by only {f6[0]:.2f}–{f6[-1]:.2f} (bootstrap p {p6[0]:.2g}–{p6[-1]:.2g}). The "
            f"difference is in time: {r6[0]:,}–{r6[-1]:,} fewer excursion-free steps (p ≤ "
            f"{max(float(b[5]) for b in arms('6e-4')):.2g}).") in flat
    # lr 6e-4.
    firsts = {cmp[("0.0006", a, "fp32")][0]["b"] for a in mod.FRESH_ARMS}
    hrs6 = sorted(cmp[("0.0006", a, "fp32")][0]["cox"].hr for a in mod.FRESH_ARMS)
    assert (f"FP32 itself has an excursion in {c('6e-4', 'fp32')} seeds ({_counts(res, '6e-4', 'fp32')} over seeds "
            "100–119).") in flat
    assert firsts == {12}
    assert (f"In every MX arm the MX excursion came first in 12 of the 14 seeds: HR {mod.g(hrs6[0])}–"
            f"{mod.g(hrs6[-1])}, Holm p ≤ {mod.g(max(cmp[('0.0006', a, 'fp32')][1] for a in mod.FRESH_ARMS))}. For "
            f"the code-faithful MX, HR {hr('6e-4', 'code_faithful', 'fp32')}, Holm p = "
            f"{q('6e-4', 'code_faithful', 'fp32')}.") in flat
    # Rounding and scale rule.
    fam = [(k, v) for k, v in cmp.items() if k[2] in ("floor_away", "floor_even") and k[1] in mod.FRESH_ARMS]
    assert len(fam) == 6 and all(v[1] == 1.0 for _, v in fam)
    hrs = sorted(v[0]["cox"].hr for _, v in fam)
    assert f"Every one of the 6 tests has Holm p = 1, with HRs {mod.g(hrs[0])}–{mod.g(hrs[-1])}." in flat
    assert (f"The intervals reach from {mod.g(min(v[0]['cox'].lo for _, v in fam))} to "
            f"{mod.g(max(v[0]['cox'].hi for _, v in fam))}: `floor_even` vs `floor_away` "
            f"{hr('5e-4', 'floor_even', 'floor_away')} and {hr('6e-4', 'floor_even', 'floor_away')}; `rceil_even` vs "
            f"`floor_even` {hr('5e-4', 'rceil_even', 'floor_even')} and {hr('6e-4', 'rceil_even', 'floor_even')}.") in flat
    rec = [p for p in res["power"] if p[2] != mod.CF]
    four = sorted(x for p in rec for x in (p[7][0], p[7][3]))
    two = sorted(x for p in rec for x in (p[7][1], p[7][2]))
    assert len(rec) == 6 and mod.POWER_HRS == (0.25, 0.5, 2.0, 4.0)
    assert (f"each test had a power of {four[0]:.2f}–{four[-1]:.2f} against a 4-fold change of the hazard and "
            f"{two[0]:.2f}–{two[-1]:.2f} against a 2-fold one.") in flat
    # Quantized γ.
    cfa = [p for p in res["power"] if p[2] == mod.CF]
    p4 = sorted(p[7][3] for p in cfa)
    assert (f"12/14 vs 12/14 at 5e-4, HR {hr('5e-4', 'code_faithful', 'floor_away')}; 14/14 vs 14/14 at 6e-4, HR "
            f"{hr('6e-4', 'code_faithful', 'floor_away')}; Holm p = {q('5e-4', 'code_faithful', 'floor_away')} for "
            "both.") in flat
    assert q("5e-4", "code_faithful", "floor_away") == q("6e-4", "code_faithful", "floor_away")
    for lr, k in (("0.0005", "12"), ("0.0006", "14")):
        x = cmp[(lr, mod.CF, "floor_away")][0]
        assert (x["n"], x["ev_ref"], x["ev_arm"]) == (14, int(k), int(k))
    lo = min(cmp[(lr, mod.CF, "floor_away")][0]["cox"].lo for lr in ("0.0005", "0.0006"))
    hi = max(cmp[(lr, mod.CF, "floor_away")][0]["cox"].hi for lr in ("0.0005", "0.0006"))
    assert (f"The intervals reach from {mod.g(lo)} to {mod.g(hi)}, so a hazard about half or four to five times the "
            f"emulator's is not excluded (power {p4[0]:.2f}–{p4[-1]:.2f} against HR 4).") in flat
    # W = 1000, 2000 (descriptive).
    other = {}
    for w in (1000, 2000):
        for lr in ("0.0005", "0.0006"):
            for a, r in [c_ for _, cs in mod.FAMILIES for c_ in cs]:
                other[(w, lr, a, r)] = mod.compare(mod.pairs(res["ev_by_w"][w], lr, a, r))
    fresh_vs = [v["cox"].hr for k, v in other.items() if k[3] == "fp32" and k[2] in mod.FRESH_ARMS]
    cf_vs = [v["cox"].hr for k, v in other.items() if k[3] == "fp32" and k[2] == mod.CF]
    with_one = [k for k, v in other.items() if k[3] == "fp32" and v["cox"].lo <= 1]
    rest = [v["cox"].hr for k, v in other.items() if k[3] != "fp32"]
    assert (f"Against FP32 the fresh arms' HRs are {mod.g(min(fresh_vs))} to ∞ and the code-faithful MX's "
            f"{mod.g(min(cf_vs))}–{mod.g(max(cf_vs))}.") in flat and max(fresh_vs) == math.inf
    assert with_one == [(2000, "0.0005", "floor_away", "fp32")]
    x = other[with_one[0]]
    assert (f"`floor_away` at 5e-4, W = 2000: {x['ev_arm']} vs {x['ev_ref']} excursions, HR "
            f"{mod.hr_cell(x['cox'])}.") in flat
    assert f"stay within HR {mod.g(min(rest))}–{mod.g(max(rest))}." in flat
    # Section 10, the old rule.
    s10 = {(a, r): (x, qq) for _, a, r, x, qq in res["study10"]}
    assert all(qq >= 0.05 for _, qq in s10.values())
    best = min(s10.items(), key=lambda kv: kv[1][0]["p"])
    assert best[0] == ("rceil_away", "fp32")
    assert (f"The smallest p is `rceil_away` vs FP32: {best[1][0]['b']} / {best[1][0]['c']} first, p = "
            f"{mod.g(best[1][0]['p'])}, Holm {mod.g(best[1][1])}.") in flat
    ones = [v[0]["cox"] for k, v in s10.items() if k[1] == "floor_away" and k[0].startswith("away_")]
    assert (f"Every one-role ties-away arm vs `floor_away` has HR {mod.g(min(x.hr for x in ones))}–"
            f"{mod.g(max(x.hr for x in ones))}, with intervals from {mod.g(min(x.lo for x in ones))} to "
            f"{mod.g(max(x.hi for x in ones))}.") in flat
    # Precursors.
    pre = {(t, label.split(":")[0].split(",")[0]): (n, k, {qq[0][:2]: qq for qq in qs}) for t, label, n, k, qs in res["precursors"]}
    n, k, mx = pre[("mx", "first spike")]
    z, gm = mx["ζ²"], mx["γ "]
    assert (f"({z[1]} of its {k} spikes usable), ζ² has mean percentile {z[2]:.2f} [{z[3]:.2f}, {z[4]:.2f}] (p = "
            f"{mod.g(z[5])}) and the γ last-bin fraction {gm[2]:.2f} [{gm[3]:.2f}, {gm[4]:.2f}] (p = {mod.g(gm[5])}, "
            f"Holm {mod.g(gm[6])}).") in flat
    assert z[4] < 0.70 and gm[4] < 0.70 and z[7] == gm[7] == 0.0 and min(z[8], gm[8]) == max(z[8], gm[8])
    assert (f"a mean this low has probability < 1e-4, and the test had power {z[8]:.2f} against it." in flat
            and f"(a mean percentile up to about {max(z[4], gm[4]):.2f})" in flat)
    _, k1, s1 = pre[("mx", "first_spike_step")]
    _, k2, s2 = pre[("mx", "excursion")]
    assert (f"With `first_spike_step` on the series ({s1['ζ²'][1]} events): ζ² {s1['ζ²'][2]:.2f}, γ {s1['γ '][2]:.2f}. "
            f"With the excursion ({s2['ζ²'][1]}): {s2['ζ²'][2]:.2f} and {s2['γ '][2]:.2f}.") in flat
    _, kf, f = pre[("fp32", "first spike")]
    fg = f["γ "]
    assert (f"Before FP32's own first spikes ({fg[1]}), γ's mean percentile is {fg[2]:.2f} [{fg[3]:.2f}, "
            f"{fg[4]:.2f}] (p = {fg[5]:.2f}).") in flat


def test_readme_answers_table_quotes_section_12(mod, committed):
    """Rows 2-10 of the answers table: their numbers are the script's."""
    _, res, _ = committed
    _, _, flat_all, _ = _readme()
    table = flat_all[flat_all.index("## Answers in one table"):flat_all.index("## Setup")]
    cmp = {(lr, a, r): (x, q) for _, lr, a, r, x, q in res["rows"]}
    hr = lambda lr, a, r: mod.hr_cell(cmp[(lr, a, r)][0]["cox"])
    pre = {(t, label.split(":")[0].split(",")[0]): {qq[0][:2]: qq for qq in qs} for t, label, n, k, qs in res["precursors"]}
    z, gm = pre[("mx", "first spike")]["ζ²"], pre[("mx", "first spike")]["γ "]
    assert ("no evidence of a precursor; a strong one (mean percentile > 0.70) is ruled out (§12, paper's code path, "
            f"40 runs): before the MX trajectory's first loss spike ({gm[1]} events) the γ last-bin fraction sits at "
            f"mean percentile {gm[2]:.2f} [95 % {gm[3]:.2f}–{gm[4]:.2f}] among the runs still at risk (p = "
            f"{mod.g(gm[5])}); if it were a strong precursor (0.70), a mean this low would have probability < 1e-4, "
            f"and the test had power {gm[8]:.2f} against one. A weak precursor (up to ≈ {gm[4]:.2f}) is not excluded."
            ) in table
    assert (f"No evidence of a precursor; a strong one (mean percentile > 0.70) is ruled out (§12: before the first "
            f"spike, {z[1]} events, mean percentile {z[2]:.2f} [95 % {z[3]:.2f}–{z[4]:.2f}], p = {mod.g(z[5])}; power "
            f"{z[8]:.2f} against 0.70).") in table
    assert "| 4 | Fig. 2b: without layernorm | trend (n = 2): FP32 part reproduced, MX part not" in table
    power = [p for p in res["power"] if p[2] != mod.CF]
    four = sorted(x for p in power for x in (p[7][0], p[7][3]))
    two = sorted(x for p in power for x in (p[7][1], p[7][2]))
    assert (f"nearest-even vs ties-away elements HR {hr('0.0005', 'floor_even', 'floor_away')} at lr 5e-4 and "
            f"{hr('0.0006', 'floor_even', 'floor_away')} at 6e-4; the round-up scale vs floor (both nearest-even) "
            f"{hr('0.0005', 'rceil_even', 'floor_even')} and {hr('0.0006', 'rceil_even', 'floor_even')}; Holm p = 1 "
            f"for all six tests of the question. Each test's power: {four[0]:.2f}–{four[-1]:.2f} against a 4-fold "
            f"change of the hazard, {two[0]:.2f}–{two[-1]:.2f} against a 2-fold one") in table
    s10 = {(a, r): (x, qq) for _, a, r, x, qq in res["study10"]}
    assert f"`rceil_away` vs `floor_away` HR {mod.hr_cell(s10[('rceil_away', 'floor_away')][0]['cox'])}." in table
    qs = sorted(cmp[(lr, a, "fp32")][1] for lr in ("0.0005",) for a in mod.FRESH_ARMS)
    hr5 = sorted(cmp[("0.0005", a, "fp32")][0]["cox"].hr for a in mod.FRESH_ARMS)
    hr6 = sorted(cmp[("0.0006", a, "fp32")][0]["cox"].hr for a in mod.FRESH_ARMS)
    assert (f"lr 5e-4: FP32 4/14, each emulator arm 12/14 (HR {mod.g(hr5[0])} to ∞, Holm p {mod.g(qs[0])}–"
            f"{mod.g(qs[-1])}); code-faithful MX 18/20 vs FP32 6/20 (HR {hr('0.0005', 'code_faithful', 'fp32')}, Holm "
            f"p = {mod.g(cmp[('0.0005', mod.CF, 'fp32')][1])}). lr 6e-4 (the paper's): FP32 is not stable, with "
            f"excursions in 11/14 seeds (17/20), but MX's come first in 12 of 14 seeds in every arm (HR "
            f"{mod.g(hr6[0])}–{mod.g(hr6[-1])}, Holm p ≤ "
            f"{mod.g(max(cmp[('0.0006', a, 'fp32')][1] for a in mod.FRESH_ARMS))}; code-faithful HR "
            f"{hr('0.0006', 'code_faithful', 'fp32')}, Holm p = {mod.g(cmp[('0.0006', mod.CF, 'fp32')][1])}).") in table
    assert hr5[-1] == math.inf
    best = s10[("rceil_away", "fp32")]
    assert (f"(smallest: `rceil_away`, first in {best[0]['b']} seeds vs {best[0]['c']}, p = {mod.g(best[0]['p'])}, "
            f"Holm {mod.g(best[1])})") in table
    ones = [v[0]["cox"] for k, v in s10.items() if k[1] == "floor_away" and k[0].startswith("away_")]
    assert all(x.lo < 1 < x.hi for x in ones) and all(v[1] == 1.0 for k, v in s10.items() if k[1] == "floor_away")
    assert (f"HR {mod.g(min(x.hr for x in ones))}–{mod.g(max(x.hr for x in ones))} with every interval containing 1 "
            f"({mod.g(min(x.lo for x in ones))}–{mod.g(max(x.hi for x in ones))}), Holm p = 1; against FP32 none "
            f"survives Holm.") in table
    assert f"nearest-even vs ties-away has HR {hr('0.0005', 'floor_even', 'floor_away')} at lr 5e-4 (§12)." in table
    fg = pre[("fp32", "first spike")]["γ "]
    assert f"before FP32's own first loss spikes ({fg[1]}) its mean percentile is {fg[2]:.2f} (p = {fg[5]:.2f}, §12)" in table
    cfa = sorted(p[7][3] for p in res["power"] if p[2] == mod.CF)
    lo = min(cmp[(lr, mod.CF, "floor_away")][0]["cox"].lo for lr in ("0.0005", "0.0006"))
    hi = max(cmp[(lr, mod.CF, "floor_away")][0]["cox"].hi for lr in ("0.0005", "0.0006"))
    assert 0.4 < lo < 0.6 and 4 < hi < 6
    assert ("| 10 | is quantized γ necessary for the instability? | no (§12, excursion, paired): the paper's code path "
            "keeps layernorm γ and β in bf16 (nothing of γ is MXFP8-quantized or clamped), yet has excursions in 18/20 "
            f"seeds vs FP32's 6/20 at lr 5e-4 (HR {hr('0.0005', 'code_faithful', 'fp32')}, Holm p = "
            f"{mod.g(cmp[('0.0005', mod.CF, 'fp32')][1])}; lr 6e-4: HR {hr('0.0006', 'code_faithful', 'fp32')}), and "
            f"as often as the emulator with MXFP8 γ on the same 14 seeds (12/14 vs 12/14, HR "
            f"{hr('0.0005', 'code_faithful', 'floor_away')}; lr 6e-4: 14/14 vs 14/14, HR "
            f"{hr('0.0006', 'code_faithful', 'floor_away')}; Holm p = {mod.g(cmp[('0.0005', mod.CF, 'floor_away')][1])})."
            f" \"As often\" within what 14 seeds resolve: the intervals ({mod.g(lo)}–{mod.g(hi)}) do not exclude a "
            f"hazard about half or four to five times the emulator's (power {cfa[0]:.2f}–{cfa[-1]:.2f} against HR 4)"
            ) in table


def test_readme_section_12_context_numbers(mod):
    """The old rule's numbers section 12 and the §11 note quote as the reason for the re-analysis:
    the end-of-run MX events at lr 5e-4, and the precursor events that came after the first spike."""
    import glob
    sa = load_results_script("study_arms")
    pc = load_results_script("precursors")
    runs, _ = sa.load(os.path.join(RESULTS, "fresh_seeds_20k"), "summary_fresh_seeds_20k_shard")
    five = sa.split_runs(runs, "optimizer.lr")["0.0005"]
    steps = [sa.diverged_to_end(row)[1] for g in five.values() for a, row in g.items()
             if a != "fp32" and sa.diverged_to_end(row)[0]]
    late = sum(1 for s in steps if s >= 20000 - 100)
    _, _, flat_all, flat = _readme()
    assert (late, len(steps)) == (8, 26)
    assert f"(§11: {late} of the {len(steps)} MX events at lr 5e-4 in the last 100 steps)" in flat
    dirs = sorted(glob.glob(os.path.join(RESULTS, "code_faithful_20k", "series_code_faithful_20k_shard*")))
    div = pc.load(dirs, "mx", 500)
    spike = {s[0]: s for s in pc.load(dirs, "mx", 500, "spike", 10.0)}
    events = [s for s in div if s[2]]
    before = [s for s in events if spike[s[0]][2] and spike[s[0]][3] < s[3] - 1500]
    assert (len(before), len(events)) == (16, 18)
    assert "its event came after the instability had begun (the first loss spike) in 16 of its 18 cases" in flat
    assert "came after the instability had begun in 16 of its 18 cases" in flat_all[flat_all.index("## 11. "):]


def test_readme_cites_no_issue_numbers():
    readme = open(os.path.join(RESULTS, "README.md"), encoding="utf-8").read()
    assert not re.search(r"\bissues? \d", readme, re.I), re.search(r".{40}\bissues? \d.{20}", readme, re.I).group(0)


def test_cli_runs_and_rejects_bad_options(mod, tmp_path, capsys):
    with pytest.raises(SystemExit):
        mod.main(["--bootstrap", "5"])
    empty = tmp_path / "none"
    empty.mkdir()
    assert mod.main(["--fresh", str(empty)]) == 2
    assert "no loss_blocks_*.csv in" in capsys.readouterr().err
