"""E2 of the causal study (results/prereg/why_mx.md, "E2 - the state or the dynamics?"): the branch
endpoint on the joined series in the binary (`mxlab summarize --csv`: at_risk,
branch_excursion_step, control_excursion_step, ...), in Python from the run file's losses
(stats_util.branch_endpoint) and from the loss blocks (why_mx.endpoint_from_blocks), all three
agreeing on a tiny E2 run made by the binary through experiments/paper/run_why_mx.sh (a stand-in
nvidia-smi, the CPU binary behind a wrapper that drops --gpus); the branch points extractor; and
`why_mx.py e2` (exact McNemar, conditional odds ratio with its exact interval, Holm over m = 2,
the verdicts) on synthetic committed-format CSVs, its numbers by hand and against scipy and
statsmodels."""
import csv
import glob
import math
import os
import random
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT, load_results_script, run_device_script

sys.path.insert(0, os.path.join(ROOT, "results"))
import stats_util as su  # noqa: E402

# E2 in miniature: FP32 and mx_all, branches of 120 steps at 100 and 200 from both parents (the
# crossover pair of each branch point), curvature every 50 steps, the parents' snapshots with
# Adam's m and v at the branch points. lr high enough for excursions under small rules.
TINY = """name: e2_tiny
seed: 1
steps: 320
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2, activation: gelu, fc2_bias: false}
data: {batch: 32}
optimizer: {name: adam, lr: 0.08}
precision: {weight: mxfp4_e2m1, activation: mxfp4_e2m1, grad: mxfp4_e2m1, ln_affine: mxfp8_e4m3, scale_rule: floor}
log: {log_every: 20, curvature_every: 50, curvature_iters: 4, probe_batch: 32, snapshot_optimizer: true, progress: false}
arms:
  - {name: mx_all}
interventions:
  - {name: fp32_from_mx_100, at: 100, steps: 120, from: mx_all, apply: snap_gamma+to_fp32}
  - {name: mx_from_fp32_100, at: 100, steps: 120, from: fp32}
  - {name: fp32_from_mx_200, at: 200, steps: 120, from: mx_all, apply: snap_gamma+to_fp32}
  - {name: mx_from_fp32_200, at: 200, steps: 120, from: fp32}
sweep:
  seeds: [1, 2, 3]
"""
BRANCH_STEPS = 120
# (factor, window, block): rules with events, censoring and pairs not at risk
RULES = [(1.3, 20, 10), (1.1, 20, 10), (2.0, 10, 10), (0.5, 20, 10), (1.5, 30, 10)]


@pytest.fixture(scope="module")
def W():
    return load_results_script("why_mx")


@pytest.fixture(scope="module")
def pipeline(binary, tmp_path_factory):
    """(OUT, runs dir) of `run_why_mx.sh OUT 200 e2_tiny=0/1` run in a scratch tree."""
    root = tmp_path_factory.mktemp("why_mx_device")
    out, log = run_device_script(binary, root, {"e2_tiny": TINY}, ["e2_tiny=0/1"])
    return out, str(root / "runs" / "e2_tiny_0of1"), log


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_run_why_mx_brings_back_what_e2_needs(W, pipeline):
    out, runs, log = pipeline
    tag = "e2_tiny_0of1"
    assert sorted(os.listdir(out)) == sorted([f"summary_{tag}.csv", f"blocks_{tag}.csv", f"branchpoints_{tag}.csv",
                                              "logs.tgz"]), log
    summary = read_csv(os.path.join(out, f"summary_{tag}.csv"))
    branches = [r for r in summary if r["at"]]
    assert len(summary) == 3 * 6 and len(branches) == 3 * 4
    for r in branches:
        assert r["parent"] == ("mx_all" if r["group"].startswith("fp32_from_mx") else "fp32")
        # the default rule (W = 500) on branches of 120 steps: an empty window, censored at `at`
        assert (r["at_risk"], r["branch_excursion_step"], r["branch_censored_at"]) == ("1", "-1", r["at"])
    for r in summary:
        if not r["at"]:
            assert all(r[c] == "" for c in W.E2_COLUMNS)
    # the loss blocks hold the branches, from their `at`
    blocks = read_csv(os.path.join(out, f"blocks_{tag}.csv"))
    starts = {}
    for b in blocks:
        starts.setdefault((b["seed"], b["trajectory"]), []).append(int(b["block_start"]))
    assert min(starts[("1", "mx_from_fp32_200")]) == 200 and min(starts[("1", "fp32")]) == 0
    assert len(starts) == 3 * 6
    # the E2 analysis reads the directory as it comes back
    ends = W.load_e2(out, horizon=BRANCH_STEPS - 500)
    assert len(ends) == 12 and all(e["window_end"] == e["at"] for e in ends.values())
    assert W.main(["e2", "--dir", out]) == 0
    # the branch points: one row per branch, the parents' curvature and Adam v there
    bp = read_csv(os.path.join(out, f"branchpoints_{tag}.csv"))
    assert len(bp) == 12
    assert all(r["parent_hessian_lmax"] and r["parent_precond_lmax"] and r["branch_hessian_lmax"] and r["v_median"]
               for r in bp)


