"""Where an extra recipe arm's time goes, kernel by kernel: two Nsight Compute logs of the same
`mxlab bench EXP --device cuda --only data --arms K --steps N --warmup 3`, one with --arms K and
one with --arms 1 (bench/gpu_profile.sh OUTDIR arms makes both), differ by (K - 1) arms of the
trainer's step for N + 4 steps (step 0 logged, 3 warm-up steps that CUDA graphs need, N timed;
everything else in the two commands is the same). Per kernel name it prints the device time an extra arm adds per step, serialized (ncu runs
one kernel at a time, caches not flushed), and the launches; the total beside the wall-clock cost
of an extra arm that `mxlab bench --arms K` measured without the profiler (its text output,
--bench) says how much of the serialized time the arms' overlap on the GPU hides.

    python3 bench/ncu_arms.py ncu_K.csv ncu_1.csv --arms K --steps N+4 [--bench bench.txt] [--top 25]
"""
import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_summary import read_launches  # noqa: E402


class ProfileError(Exception):
    """Two logs that cannot be compared: a one-line message."""


def per_kernel(launches):
    """{kernel key: [microseconds, launches]} summed over a log."""
    tot = collections.defaultdict(lambda: [0.0, 0])
    for v, k, _, _ in launches:
        tot[k][0] += v
        tot[k][1] += 1
    return tot


def extra_arm_rows(many, one, arms, steps):
    """[(key, us per extra arm-step, launches per extra arm-step)] largest first, from the two logs'
    launches; ProfileError when the K-arm log is not the larger (the logs swapped or a run cut)."""
    if arms < 2 or steps < 1:
        raise ProfileError(f"--arms {arms} --steps {steps}: need K >= 2 and at least one step")
    a, b = per_kernel(many), per_kernel(one)
    if sum(v for v, _ in a.values()) <= sum(v for v, _ in b.values()):
        raise ProfileError("the K-arm log has no more device time than the 1-arm log: swapped, or a profile cut short?")
    div = (arms - 1) * steps
    rows = [(k, (a[k][0] - b.get(k, [0.0, 0])[0]) / div, (a[k][1] - b.get(k, [0.0, 0])[1]) / div) for k in a]
    rows += [(k, -b[k][0] / div, -b[k][1] / div) for k in b if k not in a]
    return sorted(rows, key=lambda r: -r[1])


def measured_per_extra_arm(text):
    """The ms per extra arm in `mxlab bench --arms K` output ("per extra arm: (a - b) / (K - 1) = X ms"),
    None when the text has none. X may be negative: on a small model the timing noise can exceed an
    extra arm's cost, and the binary prints what it measured."""
    m = re.search(r"per extra arm: \([0-9.]+ - [0-9.]+\) / \([0-9]+ - 1\) = (-?[0-9.]+) ms", text)
    return float(m.group(1)) if m else None


def report(rows, arms, steps, measured_ms=None, top=25):
    total = sum(r[1] for r in rows)
    launches = sum(r[2] for r in rows)
    out = [f"per extra arm-step, serialized (ncu, one kernel at a time; K = {arms}, {steps} steps each, "
           f"step 0 logged): {total / 1000:.3f} ms in {launches:.1f} launches",
           "", "| kernel | us per extra arm-step | share | launches |", "|---|---|---|---|"]
    for k, us, n in rows[:top]:
        out.append(f"| {k} | {us:.1f} | {us / total:.1%} | {n:.2f} |")
    rest = rows[top:]
    if rest:
        out.append(f"| ({len(rest)} more) | {sum(r[1] for r in rest):.1f} | {sum(r[1] for r in rest) / total:.1%} "
                   f"| {sum(r[2] for r in rest):.2f} |")
    if measured_ms is not None:
        out += ["", f"measured without the profiler (mxlab bench --arms {arms}): {measured_ms:.3f} ms per extra arm, "
                f"{measured_ms / (total / 1000):.2f} x the serialized kernel time "
                f"(below 1: the arms' lanes overlap that share; above 1: time between kernels)"]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("many", help="ncu --csv log of the run with --arms K")
    ap.add_argument("one", help="ncu --csv log of the same command with --arms 1")
    ap.add_argument("--arms", type=int, required=True, help="K")
    ap.add_argument("--steps", type=int, required=True, help="trainer steps per run (bench --steps N --warmup 3: N + 4)")
    ap.add_argument("--bench", help="mxlab bench --arms K output without the profiler (its per-extra-arm line)")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv)
    try:
        many, one = read_launches(a.many), read_launches(a.one)
        if not many or not one:
            raise ProfileError(f"no kernel launches in {a.many if not many else a.one}")
        measured = None
        if a.bench:
            with open(a.bench) as f:
                measured = measured_per_extra_arm(f.read())
            if measured is None:
                raise ProfileError(f"{a.bench}: no 'per extra arm' line (not mxlab bench --arms K output?)")
        print(report(extra_arm_rows(many, one, a.arms, a.steps), a.arms, a.steps, measured, a.top))
    except (OSError, ProfileError) as e:
        print(f"ncu_arms: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
