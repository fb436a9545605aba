"""results/stats_util.py's trajectory events (excursion_step, spike_steps, tail_log_ratio, and the
windowed excursion_between and branch_endpoint of E2) on hand-worked series, and the excursion's
truncation property over random series."""

import math
import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "results"))

from stats_util import (branch_endpoint, excursion_between, excursion_block, excursion_step,  # noqa: E402
                        first_spike_step, log_rank, permutation_log_rank, spike_count, spike_steps, tail_log_ratio)


def blocks(*mins, block=100):
    """A series of len(mins) constant blocks of `block` steps, block b at mins[b]."""
    out = []
    for m in mins:
        out += [m] * block
    return out


def test_excursion_hand_worked():
    # blocks 1.0, 0.5 | 6, 6, 6, 6, 6: 6 > 10 x 0.5, five blocks -> event at block 2 (step 200)
    assert excursion_step(blocks(1.0, 0.5, 6, 6, 6, 6, 6)) == (True, 200)
    # first_step shifts the report
    assert excursion_step(blocks(1.0, 0.5, 6, 6, 6, 6, 6), first_step=1000) == (True, 1200)
    # four blocks above and then a recovery: no event, censored at 800 - 500
    assert excursion_step(blocks(1.0, 0.5, 6, 6, 6, 6, 0.4, 0.4)) == (False, 300)
    # exactly 10 x is not above
    assert excursion_step(blocks(1.0, 0.5, 5, 5, 5, 5, 5)) == (False, 200)
    # the reference is the minimum of the blocks before the run, not a running one: 0.5 then
    # 4.0 (not above 5) then five blocks at 6 -> event at block 3
    assert excursion_step(blocks(1.0, 0.5, 4.0, 6, 6, 6, 6, 6)) == (True, 300)
    # one low step inside a block is its minimum
    s = blocks(1.0, 0.5, 6, 6, 6, 6, 6)
    s[450] = 4.0
    assert excursion_step(s) == (False, 200)  # block 4's minimum is 4.0: no five blocks above
    # block 0 cannot be an event (nothing before it)
    assert excursion_step(blocks(1.0, 1.0, 1.0, 1.0, 1.0, 1.0)) == (False, 100)


def test_excursion_window_and_block():
    s = blocks(1.0, 0.5, 6, 6, 0.4, block=10)
    assert excursion_step(s, window=20, block=10) == (True, 20)
    assert excursion_step(s, window=30, block=10) == (False, 20)
    assert excursion_step(s, factor=20.0, window=20, block=10) == (False, 30)
    with pytest.raises(ValueError):
        excursion_step(s, window=25, block=10)
    with pytest.raises(ValueError):
        excursion_step(s, window=0, block=10)


def test_excursion_partial_block_and_short_series():
    # the trailing partial block (steps 700..749) is not read
    assert excursion_step(blocks(1.0, 0.5, 6, 6, 6, 6) + [6.0] * 50) == (False, 150)
    assert excursion_step(blocks(1.0, 0.5, 6, 6, 6, 6) + [6.0] * 100) == (True, 200)
    # shorter than the window: censored at first_step
    assert excursion_step([1.0] * 50, first_step=7) == (False, 7)
    assert excursion_step([]) == (False, 0)


def test_excursion_non_finite():
    # a NaN block counts as above
    assert excursion_step(blocks(1.0, 0.5, 6, math.nan, math.inf, 6, 6)) == (True, 200)
    # a finite value inside a block with NaNs is its minimum
    s = blocks(1.0, 0.5, 6, 6, 6, 6, 6)
    s[301] = math.nan
    assert excursion_step(s) == (True, 200)
    # a run that stopped at a NaN (its last loss) stays non-finite: the event is the block after
    # the one holding the last finite losses
    assert excursion_step([1.0] * 250 + [math.nan]) == (True, 300)
    assert excursion_step([1.0] * 200 + [math.nan]) == (True, 200)
    # ... but a NaN from the very first step has no finite reference
    assert excursion_step([math.nan]) == (False, 0)


