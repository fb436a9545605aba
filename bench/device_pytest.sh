#!/usr/bin/env bash
# mxlab.quantize on a GPU: the Python extension mxlab._core built with CUDA by plain CMake (no pip,
# no package registry), then tests/python/test_cuda.py against the CPU path of the same build.
#
#   bash bench/device_pytest.sh --prepare [PY...]
#       here, once: copies nanobind (the extension's build dependency) and pytest with what it
#       imports from this python3's site-packages into .devpy/py (git-ignored, ~9 MB). With PY (an
#       interpreter of the GPU machine's Python version that has its C headers, e.g. pyenv's 3.12 for
#       Ubuntu 24.04's python3.12), also builds mxlab._core with CUDA for it, here, into
#       .devpy/prebuilt/ (~2.5 MB each): the fallback there when its python3 has no Python.h, and a
#       way to spare the build's device time (MXLAB_DEVPY_PREBUILT=1).
#   bash bench/device_pytest.sh [OUTDIR]
#       on the GPU machine, with .devpy carried: configures and builds into .devpy/build
#       (kernels/quantize.cu: a few minutes), assembles .devpy/site/mxlab (analysis/mxlab + _core),
#       runs the tests; OUTDIR (default .devpy/out) gets device.txt, cmake.log, build.log, pytest.log.
#
# There it needs python3 with numpy, and to build: its C headers (Python.h; Ubuntu: python3-dev),
# cmake >= 3.24, nvcc and a C++17 compiler; without the headers it takes .devpy/prebuilt's
# extension for its Python version if --prepare made one, else says what to do. torch is optional:
# without it (or without CUDA in it) the CUDA-tensor tests skip, saying so, and the device="cuda"
# tests run the same kernels on NumPy arrays. The run sets MXLAB_REQUIRE_GPU=1: a skip for want of
# CUDA or of a GPU is a failure there. pytest comes from .devpy/py only when the machine's python3
# lacks it. MXLAB_CUDA_ARCH (default 90) sets CMAKE_CUDA_ARCHITECTURES; PYTHON (default python3) the
# interpreter. Exit status: pytest's, or 2 when something it needs is missing (one line naming it),
# 1 when the build fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
PY=${PYTHON:-python3}
DEVPY=$ROOT/.devpy

if [ "${1:-}" = --prepare ]; then
  rm -rf "$DEVPY"  # a build or site left by a run here would travel too
  mkdir -p "$DEVPY/py"
  "$PY" - "$DEVPY/py" <<'EOF' || exit 2
import importlib.metadata as md, os, shutil, sys
dest = sys.argv[1]
for dist_name in ("nanobind", "pytest", "pluggy", "iniconfig", "packaging", "pygments"):
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        sys.exit(f"device_pytest --prepare: {sys.executable} has no {dist_name}: run scripts/install-deps.sh first")
    tops = set()
    for f in dist.files:
        top = f.parts[0]
        if top.startswith("..") or top == "__pycache__" or top.endswith(".pth"):
            continue
        tops.add(top)
    for top in sorted(tops):
        src = os.path.join(str(dist.locate_file("")), top)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dest, top), dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif os.path.isfile(src):
            shutil.copy2(src, dest)
    print(f"device_pytest --prepare: {dist_name} {dist.version}")
EOF
  git rev-parse HEAD > "$DEVPY/REVISION" 2>/dev/null || true
  shift
  for pb in "$@"; do
    inc=$("$pb" -c "import sysconfig; print(sysconfig.get_paths()['include'])") || exit 2
    [ -f "$inc/Python.h" ] || { echo "device_pytest --prepare: $pb has no Python.h" >&2; exit 2; }
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/mxlab-devpy-prebuild.XXXXXX")
    echo "device_pytest --prepare: building mxlab._core with CUDA for $("$pb" --version) (a few minutes)"
    launch=()
    command -v ccache > /dev/null && launch=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    if PYTHONPATH="$DEVPY/py" cmake -S "$ROOT" -B "$tmp" -DMXLAB_PYTHON=ON -DMXLAB_ENABLE_CUDA=ON \
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${MXLAB_CUDA_ARCH:-90}" \
         -DPython_EXECUTABLE="$(command -v "$pb")" "${launch[@]}" > "$tmp/cmake.log" 2>&1 &&
       cmake --build "$tmp" --target _core -j "$(nproc)" > "$tmp/build.log" 2>&1; then
      mkdir -p "$DEVPY/prebuilt"
      for so in "$tmp"/_core*.so; do strip --strip-unneeded -o "$DEVPY/prebuilt/$(basename "$so")" "$so"; done
      ls "$DEVPY/prebuilt"
      rm -rf "$tmp"
    else
      tail -20 "$tmp/cmake.log" "$tmp/build.log" 2> /dev/null
      echo "device_pytest --prepare: the build for $pb failed (logs in $tmp)" >&2
      exit 1
    fi
  done
  du -sh "$DEVPY" | awk '{print "device_pytest --prepare: .devpy is " $1 "; carry .devpy"}'
  exit 0
