"""report: one self-contained HTML page per results directory (`python3 -m mxlab report DIR`).

On a tiny sweep of the real trainer (MXLAB_BINARY; skipped without it) the page is written to
DIR/report.html, parses as well-formed HTML (html.parser, every element closed in order), loads
nothing from outside (no script, no style sheet, every image a PNG data URI), has a row of the
trajectory table for every trajectory and branch of every run, a row per arm in the per-group
table, and figures. Without the program (--no-mxlab) the Python summary stands in, saying so. An
empty directory is one line of error and no page; an unreadable run file still gets a page, and
exit status 2.
"""

import base64
import glob
import os
import subprocess
from html.parser import HTMLParser

import pytest

from conftest import TINY_EXPERIMENT
from mxlab.__main__ import main

VOID = {"meta", "img", "br", "hr", "link", "input", "col", "source", "wbr", "area", "base", "embed", "track"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """Checks that every element is closed, in order, and collects the tables, images and
    anything that would be fetched from elsewhere."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.doctype = [], [], None
        self.tables, self.images, self.external, self.tags = {}, [], [], []
        self._heading, self._h2, self._row, self._cell = None, None, None, None

    def handle_decl(self, decl):
        self.doctype = decl

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if tag in ("script", "link", "iframe", "object"):
            self.external.append(tag)
        for key in ("src", "href"):
            if key in a and not a[key].startswith("data:"):
                self.external.append(f"{tag} {key}={a[key]}")
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag in VOID:
            return
        self.stack.append(tag)
        if tag == "h2":
            self._h2 = ""
        elif tag == "table":
            self.tables[self._heading] = []
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        self.stack.pop()
        if tag == "h2":
            self._heading, self._h2 = self._h2, None
        elif tag in ("td", "th"):
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr":
            self.tables[self._heading].append(self._row)

    def handle_data(self, data):
        if self._h2 is not None:
            self._h2 += data
        if self._cell is not None:
            self._cell += data


def parse(path):
    page = Page()
    with open(path, encoding="utf-8") as f:
        page.feed(f.read())
    page.close()
    assert page.doctype and page.doctype.lower() == "doctype html", page.doctype
    assert not page.errors, page.errors[:5]
    assert not page.stack, f"unclosed: {page.stack}"
    assert page.tags[:4] == ["html", "head", "meta", "title"] and page.tags.count("body") == 1, page.tags[:6]
    assert not page.external, f"the page loads from elsewhere: {page.external}"
    return page


def rows_of(page, heading):
    header, *rows = page.tables[heading]
    return [dict(zip(header, r)) for r in rows]


def assert_pngs(page):
    assert page.images, "no figure"
    for src in page.images:
        assert src.startswith("data:image/png;base64,"), src[:40]
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)


@pytest.fixture(scope="module")
def tiny_sweep(binary, tmp_path_factory):
    """Two seeds of TINY_EXPERIMENT (arms fp6 and fp8, a branch act_bf16 from fp6) by `mxlab run`."""
    directory = tmp_path_factory.mktemp("report")
    experiment = directory / "tiny.yaml"
    experiment.write_text(TINY_EXPERIMENT + "sweep: {seeds: [1, 2]}\n")
    subprocess.run([binary, "run", str(experiment), "--out", str(directory / "out"), "--quiet"], check=True,
                   capture_output=True, timeout=600)
    return str(directory / "out")


def test_report_of_a_tiny_cpu_sweep(binary, tiny_sweep, capsys):
    assert main(["report", tiny_sweep, "--mxlab", binary]) == 0
    path = os.path.join(tiny_sweep, "report.html")
    assert f"wrote {path}" in capsys.readouterr().err
    assert os.path.getsize(path) < 3_000_000, "the page should stay small"
    page = parse(path)
    run_ids = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(tiny_sweep, "*.h5")))
    assert len(run_ids) == 2
    rows = rows_of(page, "Trajectories")
    assert sorted((r["run_id"], r["group"]) for r in rows) == sorted(
        (run_id, group) for run_id in run_ids for group in ("fp32", "fp6", "fp8", "act_bf16"))
    assert all(r["status"] == "complete" for r in rows)
    assert {"excursion_step", "final_loss", "tail_log_ratio"} <= set(rows[0])  # `mxlab summarize`'s columns
    groups = rows_of(page, "Groups by arm")
    assert sorted(r["arm"] for r in groups) == ["act_bf16", "fp32", "fp6", "fp8"]
    assert all(r["n"] == "2" for r in groups)
    assert len(rows_of(page, "Pairs of groups by arm")) == 6
    assert_pngs(page)
    assert len(page.images) == 2 + 2 * 2  # curves, Kaplan-Meier; each run's panel and interventions
    # -o elsewhere, fewer panels
    other = os.path.join(os.path.dirname(tiny_sweep), "elsewhere.html")
    assert main(["report", tiny_sweep, "--mxlab", binary, "-o", other, "--max-runs", "1"]) == 0
    assert len(parse(other).images) == 2 + 2


def test_report_without_the_program_uses_the_python_summary(branches_run, tmp_path, capsys):
    """Synthetic run files (no binary needed): the Python summary's rows, and a note saying what
    is left out."""
    directory = tmp_path / "runs"
    directory.mkdir()
    os.symlink(branches_run, directory / "a.h5")
    assert main(["report", str(directory), "--no-mxlab"]) == 0
    page = parse(str(directory / "report.html"))
    rows = rows_of(page, "Trajectories")
    assert [r["group"] for r in rows][:2] == ["fp32", "mx"] and len(rows) == 2 + 3  # three branches
    assert "Groups by arm" not in page.tables
    with open(directory / "report.html", encoding="utf-8") as f:
        assert "--no-mxlab: the trajectory table is the Python summary" in f.read()
    assert_pngs(page)


def test_report_of_an_empty_directory_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--no-mxlab"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mxlab-plot report: error: ")
    assert "no .h5 run files in this directory" in err[0]
    assert not os.path.exists(tmp_path / "report.html")


def test_report_with_an_unreadable_file_is_written_and_exits_2(stable_run, tmp_path, capsys):
    os.symlink(stable_run, tmp_path / "good.h5")
    (tmp_path / "junk.h5").write_bytes(b"not an HDF5 file" * 64)
    assert main(["report", str(tmp_path), "--no-mxlab"]) == 2
    err = capsys.readouterr().err
    assert "1 of 2 run files could not be read" in err
    rows = rows_of(parse(str(tmp_path / "report.html")), "Trajectories")
    assert [(r["group"], r["status"].split(":")[0]) for r in rows] == [
        ("fp32", "complete"), ("mx", "complete"), ("", "unreadable")]
    assert rows[2]["run_id"] == "junk"
