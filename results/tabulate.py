#!/usr/bin/env python3
"""Prints the tables of results/README.md from the committed summary_*.csv files (the output
of `mxlab summarize DIR --csv` on the device), so every number there can be recomputed:

    python3 results/tabulate.py            # all tables, Markdown
    python3 results/tabulate.py configs    # one of: configs, seeds, branches

Definitions (README "Definitions"): a trajectory *diverged* when `mxlab` recorded a divergence
step (the loss never again falls below 10x its running minimum); it *degraded* when its final
loss is above DEGRADED_FACTOR x the minimum loss of the same run's FP32 trajectory (it spiked
and did not come back to the FP32 loss level, whether or not the 10x criterion fired).
Standard library only.
"""

import csv
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEGRADED_FACTOR = 2.0
NO_STEP = -1

# (label, csv file, {column: value} filter). The lr 6e-4 baseline spans two files: seed 0 comes
# from the interventions run (its fp32/mx trajectories are the plain baseline's), seeds 1-4
# from repro_seeds.yaml.
CONFIGS = [
    ("lr 3e-4, floor", ["summary_lr3e-4.csv"], {"precision.scale_rule": "floor"}),
    ("lr 3e-4, rceil", ["summary_lr3e-4.csv"], {"precision.scale_rule": "rceil"}),
    ("lr 4e-4, floor", ["summary_lr_search.csv"], {"optimizer.lr": "0.0004"}),
    ("lr 5e-4, floor", ["summary_lr_search.csv"], {"optimizer.lr": "0.0005"}),
    ("lr 5e-4, rceil", ["summary_scale_lr5e-4.csv"], {"precision.scale_rule": "rceil"}),
    ("lr 5e-4, floor_bump", ["summary_scale_lr5e-4.csv"], {"precision.scale_rule": "floor_bump"}),
    ("lr 5e-4, floor, nearest-even elements", ["summary_rounding_lr5e-4.csv"], {}),
    ("lr 5e-4, floor, depth 6", ["summary_depth6_lr5e-4.csv"], {}),
    ("lr 6e-4, floor (paper's lr)", ["summary_seed0.csv", "summary_seeds.csv"], {}),
    ("lr 6e-4, floor, no layernorm", ["summary_noln.csv"], {}),
]
BRANCH_RUNS = [
    ("lr 5e-4, seed 0 (MX diverges at 4817)", "summary_lr5e-4_interventions.csv"),
    ("lr 6e-4, seed 0 (MX diverges at 6360)", "summary_seed0.csv"),
]


def read(name):
    with open(os.path.join(HERE, name), newline="") as f:
        return list(csv.DictReader(f))


def _step(row):
    step = row.get("diverged_to_end_step", row.get("divergence_step"))
    return int(step) if step not in ("", None) else NO_STEP


def pairs(files, where):
    """{seed: {'fp32': row, 'mx': row, 'branches': [rows]}} for the rows matching `where`."""
    out = {}
    for name in files:
        for row in read(name):
            if any(row.get(k) != v for k, v in where.items()):
                continue
            entry = out.setdefault(int(row["seed"]) if row.get("seed") else 0, {"branches": []})
            if row["at"]:
                entry["branches"].append(row)
            else:
                entry[row["group"]] = row
    return dict(sorted(out.items()))


def degraded(row, fp32_min):
    return float(row["final_loss"]) > DEGRADED_FACTOR * fp32_min


def config_counts(files, where):
    """{'n', 'fp32_div', 'fp32_deg', 'mx_div', 'mx_deg'}: lists of (seed, step or None)."""
    res = {"n": 0, "fp32_div": [], "fp32_deg": [], "mx_div": [], "mx_deg": []}
    for seed, p in pairs(files, where).items():
        res["n"] += 1
        fmin = float(p["fp32"]["min_loss"])
        for g in ("fp32", "mx"):
            if _step(p[g]) != NO_STEP:
                res[f"{g}_div"].append((seed, _step(p[g])))
            if degraded(p[g], fmin):
                res[f"{g}_deg"].append((seed, None))
    return res


def _fmt_div(items, n):
    steps = ", ".join(f"s{seed}: {step}" for seed, step in items)
    return f"{len(items)}/{n}" + (f" ({steps})" if steps else "")


def _fmt_deg(items, n):
    seeds = ", ".join(f"s{seed}" for seed, _ in items)
    return f"{len(items)}/{n}" + (f" ({seeds})" if seeds else "")


def table_configs():
    lines = ["| configuration | seeds | FP32 diverged | FP32 degraded | MX diverged | MX degraded |",
             "|---|---|---|---|---|---|"]
    for label, files, where in CONFIGS:
        c = config_counts(files, where)
        n = c["n"]
        lines.append(f"| {label} | {n} | {_fmt_div(c['fp32_div'], n)} | {_fmt_deg(c['fp32_deg'], n)} | "
                     f"{_fmt_div(c['mx_div'], n)} | {_fmt_deg(c['mx_deg'], n)} |")
    return "\n".join(lines)


def table_seeds(labels=("lr 5e-4, floor", "lr 5e-4, rceil", "lr 5e-4, floor_bump",
                        "lr 5e-4, floor, nearest-even elements")):
    """MX final loss / FP32 final loss per seed, with the divergence step where there is one."""
    chosen = [c for c in CONFIGS if c[0] in labels]
    data = [pairs(files, where) for _, files, where in chosen]
    seeds = sorted(set().union(*data))
    lines = ["| seed | FP32 final loss | " + " | ".join(f"MX {label}" for label, _, _ in chosen) + " |",
             "|---|---|" + "---|" * len(chosen)]
    for seed in seeds:
        fp32 = next(d[seed]["fp32"] for d in data if seed in d)
        cells = []
        for d in data:
            if seed not in d:
                cells.append("")
                continue
            mx = d[seed]["mx"]
            ratio = float(mx["final_loss"]) / float(d[seed]["fp32"]["final_loss"])
            div = _step(mx)
            cells.append(f"{ratio:.2f}x" + (f", diverges {div}" if div != NO_STEP else ""))
        lines.append(f"| {seed} | {float(fp32['final_loss']):.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_branches():
    out = []
    for label, name in BRANCH_RUNS:
        p = pairs([name], {})[0]
        fmin = float(p["fp32"]["min_loss"])
        lines = [f"{label}: FP32 min loss {fmin:.4f}, degraded above {DEGRADED_FACTOR * fmin:.4f}", "",
                 "| trajectory | from step | diverges at | min loss after `at` | final loss | degraded |",
                 "|---|---|---|---|---|---|"]
        for row in [p["fp32"], p["mx"]] + sorted(p["branches"], key=lambda r: (int(r["at"]), r["group"])):
            div = _step(row)
            lines.append(f"| {row['group']} | {row['at'] or 0} | {div if div != NO_STEP else '-'} | "
                         f"{float(row['min_loss']):.4f} | {float(row['final_loss']):.4f} | "
                         f"{'yes' if degraded(row, fmin) else 'no'} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


TABLES = {"configs": table_configs, "seeds": table_seeds, "branches": table_branches}


def main(argv):
    names = argv or list(TABLES)
    for name in names:
        if name not in TABLES:
            print(f"tabulate: unknown table '{name}' (one of: {', '.join(TABLES)})", file=sys.stderr)
            return 2
    print("\n\n".join(TABLES[n]() for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
