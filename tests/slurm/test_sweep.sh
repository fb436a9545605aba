#!/usr/bin/env bash
# experiments/slurm/sweep.sbatch under a real Slurm (a single-node cluster on this machine,
# scripts/slurm-local.sh), through the real mxlab binary:
#   1. an array of 4 tasks over a 4-run CPU sweep: every task exits 0, every run is complete and
#      reported complete exactly once, `mxlab summarize` sees all four;
#   2. the same sweep into a second directory, one array task cancelled with scancel while its
#      run is in its step loop (mxlab gets SIGTERM: checkpoint, file `interrupted`), the array
#      resubmitted: the cancelled run resumes from its checkpoint, the others are skipped, each
#      run is completed exactly once, and every run file is bit-identical (datasets and
#      attributes, apart from wall-clock times) to the uninterrupted one of part 1.
# Usage: tests/slurm/test_sweep.sh PATH/TO/mxlab   (ctest: SlurmSweep; exit 77 = skipped)
# The cluster lives in a scratch directory and is stopped on every exit, failures included.
set -euo pipefail

MXLAB=$(realpath "${1:?usage: $0 PATH/TO/mxlab}")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SBATCH_SCRIPT=$ROOT/experiments/slurm/sweep.sbatch
RUNS=4
DEADLINE_S=${MXLAB_SLURM_TEST_TIMEOUT:-150}  # per wait; four waits stay below ctest's TIMEOUT (900 s)

for b in munged slurmctld slurmd sbatch squeue scancel scontrol; do
  command -v "$b" >/dev/null || { echo "SKIP: $b not installed (scripts/install-deps.sh installs slurm-wlm and munge)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root to run slurmd"; exit 77; }

WORK=$(mktemp -d /tmp/mxlab_slurm_test_XXXXXX)
chmod 755 "$WORK"  # munged needs every folder above its socket searchable
CLUSTER=$WORK/cluster
finish() {
  local rc=$?
  "$ROOT/scripts/slurm-local.sh" stop --dir "$CLUSTER" >/dev/null 2>&1 || true
  if [ $rc -eq 0 ]; then rm -rf "$WORK"; else echo "FAILED (rc $rc); files kept in $WORK"; fi
}
trap finish EXIT
trap 'exit 143' TERM INT  # so that the EXIT trap stops the daemons on a signal too

fail() {
  echo "FAIL: $*"
  echo "---- squeue"; squeue 2>&1 || true
  for f in "$WORK"/logs*/*.out; do [ -f "$f" ] && { echo "---- $f"; cat "$f"; }; done
  for f in "$CLUSTER"/log/*.log; do [ -f "$f" ] && { echo "---- $f (tail)"; tail -n 15 "$f"; }; done
  exit 1
}

"$ROOT/scripts/slurm-local.sh" start --dir "$CLUSTER"
export SLURM_CONF=$CLUSTER/slurm.conf
export MXLAB  # the sbatch script runs $MXLAB

# Four runs of a tiny model, a few seconds each on one core: long enough to be cancelled midway.
EXP=$WORK/sweep.yaml
cat > "$EXP" <<'EOF'
name: slurm_test
steps: 3000
device: cpu
model: {depth: 1, width: 32, hidden_mult: 2}
data: {batch: 32}
log: {log_every: 25, progress: false}
checkpoint_every: 250
sweep: {seeds: [0, 1, 2, 3]}
EOF
mapfile -t IDS < <("$MXLAB" plan "$EXP" | awk '$1 ~ /^[0-9]+$/ {print $2}')
[ ${#IDS[@]} -eq $RUNS ] || fail "mxlab plan gave ${#IDS[@]} runs, expected $RUNS"

# submit LOGDIR OUT: the array job, one task per run, one CPU per task; prints the job id.
submit() {
  mkdir -p "$1"
  sbatch --parsable --array=0-$((RUNS - 1)) --cpus-per-task=1 --chdir="$ROOT" --output="$1/%A_%a.out" \
    "$SBATCH_SCRIPT" "$EXP" "$2" --quiet
}

# wait_job JOBID: until no task of it is pending or running.
wait_job() {
  local t0=$SECONDS
  while squeue -h -j "$1" 2>/dev/null | grep -q .; do
    [ $((SECONDS - t0)) -lt "$DEADLINE_S" ] || fail "job $1 still running after $DEADLINE_S s"
    sleep 0.5
  done
}

# exit_codes JOBID: "task:exit" for every array task (scontrol keeps finished jobs for MinJobAge).
exit_codes() {
  scontrol -o show job "$1" | sed -n 's/.*ArrayTaskId=\([0-9]*\).*ExitCode=\([0-9]*\):\([0-9]*\).*/\1:\2/p' | sort -n
}

