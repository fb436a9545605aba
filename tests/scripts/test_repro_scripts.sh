#!/usr/bin/env bash
# The device scripts (bench/*.sh, experiments/paper/run_repro.sh, run_why_mx.sh, scripts/*.sh) parse, and
# run_repro.sh's MXLAB_REPRO_LIMIT bounds a whole part: with a stand-in mxlab whose `run` takes
# 3 s, a limit of 2 s stops the first `mxlab run` of part J (timeout) and skips the second
# (a limit per call, the old behaviour, would have started it).
set -uo pipefail
ROOT=${1:?usage: test_repro_scripts.sh REPO_ROOT}
cd "$ROOT" || exit 1
ROOT=$PWD
fail=0
for f in bench/*.sh experiments/paper/run_repro.sh experiments/paper/run_why_mx.sh scripts/*.sh; do
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
# Part K: every seed over the named GPUs, or one shard; the summary's name says which.
for spec in "|0,1||--gpus 0,1|all" "2/8|||--device cuda --shard 2/8|2of8" "1/5|0,1|4|--gpus 0,1 --jobs 4 --shard 1/5|1of5"; do
  IFS='|' read -r shard gpus jobs want tag <<< "$spec"
  rm -f "$tmp/calls.log"
  MXLAB_BIN="$tmp/mxlab" MXLAB_SHARD="$shard" MXLAB_GPUS="$gpus" MXLAB_JOBS="$jobs" MXLAB_REPRO_RUNS="$tmp/runs" \
    bash experiments/paper/run_repro.sh K "$tmp/outK" > "$tmp/logK" 2>&1
  grep -q "^stub run experiments/paper/study_arms_lr5e-4.yaml .*--quiet $want\$" "$tmp/calls.log" ||
    { echo "FAIL: part K (shard '$shard', gpus '$gpus', jobs '$jobs') did not pass $want"; cat "$tmp/calls.log"; fail=1; }
  [ -f "$tmp/outK/summary_study_arms_shard$tag.csv" ] ||
    { echo "FAIL: part K wrote no summary_study_arms_shard$tag.csv"; ls "$tmp/outK"; fail=1; }
done
# device_parts.sh refbench without a .ref tree: one line that says how to make one, exit 2.
out=$(cd "$tmp" && mkdir -p noref && cd noref && bash "$ROOT/bench/device_parts.sh" "$tmp/outR" 60 refbench 2>&1)
rc=$?
[ "$rc" -eq 2 ] && echo "$out" | grep -q "refbench: no source tree in .ref: git worktree add --detach .ref REV" ||
  { echo "FAIL: refbench without .ref: rc $rc"; echo "$out"; fail=1; }
# Part M: both 20k-step experiments with the same spread, a summary of each, the loss blocks of
# the run files there are (one fixture run file in each), and the code-faithful runs' series;
# nothing of the kind without run files.
rm -f "$tmp/calls.log"
MXLAB_BIN="$tmp/mxlab" MXLAB_SHARD=3/10 MXLAB_REPRO_RUNS="$tmp/runs_empty" \
  bash experiments/paper/run_repro.sh M "$tmp/outM0" > "$tmp/logM0" 2>&1
ls "$tmp/outM0" | grep -qE '^(loss_blocks|series)_' && { echo "FAIL: part M wrote loss blocks or series without run files"; fail=1; }
rm -f "$tmp/calls.log"
# Shard 3's runs live in RUNS/<study>_shard3of10; a run file of another shard in the same RUNS
# (one warm machine, several shards) must not reach shard 3's summary or loss blocks.
for e in fresh_seeds_20k code_faithful_20k; do
  mkdir -p "$tmp/runs/${e}_shard3of10" "$tmp/runs/${e}_shard2of10"
  python3 -c "import sys; sys.path.insert(0, 'analysis/tests'); import make_fixtures as F; F.write_run(sys.argv[1], steps=250)" \
    "$tmp/runs/${e}_shard3of10/r.h5" || { echo "FAIL: could not write a fixture run file"; fail=1; }
  python3 -c "import sys; sys.path.insert(0, 'analysis/tests'); import make_fixtures as F; F.write_run(sys.argv[1], steps=500)" \
    "$tmp/runs/${e}_shard2of10/other.h5" || { echo "FAIL: could not write a fixture run file"; fail=1; }
done
MXLAB_BIN="$tmp/mxlab" MXLAB_SHARD=3/10 MXLAB_GPUS=0,1 MXLAB_REPRO_RUNS="$tmp/runs" \
  bash experiments/paper/run_repro.sh M "$tmp/outM" > "$tmp/logM" 2>&1
for e in fresh_seeds_20k code_faithful_20k; do
  grep -q "^stub run experiments/paper/$e.yaml --out $tmp/runs/${e}_shard3of10 --quiet --gpus 0,1 --shard 3/10\$" "$tmp/calls.log" &&
    grep -q "^stub summarize $tmp/runs/${e}_shard3of10 --csv\$" "$tmp/calls.log" ||
    { echo "FAIL: part M did not run $e over the GPUs and the shard"; cat "$tmp/calls.log"; fail=1; }
  [ -f "$tmp/outM/summary_${e}_shard3of10.csv" ] || { echo "FAIL: part M wrote no summary of $e"; fail=1; }
done
for e in fresh_seeds_20k code_faithful_20k; do
  [ "$(wc -l < "$tmp/outM/loss_blocks_${e}_shard3of10.csv" 2>/dev/null)" -gt 3 ] ||
    { echo "FAIL: part M wrote no loss blocks of $e"; cat "$tmp/logM"; fail=1; }
  ! cut -d, -f5 "$tmp/outM/loss_blocks_${e}_shard3of10.csv" | grep -qx 300 ||
    { echo "FAIL: shard 3's loss blocks of $e hold another shard's run"; fail=1; }
done
ls "$tmp/outM/series_code_faithful_20k_shard3of10/"series_*.csv > /dev/null 2>&1 ||
  { echo "FAIL: part M extracted no series of the code-faithful runs"; cat "$tmp/logM"; fail=1; }
[ ! -e "$tmp/outM/series_fresh_seeds_20k_shard3of10" ] || { echo "FAIL: part M extracted fresh_seeds series"; fail=1; }
# MXLAB_M_STUDIES=fresh_seeds_20k: that study only (run and summary); an unknown name is refused.
rm -f "$tmp/calls.log"
MXLAB_BIN="$tmp/mxlab" MXLAB_SHARD=3/10 MXLAB_M_STUDIES=fresh_seeds_20k MXLAB_REPRO_RUNS="$tmp/runs" \
  bash experiments/paper/run_repro.sh M "$tmp/outM1" > "$tmp/logM1" 2>&1
grep -q "^stub run experiments/paper/fresh_seeds_20k.yaml " "$tmp/calls.log" &&
  ! grep -q "code_faithful_20k" "$tmp/calls.log" && [ -f "$tmp/outM1/summary_fresh_seeds_20k_shard3of10.csv" ] &&
  [ ! -e "$tmp/outM1/summary_code_faithful_20k_shard3of10.csv" ] ||
  { echo "FAIL: MXLAB_M_STUDIES=fresh_seeds_20k ran or summarised another study"; cat "$tmp/calls.log"; fail=1; }
out=$(MXLAB_BIN="$tmp/mxlab" MXLAB_M_STUDIES=fresh MXLAB_REPRO_RUNS="$tmp/runs" \
  bash experiments/paper/run_repro.sh M "$tmp/outM2" 2>&1)
rc=$?
[ "$rc" -eq 2 ] && echo "$out" | grep -q "MXLAB_M_STUDIES: unknown study fresh" ||
  { echo "FAIL: an unknown MXLAB_M_STUDIES name: rc $rc"; echo "$out"; fail=1; }
# device_parts.sh with MXLAB_PARTS_WORK and MXLAB_PART_BIN (two instances in one call): the part
# runs with MXLAB_PART_BIN, not .devbin or build/, and its work and logs are in MXLAB_PARTS_WORK.
dp="$tmp/dp"
mkdir -p "$dp/bench"
cp "$ROOT/bench/device_parts.sh" "$dp/bench/"
ln -s "$ROOT/experiments" "$dp/experiments"
ln -s "$ROOT/results" "$dp/results"
rm -f "$tmp/calls.log"
(cd "$dp" && MXLAB_PARTS_WORK="$tmp/dpwork" MXLAB_PART_BIN="$tmp/mxlab" MXLAB_SHARD=3/10 \
   MXLAB_M_STUDIES=fresh_seeds_20k bash bench/device_parts.sh "$tmp/dpout" 120 M > "$tmp/dplog" 2>&1)
grep -q "^stub run experiments/paper/fresh_seeds_20k.yaml .*--shard 3/10\$" "$tmp/calls.log" &&
  [ -f "$tmp/dpout/part_M.tgz" ] && [ -f "$tmp/dpwork/logs/part_M.log" ] ||
  { echo "FAIL: device_parts.sh did not run part M with MXLAB_PART_BIN in MXLAB_PARTS_WORK"; cat "$tmp/dplog"; fail=1; }
# device_queue.sh: part-M shards queued per GPU, each on its GPU (CUDA_VISIBLE_DEVICES) with its
# own shard and study, one after another within a queue; one tarball back; a shard without
# enough time left is skipped and said so; a malformed queue or unknown study is refused.
cp "$ROOT/bench/device_queue.sh" "$dp/bench/"
cat > "$tmp/mxlabQ" <<'STUB'
#!/usr/bin/env bash
echo "gpu${CUDA_VISIBLE_DEVICES:-none} $*" >> "$(dirname "$0")/callsQ.log"
exit 0
STUB
chmod +x "$tmp/mxlabQ"
(cd "$dp" && MXLAB_QUEUE_WORK="$tmp/qwork" MXLAB_PART_BIN="$tmp/mxlabQ" \
   bash bench/device_queue.sh "$tmp/qout" 400 0=fresh_seeds_20k:3,code_faithful_20k:4 1=fresh_seeds_20k:5 > "$tmp/qlog" 2>&1)
for want in "gpu0 run experiments/paper/fresh_seeds_20k.yaml --out runs/M/fresh_seeds_20k_shard3of10 .*--shard 3/10$" \
            "gpu0 run experiments/paper/code_faithful_20k.yaml --out runs/M/code_faithful_20k_shard4of10 .*--shard 4/10$" \
            "gpu1 run experiments/paper/fresh_seeds_20k.yaml --out runs/M/fresh_seeds_20k_shard5of10 .*--jobs 4 --shard 5/10$"; do
  grep -q "^$want" "$tmp/callsQ.log" || { echo "FAIL: device_queue.sh made no call '$want'"; cat "$tmp/callsQ.log" "$tmp/qlog"; fail=1; }
done
tar tzf "$tmp/qout/queue.tgz" > "$tmp/qlist" 2>&1
for f in out/fresh_seeds_20k_3/part_M.tgz out/code_faithful_20k_4/logs.tgz out/fresh_seeds_20k_5/part_M.tgz out/queue_gpu0.log; do
  grep -qx "$f" "$tmp/qlist" || { echo "FAIL: queue.tgz lacks $f"; cat "$tmp/qlist"; fail=1; }
done
rm -f "$tmp/callsQ.log"
out=$(cd "$dp" && MXLAB_QUEUE_WORK="$tmp/qwork2" MXLAB_PART_BIN="$tmp/mxlabQ" \
      bash bench/device_queue.sh "$tmp/qout2" 100 2=fresh_seeds_20k:6 2>&1)
echo "$out" | grep -q "== GPU 2: fresh_seeds_20k shard 6 skipped: [0-9]* s left (< 200)" &&
  [ ! -e "$tmp/callsQ.log" ] || { echo "FAIL: device_queue.sh did not skip a shard with 100 s left"; echo "$out"; fail=1; }
for bad in "0=fresh:1" "0fresh_seeds_20k:1"; do
  (cd "$dp" && bash bench/device_queue.sh "$tmp/qout3" 100 "$bad" > /dev/null 2>&1)
  [ $? -eq 2 ] || { echo "FAIL: device_queue.sh accepted '$bad'"; fail=1; }
done
# Part L: each jump file's runs, over the GPUs, then mxlab eval at the file's snapshot step for
# every run file that exists. A second stand-in answers dump-config / plan and writes run files.
cat > "$tmp/mxlabL" <<'STUB'
#!/usr/bin/env bash
echo "stub $*" >> "$(dirname "$0")/callsL.log"
case "$1" in
  plan) case "$2" in *late*) echo "total: 3 runs" ;; *) echo "total: 1 run" ;; esac ;;
  dump-config)
    # As the real one: a sweep file (late: 3 runs) has no single config without --run.
    case "$2" in *late*) [ "${3:-}" = --run ] || { echo "mxlab: error: $2: this experiment is a sweep" >&2; exit 2; } ;; esac
    if [ "${*: -1}" = --id ]; then echo "id$(basename "$2" .yaml)r${4:-0}"
    else case "$2" in *late*) echo "  snapshot_steps: [8150]" ;; *seed25*) echo "  snapshot_steps: [2700]" ;;
         *) echo "  snapshot_steps: [4200]" ;; esac; fi ;;
  run) out=$(echo "$*" | sed 's/.*--out \([^ ]*\).*/\1/'); mkdir -p "$out"
       n=1; case "$2" in *late*) n=3 ;; esac
       for ((i = 0; i < n; i++)); do touch "$out/id$(basename "$2" .yaml)r$i.h5"; done ;;
