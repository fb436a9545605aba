#!/usr/bin/env bash
# One device call of the causal study (results/prereg/why_mx.md): optionally build and run the
# GPU tests, then train a shard of one experiment's seeds over the GPUs under a deadline, and
# bring back what the analysis needs (only runs that finished count: run files stay behind).
#   bash experiments/paper/run_why_mx.sh OUTDIR DEADLINE_S [build] [gputests] EXP=SHARD/N ...
# Without `build`, the binaries are .devbin/ when carried (bench/pack_devbin.sh), else build/;
# MXLAB_BIN=PATH trains with that mxlab instead (the GPU tests still run .devbin's or build's).
# A shard stopped by the deadline resumes from its checkpoints when the same command runs again
# on the same warm machine (runs/ is git-ignored and stays there).
# e.g. bash experiments/paper/run_why_mx.sh $OUT 570 build gputests why_mx_e1=0/20
# EXP names experiments/paper/EXP.yaml; SHARD/N is mxlab run's --shard (run k of the sweep is in
# shard k mod N). The EXP=SHARD/N steps train at the same time, the visible GPUs dealt out among
# them (with 4 GPUs and two shards of two seeds each, every GPU trains one seed; one run per GPU
# at a time). Training is stopped 75 s before the deadline (SIGTERM: the run checkpoints and is
# marked interrupted) so that the summaries are still written. Other steps (build, gputests,
# digest) run first, in the order given. MXLAB_GPUS=0,1 deals only those GPUs (another job may use
# the rest of the machine in the same call). Back in OUTDIR:
#   summary_EXP_SHARDofN.csv   mxlab summarize --csv of the shard's finished runs
#   blocks_EXP_SHARDofN.csv    results/extract_loss_blocks.py, blocks of 100 steps (the endpoint's input;
#                              branches too, from their `at`)
#   branchpoints_EXP_SHARDofN.csv  results/extract_branchpoints.py, only for runs with branches (E2):
#                              at each branch point the parent's and the branch's curvature and Adam
#                              v's quantiles from the parent's snapshot (descriptive)
#   instruments_EXP_SHARDofN.csv.gz  results/extract_flash_instruments.py, attention networks only (the
#                              flash study): the per-layer flash instruments of every logged step
#   spectral_EXP_SHARDofN.csv.gz     results/extract_spectral.py, attention networks only: spectral norms
#                              of W_Q, W_K, W_V, W_O and of their error against FP32 at every snapshot
#   logs.tgz                   build, GPU-test and training logs, nvidia-smi
#   digest_paper200.txt        (step `digest`) bench/dataset_digest.py of a 200-step CUDA run of
#                              experiments/paper/fig4_baseline.yaml: the bit-for-bit reference of a
#                              refactor (compare with the same step run on the new code)
set -uo pipefail
OUT=${1:?usage: run_why_mx.sh OUTDIR DEADLINE_S [build] [gputests] EXP=SHARD/N ...}
DEADLINE=${2:?usage: run_why_mx.sh OUTDIR DEADLINE_S [build] [gputests] EXP=SHARD/N ...}
shift 2
T0=$(date +%s)
LOGS=/tmp/why_mx_logs_$$
mkdir -p "$OUT" "$LOGS" runs
nvidia-smi -L | tee "$LOGS/device.txt"
if [ -n "${MXLAB_GPUS:-}" ]; then
  IFS=, read -r -a GPU_IDS <<< "$MXLAB_GPUS"
else
  mapfile -t GPU_IDS < <(seq 0 $(( $(nvidia-smi -L | grep -c '^GPU') - 1 )))
