"""Summary statistics recomputed for groups without summary attributes, on hand-worked losses."""

import numpy as np
import pytest

from mxlab_analysis import metrics
from mxlab_analysis import schema as S


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
