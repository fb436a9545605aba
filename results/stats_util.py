"""Statistics shared by the results/ scripts, standard library only: Wilson 95 % intervals,
two-sided Fisher exact tests, exact McNemar tests of paired outcomes with the conditional odds
ratio and its exact (Clopper-Pearson) interval, the Poisson-binomial tail of an exchangeability test,
the exact power of a Fisher comparison, Holm's step-down
correction, when a summarized trajectory counts as diverged to the end (the old rule, which looks
into the future), the log-rank test and its seed-stratified form with a within-stratum
label-permutation p (permutation_log_rank, the primary paired test of `mxlab summarize --compare`).
The C++ twins are in lab/stats/stats.cpp (analysis/tests check they agree).

Loss-trajectory events, one definition each, twins of lab/stats/loss_events.cpp (analysis/tests run
`mxlab summarize --csv` and check both give the same numbers):
  excursion_step   the primary event, known W steps after it happens (no look into the future);
  excursion_between, branch_endpoint
                   the excursion with its onset in a window, and a branch's endpoint against its
                   parent on the joined series (E2 of results/prereg/why_mx.md);
  spike_steps      first_spike_step / spike_count: the recurrent spike events;
  tail_log_ratio   the paired continuous outcome of an arm against its FP32 reference."""
import math

Z95 = 1.959963984540054