def test_the_endpoint_agrees_between_the_binary_the_losses_and_the_blocks(W, binary, pipeline, tmp_path):
    """Under rules with events: `mxlab summarize --csv`'s branch columns = stats_util.branch_endpoint
    of the run files' loss_all = why_mx.load_e2 from extract_loss_blocks.py's blocks (which checks
    itself against the summary), and the endpoint is not the branch's own excursion everywhere."""
    _, runs, _ = pipeline
    files = sorted(glob.glob(os.path.join(runs, "*.h5")))
    losses, meta = {}, {}
    for p in files:
        with h5py.File(p, "r") as f:
            rid = f.attrs["run_id"]
            rid = rid.decode() if isinstance(rid, bytes) else str(rid)
            for kind in ("trajectories", "branches"):
                for name, g in f[kind].items():
                    losses[(rid, name)] = np.asarray(g["loss_all"][()], dtype=np.float32)
                    if kind == "branches":
                        frm = g.attrs["from"]
                        # end_step: written when the branch stops before the run's end (320)
                        meta[(rid, name)] = (int(g.attrs["at"]), int(g.attrs.get("end_step", f.attrs["steps"])),
                                             frm.decode() if isinstance(frm, bytes) else str(frm))
    blocks_extract = load_results_script("extract_loss_blocks")
    seen = {"branch_event": 0, "censored": 0, "control_event": 0, "not_at_risk": 0, "joined_only": 0}
    for factor, window, block in RULES:
        d = tmp_path / f"rule_{factor}_{window}"
        d.mkdir()
        r = subprocess.run([binary, "summarize", runs, "--csv", "--no-index", "--excursion-factor", repr(factor),
                            "--excursion-window", str(window), "--excursion-block", str(block)],
                           check=True, capture_output=True, text=True)
        (d / "summary_x.csv").write_text(r.stdout)
        assert blocks_extract.main([str(d / "blocks_x.csv"), str(block)] + files) == 0
        from_blocks = W.load_e2(str(d), factor, window, block, horizon=BRANCH_STEPS - window)
        for row in csv.DictReader(r.stdout.splitlines()):
            if not row["at"]:
                continue
            key = (row["run_id"], row["group"])
            at, end, parent = meta[key]
            assert row["parent"] == parent
            py = su.branch_endpoint(losses[(row["run_id"], parent)], losses[key], at, end, factor, window, block)
            assert W._binary_endpoint(row) == (py["at_risk"], py["branch"], py["control"]), (row, py)
            mine = from_blocks[(int(row["seed"]), row["group"])]
            assert (mine["at_risk"], mine["branch"], mine["control"]) == (py["at_risk"], py["branch"], py["control"])
            own = su.excursion_step(losses[key], factor, window, block, at)
            seen["branch_event"] += py["branch"][0]
            seen["censored"] += not py["branch"][0]
            seen["control_event"] += py["control"][0]
            seen["not_at_risk"] += not py["at_risk"]
            seen["joined_only"] += py["branch"][0] and not own[0]
    assert all(v > 0 for v in seen.values()), seen


