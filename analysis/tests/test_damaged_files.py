"""Run files with damaged HDF5 metadata: bytes flipped in the first 8 KB (superblock, root
object header, attributes), with fixed seeds. Whatever h5py raises on them (OSError,
RuntimeError, KeyError, TypeError, ...), a command over a directory keeps the good files'
rows, marks or notes the bad file as unreadable and exits 2 with one closing line; a command
on the one file exits 2 with one line. Never a traceback.

The damaged files are made from a synthetic run file (always) and from a run of the real
trainer (with MXLAB_BINARY); each is first checked to be really unreadable by h5py, in a
subprocess, and one seed is kept per kind of failure."""

import csv
import io
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import make_fixtures as F
from mxlab import AnalysisError
from mxlab import schema as S
from mxlab import summary
from mxlab.__main__ import main

HEAD = 8192           # bytes that can be hit: HDF5's metadata sits at the start of the file
SEEDS = range(48)     # tried in order, for each number of flipped bytes
FLIPS = (20, 3)       # 20: the red-team report's damage; 3: lighter, fails in other ways
ANALYSIS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Reads every attribute and dataset of each file with h5py alone and prints, per file, how it
# failed: `open <Type>` / `read <Type>`, or `ok`.
PROBE = r"""
import sys, h5py
def read(obj):
    for k in obj.attrs:
        obj.attrs[k]
    if isinstance(obj, h5py.Dataset):
        obj[()]
    else:
        for k in obj:
            read(obj[k])
for path in sys.argv[1:]:
    stage = "open"
    try:
        f = h5py.File(path, "r")
        stage = "read"
        with f:
            read(f)
        print("ok", flush=True)
    except Exception as e:
        print(stage, type(e).__name__, flush=True)
"""


def damage(src, dst, seed, flips):
    """A copy of `src` with `flips` bytes of its first 8 KB XOR-ed with random non-zero bytes."""
    data = bytearray(open(src, "rb").read())
    rng = np.random.default_rng(seed)
    for pos in rng.choice(min(HEAD, len(data)), flips, replace=False):
        data[pos] ^= int(rng.integers(1, 256))
    with open(dst, "wb") as f:
        f.write(data)
    return str(dst)


def damaged_set(src, directory):
    """{kind of h5py failure: damaged copy of src}, the first seed of each kind. A copy that
    kills the probe (a crash inside HDF5) is not kept: no reader could report on it."""
    os.makedirs(directory, exist_ok=True)
    candidates = [damage(src, os.path.join(directory, f"f{flips}_s{seed}.h5"), seed, flips)
                  for flips in FLIPS for seed in SEEDS]
    out = subprocess.run([sys.executable, "-c", PROBE] + candidates, capture_output=True,
                         text=True, timeout=600).stdout.splitlines()
    kinds = {}
    for path, kind in zip(candidates, out):
        if kind != "ok":
            kinds.setdefault(kind, path)
    for path in candidates:
        if path not in kinds.values():
            os.remove(path)
    return kinds


def _check_kinds(kinds):
    """The damage must really break h5py, and in more ways than at open (which the loader
    always caught): otherwise these tests would prove nothing. (Which kinds a fixed set of seeds
    produces depends on the file's layout, which changes with the schema: at least one failure at
    open and one while reading.)"""
    assert len(kinds) >= 2, kinds
    assert any(k.startswith("read ") for k in kinds), kinds


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A good synthetic run (arms, a branch) and its damaged copies, in directories apart."""
    root = tmp_path_factory.mktemp("damaged_synthetic")
    good = F.write_run(str(root / "good.h5"), steps=100, seed=1, width=64, depth=2,
                       arms=[{"name": "fp6", "set": {"weight": "mxfp6_e3m2"}},
                             {"name": "fp8", "diverge_at": 60}],
                       branches=[{"name": "b", "at": 50, "from": "fp6", "apply": "to_fp32"}])
    kinds = damaged_set(good, str(root / "bad"))
    _check_kinds(kinds)
    return good, kinds


@pytest.fixture(scope="module")
def real(mxlab_run, tmp_path_factory):
    """The trainer's run file and its damaged copies (skips without MXLAB_BINARY)."""
    root = tmp_path_factory.mktemp("damaged_real")
    kinds = damaged_set(mxlab_run, str(root / "bad"))
    _check_kinds(kinds)
    return mxlab_run, kinds


@pytest.fixture(params=["synthetic", "real"])
def source(request):
    return request.getfixturevalue(request.param)


def _folder(tmp_path, good, bad_path):
    """A directory with the good run and one damaged file."""
    d = tmp_path / "runs"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(good, d / "a_good.h5")
    shutil.copy(bad_path, d / "b_bad.h5")
    return str(d)