def wilson(k, n):
    """Wilson score 95 % interval of k successes in n trials."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    z2 = Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def fisher_two_sided(a, n1, b, n2):
    """Two-sided Fisher exact p of a/n1 vs b/n2: the sum of the hypergeometric probabilities of
    all tables no more likely than the observed one."""
    k = a + b
    n = n1 + n2

    def prob(x):
        return math.comb(n1, x) * math.comb(n2, k - x) / math.comb(n, k)

    p_obs = prob(a)
    lo, hi = max(0, k - n2), min(k, n1)
    return min(1.0, sum(prob(x) for x in range(lo, hi + 1) if prob(x) <= p_obs * (1 + 1e-9)))


def mcnemar_exact(b, c):
    """Two-sided exact McNemar p of paired binary outcomes: b pairs where only the first member
    had the event, c where only the second had it (concordant pairs carry no information).
    Under the null each discordant pair goes either way with probability 1/2:
    p = min(1, 2 * P(Bin(b + c, 1/2) <= min(b, c)))."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _binom_cdf(k, n, p):
    """P(Bin(n, p) <= k)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0 or p >= 1:
        return 1.0 if p <= 0 else 0.0
    lp, lq = math.log(p), math.log1p(-p)  # in logs: math.comb(n, i) is exact at any n
    return min(1.0, sum(math.exp(math.log(math.comb(n, i)) + i * lp + (n - i) * lq) for i in range(k + 1)))


def clopper_pearson(k, n, alpha=0.05):
    """Exact (Clopper-Pearson) two-sided 1 - alpha interval of a binomial proportion k / n: lo
    solves P(Bin(n, lo) >= k) = alpha / 2 (0 when k = 0), hi solves P(Bin(n, hi) <= k) = alpha / 2
    (1 when k = n), each by bisection to 1e-15 (the beta quantiles of scipy, standard library
    only). (nan, nan) when n = 0."""
    if n == 0:
        return (math.nan, math.nan)

    def solve(f):  # f decreasing in p from >= target to < target: the crossing
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            if f(mid):
                lo = mid
            else:
                hi = mid
            if hi - lo < 1e-15:
                break
        return (lo + hi) / 2

    a = alpha / 2
    lower = 0.0 if k == 0 else solve(lambda p: 1 - _binom_cdf(k - 1, n, p) < a)
    upper = 1.0 if k == n else solve(lambda p: _binom_cdf(k, n, p) > a)
    return (lower, upper)


def conditional_odds_ratio(b, c, alpha=0.05):
    """(OR, lo, hi): the conditional (McNemar) odds ratio of paired binary outcomes, b pairs where
    only the first member had the event and c where only the second had it: OR = b / c, with the
    exact interval from the Clopper-Pearson interval (p_lo, p_hi) of b / (b + c) transformed by
    p / (1 - p). b = 0: OR = 0, lo = 0; c = 0: OR = inf, hi = inf; no discordant pair: all nan."""
    n = b + c
    if n == 0:
        return (math.nan, math.nan, math.nan)
    p_lo, p_hi = clopper_pearson(b, n, alpha)
    odds = lambda p: math.inf if p >= 1 else p / (1 - p)
    return (math.inf if c == 0 else b / c, odds(p_lo), odds(p_hi))


def poisson_binomial_cdf(probs, k):
    """P(S <= k) for S the number of successes of independent trials with success probabilities
    `probs` (dynamic programming over the trials)."""
    dist = [1.0]
    for q in probs:
        nxt = [0.0] * (len(dist) + 1)
        for i, v in enumerate(dist):
            nxt[i] += v * (1 - q)
            nxt[i + 1] += v * q
        dist = nxt
    return min(1.0, sum(dist[:k + 1])) if k >= 0 else 0.0


def fisher_power(p1, p2, n, alpha=0.05):
    """Probability that the two-sided Fisher exact test at `alpha` rejects for k1 ~ Bin(n, p1)
    vs k2 ~ Bin(n, p2), by enumerating every outcome pair."""
    total = 0.0
    for a in range(n + 1):
        for b in range(n + 1):
            if fisher_two_sided(a, n, b, n) < alpha:
                total += math.comb(n, a) * p1 ** a * (1 - p1) ** (n - a) * math.comb(n, b) * p2 ** b * (1 - p2) ** (n - b)
    return total


def diverged_to_end_column(row):
    """A `mxlab summarize --csv` row's diverged-to-end step: the column `diverged_to_end_step`,
    or `divergence_step` in CSVs written before it was renamed (the committed results tables)."""
    return row["diverged_to_end_step"] if "diverged_to_end_step" in row else row["divergence_step"]


def diverged_at(row):
    """The step at which a trajectory of a `mxlab summarize --csv` row counts as diverged to the
    end, as the run's status has it (lab/stats/loss_events.h diverged_at): the earlier of its
    diverged-to-end step and first_nonfinite_step that are >= 0; -1 when neither is."""
    steps = [s for s in (int(diverged_to_end_column(row)), int(row["first_nonfinite_step"])) if s >= 0]
    return min(steps) if steps else -1


def diverged_to_end(row, sustained=0):
    """(diverged, step) under the old rule, which looks into the future (the primary event is
    excursion_step): the diverged-to-end step when the trajectory diverged for at least
    `sustained` steps before its last, else (False, the step it is censored at: steps_run -
    sustained). A trajectory's diverged-to-end step is the first step after which its loss stays
    above the criterion until the last step, so "lasted W steps" is "diverged by steps_run - W":
    whether and when it happens depends on the run's length."""
    d = diverged_at(row)
    cut = int(row["steps_run"]) - sustained
    if 0 <= d <= cut:
        return True, d
    return False, max(cut, 0)