def test_branchpoints_are_the_run_files_values(pipeline):
    out, runs, _ = pipeline
    rows = {(r["run_id"], r["branch"]): r for r in read_csv(glob.glob(os.path.join(out, "branchpoints_*.csv"))[0])}
    p = sorted(glob.glob(os.path.join(runs, "*.h5")))[0]
    with h5py.File(p, "r") as f:
        rid = f.attrs["run_id"]
        rid = rid.decode() if isinstance(rid, bytes) else str(rid)
        r = rows[(rid, "fp32_from_mx_200")]
        assert (r["parent"], r["at"]) == ("mx_all", "200")
        g = f["trajectories/mx_all"]
        i = list(g["curvature_step"][:]).index(200)
        assert float(r["parent_hessian_lmax"]) == float(g["hessian_lmax"][i])
        assert float(r["parent_precond_lmax"]) == float(g["precond_lmax"][i])
        b = f["branches/fp32_from_mx_200"]
        assert float(r["branch_hessian_lmax"]) == float(b["hessian_lmax"][list(b["curvature_step"][:]).index(200)])
        vg = f["snapshots/mx_all/step_200/v"]
        v = np.concatenate([np.asarray(vg[k][()], dtype=np.float64).ravel() for k in vg])
        assert int(r["v_count"]) == v.size
        assert float(r["v_median"]) == np.median(v) and float(r["v_q99"]) == np.quantile(v, 0.99)
        assert float(r["v_max"]) == v.max()
        # a branch from FP32 starts from the FP32 state: its curvature at `at` is its parent's
        m = rows[(rid, "mx_from_fp32_200")]
        assert m["parent"] == "fp32" and m["branch_hessian_lmax"] == m["parent_hessian_lmax"]


def test_branchpoints_without_branches_writes_nothing(tmp_path, capsys):
    import make_fixtures as F
    mod = load_results_script("extract_branchpoints")
    p = F.write_run(str(tmp_path / "a.h5"), steps=100, seed=1)
    assert mod.main([str(tmp_path / "bp.csv"), p]) == 0
    assert not (tmp_path / "bp.csv").exists() and "no branch" in capsys.readouterr().out


# --------------------------------------------------------------------------- blocks vs losses

def _traj(loss, first, block):
    """A trajectory as reanalysis_excursion.read_blocks gives it, from per-step losses."""
    ex = load_results_script("extract_loss_blocks")
    bs = ex.blocks(np.asarray(loss, dtype=np.float32), block)
    last = bs[-1][6] if bs else math.nan
    return {"run_id": "r", "first": first, "mins": [m if m == m else math.inf for _, _, m, *_ in bs],
            "steps_run": len(loss), "absorbing": not math.isfinite(last), "partial": bool(bs) and bs[-1][1] != block}


def test_endpoint_from_blocks_is_branch_endpoint_over_random_series(W):
    """On random parents and branches (excursions, non-finite ends, branches cut short), the block
    version of the endpoint equals stats_util.branch_endpoint of the per-step series."""
    rng = random.Random(11)
    block, window, factor = 10, 30, 5.0
    outcomes = set()
    for _ in range(300):
        n_parent, at = 400, rng.choice([100, 150, 200])
        planned = rng.choice([120, 200])

        def series(n):
            s = [math.exp(-2.0 * i / n) * rng.uniform(1, 1.2) for i in range(n)]
            for _ in range(rng.randint(0, 2)):
                a, ln = rng.randrange(n), rng.choice([15, 40, 120])
                h = rng.choice([3.0, 8.0, 50.0])
                for i in range(a, min(n, a + ln)):
                    s[i] *= h
            return s

        parent = series(n_parent)
        branch = series(planned)
        if rng.random() < 0.25:  # stopped on a NaN
            branch = branch[:rng.randint(1, planned - 1)] + [math.nan]
        elif rng.random() < 0.2:  # a run interrupted
            branch = branch[:rng.randint(1, planned)]
        if rng.random() < 0.1:
            parent = parent[:rng.randint(at, n_parent - 1)] + [math.nan]
        py = su.branch_endpoint(parent, branch, at, at + planned, factor, window, block)
        got = W.endpoint_from_blocks(_traj(parent, 0, block), _traj(branch, at, block), at, planned - window,
                                     factor, window, block)
        assert got == py, (at, planned, got, py)
        outcomes.add((py["at_risk"], py["branch"][0], py["control"][0]))
    assert len(outcomes) >= 6  # events, censoring and pairs out of risk, in combination


# --------------------------------------------------------------------------- the statistics

