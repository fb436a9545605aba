#!/usr/bin/env bash
# One device-machine call that validates a build end to end and measures the headline figures:
#   1. build (Release, sm_90) and run every GPU test (ctest label gpu)
#   2. mxlab bench on the paper configuration (ms/step, ratios to the cuBLAS floors)
#   3. the whole 10,000-step paired run of experiments/paper/fig4_baseline.yaml on the GPU,
#      with shadow gradients every step (bias_every=1), wall time measured
#   4. the PyTorch peer (../shared/bench/peer_proxy.py, when carried in .peer/) in the same session
# Usage (repository root): bash bench/device_validate.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: device_validate.sh OUTDIR}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/device.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C build -j16 > "$OUT/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$OUT/build.log"; exit 1; }
ctest --test-dir build -L gpu --output-on-failure -j1 > "$OUT/gpu_ctest.log" 2>&1
grep -E "tests passed|tests failed|Failed|\(Failed\)" "$OUT/gpu_ctest.log" | head -20
./build/mxlab bench experiments/paper/fig4_baseline.yaml --device cuda --steps 200 > "$OUT/bench.log" 2>&1
tail -14 "$OUT/bench.log"
start=$(date +%s)
./build/mxlab run experiments/paper/fig4_baseline.yaml --device cuda --out "$OUT/fig4" --set log.bias_every=1 --quiet > "$OUT/fig4_run.log" 2>&1
end=$(date +%s)
echo "fig4 paired run, 10000 steps, shadow every step: $((end - start)) s wall" | tee -a "$OUT/fig4_run.log"
cat "$OUT/fig4_run.log" | tail -3
./build/mxlab summarize "$OUT/fig4" > "$OUT/fig4_summary.txt" 2>&1; cat "$OUT/fig4_summary.txt"
if [ -f .peer/peer_proxy.py ]; then
  python3 .peer/peer_proxy.py --mode fp32 --steps 200 --d 512 --L 4 --batch 2048 2>&1 | tail -1 | tee "$OUT/peer_fp32.json"
fi