# completed_count LOGDIR ID: how many task logs report the run complete.
completed_count() { cat "$1"/*.out 2>/dev/null | grep -c " $2 complete:" || true; }

status_of() { python3 -c "import h5py,sys; print(h5py.File(sys.argv[1],'r').attrs['status'])" "$1"; }

# ---- 1. a plain array sweep ----
T0=$SECONDS
OUT1=$WORK/out1
JOB1=$(submit "$WORK/logs1" "$OUT1")
wait_job "$JOB1"
codes=$(exit_codes "$JOB1")
[ "$(echo "$codes" | grep -c ':0$')" -eq $RUNS ] || fail "part 1: task exit codes: $codes"
for id in "${IDS[@]}"; do
  [ "$(completed_count "$WORK/logs1" "$id")" -eq 1 ] || fail "part 1: run $id not reported complete exactly once"
  [ "$(status_of "$OUT1/$id.h5")" = complete ] || fail "part 1: $OUT1/$id.h5 is not complete"
done
SUMMARY=$("$MXLAB" summarize "$OUT1") || fail "mxlab summarize $OUT1 failed"
for id in "${IDS[@]}"; do
  [ "$(echo "$SUMMARY" | grep -c "^$id .* complete ")" -eq 2 ] || fail "summarize does not show $id complete (fp32 and mx): $SUMMARY"
done
[ "$(tail -n +2 "$OUT1/index.csv" | wc -l)" -eq $RUNS ] || fail "index.csv does not list $RUNS runs"
echo "part 1: $RUNS array tasks, $RUNS runs complete, summarize sees them ($((SECONDS - T0)) s)"

# ---- 2. one task cancelled mid-run, the array resubmitted ----
T0=$SECONDS
OUT2=$WORK/out2
VICTIM=1
VID=${IDS[$VICTIM]}
JOB2=$(submit "$WORK/logs2" "$OUT2")
# Cancel task 1 once its run has written a checkpoint (it is then inside its step loop).
t0=$SECONDS
until compgen -G "$OUT2/$VID.step*.ckpt" >/dev/null; do
  [ $((SECONDS - t0)) -lt "$DEADLINE_S" ] || fail "run $VID never wrote a checkpoint"
  squeue -h -j "${JOB2}_$VICTIM" 2>/dev/null | grep -q . || [ ! -f "$OUT2/$VID.h5" ] || fail "task $VICTIM ended before it could be cancelled (runs too short for this machine?)"
  sleep 0.1
done
scancel "${JOB2}_$VICTIM"
wait_job "$JOB2"
VSTATUS=$(status_of "$OUT2/$VID.h5")
[ "$VSTATUS" = interrupted ] || fail "the cancelled run's file is '$VSTATUS', expected interrupted (SIGTERM: checkpoint and stop)"
grep -q "$VID interrupted" "$WORK/logs2/${JOB2}_$VICTIM.out" || fail "task $VICTIM does not report its run interrupted"
codes=$(exit_codes "$JOB2")
[ "$(echo "$codes" | grep -v "^$VICTIM:" | grep -c ':0$')" -eq $((RUNS - 1)) ] || fail "part 2: exit codes of the other tasks: $codes"

JOB3=$(submit "$WORK/logs3" "$OUT2")
wait_job "$JOB3"
codes=$(exit_codes "$JOB3")
[ "$(echo "$codes" | grep -c ':0$')" -eq $RUNS ] || fail "part 2, resubmitted: task exit codes: $codes"
grep -q "$VID complete: .*resumed from step" "$WORK/logs3/${JOB3}_$VICTIM.out" || fail "the cancelled run did not resume from its checkpoint"
for id in "${IDS[@]}"; do
  n=$(( $(completed_count "$WORK/logs2" "$id") + $(completed_count "$WORK/logs3" "$id") ))
  [ $n -eq 1 ] || fail "part 2: run $id reported complete $n times over both submissions"
done
SUMMARY=$("$MXLAB" summarize "$OUT2") || fail "mxlab summarize $OUT2 failed"
for id in "${IDS[@]}"; do
  [ "$(echo "$SUMMARY" | grep -c "^$id .* complete ")" -eq 2 ] || fail "summarize does not show $id complete: $SUMMARY"
done

# Every run file equals the uninterrupted one: datasets bit for bit (NaN == NaN), attributes.
python3 - "$OUT1" "$OUT2" "${IDS[@]}" <<'EOF' || fail "the resumed sweep differs from the uninterrupted one"
import sys
import h5py
import numpy as np

a_dir, b_dir, ids = sys.argv[1], sys.argv[2], sys.argv[3:]
skip_root = {"start_time", "end_time", "error"}
bad = []

def same_attrs(x, y, skip=()):
    kx = set(x.attrs) - set(skip)
    ky = set(y.attrs) - set(skip)
    if kx != ky:
        return False
    for k in kx:
        u, v = np.asarray(x.attrs[k]), np.asarray(y.attrs[k])
        if u.dtype.kind == "f":
            if not np.array_equal(u, v, equal_nan=True):
                return False
        elif not np.array_equal(u, v):
            return False
    return True

for rid in ids:
    with h5py.File(f"{a_dir}/{rid}.h5", "r") as a, h5py.File(f"{b_dir}/{rid}.h5", "r") as b:
        if not same_attrs(a, b, skip_root):
            bad.append(f"{rid}: root attributes")
        names = []
        a.visit(names.append)
        other = []
        b.visit(other.append)
        if sorted(names) != sorted(other):
            bad.append(f"{rid}: different objects")
            continue
        for n in names:
            x, y = a[n], b[n]
            if not same_attrs(x, y):
                bad.append(f"{rid}:{n}: attributes")
            if isinstance(x, h5py.Dataset):
                u, v = x[()], y[()]
                if u.dtype != v.dtype or u.shape != v.shape or not (
                        np.array_equal(u, v, equal_nan=True) if u.dtype.kind == "f" else np.array_equal(u, v)):
                    bad.append(f"{rid}:{n}: values")
print("\n".join(bad[:10]) if bad else f"{len(ids)} run files identical to the uninterrupted sweep")
sys.exit(1 if bad else 0)
EOF
echo "part 2: task $VICTIM cancelled with scancel, resubmitted, resumed; every run completed once; files identical ($((SECONDS - T0)) s)"
echo "PASS"
