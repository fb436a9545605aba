#!/usr/bin/env bash
# Per-kernel device times of one eager step (Nsight Compute, clocks as found, caches flushed
# between kernels: an upper bound for memory-bound kernels), for the breakdown in
# kernels/PERF.md. Usage: bash bench/gpu_profile.sh OUTDIR [FIGURE...] (after
# bench/gpu_check.sh built ./build). Writes OUTDIR/ncu_<figure>.txt (summary, then each launch).
set -uo pipefail
OUT=${1:?usage: gpu_profile.sh OUTDIR [FIGURE...]}
shift
CFG=experiments/paper/fig4_baseline.yaml
TMP=$(mktemp -d)
for f in "${@:-mx}"; do
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$TMP/ncu_$f.csv" \
    ./build/mxlab bench "$CFG" --device cuda --only "$f" --steps 1 --warmup 0 --no-graphs > "$TMP/ncu_$f.out" 2>&1
  echo "ncu $f: rc $?"
  python3 bench/ncu_summary.py "$TMP/ncu_$f.csv" seq > "$OUT/ncu_$f.txt"
  head -30 "$OUT/ncu_$f.txt"
done
