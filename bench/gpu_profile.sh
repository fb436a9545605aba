#!/usr/bin/env bash
# Per-kernel device times of one eager step (Nsight Compute, clocks as found, caches flushed
# between kernels: an upper bound for memory-bound kernels), for the breakdown in
# kernels/PERF.md. Usage: bash bench/gpu_profile.sh OUTDIR [FIGURE...] (after
# bench/gpu_check.sh built ./build, or with .devbin carried). Writes OUTDIR/ncu_<figure>.txt
# (summary, then each launch).
#   FIGURE: fp32, mx, shadow, data, paired (mxlab bench --only), or
#   gaps: the quantization-gap kernels (gap_*) of 3 logged paired steps with the shadow every step
#         (mxlab bench --log-steps 3; only those kernels are profiled), to split the logged step's
#         "clamp debt" phase into kernel time and the rest (launches, synchronisations, reads).
#   gapsfull: Nsight Compute's full set (issue and stall reasons, occupancy, memory) on two launches
#         of gap_one_pass_kernel: the MX trajectory's first two weights of the first logged step
#         (per logged step 32 launches: the FP32 trajectory's 16, then the MX one's γ ×4, β ×4, W ×8);
#         OUTDIR/ncu_gapsfull.txt is ncu's details page (no per-launch summary).
#   arms: where an extra recipe arm's time goes (bench --only data --arms K, K = MXLAB_PROFILE_ARMS,
#         default 8, against --arms 1, MXLAB_PROFILE_STEPS timed steps, default 20, after the 3
#         warm-up steps CUDA graphs need and the bench's logged step 0; graphs on):
#         OUTDIR/ncu_arms.txt, per kernel the serialized device time an extra arm adds per step,
#         beside the wall-clock per-extra-arm cost the same bench measured without the profiler
#         (OUTDIR/bench_arms.txt); bench/ncu_arms.py. Both logs kept, OUTDIR/ncu_arms{K,1}.csv.gz.
#         The profiled steps mix step kinds unlike the bench's timed ones (one logged step in N + 4,
#         shadow steps every bias_every, against the bench's 200 unlogged steps): the fewer the steps,
#         the more the logged step's kernels (FP32 SGEMMs, gap_*, reductions) weigh.
#   ewfull: Nsight Compute's full set on the first launch of each element-wise kernel of the MX
#         step (activation forward/backward with their producer quantization, layernorm forward
#         and backward, column partials, residual add, Adam) and of the FP32 step (activation
#         forward/backward): throughput, occupancy, issue and stall reasons, to say what bounds
#         each. OUTDIR/ncu_ewfull.txt is the details pages; the key lines are printed.
#         MXLAB_EWFULL_MATCH=REGEX profiles only the kernels whose name pattern matches (e.g. ln_).
# MXLAB_PROFILE_BIN=PATH profiles another binary (e.g. .devref/mxlab, a baseline).
set -uo pipefail
OUT=${1:?usage: gpu_profile.sh OUTDIR [FIGURE...]}
shift
CFG=experiments/paper/fig4_baseline.yaml
BIN=./build/mxlab
[ -x .devbin/mxlab ] && BIN=.devbin/mxlab
BIN=${MXLAB_PROFILE_BIN:-$BIN}
mkdir -p "$OUT"
TMP=$(mktemp -d)
for f in "${@:-mx}"; do
  if [ "$f" = ewfull ]; then
    : > "$OUT/ncu_$f.txt"
    # "FIGURE SKIP REGEX": the FP32 activation forward skips 4 launches (the teacher's, if the
    # figure generates its data first; else the first step's), hence --steps 2.
    for spec in "mx 0 ew_produce_kernel.*ActFwdOp" "mx 0 ew_produce_kernel.*ActBwdOp" "mx 0 ln_fwd" \
                "mx 0 ln_bwd" "mx 0 col_partial_kernel" "mx 0 ew_kernel.*ResidualOp" "mx 0 adam_kernel" \
                "fp32 4 ew_kernel.*ActFwdOp" "fp32 0 ew_kernel.*ActBwdOp"; do
      read -r only skip name <<< "$spec"
      [[ "$name" =~ ${MXLAB_EWFULL_MATCH:-.} ]] || continue
      echo "=== $only: $name (skip $skip)" >> "$OUT/ncu_$f.txt"
      ncu --clock-control none --set full --kernel-name-base demangled --kernel-name "regex:$name" \
        --launch-skip "$skip" --launch-count 1 "$BIN" bench "$CFG" --device cuda --only "$only" --steps 2 --warmup 0 \
        --no-graphs >> "$OUT/ncu_$f.txt" 2> "$TMP/ncu_$f.err"
      echo "ncu $f $only $name: rc $?"
    done
    grep -E "^=== |^  [a-z_]+.*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Executed Ipc Active|No Eligible" "$OUT/ncu_$f.txt" | head -150
    continue
  fi
  if [ "$f" = arms ]; then
    # Where an extra recipe arm's time goes: the same bench with --arms K and with --arms 1 under
    # ncu (durations only, caches not flushed, CUDA graphs' kernel nodes one at a time), their
    # difference per kernel per extra arm-step (bench/ncu_arms.py), beside the per-extra-arm cost
    # the same bench measures without the profiler first.
    K=${MXLAB_PROFILE_ARMS:-8}; N=${MXLAB_PROFILE_STEPS:-20}
    "$BIN" bench "$CFG" --device cuda --only data --arms "$K" > "$OUT/bench_arms.txt" 2>&1
    echo "bench --arms $K: rc $?"; grep "per extra arm" "$OUT/bench_arms.txt"
    for k in "$K" 1; do
      ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        --log-file "$TMP/ncu_arms$k.csv" "$BIN" bench "$CFG" --device cuda --only data --arms "$k" --steps "$N" \
        --warmup 3 > "$TMP/ncu_arms$k.out" 2>&1
      rc=$?
      echo "ncu arms $k: rc $rc"
      if [ "$rc" -ne 0 ]; then tail -20 "$TMP/ncu_arms$k.out"; cp "$TMP/ncu_arms$k.out" "$OUT/"; fi
      gzip -c "$TMP/ncu_arms$k.csv" > "$OUT/ncu_arms$k.csv.gz" 2> /dev/null
    done
    # bench's trainer figure runs 1 + warm-up + N steps (step 0 logs; graphs need a warm-up of 3)
    python3 bench/ncu_arms.py "$TMP/ncu_arms$K.csv" "$TMP/ncu_arms1.csv" --arms "$K" --steps $(( N + 4 )) \
      --bench "$OUT/bench_arms.txt" > "$OUT/ncu_arms.txt"
    echo "ncu_arms: rc $?"; head -40 "$OUT/ncu_arms.txt"
    continue
  fi
  if [ "$f" = gapsfull ]; then
    ncu --clock-control none --set full --kernel-name regex:gap_one_pass --launch-skip 24 --launch-count 2 \
      --log-file "$OUT/ncu_$f.txt" \
      "$BIN" bench "$CFG" --device cuda --only data --steps 1 --warmup 3 --set log.bias_every=1 --log-steps 3 \
      > "$TMP/ncu_$f.out" 2>&1
    rc=$?
    echo "ncu $f: rc $rc"
    if [ "$rc" -ne 0 ]; then tail -20 "$TMP/ncu_$f.out"; cp "$TMP/ncu_$f.out" "$OUT/ncu_$f.out"; fi
    grep -E "Duration|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|Stall" "$OUT/ncu_$f.txt" | head -30
    continue
  elif [ "$f" = gaps ]; then
    ncu --clock-control none --kernel-name regex:gap_ --metrics gpu__time_duration.sum --csv --log-file "$TMP/ncu_$f.csv" \
      "$BIN" bench "$CFG" --device cuda --only data --steps 1 --warmup 3 --set log.bias_every=1 --log-steps 3 \
      > "$TMP/ncu_$f.out" 2>&1
  else
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$TMP/ncu_$f.csv" \
      "$BIN" bench "$CFG" --device cuda --only "$f" --steps 1 --warmup 0 --no-graphs > "$TMP/ncu_$f.out" 2>&1
  fi
  rc=$?
  echo "ncu $f: rc $rc"
  # A failed profile says why (ncu's or mxlab's own error), and keeps the whole output.
  if [ "$rc" -ne 0 ]; then tail -20 "$TMP/ncu_$f.out"; cp "$TMP/ncu_$f.out" "$OUT/ncu_$f.out"; fi
  python3 bench/ncu_summary.py "$TMP/ncu_$f.csv" seq > "$OUT/ncu_$f.txt"
  head -30 "$OUT/ncu_$f.txt"
done
