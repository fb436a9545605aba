#!/usr/bin/env bash
# One device call that builds the CUDA binaries, runs every GPU test and measures the headline
# figures of this session's features (bench/README-style: each figure against a baseline
# measured in the same run):
#   1. build mxlab and mxlab_gpu_tests (Release, sm_90, Ninja)
#   2. every GPU test (mxlab_gpu_tests)
#   3. mxlab bench on the paper configuration: step figures vs cuBLAS floors, curvature cost,
#      the trainer with 1 and with 4 arms
#   4. mxlab bench on the arms study (its 8 arms, shadow every 50 steps)
#   5. copies the binaries to OUTDIR/bin so later calls can carry them instead of rebuilding
# Usage (repository root): bash bench/device_session.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: device_session.sh OUTDIR}
mkdir -p "$OUT/bin"
nvidia-smi -L | tee "$OUT/device.txt"
t0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C build -j16 mxlab mxlab_gpu_tests > "$OUT/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
./build/mxlab_gpu_tests --gtest_brief=1 > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests exit $?"; grep -E "PASSED|FAILED|SKIPPED|tests ran" "$OUT/gpu_tests.log" | head -20
./build/mxlab bench experiments/paper/fig4_baseline.yaml --device cuda --steps 200 --arms 4 > "$OUT/bench_fig4.log" 2>&1
tail -24 "$OUT/bench_fig4.log"
./build/mxlab bench experiments/paper/study_arms_lr5e-4.yaml --device cuda --steps 100 > "$OUT/bench_study.log" 2>&1
grep -A4 "trainer step" "$OUT/bench_study.log"; tail -1 "$OUT/bench_study.log" | cut -c1-400
cp build/mxlab build/mxlab_gpu_tests "$OUT/bin/"
echo "total: $(( $(date +%s) - t0 )) s"