esac
exit 0
STUB
chmod +x "$tmp/mxlabL"
MXLAB_BIN="$tmp/mxlabL" MXLAB_GPUS=0,1 MXLAB_REPRO_RUNS="$tmp/runsL" \
  bash experiments/paper/run_repro.sh L "$tmp/outL" > "$tmp/logL" 2>&1
for want in "run experiments/paper/jump_lr5e-4_late.yaml --gpus 0,1 --out $tmp/runsL/jump_late" \
            "run experiments/paper/jump_lr5e-4_seed0.yaml --device cuda:0 --out $tmp/runsL/jump " \
            "run experiments/paper/jump_lr5e-4_seed25.yaml --device cuda:1 --out $tmp/runsL/jump_seed25"; do
  grep -qF "stub $want" "$tmp/callsL.log" || { echo "FAIL: part L did not call mxlab $want"; fail=1; }
done
evals=$(grep -c "^stub eval .*--snapshot 8150 " "$tmp/callsL.log")
[ "$evals" -eq 3 ] || { echo "FAIL: part L evaluated $evals late-seed runs at 8150, expected 3"; fail=1; }
for want in "eval $tmp/runsL/jump/idjump_lr5e-4_seed0r0.h5 --snapshot 4200" \
            "eval $tmp/runsL/jump_seed25/idjump_lr5e-4_seed25r0.h5 --snapshot 2700"; do
  grep -qF "stub $want" "$tmp/callsL.log" || { echo "FAIL: part L did not call mxlab $want"; cat "$tmp/callsL.log"; fail=1; }
