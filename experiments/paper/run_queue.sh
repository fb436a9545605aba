#!/usr/bin/env bash
# Many one-run shards over the GPUs of one machine as they free up, under a deadline, resumable
# across calls: each GPU takes the next item that is neither done nor taken in this call and runs it
# through experiments/paper/run_why_mx.sh on that GPU alone; what an item brings back lands in
# OUTDIR (summary_*, blocks_*, ... as run_why_mx.sh names them; its logs as logs_TAG.tgz).
#   bash experiments/paper/run_queue.sh OUTDIR DEADLINE_S ITEM [ITEM ...]
#   ITEM = EXP=SHARD/N, e.g. why_mx_e2=31/40 (with N = the sweep's size, one seed per item)
# e.g. bash experiments/paper/run_queue.sh $OUT 570 $(for k in $(seq 31 39); do echo why_mx_e2=$k/40; done)
# An item is done once run_why_mx.sh brought back its loss blocks (a finished run); the marker
# runs/queue/EXP_SHARDofN stays in runs/ (git-ignored), so the same command on the same machine
# skips it. An item cut by the deadline resumes from its checkpoints when the command runs again
# there. No item starts with less than MXLAB_QUEUE_MIN_LEFT seconds left (default 160, at least 136: a run
# should be able to finish; set it lower when the next call resumes it anyway). MXLAB_GPUS=0,1
# uses only those GPUs; otherwise every GPU nvidia-smi lists. A GPU named twice takes two items at
# a time (MXLAB_GPUS=0,0,1,1: measured on 4 x H200, two E2 seeds on one GPU took 281-284 s where one
# took 164, 1.16x the throughput; but two paper-emulator seeds on one GPU trained at 0.90x the
# throughput of one, and two E3 runs on one H100 took 168-172 s where one took 77-79 s, 0.93x:
# measure it on the study's own items first; kernels/PERF.md, "Two runs on one GPU"). An item's
# length is learnt on the machine: each done item's seconds from start to done are kept per
# experiment (runs/queue/EXP.seconds, the longest seen; EXP.sharedN.seconds for items that shared
# their GPU with N - 1 others, and until one is learnt, N x the length alone), and once an
# experiment has one, its items start only with at least that + 75 s left (run_why_mx.sh keeps 75 s for what
# follows the training), so a short item later in the list takes the time a long one could not
# use. Before a machine has learnt an experiment's length, the length measured on earlier machines
# stands in for it: experiments/paper/queue_seconds.txt, lines "EXP SECONDS" (# starts a comment),
# so that the first item of a long experiment does not start in a last call's final minutes.
# MXLAB_QUEUE_RESUME=1 drops that rule (MIN_LEFT alone): for a call the next call on the same
# warm machine follows, which resumes an item cut here from its checkpoints (list the cut items
# first there), so no GPU idles through the end of a call; leave it off in a session's last call.
# MXLAB_QUEUE_KEEP=1 keeps each item's
# run_why_mx.sh output in /tmp/run_queue.*/TAG/log (an unfinished item's last lines are printed).
set -uo pipefail
OUT=${1:?usage: run_queue.sh OUTDIR DEADLINE_S EXP=SHARD/N ...}
DEADLINE=${2:?usage: run_queue.sh OUTDIR DEADLINE_S EXP=SHARD/N ...}
shift 2
[ $# -gt 0 ] || { echo "run_queue.sh: no items (EXP=SHARD/N ...)" >&2; exit 2; }
for it in "$@"; do
  case "$it" in
    *=*/*) [ -f "experiments/paper/${it%%=*}.yaml" ] || { echo "run_queue.sh: no experiments/paper/${it%%=*}.yaml (item $it)" >&2; exit 2; } ;;
    *) echo "run_queue.sh: '$it' is not EXP=SHARD/N" >&2; exit 2 ;;
  esac
done
T0=$(date +%s)
MIN_LEFT=${MXLAB_QUEUE_MIN_LEFT:-160}
# run_why_mx.sh keeps 75 s for what follows the training and trains only with more than 60 s
# beyond that: an item started with less would be claimed, skipped and reported as unfinished.
if [ "$MIN_LEFT" -lt 136 ]; then
  echo "run_queue: MXLAB_QUEUE_MIN_LEFT=$MIN_LEFT raised to 136 (run_why_mx.sh skips a shard with less)"
  MIN_LEFT=136
fi
HERE=$(cd "$(dirname "$0")" && pwd)
CLAIMS=$(mktemp -d /tmp/run_queue.XXXXXX)
trap '[ -n "${MXLAB_QUEUE_KEEP:-}" ] || rm -rf "$CLAIMS"' EXIT
mkdir -p "$OUT" runs/queue
if [ -n "${MXLAB_GPUS:-}" ]; then
  IFS=, read -r -a GPUS <<< "$MXLAB_GPUS"
else
  mapfile -t GPUS < <(seq 0 $(( $(nvidia-smi -L | grep -c '^GPU') - 1 )))
fi
tag_of() { local s=${1#*=}; echo "${1%%=*}_${s/\//of}"; }  # run_why_mx.sh's name of the shard
# how many workers GPU $1 has (MXLAB_GPUS=0,0,1: GPU 0 has two)
uses_of() { local x n=0; for x in "${GPUS[@]}"; do [ "$x" = "$1" ] && n=$(( n + 1 )); done; echo "$n"; }
# the learnt seconds of ITEM's experiment on a GPU with USES workers: runs/queue/EXP.seconds for a
# GPU of its own, EXP.sharedN.seconds for one of N workers (an item that shares its GPU takes about
# N times as long, which must not hold back a later call that gives each item a GPU of its own)
suffix_of() { [ "${1:-1}" -le 1 ] || echo ".shared$1"; }
learnt_of() { local f="runs/queue/${1%%=*}$(suffix_of "${2:-1}").seconds"; if [ -s "$f" ]; then cat "$f"; else echo 0; fi; }
# what this machine learnt at USES workers a GPU; else, sharing a GPU, USES x the length alone; else
# what earlier machines measured alone (queue_seconds.txt); else 0
seconds_of() {
  local s p n=${2:-1}
  s=$(learnt_of "$1" "$n")
  if [ "$s" -eq 0 ] && [ "$n" -gt 1 ]; then
    s=$(( $(seconds_of "$1" 1) * n ))
  elif [ "$s" -eq 0 ] && [ -f experiments/paper/queue_seconds.txt ]; then
    p=$(sed 's/#.*//' experiments/paper/queue_seconds.txt | awk -v e="${1%%=*}" '$1 == e && $2 ~ /^[0-9]+$/ {print $2; exit}')
    [ -z "$p" ] || s=$p
  fi
  echo "$s"
}
worker() {
  local g=$1 it tag left took t_start uses
  uses=$(uses_of "$g")
  for it in "${ITEMS[@]}"; do
    tag=$(tag_of "$it")
    [ -e "runs/queue/$tag" ] && continue
    left=$(( DEADLINE - ($(date +%s) - T0) ))
    [ "$left" -ge "$MIN_LEFT" ] || break
    took=$(seconds_of "$it" "$uses")
    [ -n "${MXLAB_QUEUE_RESUME:-}" ] || [ "$took" -eq 0 ] || [ "$left" -ge $(( took + 75 )) ] || continue
    mkdir "$CLAIMS/$tag" 2> /dev/null || continue
    echo "[$(( $(date +%s) - T0 )) s] GPU $g: $it"
    t_start=$(date +%s)
    MXLAB_GPUS=$g bash "$HERE/run_why_mx.sh" "$OUT/.item_$tag" "$left" "$it" > "$CLAIMS/$tag/log" 2>&1
    if [ -e "$OUT/.item_$tag/blocks_$tag.csv" ]; then
      touch "runs/queue/$tag"
      took=$(( $(date +%s) - t_start ))
      # the longest seen (workers may race; either value is one an item of it took here)
      [ "$took" -le "$(learnt_of "$it" "$uses")" ] || echo "$took" > "runs/queue/${it%%=*}$(suffix_of "$uses").seconds"
    fi
    [ -e "$OUT/.item_$tag/logs.tgz" ] && mv "$OUT/.item_$tag/logs.tgz" "$OUT/logs_$tag.tgz"
    mv "$OUT/.item_$tag"/* "$OUT"/ 2> /dev/null
    rmdir "$OUT/.item_$tag" 2> /dev/null
    if [ -e "runs/queue/$tag" ]; then
      echo "[$(( $(date +%s) - T0 )) s] GPU $g: $it done"
    else
      # an extractor that failed by itself (not killed at the deadline: exit 137) fails the same way
      # on every retry until it is fixed: say so, rather than "resumes"
      failed=$(grep -E ": extract [a-z]+: exit [0-9]+ after" "$CLAIMS/$tag/log" | grep -vE ": exit (0|137) after" | head -1)
      if [ -n "$failed" ]; then
        echo "[$(( $(date +%s) - T0 )) s] GPU $g: $it not finished: its training ended, but an extractor failed" \
             "(${failed#*: extract }): the next call extracts again, and fails again until that is fixed; its log ends:"
      else
        echo "[$(( $(date +%s) - T0 )) s] GPU $g: $it not finished (resumes from its checkpoints next time); its log ends:"
      fi
      tail -4 "$CLAIMS/$tag/log" | sed 's/^/    /'
    fi
  done
}
ITEMS=("$@")
pids=()
for g in "${GPUS[@]}"; do worker "$g" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
n_done=0
for it in "${ITEMS[@]}"; do [ -e "runs/queue/$(tag_of "$it")" ] && n_done=$(( n_done + 1 )); done
for exp in $(printf '%s\n' "${ITEMS[@]}" | sed 's/=.*//' | sort -u); do
  [ "$(learnt_of "$exp=")" -eq 0 ] || echo "run_queue: an item of $exp took up to $(learnt_of "$exp=") s here"
  for n in $(printf '%s\n' "${GPUS[@]}" | sort | uniq -c | awk '$1 > 1 {print $1}' | sort -u); do
    [ "$(learnt_of "$exp=" "$n")" -eq 0 ] ||
      echo "run_queue: an item of $exp took up to $(learnt_of "$exp=" "$n") s here on a GPU shared by $n items"
  done
done
echo "run_queue: $n_done of ${#ITEMS[@]} items done after $(( $(date +%s) - T0 )) s"
