"""The causal study's pre-registration (results/prereg/why_mx.md) is pinned: its text may not
change except by appending amendments, and it must have entered git before any of the study's
results (results/why_mx/)."""
import hashlib
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREREG = os.path.join(ROOT, "results", "prereg", "why_mx.md")
MARK = "## Amendments"
# SHA-256 of the text before the "## Amendments" heading, as committed before the first run.
PINNED = "284cbbf39fb0b92f5a619e9894fba2d4df0d0ba2747a292c42f7dc7e59bb1f71"


def _body(path):
    text = open(path, encoding="utf-8").read()
    assert MARK in text, "the pre-registration must keep its Amendments section"
    return text[:text.index(MARK)]


def test_prereg_body_is_pinned():
    digest = hashlib.sha256(_body(PREREG).encode("utf-8")).hexdigest()
    assert digest == PINNED, ("results/prereg/why_mx.md changed above its Amendments section: "
                              "pre-registered text is frozen, append an amendment instead")


def _git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout


def test_prereg_predates_every_result():
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("no git checkout: the commit order cannot be checked here")
    shallow = _git("rev-parse", "--is-shallow-repository").strip()
    if shallow == "true":
        pytest.skip("shallow clone: the pre-registration's commit may be outside the history")
    added = _git("log", "--diff-filter=A", "--format=%H", "--", "results/prereg/why_mx.md").split()
    assert added, "results/prereg/why_mx.md is not committed"
    prereg_commit = added[-1]  # the commit that first added it
    results = _git("log", "--format=%H", "--", "results/why_mx").split()
    for commit in results:
        # every commit touching results/why_mx/ must have the pre-registration as an ancestor
        r = subprocess.run(["git", "-C", ROOT, "merge-base", "--is-ancestor", prereg_commit, commit])
        assert r.returncode == 0 and commit != prereg_commit, (
            f"commit {commit[:10]} adds study results without the pre-registration before it")