def test_spikes_hand_worked():
    s = [1.0, 1.0, 150.0, 1.0, 100.0, 1.0, math.nan, math.nan, 1.0]
    # 150 > 100 x 1 (step 2); 100 is not above 100 x 1; NaN after 1.0 (step 6); the NaN after a NaN
    # and the 1.0 after a NaN are not (their previous loss is not finite)
    assert spike_steps(s) == [2, 6]
    assert first_spike_step(s, first_step=10) == 12
    assert spike_count(s) == 2
    assert spike_steps(s, factor=50.0) == [2, 4, 6]
    assert first_spike_step([1.0, 1.0]) == -1


def test_tail_log_ratio_hand_worked():
    ref = [1.0] * 10
    arm = [1.0] * 6 + [2.0, 4.0, 8.0, 8.0]
    # last 4 steps: log 2, log 4, log 8, log 8 -> median (log 4 + log 8) / 2
    assert tail_log_ratio(arm, ref, last=4) == pytest.approx(0.5 * (math.log(4) + math.log(8)))
    assert tail_log_ratio(arm, ref, last=3) == pytest.approx(math.log(8))
    # the steps are matched by number: an arm starting at step 5 (a branch)
    assert tail_log_ratio([2.0] * 5, ref, last=100, first_arm=5) == pytest.approx(math.log(2))
    # different lengths: only shared steps
    assert tail_log_ratio([3.0] * 20, ref, last=100) == pytest.approx(math.log(3))
    # an arm that stopped at a NaN counts as +inf up to the reference's last step
    assert tail_log_ratio([1.0] * 4 + [math.nan], ref, last=4) == math.inf
    assert tail_log_ratio([1.0] * 8 + [math.nan], ref, last=3) == math.inf  # 0, inf, inf -> inf
    assert tail_log_ratio([1.0] * 8 + [math.nan], ref, last=4) == math.inf  # (0 + inf) / 2
    assert tail_log_ratio([1.0] * 8 + [math.nan], ref, last=5) == 0.0  # 0 0 0 inf inf -> 0
    # both non-finite at a step: 0
    assert tail_log_ratio([math.nan] * 3, [math.nan] * 3, last=3) == 0.0
    assert math.isnan(tail_log_ratio([], ref))


def random_series(rng, n, block):
    """A decaying loss with noise, occasional single-step spikes, and 0-3 excursions of random
    length (some shorter than the window, some to the end, some non-finite)."""
    s = [1.0 * math.exp(-3.0 * i / n) * (1 + 0.3 * rng.random()) for i in range(n)]
    for _ in range(rng.randint(0, 3)):
        start = rng.randrange(0, n)
        length = rng.choice([rng.randint(1, 3 * block), rng.randint(1, 12 * block), n])
        height = rng.choice([5.0, 15.0, 50.0, 1e4])
        for i in range(start, min(n, start + length)):
            s[i] = s[i] * height if rng.random() > 0.02 else rng.choice([math.nan, math.inf, s[i]])
    if rng.random() < 0.2:  # a run that stops at a NaN
        s = s[:rng.randint(1, n)] + [math.nan]
    return s


@pytest.mark.parametrize("seed", range(4))
def test_excursion_truncation_property(seed):
    """Truncating a series at any horizon H >= t + W leaves its event unchanged; a series with an
    event at t truncated at H < t + W is censored (no event before H - W)."""
    rng = random.Random(seed)
    events = 0
    for _ in range(150):
        block = rng.choice([1, 5, 10])
        window = block * rng.choice([1, 2, 5])
        n = rng.randint(1, 60 * block)
        first = rng.choice([0, 37])
        s = random_series(rng, n, block)
        event, t = excursion_step(s, 10.0, window, block, first)
        for h in range(0, len(s) + 1):
            ev_h, t_h = excursion_step(s[:h], 10.0, window, block, first)
            if event and first + h >= t + window:
                assert (ev_h, t_h) == (True, t), (h, s)
            elif ev_h:
                # an event seen early is the same event (or, when the truncated series ends on a
                # non-finite loss, one the full series confirms later or never sees)
                assert not event or t_h <= t or not math.isfinite(s[h - 1])
                if math.isfinite(s[h - 1]):
                    assert (ev_h, t_h) == (event, t)
            else:
                assert t_h == first + max(h - window, 0)
                if event:
                    assert t > t_h  # censored at H - W: the event happens after it
        events += event
    assert events > 20  # the generator makes excursions


