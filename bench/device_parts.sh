#!/usr/bin/env bash
# One device call that runs several steps under one deadline and packs what they made into at
# most 8 files (the device tool's limit):
#   bash bench/device_parts.sh OUTDIR DEADLINE_S STEP [STEP ...]
# Steps, in order:
#   (`build gputests bench` is a whole validation session of a GPU change)
#   build     cmake + ninja mxlab and mxlab_gpu_tests (Release, sm_90); OUTDIR/mxlab is the binary
#             (carry it back as .devbin/mxlab to skip the build in a later call)
#   ref       build .ref's mxlab (another revision: `git worktree add --detach .ref REV`; .gitignore
#             ignores it, so name it in the call's carry); refbench and paired10k compare against it.
#             With .devref carried (bench/pack_devbin.sh --ref: a baseline built on the development
#             machine) nothing is built: .devref/mxlab is the baseline
#   gputests  every GPU test (log in logs.tgz)
#   bench     mxlab bench: paper configuration with 4 arms, the attention proxy, the arms study
#   refbench  the baseline of a performance change, on the same GPU in the same call: builds .ref
#             (as `ref` does, when not built yet) and runs the paper configuration's bench with it
#             and with this tree's binary, alternately (ref, this, ref, this)
#   paired10k the whole-run speed target: the 10,000-step paired run of the paper configuration
#             with the shadow gradient every step (--set log.bias_every=1), wall time, with this
#             tree's binary and then, when .ref is built (or .devref carried), with the baseline's
#   logsteps  where a logged step's time goes: mxlab bench --log-steps 100 on the paper
#             configuration with the shadow every step, this binary (and the baseline's, when there)
#   P         run_repro.sh part P (A..M; K and M need MXLAB_SHARD); P+Q+... runs parts concurrently.
#             Each part's training stops DEADLINE_S - 60 s after this script began, so its
#             summaries are still written; run files stay in runs/P (git-ignored: a later call on the
#             same warm machine resumes them; not returned)
# Each part's outputs (CSV, text, PNG) come back as OUTDIR/part_<P>.tgz; every log as logs.tgz.
# Without `build`, the binaries are .devbin/ when present (bench/pack_devbin.sh packs them on the
# development machine, with the shared libraries the device lacks), else build/.
# Two instances can share one call (e.g. benchmarks on GPU 0 while a part trains on GPU 1):
# MXLAB_PARTS_WORK=DIR gives each its own work directory (default /tmp/mxlab_parts), and
# MXLAB_PART_BIN=PATH runs the parts with another binary than the benchmarks (e.g. .devref/mxlab,
# the baseline, while .devbin is a branch under test).
set -uo pipefail
OUT=${1:?usage: device_parts.sh OUTDIR DEADLINE_S STEP...}
DEADLINE=${2:?usage: device_parts.sh OUTDIR DEADLINE_S STEP...}
shift 2
T0=$(date +%s)
WORK=${MXLAB_PARTS_WORK:-/tmp/mxlab_parts}
LOGS=$WORK/logs
mkdir -p "$OUT" "$LOGS" runs
nvidia-smi -L > "$LOGS/device.txt" 2>&1
cat "$LOGS/device.txt"
BIN=build/mxlab
TESTS=build/mxlab_gpu_tests
# Binaries packed on the development machine (bench/pack_devbin.sh; carry .devbin): no build here.
if [ -x .devbin/mxlab ]; then
  BIN=.devbin/mxlab
  [ -x .devbin/mxlab_gpu_tests ] && TESTS=.devbin/mxlab_gpu_tests
  echo "using .devbin (revision $(head -c 12 .devbin/REVISION 2>/dev/null || echo unknown))"
fi
elapsed() { echo $(( $(date +%s) - T0 )); }
REF_BIN=.ref/build/mxlab
if [ -x .devref/mxlab ]; then
  REF_BIN=.devref/mxlab
  echo "baseline: .devref (revision $(head -c 12 .devref/REVISION 2>/dev/null || echo unknown))"
fi
# The binary of a comparison's side: `this` (this tree's) or `ref` (the baseline's).
bin_of() { if [ "$1" = ref ]; then echo "$REF_BIN"; else echo "$BIN"; fi; }
build_ref() {
  [ "$REF_BIN" = .devref/mxlab ] && return 0
  if [ ! -f .ref/CMakeLists.txt ]; then
    echo "$step: no source tree in .ref: git worktree add --detach .ref REV (ignored), and carry .ref"
    return 2
  fi
  [ -x .ref/build/mxlab ] && return 0
  cmake -S .ref -B .ref/build -G Ninja -DCMAKE_BUILD_TYPE=Release > "$LOGS/cmake_ref.log" 2>&1 ||
    { tail -30 "$LOGS/cmake_ref.log"; return 1; }
  ninja -C .ref/build -j16 mxlab > "$LOGS/build_ref.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$LOGS/build_ref.log"; return 1; }
}

