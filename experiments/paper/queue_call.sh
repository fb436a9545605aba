#!/usr/bin/env bash
# One device call of a study's queue, as the causal and the flash studies ran theirs: the GPU tests
# once per machine (beside the queue, on GPU 0), then experiments/paper/run_queue.sh over the
# items under the deadline, and everything the items brought back as one file, OUTDIR/q.tgz, for
# results/ingest_queue.py on the development machine (the device tool returns few files):
#   bash experiments/paper/queue_call.sh OUTDIR DEADLINE_S [--gputests] [--last] ITEM [ITEM ...]
# e.g. (carry .devbin from bench/pack_devbin.sh --compact; chain calls on one warm machine):
#   bash experiments/paper/queue_call.sh $OUT 575 --gputests $(for k in $(seq 0 39); do echo why_mx_e4=$k/40; done)
#   --gputests  run .devbin/mxlab_gpu_tests (else build/mxlab_gpu_tests) with CUDA_VISIBLE_DEVICES=0 at
#               the same time as the queue, unless this machine ran them already (the marker
#               runs/queue/gputests.done, kept on a warm machine as run_queue.sh's are): its log in
#               OUTDIR/gpu_tests.log, its result line printed at the end
#   --last      the session's last call: run_queue.sh without MXLAB_QUEUE_RESUME, so an item starts
#               only when the time it took on this machine fits (no item is left half-done on a
#               machine that is given back); without it MXLAB_QUEUE_RESUME=1 (the next call on the
#               same warm machine resumes a cut item from its checkpoints; list the items in the
#               same order there, so that cut items come first)
# MXLAB_QUEUE_MIN_LEFT defaults to 136 here (the least run_why_mx.sh trains with). Items: run_queue.sh's
# EXP=SHARD/N. OUTDIR holds q.tgz (folder q/: summary_*, blocks_*, ..., logs_*.tgz of the items),
# queue.log (run_queue.sh's output) and gpu_tests.log.
set -uo pipefail
OUT=${1:?usage: queue_call.sh OUTDIR DEADLINE_S [--gputests] [--last] ITEM ...}
DEADLINE=${2:?usage: queue_call.sh OUTDIR DEADLINE_S [--gputests] [--last] ITEM ...}
shift 2
T0=$(date +%s)
GPUTESTS=""
LAST=""
ITEMS=()
for a in "$@"; do
  case "$a" in
    --gputests) GPUTESTS=1 ;;
    --last) LAST=1 ;;
    -*) echo "queue_call.sh: unknown option $a" >&2; exit 2 ;;
    *) ITEMS+=("$a") ;;
  esac
done
[ "${#ITEMS[@]}" -gt 0 ] || { echo "queue_call.sh: no items (EXP=SHARD/N ...)" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT/q" runs/queue
nvidia-smi -L
TESTS=build/mxlab_gpu_tests
[ -x .devbin/mxlab_gpu_tests ] && TESTS=.devbin/mxlab_gpu_tests
gt_pid=""
if [ -n "$GPUTESTS" ]; then
  if [ -e runs/queue/gputests.done ]; then
    echo "gpu tests: ran on this machine already ($(cat runs/queue/gputests.done))"
  elif [ ! -x "$TESTS" ]; then
    echo "gpu tests: no $TESTS (bench/pack_devbin.sh, or build it)"
  else
    ( CUDA_VISIBLE_DEVICES=0 timeout 500 "$TESTS" --gtest_brief=1 > "$OUT/gpu_tests.log" 2>&1
      rc=$?
      echo "gpu tests ($TESTS) exit $rc after $(( $(date +%s) - T0 )) s" >> "$OUT/gpu_tests.log"
      [ "$rc" -eq 0 ] && echo "$TESTS, exit 0" > runs/queue/gputests.done ) &
    gt_pid=$!
  fi
fi
export MXLAB_QUEUE_MIN_LEFT=${MXLAB_QUEUE_MIN_LEFT:-136}
if [ -n "$LAST" ]; then
  unset MXLAB_QUEUE_RESUME
  echo "queue_call: last call: an item starts only when the time it took here fits"
else
  export MXLAB_QUEUE_RESUME=1
  echo "queue_call: MXLAB_QUEUE_RESUME=1: an item cut here resumes in the next call on this machine"
fi
left=$(( DEADLINE - ($(date +%s) - T0) ))
bash "$HERE/run_queue.sh" "$OUT/q" "$left" "${ITEMS[@]}" 2>&1 | tee "$OUT/queue.log"
if [ -n "$gt_pid" ]; then
  wait "$gt_pid"
  tail -1 "$OUT/gpu_tests.log"
  grep -E "^\[  (PASSED|FAILED)|FAILED TEST|tests ran" "$OUT/gpu_tests.log" | head -20
fi
tar czf "$OUT/q.tgz" -C "$OUT" q && rm -rf "$OUT/q"
echo "queue_call: $OUT/q.tgz ($(du -k "$OUT/q.tgz" | cut -f1) KiB) after $(( $(date +%s) - T0 )) s"