def test_permutation_log_rank_hand_worked():
    """The case of tests/cpu/test_stats.cpp PermutationLogRankHandWorkedPairs: per seed
    (time, event, in_a); seeds 0, 1, 4 have u = +1/2, v = 1/4; seed 2 (both censored) and seed 3
    (both events at one step) carry nothing. U = 3/2, chi2 = 3, 2 of the 8 labelings as extreme."""
    pairs = [[(100, True, True), (500, False, False)], [(200, True, True), (300, True, False)],
             [(500, False, True), (500, False, False)], [(250, True, True), (250, True, False)],
             [(400, True, True), (500, False, False)]]
    r = permutation_log_rank(pairs)
    assert (r["strata"], r["u"], r["variance"], r["chi2"]) == (3, 1.5, 0.75, 3.0)
    assert r["p_asymptotic"] == pytest.approx(math.erfc(math.sqrt(1.5)), rel=1e-15)
    assert (r["exact"], r["labelings"], r["p"]) == (True, 8, 0.25)
    flipped = pairs[:4] + [[(400, True, False), (500, False, True)]]
    assert permutation_log_rank(flipped)["p"] == 1.0
    none = permutation_log_rank(pairs[2:4])
    assert none["strata"] == 0 and math.isnan(none["p"]) and math.isnan(none["chi2"])
    # log_rank itself, seed 1: at 200 both at risk (E_a 1/2, V 1/4), at 300 only b.
    assert log_rank([(200, True)], [(300, True)]) == (1.0, 0.5, 0.25)


def test_permutation_log_rank_general_strata_and_draws():
    """Strata of 2-4 subjects against a brute-force enumeration; the draws path against the
    values lab/stats/stats.cpp gives (tests/cpu/test_stats.cpp pins the same numbers)."""
    def st(rows):
        return [(t, bool(e), bool(a)) for t, e, a in rows]
    strata = [st([(100, 1, 1), (200, 1, 0), (300, 0, 0)]), st([(150, 1, 0), (150, 1, 1), (400, 0, 1), (120, 1, 0)]),
              st([(50, 1, 1), (60, 0, 0)]), st([(70, 1, 0), (80, 1, 1), (90, 1, 0)])]

    def u_of(s, labels):
        o, e, _ = log_rank([(t, ev) for (t, ev, _), a in zip(s, labels) if a],
                           [(t, ev) for (t, ev, _), a in zip(s, labels) if not a])
        return o - e

    from itertools import product
    per = []
    for s in strata:
        k = sum(a for _, _, a in s)
        per.append([u_of(s, lab) for lab in product([False, True], repeat=len(s)) if sum(lab) == k])
    u_obs = sum(u_of(s, [a for _, _, a in s]) for s in strata)
    totals = [sum(c) for c in product(*per)]
    want = sum(abs(u) >= abs(u_obs) - 1e-9 for u in totals) / len(totals)
    r = permutation_log_rank(strata)
    assert r["exact"] and r["labelings"] == len(totals) == 108
    assert r["p"] == pytest.approx(want, abs=1e-15) and r["p"] == pytest.approx(84 / 108)
    assert r["u"] == pytest.approx(u_obs, abs=1e-12)
    d = permutation_log_rank(strata, max_exact=50, draws=20000)
    assert not d["exact"] and d["labelings"] == 20000
    assert d["p"] == 0.7712614369281536
    assert abs(d["p"] - r["p"]) < 0.015
    assert permutation_log_rank(strata, 50, 20000, seed=7)["p"] != d["p"]


def test_excursion_block_on_block_minima():
    """The block rule alone, as results/extract_loss_blocks.py's CSV gives the minima (+inf for
    a block without a finite loss): the same event as excursion_step on the losses."""
    assert excursion_block([1.0, 0.5, 6, 6, 6, 6, 6]) == 2
    assert excursion_block([1.0, 0.5, 6, 6, 6, 6]) == -1
    assert excursion_block([1.0, 0.5, 6, math.inf, 6, 6, 6]) == 2
    # block 1 has no finite reference (block 0 has no finite loss); block 2 has block 1's
    assert excursion_block([math.inf, 1.0, 100.0, 100.0], run=2) == 2
    assert excursion_block([math.inf, math.inf, math.inf], run=1) == -1
    assert excursion_block([1.0, 0.5, 4.0, 6, 6], factor=10.0, run=2) == 3


