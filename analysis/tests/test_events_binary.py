"""The events of `mxlab summarize --csv` (excursion_step, first_spike_step, spike_count,
tail_log_ratio) and of the run file's summary attributes against their Python twins in
results/stats_util.py, on runs made by the binary; and the permutation log-rank of
`mxlab summarize --by arm --compare` against stats_util.permutation_log_rank. Needs MXLAB_BINARY
(scripts/test.sh sets it)."""

import csv
import io
import math
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "results"))

import stats_util as su  # noqa: E402

# A small, unstable model at a high learning rate, two MX arms, three seeds, a branch from an arm
# at step 60 (its own first step), losses that keep going after a NaN, and spikes at a low factor.
YAML = """name: events
seed: 1
steps: 240
device: cpu
model: {depth: 2, width: 32, hidden_mult: 2, activation: gelu, fc2_bias: false}
data: {batch: 32}
optimizer: {name: adam, lr: 0.08}
precision: {weight: mxfp4_e2m1, activation: mxfp4_e2m1, grad: mxfp4_e2m1, ln_affine: mxfp8_e4m3, scale_rule: floor}
log: {log_every: 20, spike_factor: 1.05, on_nonfinite: continue}
arms:
  - {name: fp4}
  - {name: e4m3, set: {weight: mxfp8_e4m3, activation: mxfp8_e4m3, grad: mxfp8_e4m3}}
interventions:
  - {name: to32, at: 60, apply: to_fp32, from: fp4}
sweep:
  seeds: [1, 2, 3]
"""
# (factor, window, block): some rules give events, some censor.
RULES = [(10.0, 500, 100), (1.3, 10, 5), (1.1, 20, 10), (1.05, 6, 3), (2.0, 4, 4)]
TAIL = 50


@pytest.fixture(scope="module")
def runs(binary, tmp_path_factory):
    d = tmp_path_factory.mktemp("event_runs")
    (d / "e.yaml").write_text(YAML)
    out = d / "runs"
    subprocess.run([binary, "run", str(d / "e.yaml"), "--out", str(out), "--quiet"], check=True,
                   capture_output=True)
    return str(out)


def summarize(binary, runs, *args):
    r = subprocess.run([binary, "summarize", runs, "--csv", "--no-index", *args], check=True,
                       capture_output=True, text=True)
    return list(csv.DictReader(io.StringIO(r.stdout)))


def histories(runs):
    """{(run_id, group): (first_step, loss_all, attrs)} of every run file."""
    out = {}
    for name in sorted(os.listdir(runs)):
        if not name.endswith(".h5"):
            continue
        with h5py.File(os.path.join(runs, name), "r") as f:
            rid = f.attrs["run_id"]
            rid = rid.decode() if isinstance(rid, bytes) else str(rid)
            for kind in ("trajectories", "branches"):
                for g, grp in f.get(kind, {}).items():
                    first = int(grp.attrs.get("at", 0)) if kind == "branches" else 0
                    out[(rid, g)] = (first, np.asarray(grp["loss_all"][()], dtype=np.float32), dict(grp.attrs))
    return out


def python_row(h, rid, group, rule, tail, spike_factor=1.05):
    first, loss, _ = h[(rid, group)]
    factor, window, block = rule
    event, step = su.excursion_step(loss, factor, window, block, first)
    f_first, f_loss, _ = h[(rid, "fp32")]
    ratio = math.nan if group == "fp32" else su.tail_log_ratio(loss, f_loss, tail, first, f_first)
    spikes = su.spike_steps(loss, np.float32(spike_factor).item(), first)
    return event, step, (spikes[0] if spikes else -1), len(spikes), ratio