def _one_error_line(err, command):
    lines = [ln for ln in err.splitlines() if not ln.startswith("wrote ")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"mxlab-plot {command}: error: ") and "Traceback" not in err
    return lines[0]


def test_load_run_says_unreadable_for_every_kind_of_damage(source):
    _, kinds = source
    for kind, path in kinds.items():
        with pytest.raises(AnalysisError) as e:
            S.load_run(path)
        text = str(e.value)
        assert text.startswith(path) and "\n" not in text and len(text) < 600, (kind, text)


def test_summary_keeps_the_good_rows_and_marks_the_bad_file(source, tmp_path, capsys):
    good, kinds = source
    n_good = len(summary.collect([good])[0])
    for kind, bad in kinds.items():
        d = _folder(tmp_path / kind.replace(" ", "_"), good, bad)
        assert main(["summary", d, "--csv"]) == 2, kind
        captured = capsys.readouterr()
        rows = list(csv.DictReader(io.StringIO(captured.out)))
        assert len(rows) == n_good + 1, (kind, captured.out)
        assert all(r["status"] in S.STATUSES for r in rows[:-1])
        assert rows[-1]["file"].endswith("b_bad.h5") and rows[-1]["run_id"] == "b_bad"
        assert rows[-1]["status"].startswith("unreadable: ") and rows[-1]["group"] == "", rows[-1]
        line = _one_error_line(captured.err, "summary")
        assert "1 of 2 run files could not be read" in line and "b_bad.h5" in line, line


def test_figure_and_report_commands_leave_out_the_bad_file(source, tmp_path, capsys):
    good, kinds = source
    kind, bad = sorted(kinds.items())[-1]  # one kind is enough here; the loader is shared
    d = _folder(tmp_path, good, bad)
    for argv in (["grid", d, "--metric", "final_loss"],
                 ["curves", d],
                 ["survival", d, "--by", "arm"],
                 ["warn", d]):
        out = tmp_path / f"{argv[0]}.png"
        assert main(argv + ["-o", str(out)]) == 2, argv
        assert out.exists() and out.stat().st_size > 0, argv  # drawn from the good run
        line = _one_error_line(capsys.readouterr().err, argv[0])
        assert "1 of 2 run files could not be read (left out)" in line and "b_bad.h5" in line
    # report: the page is written (the bad file's row says unreadable), then exit 2; with the
    # mxlab program too where there is one (its `summarize` exits 2 on the bad file).
    binary = os.environ.get("MXLAB_BINARY")
    for which in [["--no-mxlab"]] + ([["--mxlab", binary]] if binary and os.path.exists(binary) else []):
        out = tmp_path / "report.html"
        assert main(["report", d, "-o", str(out)] + which) == 2, which
        page = out.read_text()
        assert page.rstrip().endswith("</html>") and "unreadable" in page and "b_bad" in page, which
        line = _one_error_line(capsys.readouterr().err, "report")
        assert "1 of 2 run files could not be read (left out)" in line and "b_bad.h5" in line


def test_single_file_commands_exit_2_with_one_line(source, tmp_path, capsys):
    _, kinds = source
    for kind, bad in kinds.items():
        for command in ("panel", "interventions"):
            out = tmp_path / f"{command}.png"
            assert main([command, bad, "-o", str(out)]) == 2, (kind, command)
            line = _one_error_line(capsys.readouterr().err, command)
            assert bad in line, line
            assert not out.exists()


def test_every_file_unreadable_is_one_line_too(synthetic, tmp_path, capsys):
    _, kinds = synthetic
    d = tmp_path / "allbad"
    d.mkdir()
    for i, path in enumerate(kinds.values()):
        shutil.copy(path, d / f"bad{i}.h5")
    assert main(["grid", str(d), "-o", str(tmp_path / "g.png")]) == 2
    line = _one_error_line(capsys.readouterr().err, "grid")
    assert "no run files left to plot" in line and f"{len(kinds)} of {len(kinds)} run files" in line
    assert main(["report", str(d), "--no-mxlab"]) == 2
    assert (d / "report.html").read_text().count("unreadable: ") == len(kinds)
    assert "no run files left to plot" in (d / "report.html").read_text()
    _one_error_line(capsys.readouterr().err, "report")
    os.unlink(d / "report.html")
    assert main(["summary", str(d)]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("unreadable: ") == len(kinds)
    assert f"and {len(kinds) - 1} more" in _one_error_line(captured.err, "summary")


def test_the_command_line_itself(synthetic, tmp_path):
    """`python3 -m mxlab summary DIR` as a user runs it: the good rows on stdout,
    exit 2, one line on stderr, no traceback."""
    good, kinds = synthetic
    d = _folder(tmp_path, good, sorted(kinds.values())[0])
    env = dict(os.environ, PYTHONPATH=ANALYSIS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "mxlab", "summary", d], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "a_good.h5" in r.stdout and "unreadable" in r.stdout
