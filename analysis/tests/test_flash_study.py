"""results/flash_study.py: the flash-attention study's pre-registered analysis
(results/prereg/flash_bf16.md) on made-up study CSVs in the binary's layout (checked against the
CSVs of a real tiny run of experiments/paper/flash_study.yaml, MXLAB_BINARY): the arms each
hypothesis pairs, the Holm family of m = 5 in the hypotheses' order, the directions (HR > 1, HR < 1,
two-sided for H4), undecided by construction below 6 informative seeds, the falsification
criteria, the secondary family (k = 2) as its own family, the excursions checked against the
binary's, the interim count, the pilot's choice, the power of undecided hypotheses and the
mechanism's items."""
import csv
import gzip
import math
import os
import pathlib
import re

import pytest

from conftest import ROOT, load_results_script, run_device_script


@pytest.fixture(scope="module")
def F():
    return load_results_script("flash_study")


# The columns of `mxlab summarize --csv` (test_real_tiny_run checks them against the binary's).
SUMMARY = ("run_id,group,at,seed,status,excursion_step,excursion_censored_at,first_spike_step,tail_log_ratio,parent,"
           "at_risk,branch_excursion_step,branch_censored_at,control_excursion_step,control_censored_at,"
           "diverged_to_end_step,first_nonfinite_step,spike_count,spike_score,final_loss,min_loss,max_bias_ratio,"
           "max_gamma_lastbin,steps_run,source,file,error").split(",")
BLOCKS = ("run_id", "seed", "lr", "trajectory", "block_start", "steps", "min", "max", "mean", "nonfinite", "last",
          "eps", "beta2")
N_BLOCKS = 100  # 10,000 steps


def write_study(d, onset, seeds=range(300, 340), lr="0.003", lie=None, name="0of1"):
    """The study's summary and loss-blocks CSVs for `seeds`: onset {(seed, arm): (block, kind)} with
    kind "primary" (the loss x 100 from that block: k = 10 and k = 2 excursions) or "secondary"
    (x 3: k = 2 only); every other trajectory flat. `lie` = (seed, arm): the binary's
    excursion_step says otherwise there."""
    d.mkdir(exist_ok=True)
    with open(d / f"blocks_flash_study_{name}.csv", "w", newline="") as fb, \
            open(d / f"summary_flash_study_{name}.csv", "w", newline="") as fs:
        b, s = csv.writer(fb), csv.DictWriter(fs, fieldnames=SUMMARY)
        b.writerow(BLOCKS)
        s.writeheader()
        for seed in seeds:
            for arm in ("fp32", "flash", "stabilized", "delta_hp", "mxfp8_flash", "mxfp8_exact"):
                block, kind = onset.get((seed, arm), (None, None))
                factor = {"primary": 100.0, "secondary": 3.0, None: 1.0}[kind]
                for i in range(N_BLOCKS):
                    m = factor if block is not None and i >= block else 1.0
                    b.writerow([f"r{seed}", seed, lr, arm, 100 * i, 100, m, m, m, 0, m, "1.0e-08", "0.95"])
                ev = kind == "primary"
                if (seed, arm) == lie:
                    ev = not ev
                s.writerow({"run_id": f"r{seed}", "group": arm, "seed": seed, "status": "complete",
                            "excursion_step": 100 * block if ev and block else (5000 if ev else -1),
                            "excursion_censored_at": -1 if ev else 9500, "steps_run": 10000,
                            "file": f"runs/r{seed}.h5"})


def write_pilot(d, chosen=(4, 3e-3)):
    """A complete pilot (flash_pilot_choice's layout) whose rule (step A) chooses `chosen`."""
    d.mkdir(exist_ok=True)
    with open(d / "blocks_flash_pilot_0of1.csv", "w", newline="") as fb, \
            open(d / "summary_flash_pilot_0of1.csv", "w", newline="") as fs:
        b, s = csv.writer(fb), csv.writer(fs)
        b.writerow(BLOCKS)
        s.writerow(["run_id", "group", "at", "seed", "model.depth", "optimizer.lr", "status", "excursion_step",
                    "excursion_censored_at"])
        for depth in (2, 4):
            for lr in (1e-3, 3e-3, 1e-2, 3e-2):
                for seed in (1100, 1101):
                    rid = f"d{depth}lr{lr:g}s{seed}"
                    for g in ("fp32", "flash"):
                        ev = (depth, lr) == chosen and g == "flash"
                        for i in range(N_BLOCKS):
                            m = 100.0 if ev and i >= 50 else 1.0
                            b.writerow([rid, seed, f"{lr:g}", g, 100 * i, 100, m, m, m, 0, m, "", ""])
                        s.writerow([rid, g, "", seed, depth, f"{lr:g}", "complete", 5000 if ev else -1,
                                    -1 if ev else 9500])
    return d


# Scenario "ordered": each hypothesis's pair has its own (arm first, ref first) counts, so a wrong
# pairing shows: H1 (20, 0), H2 (0, 20), H3 (2, 18), H4 (30, 0), H5 (30, 6).
def ordered():
    on = {}
    for s in range(300, 340):
        i = s - 300
        if i < 20:
            on[(s, "flash")] = (40, "primary")
        if i < 4:
            on[(s, "stabilized")] = (60, "primary")
        if i < 2:
            on[(s, "delta_hp")] = (20, "primary")
        if i < 30:
            on[(s, "mxfp8_flash")] = (30, "primary")
        if 30 <= i < 36:
            on[(s, "mxfp8_exact")] = (50, "primary")
    return on


EXPECTED_FIRST = {"H1": (20, 0), "H2": (0, 20), "H3": (2, 18), "H4": (30, 0), "H5": (30, 6)}


def _family(F, d, endpoint="primary"):
    study = F.load(str(d))
    return study, F.family(study.events[endpoint])


