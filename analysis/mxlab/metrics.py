"""Summary figures of a trajectory (SCHEMA.md "Summary attributes").

A finished group carries them as attributes written by the trainer, and `summarize` uses
those. A group from a killed run has none, so we recompute them here from `loss_all` with
the definitions of SCHEMA.md; the row then says `source=computed`.
"""

import math

import numpy as np

from . import schema as S

DEFAULT_SPIKE_FACTOR = 100.0       # log.spike_factor default (lab/config/config.h)
DEFAULT_DIVERGENCE_FACTOR = 10.0   # log.divergence_factor default
SPIKE_SCORE_WINDOW = 8             # mxnorm appendix J: rolling minimum over 8 steps
SPIKE_SCORE_TAIL = 0.3             # ... sigma over the last 30 % of steps
SPIKE_SCORE_THRESHOLD = 3.0        # ... area above 3 standard deviations


def first_nonfinite_step(loss):
    bad = np.nonzero(~np.isfinite(loss))[0]
    return int(bad[0]) if bad.size else S.NO_STEP


def divergence_step(loss, factor=DEFAULT_DIVERGENCE_FACTOR):
    """First t >= 1 such that every s >= t has loss_s > factor * min(loss_0..loss_{t-1}) or
    a non-finite loss_s; -1 if the run never stays diverged."""
    loss = np.asarray(loss, dtype=np.float64)
    n = loss.size
    if n < 2:
        return S.NO_STEP
    finite = np.where(np.isfinite(loss), loss, np.inf)
    prefix_min = np.minimum.accumulate(finite)          # prefix_min[t-1] = min(loss_0..t-1)
    suffix_min = np.minimum.accumulate(finite[::-1])[::-1]  # min over finite loss_s, s >= t
    t = np.arange(1, n)
    threshold = factor * prefix_min[t - 1]
    ok = np.isfinite(threshold) & (suffix_min[t] > threshold)
    hits = np.nonzero(ok)[0]
    return int(t[hits[0]]) if hits.size else S.NO_STEP


def spike_count(loss, factor=DEFAULT_SPIKE_FACTOR):
    loss = np.asarray(loss, dtype=np.float64)
    if loss.size < 2:
        return 0
    with np.errstate(invalid="ignore"):
        return int(np.count_nonzero(loss[1:] > factor * loss[:-1]))


def spike_score(loss):
    """mxnorm appendix J: sum_t max((L_t - m_t)/sigma - 3, 0), m_t the minimum of the last 8
    losses (t included), sigma the std of the last 30 % of steps; non-finite losses excluded."""
    loss = np.asarray(loss, dtype=np.float64)
    finite = loss[np.isfinite(loss)]
    if finite.size < 2:
        return 0.0
    tail = finite[int(math.floor(finite.size * (1.0 - SPIKE_SCORE_TAIL))):]
    sigma = float(np.std(tail)) if tail.size else 0.0
    if not sigma > 0:
        return 0.0
    padded = np.concatenate([np.full(SPIKE_SCORE_WINDOW - 1, np.inf), finite])
    windows = np.lib.stride_tricks.sliding_window_view(padded, SPIKE_SCORE_WINDOW)
    rolling_min = windows.min(axis=1)
    return float(np.maximum((finite - rolling_min) / sigma - SPIKE_SCORE_THRESHOLD, 0.0).sum())


def _nanmax(a):
    if a is None:
        return float("nan")
    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else float("nan")


def step_offset(traj):
    """Absolute step of loss_all[0]. Trajectories start at 0. For a branch, SCHEMA.md does not
    pin whether loss_all holds the shared prefix; infer it from the logged steps."""
    if traj.kind != "branch" or traj.at is None or traj.n == 0 or traj.loss_all.size == 0:
        return 0
    implied = int(traj.step[-1]) + 1 - traj.loss_all.size
    return traj.at if abs(implied - traj.at) < abs(implied) else 0


def summarize(traj, config=None):
    """Summary of one group as a dict keyed by the SCHEMA.md attribute names, plus `source`
    ("file" when every summary value came from the group's attributes)."""
    config = config or {}
    spike_factor = float(config.get("log.spike_factor", DEFAULT_SPIKE_FACTOR))
    div_factor = float(config.get("log.divergence_factor", DEFAULT_DIVERGENCE_FACTOR))
    loss = traj.loss_all if traj.loss_all.size else traj.loss
    offset = step_offset(traj) if traj.loss_all.size else 0

    def absolute(step):
        if traj.loss_all.size:
            return step + offset if step != S.NO_STEP else step
        # Fallback on the logged rows: report the logged step, not the row index.
        return int(traj.step[step]) if step != S.NO_STEP else step

    finite = loss[np.isfinite(loss)]
    computed = {
        S.SUM_STEPS_RUN: int(loss.size),
        S.SUM_FIRST_NONFINITE: absolute(first_nonfinite_step(loss)),
        S.SUM_DIVERGENCE: absolute(divergence_step(loss, div_factor)),
        S.SUM_SPIKE_COUNT: spike_count(loss, spike_factor),
        S.SUM_SPIKE_SCORE: spike_score(loss),
        S.SUM_FINAL_LOSS: float(finite[-1]) if finite.size else float("nan"),
        S.SUM_MIN_LOSS: float(finite.min()) if finite.size else float("nan"),
        S.SUM_MAX_BIAS_RATIO: _nanmax(traj.get(S.DS_BIAS_RATIO)),
        S.SUM_MAX_GAMMA_LASTBIN: _nanmax(traj.get(S.lastbin_name("gamma"))),
    }
    out, from_file = {}, True
    for key in S.SUMMARY_ATTRS:
        if key in traj.attrs:
            out[key] = traj.attrs[key]
        else:
            out[key] = computed[key]
            # max_bias_ratio is only defined for MX groups; its absence on fp32 is normal.
            if not (key == S.SUM_MAX_BIAS_RATIO and traj.is_fp32):
                from_file = False
    out["source"] = "file" if from_file else "computed"
    return out


def diverged(summary):
    return event_step(summary) is not None


def event_step(summary):
    """The step a trajectory failed at: its divergence step, else its first non-finite loss;
    None when it did neither (the definition `warn` and `survival` share)."""
    for key in (S.SUM_DIVERGENCE, S.SUM_FIRST_NONFINITE):
        step = int(summary.get(key, S.NO_STEP))
        if step != S.NO_STEP:
            return step
    return None


def end_step(traj, summary):
    """One past the last step the group ran, as an absolute step: steps_run counts from step 0
    for a trajectory and from its first own step for a branch (`at`; the trainer's loss_all
    starts there)."""
    if traj.loss_all.size:
        offset = step_offset(traj)
    else:
        offset = traj.at if traj.kind == "branch" and traj.at is not None else 0
    return offset + int(summary[S.SUM_STEPS_RUN])
