#!/usr/bin/env python3
"""Block statistics of every trajectory's per-step loss (`loss_all`), from mxlab run files, in
one CSV: what a survival study needs to look at its loss curves, and to test another divergence
criterion, after the run files are gone (they stay on the GPU machine).

  python3 results/extract_loss_blocks.py OUT.csv BLOCK RUN.h5 [RUN.h5 ...]

One row per run, trajectory (or branch) and block of BLOCK steps: run_id, seed, lr, trajectory,
block_start (the step of the block's first loss), steps (losses in the block), min, max and mean
of its finite losses (empty when none is finite), nonfinite (how many are not), last (the block's
last loss), eps and beta2 (the run's optimizer.eps and optimizer.beta2, as its config_yaml
writes them: what tells apart the runs of one seed in a sweep over Adam's settings, whose
trajectories have the same names). Steps are absolute: a branch's loss_all starts at its `at`.
CSVs written before eps and beta2 existed lack the two columns; the readers
(reanalysis_excursion.read_blocks) take them as empty.
"""
import csv
import gzip
import math
import sys

import h5py
import numpy as np

COLUMNS = ("run_id", "seed", "lr", "trajectory", "block_start", "steps", "min", "max", "mean", "nonfinite", "last",
           "eps", "beta2")


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def _lr(config_yaml):
    """optimizer.lr of a run file's config_yaml (the first `lr:` key)."""
    for line in config_yaml.splitlines():
        if line.strip().startswith("lr:"):
            return line.split(":", 1)[1].strip()
    return ""


def _optimizer(config_yaml):
    """(eps, beta2) of a run file's config_yaml: the `eps:` and `beta2:` keys of its top-level
    `optimizer:` section, as written there ("" when absent)."""
    found, inside = {}, False
    for line in config_yaml.splitlines():
        if line and not line[0].isspace():
            inside = line.rstrip() == "optimizer:"
            continue
        key, sep, value = line.strip().partition(":")
        if inside and sep and key in ("eps", "beta2") and key not in found:
            found[key] = value.strip()
    return found.get("eps", ""), found.get("beta2", "")


def _cell(x):
    """A CSV cell: repr of a float, empty for NaN."""
    return "" if math.isnan(x) else repr(x)


def blocks(loss, block):
    """[(offset, steps, min, max, mean, nonfinite, last)] over consecutive blocks of `loss`."""
    out = []
    for i in range(0, len(loss), block):
        b = np.asarray(loss[i:i + block], dtype=np.float64)
        fin = b[np.isfinite(b)]
        stats = (float(fin.min()), float(fin.max()), float(fin.mean())) if fin.size else (math.nan,) * 3
        out.append((i, len(b)) + stats + (int(b.size - fin.size), float(b[-1])))
    return out


def run_extractor(argv, doc, tool, rows_of, header, cells, what_rows, what_missing):
    """The command line of the extractors that read whole run files into one CSV (branch points,
    spectral norms, flash instruments): OUT.csv RUN.h5 [RUN.h5 ...], OUT.csv.gz written
    gzip-compressed; rows_of(path) gives a file's rows, cells(row) a row's CSV cells. Without any
    row nothing is written (a line says what none of the files had)."""
    if len(argv) < 2:
        raise SystemExit(doc)
    out, paths = argv[0], argv[1:]
    rows = [r for p in paths for r in rows_of(p)]
    if not rows:
        print(f"{tool}: no {what_missing} in {len(paths)} run files: {out} not written")
        return 0
    with (gzip.open(out, "wt", newline="") if out.endswith(".gz") else open(out, "w", newline="")) as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(cells(r) for r in rows)
    print(f"{tool}: {len(rows)} {what_rows} from {len(paths)} run files -> {out}")
    return 0


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    out, block, paths = argv[0], argv[1], argv[2:]
    try:
        block = int(block)
    except ValueError:
        raise SystemExit(f"extract_loss_blocks: BLOCK must be a number of steps, not {block!r}") from None
    if block < 1:
        raise SystemExit("extract_loss_blocks: BLOCK must be >= 1")
    rows = 0
    with open(out, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for path in paths:
            with h5py.File(path, "r") as f:
                config = _text(f.attrs["config_yaml"])
                rid, seed, lr = _text(f.attrs["run_id"]), int(f.attrs["seed"]), _lr(config)
                eps, beta2 = _optimizer(config)
                for top in ("trajectories", "branches"):
                    for name, g in (f[top].items() if top in f else ()):
                        if "loss_all" not in g:
                            continue
                        at = int(g.attrs.get("at", 0))
                        for off, n, lo, hi, mean, bad, last in blocks(g["loss_all"][:], block):
                            w.writerow([rid, seed, lr, name, at + off, n, _cell(lo), _cell(hi), _cell(mean), bad,
                                        _cell(last), eps, beta2])
                            rows += 1
    print(f"extract_loss_blocks: {rows} blocks of {block} steps from {len(paths)} run files -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
