"""results/prereg/power_flash_bf16.py: the hazard ratio that gives an arm its stated event
probability (the flash study states the pilot's probabilities, not hazard ratios), checked by an
independent simulation of the frailty model; and its power is power_why_mx.py's."""
import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def P():
    path = os.path.join(ROOT, "results", "prereg", "power_flash_bf16.py")
    spec = importlib.util.spec_from_file_location("power_flash_bf16", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _simulated_p(P, p_ref, hr, draws=400_000, seed=99):
    """P(event by the horizon) of an arm at hazard ratio hr, by direct simulation of event times
    with other random draws than hr_for's."""
    rng = np.random.default_rng(seed)
    lam = P.PW.lam_for(p_ref, P.FRAILTY_VAR, P.HORIZON, rng, draws)
    z = rng.gamma(1 / P.FRAILTY_VAR, P.FRAILTY_VAR, draws)
    t = rng.exponential(1 / (z * lam * hr))
    return float(np.mean(t <= P.HORIZON))


@pytest.mark.parametrize("p_ref,p_arm", [(0.05, 0.5), (0.5, 0.05), (0.5, 0.85), (0.3, 0.3)])
def test_hr_gives_the_stated_probability(P, p_ref, p_arm):
    hr = P.hr_for(p_arm, p_ref)
    assert (hr > 1) == (p_arm > p_ref) or p_arm == p_ref
    assert _simulated_p(P, p_ref, hr) == pytest.approx(p_arm, abs=0.005)
    if p_arm == p_ref:
        assert hr == pytest.approx(1.0, rel=1e-3)


def test_probabilities_outside_the_unit_interval_are_refused(P):
    for bad in ((0.0, 0.5), (0.5, 1.0)):
        with pytest.raises(ValueError, match="event probabilities"):
            P.hr_for(*bad)


def test_table_rows_use_the_exact_sign_test(P):
    """A certain event in one arm only: every seed is informative and goes one way, so the exact
    two-sided sign test rejects at 0.05 with 20 seeds (p = 2^-19) in every simulated study."""
    pw = P.PW.power(20, 0.999, 1e-6, frailty_var=P.FRAILTY_VAR, horizon=P.HORIZON, alphas=(0.05,), sims=50)
    assert pw[0] == 1.0