for step in "$@"; do
  echo "== $step at $(elapsed) s"
  case "$step" in
    build)
      cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > "$LOGS/cmake.log" 2>&1 || { tail -30 "$LOGS/cmake.log"; exit 1; }
      ninja -C build -j16 mxlab mxlab_gpu_tests > "$LOGS/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$LOGS/build.log"; exit 1; }
      BIN=build/mxlab
      TESTS=build/mxlab_gpu_tests
      cp build/mxlab "$OUT/mxlab"
      ;;
    gputests)
      "$TESTS" --gtest_brief=1 > "$LOGS/gpu_tests.log" 2>&1
      echo "gpu tests exit $?"
      grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests ran" "$LOGS/gpu_tests.log" | head -20
      ;;
    bench)
      $BIN bench experiments/paper/fig4_baseline.yaml --device cuda --steps 200 --arms 4 > "$LOGS/bench_fig4.log" 2>&1
      grep -v '^{' "$LOGS/bench_fig4.log" | tail -26
      $BIN bench experiments/paper/attn_vs_mlp_lr5e-4.yaml --device cuda --steps 100 > "$LOGS/bench_attention.log" 2>&1
      grep -v '^{' "$LOGS/bench_attention.log" | tail -14
      $BIN bench experiments/paper/study_arms_lr5e-4.yaml --device cuda --steps 100 > "$LOGS/bench_study.log" 2>&1
      grep -A4 "trainer step" "$LOGS/bench_study.log"
      ;;
    ref|refbench)
      build_ref || exit $?
      [ "$step" = ref ] && continue
      for i in 1 2; do
        for tag in ref this; do
          b=$(bin_of "$tag")
          $b bench experiments/paper/fig4_baseline.yaml --device cuda --steps 200 > "$LOGS/bench_fig4_${tag}_$i.log" 2>&1
          echo "$tag $i: $(grep -E '^  MX trajectory step' "$LOGS/bench_fig4_${tag}_$i.log")"
          echo "$tag $i: $(grep -E '^  FP32 trajectory step' "$LOGS/bench_fig4_${tag}_$i.log")"
        done
      done
      ;;
    paired10k)
      for tag in this ref; do
        b=$(bin_of "$tag")
        [ "$tag" = ref ] && [ ! -x "$b" ] && continue  # no baseline in this call
        rm -rf "$WORK/paired10k_$tag"
        t1=$(date +%s%N)
        $b run experiments/paper/fig4_baseline.yaml --device cuda --set log.bias_every=1 \
          --out "$WORK/paired10k_$tag" --quiet > "$LOGS/paired10k_$tag.log" 2>&1
        rc=$?
        echo "paired10k $tag: exit $rc, $(( ($(date +%s%N) - t1) / 1000000 )) ms wall (10,000 steps, bias_every=1)"
      done
      ;;
    logsteps)
      for tag in this ref; do
        b=$(bin_of "$tag")
        [ "$tag" = ref ] && [ ! -x "$b" ] && continue  # no baseline in this call
        $b bench experiments/paper/fig4_baseline.yaml --device cuda --steps 100 --set log.bias_every=1 \
          --log-steps 100 > "$LOGS/bench_logsteps_$tag.log" 2>&1
        echo "logsteps $tag: exit $?"
        sed -n '/logged trainer step/,/^$/p' "$LOGS/bench_logsteps_$tag.log"
      done
      ;;
    *)
      limit=$(( DEADLINE - 60 - $(elapsed) ))
      pids=()
      for p in ${step//+/ }; do
        MXLAB_BIN=${MXLAB_PART_BIN:-$BIN} MXLAB_REPRO_RUNS=runs/$p MXLAB_REPRO_LIMIT=$limit PYTHONUNBUFFERED=1 \
          bash experiments/paper/run_repro.sh "$p" "$WORK/part_$p" > "$LOGS/part_$p.log" 2>&1 &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid"; done
      for p in ${step//+/ }; do
        tail -4 "$LOGS/part_$p.log"
        tar czf "$OUT/part_$p.tgz" -C "$WORK" "part_$p"
      done
      ;;
  esac
done
echo "== done at $(elapsed) s"
tar czf "$OUT/logs.tgz" -C "$WORK" logs
ls -la "$OUT"
