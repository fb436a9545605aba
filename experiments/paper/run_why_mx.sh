#!/usr/bin/env bash
# One device call of the causal study (results/prereg/why_mx.md): optionally build and run the
# GPU tests, then train a shard of one experiment's seeds over the GPUs under a deadline, and
# bring back what the analysis needs (only runs that finished count: run files stay behind).
#   bash experiments/paper/run_why_mx.sh OUTDIR DEADLINE_S [build] [gputests] EXP=SHARD/N ...
# Without `build`, the binaries are .devbin/ when carried (bench/pack_devbin.sh), else build/.
# A shard stopped by the deadline resumes from its checkpoints when the same command runs again
# on the same warm machine (runs/ is git-ignored and stays there).
# e.g. bash experiments/paper/run_why_mx.sh $OUT 570 build gputests why_mx_e1=0/20
# EXP names experiments/paper/EXP.yaml; SHARD/N is mxlab run's --shard (run k of the sweep is in
# shard k mod N). Each shard runs with --gpus over every visible GPU (one run per GPU at a time);
# its training is stopped 75 s before the deadline (SIGTERM: the run checkpoints and is marked
# interrupted) so that the summaries are still written. Back in OUTDIR:
#   summary_EXP_SHARDofN.csv   mxlab summarize --csv of the shard's finished runs
#   blocks_EXP_SHARDofN.csv    results/extract_loss_blocks.py, blocks of 100 steps (the endpoint's input)
#   logs.tgz                   build, GPU-test and training logs, nvidia-smi
set -uo pipefail
OUT=${1:?usage: run_why_mx.sh OUTDIR DEADLINE_S [build] [gputests] EXP=SHARD/N ...}
DEADLINE=${2:?usage: run_why_mx.sh OUTDIR DEADLINE_S [build] [gputests] EXP=SHARD/N ...}
shift 2
T0=$(date +%s)
LOGS=/tmp/why_mx_logs
mkdir -p "$OUT" "$LOGS" runs
nvidia-smi -L | tee "$LOGS/device.txt"
NGPU=$(nvidia-smi -L | grep -c '^GPU')
GPUS=$(seq -s, 0 $((NGPU - 1)))
BIN=build/mxlab
TESTS=build/mxlab_gpu_tests
# Binaries packed on the development machine (bench/pack_devbin.sh; carry .devbin): no build here.
if [ -x .devbin/mxlab ]; then
  BIN=.devbin/mxlab; TESTS=.devbin/mxlab_gpu_tests
  echo "using .devbin (revision $(head -c 12 .devbin/REVISION 2>/dev/null || echo unknown))"
fi
pack() { tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null; }
trap pack EXIT
for step in "$@"; do
  left=$(( DEADLINE - ($(date +%s) - T0) ))
  echo "== $step ($left s left)"
  case "$step" in
    build)
      cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > "$LOGS/cmake.log" 2>&1 || { tail -30 "$LOGS/cmake.log"; exit 1; }
      ninja -C build -j16 mxlab mxlab_gpu_tests > "$LOGS/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$LOGS/build.log"; exit 1; }
      echo "built in $(( $(date +%s) - T0 )) s"
      BIN=build/mxlab; TESTS=build/mxlab_gpu_tests
      ;;
    gputests)
      "$TESTS" --gtest_brief=1 > "$LOGS/gpu_tests.log" 2>&1
      echo "gpu tests exit $?"
      grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED TEST|tests ran" "$LOGS/gpu_tests.log" | head -30
      ;;
    *=*/*)
      exp=${step%%=*}; shard=${step#*=}; tag="${exp}_${shard/\//of}"
      [ -f "experiments/paper/$exp.yaml" ] || { echo "no experiments/paper/$exp.yaml"; exit 2; }
      budget=$(( left - 75 ))
      [ "$budget" -gt 60 ] || { echo "skipping $step: $left s left"; continue; }
      echo "training $exp shard $shard on GPUs $GPUS for at most $budget s"
      timeout -s TERM "$budget" "$BIN" run "experiments/paper/$exp.yaml" --gpus "$GPUS" --shard "$shard" \
        --out "runs/$tag" > "$LOGS/train_$tag.log" 2>&1
      echo "mxlab run exit $? after $(( $(date +%s) - T0 )) s"; tail -5 "$LOGS/train_$tag.log"
      "$BIN" summarize "runs/$tag" --csv > "$OUT/summary_$tag.csv" 2> "$LOGS/summarize_$tag.err"
      mapfile -t done_runs < <(python3 - "runs/$tag" <<'PY'
import glob, sys, h5py
for p in sorted(glob.glob(sys.argv[1] + "/*.h5")):
    try:
        with h5py.File(p, "r") as f:
            s = f.attrs.get("status", b"")
            s = s.decode() if isinstance(s, bytes) else str(s)
            if s in ("complete", "diverged"):
                print(p)
    except OSError:
        pass
PY
)
      echo "finished runs: ${#done_runs[@]}"
      if [ "${#done_runs[@]}" -gt 0 ]; then
        python3 results/extract_loss_blocks.py "$OUT/blocks_$tag.csv" 100 "${done_runs[@]}"
      fi
      ;;
    *) echo "unknown step '$step'"; exit 2 ;;
  esac
done
