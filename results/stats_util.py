"""Statistics shared by the results/ scripts, standard library only: Wilson 95 % intervals,
two-sided Fisher exact tests, exact McNemar tests of paired outcomes, the Poisson-binomial tail of an exchangeability test,
the exact power of a Fisher comparison, Holm's step-down
correction, and when a summarized trajectory counts as diverged. The C++ twins are in lab/train/stats.cpp (analysis/tests check they agree)."""
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


def diverged_at(row):
    """The step at which a trajectory of a `mxlab summarize --csv` row counts as diverged, as the
    run's status has it (lab/train/summary.h diverged_at): the earlier of divergence_step and
    first_nonfinite_step that are >= 0; -1 when neither is."""
    steps = [s for s in (int(row["divergence_step"]), int(row["first_nonfinite_step"])) if s >= 0]
    return min(steps) if steps else -1


def outcome(row, sustained=0):
    """(diverged, step): the divergence step when the trajectory diverged for at least `sustained`
    steps before its last, else (False, the step it is censored at: steps_run - sustained).
    A trajectory's divergence step is the first step after which its loss stays above the
    criterion until the last step, so "lasted W steps" is "diverged by steps_run - W"."""
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