fi
NGPU=${#GPU_IDS[@]}
BIN=build/mxlab
TESTS=build/mxlab_gpu_tests
# Binaries packed on the development machine (bench/pack_devbin.sh; carry .devbin): no build here.
if [ -x .devbin/mxlab ]; then
  BIN=.devbin/mxlab; TESTS=.devbin/mxlab_gpu_tests
  echo "using .devbin (revision $(head -c 12 .devbin/REVISION 2>/dev/null || echo unknown))"
fi
# MXLAB_BIN=PATH trains with another mxlab than .devbin's or build's (e.g. .devref/mxlab, main's
# binary, while .devbin holds a branch whose GPU tests and benchmarks run in the same call).
if [ -n "${MXLAB_BIN:-}" ]; then
  [ -x "$MXLAB_BIN" ] || { echo "run_why_mx.sh: MXLAB_BIN=$MXLAB_BIN is not an executable" >&2; exit 2; }
  BIN=$MXLAB_BIN
  echo "training with $BIN (MXLAB_BIN)"
fi
pack() { tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null; }
trap pack EXIT
SHARDS=()
for step in "$@"; do
  left=$(( DEADLINE - ($(date +%s) - T0) ))
  case "$step" in *=*/*) SHARDS+=("$step"); continue ;; esac
  echo "== $step ($left s left)"
  case "$step" in
    build)
      cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > "$LOGS/cmake.log" 2>&1 || { tail -30 "$LOGS/cmake.log"; exit 1; }
      ninja -C build -j16 mxlab mxlab_gpu_tests > "$LOGS/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$LOGS/build.log"; exit 1; }
      echo "built in $(( $(date +%s) - T0 )) s"
      BIN=${MXLAB_BIN:-build/mxlab}; TESTS=build/mxlab_gpu_tests
      ;;
    gputests)
      "$TESTS" --gtest_brief=1 > "$LOGS/gpu_tests.log" 2>&1
      echo "gpu tests exit $?"
      grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED TEST|tests ran" "$LOGS/gpu_tests.log" | head -30
      ;;
    digest)
      rm -rf runs/digest_paper200
      "$BIN" run experiments/paper/fig4_baseline.yaml --device cuda --steps 200 --quiet \
        --out runs/digest_paper200 > "$LOGS/digest.log" 2>&1 || { echo "digest run failed"; tail -5 "$LOGS/digest.log"; }
      python3 bench/dataset_digest.py runs/digest_paper200/*.h5 > "$OUT/digest_paper200.txt"
      echo "digest: $(wc -l < "$OUT/digest_paper200.txt") lines, $(sha256sum < "$OUT/digest_paper200.txt" | head -c 16)"
      ;;
    *) echo "unknown step '$step'"; exit 2 ;;
  esac
done

# train_shard EXP SHARD/N GPUS BUDGET: one shard, its summary, loss blocks and branch points into OUTDIR.
train_shard() {
  local exp=$1 shard=$2 gpus=$3 budget=$4 tag="${1}_${2/\//of}"
  echo "training $exp shard $shard on GPUs $gpus for at most $budget s"
  timeout -s TERM "$budget" "$BIN" run "experiments/paper/$exp.yaml" --gpus "$gpus" --shard "$shard" \
    --out "runs/$tag" > "$LOGS/train_$tag.log" 2>&1
  echo "$tag: mxlab run exit $? after $(( $(date +%s) - T0 )) s"; tail -3 "$LOGS/train_$tag.log"
  local t=$(date +%s)
  "$BIN" summarize "runs/$tag" --csv > "$OUT/summary_$tag.csv" 2> "$LOGS/summarize_$tag.err"
  echo "$tag: summarize after $(( $(date +%s) - t )) s"
  local done_runs
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
  echo "$tag: finished runs: ${#done_runs[@]}"
  if [ "${#done_runs[@]}" -gt 0 ]; then
    # The loss blocks come last: their file says the shard is complete (run_queue.sh's done
    # marker), so every other file is in place before it. Each extractor writes under a temporary
    # name, renamed when it succeeds, and stops at the deadline (a cut shard's finished runs are
    # skipped by the next call, which extracts them again).
    extract "$tag" branchpoints "$OUT/branchpoints_$tag.csv" results/extract_branchpoints.py "${done_runs[@]}" &&
    # attention networks only (the flash study's mechanism; both write nothing for other runs)
    extract "$tag" instruments "$OUT/instruments_$tag.csv.gz" results/extract_flash_instruments.py "${done_runs[@]}" &&
    extract "$tag" spectral "$OUT/spectral_$tag.csv.gz" results/extract_spectral.py "${done_runs[@]}" &&
    extract "$tag" blocks "$OUT/blocks_$tag.csv" results/extract_loss_blocks.py 100 "${done_runs[@]}"
  fi
}
# extract TAG WHAT OUTFILE SCRIPT ARG...: python3 SCRIPT TMPFILE ARG..., renamed to OUTFILE when it exits 0
# (an extractor with nothing to write leaves no file, and none is made), timed in the log; stopped
# at the deadline. One BLAS thread each: several shards extract at once on a many-core machine,
# and the extractors' matrices (d x d) are far too small to gain from threads.
extract() {
  local tag=$1 what=$2 dest=$3 script=$4 t=$(date +%s)
  shift 4
  local left=$(( DEADLINE - (t - T0) - 5 ))
  local tmp
  tmp="$(dirname "$dest")/.tmp_$(basename "$dest")"
  [ "$left" -gt 0 ] || { echo "$tag: no time left to extract $what"; return 1; }
  rm -f "$tmp"
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout -s KILL "$left" python3 "$script" "$tmp" "$@"
  local rc=$?
  echo "$tag: extract $what: exit $rc after $(( $(date +%s) - t )) s"
  if [ "$rc" -ne 0 ]; then rm -f "$tmp"; return 1; fi
  if [ -e "$tmp" ]; then mv "$tmp" "$dest"; fi
}
if [ "${#SHARDS[@]}" -gt 0 ]; then
  left=$(( DEADLINE - ($(date +%s) - T0) ))
  budget=$(( left - 75 ))
  [ "$budget" -gt 60 ] || { echo "skipping ${SHARDS[*]}: $left s left"; exit 0; }
  for step in "${SHARDS[@]}"; do
    exp=${step%%=*}
    [ -f "experiments/paper/$exp.yaml" ] || { echo "no experiments/paper/$exp.yaml"; exit 2; }
  done
  n=${#SHARDS[@]}
  pids=()
  for k in "${!SHARDS[@]}"; do
    step=${SHARDS[$k]}
    # GPUs k, k+n, k+2n, ... of the list (every shard gets at least one: GPU k mod NGPU)
    gpus=$(for ((g = k; g < NGPU; g += n)); do echo -n "${GPU_IDS[$g]},"; done)
    gpus=${gpus%,}; [ -n "$gpus" ] || gpus=${GPU_IDS[$(( k % NGPU ))]}
    train_shard "${step%%=*}" "${step#*=}" "$gpus" "$budget" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
fi