def test_mcnemar_odds_ratio_and_holm_by_hand_and_against_scipy_statsmodels():
    from scipy.stats import beta
    from statsmodels.stats.contingency_tables import mcnemar
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.proportion import proportion_confint
    # by hand: 10 vs 2 discordant: p = 2 (1 + 12 + 66) / 2^12
    assert su.mcnemar_exact(10, 2) == pytest.approx(2 * 79 / 4096, rel=1e-15)
    # 0 vs 5: OR 0, upper bound from p_hi = 1 - 0.025^(1/5)
    q = 0.025 ** 0.2
    assert su.conditional_odds_ratio(0, 5) == pytest.approx((0.0, 0.0, (1 - q) / q), rel=1e-12)
    # 4 vs 0: OR inf, lower bound from p_lo = 0.025^(1/4)
    lo = 0.025 ** 0.25
    odds, l, h = su.conditional_odds_ratio(4, 0)
    assert odds == math.inf and h == math.inf and l == pytest.approx(lo / (1 - lo), rel=1e-12)
    assert all(math.isnan(x) for x in su.conditional_odds_ratio(0, 0))
    for b, c in [(1, 8), (10, 20), (35, 3), (0, 12), (7, 7), (60, 45)]:
        p = mcnemar([[0, b], [c, 0]], exact=True).pvalue
        assert su.mcnemar_exact(b, c) == pytest.approx(min(1.0, p), rel=1e-12)
        n = b + c
        lo_b = beta.ppf(0.025, b, c + 1) if b else 0.0
        hi_b = beta.ppf(0.975, b + 1, c) if c else 1.0
        assert su.clopper_pearson(b, n) == pytest.approx((lo_b, hi_b), rel=1e-9, abs=1e-14)
        assert su.clopper_pearson(b, n) == pytest.approx(proportion_confint(b, n, method="beta"), rel=1e-9, abs=1e-14)
    ps = [0.039, 0.0004, 0.2]
    assert su.holm(ps) == pytest.approx(list(multipletests(ps, method="holm")[1]), rel=1e-15)


# --------------------------------------------------------------------------- the family, synthetic

BASE, HIGH, BRANCH_LOW, BRANCH_HIGH = 0.01, 1.0, 0.01, 0.5


