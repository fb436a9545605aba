#!/usr/bin/env bash
# The README's first command: install dependencies, build, show the MX formats, quantize a
# block of layernorm-like gains (the paper's last-bin example), run the quick-start paired
# training run on the CPU and draw its panel figure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD=${MXLAB_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j "$(nproc)" --target mxlab

echo; echo "== mxlab formats"
"$BUILD/mxlab" formats

OUT=${MXLAB_QUICKSTART_OUT:-runs/quickstart}
mkdir -p "$OUT"
echo; echo "== mxlab quantize: 64 layernorm gains in [0.88, 0.90] under MXFP8 E4M3, OCP floor scale"
python3 - "$OUT/gains.npy" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
np.save(sys.argv[1], rng.uniform(0.88, 0.90, size=(2, 32)).astype(np.float32))
PY
"$BUILD/mxlab" quantize --format mxfp8_e4m3 --in "$OUT/gains.npy" --out "$OUT/gains_q.npy" --stats
python3 -c "import numpy as np; print('quantized values:', np.unique(np.load('$OUT/gains_q.npy')))"

echo; echo "== mxlab run experiments/quickstart.yaml (FP32 vs MXFP4, CPU)"
"$BUILD/mxlab" run experiments/quickstart.yaml --out "$OUT" --device cpu
RUN=$(ls -t "$OUT"/*.h5 | head -n 1)
PYTHONPATH=analysis python3 -m mxlab summary "$OUT"
PYTHONPATH=analysis python3 -m mxlab panel "$RUN" -o "$OUT/panel.png"
echo "figure: $OUT/panel.png"
