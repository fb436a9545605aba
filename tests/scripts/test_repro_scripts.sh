#!/usr/bin/env bash
# The device scripts (bench/*.sh, experiments/paper/run_repro.sh, scripts/*.sh) parse, and
# run_repro.sh's MXLAB_REPRO_LIMIT bounds a whole part: with a stand-in mxlab whose `run` takes
# 3 s, a limit of 2 s stops the first `mxlab run` of part J (timeout) and skips the second
# (a limit per call, the old behaviour, would have started it).
set -uo pipefail
ROOT=${1:?usage: test_repro_scripts.sh REPO_ROOT}
cd "$ROOT" || exit 1
fail=0
for f in bench/*.sh experiments/paper/run_repro.sh scripts/*.sh; do
  bash -n "$f" || { echo "FAIL: $f does not parse"; fail=1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/mxlab" <<'STUB'
#!/usr/bin/env bash
echo "stub $*" >> "$(dirname "$0")/calls.log"
if [ "$1" = run ]; then sleep 3; fi
exit 0
STUB
chmod +x "$tmp/mxlab"
t0=$(date +%s)
MXLAB_BIN="$tmp/mxlab" MXLAB_REPRO_LIMIT=2 MXLAB_REPRO_RUNS="$tmp/runs" \
  bash experiments/paper/run_repro.sh J "$tmp/out" > "$tmp/log" 2>&1
t=$(( $(date +%s) - t0 ))
runs=$(grep -c "^stub run " "$tmp/calls.log")
if [ "$runs" -ne 1 ]; then echo "FAIL: expected 1 mxlab run call under a 2 s limit, got $runs"; fail=1; fi
grep -q "time limit reached: skipping mxlab run experiments/paper/instruments_lr5e-4.yaml" "$tmp/log" ||
  { echo "FAIL: the second run was not reported as skipped"; cat "$tmp/log"; fail=1; }
[ "$fail" -eq 0 ] && echo "ok: scripts parse; the limit stopped part J after $t s with $runs run"
exit "$fail"