def write_study(d, parent_event, branch_event, seeds=None, points=(4000, 8000, 12000), drop=()):
    """Blocks and summary CSVs of a synthetic E2 in the committed format (run_why_mx.sh's), 100-step
    blocks: each parent 1.0 in block 0, then 0.01, and 1.0 for 5 blocks from its event step
    (parent_event[(seed, parent)]); each branch (2,500 steps from b) at 0.01, or at 0.5 from b when
    branch_event[(seed, kind, b)] (an excursion only on the joined series: 0.5 is not above 10 x its
    own minimum). The summary's endpoint columns are stats_util.branch_endpoint's."""
    seeds = seeds if seeds is not None else list(range(200, 240))
    bw = csv.writer(open(d / "blocks_why_mx_e2_0of1.csv", "w", newline=""))
    bw.writerow(["run_id", "seed", "lr", "trajectory", "block_start", "steps", "min", "max", "mean", "nonfinite", "last"])
    sw = csv.writer(open(d / "summary_why_mx_e2_0of1.csv", "w", newline=""))
    sw.writerow(["run_id", "group", "at", "seed", "status", "excursion_step", "excursion_censored_at"] +
                list(W_COLUMNS))

    def emit(rid, seed, name, first, mins):
        for i, m in enumerate(mins):
            bw.writerow([rid, seed, "0.0005", name, first + 100 * i, 100, m, m, m, 0, m])

    for seed in seeds:
        rid = f"r{seed}"
        parents = {}
        for parent in ("fp32", "mx_all"):
            mins = [HIGH] + [BASE] * 199
            t = parent_event.get((seed, parent))
            if t is not None:
                for i in range(t // 100, t // 100 + 5):
                    mins[i] = HIGH
            emit(rid, seed, parent, 0, mins)
            parents[parent] = [x for m in mins for x in [m] * 100]
            ev = su.excursion_step(parents[parent])
            sw.writerow([rid, parent, "", seed, "complete", ev[1] if ev[0] else -1, -1 if ev[0] else ev[1]] + [""] * 6)
        for b in points:
            for kind, parent in (("fp32_from_mx", "mx_all"), ("mx_from_fp32", "fp32")):
                name = f"{kind}_{b}"
                if (seed, name) in drop:
                    continue
                mins = [BRANCH_HIGH if branch_event.get((seed, kind, b)) else BRANCH_LOW] * 25
                emit(rid, seed, name, b, mins)
                loss = [x for m in mins for x in [m] * 100]
                e = su.branch_endpoint(parents[parent], loss, b, b + 2500)
                own = su.excursion_step(loss, first_step=b)
                sw.writerow([rid, name, b, seed, "complete", own[1] if own[0] else -1, -1 if own[0] else own[1],
                             parent, int(e["at_risk"]),
                             e["branch"][1] if e["branch"][0] else -1, -1 if e["branch"][0] else e["branch"][1],
                             e["control"][1] if e["control"][0] else -1, -1 if e["control"][0] else e["control"][1]])


W_COLUMNS = ("parent", "at_risk", "branch_excursion_step", "branch_censored_at", "control_excursion_step",
             "control_censored_at")


def scenario_a():
    """State: mx_all has an excursion at 3000 in seeds 200-219 (their 60 pairs not at risk); at
    12500 in seeds 220-229 (control events at b = 12000); fp32_from_mx has events at 12000 in
    seeds 220-221 (concordant) and at 4000 in seed 230: only branch 1, only control 8.
    Dynamics: fp32 has an excursion at 2000 in seeds 200-204 (15 pairs out), at 12500 in seeds
    235-239; mx_from_fp32 has events at 4000 in seeds 205-234, at 8000 in 205-209, at 12000 in
    235-236: only branch 35, only control 3."""
    pe, be = {}, {}
    for s in range(200, 220):
        pe[(s, "mx_all")] = 3000
    for s in range(220, 230):
        pe[(s, "mx_all")] = 12500
    for s in (220, 221):
        be[(s, "fp32_from_mx", 12000)] = True
    be[(230, "fp32_from_mx", 4000)] = True
    for s in range(200, 205):
        pe[(s, "fp32")] = 2000
    for s in range(235, 240):
        pe[(s, "fp32")] = 12500
    for s in range(205, 235):
        be[(s, "mx_from_fp32", 4000)] = True
    for s in range(205, 210):
        be[(s, "mx_from_fp32", 8000)] = True
    for s in (235, 236):
        be[(s, "mx_from_fp32", 12000)] = True
    return pe, be


def test_the_family_by_hand(W, tmp_path):
    write_study(tmp_path, *scenario_a())
    ends = W.load_e2(str(tmp_path))
    assert len(ends) == 240
    # the joined series makes the branches' events: on its own a branch at 0.5 has none
    res = {h: (kind, ctl, r, q, v) for h, kind, ctl, r, q, v in W.e2_family(ends)}
    _, _, state, q_state, v_state = res["State"]
    assert (state["pairs"], state["at_risk"], state["branch"], state["control"]) == (120, 60, 3, 10)
    assert (state["only_branch"], state["only_control"]) == (1, 8)
    assert state["p"] == pytest.approx(2 * (1 + 9) / 2 ** 9, rel=1e-15)
    assert state["or"] == 1 / 8
    from scipy.stats import beta
    lo, hi = beta.ppf(0.025, 1, 9), beta.ppf(0.975, 2, 8)
    assert (state["lo"], state["hi"]) == pytest.approx((lo / (1 - lo), hi / (1 - hi)), rel=1e-9)
    _, _, dyn, q_dyn, v_dyn = res["Dynamics"]
    assert (dyn["pairs"], dyn["at_risk"], dyn["branch"], dyn["control"]) == (120, 105, 37, 5)
    assert (dyn["only_branch"], dyn["only_control"]) == (35, 3)
    p_dyn = 2 * sum(math.comb(38, i) for i in range(4)) / 2 ** 38
    assert dyn["p"] == pytest.approx(p_dyn, rel=1e-12)
    # Holm over m = 2: the smaller p doubled, the larger kept (not below it)
    assert q_dyn == pytest.approx(2 * p_dyn, rel=1e-12) and q_state == pytest.approx(state["p"], rel=1e-15)
    # State: significantly fewer (Holm p 0.039) but the upper bound 0.93 is not < 0.5: undecided;
    # Dynamics: significantly more: supported
    assert state["hi"] > 0.5 and q_state < 0.05 and v_state == "undecided"
    assert v_dyn == "supported"


def test_the_verdicts_falsified(W, tmp_path):
    """State: only control 12 (mx_all at 12500 in seeds 200-211), OR 0 with upper bound
    (1 - 0.025^(1/12)) / 0.025^(1/12) = 0.36 < 0.5 and Holm p < 0.05: falsified. Dynamics: only
    branch 10 (seeds 230-239 at 4000), only control 20 (fp32 at 12500 in seeds 200-219): OR 0.5,
    upper bound 1.12 < 2: falsified (not significant)."""
    pe, be = {}, {}
    for s in range(200, 212):
        pe[(s, "mx_all")] = 12500
    for s in range(200, 220):
        pe[(s, "fp32")] = 12500
    for s in range(230, 240):
        be[(s, "mx_from_fp32", 4000)] = True
    write_study(tmp_path, pe, be)
    res = {h: (r, q, v) for h, _, _, r, q, v in W.e2_family(W.load_e2(str(tmp_path)))}
    state, q_state, v_state = res["State"]
    k = 0.025 ** (1 / 12)
    assert (state["only_branch"], state["only_control"], state["or"]) == (0, 12, 0.0)
    assert state["hi"] == pytest.approx((1 - k) / k, rel=1e-12) and state["hi"] < 0.5
    assert q_state < 0.05 and v_state == "falsified"
    dyn, q_dyn, v_dyn = res["Dynamics"]
    assert (dyn["only_branch"], dyn["only_control"], dyn["or"]) == (10, 20, 0.5)
    assert dyn["p"] == pytest.approx(2 * sum(math.comb(30, i) for i in range(11)) / 2 ** 30, rel=1e-12)
    assert dyn["hi"] < 2 and q_dyn > 0.05 and v_dyn == "falsified"
    # the rule's other branches, on rows made up for it
    row = {"or": 1.5, "hi": 1.9}
    assert W.e2_verdict("Dynamics", row, 0.01, 2.0).startswith("mixed")
    assert W.e2_verdict("Dynamics", {"or": 3.0, "hi": 9.0}, 0.2, 2.0) == "undecided"
    assert W.e2_verdict("Dynamics", {"or": math.nan, "hi": math.nan}, 1.0, 2.0) == "undecided"
    assert W.e2_verdict("State", {"or": 0.1, "hi": 0.4}, 0.06, 0.5) == "undecided"
    assert W.e2_verdict("State", {"or": 3.0, "hi": 0.4}, 0.01, 0.5) == "undecided"


def test_main_prints_the_table_and_refuses_bad_data(W, tmp_path, capsys):
    write_study(tmp_path, *scenario_a())
    assert W.main(["e2", "--dir", str(tmp_path), "--e1", str(tmp_path / "no_e1")]) == 0
    text = capsys.readouterr().out
    assert "| State | fp32_from_mx vs mx_all | 60 | 3 / 10 | 1 / 8 |" in text
    assert "| Dynamics | mx_from_fp32 vs fp32 | 105 | 37 / 5 | 35 / 3 |" in text
    assert "| undecided |" in text and "| supported |" in text
    # the binary disagrees on one pair: refused
    path = tmp_path / "summary_why_mx_e2_0of1.csv"
    good = path.read_text()
    path.write_text(good.replace("r230,fp32_from_mx_4000,4000,230,complete,-1,6000,mx_all,1,4000,-1,",
                                 "r230,fp32_from_mx_4000,4000,230,complete,-1,6000,mx_all,1,-1,6000,"))
    assert path.read_text() != good
    assert W.main(["e2", "--dir", str(tmp_path), "--e1", str(tmp_path / "no_e1")]) == 2
    assert "binary" in capsys.readouterr().err
    # a summary written without the endpoint columns
    path.write_text("\n".join(",".join(line.split(",")[:7]) for line in good.splitlines()) + "\n")
    assert W.main(["e2", "--dir", str(tmp_path), "--e1", str(tmp_path / "no_e1")]) == 2
    assert "no column parent" in capsys.readouterr().err


def test_the_pairing_check_against_e1(W, tmp_path, capsys):
    """E2's fp32 and mx_all must be E1's trajectories of the same seeds, block for block."""
    d, e1 = tmp_path / "e2", tmp_path / "e1"
    d.mkdir()
    e1.mkdir()
    write_study(d, *scenario_a(), seeds=[200, 201, 230])
    rows = read_csv(d / "blocks_why_mx_e2_0of1.csv")
    keep = [r for r in rows if r["trajectory"] in ("fp32", "mx_all") and r["seed"] != "230"]
    keep += [dict(r, seed="231", run_id="r231") for r in rows if r["trajectory"] == "fp32" and r["seed"] == "230"]

    def write(rs):
        with open(e1 / "blocks_why_mx_e1_0of20.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rs)

    write(keep)
    assert W.pairing_check(str(d), str(e1)) == 4  # seeds 200, 201: fp32 and mx_all; 231 is not in E2
    assert W.main(["e2", "--dir", str(d), "--e1", str(e1)]) == 0
    assert "equal E1's block for block on all 4" in capsys.readouterr().out
    keep[3] = dict(keep[3], min="0.02")
    write(keep)
    with pytest.raises(W.StudyError, match="differ from E1's"):
        W.pairing_check(str(d), str(e1))
    assert W.main(["e2", "--dir", str(d), "--e1", str(e1)]) == 2


def test_incomplete_data_gives_progress_only(W, tmp_path, capsys):
    pe, be = scenario_a()
    write_study(tmp_path, pe, be, seeds=list(range(200, 210)), drop={(205, "mx_from_fp32_8000")})
    ends = W.load_e2(str(tmp_path))
    with pytest.raises(W.StudyError, match="200-239"):
        W.e2_family(ends)
    assert W.main(["e2", "--dir", str(tmp_path), "--e1", str(tmp_path / "no_e1")]) == 0
    text = capsys.readouterr().out
    assert "not run until all 40 seeds" in text
    assert "| mx_from_fp32 (fp32) | 8000 | 9 | 4 | 4 / 0 | 4 / 0 |" in text
    # a branch that is none of E2's is an error, not silently left out
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    write_study(tmp_path, {}, {}, seeds=[200], points=(4000,))
    path = tmp_path / "summary_why_mx_e2_0of1.csv"
    path.write_text(path.read_text().replace("fp32_from_mx_4000,4000", "fp32_from_mx_4100,4000"))
    blocks = tmp_path / "blocks_why_mx_e2_0of1.csv"
    blocks.write_text(blocks.read_text().replace("fp32_from_mx_4000", "fp32_from_mx_4100"))
    with pytest.raises(W.StudyError, match="none of E2"):
        W.e2_pairs(W.load_e2(str(tmp_path)))


def test_e2_family_on_the_committed_40_seeds(W):
    """E2's confirmatory family as results/README.md section 13 reports it (pre-registered: run once,
    on all 40 seeds), the progress and branch-point tables verbatim, and the pairing check."""
    d = os.path.join(ROOT, "results", "why_mx", "e2")
    ends = W.load_e2(d)
    assert sorted({s for s, _ in ends}) == W.SEEDS
    assert W.pairing_check(d, os.path.join(ROOT, "results", "why_mx", "e1")) == 80
    res = W.e2_family(ends)
    by = {h: (r, q, v) for h, _, _, r, q, v in res}
    r, q, v = by["Dynamics"]
    assert v == "supported" and (r["at_risk"], r["only_branch"], r["only_control"]) == (119, 47, 1)
    assert q == pytest.approx(6.96e-13, rel=1e-2) and r["lo"] == pytest.approx(8.03, rel=1e-2)
    r, q, v = by["State"]
    # significantly fewer events after the switch to FP32, but the odds ratio's upper bound (0.563)
    # misses the pre-registered 0.5: not falsified
    assert v == "undecided" and (r["at_risk"], r["only_branch"], r["only_control"]) == (86, 1, 12)
    assert q == pytest.approx(0.00342, rel=1e-2) and 0.5 < r["hi"] < 0.6
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    for table in (W.markdown_e2_progress(ends), W.markdown_e2_family(res), W.markdown_branchpoints(W.branchpoints(d))):
        assert table in readme, "section 13's E2 tables are not what results/why_mx.py e2 prints"