def _main(F, argv, capsys):
    rc = F.main(argv + ["--power-sims", "200"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_each_hypothesis_pairs_its_arms_in_the_preregistered_order(F, tmp_path):
    write_study(tmp_path / "s", ordered())
    _, res = _family(F, tmp_path / "s")
    assert [(t.label, t.arm, t.ref) for t, *_ in res] == [
        ("H1", "flash", "fp32"), ("H2", "stabilized", "flash"), ("H3", "delta_hp", "flash"),
        ("H4", "mxfp8_flash", "flash"), ("H5", "mxfp8_flash", "mxfp8_exact")]
    assert {t.label: (lr.arm_first, lr.ref_first) for t, lr, _, _ in res} == EXPECTED_FIRST
    # the HR is compared / reference: flash's excursions come first against fp32, stabilized's never before flash's
    by = {t.label: cox for t, _, cox, _ in res}
    assert by["H1"].hr > 1 and by["H2"].hr < 1 and by["H3"].hr < 1 and by["H4"].hr > 1 and by["H5"].hr > 1


def test_holm_is_over_the_five_hypotheses_in_their_order(F, tmp_path):
    write_study(tmp_path / "s", ordered())
    _, res = _family(F, tmp_path / "s")
    ps = {t.label: lr.p_perm for t, lr, _, _ in res}
    # Holm by hand over exactly these five p-values (m = 5), matched back to each hypothesis
    order = sorted(ps, key=ps.get)
    adj, run = {}, 0.0
    for i, label in enumerate(order):
        run = max(run, min(1.0, (5 - i) * ps[label]))
        adj[label] = run
    assert {t.label: h for t, _, _, h in res} == pytest.approx(adj, rel=1e-12)
    assert adj["H4"] == pytest.approx(5 * ps["H4"])  # the smallest p (30 informative seeds) times m = 5
    assert ps["H5"] > ps["H1"]  # H5 (30 vs 6) is not the family's first or last: the order matters


def test_verdicts_follow_each_hypothesis_direction(F, tmp_path, capsys):
    write_study(tmp_path / "s", ordered())
    _, res = _family(F, tmp_path / "s")
    assert {t.label: F.verdict(t, lr, cox, h) for t, lr, cox, h in res} == {
        "H1": "supported", "H2": "supported", "H3": "supported", "H4": "supported (HR > 1)", "H5": "supported"}
    # the other way round: fp32's excursions mostly before flash's (HR < 1 for a hypothesis of HR > 1),
    # delta_hp's and mxfp8_exact's before flash's and mxfp8_flash's (HR > 1 for one of HR < 1, HR < 1
    # for one of HR > 1), mxfp8_flash with none where flash always has one (H4 significant, HR < 1)
    on = {}
    for s in range(300, 340):
        i = s - 300
        on[(s, "flash")] = (40, "primary")
        on[(s, "fp32")] = (30, "primary") if i < 30 else (50, "primary")
        on[(s, "stabilized")] = (60, "primary")
        if i < 30:
            on[(s, "delta_hp")] = (20, "primary")
            on[(s, "mxfp8_exact")] = (50, "primary")
    write_study(tmp_path / "t", on)
    _, res = _family(F, tmp_path / "t")
    assert {t.label: (lr.arm_first, lr.ref_first) for t, lr, _, _ in res} == {
        "H1": (10, 30), "H2": (0, 40), "H3": (30, 10), "H4": (0, 40), "H5": (0, 30)}
    v = {t.label: F.verdict(t, lr, cox, h) for t, lr, cox, h in res}
    assert v == {"H1": "falsified",            # significant, but HR < 1: its upper bound < 2
                 "H2": "supported",            # stabilized always after flash: HR < 1
                 "H3": "falsified",            # delta_hp first in 30 seeds: HR > 1, its lower bound > 0.5
                 "H4": "supported (HR < 1)",   # two-sided: significant either way, its direction reported
                 "H5": "falsified"}            # mxfp8_exact first in 30 seeds: HR < 1, upper bound < 2


def _cox(F, hr, lo, hi, kind="finite"):
    return F.P.Cox(hr, lo, hi, kind, math.log(hr) if 0 < hr < math.inf else math.nan, 0.1, hr, lo, hi, "breslow")


class _LR:
    def __init__(self, b, c):
        self.arm_first, self.ref_first = b, c


def test_falsification_criteria(F):
    h1, h2, h3, h4, h5 = F.TESTS
    lr = _LR(10, 10)
    # H1, H5 (HR > 1): falsified when the upper bound < 2 (2 itself is not below)
    assert F.verdict(h1, lr, _cox(F, 1.1, 0.6, 1.9), 0.5) == "falsified"
    assert F.verdict(h1, lr, _cox(F, 1.1, 0.6, 2.0), 0.5) == "undecided"
    assert F.verdict(h5, lr, _cox(F, 1.4, 1.05, 1.9), 0.01) == "mixed (significant, but the upper bound < 2)"
    assert F.verdict(h5, lr, _cox(F, 4.0, 1.5, 11.0), 0.01) == "supported"
    assert F.verdict(h5, lr, _cox(F, 0.2, 0.08, 0.5), 0.01) == "falsified"  # significant the wrong way
    # H2, H3 (HR < 1): falsified when the lower bound > 0.5
    assert F.verdict(h2, lr, _cox(F, 0.9, 0.51, 1.6), 0.5) == "falsified"
    assert F.verdict(h3, lr, _cox(F, 0.9, 0.5, 1.6), 0.5) == "undecided"
    assert F.verdict(h3, lr, _cox(F, 0.2, 0.08, 0.49), 0.001) == "supported"
    assert F.verdict(h2, lr, _cox(F, 4.0, 1.5, 11.0), 0.001) == "falsified"
    # H4 (two-sided): supported when significant, with its direction; falsified within [0.5, 2]
    assert F.verdict(h4, lr, _cox(F, 1.0, 0.5, 2.0), 0.9) == "falsified"
    assert F.verdict(h4, lr, _cox(F, 1.0, 0.49, 2.0), 0.9) == "undecided"
    assert F.verdict(h4, lr, _cox(F, 1.0, 0.5, 2.01), 0.9) == "undecided"
    assert F.verdict(h4, lr, _cox(F, 0.3, 0.1, 0.6), 0.01) == "supported (HR < 1)"
    assert F.verdict(h4, lr, _cox(F, 1.5, 1.1, 1.9), 0.01).startswith("mixed (significant, HR > 1")
    # no estimate (no informative seed): never falsified
    none = F.P.Cox(*([math.nan] * 3), "none", *([math.nan] * 5), "breslow")
    assert all(F.rule(t, none, 1.0) == "undecided" for t in F.TESTS)
    # a monotone likelihood: HR 0 with its profile bound, HR inf with its lower bound
    assert F.verdict(h1, lr, _cox(F, 0.0, 0.0, 0.4, "0"), 0.01) == "falsified"
    assert F.verdict(h1, lr, _cox(F, math.inf, 3.0, math.inf, "+inf"), 0.01) == "supported"


def test_every_hypothesis_falsified_when_no_arm_leads(F, tmp_path):
    """Every trajectory has an excursion; even seeds in the arms' order, odd ones reversed: each
    pair 20 / 20, HR ~ 1 with an interval inside [0.5, 2]."""
    arms = ("fp32", "flash", "stabilized", "delta_hp", "mxfp8_flash", "mxfp8_exact")
    on = {}
    for s in range(300, 340):
        for j, a in enumerate(arms):
            on[(s, a)] = (20 + 5 * (j if s % 2 == 0 else 5 - j), "primary")
    write_study(tmp_path / "s", on)
    _, res = _family(F, tmp_path / "s")
    for t, lr, cox, h in res:
        assert (lr.arm_first, lr.ref_first) in ((20, 20),)
        assert 0.5 < cox.lo < 1 < cox.hi < 2
        assert F.verdict(t, lr, cox, h) == "falsified", t.label


def test_fewer_than_six_informative_seeds_are_undecided_by_construction(F, tmp_path):
    # flash never has an excursion; fp32 has one in 5 seeds: flash never first, HR 0, its profile
    # bound < 2 — the criteria alone would falsify H1, the pre-registration leaves it undecided
    write_study(tmp_path / "five", {(s, "fp32"): (40, "primary") for s in range(300, 305)})
    _, res = _family(F, tmp_path / "five")
    t, lr, cox, h = res[0]
    assert (t.label, lr.arm_first, lr.ref_first) == ("H1", 0, 5) and cox.hi < 2
    assert F.rule(t, cox, h) == "falsified"
    assert F.verdict(t, lr, cox, h) == ("undecided by construction (5 informative seeds < 6; the criteria alone "
                                        "would say falsified)")
    # H2-H5: flash has no excursion, nothing is informative
    assert all(F.verdict(*r).startswith("undecided by construction (0 informative seeds") for r in res[1:])
    # six seeds decide
    write_study(tmp_path / "six", {(s, "fp32"): (40, "primary") for s in range(300, 306)})
    _, res = _family(F, tmp_path / "six")
    assert F.verdict(*res[0]) == "falsified"


def test_the_secondary_family_is_its_own(F, tmp_path, capsys):
    on = ordered()
    write_study(tmp_path / "p", on)
    write_pilot(tmp_path / "pilot")
    rc, base, _ = _main(F, ["--dir", str(tmp_path / "p"), "--pilot", str(tmp_path / "pilot")], capsys)
    assert rc == 0
    # k = 2 excursions only (the loss x 3): stabilized before flash in seeds 304-313 at k = 2
    more = dict(on)
    for s in range(304, 314):
        more[(s, "stabilized")] = (10, "secondary")
    write_study(tmp_path / "q", more)
    study, prim = _family(F, tmp_path / "q")
    _, sec = _family(F, tmp_path / "q", "secondary")
    assert [t.label for t, *_ in sec] == ["H1", "H2", "H3", "H4", "H5"]
    lr2 = {t.label: (lr.arm_first, lr.ref_first) for t, lr, _, _ in sec}
    assert lr2["H2"] == (10, 10)  # at k = 2 stabilized comes first in 10 seeds, flash in the other 10
    assert {t.label: (lr.arm_first, lr.ref_first) for t, lr, _, _ in prim} == EXPECTED_FIRST  # k = 10 unchanged
    # its Holm is over its own five p-values
    ps = sorted(lr.p_perm for _, lr, _, _ in sec)
    assert min(h for *_, h in sec) == pytest.approx(min(1.0, 5 * ps[0]))
    rc, out, _ = _main(F, ["--dir", str(tmp_path / "q"), "--pilot", str(tmp_path / "pilot")], capsys)
    assert rc == 0
    head = "Secondary family (k = 2"
    primary = lambda text: text.split("Primary family")[1].split(head)[0]
    assert primary(out) == primary(base)  # the primary family, its tables and power, are unchanged
    sec_part = out.split(head)[1]
    assert "| H2 | stabilized vs flash" in sec_part and "| 10 / 10 |" in sec_part
    assert "m = 5" in sec_part and "m = 10" not in out


def test_excursions_unlike_the_binarys_are_an_error(F, tmp_path, capsys):
    write_study(tmp_path / "s", ordered(), lie=(305, "flash"))
    with pytest.raises(F.StudyError, match="binary"):
        F.load(str(tmp_path / "s"))
    rc, out, err = _main(F, ["--dir", str(tmp_path / "s"), "--pilot", str(tmp_path / "none")], capsys)
    assert rc == 2 and out == "" and "seed 305 flash: excursion from the blocks" in err
    assert len(err.strip().splitlines()) == 1


def test_interim_count_and_no_verdicts(F, tmp_path, capsys):
    write_pilot(tmp_path / "pilot")
    write_study(tmp_path / "s", ordered(), seeds=range(300, 339))  # 39 seeds
    rc, out, _ = _main(F, ["--dir", str(tmp_path / "s"), "--pilot", str(tmp_path / "pilot"), "--figure",
                           str(tmp_path / "km.png")], capsys)
    assert rc == 0
    assert "39 of 40 seeds complete" in out and "INTERIM COUNT (39 of 40 seeds)" in out
    assert "| flash | 39 | 20/39 (" in out
    assert "family" not in out and "Holm p" not in out and "**" not in out  # no test, no verdict
    assert "figure: not written" in out and not (tmp_path / "km.png").exists()
    with pytest.raises(F.StudyError, match="300-339"):
        F.family(F.load(str(tmp_path / "s")).events["primary"])
    # all 40 seeds but the pilot incomplete: no run of the study counts yet
    write_study(tmp_path / "all", ordered())
    (tmp_path / "pilot" / "summary_flash_pilot_0of1.csv").write_text("run_id,group,at,seed,status\n")
    rc, out, _ = _main(F, ["--dir", str(tmp_path / "all"), "--pilot", str(tmp_path / "pilot")], capsys)
    assert rc == 0 and "INTERIM COUNT (40 of 40 seeds, pilot incomplete)" in out and "**" not in out
    # an empty folder: none complete; no folder: exit 2
    (tmp_path / "empty").mkdir()
    rc, out, _ = _main(F, ["--dir", str(tmp_path / "empty"), "--pilot", str(tmp_path / "pilot")], capsys)
    assert rc == 0 and "0 of 40 seeds complete" in out and "INTERIM" in out
    rc, _, err = _main(F, ["--dir", str(tmp_path / "nowhere")], capsys)
    assert rc == 2 and "no directory" in err and "0 of 40" in err


def test_data_that_are_not_the_study(F, tmp_path):
    write_study(tmp_path / "a", {}, seeds=[200])
    with pytest.raises(F.StudyError, match="seed 200"):
        F.load(str(tmp_path / "a"))
    write_study(tmp_path / "b", {}, seeds=[300])
    write_study(tmp_path / "b", {}, seeds=[301], lr="0.01", name="1of2")
    with pytest.raises(F.StudyError, match="learning rates"):
        F.load(str(tmp_path / "b"))


def test_the_study_must_have_run_the_pilots_choice(F, tmp_path, capsys):
    write_study(tmp_path / "s", ordered())
    write_pilot(tmp_path / "pilot", chosen=(2, 1e-2))
    rc, _, err = _main(F, ["--dir", str(tmp_path / "s"), "--pilot", str(tmp_path / "pilot")], capsys)
    assert rc == 2 and "the pilot's rule chose 0.01" in err
    study = F.load(str(tmp_path / "s"))
    F.check_configuration(study, (4, 3e-3), 4)
    with pytest.raises(F.StudyError, match="depth 2"):
        F.check_configuration(study, (2, 3e-3), 4)


def test_complete_report_power_and_figure(F, tmp_path, capsys):
    write_study(tmp_path / "s", {(s, "fp32"): (40, "primary") for s in range(300, 305)})
    write_pilot(tmp_path / "pilot")
    png = tmp_path / "km.png"
    rc, out, _ = _main(F, ["--dir", str(tmp_path / "s"), "--pilot", str(tmp_path / "pilot"), "--figure", str(png)],
                       capsys)
    assert rc == 0
    assert "chosen: depth 4, lr 0.003 (rule step A" in out
    assert "| fp32 | 40 | 5/40 (" in out
    assert "| mxfp8_exact vs fp32 | 0 / 5 | 0 / 5 |" in out  # beside the family, not tested
    assert "**undecided by construction (5 informative seeds < 6; the criteria alone would say falsified)**" in out
    # the power of undecided H1: HR 2 at fp32's 5/40; flash had none, so H2-H4 have no power
    power = out.split("Power of the undecided hypotheses (primary")[1].split("\n\n")[1]
    h1 = [line for line in power.splitlines() if line.startswith("| H1 | HR 2 | 5/40 (fp32) |")]
    assert len(h1) == 1 and "0.05 → 0.25 (HR 5.95): 0.61 / 0.33" in h1[0]
    p05, p01 = (float(x) for x in h1[0].split("|")[4:6])
    assert 0 < p01 <= p05 < 0.5
    assert "| H2 | HR 0.5 | 0/40 (flash) | – (flash had no excursion" in power
    assert "| H4 | HR 0.5 or 2 |" in power and "| H5 |" in power and "none pre-registered" in power
    assert "no instruments*.csv" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in out


def test_needed_power_and_the_preregistered_rows(F):
    rows = F.prereg_power()
    assert [r[3] for r in rows["H1"]] == [0.25, 0.5, 0.75] and rows["H1"][1][7:] == (1.0, 0.97)
    assert F.prereg_rows_for("H3", rows) == rows["H2/H3"] and F.prereg_rows_for("H5", rows) == []
    ev = {(s, a): (s < 320 and a == "flash", 4000 if s < 320 and a == "flash" else 9500)
          for s in range(300, 340) for a in F.ARMS}
    h2, h4 = F.TESTS[1], F.TESTS[3]
    res, why = F.needed_power(h2, ev, 5, 300)
    assert why is None and [r[0] for r in res] == [0.5] and 0 < res[0][2] <= res[0][1] < 1
    res, _ = F.needed_power(h4, ev, 5, 300)
    assert [r[0] for r in res] == [0.5, 2.0]
    res, why = F.needed_power(F.TESTS[0], ev, 5, 300)  # fp32 has none
    assert res is None and "fp32 had no excursion (0 of 40)" in why


# --------------------------------------------------------------------------- mechanism

def _inst(step, layer=0, multi_one=0.1, delta=1.0, cum="", wq=1.0, cos=""):
    return {"step": str(step), "layer": str(layer), "attn_multi_max_frac": "0.2", "attn_multi_one_frac": str(multi_one),
            "attn_delta_bias": str(delta), "attn_delta_bias_cumsum": str(cum), "attn_wq_spec": str(wq),
            "attn_wk_spec": "2.0", "attn_dwq_err_cos": str(cos)}


def test_layer_stats_before_the_event(F):
    rows = [_inst(s, delta=d, cum=c, wq=w, cos=x) for s, d, c, w, x in
            ((0, 1.0, 1.0, 1.0, ""), (50, 2.0, 3.0, 1.5, 0.6), (100, 3.0, 6.0, 2.0, 0.8), (150, -100.0, -94.0, 9.0, 0.1))]
    s = F.layer_stats(rows, onset=150)  # the row at the onset is not before it
    assert s["rows"] == 3 and s["delta_n"] == 3 and s["delta_mean"] == pytest.approx(2.0)
    assert s["t"] == pytest.approx(2.0 / (1.0 / math.sqrt(3)))  # sd of 1, 2, 3 is 1
    assert s["delta_pos"] == 1.0 and s["running_sum"] == 6.0 and s["wq_max"] == 2.0
    assert s["err_cos"] == pytest.approx(0.7) and s["multi_one"] == pytest.approx(0.1)
    s = F.layer_stats(rows, onset=None)
    assert s["rows"] == 4 and s["delta_pos"] == 0.75 and s["running_sum"] == -94.0
    flat = F.layer_stats([_inst(0, delta=0.0), _inst(50, delta=0.0)], None)  # delta_hp: the sum is exactly 0
    assert math.isnan(flat["t"]) and flat["delta_pos"] == 0.0


def _spec(ratios, rank1=0.8, cos=0.95, start=1000):
    """Spectral rows of W_Q of layer 0 at steps 0, start, start + 1000, ... with sigma_max ratios to
    fp32's (fp32: sigma_max 1)."""
    own, ref = {}, {}
    for i, r in enumerate([1.0] + list(ratios)):
        step = 0 if i == 0 else start + 1000 * (i - 1)
        own[step] = {"sigma_max": str(r), "diff_rank1": "" if i == 0 else str(rank1),
                     "diff_dir_cos": "" if i < 2 else str(cos)}
        ref[step] = {"sigma_max": "1.0"}
    return {(0, "W_Q"): own}, {(0, "W_Q"): ref, (0, "W_K"): dict(ref)}


def test_weight_series_and_the_chain(F):
    spec, ref = _spec([1.01, 1.02, 1.05, 1.1])  # snapshots 1000 ... 4000
    ws = F.weight_series(spec, ref, 0, "W_Q", onset=3500)
    assert [x[0] for x in ws] == [1000, 2000, 3000] and ws[-1][1:] == (1.05, 0.8, 0.95)
    layers = {0: {"multi_one": 0.1, "t": 4.0}}
    assert F.chain(layers, spec, ref, 3500) == ("shows", "layer 0 W_Q")
    assert F.chain(layers, spec, ref, None) == ("shows", "layer 0 W_Q")          # at the end of the run
    # an onset at step 3,000: the snapshot at 3000 is not before it, two remain
    assert F.chain(layers, spec, ref, 3000)[0] == "not evaluable"
    assert F.chain(layers, spec, ref, 2500)[0] == "not evaluable"
    # each criterion fails the chain
    assert F.chain({0: {"multi_one": 0.0, "t": 4.0}}, spec, ref, 3500)[0] == "does not"
    assert F.chain({0: {"multi_one": 0.1, "t": -2.9}}, spec, ref, 3500)[0] == "does not"
    assert F.chain({0: {"multi_one": 0.1, "t": -3.1}}, spec, ref, 3500)[0] == "shows"  # |t|: either sign
    flat, _ = _spec([1.01, 1.05, 1.05, 1.1])
    assert F.chain(layers, flat, ref, 3500)[0] == "does not"                       # not rising
    low, _ = _spec([1.01, 1.02, 1.05, 1.1], rank1=0.5)
    assert F.chain(layers, low, ref, 3500)[0] == "does not"                        # rank-one share not > 0.5
    turn, _ = _spec([1.01, 1.02, 1.05, 1.1], cos=0.9)
    assert F.chain(layers, turn, ref, 3500)[0] == "does not"                       # cosine not > 0.9
    assert F.chain({}, spec, ref, 3500)[0] == "no data"
    assert F.links(layers, low, ref, None) == {"ties": True, "delta": True, "rising": True, "low_rank": False}


# --------------------------------------------------------------------------- a real run

EXPERIMENT = os.path.join(ROOT, "experiments", "paper", "flash_study.yaml")


@pytest.fixture(scope="module")
def real(binary, tmp_path_factory):
    """experiments/paper/flash_study.yaml itself (its arms, lr, instruments) at tiny shapes, seed 300
    for 600 steps, through experiments/paper/run_why_mx.sh as on the device: what comes back."""
    text = open(EXPERIMENT).read()
    for key, value in (("steps", 600), ("depth", 2), ("width", 32), ("heads", 1), ("seq_len", 32), ("batch", 1),
                       ("log_every", 50), ("bias_every", 100), ("snapshot_every", 100)):
        text, n = re.subn(rf"^(\s*{key}:) \d+", rf"\g<1> {value}", text, flags=re.M)
        assert n == 1, key
    text, n = re.subn(r"seeds: \[[^\]]*\]", "seeds: [300]", text)
    assert n == 1
    out, log = run_device_script(binary, tmp_path_factory.mktemp("flash_study_device"), {"flash_study": text},
                                 ["flash_study=0/1"])
    return pathlib.Path(out)


def test_real_tiny_run(F, real, capsys):
    """The binary's and the extractors' layout is what the analysis reads (and what write_study
    writes): summary and block columns, the trajectory names, the instruments and snapshots."""
    with open(real / "summary_flash_study_0of1.csv") as f:
        assert next(csv.reader(f)) == SUMMARY
    with open(real / "blocks_flash_study_0of1.csv") as f:
        assert tuple(next(csv.reader(f))) == BLOCKS
    study = F.load(str(real))
    with open(EXPERIMENT) as f:  # the study's lr, as the blocks give it
        lr = next(line.split(":")[1].split("#")[0] for line in f if line.strip().startswith("lr:"))
    assert study.seeds() == [300] and float(study.lr) == float(lr) and study.trajectories == 6
    assert {a for _, a in study.events["primary"]} == set(F.ARMS)
    assert study.events["primary"][(300, "flash")] == (False, 100)  # censored at 600 - W
    mech = F.mechanism(study, str(real))
    assert mech.depth == 2
    for arm in F.FLASH_KERNEL:  # the flash instruments, per layer, before the (absent) event
        assert set(mech.layers[(300, arm)]) == {0, 1}
        assert mech.layers[(300, arm)][0]["rows"] == 13 and mech.layers[(300, arm)][0]["multi_max"] >= 0
    assert math.isnan(mech.layers[(300, "mxfp8_exact")][0]["multi_one"])  # exact attention: no flash instrument
    assert mech.layers[(300, "mxfp8_exact")][0]["wq_max"] > 0             # but the spectral norms
    ws = mech.weights[(300, "flash")][(0, "W_Q")]
    assert [x[0] for x in ws] == [100, 200, 300, 400, 500, 600] and all(x[1] > 0 for x in ws)
    assert set(mech.chains) == {(300, "flash"), (300, "mxfp8_flash")}
    assert mech.chains[(300, "flash")][0] in ("shows", "does not")
    # the mechanism's tables read the real columns
    assert "| flash | 0 | 1 |" in F.markdown_ties(mech, [300]) and "Kernel check" in F.markdown_ties(mech, [300])
    assert "| flash | 1 | no | 1 |" in F.markdown_delta(mech, [300])
    assert "| mxfp8_exact | 1 | W_O | no | 1 |" in F.markdown_weights(mech, [300])
    assert "| mxfp8_flash | 1 | W_K | " in F.markdown_weight_steps(mech, [300])
    assert "| delta_hp | 0 | no | 1 |" in F.markdown_logged(mech, [300])
    assert "(of 1)" in F.markdown_chain(mech, [300]) and "| 300 | stabilized | - | 1 |" in F.markdown_per_trajectory(mech, [300])
    rc, out, _ = _main(F, ["--dir", str(real), "--pilot", str(real / "nopilot")], capsys)
    assert rc == 0 and "1 of 40 seeds complete" in out and "INTERIM COUNT (1 of 40 seeds, pilot incomplete)" in out
    # a row that two extracts give differently is an error; the same row twice is not
    rows = gzip.decompress((real / "instruments_flash_study_0of1.csv.gz").read_bytes()).decode().splitlines()
    (real / "instruments_again.csv").write_text("\n".join(rows[:3]) + "\n")
    F.mechanism(study, str(real))
    head, first = rows[0], rows[1].split(",")
    first[-1] = "0.5" if first[-1] != "0.5" else "0.25"
    (real / "instruments_again.csv").write_text(head + "\n" + ",".join(first) + "\n")
    with pytest.raises(F.StudyError, match="different rows"):
        F.mechanism(study, str(real))
    (real / "instruments_again.csv").unlink()


INSTRUMENTS = ("attn_logit_max", "attn_multi_max_frac", "attn_multi_one_frac", "attn_delta_bias",
               "attn_delta_bias_cumsum", "attn_wq_spec", "attn_wk_spec", "attn_wv_spec", "attn_dwq_err_cos")
SPECTRAL = ("run_id", "seed", "lr", "trajectory", "step", "layer", "matrix", "sigma_max", "fro", "diff_fro",
            "diff_sigma1", "diff_rank1", "diff_dir_cos")


def write_mechanism(d, chain_of, extra_run=None, one_frac=(0.1, 0.1)):
    """instruments.csv.gz and spectral.csv.gz of the study in `d` (2 layers; rows every 500 steps,
    snapshots every 1000): the trajectories in chain_of (seed, arm) have the whole chain in layer 1
    (ties, a positive delta bias, W_Q's sigma_max rising over FP32's with a rank-one, steady error);
    the flash-kernel arms have ties everywhere (attn_multi_one_frac one_frac[layer]), no consistent
    delta bias, no growth. `extra_run`: rows of a run the summaries do not list (to be ignored)."""
    arms = ("fp32", "flash", "stabilized", "delta_hp", "mxfp8_flash", "mxfp8_exact")
    with gzip.open(d / "instruments.csv.gz", "wt", newline="") as fi, gzip.open(d / "spectral.csv.gz", "wt", newline="") as fs:
        wi, ws = csv.writer(fi), csv.writer(fs)
        wi.writerow(("run_id", "seed", "lr", "trajectory", "step", "layer") + INSTRUMENTS)
        ws.writerow(SPECTRAL)
        for seed in list(range(300, 340)) + ([extra_run] if extra_run else []):
            rid = f"r{seed}"
            for arm in arms:
                flash = arm in ("flash", "stabilized", "delta_hp", "mxfp8_flash")
                chained = (seed, arm) in chain_of
                cum = {0: 0.0, 1: 0.0}
                for i, step in enumerate(range(0, 10000, 500)):
                    for layer in (0, 1):
                        delta = (1.0 + 0.1 * (i % 2)) if chained and layer == 1 else (1.0 if i % 2 else -1.0)
                        cum[layer] += delta
                        flash_cells = [0.2, one_frac[layer], delta, cum[layer]] if flash else ["", "", "", ""]
                        wi.writerow([rid, seed, "0.003", arm, step, layer, 5.0] + flash_cells + [1.0, 1.0, 1.0, ""])
                for k, step in enumerate(range(0, 10001, 1000)):
                    for layer in (0, 1):
                        for matrix in ("W_Q", "W_K", "W_V", "W_O"):
                            grows = chained and layer == 1 and matrix == "W_Q"
                            sigma = 1.0 + (0.01 * k if grows else 0.0)
                            diff = ["", "", "", ""] if arm == "fp32" else (
                                [0.0, 0.0, "", ""] if step == 0 else
                                [0.1, 0.09, 0.8 if grows else 0.2, "" if k == 1 else (0.95 if grows else 0.3)])
                            ws.writerow([rid, seed, "0.003", arm, step, layer, matrix, sigma, 3.0] + diff)


def test_complete_report_with_the_mechanism(F, tmp_path, capsys):
    on = ordered()  # flash: events at step 4000 in seeds 300-319; mxfp8_flash at 3000 in 300-329
    write_study(tmp_path / "s", on)
    chained = {(s, "flash") for s in range(300, 320)} | {(s, "mxfp8_flash") for s in range(300, 310)}
    write_mechanism(tmp_path / "s", chained, extra_run=999)
    write_pilot(tmp_path / "pilot", chosen=(2, 3e-3))
    rc, out, _ = _main(F, ["--dir", str(tmp_path / "s"), "--pilot", str(tmp_path / "pilot"), "--per-trajectory"],
                       capsys)
    assert rc == 0, out
    mech = out.split("Mechanism (descriptive")[1]
    # item 4: flash's 20 events show the chain (onset 4000: snapshots 1000-3000 before it), its 20
    # others do not; mxfp8_flash's onsets at 3000 leave two snapshots: not evaluable
    assert "| flash | 0 / 0 / 0 / 0 (of 0) |" not in mech
    assert "| flash | 20 / 0 / 0 / 0 (of 20) | 0 / 20 / 0 / 0 (of 20) | 20, 20, 20, 20 / 20, 0, 0, 0 |" in mech
    assert "| mxfp8_flash | 0 / 0 / 30 / 0 (of 30) | 0 / 10 / 0 / 0 (of 10) |" in mech
    # item 2: the delta bias of flash's events, positive in layer 1
    assert "| flash | 1 | yes | 20 |" in mech and "| 20 / 0 |" in mech
    assert "flash: 20 of 20 trajectories with an excursion have |t| > 3 in some layer, 20 of them positive" in mech
    # item 1 over the four flash-kernel arms, the kernel check (stabilized as flash here)
    assert "| stabilized | 1 | 40 | 0.2 (0.2–0.2) | 0.1 (0.1–0.1) |" in mech
    assert "layer 0: below flash's in 0 of 40 seeds" in mech
    # item 3 at the last snapshot before the event: flash's layer-1 W_Q at 3000
    assert "| flash | 1 | W_Q | yes | 20 | 1.03 (1.03–1.03) | 0.8 | 0.95 | 20 |" in mech
    # per snapshot, the median over the trajectories still without an event (none of the 20 that grow
    # from step 4000, their onset, on)
    assert "| flash | 1 | W_Q | 1.0050 | 1.0100 | 1.0150 | 1.0000 |" in mech
    assert "| 305 | flash | 4000 | 1 |" in mech and "shows (layer 1 W_Q)" in mech
    assert "| 999 |" not in mech  # a run the summaries do not list
    # the depth the instruments show must be the pilot's
    write_pilot(tmp_path / "pilot4", chosen=(4, 3e-3))
    rc, _, err = _main(F, ["--dir", str(tmp_path / "s"), "--pilot", str(tmp_path / "pilot4")], capsys)
    assert rc == 2 and "2 attention layers, the pilot's rule chose depth 4" in err


# --------------------------------------------------------------------------- the mechanism figure

MECH_PANELS = ({f"ties:{a}" for a in ("flash", "stabilized", "delta_hp", "mxfp8_flash")} |
               {"delta:flash", "delta:mxfp8_flash"} |
               {f"{r}:{a}" for r in ("sigma", "rank1") for a in ("flash", "stabilized", "delta_hp", "mxfp8_flash",
                                                                 "mxfp8_exact")})


def _panels(fig):
    return {ax.get_label(): ax for ax in fig.axes if not ax.get_label().startswith("legend:")}


def _markers(ax):
    """{seed: (x, y)} of the excursion markers of a panel."""
    out = {}
    for ln in ax.get_lines():
        if ln.get_marker() == "x":
            assert ln.get_gid().startswith("excursion ") and len(ln.get_xdata()) == 1
            out[int(ln.get_gid().split()[1])] = (ln.get_xdata()[0], ln.get_ydata()[0])
    return out


def _line(ax, gid):
    (ln,) = [ln for ln in ax.get_lines() if ln.get_gid() == gid]
    return ln


def _mech_figure(F, d, interim=""):
    series = F.mechanism_series(F.load(str(d)), str(d))
    return series, F.mechanism_figure_build(series, interim, F.mechanism_caption(series, "CMD"))


def test_mechanism_figure_panels_excursions_and_caption(F, tmp_path, capsys):
    import matplotlib.colors as mc
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    on = ordered()  # events: flash 300-319 at 4000, stabilized 300-303 at 6000, delta_hp 300-301 at 2000,
    #                 mxfp8_flash 300-329 at 3000, mxfp8_exact 330-335 at 5000; fp32 none
    write_study(tmp_path / "s", on)
    chained = {(s, "flash") for s in range(300, 320)} | {(s, "mxfp8_flash") for s in range(300, 310)}
    write_mechanism(tmp_path / "s", chained, extra_run=999, one_frac=(0.05, 0.3))
    write_pilot(tmp_path / "pilot", chosen=(2, 3e-3))
    png = tmp_path / "mech.png"
    rc, out, err = _main(F, ["--dir", str(tmp_path / "s"), "--pilot", str(tmp_path / "pilot"), "--mechanism-figure",
                             str(png)], capsys)
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in out
    series, fig = _mech_figure(F, tmp_path / "s")
    # layer 1 has the larger mean attn_multi_one_frac: it is drawn, and the caption says so
    assert series.layer == 1 and series.layer_means == pytest.approx({0: 0.05, 1: 0.3})
    caption = fig._supxlabel.get_text()
    assert caption.startswith("CMD; commit ") and "experiments/paper/flash_study.yaml" in caption
    assert "Layer 1 in every row: the largest mean attn_multi_one_frac" in caption
    assert "40 of 40 seeds (300–339), lr 0.003, depth 2, layer 1" in fig._suptitle.get_text()
    assert "interim" not in fig._suptitle.get_text()
    panels = _panels(fig)
    assert set(panels) == MECH_PANELS  # a row per item, a panel per arm that has it
    # a marker for every trajectory with an excursion, at its onset, and for no other
    events = {"flash": (range(300, 320), 4000), "stabilized": (range(300, 304), 6000),
              "delta_hp": (range(300, 302), 2000), "mxfp8_flash": (range(300, 330), 3000),
              "mxfp8_exact": (range(330, 336), 5000)}
    for label, ax in panels.items():
        arm = label.split(":")[1]
        seeds, step = events[arm]
        marks = _markers(ax)
        assert set(marks) == set(seeds), label
        assert all(x == step for x, _ in marks.values()), label
        assert f"{arm}: 40 seeds, {len(seeds)} with an excursion" == ax.get_title()
        for ln in ax.get_lines():  # one colour per arm
            if ln.get_gid():
                assert mc.same_color(ln.get_color(), F.ARM_COLOR[arm]), label
    # item 2: one line per finished seed (not run 999), each up to its onset; its marker on its line
    delta = panels["delta:flash"]
    assert sorted(ln.get_gid() for ln in delta.get_lines() if (ln.get_gid() or "").startswith("seed ")) == \
        sorted(f"seed {s}" for s in range(300, 340))
    chained_line = _line(delta, "seed 305")
    assert list(chained_line.get_xdata()) == list(range(0, 4000, 500))
    assert chained_line.get_ydata()[-1] == pytest.approx(8 * 1.0 + 4 * 0.1)  # the running sum before step 4000
    assert _markers(delta)[305] == (4000, chained_line.get_ydata()[-1])
    assert list(_line(delta, "seed 325").get_xdata()) == list(range(0, 10000, 500))  # no event: to the end
    # item 3: the median over the trajectories without an event by then (the report's per-snapshot table)
    sigma = _line(panels["sigma:flash"], "median W_Q")
    assert list(sigma.get_xdata()) == list(range(1000, 10001, 1000))
    assert list(sigma.get_ydata()[:4]) == pytest.approx([1.005, 1.01, 1.015, 1.0])
    assert _markers(panels["sigma:flash"])[300] == (4000, pytest.approx(1.015))  # on the median, before the onset
    rank1 = _line(panels["rank1:flash"], "median W_Q")
    assert list(rank1.get_ydata()[:4]) == pytest.approx([0.5, 0.5, 0.5, 0.2])
    ties = panels["ties:stabilized"]
    assert list(_line(ties, "median attn_multi_one_frac").get_ydata()) == pytest.approx([0.3] * 20)
    assert list(_line(ties, "median attn_multi_max_frac").get_ydata()) == pytest.approx([0.2] * 20)
    # legends beside the data, never over it
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 4
    for legend in legends:
        for ax in panels.values():
            assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def test_mechanism_figure_on_an_interim_study(F, tmp_path, capsys, monkeypatch):
    """39 seeds finished, run r339 still running (its instrument and spectral rows are in the CSVs,
    its ties all in layer 1): the figure is drawn from the 39, labelled interim; markers only where
    there is an excursion (a k = 2 one counts)."""
    d = tmp_path / "s"
    write_study(d, {(301, "flash"): (40, "primary"), (302, "stabilized"): (20, "secondary")}, seeds=range(300, 339))
    with open(d / "summary_flash_study_0of1.csv", "a", newline="") as f:
        csv.DictWriter(f, fieldnames=SUMMARY).writerow({"run_id": "r339", "group": "flash", "seed": 339,
                                                        "status": "running", "file": "runs/r339.h5"})
    write_mechanism(d, set())
    with open(d / "instruments_r339.csv", "w", newline="") as f:  # unlike the rows above: ignored, not an error
        w = csv.writer(f)
        w.writerow(("run_id", "seed", "lr", "trajectory", "step", "layer") + INSTRUMENTS)
        for step in range(0, 10000, 50):
            w.writerow(["r339", 339, "0.003", "flash", step, 1, 5.0, 1.0, 1.0, 50.0, step, 1.0, 1.0, 1.0, ""])
    km, png = tmp_path / "km.png", tmp_path / "mech.png"
    rc, out, err = _main(F, ["--dir", str(d), "--pilot", str(tmp_path / "nopilot"), "--figure", str(km),
                             "--mechanism-figure", str(png)], capsys)
    assert rc == 0, err
    assert "INTERIM COUNT (39 of 40 seeds" in out and "r339 running" in out
    assert "figure: not written" in out and not km.exists()  # the Kaplan-Meier figure needs the whole study
    assert f"wrote {png}" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    series, fig = _mech_figure(F, d, interim="interim: 39 of 40 seeds")
    assert series.seeds == list(range(300, 339)) and series.layer == 0 and series.layer_means == {0: 0.1, 1: 0.1}
    assert "interim: 39 of 40 seeds" in fig._suptitle.get_text() and "39 of 40 seeds (300–339)" in fig._suptitle.get_text()
    panels = _panels(fig)
    assert set(panels) == MECH_PANELS
    for label, ax in panels.items():
        assert ax.get_title().split(":")[1].startswith(" 39 seeds"), label
        expected = {"flash": {301: 4000}, "stabilized": {302: 2000}}.get(label.split(":")[1], {})
        assert {s: x for s, (x, _) in _markers(ax).items()} == expected, label
    assert "seed 339" not in {ln.get_gid() for ln in panels["delta:flash"].get_lines()}
    # main labels it the same way; 40 seeds without a complete pilot are interim too
    drawn = []
    real_build = F.mechanism_figure_build

    def build(series, interim, *rest):
        drawn.append((interim, real_build(series, interim, *rest)))
        return drawn[-1][1]
    monkeypatch.setattr(F, "mechanism_figure_build", build)
    rc, _, _ = _main(F, ["--dir", str(d), "--pilot", str(tmp_path / "nopilot"), "--mechanism-figure", str(png)], capsys)
    assert rc == 0 and drawn[-1][0] == "interim: 39 of 40 seeds (descriptive; the study does not count yet)"
    assert "interim: 39 of 40 seeds" in drawn[-1][1]._suptitle.get_text()
    write_study(tmp_path / "all", {})
    write_mechanism(tmp_path / "all", set())
    rc, _, _ = _main(F, ["--dir", str(tmp_path / "all"), "--pilot", str(tmp_path / "nopilot"), "--mechanism-figure",
                         str(png)], capsys)
    assert rc == 0 and drawn[-1][0].startswith("interim: 40 of 40 seeds, pilot incomplete")
    # nothing finished: nothing drawn, said so
    (tmp_path / "none").mkdir()
    write_mechanism(tmp_path / "none", set())
    rc, out, _ = _main(F, ["--dir", str(tmp_path / "none"), "--pilot", str(tmp_path / "nopilot"), "--mechanism-figure",
                           str(tmp_path / "n.png")], capsys)
    assert rc == 0 and "mechanism figure: not written" in out and not (tmp_path / "n.png").exists()


def test_mechanism_figure_needs_the_instruments_and_the_spectral_csvs(F, tmp_path, capsys):
    write_study(tmp_path / "s", {})
    write_mechanism(tmp_path / "s", set())
    png = tmp_path / "mech.png"
    for present, missing in (("spectral", "instruments"), ("instruments", "spectral")):
        d = tmp_path / f"only_{present}"
        d.mkdir()
        for f in (tmp_path / "s").iterdir():
            if not f.name.startswith(missing):
                (d / f.name).write_bytes(f.read_bytes())
        rc, out, err = _main(F, ["--dir", str(d), "--pilot", str(tmp_path / "nopilot"), "--mechanism-figure", str(png)],
                             capsys)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert f"no {missing} CSV ({missing}*.csv[.gz]) in {d}" in err and err.startswith("flash_study: --mechanism-figure")
        assert not png.exists()
        rc, out, _ = _main(F, ["--dir", str(d), "--pilot", str(tmp_path / "nopilot")], capsys)  # the report alone
        assert rc == 0                                                                           # does not need them
    rc, _, err = _main(F, ["--dir", str(tmp_path / "s"), "--pilot", str(tmp_path / "nopilot"), "--mechanism-figure",
                           str(tmp_path / "no" / "m.png")], capsys)
    assert rc == 74 and "cannot write" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        F.main(["--help"])
    assert "--mechanism-figure [PNG]" in capsys.readouterr().out


def test_mechanism_figure_of_the_real_tiny_run(F, real):
    """The real extractors' columns: every panel has data, no excursion (none in 600 steps)."""
    study = F.load(str(real))
    series, fig = _mech_figure(F, real)
    assert series.seeds == [300] and series.layer in (0, 1) and set(series.layer_means) == {0, 1}
    panels = _panels(fig)
    assert set(panels) == MECH_PANELS
    expected = {a: study.events["primary"][(300, a)][0] or study.events["secondary"][(300, a)][0] for a in F.ARMS}
    for label, ax in panels.items():
        arm = label.split(":")[1]
        assert set(_markers(ax)) == ({300} if expected[arm] else set()), label
        drawn = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith(("median", "seed"))]
        assert drawn and all(len(ln.get_xdata()) > 0 for ln in drawn), label
        assert all(math.isfinite(y) for ln in drawn for y in ln.get_ydata()), label
    assert len(_line(panels["delta:flash"], "seed 300").get_xdata()) == 13  # rows every 50 steps to 600
    assert list(_line(panels["sigma:mxfp8_exact"], "median W_K").get_xdata()) == [100, 200, 300, 400, 500, 600]
    assert all(0 <= y <= 1 for y in _line(panels["rank1:flash"], "median W_Q").get_ydata())


def _section(text, head):
    """The markdown table printed after `head` in the report: its lines up to the first blank one."""
    i = text.index(head)
    body = text[text.index("\n\n", i) + 2:]
    return body[:body.index("\n\n")] if "\n\n" in body else body


def test_readme_final_report_is_the_scripts_on_the_committed_seeds(F):
    """results/README.md section 14 quotes the complete study's report on the committed CSVs verbatim:
    the counts, the primary and the secondary family, the chain (item 4) and the exploratory spikes;
    and says all 40 seeds count (the interim count is gone)."""
    import argparse
    a = argparse.Namespace(dir=os.path.join(ROOT, "results", "flash_study"),
                           pilot=os.path.join(ROOT, "results", "flash_pilot"), power_sims=10, per_trajectory=False)
    text, study, counted = F.report(a)
    assert counted and "INTERIM COUNT" not in text and len(study.seeds()) == 40
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    sec = readme[readme.index("## 14. "):readme.index("## Not done")]
    assert "**The study: all 40 seeds**" in sec and "so far**" not in sec
    assert F.markdown_counts(study) in sec
    for head in ("Primary family (k = 10", "Secondary family (k = 2", "4. The chain",
                 "Exploratory, not pre-registered: loss spikes"):
        table = _section(text, head)
        assert table.startswith("| ") and table in sec, head
    assert " ".join(F.NULL_TEXT.split(". ")[0].split()) in " ".join(sec.split())  # quoted, wrapped


def test_loss_spikes_by_hand(F, tmp_path):
    """The exploratory spikes: the first block from step 1,000 on whose max exceeds 10 x the minimum of
    every earlier block (a non-finite loss counts); earlier blocks and unfinished runs are not read."""
    d = tmp_path / "s"
    d.mkdir()
    rows = []

    def traj(rid, seed, arm, blocks):
        for i, (mn, mx, nf) in enumerate(blocks):
            rows.append([rid, seed, "0.03", arm, 100 * i, 100, mn, mx, mn, nf, mn, "", ""])

    flat = [(1.0, 1.5, 0)] * 20
    traj("r300", 300, "fp32", flat)
    traj("r300", 300, "flash", [(5.0, 100.0, 0)] + [(1.0, 1.5, 0)] * 14 + [(1.0, 10.5, 0)] + [(1.0, 1.2, 0)] * 4)
    traj("r300", 300, "stabilized", [(2.0, 3.0, 0)] * 10 + [(0.5, 4.9, 0)] + [(0.5, 5.1, 0)] + flat[:8])
    traj("r300", 300, "delta_hp", [(1.0, 1.5, 0)] * 12 + [("", "", 100)] + flat[:7])
    traj("r300", 300, "mxfp8_flash", [(1.0, 50.0, 0)] * 10 + flat[:10])  # spikes only before step 1,000
    traj("r999", 301, "fp32", [(1.0, 100.0, 0)] * 20)                    # not finished: not read
    with open(d / "blocks_flash_study_0of1.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(BLOCKS)
        w.writerows(rows)
    spikes = F.loss_spikes(str(d), {300: "r300"})
    assert spikes == {(300, "fp32"): None, (300, "flash"): 1500, (300, "stabilized"): 1100,
                      (300, "delta_hp"): 1200, (300, "mxfp8_flash"): None}
    table = F.markdown_spikes(spikes, [300])
    assert "| flash | 1 | 1 | 300 (1500) |" in table and "| fp32 | 1 | 0 | – |" in table
    assert "| mxfp8_exact | 0 | 0 | – |" in table