def holm(pvalues):
    """Holm's step-down adjusted p-values (same order as given): controls the family-wise error
    rate of a set of comparisons."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def _loss_value(x):
    """A loss as the event rules read it: non-finite (NaN, +-inf) counts as +inf ("above")."""
    x = float(x)
    return x if math.isfinite(x) else math.inf


def excursion_step(loss, factor=10.0, window=500, block=100, first_step=0):
    """(event, step) of the excursion event of a loss trajectory whose loss[i] is that of step
    first_step + i.

    Block b covers steps [first_step + b*block, first_step + (b+1)*block); a trailing partial
    block is not used. Its value is the minimum of its losses, non-finite losses counting as +inf.
    The event happens at block b >= 1 when each of the window/block consecutive blocks
    b, b+1, ... has a minimum above factor x the minimum of all blocks before b; it is reported
    at b's first step t = first_step + b*block and is known at t + window, once those blocks are
    complete. Nothing after t + window is read, so truncating the trajectory at any horizon
    H >= t + window leaves the event unchanged.
    A trajectory whose last loss is non-finite counts as non-finite from then on (the run stopped
    there, or its parameters are no longer finite), so a blow-up near the end is an event.
    Without an event: (False, censoring step) = (False, first_step + len(loss) - window), floored
    at first_step. `window` must be a positive multiple of `block` (ValueError otherwise)."""
    block, window = int(block), int(window)
    if block < 1 or window < block or window % block:
        raise ValueError(f"excursion window {window} must be a positive multiple of the block {block}")
    if not factor > 0:
        raise ValueError(f"excursion factor {factor} must be > 0")
    vals = [_loss_value(x) for x in loss]
    n = len(vals)
    run = window // block
    if n and vals[-1] == math.inf:
        n_blocks = -(-n // block) + run  # absorbing: the partial block and `run` more blocks are +inf
    else:
        n_blocks = n // block
    mins = [min(vals[b * block:(b + 1) * block], default=math.inf) for b in range(n_blocks)]
    b = excursion_block(mins, factor, run)
    if b >= 0:
        return True, first_step + b * block
    return False, first_step + max(n - window, 0)


def excursion_block(block_mins, factor=10.0, run=5, start=1, stop=None):
    """The block rule of excursion_step on a list of block minima (+inf for a block without a
    finite loss, as results/extract_loss_blocks.py's CSV gives them with `min` empty): the first
    block b >= 1 such that block_mins[b], ..., block_mins[b + run - 1] all exceed factor x
    min(block_mins[:b]); -1 when there is none. Only blocks start <= b < stop are onsets (the
    minimum before b still reads every block before it): the window of excursion_between."""
    before = math.inf  # minimum of blocks 0 .. b-1
    last = len(block_mins) - run + 1 if stop is None else min(len(block_mins) - run + 1, stop)
    for b in range(max(last, 0)):
        if b >= max(1, start) and all(m > factor * before for m in block_mins[b:b + run]):
            return b
        before = min(before, block_mins[b])
    return -1


def _block_mins(loss, window, block):
    """The block minima excursion_step reads (absorbing end: the partial block and window/block
    more blocks are +inf), after checking the rule."""
    block, window = int(block), int(window)
    if block < 1 or window < block or window % block:
        raise ValueError(f"excursion window {window} must be a positive multiple of the block {block}")
    vals = [_loss_value(x) for x in loss]
    n = len(vals)
    if n and vals[-1] == math.inf:
        n_blocks = -(-n // block) + window // block
    else:
        n_blocks = n // block
    return [min(vals[b * block:(b + 1) * block], default=math.inf) for b in range(n_blocks)]


def excursion_between(loss, from_step, until, factor=10.0, window=500, block=100, first_step=0):
    """(event, step) of the excursion whose onset lies in [from_step, until), the twin of
    lab/stats/loss_events.cpp excursion_between: the first block b with first step
    t = first_step + b*block in the window that meets excursion_step's rule (its minimum "before"
    reads every block from first_step on). Without one: (False, E), E = until when the last loss
    is non-finite, else min(until, first_step + len(loss) - window), not below from_step (no onset
    in [from_step, E))."""
    if not factor > 0:
        raise ValueError(f"excursion factor {factor} must be > 0")
    mins = _block_mins(loss, window, block)
    absorbing = len(loss) > 0 and not math.isfinite(float(loss[-1]))
    end = max(from_step, until if absorbing else min(until, first_step + len(loss) - window))
    start_b = max(0, -(-(from_step - first_step) // block))
    stop_b = max(0, -(-(end - first_step) // block))
    b = excursion_block(mins, factor, window // block, start_b, stop_b)
    if b >= 0:
        return True, first_step + b * block
    return False, end


def branch_endpoint(parent, branch, at, end, factor=10.0, window=500, block=100):
    """The endpoint of a branch against its parent continuing unchanged (E2 of
    results/prereg/why_mx.md), the twin of lab/stats/loss_events.cpp branch_endpoint.
    parent[i]: the parent trajectory's loss at step i (at least `at` of them); branch[i]: the
    branch's at step at + i; `end`: the step the branch was to stop at (at + its `steps`).
    Window [at, E), E = end - window (when the branch's last loss is non-finite), else
    min(end, at + len(branch)) - window, not below at. Returns a dict:
      at_risk     the parent had no excursion (excursion_step, whole series) with onset < at;
      window_end  E;
      branch      (event, step): excursion_between on the joined series parent[:at] + branch;
      control     (event, step): excursion_between on the parent's own series, same window."""
    at, end = int(at), int(end)
    if at < 0 or len(parent) < at:
        raise ValueError(f"the parent holds {len(parent)} losses, fewer than the branch's step {at}")
    absorbing = len(branch) > 0 and not math.isfinite(float(branch[-1]))
    e = max(at, end - window if absorbing else min(end, at + len(branch)) - window)
    joined = list(parent[:at]) + list(branch)
    whole = excursion_step(parent, factor, window, block)
    return {"at_risk": not (whole[0] and whole[1] < at), "window_end": e,
            "branch": excursion_between(joined, at, e, factor, window, block),
            "control": excursion_between(parent, at, e, factor, window, block)}


def spike_steps(loss, factor=100.0, first_step=0):
    """The steps at which the loss spikes (lab/stats/loss_events.cpp, the run's spike_count): step
    first_step + i, i >= 1, is a spike when loss[i - 1] is finite and loss[i] > factor x loss[i - 1],
    a non-finite loss[i] counting as +inf. first_spike_step is the first of them (-1 if none),
    spike_count their number: the recurrent events of a trajectory."""
    out = []
    for i in range(1, len(loss)):
        prev = float(loss[i - 1])
        if math.isfinite(prev) and _loss_value(loss[i]) > factor * prev:
            out.append(first_step + i)
    return out


def first_spike_step(loss, factor=100.0, first_step=0):
    """First step of spike_steps, -1 when there is none."""
    s = spike_steps(loss, factor, first_step)
    return s[0] if s else -1


def spike_count(loss, factor=100.0, first_step=0):
    """Number of spike_steps."""
    return len(spike_steps(loss, factor, first_step))


def _median(xs):
    """As lab/stats/stats.cpp median: the mean of the middle two of an even count."""
    xs = sorted(xs)
    n = len(xs)
    if n == 0:
        return math.nan
    if n % 2:
        return xs[n // 2]
    a, b = xs[n // 2 - 1], xs[n // 2]
    return b if a == b else (a + b) / 2


def tail_log_ratio(loss_arm, loss_ref, last=2000, first_arm=0, first_ref=0):
    """Median over the last `last` steps both trajectories cover of log(loss_arm / loss_ref) at the
    same step: the paired continuous outcome of an arm against its FP32 reference.
    loss_arm[i] is the loss of step first_arm + i (loss_ref likewise). Non-finite losses count as
    +inf (log ratio +inf, or -inf when only the reference's is; 0 when both are), and a trajectory
    whose last loss is non-finite counts as non-finite from then on, up to the other's last step.
    The median of an even count is the mean of the middle two. NaN when no step is shared."""
    def span(loss, first):
        n = len(loss)
        absorbing = n > 0 and not math.isfinite(float(loss[-1]))
        return first, first + n, absorbing

    a0, a1, a_abs = span(loss_arm, first_arm)
    r0, r1, r_abs = span(loss_ref, first_ref)
    end = min(math.inf if a_abs else a1, math.inf if r_abs else r1)
    if end == math.inf:
        end = max(a1, r1)
    begin = max(a0, r0, end - int(last))

    def at(loss, first, step):
        i = step - first
        return _loss_value(loss[i]) if i < len(loss) else math.inf

    ratios = []
    for step in range(begin, end):
        a, r = at(loss_arm, first_arm, step), at(loss_ref, first_ref, step)
        if a == math.inf and r == math.inf:
            ratios.append(0.0)
        elif a == math.inf:
            ratios.append(math.inf)
        elif r == math.inf:
            ratios.append(-math.inf)
        else:
            ratios.append(math.log(a / r))
    return _median(ratios)


def log_rank(a, b):
    """(observed_a, expected_a, variance) of the log-rank test of two samples of (time, event)
    observations, summed over the distinct event times in ascending order exactly as
    lab/stats/stats.cpp log_rank does (at risk at t: time >= t)."""
    times = sorted({t for t, e in list(a) + list(b) if e})
    o = e_a = v = 0.0
    for t in times:
        na = sum(1 for ti, _ in a if ti >= t)
        da = sum(1 for ti, ei in a if ti == t and ei)
        nb = sum(1 for ti, _ in b if ti >= t)
        db = sum(1 for ti, ei in b if ti == t and ei)
        n, d = float(na + nb), float(da + db)
        fa = na / n
        o += float(da)
        e_a += d * fa
        if n > 1:
            v += d * fa * (1 - fa) * (n - d) / (n - 1)
    return o, e_a, v


PERMUTATION_MAX_EXACT = 1 << 16
PERMUTATION_DRAWS = 10000
PERMUTATION_SEED = 0x6d786c6162  # "mxlab"
_MASK64 = (1 << 64) - 1


def _splitmix64(state):
    """One step of splitmix64: (new state, output), as lab/stats/stats.cpp draws them."""
    state = (state + 0x9e3779b97f4a7c15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & _MASK64
    return state, z ^ (z >> 31)


def permutation_log_rank(strata, max_exact=PERMUTATION_MAX_EXACT, draws=PERMUTATION_DRAWS,
                         seed=PERMUTATION_SEED):
    """Stratified log-rank with a within-stratum label-permutation p, the twin of
    lab/stats/stats.cpp permutation_log_rank (`mxlab summarize --by ... --compare`).

    strata: a list of strata, each a list of (time, event, in_a) subjects (a seed stratum: the
    trajectories of one seed). Per stratum u = O_a - E_a and v its variance (log_rank over the
    stratum alone); U = sum u, V = sum v, chi2 = U^2 / V. Under the null every choice of which
    k_s of a stratum's n_s subjects carry label a is equally likely; p = P(|U*| >= |U|)
    (relative tolerance 1e-9) over every labeling when there are at most max_exact, else
    (1 + hits) / (1 + draws) from `draws` labelings drawn with splitmix64 seeded with `seed`
    (each informative stratum in order: labeling index = output % its number of labelings, in
    itertools.combinations order). Strata whose labelings all give the same u are left out.

    Returns a dict: strata, u, variance, chi2, p_asymptotic, p, exact, labelings."""
    from itertools import combinations
    options, observed, variance = [], [], 0.0
    for s in strata:
        k = sum(1 for _, _, in_a in s if in_a)
        if k == 0 or k == len(s):
            continue
        us, obs_index, obs_v = [], 0, 0.0
        for c in combinations(range(len(s)), k):
            chosen = set(c)
            a = [(t, e) for i, (t, e, _) in enumerate(s) if i in chosen]
            b = [(t, e) for i, (t, e, _) in enumerate(s) if i not in chosen]
            o, e_a, v = log_rank(a, b)
            if all((i in chosen) == bool(s[i][2]) for i in range(len(s))):
                obs_index, obs_v = len(us), v
            us.append(o - e_a)
        if all(u == us[0] for u in us):
            continue
        options.append(us)
        observed.append(obs_index)
        variance += obs_v
    out = {"strata": len(options), "u": 0.0, "variance": variance, "chi2": math.nan,
           "p_asymptotic": math.nan, "p": math.nan, "exact": False, "labelings": 0}
    if not options:
        return out
    u_obs = 0.0
    for us, i in zip(options, observed):
        u_obs += us[i]
    out["u"] = u_obs
    if variance > 0:
        out["chi2"] = u_obs * u_obs / variance
        out["p_asymptotic"] = math.erfc(math.sqrt(out["chi2"] / 2)) if out["chi2"] > 0 else 1.0
    bar = abs(u_obs) * (1 - 1e-9)
    total = 1
    for us in options:
        total = max_exact + 1 if total > max_exact // len(us) else total * len(us)
    hits = 0
    if total <= max_exact:
        idx = [0] * len(options)
        for _ in range(total):
            u = 0.0
            for us, i in zip(options, idx):
                u += us[i]
            hits += abs(u) >= bar
            for j, us in enumerate(options):
                idx[j] += 1
                if idx[j] < len(us):
                    break
                idx[j] = 0
        out.update(exact=True, labelings=total, p=hits / total)
    else:
        state = seed
        for _ in range(draws):
            u = 0.0
            for us in options:
                state, z = _splitmix64(state)
                u += us[z % len(us)]
            hits += abs(u) >= bar
        out.update(labelings=draws, p=(1 + hits) / (1 + draws))
    return out
