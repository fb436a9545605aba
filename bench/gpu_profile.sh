#!/usr/bin/env bash
# Per-kernel device times of one eager step (Nsight Compute, clocks as found), for the
# breakdown in kernels/PERF.md. Usage: bash bench/gpu_profile.sh OUTDIR [FIGURE...]
# (after bench/gpu_check.sh built ./build). Writes OUTDIR/ncu_<figure>.csv.
set -uo pipefail
OUT=${1:?usage: gpu_profile.sh OUTDIR [FIGURE...]}
shift
CFG=experiments/paper/fig4_baseline.yaml
for fig in "${@:-mx fp32}"; do
  for f in $fig; do
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_$f.csv" \
      ./build/mxlab bench "$CFG" --device cuda --only "$f" --steps 1 --warmup 0 --no-graphs > "$OUT/ncu_$f.out" 2>&1
    echo "ncu $f: rc $? $(wc -l < "$OUT/ncu_$f.csv") lines"
  done
done