def cell_float(text):
    return math.nan if text == "" else float(text)


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("rule", RULES)
def test_summarize_csv_agrees_with_python(binary, runs, rule):
    h = histories(runs)
    factor, window, block = rule
    rows = summarize(binary, runs, "--excursion-factor", repr(factor), "--excursion-window", str(window),
                     "--excursion-block", str(block), "--tail-steps", str(TAIL))
    assert len(rows) == 3 * 4  # fp32, two arms, one branch per run
    for row in rows:
        event, step, first_spike, spikes, ratio = python_row(h, row["run_id"], row["group"], rule, TAIL)
        cpp_event = int(row["excursion_step"]) >= 0
        assert cpp_event == event, row
        assert int(row["excursion_step"] if event else row["excursion_censored_at"]) == step, row
        assert int(row["excursion_censored_at" if event else "excursion_step"]) == -1, row
        assert int(row["first_spike_step"]) == first_spike, row
        assert int(row["spike_count"]) == spikes, row
        assert same(cell_float(row["tail_log_ratio"]), ratio), (row, ratio)



def test_rules_give_events_and_censoring(binary, runs):
    """The agreement above is not vacuous: across the rules both events and censoring occur, at
    several steps, and spikes occur."""
    h = histories(runs)
    events, censored, steps = 0, 0, set()
    for rule in RULES:
        for (rid, g) in h:
            event, step, first_spike, _, _ = python_row(h, rid, g, rule, TAIL)
            events += event
            censored += not event
            steps.add(step)
    assert events >= 10 and censored >= 10 and len(steps) >= 5
    assert any(python_row(h, rid, g, RULES[0], TAIL)[2] >= 0 for (rid, g) in h)


def test_summary_attributes_agree_with_python_defaults(binary, runs):
    """The run file's summary attributes (default rule, tail of 2000 steps) and the default
    `mxlab summarize` columns are the Python twins' values."""
    h = histories(runs)
    rows = {(r["run_id"], r["group"]): r for r in summarize(binary, runs)}
    for (rid, g), (first, loss, attrs) in h.items():
        event, step, first_spike, spikes, ratio = python_row(h, rid, g, (10.0, 500, 100), 2000)
        assert attrs["excursion_step"] == (step if event else -1)
        assert attrs["excursion_censored_at"] == (-1 if event else step)
        assert attrs["first_spike_step"] == first_spike
        assert attrs["spike_count"] == spikes
        if g == "fp32":
            assert "tail_log_ratio" not in attrs
        else:
            assert same(float(attrs["tail_log_ratio"]), ratio)
        row = rows[(rid, g)]
        assert int(row["excursion_step"]) == attrs["excursion_step"]
        assert same(cell_float(row["tail_log_ratio"]), ratio)


def test_permutation_log_rank_agrees_with_python(binary, runs):
    """`--by arm --compare`: each pair's stratified log-rank and permutation p equal
    stats_util.permutation_log_rank over the seed strata (one run per seed)."""
    h = histories(runs)
    rule = (1.1, 20, 10)
    r = subprocess.run([binary, "summarize", runs, "--csv", "--no-index", "--by", "arm", "--compare",
                        "--excursion-factor", "1.1", "--excursion-window", "20", "--excursion-block", "10"],
                       check=True, capture_output=True, text=True)
    pairs = list(csv.DictReader(io.StringIO(r.stdout.split("\n\n")[1])))
    assert len(pairs) == 3  # fp32, fp4, e4m3 (branches left out without --branches)
    rids = sorted({rid for rid, _ in h})
    checked = 0
    for p in pairs:
        a, b = p["a_arm"], p["b_arm"]
        strata = []
        for rid in rids:
            ea, sa = su.excursion_step(h[(rid, a)][1], *rule, h[(rid, a)][0])
            eb, sb = su.excursion_step(h[(rid, b)][1], *rule, h[(rid, b)][0])
            strata.append([(sa, ea, True), (sb, eb, False)])
        py = su.permutation_log_rank(strata)
        assert int(p["strata"]) == py["strata"]
        assert same(cell_float(p["stratified_u"]) if py["strata"] else math.nan,
                    py["u"] if py["strata"] else math.nan)
        assert same(cell_float(p["stratified_chi2"]), py["chi2"])
        assert same(cell_float(p["permutation_p"]), py["p"])
        assert int(p["permutation_labelings"]) == py["labelings"]
        checked += py["strata"] > 0
    assert checked >= 1
