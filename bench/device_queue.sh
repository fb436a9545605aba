#!/usr/bin/env bash
# Part-M shards queued per GPU in one device call, one GPU per queue, each shard with its own work
# directory, under one deadline; everything they made comes back as one file (the device tool
# returns at most 8):
#   bash bench/device_queue.sh OUTDIR DEADLINE_S GPU=STUDY:SHARD[,STUDY:SHARD...] [GPU=...]
# e.g. (4 GPUs, the third session of 2026-11-26 ran its shards this way):
#   bash bench/device_queue.sh $OUT 565 0=fresh_seeds_20k:9 1=code_faithful_20k:4 2=code_faithful_20k:5
# Each shard is `CUDA_VISIBLE_DEVICES=GPU MXLAB_SHARD=SHARD/$MXLAB_QUEUE_SHARDS MXLAB_GPUS=0
# MXLAB_JOBS=$MXLAB_QUEUE_JOBS MXLAB_M_STUDIES=STUDY bash bench/device_parts.sh DIR LEFT M` with
# MXLAB_PARTS_WORK=$WORK/w_STUDY_SHARD (STUDY: fresh_seeds_20k or code_faithful_20k; shards of
# 10 by default; 4 runs at once by default: a shard's 4 runs, all on its GPU). The shards of one
# queue run one after another; a shard that would start with less than MXLAB_QUEUE_MIN_S (200)
# seconds left is skipped and said so, and one that runs out of time stops its training 60 s
# before the deadline, writes its summaries (device_parts.sh), and resumes from its run files in
# a later call on the same warm machine. The parts run with MXLAB_PART_BIN when set (e.g.
# .devref/mxlab), else device_parts.sh's own choice. OUTDIR/queue.tgz holds every shard's
# part_M.tgz and logs.tgz (DIR = STUDY_SHARD/) and each queue's log (queue_gpuGPU.log).
set -uo pipefail
OUT=${1:?usage: device_queue.sh OUTDIR DEADLINE_S GPU=STUDY:SHARD[,STUDY:SHARD...] ...}
DEADLINE=${2:?usage: device_queue.sh OUTDIR DEADLINE_S GPU=STUDY:SHARD[,...] ...}
shift 2
[ $# -gt 0 ] || { echo "device_queue.sh: no queue (GPU=STUDY:SHARD[,STUDY:SHARD...])" >&2; exit 2; }
T0=$(date +%s)
WORK=${MXLAB_QUEUE_WORK:-/tmp/mxlab_queue}
SHARDS=${MXLAB_QUEUE_SHARDS:-10}
JOBS=${MXLAB_QUEUE_JOBS:-4}
MIN=${MXLAB_QUEUE_MIN_S:-200}
for q in "$@"; do
  case "$q" in
    *=*:*) ;;
    *) echo "device_queue.sh: '$q' is not GPU=STUDY:SHARD[,STUDY:SHARD...]" >&2; exit 2 ;;
  esac
  for item in $(echo "${q#*=}" | tr ',' ' '); do
    case "${item%%:*}" in fresh_seeds_20k|code_faithful_20k) ;;
      *) echo "device_queue.sh: unknown study '${item%%:*}' in '$q'" >&2; exit 2 ;; esac
  done
done
mkdir -p "$OUT" "$WORK/out"
pids=()
for q in "$@"; do
  g=${q%%=*}
  (
    for item in $(echo "${q#*=}" | tr ',' ' '); do
      st=${item%%:*}
      sh=${item##*:}
      left=$(( DEADLINE - ($(date +%s) - T0) ))
      if [ "$left" -lt "$MIN" ]; then echo "== GPU $g: $st shard $sh skipped: $left s left (< $MIN)"; continue; fi
      echo "== GPU $g: $st shard $sh/$SHARDS, $left s left"
      CUDA_VISIBLE_DEVICES=$g MXLAB_PARTS_WORK="$WORK/w_${st}_$sh" MXLAB_SHARD="$sh/$SHARDS" MXLAB_GPUS=0 \
        MXLAB_JOBS="$JOBS" MXLAB_M_STUDIES="$st" bash bench/device_parts.sh "$WORK/out/${st}_$sh" "$left" M
    done > "$WORK/out/queue_gpu$g.log" 2>&1
  ) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
for f in "$WORK"/out/queue_gpu*.log; do
  echo "-- $(basename "$f")"
  grep -E "^== GPU|^part M:|runs?: " "$f"
done
tar czf "$OUT/queue.tgz" -C "$WORK" out
echo "== done at $(( $(date +%s) - T0 )) s: $OUT/queue.tgz"