done
# pack_devbin.sh: a build dir whose two binaries link libz (not part of the C runtime) is packed
# into wrappers that run them with .devbin/lib first; libz is packed, libc is not; a missing
# binary is refused. device_parts.sh then reports that it uses .devbin.
if command -v cc > /dev/null && [ -e /usr/include/zlib.h ]; then
  pk="$tmp/pk"
  mkdir -p "$pk/build" "$pk/bench"
  cp "$ROOT/bench/pack_devbin.sh" "$ROOT/bench/device_parts.sh" "$pk/bench/"
  printf '#include <zlib.h>\n#include <stdio.h>\n#include <stdlib.h>\nint main(void){ const char* e = getenv("MXLAB_TEST_BINARY");\n  printf("zlib %%s\\ntest binary %%s\\n", zlibVersion(), e ? e : "(unset)"); return 0; }\n' > "$pk/z.c"
  cc "$pk/z.c" -o "$pk/build/mxlab" -lz && cp "$pk/build/mxlab" "$pk/build/mxlab_gpu_tests"
  (cd "$pk" && git init -q && git -c user.email=t@t -c user.name=t commit -q --allow-empty -m x &&
     bash bench/pack_devbin.sh > pack.log 2>&1) || { echo "FAIL: pack_devbin.sh"; cat "$pk/pack.log"; fail=1; }
  [ -f "$pk/.devbin/lib/libz.so.1" ] || { echo "FAIL: pack_devbin did not pack libz"; fail=1; }
  ls "$pk/.devbin/lib" | grep -qE '^(libc|libm|libstdc)\.' && { echo "FAIL: pack_devbin packed the C runtime"; fail=1; }
  "$pk/.devbin/mxlab" | grep -q "^zlib " || { echo "FAIL: the packed wrapper does not run its binary"; fail=1; }
  # the GPU tests' wrapper points the tests that start mxlab at the carried one, unless told otherwise
  env -u MXLAB_TEST_BINARY "$pk/.devbin/mxlab_gpu_tests" | grep -qx "test binary $pk/.devbin/mxlab" ||
    { echo "FAIL: .devbin/mxlab_gpu_tests does not set MXLAB_TEST_BINARY to .devbin/mxlab"; fail=1; }
  MXLAB_TEST_BINARY=/other "$pk/.devbin/mxlab_gpu_tests" | grep -qx "test binary /other" ||
    { echo "FAIL: .devbin/mxlab_gpu_tests overrides a MXLAB_TEST_BINARY the caller set"; fail=1; }
  env -u MXLAB_TEST_BINARY "$pk/.devbin/mxlab" | grep -qx "test binary (unset)" ||
    { echo "FAIL: .devbin/mxlab sets MXLAB_TEST_BINARY"; fail=1; }
  out=$(cd "$pk" && bash bench/device_parts.sh "$pk/o" 60 2>&1)
  echo "$out" | grep -q "using .devbin (revision " || { echo "FAIL: device_parts.sh did not use .devbin"; echo "$out"; fail=1; }
  # --ref: the baseline, compressed, unpacked and run by its wrapper with .devbin's libraries;
  # device_parts.sh then names it as the baseline.
  if command -v xz > /dev/null; then
    (cd "$pk" && bash bench/pack_devbin.sh --ref > packref.log 2>&1) || { echo "FAIL: pack_devbin --ref"; cat "$pk/packref.log"; fail=1; }
    [ -f "$pk/.devref/bin/mxlab.xz" ] && [ ! -e "$pk/.devref/bin/mxlab" ] || { echo "FAIL: --ref did not pack mxlab.xz alone"; ls -R "$pk/.devref"; fail=1; }
    "$pk/.devref/mxlab" | grep -q "^zlib " || { echo "FAIL: the .devref wrapper does not run its binary"; fail=1; }
    "$pk/.devref/mxlab" | grep -q "^zlib " || { echo "FAIL: the .devref wrapper fails once unpacked"; fail=1; }
    out=$(cd "$pk" && bash bench/device_parts.sh "$pk/o" 60 2>&1)
    echo "$out" | grep -q "baseline: .devref (revision " || { echo "FAIL: device_parts.sh did not take .devref"; echo "$out"; fail=1; }
  fi
  # --compact: only the named libraries, as lib.txz, unpacked by the first wrapper that runs (two
  # at once: both run, one lib/ left, no temporary folder); a library the binaries do not load is refused
  if command -v xz > /dev/null; then
    (cd "$pk" && MXLAB_DEVBIN_LIBS=libz.so.1 bash bench/pack_devbin.sh --compact > packc.log 2>&1) ||
      { echo "FAIL: pack_devbin --compact"; cat "$pk/packc.log"; fail=1; }
    [ -f "$pk/.devbin/lib.txz" ] && [ ! -e "$pk/.devbin/lib" ] || { echo "FAIL: --compact left lib/ or made no lib.txz"; ls -R "$pk/.devbin"; fail=1; }
    [ "$(tar tJf "$pk/.devbin/lib.txz" | grep -c '^lib/.')" -eq 1 ] && tar tJf "$pk/.devbin/lib.txz" | grep -qx 'lib/libz.so.1' ||
      { echo "FAIL: --compact packed other than libz"; tar tJf "$pk/.devbin/lib.txz"; fail=1; }
    ("$pk/.devbin/mxlab" > "$pk/c1.out" & "$pk/.devbin/mxlab_gpu_tests" > "$pk/c2.out" & wait)
    grep -q "^zlib " "$pk/c1.out" && grep -q "^zlib " "$pk/c2.out" || { echo "FAIL: the compact wrappers do not run"; fail=1; }
    [ -f "$pk/.devbin/lib/libz.so.1" ] || { echo "FAIL: the compact wrapper did not unpack lib.txz"; fail=1; }
    ls -a "$pk/.devbin" | grep -q '^\.lib\.' && { echo "FAIL: a temporary lib folder was left"; ls -a "$pk/.devbin"; fail=1; }
    (cd "$pk" && MXLAB_DEVBIN_LIBS="libz.so.1 libnothere.so.9" bash bench/pack_devbin.sh --compact > packc2.log 2>&1) &&
      { echo "FAIL: --compact took a library the binaries do not load"; fail=1; }
    grep -q "load no libnothere.so.9" "$pk/packc2.log" || { echo "FAIL: --compact did not name the missing library"; cat "$pk/packc2.log"; fail=1; }
  fi
  rm "$pk/build/mxlab_gpu_tests"
  (cd "$pk" && bash bench/pack_devbin.sh > /dev/null 2>&1) && { echo "FAIL: pack_devbin packed without mxlab_gpu_tests"; fail=1; }
fi
[ "$fail" -eq 0 ] && echo "ok: scripts parse; the limit stopped part J after $t s with $runs run"
exit "$fail"
