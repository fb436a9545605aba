"""Summary statistics recomputed for groups without summary attributes, on hand-worked losses."""

import numpy as np
import pytest

from mxlab import metrics
from mxlab import schema as S


def test_first_nonfinite():
    assert metrics.first_nonfinite_step(np.array([1.0, 0.5, np.inf, np.nan])) == 2
    assert metrics.first_nonfinite_step(np.array([1.0, 0.5])) == S.NO_STEP


def test_divergence_step_needs_staying_diverged():
    # min before t=3 is 0.5; from t=3 on every loss > 10 * 0.5 -> 3
    assert metrics.divergence_step([1.0, 0.8, 0.5, 6.0, 9.0, 50.0], 10.0) == 3
    # recovers at the end -> never "stays diverged"
    assert metrics.divergence_step([1.0, 0.5, 6.0, 9.0, 0.4], 10.0) == S.NO_STEP
    # a NaN tail counts as diverged; the first NaN step qualifies when nothing before does
    assert metrics.divergence_step([1.0, 0.5, 0.4, np.nan, np.nan], 10.0) == 3
    assert metrics.divergence_step([1.0, 0.5, 0.4, 0.3], 10.0) == S.NO_STEP


def test_spike_count_uses_previous_step():
    loss = [1.0, 150.0, 1.0, 0.01, 2.0, np.nan, 5.0]
    # 150 > 100 * 1 and 2 > 100 * 0.01; comparisons with NaN never count
    assert metrics.spike_count(loss, 100.0) == 2


def test_spike_score_by_hand():
    # 20 steps alternating 1, 2: last 30 % = 6 values (1,2,...) -> sigma 0.5.
    loss = np.tile([1.0, 2.0], 10)
    loss[12] = 5.0  # rolling min over 8 steps at t=12 is 1 -> (5-1)/0.5 - 3 = 5
    # every "2" scores (2-1)/0.5 - 3 < 0 -> 0, every "1" scores 0
    assert metrics.spike_score(loss) == pytest.approx(5.0)
    assert metrics.spike_score(np.ones(10)) == 0.0  # sigma 0: no score, not a division by zero


def test_branch_steps_are_absolute_whether_or_not_loss_all_holds_the_prefix(tmp_path):
    """A killed run's branches have no summary attributes; their recomputed steps must be
    absolute steps, whichever way loss_all was stored (from `at`, or with the shared prefix)."""
    import h5py

    import make_fixtures as F
    from conftest import BRANCHES
    path = str(tmp_path / "killed_branches.h5")
    F.write_run(path, steps=400, seed=3, mx_diverge_at=300, branches=BRANCHES, killed="ragged")
    run = S.load_run(path)
    late = run.branches["fp32_late"]  # fixture: diverges at 340, loss_all from at = 290
    assert late.loss_all.size == 400 - 290
    s = metrics.summarize(late, run.config)
    assert s["source"] == "computed" and 340 <= s[S.SUM_DIVERGENCE] < 380
    assert metrics.summarize(run.branches["fp32_early"], run.config)[S.SUM_DIVERGENCE] == S.NO_STEP

    with h5py.File(path, "a") as f:  # the other convention: loss_all with the baseline prefix
        g = f["branches/fp32_late"]
        full = np.concatenate([f["trajectories/mx/loss_all"][:290], g["loss_all"][:]])
        del g["loss_all"]
        g.create_dataset("loss_all", data=full, maxshape=(None,), chunks=True)
    late = S.load_run(path).branches["fp32_late"]
    assert metrics.step_offset(late) == 0
    assert metrics.summarize(late, run.config)[S.SUM_DIVERGENCE] == s[S.SUM_DIVERGENCE]
