#!/usr/bin/env bash
# One device-machine call: build, run the GPU tests, time the paper configuration.
# Usage (from the repository root): bash bench/gpu_check.sh OUTDIR [STEPS]
# Writes OUTDIR/gpu_tests.log and OUTDIR/bench.log; prints a short summary last.
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUTDIR [STEPS]}
STEPS=${2:-200}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/device.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C build -j16 mxlab mxlab_gpu_tests > "$OUT/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$OUT/build.log"; exit 1; }
./build/mxlab_gpu_tests > "$OUT/gpu_tests.log" 2>&1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran|\[parity .*(global|loss)|\[backend\]" "$OUT/gpu_tests.log" | head -60
for cfg in experiments/paper/fig4_baseline.yaml; do
  ./build/mxlab bench "$cfg" --device cuda --steps "$STEPS" 2>&1 | tee -a "$OUT/bench.log"
  ./build/mxlab bench "$cfg" --device cuda --steps 50 --no-graphs 2>&1 | tail -9 | tee -a "$OUT/bench.log"
done