fi

OUT=${1:-$DEVPY/out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
need() { echo "device_pytest: $*" >&2; exit 2; }
command -v "$PY" > /dev/null || need "no $PY"
"$PY" -c "import numpy" 2> /dev/null || need "$PY has no numpy"
SUFFIX=$("$PY" -c "import importlib.machinery as m; print(m.EXTENSION_SUFFIXES[0])")
PREBUILT=$DEVPY/prebuilt/_core$SUFFIX
PYINC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
USE_PREBUILT=${MXLAB_DEVPY_PREBUILT:-0}
if [ "$USE_PREBUILT" = 1 ]; then
  [ -f "$PREBUILT" ] || need "MXLAB_DEVPY_PREBUILT=1 but there is no .devpy/prebuilt/_core$SUFFIX: run 'bash bench/device_pytest.sh --prepare PY' here with a python of this machine's version ($("$PY" --version))"
elif [ ! -f "$PYINC/Python.h" ]; then
  [ -f "$PREBUILT" ] || need "$PY has no C headers ($PYINC/Python.h) to build with: install python3-dev there, or prebuild here: bash bench/device_pytest.sh --prepare /path/to/python of its version ($("$PY" --version))"
  echo "device_pytest: $PY has no C headers: the extension prebuilt by --prepare"
  USE_PREBUILT=1
fi
SITE=$DEVPY/site
rm -rf "$SITE"
mkdir -p "$SITE"
if [ "$USE_PREBUILT" = 1 ]; then
  (nvidia-smi -L 2>&1; "$PY" --version; echo "mxlab._core: prebuilt by --prepare ($(cat "$DEVPY/REVISION" 2>/dev/null))") |
    tee "$OUT/device.txt"
  CORE=$PREBUILT
else
  [ -d "$DEVPY/py/nanobind" ] || need ".devpy/py/nanobind is missing: run 'bash bench/device_pytest.sh --prepare' where pip works, and carry .devpy"
  command -v cmake > /dev/null || need "no cmake"
  NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  [ -x "$NVCC" ] || need "no nvcc on PATH or in /usr/local/cuda/bin (or set CUDACXX)"
  (nvidia-smi -L 2>&1; "$NVCC" --version | tail -1; "$PY" --version; echo "mxlab._core: built here") |
    tee "$OUT/device.txt"
  GEN=()
  command -v ninja > /dev/null && GEN=(-G Ninja)
  echo "device_pytest: configuring .devpy/build (CUDA, sm_${MXLAB_CUDA_ARCH:-90})"
  # nanobind from .devpy/py (python -m nanobind --cmake_dir in CMakeLists.txt finds it there).
  PYTHONPATH="$DEVPY/py${PYTHONPATH:+:$PYTHONPATH}" cmake -S "$ROOT" -B "$DEVPY/build" "${GEN[@]}" \
    -DMXLAB_PYTHON=ON -DMXLAB_ENABLE_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
    -DCMAKE_CUDA_ARCHITECTURES="${MXLAB_CUDA_ARCH:-90}" -DPython_EXECUTABLE="$(command -v "$PY")" \
    > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  echo "device_pytest: building mxlab._core"
  t0=$(date +%s)
  cmake --build "$DEVPY/build" --target _core -j "$(nproc)" > "$OUT/build.log" 2>&1 ||
    { grep -B2 -A12 -m3 -i "error" "$OUT/build.log" || tail -30 "$OUT/build.log"; exit 1; }
  echo "device_pytest: built in $(( $(date +%s) - t0 )) s"
  CORE=$(ls "$DEVPY/build"/_core*.so 2> /dev/null | head -1)
  [ -n "$CORE" ] || { echo "device_pytest: no _core*.so in .devpy/build" >&2; exit 1; }
fi

# The package as pip would install it: analysis/mxlab with the extension inside.
cp -r "$ROOT/analysis/mxlab" "$SITE/mxlab"
find "$SITE/mxlab" -name __pycache__ -prune -exec rm -rf {} +
cp "$CORE" "$SITE/mxlab/"

# pytest: the machine's own when it has one, else .devpy/py's.
if ! "$PY" -c "import pytest" 2> /dev/null; then
  [ -d "$DEVPY/py/pytest" ] || need "$PY has no pytest and .devpy/py none: run --prepare here and carry .devpy"
  export PYTHONPATH="$DEVPY/py${PYTHONPATH:+:$PYTHONPATH}"
fi
MXLAB_PY_SITE="$SITE" MXLAB_REQUIRE_GPU=${MXLAB_REQUIRE_GPU:-1} \
  "$PY" -m pytest -q -rs -p no:cacheprovider "$ROOT/tests/python/test_cuda.py" 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
echo "device_pytest: pytest exit $rc ($(tail -1 "$OUT/pytest.log"))"
exit "$rc"
