"""The package under test, built and installed as a user gets it, for every test of tests/python.

`mxlab` (session): `pip install . --no-build-isolation --no-deps --target DIR` with the
interpreter running pytest (scikit-build-core and nanobind must be installed for it:
scripts/install-deps.sh), then imported from DIR, never from the source tree. Environment:
  MXLAB_PY_SITE=DIR       use a package already there (DIR/mxlab with its _core) instead of
                          building one (bench/device_pytest.sh builds one with plain CMake);
  MXLAB_PY_BUILD_DIR=DIR  keep scikit-build-core's build folder there between runs;
  MXLAB_PY_CUDA=1         build it with CUDA (-Ccmake.define.MXLAB_ENABLE_CUDA=ON; needs nvcc).
`binary`: the `mxlab` program (MXLAB_BINARY, default build/mxlab) that tests compare with.
"""

import importlib
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def mxlab(tmp_path_factory):
    site = os.environ.get("MXLAB_PY_SITE")
    if not site:
        site = str(tmp_path_factory.mktemp("site"))
        cmd = [sys.executable, "-m", "pip", "install", ROOT, "--no-build-isolation", "--no-deps", "--target", site,
               "--quiet", "--disable-pip-version-check"]
        if os.environ.get("MXLAB_PY_BUILD_DIR"):
            cmd += ["--config-settings=build-dir=" + os.environ["MXLAB_PY_BUILD_DIR"]]
        if os.environ.get("MXLAB_PY_CUDA") == "1":
            cmd += ["--config-settings=cmake.define.MXLAB_ENABLE_CUDA=ON"]
        env = dict(os.environ)
        for lang in ("CXX", "CUDA"):
            if shutil.which("ccache") and f"CMAKE_{lang}_COMPILER_LAUNCHER" not in env:
                env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = "ccache"
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"pip install . failed:\n{r.stdout}\n{r.stderr}"
    site = os.path.abspath(site)
    for name in [m for m in sys.modules if m == "mxlab" or m.startswith("mxlab.")]:
        del sys.modules[name]  # an mxlab from the source tree (analysis/) must not stand in
    sys.path.insert(0, site)
    m = importlib.import_module("mxlab")
    assert os.path.dirname(m.__file__) == os.path.join(site, "mxlab"), m.__file__
    importlib.import_module("mxlab._core")
    return m


@pytest.fixture(scope="session")
def binary():
    path = os.environ.get("MXLAB_BINARY", os.path.join(ROOT, "build", "mxlab"))
    if not os.path.exists(path):
        pytest.fail(f"no mxlab binary at {path}: build it (cmake --build build --target mxlab) or set MXLAB_BINARY")
    return path