# excursion_between and branch_endpoint: the hand-worked series of tests/cpu/test_events.cpp
# (ExcursionBetween, BranchEndpoint), 10-step blocks, K = 10, W = 20.
SMALL = dict(factor=10.0, window=20, block=10)
NAN = float("nan")


def test_excursion_between_hand_worked():
    s = blocks(1.0, 0.2, 3, 3, 3, 1, block=10)
    assert excursion_between(s, 0, 1000, **SMALL) == (True, 20)
    assert excursion_between(s, 21, 1000, **SMALL) == (True, 30)
    assert excursion_between(s, 31, 1000, **SMALL) == (False, 40)
    assert excursion_between(s, 21, 30, **SMALL) == (False, 30)
    assert excursion_between(s, 50, 1000, **SMALL) == (False, 50)
    assert excursion_between(s, 130, 140, first_step=100, **SMALL) == (True, 130)
    stopped = blocks(1.0, 0.2, 1, 1, block=10) + [NAN]
    assert excursion_between(stopped, 10, 60, **SMALL) == (True, 40)
    assert excursion_between(stopped, 10, 40, **SMALL) == (False, 40)
    assert excursion_between(stopped, 10, 100, **SMALL) == (True, 40)
    with pytest.raises(ValueError):
        excursion_between(s, 0, 10, 10.0, 25, 10)
    # With the window the whole series it is excursion_step wherever that has its event.
    for seq in (s, stopped, blocks(1.0, 0.5, 6, 6, 6, 6, 6)):
        ev = excursion_step(seq, 10.0, 20, 10)
        if ev[0]:
            assert excursion_between(seq, 0, 10 ** 9, **SMALL) == ev


def endpoint(e):
    return e["at_risk"], e["window_end"], e["branch"], e["control"]


def test_branch_endpoint_hand_worked():
    parent = blocks(1.0, 0.2, 1, 1, 1, 1, 1, 1, block=10)
    branch = blocks(3, 3, 3, 3, 3, block=10)
    # on its own the branch has no excursion; joined to the parent's blocks before 30 it has one
    assert excursion_step(branch, first_step=30, **SMALL) == (False, 60)
    assert endpoint(branch_endpoint(parent, branch, 30, 80, **SMALL)) == (True, 60, (True, 30), (False, 60))
    # a parent excursion before the branch point: not at risk
    flat = blocks(1, 1, 1, 1, 1, block=10)
    assert endpoint(branch_endpoint(blocks(1.0, 0.2, 5, 5, 1, 1, 1, 1, block=10), flat, 30, 80, **SMALL)) == \
        (False, 60, (False, 60), (False, 60))
    # an onset before the branch point on the joined series counts for neither
    parent2 = blocks(1.0, 0.2, 3, 1, 1, 1, 1, 1, block=10)
    assert excursion_step(parent2, **SMALL) == (False, 60)
    assert endpoint(branch_endpoint(parent2, branch, 30, 80, **SMALL)) == (True, 60, (True, 30), (False, 60))
    # the control's own event in the window
    parent3 = blocks(1.0, 0.2, 1, 1, 5, 5, 5, 1, block=10)
    assert endpoint(branch_endpoint(parent3, flat, 30, 80, **SMALL)) == (True, 60, (False, 60), (True, 40))
    # censored at at + N - W even with an onset visible at 60 itself
    late = blocks(1, 1, 1, 3, 3, block=10)
    assert excursion_step(parent[:30] + late, **SMALL) == (True, 60)
    assert endpoint(branch_endpoint(parent, late, 30, 80, **SMALL)) == (True, 60, (False, 60), (False, 60))
    assert endpoint(branch_endpoint(parent, late[:40], 30, 80, **SMALL)) == (True, 50, (False, 50), (False, 50))
    stopped = [1.0] * 11 + [NAN]
    assert endpoint(branch_endpoint(parent, stopped, 30, 80, **SMALL)) == (True, 60, (True, 50), (False, 60))
    with pytest.raises(ValueError, match="fewer than"):
        branch_endpoint([1.0] * 20, late, 30, 80, **SMALL)
