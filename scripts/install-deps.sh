#!/usr/bin/env bash
# Install mxlab's build and test dependencies on Debian 12 / Ubuntu (root or sudo).
# Idempotent: packages already present are left alone. CUDA is optional and not installed
# here (when nvcc is on PATH or in /usr/local/cuda, the kernels compile too).
set -euo pipefail

PKGS=(build-essential cmake git pkg-config
      libeigen3-dev libhdf5-dev libyaml-cpp-dev libcli11-dev libgtest-dev googletest
      python3 python3-numpy python3-h5py python3-matplotlib python3-pytest
      python3-dev python3-pip   # the Python package (pip install .: pyproject.toml, lab/python); PyPI packages Debian lacks (tensorboard, below)
      python3-scipy python3-statsmodels   # results/paired_stats.py (Wilcoxon, stratified Cox PHReg)
      python3-pandas   # analysis/mxlab/tidy.py (the long table of a results directory)
      python3-torch   # CPU PyTorch for the FP32 cross-check (tests/torch, run by /usr/bin/python3)
      slurm-wlm munge)  # a single-node Slurm for tests/slurm/test_sweep.sh (scripts/slurm-local.sh)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all Debian packages present"
fi

# The python3 on PATH may not be Debian's (e.g. a pyenv build): make sure it can import
# what analysis/ needs, from PyPI if necessary.
if ! python3 -c "import numpy, h5py, matplotlib, pytest, scipy, statsmodels, pandas" 2>/dev/null; then
  echo "install-deps: $(command -v python3) lacks numpy/h5py/matplotlib/pytest/scipy/statsmodels/pandas - installing with pip"
  python3 -m pip install --quiet numpy h5py matplotlib pytest scipy statsmodels pandas
fi

# TensorBoard's event-file reader for the export test (analysis/tests/test_tensorboard_export.py,
# which reads `mxlab export --tensorboard` back): not packaged by Debian, so from PyPI, pinned, for
# the python3 on PATH (which runs pytest) and Debian's. PIP_BREAK_SYSTEM_PACKAGES lets pip install
# beside Debian's own packages (PEP 668); pips that predate it ignore it.
TENSORBOARD_VERSION=2.20.0
for py in python3 /usr/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  if ! "$py" -c "import sys, tensorboard; sys.exit(tensorboard.__version__ != '$TENSORBOARD_VERSION')" 2>/dev/null; then
    echo "install-deps: installing tensorboard==$TENSORBOARD_VERSION for $(command -v "$py")"
    PIP_BREAK_SYSTEM_PACKAGES=1 "$py" -m pip install --quiet "tensorboard==$TENSORBOARD_VERSION"
  fi
done

# The Python package (pyproject.toml) builds with scikit-build-core over nanobind, without build
# isolation in tests/python (no download at test time): pinned, for Debian's /usr/bin/python3 (it
# has python3-torch and runs the ctest python_package) and for the python3 on PATH.
PY_BUILD_PKGS=(scikit-build-core==0.10.7 nanobind==2.4.0)
for py in /usr/bin/python3 "$(command -v python3)"; do
  if ! "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('scikit-build-core') != '0.10.7' or m.version('nanobind') != '2.4.0')" 2>/dev/null; then
    echo "install-deps: $py lacks ${PY_BUILD_PKGS[*]} - installing with pip"
    extra=()
    if "$py" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages; then extra=(--break-system-packages); fi
    "$py" -m pip install --quiet --disable-pip-version-check "${extra[@]}" "${PY_BUILD_PKGS[@]}"
  fi
done
